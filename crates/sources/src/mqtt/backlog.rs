//! The MQTT source's backlog: what it received and the node has not committed yet, in the order
//! it came. The connection task adds to it; the committing task ([`super::commit`]) takes from
//! it, offers the points to the node and acknowledges.
//!
//! - QoS 1 and 2: a message is held, with its acknowledgement, until every point it gave is
//!   committed or refused for good. Nothing bounds these here: the MQTT broker sends no more
//!   than its in-flight window of unacknowledged messages and keeps the rest in the source's
//!   persistent session. [`HOLD_MAX`] is the backstop against a broker without a window: past
//!   it the connection task waits for room (and stops reading).
//! - QoS 0: nothing to acknowledge, so each point waits within `buffer_bytes`; past it a new
//!   value takes the place of the value its channel has waiting (the newest per channel is
//!   kept), and the value replaced is counted as dropped (`buffer`). A channel with nothing
//!   waiting always gets its value in: the bound is `buffer_bytes` plus one value per channel.
//! - A new connection: QoS 1/2 messages of the previous one that are not committed leave the
//!   backlog when the session is persistent (the MQTT broker delivers them again; an
//!   acknowledgement on the new connection would name another message), and stay to be
//!   committed with a clean session (nobody sends them again).
//! - A message delivered again (DUP) that was committed already (its acknowledgement went down
//!   with the connection) is known by its topic and payload among the last [`RECENT`] committed:
//!   it is acknowledged and not published twice.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::Mutex;
use rumqttc::Publish;
use serde_json::Value;
use switchboard_broker::Data;
use tokio::sync::Notify;

use crate::SourceStats;

/// Most QoS 1/2 messages held at once (see the module doc).
pub const HOLD_MAX: usize = 65_536;
/// Committed QoS 1/2 messages remembered to recognise a delivery again.
pub const RECENT: usize = 4096;
/// `buffer_bytes` when unset.
pub const DEFAULT_BUFFER_BYTES: usize = 8 << 20;

/// One point on its way to the node.
#[derive(Debug, Clone)]
pub struct Queued {
    pub channel: String,
    pub data: Data,
    /// The point's value, recorded as the channel's last accepted value once committed.
    pub v: Value,
    /// A value from before the channel's newest ([`crate::Item::historical`]).
    pub historical: bool,
    /// The node did not answer when it was offered: look whether the channel has it before
    /// offering it again.
    pub verify: bool,
}

impl Queued {
    pub fn new(channel: String, data: Data, v: Value) -> Queued {
        Queued { channel, data, v, historical: false, verify: false }
    }
}

/// What one MQTT message left to do: points to commit, then its acknowledgement.
pub struct Message {
    pub points: Vec<Queued>,
    /// The QoS 1/2 publish to acknowledge once `points` is empty.
    pub ack: Option<Publish>,
    /// The connection it came on.
    pub conn: u64,
    /// Its topic and payload, hashed (QoS 1/2).
    pub key: Option<u64>,
    /// When it came (unix ms).
    pub arrived: u64,
    bytes: usize,
}

impl Message {
    fn held(&self) -> bool {
        self.ack.is_some()
    }
}

/// The source's backlog; shared by its connection and committing tasks.
pub struct Backlog {
    inner: Mutex<Inner>,
    /// Something was added.
    added: Notify,
    /// Room was made for held messages.
    room: Notify,
    stats: Arc<SourceStats>,
    budget: usize,
    persistent: bool,
    hasher: std::collections::hash_map::RandomState,
}

#[derive(Default)]
struct Inner {
    queue: VecDeque<Message>,
    /// Sequence number of `queue[0]`; `latest` indexes by it.
    front: u64,
    /// The QoS 0 point each channel has waiting last, by sequence number.
    latest: HashMap<String, u64>,
    buffered: usize,
    held: usize,
    /// Points waiting.
    points: usize,
    /// Messages taken by the committing task and not back yet.
    out: usize,
    conn: u64,
    recent: HashSet<u64>,
    recent_order: VecDeque<u64>,
}

