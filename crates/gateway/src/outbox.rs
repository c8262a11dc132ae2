//! [`Outbox`]: one connection's bounded outbound queue and its socket writes.
//!
//! Publications arrive as pre-encoded, shared frames ([`Frame`]): a server WebSocket frame is
//! unmasked, so the same bytes go to every subscriber. Whoever finds the connection idle writes
//! directly with a non-blocking `try_write` — usually the task that fanned out a publication —
//! so a delivery costs one write call and no task wake-up. When several messages are queued,
//! they are merged into one frame (JSON: `\n`-separated; MessagePack: concatenated) and one
//! write. Only when the socket is full does the connection's own task take over, waiting for
//! writability.
//!
//! Memory is bounded: everything queued counts — publications, replies, presence events,
//! pings and pongs — and a push past `max_pending` closes the connection with 4008 (the client
//! reconnects and recovers from history); only a reply on an empty queue may exceed the bound
//! alone, so one large legitimate reply (a subscribe with thousands of `initial` values) goes
//! through while a client pipelining commands without reading is closed at its second.
//! Conflated channels keep at most one pending frame each, the latest (its predecessor is
//! replaced in place). [`Outbox::is_full`] tells the connection task to stop reading from a
//! client whose queue is full (back-pressure on its commands).
//!
//! The HTTP transports (SSE, long-polling) write through hyper, which holds their socket, so
//! the fan-out has no socket to write to: their outbox keeps what is queued, under the same
//! rules, until the transport takes it ([`pull`]); an SSE stream's outbox frames what it takes
//! as events with the stream's [`Framer`] ([`framed`]).
//!
//! A WebSocket connection that negotiated permessage-deflate gets its longer messages
//! compressed ([`deflated`]): a shared frame carries its compressed forms, made once by the
//! first connection that needs each, before the outbox's lock is taken; compressed frames are
//! written whole, never merged.
//!
//! Concurrency: all state is behind one `parking_lot::Mutex`, held for the duration of a
//! non-blocking write call. It is per connection, so contention is limited to a fan-out and
//! the connection's own task meeting on the same socket; a `std`-style mutex beats an async
//! one here because nothing is awaited while it is held.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use switchboard_protocol::websocket::{self, Opcode};
use switchboard_protocol::Format;
use tokio::sync::Notify;

use crate::message::Kind;
use crate::metrics::Metrics;

pub mod deflated;
pub mod framed;
pub mod pull;

pub use deflated::Deflate;
pub use framed::Framer;
pub use pull::PullOptions;

/// Where an outbox writes: a socket, or a buffer in tests.
pub trait Wire: Send + Sync + 'static {
    /// Writes some bytes without blocking; `WouldBlock` when the socket is full.
    fn try_write(&self, buf: &[u8]) -> io::Result<usize>;
}

impl Wire for tokio::net::TcpStream {
    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        tokio::net::TcpStream::try_write(self, buf)
    }
}

/// A complete server frame holding one message, shared between recipients.
#[derive(Debug, Clone)]
pub struct Frame {
    pub bytes: Bytes,
    pub header_len: u8,
    /// The compressed forms of a frame many connections share, made once each by the first
    /// that needs it ([`Frame::deflated`]); `None` for a frame of one connection.
    forms: Option<Arc<deflated::Forms>>,
}

impl Frame {
    /// Frames one message for `format` (text for JSON, binary for MessagePack), to be shared
    /// by many connections (a publication, a presence event): connections that negotiated
    /// permessage-deflate share its compressed form too.
    pub fn message(format: Format, payload: &[u8]) -> Frame {
        Frame { forms: deflated::Forms::shared(), ..Frame::one(format, payload) }
    }

    /// Frames one message for one connection (a reply).
    fn one(format: Format, payload: &[u8]) -> Frame {
        let opcode = match format {
            Format::Json => Opcode::Text,
            Format::Msgpack => Opcode::Binary,
        };
        let mut h = [0u8; websocket::MAX_HEADER];
        let n = websocket::encode_header(opcode, payload.len(), &mut h);
        let mut v = Vec::with_capacity(n + payload.len());
        v.extend_from_slice(&h[..n]);
        v.extend_from_slice(payload);
        Frame { bytes: Bytes::from(v), header_len: n as u8, forms: None }
    }

