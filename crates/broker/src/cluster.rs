//! [`ClusterBroker`]: channels spread over the primaries of a Redis Cluster.
//!
//! `--broker redis+cluster://host:port[,host:port…][?prefix=…]` (`rediss+cluster://` for TLS):
//! any reachable node is a seed; the others are discovered with `CLUSTER SLOTS`. A channel's
//! keys share the hash tag `{channel}`, so they live in one slot, served by one primary at a
//! time. The broker keeps one [`RedisBroker`] per primary — its own command connection and
//! one sharded pub/sub connection (`SSUBSCRIBE`/`SPUBLISH`, Redis ≥ 7: a publication is
//! delivered by the nodes serving its slot, not sent to every node) — and sends each call to
//! the primary serving the channel's slot, so a publication costs what it costs on one
//! server and capacity grows with the primaries.
//!
//! - A batch is split by primary; each part is one script call per primary (the script may
//!   touch many slots of its node: `allow-cross-slot-keys`), all parts in parallel.
//! - Slot moves: a primary that no longer serves an item's slot leaves it untouched and says
//!   so; the broker reads the slot map again and sends those items to the new owner, in order.
//!   While a slot is being migrated its items wait for the move to finish (retried for up to
//!   [`RETRY_FOR`]), which is what `ASK` redirections would otherwise serve. Reads answered
//!   `MOVED`/`ASK`/`TRYAGAIN`/`CLUSTERDOWN` or failing on a dead connection are retried the same way.
//! - Subscriptions: a channel's subscription is held by the primary's link; when the node
//!   drops it (slot moved) or dies, the subscribers are told to recover and resubscribe where
//!   the slot is served now.
//! - Failover: when a primary dies its replica is promoted by the cluster; the slot map read
//!   after the first error names it. A promoted replica that lacked the last publications
//!   starts a new epoch on its next publication (see [`crate::redis`]), never reuses offsets.
//! - Node registry (`/api/info` node count, cluster-wide subscriber counts): every primary
//!   keeps its own, under a hash tag in one of its slots; the figures are their union.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::time::Instant;

use crate::redis::{RedisBroker, RedisOptions};
use crate::{
    Broker, BrokerError, BrokerHandler, ChannelPage, ChannelQuery, ChannelTtl, ClientInfo, ClusterInfo, Data,
    HistoryPolicy, HistoryResult, Outgoing, Position, Publication, TrendBucket, TrendPolicy,
};

/// Slots of a Redis Cluster.
const SLOTS: usize = 16384;
/// How long a call keeps retrying while slots move or a failover completes.
const RETRY_FOR: Duration = Duration::from_secs(5);
/// Pause between retries (the slot map is read again before each).
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// The slot map is read at most this often on errors, and at least every [`REFRESH_EVERY`].
const REFRESH_MIN_GAP: Duration = Duration::from_millis(100);
const REFRESH_EVERY: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The slot (0..16384) of a key, as `CLUSTER KEYSLOT` computes it: CRC16/XMODEM of its hash
/// tag (the bytes between the first `{` and the next `}`, when there are any) or of the key.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % SLOTS as u16
}

/// What the cluster said about its slots.
#[derive(Default)]
struct SlotMap {
    /// Slot → index into `primaries` (`None`: no node serves it).
    owner: Vec<Option<u16>>,
    /// `host:port` of each primary.
    primaries: Vec<String>,
}

impl SlotMap {
    fn complete(&self) -> bool {
        self.owner.len() == SLOTS && self.owner.iter().all(Option::is_some)
    }
}

/// How to reach the cluster's nodes.
struct Target {
    /// `redis` or `rediss`.
    scheme: &'static str,
    /// `user:password@` or empty.
    auth: String,
    /// Options passed on to every node's URL (e.g. `tls_ca=…`).
    query: String,
    options: RedisOptions,
    seeds: Vec<String>,
}

impl Target {
    fn node_url(&self, addr: &str) -> String {
        let q = if self.query.is_empty() { String::new() } else { format!("?{}", self.query) };
        format!("{}://{}{addr}/0{q}", self.scheme, self.auth)
    }
}

/// The primaries holding a channel's local subscriptions, with their counts.
type Held = Vec<(Arc<RedisBroker>, usize)>;

