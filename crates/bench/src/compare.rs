//! `bench report DIR...`: one HTML page comparing several result folders side by side.
//!
//! Placeholder wiring; being written.

use std::path::PathBuf;

/// `bench report` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Result folders (each with a result.json).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
}

pub fn run(_args: ReportArgs) -> anyhow::Result<i32> {
    anyhow::bail!("bench report: not written yet")
}
