// The dashboard application: loads and saves dashboards, keeps the SDK subscribed to exactly
// the channels on the board, and switches between run mode (the board alone) and edit mode
// (the board with widget boxes, plus the side panel).

import { ALARMS_CHANNEL, Client, type Subscription, type TrendReply } from 'switchboard-sdk';
import { Api, type DashboardSummary } from './api.js';
import { Board } from './board.js';
import { AlarmList } from './alarms.js';
import { ChannelBrowser } from './channels.js';
import { h } from './dom.js';
import { Login } from './login.js';
import { WidgetForm } from './editor.js';
import { DEFAULT_SIZE, ID_PATTERN, parseDashboard, WIDGET_TYPES, type DashboardSpec, type WidgetType } from './model.js';
import type { Widget } from './widgets/index.js';
import { ControlWidget, type LastWrite } from './widgets/control.js';
import { WritesWidget } from './widgets/writes.js';
import { AlarmJournalWidget } from './widgets/journal.js';
import { TrendWidget, trendStep } from './widgets/trend.js';

/** One entry of the event log the page keeps for tests and troubleshooting. */
export type LogEntry =
  | { type: 'pub'; channel: string; offset: number }
  | { type: 'gap'; channel: string; from: { epoch: string; offset: number }; to: { epoch: string; offset: number }; epochChanged: boolean }
  | { type: 'connected'; client: string; reconnects: number }
  | { type: 'disconnected'; code: number; reason: string }
  | { type: 'subscribeError'; channel: string; code: number; message: string };

const LOG_SIZE = 5000;
/** Longest wait for a fresh board's values before drawing it anyway, ms. */
const FIRST_PAINT_HOLD_MS = 400;

export class App {
  readonly client: Client;
  readonly board: Board;
  private readonly login = new Login((authorization) => Api.check('', authorization));
  private readonly api = new Api('', () => this.login.authorization());
  private readonly subs = new Map<string, Subscription>();
  private readonly log: LogEntry[] = [];
  private dashboard: DashboardSpec = { title: 'Untitled', widgets: [] };
  private id = '';
  private editing = false;
  private deleteArmed = false;

  private readonly bar: HTMLElement;
  private readonly side: HTMLElement;
  private readonly titleView: HTMLElement;
  private readonly conn: HTMLElement;
  private readonly who: HTMLElement;
  private readonly signOut: HTMLButtonElement;
  private readonly status: HTMLElement;
  private readonly picker: HTMLSelectElement;
  private readonly editButton: HTMLButtonElement;
  private readonly idInput: HTMLInputElement;
  private readonly titleInput: HTMLInputElement;
  private readonly form: WidgetForm;
  private readonly browser: ChannelBrowser;
  private readonly alarms: AlarmList;
  private readonly datalist: HTMLDataListElement;

