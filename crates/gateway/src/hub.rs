//! [`Hub`]: which local connections subscribe to which channel, and the fan-out.
//!
//! A publication is encoded once per wire format in use on the channel, framed once, and the
//! same bytes are pushed into every subscriber's [`Outbox`]. Each subscriber has its [`Rule`]:
//! every publication, sampled ones, those its filter on tags matches, or Fossil deltas (the
//! delta computed once per publication and shared by the channel's delta subscribers). Pushing only queues; the socket
//! writes happen in [`Hub::flush_pending`], which the broker calls (`after_publications`) once
//! per batch or burst it delivered, after it released the channel lock; they are spread over
//! the runtime's workers when many connections are involved.
//!
//! Internal channels (`$…`, see [`InternalHandler`]) carry messages between nodes; they reach
//! the internal handler registered for their prefix, never the fan-out.
//!
//! The fan-out runs in the publisher's task (an HTTP request, a source, the Redis link), so
//! what is done for one subscriber (its push, its sampling) is isolated: a panic there closes
//! that subscriber with 4008 (it reconnects and recovers) and the others are served as usual.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use indexmap::IndexMap;
use parking_lot::{Mutex, RwLock};
use switchboard_broker::{BrokerHandler, ClientInfo, Data, Publication};
use switchboard_protocol::code::close;
use switchboard_protocol::message::{
    encode_delta_publication, encode_presence, encode_publication, encode_unsubscribed, PresenceEvent,
};
use switchboard_protocol::Format;
use switchboard_supervisor::{fault, isolate};

use crate::message::{pub_of, Kind};
use crate::metrics::Metrics;
use crate::outbox::{Delivery, Frame, Outbox, Pushed};
use crate::sampling::{Offer, PointView, Sampler, Sampling};
use switchboard_protocol::filter::Filter;

const SHARDS: usize = 64;
/// Connections flushed by one task; larger flush lists are split across the workers.
const FLUSH_CHUNK: usize = 512;

struct Subscribers {
    /// What the tap keeps for this channel ([`Hub::set_tap_slot`]); an entry with a slot and
    /// no subscriber stays, so that the channel's publications still find it in one lookup.
    tap: Option<TapSlot>,
    conflate: bool,
    /// Keyed by connection id; `IndexMap` iterates like a `Vec` and removes in O(1).
    conns: IndexMap<u64, Arc<Outbox>>,
    /// Subscribers that asked for a rate or a deadband ([`crate::sampling`]), kept apart so
    /// that the others' fan-out never pays for them.
    sampled: IndexMap<u64, Arc<Sampler>>,
    /// Subscribers with a filter on tags: sent only the publications it matches.
    filtered: IndexMap<u64, (Arc<Outbox>, Arc<Filter>)>,
    /// Subscribers of Fossil deltas ([`Rule::Delta`]).
    delta: IndexMap<u64, Arc<Outbox>>,
    /// The channel's previous publication, which its next one's delta is computed against;
    /// kept only while the channel has delta subscribers.
    delta_base: Mutex<Option<(u64, Data)>>,
    msgpack: usize,
}

impl Subscribers {
    fn new(conflate: bool) -> Subscribers {
        Subscribers {
            tap: None,
            conflate,
            conns: IndexMap::new(),
            sampled: IndexMap::new(),
            filtered: IndexMap::new(),
            delta: IndexMap::new(),
            delta_base: Mutex::new(None),
            msgpack: 0,
        }
    }

    fn len(&self) -> usize {
        self.conns.len() + self.sampled.len() + self.filtered.len() + self.delta.len()
    }

    fn outboxes(&self) -> impl Iterator<Item = &Arc<Outbox>> {
        self.conns
            .values()
            .chain(self.sampled.values().map(|s| &s.outbox))
            .chain(self.filtered.values().map(|f| &f.0))
            .chain(self.delta.values())
    }
}

/// Which of a channel's publications a subscriber is sent ([`Hub::add`]).
#[derive(Debug, Clone)]
pub enum Rule {
    /// Every one (or, on a conflating channel, the latest when it falls behind).
    Every,
    /// At most a rate, or past a deadband ([`crate::sampling`]).
    Sampled(Sampling),
    /// Those whose tags the filter matches.
    Filtered(Arc<Filter>),
    /// Every one, as a Fossil delta against the channel's previous publication when that is
    /// smaller (docs/protocol.md, "Deltas"); only on channels that do not conflate.
    Delta,
}

