//! [`TrendRing`]: the memory broker's trend of one channel, kept as compressed chunks.
//!
//! The buckets that saw a value, in increasing `t`, are split into
//! - **closed chunks** of about [`CHUNK_BUCKETS`] buckets each, encoded ([`Chunk`]) and
//!   trimmed to the bytes they use;
//! - the **open chunk**, an [`Encoder`] the buckets are appended to as they close;
//! - the **tail**: the newest [`TAIL_BUCKETS`] buckets, kept raw because values for their
//!   steps may still arrive — the current step's, and those of batches published at once that
//!   the node's workers take in a slightly different order.
//!
//! A value for a step in the tail updates or inserts its bucket there; a value for a later step
//! starts a new bucket, and the tail's oldest moves into the open chunk (sealing it once it
//! holds [`CHUNK_BUCKETS`]). Both are O(1). A value for a step older than the tail (a source
//! delivering late, a historical publication, [`crate::Outgoing::historical`]) re-encodes the
//! one chunk that holds that step — or falls between its buckets, and is inserted there — as
//! the rare case it is. Wherever it lands, it joins min, max and count, and becomes `last`
//! only when its time is at or after the bucket's `last` ([`TrendBucket::add`]).
//!
//! Buckets out of reach are dropped a whole chunk at a time; until then the ring hides them
//! behind `min_t`, so reads see exactly the buckets a ring of raw buckets would keep.

use std::collections::VecDeque;

use super::chunk::{Chunk, Encoder};
use crate::trend::{TrendBucket, TrendPolicy};

/// Buckets per closed chunk: two minutes of one-second buckets. Larger chunks spread the fixed
/// cost of a chunk (its header and the first values coded in full) over more buckets; smaller
/// ones make a late value and a short read decode less.
pub const CHUNK_BUCKETS: u32 = 120;

/// Newest buckets kept raw (40 bytes each, per channel).
pub const TAIL_BUCKETS: usize = 8;

/// The memory broker's trend of one channel: the buckets that saw a value, oldest first.
#[derive(Debug, Default)]
pub struct TrendRing {
    closed: VecDeque<Chunk>,
    open: Encoder,
    /// The newest buckets, raw, in increasing `t`; everything encoded starts before them.
    tail: VecDeque<TrendBucket>,
    /// Buckets that start before this are out of reach: hidden from reads, never recorded
    /// again, dropped with their chunk.
    min_t: u64,
    /// The reach `min_t` was computed with.
    reach: u64,
}

impl TrendRing {
    /// Records `v` of time `at_ms` (see [`TrendPolicy::placement`]) and drops buckets older
    /// than the policy's reach from the newest. A value for an earlier bucket (a late source
    /// value, a historical one) goes into that bucket, in order; appending stays the common,
    /// O(1) case. A value older than the reach from the newest bucket is ignored (the caller
    /// places values within reach of now, which is at least as far).
    pub fn record(&mut self, policy: TrendPolicy, at_ms: u64, v: f64) {
        let step = policy.step_ms.max(1);
        let t = at_ms - at_ms % step;
        let newest = self.tail.back().map_or(t, |b| b.t.max(t));
        self.set_reach(newest, policy.reach_ms());
        if t < self.min_t {
            return;
        }
        match (self.tail.front().map(|b| b.t), self.tail.back_mut()) {
            (_, Some(last)) if last.t == t => last.add(at_ms, v),
            (Some(first), _) if t < first => self.record_late(t, at_ms, v),
            (_, Some(last)) if last.t > t => add_at_tail(&mut self.tail, t, at_ms, v),
            _ => {
                if self.tail.capacity() == 0 {
                    self.tail.reserve_exact(TAIL_BUCKETS + 1);
                }
                self.tail.push_back(TrendBucket::new(t, at_ms, v));
            }
        }
        while self.tail.len() > TAIL_BUCKETS {
            if let Some(done) = self.tail.pop_front() {
                if done.t >= self.min_t {
                    self.append(&done);
                }
            }
        }
    }

