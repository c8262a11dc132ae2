//! `sessions`: sessions × server worker threads, after the DNP3 scalability experiment (how
//! throughput and memory per session change with concurrency and parallelism).
//!
//! For each `--workers W` the tool starts a server itself (`--server-bin`, default this
//! executable: `serve --listen 127.0.0.1:0 --workers W`, plus any `--server-arg`), reads its
//! `switchboard listening on http://ADDR` line, and for each `--sessions S` (ascending) runs
//! one cell: S sessions connect and subscribe to a channel of their own, then each runs a
//! closed loop of request/response exchanges for `--duration` seconds (default 3):
//!
//! - `--exchange publish` (default): the session publishes `{"t": µs}` to its own
//!   `room:` channel and waits for both the publish reply and the publication coming back
//!   through the broker — the push-gateway analogue of DNP3's unsolicited response confirmed
//!   by the master. Deliveries are counted by offset, so loss and duplicates are caught.
//! - `--exchange ping`: the `ping` command and its reply; no broker involved.
//!
//! Figures per cell: exchanges per second over all sessions (each is one request and its
//! response), the round-trip percentiles, the server's CPU time, and its RSS per session:
//! `(RSS while the cell runs − RSS of the fresh server) / S`, sampled halfway through the
//! exchange phase (like DNP3's peak heap under load; with `publish` it includes the history
//! each channel keeps). The baseline is taken once per server, right after it starts, so
//! memory that earlier, smaller cells left allocated is not subtracted from later ones.
//! The server is stopped (SIGTERM to its PID, SIGKILL after 5 s) after its last cell.
//!
//! The table (sessions × workers) is printed, stored in `result.json` under `extra.cells` (a
//! list) and `extra.table` (`w<W>.s<S>` keys, which `result.csv` flattens into columns),
//! written as `sessions.csv`, and charted in `sessions.svg` (exchanges/s) and
//! `sessions-rss.svg` (RSS per session). The top-level `throughput` is the best cell;
//! `server.rss_per_connection_bytes` is the largest session count at the first worker count.
//! `--target` and `--server-pid` are not used: the servers are the tool's own.
//!
//! Here: the flags, the worker half (the sessions' exchange loops) and the coordinator;
//! `cells` holds the table and its forms, `server` the servers the tool starts.

use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use anyhow::{bail, Context};
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use switchboard_client::connect::handshake;
use switchboard_client::frame::for_each_message;
use switchboard_protocol::Format;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::accounting::{Delivery, MessageCounts, OffsetSet, Tally};
use crate::common::{instant_of, source_addr, split, unix_micros, CommonArgs, WireFormat};
use crate::histogram::Latency;
use crate::probe::{CpuSample, Memory, ProcessProbe};
use crate::progress::{Progress, Rate};
use crate::report::{standard_criteria, BenchResult, Connections, Criterion};
use crate::scenario::broadcast::subscribe_reply;
use crate::scenario::{coordinator_runtime, WorkerConfig};
use crate::worker::{Pool, WorkerCtx};

mod cells;
mod server;

pub use cells::Cell;
use cells::{cells_csv, charts, fmt_bytes, matrix, table_object, Samples};
use server::ServerProc;

/// Handshakes in flight per worker process while a cell connects.
const CONCURRENCY: usize = 200;
/// How long a session waits for the response to its last request after the phase ends.
const DRAIN_MS: u64 = 2_000;

/// What one exchange is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Exchange {
    /// Publish to the session's own channel; wait for the reply and the publication.
    Publish,
    /// The `ping` command and its reply.
    Ping,
}

/// `switchboard bench sessions`
#[derive(Debug, Clone, clap::Args)]
pub struct SessionsArgs {
    /// Session counts, comma-separated (run in ascending order).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    pub sessions: Vec<usize>,
    /// Server worker-thread counts, comma-separated; a server is started for each.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub workers: Vec<usize>,
    /// What each session exchanges with the server.
    #[arg(long, value_enum, default_value = "publish")]
    pub exchange: Exchange,
    /// Wire format of the sessions.
    #[arg(long, value_enum, default_value = "json")]
    pub format: WireFormat,
    /// Server executable [default: this executable].
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    /// Extra argument for every server started, after `serve --listen 127.0.0.1:0 --workers W`
    /// (repeat for several, e.g. `--server-arg=--max-connections --server-arg=5000`).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// A sessions worker's share of one cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionsWorker {
    pub target: String,
    pub conns: usize,
    pub first_index: usize,
    pub spread: bool,
    pub exchange: Exchange,
    pub format: WireFormat,
    /// Session `g` uses channel `<prefix><g>`.
    pub prefix: String,
    /// When the exchanges start and stop, unix µs.
    pub start_us: u64,
    pub until_us: u64,
    pub drain_ms: u64,
}

