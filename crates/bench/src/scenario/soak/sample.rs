//! What a soak samples of the server, and the drift arithmetic that judges it.
//!
//! A [`Sample`] is taken every `--sample` seconds: the server's resident memory
//! (`/proc/PID/status`, with `--server-pid`), two gauges of `GET /metrics` —
//! `switchboard_channels` (hub entries: channels with local subscribers) and
//! `switchboard_broker_channels` (channels the broker holds; only brokers that count their
//! channels report it) — and, with `--redis`, the key count (`DBSIZE`) of every Redis named,
//! summed. A figure that could not be read is `None`: a sample never makes a value up.
//!
//! [`drift`] compares every sample from the warm-up on with the first of them (the baseline).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchboard_client::HttpApi;

use crate::probe::ProcessProbe;

/// Longest a sample's `/metrics` request or one `DBSIZE` may take.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);

/// One sample of the server's state; `t_s` counts from the start of the load phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub t_s: f64,
    pub rss_bytes: Option<u64>,
    pub hub_channels: Option<u64>,
    pub broker_channels: Option<u64>,
    pub redis_keys: Option<u64>,
}

/// The value of the gauge `name` in a Prometheus text exposition, summed over its label sets;
/// `None` when the exposition does not carry it.
pub fn gauge(text: &str, name: &str) -> Option<u64> {
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
        if &line[..end] != name {
            continue;
        }
        // The value follows the name and its labels (which may contain spaces inside quotes).
        let rest = match line[end..].strip_prefix('{') {
            Some(labels) => labels.rsplit_once('}').map(|(_, v)| v).unwrap_or(""),
            None => &line[end..],
        };
        let Some(v) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        if v.is_finite() && v >= 0.0 {
            *found.get_or_insert(0) += v as u64;
        }
    }
    found
}

/// One Redis whose keys are counted; the connection is opened on first use and again after
/// an error.
struct RedisCounter {
    url: String,
    client: redis::Client,
    conn: Option<redis::aio::MultiplexedConnection>,
}

impl RedisCounter {
    async fn dbsize(&mut self) -> Result<u64, String> {
        let attempt = async {
            let conn = match &mut self.conn {
                Some(c) => c,
                None => self.conn.insert(self.client.get_multiplexed_async_connection().await?),
            };
            redis::cmd("DBSIZE").query_async::<u64>(conn).await
        };
        match tokio::time::timeout(SAMPLE_TIMEOUT, attempt).await {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => {
                self.conn = None;
                Err(format!("DBSIZE {}: {e}", self.url))
            }
            Err(_) => {
                self.conn = None;
                Err(format!("DBSIZE {}: no answer within {} s", self.url, SAMPLE_TIMEOUT.as_secs()))
            }
        }
    }
}

/// Takes [`Sample`]s of one server.
pub struct Sampler {
    api: HttpApi,
    probe: Option<ProcessProbe>,
    redis: Vec<RedisCounter>,
    /// The first few distinct reasons a figure could not be read.
    pub errors: Vec<String>,
}

