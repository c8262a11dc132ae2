//! The application's controls over live connections, cluster-wide: `POST /api/disconnect`
//! closes every connection of a user (4003, no reconnect) and `POST /api/revoke` revokes tokens
//! (refused from then on, live connections using them closed with 4001 `token revoked`).
//!
//! The node that takes the request acts on its own connections at once and passes the request
//! on through the broker's pub/sub to every other node, on two internal channels
//! ([`crate::hub::InternalHandler`]): [`DISCONNECTS`] and [`REVOCATIONS`]. A revocation is
//! also recorded first in the broker's record set of the same name (`switchboard_broker::
//! records`): one entry per token or user, kept until the entry's own expiry, at most
//! [`MAX_REVOCATIONS`] — which is how a node that starts at any later time learns exactly the
//! revocations that still hold: it reads the set once it is subscribed. Only nodes publish on
//! `$` channels or write record sets, so every message there is trusted.
//!
//! [`owners::Owners`] is the node's record of who each connection is (user, token `jti` and
//! `iat`), set by the session whenever its identity changes.

pub mod owners;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use switchboard_broker::{BrokerError, Data, HistoryPolicy, Record, RecordPut};
use switchboard_protocol::code::{self, close};

use crate::auth::revoke::{AddError, Revocation, MAX_REVOCATIONS};
use crate::hub::InternalHandler;
use crate::node::{ApiError, Node};

/// Disconnect requests between nodes: `{"node", "user"}`.
pub const DISCONNECTS: &str = "$disconnect";
/// Revocations between nodes, `{"node", "revocation"}`; also the name of their record set
/// (values: the revocation).
pub const REVOCATIONS: &str = "$revoke";
/// Pause before subscribing again after the broker refused.
const RETRY: Duration = Duration::from_secs(1);

#[derive(Serialize, Deserialize)]
struct DisconnectMsg {
    node: String,
    user: String,
}

#[derive(Serialize, Deserialize)]
struct RevokeMsg {
    node: String,
    revocation: Revocation,
}

fn in_cluster(node: &Node) -> bool {
    node.broker.kind() != "memory"
}

/// Closes this node's connections of `user` with 4003; returns how many.
fn disconnect_here(node: &Node, user: &str) -> usize {
    let ids = node.owners.matching(|o| o.user == user);
    for id in &ids {
        if let Some(ob) = node.outbox(*id) {
            ob.close(close::FORBIDDEN, "disconnected by the application", true);
        }
    }
    node.owners.counts.disconnected.fetch_add(ids.len() as u64, Relaxed);
    ids.len()
}

/// Adds a revocation here and closes this node's connections whose tokens it matches (4001).
fn revoke_here(node: &Node, r: &Revocation, now: u64) -> Result<usize, AddError> {
    node.config.security.auth.revoked.add(r, now)?;
    let ids = node.owners.matching(|o| o.token && r.matches(&o.user, o.jti.as_deref(), o.iat));
    for id in &ids {
        if let Some(ob) = node.outbox(*id) {
            ob.close(close::INVALID_TOKEN, "token revoked", true);
        }
    }
    node.owners.counts.revoked.fetch_add(ids.len() as u64, Relaxed);
    Ok(ids.len())
}

/// `POST /api/disconnect`: closes `user`'s connections here, and on the other nodes through
/// the broker. Returns how many closed here. An unknown user is not an error (nothing closes).
pub async fn disconnect(node: &Node, user: &str) -> Result<usize, ApiError> {
    if user.is_empty() || user.len() > 256 {
        return Err(ApiError::new(code::BAD_REQUEST, "user must be 1 to 256 characters"));
    }
    let here = disconnect_here(node, user);
    if in_cluster(node) {
        let msg = DisconnectMsg { node: node.id.clone(), user: user.to_string() };
        publish(node, DISCONNECTS, &msg, no_history()).await.map_err(|e| not_passed_on(node, e))?;
    }
    Ok(here)
}

/// `POST /api/revoke`: records the revocation in the broker's record set (in a cluster), here,
/// and on every other node; closes matching connections. A jti entry without `expire_at` is
/// given one (`revocation_keep_s` from now), so that every node keeps it equally long.
pub async fn revoke(node: &Node, r: &Revocation) -> Result<usize, ApiError> {
    r.check().map_err(|e| ApiError::new(code::BAD_REQUEST, e))?;
    let now = crate::unix_s();
    let keep = node.config.security.auth.revoked.keep_s();
    r.check_bounds(now, keep).map_err(|e| ApiError::new(code::BAD_REQUEST, e))?;
    let mut r = r.clone();
    if r.jti.is_some() {
        r.expire_at = Some(r.expires(now, keep));
    }
    if r.expires(now, keep) <= now {
        return Ok(0); // matches no token that could still be used
    }
    if in_cluster(node) {
        // Recorded before anything is acted on: a node starting from now on reads it.
        let value = serde_json::to_string(&r).map_err(|e| ApiError::new(code::INTERNAL, e.to_string()))?;
        let expires_ms = r.expires(now, keep).saturating_mul(1000);
        let entry = Record { key: r.record_key(), value, expires_ms };
        match node.broker.record_put(REVOCATIONS, &entry, now * 1000, MAX_REVOCATIONS).await {
            Ok(RecordPut::Full { frees_ms }) => return Err(full((frees_ms / 1000).saturating_sub(now))),
            Ok(RecordPut::Stored | RecordPut::Kept) => {}
            Err(e) => {
                return Err(node.broker_error_after("not recorded, nothing revoked", e));
            }
        }
    }
    let here = revoke_here(node, &r, now).map_err(|AddError::Full { frees_at }| full(frees_at.saturating_sub(now)))?;
    if in_cluster(node) {
        let msg = RevokeMsg { node: node.id.clone(), revocation: r };
        publish(node, REVOCATIONS, &msg, no_history()).await.map_err(|e| not_passed_on(node, e))?;
    }
    Ok(here)
}

