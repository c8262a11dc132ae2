//! [`MemoryBroker`]: the embedded broker of a single node. Nothing survives a restart, so every
//! channel gets a fresh random epoch when it is first used in a process: a client recovering
//! with an offset from before the restart learns `complete: false` instead of silently missing
//! publications.

mod kept;
mod keys;
mod presence;
mod sessions;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::records::RecordSets;
use crate::trend::{sample, TrendRing};
use crate::{
    now_ms, Broker, BrokerError, BrokerHandler, ChannelPage, ChannelQuery, ChannelSummary, ClientInfo, HistoryPolicy,
    HistoryResult, LogEntry, LogKeep, Outgoing, Position, Publication, Record, RecordPut, TrendBucket, TrendPolicy,
    UNPUBLISHED_KEEP,
};
use keys::RecentKeys;

/// One channel's stream. Guarded by its own mutex so channels never wait on each other.
struct Stream {
    epoch: Arc<str>,
    offset: u64,
    history: VecDeque<Publication>,
    last: Option<Publication>,
    /// Local subscriptions ([`Broker::subscribe`] calls not yet undone).
    subscribers: usize,
    /// When the stream was created, last published or last left by a subscriber (ms): what
    /// [`Broker::forget_idle`] measures idleness from.
    touched_ms: u64,
    /// History TTL of the last publication's namespace (reads expire with it).
    history_ttl_ms: u64,
    /// Numeric values downsampled, one ring per trend tier of the namespace (by step).
    trends: Vec<(TrendPolicy, TrendRing)>,
    /// Idempotency keys of recent publications, with the position each got; allocated with
    /// the channel's first key, so channels published without keys carry none.
    keys: Option<Box<RecentKeys>>,
}

impl Stream {
    fn new() -> Stream {
        Stream {
            epoch: new_epoch(),
            offset: 0,
            history: VecDeque::new(),
            last: None,
            subscribers: 0,
            touched_ms: now_ms(),
            history_ttl_ms: u64::MAX,
            trends: Vec::new(),
            keys: None,
        }
    }

    fn position(&self) -> Position {
        Position { epoch: self.epoch.clone(), offset: self.offset }
    }

    /// The trend ring of `tier` (made on first use).
    fn ring(&mut self, tier: TrendPolicy) -> &mut TrendRing {
        match self.trends.iter().position(|(p, _)| p.step_ms == tier.step_ms) {
            Some(i) => &mut self.trends[i].1,
            None => {
                self.trends.push((tier, TrendRing::default()));
                &mut self.trends.last_mut().expect("just pushed").1
            }
        }
    }

    fn expire(&mut self, policy_ttl_ms: u64, now: u64) {
        while let Some(front) = self.history.front() {
            if now.saturating_sub(front.time_ms) > policy_ttl_ms {
                self.history.pop_front();
            } else {
                break;
            }
        }
    }
}

fn new_epoch() -> Arc<str> {
    format!("{:08x}", fastrand::u32(..)).into()
}

/// The channels: found by name in the hash map on every publication; `names` keeps them in
/// order for paged listings and changes only when a channel is created or forgotten.
#[derive(Default)]
struct Table {
    map: HashMap<Arc<str>, Arc<Mutex<Stream>>>,
    names: BTreeSet<Arc<str>>,
}

/// The in-memory broker.
///
/// Locking: the channel table's `RwLock` is held (shared) to find or create a stream and, by
/// publishing and subscribing, until the stream's own lock is taken, so that
/// [`Broker::forget_idle`] (exclusive) never removes a stream someone is about to use; a
/// stream's `Mutex` is held across offset assignment, history append and the handler's
/// `on_publication` (which only enqueues), which is what makes those one atomic step. The
/// handler's `after_publications` (socket writes) runs after the stream lock is released.
/// Lock order: `streams` table, then one stream, then a `presence` shard.
pub struct MemoryBroker {
    streams: RwLock<Table>,
    /// The most channels held at once; creating one more fails with [`BrokerError::Full`].
    max_channels: usize,
    presence: presence::PresenceTable,
    records: RecordSets,
    /// Tables and logs ([`crate::kept`]), in files when [`MemoryBroker::keeping_in`] named a directory.
    kept: kept::Kept,
    /// Idempotency keys held over all channels (bounded by [`crate::MAX_KEYS`]).
    keys_held: AtomicUsize,
    sessions: sessions::MemorySessions,
    handler: OnceLock<Arc<dyn BrokerHandler>>,
}