impl Sampler {
    /// `redis` is the `--redis` list, comma-separated URLs (empty: none). Bad URLs are an
    /// error here, before the run starts.
    pub fn new(api: HttpApi, probe: Option<ProcessProbe>, redis: &str) -> anyhow::Result<Sampler> {
        let redis = redis_urls(redis)
            .into_iter()
            .map(|url| {
                let client = redis::Client::open(url.as_str()).map_err(|e| anyhow::anyhow!("--redis {url}: {e}"))?;
                Ok(RedisCounter { url, client, conn: None })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Sampler { api, probe, redis, errors: Vec::new() })
    }

    /// Whether `--redis` named any server.
    pub fn counts_redis_keys(&self) -> bool {
        !self.redis.is_empty()
    }

    fn note(&mut self, e: String) {
        if self.errors.len() < crate::accounting::MAX_ERRORS && !self.errors.contains(&e) {
            self.errors.push(e);
        }
    }

    /// One sample, stamped `t_s`.
    pub async fn sample(&mut self, t_s: f64) -> Sample {
        let mut s = Sample { t_s, ..Sample::default() };
        if let Some(p) = self.probe {
            match p.memory() {
                Ok(m) => s.rss_bytes = Some(m.rss),
                Err(e) => self.note(format!("server memory (pid {}): {e}", p.pid)),
            }
        }
        let metrics = tokio::time::timeout(SAMPLE_TIMEOUT, self.api.request("GET", "/metrics", None)).await;
        match metrics {
            Ok(Ok(r)) if (200..300).contains(&r.status) => {
                let text = String::from_utf8_lossy(&r.body);
                s.hub_channels = gauge(&text, "switchboard_channels");
                s.broker_channels = gauge(&text, "switchboard_broker_channels");
            }
            Ok(Ok(r)) => self.note(format!("GET /metrics: HTTP {}", r.status)),
            Ok(Err(e)) => self.note(format!("GET /metrics: {e}")),
            Err(_) => self.note(format!("GET /metrics: no answer within {} s", SAMPLE_TIMEOUT.as_secs())),
        }
        if !self.redis.is_empty() {
            // The sum only when every server answered: a partial sum would look like a drop.
            let mut sum = Some(0u64);
            let mut errors = Vec::new();
            for r in &mut self.redis {
                match r.dbsize().await {
                    Ok(n) => sum = sum.map(|s| s + n),
                    Err(e) => {
                        sum = None;
                        errors.push(e);
                    }
                }
            }
            for e in errors {
                self.note(e);
            }
            s.redis_keys = sum;
        }
        s
    }
}

/// The URLs of a comma-separated `--redis` list.
pub fn redis_urls(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|u| !u.is_empty()).map(String::from).collect()
}

// ---------------------------------------------------------------------------------------------
// Drift.

/// How far one figure moved from its baseline over the samples after warm-up.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Drift {
    /// The first sample at or after the warm-up: `(t_s, value)`; `None` when there is no such
    /// sample or it lacks the figure.
    pub baseline: Option<(f64, u64)>,
    /// Samples from the baseline on (the baseline included).
    pub checked: usize,
    /// Of those, samples without the figure.
    pub missing: usize,
    /// The sample farthest from the baseline: `(t_s, value, signed % of the baseline)`.
    pub worst: Option<(f64, u64, f64)>,
}

/// Signed percentage of `v` over `base`; a baseline of zero makes any other value infinitely
/// far.
pub fn pct(base: u64, v: u64) -> f64 {
    if base == 0 {
        return if v == 0 { 0.0 } else { f64::INFINITY };
    }
    (v as f64 - base as f64) * 100.0 / base as f64
}

/// The drift of the figure `value` of `samples` after `warmup_s`.
pub fn drift(samples: &[Sample], warmup_s: f64, value: impl Fn(&Sample) -> Option<u64>) -> Drift {
    let mut d = Drift::default();
    let Some(first) = samples.iter().position(|s| s.t_s >= warmup_s) else { return d };
    d.baseline = value(&samples[first]).map(|v| (samples[first].t_s, v));
    for s in &samples[first..] {
        d.checked += 1;
        let Some(v) = value(s) else {
            d.missing += 1;
            continue;
        };
        if let Some((_, base)) = d.baseline {
            let p = pct(base, v);
            if d.worst.is_none_or(|(_, _, w)| p.abs() > w.abs()) {
                d.worst = Some((s.t_s, v, p));
            }
        }
    }
    d
}

impl Drift {
    /// Every sample after warm-up has the figure, within `max_pct` % of the baseline.
    pub fn within(&self, max_pct: f64) -> bool {
        self.baseline.is_some()
            && self.missing == 0
            && self.checked > 0
            && self.worst.is_some_and(|(_, _, p)| p.abs() <= max_pct)
    }

