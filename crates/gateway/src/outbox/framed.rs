//! Outboxes whose transport frames its own messages (Server-Sent Events).
//!
//! A WebSocket outbox writes the hub's pre-framed shared bytes. An SSE stream needs the same
//! messages as events (`id:` and `data:` lines, positions that are the stream's own), so its
//! outbox carries a [`Framer`] that turns each taken message into event bytes — under the
//! outbox's lock, in the order the queue holds them, with the one conflation and memory bound
//! of the queue.
//!
//! Such an outbox either writes into a socket the stream owns, exactly like a WebSocket
//! outbox — whoever finds it idle frames what is queued and calls `try_write`, so a delivery
//! costs one write call and no task wake-up ([`Outbox::new_framed`] with a wire) — or, when
//! hyper owns the connection, keeps what is queued until the response body takes it framed
//! ([`Outbox::take_framed`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use switchboard_protocol::code::close;
use switchboard_protocol::Format;

use super::{Item, OutState, Outbox, PullOptions, Sink, Wire, MAX_CHUNK};
use crate::metrics::Metrics;
use crate::outbox::{Kind, Message};

/// Turns taken messages into a transport's bytes.
pub trait Framer: Send + 'static {
    /// Appends `m`, framed, to `out`.
    fn frame(&mut self, out: &mut Vec<u8>, m: &Message);

    /// Hands over what the framer keeps of its own for its transport to read (a session's
    /// stream: the position it wrote last); [`Outbox::settle_framer`] calls it under the
    /// outbox's lock.
    fn settle(&mut self) {}

    /// Whether the framer writes one whole answer (a held poll's) rather than a stream: then
    /// everything queued is framed into one chunk, wrapped by [`Framer::seal`], and nothing is
    /// framed after it (what comes next waits in the queue for the next taker).
    fn once(&self) -> bool {
        false
    }

    /// Wraps the one answer's framed messages (its HTTP head, the batch around them).
    fn seal(&mut self, framed: Vec<u8>) -> Bytes {
        Bytes::from(framed)
    }
}

/// One item taken off the queue.
pub(super) enum Taken {
    Message(Message),
    /// Bytes the transport queued already framed (an SSE comment, a WebSocket control frame).
    Raw(Bytes),
}

impl Outbox {
    /// An outbox (JSON) whose messages `framer` turns into bytes. With `wire`, they are written
    /// into it; nothing is written until the transport's first [`Outbox::flush_blocked`], so
    /// the transport writes its response head first. Without, the transport takes them
    /// ([`Outbox::take_framed`]).
    pub fn new_framed(
        id: u64,
        wire: Option<Arc<dyn Wire>>,
        framer: Box<dyn Framer>,
        max_pending: usize,
        metrics: Arc<Metrics>,
    ) -> Outbox {
        let starts_blocked = wire.is_some();
        let sink = match wire {
            Some(w) => Sink::Framed(w),
            None => Sink::Pull(PullOptions::default()),
        };
        let ob = Outbox::with_sink(id, Format::Json, sink, max_pending, metrics);
        {
            let mut st = ob.state.lock();
            st.framer = Some(framer);
            st.blocked = starts_blocked;
        }
        ob
    }

    /// Takes what is queued, framed, and the close code once the outbox closed. Nothing is
    /// taken while a subscribe holds the outbox (its reply goes first).
    pub fn take_framed(&self) -> (Bytes, Option<u16>) {
        let mut st = self.state.lock();
        if st.hold > 0 {
            return (Bytes::new(), None);
        }
        let out = self.frame_queue(&mut st, usize::MAX);
        (Bytes::from(out), st.close_code)
    }

    /// Lets the attached framer hand over what it keeps of its own ([`Framer::settle`]).
    pub fn settle_framer(&self) {
        if let Some(f) = self.state.lock().framer.as_mut() {
            f.settle();
        }
    }

    /// Frames queued items with the outbox's framer, up to about `limit` bytes.
    pub(super) fn frame_queue(&self, st: &mut OutState, limit: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let Some(mut framer) = st.framer.take() else { return out };
        self.take_each(st, limit, |t| {
            let before = out.len();
            match t {
                Taken::Message(m) => framer.frame(&mut out, &m),
                Taken::Raw(b) => out.extend_from_slice(&b),
            }
            out.len() - before
        });
        st.framer = Some(framer);
        out
    }

    /// Moves queued items into `current` framed, up to MAX_CHUNK (a socket-writing framed
    /// outbox's `next_chunk`).
    pub(super) fn next_framed_chunk(&self, st: &mut OutState) -> bool {
        if st.framer.as_ref().is_some_and(|f| f.once()) {
            return self.next_answer(st);
        }
        let out = self.frame_queue(st, MAX_CHUNK);
        if out.is_empty() {
            return false;
        }
        st.current = Bytes::from(out);
        true
    }

    /// A one-answer framer's chunk: everything queued, sealed, once.
    fn next_answer(&self, st: &mut OutState) -> bool {
        if st.sealed || st.queue.is_empty() {
            return false;
        }
        let out = self.frame_queue(st, usize::MAX);
        let Some(framer) = st.framer.as_mut() else { return false };
        st.current = framer.seal(out);
        st.sealed = true;
        true
    }

