//! Sources: plant data in. A source connects to a system the plant already runs (an MQTT
//! broker, an OPC UA server), turns what it receives into points and publishes them through the
//! node's own publish path; a namespace may name a source for writes, so a permitted publish to
//! one of its channels becomes a write to the device.
//!
//! # Layout
//! - this file: the [`SourceConfig`] of `[[sources]]`, the [`Sink`] a source publishes into, the
//!   [`Write`] requests it serves, its [`SourceStats`], and the running set.
//! - `running`: [`Sources`], the running set: one supervisor per source that takes the
//!   source's lease, runs it while the lease holds, and routes writes to it.
//! - `mqtt`: the MQTT source (one file per source kind beside this interface); its `config`
//!   holds its settings and client options, `conn` the connection task's handling of what
//!   arrives, `backlog` and `commit` hold what it received until the node committed it
//!   (acknowledged after commit), `host` is its Sparkplug B primary host STATE, `writes` its
//!   write-back.
//! - `sparkplug`: Sparkplug B payloads of the MQTT source: `proto` and `datatype` the schema,
//!   `topic` the topic namespace, `state` the per-edge-node state that turns messages into
//!   points, `value` and `command` the values and commands of writes.
//! - `opcua`: the OPC UA source (its own `# Layout` lists its files).
//!
//! # Contract
//! A source publishes each value once, in the order it received them per channel, with the
//! time the device gave it (`t`, unix milliseconds) when it gave one, and marks a value it can
//! no longer vouch for (connection lost, device dead) with `q: "bad"` rather than leaving the
//! last good value standing. In a cluster each source runs on one node at a time (a lease
//! held through the broker); the others stand by.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use serde_json::Value;
use switchboard_broker::Data;

/// Where a source's points go: the node's publish path (validation, limits, the broker). One
/// result per item, in order.
#[async_trait::async_trait]
pub trait Sink: Send + Sync + 'static {
    async fn publish_batch(&self, items: Vec<Item>) -> Vec<Result<(), SinkError>>;

    /// Whether `channel`'s recent publications hold `data` exactly: asked before offering
    /// again a point whose outcome was unknown ([`SinkError::Unknown`]).
    async fn holds(&self, channel: &str, data: &Data) -> Result<bool, SinkError> {
        let _ = (channel, data);
        Ok(false)
    }

    /// Whether the node can commit publications now.
    async fn ready(&self) -> bool {
        true
    }
}

/// One point for the [`Sink`].
#[derive(Debug, Clone)]
pub struct Item {
    pub channel: String,
    pub data: Data,
    /// A value from before the channel's newest (a Sparkplug B `is_historical` metric, an MQTT
    /// value older than the last one, an OPC UA back-fill): kept in the channel's trend at its
    /// own time, never sent to subscribers as the current value.
    pub historical: bool,
}

impl Item {
    /// A live value.
    pub fn live(channel: String, data: Data) -> Item {
        Item { channel, data, historical: false }
    }
}

/// Why the sink did not take an item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// The node refused the item (a limit, a value it cannot carry): offered again it would be
    /// refused again, so the source counts it and goes on.
    #[error("{0}")]
    Refused(String),
    /// The node cannot commit publications now (its broker is unreachable or failing over):
    /// nothing was done. A source that can hold its input (MQTT QoS 1/2) waits and offers it
    /// again.
    #[error("{0}")]
    Unavailable(String),
    /// The broker did not answer: the item may or may not have been committed. A source that
    /// offers it again first looks whether the channel has it.
    #[error("{0}")]
    Unknown(String),
}

impl SinkError {
    /// Whether the item may be offered again later (the node could not commit it now).
    pub fn retriable(&self) -> bool {
        !matches!(self, SinkError::Refused(_))
    }
}

/// A client's publish to a channel of a namespace whose writes go to a source; the source
/// answers once the device accepted or refused it.
#[derive(Debug)]
pub struct Write {
    pub channel: String,
    pub data: Data,
    pub reply: tokio::sync::oneshot::Sender<Result<(), WriteError>>,
}

