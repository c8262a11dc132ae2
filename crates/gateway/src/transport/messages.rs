//! [`MessageWire`]: the [`Wire`] under the outbox of an HTTP transport (SSE, long-polling).
//!
//! The session and the hub do not change for these transports: a publication is still encoded
//! and framed once and the same frame is pushed into every subscriber's outbox. The outbox
//! "writes" its WebSocket frames into this wire, which takes them apart again into protocol
//! messages (one per `\n`-separated line of a text frame) and keeps them in a queue until the
//! transport takes them: the SSE stream as soon as hyper can write, a long-poll request when it
//! arrives. Taking the header off a shared frame and finding a publication's channel and offset
//! costs a few byte comparisons; the payload bytes are shared (`Bytes::slice`), not copied.
//!
//! The wire never blocks the outbox (`try_write` always takes everything), so it applies the
//! outbox's rules itself, to what the client has not taken yet:
//! - conflation: a publication on a conflated channel (`pt:` by default) replaces the pending
//!   one of the same channel in place, so a slow poller or SSE reader gets the latest value per
//!   point channel;
//! - the bound: more than `max_pending` bytes of non-conflated messages waiting turns the
//!   connection into a slow consumer — the queue is dropped, a `disconnect` 4008 takes its
//!   place and the wire closes (the client reconnects and recovers from history).
//!
//! Concurrency: one `parking_lot::Mutex` around the queue, taken by the outbox (inside its own
//! lock, during a non-blocking write) and by the transport when it takes messages; nothing is
//! awaited while it is held. Lock order: outbox state, then this queue.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use switchboard_protocol::code::close;
use switchboard_protocol::message::encode_disconnect;
use switchboard_protocol::websocket::{self, Opcode};
use switchboard_protocol::Format;
use tokio::sync::Notify;

use crate::metrics::Metrics;
use crate::outbox::Wire;

/// What a queued message is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `{"pub": {"ch", "off", "data"}}`.
    Pub { ch: Arc<str>, off: u64 },
    /// `{"id": n, "ok" | "error": ...}`.
    Reply { id: u32 },
    /// `{"disconnect": {"code", ...}}`.
    Disconnect { code: u16 },
    /// Presence events and anything else.
    Other,
}

/// One protocol message (JSON text, no trailing newline).
#[derive(Debug, Clone)]
pub struct Message {
    pub text: Bytes,
    pub kind: Kind,
}

impl Message {
    pub fn new(text: Bytes) -> Message {
        let kind = classify(&text);
        Message { text, kind }
    }
}

/// Whether a channel's publications are conflated (its namespace's `conflate`).
pub type ConflateFn = Box<dyn Fn(&str) -> bool + Send + Sync>;

#[derive(Default)]
struct Queue {
    msgs: VecDeque<Message>,
    /// Messages ever taken out of the queue: `msgs[i]` has the absolute index `base + i`.
    base: u64,
    /// Conflated channel → absolute index of its pending publication.
    latest: HashMap<Arc<str>, u64>,
    /// Bytes of pending non-conflated messages.
    bytes: usize,
    /// A frame cut between two writes (never happens with the outbox's whole-frame chunks;
    /// kept so a partial chunk cannot corrupt the stream).
    partial: Vec<u8>,
    /// The close code once the outbox closed the connection (or the bound was passed).
    closed: Option<u16>,
    /// Replies queued since the last [`MessageWire::take_replies`] (poll sessions store them).
    replies: Vec<Bytes>,
}

/// The wire of one SSE stream or poll session. See the module docs.
pub struct MessageWire {
    q: Mutex<Queue>,
    notify: Notify,
    max_pending: usize,
    conflate: ConflateFn,
    metrics: Arc<Metrics>,
    /// Keep copies of replies for [`take_replies`](Self::take_replies).
    record_replies: bool,
    /// Drop the `disconnect` 4000 of a node shutdown: the session lives on in a shared store
    /// and another node continues it.
    survive_shutdown: bool,
}

impl MessageWire {
    pub fn new(max_pending: usize, conflate: ConflateFn, metrics: Arc<Metrics>) -> MessageWire {
        MessageWire {
            q: Mutex::new(Queue::default()),
            notify: Notify::new(),
            max_pending,
            conflate,
            metrics,
            record_replies: false,
            survive_shutdown: false,
        }
    }

