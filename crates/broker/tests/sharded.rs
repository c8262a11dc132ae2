//! `ShardedRedisBroker` over three real `redis-server` processes (started by each test on spare
//! loopback ports, killed by PID when it ends).
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use support::until;
use switchboard_broker::conformance::{list_all, run_all, RecordingHandler};
use switchboard_broker::sharded::shard_of;
use switchboard_broker::{Broker, HistoryPolicy, Outgoing, ShardedRedisBroker};
use switchboard_testkit::Shards;

const KEEP: HistoryPolicy = HistoryPolicy { size: 100, ttl: Duration::from_secs(300), trend: None };

fn data(s: &str) -> switchboard_broker::Data {
    Arc::new(RawValue::from_string(s.to_string()).unwrap())
}

fn urls(s: &Shards, prefix: &str) -> String {
    s.servers().iter().map(|r| format!("{}?prefix={prefix}", r.url())).collect::<Vec<_>>().join(",")
}

/// A channel name that lands on `shard` of 3.
fn channel_on(shard: usize, tag: &str) -> String {
    (0..).map(|i| format!("room:{tag}{i}")).find(|c| shard_of(c, 3) == shard).unwrap()
}

#[tokio::test]
async fn broker_sharded_passes_the_conformance_suite() {
    let shards = Shards::start(3);
    let first = ShardedRedisBroker::new(&urls(&shards, "warmup")).unwrap();
    until("three shards ready", Duration::from_secs(10), async || first.ready().await).await;
    let n = AtomicUsize::new(0);
    run_all(|| {
        let prefix = format!("case{}", n.fetch_add(1, Ordering::Relaxed));
        Arc::new(ShardedRedisBroker::new(&urls(&shards, &prefix)).unwrap()) as Arc<dyn Broker>
    })
    .await;
}

#[tokio::test]
async fn broker_sharded_keeps_a_channel_on_its_shard_and_a_batch_on_every_shard() {
    let shards = Shards::start(3);
    let b = ShardedRedisBroker::new(&shards.urls_joined()).unwrap();
    until("three shards ready", Duration::from_secs(10), async || b.ready().await).await;
    let names: Vec<String> = (0..300).map(|i| format!("pt:s.{i}")).collect();
    let items = names.iter().map(|c| Outgoing::new(c, data("1"), KEEP));
    let results = b.publish_batch(items.collect()).await;
    assert!(results.iter().all(|r| r.as_ref().map(|p| p.offset).ok() == Some(1)));
    for (i, server) in shards.servers().iter().enumerate() {
        let keys: Vec<String> = server.cmd(redis::cmd("KEYS").arg("sb:{*}:m"));
        let expected = names.iter().filter(|c| shard_of(c, 3) == i).count();
        assert_eq!(keys.len(), expected, "shard {i} holds exactly its channels");
        assert!((70..=130).contains(&keys.len()), "shard {i}: {} of 300", keys.len());
    }
    assert_eq!(list_all(&b, "", 1000).await.len(), 300);
}

#[tokio::test]
async fn broker_sharded_a_down_shard_stops_only_its_channels_and_they_recover_when_it_returns() {
    let mut shards = Shards::start(3);
    let b = ShardedRedisBroker::new(&shards.urls_joined()).unwrap();
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    until("three shards ready", Duration::from_secs(10), async || b.ready().await).await;
    let (down, up) = (channel_on(1, "d"), channel_on(2, "u"));
    b.subscribe(&down).await.unwrap();
    b.subscribe(&up).await.unwrap();
    b.publish(&down, data("1"), KEEP).await.unwrap();
    h.wait_for("the first publication", |h| h.offsets(&down) == vec![1]).await;

    shards.servers_mut()[1].kill();
    until("/readyz to see the shard down", Duration::from_secs(10), async || !b.ready().await).await;
    h.wait_for("its subscribers told to recover", |h| h.missed.lock().contains(&down)).await;
    assert!(b.publish(&down, data("2"), KEEP).await.is_err(), "a down shard refuses publications");
    // The other shards keep streaming.
    for i in 1..=3 {
        b.publish(&up, data(&i.to_string()), KEEP).await.unwrap();
    }
    h.wait_for("the other shard's stream", |h| h.offsets(&up) == vec![1, 2, 3]).await;
    assert!(!h.missed.lock().contains(&up));

    shards.servers_mut()[1].restart();
    until("ready again", Duration::from_secs(15), async || b.ready().await).await;
    // Data of the restarted shard is gone (no persistence): a new epoch, and delivery resumes.
    let p = b.publish(&down, data("3"), KEEP).await.unwrap();
    assert_eq!(p.offset, 1);
    h.wait_for("delivery after the return", |h| h.publications.lock().iter().any(|x| x.0 == down && x.2 == "3")).await;
}
