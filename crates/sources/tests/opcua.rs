//! The OPC UA source against a real OPC UA server: `tests/python/opcua_server.py` (the
//! third-party `asyncua` package) started on a spare loopback port from the virtualenv that
//! `make py-deps` builds (`.venv` at the repository root), stopped by PID.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard_broker::Data;
use switchboard_sources::opcua::{self, OpcuaConfig};
use switchboard_sources::{Item, Sink, SinkError, SourceCtx, SourceStats, Write, WriteError};
use tokio::sync::{mpsc, oneshot, watch};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python of the test virtualenv; `make py-deps` (which `make rust-test` runs first)
/// creates it with asyncua.
fn python() -> PathBuf {
    let py = repo_root().join(".venv/bin/python");
    assert!(py.exists(), "{} missing: run `make py-deps` (creates .venv with asyncua)", py.display());
    py
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A running `opcua_server.py`, killed (by PID) when dropped.
struct OpcServer {
    child: Child,
    port: u16,
    extra: Vec<String>,
    /// Lines the server printed after `ready`.
    lines: Arc<Mutex<Vec<String>>>,
}

impl OpcServer {
    fn start(port: u16, extra: &[&str]) -> OpcServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut child = Command::new(python())
            .arg(repo_root().join("tests/python/opcua_server.py"))
            .arg("--port")
            .arg(port.to_string())
            .args(&extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start opcua_server.py");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let later = lines.clone();
        std::thread::spawn(move || {
            let mut stdout = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = stdout.next() {
                let _ = tx.send(line);
            }
            for line in stdout.map_while(Result::ok) {
                later.lock().expect("lock").push(line);
            }
        });
        // Generous: a server of thousands of nodes starts slowly on a loaded machine.
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(line) if line.starts_with("ready ") => {}
            other => {
                let _ = child.kill();
                panic!("opcua_server.py did not start: {other:?}");
            }
        }
        OpcServer { child, port, extra, lines }
    }

    fn restart(&mut self) {
        self.stop();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        *self = OpcServer::start(self.port, &extra);
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn url(&self) -> String {
        format!("opc.tcp://127.0.0.1:{}/switchboard/", self.port)
    }
}

impl Drop for OpcServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Collects every publication, live ones in `items` and historical ones in `historical`;
/// accepts all.
#[derive(Default)]
struct VecSink {
    items: Mutex<Vec<(String, Value)>>,
    historical: Mutex<Vec<(String, Value)>>,
}

#[async_trait::async_trait]
impl Sink for VecSink {
    async fn publish_batch(&self, items: Vec<Item>) -> Vec<Result<(), SinkError>> {
        let (mut live, mut historical) = (self.items.lock().expect("lock"), self.historical.lock().expect("lock"));
        let n = items.len();
        for i in items {
            let to = if i.historical { &mut historical } else { &mut live };
            to.push((i.channel, serde_json::from_str(i.data.get()).expect("points are JSON")));
        }
        vec![Ok(()); n]
    }
}

impl VecSink {
    fn on(&self, channel: &str) -> Vec<Value> {
        let all = self.items.lock().expect("lock");
        all.iter().filter(|(c, _)| c == channel).map(|(_, v)| v.clone()).collect()
    }
    fn len(&self) -> usize {
        self.items.lock().expect("lock").len()
    }
    fn historical_on(&self, channel: &str) -> Vec<Value> {
        let all = self.historical.lock().expect("lock");
        all.iter().filter(|(c, _)| c == channel).map(|(_, v)| v.clone()).collect()
    }
}

/// A running source with its sink, stats, write sender and stop switch.
struct Running {
    sink: Arc<VecSink>,
    stats: Arc<SourceStats>,
    writes: mpsc::Sender<Write>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn start(cfg: serde_json::Value) -> Running {
    let cfg: OpcuaConfig = serde_json::from_value(cfg).expect("config");
    cfg.check().expect("config checks");
    let sink = Arc::new(VecSink::default());
    let stats = Arc::new(SourceStats::default());
    let (writes, writes_rx) = mpsc::channel(16);
    let (stop, stop_rx) = watch::channel(false);
    let ctx = SourceCtx {
        name: cfg.name.clone(),
        sink: sink.clone(),
        stats: stats.clone(),
        writes: writes_rx,
        stop: stop_rx,
    };
    let task = tokio::spawn(opcua::run(cfg, ctx));
    Running { sink, stats, writes, stop, task }
}

impl Running {
    async fn write(&self, channel: &str, data: &str) -> Result<(), WriteError> {
        let (reply, rx) = oneshot::channel();
        let data: Data = Arc::new(serde_json::value::RawValue::from_string(data.into()).expect("JSON"));
        self.writes.send(Write { channel: channel.into(), data, reply }).await.expect("source runs");
        tokio::time::timeout(Duration::from_secs(10), rx).await.expect("write answered").expect("reply")
    }

    async fn shutdown(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(10), self.task).await.expect("source stops").expect("no panic");
    }
}

async fn wait_for(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opcua_browse_values_arrive_with_source_timestamps_and_quality() {
    let server = OpcServer::start(free_port(), &[]);
    let src = start(serde_json::json!({
        "name": "plc", "url": server.url(), "browse": "Objects/Plant", "sampling_ms": 50, "publishing_ms": 100,
    }));
    wait_for("five temperatures", 20, || src.sink.on("pt:Line1.Temp").len() >= 5).await;
    wait_for("level", 5, || !src.sink.on("pt:Line1.Level").is_empty()).await;
    let temps = src.sink.on("pt:Line1.Temp");
    let now = now_ms();
    for p in &temps {
        let t = p["t"].as_i64().expect("t");
        assert!((now - 30_000..=now + 1000).contains(&t), "source timestamp {t} not near now {now}");
        assert_eq!(p["q"], "good");
        assert!(p["v"].as_f64().is_some_and(|v| (14.9..=25.1).contains(&v)), "{p}");
    }
    // The server stamps each write: the source timestamps differ from value to value.
    assert!(temps.windows(2).all(|w| w[0]["t"].as_i64() <= w[1]["t"].as_i64()));
    assert!(temps.first().map(|p| &p["t"]) != temps.last().map(|p| &p["t"]));
    assert_eq!(src.sink.on("pt:Line1.Level")[0]["q"], "uncertain");
    assert_eq!(src.sink.on("pt:Line1.Level")[0]["v"], 42.5);
    assert_eq!(src.sink.on("pt:Line1.Mode")[0]["v"], "auto");
    assert_eq!(src.sink.on("pt:Line1.Serial")[0]["v"], "SN-0001");
    assert!(src.sink.on("pt:Line1.Running")[0]["v"].is_boolean());
    assert_eq!(src.sink.on("pt:Line1.Setpoint")[0]["v"], 50.0);
    assert_eq!(src.sink.on("pt:Line1.Count")[0]["v"], 7);
    assert!(src.stats.connected.load(Ordering::Relaxed));
    assert!(src.stats.messages.load(Ordering::Relaxed) >= 11);
    assert_eq!(src.stats.decode_errors.load(Ordering::Relaxed), 0);
    src.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opcua_listed_nodes_use_their_identifier_in_the_channel() {
    let server = OpcServer::start(free_port(), &[]);
    let src = start(serde_json::json!({
        "name": "plc", "url": server.url(), "channel": "pt:plc1.{name}",
        "nodes": ["ns=2;s=Line1.Temp", "ns=2;s=Line1.Mode", "ns=2;s=NoSuchNode"],
    }));
    wait_for("temperature", 20, || !src.sink.on("pt:plc1.Line1.Temp").is_empty()).await;
    wait_for("mode", 5, || !src.sink.on("pt:plc1.Line1.Mode").is_empty()).await;
    let channels: std::collections::BTreeSet<String> =
        src.sink.items.lock().expect("lock").iter().map(|(c, _)| c.clone()).collect();
    // The unknown node is refused by the server and logged; nothing is published for it.
    assert!(channels.iter().all(|c| c == "pt:plc1.Line1.Temp" || c == "pt:plc1.Line1.Mode"), "{channels:?}");
    src.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opcua_server_restart_marks_points_bad_then_resumes() {
    let mut server = OpcServer::start(free_port(), &[]);
    let src = start(serde_json::json!({
        "name": "plc", "url": server.url(), "browse": "Objects/Plant/Line1", "sampling_ms": 50, "publishing_ms": 100,
    }));
    wait_for("temperatures", 20, || src.sink.on("pt:Temp").len() >= 3).await;
    let before = src.sink.len();
    server.stop();
    wait_for("bad marks", 20, || src.sink.on("pt:Mode").iter().any(|p| p["q"] == "bad")).await;
    assert!(!src.stats.connected.load(Ordering::Relaxed));
    // Every subscribed point once, with its last value kept.
    let bad: Vec<(String, Value)> =
        src.sink.items.lock().expect("lock")[before..].iter().filter(|(_, p)| p["q"] == "bad").cloned().collect();
    assert_eq!(bad.len(), 7, "{bad:?}");
    let mode_bad = bad.iter().find(|(c, _)| c == "pt:Mode").expect("mode marked bad");
    assert_eq!(mode_bad.1["v"], "auto");
    // Writes while disconnected are answered, not queued.
    assert!(matches!(src.write("pt:Setpoint", r#"{"v":1}"#).await, Err(WriteError::Unavailable(_))));

    let marked = src.sink.len();
    server.restart();
    wait_for("values after the restart", 40, || {
        src.sink.items.lock().expect("lock")[marked..].iter().any(|(c, p)| c == "pt:Temp" && p["q"] == "good")
    })
    .await;
    assert!(src.stats.connected.load(Ordering::Relaxed));
    assert_eq!(src.stats.reconnects.load(Ordering::Relaxed), 1);
    // Nothing was marked bad twice for one outage.
    let bad_after = src.sink.items.lock().expect("lock")[marked..].iter().filter(|(_, p)| p["q"] == "bad").count();
    assert_eq!(bad_after, 0);
    src.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opcua_writes_are_converted_and_refusals_carry_the_device_status() {
    let server = OpcServer::start(free_port(), &[]);
    let src = start(serde_json::json!({
        "name": "plc", "url": server.url(), "browse": "Objects/Plant", "sampling_ms": 50, "publishing_ms": 100,
    }));
    wait_for("setpoint", 20, || !src.sink.on("pt:Line1.Setpoint").is_empty()).await;

    // Float node, JSON number from a dashboard control: accepted, and the new value comes back.
    assert_eq!(src.write("pt:Line1.Setpoint", r#"{"v":61.5,"t":1}"#).await, Ok(()));
    wait_for("setpoint 61.5", 10, || src.sink.on("pt:Line1.Setpoint").iter().any(|p| p["v"] == 61.5)).await;
    // Int32 node: a whole number is converted, a fraction is not.
    assert_eq!(src.write("pt:Line1.Count", "12").await, Ok(()));
    wait_for("count 12", 10, || src.sink.on("pt:Line1.Count").iter().any(|p| p["v"] == 12)).await;
    let e = src.write("pt:Line1.Count", r#"{"v":12.5}"#).await;
    assert!(matches!(&e, Err(WriteError::NotWritable(m)) if m.contains("Int32")), "{e:?}");
    // Read-only node: the server's refusal, with its status.
    let e = src.write("pt:Line1.Serial", r#"{"v":"SN-9"}"#).await;
    assert!(matches!(&e, Err(WriteError::Refused(m)) if m == "BadUserAccessDenied" || m == "BadNotWritable"), "{e:?}");
    // A channel without a node behind it.
    let e = src.write("pt:Line1.Nothing", "1").await;
    assert!(matches!(e, Err(WriteError::NotWritable(_))), "{e:?}");
    assert_eq!(src.stats.writes_ok.load(Ordering::Relaxed), 2);
    assert_eq!(src.stats.writes_failed.load(Ordering::Relaxed), 3);
    src.shutdown().await;
}

// Regression: a notification of more than 1,000 values (every variable's first value at once)
// exceeded the client library's default array limit and dropped the connection, over and over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opcua_a_notification_of_thousands_of_values_is_taken_whole() {
    let server = OpcServer::start(free_port(), &["--points", "2500", "--hz", "1"]);
    let src = start(serde_json::json!({
        "name": "many", "url": server.url(), "browse": "Objects/Plant/Bench", "publishing_ms": 500,
    }));
    let distinct = || {
        let items = src.sink.items.lock().expect("lock");
        items.iter().map(|(c, _)| c.as_str()).collect::<std::collections::HashSet<_>>().len()
    };
    wait_for("2500 channels", 60, || distinct() == 2500).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(src.stats.reconnects.load(Ordering::Relaxed), 0);
    assert!(src.stats.connected.load(Ordering::Relaxed));
    src.shutdown().await;
}

fn refused(stats: &SourceStats, reason: &str) -> u64 {
    stats.refusals.list().iter().find(|(r, _)| *r == reason).map_or(0, |(_, n)| *n)
}

fn assert_no_null_values(sink: &VecSink) {
    let items = sink.items.lock().expect("lock");
    assert!(items.iter().all(|(_, p)| !p["v"].is_null()), "a point with v null: {items:?}");
}

// Regression: a String or ByteString value of 65,536 bytes or more failed to decode in the
// client library, which dropped the session; the server sent the value again after every
// resubscribe, so the source looped with every point bad.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opcua_a_value_too_large_for_the_node_marks_only_its_point_bad() {
    let server = OpcServer::start(free_port(), &["--blob"]);
    let src = start(serde_json::json!({
        "name": "plc", "url": server.url(), "browse": "Objects/Plant/Line1", "sampling_ms": 50, "publishing_ms": 100,
    }));
    let x = |n: usize| "x".repeat(n);
    wait_for("blobs", 20, || !src.sink.on("pt:Blob").is_empty() && !src.sink.on("pt:BlobBytes").is_empty()).await;
    assert_eq!(src.sink.on("pt:Blob")[0]["v"], x(16));
    let small_bytes = src.sink.on("pt:BlobBytes")[0]["v"].clone();

    // 60,000 bytes: the String's point fits the node's 64 KiB, the ByteString's base64 does not.
    assert_eq!(src.write("pt:BlobSize", "60000").await, Ok(()));
    wait_for("the 60,000-byte string", 20, || src.sink.on("pt:Blob").iter().any(|p| p["v"] == x(60_000))).await;
    wait_for("the byte string marked bad", 10, || src.sink.on("pt:BlobBytes").iter().any(|p| p["q"] == "bad")).await;
    assert_eq!(src.sink.on("pt:BlobBytes").last().expect("marker"), &src.sink.on("pt:BlobBytes")[1]);
    assert_eq!(src.sink.on("pt:BlobBytes")[1]["v"], small_bytes, "the marker carries the last value");
    assert_eq!(refused(&src.stats, "oversized"), 1);

    // 70,000 bytes: both refused; the String's point keeps its 60,000 bytes, marked bad.
    assert_eq!(src.write("pt:BlobSize", "70000").await, Ok(()));
    wait_for("both refused", 20, || refused(&src.stats, "oversized") == 3).await;
    wait_for("the string marked bad", 10, || src.sink.on("pt:Blob").last().is_some_and(|p| p["q"] == "bad")).await;
    assert_eq!(src.sink.on("pt:Blob").last().expect("marker")["v"], x(60_000));
    // The byte string was marked already: no second marker.
    assert_eq!(src.sink.on("pt:BlobBytes").iter().filter(|p| p["q"] == "bad").count(), 1);

    // The session stayed and the other points go on.
    let temps = src.sink.on("pt:Temp").len();
    wait_for("temperatures after the refusals", 10, || src.sink.on("pt:Temp").len() >= temps + 5).await;
    assert!(src.sink.on("pt:Temp")[temps..].iter().all(|p| p["q"] == "good"));
    assert_eq!(src.stats.reconnects.load(Ordering::Relaxed), 0);
    assert!(src.stats.connected.load(Ordering::Relaxed));
    assert_eq!(src.sink.on("pt:Mode").len(), 1, "nothing marked the other points bad");

    // A small value again: both points good.
    assert_eq!(src.write("pt:BlobSize", "20").await, Ok(()));
    wait_for("good blobs", 20, || {
        [src.sink.on("pt:Blob"), src.sink.on("pt:BlobBytes")]
            .iter()
            .all(|ps| ps.last().is_some_and(|p| p["q"] == "good"))
    })
    .await;
    assert_eq!(src.sink.on("pt:Blob").last().expect("value")["v"], x(20));
    assert_eq!(src.stats.decode_errors.load(Ordering::Relaxed), 0);
    assert_no_null_values(&src.sink);
    src.shutdown().await;
}

// A publish response larger than max_message_bytes is refused by the client library before it
// is decoded: that response is lost and counted, the session stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opcua_a_message_over_max_message_bytes_is_refused_without_dropping_the_session() {
    let server = OpcServer::start(free_port(), &["--blob"]);
    let src = start(serde_json::json!({
        "name": "plc", "url": server.url(), "browse": "Objects/Plant/Line1", "sampling_ms": 50, "publishing_ms": 100,
        "max_message_bytes": 65536,
    }));
    wait_for("blobs", 20, || !src.sink.on("pt:Blob").is_empty()).await;
    // Two values of 300,000 bytes: one response of about 700 KB, over two 64 KiB chunks.
    assert_eq!(src.write("pt:BlobSize", "300000").await, Ok(()));
    wait_for("the response refused", 20, || refused(&src.stats, "oversized") >= 1).await;
    let temps = src.sink.on("pt:Temp").len();
    wait_for("temperatures after the refusal", 10, || src.sink.on("pt:Temp").len() >= temps + 5).await;
    assert_eq!(src.stats.reconnects.load(Ordering::Relaxed), 0);
    assert!(src.stats.connected.load(Ordering::Relaxed));
    assert_eq!(src.stats.decode_errors.load(Ordering::Relaxed), 0);
    src.shutdown().await;
}

// Regression: a connection lost again before its first notification published every point as
// `{"v": null, "q": "bad"}`, overwriting its last value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opcua_a_session_lost_before_its_first_notification_keeps_the_last_values() {
    let port = free_port();
    let mut server = OpcServer::start(port, &[]);
    let src = start(serde_json::json!({
        "name": "plc", "url": server.url(), "browse": "Objects/Plant/Line1", "sampling_ms": 50, "publishing_ms": 100,
    }));
    wait_for("every point", 20, || {
        ["pt:Temp", "pt:Mode", "pt:Count", "pt:Serial"].iter().all(|c| !src.sink.on(c).is_empty())
    })
    .await;
    server.stop();
    wait_for("bad marks", 20, || src.sink.on("pt:Mode").iter().any(|p| p["q"] == "bad")).await;
    let marked = src.sink.len();

    // A server that accepts the session and the subscription but sends no value, then goes.
    let mut mute = OpcServer::start(port, &["--mute"]);
    wait_for("the reconnect", 40, || {
        src.stats.reconnects.load(Ordering::Relaxed) == 1 && src.stats.connected.load(Ordering::Relaxed)
    })
    .await;
    mute.stop();
    wait_for("the second loss", 20, || !src.stats.connected.load(Ordering::Relaxed)).await;
    // Nothing new: the points were marked bad already, with their values.
    assert_eq!(src.sink.len(), marked, "{:?}", &src.sink.items.lock().expect("lock")[marked..]);
    for channel in ["pt:Mode", "pt:Count", "pt:Serial", "pt:Temp"] {
        let last = src.sink.on(channel).last().cloned().expect("published");
        assert_eq!(last["q"], "bad", "{channel}: {last}");
    }
    assert_eq!(src.sink.on("pt:Mode").last().expect("marker")["v"], "auto");
    assert_eq!(src.sink.on("pt:Count").last().expect("marker")["v"], 7);

    // A server again: good values.
    let _server = OpcServer::start(port, &[]);
    wait_for("good values", 40, || src.sink.on("pt:Mode").last().is_some_and(|p| p["q"] == "good")).await;
    assert_no_null_values(&src.sink);
    src.shutdown().await;
}

/// A TCP relay from 127.0.0.1:`port` to a server listening on another loopback address at the
/// same port (the endpoint the server advertises, its host replaced by the client's, then leads
/// through the relay). [`Relay::cut`] closes every relayed connection and refuses new ones
/// until [`Relay::restore`]: the server goes on while the source is cut off.
struct Relay {
    port: u16,
    upstream: &'static str,
    accept: Option<tokio::task::JoinHandle<()>>,
    relayed: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Relay {
    async fn start(port: u16, upstream: &'static str) -> Relay {
        let mut relay = Relay { port, upstream, accept: None, relayed: Arc::default() };
        relay.restore().await;
        relay
    }

    async fn restore(&mut self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port)).await.expect("relay binds");
        let (upstream, port, relayed) = (self.upstream, self.port, self.relayed.clone());
        self.accept = Some(tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect((upstream, port)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                relayed.lock().expect("lock").push(task.abort_handle());
            }
        }));
    }

    fn cut(&mut self) {
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
        for task in self.relayed.lock().expect("lock").drain(..) {
            task.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opcua_a_gap_is_back_filled_from_the_server_history_as_historical_values() {
    let port = free_port();
    // Temp is historized (a value every 100 ms, with source timestamps); Running (toggled
    // every 2 s) is not.
    let _server = OpcServer::start(port, &["--host", "127.0.0.2", "--history"]);
    let mut relay = Relay::start(port, "127.0.0.2").await;
    let src = start(serde_json::json!({
        "name": "plc", "url": format!("opc.tcp://127.0.0.1:{port}/switchboard/"), "browse": "Objects/Plant/Line1",
        "sampling_ms": 50, "publishing_ms": 100,
    }));
    wait_for("temperatures", 20, || src.sink.on("pt:Temp").len() >= 5).await;
    wait_for("running", 20, || !src.sink.on("pt:Running").is_empty()).await;
    relay.cut();
    wait_for("bad marks", 20, || src.sink.on("pt:Temp").last().is_some_and(|p| p["q"] == "bad")).await;
    let before = src.sink.on("pt:Temp");
    let last_good = before.iter().rev().find(|p| p["q"] == "good").expect("a good value")["t"].as_i64().expect("t");
    tokio::time::sleep(Duration::from_secs(6)).await;
    relay.restore().await;
    wait_for("the reconnect", 40, || src.stats.reconnects.load(Ordering::Relaxed) == 1).await;
    wait_for("a live value after the reconnect", 20, || src.sink.on("pt:Temp").len() > before.len()).await;
    let first_live = src.sink.on("pt:Temp")[before.len()]["t"].as_i64().expect("t");
    wait_for("back-filled values", 20, || src.stats.backfilled.load(Ordering::Relaxed) > 0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The gap's values, historical, each at its own time strictly inside the gap, in order;
    // about one per 100 ms of the gap.
    let filled = src.sink.historical_on("pt:Temp");
    let times: Vec<i64> = filled.iter().map(|p| p["t"].as_i64().expect("t")).collect();
    assert!(
        times.iter().all(|t| (last_good + 1..first_live).contains(t)),
        "{times:?} outside ({last_good}, {first_live})"
    );
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    let gap_ms = first_live - last_good;
    assert!(gap_ms >= 6000, "gap {gap_ms} ms");
    assert!(times.len() as i64 >= gap_ms / 100 * 8 / 10, "{} values for a gap of {gap_ms} ms", times.len());
    assert!(filled.iter().all(|p| p["q"] == "good" && p["v"].as_f64().is_some_and(|v| (14.9..=25.1).contains(&v))));
    assert_eq!(src.stats.backfilled.load(Ordering::Relaxed), filled.len() as u64);
    // Live values go on as live ones; nothing historical for the variables without history,
    // whose gap stays as the bad marker left it.
    assert!(src.sink.on("pt:Temp")[before.len()..].iter().all(|p| p["q"] == "good"));
    let historical_channels: std::collections::BTreeSet<String> =
        src.sink.historical.lock().expect("lock").iter().map(|(c, _)| c.clone()).collect();
    assert_eq!(historical_channels.into_iter().collect::<Vec<_>>(), ["pt:Temp"]);
    assert!(src.sink.on("pt:Running").iter().any(|p| p["q"] == "bad"));
    src.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opcua_backfill_off_leaves_the_gap_marked() {
    let port = free_port();
    let _server = OpcServer::start(port, &["--host", "127.0.0.2", "--history"]);
    let mut relay = Relay::start(port, "127.0.0.2").await;
    let src = start(serde_json::json!({
        "name": "plc", "url": format!("opc.tcp://127.0.0.1:{port}/switchboard/"), "nodes": ["ns=2;s=Line1.Temp"],
        "sampling_ms": 50, "publishing_ms": 100, "backfill": false,
    }));
    wait_for("temperatures", 20, || src.sink.on("pt:Line1.Temp").len() >= 5).await;
    relay.cut();
    wait_for("bad marks", 20, || src.sink.on("pt:Line1.Temp").last().is_some_and(|p| p["q"] == "bad")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    relay.restore().await;
    wait_for("the reconnect", 40, || src.stats.reconnects.load(Ordering::Relaxed) == 1).await;
    let marked = src.sink.on("pt:Line1.Temp").len();
    wait_for("live values", 20, || src.sink.on("pt:Line1.Temp").len() >= marked + 5).await;
    assert!(src.sink.historical.lock().expect("lock").is_empty());
    assert_eq!(src.stats.backfilled.load(Ordering::Relaxed), 0);
    src.shutdown().await;
}

/// A self-signed certificate (DER) and key (PEM) made with openssl, for an application URI.
fn make_cert(dir: &Path, name: &str, uri: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(format!("{name}.pem"));
    let pem_cert = dir.join(format!("{name}.cert.pem"));
    let der = dir.join(format!("{name}.der"));
    let ok = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-sha256", "-subj"])
        .arg(format!("/CN={name}"))
        .arg("-addext")
        .arg(format!("subjectAltName=URI:{uri},DNS:localhost,IP:127.0.0.1"))
        .args(["-addext", "keyUsage=critical,digitalSignature,nonRepudiation,keyEncipherment,dataEncipherment"])
        .args(["-addext", "extendedKeyUsage=serverAuth,clientAuth"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&pem_cert)
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs")
        .success();
    assert!(ok, "openssl req failed");
    let ok = Command::new("openssl")
        .args(["x509", "-outform", "der", "-in"])
        .arg(&pem_cert)
        .arg("-out")
        .arg(&der)
        .status()
        .expect("openssl runs")
        .success();
    assert!(ok, "openssl x509 failed");
    (der, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opcua_basic256sha256_connects_to_a_trusted_server_only() {
    let dir = std::env::temp_dir().join(format!("sb-opcua-certs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let (server_cert, server_key) = make_cert(&dir, "server", "urn:switchboard:test-server");
    let (client_cert, client_key) = make_cert(&dir, "client", "urn:switchboard:source:secure");
    let (other_cert, _) = make_cert(&dir, "other", "urn:switchboard:other");
    let server = OpcServer::start(
        free_port(),
        &["--cert", server_cert.to_str().expect("utf-8"), "--key", server_key.to_str().expect("utf-8")],
    );
    let cfg = |trust: &Path| {
        serde_json::json!({
            "name": "secure", "url": server.url(), "security": "basic256sha256",
            "certificate": client_cert, "private_key": client_key, "trust_server": trust,
            "nodes": ["ns=2;s=Line1.Temp"],
        })
    };
    let src = start(cfg(&server_cert));
    wait_for("encrypted values", 30, || !src.sink.on("pt:Line1.Temp").is_empty()).await;
    src.shutdown().await;

    // Another certificate trusted: the server's is not, nothing connects.
    let src = start(cfg(&other_cert));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!src.stats.connected.load(Ordering::Relaxed));
    assert_eq!(src.sink.len(), 0);
    src.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// CPU seconds (user + system) a process has used so far, from /proc/<pid>/stat.
fn cpu_secs(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    // Fields after the command name (which may hold spaces) start at state; utime and stime
    // are fields 14 and 15 of the line, in clock ticks (100 per second on Linux).
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / 100.0
}

/// Counts points; keeps nothing.
#[derive(Default)]
struct CountSink {
    n: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl Sink for CountSink {
    async fn publish_batch(&self, items: Vec<Item>) -> Vec<Result<(), SinkError>> {
        self.n.fetch_add(items.len() as u64, Ordering::Relaxed);
        vec![Ok(()); items.len()]
    }
}

/// Ingest benchmark (not part of the suite): N variables changing at H Hz, spread over S
/// asyncua servers (one Python process tops out near 6,000 writes/s), each subscribed by one
/// source through browse; prints what the servers wrote, what the sources published, and the
/// CPU of this process (the sources and a counting sink) and of the servers. Bounded by
/// OPCUA_BENCH_SECS.
///
/// OPCUA_BENCH_POINTS=1000 OPCUA_BENCH_HZ=10 OPCUA_BENCH_SERVERS=2 OPCUA_BENCH_SECS=30 \
///   cargo test --release -p switchboard-sources --test opcua -- --ignored --nocapture opcua_bench
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand, see the doc comment"]
async fn opcua_bench_ingest() {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (points, hz, secs) = (env("OPCUA_BENCH_POINTS", 1000), env("OPCUA_BENCH_HZ", 10), env("OPCUA_BENCH_SECS", 30));
    let n_servers = env("OPCUA_BENCH_SERVERS", 1).max(1);
    let per_server = points / n_servers;
    let servers: Vec<OpcServer> = (0..n_servers)
        .map(|_| OpcServer::start(free_port(), &["--points", &per_server.to_string(), "--hz", &hz.to_string()]))
        .collect();
    let pids: Vec<String> = servers.iter().map(|s| s.child.id().to_string()).collect();
    let servers_cpu = || pids.iter().map(|p| cpu_secs(p)).sum::<f64>();
    let sink = Arc::new(CountSink::default());
    let stats = Arc::new(SourceStats::default());
    let (stop, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut keep_writes_open = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let cfg: OpcuaConfig = serde_json::from_value(serde_json::json!({
            "name": format!("bench{i}"), "url": server.url(), "browse": "Objects/Plant/Bench",
            "channel": format!("pt:s{i}.{{name}}"), "sampling_ms": env("OPCUA_BENCH_SAMPLING_MS", 1000 / hz.max(1) / 2), "publishing_ms": env("OPCUA_BENCH_PUBLISHING_MS", 100),
        }))
        .expect("config");
        let (writes, writes_rx) = mpsc::channel(1);
        keep_writes_open.push(writes);
        let ctx = SourceCtx {
            name: cfg.name.clone(),
            sink: sink.clone(),
            stats: stats.clone(),
            writes: writes_rx,
            stop: stop_rx.clone(),
        };
        tasks.push(tokio::spawn(opcua::run(cfg, ctx)));
    }
    let all = per_server * n_servers;
    wait_for("the first values", 60, || sink.n.load(Ordering::Relaxed) >= all).await;
    tokio::time::sleep(Duration::from_secs(3)).await; // warm-up
    let lines0: Vec<usize> = servers.iter().map(|s| s.lines.lock().expect("lock").len()).collect();
    let (n0, c0, s0, t0) = (sink.n.load(Ordering::Relaxed), cpu_secs("self"), servers_cpu(), Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (n1, c1, s1, el) = (sink.n.load(Ordering::Relaxed), cpu_secs("self"), servers_cpu(), t0.elapsed());
    // What the servers managed to write in the same window (their `wrote N in S` lines).
    let wrote: f64 = servers
        .iter()
        .zip(&lines0)
        .map(|(server, &from)| {
            let (n, s) = server.lines.lock().expect("lock")[from..]
                .iter()
                .filter_map(|l| {
                    let mut w = l.strip_prefix("wrote ")?.split(" in ");
                    Some((w.next()?.parse::<f64>().ok()?, w.next()?.parse::<f64>().ok()?))
                })
                .fold((0.0, 0.0), |(n, s), (dn, ds)| (n + dn, s + ds));
            n / s.max(1e-9)
        })
        .sum();
    let values = (n1 - n0) as f64;
    println!(
        "opcua ingest: {all} variables at {hz} Hz on {n_servers} server(s) for {:.1} s: servers wrote {wrote:.0} \
         values/s (asked {}), sources published {:.0} values/s; sources CPU {:.1} % of one core = {:.2} µs \
         per value; servers CPU {:.0} %; decode errors {}",
        el.as_secs_f64(),
        all * hz,
        values / el.as_secs_f64(),
        (c1 - c0) / el.as_secs_f64() * 100.0,
        (c1 - c0) * 1e6 / values.max(1.0),
        (s1 - s0) / el.as_secs_f64() * 100.0,
        stats.decode_errors.load(Ordering::Relaxed),
    );
    let _ = stop.send(true);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
}
