//! Where long-poll sessions keep the state that lets any node continue them:
//! [`PollStore`], with [`MemoryPollStore`] (one node; the embedded broker) and
//! [`RedisPollStore`] (a cluster sharing the Redis of the Redis broker).
//!
//! A session's [`Record`] holds what cannot be re-read from the broker: its subscriptions with
//! the position the client will be at once it has everything it was sent or is about to be
//! sent, the replies it has not been sent yet, the number of the last batch it was sent, and
//! who the client is. Publications are not stored — a node that takes a session over recovers
//! them from history, starting at the stored positions. Records are written with a version
//! check (compare-and-set), so a node that lost a session to another learns it on its next
//! write instead of overwriting the newer state.
//!
//! Besides records the store carries what nodes tell each other about sessions (a session
//! moved away, commands arrived for a session another node holds) and a per-session lock that
//! keeps a move from interleaving with the execution of commands.
//!
//! Redis layout (prefix from the broker URL, `sb` by default; `{id}` is a hash tag so a
//! session's keys share a slot): `<p>:poll:{<id>}` hash (`v` version, `rec` JSON record),
//! `<p>:poll:{<id>}:c` list of queued command bodies, `<p>:poll:{<id>}:l` lock,
//! `<p>:poll:node:<node id>` the pub/sub channel of a node's notices.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::auth::pattern::PatternSet;
use crate::auth::{Identity, Method};

/// A failed store operation (Redis unreachable, a corrupt record).
#[derive(Debug, thiserror::Error)]
#[error("poll session store: {0}")]
pub struct StoreError(pub String);

fn redis_err(e: redis::RedisError) -> StoreError {
    StoreError(format!("redis: {e}"))
}

/// A channel's position in a stored session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSub {
    pub ch: String,
    pub epoch: String,
    pub off: u64,
}

/// Who the client is, without secrets: enough to rebuild its identity on another node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredIdentity {
    /// `anonymous`, `token` or `password`.
    pub method: String,
    pub user: String,
    pub expires: Option<u64>,
    pub channels: Option<Vec<String>>,
    pub publish: Option<Vec<String>>,
}

impl StoredIdentity {
    /// What is kept of `i`: no secret, only what its checks need.
    pub fn of(i: &Identity) -> StoredIdentity {
        let list = |p: &Option<Arc<PatternSet>>| p.as_ref().map(|p| p.0.iter().map(|x| x.to_string()).collect());
        StoredIdentity {
            method: match i.method {
                Method::Anonymous => "anonymous",
                Method::Token => "token",
                Method::Password => "password",
                Method::Hook => "hook",
                Method::ApiKey(_) => "api_key",
            }
            .to_string(),
            user: i.user.clone(),
            expires: i.expires,
            channels: list(&i.channels),
            publish: list(&i.publish),
        }
    }

    /// The identity back (its token's expiry included: a takeover checks it first).
    pub fn identity(&self) -> Identity {
        // Patterns that no longer parse grant nothing.
        let set = |l: &Option<Vec<String>>| l.as_ref().map(|l| Arc::new(PatternSet::parse(l).unwrap_or_default()));
        let method = match self.method.as_str() {
            "token" => Method::Token,
            "password" => Method::Password,
            "hook" => Method::Hook,
            _ => return Identity::anonymous(),
        };
        Identity {
            method,
            user: self.user.clone(),
            channels: set(&self.channels),
            publish: set(&self.publish),
            expires: self.expires,
            jti: None,
            issued_at: None,
        }
    }
}

/// A session's stored state. See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Bumped by every write; the compare-and-set token.
    pub version: u64,
    /// The node holding the session's live copy; empty when none does.
    pub owner: String,
    pub identity: StoredIdentity,
    /// Number of the last batch sent to the client.
    pub seq: u64,
    /// Subscriptions, in subscription order.
    pub subs: Vec<StoredSub>,
    /// Replies (JSON messages) not yet in a batch.
    pub queued: Vec<String>,
}

