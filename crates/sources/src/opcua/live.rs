//! One connection's life as the OPC UA source sees it: the points it subscribed, value changes
//! turned into points (refused ones marked bad), the bad markers of a lost connection, and
//! writes dispatched to the server.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::value::{to_raw_value, RawValue};
use tokio::sync::{mpsc, Semaphore};
use tracing::{info, warn};

use super::convert::{self, Point};
use super::queue::{Change, ChangeQueue, Refusal};
use super::session::{self, Connection};
use super::{backfill, browse, deliver, encode, now_ms, OpcuaConfig};
use crate::{SourceCtx, Write, WriteError};

/// Writes to the server in flight at once; more are answered `Unavailable` at once.
const MAX_WRITES_IN_FLIGHT: usize = 16;

/// What the source keeps of a point across connections.
#[derive(Default)]
pub(super) struct Kept {
    /// Its last accepted value (`v`), published again with `q: "bad"` when the point can no
    /// longer be vouched for.
    last: Option<Box<RawValue>>,
    /// The time (`t`) of its last accepted value: where a gap in its values starts.
    last_t: Option<i64>,
    /// Its latest publication is such a bad marker: no second one until a value comes.
    marked: bool,
}

/// One subscribed variable.
pub(super) struct PointState {
    channel: String,
    node: opcua::types::NodeId,
    /// Monitoring started on the server (else it refused the node and nothing arrives).
    monitored: bool,
    kept: Kept,
    /// The time its values stopped at before this connection (its last value's `t`), while its
    /// first value on this connection, which ends the gap, has not come; `None` without
    /// back-fill.
    gap_from: Option<i64>,
}

impl PointState {
    /// The bad marker of this point (its last value, `q`, at `t`), unless it has no value yet
    /// or its latest publication already is one.
    fn mark(&mut self, t: i64, q: &'static str) -> Option<(String, switchboard_broker::Data)> {
        if self.kept.marked {
            return None;
        }
        let data = to_raw_value(&Point { v: self.kept.last.as_deref()?, t, q }).ok()?;
        self.kept.marked = true;
        Some((self.channel.clone(), Arc::new(data)))
    }
}

pub(super) enum Outcome {
    Stopped,
    Lost(String),
}

/// A connection with its subscription running.
pub(super) struct Live {
    conn: Connection,
    pub(super) points: Vec<PointState>,
    by_channel: HashMap<String, usize>,
    changes: Arc<ChangeQueue>,
    /// The server ended the subscription.
    lost: mpsc::Receiver<String>,
    max_value_bytes: usize,
    /// Reads the points' gaps from the server's history; started by the first gap.
    backfill: Option<backfill::Worker>,
}

impl Live {
    /// Resolves the variables (node ids or browse), names their channels and subscribes. Once
    /// subscribed, the points take over what `kept` knew of them (the rest is forgotten).
    pub(super) async fn start(
        conn: Connection,
        cfg: &OpcuaConfig,
        kept: &mut HashMap<String, Kept>,
    ) -> Result<Live, String> {
        let mut named: Vec<(opcua::types::NodeId, String)> = Vec::new();
        if let Some(path) = &cfg.browse {
            let root = browse::resolve_root(&conn.session, path).await?;
            let (found, capped) = browse::variables(&conn.session, &root, cfg.max_nodes).await?;
            if capped {
                warn!(source = %cfg.name, max_nodes = cfg.max_nodes, "browse {path:?} has more variables than max_nodes; the rest are not subscribed");
            }
            named.extend(found.into_iter().map(|f| (f.node, convert::path_name(&f.path))));
        } else {
            for node in &cfg.nodes {
                let id = session::parse_node(node)?;
                let name = convert::node_name(&id);
                named.push((id, name));
            }
        }
        let mut points = Vec::with_capacity(named.len());
        let mut by_channel = HashMap::with_capacity(named.len());
        for (node, name) in named {
            let Some(channel) = convert::channel_for(&cfg.channel, &name) else {
                warn!(source = %cfg.name, %node, "OPC UA node skipped: its channel name would be empty or longer than 255 bytes");
                continue;
            };
            if by_channel.contains_key(&channel) {
                warn!(source = %cfg.name, %node, %channel, "OPC UA node skipped: another node has the same channel");
                continue;
            }
            by_channel.insert(channel.clone(), points.len());
            points.push(PointState { channel, node, monitored: false, kept: Kept::default(), gap_from: None });
        }
        let changes = Arc::new(ChangeQueue::new(cfg.queue_bytes()));
        let (lost_tx, lost) = mpsc::channel(1);
        let nodes: Vec<_> = points.iter().map(|p| p.node.clone()).collect();
        let max_value_bytes = cfg.max_value_bytes();
        let feed = session::Feed { changes: changes.clone(), lost: lost_tx, max_value_bytes };
        let refused = session::subscribe(&conn.session, cfg, &nodes, feed).await?;
        for (p, refusal) in points.iter_mut().zip(refused) {
            match refusal {
                None => p.monitored = true,
                Some(status) => {
                    warn!(source = %cfg.name, node = %p.node, "OPC UA server refused to monitor the node: {status}")
                }
            }
        }
        for p in &mut points {
            p.kept = kept.remove(&p.channel).unwrap_or_default();
            p.gap_from = if cfg.backfill && p.monitored { p.kept.last_t } else { None };
        }
        kept.clear();
        Ok(Live { conn, points, by_channel, changes, lost, max_value_bytes, backfill: None })
    }

