//! How a session's replies are written: the subscribe reply with every channel's result in
//! request order, and publications as `{ch, off, data}`; and how large they may grow: the
//! publications and trends of one reply are counted as they are added, within the budget of one
//! reply (`config::Limits::reply_budget`, [`ReplyBudget`]).

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use switchboard_protocol::code;
use switchboard_protocol::command::SubscribeRequest;
use switchboard_protocol::message::{ErrorBody, Pub};
use switchboard_protocol::Format;

pub(crate) use crate::message::Outcome;
use crate::node::ApiError;

pub(super) use crate::message::pub_of;

/// Serializes `{"channels": {name: result, ...}}` in request order.
pub(super) struct SubscribeReply<'a>(pub(super) &'a [(String, Outcome)]);

impl Serialize for SubscribeReply<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct OkBody<'a> {
            epoch: &'a str,
            offset: u64,
            last: Option<Pub<'a>>,
            recovered: Vec<Pub<'a>>,
            complete: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            trend: Option<&'a crate::trend::TrendReply>,
        }
        #[derive(Serialize)]
        struct ErrBody<'a> {
            error: &'a ErrorBody,
        }
        struct Channels<'a>(&'a [(String, Outcome)]);
        impl Serialize for Channels<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(self.0.len()))?;
                for (name, outcome) in self.0 {
                    match outcome {
                        Outcome::Ok { position, last, recovered, complete, trend } => m.serialize_entry(
                            name,
                            &OkBody {
                                epoch: &position.epoch,
                                offset: position.offset,
                                last: last.as_ref().map(|p| pub_of(name, p)),
                                recovered: recovered.iter().map(|p| pub_of(name, p)).collect(),
                                complete: *complete,
                                trend: trend.as_ref(),
                            },
                        )?,
                        Outcome::Err(e) => m.serialize_entry(name, &ErrBody { error: e })?,
                    }
                }
                m.end()
            }
        }
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("channels", &Channels(self.0))?;
        m.end()
    }
}

/// Bytes `msg` takes encoded in `format`. JSON is counted without being kept; MessagePack is
/// encoded and dropped (one item at a time, so the count never holds more than one
/// publication or trend).
pub(crate) fn encoded_len<T: Serialize>(format: Format, msg: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    match format {
        Format::Json => {
            let mut n = Count(0);
            // Counting cannot fail: the writer takes everything, and the values are plain
            // structs and valid raw JSON (as in `Format::encode`).
            let _ = serde_json::to_writer(&mut n, msg);
            n.0
        }
        Format::Msgpack => format.encode(msg).len(),
    }
}

/// What one channel's entry holds besides its publications and trend (name, epoch, offset,
/// keys): an upper estimate, in bytes.
const ENTRY_BYTES: usize = 96;

/// The byte budget of one subscribe reply (docs/protocol.md, "Reply bound"). Channels are
/// counted in request order as their results arrive: the last value, the recovered
/// publications and the trend of each. A channel whose data no longer fits gets 413 (and so does
/// every later channel that asks for data): the client subscribes them in another command. The
/// first channel admitted in a reply is never refused for what earlier channels took: its
/// last value goes whole (one publication), its recovered publications are cut to the newest
/// that fit with `complete: false`, and only a trend that alone exceeds the budget is refused.
pub(super) struct ReplyBudget {
    format: Format,
    limit: usize,
    used: usize,
    /// A channel of this reply was admitted.
    admitted: bool,
    /// A channel was refused for the budget: later channels asking for data are refused
    /// without being read.
    full: bool,
}

impl ReplyBudget {
    pub(super) fn new(format: Format, limit: usize) -> ReplyBudget {
        ReplyBudget { format, limit, used: 32, admitted: false, full: false }
    }

    /// Whether channels asking for data are refused from now on (their broker reads skipped).
    pub(super) fn is_full(&self) -> bool {
        self.full
    }

    /// The 413 of a channel that did not fit after others; `asked` names its data.
    pub(super) fn refusal(&self, asked: &str) -> ApiError {
        ApiError::new(
            code::TOO_LARGE,
            format!(
                "{asked}: the reply is full ({} bytes per reply); subscribe this channel in another command",
                self.limit
            ),
        )
    }

    /// Counts an error entry (it is part of the reply too).
    pub(super) fn count_error(&mut self, name: &str, e: &ErrorBody) {
        self.used += name.len() + e.message.len() + 40;
    }

