//! What the HTTP transports (SSE, long-polling) share: admission of a request by the same rules
//! as a WebSocket handshake, CORS headers for pages on allowed origins, and error responses in
//! the SPEC's `{"error": {"code", "message"}}` form.
//!
//! Admission, cheapest first (docs/security.md): requests per second per client address (the
//! handshake rate; 429), the `Origin` allow-list (403), then credentials — `Authorization`
//! (Bearer or Basic) or the `token` query parameter. Unlike a WebSocket, an HTTP response can
//! carry its status, so refused credentials are a plain 401 here.

// Refusals are the response itself (status, body, headers), returned on the cold path of a
// request that answers with it anyway; boxing them would buy nothing.
#![allow(clippy::result_large_err)]

use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use switchboard_protocol::code;

use crate::auth::credentials::{parse_authorization, percent_decode, token_from_query};
use crate::auth::limits::{Admission, IpGuard};
use crate::auth::{AuthFailure, Identity};
use crate::node::{ApiError, Node};

/// The TCP peer of a request (a proxy's address when there is one in front), attached by
/// `transport::conn`.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub std::net::SocketAddr);

/// Who is asking, once admitted.
pub struct Admitted {
    /// `None`: no credentials presented (or none needed: the node has no authentication).
    pub identity: Option<Identity>,
    /// The client address, unless it is exempt from the per-address limits.
    pub limited_ip: Option<IpAddr>,
}

impl Admitted {
    /// Whether the client skips the per-connection rate limits.
    pub fn exempt(&self) -> bool {
        self.limited_ip.is_none()
    }
}

fn header_str(h: &HeaderMap, name: impl header::AsHeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// An error response with the SPEC body ([`ApiError`]'s: a 429 carries `Retry-After`).
pub fn error(code: u16, message: impl Into<String>) -> Response {
    let mut r = ApiError::new(code, message).into_response();
    if code == code::UNAUTHORIZED {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"switchboard\""));
    }
    r
}

/// The answer to an HTTP stream or session the node would not register (`Node::register_*`):
/// 503 while the node shuts down, else the connection limit.
pub fn not_registered(refused: &crate::outbox::Outbox) -> Response {
    match refused.closed() {
        Some(switchboard_protocol::code::close::SHUTDOWN) => error(503, "server shutting down"),
        _ => error(code::LIMIT, "too many connections"),
    }
}

/// Admits a request that opens a stream or a session: rate, origin, credentials.
/// `counts_as_handshake`: it opens something (an SSE stream, a poll session) rather than
/// continuing one, so it is counted against `limits.handshakes_per_ip_per_s`.
pub async fn admit(
    node: &Node,
    headers: &HeaderMap,
    peer: Option<&Peer>,
    query: Option<&str>,
    counts_as_handshake: bool,
) -> Result<Admitted, Response> {
    let auth = &node.config.security.auth;
    let ip = peer
        .map(|p| auth.client_ip(p.0.ip(), header_str(headers, "x-forwarded-for"), header_str(headers, "x-real-ip")));
    let limited_ip = ip.filter(|ip| !auth.is_exempt(*ip));
    if let (Some(ip), true) = (limited_ip, counts_as_handshake) {
        if auth.limiter.admit_handshake(ip) == Admission::RateLimited {
            node.metrics.rejected_connections.fetch_add(1, Relaxed);
            return Err(error(code::LIMIT, "too many requests from this address; retry later"));
        }
    }
    if !auth.origin_allowed(header_str(headers, header::ORIGIN), header_str(headers, header::HOST)) {
        node.metrics.rejected_connections.fetch_add(1, Relaxed);
        return Err(error(code::FORBIDDEN, "origin not allowed"));
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .map(|v| parse_authorization(v.as_bytes()))
        .or_else(|| query.and_then(token_from_query));
    let identity = match presented {
        // Without authentication configured, credentials are not needed and not checked.
        _ if !auth.enabled() => None,
        None => None,
        Some(Err(e)) => return Err(refused(AuthFailure::from(e))),
        // Password checks are charged to the client's address, as on a WebSocket handshake.
        Some(Ok(c)) => Some(auth.authenticate_from(c, limited_ip).await.map_err(refused)?),
    };
    Ok(Admitted { identity, limited_ip })
}

fn refused(e: AuthFailure) -> Response {
    tracing::debug!(reason = %e, "HTTP transport credentials refused");
    match e {
        AuthFailure::RateLimited => error(code::LIMIT, e.to_string()),
        _ => error(code::UNAUTHORIZED, e.to_string()),
    }
}

/// Takes a connection slot of the client's address (429 when it has none left).
pub fn acquire_slot(node: &Node, admitted: &Admitted) -> Result<Option<IpGuard>, Response> {
    match admitted.limited_ip {
        None => Ok(None),
        Some(ip) => match node.config.security.auth.limiter.acquire(ip) {
            Some(g) => Ok(Some(g)),
            None => {
                node.metrics.rejected_connections.fetch_add(1, Relaxed);
                Err(error(code::LIMIT, "too many connections from this address"))
            }
        },
    }
}

/// Adds CORS headers for a browser page on another, allowed origin (same-origin pages need
/// none; a refused origin never gets this far).
pub fn cors(headers: &HeaderMap, node: &Node, r: &mut Response) {
    let Some(origin) = headers.get(header::ORIGIN) else { return };
    let auth = &node.config.security.auth;
    let (Ok(o), host) = (origin.to_str(), header_str(headers, header::HOST)) else { return };
    if !auth.origin_allowed(Some(o), host) {
        return;
    }
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    h.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
    h.append(header::VARY, HeaderValue::from_static("Origin"));
}

/// `OPTIONS` preflight of the HTTP transports: allowed origins may send `Authorization` and
/// JSON bodies.
pub async fn preflight(
    axum::extract::State(node): axum::extract::State<std::sync::Arc<Node>>,
    headers: HeaderMap,
) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::NO_CONTENT;
    cors(&headers, &node, &mut r);
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, DELETE, OPTIONS"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type, last-event-id"),
    );
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    r
}

/// The value of `key` in a query string, percent-decoded (`None` when absent or undecodable).
pub fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then(|| percent_decode(v)).flatten()
    })
}

/// Whether a boolean query parameter is set (`1`, `true`, `yes`, or present without value).
pub fn query_flag(query: Option<&str>, key: &str) -> Option<bool> {
    let v = query_param(query, key)?;
    Some(matches!(v.as_str(), "" | "1" | "true" | "yes" | "on"))
}
