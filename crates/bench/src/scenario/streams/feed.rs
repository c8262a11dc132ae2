//! The point feed shared by `streams` and `dashboard`, and the wire helpers `rooms` uses too.
//!
//! A feed is K point channels `<prefix><i>`, `i` in `0..K`. Subscribers hold a contiguous
//! range of them on one connection ([`subscriber`]); the coordinator updates every point once
//! per tick through batched `POST /api/publish` calls ([`TickPublisher`], [`run_ticks`]).
//!
//! Every update follows the point convention (`{"v", "t": <unix ms>, "q"}`) and adds two keys
//! of its own: `us`, the tick's *scheduled* time in unix µs, and `seq`, the tick number.
//! Latency is arrival − `us`, so a publisher that falls behind its schedule, or a server slow
//! to accept a batch, shows up as latency instead of as fewer samples (no coordinated
//! omission). `t` keeps its conventional meaning (milliseconds) for anything else that
//! watches the channels, such as the dashboard.

use std::cell::Cell;
use std::net::IpAddr;
use std::ops::Range;
use std::rc::Rc;
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use switchboard_client::connect::ConnectOptions;
use switchboard_client::frame::for_each_message;
use switchboard_client::HttpApi;
use switchboard_protocol::message::ErrorBody;
use switchboard_protocol::Format;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::accounting::{BurstTally, Delivery, OffsetSet, Tally};
use crate::common::{unix_micros, WireFormat};
use crate::histogram::Latency;
use crate::progress::{Progress, Rate};
use crate::worker::{Pool, WorkerCtx};

/// Most channels one subscribe command names unless `--subscribe-chunk` says otherwise; the
/// server refuses commands naming more than its `limits.max_channels_per_subscribe` (10,000
/// by default).
pub const DEFAULT_SUBSCRIBE_CHUNK: usize = 1000;
/// Most bytes of channel names in one subscribe command, so that its frame stays under the
/// server's default `limits.max_frame_bytes` (64 KiB) whatever the chunk size.
const MAX_SUBSCRIBE_NAME_BYTES: usize = 48 * 1024;
/// How long a connection may take from its first subscribe command until every subscription
/// is confirmed (and, with `initial`, holds a value).
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Wire helpers.

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
    let mut opts = ConnectOptions::new(format);
    opts.bind = bind;
    opts.credentials = w.token.clone().map(switchboard_client::Credentials::Bearer);
    opts.timeout = Duration::from_secs(30);
    let mut ws = match crate::transport::Conn::connect(cfg.transport, &cfg.target, &opts).await {
        Ok(ws) => ws,
        Err(e) => return ctx.failed(&format!("connect: {e}")),
    };
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

// ---------------------------------------------------------------------------------------------
// Publisher side (the coordinator).

/// Updates every point of a feed once per call, in batches, over one kept-alive connection.
pub(crate) struct TickPublisher {
    pub api: HttpApi,
    pub points: Points,
    /// Items per `POST /api/publish`.
    pub batch: usize,
}

/// What one tick's publishing achieved.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct TickOutcome {
    pub accepted: u64,
    pub rejected: u64,
    pub errors: Vec<String>,
}

impl TickPublisher {
    /// The update of point `i` at tick `seq`, scheduled for `us`.
    pub fn update(i: usize, seq: u64, us: u64) -> Value {
        // Some motion so a watching dashboard shows change; the value itself is not checked.
        let v = ((seq.wrapping_mul(7) + i as u64) % 1000) as f64 / 10.0;
        json!({"v": v, "t": us / 1000, "q": "good", "us": us, "seq": seq})
    }

    /// Publishes tick `seq` of every point, stamped `us`.
    pub async fn publish(&self, seq: u64, us: u64) -> TickOutcome {
        let mut out = TickOutcome::default();
        let batch = self.batch.max(1);
        let mut i = 0;
        while i < self.points.count {
            let end = (i + batch).min(self.points.count);
            let items: Vec<(String, Value)> =
                (i..end).map(|p| (self.points.name(p), Self::update(p, seq, us))).collect();
            match self.api.publish_batch(&items).await {
                Ok(results) => {
                    for r in &results {
                        match r {
                            Ok(_) => out.accepted += 1,
                            Err(e) => {
                                out.rejected += 1;
                                note(&mut out.errors, format!("publish: error {}: {}", e.code, e.message));
                            }
                        }
                    }
                    // A reply with fewer results than items leaves the rest unconfirmed.
                    let missing = (end - i).saturating_sub(results.len()) as u64;
                    if missing > 0 {
                        out.rejected += missing;
                        note(&mut out.errors, format!("publish: {missing} items without a result"));
                    }
                }
                Err(e) => {
                    out.rejected += (end - i) as u64;
                    note(&mut out.errors, format!("publish: {e}"));
                }
            }
            i = end;
        }
        out
    }
}

fn note(errors: &mut Vec<String>, e: String) {
    if errors.len() < crate::accounting::MAX_ERRORS && !errors.contains(&e) {
        errors.push(e);
    }
}