struct Shared {
    target: Target,
    map: RwLock<Arc<SlotMap>>,
    /// One broker per primary, by address.
    nodes: Mutex<HashMap<String, Arc<RedisBroker>>>,
    /// Where each channel's local subscriptions are held, and how many (a channel can be held
    /// by two primaries for a moment while its slot moves).
    subs: Mutex<HashMap<Arc<str>, Held>>,
    handler: OnceLock<Arc<dyn BrokerHandler>>,
    /// The node's id, given to every primary's broker (each registers nothing before it).
    node_id: OnceLock<String>,
    keep: OnceLock<ChannelTtl>,
    /// Serializes slot-map reads; holds when the last one finished.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
}

/// A Redis Cluster: see the module documentation.
pub struct ClusterBroker {
    shared: Arc<Shared>,
    _stop: tokio::sync::watch::Sender<()>,
}

/// Splits `redis+cluster://[user:pw@]h:p[,h:p…][?query]` into how to reach it. Errors never
/// repeat the URL.
fn parse(url: &str) -> Result<Target, String> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+cluster://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+cluster://") {
        ("rediss", r)
    } else {
        return Err("expected redis+cluster://host:port[,host:port…]".into());
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((a, h)) => (format!("{a}@"), h),
        None => (String::new(), rest),
    };
    let hosts = hosts.trim_end_matches('/');
    if hosts.contains('/') {
        return Err("redis+cluster:// takes no database (a cluster has only db 0)".into());
    }
    let seeds: Vec<String> = hosts.split(',').map(str::trim).filter(|h| !h.is_empty()).map(String::from).collect();
    if seeds.is_empty() {
        return Err("redis+cluster:// needs at least one node host:port".into());
    }
    let mut target = Target { scheme, auth, query: String::new(), options: RedisOptions::default(), seeds };
    // The broker options and the connection's are checked as for one server.
    let probe = format!("{}://{}{}/0?{query}", scheme, target.auth, target.seeds[0]);
    let (checked, options) = crate::redis::parse_url(&probe)?;
    target.options = options;
    target.query = checked.split_once('?').map(|(_, q)| q.to_string()).unwrap_or_default();
    for seed in &target.seeds {
        crate::redis::parse_url(&target.node_url(seed)).map_err(|_| "a cluster node is not host:port".to_string())?;
    }
    Ok(target)
}

/// Checks a `redis+cluster://` URL without connecting.
pub fn check_url(url: &str) -> Result<(), String> {
    parse(url).map(drop)
}

/// The seed nodes of a `redis+cluster://` URL as plain Redis URLs (for other clients of the
/// same cluster, such as the long-poll session store), and the broker options.
pub fn seed_urls(url: &str) -> Result<(Vec<String>, RedisOptions), String> {
    let target = parse(url)?;
    Ok((target.seeds.iter().map(|s| target.node_url(s)).collect(), target.options))
}

impl ClusterBroker {
    /// Starts from the seeds of `url`; the slot map is read in the background and kept fresh.
    /// Call inside a Tokio runtime.
    pub fn new(url: &str) -> Result<ClusterBroker, BrokerError> {
        let target = parse(url).map_err(BrokerError::Unavailable)?;
        let shared = Arc::new(Shared {
            target,
            map: RwLock::new(Arc::new(SlotMap::default())),
            nodes: Mutex::new(HashMap::new()),
            subs: Mutex::new(HashMap::new()),
            handler: OnceLock::new(),
            node_id: OnceLock::new(),
            keep: OnceLock::new(),
            refreshed: tokio::sync::Mutex::new(None),
        });
        let (stop, stopped) = tokio::sync::watch::channel(());
        let weak = Arc::downgrade(&shared);
        switchboard_supervisor::spawn("redis-cluster-slots", move |_| {
            let (weak, mut stopped) = (weak.clone(), stopped.clone());
            async move {
                loop {
                    let Some(shared) = weak.upgrade() else { return };
                    shared.refresh(true).await;
                    drop(shared);
                    tokio::select! {
                        _ = tokio::time::sleep(REFRESH_EVERY) => {}
                        _ = stopped.changed() => return,
                    }
                }
            }
        });
        Ok(ClusterBroker { shared, _stop: stop })
    }
}