    /// Takes `outcome` into the reply if it fits (see the type's docs). `asked` names the data
    /// the channel asked for, for the 413.
    pub(super) fn fit(&mut self, name: &str, outcome: Outcome, asked: &str) -> Result<Outcome, ApiError> {
        let Outcome::Ok { position, last, mut recovered, mut complete, trend } = outcome else { return Ok(outcome) };
        let fixed = ENTRY_BYTES + name.len() + position.epoch.len();
        let last_len = last.as_ref().map_or(0, |p| encoded_len(self.format, &pub_of(name, p)) + 1);
        let trend_len = trend.as_ref().map_or(0, |t| encoded_len(self.format, t));
        let mut sizes = Vec::with_capacity(recovered.len());
        let mut recovered_len = 0;
        for p in &recovered {
            let n = encoded_len(self.format, &pub_of(name, p)) + 1;
            recovered_len += n;
            sizes.push(n);
        }
        let data = last_len + trend_len + recovered_len;
        let room = self.limit.saturating_sub(self.used + fixed);
        if data > 0 && data > room {
            if self.full || self.admitted {
                self.full = true;
                return Err(self.refusal(asked));
            }
            // The first channel of the reply: refused only for a trend that alone is too large.
            if let Some(t) = trend.as_ref().filter(|_| trend_len > room) {
                return Err(crate::trend::too_large(t, self.limit));
            }
            // Recovered publications beyond what fits: the newest are kept (the live stream
            // continues from them) and the reply says the recovery is incomplete.
            let mut left = room.saturating_sub(last_len + trend_len);
            let mut keep = 0;
            for n in sizes.iter().rev() {
                if *n > left {
                    break;
                }
                left -= n;
                keep += 1;
            }
            if keep < recovered.len() {
                recovered.drain(..recovered.len() - keep);
                complete = false;
            }
            recovered_len = sizes.iter().rev().take(keep).sum();
        }
        self.used += fixed + last_len + trend_len + recovered_len;
        self.admitted = true;
        Ok(Outcome::Ok { position, last, recovered, complete, trend })
    }
}

