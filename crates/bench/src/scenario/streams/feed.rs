//! The point feed shared by `streams` and `dashboard`, and the wire helpers `rooms` uses too.
//!
//! A feed is K point channels `<prefix><i>`, `i` in `0..K`. Subscribers hold a contiguous
//! range of them on one connection ([`subscriber`]); the coordinator updates every point once
//! per tick through batched `POST /api/publish` calls ([`TickPublisher`], [`run_ticks`]).
//!
//! # Layout
//! - this file: the feed's channels ([`Points`]) and its subscribers (worker processes).
//! - `wire`: the server messages the bench reads, frames, subscribe chunks and replies (used by
//!   `rooms` and `soak` too).
//! - `ticks`: the coordinator's publisher, tick schedule and per-tick completion.
//!
//! Every update follows the point convention (`{"v", "t": <unix ms>, "q"}`) and adds two keys
//! of its own: `us`, the tick's *scheduled* time in unix µs, and `seq`, the tick number.
//! Latency is arrival − `us`, so a publisher that falls behind its schedule, or a server slow
//! to accept a batch, shows up as latency instead of as fewer samples (no coordinated
//! omission). `t` keeps its conventional meaning (milliseconds) for anything else that
//! watches the channels, such as the dashboard.

mod ticks;
mod wire;

use std::cell::Cell;
use std::net::IpAddr;
use std::ops::Range;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::time::Instant;

#[cfg(test)]
pub(crate) use ticks::TickLog;
pub(crate) use ticks::{completion, run_ticks, TickPublisher, Ticks};
use wire::PubIn;
pub use wire::DEFAULT_SUBSCRIBE_CHUNK;
pub(crate) use wire::{
    encode, next_payload, parse_subscribe_ok, payload, read_frame, subscribe_chunks, Incoming, Subscribed,
};

use crate::accounting::{BurstTally, Delivery, OffsetSet, Tally};
use crate::common::{unix_micros, WireFormat};
use crate::histogram::Latency;
use crate::worker::WorkerCtx;

/// How long a connection may take from its first subscribe command until every subscription
/// is confirmed (and, with `initial`, holds a value).
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(60);
// ---------------------------------------------------------------------------------------------
// Channels.

/// The K channels of a feed: `<prefix>0` … `<prefix>K-1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Points {
    pub prefix: String,
    pub count: usize,
}

impl Points {
    pub fn name(&self, i: usize) -> String {
        format!("{}{i}", self.prefix)
    }

    /// The index of channel `ch`, if it is one of these (exactly as [`Points::name`] spells it).
    pub fn index(&self, ch: &str) -> Option<usize> {
        let digits = ch.strip_prefix(self.prefix.as_str())?;
        if digits.is_empty()
            || (digits.len() > 1 && digits.starts_with('0'))
            || !digits.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        digits.parse().ok().filter(|i| *i < self.count)
    }
}

// ---------------------------------------------------------------------------------------------
// Subscriber side (worker processes).

/// What every subscriber connection of a feed does; part of a worker's configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FeedConn {
    pub target: String,
    pub points: Points,
    /// Channels per subscribe command.
    pub chunk: usize,
    /// Ask for each channel's last value in the subscribe reply, and count the connection as
    /// established only once every channel holds a value (a dashboard being usable).
    pub initial: bool,
    /// Number of tick numbers (`seq` `0..seqs`) there will be, for per-tick completion.
    pub seqs: u64,
    /// Publications each subscribed channel will carry, for the worker's expected total.
    pub updates_per_channel: u64,
    pub format: WireFormat,
    /// WebSocket, SSE or long-polling (`streams --transport`; the dashboard uses WebSocket).
    #[serde(default)]
    pub transport: crate::transport::Transport,
    /// Offer permessage-deflate (`streams --compression`).
    #[serde(default = "crate::common::no_compression")]
    pub compression: switchboard_client::Compression,
}

/// The subscriptions of one connection: the points `first..first + sets.len()`.
struct Held {
    first: usize,
    /// Offsets received per point, from the subscribe reply's offset on; `None` until confirmed.
    sets: Vec<Option<OffsetSet>>,
    /// Which points have a value (the initial one or any delivery).
    valued: Vec<bool>,
    n_valued: usize,
    n_confirmed: usize,
}

impl Held {
    fn new(range: &Range<usize>) -> Held {
        let n = range.len();
        Held { first: range.start, sets: vec![None; n], valued: vec![false; n], n_valued: 0, n_confirmed: 0 }
    }

    fn slot(&self, points: &Points, ch: &str) -> Option<usize> {
        points.index(ch)?.checked_sub(self.first).filter(|s| *s < self.sets.len())
    }

    fn mark_valued(&mut self, slot: usize) {
        if !self.valued[slot] {
            self.valued[slot] = true;
            self.n_valued += 1;
        }
    }

