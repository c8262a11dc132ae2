//! [`RedisBroker`]: the cluster broker. Every node of a cluster points at the same Redis; a
//! client may connect to any node and recover on any other.
//!
//! - Publishing is one Lua script (see [`scripts`]): append to the channel's history stream
//!   (capped at the namespace's `history_size`, expiring `history_ttl_s` after the last
//!   publication), bump the offset, store the last value and PUBLISH on the channel's Redis
//!   pub/sub channel — atomic in Redis, so offsets are dense and ordered per channel and history
//!   never disagrees with what was published.
//! - A publish waits for an unreachable or failing-over Redis up to [`crate::PUBLISH_WAIT`],
//!   and tells "nothing was published" ([`BrokerError::Unavailable`]) from "sent, not answered"
//!   ([`BrokerError::Unknown`]); an item's idempotency key is kept beside its channel by the
//!   publish script (`publishing`).
//! - The epoch lives in Redis beside the offset. When the channel's keys are gone (Redis
//!   restarted without persistence, or was flushed), or the server's data may lack what
//!   clients saw (a promoted replica; a restart without `appendfsync always`), the next use
//!   creates a new random epoch, so a client recovering from an old position learns
//!   `complete: false`. A restart of a server that fsyncs every write keeps every epoch (the
//!   lineage record, see [`scripts`]).
//! - Each node holds one Redis subscription per channel with local subscribers, on one pub/sub
//!   connection ([`link`]; `round_trip`: its keepalive PING's round trip); a publication costs one Redis message per subscribed node, however
//!   many clients it has there. Commands from all tasks share one multiplexed connection, which
//!   pipelines whatever is in flight together.
//! - Presence is a sorted set per channel with an expiry per client, refreshed by the node that
//!   holds the client; a dead node's clients expire and leave (the sweep publishes the leave).
//! - Trends (`trend_store`): raw chunks of buckets the publish script updates in place, which
//!   the nodes compress once closed (the `redis-trend-compactor` task).
//! - Leases (`redis::lease`): which node runs each plant data source.
//! - Record sets (`redis::records`): shared entries each kept until its own expiry.
//! - Tables and logs (`redis::kept`): hashes and streams a node keeps for the cluster.
//! - Long-poll sessions (`redis::sessions`): their records, queued commands, locks and notices.
//! - A heartbeat (`redis::heartbeat`) registers the node (`/api/info` node count) and its
//!   subscription counts (cluster-wide subscriber figures in `/api/channels`).
//!
//! The URL is `redis://[user:password@]host:port[/db][?prefix=sb&presence_ttl_s=15]`
//! (`rediss://` for TLS, `redis+sentinel://` through Sentinel); `prefix` lets several clusters
//! share one Redis database. A Redis Cluster node is one of these too, made by
//! [`crate::cluster::ClusterSlots`] for each primary.

mod endpoint;
mod heartbeat;
mod kept;
mod lease;
mod link;
mod listing;
mod publishing;
mod records;
mod round_trip;
mod scripts;
mod sessions;
mod subscriber;
mod trend_store;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::value::RawValue;
use tokio::sync::{watch, Notify};

use crate::sessions::SessionStore;
use crate::{
    Broker, BrokerError, BrokerHandler, ChannelPage, ChannelQuery, ChannelTtl, ClientInfo, ClusterInfo, Data,
    HistoryResult, LogEntry, LogKeep, Outgoing, Position, Publication, Record, RecordPut, TrendBucket, TrendPolicy,
};
pub use endpoint::client_for;
use endpoint::{Commands, Endpoint};
pub(crate) use link::link_down;
use link::Link;
pub(crate) use listing::page_over;
pub(crate) use publishing::may_retry;
use scripts::Scripts;
pub(crate) use sessions::{listen_with, notice_channel, session_name};

/// How long a subscribe waits for Redis to confirm before failing.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a read waits for the pub/sub connection to deliver what the read has seen.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest history read in one script call.
const MAX_HISTORY_READ: usize = 1_000_000;

/// Settings carried in the broker URL's query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// Key prefix (`[A-Za-z0-9_.-]`, default `sb`).
    pub prefix: String,
    /// How long a present client and a node registration last without a heartbeat (the
    /// heartbeat runs three times per period). A dead node's clients leave after at most this.
    pub presence_ttl: Duration,
}

