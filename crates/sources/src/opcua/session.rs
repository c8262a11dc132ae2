//! One connection to an OPC UA server: the client (certificates, trust), the session and its
//! event loop, the subscription that feeds values to the source, and writes.
//!
//! Decoding limits: a notification message is decoded whole, and one value that fails to decode
//! (a string longer than the library's limit) fails the whole message and drops the connection;
//! the server sends the same value again after every resubscribe. So the limits on strings,
//! byte strings and arrays are set to the largest message body the client reassembles
//! (`max_message_bytes`, at most [`CHUNK`] bytes a chunk): a value inside a message the client
//! takes can never fail on its length, and the source refuses values too large for the node
//! itself, one node at a time. A message over `max_message_bytes` is refused by the library
//! before decoding (BadEncodingLimitsExceeded): that one publish response is lost, counted
//! (`oversized`) and logged, and the session stays.
//!
//! The library's own reconnect is off (`session_retry_limit(0)`): the source owns reconnecting
//! (jittered backoff, a fresh browse, `q: "bad"` for the gap), so a lost connection ends the
//! [`Connection`] and the source builds a new one.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use opcua::client::{
    Client, ClientBuilder, IdentityToken, MonitoredItemMap, OnSubscriptionNotificationCore, Session, SessionPollResult,
    SubscriptionActivity,
};
use opcua::crypto::{CertificateStore, SecurityPolicy};
use opcua::types::{
    AttributeId, DataChangeNotification, DataValue, MessageSecurityMode, MonitoredItemCreateRequest, MonitoringMode,
    MonitoringParameters, NodeId, NotificationMessage, ReadValueId, StatusChangeNotification, StatusCode,
    TimestampsToReturn, UserTokenPolicy, Variant, WriteValue,
};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::convert::{self, WriteType};
use super::queue::{json_floor, Change, ChangeQueue, Refusal};
use super::{OpcuaConfig, Security};
use crate::{SourceStats, WriteError};

/// How long connecting (endpoints, secure channel, session) may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one write (type read + write) may take before the client hears `Unavailable`.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Monitored items created per request: servers cap their operation count per call.
const CREATE_CHUNK: usize = 1000;
/// Largest chunk the client takes (its receive buffer, in the Hello): the library's default.
const CHUNK: usize = 65_535;

/// The client's decoding limits for a `max_message_bytes`: (chunks per message, the limit on
/// a string's, byte string's and array's length). The library checks the chunk count only
/// before the final chunk, so a message reassembles from up to `chunks + 1` chunks; no value
/// inside one can be longer than that many chunks hold.
fn decode_limits(max_message_bytes: usize) -> (usize, usize) {
    let chunks = (max_message_bytes / CHUNK).max(1);
    (chunks, (chunks + 1) * CHUNK)
}

