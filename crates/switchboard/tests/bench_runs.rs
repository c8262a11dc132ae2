//! End-to-end runs of `switchboard bench`: the real binary as the server and as the load
//! generator (with its worker processes), small sizes, results read back from `result.json`.
//! One run kills the server in the middle and checks that the report shows the failure.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;
use support::{Server, TempDir, BIN};

/// A `switchboard bench` process; killed on drop if still running.
struct Bench {
    child: Child,
}

impl Bench {
    fn spawn(args: &[&str]) -> Bench {
        let child = Command::new(BIN)
            .arg("bench")
            .args(args)
            .args(support::loose_bounds(args))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start switchboard bench");
        Bench { child }
    }

    /// Waits (at most `limit`) for the exit; returns the status, stdout and stderr.
    fn wait(mut self, limit: Duration) -> (ExitStatus, String, String) {
        // Stdout may already be read elsewhere ([`lines_of`]).
        let out = self.child.stdout.take();
        let mut err = self.child.stderr.take().unwrap();
        let o = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut out) = out {
                let _ = out.read_to_string(&mut s);
            }
            s
        });
        let e = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "bench did not finish within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        };
        (status, o.join().unwrap(), e.join().unwrap())
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `switchboard bench ARGS` to completion and returns its exit code and stdout.
fn bench(args: &[&str]) -> (i32, String) {
    let (status, out, err) = Bench::spawn(args).wait(Duration::from_secs(180));
    let code = status.code().unwrap_or(-1);
    assert!(code == 0 || code == 1, "bench {args:?} exited {status}: {err}");
    (code, format!("{out}\n--- stderr ---\n{err}"))
}

fn result(dir: &Path) -> Value {
    let path = dir.join("result.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn u(v: &Value, path: &[&str]) -> u64 {
    let x = path.iter().fold(v, |v, k| &v[*k]);
    x.as_u64().unwrap_or_else(|| panic!("{path:?} is not a count: {x}"))
}

fn f(v: &Value, path: &[&str]) -> f64 {
    let x = path.iter().fold(v, |v, k| &v[*k]);
    x.as_f64().unwrap_or_else(|| panic!("{path:?} is not a number: {x}"))
}

/// The checks every passing run must satisfy: pass, all connections up, nothing lost or
/// duplicated, every criterion ok, the latency figures present and ordered, the files there.
fn assert_clean_pass(r: &Value, dir: &Path, out: &str) {
    assert_eq!(r["pass"], Value::Bool(true), "{out}\n{r:#}");
    assert!(r["criteria"].as_array().unwrap().iter().all(|c| c["ok"] == Value::Bool(true)), "{r:#}");
    assert_eq!(u(r, &["connections", "established"]), u(r, &["connections", "target"]));
    assert_eq!(u(r, &["connections", "failed"]), 0);
    assert_eq!(u(r, &["messages", "received"]), u(r, &["messages", "expected"]));
    assert_eq!(u(r, &["messages", "lost"]), 0);
    assert_eq!(u(r, &["messages", "duplicated"]), 0);
    let (p50, p99, max) = (f(r, &["latency_ms", "p50"]), f(r, &["latency_ms", "p99"]), f(r, &["latency_ms", "max"]));
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "latency {}", r["latency_ms"]);
    for file in ["result.csv", "latency.svg"] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
}

