//! `GET /api/writes?limit=`: the write audit of this node (`crate::sources::audit`), newest
//! first. Read with an API key: when authentication is on, a request without credentials is
//! 401 (the guard) and one with a token or a password 403 — the audit names every operator's
//! writes, which is an administrator's view.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use switchboard_protocol::code;

use super::query::Query;
use super::{who, CallerExt};
use crate::auth::Method;
use crate::node::{ApiError, Node};
use crate::sources::audit::CAPACITY;

/// Entries per answer unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 100;

#[derive(Deserialize)]
pub(super) struct WritesQuery {
    limit: Option<usize>,
}

pub(super) async fn list(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    Query(q): Query<WritesQuery>,
) -> Result<Response, ApiError> {
    match who(&caller).method {
        Method::ApiKey(_) => {}
        // No credentials configured: the API is open, as for publishing.
        Method::Anonymous if !node.config.security.auth.http_enabled() => {}
        _ => return Err(ApiError::new(code::FORBIDDEN, "the write audit is read with an API key")),
    }
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=CAPACITY).contains(&limit) {
        return Err(ApiError::new(code::BAD_REQUEST, format!("limit: between 1 and {CAPACITY}")));
    }
    let writes = node.writes.newest(limit);
    Ok(Json(serde_json::json!({ "writes": writes, "capacity": CAPACITY })).into_response())
}
