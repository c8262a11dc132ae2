// Trend: a point's recent values over a time window.
//
// A trend paints on the board canvas like every other widget: one path of at most a few points
// per pixel column (min and max of the column), and axes when the body is large enough. Two
// hundred trends on a board are then two hundred paths, not two hundred charts with their own
// canvases and DOM (which is what kept a 4K board of trends from opening within a second).
// The operator's tools come with the pointer: pointing at a trend puts a uPlot chart over it —
// window selector, pause, drag to zoom, double click back to live — which stays while the view
// is paused or zoomed and goes once the pointer left a live view.
//
// The server's trend replies name the tiers the namespace keeps (e.g. an hour of 1 s buckets,
// a day of 10 s, a week of 60 s): the window selector offers what they reach, and a zoom into
// history held coarser than a tier keeps it shows that tier's finer buckets for the range.
//
// A trend redraws when time has moved its axis by a pixel, not on every value: a 60 s window
// 300 px wide redraws 5 times a second however fast its point changes.

import type { Publication, TrendReply, TrendTier } from 'switchboard-sdk';
import uPlot from 'uplot';
import { clock, niceStep, ticks, timeStep, valueLabel } from './axes.js';
import { num, optNum, qualityColor, THEME, Widget } from './base.js';

/** Most live points a trend keeps (older ones also fall out of its time window). */
const TREND_POINTS = 2000;

/** Time windows a trend's selector offers (those the namespace's tiers reach), seconds. */
export const TREND_WINDOWS = [60, 300, 900, 3600, 8 * 3600];

/** Most buckets asked of the server for a window (its step is derived from the count). */
const TREND_BUCKETS = 1000;

/** How long a live chart stays after the pointer left it, ms. */
const CHART_LINGER_MS = 600;

/** Room for the value labels (left) and the time labels (bottom) of a trend with axes, px. */
const AXIS_LEFT = 36;
const AXIS_BOTTOM = 20;
const GRID = '#222a33';

/** The server's trend of a channel over the `windowS` seconds before `untilMs` (unix ms; now
 * when omitted): what a trend backfills and zooms with. */
export type TrendFetcher = (channel: string, windowS: number, stepS: number, untilMs?: number) => Promise<TrendReply>;

/** The step to ask the server for over `windowS`: about a bucket per pixel of a plot
 * `widthPx` wide (60 … `TREND_BUCKETS` of them) — more would not show. */
export function trendStep(windowS: number, widthPx: number): number {
  const buckets = Math.max(60, Math.min(TREND_BUCKETS, Math.round(widthPx)));
  return Math.max(1, Math.ceil(windowS / buckets));
}

function windowLabel(s: number): string {
  if (s % 86400 === 0) return `${s / 86400}d`;
  return s % 3600 === 0 ? `${s / 3600}h` : s % 60 === 0 ? `${s / 60}m` : `${s}s`;
}

/** Points of a plot: times (unix s) and values, the live part in [start, end). */
interface Series {
  xs: Float64Array;
  ys: Float64Array;
  start: number;
  end: number;
}

/** The first index of `s` whose time is at or after `t` (binary search; times are in order). */
function indexOf(s: Series, t: number): number {
  let a = s.start;
  let b = s.end;
  while (a < b) {
    const m = (a + b) >> 1;
    if (s.xs[m] < t) a = m + 1;
    else b = m;
  }
  return a;
}

export class TrendWidget extends Widget {
  /** Reads the server's trend when the operator widens the window (set by the app). */
  static fetchTrend: TrendFetcher = () => Promise.resolve({ step_s: 1, buckets: [], tiers: [] });

