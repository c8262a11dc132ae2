//! `bench soak`: a steady load held for a long time, to show the server's state stays bounded.
//!
//! For `--duration` (default 30 minutes) the run keeps, all at once:
//!
//! - `--subs` WebSocket connections, each subscribed to `--points-per-sub` of the `--points`
//!   channels `pt:soak.<i>` (dealt round-robin, [`plan::Plan`]), held the whole time and spread
//!   over worker processes;
//! - the point feed: every point published `--hz` times a second through batched
//!   `POST /api/publish` calls, data `{"v", "t": <unix ms>}`; subscribers check every
//!   delivery's offset per channel and measure latency from `t` ([`worker`]);
//! - `--new-channels` channels a second `room:soak-<run>-<n>`, each published once and
//!   abandoned: the server must forget them again (a namespace's `channel_ttl_s`);
//! - `--churn` connections a second opened, subscribed to one point with `initial: true`
//!   (the reply must carry the channel's position) and closed, in worker processes of their
//!   own.
//!
//! Every `--sample` seconds it samples the server ([`sample`]): RSS (`--server-pid`), the
//! `switchboard_channels` and `switchboard_broker_channels` gauges, and the Redis key count
//! (`--redis`). The first sample at or after `--warmup` is the baseline.
//!
//! # Pass
//!
//! Only if every one of these was observed: every held connection subscribed and stayed up,
//! no point update lost or duplicated (expected = accepted updates × the point's
//! subscribers), no publish refused, every scheduled publish round ran before the end (a
//! publisher a whole run behind did not hold the load), every churn connection succeeded,
//! every worker reported, and from the baseline on every sample of the server's RSS and of
//! its channel count stayed within `--max-drift-pct` of the baseline. The channel count is
//! `switchboard_broker_channels` when the server reports it, else the Redis `DBSIZE` when
//! `--redis` is given; with neither (or no `--server-pid` for RSS) that criterion fails as
//! not observed: the bench never reports a bound it did not see.
//!
//! Output: `result.json` with `extra.samples` and `extra.baseline`, `result.csv`,
//! `latency.svg` and `soak.svg` (RSS and channel counts over time, warm-up shaded).

pub mod load;
pub mod outcome;
pub mod plan;
pub mod sample;
pub mod worker;

use std::cell::RefCell;
use std::time::Duration;

use anyhow::bail;
use switchboard_client::HttpApi;
use tokio::time::Instant;

use crate::common::{instant_of, parse_seconds, split, unix_micros, CommonArgs};
use crate::probe::{CpuSample, ProcessProbe};
use crate::progress::{Progress, Rate};
use crate::scenario::connect::deal;
use crate::scenario::streams::feed::Points;
use crate::scenario::{coordinator_runtime, WorkerConfig};
use crate::worker::{Pool, Snapshot};
use load::Live;
use outcome::Observed;
use plan::Plan;
use sample::{Sample, Sampler};
pub use worker::{run_worker, SoakWorker};
use worker::{ChurnShare, HoldShare, SoakRole};

/// `--duration` unless given.
pub const DEFAULT_DURATION_S: f64 = 1800.0;
/// Churn connections a second one worker process opens; more churn adds processes.
const CHURN_PER_PROC: f64 = 500.0;
/// Channel name prefix of the point feed.
const PREFIX: &str = "pt:soak.";