/// Whether a failed call may succeed on another try (after reading the slot map again).
fn retriable(e: &BrokerError) -> bool {
    let BrokerError::Unavailable(text) = e else { return false };
    [
        "MOVED",
        "ASK",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "non local key",
        "down",
        "connection",
        "refused",
        "timed out",
        "broken pipe",
        "reset",
    ]
    .iter()
    .any(|s| text.contains(s))
}

impl Shared {
    /// Reads the slot map from a known primary or a seed (at most once per
    /// [`REFRESH_MIN_GAP`] unless `force`), and makes a broker for every new primary.
    async fn refresh(&self, force: bool) {
        let mut last = self.refreshed.lock().await;
        if !force && last.is_some_and(|t| t.elapsed() < REFRESH_MIN_GAP) {
            return;
        }
        let mut candidates = self.map.read().primaries.clone();
        candidates.extend(self.target.seeds.iter().cloned());
        candidates.dedup();
        for addr in candidates {
            match tokio::time::timeout(CONNECT_TIMEOUT, self.read_map(&addr)).await {
                Ok(Ok(map)) => {
                    self.install(map);
                    break;
                }
                Ok(Err(e)) => tracing::debug!(node = %addr, error = %e, "redis cluster slot map not read"),
                Err(_) => tracing::debug!(node = %addr, "redis cluster slot map: no answer in time"),
            }
        }
        *last = Some(Instant::now());
    }

    async fn read_map(&self, addr: &str) -> Result<SlotMap, String> {
        let client = crate::redis::client_for(&self.target.node_url(addr))?;
        let mut conn = client.get_multiplexed_async_connection().await.map_err(|e| e.to_string())?;
        let rows: Vec<redis::Value> =
            redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut conn).await.map_err(|e| e.to_string())?;
        let (asked_host, _) = addr.rsplit_once(':').unwrap_or((addr, ""));
        let mut map = SlotMap { owner: vec![None; SLOTS], primaries: Vec::new() };
        for row in rows {
            let redis::Value::Array(fields) = row else { continue };
            let (Some(start), Some(end), Some(primary)) = (fields.first(), fields.get(1), fields.get(2)) else {
                continue;
            };
            let start: usize = redis::from_redis_value(start.clone()).map_err(|e| e.to_string())?;
            let end: usize = redis::from_redis_value(end.clone()).map_err(|e| e.to_string())?;
            let (host, port): (String, u16) = match primary {
                redis::Value::Array(p) if p.len() >= 2 => (
                    redis::from_redis_value(p[0].clone()).map_err(|e| e.to_string())?,
                    redis::from_redis_value(p[1].clone()).map_err(|e| e.to_string())?,
                ),
                _ => continue,
            };
            // An empty or `?` host means "the address you reached me at".
            let host = if host.is_empty() || host == "?" { asked_host.to_string() } else { host };
            let node = format!("{host}:{port}");
            let index = match map.primaries.iter().position(|p| *p == node) {
                Some(i) => i,
                None => {
                    map.primaries.push(node);
                    map.primaries.len() - 1
                }
            };
            for slot in start..=end.min(SLOTS - 1) {
                map.owner[slot] = Some(index as u16);
            }
        }
        if map.primaries.is_empty() {
            return Err("the node answered an empty slot map".into());
        }
        Ok(map)
    }

    /// Makes the new map current: a broker for each new primary; brokers of nodes that are no
    /// longer primaries are let go (subscriptions they still hold keep them until released).
    fn install(&self, map: SlotMap) {
        let mut nodes = self.nodes.lock();
        for (i, addr) in map.primaries.iter().enumerate() {
            if nodes.contains_key(addr) {
                continue;
            }
            let tag = registry_tag(&map, i as u16);
            match RedisBroker::cluster_node(&self.target.node_url(addr), self.target.options.clone(), &tag) {
                Ok(b) => {
                    if let Some(h) = self.handler.get() {
                        b.set_handler(h.clone());
                    }
                    if let Some(id) = self.node_id.get() {
                        b.set_node_id(id);
                    }
                    if let Some(keep) = self.keep.get() {
                        b.set_channel_ttl(keep.clone());
                    }
                    tracing::info!(node = %addr, "redis cluster primary");
                    nodes.insert(addr.clone(), Arc::new(b));
                }
                Err(e) => tracing::warn!(node = %addr, error = %e, "redis cluster primary not usable"),
            }
        }
        nodes.retain(|addr, _| map.primaries.contains(addr));
        *self.map.write() = Arc::new(map);
    }

    /// The broker of the primary serving `channel`'s slot.
    fn route(&self, channel: &str) -> Result<Arc<RedisBroker>, BrokerError> {
        let slot = key_slot(channel.as_bytes()) as usize;
        let map = self.map.read().clone();
        let addr =
            map.owner.get(slot).copied().flatten().and_then(|i| map.primaries.get(i as usize)).ok_or_else(|| {
                BrokerError::Unavailable("redis cluster: no node serves the channel's slot (CLUSTERDOWN)".into())
            })?;
        self.nodes
            .lock()
            .get(addr)
            .cloned()
            .ok_or_else(|| BrokerError::Unavailable("redis cluster: the slot's primary is not connected".into()))
    }

    /// Runs `call` on the channel's primary, reading the slot map again and retrying while the
    /// error is one a moved slot or a failover explains, for up to [`RETRY_FOR`].
    async fn on_owner<T, F, Fut>(&self, channel: &str, call: F) -> Result<T, BrokerError>
    where
        F: Fn(Arc<RedisBroker>) -> Fut,
        Fut: std::future::Future<Output = Result<T, BrokerError>>,
    {
        let deadline = Instant::now() + RETRY_FOR;
        loop {
            let result = match self.route(channel) {
                Ok(node) => call(node).await,
                Err(e) => Err(e),
            };
            match result {
                Err(e) if retriable(&e) && Instant::now() < deadline => {
                    self.refresh(false).await;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                other => return other,
            }
        }
    }

    fn all_nodes(&self) -> Vec<Arc<RedisBroker>> {
        self.nodes.lock().values().cloned().collect()
    }
}