    /// Publishes value changes and serves writes until the connection is lost or the source
    /// stops; on loss every point is marked bad (its last value kept). What the points know
    /// goes back to `kept` for the next connection.
    pub(super) async fn serve(
        mut self,
        ctx: &mut SourceCtx,
        cfg: &OpcuaConfig,
        kept: &mut HashMap<String, Kept>,
        told: &backfill::Told,
    ) -> Outcome {
        if self.points.iter().any(|p| p.gap_from.is_some()) {
            self.backfill = Some(backfill::Worker::start(&self.conn, ctx, cfg, told.clone()));
        }
        let outcome = self.serve_inner(ctx, cfg).await;
        // A back-fill under way ends with the connection it reads through.
        self.backfill = None;
        kept.extend(self.points.into_iter().map(|p| (p.channel, p.kept)));
        outcome
    }

    async fn serve_inner(&mut self, ctx: &mut SourceCtx, cfg: &OpcuaConfig) -> Outcome {
        let writes_gate = Arc::new(Semaphore::new(MAX_WRITES_IN_FLIGHT));
        let mut writes_open = true;
        // Points the server no longer monitors keep their last value, marked bad.
        let now = now_ms();
        let unmonitored = self.points.iter_mut().filter(|p| !p.monitored).filter_map(|p| p.mark(now, "bad")).collect();
        self.send(ctx, unmonitored).await;
        let changes = self.changes.clone();
        let reason = loop {
            if *ctx.stop.borrow() {
                self.conn.close().await;
                return Outcome::Stopped;
            }
            tokio::select! {
                biased;
                changed = ctx.stop.changed() => if changed.is_err() {
                    self.conn.close().await;
                    return Outcome::Stopped;
                },
                reason = &mut self.conn.ended => break reason.unwrap_or_else(|_| "session ended".into()),
                Some(status) = self.lost.recv() => {
                    // The connection still stands: end the session too before reconnecting.
                    self.mark_bad(ctx).await;
                    self.conn.close().await;
                    return Outcome::Lost(format!("the server ended the subscription: {status}"));
                }
                taken = changes.take() => {
                    if taken.dropped > 0 {
                        ctx.stats.refusals.add("queue_full", taken.dropped);
                        warn!(source = %ctx.name, dropped = taken.dropped, queue_bytes = cfg.queue_bytes(), "OPC UA values dropped: the node publishes slower than the server sends (the latest value of each node is kept)");
                    }
                    self.publish(ctx, taken.changes).await;
                }
                w = ctx.writes.recv(), if writes_open => match w {
                    Some(w) => self.dispatch_write(ctx, w, &writes_gate),
                    None => writes_open = false,
                },
            }
        };
        self.mark_bad(ctx).await;
        Outcome::Lost(reason)
    }

