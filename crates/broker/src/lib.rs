//! The broker: where publications get their offsets, where history, last values and presence
//! live, and how a node learns of publications made anywhere in the cluster.
//!
//! # Layout
//! - this file: the [`Broker`] trait, the [`BrokerHandler`] a node registers to receive
//!   publications, and the value types they exchange.
//! - [`memory`]: [`MemoryBroker`], the embedded single-node default (`memory/presence.rs`: its
//!   presence table, indexed per channel and client; `memory/keys.rs`: its bounded
//!   idempotency keys).
//! - [`redis`]: [`RedisBroker`], the cluster broker: every node shares one Redis, publications
//!   reach the other nodes over Redis pub/sub, history and presence live in Redis
//!   (`redis/heartbeat.rs`: the node's registration there and the refresh of what it keeps
//!   alive, its clients' presence and its subscribed channels).
//! - [`routed`]: [`RoutedBroker`], one broker over several [`RedisBroker`]s, each channel on the
//!   one its [`routed::Router`] names: batches split by target, settings fanned out, calls
//!   retried while routes change, figures merged — once for every topology.
//! - [`sharded`]: [`ShardedRedisBroker`], the routed broker over hash shards: channels spread
//!   over several independent Redis servers by a stable hash of the name.
//! - [`cluster`]: [`ClusterBroker`], the routed broker over the primaries of a Redis Cluster by
//!   slot (sharded pub/sub), following slot moves and failovers (the slot map, its refresh).
//! - [`trend`]: downsampled trends of point channels (buckets of min/max/last/count).
//! - [`records`]: record sets, small shared sets of entries each kept until its own expiry
//!   (the cluster's revocation list), and the memory broker's table of them.
//! - [`kept`]: tables and logs a node keeps for the cluster (alarm states, definitions and
//!   journal): their shared types; Redis keeps them as hashes and streams
//!   (`redis/kept.rs`), the memory broker in its directory (`memory/kept.rs`).
//! - [`sessions`]: the [`SessionStore`] every broker is, where long-poll sessions keep what lets
//!   any node continue them (records by compare-and-set, queued commands, a lock, notices
//!   between nodes); the memory broker's tables in `memory/sessions.rs`, the Redis keys and
//!   the notice listener in `redis/sessions.rs`, a session kept whole on one server of a
//!   routed broker in `routed/sessions.rs`.
//! - [`conformance`]: the suite every broker must pass (run from each implementation's tests;
//!   `conformance/sessions.rs`: the session store's cases).
//!
//! # Delivery contract
//! For one channel, a broker assigns offsets 1, 2, 3, … within an epoch and calls
//! [`BrokerHandler::on_publication`] in offset order, never concurrently for the same channel.
//! Saving to history, updating the last value and handing the publication to the handler form
//! one atomic step per channel: a reader of history or last value never sees a publication the
//! handler has not been given, nor the reverse. For a broker shared by several nodes this holds
//! per node for the channels it subscribes to: a read returns only once every publication up to
//! the position it reports has been handed to this node's handler.
//!
//! When a broker cannot keep that promise (an offset gap, a new epoch, a lost connection to a
//! shared broker), it calls [`BrokerHandler::on_missed`] so the node tells the channel's
//! subscribers to recover from history instead of silently skipping publications.

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
pub use switchboard_protocol::filter::Tags;

pub mod cluster;
pub mod conformance;
pub mod kept;
pub mod memory;
pub mod records;
pub mod redis;
pub mod routed;
pub mod sessions;
pub mod sharded;
pub mod trend;

pub use self::redis::RedisBroker;
pub use cluster::ClusterBroker;
pub use kept::{LogEntry, LogKeep};
pub use memory::MemoryBroker;
pub use records::{Record, RecordPut};
pub use routed::RoutedBroker;
pub use sessions::{SessionLock, SessionNotice, SessionStore, StoredSession};
pub use sharded::ShardedRedisBroker;
pub use trend::{TrendBucket, TrendPolicy, TrendTiers};

