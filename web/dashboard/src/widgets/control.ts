// Operator controls: a button, a toggle or a setpoint that publishes to its channel (a
// confirmation first unless `confirm` is false). The current value is drawn on the canvas like
// a value widget; the control itself is DOM (the only widgets besides trends that own DOM).
// A refused publish (no permission, a namespace where clients may not publish) is shown on the
// widget with the server's message. Below it, the last send's outcome and author: "written to
// <source>" when the namespace writes to a device (the server's reply names the source),
// "published" otherwise, or the refusal's code — with who sent it (the signed-in user) and when.
// The server audits every write itself (GET /api/writes); this line is the operator's receipt.

import type { Publication } from 'switchboard-sdk';
import { clip, format, num, optNum, qualityColor, THEME, Widget } from './base.js';

/** How controls publish; the app sets it (the SDK client's publish). */
export type Publisher = (channel: string, data: unknown) => Promise<unknown>;

/** The outcome of a control's last send. */
export interface LastWrite {
  /** `written` (a device took it), `published`, or `refused`. */
  outcome: 'written' | 'published' | 'refused';
  /** Who sent it: the signed-in user ('' when the page is not signed in). */
  by: string;
  /** The source that wrote it (device writes), else ''. */
  source: string;
  /** The server's error code of a refusal, else 0. */
  code: number;
  /** Unix ms of the answer. */
  t: number;
}

export class ControlWidget extends Widget {
  static publish: Publisher = () => Promise.reject(new Error('not connected'));
  /** Asked before publishing when the widget's `confirm` is not false. */
  static confirm: (question: string) => boolean = (q) => window.confirm(q);
  /** Who is signed in; the app sets it. */
  static who: () => string = () => '';

  private current: unknown = undefined;
  private el: HTMLElement | null = null;
  private error: HTMLElement | null = null;
  private status: HTMLElement | null = null;
  private last: LastWrite | null = null;
  private input: HTMLInputElement | null = null;
  private toggleButton: HTMLButtonElement | null = null;
  private text = '';

  private get mode(): 'button' | 'toggle' | 'setpoint' {
    const m = this.spec.options.control;
    return m === 'toggle' || m === 'setpoint' ? m : 'button';
  }

  protected take(value: unknown, _p: Publication): void {
    this.current = value;
    const units = this.spec.options.units;
    const s = format(value, optNum(this.spec.options.decimals));
    this.text = typeof units === 'string' && units !== '' ? `${s} ${units}` : s;
    if (this.toggleButton) this.toggleButton.textContent = this.on() ? 'ON' : 'OFF';
  }

  private on(): boolean {
    const v = this.current;
    return v === true || v === 1 || (typeof v === 'string' && ['true', 'on', '1'].includes(v.toLowerCase()));
  }

  protected paint(ctx: CanvasRenderingContext2D, x: number, y: number, w: number, _h: number): void {
    ctx.fillStyle = qualityColor(this.quality, THEME.text);
    ctx.font = `600 13px ${THEME.font}`;
    ctx.textAlign = 'left';
    ctx.textBaseline = 'top';
    ctx.fillText(clip(this.text, w - 4, 7), x + 2, y + 2);
  }

  override describe(): string {
    return this.text;
  }

  override needsDom(): boolean {
    return true;
  }

  override attach(layer: HTMLElement): void {
    if (this.el) return;
    const el = document.createElement('div');
    el.className = 'control';
    const row = document.createElement('div');
    row.className = 'row';
    if (this.mode === 'setpoint') {
      const input = document.createElement('input');
      input.type = 'number';
      input.step = 'any';
      input.className = 'control-input';
      const min = optNum(this.spec.options.min);
      const max = optNum(this.spec.options.max);
      if (min !== null) input.min = String(min);
      if (max !== null) input.max = String(max);
      this.input = input;
      row.append(input, this.button('Set', () => this.setpoint()));
    } else if (this.mode === 'toggle') {
      this.toggleButton = this.button(this.on() ? 'ON' : 'OFF', () => this.send(!this.on()));
      row.append(this.toggleButton);
    } else {
      const value = this.spec.options.value ?? true;
      row.append(this.button(String(this.spec.options.button_label ?? 'Send'), () => this.send(value)));
    }
    this.error = document.createElement('div');
    this.error.className = 'control-error';
    this.status = document.createElement('div');
    this.status.className = 'control-status';
    el.append(row, this.error, this.status);
    this.showLast();
    this.el = el;
    this.place();
    layer.appendChild(el);
  }

  override attached(): boolean {
    return this.el !== null;
  }

  override detach(): void {
    this.el?.remove();
    this.el = this.error = this.status = this.input = this.toggleButton = null;
  }

  override layout(): void {
    super.layout();
    if (this.el) this.place();
  }

  private place(): void {
    const b = this.body;
    const el = this.el!;
    el.style.left = `${b.x}px`;
    el.style.top = `${b.y + 18}px`;
    el.style.width = `${b.w}px`;
  }

  private button(text: string, action: () => void): HTMLButtonElement {
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'control-button';
    b.textContent = text;
    b.addEventListener('click', action);
    return b;
  }

  private setpoint(): void {
    const v = num(this.input?.value ?? '', NaN);
    const min = optNum(this.spec.options.min);
    const max = optNum(this.spec.options.max);
    if (Number.isNaN(v) || (min !== null && v < min) || (max !== null && v > max)) {
      this.showError(`enter a number${min !== null || max !== null ? ` within ${min ?? '−∞'}…${max ?? '∞'}` : ''}`);
      return;
    }
    this.send(v);
  }

  /** Publishes `{"v": value}` after the operator confirms. */
  private send(value: unknown): void {
    const ch = this.spec.channel;
    if (!ch) return;
    if (this.spec.options.confirm !== false && !ControlWidget.confirm(`Send ${JSON.stringify(value)} to ${ch}?`)) return;
    this.showError('');
    const by = ControlWidget.who();
    ControlWidget.publish(ch, { v: value, t: Date.now() }).then(
      (reply: unknown) => {
        this.showError('');
        const r = (reply ?? {}) as { written?: boolean; source?: string };
        const source = r.written === true && typeof r.source === 'string' ? r.source : '';
        this.last = { outcome: source ? 'written' : 'published', by, source, code: 0, t: Date.now() };
        this.showLast();
      },
      (e: unknown) => {
        this.showError(`refused: ${(e as Error).message ?? String(e)}`);
        const code = typeof (e as { code?: unknown }).code === 'number' ? (e as { code: number }).code : 0;
        this.last = { outcome: 'refused', by, source: '', code, t: Date.now() };
        this.showLast();
      },
    );
  }

  private showLast(): void {
    const l = this.last;
    if (!this.status) return;
    this.status.textContent = l === null ? '' : describeLast(l);
    this.status.dataset.outcome = l?.outcome ?? '';
  }

  /** The last send's outcome, for the app's state and tests. */
  lastWrite(): LastWrite | null {
    return this.last;
  }

  private showError(text: string): void {
    if (this.error) this.error.textContent = text;
  }

  /** The error shown, for tests. */
  errorText(): string {
    return this.error?.textContent ?? '';
  }
}

/** "written to plant by ana · 14:02:07", "refused 413 by api · 14:02:09". */
export function describeLast(l: LastWrite): string {
  const what = l.outcome === 'written' ? `written to ${l.source}` : l.outcome === 'refused' ? `refused${l.code ? ` ${l.code}` : ''}` : 'published';
  const when = new Date(l.t).toLocaleTimeString([], { hour12: false });
  return `${what} by ${l.by || 'anonymous'} · ${when}`;
}