impl Default for RedisOptions {
    fn default() -> RedisOptions {
        RedisOptions { prefix: "sb".into(), presence_ttl: Duration::from_secs(15) }
    }
}

/// Splits a broker URL into the Redis connection URL and the broker's own options, and checks
/// both. Errors never repeat the URL, which may carry a password.
pub fn parse_url(url: &str) -> Result<(String, RedisOptions), String> {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    if !matches!(scheme, "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel") {
        return Err("expected `memory`, a Redis URL like redis://127.0.0.1:6379/0, a comma-separated list of \
                    them (shards), redis+sentinel://host:port,host:port/primary-name or \
                    redis+cluster://host:port"
            .into());
    }
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut options = RedisOptions::default();
    let mut passed = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "prefix" => {
                if v.is_empty() || !v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')) {
                    return Err("prefix: use 1 or more of [A-Za-z0-9_.-]".into());
                }
                options.prefix = v.to_string();
            }
            "presence_ttl_s" => {
                let s: u64 = v.parse().map_err(|_| "presence_ttl_s: expected whole seconds".to_string())?;
                if !(1..=86_400).contains(&s) {
                    return Err("presence_ttl_s: must be between 1 and 86400".into());
                }
                options.presence_ttl = Duration::from_secs(s);
            }
            // Left for the Redis client (e.g. `protocol`).
            _ => passed.push(pair),
        }
    }
    let redis_url = if passed.is_empty() { base.to_string() } else { format!("{base}?{}", passed.join("&")) };
    Endpoint::parse(&redis_url)?;
    Ok((redis_url, options))
}

/// Key names (layout in [`scripts`]).
pub(crate) struct Keys {
    prefix: String,
    /// Prefix of the node registry keys: the key prefix on a single Redis; on a Redis Cluster
    /// node `P:{tag}`, a hash tag in a slot that node serves, so that every node of the
    /// cluster keeps a registry of its own (see [`crate::cluster`]).
    registry: String,
}

impl Keys {
    fn meta(&self, ch: &str) -> String {
        format!("{}:{{{ch}}}:m", self.prefix)
    }
    fn history(&self, ch: &str) -> String {
        format!("{}:{{{ch}}}:h", self.prefix)
    }
    /// Raw trend chunk `c` of the tier of `step_ms` (see [`trend_store`]).
    fn trend_raw(&self, ch: &str, step_ms: u64, c: u64) -> String {
        format!("{}:{{{ch}}}:t:{step_ms}:{c}", self.prefix)
    }
    /// The hash of compressed trend chunks of the tier of `step_ms`.
    fn trend_compressed(&self, ch: &str, step_ms: u64) -> String {
        format!("{}:{{{ch}}}:tz:{step_ms}", self.prefix)
    }
    fn pubsub(&self, ch: &str) -> String {
        format!("{}:{{{ch}}}:p", self.prefix)
    }
    /// Where the position of the publication with idempotency key `key` is kept.
    fn idempotency(&self, ch: &str, key: &str) -> String {
        format!("{}:{{{ch}}}:i:{key}", self.prefix)
    }
    fn presence(&self, ch: &str) -> String {
        format!("{}:{{{ch}}}:pz", self.prefix)
    }
    fn presence_info(&self, ch: &str) -> String {
        format!("{}:{{{ch}}}:pi", self.prefix)
    }
    fn nodes(&self) -> String {
        format!("{}:nodes", self.registry)
    }
    fn node_subs(&self, id: &str) -> String {
        format!("{}:node:{id}:subs", self.registry)
    }
    /// The server's lineage record: what its data's identity is (see [`scripts`]).
    fn lineage(&self) -> String {
        format!("{}:lineage", self.registry)
    }
    /// The channel a pub/sub channel name belongs to.
    fn channel_of_pubsub<'a>(&self, name: &'a str) -> Option<&'a str> {
        name.strip_prefix(self.prefix.as_str())?.strip_prefix(":{")?.strip_suffix("}:p")
    }
    /// The channel of a meta key found by SCAN.
    fn channel_of_meta<'a>(&self, key: &'a str) -> Option<&'a str> {
        key.strip_prefix(self.prefix.as_str())?.strip_prefix(":{")?.strip_suffix("}:m")
    }
}

