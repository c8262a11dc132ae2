//! Trends: a bounded, downsampled record of a point channel's numeric values, so that a trend
//! plot opens full instead of filling only while it is open.
//!
//! A namespace with a trend keeps, per channel, a ring of `len` buckets of `step_ms` each
//! (by default an hour of one-second buckets): the minimum, maximum, last value and count of
//! the numeric values published in the bucket. Only buckets that saw a value exist. In Redis
//! the buckets are kept in chunks beside the channel's keys: the newest raw, closed ones
//! compressed by the nodes (`redis::trend_store`).
//!
//! # Layout
//! - this file: the policy, the bucket, what a publication contributes ([`sample`]) and reads
//!   at a coarser step ([`resample`]).
//! - [`ring`]: [`TrendRing`], the memory broker's trend of one channel: closed chunks of
//!   encoded buckets, an open chunk being appended to and the newest bucket raw.
//! - `chunk`: the Gorilla-style encoding of a chunk of buckets (XOR-coded floats,
//!   delta-of-delta starts); `bits`: the bit streams it is written to.

mod bits;
pub(crate) mod chunk;
pub mod ring;

pub use ring::TrendRing;

/// How a channel keeps its trend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrendPolicy {
    /// Width of a bucket (ms, at least 1).
    pub step_ms: u64,
    /// Buckets kept: the trend reaches back `step_ms * len`.
    pub len: u32,
}

/// The values published in `[t, t + step)`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TrendBucket {
    /// Start of the bucket (unix ms).
    pub t: u64,
    pub min: f64,
    pub max: f64,
    pub last: f64,
    pub n: u64,
}

impl TrendBucket {
    pub fn new(t: u64, v: f64) -> TrendBucket {
        TrendBucket { t, min: v, max: v, last: v, n: 1 }
    }

    pub fn add(&mut self, v: f64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.last = v;
        self.n += 1;
    }

    /// Folds a later bucket into this one (for reads at a coarser step).
    pub fn merge(&mut self, later: &TrendBucket) {
        self.min = self.min.min(later.min);
        self.max = self.max.max(later.max);
        self.last = later.last;
        self.n += later.n;
    }
}

/// Most trend tiers a channel keeps.
pub const MAX_TIERS: usize = 4;

/// The trends a channel keeps, finest first: one per tier, each with its own step and reach
/// (e.g. an hour of seconds, a day of 10 s, a week of minutes). Every numeric value goes into
/// each; a read uses the finest that reaches back far enough ([`TrendTiers::covering`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrendTiers {
    tiers: [TrendPolicy; MAX_TIERS],
    n: u8,
}

impl TrendTiers {
    /// A single tier.
    pub const fn one(policy: TrendPolicy) -> TrendTiers {
        TrendTiers { tiers: [policy; MAX_TIERS], n: 1 }
    }

    /// `tiers`, finest first; `None` for none or more than [`MAX_TIERS`].
    pub fn new(tiers: &[TrendPolicy]) -> Option<TrendTiers> {
        let first = *tiers.first()?;
        if tiers.len() > MAX_TIERS {
            return None;
        }
        let mut all = [first; MAX_TIERS];
        all[..tiers.len()].copy_from_slice(tiers);
        Some(TrendTiers { tiers: all, n: tiers.len() as u8 })
    }

    pub fn iter(&self) -> impl Iterator<Item = TrendPolicy> + '_ {
        self.tiers[..usize::from(self.n)].iter().copied()
    }

    pub fn finest(&self) -> TrendPolicy {
        self.tiers[0]
    }

    /// Where a value goes in each tier (see [`TrendPolicy::placement`]): at its own time `t` in
    /// the tiers that reach back to it; when some tier does, the finer tiers that do not skip
    /// it (`None`: late history for the coarse tiers only); when none does, at `now_ms`
    /// everywhere.
    pub fn placements(&self, now_ms: u64, t: Option<u64>) -> impl Iterator<Item = (TrendPolicy, Option<u64>)> + '_ {
        let within = move |p: &TrendPolicy| t.is_some_and(|t| t <= now_ms && t + p.reach_ms() > now_ms);
        let any = self.iter().any(|p| within(&p));
        self.iter().map(move |p| {
            let at = match (any, within(&p)) {
                (true, true) => t,
                (true, false) => None,
                (false, _) => Some(now_ms),
            };
            (p, at)
        })
    }

    /// The finest tier whose reach covers `window_ms`; the one reaching furthest when none does.
    pub fn covering(&self, window_ms: u64) -> TrendPolicy {
        self.iter()
            .find(|t| t.reach_ms() >= window_ms)
            .unwrap_or_else(|| self.iter().max_by_key(TrendPolicy::reach_ms).unwrap_or(self.tiers[0]))
    }
}

impl TrendPolicy {
    /// How far back the trend reaches (ms).
    pub fn reach_ms(&self) -> u64 {
        self.step_ms.max(1).saturating_mul(u64::from(self.len))
    }

    /// When a value counts for the trend: the point's own time `t` (a device's source
    /// timestamp, values a source delivers late after a reconnect) when it lies within the
    /// trend's reach and not ahead of `now_ms`, else `now_ms` (a device clock ahead of the
    /// node's, or no `t`).
    pub fn placement(&self, now_ms: u64, t: Option<u64>) -> u64 {
        match t {
            Some(t) if t <= now_ms && t + self.reach_ms() > now_ms => t,
            _ => now_ms,
        }
    }
}

