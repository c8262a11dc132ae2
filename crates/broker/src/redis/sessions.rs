//! The session store in Redis ([`crate::sessions`]), on the broker's own command connection.
//!
//! Key layout (`P` the key prefix; `{<id>}` a hash tag, so a session's keys share a slot and a
//! Redis Cluster keeps them on one node):
//! - `P:poll:{<id>}` hash: `v` the version, `rec` the record
//! - `P:poll:{<id>}:c` list: queued command bodies, oldest first
//! - `P:poll:{<id>}:l` string: the lock holder's token, expiring after [`LOCK_TTL`]
//! - `P:poll:node:<node id>`: the pub/sub channel of the notices sent to a node (`moved <id>`,
//!   `cmds <id>`). A plain `PUBLISH`, which a Redis Cluster delivers on every node: the listener
//!   may be connected to any of them (notices are rare).
//!
//! A save is one script (compare the version, write, set both keys' expiry); taking the queue
//! and unlocking are scripts too, so no other node's command falls between their steps. A node
//! listens for its notices on a pub/sub connection of its own, made through the broker's
//! endpoint (so behind Sentinel it follows the primary) and made again with backoff.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use tokio::sync::mpsc;

use super::{Inner, RedisBroker};
use crate::sessions::{ttl_ms, SessionLock, SessionNotice, SessionStore, StoredSession, LOCK_TTL};
use crate::BrokerError;

/// KEYS[1] the record hash, KEYS[2] the command queue; ARGV[1] the expected version, ARGV[2]
/// the new one, ARGV[3] the record, ARGV[4] the ttl in ms. 1 when written, 0 when the version
/// was not the expected one.
const SAVE: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if (v or '0') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'rec', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
";

/// KEYS[1] the command queue: every entry, oldest first; the queue is gone after.
const TAKE: &str = r"
local r = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return r
";

/// KEYS[1] the lock; ARGV[1] the token. Deletes it only when the token holds it.
const UNLOCK: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

pub(crate) struct SessionScripts {
    save: Script,
    take: Script,
    unlock: Script,
}

impl SessionScripts {
    pub(crate) fn new() -> SessionScripts {
        SessionScripts { save: Script::new(SAVE), take: Script::new(TAKE), unlock: Script::new(UNLOCK) }
    }
}

/// The pub/sub channel of the notices sent to `node`, under key prefix `prefix`.
pub(crate) fn notice_channel(prefix: &str, node: &str) -> String {
    format!("{prefix}:poll:node:{node}")
}

/// Session `id`'s keys after the prefix, without their suffix: `poll:{<id>}`. A router routes
/// the session by it ([`crate::routed::Router::session_route`]), so that it reaches the server
/// of its keys' slot whatever the id holds (a client may send any id, `{` and `}` included).
pub(crate) fn session_name(id: &str) -> String {
    format!("poll:{{{id}}}")
}

impl Inner {
    fn session_key(&self, id: &str) -> String {
        format!("{}:{}", self.keys.prefix, session_name(id))
    }

    fn commands_key(&self, id: &str) -> String {
        format!("{}:{}:c", self.keys.prefix, session_name(id))
    }

    fn lock_key(&self, id: &str) -> String {
        format!("{}:{}:l", self.keys.prefix, session_name(id))
    }
}

impl RedisBroker {
    /// A client of the server this broker talks to now (behind Sentinel, the current primary).
    pub(crate) async fn client(&self) -> Result<redis::Client, BrokerError> {
        self.inner.endpoint.client().await.map_err(super::unavailable)
    }
}

#[async_trait::async_trait]
impl SessionStore for RedisBroker {
    fn shared(&self) -> bool {
        true
    }

    async fn load(&self, id: &str) -> Result<Option<StoredSession>, BrokerError> {
        let i = &self.inner;
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(i.session_key(id)).arg("v").arg("rec");
        let (version, data): (Option<u64>, Option<String>) =
            cmd.query_async(&mut i.conn().await?).await.map_err(|e| i.failed(e))?;
        Ok(data.map(|data| StoredSession { version: version.unwrap_or(0), data }))
    }

    async fn save(&self, id: &str, expected: u64, session: &StoredSession, ttl: Duration) -> Result<bool, BrokerError> {
        let i = &self.inner;
        let mut call = i.sessions.save.key(i.session_key(id));
        call.key(i.commands_key(id)).arg(expected).arg(session.version).arg(&session.data).arg(ttl_ms(ttl));
        let done: i64 = call.invoke_async(&mut i.conn().await?).await.map_err(|e| i.failed(e))?;
        Ok(done == 1)
    }

    async fn touch(&self, id: &str, ttl: Duration) -> Result<(), BrokerError> {
        let i = &self.inner;
        let ms = ttl_ms(ttl);
        let mut pipe = redis::pipe();
        pipe.cmd("PEXPIRE").arg(i.session_key(id)).arg(ms).ignore();
        pipe.cmd("PEXPIRE").arg(i.commands_key(id)).arg(ms).ignore();
        pipe.query_async::<()>(&mut i.conn().await?).await.map_err(|e| i.failed(e))
    }

