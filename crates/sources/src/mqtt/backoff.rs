//! Reconnect delays of the MQTT source: jittered exponential, starting over only after a
//! connection proved stable.

use std::time::Duration;

use tokio::time::Instant;

/// The first reconnect delay step.
pub const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// The largest reconnect delay step.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a connection must stay up before it counts as stable and the delays start over
/// from [`BACKOFF_MIN`]. A broker that accepts the connection and drops it at once, or input
/// that breaks every connection soon after it is made, meets growing delays instead of a
/// reconnect every [`BACKOFF_MIN`].
pub const STABLE_AFTER: Duration = Duration::from_secs(10);

/// The delay before the next connection attempt.
#[derive(Debug)]
pub struct Backoff {
    /// The current step: each wait is 50–150 % of it, and it doubles after every failure.
    step: Duration,
    /// When the current connection was made; `None` while not connected.
    up_since: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff { step: BACKOFF_MIN, up_since: None }
    }
}

impl Backoff {
    /// A connection was made at `now`.
    pub fn up(&mut self, now: Instant) {
        self.up_since = Some(now);
    }

    /// The connection dropped, or an attempt failed, at `now`: how long to wait before the
    /// next attempt. The step starts over only when the connection had stayed up
    /// [`STABLE_AFTER`]; otherwise it keeps doubling up to [`BACKOFF_MAX`].
    pub fn down(&mut self, now: Instant) -> Duration {
        if let Some(since) = self.up_since.take() {
            if now.saturating_duration_since(since) >= STABLE_AFTER {
                self.step = BACKOFF_MIN;
            }
        }
        let wait = self.step.mul_f64(0.5 + fastrand::f64());
        self.step = (self.step * 2).min(BACKOFF_MAX);
        wait
    }

    /// The current step (the middle of the next wait).
    pub fn step(&self) -> Duration {
        self.step
    }

    /// How long the current connection has been up at `now` (`None`: not connected).
    pub fn up_for(&self, now: Instant) -> Option<Duration> {
        self.up_since.map(|since| now.saturating_duration_since(since))
    }
}

/// Connections dropped within [`STABLE_AFTER`] of being made, within the last [`FLAP_WINDOW`]:
/// past [`FLAPS`] of them the source is probably in a take-over loop — another client uses its
/// client id, and the MQTT broker drops the older connection each time one connects — which
/// the log must say (the broker only closes the socket).
pub const FLAPS: usize = 3;
pub const FLAP_WINDOW: Duration = Duration::from_secs(60);

/// Counts short-lived connections; says when to warn (at most once per [`FLAP_WINDOW`]).
#[derive(Debug, Default)]
pub struct Flaps {
    recent: std::collections::VecDeque<Instant>,
    warned: Option<Instant>,
}

impl Flaps {
    /// A connection that had been up `up_for` dropped at `now`: the number of short-lived
    /// connections within the window when it is time to warn about them.
    pub fn dropped(&mut self, up_for: Duration, now: Instant) -> Option<usize> {
        if up_for >= STABLE_AFTER {
            return None;
        }
        self.recent.push_back(now);
        while self.recent.front().is_some_and(|t| now.saturating_duration_since(*t) > FLAP_WINDOW) {
            self.recent.pop_front();
        }
        let quiet = self.warned.is_none_or(|t| now.saturating_duration_since(t) >= FLAP_WINDOW);
        if self.recent.len() >= FLAPS && quiet {
            self.warned = Some(now);
            return Some(self.recent.len());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_flaps_warn_after_three_short_connections_a_minute_and_not_for_stable_ones() {
        let mut f = Flaps::default();
        let mut now = Instant::now();
        let short = Duration::from_secs(1);
        assert_eq!(f.dropped(STABLE_AFTER, now), None, "a stable connection is no flap");
        assert_eq!(f.dropped(short, now), None);
        now += Duration::from_secs(2);
        assert_eq!(f.dropped(short, now), None);
        now += Duration::from_secs(2);
        assert_eq!(f.dropped(short, now), Some(3));
        now += Duration::from_secs(2);
        assert_eq!(f.dropped(short, now), None, "warned once per window");
        now += FLAP_WINDOW;
        assert_eq!(f.dropped(short, now), None, "the old flaps left the window");
        now += Duration::from_secs(1);
        assert_eq!(f.dropped(short, now), None);
        now += Duration::from_secs(1);
        assert_eq!(f.dropped(short, now), Some(3), "a new loop is warned about again");
    }

    #[test]
    fn mqtt_backoff_grows_across_short_connections_and_restarts_after_a_stable_one() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        let mut now = t0;
        // Connected, then dropped after 1 s, eight times: no loop at the first step.
        for i in 0..8u32 {
            b.up(now);
            now += Duration::from_secs(1);
            let want = BACKOFF_MIN.saturating_mul(1 << i).min(BACKOFF_MAX);
            let wait = b.down(now);
            assert!(wait >= want / 2 && wait <= want.mul_f64(1.5), "attempt {i}: {wait:?} for step {want:?}");
            now += wait;
        }
        assert_eq!(b.step(), BACKOFF_MAX);
        // Failed attempts (never connected) grow the step too, and it stays at the ceiling.
        assert!(b.down(now) <= BACKOFF_MAX.mul_f64(1.5));
        assert_eq!(b.step(), BACKOFF_MAX);
        // A connection that stayed up STABLE_AFTER starts over.
        b.up(now);
        now += STABLE_AFTER;
        let wait = b.down(now);
        assert!(wait <= BACKOFF_MIN.mul_f64(1.5), "{wait:?}");
        assert_eq!(b.step(), BACKOFF_MIN * 2);
        // One just short of it does not.
        b.up(now);
        now += STABLE_AFTER - Duration::from_millis(1);
        b.down(now);
        assert_eq!(b.step(), BACKOFF_MIN * 4);
    }
}
