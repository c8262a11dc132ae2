//! What a soak observed, judged: the criteria, `result.json` and the `soak.svg` chart.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::load::PublishLog;
use super::plan::Plan;
use super::sample::{drift, pct, Drift, Sample};
use super::SoakArgs;
use crate::accounting::MessageCounts;
use crate::chart::{Panel, Point, Series, TimeChart};
use crate::histogram::Latency;
use crate::report::{rss_per_connection, standard_criteria, BenchResult, Connections, Criterion};
use crate::worker::Merged;

/// Everything the coordinator saw.
pub struct Observed {
    pub started_us: u64,
    /// Length of the load phase.
    pub load_s: f64,
    pub plan: Plan,
    /// The held subscribers' merged results.
    pub held: Merged,
    /// The churn workers' merged results: established = succeeded.
    pub churn: Merged,
    pub churn_total: u64,
    pub churn_procs: usize,
    pub hold_procs: usize,
    pub feed: PublishLog,
    pub rooms: PublishLog,
    pub samples: Vec<Sample>,
    pub sampler_errors: Vec<String>,
    pub counts_redis_keys: bool,
    pub cpu_s: Option<f64>,
    pub rss_before: Option<u64>,
    pub rss_connected: Option<u64>,
    pub rss_peak: Option<u64>,
    pub established_at_start: u64,
}

/// Which sampled figure stands for the server's channel count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelFigure {
    /// `switchboard_broker_channels`, whenever the server reports it.
    Broker,
    /// The Redis key count, when the server does not report its broker's channels.
    RedisKeys,
}

impl ChannelFigure {
    /// The broker's gauge if any sample carries it, else the Redis keys if they were sampled.
    pub fn choose(samples: &[Sample], counts_redis_keys: bool) -> Option<ChannelFigure> {
        if samples.iter().any(|s| s.broker_channels.is_some()) {
            Some(ChannelFigure::Broker)
        } else if counts_redis_keys {
            Some(ChannelFigure::RedisKeys)
        } else {
            None
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            ChannelFigure::Broker => "broker_channels",
            ChannelFigure::RedisKeys => "redis_keys",
        }
    }

    pub fn value(self, s: &Sample) -> Option<u64> {
        match self {
            ChannelFigure::Broker => s.broker_channels,
            ChannelFigure::RedisKeys => s.redis_keys,
        }
    }

    fn what(self) -> &'static str {
        match self {
            ChannelFigure::Broker => "channels the broker holds (switchboard_broker_channels)",
            ChannelFigure::RedisKeys => "Redis keys (DBSIZE)",
        }
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / 1048576.0)
}

/// The drift criteria: server RSS, and the channel count.
pub fn drift_criteria(
    samples: &[Sample],
    warmup_s: f64,
    max_pct: f64,
    rss_sampled: bool,
    figure: Option<ChannelFigure>,
) -> Vec<Criterion> {
    let rss_check = format!("server RSS within ±{max_pct}% of its value after the warm-up");
    let rss = if rss_sampled {
        let d = drift(samples, warmup_s, |s| s.rss_bytes);
        Criterion::new(rss_check, d.within(max_pct), d.observed(warmup_s, mib))
    } else {
        Criterion::new(rss_check, false, "not sampled: no --server-pid")
    };
    let channels = match figure {
        Some(f) => {
            let d = drift(samples, warmup_s, |s| f.value(s));
            Criterion::new(
                format!("{} within ±{max_pct}% of the count after the warm-up", f.what()),
                d.within(max_pct),
                d.observed(warmup_s, |v| v.to_string()),
            )
        }
        None => Criterion::new(
            format!("channel count within ±{max_pct}% of the count after the warm-up"),
            false,
            "not observed: the server reports no switchboard_broker_channels gauge and no --redis was given",
        ),
    };
    vec![rss, channels]
}

fn drift_json(d: &Drift) -> Value {
    json!(d.worst.map(|(_, _, p)| p).filter(|p| p.is_finite()))
}