/// Checks a `--broker` value without connecting: `memory`, one Redis URL, or a comma-separated
/// list of Redis URLs (shards). Errors never repeat a URL, which may carry a password.
pub fn check_url(url: &str) -> Result<(), String> {
    if url == "memory" {
        return Ok(());
    }
    if url.contains("+sentinel://") {
        return redis::parse_url(url).map(|_| ());
    }
    if url.contains("+cluster://") {
        return cluster::check_url(url);
    }
    let parts: Vec<&str> = url.split(',').map(str::trim).collect();
    for (i, part) in parts.iter().enumerate() {
        redis::parse_url(part).map_err(|e| if parts.len() > 1 { format!("shard {}: {e}", i + 1) } else { e })?;
    }
    Ok(())
}

/// Creates the broker a `--broker` value names (see [`check_url`]). Call it inside a Tokio
/// runtime: shared brokers connect in the background and report through [`Broker::ready`].
pub fn from_url(url: &str) -> Result<Arc<dyn Broker>, BrokerError> {
    check_url(url).map_err(BrokerError::Unavailable)?;
    Ok(match url {
        "memory" => Arc::new(MemoryBroker::new()),
        cluster if cluster.contains("+cluster://") => Arc::new(ClusterBroker::new(cluster)?),
        list if list.contains(',') && !list.contains("+sentinel://") => Arc::new(ShardedRedisBroker::new(list)?),
        one => Arc::new(RedisBroker::new(one)?),
    })
}

/// How long a channel that was never published is kept once idle, in a namespace that keeps
/// its channels forever (`channel_ttl_s = 0`): subscribing to a misspelt point name must not
/// leave a channel behind for good.
pub const UNPUBLISHED_KEEP: Duration = Duration::from_secs(3600);

/// How long a channel is kept once idle ([`Broker::set_channel_ttl`]).
pub type ChannelTtl = Arc<dyn Fn(&str) -> Duration + Send + Sync>;

/// Publication data: raw JSON text, shared by history, last value and every delivery.
pub type Data = Arc<Box<RawValue>>;

/// One publication on a channel.
#[derive(Debug, Clone)]
pub struct Publication {
    pub offset: u64,
    pub data: Data,
    /// When the broker accepted it (unix milliseconds).
    pub time_ms: u64,
    /// A value from before the channel's newest, kept in history at its offset (and in the
    /// trend at its own time) but never the channel's last value ([`Outgoing::historical`]).
    pub historical: bool,
    /// The publisher's tags, kept with it for subscribers' filters
    /// ([`switchboard_protocol::filter`]).
    pub tags: Option<Arc<Tags>>,
}

impl Publication {
    /// A publication about to be appended (its offset and time are the broker's to set).
    pub fn of(data: Data, historical: bool, tags: Option<Arc<Tags>>) -> Publication {
        Publication { offset: 0, data, time_ms: 0, historical, tags }
    }
}

/// How long a publication's idempotency key is remembered on its channel
/// ([`Outgoing::idempotency_key`]): a publish retried with the same key within it returns the
/// first result instead of publishing again.
pub const IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(300);

/// Most idempotency keys one channel holds within the window; a keyed publication past it is
/// refused ([`BrokerError::KeysFull`]). (The memory broker's bound: Redis keeps keys as keys
/// of their own, each gone at the end of its window.)
pub const MAX_KEYS_PER_CHANNEL: usize = 10_000;

/// Most idempotency keys a memory broker holds over all its channels.
pub const MAX_KEYS: usize = 100_000;

/// How long a publish waits for a failing or failing-over broker (a new primary, a connection
/// made again) before it answers [`BrokerError::Unavailable`] or [`BrokerError::Unknown`].
pub const PUBLISH_WAIT: Duration = Duration::from_secs(5);

