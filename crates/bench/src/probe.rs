//! Sampling CPU time and memory from `/proc` (Linux).
//!
//! `--server-pid` samples the server process: CPU seconds from `/proc/PID/stat` (utime +
//! stime of all its threads) and memory from `/proc/PID/status` (`VmRSS` now, `VmHWM` the
//! peak). The `limit` scenario samples its own writer thread through `/proc/thread-self`.

use std::collections::HashMap;
use std::io;

/// Clock ticks per second of `/proc` times. The kernel reports them in `USER_HZ`, which is
/// 100 on every Linux architecture's user ABI regardless of the kernel's internal `HZ`.
const USER_HZ: f64 = 100.0;

/// Memory of a process in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident set size now.
    pub rss: u64,
    /// Peak resident set size so far ("high water mark").
    pub hwm: u64,
}

/// CPU time of a process at one moment.
#[derive(Debug, Clone, Default)]
pub struct CpuSample {
    /// utime + stime of the whole process, 10 ms resolution.
    pub total_s: f64,
    /// Run time per thread id, ns.
    pub threads: HashMap<u32, u64>,
}

impl CpuSample {
    /// [`CpuSample::seconds_until`] when both samples were taken (`None` without `--server-pid`
    /// or when `/proc` could not be read).
    pub fn between(from: &Option<CpuSample>, to: &Option<CpuSample>) -> Option<f64> {
        Some(from.as_ref()?.seconds_until(to.as_ref()?))
    }

    /// CPU seconds between two samples. Uses the per-thread nanosecond counters when every
    /// thread of the first sample is still alive at the second (a thread that exited took its
    /// counter with it; threads that appeared in between count in full); otherwise the
    /// tick-based totals.
    pub fn seconds_until(&self, later: &CpuSample) -> f64 {
        let precise = !self.threads.is_empty() && self.threads.keys().all(|t| later.threads.contains_key(t));
        if precise {
            let ns: u64 = later
                .threads
                .iter()
                .map(|(tid, ns)| ns.saturating_sub(self.threads.get(tid).copied().unwrap_or(0)))
                .sum();
            ns as f64 / 1e9
        } else {
            (later.total_s - self.total_s).max(0.0)
        }
    }
}

/// One process to watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessProbe {
    pub pid: u32,
}

impl ProcessProbe {
    pub fn new(pid: u32) -> Self {
        ProcessProbe { pid }
    }

    /// User plus system CPU seconds consumed so far by all threads of the process.
    pub fn cpu_seconds(&self) -> io::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        let (utime, stime) = parse_stat_times(&stat).ok_or_else(|| bad("/proc/PID/stat"))?;
        Ok((utime + stime) as f64 / USER_HZ)
    }

    /// A CPU-time sample precise to the nanosecond where the kernel allows: the scheduler's
    /// run time of every thread (`/proc/PID/task/*/schedstat`) beside the tick-based total.
    pub fn cpu_sample(&self) -> io::Result<CpuSample> {
        let total_s = self.cpu_seconds()?;
        let mut threads = HashMap::new();
        if let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) {
            for e in dir.flatten() {
                let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else { continue };
                if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) {
                    if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
                        threads.insert(tid, ns);
                    }
                }
            }
        }
        Ok(CpuSample { total_s, threads })
    }

    pub fn memory(&self) -> io::Result<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        parse_status_memory(&status).ok_or_else(|| bad("/proc/PID/status"))
    }
}

/// CPU time of the calling thread in nanoseconds: `/proc/thread-self/schedstat` (ns
/// resolution), or `/proc/thread-self/stat` (10 ms resolution) where schedstat is missing.
pub fn thread_cpu_ns() -> io::Result<u64> {
    if let Ok(s) = std::fs::read_to_string("/proc/thread-self/schedstat") {
        if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
            return Ok(ns);
        }
    }
    let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
    let (u, s) = parse_stat_times(&stat).ok_or_else(|| bad("/proc/thread-self/stat"))?;
    Ok((u + s) * (1e9 / USER_HZ) as u64)
}

/// CPU seconds of the calling process (all threads).
pub fn self_cpu_seconds() -> io::Result<f64> {
    ProcessProbe::new(std::process::id()).cpu_seconds()
}

/// The soft limit on open files of this process, from `/proc/self/limits`.
pub fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("unexpected format of {what}"))
}

/// `utime` and `stime` (fields 14 and 15) of a `stat` line. The command name (field 2) is
/// parenthesized and may contain spaces and parentheses, so fields are counted after the last
/// `)`.
fn parse_stat_times(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // `rest` starts at field 3 (state); utime is field 14.
    let utime = fields.nth(11)?.parse().ok()?;
    let stime = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

fn parse_status_memory(status: &str) -> Option<Memory> {
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].split_whitespace().next()?.parse::<u64>().ok().map(|k| k * 1024)
    };
    Some(Memory { rss: kib("VmRSS:")?, hwm: kib("VmHWM:")? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_parses_stat_with_awkward_command_names() {
        let stat = "1234 (my (weird) proc) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 4 0 100 1000 50";
        assert_eq!(parse_stat_times(stat), Some((250, 75)));
        assert_eq!(parse_stat_times("garbage"), None);
    }

    #[test]
    fn probe_parses_status_memory() {
        let status = "Name:\tswitchboard\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t3\n";
        assert_eq!(parse_status_memory(status), Some(Memory { rss: 100 << 20, hwm: 200 << 20 }));
    }

    #[test]
    fn probe_reads_this_process() {
        let me = ProcessProbe::new(std::process::id());
        assert!(me.cpu_seconds().unwrap() >= 0.0);
        let m = me.memory().unwrap();
        assert!(m.rss > 0 && m.hwm >= m.rss);
        let a = thread_cpu_ns().unwrap();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_ns().unwrap() >= a);
        assert!(open_file_limit().unwrap_or(1) > 0);
        let a = me.cpu_sample().unwrap();
        std::thread::spawn(|| {
            let mut x = 0u64;
            for i in 0..5_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
        })
        .join()
        .unwrap();
        let b = me.cpu_sample().unwrap();
        assert!(a.seconds_until(&b) >= 0.0);
    }

    #[test]
    fn probe_cpu_delta_falls_back_when_a_thread_exited() {
        let a = CpuSample { total_s: 1.0, threads: HashMap::from([(1, 1_000_000_000), (2, 500_000_000)]) };
        let b =
            CpuSample { total_s: 2.5, threads: HashMap::from([(1, 1_200_000_000), (2, 600_000_000), (3, 50_000_000)]) };
        assert!((a.seconds_until(&b) - 0.35).abs() < 1e-9);
        let c = CpuSample { total_s: 2.0, threads: HashMap::from([(1, 1_300_000_000)]) };
        assert!((a.seconds_until(&c) - 1.0).abs() < 1e-9);
    }
}