impl Default for MemoryBroker {
    fn default() -> MemoryBroker {
        MemoryBroker::with_max_channels(usize::MAX)
    }
}

impl MemoryBroker {
    pub fn new() -> MemoryBroker {
        MemoryBroker::default()
    }

    /// A broker that holds at most `max` channels: past it, publishing to or subscribing a new
    /// channel fails with [`BrokerError::Full`] while existing channels keep working.
    pub fn with_max_channels(max: usize) -> MemoryBroker {
        MemoryBroker {
            streams: RwLock::default(),
            max_channels: max,
            presence: presence::PresenceTable::default(),
            records: RecordSets::default(),
            kept: kept::Kept::default(),
            keys_held: AtomicUsize::new(0),
            sessions: sessions::MemorySessions::default(),
            handler: OnceLock::new(),
        }
    }

    /// Keeps tables and logs ([`crate::kept`]) in files under `dir`, so that they outlive the
    /// process (channels still do not).
    pub fn keeping_in(mut self, dir: std::path::PathBuf) -> MemoryBroker {
        self.kept = kept::Kept::in_dir(dir);
        self
    }

    /// Creates the channel's stream in `table` unless the ceiling is reached.
    fn create<'t>(&self, table: &'t mut Table, channel: &str) -> Result<&'t Arc<Mutex<Stream>>, BrokerError> {
        if !table.map.contains_key(channel) {
            if table.map.len() >= self.max_channels {
                return Err(BrokerError::Full(format!(
                    "this node holds its maximum of {} channels",
                    self.max_channels
                )));
            }
            let name: Arc<str> = Arc::from(channel);
            table.names.insert(name.clone());
            table.map.insert(name, Arc::new(Mutex::new(Stream::new())));
        }
        // Present: inserted above if it was not.
        table.map.get(channel).ok_or_else(|| BrokerError::Unavailable("channel vanished".into()))
    }

    fn stream(&self, channel: &str) -> Result<Arc<Mutex<Stream>>, BrokerError> {
        if let Some(s) = self.streams.read().map.get(channel) {
            return Ok(s.clone());
        }
        let mut table = self.streams.write();
        self.create(&mut table, channel).cloned()
    }

    /// Runs `f` on the channel's stream (created if needed) with the table held shared, so
    /// that the stream cannot be forgotten in between.
    fn with_stream<T>(&self, channel: &str, f: impl FnOnce(&mut Stream) -> T) -> Result<T, BrokerError> {
        {
            let table = self.streams.read();
            if let Some(s) = table.map.get(channel) {
                return Ok(f(&mut s.lock()));
            }
        }
        let mut table = self.streams.write();
        let s = self.create(&mut table, channel)?;
        let mut guard = s.lock();
        Ok(f(&mut guard))
    }

    /// Assigns the next offset, keeps history and hands the publication to the handler, under
    /// the stream's lock (the caller runs `after_publications` once the lock is released). With
    /// an idempotency key the channel took within the window, nothing is published and the
    /// first publication's position is answered (the check and the append share the stream's
    /// lock, so two concurrent publishes with one key publish once).
    fn append_item(&self, item: Outgoing) -> Result<Position, BrokerError> {
        let ttl_ms = u64::try_from(item.policy.ttl.as_millis()).unwrap_or(u64::MAX);
        let Some(key) = item.idempotency_key else {
            return self.with_stream(&item.channel, |s| {
                self.append_to(
                    s,
                    &item.channel,
                    Publication::of(item.data, item.historical, item.tags),
                    item.policy,
                    ttl_ms,
                )
            });
        };
        self.with_stream(&item.channel, |s| {
            let now = now_ms();
            let keys = s.keys.get_or_insert_with(Box::default);
            if let Some(first) = keys.find(&key, now, &self.keys_held) {
                return Ok(first);
            }
            keys.room(now, &self.keys_held)?;
            let publication = Publication::of(item.data, item.historical, item.tags);
            let position = self.append_to(s, &item.channel, publication, item.policy, ttl_ms);
            s.keys.get_or_insert_with(Box::default).insert(key, position.clone(), now, &self.keys_held);
            Ok(position)
        })?
    }

    /// Appends one publication under the stream's lock (its offset and time set here): history,
    /// trend, delivery and, unless it is historical ([`crate::Outgoing::historical`]), the last
    /// value.
    fn append_to(
        &self,
        s: &mut Stream,
        channel: &str,
        mut publication: Publication,
        policy: HistoryPolicy,
        ttl_ms: u64,
    ) -> Position {
        // A ttl of 0 means no expiry by time (history bounded by its size only), as in Redis.
        let ttl_ms = if ttl_ms == 0 { u64::MAX } else { ttl_ms };
        s.offset += 1;
        let now = now_ms();
        s.touched_ms = now;
        if let Some(keys) = s.keys.as_mut() {
            keys.expire(now, &self.keys_held);
        }
        (publication.offset, publication.time_ms) = (s.offset, now);
        let historical = publication.historical;
        if policy.size > 0 {
            s.history_ttl_ms = ttl_ms;
            s.history.push_back(publication.clone());
            while s.history.len() > policy.size {
                s.history.pop_front();
            }
            s.expire(ttl_ms, now);
        } else if !s.history.is_empty() {
            s.history.clear();
        }
        if let Some(tiers) = policy.trend {
            match sample(publication.data.get()) {
                Some((v, Some(t))) if historical => {
                    for tier in tiers.backfill_placements(now, t) {
                        s.ring(tier).record(tier, t, v);
                    }
                }
                Some((v, t)) if !historical => {
                    for (tier, at) in tiers.placements(now, t) {
                        let Some(at) = at else { continue };
                        s.ring(tier).record(tier, at, v);
                    }
                }
                _ => {}
            }
        }
        if let Some(h) = self.handler.get() {
            h.on_publication(channel, &publication);
        }
        if !historical {
            s.last = Some(publication);
        }
        s.position()
    }
}

