//! Server → client messages (SPEC §2), encoded once per wire [`Format`].
//!
//! Publications are the hot path: [`encode_publication`] writes the JSON form directly from the
//! raw data text, with no intermediate tree, and the gateway encodes each publication at most
//! once per format however many subscribers receive it.

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

/// A wire format, chosen per connection by the WebSocket subprotocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// `switchboard.v1.json`: text frames.
    Json,
    /// `switchboard.v1.msgpack`: binary frames; several messages in one frame are simply
    /// concatenated MessagePack maps.
    Msgpack,
}

impl Format {
    pub const JSON_PROTOCOL: &'static str = "switchboard.v1.json";
    pub const MSGPACK_PROTOCOL: &'static str = "switchboard.v1.msgpack";

    pub fn subprotocol(self) -> &'static str {
        match self {
            Format::Json => Self::JSON_PROTOCOL,
            Format::Msgpack => Self::MSGPACK_PROTOCOL,
        }
    }

    /// The separator between batched messages inside one frame.
    pub fn separator(self) -> &'static [u8] {
        match self {
            Format::Json => b"\n",
            Format::Msgpack => b"",
        }
    }

    /// Serializes any message in this format.
    pub fn encode<T: Serialize>(self, msg: &T) -> Vec<u8> {
        match self {
            // Serializing plain structs of strings, numbers and valid raw JSON cannot fail.
            Format::Json => serde_json::to_vec(msg).unwrap_or_default(),
            Format::Msgpack => rmp_serde::to_vec_named(msg).unwrap_or_default(),
        }
    }
}

/// Raw JSON data that serializes verbatim into JSON and as a parsed value into MessagePack.
#[derive(Debug, Clone, Copy)]
pub struct Data<'a>(pub &'a RawValue);

impl Serialize for Data<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            self.0.serialize(s)
        } else {
            let v: serde_json::Value = serde_json::from_str(self.0.get()).map_err(serde::ser::Error::custom)?;
            v.serialize(s)
        }
    }
}

/// Deepest nesting of arrays and objects accepted in publication data: the deepest serde_json
/// parses (its recursion limit), which the MessagePack encoding of [`Data`] goes through.
pub const MAX_DATA_DEPTH: usize = 127;

/// Checks that raw JSON data can be delivered in every format: [`Data`] re-parses it for
/// MessagePack subscribers, and that parse is stricter than the raw syntax check that
/// accepted it (nesting past [`MAX_DATA_DEPTH`], numbers beyond `f64`). Data that fails here
/// would silently reach MessagePack subscribers as nothing. Allocates nothing but the scratch
/// space of escaped strings.
pub fn check_data(raw: &str) -> Result<(), String> {
    use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    struct Checked;
    impl<'de> Deserialize<'de> for Checked {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Checked, D::Error> {
            d.deserialize_any(CheckedVisitor)
        }
    }
    struct CheckedVisitor;
    impl<'de> Visitor<'de> for CheckedVisitor {
        type Value = Checked;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_unit<E>(self) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
            while seq.next_element::<Checked>()?.is_some() {}
            Ok(Checked)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
            while map.next_entry::<serde::de::IgnoredAny, Checked>()?.is_some() {}
            Ok(Checked)
        }
    }
    serde_json::from_str::<Checked>(raw).map(|_| ()).map_err(|e| {
        if e.to_string().contains("recursion limit") {
            format!("data nested deeper than {MAX_DATA_DEPTH} levels")
        } else {
            format!("data cannot be delivered: {e}")
        }
    })
}

/// Raw JSON on one line, safe to embed in a `\n`-separated frame (SSE `data:` lines, long-poll
/// batches, WebSocket frames of several messages); `None` when it has no raw line break (keep
/// it as it is). Valid JSON has raw line breaks only as whitespace between tokens (inside
/// strings they are escaped), so each becomes a space and nothing else changes: numbers keep
/// their digits, even those beyond `f64`, and the value stays the same.
pub fn single_line(raw: &RawValue) -> Option<Box<RawValue>> {
    let text = raw.get();
    if !text.bytes().any(|b| b == b'\n' || b == b'\r') {
        return None;
    }
    let flat: String = text.chars().map(|c| if c == '\n' || c == '\r' { ' ' } else { c }).collect();
    RawValue::from_string(flat).ok()
}

