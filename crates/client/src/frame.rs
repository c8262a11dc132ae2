//! Splitting server frames into messages and decoding them.
//!
//! The server batches under load: a text frame may carry several JSON messages separated by
//! `\n`, and a binary (MessagePack) frame several concatenated maps. Every reader must split.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Cursor;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use switchboard_protocol::message::ErrorBody;
use switchboard_protocol::Format;

use crate::delta::EncodedPush;
use crate::event::{Event, Presence, Publication};

/// Why one message in a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FrameError(pub String);

/// The non-empty `\n`-separated lines of a JSON text frame (a trailing `\r` is dropped).
pub fn split_json(payload: &[u8]) -> impl Iterator<Item = &[u8]> {
    payload
        .split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .filter(|line| line.iter().any(|b| !b.is_ascii_whitespace()))
}

/// Decodes every message of one frame payload as a `T`, calling `f` for each in order.
///
/// A JSON line that fails to decode is reported and the next line is still tried. In a
/// MessagePack frame the message boundaries are only known by decoding, so the first failure
/// ends the frame.
pub fn for_each_message<T, F>(format: Format, payload: &[u8], mut f: F)
where
    T: DeserializeOwned,
    F: FnMut(Result<T, FrameError>),
{
    match format {
        Format::Json => {
            for line in split_json(payload) {
                f(serde_json::from_slice(line).map_err(|e| FrameError(e.to_string())));
            }
        }
        Format::Msgpack => {
            let mut de = rmp_serde::Deserializer::new(Cursor::new(payload));
            while (de.position() as usize) < payload.len() {
                match T::deserialize(&mut de) {
                    Ok(v) => f(Ok(v)),
                    Err(e) => {
                        f(Err(FrameError(e.to_string())));
                        return;
                    }
                }
            }
        }
    }
}

/// One decoded server → client message.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerMessage {
    /// The reply to the command with this id: its `ok` body or its `error`.
    Reply { id: u32, result: Result<serde_json::Value, ErrorBody> },
    /// A push of a `delta: "fossil"` subscription, its data still the publication's JSON text
    /// or a delta: [`crate::delta::Chains`] turns it into its publication.
    Encoded(EncodedPush),
    /// Anything else.
    Event(Event),
}

/// Every key a server message may have; exactly one group is present.
#[derive(Deserialize)]
struct Incoming {
    #[serde(default)]
    id: Option<u32>,
    #[serde(default)]
    ok: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<ErrorBody>,
    #[serde(default, rename = "pub")]
    publication: Option<Push>,
    #[serde(default)]
    join: Option<Presence>,
    #[serde(default)]
    leave: Option<Presence>,
    #[serde(default)]
    disconnect: Option<Disconnect>,
    #[serde(default)]
    unsubscribed: Option<Unsubscribed>,
    #[serde(default)]
    subscribed: Option<serde_json::Value>,
}

/// A `pub` as the wire has it: a plain publication, or with `delta` one of a delta
/// subscription (its data a string in JSON, a binary in MessagePack).
#[derive(Deserialize)]
struct Push {
    ch: String,
    off: u64,
    data: Payload,
    #[serde(default)]
    hist: bool,
    #[serde(default)]
    tags: Option<BTreeMap<String, String>>,
    #[serde(default)]
    delta: Option<bool>,
}

impl Push {
    fn classify(self) -> Result<ServerMessage, FrameError> {
        let Push { ch, off, data, hist: historical, tags, delta } = self;
        match (delta, data) {
            (None, Payload::Value(data)) => {
                Ok(ServerMessage::Event(Event::Publication(Publication { ch, off, data, historical, tags })))
            }
            (None, Payload::Bytes(_)) => Err(FrameError(format!("{ch}: binary data in a publication without delta"))),
            (Some(delta), data) => {
                let text = match data {
                    Payload::Bytes(b) => b,
                    Payload::Value(Value::String(s)) => s.into_bytes(),
                    Payload::Value(_) => {
                        return Err(FrameError(format!("{ch}: a delta publication's data is not a string or binary")))
                    }
                };
                Ok(ServerMessage::Encoded(EncodedPush { ch, off, historical, tags, delta, text }))
            }
        }
    }
}

/// A publication's `data`: any JSON value, or a MessagePack binary (which a JSON value cannot
/// hold: a delta subscription's text or delta).
enum Payload {
    Value(Value),
    Bytes(Vec<u8>),
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Payload, D::Error> {
        d.deserialize_any(PayloadVisitor)
    }
}

/// Binaries as bytes; every other value as `serde_json::Value` reads it.
struct PayloadVisitor;

