//! Command options and the typed `ok` bodies of replies (SPEC §2 table).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use switchboard_protocol::message::ErrorBody;
use switchboard_protocol::StreamPosition;

use crate::event::Publication;

/// The body of a `subscribe` command.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SubscribeOptions {
    pub channels: Vec<String>,
    /// Ask for each channel's last publication in the reply.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub initial: bool,
    /// Positions to recover from, per channel: the epoch and the offset of the last
    /// publication processed.
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub recover: HashMap<String, StreamPosition>,
    /// Ceiling of deliveries per second for these subscriptions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_rate_hz: Option<f64>,
    /// `{"abs": X}` or `{"pct": P}`: numeric values that moved less are not sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadband: Option<serde_json::Value>,
    /// `{"window_s": S, "step_s": T}`: each channel's trend in the reply (docs/protocol.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trend: Option<serde_json::Value>,
    /// `"fossil"`: live publications come as Fossil deltas of the previous one, which
    /// [`Client`](crate::Client) rebuilds ([`crate::delta`]); refused (400) for a channel that
    /// conflates or with sampling or a filter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<String>,
    /// A tree of comparisons of the publications' tags: leaves `{"key", "cmp", "val"}` (or
    /// `"vals"` for `in` / `nin`) and nodes `{"op": "and"|"or"|"not", "nodes": [...]}`. Only
    /// matching publications are sent, live and recovered, so the offsets delivered have
    /// holes that are not gaps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<serde_json::Value>,
}

impl SubscribeOptions {
    pub fn new<I, S>(channels: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        SubscribeOptions { channels: channels.into_iter().map(Into::into).collect(), ..Default::default() }
    }

    pub fn initial(mut self, initial: bool) -> Self {
        self.initial = initial;
        self
    }

    /// Recover `channel` from the publication after `offset` in `epoch`.
    pub fn recover(mut self, channel: impl Into<String>, epoch: impl Into<String>, offset: u64) -> Self {
        self.recover.insert(channel.into(), StreamPosition { epoch: epoch.into(), offset });
        self
    }

    pub fn max_rate_hz(mut self, hz: f64) -> Self {
        self.max_rate_hz = Some(hz);
        self
    }

    /// Values that moved less than `abs` from the last one sent are not sent.
    pub fn deadband_abs(mut self, abs: f64) -> Self {
        self.deadband = Some(serde_json::json!({ "abs": abs }));
        self
    }

    /// Values that moved less than `pct` percent of the last one sent are not sent.
    pub fn deadband_pct(mut self, pct: f64) -> Self {
        self.deadband = Some(serde_json::json!({ "pct": pct }));
        self
    }

    /// Each channel's trend over the last `window_s` seconds, in buckets of `step_s` (the
    /// namespace's stored step when `None`).
    pub fn trend(mut self, window_s: u64, step_s: Option<u64>) -> Self {
        let mut t = serde_json::json!({ "window_s": window_s });
        if let Some(step) = step_s {
            t["step_s"] = step.into();
        }
        self.trend = Some(t);
        self
    }

    /// Live publications as Fossil deltas of the previous one (less to send for publications
    /// that change little); the client hands them over rebuilt.
    pub fn fossil_delta(mut self) -> Self {
        self.delta = Some("fossil".into());
        self
    }

    /// Only publications whose tags match `filter` (the field's shape).
    pub fn filter(mut self, filter: serde_json::Value) -> Self {
        self.filter = Some(filter);
        self
    }
}

/// `subscribe` reply: one result per requested channel.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SubscribeReply {
    pub channels: HashMap<String, ChannelResult>,
}

impl SubscribeReply {
    /// The per-channel errors, if any (per-channel failures do not fail the command).
    pub fn errors(&self) -> impl Iterator<Item = (&str, &ErrorBody)> {
        self.channels.iter().filter_map(|(ch, r)| match r {
            ChannelResult::Error { error } => Some((ch.as_str(), error)),
            ChannelResult::Subscribed(_) => None,
        })
    }
}

/// One channel's outcome in a subscribe reply.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ChannelResult {
    Error { error: ErrorBody },
    Subscribed(Subscribed),
}

/// A successful subscription.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Subscribed {
    /// The channel's current position.
    pub epoch: String,
    pub offset: u64,
    /// The latest publication, with `initial: true`.
    #[serde(default)]
    pub last: Option<Publication>,
    /// With `recover`: the publications after the given position, in order; when the epoch
    /// changed, the current epoch's from its first kept offset (with `complete: false`).
    #[serde(default)]
    pub recovered: Vec<Publication>,
    /// `false` when the history no longer reached back to the recovery position (or its epoch
    /// is gone).
    #[serde(default = "yes")]
    pub complete: bool,
    /// With `trend`: `{"step_s", "buckets", "tiers"}`, typed by [`Subscribed::trend_reply`].
    #[serde(default)]
    pub trend: Option<serde_json::Value>,
}