  // Values live in one linear buffer (grown on demand up to twice the kept size); when its end
  // is reached the live part moves to the front. uPlot gets subarray views, so a redraw
  // allocates nothing.
  private xs = new Float64Array(64);
  private ys = new Float64Array(64);
  private start = 0;
  private end = 0;
  private last = NaN;
  /** Values arrived since the trend was last drawn. */
  private news = false;
  /** When the trend was last drawn (performance.now()). */
  private drawnAt = 0;
  /** Drawn (on the canvas or in its chart) since its server-side trend arrived. */
  private shownBackfill = false;
  /** The window chosen in the selector (not saved); null: the widget's `window_s`. */
  private chosenWindow: number | null = null;
  /** Paused: live values are kept but the plot stands still over `held` (unix s). */
  private paused = false;
  private held: [number, number] | null = null;
  /** The zoomed time range (unix s), set by dragging over the plot; implies paused. */
  private zoom: [number, number] | null = null;
  /** The tiers of the namespace's trend (from the server's last trend reply), finest first. */
  private tiers: TrendTier[] = [];
  /** The step (s) of the history buckets held; points from `liveFrom` on are live values. */
  private bucketStep = Infinity;
  private liveFrom = Infinity;
  /** While zoomed: the points with the zoomed range's finer buckets in place of coarser ones. */
  private detail: (Series & { stepS: number }) | null = null;

  // The operator's chart, while pointed at (or paused, or zoomed).
  private plot: uPlot | null = null;
  private el: HTMLElement | null = null;
  private size = { w: 0, h: 0 };
  private toolbar: { select: HTMLSelectElement; pause: HTMLButtonElement; state: HTMLElement } | null = null;
  private linger: ReturnType<typeof setTimeout> | null = null;
  /** Asks the board for a frame (set when the chart is opened). */
  private request: () => void = () => {};

  /** The time window shown, seconds. */
  windowS(): number {
    return this.chosenWindow ?? Math.max(1, num(this.spec.options.window_s, 60));
  }

  /** Trend controls' state (tests). */
  viewState(): { windowS: number; paused: boolean; zoom: [number, number] | null; chart: boolean } {
    return { windowS: this.windowS(), paused: this.paused, zoom: this.zoom ? [...this.zoom] : null, chart: this.plot !== null };
  }

  /** The zoomed range's finer buckets, when a tier held them (tests). */
  zoomDetail(): { stepS: number; points: number } | null {
    if (!this.detail || !this.zoom) return null;
    const [from, to] = this.zoom;
    return { stepS: this.detail.stepS, points: indexOf(this.detail, to) - indexOf(this.detail, from) };
  }

  /** Whether the trend has been drawn with its server-side trend (benchmarks). */
  shown(): boolean {
    return this.shownBackfill;
  }

  /** A value redraws the body only when its redraw is due (or its state changed); otherwise it
   * waits for the board's pacing (`due`). */
  override apply(p: Publication, channel: string): boolean {
    const wasDirty = this.dirty;
    const before = `${this.quality}|${this.alarm}|${this.staleFor}|${this.hasValue}`;
    const took = super.apply(p, channel);
    if (took && !wasDirty && before === `${this.quality}|${this.alarm}|${this.staleFor}|${this.hasValue}`) {
      this.dirty = this.plot === null && this.due();
    }
    return took;
  }

  protected take(value: unknown, p: Publication): void {
    const v = num(value, NaN);
    if (Number.isNaN(v)) return;
    const d = p.data as { t?: unknown } | null;
    const t = (d && typeof d === 'object' && typeof d.t === 'number' ? d.t : Date.now()) / 1000;
    if (this.liveFrom === Infinity) this.liveFrom = t;
    this.makeRoom();
    this.xs[this.end] = t;
    this.ys[this.end] = v;
    this.end++;
    this.trim(t);
    this.last = v;
    this.news = true;
  }

  /** A back-filled value goes into the plot at its own time `t`, the points kept in time order;
   * one without a time, or from before what the view keeps, is left out. It is not the current
   * value: `last` (and what the base widget shows) stays the newest live one. */
  protected override takeHistorical(p: Publication): boolean {
    const v = num(this.extract(p.data), NaN);
    const d = p.data as { t?: unknown } | null;
    if (Number.isNaN(v) || !d || typeof d !== 'object' || typeof d.t !== 'number') return false;
    const t = d.t / 1000;
    const newest = this.end > this.start ? this.xs[this.end - 1] : t;
    if (t < this.keepFrom(Math.max(t, newest))) return false;
    this.makeRoom();
    const at = indexOf(this.kept(), t);
    this.xs.copyWithin(at + 1, at, this.end);
    this.ys.copyWithin(at + 1, at, this.end);
    this.xs[at] = t;
    this.ys[at] = v;
    this.end++;
    if (this.end - this.start > TREND_POINTS) this.compact();
    this.news = true;
    return true;
  }

