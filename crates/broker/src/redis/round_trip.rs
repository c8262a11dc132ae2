//! The round trip of the pub/sub link's keepalive PING, for readiness and the
//! `switchboard_broker_rtt_seconds` gauge: how late what comes over the link is (a PONG queues
//! behind every message Redis sent before it, and behind a server that stopped answering).

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// The last measured round trip and the PING still unanswered, if any. One lock taken for a
/// few instructions by the link's manager (once per PING) and by readers (a `/readyz` or a
/// scrape): never contended enough to matter.
#[derive(Default)]
pub(super) struct RoundTrip {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last: Option<Duration>,
    sent: Option<Instant>,
}

impl RoundTrip {
    /// A PING went out now.
    pub fn start(&self) {
        self.state.lock().sent = Some(Instant::now());
    }

    /// Its PONG came back.
    pub fn finish(&self) {
        let mut s = self.state.lock();
        if let Some(sent) = s.sent.take() {
            s.last = Some(sent.elapsed());
        }
    }

    /// The connection it was measured on is gone: nothing is known of the next one yet.
    pub fn reset(&self) {
        *self.state.lock() = State::default();
    }

    /// The last round trip, or the age of the PING in flight when that is longer (a server
    /// that stopped answering shows as slow before the PING times out); `None` before the
    /// first PING of a connection.
    pub fn current(&self) -> Option<Duration> {
        let s = self.state.lock();
        let waiting = s.sent.map(|t| t.elapsed());
        match (s.last, waiting) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn broker_round_trip_counts_an_unanswered_ping() {
        let rt = RoundTrip::default();
        assert_eq!(rt.current(), None);
        rt.start();
        tokio::time::advance(Duration::from_millis(20)).await;
        rt.finish();
        assert_eq!(rt.current(), Some(Duration::from_millis(20)));
        rt.start();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(rt.current(), Some(Duration::from_secs(2)), "a PING in flight for 2 s");
        rt.finish();
        rt.start();
        assert_eq!(rt.current(), Some(Duration::from_secs(2)), "the last one until the next is answered");
        tokio::time::advance(Duration::from_millis(5)).await;
        rt.finish();
        assert_eq!(rt.current(), Some(Duration::from_millis(5)));
        rt.reset();
        assert_eq!(rt.current(), None);
    }
}
