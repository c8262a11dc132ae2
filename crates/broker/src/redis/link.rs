//! The node's pub/sub link to Redis: ONE Redis subscription per channel with local
//! subscribers (however many clients), the task that keeps it, and the delivery of what
//! arrives to the node's handler.
//!
//! One task owns the pub/sub connection. It runs two halves over it:
//! - the *manager* turns the subscription counts into SUBSCRIBE / UNSUBSCRIBE commands, batched
//!   (every channel that changed since the last round goes into one command), then reads each
//!   newly subscribed channel's position so later reads can tell what the handler still has to
//!   receive; a PING every second measures the link's round trip ([`RoundTrip`]: readiness
//!   turns 503 on a slow one) and detects a dead connection;
//! - the *consumer* hands each message to the handler in arrival order, which is offset order
//!   per channel (one connection; Redis publishes from the atomic publish script), checks that
//!   offsets follow each other, and calls `after_publications` once per burst of messages.
//!
//! When the connection drops, the task reconnects with backoff, resubscribes every channel that
//! still has subscribers and compares each channel's position with the last offset delivered:
//! a difference (or a new epoch after a Redis restart) makes the node tell that channel's
//! subscribers to recover ([`crate::BrokerHandler::on_missed`]).
//!
//! Offsets going backwards within an epoch — a position behind what was delivered after a
//! reconnect, or a publication at or below one the pub/sub stream already brought — mean the
//! server lost publications and reuses their offsets (a failover to a replica that had not
//! caught up, a restore from an older copy). That is an epoch change: subscribers recover,
//! and the channel's epoch in Redis is replaced ([`bump_epoch`]) so that a client recovering
//! from an offset it saw is told `complete: false` instead of being handed other publications
//! under the same numbers. Never dropped as duplicates.
//!
//! Locks: `entries` (the map), then one entry's `track`; `dirty` is never held with another.
//! The consumer calls the handler while holding the entry's `track`, which is what makes a
//! read's "wait until delivered" check and a delivery one atomic step per channel (the memory
//! broker holds its stream lock the same way); handlers only enqueue, so it is held briefly.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::value::RawValue;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::round_trip::RoundTrip;
use super::subscriber::{self, Event, Sink, Source};
use super::Inner;
use crate::{BrokerError, ClientInfo, Position, Publication};

/// Channels per SUBSCRIBE / UNSUBSCRIBE command.
const SUBSCRIBE_CHUNK: usize = 1000;
/// Messages handed to the handler before one `after_publications` (socket writes).
const BURST: usize = 512;
/// Pub/sub keepalive: a PING this often (its round trip is the link's [`RoundTrip`], so this
/// bounds how late a slow server is noticed), the connection is dropped without a PONG in time.
pub const PING_EVERY: Duration = Duration::from_secs(1);
const PING_TIMEOUT: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// At most a second between attempts: a server back from a failover or a restart is found
/// within a second (subscribes to its channels answer 503 until then), and an attempt is one
/// TCP connect per node.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// One channel's subscription on this node.
pub(super) struct Entry {
    track: Mutex<Track>,
    /// Signalled whenever `track` changes (activation, delivery, loss of the link).
    changed: Notify,
}

#[derive(Default)]
struct Track {
    /// Local subscriptions (the gateway calls `subscribe` once per client subscription).
    count: usize,
    /// The Redis SUBSCRIBE of this channel is confirmed on the current connection.
    redis_subscribed: bool,
    /// Subscribed and its starting position known: deliveries are complete from here on.
    active: bool,
    /// A Redis Cluster node answered that it does not serve this channel's slot.
    refused: bool,
    /// It was active when the connection dropped: compare positions after resubscribing.
    resync: bool,
    /// With `resync`: the offset delivered when the connection dropped, what the position read
    /// after resubscribing is compared with (publications delivered on the new connection
    /// before that read may be past it, which is neither a loss nor a rollback).
    before: u64,
    /// Epoch and offset of the last publication handed to the handler (or of the position read
    /// when the subscription started).
    epoch: Option<Arc<str>>,
    delivered: u64,
    /// The highest offset of `epoch` that came over the pub/sub stream (0: none yet): one at
    /// or below it again is a rollback, not a duplicate of a position read.
    seen: u64,
}

