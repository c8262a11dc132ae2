//! [`ClusterBroker`]: channels spread over the primaries of a Redis Cluster.
//!
//! `--broker redis+cluster://host:port[,host:port…][?prefix=…]` (`rediss+cluster://` for TLS):
//! any reachable node is a seed; the others are discovered with `CLUSTER SLOTS`. A channel's
//! keys share the hash tag `{channel}`, so they live in one slot, served by one primary at a
//! time. The broker is a [`RoutedBroker`] whose router, [`ClusterSlots`], keeps one
//! [`RedisBroker`] per primary — its own command connection and one sharded pub/sub
//! connection (`SSUBSCRIBE`/`SPUBLISH`, Redis ≥ 7: a publication is delivered by the nodes
//! serving its slot, not sent to every node) — and names the primary serving a channel's slot,
//! so a publication costs what it costs on one server and capacity grows with the primaries.
//!
//! - A batch is split by primary; each part is one script call per primary (the script may
//!   touch many slots of its node: `allow-cross-slot-keys`), all parts in parallel.
//! - Slot moves: a primary that no longer serves an item's slot leaves it untouched and says
//!   so; the broker reads the slot map again and sends those items to the new owner, in order.
//!   While a slot is being migrated its items wait for the move to finish (retried for up to
//!   [`crate::routed::RETRY_FOR`]), which is what `ASK` redirections would otherwise serve.
//!   Reads answered `MOVED`/`ASK`/`TRYAGAIN`/`CLUSTERDOWN` or failing on a dead connection are
//!   retried the same way ([`crate::routed`]).
//! - Slots without a primary (a cluster running with `cluster-require-full-coverage no` after
//!   losing one): their channels fail (`CLUSTERDOWN`) and `/readyz` is 503, while the channels
//!   of the other slots keep working.
//! - Subscriptions: a channel's subscription is held by the primary's link; when the node
//!   drops it (slot moved) or dies, the subscribers are told to recover and resubscribe where
//!   the slot is served now.
//! - Failover: when a primary dies its replica is promoted by the cluster; the slot map read
//!   after the first error names it. A promoted replica that lacked the last publications
//!   starts a new epoch on its next publication (see [`crate::redis`]), never reuses offsets.
//! - Node registry (`/api/info` node count, cluster-wide subscriber counts): every primary
//!   keeps its own, under a hash tag in one of its slots; the figures are their union.
//! - Long-poll sessions ([`crate::sessions`]): each on the primary serving the slot of its keys
//!   (their hash tag is the session id).
//!   Notices between nodes go by plain `PUBLISH`, which the cluster delivers on every node, so a
//!   node listens for its own on any primary, the next one after a lost connection.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::redis::{listen_with, notice_channel, RedisBroker, RedisOptions};
use crate::routed::{Route, RoutedBroker, Router, Settings};
use crate::sessions::SessionNotice;
use crate::BrokerError;

/// Slots of a Redis Cluster.
const SLOTS: usize = 16384;
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

/// The router's state, shared with the task that keeps the slot map fresh (which holds it
/// weakly, so dropping the broker ends it).
struct Shared {
    target: Target,
    map: RwLock<Arc<SlotMap>>,
    /// One broker per primary, by address (in address order: the channel listing's).
    nodes: Mutex<BTreeMap<String, Arc<RedisBroker>>>,
    /// What the node told the broker, for the brokers of primaries found later.
    settings: Arc<Settings>,
    /// Serializes slot-map reads; holds when the last one finished.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
}

/// The [`Router`] of a Redis Cluster: the primary serving each slot, as the slot map read last
/// says. Dropping it stops the background refresh.
pub struct ClusterSlots {
    shared: Arc<Shared>,
    _stop: tokio::sync::watch::Sender<()>,
}

/// A Redis Cluster: see the module documentation.
pub type ClusterBroker = RoutedBroker<ClusterSlots>;

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

impl RoutedBroker<ClusterSlots> {
    /// Starts from the seeds of `url`; the slot map is read in the background and kept fresh.
    /// Call inside a Tokio runtime.
    pub fn new(url: &str) -> Result<ClusterBroker, BrokerError> {
        let target = parse(url).map_err(BrokerError::Unavailable)?;
        let settings = Arc::new(Settings::default());
        let shared = Arc::new(Shared {
            target,
            map: RwLock::new(Arc::new(SlotMap::default())),
            nodes: Mutex::new(BTreeMap::new()),
            settings: settings.clone(),
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
        Ok(RoutedBroker::with_router(ClusterSlots { shared, _stop: stop }, settings))
    }
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
                    // Under the `nodes` lock, which a setting's fan-out takes after keeping it:
                    // this broker gets every setting one way or the other.
                    self.settings.apply(&b);
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
}

/// A hash tag whose slot primary `index` serves, for its node registry.
fn registry_tag(map: &SlotMap, index: u16) -> String {
    (0..100_000u32)
        .map(|i| format!("n{i}"))
        .find(|tag| map.owner[key_slot(tag.as_bytes()) as usize] == Some(index))
        .unwrap_or_else(|| "n0".into())
}

impl Router for ClusterSlots {
    const KIND: &'static str = "redis-cluster";
    const MOVES: bool = true;

    fn route(&self, channel: &str) -> Result<Route<'_>, BrokerError> {
        self.shared.route(channel).map(Cow::Owned)
    }

    fn targets(&self) -> Vec<Arc<RedisBroker>> {
        self.shared.nodes.lock().values().cloned().collect()
    }

    /// Every slot has a primary.
    fn covered(&self) -> bool {
        self.shared.map.read().complete()
    }

    async fn refresh(&self) {
        self.shared.refresh(false).await;
    }

    /// On the primaries in turn, one after each lost connection (see the module docs); ends
    /// when the broker is dropped.
    fn listen(&self, node: &str) -> mpsc::UnboundedReceiver<SessionNotice> {
        let shared = Arc::downgrade(&self.shared);
        let turn = Arc::new(AtomicUsize::new(0));
        listen_with(notice_channel(&self.shared.target.options.prefix, node), move || {
            let (shared, turn) = (shared.clone(), turn.clone());
            async move {
                let primaries: Vec<Arc<RedisBroker>> = shared.upgrade()?.nodes.lock().values().cloned().collect();
                let Some(primary) = primaries.get(turn.fetch_add(1, Relaxed) % primaries.len().max(1)) else {
                    return Some(Err(BrokerError::Unavailable("redis cluster: no primary known yet".into())));
                };
                Some(primary.client().await)
            }
        })
    }
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
