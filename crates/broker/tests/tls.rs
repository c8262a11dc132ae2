//! The Redis broker over TLS (`rediss://`) to a real `redis-server` with a TLS port, its
//! certificate signed by a throwaway CA the test makes with `openssl`.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use support::until;
use switchboard_broker::conformance::run_all;
use switchboard_broker::{Broker, HistoryPolicy, RedisBroker, ShardedRedisBroker};
use switchboard_testkit::TlsRedis;

const KEEP: HistoryPolicy = HistoryPolicy { size: 10, ttl: Duration::from_secs(60), trend: None };

fn data(s: &str) -> switchboard_broker::Data {
    Arc::new(RawValue::from_string(s.to_string()).unwrap())
}

#[tokio::test]
async fn broker_tls_passes_the_conformance_suite_over_rediss() {
    let r = TlsRedis::start();
    let url = r.url();
    let first = RedisBroker::new(&format!("{url}&prefix=warmup")).unwrap();
    until("the broker ready over TLS", Duration::from_secs(10), async || first.ready().await).await;
    let n = AtomicUsize::new(0);
    run_all(|| {
        let prefix = format!("case{}", n.fetch_add(1, Ordering::Relaxed));
        Arc::new(RedisBroker::new(&format!("{url}&prefix={prefix}")).unwrap()) as Arc<dyn Broker>
    })
    .await;
    // The broker's connections are on the TLS port (`CLIENT LIST` shows each one's local address).
    let clients: String = r.server.cmd(redis::cmd("CLIENT").arg("LIST"));
    let on_tls = clients.lines().filter(|l| l.contains(&format!("laddr=127.0.0.1:{}", r.tls_port()))).count();
    assert!(on_tls >= 2, "the broker's connections are on the TLS port:\n{clients}");
}

#[tokio::test]
async fn broker_tls_shards_take_rediss_urls_too() {
    let (a, b) = (TlsRedis::start(), TlsRedis::start());
    let s = ShardedRedisBroker::new(&format!("{},{}", a.url(), b.url())).unwrap();
    until("both TLS shards ready", Duration::from_secs(10), async || s.ready().await).await;
    let p = s.publish("room:tls", data("1"), KEEP).await.unwrap();
    assert_eq!(p.offset, 1);
    assert_eq!(s.last_or_start("room:tls").await.unwrap().1.unwrap().data.get(), "1");
}

#[tokio::test]
async fn broker_tls_refuses_a_server_its_ca_did_not_sign_and_plain_redis_on_the_tls_port() {
    let r = TlsRedis::start();
    let wrong_ca = format!("rediss://127.0.0.1:{}/0?tls_ca={}", r.tls_port(), r.other_ca().display());
    let plain = format!("redis://127.0.0.1:{}/0", r.tls_port());
    for url in [wrong_ca, plain] {
        let b = RedisBroker::new(&url).unwrap();
        // Bounded: the connect and response timeouts end every attempt.
        let publish = tokio::time::timeout(Duration::from_secs(20), b.publish("room:x", data("1"), KEEP)).await;
        assert!(matches!(publish, Ok(Err(_))), "{url}: {publish:?}");
        assert!(!b.ready().await, "{url}");
    }
}
