//! End-to-end runs of the fan-out scenarios of `switchboard bench` — `rooms`, `streams`,
//! `dashboard`, `broadcast --reference` and the bytes of compressed and delta subscribers —
//! with the real binary as the server and as the
//! load generator (coordinator and worker processes), at small sizes; the verdicts are read
//! back from `result.json`.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

use std::process::ExitStatus;
use std::time::Duration;

use serde_json::Value;

mod support;
use support::Server;

/// Longest any one bench run may take here before it is killed and the test fails.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// Runs `switchboard bench <args>` against `server` ([`support::run_bench`]).
fn bench(server: &Server, args: &[&str]) -> (ExitStatus, Value) {
    support::run_bench(server, args, RUN_LIMIT, &[])
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// `pass` with every criterion listed as holding, exit code 0, and the latency fields filled.
fn assert_passed(status: ExitStatus, r: &Value) {
    assert_eq!(r["pass"], Value::Bool(true), "{:#}", r["criteria"]);
    assert!(status.success(), "a passing run exits 0, got {status}");
    let criteria = r["criteria"].as_array().unwrap();
    assert!(!criteria.is_empty() && criteria.iter().all(|c| c["ok"] == Value::Bool(true)));
    let l = &r["latency_ms"];
    for k in ["p50", "p90", "p99", "p999", "max", "mean", "stdev"] {
        assert!(l[k].as_f64().is_some_and(|v| v >= 0.0), "latency_ms.{k} = {}", l[k]);
    }
    assert!(l["p50"].as_f64() <= l["p99"].as_f64() && l["p99"].as_f64() <= l["max"].as_f64());
    assert!(r["server"]["cpu_s"].as_f64().is_some(), "--server-pid was given: {}", r["server"]);
    assert!(u(&r["server"]["rss_peak_bytes"]) > 0);
    assert!(r["throughput"]["deliveries_per_s"].as_f64().unwrap() > 0.0);
}

/// Every connection up, every expected delivery received once.
fn assert_complete(r: &Value, conns: u64, expected: u64) {
    let c = &r["connections"];
    assert_eq!((u(&c["target"]), u(&c["established"]), u(&c["failed"])), (conns, conns, 0), "{c}");
    let m = &r["messages"];
    assert_eq!(u(&m["expected"]), expected, "{m}");
    assert_eq!(u(&m["received"]), expected, "{m}");
    assert_eq!((u(&m["lost"]), u(&m["duplicated"])), (0, 0), "{m}");
}

#[test]
fn bench_rooms_reach_every_other_member_of_every_room() {
    let server = Server::start(&[]);
    let (status, r) =
        bench(&server, &["rooms", "--rooms", "5", "--members", "3", "--iterations", "5", "--pause", "0.2"]);
    assert_eq!(r["scenario"], "rooms");
    assert_passed(status, &r);
    // 5 rooms × 3 members; each of 5 iterations of each room reaches its 2 other members.
    assert_complete(&r, 15, 5 * 2 * 5);
    assert_eq!(u(&r["messages"]["sent"]), 25, "one publication per room and iteration");
    let x = &r["extra"];
    assert_eq!(u(&x["iterations_incomplete"]), 0);
    assert_eq!(x["latency_median_ms"], r["latency_ms"]["p50"]);
    assert_eq!(x["latency_mean_ms"], r["latency_ms"]["mean"]);
    assert_eq!(x["latency_stdev_ms"], r["latency_ms"]["stdev"]);
    assert_eq!(x["latency_p99_ms"], r["latency_ms"]["p99"]);
    // Four pauses of 0.2 s separate each room's five iterations.
    assert!(r["duration_s"].as_f64().unwrap() >= 0.8, "{}", r["duration_s"]);
}

#[test]
fn bench_rooms_fail_when_the_namespace_refuses_client_publish() {
    // The default namespace does not let clients publish: every publication is refused, so
    // nothing arrives and the run must say so.
    let server = Server::start(&[]);
    let (status, r) = bench(
        &server,
        &[
            "rooms",
            "--rooms",
            "2",
            "--members",
            "2",
            "--iterations",
            "2",
            "--pause",
            "0.1",
            "--prefix",
            "bench:closed.",
        ],
    );
    assert_eq!(r["pass"], Value::Bool(false));
    assert_eq!(status.code(), Some(1), "a run that did not pass exits 1");
    let m = &r["messages"];
    assert_eq!((u(&m["expected"]), u(&m["received"]), u(&m["lost"])), (4, 0, 4), "{m}");
    let errors = r["extra"]["errors"].to_string();
    assert!(errors.contains("403"), "the refusal is reported: {errors}");
}

#[test]
fn bench_streams_set_mode_delivers_every_point_to_every_user() {
    let server = Server::start(&[]);
    // 50 points in subscribe commands of 20 channels: three per user.
    let args = [
        "streams",
        "--users",
        "3",
        "--points",
        "50",
        "--hz",
        "5",
        "--duration",
        "2",
        "--mode",
        "set",
        "--subscribe-chunk",
        "20",
    ];
    let (status, r) = bench(&server, &args);
    assert_eq!(r["scenario"], "streams");
    assert_passed(status, &r);
    // 10 ticks × 50 points, each to 3 users.
    assert_complete(&r, 3, 10 * 50 * 3);
    assert_eq!(u(&r["messages"]["sent"]), 500, "every point updated at every tick");
    let x = &r["extra"];
    assert_eq!((u(&x["subscriptions"]), u(&x["ticks"]), u(&x["ticks_incomplete"])), (150, 10, 0));
    assert_eq!(x["mode"], "set");
    assert!(x["server_cpu_us_per_delivery"].as_f64().is_some());
}

/// Loss-free but late is not a pass: a bound no delivery can meet fails the run, exit 1, and
/// the criterion says why while the loss checks still hold.
#[test]
fn bench_streams_over_its_p99_bound_fails_and_says_why() {
    let server = Server::start(&[]);
    let args = ["streams", "--users", "2", "--points", "20", "--hz", "5", "--duration", "1", "--max-p99-ms", "0"];
    let args = [&args[..], &["--max-publish-late-ms", "60000"]].concat();
    let (status, r) = bench(&server, &args);
    assert_eq!(status.code(), Some(1), "{r}");
    assert_eq!(r["pass"], false);
    assert_eq!(u(&r["messages"]["lost"]), 0, "nothing lost: the failure is the timing alone");
    let failed: Vec<&Value> = r["criteria"].as_array().unwrap().iter().filter(|c| c["ok"] == false).collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["check"], "delivery p99 ≤ 0 ms");
    assert!(failed[0]["observed"].as_str().unwrap().starts_with("p99 "), "{}", failed[0]);
    assert_eq!(r["params"]["max_p99_ms"], 0.0);
}

