//! The subscribe-again rule: which channels a subscriber asks for again, when, and from where.
//!
//! A subscribe reply refuses some channels only for now (SPEC §2, docs/protocol.md):
//! - **413** past the reply's byte budget ("Reply bound"): the channel goes again in the next
//!   command, as long as each reply takes some channel. A 413 of a reply that took none is the
//!   channel's own (e.g. a trend larger than any reply) and final. [`SubscribeAll`] owns this
//!   part, and [`Client::subscribe_all`] drives it.
//! - **503** its broker shard is failing over, and an **`unsubscribed`** push (the server ended
//!   the channel, e.g. its shard went down): the channel waits and is subscribed again after a
//!   delay that doubles from [`RETRY_FIRST`] to [`RETRY_MOST`] while it keeps being refused,
//!   recovering from where its stream was ([`Streams`]). [`Subscriber`] owns this part, on top
//!   of [`SubscribeAll`], and is the whole loop of a subscriber on one connection: it reads the
//!   connection's events, delivers publications once and in order, and hands back what a
//!   program reports ([`Update`]).
//!
//! - A publication of a `delta: "fossil"` subscription that cannot be rebuilt
//!   ([`Event::DeltaFailed`]) leaves a hole in the channel's stream while the server still holds
//!   the subscription: [`Subscriber`] stops delivering the channel, unsubscribes it and
//!   subscribes it again at once with `recover`, like a channel the server ended. The
//!   recovery fills the hole; where history no longer holds it, it is a gap as any other.
//!
//! `switchboard sub` and `switchboard bench trend` use these; no caller repeats the rule.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use serde_json::json;
use switchboard_protocol::message::ErrorBody;
use tokio::time::Instant;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::reply::{ChannelResult, SubscribeOptions, SubscribeReply};
use crate::resume::{Delivery, Gap, Streams};

/// The first delay before a channel refused for now (503) is subscribed again, and the
/// longest: the delay doubles from one to the other while the channel keeps being refused.
pub const RETRY_FIRST: Duration = Duration::from_millis(500);
pub const RETRY_MOST: Duration = Duration::from_secs(5);

/// Reply code: past the reply's byte budget.
const TOO_LARGE: u16 = 413;
/// Reply code: the channel's broker shard is unavailable.
const UNAVAILABLE: u16 = 503;
/// Reply code: the connection holds this subscription already.
const CONFLICT: u16 = 409;

/// One subscribe carried out in as many commands as the server's reply budget needs: the
/// channels a reply refused with 413 go again, in request order, in the next command, while
/// each reply takes some channel.
///
/// Pure steps, so that a caller times each command if it wants to (the bench does):
///
/// ```no_run
/// # async fn demo(client: &switchboard_client::Client) -> switchboard_client::Result<()> {
/// use switchboard_client::{SubscribeAll, SubscribeOptions};
/// let mut all = SubscribeAll::new(SubscribeOptions::new(["a", "b"]).initial(true));
/// while let Some(command) = all.next_command() {
///     let reply = client.subscribe(command).await?;
///     all.accept(reply);
/// }
/// let reply = all.finish(); // every channel's final result
/// # Ok(()) }
/// ```
///
/// [`Client::subscribe_all`] is this loop.
#[derive(Debug, Clone)]
pub struct SubscribeAll {
    /// The options of every command; `channels` are the ones still to ask.
    options: SubscribeOptions,
    results: HashMap<String, ChannelResult>,
}

impl SubscribeAll {
    pub fn new(options: SubscribeOptions) -> SubscribeAll {
        SubscribeAll { options, results: HashMap::new() }
    }

    /// The next command to send, or `None` once every channel has its final result.
    pub fn next_command(&self) -> Option<SubscribeOptions> {
        if self.options.channels.is_empty() {
            return None;
        }
        let mut command = self.options.clone();
        let asked: HashSet<&str> = self.options.channels.iter().map(String::as_str).collect();
        command.recover.retain(|ch, _| asked.contains(ch.as_str()));
        Some(command)
    }

    /// Applies the reply to the last [`SubscribeAll::next_command`]: 413 channels stay for the
    /// next command when the reply took some channel; every other result is final.
    pub fn accept(&mut self, mut reply: SubscribeReply) {
        let took = reply.channels.values().any(|r| matches!(r, ChannelResult::Subscribed(_)));
        let mut again = Vec::new();
        for ch in std::mem::take(&mut self.options.channels) {
            let result = reply.channels.remove(&ch).unwrap_or_else(|| ChannelResult::Error {
                error: ErrorBody { code: 500, message: "no result for this channel in the reply".into() },
            });
            match result {
                ChannelResult::Error { error } if error.code == TOO_LARGE && took => again.push(ch),
                result => {
                    self.results.insert(ch, result);
                }
            }
        }
        self.options.channels = again;
    }

