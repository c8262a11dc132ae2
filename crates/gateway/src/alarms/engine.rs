//! [`Alarms`]: the node's alarm engine. Every node keeps the definitions and a view of every
//! alarm's state (what `GET /api/alarms` answers); the node holding the `alarms` lease
//! (`alarms::lease`) also holds the alarms themselves and evaluates them.
//!
//! Evaluation runs in the hub's tap ([`crate::hub::PublicationTap`]), in the publisher's task:
//! one map lookup for a channel without alarms, a point parse and a comparison for one with
//! them. Each publication finds its channel's alarms cold (a plant's channels each change a
//! few times a second among thousands), so the path touches few cache lines: the hub's entry
//! for the channel holds its alarms ([`crate::hub::Hub::set_tap_slot`], kept in step with
//! [`Held::by_channel`] by [`Alarms::sync_slot`]), so the hub's one lookup finds them, and
//! each alarm's evaluation fields sit beside its lock. The engine's own map answers for the
//! moments a slot is not set yet (a pattern's channel just matched). A transition is queued
//! for the writer (`alarms::writer`), which stores, publishes and journals it in order;
//! evaluation never waits for the broker, an operator's action waits for its transition's
//! journal entry.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use foldhash::fast::RandomState;
use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;
use switchboard_broker::Publication;
use switchboard_protocol::point::{self, Point};
use tokio::sync::mpsc;

use super::def::AlarmDef;
use super::state::{Alarm, Status, Transition};
use crate::auth::pattern::Pattern;
use crate::hub::{Hub, TapSlot};

/// Most alarms, pattern instances included.
pub const MAX_ALARMS: usize = 100_000;
/// The channel every transition is also published on.
pub const ALL: &str = "alarm:all";

/// Where a definition came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Config,
    Api,
}

/// The definitions, indexed for the tap.
#[derive(Default)]
pub struct Defs {
    pub all: BTreeMap<String, (Arc<AlarmDef>, Origin)>,
    patterns: Vec<(Pattern, Arc<AlarmDef>)>,
    exact: HashMap<String, Vec<Arc<AlarmDef>>>,
}

impl Defs {
    pub fn new(all: BTreeMap<String, (Arc<AlarmDef>, Origin)>) -> Defs {
        let mut d = Defs { all, ..Defs::default() };
        for (def, _) in d.all.values() {
            if def.is_pattern() {
                if let Ok(p) = Pattern::parse(&def.channel) {
                    d.patterns.push((p, def.clone()));
                }
            } else {
                d.exact.entry(def.channel.clone()).or_default().push(def.clone());
            }
        }
        d
    }

    /// The definitions that apply to `channel`.
    pub fn for_channel(&self, channel: &str) -> Vec<Arc<AlarmDef>> {
        let mut out = self.exact.get(channel).cloned().unwrap_or_default();
        out.extend(self.patterns.iter().filter(|(p, _)| p.matches(channel)).map(|(_, d)| d.clone()));
        out
    }

    pub fn exact_channels(&self) -> impl Iterator<Item = &String> {
        self.exact.keys()
    }

    pub fn patterns(&self) -> impl Iterator<Item = &Arc<AlarmDef>> {
        self.patterns.iter().map(|(_, d)| d)
    }
}

/// One channel's alarms (most channels have one, kept inline).
pub type ChannelAlarms = SmallVec<[Arc<Mutex<Alarm>>; 1]>;

/// The alarms this node evaluates (while it holds the lease).
#[derive(Default)]
pub struct Held {
    pub by_channel: HashMap<Arc<str>, ChannelAlarms, RandomState>,
    pub by_id: HashMap<String, Arc<Mutex<Alarm>>>,
    /// States read from the broker at takeover, for a pattern's alarms made later.
    pub stored: HashMap<String, Status>,
    /// The alarms time alone may change ([`AlarmDef::timed`], or shelved): the timer's list.
    pub timed: HashMap<String, Arc<Mutex<Alarm>>>,
}

/// What the writer task is given, in order.
pub enum Job {
    /// A transition, with whom to tell once it is journaled (an operator's action waits).
    Transition(Transition, Option<tokio::sync::oneshot::Sender<()>>),
    /// A new alarm's first state.
    Fresh(Status),
    /// A channel a pattern newly matched: to subscribe and follow.
    Follow(String),
}

/// What a forwarded action is answered: the alarm's new state, or the refusal.
pub type Answer = Result<Status, crate::error::ApiError>;