  constructor(root: HTMLElement) {
    this.titleView = h('h1', { id: 'title-view' });
    this.conn = h('span', { className: 'conn', id: 'conn', textContent: 'connecting…' });
    this.picker = h('select', { id: 'dashboard-picker', title: 'open a saved dashboard' });
    this.editButton = h('button', { type: 'button', id: 'edit-toggle', textContent: 'Edit' });
    this.status = h('span', { className: 'status', id: 'status' });
    this.who = h('span', { className: 'who', id: 'who' });
    this.signOut = h('button', { type: 'button', id: 'sign-out', className: 'hidden', textContent: 'Sign out' });
    this.signOut.addEventListener('click', () => {
      this.login.signOut();
      location.reload();
    });
    this.bar = h('header', { className: 'bar' }, [
      h('span', { className: 'brand', textContent: 'Switchboard' }),
      this.picker,
      this.titleView,
      this.status,
      this.conn,
      this.who,
      this.signOut,
      this.editButton,
    ]);

    this.datalist = h('datalist', { id: 'channel-names' });
    this.idInput = h('input', { id: 'dashboard-id', placeholder: 'id (A-Z a-z 0-9 _ -)', autocomplete: 'off' });
    this.titleInput = h('input', { id: 'dashboard-title', placeholder: 'title', autocomplete: 'off' });
    const button = (id: string, text: string, f: () => void) => {
      const b = h('button', { type: 'button', id, textContent: text });
      b.addEventListener('click', f);
      return b;
    };
    const importInput = h('input', { type: 'file', accept: '.json,application/json', id: 'import-file', className: 'hidden' });
    importInput.addEventListener('change', () => void this.importFile(importInput));
    const dashSection = h('section', { className: 'panel-section' }, [
      h('h2', { textContent: 'Dashboard' }),
      h('label', {}, [h('span', { textContent: 'Id' }), this.idInput]),
      h('label', {}, [h('span', { textContent: 'Title' }), this.titleInput]),
      h('div', { className: 'row wrap' }, [
        button('save', 'Save', () => void this.save()),
        button('new', 'New', () => this.newDashboard()),
        button('export', 'Export', () => this.exportJson()),
        button('import', 'Import', () => importInput.click()),
        button('delete', 'Delete', () => void this.remove()),
        importInput,
      ]),
    ]);
    const addSection = h('section', { className: 'panel-section' }, [
      h('h2', { textContent: 'Add widget' }),
      h(
        'div',
        { className: 'row wrap' },
        WIDGET_TYPES.map((t) => button(`add-${t}`, t, () => this.addWidget(t))),
      ),
    ]);
    this.form = new WidgetForm(this.datalist);
    this.browser = new ChannelBrowser(this.api);
    this.side = h('aside', { className: 'side', id: 'side' }, [dashSection, addSection, this.form.el, this.browser.el, this.datalist]);

    const main = h('main', { className: 'main' }, [this.side]);
    // Operators act on alarms as themselves: the commands go on the page's own connection.
    const comment = (c: string) => (c ? { comment: c } : {});
    this.alarms = new AlarmList({
      ack: (alarm, c) => this.client.request('alarm_ack', { alarm, ...comment(c) }),
      shelve: (alarm, forS, c) => this.client.request('alarm_shelve', { alarm, for_s: forS, ...comment(c) }),
      unshelve: (alarm, c) => this.client.request('alarm_unshelve', { alarm, ...comment(c) }),
    });
    root.append(this.bar, this.alarms.el, main, this.login.el);
    this.board = new Board(main);
    // The board's frame drives the SDK's delivery: one pass per animation frame for both.
    this.client = new Client({
      url: location.origin,
      name: 'switchboard-dashboard',
      schedule: this.board.scheduler,
      // Asked again before each reconnect, so credentials entered in the sign-in form since
      // are used.
      getToken: () => this.login.bearer(),
      credentials: () => this.login.basic() ?? { user: '', password: '' },
    });

    ControlWidget.publish = (channel, data) => this.client.publish(channel, data);
    ControlWidget.who = () => this.login.who();
    WritesWidget.read = (limit) => this.api.writes(limit);
    AlarmJournalWidget.read = (q) => this.api.alarmJournal(q);
    this.alarms.onChange = (byChannel) => this.board.showAlarms(byChannel);
    TrendWidget.fetchTrend = (channel, windowS, stepS, untilMs) => this.api.trend(channel, windowS, stepS, untilMs);
    this.titleInput.addEventListener('input', () => {
      this.dashboard.title = this.titleInput.value;
      this.titleView.textContent = this.dashboard.title;
    });
    this.editButton.addEventListener('click', () => this.setEditing(!this.editing));
    this.picker.addEventListener('change', () => {
      if (this.picker.value) void this.open(this.picker.value, this.editing);
    });
    this.board.onChannels = (chs) => this.syncSubscriptions(chs);
    this.board.onSelect = (w) => this.form.show(w);
    this.board.onEdit = () => this.form.refresh();
    this.form.onChange = (w) => {
      const now = this.board.changed(w);
      this.form.retarget(now);
    };
    this.form.onRemove = (w) => this.board.remove(w);
    this.browser.onPick = (ch) => void this.pick(ch);
    window.addEventListener('keydown', (e) => {
      const t = e.target as HTMLElement;
      if (this.editing && e.key === 'Delete' && this.board.selection && !['INPUT', 'SELECT', 'TEXTAREA'].includes(t.tagName)) {
        this.board.remove(this.board.selection);
      }
    });

    this.wireClient();
  }

  private wireClient(): void {
    const c = this.client;
    c.on('frame', (batch) => {
      this.board.applyBatch(batch);
      for (const p of batch.publications) if (!p.channel.startsWith('pt:')) this.record({ type: 'pub', channel: p.channel, offset: p.offset });
    });
    c.on('state', ({ state }) => {
      this.conn.textContent = state;
      this.conn.dataset.state = state;
    });
    c.on('connected', (e) => {
      if (e.reconnects === 0) performance.mark('sb:connected');
      this.record({ type: 'connected', client: e.client, reconnects: e.reconnects });
    });
    c.on('disconnected', (e) => {
      this.record({ type: 'disconnected', code: e.code, reason: e.reason });
      // Refused or expired credentials: sign in again, then reconnect (subscriptions resume
      // from their positions).
      if (e.code === 4001) void this.signIn(`signed out: ${e.reason}`).then(() => this.client.connect().catch(() => {}));
    });
    c.on('gap', (g) => this.record({ type: 'gap', channel: g.channel, from: g.from, to: g.to, epochChanged: g.epochChanged }));
    c.on('subscribeError', (e) =>
      this.record({ type: 'subscribeError', channel: e.channel, code: e.error.code, message: e.error.message }),
    );
  }

