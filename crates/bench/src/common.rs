//! Flags every scenario shares, and the small helpers built on them: the HTTP API base, the
//! output directory, how many worker processes, and which loopback source address each
//! connection uses.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use switchboard_client::connect::{Compression, ConnectOptions, Endpoint};
use switchboard_protocol::Format;

/// Most connections one worker process holds: under the 20,000 open-file limit per process
/// with room for the runtime's own descriptors.
pub const MAX_CONNS_PER_PROC: usize = 15_000;
/// Connections per worker when `--procs` is not given.
pub const DEFAULT_CONNS_PER_PROC: usize = 10_000;
/// Connections per loopback source address. One address has ~28k ephemeral ports
/// (32768–60999) and a bound socket takes its port before knowing the destination.
pub const CONNS_PER_SOURCE_ADDR: usize = 20_000;

/// Bounds of a paced scenario (see [`crate::report::pace_criteria`]); both default to the
/// scenario's period.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PaceArgs {
    /// Largest delivery p99 (ms) of a passing run [default: the scenario's period].
    #[arg(long)]
    pub max_p99_ms: Option<f64>,
    /// Latest a round of publications may start after its scheduled time (ms) in a passing run
    /// [default: the scenario's period].
    #[arg(long)]
    pub max_publish_late_ms: Option<f64>,
}

impl PaceArgs {
    /// `(max late ms, max p99 ms)` for a scenario whose period is `period_ms`.
    pub fn bounds(&self, period_ms: f64) -> (f64, f64) {
        (self.max_publish_late_ms.unwrap_or(period_ms), self.max_p99_ms.unwrap_or(period_ms))
    }
}

/// Flags common to all scenarios.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// WebSocket URL of the server under test.
    #[arg(long, default_value = "ws://127.0.0.1:8700/ws")]
    pub target: String,
    /// Base URL of its HTTP API [default: http://<target host:port>].
    #[arg(long)]
    pub api: Option<String>,
    /// Output directory [default: bench-results/<scenario>-<unix time>].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Worker processes generating load [default: one per 10,000 connections].
    #[arg(long)]
    pub procs: Option<usize>,
    /// Server process to sample CPU time and memory of (from /proc).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Length of the measured phase (scenarios that run for a time): seconds, or a number
    /// with a unit (90s, 30m, 1h).
    #[arg(long, value_parser = parse_seconds)]
    pub duration: Option<f64>,
    /// No progress lines; the summary table is still printed.
    #[arg(long)]
    pub quiet: bool,
}

impl CommonArgs {
    /// `--api`, or `http://host:port` of `--target`.
    pub fn api_base(&self) -> anyhow::Result<String> {
        if let Some(a) = &self.api {
            return Ok(a.trim_end_matches('/').to_string());
        }
        let ep = Endpoint::parse(&self.target)?;
        Ok(format!("http://{}", ep.authority()))
    }

    /// `--out`, or `bench-results/<scenario>-<unix time>`.
    pub fn out_dir(&self, scenario: &str) -> PathBuf {
        self.out.clone().unwrap_or_else(|| PathBuf::from(format!("bench-results/{scenario}-{}", unix_secs())))
    }

    /// How many worker processes for `conns` connections: `--procs`, raised if needed so that
    /// no process exceeds [`MAX_CONNS_PER_PROC`].
    pub fn procs_for(&self, conns: usize) -> usize {
        let needed = conns.div_ceil(MAX_CONNS_PER_PROC).max(1);
        let wanted = self.procs.unwrap_or_else(|| conns.div_ceil(DEFAULT_CONNS_PER_PROC).max(1));
        wanted.max(needed).min(conns.max(1))
    }

    /// Whether connections must be spread over several loopback source addresses.
    pub fn spread_sources(&self, total_conns: usize) -> bool {
        total_conns > CONNS_PER_SOURCE_ADDR && Endpoint::parse(&self.target).map(|e| e.is_loopback()).unwrap_or(false)
    }
}

/// Seconds from a duration flag: plain seconds (`90`, `2.5`) or a number with a unit, `s`,
/// `m` or `h` (`90s`, `30m`, `1h`). Negative, infinite and unparsable values are refused.
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, unit) = match t.char_indices().last() {
        Some((i, 'h')) => (&t[..i], 3600.0),
        Some((i, 'm')) => (&t[..i], 60.0),
        Some((i, 's')) => (&t[..i], 1.0),
        _ => (t, 1.0),
    };
    let bad = || format!("{s:?} is not a duration: seconds, or a number with s, m or h (90s, 30m, 1h)");
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    Ok(v * unit)
}

/// The wire format of WebSocket load (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireFormat {
    Json,
    Msgpack,
}

impl WireFormat {
    pub fn format(self) -> switchboard_protocol::Format {
        match self {
            WireFormat::Json => switchboard_protocol::Format::Json,
            WireFormat::Msgpack => switchboard_protocol::Format::Msgpack,
        }
    }
}

