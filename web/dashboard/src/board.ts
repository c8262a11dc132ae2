// The board: widgets on one canvas, rendered in ONE pass per animation frame.
//
// Each frame runs, in order: the SDK's delivery of the publications received since the last
// frame (it schedules itself through `board.scheduler`), which only stores values and marks
// widgets dirty; then the widgets whose held-back news is due (trends redraw at a pixel's
// pace) are marked too; then one render pass redraws the bodies of dirty widgets in view (or
// everything after a scroll, resize or edit); then DOM work (controls, and the chart of a
// trend the operator points at), as much as fits a time budget, round-robin.
// Layout is never read during a frame: sizes and scroll offsets are read in their own events.
//
// In run mode the grid scales to the screen's width: cells grow (never shrink) until the
// widgets span the board, up to `MAX_CELL`. Edit mode keeps `CELL`, the grid being edited.

import type { FrameBatch, Publication, Scheduler } from 'switchboard-sdk';
import { CELL, type WidgetSpec } from './model.js';
import type { ShownAlarm } from './widgets/base.js';
import type { TextRun } from './widgets/fit.js';
import { createWidget, THEME, type Widget } from './widgets/index.js';
import { TrendWidget } from './widgets/trend.js';

export interface PageRect {
  x: number;
  y: number;
  width: number;
  height: number;
}

/** A run of text as drawn: its left edge and baseline in page coordinates. */
export interface PageText {
  text: string;
  font: string;
  x: number;
  y: number;
}

export interface BoardStats {
  widgets: number;
  widgetsWithValue: number;
  updatesApplied: number;
  framesRendered: number;
  widgetsVisible: number;
  /** Trend widgets, those that received their server-side trend (backfill), and those that
   * have been drawn with it. */
  trends: number;
  trendsBackfilled: number;
  trendsShown: number;
}

/** Time per frame given to trend (uPlot) redraws and chart creation, ms. */
const TREND_BUDGET_MS = 6;
/** Bounds of the adaptive number of widget redraws per frame. */
const MIN_DRAWS = 60;
const MAX_DRAWS = 20_000;
/** Frame intervals (ms) above which a backlogged board draws less per frame, and below which
 * it draws more: the canvas is rasterized after the script returns, so only the frame interval
 * shows its real cost. */
const SLOW_FRAME_MS = 26;
const FAST_FRAME_MS = 20;
/** The largest a run-mode grid cell grows to fill the screen's width, px. */
const MAX_CELL = 3 * CELL;

/** The cell size at which `cols` grid columns fill `width` px: at least `CELL`, at most `MAX_CELL`. */
export function fitCell(width: number, cols: number): number {
  if (cols <= 0) return CELL;
  return Math.max(CELL, Math.min(MAX_CELL, Math.floor((width - CELL / 2) / cols)));
}

export class Board {
  readonly el: HTMLElement;
  readonly widgets: Widget[] = [];
  private readonly canvas: HTMLCanvasElement;
  private readonly ctx: CanvasRenderingContext2D;
  private readonly scroller: HTMLElement;
  private readonly content: HTMLElement;
  private readonly plots: HTMLElement;
  private readonly boxes: HTMLElement;
  private byChannel = new Map<string, Widget[]>();
  /** The channels each widget was indexed under, to notice a rebinding. */
  private indexed = new Map<Widget, string>();
  /** Each channel's latest publication, so a widget bound to a channel another widget already
   * shows gets its value at once. */
  private latest = new Map<string, Publication>();
  private withValue = 0;
  private updatesApplied = 0;
  private framesRendered = 0;
  private frameRequested = false;
  private beforeFrame: Array<() => void> = [];
  private fullRepaint = true;
  private viewChanged = true;
  private view = { x: 0, y: 0, w: 0, h: 0 };
  private dpr = 1;
  private visible: Widget[] = [];
  private trendCursor = 0;
  private recheck: ReturnType<typeof setTimeout> | null = null;
  /** Widget redraws allowed in one frame, adapted to the measured frame interval. */
  private drawBudget = 400;
  private drawCursor = 0;
  private lastFrameAt = 0;
  /** The last frame left dirty widgets for the next one. */
  private backlogged = false;
  private editing = false;
  private selected: Widget | null = null;
  private boxOf = new Map<Widget, HTMLElement>();
  /** Grid cell size in px: `CELL` in edit mode, scaled to the screen's width in run mode. */
  cell = CELL;
  /** Each channel's worst active server alarm (the alarm list's), shown by its widgets. */
  private alarms = new Map<string, ShownAlarm>();

