//! `bench streams`: stream sets against many channels (the PI Web API Channels experiment).
//!
//! U users watch the same K points, which the coordinator updates F times a second through
//! batched `POST /api/publish` calls (one update of every point per tick, `--batch` items per
//! request). Two ways to watch:
//!
//! - `--mode set`: each user is one connection holding K subscriptions (PI's stream set: one
//!   channel, many attributes). The subscribe command is split into chunks of
//!   `--subscribe-chunk` channels so that none exceeds the server's
//!   `limits.max_channels_per_subscribe` or frame size.
//! - `--mode channels`: each user opens K connections with one subscription each (PI's one
//!   channel per stream).
//!
//! The points are `--prefix<i>`, by default `bench:streams.<i>`: a namespace with the default
//! options (history, no conflation), so every update is owed to every subscriber and loss is
//! counted exactly, by offset. (`pt:` channels conflate for slow subscribers, which would make
//! missing updates a feature rather than a loss; the `dashboard` scenario measures those.)
//!
//! Expected deliveries are the accepted updates × U: a user whose connection failed counts as
//! lost deliveries as well as a failed connection. Latency runs from each tick's scheduled
//! time (see [`feed`]). With `--server-pid`, server CPU over the publishing phase and memory
//! are sampled; delivered updates/s is the received total over the publishing window (or until
//! the last arrival, if later).
//!
//! The PI Web API runs, reproduced:
//! `streams --users 200 --points 1000 --hz 1 --mode set` (200 users, one subscription to
//! 1,000 attributes each) and `streams --users 1 --points 2600 --mode channels` (2,600
//! single-subscription channels of one user).

pub mod feed;

use std::rc::Rc;
use std::time::Duration;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map};
use switchboard_client::HttpApi;
use tokio::time::Instant;

use crate::accounting::MessageCounts;
use crate::chart::{LineChart, Point, Series};
use crate::common::{source_addr, split, unix_micros, CommonArgs, PaceArgs, WireFormat};
use crate::histogram::Latency;
use crate::probe::{CpuSample, ProcessProbe};
use crate::progress::Progress;
use crate::report::{pace_criteria, rss_per_connection, standard_criteria, BenchResult, Connections, Criterion};
use crate::scenario::{coordinator_runtime, WorkerConfig};
use crate::search::Search;
use crate::worker::{Pool, WorkerCtx};
use feed::{completion, run_ticks, FeedConn, FeedWorker, Points, TickPublisher, Ticks, DEFAULT_SUBSCRIBE_CHUNK};

/// Deliveries per second one single-threaded worker process reads comfortably; above that the
/// default `--procs` adds processes (up to the number of cores) so the load generator does
/// not become the bottleneck it is measuring.
const DELIVERIES_PER_PROC: f64 = 100_000.0;

/// How a user watches its points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamsMode {
    /// One connection per user with K subscriptions.
    Set,
    /// K connections per user with one subscription each.
    Channels,
}

impl StreamsMode {
    pub fn name(self) -> &'static str {
        match self {
            StreamsMode::Set => "set",
            StreamsMode::Channels => "channels",
        }
    }
}