/// Splits `total` connections over `procs` workers: `(first global index, count)` each.
pub fn split(total: usize, procs: usize) -> Vec<(usize, usize)> {
    let procs = procs.max(1);
    let (base, extra) = (total / procs, total % procs);
    let mut first = 0;
    (0..procs)
        .map(|i| {
            let n = base + usize::from(i < extra);
            let part = (first, n);
            first += n;
            part
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// A load-generating connection's options: plain frames unless the scenario asks for
/// compression (`--compression`), whatever the client library offers by default, so that a
/// run measures what its command line says.
pub fn connect_options(format: Format) -> ConnectOptions {
    let mut opts = ConnectOptions::new(format);
    opts.compression = Compression::Off;
    opts
}

/// What a worker's config without the field means: no compression (configs written before
/// `--compression`).
pub fn no_compression() -> Compression {
    Compression::Off
}

/// The source address of connection `index` when spreading: 127.0.0.1 for the first 20,000,
/// 127.0.0.2 for the next, …
pub fn source_addr(index: usize, spread: bool) -> Option<IpAddr> {
    if !spread {
        return None;
    }
    let n = (index / CONNS_PER_SOURCE_ADDR + 1).min(254) as u8;
    Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, n)))
}

/// Microseconds since the Unix epoch. Every process of a run reads the same system clock, so
/// a timestamp stamped by one and compared by another measures real elapsed time.
pub fn unix_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// The tokio `Instant` of a unix µs time, for sleeping until a time shared between processes
/// (both clocks advance together over a run).
pub fn instant_of(unix_us: u64) -> tokio::time::Instant {
    let now_us = unix_micros();
    let now = tokio::time::Instant::now();
    if unix_us >= now_us {
        now + std::time::Duration::from_micros(unix_us - now_us)
    } else {
        now.checked_sub(std::time::Duration::from_micros(now_us - unix_us)).unwrap_or(now)
    }
}

pub fn unix_secs() -> u64 {
    unix_micros() / 1_000_000
}

/// RFC 3339 UTC time (`2024-05-01T12:00:00.123Z`) of a unix µs timestamp.
pub fn rfc3339(unix_us: u64) -> String {
    let secs = unix_us / 1_000_000;
    let millis = (unix_us / 1000) % 1000;
    let days = (secs / 86_400) as i64;
    let sod = secs % 86_400;
    // Civil-from-days (proleptic Gregorian calendar, eras of 400 years).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z", sod / 3600, (sod / 60) % 60, sod % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        c: CommonArgs,
    }

    #[test]
    fn common_defaults_and_derived_values() {
        let t = T::parse_from(["t"]);
        assert_eq!(t.c.api_base().unwrap(), "http://127.0.0.1:8700");
        assert_eq!(t.c.procs_for(25_000), 3);
        assert_eq!(t.c.procs_for(5), 1);
        assert!(!t.c.spread_sources(20_000));
        assert!(t.c.spread_sources(20_001));
        let t = T::parse_from(["t", "--procs", "1", "--target", "ws://10.0.0.1:9/ws"]);
        assert_eq!(t.c.procs_for(40_000), 3, "never above 15,000 per process");
        assert!(!t.c.spread_sources(50_000), "not loopback");
        assert_eq!(t.c.api_base().unwrap(), "http://10.0.0.1:9");
    }

    #[test]
    fn common_parses_durations_with_and_without_units() {
        assert_eq!(parse_seconds("90"), Ok(90.0));
        assert_eq!(parse_seconds("2.5"), Ok(2.5));
        assert_eq!(parse_seconds("90s"), Ok(90.0));
        assert_eq!(parse_seconds("30m"), Ok(1800.0));
        assert_eq!(parse_seconds("1h"), Ok(3600.0));
        assert_eq!(parse_seconds(" 1.5h "), Ok(5400.0));
        assert_eq!(parse_seconds("0"), Ok(0.0));
        for bad in ["", "m", "-5", "-1m", "10ms", "5d", "1h30m", "inf", "NaN", "tens"] {
            assert!(parse_seconds(bad).is_err(), "{bad:?}");
        }
        let t = T::parse_from(["t", "--duration", "2m"]);
        assert_eq!(t.c.duration, Some(120.0), "every scenario's --duration takes a unit");
        assert!(T::try_parse_from(["t", "--duration", "soon"]).is_err());
    }

    #[test]
    fn common_split_and_source_addresses() {
        assert_eq!(split(10, 3), vec![(0, 4), (4, 3), (7, 3)]);
        assert_eq!(split(2, 4), vec![(0, 1), (1, 1)]);
        assert_eq!(source_addr(5, false), None);
        assert_eq!(source_addr(19_999, true), Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1))));
        assert_eq!(source_addr(20_000, true), Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))));
    }

    #[test]
    fn common_formats_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123_456), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_700_000_000_000_000), "2023-11-14T22:13:20.000Z");
    }
}