    async fn remove(&self, id: &str) -> Result<(), BrokerError> {
        let i = &self.inner;
        let mut cmd = redis::cmd("DEL");
        cmd.arg(i.session_key(id)).arg(i.commands_key(id));
        cmd.query_async::<()>(&mut i.conn().await?).await.map_err(|e| i.failed(e))
    }

    async fn push_commands(&self, id: &str, body: &[u8], ttl: Duration) -> Result<(), BrokerError> {
        let i = &self.inner;
        let key = i.commands_key(id);
        let mut pipe = redis::pipe();
        pipe.cmd("RPUSH").arg(&key).arg(body).ignore();
        pipe.cmd("PEXPIRE").arg(&key).arg(ttl_ms(ttl)).ignore();
        pipe.query_async::<()>(&mut i.conn().await?).await.map_err(|e| i.failed(e))
    }

    async fn take_commands(&self, id: &str) -> Result<Vec<Vec<u8>>, BrokerError> {
        let i = &self.inner;
        let call = i.sessions.take.key(i.commands_key(id));
        call.invoke_async(&mut i.conn().await?).await.map_err(|e| i.failed(e))
    }

    async fn notify(&self, node: &str, notice: &SessionNotice) -> Result<(), BrokerError> {
        let i = &self.inner;
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(notice_channel(&i.keys.prefix, node)).arg(notice.encode());
        cmd.query_async::<()>(&mut i.conn().await?).await.map_err(|e| i.failed(e))
    }

    /// On a connection to the server the broker talks to at each attempt; ends when the
    /// receiver or the broker is dropped.
    fn listen(&self, node: &str) -> mpsc::UnboundedReceiver<SessionNotice> {
        let inner = Arc::downgrade(&self.inner);
        listen_with(notice_channel(&self.inner.keys.prefix, node), move || {
            let inner = inner.clone();
            async move {
                let inner = inner.upgrade()?;
                Some(inner.endpoint.client().await.map_err(super::unavailable))
            }
        })
    }

    async fn try_lock(&self, id: &str, token: &str) -> Result<bool, BrokerError> {
        let i = &self.inner;
        let mut cmd = redis::cmd("SET");
        cmd.arg(i.lock_key(id)).arg(token).arg("NX").arg("PX").arg(ttl_ms(LOCK_TTL));
        let got: Option<String> = cmd.query_async(&mut i.conn().await?).await.map_err(|e| i.failed(e))?;
        Ok(got.is_some())
    }

    async fn unlock(&self, id: &str, lock: SessionLock) -> Result<(), BrokerError> {
        let i = &self.inner;
        let mut call = i.sessions.unlock.key(i.lock_key(id));
        call.arg(lock.0);
        call.invoke_async::<i64>(&mut i.conn().await?).await.map(drop).map_err(|e| i.failed(e))
    }
}

/// Delivers the notices published on `channel`, from a pub/sub subscription kept by a
/// supervised task: `pick` names the server to connect to at each attempt (`None`: the broker
/// is gone, the task ends), tried again with backoff after a failure or a lost connection.
/// The task also ends when the receiver is dropped.
pub(crate) fn listen_with<P, F>(channel: String, pick: P) -> mpsc::UnboundedReceiver<SessionNotice>
where
    P: Fn() -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Option<Result<redis::Client, BrokerError>>> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    switchboard_supervisor::spawn("poll-store-listener", move |_| {
        listen_task(pick.clone(), channel.clone(), tx.clone())
    });
    rx
}

async fn listen_task<P, F>(pick: P, channel: String, tx: mpsc::UnboundedSender<SessionNotice>)
where
    P: Fn() -> F,
    F: Future<Output = Option<Result<redis::Client, BrokerError>>>,
{
    use futures_util::StreamExt;
    let mut backoff = Duration::from_millis(100);
    while !tx.is_closed() {
        let connected = async {
            let client = pick().await?.map_err(|e| e.to_string());
            let subscribed = async {
                let mut pubsub = client?.get_async_pubsub().await.map_err(|e| e.to_string())?;
                pubsub.subscribe(&channel).await.map_err(|e| e.to_string())?;
                Ok::<_, String>(pubsub)
            };
            Some(subscribed.await)
        };
        match tokio::time::timeout(Duration::from_secs(3), connected).await {
            Ok(None) => return,
            Ok(Some(Ok(pubsub))) => {
                backoff = Duration::from_millis(100);
                let mut messages = pubsub.into_on_message();
                loop {
                    tokio::select! {
                        m = messages.next() => {
                            let Some(m) = m else { break };
                            let Ok(text) = m.get_payload::<String>() else { continue };
                            if let Some(n) = SessionNotice::decode(&text) {
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
            Ok(Some(Err(e))) => tracing::warn!(error = %e, "poll session notices: redis unreachable"),
            Err(_) => tracing::warn!("poll session notices: redis connect timed out"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