/// What one node tells another about a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The session moved to another node: drop the live copy.
    Moved(String),
    /// Commands were queued for the session: run them.
    Commands(String),
}

impl Notice {
    fn encode(&self) -> String {
        match self {
            Notice::Moved(id) => format!("moved {id}"),
            Notice::Commands(id) => format!("cmds {id}"),
        }
    }

    fn decode(s: &str) -> Option<Notice> {
        let (kind, id) = s.split_once(' ')?;
        match kind {
            "moved" => Some(Notice::Moved(id.to_string())),
            "cmds" => Some(Notice::Commands(id.to_string())),
            _ => None,
        }
    }
}

/// Proof of holding a session's lock.
#[derive(Debug)]
pub struct LockToken(String);

/// 128 random bits in hex: session ids and lock tokens.
pub fn random_id() -> String {
    let mut b = [0u8; 16];
    if getrandom::getrandom(&mut b).is_err() {
        // No OS randomness (never seen on the supported platforms): fall back to the
        // process's generator rather than refusing service.
        for x in b.iter_mut() {
            *x = fastrand::u8(..);
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Session state storage. All methods are safe to call concurrently.
#[async_trait::async_trait]
pub trait PollStore: Send + Sync + 'static {
    /// `memory` or `redis`.
    fn kind(&self) -> &'static str;

    /// Whether other nodes share this store (sessions may move between nodes).
    fn shared(&self) -> bool;

    async fn load(&self, id: &str) -> Result<Option<Record>, StoreError>;

    /// Writes `record` (its `version` must be `expected + 1`) if the stored version is still
    /// `expected` (0: no record yet), and sets the session's expiry to `ttl`. `Ok(false)`: the
    /// record changed in between (another node took the session) and nothing was written.
    async fn save(&self, id: &str, expected: u64, record: &Record, ttl: Duration) -> Result<bool, StoreError>;

    /// Pushes the session's expiry to `ttl` from now.
    async fn touch(&self, id: &str, ttl: Duration) -> Result<(), StoreError>;

    /// Deletes the session's record and queued commands.
    async fn remove(&self, id: &str) -> Result<(), StoreError>;

    /// Queues a command body for whichever node runs the session.
    async fn push_commands(&self, id: &str, body: &[u8], ttl: Duration) -> Result<(), StoreError>;

    /// Takes every queued command body, oldest first.
    async fn take_commands(&self, id: &str) -> Result<Vec<Vec<u8>>, StoreError>;

    /// Sends `notice` to node `to`.
    async fn notify(&self, to: &str, notice: Notice) -> Result<(), StoreError>;

    /// Starts delivering the notices sent to `node`; called once per node.
    fn listen(&self, node: &str) -> mpsc::UnboundedReceiver<Notice>;

    /// Takes the session's lock, waiting up to `wait`; `Ok(None)` when it stayed taken.
    async fn lock(&self, id: &str, wait: Duration) -> Result<Option<LockToken>, StoreError>;

    async fn unlock(&self, id: &str, token: LockToken) -> Result<(), StoreError>;
}

/// The store of a node with the embedded broker: a map in memory. Sessions never move (there
/// is no other node), so notices only loop back and the lock is a formality — the live
/// session's own mutex orders its commands.
#[derive(Default)]
pub struct MemoryPollStore {
    state: Mutex<MemoryState>,
}

#[derive(Default)]
struct MemoryState {
    records: HashMap<String, (Record, Instant)>,
    commands: HashMap<String, Vec<Vec<u8>>>,
    listeners: HashMap<String, mpsc::UnboundedSender<Notice>>,
    /// When expired records are next swept out (at most once a second: a sweep is a scan).
    next_sweep: Option<Instant>,
}

impl MemoryPollStore {
    pub fn new() -> MemoryPollStore {
        MemoryPollStore::default()
    }

    /// Drops expired records, at most once a second; reads check their own record's expiry.
    fn expire(st: &mut MemoryState) {
        let now = Instant::now();
        if st.next_sweep.is_some_and(|t| now < t) {
            return;
        }
        st.next_sweep = Some(now + Duration::from_secs(1));
        let dead: Vec<String> = st.records.iter().filter(|(_, (_, t))| *t <= now).map(|(k, _)| k.clone()).collect();
        for k in dead {
            st.records.remove(&k);
            st.commands.remove(&k);
        }
    }
}

#[async_trait::async_trait]
impl PollStore for MemoryPollStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn shared(&self) -> bool {
        false
    }

    async fn load(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let mut st = self.state.lock();
        MemoryPollStore::expire(&mut st);
        let now = Instant::now();
        Ok(st.records.get(id).filter(|(_, t)| *t > now).map(|(r, _)| r.clone()))
    }

    async fn save(&self, id: &str, expected: u64, record: &Record, ttl: Duration) -> Result<bool, StoreError> {
        let mut st = self.state.lock();
        MemoryPollStore::expire(&mut st);
        let now = Instant::now();
        let current = st.records.get(id).filter(|(_, t)| *t > now).map_or(0, |(r, _)| r.version);
        if current != expected {
            return Ok(false);
        }
        st.records.insert(id.to_string(), (record.clone(), Instant::now() + ttl));
        Ok(true)
    }

    async fn touch(&self, id: &str, ttl: Duration) -> Result<(), StoreError> {
        if let Some((_, t)) = self.state.lock().records.get_mut(id) {
            *t = Instant::now() + ttl;
        }
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<(), StoreError> {
        let mut st = self.state.lock();
        st.records.remove(id);
        st.commands.remove(id);
        Ok(())
    }

    async fn push_commands(&self, id: &str, body: &[u8], _ttl: Duration) -> Result<(), StoreError> {
        self.state.lock().commands.entry(id.to_string()).or_default().push(body.to_vec());
        Ok(())
    }

    async fn take_commands(&self, id: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self.state.lock().commands.remove(id).unwrap_or_default())
    }

    async fn notify(&self, to: &str, notice: Notice) -> Result<(), StoreError> {
        if let Some(tx) = self.state.lock().listeners.get(to) {
            let _ = tx.send(notice);
        }
        Ok(())
    }

    fn listen(&self, node: &str) -> mpsc::UnboundedReceiver<Notice> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.state.lock().listeners.insert(node.to_string(), tx);
        rx
    }

    async fn lock(&self, _id: &str, _wait: Duration) -> Result<Option<LockToken>, StoreError> {
        Ok(Some(LockToken(String::new())))
    }

    async fn unlock(&self, _id: &str, _token: LockToken) -> Result<(), StoreError> {
        Ok(())
    }
}

