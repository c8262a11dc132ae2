//! The taking side of an outbox, for the HTTP transports, whose socket hyper holds (long-poll
//! sessions, their SSE streams, plain SSE streams).
//!
//! A WebSocket outbox writes into its socket; such a transport has no socket the fan-out could
//! write to — hyper writes its response body — so its outbox keeps what is queued until the
//! transport takes it ([`Outbox::take_messages`], or framed: `outbox::framed`), woken by
//! [`Outbox::notified`]. What waits there is under the same rules as a WebSocket connection's
//! queue, applied in one place: a conflated channel keeps only its latest value, and the
//! `max_pending_bytes` bound closes a client that does not take its messages with 4008.
//!
//! The transport gets typed messages ([`crate::message`]): a publication comes with the
//! channel and offset the hub delivered it with, and its text is a slice of the frame every
//! subscriber shares (no copy, no parse); a reply, a presence event or a notice with the kind
//! its sender gave it, a subscribe's reply with what each channel came to.

use bytes::Bytes;

use super::framed::Taken;
use super::{Outbox, Sink};
use crate::message::{Kind, Message};

/// How a taking outbox treats what its transport needs beyond the queue.
#[derive(Debug, Clone, Copy, Default)]
pub struct PullOptions {
    /// Keep a copy of every reply for [`Outbox::take_replies`] (poll sessions store them).
    pub record_replies: bool,
    /// Drop the `disconnect` 4000 of a node shutdown: the session lives on in a shared store
    /// and another node continues it. The outbox still closes.
    pub survive_shutdown: bool,
    /// The poll session it serves is what expires it (no poll or stream for the session's
    /// ttl): the node's heartbeat, which closes connections silent for three ping intervals,
    /// leaves it alone.
    pub expires_with_session: bool,
}

impl Outbox {
    /// Whether the outbox's poll session decides when it is gone ([`PullOptions`]).
    pub fn expires_with_session(&self) -> bool {
        self.pull_options().expires_with_session
    }

    pub(super) fn pull_options(&self) -> PullOptions {
        match &self.sink {
            Sink::Pull(o) => *o,
            Sink::Socket(_) => PullOptions::default(),
        }
    }

    /// Whether a message of `kind` is kept for [`Outbox::take_replies`]: a reply, in an
    /// outbox that records them.
    pub(super) fn records(&self, kind: &Kind) -> bool {
        matches!(kind, Kind::Reply { .. }) && self.pull_options().record_replies
    }

    /// Takes every queued message, oldest first, and the close code once the outbox closed.
    /// Nothing is taken while a subscribe holds the outbox (its reply goes first).
    pub fn take_messages(&self) -> (Vec<Message>, Option<u16>) {
        let mut st = self.state.lock();
        if st.hold > 0 {
            return (Vec::new(), None);
        }
        let mut out = Vec::with_capacity(st.queue.len());
        self.take_each(&mut st, usize::MAX, |t| {
            // Transport bytes (a WebSocket pong) are not messages.
            if let Taken::Message(m) = t {
                out.push(m);
            }
            0
        });
        (out, st.close_code)
    }

    /// Replies queued since the last call, with what they are (with
    /// [`PullOptions::record_replies`]; they are taken with the other messages too).
    pub fn take_replies(&self) -> Vec<Message> {
        std::mem::take(&mut self.state.lock().replies)
    }

    /// Queues messages that did not come from this node's session (a moved session's stored
    /// replies, as the client is to get them), after what is already queued.
    pub fn push_raw(&self, texts: impl IntoIterator<Item = Bytes>) {
        for t in texts {
            let _ = self.push_message(&t, Kind::Other);
        }
        self.flush();
    }

    /// Whether anything can be taken.
    pub fn has_pending(&self) -> bool {
        let st = self.state.lock();
        st.hold == 0 && !st.queue.is_empty()
    }

    /// The close code, once the outbox closed.
    pub fn closed(&self) -> Option<u16> {
        self.state.lock().close_code
    }

    /// Wakes the taker without a message (a superseded poll, a moved session).
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::metrics::Metrics;
    use crate::outbox::tests::delivery;
    use crate::outbox::{Frame, Pushed};
    use std::sync::Arc;
    use switchboard_protocol::Format;

