// Spectrum (array values), scatter and trend (uPlot). Spectrum and scatter draw on the board
// canvas as one path each; a trend owns a uPlot chart whose redraws the board spreads over
// frames under a time budget.

import type { Publication } from 'switchboard-sdk';
import uPlot from 'uplot';
import { num, optNum, qualityColor, THEME, Widget } from './base.js';

export class SpectrumWidget extends Widget {
  protected override mayOverflow = false;
  private bins: number[] = [];
  /** Running maximum for automatic scaling; decays slowly so a spike does not flatten forever. */
  private peak = 0;

  protected take(value: unknown): void {
    this.bins = Array.isArray(value) ? value.map((v) => num(v, 0)) : [num(value, 0)];
    let m = 0;
    for (const b of this.bins) if (b > m) m = b;
    this.peak = Math.max(m, this.peak * 0.98);
  }

  protected paint(ctx: CanvasRenderingContext2D, x: number, y: number, w: number, h: number): void {
    const n = this.bins.length;
    if (n === 0) return;
    const min = num(this.spec.options.min, 0);
    const max = optNum(this.spec.options.max) ?? (this.peak || 1);
    const span = max - min || 1;
    const bw = w / n;
    const gap = bw > 3 ? 1 : 0;
    ctx.fillStyle = qualityColor(this.quality, THEME.accent);
    ctx.beginPath();
    for (let i = 0; i < n; i++) {
      const f = Math.max(0, Math.min(1, (this.bins[i] - min) / span));
      const bh = f * h;
      ctx.rect(x + i * bw, y + h - bh, Math.max(1, bw - gap), bh);
    }
    ctx.fill();
  }

  override describe(): string {
    return `${this.bins.length} bins`;
  }
}

export class ScatterWidget extends Widget {
  protected override mayOverflow = false;
  private xs = new Float64Array(0);
  private ys = new Float64Array(0);
  private count = 0;
  private next = 0;
  private lastX: number | null = null;
  private prevY: number | null = null;

  override layout(): void {
    super.layout();
    const cap = Math.max(2, Math.min(5000, Math.floor(num(this.spec.options.points, 200))));
    if (cap !== this.xs.length) {
      this.xs = new Float64Array(cap);
      this.ys = new Float64Array(cap);
      this.count = this.next = 0;
    }
  }

  override extraChannels(): string[] {
    const xc = this.spec.options.x_channel;
    return typeof xc === 'string' && xc !== '' && xc !== this.spec.channel ? [xc] : [];
  }

  private xChannel(): string | null {
    const xc = this.spec.options.x_channel;
    return typeof xc === 'string' && xc !== '' ? xc : null;
  }

  override apply(p: Publication, channel: string): boolean {
    const xc = this.xChannel();
    if (xc !== null && channel === xc && channel !== this.spec.channel) {
      const v = num(this.extract(p.data), NaN);
      if (!Number.isNaN(v)) this.lastX = v;
      return false;
    }
    return super.apply(p, channel);
  }

  protected take(value: unknown): void {
    const y = num(value, NaN);
    if (Number.isNaN(y)) return;
    const x = this.xChannel() !== null ? this.lastX : this.prevY;
    this.prevY = y;
    if (x === null) return;
    this.xs[this.next] = x;
    this.ys[this.next] = y;
    this.next = (this.next + 1) % this.xs.length;
    this.count = Math.min(this.count + 1, this.xs.length);
  }

