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

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::rc::Rc;
use std::time::Duration;

use anyhow::{bail, Context};
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use switchboard_client::connect::{handshake, ConnectOptions};
use switchboard_client::frame::for_each_message;
use switchboard_protocol::Format;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::accounting::{Delivery, MessageCounts, OffsetSet, Tally};
use crate::chart::{LineChart, Point, Series};
use crate::common::{instant_of, source_addr, split, unix_micros, CommonArgs, WireFormat};
use crate::histogram::{Latency, LatencySummary};
use crate::probe::{CpuSample, Memory, ProcessProbe};
use crate::progress::{Progress, Rate};
use crate::report::{rss_per_connection, standard_criteria, BenchResult, Connections, Criterion};
use crate::scenario::broadcast::subscribe_reply;
use crate::scenario::{coordinator_runtime, WorkerConfig};
use crate::worker::{Pool, WorkerCtx};

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
    let mut opts = ConnectOptions::new(format);
    opts.bind = source_addr(g, cfg.spread);
    opts.token = crate::worker::token();
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
// The servers under test.

/// A server started by the tool; killed on drop if not stopped.
struct ServerProc {
    child: Child,
    pid: u32,
    addr: String,
    /// Kept open so the server's later stdout writes do not fail.
    _stdout: Lines<BufReader<ChildStdout>>,
}

/// The address in the server's `switchboard listening on http://ADDR` line.
fn parse_listening(line: &str) -> Option<&str> {
    let addr = line.trim().strip_prefix("switchboard listening on http://")?;
    (!addr.is_empty()).then_some(addr)
}

/// The last few lines of a server log, for an error message.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

impl ServerProc {
    async fn start(bin: &Path, workers: usize, extra: &[String], log: &Path) -> anyhow::Result<ServerProc> {
        let stderr = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--workers", &workers.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the server {}", bin.display()))?;
        let pid = child.id().context("the server exited at once")?;
        let mut lines = BufReader::new(child.stdout.take().context("server stdout")?).lines();
        let wait = async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = parse_listening(&line) {
                    return Ok(addr.to_string());
                }
            }
            bail!("the server exited before listening (its log: {})", log.display())
        };
        let addr = match tokio::time::timeout(Duration::from_secs(15), wait).await {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => bail!("{e}: {}", log_tail(log)),
            Err(_) => bail!("the server did not print its address within 15 s (its log: {})", log.display()),
        };
        Ok(ServerProc { child, pid, addr, _stdout: lines })
    }

    /// SIGTERM to its PID, then SIGKILL if it has not exited within 5 s.
    async fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.pid.to_string()]).status().await;
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Coordinator.

/// One cell of the table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cell {
    pub workers: usize,
    pub sessions: usize,
    pub procs: usize,
    pub established: u64,
    pub failed: u64,
    pub dropped: u64,
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub duplicated: u64,
    /// Exchanges completed per second over all sessions.
    pub exchanges_per_s: f64,
    pub window_s: f64,
    pub rtt_ms_p50: Option<f64>,
    pub rtt_ms_p99: Option<f64>,
    pub server_cpu_s: Option<f64>,
    pub server_cpu_us_per_exchange: Option<f64>,
    pub rss_baseline_bytes: Option<u64>,
    pub rss_connected_bytes: Option<u64>,
    pub rss_running_bytes: Option<u64>,
    /// (RSS while running − baseline) / sessions.
    pub rss_per_session_bytes: Option<f64>,
    /// (RSS once connected and subscribed, before exchanging − baseline) / sessions.
    pub rss_per_idle_session_bytes: Option<f64>,
    /// Not every session was connected when the exchange phase began.
    pub started_late: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// What was measured around one cell, in the coordinator.
#[derive(Debug, Clone, Copy, Default)]
struct Samples {
    baseline: Option<u64>,
    connected: Option<u64>,
    running: Option<u64>,
    cpu_s: Option<f64>,
    start_us: u64,
    until_us: u64,
    started_late: bool,
}

impl Cell {
    fn new(workers: usize, sessions: usize, procs: usize, t: &Tally, rtt: &LatencySummary, s: &Samples) -> Cell {
        let m = MessageCounts::from_tally(t.sent, t.sent, t);
        // The phase ends when sending stops; the last responses may come a little later.
        let end = t.last_arrival_us.max(s.until_us);
        let window_s = end.saturating_sub(s.start_us) as f64 / 1e6;
        let per_session = |after: Option<u64>| rss_per_connection(s.baseline, after, sessions as u64).0;
        Cell {
            workers,
            sessions,
            procs,
            established: t.established,
            failed: t.failed + (sessions as u64).saturating_sub(t.established + t.failed),
            dropped: t.dropped,
            sent: m.sent,
            received: m.received,
            lost: m.lost,
            duplicated: m.duplicated,
            exchanges_per_s: if window_s > 0.0 { t.received as f64 / window_s } else { 0.0 },
            window_s,
            rtt_ms_p50: rtt.p50,
            rtt_ms_p99: rtt.p99,
            server_cpu_s: s.cpu_s,
            server_cpu_us_per_exchange: s.cpu_s.filter(|_| t.received > 0).map(|c| c * 1e6 / t.received as f64),
            rss_baseline_bytes: s.baseline,
            rss_connected_bytes: s.connected,
            rss_running_bytes: s.running,
            rss_per_session_bytes: per_session(s.running.or(s.connected)),
            rss_per_idle_session_bytes: per_session(s.connected),
            started_late: s.started_late,
            errors: t.errors.clone(),
        }
    }
}

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