/// The 429 of a full revocation list; the soonest entry leaves in `wait_s`.
fn full(wait_s: u64) -> ApiError {
    let message = format!(
        "the revocation list holds its maximum of {MAX_REVOCATIONS} entries that still hold; the soonest \
         leaves in {wait_s} s"
    );
    ApiError::new(code::LIMIT, message).retry_after(wait_s)
}

fn not_passed_on(node: &Node, e: BrokerError) -> ApiError {
    node.broker_error_after("done on this node only, not passed on to the others", e)
}

fn no_history() -> HistoryPolicy {
    HistoryPolicy { size: 0, ttl: Duration::ZERO, trend: None }
}

async fn publish(node: &Node, channel: &str, body: &impl Serialize, policy: HistoryPolicy) -> Result<(), BrokerError> {
    let text = serde_json::to_string(body).map_err(|e| BrokerError::Unavailable(e.to_string()))?;
    let data = RawValue::from_string(text).map_err(|e| BrokerError::Unavailable(e.to_string()))?;
    node.broker.publish(channel, Arc::new(data), policy).await.map(drop)
}

/// In a cluster: takes the other nodes' disconnects and revocations, and loads the recorded
/// revocations once subscribed. Supervised (task `control-listener`).
pub fn start(node: &Arc<Node>) {
    if !in_cluster(node) {
        return;
    }
    let internal = Arc::new(Internal(Arc::downgrade(node)));
    node.hub.add_internal(DISCONNECTS, internal.clone());
    node.hub.add_internal(REVOCATIONS, internal);
    let node = Arc::downgrade(node);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    switchboard_supervisor::spawn("control-listener", move |_| listen(node.clone(), done.clone()));
}

async fn listen(node: Weak<Node>, done: Arc<std::sync::atomic::AtomicBool>) {
    while !done.load(Relaxed) {
        let Some(n) = node.upgrade() else { return };
        match subscribe_and_load(&n).await {
            Ok(loaded) => {
                tracing::info!(revocations = loaded, "taking disconnects and revocations from the other nodes");
                done.store(true, Relaxed);
            }
            Err(e) => {
                tracing::warn!("cannot take disconnects and revocations from the other nodes yet: {e}");
                drop(n);
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

async fn subscribe_and_load(node: &Node) -> Result<usize, BrokerError> {
    node.broker.subscribe(DISCONNECTS).await?;
    node.broker.subscribe(REVOCATIONS).await?;
    let now = crate::unix_s();
    let recorded = node.broker.records(REVOCATIONS, now * 1000).await?;
    let mut loaded = 0;
    for rec in recorded {
        match serde_json::from_str::<Revocation>(&rec.value) {
            Ok(r) if r.check().is_ok() && revoke_here(node, &r, now).is_ok() => loaded += 1,
            _ => tracing::warn!(key = ?rec.key, "a recorded revocation was not taken (invalid, or the list is full)"),
        }
    }
    Ok(loaded)
}

/// Receives the other nodes' disconnects and revocations. Holds the node weakly: the node owns
/// its hub. Called under the broker's channel lock: closing outboxes only queues and wakes.
struct Internal(Weak<Node>);

impl InternalHandler for Internal {
    fn on_internal(&self, channel: &str, data: &Data) {
        let Some(node) = self.0.upgrade() else { return };
        if channel == DISCONNECTS {
            match serde_json::from_str::<DisconnectMsg>(data.get()) {
                Ok(m) if m.node != node.id => drop(disconnect_here(&node, &m.user)),
                Ok(_) => {}
                Err(e) => tracing::warn!(channel, "malformed disconnect from another node: {e}"),
            }
        } else if channel == REVOCATIONS {
            match serde_json::from_str::<RevokeMsg>(data.get()) {
                Ok(m) if m.node != node.id => {
                    if m.revocation.check().is_err() || revoke_here(&node, &m.revocation, crate::unix_s()).is_err() {
                        tracing::warn!(
                            "a revocation from node {} was not taken (invalid, or the list is full)",
                            m.node
                        );
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(channel, "malformed revocation from another node: {e}"),
            }
        }
    }
}
