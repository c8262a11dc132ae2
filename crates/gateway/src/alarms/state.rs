//! One alarm's state machine (ISA-18.2, docs/alarms.md): the condition its values say, the
//! delays before that condition takes effect, and what operators do. Pure: time comes in as
//! arguments, every change goes out as a [`Transition`] for the engine to publish, store and
//! journal.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::def::{AlarmDef, Priority};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Normal,
    ActiveUnacked,
    ActiveAcked,
    RtnUnacked,
    Shelved,
    OutOfService,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Normal => "normal",
            State::ActiveUnacked => "active_unacked",
            State::ActiveAcked => "active_acked",
            State::RtnUnacked => "rtn_unacked",
            State::Shelved => "shelved",
            State::OutOfService => "out_of_service",
        }
    }

    /// Rank in the worst-first order: unacknowledged, then active, then the rest.
    pub fn rank(self) -> u8 {
        match self {
            State::ActiveUnacked => 0,
            State::RtnUnacked => 1,
            State::ActiveAcked => 2,
            State::Shelved => 3,
            State::OutOfService => 4,
            State::Normal => 5,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Hi,
    Hihi,
    Lo,
    Lolo,
    Bad,
    Stale,
}

impl Severity {
    fn rank(self) -> u8 {
        match self {
            Severity::Hi | Severity::Lo => 1,
            Severity::Hihi | Severity::Lolo => 2,
            Severity::Bad | Severity::Stale => 3,
        }
    }
}

/// What happened, as the journal names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Raised,
    Worsened,
    Improved,
    Returned,
    Cleared,
    Acked,
    Shelved,
    Unshelved,
    OutOfService,
    InService,
    Defined,
    Redefined,
    Removed,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Raised => "raised",
            Kind::Worsened => "worsened",
            Kind::Improved => "improved",
            Kind::Returned => "returned",
            Kind::Cleared => "cleared",
            Kind::Acked => "acked",
            Kind::Shelved => "shelved",
            Kind::Unshelved => "unshelved",
            Kind::OutOfService => "out_of_service",
            Kind::InService => "in_service",
            Kind::Defined => "defined",
            Kind::Redefined => "redefined",
            Kind::Removed => "removed",
        }
    }
}

/// An alarm's state as every screen sees it (`alarm:` channels, `GET /api/alarms`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub id: String,
    pub def: String,
    pub channel: String,
    pub state: State,
    /// The condition holds now (while shelved or out of service too).
    pub active: bool,
    pub severity: Option<Severity>,
    pub priority: Priority,
    pub value: Option<f64>,
    pub since: u64,
    pub message: String,
    pub acked_by: Option<String>,
    pub acked_at: Option<u64>,
    pub comment: Option<String>,
    pub shelved_until: Option<u64>,
    pub seq: u64,
    /// The alarm's definition was removed: its last state, which screens drop.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// One change of an alarm, with who made it.
#[derive(Debug, Clone)]
pub struct Transition {
    pub kind: Kind,
    pub status: Status,
    pub user: Option<String>,
    pub comment: Option<String>,
}

/// An operator's action.
#[derive(Debug, Clone)]
pub enum Act {
    Ack,
    Shelve { until_ms: u64 },
    Unshelve,
}

/// A condition waiting for its delay.
#[derive(Debug, Clone, Copy)]
struct Pending {
    cond: Option<Severity>,
    since: u64,
    value: Option<f64>,
}

/// The limits as evaluation reads them, copied from the definition: an absent limit is one
/// no finite value reaches (values are finite, `point::parse_field`).
#[derive(Debug, Clone, Copy)]
struct Limits {
    hihi: f64,
    hi: f64,
    lo: f64,
    lolo: f64,
    deadband: f64,
    bad_quality: bool,
}

impl Limits {
    fn of(def: &AlarmDef) -> Limits {
        Limits {
            hihi: def.hihi.unwrap_or(f64::INFINITY),
            hi: def.hi.unwrap_or(f64::INFINITY),
            lo: def.lo.unwrap_or(f64::NEG_INFINITY),
            lolo: def.lolo.unwrap_or(f64::NEG_INFINITY),
            deadband: def.deadband,
            bad_quality: def.bad_quality,
        }
    }
}

/// One alarm: its definition, its published status and what evaluation needs besides.
///
/// What a value's evaluation reads and writes comes first, in declaration order (`repr(C)`):
/// with 10,000 alarms each publication finds its alarm cold, and these fields then share the
/// cache lines of the alarm's lock instead of reaching into the definition and the status
/// (docs/benchmarks.md, "Alarms").
#[derive(Debug)]
#[repr(C)]
pub struct Alarm {
    limits: Limits,
    /// The condition in effect: `status.severity` while `status.active`.
    current: Option<Severity>,
    /// A value was evaluated since the alarm was made.
    seen: bool,
    /// The definition's `field` is `v`, so the value is read without reaching the definition.
    reads_v: bool,
    /// When the last value came (ms), for `stale_s`.
    last_value_ms: u64,
    pending: Option<Pending>,
    pub def: Arc<AlarmDef>,
    pub status: Status,
}