// ---------------------------------------------------------------------------------------------
// Worker.

/// What a session needs from a server message.
#[derive(Deserialize)]
struct Incoming {
    #[serde(default)]
    id: Option<u32>,
    #[serde(default)]
    ok: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    error: Option<ErrorIn>,
    #[serde(default, rename = "pub")]
    publication: Option<PubIn>,
}

#[derive(Deserialize)]
struct ErrorIn {
    code: u16,
    message: String,
}

#[derive(Deserialize)]
struct PubIn {
    off: u64,
}

fn encode(format: Format, v: &Value) -> Message {
    match format {
        Format::Json => Message::text(v.to_string()),
        Format::Msgpack => Message::binary(rmp_serde::to_vec_named(v).unwrap_or_default()),
    }
}

pub async fn run_worker(cfg: SessionsWorker, ctx: Rc<WorkerCtx>) {
    let cfg = Rc::new(cfg);
    let sem = Rc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let tasks: Vec<_> =
        (0..cfg.conns).map(|i| tokio::task::spawn_local(session(i, cfg.clone(), ctx.clone(), sem.clone()))).collect();
    tokio::select! {
        _ = futures_util::future::join_all(tasks) => {}
        _ = ctx.wait_stop() => {}
    }
}

async fn session(i: usize, cfg: Rc<SessionsWorker>, ctx: Rc<WorkerCtx>, sem: Rc<tokio::sync::Semaphore>) {
    let g = cfg.first_index + i;
    let channel = format!("{}{g}", cfg.prefix);
    let format = cfg.format.format();
    let permit = sem.acquire().await;
    let t0 = Instant::now();
    let mut opts = crate::common::connect_options(format);
    opts.bind = source_addr(g, cfg.spread);
    opts.credentials = crate::worker::token().map(switchboard_client::Credentials::Bearer);
    opts.timeout = Duration::from_secs(30);
    let mut ws = match handshake(&cfg.target, &opts).await {
        Ok(ws) => ws,
        Err(e) => return ctx.failed(&format!("connect: {e}")),
    };
    if let Err(e) = ws.send(encode(format, &json!({"id": 1, "subscribe": {"channels": [channel]}}))).await {
        return ctx.failed(&format!("subscribe: {e}"));
    }
    let base = match tokio::time::timeout(Duration::from_secs(30), subscribe_reply(&mut ws, format, &channel)).await {
        Ok(Ok(off)) => off,
        Ok(Err(e)) => return ctx.failed(&e),
        Err(_) => return ctx.failed("subscribe: no reply within 30 s"),
    };
    drop(permit);
    ctx.established(t0.elapsed().as_micros() as u64);

    tokio::select! {
        _ = tokio::time::sleep_until(instant_of(cfg.start_us)) => {}
        _ = ctx.wait_stop() => return,
    }
    let end = instant_of(cfg.until_us);
    let drain_end = instant_of(cfg.until_us + cfg.drain_ms * 1000);
    let mut seen = OffsetSet::new(base);
    let mut id: u32 = 1;
    while Instant::now() < end {
        id = id.wrapping_add(1).max(2);
        let t = unix_micros();
        let cmd = match cfg.exchange {
            Exchange::Publish => json!({"id": id, "publish": {"channel": channel, "data": {"t": t}}}),
            Exchange::Ping => json!({"id": id, "ping": {"data": {"t": t}}}),
        };
        if let Err(e) = ws.send(encode(format, &cmd)).await {
            return ctx.dropped(&format!("send: {e}"));
        }
        ctx.tally.borrow_mut().sent += 1;
        // The round is done when the reply is in and, for `publish`, the publication too.
        let mut replied = false;
        let mut delivered = cfg.exchange == Exchange::Ping;
        let mut refused = false;
        while !(refused || replied && delivered) {
            let msg = tokio::select! {
                m = ws.next() => m,
                _ = tokio::time::sleep_until(drain_end) => {
                    ctx.tally.borrow_mut().note_error("no response within the drain time after the phase");
                    return;
                }
                _ = ctx.wait_stop() => return,
            };
            let (fmt, payload): (Format, &[u8]) = match &msg {
                Some(Ok(Message::Text(t))) => (Format::Json, t.as_bytes()),
                Some(Ok(Message::Binary(b))) => (Format::Msgpack, b),
                Some(Ok(Message::Close(f))) => {
                    let code = f.as_ref().map(|f| u16::from(f.code)).unwrap_or(1005);
                    return ctx.dropped(&format!("closed by the server with code {code}"));
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return ctx.dropped(&format!("read: {e}")),
                None => return ctx.dropped("connection ended"),
            };
            let mut tally = ctx.tally.borrow_mut();
            for_each_message::<Incoming, _>(fmt, payload, |m| {
                let Ok(m) = m else { return tally.unexpected += 1 };
                if let Some(p) = m.publication {
                    let d = seen.insert(p.off);
                    tally.count_publication(d, cfg.exchange);
                    delivered |= d == Delivery::New;
                }
                if m.id == Some(id) {
                    if let Some(e) = m.error {
                        tally.note_error(&format!("{:?} answered with error {}: {}", cfg.exchange, e.code, e.message));
                        refused = true;
                    } else if m.ok.is_some() {
                        replied = true;
                    }
                }
            });
        }
        if refused {
            break;
        }
        let now = unix_micros();
        let mut tally = ctx.tally.borrow_mut();
        if cfg.exchange == Exchange::Ping {
            tally.received += 1;
        }
        tally.last_arrival_us = tally.last_arrival_us.max(now);
        ctx.latency.borrow_mut().record(now.saturating_sub(t));
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
}

/// Counting of publications coming back to a session.
trait CountPublication {
    fn count_publication(&mut self, d: Delivery, exchange: Exchange);
}

impl CountPublication for Tally {
    /// With `publish` a new publication is the exchange's response; with `ping` nothing is
    /// published, so any publication is unexpected.
    fn count_publication(&mut self, d: Delivery, exchange: Exchange) {
        match exchange {
            Exchange::Publish => self.count(d),
            Exchange::Ping => self.unexpected += 1,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Coordinator.

pub fn run(args: SessionsArgs) -> anyhow::Result<i32> {
    if args.sessions.is_empty() || args.sessions.contains(&0) || args.workers.is_empty() || args.workers.contains(&0) {
        bail!("--sessions and --workers must be lists of positive numbers");
    }
    if args.common.duration.is_some_and(|d| d <= 0.0) {
        bail!("--duration must be positive");
    }
    coordinator_runtime()?.block_on(coordinate(args))
}

async fn coordinate(mut args: SessionsArgs) -> anyhow::Result<i32> {
    let started = unix_micros();
    let out = args.common.out_dir("sessions");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut progress = Progress::new(args.common.quiet);
    args.sessions.sort_unstable();
    args.sessions.dedup();
    let duration = args.common.duration.unwrap_or(3.0);
    let bin = match &args.server_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe().context("locating this executable")?,
    };
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    progress.note(&format!(
        "sessions: {:?} sessions × {:?} server workers, {:?} exchanges for {duration} s per cell",
        args.sessions, args.workers, args.exchange
    ));

    let mut cells = Vec::new();
    let mut latency = Latency::new();
    let mut total = Tally::default();
    let mut missing = 0;
    let mut rss_peak: Option<u64> = None;
    for &w in &args.workers {
        let server = ServerProc::start(&bin, w, &args.server_args, &out.join(format!("server-w{w}.log"))).await?;
        let probe = ProcessProbe::new(server.pid);
        let baseline = probe.memory().ok().map(|m| m.rss);
        progress.note(&format!("server with {w} workers: pid {}, http://{}", server.pid, server.addr));
        for &s in &args.sessions {
            let target = format!("ws://{}/ws", server.addr);
            let outcome = run_cell(&args, &target, w, s, duration, probe, baseline, &mut progress).await;
            let (cell, merged) = match outcome {
                Ok(x) => x,
                Err(e) => {
                    server.stop().await;
                    return Err(e);
                }
            };
            progress.note(&format!(
                "  {w} workers, {s} sessions: {:.0} exchanges/s, rtt p50 {} ms, rss/session {}",
                cell.exchanges_per_s,
                cell.rtt_ms_p50.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into()),
                cell.rss_per_session_bytes.map(fmt_bytes).unwrap_or_else(|| "-".into())
            ));
            latency.merge(&merged.latency)?;
            total.merge(&merged.tally);
            missing += merged.missing;
            cells.push(cell);
        }
        rss_peak = rss_peak.max(probe.memory().ok().map(|m: Memory| m.hwm));
        server.stop().await;
    }

    let connections = Connections {
        target: cells.iter().map(|c| c.sessions as u64).sum(),
        established: cells.iter().map(|c| c.established).sum(),
        failed: cells.iter().map(|c| c.failed).sum(),
    };
    let messages = MessageCounts::from_tally(total.sent, total.sent, &total);
    let mut criteria = standard_criteria(&connections, total.dropped, &messages);
    let idle: Vec<String> =
        cells.iter().filter(|c| c.received == 0).map(|c| format!("w{}×s{}", c.workers, c.sessions)).collect();
    criteria.push(Criterion::new(
        "every cell completed exchanges",
        idle.is_empty(),
        if idle.is_empty() { format!("{} cells", cells.len()) } else { format!("none in {}", idle.join(", ")) },
    ));
    criteria.push(Criterion::workers_reported(missing));
    let best = cells.iter().map(|c| c.exchanges_per_s).fold(0.0, f64::max);
    let headline = cells.iter().filter(|c| c.workers == args.workers[0]).max_by_key(|c| c.sessions);
    let cpu_s: Option<f64> = cells.iter().map(|c| c.server_cpu_s).sum();
    let mut extra = Map::new();
    extra.insert("exchange".into(), json!(args.exchange));
    extra.insert("cores".into(), json!(cores));
    extra.insert("best_exchanges_per_s".into(), json!(best));
    extra.insert("cells".into(), serde_json::to_value(&cells)?);
    extra.insert("table".into(), table_object(&cells));
    if args.workers.iter().any(|&w| w > cores) {
        extra.insert("workers_note".into(), json!(format!("the server caps --workers at the {cores} cores")));
    }
    let params = json!({
        "sessions": args.sessions, "workers": args.workers, "exchange": args.exchange,
        "duration_s": duration, "format": args.format, "server_bin": bin.display().to_string(),
        "server_args": args.server_args,
    });
    let result = BenchResult::builder("sessions", params, started)
        .measured(cells.iter().map(|c| c.window_s).sum(), connections, messages, best)
        .latency(latency.summary())
        .server(cpu_s, rss_peak)
        .rss_per_connection((headline.and_then(|c| c.rss_per_session_bytes), None))
        .errors(&total.errors)
        .criteria(criteria)
        .extra(extra);
    std::fs::write(out.join("sessions.csv"), cells_csv(&cells))?;
    let (rate_chart, rss_chart) = charts(&cells, &args.workers);
    std::fs::write(out.join("sessions.svg"), rate_chart.svg())?;
    std::fs::write(out.join("sessions-rss.svg"), rss_chart.svg())?;
    progress.note(&matrix(&cells, &args.sessions, &args.workers));
    result.conclude(&latency, &out, &mut progress)
}

#[allow(clippy::too_many_arguments)] // one cell's coordinates and the shared probes
async fn run_cell(
    args: &SessionsArgs,
    target: &str,
    workers: usize,
    sessions: usize,
    duration: f64,
    probe: ProcessProbe,
    baseline: Option<u64>,
    progress: &mut Progress,
) -> anyhow::Result<(Cell, crate::worker::Merged)> {
    let procs = args.common.procs_for(sessions);
    let spread = args.common.spread_sources(sessions);
    // Time for the workers to start and the sessions to connect before the phase begins.
    let start_us = unix_micros() + 700_000 + sessions as u64 * 1_500;
    let until_us = start_us + (duration * 1e6) as u64;
    let configs: Vec<WorkerConfig> = split(sessions, procs)
        .into_iter()
        .map(|(first, n)| {
            WorkerConfig::Sessions(SessionsWorker {
                target: target.to_string(),
                conns: n,
                first_index: first,
                spread,
                exchange: args.exchange,
                format: args.format,
                prefix: format!("room:sessions.w{workers}."),
                start_us,
                until_us,
                drain_ms: DRAIN_MS,
            })
        })
        .collect();
    let mut pool = Pool::spawn(&configs, None)?;
    let mut rate = Rate::default();
    let mut status = move |p: &Pool| {
        let t = p.totals();
        format!(
            "{workers} workers, {sessions} sessions: {} connected ({} failed), {} exchanges ({:.0}/s)",
            t.established,
            t.failed,
            t.received,
            rate.per_s(t.received)
        )
    };
    let start = instant_of(start_us);
    pool.run_until(start + Duration::from_secs(30), progress, &mut status, Pool::all_ready).await;
    let mut samples = Samples {
        baseline,
        connected: probe.memory().ok().map(|m| m.rss),
        start_us,
        until_us,
        started_late: Instant::now() > start,
        ..Samples::default()
    };
    pool.run_until(start, progress, &mut status, |_| false).await;
    let cpu0 = probe.cpu_sample().ok();
    pool.run_until(instant_of(start_us + (duration * 5e5) as u64), progress, &mut status, |_| false).await;
    samples.running = probe.memory().ok().map(|m| m.rss);
    let end = instant_of(until_us + DRAIN_MS * 1000) + Duration::from_secs(5);
    pool.run_until(end, progress, &mut status, Pool::all_ended).await;
    let cpu1 = probe.cpu_sample().ok();
    samples.cpu_s = CpuSample::between(&cpu0, &cpu1);
    let merged = pool.finish(Duration::from_secs(10), progress).await?;
    let cell = Cell::new(workers, sessions, configs.len(), &merged.tally, &merged.latency.summary(), &samples);
    Ok((cell, merged))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    fn worker(url: String, exchange: Exchange) -> SessionsWorker {
        let now = unix_micros();
        SessionsWorker {
            target: url,
            conns: 2,
            first_index: 0,
            spread: false,
            exchange,
            format: WireFormat::Json,
            prefix: "room:s.".into(),
            start_us: now + 50_000,
            until_us: now + 250_000,
            drain_ms: 500,
        }
    }

    #[test]
    fn sessions_worker_publish_rounds_wait_for_reply_and_publication() {
        let ctx = testutil::local(async {
            // Answers a subscribe, and each publish with its reply plus the publication at the
            // next offset — once twice, to be caught as a duplicate.
            let offsets = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::<String, u64>::new()));
            let url = testutil::serve(move |msg| {
                let cmd: Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
                let id = cmd["id"].as_u64().unwrap();
                if let Some(ch) = cmd["subscribe"]["channels"][0].as_str() {
                    return vec![Message::text(
                        json!({"id": id, "ok": {"channels": {ch: {"epoch": "e", "offset": 5}}}}).to_string(),
                    )];
                }
                let ch = cmd["publish"]["channel"].as_str().unwrap().to_string();
                let mut map = offsets.lock().unwrap();
                let off = map.entry(ch.clone()).or_insert(5);
                *off += 1;
                let p = json!({"pub": {"ch": ch, "off": *off, "data": cmd["publish"]["data"]}}).to_string();
                let r = json!({"id": id, "ok": {"offset": *off, "epoch": "e"}}).to_string();
                if *off == 7 {
                    vec![Message::text(format!("{p}\n{p}")), Message::text(r)]
                } else {
                    vec![Message::text(r), Message::text(p)]
                }
            })
            .await;
            let ctx = WorkerCtx::new(2);
            run_worker(worker(url, Exchange::Publish), ctx.clone()).await;
            ctx
        });
        let t = ctx.tally.borrow();
        assert_eq!((t.established, t.failed, t.dropped), (2, 0, 0), "{:?}", t.errors);
        assert!(t.sent >= 4, "sent {}", t.sent);
        assert_eq!(t.received, t.sent, "every round came back");
        assert_eq!(t.duplicated, 2, "one duplicate per session");
        assert_eq!(ctx.latency.borrow().count(), t.sent);
    }

    #[test]
    fn sessions_worker_ping_stops_at_an_error_reply() {
        let ctx = testutil::local(async {
            let url = testutil::serve(|msg| {
                let cmd: Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
                let id = cmd["id"].as_u64().unwrap();
                let reply = if let Some(ch) = cmd["subscribe"]["channels"][0].as_str() {
                    json!({"id": id, "ok": {"channels": {ch: {"epoch": "e", "offset": 0}}}})
                } else if id < 4 {
                    json!({"id": id, "ok": {"data": cmd["ping"]["data"]}})
                } else {
                    json!({"id": id, "error": {"code": 429, "message": "slow down"}})
                };
                vec![Message::text(reply.to_string())]
            })
            .await;
            let ctx = WorkerCtx::new(2);
            run_worker(worker(url, Exchange::Ping), ctx.clone()).await;
            ctx
        });
        let t = ctx.tally.borrow();
        // Rounds 2 and 3 answered, round 4 refused: each session stops there.
        assert_eq!((t.sent, t.received), (6, 4), "{:?}", t.errors);
        assert_eq!(MessageCounts::from_tally(t.sent, t.sent, &t).lost, 2);
        assert!(t.errors.iter().any(|e| e.contains("429")), "{:?}", t.errors);
    }
}
