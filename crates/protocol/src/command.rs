//! Client → server commands (SPEC §2): `{"id": <u32>, "<command>": {...}}`.
//!
//! Decoding is two-step so that a frame with a valid envelope but a bad body still gets a 400
//! reply carrying its `id`, while a frame that is not a command at all is a protocol error
//! (close 4010). Publication data stays raw JSON text end to end: it is never re-serialized on
//! the JSON path.

use std::collections::HashMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::StreamPosition;

/// One decoded command.
#[derive(Debug)]
pub struct Command {
    /// Echoed in the reply; a command without id gets no reply on success.
    pub id: Option<u32>,
    pub body: CommandBody,
}

#[derive(Debug)]
pub enum CommandBody {
    Connect(ConnectRequest),
    Subscribe(SubscribeRequest),
    Unsubscribe(UnsubscribeRequest),
    Publish(PublishRequest),
    History(HistoryRequest),
    Presence(PresenceRequest),
    Ping(PingRequest),
    Refresh(RefreshRequest),
    /// `alarm_ack`, `alarm_shelve`, `alarm_unshelve`: an operator's action on an alarm.
    Alarm(AlarmAction, AlarmRequest),
    /// A well-formed envelope naming a command this server does not know (reply 404).
    Unknown(String),
    /// A known command whose body did not parse (reply 400).
    Invalid(String),
}

/// `connect`: a token, or the user name and password of a Basic user (for browsers, which
/// cannot set `Authorization` on a WebSocket handshake), and a name for logs.
#[derive(Default, Deserialize)]
pub struct ConnectRequest {
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// Passed to the application's connect hook (connections without credentials).
    #[serde(default)]
    pub data: Option<Box<RawValue>>,
}

/// Never prints the token or the password.
impl std::fmt::Debug for ConnectRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectRequest")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("name", &self.name)
            .finish()
    }
}

/// Unknown fields are refused (400 naming the field): a client asking for an option this
/// server does not know (a deadband, a rate) must not silently get every publication instead.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscribeRequest {
    pub channels: Vec<String>,
    /// Include each channel's last publication in the reply.
    #[serde(default)]
    pub initial: bool,
    /// Positions to recover from, per channel.
    #[serde(default)]
    pub recover: HashMap<String, StreamPosition>,
    /// Ceiling of deliveries per second for each of these subscriptions (the latest value
    /// always arrives, held back at most 1/F s).
    #[serde(default)]
    pub max_rate_hz: Option<f64>,
    /// Numeric point values (`v`) that moved less than this from the last one sent are not
    /// sent; the first value and quality changes always are.
    #[serde(default)]
    pub deadband: Option<Deadband>,
    /// Each channel's trend (point channels) in the reply, so a plot opens full.
    #[serde(default)]
    pub trend: Option<TrendOption>,
    /// Only publications whose tags match ([`crate::filter`]), live and recovered.
    #[serde(default)]
    pub filter: Option<Box<crate::filter::FilterSpec>>,
    /// `"fossil"`: live publications as Fossil deltas against the previous one
    /// ([`crate::message::encode_delta_publication`]).
    #[serde(default)]
    pub delta: Option<String>,
}

/// `"trend": {"window_s": 3600, "step_s": 1}`: the buckets of the last `window_s` seconds, each
/// `step_s` wide (default: the namespace's step).
#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrendOption {
    pub window_s: u64,
    #[serde(default)]
    pub step_s: Option<u64>,
}

/// A deadband: absolute (`{"abs": 0.5}`) or relative to the last value sent (`{"pct": 2}`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deadband {
    #[serde(default)]
    pub abs: Option<f64>,
    #[serde(default)]
    pub pct: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct UnsubscribeRequest {
    pub channels: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct PublishRequest {
    pub channel: String,
    pub data: Box<RawValue>,
    /// A publish retried with the same key on the same channel within the idempotency window
    /// answers the first result instead of publishing again ([`check_idempotency_key`]).
    #[serde(default, deserialize_with = "idempotency_key")]
    pub idempotency_key: Option<String>,
    /// Tags kept with the publication for subscribers' filters ([`crate::filter`]).
    #[serde(default, deserialize_with = "crate::filter::tags")]
    pub tags: Option<crate::filter::Tags>,
}

/// Reads an optional `idempotency_key`: a string (checked later by
/// [`check_idempotency_key`]) or `null`; any other value is an error naming the field.
pub fn idempotency_key<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Key;
    impl<'de> serde::de::Visitor<'de> for Key {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "idempotency_key: a string of 1 to {MAX_IDEMPOTENCY_KEY} characters of [A-Za-z0-9_.:-]")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_owned()))
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(Key)
        }
    }
    d.deserialize_option(Key)
}

/// The longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 128;

