//! The table of `sessions`: one [`Cell`] per sessions × workers, and its forms in the output
//! (`extra.table`, `sessions.csv`, the two charts, the matrix printed at the end).

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::accounting::{MessageCounts, Tally};
use crate::chart::{LineChart, Point, Series};
use crate::histogram::LatencySummary;
use crate::report::rss_per_connection;

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
pub(super) struct Samples {
    pub(super) baseline: Option<u64>,
    pub(super) connected: Option<u64>,
    pub(super) running: Option<u64>,
    pub(super) cpu_s: Option<f64>,
    pub(super) start_us: u64,
    pub(super) until_us: u64,
    pub(super) started_late: bool,
}

impl Cell {
    pub(super) fn new(
        workers: usize,
        sessions: usize,
        procs: usize,
        t: &Tally,
        rtt: &LatencySummary,
        s: &Samples,
    ) -> Cell {
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

/// `{"w1": {"s10": {...}}}`: the table keyed so that `result.csv` flattens it into columns.
pub(super) fn table_object(cells: &[Cell]) -> Value {
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
pub(super) fn cells_csv(cells: &[Cell]) -> String {
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
pub(super) fn charts(cells: &[Cell], workers: &[usize]) -> (LineChart, LineChart) {
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

pub(super) fn fmt_bytes(b: f64) -> String {
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1048576.0)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

/// The sessions × workers table for the terminal.
pub(super) fn matrix(cells: &[Cell], sessions: &[usize], workers: &[usize]) -> String {
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
}