    /// Every channel's final result (channels never asked yet have none).
    pub fn finish(self) -> SubscribeReply {
        SubscribeReply { channels: self.results }
    }
}

impl Client {
    /// `subscribe` of channels however many the server's reply budget takes per command: the
    /// channels a reply refuses with 413 are subscribed again in further commands while each
    /// reply takes some ([`SubscribeAll`]). The reply holds every channel's final result; a 413
    /// left in it was refused by a reply that took none (the channel's own data is larger than
    /// a reply).
    pub async fn subscribe_all(&self, options: SubscribeOptions) -> Result<SubscribeReply> {
        let mut all = SubscribeAll::new(options);
        while let Some(command) = all.next_command() {
            all.accept(self.subscribe(command).await?);
        }
        Ok(all.finish())
    }
}

/// What a [`Subscriber`] hands back, in the order it happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// A publication to deliver: once, in offset order per channel.
    Delivery(Delivery),
    /// Publications of a channel that could not be recovered, reported before the ones that
    /// follow it; `followed`: some do (what history still held, the channel's latest value).
    Gap { gap: Gap, followed: bool },
    /// The channel is not subscribed for now (`reason`: a 503's message, the server's reason
    /// for ending it, or why a delta could not be rebuilt); it is subscribed again after a
    /// delay (at once when nothing else waits), with `recover`.
    Waiting { ch: String, reason: String },
    /// The server refused the channel for good; the subscriber has dropped it.
    Refused { ch: String, error: ErrorBody },
    /// Any other event of the connection: presence, a disconnect notice, an error reply
    /// nobody waited for, and [`Event::Closed`], the last one (then make a new connection and
    /// call [`Subscriber::reconnected`]).
    Event(Event),
}

/// Channels in the order they came, each once, however many.
#[derive(Debug, Default)]
struct Waiting {
    order: Vec<String>,
    names: HashSet<String>,
}

impl Waiting {
    fn push(&mut self, ch: String) {
        if self.names.insert(ch.clone()) {
            self.order.push(ch);
        }
    }

    fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

impl FromIterator<String> for Waiting {
    fn from_iter<I: IntoIterator<Item = String>>(channels: I) -> Waiting {
        let mut w = Waiting::default();
        channels.into_iter().for_each(|ch| w.push(ch));
        w
    }
}

/// A subscriber of a set of channels on one connection at a time: the subscribe-again rule
/// (module docs) with the delivery rule of [`Streams`].
///
/// Drive it with [`Subscriber::next`]; it subscribes what is due, waits for the connection's
/// events and the retry time, and returns one [`Update`] at a time. Channels refused for now
/// (503) or ended by the server (`unsubscribed`) wait and are subscribed again with `recover`
/// from their position; a new connection ([`Subscriber::reconnected`]) subscribes every channel
/// again the same way. Who may call what: one task owns the subscriber and the connection it
/// drives; the client's events must not be taken by anybody else.
#[derive(Debug)]
pub struct Subscriber {
    /// What every command asks besides channels and positions (initial, sampling, trend).
    options: SubscribeOptions,
    streams: Streams,
    /// Channels to subscribe (again) at `retry_at`, in the order they came.
    waiting: Waiting,
    retry_at: Option<Instant>,
    /// The delay after the next round that leaves channels waiting.
    retry_in: Duration,
    /// Updates found and not yet handed back.
    ready: VecDeque<Update>,
}

impl Subscriber {
    /// A subscriber of `options.channels`, due at once. `options.initial` asks each channel's
    /// latest value at its first subscription; resubscriptions ask it always (it ends a gap).
    pub fn new(options: SubscribeOptions) -> Subscriber {
        let waiting = options.channels.iter().cloned().collect();
        let streams = Streams::new(options.initial).with_filter(options.filter.is_some());
        let options = SubscribeOptions { channels: Vec::new(), recover: HashMap::new(), ..options };
        Subscriber {
            options,
            streams,
            waiting,
            retry_at: Some(Instant::now()),
            retry_in: RETRY_FIRST,
            ready: VecDeque::new(),
        }
    }

    /// Each subscribed channel's position.
    pub fn streams(&self) -> &Streams {
        &self.streams
    }

    /// The channels waiting to be subscribed (again).
    pub fn waiting(&self) -> &[String] {
        &self.waiting.order
    }

