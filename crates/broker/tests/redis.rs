//! `RedisBroker` against a real `redis-server`, started by each test on a spare loopback port
//! without persistence and killed (by PID) when the test ends.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use support::until;
use switchboard_broker::conformance::{list_all, run_all, RecordingHandler};
use switchboard_broker::redis::{RedisBroker, RedisOptions};
use switchboard_broker::{Broker, BrokerError, ClientInfo, HistoryPolicy, Outgoing};

type Redis = switchboard_testkit::RedisServer;

fn data(s: &str) -> switchboard_broker::Data {
    Arc::new(RawValue::from_string(s.to_string()).unwrap())
}

const KEEP: HistoryPolicy = HistoryPolicy { size: 100, ttl: Duration::from_secs(300), trend: None };

fn broker(r: &Redis, prefix: &str) -> Arc<RedisBroker> {
    let options = RedisOptions { prefix: prefix.into(), presence_ttl: Duration::from_secs(15) };
    Arc::new(RedisBroker::with_options(&r.url(), options).unwrap())
}

async fn ready(b: &RedisBroker) {
    until("the broker to be ready", Duration::from_secs(10), async || b.ready().await).await;
}

#[tokio::test]
async fn broker_redis_passes_the_conformance_suite() {
    let r = Redis::start();
    let n = AtomicUsize::new(0);
    // A fresh prefix per case: fresh channels on the same Redis.
    let first = broker(&r, "warmup");
    ready(&first).await;
    run_all(|| broker(&r, &format!("case{}", n.fetch_add(1, Ordering::Relaxed))) as Arc<dyn Broker>).await;
}

#[tokio::test]
async fn broker_redis_two_nodes_share_offsets_history_and_presence() {
    let r = Redis::start();
    let (a, b) = (broker(&r, "sb"), broker(&r, "sb"));
    a.set_node_id("node-a");
    b.set_node_id("node-b");
    let ha = Arc::new(RecordingHandler::default());
    a.set_handler(ha.clone());
    ready(&a).await;
    ready(&b).await;
    a.subscribe("room:1").await.unwrap();
    a.subscribe("room:1").await.unwrap();
    a.subscribe("room:1").await.unwrap();
    // Three local subscribers, one Redis subscription.
    let numsub: (String, u64) = r.cmd(redis::cmd("PUBSUB").arg("NUMSUB").arg("sb:{room:1}:p"));
    assert_eq!(numsub.1, 1);
    for i in 1..=3 {
        let p = b.publish("room:1", data(&format!("{{\"n\":{i}}}")), KEEP).await.unwrap();
        assert_eq!(p.offset, i);
    }
    ha.wait_for("3 publications from the other node", |h| h.offsets("room:1") == vec![1, 2, 3]).await;
    let (pa, _) = a.last_or_start("room:1").await.unwrap();
    let (pb, last) = b.last_or_start("room:1").await.unwrap();
    assert_eq!(pa, pb, "one position for the whole cluster");
    assert_eq!(last.unwrap().data.get(), "{\"n\":3}");
    let since = switchboard_broker::Position { epoch: pa.epoch.clone(), offset: 1 };
    let r2 = a.history("room:1", Some(&since), 10).await.unwrap();
    assert_eq!(r2.publications.iter().map(|p| p.offset).collect::<Vec<_>>(), vec![2, 3]);

    b.presence_add("room:1", ClientInfo { client: "b-1".into(), user: "bob".into() }).await.unwrap();
    a.presence_add("room:1", ClientInfo { client: "a-1".into(), user: "ann".into() }).await.unwrap();
    let everyone = vec![
        ClientInfo { client: "a-1".into(), user: "ann".into() },
        ClientInfo { client: "b-1".into(), user: "bob".into() },
    ];
    assert_eq!(a.presence("room:1").await.unwrap(), everyone);
    assert_eq!(b.presence("room:1").await.unwrap(), everyone);
    ha.wait_for("both joins", |h| h.presence.lock().len() == 2).await;
    b.presence_remove("room:1", "b-1").await.unwrap();
    ha.wait_for("the leave", |h| h.presence.lock().last() == Some(&("room:1".into(), "b-1".into(), false))).await;

    until("both nodes in the cluster figures", Duration::from_secs(10), async || {
        let c = b.cluster().await.unwrap().unwrap();
        c.nodes == vec!["node-a".to_string(), "node-b".to_string()] && c.subscribers.get("room:1").copied() == Some(3)
    })
    .await;
    let channels = list_all(&*b, "", 1000).await;
    assert_eq!(channels.len(), 1);
    assert_eq!((&*channels[0].channel, channels[0].position.offset), ("room:1", 3));
}