    /// The buckets that start at or after `since_ms`, oldest first. Only the chunks that reach
    /// that far back are decoded.
    pub fn since(&self, since_ms: u64) -> impl Iterator<Item = TrendBucket> + '_ {
        let from = since_ms.max(self.min_t);
        let first = self.closed.partition_point(|c| c.last_t < from);
        let open = (self.open.count() > 0 && self.open.last_t() >= from).then(|| self.open.decode());
        self.closed
            .range(first..)
            .flat_map(Chunk::decode)
            .chain(open.into_iter().flatten())
            .chain(self.tail.iter().copied())
            .filter(move |b| b.t >= from)
    }

    /// Bytes held by the encoded buckets and chunk headers (not the raw tail), for tests and
    /// sizing.
    pub fn encoded_bytes(&self) -> usize {
        self.closed.iter().map(|c| c.encoded_len() + std::mem::size_of::<Chunk>()).sum::<usize>()
            + self.open.encoded_len()
    }

    fn append(&mut self, b: &TrendBucket) {
        self.open.push(b);
        if self.open.count() >= CHUNK_BUCKETS {
            let sealed = std::mem::take(&mut self.open).seal();
            self.closed.push_back(sealed);
        }
    }

    /// Adds `v` of time `at` to the bucket at `t`, earlier than the tail (and not out of
    /// reach): into the open chunk when `t` falls after the closed ones, else into the closed
    /// chunk whose range holds `t` (the first one when `t` precedes them all).
    fn record_late(&mut self, t: u64, at: u64, v: f64) {
        if self.closed.back().is_none_or(|c| t > c.last_t) {
            let mut buckets: Vec<TrendBucket> = self.open.decode().collect();
            add_at(&mut buckets, t, at, v);
            let mut e = Encoder::new();
            for b in &buckets {
                e.push(b);
            }
            self.open = e;
            return;
        }
        let i = self.closed.partition_point(|c| c.first_t <= t).saturating_sub(1);
        if let Some(chunk) = self.closed.get_mut(i) {
            let mut buckets: Vec<TrendBucket> = chunk.decode().collect();
            add_at(&mut buckets, t, at, v);
            *chunk = Chunk::encode(&buckets);
        }
    }

    /// Moves `min_t` to `reach` behind `newest` (the newest bucket's start, counting the value
    /// being recorded) and drops the chunks that
    /// lie wholly before it. When the reach changes, the hidden buckets are dropped first, so
    /// that a longer reach does not bring back buckets already forgotten.
    fn set_reach(&mut self, newest: u64, reach: u64) {
        if reach != self.reach {
            self.purge_hidden();
            self.reach = reach;
            self.min_t = 0;
        }
        // A bucket is in reach while `t + reach > newest`.
        self.min_t = self.min_t.max((newest + 1).saturating_sub(reach));
        while self.closed.front().is_some_and(|c| c.last_t < self.min_t) {
            self.closed.pop_front();
        }
        if self.closed.is_empty() && self.open.count() > 0 && self.open.last_t() < self.min_t {
            self.open = Encoder::new();
        }
    }

    /// Drops the buckets before `min_t` from the chunks and the tail that still hold some.
    fn purge_hidden(&mut self) {
        let min_t = self.min_t;
        self.tail.retain(|b| b.t >= min_t);
        while self.closed.front().is_some_and(|c| c.last_t < min_t) {
            self.closed.pop_front();
        }
        if let Some(front) = self.closed.front_mut() {
            if front.first_t < min_t {
                let kept: Vec<TrendBucket> = front.decode().filter(|b| b.t >= min_t).collect();
                *front = Chunk::encode(&kept);
            }
        } else if self.open.count() > 0 && self.open.first_t() < min_t {
            let mut e = Encoder::new();
            for b in self.open.decode().filter(|b| b.t >= min_t) {
                e.push(&b);
            }
            self.open = e;
        }
    }
}