  private record(e: LogEntry): void {
    this.log.push(e);
    if (this.log.length > LOG_SIZE) this.log.splice(0, this.log.length - LOG_SIZE);
  }

  /** The event log (a copy). */
  events(): LogEntry[] {
    return this.log.slice();
  }

  /** Starts the page: the dashboard named in the URL in run mode, else a new one in edit mode. */
  async start(): Promise<void> {
    const params = new URLSearchParams(location.search);
    const id = params.get('dashboard');
    // The dashboard is read while the credentials are checked (one round trip, not two). The
    // empty board is drawn meanwhile: its first 4K frame (the canvas's first upload, a costly
    // one) is done while the network is waited for.
    let reading = id ? this.api.load(id) : null;
    reading?.catch(() => {});
    // A server that wants credentials says so on any API call (401); sign in first. The
    // connection is opened meanwhile (most pages need no sign-in); a refused one is closed by
    // the sign-in and opened again after it.
    const checking = Api.check('', this.login.authorization() ?? '').catch(() => null);
    this.client.connect().catch(() => {});
    const refused = await checking;
    if (refused !== null) {
      await this.signIn(this.login.signedIn() ? refused : '');
      reading = null;
      this.client.connect().catch(() => {});
    }
    this.showWho();
    this.watchAlarms();
    // Values not updated within their widget's `stale_s` turn stale (and their age ticks);
    // widgets with an unacknowledged alarm blink; the alarm list's ages follow.
    setInterval(() => {
      const now = Date.now();
      this.board.tick(now);
      this.alarms.tick(now);
    }, 500);
    void this.refreshPicker();
    if (id) await this.open(id, params.get('edit') === '1', reading);
    else {
      this.newDashboard();
      this.setEditing(true);
    }
  }

  /**
   * Keeps the alarm list on the server's state: `alarm:all` is subscribed first, then the
   * list read (again after every reconnect, when transitions may have been missed); the
   * list keeps per alarm the state with the higher `seq`, whichever arrives first.
   */
  private watchAlarms(): void {
    const sub = this.client.subscribe(ALARMS_CHANNEL);
    sub.on('publication', (p) => {
      this.alarms.apply(p.data);
      AlarmJournalWidget.notify();
    });
    sub.on('subscribed', () => {
      this.api.alarms().then(
        (list) => this.alarms.applyAll(list),
        (e: Error) => this.alarms.unavailable(`alarms: ${e.message}`),
      );
    });
    sub.on('error', (e) => this.alarms.unavailable(`alarms: ${e.message}`));
  }

  /** Shows the sign-in form until the server accepts what is entered (one form at a time). */
  private signingIn: Promise<void> | null = null;
  private signIn(why: string): Promise<void> {
    if (!this.signingIn) {
      this.client.close();
      this.signingIn = this.login.ask(why).then(() => {
        this.signingIn = null;
        this.showWho();
      });
    }
    return this.signingIn;
  }

  private showWho(): void {
    this.who.textContent = this.login.who();
    this.signOut.classList.toggle('hidden', !this.login.signedIn());
  }

  /** Opens dashboard `id` (already being read: `reading`). */
  async open(id: string, edit: boolean, reading: Promise<unknown> | null = null): Promise<void> {
    try {
      const d = await (reading ?? this.api.load(id));
      performance.mark('sb:dashboard-read');
      this.load(id, parseDashboard(d));
      performance.mark('sb:board-set');
      this.say('');
    } catch (e) {
      this.say(`cannot open ${id}: ${(e as Error).message}`, true);
      this.load(id, { title: id, widgets: [] });
    }
    this.setEditing(edit);
    this.syncUrl();
  }

  private load(id: string, d: DashboardSpec): void {
    this.id = id;
    this.dashboard = { title: d.title, widgets: d.widgets };
    this.idInput.value = id;
    this.titleInput.value = d.title;
    this.titleView.textContent = d.title;
    document.title = `${d.title} · Switchboard`;
    this.board.setWidgets(this.dashboard.widgets);
    this.picker.value = id;
  }

  private newDashboard(): void {
    const id = `dashboard-${Math.random().toString(36).slice(2, 7)}`;
    this.load(id, { title: 'Untitled', widgets: [] });
    this.picker.value = '';
    if (this.editing) this.idInput.focus();
  }

