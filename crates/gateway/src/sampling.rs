//! Per-subscription sampling: `max_rate_hz` (at most F deliveries per second per channel for
//! one subscriber, the latest value always arriving within 1/F s) and `deadband` (numeric
//! point values that moved less than the band from the last one sent are not sent).
//!
//! Subscribers without options never reach this module: the hub keeps them apart, so their
//! fan-out costs what it always did. A sampled subscriber has one [`Sampler`] per channel; the
//! hub offers it every publication (already encoded for its format, shared with every other
//! subscriber) and pushes what it lets through. A held value is sent by a timer task when its
//! interval is up, unless a newer one took its place first (then the newer one goes).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use switchboard_protocol::bounds::OutOfBounds;
use switchboard_protocol::code;
use switchboard_protocol::command::Deadband;
use switchboard_protocol::point;

pub use switchboard_protocol::bounds::{Band, Sampling};

use crate::error::ApiError;
use crate::outbox::{Delivery, Outbox, Pushed};

/// What a client is told of a number outside its bounds: 400 naming the field.
pub fn bad_number(e: OutOfBounds) -> ApiError {
    ApiError::new(code::BAD_REQUEST, e.to_string())
}

/// The sampling of `max_rate_hz` and `deadband` (query options of SSE and long-polling); 400
/// naming the field for a number outside its bounds ([`switchboard_protocol::bounds`]).
pub fn parse(max_rate_hz: Option<f64>, deadband: Option<Deadband>) -> Result<Option<Sampling>, ApiError> {
    Sampling::parse(max_rate_hz, deadband).map_err(bad_number)
}

/// What a deadband looks at in a publication: a point's numeric `v` and its quality `q`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PointView {
    pub v: Option<f64>,
    pub q: Option<String>,
    /// The data is an object with a `v` that is not a number (a band cannot apply).
    pub non_numeric: bool,
}

impl PointView {
    /// Reads `data` with the point parser ([`switchboard_protocol::point`]). A point whose
    /// `q` is malformed (not text, or given twice) is read as no point at all: a band compares
    /// values of one quality, and this one's quality cannot be told.
    pub fn of(data: &str) -> PointView {
        let p = point::parse(data);
        if p.q_malformed {
            return PointView::default();
        }
        PointView { v: p.v, q: p.q.map(Cow::into_owned), non_numeric: p.v_other }
    }
}

#[derive(Default)]
struct State {
    /// When the last delivery went out, and the value and quality it carried.
    sent_at: Option<Instant>,
    sent_v: Option<f64>,
    sent_q: Option<String>,
    sent_any: bool,
    /// The newest delivery waiting for its interval (latest wins).
    held: Option<Delivery>,
    /// A timer task is on its way to send `held`.
    timer: bool,
}

/// One sampled subscription of one channel.
pub struct Sampler {
    pub sampling: Sampling,
    pub outbox: Arc<Outbox>,
    state: Mutex<State>,
}

/// What [`Sampler::offer`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer {
    /// Push it now.
    Send,
    /// Within the deadband: never sent.
    Skip,
    /// Held until the interval is up; start a timer that fires after the given time.
    HoldAndArm(Duration),
    /// Held; a timer is already armed.
    Held,
}

impl Sampler {
    pub fn new(sampling: Sampling, outbox: Arc<Outbox>) -> Sampler {
        Sampler { sampling, outbox, state: Mutex::new(State::default()) }
    }

    /// Decides about one publication. `point` is read only when a band is set.
    pub fn offer(&self, d: &Delivery, point: &PointView, now: Instant) -> Offer {
        let mut st = self.state.lock();
        if let Some(band) = self.sampling.band {
            if self.within_band(&st, band, point) {
                // A newer value inside the band replaces nothing: what is held (outside the
                // band of the last one sent) still goes.
                return Offer::Skip;
            }
        }
        // Saturating: an instant past the clock's range means "not before a very long time".
        let due = match (self.sampling.min_interval, st.sent_at) {
            (Some(min), Some(at)) => at.checked_add(min).unwrap_or(now + Duration::from_secs(3600)),
            _ => now,
        };
        if due <= now && !st.timer {
            Self::mark_sent(&mut st, point, now);
            return Offer::Send;
        }
        st.held = Some(d.clone());
        // Remember what is held for the band of the next offers.
        st.sent_v = point.v.or(st.sent_v);
        st.sent_q = point.q.clone().or(st.sent_q.take());
        st.sent_any = true;
        if st.timer {
            Offer::Held
        } else {
            st.timer = true;
            Offer::HoldAndArm(due.saturating_duration_since(now))
        }
    }