    /// Applies one channel of a subscribe reply.
    fn confirm(&mut self, points: &Points, name: &str, outcome: Subscribed) -> Result<(), String> {
        let Some(slot) = self.slot(points, name) else { return Err(format!("reply names unknown channel {name}")) };
        match outcome {
            Subscribed::Err(e) => Err(e),
            Subscribed::Ok { offset, last } => {
                if self.sets[slot].is_none() {
                    self.n_confirmed += 1;
                }
                self.sets[slot] = Some(OffsetSet::new(offset));
                if last.is_some() {
                    self.mark_valued(slot);
                }
                Ok(())
            }
        }
    }

    /// Counts one delivery; returns whether it was new.
    fn deliver(&mut self, points: &Points, p: &PubIn, now: u64, tally: &mut Tally, lat: &mut Latency) -> bool {
        let Some((slot, set)) = self.slot(points, &p.ch).and_then(|s| Some((s, self.sets[s].as_mut()?))) else {
            // Not a channel of this connection, or one whose subscription is not confirmed.
            tally.unexpected += 1;
            return false;
        };
        let d = set.insert(p.off);
        tally.count(d);
        if d != Delivery::New {
            return false;
        }
        lat.record(now.saturating_sub(p.data.us));
        if let Some(b) = tally.bursts.get_mut(p.data.seq as usize) {
            b.count += 1;
            b.last_us = b.last_us.max(now);
        }
        self.mark_valued(slot);
        true
    }
}

/// Shared by the subscriber tasks of one worker process.
pub(crate) struct FeedWorker {
    pub cfg: FeedConn,
    pub ctx: Rc<WorkerCtx>,
    pub token: Option<String>,
    /// Handshakes in flight.
    pub sem: tokio::sync::Semaphore,
    /// Deliveries this worker expects from the connections established so far.
    expected: Cell<u64>,
}

impl FeedWorker {
    pub fn new(cfg: FeedConn, ctx: Rc<WorkerCtx>, concurrency: usize) -> Rc<FeedWorker> {
        ctx.tally.borrow_mut().bursts = vec![BurstTally::default(); cfg.seqs as usize];
        Rc::new(FeedWorker {
            cfg,
            ctx,
            token: crate::worker::token(),
            sem: tokio::sync::Semaphore::new(concurrency.max(1)),
            expected: Cell::new(0),
        })
    }
}