#[tokio::test]
async fn broker_redis_registers_no_node_id_but_the_one_it_is_given() {
    let r = Redis::start();
    let (a, b) = (broker(&r, "sb"), broker(&r, "sb"));
    // Connected, with heartbeats running, before the node tells its id: nothing is registered.
    ready(&a).await;
    ready(&b).await;
    a.subscribe("room:1").await.unwrap();
    assert_eq!(a.cluster().await.unwrap().unwrap().nodes, Vec::<String>::new());
    a.set_node_id("node-a");
    b.set_node_id("node-b");
    // Ready means registered under the id: both are listed at once, and nothing else is.
    ready(&a).await;
    ready(&b).await;
    let c = b.cluster().await.unwrap().unwrap();
    assert_eq!(c.nodes, ["node-a", "node-b"]);
    assert_eq!(c.subscribers.get("room:1"), Some(&1), "the counts come with the first registration");
    // The registry is ordered by heartbeat expiry, which either node may renew first.
    let mut registry: Vec<String> = r.cmd(redis::cmd("ZRANGE").arg("sb:nodes").arg(0).arg(-1));
    registry.sort();
    assert_eq!(registry, ["node-a", "node-b"]);
}

#[tokio::test]
async fn broker_redis_unsubscribing_the_last_local_subscriber_stops_delivery() {
    let r = Redis::start();
    let a = broker(&r, "sb");
    let h = Arc::new(RecordingHandler::default());
    a.set_handler(h.clone());
    ready(&a).await;
    a.subscribe("x").await.unwrap();
    a.unsubscribe("x").await.unwrap();
    a.subscribe("y").await.unwrap();
    until("the Redis unsubscribe", Duration::from_secs(5), async || {
        let n: (String, u64) = r.cmd(redis::cmd("PUBSUB").arg("NUMSUB").arg("sb:{x}:p"));
        n.1 == 0
    })
    .await;
    a.publish("x", data("1"), KEEP).await.unwrap();
    a.publish("y", data("2"), KEEP).await.unwrap();
    // One connection delivers in publish order: had x arrived, it would be here before y.
    h.wait_for("y", |h| h.offsets("y") == vec![1]).await;
    assert!(h.offsets("x").is_empty());
    // Subscribing again starts cleanly: no false gap for what was skipped meanwhile.
    a.subscribe("x").await.unwrap();
    a.publish("x", data("3"), KEEP).await.unwrap();
    h.wait_for("x again", |h| h.offsets("x") == vec![2]).await;
    assert!(h.missed.lock().is_empty());
}

#[tokio::test]
async fn broker_redis_batches_subscriptions_of_many_channels() {
    let r = Redis::start();
    let a = broker(&r, "sb");
    ready(&a).await;
    let before: String = r.cmd(redis::cmd("INFO").arg("commandstats"));
    let calls = |info: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_subscribe:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let names: Vec<String> = (0..2000).map(|i| format!("pt:many.{i}")).collect();
    let results = futures_util::future::join_all(names.iter().map(|n| a.subscribe(n))).await;
    assert!(results.iter().all(|r| r.is_ok()));
    let after: String = r.cmd(redis::cmd("INFO").arg("commandstats"));
    let used = calls(&after) - calls(&before);
    assert!(used <= 10, "2,000 channels took {used} SUBSCRIBE commands");
    let n: u64 = r.cmd(redis::cmd("PUBSUB").arg("NUMPAT"));
    assert_eq!(n, 0);
    let subscribed: Vec<String> = r.cmd(redis::cmd("PUBSUB").arg("CHANNELS").arg("sb:{pt:many.*"));
    assert_eq!(subscribed.len(), 2000);
}

