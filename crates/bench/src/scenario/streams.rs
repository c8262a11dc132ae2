//! `bench streams`: Stream sets vs many channels: U users × K points at F Hz.
//!
//! Placeholder wiring; the scenario is being written.

use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::common::CommonArgs;
use crate::worker::WorkerCtx;

/// `bench streams` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct StreamsArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One worker's share of the load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamsWorker {
    pub conns: usize,
}

pub fn run(_args: StreamsArgs) -> anyhow::Result<i32> {
    anyhow::bail!("bench streams: not written yet")
}

pub async fn run_worker(_cfg: StreamsWorker, ctx: Rc<WorkerCtx>) {
    ctx.wait_stop().await;
}
