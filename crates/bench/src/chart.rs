//! Hand-written SVG charts.
//!
//! - [`latency_svg`]: a latency distribution in the classic HdrHistogram form: latency (y)
//!   against percentile (x, logarithmic in 1/(1−p) so the tail gets room).
//! - [`LineChart`]: one figure per step of a sweep (`broadcast --search`, `sessions`), one line
//!   per series, an optional horizontal reference line (a deadline, a period).
//! - [`TimeChart`]: figures sampled over a long run (`soak`), in stacked panels over one time
//!   axis, with the warm-up shaded and each panel's allowed band marked.

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
    let mut s = header(H, title);
    let points = latency.distribution();
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let max_ms = points.iter().map(|(_, v)| *v as f64 / 1000.0).fold(0.0, f64::max);
    let y_top = nice_ceiling(max_ms.max(0.001));
    let x_of = |q: f64| LEFT + pw * (nines(q) / MAX_NINES).min(1.0);
    let y_of = |ms: f64| TOP + ph * (1.0 - ms / y_top);
    // Axes, grid and labels.
    frame(&mut s, TOP, pw, ph);
    for (i, label) in ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"].iter().enumerate() {
        x_grid(&mut s, LEFT + pw * i as f64 / MAX_NINES, TOP, TOP + ph, TOP + ph + 18.0, label);
    }
    for i in 0..=5 {
        let ms = y_top * i as f64 / 5.0;
        y_grid(&mut s, y_of(ms), pw, &fmt_ms(ms));
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

/// One point of a [`Series`]: `y` is `None` when the step produced no figure (drawn as a red
/// mark on the top edge); `ok` false draws the marker in red.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub x: f64,
    pub y: Option<f64>,
    pub ok: bool,
}

/// One line of a [`LineChart`].
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<Point>,
}

/// A line chart of sweep steps: x is a count (subscribers, sessions), y a figure measured at
/// that count. Only the x values of the data are labelled, so every step can be read off.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Logarithmic x axis (counts that double or grow tenfold per step).
    pub log_x: bool,
    pub series: Vec<Series>,
    /// A horizontal line at this y, with its label.
    pub reference: Option<(f64, String)>,
}

const PALETTE: [&str; 6] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf"];

