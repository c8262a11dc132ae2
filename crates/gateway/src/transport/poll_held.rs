//! A held poll on a connection the node keeps alive itself (`transport::poll_socket`),
//! answered by the fan-out.
//!
//! A poll that finds nothing to take waits. Through hyper, the delivery that ends the wait
//! wakes the poll's task, which takes the batch, writes the session's record and answers. On
//! a connection the node reads itself, [`wait`] attaches the session's outbox to the socket
//! with [`PollBatch`], a framer that writes one answer: whoever delivers the next messages
//! frames them as the poll's batch, HTTP head and all, and writes it with one `try_write` —
//! no task wake-up, as for a WebSocket delivery. The framer notes what it wrote
//! (`poll_streamed::Noting`: positions, replies, the batch kept to send again), which the
//! live copy takes in before its next use. The poll's task wakes when the next request comes.
//! When that request is the session's next poll, acking the batch just answered, with the
//! headers of the last (the poll a poller sends again at once), the framer stays attached and
//! answers it too ([`Outbox::rearm`]): the poll goes on without the session's look-up, a new
//! turn, the ack's check against the live copy and a new attach. Any other request ends the
//! wait, and the poll's task renews the session's lease if it is due (`Polls::renew`; no other
//! node reads the record; the sweep renews it too).
//!
//! A session whose record other nodes read (a shared store) is not answered this way: there
//! the record is written before a batch goes out, so that a node taking the session over
//! continues from what the client has.

use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::node::Node;
use crate::outbox::{Framer, Kind, Message, Outbox, Wire};
use crate::transport::http as transport_http;
use crate::transport::http1::{self, Ending};
use crate::transport::poll_session::{json_response, PollSession, Polls, Started};
use crate::transport::poll_streamed::Noting;
use crate::transport::poll_wire::{joined_batch_len, write_batch_start, BATCH_END};

/// How a held poll ended.
pub(crate) enum Held {
    /// The fan-out answered it, whole (noted in `PollSession::streamed` for the live copy),
    /// and the session's lease is renewed when due.
    Answered,
    /// Not answered here: the poll goes on the usual way (its time is up, a later poll or
    /// stream took the session, the session left this node).
    Unanswered,
    /// The connection cannot go on: the client is gone, or its answer was cut short.
    Gone,
}

/// The head of a connection's poll answers up to their `date`: the same for each poll that
/// sends the same `Origin` and `Host` (CORS), so it is made once.
#[derive(Default)]
pub(crate) struct AnswerHead {
    key: Option<(Option<HeaderValue>, Option<HeaderValue>)>,
    head: Bytes,
}

impl AnswerHead {
    pub(crate) fn of(&mut self, headers: &HeaderMap, node: &Node) -> Bytes {
        let (origin, host) = (headers.get(header::ORIGIN), headers.get(header::HOST));
        if !self.key.as_ref().is_some_and(|(o, h)| o.as_ref() == origin && h.as_ref() == host) {
            let mut r = json_response(StatusCode::OK, Body::empty());
            transport_http::cors(headers, node, &mut r);
            self.head = Bytes::from(http1::head_lines(&r.into_parts().0));
            self.key = Some((origin.cloned(), host.cloned()));
        }
        self.head.clone()
    }
}

/// What the framer tells the poll's task: how many answers it wrote, the session's batch
/// number after the last (the one a poll that continues it acks, and the framer answers
/// from), and the close code when an answer carried the session's `disconnect`.
struct Answer {
    answers: AtomicU64,
    batch: AtomicU64,
    closed: AtomicU16,
}

impl Answer {
    /// Whether the framer wrote more than `taken` answers: the current poll's is written.
    fn answered(&self, taken: u64) -> bool {
        self.answers.load(Acquire) > taken
    }
}

/// Keeps the socket attached while the poll waits; detaches it however the wait ends.
struct Attached<'a> {
    outbox: &'a Outbox,
    wire: Arc<dyn Wire>,
}

impl Drop for Attached<'_> {
    fn drop(&mut self) {
        self.outbox.detach_if(&self.wire);
    }
}