/// Builds the OPC UA client of a source: its application identity, its certificate and key
/// (Basic256Sha256), and which server certificates it trusts. The library keeps trusted and
/// rejected certificates in a PKI directory: one per source under the temporary directory,
/// with the `trust_server` certificate placed in `trusted/`.
pub fn client(cfg: &OpcuaConfig, pki_dir: &Path) -> Result<Client, String> {
    let mut builder = ClientBuilder::new()
        .application_name("Switchboard")
        .application_uri(format!("urn:switchboard:source:{}", convert::channel_safe(&cfg.name)))
        .product_uri("urn:switchboard")
        .pki_dir(pki_dir)
        .create_sample_keypair(false)
        .trust_server_certs(cfg.trust_any)
        .verify_server_certs(!cfg.trust_any)
        // Reconnecting is the source's job (see the module doc).
        .session_retry_limit(0)
        .session_timeout(60_000)
        .keep_alive_interval(Duration::from_secs(5))
        .max_failed_keep_alive_count(3)
        .request_timeout(Duration::from_secs(10))
        // A notification carries every value that changed since the last publish: thousands
        // of items in one message. The library's defaults (arrays of 1,000, strings of 64 KiB,
        // messages of 320 KiB) would drop the connection on the first large one; see the
        // module doc for the limits used.
        .max_incoming_chunk_size(CHUNK)
        .max_message_size(cfg.max_message_bytes())
        .max_chunk_count(decode_limits(cfg.max_message_bytes()).0)
        .max_string_length(decode_limits(cfg.max_message_bytes()).1)
        .max_byte_string_length(decode_limits(cfg.max_message_bytes()).1)
        .max_array_length(decode_limits(cfg.max_message_bytes()).1)
        .session_name(format!("switchboard {}", cfg.name));
    if let (Some(cert), Some(key)) = (&cfg.certificate, &cfg.private_key) {
        builder = builder.certificate_path(absolute(cert)?).private_key_path(absolute(key)?);
    }
    let client = builder.client().map_err(|errors| errors.join("; "))?;
    if let Some(trusted) = &cfg.trust_server {
        let cert = CertificateStore::read_cert(&absolute(trusted)?)?;
        let store = client.certificate_store().read();
        let path = store.trusted_certs_dir().join(CertificateStore::cert_file_name(&cert));
        let der = cert.to_der().map_err(|e| format!("trust_server certificate: {e}"))?;
        std::fs::write(&path, der).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(client)
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// A connected session: requests go through `session`; `ended` resolves (with the reason) when
/// the connection is lost; `changes` carries the subscription's value changes.
pub struct Connection {
    pub session: Arc<Session>,
    pub ended: oneshot::Receiver<String>,
    event_loop: tokio::task::JoinHandle<()>,
}

impl Connection {
    /// Connects and activates a session (bounded by [`CONNECT_TIMEOUT`]). Publish responses
    /// the library refuses for their size are counted in `stats` (`oversized`).
    pub async fn open(client: &mut Client, cfg: &OpcuaConfig, stats: Arc<SourceStats>) -> Result<Connection, String> {
        tokio::time::timeout(CONNECT_TIMEOUT, Self::open_inner(client, cfg, stats))
            .await
            .map_err(|_| format!("no session within {} s", CONNECT_TIMEOUT.as_secs()))?
    }

    async fn open_inner(client: &mut Client, cfg: &OpcuaConfig, stats: Arc<SourceStats>) -> Result<Connection, String> {
        let (policy, mode) = match cfg.security {
            Security::None => (SecurityPolicy::None, MessageSecurityMode::None),
            Security::Basic256Sha256 => (SecurityPolicy::Basic256Sha256, MessageSecurityMode::SignAndEncrypt),
        };
        let identity = match (&cfg.username, &cfg.password) {
            (Some(user), Some(password)) => IdentityToken::new_user_name(user.clone(), password.clone()),
            _ => IdentityToken::Anonymous,
        };
        let endpoint = (cfg.url.as_str(), policy.to_uri(), mode, UserTokenPolicy::anonymous());
        let (session, event_loop) = client
            .connect_to_matching_endpoint(endpoint, identity)
            .await
            .map_err(|e| format!("{} ({})", e.status(), e))?;
        let (connected_tx, connected_rx) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel();
        let (source, max_message_bytes) = (cfg.name.clone(), cfg.max_message_bytes());
        let event_loop = tokio::spawn(async move {
            let stream = event_loop.enter();
            tokio::pin!(stream);
            let mut connected_tx = Some(connected_tx);
            let reason = loop {
                match stream.next().await {
                    Some(Ok(SessionPollResult::Reconnected(_))) => {
                        if let Some(tx) = connected_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Some(Ok(SessionPollResult::ConnectionLost(code))) => break format!("connection lost: {code}"),
                    Some(Ok(SessionPollResult::Subscription(SubscriptionActivity::PublishFailed(
                        StatusCode::BadEncodingLimitsExceeded,
                    )))) => {
                        // A publish response over max_message_bytes: the library dropped it
                        // unread (its values are lost) and the session goes on.
                        stats.refusals.add("oversized", 1);
                        warn!(%source, max_message_bytes, "OPC UA publish response larger than max_message_bytes refused; its values are lost");
                    }
                    Some(Ok(_)) => {}
                    Some(Err(code)) => break format!("{code}"),
                    None => break "session closed".to_string(),
                }
            };
            let _ = ended_tx.send(reason);
        });
        let mut conn = Connection { session, ended, event_loop };
        tokio::select! {
            r = connected_rx => match r {
                Ok(()) => Ok(conn),
                // The loop ended before connecting: `ended` has the reason.
                Err(_) => Err((&mut conn.ended).await.unwrap_or_else(|_| "session ended".into())),
            },
            reason = &mut conn.ended => Err(reason.unwrap_or_else(|_| "session ended".into())),
        }
    }

    /// Closes the session on the server (deleting its subscription) and stops the event loop.
    pub async fn close(&mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.session.disconnect()).await;
        self.event_loop.abort();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.event_loop.abort();
    }
}

/// Hands each notification message's value changes to the source's [`ChangeQueue`]. Runs
/// inside the session's event loop, so it never waits. A value whose JSON could not be under
/// `max_value_bytes` is refused here (its text dropped at once, not queued).
struct Notify {
    changes: Arc<ChangeQueue>,
    /// The subscription's end, with the server's status (capacity 1: the first says it all).
    lost: mpsc::Sender<String>,
    max_value_bytes: usize,
}

/// Where a subscription delivers: value changes and its end.
pub struct Feed {
    pub changes: Arc<ChangeQueue>,
    pub lost: mpsc::Sender<String>,
    pub max_value_bytes: usize,
}

impl OnSubscriptionNotificationCore for Notify {
    fn on_subscription_notification(&mut self, msg: NotificationMessage, _items: MonitoredItemMap<'_>) {
        let mut batch = Vec::new();
        for obj in msg.notification_data.into_iter().flatten() {
            if let Some(dc) = obj.inner_as::<DataChangeNotification>() {
                for item in dc.monitored_items.iter().flatten() {
                    let dv = &item.value;
                    let floor = dv.value.as_ref().map_or(0, json_floor);
                    batch.push(if floor > self.max_value_bytes {
                        // Only the status and timestamps: the value itself is not copied.
                        let value = DataValue {
                            status: dv.status,
                            source_timestamp: dv.source_timestamp,
                            server_timestamp: dv.server_timestamp,
                            ..DataValue::default()
                        };
                        Change { handle: item.client_handle, value, refused: Some(Refusal::Oversized(floor)) }
                    } else {
                        Change { handle: item.client_handle, value: dv.clone(), refused: None }
                    });
                }
            } else if let Some(sc) = obj.inner_as::<StatusChangeNotification>() {
                // The server ended the subscription (BadTimeout, …): nothing more will come on
                // this session, so the source treats it as a lost connection.
                if sc.status.is_bad() {
                    let _ = self.lost.try_send(sc.status.to_string());
                }
            }
        }
        self.changes.push(batch);
    }
}

/// Creates the subscription and one monitored item per node (client handle = index + 1).
/// Returns, per node, `None` when monitoring started or the server's refusal.
pub async fn subscribe(
    session: &Session,
    cfg: &OpcuaConfig,
    nodes: &[NodeId],
    feed: Feed,
) -> Result<Vec<Option<String>>, String> {
    let publishing = Duration::from_millis(cfg.publishing_ms.unwrap_or(cfg.sampling_ms));
    // Keep-alive every 10 publishing intervals; the server drops the subscription after 30
    // silent ones (the lifetime must be at least three keep-alives).
    let id = session
        .create_subscription(
            publishing,
            30,
            10,
            0,
            0,
            true,
            Notify { changes: feed.changes, lost: feed.lost, max_value_bytes: feed.max_value_bytes },
        )
        .await
        .map_err(|e| format!("create subscription: {}", e.status()))?;
    // Room for every sample between two publishes, so a fast value loses nothing.
    let queue = (publishing.as_millis() as u64 / cfg.sampling_ms.max(1)).clamp(1, 100) as u32 + 1;
    let mut results = Vec::with_capacity(nodes.len());
    for (chunk_no, chunk) in nodes.chunks(CREATE_CHUNK).enumerate() {
        let items = chunk
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let handle = (chunk_no * CREATE_CHUNK + i + 1) as u32;
                MonitoredItemCreateRequest::new(
                    ReadValueId::new_value(node.clone()),
                    MonitoringMode::Reporting,
                    MonitoringParameters {
                        client_handle: handle,
                        sampling_interval: cfg.sampling_ms as f64,
                        queue_size: queue,
                        discard_oldest: true,
                        ..Default::default()
                    },
                )
            })
            .collect();
        let created = session
            .create_monitored_items(id, TimestampsToReturn::Both, items)
            .await
            .map_err(|e| format!("create monitored items: {}", e.status()))?;
        for r in created {
            let status = r.result.status_code;
            results.push((!status.is_good()).then(|| status.to_string()));
        }
    }
    Ok(results)
}

