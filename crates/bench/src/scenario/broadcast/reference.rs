//! `broadcast --reference TRANSPORT`: one broadcast measured over two transports in the same
//! run, so that their costs per delivery compare without the drift between runs.
//!
//! Beside the subscribers of `--transport` on the run's channel, as many subscribe over the
//! reference transport to a second channel ([`channel`]). Each period the coordinator
//! publishes to both, half a period apart, the order alternating ([`lane`]), and samples the
//! server's CPU time (per thread, to the nanosecond) just before each publish and again as
//! soon as every subscriber of that channel has the publication. Each window holds one
//! publication's fan-out and little else, and whatever the machine drifts by over the run
//! falls on both transports alike. A window that had to end at the next publish with
//! deliveries still missing is counted as cut: its cost leaked into the other transport's
//! window, and the run does not pass. Reported are the ratio of the sums and the median over
//! the periods of the ratio of their two windows; `--max-ratio` holds the median, which one
//! disturbed window (a round of pings) does not move.
//!
//! The two lanes may also differ in what their subscribers ask for (`--reference-compression`,
//! `--reference-delta`): then the ratio of the bytes their sockets read per delivery says what
//! compression or deltas save, beside what they cost the server (`--max-bytes-ratio`).

use serde_json::{json, Value};

use switchboard_client::Compression;

use super::lane::Lane;
use crate::accounting::{MessageCounts, Tally};
use crate::probe::CpuSample;
use crate::report::Criterion;

/// The run's own channel (0) and the reference's (1).
pub(super) const LANES: usize = 2;

/// The reference subscribers' channel beside the run's `main`.
pub(super) fn channel(main: &str) -> String {
    format!("{main}-ref")
}

/// Which channel the `slot`-th publish of period `k` goes to: the run's first in even
/// periods, the reference's first in odd ones, so neither always follows the other.
pub(super) fn lane(k: u64, slot: usize) -> usize {
    if k.is_multiple_of(2) {
        slot
    } else {
        LANES - 1 - slot
    }
}

/// Server CPU of each lane's publish windows, in the order of the periods.
#[derive(Debug, Default)]
pub(super) struct Windows {
    cpu_s: [Vec<f64>; LANES],
    /// Deliveries each window was for: the lane's subscribers.
    deliveries: [Vec<u64>; LANES],
    cut: [u64; LANES],
}

impl Windows {
    /// Adds one window of `lane`: the CPU between `from` and `to` for `deliveries`; `whole` is
    /// false when it ended before every subscriber had the publication.
    pub(super) fn add(
        &mut self,
        lane: usize,
        from: &Option<CpuSample>,
        to: &Option<CpuSample>,
        deliveries: u64,
        whole: bool,
    ) {
        self.cpu_s[lane].push(CpuSample::between(from, to).unwrap_or(0.0));
        self.deliveries[lane].push(deliveries);
        if !whole {
            self.cut[lane] += 1;
        }
    }

    /// Microseconds of server CPU per delivery of `lane`.
    pub(super) fn per_delivery_us(&self, lane: usize, deliveries: u64) -> Option<f64> {
        (deliveries > 0).then(|| self.cpu_s[lane].iter().sum::<f64>() * 1e6 / deliveries as f64)
    }

    /// The median over the periods of the ratio between the costs per delivery of the two
    /// windows of one period: a
    /// period's two publications are a fraction of a second apart, so neither the machine's
    /// drift nor a rare burst of other work in one window (a round of pings) moves it much.
    fn median_pair_ratio(&self) -> Option<f64> {
        let each = |lane: usize| {
            self.cpu_s[lane].iter().zip(&self.deliveries[lane]).map(|(s, n)| s / (*n).max(1) as f64).collect::<Vec<_>>()
        };
        let mut r: Vec<f64> = each(0).iter().zip(&each(1)).filter(|(_, b)| **b > 0.0).map(|(a, b)| a / b).collect();
        r.sort_by(f64::total_cmp);
        match r.len() {
            0 => None,
            n if !n.is_multiple_of(2) => Some(r[n / 2]),
            n => Some((r[n / 2 - 1] + r[n / 2]) / 2.0),
        }
    }
}

