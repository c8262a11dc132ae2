//! The documented range of every number a client sends in a command (docs/protocol.md,
//! "Bounds"), checked here and nowhere else: a value inside its range is safe for every
//! computation the node makes from it (intervals, instants, bucket counts), so no client number
//! can overflow a clock or an allocation. Values outside are refused with 400 naming the field.

use std::time::Duration;

use crate::command::{Deadband, SubscribeRequest, TrendOption};

/// Fastest `max_rate_hz`; above it sampling would cost more than it saves.
pub const MAX_RATE_HZ: f64 = 1000.0;
/// Slowest `max_rate_hz` (one delivery per 100 s): the held value's timer and every instant
/// computed from the interval stay small and exact.
pub const MIN_RATE_HZ: f64 = 0.01;
/// Widest absolute deadband; wider would suppress every change of any real value.
pub const MAX_DEADBAND_ABS: f64 = 1e15;
/// Widest relative deadband, in percent of the last value sent.
pub const MAX_DEADBAND_PCT: f64 = 100.0;
/// Longest trend window a read may ask for (a week).
pub const MAX_TREND_WINDOW_S: u64 = 7 * 24 * 3600;

pub use crate::OutOfBounds;

fn out(field: &'static str, message: String) -> OutOfBounds {
    OutOfBounds { field: field.into(), message }
}

/// A deadband in force: absolute, or percent of the magnitude of the last value sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Band {
    Abs(f64),
    Pct(f64),
}

/// The sampling a subscribe asked for (per subscription, the same for every channel it names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Shortest time between two deliveries of one channel: at most 100 s.
    pub min_interval: Option<Duration>,
    pub band: Option<Band>,
}

impl Sampling {
    /// The sampling of `max_rate_hz` and `deadband`, `None` when they ask for none.
    pub fn parse(max_rate_hz: Option<f64>, deadband: Option<Deadband>) -> Result<Option<Sampling>, OutOfBounds> {
        let min_interval = match max_rate_hz {
            None => None,
            Some(hz) if (MIN_RATE_HZ..=MAX_RATE_HZ).contains(&hz) => Some(Duration::from_secs_f64(1.0 / hz)),
            Some(hz) => return Err(out("max_rate_hz", format!("{hz} is not within {MIN_RATE_HZ}..={MAX_RATE_HZ}"))),
        };
        let band = match deadband {
            None => None,
            Some(Deadband { abs: Some(a), pct: None }) if (0.0..=MAX_DEADBAND_ABS).contains(&a) => Some(Band::Abs(a)),
            Some(Deadband { abs: None, pct: Some(p) }) if (0.0..=MAX_DEADBAND_PCT).contains(&p) => Some(Band::Pct(p)),
            Some(Deadband { abs: Some(_), pct: Some(_) }) | Some(Deadband { abs: None, pct: None }) => {
                return Err(out("deadband", "give exactly one of abs or pct".into()))
            }
            Some(Deadband { abs: Some(a), .. }) => {
                return Err(out("deadband.abs", format!("{a} is not within 0..={MAX_DEADBAND_ABS}")))
            }
            Some(Deadband { pct: Some(p), .. }) => {
                return Err(out("deadband.pct", format!("{p} is not within 0..={MAX_DEADBAND_PCT}")))
            }
        };
        Ok((min_interval.is_some() || band.is_some()).then_some(Sampling { min_interval, band }))
    }
}

/// Checks a trend window and step (`window_s` in 1..=a week, `step_s` at least 1 and at most
/// the window).
pub fn trend(t: TrendOption) -> Result<(), OutOfBounds> {
    if t.window_s == 0 || t.window_s > MAX_TREND_WINDOW_S {
        return Err(out("window_s", format!("{} is not within 1..={MAX_TREND_WINDOW_S}", t.window_s)));
    }
    match t.step_s {
        Some(0) => Err(out("step_s", "0 is not a step".into())),
        Some(s) if s > t.window_s => Err(out("step_s", format!("{s} exceeds window_s"))),
        _ => Ok(()),
    }
}

/// Every number of a subscribe: its sampling and its trend option.
pub fn subscribe(req: &SubscribeRequest) -> Result<Option<Sampling>, OutOfBounds> {
    if let Some(t) = req.trend {
        trend(t)?;
    }
    Sampling::parse(req.max_rate_hz, req.deadband)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn bounds_refuse_rates_outside_the_range_naming_the_field() {
        assert_eq!(Sampling::parse(None, None).unwrap(), None);
        let s = Sampling::parse(Some(4.0), None).unwrap().unwrap();
        assert_eq!(s.min_interval, Some(Duration::from_millis(250)));
        assert_eq!(
            Sampling::parse(Some(MIN_RATE_HZ), None).unwrap().unwrap().min_interval,
            Some(Duration::from_secs(100))
        );
        for hz in [0.0, -1.0, f64::INFINITY, f64::NAN, 5000.0, 1e-9, 1e-19, 1e-30, 1e-300, 5e-324, 0.0099] {
            let e = Sampling::parse(Some(hz), None).unwrap_err();
            assert_eq!(e.field, "max_rate_hz", "{hz}");
        }
    }

    #[test]
    fn bounds_check_deadbands_and_trends() {
        let band = |abs, pct| Sampling::parse(None, Some(Deadband { abs, pct }));
        assert_eq!(band(Some(0.5), None).unwrap().unwrap().band, Some(Band::Abs(0.5)));
        assert_eq!(band(None, Some(2.0)).unwrap().unwrap().band, Some(Band::Pct(2.0)));
        assert_eq!(band(Some(-1.0), None).unwrap_err().field, "deadband.abs");
        assert_eq!(band(Some(1e300), None).unwrap_err().field, "deadband.abs");
        assert_eq!(band(None, Some(101.0)).unwrap_err().field, "deadband.pct");
        assert_eq!(band(None, None).unwrap_err().field, "deadband");
        assert!(trend(TrendOption { window_s: 3600, step_s: Some(10) }).is_ok());
        assert_eq!(trend(TrendOption { window_s: 0, step_s: None }).unwrap_err().field, "window_s");
        assert_eq!(trend(TrendOption { window_s: u64::MAX, step_s: None }).unwrap_err().field, "window_s");
        assert_eq!(trend(TrendOption { window_s: 60, step_s: Some(0) }).unwrap_err().field, "step_s");
        assert_eq!(trend(TrendOption { window_s: 60, step_s: Some(61) }).unwrap_err().field, "step_s");
    }
}
