// Delivery to the application, one batch per animation frame. A point channel contributes only
// its latest publication of the frame (a screen shows the current value; 20 updates of one
// point between two paints are one repaint), every other channel all of its publications in
// offset order. So 20,000 publications per second become ~60 calls into the page, each with the
// work of one frame.

import type { Publication } from './types.js';

/** What one frame delivers. */
export interface FrameBatch {
  /** In arrival order; for a point channel only its latest publication of the frame, at the
   * place of its first one. */
  publications: Publication[];
  /** Publications received for this frame, before point channels were reduced to one each. */
  received: number;
}

export type Scheduler = (flush: () => void) => void;

/** `requestAnimationFrame` where there is one, else a ~60 Hz timer (Node, workers). */
export const defaultScheduler: Scheduler = (flush) => {
  const raf = (globalThis as { requestAnimationFrame?: (cb: () => void) => unknown }).requestAnimationFrame;
  if (typeof raf === 'function') raf(flush);
  else setTimeout(flush, 16);
};

export class FrameBatcher {
  private pending: Publication[] = [];
  /** Index in `pending` of each point channel's publication of this frame. */
  private pointAt = new Map<string, number>();
  private received = 0;
  private scheduled = false;
  private backstop: ReturnType<typeof setTimeout> | null = null;

  constructor(
    private readonly deliver: (batch: FrameBatch) => void,
    private readonly schedule: Scheduler,
    /** A hidden tab gets no animation frames; deliver after this long anyway (ms). */
    private readonly maxDelayMs = 250,
  ) {}

  push(p: Publication, point: boolean): void {
    this.received++;
    if (point) {
      const at = this.pointAt.get(p.channel);
      if (at !== undefined) {
        this.pending[at] = p;
      } else {
        this.pointAt.set(p.channel, this.pending.length);
        this.pending.push(p);
      }
    } else {
      this.pending.push(p);
    }
    if (!this.scheduled) {
      this.scheduled = true;
      this.schedule(this.flush);
      this.backstop = setTimeout(this.flush, this.maxDelayMs);
    }
  }

  /** Delivers what is pending now; safe to call at any time. */
  readonly flush = (): void => {
    if (!this.scheduled) return;
    this.scheduled = false;
    if (this.backstop !== null) {
      clearTimeout(this.backstop);
      this.backstop = null;
    }
    const batch: FrameBatch = { publications: this.pending, received: this.received };
    this.pending = [];
    this.pointAt = new Map();
    this.received = 0;
    if (batch.publications.length > 0) this.deliver(batch);
  };

  /** Drops what is pending (the client was closed). */
  clear(): void {
    this.pending = [];
    this.pointAt = new Map();
    this.received = 0;
    if (this.backstop !== null) clearTimeout(this.backstop);
    this.backstop = null;
    this.scheduled = false;
  }
}