    /// Keeps a copy of every reply for [`take_replies`](Self::take_replies).
    pub fn record_replies(mut self) -> MessageWire {
        self.record_replies = true;
        self
    }

    /// Swallows the node's shutdown `disconnect` (4000); the wire still closes.
    pub fn survive_shutdown(mut self, yes: bool) -> MessageWire {
        self.survive_shutdown = yes;
        self
    }

    /// Waits until messages were queued or the wire closed since the last take. One waiter at
    /// a time (a stored permit means a wake-up is never lost).
    pub async fn notified(&self) {
        self.notify.notified().await
    }

    /// Wakes the waiter without a message (a superseded poll, a moved session).
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// Whether anything is waiting to be taken.
    pub fn has_pending(&self) -> bool {
        !self.q.lock().msgs.is_empty()
    }

    /// The close code, once the connection closed.
    pub fn closed(&self) -> Option<u16> {
        self.q.lock().closed
    }

    /// Takes every pending message, oldest first, and the close code if the wire closed.
    pub fn take_all(&self) -> (Vec<Message>, Option<u16>) {
        let mut q = self.q.lock();
        let n = q.msgs.len();
        q.base += n as u64;
        q.latest.clear();
        q.bytes = 0;
        let msgs: Vec<Message> = q.msgs.drain(..).collect();
        (msgs, q.closed)
    }

    /// Replies queued since the last call (copies; they stay in the queue too).
    pub fn take_replies(&self) -> Vec<Bytes> {
        std::mem::take(&mut self.q.lock().replies)
    }

    /// Queues messages that did not come through the outbox (a moved session's stored
    /// replies), in front of nothing: they go after what is already pending.
    pub fn push_raw(&self, texts: impl IntoIterator<Item = Bytes>) {
        let mut q = self.q.lock();
        let mut any = false;
        for t in texts {
            if q.closed.is_some() {
                break;
            }
            self.push_locked(&mut q, Message::new(t));
            any = true;
        }
        drop(q);
        if any {
            self.notify.notify_one();
        }
    }

    fn push_locked(&self, q: &mut Queue, m: Message) {
        if let Kind::Pub { ch, .. } = &m.kind {
            if (self.conflate)(ch) {
                if let Some(&at) = q.latest.get(ch) {
                    if at >= q.base {
                        let i = (at - q.base) as usize;
                        q.msgs[i] = m;
                        self.metrics.conflated.fetch_add(1, Relaxed);
                        return;
                    }
                }
                let at = q.base + q.msgs.len() as u64;
                q.latest.insert(ch.clone(), at);
                q.msgs.push_back(m);
                return;
            }
        }
        if self.record_replies && matches!(m.kind, Kind::Reply { .. }) {
            q.replies.push(m.text.clone());
        }
        q.bytes += m.text.len();
        q.msgs.push_back(m);
        if q.bytes > self.max_pending {
            self.overflow(q);
        }
    }

    /// The client does not take its messages fast enough: drop them and close with 4008.
    fn overflow(&self, q: &mut Queue) {
        self.metrics.slow_consumers.fetch_add(1, Relaxed);
        self.metrics.dropped.fetch_add(q.msgs.len() as u64, Relaxed);
        q.msgs.clear();
        q.latest.clear();
        q.replies.clear();
        q.bytes = 0;
        let text = Bytes::from(encode_disconnect(Format::Json, close::SLOW_CONSUMER, "slow consumer"));
        q.msgs.push_back(Message { text, kind: Kind::Disconnect { code: close::SLOW_CONSUMER } });
        q.closed = Some(close::SLOW_CONSUMER);
    }

