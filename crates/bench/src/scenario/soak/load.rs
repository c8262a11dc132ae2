//! The coordinator's two publishers: the point feed and the stream of new channels.
//!
//! Both run on schedules fixed at the start of the load phase and end by themselves at its
//! end: a fixed number of rounds, none started after the end (those are counted as skipped). A round that cannot start on
//! time starts as soon as the previous one is done; the feed still stamps its scheduled time,
//! so a publisher (or server) that falls behind shows up as latency.

use std::cell::Cell;

use serde_json::{json, Value};
use switchboard_client::HttpApi;
use tokio::time::Instant;

use super::plan::Plan;
use crate::common::{instant_of, unix_micros};

/// Most items per `POST /api/publish` batch.
pub const MAX_BATCH: usize = 1000;
/// New channels are published in rounds this often (a steady stream rather than one burst
/// a second).
pub const ROOM_ROUNDS_PER_S: u64 = 10;

/// Counters the progress line reads while the publishers run.
#[derive(Debug, Default)]
pub struct Live {
    pub feed_accepted: Cell<u64>,
    pub rooms_accepted: Cell<u64>,
    pub refused: Cell<u64>,
}

/// What publishing achieved.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PublishLog {
    pub rounds: u64,
    /// Rounds never started because the phase had ended before their turn came (the
    /// publisher fell a whole phase behind: a server too slow to take the load).
    pub skipped: u64,
    /// Accepted publications; the feed counts them per point.
    pub accepted: Vec<u64>,
    pub refused: u64,
    /// Largest delay between a round's schedule and its start, µs.
    pub late_max_us: u64,
    pub errors: Vec<String>,
}

impl PublishLog {
    pub fn accepted_total(&self) -> u64 {
        self.accepted.iter().sum()
    }

    fn note(&mut self, e: String) {
        if self.errors.len() < crate::accounting::MAX_ERRORS && !self.errors.contains(&e) {
            self.errors.push(e);
        }
    }

    /// Publishes `items` in batches; item `i` accepted counts under `slot(i)`. A refused
    /// batch (non-2xx, no answer) refuses all its items; an `{"error"}` result refuses one.
    async fn publish(&mut self, api: &HttpApi, items: &[(String, Value)], slot: impl Fn(usize) -> usize, live: &Live) {
        for (b, batch) in items.chunks(MAX_BATCH).enumerate() {
            let base = b * MAX_BATCH;
            let refused = match api.publish_batch(batch).await {
                Ok(results) => {
                    let mut refused = 0;
                    for (i, r) in results.iter().enumerate() {
                        match r {
                            Ok(_) => {
                                if let Some(n) = self.accepted.get_mut(slot(base + i)) {
                                    *n += 1;
                                }
                            }
                            Err(e) => {
                                refused += 1;
                                self.note(format!("publish {}: error {}: {}", batch[i].0, e.code, e.message));
                            }
                        }
                    }
                    // A reply with fewer results than items leaves the rest unconfirmed.
                    let missing = batch.len().saturating_sub(results.len()) as u64;
                    if missing > 0 {
                        self.note(format!("publish: {missing} items without a result"));
                    }
                    refused + missing
                }
                Err(e) => {
                    self.note(format!("publish: {e}"));
                    batch.len() as u64
                }
            };
            self.refused += refused;
            live.refused.set(live.refused.get() + refused);
        }
    }
}

/// The value of point `p` at round `k`: some motion for anyone watching; `t` is the round's
/// scheduled time (unix ms), from which subscribers measure latency.
pub fn point(p: usize, k: u64, t_ms: u64) -> Value {
    json!({"v": ((k.wrapping_mul(7) + p as u64) % 1000) as f64 / 10.0, "t": t_ms})
}