  /** The oldest time (unix s) kept when the newest point is at `newest`: the window's start,
   * or earlier while a paused or zoomed view shows older points. */
  private keepFrom(newest: number): number {
    return Math.min(newest - this.windowS(), this.zoom?.[0] ?? Infinity, this.held?.[0] ?? Infinity);
  }

  /** Drops the points older than what is kept once the newest is at `newest`, and halves the
   * older points' resolution past `TREND_POINTS`. */
  private trim(newest: number): void {
    const keepFrom = this.keepFrom(newest);
    while (this.start < this.end - 1 && this.xs[this.start] < keepFrom) this.start++;
    if (this.end - this.start > TREND_POINTS) this.compact();
  }

  /** Makes room for one more point at the buffer's end: grows it (up to twice the kept size)
   * or moves the live part to the front. */
  private makeRoom(): void {
    if (this.end === this.xs.length) {
      const live = this.end - this.start;
      if (live * 2 > this.xs.length && this.xs.length < TREND_POINTS * 2) {
        const xs = new Float64Array(this.xs.length * 2);
        const ys = new Float64Array(this.xs.length * 2);
        xs.set(this.xs.subarray(this.start, this.end));
        ys.set(this.ys.subarray(this.start, this.end));
        this.xs = xs;
        this.ys = ys;
      } else {
        this.xs.copyWithin(0, this.start, this.end);
        this.ys.copyWithin(0, this.start, this.end);
      }
      this.start = 0;
      this.end = live;
    }
  }

  /** Halves the resolution of the older half of the points (each pair keeps its max, then its
   * min, alternately, so the envelope survives): a window of a fast point keeps its whole span
   * in a bounded number of points instead of dropping its oldest part. */
  private compact(): void {
    const n = this.end - this.start;
    const half = Math.floor(n / 2) & ~1;
    let w = this.start;
    for (let r = this.start, k = 0; r < this.start + half; r += 2, k++) {
      const a = this.ys[r];
      const b = this.ys[r + 1];
      this.xs[w] = this.xs[r];
      this.ys[w] = k % 2 === 0 ? Math.max(a, b) : Math.min(a, b);
      w++;
    }
    this.xs.copyWithin(w, this.start + half, this.end);
    this.ys.copyWithin(w, this.start + half, this.end);
    this.end = w + (n - half);
  }

  /** Points held for the plot. */
  points(): number {
    return this.end - this.start;
  }

  /** History from the server's trend (bucket starts in unix ms and their last values), put
   * before the live values already shown: the plot opens full instead of filling over time. */
  backfill(trend: TrendReply): void {
    this.backfilled = true;
    this.dirty = true;
    this.news = true;
    if (trend.tiers?.length) this.tiers = trend.tiers;
    const firstLive = this.end > this.start ? this.xs[this.start] : Infinity;
    const old = trend.buckets.filter((b) => Number.isFinite(b.last) && b.t / 1000 < firstLive);
    if (old.length === 0) return;
    this.bucketStep = trend.step_s;
    const live = this.end - this.start;
    const n = Math.min(old.length + live, TREND_POINTS * 2);
    const keep = n - live;
    const xs = new Float64Array(Math.max(64, n * 2));
    const ys = new Float64Array(xs.length);
    old.slice(old.length - keep).forEach((b, i) => {
      xs[i] = b.t / 1000;
      ys[i] = b.last;
    });
    xs.set(this.xs.subarray(this.start, this.end), keep);
    ys.set(this.ys.subarray(this.start, this.end), keep);
    this.xs = xs;
    this.ys = ys;
    this.start = 0;
    this.end = n;
    if (live === 0) this.last = old[old.length - 1].last;
  }