/// Checks a publish's `idempotency_key`: 1 to [`MAX_IDEMPOTENCY_KEY`] bytes of
/// `[A-Za-z0-9_.:-]` (room for UUIDs, ULIDs and `source:sequence` ids). The error names the
/// field.
pub fn check_idempotency_key(key: &str) -> Result<(), String> {
    let ok = (1..=MAX_IDEMPOTENCY_KEY).contains(&key.len())
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!("idempotency_key: expected 1 to {MAX_IDEMPOTENCY_KEY} characters of [A-Za-z0-9_.:-]"))
    }
}

#[derive(Debug, Deserialize)]
pub struct HistoryRequest {
    pub channel: String,
    #[serde(default)]
    pub since: Option<StreamPosition>,
    #[serde(default)]
    pub limit: Option<usize>,
}

#[derive(Debug, Deserialize)]
pub struct PresenceRequest {
    pub channel: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct PingRequest {
    /// `Some` whenever the field is present, `null` included (it is echoed as is).
    #[serde(default, deserialize_with = "present")]
    pub data: Option<Box<RawValue>>,
}

/// Deserializes a raw JSON field that may be `null` as `Some(null)`; only absence is `None`.
pub fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
pub struct RefreshRequest {
    pub token: String,
}

/// Which action an alarm command asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmAction {
    Ack,
    Shelve,
    Unshelve,
}

/// The body of the alarm commands: the alarm, an optional comment and, to shelve, for how long.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlarmRequest {
    pub alarm: String,
    #[serde(default)]
    pub comment: Option<String>,
    #[serde(default)]
    pub for_s: Option<f64>,
}

/// A frame that is not a command at all; the connection is closed with 4010.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame is not a JSON object: {0}")]
    NotJson(String),
    #[error("frame is not a MessagePack map: {0}")]
    NotMsgpack(String),
    #[error("frame names no command")]
    NoCommand,
    #[error("frame names more than one command")]
    ManyCommands,
}

/// Decodes every command of a JSON frame: one command, or several JSON objects one after the
/// other (the client may batch them `\n`-separated). All or nothing: a frame with any bad
/// command yields the error and no command runs.
pub fn decode_json_frame(frame: &[u8]) -> Result<Vec<Command>, DecodeError> {
    let mut out = Vec::new();
    for raw in serde_json::Deserializer::from_slice(frame).into_iter::<&RawValue>() {
        let raw = raw.map_err(|e| DecodeError::NotJson(e.to_string()))?;
        out.push(Command::from_json(raw.get().as_bytes())?);
    }
    if out.is_empty() {
        return Err(DecodeError::NoCommand);
    }
    Ok(out)
}

/// rmp-serde's depth setting for command frames: the command map and its body, then data as
/// deep as JSON data may be ([`crate::message::MAX_DATA_DEPTH`]); rmp-serde refuses the level
/// that reaches the setting, hence one more. Its default (1024) let a 64 KiB frame of one-byte
/// nested arrays overflow a worker thread's stack while building the value.
pub const MSGPACK_MAX_DEPTH: usize = 3 + crate::message::MAX_DATA_DEPTH;

/// Decodes every command of a MessagePack frame: one map, or several concatenated. All or
/// nothing, like [`decode_json_frame`]; trailing bytes that are not a whole map are an error.
pub fn decode_msgpack_frame(frame: &[u8]) -> Result<Vec<Command>, DecodeError> {
    let mut out = Vec::new();
    let mut rest = frame;
    while !rest.is_empty() {
        let mut cursor = std::io::Cursor::new(rest);
        let value: serde_json::Value = {
            let mut de = rmp_serde::Deserializer::new(&mut cursor);
            de.set_max_depth(MSGPACK_MAX_DEPTH);
            serde::Deserialize::deserialize(&mut de).map_err(|e| DecodeError::NotMsgpack(e.to_string()))?
        };
        let used = cursor.position() as usize;
        out.push(Command::from_value(value)?);
        rest = &rest[used..];
    }
    if out.is_empty() {
        return Err(DecodeError::NoCommand);
    }
    Ok(out)
}

impl Command {
    /// Decodes one JSON command.
    pub fn from_json(frame: &[u8]) -> Result<Command, DecodeError> {
        let env: Envelope<'_> = serde_json::from_slice(frame).map_err(|e| DecodeError::NotJson(e.to_string()))?;
        env.into_command()
    }

    /// Decodes one MessagePack command (a map with the same structure as the JSON form).
    pub fn from_msgpack(frame: &[u8]) -> Result<Command, DecodeError> {
        let mut de = rmp_serde::Deserializer::from_read_ref(frame);
        de.set_max_depth(MSGPACK_MAX_DEPTH);
        let value: serde_json::Value =
            serde::Deserialize::deserialize(&mut de).map_err(|e| DecodeError::NotMsgpack(e.to_string()))?;
        Command::from_value(value)
    }

