// Value display, LED and gauge: one value each, drawn on the board canvas.

import { format, num, optNum, qualityColor, sprite, THEME, Widget } from './base.js';
import { fitValue, type TextRun } from './fit.js';

/** The largest a value's number is drawn, px (it shrinks to fit its box, never past it). */
const VALUE_MAX_PX = 96;
const GAUGE_MAX_PX = 28;

/** A value's number (or word) and units as laid out for one box size, kept while neither
 * changes (compared field by field: a paint allocates nothing when they did not). */
class Fitted {
  private main = '';
  private units = '';
  private w = -1;
  private h = -1;
  private runs: TextRun[] = [];

  get(main: string, units: string, w: number, h: number, maxPx: number): TextRun[] {
    if (main !== this.main || units !== this.units || w !== this.w || h !== this.h) {
      [this.main, this.units, this.w, this.h] = [main, units, w, h];
      this.runs = fitValue(main, units, w, h, maxPx, 600, THEME.font);
    }
    return this.runs;
  }
}

/** A value's text and units as options give them. */
function valueText(value: unknown, options: Record<string, unknown>): { main: string; units: string } {
  const units = options.units;
  return { main: format(value, optNum(options.decimals)), units: typeof units === 'string' ? units : '' };
}

export class ValueWidget extends Widget {
  private main = '';
  private units = '';
  private readonly fitted = new Fitted();

  protected take(value: unknown): void {
    ({ main: this.main, units: this.units } = valueText(value, this.spec.options));
  }

  protected paint(ctx: CanvasRenderingContext2D, x: number, y: number, w: number, h: number): void {
    ctx.fillStyle = qualityColor(this.quality, THEME.text);
    this.drawTexts(ctx, this.fitted.get(this.main, this.units, w - 4, h, VALUE_MAX_PX), x, y, 2);
  }

  override describe(): string {
    return this.units ? `${this.main} ${this.units}` : this.main;
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
  private main = '';
  private units = '';
  private readonly fitted = new Fitted();

  protected take(value: unknown): void {
    this.value = num(value, NaN);
    ({ main: this.main, units: this.units } = valueText(value, this.spec.options));
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
    // The value in a band across the dial's open bottom, between the arc's ends, inside the body.
    const band = Math.max(10, Math.min(GAUGE_MAX_PX * 1.2, r * 0.45));
    const top = Math.max(0, Math.min(h - band, cy + r * 0.56 - band / 2 - y));
    const tw = Math.min(w - 4, Math.max(r * 1.6, 24));
    ctx.fillStyle = THEME.text;
    this.drawTexts(ctx, this.fitted.get(this.main, this.units, tw, Math.min(band, h), GAUGE_MAX_PX), x, y, (w - tw) / 2, top);
  }

  override describe(): string {
    return this.units ? `${this.main} ${this.units}` : this.main;
  }
}
