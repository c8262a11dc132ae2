//! The broadcast coordinator: worker processes spawned over the lanes (the run's transport and
//! `--reference`'s), publications paced one a period, per-burst completion, the `--search`
//! steps, and the result with its criteria.

use std::time::Duration;

use anyhow::bail;
use serde::Serialize;
use serde_json::{json, Map, Value};
use switchboard_client::{Compression, HttpApi};
use tokio::time::Instant;

use super::document::{publication, Document};
use super::lane::Lane;
use super::{reference, BroadcastArgs, BroadcastWorker};
use crate::accounting::MessageCounts;
use crate::chart::{LineChart, Point, Series};
use crate::common::{split, unix_micros};
use crate::histogram::Latency;
use crate::probe::{CpuSample, Memory, ProcessProbe};
use crate::progress::{Progress, Rate};
use crate::report::{pace_criteria, rss_per_connection, standard_criteria, BenchResult, Connections, Criterion};
use crate::scenario::{ms, WorkerConfig};
use crate::search::Search;
use crate::worker::Pool;

/// The progress line of the publishing phase.
fn publishing(rate: &mut Rate, sent: usize, bursts: u64) -> impl FnMut(&Pool) -> String + '_ {
    move |p| {
        let t = p.totals();
        format!("publishing {sent}/{bursts}: {} deliveries ({:.0}/s)", t.received, rate.per_s(t.received))
    }
}

/// One publication as the coordinator saw it.
#[derive(Debug, Clone, Serialize)]
struct Burst {
    seq: u64,
    published_us: u64,
    offset: Option<u64>,
    error: Option<String>,
    delivered: u64,
    /// Last arrival − publish time; `None` while not every subscriber has it.
    completion_ms: Option<f64>,
    within_period: bool,
}

/// One run at a given M.
struct Outcome {
    result: BenchResult,
    latency: Latency,
    bursts: Vec<Burst>,
}