/// `--search` runs one step per point count, doubling up to the ceiling, and reports the
/// largest passing step (what passes depends on the machine: the test checks the bookkeeping).
#[test]
fn bench_streams_search_reports_every_step_and_the_largest_passing_rate() {
    let server = Server::start(&[]);
    let args = [
        "streams",
        "--users",
        "2",
        "--points",
        "50",
        "--hz",
        "2",
        "--duration",
        "1",
        "--search",
        "--search-max",
        "200",
        "--search-refine",
        "0",
        "--max-p99-ms",
        "60000",
        "--max-publish-late-ms",
        "60000",
    ];
    let (status, r) = bench(&server, &args);
    assert_eq!(status.code(), Some(if r["pass"] == true { 0 } else { 1 }), "{r}");
    let search = &r["extra"]["search"];
    let steps = search["steps"].as_array().unwrap();
    let tried: Vec<u64> = steps.iter().map(|s| u(&s["points"])).collect();
    let passed: Vec<u64> = steps.iter().filter(|s| s["pass"] == true).map(|s| u(&s["points"])).collect();
    // Doubling from 50 while steps pass; the first failure ends it (no refinement asked).
    assert_eq!(tried[..], [50, 100, 200][..tried.len()], "{steps:?}");
    assert_eq!(passed[..], tried[..passed.len()], "passes come first: {steps:?}");
    assert_eq!(search["largest_passing_points"], passed.last().map_or(Value::Null, |&k| Value::from(k)));
    for s in steps {
        assert_eq!(s["publications_per_s"].as_f64().unwrap(), u(&s["points"]) as f64 * 2.0);
    }
    assert_eq!(r["pass"], Value::Bool(!passed.is_empty()), "the result is the largest passing step's");
}

#[test]
fn bench_streams_channels_mode_opens_one_connection_per_user_and_point() {
    let server = Server::start(&[]);
    let args = ["streams", "--users", "3", "--points", "50", "--hz", "5", "--duration", "2", "--mode", "channels"];
    let (status, r) = bench(&server, &args);
    assert_passed(status, &r);
    assert_complete(&r, 150, 10 * 50 * 3);
    assert_eq!(r["extra"]["mode"], "channels");
    assert_eq!(u(&r["extra"]["ticks_incomplete"]), 0);
}