/// How long a session lock lives if its holder dies holding it.
const LOCK_TTL: Duration = Duration::from_secs(10);
/// Pause between attempts to take a held lock.
const LOCK_RETRY: Duration = Duration::from_millis(5);

const SAVE: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if (v or '0') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'rec', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
";

const TAKE: &str = r"
local r = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return r
";

const UNLOCK: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// The command connection: one server (reconnecting), or a Redis Cluster (each session's keys
/// go to the node serving their slot; slot moves and failovers followed by the driver).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Where the store's commands go.
enum Commands {
    Single(ConnectionManager),
    /// Connected on first use (the cluster client's connect is async).
    Cluster(Box<(ClusterClient, tokio::sync::OnceCell<ClusterConnection>)>),
}

/// The store of a cluster: the broker's Redis. Built from the same URL as the broker (same
/// database, same key prefix; [`switchboard_broker::redis::parse_url`]): one Redis, the first
/// of a list of shards (sessions are few and small; every node must agree where they are), or
/// a Redis Cluster. It has its own connections: one multiplexed, reconnecting command
/// connection and one pub/sub connection for the node's notices (plain `PUBLISH`, which a
/// Redis Cluster delivers on every node: notices are rare).
pub struct RedisPollStore {
    /// For the notices' pub/sub connection, tried in turn.
    clients: Vec<redis::Client>,
    commands: Commands,
    prefix: String,
    save: redis::Script,
    take: redis::Script,
    unlock: redis::Script,
}

