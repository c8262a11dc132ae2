//! The HTTP API (SPEC §4) and the route table, including `/ws`, `/sse` and `/poll`. Query
//! strings are read with [`query::Query`] (a malformed one is the usual JSON 400).

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::value::RawValue;
use switchboard_broker::{ChannelQuery, Position, Publication};
use switchboard_protocol::{code, validate_channel, Format};

use crate::auth::http::{allow, allow_publish, Caller};
use crate::auth::{Action, Identity};
use crate::node::{ApiError, Node, Target};
use crate::publish::{self, Asked, Publisher};

mod alarms;
mod bodies;
pub(crate) mod control;
pub mod query;
mod sources;
mod writes;
use bodies::{HistoryQuery, ListQuery, PublishBody};
use query::Query;

/// The caller attached by the authentication middleware (`auth::http::guard`).
pub(crate) type CallerExt = Option<axum::Extension<Caller>>;

/// Who the caller is (anonymous while the API is open).
pub(crate) fn who(caller: &CallerExt) -> Identity {
    caller.as_ref().map(|c| c.0 .0.clone()).unwrap_or_else(Identity::anonymous)
}

/// Largest accepted HTTP request body (a batch publish of thousands of points).
const MAX_BODY: usize = 16 * 1024 * 1024;

pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/ws", get(crate::transport::ws::handshake))
        .route("/api/publish", post(publish))
        .route("/api/channels", get(channels))
        .route("/api/channels/{*rest}", get(channel))
        .route("/api/presence/{*channel}", get(presence))
        .route("/api/info", get(info))
        .route("/api/writes", get(writes::list))
        .route("/api/sources", get(sources::list))
        .route("/api/disconnect", post(control::disconnect))
        .route("/api/revoke", post(control::revoke))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(failpoints())
        .merge(alarms::router())
        .merge(crate::dashboards::router(&node.config))
        // `/sse`, `/poll`, `/poll/{session}`: the HTTP transports (SPEC §3).
        .merge(crate::transport::poll::router(node.clone()))
        .layer(axum::middleware::from_fn_with_state(node.clone(), crate::auth::http::guard))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(node)
}

/// The SPEC error body; a 429 carries `Retry-After` (1 s unless the error says).
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r =
            (status, Json(serde_json::json!({"error": {"code": self.code, "message": self.message}}))).into_response();
        if self.code == code::LIMIT {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(self.retry_after_s.unwrap_or(1)));
        }
        r
    }
}

/// The long publication form of the HTTP API.
#[derive(Serialize)]
struct HttpPub<'a> {
    channel: &'a str,
    offset: u64,
    data: &'a RawValue,
    /// `true` for a historical publication, as on the WebSocket; absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    hist: bool,
    /// Its tags, as on the WebSocket; absent when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    tags: Option<&'a switchboard_protocol::filter::Tags>,
}

fn http_pub<'a>(channel: &'a str, p: &'a Publication) -> HttpPub<'a> {
    HttpPub { channel, offset: p.offset, data: &p.data, hist: p.historical, tags: p.tags.as_deref() }
}

async fn publish(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: PublishBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(400, format!("expected {{\"channel\", \"data\"}} or {{\"batch\": [...]}}: {e}")))?;
    let mut by = HttpPublisher { node: &node, caller: &caller, who: who(&caller) };
    match body {
        PublishBody { channel: Some(channel), data: Some(data), idempotency_key, tags, batch: None } => {
            let outcome = publish::one(&node, &mut by, Asked { channel, data, idempotency_key, tags }).await?;
            Ok(Json(outcome).into_response())
        }
        PublishBody { channel: None, data: None, idempotency_key: None, tags: None, batch: Some(batch) } => {
            let items = batch
                .into_iter()
                .map(|p| Asked { channel: p.channel, data: p.data, idempotency_key: p.idempotency_key, tags: p.tags })
                .collect();
            let results: Vec<serde_json::Value> = publish::batch(&node, &mut by, items)
                .await
                .into_iter()
                .map(|r| match r {
                    Ok(outcome) => serde_json::to_value(outcome).unwrap_or_default(),
                    Err(e) => serde_json::json!({"error": {"code": e.code, "message": e.message}}),
                })
                .collect();
            Ok(Json(serde_json::json!({ "results": results })).into_response())
        }
        _ => Err(ApiError::new(400, "expected {\"channel\", \"data\"} or {\"batch\": [...]}")),
    }
}