fn yes() -> bool {
    true
}

/// `publish` reply (WebSocket and HTTP): the publication's position, or — for a channel whose
/// namespace writes to a plant device (`write_source`) — that the device's source took the
/// write (it publishes nothing itself: `offset` 0, `epoch` empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PublishReplyWire")]
pub struct PublishReply {
    #[serde(skip_serializing_if = "is_zero")]
    pub offset: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub epoch: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub written: bool,
    /// The source that wrote to the device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl PublishReply {
    /// A publication at `offset` of `epoch`.
    pub fn published(offset: u64, epoch: impl Into<String>) -> PublishReply {
        PublishReply { offset, epoch: epoch.into(), written: false, source: None }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Either documented shape, and nothing else.
#[derive(Deserialize)]
struct PublishReplyWire {
    offset: Option<u64>,
    epoch: Option<String>,
    #[serde(default)]
    written: bool,
    source: Option<String>,
}

impl TryFrom<PublishReplyWire> for PublishReply {
    type Error = String;

    fn try_from(w: PublishReplyWire) -> Result<PublishReply, String> {
        match w {
            PublishReplyWire { offset: Some(offset), epoch: Some(epoch), written: false, source: None } => {
                Ok(PublishReply::published(offset, epoch))
            }
            PublishReplyWire { offset: None, epoch: None, written: true, source: Some(source) } => {
                Ok(PublishReply { offset: 0, epoch: String::new(), written: true, source: Some(source) })
            }
            _ => Err(r#"expected {"offset", "epoch"} or {"written": true, "source"}"#.into()),
        }
    }
}

/// `history` reply.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HistoryReply {
    pub publications: Vec<Publication>,
    pub epoch: String,
    pub offset: u64,
    /// `false` when the history no longer reached back to `since`.
    #[serde(default = "yes")]
    pub complete: bool,
    /// The reply reached the server's byte budget before `limit`: more publications follow;
    /// read them with `since` at the last one.
    #[serde(default)]
    pub more: bool,
}

/// `presence` reply.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PresenceReply {
    pub clients: Vec<PresenceClient>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PresenceClient {
    pub client: String,
    #[serde(default)]
    pub user: Option<String>,
}

/// `connect` reply.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ConnectReply {
    pub client: String,
    pub node: String,
    pub ping_s: u64,
}

/// `refresh` reply.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RefreshReply {
    pub expires: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn client_publish_replies_of_both_shapes_are_understood_and_others_refused() {
        let p: PublishReply = serde_json::from_value(json!({"offset": 43, "epoch": "e"})).unwrap();
        assert_eq!(p, PublishReply::published(43, "e"));
        assert_eq!(serde_json::to_value(&p).unwrap(), json!({"offset": 43, "epoch": "e"}));
        let w: PublishReply = serde_json::from_value(json!({"written": true, "source": "plant"})).unwrap();
        assert!(w.written && w.source.as_deref() == Some("plant"));
        assert_eq!(serde_json::to_value(&w).unwrap(), json!({"written": true, "source": "plant"}));
        for bad in [json!({}), json!({"offset": 1}), json!({"written": false, "source": "x"}), json!({"source": "x"})] {
            assert!(serde_json::from_value::<PublishReply>(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn reply_subscribe_options_serialize_to_the_wire_shape() {
        let o = SubscribeOptions::new(["a"]).initial(true).recover("a", "e", 41);
        assert_eq!(
            serde_json::to_value(&o).unwrap(),
            json!({"channels": ["a"], "initial": true, "recover": {"a": {"epoch": "e", "offset": 41}}})
        );
        assert_eq!(serde_json::to_value(SubscribeOptions::new(["b"])).unwrap(), json!({"channels": ["b"]}));
        let filter = json!({"op": "and", "nodes": [
            {"key": "kind", "cmp": "in", "vals": ["alarm", "event"]},
            {"op": "not", "nodes": [{"key": "site", "cmp": "eq", "val": "test"}]}
        ]});
        let o = SubscribeOptions::new(["c"]).fossil_delta().filter(filter.clone());
        assert_eq!(serde_json::to_value(&o).unwrap(), json!({"channels": ["c"], "delta": "fossil", "filter": filter}));
    }

    #[test]
    fn reply_subscribe_mixes_results_and_errors() {
        let r: SubscribeReply = serde_json::from_value(json!({"channels": {
            "a": {"epoch": "e", "offset": 42, "last": {"ch": "a", "off": 42, "data": 1}, "recovered": [], "complete": true},
            "b": {"error": {"code": 403, "message": "forbidden"}}
        }}))
        .unwrap();
        let ChannelResult::Subscribed(a) = &r.channels["a"] else { panic!() };
        assert_eq!(a.offset, 42);
        assert_eq!(a.last.as_ref().unwrap().data, json!(1));
        let errors: Vec<_> = r.errors().collect();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, "b");
        assert_eq!(errors[0].1.code, 403);
    }
}