/// `switchboard bench streams`
#[derive(Debug, Clone, clap::Args)]
pub struct StreamsArgs {
    /// Users U.
    #[arg(long, default_value_t = 200)]
    pub users: usize,
    /// Points K, each watched by every user.
    #[arg(long, default_value_t = 1000)]
    pub points: usize,
    /// Updates of every point per second F.
    #[arg(long, default_value_t = 1.0)]
    pub hz: f64,
    /// `set`: one connection with K subscriptions per user; `channels`: K connections with one
    /// subscription each.
    #[arg(long, value_enum, default_value = "set")]
    pub mode: StreamsMode,
    /// Channel name prefix of the points (`<prefix><i>`); keep it outside `pt:`, which
    /// conflates.
    #[arg(long, default_value = "bench:streams.")]
    pub prefix: String,
    /// Most channels per subscribe command.
    #[arg(long, default_value_t = DEFAULT_SUBSCRIBE_CHUNK)]
    pub subscribe_chunk: usize,
    /// Updates per `POST /api/publish` batch.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Wire format of the subscribers.
    #[arg(long, value_enum, default_value = "json")]
    pub format: WireFormat,
    /// How the subscribers connect: WebSocket, SSE or long-polling (the HTTP transports
    /// subscribe through a poll session; JSON only).
    #[arg(long, value_enum, default_value = "ws")]
    pub transport: crate::transport::Transport,
    /// Subscribers offer permessage-deflate (WebSocket); the bytes their sockets read per
    /// delivery are reported either way (`wire_bytes_per_delivery`).
    #[arg(long, value_enum, default_value = "off")]
    pub compression: switchboard_client::Compression,
    /// Handshakes in flight per worker process.
    #[arg(long, default_value_t = 200)]
    pub concurrency: usize,
    /// Token for the handshakes and the HTTP API (`Authorization: Bearer`).
    #[arg(long)]
    pub token: Option<String>,
    /// Find the largest publications/s the setup sustains: double --points (at --hz) until a
    /// run fails (a tick late, p99 over --max-p99-ms (100 ms unless given), anything lost),
    /// then bisect; report the largest that passed. Each step is a full run of --duration.
    #[arg(long)]
    pub search: bool,
    /// Upper bound of --points for --search (tried itself when doubling would pass it).
    #[arg(long, default_value_t = 64_000)]
    pub search_max: usize,
    /// Bisection steps after the first failure.
    #[arg(long, default_value_t = 3)]
    pub search_refine: usize,
    #[command(flatten)]
    pub pace: PaceArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl StreamsArgs {
    fn ticks(&self) -> u64 {
        (self.common.duration.unwrap_or(10.0) * self.hz).ceil().max(1.0) as u64
    }
}

/// A streams worker's share of the connections.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamsWorker {
    pub feed: FeedConn,
    pub mode: StreamsMode,
    pub conns: usize,
    /// Global index of this worker's first connection.
    pub first_index: usize,
    pub spread: bool,
    pub concurrency: usize,
}

/// Connections of a run: one per user (`set`) or one per user and point (`channels`).
pub fn connections_for(mode: StreamsMode, users: usize, points: usize) -> usize {
    match mode {
        StreamsMode::Set => users,
        StreamsMode::Channels => users.saturating_mul(points),
    }
}

/// The points connection `g` subscribes to. In `channels` mode connection `g` belongs to user
/// `g / K` and watches point `g % K`.
pub fn points_of(mode: StreamsMode, points: usize, g: usize) -> std::ops::Range<usize> {
    match mode {
        StreamsMode::Set => 0..points,
        StreamsMode::Channels => {
            let p = g % points.max(1);
            p..p + 1
        }
    }
}

/// Worker processes when `--procs` is not given: enough for the connections, and one per
/// [`DELIVERIES_PER_PROC`] of expected delivery rate, at most one per core for the latter.
pub fn default_procs(common: &CommonArgs, conns: usize, deliveries_per_s: f64, cores: usize) -> usize {
    let for_conns = common.procs_for(conns);
    if common.procs.is_some() {
        return for_conns;
    }
    let for_rate = ((deliveries_per_s / DELIVERIES_PER_PROC).ceil() as usize).clamp(1, cores.max(1));
    for_conns.max(for_rate).min(conns.max(1))
}

// ---------------------------------------------------------------------------------------------
// Worker.

pub async fn run_worker(cfg: StreamsWorker, ctx: Rc<WorkerCtx>) {
    let w = FeedWorker::new(cfg.feed.clone(), ctx.clone(), cfg.concurrency);
    for i in 0..cfg.conns {
        let g = cfg.first_index + i;
        let range = points_of(cfg.mode, cfg.feed.points.count, g);
        tokio::task::spawn_local(feed::subscriber(w.clone(), range, source_addr(g, cfg.spread)));
    }
    ctx.wait_stop().await;
    crate::transport::end_sessions().await;
}

