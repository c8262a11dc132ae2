// What every widget shares: its place on the board, the value it shows, and the split of its
// drawing into a static frame (panel and label, drawn on full repaints) and a dynamic body
// (redrawn only when a new value arrived). Widgets draw on the board's one canvas; only trends
// own DOM (a uPlot chart).

import type { Publication } from 'switchboard-sdk';
import { CELL, type WidgetSpec, type WidgetType } from '../model.js';

export interface Rect {
  x: number;
  y: number;
  w: number;
  h: number;
}

export const THEME = {
  bg: '#0d1117',
  panel: '#161b22',
  border: '#2a313c',
  text: '#e6edf3',
  dim: '#8b949e',
  accent: '#4fc3f7',
  good: '#3fb950',
  bad: '#f85149',
  warn: '#d29922',
  off: '#30363d',
  font: 'system-ui, -apple-system, "Segoe UI", sans-serif',
};

const GAP = 2;
const HEADER = 16;

export abstract class Widget {
  /** The type this object draws; a spec whose type changed needs a new widget. */
  readonly kind: WidgetType;
  spec: WidgetSpec;
  /** Board pixels of the panel. */
  rect: Rect = { x: 0, y: 0, w: 0, h: 0 };
  /** Board pixels of the part that changes with the value. */
  body: Rect = { x: 0, y: 0, w: 0, h: 0 };
  hasValue = false;
  /** The body must be redrawn. */
  dirty = true;
  /** A trend that received the server's trend of its window (see `TrendWidget.backfill`). */
  backfilled = false;
  visible = false;
  /** Offset of the latest publication applied. */
  offset = 0;
  /** Where the value's quality says it is not good. */
  quality: string | null = null;
  /** When the latest value arrived (ms, `Date.now()`). */
  updatedAt = 0;
  /** Seconds since the latest value when it is older than the widget's `stale_s`, else null. */
  staleFor: number | null = null;
  /** The alarm the latest value is in (its `lolo`/`lo`/`hi`/`hihi` options), or null. */
  alarm: Alarm | null = null;
  /** An alarm came (or got worse) and nobody acknowledged it yet: the widget blinks. */
  unacked = false;
  /** The value that raised the alarm, and when (ms). */
  alarmValue: unknown = null;
  alarmSince = 0;
  /** Whether paint() may draw outside the body (text); such widgets are clipped. */
  protected mayOverflow = true;
  protected label = '';
  protected labelFont = '';

  constructor(spec: WidgetSpec) {
    this.kind = spec.type;
    this.spec = spec;
    // No layout() here: subclass fields are not initialized yet. createWidget() calls it.
  }

  /** Recomputes pixel geometry after the spec changed. */
  layout(): void {
    const s = this.spec;
    this.rect = { x: s.x * CELL + GAP, y: s.y * CELL + GAP, w: s.w * CELL - 2 * GAP, h: s.h * CELL - 2 * GAP };
    const header = this.rect.h >= 36 ? HEADER : 0;
    this.body = { x: this.rect.x + 4, y: this.rect.y + header + 2, w: this.rect.w - 8, h: this.rect.h - header - 4 };
    this.label = String(s.options.label ?? s.channel ?? '');
    this.labelFont = `11px ${THEME.font}`;
    this.dirty = true;
  }

  /** Channels this widget listens to besides its own (scatter's x channel). */
  extraChannels(): string[] {
    return [];
  }

  /** The number/boolean/array/string a publication carries for this widget. */
  protected extract(data: unknown): unknown {
    const field = this.spec.options.field;
    if (typeof field === 'string' && field !== '') {
      let v: unknown = data;
      for (const k of field.split('.')) v = v && typeof v === 'object' ? (v as Record<string, unknown>)[k] : undefined;
      return v;
    }
    if (data && typeof data === 'object' && !Array.isArray(data) && 'v' in data) return (data as { v: unknown }).v;
    return data;
  }

  /** Applies a publication of `channel`; returns whether the widget took it. */
  apply(p: Publication, channel: string): boolean {
    if (channel !== this.spec.channel) return false;
    const d = p.data as { q?: unknown } | null;
    this.quality = d && typeof d === 'object' && typeof d.q === 'string' && d.q !== 'good' ? d.q : null;
    this.offset = p.offset;
    this.updatedAt = Date.now();
    this.staleFor = null;
    const value = this.extract(p.data);
    this.take(value, p);
    this.checkAlarm(value);
    this.hasValue = true;
    this.dirty = true;
    return true;
  }