    /// Splits whole frames out of `buf` into the queue. Returns whether anything was queued.
    fn feed(&self, q: &mut Queue, buf: &[u8]) -> bool {
        let owned;
        let data: &[u8] = if q.partial.is_empty() {
            buf
        } else {
            let mut v = std::mem::take(&mut q.partial);
            v.extend_from_slice(buf);
            owned = v;
            &owned
        };
        // One copy of the chunk; every message below is a slice of it.
        let chunk = Bytes::copy_from_slice(data);
        let mut pos = 0;
        let mut queued = false;
        while q.closed.is_none() {
            let h = match websocket::parse_header(&chunk[pos..], usize::MAX, false) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox wrote a frame that does not parse; dropping the chunk");
                    return queued;
                }
            };
            let start = pos + h.header_len;
            let end = start + h.payload_len;
            if end > chunk.len() {
                break;
            }
            pos = end;
            match h.opcode {
                Opcode::Text => {
                    let payload = chunk.slice(start..end);
                    let mut at = 0;
                    for line in payload.split(|b| *b == b'\n') {
                        let len = line.len();
                        if len > 0 {
                            let m = Message::new(payload.slice(at..at + len));
                            if self.survive_shutdown && m.kind == (Kind::Disconnect { code: close::SHUTDOWN }) {
                                at += len + 1;
                                continue;
                            }
                            self.push_locked(q, m);
                            queued = true;
                        }
                        at += len + 1;
                    }
                }
                Opcode::Close => {
                    let code = chunk.get(start..start + 2).map_or(close::NORMAL, |c| u16::from_be_bytes([c[0], c[1]]));
                    q.closed = Some(code);
                    queued = true;
                }
                // Pings are the WebSocket heartbeat; the HTTP transports have their own.
                _ => {}
            }
        }
        if pos < chunk.len() && q.closed.is_none() {
            q.partial = chunk[pos..].to_vec();
        }
        queued
    }
}

impl Wire for MessageWire {
    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        let mut q = self.q.lock();
        if q.closed.is_some() {
            return Ok(buf.len());
        }
        let queued = self.feed(&mut q, buf);
        drop(q);
        if queued {
            self.notify.notify_one();
        }
        Ok(buf.len())
    }
}

/// Finds what a message is from its first bytes. The server's own encoders write these
/// prefixes (no whitespace, fixed key order), so no JSON parse is needed.
pub fn classify(text: &[u8]) -> Kind {
    if let Some(rest) = text.strip_prefix(b"{\"pub\":{\"ch\":\"") {
        if let Some(q) = rest.iter().position(|b| *b == b'"') {
            let ch = &rest[..q];
            if let (Ok(ch), Some(digits)) = (std::str::from_utf8(ch), rest[q..].strip_prefix(b"\",\"off\":")) {
                if let Some(off) = leading_number(digits) {
                    return Kind::Pub { ch: Arc::from(ch), off };
                }
            }
        }
        return Kind::Other;
    }
    if let Some(rest) = text.strip_prefix(b"{\"id\":") {
        if let Some(id) = leading_number(rest) {
            return Kind::Reply { id: u32::try_from(id).unwrap_or(0) };
        }
    }
    if let Some(rest) = text.strip_prefix(b"{\"disconnect\":{\"code\":") {
        if let Some(code) = leading_number(rest) {
            return Kind::Disconnect { code: u16::try_from(code).unwrap_or(close::PROTOCOL_ERROR) };
        }
    }
    Kind::Other
}

