//! `bench report DIR...`: one self-contained HTML page comparing result folders side by side.
//!
//! Each folder's `result.json` becomes a column: parameters, connections, messages,
//! throughput, latency percentiles, server CPU and memory, and every pass/fail criterion with
//! what was observed. The folders' SVG charts follow, embedded as `data:` images (so the page
//! needs no other file, and an SVG cannot run script in it). Every string taken from the JSON
//! is HTML-escaped. The result files are read as plain JSON, so results of any scenario (and
//! of older versions with fewer fields) compare; a missing figure shows as "–".

use std::collections::BTreeSet;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine;
use serde_json::Value;

/// `bench report` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Result folders (each with a result.json).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(long, default_value = "bench-report.html")]
    pub out: PathBuf,
    /// Page title.
    #[arg(long, default_value = "Switchboard benchmark comparison")]
    pub title: String,
}

/// One result folder, read.
#[derive(Debug, Clone)]
pub struct Run {
    /// The folder as given on the command line.
    pub label: String,
    pub result: Value,
    /// `(file name, SVG text)` of the folder's charts, by name.
    pub charts: Vec<(String, String)>,
}

impl Run {
    /// Reads `dir/result.json` and the `*.svg` files beside it.
    pub fn load(dir: &Path) -> anyhow::Result<Run> {
        let path = dir.join("result.json");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let result: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        if !result.is_object() {
            anyhow::bail!("{} is not a JSON object", path.display());
        }
        let mut charts = Vec::new();
        for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".svg") && e.path().is_file() {
                charts.push((name, std::fs::read_to_string(e.path()).unwrap_or_default()));
            }
        }
        charts.sort();
        Ok(Run { label: dir.display().to_string(), result, charts })
    }
}

pub fn run(args: ReportArgs) -> anyhow::Result<i32> {
    let runs = args.dirs.iter().map(|d| Run::load(d)).collect::<anyhow::Result<Vec<_>>>()?;
    let html = render(&args.title, &runs);
    if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(&args.out, html).with_context(|| format!("writing {}", args.out.display()))?;
    println!("{}", args.out.display());
    Ok(0)
}

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A JSON value as table text: numbers rounded for reading, objects and arrays as compact JSON.
fn text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "–".into(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => group(u),
            (_, Some(i), _) => i.to_string(),
            (_, _, Some(f)) if f.abs() >= 1000.0 => group(f.round() as u64),
            (_, _, Some(f)) => format!("{f:.3}"),
            _ => n.to_string(),
        },
        Some(other) => other.to_string(),
    }
}

/// 1234567 → "1,234,567".
fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn bytes(v: Option<&Value>) -> String {
    match v.and_then(Value::as_f64) {
        Some(b) if b >= 1048576.0 => format!("{:.1} MiB", b / 1048576.0),
        Some(b) if b >= 1024.0 => format!("{:.1} KiB", b / 1024.0),
        Some(b) => format!("{b:.0} B"),
        None => "–".into(),
    }
}

/// A row of the comparison: a label and how to read its cell from one result.
struct Row {
    label: String,
    cell: Box<dyn Fn(&Value) -> Cell>,
}

/// One table cell: text plus a style class ("bad" for losses and failures).
struct Cell {
    text: String,
    class: &'static str,
}

fn plain(text: String) -> Cell {
    Cell { text, class: "" }
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn row(label: &str, path: &'static [&'static str]) -> Row {
    Row { label: label.into(), cell: Box::new(move |v| plain(text(at(v, path)))) }
}

/// A count that must be zero for a good run.
fn zero_row(label: &str, path: &'static [&'static str]) -> Row {
    Row {
        label: label.into(),
        cell: Box::new(move |v| {
            let x = at(v, path);
            let bad = x.and_then(Value::as_f64).is_some_and(|n| n > 0.0);
            Cell { text: text(x), class: if bad { "bad" } else { "" } }
        }),
    }
}

fn bytes_row(label: &str, path: &'static [&'static str]) -> Row {
    Row { label: label.into(), cell: Box::new(move |v| plain(bytes(at(v, path)))) }
}