/// `switchboard bench soak`
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// WebSocket connections subscribed for the whole run.
    #[arg(long, default_value_t = 2000)]
    pub subs: usize,
    /// Point channels `pt:soak.<i>` of the feed.
    #[arg(long, default_value_t = 1000)]
    pub points: usize,
    /// Points each held connection subscribes to, dealt round-robin so every point has
    /// subscribers (when subs × points-per-sub ≥ points).
    #[arg(long, default_value_t = 10)]
    pub points_per_sub: usize,
    /// Updates of every point per second.
    #[arg(long, default_value_t = 1.0)]
    pub hz: f64,
    /// New `room:soak-…` channels per second, each published once and abandoned.
    #[arg(long, default_value_t = 1000)]
    pub new_channels: u64,
    /// Connections per second opened, subscribed to one point with `initial: true`, closed.
    #[arg(long, default_value_t = 50.0)]
    pub churn: f64,
    /// Time before the baseline sample (seconds, or 90s, 5m, 1h). --duration defaults to 30m.
    #[arg(long, default_value = "5m", value_parser = parse_seconds)]
    pub warmup: f64,
    /// Time between samples of the server (seconds, or 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_seconds)]
    pub sample: f64,
    /// Redis servers whose key count (DBSIZE) to sample, comma-separated URLs; summed.
    #[arg(long)]
    pub redis: Option<String>,
    /// Largest drift (%) of RSS and of the channel count from their baseline in a passing run.
    #[arg(long, default_value_t = 10.0)]
    pub max_drift_pct: f64,
    /// Time a churn connection may take from its scheduled start until closed.
    #[arg(long, default_value = "10s", value_parser = parse_seconds)]
    pub churn_timeout: f64,
    /// Handshakes of held connections in flight per worker process.
    #[arg(long, default_value_t = 200)]
    pub concurrency: usize,
    /// Token for the handshakes and the HTTP API (`Authorization: Bearer`).
    #[arg(long)]
    pub token: Option<String>,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl SoakArgs {
    pub fn duration_s(&self) -> f64 {
        self.common.duration.unwrap_or(DEFAULT_DURATION_S)
    }

    /// Refuses settings that could not run or could never be judged.
    pub fn check(&self) -> anyhow::Result<()> {
        let d = self.duration_s();
        if self.subs == 0 || self.points == 0 || self.points_per_sub == 0 {
            bail!("--subs, --points and --points-per-sub must be positive");
        }
        if self.points_per_sub > self.points {
            bail!("--points-per-sub {} is more than the {} points", self.points_per_sub, self.points);
        }
        if !(self.hz.is_finite() && self.hz > 0.0 && self.churn.is_finite() && self.churn >= 0.0) {
            bail!("--hz must be positive and --churn not negative");
        }
        if d <= 0.0 || self.sample <= 0.0 || self.churn_timeout <= 0.0 {
            bail!("--duration, --sample and --churn-timeout must be positive");
        }
        if self.warmup >= d || self.sample > d - self.warmup {
            bail!(
                "--warmup {}s and --duration {d}s leave no sample to judge after the warm-up (--sample {}s)",
                self.warmup,
                self.sample
            );
        }
        if !(self.max_drift_pct.is_finite() && self.max_drift_pct >= 0.0) {
            bail!("--max-drift-pct must be a percentage ≥ 0");
        }
        Ok(())
    }

    fn plan(&self) -> Plan {
        Plan {
            points: Points { prefix: PREFIX.into(), count: self.points },
            subs: self.subs,
            points_per_sub: self.points_per_sub,
        }
    }

    fn api(&self, base: &str) -> anyhow::Result<HttpApi> {
        let api = HttpApi::new(base)?.with_timeout(Duration::from_secs(10));
        Ok(match &self.token {
            Some(t) => api.with_token(t.clone()),
            None => api,
        })
    }
}

/// Churn worker processes for `rate` connections a second.
pub fn churn_procs(rate: f64) -> usize {
    (rate / CHURN_PER_PROC).ceil().max(1.0) as usize
}

pub fn run(args: SoakArgs) -> anyhow::Result<i32> {
    args.check()?;
    coordinator_runtime()?.block_on(coordinate(args))
}

/// Sums the latest progress of the workers in `range` of the pool.
fn totals(p: &Pool, range: std::ops::Range<usize>) -> Snapshot {
    let mut s = Snapshot::default();
    for w in p.workers.get(range).unwrap_or_default() {
        s.add(&w.snapshot);
    }
    s
}

/// Samples the server every `every_s` from `start_us` until `duration_s` has passed (a
/// sample at the end included).
async fn sample_loop(sampler: &mut Sampler, start_us: u64, duration_s: f64, every_s: f64, out: &RefCell<Vec<Sample>>) {
    let n = (duration_s / every_s + 1e-9).floor() as u64;
    // A sampler held up by a server that does not answer stops one period after the end.
    let end = instant_of(start_us + ((duration_s + every_s) * 1e6) as u64);
    for k in 0..=n {
        let scheduled_s = k as f64 * every_s;
        tokio::time::sleep_until(instant_of(start_us + (scheduled_s * 1e6) as u64)).await;
        if Instant::now() >= end {
            break;
        }
        let t_s = (unix_micros().saturating_sub(start_us) as f64 / 1e6).max(scheduled_s);
        let s = sampler.sample(t_s).await;
        out.borrow_mut().push(s);
    }
}

