//! The OPC UA source: subscribes to variables of an OPC UA server (a list of node ids, or every
//! variable below a browse path), publishes each value change as a point with the source
//! timestamp and the status mapped to `q`, and writes values back to the server.
//!
//! # Layout
//! - this file: [`OpcuaConfig`] and [`run`], the connect → subscribe → publish loop with its
//!   reconnect backoff and write dispatch.
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
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::value::{to_raw_value, RawValue};
use tokio::sync::{mpsc, Semaphore};
use tracing::{error, info, warn};

use crate::{SourceCtx, Write, WriteError};

mod backfill;
mod browse;
mod convert;
mod queue;
mod session;

use convert::{JsonVariant, Point};
use queue::{Change, ChangeQueue, Refusal};
use session::Connection;

/// Security of the connection to the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Security {
    /// No signing or encryption (`SecurityPolicy#None`).
    #[default]
    None,
    /// `Basic256Sha256`, SignAndEncrypt, with the source's own certificate.
    Basic256Sha256,
}

/// `kind = "opcua"` settings.
#[derive(Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpcuaConfig {
    pub name: String,
    /// `opc.tcp://host:4840[/path]`.
    pub url: String,
    #[serde(default)]
    pub security: Security,
    /// The source's certificate (`.der` or `.pem`) and private key (PEM), for Basic256Sha256.
    pub certificate: Option<PathBuf>,
    pub private_key: Option<PathBuf>,
    /// The server certificate to trust (`.der` or `.pem`).
    pub trust_server: Option<PathBuf>,
    /// Trust any server certificate (tests only: it defeats the point of Basic256Sha256).
    #[serde(default)]
    pub trust_any: bool,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Node ids to subscribe (`ns=2;s=Line1.Temp`); or `browse`.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Subscribe every variable below this path of browse names (`Objects/Plant`) or node id.
    pub browse: Option<String>,
    /// At most this many variables from `browse`.
    #[serde(default = "default_max_nodes")]
    pub max_nodes: usize,
    /// How often the server samples each variable.
    #[serde(default = "default_sampling_ms")]
    pub sampling_ms: u64,
    /// How often the server sends the changes it sampled (default: `sampling_ms`).
    pub publishing_ms: Option<u64>,
    /// Channel of each variable; `{name}` is its browse path below the browse root joined by
    /// `.`, or for `nodes` its identifier (characters outside the channel alphabet become `_`).
    #[serde(default = "default_channel")]
    pub channel: String,
    /// Largest point (its JSON, bytes) the source publishes; a larger value is refused and its
    /// point marked bad. Default: the node's `limits.max_publication_bytes`.
    pub max_value_bytes: Option<usize>,
    /// Largest message the client takes from the server (bytes); strings, byte strings and
    /// arrays may be as long as a message. Default: 16 MiB, or four times the node's
    /// `limits.max_publication_bytes` when that is more.
    pub max_message_bytes: Option<usize>,
    /// After a reconnect, read each point's gap from the server's history (nodes whose
    /// AccessLevel allows HistoryRead) and send it as historical values.
    #[serde(default = "default_backfill")]
    pub backfill: bool,
    /// The longest stretch back from a gap's end that is back-filled (seconds).
    #[serde(default = "default_backfill_max_s")]
    pub backfill_max_s: u64,
}

/// `max_value_bytes` when the node did not fill it: the node's default largest publication.
const DEFAULT_MAX_VALUE: usize = 64 * 1024;
/// `max_message_bytes` by default, and its range.
const DEFAULT_MAX_MESSAGE: usize = 16 << 20;
const MESSAGE_BYTES_RANGE: std::ops::RangeInclusive<usize> = (64 * 1024)..=(1 << 30);

fn default_max_nodes() -> usize {
    10_000
}
fn default_sampling_ms() -> u64 {
    250
}
fn default_channel() -> String {
    "pt:{name}".into()
}
fn default_backfill() -> bool {
    true
}
fn default_backfill_max_s() -> u64 {
    3600
}
/// `backfill_max_s` range: a second to a week.
const BACKFILL_MAX_S_RANGE: std::ops::RangeInclusive<u64> = 1..=7 * 86_400;

