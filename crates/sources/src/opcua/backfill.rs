//! Back-fill: after a reconnect, the values a point missed while the source was away, read from
//! the server's history and sent as historical values (kept in the channel's trend at their own
//! time, never sent to subscribers as the current value).
//!
//! A gap runs from the `t` of the point's last value before the connection was lost to the `t`
//! of its first value after the reconnect, both excluded, and reaches back at most
//! `backfill_max_s` from its end. It is read only when the node's AccessLevel allows
//! HistoryRead (and its UserAccessLevel, when the server gives one), with HistoryRead of raw
//! values (ReadRawModifiedDetails) in pages of [`PAGE`] values, following continuation points,
//! at most [`MAX_VALUES`] values and [`MAX_TIME`] per gap (the oldest part of the gap first; a
//! gap cut short keeps what was sent). Values are converted as live ones are and sent one batch
//! per page. A node without history, or a server that refuses the read, leaves the gap as the
//! bad marker left it; that is logged once per node (once per source run for a server without
//! the service).
//!
//! One [`Worker`] per connection reads the gaps one after another, in the order their first
//! values came, while live values go on; it ends with its connection, so a gap cut short by
//! another loss is not read again.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opcua::client::{HistoryReadAction, Session};
use opcua::types::{
    AccessLevelType, AttributeId, ByteString, DataValue, DateTime, HistoryData, HistoryReadValueId, NodeId,
    ReadRawModifiedDetails, ReadValueId, StatusCode, TimestampsToReturn, Variant,
};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::session::Connection;
use super::{convert, OpcuaConfig};
use crate::{Item, Sink, SourceCtx, SourceStats};

/// Values asked for per HistoryRead.
pub const PAGE: u32 = 1000;
/// Most values back-filled per point and gap.
pub const MAX_VALUES: usize = 100_000;
/// Longest time one gap's reading may take.
pub const MAX_TIME: Duration = Duration::from_secs(60);

/// One point's gap: values with `from < t < to` (unix ms) are missing.
#[derive(Debug)]
pub struct Gap {
    pub node: NodeId,
    pub channel: String,
    pub from: i64,
    pub to: i64,
}

/// What was logged about missing history, across the source's connections, so that each node
/// (and a server without the service) is logged once.
#[derive(Clone, Default)]
pub struct Told(Arc<ToldInner>);

#[derive(Default)]
struct ToldInner {
    server: AtomicBool,
    nodes: parking_lot::Mutex<HashSet<NodeId>>,
}

impl Told {
    fn server(&self) -> bool {
        !self.0.server.swap(true, Ordering::Relaxed)
    }

    fn node(&self, node: &NodeId) -> bool {
        self.0.nodes.lock().insert(node.clone())
    }
}

/// The back-fill of one connection: takes gaps and reads them in a task of its own, aborted
/// when the worker is dropped (the connection ended).
pub struct Worker {
    // Unbounded: a point hands over at most one gap per connection, so the queue never holds
    // more gaps than the source has points.
    gaps: mpsc::UnboundedSender<Gap>,
    task: tokio::task::JoinHandle<()>,
    max_ms: i64,
}

impl Worker {
    pub fn start(conn: &Connection, ctx: &SourceCtx, cfg: &OpcuaConfig, told: Told) -> Worker {
        let (gaps, rx) = mpsc::unbounded_channel();
        let reader = Reader {
            session: conn.session.clone(),
            sink: ctx.sink.clone(),
            stats: ctx.stats.clone(),
            source: ctx.name.clone(),
            max_value_bytes: cfg.max_value_bytes(),
            told,
            unsupported: false,
        };
        let task = tokio::spawn(reader.run(rx));
        let max_ms = i64::try_from(cfg.backfill_max_s.saturating_mul(1000)).unwrap_or(i64::MAX);
        Worker { gaps, task, max_ms }
    }

