//! `GET /api/sources`: the sources this node knows and how each is doing — whether it runs
//! here, is connected, and what waits in its backlog and for how long (docs/sources.md,
//! "Never lost"). Read with an API key, as the write audit is.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use switchboard_protocol::code;

use super::{who, CallerExt};
use crate::auth::Method;
use crate::node::{ApiError, Node};

pub(super) async fn list(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
) -> Result<Json<serde_json::Value>, ApiError> {
    match who(&caller).method {
        Method::ApiKey(_) => {}
        Method::Anonymous if !node.config.security.auth.http_enabled() => {}
        _ => return Err(ApiError::new(code::FORBIDDEN, "sources are read with an API key")),
    }
    let now = switchboard_broker::now_ms();
    let handles = node.sources.get().map(|s| s.handles()).unwrap_or_default();
    let sources: Vec<serde_json::Value> = handles
        .iter()
        .map(|h| {
            let s = &h.stats;
            let counts = |v: Vec<(&'static str, u64)>| v.into_iter().collect::<std::collections::BTreeMap<_, _>>();
            serde_json::json!({
                "name": h.name,
                "kind": h.kind,
                "active": s.active.load(Relaxed),
                "connected": s.connected.load(Relaxed),
                "messages": s.messages.load(Relaxed),
                "points": s.points.load(Relaxed),
                "backlog": s.backlog.load(Relaxed),
                "backlog_age_s": s.backlog_age_s(now),
                "refused": counts(s.refusals.list()),
                "dropped": counts(s.dropped.list()),
            })
        })
        .collect();
    Ok(Json(serde_json::json!({ "sources": sources })))
}