/// State shared by the broker handle and its background tasks.
pub(crate) struct Inner {
    keys: Keys,
    /// A Redis Cluster node: sharded pub/sub, the publish script's keys in ARGV.
    cluster: bool,
    /// Where Redis is: one address, or the primary the sentinels name.
    endpoint: Endpoint,
    /// Multiplexed and remade after failures: concurrent commands from every task are
    /// pipelined on it.
    commands: Commands,
    scripts: Scripts,
    leases: lease::Leases,
    records: records::RecordScripts,
    sessions: sessions::SessionScripts,
    handler: OnceLock<Arc<dyn BrokerHandler>>,
    /// The id this node is registered under; nothing is registered until it is set, so the
    /// cluster figures never list an id that is not a node's own.
    node_id: OnceLock<String>,
    /// Wakes the heartbeat when the id is set, to register at once.
    id_set: Notify,
    /// Whether the node has been registered under its id (readiness waits for it).
    registered: AtomicBool,
    /// How long an idle channel's keys are kept (none set: forever).
    keep: OnceLock<ChannelTtl>,
    presence_ttl: Duration,
    link: Link,
    /// When subscribed channels' expiry was last extended.
    alive_at: Mutex<Option<Instant>>,
    /// This node's present clients: channel → client → info JSON, for the heartbeat.
    presence: Mutex<HashMap<Arc<str>, HashMap<String, String>>>,
    /// Trend chunks this node has to compress ([`trend_store`]).
    trends: trend_store::Compactor,
}

/// The Redis broker. Create it inside a Tokio runtime: it spawns the pub/sub link and the
/// heartbeat, which stop when the broker is dropped.
pub struct RedisBroker {
    inner: Arc<Inner>,
    /// Dropping it stops the background tasks.
    _stop: watch::Sender<()>,
}

fn unavailable(e: redis::RedisError) -> BrokerError {
    BrokerError::Unavailable(format!("redis: {e}"))
}

/// A Cluster node answered that it does not serve the channel's slot.
fn moved() -> BrokerError {
    BrokerError::Unavailable("redis: MOVED (the channel's slot is served by another cluster node)".into())
}

fn new_epoch() -> String {
    format!("{:016x}", fastrand::u64(..))
}

fn data_of(text: String) -> Result<Data, BrokerError> {
    RawValue::from_string(text)
        .map(Arc::new)
        .map_err(|_| BrokerError::Unavailable("redis holds publication data that is not JSON".into()))
}

/// Tags as the scripts keep them: JSON, `''` for none. Tags that do not read (never written
/// so by the node) count as none.
pub(crate) fn tags_of(json: &str) -> Option<Arc<crate::Tags>> {
    (!json.is_empty()).then(|| serde_json::from_str(json).ok().map(Arc::new)).flatten()
}

/// The last value as the position scripts answer it: its offset (which a historical
/// publication after it leaves behind the channel's), tags, data and time; none before the
/// first.
fn last_of(
    offset: u64,
    tags: &str,
    data: Option<String>,
    time: Option<u64>,
) -> Result<Option<Publication>, BrokerError> {
    match data {
        Some(d) if offset > 0 => Ok(Some(Publication {
            offset,
            data: data_of(d)?,
            time_ms: time.unwrap_or(0),
            historical: false,
            tags: tags_of(tags),
        })),
        _ => Ok(None),
    }
}

impl RedisBroker {
    /// Connects to the broker URL (`redis://…`, see [`parse_url`]). The connection is made
    /// lazily and kept with reconnects; an unreachable Redis shows in [`Broker::ready`].
    pub fn new(url: &str) -> Result<RedisBroker, BrokerError> {
        let (redis_url, options) = parse_url(url).map_err(BrokerError::Unavailable)?;
        RedisBroker::with_options(&redis_url, options)
    }

    /// Connects to a plain Redis URL with explicit options.
    pub fn with_options(redis_url: &str, options: RedisOptions) -> Result<RedisBroker, BrokerError> {
        RedisBroker::start(redis_url, options, None)
    }

