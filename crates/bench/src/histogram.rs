//! [`Latency`]: an HDR histogram of microseconds that travels between processes.
//!
//! Workers serialize their histograms (HdrHistogram V2, base64) into their final report and
//! the coordinator adds them up. Addition of HDR histograms with the same bounds is exact: the
//! merged histogram has the same counts as one histogram that recorded every value, so
//! percentiles over many processes are not averaged approximations.

use base64::Engine;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use serde::Serialize;

/// Lowest recordable value: 1 µs.
const LOW: u64 = 1;
/// Highest recordable value: one hour in µs; larger values saturate.
const HIGH: u64 = 3_600_000_000;
/// Three significant digits: ±0.1 % per value.
const SIGFIG: u8 = 3;

/// Why a serialized histogram could not be read back or merged.
#[derive(Debug, thiserror::Error)]
pub enum HistogramError {
    #[error("histogram is not valid base64: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error("histogram does not deserialize: {0:?}")]
    Decode(hdrhistogram::serialization::DeserializeError),
    #[error("histograms cannot be added: {0:?}")]
    Add(hdrhistogram::AdditionError),
}

/// A latency (or duration) histogram in microseconds.
#[derive(Debug, Clone)]
pub struct Latency {
    hist: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

/// Percentiles and moments of a histogram, in milliseconds; `None` without samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct LatencySummary {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
    pub max: Option<f64>,
    pub mean: Option<f64>,
    pub stdev: Option<f64>,
}

impl Latency {
    pub fn new() -> Self {
        // Constant, valid bounds (low >= 1, high >= 2 * low, sigfig <= 5): creation cannot fail.
        let hist = Histogram::new_with_bounds(LOW, HIGH, SIGFIG).expect("constant histogram bounds are valid");
        Latency { hist }
    }

    /// Records one value in µs; values beyond the range saturate at its ends.
    pub fn record(&mut self, micros: u64) {
        self.hist.saturating_record(micros.max(LOW));
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// Adds every count of `other` (exact).
    pub fn merge(&mut self, other: &Latency) -> Result<(), HistogramError> {
        self.hist.add(&other.hist).map_err(HistogramError::Add)
    }

    /// The value at `quantile` (0..=1) in µs.
    pub fn value_at(&self, quantile: f64) -> u64 {
        self.hist.value_at_quantile(quantile)
    }

    pub fn max_us(&self) -> u64 {
        self.hist.max()
    }

    pub fn inner(&self) -> &Histogram<u64> {
        &self.hist
    }

    /// Base64 of the HdrHistogram V2 serialization (interoperable with other HDR tools).
    pub fn to_base64(&self) -> String {
        let mut buf = Vec::new();
        // Serializing into a Vec cannot fail on I/O; the V2 encoder has no other failure for a
        // histogram with these bounds.
        if V2Serializer::new().serialize(&self.hist, &mut buf).is_err() {
            buf.clear();
        }
        base64::engine::general_purpose::STANDARD.encode(buf)
    }

    pub fn from_base64(s: &str) -> Result<Latency, HistogramError> {
        let bytes = base64::engine::general_purpose::STANDARD.decode(s)?;
        let hist: Histogram<u64> =
            Deserializer::new().deserialize(&mut bytes.as_slice()).map_err(HistogramError::Decode)?;
        let mut out = Latency::new();
        out.hist.add(&hist).map_err(HistogramError::Add)?;
        Ok(out)
    }

    /// p50 … max, mean and stdev in milliseconds.
    pub fn summary(&self) -> LatencySummary {
        if self.hist.is_empty() {
            return LatencySummary::default();
        }
        let ms = |us: u64| Some(us as f64 / 1000.0);
        LatencySummary {
            p50: ms(self.value_at(0.50)),
            p90: ms(self.value_at(0.90)),
            p99: ms(self.value_at(0.99)),
            p999: ms(self.value_at(0.999)),
            max: ms(self.hist.max()),
            mean: Some(self.hist.mean() / 1000.0),
            stdev: Some(self.hist.stdev() / 1000.0),
        }
    }

    /// The percentile distribution as `(quantile, value µs)` points, for charts.
    pub fn distribution(&self) -> Vec<(f64, u64)> {
        if self.hist.is_empty() {
            return Vec::new();
        }
        self.hist.iter_quantiles(5).map(|v| (v.quantile_iterated_to(), v.value_iterated_to())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_merge_is_exact() {
        // Three "workers" with different distributions, merged through their serialized form,
        // must equal one histogram that saw every value.
        let mut all = Latency::new();
        let mut merged = Latency::new();
        let mut seed = 0x9e3779b97f4a7c15u64;
        for w in 0..3u64 {
            let mut part = Latency::new();
            for i in 0..20_000u64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let v = match w {
                    0 => 50 + seed % 500,
                    1 => 1_000 + seed % 100_000,
                    _ => {
                        if i % 1000 == 0 {
                            5_000_000
                        } else {
                            200 + seed % 50
                        }
                    }
                };
                part.record(v);
                all.record(v);
            }
            let wire = part.to_base64();
            merged.merge(&Latency::from_base64(&wire).unwrap()).unwrap();
        }
        assert_eq!(merged.count(), 60_000);
        assert_eq!(merged.inner(), all.inner());
        for q in [0.0, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0] {
            assert_eq!(merged.value_at(q), all.value_at(q), "quantile {q}");
        }
        assert_eq!(merged.summary(), all.summary());
    }

    #[test]
    fn histogram_saturates_instead_of_failing() {
        let mut h = Latency::new();
        h.record(0);
        h.record(u64::MAX);
        assert_eq!(h.count(), 2);
        assert!(h.max_us() >= HIGH);
        assert_eq!(Latency::new().summary(), LatencySummary::default());
        assert!(Latency::from_base64("not base64!").is_err());
    }
}
