//! The servers under test of `sessions`: one started per `--workers` count, its address read
//! from its `switchboard listening on http://ADDR` line, stopped after its last cell.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// A server started by the tool; killed on drop if not stopped.
pub(super) struct ServerProc {
    child: Child,
    pub(super) pid: u32,
    pub(super) addr: String,
    /// Kept open so the server's later stdout writes do not fail.
    _stdout: Lines<BufReader<ChildStdout>>,
}

/// The address in the server's `switchboard listening on http://ADDR` line.
fn parse_listening(line: &str) -> Option<&str> {
    let addr = line.trim().strip_prefix("switchboard listening on http://")?;
    (!addr.is_empty()).then_some(addr)
}

/// The last few lines of a server log, for an error message.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

impl ServerProc {
    pub(super) async fn start(bin: &Path, workers: usize, extra: &[String], log: &Path) -> anyhow::Result<ServerProc> {
        let stderr = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--workers", &workers.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the server {}", bin.display()))?;
        let pid = child.id().context("the server exited at once")?;
        let mut lines = BufReader::new(child.stdout.take().context("server stdout")?).lines();
        let wait = async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = parse_listening(&line) {
                    return Ok(addr.to_string());
                }
            }
            bail!("the server exited before listening (its log: {})", log.display())
        };
        let addr = match tokio::time::timeout(Duration::from_secs(15), wait).await {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => bail!("{e}: {}", log_tail(log)),
            Err(_) => bail!("the server did not print its address within 15 s (its log: {})", log.display()),
        };
        Ok(ServerProc { child, pid, addr, _stdout: lines })
    }

    /// SIGTERM to its PID, then SIGKILL if it has not exited within 5 s.
    pub(super) async fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.pid.to_string()]).status().await;
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    #[test]
    fn sessions_server_that_cannot_start_is_an_error_with_its_log() {
        let dir = std::env::temp_dir().join(format!("sb-bench-sessions-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("server.log");
        // A script stands in for a server that refuses its configuration.
        let bin = dir.join("fake-server");
        std::fs::write(&bin, "#!/bin/sh\necho 'switchboard: bad key' >&2\nexit 2\n").unwrap();
        std::process::Command::new("chmod").arg("+x").arg(&bin).status().unwrap();
        let err = testutil::local(ServerProc::start(&bin, 1, &[], &log)).err().unwrap();
        assert!(format!("{err:#}").contains("bad key"), "{err:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sessions_reads_the_listening_line() {
        assert_eq!(parse_listening("switchboard listening on http://127.0.0.1:4567\n"), Some("127.0.0.1:4567"));
        assert_eq!(parse_listening("something else"), None);
        assert_eq!(parse_listening("switchboard listening on http://"), None);
    }
}
