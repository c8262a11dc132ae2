//! Black-box tests of the HTTP transports across a cluster: real `switchboard` nodes on one real
//! `redis-server` (started by each test on a spare loopback port, killed by PID at the end).
//! A long-poll session is not tied to a node: polled on alternating nodes, or continued after
//! its node was killed or shut down, it delivers every publication exactly once, in order. An
//! SSE stream resumed on another node with `Last-Event-ID` continues exactly.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchboard_client::HttpApi;

mod support;
use support::{Redis, Server, Server as Node};

/// Polls held for 2 s, so tests see empty polls come back quickly.
const POLL_ENV: &[(&str, &str)] = &[("SWITCHBOARD_POLL_TIMEOUT_S", "2")];

async fn all_ready(nodes: &[&Node]) {
    for n in nodes {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !n.ready().await {
            assert!(Instant::now() < deadline, "node not ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A long-poll client that may talk to any node: it keeps only the session id and the number
/// of the last batch it received.
struct Poller {
    id: String,
    seq: u64,
}

impl Poller {
    async fn open(api: &HttpApi, commands: &[Value]) -> Poller {
        let body: Vec<String> = commands.iter().map(Value::to_string).collect();
        let r = api.request("POST", "/poll", Some(body.join("\n").as_bytes())).await.unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        Poller { id: v["session"].as_str().unwrap().to_string(), seq: 0 }
    }

    /// One poll on `api`'s node; the messages of the batch.
    async fn poll(&mut self, api: &HttpApi) -> Vec<Value> {
        let path = format!("/poll/{}?ack={}&timeout=1", self.id, self.seq);
        let r = api.request("GET", &path, None).await.unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        self.seq = v["seq"].as_u64().unwrap();
        v["messages"].as_array().unwrap().clone()
    }

    async fn send(&self, api: &HttpApi, command: Value) {
        let r = api.request("POST", &format!("/poll/{}", self.id), Some(command.to_string().as_bytes())).await.unwrap();
        assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    }
}

/// Offsets of `channel`'s publications in `msgs`.
fn offsets(msgs: &[Value], channel: &str) -> Vec<u64> {
    msgs.iter().filter(|m| m["pub"]["ch"] == channel).map(|m| m["pub"]["off"].as_u64().unwrap()).collect()
}

fn assert_no_disconnect(msgs: &[Value]) {
    for m in msgs {
        assert!(m.get("disconnect").is_none(), "unexpected disconnect: {m}");
    }
}

/// Publishes `total` publications on `channel` through `api`, spread over about a second.
fn publisher(api: HttpApi, channel: &'static str, total: u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for i in 1..=total {
            api.publish(channel, &json!(i)).await.unwrap();
            if i.is_multiple_of(20) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    })
}

#[tokio::test]
async fn fallback_poll_session_polled_on_alternating_nodes_loses_nothing() {
    const TOTAL: u64 = 300;
    let redis = Redis::start();
    let (n1, n2) = (Node::node_on(&redis.url(), "n1", POLL_ENV), Node::node_on(&redis.url(), "n2", POLL_ENV));
    all_ready(&[&n1, &n2]).await;
    let apis = [n1.api(), n2.api()];
    let mut p = Poller::open(&apis[0], &[json!({"id": 1, "subscribe": {"channels": ["ticks"]}})]).await;
    let first = p.poll(&apis[0]).await;
    assert_eq!(first[0]["id"], 1);
    let publishing = publisher(n2.api(), "ticks", TOTAL);
    let mut got = Vec::new();
    let mut pings = Vec::new();
    let mut turn = 1usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.last() != Some(&TOTAL) {
        assert!(Instant::now() < deadline, "stuck after {:?}", got.last());
        // Every poll goes to the other node; now and then a command goes to a third party.
        let api = &apis[turn % 2];
        if turn.is_multiple_of(5) {
            p.send(&apis[turn % 2], json!({"id": 1000 + turn, "ping": {"data": turn}})).await;
        }
        let msgs = p.poll(api).await;
        assert_no_disconnect(&msgs);
        got.extend(offsets(&msgs, "ticks"));
        pings.extend(msgs.iter().filter_map(|m| m["ok"]["data"].as_u64()));
        turn += 1;
    }
    publishing.await.unwrap();
    assert_eq!(got, (1..=TOTAL).collect::<Vec<_>>(), "every publication exactly once, in order");
    // Every command's reply arrived, whichever node took it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let sent: Vec<u64> = (1..turn).filter(|t| t.is_multiple_of(5)).map(|t| t as u64).collect();
    while pings.len() < sent.len() {
        assert!(Instant::now() < deadline, "ping replies {pings:?} of {sent:?}");
        let msgs = p.poll(&apis[turn % 2]).await;
        pings.extend(msgs.iter().filter_map(|m| m["ok"]["data"].as_u64()));
        turn += 1;
    }
    assert_eq!(pings, sent, "replies in command order");
}

#[tokio::test]
async fn fallback_poll_session_survives_kill9_of_its_node() {
    let redis = Redis::start();
    poll_takeover_after_kill9(&redis.url()).await;
}

/// The same with the nodes on a Redis Cluster: the session's keys live on its slot's primary.
#[tokio::test]
async fn fallback_poll_session_survives_kill9_of_its_node_on_a_redis_cluster() {
    let cluster = switchboard_testkit::RedisCluster::start(3, 0);
    poll_takeover_after_kill9(&cluster.seed_url()).await;
}

async fn poll_takeover_after_kill9(broker: &str) {
    const TOTAL: u64 = 200;
    let (mut n1, n2) = (Node::node_on(broker, "n1", POLL_ENV), Node::node_on(broker, "n2", POLL_ENV));
    all_ready(&[&n1, &n2]).await;
    let (a1, a2) = (n1.api(), n2.api());
    let mut p = Poller::open(&a1, &[json!({"id": 1, "subscribe": {"channels": ["feed", "pt:gauge"]}})]).await;
    p.poll(&a1).await;
    let publishing = publisher(n2.api(), "feed", TOTAL);
    let mut got = Vec::new();
    while got.len() < 50 {
        got.extend(offsets(&p.poll(&a1).await, "feed"));
    }
    n1.kill9();
    // A pub on the point channel while nobody held the session.
    let last_pt = a2.publish("pt:gauge", &json!({"v": 7})).await.unwrap();
    let mut pt = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.last() != Some(&TOTAL) || pt.last() != Some(&last_pt.offset) {
        assert!(Instant::now() < deadline, "stuck after {:?}", got.last());
        let msgs = p.poll(&a2).await;
        assert_no_disconnect(&msgs);
        got.extend(offsets(&msgs, "feed"));
        pt.extend(offsets(&msgs, "pt:gauge"));
    }
    publishing.await.unwrap();
    assert_eq!(got, (1..=TOTAL).collect::<Vec<_>>(), "every publication exactly once, in order");
    assert_eq!(pt, vec![last_pt.offset]);
}

#[tokio::test]
async fn fallback_poll_session_survives_a_graceful_shutdown() {
    let redis = Redis::start();
    let (mut n1, n2) = (Node::node_on(&redis.url(), "n1", POLL_ENV), Node::node_on(&redis.url(), "n2", POLL_ENV));
    all_ready(&[&n1, &n2]).await;
    let (a1, a2) = (n1.api(), n2.api());
    let mut p = Poller::open(&a1, &[json!({"id": 1, "subscribe": {"channels": ["events"]}})]).await;
    p.poll(&a1).await;
    for i in 1..=10 {
        a2.publish("events", &json!(i)).await.unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 10 {
        got.extend(offsets(&p.poll(&a1).await, "events"));
    }
    n1.terminate();
    for i in 11..=20 {
        a2.publish("events", &json!(i)).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 20 {
        assert!(Instant::now() < deadline, "stuck at {got:?}");
        let msgs = p.poll(&a2).await;
        assert_no_disconnect(&msgs);
        got.extend(offsets(&msgs, "events"));
    }
    assert_eq!(got, (1..=20).collect::<Vec<_>>());
}

/// Streams session `id` over SSE from `port` until the node ends the stream; every message it
/// carried. `kept_alive`: the stream is the connection's second request; otherwise its first.
/// Either way hyper writes it, chunked.
fn session_stream_to_end(port: u16, id: &str, kept_alive: bool, opened: std::sync::mpsc::Sender<()>) -> Vec<Value> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    if kept_alive {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        while !raw.ends_with(b"ok\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "closed after the first request");
            raw.extend_from_slice(&buf[..n]);
        }
        raw.clear();
    }
    s.write_all(format!("GET /sse?session={id} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).unwrap();
    let mut told = false;
    loop {
        let n = s.read(&mut buf).expect("the stream ends when the session moves");
        // A chunked stream ends with its last chunk; the connection may stay.
        if n == 0 || raw.ends_with(b"\r\n0\r\n\r\n") {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if !told && raw.windows(4).any(|w| w == b"\r\n\r\n") {
            told = true;
            let _ = opened.send(());
        }
    }
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_lowercase().contains("transfer-encoding: chunked"), "{head}");
    body.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect()
}

/// A session streamed — on a connection of its own, or after another request on a kept-alive
/// one — with commands posted to both nodes
/// meanwhile, then polled on the other node: once the stream's node has had a quiet second to
/// record what it wrote, the takeover repeats nothing and loses nothing — every publication
/// and every reply exactly once.
#[tokio::test]
async fn fallback_poll_session_streamed_then_polled_on_another_node_repeats_nothing() {
    streamed_then_polled_elsewhere(false).await;
}

#[tokio::test]
async fn fallback_poll_session_streamed_on_a_kept_alive_connection_then_polled_elsewhere_repeats_nothing() {
    streamed_then_polled_elsewhere(true).await;
}

async fn streamed_then_polled_elsewhere(kept_alive: bool) {
    const TOTAL: u64 = 200;
    let redis = Redis::start();
    let (n1, n2) = (Node::node_on(&redis.url(), "n1", POLL_ENV), Node::node_on(&redis.url(), "n2", POLL_ENV));
    all_ready(&[&n1, &n2]).await;
    let (a1, a2) = (n1.api(), n2.api());
    let mut p = Poller::open(&a1, &[json!({"id": 1, "subscribe": {"channels": ["streamed"]}})]).await;
    assert_eq!(p.poll(&a1).await[0]["id"], 1);
    let (port, id) = (n1.port, p.id.clone());
    let (opened_tx, opened) = std::sync::mpsc::channel();
    let stream = tokio::task::spawn_blocking(move || session_stream_to_end(port, &id, kept_alive, opened_tx));
    tokio::task::spawn_blocking(move || opened.recv_timeout(Duration::from_secs(20))).await.unwrap().unwrap();
    let publishing = publisher(n2.api(), "streamed", TOTAL);
    for i in 0..6u64 {
        // Commands to the holder, and to the other node (which hands them to the holder).
        p.send(if i % 2 == 0 { &a1 } else { &a2 }, json!({"id": 100 + i, "ping": {"data": i}})).await;
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    publishing.await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // The poll on the other node takes the session over; the stream on the first one ends.
    let mut msgs = stream_and_then(&mut p, &a2, stream).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert_no_disconnect(&msgs);
        let got = offsets(&msgs, "streamed");
        let pings: Vec<u64> = msgs.iter().filter_map(|m| m["ok"]["data"].as_u64()).collect();
        if got.len() as u64 >= TOTAL && pings.len() >= 6 {
            assert_eq!(got, (1..=TOTAL).collect::<Vec<_>>(), "every publication exactly once, in order");
            assert_eq!(pings, (0..6).collect::<Vec<_>>(), "every reply exactly once, in order");
            break;
        }
        assert!(Instant::now() < deadline, "stuck at {} publications, pings {pings:?}", got.len());
        msgs.extend(p.poll(&a2).await);
    }
    // Nothing more comes: no repeat after the takeover settled.
    assert_eq!(offsets(&p.poll(&a2).await, "streamed"), Vec::<u64>::new());
}

/// The stream's messages, then those of a poll on `api` (which ends the stream).
async fn stream_and_then(p: &mut Poller, api: &HttpApi, stream: tokio::task::JoinHandle<Vec<Value>>) -> Vec<Value> {
    let polled = p.poll(api).await;
    let mut msgs = stream.await.unwrap();
    msgs.extend(polled);
    msgs
}

/// Reads SSE events from a raw socket until `count` publications arrived.
fn sse_read(port: u16, path: &str, last_id: Option<&str>, count: usize) -> Vec<(String, Value)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n");
    if let Some(id) = last_id {
        head.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut text = String::new();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    while out.len() < count {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "stream ended early");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
        // Chunk-size lines are not `field:` lines; the parse below skips them.
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let (mut id, mut data, mut event) = (String::new(), String::new(), String::from("message"));
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_string();
                }
            }
            if event == "message" && !data.is_empty() {
                out.push((id, serde_json::from_str(&data).unwrap()));
            }
        }
    }
    out
}

#[tokio::test]
async fn fallback_sse_resumes_on_another_node_with_last_event_id() {
    let redis = Redis::start();
    let (n1, n2) = (Node::node_on(&redis.url(), "n1", POLL_ENV), Node::node_on(&redis.url(), "n2", POLL_ENV));
    all_ready(&[&n1, &n2]).await;
    let api = n2.api();
    for i in 1..=5 {
        api.publish("sse:a", &json!(i)).await.unwrap();
        api.publish("sse:b", &json!(i * 10)).await.unwrap();
    }
    let port1 = n1.port;
    let first = tokio::task::spawn_blocking(move || sse_read(port1, "/sse?channels=sse:a,sse:b&initial=true", None, 2))
        .await
        .unwrap();
    let last_id = first.last().unwrap().0.clone();
    assert!(last_id.contains("sse:a@") && last_id.contains(";sse:b@"), "{last_id}");
    for i in 6..=8 {
        api.publish("sse:a", &json!(i)).await.unwrap();
        api.publish("sse:b", &json!(i * 10)).await.unwrap();
    }
    let port2 = n2.port;
    let resumed = tokio::task::spawn_blocking(move || {
        sse_read(port2, "/sse?channels=sse:a,sse:b&initial=true", Some(&last_id), 6)
    })
    .await
    .unwrap();
    let of = |ch: &str| -> Vec<u64> {
        resumed.iter().filter(|(_, v)| v["pub"]["ch"] == ch).map(|(_, v)| v["pub"]["off"].as_u64().unwrap()).collect()
    };
    assert_eq!(of("sse:a"), vec![6, 7, 8]);
    assert_eq!(of("sse:b"), vec![6, 7, 8]);
}

/// `switchboard bench <args> --transport <t>` against `node`; its `result.json`.
fn bench_over(node: &Server, transport: &str, args: &[&str]) -> Value {
    let out = std::env::temp_dir().join(format!("sb-fallback-bench-{}-{}-{transport}", std::process::id(), args[0]));
    let _ = std::fs::remove_dir_all(&out);
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .arg("bench")
        .args(args)
        .args(support::loose_bounds(args))
        .args(["--transport", transport, "--quiet", "--target"])
        .arg(format!("ws://127.0.0.1:{}/ws", node.port))
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("bench {args:?} over {transport} did not finish");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(out.join("result.json")).unwrap();
    let _ = std::fs::remove_dir_all(&out);
    serde_json::from_str(&text).unwrap()
}

#[test]
fn fallback_bench_scenarios_run_over_sse_and_poll() {
    let node = Server::start(&[]);
    for transport in ["sse", "poll"] {
        for args in [
            &["broadcast", "--subs", "40", "--bursts", "3", "--period", "0.5"][..],
            &["rooms", "--rooms", "4", "--members", "3", "--iterations", "3", "--pause", "0.1"][..],
            &["streams", "--users", "2", "--points", "30", "--hz", "2", "--duration", "2"][..],
        ] {
            let r = bench_over(&node, transport, args);
            let what = format!("{} over {transport}: {r}", args[0]);
            assert_eq!(r["params"]["transport"], transport, "{what}");
            assert_eq!(r["connections"]["failed"], 0, "{what}");
            assert_eq!(r["messages"]["lost"], 0, "{what}");
            assert_eq!(r["messages"]["duplicated"], 0, "{what}");
            assert!(r["messages"]["received"].as_u64().unwrap() > 0, "{what}");
            assert_eq!(r["pass"], true, "{what}");
        }
    }
}

#[test]
fn fallback_bench_broadcast_runs_over_plain_streams_and_rooms_say_they_cannot() {
    let node = Server::start(&[]);
    let r = bench_over(&node, "sse-channels", &["broadcast", "--subs", "40", "--bursts", "3", "--period", "0.5"]);
    let what = format!("broadcast over sse-channels: {r}");
    assert_eq!(r["params"]["transport"], "sse-channels", "{what}");
    assert_eq!(r["connections"]["established"], 40, "{what}");
    assert_eq!(r["messages"]["expected"], 40 * 3, "{what}");
    assert_eq!(r["messages"]["received"], 40 * 3, "{what}");
    assert_eq!((r["messages"]["lost"].as_u64(), r["messages"]["duplicated"].as_u64()), (Some(0), Some(0)), "{what}");
    assert_eq!(r["pass"], true, "{what}");
    // A plain stream takes no command after its subscribe: members cannot publish.
    let r = bench_over(&node, "sse-channels", &["rooms", "--rooms", "2", "--members", "2", "--iterations", "2"]);
    assert_eq!(r["pass"], false, "rooms over sse-channels: {r}");
    assert!(r.to_string().contains("sse-channels takes no command"), "the reason is reported: {r}");
}