    pub fn payload(&self) -> &[u8] {
        &self.bytes[usize::from(self.header_len)..]
    }

    /// The message without its header, sharing the frame's bytes.
    pub fn payload_bytes(&self) -> Bytes {
        self.bytes.slice(usize::from(self.header_len)..)
    }

    /// The message without its header, the frame's own handle on the shared bytes moved past
    /// the header: the count every subscriber of a publication shares is not touched.
    pub fn into_payload(self) -> Bytes {
        let mut b = self.bytes;
        bytes::Buf::advance(&mut b, usize::from(self.header_len));
        b
    }
}

/// A publication on its way to one connection.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub frame: Frame,
    pub channel: Arc<str>,
    pub offset: u64,
    /// When the node accepted the publication (for the lag histogram).
    pub born: Instant,
}

enum Item {
    /// A message frame that may be merged with its neighbours; `born` for a publication.
    Message { frame: Frame, kind: Kind, born: Option<Instant> },
    /// The pending latest value of a conflated channel, kept in `OutState::latest`.
    Latest(Arc<str>),
    /// A control frame (ping, close), written as is.
    Control(Bytes),
}

#[derive(Default)]
struct OutState {
    queue: VecDeque<Item>,
    latest: HashMap<Arc<str>, Delivery>,
    /// Unwritten bytes of queued items (everything but conflated values).
    pending: usize,
    /// A chunk being written, with what is still to go.
    current: Bytes,
    /// In some fan-out's flush list already.
    scheduled: bool,
    /// The socket is full; the connection task waits for writability and flushes.
    blocked: bool,
    /// Subscribes in progress: pushes queue but are not written until `release`.
    hold: u32,
    /// Queue length when each hold began: its reply goes there, after what an earlier command
    /// queued and before anything queued while the subscribe ran.
    hold_marks: Vec<usize>,
    /// Channels the hub removed this connection from with an `unsubscribed` push; the session
    /// forgets them before its next subscribe ([`Outbox::take_lost`]).
    lost: Vec<Arc<str>>,
    /// Replies recorded for [`Outbox::take_replies`] (taking outboxes that record them).
    replies: Vec<crate::message::Message>,
    /// The close code, once closing: nothing more is accepted, and the connection task
    /// closes once everything is written out.
    close_code: Option<u16>,
    /// The socket failed; everything is dropped.
    dead: bool,
    /// Turns messages into the transport's bytes (framed outboxes).
    framer: Option<Box<dyn Framer>>,
    /// Per channel of a delta subscription, the offset of the last publication queued: the
    /// base the client holds for the next one's delta ([`Outbox::push_delta`]).
    delta_sent: HashMap<Arc<str>, u64>,
}

impl OutState {
    /// Keeps a copy of a reply for [`Outbox::take_replies`] (one [`Outbox::records`] keeps).
    fn record_reply(&mut self, frame: &Frame, kind: Kind) {
        self.replies.push(crate::message::Message { text: frame.payload_bytes(), kind });
    }

    /// Everything is written: frees what an idle connection would otherwise keep, the queue's
    /// and the conflation map's capacity and the last frame (a shared frame stays alive as
    /// long as any outbox points into it).
    fn release_idle(&mut self) {
        if self.queue.is_empty() && self.queue.capacity() > 0 {
            self.queue = VecDeque::new();
        }
        if self.latest.is_empty() && self.latest.capacity() > 0 {
            self.latest = HashMap::new();
        }
        self.current = Bytes::new();
    }
}

/// What [`Outbox::push`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Queued, and the caller must call [`Outbox::flush`] (it is now in the caller's flush list).
    Schedule,
    /// Queued (or conflated); someone else will write it.
    Queued,
    /// Dropped: the connection is closing, or it just became a slow consumer.
    Dropped,
}

/// Where an outbox's messages go.
enum Sink {
    /// WebSocket frames written into a socket by whoever finds it idle.
    Socket(Arc<dyn Wire>),
    /// Kept until the transport takes them ([`pull`]), framed when the outbox has a framer.
    Pull(PullOptions),
}