/// Receives publications on internal channels: names starting with `$`, which no client can
/// publish or subscribe to (channel names exclude `$`, and every client path validates them),
/// so only nodes publish there, through the broker. They skip the fan-out and the
/// publication metrics. Called as [`BrokerHandler::on_publication`] is, possibly under the
/// broker's channel lock: must not block or call into the broker (spawn work instead).
pub trait InternalHandler: Send + Sync + 'static {
    fn on_internal(&self, channel: &str, data: &Data);
}

/// What a [`PublicationTap`] keeps for one channel, held in the hub's entry for the channel so
/// that a publication's one lookup serves both the fan-out and the tap.
pub type TapSlot = Arc<dyn std::any::Any + Send + Sync>;

/// Sees every publication (not internal) the broker hands this node, before its fan-out: the
/// alarm engine evaluates them there. Called as [`BrokerHandler::on_publication`] is, possibly
/// under the broker's channel lock, and under the hub's lock of the channel's shard: must not
/// block, call into the broker, or change the hub (no [`Hub::set_tap_slot`]).
pub trait PublicationTap: Send + Sync + 'static {
    /// `slot`: what the tap set for `channel` with [`Hub::set_tap_slot`], if anything.
    fn on_publication(&self, channel: &str, slot: Option<&TapSlot>, publication: &Publication);
}

/// Local subscriptions and fan-out. One per node.
pub struct Hub {
    shards: Vec<RwLock<HashMap<Arc<str>, Subscribers>>>,
    /// Channels with at least one local subscriber, kept as they gain their first and lose
    /// their last (under their shard's lock), so that the count a subscribe checks against
    /// `limits.max_channels` costs nothing however many channels the node holds.
    live: AtomicUsize,
    /// Outboxes that were scheduled by pushes and still need a flush.
    pending: Mutex<Vec<Arc<Outbox>>>,
    metrics: Arc<Metrics>,
    /// Where internal channels go, by channel-name prefix; a channel no prefix matches is
    /// dropped. Set at start, read on every internal publication (a short list).
    internal: RwLock<Vec<(&'static str, Arc<dyn InternalHandler>)>>,
    /// Set once at start when the node evaluates alarms.
    tap: std::sync::OnceLock<Arc<dyn PublicationTap>>,
}

impl Hub {
    pub fn new(metrics: Arc<Metrics>) -> Hub {
        Hub {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            live: AtomicUsize::new(0),
            pending: Mutex::new(Vec::new()),
            metrics,
            internal: RwLock::new(Vec::new()),
            tap: std::sync::OnceLock::new(),
        }
    }

    /// Sends internal channels whose names start with `prefix` (`$write:`) to `handler`.
    pub fn add_internal(&self, prefix: &'static str, handler: Arc<dyn InternalHandler>) {
        self.internal.write().push((prefix, handler));
    }

    /// Hands every publication to `tap` before its fan-out (set once; later calls are ignored).
    pub fn set_tap(&self, tap: Arc<dyn PublicationTap>) {
        let _ = self.tap.set(tap);
    }

    /// Sets (or with `None` clears) what the tap keeps for `channel`, handed to it with each
    /// of the channel's publications.
    pub fn set_tap_slot(&self, channel: &str, slot: Option<TapSlot>) {
        let mut shard = self.shard(channel).write();
        match slot {
            Some(slot) => shard.entry(Arc::from(channel)).or_insert_with(|| Subscribers::new(false)).tap = Some(slot),
            None => {
                if let Some(subs) = shard.get_mut(channel) {
                    subs.tap = None;
                    if subs.len() == 0 {
                        shard.remove(channel);
                    }
                }
            }
        }
    }

    fn shard(&self, channel: &str) -> &RwLock<HashMap<Arc<str>, Subscribers>> {
        let mut h = DefaultHasher::new();
        channel.hash(&mut h);
        &self.shards[(h.finish() as usize) % SHARDS]
    }

    /// Adds a subscriber, sent the publications its `rule` selects. Returns true when it is the
    /// channel's first on this node.
    pub fn add(&self, channel: &Arc<str>, outbox: &Arc<Outbox>, conflate: bool, rule: Rule) -> bool {
        let mut shard = self.shard(channel).write();
        let subs = shard.entry(channel.clone()).or_insert_with(|| Subscribers::new(conflate));
        let first = subs.len() == 0;
        if first {
            // An entry made for the tap alone takes its first subscriber's delivery rule.
            subs.conflate = conflate;
        }
        let new = match rule {
            Rule::Every => subs.conns.insert(outbox.id, outbox.clone()).is_none(),
            Rule::Sampled(s) => subs.sampled.insert(outbox.id, Arc::new(Sampler::new(s, outbox.clone()))).is_none(),
            Rule::Filtered(f) => subs.filtered.insert(outbox.id, (outbox.clone(), f)).is_none(),
            Rule::Delta => subs.delta.insert(outbox.id, outbox.clone()).is_none(),
        };
        if new && outbox.format == Format::Msgpack {
            subs.msgpack += 1;
        }
        if first && new {
            self.live.fetch_add(1, Relaxed);
        }
        first
    }

