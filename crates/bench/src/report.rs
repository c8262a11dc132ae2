//! The run report: `result.json` (SPEC §8 schema), `result.csv`, the latency chart and the
//! summary table on stdout.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::accounting::{MessageCounts, Tally};
use crate::chart;
use crate::common::rfc3339;
use crate::histogram::{Latency, LatencySummary};
use crate::progress::Progress;

/// `result.json`. Field names and nesting are the contract of SPEC §8; anything a scenario
/// wants to add goes under `extra`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub scenario: String,
    pub params: Value,
    /// Start of the run, RFC 3339 UTC.
    pub started: String,
    pub duration_s: f64,
    pub connections: Connections,
    pub messages: MessageCounts,
    pub throughput: Throughput,
    pub latency_ms: LatencySummary,
    pub server: ServerStats,
    /// True only if every criterion was observed to hold.
    pub pass: bool,
    pub criteria: Vec<Criterion>,
    #[serde(default)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connections {
    pub target: u64,
    pub established: u64,
    pub failed: u64,
}

impl Connections {
    /// `target` connections of which `established` came up and `failed` were refused: the ones
    /// that never settled either way count as failed too.
    pub fn settled(target: u64, established: u64, failed: u64) -> Connections {
        Connections { target, established, failed: failed + target.saturating_sub(established + failed) }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    pub deliveries_per_s: f64,
}

/// Server-side cost; `null` where nothing was sampled (no `--server-pid`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerStats {
    /// CPU seconds of the measured phase.
    pub cpu_s: Option<f64>,
    pub rss_peak_bytes: Option<u64>,
    /// (RSS after all connections were up − RSS before) / established connections.
    pub rss_per_connection_bytes: Option<f64>,
}

/// `(RSS after connecting − RSS before) / connections`, or `None` with the reason when the
/// figure would be meaningless: RSS that fell while connecting means memory from earlier load
/// was being returned to the OS at the same time, which hides what the connections cost.
pub fn rss_per_connection(before: Option<u64>, after: Option<u64>, conns: u64) -> (Option<f64>, Option<String>) {
    match (before, after) {
        (Some(b), Some(a)) if conns > 0 && a >= b => (Some((a - b) as f64 / conns as f64), None),
        (Some(b), Some(a)) if conns > 0 => (
            None,
            Some(format!(
                "server RSS fell from {b} to {a} bytes while connecting (memory of earlier load being \
                 returned); run against a freshly started server for a per-connection figure"
            )),
        ),
        _ => (None, None),
    }
}

/// One pass/fail check and what was observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Criterion {
    pub check: String,
    pub ok: bool,
    pub observed: String,
}

impl Criterion {
    pub fn new(check: impl Into<String>, ok: bool, observed: impl Into<String>) -> Self {
        Criterion { check: check.into(), ok, observed: observed.into() }
    }

    /// Every worker process sent its final report (`missing` did not).
    pub fn workers_reported(missing: usize) -> Self {
        Criterion::new("every worker reported", missing == 0, format!("{missing} missing"))
    }

    /// Every connection of `t` that was established negotiated permessage-deflate: a run that
    /// measures compression fails where the server declined it. `whose`: "" or "reference ".
    pub fn all_deflated(whose: &str, t: &Tally) -> Self {
        Criterion::new(
            format!("every {whose}subscriber negotiated permessage-deflate"),
            t.deflated == t.established,
            format!("{} of {}", t.deflated, t.established),
        )
    }
}

/// The checks every scenario applies: all connections up, none dropped, nothing lost or
/// duplicated.
pub fn standard_criteria(conns: &Connections, dropped: u64, m: &MessageCounts) -> Vec<Criterion> {
    vec![
        Criterion::new(
            "every connection established",
            conns.failed == 0 && conns.established == conns.target,
            format!("{}/{} established, {} failed", conns.established, conns.target, conns.failed),
        ),
        Criterion::new("no connection dropped during the run", dropped == 0, format!("{dropped} dropped")),
        Criterion::new(
            "no message lost",
            m.lost == 0 && m.received >= m.expected,
            format!("{} of {} lost", m.lost, m.expected),
        ),
        Criterion::new("no message duplicated", m.duplicated == 0, format!("{} duplicated", m.duplicated)),
    ]
}

