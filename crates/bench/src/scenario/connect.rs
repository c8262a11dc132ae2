//! `connect`: a connection storm. N connections open at R per second, each doing the
//! WebSocket handshake and a first `subscribe`, and stay open until the run ends.
//!
//! Connection `g` (0-based, over all workers) is due at `start + g / R`. Its latency is
//! measured from that *scheduled* time to the subscribe reply, so an accept queue that stalls
//! (or a load generator that falls behind) shows up as latency rather than as a lower rate
//! with good-looking numbers. Connections are dealt to worker processes round-robin (worker
//! `w` of `P` opens `w`, `w + P`, …), so every process opens its share at `R / P` per second
//! all through the storm; above 20,000 connections they spread over 127.0.0.x source
//! addresses like every scenario.
//!
//! Reported: handshakes per second achieved (established connections over the time from the
//! first scheduled start to the last subscribe reply), the handshake + subscribe latency
//! percentiles (`latency_ms`) and the handshake alone (`extra.handshake_ms_*`), and failures
//! counted by reason (`extra.failure_reasons`). After the storm every connection is held for
//! `--duration` seconds (default 1), and one that ends in that time counts as dropped. The
//! run passes only if every connection was established and stayed up.
//!
//! In `messages`, `sent` counts subscribe commands, `received` their replies (ok or error),
//! and `lost` the subscribes that got no reply at all.

use std::rc::Rc;
use std::time::Duration;

use anyhow::bail;
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use switchboard_client::connect::handshake;
use switchboard_protocol::Format;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::accounting::MessageCounts;
use crate::common::{instant_of, source_addr, unix_micros, CommonArgs, WireFormat};
use crate::probe::{CpuSample, ProcessProbe};
use crate::progress::{Progress, Rate};
use crate::report::{rss_per_connection, standard_criteria, BenchResult, Connections, Criterion};
use crate::scenario::broadcast::subscribe_reply;
use crate::scenario::{coordinator_runtime, WorkerConfig};
use crate::worker::{Pool, WorkerCtx};

/// `switchboard bench connect`
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// Connections to open.
    #[arg(long, default_value_t = 1000)]
    pub conns: usize,
    /// Connections started per second, over all worker processes.
    #[arg(long, default_value_t = 500.0)]
    pub rate: f64,
    /// Channel every connection subscribes to.
    #[arg(long, default_value = "bench:connect")]
    pub channel: String,
    /// Wire format (offered subprotocol).
    #[arg(long, value_enum, default_value = "json")]
    pub format: WireFormat,
    /// Seconds a connection may take, from its scheduled start to the subscribe reply.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Token for the handshakes (`Authorization: Bearer`).
    #[arg(long)]
    pub token: Option<String>,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// A connect worker's share: the global connections `worker`, `worker + stride`, …
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnectWorker {
    pub target: String,
    pub channel: String,
    /// Connections this worker opens.
    pub conns: usize,
    /// This worker's index, the first global connection it opens.
    pub worker: usize,
    /// Number of workers: the distance between its connections' global indexes.
    pub stride: usize,
    pub spread: bool,
    /// Connections per second over all workers.
    pub rate: f64,
    /// When connection 0 is due, unix µs.
    pub start_us: u64,
    pub timeout_ms: u64,
    pub format: WireFormat,
}

/// When global connection `g` is due: `start + g / rate`.
pub fn due_us(start_us: u64, rate: f64, g: usize) -> u64 {
    start_us + (g as f64 * 1e6 / rate) as u64
}

/// Deals `total` connections round-robin to `procs` workers: `(worker, count)` for each worker
/// that gets any. Worker `w` opens `w, w + procs, …`.
pub fn deal(total: usize, procs: usize) -> Vec<(usize, usize)> {
    let procs = procs.max(1);
    (0..procs.min(total)).map(|w| (w, (total - w).div_ceil(procs))).collect()
}

/// Handshakes per second achieved: `established` connections between the first scheduled
/// start and the last subscribe reply. `None` before any connection completed.
pub fn achieved_rate(established: u64, start_us: u64, last_done_us: u64) -> Option<f64> {
    if established == 0 || last_done_us <= start_us {
        return None;
    }
    Some(established as f64 * 1e6 / (last_done_us - start_us) as f64)
}

// ---------------------------------------------------------------------------------------------
// Worker.

