// Delivery to the application, one batch per animation frame. A point channel contributes only
// its latest publication of the frame (a screen shows the current value; 20 updates of one
// point between two paints are one repaint), every other channel all of its publications in
// offset order. So 20,000 publications per second become ~60 calls into the page, each with the
// work of one frame. A historical publication (a back-filled value, never the current one) is
// never reduced away and never replaces a live one: it is kept, in offset order.

import type { Publication } from './types.js';

/** What one frame delivers. */
export interface FrameBatch {
  /** In arrival order; for a point channel only its latest live publication of the frame, at
   * the place of its first one (after the channel's historical ones that came after that, so
   * each channel stays in offset order), and every historical one. */
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
  /** This frame's publications; null where a point's live publication was superseded by a
   * later one placed after a historical one (removed at the flush). */
  private pending: (Publication | null)[] = [];
  /** Index in `pending` of each point channel's live publication of this frame. */
  private pointAt = new Map<string, number>();
  /** Point channels with a historical publication after their live one of this frame. */
  private passed = new Set<string>();
  private holes = false;
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
    if (point && p.historical) {
      if (this.pointAt.has(p.channel)) this.passed.add(p.channel);
      this.pending.push(p);
    } else if (point) {
      const at = this.pointAt.get(p.channel);
      if (at !== undefined && !this.passed.has(p.channel)) {
        this.pending[at] = p;
      } else {
        // A historical publication came after the channel's live one: the newer live one goes
        // after it (offset order), and the older one leaves the frame.
        if (at !== undefined) {
          this.pending[at] = null;
          this.holes = true;
          this.passed.delete(p.channel);
        }
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
    const pending = this.pending;
    const publications = this.holes ? pending.filter((p): p is Publication => p !== null) : (pending as Publication[]);
    const batch: FrameBatch = { publications, received: this.received };
    this.reset();
    if (batch.publications.length > 0) this.deliver(batch);
  };

  /** Drops what is pending (the client was closed). */
  clear(): void {
    this.reset();
    if (this.backstop !== null) clearTimeout(this.backstop);
    this.backstop = null;
    this.scheduled = false;
  }

  private reset(): void {
    this.pending = [];
    this.pointAt = new Map();
    this.passed = new Set();
    this.holes = false;
    this.received = 0;
  }
}
