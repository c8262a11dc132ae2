//! The node's heartbeat to Redis (the `redis-heartbeat` task): it registers the node in the
//! cluster figures (`/api/info` node count, subscriber counts per channel), refreshes the
//! presence entries of its clients, sweeps those of dead nodes, keeps the channels it has
//! subscribers for from expiring, and notes whether the server is durable in its lineage
//! record (see [`super::scripts`]: a durable server's restart keeps every epoch).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{unavailable, Inner};
use crate::BrokerError;

/// Registers the node (once it has its id, see [`crate::Broker::set_node_id`]) and refreshes its
/// presence entries three times per presence TTL; also sweeps expired entries (clients of dead
/// nodes) of the channels it has present clients in.
pub(super) async fn heartbeat(inner: Arc<Inner>, mut stop: watch::Receiver<()>) {
    let period = inner.presence_ttl / 3;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen_generation = 0;
    // The link generation the registration was last written whole for (0: never).
    let mut registered_generation = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = inner.link.connected.notified() => {}
            _ = inner.id_set.notified() => {}
            _ = stop.changed() => return,
        }
        if !inner.link.up.load(Relaxed) {
            continue;
        }
        let generation = inner.link.generation.load(Relaxed);
        // After a reconnect Redis may have lost everything: write the whole state again.
        let full = generation != seen_generation;
        let id = inner.node_id.get().map(|id| (id.as_str(), generation != registered_generation));
        if let Err(e) = beat(&inner, full, id).await {
            tracing::debug!(error = %e, "redis heartbeat failed");
            continue;
        }
        seen_generation = generation;
        if id.is_some() {
            registered_generation = generation;
            inner.registered.store(true, Relaxed);
        }
    }
}

/// One heartbeat: the node's registration under `id` (with its subscription counts when
/// `whole` or when they changed), when it has an id; then its presence entries (all of them
/// again when `full`) and the expiry of its subscribed channels.
async fn beat(inner: &Inner, full: bool, id: Option<(&str, bool)>) -> Result<(), BrokerError> {
    let ttl_ms = inner.presence_ttl.as_millis() as u64;
    if let Some((id, whole)) = id {
        register(inner, id, whole, ttl_ms).await?;
    }
    note_lineage(inner).await?;
    // A snapshot: the lock is not held across the awaits below.
    let present: Vec<(Arc<str>, HashMap<String, String>)> =
        inner.presence.lock().iter().map(|(ch, m)| (ch.clone(), m.clone())).collect();
    let calls = present.iter().map(|(ch, clients)| {
        let mut inv = inner.scripts.presence_refresh.prepare_invoke();
        inv.key(inner.keys.presence(ch)).key(inner.keys.presence_info(ch)).arg(ttl_ms);
        inv.arg(if full { "1" } else { "0" }).arg(inner.keys.pubsub(ch));
        for (client, info) in clients {
            inv.arg(client).arg(info);
        }
        async move { inv.invoke_async::<i64>(&mut inner.conn().await?).await.map_err(|e| inner.failed(e)) }
    });
    let refreshed: Result<Vec<i64>, BrokerError> = futures_util::future::join_all(calls).await.into_iter().collect();
    if let Err(e) = keep_alive(inner).await {
        tracing::debug!(error = %e, "redis: extending subscribed channels' expiry failed");
    }
    refreshed.map(drop)
}

/// Writes the node's entry in the registry (alive for one presence TTL) and, when `whole` or
/// when they changed, its subscription counts.
async fn register(inner: &Inner, id: &str, whole: bool, ttl_ms: u64) -> Result<(), BrokerError> {
    let replace = whole || inner.link.counts_changed.swap(false, Relaxed);
    let mut node = inner.scripts.node_beat.prepare_invoke();
    node.key(inner.keys.nodes()).key(inner.keys.node_subs(id)).arg(id).arg(ttl_ms);
    node.arg(if replace { "1" } else { "0" });
    if replace {
        for (ch, n) in inner.link.counts() {
            node.arg(&*ch).arg(n);
        }
    }
    let r: Result<i64, _> = match inner.conn().await {
        Ok(mut conn) => node.invoke_async(&mut conn).await.map_err(|e| inner.failed(e)),
        Err(e) => Err(e),
    };
    if r.is_err() && replace {
        inner.link.counts_changed.store(true, Relaxed);
    }
    r.map(drop)
}

/// Confirms the server's data identity and records whether the server is durable: every write
/// fsynced to its append-only file (`appendonly yes`, `appendfsync always`), so a restart
/// loses nothing acknowledged. A server that does not allow `CONFIG` leaves the record as it
/// was (a restart then starts new epochs, unless another node could tell).
async fn note_lineage(inner: &Inner) -> Result<(), BrokerError> {
    let mut conn = inner.conn().await?;
    let config: Result<HashMap<String, String>, _> =
        redis::cmd("CONFIG").arg("GET").arg("appendonly").arg("appendfsync").query_async(&mut conn).await;
    let durable = match config {
        Ok(c) => {
            let yes =
                c.get("appendonly").is_some_and(|v| v == "yes") && c.get("appendfsync").is_some_and(|v| v == "always");
            if yes {
                "1"
            } else {
                "0"
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "redis: CONFIG GET refused; durability not noted");
            ""
        }
    };
    let mut note = inner.scripts.lineage_note.prepare_invoke();
    note.arg(durable);
    note.invoke_async::<String>(&mut conn).await.map(drop).map_err(|e| inner.failed(e))
}

/// Channels this node has subscribers for stay alive: their keys' expiry is pushed to twice
/// their keep (at least three heartbeats), once per half of the shortest keep (only extended: `GT`; a channel kept forever
/// has no expiry to extend). A failure (a slot moved away) only waits for the next beat.
async fn keep_alive(inner: &Inner) -> Result<(), BrokerError> {
    // Never shorter than three heartbeats, however short the keep.
    let beats = u64::try_from(inner.presence_ttl.as_millis()).unwrap_or(u64::MAX);
    let mut shortest = u64::MAX;
    let alive: Vec<(String, String, u64)> = inner
        .link
        .counts()
        .into_iter()
        .filter_map(|(ch, _)| {
            // A channel kept forever has no expiry once published (`GT` leaves it so); one only
            // read so far is kept alive like any other.
            let keep = inner.reader_keep_ms(&ch);
            shortest = shortest.min(keep.max(1));
            (keep > 0).then(|| (inner.keys.meta(&ch), inner.keys.history(&ch), keep.saturating_mul(2).max(beats)))
        })
        .collect();
    if alive.is_empty() {
        return Ok(());
    }
    {
        let mut at = inner.alive_at.lock();
        if at.is_some_and(|t| t.elapsed() < Duration::from_millis(shortest / 2)) {
            return Ok(());
        }
        *at = Some(Instant::now());
    }
    for chunk in alive.chunks(500) {
        let mut pipe = redis::pipe();
        for (meta, history, hold) in chunk {
            pipe.cmd("PEXPIRE").arg(meta).arg(*hold).arg("GT").ignore();
            pipe.cmd("PEXPIRE").arg(history).arg(*hold).arg("GT").ignore();
        }
        pipe.query_async::<()>(&mut inner.conn().await?).await.map_err(unavailable)?;
    }
    Ok(())
}