  setEditing(on: boolean): void {
    this.editing = on;
    document.body.classList.toggle('editing', on);
    this.editButton.textContent = on ? 'Run' : 'Edit';
    this.board.setEditing(on);
    if (on) void this.browser.load().then(() => this.fillDatalist());
    this.syncUrl();
  }

  private syncUrl(): void {
    if (!this.id) return;
    const q = new URLSearchParams({ dashboard: this.id });
    if (this.editing) q.set('edit', '1');
    history.replaceState(null, '', `?${q}`);
  }

  private fillDatalist(): void {
    this.datalist.replaceChildren(...this.browser.names().slice(0, 5000).map((n) => h('option', { value: n })));
  }

  private async refreshPicker(): Promise<void> {
    let list: DashboardSummary[] = [];
    try {
      list = await this.api.dashboards();
    } catch {
      /* the list is a convenience */
    }
    this.picker.replaceChildren(
      h('option', { value: '', textContent: 'Open dashboard…' }),
      ...list.map((d) => h('option', { value: d.id, textContent: `${d.title || d.id} (${d.widget_count})` })),
    );
    this.picker.value = list.some((d) => d.id === this.id) ? this.id : '';
  }

  /** Subscribes to channels new on the board and drops the ones no widget shows anymore. */
  private syncSubscriptions(channels: string[]): void {
    const want = new Set(channels);
    const drop: string[] = [];
    for (const ch of this.subs.keys()) if (!want.has(ch)) drop.push(ch);
    for (const ch of drop) {
      this.subs.get(ch)!.unsubscribe();
      this.subs.delete(ch);
    }
    const add = channels.filter((ch) => !this.subs.has(ch));
    if (add.length === 0) {
      this.board.releasePaint();
      return;
    }
    // Point channels shown by trends are subscribed with the `trend` option: the trend of the
    // widest window (at the resolution of its widest plot) comes in the subscribe reply, in
    // one round trip for all of them, and live values continue it without a gap. One
    // subscribe per window and step.
    const fresh = new Set(add);
    const widest = new Map<string, { win: number; px: number }>();
    for (const w of this.board.widgets) {
      const ch = w.spec.channel;
      if (!(w instanceof TrendWidget) || !fresh.has(ch) || !ch.startsWith('pt:')) continue;
      const was = widest.get(ch) ?? { win: 0, px: 0 };
      widest.set(ch, { win: Math.max(was.win, w.windowS()), px: Math.max(was.px, w.spec.w * this.board.cell) });
    }
    const groups = new Map<string, string[]>();
    for (const [ch, { win, px }] of widest) {
      const key = `${win}:${trendStep(win, px)}`;
      const group = groups.get(key);
      if (group) group.push(ch);
      else groups.set(key, [ch]);
    }
    for (const [key, chs] of groups) {
      const [win, step] = key.split(':').map(Number);
      const subs = this.client.subscribeMany(chs, { trend: { windowS: win, stepS: step } });
      chs.forEach((ch, i) => {
        this.subs.set(ch, subs[i]);
        subs[i].on('subscribed', (ev) => {
          if (ev.trend) this.backfill(ch, ev.trend);
        });
      });
    }
    const rest = add.filter((ch) => !widest.has(ch));
    const subs = this.client.subscribeMany(rest);
    rest.forEach((ch, i) => this.subs.set(ch, subs[i]));
    // A board opened on a fresh set of channels is first drawn when their values are in (or
    // after a moment), not as empty panels first.
    const opening = this.subs.size === add.length;
    if (opening) this.board.holdPaint(FIRST_PAINT_HOLD_MS);
    let waiting = add.length;
    performance.mark('sb:subscribe-sent');
    for (const ch of add) {
      const off = this.subs.get(ch)!.on('subscribed', () => {
        off();
        if (--waiting > 0) return;
        performance.mark('sb:subscribed');
        if (opening) this.board.releasePaint();
      });
    }
    void this.backfillOverHttp(new Set(rest));
  }

  private backfill(channel: string, trend: TrendReply): void {
    for (const w of this.board.widgets) if (w instanceof TrendWidget && w.spec.channel === channel) w.backfill(trend);
    this.board.request();
  }

  /** Trends of other channels (namespaces configured with a trend) ask the HTTP API. */
  private async backfillOverHttp(channels: Set<string>): Promise<void> {
    const trends = this.board.widgets.filter((w): w is TrendWidget => w instanceof TrendWidget && channels.has(w.spec.channel));
    await Promise.all(
      trends.map(async (w) => {
        try {
          const win = w.windowS();
          w.backfill(await this.api.trend(w.spec.channel, win, trendStep(win, w.spec.w * this.board.cell)));
          this.board.request();
        } catch {
          /* a channel without a trend (or not yet published) fills live */
        }
      }),
    );
  }

