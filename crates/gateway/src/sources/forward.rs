//! Write-back in a cluster: a write that reaches a node which does not run its source (another
//! node holds the lease) is forwarded over the broker's pub/sub to the node that does, which
//! writes and sends the device's answer back. Nodes share nothing but the broker, so both legs
//! are internal channels ([`crate::hub::InternalHandler`]):
//!
//! - `$write:<source>` carries requests `{"id", "node", "channel", "data"}`. The node running
//!   the source subscribes to it while the source runs there ([`listen`]).
//! - `$reply:<node id>` carries answers `{"id", "error": null | {"code", "message"}}`. Each
//!   node subscribes to its own on its first forwarded write and keeps it.
//!
//! Both are published without history or trend, are never listed, and their keys expire one
//! to two [`crate::config::INTERNAL_CHANNEL_TTL_S`] after their last use. What the node keeps
//! of its forwarded writes (waiting writes, counters) is [`pending::Pending`].
//!
//! Trust: the caller's node checked the permission, as for a local write; the node running the
//! source takes any request on `$write:` since only nodes can publish on `$` channels (no
//! client path accepts a channel name with `$`). During a lease move two nodes may both be
//! subscribed for a moment: only the one the source runs on writes and answers (the source's
//! write queue exists on one node at most), the other stays silent.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use switchboard_broker::{BrokerError, Data, HistoryPolicy};
use switchboard_protocol::code;
use switchboard_sources::{Sources, WriteError, WRITE_WAIT};
use tokio::sync::watch;

use crate::hub::InternalHandler;
use crate::node::{ApiError, Node};

pub mod pending;

const REQUESTS: &str = "$write:";
const REPLIES: &str = "$reply:";
/// How long a forwarded write waits for its answer: the source's own write wait on the other
/// node, plus the broker's two legs.
pub const FORWARD_WAIT: Duration = Duration::from_secs(WRITE_WAIT.as_secs() + 2);
/// Pause before subscribing again to a source's requests after the broker refused.
const RETRY: Duration = Duration::from_secs(1);
/// Requests and replies are messages, not data: nothing is kept.
const NO_HISTORY: HistoryPolicy = HistoryPolicy { size: 0, ttl: Duration::ZERO, trend: None };

#[derive(Serialize, Deserialize)]
struct Request {
    id: u64,
    /// The node waiting for the answer.
    node: String,
    channel: String,
    data: Box<RawValue>,
}

#[derive(Serialize, Deserialize)]
struct Reply {
    id: u64,
    /// `None`: written.
    #[serde(default)]
    error: Option<ApiErrorBody>,
}

#[derive(Serialize, Deserialize)]
struct ApiErrorBody {
    code: u16,
    message: String,
}

/// Whether writes are forwarded: only with a broker shared by several nodes. With the memory
/// broker every lease is granted, so a source that does not run here runs nowhere.
pub(super) fn in_cluster(node: &Node) -> bool {
    node.broker.kind() != "memory"
}

/// Starts forwarding for a cluster node: internal channels reach this node's handler, and one
/// task per source that a namespace writes to keeps it subscribed to that source's requests
/// while the source runs here.
pub(super) fn start(node: &Arc<Node>, sources: &Sources) {
    if !in_cluster(node) {
        return;
    }
    let internal = Arc::new(Internal(Arc::downgrade(node)));
    node.hub.add_internal(REQUESTS, internal.clone());
    node.hub.add_internal(REPLIES, internal);
    for source in super::written_sources(node) {
        let (node, source, active) = (Arc::downgrade(node), source.to_string(), sources.watch_active(source));
        // Whether the broker counts this node's subscription survives a restart of the task.
        let subscribed = Arc::new(AtomicBool::new(false));
        switchboard_supervisor::spawn("write-forwarder", move |_| {
            listen(node.clone(), source.clone(), active.clone(), subscribed.clone())
        });
    }
}

/// Keeps this node subscribed to `$write:<source>` exactly while `source` runs here; ends with
/// the node. Supervised (task `write-forwarder`).
async fn listen(node: Weak<Node>, source: String, mut active: watch::Receiver<bool>, subscribed: Arc<AtomicBool>) {
    let channel = format!("{REQUESTS}{source}");
    loop {
        let subscribed_now = subscribed.load(Relaxed);
        let wanted = *active.borrow_and_update();
        if wanted == subscribed_now {
            if active.changed().await.is_err() {
                return;
            }
            continue;
        }
        let Some(n) = node.upgrade() else { return };
        if wanted {
            match n.broker.subscribe(&channel).await {
                Ok(()) => subscribed.store(true, Relaxed),
                Err(e) => tracing::warn!(source = %source, "cannot take forwarded writes yet: {e}"),
            }
        } else {
            let _ = n.broker.unsubscribe(&channel).await;
            subscribed.store(false, Relaxed);
        }
        drop(n);
        if wanted != subscribed.load(Relaxed) {
            tokio::select! {
                _ = tokio::time::sleep(RETRY) => {}
                r = active.changed() => if r.is_err() { return },
            }
        }
    }
}

