//! The taking side of an outbox, for the HTTP transports whose socket hyper holds (long-poll
//! sessions, their SSE streams, and plain SSE streams that do not own their connection).
//!
//! A WebSocket outbox writes into its socket; such a transport has no socket the fan-out could
//! write to — hyper writes its response body — so its outbox keeps what is queued until the
//! transport takes it ([`Outbox::take_messages`], or framed: `outbox::framed`), woken by
//! [`Outbox::notified`]. What waits there is under the same rules as a WebSocket connection's
//! queue, applied in one place: a conflated channel keeps only its latest value, and the
//! `max_pending_bytes` bound closes a client that does not take its messages with 4008.
//!
//! A session's event stream that owns its socket attaches it for as long as it runs
//! ([`Outbox::attach`]): meanwhile the outbox is written like a framed one, by whoever finds
//! it idle; detached, what is queued waits for the taker again. A held poll on a connection
//! the node reads itself attaches its socket the same way, with a framer that writes one
//! answer ([`Framer::once`](super::Framer::once)): the first deliveries become the poll's
//! whole answer, and what comes after it waits for the next poll — or for the same framer,
//! [`Outbox::rearm`]ed by a next poll that continues the last.
//!
//! The transport gets structured messages: a publication comes with the channel and offset
//! the hub delivered it with, and its text is a slice of the frame every subscriber shares
//! (no copy, no parse). Replies, presence events and notices are told apart by their first
//! bytes ([`classify`]); there are few of them.

use std::sync::Arc;

use bytes::Bytes;
use switchboard_protocol::code::close;

use super::framed::Taken;
use super::{Frame, Framer, OutState, Outbox, Sink, Wire};