/// One item of [`Broker::publish_batch`].
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub channel: Arc<str>,
    pub data: Data,
    pub policy: HistoryPolicy,
    /// The publisher's key for this publication (checked by the caller): when the channel
    /// already took a publication with this key within [`IDEMPOTENCY_WINDOW`], the broker
    /// publishes nothing and answers that publication's position. The key is stored beside the
    /// channel, in the same atomic step as the publication, and expires after the window (or
    /// with the channel, when it is forgotten sooner).
    pub idempotency_key: Option<Arc<str>>,
    /// A historical value (a source's back-fill, a Sparkplug B `is_historical` metric: from
    /// before the channel's newest). It takes the next offset and goes to history and to
    /// subscribers as any publication, marked historical, but the channel's last value stays
    /// what it was, and its trend value goes to the buckets of its own time only, in the tiers
    /// that reach back to it ([`TrendTiers::backfill_placements`]), never moved to now.
    pub historical: bool,
    /// Tags kept with the publication (checked by the caller:
    /// [`switchboard_protocol::filter::check_tags`]).
    pub tags: Option<Arc<Tags>>,
}

impl Outgoing {
    /// A live item without idempotency key or tags.
    pub fn new(channel: &str, data: Data, policy: HistoryPolicy) -> Outgoing {
        Outgoing { channel: Arc::from(channel), data, policy, idempotency_key: None, historical: false, tags: None }
    }
}

/// A channel's current position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub epoch: Arc<str>,
    pub offset: u64,
}

/// How much history a channel keeps; comes from its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryPolicy {
    pub size: usize,
    /// How long publications stay in history; zero: no expiry by time (bounded by `size`
    /// only), on every broker.
    pub ttl: Duration,
    /// The downsampled trends of numeric values kept beside it, if any ([`trend`]).
    pub trend: Option<TrendTiers>,
}

/// What a history read returns.
#[derive(Debug, Clone)]
pub struct HistoryResult {
    /// Publications after the requested position (or the newest ones), oldest first.
    pub publications: Vec<Publication>,
    pub position: Position,
    /// False when the history no longer reaches back to the requested position or the epoch
    /// differs (the publications are then the current epoch's, from its oldest kept one): the
    /// reader missed publications it cannot get back.
    pub complete: bool,
}

/// A client present on a channel.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClientInfo {
    pub client: String,
    pub user: String,
}

/// What a broker shared by several nodes knows about the whole cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterInfo {
    /// Ids of the nodes alive now (their heartbeats have not expired).
    pub nodes: Vec<String>,
    /// Subscriptions per channel summed over the live nodes (channels without any are absent).
    pub subscribers: std::collections::HashMap<Arc<str>, u64>,
}

impl ClusterInfo {
    /// The union of what several Redis servers (shards, Cluster primaries) know: every node
    /// once, subscriptions summed. Servers that could not be reached are left out; an error only
    /// when none answered.
    pub fn merge(parts: Vec<Result<Option<ClusterInfo>, BrokerError>>) -> Result<Option<ClusterInfo>, BrokerError> {
        let mut info = ClusterInfo::default();
        let mut reached = 0;
        let mut last_error = None;
        for part in parts {
            match part {
                Ok(Some(p)) => {
                    reached += 1;
                    info.nodes.extend(p.nodes);
                    for (ch, n) in p.subscribers {
                        *info.subscribers.entry(ch).or_insert(0) += n;
                    }
                }
                Ok(None) => {}
                Err(e) => last_error = Some(e),
            }
        }
        if let (0, Some(e)) = (reached, last_error) {
            return Err(e);
        }
        info.nodes.sort();
        info.nodes.dedup();
        Ok(Some(info))
    }
}

/// Per-channel figures for the HTTP API.
#[derive(Debug, Clone)]
pub struct ChannelSummary {
    pub channel: Arc<str>,
    pub position: Position,
}