impl Track {
    /// Forgets what was delivered: a later subscription starts from the position it reads,
    /// with nothing to compare it with.
    fn start_over(&mut self) {
        self.resync = false;
        self.epoch = None;
        self.delivered = 0;
        self.seen = 0;
    }
}

/// Why a subscribe failed at once: the pub/sub connection is down (Redis unreachable).
const LINK_DOWN: &str = "redis pub/sub connection is down";

/// A subscribe refused because the server is known unreachable, not because it is slow.
pub(crate) fn link_down(e: &BrokerError) -> bool {
    matches!(e, BrokerError::Unavailable(text) if text == LINK_DOWN)
}

/// Subscription state shared by the broker's methods and the link task.
#[derive(Default)]
pub(super) struct Link {
    entries: Mutex<HashMap<Arc<str>, Arc<Entry>>>,
    /// Channels whose count crossed zero (or that need resubscribing); the manager's to-do list.
    dirty: Mutex<Vec<Arc<str>>>,
    /// Channels whose offsets went backwards, with the epoch to replace; the manager runs
    /// [`bump_epoch`] for them (the consumer, which finds most, cannot wait on Redis).
    rollbacks: Mutex<Vec<(Arc<str>, Arc<str>)>>,
    wake: Notify,
    /// The pub/sub connection is established.
    pub up: AtomicBool,
    /// Redis is known to be unreachable (a connection failed or dropped, and no new one is up
    /// yet). Subscribes fail at once instead of waiting; false while the first connection is
    /// still being made.
    down: AtomicBool,
    /// Bumped on every new pub/sub connection (the heartbeat re-adds presence after one).
    pub generation: AtomicU64,
    /// Signalled on every new pub/sub connection, so the heartbeat registers the node at once.
    pub connected: Notify,
    /// Subscription counts changed since the heartbeat last published them.
    pub counts_changed: AtomicBool,
    /// The keepalive PING's round trip on the current connection.
    pub round_trip: RoundTrip,
}

/// What a subscriber waits for.
enum Wait {
    Ready,
    Pending,
    Failed,
}

impl Link {
    /// Counts one local subscription. `Err` (nothing counted) while Redis is unreachable.
    pub fn acquire(&self, channel: &str) -> Result<Arc<Entry>, BrokerError> {
        if self.down.load(Relaxed) {
            return Err(BrokerError::Unavailable(LINK_DOWN.into()));
        }
        let entry = {
            let mut entries = self.entries.lock();
            let entry = entries
                .entry(Arc::from(channel))
                .or_insert_with(|| Arc::new(Entry { track: Mutex::new(Track::default()), changed: Notify::new() }))
                .clone();
            let mut t = entry.track.lock();
            t.count += 1;
            if t.count == 1 {
                self.dirty.lock().push(Arc::from(channel));
            }
            drop(t);
            entry
        };
        self.counts_changed.store(true, Relaxed);
        self.wake.notify_one();
        Ok(entry)
    }

    /// Drops one local subscription; the manager unsubscribes from Redis at zero.
    pub fn release(&self, channel: &str) {
        let entries = self.entries.lock();
        let Some(entry) = entries.get(channel) else { return };
        let mut t = entry.track.lock();
        t.count = t.count.saturating_sub(1);
        if t.count == 0 {
            self.dirty.lock().push(Arc::from(channel));
        }
        drop(t);
        drop(entries);
        self.counts_changed.store(true, Relaxed);
        self.wake.notify_one();
    }