#[test]
fn bench_dashboard_fills_every_widget_and_keeps_the_final_values() {
    let server = Server::start(&[]);
    let (status, r) = bench(&server, &["dashboard", "--widgets", "200", "--hz", "5", "--duration", "2"]);
    assert_eq!(r["scenario"], "dashboard");
    assert_passed(status, &r);
    let c = &r["connections"];
    assert_eq!((u(&c["target"]), u(&c["established"]), u(&c["failed"])), (1, 1, 0));
    let x = &r["extra"];
    assert_eq!((u(&x["widgets"]), u(&x["final_values"])), (200, 200));
    assert!(x["load_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{}", x["load_ms"]);
    // `pt:` conflates: what was not delivered must all be accounted as conflated, not lost.
    let m = &r["messages"];
    let (published, received) = (u(&m["expected"]), u(&m["received"]));
    assert_eq!(published, 10 * 200);
    assert_eq!(u(&m["sent"]), published);
    assert_eq!((u(&m["lost"]), u(&m["duplicated"])), (0, 0));
    assert!((200..=published).contains(&received), "{m}");
    assert_eq!(received + u(&x["conflated"]), published);
}

#[test]
fn bench_broadcast_reference_compares_two_transports_in_one_run_and_fails_over_its_ratio() {
    let server = Server::start(&[]);
    let run =
        ["broadcast", "--subs", "20", "--bursts", "3", "--period", "2", "--transport", "sse", "--reference", "ws"];
    let (status, r) = bench(&server, &run);
    assert_passed(status, &r);
    // The run's own figures are the SSE subscribers'; the WebSocket ones are the reference's.
    assert_complete(&r, 20, 3 * 20);
    assert_eq!((r["params"]["transport"].as_str(), r["params"]["reference"].as_str()), (Some("sse"), Some("ws")));
    let x = &r["extra"]["reference"];
    assert_eq!((x["transport"].as_str(), u(&x["subs"]), u(&x["received"])), (Some("ws"), 20, 3 * 20), "{x}");
    assert_eq!(x["windows_cut"], serde_json::json!([0, 0]), "{x}");
    let main = r["extra"]["server_cpu_us_per_delivery"].as_f64().unwrap();
    let reference = x["server_cpu_us_per_delivery"].as_f64().unwrap();
    assert!(main > 0.0 && reference > 0.0, "{x}");
    assert!((x["cost_ratio"].as_f64().unwrap() - main / reference).abs() < 1e-9, "{x}");
    assert!(r["server"]["rss_per_connection_bytes"].is_null(), "two transports share the server's memory");

    // A bound no transport meets fails the run, and the failed check names it.
    let bounded =
        [&run[..], &["--max-ratio", "0.001", "--max-p99-ms", "60000", "--max-publish-late-ms", "60000"]].concat();
    let (status, r) = bench(&server, &bounded);
    assert_eq!((status.code(), &r["pass"]), (Some(1), &Value::Bool(false)), "{:#}", r["criteria"]);
    assert_eq!(
        failed_checks(&r),
        ["a delivery costs at most 0.001× a reference (over ws) one (median of the periods)"],
        "{:#}",
        r["criteria"]
    );
}

/// The checks of `run` that did not hold.
fn failed_checks(r: &Value) -> Vec<&str> {
    r["criteria"].as_array().unwrap().iter().filter(|c| c["ok"] == false).filter_map(|c| c["check"].as_str()).collect()
}

#[test]
fn bench_broadcast_measures_the_bytes_deflate_and_deltas_save_against_plain_subscribers() {
    let server = Server::start(&[]);
    let base =
        ["broadcast", "--subs", "20", "--bursts", "4", "--period", "1", "--doc-bytes", "1024", "--reference", "ws"];
    let bytes = |x: &Value| x["wire_bytes_per_delivery"].as_f64().unwrap_or_else(|| panic!("no bytes: {x}"));

    // Deflate against plain: every subscriber negotiated it and read under half the bytes.
    let (status, r) = bench(&server, &[&base[..], &["--compression", "deflate", "--max-bytes-ratio", "0.6"]].concat());
    assert_passed(status, &r);
    assert_complete(&r, 20, 4 * 20);
    let (x, refs) = (&r["extra"], &r["extra"]["reference"]);
    assert_eq!((u(&x["subscribers_deflated"]), u(&refs["subscribers_deflated"])), (20, 0), "{x}");
    // A plain delivery of a 1 KiB document is the document and its envelope, not less.
    assert!(bytes(refs) > 1024.0, "{refs}");
    assert!(bytes(x) < 0.6 * bytes(refs), "{x}");
    assert!((refs["bytes_ratio"].as_f64().unwrap() - bytes(x) / bytes(refs)).abs() < 1e-9, "{refs}");

    // Deltas against plain: each subscriber rebuilt every publication (nothing lost), and the
    // first whole document then deltas read well under half.
    let (status, r) = bench(&server, &[&base[..], &["--delta", "fossil", "--max-bytes-ratio", "0.5"]].concat());
    assert_passed(status, &r);
    assert_complete(&r, 20, 4 * 20);
    assert_eq!(r["params"]["delta"], "fossil");
    assert!(bytes(&r["extra"]) < 0.5 * bytes(&r["extra"]["reference"]), "{}", r["extra"]);
}

#[test]
fn bench_broadcast_fails_when_the_node_declines_the_compression_it_measures() {
    let server = Server::start_env(&[], &[("SWITCHBOARD_COMPRESSION", "off")]);
    let run = ["broadcast", "--subs", "10", "--bursts", "2", "--period", "1", "--doc-bytes", "1024"];
    let (status, r) = bench(&server, &[&run[..], &["--compression", "deflate"]].concat());
    assert_eq!((status.code(), &r["pass"]), (Some(1), &Value::Bool(false)), "{:#}", r["criteria"]);
    assert_eq!(failed_checks(&r), ["every subscriber negotiated permessage-deflate"], "{:#}", r["criteria"]);
    assert_eq!(u(&r["extra"]["subscribers_deflated"]), 0);
    assert_complete(&r, 10, 2 * 10);
}