/// A hash tag whose slot primary `index` serves, for its node registry.
fn registry_tag(map: &SlotMap, index: u16) -> String {
    (0..100_000u32)
        .map(|i| format!("n{i}"))
        .find(|tag| map.owner[key_slot(tag.as_bytes()) as usize] == Some(index))
        .unwrap_or_else(|| "n0".into())
}

#[async_trait::async_trait]
impl Broker for ClusterBroker {
    fn kind(&self) -> &'static str {
        "redis-cluster"
    }

    fn set_handler(&self, handler: Arc<dyn BrokerHandler>) {
        for n in self.shared.all_nodes() {
            n.set_handler(handler.clone());
        }
        let _ = self.shared.handler.set(handler);
    }

    /// Set before telling the primaries' brokers: [`Shared::install`] reads it under the
    /// `nodes` lock, so a broker made meanwhile gets the id one way or the other.
    fn set_node_id(&self, id: &str) {
        let _ = self.shared.node_id.set(id.to_string());
        for n in self.shared.all_nodes() {
            n.set_node_id(id);
        }
    }

    fn set_channel_ttl(&self, keep: ChannelTtl) {
        for n in self.shared.all_nodes() {
            n.set_channel_ttl(keep.clone());
        }
        let _ = self.shared.keep.set(keep);
    }

    async fn publish(&self, channel: &str, data: Data, policy: HistoryPolicy) -> Result<Position, BrokerError> {
        let item = Outgoing::new(channel, data, policy);
        let mut out = self.publish_batch(vec![item]).await;
        out.pop().unwrap_or_else(|| Err(BrokerError::Unavailable("redis cluster answered an empty publish".into())))
    }

    /// Splits the batch by primary (item order kept within each part), publishes the parts in
    /// parallel, and sends the items a primary no longer serves to the new owner.
    async fn publish_batch(&self, items: Vec<Outgoing>) -> Vec<Result<Position, BrokerError>> {
        let shared = &self.shared;
        let mut results: Vec<Option<Result<Position, BrokerError>>> = vec![None; items.len()];
        let mut pending: Vec<usize> = (0..items.len()).collect();
        let deadline = Instant::now() + RETRY_FOR;
        loop {
            // Group by the primary serving each item's slot, in item order.
            let mut parts: Vec<(Arc<RedisBroker>, Vec<usize>)> = Vec::new();
            let mut unrouted = Vec::new();
            for &i in &pending {
                match shared.route(&items[i].channel) {
                    Ok(node) => match parts.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &node)) {
                        Some((_, part)) => part.push(i),
                        None => parts.push((node, vec![i])),
                    },
                    Err(e) => unrouted.push((i, e)),
                }
            }
            let calls = parts.iter().map(|(node, part)| {
                let batch: Vec<Outgoing> = part.iter().map(|&i| items[i].clone()).collect();
                async move { node.publish_on_node(&batch, deadline.into_std()).await }
            });
            let answers = futures_util::future::join_all(calls).await;
            let mut again = Vec::new();
            let time_left = Instant::now() + RETRY_PAUSE < deadline;
            for ((_, part), answer) in parts.iter().zip(answers) {
                for (&i, r) in part.iter().zip(answer) {
                    match r {
                        Ok(Some(position)) => results[i] = Some(Ok(position)),
                        // Not served there (nothing was done): to the new owner.
                        Ok(None) => again.push(i),
                        // The script did not run, or its outcome is unknown and the item's
                        // idempotency key makes a second attempt answer the first result:
                        // safe to send again (to wherever the slot map points by then).
                        Err(e) if time_left && retriable_publish(&e, &items[i]) => again.push(i),
                        Err(e) => results[i] = Some(Err(e)),
                    }
                }
            }
            for (i, e) in unrouted {
                if Instant::now() < deadline {
                    again.push(i);
                } else {
                    results[i] = Some(Err(e));
                }
            }
            if again.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                for i in again {
                    results[i].get_or_insert_with(|| {
                        Err(BrokerError::Unavailable("redis cluster: the channel's slot did not settle in time".into()))
                    });
                }
                break;
            }
            again.sort_unstable();
            pending = again;
            shared.refresh(false).await;
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(BrokerError::Unavailable("redis cluster: publish not answered".into()))))
            .collect()
    }

    /// A primary whose pub/sub link is down fails the subscribe at once, after one more look
    /// at the slot map (the cluster may have promoted its replica already): a subscribe names
    /// many channels, and those on healthy primaries must not wait out a failover. The client
    /// subscribes the refused channel again (503). Moved slots are retried as elsewhere.
    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
        let shared = &self.shared;
        let deadline = Instant::now() + RETRY_FOR;
        let mut looked_again = false;
        let node = loop {
            let result = match shared.route(channel) {
                Ok(node) => node.subscribe(channel).await.map(|()| node),
                Err(e) => Err(e),
            };
            match result {
                Ok(node) => break node,
                Err(e) if crate::redis::link_down(&e) => {
                    if looked_again {
                        return Err(e);
                    }
                    looked_again = true;
                    shared.refresh(false).await;
                }
                Err(e) if retriable(&e) && Instant::now() < deadline => {
                    shared.refresh(false).await;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => return Err(e),
            }
        };
        let mut subs = shared.subs.lock();
        let held = subs.entry(Arc::from(channel)).or_default();
        match held.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &node)) {
            Some((_, count)) => *count += 1,
            None => held.push((node, 1)),
        }
        Ok(())
    }

    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
        let node = {
            let mut subs = self.shared.subs.lock();
            let Some(held) = subs.get_mut(channel) else { return Ok(()) };
            let Some(first) = held.first_mut() else { return Ok(()) };
            first.1 -= 1;
            let node = first.0.clone();
            if first.1 == 0 {
                held.remove(0);
            }
            if held.is_empty() {
                subs.remove(channel);
            }
            node
        };
        node.unsubscribe(channel).await
    }

    async fn last(&self, channel: &str) -> Result<(Position, Option<Publication>), BrokerError> {
        self.shared.on_owner(channel, |node| async move { node.last(channel).await }).await
    }

    async fn peek(&self, channel: &str) -> Result<Option<(Position, Option<Publication>)>, BrokerError> {
        self.shared.on_owner(channel, |node| async move { node.peek(channel).await }).await
    }

    async fn history(
        &self,
        channel: &str,
        since: Option<&Position>,
        limit: usize,
    ) -> Result<HistoryResult, BrokerError> {
        self.shared.on_owner(channel, |node| async move { node.history(channel, since, limit).await }).await
    }

    async fn trend(&self, channel: &str, policy: TrendPolicy, since_ms: u64) -> Result<Vec<TrendBucket>, BrokerError> {
        self.shared.on_owner(channel, |node| async move { node.trend(channel, policy, since_ms).await }).await
    }

    async fn presence_add(&self, channel: &str, info: ClientInfo) -> Result<(), BrokerError> {
        let info = &info;
        self.shared.on_owner(channel, |node| async move { node.presence_add(channel, info.clone()).await }).await
    }

    async fn presence_remove(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        self.shared.on_owner(channel, |node| async move { node.presence_remove(channel, client).await }).await
    }

    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        self.shared.on_owner(channel, |node| async move { node.presence(channel).await }).await
    }

    /// Primary after primary in address order, each in `SCAN` order (a `SCAN` on a primary
    /// sees only its own slots).
    async fn channels(&self, query: &ChannelQuery<'_>) -> Result<ChannelPage, BrokerError> {
        let mut nodes: Vec<(String, Arc<RedisBroker>)> =
            self.shared.nodes.lock().iter().map(|(addr, b)| (addr.to_string(), b.clone())).collect();
        nodes.sort_by(|a, b| a.0.cmp(&b.0));
        let parts: Vec<&RedisBroker> = nodes.iter().map(|(_, b)| &**b).collect();
        crate::redis::page_over(&parts, query).await
    }

    /// Every slot served, and every primary reachable with its pub/sub link up.
    async fn ready(&self) -> bool {
        if !self.shared.map.read().complete() {
            return false;
        }
        let nodes = self.shared.all_nodes();
        !nodes.is_empty()
            && futures_util::future::join_all(nodes.iter().map(|n| n.ready())).await.into_iter().all(|r| r)
    }

    /// The slowest primary's.
    fn round_trip(&self) -> Option<Duration> {
        self.shared.all_nodes().iter().filter_map(|n| n.round_trip()).max()
    }

    /// On the primary serving the slot of the lease's name (its key's hash tag).
    async fn lease(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, BrokerError> {
        self.shared.on_owner(name, |n| async move { n.lease(name, holder, ttl).await }).await
    }

    async fn lease_release(&self, name: &str, holder: &str) -> Result<(), BrokerError> {
        self.shared.on_owner(name, |n| async move { n.lease_release(name, holder).await }).await
    }

    async fn cluster(&self) -> Result<Option<ClusterInfo>, BrokerError> {
        let nodes = self.shared.all_nodes();
        ClusterInfo::merge(futures_util::future::join_all(nodes.iter().map(|n| n.cluster())).await)
    }
}