    /// Queues `gap`, cut to `backfill_max_s` back from its end; a gap with no room for a value
    /// is dropped.
    pub fn fill(&self, mut gap: Gap) {
        gap.from = gap.from.max(gap.to.saturating_sub(self.max_ms));
        if gap.to.saturating_sub(gap.from) > 1 {
            let _ = self.gaps.send(gap);
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Statuses of a server that has no HistoryRead of raw values at all.
const NO_SERVICE: [StatusCode; 5] = [
    StatusCode::BadServiceUnsupported,
    StatusCode::BadHistoryOperationUnsupported,
    StatusCode::BadHistoryOperationInvalid,
    StatusCode::BadNotImplemented,
    StatusCode::BadNotSupported,
];

/// Why a gap was not (wholly) read.
enum Unread {
    /// The server has no history service: no gap of this connection is read.
    NoService(StatusCode),
    /// The node has no history the source may read.
    NoHistory(String),
    /// The read failed (timeout, connection): this gap only.
    Failed(String),
}

struct Reader {
    session: Arc<Session>,
    sink: Arc<dyn Sink>,
    stats: Arc<SourceStats>,
    source: String,
    max_value_bytes: usize,
    told: Told,
    /// The server refused the service on this connection.
    unsupported: bool,
}

impl Reader {
    async fn run(mut self, mut gaps: mpsc::UnboundedReceiver<Gap>) {
        while let Some(gap) = gaps.recv().await {
            if self.unsupported {
                continue;
            }
            let outcome = match self.readable(&gap.node).await {
                Ok(true) => tokio::time::timeout(MAX_TIME, self.read(&gap))
                    .await
                    .unwrap_or_else(|_| Err(Unread::Failed(format!("not done within {} s", MAX_TIME.as_secs())))),
                Ok(false) => Err(Unread::NoHistory("its AccessLevel does not allow HistoryRead".into())),
                Err(e) => Err(Unread::Failed(e)),
            };
            let (source, node, channel) = (&self.source, &gap.node, &gap.channel);
            match outcome {
                Ok(values) => {
                    info!(%source, %node, %channel, values, gap_ms = gap.to - gap.from, "OPC UA gap back-filled from the server's history")
                }
                Err(Unread::NoService(status)) => {
                    self.unsupported = true;
                    if self.told.server() {
                        info!(%source, %status, "the OPC UA server does not read history: gaps stay marked bad");
                    }
                }
                Err(Unread::NoHistory(why)) => {
                    if self.told.node(node) {
                        info!(%source, %node, %channel, "no OPC UA history for the node ({why}): its gaps stay marked bad");
                    }
                }
                Err(Unread::Failed(why)) => {
                    warn!(%source, %node, %channel, "OPC UA back-fill not done: {why}; the rest of the gap stays marked bad")
                }
            }
        }
    }

    /// Whether the node's AccessLevel allows HistoryRead; its UserAccessLevel narrows that for
    /// the session's user when the server gives one.
    async fn readable(&self, node: &NodeId) -> Result<bool, String> {
        let reads = [AttributeId::AccessLevel, AttributeId::UserAccessLevel].map(|a| ReadValueId::new(node.clone(), a));
        let values = self
            .session
            .read(&reads, TimestampsToReturn::Neither, 0.0)
            .await
            .map_err(|e| format!("read AccessLevel: {}", e.status()))?;
        let allows = |dv: Option<&DataValue>| match dv.and_then(|d| d.value.as_ref()) {
            Some(Variant::Byte(bits)) => Some(bits & AccessLevelType::HistoryRead.bits() != 0),
            _ => None,
        };
        Ok(allows(values.first()).unwrap_or(false) && allows(values.get(1)).unwrap_or(true))
    }

    /// Reads the gap page by page and sends its values; how many the node took.
    async fn read(&self, gap: &Gap) -> Result<u64, Unread> {
        let mut start = convert::date_time(gap.from);
        let end = convert::date_time(gap.to);
        let mut continuation = ByteString::null();
        let (mut read, mut sent) = (0usize, 0u64);
        loop {
            let details = ReadRawModifiedDetails {
                is_read_modified: false,
                start_time: start,
                end_time: end,
                num_values_per_node: PAGE,
                return_bounds: false,
            };
            let id = HistoryReadValueId {
                node_id: gap.node.clone(),
                continuation_point: continuation,
                ..Default::default()
            };
            let results = self
                .session
                .history_read(
                    HistoryReadAction::ReadRawModifiedDetails(details),
                    TimestampsToReturn::Both,
                    false,
                    &[id],
                )
                .await
                .map_err(|e| match e.status() {
                    s if NO_SERVICE.contains(&s) => Unread::NoService(s),
                    s => Unread::Failed(format!("HistoryRead: {s}")),
                })?;
            let result = results
                .into_iter()
                .next()
                .ok_or_else(|| Unread::Failed("HistoryRead answered without a result".into()))?;
            if result.status_code.is_bad() {
                return Err(Unread::NoHistory(format!("HistoryRead: {}", result.status_code)));
            }
            let values =
                result.history_data.into_inner_as::<HistoryData>().and_then(|d| d.data_values).unwrap_or_default();
            let (n, last) = (values.len(), values.last().and_then(|dv| dv.source_timestamp.or(dv.server_timestamp)));
            read += n;
            sent += self.send(gap, values).await;
            continuation = result.continuation_point;
            if read >= MAX_VALUES {
                if !continuation.is_null() {
                    self.release(gap, continuation).await;
                }
                warn!(source = %self.source, node = %gap.node, max = MAX_VALUES, "OPC UA gap has more values than one back-fill takes: its newest part stays marked bad");
                break;
            }
            if continuation.is_null() {
                // Some servers stop at num_values_per_node without a continuation point: a
                // full page is followed by a read from just after its last value.
                match last {
                    Some(t) if n == PAGE as usize => start = DateTime::from(t.checked_ticks().saturating_add(1)),
                    _ => break,
                }
            }
        }
        Ok(sent)
    }

    /// Frees a continuation point the source does not follow.
    async fn release(&self, gap: &Gap, continuation: ByteString) {
        let id =
            HistoryReadValueId { node_id: gap.node.clone(), continuation_point: continuation, ..Default::default() };
        let details = ReadRawModifiedDetails::default();
        let _ = self
            .session
            .history_read(HistoryReadAction::ReadRawModifiedDetails(details), TimestampsToReturn::Neither, true, &[id])
            .await;
    }

    /// Sends the values inside the gap as historical points; how many the node took. Values
    /// without a variant (a status alone) have nothing to keep; values the node could not
    /// carry are refused and counted as live ones are.
    async fn send(&self, gap: &Gap, values: Vec<DataValue>) -> u64 {
        let now = super::now_ms();
        let mut items = Vec::with_capacity(values.len());
        for dv in &values {
            let t = convert::point_time(dv, now);
            let Some(variant) = dv.value.as_ref().filter(|v| !matches!(v, Variant::Empty)) else {
                continue;
            };
            if t <= gap.from || t >= gap.to {
                continue;
            }
            let q = convert::quality(dv.status);
            let max = self.max_value_bytes;
            // A panic while encoding one value refuses that value, as for live values.
            let encoded = switchboard_supervisor::isolate("source-decode", || super::encode(variant, t, q, max))
                .unwrap_or(Err(("decode", 0)));
            match encoded {
                Ok((_, data)) => {
                    items.push(Item { channel: gap.channel.clone(), data: Arc::new(data), historical: true })
                }
                Err((reason, _)) => {
                    self.stats.refusals.add(reason, 1);
                    if reason == "decode" {
                        self.stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        let ok = super::deliver(&*self.sink, &self.stats, &self.source, items).await;
        self.stats.backfilled.fetch_add(ok, Ordering::Relaxed);
        ok
    }
}
