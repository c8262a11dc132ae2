//! The identity of a Redis server's data against real `redis-server` processes: a restart
//! that kept every acknowledged write (`appendonly yes`, `appendfsync always`) keeps every
//! channel's epoch and history; a restart that may have lost writes, and a promoted replica,
//! start new epochs.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use support::until;
use switchboard_broker::conformance::RecordingHandler;
use switchboard_broker::redis::{RedisBroker, RedisOptions};
use switchboard_broker::{Broker, HistoryPolicy};

type Redis = switchboard_testkit::RedisServer;

const KEEP: HistoryPolicy = HistoryPolicy { size: 100, ttl: Duration::from_secs(300), trend: None };
const DURABLE: [&str; 4] = ["--appendonly", "yes", "--appendfsync", "always"];

fn data(s: &str) -> switchboard_broker::Data {
    Arc::new(RawValue::from_string(s.to_string()).unwrap())
}

/// A broker whose heartbeat (and so its lineage note) runs every second.
fn broker(url: &str) -> Arc<RedisBroker> {
    let options = RedisOptions { prefix: "sb".into(), presence_ttl: Duration::from_secs(3) };
    Arc::new(RedisBroker::with_options(url, options).unwrap())
}

async fn ready(b: &RedisBroker) {
    until("the broker to be ready", Duration::from_secs(10), async || b.ready().await).await;
}

/// What the nodes noted of the server's durability (`None`: nothing yet).
fn noted(r: &Redis) -> Option<String> {
    r.cmd(redis::cmd("HGET").arg("sb:lineage").arg("durable"))
}

async fn noted_as(r: &Redis, durable: &str) {
    until("the durability note", Duration::from_secs(10), async || noted(r).as_deref() == Some(durable)).await;
}

fn datas(h: &switchboard_broker::HistoryResult) -> Vec<String> {
    h.publications.iter().map(|p| p.data.get().to_string()).collect()
}

#[tokio::test]
async fn broker_redis_restart_of_a_durable_server_keeps_epochs_history_and_deliveries() {
    let mut r = Redis::start_with(&DURABLE);
    let a = broker(&r.url());
    let h = Arc::new(RecordingHandler::default());
    a.set_handler(h.clone());
    ready(&a).await;
    a.subscribe("news").await.unwrap();
    noted_as(&r, "1").await;
    let first = a.publish("news", data("1"), KEEP).await.unwrap();
    let second = a.publish("news", data("2"), KEEP).await.unwrap();
    h.wait_for("offsets 1 and 2", |h| h.offsets("news") == vec![1, 2]).await;

    r.restart(); // kill -9, then the server loads its append-only file
    ready(&a).await;
    let third = a.publish("news", data("3"), KEEP).await.unwrap();
    assert_eq!(third.epoch, first.epoch, "the data survived: the epoch stays");
    assert_eq!(third.offset, 3);
    h.wait_for("delivery after the restart", |h| h.offsets("news") == vec![1, 2, 3]).await;
    let since = a.history("news", Some(&first), 10).await.unwrap();
    assert!(since.complete, "a reader from before the restart misses nothing");
    assert_eq!(datas(&since), ["2", "3"]);
    assert_eq!(a.last_or_start("news").await.unwrap().0.offset, third.offset);
    assert_eq!(second.offset, 2);

    // A second restart in a row keeps it too (the record follows each new replication id).
    r.restart();
    ready(&a).await;
    let fourth = a.publish("news", data("4"), KEEP).await.unwrap();
    assert_eq!((fourth.epoch.as_ref(), fourth.offset), (first.epoch.as_ref(), 4));
}

#[tokio::test]
async fn broker_redis_restart_of_a_server_that_may_lose_writes_starts_new_epochs() {
    // Every second's fsync: a kill -9 may lose the last second of acknowledged writes.
    let mut r = Redis::start_with(&["--appendonly", "yes", "--appendfsync", "everysec"]);
    let a = broker(&r.url());
    ready(&a).await;
    noted_as(&r, "0").await;
    let before = a.publish("news", data("1"), KEEP).await.unwrap();
    std::thread::sleep(Duration::from_millis(1500)); // fsynced: the old position is on disk

    r.restart();
    ready(&a).await;
    let after = a.publish("news", data("2"), KEEP).await.unwrap();
    assert_ne!(after.epoch, before.epoch);
    assert_eq!(after.offset, 1);
    assert!(!a.history("news", Some(&before), 10).await.unwrap().complete);
}

#[tokio::test]
async fn broker_redis_promoted_replica_starts_new_epochs_even_when_durable() {
    let primary = Redis::start_with(&DURABLE);
    let port = primary.port().to_string();
    let replica = Redis::start_with(&[&DURABLE[..], &["--replicaof", "127.0.0.1", &port]].concat());
    let a = broker(&primary.url());
    ready(&a).await;
    noted_as(&primary, "1").await;
    let before = a.publish("news", data("1"), KEEP).await.unwrap();
    // The replica has the publication and the record (`WAIT` would only count this test's
    // own connection's writes).
    let offset = |r: &Redis| -> Option<String> { r.cmd(redis::cmd("HGET").arg("sb:{news}:m").arg("o")) };
    until("the replica has the publication", Duration::from_secs(10), async || offset(&replica).is_some()).await;
    noted_as(&replica, "1").await;

    let _: () = replica.cmd(redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
    let b = broker(&replica.url());
    ready(&b).await;
    let after = b.publish("news", data("2"), KEEP).await.unwrap();
    assert_ne!(after.epoch, before.epoch, "a promoted replica may lack what clients saw");
    assert_eq!(after.offset, 1);
    assert!(!b.history("news", Some(&before), 10).await.unwrap().complete);
}
