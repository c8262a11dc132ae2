//! `bench connect`: Connection storm: handshake + first subscribe.
//!
//! Placeholder wiring; the scenario is being written.

use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::common::CommonArgs;
use crate::worker::WorkerCtx;

/// `bench connect` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One worker's share of the load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnectWorker {
    pub conns: usize,
}

pub fn run(_args: ConnectArgs) -> anyhow::Result<i32> {
    anyhow::bail!("bench connect: not written yet")
}

pub async fn run_worker(_cfg: ConnectWorker, ctx: Rc<WorkerCtx>) {
    ctx.wait_stop().await;
}