/// `{"w1": {"s10": {...}}}`: the table keyed so that `result.csv` flattens it into columns.
fn table_object(cells: &[Cell]) -> Value {
    let mut table = Map::new();
    for c in cells {
        let row = table.entry(format!("w{}", c.workers)).or_insert_with(|| json!({}));
        row[format!("s{}", c.sessions)] = json!({
            "exchanges_per_s": c.exchanges_per_s,
            "rtt_ms_p99": c.rtt_ms_p99,
            "rss_per_session_bytes": c.rss_per_session_bytes,
        });
    }
    Value::Object(table)
}

/// One row per cell.
fn cells_csv(cells: &[Cell]) -> String {
    let opt = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_default();
    let optu = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
    let mut s = String::from(
        "workers,sessions,procs,established,failed,dropped,sent,received,lost,duplicated,exchanges_per_s,\
         rtt_ms_p50,rtt_ms_p99,server_cpu_s,server_cpu_us_per_exchange,rss_baseline_bytes,rss_connected_bytes,\
         rss_running_bytes,rss_per_session_bytes,rss_per_idle_session_bytes,started_late\n",
    );
    for c in cells {
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{:.1},{},{},{},{},{},{},{},{},{},{}\n",
            c.workers,
            c.sessions,
            c.procs,
            c.established,
            c.failed,
            c.dropped,
            c.sent,
            c.received,
            c.lost,
            c.duplicated,
            c.exchanges_per_s,
            opt(c.rtt_ms_p50),
            opt(c.rtt_ms_p99),
            opt(c.server_cpu_s),
            opt(c.server_cpu_us_per_exchange),
            optu(c.rss_baseline_bytes),
            optu(c.rss_connected_bytes),
            optu(c.rss_running_bytes),
            opt(c.rss_per_session_bytes),
            opt(c.rss_per_idle_session_bytes),
            c.started_late
        ));
    }
    s
}

/// Exchanges/s and RSS per session against sessions, one line per worker count.
fn charts(cells: &[Cell], workers: &[usize]) -> (LineChart, LineChart) {
    let series = |f: &dyn Fn(&Cell) -> Option<f64>| -> Vec<Series> {
        workers
            .iter()
            .map(|&w| Series {
                name: format!("{w} worker{}", if w == 1 { "" } else { "s" }),
                points: cells
                    .iter()
                    .filter(|c| c.workers == w)
                    .map(|c| Point {
                        x: c.sessions as f64,
                        y: f(c),
                        ok: c.failed == 0 && c.dropped == 0 && c.lost == 0 && c.duplicated == 0,
                    })
                    .collect(),
            })
            .collect()
    };
    let rate = LineChart {
        title: "sessions × workers — exchanges per second".into(),
        x_label: "sessions".into(),
        y_label: "exchanges/s".into(),
        log_x: true,
        series: series(&|c| Some(c.exchanges_per_s)),
        reference: None,
    };
    let rss = LineChart {
        title: "sessions × workers — server RSS per session".into(),
        x_label: "sessions".into(),
        y_label: "KiB per session".into(),
        log_x: true,
        series: series(&|c| c.rss_per_session_bytes.map(|b| b / 1024.0)),
        reference: None,
    };
    (rate, rss)
}

fn fmt_bytes(b: f64) -> String {
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1048576.0)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