// ---------------------------------------------------------------------------------------------
// Coordinator.

pub fn run(args: StreamsArgs) -> anyhow::Result<i32> {
    if args.users == 0 || args.points == 0 || args.hz <= 0.0 || !args.hz.is_finite() {
        bail!("--users, --points and --hz must be positive");
    }
    args.transport.check_format(args.format.format())?;
    if args.transport != crate::transport::Transport::Ws && args.compression != switchboard_client::Compression::Off {
        bail!("--compression is for WebSocket subscribers (--transport ws)");
    }
    if args.common.duration.is_some_and(|d| d <= 0.0) {
        bail!("--duration must be positive");
    }
    if args.prefix.starts_with("pt:") {
        bail!("--prefix {}: pt: channels conflate, so lost updates could not be told from conflated ones; use the dashboard scenario for points", args.prefix);
    }
    coordinator_runtime()?.block_on(coordinate(args))
}

async fn coordinate(args: StreamsArgs) -> anyhow::Result<i32> {
    let out = args.common.out_dir("streams");
    let mut progress = Progress::new(args.common.quiet);
    if args.search {
        return search(args, &out, &mut progress).await;
    }
    let (result, latency) = run_once(&args, &mut progress).await?;
    result.conclude(&latency, &out, &mut progress)
}

/// The p99 bound of a `--search` step unless `--max-p99-ms` is given.
const SEARCH_P99_MS: f64 = 100.0;

/// A finished run: its result and latency histogram.
type Run = (BenchResult, Latency);