/// An HTTP API caller as a publisher: its namespace permissions, then its user's or its API
/// key's publish rate (`auth::http`).
struct HttpPublisher<'a> {
    node: &'a Node,
    caller: &'a CallerExt,
    who: Identity,
}

impl Publisher for HttpPublisher<'_> {
    fn identity(&self) -> &Identity {
        &self.who
    }

    fn permit(&mut self, target: Target<'_>) -> Result<(), ApiError> {
        allow_publish(self.node, self.caller, target)
    }

    fn permit_batch<'a>(&mut self, targets: Vec<Result<Target<'a>, ApiError>>) -> Vec<Result<Target<'a>, ApiError>> {
        crate::auth::http::allow_publish_batch(self.node, self.caller, targets)
    }
}

#[derive(Serialize)]
struct ChannelInfo<'a> {
    channel: &'a str,
    subscribers: usize,
    offset: u64,
    epoch: &'a str,
    /// Subscriptions over the whole cluster, when the broker knows them (Redis).
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster_subscribers: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last: Option<Option<HttpPub<'a>>>,
}

/// Cluster-wide subscriptions of `channel`, when the broker keeps such figures.
async fn cluster_subscribers(node: &Node, channel: &str) -> Option<u64> {
    let info = node.broker.cluster().await.ok().flatten()?;
    Some(info.subscribers.get(channel).copied().unwrap_or(0))
}

/// Channels per listing page unless `limit` says otherwise, and the most it may say.
const LIST_LIMIT: usize = 1_000;
const LIST_MAX: usize = 10_000;

/// `GET /api/channels?prefix=&limit=&cursor=`: one page of the channels the caller may
/// subscribe to, `{"channels": [...], "next": <cursor or null>}`. Each page is a bounded read
/// of the broker (see [`switchboard_broker::Broker::channels`]); a page may hold fewer than
/// `limit` (channels the caller may not see are left out) and still have a next one.
async fn channels(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    if !q.prefix.is_empty() {
        validate_channel(&q.prefix).map_err(|e| ApiError::new(400, format!("prefix: {e}")))?;
    }
    let limit = q.limit.unwrap_or(LIST_LIMIT);
    if !(1..=LIST_MAX).contains(&limit) {
        return Err(ApiError::new(400, format!("limit: between 1 and {LIST_MAX}")));
    }
    let query = ChannelQuery { prefix: &q.prefix, cursor: q.cursor.as_deref().filter(|c| !c.is_empty()), limit };
    let page = node.broker.channels(&query).await.map_err(|e| node.broker_error(e))?;
    let cluster = node.broker.cluster().await.ok().flatten();
    let out: Vec<ChannelInfo<'_>> = page
        .channels
        .iter()
        .filter(|c| allow(&node, &caller, Action::Subscribe, &c.channel).is_ok())
        .map(|c| ChannelInfo {
            channel: &c.channel,
            subscribers: node.hub.subscriber_count(&c.channel),
            offset: c.position.offset,
            epoch: &c.position.epoch,
            cluster_subscribers: cluster.as_ref().map(|i| i.subscribers.get(&c.channel).copied().unwrap_or(0)),
            last: None,
        })
        .collect();
    Ok(Json(serde_json::json!({ "channels": out, "next": page.next })).into_response())
}