/// The sessions × workers table for the terminal.
fn matrix(cells: &[Cell], sessions: &[usize], workers: &[usize]) -> String {
    let mut rows = vec![std::iter::once("sessions".to_string())
        .chain(workers.iter().map(|w| format!("{w} worker{}", if *w == 1 { "" } else { "s" })))
        .collect::<Vec<_>>()];
    for &s in sessions {
        let mut row = vec![s.to_string()];
        for &w in workers {
            row.push(match cells.iter().find(|c| c.sessions == s && c.workers == w) {
                Some(c) => format!(
                    "{:.0}/s, {}{}",
                    c.exchanges_per_s,
                    c.rss_per_session_bytes.map(fmt_bytes).unwrap_or_else(|| "-".into()),
                    if c.lost + c.failed + c.dropped + c.duplicated > 0 { " (errors)" } else { "" }
                ),
                None => "-".into(),
            });
        }
        rows.push(row);
    }
    let widths: Vec<usize> =
        (0..rows[0].len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut s = String::from("exchanges per second and server RSS per session:\n");
    for r in rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(v, w)| format!("{v:<w$}")).collect();
        s.push_str(line.join("  ").trim_end());
        s.push('\n');
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    fn samples() -> Samples {
        Samples {
            baseline: Some(10 << 20),
            connected: Some((10 << 20) + 100 * 8192),
            running: Some((10 << 20) + 100 * 20480),
            cpu_s: Some(0.5),
            start_us: 1_000_000,
            until_us: 3_000_000,
            started_late: false,
        }
    }

    #[test]
    fn sessions_cell_figures_rss_per_session_and_rate() {
        let t =
            Tally { established: 100, sent: 10_000, received: 9_999, last_arrival_us: 3_000_500, ..Default::default() };
        let c = Cell::new(2, 100, 1, &t, &LatencySummary::default(), &samples());
        assert_eq!((c.established, c.failed, c.sent, c.received, c.lost), (100, 0, 10_000, 9_999, 1));
        // Window: start to the last response (after the phase end), 2.0005 s.
        assert!((c.window_s - 2.0005).abs() < 1e-9);
        assert!((c.exchanges_per_s - 9_999.0 / 2.0005).abs() < 1e-6);
        // (RSS running − baseline) / sessions; the idle figure from the connected sample.
        assert_eq!(c.rss_per_session_bytes, Some(20480.0));
        assert_eq!(c.rss_per_idle_session_bytes, Some(8192.0));
        assert_eq!(c.server_cpu_us_per_exchange, Some(0.5e6 / 9_999.0));
        // Sessions that never settled count as failed; RSS that fell gives no figure.
        let t = Tally { established: 90, failed: 5, ..Default::default() };
        let s = Samples { running: Some(5 << 20), connected: None, ..samples() };
        let c = Cell::new(1, 100, 1, &t, &LatencySummary::default(), &s);
        assert_eq!(c.failed, 10);
        assert_eq!((c.rss_per_session_bytes, c.rss_per_idle_session_bytes), (None, None));
        assert_eq!(c.exchanges_per_s, 0.0);
        assert_eq!(c.server_cpu_us_per_exchange, None, "no exchange, no per-exchange cost");
    }

    #[test]
    fn sessions_table_csv_chart_and_matrix_hold_every_cell() {
        let mk = |w, s, rate: f64| Cell {
            exchanges_per_s: rate,
            lost: u64::from(s == 10 && w == 2),
            ..Cell::new(w, s, 1, &Tally::default(), &LatencySummary::default(), &samples())
        };
        let cells = vec![mk(1, 1, 100.0), mk(1, 10, 900.0), mk(2, 1, 110.0), mk(2, 10, 1500.0)];
        let t = table_object(&cells);
        assert_eq!(t["w2"]["s10"]["exchanges_per_s"], json!(1500.0));
        assert_eq!(t["w1"]["s1"]["rss_per_session_bytes"], json!(20480.0 * 100.0));
        let csv = cells_csv(&cells);
        assert_eq!(csv.lines().count(), 5);
        assert!(csv.lines().nth(4).unwrap().starts_with("2,10,1,"), "{csv}");
        let (rate, rss) = charts(&cells, &[1, 2]);
        assert_eq!(rate.series.len(), 2);
        assert_eq!(
            rate.series[1].points.iter().map(|p| (p.x, p.y)).collect::<Vec<_>>(),
            [(1.0, Some(110.0)), (10.0, Some(1500.0))]
        );
        assert!(!rate.series[1].points[1].ok, "the cell with a loss is marked");
        assert_eq!(rss.series[0].points[0].y, Some(2000.0));
        let m = matrix(&cells, &[1, 10], &[1, 2]);
        assert!(m.contains("1500/s") && m.contains("(errors)"), "{m}");
        assert_eq!(m.lines().count(), 4);
    }

    #[test]
    fn sessions_server_that_cannot_start_is_an_error_with_its_log() {
        let dir = std::env::temp_dir().join(format!("sb-bench-sessions-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("server.log");
        // A script stands in for a server that refuses its configuration.
        let bin = dir.join("fake-server");
        std::fs::write(&bin, "#!/bin/sh\necho 'switchboard: bad key' >&2\nexit 2\n").unwrap();
        std::process::Command::new("chmod").arg("+x").arg(&bin).status().unwrap();
        let err = testutil::local(ServerProc::start(&bin, 1, &[], &log)).err().unwrap();
        assert!(format!("{err:#}").contains("bad key"), "{err:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sessions_reads_the_listening_line() {
        assert_eq!(parse_listening("switchboard listening on http://127.0.0.1:4567\n"), Some("127.0.0.1:4567"));
        assert_eq!(parse_listening("something else"), None);
        assert_eq!(parse_listening("switchboard listening on http://"), None);
    }

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