impl Alarm {
    /// A new alarm in `normal` (or `out_of_service`), or going on from `stored`.
    pub fn new(def: Arc<AlarmDef>, channel: &str, stored: Option<Status>, now: u64) -> Alarm {
        let id = def.alarm_id(channel);
        let mut status = stored.filter(|s| s.id == id).unwrap_or_else(|| Status {
            id,
            def: def.id.clone(),
            channel: channel.to_string(),
            state: State::Normal,
            active: false,
            severity: None,
            priority: def.priority,
            value: None,
            since: now,
            message: String::new(),
            acked_by: None,
            acked_at: None,
            comment: None,
            shelved_until: None,
            seq: 0,
            removed: false,
        });
        status.priority = def.priority;
        status.message = message(&def, status.severity);
        let current = status.active.then_some(status.severity).flatten();
        Alarm {
            limits: Limits::of(&def),
            current,
            seen: false,
            reads_v: def.field == "v",
            last_value_ms: now,
            pending: None,
            def,
            status,
        }
    }

    /// A value of the channel came: `v` the field's number (if it is one), `bad` its quality.
    pub fn on_value(&mut self, v: Option<f64>, bad: bool, now: u64) -> Option<Transition> {
        self.last_value_ms = now;
        self.seen = true;
        let current = self.current;
        let cond = if bad && self.limits.bad_quality {
            Some(Severity::Bad)
        } else if let Some(v) = v {
            level(&self.limits, v, current)
        } else if matches!(current, Some(Severity::Bad | Severity::Stale)) {
            None
        } else {
            current
        };
        self.offer(cond, v, now)
    }

    /// The field of the channel's objects this alarm compares.
    pub fn field(&self) -> &str {
        if self.reads_v {
            "v"
        } else {
            &self.def.field
        }
    }

    /// Whether a value was evaluated since the alarm was made.
    pub fn seen(&self) -> bool {
        self.seen
    }

    /// Time passed: delays that ran out, staleness, a shelf's end.
    pub fn tick(&mut self, now: u64) -> Option<Transition> {
        if self.status.state == State::Shelved && self.status.shelved_until.is_some_and(|u| now >= u) {
            return self.unshelve(None, None, now);
        }
        if let Some(p) = self.pending {
            if now >= p.since + self.delay_ms(p.cond) {
                self.pending = None;
                return self.commit(p.cond, p.value, now);
            }
        }
        let stale_ms = (self.def.stale_s * 1000.0) as u64;
        let current = self.current;
        if stale_ms > 0 && now >= self.last_value_ms + stale_ms && current != Some(Severity::Stale) {
            self.pending = None;
            return self.commit(Some(Severity::Stale), self.status.value, now);
        }
        None
    }

    fn delay_ms(&self, cond: Option<Severity>) -> u64 {
        let s = if cond.is_some() { self.def.on_delay_s } else { self.def.off_delay_s };
        (s * 1000.0) as u64
    }

    fn offer(&mut self, cond: Option<Severity>, value: Option<f64>, now: u64) -> Option<Transition> {
        let current = self.current;
        if cond == current {
            self.pending = None;
            return None;
        }
        if self.delay_ms(cond) == 0 {
            self.pending = None;
            return self.commit(cond, value, now);
        }
        let since = match self.pending {
            Some(p) if p.cond == cond => p.since,
            _ => now,
        };
        self.pending = Some(Pending { cond, since, value });
        None
    }

    /// The condition takes effect. Shelved and out-of-service alarms follow it silently.
    fn commit(&mut self, cond: Option<Severity>, value: Option<f64>, now: u64) -> Option<Transition> {
        let old = self.current;
        self.current = cond;
        self.status.active = cond.is_some();
        if cond.is_some() {
            self.status.severity = cond;
        }
        if matches!(self.status.state, State::Shelved | State::OutOfService) {
            return None;
        }
        let kind = match (old, cond) {
            (None, Some(_)) => {
                self.status.state = State::ActiveUnacked;
                Kind::Raised
            }
            (Some(o), Some(n)) if n.rank() >= o.rank() => {
                self.status.state = State::ActiveUnacked;
                Kind::Worsened
            }
            (Some(_), Some(_)) => Kind::Improved,
            (Some(_), None) if self.status.state == State::ActiveAcked => {
                self.status.state = State::Normal;
                Kind::Cleared
            }
            (Some(_), None) => {
                self.status.state = State::RtnUnacked;
                Kind::Returned
            }
            (None, None) => return None,
        };
        if matches!(kind, Kind::Raised | Kind::Worsened) {
            self.status.acked_by = None;
            self.status.acked_at = None;
            self.status.comment = None;
        }
        self.status.value = value;
        Some(self.changed(kind, None, None, now))
    }