#[async_trait::async_trait]
impl Broker for MemoryBroker {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn set_handler(&self, handler: Arc<dyn BrokerHandler>) {
        let _ = self.handler.set(handler);
    }

    fn sessions(&self) -> &dyn crate::SessionStore {
        &self.sessions
    }

    /// Every item is handed to the handler under its stream's lock; the handler flushes once,
    /// after the last one.
    async fn publish_batch(&self, items: Vec<Outgoing>) -> Vec<Result<Position, BrokerError>> {
        let out = items.into_iter().map(|i| self.append_item(i)).collect();
        if let Some(h) = self.handler.get() {
            h.after_publications();
        }
        out
    }

    /// Counted, so that a subscribed channel is never forgotten (every publication already
    /// reaches this, the only, node's handler).
    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
        self.with_stream(channel, |s| s.subscribers += 1)
    }

    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
        let table = self.streams.read();
        if let Some(s) = table.map.get(channel) {
            let mut s = s.lock();
            s.subscribers = s.subscribers.saturating_sub(1);
            s.touched_ms = now_ms();
        }
        Ok(())
    }

    async fn last_or_start(&self, channel: &str) -> Result<(Position, Option<Publication>), BrokerError> {
        let stream = self.stream(channel)?;
        let s = stream.lock();
        Ok((s.position(), s.last.clone()))
    }

    async fn last_if_known(&self, channel: &str) -> Result<Option<(Position, Option<Publication>)>, BrokerError> {
        let Some(stream) = self.streams.read().map.get(channel).cloned() else { return Ok(None) };
        let s = stream.lock();
        Ok(Some((s.position(), s.last.clone())))
    }

    async fn history(
        &self,
        channel: &str,
        since: Option<&Position>,
        limit: usize,
    ) -> Result<HistoryResult, BrokerError> {
        let stream = self.stream(channel)?;
        let mut s = stream.lock();
        let ttl = s.history_ttl_ms;
        s.expire(ttl, now_ms());
        let position = s.position();
        let Some(since) = since else {
            let skip = s.history.len().saturating_sub(limit);
            let publications = s.history.iter().skip(skip).cloned().collect();
            return Ok(HistoryResult { publications, position, complete: true });
        };
        // A position of another epoch: what the reader had is lost, but everything this epoch
        // holds is new to it, from its first offset. A position ahead of the channel in its own
        // epoch: the reader has every offset kept here, and more that are lost.
        let (from, lost) = match (since.epoch == s.epoch, since.offset > s.offset) {
            (false, _) => (0, true),
            (true, true) => return Ok(HistoryResult { publications: Vec::new(), position, complete: false }),
            (true, false) => (since.offset, false),
        };
        let oldest_kept = s.history.front().map(|p| p.offset).unwrap_or(s.offset + 1);
        let complete = !lost && from + 1 >= oldest_kept;
        let publications = s.history.iter().filter(|p| p.offset > from).take(limit).cloned().collect();
        Ok(HistoryResult { publications, position, complete })
    }

    async fn trend(&self, channel: &str, policy: TrendPolicy, since_ms: u64) -> Result<Vec<TrendBucket>, BrokerError> {
        let Some(stream) = self.streams.read().map.get(channel).cloned() else { return Ok(Vec::new()) };
        let s = stream.lock();
        let ring = s.trends.iter().find(|(p, _)| p.step_ms == policy.step_ms).map(|(_, r)| r);
        Ok(ring.map(|r| r.since(since_ms).collect()).unwrap_or_default())
    }

    /// Under the stream's lock, as a publication's trend values: the rings see one writer at a
    /// time.
    async fn presence_add(&self, channel: &str, info: ClientInfo) -> Result<(), BrokerError> {
        if !self.presence.add(channel, info.clone()) {
            return Ok(());
        }
        if let Some(h) = self.handler.get() {
            h.on_presence(channel, &info, true);
            h.after_publications();
        }
        Ok(())
    }

    async fn presence_remove(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        let removed = self.presence.remove(channel, client);
        if let (Some(info), Some(h)) = (removed, self.handler.get()) {
            h.on_presence(channel, &info, false);
            h.after_publications();
        }
        Ok(())
    }

    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        Ok(self.presence.members(channel))
    }

    async fn record_put(&self, set: &str, entry: &Record, now_ms: u64, max: usize) -> Result<RecordPut, BrokerError> {
        Ok(self.records.put(set, entry, now_ms, max))
    }

    async fn table_put(&self, name: &str, key: &str, value: &str) -> Result<(), BrokerError> {
        self.kept.table_put(name, key, value)
    }

    async fn table_remove(&self, name: &str, key: &str) -> Result<(), BrokerError> {
        self.kept.table_remove(name, key)
    }

    async fn table_all(&self, name: &str) -> Result<Vec<(String, String)>, BrokerError> {
        self.kept.table_all(name)
    }

    async fn log_append(&self, name: &str, entry: &str, keep: LogKeep) -> Result<String, BrokerError> {
        self.kept.log_append(name, entry, keep)
    }

    async fn log_read(&self, name: &str, before: Option<&str>, count: usize) -> Result<Vec<LogEntry>, BrokerError> {
        self.kept.log_read(name, before, count)
    }

    async fn records(&self, set: &str, now_ms: u64) -> Result<Vec<Record>, BrokerError> {
        Ok(self.records.live(set, now_ms))
    }

    /// In name order from the cursor (the last name of the previous page): a walk of the name
    /// index that reads `limit` + 1 names at most.
    async fn channels(&self, query: &ChannelQuery<'_>) -> Result<ChannelPage, BrokerError> {
        let start = match query.cursor {
            Some(c) if c >= query.prefix => Bound::Excluded(c),
            _ => Bound::Included(query.prefix),
        };
        let (page, more) = {
            let table = self.streams.read();
            let mut hits = table
                .names
                .range::<str, _>((start, Bound::Unbounded))
                .take_while(|name| name.starts_with(query.prefix))
                .filter(|name| !name.starts_with('$'))
                .map(|name| (name.clone(), table.map.get(name).cloned()));
            let page: Vec<_> = hits.by_ref().take(query.limit).collect();
            (page, hits.next().is_some())
        };
        let next = if more { page.last().map(|(name, _)| name.to_string()) } else { None };
        let channels = page
            .into_iter()
            .filter_map(|(channel, s)| Some(ChannelSummary { channel, position: s?.lock().position() }))
            .collect();
        Ok(ChannelPage { channels, next })
    }

    fn channel_count(&self) -> Option<usize> {
        Some(self.streams.read().map.len())
    }

    async fn ready(&self) -> bool {
        true
    }

    async fn forget_idle(&self, keep: &(dyn for<'c> Fn(&'c str) -> Duration + Sync)) -> usize {
        self.forget_idle_at(keep, now_ms())
    }
}