    fn from_value(value: serde_json::Value) -> Result<Command, DecodeError> {
        let obj = match value {
            serde_json::Value::Object(map) => map,
            _ => return Err(DecodeError::NotMsgpack("not a map".into())),
        };
        let mut id = None;
        let mut found: Option<(String, String)> = None;
        for (k, v) in obj {
            if k == "id" {
                id = Some(
                    v.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| DecodeError::NotMsgpack("id must be a u32".into()))?,
                );
            } else if found.is_some() {
                return Err(DecodeError::ManyCommands);
            } else {
                found = Some((k, v.to_string()));
            }
        }
        let (name, body) = found.ok_or(DecodeError::NoCommand)?;
        Ok(Command { id, body: parse_body(&name, &body) })
    }
}

/// The outer object: `id` and exactly one command key with its body kept raw.
struct Envelope<'a> {
    id: Option<u32>,
    name: Option<std::borrow::Cow<'a, str>>,
    body: Option<&'a RawValue>,
    many: bool,
}

impl<'a> Envelope<'a> {
    fn into_command(self) -> Result<Command, DecodeError> {
        if self.many {
            return Err(DecodeError::ManyCommands);
        }
        match (self.name, self.body) {
            (Some(name), Some(body)) => Ok(Command { id: self.id, body: parse_body(&name, body.get()) }),
            _ => Err(DecodeError::NoCommand),
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Envelope<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Envelope<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a command object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut env = Envelope { id: None, name: None, body: None, many: false };
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "id" {
                        env.id = Some(map.next_value::<u32>()?);
                    } else {
                        let body: &'de RawValue = map.next_value()?;
                        if env.name.is_some() {
                            env.many = true;
                        } else {
                            env.name = Some(key);
                            env.body = Some(body);
                        }
                    }
                }
                Ok(env)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

fn parse_body(name: &str, body: &str) -> CommandBody {
    fn p<T: for<'de> Deserialize<'de>>(body: &str, wrap: fn(T) -> CommandBody) -> CommandBody {
        match serde_json::from_str::<T>(body) {
            Ok(v) => wrap(v),
            Err(e) => CommandBody::Invalid(e.to_string()),
        }
    }
    match name {
        "connect" => p(body, CommandBody::Connect),
        "subscribe" => p(body, CommandBody::Subscribe),
        "unsubscribe" => p(body, CommandBody::Unsubscribe),
        "publish" => p(body, CommandBody::Publish),
        "history" => p(body, CommandBody::History),
        "presence" => p(body, CommandBody::Presence),
        "ping" => p(body, CommandBody::Ping),
        "refresh" => p(body, CommandBody::Refresh),
        "alarm_ack" => p(body, |r| CommandBody::Alarm(AlarmAction::Ack, r)),
        "alarm_shelve" => p(body, |r| CommandBody::Alarm(AlarmAction::Shelve, r)),
        "alarm_unshelve" => p(body, |r| CommandBody::Alarm(AlarmAction::Unshelve, r)),
        other => CommandBody::Unknown(other.chars().take(64).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_decodes_subscribe_with_recovery() {
        let c = Command::from_json(
            br#"{"id":7,"subscribe":{"channels":["a","b"],"initial":true,"recover":{"a":{"epoch":"e","offset":41}}}}"#,
        )
        .unwrap();
        assert_eq!(c.id, Some(7));
        let CommandBody::Subscribe(s) = c.body else { panic!("not subscribe: {:?}", c.body) };
        assert_eq!(s.channels, vec!["a", "b"]);
        assert!(s.initial);
        assert_eq!(s.recover["a"], StreamPosition { epoch: "e".into(), offset: 41 });
    }

    #[test]
    fn command_keeps_publish_data_raw() {
        let c = Command::from_json(br#"{"publish":{"channel":"room:1","data":{"v": 1.50}}}"#).unwrap();
        assert_eq!(c.id, None);
        let CommandBody::Publish(p) = c.body else { panic!() };
        assert_eq!(p.data.get(), r#"{"v": 1.50}"#);
    }

    #[test]
    fn command_unknown_and_invalid_bodies_keep_their_id() {
        let c = Command::from_json(br#"{"id":1,"frobnicate":{}}"#).unwrap();
        assert!(matches!(c.body, CommandBody::Unknown(ref n) if n == "frobnicate"));
        let c = Command::from_json(br#"{"id":2,"subscribe":{"channels":5}}"#).unwrap();
        assert_eq!(c.id, Some(2));
        assert!(matches!(c.body, CommandBody::Invalid(_)));
    }

    #[test]
    fn command_rejects_garbage_and_ambiguous_frames() {
        assert!(matches!(Command::from_json(b"hello"), Err(DecodeError::NotJson(_))));
        assert!(matches!(Command::from_json(b"[1,2]"), Err(DecodeError::NotJson(_))));
        assert!(matches!(Command::from_json(b"{\"id\":1}"), Err(DecodeError::NoCommand)));
        assert!(matches!(Command::from_json(br#"{"ping":{},"publish":{}}"#), Err(DecodeError::ManyCommands)));
        assert!(Command::from_json(br#"{"id":-1,"ping":{}}"#).is_err());
    }

    #[test]
    fn command_frames_hold_one_pretty_printed_or_several_commands() {
        let pretty = b"{\n  \"id\": 1,\n  \"ping\": {\n    \"data\": null\n  }\n}";
        let cmds = decode_json_frame(pretty).unwrap();
        assert_eq!(cmds.len(), 1);
        let CommandBody::Ping(p) = &cmds[0].body else { panic!() };
        assert_eq!(p.data.as_ref().unwrap().get(), "null", "null data is present, not absent");
        let cmds = decode_json_frame(b"{\"id\":1,\"ping\":{}}\n{\"id\":2,\"ping\":{}}\n").unwrap();
        assert_eq!(cmds.iter().map(|c| c.id).collect::<Vec<_>>(), vec![Some(1), Some(2)]);
        assert!(decode_json_frame(b"{\"id\":1,\"ping\":{}} garbage").is_err());
        assert!(decode_json_frame(b"   ").is_err());
    }

    #[test]
    fn command_msgpack_frames_hold_concatenated_maps_and_reject_trailing_bytes() {
        let one = rmp_serde::to_vec_named(&serde_json::json!({"id": 1, "ping": {}})).unwrap();
        let two = rmp_serde::to_vec_named(&serde_json::json!({"id": 2, "ping": {}})).unwrap();
        let both = [one.clone(), two].concat();
        let cmds = decode_msgpack_frame(&both).unwrap();
        assert_eq!(cmds.iter().map(|c| c.id).collect::<Vec<_>>(), vec![Some(1), Some(2)]);
        assert!(decode_msgpack_frame(&[one, vec![0xc1]].concat()).is_err());
    }

    #[test]
    fn command_msgpack_nesting_is_bounded_not_a_stack_overflow() {
        // Regression: 60,000 nested one-byte arrays overflowed a worker's stack (found by the
        // hostile-input suite); now they are a decode error.
        let mut frame = b"\x82\xa2id\x01\xa4ping\x81\xa4data".to_vec();
        frame.extend(std::iter::repeat_n(0x91u8, 60_000));
        frame.push(0x90);
        assert!(decode_msgpack_frame(&frame).is_err());
        assert!(Command::from_msgpack(&frame).is_err());
        assert!(decode_msgpack_frame(&[0x91; 60_000]).is_err());
    }

    #[test]
    fn command_decodes_msgpack_like_json() {
        #[derive(serde::Serialize)]
        struct P {
            data: serde_json::Value,
        }
        #[derive(serde::Serialize)]
        struct C {
            id: u32,
            ping: P,
        }
        let bytes = rmp_serde::to_vec_named(&C { id: 9, ping: P { data: serde_json::json!({"t": 5}) } }).unwrap();
        let c = Command::from_msgpack(&bytes).unwrap();
        assert_eq!(c.id, Some(9));
        let CommandBody::Ping(p) = c.body else { panic!() };
        assert_eq!(p.data.unwrap().get(), r#"{"t":5}"#);
        assert!(Command::from_msgpack(b"\xc1").is_err());
    }

    #[test]
    fn command_idempotency_keys_are_checked() {
        for good in ["a", "0b6f-1e2a", "src:42", "A.b_c", &"k".repeat(MAX_IDEMPOTENCY_KEY)] {
            assert!(check_idempotency_key(good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "a{b}", "é", "a/b", &"k".repeat(MAX_IDEMPOTENCY_KEY + 1)] {
            assert!(check_idempotency_key(bad).unwrap_err().starts_with("idempotency_key:"), "{bad}");
        }
        let cmd = Command::from_json(br#"{"id":1,"publish":{"channel":"a","data":1,"idempotency_key":"k1"}}"#).unwrap();
        let CommandBody::Publish(p) = cmd.body else { panic!("not a publish") };
        assert_eq!(p.idempotency_key.as_deref(), Some("k1"));
        let cmd = Command::from_json(br#"{"id":1,"publish":{"channel":"a","data":1,"idempotency_key":7}}"#).unwrap();
        assert!(matches!(cmd.body, CommandBody::Invalid(ref e) if e.contains("idempotency_key")), "{:?}", cmd.body);
        let cmd = Command::from_json(br#"{"id":1,"publish":{"channel":"a","data":1,"idempotency_key":null}}"#).unwrap();
        assert!(matches!(cmd.body, CommandBody::Publish(PublishRequest { idempotency_key: None, .. })));
    }
}