    /// An operator's action, or why it does not apply (the text of a 409).
    pub fn act(&mut self, act: &Act, user: &str, comment: Option<String>, now: u64) -> Result<Transition, String> {
        let state = self.status.state;
        match act {
            Act::Ack => {
                self.status.state = match state {
                    State::ActiveUnacked => State::ActiveAcked,
                    State::RtnUnacked => State::Normal,
                    State::ActiveAcked => {
                        let by = self.status.acked_by.as_deref().unwrap_or("someone");
                        return Err(format!("already acknowledged by {by}"));
                    }
                    other => return Err(format!("nothing to acknowledge: the alarm is {}", other.as_str())),
                };
                self.status.acked_by = Some(user.to_string());
                self.status.acked_at = Some(now);
                self.status.comment = comment.clone();
                Ok(self.changed(Kind::Acked, Some(user), comment, now))
            }
            Act::Shelve { until_ms } => {
                if state == State::OutOfService {
                    return Err("the alarm is out of service".into());
                }
                self.status.state = State::Shelved;
                self.status.shelved_until = Some(*until_ms);
                self.status.comment = comment.clone();
                Ok(self.changed(Kind::Shelved, Some(user), comment, now))
            }
            Act::Unshelve => self
                .unshelve(Some(user), comment, now)
                .ok_or_else(|| format!("the alarm is not shelved: it is {}", state.as_str())),
        }
    }

    fn unshelve(&mut self, user: Option<&str>, comment: Option<String>, now: u64) -> Option<Transition> {
        if self.status.state != State::Shelved {
            return None;
        }
        self.status.shelved_until = None;
        self.status.state = if self.status.active { State::ActiveUnacked } else { State::Normal };
        self.status.comment = comment.clone();
        Some(self.changed(Kind::Unshelved, user, comment, now))
    }

    /// The definition changed: limits, priority and message apply from now on (the current
    /// value is evaluated again by the caller); `enabled` moves the alarm out of or into
    /// service.
    pub fn redefine(&mut self, def: Arc<AlarmDef>, now: u64) -> Option<Transition> {
        self.limits = Limits::of(&def);
        self.reads_v = def.field == "v";
        self.def = def;
        self.status.priority = self.def.priority;
        self.status.message = message(&self.def, self.status.severity);
        self.pending = None;
        let out_of_service = self.status.state == State::OutOfService;
        if self.def.enabled != out_of_service {
            return None;
        }
        if !self.def.enabled {
            self.status.state = State::OutOfService;
            self.status.shelved_until = None;
            return Some(self.changed(Kind::OutOfService, None, None, now));
        }
        self.status.state = if self.status.active { State::ActiveUnacked } else { State::Normal };
        Some(self.changed(Kind::InService, None, None, now))
    }

    fn changed(&mut self, kind: Kind, user: Option<&str>, comment: Option<String>, now: u64) -> Transition {
        self.status.since = now;
        self.status.seq += 1;
        self.status.message = message(&self.def, self.status.severity);
        Transition { kind, status: self.status.clone(), user: user.map(str::to_string), comment }
    }
}

/// The definition's message, or `<channel> <SEVERITY>`.
fn message(def: &AlarmDef, severity: Option<Severity>) -> String {
    if let Some(m) = &def.message {
        return m.clone();
    }
    let sev = match severity {
        Some(s) => serde_json::to_value(s).ok().and_then(|v| v.as_str().map(str::to_uppercase)).unwrap_or_default(),
        None => String::new(),
    };
    format!("{} {sev}", def.channel).trim_end().to_string()
}

/// The limit `v` is at or beyond, with the deadband holding an alarm that is `current` until
/// the value is back by more than it.
fn level(l: &Limits, v: f64, current: Option<Severity>) -> Option<Severity> {
    let db = l.deadband;
    let holds = |s: &[Severity]| current.is_some_and(|c| s.contains(&c));
    let high = |limit: f64, held: &[Severity]| v >= if holds(held) { limit - db } else { limit };
    let low = |limit: f64, held: &[Severity]| v <= if holds(held) { limit + db } else { limit };
    if high(l.hihi, &[Severity::Hihi]) {
        Some(Severity::Hihi)
    } else if high(l.hi, &[Severity::Hi, Severity::Hihi]) {
        Some(Severity::Hi)
    } else if low(l.lolo, &[Severity::Lolo]) {
        Some(Severity::Lolo)
    } else if low(l.lo, &[Severity::Lo, Severity::Lolo]) {
        Some(Severity::Lo)
    } else {
        None
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
