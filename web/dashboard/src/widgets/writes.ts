// The write audit: the node's latest writes to plant devices (`GET /api/writes`) as a list —
// when, who, which channel, the outcome and how long the device took. Bound to no channel: it
// reads the audit every few seconds while it is on the board. The audit is read with an API key
// (or on a node without authentication); for other users the widget says so.

import type { Publication } from 'switchboard-sdk';
import { THEME, Widget } from './base.js';

/** One audited write, as `GET /api/writes` lists it. */
export interface AuditedWrite {
  t: number;
  by: string;
  auth: string;
  channel: string;
  bytes: number;
  source: string;
  forwarded: boolean;
  outcome: string;
  code: number;
  message?: string;
  latency_ms: number;
}

/** How the widget reads the audit; the app sets it (`Api.writes`). */
export type AuditReader = (limit: number) => Promise<AuditedWrite[]>;

/** Seconds between reads of the audit. */
const PERIOD_MS = 2000;

export class WritesWidget extends Widget {
  static read: AuditReader = () => Promise.reject(new Error('not connected'));

  private el: HTMLElement | null = null;
  private list: HTMLElement | null = null;
  private timer: ReturnType<typeof setInterval> | null = null;
  private rows: AuditedWrite[] = [];
  private note = '';

  protected take(_value: unknown, _p: Publication): void {}

  protected paint(_ctx: CanvasRenderingContext2D, _x: number, _y: number, _w: number, _h: number): void {}

  /** The body is the list (DOM): the canvas only clears it (no "unbound" note, no value). */
  override drawBody(ctx: CanvasRenderingContext2D, ox: number, oy: number): void {
    const b = this.body;
    ctx.fillStyle = THEME.panel;
    ctx.fillRect(b.x - ox, b.y - oy, b.w, b.h);
    this.dirty = false;
  }

  override describe(): string {
    return this.note || `${this.rows.length} writes`;
  }

  override needsDom(): boolean {
    return true;
  }

  override attach(layer: HTMLElement): void {
    if (this.el) return;
    const el = document.createElement('div');
    el.className = 'writes';
    this.list = document.createElement('ul');
    this.list.className = 'writes-list';
    el.append(this.list);
    this.el = el;
    this.place();
    layer.appendChild(el);
    void this.refresh();
    this.timer = setInterval(() => void this.refresh(), PERIOD_MS);
  }

  override attached(): boolean {
    return this.el !== null;
  }

  override detach(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    this.el?.remove();
    this.el = this.list = null;
  }

  override layout(): void {
    super.layout();
    if (this.el) this.place();
  }

  private place(): void {
    const b = this.body;
    const el = this.el!;
    el.style.left = `${b.x}px`;
    el.style.top = `${b.y}px`;
    el.style.width = `${b.w}px`;
    el.style.height = `${b.h}px`;
  }

  /** Reads the audit again and redraws the list. */
  async refresh(): Promise<void> {
    const limit = Math.max(1, Math.min(1000, Math.floor(this.body.h / 15) || 10));
    try {
      this.rows = await WritesWidget.read(limit);
      this.note = this.rows.length === 0 ? 'no writes yet' : '';
    } catch (e) {
      this.rows = [];
      this.note = `write audit: ${(e as Error).message ?? String(e)}`;
    }
    this.draw();
  }

  private draw(): void {
    const list = this.list;
    if (!list) return;
    list.replaceChildren();
    if (this.note) {
      const li = document.createElement('li');
      li.className = 'writes-note';
      li.textContent = this.note;
      list.append(li);
    }
    for (const w of this.rows) {
      const li = document.createElement('li');
      li.dataset.outcome = w.outcome;
      const when = new Date(w.t).toLocaleTimeString([], { hour12: false });
      const code = w.outcome === 'written' ? '' : ` ${w.code}`;
      li.textContent = `${when} ${w.by} ${w.channel} ${w.outcome}${code} ${w.latency_ms.toFixed(1)} ms`;
      li.title = w.message ?? `${w.bytes} bytes to ${w.source}`;
      li.style.color = w.outcome === 'written' ? THEME.good : THEME.bad;
      list.append(li);
    }
  }

  /** The rows shown, for tests. */
  shown(): AuditedWrite[] {
    return this.rows;
  }
}