/// The checks of a paced scenario (a publisher working to a schedule) that make "loss-free but
/// late" a failure: the publisher kept its schedule — no round started more than `max_late_ms`
/// after its scheduled time — and the delivery p99 stayed within `max_p99_ms`.
pub fn pace_criteria(
    publish_late_max_ms: f64,
    max_late_ms: f64,
    p99_ms: Option<f64>,
    max_p99_ms: f64,
) -> Vec<Criterion> {
    vec![
        Criterion::new(
            format!("publisher kept its schedule (no round started over {max_late_ms:.0} ms late)"),
            publish_late_max_ms <= max_late_ms,
            format!("latest round started {publish_late_max_ms:.1} ms after its schedule"),
        ),
        p99_criterion(p99_ms, max_p99_ms),
    ]
}

/// Delivery p99 within `max_p99_ms`; a run with no latency samples fails it.
pub fn p99_criterion(p99_ms: Option<f64>, max_p99_ms: f64) -> Criterion {
    Criterion::new(
        format!("delivery p99 ≤ {max_p99_ms:.0} ms"),
        p99_ms.is_some_and(|p| p <= max_p99_ms),
        match p99_ms {
            Some(p) => format!("p99 {p:.1} ms"),
            None => "no deliveries measured".into(),
        },
    )
}

/// The one assembly of a [`BenchResult`] that every scenario ends with. A scenario gives what
/// it measured, its criteria and its own extras; the figures that all runs report alike (server
/// CPU and peak RSS, the RSS per connection or why there is none, worker processes, the load
/// generator's memory, errors) go under the same `extra` names every time. `pass` is left
/// false until [`BenchResult::conclude`] decides it.
#[derive(Debug)]
#[must_use]
pub struct ResultBuilder {
    result: BenchResult,
}

impl ResultBuilder {
    /// The measured phase: its length, connections, messages and delivery rate.
    pub fn measured(mut self, duration_s: f64, connections: Connections, messages: MessageCounts, per_s: f64) -> Self {
        self.result.duration_s = duration_s;
        self.result.connections = connections;
        self.result.messages = messages;
        self.result.throughput = Throughput { deliveries_per_s: per_s };
        self
    }

    pub fn latency(mut self, latency: LatencySummary) -> Self {
        self.result.latency_ms = latency;
        self
    }

    pub fn criteria(mut self, criteria: Vec<Criterion>) -> Self {
        self.result.criteria = criteria;
        self
    }

    /// The scenario's own figures.
    pub fn extra(mut self, extra: Map<String, Value>) -> Self {
        self.result.extra.extend(extra);
        self
    }

    /// Server CPU seconds of the measured phase and peak RSS (`None`: not sampled).
    pub fn server(mut self, cpu_s: Option<f64>, rss_peak_bytes: Option<u64>) -> Self {
        self.result.server.cpu_s = cpu_s;
        self.result.server.rss_peak_bytes = rss_peak_bytes;
        self
    }

    /// The server's RSS before connecting and once connected (`rss_before_bytes`,
    /// `rss_connected_bytes`).
    pub fn rss_sampled(mut self, before: Option<u64>, connected: Option<u64>) -> Self {
        self.result.extra.insert("rss_before_bytes".into(), json!(before));
        self.result.extra.insert("rss_connected_bytes".into(), json!(connected));
        self
    }

    /// The RSS per connection, or the note saying why there is none (`rss_note`); as
    /// [`rss_per_connection`] returns them.
    pub fn rss_per_connection(mut self, (per_conn, note): (Option<f64>, Option<String>)) -> Self {
        self.result.server.rss_per_connection_bytes = per_conn;
        if let Some(note) = note {
            self.result.extra.insert("rss_note".into(), json!(note));
        }
        self
    }