/// One connection's outbound side. See the module docs.
pub struct Outbox {
    pub id: u64,
    pub format: Format,
    sink: Sink,
    state: Mutex<OutState>,
    wake: Notify,
    max_pending: usize,
    metrics: Arc<Metrics>,
    /// Unix seconds of the last frame received from the client (heartbeats).
    pub last_seen: AtomicU64,
    /// The unix second from which the connection's session may be past its deadline
    /// (`Session::deadline`; `u64::MAX`: none). The session writes it; a sweep over many
    /// sessions reads it without taking any session's lock.
    pub deadline_s: AtomicU64,
    /// The client can subscribe a channel again on this connection (WebSocket): a channel the
    /// broker lost publications of ends with an `unsubscribed` push instead of a 4008 close.
    resubscribes: AtomicBool,
    /// permessage-deflate, when the connection negotiated it ([`Outbox::use_deflate`]); read
    /// without the lock by every push.
    deflate: OnceLock<Deflate>,
}

/// Largest merged chunk written at once.
const MAX_CHUNK: usize = 64 * 1024;

impl Outbox {
    pub fn new(id: u64, format: Format, wire: Arc<dyn Wire>, max_pending: usize, metrics: Arc<Metrics>) -> Outbox {
        Outbox::with_sink(id, format, Sink::Socket(wire), max_pending, metrics)
    }

    /// An outbox whose transport takes its messages ([`pull`]): JSON, as the HTTP transports
    /// speak it.
    pub fn new_pull(id: u64, max_pending: usize, metrics: Arc<Metrics>, options: PullOptions) -> Outbox {
        Outbox::with_sink(id, Format::Json, Sink::Pull(options), max_pending, metrics)
    }

    fn with_sink(id: u64, format: Format, sink: Sink, max_pending: usize, metrics: Arc<Metrics>) -> Outbox {
        Outbox {
            id,
            format,
            sink,
            state: Mutex::new(OutState::default()),
            wake: Notify::new(),
            max_pending,
            metrics,
            last_seen: AtomicU64::new(crate::unix_s()),
            deadline_s: AtomicU64::new(u64::MAX),
            resubscribes: AtomicBool::new(false),
            deflate: OnceLock::new(),
        }
    }

    /// Queues a publication. `conflate`: keep only the latest pending value of its channel.
    pub fn push(&self, d: Delivery, conflate: bool) -> Pushed {
        // Compressed (once per publication, by the first connection that needs it) before the
        // lock: the connection's own writes never wait for it.
        let d = Delivery { frame: self.on_wire(d.frame), ..d };
        self.queue_locked(self.state.lock(), d, conflate)
    }

    /// Queues a publication of a delta subscription (`crate::hub::Rule::Delta`): `delta` when
    /// there is one and the last publication of its channel queued here is the one just before
    /// it (the delta's base), `whole` otherwise. A subscribe's release forgets the base of the
    /// channels its reply covers: the reply carries their publications in their usual form.
    /// Both forms are made ready before the lock (each compressed once per publication); the
    /// choice and the queueing are one critical section, so that no release falls between
    /// them and a delta never goes out on a base the reply replaced.
    pub fn push_delta(&self, whole: Delivery, delta: Option<&Frame>) -> Pushed {
        let delta = delta.map(|f| self.on_wire(f.clone()));
        let whole = Delivery { frame: self.on_wire(whole.frame), ..whole };
        let mut st = self.state.lock();
        let before = st.delta_sent.insert(whole.channel.clone(), whole.offset);
        let d = match delta {
            Some(frame) if before.is_some_and(|b| b + 1 == whole.offset) => Delivery { frame, ..whole },
            _ => whole,
        };
        self.queue_locked(st, d, false)
    }

    /// Queues `d`, ready for the wire, under the lock `st` (the latest of its channel when
    /// `conflate`).
    fn queue_locked(&self, mut st: parking_lot::MutexGuard<'_, OutState>, d: Delivery, conflate: bool) -> Pushed {
        if st.close_code.is_some() || st.dead {
            self.metrics.dropped.fetch_add(1, Relaxed);
            return Pushed::Dropped;
        }
        if conflate {
            if let Some(slot) = st.latest.get_mut(&d.channel) {
                *slot = d;
                self.metrics.conflated.fetch_add(1, Relaxed);
                return Pushed::Queued;
            }
            let ch = d.channel.clone();
            st.latest.insert(ch.clone(), d);
            st.queue.push_back(Item::Latest(ch));
        } else {
            let len = d.frame.bytes.len();
            if st.pending + len > self.max_pending {
                drop(st);
                self.slow_consumer();
                return Pushed::Dropped;
            }
            st.pending += len;
            st.queue.push_back(Item::Message {
                frame: d.frame,
                kind: Kind::Pub { ch: d.channel, off: d.offset },
                born: Some(d.born),
            });
        }
        self.schedule(&mut st)
    }

