//! Authentication for the HTTP API (SPEC §4: `Authorization: Bearer <api key or token>` when
//! authentication is on; Basic works too).
//!
//! [`guard`] runs in front of every route:
//! - a request whose `Host` is not one of this node's names is refused 403, whatever its
//!   route (WebSocket handshakes, SSE, long-polling, the API, the dashboard) but health,
//!   readiness and metrics: a page on a rebound name (DNS rebinding) reaches the node as
//!   same-origin, and only its `Host` gives it away ([`super::credentials::host_allowed`]);
//! - requests that change state (any method but GET / HEAD / OPTIONS) from a browser page of
//!   another origin are refused 403, so a web page cannot make a visitor's browser publish
//!   (cross-site request forgery with cached Basic credentials, or against a loopback node);
//! - under `/api/`, when authentication or API keys are configured, a request without valid
//!   credentials gets 401 and the caller's [`Identity`] is attached for the handlers.
//!
//! Health, readiness, metrics and the dashboard page stay open: they carry no channel data.
//! The handlers then ask [`allow`] / [`allow_publish`] per channel: API keys may do anything;
//! tokens and users follow the namespace permissions, and publish only where clients may. This
//! module decides permission only: a publication's channel name is checked before it is asked
//! ([`Node::target`]), its data after ([`Node::check_publication`]).
//! Every publisher with credentials has a publish rate: each API key its own, each user (token
//! `sub` or Basic user name) its own across all of its requests; past it an item gets 429.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use switchboard_protocol::{code, namespace_of};

use super::credentials::parse_authorization;
use super::{Action, Identity, Method as AuthMethod};
use crate::node::{ApiError, Node, Target};

/// The authenticated caller of an HTTP API request, attached by [`guard`].
#[derive(Debug, Clone)]
pub struct Caller(pub Identity);

fn error(status: StatusCode, message: &str) -> Response {
    let code = status.as_u16();
    let mut r = (status, Json(serde_json::json!({"error": {"code": code, "message": message}}))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"switchboard\""));
    }
    r
}

/// The middleware; see the module docs.
pub async fn guard(State(node): State<Arc<Node>>, mut req: Request, next: Next) -> Response {
    if let Some(refused) = refusal(&node, req.method(), req.uri().path(), req.headers()) {
        return refused;
    }
    let auth = node.config.security.auth.clone();
    if req.uri().path().starts_with("/api/") {
        let identity = if auth.http_enabled() {
            let presented = req.headers().get(header::AUTHORIZATION).map(|v| parse_authorization(v.as_bytes()));
            let verdict = match presented {
                None => {
                    return error(
                        StatusCode::UNAUTHORIZED,
                        "credentials required (Authorization: Bearer <api key or token>)",
                    )
                }
                Some(Err(e)) => Err(e.into()),
                Some(Ok(c)) => {
                    let ip = req.extensions().get::<crate::transport::http::Peer>().map(|p| {
                        let h = req.headers();
                        let header = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
                        auth.client_ip(p.0.ip(), header("x-forwarded-for"), header("x-real-ip"))
                    });
                    // Boxed: checking credentials may wait on a key set or a password hash, a
                    // large future that every request (most need no credentials) would carry.
                    Box::pin(auth.authenticate_http(c, ip.filter(|ip| !auth.is_exempt(*ip)))).await
                }
            };
            match verdict {
                Ok(identity) => identity,
                Err(super::AuthFailure::RateLimited) => {
                    let mut r = error(StatusCode::TOO_MANY_REQUESTS, &super::AuthFailure::RateLimited.to_string());
                    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    return r;
                }
                Err(e) => {
                    tracing::debug!(reason = %e, "HTTP API credentials refused");
                    return error(StatusCode::UNAUTHORIZED, &e.to_string());
                }
            }
        } else {
            Identity::anonymous()
        };
        req.extensions_mut().insert(Caller(identity));
    }
    next.run(req).await
}