    /// Worker processes generating the load.
    pub fn procs(mut self, procs: usize) -> Self {
        self.result.extra.insert("procs".into(), json!(procs));
        self
    }

    /// The load generator's peak RSS, its worker processes together.
    pub fn load_generator_rss(mut self, bytes: u64) -> Self {
        self.result.extra.insert("load_generator_rss_peak_bytes".into(), json!(bytes));
        self
    }

    /// The errors seen (`errors`, left out when there are none).
    pub fn errors<E: Serialize>(mut self, errors: &[E]) -> Self {
        if !errors.is_empty() {
            self.result.extra.insert("errors".into(), json!(errors));
        }
        self
    }

    pub fn build(self) -> BenchResult {
        self.result
    }

    /// [`ResultBuilder::build`], then [`BenchResult::conclude`].
    pub fn conclude(self, latency: &Latency, out: &Path, progress: &mut Progress) -> anyhow::Result<i32> {
        self.build().conclude(latency, out, progress)
    }
}

impl BenchResult {
    /// Starts the result of a run of `scenario` with `params`, started at `started_us` (µs
    /// since the epoch).
    pub fn builder(scenario: &str, params: Value, started_us: u64) -> ResultBuilder {
        ResultBuilder {
            result: BenchResult {
                scenario: scenario.into(),
                params,
                started: rfc3339(started_us),
                duration_s: 0.0,
                connections: Connections::default(),
                messages: MessageCounts::default(),
                throughput: Throughput::default(),
                latency_ms: Latency::new().summary(),
                server: ServerStats::default(),
                pass: false,
                criteria: Vec::new(),
                extra: Map::new(),
            },
        }
    }

    /// Decides pass/fail, writes the output files, prints the summary table; returns the exit
    /// code (0 pass, 1 fail).
    pub fn conclude(mut self, latency: &Latency, out: &Path, progress: &mut Progress) -> anyhow::Result<i32> {
        self.decide();
        progress.finish_line();
        self.write(out, latency)?;
        print!("{}", self.table());
        println!("results in {}", out.display());
        Ok(if self.pass { 0 } else { 1 })
    }

    /// Sets `pass` from the criteria: all must hold, and there must be at least one.
    pub fn decide(&mut self) {
        self.pass = !self.criteria.is_empty() && self.criteria.iter().all(|c| c.ok);
    }

