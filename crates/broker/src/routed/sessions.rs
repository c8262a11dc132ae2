//! A routed broker's session store ([`crate::sessions`]): each session whole on the target
//! [`Router::session_route`] names for its id (its keys share a hash tag, so on a Redis Cluster
//! that is the primary serving their slot), and the notices to a node on the target its id
//! names. Calls are tried again while routes change, as a channel's are; a call that changes
//! the store only when it surely did not run, since running it twice is not the same as once (a
//! save would find its own version, a command would be queued twice).

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{retriable, Route, RoutedBroker, Router};
use crate::sessions::{SessionLock, SessionNotice, SessionStore, StoredSession};
use crate::BrokerError;

/// Whether a failed call surely did not run: the server refused it for its slot (moved, being
/// migrated, not served) or no connection could be made. A timeout or a connection lost after
/// sending leaves the outcome unknown.
fn not_run(e: &BrokerError) -> bool {
    let BrokerError::Unavailable(text) = e else { return false };
    ["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "not connected", "refused"].iter().any(|s| text.contains(s))
}

impl<R: Router> RoutedBroker<R> {
    /// Runs `call` on the target of session (or node) `id`, tried again after the errors
    /// `again` accepts while routes change.
    async fn on_session<'s, T, F, Fut>(
        &'s self,
        id: &str,
        again: fn(&BrokerError) -> bool,
        call: F,
    ) -> Result<T, BrokerError>
    where
        F: Fn(Route<'s>) -> Fut,
        Fut: Future<Output = Result<T, BrokerError>>,
    {
        self.on_route(|| self.router.session_route(id), again, call).await
    }
}

#[async_trait::async_trait]
impl<R: Router> SessionStore for RoutedBroker<R> {
    fn shared(&self) -> bool {
        true
    }

    async fn load(&self, id: &str) -> Result<Option<StoredSession>, BrokerError> {
        self.on_session(id, retriable, |t| async move { t.load(id).await }).await
    }

    async fn save(&self, id: &str, expected: u64, session: &StoredSession, ttl: Duration) -> Result<bool, BrokerError> {
        self.on_session(id, not_run, |t| async move { t.save(id, expected, session, ttl).await }).await
    }

    async fn touch(&self, id: &str, ttl: Duration) -> Result<(), BrokerError> {
        self.on_session(id, retriable, |t| async move { t.touch(id, ttl).await }).await
    }

    async fn remove(&self, id: &str) -> Result<(), BrokerError> {
        self.on_session(id, retriable, |t| async move { t.remove(id).await }).await
    }

    async fn push_commands(&self, id: &str, body: &[u8], ttl: Duration) -> Result<(), BrokerError> {
        self.on_session(id, not_run, |t| async move { t.push_commands(id, body, ttl).await }).await
    }

    async fn take_commands(&self, id: &str) -> Result<Vec<Vec<u8>>, BrokerError> {
        self.on_session(id, not_run, |t| async move { t.take_commands(id).await }).await
    }

    /// A notice twice is the same as once.
    async fn notify(&self, node: &str, notice: &SessionNotice) -> Result<(), BrokerError> {
        self.on_session(node, retriable, |t| async move { t.notify(node, notice).await }).await
    }

    fn listen(&self, node: &str) -> mpsc::UnboundedReceiver<SessionNotice> {
        self.router.listen(node)
    }

    async fn try_lock(&self, id: &str, token: &str) -> Result<bool, BrokerError> {
        self.on_session(id, not_run, |t| async move { t.try_lock(id, token).await }).await
    }

    async fn unlock(&self, id: &str, lock: SessionLock) -> Result<(), BrokerError> {
        let token = &lock.0;
        self.on_session(id, retriable, |t| async move { t.unlock(id, SessionLock(token.clone())).await }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_routed_session_writes_are_sent_again_only_when_they_did_not_run() {
        let e = |s: &str| BrokerError::Unavailable(format!("redis: {s}"));
        assert!(not_run(&e("MOVED 1234 127.0.0.1:7001")));
        assert!(not_run(&e("CLUSTERDOWN The cluster is down")));
        assert!(not_run(&e("Connection refused (os error 111)")));
        assert!(!not_run(&e("timed out")));
        assert!(!not_run(&e("broken pipe")));
        assert!(retriable(&e("timed out")), "reads are sent again after a timeout");
    }
}
