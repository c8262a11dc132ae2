// The alarm journal (`alarm-journal`): the server's record of every alarm transition (`GET
// /api/alarms/journal`), newest first — when, which alarm, what happened, the state it left,
// the value, who did it and their comment. Filters: an alarm or definition id, a kind, and a
// time range; older entries a page at a time. Bound to no channel: it reads the journal again
// shortly after each transition the page hears on `alarm:all`, and every few seconds while it
// is on the board (for definition changes, which are not alarm states).

import { ALARM_JOURNAL_KINDS, type AlarmJournalEntry, type Publication } from 'switchboard-sdk';
import type { JournalPage, JournalQuery } from '../api.js';
import { format, formatTime, optNum, THEME, Widget } from './base.js';

/** How the widget reads the journal; the app sets it (`Api.alarmJournal`). */
export type JournalReader = (q: JournalQuery) => Promise<JournalPage>;

/** A re-read this long after a transition gathers a burst into one read, ms. */
const SETTLE_MS = 250;
const PERIOD_MS = 10_000;
/** Entries per page unless the widget's `limit` says otherwise. */
const PAGE = 50;
/** Pages read at most for one request when a kind filter leaves a page (nearly) empty. */
const MOST_PAGES = 5;

const live = new Set<AlarmJournalWidget>();

export class AlarmJournalWidget extends Widget {
  static read: JournalReader = () => Promise.reject(new Error('not connected'));

  /** A transition happened: every journal on the board reads its newest entries again. */
  static notify(): void {
    for (const w of live) w.soon();
  }

  private el: HTMLElement | null = null;
  private list: HTMLElement | null = null;
  private more: HTMLButtonElement | null = null;
  private noteEl: HTMLElement | null = null;
  private inputs: { alarm: HTMLInputElement; kind: HTMLSelectElement; since: HTMLInputElement; until: HTMLInputElement } | null = null;
  private timer: ReturnType<typeof setInterval> | null = null;
  private settle: ReturnType<typeof setTimeout> | null = null;
  private rows: AlarmJournalEntry[] = [];
  private next: string | null = null;
  private note = '';
  /** Reads are numbered: an answer to a read the filters have since replaced is dropped. */
  private generation = 0;

  protected take(_value: unknown, _p: Publication): void {}

  protected paint(_ctx: CanvasRenderingContext2D, _x: number, _y: number, _w: number, _h: number): void {}

  /** The body is the list (DOM): the canvas only clears it. */
  override drawBody(ctx: CanvasRenderingContext2D, ox: number, oy: number): void {
    const b = this.body;
    ctx.fillStyle = THEME.panel;
    ctx.fillRect(b.x - ox, b.y - oy, b.w, b.h);
    this.dirty = false;
  }

  override describe(): string {
    return this.note || `${this.rows.length} entries`;
  }

  override needsDom(): boolean {
    return true;
  }

  override attach(layer: HTMLElement): void {
    if (this.el) return;
    const o = this.spec.options;
    const input = (className: string, props: Partial<HTMLInputElement>) => {
      const i = document.createElement('input');
      Object.assign(i, props);
      i.className = className;
      i.addEventListener('change', () => void this.reload());
      return i;
    };
    const alarm = input('journal-alarm', { placeholder: 'alarm or definition id', value: typeof o.alarm === 'string' ? o.alarm : '', title: 'alarm id, or a definition id (its instances too)' });
    const kind = document.createElement('select');
    kind.className = 'journal-kind';
    for (const k of ['', ...ALARM_JOURNAL_KINDS]) {
      const opt = document.createElement('option');
      opt.value = k;
      opt.textContent = k || 'every kind';
      kind.append(opt);
    }
    kind.value = typeof o.kind === 'string' && (ALARM_JOURNAL_KINDS as readonly string[]).includes(o.kind) ? o.kind : '';
    kind.addEventListener('change', () => void this.reload());
    const since = input('journal-since', { type: 'datetime-local', title: 'from' });
    const until = input('journal-until', { type: 'datetime-local', title: 'until' });
    this.inputs = { alarm, kind, since, until };
    const filters = document.createElement('div');
    filters.className = 'journal-filters';
    filters.append(alarm, kind, since, until);
    this.list = document.createElement('ul');
    this.list.className = 'journal-list';
    this.noteEl = document.createElement('div');
    this.noteEl.className = 'journal-note';
    this.more = document.createElement('button');
    this.more.type = 'button';
    this.more.className = 'journal-more';
    this.more.textContent = 'Older';
    this.more.addEventListener('click', () => void this.older());
    const el = document.createElement('div');
    el.className = 'alarm-journal';
    const scroll = document.createElement('div');
    scroll.className = 'journal-scroll';
    scroll.append(this.noteEl, this.list, this.more);
    el.append(filters, scroll);
    this.el = el;
    this.place();
    layer.appendChild(el);
    live.add(this);
    void this.reload();
    this.timer = setInterval(() => this.soon(), PERIOD_MS);
  }

  override attached(): boolean {
    return this.el !== null;
  }

