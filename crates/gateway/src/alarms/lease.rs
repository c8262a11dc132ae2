//! Which node evaluates the alarms: the holder of the `alarms` lease, renewed every third of
//! `source_lease_ttl_s` (with the memory broker, always this node). Taking the lease over
//! reads the stored states and goes on from them: each alarm is made with its state, its
//! channel subscribed, and its channel's last value evaluated unless a live one came first.
//! Losing it (or stopping) drops the alarms and their subscriptions; the states stay stored.
//!
//! A node that does not hold the lease reads the stored states every [`REFRESH_EVERY`] into
//! its view, which `alarm:all` keeps current in between.
//!
//! While holding, a timer evaluates what time alone changes (delays, staleness, shelves
//! running out) four times a second, and a pattern's channels are looked for in the
//! broker's listing every [`DISCOVER_EVERY`] (publications through this node find theirs at
//! once).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use switchboard_broker::{now_ms, ChannelQuery};

use super::engine::{Alarms, Held, Job};
use super::state::Status;
use super::STATES;
use crate::node::Node;

const LEASE: &str = "alarms";
const TICK: Duration = Duration::from_millis(250);
const DISCOVER_EVERY: Duration = Duration::from_secs(5);
/// How often a node that does not evaluate reads the stored states (between, `alarm:all`
/// keeps its view current).
const REFRESH_EVERY: Duration = Duration::from_secs(10);
/// Channels read per page of the broker's listing.
const PAGE: usize = 1000;

/// What time alone changes, for the alarms that time may change; those it no longer may
/// (a shelf ended) leave the list.
fn tick_timed(alarms: &Alarms, now: u64) {
    let list: Vec<_> = alarms.held.read().timed.iter().map(|(id, a)| (id.clone(), a.clone())).collect();
    let mut done = Vec::new();
    for (id, a) in list {
        let mut a = a.lock();
        let t = a.tick(now);
        if !a.def.timed() && a.status.state != super::state::State::Shelved {
            done.push(id);
        }
        drop(a);
        alarms.emit(t);
    }
    if !done.is_empty() {
        let mut held = alarms.held.write();
        for id in done {
            held.timed.remove(&id);
        }
    }
}

/// The first try for the lease, at start: evaluating here, or the view read from the stored
/// states.
pub(super) async fn first_round(alarms: &Arc<Alarms>, node: &Arc<Node>) {
    let ttl = Duration::from_secs(node.config.source_lease_ttl_s.max(1));
    if node.broker.lease(LEASE, &node.id, ttl).await.unwrap_or(false) {
        take_over(alarms, node).await;
    } else {
        super::reload_defs(alarms, node).await;
        refresh_view(alarms, node).await;
    }
}

/// Runs for the node's life: takes, renews and gives the lease back.
pub(super) async fn run(alarms: Arc<Alarms>, weak: Weak<Node>) {
    let Some(node) = weak.upgrade() else { return };
    let ttl = Duration::from_secs(node.config.source_lease_ttl_s.max(1));
    let mut stopping = node.stopping();
    drop(node);
    let mut tick = tokio::time::interval(TICK);
    let mut renew_at = tokio::time::Instant::now();
    let mut discover_at = tokio::time::Instant::now() + DISCOVER_EVERY;
    let mut refresh_at = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopping.changed() => break,
        }
        let Some(node) = weak.upgrade() else { return };
        let now = tokio::time::Instant::now();
        if now >= renew_at {
            renew_at = now + ttl / 3;
            let held = node.broker.lease(LEASE, &node.id, ttl).await.unwrap_or(false);
            match (held, alarms.holding.load(Relaxed)) {
                (true, false) => take_over(&alarms, &node).await,
                (false, true) => give_up(&alarms, &node).await,
                _ => {}
            }
        }
        if !alarms.holding.load(Relaxed) && now >= refresh_at {
            refresh_at = now + REFRESH_EVERY;
            refresh_view(&alarms, &node).await;
        }
        if alarms.holding.load(Relaxed) {
            tick_timed(&alarms, now_ms());
            if now >= discover_at {
                discover_at = now + DISCOVER_EVERY;
                discover(&alarms, &node).await;
            }
        }
    }
    if let Some(node) = weak.upgrade() {
        if alarms.holding.load(Relaxed) {
            give_up(&alarms, &node).await;
            let _ = node.broker.lease_release(LEASE, &node.id).await;
        }
    }
}

/// The view of a node that does not evaluate, read from the stored states.
async fn refresh_view(alarms: &Arc<Alarms>, node: &Arc<Node>) {
    let Ok(rows) = node.broker.table_all(STATES).await else { return };
    let stored: HashMap<String, Status> =
        rows.into_iter().filter_map(|(k, v)| Some((k, serde_json::from_str(&v).ok()?))).collect();
    alarms.view.write().retain(|id, _| stored.contains_key(id));
    for s in stored.into_values() {
        alarms.see(s);
    }
}

