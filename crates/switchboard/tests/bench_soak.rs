//! End-to-end runs of `switchboard bench soak` at test size, with the real binary as the
//! server and as the load generator: a server that forgets abandoned channels passes, one
//! that keeps them forever fails on the channel count (exit 1), and `--redis` key counts are
//! sampled and summed. Verdicts and samples are read back from `result.json`; nothing here
//! asserts on timing.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::ExitStatus;
use std::time::Duration;

use serde_json::Value;

mod support;
use support::{Redis, Server};

/// Longest one soak may take here before it is killed and the test fails.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// The test-sized load: 50 subscribers × 10 of 50 points, 200 new room channels and 5 churn
/// connections a second, for 20 s with a baseline at 10 s and a sample every 2 s. The bound
/// on drift is the default, 10 %.
const LOAD: &[&str] = &[
    "--duration",
    "20s",
    "--warmup",
    "10s",
    "--sample",
    "2s",
    "--subs",
    "50",
    "--points",
    "50",
    "--new-channels",
    "200",
    "--churn",
    "5",
];

/// A server whose `room` channels are forgotten `ttl` seconds after their publication (0:
/// kept forever). The `sweep` namespace's 1 s keep makes the sweeper run every 0.5 s (half the
/// shortest keep), so the room count between sweeps varies by at most 0.5 s worth of new
/// channels — with rooms kept 8 s, about 6 % of the count.
fn server(room_ttl_s: &str) -> Server {
    Server::start_env(
        &[],
        &[
            ("SWITCHBOARD_NAMESPACES__ROOM__CHANNEL_TTL_S", room_ttl_s),
            ("SWITCHBOARD_NAMESPACES__SWEEP__CHANNEL_TTL_S", "1"),
        ],
    )
}

/// Runs `switchboard bench soak ARGS` against `server` ([`support::run_bench`]), which also
/// checks `soak.svg`.
fn soak(server: &Server, args: &[&str]) -> (ExitStatus, Value) {
    let args: Vec<&str> = std::iter::once("soak").chain(args.iter().copied()).collect();
    support::run_bench(server, &args, RUN_LIMIT, &["soak.svg"])
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The criterion whose check starts with `prefix`.
fn criterion<'a>(r: &'a Value, prefix: &str) -> &'a Value {
    r["criteria"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"].as_str().unwrap().starts_with(prefix))
        .unwrap_or_else(|| panic!("no criterion {prefix:?} in {:#}", r["criteria"]))
}

/// The samples' `key` figures.
fn figures(r: &Value, key: &str) -> Vec<Option<u64>> {
    r["extra"]["samples"].as_array().unwrap().iter().map(|s| s[key].as_u64()).collect()
}

