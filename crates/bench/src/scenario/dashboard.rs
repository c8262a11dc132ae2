//! `bench dashboard`: One connection holding W point subscriptions, as a dashboard does.
//!
//! Placeholder wiring; the scenario is being written.

use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::common::CommonArgs;
use crate::worker::WorkerCtx;

/// `bench dashboard` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DashboardArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One worker's share of the load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DashboardWorker {
    pub conns: usize,
}

pub fn run(_args: DashboardArgs) -> anyhow::Result<i32> {
    anyhow::bail!("bench dashboard: not written yet")
}

pub async fn run_worker(_cfg: DashboardWorker, ctx: Rc<WorkerCtx>) {
    ctx.wait_stop().await;
}