// By hand: the password never reaches a log line.
impl std::fmt::Debug for OpcuaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpcuaConfig")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("security", &self.security)
            .field("certificate", &self.certificate)
            .field("private_key", &self.private_key)
            .field("trust_server", &self.trust_server)
            .field("trust_any", &self.trust_any)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("nodes", &self.nodes)
            .field("browse", &self.browse)
            .field("max_nodes", &self.max_nodes)
            .field("sampling_ms", &self.sampling_ms)
            .field("publishing_ms", &self.publishing_ms)
            .field("channel", &self.channel)
            .field("max_value_bytes", &self.max_value_bytes)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("backfill", &self.backfill)
            .field("backfill_max_s", &self.backfill_max_s)
            .finish()
    }
}

impl OpcuaConfig {
    /// Checks what serde cannot: one of `nodes`/`browse`, the settings security needs, a
    /// channel template with `{name}`, node ids that parse. Errors name the setting.
    pub fn check(&self) -> Result<(), String> {
        if !self.url.starts_with("opc.tcp://") {
            return Err(format!("url: {:?} is not an opc.tcp:// URL", self.url));
        }
        match (self.nodes.is_empty(), &self.browse) {
            (true, None) => return Err("give nodes = [...] or browse = \"Objects/...\"".into()),
            (false, Some(_)) => return Err("nodes and browse exclude each other".into()),
            _ => {}
        }
        for node in &self.nodes {
            session::parse_node(node).map_err(|e| format!("nodes: {e}"))?;
        }
        if !self.channel.contains("{name}") {
            return Err(format!("channel: {:?} has no {{name}}", self.channel));
        }
        if self.max_nodes == 0 || self.sampling_ms == 0 || self.publishing_ms == Some(0) {
            return Err("max_nodes, sampling_ms and publishing_ms must be positive".into());
        }
        if self.max_value_bytes == Some(0) {
            return Err("max_value_bytes must be positive".into());
        }
        if self.max_message_bytes.is_some_and(|n| !MESSAGE_BYTES_RANGE.contains(&n)) {
            let (lo, hi) = (MESSAGE_BYTES_RANGE.start(), MESSAGE_BYTES_RANGE.end());
            return Err(format!("max_message_bytes: {lo} to {hi}"));
        }
        if !BACKFILL_MAX_S_RANGE.contains(&self.backfill_max_s) {
            let (lo, hi) = (BACKFILL_MAX_S_RANGE.start(), BACKFILL_MAX_S_RANGE.end());
            return Err(format!("backfill_max_s: {lo} to {hi}"));
        }
        if self.username.is_some() != self.password.is_some() {
            return Err("username and password go together".into());
        }
        if self.security == Security::Basic256Sha256 {
            if self.certificate.is_none() || self.private_key.is_none() {
                return Err("security = \"basic256sha256\" needs certificate and private_key".into());
            }
            if self.trust_server.is_none() && !self.trust_any {
                return Err("security = \"basic256sha256\" needs trust_server (or trust_any = true)".into());
            }
        }
        Ok(())
    }

    /// Fills the byte limits left unset from the node's largest publication (see
    /// `max_value_bytes` and `max_message_bytes`).
    pub fn with_node_limits(mut self, max_publication_bytes: usize) -> OpcuaConfig {
        self.max_value_bytes.get_or_insert(max_publication_bytes);
        let message = DEFAULT_MAX_MESSAGE.max(max_publication_bytes.saturating_mul(4));
        self.max_message_bytes.get_or_insert(message.min(*MESSAGE_BYTES_RANGE.end()));
        self
    }

    pub fn max_value_bytes(&self) -> usize {
        self.max_value_bytes.unwrap_or(DEFAULT_MAX_VALUE)
    }

    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes.unwrap_or(DEFAULT_MAX_MESSAGE)
    }

    /// Bound of the queue between the session and the publisher: two messages' worth.
    fn queue_bytes(&self) -> usize {
        self.max_message_bytes().saturating_mul(2)
    }
}

/// Writes to the server in flight at once; more are answered `Unavailable` at once.
const MAX_WRITES_IN_FLIGHT: usize = 16;
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