/// What a taken message is.
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
            Sink::Socket(_) | Sink::Framed(_) => PullOptions::default(),
        }
    }

    /// Keeps a copy of `frame` when it is a reply and replies are recorded.
    pub(super) fn record_reply(&self, st: &mut OutState, frame: &Frame) {
        if self.pull_options().record_replies && matches!(classify(frame.payload()), Kind::Reply { .. }) {
            st.replies.push(frame.payload_bytes());
        }
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

    /// Replies queued since the last call (with [`PullOptions::record_replies`]; they are
    /// taken with the other messages too).
    pub fn take_replies(&self) -> Vec<Bytes> {
        std::mem::take(&mut self.state.lock().replies)
    }

    /// Queues messages that did not come from this node's session (a moved session's stored
    /// replies), after what is already queued.
    pub fn push_raw(&self, texts: impl IntoIterator<Item = Bytes>) {
        for t in texts {
            let _ = self.push_message(&t);
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

    /// Has the fan-out write into `wire` from now on, each message framed by `framer`, as a
    /// framed outbox does, until [`Outbox::detach`]; what is queued stays and is written
    /// first. Nothing is written before the transport's first [`Outbox::flush_blocked`] (its
    /// own bytes go first). The receiver completes when the wire is detached (by whoever
    /// takes the outbox over): with `Ok` when a chunk was left half written in it, else with
    /// `Err`. Replaces a wire attached before, which is detached.
    pub fn attach(&self, wire: Arc<dyn Wire>, framer: Box<dyn Framer>) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut st = self.state.lock();
        st.attached = Some((wire, tx));
        st.framer = Some(framer);
        st.blocked = true;
        st.sealed = false;
        st.current = Bytes::new();
        rx
    }

    /// Lets the one-answer framer attached with `wire` answer again (its client asked for the
    /// next answer), once its answer is written whole; writes what is queued meanwhile. False
    /// when `wire` is not attached, or its answer is not yet written whole.
    pub fn rearm(&self, wire: &Arc<dyn Wire>) -> bool {
        let mut st = self.state.lock();
        if !st.holds(wire) || !st.sealed || !st.current.is_empty() || st.blocked || st.dead {
            return false;
        }
        st.sealed = false;
        if st.hold == 0 {
            self.write_locked(&mut st);
        }
        true
    }

    /// Detaches `wire`, attached with a one-answer framer, if that framer has not answered
    /// yet (a held poll's time is up): true when it was detached, and the taker answers.
    pub fn detach_unanswered(&self, wire: &Arc<dyn Wire>) -> bool {
        let mut st = self.state.lock();
        st.holds(wire) && !st.sealed && self.detach_locked(&mut st)
    }

    /// Back to being taken: the attached wire (if any) gets nothing more, and what is queued
    /// waits for the taker again. A chunk half written into the wire is that wire's, cut. A wire
    /// that fails is detached the same way. True when a wire was attached.
    pub fn detach(&self) -> bool {
        self.detach_locked(&mut self.state.lock())
    }

    /// Detaches `wire` if it is still the one attached (its transport ends; a later one may
    /// have taken its place already).
    pub fn detach_if(&self, wire: &Arc<dyn Wire>) -> bool {
        let mut st = self.state.lock();
        st.holds(wire) && self.detach_locked(&mut st)
    }

    pub(super) fn detach_locked(&self, st: &mut OutState) -> bool {
        let Some((_, tx)) = st.attached.take() else { return false };
        if !st.current.is_empty() {
            // The wire's transport learns that its last chunk was cut short.
            let _ = tx.send(());
        }
        st.framer = None;
        st.sealed = false;
        st.current = Bytes::new();
        st.blocked = false;
        if !st.queue.is_empty() || st.close_code.is_some() {
            self.wake.notify_one();
        }
        true
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
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::metrics::Metrics;
    use crate::outbox::tests::delivery;
    use crate::outbox::Pushed;
    use switchboard_protocol::message::encode_disconnect;
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
    fn pull_classify_knows_the_server_encodings() {
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
    fn pull_publications_come_with_their_channel_and_offset_and_the_shared_text() {
        let ob = taking(1 << 20, PullOptions::default());
        let d = delivery("a", 1, "1");
        let shared = d.frame.bytes.clone();
        assert_eq!(ob.push(d, false), Pushed::Schedule);
        for i in 2..=5 {
            let _ = ob.push(delivery("a", i, "\"x\""), false);
        }
        ob.push_message(br#"{"id":3,"ok":{}}"#);
        ob.flush();
        let (msgs, closed) = ob.take_messages();
        assert_eq!(closed, None);
        assert_eq!(offs(&msgs), (1..=5).map(|i| ("a".to_string(), i)).collect::<Vec<_>>());
        assert_eq!(msgs[5].kind, Kind::Reply { id: 3 });
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
        assert_eq!(msgs[0].kind, Kind::Disconnect { code: 4008 });
        assert_eq!(ob.closed(), Some(4008));
    }

    #[test]
    fn pull_close_gives_the_disconnect_then_the_code_and_a_shared_session_survives_shutdown() {
        let ob = taking(1 << 20, PullOptions::default());
        ob.close(4000, "server shutting down", false);
        let (msgs, closed) = ob.take_messages();
        assert_eq!(closed, Some(4000));
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].kind, Kind::Disconnect { code: 4000 });
        assert!(ob.finished());
        let ob = taking(1 << 20, PullOptions { survive_shutdown: true, ..Default::default() });
        ob.close(4000, "server shutting down", false);
        let (msgs, closed) = ob.take_messages();
        assert_eq!(closed, Some(4000));
        assert!(msgs.is_empty(), "the shutdown disconnect is swallowed");
    }

    /// Frames a taken message as its text and `;`.
    struct Texts;

    impl crate::outbox::Framer for Texts {
        fn frame(&mut self, out: &mut Vec<u8>, m: &Message) {
            out.extend_from_slice(&m.text);
            out.push(b';');
        }
    }

    /// A socket whose client is gone.
    struct Broken;

    impl Wire for Broken {
        fn try_write(&self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn pull_attached_wire_is_written_by_the_pusher_until_detached_then_messages_wait_again() {
        use crate::outbox::tests::TestWire;
        use tokio::sync::oneshot::error::TryRecvError;
        let ob = taking(1 << 20, PullOptions::default());
        let _ = ob.push(delivery("a", 1, "1"), false);
        ob.flush();
        let wire = TestWire::open(usize::MAX);
        let w: Arc<dyn Wire> = wire.clone();
        let mut rx = ob.attach(w.clone(), Box::new(Texts));
        let written = || String::from_utf8(wire.written.lock().clone()).unwrap();
        assert_eq!(written(), "", "nothing before the transport's own bytes");
        ob.flush_blocked();
        assert_eq!(written(), r#"{"pub":{"ch":"a","off":1,"data":1}};"#, "what waited goes first");
        let writes = wire.writes.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(ob.push(delivery("a", 2, "2"), false), Pushed::Schedule);
        ob.flush();
        assert!(written().ends_with(r#"{"pub":{"ch":"a","off":2,"data":2}};"#), "{}", written());
        assert_eq!(wire.writes.load(std::sync::atomic::Ordering::Relaxed), writes + 1, "one write per delivery");
        assert!(ob.take_messages().0.is_empty());
        // Only the attached wire detaches itself; a successor is not detached by its predecessor.
        let other: Arc<dyn Wire> = TestWire::open(usize::MAX);
        assert!(!ob.detach_if(&other));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        assert!(ob.detach_if(&w));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Closed), "the transport learns it was detached");
        let before = written();
        if ob.push(delivery("a", 3, "3"), false) == Pushed::Schedule {
            ob.flush();
        }
        assert_eq!(written(), before, "a detached wire gets nothing more");
        assert_eq!(offs(&ob.take_messages().0), vec![("a".to_string(), 3)]);
        // A wire that fails is detached; the outbox stays open and keeps what comes next.
        let mut rx = ob.attach(Arc::new(Broken), Box::new(Texts));
        ob.flush_blocked();
        if ob.push(delivery("a", 4, "4"), false) == Pushed::Schedule {
            ob.flush();
        }
        assert_eq!(rx.try_recv(), Ok(()), "the chunk the wire failed on is cut");
        assert!(!ob.is_closing());
        if ob.push(delivery("a", 5, "5"), false) == Pushed::Schedule {
            ob.flush();
        }
        assert_eq!(offs(&ob.take_messages().0), vec![("a".to_string(), 5)]);
    }

    /// Frames one answer: the texts between `<` and `>`.
    struct OneAnswer;

    impl crate::outbox::Framer for OneAnswer {
        fn frame(&mut self, out: &mut Vec<u8>, m: &Message) {
            out.extend_from_slice(&m.text);
        }

        fn once(&self) -> bool {
            true
        }

        fn seal(&mut self, framed: Vec<u8>) -> Bytes {
            Bytes::from([b"<".as_slice(), &framed, b">"].concat())
        }
    }

    #[test]
    fn pull_a_one_answer_framer_writes_what_is_queued_once_then_messages_wait_again() {
        use crate::outbox::tests::TestWire;
        let ob = taking(1 << 20, PullOptions::default());
        let wire = TestWire::open(usize::MAX);
        let w: Arc<dyn Wire> = wire.clone();
        let mut rx = ob.attach(w.clone(), Box::new(OneAnswer));
        ob.flush_blocked();
        assert!(wire.written.lock().is_empty(), "nothing queued, nothing written");
        // Two deliveries queued before the writer comes make one answer.
        let _ = ob.push(delivery("a", 1, "1"), false);
        let _ = ob.push(delivery("a", 2, "2"), false);
        ob.flush();
        let written = || String::from_utf8(wire.written.lock().clone()).unwrap();
        assert_eq!(written(), r#"<{"pub":{"ch":"a","off":1,"data":1}}{"pub":{"ch":"a","off":2,"data":2}}>"#);
        assert!(!ob.is_blocked(), "written whole");
        // What comes after the answer waits for the next taker; the wire gets nothing more.
        if ob.push(delivery("a", 3, "3"), false) == Pushed::Schedule {
            ob.flush();
        }
        assert!(written().ends_with("}>"));
        assert!(!ob.detach_unanswered(&w), "an answered poll is not taken back");
        assert!(ob.detach_if(&w));
        assert!(rx.try_recv().is_err(), "written whole: nothing was cut");
        assert_eq!(offs(&ob.take_messages().0), vec![("a".to_string(), 3)]);
        // Unanswered, it is detached when its time is up.
        let _rx = ob.attach(w.clone(), Box::new(OneAnswer));
        ob.flush_blocked();
        assert!(ob.detach_unanswered(&w));
        // An answer the socket took only part of is cut when detached, and its wire learns it.
        let full = TestWire::open(4);
        let f: Arc<dyn Wire> = full.clone();
        let mut rx = ob.attach(f.clone(), Box::new(OneAnswer));
        ob.flush_blocked();
        if ob.push(delivery("a", 4, "4"), false) == Pushed::Schedule {
            ob.flush();
        }
        assert!(ob.is_blocked(), "the answer is half written");
        assert!(!ob.detach_unanswered(&f), "a half-written answer is the wire's");
        assert!(ob.detach());
        assert_eq!(rx.try_recv(), Ok(()), "cut short");
    }

    #[test]
    fn pull_a_rearmed_one_answer_framer_answers_again_with_what_waited_and_what_comes() {
        use crate::outbox::tests::TestWire;
        let ob = taking(1 << 20, PullOptions::default());
        let wire = TestWire::open(usize::MAX);
        let w: Arc<dyn Wire> = wire.clone();
        let _rx = ob.attach(w.clone(), Box::new(OneAnswer));
        ob.flush_blocked();
        assert!(!ob.rearm(&w), "nothing answered yet");
        let deliver = |off| {
            if ob.push(delivery("a", off, &off.to_string()), false) == Pushed::Schedule {
                ob.flush();
            }
        };
        deliver(1);
        deliver(2);
        let written = || String::from_utf8(wire.written.lock().clone()).unwrap();
        let one = r#"<{"pub":{"ch":"a","off":1,"data":1}}>"#;
        assert_eq!(written(), one, "the second waits for the next answer");
        let other: Arc<dyn Wire> = TestWire::open(usize::MAX);
        assert!(!ob.rearm(&other), "only the attached wire's framer answers again");
        assert!(ob.rearm(&w));
        let two = r#"<{"pub":{"ch":"a","off":2,"data":2}}>"#;
        assert_eq!(written(), format!("{one}{two}"), "what waited is the next answer, at once");
        deliver(3);
        assert_eq!(written(), format!("{one}{two}"), "answered again: the next delivery waits for a rearm");
        // An answer the socket took only part of is not rearmed until it is written whole.
        let full = TestWire::open(4);
        let f: Arc<dyn Wire> = full.clone();
        let _rx = ob.attach(f.clone(), Box::new(OneAnswer));
        ob.flush_blocked();
        assert!(ob.is_blocked(), "the waiting delivery is half written");
        assert!(!ob.rearm(&f));
        *full.room.lock() = usize::MAX;
        ob.flush_blocked();
        assert!(ob.rearm(&f));
        deliver(4);
        let got = String::from_utf8(full.written.lock().clone()).unwrap();
        assert_eq!(got, r#"<{"pub":{"ch":"a","off":3,"data":3}}><{"pub":{"ch":"a","off":4,"data":4}}>"#);
    }

    #[test]
    fn pull_recorded_replies_are_copies_and_held_messages_wait_for_the_reply() {
        let ob = taking(1 << 20, PullOptions { record_replies: true, ..Default::default() });
        ob.push_message(br#"{"id":1,"ok":{}}"#);
        let _ = ob.push_frame(&Frame::message(Format::Json, br#"{"join":{"ch":"r","client":"c","user":""}}"#));
        ob.flush();
        assert_eq!(ob.take_replies(), vec![Bytes::from_static(br#"{"id":1,"ok":{}}"#)]);
        assert_eq!(ob.take_messages().0.len(), 2);
        // A subscribe in progress: its channel's publication waits, and comes after the reply.
        ob.hold();
        let _ = ob.push(delivery("a", 9, "1"), false);
        assert!(!ob.has_pending());
        assert!(ob.take_messages().0.is_empty());
        ob.release(br#"{"id":2,"ok":{}}"#, &std::collections::HashMap::new());
        let (msgs, _) = ob.take_messages();
        assert_eq!(msgs[0].kind, Kind::Reply { id: 2 });
        assert_eq!(offs(&msgs), vec![("a".to_string(), 9)]);
        assert_eq!(ob.take_replies().len(), 1);
    }
}
