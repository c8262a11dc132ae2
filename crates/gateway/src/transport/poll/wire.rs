//! What a long-poll session's requests and answers carry: the batch a poll is answered with
//! (`{"seq":N,"messages":[...]}`), the command bodies a client posts (a subscribe without
//! `id` given the silent one, so the session learns its positions), what the client sees of
//! such a subscribe's reply, and the ids the session keeps for itself.

use bytes::Bytes;
use serde_json::value::RawValue;
use switchboard_protocol::code;
use switchboard_protocol::message::encode_error;
use switchboard_protocol::Format;

use crate::message::Kind;

/// Id of the subscribe a node sends when it takes a session over; its reply becomes the
/// recovered publications. Clients must not use this id.
pub const RESUBSCRIBE_ID: u32 = u32::MAX;
/// Id given to a client's subscribe that has none, so the session learns the positions; its
/// reply is not delivered (only errors, as `id` 0, like on a WebSocket).
pub const SILENT_ID: u32 = u32::MAX - 1;

/// A poll's answer: `{"seq":N,"messages":[...]}`.
pub(crate) fn batch_body(seq: u64, messages: &[Bytes]) -> Bytes {
    let mut out = Vec::with_capacity(batch_len(seq, messages));
    write_batch(&mut out, seq, messages);
    Bytes::from(out)
}

/// The length of [`batch_body`]`(seq, messages)`.
pub(crate) fn batch_len(seq: u64, messages: &[Bytes]) -> usize {
    let commas = messages.len().saturating_sub(1);
    joined_batch_len(seq, commas + messages.iter().map(|m| m.len()).sum::<usize>())
}

/// The length of a batch whose messages, joined by commas, take `joined` bytes.
pub(crate) fn joined_batch_len(seq: u64, joined: usize) -> usize {
    let digits = seq.checked_ilog10().map_or(1, |d| d as usize + 1);
    r#"{"seq":,"messages":[]}"#.len() + digits + joined
}

/// Appends [`batch_body`]`(seq, messages)` to `out`.
pub(crate) fn write_batch(out: &mut Vec<u8>, seq: u64, messages: &[Bytes]) {
    write_batch_start(out, seq);
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(m);
    }
    out.extend_from_slice(BATCH_END);
}

/// Appends a batch's opening, up to its first message: `{"seq":N,"messages":[`. The
/// messages follow, joined by commas, then [`BATCH_END`].
pub(crate) fn write_batch_start(out: &mut Vec<u8>, seq: u64) {
    out.extend_from_slice(br#"{"seq":"#);
    out.extend_from_slice(itoa::Buffer::new().format(seq).as_bytes());
    out.extend_from_slice(br#","messages":["#);
}

/// What closes a batch after its messages.
pub(crate) const BATCH_END: &[u8] = b"]}";

/// What the client sees of the reply to a subscribe it sent without `id`: nothing, or one
/// error (`id` 0, as on a WebSocket) when a channel was refused.
pub(crate) fn silent_reply(kind: &Kind) -> Option<Bytes> {
    let code = match kind {
        Kind::Reply { error: Some(code), .. } => *code,
        Kind::Reply { outcomes: Some(outcomes), .. } => outcomes.first_error()?.code,
        _ => return None,
    };
    Some(Bytes::from(encode_error(Format::Json, 0, code, "some channels could not be subscribed")))
}

/// Gives every subscribe without `id` the silent id (so positions are learned from its
/// reply) and collects the channels of unsubscribes. Publication data is never re-encoded:
/// only subscribe commands are rewritten.
pub(crate) fn rewrite_commands(body: &[u8]) -> Result<(Vec<Vec<u8>>, Vec<String>), crate::node::ApiError> {
    let bad = |e: String| crate::node::ApiError::new(code::BAD_REQUEST, e);
    let mut out = Vec::new();
    let mut unsubscribed = Vec::new();
    for raw in serde_json::Deserializer::from_slice(body).into_iter::<&RawValue>() {
        let raw = raw.map_err(|e| bad(format!("commands are not JSON: {e}")))?;
        let text = raw.get();
        let peek: Option<serde_json::Map<String, serde_json::Value>> =
            if text.contains("\"subscribe\"") || text.contains("\"unsubscribe\"") {
                serde_json::from_str(text).ok()
            } else {
                None
            };
        match peek {
            Some(mut cmd) if cmd.contains_key("subscribe") && !cmd.contains_key("id") => {
                cmd.insert("id".into(), serde_json::Value::from(SILENT_ID));
                out.push(serde_json::Value::Object(cmd).to_string().into_bytes());
            }
            Some(cmd) => {
                if let Some(list) = cmd.get("unsubscribe").and_then(|u| u.get("channels")).and_then(|c| c.as_array()) {
                    unsubscribed.extend(list.iter().filter_map(|c| c.as_str()).map(str::to_string));
                }
                out.push(text.as_bytes().to_vec());
            }
            None => out.push(text.as_bytes().to_vec()),
        }
    }
    if out.is_empty() {
        return Err(bad("no command in the body".into()));
    }
    Ok((out, unsubscribed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn poll_rewrite_gives_silent_subscribes_an_id_and_keeps_data_bytes() {
        let body = br#"{"subscribe":{"channels":["a"]}}
{"id":2,"publish":{"channel":"room:1","data":{"x":1.50,"big":123456789012345678901234567890}}}
{"id":3,"unsubscribe":{"channels":["b","c"]}}"#;
        let (out, unsub) = rewrite_commands(body).unwrap();
        let lines: Vec<String> = out.into_iter().map(|c| String::from_utf8(c).unwrap()).collect();
        assert_eq!(lines.len(), 3);
        let first: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(first["id"], SILENT_ID);
        assert!(lines[1].contains("1.50") && lines[1].contains("123456789012345678901234567890"));
        assert_eq!(unsub, vec!["b", "c"]);
        assert!(rewrite_commands(b"{not json").is_err());
        assert!(rewrite_commands(b"   ").is_err());
    }

    #[test]
    pub(crate) fn poll_batches_concatenate_messages() {
        let b = batch_body(4, &[Bytes::from_static(b"{\"a\":1}"), Bytes::from_static(b"{\"b\":2}")]);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v, serde_json::json!({"seq": 4, "messages": [{"a": 1}, {"b": 2}]}));
        assert_eq!(&batch_body(0, &[])[..], b"{\"seq\":0,\"messages\":[]}");
        let two = [Bytes::from_static(b"{\"a\":1}"), Bytes::from_static(b"[]")];
        for seq in [0, 9, 10, 99, 100, 12_345, u64::MAX] {
            for n in 0..=2 {
                assert_eq!(batch_len(seq, &two[..n]), batch_body(seq, &two[..n]).len(), "seq {seq}, {n} messages");
            }
        }
    }
}