  // -------------------------------------------------------------------------------------
  // Painting on the board canvas

  /** News whose redraw is due: time moved the axis by a pixel since the last drawing. */
  override due(): boolean {
    if (!this.news || this.paused) return false;
    const msPerPixel = (this.windowS() * 1000) / Math.max(1, this.body.w);
    return performance.now() - this.drawnAt >= Math.min(1000, msPerPixel);
  }

  /** News held back for the redraw rate (the board looks again a moment later). */
  override domPending(): boolean {
    return this.news && !this.paused;
  }

  /** The time range shown (unix s): zoomed, held while paused, or the points' span. */
  private range(): [number, number] {
    if (this.zoom) return this.zoom;
    if (this.paused && this.held) return this.held;
    return [this.xs[this.start], this.xs[this.end - 1]];
  }

  /** The points shown: the zoomed range's finer ones while zoomed into them, else the held ones. */
  private series(): Series {
    return (this.zoom && this.detail) || this.kept();
  }

  private kept(): Series {
    return { xs: this.xs, ys: this.ys, start: this.start, end: this.end };
  }

  protected paint(ctx: CanvasRenderingContext2D, x: number, y: number, w: number, h: number): void {
    this.drawnAt = performance.now();
    this.news = false;
    if (this.backfilled) this.shownBackfill = true;
    // The chart is drawn over the body while open.
    const s = this.series();
    if (this.plot !== null || s.end === s.start) return;
    const axes = h >= 90 && w >= 160;
    const px = x + (axes ? AXIS_LEFT : 0);
    const pw = w - (axes ? AXIS_LEFT : 0);
    const ph = h - (axes ? AXIS_BOTTOM : 0);
    const [t0, t1] = this.range();
    const from = indexOf(s, t0);
    const to = Math.max(from, indexOf(s, t1 + 1e-9));
    const [v0, v1] = this.valueRange(s, from, to);
    const sx = pw / (t1 - t0 || 1);
    const sy = ph / (v1 - v0 || 1);
    if (axes) this.paintAxes(ctx, x, y, w, h, [t0, t1], [v0, v1]);
    ctx.strokeStyle = qualityColor(this.quality, THEME.accent);
    ctx.lineWidth = 1.25;
    ctx.beginPath();
    // Per pixel column: the first point, the column's min and max, the last point.
    let col = -1;
    let lo = 0;
    let hi = 0;
    let lastY = 0;
    const flush = () => {
      if (col < 0) return;
      const cx = px + col + 0.5;
      ctx.lineTo(cx, y + ph - (lo - v0) * sy);
      ctx.lineTo(cx, y + ph - (hi - v0) * sy);
      ctx.lineTo(cx, y + ph - (lastY - v0) * sy);
    };
    for (let i = from; i < to; i++) {
      const c = Math.floor((s.xs[i] - t0) * sx);
      const v = s.ys[i];
      if (c !== col) {
        flush();
        const first = y + ph - (v - v0) * sy;
        if (col < 0) ctx.moveTo(px + c + 0.5, first);
        else ctx.lineTo(px + c + 0.5, first);
        col = c;
        lo = hi = v;
      } else {
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
      lastY = v;
    }
    flush();
    ctx.stroke();
  }

  /** The value axis: the widget's min and max when both are set, else the points' extent
   * with a little room. */
  private valueRange(s: Series, from: number, to: number): [number, number] {
    const min = optNum(this.spec.options.min);
    const max = optNum(this.spec.options.max);
    if (min !== null && max !== null && max > min) return [min, max];
    let lo = Infinity;
    let hi = -Infinity;
    for (let i = from; i < to; i++) {
      const v = s.ys[i];
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    if (!Number.isFinite(lo)) return [0, 1];
    const pad = (hi - lo) * 0.05 || Math.abs(hi) * 0.05 || 1;
    return [lo - pad, hi + pad];
  }

  private paintAxes(
    ctx: CanvasRenderingContext2D,
    x: number,
    y: number,
    w: number,
    h: number,
    [t0, t1]: [number, number],
    [v0, v1]: [number, number],
  ): void {
    const px = x + AXIS_LEFT;
    const pw = w - AXIS_LEFT;
    const ph = h - AXIS_BOTTOM;
    ctx.font = `10px ${THEME.font}`;
    ctx.fillStyle = THEME.dim;
    ctx.strokeStyle = GRID;
    ctx.lineWidth = 1;
    ctx.beginPath();
    const vStep = niceStep((v1 - v0) / Math.max(1, Math.floor(ph / 30)));
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    for (const v of ticks(v0, v1, vStep)) {
      const ty = Math.round(y + ph - ((v - v0) / (v1 - v0 || 1)) * ph) + 0.5;
      ctx.moveTo(px, ty);
      ctx.lineTo(px + pw, ty);
      ctx.fillText(valueLabel(v, vStep), px - 3, Math.max(y + 6, Math.min(y + ph - 6, ty)));
    }
    const tStep = timeStep(((t1 - t0) * 70) / Math.max(1, pw));
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    for (const t of ticks(t0, t1, tStep)) {
      const tx = Math.round(px + ((t - t0) / (t1 - t0 || 1)) * pw) + 0.5;
      ctx.moveTo(tx, y);
      ctx.lineTo(tx, y + ph);
      ctx.fillText(clock(t), tx, y + ph + 4);
    }
    ctx.stroke();
  }

  override layout(): void {
    super.layout();
    if (this.el) {
      this.placeElement();
      this.resizePlot();
    }
  }

  // -------------------------------------------------------------------------------------
  // The operator's chart

  /** The pointer is over the trend: opens its chart (at once, so a drag that follows lands on
   * it) in `layer`. `request` asks the board for a frame. */
  point(layer: HTMLElement, request: () => void): void {
    this.request = request;
    if (this.linger) clearTimeout(this.linger);
    this.linger = null;
    if (!this.plot) this.attach(layer);
  }

  /** Charts are opened by `point`, not by the board's frames. */
  override needsDom(): boolean {
    return this.plot !== null;
  }

  private placeElement(): void {
    const el = this.el!;
    const b = this.body;
    el.style.left = `${b.x}px`;
    el.style.top = `${b.y}px`;
    el.style.width = `${b.w}px`;
    el.style.height = `${b.h}px`;
  }

  private plotOptions(): uPlot.Options {
    const b = this.body;
    const axes = b.h >= 90 && b.w >= 160;
    const min = optNum(this.spec.options.min);
    const max = optNum(this.spec.options.max);
    const font = `10px ${THEME.font}`;
    const axis: uPlot.Axis = { stroke: THEME.dim, font, size: 28, gap: 2, grid: { stroke: GRID, width: 1 }, ticks: { show: false } };
    const clockLabels = (_u: uPlot, splits: number[]) => splits.map(clock);
    return {
      width: Math.max(10, b.w),
      height: Math.max(10, b.h),
      legend: { show: false },
      // Dragging across the plot zooms into that time range (and pauses).
      cursor: { show: true, x: false, y: false, points: { show: false }, drag: { x: true, y: false, setScale: false } },
      select: { show: true, left: 0, top: 0, width: 0, height: 0 },
      hooks: { setSelect: [(u: uPlot) => this.selected(u)] },
      scales: {
        x: { time: true },
        y: min !== null && max !== null ? { range: [min, max] } : { auto: true },
      },
      axes: axes
        ? [
            { ...axis, size: AXIS_BOTTOM, values: clockLabels },
            { ...axis, size: AXIS_LEFT },
          ]
        : [{ show: false }, { show: false }],
      series: [{}, { stroke: qualityColor(this.quality, THEME.accent), width: 1.25, points: { show: false } }],
    };
  }

  override attach(layer: HTMLElement): void {
    if (this.el) return;
    const el = document.createElement('div');
    el.className = 'trend';
    this.el = el;
    this.placeElement();
    layer.appendChild(el);
    this.plot = new uPlot(this.plotOptions(), this.data(), el);
    const [t0, t1] = this.range();
    if (this.zoom || this.paused) this.plot.setScale('x', { min: t0, max: t1 });
    this.size = { w: this.body.w, h: this.body.h };
    this.news = false;
    this.addToolbar(el);
    el.addEventListener('pointerenter', () => {
      if (this.linger) clearTimeout(this.linger);
      this.linger = null;
    });
    el.addEventListener('pointerleave', () => this.release());
  }

  /** The pointer left: a live view goes back to the canvas a moment later. */
  private release(): void {
    if (this.linger) clearTimeout(this.linger);
    this.linger = setTimeout(() => {
      this.linger = null;
      if (this.paused || this.zoom || !this.plot) return;
      this.detach();
      this.dirty = true;
      this.request();
    }, CHART_LINGER_MS);
  }

  /** Window selector, pause/live button and the paused/zoomed badge, over the plot's corner. */
  private addToolbar(el: HTMLElement): void {
    if (this.body.w < 140 || this.body.h < 60) return;
    const select = document.createElement('select');
    select.className = 'trend-window';
    select.title = 'time window';
    for (const w of this.windowChoices()) {
      const o = document.createElement('option');
      o.value = String(w);
      o.textContent = windowLabel(w);
      select.append(o);
    }
    select.value = String(this.windowS());
    select.addEventListener('change', () => this.setWindow(Number(select.value)));
    const pause = document.createElement('button');
    pause.type = 'button';
    pause.className = 'trend-pause';
    pause.addEventListener('click', () => (this.paused ? this.resume() : this.pause()));
    const state = document.createElement('span');
    state.className = 'trend-state';
    const bar = document.createElement('div');
    bar.className = 'trend-tools';
    bar.append(state, select, pause);
    el.append(bar);
    // A double click anywhere on the plot returns to the live view.
    el.addEventListener('dblclick', () => this.resume());
    this.toolbar = { select, pause, state };
    this.showTools();
  }

  /** The windows the selector offers: the usual ones the namespace's tiers reach, each tier's
   * own and the widget's; the usual ones alone before any trend reply named the tiers. */
  windowChoices(): number[] {
    const reach = this.tiers.length ? Math.max(...this.tiers.map((t) => t.window_s)) : Infinity;
    const own = Math.max(1, num(this.spec.options.window_s, 60));
    const all = [...TREND_WINDOWS.filter((w) => w <= reach), ...this.tiers.map((t) => t.window_s), own];
    return [...new Set(all)].sort((a, b) => a - b);
  }

  private showTools(): void {
    const t = this.toolbar;
    if (!t) return;
    t.pause.textContent = this.paused ? '▶' : '❚❚';
    t.pause.title = this.paused ? 'back to live' : 'pause';
    t.state.textContent = this.zoom ? 'zoomed' : this.paused ? 'paused' : '';
    this.el?.classList.toggle('held', this.paused);
  }

  /** Shows the last `s` seconds; a wider window than held is backfilled from the server. */
  setWindow(s: number): void {
    const before = this.windowS();
    this.chosenWindow = s;
    if (this.end > this.start) {
      const newest = this.xs[this.end - 1];
      while (this.start < this.end - 1 && this.xs[this.start] < newest - s) this.start++;
    }
    if (s > before) {
      void TrendWidget.fetchTrend(this.spec.channel, s, trendStep(s, this.body.w)).then(
        (t) => {
          this.backfill(t);
          this.request();
        },
        () => {},
      );
    }
    this.zoom = null;
    this.detail = null;
    this.paused = false;
    this.held = null;
    this.plot?.setScale('x', { min: Date.now() / 1000 - s, max: Date.now() / 1000 });
    this.news = true;
    this.dirty = true;
    this.showTools();
  }

  pause(): void {
    this.paused = true;
    this.held = this.end > this.start ? [this.xs[this.start], this.xs[this.end - 1]] : null;
    this.showTools();
  }

  /** Back to the live view: zoom reset, plot following the newest values. */
  resume(): void {
    this.paused = false;
    this.held = null;
    this.zoom = null;
    this.detail = null;
    this.news = true;
    this.dirty = true;
    this.showTools();
    this.request();
  }

  /** Zooms into `[from, to]` (unix s); the plot holds still until resumed. History held
   * coarser than a tier keeps the range is replaced by that tier's buckets when they come. */
  zoomTo(from: number, to: number): void {
    if (!(to > from)) return;
    this.zoom = [from, to];
    this.detail = null;
    this.paused = true;
    this.plot?.setScale('x', { min: from, max: to });
    this.showTools();
    this.refine(from, to);
  }

  /** Asks the server for the zoomed range's history (up to the first live value) at about a
   * bucket per pixel, from the finest tier reaching back to it, when that is finer than held. */
  private refine(from: number, to: number): void {
    const end = Math.min(to, this.liveFrom, Date.now() / 1000);
    const tier = this.tiers.find((t) => t.window_s >= Date.now() / 1000 - from);
    if (!(end > from) || !tier) return;
    const step = Math.max(tier.step_s, trendStep(to - from, this.body.w));
    if (step >= this.bucketStep) return;
    const windowS = Math.max(step, Math.ceil(end - from));
    void TrendWidget.fetchTrend(this.spec.channel, windowS, step, end * 1000).then(
      (t) => {
        if (this.zoom?.[0] !== from || this.zoom[1] !== to) return;
        this.showDetail(from, end, t);
      },
      () => {},
    );
  }

  /** The held points with `[from, end)` replaced by the finer buckets of `t`. */
  private showDetail(from: number, end: number, t: TrendReply): void {
    const fine = t.buckets.filter((b) => Number.isFinite(b.last) && b.t / 1000 < end);
    if (fine.length === 0) return;
    const a = indexOf(this.kept(), Math.min(from, fine[0].t / 1000));
    const b = indexOf(this.kept(), end);
    const n = a - this.start + fine.length + (this.end - b);
    const xs = new Float64Array(n);
    const ys = new Float64Array(n);
    xs.set(this.xs.subarray(this.start, a));
    ys.set(this.ys.subarray(this.start, a));
    fine.forEach((p, i) => {
      xs[a - this.start + i] = p.t / 1000;
      ys[a - this.start + i] = p.last;
    });
    xs.set(this.xs.subarray(b, this.end), n - (this.end - b));
    ys.set(this.ys.subarray(b, this.end), n - (this.end - b));
    this.detail = { xs, ys, start: 0, end: n, stepS: t.step_s };
    this.dirty = true;
    if (this.plot && this.zoom) {
      this.plot.setData(this.data(), false);
      this.plot.setScale('x', { min: this.zoom[0], max: this.zoom[1] });
    }
    this.request();
  }

  private selected(u: uPlot): void {
    const sel = u.select;
    if (sel.width > 4) this.zoomTo(u.posToVal(sel.left, 'x'), u.posToVal(sel.left + sel.width, 'x'));
    if (sel.width > 0) u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
  }

  override attached(): boolean {
    return this.plot !== null;
  }

  override detach(): void {
    if (this.linger) clearTimeout(this.linger);
    this.linger = null;
    this.plot?.destroy();
    this.plot = null;
    this.el?.remove();
    this.el = null;
    this.toolbar = null;
  }

  private resizePlot(): void {
    if (!this.plot) return;
    if (this.size.w !== this.body.w || this.size.h !== this.body.h) {
      // Axes depend on the size: rebuild rather than resize.
      const parent = this.el!.parentElement!;
      this.detach();
      this.attach(parent);
    }
  }

  private data(): uPlot.AlignedData {
    const s = this.series();
    return [s.xs.subarray(s.start, s.end), s.ys.subarray(s.start, s.end)];
  }

  /** The open chart's redraw, at the same pace as painting. */
  override domDirty(): boolean {
    return this.plot !== null && this.due();
  }

  override renderDom(): void {
    const plot = this.plot;
    if (!plot) return;
    this.news = false;
    this.drawnAt = performance.now();
    if (this.backfilled) this.shownBackfill = true;
    plot.batch(() => plot.setData(this.data()));
  }

  override describe(): string {
    return Number.isNaN(this.last) ? '' : String(this.last);
  }
}