  /** Called when the set of channels the widgets need changed. */
  onChannels: (channels: string[]) => void = () => {};
  /** Called when the selection changed (edit mode). */
  onSelect: (w: Widget | null) => void = () => {};
  /** Called after a widget was moved or resized by hand. */
  onEdit: (w: Widget) => void = () => {};

  constructor(parent: HTMLElement) {
    this.el = document.createElement('div');
    this.el.className = 'board-wrap';
    this.canvas = document.createElement('canvas');
    this.canvas.className = 'board-canvas';
    this.scroller = document.createElement('div');
    this.scroller.className = 'board';
    this.content = document.createElement('div');
    this.content.className = 'board-content';
    this.plots = document.createElement('div');
    this.plots.className = 'board-plots';
    this.boxes = document.createElement('div');
    this.boxes.className = 'board-boxes';
    this.content.append(this.plots, this.boxes);
    this.scroller.append(this.content);
    this.el.append(this.canvas, this.scroller);
    parent.append(this.el);
    const ctx = this.canvas.getContext('2d', { alpha: false });
    if (!ctx) throw new Error('no 2D canvas');
    this.ctx = ctx;
    new ResizeObserver(() => this.measure()).observe(this.scroller);
    this.scroller.addEventListener(
      'scroll',
      () => {
        this.view.x = this.scroller.scrollLeft;
        this.view.y = this.scroller.scrollTop;
        this.viewChanged = true;
        this.request();
      },
      { passive: true },
    );
    this.boxes.addEventListener('pointerdown', (e) => this.pointerDown(e));
    this.scroller.addEventListener('pointerdown', (e) => {
      if (this.editing && e.target === this.scroller) this.select(null);
    });
    // Pointing at a trend opens its chart (window, pause, zoom) over it.
    this.scroller.addEventListener('pointermove', (e) => this.pointAt(e), { passive: true });
  }

  /** The SDK's frame scheduler: its delivery runs at the start of the board's next frame. */
  readonly scheduler: Scheduler = (flush) => {
    this.beforeFrame.push(flush);
    this.request();
  };

  stats(): BoardStats {
    return {
      widgets: this.widgets.length,
      widgetsWithValue: this.withValue,
      updatesApplied: this.updatesApplied,
      framesRendered: this.framesRendered,
      widgetsVisible: this.visible.length,
      trends: this.widgets.filter((w) => w.spec.type === 'trend').length,
      trendsBackfilled: this.widgets.filter((w) => w.backfilled).length,
      trendsShown: this.widgets.filter((w) => w instanceof TrendWidget && w.shown()).length,
    };
  }

  // -------------------------------------------------------------------------------------
  // Widgets

  setWidgets(specs: WidgetSpec[]): void {
    for (const w of this.widgets) w.detach();
    this.widgets.length = 0;
    this.boxes.replaceChildren();
    this.boxOf.clear();
    this.selected = null;
    this.marked.clear();
    for (const s of specs) this.widgets.push(this.make(s));
    this.reindex();
    if (this.editing) for (const w of this.widgets) this.addBox(w);
    this.onSelect(null);
  }

  add(spec: WidgetSpec): Widget {
    const w = this.make(spec);
    this.widgets.push(w);
    this.reindex();
    if (this.editing) this.addBox(w);
    this.select(w);
    return w;
  }

  remove(w: Widget): void {
    const i = this.widgets.indexOf(w);
    if (i < 0) return;
    this.widgets.splice(i, 1);
    w.detach();
    this.boxOf.get(w)?.remove();
    this.boxOf.delete(w);
    if (this.selected === w) this.select(null);
    this.reindex();
  }

  /** After a widget's spec changed by hand: geometry, options, channel or type. Returns the
   * widget now in its place: a new type or channel makes a fresh widget (no stale values). */
  changed(w: Widget): Widget {
    const i = this.widgets.indexOf(w);
    if (i < 0) return w;
    let now = w;
    const rebind = this.channelsOf(w).join('\n') !== this.indexed.get(w);
    if (w.spec.type !== w.kind || rebind) {
      w.detach();
      now = this.make(w.spec);
      this.widgets[i] = now;
      const box = this.boxOf.get(w);
      this.boxOf.delete(w);
      if (box) this.boxOf.set(now, box);
      if (this.selected === w) this.selected = now;
      this.reindex();
    } else {
      w.layout();
      this.rescale();
      this.resize();
    }
    this.placeBox(now);
    this.fullRepaint = true;
    this.viewChanged = true;
    this.request();
    return now;
  }