  protected abstract take(value: unknown, p: Publication): void;

  /** Panel and label. `ox, oy`: board scroll offset. */
  drawFrame(ctx: CanvasRenderingContext2D, ox: number, oy: number): void {
    const r = this.rect;
    ctx.fillStyle = THEME.panel;
    ctx.fillRect(r.x - ox, r.y - oy, r.w, r.h);
    ctx.strokeStyle = THEME.border;
    ctx.lineWidth = 1;
    ctx.strokeRect(r.x - ox + 0.5, r.y - oy + 0.5, r.w - 1, r.h - 1);
    if (this.body.y > r.y + 4 && this.label) {
      ctx.fillStyle = THEME.dim;
      ctx.font = this.labelFont;
      ctx.textAlign = 'left';
      ctx.textBaseline = 'top';
      ctx.fillText(clip(this.label, r.w - 8, 6), r.x - ox + 5, r.y - oy + 3);
    }
  }

  /** Sets the alarm state of a new value against the widget's limits. */
  private checkAlarm(value: unknown): void {
    const o = this.spec.options;
    const v = num(value, NaN);
    let alarm: Alarm | null = null;
    if (!Number.isNaN(v)) {
      const lim = (k: string) => optNum(o[k]);
      const [lolo, lo, hi, hihi] = [lim('lolo'), lim('lo'), lim('hi'), lim('hihi')];
      if (hihi !== null && v >= hihi) alarm = 'hihi';
      else if (lolo !== null && v <= lolo) alarm = 'lolo';
      else if (hi !== null && v >= hi) alarm = 'hi';
      else if (lo !== null && v <= lo) alarm = 'lo';
    }
    if (alarm !== null && severity(alarm) > severity(this.alarm)) {
      this.unacked = true;
      this.alarmSince = Date.now();
    }
    if (alarm !== null) this.alarmValue = value;
    this.alarm = alarm;
  }

  /** Acknowledges the alarm: the widget stops blinking (and stays coloured while in alarm). */
  acknowledge(): void {
    if (!this.unacked) return;
    this.unacked = false;
    this.dirty = true;
  }

  /** Updates `staleFor` from the clock; returns whether the body must be redrawn (it turned
   * stale, fresh, or its age in whole seconds changed). */
  checkStale(now: number): boolean {
    const limit = optNum(this.spec.options.stale_s);
    const age = this.hasValue && limit !== null && limit > 0 && now - this.updatedAt > limit * 1000
      ? Math.floor((now - this.updatedAt) / 1000)
      : null;
    if (age === this.staleFor) return false;
    this.staleFor = age;
    this.dirty = true;
    return true;
  }

  /** Clears and redraws the body. `blinkOn`: the phase of unacknowledged alarms' blinking. */
  drawBody(ctx: CanvasRenderingContext2D, ox: number, oy: number, blinkOn = true): void {
    const b = this.body;
    const alarmColor = this.alarm === null ? null : this.alarm === 'hi' || this.alarm === 'lo' ? THEME.warn : THEME.bad;
    ctx.fillStyle = alarmColor !== null && (!this.unacked || blinkOn) ? shade(alarmColor) : THEME.panel;
    ctx.fillRect(b.x - ox, b.y - oy, b.w, b.h);
    if (this.staleFor !== null && this.hasValue) {
      // A value not updated within `stale_s`: drawn dimmed, with its age.
      ctx.save();
      ctx.globalAlpha = 0.45;
      this.paint(ctx, b.x - ox, b.y - oy, b.w, b.h);
      ctx.restore();
      ctx.fillStyle = THEME.warn;
      ctx.font = `10px ${THEME.font}`;
      ctx.textAlign = 'right';
      ctx.textBaseline = 'top';
      ctx.fillText(`stale ${formatAge(this.staleFor)}`, b.x - ox + b.w - 2, b.y - oy + 1);
      this.dirty = false;
      return;
    }
    if (!this.spec.channel) {
      this.drawNote(ctx, ox, oy, 'unbound');
    } else if (!this.hasValue) {
      this.drawNote(ctx, ox, oy, '…');
    } else if (this.mayOverflow) {
      // Nothing may spill out of the body: only the body is cleared on the next update.
      ctx.save();
      ctx.beginPath();
      ctx.rect(b.x - ox, b.y - oy, b.w, b.h);
      ctx.clip();
      this.paint(ctx, b.x - ox, b.y - oy, b.w, b.h);
      ctx.restore();
    } else {
      this.paint(ctx, b.x - ox, b.y - oy, b.w, b.h);
    }
    this.dirty = false;
  }