    /// What was observed, for the criterion; `unit` renders a value.
    pub fn observed(&self, warmup_s: f64, unit: impl Fn(u64) -> String) -> String {
        let Some((t0, base)) = self.baseline else {
            return if self.checked == 0 {
                format!("no sample at or after the warm-up ({warmup_s:.0} s)")
            } else {
                format!("not sampled at the end of the warm-up ({warmup_s:.0} s)")
            };
        };
        let mut s = format!("baseline {} at {t0:.0} s; {} samples from then", unit(base), self.checked);
        if let Some((t, v, p)) = self.worst {
            s.push_str(&format!(", farthest {} at {t:.0} s ({p:+.1} %)", unit(v)));
        }
        if self.missing > 0 {
            s.push_str(&format!(", {} without a value", self.missing));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soak_reads_gauges_from_prometheus_text() {
        let text = "# HELP switchboard_channels Channels with local subscribers.\n\
                    # TYPE switchboard_channels gauge\n\
                    switchboard_channels 1050\n\
                    switchboard_channels_forgotten_total 77\n\
                    switchboard_broker_channels{shard=\"a b\"} 3000\n\
                    switchboard_broker_channels{shard=\"c\"} 12\n";
        assert_eq!(gauge(text, "switchboard_channels"), Some(1050), "not the _forgotten_total counter");
        assert_eq!(gauge(text, "switchboard_broker_channels"), Some(3012), "label sets add up");
        assert_eq!(gauge(text, "switchboard_connections"), None, "an absent gauge is None, not 0");
        assert_eq!(gauge("switchboard_channels 2.5e3\n", "switchboard_channels"), Some(2500));
        assert_eq!(gauge("switchboard_channels NaN\n", "switchboard_channels"), None);
        assert_eq!(redis_urls(" redis://a:1, ,redis://b:2/3 "), ["redis://a:1", "redis://b:2/3"]);
        assert!(redis_urls("").is_empty());
    }

    fn samples(values: &[(f64, Option<u64>)]) -> Vec<Sample> {
        values.iter().map(|&(t_s, v)| Sample { t_s, rss_bytes: v, ..Sample::default() }).collect()
    }

    #[test]
    fn soak_drift_is_measured_from_the_first_sample_after_warmup() {
        // Growth during warm-up does not count; after it, the farthest sample is 8 % below.
        let s = samples(&[(0.0, Some(10)), (10.0, Some(90)), (20.0, Some(100)), (30.0, Some(105)), (40.0, Some(92))]);
        let d = drift(&s, 20.0, |s| s.rss_bytes);
        assert_eq!(d.baseline, Some((20.0, 100)));
        assert_eq!((d.checked, d.missing), (3, 0));
        assert_eq!(d.worst, Some((40.0, 92, -8.0)));
        assert!(d.within(10.0) && d.within(8.0));
        assert!(!d.within(7.9));
        assert!(!d.within(0.0));
        // The first sample *at or after* the warm-up is the baseline, even if taken late.
        let d = drift(&s, 15.0, |s| s.rss_bytes);
        assert_eq!(d.baseline, Some((20.0, 100)));
        // A flat figure stays within even a zero bound.
        let flat = drift(&samples(&[(0.0, Some(7)), (1.0, Some(7))]), 0.0, |s| s.rss_bytes);
        assert!(flat.within(0.0));
        assert_eq!(flat.worst, Some((0.0, 7, 0.0)));
        let o = d.observed(15.0, |v| format!("{v} B"));
        assert_eq!(o, "baseline 100 B at 20 s; 3 samples from then, farthest 92 B at 40 s (-8.0 %)");
    }

    #[test]
    fn soak_drift_fails_when_a_figure_is_missing_or_grows_from_zero() {
        // A sample after warm-up without the figure (the server gone, the gauge absent) is not
        // a pass, whatever the others say.
        let d = drift(&samples(&[(0.0, Some(100)), (5.0, None), (10.0, Some(100))]), 0.0, |s| s.rss_bytes);
        assert_eq!((d.checked, d.missing), (3, 1));
        assert!(!d.within(10.0));
        assert!(d.observed(0.0, |v| v.to_string()).ends_with("1 without a value"));
        // No baseline: the warm-up outlasted the samples, or the baseline sample lacks it.
        let none = drift(&samples(&[(0.0, Some(1))]), 5.0, |s| s.rss_bytes);
        assert_eq!((none.baseline, none.checked), (None, 0));
        assert!(!none.within(100.0));
        assert_eq!(none.observed(5.0, |v| v.to_string()), "no sample at or after the warm-up (5 s)");
        let late = drift(&samples(&[(5.0, None), (6.0, Some(1))]), 5.0, |s| s.rss_bytes);
        assert!(late.baseline.is_none() && !late.within(100.0));
        assert_eq!(late.observed(5.0, |v| v.to_string()), "not sampled at the end of the warm-up (5 s)");
        // Growth from an empty baseline is unbounded.
        let grew = drift(&samples(&[(0.0, Some(0)), (1.0, Some(3))]), 0.0, |s| s.rss_bytes);
        assert!(!grew.within(1e9));
        assert_eq!(pct(0, 0), 0.0);
        assert_eq!(pct(200, 230), 15.0);
        assert_eq!(pct(200, 180), -10.0);
    }
}
