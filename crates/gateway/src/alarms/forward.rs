//! Alarms in a cluster: an operator's action that reaches a node which does not evaluate the
//! alarms is sent to the one that does, and definition changes reach every node. Nodes share
//! nothing but the broker, so each leg is an internal channel
//! ([`crate::hub::InternalHandler`]), published without history:
//!
//! - `$alarm-act` carries actions `{"id", "node", "alarm", "act", "until_ms", "user",
//!   "comment"}`; every node listens, only the holder of the alarms answers.
//! - `$alarm-reply:<node id>` carries answers `{"id", "ok": state}` or `{"id", "error"}`.
//! - `$alarm-defs` says that the definitions changed: every node reads them again.
//!
//! The node that received the action checked the caller's permission; the holder trusts
//! `$` channels, which only nodes can publish on. Each node also follows `alarm:all`, which
//! keeps its view of the states current.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use switchboard_broker::{BrokerError, Data, HistoryPolicy};
use switchboard_protocol::code;
use tokio::sync::oneshot;

use super::state::{Act, Status};
use super::Alarms;
use crate::hub::InternalHandler;
use crate::node::{ApiError, Node};

const ACTS: &str = "$alarm-act";
const REPLIES: &str = "$alarm-reply:";
const DEFS_CHANGED: &str = "$alarm-defs";
/// How long a forwarded action waits for the holder's answer.
const WAIT: Duration = Duration::from_secs(5);
/// Actions one node waits for at most; more are answered 503.
const MAX_WAITING: usize = 1024;
const NO_HISTORY: HistoryPolicy = HistoryPolicy { size: 0, ttl: Duration::ZERO, trend: None };

use super::engine::Answer;