/// Actions this node forwarded to the holder and waits for, by request id.
#[derive(Default)]
pub struct Waiting {
    pub(super) next: AtomicU64,
    pub(super) by_id: Mutex<HashMap<u64, tokio::sync::oneshot::Sender<Answer>>>,
}

pub struct Alarms {
    defs: RwLock<Arc<Defs>>,
    /// Some definition is a pattern: only then may a publication on a channel without held
    /// alarms make one (exact channels' alarms are made at takeover and on definition changes).
    any_pattern: AtomicBool,
    pub held: RwLock<Held>,
    /// Every alarm's latest state: the holder's own, the others' from `alarm:all`.
    pub view: RwLock<HashMap<String, Status>>,
    pub holding: AtomicBool,
    /// This node follows `alarm:all` ([`super::forward::follow_all`]).
    pub following_all: AtomicBool,
    pub(super) queue: mpsc::UnboundedSender<Job>,
    /// Channels of patterns that made no alarm for want of room ([`MAX_ALARMS`]).
    pub refused: AtomicU64,
    pub(super) transitions: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Actions forwarded to the holder, waiting for its answer.
    pub(super) waiting: Waiting,
    /// The hub whose entries hold the channels' alarms (none in unit tests).
    hub: Option<Arc<Hub>>,
    /// Serializes [`Alarms::sync_slot`]: each reads `held` then sets the hub, so the last one
    /// to run leaves the hub as `held` is.
    syncing: Mutex<()>,
}

impl Alarms {
    pub(super) fn new(defs: Defs, hub: Option<Arc<Hub>>) -> (Arc<Alarms>, mpsc::UnboundedReceiver<Job>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let alarms = Arc::new(Alarms {
            any_pattern: AtomicBool::new(!defs.patterns.is_empty()),
            defs: RwLock::new(Arc::new(defs)),
            held: RwLock::new(Held::default()),
            view: RwLock::new(HashMap::new()),
            holding: AtomicBool::new(false),
            following_all: AtomicBool::new(false),
            queue: tx,
            refused: AtomicU64::new(0),
            transitions: Mutex::new(BTreeMap::new()),
            waiting: Default::default(),
            hub,
            syncing: Mutex::new(()),
        });
        (alarms, rx)
    }

    /// The definitions in force.
    pub fn defs(&self) -> Arc<Defs> {
        self.defs.read().clone()
    }

    /// Puts `defs` in force.
    pub(super) fn set_defs(&self, defs: Arc<Defs>) {
        self.any_pattern.store(!defs.patterns.is_empty(), Relaxed);
        *self.defs.write() = defs;
    }

    /// Hands the hub `channel`'s held alarms (or takes them back when it has none), after any
    /// change of [`Held::by_channel`] for it. Never from the tap, which runs under the hub's
    /// lock: alarms made there are handed over by the writer's [`Job::Follow`].
    pub(super) fn sync_slot(&self, channel: &str) {
        let Some(hub) = &self.hub else { return };
        let _one = self.syncing.lock();
        let list = self.held.read().by_channel.get(channel).filter(|l| !l.is_empty()).cloned();
        // A channel's only alarm is its slot itself: one pointer less to follow, and each
        // publication finds its alarm cold (docs/benchmarks.md, "Alarms").
        let slot = list.map(|l| match &l[..] {
            [one] => one.clone() as TapSlot,
            _ => Arc::new(l) as TapSlot,
        });
        hub.set_tap_slot(channel, slot);
    }

    pub(super) fn emit(&self, t: Option<Transition>) {
        if let Some(t) = t {
            self.queue_transition(t, None);
        }
    }

    /// Queues `t`, the outcome of an operator's action: the receiver is told once the
    /// transition is stored, published and journaled (or the writer gave up on the broker).
    pub(super) fn emit_recorded(&self, t: Transition) -> tokio::sync::oneshot::Receiver<()> {
        let (done, recorded) = tokio::sync::oneshot::channel();
        self.queue_transition(t, Some(done));
        recorded
    }

    fn queue_transition(&self, t: Transition, done: Option<tokio::sync::oneshot::Sender<()>>) {
        self.view.write().insert(t.status.id.clone(), t.status.clone());
        let _ = self.queue.send(Job::Transition(t, done));
    }

