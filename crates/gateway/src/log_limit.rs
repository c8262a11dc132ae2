//! [`LogLimit`]: warnings that clients can cause in bulk — a failing hook asked for every
//! subscribe of a connection storm, a poll session record that cannot be written — are written
//! at most once per kind per [`INTERVAL`]; the next line says how many were left out
//! (`suppressed=N`). The log stays readable, and writing it never becomes the node's work.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least time between two lines of one kind.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// One kind of warning: when its last line was written and how many were left out since.
///
/// A `std::sync::Mutex`: held only to read and update two fields, never across an await, and
/// taken only on the failure paths that log.
#[derive(Debug, Default)]
pub struct LogLimit {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimit {
    pub const fn new() -> LogLimit {
        LogLimit { state: Mutex::new(State { last: None, suppressed: 0 }) }
    }

    /// Whether a line of this kind is written now: `Some(n)` with the lines left out since the
    /// last one written (for its `suppressed` field); `None` counts this one as left out.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        // A panic while holding the lock cannot leave the two counters inconsistent in a way
        // that matters for logging: the state is taken as it is.
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match s.last {
            Some(last) if now.saturating_duration_since(last) < INTERVAL => {
                s.suppressed += 1;
                None
            }
            _ => {
                s.last = Some(now);
                Some(std::mem::take(&mut s.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_limit_writes_one_line_per_interval_and_counts_the_rest() {
        let limit = LogLimit::new();
        let t0 = Instant::now();
        assert_eq!(limit.admit_at(t0), Some(0));
        for i in 1..200 {
            assert_eq!(limit.admit_at(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(limit.admit_at(t0 + INTERVAL - Duration::from_millis(1)), None);
        assert_eq!(limit.admit_at(t0 + INTERVAL), Some(200));
        assert_eq!(limit.admit_at(t0 + INTERVAL + Duration::from_secs(1)), None);
        assert_eq!(limit.admit_at(t0 + 3 * INTERVAL), Some(1));
    }
}