    /// One primary of a Redis Cluster, for [`crate::cluster::ClusterSlots`]: the channels of
    /// the slots it serves, with sharded pub/sub; its node registry under the hash tag
    /// `registry_tag` (one of its slots).
    pub(crate) fn cluster_node(
        redis_url: &str,
        options: RedisOptions,
        registry_tag: &str,
    ) -> Result<RedisBroker, BrokerError> {
        RedisBroker::start(redis_url, options, Some(registry_tag))
    }

    /// Publishes on this server, one attempt until `deadline`, for a broker over several
    /// ([`crate::routed`], which decides what to send again); `None` for items whose slot a
    /// Cluster node does not serve.
    pub(crate) async fn publish_on_node(
        &self,
        items: &[Outgoing],
        deadline: Instant,
    ) -> Vec<Result<Option<Position>, BrokerError>> {
        self.inner.publish_all(items, deadline).await
    }

    fn start(redis_url: &str, options: RedisOptions, cluster_node: Option<&str>) -> Result<RedisBroker, BrokerError> {
        let endpoint = Endpoint::parse(redis_url).map_err(BrokerError::Unavailable)?;
        let registry = match cluster_node {
            Some(tag) => format!("{}:{{{tag}}}", options.prefix),
            None => options.prefix.clone(),
        };
        let cluster = cluster_node.is_some();
        let keys = Keys { prefix: options.prefix, registry };
        let scripts = Scripts::new(cluster, &keys.lineage());
        let inner = Arc::new(Inner {
            keys,
            cluster,
            endpoint,
            commands: Commands::new(),
            scripts,
            leases: lease::Leases::new(),
            records: records::RecordScripts::new(),
            sessions: sessions::SessionScripts::new(),
            handler: OnceLock::new(),
            node_id: OnceLock::new(),
            id_set: Notify::new(),
            registered: AtomicBool::new(false),
            keep: OnceLock::new(),
            alive_at: Mutex::new(None),
            presence_ttl: options.presence_ttl,
            link: Link::default(),
            presence: Mutex::new(HashMap::new()),
            trends: trend_store::Compactor::default(),
        });
        let (stop, stopped) = watch::channel(());
        // Supervised: after a panic the link starts again as after a lost connection (its
        // channels are compared with Redis and their subscribers recover what they missed).
        let (i, s) = (inner.clone(), stopped.clone());
        switchboard_supervisor::spawn("redis-link", move |start| link::run(i.clone(), s.clone(), start.is_restart()));
        let (i, s) = (inner.clone(), stopped.clone());
        switchboard_supervisor::spawn("redis-heartbeat", move |_| heartbeat::heartbeat(i.clone(), s.clone()));
        let (i, s) = (inner.clone(), stopped);
        switchboard_supervisor::spawn("redis-trend-compactor", move |_| trend_store::run(i.clone(), s.clone()));
        Ok(RedisBroker { inner, _stop: stop })
    }
}

impl Inner {
    /// The command connection (made or remade on demand; see [`endpoint::Commands`]).
    async fn conn(&self) -> Result<redis::aio::MultiplexedConnection, BrokerError> {
        self.commands.get(&self.endpoint).await
    }

    /// Runs a script that only reads (or creates a missing epoch, which is idempotent enough:
    /// a retry finds it), once more on a new connection when the first attempt found the
    /// connection dead (after a failover, the first command learns that the old primary is gone).
    async fn read<T: redis::FromRedisValue>(&self, call: &redis::ScriptInvocation<'_>) -> Result<T, BrokerError> {
        let mut retried = false;
        loop {
            let mut conn = self.conn().await?;
            match call.invoke_async(&mut conn).await {
                Ok(v) => return Ok(v),
                Err(e) if !retried && (e.is_io_error() || e.is_connection_dropped()) => {
                    self.failed(e);
                    retried = true;
                }
                Err(e) => return Err(self.failed(e)),
            }
        }
    }

    /// The error of a command, after dropping a failed connection.
    fn failed(&self, e: redis::RedisError) -> BrokerError {
        self.commands.failed(e)
    }

    /// The channel's keep in ms (0: forever).
    fn keep_ms(&self, channel: &str) -> u64 {
        self.keep.get().map_or(0, |k| u64::try_from(k(channel).as_millis()).unwrap_or(u64::MAX))
    }