#[tokio::test]
async fn broker_redis_offset_gap_makes_subscribers_recover() {
    let r = Redis::start();
    let a = broker(&r, "sb");
    let h = Arc::new(RecordingHandler::default());
    a.set_handler(h.clone());
    ready(&a).await;
    a.subscribe("g").await.unwrap();
    let p = a.publish("g", data("1"), KEEP).await.unwrap();
    h.wait_for("offset 1", |h| h.offsets("g") == vec![1]).await;
    // A message that skips offsets 2..4, as if the pub/sub stream had lost them.
    let _: i64 =
        r.cmd(redis::cmd("PUBLISH").arg("sb:{g}:p").arg(format!("p{} 5 1700000000000 {{\"late\":true}}", p.epoch)));
    h.wait_for("the gap report", |h| h.missed.lock().as_slice() == ["g".to_string()]).await;
    h.wait_for("offset 5 after the report", |h| h.offsets("g") == vec![1, 5]).await;
}

/// A rollback that kept the epoch (offsets reused with other data) is an epoch change, never
/// a run of duplicates: the live stream going backwards and a position behind what was
/// delivered after a reconnect both make subscribers recover and replace the epoch in Redis,
/// so a client at an offset it saw learns `complete: false`.
#[tokio::test]
async fn broker_redis_offsets_going_backwards_are_an_epoch_change() {
    let r = Redis::start();
    let a = broker(&r, "sb");
    let h = Arc::new(RecordingHandler::default());
    a.set_handler(h.clone());
    ready(&a).await;
    a.subscribe("rb").await.unwrap();
    let mut p = a.publish("rb", data("1"), KEEP).await.unwrap();
    for i in 2..=3 {
        p = a.publish("rb", data(&i.to_string()), KEEP).await.unwrap();
    }
    h.wait_for("offsets 1..3", |h| h.offsets("rb") == vec![1, 2, 3]).await;
    // The live stream brings offset 2 of the same epoch again, with other data.
    let _: i64 =
        r.cmd(redis::cmd("PUBLISH").arg("sb:{rb}:p").arg(format!("p{} 2 1700000000000 {{\"other\":true}}", p.epoch)));
    h.wait_for("the rollback report", |h| h.missed.lock().as_slice() == ["rb".to_string()]).await;
    h.wait_for("offset 2 delivered, not dropped", |h| h.offsets("rb") == vec![1, 2, 3, 2]).await;
    until("a new epoch in Redis", Duration::from_secs(5), async || {
        a.last_or_start("rb").await.unwrap().0.epoch != p.epoch
    })
    .await;
    let r1 = a.history("rb", Some(&p), 10).await.unwrap();
    assert!(!r1.complete, "a client at offset 3 of the old epoch is told of the gap");

    // After a reconnect, a position behind what was delivered: the same.
    let q = a.publish("rb", data("4"), KEEP).await.unwrap();
    h.wait_for("the new epoch's publication", |h| h.offsets("rb").len() == 5).await;
    h.missed.lock().clear();
    let _: () = r.cmd(redis::cmd("HSET").arg("sb:{rb}:m").arg("o").arg(0));
    let _: i64 = r.cmd(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"));
    h.wait_for("the resync report", |h| h.missed.lock().contains(&"rb".to_string())).await;
    until("another new epoch", Duration::from_secs(5), async || {
        a.last_or_start("rb").await.unwrap().0.epoch != q.epoch
    })
    .await;
    assert!(!a.history("rb", Some(&q), 10).await.unwrap().complete);
}

#[tokio::test]
async fn broker_redis_restart_means_new_epoch_and_resubscribed_channels() {
    let mut r = Redis::start();
    let port = r.port();
    let a = broker(&r, "sb");
    let h = Arc::new(RecordingHandler::default());
    a.set_handler(h.clone());
    ready(&a).await;
    a.subscribe("news").await.unwrap();
    let before = a.publish("news", data("1"), KEEP).await.unwrap();
    h.wait_for("offset 1", |h| h.offsets("news") == vec![1]).await;

    r.kill();
    until("readyz to fail while Redis is down", Duration::from_secs(10), async || !a.ready().await).await;
    assert!(a.publish("news", data("2"), KEEP).await.is_err());
    let _r = Redis::start_on(port);
    ready(&a).await;

    // The node resubscribed and saw the channel's new epoch: its subscribers must recover.
    h.wait_for("the missed report", |h| h.missed.lock().contains(&"news".to_string())).await;
    let after = a.publish("news", data("3"), KEEP).await.unwrap();
    assert_ne!(after.epoch, before.epoch);
    assert_eq!(after.offset, 1);
    h.wait_for("delivery after the restart", |h| h.offsets("news") == vec![1, 1]).await;
    let r2 = a.history("news", Some(&before), 10).await.unwrap();
    assert!(!r2.complete, "history of the old epoch is gone");
}

#[tokio::test]
async fn broker_redis_presence_of_a_dead_node_expires_with_a_leave() {
    let r = Redis::start();
    let options = RedisOptions { prefix: "sb".into(), presence_ttl: Duration::from_secs(1) };
    let a = Arc::new(RedisBroker::with_options(&r.url(), options.clone()).unwrap());
    let b = Arc::new(RedisBroker::with_options(&r.url(), options).unwrap());
    let hb = Arc::new(RecordingHandler::default());
    b.set_handler(hb.clone());
    ready(&a).await;
    ready(&b).await;
    b.subscribe("room:z").await.unwrap();
    a.presence_add("room:z", ClientInfo { client: "a-1".into(), user: "ann".into() }).await.unwrap();
    b.presence_add("room:z", ClientInfo { client: "b-1".into(), user: "bob".into() }).await.unwrap();
    // Heartbeats keep both alive past the TTL.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(b.presence("room:z").await.unwrap().len(), 2);
    drop(a); // the node dies: nobody refreshes a-1
    until("a-1 to expire", Duration::from_secs(10), async || b.presence("room:z").await.unwrap().len() == 1).await;
    assert_eq!(b.presence("room:z").await.unwrap()[0].client, "b-1");
    hb.wait_for("a leave for a-1", |h| h.presence.lock().contains(&("room:z".into(), "a-1".into(), false))).await;
}

#[tokio::test]
async fn broker_redis_subscription_churn_never_loses_what_follows_a_read() {
    let r = Redis::start();
    let (a, b) = (broker(&r, "sb"), broker(&r, "sb"));
    let h = Arc::new(RecordingHandler::default());
    a.set_handler(h.clone());
    ready(&a).await;
    ready(&b).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let (b, stop) = (b.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                b.publish("churn", data("0"), KEEP).await.unwrap();
            }
        })
    };
    for _ in 0..40 {
        a.subscribe("churn").await.unwrap();
        let (p, _) = a.last_or_start("churn").await.unwrap();
        let q = a.publish("churn", data("1"), KEEP).await.unwrap();
        // Everything after the read reaches the handler, whoever published it.
        h.wait_for("the offsets after the read", |h| {
            let got = h.offsets("churn");
            (p.offset + 1..=q.offset).all(|o| got.contains(&o))
        })
        .await;
        a.unsubscribe("churn").await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    publisher.await.unwrap();
    assert!(h.missed.lock().is_empty(), "no false alarms: {:?}", h.missed.lock());
}