impl Backlog {
    pub fn new(stats: Arc<SourceStats>, budget: usize, persistent: bool) -> Backlog {
        Backlog {
            inner: Mutex::new(Inner::default()),
            added: Notify::new(),
            room: Notify::new(),
            stats,
            budget,
            persistent,
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    /// The key of a message, to recognise its delivery again.
    pub fn key(&self, topic: &str, payload: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        topic.hash(&mut h);
        payload.hash(&mut h);
        h.finish()
    }

    /// A QoS 1/2 message delivered again that was committed already: true when its key is
    /// among the recent ones (the caller acknowledges it and goes on).
    pub fn committed_before(&self, key: u64) -> bool {
        self.inner.lock().recent.contains(&key)
    }

    /// Adds a QoS 1/2 message (its points may be none: it is still acknowledged in turn);
    /// waits while [`HOLD_MAX`] are held.
    pub async fn hold(&self, points: Vec<Queued>, ack: Publish, key: u64) {
        loop {
            let room = self.room.notified();
            {
                let mut inner = self.inner.lock();
                if inner.held < HOLD_MAX {
                    let bytes = points.iter().map(|p| p.data.get().len()).sum();
                    let conn = inner.conn;
                    inner.held += 1;
                    inner.points += points.len();
                    let arrived = switchboard_broker::now_ms();
                    let m = Message { points, ack: Some(ack), conn, key: Some(key), arrived, bytes };
                    inner.queue.push_back(m);
                    break;
                }
            }
            room.await;
        }
        self.changed();
    }

    /// Adds points that need no acknowledgement (QoS 0, the source's own bad markers), each
    /// within the buffer (see the module doc).
    pub fn buffer(&self, points: Vec<Queued>) {
        if points.is_empty() {
            return;
        }
        let (mut dropped, now) = (0, switchboard_broker::now_ms());
        {
            let mut inner = self.inner.lock();
            for p in points {
                let bytes = p.data.get().len();
                if inner.buffered + bytes > self.budget && inner.replace(&p, bytes, now) {
                    dropped += 1;
                    continue;
                }
                let seq = inner.front + inner.queue.len() as u64;
                inner.latest.insert(p.channel.clone(), seq);
                inner.buffered += bytes;
                inner.points += 1;
                let conn = inner.conn;
                inner.queue.push_back(Message { points: vec![p], ack: None, conn, key: None, arrived: now, bytes });
            }
        }
        if dropped > 0 {
            self.stats.dropped.add("buffer", dropped);
        }
        self.changed();
    }

    /// Waits until the backlog has something, then takes up to `max_points` points' messages
    /// from its front (at least one message).
    pub async fn take(&self, max_points: usize) -> Vec<Message> {
        loop {
            let added = self.added.notified();
            if let Some(batch) = self.take_now(max_points) {
                return batch;
            }
            added.await;
        }
    }

    /// As [`Backlog::take`] without waiting: `None` when empty.
    pub fn take_now(&self, max_points: usize) -> Option<Vec<Message>> {
        let mut inner = self.inner.lock();
        let mut out = Vec::new();
        let mut points = 0;
        while let Some(m) = inner.queue.front() {
            if !out.is_empty() && points + m.points.len() > max_points {
                break;
            }
            points += m.points.len();
            let Some(m) = inner.pop() else { break };
            out.push(m);
        }
        inner.out += out.len();
        (!out.is_empty()).then_some(out)
    }

    /// Gives back taken messages not done yet, in their order, ahead of everything waiting:
    /// those of an earlier connection whose session keeps them are dropped (see the module
    /// doc); a message done but not acknowledged yet comes back without points.
    pub fn put_back(&self, taken: usize, back: Vec<Message>) {
        let mut inner = self.inner.lock();
        inner.out -= taken;
        let conn = inner.conn;
        for m in back.into_iter().rev() {
            if m.points.is_empty() {
                if let Some(key) = m.key {
                    inner.remember(key);
                }
            }
            if m.held() && m.conn != conn && (self.persistent || m.points.is_empty()) {
                inner.held -= 1;
                continue;
            }
            if !m.held() {
                inner.buffered += m.bytes;
            }
            inner.points += m.points.len();
            inner.front -= 1;
            inner.queue.push_front(m);
        }
        // Indexes moved: the waiting QoS 0 points are found again by their sequence.
        inner.reindex();
        drop(inner);
        self.changed();
    }

    /// Messages taken and done: forgets them, remembering the keys of the held ones.
    pub fn done(&self, taken: usize, done: &[Message]) {
        let mut inner = self.inner.lock();
        inner.out -= taken;
        for m in done {
            if m.held() {
                inner.held -= 1;
            }
            if let Some(key) = m.key {
                inner.remember(key);
            }
        }
        drop(inner);
        self.room.notify_waiters();
        self.changed();
    }

    /// The connection the committing task acknowledges on.
    pub fn conn(&self) -> u64 {
        self.inner.lock().conn
    }

    /// A new connection was made (see the module doc).
    pub fn new_connection(&self) {
        let mut inner = self.inner.lock();
        inner.conn += 1;
        if self.persistent {
            let conn = inner.conn;
            let (before, points) = (inner.queue.len(), inner.points);
            let mut gone_points = 0;
            inner.queue.retain(|m| {
                let keep = !m.held() || m.conn == conn;
                if !keep {
                    gone_points += m.points.len();
                }
                keep
            });
            let gone = before - inner.queue.len();
            inner.held -= gone;
            inner.points = points - gone_points;
            inner.reindex();
        }
        drop(inner);
        self.room.notify_waiters();
        self.changed();
    }

    /// The source stops: what waits goes. Held messages the MQTT broker delivers again to
    /// the next run; QoS 0 values are counted as dropped (`stopped`).
    pub fn abandon(&self) {
        let mut inner = self.inner.lock();
        let lost: usize = inner.queue.iter().filter(|m| !m.held()).map(|m| m.points.len()).sum();
        *inner = Inner::default();
        drop(inner);
        if lost > 0 {
            self.stats.dropped.add("stopped", lost as u64);
        }
        self.stats.backlog.store(0, Relaxed);
        self.stats.backlog_since_ms.store(0, Relaxed);
    }

    /// Whether nothing waits and nothing is being committed.
    pub fn idle(&self) -> bool {
        let inner = self.inner.lock();
        inner.queue.is_empty() && inner.out == 0
    }

    /// Updates the source's backlog gauges.
    fn changed(&self) {
        let inner = self.inner.lock();
        let (points, since) = (inner.points, inner.queue.front().map_or(0, |m| m.arrived));
        drop(inner);
        self.stats.backlog.store(points as u64, Relaxed);
        self.stats.backlog_since_ms.store(since, Relaxed);
        self.added.notify_one();
    }
}

impl Inner {
    fn pop(&mut self) -> Option<Message> {
        let m = self.queue.pop_front()?;
        let seq = self.front;
        self.front += 1;
        self.points -= m.points.len();
        if !m.held() {
            self.buffered -= m.bytes;
            if let Some(p) = m.points.first() {
                if self.latest.get(&p.channel) == Some(&seq) {
                    self.latest.remove(&p.channel);
                }
            }
        }
        Some(m)
    }

    /// Puts `p` in the place of the point its channel has waiting: false when it has none.
    fn replace(&mut self, p: &Queued, bytes: usize, now: u64) -> bool {
        let Some(&seq) = self.latest.get(&p.channel) else { return false };
        let Some(m) = seq.checked_sub(self.front).and_then(|i| self.queue.get_mut(i as usize)) else { return false };
        let old = std::mem::replace(&mut m.points[0], p.clone());
        debug_assert_eq!(old.channel, p.channel);
        self.buffered = self.buffered + bytes - m.bytes;
        m.bytes = bytes;
        m.arrived = now;
        true
    }

    fn reindex(&mut self) {
        self.latest.clear();
        for (i, m) in self.queue.iter().enumerate() {
            if !m.held() {
                if let Some(p) = m.points.first() {
                    self.latest.insert(p.channel.clone(), self.front + i as u64);
                }
            }
        }
    }

    fn remember(&mut self, key: u64) {
        if self.recent.insert(key) {
            self.recent_order.push_back(key);
            if self.recent_order.len() > RECENT {
                if let Some(old) = self.recent_order.pop_front() {
                    self.recent.remove(&old);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(ch: &str, v: i64) -> Queued {
        let data = crate::mqtt::point(&Value::from(v), 1, true);
        Queued::new(ch.to_string(), data, Value::from(v))
    }

    fn values(batch: &[Message]) -> Vec<(String, i64)> {
        batch.iter().flat_map(|m| &m.points).map(|p| (p.channel.clone(), p.v.as_i64().unwrap())).collect()
    }

    fn publish(n: u16) -> Publish {
        let mut p = Publish::new("t", rumqttc::QoS::AtLeastOnce, vec![n as u8]);
        p.pkid = n;
        p
    }

    #[tokio::test]
    async fn mqtt_backlog_keeps_the_newest_qos0_value_per_channel_past_its_budget() {
        let stats = Arc::new(SourceStats::default());
        let one = point("pt:a", 0).data.get().len();
        let b = Backlog::new(stats.clone(), one * 3, true);
        b.buffer(vec![point("pt:a", 1), point("pt:b", 1), point("pt:a", 2)]);
        // Full: a new value of a channel with one waiting takes its place; a new channel gets in.
        b.buffer(vec![point("pt:a", 3), point("pt:b", 4), point("pt:c", 5)]);
        assert_eq!(stats.dropped.list(), vec![("buffer", 2)]);
        assert_eq!(stats.backlog.load(Relaxed), 4);
        let batch = b.take_now(100).unwrap();
        let got = values(&batch);
        assert_eq!(got, [("pt:a", 1), ("pt:b", 4), ("pt:a", 3), ("pt:c", 5)].map(|(c, v)| (c.to_string(), v)));
        b.done(batch.len(), &batch);
        assert!(b.idle());
        assert_eq!(stats.backlog.load(Relaxed), 0);
    }

    #[tokio::test]
    async fn mqtt_backlog_gives_back_in_order_and_forgets_an_old_connections_messages() {
        let stats = Arc::new(SourceStats::default());
        let b = Backlog::new(stats.clone(), 1 << 20, true);
        b.hold(vec![point("pt:a", 1)], publish(1), 11).await;
        b.hold(vec![point("pt:a", 2)], publish(2), 12).await;
        b.buffer(vec![point("pt:q", 3)]);
        let mut batch = b.take_now(1).unwrap();
        assert_eq!(values(&batch), [("pt:a".to_string(), 1)], "at most the points asked for, one message at least");
        batch.extend(b.take_now(100).unwrap());
        // The first is committed; the others go back, ahead of what came since.
        let back = batch.split_off(1);
        b.done(1, &batch);
        assert!(b.committed_before(11) && !b.committed_before(12));
        b.buffer(vec![point("pt:q", 4)]);
        b.put_back(back.len(), back);
        assert_eq!(
            values(&b.take_now(100).unwrap()),
            [("pt:a", 2), ("pt:q", 3), ("pt:q", 4)].map(|(c, v)| (c.to_string(), v))
        );
        // A new connection: held messages of the old one not committed leave (the MQTT broker
        // delivers them again); QoS 0 values stay.
        let b = Backlog::new(stats.clone(), 1 << 20, true);
        b.hold(vec![point("pt:a", 1)], publish(1), 11).await;
        b.buffer(vec![point("pt:q", 2)]);
        let taken = b.take_now(1).unwrap();
        b.hold(vec![point("pt:a", 3)], publish(3), 13).await;
        b.new_connection();
        assert_eq!(b.conn(), 1);
        b.put_back(taken.len(), taken);
        assert_eq!(values(&b.take_now(100).unwrap()), [("pt:q".to_string(), 2)]);
        // With a clean session nobody sends them again: they stay.
        let b = Backlog::new(stats.clone(), 1 << 20, false);
        b.hold(vec![point("pt:a", 1)], publish(1), 11).await;
        b.new_connection();
        assert_eq!(values(&b.take_now(100).unwrap()), [("pt:a".to_string(), 1)]);
    }

    #[tokio::test]
    async fn mqtt_backlog_counts_qos0_values_a_stopping_source_drops() {
        let stats = Arc::new(SourceStats::default());
        let b = Backlog::new(stats.clone(), 1 << 20, true);
        b.hold(vec![point("pt:a", 1)], publish(1), 11).await;
        b.buffer(vec![point("pt:q", 2), point("pt:r", 3)]);
        assert!(stats.backlog_age_s(switchboard_broker::now_ms() + 1500) >= 1.4);
        b.abandon();
        assert_eq!(stats.dropped.list(), vec![("stopped", 2)], "held messages are the MQTT broker's to keep");
        assert_eq!((stats.backlog.load(Relaxed), stats.backlog_age_s(switchboard_broker::now_ms())), (0, 0.0));
    }
}
