//! The HTTP API's request bodies and query strings, as serde reads them. Kept apart from the
//! handlers (and free of axum) so the `http_api` fuzz target parses exactly these types.

use serde::Deserialize;
use serde_json::value::RawValue;
use switchboard_protocol::filter::Tags;

/// One item of a batch publish.
#[derive(Deserialize)]
pub struct PublishOne {
    pub channel: String,
    pub data: Box<RawValue>,
    #[serde(default, deserialize_with = "switchboard_protocol::command::idempotency_key")]
    pub idempotency_key: Option<String>,
    #[serde(default, deserialize_with = "switchboard_protocol::filter::tags")]
    pub tags: Option<Tags>,
}

/// `{"channel", "data", "idempotency_key"?, "tags"?}` or `{"batch": [...]}`. Not an untagged enum: raw JSON values cannot
/// pass through serde's buffering of untagged variants.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishBody {
    pub channel: Option<String>,
    #[serde(default, deserialize_with = "switchboard_protocol::command::present")]
    pub data: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "switchboard_protocol::command::idempotency_key")]
    pub idempotency_key: Option<String>,
    #[serde(default, deserialize_with = "switchboard_protocol::filter::tags")]
    pub tags: Option<Tags>,
    pub batch: Option<Vec<PublishOne>>,
}

/// Query of `GET /api/channels`.
#[derive(Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    pub prefix: String,
    pub limit: Option<usize>,
    pub cursor: Option<String>,
}

/// Query of `GET /api/channels/{channel}/history` and `/trend`.
#[derive(Deserialize)]
pub struct HistoryQuery {
    pub since_offset: Option<u64>,
    pub epoch: Option<String>,
    pub limit: Option<usize>,
    /// `/trend`: how far back (s, default 3600) and the bucket width (s).
    pub window_s: Option<u64>,
    pub step_s: Option<u64>,
    /// `/trend`: the window's end (unix ms, default now).
    pub until_ms: Option<u64>,
}