    /// When the waiting channels are asked again; `None` when none wait.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at.filter(|_| !self.waiting.is_empty())
    }

    /// A new connection: every channel is subscribed again at once, recovering from its position.
    pub fn reconnected(&mut self) {
        let known: Vec<String> = self.streams.channels().map(str::to_string).collect();
        for ch in known {
            self.wait(ch);
        }
        self.retry_at = Some(Instant::now());
        self.retry_in = RETRY_FIRST;
    }

    /// The server ended `ch` (`unsubscribed`): subscribed again at once when nothing else
    /// waits, else with the channels already waiting.
    pub fn unsubscribed(&mut self, ch: &str) {
        if !self.streams.knows(ch) {
            return;
        }
        if self.waiting.is_empty() {
            self.retry_at = Some(Instant::now());
            self.retry_in = RETRY_FIRST;
        }
        self.wait(ch.to_string());
    }

    fn wait(&mut self, ch: String) {
        self.waiting.push(ch);
    }

    /// An update already found, without waiting for anything.
    pub fn try_next(&mut self) -> Option<Update> {
        self.ready.pop_front()
    }

    /// The next update: subscribes the waiting channels when they are due and reads the
    /// connection's events meanwhile. `Err` only when a subscribe fails otherwise than by the
    /// connection's end (whose [`Event::Closed`] comes as an update).
    ///
    /// Dropping the future while it waits loses nothing. Dropped during a subscribe, the
    /// channels of that subscribe keep waiting and are asked again; those it had subscribed on
    /// the server then answer 409, which keeps a channel already followed streaming (and
    /// refuses one never subscribed before: drop the future mid-subscribe only to stop).
    pub async fn next(&mut self, client: &mut Client) -> Result<Update> {
        loop {
            if let Some(u) = self.ready.pop_front() {
                return Ok(u);
            }
            let due = self.retry_at();
            tokio::select! {
                _ = sleep_until(due), if due.is_some() => match self.subscribe_due(client).await {
                    Ok(()) => {}
                    // The connection ended: its Closed event follows; the channels keep waiting.
                    Err(Error::Closed { .. }) => self.retry_at = None,
                    Err(e) => return Err(e),
                },
                ev = client.next_event() => match ev {
                    Some(Event::Publication(p)) => {
                        if let Some(d) = self.streams.live(p) {
                            return Ok(Update::Delivery(d));
                        }
                    }
                    Some(Event::Unsubscribed { ch, reason, .. }) if self.streams.knows(&ch) => {
                        self.unsubscribed(&ch);
                        return Ok(Update::Waiting { ch, reason });
                    }
                    // Later pushes of the channel, already on their way, fail the same way
                    // (they build on the one that failed) or would skip the hole: the pause
                    // drops them until the resubscription's result. A failure at an offset
                    // that result covers was an older subscription's (the reply may be taken
                    // before the events queued ahead of it): nothing is missing.
                    Some(Event::DeltaFailed { ch, off, error })
                        if self.streams.position(&ch).is_some_and(|p| off > p.offset) && self.streams.pause(&ch) =>
                    {
                        // The server still holds the subscription: the unsubscribe goes first
                        // on the connection, so the subscribe that follows is taken anew.
                        // A connection that ended meanwhile reports it with its Closed event.
                        let _ = client.notify("unsubscribe", &json!({ "channels": [&ch] }));
                        self.unsubscribed(&ch);
                        let reason = format!("publication {off} could not be rebuilt from its delta: {error}");
                        return Ok(Update::Waiting { ch, reason });
                    }
                    Some(Event::DeltaFailed { .. }) => {}
                    Some(ev) => return Ok(Update::Event(ev)),
                    None => return Ok(Update::Event(Event::Closed { code: crate::client::ABNORMAL_CLOSE, reason: String::new() })),
                },
            }
        }
    }

    /// Subscribes the waiting channels now (a round of [`Client::subscribe_all`]) and queues
    /// what came of it for [`Subscriber::next`]. A program calls it first to report a refused
    /// first subscribe at once; `next` calls it when the waiting channels are due.
    pub async fn subscribe_due(&mut self, client: &Client) -> Result<()> {
        if self.waiting.is_empty() {
            return Ok(());
        }
        let command = self.command();
        let reply = client.subscribe_all(command.clone()).await?;
        self.accept(&command.channels, reply);
        Ok(())
    }