/// A publication as it appears on the WebSocket: in pushes, `last`, `recovered` and `history`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Pub<'a> {
    pub ch: &'a str,
    pub off: u64,
    pub data: Data<'a>,
    /// `"hist": true` for a historical publication (a value from before the channel's newest,
    /// never its current one); absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hist: bool,
    /// The publication's tags ([`crate::filter`]); absent when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tags: Option<&'a crate::filter::Tags>,
}

#[derive(Serialize)]
struct PubPush<'a> {
    #[serde(rename = "pub")]
    publication: Pub<'a>,
}

/// Encodes the push `{"pub": {"ch", "off", "data"}}` (with `"hist": true` for a historical one,
/// `"tags"` for one with tags).
pub fn encode_publication(format: Format, p: Pub<'_>) -> Vec<u8> {
    let Pub { ch, off, data: Data(data), hist, tags } = p;
    match format {
        Format::Json => {
            let raw = data.get();
            let mut out = Vec::with_capacity(raw.len() + ch.len() + 40);
            out.extend_from_slice(b"{\"pub\":{\"ch\":");
            // Channel names are validated to a JSON-safe alphabet, but escape anyway: this is
            // the one place a name reaches the wire.
            let _ = serde_json::to_writer(&mut out, ch);
            out.extend_from_slice(b",\"off\":");
            out.extend_from_slice(off.to_string().as_bytes());
            out.extend_from_slice(b",\"data\":");
            out.extend_from_slice(raw.as_bytes());
            if hist {
                out.extend_from_slice(b",\"hist\":true");
            }
            if let Some(tags) = tags {
                out.extend_from_slice(b",\"tags\":");
                let _ = serde_json::to_writer(&mut out, tags);
            }
            out.extend_from_slice(b"}}");
            out
        }
        Format::Msgpack => format.encode(&PubPush { publication: p }),
    }
}

/// The push of a publication to a subscriber of Fossil deltas (`"delta": "fossil"`,
/// docs/protocol.md "Deltas"): `{"pub": {"ch", "off", "data", "delta"}}` where `data` is the
/// publication's JSON text as a string (`delta: false`) or a Fossil delta that turns the
/// channel's previous publication's JSON text into this one's (`delta: true`); MessagePack
/// carries the same bytes as a binary. `hist` and `tags` as in [`encode_publication`].
pub fn encode_delta_publication(format: Format, p: Pub<'_>, bytes: &[u8], delta: bool) -> Vec<u8> {
    #[derive(Serialize)]
    struct DeltaPub<'a> {
        ch: &'a str,
        off: u64,
        data: DeltaBytes<'a>,
        delta: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        hist: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        tags: Option<&'a crate::filter::Tags>,
    }
    /// A string in JSON (the bytes are UTF-8: the caller's rule), a binary in MessagePack.
    struct DeltaBytes<'a>(&'a [u8]);
    impl Serialize for DeltaBytes<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match (s.is_human_readable(), std::str::from_utf8(self.0)) {
                (true, Ok(text)) => s.serialize_str(text),
                (true, Err(e)) => Err(serde::ser::Error::custom(e)),
                (false, _) => s.serialize_bytes(self.0),
            }
        }
    }
    #[derive(Serialize)]
    struct Push<'a> {
        #[serde(rename = "pub")]
        publication: DeltaPub<'a>,
    }
    let publication = DeltaPub { ch: p.ch, off: p.off, data: DeltaBytes(bytes), delta, hist: p.hist, tags: p.tags };
    format.encode(&Push { publication })
}

/// The body of an error reply or of a per-channel subscribe error.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    pub code: u16,
    pub message: String,
}

#[derive(Serialize)]
struct OkReply<'a, T> {
    id: u32,
    ok: &'a T,
}

#[derive(Serialize)]
struct ErrReply<'a> {
    id: u32,
    error: &'a ErrorBody,
}

/// Encodes `{"id": id, "ok": body}`.
pub fn encode_ok<T: Serialize>(format: Format, id: u32, body: &T) -> Vec<u8> {
    format.encode(&OkReply { id, ok: body })
}