/// The refusals every request gets before its route, whoever it is: a foreign `Host`, and a
/// state-changing request from another origin (see the module docs).
fn refusal(node: &Node, method: &Method, path: &str, headers: &axum::http::HeaderMap) -> Option<Response> {
    let auth = &node.config.security.auth;
    let open = matches!(path, "/healthz" | "/readyz" | "/metrics");
    let host = headers.get(header::HOST).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    if !open && !auth.host_allowed(host) {
        tracing::debug!(host = host.unwrap_or(""), "request for a foreign Host refused");
        return Some(error(
            StatusCode::FORBIDDEN,
            "host not allowed: this node answers only to its own address names (add the name to auth.hosts)",
        ));
    }
    if !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        if !auth.origin_allowed(origin, host) {
            return Some(error(StatusCode::FORBIDDEN, "origin not allowed"));
        }
    }
    None
}

fn identity(caller: &Option<axum::Extension<Caller>>) -> Identity {
    caller.as_ref().map(|c| c.0 .0.clone()).unwrap_or_else(Identity::anonymous)
}

/// Whether the caller may read `channel` (`Subscribe` for its last value, `History`,
/// `Presence`).
pub fn allow(
    node: &Node,
    caller: &Option<axum::Extension<Caller>>,
    action: Action,
    channel: &str,
) -> Result<(), ApiError> {
    let who = identity(caller);
    node.config.security.auth.check(&who, &node.config.namespace(namespace_of(channel)).allow, action, channel)
}

fn allow_publish_one(node: &Node, who: &Identity, target: Target<'_>) -> Result<(), ApiError> {
    let channel = target.channel();
    match who.method {
        // Server-side publishers: an API key, or anyone while the API is open (no auth
        // configured: a node on a trusted network, every permission granted).
        AuthMethod::ApiKey(_) => Ok(()),
        AuthMethod::Anonymous if !node.config.security.auth.http_enabled() => Ok(()),
        _ => {
            let ns = node.config.namespace(namespace_of(channel));
            if !ns.client_publish {
                return Err(ApiError::new(code::FORBIDDEN, "clients may not publish in this namespace"));
            }
            node.config.security.auth.check(who, &ns.allow, Action::Publish, channel)
        }
    }
}

/// Checks one HTTP publish to a valid channel ([`Node::target`]): permission, then the
/// caller's publish rate (429).
pub fn allow_publish(
    node: &Node,
    caller: &Option<axum::Extension<Caller>>,
    target: Target<'_>,
) -> Result<(), ApiError> {
    let who = identity(caller);
    allow_publish_one(node, &who, target)?;
    if take_publishes(node, &who, 1) == 0 {
        return Err(rate_limited(node, &who));
    }
    Ok(())
}

/// Takes up to `n` publish tokens of the caller's rate and returns how many were granted: its
/// API key's, or its user's (token `sub`, Basic user name). Anonymous callers exist only while
/// the API is open (no credentials configured) and are not limited here.
fn take_publishes(node: &Node, who: &Identity, n: usize) -> usize {
    let limiter = &node.config.security.auth.limiter;
    match who.method {
        AuthMethod::ApiKey(i) => limiter.take_api_key(i, n),
        AuthMethod::Token | AuthMethod::Password | AuthMethod::Hook => limiter.take_user(&who.user, n),
        AuthMethod::Anonymous => n,
    }
}

/// The 429 of a publish past the caller's rate, naming the limit and its setting.
fn rate_limited(node: &Node, who: &Identity) -> ApiError {
    let limits = &node.config.limits;
    let message = match who.method {
        AuthMethod::ApiKey(_) => format!(
            "more than {} publications per second with this API key (limits.publishes_per_api_key_per_s)",
            limits.publishes_per_api_key_per_s
        ),
        _ => format!(
            "more than {} publications per second by this user (limits.publishes_per_user_per_s)",
            limits.publishes_per_user_per_s
        ),
    };
    ApiError::new(code::LIMIT, message)
}