    /// The command of the waiting channels: known ones recover from their position.
    fn command(&self) -> SubscribeOptions {
        let mut command = self.streams.subscribe_options(self.waiting.order.iter().cloned());
        command.initial = self.options.initial || command.channels.iter().any(|ch| self.streams.knows(ch));
        command.max_rate_hz = self.options.max_rate_hz;
        command.deadband = self.options.deadband.clone();
        command.trend = self.options.trend.clone();
        command.delta = self.options.delta.clone();
        command.filter = self.options.filter.clone();
        command
    }

    /// Applies the round's final results to `asked` (in their order): subscribed ones deliver,
    /// 503 ones keep waiting, the others are refused for good.
    fn accept(&mut self, asked: &[String], mut reply: SubscribeReply) {
        let mut still = Vec::new();
        for ch in asked {
            let result = reply.channels.remove(ch).unwrap_or_else(|| ChannelResult::Error {
                error: ErrorBody { code: 500, message: "no result for this channel in the reply".into() },
            });
            match result {
                ChannelResult::Subscribed(s) => {
                    let resumed = self.streams.accept(ch, &s);
                    let followed = !resumed.deliveries.is_empty();
                    self.ready.extend(resumed.gap.map(|gap| Update::Gap { gap, followed }));
                    self.ready.extend(resumed.deliveries.into_iter().map(Update::Delivery));
                }
                ChannelResult::Error { error } if error.code == UNAVAILABLE => {
                    self.ready.push_back(Update::Waiting { ch: ch.clone(), reason: error.message });
                    still.push(ch.clone());
                }
                // Already subscribed on this connection: it streams on from its position.
                ChannelResult::Error { error } if error.code == CONFLICT && self.streams.knows(ch) => {}
                ChannelResult::Error { error } => {
                    self.streams.forget(ch);
                    self.ready.push_back(Update::Refused { ch: ch.clone(), error });
                }
            }
        }
        self.waiting = still.into_iter().collect();
        if self.waiting.is_empty() {
            self.retry_at = None;
            self.retry_in = RETRY_FIRST;
        } else {
            self.retry_at = Some(Instant::now() + self.retry_in);
            self.retry_in = (self.retry_in * 2).min(RETRY_MOST);
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Publication;
    use crate::reply::Subscribed;
    use serde_json::json;

    fn ok(ch: &str, offset: u64) -> ChannelResult {
        ChannelResult::Subscribed(Subscribed {
            epoch: "e".into(),
            offset,
            last: (offset > 0).then(|| Publication {
                ch: ch.into(),
                off: offset,
                data: json!(offset),
                historical: false,
                tags: None,
            }),
            recovered: Vec::new(),
            complete: true,
            trend: None,
        })
    }

    fn refused(code: u16) -> ChannelResult {
        ChannelResult::Error { error: ErrorBody { code, message: format!("error {code}") } }
    }

    fn reply(results: Vec<(&str, ChannelResult)>) -> SubscribeReply {
        SubscribeReply { channels: results.into_iter().map(|(ch, r)| (ch.to_string(), r)).collect() }
    }

    fn codes(r: &SubscribeReply) -> Vec<(String, u16)> {
        let mut v: Vec<(String, u16)> = r
            .channels
            .iter()
            .map(|(ch, r)| {
                (
                    ch.clone(),
                    match r {
                        ChannelResult::Subscribed(_) => 200,
                        ChannelResult::Error { error } => error.code,
                    },
                )
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn resubscribe_413_channels_go_again_in_order_while_replies_take_some() {
        let mut all = SubscribeAll::new(SubscribeOptions::new(["a", "b", "c", "d"]).initial(true).recover("c", "e", 4));
        let first = all.next_command().unwrap();
        assert_eq!(first.channels, ["a", "b", "c", "d"]);
        all.accept(reply(vec![("a", ok("a", 1)), ("b", refused(403)), ("c", refused(413)), ("d", refused(413))]));
        let second = all.next_command().unwrap();
        assert_eq!(second.channels, ["c", "d"], "request order kept");
        assert!(second.initial && second.recover.contains_key("c") && second.recover.len() == 1);
        all.accept(reply(vec![("c", ok("c", 5)), ("d", refused(413))]));
        assert_eq!(all.next_command().unwrap().channels, ["d"]);
        assert!(all.next_command().unwrap().recover.is_empty(), "positions only of the channels asked");
        all.accept(reply(vec![("d", ok("d", 2))]));
        assert!(all.next_command().is_none());
        let r = all.finish();
        assert_eq!(codes(&r), [("a".into(), 200), ("b".into(), 403), ("c".into(), 200), ("d".into(), 200)]);
    }

    #[test]
    fn resubscribe_413_of_a_reply_that_took_none_is_final() {
        let mut all = SubscribeAll::new(SubscribeOptions::new(["big", "x"]));
        all.accept(reply(vec![("big", refused(413)), ("x", refused(503))]));
        assert!(all.next_command().is_none(), "no progress: the 413 is the channel's own");
        assert_eq!(codes(&all.finish()), [("big".into(), 413), ("x".into(), 503)]);
    }

    #[test]
    fn resubscribe_missing_result_is_an_error_of_its_channel() {
        let mut all = SubscribeAll::new(SubscribeOptions::new(["a", "b"]));
        all.accept(reply(vec![("a", ok("a", 0))]));
        assert_eq!(codes(&all.finish()), [("a".into(), 200), ("b".into(), 500)]);
    }

    fn subscriber(channels: &[&str]) -> Subscriber {
        Subscriber::new(SubscribeOptions::new(channels.iter().copied()).initial(true).max_rate_hz(5.0))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn resubscribe_503_waits_with_a_doubling_delay_and_recovers() {
        let mut s = subscriber(&["a", "b", "c"]);
        assert!(s.retry_at().is_some_and(|t| t <= Instant::now()), "due at once");
        let first = s.command();
        assert_eq!(first.channels, ["a", "b", "c"]);
        assert_eq!((first.initial, first.max_rate_hz), (true, Some(5.0)));
        let t0 = Instant::now();
        s.accept(&first.channels, reply(vec![("a", ok("a", 3)), ("b", refused(503)), ("c", refused(403))]));
        let updates: Vec<Update> = s.ready.drain(..).collect();
        assert!(matches!(&updates[0], Update::Delivery(d) if d.ch == "a" && d.off == 3), "{updates:?}");
        assert!(matches!(&updates[1], Update::Waiting { ch, .. } if ch == "b"));
        assert!(matches!(&updates[2], Update::Refused { ch, error } if ch == "c" && error.code == 403));
        assert_eq!(s.waiting(), ["b"]);
        let mut delays = Vec::new();
        for _ in 0..6 {
            let at = s.retry_at().unwrap();
            delays.push((at - t0).as_millis() / 100 * 100);
            let again = s.command();
            assert_eq!(again.channels, ["b"]);
            s.accept(&again.channels, reply(vec![("b", refused(503))]));
        }
        // Each round is taken at once here, so each delay is measured from about t0.
        assert_eq!(delays, [500, 1000, 2000, 4000, 5000, 5000]);
        s.accept(&["b".to_string()], reply(vec![("b", ok("b", 7))]));
        assert!(s.retry_at().is_none() && s.waiting().is_empty());
        assert_eq!(s.retry_in, RETRY_FIRST, "the delay starts over once nothing waits");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn resubscribe_unsubscribed_and_reconnected_channels_recover_from_their_position() {
        let mut s = subscriber(&["a", "b"]);
        let first = s.command();
        s.accept(&first.channels, reply(vec![("a", ok("a", 3)), ("b", ok("b", 0))]));
        s.ready.clear();
        s.unsubscribed("nobody");
        assert!(s.retry_at().is_none(), "an unknown channel is not ours");
        s.unsubscribed("a");
        assert!(s.retry_at().is_some_and(|t| t <= Instant::now()), "at once when nothing waits");
        let again = s.command();
        assert_eq!(again.channels, ["a"]);
        assert_eq!((again.recover["a"].offset, again.initial), (3, true));
        s.reconnected();
        let all = s.command();
        assert_eq!(all.channels.len(), 2);
        assert_eq!((all.recover["a"].offset, all.recover["b"].offset), (3, 0));
        // A channel already held by the connection (409) streams on.
        s.accept(&all.channels, reply(vec![("a", refused(409)), ("b", ok("b", 0))]));
        assert!(s.ready.is_empty() && s.waiting().is_empty(), "{:?}", s.ready);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn resubscribe_first_subscribe_asks_the_latest_only_when_initial() {
        let s = Subscriber::new(SubscribeOptions::new(["a"]));
        assert!(!s.command().initial);
        let mut s = Subscriber::new(SubscribeOptions::new(["a", "a", "b"]));
        assert_eq!(s.waiting(), ["a", "b"], "each channel once");
        s.accept(&["a".to_string(), "b".to_string()], reply(vec![("a", ok("a", 0)), ("b", refused(503))]));
        assert!(!s.command().initial, "b was never subscribed");
        s.unsubscribed("a");
        assert!(s.command().initial, "a resubscription ends a gap with the latest value");
    }
}