/// This node now evaluates the alarms, from the stored states on.
pub(super) async fn take_over(alarms: &Arc<Alarms>, node: &Arc<Node>) {
    super::reload_defs(alarms, node).await;
    let stored: HashMap<String, Status> = match node.broker.table_all(STATES).await {
        Ok(rows) => rows.into_iter().filter_map(|(k, v)| Some((k, serde_json::from_str(&v).ok()?))).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "alarms: stored states not readable; trying again");
            return;
        }
    };
    {
        let mut view = alarms.view.write();
        view.clear();
        view.extend(stored.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    *alarms.held.write() = Held { stored, ..Held::default() };
    alarms.holding.store(true, Relaxed);
    tracing::info!(node = %node.id, "alarms: evaluating here");
    let now = now_ms();
    let channels: Vec<String> = alarms.defs().exact_channels().cloned().collect();
    for ch in &channels {
        alarms.ensure(ch, now);
    }
    discover(alarms, node).await;
    let all: Vec<Arc<str>> = alarms.held.read().by_channel.keys().cloned().collect();
    for ch in all {
        start_following(alarms, node, &ch, false).await;
    }
    forget_removed(alarms, node).await;
}

/// Subscribes `channel` for its alarms, evaluates its last value (unless a live value came
/// first, or `again`: a definition changed) and makes sure its `alarm:` channels hold the
/// current states.
pub(super) async fn start_following(alarms: &Arc<Alarms>, node: &Arc<Node>, channel: &str, again: bool) {
    if node.broker.kind() != "memory" && !again {
        if let Err(e) = node.broker.subscribe(channel).await {
            tracing::warn!(channel, error = %e, "alarms: cannot subscribe");
        }
    }
    alarms.sync_slot(channel);
    let list = alarms.held.read().by_channel.get(channel).cloned().unwrap_or_default();
    if let Ok(Some((_, Some(last)))) = node.broker.last_if_known(channel).await {
        for a in &list {
            let mut a = a.lock();
            if a.seen() && !again {
                continue;
            }
            let p = switchboard_protocol::point::parse_field(last.data.get(), &a.def.field);
            let t = a.on_value(p.v, p.q.as_deref() == Some("bad"), last.time_ms);
            drop(a);
            alarms.emit(t);
        }
    }
    for a in &list {
        let status = a.lock().status.clone();
        let ch = super::channel_of(&status.id);
        if matches!(node.broker.last_if_known(&ch).await, Ok(None)) {
            // In the writer's queue, behind any transition just made.
            let _ = alarms.queue.send(Job::Fresh(status));
        }
    }
}

/// Looks for the patterns' channels in the broker's listing.
async fn discover(alarms: &Arc<Alarms>, node: &Arc<Node>) {
    let patterns: Vec<_> = alarms.defs().patterns().cloned().collect();
    for def in patterns {
        let prefix = def.channel.split('*').next().unwrap_or_default().to_string();
        let mut cursor: Option<String> = None;
        loop {
            let q = ChannelQuery { prefix: &prefix, cursor: cursor.as_deref(), limit: PAGE };
            let Ok(page) = node.broker.channels(&q).await else { break };
            for c in &page.channels {
                if alarms.held.read().by_channel.contains_key(&c.channel) {
                    continue;
                }
                if !alarms.ensure(&c.channel, now_ms()).is_empty() {
                    start_following(alarms, node, &c.channel, false).await;
                }
            }
            match page.next {
                Some(n) if alarms.holding.load(Relaxed) => cursor = Some(n),
                _ => break,
            }
        }
    }
}

/// Stored states whose definition is gone are removed (their screens told).
async fn forget_removed(alarms: &Arc<Alarms>, node: &Arc<Node>) {
    let defs = alarms.defs();
    let mut gone = Vec::new();
    alarms.held.write().stored.retain(|_, s| {
        let keep = defs.all.contains_key(&s.def);
        if !keep {
            gone.push(s.clone());
        }
        keep
    });
    for s in gone {
        super::remove(alarms, node, s).await;
    }
}

/// This node no longer evaluates the alarms.
pub(super) async fn give_up(alarms: &Arc<Alarms>, node: &Arc<Node>) {
    alarms.holding.store(false, Relaxed);
    let held = std::mem::take(&mut *alarms.held.write());
    for ch in held.by_channel.keys() {
        alarms.sync_slot(ch);
    }
    if node.broker.kind() != "memory" {
        for ch in held.by_channel.keys() {
            let _ = node.broker.unsubscribe(ch).await;
        }
    }
    tracing::info!(node = %node.id, "alarms: no longer evaluating here");
}
