//! `bench sessions`: sessions × worker threads, the server started by the tool itself.
//!
//! Placeholder wiring; the scenario is being written.

use crate::common::CommonArgs;

/// `bench sessions` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SessionsArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

pub fn run(_args: SessionsArgs) -> anyhow::Result<i32> {
    anyhow::bail!("bench sessions: not written yet")
}