/// The numeric value a trend records of a publication: a point's `v`, or the data itself when
/// it is a number. `None` for anything else (such publications leave the trend as it is).
pub fn numeric_value(data: &str) -> Option<f64> {
    sample(data).map(|(v, _)| v)
}

/// A publication's numeric value (as [`numeric_value`]) and, for a point, its own time `t`
/// (unix ms) when it has a whole, non-negative one ([`switchboard_protocol::point`]).
pub fn sample(data: &str) -> Option<(f64, Option<u64>)> {
    switchboard_protocol::point::parse(data).timed_value()
}

/// Buckets of `step` starting at or after `since_ms`, oldest first, each `step` wide (a
/// multiple of the stored step: stored buckets are merged).
pub fn resample(buckets: impl IntoIterator<Item = TrendBucket>, since_ms: u64, step_ms: u64) -> Vec<TrendBucket> {
    let step_ms = step_ms.max(1);
    let mut out: Vec<TrendBucket> = Vec::new();
    for b in buckets.into_iter().filter(|b| b.t >= since_ms) {
        let t = b.t - b.t % step_ms;
        match out.last_mut() {
            Some(last) if last.t == t => last.merge(&b),
            _ => out.push(TrendBucket { t, ..b }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trend_values_are_a_points_v_or_a_bare_number() {
        assert_eq!(numeric_value(r#"{"v": 2.5, "q": "good"}"#), Some(2.5));
        assert_eq!(numeric_value(" 7 "), Some(7.0));
        assert_eq!(numeric_value(r#"{"v": "open"}"#), None);
        assert_eq!(numeric_value(r#"{"text": 1}"#), None);
        assert_eq!(numeric_value("[1, 2]"), None);
    }

    #[test]
    fn trend_ring_buckets_values_and_forgets_what_is_out_of_reach() {
        let p = TrendPolicy { step_ms: 1000, len: 3 };
        let mut r = TrendRing::default();
        for (ms, v) in [(10_100, 1.0), (10_900, 3.0), (11_000, 2.0), (13_500, 5.0)] {
            r.record(p, ms, v);
        }
        let all: Vec<TrendBucket> = r.since(0).collect();
        assert_eq!(
            all,
            vec![
                TrendBucket { t: 11_000, min: 2.0, max: 2.0, last: 2.0, n: 1 },
                TrendBucket { t: 13_000, min: 5.0, max: 5.0, last: 5.0, n: 1 },
            ]
        );
        r.record(p, 13_600, 4.0);
        let coarse = resample(r.since(0), 0, 5000);
        assert_eq!(coarse, vec![TrendBucket { t: 10_000, min: 2.0, max: 5.0, last: 4.0, n: 3 },]);
        // A late value lands in its own (earlier) bucket, in order.
        r.record(p, 12_200, 9.0);
        let ts: Vec<u64> = r.since(0).map(|b| b.t).collect();
        assert_eq!(ts, vec![11_000, 12_000, 13_000]);
    }

    #[test]
    fn trend_tiers_answer_a_window_with_the_finest_tier_that_reaches_it() {
        let hour = TrendPolicy { step_ms: 1000, len: 3600 };
        let day = TrendPolicy { step_ms: 10_000, len: 8640 };
        let week = TrendPolicy { step_ms: 60_000, len: 10_080 };
        let t = TrendTiers::new(&[hour, day, week]).unwrap();
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![hour, day, week]);
        assert_eq!(t.covering(60_000), hour);
        assert_eq!(t.covering(3_600_000), hour);
        assert_eq!(t.covering(3_600_001), day);
        assert_eq!(t.covering(7 * 86_400_000), week);
        assert_eq!(t.covering(u64::MAX), week, "beyond every reach: the longest");
        assert_eq!(TrendTiers::one(hour).iter().collect::<Vec<_>>(), vec![hour]);
        assert!(TrendTiers::new(&[]).is_none());
        assert!(TrendTiers::new(&[hour; MAX_TIERS + 1]).is_none());
        let now = 10_000_000_000;
        let at = |t: &TrendTiers| t.placements(now, Some(now - 7_200_000)).collect::<Vec<_>>();
        assert_eq!(at(&t), vec![(hour, None), (day, Some(now - 7_200_000)), (week, Some(now - 7_200_000))]);
        let old: Vec<_> = t.placements(now, Some(now - 30 * 86_400_000)).collect();
        assert!(old.iter().all(|(_, at)| *at == Some(now)), "out of every reach: arrival time");
        let ahead: Vec<_> = t.placements(now, Some(now + 1)).collect();
        assert!(ahead.iter().all(|(_, at)| *at == Some(now)), "ahead of the clock: arrival time");
    }

    #[test]
    fn trend_places_a_value_at_its_own_time_within_reach() {
        let p = TrendPolicy { step_ms: 1000, len: 60 };
        assert_eq!(sample(r#"{"v": 1, "t": 1700000000123}"#), Some((1.0, Some(1_700_000_000_123))));
        assert_eq!(sample(r#"{"v": 1, "t": -5}"#), Some((1.0, None)));
        assert_eq!(sample("2"), Some((2.0, None)));
        let now = 1_000_000;
        assert_eq!(p.placement(now, Some(now - 30_000)), now - 30_000, "within the minute it keeps");
        assert_eq!(p.placement(now, Some(now - 60_000)), now, "out of reach: arrival time");
        assert_eq!(p.placement(now, Some(now + 5)), now, "ahead of the node's clock: arrival time");
        assert_eq!(p.placement(now, None), now);
    }
}
