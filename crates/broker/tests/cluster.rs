//! `ClusterBroker` over a real Redis Cluster (`redis-server --cluster-enabled yes` nodes on
//! spare loopback ports, joined with `redis-cli --cluster create`, killed by PID at the end).
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use support::until;
use switchboard_broker::cluster::key_slot;
use switchboard_broker::conformance::{list_all, run_all, RecordingHandler};
use switchboard_broker::{Broker, ClusterBroker, HistoryPolicy, Outgoing};
use switchboard_testkit::{RedisCluster, Role};

const KEEP: HistoryPolicy = HistoryPolicy { size: 2000, ttl: Duration::from_secs(300), trend: None };

fn data(s: &str) -> switchboard_broker::Data {
    Arc::new(RawValue::from_string(s.to_string()).unwrap())
}

async fn start(primaries: usize, replicas: usize) -> RedisCluster {
    tokio::task::spawn_blocking(move || RedisCluster::start(primaries, replicas)).await.unwrap()
}

fn stat(info: &str, command: &str) -> u64 {
    let line = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_cluster_passes_the_conformance_suite() {
    let cluster = start(3, 0).await;
    let first = ClusterBroker::new(&format!("{}?prefix=warmup", cluster.seed_url())).unwrap();
    until("the cluster broker ready", Duration::from_secs(15), async || first.ready().await).await;
    let n = AtomicUsize::new(0);
    let seed = cluster.seed_url();
    run_all(|| {
        let prefix = format!("case{}", n.fetch_add(1, Ordering::Relaxed));
        Arc::new(ClusterBroker::new(&format!("{seed}?prefix={prefix}")).unwrap()) as Arc<dyn Broker>
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_cluster_spreads_channels_by_slot_and_publishes_with_sharded_pubsub() {
    let cluster = start(3, 0).await;
    let b = ClusterBroker::new(&cluster.seed_url()).unwrap();
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    b.set_node_id("node-a");
    until("the cluster broker ready", Duration::from_secs(15), async || b.ready().await).await;
    b.subscribe("pt:s.7").await.unwrap();

    let names: Vec<String> = (0..300).map(|i| format!("pt:s.{i}")).collect();
    let items = names.iter().map(|c| Outgoing::new(c, data("1"), KEEP));
    let results = b.publish_batch(items.collect()).await;
    assert!(results.iter().all(|r| r.as_ref().map(|p| p.offset).ok() == Some(1)), "{:?}", results.first());
    h.wait_for("the subscribed channel's publication", |h| h.offsets("pt:s.7") == vec![1]).await;

    let mut held = 0;
    for node in cluster.nodes() {
        let server = cluster.server(node.port).unwrap();
        let keys: Vec<String> = server.cmd(redis::cmd("KEYS").arg("sb:{*}:m"));
        // Each primary holds exactly the channels of its slots, about a third.
        for k in &keys {
            assert_eq!(cluster.primary_for_slot(key_slot(k.as_bytes())), node.port, "{k}");
        }
        assert!((60..=140).contains(&keys.len()), ":{} holds {} of 300", node.port, keys.len());
        held += keys.len();
        let info: String = server.cmd(redis::cmd("INFO").arg("commandstats"));
        assert_eq!(stat(&info, "publish"), 0, "no cluster-wide PUBLISH");
        let holds = keys.iter().any(|k| k == "sb:{pt:s.7}:m");
        assert_eq!(stat(&info, "ssubscribe") > 0, holds, ":{} subscribed only where the channel lives", node.port);
    }
    assert_eq!(held, 300);
    assert_eq!(list_all(&b, "", 1000).await.len(), 300);
    // The heartbeat (every 5 s) publishes the subscription counts.
    until("the subscription counted cluster-wide", Duration::from_secs(15), async || {
        let info = b.cluster().await.unwrap().unwrap();
        assert_eq!(info.nodes, ["node-a"], "one gateway node, registered on every primary under its id");
        info.subscribers.get("pt:s.7") == Some(&1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_cluster_failover_under_load_never_reuses_an_offset_and_tells_of_every_gap() {
    let cluster = start(3, 1).await;
    let url = cluster.seed_url();
    let (publisher, subscriber) =
        (Arc::new(ClusterBroker::new(&url).unwrap()), Arc::new(ClusterBroker::new(&url).unwrap()));
    let h = Arc::new(RecordingHandler::default());
    subscriber.set_handler(h.clone());
    until("both nodes ready", Duration::from_secs(15), async || publisher.ready().await && subscriber.ready().await)
        .await;
    subscriber.subscribe("pt:f").await.unwrap();
    // A channel on another primary keeps streaming through the failover.
    let slot = key_slot(b"pt:f");
    let other = (0..)
        .map(|i| format!("pt:o{i}"))
        .find(|c| cluster.primary_for_slot(key_slot(c.as_bytes())) != cluster.primary_for_slot(slot));
    let other = other.unwrap();
    subscriber.subscribe(&other).await.unwrap();

    let stream = {
        let b = publisher.clone();
        let other = other.clone();
        tokio::spawn(async move {
            let mut accepted = Vec::new();
            for i in 1..=1000 {
                let deadline = Instant::now() + Duration::from_secs(30);
                let (mut f_done, mut other_done) = (false, false);
                while !(f_done && other_done) {
                    let mut batch = Vec::new();
                    if !f_done {
                        batch.push(Outgoing::new("pt:f", data(&i.to_string()), KEEP));
                    }
                    if !other_done {
                        batch.push(Outgoing::new(other.as_str(), data(&i.to_string()), KEEP));
                    }
                    for (item, r) in batch.iter().zip(b.publish_batch(batch.clone()).await) {
                        match r {
                            Ok(p) if &*item.channel == "pt:f" => {
                                accepted.push((p, i));
                                f_done = true;
                            }
                            Ok(_) => other_done = true,
                            Err(e) => assert!(Instant::now() < deadline, "publication {i} not taken in 30 s: {e}"),
                        }
                    }
                    if !(f_done && other_done) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
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
    // Fresh channels on the primary about to die and on a live one.
    let fresh = |same: bool| {
        (0..)
            .map(|i| format!("pt:g{i}"))
            .find(|c| (cluster.primary_for_slot(key_slot(c.as_bytes())) == cluster.primary_for_slot(slot)) == same)
            .unwrap()
    };
    let (on_dead, on_live) = (fresh(true), fresh(false));
    let mut cluster = cluster;
    let old = cluster.kill_primary_of_slot(slot);
    // While the cluster has not promoted a replica (node timeout 1 s), a subscribe on the dead
    // primary is refused at once — a client's other channels must not wait for the failover —
    // and one on a live primary goes through.
    match subscriber.subscribe(&on_dead).await {
        Err(e) => assert!(e.to_string().contains("connection is down"), "refused as down, not timed out: {e}"),
        Ok(()) => panic!("subscribed {on_dead} on a dead primary before its failover"),
    }
    subscriber.subscribe(&on_live).await.unwrap();
    let (cluster, new) = tokio::task::spawn_blocking(move || {
        let new = cluster.wait_failover(slot, Duration::from_secs(30));
        (cluster, new)
    })
    .await
    .unwrap();
    let accepted = stream.await.unwrap();
    assert_ne!(new, old);
    assert_eq!(cluster.nodes().iter().find(|n| n.port == new).unwrap().role, Role::Primary);

    let mut by_position: HashMap<(String, u64), i32> = HashMap::new();
    for (p, i) in &accepted {
        let prev = by_position.insert((p.epoch.to_string(), p.offset), *i);
        assert!(prev.is_none(), "({}, {}) given to publications {prev:?} and {i}", p.epoch, p.offset);
    }
    let last = accepted.last().unwrap().0.clone();
    let h2 = h.clone();
    until("the stream to catch up or announce the gap", Duration::from_secs(15), async || {
        let done = h2.publications.lock().iter().any(|p| p.0 == "pt:f" && p.1 == last.offset && p.2 == "1000");
        done || !h2.missed.lock().is_empty()
    })
    .await;
    let got: Vec<(u64, String)> =
        h.publications.lock().iter().filter(|p| p.0 == "pt:f").map(|p| (p.1, p.2.clone())).collect();
    let unique: HashSet<&(u64, String)> = got.iter().collect();
    assert_eq!(unique.len(), got.len(), "no publication delivered twice");
    let gaps = got.windows(2).filter(|w| w[1].0 != w[0].0 + 1).count();
    let missed = h.missed.lock().clone();
    assert!(missed.contains(&"pt:f".to_string()), "the failover is announced to the channel's subscribers");
    assert!(gaps == 0 || !missed.is_empty());
    // The other primary's channel streamed on without a gap.
    h.wait_for("the other channel's stream", |h| h.offsets(&other).len() == 1000).await;
    assert_eq!(h.offsets(&other), (1..=1000).collect::<Vec<u64>>());
    assert!(!missed.contains(&other), "a channel on a live primary is not disturbed");
    // Recovering from a position of the old epoch (if the epoch changed) is honest.
    if let Some(before) = accepted.iter().map(|(p, _)| p).find(|p| p.epoch != last.epoch) {
        let r = subscriber.history("pt:f", Some(before), 2000).await.unwrap();
        assert!(!r.complete);
    }
    let (pos, value) = subscriber.last_or_start("pt:f").await.unwrap();
    assert_eq!((pos, value.unwrap().data.get()), (last, "1000"));
    // The refused subscribe held nothing: asked again after the failover, it is served.
    subscriber.subscribe(&on_dead).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_cluster_a_slot_moved_under_load_keeps_every_publication_once_and_subscribers_recover() {
    let cluster = Arc::new(start(3, 0).await);
    let b = Arc::new(ClusterBroker::new(&cluster.seed_url()).unwrap());
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    until("the cluster broker ready", Duration::from_secs(15), async || b.ready().await).await;
    // Two channels in one slot, moved together.
    let slot = key_slot(b"pt:mv");
    let twin = (0..).map(|i| format!("pt:mv{i}")).find(|c| key_slot(c.as_bytes()) == slot).unwrap();
    b.subscribe("pt:mv").await.unwrap();
    let from = cluster.primary_for_slot(slot);
    let to = cluster.nodes().iter().map(|n| n.port).find(|&p| p != from).unwrap();

    let stream = {
        let b = b.clone();
        let twin = twin.clone();
        tokio::spawn(async move {
            let mut accepted = Vec::new();
            for i in 1..=400 {
                let batch = ["pt:mv", twin.as_str()].map(|c| Outgoing::new(c, data(&i.to_string()), KEEP));
                for (item, r) in batch.iter().zip(b.publish_batch(batch.to_vec()).await) {
                    // Every publication is taken: while the slot moves, the broker waits for it.
                    let p = r.unwrap_or_else(|e| panic!("publication {i} of {} refused: {e}", item.channel));
                    accepted.push((item.channel.to_string(), p, i));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            accepted
        })
    };
    h.wait_for("publications before the move", |h| h.offsets("pt:mv").len() >= 50).await;
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.move_slot(slot, to, 1, Duration::from_millis(100))).await.unwrap();
    assert_eq!(cluster.primary_for_slot(slot), to);
    let accepted = stream.await.unwrap();

    let mut by_position = HashSet::new();
    for (ch, p, i) in &accepted {
        assert!(
            by_position.insert((ch.clone(), p.epoch.to_string(), p.offset)),
            "{ch} ({}, {}) reused at {i}",
            p.epoch,
            p.offset
        );
    }
    // The old owner dropped the subscription: the subscriber is told, resubscribes (as a
    // client does) and streams from the new owner.
    h.wait_for("the move announced", |h| h.missed.lock().iter().any(|c| c == "pt:mv")).await;
    b.unsubscribe("pt:mv").await.unwrap();
    b.subscribe("pt:mv").await.unwrap();
    let p = b.publish("pt:mv", data("\"after\""), KEEP).await.unwrap();
    h.wait_for("a publication from the new owner", |h| {
        h.publications.lock().iter().any(|x| x.0 == "pt:mv" && x.1 == p.offset && x.2 == "\"after\"")
    })
    .await;
    let (pos, last) = b.last_or_start("pt:mv").await.unwrap();
    assert_eq!((pos, last.unwrap().data.get()), (p, "\"after\""));
    let twin_last = accepted.iter().rev().find(|a| a.0 == twin).unwrap();
    assert_eq!(b.last_or_start(&twin).await.unwrap().0, twin_last.1, "the twin's keys moved with the slot");
}
