//! `RedisBroker` behind Redis Sentinel (`redis+sentinel://…/name`): a primary, two replicas and
//! three sentinels as real `redis-server` processes, the primary killed (-9) under load.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use support::until;
use switchboard_broker::conformance::RecordingHandler;
use switchboard_broker::{Broker, HistoryPolicy, RedisBroker, SessionNotice, StoredSession};
use switchboard_testkit::{RedisServer, Sentinels};

const KEEP: HistoryPolicy = HistoryPolicy { size: 2000, ttl: Duration::from_secs(300), trend: None };

fn data(s: &str) -> switchboard_broker::Data {
    Arc::new(RawValue::from_string(s.to_string()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_sentinel_failover_under_load_never_reuses_an_offset_and_tells_of_every_gap() {
    let mut set = tokio::task::spawn_blocking(|| Sentinels::start(RedisServer::start(), 2, 3, "main")).await.unwrap();
    let url = set.url("main");
    let (publisher, subscriber) =
        (Arc::new(RedisBroker::new(&url).unwrap()), Arc::new(RedisBroker::new(&url).unwrap()));
    let h = Arc::new(RecordingHandler::default());
    subscriber.set_handler(h.clone());
    until("both nodes ready", Duration::from_secs(10), async || publisher.ready().await && subscriber.ready().await)
        .await;
    subscriber.subscribe("pt:f").await.unwrap();

    // 1,000 publications; each retried until Redis takes it (bounded), so a failover in the
    // middle costs time, not publications.
    let stream = {
        let b = publisher.clone();
        tokio::spawn(async move {
            let mut accepted = Vec::new();
            for i in 1..=1000 {
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    match b.publish("pt:f", data(&i.to_string()), KEEP).await {
                        Ok(p) => break accepted.push((p, i)),
                        Err(e) => {
                            assert!(Instant::now() < deadline, "publication {i} not taken in 30 s: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                if i % 100 == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            accepted
        })
    };
    h.wait_for("300 publications before the failover", |h| h.offsets("pt:f").len() >= 300).await;
    let old = set.kill_primary();
    let set = tokio::task::spawn_blocking(move || {
        let new = set.wait_failover(old, Duration::from_secs(30));
        (set, new)
    })
    .await
    .unwrap();
    let accepted = stream.await.unwrap();
    assert_ne!(set.1, old);

    // Never one (epoch, offset) for two publications.
    let mut by_position: HashMap<(String, u64), i32> = HashMap::new();
    for (p, i) in &accepted {
        let prev = by_position.insert((p.epoch.to_string(), p.offset), *i);
        assert!(prev.is_none(), "({}, {}) given to publications {prev:?} and {i}", p.epoch, p.offset);
    }
    let epochs: HashSet<&str> = accepted.iter().map(|(p, _)| &*p.epoch).collect();
    assert!(epochs.len() >= 2, "the promoted replica starts a new epoch");

    // The subscriber's stream: offsets follow each other, and where they do not (a new epoch,
    // or publications made while it was reconnecting) it was told to recover.
    let last = accepted.last().unwrap().0.clone();
    let h2 = h.clone();
    until("the stream to catch up or announce the gap", Duration::from_secs(15), async || {
        let done = h2.publications.lock().iter().any(|p| p.1 == last.offset && p.2 == "1000");
        done || !h2.missed.lock().is_empty()
    })
    .await;
    let got: Vec<(u64, String)> = h.publications.lock().iter().map(|p| (p.1, p.2.clone())).collect();
    let unique: HashSet<&(u64, String)> = got.iter().collect();
    assert_eq!(unique.len(), got.len(), "no publication delivered twice");
    let gaps = got.windows(2).filter(|w| w[1].0 != w[0].0 + 1).count();
    let missed = h.missed.lock().len();
    assert!(gaps == 0 || missed > 0, "{gaps} gaps in the delivered offsets and no recovery asked");
    assert!(missed > 0, "the new epoch is announced to subscribers");
    // What a client does when told: recover from its position, learn `complete: false` (new
    // epoch), take the current state.
    let before = accepted.iter().map(|(p, _)| p).find(|p| p.epoch != last.epoch).unwrap().clone();
    let r = subscriber.history("pt:f", Some(&before), 2000).await.unwrap();
    assert!(!r.complete);
    let (pos, value) = subscriber.last_or_start("pt:f").await.unwrap();
    assert_eq!((pos, value.unwrap().data.get()), (last, "1000"));
    drop(set);
}

/// Sends a probe notice from `from` to node `to` until one reaches `rx` (a listener subscribes
/// in the background; what is sent before is lost), then drops what else arrived.
async fn until_listening(from: &RedisBroker, to: &str, rx: &mut tokio::sync::mpsc::UnboundedReceiver<SessionNotice>) {
    let probe = SessionNotice::Moved("probe".into());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let _ = from.sessions().notify(to, &probe).await;
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            break;
        }
        assert!(Instant::now() < deadline, "node {to} never received a notice");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    while rx.try_recv().is_ok() {}
}

/// Long-poll sessions behind Sentinel live on the primary: one node's record is the other's,
/// notices cross between them, and after a failover both follow the promoted replica (the
/// command connection and the notice listener ask the sentinels again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_sentinel_keeps_poll_sessions_on_the_primary_and_follows_a_failover() {
    let mut set = tokio::task::spawn_blocking(|| Sentinels::start(RedisServer::start(), 1, 3, "main")).await.unwrap();
    let url = set.url("main");
    let (a, b) = (RedisBroker::new(&url).unwrap(), RedisBroker::new(&url).unwrap());
    until("both nodes ready", Duration::from_secs(10), async || a.ready().await && b.ready().await).await;
    let ttl = Duration::from_secs(60);
    let record = |version: u64| StoredSession { version, data: format!("{{\"v\":{version}}}") };
    assert!(a.sessions().save("s1", 0, &record(1), ttl).await.unwrap());
    assert_eq!(b.sessions().load("s1").await.unwrap(), Some(record(1)), "one store for both nodes");
    assert!(!b.sessions().save("s1", 0, &record(1), ttl).await.unwrap());
    let mut notices = b.sessions().listen("node-b");
    until_listening(&a, "node-b", &mut notices).await;
    a.sessions().notify("node-b", &SessionNotice::Commands("s1".into())).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), notices.recv()).await.unwrap();
    assert_eq!(got, Some(SessionNotice::Commands("s1".into())));

    let old = set.kill_primary();
    let set = tokio::task::spawn_blocking(move || {
        set.wait_failover(old, Duration::from_secs(30));
        set
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.sessions().save("s2", 0, &record(1), ttl).await.is_err() {
        assert!(Instant::now() < deadline, "no session written on the promoted replica");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    until(
        "the other node to read the promoted replica",
        Duration::from_secs(30),
        async || matches!(b.sessions().load("s2").await, Ok(Some(r)) if r == record(1)),
    )
    .await;
    until_listening(&a, "node-b", &mut notices).await;
    a.sessions().notify("node-b", &SessionNotice::Moved("s2".into())).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), notices.recv()).await.unwrap();
    assert_eq!(got, Some(SessionNotice::Moved("s2".into())));
    drop(set);
}
