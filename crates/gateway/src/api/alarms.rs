//! `/api/alarms…` (docs/alarms.md): the states, the journal, operators' actions and the API's
//! definitions. Reading needs `subscribe` on `alarm:all`; acting is checked by
//! [`crate::alarms::act`]; definitions take an API key.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use switchboard_protocol::code;

use super::control::api_key_only;
use super::query::Query;
use super::{who, CallerExt};
use crate::alarms::def::AlarmDef;
use crate::alarms::engine::{Alarms, Origin, ALL};
use crate::alarms::journal::{self, MAX_LIMIT};
use crate::alarms::state::Act;
use crate::auth::http::allow;
use crate::auth::Action;
use crate::node::{ApiError, Node};

pub fn router() -> Router<Arc<Node>> {
    Router::new()
        .route("/api/alarms", get(list))
        .route("/api/alarms/journal", get(read_journal))
        .route("/api/alarms/defs", get(list_defs))
        .route("/api/alarms/defs/{id}", get(get_def).put(put_def).delete(delete_def))
        .route("/api/alarms/{id}", get(one))
        .route("/api/alarms/{id}/{act}", post(act))
}

fn alarms(node: &Node) -> Result<&Arc<Alarms>, ApiError> {
    node.alarms.get().ok_or_else(|| ApiError::new(code::UNAVAILABLE, "alarms are not running"))
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    priority: Option<String>,
}

fn list_of(s: &Option<String>) -> Vec<String> {
    s.as_deref()
        .map(|s| s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(String::from).collect())
        .unwrap_or_default()
}

async fn list(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    allow(&node, &caller, Action::Subscribe, ALL)?;
    let list = alarms(&node)?.list(&list_of(&q.state), &list_of(&q.priority));
    Ok(Json(serde_json::json!({ "alarms": list })).into_response())
}

async fn one(State(node): State<Arc<Node>>, caller: CallerExt, Path(id): Path<String>) -> Result<Response, ApiError> {
    allow(&node, &caller, Action::Subscribe, ALL)?;
    let s = alarms(&node)?.view.read().get(&id).cloned();
    let s = s.ok_or_else(|| ApiError::new(code::NOT_FOUND, format!("no alarm {id:?}")))?;
    Ok(Json(s).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActBody {
    #[serde(default)]
    comment: Option<String>,
    #[serde(default)]
    for_s: Option<f64>,
}

async fn act(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    Path((id, act)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: ActBody = if body.iter().all(u8::is_ascii_whitespace) {
        ActBody { comment: None, for_s: None }
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::new(code::BAD_REQUEST, format!("expected {{\"comment\", \"for_s\"}}: {e}")))?
    };
    let act = match act.as_str() {
        "ack" => Act::Ack,
        "shelve" => crate::alarms::shelve_until(body.for_s)?,
        "unshelve" => Act::Unshelve,
        other => {
            return Err(ApiError::new(code::NOT_FOUND, format!("no alarm action {other:?} (ack, shelve, unshelve)")))
        }
    };
    let status = crate::alarms::act(&node, &who(&caller), &id, act, body.comment).await?;
    Ok(Json(status).into_response())
}

#[derive(Deserialize)]
struct JournalQuery {
    since_ms: Option<u64>,
    until_ms: Option<u64>,
    alarm: Option<String>,
    kind: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn read_journal(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    Query(q): Query<JournalQuery>,
) -> Result<Response, ApiError> {
    allow(&node, &caller, Action::Subscribe, ALL)?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::new(code::BAD_REQUEST, format!("limit: 1-{MAX_LIMIT}")));
    }
    let query = journal::Query {
        since_ms: q.since_ms,
        until_ms: q.until_ms,
        alarm: q.alarm,
        kinds: list_of(&q.kind),
        limit,
        cursor: q.cursor,
    };
    let (entries, next) = journal::read(&node, &query).await.map_err(|e| match e {
        switchboard_broker::BrokerError::BadCursor(c) => {
            ApiError::new(code::BAD_REQUEST, format!("cursor: {c:?} is not a journal cursor"))
        }
        e => node.broker_error(e),
    })?;
    Ok(Json(serde_json::json!({ "entries": entries, "next": next })).into_response())
}

fn def_json(def: &AlarmDef, origin: Origin) -> serde_json::Value {
    let mut v = serde_json::to_value(def).unwrap_or_default();
    v["origin"] = serde_json::json!(if origin == Origin::Config { "config" } else { "api" });
    v
}

async fn list_defs(State(node): State<Arc<Node>>, caller: CallerExt) -> Result<Response, ApiError> {
    allow(&node, &caller, Action::Subscribe, ALL)?;
    let defs = alarms(&node)?.defs();
    let list: Vec<_> = defs.all.values().map(|(d, o)| def_json(d, *o)).collect();
    Ok(Json(serde_json::json!({ "defs": list })).into_response())
}

async fn get_def(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    allow(&node, &caller, Action::Subscribe, ALL)?;
    let defs = alarms(&node)?.defs();
    let (d, o) =
        defs.all.get(&id).ok_or_else(|| ApiError::new(code::NOT_FOUND, format!("no alarm definition {id:?}")))?;
    Ok(Json(def_json(d, *o)).into_response())
}

async fn put_def(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    api_key_only(&node, &caller, "defining alarms")?;
    let mut de = serde_json::Deserializer::from_slice(&body);
    let mut def: AlarmDef = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "body".to_string() } else { path };
        ApiError::new(code::BAD_REQUEST, format!("{field}: {}", e.into_inner()))
    })?;
    if !def.id.is_empty() && def.id != id {
        return Err(ApiError::new(code::BAD_REQUEST, "id: the URL names the definition; leave id out"));
    }
    def.id = id;
    let made = crate::alarms::put_def(&node, &who(&caller), def.clone()).await?;
    let status = if made { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(def_json(&def, Origin::Api))).into_response())
}

async fn delete_def(
    State(node): State<Arc<Node>>,
    caller: CallerExt,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    api_key_only(&node, &caller, "removing alarms")?;
    crate::alarms::delete_def(&node, &who(&caller), &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