/// Whether the caller may publish to each of `targets`, in order: a target refused already
/// (an invalid channel name, [`Node::target`]) stays refused; 401 / 403 for a channel it may
/// not publish to, 429 for those past its rate (API key or user). A refusal costs no token of
/// the rate.
pub fn allow_publish_batch<'a>(
    node: &Node,
    caller: &Option<axum::Extension<Caller>>,
    targets: impl IntoIterator<Item = Result<Target<'a>, ApiError>>,
) -> Vec<Result<Target<'a>, ApiError>> {
    let who = identity(caller);
    let mut verdicts: Vec<Result<Target<'a>, ApiError>> =
        targets.into_iter().map(|t| t.and_then(|t| allow_publish_one(node, &who, t).map(|()| t))).collect();
    let wanted = verdicts.iter().filter(|v| v.is_ok()).count();
    let mut granted = take_publishes(node, &who, wanted);
    for v in verdicts.iter_mut().filter(|v| v.is_ok()) {
        if granted == 0 {
            *v = Err(rate_limited(node, &who));
        } else {
            granted -= 1;
        }
    }
    verdicts
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::Config;

    fn node() -> Arc<Node> {
        let env = [
            ("SWITCHBOARD_JWT_SECRET", "http-auth-test-secret-0123456789abcdef"),
            ("SWITCHBOARD_API_KEYS", &super::super::apikey::hash_key("http-auth-test-api-key-0123456789")),
            ("SWITCHBOARD_PUBLISHES_PER_USER_PER_S", "3"),
            ("SWITCHBOARD_PUBLISHES_PER_API_KEY_PER_S", "3"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let config = Config::load(None, env, &[]).unwrap();
        Node::new(config, Arc::new(switchboard_broker::MemoryBroker::new()))
    }

    fn caller(method: AuthMethod, user: &str) -> Option<axum::Extension<Caller>> {
        let who = Identity { method, user: user.into(), ..Identity::anonymous() };
        Some(axum::Extension(Caller(who)))
    }

    #[test]
    fn auth_http_users_have_a_publish_rate_of_their_own() {
        let node = node();
        let alice = caller(AuthMethod::Token, "alice");
        let (room, nope) = (node.target("room:1").unwrap(), node.target("nope:1").unwrap());
        // Six (twice the rate) pass, then 429 naming the setting.
        let verdicts: Vec<_> = (0..10).map(|_| allow_publish(&node, &alice, room)).collect();
        assert_eq!(verdicts.iter().filter(|v| v.is_ok()).count(), 6);
        let refused = verdicts.last().unwrap().as_ref().unwrap_err();
        assert_eq!(refused.code, code::LIMIT);
        assert!(refused.message.contains("limits.publishes_per_user_per_s"), "{}", refused.message);
        assert!(refused.message.contains("more than 3 publications per second by this user"), "{}", refused.message);
        // The same user with Basic credentials shares the bucket; others have their own.
        assert_eq!(allow_publish(&node, &caller(AuthMethod::Password, "alice"), room).unwrap_err().code, 429);
        assert!(allow_publish(&node, &caller(AuthMethod::Password, "bob"), room).is_ok());
        assert!(allow_publish(&node, &caller(AuthMethod::ApiKey(0), "api-key-0"), room).is_ok());
        // A refused permission costs no token.
        let carol = caller(AuthMethod::Token, "carol");
        for _ in 0..10 {
            assert_eq!(allow_publish(&node, &carol, nope).unwrap_err().code, code::FORBIDDEN);
        }
        assert!(allow_publish(&node, &carol, room).is_ok());
    }

    #[test]
    fn auth_http_batch_items_past_the_user_rate_get_429() {
        let node = node();
        let targets = |channels: &[&'static str]| channels.iter().map(|ch| node.target(ch)).collect::<Vec<_>>();
        let channels = ["room:b"; 10];
        let verdicts = allow_publish_batch(&node, &caller(AuthMethod::Password, "dave"), targets(&channels));
        let codes: Vec<u16> = verdicts.iter().map(|r| r.as_ref().map_or_else(|e| e.code, |_| 200)).collect();
        assert_eq!(codes, [vec![200; 6], vec![429; 4]].concat());
        // Refused permissions cost no token; another user's batch and an API key's still pass
        // whole (up to their own rates).
        let mixed =
            allow_publish_batch(&node, &caller(AuthMethod::Token, "erin"), targets(&["nope:1", "room:b", "nope:2"]));
        let codes: Vec<u16> = mixed.iter().map(|r| r.as_ref().map_or_else(|e| e.code, |_| 200)).collect();
        assert_eq!(codes, [code::FORBIDDEN, 200, code::FORBIDDEN]);
        let erin = allow_publish_batch(&node, &caller(AuthMethod::Token, "erin"), targets(&["room:b"; 5]));
        assert!(erin.iter().all(Result::is_ok));
        let key = allow_publish_batch(&node, &caller(AuthMethod::ApiKey(0), "api-key-0"), targets(&["room:b"; 6]));
        assert!(key.iter().all(Result::is_ok));
    }
}
