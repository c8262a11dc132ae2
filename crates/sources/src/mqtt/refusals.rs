//! Messages the MQTT source refuses: counted by reason in [`SourceStats`] and logged at warn,
//! at most once per reason per [`WARN_EVERY`] so that a flood of bad input cannot flood the
//! log (the others go to debug, and the next warn says how many there were).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::SourceStats;

/// Least time between two warnings for one reason.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// Longest topic text a log line carries.
const TOPIC_LOG_CHARS: usize = 200;

/// Counts and logs refusals of one source; owned by its connection task.
pub struct Refusals {
    source: String,
    stats: Arc<SourceStats>,
    /// Per reason: when it was last logged at warn, and how many refusals since then went to
    /// debug only.
    warned: HashMap<&'static str, (Instant, u64)>,
}

impl Refusals {
    pub fn new(source: String, stats: Arc<SourceStats>) -> Refusals {
        Refusals { source, stats, warned: HashMap::new() }
    }

    /// Counts `n` refusals for `reason` (the `reason` label of
    /// `switchboard_source_refused_total`) of a message of `topic` and `size` bytes, and logs
    /// `why`.
    pub fn refuse(&mut self, reason: &'static str, n: u64, topic: &str, size: usize, why: &str) {
        self.stats.refusals.add(reason, n);
        let topic: String = topic.chars().take(TOPIC_LOG_CHARS).collect();
        if self.warn_now(reason, n, Instant::now()) {
            let (_, quiet) = self.warned.get(reason).copied().unwrap_or((Instant::now(), 0));
            tracing::warn!(
                source = %self.source,
                reason,
                topic = %topic,
                size,
                refused = n,
                refused_without_warning = quiet,
                "MQTT message refused: {why}"
            );
            self.warned.insert(reason, (Instant::now(), 0));
        } else {
            tracing::debug!(source = %self.source, reason, topic = %topic, size, refused = n, "MQTT message refused: {why}");
        }
    }

    /// Whether a refusal for `reason` at `now` is logged at warn; when not, it is added to the
    /// ones the next warning reports.
    fn warn_now(&mut self, reason: &'static str, n: u64, now: Instant) -> bool {
        match self.warned.get_mut(reason) {
            Some((at, quiet)) if now.saturating_duration_since(*at) < WARN_EVERY => {
                *quiet += n;
                false
            }
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_refusals_are_all_counted_and_warned_once_per_interval_per_reason() {
        let stats = Arc::new(SourceStats::default());
        let mut r = Refusals::new("m".into(), stats.clone());
        for _ in 0..1000 {
            r.refuse("topic", 1, "bad topic", 3, "no channel");
        }
        r.refuse("oversized", 1, "big", 2_000_000, "too large");
        r.refuse("bound", 7, "spBv1.0/G/NBIRTH/E", 10, "full");
        assert_eq!(stats.refusals.list(), vec![("bound", 7), ("oversized", 1), ("topic", 1000)]);
        // One warning per reason so far; the rest were held back and are reported.
        assert_eq!(r.warned.get("topic").map(|w| w.1), Some(999));
        assert_eq!(r.warned.get("oversized").map(|w| w.1), Some(0));
        let later = Instant::now() + WARN_EVERY;
        assert!(r.warn_now("topic", 1, later), "the next interval warns again");
        assert!(!r.warn_now("oversized", 1, Instant::now()));
    }
}