impl LineChart {
    /// The chart as an SVG document.
    pub fn svg(&self) -> String {
        let mut s = header(H, &self.title);
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let fx = |x: f64| if self.log_x { x.max(1e-9).log10() } else { x };
        let mut xs: Vec<f64> = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.x)).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let (x0, x1) = match (xs.first(), xs.last()) {
            (Some(a), Some(b)) if fx(*b) > fx(*a) => (fx(*a), fx(*b)),
            (Some(a), _) => (fx(*a) - 1.0, fx(*a) + 1.0),
            _ => (0.0, 1.0),
        };
        // Keep the end points off the frame.
        let pad = (x1 - x0) * 0.05;
        let (x0, x1) = (x0 - pad, x1 + pad);
        let ys = self.series.iter().flat_map(|s| s.points.iter().filter_map(|p| p.y));
        let y_max = ys.chain(self.reference.iter().map(|r| r.0)).fold(0.0, f64::max);
        let y_top = nice_ceiling(y_max.max(1e-3) * 1.05);
        let x_of = |x: f64| LEFT + pw * (fx(x) - x0) / (x1 - x0);
        let y_of = |y: f64| TOP + ph * (1.0 - (y / y_top).clamp(0.0, 1.0));
        frame(&mut s, TOP, pw, ph);
        for x in &xs {
            x_grid(&mut s, x_of(*x), TOP, TOP + ph, TOP + ph + 18.0, &fmt_count(*x));
        }
        for i in 0..=5 {
            let v = y_top * i as f64 / 5.0;
            y_grid(&mut s, y_of(v), pw, &fmt_value(v));
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            LEFT + pw / 2.0,
            H - 18.0,
            escape(&self.x_label),
            TOP + ph / 2.0,
            escape(&self.y_label)
        );
        if let Some((v, label)) = &self.reference {
            let y = y_of(*v);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#d62728" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#d62728">{}</text>"##,
                LEFT + pw,
                LEFT + pw - 4.0,
                y - 4.0,
                escape(label)
            );
        }
        if xs.is_empty() {
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#a00">no steps</text>"##,
                LEFT + pw / 2.0,
                TOP + ph / 2.0
            );
        }
        for (i, series) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let line: Vec<String> =
                series.points.iter().filter_map(|p| p.y.map(|y| format!("{:.1},{:.1}", x_of(p.x), y_of(y)))).collect();
            if line.len() > 1 {
                let _ = writeln!(
                    s,
                    r##"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"##,
                    line.join(" ")
                );
            }
            for p in &series.points {
                let fill = if p.ok { color } else { "#d62728" };
                match p.y {
                    Some(y) => {
                        let _ =
                            writeln!(s, r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{fill}"/>"##, x_of(p.x), y_of(y));
                    }
                    None => {
                        let _ = writeln!(
                            s,
                            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#d62728">× no value</text>"##,
                            x_of(p.x),
                            TOP + 14.0
                        );
                    }
                }
            }
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{:.1}" width="12" height="12" fill="{color}"/><text x="{:.1}" y="{:.1}">{}</text>"##,
                LEFT + 10.0,
                TOP + 8.0 + 18.0 * i as f64,
                LEFT + 28.0,
                TOP + 18.0 + 18.0 * i as f64,
                escape(&series.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// One panel of a [`TimeChart`]: its own y axis (from zero), one line per series and an
/// optional band `(low, high, label)` drawn as two dashed lines; points with `ok` false are
/// drawn red.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub y_label: String,
    pub series: Vec<Series>,
    pub band: Option<(f64, f64, String)>,
}

/// Figures sampled over time, in panels stacked over one shared time axis `0..x_max`.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeChart {
    pub title: String,
    pub x_label: String,
    pub x_max: f64,
    pub panels: Vec<Panel>,
    /// `0..warmup` is shaded and labelled "warm-up".
    pub warmup: Option<f64>,
}

const PANEL_H: f64 = 200.0;
const PANEL_GAP: f64 = 50.0;