/// One subscriber connection holding the points `range`, until the worker stops.
///
/// Established (and its subscribe time recorded) once every subscription is confirmed and,
/// with `initial`, every point holds a value; the recorded time runs from the first subscribe
/// command, so it is the time a user waits for a screen full of values, not the handshake.
pub(crate) async fn subscriber(w: Rc<FeedWorker>, range: Range<usize>, bind: Option<IpAddr>) {
    let ctx = &w.ctx;
    let cfg = &w.cfg;
    let format = cfg.format.format();
    let mut permit = Some(w.sem.acquire().await);
    let mut opts = crate::common::connect_options(format);
    opts.bind = bind;
    opts.credentials = w.token.clone().map(switchboard_client::Credentials::Bearer);
    opts.timeout = Duration::from_secs(30);
    opts.compression = cfg.compression;
    let mut ws = match crate::transport::Conn::connect(cfg.transport, &cfg.target, &opts).await {
        Ok(ws) => ws,
        Err(e) => return ctx.failed(&format!("connect: {e}")),
    };
    // The socket's bytes once established are the deliveries' (and the odd ping's).
    let wire = ws.wire_stats();
    let mut wire_seen = 0;
    let names: Vec<String> = range.clone().map(|i| cfg.points.name(i)).collect();
    let chunks = subscribe_chunks(&names, cfg.chunk);
    let t0 = Instant::now();
    for (i, c) in chunks.iter().enumerate() {
        let cmd = json!({"id": i + 1, "subscribe": {"channels": &names[c.clone()], "initial": cfg.initial}});
        if let Err(e) = ws.send(encode(format, &cmd)).await {
            return ctx.failed(&format!("subscribe: {e}"));
        }
    }
    let mut held = Held::new(&range);
    let n = range.len();
    let deadline = t0 + SUBSCRIBE_TIMEOUT;
    let mut established = false;
    loop {
        if !established && held.n_confirmed == n && (!cfg.initial || held.n_valued == n) {
            established = true;
            permit.take();
            ctx.established(t0.elapsed().as_micros() as u64);
            if let Some(w) = &wire {
                wire_seen = w.read.load(Relaxed);
                ctx.tally.borrow_mut().deflated += u64::from(w.deflate.load(Relaxed));
            }
            w.expected.set(w.expected.get() + n as u64 * cfg.updates_per_channel);
            ctx.expect(w.expected.get());
        }
        let next = tokio::select! {
            m = ws.next() => m,
            _ = tokio::time::sleep_until(deadline), if !established => {
                let why = if held.n_confirmed < n {
                    format!("{} of {n} subscriptions confirmed after {} s", held.n_confirmed, SUBSCRIBE_TIMEOUT.as_secs())
                } else {
                    format!("{} of {n} channels without a value {} s after subscribing", n - held.n_valued, SUBSCRIBE_TIMEOUT.as_secs())
                };
                return ctx.failed(&why);
            }
        };
        let end = |why: String| if established { ctx.dropped(&why) } else { ctx.failed(&why) };
        let frame = match next_payload(&next) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(why) => return end(why),
        };
        let now = unix_micros();
        let read = {
            let mut tally = ctx.tally.borrow_mut();
            let mut lat = ctx.latency.borrow_mut();
            if let Some(w) = wire.as_ref().filter(|_| established) {
                let read = w.read.load(Relaxed);
                tally.wire_bytes += read - wire_seen;
                wire_seen = read;
            }
            let read = read_frame(
                frame,
                chunks.len(),
                &mut held,
                &mut tally,
                |held, p, tally| held.deliver(&cfg.points, p, now, tally, &mut lat),
                |held, name, o| held.confirm(&cfg.points, name, o),
            );
            if read.got {
                tally.last_arrival_us = now;
            }
            read
        };
        if let Some(why) = read.fail {
            // A subscription the server refused: this connection does not hold its share.
            return end(why);
        }
        if read.got {
            ctx.check_complete();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;
    use serde_json::Value;
    use tokio_tungstenite::tungstenite::Message;

    #[test]
    fn feed_point_names_round_trip_and_reject_lookalikes() {
        let p = Points { prefix: "bench:s.".into(), count: 12 };
        assert_eq!(p.name(7), "bench:s.7");
        for i in 0..12 {
            assert_eq!(p.index(&p.name(i)), Some(i));
        }
        for bad in ["bench:s.12", "bench:s.07", "bench:s.", "bench:s.1x", "other.1", "bench:s.-1"] {
            assert_eq!(p.index(bad), None, "{bad}");
        }
    }

    #[test]
    fn feed_subscriber_counts_values_deliveries_and_duplicates() {
        testutil::local(async {
            // Two chunks of one channel each; channel 1's reply has an initial value; then a
            // batched frame with a new update, a duplicate and a foreign channel.
            let url = testutil::serve(|msg| {
                let cmd: Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
                let id = cmd["id"].as_u64().unwrap();
                let ch = cmd["subscribe"]["channels"][0].as_str().unwrap().to_string();
                assert_eq!(cmd["subscribe"]["initial"], json!(true));
                let last = json!({"ch": ch, "off": 3, "data": TickPublisher::update(0, 0, 1)});
                let mut out =
                    vec![Message::text(json!({"id": id, "ok": {"channels": {&ch: {"offset": 3, "last": last}}}}).to_string())];
                if id == 2 {
                    let us = unix_micros() - 3_000;
                    let p = |ch: &str, off: u64| json!({"pub": {"ch": ch, "off": off, "data": TickPublisher::update(1, 1, us)}});
                    out.push(Message::text(format!(
                        "{}\n{}\n{}\n{}",
                        p("f.0", 4),
                        p("f.1", 4),
                        p("f.1", 4),
                        p("g.0", 1)
                    )));
                }
                out
            })
            .await;
            let ctx = WorkerCtx::new(1);
            let cfg = FeedConn {
                target: url,
                points: Points { prefix: "f.".into(), count: 2 },
                chunk: 1,
                initial: true,
                seqs: 2,
                updates_per_channel: 1,
                format: WireFormat::Json,
                transport: crate::transport::Transport::Ws,
                compression: switchboard_client::Compression::Off,
            };
            let w = FeedWorker::new(cfg, ctx.clone(), 1);
            let watcher = ctx.clone();
            tokio::task::spawn_local(async move {
                for _ in 0..500 {
                    let t = watcher.snapshot();
                    if t.received + t.duplicated >= 4 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                watcher.stop();
            });
            tokio::select! {
                _ = subscriber(w, 0..2, None) => {}
                _ = ctx.wait_stop() => {}
            }
            let t = ctx.tally.borrow();
            assert_eq!(
                (t.established, t.failed, t.received, t.duplicated, t.unexpected),
                (1, 0, 2, 1, 1),
                "{:?}",
                t.errors
            );
            assert_eq!(t.bursts[1].count, 2);
            assert!(ctx.latency.borrow().value_at(0.5) >= 3_000, "measured from the stamp");
            assert_eq!(ctx.connect.borrow().count(), 1);
        });
    }
}
