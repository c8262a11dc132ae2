//! Alarms (SPEC §7a, docs/alarms.md): evaluated by the node from the publications, one state
//! per alarm shared by every screen, acknowledged and shelved by named operators, every
//! transition journaled.
//!
//! # Layout
//! - this file: starting the engine, the operators' actions and definition changes (each
//!   checked here, whichever path asked), the names the broker keeps them under. The HTTP
//!   routes are `crate::api`'s (`api/alarms.rs`).
//! - [`def`]: definitions and their validation, the ids of a pattern's alarms.
//! - [`state`]: one alarm's ISA-18.2 state machine, pure (`state_tests.rs` its tests).
//! - [`engine`]: [`Alarms`], the definitions, the held alarms, every node's view of the states
//!   and the tap that evaluates publications.
//! - [`lease`]: which node evaluates (the `alarms` lease), taking over from stored states,
//!   the timer, a pattern's channels found in the broker's listing.
//! - [`writer`]: transitions stored, published and journaled in order.
//! - [`journal`]: journal entries and bounded reads.
//! - [`forward`]: an operator's action reaching a node that does not evaluate, sent to the
//!   one that does (internal `$` channels).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use switchboard_broker::{now_ms, Publication};
use switchboard_protocol::code;

use crate::auth::{Action, Identity};
use crate::hub::{PublicationTap, TapSlot};
use crate::log_limit::LogLimit;
use crate::node::{ApiError, Node};

pub mod def;
pub mod engine;
pub mod forward;
pub mod journal;
pub mod lease;
pub mod state;
pub mod writer;

pub use engine::Alarms;

use def::AlarmDef;
use def::MAX_DEFS;
use engine::{Defs, Origin};
use state::{Act, Kind, Status};

/// The broker table of the alarms' states, by alarm id.
pub const STATES: &str = "alarms.states";
/// The broker table of the definitions made over the API, by definition id.
pub const DEFS: &str = "alarms.defs";
/// Longest operator comment.
pub const MAX_COMMENT_LEN: usize = 500;
/// Longest shelf (s).
pub const MAX_SHELVE_S: f64 = 86_400.0;

/// The channel an alarm's states are published on.
pub fn channel_of(id: &str) -> String {
    format!("{}:{id}", def::NAMESPACE)
}

impl PublicationTap for Alarms {
    fn on_publication(&self, channel: &str, slot: Option<&TapSlot>, p: &Publication) {
        Alarms::on_publication(self, channel, slot, p);
    }
}

/// Starts the engine: every node keeps the definitions and the view; the lease decides who
/// evaluates. Returns once the first lease round is done, so that a node serves its alarms'
/// states from its first request.
pub async fn start(node: &Arc<Node>) {
    let defs = Defs::new(config_defs(node));
    let (alarms, queue) = Alarms::new(defs, Some(node.hub.clone()));
    if node.alarms.set(alarms.clone()).is_err() {
        return;
    }
    node.hub.set_tap(alarms.clone());
    forward::start(node, &alarms);
    tokio::spawn(writer::run(alarms.clone(), Arc::downgrade(node), queue));
    lease::first_round(&alarms, node).await;
    tokio::spawn(lease::run(alarms, Arc::downgrade(node)));
}

fn config_defs(node: &Node) -> BTreeMap<String, (Arc<AlarmDef>, Origin)> {
    node.config.alarms.iter().map(|d| (d.id.clone(), (Arc::new(d.clone()), Origin::Config))).collect()
}

/// Reads the definitions again: the configuration's and the API's (kept by the broker). The
/// holder applies changes to the alarms it holds.
pub(crate) async fn reload_defs(alarms: &Arc<Alarms>, node: &Arc<Node>) {
    let mut all = config_defs(node);
    match node.broker.table_all(DEFS).await {
        Ok(rows) => {
            for (id, text) in rows {
                match serde_json::from_str::<AlarmDef>(&text) {
                    Ok(d) if !all.contains_key(&id) && d.validate().is_ok() => {
                        all.insert(id, (Arc::new(d), Origin::Api));
                    }
                    _ => warn(node, "read an alarm definition", &format!("definition {id:?} skipped")),
                }
            }
        }
        Err(e) => warn(node, "read the alarm definitions", &e.to_string()),
    }
    let defs = Arc::new(Defs::new(all));
    alarms.set_defs(defs.clone());
    forward::follow_all(alarms, node).await;
    if !alarms.holding.load(Relaxed) {
        return;
    }
    // Alarms whose definition changed take it; those whose definition left are removed; the
    // new ones are made by the next takeover steps (exact channels now, patterns as found).
    let now = now_ms();
    let held: Vec<_> = alarms.held.read().by_id.values().cloned().collect();
    for a in held {
        let (def_id, id, channel) = {
            let a = a.lock();
            (a.def.id.clone(), a.status.id.clone(), a.status.channel.clone())
        };
        match defs.all.get(&def_id) {
            Some((d, _)) if d.alarm_id(&channel) == id && (d.is_pattern() || d.channel == channel) => {
                if **d != *a.lock().def {
                    let t = a.lock().redefine(d.clone(), now);
                    alarms.emit(t);
                    if d.timed() {
                        alarms.held.write().timed.insert(id.clone(), a.clone());
                    }
                    // The value the channel holds, judged by the new limits.
                    lease::start_following(alarms, node, &channel, true).await;
                }
            }
            _ => {
                let status = a.lock().status.clone();
                forget(alarms, &id, &channel, &a);
                writer::remove(alarms, node, status).await;
            }
        }
    }
    let channels: Vec<String> = defs.exact_channels().cloned().collect();
    for ch in channels {
        if !alarms.ensure(&ch, now).is_empty() {
            follow(alarms, node, ch);
        }
    }
}

