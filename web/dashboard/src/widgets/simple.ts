// Value display, LED and gauge: one value each, drawn on the board canvas.

import { clip, format, num, optNum, qualityColor, sprite, THEME, Widget } from './base.js';

export class ValueWidget extends Widget {
  private text = '';
  private font = '';
  private fontPx = 12;

  override layout(): void {
    super.layout();
    this.fontPx = Math.max(10, Math.min(32, Math.floor(this.body.h * 0.55), Math.floor(this.body.w / 4)));
    this.font = `600 ${this.fontPx}px ${THEME.font}`;
  }

  protected take(value: unknown): void {
    const units = this.spec.options.units;
    const s = format(value, optNum(this.spec.options.decimals));
    this.text = typeof units === 'string' && units !== '' ? `${s} ${units}` : s;
  }

  protected paint(ctx: CanvasRenderingContext2D, x: number, y: number, w: number, h: number): void {
    ctx.fillStyle = qualityColor(this.quality, THEME.text);
    ctx.font = this.font;
    ctx.textAlign = 'left';
    ctx.textBaseline = 'middle';
    ctx.fillText(clip(this.text, w - 4, this.fontPx * 0.56), x + 2, y + h / 2);
  }

  override describe(): string {
    return this.text;
  }
}

export class LedWidget extends Widget {
  private on = false;
  protected override mayOverflow = false;

  protected take(value: unknown): void {
    const threshold = optNum(this.spec.options.threshold);
    if (threshold !== null) this.on = num(value, -Infinity) > threshold;
    else if (typeof value === 'string') this.on = ['true', 'on', '1', 'yes'].includes(value.toLowerCase());
    else this.on = Boolean(value);
  }

  protected paint(ctx: CanvasRenderingContext2D, x: number, y: number, w: number, h: number): void {
    const r = Math.max(3, Math.floor(Math.min(w, h) / 2 - 3));
    const o = this.spec.options;
    let color = this.on ? (typeof o.on_color === 'string' ? o.on_color : THEME.good) : typeof o.off_color === 'string' ? o.off_color : THEME.off;
    if (this.quality === 'bad') color = THEME.bad;
    const d = 2 * r + 2;
    const disc = sprite(`led|${color}|${r}`, d, d, (c) => {
      c.beginPath();
      c.arc(d / 2, d / 2, r, 0, Math.PI * 2);
      c.fillStyle = color;
      c.fill();
      c.lineWidth = 1;
      c.strokeStyle = THEME.border;
      c.stroke();
    });
    ctx.drawImage(disc, Math.round(x + w / 2 - d / 2), Math.round(y + h / 2 - d / 2), d, d);
  }

  override describe(): string {
    return this.on ? 'on' : 'off';
  }
}

const START = Math.PI * 0.75;
const SWEEP = Math.PI * 1.5;

export class GaugeWidget extends Widget {
  private value = 0;
  private text = '';

  protected take(value: unknown): void {
    this.value = num(value, NaN);
    const units = this.spec.options.units;
    const s = format(value, optNum(this.spec.options.decimals));
    this.text = typeof units === 'string' && units !== '' ? `${s} ${units}` : s;
  }

  protected paint(ctx: CanvasRenderingContext2D, x: number, y: number, w: number, h: number): void {
    const min = num(this.spec.options.min, 0);
    const max = num(this.spec.options.max, 100);
    const r = Math.max(6, Math.min(w / 2, h / 1.7) - 6);
    const cx = x + w / 2;
    const cy = y + r + 4;
    const thick = Math.max(3, r * 0.18);
    const side = Math.ceil(2 * r + thick + 2);
    const track = sprite(`gauge-track|${r}`, side, side, (c) => {
      c.lineCap = 'butt';
      c.lineWidth = thick;
      c.strokeStyle = THEME.off;
      c.beginPath();
      c.arc(side / 2, side / 2, r, START, START + SWEEP);
      c.stroke();
    });
    ctx.drawImage(track, cx - side / 2, cy - side / 2, side, side);
    ctx.lineCap = 'butt';
    ctx.lineWidth = thick;
    const frac = Number.isNaN(this.value) ? 0 : Math.max(0, Math.min(1, (this.value - min) / (max - min || 1)));
    ctx.strokeStyle = qualityColor(this.quality, THEME.accent);
    ctx.beginPath();
    ctx.arc(cx, cy, r, START, START + SWEEP * frac);
    ctx.stroke();
    // Needle.
    const a = START + SWEEP * frac;
    ctx.lineWidth = 2;
    ctx.strokeStyle = THEME.text;
    ctx.beginPath();
    ctx.moveTo(cx, cy);
    ctx.lineTo(cx + Math.cos(a) * (r - thick), cy + Math.sin(a) * (r - thick));
    ctx.stroke();
    const px = Math.max(9, Math.min(20, Math.floor(r * 0.4)));
    ctx.fillStyle = THEME.text;
    ctx.font = `600 ${px}px ${THEME.font}`;
    ctx.textAlign = 'center';
    ctx.textBaseline = 'middle';
    ctx.fillText(clip(this.text, w, px * 0.56), cx, Math.min(y + h - px / 2 - 1, cy + r * 0.62));
  }

  override describe(): string {
    return this.text;
  }
}