/// What the source keeps of a point across connections.
#[derive(Default)]
struct Kept {
    /// Its last accepted value (`v`), published again with `q: "bad"` when the point can no
    /// longer be vouched for.
    last: Option<Box<RawValue>>,
    /// The time (`t`) of its last accepted value: where a gap in its values starts.
    last_t: Option<i64>,
    /// Its latest publication is such a bad marker: no second one until a value comes.
    marked: bool,
}

/// One subscribed variable.
struct PointState {
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

enum Outcome {
    Stopped,
    Lost(String),
}

/// A connection with its subscription running.
struct Live {
    conn: Connection,
    points: Vec<PointState>,
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
    async fn start(conn: Connection, cfg: &OpcuaConfig, kept: &mut HashMap<String, Kept>) -> Result<Live, String> {
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
    async fn serve(
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

    fn parse(json: serde_json::Value) -> Result<OpcuaConfig, String> {
        let cfg: OpcuaConfig = serde_json::from_value(json).map_err(|e| e.to_string())?;
        cfg.check().map(|()| cfg)
    }

    #[test]
    fn opcua_config_defaults_and_checks() {
        let cfg = parse(serde_json::json!({"name": "plc", "url": "opc.tcp://h:4840", "browse": "Objects/Plant"}))
            .expect("valid");
        assert_eq!((cfg.sampling_ms, cfg.max_nodes, cfg.channel.as_str()), (250, 10_000, "pt:{name}"));
        assert_eq!(cfg.security, Security::None);
        let bad = |j: serde_json::Value| parse(j).expect_err("invalid");
        assert!(bad(
            serde_json::json!({"name": "p", "url": "opc.tcp://h", "nodes": ["ns=2;s=A"], "browse": "Objects"})
        )
        .contains("exclude"));
        assert!(bad(serde_json::json!({"name": "p", "url": "opc.tcp://h"})).contains("nodes"));
        assert!(bad(serde_json::json!({"name": "p", "url": "http://h", "browse": "Objects"})).contains("url"));
        assert!(bad(serde_json::json!({"name": "p", "url": "opc.tcp://h", "nodes": ["nonsense"]})).contains("node id"));
        assert!(bad(serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "channel": "pt:x"}))
            .contains("{name}"));
        assert!(bad(
            serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "security": "basic256sha256"})
        )
        .contains("certificate"));
        assert!(bad(
            serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "security": "basic256sha256",
            "certificate": "c.der", "private_key": "k.pem"})
        )
        .contains("trust_server"));
        assert!(
            bad(serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "colour": 1})).contains("colour")
        );
        assert!(bad(serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "max_message_bytes": 1000}))
            .contains("max_message_bytes"));
        assert_eq!((cfg.backfill, cfg.backfill_max_s), (true, 3600));
        for n in [0, 7 * 86_400 + 1] {
            assert!(bad(serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "backfill_max_s": n}))
                .contains("backfill_max_s"));
        }
    }

    #[test]
    fn opcua_byte_limits_follow_the_node_unless_set() {
        let cfg = |extra: serde_json::Value| {
            let mut json = serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O"});
            json.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
            parse(json).expect("valid")
        };
        let c = cfg(serde_json::json!({}));
        assert_eq!((c.max_value_bytes(), c.max_message_bytes()), (64 * 1024, 16 << 20));
        let c = cfg(serde_json::json!({})).with_node_limits(8 << 20);
        assert_eq!((c.max_value_bytes(), c.max_message_bytes()), (8 << 20, 32 << 20));
        let c =
            cfg(serde_json::json!({"max_value_bytes": 1000, "max_message_bytes": 1 << 20})).with_node_limits(8 << 20);
        assert_eq!((c.max_value_bytes(), c.max_message_bytes()), (1000, 1 << 20), "settings win");
        assert_eq!(c.queue_bytes(), 2 << 20);
    }

    #[test]
    fn opcua_config_debug_hides_the_password() {
        let cfg = parse(serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O",
            "username": "op", "password": "hunter2"}))
        .expect("valid");
        let text = format!("{cfg:?}");
        assert!(text.contains("op") && !text.contains("hunter2"), "{text}");
    }

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