impl TimeChart {
    /// The chart as an SVG document.
    pub fn svg(&self) -> String {
        let n = self.panels.len().max(1) as f64;
        let h = TOP + n * PANEL_H + (n - 1.0) * PANEL_GAP + BOTTOM;
        let mut s = header(h, &self.title);
        let pw = W - LEFT - RIGHT;
        let x_max = if self.x_max > 0.0 { self.x_max } else { 1.0 };
        let x_of = |x: f64| LEFT + pw * (x / x_max).clamp(0.0, 1.0);
        let step = nice_ceiling(x_max / 6.0);
        for (pi, panel) in self.panels.iter().enumerate() {
            let top = TOP + pi as f64 * (PANEL_H + PANEL_GAP);
            let ys = panel.series.iter().flat_map(|s| s.points.iter().filter_map(|p| p.y));
            let y_max = ys.chain(panel.band.iter().map(|b| b.1)).fold(0.0, f64::max);
            let y_top = nice_ceiling(y_max.max(1e-3) * 1.05);
            let y_of = |y: f64| top + PANEL_H * (1.0 - (y / y_top).clamp(0.0, 1.0));
            if let Some(w) = self.warmup.filter(|w| *w > 0.0) {
                let _ = writeln!(
                    s,
                    r##"<rect x="{LEFT}" y="{top:.1}" width="{:.1}" height="{PANEL_H}" fill="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#777">warm-up</text>"##,
                    x_of(w) - LEFT,
                    (LEFT + x_of(w)) / 2.0,
                    top + PANEL_H - 8.0
                );
            }
            frame(&mut s, format_args!("{top:.1}"), pw, PANEL_H);
            let mut t = 0.0;
            while t <= x_max + 1e-9 {
                x_grid(&mut s, x_of(t), format_args!("{top:.1}"), top + PANEL_H, top + PANEL_H + 16.0, &fmt_count(t));
                t += step;
            }
            for i in 0..=4 {
                let v = y_top * i as f64 / 4.0;
                y_grid(&mut s, y_of(v), pw, &fmt_value(v));
            }
            let _ = writeln!(
                s,
                r##"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
                top + PANEL_H / 2.0,
                escape(&panel.y_label)
            );
            if let Some((lo, hi, label)) = &panel.band {
                for v in [lo, hi] {
                    let y = y_of(*v);
                    let _ = writeln!(
                        s,
                        r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#d62728" stroke-dasharray="6 4"/>"##,
                        LEFT + pw
                    );
                }
                let _ = writeln!(
                    s,
                    r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#d62728">{}</text>"##,
                    LEFT + pw - 4.0,
                    y_of(*hi) - 4.0,
                    escape(label)
                );
            }
            if panel.series.iter().all(|s| s.points.iter().all(|p| p.y.is_none())) {
                let _ = writeln!(
                    s,
                    r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#a00">not sampled</text>"##,
                    LEFT + pw / 2.0,
                    top + PANEL_H / 2.0
                );
            }
            for (i, series) in panel.series.iter().enumerate() {
                let color = PALETTE[i % PALETTE.len()];
                // A missing sample breaks the line rather than being drawn as zero.
                for run in series.points.split(|p| p.y.is_none()) {
                    let line: Vec<String> =
                        run.iter().filter_map(|p| p.y.map(|y| format!("{:.1},{:.1}", x_of(p.x), y_of(y)))).collect();
                    if line.len() > 1 {
                        let _ = writeln!(
                            s,
                            r##"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"##,
                            line.join(" ")
                        );
                    }
                }
                for p in series.points.iter().filter(|p| !p.ok) {
                    if let Some(y) = p.y {
                        let _ = writeln!(
                            s,
                            r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#d62728"/>"##,
                            x_of(p.x),
                            y_of(y)
                        );
                    }
                }
                let _ = writeln!(
                    s,
                    r##"<rect x="{:.1}" y="{:.1}" width="12" height="12" fill="{color}"/><text x="{:.1}" y="{:.1}">{}</text>"##,
                    LEFT + 10.0,
                    top + 8.0 + 18.0 * i as f64,
                    LEFT + 28.0,
                    top + 18.0 + 18.0 * i as f64,
                    escape(&series.name)
                );
            }
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            LEFT + pw / 2.0,
            h - 14.0,
            escape(&self.x_label)
        );
        s.push_str("</svg>\n");
        s
    }
}

// The parts every chart draws alike. A plot area spans the width between the margins (`pw`);
// `top` is written as the caller formats it, so each chart keeps its exact output.

/// The SVG document's opening: size `W` × `height`, white background, the title.
fn header(height: f64, title: &str) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#fff"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
"##,
        W / 2.0,
        escape(title)
    );
    s
}

/// The border of a plot area `pw` wide and `height` high from `top`.
fn frame(s: &mut String, top: impl std::fmt::Display, pw: f64, height: f64) {
    let _ = writeln!(s, r##"<rect x="{LEFT}" y="{top}" width="{pw}" height="{height}" fill="none" stroke="#444"/>"##);
}

/// A vertical grid line at `x` from `top` to `bottom`, labelled below at `label_y`.
fn x_grid(s: &mut String, x: f64, top: impl std::fmt::Display, bottom: f64, label_y: f64, label: &str) {
    let _ = writeln!(
        s,
        r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{bottom:.1}" stroke="#ddd"/><text x="{x:.1}" y="{label_y:.1}" text-anchor="middle">{label}</text>"##
    );
}

/// A horizontal grid line at `y` across a plot area `pw` wide, labelled on the left.
fn y_grid(s: &mut String, y: f64, pw: f64, label: &str) {
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
        LEFT + pw,
        LEFT - 6.0,
        y + 4.0
    );
}

