//! Per-hook counters and a latency histogram, rendered in the style of `crate::metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) of the hook latency buckets.
const BOUNDS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// One hook's figures; relaxed atomics (statistics only).
#[derive(Default)]
pub struct HookMetrics {
    errors: AtomicU64,
    busy: AtomicU64,
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_us: AtomicU64,
}

impl HookMetrics {
    /// Counts one call that took `took` (answered or not).
    pub fn observe(&self, took: Duration) {
        let s = took.as_secs_f64();
        let i = BOUNDS.iter().position(|b| s <= *b).unwrap_or(BOUNDS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(took.as_micros() as u64, Relaxed);
    }

    /// Counts a call that refused because the hook failed (no answer, bad answer).
    pub fn error(&self) {
        self.errors.fetch_add(1, Relaxed);
    }

    /// Counts a call that got no slot within its deadline (`proxy.max_in_flight` calls were
    /// in flight); it is an error too, but was never sent.
    pub fn busy(&self) {
        self.busy.fetch_add(1, Relaxed);
    }
}

/// `switchboard_hook_calls_total`, `switchboard_hook_errors_total`,
/// `switchboard_hook_busy_total` and `switchboard_hook_duration_seconds` labelled by hook.
pub fn render(hooks: &[(&str, &HookMetrics)]) -> String {
    let mut out = String::new();
    if hooks.is_empty() {
        return out;
    }
    let calls = |m: &HookMetrics| m.buckets.iter().map(|b| b.load(Relaxed)).sum::<u64>();
    let _ = writeln!(out, "# HELP switchboard_hook_calls_total Calls to the application's backend, by hook.");
    let _ = writeln!(out, "# TYPE switchboard_hook_calls_total counter");
    for (name, m) in hooks {
        let _ = writeln!(out, "switchboard_hook_calls_total{{hook=\"{name}\"}} {}", calls(m));
    }
    let _ = writeln!(
        out,
        "# HELP switchboard_hook_errors_total Hook calls that failed (timeout, connection error, 5xx, bad answer) and so refused.\n# TYPE switchboard_hook_errors_total counter"
    );
    for (name, m) in hooks {
        let _ = writeln!(out, "switchboard_hook_errors_total{{hook=\"{name}\"}} {}", m.errors.load(Relaxed));
    }
    let _ = writeln!(
        out,
        "# HELP switchboard_hook_busy_total Hook calls refused unsent: no slot of proxy.max_in_flight within the timeout.\n# TYPE switchboard_hook_busy_total counter"
    );
    for (name, m) in hooks {
        let _ = writeln!(out, "switchboard_hook_busy_total{{hook=\"{name}\"}} {}", m.busy.load(Relaxed));
    }
    let metric = "switchboard_hook_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {metric} Time from a hook call's start to its answer or failure.\n# TYPE {metric} histogram"
    );
    for (name, m) in hooks {
        let mut cumulative = 0;
        for (i, b) in BOUNDS.iter().enumerate() {
            cumulative += m.buckets[i].load(Relaxed);
            let _ = writeln!(out, "{metric}_bucket{{hook=\"{name}\",le=\"{b}\"}} {cumulative}");
        }
        cumulative += m.buckets[BOUNDS.len()].load(Relaxed);
        let _ = writeln!(out, "{metric}_bucket{{hook=\"{name}\",le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{metric}_sum{{hook=\"{name}\"}} {}", m.sum_us.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{metric}_count{{hook=\"{name}\"}} {cumulative}");
    }
    out
}