/// What the reference adds to a run: the reference lane's figures under `extra.reference` and
/// the checks that the comparison saw what it reports.
pub(super) struct Compared {
    pub extra: Value,
    pub criteria: Vec<Criterion>,
}

/// What one delivery of the run's subscribers cost: server CPU, and the bytes their sockets
/// read (where the transport counts them).
pub(super) struct Measured {
    pub cpu_us: Option<f64>,
    pub bytes: Option<f64>,
}

/// The largest ratios of a run's delivery to a reference one that pass (`--max-ratio`,
/// `--max-bytes-ratio`).
pub(super) struct Bounds {
    pub cpu: Option<f64>,
    pub bytes: Option<f64>,
}

/// Compares the run's deliveries (`main`) with the reference subscribers' (`lane`, whose tally
/// is `refs`: they were `subs` and should each have had `published` publications).
pub(super) fn compare(
    lane: &Lane,
    windows: &Windows,
    main: Measured,
    refs: &Tally,
    subs: u64,
    published: u64,
    bounds: Bounds,
) -> Compared {
    let transport = lane.transport;
    let ref_us = windows.per_delivery_us(1, refs.received);
    let ratio = main.cpu_us.zip(ref_us).filter(|(_, r)| *r > 0.0).map(|(m, r)| m / r);
    let ref_bytes = lane.bytes_per_delivery(refs);
    let bytes_ratio = main.bytes.zip(ref_bytes).filter(|(_, r)| *r > 0.0).map(|(m, r)| m / r);
    // The bound is held against the median of the periods: a round of pings or a page fault
    // landing in one window moves the sums by several per cent, the median hardly at all.
    let median = windows.median_pair_ratio();
    let m = MessageCounts::from_tally(published, published * refs.established, refs);
    let mut criteria = vec![
        Criterion::new(
            "every reference subscriber connected, stayed and got every publication once",
            refs.established == subs && refs.dropped == 0 && m.lost == 0 && m.duplicated == 0,
            format!(
                "{}/{subs} connected, {} dropped, {} of {} lost, {} duplicated",
                refs.established, refs.dropped, m.lost, m.expected, m.duplicated
            ),
        ),
        Criterion::new(
            "every publish window held all of its publication's deliveries",
            windows.cut == [0; LANES],
            format!("{} cut short, {} of the reference's", windows.cut[0], windows.cut[1]),
        ),
    ];
    if lane.compression == Compression::Deflate {
        criteria.push(Criterion::all_deflated("reference ", refs));
    }
    if let Some(max) = bounds.bytes {
        criteria.push(Criterion::new(
            format!("a delivery reads at most {max}× the bytes of a reference one"),
            bytes_ratio.is_some_and(|r| r <= max),
            match (main.bytes, ref_bytes, bytes_ratio) {
                (Some(m), Some(r), Some(x)) => format!("{x:.3}× ({m:.1} B against {r:.1} B)"),
                _ => "not measured (WebSocket lanes count their bytes)".into(),
            },
        ));
    }
    if let Some(max) = bounds.cpu {
        criteria.push(Criterion::new(
            format!("a delivery costs at most {max}× a reference ({}) one (median of the periods)", lane.describe()),
            median.is_some_and(|r| r <= max),
            match (median, ratio) {
                (Some(m), Some(r)) => format!("{m:.3}× (of the sums {r:.3}×)"),
                _ => "not measured".into(),
            },
        ));
    }
    let extra = json!({
        "transport": transport,
        "compression": lane.compression,
        "delta": lane.delta,
        "subs": refs.established,
        "received": refs.received,
        "server_cpu_us_per_delivery": ref_us,
        "cost_ratio": ratio,
        "cost_ratio_median_of_periods": median,
        "window_cpu_ms": windows.cpu_s.iter().map(|w| w.iter().map(|s| (s * 1e6).round() / 1e3).collect::<Vec<f64>>()).collect::<Vec<_>>(),
        "max_ratio": bounds.cpu,
        "wire_bytes_per_delivery": ref_bytes,
        "bytes_ratio": bytes_ratio,
        "max_bytes_ratio": bounds.bytes,
        "subscribers_deflated": refs.deflated,
        "windows_cut": windows.cut,
    });
    Compared { extra, criteria }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Transport;

    fn ws() -> Lane {
        Lane { channel: "c-ref".into(), transport: Transport::Ws, compression: Compression::Off, delta: false }
    }

    fn sample(ns: u64) -> Option<CpuSample> {
        Some(CpuSample { total_s: 0.0, threads: [(1, ns)].into_iter().collect() })
    }

    #[test]
    fn broadcast_reference_alternates_which_channel_goes_first() {
        assert_eq!((lane(0, 0), lane(0, 1)), (0, 1));
        assert_eq!((lane(1, 0), lane(1, 1)), (1, 0));
        assert_eq!(channel("bench:broadcast"), "bench:broadcast-ref");
    }

    #[test]
    fn broadcast_reference_ratio_is_each_lanes_window_cpu_per_delivery() {
        let mut w = Windows::default();
        w.add(0, &sample(1_000_000), &sample(4_000_000), 300, true);
        w.add(1, &sample(4_000_000), &sample(6_000_000), 200, true);
        let main_us = w.per_delivery_us(0, 300);
        assert_eq!(main_us, Some(10.0));
        let refs = Tally { established: 100, received: 200, wire_bytes: 200_000, ..Default::default() };
        let main = Measured { cpu_us: main_us, bytes: Some(300.0) };
        let c = compare(&ws(), &w, main, &refs, 100, 2, Bounds { cpu: Some(1.15), bytes: Some(0.5) });
        assert_eq!(c.extra["server_cpu_us_per_delivery"], json!(10.0));
        assert_eq!(c.extra["cost_ratio"], json!(1.0));
        assert_eq!(c.extra["wire_bytes_per_delivery"], json!(1000.0));
        assert_eq!(c.extra["bytes_ratio"], json!(0.3));
        assert_eq!(c.extra["window_cpu_ms"], json!([[3.0], [2.0]]));
        assert!(c.criteria.iter().all(|c| c.ok), "{:?}", c.criteria);
    }

    #[test]
    fn broadcast_reference_median_of_periods_is_not_moved_by_one_disturbed_window() {
        let mut w = Windows::default();
        // Three periods at 1.1×, 1.2× and 1.0×; one reference window also held 30 ms of pings.
        for (a, b) in [(11, 10), (12, 10), (40, 40)] {
            w.add(0, &sample(0), &sample(a * 1_000_000), 100, true);
            w.add(1, &sample(0), &sample(b * 1_000_000), 100, true);
        }
        let near = |r: Option<f64>, want: f64| r.is_some_and(|r| (r - want).abs() < 1e-9);
        assert!(near(w.median_pair_ratio(), 1.1), "{:?}", w.median_pair_ratio());
        w.add(0, &sample(0), &sample(9_000_000), 100, true);
        w.add(1, &sample(0), &sample(10_000_000), 100, true);
        assert!(near(w.median_pair_ratio(), 1.05), "an even count takes the middle two");
    }

    #[test]
    fn broadcast_reference_fails_over_the_ratio_with_losses_or_a_cut_window() {
        let mut w = Windows::default();
        w.add(0, &sample(0), &sample(3_000_000), 100, true);
        w.add(1, &sample(0), &sample(1_000_000), 100, false);
        let refs = Tally { established: 100, received: 150, wire_bytes: 150_000, deflated: 99, ..Default::default() };
        let lane = Lane { compression: Compression::Deflate, ..ws() };
        let main = Measured { cpu_us: w.per_delivery_us(0, 200), bytes: Some(600.0) };
        let c = compare(&lane, &w, main, &refs, 100, 2, Bounds { cpu: Some(1.15), bytes: Some(0.5) });
        let failed: Vec<&str> = c.criteria.iter().filter(|c| !c.ok).map(|c| c.check.as_str()).collect();
        assert_eq!(failed.len(), 5, "{failed:?}");
        assert!(failed[0].contains("every publication once") && failed[1].contains("window"), "{failed:?}");
        assert!(failed[2].contains("negotiated permessage-deflate"), "{failed:?}");
        assert!(failed[3].contains("at most 0.5× the bytes"), "{failed:?}");
        assert!(failed[4].contains("at most 1.15×"), "{failed:?}");
        assert_eq!(c.extra["windows_cut"], json!([0, 1]));
    }
}
