//! Black-box cluster tests: several real `switchboard` nodes on one real `redis-server` (started
//! by each test on a spare loopback port, no persistence, killed by PID at the end), driven by
//! our Rust client. No sticky sessions: clients move between nodes and recover by offset.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use switchboard_client::{ChannelResult, Client, Event, Format, SubscribeOptions};

mod support;
use support::{Redis, Server as Node};

async fn until(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn all_ready(nodes: &[&Node]) {
    for n in nodes {
        until("/readyz", Duration::from_secs(15), async || n.ready().await).await;
    }
}

fn subscribed(r: &ChannelResult) -> &switchboard_client::Subscribed {
    match r {
        ChannelResult::Subscribed(s) => s,
        ChannelResult::Error { error } => panic!("subscribe failed: {error:?}"),
    }
}

async fn next_pub(c: &mut Client) -> switchboard_client::Publication {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), c.next_event()).await.expect("event within 10 s") {
            Some(Event::Publication(p)) => return p,
            Some(Event::Unsubscribed { ch, code, .. }) => {
                panic!("{ch} ended by the node ({code}) instead of a publication")
            }
            Some(_) => continue,
            None => panic!("connection ended"),
        }
    }
}

#[tokio::test]
async fn cluster_publications_and_presence_reach_every_node() {
    let redis = Redis::start();
    let nodes = [Node::node(&redis, "n1"), Node::node(&redis, "n2"), Node::node(&redis, "n3")];
    all_ready(&nodes.iter().collect::<Vec<_>>()).await;
    let mut clients = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        for format in [Format::Json, Format::Msgpack] {
            let c = Client::connect(&node.ws(), format).await.unwrap();
            let r = c.subscribe(SubscribeOptions::new(["news", "room:all"])).await.unwrap();
            assert_eq!(subscribed(&r.channels["news"]).offset, 0);
            clients.push((i, c));
        }
    }
    // A publication made on any node reaches the subscribers on every node, once, in order.
    for (k, node) in nodes.iter().enumerate() {
        let p = node.api().publish("news", &json!({"from": k})).await.unwrap();
        assert_eq!(p.offset, k as u64 + 1);
    }
    clients[1].1.publish("room:all", json!({"text": "hi from n1"})).await.unwrap();
    for (_, c) in &mut clients {
        for k in 0..3u64 {
            let p = next_pub(c).await;
            assert_eq!((p.ch.as_str(), p.off, p.data), ("news", k + 1, json!({"from": k})));
        }
        let p = next_pub(c).await;
        assert_eq!((p.ch.as_str(), p.data), ("room:all", json!({"text": "hi from n1"})));
    }
    // Presence is cluster-wide: each node lists the six members wherever they are connected.
    for node in &nodes {
        let who = node.api().get("/api/presence/room:all").await.unwrap();
        assert_eq!(who["clients"].as_array().unwrap().len(), 6, "{who}");
    }
    // The cluster figures: three nodes, six subscribers of `news` (two per node).
    until("cluster figures", Duration::from_secs(15), async || {
        let info = nodes[0].api().get("/api/info").await.unwrap();
        let ch = nodes[2].api().get("/api/channels/news").await.unwrap();
        info["broker"] == "redis"
            && info["cluster"]["node_ids"] == json!(["n1", "n2", "n3"])
            && ch["cluster_subscribers"] == 6
            && ch["subscribers"] == 2
            && ch["offset"] == 3
    })
    .await;
    let list = nodes[1].api().get("/api/channels").await.unwrap();
    let names: Vec<&str> =
        list["channels"].as_array().unwrap().iter().map(|c| c["channel"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["news", "room:all"]);
    assert!(list["next"].is_null(), "one page holds both");
}