    async fn publish(&mut self, ctx: &SourceCtx, batch: Vec<Change>) {
        ctx.stats.messages.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let now = now_ms();
        let mut items = Vec::with_capacity(batch.len());
        for change in batch {
            let Some(point) = (change.handle as usize).checked_sub(1).and_then(|i| self.points.get_mut(i)) else {
                continue;
            };
            let dv = &change.value;
            let t = convert::point_time(dv, now);
            if let (Some(from), Some(worker)) = (point.gap_from.take(), &self.backfill) {
                worker.fill(backfill::Gap { node: point.node.clone(), channel: point.channel.clone(), from, to: t });
            }
            let accepted = match (change.refused, &dv.value) {
                (Some(Refusal::Oversized(floor)), _) => Err(("oversized", floor)),
                (Some(Refusal::QueueFull), _) => Err(("queue_full", 0)),
                (None, None | Some(opcua::types::Variant::Empty)) => {
                    // No value (a device reporting a fault sends a bad status alone): the
                    // point keeps its last value with the status's quality.
                    let q = match convert::quality(dv.status) {
                        "good" => "bad",
                        q => q,
                    };
                    items.extend(point.mark(t, q));
                    continue;
                }
                (None, Some(variant)) => {
                    // A panic while encoding one value (a bug meeting a device's value) refuses
                    // that value like an undecodable one: the other points and the session go on.
                    let max = self.max_value_bytes;
                    switchboard_supervisor::isolate("source-decode", || {
                        switchboard_supervisor::fault::hit("source.decode", &point.node);
                        encode(variant, t, convert::quality(dv.status), max)
                    })
                    .unwrap_or(Err(("decode", 0)))
                }
            };
            match accepted {
                Ok((v, data)) => {
                    point.kept = Kept { last: Some(v), last_t: Some(t), marked: false };
                    items.push((point.channel.clone(), Arc::new(data)));
                }
                Err((reason, bytes)) => {
                    // Counted once per value; the queue counted its own drops.
                    if reason != "queue_full" {
                        ctx.stats.refusals.add(reason, 1);
                    }
                    if reason == "decode" {
                        ctx.stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                        warn!(source = %ctx.name, node = %point.node, channel = %point.channel, "OPC UA value of a type a point cannot carry (a structure); the point is marked bad");
                    } else if reason == "oversized" {
                        warn!(source = %ctx.name, node = %point.node, channel = %point.channel, bytes, max_value_bytes = self.max_value_bytes, "OPC UA value larger than max_value_bytes refused; the point is marked bad");
                    }
                    items.extend(point.mark(t, "bad"));
                }
            }
        }
        self.send(ctx, items).await;
    }

    /// Marks every point bad (connection lost), each with its last value. The source reads as
    /// disconnected before the marks go out, so whoever sees a bad mark sees the state behind it.
    async fn mark_bad(&mut self, ctx: &SourceCtx) {
        ctx.stats.connected.store(false, Ordering::Relaxed);
        let now = now_ms();
        let items = self.points.iter_mut().filter_map(|p| p.mark(now, "bad")).collect();
        self.send(ctx, items).await;
    }

    async fn send(&self, ctx: &SourceCtx, items: Vec<(String, switchboard_broker::Data)>) {
        let items = items.into_iter().map(|(ch, data)| crate::Item::live(ch, data)).collect();
        let ok = deliver(&*ctx.sink, &ctx.stats, &ctx.name, items).await;
        ctx.stats.points.fetch_add(ok, Ordering::Relaxed);
    }

    /// Starts a write to the channel's node in its own task (a slow device must not hold up
    /// values); at most [`MAX_WRITES_IN_FLIGHT`] at once.
    fn dispatch_write(&self, ctx: &SourceCtx, w: Write, gate: &Arc<Semaphore>) {
        let stats = ctx.stats.clone();
        let fail = |w: Write, e: WriteError| {
            stats.writes_failed.fetch_add(1, Ordering::Relaxed);
            let _ = w.reply.send(Err(e));
        };
        let Some(&i) = self.by_channel.get(&w.channel) else {
            let e = WriteError::NotWritable(format!("no OPC UA node behind channel {}", w.channel));
            return fail(w, e);
        };
        let Ok(permit) = gate.clone().try_acquire_owned() else {
            return fail(w, WriteError::Unavailable("too many writes in flight".into()));
        };
        let session = self.conn.session.clone();
        let node = self.points[i].node.clone();
        tokio::spawn(async move {
            let result = session::write(&session, &node, w.data.get()).await;
            drop(permit);
            let counter = if result.is_ok() { &stats.writes_ok } else { &stats.writes_failed };
            counter.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = &result {
                info!(%node, channel = %w.channel, "OPC UA write not done: {e}");
            }
            let _ = w.reply.send(result);
        });
    }
}