/// `--search`: one full run per point count (see [`Search`]); the result is the largest
/// passing run's, with every step in `extra.search` and `search.svg`, or the first failing
/// run's when none passed (exit 1).
async fn search(args: StreamsArgs, out: &std::path::Path, progress: &mut Progress) -> anyhow::Result<i32> {
    let max_p99_ms = args.pace.max_p99_ms.unwrap_or(SEARCH_P99_MS);
    let mut sweep = Search::new(args.points, args.search_max, args.search_refine);
    let (mut steps, mut chart) = (Vec::new(), Vec::new());
    let (mut best, mut first_fail): (Option<Run>, Option<Run>) = (None, None);
    let mut largest = None;
    while let Some(k) = sweep.next() {
        let mut step = args.clone();
        step.points = k;
        step.pace.max_p99_ms = Some(max_p99_ms);
        let (mut result, latency) = match run_once(&step, progress).await {
            Ok(run) => run,
            // A step the server refused outright (a limit, say) is a failed step, not the end.
            Err(e) if best.is_some() => {
                progress.note(&format!("search: {k} points × {} Hz → FAIL ({e})", args.hz));
                steps.push(json!({"points": k, "publications_per_s": k as f64 * args.hz, "pass": false, "error": e.to_string()}));
                chart.push(Point { x: k as f64 * args.hz, y: None, ok: false });
                sweep.record(k, false);
                continue;
            }
            Err(e) => return Err(e),
        };
        let late = result.extra.get("ticks_late").and_then(|v| v.as_u64()).unwrap_or(u64::MAX);
        result.criteria.push(Criterion::new(
            "every tick reached every subscriber within its period",
            late == 0,
            format!("{late} ticks late"),
        ));
        result.decide();
        let rate = k as f64 * args.hz;
        let p99 = result.latency_ms.p99;
        progress.note(&format!(
            "search: {k} points × {} Hz = {rate:.0} publications/s → {} (p99 {}, {late} ticks late)",
            args.hz,
            if result.pass { "pass" } else { "FAIL" },
            p99.map(|p| format!("{p:.1} ms")).unwrap_or_else(|| "-".into()),
        ));
        steps.push(
            json!({"points": k, "publications_per_s": rate, "pass": result.pass, "p99_ms": p99, "ticks_late": late}),
        );
        chart.push(Point { x: rate, y: p99, ok: result.pass });
        sweep.record(k, result.pass);
        if result.pass {
            largest = Some(k);
            best = Some((result, latency));
        } else if first_fail.is_none() {
            first_fail = Some((result, latency));
        }
        // Let the server reap the previous step's connections before the next.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let Some((mut result, latency)) = best.or(first_fail) else { bail!("--search-max is below --points") };
    result.extra.insert(
        "search".into(),
        json!({
            "steps": steps, "max_p99_ms": max_p99_ms, "largest_passing_points": largest,
            "largest_passing_publications_per_s": largest.map(|k| k as f64 * args.hz),
        }),
    );
    result.params["search"] = json!(true);
    std::fs::create_dir_all(out)?;
    let svg = LineChart {
        title: "streams --search: delivery p99 per step".into(),
        x_label: "publications/s".into(),
        y_label: "delivery p99 (ms)".into(),
        log_x: true,
        series: vec![Series { name: "p99 (red: step failed)".into(), points: chart }],
        reference: Some((max_p99_ms, format!("bound {max_p99_ms} ms"))),
    }
    .svg();
    std::fs::write(out.join("search.svg"), svg)?;
    result.conclude(&latency, out, progress)
}

/// One run at `args.points`: the result (not yet decided) and its latency histogram.
async fn run_once(args: &StreamsArgs, progress: &mut Progress) -> anyhow::Result<(BenchResult, Latency)> {
    let started = unix_micros();
    let probe = args.common.server_pid.map(ProcessProbe::new);
    let mem_before = probe.and_then(|p| p.memory().ok());
    let mut api = HttpApi::new(&args.common.api_base()?)?;
    if let Some(t) = &args.token {
        api = api.with_token(t.clone());
    }
    let (users, k) = (args.users, args.points);
    let conns = connections_for(args.mode, users, k);
    let subs_per_conn = match args.mode {
        StreamsMode::Set => k,
        StreamsMode::Channels => 1,
    };
    let ticks = args.ticks();
    let rate = users as f64 * k as f64 * args.hz;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let procs = default_procs(&args.common, conns, rate, cores);
    let spread = args.common.spread_sources(conns);
    let points = Points { prefix: args.prefix.clone(), count: k };
    let feed = FeedConn {
        target: args.common.target.clone(),
        points: points.clone(),
        chunk: args.subscribe_chunk,
        initial: false,
        seqs: ticks,
        updates_per_channel: ticks,
        format: args.format,
        transport: args.transport,
        compression: args.compression,
    };
    let configs: Vec<WorkerConfig> = split(conns, procs)
        .into_iter()
        .map(|(first, n)| {
            WorkerConfig::Streams(StreamsWorker {
                feed: feed.clone(),
                mode: args.mode,
                conns: n,
                first_index: first,
                spread,
                concurrency: args.concurrency,
            })
        })
        .collect();
    progress.note(&format!(
        "streams ({}): {users} users × {k} points at {} Hz = {} subscriptions on {conns} connections over {} worker processes, {ticks} ticks",
        args.mode.name(),
        args.hz,
        users * k,
        configs.len()
    ));
    let pool = Pool::spawn(&configs, args.token.as_deref())?;
    let connect_deadline = Instant::now()
        + Duration::from_secs(30)
        + Duration::from_millis(conns as u64 * 5)
        + Duration::from_micros((users * k) as u64 * 100);
    let mut pool =
        pool.establish(connect_deadline, progress, "subscribing", conns, "no connection could subscribe").await?;
    let mem_connected = probe.and_then(|p| p.memory().ok());
    let cpu0 = probe.and_then(|p| p.cpu_sample().ok());

    let publisher = TickPublisher { api, points, batch: args.batch };
    let log =
        run_ticks(&mut pool, progress, &publisher, Ticks { first_seq: 0, count: ticks, hz: args.hz }, "streams").await;
    let expected = log.accepted_total() * users as u64;
    let grace = Duration::from_secs_f64(2.0 / args.hz).max(Duration::from_secs(5)) * 2;
    pool.run_until(
        Instant::now() + grace,
        progress,
        |p| format!("draining: {}/{expected} updates delivered", p.totals().received),
        |p| p.totals().received >= expected,
    )
    .await;
    let cpu1 = probe.and_then(|p| p.cpu_sample().ok());
    let mem_end = probe.and_then(|p| p.memory().ok());
    let merged = pool.finish(Duration::from_secs(30), progress).await?;
    let t = &merged.tally;

    let connections = Connections::settled(conns as u64, t.established, t.failed);
    let messages = MessageCounts::from_tally(log.accepted_total(), expected, t);
    let window_s = ticks as f64 / args.hz;
    let span_s = window_s.max(t.last_arrival_us.saturating_sub(log.start_us) as f64 / 1e6);
    let cpu_s = CpuSample::between(&cpu0, &cpu1);
    let done = completion(&log, &t.bursts, 0, users as u64, args.hz);
    let mut criteria = standard_criteria(&connections, t.dropped, &messages);
    criteria.push(Criterion::new(
        "every update accepted by the server",
        log.rejected == 0,
        format!("{} accepted, {} rejected", log.accepted_total(), log.rejected),
    ));
    criteria.push(Criterion::workers_reported(merged.missing));
    if args.compression == switchboard_client::Compression::Deflate {
        criteria.push(Criterion::all_deflated("", t));
    }
    let (max_late_ms, max_p99_ms) = args.pace.bounds(1000.0 / args.hz);
    let latency = merged.latency.summary();
    criteria.extend(pace_criteria(log.late_max_us as f64 / 1000.0, max_late_ms, latency.p99, max_p99_ms));

    let mut extra = Map::new();
    extra.insert("mode".into(), json!(args.mode));
    extra.insert("subscriptions".into(), json!(users * k));
    extra.insert("channels".into(), json!(format!("{}0 .. {}{}", args.prefix, args.prefix, k - 1)));
    extra.insert("ticks".into(), json!(ticks));
    extra.insert("published_updates".into(), json!(log.accepted_total()));
    extra.insert("published_per_s".into(), json!(log.accepted_total() as f64 / window_s));
    extra.insert("delivered_updates_per_s".into(), json!(t.received as f64 / span_s));
    extra.insert("ticks_incomplete".into(), json!(done.incomplete));
    extra.insert("ticks_late".into(), json!(done.late));
    extra.insert("tick_completion_ms_max".into(), json!(done.max_ms));
    extra.insert("tick_completion_ms_mean".into(), json!(done.mean_ms));
    extra.insert("publish_late_ms_max".into(), json!(log.late_max_us as f64 / 1000.0));
    extra.insert(
        "server_cpu_us_per_delivery".into(),
        json!(cpu_s.filter(|_| t.received > 0).map(|c| c * 1e6 / t.received as f64)),
    );
    extra.insert("server_cpu_percent".into(), json!(cpu_s.map(|c| c * 100.0 / span_s)));
    let ws = args.transport == crate::transport::Transport::Ws;
    extra.insert("wire_bytes_per_delivery".into(), json!(t.wire_bytes_per_delivery().filter(|_| ws)));
    extra.insert("subscribers_deflated".into(), json!(t.deflated));
    let (before, connected) = (mem_before.map(|m| m.rss), mem_connected.map(|m| m.rss));
    let rss_per_conn = rss_per_connection(before, connected, t.established);
    extra.insert("rss_per_subscription_bytes".into(), json!(rss_per_conn.0.map(|b| b / subs_per_conn as f64)));
    let cs = merged.connect.summary();
    extra.insert("subscribe_ms_p50".into(), json!(cs.p50));
    extra.insert("subscribe_ms_p99".into(), json!(cs.p99));
    extra.insert("subscribe_ms_max".into(), json!(cs.max));
    let errors: Vec<&String> = t.errors.iter().chain(&log.errors).collect();
    let params = json!({
        "users": users, "points": k, "hz": args.hz, "mode": args.mode, "duration_s": window_s,
        "prefix": args.prefix, "subscribe_chunk": args.subscribe_chunk, "batch": args.batch,
        "format": args.format, "procs": configs.len(), "target": args.common.target,
        "transport": args.transport, "max_p99_ms": max_p99_ms, "max_publish_late_ms": max_late_ms,
        "compression": args.compression,
    });
    let result = BenchResult::builder("streams", params, started)
        .measured(span_s, connections, messages, t.received as f64 / span_s)
        .latency(latency)
        .server(cpu_s, mem_end.map(|m| m.hwm))
        .rss_sampled(before, connected)
        .rss_per_connection(rss_per_conn)
        .procs(configs.len())
        .load_generator_rss(merged.rss_peak_bytes)
        .errors(&errors)
        .criteria(criteria)
        .extra(extra)
        .build();
    Ok((result, merged.latency))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: StreamsArgs,
    }

    #[test]
    fn streams_connections_and_points_per_mode() {
        assert_eq!(connections_for(StreamsMode::Set, 200, 1000), 200);
        assert_eq!(connections_for(StreamsMode::Channels, 1, 2600), 2600);
        assert_eq!(connections_for(StreamsMode::Channels, 3, 50), 150);
        assert_eq!(points_of(StreamsMode::Set, 1000, 7), 0..1000);
        // Connection 53 of 3 users × 50 points: user 1, point 3.
        assert_eq!(points_of(StreamsMode::Channels, 50, 53), 3..4);
        // Every (user, point) pair exactly once over all connections.
        let mut seen = [0u32; 50];
        for g in 0..150 {
            for p in points_of(StreamsMode::Channels, 50, g) {
                seen[p] += 1;
            }
        }
        assert!(seen.iter().all(|n| *n == 3));
    }

    #[test]
    fn streams_splits_connections_without_overlap() {
        // 2,600 channel connections over 3 processes: contiguous, complete, no overlap.
        let parts = split(connections_for(StreamsMode::Channels, 1, 2600), 3);
        assert_eq!(parts, vec![(0, 867), (867, 867), (1734, 866)]);
        let total: usize = parts.iter().map(|(_, n)| n).sum();
        assert_eq!(total, 2600);
    }

    #[test]
    fn streams_default_procs_follow_connections_and_delivery_rate() {
        let t = T::parse_from(["t"]);
        assert_eq!(t.a.ticks(), 10, "10 s at 1 Hz");
        // 200 users × 1,000 points at 1 Hz: 200,000 deliveries/s, two processes on two cores.
        assert_eq!(default_procs(&t.a.common, 200, 200_000.0, 2), 2);
        assert_eq!(default_procs(&t.a.common, 200, 200_000.0, 8), 2);
        assert_eq!(default_procs(&t.a.common, 200, 50_000.0, 8), 1);
        // Never more processes than connections, and the connection bound still applies.
        assert_eq!(default_procs(&t.a.common, 1, 1e9, 8), 1);
        assert_eq!(default_procs(&t.a.common, 25_000, 1.0, 1), 3);
        let t = T::parse_from(["t", "--procs", "1", "--duration", "2", "--hz", "5"]);
        assert_eq!(default_procs(&t.a.common, 200, 1e9, 8), 1, "--procs wins over the rate rule");
        assert_eq!(t.a.ticks(), 10);
    }

    #[test]
    fn streams_expected_deliveries_are_accepted_updates_times_users() {
        // 3 users × 50 points, 10 ticks, one update rejected: 499 accepted × 3 users.
        let log = feed::TickLog { accepted: vec![50; 9].into_iter().chain([49]).collect(), ..Default::default() };
        assert_eq!(log.accepted_total() * 3, 1497);
        let t = crate::accounting::Tally { received: 1497, ..Default::default() };
        let m = MessageCounts::from_tally(log.accepted_total(), log.accepted_total() * 3, &t);
        assert_eq!((m.sent, m.expected, m.lost), (499, 1497, 0));
    }
}
