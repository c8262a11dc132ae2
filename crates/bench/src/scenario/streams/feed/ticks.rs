//! The coordinator's side of a feed: every point updated once per tick in batched
//! `POST /api/publish` calls ([`TickPublisher`]) on the tick schedule ([`run_ticks`]), and the
//! per-tick completion read from the subscribers' bursts ([`completion`]).

use std::time::Duration;

use serde_json::{json, Value};
use switchboard_client::HttpApi;
use tokio::time::Instant;

use super::Points;
use crate::accounting::BurstTally;
use crate::common::unix_micros;
use crate::progress::{Progress, Rate};
use crate::worker::Pool;

/// Updates every point of a feed once per call, in batches, over one kept-alive connection.
pub(crate) struct TickPublisher {
    pub api: HttpApi,
    pub points: Points,
    /// Items per `POST /api/publish`.
    pub batch: usize,
}

/// What one tick's publishing achieved.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct TickOutcome {
    pub accepted: u64,
    pub rejected: u64,
    pub errors: Vec<String>,
}

impl TickPublisher {
    /// The update of point `i` at tick `seq`, scheduled for `us`.
    pub fn update(i: usize, seq: u64, us: u64) -> Value {
        // Some motion so a watching dashboard shows change; the value itself is not checked.
        let v = ((seq.wrapping_mul(7) + i as u64) % 1000) as f64 / 10.0;
        json!({"v": v, "t": us / 1000, "q": "good", "us": us, "seq": seq})
    }

    /// Publishes tick `seq` of every point, stamped `us`.
    pub async fn publish(&self, seq: u64, us: u64) -> TickOutcome {
        let mut out = TickOutcome::default();
        let batch = self.batch.max(1);
        let mut i = 0;
        while i < self.points.count {
            let end = (i + batch).min(self.points.count);
            let items: Vec<(String, Value)> =
                (i..end).map(|p| (self.points.name(p), Self::update(p, seq, us))).collect();
            match self.api.publish_batch(&items).await {
                Ok(results) => {
                    for r in &results {
                        match r {
                            Ok(_) => out.accepted += 1,
                            Err(e) => {
                                out.rejected += 1;
                                note(&mut out.errors, format!("publish: error {}: {}", e.code, e.message));
                            }
                        }
                    }
                    // A reply with fewer results than items leaves the rest unconfirmed.
                    let missing = (end - i).saturating_sub(results.len()) as u64;
                    if missing > 0 {
                        out.rejected += missing;
                        note(&mut out.errors, format!("publish: {missing} items without a result"));
                    }
                }
                Err(e) => {
                    out.rejected += (end - i) as u64;
                    note(&mut out.errors, format!("publish: {e}"));
                }
            }
            i = end;
        }
        out
    }
}

fn note(errors: &mut Vec<String>, e: String) {
    if errors.len() < crate::accounting::MAX_ERRORS && !errors.contains(&e) {
        errors.push(e);
    }
}

/// The ticks of a measured phase.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticks {
    /// `seq` of the first tick.
    pub first_seq: u64,
    pub count: u64,
    pub hz: f64,
}

/// What the coordinator did over the measured phase.
#[derive(Debug, Default)]
pub(crate) struct TickLog {
    /// Scheduled time of the first tick, unix µs.
    pub start_us: u64,
    /// Per tick: scheduled time (unix µs) and accepted updates.
    pub scheduled_us: Vec<u64>,
    pub accepted: Vec<u64>,
    pub rejected: u64,
    /// Largest delay between a tick's scheduled time and the start of its publishing.
    pub late_max_us: u64,
    pub errors: Vec<String>,
}

impl TickLog {
    pub fn accepted_total(&self) -> u64 {
        self.accepted.iter().sum()
    }
}

