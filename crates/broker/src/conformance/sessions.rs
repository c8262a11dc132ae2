//! The session store's cases ([`crate::sessions`]): every broker keeps long-poll sessions by the
//! same rules — versions, expiry, the command queue, notices, the lock.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use crate::sessions::{SessionLock, SessionNotice, StoredSession};
use crate::Broker;

pub(super) async fn run_all<F: Fn() -> Arc<dyn Broker>>(make: &F) {
    a_session_is_saved_only_over_the_version_it_read(make()).await;
    a_session_expires_unless_touched(make()).await;
    queued_commands_are_taken_once_oldest_first(make()).await;
    notices_reach_the_node_they_are_sent_to(make()).await;
    a_session_lock_has_one_holder_at_a_time(make()).await;
}

fn session(version: u64, what: &str) -> StoredSession {
    StoredSession { version, data: format!(r#"{{"version":{version},"what":"{what}"}}"#) }
}

const TTL: Duration = Duration::from_secs(60);

/// Compare-and-set: a write names the version it read (0: none yet); a stale writer, or a
/// second creation, writes nothing.
async fn a_session_is_saved_only_over_the_version_it_read(b: Arc<dyn Broker>) {
    let s = b.sessions();
    assert!(s.load("cas").await.unwrap().is_none());
    assert!(s.save("cas", 0, &session(1, "created"), TTL).await.unwrap());
    assert!(!s.save("cas", 0, &session(1, "again"), TTL).await.unwrap(), "a second creation loses");
    assert!(s.save("cas", 1, &session(2, "moved"), TTL).await.unwrap());
    assert!(!s.save("cas", 1, &session(2, "stale"), TTL).await.unwrap(), "a stale writer loses");
    assert!(!s.save("cas", 3, &session(4, "ahead"), TTL).await.unwrap(), "so does one ahead");
    assert_eq!(s.load("cas").await.unwrap(), Some(session(2, "moved")));
    assert!(s.load("other").await.unwrap().is_none(), "sessions are apart");
    s.remove("cas").await.unwrap();
    assert!(s.load("cas").await.unwrap().is_none());
    assert!(s.save("cas", 0, &session(1, "anew"), TTL).await.unwrap(), "a removed session starts over");
}

/// A record and its queued commands last their TTL from the last write or touch. Times are
/// real ones (Redis expires by its own clock), far enough apart for a busy machine.
async fn a_session_expires_unless_touched(b: Arc<dyn Broker>) {
    let s = b.sessions();
    let ttl = Duration::from_millis(1500);
    assert!(s.save("ttl", 0, &session(1, "a"), ttl).await.unwrap());
    s.push_commands("ttl", b"first", ttl).await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    s.touch("ttl", ttl).await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(s.load("ttl").await.unwrap().is_some(), "touched: kept past its first TTL");
    assert_eq!(s.take_commands("ttl").await.unwrap(), [b"first".to_vec()], "the queue is touched with it");
    s.push_commands("ttl", b"second", ttl).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(s.load("ttl").await.unwrap().is_none(), "expired");
    assert!(s.take_commands("ttl").await.unwrap().is_empty(), "its queue with it");
    assert!(s.save("ttl", 0, &session(1, "b"), ttl).await.unwrap(), "an expired session is none");
}

/// Commands queued for a session are taken all at once, oldest first, and only once; removing
/// the session drops its queue.
async fn queued_commands_are_taken_once_oldest_first(b: Arc<dyn Broker>) {
    let s = b.sessions();
    assert!(s.take_commands("q").await.unwrap().is_empty());
    for body in ["1", "2", "3"] {
        s.push_commands("q", body.as_bytes(), TTL).await.unwrap();
    }
    s.push_commands("other", b"x", TTL).await.unwrap();
    let taken = s.take_commands("q").await.unwrap();
    assert_eq!(taken, [b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]);
    assert!(s.take_commands("q").await.unwrap().is_empty(), "taken once");
    s.push_commands("q", b"4", TTL).await.unwrap();
    s.remove("q").await.unwrap();
    assert!(s.take_commands("q").await.unwrap().is_empty(), "removed with the session");
    assert_eq!(s.take_commands("other").await.unwrap(), [b"x".to_vec()]);
}

/// Sends probes to `node` until one reaches `rx`: a shared store's listener subscribes in the
/// background, and what is sent before it is up is lost.
async fn wait_listening(b: &dyn Broker, node: &str, rx: &mut UnboundedReceiver<SessionNotice>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        b.sessions().notify(node, &SessionNotice::Moved("probe".into())).await.unwrap();
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the listener of {node} never received a notice");
    }
}

/// The notices after the last probe, up to and including the `end` probe (sent last).
async fn notices_until(rx: &mut UnboundedReceiver<SessionNotice>, end: &str) -> Vec<SessionNotice> {
    let mut got = Vec::new();
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        match n {
            SessionNotice::Moved(id) if id == end => return got,
            SessionNotice::Moved(id) if id == "probe" => {}
            other => got.push(other),
        }
    }
}

/// A notice reaches the node it is sent to, in the order sent, and no other node.
async fn notices_reach_the_node_they_are_sent_to(b: Arc<dyn Broker>) {
    let s = b.sessions();
    let (mut n1, mut n2) = (s.listen("n1"), s.listen("n2"));
    wait_listening(&*b, "n1", &mut n1).await;
    wait_listening(&*b, "n2", &mut n2).await;
    s.notify("n1", &SessionNotice::Moved("a".into())).await.unwrap();
    s.notify("n2", &SessionNotice::Commands("b".into())).await.unwrap();
    s.notify("n1", &SessionNotice::Commands("c".into())).await.unwrap();
    s.notify("nobody", &SessionNotice::Commands("d".into())).await.unwrap();
    for node in ["n1", "n2"] {
        s.notify(node, &SessionNotice::Moved("end".into())).await.unwrap();
    }
    let want1 = [SessionNotice::Moved("a".into()), SessionNotice::Commands("c".into())];
    assert_eq!(notices_until(&mut n1, "end").await, want1);
    assert_eq!(notices_until(&mut n2, "end").await, [SessionNotice::Commands("b".into())]);
}

/// One holder at a time per session: others wait (up to their limit) and get it when it is
/// given back; a stale token gives nothing back.
async fn a_session_lock_has_one_holder_at_a_time(b: Arc<dyn Broker>) {
    let s = b.sessions();
    let first = s.lock("l", Duration::ZERO).await.unwrap().expect("a free lock is taken");
    assert!(s.lock("l", Duration::from_millis(50)).await.unwrap().is_none(), "held: the wait runs out");
    let other = s.lock("m", Duration::ZERO).await.unwrap().expect("locks are per session");
    s.unlock("l", SessionLock("not the holder".into())).await.unwrap();
    assert!(s.lock("l", Duration::ZERO).await.unwrap().is_none(), "only the holder's token unlocks");
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.sessions().lock("l", Duration::from_secs(5)).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.unlock("l", first).await.unwrap();
    let second = waiter.await.unwrap().expect("given back: the waiter takes it");
    assert!(s.lock("l", Duration::ZERO).await.unwrap().is_none(), "and holds it alone");
    s.unlock("l", second).await.unwrap();
    s.unlock("m", other).await.unwrap();
    assert!(s.lock("l", Duration::ZERO).await.unwrap().is_some());
}