    /// Takes queued items, oldest first, handing each to `f` (which returns the bytes it
    /// produced), until the queue is empty or `limit` bytes were produced. A publication comes
    /// with the channel and offset the hub delivered it with and the text of its shared frame.
    pub(super) fn take_each(&self, st: &mut OutState, limit: usize, mut f: impl FnMut(Taken) -> usize) {
        let survive = self.pull_options().survive_shutdown;
        let now = Instant::now();
        let mut delivered = 0u64;
        let mut size = 0usize;
        while size < limit {
            let Some(item) = st.queue.pop_front() else { break };
            let taken = match item {
                Item::Message { frame, channel, offset, born } => {
                    st.pending = st.pending.saturating_sub(frame.bytes.len());
                    if let Some(b) = born {
                        self.metrics.observe_lag(now.saturating_duration_since(b));
                    }
                    let text = frame.into_payload();
                    Taken::Message(match channel {
                        Some(ch) => {
                            delivered += 1;
                            Message { text, kind: Kind::Pub { ch, off: offset } }
                        }
                        None => Message::new(text),
                    })
                }
                Item::Latest(ch) => {
                    let Some(d) = st.latest.remove(&ch) else { continue };
                    self.metrics.observe_lag(now.saturating_duration_since(d.born));
                    delivered += 1;
                    Taken::Message(Message { text: d.frame.into_payload(), kind: Kind::Pub { ch, off: d.offset } })
                }
                Item::Control(b) => {
                    st.pending = st.pending.saturating_sub(b.len());
                    Taken::Raw(b)
                }
            };
            if let Taken::Message(m) = &taken {
                if survive && m.kind == (Kind::Disconnect { code: close::SHUTDOWN }) {
                    continue;
                }
            }
            size += f(taken);
        }
        self.metrics.deliveries.fetch_add(delivered, Relaxed);
    }

    /// Whether anything was written since the last call (a stream's heartbeat is for silence).
    pub fn wrote_since(&self) -> bool {
        std::mem::take(&mut self.state.lock().wrote)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::outbox::tests::{delivery, TestWire};
    use crate::outbox::Pushed;

    /// Frames a publication as `<ch>/<off>;` and anything else as `?;`.
    struct Tags;

    impl Framer for Tags {
        fn frame(&mut self, out: &mut Vec<u8>, m: &Message) {
            match &m.kind {
                Kind::Pub { ch, off } => out.extend_from_slice(format!("{ch}/{off};").as_bytes()),
                Kind::Disconnect { code } => out.extend_from_slice(format!("bye {code};").as_bytes()),
                _ => out.extend_from_slice(b"?;"),
            }
        }
    }

    fn written(w: &TestWire) -> String {
        String::from_utf8(w.written.lock().clone()).unwrap()
    }

    #[test]
    fn framed_socket_writes_nothing_before_the_transport_opens_it_then_each_delivery_in_one_write() {
        let wire = TestWire::open(usize::MAX);
        let ob = Outbox::new_framed(1, Some(wire.clone()), Box::new(Tags), 1 << 20, Arc::new(Metrics::default()));
        assert_eq!(ob.push(delivery("a", 1, "1"), false), Pushed::Queued, "blocked until opened");
        ob.push_message(br#"{"id":1,"ok":{}}"#);
        assert_eq!(written(&wire), "");
        ob.flush_blocked();
        assert_eq!(written(&wire), "a/1;?;");
        let writes = wire.writes.load(Relaxed);
        assert_eq!(ob.push(delivery("a", 2, "1"), false), Pushed::Schedule);
        ob.flush();
        assert_eq!(written(&wire), "a/1;?;a/2;");
        assert_eq!(wire.writes.load(Relaxed), writes + 1);
        assert!(ob.wrote_since());
        assert!(!ob.wrote_since());
    }

    #[test]
    fn framed_conflation_bound_and_close_are_the_queues() {
        let wire = TestWire::open(0);
        let ob = Outbox::new_framed(1, Some(wire.clone()), Box::new(Tags), 4000, Arc::new(Metrics::default()));
        ob.flush_blocked();
        for i in 1..=50 {
            let _ = ob.push(delivery("pt:x", i, "1"), true);
        }
        *wire.room.lock() = usize::MAX;
        ob.flush_blocked();
        assert_eq!(written(&wire), "pt:x/50;", "one pending value per conflated channel");
        *wire.room.lock() = 0;
        for i in 1..=200 {
            let _ = ob.push(delivery("ev", i, "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\""), false);
        }
        assert!(ob.is_closing(), "past the bound: 4008");
        *wire.room.lock() = usize::MAX;
        ob.flush_blocked();
        assert_eq!(written(&wire), "pt:x/50;bye 4008;", "the backlog is dropped, no WebSocket close frame");
        assert!(ob.finished());
    }

    #[test]
    fn framed_take_gives_the_framed_backlog_and_the_close_code() {
        let ob = Outbox::new_framed(1, None, Box::new(Tags), 1 << 20, Arc::new(Metrics::default()));
        for i in 1..=3 {
            if ob.push(delivery("a", i, "1"), false) == Pushed::Schedule {
                ob.flush();
            }
        }
        let _ = ob.push_control(Bytes::from_static(b": ping;"));
        assert_eq!(ob.take_framed(), (Bytes::from_static(b"a/1;a/2;a/3;: ping;"), None));
        ob.close(4000, "server shutting down", false);
        assert_eq!(ob.take_framed(), (Bytes::from_static(b"bye 4000;"), Some(4000)));
    }
}
