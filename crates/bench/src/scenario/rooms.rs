//! `bench rooms`: Collaboration rooms: one member of each room publishes, the others receive.
//!
//! Placeholder wiring; the scenario is being written.

use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::common::CommonArgs;
use crate::worker::WorkerCtx;

/// `bench rooms` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RoomsArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One worker's share of the load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoomsWorker {
    pub conns: usize,
}

pub fn run(_args: RoomsArgs) -> anyhow::Result<i32> {
    anyhow::bail!("bench rooms: not written yet")
}

pub async fn run_worker(_cfg: RoomsWorker, ctx: Rc<WorkerCtx>) {
    ctx.wait_stop().await;
}