#[test]
fn bench_soak_passes_when_abandoned_channels_are_forgotten() {
    let server = server("8");
    let (status, r) = soak(&server, LOAD);
    assert_eq!(r["scenario"], "soak");
    assert_eq!(r["pass"], Value::Bool(true), "{:#}", r["criteria"]);
    assert!(status.success(), "a passing run exits 0, got {status}");
    let criteria = r["criteria"].as_array().unwrap();
    assert!(criteria.iter().all(|c| c["ok"] == Value::Bool(true)));

    // Every subscriber up; every point update accepted and delivered once to each of its
    // 10 subscribers (50 × 10 subscriptions over 50 points).
    let c = &r["connections"];
    assert_eq!((u(&c["target"]), u(&c["established"]), u(&c["failed"])), (50, 50, 0), "{c}");
    let m = &r["messages"];
    assert_eq!(u(&m["expected"]), u(&m["sent"]) * 10, "{m}");
    assert_eq!((u(&m["received"]), u(&m["lost"]), u(&m["duplicated"])), (u(&m["expected"]), 0, 0), "{m}");
    let x = &r["extra"];
    assert_eq!(u(&x["publish_refused"]), 0);
    assert_eq!(u(&x["churn_failed"]), 0);
    assert_eq!(u(&x["churn_succeeded"]), u(&x["churn_target"]));
    assert_eq!(u(&x["churn_target"]), 100, "5 a second for 20 s");
    assert_eq!(u(&x["new_channels_published"]), 4000, "200 a second for 20 s");

    // Samples from 0 to 20 s; the broker's channel count is the judged figure, and after the
    // warm-up it is bounded: the rooms kept 8 s and the 50 points, not the 4,000 published.
    let samples = x["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 11, "one every 2 s from 0 to 20 s");
    assert_eq!(
        x["channel_figure"], "broker_channels",
        "the server reports switchboard_broker_channels (the memory broker's channel count)"
    );
    let broker = figures(&r, "broker_channels");
    assert!(broker.iter().all(Option::is_some), "every sample has the gauge: {broker:?}");
    assert!(figures(&r, "rss_bytes").iter().all(|v| v.is_some_and(|b| b > 0)));
    assert!(figures(&r, "hub_channels").iter().all(Option::is_some));
    let base = &x["baseline"];
    assert!(base["t_s"].as_f64().unwrap() >= 10.0, "{base}");
    let b = u(&base["broker_channels"]);
    for v in broker.iter().zip(samples).filter(|(_, s)| s["t_s"].as_f64().unwrap() >= 10.0).map(|(v, _)| v.unwrap()) {
        assert!(v.abs_diff(b) * 10 <= b, "{v} against the baseline {b}: {broker:?}");
    }
    assert!(b < 4000, "abandoned channels were forgotten: {b}");
    assert_eq!(criterion(&r, "channels the broker holds")["ok"], true);
}

#[test]
fn bench_soak_fails_when_the_server_keeps_every_channel() {
    // Room channels kept forever: every new channel stays, the count grows all run long.
    let server = server("0");
    let (status, r) = soak(&server, LOAD);
    assert_eq!(r["pass"], Value::Bool(false), "{:#}", r["criteria"]);
    assert_eq!(status.code(), Some(1), "a run that did not pass exits 1");
    let c = criterion(&r, "channels the broker holds");
    assert_eq!(c["ok"], false, "{c}");
    let observed = c["observed"].as_str().unwrap();
    assert!(observed.starts_with("baseline ") && observed.contains("farthest"), "{observed}");
    // What the samples show: growth after the warm-up, well past the bound.
    let broker: Vec<u64> = figures(&r, "broker_channels").into_iter().map(Option::unwrap).collect();
    let b = u(&r["extra"]["baseline"]["broker_channels"]);
    let last = *broker.last().unwrap();
    assert!(last > b + b / 10, "grew from {b} to {last}: {broker:?}");
    assert!(r["extra"]["channels_drift_max_pct"].as_f64().unwrap() > 10.0);
}

/// `MSET` of `n` keys on a Redis, over a plain connection (inline command).
fn fill(redis: &Redis, prefix: &str, n: usize) {
    let mut conn = TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
    let pairs: Vec<String> = (0..n).map(|i| format!("{prefix}{i} x")).collect();
    conn.write_all(format!("MSET {}\r\n", pairs.join(" ")).as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line).unwrap();
    assert_eq!(line, "+OK\r\n");
}

#[test]
fn bench_soak_samples_and_sums_the_keys_of_every_redis() {
    let (a, b) = (Redis::start(), Redis::start());
    fill(&a, "k", 3);
    fill(&b, "k", 4);
    let server = server("8");
    let urls = format!("{},{}", a.url(), b.url());
    let args = [
        "--duration",
        "6s",
        "--warmup",
        "2s",
        "--sample",
        "1s",
        "--subs",
        "5",
        "--points",
        "10",
        "--points-per-sub",
        "2",
        "--new-channels",
        "0",
        "--churn",
        "0",
        "--redis",
        &urls,
    ];
    let (_, r) = soak(&server, &args);
    let keys = figures(&r, "redis_keys");
    assert_eq!(keys.len(), 7, "one a second from 0 to 6 s");
    assert!(keys.iter().all(|k| *k == Some(7)), "3 + 4 keys in every sample: {keys:?}");
    assert_eq!(r["params"]["redis"], Value::String(urls.clone()));
    // Without churn or new channels those criteria hold trivially; nothing was lost.
    assert_eq!(u(&r["extra"]["churn_target"]), 0);
    assert_eq!(u(&r["messages"]["lost"]), 0, "{}", r["messages"]);
}