/// Publishes `ticks` at their schedule, handling worker messages (and the progress line) in
/// between. Tick `k` is scheduled `k / hz` seconds after the first; a tick that cannot start
/// on time starts as soon as the previous one is done, still stamped with its schedule.
pub(crate) async fn run_ticks(
    pool: &mut Pool,
    progress: &mut Progress,
    publisher: &TickPublisher,
    ticks: Ticks,
    scenario: &str,
) -> TickLog {
    let period_us = 1e6 / ticks.hz;
    let phase_start = Instant::now();
    let mut log = TickLog { start_us: unix_micros(), ..TickLog::default() };
    let mut rate = Rate::default();
    for k in 0..ticks.count {
        let offset_us = (k as f64 * period_us) as u64;
        let at = phase_start + Duration::from_micros(offset_us);
        let done = k;
        pool.run_until(
            at,
            progress,
            |p| {
                let t = p.totals();
                format!(
                    "{scenario}: tick {done}/{}, {} updates delivered ({:.0}/s), {} dropped",
                    ticks.count,
                    t.received,
                    rate.per_s(t.received),
                    t.dropped
                )
            },
            |_| false,
        )
        .await;
        let us = log.start_us + offset_us;
        log.late_max_us = log.late_max_us.max(unix_micros().saturating_sub(us));
        let o = publisher.publish(ticks.first_seq + k, us).await;
        log.scheduled_us.push(us);
        log.accepted.push(o.accepted);
        log.rejected += o.rejected;
        for e in o.errors {
            note(&mut log.errors, e);
        }
    }
    log
}

/// Per-tick completion: how many ticks reached every subscriber, and how late the last
/// delivery of each complete tick was after its scheduled time.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Completion {
    pub incomplete: u64,
    /// Complete ticks whose last delivery came more than one period after their schedule.
    pub late: u64,
    pub max_ms: Option<f64>,
    pub mean_ms: Option<f64>,
}

/// `bursts[first_seq + k]` against `log.accepted[k] × subscribers_per_point`.
pub(crate) fn completion(
    log: &TickLog,
    bursts: &[BurstTally],
    first_seq: u64,
    subscribers: u64,
    hz: f64,
) -> Completion {
    let mut c = Completion::default();
    let mut times = Vec::new();
    for (k, (&us, &accepted)) in log.scheduled_us.iter().zip(&log.accepted).enumerate() {
        let b = bursts.get(first_seq as usize + k).copied().unwrap_or_default();
        let want = accepted * subscribers;
        if want == 0 || b.count < want {
            c.incomplete += 1;
            continue;
        }
        let ms = b.last_us.saturating_sub(us) as f64 / 1000.0;
        if ms > 1000.0 / hz {
            c.late += 1;
        }
        times.push(ms);
    }
    c.max_ms = times.iter().copied().reduce(f64::max);
    c.mean_ms = (!times.is_empty()).then(|| times.iter().sum::<f64>() / times.len() as f64);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feed_completion_counts_incomplete_and_late_ticks() {
        let log = TickLog {
            start_us: 1_000_000,
            scheduled_us: vec![1_000_000, 2_000_000, 3_000_000],
            accepted: vec![10, 10, 9],
            ..TickLog::default()
        };
        // Two subscribers per point: tick 0 complete in 5 ms, tick 1 complete but 1.5 s late,
        // tick 2 had 9 accepted updates and 17 of 18 deliveries.
        let bursts = vec![
            BurstTally { count: 20, last_us: 1_005_000 },
            BurstTally { count: 20, last_us: 3_500_000 },
            BurstTally { count: 17, last_us: 3_100_000 },
        ];
        let c = completion(&log, &bursts, 0, 2, 1.0);
        assert_eq!((c.incomplete, c.late), (1, 1));
        assert_eq!(c.max_ms, Some(1500.0));
        assert_eq!(c.mean_ms, Some(752.5));
        // Tick numbers that start at 1 (the dashboard's): `bursts[0]` is not a tick.
        let on_time = BurstTally { count: 20, last_us: 2_900_000 };
        let c = completion(&log, &[BurstTally::default(), on_time, on_time, on_time], 1, 2, 1.0);
        assert_eq!((c.incomplete, c.late), (0, 1), "only tick 0 ends more than a period after its schedule");
    }
}