/// Adds `v` of time `at` to the bucket at `t` in `buckets` (increasing `t`), inserting it in
/// order.
fn add_at(buckets: &mut Vec<TrendBucket>, t: u64, at: u64, v: f64) {
    match buckets.binary_search_by_key(&t, |b| b.t) {
        Ok(i) => buckets[i].add(at, v),
        Err(i) => buckets.insert(i, TrendBucket::new(t, at, v)),
    }
}

/// The same for the raw tail.
fn add_at_tail(tail: &mut VecDeque<TrendBucket>, t: u64, at: u64, v: f64) {
    match tail.binary_search_by_key(&t, |b| b.t) {
        Ok(i) => tail[i].add(at, v),
        Err(i) => tail.insert(i, TrendBucket::new(t, at, v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trend::resample;

    /// A ring of raw buckets: the behaviour the compressed ring must match.
    #[derive(Default)]
    struct PlainRing {
        buckets: VecDeque<TrendBucket>,
    }

    impl PlainRing {
        fn record(&mut self, policy: TrendPolicy, at_ms: u64, v: f64) {
            let step = policy.step_ms.max(1);
            let t = at_ms - at_ms % step;
            match self.buckets.back_mut() {
                Some(last) if last.t == t => last.add(at_ms, v),
                Some(last) if last.t > t => add_at_deque(&mut self.buckets, t, at_ms, v),
                _ => self.buckets.push_back(TrendBucket::new(t, at_ms, v)),
            }
            let newest = self.buckets.back().map_or(t, |b| b.t);
            let reach = policy.reach_ms();
            while self.buckets.front().is_some_and(|b| b.t + reach <= newest) {
                self.buckets.pop_front();
            }
        }

        fn since(&self, since_ms: u64) -> Vec<TrendBucket> {
            self.buckets.iter().copied().filter(|b| b.t >= since_ms).collect()
        }
    }

    fn add_at_deque(buckets: &mut VecDeque<TrendBucket>, t: u64, at: u64, v: f64) {
        match buckets.binary_search_by_key(&t, |b| b.t) {
            Ok(i) => buckets[i].add(at, v),
            Err(i) => buckets.insert(i, TrendBucket::new(t, at, v)),
        }
    }

    /// Buckets compared bit for bit (`==` on f64 would equate 0.0 and -0.0).
    fn bits(buckets: &[TrendBucket]) -> Vec<(u64, u64, u64, u64, u64, u64)> {
        buckets.iter().map(|b| (b.t, b.min.to_bits(), b.max.to_bits(), b.last.to_bits(), b.n, b.last_at)).collect()
    }

    /// A value from a mix that stresses the float coding: extremes, ±0, subnormals, repeats,
    /// decimal fractions and a noisy process value.
    fn value(rng: &mut fastrand::Rng, prev: f64) -> f64 {
        match rng.u8(0..12) {
            0 => 0.0,
            1 => -0.0,
            2 => f64::from_bits(rng.u64(1..(1 << 52))) * if rng.bool() { 1.0 } else { -1.0 },
            3 => [f64::MAX, f64::MIN, f64::MIN_POSITIVE, -f64::MIN_POSITIVE, 1e308, -1e-308][rng.usize(0..6)],
            4..=6 => prev,
            7 => (rng.f64() * 1e6).round() / 100.0,
            8 => rng.i64(-1000..1000) as f64,
            9 => Some(f64::from_bits(rng.u64(..))).filter(|v| v.is_finite()).unwrap_or(1.0),
            _ => prev + (rng.f64() - 0.5),
        }
    }

    /// Random values at random times, mostly forward, sometimes late (within the window, before
    /// it, or far ahead), compared with the plain ring after every record and at random reads.
    fn compare(seed: u64, policy_of: impl Fn(&mut fastrand::Rng) -> TrendPolicy, steps: usize) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut plain = PlainRing::default();
        let mut packed = TrendRing::default();
        let mut now = 1_700_000_000_000u64 + rng.u64(0..1_000_000);
        let mut v = 20.0;
        let mut policy = policy_of(&mut rng);
        for i in 0..steps {
            if rng.u16(0..500) == 0 {
                policy = policy_of(&mut rng);
            }
            let step = policy.step_ms.max(1);
            now += match rng.u8(0..20) {
                0 => 0,
                1 => rng.u64(0..policy.reach_ms() * 2 + 1),
                2 => rng.u64(0..step * 10),
                _ => rng.u64(step / 2..step * 2),
            };
            let at = match rng.u8(0..10) {
                0 => now.saturating_sub(rng.u64(0..policy.reach_ms() + step * 3)),
                1 => now.saturating_sub(rng.u64(0..step * 4)),
                _ => now,
            };
            v = value(&mut rng, v);
            plain.record(policy, at, v);
            packed.record(policy, at, v);
            let since = if rng.bool() { 0 } else { now.saturating_sub(rng.u64(0..policy.reach_ms() + 1)) };
            if i % 7 == 0 || i + 1 == steps {
                let got: Vec<TrendBucket> = packed.since(since).collect();
                assert_eq!(bits(&got), bits(&plain.since(since)), "seed {seed}, step {i}, since {since}");
            }
        }
    }

    #[test]
    fn trend_ring_matches_a_plain_ring_on_random_values() {
        for seed in 0..40 {
            compare(seed, |_| TrendPolicy { step_ms: 1000, len: 3600 }, 6000);
        }
    }

    #[test]
    fn trend_ring_matches_a_plain_ring_with_short_reach_and_sparse_buckets() {
        for seed in 100..160 {
            compare(seed, |rng| TrendPolicy { step_ms: rng.u64(1..3000), len: rng.u32(0..300) }, 3000);
        }
    }

    #[test]
    fn trend_ring_matches_a_plain_ring_when_late_values_abound() {
        for seed in 200..206 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let policy = TrendPolicy { step_ms: 1000, len: 600 };
            let mut plain = PlainRing::default();
            let mut packed = TrendRing::default();
            let base = 1_000_000_000u64;
            // A backlog delivered in random order, as a source replaying after a reconnect.
            for _ in 0..2000 {
                let at = base + rng.u64(0..900_000);
                let v = rng.f64() * 100.0;
                plain.record(policy, at, v);
                packed.record(policy, at, v);
            }
            for since in [0, base + 400_000, base + 899_000, u64::MAX] {
                let got: Vec<TrendBucket> = packed.since(since).collect();
                assert_eq!(bits(&got), bits(&plain.since(since)), "seed {seed}, since {since}");
            }
        }
    }

    /// A ring of one value a second, at 250 ms into each second, from `start` for `secs`
    /// seconds (value = the second's number).
    fn live(policy: TrendPolicy, start: u64, secs: u64) -> TrendRing {
        let mut r = TrendRing::default();
        for s in 0..secs {
            r.record(policy, start + s * 1000 + 250, s as f64);
        }
        r
    }

    fn bucket_at(r: &TrendRing, t: u64) -> Option<TrendBucket> {
        r.since(t).next().filter(|b| b.t == t)
    }

    #[test]
    fn trend_ring_merges_a_historical_value_into_the_open_chunk() {
        let p = TrendPolicy { step_ms: 1000, len: 3600 };
        let start = 1_000_000;
        // 130 s: one closed chunk, 2 buckets in the open one, 8 in the tail.
        let mut r = live(p, start, 130);
        assert_eq!((r.closed.len(), r.open.count(), r.tail.len()), (1, 2, TAIL_BUCKETS));
        let second = start + 120_000;
        // Earlier in its bucket than the live value: min, max and n, not last.
        r.record(p, second + 100, -5.0);
        assert_eq!(
            bucket_at(&r, second),
            Some(TrendBucket { t: second, min: -5.0, max: 120.0, last: 120.0, n: 2, last_at: second + 250 })
        );
        // Later in its bucket: also last.
        r.record(p, second + 900, 50.0);
        assert_eq!(
            bucket_at(&r, second),
            Some(TrendBucket { t: second, min: -5.0, max: 120.0, last: 50.0, n: 3, last_at: second + 900 })
        );
        assert_eq!(r.since(0).count(), 130, "no bucket made or lost");
    }

    #[test]
    fn trend_ring_merges_a_historical_value_into_a_closed_chunk() {
        let p = TrendPolicy { step_ms: 1000, len: 3600 };
        let start = 1_000_000;
        let mut r = live(p, start, 400);
        assert_eq!(r.closed.len(), 3);
        let t = start + 130_000; // in the second closed chunk
        r.record(p, t + 999, 1000.0);
        r.record(p, t + 1, -1000.0);
        assert_eq!(
            bucket_at(&r, t),
            Some(TrendBucket { t, min: -1000.0, max: 1000.0, last: 1000.0, n: 3, last_at: t + 999 })
        );
        let all: Vec<TrendBucket> = r.since(0).collect();
        assert_eq!(all.len(), 400);
        assert!(all.iter().filter(|b| b.t != t).all(|b| b.n == 1 && b.last_at == b.t + 250), "the others unchanged");
    }

    #[test]
    fn trend_ring_inserts_a_historical_bucket_between_existing_ones() {
        let p = TrendPolicy { step_ms: 1000, len: 3600 };
        // Minutes begin 50 s after `start`: both edges of the gap fall inside a minute.
        let start = 1_030_000;
        // Live values on both sides of a ten-minute gap, then the gap's backlog, in two parts.
        let mut r = TrendRing::default();
        for s in (0..200).chain(800..1000u64) {
            r.record(p, start + s * 1000 + 250, s as f64);
        }
        for s in (500..800).chain(200..500u64) {
            r.record(p, start + s * 1000 + 500, -(s as f64));
        }
        let all: Vec<TrendBucket> = r.since(0).collect();
        assert_eq!(all.len(), 1000);
        assert!(all.windows(2).all(|w| w[1].t == w[0].t + 1000), "one bucket a second, in order");
        let gap = &all[200..800];
        assert!(gap
            .iter()
            .enumerate()
            .all(|(i, b)| b.last == -((i + 200) as f64) && b.n == 1 && b.last_at == b.t + 500));
        // A coarser read across the gap's edges: last by time across the merged buckets.
        let coarse = resample(r.since(0), 0, 60_000);
        let minute =
            |s: u64| *coarse.iter().find(|b| b.t <= start + s * 1000 && start + s * 1000 < b.t + 60_000).unwrap();
        assert_eq!((minute(200).last, minute(200).n), (-229.0, 60), "the backlog after live values is later");
        assert_eq!((minute(799).last, minute(799).n), (829.0, 60), "the live values after the backlog are later");
    }

    #[test]
    fn trend_ring_of_an_hour_of_seconds_stays_small() {
        // One noisy value a second for an hour, rounded to hundredths as instruments report.
        let policy = TrendPolicy { step_ms: 1000, len: 3600 };
        let mut rng = fastrand::Rng::with_seed(7);
        let mut r = TrendRing::default();
        let mut v: f64 = 50.0;
        for s in 0..7200u64 {
            v = ((v + rng.f64() - 0.5) * 100.0).round() / 100.0;
            r.record(policy, 1_700_000_000_000 + s * 1000, v);
        }
        let n = r.since(0).count();
        assert_eq!(n, 3600);
        // Decimal differences of a few hundredths cost about 10 bits, start and count a bit each.
        let per_bucket = r.encoded_bytes() as f64 / n as f64;
        assert!(per_bucket < 2.5, "{per_bucket:.2} bytes per bucket");
    }
}