/// Encodes `{"id": id, "error": {"code", "message"}}`.
pub fn encode_error(format: Format, id: u32, code: u16, message: &str) -> Vec<u8> {
    format.encode(&ErrReply { id, error: &ErrorBody { code, message: message.to_string() } })
}

#[derive(Serialize)]
pub struct PresenceEvent<'a> {
    pub ch: &'a str,
    pub client: &'a str,
    pub user: &'a str,
}

#[derive(Serialize)]
struct JoinPush<'a> {
    join: PresenceEvent<'a>,
}

#[derive(Serialize)]
struct LeavePush<'a> {
    leave: PresenceEvent<'a>,
}

/// Encodes a presence `join` (or `leave` when `join` is false) push.
pub fn encode_presence(format: Format, join: bool, ev: PresenceEvent<'_>) -> Vec<u8> {
    if join {
        format.encode(&JoinPush { join: ev })
    } else {
        format.encode(&LeavePush { leave: ev })
    }
}

#[derive(Serialize)]
struct DisconnectBody<'a> {
    code: u16,
    reason: &'a str,
    reconnect: bool,
}

#[derive(Serialize)]
struct DisconnectPush<'a> {
    disconnect: DisconnectBody<'a>,
}

/// Encodes `{"disconnect": {"code", "reason", "reconnect"}}`.
pub fn encode_disconnect(format: Format, code: u16, reason: &str) -> Vec<u8> {
    format.encode(&DisconnectPush {
        disconnect: DisconnectBody { code, reason, reconnect: crate::code::close::reconnect(code) },
    })
}

#[derive(Serialize)]
struct UnsubscribedBody<'a> {
    ch: &'a str,
    code: u16,
    reason: &'a str,
    resubscribe: bool,
}

#[derive(Serialize)]
struct UnsubscribedPush<'a> {
    unsubscribed: UnsubscribedBody<'a>,
}

/// Encodes `{"unsubscribed": {"ch", "code", "reason", "resubscribe": true}}`: the server ended
/// this one subscription (its broker shard may have lost publications of it); the client
/// subscribes it again with `recover` from its last offset, on the same connection.
pub fn encode_unsubscribed(format: Format, ch: &str, code: u16, reason: &str) -> Vec<u8> {
    format.encode(&UnsubscribedPush { unsubscribed: UnsubscribedBody { ch, code, reason, resubscribe: true } })
}

#[derive(Serialize)]
struct SubscribedPush<'a, T: Serialize> {
    subscribed: &'a T,
}