    /// Waits until the channel's Redis subscription is active (publications reach the
    /// handler). `Err` when the link is down or `limit` passes.
    pub async fn wait_active(&self, entry: &Entry, limit: Duration) -> Result<(), BrokerError> {
        let deadline = Instant::now() + limit;
        loop {
            let notified = entry.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let state = {
                let t = entry.track.lock();
                if t.active {
                    Wait::Ready
                } else if t.refused {
                    return Err(BrokerError::Unavailable(
                        "redis: MOVED (the channel's slot is served by another cluster node)".into(),
                    ));
                } else if self.down.load(Relaxed) {
                    Wait::Failed
                } else {
                    Wait::Pending
                }
            };
            match state {
                Wait::Ready => return Ok(()),
                Wait::Failed => return Err(BrokerError::Unavailable(LINK_DOWN.into())),
                Wait::Pending => {
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        return Err(BrokerError::Unavailable("redis subscription not confirmed in time".into()));
                    }
                }
            }
        }
    }

    /// Waits until the handler has been given every publication up to `position` on a channel
    /// this node delivers. Returns false when that did not happen within `limit`.
    pub async fn wait_delivered(&self, channel: &str, position: &Position, limit: Duration) -> bool {
        let Some(entry) = self.entries.lock().get(channel).cloned() else { return true };
        let deadline = Instant::now() + limit;
        loop {
            let notified = entry.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let t = entry.track.lock();
                if !t.active {
                    return true;
                }
                match &t.epoch {
                    Some(e) if **e == *position.epoch && t.delivered < position.offset => {}
                    // Another epoch: Redis lost its data; the resync after the reconnect (or
                    // the next publication) tells the subscribers to recover.
                    _ => return true,
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Local subscription counts per channel, for the cluster figures.
    pub fn counts(&self) -> Vec<(Arc<str>, usize)> {
        let entries = self.entries.lock();
        entries
            .iter()
            .filter_map(|(ch, e)| {
                let n = e.track.lock().count;
                (n > 0).then(|| (ch.clone(), n))
            })
            .collect()
    }

    fn take_dirty(&self) -> Vec<Arc<str>> {
        let list = std::mem::take(&mut *self.dirty.lock());
        let mut seen = HashSet::new();
        list.into_iter().filter(|ch| seen.insert(ch.clone())).collect()
    }

    /// A new connection: every channel with subscribers must be subscribed again.
    fn on_connected(&self) {
        let entries = self.entries.lock();
        let mut dirty = self.dirty.lock();
        for (ch, e) in entries.iter() {
            if e.track.lock().count > 0 {
                dirty.push(ch.clone());
            }
        }
        drop(dirty);
        drop(entries);
        self.round_trip.reset();
        self.generation.fetch_add(1, Relaxed);
        self.up.store(true, Relaxed);
        self.down.store(false, Relaxed);
        self.connected.notify_one();
    }

    /// Tells the handler that every channel that was delivering when the connection dropped
    /// may miss publications (its subscribers recover). Told once: those channels start over
    /// as new subscriptions, so that whoever subscribes after the notice (the recovering
    /// subscribers among them) is not told again when the link resubscribes.
    fn tell_lost(&self, handler: Option<&Arc<dyn crate::BrokerHandler>>) {
        let Some(h) = handler else { return };
        let lost: Vec<Arc<str>> = {
            let entries = self.entries.lock();
            entries
                .iter()
                .filter(|(_, e)| {
                    let mut t = e.track.lock();
                    let told = t.resync;
                    if told {
                        t.start_over();
                    }
                    told
                })
                .map(|(ch, _)| ch.clone())
                .collect()
        };
        if lost.is_empty() {
            return;
        }
        tracing::warn!(channels = lost.len(), "redis unreachable; subscribers of its channels recover");
        for ch in &lost {
            h.on_missed(ch);
        }
        h.after_publications();
    }

    /// A connection attempt failed.
    fn on_unreachable(&self) {
        self.down.store(true, Relaxed);
        let entries = self.entries.lock();
        for e in entries.values() {
            e.changed.notify_waiters();
        }
    }

    /// The connection dropped: nothing is subscribed any more; channels that were delivering
    /// are compared with Redis once resubscribed.
    fn on_lost(&self) {
        self.up.store(false, Relaxed);
        self.round_trip.reset();
        self.down.store(true, Relaxed);
        let mut entries = self.entries.lock();
        entries.retain(|_, e| {
            let mut t = e.track.lock();
            t.redis_subscribed = false;
            if t.active {
                t.resync = true;
                t.before = t.delivered;
            }
            t.active = false;
            let keep = t.count > 0;
            drop(t);
            e.changed.notify_waiters();
            keep
        });
    }
}

/// The link task: connects, runs manager and consumer until the connection fails, reconnects
/// with exponential backoff (with jitter). Ends when the broker is dropped. `restarted`: the
/// task runs again after a panic, which dropped its connection: that is a lost connection.
pub(super) async fn run(inner: Arc<Inner>, mut stop: watch::Receiver<()>, restarted: bool) {
    let mut backoff = BACKOFF_MIN;
    if restarted {
        inner.link.on_lost();
        inner.commands.reset();
    }
    // The connection dropped and no new one has been made yet.
    let mut lost = restarted;
    loop {
        // Through the sentinels where there are some: after a failover, the new primary.
        let connect = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let client = inner.endpoint.client().await?;
            subscriber::connect(&client, inner.cluster).await
        });
        let pubsub = tokio::select! {
            r = connect => r,
            _ = stop.changed() => return,
        };
        match pubsub {
            Ok(Ok(pubsub)) => {
                backoff = BACKOFF_MIN;
                let (mut sink, stream) = pubsub;
                inner.link.on_connected();
                tracing::info!("redis pub/sub connected");
                let why = tokio::select! {
                    _ = consume(&inner, stream) => "connection closed".to_string(),
                    r = manage(&inner, &mut sink) => match r {
                        Ok(()) => "connection closed".to_string(),
                        Err(e) => e.to_string(),
                    },
                    _ = stop.changed() => return,
                };
                inner.link.on_lost();
                // The command connection goes to the same server: do not wait for a command to
                // find out (after a failover it must follow the sentinels too).
                inner.commands.reset();
                lost = true;
                tracing::warn!(reason = %why, "redis pub/sub connection lost; reconnecting");
            }
            Ok(Err(e)) => {
                inner.link.on_unreachable();
                tracing::warn!(error = %e, retry_ms = backoff.as_millis() as u64, "redis unreachable");
            }
            Err(_) => {
                inner.link.on_unreachable();
                tracing::warn!(retry_ms = backoff.as_millis() as u64, "redis connect timed out");
            }
        }
        if lost && inner.link.down.load(Relaxed) && !inner.link.up.load(Relaxed) && backoff > BACKOFF_MIN {
            // Not a blip: the first reconnect failed too. Subscribers of this server's channels
            // are told now (they reconnect and recover once it is back) rather than waiting in
            // silence; channels on other servers keep streaming.
            lost = false;
            inner.link.tell_lost(inner.handler.get());
        }
        let pause = backoff.mul_f64(0.5 + fastrand::f64() / 2.0);
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Applies subscription changes until the connection fails.
async fn manage(inner: &Inner, sink: &mut Sink) -> Result<(), redis::RedisError> {
    let link = &inner.link;
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let rollbacks = std::mem::take(&mut *link.rollbacks.lock());
        for (ch, epoch) in rollbacks {
            bump_epoch(inner, &ch, &epoch).await;
        }
        let batch = link.take_dirty();
        if batch.is_empty() {
            tokio::select! {
                _ = link.wake.notified() => {}
                _ = ping.tick() => {
                    link.round_trip.start();
                    match tokio::time::timeout(PING_TIMEOUT, sink.ping()).await {
                        Ok(r) => {
                            r?;
                            link.round_trip.finish();
                        }
                        Err(_) => return Err(redis::RedisError::from((redis::ErrorKind::Io, "no PONG on the pub/sub connection"))),
                    }
                }
            }
            continue;
        }
        let (mut subscribe, mut sync, mut unsubscribe) = (Vec::new(), Vec::new(), Vec::new());
        {
            let mut entries = link.entries.lock();
            for ch in batch {
                let Some(e) = entries.get(&ch).cloned() else { continue };
                let mut t = e.track.lock();
                match (t.count > 0, t.redis_subscribed) {
                    (true, false) => subscribe.push(ch),
                    (true, true) if !t.active => sync.push(ch),
                    (false, true) => {
                        // A subscriber arriving while the UNSUBSCRIBE is in flight must wait
                        // for the subscription that follows it, not trust this one.
                        t.active = false;
                        unsubscribe.push(ch);
                    }
                    (false, false) => {
                        drop(t);
                        entries.remove(&ch);
                    }
                    (true, true) => {}
                }
            }
        }
        for chunk in unsubscribe.chunks(SUBSCRIBE_CHUNK) {
            let names: Vec<String> = chunk.iter().map(|ch| inner.keys.pubsub(ch)).collect();
            sink.unsubscribe(&names).await?;
            let mut entries = link.entries.lock();
            for ch in chunk {
                let Some(e) = entries.get(ch).cloned() else { continue };
                let mut t = e.track.lock();
                // Unsubscribed: what arrives for it from now on is not seen, so its tracking
                // restarts from scratch if it is subscribed again.
                t.redis_subscribed = false;
                t.active = false;
                t.start_over();
                if t.count == 0 {
                    drop(t);
                    entries.remove(ch);
                } else {
                    link.dirty.lock().push(ch.clone());
                }
            }
        }
        let mut refused = HashSet::new();
        for chunk in subscribe.chunks(SUBSCRIBE_CHUNK) {
            let names: Vec<String> = chunk.iter().map(|ch| inner.keys.pubsub(ch)).collect();
            refused.extend(sink.subscribe(&names).await?.0);
            let entries = link.entries.lock();
            for ch in chunk {
                if let Some(e) = entries.get(ch) {
                    let mut t = e.track.lock();
                    t.refused = refused.contains(&inner.keys.pubsub(ch));
                    t.redis_subscribed = !t.refused;
                    drop(t);
                    e.changed.notify_waiters();
                }
            }
        }
        if !refused.is_empty() {
            subscribe.retain(|ch| !refused.contains(&inner.keys.pubsub(ch)));
        }
        sync.extend(subscribe);
        if sync.is_empty() {
            continue;
        }
        // Positions read after the SUBSCRIBE took effect: every later publication arrives on
        // the pub/sub connection. Concurrent reads share (are pipelined on) one connection.
        let reads = futures_util::future::join_all(sync.iter().map(|ch| inner.position(ch))).await;
        let mut missed = Vec::new();
        for (ch, read) in sync.iter().zip(reads) {
            let (position, _) = read
                .map_err(|e| redis::RedisError::from((redis::ErrorKind::Io, "position read failed", e.to_string())))?;
            let Some(e) = link.entries.lock().get(ch).cloned() else { continue };
            let mut t = e.track.lock();
            if !t.redis_subscribed {
                continue;
            }
            let mut rolled_back = false;
            let lost = match &t.epoch {
                None => {
                    t.delivered = position.offset;
                    false
                }
                Some(epoch) if *epoch != position.epoch => {
                    t.delivered = position.offset;
                    true
                }
                Some(_) => {
                    // Ahead: publications went by while unsubscribed. Behind after a reconnect:
                    // the server lost some and may reuse their offsets — an epoch change.
                    // (Without a reconnect, deliveries may already be past the position read,
                    // which is not a loss.)
                    // After a reconnect, compared with what was delivered when it dropped:
                    // deliveries on the new connection may already be past the position read.
                    let lost = t.resync && position.offset != t.before;
                    rolled_back = t.resync && position.offset < t.before;
                    let moved_on = t.resync && t.delivered != t.before;
                    t.delivered = match lost && !moved_on {
                        true => position.offset,
                        false => t.delivered.max(position.offset),
                    };
                    lost
                }
            };
            if lost {
                t.seen = 0;
            }
            if rolled_back {
                link.rollbacks.lock().push((ch.clone(), position.epoch.clone()));
                link.wake.notify_one();
            }
            t.epoch = Some(position.epoch);
            t.resync = false;
            t.active = true;
            drop(t);
            e.changed.notify_waiters();
            if lost {
                missed.push(ch.clone());
            }
        }
        if let Some(h) = inner.handler.get() {
            if !missed.is_empty() {
                tracing::warn!(channels = missed.len(), "publications missed while resubscribing; subscribers recover");
                for ch in &missed {
                    h.on_missed(ch);
                }
                h.after_publications();
            }
        }
    }
}

/// Replaces `channel`'s epoch in Redis if it is still `epoch` (see the module docs). A
/// failure is logged: the subscribers recover anyway, only the epoch stays.
async fn bump_epoch(inner: &Inner, channel: &str, epoch: &str) {
    let mut call = inner.scripts.epoch_bump.prepare_invoke();
    call.key(inner.keys.meta(channel)).arg(epoch).arg(super::new_epoch());
    match inner.read::<i64>(&call).await {
        Ok(1) => tracing::warn!(channel, old = epoch, "offsets reused after a rollback: new epoch"),
        Ok(_) => {}
        Err(e) => tracing::warn!(channel, error = %e, "epoch not replaced after a rollback"),
    }
}

/// Hands every message to the handler until the connection ends.
async fn consume(inner: &Inner, mut source: Source) {
    while let Some(event) = source.next().await {
        handle(inner, event);
        for _ in 1..BURST {
            match source.try_next() {
                Some(Some(event)) => handle(inner, event),
                Some(None) => break,
                None => break,
            }
        }
        if let Some(h) = inner.handler.get() {
            h.after_publications();
        }
    }
}

fn handle(inner: &Inner, event: Event) {
    match event {
        Event::Message(msg) => deliver(inner, &msg),
        Event::Dropped(name) => dropped(inner, &name),
    }
}

/// A cluster node ended a channel's subscription (its slot moved): if it was delivering, its
/// subscribers recover, and resubscribe where the slot is served now.
fn dropped(inner: &Inner, name: &str) {
    let Some(channel) = inner.keys.channel_of_pubsub(name) else { return };
    let Some(entry) = inner.link.entries.lock().get(channel).cloned() else { return };
    let mut t = entry.track.lock();
    // Not active: our own unsubscribe (its confirmation arrives here too).
    if !t.active || t.count == 0 {
        return;
    }
    t.active = false;
    t.redis_subscribed = false;
    t.refused = true;
    drop(t);
    entry.changed.notify_waiters();
    tracing::warn!(channel, "redis cluster moved the channel's slot; subscribers recover");
    if let Some(h) = inner.handler.get() {
        h.on_missed(channel);
        h.after_publications();
    }
}

fn deliver(inner: &Inner, msg: &redis::Msg) {
    let Some(channel) = inner.keys.channel_of_pubsub(msg.get_channel_name()) else { return };
    switchboard_supervisor::fault::hit("redis.link.deliver", channel);
    let Some(handler) = inner.handler.get() else { return };
    let payload = msg.get_payload_bytes();
    match payload.first() {
        Some(kind @ (b'p' | b'h' | b'P' | b'H')) => {
            let Some((epoch, publication)) = parse_publication(&payload[1..], *kind) else {
                tracing::warn!(channel, "malformed publication from redis");
                return;
            };
            let Some(entry) = inner.link.entries.lock().get(channel).cloned() else { return };
            let mut t = entry.track.lock();
            let gap = match &t.epoch {
                None => false,
                Some(e) if **e != *epoch => true,
                // At or below what this stream already brought: the offsets were reused.
                Some(_) if publication.offset <= t.seen => {
                    tracing::warn!(
                        channel,
                        seen = t.seen,
                        got = publication.offset,
                        "offsets went backwards; new epoch"
                    );
                    inner.link.rollbacks.lock().push((Arc::from(channel), Arc::from(epoch)));
                    inner.link.wake.notify_one();
                    true
                }
                // Already covered by the position read when the subscription started.
                Some(_) if publication.offset <= t.delivered => return,
                Some(_) => publication.offset != t.delivered + 1,
            };
            if gap {
                // Before delivering: a subscriber must not see an offset past the hole.
                tracing::warn!(
                    channel,
                    after = t.delivered,
                    got = publication.offset,
                    "offset gap; subscribers recover"
                );
                handler.on_missed(channel);
            }
            handler.on_publication(channel, &publication);
            if t.epoch.as_deref() != Some(epoch) {
                t.epoch = Some(Arc::from(epoch));
            }
            t.delivered = publication.offset;
            t.seen = publication.offset;
            drop(t);
            entry.changed.notify_waiters();
        }
        Some(kind @ (b'j' | b'l')) => {
            #[derive(serde::Deserialize)]
            struct Info {
                client: String,
                #[serde(default)]
                user: String,
            }
            if let Ok(i) = serde_json::from_slice::<Info>(&payload[1..]) {
                handler.on_presence(channel, &ClientInfo { client: i.client, user: i.user }, *kind == b'j');
            }
        }
        _ => tracing::warn!(channel, "unknown message from redis"),
    }
}

/// `<epoch> <offset> <ms> <data>` → the epoch and the publication. The message's `kind` says
/// the rest: `h` rather than `p` for a historical one, upper case for one with tags, which come
/// before the data as `<length> <tags JSON>`.
fn parse_publication(b: &[u8], kind: u8) -> Option<(&str, Publication)> {
    let text = std::str::from_utf8(b).ok()?;
    let tagged = kind.is_ascii_uppercase();
    let mut parts = text.splitn(if tagged { 5 } else { 4 }, ' ');
    let epoch = parts.next()?;
    let offset = parts.next()?.parse().ok()?;
    let time_ms = parts.next()?.parse().ok()?;
    let (tags, data) = match tagged {
        true => {
            let len: usize = parts.next()?.parse().ok()?;
            let rest = parts.next()?;
            (super::tags_of(rest.get(..len)?), rest.get(len..)?)
        }
        false => (None, parts.next()?),
    };
    let data = RawValue::from_string(data.to_string()).ok()?;
    let historical = kind.eq_ignore_ascii_case(&b'h');
    Some((epoch, Publication { offset, data: Arc::new(data), time_ms, historical, tags }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_redis_parses_publication_messages() {
        let (epoch, p) = parse_publication(b"ab12 42 1700000000000 {\"v\": \"a b\"}", b'p').unwrap();
        assert_eq!(epoch, "ab12");
        assert_eq!((p.offset, p.time_ms, p.data.get()), (42, 1_700_000_000_000, "{\"v\": \"a b\"}"));
        assert!(!p.historical && p.tags.is_none());
        assert!(parse_publication(b"ab12 x 1 1", b'p').is_none());
        assert!(parse_publication(b"ab12 1 1 {not json", b'p').is_none());
        let tags = r#"{"a b":"c d"}"#;
        let msg = format!("ab12 43 1 {} {tags}[1, 2]", tags.len());
        let (_, p) = parse_publication(msg.as_bytes(), b'H').unwrap();
        assert_eq!((p.offset, p.data.get(), p.historical), (43, "[1, 2]", true));
        assert_eq!(p.tags.unwrap().get("a b").map(String::as_str), Some("c d"));
        assert!(parse_publication(b"ab12 43 1 99 {}[1]", b'P').is_none(), "tags longer than the message");
    }
}