  protected paint(ctx: CanvasRenderingContext2D, x: number, y: number, w: number, h: number): void {
    const n = this.count;
    if (n === 0) return;
    let x0 = Infinity;
    let x1 = -Infinity;
    let y0 = Infinity;
    let y1 = -Infinity;
    for (let i = 0; i < n; i++) {
      const a = this.xs[i];
      const b = this.ys[i];
      if (a < x0) x0 = a;
      if (a > x1) x1 = a;
      if (b < y0) y0 = b;
      if (b > y1) y1 = b;
    }
    const sx = (w - 6) / (x1 - x0 || 1);
    const sy = (h - 6) / (y1 - y0 || 1);
    ctx.strokeStyle = THEME.off;
    ctx.lineWidth = 1;
    ctx.strokeRect(x + 0.5, y + 0.5, w - 1, h - 1);
    ctx.fillStyle = qualityColor(this.quality, THEME.accent);
    ctx.beginPath();
    for (let i = 0; i < n; i++) ctx.rect(x + 3 + (this.xs[i] - x0) * sx - 1.5, y + h - 3 - (this.ys[i] - y0) * sy - 1.5, 3, 3);
    ctx.fill();
    // The newest point stands out.
    const last = (this.next + this.xs.length - 1) % this.xs.length;
    ctx.fillStyle = THEME.text;
    ctx.fillRect(x + 3 + (this.xs[last] - x0) * sx - 2.5, y + h - 3 - (this.ys[last] - y0) * sy - 2.5, 5, 5);
  }

  override describe(): string {
    return `${this.count} points`;
  }
}

/** Time axis labels as a wall clock, one line. */
function clockLabels(_u: uPlot, splits: number[]): string[] {
  return splits.map((s) => {
    const d = new Date(s * 1000);
    const p = (n: number) => String(n).padStart(2, '0');
    return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
  });
}

/** Most live points a trend keeps (older ones also fall out of its time window). */
const TREND_POINTS = 2000;

/** Time windows offered by a trend's selector, seconds. */
export const TREND_WINDOWS = [60, 300, 900, 3600, 8 * 3600];

/** Most buckets asked of the server for a window (its step is derived from the count). */
const TREND_BUCKETS = 1000;

/** The server's trend of a channel over a window: what a trend backfills with. */
export type TrendFetcher = (channel: string, windowS: number, stepS: number) => Promise<{ t: number; last: number }[]>;

/** The step to ask the server for over `windowS`: about a bucket per pixel of a plot
 * `widthPx` wide (60 … `TREND_BUCKETS` of them) — more would not show. */
export function trendStep(windowS: number, widthPx: number): number {
  const buckets = Math.max(60, Math.min(TREND_BUCKETS, Math.round(widthPx)));
  return Math.max(1, Math.ceil(windowS / buckets));
}

function windowLabel(s: number): string {
  return s % 3600 === 0 ? `${s / 3600}h` : s % 60 === 0 ? `${s / 60}m` : `${s}s`;
}

export class TrendWidget extends Widget {
  /** Reads the server's trend when the operator widens the window (set by the app). */
  static fetchTrend: TrendFetcher = () => Promise.resolve([]);

  // Values live in one linear buffer (grown on demand up to twice the kept size); when its end
  // is reached the live part moves to the front. uPlot gets subarray views, so a redraw
  // allocates nothing.
  private xs = new Float64Array(64);
  private ys = new Float64Array(64);
  private start = 0;
  private end = 0;
  private plot: uPlot | null = null;
  private el: HTMLElement | null = null;
  private plotDirty = false;
  private last = NaN;
  private size = { w: 0, h: 0 };
  /** The window chosen in the selector (not saved); null: the widget's `window_s`. */
  private chosenWindow: number | null = null;
  /** Paused: live values are kept but the plot stands still. */
  private paused = false;
  /** The zoomed time range (unix s), set by dragging over the plot; implies paused. */
  private zoom: [number, number] | null = null;
  private toolbar: { select: HTMLSelectElement; pause: HTMLButtonElement; state: HTMLElement } | null = null;

  /** The time window shown, seconds. */
  windowS(): number {
    return this.chosenWindow ?? Math.max(1, num(this.spec.options.window_s, 60));
  }

  /** Trend controls' state (tests). */
  viewState(): { windowS: number; paused: boolean; zoom: [number, number] | null } {
    return { windowS: this.windowS(), paused: this.paused, zoom: this.zoom ? [...this.zoom] : null };
  }