/// `GET /api/channels/{channel}`, its `/history` and its `/trend`. Channel names may contain
/// `/`; a name that itself ends in `/history` or `/trend` must be percent-encoded
/// (`%2Fhistory`).
async fn channel(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    Path(rest): Path<String>,
    Query(q): Query<HistoryQuery>,
) -> Result<Response, ApiError> {
    if let Some(ch) = rest.strip_suffix("/trend") {
        validate_channel(ch).map_err(|e| ApiError::new(400, e.to_string()))?;
        allow(&node, &caller, Action::History, ch)?;
        if node.broker.last_if_known(ch).await.map_err(|e| node.broker_error(e))?.is_none() {
            return Err(ApiError::new(404, "unknown channel"));
        }
        let reply = crate::trend::read(&node, ch, q.window_s.unwrap_or(3600), q.step_s, q.until_ms).await?;
        // Within the budget of one reply, as a subscribe's trend (413 past it).
        let body = crate::trend::json_within(&reply, node.config.limits.reply_budget())?;
        return Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response());
    }
    if let Some(ch) = rest.strip_suffix("/history") {
        validate_channel(ch).map_err(|e| ApiError::new(400, e.to_string()))?;
        allow(&node, &caller, Action::History, ch)?;
        return history(&node, ch, q).await;
    }
    validate_channel(&rest).map_err(|e| ApiError::new(400, e.to_string()))?;
    allow(&node, &caller, Action::Subscribe, &rest)?;
    // A read never creates a channel: an unknown one is 404.
    let (pos, last) = node
        .broker
        .last_if_known(&rest)
        .await
        .map_err(|e| node.broker_error(e))?
        .ok_or_else(|| ApiError::new(404, "unknown channel"))?;
    let info = ChannelInfo {
        channel: &rest,
        subscribers: node.hub.subscriber_count(&rest),
        offset: pos.offset,
        epoch: &pos.epoch,
        cluster_subscribers: cluster_subscribers(&node, &rest).await,
        last: Some(last.as_ref().map(|p| http_pub(&rest, p))),
    };
    Ok(Json(info).into_response())
}

/// `GET /api/channels/{ch}/history`: a page of the channel's history within the budget of one
/// reply, read as the `history` command reads it (`crate::history`); `more` says a page ended
/// before `limit` and the reader asks again from its last publication.
async fn history(node: &Node, ch: &str, q: HistoryQuery) -> Result<Response, ApiError> {
    let since = match (q.since_offset, q.epoch) {
        (Some(offset), Some(epoch)) => Some(Position { epoch: epoch.into(), offset }),
        (None, None) => None,
        _ => return Err(ApiError::new(400, "since_offset and epoch go together")),
    };
    // Each publication counted as the body writes it, its separating comma included.
    let cost = |p: &Publication| crate::session::reply::encoded_len(Format::Json, &http_pub(ch, p)) + 1;
    let budget = node.config.limits.reply_budget();
    let page = crate::history::read(node, ch, since, q.limit, budget, cost).await?;
    #[derive(Serialize)]
    struct HistoryReply<'a> {
        channel: &'a str,
        publications: Vec<HttpPub<'a>>,
        epoch: &'a str,
        offset: u64,
        complete: bool,
        more: bool,
    }
    let reply = HistoryReply {
        channel: ch,
        publications: page.publications.iter().map(|p| http_pub(ch, p)).collect(),
        epoch: &page.position.epoch,
        offset: page.position.offset,
        complete: page.complete,
        more: page.more,
    };
    // Written once into a buffer of the reply's size (the counted publications and the few
    // fields around them), so the body holds no more than the budget and its envelope.
    let mut body = Vec::with_capacity(crate::session::reply::encoded_len(Format::Json, &reply));
    // Plain fields and raw JSON already checked when published: writing into a Vec cannot fail.
    serde_json::to_writer(&mut body, &reply).map_err(|_| ApiError::new(code::INTERNAL, "history reply not written"))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

