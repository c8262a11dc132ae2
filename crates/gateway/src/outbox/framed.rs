//! Outboxes whose transport frames its own messages (Server-Sent Events).
//!
//! A WebSocket outbox writes the hub's pre-framed shared bytes. An SSE stream needs the same
//! messages as events (`id:` and `data:` lines, positions that are the stream's own), so its
//! outbox carries a [`Framer`] that turns each taken message into event bytes — under the
//! outbox's lock, in the order the queue holds them, with the one conflation and memory bound
//! of the queue — and keeps what is queued until the response body takes it framed
//! ([`Outbox::take_framed`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use switchboard_protocol::code::close;
use switchboard_protocol::Format;

use super::{Item, OutState, Outbox, PullOptions, Sink};
use crate::message::{Kind, Message};
use crate::metrics::Metrics;

/// Turns taken messages into a transport's bytes.
pub trait Framer: Send + 'static {
    /// Appends `m`, framed, to `out`.
    fn frame(&mut self, out: &mut Vec<u8>, m: &Message);
}

/// One item taken off the queue.
pub(super) enum Taken {
    Message(Message),
    /// Bytes the transport queued already framed (an SSE comment, a WebSocket control frame).
    Raw(Bytes),
}

impl Outbox {
    /// An outbox (JSON) whose messages `framer` turns into bytes, kept until the transport
    /// takes them ([`Outbox::take_framed`]).
    pub fn new_framed(id: u64, framer: Box<dyn Framer>, max_pending: usize, metrics: Arc<Metrics>) -> Outbox {
        let ob = Outbox::with_sink(id, Format::Json, Sink::Pull(PullOptions::default()), max_pending, metrics);
        ob.state.lock().framer = Some(framer);
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
                Item::Message { frame, kind, born } => {
                    st.pending = st.pending.saturating_sub(frame.bytes.len());
                    if let Some(b) = born {
                        self.metrics.observe_lag(now.saturating_duration_since(b));
                    }
                    if matches!(kind, Kind::Pub { .. }) {
                        delivered += 1;
                    }
                    Taken::Message(Message { text: frame.into_payload(), kind })
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
                if survive && matches!(m.kind, Kind::Disconnect { code: close::SHUTDOWN }) {
                    continue;
                }
            }
            size += f(taken);
        }
        self.metrics.deliveries.fetch_add(delivered, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::outbox::tests::delivery;
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

    #[test]
    fn framed_conflation_bound_and_close_are_the_queues() {
        let ob = Outbox::new_framed(1, Box::new(Tags), 4000, Arc::new(Metrics::default()));
        for i in 1..=50 {
            let _ = ob.push(delivery("pt:x", i, "1"), true);
        }
        assert_eq!(
            ob.take_framed(),
            (Bytes::from_static(b"pt:x/50;"), None),
            "one pending value per conflated channel"
        );
        for i in 1..=200 {
            let _ = ob.push(delivery("ev", i, "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\""), false);
        }
        assert!(ob.is_closing(), "past the bound: 4008");
        assert_eq!(ob.take_framed(), (Bytes::from_static(b"bye 4008;"), Some(4008)), "the backlog is dropped");
    }

    #[test]
    fn framed_take_gives_the_framed_backlog_and_the_close_code() {
        let ob = Outbox::new_framed(1, Box::new(Tags), 1 << 20, Arc::new(Metrics::default()));
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