/// Drops a held alarm (its definition left).
fn forget(alarms: &Alarms, id: &str, channel: &str, a: &Arc<parking_lot::Mutex<state::Alarm>>) {
    let mut held = alarms.held.write();
    held.by_id.remove(id);
    held.timed.remove(id);
    if let Some(list) = held.by_channel.get_mut(channel) {
        list.retain(|x| !Arc::ptr_eq(x, a));
        if list.is_empty() {
            held.by_channel.remove(channel);
        }
    }
    drop(held);
    alarms.sync_slot(channel);
}

/// A pattern's new channel met in a publication, or a channel to follow again: subscribed and
/// evaluated in a task of its own (the writer asks; `engine` holds no node).
pub(crate) fn follow(alarms: &Arc<Alarms>, node: &Arc<Node>, channel: String) {
    let (alarms, node) = (alarms.clone(), node.clone());
    tokio::spawn(async move { lease::start_following(&alarms, &node, &channel, false).await });
}

/// A stored state whose definition is gone: removed, its screens told.
pub(crate) async fn remove(alarms: &Alarms, node: &Arc<Node>, status: Status) {
    writer::remove(alarms, node, status).await;
}

/// An operator's action on alarm `id` as `who`: the new state, or why not (403 without
/// `alarm_ack` on the alarm's channel, 404 unknown, 409 not applicable, 400 bad input).
pub async fn act(
    node: &Arc<Node>,
    who: &Identity,
    id: &str,
    act: Act,
    comment: Option<String>,
) -> Result<Status, ApiError> {
    let alarms = node.alarms.get().ok_or_else(|| ApiError::new(code::UNAVAILABLE, "alarms are not running"))?;
    if comment.as_ref().is_some_and(|c| c.len() > MAX_COMMENT_LEN) {
        return Err(ApiError::new(code::BAD_REQUEST, format!("comment: at most {MAX_COMMENT_LEN} bytes")));
    }
    let channel = alarms.view.read().get(id).map(|s| s.channel.clone());
    let channel = channel.ok_or_else(|| ApiError::new(code::NOT_FOUND, format!("no alarm {id:?}")))?;
    let ns = node.config.namespace(switchboard_protocol::namespace_of(&channel));
    node.config.security.auth.check(who, &ns.allow, Action::AlarmAck, &channel)?;
    let user = who.principal();
    if alarms.holding.load(Relaxed) {
        act_here(alarms, id, &act, &user, comment).await
    } else {
        forward::send(node, id, &act, &user, comment).await
    }
}

/// The action on an alarm this node holds, answered once its transition is journaled: a
/// journal read after the answer holds it.
pub(crate) async fn act_here(
    alarms: &Alarms,
    id: &str,
    act: &Act,
    user: &str,
    comment: Option<String>,
) -> Result<Status, ApiError> {
    let alarm = alarms.held.read().by_id.get(id).cloned();
    let alarm = alarm.ok_or_else(|| ApiError::new(code::NOT_FOUND, format!("no alarm {id:?}")))?;
    let t = alarm.lock().act(act, user, comment, now_ms()).map_err(|why| ApiError::new(code::CONFLICT, why))?;
    if matches!(act, Act::Shelve { .. }) {
        alarms.held.write().timed.insert(id.to_string(), alarm.clone());
    }
    let status = t.status.clone();
    // The writer always answers, unless the node is stopping.
    let _ = alarms.emit_recorded(t).await;
    Ok(status)
}

/// `shelve`'s end for `for_s` seconds from now (1 s to a day).
pub fn shelve_until(for_s: Option<f64>) -> Result<Act, ApiError> {
    match for_s {
        Some(s) if s.is_finite() && (1.0..=MAX_SHELVE_S).contains(&s) => {
            Ok(Act::Shelve { until_ms: now_ms() + (s * 1000.0) as u64 })
        }
        _ => Err(ApiError::new(code::BAD_REQUEST, format!("for_s: 1-{MAX_SHELVE_S} seconds"))),
    }
}

