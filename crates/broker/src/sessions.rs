//! The session store ([`SessionStore`]): where a node keeps what lets any node of the cluster
//! continue a long-poll session it served. Per session: its record (text with a version, written
//! by compare-and-set and kept until its TTL), the command bodies other nodes queued for it, and
//! a lock; per node: the notices other nodes send it about sessions ([`SessionNotice`]).
//!
//! Records and commands are opaque here: the gateway writes them (JSON) and reads them back; the
//! store only compares versions and keeps time. Every broker is a store
//! ([`crate::Broker::sessions`]): the memory broker keeps sessions in its process (one node,
//! so sessions never move and notices only reach this node's own listener), the Redis brokers in
//! Redis, where every node finds them (`redis/sessions.rs`: the key layout); a broker over
//! several servers keeps each session whole on one of them (`routed/sessions.rs`).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::BrokerError;

/// How long a session lock lives if its holder dies holding it.
pub const LOCK_TTL: Duration = Duration::from_secs(10);
/// Pause between attempts to take a held lock.
const LOCK_RETRY: Duration = Duration::from_millis(5);

/// A session's record as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSession {
    /// Bumped by every write; the compare-and-set token ([`SessionStore::save`]).
    pub version: u64,
    /// The record itself, opaque to the store.
    pub data: String,
}

/// What one node tells another about a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionNotice {
    /// The session moved to another node: drop the live copy.
    Moved(String),
    /// Commands were queued for the session: run them.
    Commands(String),
}

impl SessionNotice {
    /// The notice as it travels between nodes: `moved <id>` or `cmds <id>`.
    pub fn encode(&self) -> String {
        match self {
            SessionNotice::Moved(id) => format!("moved {id}"),
            SessionNotice::Commands(id) => format!("cmds {id}"),
        }
    }

    pub fn decode(s: &str) -> Option<SessionNotice> {
        let (kind, id) = s.split_once(' ')?;
        match kind {
            "moved" => Some(SessionNotice::Moved(id.to_string())),
            "cmds" => Some(SessionNotice::Commands(id.to_string())),
            _ => None,
        }
    }
}

/// Proof of holding a session's lock ([`SessionStore::lock`]): its token.
#[derive(Debug)]
pub struct SessionLock(pub(crate) String);

/// Milliseconds of a TTL for the store (at least 1: zero would mean "gone at once" in one store
/// and "no expiry" in another).
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Long-poll session state shared by the nodes that may serve a session. All methods are safe
/// to call concurrently; the memory broker and every Redis broker behave alike (the
/// conformance suite holds them to it), except that notices cross nodes only where nodes share
/// the store ([`SessionStore::shared`]). A session id holds neither `{` nor `}`: in Redis it is
/// the hash tag of the session's keys.
#[async_trait::async_trait]
pub trait SessionStore: Send + Sync {
    /// Whether other nodes share this store (sessions may move between nodes).
    fn shared(&self) -> bool;

    /// The session's record; `None` when there is none or it expired.
    async fn load(&self, id: &str) -> Result<Option<StoredSession>, BrokerError>;

    /// Writes `session` (its `version` the next one) if the stored version is still `expected`
    /// (0: no record yet), and sets the expiry of the session's record and queued commands to
    /// `ttl` from now. `Ok(false)`: the record changed in between (another node took the
    /// session) and nothing was written.
    async fn save(&self, id: &str, expected: u64, session: &StoredSession, ttl: Duration) -> Result<bool, BrokerError>;

    /// Pushes the expiry of the session's record and queued commands to `ttl` from now.
    async fn touch(&self, id: &str, ttl: Duration) -> Result<(), BrokerError>;

    /// Deletes the session's record and queued commands.
    async fn remove(&self, id: &str) -> Result<(), BrokerError>;

    /// Queues a command body for whichever node runs the session; the queue expires `ttl` from
    /// now unless the session's record is written or touched.
    async fn push_commands(&self, id: &str, body: &[u8], ttl: Duration) -> Result<(), BrokerError>;

    /// Takes every queued command body, oldest first.
    async fn take_commands(&self, id: &str) -> Result<Vec<Vec<u8>>, BrokerError>;

    /// Sends `notice` to node `node` (dropped when it does not listen).
    async fn notify(&self, node: &str, notice: &SessionNotice) -> Result<(), BrokerError>;

    /// Starts delivering the notices sent to `node`; called once per node. A shared store keeps
    /// listening across lost connections (notices sent meanwhile are lost) until the receiver
    /// is dropped.
    fn listen(&self, node: &str) -> mpsc::UnboundedReceiver<SessionNotice>;

    /// Takes the session's lock under `token` for [`LOCK_TTL`] if no one holds it (or its
    /// holder's time is up); false when someone does.
    async fn try_lock(&self, id: &str, token: &str) -> Result<bool, BrokerError>;

    /// Gives the lock back, if `lock` still holds it.
    async fn unlock(&self, id: &str, lock: SessionLock) -> Result<(), BrokerError>;

    /// Takes the session's lock, waiting up to `wait` for its holder; `Ok(None)` when it stayed
    /// taken.
    async fn lock(&self, id: &str, wait: Duration) -> Result<Option<SessionLock>, BrokerError> {
        // Tokens only tell holders apart: a process's generator is enough.
        let token = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let until = Instant::now() + wait;
        loop {
            if self.try_lock(id, &token).await? {
                return Ok(Some(SessionLock(token)));
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            tokio::time::sleep(LOCK_RETRY).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_session_notices_round_trip() {
        for n in [SessionNotice::Moved("a1".into()), SessionNotice::Commands("b2".into())] {
            assert_eq!(SessionNotice::decode(&n.encode()), Some(n));
        }
        assert_eq!(SessionNotice::decode("nonsense"), None);
        assert_eq!(SessionNotice::decode("other x"), None);
    }
}
