//! The wire helpers of the feed's subscribers, which `rooms` and `soak` use too: the server
//! messages the bench reads, frames in and out, subscribe commands split into chunks and their
//! replies read per channel.

use std::ops::Range;

use serde::Deserialize;
use serde_json::Value;
use switchboard_client::frame::for_each_message;
use switchboard_protocol::message::ErrorBody;
use switchboard_protocol::Format;
use tokio_tungstenite::tungstenite::Message;

use crate::accounting::Tally;

/// Most channels one subscribe command names unless `--subscribe-chunk` says otherwise; the
/// server refuses commands naming more than its `limits.max_channels_per_subscribe` (10,000
/// by default).
pub const DEFAULT_SUBSCRIBE_CHUNK: usize = 1000;
/// Most bytes of channel names in one subscribe command, so that its frame stays under the
/// server's default `limits.max_frame_bytes` (64 KiB) whatever the chunk size.
const MAX_SUBSCRIBE_NAME_BYTES: usize = 48 * 1024;

/// The keys the bench reads from a server message; anything else (presence events) is skipped
/// without allocating. `P` is the publication as the reader wants it (the soak reads points'
/// own data).
#[derive(Deserialize)]
pub(crate) struct Incoming<P = PubIn> {
    #[serde(default)]
    pub id: Option<u32>,
    #[serde(default)]
    pub ok: Option<Value>,
    #[serde(default)]
    pub error: Option<ErrorBody>,
    #[serde(default = "Option::default", rename = "pub")]
    pub publication: Option<P>,
    #[serde(default)]
    pub disconnect: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
pub(crate) struct PubIn {
    pub ch: String,
    pub off: u64,
    pub data: Stamp,
}

/// What the load generator stamps into every publication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(crate) struct Stamp {
    /// Scheduled (feeds) or actual (rooms) publish time, unix µs.
    pub us: u64,
    /// Tick or iteration number.
    pub seq: u64,
}

/// A command as one frame in `format`.
pub(crate) fn encode(format: Format, cmd: &Value) -> Message {
    match format {
        Format::Json => Message::text(cmd.to_string()),
        Format::Msgpack => Message::binary(rmp_serde::to_vec_named(cmd).unwrap_or_default()),
    }
}

/// The payload of a data frame (`None` for control frames), or why the connection ended.
pub(crate) fn payload(msg: &Message) -> Result<Option<(Format, &[u8])>, String> {
    match msg {
        Message::Text(t) => Ok(Some((Format::Json, t.as_bytes()))),
        Message::Binary(b) => Ok(Some((Format::Msgpack, b))),
        Message::Close(f) => {
            Err(format!("closed by the server with code {}", f.as_ref().map(|f| u16::from(f.code)).unwrap_or(1005)))
        }
        _ => Ok(None),
    }
}

/// The payload of what a subscriber's connection gave next: as [`payload`], and the reason
/// when the stream failed or ended.
pub(crate) fn next_payload<E: std::fmt::Display>(
    next: &Option<Result<Message, E>>,
) -> Result<Option<(Format, &[u8])>, String> {
    match next {
        Some(Ok(m)) => payload(m),
        Some(Err(e)) => Err(format!("read: {e}")),
        None => Err("connection ended".into()),
    }
}

/// What one frame brought a subscriber that sent `chunks` subscribe commands (ids `1..=chunks`).
#[derive(Debug, Default)]
pub(crate) struct FrameRead {
    /// `deliver` took at least one publication as new.
    pub got: bool,
    /// The server refused a subscription: the connection does not hold its share.
    pub fail: Option<String>,
}

/// Reads the messages of one frame of a subscriber whose subscriptions are `held`:
/// publications go to `deliver` (which says whether one was new), the channels of each reply
/// to a subscribe command to `confirm`; disconnects and other server errors are noted in
/// `tally`.
pub(crate) fn read_frame<P: serde::de::DeserializeOwned, H>(
    (fmt, bytes): (Format, &[u8]),
    chunks: usize,
    held: &mut H,
    tally: &mut Tally,
    mut deliver: impl FnMut(&mut H, &P, &mut Tally) -> bool,
    confirm: impl Fn(&mut H, &str, Subscribed) -> Result<(), String>,
) -> FrameRead {
    let mut read = FrameRead::default();
    for_each_message::<Incoming<P>, _>(fmt, bytes, |m| {
        let Ok(m) = m else {
            tally.unexpected += 1;
            return;
        };
        if let Some(p) = &m.publication {
            read.got |= deliver(held, p, tally);
        } else if m.id.is_some_and(|id| (1..=chunks as u32).contains(&id)) {
            if let Some(e) = &m.error {
                read.fail = Some(format!("subscribe: error {}: {}", e.code, e.message));
            } else if let Some(ok) = &m.ok {
                let confirmed = parse_subscribe_ok(ok)
                    .and_then(|chs| chs.into_iter().try_for_each(|(name, o)| confirm(held, &name, o)));
                if let Err(e) = confirmed {
                    read.fail = Some(e);
                }
            }
        } else if m.disconnect.is_some() {
            tally.note_error("server sent disconnect");
        } else if let Some(e) = &m.error {
            tally.note_error(&format!("server error {}: {}", e.code, e.message));
        }
    });
    read
}