/// One client that follows a channel across node failures: on any disconnect it reconnects to
/// the next live node and recovers from the last offset it processed.
async fn follow(urls: Arc<Vec<String>>, dead: Arc<AtomicUsize>, start: usize, total: u64) -> (Vec<u64>, usize) {
    let mut got: Vec<u64> = Vec::new();
    let mut position: Option<(String, u64)> = None;
    let mut at = start;
    let mut reconnects = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    'connect: while got.last().copied() != Some(total) {
        assert!(Instant::now() < deadline, "client stuck at {:?} after {reconnects} reconnects", got.last());
        if at == dead.load(Ordering::SeqCst) {
            at = (at + 1) % urls.len();
        }
        let Ok(mut c) = Client::connect(&urls[at], Format::Json).await else {
            at = (at + 1) % urls.len();
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut opts = SubscribeOptions::new(["stream"]);
        if let Some((epoch, off)) = &position {
            opts = opts.recover("stream", epoch.clone(), *off);
        }
        let Ok(reply) = c.subscribe(opts).await else {
            reconnects += 1;
            continue;
        };
        let s = subscribed(&reply.channels["stream"]);
        match &position {
            Some((epoch, _)) => {
                assert!(s.complete, "recovery incomplete after a node failure");
                assert_eq!(&s.epoch, epoch, "the epoch survives a node failure");
            }
            None => position = Some((s.epoch.clone(), s.offset)),
        }
        for p in &s.recovered {
            got.push(p.off);
            assert_eq!(p.data, json!(p.off), "data of offset {}", p.off);
        }
        if let (Some((_, off)), Some(last)) = (&mut position, got.last()) {
            *off = *last;
        }
        while got.last().copied() != Some(total) {
            match tokio::time::timeout(Duration::from_secs(20), c.next_event()).await {
                Ok(Some(Event::Publication(p))) => {
                    got.push(p.off);
                    assert_eq!(p.data, json!(p.off), "data of offset {}", p.off);
                    if let Some((_, off)) = &mut position {
                        *off = p.off;
                    }
                }
                Ok(Some(Event::Disconnect { .. } | Event::Closed { .. } | Event::Unsubscribed { .. }) | None)
                | Err(_) => {
                    reconnects += 1;
                    continue 'connect;
                }
                Ok(Some(_)) => {}
            }
        }
    }
    (got, reconnects)
}

#[tokio::test]
async fn cluster_clients_of_a_killed_node_recover_every_offset_on_the_others() {
    let redis = Redis::start();
    killed_node_recovery(&redis.url()).await;
}

/// The same over three Redis shards: the stream's channel lives on one of them, the node
/// figures on every one.
#[tokio::test]
async fn cluster_on_shards_clients_of_a_killed_node_recover_every_offset_on_the_others() {
    let shards = switchboard_testkit::Shards::start(3);
    killed_node_recovery(&shards.urls_joined()).await;
}

/// The same over a Redis Cluster of three primaries: the nodes find the channel's primary,
/// publications travel by sharded pub/sub.
#[tokio::test]
async fn cluster_on_redis_cluster_clients_of_a_killed_node_recover_every_offset_on_the_others() {
    let cluster = switchboard_testkit::RedisCluster::start(3, 0);
    killed_node_recovery(&cluster.seed_url()).await;
}

async fn killed_node_recovery(broker: &str) {
    const TOTAL: u64 = 1200;
    let mut a = Node::node_on(broker, "a", &[]);
    let (b, c) = (Node::node_on(broker, "b", &[]), Node::node_on(broker, "c", &[]));
    all_ready(&[&a, &b, &c]).await;
    let urls = Arc::new(vec![a.ws(), b.ws(), c.ws()]);
    let dead = Arc::new(AtomicUsize::new(usize::MAX));
    // Twelve clients: six on node a (index 0), three each on b and c.
    let starts = [0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2];
    let mut followers = Vec::new();
    for &start in &starts {
        followers.push(tokio::spawn(follow(urls.clone(), dead.clone(), start, TOTAL)));
    }
    until("12 subscribers", Duration::from_secs(15), async || {
        // 404 until the first subscriber's read has created the channel.
        let ch = b.api().get("/api/channels/stream").await;
        ch.is_ok_and(|ch| ch["cluster_subscribers"] == 12)
    })
    .await;
    // The publisher streams through b and c while a is killed a third of the way in.
    let (bapi, capi) = (b.api(), c.api());
    for i in 1..=TOTAL {
        let api = if i % 2 == 0 { &bapi } else { &capi };
        let p = api.publish("stream", &json!(i)).await.unwrap();
        assert_eq!(p.offset, i);
        if i == TOTAL / 3 {
            dead.store(0, Ordering::SeqCst);
            a.kill9();
        }
    }
    let mut moved = 0;
    for (f, &start) in followers.into_iter().zip(&starts) {
        let (got, reconnects) = f.await.unwrap();
        assert_eq!(got.len() as u64, TOTAL, "every offset exactly once (first mismatch shows below)");
        assert_eq!(got, (1..=TOTAL).collect::<Vec<_>>(), "in order, no duplicates");
        if start == 0 {
            assert!(reconnects >= 1, "a client of the killed node must have moved");
            moved += 1;
        }
    }
    assert_eq!(moved, 6);
}

