// The alarm list above the board: the server's alarms (docs/alarms.md) that are not normal,
// worst first, with state, priority, message, value, age, and who acknowledged and when. The
// app subscribes `alarm:all` first, then reads `GET /api/alarms`; `AlarmBook` keeps per alarm
// the state with the higher `seq`, so every screen shows the same state whatever arrives first.
// Operators act as themselves (the page's connection): acknowledge with an optional comment,
// shelve for a chosen time, unshelve — each from a small form in the alarm's row.

import { AlarmBook, type AlarmState } from 'switchboard-sdk';
import { h } from './dom.js';
import { format, formatAge, formatTime as when } from './widgets/base.js';
import type { ShownAlarm } from './widgets/base.js';

/** What the list's buttons do; the app sends them as alarm commands on its connection. */
export interface AlarmActions {
  ack(id: string, comment: string): Promise<AlarmState>;
  shelve(id: string, forS: number, comment: string): Promise<AlarmState>;
  unshelve(id: string, comment: string): Promise<AlarmState>;
}

/** Shelving times offered, seconds (the server takes 1 s … 24 h). */
const SHELVE_FOR: Array<[number, string]> = [
  [300, '5 min'],
  [900, '15 min'],
  [3600, '1 h'],
  [4 * 3600, '4 h'],
  [8 * 3600, '8 h'],
  [86_400, '24 h'],
];
const SHELVE_DEFAULT_S = 3600;

const STATE_TEXT: Record<string, string> = {
  active_unacked: 'UNACK',
  active_acked: 'ACKED',
  rtn_unacked: 'RTN UNACK',
  shelved: 'SHELVED',
  out_of_service: 'OUT OF SERVICE',
  normal: 'NORMAL',
};

/** An alarm's row, kept while the alarm is listed so that an open form survives updates. */
interface Row {
  li: HTMLLIElement;
  state: HTMLElement;
  prio: HTMLElement;
  sev: HTMLElement;
  msg: HTMLElement;
  value: HTMLElement;
  age: HTMLElement;
  who: HTMLElement;
  ack: HTMLButtonElement;
  shelve: HTMLButtonElement;
  unshelve: HTMLButtonElement;
  since: number;
}

type FormKind = 'ack' | 'shelve' | 'unshelve';

export class AlarmList {
  readonly el: HTMLElement;
  readonly book = new AlarmBook();
  private readonly list: HTMLUListElement;
  private readonly count: HTMLElement;
  private readonly note: HTMLElement;
  private readonly rows = new Map<string, Row>();
  private order = '';
  private queued = false;
  /** The open form: which alarm and what it does. */
  private readonly form: HTMLFormElement;
  private readonly comment: HTMLInputElement;
  private readonly duration: HTMLSelectElement;
  private readonly submit: HTMLButtonElement;
  private readonly formError: HTMLElement;
  private formFor: { id: string; kind: FormKind } | null = null;

  /** Called after the alarms changed: each channel's worst active alarm, for the widgets. */
  onChange: (byChannel: Map<string, ShownAlarm>) => void = () => {};