impl RedisPollStore {
    /// Connects lazily to the broker URL's Redis. Call inside a Tokio runtime.
    pub fn new(broker_url: &str) -> Result<RedisPollStore, StoreError> {
        if broker_url.contains("+cluster://") {
            let (seeds, options) = switchboard_broker::cluster::seed_urls(broker_url).map_err(StoreError)?;
            let clients = seeds
                .iter()
                .map(|u| switchboard_broker::redis::client_for(u))
                .collect::<Result<Vec<_>, _>>()
                .map_err(StoreError)?;
            // The cluster client takes the CA apart from the URLs.
            let mut ca = None;
            let mut plain = Vec::new();
            for seed in &seeds {
                let (url, pem) = switchboard_broker::redis::take_tls_ca(seed).map_err(StoreError)?;
                plain.push(url);
                ca = ca.or(pem);
            }
            let mut builder = redis::cluster::ClusterClientBuilder::new(plain)
                .connection_timeout(Duration::from_secs(3))
                .response_timeout(Duration::from_secs(5));
            if let Some(pem) = ca {
                builder = builder.certs(redis::TlsCertificates { client_tls: None, root_cert: Some(pem) });
            }
            let cluster = builder.build().map_err(redis_err)?;
            return Ok(RedisPollStore::with(
                clients,
                Commands::Cluster(Box::new((cluster, tokio::sync::OnceCell::new()))),
                options.prefix,
            ));
        }
        let first = broker_url.split(',').next().unwrap_or(broker_url).trim();
        let (url, options) = switchboard_broker::redis::parse_url(first).map_err(StoreError)?;
        let client = switchboard_broker::redis::client_for(&url).map_err(StoreError)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(3)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(2));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config).map_err(redis_err)?;
        Ok(RedisPollStore::with(vec![client], Commands::Single(conn), options.prefix))
    }

    fn with(clients: Vec<redis::Client>, commands: Commands, prefix: String) -> RedisPollStore {
        RedisPollStore {
            clients,
            commands,
            prefix,
            save: redis::Script::new(SAVE),
            take: redis::Script::new(TAKE),
            unlock: redis::Script::new(UNLOCK),
        }
    }

    /// The command connection (the cluster's made on first use).
    async fn conn(&self) -> Result<Conn, StoreError> {
        match &self.commands {
            Commands::Single(c) => Ok(Conn::Single(c.clone())),
            Commands::Cluster(cluster) => {
                let (client, conn) = &**cluster;
                let c = conn.get_or_try_init(|| client.get_async_connection()).await.map_err(redis_err)?;
                Ok(Conn::Cluster(c.clone()))
            }
        }
    }

    fn key(&self, id: &str) -> String {
        format!("{}:poll:{{{id}}}", self.prefix)
    }

    fn commands_key(&self, id: &str) -> String {
        format!("{}:poll:{{{id}}}:c", self.prefix)
    }

    fn lock_key(&self, id: &str) -> String {
        format!("{}:poll:{{{id}}}:l", self.prefix)
    }

    fn node_channel(&self, node: &str) -> String {
        format!("{}:poll:node:{node}", self.prefix)
    }
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[async_trait::async_trait]
impl PollStore for RedisPollStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn shared(&self) -> bool {
        true
    }

    async fn load(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let text: Option<String> = redis::cmd("HGET")
            .arg(self.key(id))
            .arg("rec")
            .query_async(&mut self.conn().await?)
            .await
            .map_err(redis_err)?;
        text.map(|t| serde_json::from_str(&t).map_err(|e| StoreError(format!("corrupt session record: {e}"))))
            .transpose()
    }

    async fn save(&self, id: &str, expected: u64, record: &Record, ttl: Duration) -> Result<bool, StoreError> {
        let text = serde_json::to_string(record).map_err(|e| StoreError(e.to_string()))?;
        let done: i64 = self
            .save
            .key(self.key(id))
            .key(self.commands_key(id))
            .arg(expected)
            .arg(record.version)
            .arg(text)
            .arg(ttl_ms(ttl))
            .invoke_async(&mut self.conn().await?)
            .await
            .map_err(redis_err)?;
        Ok(done == 1)
    }

    async fn touch(&self, id: &str, ttl: Duration) -> Result<(), StoreError> {
        let ms = ttl_ms(ttl);
        redis::pipe()
            .cmd("PEXPIRE")
            .arg(self.key(id))
            .arg(ms)
            .ignore()
            .cmd("PEXPIRE")
            .arg(self.commands_key(id))
            .arg(ms)
            .ignore()
            .query_async::<()>(&mut self.conn().await?)
            .await
            .map_err(redis_err)
    }

    async fn remove(&self, id: &str) -> Result<(), StoreError> {
        redis::cmd("DEL")
            .arg(self.key(id))
            .arg(self.commands_key(id))
            .query_async::<()>(&mut self.conn().await?)
            .await
            .map_err(redis_err)
    }

    async fn push_commands(&self, id: &str, body: &[u8], ttl: Duration) -> Result<(), StoreError> {
        let key = self.commands_key(id);
        redis::pipe()
            .cmd("RPUSH")
            .arg(&key)
            .arg(body)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(ttl_ms(ttl))
            .ignore()
            .query_async::<()>(&mut self.conn().await?)
            .await
            .map_err(redis_err)
    }

    async fn take_commands(&self, id: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        self.take.key(self.commands_key(id)).invoke_async(&mut self.conn().await?).await.map_err(redis_err)
    }

    async fn notify(&self, to: &str, notice: Notice) -> Result<(), StoreError> {
        redis::cmd("PUBLISH")
            .arg(self.node_channel(to))
            .arg(notice.encode())
            .query_async::<()>(&mut self.conn().await?)
            .await
            .map_err(redis_err)
    }

    fn listen(&self, node: &str) -> mpsc::UnboundedReceiver<Notice> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (clients, channel) = (self.clients.clone(), self.node_channel(node));
        switchboard_supervisor::spawn("poll-store-listener", move |_| {
            listen_task(clients.clone(), channel.clone(), tx.clone())
        });
        rx
    }

    async fn lock(&self, id: &str, wait: Duration) -> Result<Option<LockToken>, StoreError> {
        let token = random_id();
        let key = self.lock_key(id);
        let until = Instant::now() + wait;
        loop {
            let got: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms(LOCK_TTL))
                .query_async(&mut self.conn().await?)
                .await
                .map_err(redis_err)?;
            if got.is_some() {
                return Ok(Some(LockToken(token)));
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            tokio::time::sleep(LOCK_RETRY).await;
        }
    }

    async fn unlock(&self, id: &str, token: LockToken) -> Result<(), StoreError> {
        self.unlock
            .key(self.lock_key(id))
            .arg(token.0)
            .invoke_async::<i64>(&mut self.conn().await?)
            .await
            .map(|_| ())
            .map_err(redis_err)
    }
}