/// Publishes every point at `hz` from `start_us` (unix µs, a whole millisecond) until
/// `duration_s` has passed: round `k` at `start + k / hz`.
pub async fn feed(api: &HttpApi, plan: &Plan, hz: f64, start_us: u64, duration_s: f64, live: &Live) -> PublishLog {
    let n = plan.points.count;
    let mut log = PublishLog { accepted: vec![0; n], ..PublishLog::default() };
    let rounds = (duration_s * hz).ceil().max(1.0) as u64;
    let end = end_of(start_us, duration_s);
    for k in 0..rounds {
        let at_us = start_us + ((k as f64 * 1e6 / hz) / 1000.0).round() as u64 * 1000;
        tokio::time::sleep_until(instant_of(at_us)).await;
        if k > 0 && Instant::now() >= end {
            log.skipped = rounds - k;
            break;
        }
        log.late_max_us = log.late_max_us.max(unix_micros().saturating_sub(at_us));
        let items: Vec<(String, Value)> = (0..n).map(|p| (plan.points.name(p), point(p, k, at_us / 1000))).collect();
        let before = log.accepted_total();
        log.publish(api, &items, |i| i, live).await;
        live.feed_accepted.set(live.feed_accepted.get() + log.accepted_total() - before);
        log.rounds += 1;
    }
    log
}

/// The name of new channel `i` of the run `run`.
pub fn room(run: u64, i: u64) -> String {
    format!("room:soak-{run:x}-{i}")
}

/// How many new channels round `k` publishes so that the rounds add up to `rate` a second
/// with no drift: `⌊(k+1)·rate/R⌋ − ⌊k·rate/R⌋` for `R` rounds a second.
pub fn room_round(rate: u64, k: u64) -> u64 {
    (k + 1) * rate / ROOM_ROUNDS_PER_S - k * rate / ROOM_ROUNDS_PER_S
}

/// Publishes `rate` new channels a second from `start_us` until `duration_s` has passed, each
/// once, never again.
pub async fn rooms(api: &HttpApi, run: u64, rate: u64, start_us: u64, duration_s: f64, live: &Live) -> PublishLog {
    let mut log = PublishLog { accepted: vec![0], ..PublishLog::default() };
    if rate == 0 {
        return log;
    }
    let rounds = (duration_s * ROOM_ROUNDS_PER_S as f64).ceil() as u64;
    let end = end_of(start_us, duration_s);
    let mut next = 0u64;
    for k in 0..rounds {
        let at_us = start_us + k * 1_000_000 / ROOM_ROUNDS_PER_S;
        tokio::time::sleep_until(instant_of(at_us)).await;
        if k > 0 && Instant::now() >= end {
            log.skipped = rounds - k;
            break;
        }
        log.late_max_us = log.late_max_us.max(unix_micros().saturating_sub(at_us));
        let count = room_round(rate, k);
        let items: Vec<(String, Value)> =
            (next..next + count).map(|i| (room(run, i), json!({"n": i, "t": at_us / 1000}))).collect();
        next += count;
        let before = log.accepted_total();
        log.publish(api, &items, |_| 0, live).await;
        live.rooms_accepted.set(live.rooms_accepted.get() + log.accepted_total() - before);
        log.rounds += 1;
    }
    log
}

/// The instant `duration_s` after the unix µs `start_us`.
pub fn end_of(start_us: u64, duration_s: f64) -> Instant {
    instant_of(start_us + (duration_s * 1e6) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soak_rooms_add_up_to_the_rate_every_second() {
        for rate in [0, 1, 7, 200, 1000, 1234] {
            let second: u64 = (0..ROOM_ROUNDS_PER_S).map(|k| room_round(rate, k)).sum();
            assert_eq!(second, rate, "rate {rate}");
            let ten: u64 = (0..10 * ROOM_ROUNDS_PER_S).map(|k| room_round(rate, k)).sum();
            assert_eq!(ten, 10 * rate);
        }
        assert_eq!((0..10).map(|k| room_round(5, k)).collect::<Vec<_>>(), [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
        assert_eq!(room(255, 3), "room:soak-ff-3");
        let v = point(3, 2, 1_700_000_000_123);
        assert_eq!(v["t"], json!(1_700_000_000_123u64));
        assert!(v["v"].is_number());
    }
}