    /// Writes `result.json`, `result.csv` and `latency.svg` into `dir`.
    pub fn write(&self, dir: &Path, latency: &Latency) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("result.json"), json + "\n")?;
        std::fs::write(dir.join("result.csv"), self.csv())?;
        let title = format!("{} — delivery latency distribution", self.scenario);
        std::fs::write(dir.join("latency.svg"), chart::latency_svg(&title, latency))?;
        Ok(())
    }

    /// A header line and one row of every scalar in the result, flattened with dotted keys
    /// (`latency_ms.p99`), so runs can be appended into one table.
    pub fn csv(&self) -> String {
        let mut cols = Vec::new();
        // Top-level keys in schema order (a `serde_json::Map` would sort them).
        let v = |x: &dyn erased::ToValue| x.to_value();
        let top: [(&str, Value); 12] = [
            ("scenario", v(&self.scenario)),
            ("params", v(&self.params)),
            ("started", v(&self.started)),
            ("duration_s", v(&self.duration_s)),
            ("connections", v(&self.connections)),
            ("messages", v(&self.messages)),
            ("throughput", v(&self.throughput)),
            ("latency_ms", v(&self.latency_ms)),
            ("server", v(&self.server)),
            ("pass", v(&self.pass)),
            ("criteria", v(&self.criteria)),
            ("extra", v(&self.extra)),
        ];
        for (k, val) in &top {
            flatten(k, val, &mut cols);
        }
        let header: Vec<String> = cols.iter().map(|(k, _)| csv_field(k)).collect();
        let row: Vec<String> = cols.iter().map(|(_, v)| csv_field(v)).collect();
        format!("{}\n{}\n", header.join(","), row.join(","))
    }

    /// The summary table printed at the end of a run.
    pub fn table(&self) -> String {
        let f = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_else(|| "-".into());
        let l = &self.latency_ms;
        let m = &self.messages;
        let c = &self.connections;
        let mut rows: Vec<(String, String)> = vec![
            ("scenario".into(), self.scenario.clone()),
            ("duration".into(), format!("{:.1} s", self.duration_s)),
            ("connections".into(), format!("{} / {} established, {} failed", c.established, c.target, c.failed)),
            (
                "messages".into(),
                format!(
                    "sent {}, expected {}, received {}, lost {}, duplicated {}",
                    m.sent, m.expected, m.received, m.lost, m.duplicated
                ),
            ),
            ("throughput".into(), format!("{:.0} deliveries/s", self.throughput.deliveries_per_s)),
            (
                "latency ms".into(),
                format!(
                    "p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  mean {}  stdev {}",
                    f(l.p50),
                    f(l.p90),
                    f(l.p99),
                    f(l.p999),
                    f(l.max),
                    f(l.mean),
                    f(l.stdev)
                ),
            ),
        ];
        let s = &self.server;
        if s.cpu_s.is_some() || s.rss_peak_bytes.is_some() {
            rows.push((
                "server".into(),
                format!(
                    "cpu {} s, rss peak {}, rss/conn {}",
                    f(s.cpu_s),
                    s.rss_peak_bytes.map(|b| format!("{:.1} MiB", b as f64 / 1048576.0)).unwrap_or_else(|| "-".into()),
                    s.rss_per_connection_bytes.map(|b| format!("{b:.0} B")).unwrap_or_else(|| "-".into())
                ),
            ));
        }
        for (k, v) in &self.extra {
            if let Some(s) = scalar(v) {
                rows.push((k.clone(), s));
            }
        }
        for c in &self.criteria {
            rows.push((if c.ok { "  ok".into() } else { "  FAIL".into() }, format!("{}: {}", c.check, c.observed)));
        }
        rows.push(("result".into(), if self.pass { "PASS".into() } else { "FAIL".into() }));
        let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        rows.iter().map(|(k, v)| format!("{k:<w$}  {v}\n")).collect()
    }
}

mod erased {
    /// Object-safe `serde_json::to_value`, so fields of different types fit one array.
    pub trait ToValue {
        fn to_value(&self) -> serde_json::Value;
    }