  protected take(value: unknown, p: Publication): void {
    const v = num(value, NaN);
    if (Number.isNaN(v)) return;
    const d = p.data as { t?: unknown } | null;
    const t = (d && typeof d === 'object' && typeof d.t === 'number' ? d.t : Date.now()) / 1000;
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
    this.xs[this.end] = t;
    this.ys[this.end] = v;
    this.end++;
    const window = this.windowS();
    while (this.start < this.end - 1 && this.xs[this.start] < t - window) this.start++;
    if (this.end - this.start > TREND_POINTS) this.compact();
    this.last = v;
    this.plotDirty = true;
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
  backfill(buckets: { t: number; last: number }[]): void {
    this.backfilled = true;
    const firstLive = this.end > this.start ? this.xs[this.start] : Infinity;
    const old = buckets.filter((b) => Number.isFinite(b.last) && b.t / 1000 < firstLive);
    if (old.length === 0) return;
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
    this.plotDirty = true;
    this.dirty = true;
  }

  protected paint(): void {
    // The chart is uPlot's; the canvas only keeps the panel behind it.
  }

  override layout(): void {
    super.layout();
    if (this.el) {
      this.placeElement();
      this.resizePlot();
    }
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
    const axis: uPlot.Axis = { stroke: THEME.dim, font, size: 28, gap: 2, grid: { stroke: '#222a33', width: 1 }, ticks: { show: false } };
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
      axes: axes ? [{ ...axis, size: 20, values: clockLabels }, { ...axis, size: 36 }] : [{ show: false }, { show: false }],
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
    if (this.zoom) this.plot.setScale('x', { min: this.zoom[0], max: this.zoom[1] });
    this.size = { w: this.body.w, h: this.body.h };
    this.plotDirty = false;
    this.addToolbar(el);
  }

  /** Window selector, pause/live button and the paused/zoomed badge, over the plot's corner. */
  private addToolbar(el: HTMLElement): void {
    if (this.body.w < 140 || this.body.h < 60) return;
    const select = document.createElement('select');
    select.className = 'trend-window';
    select.title = 'time window';
    const windows = [...new Set([...TREND_WINDOWS, Math.max(1, num(this.spec.options.window_s, 60))])].sort((a, b) => a - b);
    for (const w of windows) {
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
        (b) => this.backfill(b),
        () => {},
      );
    }
    this.zoom = null;
    this.plot?.setScale('x', { min: Date.now() / 1000 - s, max: Date.now() / 1000 });
    this.plotDirty = true;
    this.showTools();
  }

  pause(): void {
    this.paused = true;
    this.showTools();
  }

  /** Back to the live view: zoom reset, plot following the newest values. */
  resume(): void {
    this.paused = false;
    this.zoom = null;
    this.plotDirty = true;
    this.showTools();
  }

  /** Zooms into `[from, to]` (unix s); the plot holds still until resumed. */
  zoomTo(from: number, to: number): void {
    if (!(to > from)) return;
    this.zoom = [from, to];
    this.paused = true;
    this.plot?.setScale('x', { min: from, max: to });
    this.showTools();
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
    return [this.xs.subarray(this.start, this.end), this.ys.subarray(this.start, this.end)];
  }

  /** When the plot was last redrawn (performance.now()). */
  private drawnAt = 0;

  /**
   * A redraw is due when the plot has news and time has moved the x axis by a pixel since
   * the last one: a 60 s window 300 px wide redraws 5 times a second, however fast its point
   * changes — faster redraws would change what is seen by less than a pixel, and a board of
   * many trends spends its frames on them.
   */
  override domPending(): boolean {
    return this.plotDirty && this.plot !== null && !this.paused;
  }

  override domDirty(): boolean {
    if (!this.plotDirty || this.plot === null || this.paused) return false;
    const msPerPixel = (this.windowS() * 1000) / Math.max(1, this.body.w);
    return performance.now() - this.drawnAt >= Math.min(1000, msPerPixel);
  }

  override renderDom(): void {
    const plot = this.plot;
    if (!plot) return;
    this.plotDirty = false;
    this.drawnAt = performance.now();
    plot.batch(() => plot.setData(this.data()));
  }

  override describe(): string {
    return Number.isNaN(this.last) ? '' : String(this.last);
  }
}
