//! `bench dashboard`: one connection holding W point subscriptions, as a dashboard does (the
//! Webjive performance experiment: a screen of widgets must fill within 2 s and sustain 1,000
//! updated items per second).
//!
//! W widgets are bound to W point channels `--prefix<i>`, by default `pt:bench.dash.<i>`. The
//! coordinator first publishes one value per point, so every widget has something to show.
//! One connection then subscribes to all W with `initial: true` (in chunks of
//! `--subscribe-chunk`); the **load time** runs from its first subscribe command until every
//! widget holds a value. Then the coordinator updates every point F times a second for
//! `--duration` seconds through batched `POST /api/publish` calls, and the connection counts
//! what arrives: sustained updates/s and latency from each tick's scheduled time (see
//! [`super::streams::feed`]).
//!
//! # Counting under conflation
//!
//! `pt:` channels conflate: a subscriber that falls behind gets only the latest value of each
//! point, which is what a display wants. An update conflated away is therefore not a loss:
//!
//! - `messages.sent` and `messages.expected` are the updates published in the measured phase;
//!   `received` the distinct updates delivered (never more than one per offset);
//! - `messages.lost` is the number of points whose **final** value never arrived — a widget
//!   left showing a stale value;
//! - `extra.conflated` is the rest of the difference, `expected − received − lost`.
//!
//! The run passes when every widget got a value, every point's final value arrived, nothing
//! was duplicated, no connection dropped and every update was accepted.

use std::rc::Rc;
use std::time::Duration;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map};
use switchboard_client::HttpApi;
use tokio::time::Instant;

use crate::accounting::{BurstTally, MessageCounts};
use crate::common::{unix_micros, CommonArgs, PaceArgs, WireFormat};
use crate::probe::{CpuSample, ProcessProbe};
use crate::progress::Progress;
use crate::report::{pace_criteria, BenchResult, Connections, Criterion};
use crate::scenario::streams::feed::{
    completion, run_ticks, FeedConn, FeedWorker, Points, TickPublisher, Ticks, DEFAULT_SUBSCRIBE_CHUNK,
};
use crate::scenario::{coordinator_runtime, WorkerConfig};
use crate::worker::{Pool, WorkerCtx};

/// `switchboard bench dashboard`
#[derive(Debug, Clone, clap::Args)]
pub struct DashboardArgs {
    /// Widgets W, one point subscription each.
    #[arg(long, default_value_t = 1000)]
    pub widgets: usize,
    /// Updates of every point per second F.
    #[arg(long, default_value_t = 1.0)]
    pub hz: f64,
    /// Channel name prefix of the points (`<prefix><i>`).
    #[arg(long, default_value = "pt:bench.dash.")]
    pub prefix: String,
    /// Most channels per subscribe command.
    #[arg(long, default_value_t = DEFAULT_SUBSCRIBE_CHUNK)]
    pub subscribe_chunk: usize,
    /// Updates per `POST /api/publish` batch.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Wire format of the dashboard connection.
    #[arg(long, value_enum, default_value = "json")]
    pub format: WireFormat,
    /// Token for the handshake and the HTTP API (`Authorization: Bearer`).
    #[arg(long)]
    pub token: Option<String>,
    #[command(flatten)]
    pub pace: PaceArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl DashboardArgs {
    fn ticks(&self) -> u64 {
        (self.common.duration.unwrap_or(10.0) * self.hz).ceil().max(1.0) as u64
    }
}

/// The dashboard worker: one connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DashboardWorker {
    pub feed: FeedConn,
    /// Always 1: one dashboard, one connection.
    pub conns: usize,
}

/// Tick numbers: 0 is the initial value published before the dashboard opens; the measured
/// ticks are `1..=ticks`.
const INITIAL_SEQ: u64 = 0;

/// What the dashboard's counters mean under conflation (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DashboardCounts {
    pub messages: MessageCounts,
    /// Points whose final value arrived.
    pub finals: u64,
    /// Updates conflated away: published, not delivered, and not a missing final value.
    pub conflated: u64,
}

impl DashboardCounts {
    /// `published` updates in the measured phase, `received` distinct deliveries, `finals` the
    /// number of points whose last tick arrived, out of `widgets`.
    pub fn new(widgets: u64, published: u64, received: u64, duplicated: u64, finals: u64) -> Self {
        let lost = widgets.saturating_sub(finals);
        DashboardCounts {
            messages: MessageCounts { sent: published, expected: published, received, lost, duplicated },
            finals,
            conflated: published.saturating_sub(received).saturating_sub(lost),
        }
    }
}

