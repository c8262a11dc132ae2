// What every widget shares: its place on the board, the value it shows, and the split of its
// drawing into a static frame (panel and label, drawn on full repaints) and a dynamic body
// (redrawn only when a new value arrived). Widgets draw on the board's one canvas; only trends
// own DOM (a uPlot chart).

import type { Publication } from 'switchboard-sdk';
import { CELL, type WidgetSpec, type WidgetType } from '../model.js';
import { drawRuns, fitLabel, fitValue, runsHeight, type TextRun } from './fit.js';

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
const NO_TEXT: TextRun[] = [];
const HEADER = 16;
/** The label's size, and the smallest it shrinks to (see `fitLabel`). */
const LABEL_PX = 11;
const LABEL_MIN_PX = 7;
/** A panel at least this tall has a header with its label. */
const HEADER_FROM = 36;
/** How stale values are drawn: at this opacity, their age in a band below them. */
const STALE_ALPHA = 0.45;

/** A server alarm on a widget's channel, as the widget shows it (see `Widget.serverAlarm`). */
export interface ShownAlarm {
  severity: string;
  unacked: boolean;
}

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
  /** The alarm the latest value is in against the widget's own limits (`lolo`/`lo`/`hi`/`hihi`
   * options): colouring only; the alarms operators acknowledge are the server's. */
  alarm: Alarm | null = null;
  /** The worst server alarm on the widget's channel that is not normal (set by the app from
   * the alarm list), or null: it colours the widget and blinks while unacknowledged. */
  serverAlarm: ShownAlarm | null = null;
  /** Grid cell size in px: the board's, which scales the grid to the screen's width. */
  cell = CELL;
  /** Whether paint() may draw outside the body (text); such widgets are clipped. */
  protected mayOverflow = true;
  /** The label as drawn in the header, relative to the panel's top left. */
  protected labelRuns: TextRun[] = [];
  /** The body's text as last drawn, placed at (`textDx`, `textDy`) in the body, and a stale
   * value's age (relative to the body): what `texts` reports. Kept as drawn, not copied, so a
   * redraw allocates nothing. */
  private textRuns: TextRun[] = NO_TEXT;
  private textDx = 0;
  private textDy = 0;
  private ageRuns: TextRun[] = NO_TEXT;

  constructor(spec: WidgetSpec) {
    this.kind = spec.type;
    this.spec = spec;
    // No layout() here: subclass fields are not initialized yet. createWidget() calls it.
  }

  /** Recomputes pixel geometry after the spec or the cell size changed. */
  layout(): void {
    const s = this.spec;
    const c = this.cell;
    this.rect = { x: s.x * c + GAP, y: s.y * c + GAP, w: s.w * c - 2 * GAP, h: s.h * c - 2 * GAP };
    const label = String(s.options.label ?? s.channel ?? '');
    // Two lines of label only where the body keeps at least half the panel.
    this.labelRuns = this.rect.h >= HEADER_FROM ? fitLabel(label, this.rect.w - 8, this.rect.h / 2 - 4, LABEL_PX, LABEL_MIN_PX, THEME.font) : [];
    const header = this.rect.h >= HEADER_FROM ? Math.max(HEADER, Math.ceil(runsHeight(this.labelRuns)) + 2) : 0;
    this.body = { x: this.rect.x + 4, y: this.rect.y + header + 2, w: this.rect.w - 8, h: this.rect.h - header - 4 };
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

  /** Applies a publication of `channel`; returns whether the widget took it. A historical
   * publication (a value a plant source back-filled, never the channel's current value) does
   * not touch the value, quality, age or alarm shown: it goes to `takeHistorical`. */
  apply(p: Publication, channel: string): boolean {
    if (channel !== this.spec.channel) return false;
    if (p.historical) return this.takeHistorical(p);
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

  /** A historical publication of the widget's channel: a value from before the current one,
   * at its own time (`t`). A display of the current value leaves it out (false); a plot by
   * time may place it (true: taken). */
  protected takeHistorical(_p: Publication): boolean {
    return false;
  }

  /** Panel and label. `ox, oy`: board scroll offset. */
  drawFrame(ctx: CanvasRenderingContext2D, ox: number, oy: number): void {
    const r = this.rect;
    ctx.fillStyle = THEME.panel;
    ctx.fillRect(r.x - ox, r.y - oy, r.w, r.h);
    ctx.strokeStyle = THEME.border;
    ctx.lineWidth = 1;
    ctx.strokeRect(r.x - ox + 0.5, r.y - oy + 0.5, r.w - 1, r.h - 1);
    if (this.labelRuns.length > 0) {
      ctx.fillStyle = THEME.dim;
      drawRuns(ctx, this.labelRuns, r.x - ox + 5, r.y - oy + 2);
    }
  }

  /** The label as drawn, relative to the panel's top left (tests). */
  labelTexts(): TextRun[] {
    return this.labelRuns;
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
    this.alarm = alarm;
  }

  /** Shows the worst server alarm of the widget's channel (null: none); returns whether that
   * changed what the widget draws. */
  showAlarm(a: ShownAlarm | null): boolean {
    const was = this.serverAlarm;
    if (was === a || (was && a && was.severity === a.severity && was.unacked === a.unacked)) return false;
    this.serverAlarm = a;
    this.dirty = true;
    return true;
  }

  /** The body's alarm colour: the server alarm's when there is one, else the widget's own limits'. */
  private alarmColor(): string | null {
    const sev = this.serverAlarm?.severity ?? this.alarm;
    if (sev === null || sev === undefined) return null;
    return sev === 'hi' || sev === 'lo' ? THEME.warn : THEME.bad;
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
    const x = b.x - ox;
    const y = b.y - oy;
    const color = this.alarmColor();
    ctx.fillStyle = color !== null && (!this.serverAlarm?.unacked || blinkOn) ? shade(color) : THEME.panel;
    ctx.fillRect(x, y, b.w, b.h);
    this.textRuns = this.ageRuns = NO_TEXT;
    if (!this.spec.channel) {
      this.drawNote(ctx, ox, oy, 'unbound');
    } else if (!this.hasValue) {
      this.drawNote(ctx, ox, oy, '…');
    } else {
      // A value not updated within `stale_s` is drawn dimmed, its age in a band below it.
      const stale = this.staleFor !== null;
      const band = stale ? Math.min(18, Math.max(10, Math.round(b.h * 0.3))) : 0;
      const h = b.h - band;
      ctx.save();
      if (stale) ctx.globalAlpha = STALE_ALPHA;
      if (this.mayOverflow) {
        // Nothing may spill out of the body: only the body is cleared on the next update.
        ctx.beginPath();
        ctx.rect(x, y, b.w, h);
        ctx.clip();
      }
      this.paint(ctx, x, y, b.w, h);
      ctx.restore();
      if (stale) {
        const age = fitValue(`stale ${formatAge(this.staleFor ?? 0)}`, '', b.w - 4, band, 14, 400, THEME.font);
        for (const r of age) {
          r.x += 2;
          r.y += h;
        }
        ctx.fillStyle = THEME.warn;
        drawRuns(ctx, age, x, y);
        this.ageRuns = age;
      }
    }
    this.dirty = false;
  }

  /** Draws `runs` placed in a box at (`dx`, `dy`) of the body, whose top left is at (`x`, `y`)
   * on the canvas (`paint`'s x and y), and records them for `texts`. */
  protected drawTexts(ctx: CanvasRenderingContext2D, runs: TextRun[], x: number, y: number, dx = 0, dy = 0): void {
    drawRuns(ctx, runs, x + dx, y + dy);
    this.textRuns = runs;
    this.textDx = dx;
    this.textDy = dy;
  }

  /** The body's text as last drawn (value, units, a stale value's age), relative to the
   * body's top left (tests measure it). */
  texts(): TextRun[] {
    return [...this.textRuns.map((r) => ({ ...r, x: r.x + this.textDx, y: r.y + this.textDy })), ...this.ageRuns];
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

/** A time as an operator reads it: the clock today, with the date on other days. */
export function formatTime(ms: number): string {
  const d = new Date(ms);
  const time = d.toLocaleTimeString([], { hour12: false });
  return d.toDateString() === new Date().toDateString() ? time : `${d.toLocaleDateString()} ${time}`;
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