  override detach(): void {
    live.delete(this);
    if (this.timer !== null) clearInterval(this.timer);
    if (this.settle !== null) clearTimeout(this.settle);
    this.timer = this.settle = null;
    this.el?.remove();
    this.el = this.list = this.more = this.noteEl = this.inputs = null;
  }

  override layout(): void {
    super.layout();
    if (this.el) this.place();
  }

  private place(): void {
    const b = this.body;
    const el = this.el!;
    el.style.left = `${b.x}px`;
    el.style.top = `${b.y}px`;
    el.style.width = `${b.w}px`;
    el.style.height = `${b.h}px`;
  }

  /** The filters as a query (without a cursor). */
  private query(): JournalQuery {
    const i = this.inputs;
    const time = (v: string | undefined) => {
      const t = v ? new Date(v).getTime() : NaN;
      return Number.isFinite(t) ? t : undefined;
    };
    const limit = Math.max(1, Math.min(1000, Math.floor(optNum(this.spec.options.limit) ?? PAGE)));
    return { alarm: i?.alarm.value.trim() || undefined, sinceMs: time(i?.since.value), untilMs: time(i?.until.value), limit };
  }

  private kindFilter(): string {
    return this.inputs?.kind.value ?? '';
  }

  private soon(): void {
    if (this.settle !== null) return;
    this.settle = setTimeout(() => {
      this.settle = null;
      void this.refresh();
    }, SETTLE_MS);
  }

  /** Reads from the newest entry with the current filters, replacing the list. */
  async reload(): Promise<void> {
    const gen = ++this.generation;
    try {
      const { rows, next } = await this.pages(this.query(), undefined);
      if (gen !== this.generation) return;
      this.rows = rows;
      this.next = next;
      this.note = rows.length === 0 ? 'no entries' : '';
    } catch (e) {
      if (gen !== this.generation) return;
      this.rows = [];
      this.next = null;
      this.note = `alarm journal: ${(e as Error).message ?? String(e)}`;
    }
    this.draw();
  }

  /** Reads the newest entries again and puts those not shown yet on top (pages already read
   * stay). */
  private async refresh(): Promise<void> {
    if (this.rows.length === 0 || this.note) return this.reload();
    const gen = this.generation;
    try {
      const { rows } = await this.pages(this.query(), undefined);
      if (gen !== this.generation) return;
      const known = new Set(this.rows.map((r) => r.cursor));
      const fresh = rows.filter((r) => !known.has(r.cursor));
      if (fresh.length === 0) return;
      this.rows = [...fresh, ...this.rows];
      this.draw();
    } catch {
      /* the next transition or period reads again */
    }
  }

  /** The next page of older entries. */
  private async older(): Promise<void> {
    if (!this.next) return;
    const gen = this.generation;
    try {
      const { rows, next } = await this.pages(this.query(), this.next);
      if (gen !== this.generation) return;
      this.rows = [...this.rows, ...rows];
      this.next = next;
      this.draw();
    } catch (e) {
      this.note = `alarm journal: ${(e as Error).message ?? String(e)}`;
      this.draw();
    }
  }

  /** A page from `cursor` with the kind filter applied; a filter that leaves little of a page
   * reads a few more pages. */
  private async pages(q: JournalQuery, cursor: string | undefined): Promise<{ rows: AlarmJournalEntry[]; next: string | null }> {
    const kind = this.kindFilter();
    const rows: AlarmJournalEntry[] = [];
    let next: string | null = cursor ?? null;
    for (let i = 0; i < MOST_PAGES; i++) {
      const page = await AlarmJournalWidget.read({ ...q, cursor: next ?? undefined });
      rows.push(...(kind ? page.entries.filter((e) => e.kind === kind) : page.entries));
      next = page.next;
      if (!kind || !next || rows.length >= (q.limit ?? PAGE) / 2) break;
    }
    return { rows, next };
  }

  private draw(): void {
    const list = this.list;
    if (!list || !this.noteEl || !this.more) return;
    this.noteEl.textContent = this.note;
    this.noteEl.hidden = this.note === '';
    this.more.hidden = this.next === null;
    list.replaceChildren(
      ...this.rows.map((e) => {
        const li = document.createElement('li');
        li.dataset.kind = e.kind;
        li.dataset.alarm = e.alarm;
        const cell = (className: string, text: string) => {
          const s = document.createElement('span');
          s.className = className;
          s.textContent = text;
          return s;
        };
        const comment = e.comment ? `“${e.comment}”` : '';
        li.append(
          cell('t', formatTime(e.t)),
          cell('alarm', e.alarm),
          cell('kind', e.kind),
          cell('state', e.state ?? ''),
          cell('val', e.value === undefined || e.value === null ? '' : format(e.value, null)),
          cell('user', e.user ?? ''),
          cell('comment', comment),
        );
        li.title = [new Date(e.t).toISOString(), e.alarm, e.kind, e.severity ?? '', e.priority ?? '', e.user ?? '', e.comment ?? ''].filter(Boolean).join(' · ');
        return li;
      }),
    );
  }

  /** The entries shown, for tests. */
  shown(): AlarmJournalEntry[] {
    return this.rows;
  }
}