    /// Forgets what [`Outbox::push_delta`] keeps of `channel` (it was unsubscribed).
    pub fn forget_channel(&self, channel: &str) {
        self.state.lock().delta_sent.remove(channel);
    }

    /// Marks this connection as one whose client can subscribe a channel again (see
    /// [`Outbox::end_subscription`]).
    pub fn accept_resubscribes(&self) {
        self.resubscribes.store(true, Relaxed);
    }

    pub fn resubscribes(&self) -> bool {
        self.resubscribes.load(Relaxed)
    }

    /// Ends the subscription of `channel` after what was queued of it (the hub no longer
    /// delivers it here): queues `notice` (an `unsubscribed` push) and records the channel for
    /// [`Outbox::take_lost`]. A subscribe that holds the outbox puts its reply before the notice.
    pub fn end_subscription(&self, channel: &Arc<str>, notice: &Frame) -> Pushed {
        let mut st = self.state.lock();
        if st.close_code.is_some() || st.dead {
            return Pushed::Dropped;
        }
        st.lost.push(channel.clone());
        drop(st);
        self.push_item(
            Item::Message { frame: self.on_wire(notice.clone()), kind: Kind::Unsubscribed, born: None },
            true,
        )
    }

    /// Channels ended by [`Outbox::end_subscription`] since the last call.
    pub fn take_lost(&self) -> Vec<Arc<str>> {
        std::mem::take(&mut self.state.lock().lost)
    }

    /// Queues a reply or other message that belongs to no channel (may exceed the bound
    /// alone, on an empty queue).
    pub fn push_message(&self, payload: &[u8], kind: Kind) -> Pushed {
        let frame = Frame::one(self.format, payload);
        // Recorded as the client reads it, uncompressed.
        let recorded = self.records(&kind).then(|| (frame.clone(), kind.clone()));
        let pushed = self.push_item(Item::Message { frame: self.on_wire(frame), kind, born: None }, true);
        if let (false, Some((frame, kind))) = (pushed == Pushed::Dropped, recorded) {
            self.state.lock().record_reply(&frame, kind);
        }
        pushed
    }

    /// Queues a pre-built frame shared by many connections (presence events).
    pub fn push_frame(&self, frame: &Frame, kind: Kind) -> Pushed {
        self.push_item(Item::Message { frame: self.on_wire(frame.clone()), kind, born: None }, false)
    }

    /// Queues a control frame (ping, pong).
    pub fn push_control(&self, frame: Bytes) -> Pushed {
        self.push_item(Item::Control(frame), false)
    }

    /// Queues `item` within the bound; past it, closes with 4008. `lone_ok`: on an empty
    /// queue it is taken whatever its size (replies).
    fn push_item(&self, item: Item, lone_ok: bool) -> Pushed {
        let len = match &item {
            Item::Message { frame, .. } => frame.bytes.len(),
            Item::Control(b) => b.len(),
            Item::Latest(_) => 0,
        };
        let mut st = self.state.lock();
        if st.close_code.is_some() || st.dead {
            return Pushed::Dropped;
        }
        if st.pending + len > self.max_pending && !(lone_ok && st.pending == 0) {
            drop(st);
            self.slow_consumer();
            return Pushed::Dropped;
        }
        st.pending += len;
        st.queue.push_back(item);
        self.schedule(&mut st)
    }

    fn slow_consumer(&self) {
        self.metrics.slow_consumers.fetch_add(1, Relaxed);
        self.close(switchboard_protocol::code::close::SLOW_CONSUMER, "slow consumer", true);
    }

    /// The queue holds half the bound or more and the socket takes no more: the connection
    /// task stops reading the client's commands until it drains.
    pub fn is_full(&self) -> bool {
        let st = self.state.lock();
        st.blocked && st.pending + st.current.len() >= self.max_pending / 2
    }