pub(super) async fn coordinate(args: BroadcastArgs) -> anyhow::Result<i32> {
    let out = args.common.out_dir("broadcast");
    let mut progress = Progress::new(args.common.quiet);
    if !args.search {
        let o = run_once(&args, args.subs, &mut progress).await?;
        write_bursts(&out, &o.bursts)?;
        return o.result.conclude(&o.latency, &out, &mut progress);
    }
    let mut steps = Vec::new();
    let mut points = Vec::new();
    let mut best: Option<Outcome> = None;
    let mut first_fail: Option<Outcome> = None;
    let mut search = Search::new(args.subs, args.search_max, args.search_refine);
    while let Some(m) = search.next() {
        let mut o = run_once(&args, m, &mut progress).await?;
        o.result.decide();
        let worst = o
            .bursts
            .iter()
            .filter_map(|b| b.completion_ms)
            .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
        progress.note(&format!(
            "search: {m} subscribers → {} (slowest burst {})",
            if o.result.pass { "pass" } else { "FAIL" },
            worst.map(|w| format!("{w:.1} ms")).unwrap_or_else(|| "incomplete".into())
        ));
        steps.push(json!({"subs": m, "pass": o.result.pass, "slowest_burst_ms": worst}));
        points.push(Point { x: m as f64, y: worst, ok: o.result.pass });
        write_bursts(&out.join(format!("step-{m}")), &o.bursts)?;
        search.record(m, o.result.pass);
        if o.result.pass {
            best = Some(o);
        } else if first_fail.is_none() {
            first_fail = Some(o);
        }
        // Let the server reap the previous step's connections before the next wave.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let found = best.as_ref().map(|b| b.result.connections.target);
    let Some(mut chosen) = best.or(first_fail) else { bail!("--search-max is below --subs") };
    chosen.result.extra.insert("search".into(), json!({"steps": steps, "largest_passing_subs": found}));
    chosen.result.params["search"] = json!(true);
    write_bursts(&out, &chosen.bursts)?;
    std::fs::write(out.join("search.svg"), search_chart(points, args.period).svg())?;
    chosen.result.conclude(&chosen.latency, &out, &mut progress)
}

/// `--search` steps: the slowest burst's completion time per subscriber count, against the
/// period every burst must finish within. A step whose bursts never all completed has no value.
fn search_chart(points: Vec<Point>, period_s: f64) -> LineChart {
    LineChart {
        title: "broadcast --search: slowest burst per step".into(),
        x_label: "subscribers".into(),
        y_label: "slowest burst completion (ms)".into(),
        log_x: true,
        series: vec![Series { name: "slowest burst (red: step failed)".into(), points }],
        reference: Some((period_s * 1000.0, format!("period {period_s} s"))),
    }
}

fn write_bursts(dir: &std::path::Path, bursts: &[Burst]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut csv = String::from("seq,published_us,offset,delivered,completion_ms,within_period,error\n");
    for b in bursts {
        csv.push_str(&format!(
            "{},{},{},{},{},{},{}\n",
            b.seq,
            b.published_us,
            b.offset.map(|o| o.to_string()).unwrap_or_default(),
            b.delivered,
            b.completion_ms.map(|c| format!("{c:.3}")).unwrap_or_default(),
            b.within_period,
            b.error.as_deref().unwrap_or("").replace([',', '\n'], " ")
        ));
    }
    std::fs::write(dir.join("bursts.csv"), csv)
}

async fn run_once(args: &BroadcastArgs, subs: usize, progress: &mut Progress) -> anyhow::Result<Outcome> {
    let started = unix_micros();
    let bursts = args.bursts();
    let probe = args.common.server_pid.map(ProcessProbe::new);
    let mem_before: Option<Memory> = probe.and_then(|p| p.memory().ok());
    let mut api = HttpApi::new(&args.common.api_base()?)?;
    if let Some(t) = &args.token {
        api = api.with_token(t.clone());
    }

    let targets: Vec<&String> = std::iter::once(&args.common.target).chain(&args.also_targets).collect();
    let procs = args.common.procs_for(subs).max(targets.len().min(subs));
    // The run's channel and subscribers, then the reference's (`--reference`), whose
    // subscribers take the next source addresses and the next worker processes.
    let lanes: Vec<Lane> = std::iter::once(Lane {
        channel: args.channel.clone(),
        transport: args.transport,
        compression: args.compression,
        delta: args.delta.is_some(),
    })
    .chain(args.reference.map(|r| Lane {
        channel: reference::channel(&args.channel),
        transport: r,
        compression: args.reference_compression,
        delta: args.reference_delta.is_some(),
    }))
    .collect();
    let doc = Document::new(args.doc_bytes);
    let compared = lanes.len() > 1;
    let spread = args.common.spread_sources(subs * lanes.len());
    let shares = split(subs, procs);
    let per_lane = shares.len().max(1);
    let mut configs: Vec<WorkerConfig> = Vec::with_capacity(per_lane * lanes.len());
    for (l, lane) in lanes.iter().enumerate() {
        for (i, &(first, n)) in shares.iter().enumerate() {
            configs.push(WorkerConfig::Broadcast(BroadcastWorker {
                target: targets[i % targets.len()].clone(),
                channel: lane.channel.clone(),
                conns: n,
                first_index: l * subs + first,
                spread,
                bursts,
                format: args.format,
                concurrency: args.concurrency,
                transport: lane.transport,
                compression: lane.compression,
                delta: lane.delta,
            }));
        }
    }
    let lane_workers = |lane: usize| lane * per_lane..(lane + 1) * per_lane;
    progress.note(&format!(
        "broadcast: {subs} subscribers on {} over {} worker processes{}, {bursts} publications every {} s",
        args.channel,
        configs.len(),
        match lanes.get(1) {
            Some(r) => format!(" and as many {} on {}", r.describe(), r.channel),
            None => String::new(),
        },
        args.period
    ));
    let pool = Pool::spawn(&configs, args.token.as_deref())?;
    let all = subs * lanes.len();
    let connect_deadline = Instant::now() + Duration::from_secs(30) + Duration::from_millis(all as u64 * 5);
    let mut pool = pool
        .establish(connect_deadline, progress, "subscribing", all, "no subscriber could connect and subscribe")
        .await?;
    let ready = pool.totals();
    let lane_established: Vec<u64> = (0..lanes.len()).map(|l| pool.totals_of(lane_workers(l)).established).collect();
    let mem_connected = probe.and_then(|p| p.memory().ok());
    let cpu0 = probe.and_then(|p| p.cpu_sample().ok());

    // Publishing phase: each period one publication per lane, a slot of the period apart.
    let mut plan = Vec::with_capacity(bursts as usize);
    let mut reference_plan = Vec::new();
    let mut windows = reference::Windows::default();
    let phase_start = Instant::now();
    let first_publish_us = unix_micros();
    let period = Duration::from_secs_f64(args.period);
    let slot_len = period.div_f64(lanes.len() as f64);
    let mut rate = Rate::default();
    // Largest delay between a burst's scheduled time and its publish.
    let mut late_max_us = 0;
    for k in 0..bursts {
        for slot in 0..lanes.len() {
            let lane = if compared { reference::lane(k, slot) } else { 0 };
            let from_start = period * k as u32 + slot_len * slot as u32;
            let at = phase_start + from_start;
            let sent = plan.len();
            pool.run_until(at, progress, publishing(&mut rate, sent, bursts), |_| false).await;
            let t = unix_micros();
            late_max_us = late_max_us.max(t.saturating_sub(first_publish_us + from_start.as_micros() as u64));
            let before = probe.filter(|_| compared).and_then(|p| p.cpu_sample().ok());
            let (offset, error) = match api.publish(&lanes[lane].channel, &publication(doc.as_ref(), t, k)).await {
                Ok(r) => (Some(r.offset), None),
                Err(e) => (None, Some(e.to_string())),
            };
            if compared {
                // The window closes once every subscriber of the lane has this publication.
                let want = (k + 1) * lane_established[lane];
                let workers = lane_workers(lane);
                let whole = pool
                    .run_until(at + slot_len, progress, publishing(&mut rate, sent, bursts), |p| {
                        p.totals_of(workers.clone()).received >= want
                    })
                    .await;
                let after = probe.and_then(|p| p.cpu_sample().ok());
                windows.add(lane, &before, &after, lane_established[lane], whole);
            }
            let burst = Burst {
                seq: k,
                published_us: t,
                offset,
                error,
                delivered: 0,
                completion_ms: None,
                within_period: false,
            };
            if lane == 0 {
                plan.push(burst);
            } else {
                reference_plan.push(burst);
            }
        }
    }
    let published = plan.iter().chain(&reference_plan).filter(|b| b.offset.is_some()).count() as u64;
    // Every attempted publication is expected at every subscriber: one that failed (say the
    // server died) is a loss to them, and one whose reply was lost may still have been
    // delivered, which must not make up for deliveries missing elsewhere.
    let expected = plan.len() as u64 * lane_established[0];
    let expected_all = bursts * lane_established.iter().sum::<u64>();
    let grace = period.max(Duration::from_secs(5)) * 2;
    pool.run_until(
        Instant::now() + grace,
        progress,
        |p| {
            let t = p.totals();
            format!("draining: {}/{expected_all} deliveries", t.received)
        },
        // Done when everything arrived, or when no subscriber is left to receive more.
        |p| p.totals().received >= expected_all || p.totals().dropped >= ready.established,
    )
    .await;
    let cpu1 = probe.and_then(|p| p.cpu_sample().ok());
    let mem_end = probe.and_then(|p| p.memory().ok());
    let mut groups = pool.finish_groups(Duration::from_secs(30), progress, |i| i / per_lane).await?;
    let reference_group = if compared { groups.pop() } else { None };
    let merged = groups.swap_remove(0);
    let t = &merged.tally;

    // Per-burst completion.
    let established = t.established;
    let mut late = 0;
    for b in plan.iter_mut() {
        let tally = t.bursts.get(b.seq as usize).copied().unwrap_or_default();
        b.delivered = tally.count;
        if b.offset.is_some() && tally.count >= established && established > 0 {
            let c = ms(tally.last_us.saturating_sub(b.published_us));
            b.completion_ms = Some(c);
            b.within_period = c <= args.period * 1000.0;
        }
        if !b.within_period {
            late += 1;
        }
    }

    let connections = Connections::settled(subs as u64, established, t.failed);
    let messages = MessageCounts::from_tally(plan.len() as u64, expected, t);
    let span_us = t.last_arrival_us.saturating_sub(first_publish_us).max(1);
    let cpu_s = CpuSample::between(&cpu0, &cpu1);
    let mut criteria = standard_criteria(&connections, t.dropped, &messages);
    criteria.push(Criterion::new(
        "every publish accepted",
        published == bursts * lanes.len() as u64,
        format!("{published}/{} accepted", bursts * lanes.len() as u64),
    ));
    criteria.push(Criterion::new(
        "every burst reached every subscriber within the period",
        late == 0,
        format!("{late} of {bursts} bursts late or incomplete"),
    ));
    criteria.push(Criterion::workers_reported(merged.missing + reference_group.as_ref().map_or(0, |g| g.missing)));
    let (max_late_ms, max_p99_ms) = args.pace.bounds(args.period * 1000.0);
    let latency = merged.latency.summary();
    criteria.extend(pace_criteria(late_max_us as f64 / 1000.0, max_late_ms, latency.p99, max_p99_ms));

    let completions: Vec<f64> = plan.iter().filter_map(|b| b.completion_ms).collect();
    let mut extra = Map::new();
    extra.insert("dropped".into(), json!(t.dropped));
    let mut publish_errors: Vec<&str> = Vec::new();
    for e in plan.iter().chain(&reference_plan).filter_map(|b| b.error.as_deref()) {
        if publish_errors.len() < 3 && !publish_errors.contains(&e) {
            publish_errors.push(e);
        }
    }
    if !publish_errors.is_empty() {
        extra.insert("publish_errors".into(), json!(publish_errors));
    }
    extra.insert("bursts_late_or_incomplete".into(), json!(late));
    extra.insert(
        "burst_completion_ms_max".into(),
        json!(completions.iter().copied().fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))))),
    );
    extra.insert(
        "burst_completion_ms_mean".into(),
        json!(if completions.is_empty() {
            None
        } else {
            Some(completions.iter().sum::<f64>() / completions.len() as f64)
        }),
    );
    let cpu_us_per_delivery = match &reference_group {
        Some(_) => windows.per_delivery_us(0, t.received),
        None => cpu_s.filter(|_| t.received > 0 && args.also_targets.is_empty()).map(|c| c * 1e6 / t.received as f64),
    };
    extra.insert("server_cpu_us_per_delivery".into(), json!(cpu_us_per_delivery));
    extra.insert("wire_bytes_per_delivery".into(), json!(lanes[0].bytes_per_delivery(t)));
    extra.insert("subscribers_deflated".into(), json!(t.deflated));
    if args.compression == Compression::Deflate {
        criteria.push(Criterion::all_deflated("", t));
    }
    if let (Some(r), Some(g)) = (lanes.get(1), &reference_group) {
        let main = reference::Measured { cpu_us: cpu_us_per_delivery, bytes: lanes[0].bytes_per_delivery(t) };
        let bounds = reference::Bounds { cpu: args.max_ratio, bytes: args.max_bytes_ratio };
        let c = reference::compare(r, &windows, main, &g.tally, subs as u64, bursts, bounds);
        criteria.extend(c.criteria);
        extra.insert("reference".into(), c.extra);
    }
    let cs = merged.connect.summary();
    extra.insert("subscribe_ms_p50".into(), json!(cs.p50));
    extra.insert("subscribe_ms_p99".into(), json!(cs.p99));
    extra.insert("subscribe_ms_max".into(), json!(cs.max));
    extra.insert("bursts".into(), serde_json::to_value(&plan).unwrap_or(Value::Null));
    let (before, connected) = (mem_before.map(|m| m.rss), mem_connected.map(|m| m.rss));
    let rss_per_conn = if compared {
        (None, Some("--reference: two transports' connections share the server; no per-connection figure".to_string()))
    } else if args.also_targets.is_empty() {
        rss_per_connection(before, connected, established)
    } else {
        (None, Some("--server-pid samples one node of several: no per-delivery or per-connection figure".to_string()))
    };
    let mut params = json!({
        "subs": subs, "period_s": args.period, "bursts": bursts, "channel": args.channel,
        "format": args.format, "procs": configs.len(), "target": args.common.target,
        "also_targets": args.also_targets,
        "transport": args.transport, "max_p99_ms": max_p99_ms, "max_publish_late_ms": max_late_ms,
        "compression": args.compression, "delta": args.delta, "doc_bytes": args.doc_bytes,
    });
    if let Some(r) = args.reference {
        params["reference"] = json!(r);
        params["reference_compression"] = json!(args.reference_compression);
        params["reference_delta"] = json!(args.reference_delta);
        params["max_ratio"] = json!(args.max_ratio);
        params["max_bytes_ratio"] = json!(args.max_bytes_ratio);
    }
    let result = BenchResult::builder("broadcast", params, started)
        .measured(span_us as f64 / 1e6, connections, messages, t.received as f64 * 1e6 / span_us as f64)
        .latency(latency)
        .server(cpu_s, mem_end.map(|m| m.hwm))
        .rss_sampled(before, connected)
        .rss_per_connection(rss_per_conn)
        .procs(configs.len())
        .load_generator_rss(merged.rss_peak_bytes)
        .errors(&t.errors)
        .criteria(criteria)
        .extra(extra)
        .build();
    Ok(Outcome { result, latency: merged.latency, bursts: plan })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_search_chart_has_every_step_and_the_period() {
        let p = |x: f64, y: Option<f64>, ok: bool| Point { x, y, ok };
        let c =
            search_chart(vec![p(500.0, Some(40.0), true), p(1000.0, Some(90.0), true), p(2000.0, None, false)], 0.5);
        assert_eq!(c.reference, Some((500.0, "period 0.5 s".into())));
        let svg = c.svg();
        for label in [">500<", ">1000<", ">2000<", "period 0.5 s", "× no value"] {
            assert!(svg.contains(label), "{label}");
        }
    }
}