    /// Removes a subscriber. Returns true when the channel has no local subscriber left.
    pub fn remove(&self, channel: &str, conn: u64) -> bool {
        let mut shard = self.shard(channel).write();
        let Some(subs) = shard.get_mut(channel) else { return false };
        let gone = subs
            .conns
            .swap_remove(&conn)
            .or_else(|| subs.sampled.swap_remove(&conn).map(|s| s.outbox.clone()))
            .or_else(|| subs.filtered.swap_remove(&conn).map(|f| f.0))
            .or_else(|| subs.delta.swap_remove(&conn));
        if subs.delta.is_empty() {
            *subs.delta_base.lock() = None;
        }
        if gone.as_ref().is_some_and(|ob| ob.format == Format::Msgpack) {
            subs.msgpack -= 1;
        }
        if gone.is_some() && subs.len() == 0 {
            self.live.fetch_sub(1, Relaxed);
        }
        if subs.len() == 0 {
            if subs.tap.is_none() {
                shard.remove(channel);
            }
            true
        } else {
            false
        }
    }

    pub fn subscriber_count(&self, channel: &str) -> usize {
        self.shard(channel).read().get(channel).map_or(0, Subscribers::len)
    }

    /// Channels with local subscribers.
    pub fn channel_count(&self) -> usize {
        self.live.load(Relaxed)
    }

    /// `p`: the publication (its data read by deadbands, its tags by filters). `tap`: called
    /// first with the channel's slot, from the same lookup.
    ///
    /// A historical publication (a value from before the channel's newest) goes only to
    /// subscribers that get every publication: a conflating channel's slot, a rate or a
    /// deadband keep the current value, which a historical one must never displace. Those
    /// subscribers read it from history or the trend, as they read what conflation skipped.
    fn fan_out(
        &self,
        channel: &str,
        p: &Publication,
        tap: impl FnOnce(Option<&TapSlot>),
        make: impl Fn(Format) -> Delivery,
    ) {
        let historical = p.historical;
        let shard = self.shard(channel).read();
        let subs = shard.get(channel);
        tap(subs.and_then(|s| s.tap.as_ref()));
        let Some(subs) = subs else { return };
        if subs.len() == 0 || (historical && subs.conflate) {
            return;
        }
        // Encoded once per format, when a subscriber first needs it (delta subscribers need
        // their own forms).
        let (json, mp) = (std::cell::OnceCell::new(), std::cell::OnceCell::new());
        let pick = |format| match format {
            Format::Json => json.get_or_init(|| make(Format::Json)),
            Format::Msgpack => mp.get_or_init(|| make(Format::Msgpack)),
        };
        let mut scheduled = Vec::new();
        let mut failed = Vec::new();
        let matching = subs.filtered.values().filter(|(_, f)| f.matches(p.tags.as_deref())).map(|(ob, _)| ob);
        for ob in subs.conns.values().chain(matching) {
            let d = pick(ob.format);
            match isolate("fanout", || {
                fault::hit("hub.deliver", ob.id);
                ob.push(d.clone(), subs.conflate)
            }) {
                Ok(Pushed::Schedule) => scheduled.push(ob.clone()),
                Ok(_) => {}
                Err(_) => failed.push(ob.clone()),
            }
        }
        if !subs.delta.is_empty() {
            self.fan_out_deltas(channel, p, subs, &mut scheduled, &mut failed);
        }
        if !subs.sampled.is_empty() && !historical {
            let now = Instant::now();
            let point = PointView::of(p.data.get());
            for s in subs.sampled.values() {
                let d = pick(s.outbox.format);
                let offered = isolate("fanout", || {
                    fault::hit("hub.deliver", s.outbox.id);
                    match s.offer(d, &point, now) {
                        Offer::Send => s.outbox.push(d.clone(), subs.conflate) == Pushed::Schedule,
                        Offer::HoldAndArm(after) => {
                            s.arm(after, subs.conflate);
                            false
                        }
                        Offer::Skip | Offer::Held => false,
                    }
                });
                match offered {
                    Ok(true) => scheduled.push(s.outbox.clone()),
                    Ok(false) => {}
                    Err(_) => failed.push(s.outbox.clone()),
                }
            }
        }
        drop(shard);
        for ob in failed {
            // Its queue may miss this publication: the client reconnects and recovers it.
            ob.close(close::SLOW_CONSUMER, "internal error delivering a publication; reconnect and recover", true);
        }
        if !scheduled.is_empty() {
            let mut pending = self.pending.lock();
            if pending.is_empty() {
                *pending = scheduled;
            } else {
                pending.extend(scheduled);
            }
        }
    }