#[tokio::test]
async fn cluster_redis_restart_changes_the_epoch_and_service_resumes() {
    let mut redis = Redis::start();
    let port = redis.port;
    let node = Node::node(&redis, "solo");
    all_ready(&[&node]).await;
    let mut c = Client::connect(&node.ws(), Format::Json).await.unwrap();
    let r = c.subscribe(SubscribeOptions::new(["orders"])).await.unwrap();
    let epoch = subscribed(&r.channels["orders"]).epoch.clone();
    for i in 1..=3 {
        node.api().publish("orders", &json!(i)).await.unwrap();
    }
    let mut last = 0;
    for _ in 0..3 {
        last = next_pub(&mut c).await.off;
    }

    redis.kill();
    until("/readyz to fail while Redis is down", Duration::from_secs(15), async || !node.ready().await).await;
    let _redis = Redis::start_on(port);
    all_ready(&[&node]).await;

    // History is gone: the node ends the subscription with an `unsubscribed` push (the
    // connection stays) ...
    loop {
        match tokio::time::timeout(Duration::from_secs(15), c.next_event()).await.expect("an unsubscribed push") {
            Some(Event::Unsubscribed { ch, code, .. }) => {
                assert_eq!((ch.as_str(), code), ("orders", 4008));
                break;
            }
            Some(Event::Publication(p)) => panic!("publication {} after the hole and before the notice", p.off),
            Some(Event::Disconnect { code, .. } | Event::Closed { code, .. }) => panic!("connection closed ({code})"),
            Some(_) => continue,
            None => panic!("ended without an unsubscribed push"),
        }
    }
    // ... and subscribing again with recover says what cannot be recovered.
    let r = c.subscribe(SubscribeOptions::new(["orders"]).recover("orders", epoch.clone(), last)).await.unwrap();
    let s = subscribed(&r.channels["orders"]);
    assert!(!s.complete, "a new epoch after Redis lost its data");
    assert_ne!(s.epoch, epoch);
    assert!(s.recovered.is_empty());
    // Service resumes in the new epoch.
    let p = node.api().publish("orders", &json!("after")).await.unwrap();
    assert_eq!((p.epoch.as_str(), p.offset), (s.epoch.as_str(), s.offset + 1));
    let got = next_pub(&mut c).await;
    assert_eq!((got.off, got.data), (p.offset, json!("after")));
}