  constructor(private readonly actions: AlarmActions) {
    this.count = h('span', { id: 'alarm-count' });
    this.note = h('span', { id: 'alarm-note', className: 'dim' });
    this.list = h('ul', { id: 'alarm-list', className: 'alarm-list' });
    this.el = h('section', { id: 'alarms', className: 'alarms' }, [h('div', { className: 'row' }, [this.count, this.note]), this.list]);
    this.el.hidden = true;

    this.comment = h('input', { name: 'comment', className: 'alarm-comment', placeholder: 'comment (optional)', maxLength: 500, autocomplete: 'off' });
    this.duration = h(
      'select',
      { name: 'for_s', className: 'alarm-for' },
      SHELVE_FOR.map(([s, text]) => h('option', { value: String(s), textContent: text, selected: s === SHELVE_DEFAULT_S })),
    );
    this.submit = h('button', { type: 'submit', className: 'alarm-submit' });
    const cancel = h('button', { type: 'button', className: 'alarm-cancel', textContent: 'Cancel' });
    this.formError = h('span', { className: 'alarm-error' });
    this.form = h('form', { className: 'alarm-form' }, [this.duration, this.comment, this.submit, cancel, this.formError]);
    this.form.addEventListener('submit', (e) => {
      e.preventDefault();
      void this.send();
    });
    cancel.addEventListener('click', () => this.closeForm());
    this.form.addEventListener('keydown', (e) => {
      if (e.key === 'Escape') this.closeForm();
    });
    this.list.addEventListener('click', (e) => {
      const button = (e.target as HTMLElement).closest('button[data-action]') as HTMLButtonElement | null;
      const li = button?.closest('li[data-alarm]') as HTMLElement | null;
      if (button && li) this.openForm(li.dataset.alarm ?? '', button.dataset.action as FormKind);
    });
  }

  /** A publication of `alarm:all`: one alarm's new state. */
  apply(data: unknown): void {
    if (this.book.apply(data as AlarmState)) this.changed();
  }

  /** The answer of `GET /api/alarms` (read after subscribing `alarm:all`). */
  applyAll(list: AlarmState[]): void {
    this.note.textContent = '';
    if (this.book.applyAll(list)) this.changed();
  }

  /** The alarms cannot be read (no alarm on this server, or no permission): said, not shown. */
  unavailable(why: string): void {
    this.note.textContent = why;
  }

  /** Once a second: the ages. */
  tick(now: number): void {
    for (const r of this.rows.values()) r.age.textContent = formatAge(Math.max(0, Math.floor((now - r.since) / 1000)));
  }

  /** The states listed, worst first (tests). */
  shown(): AlarmState[] {
    return this.book.list().filter((a) => a.state !== 'normal');
  }

  private changed(): void {
    if (this.queued) return;
    this.queued = true;
    queueMicrotask(() => {
      this.queued = false;
      this.render();
    });
  }

  private render(): void {
    const now = Date.now();
    const listed = this.shown();
    const ids = new Set(listed.map((a) => a.id));
    for (const [id, r] of this.rows) {
      if (ids.has(id)) continue;
      if (this.formFor?.id === id) this.closeForm();
      r.li.remove();
      this.rows.delete(id);
    }
    for (const a of listed) this.update(this.rows.get(a.id) ?? this.addRow(a.id), a, now);
    // Rows move only when the order changed: moving the row with an open form would take the
    // focus from its comment.
    const order = listed.map((a) => a.id).join('\n');
    if (order !== this.order) {
      this.order = order;
      for (const a of listed) this.list.append(this.rows.get(a.id)!.li);
    }
    const unacked = listed.filter((a) => a.state === 'active_unacked' || a.state === 'rtn_unacked').length;
    this.count.textContent = `${listed.length} alarm${listed.length === 1 ? '' : 's'}${unacked ? `, ${unacked} unacknowledged` : ''}`;
    this.el.hidden = listed.length === 0;
    if (this.formFor && !this.canAct(this.formFor.kind, this.book.get(this.formFor.id))) this.closeForm();
    this.onChange(this.byChannel());
  }

  /** Each channel's worst active alarm (the widgets show active ones; a returned one no more). */
  private byChannel(): Map<string, ShownAlarm> {
    const out = new Map<string, ShownAlarm>();
    for (const a of this.book.list()) {
      if (!(a.state === 'active_unacked' || a.state === 'active_acked') || !a.severity || out.has(a.channel)) continue;
      out.set(a.channel, { severity: a.severity, unacked: a.state === 'active_unacked' });
    }
    return out;
  }

