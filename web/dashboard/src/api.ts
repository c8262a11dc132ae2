// The server's HTTP API as the dashboard uses it.

import type { AlarmJournalEntry, AlarmState, TrendReply } from 'switchboard-sdk';
import type { DashboardSpec } from './model.js';
import type { AuditedWrite } from './widgets/writes.js';

export interface ChannelInfo {
  channel: string;
  subscribers: number;
  offset: number;
  epoch: string;
}

/** One page of `GET /api/channels`. */
export interface ChannelPage {
  channels: ChannelInfo[];
  /** The cursor of the next page, or null after the last. */
  next: string | null;
}

/** Filters of `GET /api/alarms/journal`; every one optional. */
export interface JournalQuery {
  /** An alarm id, or a definition id (its instances too). */
  alarm?: string;
  sinceMs?: number;
  untilMs?: number;
  /** 1–1,000 (the server's default 100). */
  limit?: number;
  /** The `next` of the previous page: older entries. */
  cursor?: string;
}

/** One page of the journal, newest first; `next` continues with older entries, null after the last. */
export interface JournalPage {
  entries: AlarmJournalEntry[];
  next: string | null;
}

export interface DashboardSummary {
  id: string;
  title: string;
  widget_count: number;
  updated: number;
}

async function json<T>(r: Response): Promise<T> {
  if (!r.ok) {
    let message = `${r.status} ${r.statusText}`;
    try {
      const body = (await r.json()) as { error?: { message?: string } };
      if (body.error?.message) message = body.error.message;
    } catch {
      /* not JSON */
    }
    throw new Error(message);
  }
  return (await r.json()) as T;
}

export class Api {
  /** `authorization`: the `Authorization` header value when signed in (Bearer or Basic). */
  constructor(
    private readonly base = '',
    private readonly authorization: () => string | null = () => null,
  ) {}

  /**
   * Whether the server accepts `authorization` ('' for none): null when it does, else the
   * server's reason (a 401 or 429 of `GET /api/info`).
   */
  static async check(base: string, authorization: string): Promise<string | null> {
    const r = await fetch(`${base}/api/info`, authorization ? { headers: { authorization } } : {});
    if (r.ok) return null;
    try {
      await json(r);
    } catch (e) {
      return (e as Error).message;
    }
    return `${r.status}`;
  }

  private fetch(path: string, init: RequestInit = {}): Promise<Response> {
    const a = this.authorization();
    const headers = new Headers(init.headers);
    if (a) headers.set('authorization', a);
    return fetch(`${this.base}${path}`, { ...init, headers });
  }

  /** One page of the channels whose names start with `prefix` (the server's limit is 10,000). */
  async channels(prefix = '', limit = 200, cursor: string | null = null): Promise<ChannelPage> {
    const q = new URLSearchParams({ prefix, limit: String(limit) });
    if (cursor) q.set('cursor', cursor);
    return json(await this.fetch(`/api/channels?${q}`));
  }

  /** The channel's trend over the `windowS` seconds before `untilMs` (unix ms; now when
   * omitted) (`GET /api/channels/{ch}/trend`). */
  async trend(channel: string, windowS: number, stepS = 1, untilMs?: number): Promise<TrendReply> {
    const until = untilMs === undefined ? '' : `&until_ms=${Math.floor(untilMs)}`;
    return json(await this.fetch(`/api/channels/${encodeURIComponent(channel)}/trend?window_s=${windowS}&step_s=${stepS}${until}`));
  }

  /** The channel's latest publication's data, or undefined. */
  async lastValue(channel: string): Promise<unknown> {
    const r = await json<{ last?: { data: unknown } | null }>(
      await this.fetch(`/api/channels/${encodeURIComponent(channel)}`),
    );
    return r.last?.data;
  }

  /** The node's latest writes to devices, newest first (`GET /api/writes`, an API key's view). */
  async writes(limit = 20): Promise<AuditedWrite[]> {
    return (await json<{ writes: AuditedWrite[] }>(await this.fetch(`/api/writes?limit=${limit}`))).writes;
  }

  /** Every alarm's state, worst first (`GET /api/alarms`). */
  async alarms(): Promise<AlarmState[]> {
    return (await json<{ alarms: AlarmState[] }>(await this.fetch('/api/alarms'))).alarms;
  }

  /** One page of the alarm journal (`GET /api/alarms/journal`). */
  async alarmJournal(q: JournalQuery): Promise<JournalPage> {
    const p = new URLSearchParams();
    if (q.alarm) p.set('alarm', q.alarm);
    if (q.sinceMs !== undefined) p.set('since_ms', String(Math.floor(q.sinceMs)));
    if (q.untilMs !== undefined) p.set('until_ms', String(Math.floor(q.untilMs)));
    if (q.limit !== undefined) p.set('limit', String(q.limit));
    if (q.cursor) p.set('cursor', q.cursor);
    return json(await this.fetch(`/api/alarms/journal?${p}`));
  }

  async dashboards(): Promise<DashboardSummary[]> {
    return json(await this.fetch(`/api/dashboards`));
  }

  async load(id: string): Promise<DashboardSpec> {
    return json(await this.fetch(`/api/dashboards/${encodeURIComponent(id)}`));
  }

  async save(id: string, d: DashboardSpec): Promise<DashboardSummary> {
    return json(
      await this.fetch(`/api/dashboards/${encodeURIComponent(id)}`, {
        method: 'PUT',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ title: d.title, widgets: d.widgets }),
      }),
    );
  }

  async remove(id: string): Promise<void> {
    const r = await this.fetch(`/api/dashboards/${encodeURIComponent(id)}`, { method: 'DELETE' });
    if (!r.ok && r.status !== 404) await json(r);
  }
}