    /// The keep of a channel a reader creates: a channel kept forever is kept only
    /// [`crate::UNPUBLISHED_KEEP`] until its first publication (which makes it permanent).
    fn reader_keep_ms(&self, channel: &str) -> u64 {
        match self.keep_ms(channel) {
            0 if self.keep.get().is_some() => crate::UNPUBLISHED_KEEP.as_millis() as u64,
            k => k,
        }
    }

    /// The channel's position and last publication (creating its epoch if it has none).
    async fn position(&self, channel: &str) -> Result<(Position, Option<Publication>), BrokerError> {
        let mut call = self.scripts.position.prepare_invoke();
        call.key(self.keys.meta(channel))
            .key(self.keys.history(channel))
            .arg(new_epoch())
            .arg(self.reader_keep_ms(channel));
        let (epoch, offset, last_offset, tags, data, time): (String, u64, u64, String, Option<String>, Option<u64>) =
            self.read(&call).await?;
        let last = last_of(last_offset, &tags, data, time)?;
        Ok((Position { epoch: epoch.into(), offset }, last))
    }

    /// Read-your-deliveries: returns once the handler has every publication up to `position`
    /// (for channels this node delivers), so a subscriber's read and its live stream line up.
    async fn settle(&self, channel: &str, position: &Position) {
        if !self.link.wait_delivered(channel, position, SETTLE_TIMEOUT).await {
            tracing::warn!(channel, offset = position.offset, "publication not delivered by redis in time");
            if let Some(h) = self.handler.get() {
                h.on_missed(channel);
                h.after_publications();
            }
        }
    }
}

#[async_trait::async_trait]
impl Broker for RedisBroker {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn set_handler(&self, handler: Arc<dyn BrokerHandler>) {
        let _ = self.inner.handler.set(handler);
    }

    /// Registers the node under `id` from the next heartbeat on (at once when the pub/sub
    /// link is up); until then the node is in no cluster figure. The first id set stays.
    fn set_node_id(&self, id: &str) {
        if self.inner.node_id.set(id.to_string()).is_ok() {
            self.inner.id_set.notify_one();
        }
    }

    fn set_channel_ttl(&self, keep: ChannelTtl) {
        let _ = self.inner.keep.set(keep);
    }

    fn sessions(&self) -> &dyn SessionStore {
        self
    }

