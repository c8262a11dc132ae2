//! `POST /api/disconnect {"user"}` and `POST /api/revoke {"jti", "expire_at"}` /
//! `{"user", "issued_before"}` (`crate::control`): with an API key (a token or a password is
//! 403; without any credentials configured the API is open, as for publishing).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use switchboard_protocol::code;

use super::{who, CallerExt};
use crate::auth::revoke::Revocation;
use crate::auth::Method;
use crate::node::{ApiError, Node};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DisconnectBody {
    user: String,
}

pub(crate) fn api_key_only(node: &Node, caller: &CallerExt, what: &str) -> Result<(), ApiError> {
    match who(caller).method {
        Method::ApiKey(_) => Ok(()),
        Method::Anonymous if !node.config.security.auth.http_enabled() => Ok(()),
        _ => Err(ApiError::new(code::FORBIDDEN, format!("{what} takes an API key"))),
    }
}

fn body<'a, T: Deserialize<'a>>(bytes: &'a [u8], shape: &str) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::new(code::BAD_REQUEST, format!("expected {shape}: {e}")))
}

pub(super) async fn disconnect(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    bytes: Bytes,
) -> Result<Response, ApiError> {
    api_key_only(&node, &caller, "disconnect")?;
    let b: DisconnectBody = body(&bytes, "{\"user\": \"...\"}")?;
    let here = crate::control::disconnect(&node, &b.user).await?;
    Ok(Json(serde_json::json!({ "disconnected_here": here })).into_response())
}

pub(super) async fn revoke(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    bytes: Bytes,
) -> Result<Response, ApiError> {
    api_key_only(&node, &caller, "revoke")?;
    let r: Revocation = body(&bytes, "{\"jti\", \"expire_at\"} or {\"user\", \"issued_before\"}")?;
    let here = crate::control::revoke(&node, &r).await?;
    Ok(Json(serde_json::json!({ "closed_here": here })).into_response())
}