  /** A widget on this board's grid, showing its channel's server alarm. */
  private make(spec: WidgetSpec): Widget {
    const w = createWidget(spec);
    w.showAlarm(this.alarms.get(spec.channel) ?? null);
    if (this.cell !== w.cell) {
      w.cell = this.cell;
      w.layout();
    }
    return w;
  }

  /** Sets the cell size for the mode and the screen's width; lays every widget out again when
   * it changed. */
  private rescale(): void {
    let cols = 0;
    for (const w of this.widgets) cols = Math.max(cols, w.spec.x + w.spec.w);
    const cell = this.editing ? CELL : fitCell(this.view.w, cols);
    if (cell === this.cell) return;
    this.cell = cell;
    for (const w of this.widgets) {
      w.cell = cell;
      w.layout();
    }
    for (const w of this.boxOf.keys()) this.placeBox(w);
    this.resize();
    this.fullRepaint = true;
    this.viewChanged = true;
    this.request();
  }

  /** Shows each channel's worst active server alarm on the widgets bound to it. */
  showAlarms(byChannel: Map<string, ShownAlarm>): void {
    this.alarms = byChannel;
    let changed = false;
    for (const w of this.widgets) changed = w.showAlarm(byChannel.get(w.spec.channel) ?? null) || changed;
    if (changed) this.request();
  }

  private channelsOf(w: Widget): string[] {
    return w.spec.channel ? [w.spec.channel, ...w.extraChannels()] : w.extraChannels();
  }

  private reindex(): void {
    this.byChannel = new Map();
    this.indexed = new Map();
    this.withValue = 0;
    for (const w of this.widgets) {
      const chans = this.channelsOf(w);
      this.indexed.set(w, chans.join('\n'));
      for (const ch of chans) {
        let list = this.byChannel.get(ch);
        if (!list) this.byChannel.set(ch, (list = []));
        list.push(w);
        const p = this.latest.get(ch);
        if (p && !w.hasValue) w.apply(p, ch);
      }
      if (w.hasValue) this.withValue++;
    }
    for (const ch of this.latest.keys()) if (!this.byChannel.has(ch)) this.latest.delete(ch);
    this.rescale();
    this.resize();
    this.fullRepaint = true;
    this.viewChanged = true;
    this.request();
    this.onChannels([...this.byChannel.keys()]);
  }

  /** Sizes the scrollable content to the widgets' extent. */
  private resize(): void {
    let w = 0;
    let h = 0;
    for (const x of this.widgets) {
      w = Math.max(w, (x.spec.x + x.spec.w) * this.cell);
      h = Math.max(h, (x.spec.y + x.spec.h) * this.cell);
    }
    const extra = this.editing ? CELL * 20 : this.cell;
    this.content.style.width = `${w + extra}px`;
    this.content.style.height = `${h + extra}px`;
  }

  /** Applies one frame's publications: values only; drawing follows in the same frame. */
  applyBatch(batch: FrameBatch): void {
    let applied = 0;
    for (const p of batch.publications) {
      const list = this.byChannel.get(p.channel);
      if (!list) continue;
      // A historical publication is never the channel's current value: a widget bound later
      // starts from the newest live one.
      if (!p.historical) this.latest.set(p.channel, p);
      for (const w of list) {
        const had = w.hasValue;
        if (w.apply(p, p.channel)) {
          applied++;
          if (!had && w.hasValue) this.withValue++;
        }
      }
    }
    this.updatesApplied += applied;
    if (applied > 0) this.request();
  }

  /** Phase of the blinking of unacknowledged alarms. */
  private blinkOn = true;

  /** Twice a second: values that turned stale (or whose stale age changed) and widgets with
   * an unacknowledged server alarm (blinking) are redrawn. */
  tick(now: number): void {
    this.blinkOn = !this.blinkOn;
    let changed = false;
    for (const w of this.widgets) {
      changed = w.checkStale(now) || changed;
      if (w.serverAlarm?.unacked) {
        w.dirty = true;
        changed = true;
      }
    }
    if (changed) this.request();
  }

