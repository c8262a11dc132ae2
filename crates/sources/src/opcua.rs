//! The OPC UA source: subscribes to variables of an OPC UA server (a list of node ids, or every
//! variable below a browse path), publishes each value change as a point with the source
//! timestamp and the status mapped to `q`, and writes values back to the server.
//!
//! # Layout
//! - this file: [`run`], the connect → serve → reconnect loop with its backoff, and the
//!   encoding and delivery of points that `live` and `backfill` share.
//! - `config`: [`OpcuaConfig`] (`kind = "opcua"`), its checks and byte limits.
//! - `live`: one connection's points: value changes published, bad markers on loss, writes
//!   dispatched to the server.
//! - `session`: one connection (client, certificates, session event loop, subscription, writes).
//! - `browse`: which variables to subscribe (node ids, or a walk below a browse path).
//! - `convert`: status → `q`, timestamps, variants ↔ JSON, node names → channel names.
//! - `queue`: the queue between the session and the publisher, bounded in bytes.
//! - `backfill`: after a reconnect, the gap of each point read from the server's history and
//!   sent as historical values.
//!
//! # Contract
//! Values of one variable are published in the order the server sent them. When the connection
//! is lost every point is published once with `q: "bad"` carrying its last value, the source
//! reconnects with jittered exponential backoff (0.5 s doubling to 30 s), browses again and
//! resumes: a monitored item's first notification is its current value. A point's last value
//! outlives connections, so a connection lost again before its first notification leaves the
//! points as they were (bad, with their value); a point the source never had a value for is
//! not marked (a point always carries a value, never `null`). With `backfill` on, the values a
//! point missed between its last value before the loss and its first after the reconnect are
//! read from the server's history, when the server keeps one for the node, and sent as
//! historical values (see `backfill`); otherwise the gap stays as the bad marker left it.
//!
//! One node's value never costs the session: a value too large for the node (its JSON over
//! `max_value_bytes`) or that cannot be a point (a structure) is refused, counted
//! (`switchboard_source_refused_total{reason="oversized"|"decode"}`, and `decode` also in
//! `decode_errors`) and logged, and that one point is marked bad with its last value until a
//! good value comes. Values the bounded queue could not keep are counted as `queue_full`.
//!
//! Stopping (node shutdown, lease moved) closes the session without marking points bad:
//! another node takes over the same points.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::value::{to_raw_value, RawValue};
use tracing::{error, info, warn};

use crate::{SourceCtx, WriteError};

mod backfill;
mod browse;
mod config;
mod convert;
mod live;
mod queue;
mod session;

pub use config::{OpcuaConfig, Security};
use convert::{JsonVariant, Point};
use live::{Kept, Live, Outcome};
use session::Connection;