/// Subscribers arriving together on both nodes while publications stream each continue exactly
/// after the offset of their reply: the node replies only once its Redis subscription is
/// confirmed and everything up to the position it read has been delivered.
#[tokio::test]
async fn cluster_concurrent_subscribers_continue_exactly_after_their_reply() {
    const TOTAL: u64 = 400;
    const PER_NODE: usize = 12;
    let redis = Redis::start();
    let (n1, n2) = (Node::node(&redis, "n1"), Node::node(&redis, "n2"));
    all_ready(&[&n1, &n2]).await;
    // Connected first, so that their subscribes land together while publications stream.
    let mut clients = Vec::new();
    for url in [n1.ws(), n2.ws()] {
        for _ in 0..PER_NODE {
            clients.push(Client::connect(&url, Format::Json).await.unwrap());
        }
    }
    let api = n2.api();
    for i in 1..=50 {
        api.publish("ticks", &json!(i)).await.unwrap();
    }
    let publisher = tokio::spawn(async move {
        for i in 51..=TOTAL {
            api.publish("ticks", &json!(i)).await.unwrap();
        }
    });
    let start = Arc::new(tokio::sync::Barrier::new(clients.len()));
    let mut tasks = Vec::new();
    for mut c in clients {
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let r = c.subscribe(SubscribeOptions::new(["ticks"])).await.unwrap();
            let from = subscribed(&r.channels["ticks"]).offset;
            let mut got = Vec::new();
            while from < TOTAL && got.last() != Some(&TOTAL) {
                got.push(next_pub(&mut c).await.off);
            }
            (from, got)
        }));
    }
    publisher.await.unwrap();
    for t in tasks {
        let (from, got) = t.await.unwrap();
        assert_eq!(got, (from + 1..=TOTAL).collect::<Vec<_>>(), "live stream right after offset {from}");
    }
}

#[tokio::test]
async fn cluster_presence_of_a_killed_node_expires_with_leave_events() {
    let redis = Redis::start();
    let url = format!("{}?presence_ttl_s=1", redis.url());
    let (mut a, b) = (Node::node_on(&url, "a", &[]), Node::node_on(&url, "b", &[]));
    all_ready(&[&a, &b]).await;
    let on_a = Client::connect(&a.ws(), Format::Json).await.unwrap();
    let mut on_b = Client::connect(&b.ws(), Format::Json).await.unwrap();
    on_a.subscribe(SubscribeOptions::new(["room:lobby"])).await.unwrap();
    on_b.subscribe(SubscribeOptions::new(["room:lobby"])).await.unwrap();
    let gone = on_a.connect_cmd(None, None).await.unwrap().client;
    assert!(gone.starts_with("a-"), "client ids carry the node id: {gone}");
    // Heartbeats keep a's client present well past the TTL ...
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let who = b.api().get("/api/presence/room:lobby").await.unwrap();
    assert_eq!(who["clients"].as_array().unwrap().len(), 2, "{who}");
    // ... until a dies without a word: its client leaves, as seen from b.
    a.kill9();
    let left = loop {
        match tokio::time::timeout(Duration::from_secs(10), on_b.next_event()).await.expect("a leave within 10 s") {
            Some(Event::Leave(p)) => break p,
            Some(_) => continue,
            None => panic!("connection ended"),
        }
    };
    assert_eq!((left.ch.as_str(), left.client.as_str()), ("room:lobby", gone.as_str()));
    let who = b.api().get("/api/presence/room:lobby").await.unwrap();
    let clients: Vec<&str> = who["clients"].as_array().unwrap().iter().map(|c| c["client"].as_str().unwrap()).collect();
    assert_eq!(clients.len(), 1);
    assert!(clients[0].starts_with("b-"), "{who}");
}

/// `bench broadcast --also-target`: subscribers spread over three nodes, publications sent to
/// one; the report counts every delivery on every node.
#[tokio::test]
async fn cluster_bench_broadcast_spreads_subscribers_over_nodes() {
    let redis = Redis::start();
    let nodes = [Node::node(&redis, "b1"), Node::node(&redis, "b2"), Node::node(&redis, "b3")];
    all_ready(&nodes.iter().collect::<Vec<_>>()).await;
    let out = std::env::temp_dir().join(format!("sb-cluster-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["bench", "broadcast", "--subs", "30", "--period", "0.2", "--bursts", "5", "--quiet"])
        .args(support::loose_bounds(&["broadcast"]))
        .args(["--target", &nodes[0].ws(), "--also-target", &nodes[1].ws(), "--also-target", &nodes[2].ws()])
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .status();
    let status = tokio::time::timeout(Duration::from_secs(120), status).await.expect("bench finished").unwrap();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&out);
    assert!(status.success(), "{r}");
    assert_eq!(r["pass"], true, "{r}");
    assert_eq!(r["params"]["procs"], 3, "one load process per node");
    assert_eq!(r["connections"]["established"], 30);
    assert_eq!(r["messages"]["expected"], 150);
    assert_eq!(r["messages"]["received"], 150);
    assert_eq!(r["messages"]["lost"], 0);
    // Every node carried a share: a third of the subscribers × 5 publications (plus replies).
    for n in &nodes {
        let m = n.api().request("GET", "/metrics", None).await.unwrap();
        let text = String::from_utf8(m.body).unwrap();
        let out: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("switchboard_messages_out_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no messages_out in {text}"));
        assert!(out >= 50.0, "node {} sent {out} messages", n.port);
    }
}