  // -------------------------------------------------------------------------------------
  // Frames

  request(): void {
    if (this.frameRequested) return;
    this.frameRequested = true;
    requestAnimationFrame(this.frame);
  }

  private readonly frame = (now: number): void => {
    this.frameRequested = false;
    // Under load, draw fewer widgets per frame (the rest follow in the next frames, round-robin)
    // rather than let frames stretch; when frames are quick, allow more.
    if (this.lastFrameAt > 0) {
      const dt = now - this.lastFrameAt;
      if (this.backlogged && dt > SLOW_FRAME_MS) this.drawBudget = Math.max(MIN_DRAWS, Math.floor(this.drawBudget * 0.85));
      else if (dt < FAST_FRAME_MS) this.drawBudget = Math.min(MAX_DRAWS, Math.ceil(this.drawBudget * 1.1) + 8);
    }
    this.lastFrameAt = now;
    const run = this.beforeFrame;
    this.beforeFrame = [];
    for (const f of run) f();
    if (now < this.heldUntil) return;
    if (this.viewChanged) this.updateVisible();
    for (const w of this.visible) if (!w.dirty && w.due()) w.dirty = true;
    const canvasLeft = this.render();
    const trendsLeft = this.renderTrends();
    this.backlogged = canvasLeft || trendsLeft;
    this.framesRendered++;
    this.milestones();
    if (this.backlogged) this.request();
  };

  /** Until then (performance.now()) frames deliver values but draw nothing: see `holdPaint`. */
  private heldUntil = 0;
  private holdTimer: ReturnType<typeof setTimeout> | null = null;

  /** Draws nothing for up to `ms` (or until `releasePaint`): a board just opened is first
   * drawn with its values rather than as empty panels that are all drawn again a moment
   * later — at 4K each full drawing of a board costs a frame of a couple of hundred ms. */
  holdPaint(ms: number): void {
    this.heldUntil = performance.now() + ms;
    if (this.holdTimer) clearTimeout(this.holdTimer);
    this.holdTimer = setTimeout(() => this.releasePaint(), ms);
  }

  releasePaint(): void {
    if (this.heldUntil === 0) return;
    if (this.holdTimer) clearTimeout(this.holdTimer);
    this.holdTimer = null;
    this.heldUntil = 0;
    this.fullRepaint = true;
    this.request();
  }

  /** Performance marks of the board's first complete states since its widgets were set, for
   * benchmarks: `sb:first-frame`, `sb:values` (every widget has a value), `sb:trends` (every
   * trend has its server-side trend), `sb:charts` (every trend drawn with it), and
   * `sb:complete` (the frame after all of them, when their pixels are on screen). */
  private marked = new Set<string>();
  private milestones(): void {
    if (this.marked.size === 5 || this.widgets.length === 0) return;
    const mark = (name: string, reached: () => boolean) => {
      if (!this.marked.has(name) && reached()) {
        this.marked.add(name);
        performance.mark(`sb:${name}`);
      }
    };
    mark('first-frame', () => true);
    mark('values', () => this.withValue === this.widgets.length);
    const trends = this.widgets.filter((w) => w.spec.type === 'trend');
    mark('trends', () => trends.every((w) => w.backfilled));
    mark('charts', () => trends.every((w) => w instanceof TrendWidget && w.shown()));
    // Complete: the frame that drew the last of it has been committed, which the start of
    // the next frame shows.
    if (this.marked.size === 4) {
      this.marked.add('complete');
      requestAnimationFrame(() => performance.mark('sb:complete'));
    }
  }

  private measure(): void {
    const w = this.scroller.clientWidth;
    const h = this.scroller.clientHeight;
    const dpr = window.devicePixelRatio || 1;
    if (w === this.view.w && h === this.view.h && dpr === this.dpr) return;
    this.view.w = w;
    this.view.h = h;
    this.dpr = dpr;
    this.canvas.width = Math.max(1, Math.round(w * dpr));
    this.canvas.height = Math.max(1, Math.round(h * dpr));
    this.canvas.style.width = `${w}px`;
    this.canvas.style.height = `${h}px`;
    this.viewChanged = true;
    this.rescale();
    this.request();
  }