    fn within_band(&self, st: &State, band: Band, point: &PointView) -> bool {
        if !st.sent_any || point.q != st.sent_q {
            return false;
        }
        let (Some(v), Some(last)) = (point.v, st.sent_v) else { return false };
        let width = match band {
            Band::Abs(a) => a,
            Band::Pct(p) => last.abs() * p / 100.0,
        };
        (v - last).abs() < width
    }

    fn mark_sent(st: &mut State, point: &PointView, now: Instant) {
        st.sent_at = Some(now);
        st.sent_v = point.v;
        st.sent_q = point.q.clone();
        st.sent_any = true;
    }

    /// The timer's end: sends what is held (if anything) and frees the timer.
    fn fire(&self, now: Instant) -> Option<Delivery> {
        let mut st = self.state.lock();
        st.timer = false;
        let d = st.held.take()?;
        st.sent_at = Some(now);
        Some(d)
    }

    /// Arms the timer of a held value: after `after`, the held delivery is pushed and flushed.
    /// The timer holds the sampler weakly: a client that leaves (its sampler removed from the
    /// hub) releases its outbox and socket at once, not when the timer fires.
    pub fn arm(self: &Arc<Self>, after: Duration, conflate: bool) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime (unit tests of the hub): send at once.
            if let Some(d) = self.fire(Instant::now()) {
                self.push(d, conflate);
            }
            return;
        };
        let me = Arc::downgrade(self);
        rt.spawn(async move {
            tokio::time::sleep(after).await;
            let Some(me) = me.upgrade() else { return };
            if let Some(d) = me.fire(Instant::now()) {
                me.push(d, conflate);
            }
        });
    }

    fn push(&self, d: Delivery, conflate: bool) {
        if self.outbox.push(d, conflate) == Pushed::Schedule {
            self.outbox.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_options_out_of_bounds_are_400_naming_the_field() {
        assert_eq!(parse(None, None).unwrap(), None);
        let e = parse(Some(1e-19), None).unwrap_err();
        assert!(e.code == 400 && e.message.starts_with("max_rate_hz"), "{e:?}");
        let e = parse(None, Some(Deadband { abs: Some(-1.0), pct: None })).unwrap_err();
        assert!(e.code == 400 && e.message.starts_with("deadband.abs"), "{e:?}");
    }

    #[tokio::test]
    async fn sampling_timer_does_not_keep_a_departed_subscriber() {
        use crate::metrics::Metrics;
        use crate::outbox::tests::TestWire;
        use crate::outbox::Frame;
        use switchboard_protocol::Format;
        let wire = TestWire::open(usize::MAX);
        let outbox = Arc::new(Outbox::new(1, Format::Json, wire, 1 << 20, Arc::new(Metrics::default())));
        let sampling = parse(Some(switchboard_protocol::bounds::MIN_RATE_HZ), None).unwrap().unwrap();
        let sampler = Arc::new(Sampler::new(sampling, outbox.clone()));
        let d = |off| Delivery {
            frame: Frame::message(Format::Json, b"{}"),
            channel: "c".into(),
            offset: off,
            born: Instant::now(),
        };
        let now = Instant::now();
        assert_eq!(sampler.offer(&d(1), &PointView::default(), now), Offer::Send);
        let Offer::HoldAndArm(after) = sampler.offer(&d(2), &PointView::default(), now) else { panic!("not held") };
        assert_eq!(after, Duration::from_secs(100));
        sampler.arm(after, false);
        assert_eq!(Arc::strong_count(&outbox), 2, "the sampler's");
        drop(sampler);
        assert_eq!(Arc::strong_count(&outbox), 1, "the armed timer holds no outbox");
    }

    #[test]
    fn sampling_reads_points_and_bare_numbers() {
        assert_eq!(PointView::of(r#"{"v": 1.5, "q": "good", "t": 1}"#).v, Some(1.5));
        assert_eq!(PointView::of(r#"{"v": 1.5, "q": "bad"}"#).q.as_deref(), Some("bad"));
        assert_eq!(PointView::of("7").v, Some(7.0));
        let s = PointView::of(r#"{"v": "open"}"#);
        assert!(s.non_numeric && s.v.is_none());
        assert!(!PointView::of(r#"{"text": "hi"}"#).non_numeric);
    }
}