async fn coordinate(args: SoakArgs) -> anyhow::Result<i32> {
    let started = unix_micros();
    let out = args.common.out_dir("soak");
    let mut progress = Progress::new(args.common.quiet);
    let duration = args.duration_s();
    let plan = args.plan();
    let base = args.common.api_base()?;
    let probe = args.common.server_pid.map(ProcessProbe::new);
    let mut sampler = Sampler::new(args.api(&base)?, probe, args.redis.as_deref().unwrap_or(""))?;
    let (feed_api, rooms_api) = (args.api(&base)?, args.api(&base)?);
    let mem_before = probe.and_then(|p| p.memory().ok());

    let subs = args.subs;
    let spread = args.common.spread_sources(subs);
    let hold_configs: Vec<WorkerConfig> = split(subs, args.common.procs_for(subs))
        .into_iter()
        .map(|(first, n)| {
            WorkerConfig::Soak(SoakWorker {
                target: args.common.target.clone(),
                plan: plan.clone(),
                conns: n,
                role: SoakRole::Hold(HoldShare { first_index: first, spread, concurrency: args.concurrency }),
            })
        })
        .collect();
    let n_hold = hold_configs.len();
    let churn_total = (args.churn * duration).round() as u64;
    progress.note(&format!(
        "soak: {subs} subscribers × {} of {} points ({PREFIX}*) at {} Hz, {} new channels/s, churn {}/s, \
         for {duration:.0} s (warm-up {:.0} s, a sample every {:.0} s); {n_hold} subscriber processes",
        args.points_per_sub, args.points, args.hz, args.new_channels, args.churn, args.warmup, args.sample
    ));
    if probe.is_none() {
        progress.note("soak: no --server-pid: the server's RSS is not sampled, so the run cannot pass");
    }
    if !plan.unheld().is_empty() {
        progress.note(&format!("soak: points {:?} have no subscriber (subs × points-per-sub < points)", plan.unheld()));
    }
    let pool = Pool::spawn(&hold_configs, args.token.as_deref())?;
    let deadline = Instant::now() + Duration::from_secs(30) + Duration::from_millis(subs as u64 * 5);
    let mut pool =
        pool.establish(deadline, &mut progress, "subscribing", subs, "no subscriber could subscribe").await?;
    let mem_connected = probe.and_then(|p| p.memory().ok());
    let established_at_start = totals(&pool, 0..n_hold).established;

    // The load phase starts on a whole millisecond (the feed's `t`), a moment from now so
    // that the churn processes are up when their first connection is due.
    let start_us = (unix_micros() + 1_000_000) / 1000 * 1000;
    let timeout_ms = (args.churn_timeout * 1000.0) as u64;
    let churn_configs: Vec<WorkerConfig> = if churn_total == 0 {
        Vec::new()
    } else {
        let procs = churn_procs(args.churn);
        deal(churn_total as usize, procs)
            .into_iter()
            .map(|(w, count)| {
                WorkerConfig::Soak(SoakWorker {
                    target: args.common.target.clone(),
                    plan: plan.clone(),
                    conns: 0,
                    role: SoakRole::Churn(ChurnShare {
                        worker: w,
                        stride: procs,
                        count: count as u64,
                        rate: args.churn,
                        start_us,
                        timeout_ms,
                    }),
                })
            })
            .collect()
    };
    pool.add(&churn_configs, args.token.as_deref())?;
    let n_all = n_hold + churn_configs.len();
    let cpu0 = probe.and_then(|p| p.cpu_sample().ok());

    let live = Live::default();
    let samples: RefCell<Vec<Sample>> = RefCell::new(Vec::new());
    let run_id = started;
    let (warmup, total_s) = (args.warmup, duration);
    let mut rate = Rate::default();
    let mut status = |p: &Pool| {
        let (h, c) = (totals(p, 0..n_hold), totals(p, n_hold..n_all));
        let t = unix_micros().saturating_sub(start_us) as f64 / 1e6;
        let last = samples.borrow().last().copied().unwrap_or_default();
        let figure = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        format!(
            "soak {:.0}/{total_s:.0} s{}: {} subscribed, {} dropped, {} updates ({:.0}/s), {} duplicated; \
             {} new channels; churn {} ok, {} failed; {} refused; rss {} MiB, broker channels {}, redis keys {}",
            t.min(total_s),
            if t < warmup { " (warm-up)" } else { "" },
            h.established,
            h.dropped,
            h.received,
            rate.per_s(h.received),
            h.duplicated,
            live.rooms_accepted.get(),
            c.established,
            c.failed,
            live.refused.get(),
            last.rss_bytes.map(|b| format!("{:.1}", b as f64 / 1048576.0)).unwrap_or_else(|| "-".into()),
            figure(last.broker_channels),
            figure(last.redis_keys),
        )
    };
    let end = instant_of(start_us + (duration * 1e6) as u64);
    let (feed_log, rooms_log, (), _) = tokio::join!(
        load::feed(&feed_api, &plan, args.hz, start_us, duration, &live),
        load::rooms(&rooms_api, run_id, args.new_channels, start_us, duration, &live),
        sample_loop(&mut sampler, start_us, duration, args.sample, &samples),
        pool.run_until(end, &mut progress, &mut status, |_| false),
    );
    let load_s = unix_micros().saturating_sub(start_us) as f64 / 1e6;

    // Drain: the last updates on their way, the last churn connections settling.
    let expected = plan.expected(&feed_log.accepted);
    let grace = Duration::from_secs_f64((2.0 / args.hz).max(5.0).max(args.churn_timeout + 2.0));
    pool.run_until(Instant::now() + grace, &mut progress, &mut status, |p| {
        let c = totals(p, n_hold..n_all);
        totals(p, 0..n_hold).received >= expected && c.established + c.failed >= churn_total
    })
    .await;
    let cpu1 = probe.and_then(|p| p.cpu_sample().ok());
    let mem_end = probe.and_then(|p| p.memory().ok());
    let mut groups = pool.finish_groups(Duration::from_secs(30), &mut progress, |i| usize::from(i >= n_hold)).await?;
    let churn = if groups.len() > 1 { groups.pop().unwrap_or_default() } else { Default::default() };
    let held = groups.pop().unwrap_or_default();

    let observed = Observed {
        started_us: started,
        load_s,
        plan,
        held,
        churn,
        churn_total,
        churn_procs: churn_configs.len(),
        hold_procs: n_hold,
        feed: feed_log,
        rooms: rooms_log,
        samples: samples.into_inner(),
        sampler_errors: sampler.errors.clone(),
        counts_redis_keys: sampler.counts_redis_keys(),
        cpu_s: CpuSample::between(&cpu0, &cpu1),
        rss_before: mem_before.map(|m| m.rss),
        rss_connected: mem_connected.map(|m| m.rss),
        rss_peak: mem_end.map(|m| m.hwm),
        established_at_start,
    };
    let (result, latency) = outcome::result(&args, observed, &out)?;
    result.conclude(&latency, &out, &mut progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: SoakArgs,
    }

    #[test]
    fn soak_defaults_and_duration_flags() {
        let t = T::parse_from(["t"]);
        let a = &t.a;
        assert_eq!((a.subs, a.points, a.points_per_sub, a.new_channels), (2000, 1000, 10, 1000));
        assert_eq!((a.hz, a.churn, a.max_drift_pct), (1.0, 50.0, 10.0));
        assert_eq!((a.duration_s(), a.warmup, a.sample), (1800.0, 300.0, 10.0));
        a.check().unwrap();
        let p = a.plan();
        assert!((0..1000).all(|pt| p.subscribers_of(pt) == 20), "every point has subscribers");
        assert_eq!(a.common.procs_for(a.subs), 1);
        let t = T::parse_from(["t", "--duration", "1h", "--warmup", "90s", "--sample", "30"]);
        assert_eq!((t.a.duration_s(), t.a.warmup, t.a.sample), (3600.0, 90.0, 30.0));
        assert!(T::try_parse_from(["t", "--warmup", "later"]).is_err());
        assert_eq!(churn_procs(50.0), 1);
        assert_eq!(churn_procs(1200.0), 3);
        assert_eq!(churn_procs(0.0), 1);
    }

    #[test]
    fn soak_refuses_runs_that_could_not_be_judged() {
        let bad = |args: &[&str]| {
            let t = T::parse_from([&["t"], args].concat());
            t.a.check().unwrap_err().to_string()
        };
        assert!(bad(&["--duration", "5m", "--warmup", "5m"]).contains("no sample"));
        assert!(bad(&["--duration", "60", "--warmup", "55", "--sample", "10"]).contains("no sample"));
        assert!(bad(&["--points", "5", "--points-per-sub", "6"]).contains("more than"));
        assert!(bad(&["--subs", "0"]).contains("positive"));
        assert!(bad(&["--hz", "0"]).contains("--hz"));
        assert!(bad(&["--sample", "0"]).contains("positive"));
        // The test-sized run of the black-box tests is fine.
        let t = T::parse_from(["t", "--duration", "20s", "--warmup", "8s", "--sample", "2s", "--max-drift-pct", "0"]);
        t.a.check().unwrap();
    }
}