#[derive(Serialize, Deserialize)]
struct Request {
    id: u64,
    node: String,
    alarm: String,
    act: String,
    #[serde(default)]
    until_ms: u64,
    user: String,
    comment: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Reply {
    id: u64,
    #[serde(default)]
    ok: Option<Status>,
    #[serde(default)]
    error: Option<(u16, String)>,
}

/// Subscribes this node to the alarms' channels between nodes and to `alarm:all`.
pub(super) fn start(node: &Arc<Node>, alarms: &Arc<Alarms>) {
    let internal = Arc::new(Internal(Arc::downgrade(node)));
    node.hub.add_internal(ACTS, internal.clone());
    node.hub.add_internal(REPLIES, internal.clone());
    node.hub.add_internal(DEFS_CHANGED, internal);
    if node.broker.kind() == "memory" {
        // One node: nothing to follow, and the memory broker hands it every publication
        // without a subscription (which would take channels from `limits.max_channels`).
        return;
    }
    let (node, _alarms) = (node.clone(), alarms.clone());
    tokio::spawn(async move {
        let own = format!("{REPLIES}{}", node.id);
        for ch in [ACTS, DEFS_CHANGED, own.as_str()] {
            while let Err(e) = node.broker.subscribe(ch).await {
                super::warn(&node, "follow the alarms of the cluster", &e.to_string());
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });
}

async fn publish<T: Serialize>(node: &Node, channel: &str, body: &T) -> Result<(), BrokerError> {
    let text = serde_json::to_string(body).map_err(|e| BrokerError::Unavailable(e.to_string()))?;
    let data: Data = Arc::new(RawValue::from_string(text).map_err(|e| BrokerError::Unavailable(e.to_string()))?);
    node.broker.publish(channel, data, NO_HISTORY).await.map(drop)
}

/// Follows `alarm:all` (the view's updates) once the cluster has any definition, so that a
/// cluster without alarms holds no alarm channel.
pub(super) async fn follow_all(alarms: &Alarms, node: &Node) {
    if node.broker.kind() == "memory" || alarms.defs().all.is_empty() || alarms.following_all.swap(true, Relaxed) {
        return;
    }
    if let Err(e) = node.broker.subscribe(super::engine::ALL).await {
        alarms.following_all.store(false, Relaxed);
        super::warn(node, "follow alarm:all", &e.to_string());
    }
}

/// Tells every node that the definitions changed (this one reads them at once).
pub(super) async fn defs_changed(node: &Arc<Node>) {
    if let Some(alarms) = node.alarms.get() {
        super::reload_defs(alarms, node).await;
    }
    if let Err(e) = publish(node, DEFS_CHANGED, &serde_json::json!({"node": node.id})).await {
        super::warn(node, "tell the cluster of a definition change", &e.to_string());
    }
}

/// Sends an action to the node that evaluates the alarms and waits for its answer.
pub(super) async fn send(node: &Node, alarm: &str, act: &Act, user: &str, comment: Option<String>) -> Answer {
    let alarms = node.alarms.get().ok_or_else(|| ApiError::new(code::UNAVAILABLE, "alarms are not running"))?;
    let unavailable = |why: &str| ApiError::new(code::UNAVAILABLE, why);
    let (tx, rx) = oneshot::channel();
    let id = alarms.waiting.next.fetch_add(1, Relaxed);
    {
        let mut by_id = alarms.waiting.by_id.lock();
        if by_id.len() >= MAX_WAITING {
            return Err(unavailable("too many alarm actions wait for the node that evaluates the alarms"));
        }
        by_id.insert(id, tx);
    }
    let (name, until_ms) = match act {
        Act::Ack => ("ack", 0),
        Act::Shelve { until_ms } => ("shelve", *until_ms),
        Act::Unshelve => ("unshelve", 0),
    };
    let request = Request {
        id,
        node: node.id.clone(),
        alarm: alarm.to_string(),
        act: name.into(),
        until_ms,
        user: user.to_string(),
        comment,
    };
    let sent = publish(node, ACTS, &request).await;
    let answer = match sent {
        Ok(()) => tokio::time::timeout(WAIT, rx).await.ok().and_then(Result::ok),
        Err(e) => Some(Err(node.broker_error(e))),
    };
    alarms.waiting.by_id.lock().remove(&id);
    answer.unwrap_or_else(|| Err(unavailable("no node that evaluates the alarms answered in time; try again")))
}

struct Internal(Weak<Node>);

impl InternalHandler for Internal {
    fn on_internal(&self, channel: &str, data: &Data) {
        let Some(node) = self.0.upgrade() else { return };
        let Some(alarms) = node.alarms.get().cloned() else { return };
        // Called under the broker's channel lock: what needs the broker runs in a task.
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        if channel == DEFS_CHANGED {
            rt.spawn(async move { super::reload_defs(&alarms, &node).await });
        } else if channel == ACTS {
            if !alarms.holding.load(Relaxed) {
                return;
            }
            let Ok(r) = serde_json::from_str::<Request>(data.get()) else { return };
            rt.spawn(async move { serve(&alarms, &node, r).await });
        } else if channel.strip_prefix(REPLIES) == Some(node.id.as_str()) {
            let Ok(r) = serde_json::from_str::<Reply>(data.get()) else { return };
            let answer = match (r.ok, r.error) {
                (Some(s), _) => Ok(s),
                (None, Some((code, message))) => Err(ApiError::new(code, message)),
                (None, None) => Err(ApiError::new(code::INTERNAL, "empty answer")),
            };
            if let Some(tx) = alarms.waiting.by_id.lock().remove(&r.id) {
                let _ = tx.send(answer);
            }
        }
    }
}

async fn serve(alarms: &Alarms, node: &Node, r: Request) {
    let act = match r.act.as_str() {
        "ack" => Some(Act::Ack),
        "shelve" => Some(Act::Shelve { until_ms: r.until_ms }),
        "unshelve" => Some(Act::Unshelve),
        _ => None,
    };
    let answer = match act {
        Some(act) => super::act_here(alarms, &r.alarm, &act, &r.user, r.comment).await,
        None => Err(ApiError::new(code::BAD_REQUEST, format!("unknown alarm action {:?}", r.act))),
    };
    let reply = match answer {
        Ok(s) => Reply { id: r.id, ok: Some(s), error: None },
        Err(e) => Reply { id: r.id, ok: None, error: Some((e.code, e.message)) },
    };
    if let Err(e) = publish(node, &format!("{REPLIES}{}", r.node), &reply).await {
        super::warn(node, "answer a forwarded alarm action", &e.to_string());
    }
}