impl<'de> Visitor<'de> for PayloadVisitor {
    type Value = Payload;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value or a binary")
    }

    fn visit_bytes<E>(self, v: &[u8]) -> Result<Payload, E> {
        Ok(Payload::Bytes(v.to_vec()))
    }

    fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Payload, E> {
        Ok(Payload::Bytes(v))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Payload, E> {
        Ok(Payload::Value(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Payload, E> {
        Ok(Payload::Value(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Payload, E> {
        Ok(Payload::Value(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Payload, E> {
        Ok(Payload::Value(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Payload, E> {
        Ok(Payload::Value(Value::String(v.to_string())))
    }

    fn visit_string<E>(self, v: String) -> Result<Payload, E> {
        Ok(Payload::Value(Value::String(v)))
    }

    fn visit_unit<E>(self) -> Result<Payload, E> {
        Ok(Payload::Value(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Payload, E> {
        Ok(Payload::Value(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Payload, D::Error> {
        Payload::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Payload, A::Error> {
        Value::deserialize(SeqAccessDeserializer::new(seq)).map(Payload::Value)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Payload, A::Error> {
        Value::deserialize(MapAccessDeserializer::new(map)).map(Payload::Value)
    }
}

#[derive(Deserialize)]
struct Unsubscribed {
    ch: String,
    code: u16,
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
struct Disconnect {
    code: u16,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    reconnect: bool,
}

impl Incoming {
    fn classify(self) -> Result<ServerMessage, FrameError> {
        if let Some(p) = self.publication {
            return p.classify();
        }
        if let Some(e) = self.error {
            return Ok(match self.id {
                Some(id) if id != 0 => ServerMessage::Reply { id, result: Err(e) },
                _ => ServerMessage::Event(Event::Error(e)),
            });
        }
        if let Some(id) = self.id {
            // `ok` is always an object; a missing or null one is read as `null`.
            let body = self.ok.unwrap_or(serde_json::Value::Null);
            return Ok(ServerMessage::Reply { id, result: Ok(body) });
        }
        if let Some(p) = self.join {
            return Ok(ServerMessage::Event(Event::Join(p)));
        }
        if let Some(p) = self.leave {
            return Ok(ServerMessage::Event(Event::Leave(p)));
        }
        if let Some(d) = self.disconnect {
            return Ok(ServerMessage::Event(Event::Disconnect {
                code: d.code,
                reason: d.reason,
                reconnect: d.reconnect,
            }));
        }
        if let Some(s) = self.subscribed {
            return Ok(ServerMessage::Event(Event::Subscribed(s)));
        }
        if let Some(u) = self.unsubscribed {
            return Ok(ServerMessage::Event(Event::Unsubscribed { ch: u.ch, code: u.code, reason: u.reason }));
        }
        Err(FrameError("message has no known key".into()))
    }
}

/// Decodes every message of one frame into [`ServerMessage`]s, in order.
pub fn decode_frame(format: Format, payload: &[u8]) -> Vec<Result<ServerMessage, FrameError>> {
    let mut out = Vec::new();
    for_each_message::<Incoming, _>(format, payload, |m| out.push(m.and_then(Incoming::classify)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgpack(v: &serde_json::Value) -> Vec<u8> {
        rmp_serde::to_vec_named(v).unwrap()
    }

    #[test]
    fn frame_splits_batched_json_lines() {
        let payload = b"{\"pub\":{\"ch\":\"a\",\"off\":1,\"data\":{\"v\":1}}}\n{\"id\":3,\"ok\":{}}\r\n\n{\"pub\":{\"ch\":\"a\",\"off\":2,\"data\":\"x\\ny\"}}\n";
        let msgs: Vec<_> = decode_frame(Format::Json, payload).into_iter().map(Result::unwrap).collect();
        assert_eq!(msgs.len(), 3);
        assert_eq!(
            msgs[0],
            ServerMessage::Event(Event::Publication(Publication {
                ch: "a".into(),
                off: 1,
                data: json!({"v": 1}),
                historical: false,
                tags: None
            }))
        );
        assert_eq!(msgs[1], ServerMessage::Reply { id: 3, result: Ok(json!({})) });
        // A newline inside a JSON string is escaped on the wire, so it never splits a message.
        let ServerMessage::Event(Event::Publication(p)) = &msgs[2] else { panic!("{:?}", msgs[2]) };
        assert_eq!(p.data, json!("x\ny"));
    }

    #[test]
    fn frame_json_bad_line_does_not_hide_the_others() {
        let payload = b"{\"id\":1,\"ok\":{}}\nnot json\n{\"id\":2,\"error\":{\"code\":403,\"message\":\"no\"}}";
        let msgs = decode_frame(Format::Json, payload);
        assert_eq!(msgs.len(), 3);
        assert!(msgs[1].is_err());
        assert_eq!(
            msgs[2],
            Ok(ServerMessage::Reply { id: 2, result: Err(ErrorBody { code: 403, message: "no".into() }) })
        );
    }

    #[test]
    fn frame_splits_concatenated_msgpack_maps() {
        let mut payload = msgpack(&json!({"pub": {"ch": "pt:x", "off": 7, "data": {"v": 1.5, "q": "good"}}}));
        payload.extend(msgpack(&json!({"join": {"ch": "room:1", "client": "c1", "user": "u"}})));
        payload.extend(msgpack(&json!({"id": 9, "ok": {"offset": 8, "epoch": "e"}})));
        payload.extend(msgpack(&json!({"disconnect": {"code": 4008, "reason": "slow", "reconnect": true}})));
        let msgs: Vec<_> = decode_frame(Format::Msgpack, &payload).into_iter().map(Result::unwrap).collect();
        assert_eq!(
            msgs,
            vec![
                ServerMessage::Event(Event::Publication(Publication {
                    ch: "pt:x".into(),
                    off: 7,
                    data: json!({"v": 1.5, "q": "good"}),
                    historical: false,
                    tags: None
                })),
                ServerMessage::Event(Event::Join(Presence {
                    ch: "room:1".into(),
                    client: "c1".into(),
                    user: Some("u".into())
                })),
                ServerMessage::Reply { id: 9, result: Ok(json!({"offset": 8, "epoch": "e"})) },
                ServerMessage::Event(Event::Disconnect { code: 4008, reason: "slow".into(), reconnect: true }),
            ]
        );
    }

    #[test]
    fn frame_historical_publication_carries_its_flag_in_json_and_msgpack() {
        let hist = json!({"pub": {"ch": "pt:x", "off": 43, "data": {"v": 1, "t": 5, "q": "good"}, "hist": true}});
        let live = json!({"pub": {"ch": "pt:x", "off": 44, "data": {"v": 2, "t": 9, "q": "good"}}});
        let json_frame = format!("{hist}\n{live}");
        let mut msgpack_frame = msgpack(&hist);
        msgpack_frame.extend(msgpack(&live));
        for (format, payload) in [(Format::Json, json_frame.into_bytes()), (Format::Msgpack, msgpack_frame)] {
            let flags: Vec<(u64, bool)> = decode_frame(format, &payload)
                .into_iter()
                .map(|m| match m {
                    Ok(ServerMessage::Event(Event::Publication(p))) => (p.off, p.historical),
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(flags, [(43, true), (44, false)], "{format:?}");
        }
        // Written back as the wire has it: `hist` only when true.
        let p: Publication = serde_json::from_value(hist["pub"].clone()).unwrap();
        assert_eq!(serde_json::to_value(&p).unwrap(), hist["pub"]);
        let p: Publication = serde_json::from_value(live["pub"].clone()).unwrap();
        assert_eq!(serde_json::to_value(&p).unwrap(), live["pub"]);
    }

    #[test]
    fn frame_msgpack_garbage_ends_the_frame_with_an_error() {
        let mut payload = msgpack(&json!({"id": 1, "ok": {}}));
        payload.push(0xc1); // never used in MessagePack
        let msgs = decode_frame(Format::Msgpack, &payload);
        assert_eq!(msgs.len(), 2);
        assert!(msgs[0].is_ok());
        assert!(msgs[1].is_err());
    }

    #[test]
    fn frame_unsubscribed_is_an_event_naming_its_channel() {
        let line = br#"{"unsubscribed":{"ch":"room:1","code":4008,"reason":"missed","resubscribe":true}}"#;
        let msgs = decode_frame(Format::Json, line);
        let ended = Event::Unsubscribed { ch: "room:1".into(), code: 4008, reason: "missed".into() };
        assert_eq!(msgs, vec![Ok(ServerMessage::Event(ended))]);
    }

    #[test]
    fn frame_subscribed_push_carries_the_server_side_subscriptions() {
        let line =
            br#"{"subscribed":{"channels":{"a":{"epoch":"e","offset":3},"b":{"error":{"code":403,"message":"no"}}}}}"#;
        let msgs = decode_frame(Format::Json, line);
        let Ok(ServerMessage::Event(Event::Subscribed(body))) = &msgs[0] else { panic!("{msgs:?}") };
        let r: crate::reply::SubscribeReply = serde_json::from_value(body.clone()).unwrap();
        assert!(matches!(&r.channels["a"], crate::reply::ChannelResult::Subscribed(s) if s.offset == 3));
        assert_eq!(r.errors().map(|(ch, e)| (ch, e.code)).collect::<Vec<_>>(), vec![("b", 403)]);
    }

    #[test]
    fn frame_error_without_id_is_an_event() {
        let msgs = decode_frame(Format::Json, br#"{"id":0,"error":{"code":400,"message":"bad"}}"#);
        assert_eq!(msgs, vec![Ok(ServerMessage::Event(Event::Error(ErrorBody { code: 400, message: "bad".into() })))]);
    }

    #[test]
    fn frame_typed_fast_path_decodes_only_what_it_needs() {
        #[derive(Deserialize)]
        struct Off {
            #[serde(rename = "pub")]
            publication: Inner,
        }
        #[derive(Deserialize)]
        struct Inner {
            off: u64,
        }
        let mut offs = Vec::new();
        let payload = msgpack(&json!({"pub": {"ch": "a", "off": 4, "data": [1, 2]}}));
        let twice = [payload.clone(), payload].concat();
        for_each_message::<Off, _>(Format::Msgpack, &twice, |m| offs.push(m.unwrap().publication.off));
        assert_eq!(offs, vec![4, 4]);
    }
}
