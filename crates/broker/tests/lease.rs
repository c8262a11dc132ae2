//! Leases ([`Broker::lease`]) against a real `redis-server` (one server and two shards),
//! started by each test on a spare loopback port and killed by PID when the test ends.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchboard_broker::redis::{RedisBroker, RedisOptions};
use switchboard_broker::{Broker, MemoryBroker, ShardedRedisBroker};

fn broker(url: &str) -> Arc<dyn Broker> {
    let options = RedisOptions { prefix: "lease".into(), presence_ttl: Duration::from_secs(15) };
    Arc::new(RedisBroker::with_options(url, options).unwrap())
}

async fn ready(b: &dyn Broker) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !b.ready().await {
        assert!(Instant::now() < deadline, "redis not ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One holder at a time; the holder renews; an expired or released lease goes to the next.
async fn exclusive(a: &dyn Broker, b: &dyn Broker) {
    let ttl = Duration::from_millis(600);
    assert!(a.lease("source:plc", "node-a", ttl).await.unwrap());
    assert!(!b.lease("source:plc", "node-b", ttl).await.unwrap(), "held by node-a");
    assert!(b.lease("source:other", "node-b", ttl).await.unwrap(), "leases are independent");
    // node-a renews within its ttl and keeps it past the first ttl.
    for _ in 0..4 {
        tokio::time::sleep(ttl / 3).await;
        assert!(a.lease("source:plc", "node-a", ttl).await.unwrap());
        assert!(!b.lease("source:plc", "node-b", ttl).await.unwrap());
    }
    // node-a stops renewing (it died): node-b takes over once the ttl passes, not before.
    let died = Instant::now();
    while !b.lease("source:plc", "node-b", ttl).await.unwrap() {
        assert!(died.elapsed() < Duration::from_secs(3), "the lease never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(died.elapsed() >= ttl - Duration::from_millis(100), "taken over after {:?}", died.elapsed());
    assert!(!a.lease("source:plc", "node-a", ttl).await.unwrap(), "node-a lost it");
    // Releasing by someone else does nothing; by the holder frees it at once.
    a.lease_release("source:plc", "node-a").await.unwrap();
    assert!(!a.lease("source:plc", "node-a", ttl).await.unwrap());
    b.lease_release("source:plc", "node-b").await.unwrap();
    assert!(a.lease("source:plc", "node-a", ttl).await.unwrap());
}

#[tokio::test]
async fn broker_lease_redis_is_held_by_one_node_and_moves_when_it_expires() {
    let r = switchboard_testkit::RedisServer::start();
    let (a, b) = (broker(&r.url()), broker(&r.url()));
    ready(&*a).await;
    ready(&*b).await;
    exclusive(&*a, &*b).await;
}

#[tokio::test]
async fn broker_lease_sharded_routes_each_lease_to_one_shard() {
    let shards = switchboard_testkit::Shards::start(2);
    let url = shards.urls_joined();
    let a: Arc<dyn Broker> = Arc::new(ShardedRedisBroker::new(&url).unwrap());
    let b: Arc<dyn Broker> = Arc::new(ShardedRedisBroker::new(&url).unwrap());
    ready(&*a).await;
    ready(&*b).await;
    exclusive(&*a, &*b).await;
}

#[tokio::test]
async fn broker_lease_memory_grants_every_lease() {
    let m = MemoryBroker::new();
    assert!(m.lease("source:plc", "a", Duration::from_secs(5)).await.unwrap());
    assert!(m.lease("source:plc", "b", Duration::from_secs(5)).await.unwrap());
}
