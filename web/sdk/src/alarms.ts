// The server's alarms as a client sees them (docs/alarms.md): the state object published on
// `alarm:{id}` and `alarm:all` (and answered by `GET /api/alarms` and the alarm commands, which
// `Client.request` sends: `alarm_ack`, `alarm_shelve`, `alarm_unshelve`), a journal entry, and
// `AlarmBook`, which keeps one state per alarm from both sources.

/** ISA-18.2 states of an alarm. */
export type AlarmStateName = 'normal' | 'active_unacked' | 'active_acked' | 'rtn_unacked' | 'shelved' | 'out_of_service';

export type AlarmSeverity = 'hi' | 'hihi' | 'lo' | 'lolo' | 'bad' | 'stale';

export type AlarmPriority = 'low' | 'medium' | 'high' | 'critical';

/** One alarm's state. `seq` counts its transitions: of two states, the higher `seq` is newer. */
export interface AlarmState {
  id: string;
  /** The definition's id (a pattern's instances share it). */
  def: string;
  channel: string;
  state: AlarmStateName;
  /** Whether the condition holds now (a shelved alarm follows its condition silently). */
  active: boolean;
  severity: AlarmSeverity | null;
  priority: AlarmPriority;
  /** The value that caused the latest change. */
  value: unknown;
  /** When the state last changed, unix ms. */
  since: number;
  message: string;
  /** Who acknowledged: `user:ana`, `key:…`, `hook:…` or `anonymous`. */
  acked_by: string | null;
  acked_at: number | null;
  comment: string | null;
  shelved_until: number | null;
  seq: number;
  /** Its definition was removed: this last state is published once, and screens drop it. */
  removed?: boolean;
}

/** Kinds of journal entries. */
export type AlarmJournalKind =
  | 'raised'
  | 'worsened'
  | 'improved'
  | 'returned'
  | 'cleared'
  | 'acked'
  | 'shelved'
  | 'unshelved'
  | 'out_of_service'
  | 'in_service'
  | 'defined'
  | 'redefined'
  | 'removed';

export const ALARM_JOURNAL_KINDS: readonly AlarmJournalKind[] = [
  'raised',
  'worsened',
  'improved',
  'returned',
  'cleared',
  'acked',
  'shelved',
  'unshelved',
  'out_of_service',
  'in_service',
  'defined',
  'redefined',
  'removed',
];

/** One transition in the journal (`GET /api/alarms/journal`), newest first. */
export interface AlarmJournalEntry {
  cursor: string;
  t: number;
  alarm: string;
  kind: AlarmJournalKind;
  state: AlarmStateName | null;
  severity: AlarmSeverity | null;
  priority: AlarmPriority | null;
  value: unknown;
  /** Who caused it; null for the node's own transitions (a value, a shelf running out). */
  user: string | null;
  comment: string | null;
}

/** The channel every alarm's transitions are published on. */
export const ALARMS_CHANNEL = 'alarm:all';

const PRIORITY_RANK: Record<string, number> = { critical: 0, high: 1, medium: 2, low: 3 };

/** Where a state sorts: unacknowledged before acknowledged, active before returned; then
 * shelved and out-of-service alarms, normal last. */
function stateRank(s: AlarmStateName): number {
  switch (s) {
    case 'active_unacked':
      return 0;
    case 'rtn_unacked':
      return 1;
    case 'active_acked':
      return 2;
    case 'shelved':
      return 3;
    case 'out_of_service':
      return 4;
    default:
      return 5;
  }
}

/** The server's order of alarm lists, worst first: unacknowledged before acknowledged, active
 * before returned, then priority (`critical` first), then the newest `since`. */
export function compareAlarms(a: AlarmState, b: AlarmState): number {
  return (
    stateRank(a.state) - stateRank(b.state) ||
    (PRIORITY_RANK[a.priority] ?? 9) - (PRIORITY_RANK[b.priority] ?? 9) ||
    b.since - a.since ||
    (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)
  );
}

/** Whether an operator has something to do or see about the alarm (not `normal`). */
export function needsAttention(a: AlarmState): boolean {
  return a.state !== 'normal';
}

/**
 * One state per alarm, from the `alarm:all` channel and `GET /api/alarms` in whatever order
 * they arrive: of two states of an alarm the one with the higher `seq` is kept. Subscribe to
 * `alarm:all` first, then read the list, so no transition falls between the two. A state
 * marked `removed` (its definition is gone) is kept as a tombstone, so an older state read
 * later does not bring the alarm back, and left out of `list` and `get`.
 */
export class AlarmBook {
  private readonly byId = new Map<string, AlarmState>();

  /** Takes a state; returns whether it was newer than the one held. */
  apply(s: AlarmState): boolean {
    if (!isAlarmState(s)) return false;
    const held = this.byId.get(s.id);
    if (held && held.seq >= s.seq) return false;
    this.byId.set(s.id, s);
    return true;
  }

  /** Takes a list (a `GET /api/alarms` answer); returns whether any state was newer. */
  applyAll(list: AlarmState[]): boolean {
    let changed = false;
    for (const s of list) changed = this.apply(s) || changed;
    return changed;
  }

  get(id: string): AlarmState | undefined {
    const s = this.byId.get(id);
    return s?.removed ? undefined : s;
  }

  /** Every alarm held, worst first (`compareAlarms`). */
  list(): AlarmState[] {
    return [...this.byId.values()].filter((s) => !s.removed).sort(compareAlarms);
  }

  /** How many alarms are held (removed ones left out). */
  get size(): number {
    let n = 0;
    for (const s of this.byId.values()) if (!s.removed) n++;
    return n;
  }
}

/** Whether `v` has the shape of an alarm state object (an `alarm:` publication's data). */
export function isAlarmState(v: unknown): v is AlarmState {
  if (!v || typeof v !== 'object') return false;
  const o = v as Record<string, unknown>;
  return typeof o.id === 'string' && typeof o.state === 'string' && typeof o.seq === 'number';
}