/// The sections of the table, in order.
fn sections(runs: &[Run]) -> Vec<(String, Vec<Row>)> {
    // Parameters differ by scenario: one row per key any run has.
    let keys: BTreeSet<String> = runs
        .iter()
        .filter_map(|r| r.result.get("params").and_then(Value::as_object))
        .flat_map(|m| m.keys().cloned())
        .collect();
    let params = keys
        .into_iter()
        .map(|k| {
            let key = k.clone();
            Row { label: k, cell: Box::new(move |v| plain(text(at(v, &["params", key.as_str()])))) }
        })
        .collect();
    let pass = Row {
        label: "pass".into(),
        cell: Box::new(|v| match v.get("pass").and_then(Value::as_bool) {
            Some(true) => Cell { text: "PASS".into(), class: "good" },
            Some(false) => Cell { text: "FAIL".into(), class: "bad" },
            None => Cell { text: "–".into(), class: "bad" },
        }),
    };
    let criteria = Row {
        label: "criteria".into(),
        cell: Box::new(|v| {
            let list = v.get("criteria").and_then(Value::as_array).cloned().unwrap_or_default();
            let mut html = String::new();
            for c in &list {
                let ok = c.get("ok").and_then(Value::as_bool) == Some(true);
                let _ = write!(
                    html,
                    r#"<div class="{}">{} {}: {}</div>"#,
                    if ok { "good" } else { "bad" },
                    if ok { "✓" } else { "✗" },
                    escape(&text(c.get("check"))),
                    escape(&text(c.get("observed")))
                );
            }
            // Already escaped: marked so the renderer does not escape it again.
            Cell { text: html, class: "html" }
        }),
    };
    vec![
        (
            "run".into(),
            vec![
                row("scenario", &["scenario"]),
                row("started", &["started"]),
                row("duration s", &["duration_s"]),
                pass,
            ],
        ),
        ("parameters".into(), params),
        (
            "connections".into(),
            vec![
                row("target", &["connections", "target"]),
                row("established", &["connections", "established"]),
                zero_row("failed", &["connections", "failed"]),
            ],
        ),
        (
            "messages".into(),
            vec![
                row("sent", &["messages", "sent"]),
                row("expected", &["messages", "expected"]),
                row("received", &["messages", "received"]),
                zero_row("lost", &["messages", "lost"]),
                zero_row("duplicated", &["messages", "duplicated"]),
            ],
        ),
        ("throughput".into(), vec![row("deliveries/s", &["throughput", "deliveries_per_s"])]),
        (
            "latency ms".into(),
            ["p50", "p90", "p99", "p999", "max", "mean", "stdev"]
                .iter()
                .map(|k| {
                    let label = if *k == "p999" { "p99.9".to_string() } else { k.to_string() };
                    Row { label, cell: Box::new(move |v| plain(text(at(v, &["latency_ms", k])))) }
                })
                .collect(),
        ),
        (
            "server".into(),
            vec![
                row("CPU s", &["server", "cpu_s"]),
                bytes_row("RSS peak", &["server", "rss_peak_bytes"]),
                bytes_row("RSS per connection", &["server", "rss_per_connection_bytes"]),
            ],
        ),
        ("criteria".into(), vec![criteria]),
    ]
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222}\
table{border-collapse:collapse;margin-bottom:24px}\
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top;font-size:13px}\
th.section{background:#eef;text-align:left}\
td.good,div.good{color:#070}td.bad,div.bad{color:#b00;font-weight:bold}\
td.num{text-align:right}h2{margin-top:32px}\
.charts{display:flex;flex-wrap:wrap;gap:12px}.charts figure{margin:0}\
.charts img{max-width:560px;border:1px solid #ddd}figcaption{font-size:12px;color:#555}";

/// The whole page.
pub fn render(title: &str, runs: &[Run]) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n",
        t = escape(title)
    );
    h.push_str("<table>\n<tr><th></th>");
    for (i, r) in runs.iter().enumerate() {
        let _ = write!(h, "<th>#{} {}</th>", i + 1, escape(&r.label));
    }
    h.push_str("</tr>\n");
    for (name, rows) in sections(runs) {
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(h, "<tr><th class=\"section\" colspan=\"{}\">{}</th></tr>", runs.len() + 1, escape(&name));
        for row in rows {
            let _ = write!(h, "<tr><th>{}</th>", escape(&row.label));
            for r in runs {
                let c = (row.cell)(&r.result);
                let body = if c.class == "html" { c.text } else { escape(&c.text) };
                let _ = write!(h, "<td class=\"{}\">{body}</td>", if c.class == "html" { "" } else { c.class });
            }
            h.push_str("</tr>\n");
        }
    }
    h.push_str("</table>\n");
    for (i, r) in runs.iter().enumerate() {
        if r.charts.is_empty() {
            continue;
        }
        let _ = writeln!(h, "<h2>#{} {}</h2>\n<div class=\"charts\">", i + 1, escape(&r.label));
        for (name, svg) in &r.charts {
            let data = base64::engine::general_purpose::STANDARD.encode(svg.as_bytes());
            let _ = writeln!(
                h,
                "<figure><img alt=\"{n}\" src=\"data:image/svg+xml;base64,{data}\"><figcaption>{n}</figcaption></figure>",
                n = escape(name)
            );
        }
        h.push_str("</div>\n");
    }
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample(scenario: &str, pass: bool, lost: u64) -> Value {
        json!({
            "scenario": scenario,
            "params": {"subs": 1000, "channel": "<script>alert(1)</script>"},
            "started": "2024-01-01T00:00:00.000Z",
            "duration_s": 2.5,
            "connections": {"target": 1000, "established": 1000, "failed": 0},
            "messages": {"sent": 10, "expected": 10000, "received": 10000 - lost, "lost": lost, "duplicated": 0},
            "throughput": {"deliveries_per_s": 12345.678},
            "latency_ms": {"p50": 1.5, "p90": 2.0, "p99": 3.25, "p999": 4.0, "max": 5.0, "mean": 1.6, "stdev": 0.4},
            "server": {"cpu_s": 0.8, "rss_peak_bytes": 52428800, "rss_per_connection_bytes": 6577.0},
            "pass": pass,
            "criteria": [{"check": "no message lost", "ok": lost == 0, "observed": format!("{lost} of 10000 lost & \"x\"")}],
            "extra": {}
        })
    }

    #[test]
    fn report_escapes_every_string_from_the_json() {
        assert_eq!(escape(r#"<a href="x">&'</a>"#), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
        let runs = vec![Run { label: "dir<1>".into(), result: sample("broad<cast>", true, 0), charts: vec![] }];
        let html = render("t & t", &runs);
        assert!(!html.contains("<script>"), "a string from the JSON became markup");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("broad&lt;cast&gt;") && html.contains("dir&lt;1&gt;") && html.contains("t &amp; t"));
        assert!(html.contains("&amp; &quot;x&quot;"), "criteria text is escaped too");
    }

    #[test]
    fn report_renders_runs_side_by_side_with_losses_marked() {
        let dir = std::env::temp_dir().join(format!("sb-bench-compare-{}", std::process::id()));
        let (a, b) = (dir.join("a"), dir.join("b"));
        for (d, v) in [(&a, sample("broadcast", true, 0)), (&b, sample("echo", false, 7))] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("result.json"), serde_json::to_string_pretty(&v).unwrap()).unwrap();
        }
        std::fs::write(a.join("latency.svg"), "<svg xmlns=\"http://www.w3.org/2000/svg\"><text>A</text></svg>")
            .unwrap();
        let out = dir.join("out/report.html");
        let code = run(ReportArgs { dirs: vec![a.clone(), b.clone()], out: out.clone(), title: "cmp".into() }).unwrap();
        assert_eq!(code, 0);
        let html = std::fs::read_to_string(&out).unwrap();
        assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
        // Two columns, both scenarios, the figures of each.
        assert!(html.contains(&format!("#1 {}", escape(&a.display().to_string()))));
        assert!(html.contains(&format!("#2 {}", escape(&b.display().to_string()))));
        for s in ["broadcast", "echo", "12,346", "3.250", "50.0 MiB", "6.4 KiB", "PASS", "FAIL", "9,993"] {
            assert!(html.contains(s), "missing {s}");
        }
        assert!(html.contains(r#"<td class="bad">7</td>"#), "a loss is marked");
        assert!(html.contains(r#"<td class="">0</td>"#));
        // The chart is embedded, not linked.
        let svg64 = base64::engine::general_purpose::STANDARD
            .encode("<svg xmlns=\"http://www.w3.org/2000/svg\"><text>A</text></svg>".as_bytes());
        assert!(html.contains(&format!("data:image/svg+xml;base64,{svg64}")));
        assert!(!html.contains("latency.svg\" src=\"latency.svg"));
        // A folder without result.json is an error naming it.
        let err = run(ReportArgs { dirs: vec![dir.join("none")], out: out.clone(), title: "x".into() }).unwrap_err();
        assert!(format!("{err:#}").contains("result.json"), "{err:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn report_numbers_read_well() {
        assert_eq!(group(0), "0");
        assert_eq!(group(1234567), "1,234,567");
        assert_eq!(text(Some(&json!(1.23456))), "1.235");
        assert_eq!(text(Some(&json!(12345.6))), "12,346");
        assert_eq!(text(Some(&json!(null))), "–");
        assert_eq!(text(Some(&json!({"a": [1]}))), r#"{"a":[1]}"#);
        assert_eq!(bytes(Some(&json!(512))), "512 B");
        assert_eq!(bytes(None), "–");
    }
}