pub async fn run_worker(cfg: ConnectWorker, ctx: Rc<WorkerCtx>) {
    let format = cfg.format.format();
    let subscribe = json!({"id": 1, "subscribe": {"channels": [cfg.channel]}});
    let subscribe = match format {
        Format::Json => Message::text(subscribe.to_string()),
        Format::Msgpack => Message::binary(rmp_serde::to_vec_named(&subscribe).unwrap_or_default()),
    };
    let cfg = Rc::new(cfg);
    let token = crate::worker::token();
    for i in 0..cfg.conns {
        tokio::task::spawn_local(connection(i, cfg.clone(), token.clone(), ctx.clone(), subscribe.clone()));
    }
    ctx.wait_stop().await;
}

/// Counts one failed connection under `reason`.
fn fail(ctx: &WorkerCtx, reason: String) {
    ctx.failed_for(&reason);
}

async fn connection(i: usize, cfg: Rc<ConnectWorker>, token: Option<String>, ctx: Rc<WorkerCtx>, subscribe: Message) {
    let g = cfg.worker + i * cfg.stride;
    let due = due_us(cfg.start_us, cfg.rate, g);
    tokio::time::sleep_until(instant_of(due)).await;
    // The whole attempt must finish within the timeout counted from the scheduled start.
    let deadline = instant_of(due + cfg.timeout_ms * 1000);
    let format = cfg.format.format();
    let mut opts = crate::common::connect_options(format);
    opts.bind = source_addr(g, cfg.spread);
    opts.credentials = token.map(switchboard_client::Credentials::Bearer);
    opts.timeout = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let mut ws = match handshake(&cfg.target, &opts).await {
        Ok(ws) => ws,
        Err(e) => return fail(&ctx, format!("handshake: {e}")),
    };
    let handshake_us = unix_micros().saturating_sub(due);
    if let Err(e) = ws.send(subscribe).await {
        return fail(&ctx, format!("subscribe: send: {e}"));
    }
    ctx.tally.borrow_mut().sent += 1;
    let reply = tokio::time::timeout_at(deadline, subscribe_reply(&mut ws, format, &cfg.channel)).await;
    let done = unix_micros();
    match reply {
        Ok(Ok(_)) => {
            let mut t = ctx.tally.borrow_mut();
            t.received += 1;
            t.last_arrival_us = t.last_arrival_us.max(done);
        }
        Ok(Err(e)) => {
            // An error reply is an answer; a connection closed before replying is not.
            if e.starts_with("subscribe") {
                ctx.tally.borrow_mut().received += 1;
            }
            return fail(&ctx, e);
        }
        Err(_) => return fail(&ctx, "subscribe: no reply within the timeout".into()),
    }
    ctx.latency.borrow_mut().record(done.saturating_sub(due));
    ctx.established(handshake_us);

    // Hold the connection until the run ends; the reads answer the server's pings.
    loop {
        tokio::select! {
            msg = ws.next() => match msg {
                Some(Ok(Message::Close(f))) => {
                    let code = f.as_ref().map(|f| u16::from(f.code)).unwrap_or(1005);
                    return ctx.dropped(&format!("closed by the server with code {code}"));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return ctx.dropped(&format!("read: {e}")),
                None => return ctx.dropped("connection ended"),
            },
            _ = ctx.wait_stop() => return,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Coordinator.

pub fn run(args: ConnectArgs) -> anyhow::Result<i32> {
    if args.conns == 0 || args.rate <= 0.0 || args.timeout <= 0.0 {
        bail!("--conns, --rate and --timeout must be positive");
    }
    coordinator_runtime()?.block_on(coordinate(args))
}

async fn coordinate(args: ConnectArgs) -> anyhow::Result<i32> {
    let started = unix_micros();
    let out = args.common.out_dir("connect");
    let mut progress = Progress::new(args.common.quiet);
    let n = args.conns;
    let hold = args.common.duration.unwrap_or(1.0).max(0.0);
    let probe = args.common.server_pid.map(ProcessProbe::new);
    let mem_before = probe.and_then(|p| p.memory().ok());
    let cpu0 = probe.and_then(|p| p.cpu_sample().ok());

    let procs = args.common.procs_for(n);
    let spread = args.common.spread_sources(n);
    // Give the worker processes a moment to start before connection 0 is due.
    let start_us = unix_micros() + 1_500_000;
    let schedule_s = (n - 1) as f64 / args.rate;
    let timeout_ms = (args.timeout * 1000.0) as u64;
    let configs: Vec<WorkerConfig> = deal(n, procs)
        .into_iter()
        .map(|(w, count)| {
            WorkerConfig::Connect(ConnectWorker {
                target: args.common.target.clone(),
                channel: args.channel.clone(),
                conns: count,
                worker: w,
                stride: procs,
                spread,
                rate: args.rate,
                start_us,
                timeout_ms,
                format: args.format,
            })
        })
        .collect();
    progress.note(&format!(
        "connect: {n} connections at {} /s over {} worker processes (storm of {schedule_s:.1} s), subscribing to {}",
        args.rate,
        configs.len(),
        args.channel
    ));
    let mut pool = Pool::spawn(&configs, args.token.as_deref())?;
    let mut rate = Rate::default();
    let mut status = move |p: &Pool| {
        let t = p.totals();
        format!(
            "connected {}/{n} ({} failed, {} dropped, {:.0}/s)",
            t.established,
            t.failed,
            t.dropped,
            rate.per_s(t.established + t.failed)
        )
    };
    let storm_end = instant_of(start_us + (schedule_s * 1e6) as u64);
    let deadline = storm_end + Duration::from_millis(timeout_ms) + Duration::from_secs(10);
    pool.run_until(deadline, &mut progress, &mut status, Pool::all_ready).await;
    let mem_connected = probe.and_then(|p| p.memory().ok());
    let established_at_storm = pool.totals().established;
    pool.run_until(Instant::now() + Duration::from_secs_f64(hold), &mut progress, &mut status, |_| false).await;
    let cpu1 = probe.and_then(|p| p.cpu_sample().ok());
    let mem_end = probe.and_then(|p| p.memory().ok());
    let merged = pool.finish(Duration::from_secs(30), &mut progress).await?;
    let t = &merged.tally;

    let connections = Connections::settled(n as u64, t.established, t.failed);
    let messages = MessageCounts::from_tally(t.sent, t.sent, t);
    let achieved = achieved_rate(t.established, start_us, t.last_arrival_us);
    let storm_s = t.last_arrival_us.saturating_sub(start_us) as f64 / 1e6;
    let cpu_s = CpuSample::between(&cpu0, &cpu1);
    let mut criteria = standard_criteria(&connections, t.dropped, &messages);
    criteria.push(Criterion::workers_reported(merged.missing));
    let hs = merged.connect.summary();
    let mut extra = Map::new();
    extra.insert("rate_target_per_s".into(), json!(args.rate));
    extra.insert("handshakes_per_s".into(), json!(achieved));
    extra.insert("storm_s".into(), json!(storm_s));
    extra.insert("hold_s".into(), json!(hold));
    extra.insert("handshake_ms_p50".into(), json!(hs.p50));
    extra.insert("handshake_ms_p99".into(), json!(hs.p99));
    extra.insert("handshake_ms_max".into(), json!(hs.max));
    extra.insert("dropped".into(), json!(t.dropped));
    extra.insert(
        "server_cpu_us_per_connection".into(),
        json!(cpu_s.filter(|_| t.established > 0).map(|c| c * 1e6 / t.established as f64)),
    );
    if !t.failure_reasons.is_empty() {
        extra.insert("failure_reasons".into(), serde_json::to_value(&t.failure_reasons).unwrap_or(Value::Null));
    }
    let (before, connected) = (mem_before.map(|m| m.rss), mem_connected.map(|m| m.rss));
    let params = json!({
        "conns": n, "rate": args.rate, "channel": args.channel, "format": args.format,
        "timeout_s": args.timeout, "hold_s": hold, "procs": configs.len(), "target": args.common.target,
    });
    let result = BenchResult::builder("connect", params, started)
        .measured(storm_s, connections, messages, achieved.unwrap_or(0.0))
        .latency(merged.latency.summary())
        .server(cpu_s, mem_end.map(|m| m.hwm))
        .rss_sampled(before, connected)
        .rss_per_connection(rss_per_connection(before, connected, established_at_storm))
        .procs(configs.len())
        .load_generator_rss(merged.rss_peak_bytes)
        .errors(&t.errors)
        .criteria(criteria)
        .extra(extra);
    for (reason, count) in &t.failure_reasons {
        progress.note(&format!("failed: {count} × {reason}"));
    }
    result.conclude(&merged.latency, &out, &mut progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    #[test]
    fn connect_schedule_spreads_the_rate_over_workers() {
        // 10 connections at 4/s: connection g is due g × 250 ms after the start.
        assert_eq!(due_us(1_000, 4.0, 0), 1_000);
        assert_eq!(due_us(1_000, 4.0, 9), 1_000 + 2_250_000);
        assert_eq!(due_us(0, 3.0, 1), 333_333);
        // Dealt round-robin: every index exactly once, each worker's due times R/P apart.
        let dealt = deal(10, 3);
        assert_eq!(dealt, vec![(0, 4), (1, 3), (2, 3)]);
        let mut all: Vec<usize> = dealt.iter().flat_map(|&(w, c)| (0..c).map(move |i| w + i * 3)).collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert_eq!(deal(2, 4), vec![(0, 1), (1, 1)]);
        assert_eq!(deal(5, 0), vec![(0, 5)]);
        // The achieved rate counts from the first scheduled start to the last reply.
        assert_eq!(achieved_rate(100, 1_000_000, 3_000_000), Some(50.0));
        assert_eq!(achieved_rate(0, 1_000_000, 3_000_000), None);
        assert_eq!(achieved_rate(5, 1_000_000, 1_000_000), None);
    }

    fn worker(target: String, conns: usize, rate: f64) -> ConnectWorker {
        ConnectWorker {
            target,
            channel: "c".into(),
            conns,
            worker: 0,
            stride: 1,
            spread: false,
            rate,
            start_us: unix_micros(),
            timeout_ms: 2_000,
            format: WireFormat::Json,
        }
    }

    /// Runs a worker against a scripted server answering every command with `reply` (or
    /// against `url` when given), until every connection is settled (bounded), then stops it.
    fn settle(
        conns: usize,
        url: Option<String>,
        reply: Value,
        tweak: impl FnOnce(&mut ConnectWorker) + 'static,
    ) -> Rc<WorkerCtx> {
        testutil::local(async move {
            let url = match url {
                Some(u) => u,
                None => testutil::serve(move |_| vec![Message::text(reply.to_string())]).await,
            };
            let mut cfg = worker(url, conns, 1000.0);
            tweak(&mut cfg);
            let ctx = WorkerCtx::new(conns as u64);
            let watcher = ctx.clone();
            tokio::task::spawn_local(async move {
                for _ in 0..500 {
                    let s = watcher.snapshot();
                    if s.established + s.failed >= conns as u64 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                watcher.stop();
            });
            run_worker(cfg, ctx.clone()).await;
            ctx
        })
    }

    #[test]
    fn connect_worker_measures_from_the_scheduled_start() {
        let ok = json!({"id": 1, "ok": {"channels": {"c": {"epoch": "e", "offset": 0}}}});
        // 4 connections at 20/s scheduled from 200 ms ago: all are overdue when the worker
        // starts, the least by 50 ms, and their latency must say so.
        let ctx = settle(4, None, ok, |c| {
            c.rate = 20.0;
            c.start_us = unix_micros() - 200_000;
        });
        let t = ctx.tally.borrow();
        assert_eq!((t.established, t.failed, t.sent, t.received, t.dropped), (4, 0, 4, 4, 0), "{:?}", t.errors);
        let lat = ctx.latency.borrow();
        assert_eq!(lat.count(), 4);
        assert!(lat.value_at(0.0) >= 50_000, "min latency {} µs", lat.value_at(0.0));
        assert!(lat.max_us() >= 200_000, "max latency {} µs", lat.max_us());
        assert_eq!(ctx.connect.borrow().count(), 4);
    }

    #[test]
    fn connect_worker_counts_failures_by_reason() {
        // Nothing listens on this port (bound, then closed): every handshake is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let ctx = settle(3, Some(format!("ws://127.0.0.1:{port}/ws")), Value::Null, |_| {});
        let t = ctx.tally.borrow();
        assert_eq!((t.established, t.failed, t.sent), (0, 3, 0));
        assert_eq!(t.failure_reasons.values().sum::<u64>(), 3);
        assert!(t.failure_reasons.keys().all(|k| k.starts_with("handshake: ")), "{:?}", t.failure_reasons);
    }

    #[test]
    fn connect_worker_counts_an_error_reply_as_answered_but_failed() {
        let err = json!({"id": 1, "error": {"code": 429, "message": "too many"}});
        let ctx = settle(2, None, err, |_| {});
        let t = ctx.tally.borrow();
        assert_eq!((t.established, t.failed, t.sent, t.received), (0, 2, 2, 2));
        let m = MessageCounts::from_tally(t.sent, t.sent, &t);
        assert_eq!(m.lost, 0, "an error reply is not a lost reply");
        assert_eq!(t.failure_reasons.get("subscribe: error 429: too many"), Some(&2), "{:?}", t.failure_reasons);
    }
}