/// Which page of the channel listing to read ([`Broker::channels`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ChannelQuery<'a> {
    /// Only channels whose name starts with this (empty: all).
    pub prefix: &'a str,
    /// Where the previous page ended ([`ChannelPage::next`]); `None` for the first page.
    pub cursor: Option<&'a str>,
    /// The most channels a page holds.
    pub limit: usize,
}

/// One page of the channel listing.
#[derive(Debug, Clone, Default)]
pub struct ChannelPage {
    pub channels: Vec<ChannelSummary>,
    /// The cursor of the next page; `None` when this page is the last. A page may hold fewer
    /// than `limit` channels (even none) and still have a next one.
    pub next: Option<String>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// The broker could not be reached or refused the command: nothing was done.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// A publish was sent but not answered (a timeout, a connection lost on the way back): the
    /// publication may or may not have been committed. Publishing again with the same
    /// idempotency key is safe (it answers the first result if there was one).
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// A new channel would pass the broker's ceiling ([`MemoryBroker::with_max_channels`]);
    /// channels that exist keep working.
    #[error("channel limit reached: {0}")]
    Full(String),
    /// A listing cursor this broker did not hand out.
    #[error("bad cursor: {0}")]
    BadCursor(String),
    /// A keyed publication would pass a bound of the idempotency keys held
    /// ([`MAX_KEYS_PER_CHANNEL`], [`MAX_KEYS`]): nothing was published; the same publication
    /// may be retried after `retry_after_s`.
    #[error("{message}")]
    KeysFull { message: String, retry_after_s: u64 },
}

/// Receives what the broker delivers to this node.
pub trait BrokerHandler: Send + Sync + 'static {
    /// A publication on `channel`. Called in offset order per channel, possibly while the
    /// broker holds the channel's lock: must not block or call back into the broker.
    fn on_publication(&self, channel: &str, publication: &Publication);
    /// Called after one or more `on_publication` calls once the broker released its locks:
    /// the place to do slow work (socket writes) that the handler deferred. The broker is its
    /// only caller, once per group of deliveries (see [`Broker::publish_batch`]).
    fn after_publications(&self);
    /// A presence change on `channel`.
    fn on_presence(&self, channel: &str, info: &ClientInfo, joined: bool);
    /// This node may have missed publications on `channel` (an offset gap, a new epoch, a lost
    /// broker connection): every local subscriber of it must recover from history. Same rules
    /// as `on_publication`: must not block. The default ignores it.
    fn on_missed(&self, channel: &str) {
        let _ = channel;
    }
}