/// The data a subscribe asks for on `name` (`trend`, `recovered`, `initial`), for its 413; none
/// when the channel's result is only its position.
pub(super) fn asked(req: &SubscribeRequest, name: &str) -> Option<String> {
    let parts: Vec<&str> =
        [(req.trend.is_some(), "trend"), (req.recover.contains_key(name), "recovered"), (req.initial, "initial")]
            .into_iter()
            .filter_map(|(yes, what)| yes.then_some(what))
            .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use serde_json::{json, Value};
    use switchboard_protocol::Format;

    use crate::config::Config;
    use crate::node::Node;
    use crate::outbox::tests::TestWire;
    use crate::session::Session;

    /// A node whose connections queue at most `max_pending` bytes (replies carry half).
    fn node(max_pending: usize) -> Arc<Node> {
        let env = vec![("SWITCHBOARD_MAX_PENDING_BYTES".to_string(), max_pending.to_string())];
        let config = Config::load(None, env, &[]).unwrap();
        Node::new(config, Arc::new(switchboard_broker::MemoryBroker::new()))
    }

    fn session(node: &Arc<Node>) -> (Session, Arc<TestWire>) {
        let wire = TestWire::open(1 << 30);
        let Ok(outbox) = node.register(Format::Json, wire.clone()) else { panic!("registered") };
        (Session::new(node.clone(), outbox), wire)
    }

    /// Sends `frame` and returns its reply with the reply's size in bytes.
    async fn command(s: &mut Session, wire: &TestWire, frame: Value) -> (Value, usize) {
        s.handle_payload(frame.to_string().as_bytes()).await.unwrap();
        s.flush();
        let frames = wire.frames();
        let (_, payload) = frames
            .into_iter()
            .rev()
            .find(|(_, p)| serde_json::from_slice::<Value>(p).is_ok_and(|m| m["id"] == frame["id"]))
            .unwrap();
        (serde_json::from_slice(&payload).unwrap(), payload.len())
    }

    async fn publish(node: &Node, ch: &str, data: Value) {
        let raw = serde_json::value::to_raw_value(&data).unwrap();
        let checked = node.check_own(ch, Arc::new(raw)).unwrap();
        node.publish(checked).await.unwrap();
    }

    #[tokio::test]
    async fn reply_subscribe_past_the_budget_is_413_and_a_later_command_takes_the_rest() {
        let node = node(64 * 1024);
        let blob = "x".repeat(10_000);
        let channels: Vec<String> = (0..10).map(|i| format!("room:big{i}")).collect();
        for ch in &channels {
            publish(&node, ch, json!({ "blob": blob })).await;
        }
        let (mut s, wire) = session(&node);
        let (r, size) =
            command(&mut s, &wire, json!({"id": 1, "subscribe": {"channels": channels, "initial": true}})).await;
        assert!(size <= 32 * 1024 + 10_100, "a reply of {size} bytes");
        let refused: Vec<String> =
            channels.iter().filter(|ch| r["ok"]["channels"][ch.as_str()]["error"]["code"] == 413).cloned().collect();
        let taken = channels.len() - refused.len();
        assert!((1..channels.len()).contains(&taken), "{r}");
        // The taken ones are the first, in request order; the 413 names the data asked for.
        assert_eq!(refused, channels[taken..].to_vec());
        let message = r["ok"]["channels"][refused[0].as_str()]["error"]["message"].as_str().unwrap();
        assert!(message.contains("initial"), "{message}");
        assert_eq!(node.metrics.subscriptions.load(std::sync::atomic::Ordering::Relaxed), taken as u64);
        let (r, _) =
            command(&mut s, &wire, json!({"id": 2, "subscribe": {"channels": refused, "initial": true}})).await;
        assert_eq!(r["ok"]["channels"][refused[0].as_str()]["last"]["data"]["blob"], blob.as_str(), "{r}");
    }

    #[tokio::test]
    async fn reply_recovery_larger_than_a_reply_keeps_the_newest_and_says_incomplete() {
        let node = node(64 * 1024);
        let ch = "room:rec";
        let blob = "y".repeat(3_000);
        for i in 1..=40 {
            publish(&node, ch, json!({ "i": i, "blob": blob })).await;
        }
        let (mut s, wire) = session(&node);
        let epoch = node.broker.last_or_start(ch).await.unwrap().0.epoch.to_string();
        let cmd = json!({"id": 1, "subscribe": {"channels": [ch], "recover": {ch: {"epoch": epoch, "offset": 0}}}});
        let (r, size) = command(&mut s, &wire, cmd).await;
        assert!(size <= 32 * 1024, "a reply of {size} bytes");
        let c = &r["ok"]["channels"][ch];
        assert_eq!(c["complete"], false, "a cut recovery never looks complete");
        let offs: Vec<u64> = c["recovered"].as_array().unwrap().iter().map(|p| p["off"].as_u64().unwrap()).collect();
        assert!(!offs.is_empty() && offs.len() < 40);
        assert_eq!(offs, ((41 - offs.len() as u64)..=40).collect::<Vec<_>>(), "the newest, up to the offset");
        assert_eq!(c["offset"], 40);
    }

    #[tokio::test]
    async fn reply_history_past_the_budget_says_more_and_pages_with_since() {
        let node = node(64 * 1024);
        let ch = "room:hist";
        let blob = "z".repeat(2_000);
        for i in 1..=50 {
            publish(&node, ch, json!({ "i": i, "blob": blob })).await;
        }
        let (mut s, wire) = session(&node);
        let mut got = Vec::new();
        let mut since = Value::Null;
        for id in 1..=20 {
            let mut body = json!({"channel": ch, "limit": 1000});
            if !since.is_null() {
                body["since"] = since.clone();
            }
            let (r, size) = command(&mut s, &wire, json!({"id": id, "history": body})).await;
            assert!(size <= 32 * 1024 + 2_100, "a reply of {size} bytes");
            let ok = &r["ok"];
            assert_eq!(ok["complete"], true);
            let pubs = ok["publications"].as_array().unwrap();
            got.extend(pubs.iter().map(|p| p["off"].as_u64().unwrap()));
            if ok["more"] == false {
                break;
            }
            since = json!({"epoch": ok["epoch"], "offset": pubs.last().unwrap()["off"]});
        }
        assert_eq!(got, (1..=50).collect::<Vec<u64>>());
        // Without `since`: the newest `limit`, from their first on.
        let (r, _) = command(&mut s, &wire, json!({"id": 30, "history": {"channel": ch, "limit": 5}})).await;
        let offs: Vec<u64> =
            r["ok"]["publications"].as_array().unwrap().iter().map(|p| p["off"].as_u64().unwrap()).collect();
        assert_eq!((offs, &r["ok"]["more"]), (vec![46, 47, 48, 49, 50], &json!(false)));
        let (r, _) = command(&mut s, &wire, json!({"id": 31, "history": {"channel": ch, "limit": 40}})).await;
        let first = r["ok"]["publications"][0]["off"].as_u64().unwrap();
        assert_eq!((first, &r["ok"]["more"]), (11, &json!(true)));
    }
}