/// Keeps a pub/sub subscription to the node's notice channel, reconnecting with backoff, and
/// forwards what arrives. Ends when the receiver is gone.
async fn listen_task(clients: Vec<redis::Client>, channel: String, tx: mpsc::UnboundedSender<Notice>) {
    use futures_util::StreamExt;
    let mut backoff = Duration::from_millis(100);
    let mut turn = 0;
    while !tx.is_closed() {
        let client = clients[turn % clients.len()].clone();
        turn += 1;
        let connected = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match tokio::time::timeout(Duration::from_secs(3), connected).await {
            Ok(Ok(pubsub)) => {
                backoff = Duration::from_millis(100);
                let mut messages = pubsub.into_on_message();
                loop {
                    tokio::select! {
                        m = messages.next() => {
                            let Some(m) = m else { break };
                            let Ok(text) = m.get_payload::<String>() else { continue };
                            if let Some(n) = Notice::decode(&text) {
                                if tx.send(n).is_err() {
                                    return;
                                }
                            }
                        }
                        _ = tx.closed() => return,
                    }
                }
                tracing::warn!("poll session notices: redis pub/sub connection lost; reconnecting");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "poll session notices: redis unreachable"),
            Err(_) => tracing::warn!("poll session notices: redis connect timed out"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// The store for a broker URL: memory for `memory`, Redis otherwise (not yet behind
/// Sentinel: there the nodes keep sessions in memory and a session cannot move).
pub fn for_broker(broker: &str) -> Result<Arc<dyn PollStore>, StoreError> {
    if broker == "memory" {
        Ok(Arc::new(MemoryPollStore::new()))
    } else {
        Ok(Arc::new(RedisPollStore::new(broker)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(version: u64) -> Record {
        Record {
            version,
            owner: "n1".into(),
            seq: 3,
            subs: vec![StoredSub { ch: "a".into(), epoch: "e".into(), off: 4 }],
            queued: vec!["{\"id\":1,\"ok\":{}}".into()],
            ..Record::default()
        }
    }

    #[tokio::test]
    async fn poll_store_memory_compare_and_set() {
        let s = MemoryPollStore::new();
        let ttl = Duration::from_secs(60);
        assert!(s.load("x").await.unwrap().is_none());
        assert!(s.save("x", 0, &record(1), ttl).await.unwrap());
        assert!(!s.save("x", 0, &record(1), ttl).await.unwrap(), "a second creation loses");
        assert!(s.save("x", 1, &record(2), ttl).await.unwrap());
        assert!(!s.save("x", 1, &record(2), ttl).await.unwrap(), "a stale writer loses");
        assert_eq!(s.load("x").await.unwrap().unwrap(), record(2));
        s.push_commands("x", b"a", ttl).await.unwrap();
        s.push_commands("x", b"b", ttl).await.unwrap();
        assert_eq!(s.take_commands("x").await.unwrap(), vec![b"a".to_vec(), b"b".to_vec()]);
        assert!(s.take_commands("x").await.unwrap().is_empty());
        s.remove("x").await.unwrap();
        assert!(s.load("x").await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn poll_store_memory_records_expire() {
        let s = MemoryPollStore::new();
        assert!(s.save("x", 0, &record(1), Duration::from_secs(5)).await.unwrap());
        tokio::time::advance(Duration::from_secs(3)).await;
        s.touch("x", Duration::from_secs(5)).await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(s.load("x").await.unwrap().is_some(), "touched");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(s.load("x").await.unwrap().is_none(), "expired");
    }

    #[tokio::test]
    async fn poll_store_memory_notices_reach_the_listener() {
        let s = MemoryPollStore::new();
        let mut rx = s.listen("n1");
        s.notify("n1", Notice::Moved("abc".into())).await.unwrap();
        s.notify("n2", Notice::Commands("zzz".into())).await.unwrap();
        assert_eq!(rx.recv().await, Some(Notice::Moved("abc".into())));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn poll_store_notices_round_trip() {
        for n in [Notice::Moved("a1".into()), Notice::Commands("b2".into())] {
            assert_eq!(Notice::decode(&n.encode()), Some(n));
        }
        assert_eq!(Notice::decode("nonsense"), None);
    }
}
