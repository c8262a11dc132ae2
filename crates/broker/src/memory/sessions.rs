//! The memory broker's session store ([`crate::sessions`]): tables in the process. There is no
//! other node, so sessions never move and a notice only reaches this node's own listener; the
//! rules (versions, expiry, the queue, the lock) are those of the Redis store all the same, so
//! that the conformance suite holds both to them.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::sessions::{SessionLock, SessionNotice, SessionStore, StoredSession, LOCK_TTL};
use crate::BrokerError;

/// The tables, each entry with its expiry. Locking: one mutex, never held across an await.
#[derive(Default)]
pub(crate) struct MemorySessions {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    records: HashMap<String, (StoredSession, Instant)>,
    commands: HashMap<String, (Vec<Vec<u8>>, Instant)>,
    /// The holder's token.
    locks: HashMap<String, (String, Instant)>,
    listeners: HashMap<String, mpsc::UnboundedSender<SessionNotice>>,
    /// When expired entries are next swept out (at most once a second: a sweep is a scan).
    next_sweep: Option<Instant>,
}

/// The entry of `id` in `table` unless it expired.
fn live<'a, T>(table: &'a mut HashMap<String, (T, Instant)>, id: &str, now: Instant) -> Option<&'a mut (T, Instant)> {
    table.get_mut(id).filter(|(_, t)| *t > now)
}

impl State {
    /// Drops expired entries, at most once a second; reads check their own entry's expiry.
    fn sweep(&mut self, now: Instant) {
        if self.next_sweep.is_some_and(|t| now < t) {
            return;
        }
        self.next_sweep = Some(now + Duration::from_secs(1));
        self.records.retain(|_, (_, t)| *t > now);
        self.commands.retain(|_, (_, t)| *t > now);
        self.locks.retain(|_, (_, t)| *t > now);
    }

    /// Sets the expiry of the session's record and queued commands, those that exist.
    fn expire_at(&mut self, id: &str, now: Instant, until: Instant) {
        if let Some((_, t)) = live(&mut self.records, id, now) {
            *t = until;
        }
        if let Some((_, t)) = live(&mut self.commands, id, now) {
            *t = until;
        }
    }
}

#[async_trait::async_trait]
impl SessionStore for MemorySessions {
    fn shared(&self) -> bool {
        false
    }

    async fn load(&self, id: &str) -> Result<Option<StoredSession>, BrokerError> {
        let now = Instant::now();
        let mut st = self.state.lock();
        st.sweep(now);
        Ok(live(&mut st.records, id, now).map(|(s, _)| s.clone()))
    }

    async fn save(&self, id: &str, expected: u64, session: &StoredSession, ttl: Duration) -> Result<bool, BrokerError> {
        let now = Instant::now();
        let mut st = self.state.lock();
        st.sweep(now);
        let current = live(&mut st.records, id, now).map_or(0, |(s, _)| s.version);
        if current != expected {
            return Ok(false);
        }
        st.records.insert(id.to_string(), (session.clone(), now + ttl));
        st.expire_at(id, now, now + ttl);
        Ok(true)
    }

    async fn touch(&self, id: &str, ttl: Duration) -> Result<(), BrokerError> {
        let now = Instant::now();
        self.state.lock().expire_at(id, now, now + ttl);
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<(), BrokerError> {
        let mut st = self.state.lock();
        st.records.remove(id);
        st.commands.remove(id);
        Ok(())
    }

    async fn push_commands(&self, id: &str, body: &[u8], ttl: Duration) -> Result<(), BrokerError> {
        let now = Instant::now();
        let mut st = self.state.lock();
        st.sweep(now);
        let expired = live(&mut st.commands, id, now).is_none();
        let queue = st.commands.entry(id.to_string()).or_insert_with(|| (Vec::new(), now));
        if expired {
            queue.0.clear();
        }
        queue.0.push(body.to_vec());
        queue.1 = now + ttl;
        Ok(())
    }

    async fn take_commands(&self, id: &str) -> Result<Vec<Vec<u8>>, BrokerError> {
        let now = Instant::now();
        let taken = self.state.lock().commands.remove(id);
        Ok(taken.filter(|(_, t)| *t > now).map(|(q, _)| q).unwrap_or_default())
    }

    async fn notify(&self, node: &str, notice: &SessionNotice) -> Result<(), BrokerError> {
        if let Some(tx) = self.state.lock().listeners.get(node) {
            let _ = tx.send(notice.clone());
        }
        Ok(())
    }

    fn listen(&self, node: &str) -> mpsc::UnboundedReceiver<SessionNotice> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.state.lock().listeners.insert(node.to_string(), tx);
        rx
    }

    async fn try_lock(&self, id: &str, token: &str) -> Result<bool, BrokerError> {
        let now = Instant::now();
        let mut st = self.state.lock();
        st.sweep(now);
        if live(&mut st.locks, id, now).is_some() {
            return Ok(false);
        }
        st.locks.insert(id.to_string(), (token.to_string(), now + LOCK_TTL));
        Ok(true)
    }

    async fn unlock(&self, id: &str, lock: SessionLock) -> Result<(), BrokerError> {
        let mut st = self.state.lock();
        if st.locks.get(id).is_some_and(|(holder, _)| *holder == lock.0) {
            st.locks.remove(id);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(version: u64) -> StoredSession {
        StoredSession { version, data: format!("{{\"v\":{version}}}") }
    }

    #[tokio::test(start_paused = true)]
    async fn broker_memory_sessions_expire_unless_touched() {
        let s = MemorySessions::default();
        assert!(s.save("x", 0, &session(1), Duration::from_secs(5)).await.unwrap());
        s.push_commands("x", b"a", Duration::from_secs(5)).await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        s.touch("x", Duration::from_secs(5)).await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(s.load("x").await.unwrap().is_some(), "touched");
        assert_eq!(s.take_commands("x").await.unwrap(), vec![b"a".to_vec()], "touched with the record");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(s.load("x").await.unwrap().is_none(), "expired");
        assert!(s.save("x", 0, &session(1), Duration::from_secs(5)).await.unwrap(), "an expired record is none");
    }

    #[tokio::test(start_paused = true)]
    async fn broker_memory_session_locks_expire_with_a_dead_holder() {
        let s = MemorySessions::default();
        assert!(s.try_lock("x", "a").await.unwrap());
        assert!(!s.try_lock("x", "b").await.unwrap());
        tokio::time::advance(LOCK_TTL).await;
        assert!(s.try_lock("x", "b").await.unwrap(), "the first holder's time is up");
        s.unlock("x", SessionLock("a".into())).await.unwrap();
        assert!(!s.try_lock("x", "c").await.unwrap(), "only the holder unlocks");
    }
}