    /// The fan-out to delta subscribers: the publication's JSON text whole, and its Fossil
    /// delta against the channel's previous publication when that is the one just before it and
    /// the delta is smaller and valid UTF-8 (JSON carries it as a string), each framed once per
    /// format in use; each subscriber's outbox sends the delta only when it sent that previous
    /// one ([`Outbox::push_delta`]).
    fn fan_out_deltas(
        &self,
        channel: &str,
        p: &Publication,
        subs: &Subscribers,
        scheduled: &mut Vec<Arc<Outbox>>,
        failed: &mut Vec<Arc<Outbox>>,
    ) {
        let text = p.data.get();
        let before = subs.delta_base.lock().replace((p.offset, p.data.clone()));
        let diff = before
            .filter(|(off, _)| off + 1 == p.offset)
            .map(|(_, before)| fossil_delta::delta(text, before.get()))
            .filter(|d| d.len() < text.len() && std::str::from_utf8(d).is_ok());
        let born = Instant::now();
        let ch: Arc<str> = Arc::from(channel);
        let frames = |format| {
            let whole = encode_delta_publication(format, pub_of(channel, p), text.as_bytes(), false);
            let delta = diff.as_ref().map(|d| encode_delta_publication(format, pub_of(channel, p), d, true));
            let whole = Delivery { frame: Frame::message(format, &whole), channel: ch.clone(), offset: p.offset, born };
            (whole, delta.map(|d| Frame::message(format, &d)))
        };
        let mp = subs.delta.values().any(|ob| ob.format == Format::Msgpack).then(|| frames(Format::Msgpack));
        let json = subs.delta.values().any(|ob| ob.format == Format::Json).then(|| frames(Format::Json));
        for ob in subs.delta.values() {
            let Some((whole, delta)) = (match ob.format {
                Format::Json => json.as_ref(),
                Format::Msgpack => mp.as_ref(),
            }) else {
                continue;
            };
            match isolate("fanout", || {
                fault::hit("hub.deliver", ob.id);
                ob.push_delta(whole.clone(), delta.as_ref())
            }) {
                Ok(Pushed::Schedule) => scheduled.push(ob.clone()),
                Ok(_) => {}
                Err(_) => failed.push(ob.clone()),
            }
        }
    }

    /// Writes to every connection scheduled by earlier pushes. Large lists are cut into
    /// chunks flushed concurrently on the runtime's workers; the last chunk runs inline.
    pub fn flush_pending(&self) {
        let list = std::mem::take(&mut *self.pending.lock());
        if list.len() <= FLUSH_CHUNK || tokio::runtime::Handle::try_current().is_err() {
            for ob in &list {
                ob.flush();
            }
            return;
        }
        let mut chunks: Vec<Vec<Arc<Outbox>>> = Vec::new();
        let mut rest = list;
        while rest.len() > FLUSH_CHUNK {
            let tail = rest.split_off(rest.len() - FLUSH_CHUNK);
            chunks.push(tail);
        }
        for chunk in chunks {
            tokio::spawn(async move {
                for ob in &chunk {
                    ob.flush();
                }
            });
        }
        for ob in &rest {
            ob.flush();
        }
    }
}

impl BrokerHandler for Hub {
    fn on_publication(&self, channel: &str, p: &Publication) {
        if channel.starts_with('$') {
            let handler = self.internal.read().iter().find(|(p, _)| channel.starts_with(p)).map(|(_, h)| h.clone());
            if let Some(h) = handler {
                h.on_internal(channel, &p.data);
            }
            return;
        }
        self.metrics.publications.fetch_add(1, Relaxed);
        let tap = |slot: Option<&TapSlot>| {
            // A historical value is not the channel's current one: alarms never see it.
            if let (Some(tap), false) = (self.tap.get(), p.historical) {
                // A failure there is the tap's: the fan-out goes on.
                let _ = isolate("tap", || tap.on_publication(channel, slot, p));
            }
        };
        let born = Instant::now();
        let ch: Arc<str> = Arc::from(channel);
        self.fan_out(channel, p, tap, |format| {
            let payload = encode_publication(format, pub_of(channel, p));
            Delivery { frame: Frame::message(format, &payload), channel: ch.clone(), offset: p.offset, born }
        });
    }