/// Encodes `{"subscribed": body}`: server-side subscriptions made for the client (the connect
/// hook's `channels`); `body` is what a subscribe reply's `ok` holds (`{"channels": {...}}`).
pub fn encode_subscribed<T: Serialize>(format: Format, body: &T) -> Vec<u8> {
    format.encode(&SubscribedPush { subscribed: body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_single_line_keeps_values_the_value_parser_refuses() {
        let raw = RawValue::from_string("{\"ping\":\n0.8e1300600, \"s\": \"a\\nb\"\r\n}".to_string()).unwrap();
        let one = single_line(&raw).unwrap();
        assert_eq!(one.get(), "{\"ping\": 0.8e1300600, \"s\": \"a\\nb\"  }");
    }

    #[test]
    fn message_check_data_refuses_what_msgpack_cannot_carry() {
        assert!(check_data(r#"{"v": [1, 2.5, "x\n", null, true, {"a": {}}]}"#).is_ok());
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(check_data(&deep(MAX_DATA_DEPTH)).is_ok());
        assert!(check_data(&deep(MAX_DATA_DEPTH + 1)).unwrap_err().contains("nested"));
        assert!(check_data(&deep(30_000)).is_err());
        assert!(check_data("1e999999").is_err());
        // What passes is exactly what the MessagePack path can encode.
        let raw = serde_json::value::RawValue::from_string(deep(MAX_DATA_DEPTH)).unwrap();
        assert!(!Format::Msgpack.encode(&Data(&raw)).is_empty());
    }

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    #[test]
    fn message_publication_json_is_exact() {
        let data = raw(r#"{"v":1.5}"#);
        let p = Pub { ch: "pt:a", off: 43, data: Data(&data), hist: false, tags: None };
        assert_eq!(encode_publication(Format::Json, p), br#"{"pub":{"ch":"pt:a","off":43,"data":{"v":1.5}}}"#);
        let out = encode_publication(Format::Json, Pub { hist: true, ..p });
        assert_eq!(out, br#"{"pub":{"ch":"pt:a","off":43,"data":{"v":1.5},"hist":true}}"#);
        let tags: crate::filter::Tags = [("a\"b".to_string(), "c".to_string())].into();
        let out = encode_publication(Format::Json, Pub { tags: Some(&tags), ..p });
        assert_eq!(out, br#"{"pub":{"ch":"pt:a","off":43,"data":{"v":1.5},"tags":{"a\"b":"c"}}}"#);
    }

    #[test]
    fn message_publication_msgpack_round_trips() {
        let data = raw(r#"[1,"x",true]"#);
        let p = Pub { ch: "a", off: 1, data: Data(&data), hist: false, tags: None };
        let v: serde_json::Value = rmp_serde::from_slice(&encode_publication(Format::Msgpack, p)).unwrap();
        assert_eq!(v, serde_json::json!({"pub": {"ch": "a", "off": 1, "data": [1, "x", true]}}));
        let v: serde_json::Value =
            rmp_serde::from_slice(&encode_publication(Format::Msgpack, Pub { hist: true, ..p })).unwrap();
        assert_eq!(v, serde_json::json!({"pub": {"ch": "a", "off": 1, "data": [1, "x", true], "hist": true}}));
    }

    #[test]
    fn message_delta_publications_carry_text_in_json_and_bytes_in_msgpack() {
        let data = raw(r#"{"v":1}"#);
        let p = Pub { ch: "a", off: 2, data: Data(&data), hist: false, tags: None };
        let out = encode_delta_publication(Format::Json, p, br#"{"v":1}"#, false);
        assert_eq!(out, br#"{"pub":{"ch":"a","off":2,"data":"{\"v\":1}","delta":false}}"#);
        let out = encode_delta_publication(Format::Msgpack, Pub { hist: true, ..p }, b"3\n2:x", true);
        // A bin 8 of 5 bytes (0xc4 0x05), then `"delta": true` (0xc3) and `"hist": true`.
        assert!(out.windows(7).any(|w| w == [0xc4, 5, b'3', b'\n', b'2', b':', b'x']), "{out:?}");
        let tail = [&[0xa5][..], b"delta", &[0xc3, 0xa4], b"hist", &[0xc3]].concat();
        assert!(out.ends_with(&tail), "{out:?}");
    }

    #[test]
    fn message_single_line_keeps_compact_json_and_flattens_pretty_json() {
        assert!(single_line(&raw(r#"{"a": 1.50}"#)).is_none(), "kept as it is");
        assert_eq!(single_line(&raw("{\n  \"a\": [1.50,\r\n 2]\n}")).unwrap().get(), "{   \"a\": [1.50,   2] }");
        assert!(single_line(&raw(r#""line\nbreak""#)).is_none(), "escaped breaks are no raw ones");
    }

    #[test]
    fn message_replies_and_disconnects() {
        let e = encode_error(Format::Json, 3, 403, "no");
        assert_eq!(e, br#"{"id":3,"error":{"code":403,"message":"no"}}"#);
        let ok = encode_ok(Format::Json, 4, &serde_json::json!({}));
        assert_eq!(ok, br#"{"id":4,"ok":{}}"#);
        let d = encode_disconnect(Format::Json, 4008, "slow consumer");
        assert_eq!(d, br#"{"disconnect":{"code":4008,"reason":"slow consumer","reconnect":true}}"#);
        let d = encode_disconnect(Format::Json, 4010, "bad frame");
        assert!(String::from_utf8(d).unwrap().contains("\"reconnect\":false"));
    }

    #[test]
    fn message_unsubscribed_names_the_channel_and_asks_to_subscribe_again() {
        let u = encode_unsubscribed(Format::Json, "room:1", 4008, "missed");
        assert_eq!(u, br#"{"unsubscribed":{"ch":"room:1","code":4008,"reason":"missed","resubscribe":true}}"#);
    }
}