/// Whether a failed publish attempt of `item` may be sent again on a Cluster: whenever it may on
/// one server ([`crate::redis::may_retry`]), and when its slot moved or no primary serves it yet
/// (the script was refused before running, or never sent).
fn retriable_publish(e: &BrokerError, item: &Outgoing) -> bool {
    crate::redis::may_retry(e, item)
        || matches!(e, BrokerError::Unavailable(text) if ["MOVED", "ASK", "no node serves"].iter().any(|s| text.contains(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_cluster_key_slots_match_redis() {
        // Values of `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(key_slot(b"{a}"), 15495);
        assert_eq!(key_slot(b"{b}"), 3300);
        assert_eq!(key_slot(b"sb:{c}:m"), 7365);
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"sb:{pt:a.b}:m"), key_slot(b"sb:{pt:a.b}:h"));
        assert_eq!(key_slot(b"pt:a.b"), key_slot(b"x{pt:a.b}y"));
        // An empty tag hashes the whole key; only the first tag counts.
        assert_eq!(key_slot(b"a{}b"), 13694);
        assert_eq!(key_slot(b"x{}{y}"), 14166);
    }

    #[test]
    fn broker_cluster_urls_are_checked() {
        let t = parse("redis+cluster://u:secret@127.0.0.1:7001,127.0.0.1:7002?prefix=blue").unwrap();
        assert_eq!(t.seeds, ["127.0.0.1:7001", "127.0.0.1:7002"]);
        assert_eq!(t.options.prefix, "blue");
        assert_eq!(t.node_url("10.0.0.1:7003"), "redis://u:secret@10.0.0.1:7003/0");
        assert_eq!(parse("rediss+cluster://h:1").unwrap().node_url("h:2"), "rediss://h:2/0");
        assert!(parse("redis+cluster://h:1/3").err().unwrap().contains("db"));
        assert!(parse("redis+cluster://").err().unwrap().contains("host:port"));
        let e = parse("redis+cluster://u:secret@h:1?prefix=a*b").err().unwrap();
        assert!(e.contains("prefix") && !e.contains("secret"), "{e}");
    }
}