  private addRow(id: string): Row {
    const span = (className: string) => h('span', { className });
    const button = (action: FormKind, text: string) => h('button', { type: 'button', className: action, textContent: text, dataset: { action } });
    const r: Row = {
      li: h('li', { dataset: { alarm: id } }),
      state: span('state'),
      prio: span('prio'),
      sev: span('sev'),
      msg: span('msg'),
      value: span('val'),
      age: span('age dim'),
      who: span('who dim'),
      ack: button('ack', 'Ack'),
      shelve: button('shelve', 'Shelve'),
      unshelve: button('unshelve', 'Unshelve'),
      since: 0,
    };
    r.li.append(r.state, r.prio, r.sev, r.msg, r.value, r.age, r.who, h('span', { className: 'actions' }, [r.ack, r.shelve, r.unshelve]));
    this.rows.set(id, r);
    return r;
  }

  private update(r: Row, a: AlarmState, now: number): void {
    const unacked = a.state === 'active_unacked' || a.state === 'rtn_unacked';
    r.li.className = `alarm ${a.severity ?? ''} p-${a.priority}${unacked ? ' unacked' : ''}${a.active ? ' active' : ''}`;
    r.li.dataset.state = a.state;
    r.state.textContent = STATE_TEXT[a.state] ?? a.state;
    r.prio.textContent = a.priority;
    r.sev.textContent = (a.severity ?? '').toUpperCase();
    r.msg.textContent = a.message || a.id;
    r.msg.title = `${a.id} · ${a.channel}`;
    r.value.textContent = format(a.value, null);
    r.since = a.since;
    r.age.textContent = formatAge(Math.max(0, Math.floor((now - a.since) / 1000)));
    r.age.title = when(a.since);
    const comment = a.comment ? ` — ${a.comment}` : '';
    if (a.state === 'shelved') r.who.textContent = `shelved until ${a.shelved_until ? when(a.shelved_until) : '?'}${comment}`;
    else if (a.acked_by) r.who.textContent = `acked by ${a.acked_by} at ${a.acked_at ? when(a.acked_at) : '?'}${comment}`;
    else r.who.textContent = '';
    r.ack.hidden = !this.canAct('ack', a);
    r.shelve.hidden = !this.canAct('shelve', a);
    r.unshelve.hidden = !this.canAct('unshelve', a);
  }

  private canAct(kind: FormKind, a: AlarmState | undefined): boolean {
    if (!a) return false;
    if (kind === 'ack') return a.state === 'active_unacked' || a.state === 'rtn_unacked';
    if (kind === 'unshelve') return a.state === 'shelved';
    return a.state !== 'out_of_service' && a.state !== 'normal';
  }

  private openForm(id: string, kind: FormKind): void {
    const r = this.rows.get(id);
    if (!r) return;
    const same = this.formFor?.id === id;
    this.formFor = { id, kind };
    this.duration.hidden = kind !== 'shelve';
    this.submit.textContent = kind === 'ack' ? 'Acknowledge' : kind === 'shelve' ? 'Shelve' : 'Unshelve';
    this.submit.disabled = false;
    this.formError.textContent = '';
    if (!same) this.comment.value = '';
    this.form.dataset.kind = kind;
    if (this.form.parentElement !== r.li) r.li.append(this.form);
    this.comment.focus();
  }

  private closeForm(): void {
    this.formFor = null;
    this.form.remove();
  }

  private async send(): Promise<void> {
    const f = this.formFor;
    if (!f) return;
    const comment = this.comment.value.trim();
    this.submit.disabled = true;
    this.formError.textContent = '';
    try {
      const s =
        f.kind === 'ack'
          ? await this.actions.ack(f.id, comment)
          : f.kind === 'shelve'
            ? await this.actions.shelve(f.id, Number(this.duration.value), comment)
            : await this.actions.unshelve(f.id, comment);
      if (this.formFor === f) this.closeForm();
      this.apply(s);
    } catch (e) {
      this.submit.disabled = false;
      this.formError.textContent = (e as Error).message || String(e);
    }
  }
}
