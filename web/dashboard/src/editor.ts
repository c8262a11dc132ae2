// Edit mode's properties form for the selected widget: type, channel, geometry and options.

import { h } from './dom.js';
import { OPTION_FIELDS, WIDGET_TYPES, type WidgetSpec } from './model.js';
import type { Widget } from './widgets/index.js';

export class WidgetForm {
  readonly el: HTMLElement;
  private readonly body: HTMLElement;
  private widget: Widget | null = null;

  /** Called after the form changed the widget's spec. */
  onChange: (w: Widget) => void = () => {};
  /** Called when the widget should be removed. */
  onRemove: (w: Widget) => void = () => {};

  constructor(private readonly channelList: HTMLDataListElement) {
    this.body = h('div', { id: 'widget-form' });
    this.el = h('section', { className: 'panel-section' }, [h('h2', { textContent: 'Widget' }), this.body]);
    this.show(null);
  }

  show(w: Widget | null): void {
    this.widget = w;
    if (!w) {
      this.body.replaceChildren(h('p', { className: 'dim', textContent: 'Select a widget on the board, or add one.' }));
      return;
    }
    const s = w.spec;
    const type = h('select', { name: 'type' }, WIDGET_TYPES.map((t) => h('option', { value: t, textContent: t, selected: t === s.type })));
    type.addEventListener('change', () => this.set((sp) => (sp.type = type.value as WidgetSpec['type'])));
    const channel = h('input', { name: 'channel', value: s.channel, placeholder: 'e.g. pt:sim.0', autocomplete: 'off' });
    channel.setAttribute('list', this.channelList.id);
    channel.addEventListener('change', () => this.set((sp) => (sp.channel = channel.value.trim())));
    const geometry = (['x', 'y', 'w', 'h'] as const).map((k) => {
      const input = h('input', { name: k, type: 'number', min: k === 'w' || k === 'h' ? '1' : '0', value: String(s[k]) });
      input.addEventListener('change', () => {
        const n = Math.round(Number(input.value));
        if (Number.isFinite(n)) this.set((sp) => (sp[k] = Math.max(k === 'w' || k === 'h' ? 1 : 0, n)));
      });
      return h('label', { className: 'geo' }, [k, input]);
    });
    const options = OPTION_FIELDS[s.type].map((f) => {
      const current = s.options[f.key];
      const input = h('input', {
        name: `opt-${f.key}`,
        type: f.kind === 'number' ? 'number' : 'text',
        value: current === undefined || current === null ? '' : String(current),
        placeholder: f.hint ?? '',
        step: 'any',
      });
      if (f.kind === 'channel') input.setAttribute('list', this.channelList.id);
      input.addEventListener('change', () =>
        this.set((sp) => {
          const v = input.value.trim();
          if (v === '') delete sp.options[f.key];
          else sp.options[f.key] = f.kind === 'number' ? Number(v) : v;
        }),
      );
      return h('label', {}, [h('span', { textContent: f.label }), input]);
    });
    const remove = h('button', { type: 'button', className: 'danger', id: 'remove-widget', textContent: 'Remove widget' });
    remove.addEventListener('click', () => this.widget && this.onRemove(this.widget));
    this.body.replaceChildren(
      h('label', {}, [h('span', { textContent: 'Type' }), type]),
      h('label', {}, [h('span', { textContent: 'Channel' }), channel]),
      h('div', { className: 'geometry' }, geometry),
      ...options,
      remove,
    );
  }

  private set(f: (s: WidgetSpec) => void): void {
    const w = this.widget;
    if (!w) return;
    const typeBefore = w.spec.type;
    f(w.spec);
    this.onChange(w);
    // A new type has other options: rebuild the form for the widget that replaced it.
    if (w.spec.type !== typeBefore) this.show(this.widget);
  }

  /** Refreshes the geometry fields after a drag. */
  refresh(): void {
    const w = this.widget;
    if (!w) return;
    for (const k of ['x', 'y', 'w', 'h'] as const) {
      const input = this.body.querySelector<HTMLInputElement>(`input[name="${k}"]`);
      if (input) input.value = String(w.spec[k]);
    }
  }

  /** The widget now shown (it may have been replaced by the board after a type change). */
  retarget(w: Widget | null): void {
    this.widget = w;
  }
}