fn leading_number(b: &[u8]) -> Option<u64> {
    let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
    std::str::from_utf8(&b[..n]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::tests::delivery;
    use crate::outbox::{Frame, Outbox, Pushed};

    fn wire(max: usize) -> Arc<MessageWire> {
        Arc::new(MessageWire::new(max, Box::new(|ch| ch.starts_with("pt:")), Arc::new(Metrics::default())))
    }

    fn outbox(w: &Arc<MessageWire>) -> Outbox {
        Outbox::new(1, Format::Json, w.clone(), 1 << 20, Arc::new(Metrics::default()))
    }

    fn offs(msgs: &[Message]) -> Vec<(String, u64)> {
        msgs.iter()
            .filter_map(|m| match &m.kind {
                Kind::Pub { ch, off } => Some((ch.to_string(), *off)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn messages_classify_the_server_encodings() {
        let p = switchboard_protocol::message::encode_publication(
            Format::Json,
            "pt:a.b",
            42,
            &serde_json::value::RawValue::from_string("{\"v\":1}".into()).unwrap(),
        );
        assert_eq!(classify(&p), Kind::Pub { ch: "pt:a.b".into(), off: 42 });
        assert_eq!(classify(br#"{"id":7,"ok":{}}"#), Kind::Reply { id: 7 });
        assert_eq!(classify(&encode_disconnect(Format::Json, 4008, "x")), Kind::Disconnect { code: 4008 });
        assert_eq!(classify(br#"{"join":{"ch":"room:1","client":"c","user":""}}"#), Kind::Other);
    }

    #[test]
    fn messages_split_merged_frames_into_messages() {
        let w = wire(1 << 20);
        let ob = outbox(&w);
        assert_eq!(ob.push(delivery("a", 1, "1"), false), Pushed::Schedule);
        for i in 2..=5 {
            let _ = ob.push(delivery("a", i, "\"x\""), false);
        }
        ob.push_message(br#"{"id":3,"ok":{}}"#);
        ob.flush();
        let (msgs, closed) = w.take_all();
        assert_eq!(closed, None);
        assert_eq!(offs(&msgs), (1..=5).map(|i| ("a".to_string(), i)).collect::<Vec<_>>());
        assert_eq!(msgs[5].kind, Kind::Reply { id: 3 });
        assert!(w.take_all().0.is_empty());
    }

    #[test]
    fn messages_conflate_pending_point_values_in_place() {
        let w = wire(1 << 20);
        let ob = outbox(&w);
        for i in 1..=100 {
            if ob.push(delivery("pt:x", i, &i.to_string()), true) == Pushed::Schedule {
                ob.flush();
            }
            if ob.push(delivery("ev", i, "0"), false) == Pushed::Schedule {
                ob.flush();
            }
        }
        let (msgs, _) = w.take_all();
        let got = offs(&msgs);
        assert_eq!(got.iter().filter(|(c, _)| c == "pt:x").count(), 1, "one pending value per point channel");
        assert_eq!(got.iter().find(|(c, _)| c == "pt:x").unwrap().1, 100);
        assert_eq!(
            got.iter().filter(|(c, _)| c == "ev").map(|(_, o)| *o).collect::<Vec<_>>(),
            (1..=100).collect::<Vec<_>>()
        );
        // After a take, the next value is queued anew.
        let _ = ob.push(delivery("pt:x", 101, "1"), true);
        ob.flush();
        assert_eq!(offs(&w.take_all().0), vec![("pt:x".to_string(), 101)]);
    }

    #[test]
    fn messages_overflow_closes_with_4008_and_drops_the_backlog() {
        let w = wire(2000);
        let ob = outbox(&w);
        for i in 1..=200 {
            if ob.push(delivery("ev", i, "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\""), false) == Pushed::Schedule {
                ob.flush();
            }
        }
        let (msgs, closed) = w.take_all();
        assert_eq!(closed, Some(4008));
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].kind, Kind::Disconnect { code: 4008 });
    }

    #[test]
    fn messages_close_frame_closes_the_wire_after_the_disconnect() {
        let w = wire(1 << 20);
        let ob = outbox(&w);
        ob.close(4000, "server shutting down", false);
        let (msgs, closed) = w.take_all();
        assert_eq!(closed, Some(4000));
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].kind, Kind::Disconnect { code: 4000 });
        let w2 = Arc::new(
            MessageWire::new(1 << 20, Box::new(|_| false), Arc::new(Metrics::default())).survive_shutdown(true),
        );
        let ob = outbox(&w2);
        ob.close(4000, "server shutting down", false);
        let (msgs, closed) = w2.take_all();
        assert_eq!(closed, Some(4000));
        assert!(msgs.is_empty(), "the shutdown disconnect is swallowed");
    }

    #[test]
    fn messages_recorded_replies_are_copies() {
        let w = Arc::new(MessageWire::new(1 << 20, Box::new(|_| false), Arc::new(Metrics::default())).record_replies());
        let ob = outbox(&w);
        ob.push_message(br#"{"id":1,"ok":{}}"#);
        let _ = ob.push_frame(&Frame::message(Format::Json, br#"{"join":{"ch":"r","client":"c","user":""}}"#));
        ob.flush();
        assert_eq!(w.take_replies(), vec![Bytes::from_static(br#"{"id":1,"ok":{}}"#)]);
        assert_eq!(w.take_all().0.len(), 2);
    }
}