    fn schedule(&self, st: &mut OutState) -> Pushed {
        if st.scheduled || st.blocked || st.hold > 0 {
            Pushed::Queued
        } else {
            st.scheduled = true;
            Pushed::Schedule
        }
    }

    /// Writes what is queued, as far as the socket takes it without blocking. Called by the
    /// fan-out that got [`Pushed::Schedule`], or by the connection task after its own pushes.
    pub fn flush(&self) {
        let mut st = self.state.lock();
        st.scheduled = false;
        if st.blocked || st.hold > 0 || st.dead {
            return;
        }
        self.write_locked(&mut st);
    }

    /// Called by the connection task when the socket became writable again.
    pub fn flush_blocked(&self) {
        let mut st = self.state.lock();
        if st.dead {
            return;
        }
        st.blocked = false;
        if st.hold > 0 {
            // `release` writes, once the reply is in place.
            return;
        }
        self.write_locked(&mut st);
    }

    fn write_locked(&self, st: &mut OutState) {
        let wire = match &self.sink {
            Sink::Socket(w) => w,
            Sink::Pull(_) => {
                // The transport takes what is queued when woken.
                if !st.queue.is_empty() || st.close_code.is_some() {
                    self.wake.notify_one();
                }
                return;
            }
        };
        loop {
            if st.current.is_empty() && !self.next_chunk(st) {
                st.release_idle();
                if st.close_code.is_some() {
                    self.wake.notify_one();
                }
                return;
            }
            self.metrics.writes.fetch_add(1, Relaxed);
            match wire.try_write(&st.current) {
                Ok(0) => {
                    self.fail(st);
                    return;
                }
                Ok(n) => {
                    self.metrics.bytes_out.fetch_add(n as u64, Relaxed);
                    let _ = st.current.split_to(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    st.blocked = true;
                    self.wake.notify_one();
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.fail(st);
                    return;
                }
            }
        }
    }

    fn fail(&self, st: &mut OutState) {
        st.dead = true;
        st.queue.clear();
        st.latest.clear();
        st.current = Bytes::new();
        st.pending = 0;
        self.wake.notify_one();
    }

    /// Moves queued items into `current`: one shared frame as is when it is alone, otherwise
    /// runs of messages merged into one frame each, between the frames written whole (control
    /// frames, compressed messages), up to MAX_CHUNK.
    fn next_chunk(&self, st: &mut OutState) -> bool {
        let Some(first) = st.queue.pop_front() else { return false };
        let now = Instant::now();
        let mut delivered = 0u64;
        let mut take = |st: &mut OutState, item: Item| -> Option<(Frame, bool)> {
            match item {
                Item::Message { frame, born, .. } => {
                    st.pending = st.pending.saturating_sub(frame.bytes.len());
                    if let Some(b) = born {
                        self.metrics.observe_lag(now.saturating_duration_since(b));
                    }
                    delivered += 1;
                    let whole = frame.compressed();
                    Some((frame, whole))
                }
                Item::Latest(ch) => {
                    let d = st.latest.remove(&ch)?;
                    self.metrics.observe_lag(now.saturating_duration_since(d.born));
                    delivered += 1;
                    let whole = d.frame.compressed();
                    Some((d.frame, whole))
                }
                Item::Control(b) => {
                    st.pending = st.pending.saturating_sub(b.len());
                    Some((Frame { bytes: b, header_len: 0, forms: None }, true))
                }
            }
        };
        let Some(first) = take(st, first) else { return self.next_chunk(st) };
        if st.queue.is_empty() {
            st.current = first.0.bytes;
            self.metrics.deliveries.fetch_add(delivered, Relaxed);
            return true;
        }
        let mut out: Vec<u8> = Vec::with_capacity(MAX_CHUNK.min(st.pending + first.0.bytes.len() + 64));
        let mut run: Vec<Frame> = Vec::new();
        let mut run_len = 0usize;
        let sep = self.format.separator();
        let emit_run = |out: &mut Vec<u8>, run: &mut Vec<Frame>, run_len: &mut usize| {
            match run.len() {
                0 => {}
                1 => out.extend_from_slice(&run[0].bytes),
                _ => {
                    let total = *run_len + sep.len() * (run.len() - 1);
                    let opcode = if self.format == Format::Json { Opcode::Text } else { Opcode::Binary };
                    let mut h = [0u8; websocket::MAX_HEADER];
                    let n = websocket::encode_header(opcode, total, &mut h);
                    out.extend_from_slice(&h[..n]);
                    for (i, f) in run.iter().enumerate() {
                        if i > 0 {
                            out.extend_from_slice(sep);
                        }
                        out.extend_from_slice(f.payload());
                    }
                }
            }
            run.clear();
            *run_len = 0;
        };
        let mut next = Some(first);
        let mut size = 0usize;
        while let Some((frame, whole)) = next.take() {
            if whole {
                emit_run(&mut out, &mut run, &mut run_len);
                size += frame.bytes.len();
                out.extend_from_slice(&frame.bytes);
            } else {
                size += frame.payload().len() + 1;
                run_len += frame.payload().len();
                run.push(frame);
            }
            if size >= MAX_CHUNK {
                break;
            }
            while let Some(item) = st.queue.pop_front() {
                if let Some(x) = take(st, item) {
                    next = Some(x);
                    break;
                }
            }
        }
        emit_run(&mut out, &mut run, &mut run_len);
        self.metrics.deliveries.fetch_add(delivered, Relaxed);
        st.current = Bytes::from(out);
        true
    }

    /// Starts a subscribe: until the matching [`release`](Self::release), publications queue
    /// but are not written, so the reply can go first.
    pub fn hold(&self) {
        let mut st = self.state.lock();
        st.hold += 1;
        let mark = st.queue.len();
        st.hold_marks.push(mark);
    }

    /// Ends a subscribe: drops queued publications the reply already covers (`covered`:
    /// channel → offset in the reply), puts the reply where the queue ended when the subscribe
    /// began (so replies keep the order of their commands and come before any publication
    /// queued meanwhile) and writes.
    pub fn release(&self, reply: &[u8], kind: Kind, covered: &HashMap<Arc<str>, u64>) {
        let plain = Frame::one(self.format, reply);
        // Compressed before the lock (a large subscribe reply takes milliseconds).
        let wire = self.on_wire(plain.clone());
        self.release_inner(Some((plain, wire, kind)), covered)
    }

    /// Ends a subscribe that has no reply (a command without id that succeeded).
    pub fn release_without_reply(&self, covered: &HashMap<Arc<str>, u64>) {
        self.release_inner(None, covered)
    }

    /// `reply`: the reply as recorded (uncompressed), as written, and what it is.
    fn release_inner(&self, reply: Option<(Frame, Frame, Kind)>, covered: &HashMap<Arc<str>, u64>) {
        let mut st = self.state.lock();
        st.hold = st.hold.saturating_sub(1);
        let mut mark = st.hold_marks.pop().unwrap_or(0);
        if st.close_code.is_some() || st.dead {
            return;
        }
        for ch in covered.keys() {
            st.delta_sent.remove(ch);
        }
        if !covered.is_empty() {
            let (mut freed, mut index, mut removed_before_mark) = (0, 0, 0);
            st.queue.retain(|item| {
                let keep = match item {
                    Item::Message { kind: Kind::Pub { ch, off }, frame, .. } => {
                        let keep = covered.get(ch).is_none_or(|c| off > c);
                        if !keep {
                            freed += frame.bytes.len();
                        }
                        keep
                    }
                    _ => true,
                };
                if !keep && index < mark {
                    removed_before_mark += 1;
                }
                index += 1;
                keep
            });
            mark -= removed_before_mark;
            st.pending -= freed;
            let stale: Vec<Arc<str>> = st
                .latest
                .iter()
                .filter(|(ch, d)| covered.get(*ch).is_some_and(|c| d.offset <= *c))
                .map(|(ch, _)| ch.clone())
                .collect();
            for ch in stale {
                st.latest.remove(&ch);
            }
        }
        if let Some((plain, frame, kind)) = reply {
            if st.pending > 0 && st.pending + frame.bytes.len() > self.max_pending {
                drop(st);
                self.slow_consumer();
                return;
            }
            if self.records(&kind) {
                st.record_reply(&plain, kind.clone());
            }
            st.pending += frame.bytes.len();
            let at = mark.min(st.queue.len());
            st.queue.insert(at, Item::Message { frame, kind, born: None });
        }
        if st.hold == 0 && !st.blocked {
            st.scheduled = false;
            self.write_locked(&mut st);
        }
    }

    /// Closes with a `disconnect` message and a close frame. `drop_pending`: discard what is
    /// queued (slow consumer) instead of writing it first (shutdown).
    pub fn close(&self, code: u16, reason: &str, drop_pending: bool) {
        let msg = switchboard_protocol::message::encode_disconnect(self.format, code, reason);
        let mut st = self.state.lock();
        if st.close_code.is_some() || st.dead {
            return;
        }
        if drop_pending {
            let dropped = st.queue.len() as u64;
            self.metrics.dropped.fetch_add(dropped, Relaxed);
            st.queue.clear();
            st.latest.clear();
            st.pending = 0;
        } else {
            self.drop_held(&mut st);
        }
        let frame = Frame::one(self.format, &msg);
        st.queue.push_back(Item::Message { frame, kind: Kind::Disconnect { code }, born: None });
        if self.websocket() {
            st.queue.push_back(Item::Control(Bytes::from(websocket::encode_close(code, reason))));
        }
        st.close_code = Some(code);
        st.hold = 0;
        st.hold_marks.clear();
        if !st.blocked {
            self.write_locked(&mut st);
        }
        self.wake.notify_one();
    }

    /// Drops what was queued while a subscribe held the outbox: its reply will never come, and
    /// a publication must not reach the client before its channel's reply (the client recovers
    /// it after reconnecting). What was queued before the first hold stays.
    fn drop_held(&self, st: &mut OutState) {
        let Some(&mark) = st.hold_marks.first() else { return };
        let mut dropped = 0;
        while st.queue.len() > mark {
            match st.queue.pop_back() {
                Some(Item::Message { frame, .. }) => st.pending = st.pending.saturating_sub(frame.bytes.len()),
                Some(Item::Latest(ch)) => drop(st.latest.remove(&ch)),
                _ => {}
            }
            dropped += 1;
        }
        self.metrics.dropped.fetch_add(dropped, Relaxed);
    }

    /// Answers a client's close frame with `payload` (its code) and closes; no `disconnect`.
    pub fn close_echo(&self, payload: &[u8]) {
        let code =
            payload.get(..2).map_or(switchboard_protocol::code::close::NORMAL, |c| u16::from_be_bytes([c[0], c[1]]));
        self.close_frame_only(Bytes::from(websocket::encode_frame(Opcode::Close, payload)), code);
    }

    /// Fails a WebSocket connection whose client broke RFC 6455 (close 1002, 1007 or 1009):
    /// a close frame with `code` and `reason` after what was already queued, and no
    /// `disconnect` message, which the standard does not allow after a violation.
    pub fn fail_connection(&self, code: u16, reason: &str) {
        self.close_frame_only(Bytes::from(websocket::encode_close(code, reason)), code);
    }

    fn close_frame_only(&self, frame: Bytes, code: u16) {
        let mut st = self.state.lock();
        if st.close_code.is_some() || st.dead {
            return;
        }
        self.drop_held(&mut st);
        st.queue.push_back(Item::Control(frame));
        st.close_code = Some(code);
        st.hold = 0;
        st.hold_marks.clear();
        if !st.blocked {
            self.write_locked(&mut st);
        }
        self.wake.notify_one();
    }

    /// Waits until something needs the connection task (blocked socket, closing, failure).
    pub async fn notified(&self) {
        self.wake.notified().await
    }

    /// Whether this outbox writes WebSocket frames (the others take no WebSocket control
    /// frames: pings, close frames).
    pub fn websocket(&self) -> bool {
        matches!(self.sink, Sink::Socket(_))
    }

    pub fn is_blocked(&self) -> bool {
        self.state.lock().blocked
    }

    /// True once closing and everything, close frame included, is written — or the socket died.
    pub fn finished(&self) -> bool {
        let st = self.state.lock();
        st.dead || (st.close_code.is_some() && st.queue.is_empty() && st.current.is_empty())
    }

    pub fn is_closing(&self) -> bool {
        let st = self.state.lock();
        st.close_code.is_some() || st.dead
    }

    /// Unwritten bytes (non-conflated) and conflated channels pending; for tests and metrics.
    pub fn backlog(&self) -> (usize, usize) {
        let st = self.state.lock();
        (st.pending + st.current.len(), st.latest.len())
    }
}

#[cfg(test)]
pub(crate) mod tests;
