// The alarm list: every widget whose value is beyond one of its limits (`lolo`, `lo`, `hi`,
// `hihi`) or whose alarm nobody acknowledged yet, worst first. Clicking a row (or "ack all")
// acknowledges: the widget stops blinking and stays coloured while the value is in alarm.

import { h } from './dom.js';
import { format, formatAge, type Widget } from './widgets/base.js';

export class AlarmList {
  readonly el: HTMLElement;
  private readonly list: HTMLElement;
  private readonly count: HTMLElement;
  private shown: Widget[] = [];
  private key = '';

  constructor() {
    this.count = h('span', { id: 'alarm-count' });
    const ackAll = h('button', { type: 'button', id: 'alarm-ack-all', textContent: 'ack all' });
    this.list = h('ul', { id: 'alarm-list', className: 'alarm-list' });
    this.el = h('section', { id: 'alarms', className: 'alarms' }, [h('div', { className: 'row' }, [this.count, ackAll]), this.list]);
    this.el.hidden = true;
    ackAll.addEventListener('click', () => {
      for (const w of this.shown) w.acknowledge();
    });
    this.list.addEventListener('click', (e) => {
      const li = (e.target as HTMLElement).closest('li[data-index]') as HTMLElement | null;
      if (li) this.shown[Number(li.dataset.index)]?.acknowledge();
    });
  }

  /** Redraws the list from the widgets' alarm states (cheap when nothing changed). */
  update(widgets: Widget[]): void {
    const now = Date.now();
    const active = widgets.filter((w) => w.alarm !== null || w.unacked);
    active.sort((a, b) => rank(b) - rank(a) || a.alarmSince - b.alarmSince);
    const key = active.map((w) => `${w.spec.channel}|${w.alarm}|${w.unacked}|${Math.floor((now - w.alarmSince) / 1000)}`).join(';');
    if (key === this.key) return;
    this.key = key;
    this.shown = active;
    this.el.hidden = active.length === 0;
    const unacked = active.filter((w) => w.unacked).length;
    this.count.textContent = `${active.length} alarm${active.length === 1 ? '' : 's'}${unacked ? `, ${unacked} unacknowledged` : ''}`;
    this.list.replaceChildren(
      ...active.map((w, i) => {
        const li = h('li', { className: `alarm ${w.alarm ?? 'cleared'}${w.unacked ? ' unacked' : ''}` }, [
          h('span', { className: 'state', textContent: (w.alarm ?? 'cleared').toUpperCase() }),
          h('span', { className: 'ch', textContent: String(w.spec.options.label ?? w.spec.channel) }),
          h('span', { textContent: format(w.alarmValue, null) }),
          h('span', { className: 'dim', textContent: formatAge(Math.floor((now - w.alarmSince) / 1000)) }),
        ]);
        li.dataset.index = String(i);
        li.title = w.unacked ? 'click to acknowledge' : 'acknowledged';
        return li;
      }),
    );
  }
}

function rank(w: Widget): number {
  return (w.unacked ? 10 : 0) + (w.alarm === 'hihi' || w.alarm === 'lolo' ? 2 : w.alarm ? 1 : 0);
}