    /// Hands nothing to the handler: publications come back through the pub/sub link, which
    /// flushes once per burst it receives.
    async fn publish_batch(&self, items: Vec<Outgoing>) -> Vec<Result<Position, BrokerError>> {
        self.inner.publish_waiting(&items).await
    }

    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
        let link = &self.inner.link;
        let entry = link.acquire(channel)?;
        if let Err(e) = link.wait_active(&entry, SUBSCRIBE_TIMEOUT).await {
            link.release(channel);
            return Err(e);
        }
        Ok(())
    }

    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
        self.inner.link.release(channel);
        Ok(())
    }

    async fn last_or_start(&self, channel: &str) -> Result<(Position, Option<Publication>), BrokerError> {
        let (position, last) = self.inner.position(channel).await?;
        self.inner.settle(channel, &position).await;
        Ok((position, last))
    }

    async fn last_if_known(&self, channel: &str) -> Result<Option<(Position, Option<Publication>)>, BrokerError> {
        let i = &self.inner;
        let mut call = i.scripts.peek.prepare_invoke();
        call.key(i.keys.meta(channel));
        let found: Option<(String, u64, u64, String, Option<String>, Option<u64>)> = i.read(&call).await?;
        let Some((epoch, offset, last_offset, tags, data, time)) = found else { return Ok(None) };
        let last = last_of(last_offset, &tags, data, time)?;
        let position = Position { epoch: epoch.into(), offset };
        i.settle(channel, &position).await;
        Ok(Some((position, last)))
    }

    async fn history(
        &self,
        channel: &str,
        since: Option<&Position>,
        limit: usize,
    ) -> Result<HistoryResult, BrokerError> {
        let i = &self.inner;
        let (since_epoch, since_offset) = match since {
            Some(p) => (p.epoch.to_string(), p.offset),
            None => (String::new(), 0),
        };
        let mut call = i.scripts.history.prepare_invoke();
        call.key(i.keys.meta(channel)).key(i.keys.history(channel)).arg(new_epoch());
        call.arg(since_epoch).arg(since_offset).arg(limit.min(MAX_HISTORY_READ)).arg(i.reader_keep_ms(channel));
        let (epoch, offset, complete, entries): (String, u64, i64, Vec<(u64, u64, String, u8, String)>) =
            i.read(&call).await?;
        let mut publications = Vec::with_capacity(entries.len());
        for (offset, time_ms, data, historical, tags) in entries {
            let historical = historical == 1;
            publications.push(Publication { offset, data: data_of(data)?, time_ms, historical, tags: tags_of(&tags) });
        }
        let position = Position { epoch: epoch.into(), offset };
        i.settle(channel, &position).await;
        Ok(HistoryResult { publications, position, complete: complete == 1 })
    }

    async fn trend(&self, channel: &str, policy: TrendPolicy, since_ms: u64) -> Result<Vec<TrendBucket>, BrokerError> {
        trend_store::read(&self.inner, channel, policy, since_ms).await
    }

    async fn presence_add(&self, channel: &str, info: ClientInfo) -> Result<(), BrokerError> {
        let i = &self.inner;
        let json = serde_json::to_string(&info).map_err(|e| BrokerError::Unavailable(e.to_string()))?;
        let ttl_ms = i.presence_ttl.as_millis() as u64;
        let _: i64 = i
            .scripts
            .presence_add
            .key(i.keys.presence(channel))
            .key(i.keys.presence_info(channel))
            .arg(&info.client)
            .arg(&json)
            .arg(ttl_ms)
            .arg(i.keys.pubsub(channel))
            .invoke_async(&mut i.conn().await?)
            .await
            .map_err(|e| i.failed(e))?;
        i.presence.lock().entry(Arc::from(channel)).or_default().insert(info.client, json);
        Ok(())
    }

    async fn presence_remove(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        let i = &self.inner;
        {
            let mut local = i.presence.lock();
            if let Some(m) = local.get_mut(channel) {
                m.remove(client);
                if m.is_empty() {
                    local.remove(channel);
                }
            }
        }
        let _: i64 = i
            .scripts
            .presence_remove
            .key(i.keys.presence(channel))
            .key(i.keys.presence_info(channel))
            .arg(client)
            .arg(i.keys.pubsub(channel))
            .invoke_async(&mut i.conn().await?)
            .await
            .map_err(|e| i.failed(e))?;
        Ok(())
    }

    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        let i = &self.inner;
        let infos: Vec<String> = i
            .scripts
            .presence_list
            .key(i.keys.presence(channel))
            .key(i.keys.presence_info(channel))
            .arg(i.keys.pubsub(channel))
            .invoke_async(&mut i.conn().await?)
            .await
            .map_err(|e| i.failed(e))?;
        #[derive(serde::Deserialize)]
        struct Info {
            client: String,
            #[serde(default)]
            user: String,
        }
        let mut out: Vec<ClientInfo> = infos
            .iter()
            .filter_map(|s| serde_json::from_str::<Info>(s).ok())
            .map(|i| ClientInfo { client: i.client, user: i.user })
            .collect();
        out.sort_by(|a, b| a.client.cmp(&b.client));
        Ok(out)
    }

    async fn channels(&self, query: &ChannelQuery<'_>) -> Result<ChannelPage, BrokerError> {
        self.inner.channel_page(query).await
    }

    /// The pub/sub link is up, Redis answers, and a node that told its id has been registered
    /// under it (so the cluster figures list a node as soon as it reports ready).
    async fn ready(&self) -> bool {
        let inner = &self.inner;
        if !inner.link.up.load(Relaxed) || (inner.node_id.get().is_some() && !inner.registered.load(Relaxed)) {
            return false;
        }
        let ping = async {
            let mut conn = inner.conn().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await.map_err(|e| inner.failed(e))
        };
        matches!(tokio::time::timeout(Duration::from_secs(1), ping).await, Ok(Ok(_)))
    }

    /// The pub/sub link's keepalive PING ([`link::PING_EVERY`]).
    fn round_trip(&self) -> Option<Duration> {
        self.inner.link.round_trip.current()
    }

    async fn lease(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, BrokerError> {
        self.inner.lease(name, holder, ttl).await
    }

    async fn lease_release(&self, name: &str, holder: &str) -> Result<(), BrokerError> {
        self.inner.lease_release(name, holder).await
    }

    async fn record_put(&self, set: &str, entry: &Record, now_ms: u64, max: usize) -> Result<RecordPut, BrokerError> {
        self.inner.record_put(set, entry, now_ms, max).await
    }

    async fn records(&self, set: &str, now_ms: u64) -> Result<Vec<Record>, BrokerError> {
        self.inner.records(set, now_ms).await
    }

    async fn table_put(&self, name: &str, key: &str, value: &str) -> Result<(), BrokerError> {
        self.inner.table_put(name, key, value).await
    }

    async fn table_remove(&self, name: &str, key: &str) -> Result<(), BrokerError> {
        self.inner.table_remove(name, key).await
    }

    async fn table_all(&self, name: &str) -> Result<Vec<(String, String)>, BrokerError> {
        self.inner.table_all(name).await
    }

    async fn log_append(&self, name: &str, entry: &str, keep: LogKeep) -> Result<String, BrokerError> {
        self.inner.log_append(name, entry, keep).await
    }

    async fn log_read(&self, name: &str, before: Option<&str>, count: usize) -> Result<Vec<LogEntry>, BrokerError> {
        self.inner.log_read(name, before, count).await
    }

    async fn cluster(&self) -> Result<Option<ClusterInfo>, BrokerError> {
        let i = &self.inner;
        let rows: Vec<redis::Value> = i
            .scripts
            .cluster
            .key(i.keys.nodes())
            .arg(&i.keys.registry)
            .invoke_async(&mut i.conn().await?)
            .await
            .map_err(|e| i.failed(e))?;
        let mut info = ClusterInfo::default();
        let mut it = rows.into_iter();
        while let (Some(id), Some(subs)) = (it.next(), it.next()) {
            let id: String = redis::from_redis_value(id).map_err(|e| BrokerError::Unavailable(e.to_string()))?;
            let subs: HashMap<String, u64> =
                redis::from_redis_value(subs).map_err(|e| BrokerError::Unavailable(e.to_string()))?;
            for (ch, n) in subs {
                *info.subscribers.entry(Arc::from(ch.as_str())).or_insert(0) += n;
            }
            info.nodes.push(id);
        }
        info.nodes.sort();
        Ok(Some(info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_redis_url_options_are_parsed_and_clusters_refused() {
        let (url, o) = parse_url("redis://127.0.0.1:6379/2?prefix=blue&presence_ttl_s=6").unwrap();
        assert_eq!(url, "redis://127.0.0.1:6379/2");
        assert_eq!(o, RedisOptions { prefix: "blue".into(), presence_ttl: Duration::from_secs(6) });
        assert_eq!(parse_url("redis://h:1").unwrap().1, RedisOptions::default());
        assert!(parse_url("redis://h:1?prefix=a*b").unwrap_err().contains("prefix"));
        assert!(parse_url("redis://h:1?presence_ttl_s=0").unwrap_err().contains("presence_ttl_s"));
        let e = parse_url("postgres://user:secret@h").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
        let (url, o) = parse_url("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/main?prefix=s").unwrap();
        assert_eq!((url.as_str(), o.prefix.as_str()), ("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/main", "s"));
        assert!(parse_url("redis+sentinel://127.0.0.1:26379").unwrap_err().contains("primary name"));
        assert!(parse_url("redis+sentinel://:pw@h:1/main/x").unwrap_err().contains("db"));
        let e = parse_url("redis+sentinel://u:secret@/main").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn broker_redis_keys_round_trip_channel_names() {
        let k = Keys { prefix: "sb".into(), registry: "sb".into() };
        assert_eq!(k.meta("pt:a.b"), "sb:{pt:a.b}:m");
        assert_eq!(k.channel_of_pubsub(&k.pubsub("room:1/x@y=z")), Some("room:1/x@y=z"));
        assert_eq!(k.channel_of_meta(&k.meta("a")), Some("a"));
        assert_eq!(k.channel_of_pubsub("other:{a}:p"), None);
    }
}