/// The `redis://` URLs of `--redis` without their passwords, for `params`.
pub fn redact(list: &str) -> String {
    super::sample::redis_urls(list)
        .iter()
        .map(|u| {
            let Some((scheme, rest)) = u.split_once("://") else { return u.clone() };
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
                None => u.clone(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The run's result (not yet decided) and latency histogram; writes `soak.svg` into `out`.
pub fn result(args: &SoakArgs, o: Observed, out: &Path) -> anyhow::Result<(BenchResult, Latency)> {
    let t = &o.held.tally;
    let c = &o.churn.tally;
    let subs = o.plan.subs as u64;
    let connections = Connections {
        target: subs,
        established: t.established,
        failed: t.failed + subs.saturating_sub(t.established + t.failed),
    };
    let expected = o.plan.expected(&o.feed.accepted);
    let messages = MessageCounts::from_tally(o.feed.accepted_total(), expected, t);
    let mut criteria = standard_criteria(&connections, t.dropped, &messages);
    let refused = o.feed.refused + o.rooms.refused;
    criteria.push(Criterion::new(
        "no publish refused",
        refused == 0,
        format!(
            "{} point updates and {} new channels accepted, {refused} refused",
            o.feed.accepted_total(),
            o.rooms.accepted_total()
        ),
    ));
    let skipped = o.feed.skipped + o.rooms.skipped;
    criteria.push(Criterion::new(
        "every scheduled publish round ran within the run",
        skipped == 0,
        format!(
            "{} of {} feed rounds and {} of {} new-channel rounds ran",
            o.feed.rounds,
            o.feed.rounds + o.feed.skipped,
            o.rooms.rounds,
            o.rooms.rounds + o.rooms.skipped
        ),
    ));
    let reasons: Vec<String> = c.failure_reasons.iter().map(|(r, n)| format!("{n} × {r}")).collect();
    criteria.push(Criterion::new(
        "every churn connection succeeded",
        c.established == o.churn_total && c.failed == 0 && o.churn.missing == 0,
        format!(
            "{} of {} succeeded, {} failed{}",
            c.established,
            o.churn_total,
            c.failed,
            if reasons.is_empty() { String::new() } else { format!(": {}", reasons.join("; ")) }
        ),
    ));
    let missing = o.held.missing + o.churn.missing;
    criteria.push(Criterion::workers_reported(missing));
    let figure = ChannelFigure::choose(&o.samples, o.counts_redis_keys);
    let rss_sampled = args.common.server_pid.is_some();
    criteria.extend(drift_criteria(&o.samples, args.warmup, args.max_drift_pct, rss_sampled, figure));

    let rss_drift = drift(&o.samples, args.warmup, |s| s.rss_bytes);
    let channel_drift = figure.map(|f| drift(&o.samples, args.warmup, |s| f.value(s)));
    let baseline = o.samples.iter().find(|s| s.t_s >= args.warmup);
    let mut extra = Map::new();
    extra.insert("churn_procs".into(), json!(o.churn_procs));
    extra.insert("subscriptions".into(), json!(o.plan.subs * o.plan.points_per_sub));
    extra.insert("samples".into(), serde_json::to_value(&o.samples)?);
    extra.insert("baseline".into(), serde_json::to_value(baseline)?);
    extra.insert("channel_figure".into(), json!(figure.map(ChannelFigure::key)));
    extra.insert("rss_drift_max_pct".into(), drift_json(&rss_drift));
    extra.insert("channels_drift_max_pct".into(), channel_drift.as_ref().map(drift_json).unwrap_or(Value::Null));
    extra.insert("point_updates_published".into(), json!(o.feed.accepted_total()));
    extra.insert("new_channels_published".into(), json!(o.rooms.accepted_total()));
    extra.insert("publish_refused".into(), json!(refused));
    extra.insert("feed_late_ms_max".into(), json!(o.feed.late_max_us as f64 / 1000.0));
    extra.insert("new_channels_late_ms_max".into(), json!(o.rooms.late_max_us as f64 / 1000.0));
    extra.insert("churn_target".into(), json!(o.churn_total));
    extra.insert("churn_succeeded".into(), json!(c.established));
    extra.insert("churn_failed".into(), json!(c.failed));
    if !c.failure_reasons.is_empty() {
        extra.insert("churn_failure_reasons".into(), serde_json::to_value(&c.failure_reasons)?);
    }
    let cs = o.churn.connect.summary();
    extra.insert("churn_ms_p50".into(), json!(cs.p50));
    extra.insert("churn_ms_p99".into(), json!(cs.p99));
    let ss = o.held.connect.summary();
    extra.insert("subscribe_ms_p50".into(), json!(ss.p50));
    extra.insert("subscribe_ms_p99".into(), json!(ss.p99));
    let errors: Vec<&String> = t
        .errors
        .iter()
        .chain(&c.errors)
        .chain(&o.feed.errors)
        .chain(&o.rooms.errors)
        .chain(&o.sampler_errors)
        .collect();

    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("soak.svg"), chart(&o.samples, args, figure).svg())?;

    let load_s = o.load_s.max(1e-9);
    let params = json!({
        "subs": o.plan.subs, "points": o.plan.points.count, "points_per_sub": o.plan.points_per_sub,
        "prefix": o.plan.points.prefix, "hz": args.hz, "new_channels": args.new_channels, "churn": args.churn,
        "duration_s": args.duration_s(), "warmup_s": args.warmup, "sample_s": args.sample,
        "max_drift_pct": args.max_drift_pct, "churn_timeout_s": args.churn_timeout,
        "redis": args.redis.as_deref().map(redact), "procs": o.hold_procs, "target": args.common.target,
    });
    let result = BenchResult::builder("soak", params, o.started_us)
        .measured(o.load_s, connections, messages, t.received as f64 / load_s)
        .latency(o.held.latency.summary())
        .server(o.cpu_s, o.rss_peak)
        .rss_sampled(o.rss_before, o.rss_connected)
        .rss_per_connection(rss_per_connection(o.rss_before, o.rss_connected, o.established_at_start))
        .procs(o.hold_procs)
        .load_generator_rss(o.held.rss_peak_bytes + o.churn.rss_peak_bytes)
        .errors(&errors)
        .criteria(criteria)
        .extra(extra)
        .build();
    Ok((result, o.held.latency))
}

/// One figure of a [`Sample`].
type Figure = fn(&Sample) -> Option<u64>;

/// `soak.svg`: RSS (MiB) above, channel counts below, over time; the warm-up shaded, the
/// judged figures' allowed band dashed and their samples outside it red.
pub fn chart(samples: &[Sample], args: &SoakArgs, figure: Option<ChannelFigure>) -> TimeChart {
    let max = args.max_drift_pct;
    let series = |name: &str, value: &dyn Fn(&Sample) -> Option<u64>, judged: bool, scale: f64| {
        let d = drift(samples, args.warmup, value);
        let points = samples
            .iter()
            .map(|s| {
                let v = value(s);
                let out = judged
                    && s.t_s >= args.warmup
                    && match (d.baseline, v) {
                        (Some((_, b)), Some(v)) => pct(b, v).abs() > max,
                        _ => false,
                    };
                Point { x: s.t_s, y: v.map(|v| v as f64 / scale), ok: !out }
            })
            .collect();
        let band = d.baseline.filter(|_| judged).map(|(_, b)| {
            let b = b as f64 / scale;
            (b * (1.0 - max / 100.0), b * (1.0 + max / 100.0), format!("baseline ±{max}%"))
        });
        (Series { name: name.into(), points }, band)
    };
    let (rss, rss_band) = series("server RSS", &|s: &Sample| s.rss_bytes, true, 1048576.0);
    let mut channel_series = Vec::new();
    let mut channel_band = None;
    let figures: [(&str, Figure, Option<ChannelFigure>); 3] = [
        ("broker channels", |s| s.broker_channels, Some(ChannelFigure::Broker)),
        ("redis keys", |s| s.redis_keys, Some(ChannelFigure::RedisKeys)),
        ("hub channels", |s| s.hub_channels, None),
    ];
    for (name, value, which) in figures {
        if samples.iter().all(|s| value(s).is_none()) {
            continue;
        }
        let judged = which.is_some() && which == figure;
        let (s, band) = series(name, &value, judged, 1.0);
        channel_series.push(s);
        if judged {
            channel_band = band;
        }
    }
    TimeChart {
        title: format!("soak: {} subscribers, {} new channels/s, churn {}/s", args.subs, args.new_channels, args.churn),
        x_label: "time since the load started (s)".into(),
        x_max: args.duration_s(),
        panels: vec![
            Panel { y_label: "RSS (MiB)".into(), series: vec![rss], band: rss_band },
            Panel { y_label: "channels / keys".into(), series: channel_series, band: channel_band },
        ],
        warmup: Some(args.warmup),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t_s: f64, rss: u64, broker: Option<u64>, redis: Option<u64>) -> Sample {
        Sample { t_s, rss_bytes: Some(rss), hub_channels: Some(50), broker_channels: broker, redis_keys: redis }
    }

    #[test]
    fn soak_channel_figure_prefers_the_broker_gauge() {
        let with_gauge = [s(0.0, 1, Some(10), Some(99)), s(1.0, 1, None, Some(99))];
        assert_eq!(ChannelFigure::choose(&with_gauge, true), Some(ChannelFigure::Broker));
        let without = [s(0.0, 1, None, Some(99))];
        assert_eq!(ChannelFigure::choose(&without, true), Some(ChannelFigure::RedisKeys));
        assert_eq!(ChannelFigure::choose(&without, false), None);
    }

    #[test]
    fn soak_drift_criteria_report_what_they_saw() {
        // RSS flat; the broker's channels grow 50 % after warm-up.
        let samples = [s(0.0, 100, Some(10), None), s(10.0, 100, Some(100), None), s(20.0, 104, Some(150), None)];
        let c = drift_criteria(&samples, 10.0, 10.0, true, Some(ChannelFigure::Broker));
        assert_eq!(c.iter().map(|c| c.ok).collect::<Vec<_>>(), [true, false]);
        assert!(c[1].check.contains("switchboard_broker_channels"), "{}", c[1].check);
        assert_eq!(c[1].observed, "baseline 100 at 10 s; 2 samples from then, farthest 150 at 20 s (+50.0 %)");
        // Nothing to judge the channels by, and no --server-pid: both fail as unobserved.
        let c = drift_criteria(&samples, 10.0, 10.0, false, None);
        assert!(c.iter().all(|c| !c.ok));
        assert!(c[0].observed.contains("--server-pid") && c[1].observed.contains("not observed"));
    }

    #[test]
    fn soak_redacts_redis_passwords() {
        assert_eq!(redact("redis://:pw@h:1/0, redis://h2:2"), "redis://***@h:1/0,redis://h2:2");
        assert_eq!(redact("rediss://user:p@ss@h:6380"), "rediss://***@h:6380");
        assert_eq!(redact("h:1"), "h:1");
    }
}