async fn presence(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    Path(ch): Path<String>,
) -> Result<Response, ApiError> {
    validate_channel(&ch).map_err(|e| ApiError::new(400, e.to_string()))?;
    if !node.config.namespace(switchboard_protocol::namespace_of(&ch)).presence {
        return Err(ApiError::new(403, "presence is not enabled in this namespace"));
    }
    allow(&node, &caller, Action::Presence, &ch)?;
    let clients = node.broker.presence(&ch).await.map_err(|e| node.broker_error(e))?;
    Ok(Json(serde_json::json!({ "channel": ch, "clients": clients })).into_response())
}

async fn info(State(node): State<Arc<Node>>) -> Response {
    use std::sync::atomic::Ordering::Relaxed;
    let mut body = serde_json::json!({
        "node": node.id,
        "version": env!("CARGO_PKG_VERSION"),
        "connections": node.connection_count(),
        "subscriptions": node.metrics.subscriptions.load(Relaxed),
        "channels": node.hub.channel_count(),
        "uptime_s": node.uptime().as_secs(),
        "broker": node.broker.kind(),
        "workers": node.config.worker_threads(),
    });
    // Plant data sources and whether this node runs each one now (it holds its lease).
    if let Some(sources) = node.sources.get() {
        body["sources"] = sources
            .handles()
            .iter()
            .map(|h| {
                serde_json::json!({
                    "name": h.name,
                    "kind": h.kind,
                    "active": h.stats.active.load(Relaxed),
                    "connected": h.stats.connected.load(Relaxed),
                })
            })
            .collect();
    }
    // Figures of the whole cluster, from a shared broker (absent with the memory broker).
    match node.broker.cluster().await {
        Ok(Some(c)) => {
            body["cluster"] = serde_json::json!({
                "nodes": c.nodes.len(),
                "node_ids": c.nodes,
                "subscriptions": c.subscribers.values().sum::<u64>(),
                "channels_with_subscribers": c.subscribers.len(),
            })
        }
        Ok(None) => {}
        Err(e) => body["cluster"] = serde_json::json!({ "error": e.to_string() }),
    }
    Json(body).into_response()
}

async fn readyz(State(node): State<Arc<Node>>) -> Response {
    if node.is_stopping() {
        return (StatusCode::SERVICE_UNAVAILABLE, "stopping\n").into_response();
    }
    // A broker answering late makes deliveries late: a load balancer drains the node before
    // its clients see it. Read from the last measure, so this answers at once.
    let limit = node.config.broker_max_rtt_ms;
    if let Some(rtt) = node.broker.round_trip().filter(|rtt| limit > 0 && rtt.as_millis() > u128::from(limit)) {
        let why = format!("broker slow: round trip {} ms, over broker_max_rtt_ms {limit}\n", rtt.as_millis());
        return (StatusCode::SERVICE_UNAVAILABLE, why).into_response();
    }
    if node.broker.ready().await {
        "ready\n".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "broker unreachable\n").into_response()
    }
}

/// `PUT /api/failpoints/{name}` with the actions as the body (`return(7)`, `return`, `off`):
/// only in builds with the `failpoints` feature, which only the fault-injection tests enable.
#[cfg(feature = "failpoints")]
fn failpoints() -> Router<Arc<Node>> {
    use axum::routing::put;
    async fn configure(Path(name): Path<String>, actions: String) -> Response {
        match switchboard_supervisor::fault::configure(&name, actions.trim()) {
            Ok(()) => StatusCode::NO_CONTENT.into_response(),
            Err(e) => ApiError::new(switchboard_protocol::code::BAD_REQUEST, e).into_response(),
        }
    }
    Router::new().route("/api/failpoints/{name}", put(configure))
}

#[cfg(not(feature = "failpoints"))]
fn failpoints() -> Router<Arc<Node>> {
    Router::new()
}

async fn metrics(State(node): State<Arc<Node>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        node.metrics.render(node.hub.channel_count(), node.broker.channel_count(), node.broker.round_trip())
            + &crate::sources::render_metrics(&node)
            + &crate::alarms::render_metrics(&node)
            + &node.config.hooks.render()
            + &node.config.security.auth.remote_keys().map(|k| k.render()).unwrap_or_default()
            + &node.owners.render(),
    )
        .into_response()
}