/// The ticks of a measured phase.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticks {
    /// `seq` of the first tick.
    pub first_seq: u64,
    pub count: u64,
    pub hz: f64,
}

/// What the coordinator did over the measured phase.
#[derive(Debug, Default)]
pub(crate) struct TickLog {
    /// Scheduled time of the first tick, unix µs.
    pub start_us: u64,
    /// Per tick: scheduled time (unix µs) and accepted updates.
    pub scheduled_us: Vec<u64>,
    pub accepted: Vec<u64>,
    pub rejected: u64,
    /// Largest delay between a tick's scheduled time and the start of its publishing.
    pub late_max_us: u64,
    pub errors: Vec<String>,
}

impl TickLog {
    pub fn accepted_total(&self) -> u64 {
        self.accepted.iter().sum()
    }
}

/// Publishes `ticks` at their schedule, handling worker messages (and the progress line) in
/// between. Tick `k` is scheduled `k / hz` seconds after the first; a tick that cannot start
/// on time starts as soon as the previous one is done, still stamped with its schedule.
pub(crate) async fn run_ticks(
    pool: &mut Pool,
    progress: &mut Progress,
    publisher: &TickPublisher,
    ticks: Ticks,
    scenario: &str,
) -> TickLog {
    let period_us = 1e6 / ticks.hz;
    let phase_start = Instant::now();
    let mut log = TickLog { start_us: unix_micros(), ..TickLog::default() };
    let mut rate = Rate::default();
    for k in 0..ticks.count {
        let offset_us = (k as f64 * period_us) as u64;
        let at = phase_start + Duration::from_micros(offset_us);
        let done = k;
        pool.run_until(
            at,
            progress,
            |p| {
                let t = p.totals();
                format!(
                    "{scenario}: tick {done}/{}, {} updates delivered ({:.0}/s), {} dropped",
                    ticks.count,
                    t.received,
                    rate.per_s(t.received),
                    t.dropped
                )
            },
            |_| false,
        )
        .await;
        let us = log.start_us + offset_us;
        log.late_max_us = log.late_max_us.max(unix_micros().saturating_sub(us));
        let o = publisher.publish(ticks.first_seq + k, us).await;
        log.scheduled_us.push(us);
        log.accepted.push(o.accepted);
        log.rejected += o.rejected;
        for e in o.errors {
            note(&mut log.errors, e);
        }
    }
    log
}

/// Per-tick completion: how many ticks reached every subscriber, and how late the last
/// delivery of each complete tick was after its scheduled time.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Completion {
    pub incomplete: u64,
    /// Complete ticks whose last delivery came more than one period after their schedule.
    pub late: u64,
    pub max_ms: Option<f64>,
    pub mean_ms: Option<f64>,
}

/// `bursts[first_seq + k]` against `log.accepted[k] × subscribers_per_point`.
pub(crate) fn completion(
    log: &TickLog,
    bursts: &[BurstTally],
    first_seq: u64,
    subscribers: u64,
    hz: f64,
) -> Completion {
    let mut c = Completion::default();
    let mut times = Vec::new();
    for (k, (&us, &accepted)) in log.scheduled_us.iter().zip(&log.accepted).enumerate() {
        let b = bursts.get(first_seq as usize + k).copied().unwrap_or_default();
        let want = accepted * subscribers;
        if want == 0 || b.count < want {
            c.incomplete += 1;
            continue;
        }
        let ms = b.last_us.saturating_sub(us) as f64 / 1000.0;
        if ms > 1000.0 / hz {
            c.late += 1;
        }
        times.push(ms);
    }
    c.max_ms = times.iter().copied().reduce(f64::max);
    c.mean_ms = (!times.is_empty()).then(|| times.iter().sum::<f64>() / times.len() as f64);
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

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

    #[test]
    fn feed_completion_counts_incomplete_and_late_ticks() {
        let log = TickLog {
            start_us: 1_000_000,
            scheduled_us: vec![1_000_000, 2_000_000, 3_000_000],
            accepted: vec![10, 10, 9],
            ..TickLog::default()
        };
        // Two subscribers per point: tick 0 complete in 5 ms, tick 1 complete but 1.5 s late,
        // tick 2 had 9 accepted updates and 17 of 18 deliveries.
        let bursts = vec![
            BurstTally { count: 20, last_us: 1_005_000 },
            BurstTally { count: 20, last_us: 3_500_000 },
            BurstTally { count: 17, last_us: 3_100_000 },
        ];
        let c = completion(&log, &bursts, 0, 2, 1.0);
        assert_eq!((c.incomplete, c.late), (1, 1));
        assert_eq!(c.max_ms, Some(1500.0));
        assert_eq!(c.mean_ms, Some(752.5));
        // Tick numbers that start at 1 (the dashboard's): `bursts[0]` is not a tick.
        let on_time = BurstTally { count: 20, last_us: 2_900_000 };
        let c = completion(&log, &[BurstTally::default(), on_time, on_time, on_time], 1, 2, 1.0);
        assert_eq!((c.incomplete, c.late), (0, 1), "only tick 0 ends more than a period after its schedule");
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