  private updateVisible(): void {
    this.viewChanged = false;
    this.fullRepaint = true;
    const { x, y, w, h } = this.view;
    const vis: Widget[] = [];
    for (const wd of this.widgets) {
      const r = wd.rect;
      wd.visible = r.x < x + w && r.x + r.w > x && r.y < y + h && r.y + r.h > y;
      if (wd.visible) vis.push(wd);
    }
    this.visible = vis;
  }

  /** Draws on the canvas; returns whether dirty widgets were left for the next frame. */
  private render(): boolean {
    const ctx = this.ctx;
    const { x: ox, y: oy } = this.view;
    ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    if (this.fullRepaint) {
      this.fullRepaint = false;
      ctx.fillStyle = THEME.bg;
      ctx.fillRect(0, 0, this.view.w, this.view.h);
      for (const w of this.visible) {
        w.drawFrame(ctx, ox, oy);
        w.drawBody(ctx, ox, oy, this.blinkOn);
      }
      return false;
    }
    const vis = this.visible;
    const n = vis.length;
    let drawn = 0;
    let i = 0;
    for (; i < n; i++) {
      const w = vis[(this.drawCursor + i) % n];
      if (!w.dirty) continue;
      if (drawn >= this.drawBudget) break;
      w.drawBody(ctx, ox, oy, this.blinkOn);
      drawn++;
    }
    if (n > 0) this.drawCursor = (this.drawCursor + i) % n;
    return i < n;
  }

  /** uPlot work under the frame budget; returns whether some is left for the next frame. */
  private renderTrends(): boolean {
    const vis = this.visible;
    const n = vis.length;
    if (n === 0) return false;
    const deadline = performance.now() + TREND_BUDGET_MS;
    // A chart redraw costs several widget bodies.
    const most = Math.max(2, Math.floor(this.drawBudget / 6));
    let done = 0;
    let left = false;
    let i = 0;
    let pending = false;
    for (; i < n; i++) {
      const w = vis[(this.trendCursor + i) % n];
      if (!w.needsDom()) {
        pending ||= w.domPending();
        continue;
      }
      if (!w.domDirty() && w.attached()) {
        pending ||= w.domPending();
        continue;
      }
      if (done >= most || performance.now() > deadline) {
        left = true;
        break;
      }
      w.attach(this.plots);
      if (w.domDirty()) w.renderDom();
      done++;
    }
    this.trendCursor = (this.trendCursor + i) % n;
    // Trends holding news back for their redraw rate get a frame later even when nothing else
    // arrives (the last value of a point that went quiet is drawn).
    if (pending && !left && !this.recheck) {
      this.recheck = setTimeout(() => {
        this.recheck = null;
        this.request();
      }, 100);
    }
    return left;
  }

  // -------------------------------------------------------------------------------------
  // Edit mode: a DOM box per widget to select, move and resize it.

  setEditing(on: boolean): void {
    if (on === this.editing) return;
    this.editing = on;
    this.el.classList.toggle('editing', on);
    this.boxes.replaceChildren();
    this.boxOf.clear();
    if (on) for (const w of this.widgets) this.addBox(w);
    else this.select(null);
    this.rescale();
    this.resize();
  }

  get selection(): Widget | null {
    return this.selected;
  }

  select(w: Widget | null): void {
    if (this.selected) this.boxOf.get(this.selected)?.classList.remove('selected');
    this.selected = w;
    if (w) this.boxOf.get(w)?.classList.add('selected');
    this.onSelect(w);
  }

  private addBox(w: Widget): void {
    const box = document.createElement('div');
    box.className = 'wbox';
    const tag = document.createElement('span');
    tag.className = 'wbox-tag';
    const handle = document.createElement('div');
    handle.className = 'wbox-resize';
    handle.title = 'drag to resize';
    box.append(tag, handle);
    this.boxes.append(box);
    this.boxOf.set(w, box);
    this.placeBox(w);
  }

  private placeBox(w: Widget): void {
    const box = this.boxOf.get(w);
    if (!box) return;
    const s = w.spec;
    const c = this.cell;
    box.style.left = `${s.x * c}px`;
    box.style.top = `${s.y * c}px`;
    box.style.width = `${s.w * c}px`;
    box.style.height = `${s.h * c}px`;
    box.dataset.index = String(this.widgets.indexOf(w));
    box.dataset.type = s.type;
    box.dataset.channel = s.channel;
    (box.firstChild as HTMLElement).textContent = `${s.type}${s.channel ? ' · ' + s.channel : ''}`;
  }