fn fmt_count(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x:.2}")
    }
}

fn fmt_value(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else {
        fmt_ms(v)
    }
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

    fn chart(points: Vec<Point>) -> LineChart {
        LineChart {
            title: "steps & <more>".into(),
            x_label: "subscribers".into(),
            y_label: "ms".into(),
            log_x: true,
            series: vec![Series { name: "slowest burst".into(), points }],
            reference: Some((1000.0, "period 1 s".into())),
        }
    }

    #[test]
    fn chart_line_places_steps_on_a_log_axis() {
        let p = |x: f64, y: Option<f64>, ok: bool| Point { x, y, ok };
        let svg = chart(vec![p(1000.0, Some(80.0), true), p(2000.0, Some(400.0), true), p(4000.0, None, false)]).svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("steps &amp; &lt;more&gt;"), "titles are escaped");
        // Every step's x is labelled; the missing figure is marked, not drawn as zero.
        for label in [">1000<", ">2000<", ">4000<", "× no value", "period 1 s"] {
            assert!(svg.contains(label), "{label}");
        }
        assert_eq!(svg.matches("<circle").count(), 2);
        // Log x: 1000 → 2000 and 2000 → 4000 are the same distance apart.
        let cx: Vec<f64> = svg
            .match_indices("<circle cx=\"")
            .map(|(i, m)| svg[i + m.len()..].split('"').next().unwrap().parse().unwrap())
            .collect();
        let label_x = |l: &str| -> f64 {
            let i = svg.find(&format!(">{l}</text>")).unwrap();
            let tag = &svg[svg[..i].rfind("<text x=\"").unwrap() + 9..];
            tag.split('"').next().unwrap().parse().unwrap()
        };
        assert_eq!(cx[0], label_x("1000"));
        assert!(((label_x("2000") - label_x("1000")) - (label_x("4000") - label_x("2000"))).abs() < 0.2);
        // The y axis reaches the reference line even when every point is below it.
        assert!(svg.contains(">1000<") && svg.contains("stroke-dasharray"));
        let empty = LineChart { series: vec![], ..chart(vec![]) }.svg();
        assert!(empty.contains("no steps"));
    }

    #[test]
    fn chart_time_panels_mark_warmup_band_and_gaps() {
        let p = |x: f64, y: Option<f64>, ok: bool| Point { x, y, ok };
        let c = TimeChart {
            title: "soak".into(),
            x_label: "time (s)".into(),
            x_max: 60.0,
            warmup: Some(20.0),
            panels: vec![
                Panel {
                    y_label: "RSS (MiB)".into(),
                    series: vec![Series {
                        name: "rss".into(),
                        points: vec![p(0.0, Some(50.0), true), p(30.0, Some(52.0), true), p(60.0, Some(80.0), false)],
                    }],
                    band: Some((45.0, 55.0, "±10 %".into())),
                },
                Panel {
                    y_label: "channels".into(),
                    series: vec![Series {
                        name: "broker".into(),
                        points: vec![p(0.0, Some(1.0), true), p(10.0, None, true), p(20.0, Some(2.0), true)],
                    }],
                    band: None,
                },
                Panel { y_label: "none".into(), series: vec![], band: None },
            ],
        };
        let svg = c.svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches(">warm-up<").count(), 3, "shaded in every panel");
        assert_eq!(svg.matches("stroke-dasharray").count(), 2, "the band's two lines");
        assert_eq!(svg.matches("<circle").count(), 1, "the one sample out of its band");
        // The missing sample splits the second line into two single points: no polyline.
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert!(svg.contains("not sampled") && svg.contains("±10 %") && svg.contains(">60<"));
    }
}