#[test]
fn bench_limit_counts_every_frame_on_every_connection() {
    let d = TempDir::new("limit");
    let out = d.join("limit");
    let (code, log) = bench(&[
        "limit",
        "--subs",
        "20",
        "--messages",
        "50",
        "--size",
        "64",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    let r = result(&out);
    assert_eq!(code, 0, "{log}");
    assert_clean_pass(&r, &out, &log);
    assert_eq!(u(&r, &["messages", "expected"]), 20 * 50);
}

#[test]
fn bench_broadcast_delivers_every_burst_to_every_subscriber() {
    let server = Server::start(&[]);
    let d = TempDir::new("broadcast");
    let out = d.join("broadcast");
    let (code, log) = bench(&[
        "broadcast",
        "--target",
        &server.ws(),
        "--subs",
        "20",
        "--period",
        "0.2",
        "--bursts",
        "5",
        "--server-pid",
        &server.pid(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    let r = result(&out);
    assert_eq!(code, 0, "{log}");
    assert_clean_pass(&r, &out, &log);
    assert_eq!((u(&r, &["connections", "target"]), u(&r, &["messages", "sent"])), (20, 5));
    assert_eq!(u(&r, &["messages", "expected"]), 100);
    let bursts = r["extra"]["bursts"].as_array().unwrap();
    assert_eq!(bursts.len(), 5);
    assert!(bursts.iter().all(|b| b["delivered"] == 20 && b["within_period"] == true), "{bursts:?}");
    // --server-pid: the server's CPU time and memory were sampled.
    assert!(f(&r, &["server", "cpu_s"]) >= 0.0 && u(&r, &["server", "rss_peak_bytes"]) > 0);
}

#[test]
fn bench_echo_switchboard_answers_every_ping() {
    let server = Server::start(&[]);
    let d = TempDir::new("echo");
    let out = d.join("echo");
    let (code, log) = bench(&[
        "echo",
        "--protocol",
        "switchboard",
        "--target",
        &server.ws(),
        "--conns",
        "10",
        "--rate",
        "10",
        "--duration",
        "1",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    let r = result(&out);
    assert_eq!(code, 0, "{log}");
    assert_clean_pass(&r, &out, &log);
    assert_eq!(u(&r, &["connections", "established"]), 10);
    // 10 connections × 10/s over at least the 1 s phase.
    assert!(u(&r, &["messages", "sent"]) >= 100, "{}", r["messages"]);
    assert_eq!(u(&r, &["messages", "sent"]), u(&r, &["messages", "received"]));
}

#[test]
fn bench_connect_storm_establishes_and_subscribes_every_connection() {
    let server = Server::start(&[]);
    let d = TempDir::new("connect");
    let out = d.join("connect");
    let (code, log) = bench(&[
        "connect",
        "--target",
        &server.ws(),
        "--conns",
        "300",
        "--rate",
        "600",
        "--procs",
        "2",
        "--server-pid",
        &server.pid(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    let r = result(&out);
    assert_eq!(code, 0, "{log}");
    assert_clean_pass(&r, &out, &log);
    assert_eq!(u(&r, &["connections", "established"]), 300);
    assert_eq!((u(&r, &["messages", "sent"]), u(&r, &["messages", "received"])), (300, 300));
    assert_eq!(u(&r, &["extra", "procs"]), 2);
    // The achieved rate cannot beat the schedule (300 connections 1/600 s apart ≈ 0.5 s).
    let rate = f(&r, &["extra", "handshakes_per_s"]);
    assert!(rate > 0.0 && rate <= 600.0 * 1.01, "handshakes/s {rate}");
    assert_eq!(f(&r, &["throughput", "deliveries_per_s"]), rate);
    assert!(f(&r, &["extra", "handshake_ms_p50"]) <= f(&r, &["latency_ms", "max"]));
    assert!(r["server"]["rss_per_connection_bytes"].as_f64().is_some(), "{}", r["server"]);
    assert!(r["extra"].get("failure_reasons").is_none());
}

#[test]
fn bench_connect_reports_refused_connections_with_their_reason() {
    // A port nobody listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let d = TempDir::new("connect-refused");
    let out = d.join("refused");
    let target = format!("ws://127.0.0.1:{port}/ws");
    let (code, log) = bench(&[
        "connect",
        "--target",
        &target,
        "--conns",
        "20",
        "--rate",
        "200",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    let r = result(&out);
    assert_eq!(code, 1, "{log}");
    assert_eq!(r["pass"], Value::Bool(false));
    assert_eq!((u(&r, &["connections", "established"]), u(&r, &["connections", "failed"])), (0, 20));
    let reasons = r["extra"]["failure_reasons"].as_object().unwrap();
    assert_eq!(reasons.values().map(|v| v.as_u64().unwrap()).sum::<u64>(), 20, "{reasons:?}");
    assert!(reasons.keys().all(|k| k.starts_with("handshake:")), "{reasons:?}");
    assert!(log.contains("failed: 20 × handshake:"), "{log}");
}

#[test]
fn bench_sessions_starts_its_own_servers_and_fills_the_table() {
    let d = TempDir::new("sessions");
    let out = d.join("sessions");
    let (code, log) = bench(&[
        "sessions",
        "--sessions",
        "1,10",
        "--workers",
        "1,2",
        "--duration",
        "1",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    let r = result(&out);
    assert_eq!(code, 0, "{log}");
    assert_clean_pass(&r, &out, &log);
    assert_eq!(u(&r, &["connections", "target"]), 2 * (1 + 10));
    let cells = r["extra"]["cells"].as_array().unwrap();
    let coords: Vec<(u64, u64)> = cells.iter().map(|c| (u(c, &["workers"]), u(c, &["sessions"]))).collect();
    assert_eq!(coords, [(1, 1), (1, 10), (2, 1), (2, 10)]);
    let mut received = 0;
    for c in cells {
        assert_eq!(u(c, &["established"]), u(c, &["sessions"]), "{c}");
        assert!(u(c, &["received"]) > 0 && u(c, &["received"]) == u(c, &["sent"]), "{c}");
        assert!(f(c, &["exchanges_per_s"]) > 0.0, "{c}");
        assert!(c["rss_baseline_bytes"].as_u64().unwrap() > 0, "{c}");
        received += u(c, &["received"]);
    }
    assert_eq!(u(&r, &["messages", "received"]), received, "the totals are the sum of the cells");
    assert_eq!(f(&r, &["extra", "table", "w2", "s10", "exchanges_per_s"]), f(&cells[3], &["exchanges_per_s"]));
    let csv = std::fs::read_to_string(out.join("result.csv")).unwrap();
    assert!(csv.lines().next().unwrap().contains("extra.table.w2.s10.exchanges_per_s"), "{csv}");
    assert_eq!(std::fs::read_to_string(out.join("sessions.csv")).unwrap().lines().count(), 5);
    for file in ["sessions.svg", "sessions-rss.svg", "server-w1.log", "server-w2.log"] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    // Both servers it started are gone (stopped and reaped).
    let pids: Vec<&str> =
        log.lines().filter_map(|l| l.split(": pid ").nth(1)).map(|p| p.split(',').next().unwrap()).collect();
    assert_eq!(pids.len(), 2, "{log}");
    for pid in pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "server {pid} still running");
    }
    assert!(log.contains("exchanges per second and server RSS per session"), "{log}");
}

#[test]
fn bench_report_compares_two_result_folders() {
    let server = Server::start(&[]);
    let d = TempDir::new("report");
    let (echo, connect) = (d.join("echo"), d.join("connect"));
    let ws = server.ws();
    let (c1, l1) = bench(&[
        "echo",
        "--target",
        &ws,
        "--conns",
        "5",
        "--rate",
        "5",
        "--duration",
        "1",
        "--out",
        echo.to_str().unwrap(),
        "--quiet",
    ]);
    let (c2, l2) = bench(&[
        "connect",
        "--target",
        &ws,
        "--conns",
        "50",
        "--rate",
        "200",
        "--out",
        connect.to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!((c1, c2), (0, 0), "{l1}\n{l2}");
    let html_path = d.join("cmp/report.html");
    let (code, log) =
        bench(&["report", echo.to_str().unwrap(), connect.to_str().unwrap(), "--out", html_path.to_str().unwrap()]);
    assert_eq!(code, 0, "{log}");
    assert!(log.starts_with(html_path.to_str().unwrap()), "prints the path: {log}");
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    for s in ["echo", "connect", "PASS", "p99.9", "deliveries/s", "every connection established"] {
        assert!(html.contains(s), "{s} missing");
    }
    // Each folder's figures, from its own result.json.
    let (re, rc) = (result(&echo), result(&connect));
    for r in [&re, &rc] {
        let expected = u(r, &["messages", "expected"]).to_string();
        assert!(html.contains(&format!("<td class=\"\">{expected}</td>")), "expected count {expected}");
    }
    // Both folders' latency charts are embedded; nothing is linked.
    assert_eq!(html.matches("data:image/svg+xml;base64,").count(), 2);
    assert!(!html.contains("src=\"latency.svg\""));
}

/// Reads the bench's stdout lines on a thread, so the test can wait for a given one. Keep the
/// receiver until the process has exited: the thread must drain the pipe to the end.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

#[test]
fn bench_broadcast_reports_the_loss_when_the_server_is_killed_mid_run() {
    let mut server = Server::start(&[]);
    let d = TempDir::new("killed");
    let out = d.join("killed");
    // 50 bursts every 0.2 s; the server is killed a few bursts in. Not --quiet: the progress
    // lines tell when publishing has begun.
    let mut run = Bench::spawn(&[
        "broadcast",
        "--target",
        &server.ws(),
        "--subs",
        "20",
        "--period",
        "0.2",
        "--bursts",
        "50",
        "--out",
        out.to_str().unwrap(),
    ]);
    let lines = lines_of(&mut run.child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let line = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())).unwrap_or_else(|_| {
            panic!("no publishing progress line within 60 s: {seen:#?}");
        });
        seen.push(line.clone());
        if line.contains("publishing") {
            break;
        }
    }
    // SIGKILL by PID: no goodbye to the subscribers, no reply to the publish in flight.
    let status = Command::new("kill").args(["-KILL", &server.pid()]).status().unwrap();
    assert!(status.success());
    let _ = server.child.wait();
    let (status, _, err) = run.wait(Duration::from_secs(120));
    seen.extend(lines.try_iter());
    let r = result(&out);
    assert_eq!(status.code(), Some(1), "the run must fail: {err}\n{}\n{r:#}", seen.join("\n"));
    assert_eq!(r["pass"], Value::Bool(false));
    let failed_checks: Vec<&str> = r["criteria"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == Value::Bool(false))
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    // Every subscriber lost its connection, the remaining publishes were refused, and the
    // bursts after the kill never reached anyone: all of it is in the report.
    assert_eq!(u(&r, &["extra", "dropped"]), 20, "{r:#}");
    for check in [
        "no connection dropped during the run",
        "no message lost",
        "every publish accepted",
        "every burst reached every subscriber within the period",
    ] {
        assert!(failed_checks.contains(&check), "{check} should have failed: {failed_checks:?}");
    }
    assert!(u(&r, &["extra", "bursts_late_or_incomplete"]) > 0);
    assert!(!r["extra"]["publish_errors"].as_array().unwrap().is_empty(), "{r:#}");
    // Every attempted burst was expected at all 20 subscribers; what did not arrive is lost.
    let (sent, expected) = (u(&r, &["messages", "sent"]), u(&r, &["messages", "expected"]));
    let (received, lost) = (u(&r, &["messages", "received"]), u(&r, &["messages", "lost"]));
    assert_eq!(expected, sent * 20, "{}", r["messages"]);
    assert!(lost > 0, "{}", r["messages"]);
    assert_eq!(received + lost, expected, "{}", r["messages"]);
}