/// A replica promoted before it caught up lacks the last publications: the next publication
/// must start a new epoch, never reuse the offsets clients already saw with other data.
#[tokio::test]
async fn broker_redis_promoted_replica_starts_a_new_epoch_instead_of_reusing_offsets() {
    let primary = Redis::start();
    let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    let old = broker(&primary, "sb");
    ready(&old).await;
    for i in 1..=5 {
        old.publish("room:f", data(&i.to_string()), KEEP).await.unwrap();
    }
    until("the replica to hold offset 5", Duration::from_secs(10), async || {
        let o: Option<u64> = replica.cmd(redis::cmd("HGET").arg("sb:{room:f}:m").arg("o"));
        o == Some(5)
    })
    .await;
    // The replica stops following (the primary is cut off), then the primary takes three more
    // publications the replica never gets.
    let _: String = replica.cmd(redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
    let mut seen = Vec::new();
    for i in 6..=8 {
        seen.push(old.publish("room:f", data(&i.to_string()), KEEP).await.unwrap());
    }
    let before = seen.last().unwrap().clone();
    assert_eq!(before.offset, 8);
    // A node now on the promoted replica.
    let new = broker(&replica, "sb");
    ready(&new).await;
    let p = new.publish("room:f", data("\"after\""), KEEP).await.unwrap();
    assert_ne!(p.epoch, before.epoch, "offset {} of epoch {} would mean two different publications", p.offset, p.epoch);
    let r = new.history("room:f", Some(&before), 100).await.unwrap();
    assert!(!r.complete, "a client at offset 8 of the old epoch is told of the gap");
    let (pos, last) = new.last_or_start("room:f").await.unwrap();
    assert_eq!((pos, last.unwrap().data.get()), (p, "\"after\""));
}

#[tokio::test]
async fn broker_redis_history_expiry_is_pushed_once_per_ttl_not_per_publication() {
    let r = Redis::start();
    let b = broker(&r, "sb");
    ready(&b).await;
    let ttl = |ms: u64| HistoryPolicy { size: 10, ttl: Duration::from_millis(ms), trend: None };
    let pttl = || -> i64 { r.cmd(redis::cmd("PTTL").arg("sb:{room:x}:h")) };
    let set_at = || -> i64 { r.cmd(redis::cmd("HGET").arg("sb:{room:x}:m").arg("x")) };
    b.publish("room:x", data("1"), ttl(60_000)).await.unwrap();
    // A new stream: twice the ttl.
    let (first, x) = (pttl(), set_at());
    assert!((119_000..=120_000).contains(&first), "{first}");
    // More than one ttl left: the next publication leaves the expiry alone.
    tokio::time::sleep(Duration::from_millis(50)).await;
    b.publish("room:x", data("2"), ttl(60_000)).await.unwrap();
    assert_eq!(set_at(), x);
    assert!(pttl() < first, "not pushed again");
    // A changed ttl is applied at once.
    b.publish("room:x", data("3"), ttl(10_000)).await.unwrap();
    assert!((19_000..=20_000).contains(&pttl()), "{}", pttl());
    // No ttl: the stream is kept.
    b.publish("room:x", data("4"), ttl(0)).await.unwrap();
    assert_eq!(pttl(), -1);
    let h = b.history("room:x", None, 10).await.unwrap();
    let got: Vec<&str> = h.publications.iter().map(|p| p.data.get()).collect();
    assert_eq!(got, ["1", "2", "3", "4"]);
}

#[tokio::test]
async fn broker_redis_idle_channels_expire_but_subscribed_and_kept_ones_stay() {
    let r = Redis::start();
    // A heartbeat every third of a second keeps subscribed channels alive.
    let b = Arc::new(RedisBroker::new(&format!("{}?presence_ttl_s=1", r.url())).unwrap());
    b.set_channel_ttl(Arc::new(
        |ch: &str| if ch.starts_with("pt:") { Duration::ZERO } else { Duration::from_millis(700) },
    ));
    ready(&b).await;
    let pttl = |ch: &str| -> i64 { r.cmd(redis::cmd("PTTL").arg(format!("sb:{{{ch}}}:m"))) };
    let old = b.publish("room:gone", data("1"), KEEP).await.unwrap();
    b.publish("pt:kept", data("1"), KEEP).await.unwrap();
    b.subscribe("room:held").await.unwrap();
    b.last_or_start("room:held").await.unwrap();
    assert!((1..=1400).contains(&pttl("room:gone")), "{}", pttl("room:gone"));
    assert_eq!(pttl("pt:kept"), -1, "points are kept forever");
    // Between one and two keeps after its last use the idle channel is gone, with its history.
    until("the idle channel to expire", Duration::from_secs(10), async || {
        b.last_if_known("room:gone").await.unwrap().is_none()
    })
    .await;
    let h = b.history("room:gone", Some(&old), 10).await.unwrap();
    assert!(!h.complete && h.position.epoch != old.epoch, "a recovering reader learns it");
    // The subscribed channel outlives several keeps; once released, it expires too.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(b.last_if_known("room:held").await.unwrap().is_some(), "kept alive while subscribed");
    assert!(b.last_if_known("pt:kept").await.unwrap().is_some());
    b.unsubscribe("room:held").await.unwrap();
    until("the released channel to expire", Duration::from_secs(10), async || {
        b.last_if_known("room:held").await.unwrap().is_none()
    })
    .await;
}

/// Subscribers told while Redis is down are told once: the resubscription after it is back
/// does not report the channel again, so whoever subscribed after the notice (a recovering
/// client, before its old subscription was released) keeps streaming.
#[tokio::test]
async fn broker_redis_channels_reported_lost_while_down_are_not_reported_again_once_back() {
    let mut r = Redis::start();
    let port = r.port();
    let a = broker(&r, "told");
    let h = Arc::new(RecordingHandler::default());
    a.set_handler(h.clone());
    ready(&a).await;
    a.subscribe("news").await.unwrap();
    a.publish("news", data("1"), KEEP).await.unwrap();
    h.wait_for("offset 1", |h| h.offsets("news") == vec![1]).await;
    let reports = |h: &RecordingHandler| h.missed.lock().iter().filter(|ch| *ch == "news").count();

    r.kill();
    // Down for long enough that the node tells the channel's subscribers without waiting.
    h.wait_for("the report while Redis is down", |h| reports(h) == 1).await;
    let _r = Redis::start_on(port);
    ready(&a).await;
    // The recovering subscriber; the old subscription is still counted.
    a.subscribe("news").await.unwrap();
    let after = a.publish("news", data("2"), KEEP).await.unwrap();
    assert_eq!(after.offset, 1, "a new epoch after the restart");
    h.wait_for("delivery after the restart", |h| h.offsets("news") == vec![1, 1]).await;
    assert_eq!(reports(&h), 1, "reported once: {:?}", h.missed.lock());
}

/// The pub/sub link measures its keepalive PING's round trip; a server that stops answering
/// shows as the age of the PING in flight, and the round trip is short again once it runs.
#[tokio::test]
async fn broker_redis_round_trip_grows_while_the_server_is_stopped() {
    let r = Redis::start();
    let b = broker(&r, "rtt");
    ready(&b).await;
    until("a measured round trip", Duration::from_secs(10), async || b.round_trip().is_some()).await;
    assert!(b.round_trip().unwrap() < Duration::from_secs(1), "{:?}", b.round_trip());
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill").args([sig, &r.pid().to_string()]).status().unwrap().success();
        assert!(ok, "kill {sig}");
    };
    signal("-STOP");
    // Polled without panicking, so that Redis runs again whatever is seen.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut slow = false;
    while !slow && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        slow = b.round_trip().is_some_and(|rtt| rtt > Duration::from_millis(1500));
    }
    signal("-CONT");
    assert!(slow, "the round trip never passed 1.5 s while Redis was stopped");
    ready(&b).await;
    let fast = async || b.round_trip().is_some_and(|rtt| rtt < Duration::from_secs(1));
    until("a short round trip after Redis resumed", Duration::from_secs(15), fast).await;
}

