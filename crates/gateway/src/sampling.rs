//! Per-subscription sampling: `max_rate_hz` (at most F deliveries per second per channel for
//! one subscriber, the latest value always arriving within 1/F s) and `deadband` (numeric
//! point values that moved less than the band from the last one sent are not sent).
//!
//! Subscribers without options never reach this module: the hub keeps them apart, so their
//! fan-out costs what it always did. A sampled subscriber has one [`Sampler`] per channel; the
//! hub offers it every publication (already encoded for its format, shared with every other
//! subscriber) and pushes what it lets through. A held value is sent by a timer task when its
//! interval is up, unless a newer one took its place first (then the newer one goes).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Deserialize;
use switchboard_protocol::code;
use switchboard_protocol::command::{Deadband, SubscribeRequest};

use crate::error::ApiError;
use crate::outbox::{Delivery, Outbox, Pushed};

/// Fastest rate a subscription may ask for; above it sampling would cost more than it saves.
pub const MAX_RATE_HZ: f64 = 1000.0;
/// Slowest rate a subscription may ask for (one delivery per 100 s): the held value's timer
/// and every instant computed from the interval stay small and exact.
pub const MIN_RATE_HZ: f64 = 0.01;
/// Widest absolute deadband; wider would suppress every change of any real value.
pub const MAX_DEADBAND_ABS: f64 = 1e15;

/// The sampling a subscribe asked for (per subscription, the same for every channel it names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Shortest time between two deliveries of one channel.
    pub min_interval: Option<Duration>,
    pub band: Option<Band>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Band {
    Abs(f64),
    /// Percent of the magnitude of the last value sent.
    Pct(f64),
}

impl Sampling {
    /// The sampling of a subscribe command, `None` when it asks for none; a bad value is 400
    /// naming the field.
    pub fn of(req: &SubscribeRequest) -> Result<Option<Sampling>, ApiError> {
        Sampling::parse(req.max_rate_hz, req.deadband)
    }

    pub fn parse(max_rate_hz: Option<f64>, deadband: Option<Deadband>) -> Result<Option<Sampling>, ApiError> {
        let bad = |m: String| ApiError::new(code::BAD_REQUEST, m);
        let min_interval = match max_rate_hz {
            None => None,
            Some(hz) if (MIN_RATE_HZ..=MAX_RATE_HZ).contains(&hz) => Some(Duration::from_secs_f64(1.0 / hz)),
            Some(hz) => return Err(bad(format!("max_rate_hz: {hz} is not within {MIN_RATE_HZ}..={MAX_RATE_HZ}"))),
        };
        let band = match deadband {
            None => None,
            Some(Deadband { abs: Some(a), pct: None }) if (0.0..=MAX_DEADBAND_ABS).contains(&a) => Some(Band::Abs(a)),
            Some(Deadband { abs: None, pct: Some(p) }) if p.is_finite() && (0.0..=100.0).contains(&p) => {
                Some(Band::Pct(p))
            }
            Some(Deadband { abs: Some(_), pct: Some(_) }) | Some(Deadband { abs: None, pct: None }) => {
                return Err(bad("deadband: give exactly one of abs or pct".into()))
            }
            Some(Deadband { abs: Some(a), .. }) => {
                return Err(bad(format!("deadband.abs: {a} is not within 0..={MAX_DEADBAND_ABS}")))
            }
            Some(Deadband { pct: Some(p), .. }) => return Err(bad(format!("deadband.pct: {p} is not within 0..=100"))),
        };
        Ok((min_interval.is_some() || band.is_some()).then_some(Sampling { min_interval, band }))
    }
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
    pub fn of(data: &str) -> PointView {
        #[derive(Deserialize)]
        struct P<'a> {
            #[serde(default, borrow)]
            v: Option<&'a serde_json::value::RawValue>,
            #[serde(default)]
            q: Option<String>,
        }
        match serde_json::from_str::<P<'_>>(data) {
            Ok(p) => {
                let v = p.v.and_then(|raw| raw.get().parse::<f64>().ok()).filter(|v| v.is_finite());
                PointView { non_numeric: p.v.is_some() && v.is_none(), v, q: p.q }
            }
            // A bare number is a value too.
            Err(_) => {
                PointView { v: data.trim().parse::<f64>().ok().filter(|v| v.is_finite()), ..PointView::default() }
            }
        }
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

    fn band(b: Option<Deadband>) -> Result<Option<Sampling>, ApiError> {
        Sampling::parse(None, b)
    }

    #[test]
    fn sampling_options_are_checked_and_bad_ones_name_their_field() {
        assert_eq!(Sampling::parse(None, None).unwrap(), None);
        let s = Sampling::parse(Some(4.0), None).unwrap().unwrap();
        assert_eq!(s.min_interval, Some(Duration::from_millis(250)));
        assert!(Sampling::parse(Some(MIN_RATE_HZ), None).unwrap().is_some());
        for hz in [0.0, -1.0, f64::INFINITY, f64::NAN, 5000.0, 1e-9, 1e-19, 1e-30, 1e-300, 5e-324, 0.009] {
            let e = Sampling::parse(Some(hz), None).unwrap_err();
            assert!(e.code == 400 && e.message.starts_with("max_rate_hz"), "{e:?}");
        }
        assert_eq!(band(Some(Deadband { abs: Some(0.5), pct: None })).unwrap().unwrap().band, Some(Band::Abs(0.5)));
        assert_eq!(band(Some(Deadband { abs: None, pct: Some(2.0) })).unwrap().unwrap().band, Some(Band::Pct(2.0)));
        assert!(band(Some(Deadband { abs: Some(-1.0), pct: None })).unwrap_err().message.starts_with("deadband.abs"));
        assert!(band(Some(Deadband { abs: Some(1e300), pct: None })).unwrap_err().message.starts_with("deadband.abs"));
        assert!(band(Some(Deadband { abs: None, pct: Some(101.0) })).unwrap_err().message.starts_with("deadband.pct"));
        assert!(band(Some(Deadband::default())).unwrap_err().message.starts_with("deadband"));
    }

    #[tokio::test]
    async fn sampling_timer_does_not_keep_a_departed_subscriber() {
        use crate::metrics::Metrics;
        use crate::outbox::tests::TestWire;
        use crate::outbox::Frame;
        use switchboard_protocol::Format;
        let wire = TestWire::open(usize::MAX);
        let outbox = Arc::new(Outbox::new(1, Format::Json, wire, 1 << 20, Arc::new(Metrics::default())));
        let sampling = Sampling::parse(Some(MIN_RATE_HZ), None).unwrap().unwrap();
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