  private pointerDown(e: PointerEvent): void {
    const target = e.target as HTMLElement;
    const box = target.closest('.wbox') as HTMLElement | null;
    if (!box) return;
    const w = [...this.boxOf].find(([, b]) => b === box)?.[0];
    if (!w) return;
    e.preventDefault();
    this.select(w);
    const resizing = target.classList.contains('wbox-resize');
    const start = { x: e.clientX, y: e.clientY, sx: w.spec.x, sy: w.spec.y, sw: w.spec.w, sh: w.spec.h };
    box.setPointerCapture(e.pointerId);
    let moved = false;
    const move = (ev: PointerEvent) => {
      const dx = Math.round((ev.clientX - start.x) / this.cell);
      const dy = Math.round((ev.clientY - start.y) / this.cell);
      const s = w.spec;
      const before = `${s.x},${s.y},${s.w},${s.h}`;
      if (resizing) {
        s.w = Math.max(1, start.sw + dx);
        s.h = Math.max(1, start.sh + dy);
      } else {
        s.x = Math.max(0, start.sx + dx);
        s.y = Math.max(0, start.sy + dy);
      }
      if (before !== `${s.x},${s.y},${s.w},${s.h}`) {
        moved = true;
        this.changed(w);
      }
    };
    const up = () => {
      box.removeEventListener('pointermove', move);
      box.removeEventListener('pointerup', up);
      box.removeEventListener('pointercancel', up);
      if (moved) this.onEdit(w);
    };
    box.addEventListener('pointermove', move);
    box.addEventListener('pointerup', up);
    box.addEventListener('pointercancel', up);
  }

  /** Opens the chart of the trend under the pointer (run mode). */
  private pointAt(e: PointerEvent): void {
    if (this.editing || (e.target as HTMLElement).closest('.trend')) return;
    const r = this.scroller.getBoundingClientRect();
    const x = e.clientX - r.left + this.view.x;
    const y = e.clientY - r.top + this.view.y;
    for (const w of this.visible) {
      const b = w.body;
      if (w instanceof TrendWidget && x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + b.h) {
        w.point(this.plots, () => this.request());
        return;
      }
    }
  }

  /** The first free spot for a widget of this size (left to right, top to bottom). */
  freeSpot(w: number, h: number, cols = 48): { x: number; y: number } {
    const taken = (x: number, y: number) =>
      this.widgets.some((o) => x < o.spec.x + o.spec.w && x + w > o.spec.x && y < o.spec.y + o.spec.h && y + h > o.spec.y);
    for (let y = 0; y < 10_000; y++) for (let x = 0; x + w <= cols; x++) if (!taken(x, y)) return { x, y };
    return { x: 0, y: 0 };
  }

  /** Widget index → its panel and body in page coordinates, and the text it drew (label and
   * body text, each run's left edge and baseline in page coordinates) (tests, screenshots). */
  widgetRect(i: number): { panel: PageRect; body: PageRect; texts: PageText[]; labels: PageText[] } | null {
    const w = this.widgets[i];
    if (!w) return null;
    const b = this.scroller.getBoundingClientRect();
    const page = (r: { x: number; y: number; w: number; h: number }): PageRect => ({
      x: b.left + r.x - this.view.x,
      y: b.top + r.y - this.view.y,
      width: r.w,
      height: r.h,
    });
    const text = (origin: { x: number; y: number }) => (r: TextRun): PageText => ({
      text: r.text,
      font: r.font,
      x: b.left + origin.x + r.x - this.view.x,
      y: b.top + origin.y + r.y - this.view.y,
    });
    return {
      panel: page(w.rect),
      body: page(w.body),
      texts: w.texts().map(text(w.body)),
      labels: w.labelTexts().map(text({ x: w.rect.x + 5, y: w.rect.y + 2 })),
    };
  }

  /** Scrolls a widget into view. */
  reveal(i: number): void {
    const w = this.widgets[i];
    if (w) this.scroller.scrollTo({ left: Math.max(0, w.rect.x - this.cell), top: Math.max(0, w.rect.y - this.cell) });
  }
}