/// Why a write did not reach the device or was not accepted by it.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum WriteError {
    /// The device (or the MQTT broker) said no; the text is its reason.
    #[error("device refused the write: {0}")]
    Refused(String),
    /// The source is not connected, or the device did not answer in time.
    #[error("source unavailable: {0}")]
    Unavailable(String),
    /// The source does not run on this node: another node of the cluster holds its lease (the
    /// gateway forwards the write there), or it is starting.
    #[error("source unavailable: {0}")]
    NotHere(String),
    /// The channel does not map to anything the source can write, or the value has the wrong form.
    #[error("not writable: {0}")]
    NotWritable(String),
    /// The write's target is outside what the source reads (its topic filters or
    /// `write_topics`): a write goes only to a device the source was set up for.
    #[error("forbidden: {0}")]
    Forbidden(String),
}

/// Most channels one source feeds (and Sparkplug B metrics and aliases it keeps) unless its
/// `max_channels` says otherwise.
pub const DEFAULT_MAX_CHANNELS: usize = 100_000;

/// Counts by a short, fixed reason label (`refused`, `dropped`), listed in reason order.
#[derive(Debug, Default)]
pub struct ByReason(parking_lot::Mutex<std::collections::BTreeMap<&'static str, u64>>);

impl ByReason {
    /// Counts `n` for `reason`.
    pub fn add(&self, reason: &'static str, n: u64) {
        *self.0.lock().entry(reason).or_insert(0) += n;
    }

    /// The counts, in reason order.
    pub fn list(&self) -> Vec<(&'static str, u64)> {
        self.0.lock().iter().map(|(r, n)| (*r, *n)).collect()
    }
}

/// Counters of one source, rendered by the node's metrics.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// Messages (MQTT) or value changes (OPC UA) received.
    pub messages: AtomicU64,
    /// Points published into channels.
    pub points: AtomicU64,
    /// Payloads that could not be decoded (counted and logged, never fatal).
    pub decode_errors: AtomicU64,
    /// Connected to the upstream system now.
    pub connected: AtomicBool,
    /// This node holds the source's lease (runs it) now.
    pub active: AtomicBool,
    pub reconnects: AtomicU64,
    pub writes_ok: AtomicU64,
    pub writes_failed: AtomicU64,
    /// Messages or values refused, by reason: `node` (the node refused the point: a channel
    /// limit, a too-large value), and the source's own reasons (`oversized`, `decode`,
    /// `collision`, `bound`, ...). Refused input is counted and logged, never a reason to
    /// reconnect.
    pub refusals: ByReason,
    /// Sparkplug B rebirth requests sent (MQTT).
    pub rebirths: AtomicU64,
    /// Values received and not committed yet (the MQTT source's backlog).
    pub backlog: AtomicU64,
    /// When the oldest of them came (unix ms; 0 when none waits).
    pub backlog_since_ms: AtomicU64,
    /// Values received and dropped before the node saw them, by reason (`buffer`: a QoS 0
    /// value replaced by a newer one of its channel while the buffer was full).
    pub dropped: ByReason,
    /// Values back-filled from the server's history after a connection loss (OPC UA), sent
    /// as historical items (not counted in `points`).
    pub backfilled: AtomicU64,
}

impl SourceStats {
    /// How long the oldest value of the backlog has waited (s; 0 when none waits).
    pub fn backlog_age_s(&self, now_ms: u64) -> f64 {
        match self.backlog_since_ms.load(std::sync::atomic::Ordering::Relaxed) {
            0 => 0.0,
            since => now_ms.saturating_sub(since) as f64 / 1000.0,
        }
    }
}

/// One running source as the node sees it.
#[derive(Debug, Clone)]
pub struct SourceHandle {
    pub name: String,
    pub kind: &'static str,
    pub stats: Arc<SourceStats>,
}

pub mod mqtt;
pub mod opcua;
mod running;
pub mod sparkplug;

pub use running::{Lease, Sources, WRITE_WAIT};

