//! The once-a-second progress line: rewritten in place on a terminal, one plain line per
//! second otherwise (logs, CI), nothing with `--quiet`.

use std::io::{IsTerminal, Write};
use std::time::Instant;

pub struct Progress {
    quiet: bool,
    tty: bool,
    start: Instant,
    /// A line is on screen without its newline (terminal mode).
    open: bool,
}

impl Progress {
    pub fn new(quiet: bool) -> Self {
        Progress { quiet, tty: std::io::stdout().is_terminal(), start: Instant::now(), open: false }
    }

    /// Seconds since the progress started.
    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Shows `status`, prefixed with the elapsed time.
    pub fn update(&mut self, status: &str) {
        if self.quiet {
            return;
        }
        let mut out = std::io::stdout().lock();
        let line = format!("[{:7.1}s] {status}", self.elapsed());
        let _ = if self.tty {
            self.open = true;
            write!(out, "\r\x1b[K{line}")
        } else {
            writeln!(out, "{line}")
        };
        let _ = out.flush();
    }

    /// A line that stays (phase changes, notes), printed even with `--quiet`.
    pub fn note(&mut self, msg: &str) {
        self.finish_line();
        println!("{msg}");
    }

    /// Ends an in-place line so that following output starts on a fresh line.
    pub fn finish_line(&mut self) {
        if self.open {
            println!();
            self.open = false;
        }
    }
}

/// A rate over the last interval.
#[derive(Debug, Default)]
pub struct Rate {
    last: u64,
    at: Option<Instant>,
}

impl Rate {
    /// Per-second rate of `total` since the previous call.
    pub fn per_s(&mut self, total: u64) -> f64 {
        let now = Instant::now();
        let r = match self.at {
            Some(t) => total.saturating_sub(self.last) as f64 / now.duration_since(t).as_secs_f64().max(1e-6),
            None => 0.0,
        };
        self.last = total;
        self.at = Some(now);
        r
    }
}