/// A publish made while Redis is down waits for it (up to `PUBLISH_WAIT`) and succeeds once
/// it is back; past the wait it answers `Unavailable` (nothing published), never publishes
/// twice, and a retry with the same idempotency key answers the first result.
#[tokio::test]
async fn broker_redis_publish_waits_for_redis_and_keeps_its_key() {
    let mut r = Redis::start();
    let port = r.port();
    let a = broker(&r, "sb");
    ready(&a).await;
    a.publish("wait", data("0"), KEEP).await.unwrap();
    let keyed = |d: &str, key: &str| {
        let mut item = Outgoing::new("wait", data(d), KEEP);
        item.idempotency_key = Some(key.into());
        item
    };

    r.kill();
    until("readyz to fail while Redis is down", Duration::from_secs(10), async || !a.ready().await).await;
    let down = a.publish_batch(vec![keyed("1", "k-down")]).await.pop().unwrap();
    assert!(matches!(down, Err(BrokerError::Unavailable(_))), "{down:?}");

    let waiting = {
        let a = a.clone();
        tokio::spawn(async move { a.publish_batch(vec![keyed("2", "k-back")]).await.pop().unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the publish waits for Redis");
    let _r = Redis::start_on(port);
    let first = waiting.await.unwrap().expect("published once Redis is back within the wait");
    let again = a.publish_batch(vec![keyed("2", "k-back")]).await.pop().unwrap().unwrap();
    assert_eq!(again, first);
    let history = a.history("wait", None, 10).await.unwrap();
    let kept: Vec<&str> = history.publications.iter().map(|p| p.data.get()).collect();
    assert_eq!(kept, ["2"], "Redis restarted empty; the waiting publish is there once");
}

/// Trend buckets are written raw by the publish script and compressed by the node once their
/// chunk closes (docs/operations.md, "Trend capacity"): reads give the same buckets before and
/// after, the closed chunks' raw strings are gone, and a late value for a compressed chunk is
/// merged into it.
#[tokio::test]
async fn broker_redis_trend_chunks_are_compressed_once_closed_and_read_the_same() {
    use switchboard_broker::{TrendBucket, TrendPolicy, TrendTiers};
    let r = Redis::start();
    let b = broker(&r, "sb");
    ready(&b).await;
    // 10 ms buckets: a chunk (120 buckets) closes every 1.2 s.
    let trend = TrendPolicy { step_ms: 10, len: 100_000 };
    let policy = HistoryPolicy { size: 10, ttl: Duration::from_secs(300), trend: Some(TrendTiers::one(trend)) };
    let now = switchboard_broker::now_ms();
    let start = now - now % 10 - 6_000;
    // Six seconds of values at their own times, every 20 ms (every other bucket), in batches.
    let mut expected = Vec::new();
    let items: Vec<Outgoing> = (0..300u64)
        .map(|i| {
            let (t, v) = (start + 20 * i, (i % 17) as f64 * 0.25 - 1.0);
            expected.push(TrendBucket::new(t, t, v));
            Outgoing::new("pt:z", data(&format!(r#"{{"v": {v}, "t": {t}}}"#)), policy)
        })
        .collect();
    for chunk in items.chunks(50) {
        for r in b.publish_batch(chunk.to_vec()).await {
            r.unwrap();
        }
    }
    let before = b.trend("pt:z", trend, start).await.unwrap();
    assert_eq!(before, expected);
    // Reading queued the closed chunks; the compactor swaps them within a few seconds.
    let raw_keys = || -> Vec<String> { r.cmd(redis::cmd("KEYS").arg("sb:{pt:z}:t:10:*")) };
    let fields = || -> i64 { r.cmd(redis::cmd("HLEN").arg("sb:{pt:z}:tz:10")) };
    until("closed chunks compressed", Duration::from_secs(15), async || raw_keys().len() <= 1 && fields() >= 4).await;
    assert_eq!(b.trend("pt:z", trend, start).await.unwrap(), expected, "the same buckets, compressed");
    let pttl: i64 = r.cmd(redis::cmd("PTTL").arg("sb:{pt:z}:tz:10"));
    assert!(pttl > 0, "the compressed hash expires with its newest chunk's reach: {pttl}");
    // A late value for a bucket of a compressed chunk merges with it.
    let late = expected[3].t;
    b.publish("pt:z", data(&format!(r#"{{"v": 99, "t": {late}}}"#)), policy).await.unwrap();
    let after = b.trend("pt:z", trend, start).await.unwrap();
    let merged = after.iter().find(|x| x.t == late).unwrap();
    assert_eq!((merged.n, merged.max, merged.last), (2, 99.0, 99.0));
    assert_eq!(after.len(), expected.len());
    // Historical values merge into compressed chunks too, last by time: a later value of a
    // bucket becomes its last, an earlier one does not, and an empty bucket between two gets
    // its own; the chunk is compressed again with them.
    let (t5, between) = (expected[5].t, expected[5].t + 10);
    let past = [(t5 + 5, 50.0), (t5 + 2, -7.0), (between + 3, -50.0)].map(|(t, v)| Outgoing {
        historical: true,
        ..Outgoing::new("pt:z", data(&format!(r#"{{"v": {v:?}, "t": {t}}}"#)), policy)
    });
    for r in b.publish_batch(past.to_vec()).await {
        r.unwrap();
    }
    let read = || async { b.trend("pt:z", trend, start).await.unwrap() };
    let check = |got: Vec<TrendBucket>| {
        let at = |t: u64| got.iter().find(|x| x.t == t).map(|x| (x.n, x.min, x.max, x.last));
        assert_eq!(at(t5), Some((3, -7.0, 50.0, 50.0)), "{got:?}");
        assert_eq!(at(between), Some((1, -50.0, -50.0, -50.0)));
        assert_eq!(got.len(), expected.len() + 1);
    };
    check(read().await);
    until("the merged chunk compressed again", Duration::from_secs(15), async || raw_keys().len() <= 1).await;
    check(read().await);
    let meta: Vec<Option<String>> = r.cmd(redis::cmd("HMGET").arg("sb:{pt:z}:m").arg("o").arg("d").arg("lo"));
    let last = format!(r#"{{"v": 99, "t": {late}}}"#);
    assert_eq!(meta, vec![Some("304".to_string()), Some(last), Some("301".to_string())], "the last value kept");
}
