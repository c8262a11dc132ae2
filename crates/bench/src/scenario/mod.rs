//! The scenarios of SPEC §8, one file each, sharing the worker, histogram and report
//! machinery. A scenario has a coordinator half (`run`: spawn workers, drive the measured
//! phase, build the [`crate::report::BenchResult`]) and a worker half (`run_worker`).
//!
//! The scenarios sit above [`crate::worker`], the engine they share: the worker configs of all
//! scenarios ([`WorkerConfig`]) and the dispatch of a worker process to its scenario
//! ([`worker_main`]) live here, so the engine knows no scenario.

pub mod broadcast;
pub mod connect;
pub mod dashboard;
pub mod echo;
pub mod limit;
pub mod rooms;
pub mod sessions;
pub mod soak;
pub mod streams;
pub mod trend;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// What one worker process does; the JSON argument of `bench worker`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerConfig {
    Limit(limit::LimitWorker),
    Broadcast(broadcast::BroadcastWorker),
    Echo(echo::EchoWorker),
    Rooms(rooms::RoomsWorker),
    Streams(streams::StreamsWorker),
    Dashboard(dashboard::DashboardWorker),
    Connect(connect::ConnectWorker),
    Sessions(sessions::SessionsWorker),
    Soak(soak::SoakWorker),
}

impl WorkerConfig {
    /// The connections this worker opens (it reports `ready` once all are settled).
    fn conns(&self) -> usize {
        match self {
            WorkerConfig::Limit(c) => c.conns,
            WorkerConfig::Broadcast(c) => c.conns,
            WorkerConfig::Echo(c) => c.conns,
            WorkerConfig::Rooms(c) => c.conns,
            WorkerConfig::Streams(c) => c.conns,
            WorkerConfig::Dashboard(c) => c.conns,
            WorkerConfig::Connect(c) => c.conns,
            WorkerConfig::Sessions(c) => c.conns,
            WorkerConfig::Soak(c) => c.conns,
        }
    }
}

/// Entry point of `bench worker <json>`: runs the worker half of the scenario the config
/// names on the worker engine ([`crate::worker::serve`]); returns the process exit code.
pub fn worker_main(config: &str) -> anyhow::Result<i32> {
    let cfg: WorkerConfig = serde_json::from_str(config).context("worker config")?;
    crate::worker::serve(cfg.conns(), move |ctx| async move {
        match cfg {
            WorkerConfig::Limit(c) => limit::run_worker(c, ctx).await,
            WorkerConfig::Broadcast(c) => broadcast::run_worker(c, ctx).await,
            WorkerConfig::Echo(c) => echo::run_worker(c, ctx).await,
            WorkerConfig::Rooms(c) => rooms::run_worker(c, ctx).await,
            WorkerConfig::Streams(c) => streams::run_worker(c, ctx).await,
            WorkerConfig::Dashboard(c) => dashboard::run_worker(c, ctx).await,
            WorkerConfig::Connect(c) => connect::run_worker(c, ctx).await,
            WorkerConfig::Sessions(c) => sessions::run_worker(c, ctx).await,
            WorkerConfig::Soak(c) => soak::run_worker(c, ctx).await,
        }
    })
}

/// A single-threaded runtime for a coordinator: it only reads worker pipes and issues a few
/// requests, and must leave the cores to the server and the workers.
pub(crate) fn coordinator_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

/// Microseconds as milliseconds, for JSON extras.
pub(crate) fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}