/// A held poll's connection: its socket, what was read of it and not yet parsed, and its
/// timer. One timer serves every poll of the connection: moved on to a later deadline, it
/// stays in the runtime's timer wheel, where a timer made for each poll would be put in and
/// taken out again.
pub(crate) struct Conn<'a> {
    pub(crate) tcp: &'a Arc<TcpStream>,
    pub(crate) pending: &'a mut Vec<u8>,
    pub(crate) timer: Pin<&'a mut Sleep>,
}

/// Whether the request at the start of a connection's unparsed input is the session's next
/// poll acking batch `seq`, its header lines those of the last poll: its length and how long
/// it may wait (`poll_socket`, which reads polls, decides).
pub(crate) type NextPoll<'a> = &'a (dyn Fn(&[u8], u64) -> Option<(usize, Duration)> + Sync);

/// How a connection's held polls are answered: the head of each answer ([`AnswerHead`]),
/// which request continues a held poll ([`NextPoll`]), and how long an answer the client
/// does not take may wait.
pub(crate) struct Answering<'a> {
    pub(crate) head: Bytes,
    pub(crate) next_poll: NextPoll<'a>,
    pub(crate) write_timeout: Duration,
}

/// Holds `poll` of `s` until `deadline`, to be answered by the fan-out. The polls that
/// continue it are held the same way, and `deadline` is then the last one's.
pub(crate) async fn wait(
    polls: &Polls,
    s: &Arc<PollSession>,
    poll: &Started,
    deadline: &mut Instant,
    conn: Conn<'_>,
    answering: Answering<'_>,
) -> Held {
    let Conn { tcp, pending, mut timer } = conn;
    let Answering { head, next_poll, write_timeout } = answering;
    let me = poll.me;
    if polls.store.shared() || !s.serves(me) || s.outbox.has_pending() || s.outbox.closed().is_some() {
        return Held::Unanswered;
    }
    let answer =
        Arc::new(Answer { answers: AtomicU64::new(0), batch: AtomicU64::new(poll.seq), closed: AtomicU16::new(0) });
    let framer =
        PollBatch { head, joined: Vec::new(), noting: Noting::new(s.streamed.clone()), answer: answer.clone() };
    let attached = Attached { outbox: &s.outbox, wire: tcp.clone() };
    let mut detached = s.outbox.attach(attached.wire.clone(), Box::new(framer));
    // A poll or stream that came between the check and the attach found nothing to detach.
    if !s.serves(me) {
        return Held::Unanswered;
    }
    // Whatever came since the check is the answer, at once.
    s.outbox.flush_blocked();
    // One timer for the whole wait, moved on when the answer is late.
    timer.as_mut().reset(*deadline);
    let mut late = false;
    let mut next_request = false;
    // Answers written for the polls before the current one.
    let mut taken = 0;
    // One registration with the outbox's wake-up for the whole wait, renewed when it fires.
    let notified = s.outbox.notified();
    tokio::pin!(notified);
    let held = loop {
        let answered = answer.answered(taken);
        if answered && next_request && !late && answer.closed.load(Relaxed) == 0 {
            // The client's next poll, if it continues this one, is held the same way once the
            // answer is written whole.
            if let Some((len, timeout)) = next_poll(pending, answer.batch.load(Relaxed)) {
                if s.outbox.rearm(&attached.wire) {
                    http1::take_head(pending, len);
                    taken += 1;
                    // The timer stays where it is, earlier: when it fires, it moves on to this.
                    *deadline = Instant::now() + timeout;
                    next_request = !pending.is_empty();
                    continue;
                }
            }
        }
        // Only an answer is written by the framer, so only an answer can be half written.
        let blocked = answered && s.outbox.is_blocked();
        if answered && !blocked && (late || next_request || answer.closed.load(Relaxed) != 0) {
            break Held::Answered;
        }
        // In this order: a request, the one wake-up each poll brings, is taken without
        // looking at the rest (the loop looks again).
        tokio::select! {
            biased;
            // Read into the connection's buffer, where the next request is parsed from. The
            // socket's own reader slot holds the wake-up (this task is its only reader), which
            // costs no entry in its list of waiters each time round.
            r = std::future::poll_fn(|cx| tcp.poll_read_ready(cx)), if !next_request => match r.and_then(|()| http1::read_some(tcp, pending)) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // The client left while its poll was held: the poll ends.
                Ok(0) | Err(_) => break Held::Gone,
                // The next request (or input sent before the answer, kept for it).
                Ok(_) => next_request = true,
            },
            // A later poll or stream took the session, it left this node, or the socket failed:
            // an answer written whole lets the connection go on; one cut short ends it.
            r = &mut detached => break match (r.is_ok(), answer.answered(taken)) {
                (true, _) => Held::Gone,
                (false, true) => Held::Answered,
                (false, false) => Held::Unanswered,
            },
            () = &mut notified => notified.set(s.outbox.notified()),
            r = tcp.writable(), if blocked => match r {
                Ok(()) => s.outbox.flush_blocked(),
                Err(_) => break Held::Gone,
            },
            () = &mut timer => {
                if !late && timer.deadline() < *deadline {
                    // A poll that continued this one moved the deadline on.
                    timer.as_mut().reset(*deadline);
                } else if !answer.answered(taken) {
                    if s.outbox.detach_unanswered(&attached.wire) {
                        break Held::Unanswered;
                    }
                } else if late {
                    // An answer the client does not take.
                    break Held::Gone;
                } else {
                    late = true;
                    timer.as_mut().reset(*deadline + write_timeout);
                }
            }
        }
    };
    // The receiver goes first: detaching drops the sender, which would otherwise wake this
    // task (the receiver's last poll registered it) and have it polled once more for nothing.
    drop(detached);
    drop(attached);
    if matches!(held, Held::Answered) {
        match answer.closed.load(Relaxed) {
            // No other node reads the store: the record needs no positions, only its lease.
            // The live copy takes in what was written at its next use.
            0 => polls.renew(s, crate::unix_s()).await,
            code => polls.finish(s, &mut *s.live.lock().await, code).await,
        }
    }
    held
}