/// A connection that lived this long resets the reconnect backoff.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// Runs the source until `ctx.stop` turns true.
pub async fn run(cfg: OpcuaConfig, mut ctx: SourceCtx) {
    if let Err(e) = cfg.check() {
        error!(source = %cfg.name, "OPC UA source not started: {e}");
        let _ = serve_until(&mut ctx, std::future::pending::<()>(), "the source is misconfigured").await;
        return;
    }
    // One directory per run: a source restarted on this node (its lease came back) must not
    // share it with a run that is still shutting down and removes its own.
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let pki = std::env::temp_dir().join(format!(
        "switchboard-opcua-{}-{}-{}",
        convert::channel_safe(&cfg.name),
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    let mut client = match session::client(&cfg, &pki) {
        Ok(c) => c,
        Err(e) => {
            error!(source = %cfg.name, "OPC UA source not started: {e}");
            let _ = serve_until(&mut ctx, std::future::pending::<()>(), "the source is misconfigured").await;
            return;
        }
    };
    let mut backoff = Backoff::default();
    let mut connected_before = false;
    // What the source knows of each point (by channel), across connections.
    let mut kept: HashMap<String, Kept> = HashMap::new();
    let told = backfill::Told::default();
    loop {
        let stats = ctx.stats.clone();
        let attempt = async {
            let conn = Connection::open(&mut client, &cfg, stats).await?;
            let live = Live::start(conn, &cfg, &mut kept).await?;
            Ok::<_, String>(live)
        };
        let live = match serve_until(&mut ctx, attempt, "not connected to the OPC UA server").await {
            None => break,
            Some(Ok(live)) => live,
            Some(Err(e)) => {
                let delay = backoff.next();
                warn!(source = %cfg.name, url = %cfg.url, "OPC UA connect failed: {e}; retry in {delay:?}");
                if serve_until(&mut ctx, tokio::time::sleep(delay), "not connected to the OPC UA server")
                    .await
                    .is_none()
                {
                    break;
                }
                continue;
            }
        };
        info!(source = %cfg.name, url = %cfg.url, points = live.points.len(), "OPC UA source connected");
        ctx.stats.connected.store(true, Ordering::Relaxed);
        if connected_before {
            ctx.stats.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        connected_before = true;
        let since = Instant::now();
        let outcome = live.serve(&mut ctx, &cfg, &mut kept, &told).await;
        ctx.stats.connected.store(false, Ordering::Relaxed);
        match outcome {
            Outcome::Stopped => break,
            Outcome::Lost(reason) => {
                if since.elapsed() >= STABLE_AFTER {
                    backoff = Backoff::default();
                }
                let delay = backoff.next();
                warn!(source = %cfg.name, url = %cfg.url, "OPC UA connection lost: {reason}; reconnect in {delay:?}");
                if serve_until(&mut ctx, tokio::time::sleep(delay), "not connected to the OPC UA server")
                    .await
                    .is_none()
                {
                    break;
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&pki);
}

/// Drives `fut` to completion while answering writes with `Unavailable(why)`; `None` when the
/// source must stop first.
async fn serve_until<T>(ctx: &mut SourceCtx, fut: impl std::future::Future<Output = T>, why: &str) -> Option<T> {
    tokio::pin!(fut);
    let mut writes_open = true;
    loop {
        if *ctx.stop.borrow() {
            return None;
        }
        tokio::select! {
            r = &mut fut => return Some(r),
            changed = ctx.stop.changed() => if changed.is_err() { return None },
            w = ctx.writes.recv(), if writes_open => match w {
                Some(w) => {
                    ctx.stats.writes_failed.fetch_add(1, Ordering::Relaxed);
                    let _ = w.reply.send(Err(WriteError::Unavailable(why.to_string())));
                }
                None => writes_open = false,
            },
        }
    }
}

/// Hands `items` to the sink; the node's refusals are counted (`node`) and logged. Returns how
/// many it took.
async fn deliver(sink: &dyn crate::Sink, stats: &crate::SourceStats, source: &str, items: Vec<crate::Item>) -> u64 {
    if items.is_empty() {
        return 0;
    }
    let results = sink.publish_batch(items).await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    stats.refusals.add("node", (results.len() - ok) as u64);
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        warn!(%source, refused = results.len() - ok, "the node refused OPC UA points: {e}");
    }
    ok as u64
}

/// A value ready to publish: its `v` and the whole point.
type Encoded = (Box<RawValue>, Box<RawValue>);

/// A value as a point, or why it is refused (`decode`: a type a point cannot carry;
/// `oversized`: its JSON is over `max_bytes`, with its length).
fn encode(
    variant: &opcua::types::Variant,
    t: i64,
    q: &'static str,
    max_bytes: usize,
) -> Result<Encoded, (&'static str, usize)> {
    if !convert::supported(variant) {
        return Err(("decode", 0));
    }
    let v = to_raw_value(&JsonVariant(variant)).map_err(|_| ("decode", 0))?;
    let data = to_raw_value(&Point { v: &v, t, q }).map_err(|_| ("decode", 0))?;
    if data.get().len() > max_bytes {
        return Err(("oversized", data.get().len()));
    }
    Ok((v, data))
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Exponential reconnect delays with jitter: attempt n waits a random time in [d/2, d] where d
/// doubles from 0.5 s to 30 s, so sources that lost the same server do not return in step.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: Duration::from_millis(500) }
    }
}

impl Backoff {
    const MAX: Duration = Duration::from_secs(30);

    fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(Self::MAX);
        let half = d.as_millis() as u64 / 2;
        Duration::from_millis(half + fastrand::u64(0..=half))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcua_backoff_doubles_to_30s_with_jitter() {
        let mut b = Backoff::default();
        let first = b.next();
        assert!(first >= Duration::from_millis(250) && first <= Duration::from_millis(500), "{first:?}");
        for _ in 0..10 {
            b.next();
        }
        let late = b.next();
        assert!(late >= Duration::from_secs(15) && late <= Duration::from_secs(30), "{late:?}");
    }
}