    impl<T: serde::Serialize> ToValue for T {
        fn to_value(&self) -> serde_json::Value {
            serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
        }
    }
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some("-".into()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(match n.as_f64() {
            Some(x) if n.is_f64() => format!("{x:.3}"),
            _ => n.to_string(),
        }),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        // Arrays (criteria, per-burst lists) are not one scalar; keep them as compact JSON.
        Value::Array(_) => out.push((prefix.to_string(), v.to_string())),
        Value::Null => out.push((prefix.to_string(), String::new())),
        Value::String(s) => out.push((prefix.to_string(), s.clone())),
        // Numbers and booleans at full precision.
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn report_late_or_slow_paced_runs_do_not_pass() {
        let ok = |c: Vec<Criterion>| c.iter().map(|c| c.ok).collect::<Vec<_>>();
        assert_eq!(ok(pace_criteria(12.0, 500.0, Some(80.0), 500.0)), [true, true]);
        // Loss-free but late: the publisher fell behind, or deliveries took too long.
        assert_eq!(ok(pace_criteria(900.0, 500.0, Some(80.0), 500.0)), [false, true]);
        assert_eq!(ok(pace_criteria(12.0, 500.0, Some(501.0), 500.0)), [true, false]);
        assert_eq!(ok(pace_criteria(12.0, 500.0, None, 500.0)), [true, false]);
        let c = p99_criterion(Some(135.2), 100.0);
        assert_eq!((c.check.as_str(), c.observed.as_str(), c.ok), ("delivery p99 ≤ 100 ms", "p99 135.2 ms", false));
    }
    use super::*;
    use serde_json::json;

    fn sample() -> BenchResult {
        let conns = Connections { target: 10, established: 10, failed: 0 };
        let messages = MessageCounts { sent: 5, expected: 50, received: 50, lost: 0, duplicated: 0 };
        let mut h = Latency::new();
        h.record(1500);
        let mut r = BenchResult {
            scenario: "broadcast".into(),
            params: json!({"subs": 10}),
            started: "2024-01-01T00:00:00.000Z".into(),
            duration_s: 1.0,
            connections: conns,
            messages,
            throughput: Throughput { deliveries_per_s: 50.0 },
            latency_ms: h.summary(),
            server: ServerStats::default(),
            pass: false,
            criteria: standard_criteria(&conns, 0, &messages),
            extra: Map::new(),
        };
        r.decide();
        r
    }

    #[test]
    fn report_result_json_has_exactly_the_spec_keys() {
        let v = serde_json::to_value(sample()).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want = vec![
            "scenario",
            "params",
            "started",
            "duration_s",
            "connections",
            "messages",
            "throughput",
            "latency_ms",
            "server",
            "pass",
            "criteria",
            "extra",
        ];
        let mut got = keys.clone();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want);
        let sub = |k: &str| -> Vec<String> {
            let mut s: Vec<String> = v[k].as_object().unwrap().keys().cloned().collect();
            s.sort();
            s
        };
        assert_eq!(sub("connections"), ["established", "failed", "target"]);
        assert_eq!(sub("messages"), ["duplicated", "expected", "lost", "received", "sent"]);
        assert_eq!(sub("throughput"), ["deliveries_per_s"]);
        assert_eq!(sub("latency_ms"), ["max", "mean", "p50", "p90", "p99", "p999", "stdev"]);
        assert_eq!(sub("server"), ["cpu_s", "rss_peak_bytes", "rss_per_connection_bytes"]);
        assert_eq!(v["latency_ms"]["p50"], json!(1.5));
        assert_eq!(v["server"]["cpu_s"], Value::Null);
        assert_eq!(v["pass"], json!(true));
    }

    #[test]
    fn report_rss_per_connection_refuses_negative_figures() {
        assert_eq!(rss_per_connection(Some(1000), Some(5000), 4), (Some(1000.0), None));
        let (v, why) = rss_per_connection(Some(5000), Some(1000), 4);
        assert!(v.is_none() && why.is_some());
        assert_eq!(rss_per_connection(None, Some(1), 1), (None, None));
        assert_eq!(rss_per_connection(Some(1), Some(2), 0), (None, None));
    }

    #[test]
    fn report_pass_requires_every_criterion() {
        let mut r = sample();
        r.criteria.push(Criterion::new("bursts within period", false, "1 late"));
        r.decide();
        assert!(!r.pass);
        r.criteria.clear();
        r.decide();
        assert!(!r.pass, "no observed criterion is no pass");
        let lost = MessageCounts { sent: 1, expected: 2, received: 1, lost: 1, duplicated: 0 };
        let c = standard_criteria(&Connections { target: 2, established: 2, failed: 0 }, 0, &lost);
        assert!(!c.iter().all(|c| c.ok));
    }

    #[test]
    fn report_writes_json_csv_and_svg() {
        let dir = std::env::temp_dir().join(format!("sb-bench-report-{}", std::process::id()));
        let mut h = Latency::new();
        for v in [100, 200, 300, 5000] {
            h.record(v);
        }
        let r = sample();
        r.write(&dir, &h).unwrap();
        let back: BenchResult = serde_json::from_slice(&std::fs::read(dir.join("result.json")).unwrap()).unwrap();
        assert_eq!(back, r);
        let csv = std::fs::read_to_string(dir.join("result.csv")).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].starts_with("scenario,params.subs,started,duration_s,connections.established"),
            "{}",
            lines[0]
        );
        assert!(lines[1].starts_with("broadcast,10,2024-01-01T00:00:00.000Z,1.0,10,0,10,"), "{}", lines[1]);
        let svg = std::fs::read_to_string(dir.join("latency.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<polyline"));
        assert!(r.table().contains("PASS"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