    /// Makes the alarms `channel` has and this node does not hold yet (a pattern's new
    /// match, or every alarm at takeover): true when any was made.
    pub(super) fn ensure(&self, channel: &str, now: u64) -> Vec<Arc<Mutex<Alarm>>> {
        let defs = self.defs();
        let wanted = defs.for_channel(channel);
        if wanted.is_empty() {
            return Vec::new();
        }
        let mut held = self.held.write();
        let mut made = Vec::new();
        for def in wanted {
            let id = def.alarm_id(channel);
            if held.by_id.contains_key(&id) {
                continue;
            }
            if held.by_id.len() >= MAX_ALARMS {
                self.refused.fetch_add(1, Relaxed);
                continue;
            }
            let stored = held.stored.remove(&id);
            let fresh = stored.is_none();
            let alarm = Alarm::new(def, channel, stored, now);
            if fresh {
                // A new alarm is stored and shown at once, before any transition.
                self.view.write().insert(id.clone(), alarm.status.clone());
                let _ = self.queue.send(Job::Fresh(alarm.status.clone()));
            }
            let timed = alarm.def.timed() || alarm.status.state == super::state::State::Shelved;
            let alarm = Arc::new(Mutex::new(alarm));
            if timed {
                held.timed.insert(id.clone(), alarm.clone());
            }
            held.by_id.insert(id, alarm.clone());
            held.by_channel.entry(Arc::from(channel)).or_default().push(alarm.clone());
            made.push(alarm);
        }
        made
    }

    /// A value of `channel`, evaluated by each of its alarms.
    fn evaluate<'a>(&self, alarms: impl IntoIterator<Item = &'a Mutex<Alarm>>, data: &str, now: u64) {
        // The alarms of a channel mostly read `v`: one parse for them.
        let mut of_v: Option<Point> = None;
        for a in alarms {
            let mut a = a.lock();
            let other;
            let p = match a.field() {
                "v" => &*of_v.get_or_insert_with(|| point::parse(data)),
                field => {
                    other = point::parse_field(data, field);
                    &other
                }
            };
            let bad = p.q.as_deref() == Some("bad");
            let t = a.on_value(p.v, bad, now);
            drop(a);
            self.emit(t);
        }
    }

    /// A publication on a channel with alarms (or a new match of a pattern); `slot`: the
    /// channel's alarms as the hub holds them.
    pub fn on_publication(&self, channel: &str, slot: Option<&TapSlot>, p: &Publication) {
        if channel == ALL {
            if !self.holding.load(Relaxed) {
                self.observe(p.data.get());
            }
            return;
        }
        if !self.holding.load(Relaxed) {
            return;
        }
        if let Some(slot) = slot {
            if let Some(one) = slot.downcast_ref::<Mutex<Alarm>>() {
                self.evaluate([one], p.data.get(), p.time_ms);
                return;
            }
            if let Some(list) = slot.downcast_ref::<ChannelAlarms>() {
                self.evaluate(list.iter().map(|a| &**a), p.data.get(), p.time_ms);
                return;
            }
        }
        {
            let held = self.held.read();
            if let Some(list) = held.by_channel.get(channel) {
                self.evaluate(list.iter().map(|a| &**a), p.data.get(), p.time_ms);
                return;
            }
        }
        if !self.any_pattern.load(Relaxed) {
            return;
        }
        let made = self.ensure(channel, p.time_ms);
        if !made.is_empty() {
            self.evaluate(made.iter().map(|a| &**a), p.data.get(), p.time_ms);
            let _ = self.queue.send(Job::Follow(channel.to_string()));
        }
    }

    /// Another node's transition, seen on `alarm:all`: the view keeps the later state.
    fn observe(&self, data: &str) {
        let Ok(s) = serde_json::from_str::<Status>(data) else { return };
        self.see(s);
    }

    /// Takes `s` into the view unless the view holds a later state of that alarm.
    pub(super) fn see(&self, s: Status) {
        let mut view = self.view.write();
        match view.get(&s.id) {
            Some(old) if old.seq > s.seq => {}
            _ if s.removed => {
                view.remove(&s.id);
            }
            _ => {
                view.insert(s.id.clone(), s);
            }
        }
    }

    /// The states, filtered by state and priority names (empty: all), worst first.
    pub fn list(&self, states: &[String], priorities: &[String]) -> Vec<Status> {
        let mut out: Vec<Status> = self
            .view
            .read()
            .values()
            .filter(|s| states.is_empty() || states.iter().any(|x| x == s.state.as_str()))
            .filter(|s| priorities.is_empty() || priorities.iter().any(|x| x == s.priority.as_str()))
            .cloned()
            .collect();
        out.sort_by(|a, b| {
            (a.state.rank(), std::cmp::Reverse(a.priority), std::cmp::Reverse(a.since), &a.id).cmp(&(
                b.state.rank(),
                std::cmp::Reverse(b.priority),
                std::cmp::Reverse(b.since),
                &b.id,
            ))
        });
        out
    }
}