/// One `[[sources]]` entry; `kind` picks the variant, every other key belongs to it and unknown
/// keys are errors naming the key.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum SourceConfig {
    Mqtt(mqtt::MqttConfig),
    Opcua(opcua::OpcuaConfig),
}

impl SourceConfig {
    pub fn name(&self) -> &str {
        match self {
            SourceConfig::Mqtt(c) => &c.name,
            SourceConfig::Opcua(c) => &c.name,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            SourceConfig::Mqtt(_) => "mqtt",
            SourceConfig::Opcua(_) => "opcua",
        }
    }

    /// Checks what can be checked without connecting; the message names the key.
    pub fn check(&self) -> Result<(), String> {
        let name = self.name();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) {
            return Err(format!("name: {name:?} is not 1 or more of [A-Za-z0-9_.-]"));
        }
        match self {
            SourceConfig::Mqtt(c) => c.check(),
            SourceConfig::Opcua(c) => c.check(),
        }
    }

    /// Fills settings left unset that follow the node's limits: the largest MQTT message
    /// (`max_packet_bytes`), and the largest OPC UA value and message (`max_value_bytes`,
    /// `max_message_bytes`) from `limits.max_publication_bytes`.
    pub fn with_node_limits(self, max_publication_bytes: usize) -> SourceConfig {
        match self {
            SourceConfig::Mqtt(c) => SourceConfig::Mqtt(c.with_node_limits(max_publication_bytes)),
            SourceConfig::Opcua(c) => SourceConfig::Opcua(c.with_node_limits(max_publication_bytes)),
        }
    }

    /// Fills settings that name the deployment: the MQTT client id, when unset, is
    /// `switchboard-<cluster>-<name>` — the same on every node of the cluster (the node taking
    /// a source over resumes its session), different in another deployment on the same MQTT
    /// broker.
    pub fn with_cluster(self, cluster: &str) -> SourceConfig {
        match self {
            SourceConfig::Mqtt(mut c) => {
                c.client_id.get_or_insert_with(|| format!("switchboard-{cluster}-{}", c.name));
                SourceConfig::Mqtt(c)
            }
            other => other,
        }
    }

    /// Runs the source until `ctx.stop` turns true.
    pub async fn run(self, ctx: SourceCtx) {
        match self {
            SourceConfig::Mqtt(c) => mqtt::run(c, ctx).await,
            SourceConfig::Opcua(c) => opcua::run(c, ctx).await,
        }
    }
}

/// What a running source is given: where to publish, its counters, the writes routed to it and
/// when to stop (node shutdown, or its lease moved to another node).
pub struct SourceCtx {
    pub name: String,
    pub sink: Arc<dyn Sink>,
    pub stats: Arc<SourceStats>,
    pub writes: tokio::sync::mpsc::Receiver<Write>,
    /// Turns true when the source must stop.
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// The value a write carries: `v` of a point (`{"v": 42, "t": ..}`, what dashboard controls
/// send), or the whole data when it is not an object with `v` (a bare `42`).
pub fn write_value(data: &str) -> Result<Value, String> {
    let value: Value = serde_json::from_str(data).map_err(|e| format!("data is not JSON: {e}"))?;
    Ok(match value {
        Value::Object(mut m) if m.contains_key("v") => m.remove("v").unwrap_or(Value::Null),
        other => other,
    })
}

/// `value` as an integer of type `I` when it is a whole number within `I`'s range (`300` is
/// not a `u8`, `1.5` is no integer), for writes to typed device values.
pub(crate) fn whole_number<I: TryFrom<i128>>(value: &Value) -> Option<I> {
    let n = if let Some(n) = value.as_i64() {
        i128::from(n)
    } else if let Some(n) = value.as_u64() {
        i128::from(n)
    } else {
        let f = value.as_f64()?;
        // Whole numbers only, and within i64 so the cast is exact.
        if f.fract() != 0.0 || f.abs() > 9.0e18 {
            return None;
        }
        f as i128
    };
    I::try_from(n).ok()
}