/// Makes or replaces the API definition `id` (true: made). Definitions of the configuration
/// are changed there only (409).
pub async fn put_def(node: &Arc<Node>, who: &Identity, def: AlarmDef) -> Result<bool, ApiError> {
    let alarms = node.alarms.get().ok_or_else(|| ApiError::new(code::UNAVAILABLE, "alarms are not running"))?;
    def.validate().map_err(|e| ApiError::new(code::BAD_REQUEST, e))?;
    let (made, priority) = {
        let defs = alarms.defs();
        match defs.all.get(&def.id) {
            Some((_, Origin::Config)) => return Err(config_owned(&def.id)),
            Some(_) => (false, def.priority),
            None if defs.all.len() >= MAX_DEFS => {
                return Err(ApiError::new(
                    code::LIMIT,
                    format!("the node holds its maximum of {MAX_DEFS} alarm definitions"),
                ))
            }
            None => (true, def.priority),
        }
    };
    let text = serde_json::to_string(&def).map_err(|e| ApiError::new(code::INTERNAL, e.to_string()))?;
    node.broker.table_put(DEFS, &def.id, &text).await.map_err(|e| node.broker_error(e))?;
    let kind = if made { Kind::Defined } else { Kind::Redefined };
    journal::append(node, &journal::Entry::definition(kind, &def.id, priority, who.principal())).await;
    writer::count(alarms, priority.as_str(), kind);
    forward::defs_changed(node).await;
    Ok(made)
}

/// Removes the API definition `id` and its alarms.
pub async fn delete_def(node: &Arc<Node>, who: &Identity, id: &str) -> Result<(), ApiError> {
    let alarms = node.alarms.get().ok_or_else(|| ApiError::new(code::UNAVAILABLE, "alarms are not running"))?;
    let priority = match alarms.defs().all.get(id) {
        Some((_, Origin::Config)) => return Err(config_owned(id)),
        Some((d, Origin::Api)) => d.priority,
        None => return Err(ApiError::new(code::NOT_FOUND, format!("no alarm definition {id:?}"))),
    };
    node.broker.table_remove(DEFS, id).await.map_err(|e| node.broker_error(e))?;
    journal::append(node, &journal::Entry::definition(Kind::Removed, id, priority, who.principal())).await;
    writer::count(alarms, priority.as_str(), Kind::Removed);
    forward::defs_changed(node).await;
    Ok(())
}

fn config_owned(id: &str) -> ApiError {
    ApiError::new(code::CONFLICT, format!("alarm definition {id:?} is in the configuration; change it there"))
}

/// Calls the broker up to three times, 300 ms apart; a failure of the last try is logged
/// ([`warn`]) and the caller goes on: the alarms' background writes (states, the journal).
pub(crate) async fn retry<T, F, Fut>(node: &Node, what: &str, mut call: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, switchboard_broker::BrokerError>>,
{
    const TRIES: u32 = 3;
    for i in 0..TRIES {
        match call().await {
            Ok(_) => return,
            Err(e) if i + 1 == TRIES => warn(node, what, &e.to_string()),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(300)).await,
        }
    }
}

/// A broker failure of the alarms' background work, logged at a bounded rate.
pub(crate) fn warn(node: &Node, what: &str, error: &str) {
    static LIMIT: LogLimit = LogLimit::new();
    if let Some(suppressed) = LIMIT.admit() {
        tracing::warn!(node = %node.id, suppressed, error, "alarms: could not {what}");
    }
}

/// Prometheus text: transitions by priority and kind, alarms by state, patterns' refusals.
pub fn render_metrics(node: &Node) -> String {
    use std::fmt::Write;
    let Some(alarms) = node.alarms.get() else { return String::new() };
    let mut out = String::from(
        "# HELP switchboard_alarm_transitions_total Alarm transitions recorded by this node.\n\
         # TYPE switchboard_alarm_transitions_total counter\n",
    );
    for ((priority, kind), n) in alarms.transitions.lock().iter() {
        let _ = writeln!(out, "switchboard_alarm_transitions_total{{priority=\"{priority}\",kind=\"{kind}\"}} {n}");
    }
    out.push_str(
        "# HELP switchboard_alarms Alarms by state, as this node sees them.\n# TYPE switchboard_alarms gauge\n",
    );
    let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
    for s in alarms.view.read().values() {
        *by_state.entry(s.state.as_str()).or_default() += 1;
    }
    for (state, n) in by_state {
        let _ = writeln!(out, "switchboard_alarms{{state=\"{state}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP switchboard_alarm_instances_refused_total Pattern matches that made no alarm (limit reached).\n\
         # TYPE switchboard_alarm_instances_refused_total counter\nswitchboard_alarm_instances_refused_total {}",
        alarms.refused.load(Relaxed)
    );
    out
}