/// Forwards a permitted write to the node that runs `source` and waits for its answer: what
/// that node's write returned, or 503 when no node answered within [`FORWARD_WAIT`].
pub(super) async fn send(node: &Node, source: &str, channel: &str, data: Data) -> Result<(), ApiError> {
    let pending = &node.forwarded;
    let unavailable = |why: String| ApiError::new(code::UNAVAILABLE, why);
    let not_forwarded = |e: BrokerError| {
        let done = format!("source {source} runs on another node and the write could not be forwarded");
        unavailable(node.broker_error_after(&done, e).message)
    };
    let reply_channel = format!("{REPLIES}{}", node.id);
    pending.replies.get_or_try_init(|| node.broker.subscribe(&reply_channel)).await.map_err(not_forwarded)?;
    let mut waiting = pending.add().ok_or_else(|| {
        unavailable(format!(
            "source {source} runs on another node and {} forwarded writes already wait for it",
            pending::MAX_WAITING
        ))
    })?;
    let request =
        Request { id: waiting.id, node: node.id.clone(), channel: channel.to_string(), data: (*data).clone() };
    publish(node, &format!("{REQUESTS}{source}"), &request).await.map_err(not_forwarded)?;
    pending.sent.fetch_add(1, Relaxed);
    match tokio::time::timeout(FORWARD_WAIT, &mut waiting.answer).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) | Err(_) => {
            pending.timed_out.fetch_add(1, Relaxed);
            Err(unavailable(format!(
                "source {source} runs on another node of the cluster, which did not answer the forwarded write \
                 within {} s",
                FORWARD_WAIT.as_secs()
            )))
        }
    }
}

/// Receives this node's internal channels: requests for the sources it runs, answers to the
/// writes it forwarded. Holds the node weakly: the node owns its hub.
struct Internal(Weak<Node>);

impl InternalHandler for Internal {
    fn on_internal(&self, channel: &str, data: &Data) {
        let Some(node) = self.0.upgrade() else { return };
        if let Some(source) = channel.strip_prefix(REQUESTS) {
            match serde_json::from_str::<Request>(data.get()) {
                // Called under the broker's channel lock: the write runs in a task of its own.
                Ok(request) => match tokio::runtime::Handle::try_current() {
                    Ok(rt) => drop(rt.spawn(serve(node, source.to_string(), request))),
                    Err(_) => tracing::warn!(source, "forwarded write outside a runtime; dropped"),
                },
                Err(e) => tracing::warn!(channel, "malformed forwarded write: {e}"),
            }
        } else if channel.strip_prefix(REPLIES) == Some(node.id.as_str()) {
            match serde_json::from_str::<Reply>(data.get()) {
                Ok(reply) => {
                    let answer = reply.error.map_or(Ok(()), |e| Err(ApiError::new(e.code, e.message)));
                    node.forwarded.answer(reply.id, answer);
                }
                Err(e) => tracing::warn!(channel, "malformed answer to a forwarded write: {e}"),
            }
        }
    }
}

/// Makes a forwarded write if `source` runs here, and answers the node that forwarded it. The
/// data passes the checks of every publication ([`Node::check_publication`]) here as well: the
/// node that runs the source is the one whose limits the device is set up with.
async fn serve(node: Arc<Node>, source: String, request: Request) {
    let Some(sources) = node.sources.get() else { return };
    let result = if super::write_source(&node, &request.channel) != Some(source.as_str()) {
        // The nodes' configurations differ.
        Err(super::api_error(WriteError::NotWritable(format!(
            "channel {} is not written to source {source} on the node that runs it",
            request.channel
        ))))
    } else {
        let checked =
            node.target(&request.channel).and_then(|t| node.check_publication(t, Arc::new(request.data), None, None));
        match checked {
            Ok(checked) => match sources.write(&source, checked.channel(), checked.data().clone()).await {
                // Not (or no longer) here: the node it runs on answers.
                Err(WriteError::NotHere(_)) => return,
                r => r.map_err(super::api_error),
            },
            Err(e) => Err(e),
        }
    };
    let error = result.err().map(|e| ApiErrorBody { code: e.code, message: e.message });
    node.forwarded.served.fetch_add(1, Relaxed);
    let reply = Reply { id: request.id, error };
    if let Err(e) = publish(&node, &format!("{REPLIES}{}", request.node), &reply).await {
        tracing::warn!(source = %source, node = %request.node, "answer to a forwarded write not sent: {e}");
    }
}

async fn publish(node: &Node, channel: &str, body: &impl Serialize) -> Result<(), BrokerError> {
    let text = serde_json::to_string(body).map_err(|e| BrokerError::Unavailable(e.to_string()))?;
    let data = RawValue::from_string(text).map_err(|e| BrokerError::Unavailable(e.to_string()))?;
    node.broker.publish(channel, Arc::new(data), NO_HISTORY).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_requests_keep_their_data_verbatim() {
        let data = RawValue::from_string(r#"{"v": 43, "q":"good"}"#.into()).unwrap();
        let r = Request { id: 1, node: "n1".into(), channel: "pt:a.b".into(), data };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"id":1,"node":"n1","channel":"pt:a.b","data":{"v": 43, "q":"good"}}"#);
        let back: Request = serde_json::from_str(&text).unwrap();
        assert_eq!(back.data.get(), r#"{"v": 43, "q":"good"}"#);
    }
}