#[test]
fn cluster_unreachable_or_misconfigured_redis_exits_2_naming_the_broker() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let live = Redis::start();
    for url in [
        format!("redis://127.0.0.1:{closed}/0"),
        // One shard of three down at start is a misconfiguration too.
        format!("{},redis://127.0.0.1:{closed}/0", live.url()),
        "redis+cluster://127.0.0.1:7000".to_string(),
        "redis://127.0.0.1:6379/0?prefix=a*b".to_string(),
    ] {
        let out = std::process::Command::new(support::BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--broker", &url])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {err}");
        assert!(err.contains("broker:"), "{url}: {err}");
    }
}

/// With a shared broker the node's ceiling is its channels with local subscribers: past
/// `limits.max_channels` a subscribe of a new channel is refused with 429 while the channels
/// held keep streaming; and the listing pages through what Redis holds (a bounded `SCAN` per
/// page) without a duplicate or a gap.
#[tokio::test]
async fn cluster_node_ceiling_refuses_new_channels_and_listing_pages_through_redis() {
    let redis = Redis::start();
    let node = Node::node_on(&redis.url(), "n1", &[("SWITCHBOARD_MAX_CHANNELS", "3")]);
    all_ready(&[&node]).await;
    let c = Client::connect(&node.ws(), Format::Json).await.unwrap();
    let r = c.subscribe(SubscribeOptions::new(["cap:a", "cap:b", "cap:c", "cap:d", "cap:e"])).await.unwrap();
    for ch in ["cap:a", "cap:b", "cap:c"] {
        subscribed(&r.channels[ch]);
    }
    for ch in ["cap:d", "cap:e"] {
        match &r.channels[ch] {
            ChannelResult::Error { error } => {
                assert_eq!(error.code, 429, "{error:?}");
                assert!(error.message.contains("maximum of 3 channels"), "{error:?}");
            }
            other => panic!("{ch} subscribed past the ceiling: {other:?}"),
        }
    }
    // A second subscriber of a held channel is no new channel: admitted.
    let mut other = Client::connect(&node.ws(), Format::Json).await.unwrap();
    subscribed(&other.subscribe(SubscribeOptions::new(["cap:a"])).await.unwrap().channels["cap:a"]);
    node.api().publish("cap:a", &json!(1)).await.unwrap();
    assert_eq!(next_pub(&mut other).await.data, json!(1));
    let metrics = String::from_utf8(node.api().request("GET", "/metrics", None).await.unwrap().body).unwrap();
    assert!(metrics.contains("switchboard_channels_refused_total 2\n"), "{metrics}");

    // 1,200 channels in Redis, listed 100 a page while more are created.
    let items: Vec<(String, serde_json::Value)> = (0..1200).map(|i| (format!("pg:{i:04}"), json!(i))).collect();
    for chunk in items.chunks(400) {
        node.api().publish_batch(chunk).await.unwrap();
    }
    let mut seen: Vec<String> = Vec::new();
    let mut cursor = String::new();
    for round in 0..1000 {
        let page = node.api().get(&format!("/api/channels?prefix=pg:&limit=100&cursor={cursor}")).await.unwrap();
        seen.extend(page["channels"].as_array().unwrap().iter().map(|c| c["channel"].as_str().unwrap().to_string()));
        node.api().publish(&format!("pg:new{round}"), &json!(0)).await.unwrap();
        match page["next"].as_str() {
            Some(next) => cursor = next.replace('.', "%2E"),
            None => break,
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "a channel listed twice");
    for (name, _) in &items {
        assert!(unique.binary_search(name).is_ok(), "{name} missing");
    }
}