impl MemoryBroker {
    /// [`Broker::forget_idle`] at `now` (unix ms): forgets the channels idle past their keep,
    /// and drops every channel's idempotency keys whose window ended.
    fn forget_idle_at(&self, keep: &(dyn for<'c> Fn(&'c str) -> Duration + Sync), now: u64) -> usize {
        let idle = |ch: &Arc<str>, s: &Mutex<Stream>| {
            let mut s = s.lock();
            // A quiet channel's idempotency keys leave at the end of their window too.
            if let Some(keys) = s.keys.as_mut() {
                keys.expire(now, &self.keys_held);
                if keys.is_empty() {
                    s.keys = None;
                }
            }
            let keep_ms = match u64::try_from(keep(ch).as_millis()).unwrap_or(u64::MAX) {
                // Kept forever once published; a channel only ever read goes after a while.
                0 if s.offset == 0 => UNPUBLISHED_KEEP.as_millis() as u64,
                k => k,
            };
            s.subscribers == 0 && keep_ms > 0 && now.saturating_sub(s.touched_ms) > keep_ms
        };
        // Candidates under the shared lock; each checked again under the exclusive one.
        let candidates: Vec<Arc<str>> = {
            let table = self.streams.read();
            table.map.iter().filter(|(ch, s)| idle(ch, s)).map(|(ch, _)| ch.clone()).collect()
        };
        if candidates.is_empty() {
            return 0;
        }
        let mut forgotten = 0;
        let mut table = self.streams.write();
        // Churn leaves tombstones in the hash map; when they use up its room while it is more
        // than half full, it doubles — late and all at once, hours into a steady load. Keeping
        // twice the room from the first sweep on makes such a map clean itself in place
        // instead, so its memory is reached early and then stays.
        let len = table.map.len();
        if table.map.capacity() < 2 * len {
            table.map.reserve(len);
        }
        for ch in candidates {
            let still_idle = table.map.get(&ch).is_some_and(|s| idle(&ch, s));
            // Present clients keep a channel (presence outlives subscriptions on some transports).
            if still_idle && !self.presence.contains(&ch) {
                if let Some(s) = table.map.get(&ch) {
                    let held = s.lock().keys.as_ref().map_or(0, |k| k.len());
                    self.keys_held.fetch_sub(held, Relaxed);
                }
                table.map.remove(&ch);
                table.names.remove(&ch);
                forgotten += 1;
            }
        }
        forgotten
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn broker_memory_passes_the_conformance_suite() {
        crate::conformance::run_all(|| Arc::new(MemoryBroker::new()) as Arc<dyn Broker>).await;
    }

    #[tokio::test]
    async fn broker_memory_forgets_idle_channels_but_not_subscribed_present_or_kept_ones() {
        let b = MemoryBroker::new();
        let policy = HistoryPolicy { size: 10, ttl: Duration::from_secs(60), trend: None };
        let d = || Arc::new(serde_json::value::RawValue::from_string("1".into()).unwrap());
        for ch in ["room:idle", "room:sub", "room:here", "pt:kept"] {
            b.publish(ch, d(), policy).await.unwrap();
        }
        let old = b.last_or_start("room:idle").await.unwrap().0;
        b.subscribe("room:sub").await.unwrap();
        b.presence_add("room:here", ClientInfo { client: "c1".into(), user: String::new() }).await.unwrap();
        let keep = |ch: &str| if ch.starts_with("pt:") { Duration::ZERO } else { Duration::from_millis(20) };
        assert_eq!(b.forget_idle(&keep).await, 0, "nothing idle long enough yet");
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(b.forget_idle(&keep).await, 1);
        let names: Vec<String> =
            crate::conformance::list_all(&b, "", 100).await.iter().map(|c| c.channel.to_string()).collect();
        assert!(!names.contains(&"room:idle".to_string()) && names.len() == 3, "{names:?}");
        // Forgotten entirely: a reader starts a new epoch at offset 0, and history from the
        // old position is incomplete.
        assert!(b.last_if_known("room:idle").await.unwrap().is_none());
        let r = b.history("room:idle", Some(&old), 10).await.unwrap();
        assert!(!r.complete && r.position.epoch != old.epoch && r.position.offset == 0);
        // The last subscriber leaving starts the idle time.
        b.unsubscribe("room:sub").await.unwrap();
        assert_eq!(b.forget_idle(&keep).await, 0);
        tokio::time::sleep(Duration::from_millis(40)).await;
        b.presence_remove("room:here", "c1").await.unwrap();
        // room:idle (re-created by the reads above), room:sub and room:here go; pt:kept stays.
        assert_eq!(b.forget_idle(&keep).await, 3);
        assert_eq!(b.channel_count(), Some(1));
    }

    /// Counts deliveries and flushes, in the order they came.
    #[derive(Default)]
    struct Flushes(Mutex<Vec<&'static str>>);

    impl BrokerHandler for Flushes {
        fn on_publication(&self, _: &str, _: &Publication) {
            self.0.lock().push("deliver");
        }
        fn after_publications(&self) {
            self.0.lock().push("flush");
        }
        fn on_presence(&self, _: &str, _: &ClientInfo, _: bool) {}
    }

    #[tokio::test]
    async fn broker_memory_flushes_once_per_batch_after_its_last_delivery() {
        let b = MemoryBroker::new();
        let seen = Arc::new(Flushes::default());
        b.set_handler(seen.clone());
        let policy = HistoryPolicy { size: 10, ttl: Duration::from_secs(60), trend: None };
        let d = || Arc::new(serde_json::value::RawValue::from_string("1".into()).unwrap());
        let items = ["room:a", "room:b", "room:a"].map(|ch| Outgoing::new(ch, d(), policy)).to_vec();
        assert!(b.publish_batch(items).await.iter().all(Result::is_ok));
        assert_eq!(*seen.0.lock(), ["deliver", "deliver", "deliver", "flush"]);
        seen.0.lock().clear();
        b.publish("room:c", d(), policy).await.unwrap();
        assert_eq!(*seen.0.lock(), ["deliver", "flush"], "a publish is a batch of one");
    }

    #[tokio::test]
    async fn broker_memory_new_process_means_new_epoch() {
        let a = MemoryBroker::new();
        let b = MemoryBroker::new();
        let pa = a.last_or_start("x").await.unwrap().0;
        let pb = b.last_or_start("x").await.unwrap().0;
        assert_ne!(pa.epoch, pb.epoch);
    }

    #[tokio::test]
    async fn broker_memory_sweep_drops_a_quiet_channels_keys_at_the_end_of_their_window() {
        let b = MemoryBroker::new();
        let keyed = |ch: &str, key: &str| {
            let data = Arc::new(serde_json::value::RawValue::from_string("1".into()).unwrap());
            let mut item =
                Outgoing::new(ch, data, HistoryPolicy { size: 1, ttl: Duration::from_secs(60), trend: None });
            item.idempotency_key = Some(key.into());
            item
        };
        // A point channel (kept forever) and a room, each published once with keys, then quiet.
        b.publish_batch(vec![keyed("pt:quiet", "k1"), keyed("pt:quiet", "k2"), keyed("room:quiet", "k3")]).await;
        assert_eq!(b.keys_held.load(Relaxed), 3);
        let forever = |_: &str| Duration::ZERO;
        let window = crate::IDEMPOTENCY_WINDOW.as_millis() as u64;
        assert_eq!(b.forget_idle_at(&forever, now_ms() + 1_000), 0);
        assert_eq!(b.keys_held.load(Relaxed), 3, "within the window: kept");
        assert_eq!(b.forget_idle_at(&forever, now_ms() + window + 1_000), 0, "the channels stay");
        assert_eq!(b.keys_held.load(Relaxed), 0, "the keys went with their window");
        let pt = b.stream("pt:quiet").unwrap();
        assert!(pt.lock().keys.is_none(), "and their table with them");
        // A forgotten channel gives its keys' places back.
        b.publish_batch(vec![keyed("room:gone", "k4")]).await;
        let short = |ch: &str| if ch == "room:gone" { Duration::from_secs(1) } else { Duration::ZERO };
        assert_eq!(b.forget_idle_at(&short, now_ms() + 5_000), 1);
        assert_eq!(b.keys_held.load(Relaxed), 0);
    }
}
