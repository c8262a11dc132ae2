// Spectrum (array values) and scatter: each draws on the board canvas as one path. Trends are
// in trend.ts.

import type { Publication } from 'switchboard-sdk';
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
    // Points pair current values: a back-filled one of either channel is not one.
    if (p.historical) return false;
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
