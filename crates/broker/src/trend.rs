//! Trends: a bounded, downsampled record of a point channel's numeric values, so that a trend
//! plot opens full instead of filling only while it is open.
//!
//! A namespace with a trend keeps, per channel, a ring of `len` buckets of `step_ms` each
//! (by default an hour of one-second buckets): the minimum, maximum, last value and count of
//! the numeric values published in the bucket. Only buckets that saw a value exist. In Redis
//! the buckets are kept in chunks beside the channel's keys: the newest raw, closed ones
//! compressed by the nodes (`redis::trend_store`).
//!
//! # Historical values
//! A source's values from before the channel's newest (a Sparkplug B `is_historical` metric, a
//! back-fill) are published as historical ([`crate::Outgoing::historical`]): their values go
//! into the buckets of their own time, never moved to now. Values therefore arrive in any
//! order, and a bucket's `last` is the last *by time*, not by arrival: each bucket keeps the time of its `last` ([`TrendBucket`]'s
//! `last_at`), and a value replaces `last` only when its time is at or after that one (at the
//! same millisecond, the one that came later). Keeping the time is what makes the rule exact
//! whatever the order of arrival — a backlog split over several messages, live values on
//! both sides of a gap in one bucket — and it costs little: it is coded as its offset in the
//! bucket, against the previous bucket's offset (one bit while a device's period holds).
//! Publications follow the same rule; their time is their source time within reach, or the
//! arrival time, so they mostly come in time order and the last to come is `last`.
//!
//! # Layout
//! - this file: the policy, the bucket (and its `last` rule), what a publication contributes
//!   ([`sample`]), where a historical value goes ([`TrendTiers::backfill_placements`]) and
//!   reads at a coarser step ([`resample`]).
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

/// The values recorded in `[t, t + step)`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TrendBucket {
    /// Start of the bucket (unix ms).
    pub t: u64,
    pub min: f64,
    pub max: f64,
    /// The value with the latest time in the bucket (see the module doc).
    pub last: f64,
    pub n: u64,
    /// The time of `last` (unix ms, in `[t, t + step)`): what a value arriving later is
    /// compared with. Not part of a trend reply.
    #[serde(skip)]
    pub last_at: u64,
}

impl TrendBucket {
    /// The bucket starting at `t` holding one value `v` of time `at` (`at >= t`).
    pub fn new(t: u64, at: u64, v: f64) -> TrendBucket {
        TrendBucket { t, min: v, max: v, last: v, n: 1, last_at: at.max(t) }
    }

    /// Adds `v` of time `at`: into min, max and count, and into `last` unless the bucket's
    /// `last` is of a later time.
    pub fn add(&mut self, at: u64, v: f64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.n += 1;
        if at >= self.last_at {
            self.last = v;
            self.last_at = at;
        }
    }

    /// Folds `other` into this bucket: two records of one bucket (a stored and a raw form), or
    /// a later bucket for a read at a coarser step. `last` is the later by time; at the same
    /// time, `other`'s.
    pub fn merge(&mut self, other: &TrendBucket) {
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.n += other.n;
        if other.last_at >= self.last_at {
            self.last = other.last;
            self.last_at = other.last_at;
        }
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
        let any = t.is_some_and(|t| self.reaches(now_ms, t));
        self.iter().map(move |p| {
            let at = match (any, t.filter(|&t| p.reaches(now_ms, t))) {
                (true, Some(t)) => Some(t),
                (true, None) => None,
                (false, _) => Some(now_ms),
            };
            (p, at)
        })
    }

    /// Whether some tier reaches back to `t` at `now_ms` (see [`TrendPolicy::reaches`]).
    pub fn reaches(&self, now_ms: u64, t: u64) -> bool {
        self.iter().any(|p| p.reaches(now_ms, t))
    }

    /// The tiers a historical value of time `t` goes to: those that reach back to it, at `t`.
    /// Unlike a publication's ([`TrendTiers::placements`]), a historical value is never moved
    /// to `now_ms`: one no tier reaches (or ahead of the node's clock) goes nowhere.
    pub fn backfill_placements(&self, now_ms: u64, t: u64) -> impl Iterator<Item = TrendPolicy> + '_ {
        self.iter().filter(move |p| p.reaches(now_ms, t))
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

    /// Whether the trend holds a value of time `t` at `now_ms`: `t` lies within its reach and
    /// not ahead of `now_ms`.
    pub fn reaches(&self, now_ms: u64, t: u64) -> bool {
        t <= now_ms && t.saturating_add(self.reach_ms()) > now_ms
    }

    /// When a value counts for the trend: the point's own time `t` (a device's source
    /// timestamp, values a source delivers late after a reconnect) when the trend reaches it
    /// ([`TrendPolicy::reaches`]), else `now_ms` (a device clock ahead of the node's, or no
    /// `t`).
    pub fn placement(&self, now_ms: u64, t: Option<u64>) -> u64 {
        match t {
            Some(t) if self.reaches(now_ms, t) => t,
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
        assert_eq!(all, vec![TrendBucket::new(11_000, 11_000, 2.0), TrendBucket::new(13_000, 13_500, 5.0)]);
        r.record(p, 13_600, 4.0);
        let coarse = resample(r.since(0), 0, 5000);
        assert_eq!(coarse, vec![TrendBucket { t: 10_000, min: 2.0, max: 5.0, last: 4.0, n: 3, last_at: 13_600 }]);
        // A late value lands in its own (earlier) bucket, in order.
        r.record(p, 12_200, 9.0);
        let ts: Vec<u64> = r.since(0).map(|b| b.t).collect();
        assert_eq!(ts, vec![11_000, 12_000, 13_000]);
    }

    #[test]
    fn trend_bucket_last_is_the_last_by_time_whatever_the_order_of_arrival() {
        let mut b = TrendBucket::new(10_000, 10_500, 5.0);
        b.add(10_200, 1.0);
        assert_eq!((b.min, b.max, b.last, b.n, b.last_at), (1.0, 5.0, 5.0, 2, 10_500), "an earlier value: not last");
        b.add(10_500, 7.0);
        assert_eq!((b.last, b.last_at), (7.0, 10_500), "the same time: the later arrival");
        b.add(10_900, 3.0);
        assert_eq!((b.min, b.max, b.last, b.n), (1.0, 7.0, 3.0, 4));
        let mut earlier = TrendBucket::new(10_000, 10_100, 9.0);
        earlier.merge(&b);
        assert_eq!((earlier.max, earlier.last, earlier.n), (9.0, 3.0, 5));
        let mut later = TrendBucket::new(10_000, 10_950, -1.0);
        later.merge(&b);
        assert_eq!((later.min, later.last, later.n, later.last_at), (-1.0, -1.0, 5, 10_950));
    }

    #[test]
    fn trend_historical_values_go_to_the_tiers_that_reach_them_or_nowhere() {
        let hour = TrendPolicy { step_ms: 1000, len: 3600 };
        let day = TrendPolicy { step_ms: 10_000, len: 8640 };
        let t = TrendTiers::new(&[hour, day]).unwrap();
        let now = 10_000_000_000;
        let at = |when: u64| t.backfill_placements(now, when).collect::<Vec<_>>();
        assert_eq!(at(now - 60_000), vec![hour, day]);
        assert_eq!(at(now - 7_200_000), vec![day], "past the hour: the day tier only");
        assert!(at(now - 2 * 86_400_000).is_empty(), "out of every reach: dropped, never moved to now");
        assert!(at(now + 1).is_empty(), "ahead of the clock: dropped");
        assert!(t.reaches(now, now - 7_200_000) && !t.reaches(now, now - 86_400_000));
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
