//! A hand-written SVG chart of a latency distribution, in the classic HdrHistogram form:
//! latency (y) against percentile (x, logarithmic in 1/(1−p) so the tail gets room).

use std::fmt::Write;

use crate::histogram::Latency;

const W: f64 = 760.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
/// The x axis ends at 99.999 %.
const MAX_NINES: f64 = 5.0;

/// The chart as an SVG document.
pub fn latency_svg(title: &str, latency: &Latency) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#fff"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
"##,
        W / 2.0,
        escape(title)
    );
    let points = latency.distribution();
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let max_ms = points.iter().map(|(_, v)| *v as f64 / 1000.0).fold(0.0, f64::max);
    let y_top = nice_ceiling(max_ms.max(0.001));
    let x_of = |q: f64| LEFT + pw * (nines(q) / MAX_NINES).min(1.0);
    let y_of = |ms: f64| TOP + ph * (1.0 - ms / y_top);
    // Axes, grid and labels.
    let _ = writeln!(s, r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##);
    for (i, label) in ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"].iter().enumerate() {
        let x = LEFT + pw * i as f64 / MAX_NINES;
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            TOP + ph,
            TOP + ph + 18.0
        );
    }
    for i in 0..=5 {
        let ms = y_top * i as f64 / 5.0;
        let y = y_of(ms);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            fmt_ms(ms)
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">latency (ms)</text>"##,
        LEFT + pw / 2.0,
        H - 18.0,
        TOP + ph / 2.0
    );
    if points.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#a00">no samples</text>"##,
            LEFT + pw / 2.0,
            TOP + ph / 2.0
        );
    } else {
        let mut poly = String::new();
        for (q, us) in &points {
            let _ = write!(poly, "{:.1},{:.1} ", x_of(*q), y_of(*us as f64 / 1000.0));
        }
        let _ =
            writeln!(s, r##"<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{}"/>"##, poly.trim_end());
        let sm = latency.summary();
        let legend = format!(
            "n={}  p50={}  p99={}  p99.9={}  max={} ms",
            latency.count(),
            sm.p50.map(fmt_ms).unwrap_or_default(),
            sm.p99.map(fmt_ms).unwrap_or_default(),
            sm.p999.map(fmt_ms).unwrap_or_default(),
            sm.max.map(fmt_ms).unwrap_or_default()
        );
        let _ = writeln!(s, r##"<text x="{:.1}" y="{:.1}">{}</text>"##, LEFT + 8.0, TOP + 16.0, escape(&legend));
    }
    s.push_str("</svg>\n");
    s
}

/// "Number of nines" of a quantile: 0.9 → 1, 0.99 → 2, capped at [`MAX_NINES`].
fn nines(q: f64) -> f64 {
    if q >= 1.0 {
        return MAX_NINES;
    }
    (-(1.0 - q).log10()).clamp(0.0, MAX_NINES)
}

/// The smallest 1, 2 or 5 × 10^k at or above `v`.
fn nice_ceiling(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 1.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.3}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_scales_are_sane() {
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(0.7), 1.0);
        assert_eq!(nice_ceiling(120.0), 200.0);
        assert!((nines(0.99) - 2.0).abs() < 1e-9);
        assert_eq!(nines(1.0), MAX_NINES);
        let svg = latency_svg("t <x>", &Latency::new());
        assert!(svg.contains("no samples") && svg.contains("t &lt;x&gt;"));
    }
}