    /// The broker calls this once per group of deliveries (a batch, a burst from Redis), so a
    /// connection subscribed to many of the group's channels gets them in one write.
    fn after_publications(&self) {
        self.flush_pending();
    }

    fn on_presence(&self, channel: &str, info: &ClientInfo, joined: bool) {
        let shard = self.shard(channel).read();
        let Some(subs) = shard.get(channel) else { return };
        let ev = || PresenceEvent { ch: channel, client: &info.client, user: &info.user };
        let json = Frame::message(Format::Json, &encode_presence(Format::Json, joined, ev()));
        let mp = (subs.msgpack > 0)
            .then(|| Frame::message(Format::Msgpack, &encode_presence(Format::Msgpack, joined, ev())));
        let mut scheduled = Vec::new();
        for ob in subs.outboxes() {
            let frame = match (ob.format, &mp) {
                (Format::Msgpack, Some(f)) => f,
                _ => &json,
            };
            let kind = if joined { Kind::Join } else { Kind::Leave };
            if ob.push_frame(frame, kind) == Pushed::Schedule {
                scheduled.push(ob.clone());
            }
        }
        drop(shard);
        self.pending.lock().extend(scheduled);
    }

    /// The broker could not deliver every publication of `channel` to this node (an offset
    /// gap, a new epoch after a Redis restart, publications made while the node's Redis link
    /// was down). Each subscriber recovers what it missed from history with its last offset:
    /// a WebSocket client loses just this subscription, with an `unsubscribed` push after what
    /// it was sent before the hole, and subscribes it again (its other channels keep
    /// streaming); a client that cannot subscribe again on its connection (SSE, long-polling)
    /// is disconnected with 4008 and `reconnect: true`.
    fn on_missed(&self, channel: &str) {
        const REASON: &str = "publications may have been missed; subscribe again with recover";
        let mut closing: Vec<Arc<Outbox>> = Vec::new();
        let mut ended: Vec<Arc<Outbox>> = Vec::new();
        {
            let mut shard = self.shard(channel).write();
            let Some(subs) = shard.get_mut(channel) else { return };
            let had = subs.len() > 0;
            subs.conns.retain(|_, ob| keep_unless_resubscribes(ob, &mut ended, &mut closing));
            subs.sampled.retain(|_, s| keep_unless_resubscribes(&s.outbox, &mut ended, &mut closing));
            subs.filtered.retain(|_, f| keep_unless_resubscribes(&f.0, &mut ended, &mut closing));
            subs.delta.retain(|_, ob| keep_unless_resubscribes(ob, &mut ended, &mut closing));
            subs.msgpack -= ended.iter().filter(|ob| ob.format == Format::Msgpack).count();
            if had && subs.len() == 0 {
                self.live.fetch_sub(1, Relaxed);
            }
            if subs.len() == 0 && subs.tap.is_none() {
                shard.remove(channel);
            }
        }
        if !ended.is_empty() {
            let ch: Arc<str> = Arc::from(channel);
            let json =
                Frame::message(Format::Json, &encode_unsubscribed(Format::Json, channel, close::SLOW_CONSUMER, REASON));
            let mp = ended.iter().any(|ob| ob.format == Format::Msgpack).then(|| {
                Frame::message(
                    Format::Msgpack,
                    &encode_unsubscribed(Format::Msgpack, channel, close::SLOW_CONSUMER, REASON),
                )
            });
            let mut scheduled = Vec::new();
            for ob in ended.iter() {
                let frame = match (ob.format, &mp) {
                    (Format::Msgpack, Some(f)) => f,
                    _ => &json,
                };
                if ob.end_subscription(&ch, frame) == Pushed::Schedule {
                    scheduled.push(ob.clone());
                }
            }
            self.metrics.recover_unsubscribes.fetch_add(ended.len() as u64, Relaxed);
            self.pending.lock().extend(scheduled);
        }
        self.metrics.recover_disconnects.fetch_add(closing.len() as u64, Relaxed);
        for ob in closing {
            ob.close(close::SLOW_CONSUMER, "publications may have been missed; reconnect and recover", false);
        }
    }
}

/// Sorts one subscriber of a channel with missed publications: those that can subscribe again
/// leave the channel (`ended`), the others stay until their connection closes (`closing`).
fn keep_unless_resubscribes(ob: &Arc<Outbox>, ended: &mut Vec<Arc<Outbox>>, closing: &mut Vec<Arc<Outbox>>) -> bool {
    if ob.resubscribes() {
        ended.push(ob.clone());
        false
    } else {
        closing.push(ob.clone());
        true
    }
}

#[cfg(test)]
mod tests;