/// Points whose final value arrived: the deliveries of the last tick (each point at most once,
/// since a delivery counts only the first time its offset arrives).
pub fn finals(bursts: &[BurstTally], last_seq: u64) -> u64 {
    bursts.get(last_seq as usize).map(|b| b.count).unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Worker.

pub async fn run_worker(cfg: DashboardWorker, ctx: Rc<WorkerCtx>) {
    let w = FeedWorker::new(cfg.feed.clone(), ctx.clone(), 1);
    for _ in 0..cfg.conns {
        tokio::task::spawn_local(crate::scenario::streams::feed::subscriber(w.clone(), 0..cfg.feed.points.count, None));
    }
    ctx.wait_stop().await;
}

// ---------------------------------------------------------------------------------------------
// Coordinator.

pub fn run(args: DashboardArgs) -> anyhow::Result<i32> {
    if args.widgets == 0 || args.hz <= 0.0 || !args.hz.is_finite() {
        bail!("--widgets and --hz must be positive");
    }
    if args.common.duration.is_some_and(|d| d <= 0.0) {
        bail!("--duration must be positive");
    }
    coordinator_runtime()?.block_on(coordinate(args))
}

async fn coordinate(args: DashboardArgs) -> anyhow::Result<i32> {
    let started = unix_micros();
    let out = args.common.out_dir("dashboard");
    let mut progress = Progress::new(args.common.quiet);
    let probe = args.common.server_pid.map(ProcessProbe::new);
    let mut api = HttpApi::new(&args.common.api_base()?)?;
    if let Some(t) = &args.token {
        api = api.with_token(t.clone());
    }
    let w = args.widgets;
    let ticks = args.ticks();
    let points = Points { prefix: args.prefix.clone(), count: w };
    let publisher = TickPublisher { api, points: points.clone(), batch: args.batch };

    // Initial values, so that every widget has something to show when the dashboard opens.
    let initial = publisher.publish(INITIAL_SEQ, unix_micros()).await;
    if initial.accepted == 0 {
        bail!("no initial value was accepted: {}", initial.errors.join("; "));
    }
    let feed = FeedConn {
        target: args.common.target.clone(),
        points,
        chunk: args.subscribe_chunk,
        initial: true,
        seqs: ticks + 1,
        updates_per_channel: ticks,
        format: args.format,
        transport: crate::transport::Transport::Ws,
        compression: switchboard_client::Compression::Off,
    };
    let configs = vec![WorkerConfig::Dashboard(DashboardWorker { feed, conns: 1 })];
    progress.note(&format!(
        "dashboard: {w} widgets on {} at {} Hz, {ticks} ticks after the dashboard has loaded",
        args.prefix, args.hz
    ));
    let mut pool = Pool::spawn(&configs, args.token.as_deref())?;
    let load_deadline = Instant::now() + Duration::from_secs(70);
    pool.run_until(
        load_deadline,
        &mut progress,
        |p| if p.totals().failed > 0 { "dashboard failed to load".into() } else { format!("loading {w} widgets") },
        Pool::all_ready,
    )
    .await;
    if pool.totals().established == 0 {
        let merged = pool.finish(Duration::from_secs(10), &mut progress).await?;
        bail!("the dashboard did not load: {}", merged.tally.errors.join("; "));
    }
    let cpu0 = probe.and_then(|p| p.cpu_sample().ok());

    let log =
        run_ticks(&mut pool, &mut progress, &publisher, Ticks { first_seq: 1, count: ticks, hz: args.hz }, "dashboard")
            .await;
    let published = log.accepted_total();
    // Without conflation everything arrives and this ends at once; with it, the final values
    // are what is being waited for.
    let grace = Duration::from_secs_f64(2.0 / args.hz).max(Duration::from_secs(5));
    pool.run_until(
        Instant::now() + grace,
        &mut progress,
        |p| format!("draining: {}/{published} updates delivered", p.totals().received),
        |p| p.totals().received >= published,
    )
    .await;
    let cpu1 = probe.and_then(|p| p.cpu_sample().ok());
    let mem_end = probe.and_then(|p| p.memory().ok());
    let merged = pool.finish(Duration::from_secs(30), &mut progress).await?;
    let t = &merged.tally;

    let counts =
        DashboardCounts::new(w as u64, published, t.received, t.duplicated + t.unexpected, finals(&t.bursts, ticks));
    let m = counts.messages;
    let connections =
        Connections { target: 1, established: t.established, failed: t.failed.max(u64::from(t.established == 0)) };
    let window_s = ticks as f64 / args.hz;
    let span_s = window_s.max(t.last_arrival_us.saturating_sub(log.start_us) as f64 / 1e6);
    let cpu_s = CpuSample::between(&cpu0, &cpu1);
    let load_ms = (t.established > 0).then(|| merged.connect.max_us() as f64 / 1000.0);
    let mut criteria = vec![
        Criterion::new(
            "every widget got a value",
            t.established == 1,
            match load_ms {
                Some(ms) => format!("all {w} within {ms:.1} ms of subscribing"),
                None => {
                    format!("dashboard did not load: {}", t.errors.first().map(String::as_str).unwrap_or("no report"))
                }
            },
        ),
        Criterion::new("no connection dropped during the run", t.dropped == 0, format!("{} dropped", t.dropped)),
        Criterion::new(
            "the final value of every point arrived",
            counts.finals == w as u64,
            format!("{} of {w} final values, {} updates conflated", counts.finals, counts.conflated),
        ),
        Criterion::new("no message duplicated", m.duplicated == 0, format!("{} duplicated", m.duplicated)),
        Criterion::new(
            "every update accepted by the server",
            initial.rejected == 0 && log.rejected == 0,
            format!(
                "{} initial values and {published} updates accepted, {} rejected",
                initial.accepted,
                initial.rejected + log.rejected
            ),
        ),
        Criterion::workers_reported(merged.missing),
    ];
    let (max_late_ms, max_p99_ms) = args.pace.bounds(1000.0 / args.hz);
    let latency = merged.latency.summary();
    criteria.extend(pace_criteria(log.late_max_us as f64 / 1000.0, max_late_ms, latency.p99, max_p99_ms));

    let done = completion(&log, &t.bursts, 1, 1, args.hz);
    let mut extra = Map::new();
    extra.insert("widgets".into(), json!(w));
    extra.insert("load_ms".into(), json!(load_ms));
    extra.insert("updates_per_s".into(), json!(t.received as f64 / span_s));
    extra.insert("published_per_s".into(), json!(published as f64 / window_s));
    extra.insert("ticks".into(), json!(ticks));
    extra.insert("final_values".into(), json!(counts.finals));
    extra.insert("conflated".into(), json!(counts.conflated));
    extra.insert("ticks_complete".into(), json!(ticks - done.incomplete));
    extra.insert("tick_completion_ms_max".into(), json!(done.max_ms));
    extra.insert("publish_late_ms_max".into(), json!(log.late_max_us as f64 / 1000.0));
    extra.insert(
        "server_cpu_us_per_delivery".into(),
        json!(cpu_s.filter(|_| t.received > 0).map(|c| c * 1e6 / t.received as f64)),
    );
    let errors: Vec<&String> = t.errors.iter().chain(&initial.errors).chain(&log.errors).collect();
    let params = json!({
        "widgets": w, "hz": args.hz, "duration_s": window_s, "prefix": args.prefix,
        "subscribe_chunk": args.subscribe_chunk, "batch": args.batch, "format": args.format,
        "target": args.common.target, "max_p99_ms": max_p99_ms, "max_publish_late_ms": max_late_ms,
    });
    BenchResult::builder("dashboard", params, started)
        .measured(span_s, connections, m, t.received as f64 / span_s)
        .latency(latency)
        .server(cpu_s, mem_end.map(|m| m.hwm))
        .load_generator_rss(merged.rss_peak_bytes)
        .errors(&errors)
        .criteria(criteria)
        .extra(extra)
        .conclude(&merged.latency, &out, &mut progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dashboard_conflated_updates_are_not_losses() {
        // 100 widgets × 10 ticks; 950 delivered, all final values in: 50 conflated, none lost.
        let c = DashboardCounts::new(100, 1000, 950, 0, 100);
        assert_eq!(c.messages, MessageCounts { sent: 1000, expected: 1000, received: 950, lost: 0, duplicated: 0 });
        assert_eq!((c.finals, c.conflated), (100, 50));
        // Three points never got their final value: three lost, the rest of the gap conflated.
        let c = DashboardCounts::new(100, 1000, 900, 2, 97);
        assert_eq!((c.messages.lost, c.conflated, c.messages.duplicated), (3, 97, 2));
        // Everything delivered.
        let c = DashboardCounts::new(200, 2000, 2000, 0, 200);
        assert_eq!((c.messages.lost, c.conflated), (0, 0));
    }

    #[test]
    fn dashboard_final_values_come_from_the_last_tick() {
        let bursts =
            vec![BurstTally::default(), BurstTally { count: 10, last_us: 1 }, BurstTally { count: 7, last_us: 2 }];
        assert_eq!(finals(&bursts, 2), 7);
        assert_eq!(finals(&bursts, 1), 10);
        assert_eq!(finals(&bursts, 5), 0, "a tick nobody saw");
    }

    #[test]
    fn dashboard_ticks_follow_duration_and_rate() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            a: DashboardArgs,
        }
        let t = T::parse_from(["t"]);
        assert_eq!((t.a.widgets, t.a.ticks()), (1000, 10));
        assert!(t.a.prefix.starts_with("pt:"), "a dashboard holds point channels");
        let t = T::parse_from(["t", "--hz", "5", "--duration", "2.1"]);
        assert_eq!(t.a.ticks(), 11);
    }
}
