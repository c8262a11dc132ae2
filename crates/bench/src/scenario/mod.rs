//! The scenarios of SPEC §8, one file each, sharing the worker, histogram and report
//! machinery. A scenario has a coordinator half (`run`: spawn workers, drive the measured
//! phase, build the [`BenchResult`]) and a worker half (`run_worker`).

pub mod broadcast;
pub mod connect;
pub mod dashboard;
pub mod echo;
pub mod limit;
pub mod rooms;
pub mod sessions;
pub mod soak;
pub mod streams;

use std::path::Path;

use crate::histogram::Latency;
use crate::progress::Progress;
use crate::report::BenchResult;

/// A single-threaded runtime for a coordinator: it only reads worker pipes and issues a few
/// requests, and must leave the cores to the server and the workers.
pub(crate) fn coordinator_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

/// Decides pass/fail, writes the output files, prints the summary table; returns the exit
/// code (0 pass, 1 fail).
pub(crate) fn conclude(
    mut result: BenchResult,
    latency: &Latency,
    out: &Path,
    progress: &mut Progress,
) -> anyhow::Result<i32> {
    result.decide();
    progress.finish_line();
    result.write(out, latency)?;
    print!("{}", result.table());
    println!("results in {}", out.display());
    Ok(if result.pass { 0 } else { 1 })
}

/// Microseconds as milliseconds, for JSON extras.
pub(crate) fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}