/// The interface every broker implements. All methods are safe to call concurrently.
#[async_trait::async_trait]
pub trait Broker: Send + Sync + 'static {
    /// The broker's kind for `/api/info` (`memory`, `redis`).
    fn kind(&self) -> &'static str;

    /// Sets the handler that receives publications; called once by the node at start.
    fn set_handler(&self, handler: Arc<dyn BrokerHandler>);

    /// Tells the broker the id of the node it serves (shared brokers register it for the
    /// cluster figures, and register nothing before it); called once by the node at start.
    /// The default ignores it.
    fn set_node_id(&self, id: &str) {
        let _ = id;
    }

    /// Publishes: assigns the next offset, keeps history per `policy`, updates the last value
    /// (not for a historical item, [`Outgoing::historical`]) and delivers to every node with
    /// subscribers. A shared broker that is unreachable or
    /// failing over is waited for up to [`PUBLISH_WAIT`]. A batch of one
    /// ([`Broker::publish_batch`], which also takes publications with an idempotency key).
    async fn publish(&self, channel: &str, data: Data, policy: HistoryPolicy) -> Result<Position, BrokerError> {
        let mut out = self.publish_batch(vec![Outgoing::new(channel, data, policy)]).await;
        out.pop().unwrap_or_else(|| Err(BrokerError::Unavailable("the broker answered an empty publish".into())))
    }

    /// Publishes several publications, each as [`Broker::publish`] would (honouring each item's
    /// idempotency key), and returns one result per item in the same order. Items of one
    /// channel get their offsets in item order. A shared broker sends the whole batch in as few
    /// round trips as it can (one per shard), so a batch of a thousand costs about what one
    /// publication costs in waiting.
    ///
    /// Flushing is the broker's: whoever hands publications to the handler calls
    /// [`BrokerHandler::after_publications`] once after each group it handed over, never per
    /// item, so a connection subscribed to many of a batch's channels gets them in one write.
    /// A broker that delivers while publishing (the memory broker) calls it once per batch,
    /// after the last item; one whose deliveries come back on their own (the Redis pub/sub
    /// link) calls it once per burst it received. Callers of `publish_batch` never flush.
    async fn publish_batch(&self, items: Vec<Outgoing>) -> Vec<Result<Position, BrokerError>>;

    /// One more local subscription of `channel`. Called for every subscription, not only the
    /// channel's first on this node: the broker counts them (so calls for different clients may
    /// arrive in any order) and returns once publications on `channel` reach the handler, so a
    /// history or last-value read made afterwards cannot miss a publication. On `Err` nothing
    /// was counted.
    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError>;
    /// One subscription fewer; the broker stops delivering `channel` when none is left.
    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError>;

    /// The current position and last publication of a channel (creating its epoch when it
    /// has none: a subscriber's starting point).
    async fn last_or_start(&self, channel: &str) -> Result<(Position, Option<Publication>), BrokerError>;

    /// As [`Broker::last_or_start`] for a channel the broker knows; `None`, creating nothing,
    /// for one it does not (reads of unknown channels must not grow the broker's state).
    async fn last_if_known(&self, channel: &str) -> Result<Option<(Position, Option<Publication>)>, BrokerError>;

    /// Publications after `since` (all kept ones when `None`), at most `limit`, oldest first.
    /// A `since` of another epoch selects the current epoch's publications from its oldest kept
    /// one (`complete: false`: what followed `since` in its own epoch is lost); one ahead of the
    /// channel in its own epoch selects none (`complete: false`).
    async fn history(
        &self,
        channel: &str,
        since: Option<&Position>,
        limit: usize,
    ) -> Result<HistoryResult, BrokerError>;

    /// The channel's trend buckets that start at or after `since_ms`, oldest first; empty for
    /// an unknown channel or one whose namespace keeps no trend. `policy` is the namespace's
    /// (where the buckets are kept depends on its step). Reads create nothing.
    async fn trend(&self, channel: &str, policy: TrendPolicy, since_ms: u64) -> Result<Vec<TrendBucket>, BrokerError> {
        let _ = (channel, policy, since_ms);
        Ok(Vec::new())
    }

    async fn presence_add(&self, channel: &str, info: ClientInfo) -> Result<(), BrokerError>;
    async fn presence_remove(&self, channel: &str, client: &str) -> Result<(), BrokerError>;
    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError>;

    /// One page of the channels the broker knows, with their positions. Paging costs a bounded
    /// amount of work per call whatever the number of channels. A channel that exists from the
    /// first page to the last is listed exactly once; one created or forgotten meanwhile may
    /// or may not be. The memory broker lists in name order with the last name as cursor;
    /// Redis brokers list in `SCAN` order with the server's cursor. Internal channels (names
    /// starting with `$`, which nodes publish to each other and clients cannot name) are
    /// never listed.
    async fn channels(&self, query: &ChannelQuery<'_>) -> Result<ChannelPage, BrokerError>;

    /// How many channels the broker holds, for brokers that know it cheaply (the memory
    /// broker); `None` for shared brokers (their keys expire in Redis).
    fn channel_count(&self) -> Option<usize> {
        None
    }

    /// Whether the broker is reachable (`/readyz`).
    async fn ready(&self) -> bool;

    /// The round trip to the broker's server as last measured, or the age of a probe still
    /// unanswered when that is longer; for a broker over several servers the slowest one's.
    /// Shared brokers measure it once a second on each pub/sub connection (the keepalive PING,
    /// which queues behind what the server sends there, so a long one means late deliveries).
    /// `None` when nothing was measured yet, and for a broker without a server (the default).
    fn round_trip(&self) -> Option<Duration> {
        None
    }

    /// Forgets every channel idle for longer than `keep(channel)` (zero: kept forever) — no
    /// local subscriber, no present client, no publication — with its epoch, offset, last
    /// value and history, so that months of channel churn leave no state behind. A client
    /// recovering a forgotten channel learns `complete: false` from its new epoch. Returns how
    /// many were forgotten. Shared brokers forget by key expiry instead (no scans): the default
    /// does nothing.
    async fn forget_idle(&self, keep: &(dyn for<'c> Fn(&'c str) -> Duration + Sync)) -> usize {
        let _ = keep;
        0
    }

    /// How long each channel is kept once idle (zero: forever), for brokers that forget by key
    /// expiry: a channel's keys expire between one and two keeps after its last publication,
    /// and are kept alive while this node has subscribers. The default does nothing.
    fn set_channel_ttl(&self, keep: ChannelTtl) {
        let _ = keep;
    }

    /// The store of long-poll sessions' shared state ([`sessions`]): in the process for the
    /// memory broker, in Redis (where every node finds it) for the others.
    fn sessions(&self) -> &dyn SessionStore;

    /// Cluster-wide figures, or `None` when the broker serves a single node (the default).
    async fn cluster(&self) -> Result<Option<ClusterInfo>, BrokerError> {
        Ok(None)
    }

    /// Takes or renews the lease `name` for `holder` for `ttl`: true when `holder` holds it
    /// now (it was free, expired, or already held by `holder`, whose ttl starts again), false
    /// when another holder does. Nodes run a plant data source only while they hold its lease,
    /// so in a cluster each source runs on one node at a time. A single-node broker (the
    /// default) grants every lease.
    async fn lease(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, BrokerError> {
        let _ = (name, holder, ttl);
        Ok(true)
    }

    /// Gives the lease `name` up if `holder` holds it, so another node takes it at once instead
    /// of after its ttl. The default does nothing.
    async fn lease_release(&self, name: &str, holder: &str) -> Result<(), BrokerError> {
        let _ = (name, holder);
        Ok(())
    }

    /// Keeps `entry` (its value under its key until its expiry) in the record set `set`, by the
    /// rules of [`records`]: a key keeps its later expiry, and a set at `max` live entries
    /// takes no new key. `now_ms` is the caller's clock, which judges what has expired.
    async fn record_put(&self, set: &str, entry: &Record, now_ms: u64, max: usize) -> Result<RecordPut, BrokerError>;

    /// The entries of the record set `set` that expire after `now_ms`, in no order.
    async fn records(&self, set: &str, now_ms: u64) -> Result<Vec<Record>, BrokerError>;

    /// Keeps `value` under `key` in the table `name` ([`kept`]) until it is replaced or
    /// removed.
    async fn table_put(&self, name: &str, key: &str, value: &str) -> Result<(), BrokerError>;

    /// Removes `key` from the table `name` (nothing there: nothing done).
    async fn table_remove(&self, name: &str, key: &str) -> Result<(), BrokerError>;

    /// Every entry of the table `name`, in no order.
    async fn table_all(&self, name: &str) -> Result<Vec<(String, String)>, BrokerError>;

    /// Appends `entry` (one line of text) to the log `name` ([`kept`]), dropping what `keep`
    /// no longer holds; answers the entry's cursor.
    async fn log_append(&self, name: &str, entry: &str, keep: LogKeep) -> Result<String, BrokerError>;

    /// Up to `count` entries of the log `name` older than the cursor `before` (`None`: from
    /// the newest), newest first. A cursor this broker could not have handed out is
    /// [`BrokerError::BadCursor`].
    async fn log_read(&self, name: &str, before: Option<&str>, count: usize) -> Result<Vec<LogEntry>, BrokerError>;
}

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