  private addWidget(type: WidgetType, channel = ''): Widget {
    const size = DEFAULT_SIZE[type];
    const at = this.board.freeSpot(size.w, size.h);
    return this.board.add({ type, channel, x: at.x, y: at.y, w: size.w, h: size.h, options: {} });
  }

  /** A channel picked in the browser: bind the selected widget, or add a fitting one. */
  private async pick(channel: string): Promise<void> {
    const sel = this.board.selection;
    if (sel) {
      sel.spec.channel = channel;
      this.form.retarget(this.board.changed(sel));
      this.form.show(this.board.selection);
      return;
    }
    let type: WidgetType = 'value';
    try {
      const v = await this.api.lastValue(channel);
      const x = v && typeof v === 'object' && !Array.isArray(v) && 'v' in v ? (v as { v: unknown }).v : v;
      if (Array.isArray(x)) type = 'spectrum';
      else if (typeof x === 'boolean') type = 'led';
    } catch {
      /* a value widget then */
    }
    this.addWidget(type, channel);
  }

  private async save(): Promise<void> {
    const id = this.idInput.value.trim();
    if (!ID_PATTERN.test(id)) {
      this.say('the id must be 1-64 characters of A-Z a-z 0-9 _ -', true);
      return;
    }
    this.dashboard.title = this.titleInput.value;
    this.dashboard.widgets = this.board.widgets.map((w) => w.spec);
    try {
      await this.api.save(id, this.dashboard);
      this.id = id;
      this.say(`saved ${id}`);
      this.syncUrl();
      await this.refreshPicker();
    } catch (e) {
      this.say(`not saved: ${(e as Error).message}`, true);
    }
  }

  private async remove(): Promise<void> {
    if (!this.deleteArmed) {
      this.deleteArmed = true;
      this.say(`press Delete again to delete ${this.id}`);
      setTimeout(() => (this.deleteArmed = false), 4000);
      return;
    }
    this.deleteArmed = false;
    try {
      await this.api.remove(this.id);
      this.say(`deleted ${this.id}`);
      this.newDashboard();
      await this.refreshPicker();
    } catch (e) {
      this.say(`not deleted: ${(e as Error).message}`, true);
    }
  }

  private exportJson(): void {
    const d = { id: this.idInput.value.trim() || this.id, title: this.titleInput.value, widgets: this.board.widgets.map((w) => w.spec) };
    const blob = new Blob([JSON.stringify(d, null, 2)], { type: 'application/json' });
    const a = h('a', { href: URL.createObjectURL(blob), download: `${d.id}.json` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
  }

  private async importFile(input: HTMLInputElement): Promise<void> {
    const file = input.files?.[0];
    input.value = '';
    if (!file) return;
    try {
      const d = parseDashboard(JSON.parse(await file.text()));
      const id = d.id && ID_PATTERN.test(d.id) ? d.id : this.id;
      this.load(id, d);
      this.say(`imported ${file.name}: save to keep it`);
    } catch (e) {
      this.say(`cannot import ${file.name}: ${(e as Error).message}`, true);
    }
  }

  private say(text: string, error = false): void {
    this.status.textContent = text;
    this.status.classList.toggle('error', error);
  }

  /** The latest publication each widget applied (tests). */
  widgetState(
    i: number,
  ): {
    type: string;
    channel: string;
    hasValue: boolean;
    offset: number;
    text: string;
    points?: number;
    view?: { windowS: number; paused: boolean; zoom: [number, number] | null };
    detail?: { stepS: number; points: number } | null;
    error?: string;
    lastWrite?: LastWrite | null;
    staleFor: number | null;
    alarm: string | null;
    serverAlarm: { severity: string; unacked: boolean } | null;
  } | null {
    const w = this.board.widgets[i];
    if (!w) return null;
    const points = w instanceof TrendWidget ? w.points() : undefined;
    const view = w instanceof TrendWidget ? w.viewState() : undefined;
    const detail = w instanceof TrendWidget ? w.zoomDetail() : undefined;
    const error = w instanceof ControlWidget ? w.errorText() : undefined;
    const lastWrite = w instanceof ControlWidget ? w.lastWrite() : undefined;
    const s = { type: w.spec.type, channel: w.spec.channel, hasValue: w.hasValue, offset: w.offset, text: w.describe() };
    return { ...s, points, view, detail, error, lastWrite, staleFor: w.staleFor, alarm: w.alarm, serverAlarm: w.serverAlarm };
  }
}