/// Frames a held poll's answer — its HTTP head and the batch `poll_wire::batch_body`
/// makes — under the outbox's lock, and notes what it wrote for the session's live copy. The
/// messages are joined as they come, copied (a publication's count, which every subscriber
/// shares, is not touched); [`Framer::seal`] puts the head and the batch around them once
/// their length is known.
struct PollBatch {
    head: Bytes,
    /// The messages, joined by commas.
    joined: Vec<u8>,
    noting: Noting,
    answer: Arc<Answer>,
}

impl Framer for PollBatch {
    fn frame(&mut self, _: &mut Vec<u8>, m: &Message) {
        if let Kind::Disconnect { code } = m.kind {
            self.answer.closed.store(code, Relaxed);
        }
        if let Some(text) = self.noting.note(m) {
            if !self.joined.is_empty() {
                self.joined.push(b',');
            }
            self.joined.extend_from_slice(&text);
        }
    }

    fn settle(&mut self) {
        self.noting.settle();
    }

    fn once(&self) -> bool {
        true
    }

    fn seal(&mut self, _: Vec<u8>) -> Bytes {
        let joined = std::mem::take(&mut self.joined);
        let answered = !joined.is_empty();
        let base = self.answer.batch.load(Relaxed);
        let seq = if answered { base + 1 } else { base };
        let len = joined_batch_len(seq, joined.len());
        let mut out = Vec::with_capacity(self.head.len() + 96 + len);
        out.extend_from_slice(&self.head);
        http1::end_head(&mut out, Ending::KeepAlive, Some(len));
        let start = out.len();
        write_batch_start(&mut out, seq);
        out.extend_from_slice(&joined);
        out.extend_from_slice(BATCH_END);
        let out = Bytes::from(out);
        // The batch kept to send again: its own bytes, without its head.
        if answered {
            self.noting.keep_batch(seq, out.slice(start..));
        }
        // A poll that continues this one acks `seq` and is answered from it.
        self.answer.batch.store(seq, Relaxed);
        self.answer.answers.fetch_add(1, Release);
        out
    }
}