/// Writes `data`'s value to `node`, converted to the node's data type (read first: DataType,
/// ValueRank and the current value). The device's refusal comes back as
/// [`WriteError::Refused`] with its status name (`BadNotWritable`, `BadUserAccessDenied`, …).
pub async fn write(session: &Session, node: &NodeId, data: &str) -> Result<(), WriteError> {
    let value = crate::write_value(data).map_err(WriteError::NotWritable)?;
    tokio::time::timeout(WRITE_TIMEOUT, write_inner(session, node, value))
        .await
        .map_err(|_| WriteError::Unavailable("the OPC UA server did not answer in time".into()))?
}

async fn write_inner(session: &Session, node: &NodeId, value: serde_json::Value) -> Result<(), WriteError> {
    let reads = [AttributeId::DataType, AttributeId::ValueRank, AttributeId::Value]
        .map(|attr| ReadValueId::new(node.clone(), attr));
    let read = session
        .read(&reads, TimestampsToReturn::Neither, 0.0)
        .await
        .map_err(|e| WriteError::Unavailable(format!("read before write: {}", e.status())))?;
    let [data_type, rank, current] = <[DataValue; 3]>::try_from(read)
        .map_err(|_| WriteError::Unavailable("the server answered a read of 3 attributes with another count".into()))?;
    if let Some(status) = current.status.filter(|s| s.is_bad()) {
        if data_type.value.is_none() {
            return Err(WriteError::Refused(status.to_string()));
        }
    }
    let data_type = match data_type.value {
        Some(Variant::NodeId(id)) => Some(*id),
        _ => None,
    };
    let rank = match rank.value {
        Some(Variant::Int32(r)) => Some(r),
        _ => None,
    };
    let ty: WriteType = convert::write_type(data_type.as_ref(), rank, current.value.as_ref())
        .ok_or_else(|| WriteError::NotWritable("the node's data type is not a built-in type".into()))?;
    let variant = convert::to_variant(&value, ty).map_err(WriteError::NotWritable)?;
    let write = WriteValue {
        node_id: node.clone(),
        attribute_id: AttributeId::Value as u32,
        value: DataValue::value_only(variant),
        ..Default::default()
    };
    let results =
        session.write(&[write]).await.map_err(|e| WriteError::Unavailable(format!("write: {}", e.status())))?;
    match results.first() {
        Some(s) if s.is_good() => Ok(()),
        Some(s) => Err(WriteError::Refused(s.to_string())),
        None => Err(WriteError::Unavailable("the server answered the write without a result".into())),
    }
}

/// Parses a `nodes` entry (`ns=2;s=Line1.Temp`, `i=2258`, …).
pub fn parse_node(text: &str) -> Result<NodeId, String> {
    NodeId::from_str(text).map_err(|_| format!("{text:?} is not an OPC UA node id (e.g. ns=2;s=Line1.Temp)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcua_decode_limits_cover_every_message_the_client_takes() {
        for max in [64 * 1024, 1 << 20, 16 << 20, 100_000_000] {
            let (chunks, limit) = decode_limits(max);
            // The library takes up to chunks + 1 chunks of CHUNK bytes: no string, byte string
            // or array inside such a message is longer than the limit.
            assert!(limit >= (chunks + 1) * CHUNK, "{max}");
            assert!(chunks * CHUNK <= max.max(CHUNK), "{max}: {chunks} chunks");
        }
    }
}