    fn taking(max: usize, opts: PullOptions) -> Outbox {
        Outbox::new_pull(1, max, Arc::new(Metrics::default()), opts)
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
    fn pull_publications_come_with_their_channel_and_offset_and_the_shared_text() {
        let ob = taking(1 << 20, PullOptions::default());
        let d = delivery("a", 1, "1");
        let shared = d.frame.bytes.clone();
        assert_eq!(ob.push(d, false), Pushed::Schedule);
        for i in 2..=5 {
            let _ = ob.push(delivery("a", i, "\"x\""), false);
        }
        ob.push_message(br#"{"id":3,"ok":{}}"#, Kind::reply(3));
        ob.flush();
        let (msgs, closed) = ob.take_messages();
        assert_eq!(closed, None);
        assert_eq!(offs(&msgs), (1..=5).map(|i| ("a".to_string(), i)).collect::<Vec<_>>());
        assert!(matches!(msgs[5].kind, Kind::Reply { id: 3, .. }));
        // The text is the frame's payload, not a copy of it.
        assert_eq!(msgs[0].text.as_ptr(), shared[shared.len() - msgs[0].text.len()..].as_ptr());
        assert!(ob.take_messages().0.is_empty());
        assert!(!ob.has_pending());
    }

    #[test]
    fn pull_conflates_pending_point_values_in_place() {
        let ob = taking(1 << 20, PullOptions::default());
        for i in 1..=100 {
            if ob.push(delivery("pt:x", i, &i.to_string()), true) == Pushed::Schedule {
                ob.flush();
            }
            if ob.push(delivery("ev", i, "0"), false) == Pushed::Schedule {
                ob.flush();
            }
        }
        let got = offs(&ob.take_messages().0);
        assert_eq!(got.iter().filter(|(c, _)| c == "pt:x").count(), 1, "one pending value per point channel");
        assert_eq!(got.iter().find(|(c, _)| c == "pt:x").unwrap().1, 100);
        assert_eq!(
            got.iter().filter(|(c, _)| c == "ev").map(|(_, o)| *o).collect::<Vec<_>>(),
            (1..=100).collect::<Vec<_>>()
        );
        // After a take, the next value is queued anew.
        let _ = ob.push(delivery("pt:x", 101, "1"), true);
        ob.flush();
        assert_eq!(offs(&ob.take_messages().0), vec![("pt:x".to_string(), 101)]);
    }

    #[test]
    fn pull_past_the_bound_closes_with_4008_and_drops_the_backlog() {
        let ob = taking(2000, PullOptions::default());
        for i in 1..=200 {
            if ob.push(delivery("ev", i, "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\""), false) == Pushed::Schedule {
                ob.flush();
            }
        }
        let (msgs, closed) = ob.take_messages();
        assert_eq!(closed, Some(4008));
        assert_eq!(msgs.len(), 1);
        assert!(matches!(msgs[0].kind, Kind::Disconnect { code: 4008 }));
        assert_eq!(ob.closed(), Some(4008));
    }

    #[test]
    fn pull_close_gives_the_disconnect_then_the_code_and_a_shared_session_survives_shutdown() {
        let ob = taking(1 << 20, PullOptions::default());
        ob.close(4000, "server shutting down", false);
        let (msgs, closed) = ob.take_messages();
        assert_eq!(closed, Some(4000));
        assert_eq!(msgs.len(), 1);
        assert!(matches!(msgs[0].kind, Kind::Disconnect { code: 4000 }));
        assert!(ob.finished());
        let ob = taking(1 << 20, PullOptions { survive_shutdown: true, ..Default::default() });
        ob.close(4000, "server shutting down", false);
        let (msgs, closed) = ob.take_messages();
        assert_eq!(closed, Some(4000));
        assert!(msgs.is_empty(), "the shutdown disconnect is swallowed");
    }

    #[test]
    fn pull_recorded_replies_are_copies_and_held_messages_wait_for_the_reply() {
        let ob = taking(1 << 20, PullOptions { record_replies: true, ..Default::default() });
        ob.push_message(br#"{"id":1,"ok":{}}"#, Kind::reply(1));
        let _ =
            ob.push_frame(&Frame::message(Format::Json, br#"{"join":{"ch":"r","client":"c","user":""}}"#), Kind::Join);
        ob.flush();
        let replies = ob.take_replies();
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].text, Bytes::from_static(br#"{"id":1,"ok":{}}"#));
        assert!(matches!(replies[0].kind, Kind::Reply { id: 1, .. }));
        assert_eq!(ob.take_messages().0.len(), 2);
        // A subscribe in progress: its channel's publication waits, and comes after the reply.
        ob.hold();
        let _ = ob.push(delivery("a", 9, "1"), false);
        assert!(!ob.has_pending());
        assert!(ob.take_messages().0.is_empty());
        ob.release(br#"{"id":2,"ok":{}}"#, Kind::reply(2), &std::collections::HashMap::new());
        let (msgs, _) = ob.take_messages();
        assert!(matches!(msgs[0].kind, Kind::Reply { id: 2, .. }));
        assert_eq!(offs(&msgs), vec![("a".to_string(), 9)]);
        assert_eq!(ob.take_replies().len(), 1);
    }
}