  protected drawNote(ctx: CanvasRenderingContext2D, ox: number, oy: number, text: string): void {
    const b = this.body;
    ctx.fillStyle = THEME.dim;
    ctx.font = `11px ${THEME.font}`;
    ctx.textAlign = 'center';
    ctx.textBaseline = 'middle';
    ctx.fillText(text, b.x - ox + b.w / 2, b.y - oy + b.h / 2);
  }

  /** Draws the value into the body at (x, y) of size (w, h), canvas coordinates. */
  protected abstract paint(ctx: CanvasRenderingContext2D, x: number, y: number, w: number, h: number): void;

  /** News held back by a redraw rate whose time has come: the board marks the body dirty. */
  due(): boolean {
    return false;
  }

  /** Whether the widget has DOM for the board to create (when first visible) and update under
   * its frame budget: controls always, trends while their chart is open. */
  needsDom(): boolean {
    return false;
  }

  attach(_layer: HTMLElement): void {}
  attached(): boolean {
    return true;
  }
  detach(): void {}
  /** Whether `renderDom` will have work later (news held back by a redraw rate). */
  domPending(): boolean {
    return false;
  }

  /** Whether `renderDom` has work; trends redraw under the frame's time budget. */
  domDirty(): boolean {
    return false;
  }
  renderDom(): void {}

  /** A screen-reader and test-friendly text of the current value. */
  describe(): string {
    return '';
  }
}

/** Alarm states of a value against its widget's limits. */
export type Alarm = 'lolo' | 'lo' | 'hi' | 'hihi';

function severity(a: Alarm | null): number {
  return a === null ? 0 : a === 'hi' || a === 'lo' ? 1 : 2;
}

/** A dark tint of an alarm colour for the body's background. */
function shade(color: string): string {
  return `${color}40`;
}

/** An age in seconds as people read it: 42 s, 5 min, 3 h, 2 d. */
export function formatAge(s: number): string {
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.floor(s / 60)} min`;
  if (s < 172_800) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86_400)} d`;
}

/** Cuts `text` to roughly fit `width` pixels at `charW` pixels per character (no measuring:
 * measureText per frame is what makes text-heavy canvases slow). */
export function clip(text: string, width: number, charW: number): string {
  const max = Math.max(1, Math.floor(width / charW));
  return text.length <= max ? text : text.slice(0, Math.max(1, max - 1)) + '…';
}

export function num(v: unknown, fallback: number): number {
  if (typeof v === 'number' && Number.isFinite(v)) return v;
  if (typeof v === 'string' && v.trim() !== '' && Number.isFinite(Number(v))) return Number(v);
  return fallback;
}

export function optNum(v: unknown): number | null {
  const n = num(v, NaN);
  return Number.isNaN(n) ? null : n;
}

/** Formats a value for display. */
export function format(v: unknown, decimals: number | null): string {
  if (typeof v === 'number') {
    if (decimals !== null) return v.toFixed(Math.max(0, Math.min(10, decimals)));
    const a = Math.abs(v);
    return a >= 1000 || Number.isInteger(v) ? String(Math.round(v * 100) / 100) : v.toFixed(a >= 10 ? 2 : 3);
  }
  if (typeof v === 'string') return v;
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  if (v === null || v === undefined) return '—';
  return JSON.stringify(v);
}

export function qualityColor(q: string | null, fallback: string): string {
  if (q === 'bad') return THEME.bad;
  if (q === 'uncertain') return THEME.warn;
  return fallback;
}

/**
 * Pre-rendered bitmaps of shapes that repeat (LED discs, gauge tracks). Blitting one is a copy;
 * drawing an anti-aliased arc again is real raster work, many hundred times per frame.
 */
const sprites = new Map<string, HTMLCanvasElement>();

export function sprite(key: string, w: number, h: number, draw: (ctx: CanvasRenderingContext2D) => void): HTMLCanvasElement {
  const dpr = window.devicePixelRatio || 1;
  const k = `${key}|${w}x${h}@${dpr}`;
  let c = sprites.get(k);
  if (!c) {
    if (sprites.size > 2000) sprites.clear();
    c = document.createElement('canvas');
    c.width = Math.max(1, Math.ceil(w * dpr));
    c.height = Math.max(1, Math.ceil(h * dpr));
    const ctx = c.getContext('2d')!;
    ctx.scale(dpr, dpr);
    draw(ctx);
    sprites.set(k, c);
  }
  return c;
}