/// One channel's part of a subscribe reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Subscribed {
    /// Subscribed at `offset`; `last` is the initial value (`initial: true`): its offset and,
    /// when it carries one, its stamp.
    Ok {
        offset: u64,
        last: Option<(u64, Option<Stamp>)>,
    },
    Err(String),
}

/// The per-channel results of a subscribe `ok` body, `{"channels": {name: result}}`.
pub(crate) fn parse_subscribe_ok(ok: &Value) -> Result<Vec<(String, Subscribed)>, String> {
    let Some(channels) = ok.get("channels").and_then(Value::as_object) else {
        return Err(format!("subscribe reply without channels: {ok}"));
    };
    Ok(channels
        .iter()
        .map(|(name, v)| {
            let outcome = if let Some(e) = v.get("error") {
                Subscribed::Err(format!("subscribe {name}: {e}"))
            } else if let Some(offset) = v.get("offset").and_then(Value::as_u64) {
                let last = v.get("last").filter(|l| l.is_object()).and_then(|l| {
                    let off = l.get("off").and_then(Value::as_u64)?;
                    Some((off, l.get("data").and_then(|d| serde_json::from_value::<Stamp>(d.clone()).ok())))
                });
                Subscribed::Ok { offset, last }
            } else {
                Subscribed::Err(format!("subscribe {name}: no offset in {v}"))
            };
            (name.clone(), outcome)
        })
        .collect())
}

/// Splits `names` into subscribe commands of at most `max_count` channels and at most
/// [`MAX_SUBSCRIBE_NAME_BYTES`] of names each.
pub(crate) fn subscribe_chunks(names: &[String], max_count: usize) -> Vec<Range<usize>> {
    let max_count = max_count.max(1);
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, n) in names.iter().enumerate() {
        // The name, its quotes and a comma.
        let cost = n.len() + 3;
        if i > start && (i - start >= max_count || bytes + cost > MAX_SUBSCRIBE_NAME_BYTES) {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += cost;
    }
    if start < names.len() {
        out.push(start..names.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn feed_subscribe_chunks_respect_count_and_bytes() {
        let names: Vec<String> = (0..2500).map(|i| format!("bench:streams.{i}")).collect();
        let c = subscribe_chunks(&names, 1000);
        assert_eq!(c, vec![0..1000, 1000..2000, 2000..2500]);
        // Long names: the byte bound splits before the count bound.
        let long: Vec<String> = (0..100).map(|i| format!("{}{i}", "x".repeat(1000))).collect();
        let c = subscribe_chunks(&long, 1000);
        assert!(c.len() > 1);
        assert!(c
            .iter()
            .all(|r| long[r.clone()].iter().map(|n| n.len() + 3).sum::<usize>() <= MAX_SUBSCRIBE_NAME_BYTES));
        assert_eq!(c.iter().map(|r| r.len()).sum::<usize>(), 100, "every name once");
        assert_eq!(subscribe_chunks(&names[..1], 0), vec![0..1], "a zero chunk still makes progress");
        assert!(subscribe_chunks(&[], 10).is_empty());
    }

    #[test]
    fn feed_parses_subscribe_replies_with_and_without_values() {
        let ok = json!({"channels": {
            "a": {"epoch": "e", "offset": 4, "last": {"ch": "a", "off": 4, "data": {"v": 1, "us": 9, "seq": 0}}},
            "b": {"epoch": "e", "offset": 0, "last": null},
            "c": {"error": {"code": 403, "message": "no"}},
        }});
        let mut got = parse_subscribe_ok(&ok).unwrap();
        got.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(got[0].1, Subscribed::Ok { offset: 4, last: Some((4, Some(Stamp { us: 9, seq: 0 }))) });
        assert_eq!(got[1].1, Subscribed::Ok { offset: 0, last: None });
        assert!(matches!(&got[2].1, Subscribed::Err(e) if e.contains("403")));
        assert!(parse_subscribe_ok(&json!({})).is_err());
    }
}
