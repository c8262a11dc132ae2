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
//! live copy takes in before its next use. When the next request is the session's next poll,
//! acking the batch just answered, with the headers of the last (the poll a poller sends
//! again at once), the framer stays attached and answers it too ([`Outbox::rearm`]): the poll
//! goes on without the session's look-up, a new turn, the ack's check against the live copy
//! and a new attach. That request is read by [`Reader`], the socket's own waker, on the thread
//! that sees the socket ready: no task wake-up either. Anything else it reads wakes the poll's
//! task: another request ends the wait, and the task renews the session's lease if it is due
//! (`Polls::renew`; no other node reads the record; the sweep renews it too).
//!
//! A session whose record other nodes read (a shared store) is not answered this way: there
//! the record is written before a batch goes out, so that a node taking the session over
//! continues from what the client has.

use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use bytes::Bytes;
use parking_lot::Mutex;
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
pub(crate) type NextPoll = Box<dyn Fn(&[u8], u64) -> Option<(usize, Duration)> + Send + Sync>;

/// How a connection's held polls are answered: the head of each answer ([`AnswerHead`]),
/// which request continues a held poll ([`NextPoll`]), and how long an answer the client
/// does not take may wait.
pub(crate) struct Answering {
    pub(crate) head: Bytes,
    pub(crate) next_poll: NextPoll,
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
    answering: Answering,
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
    let mut next_request = false;
    let reader = Reader::new(tcp, &s.outbox, answer.clone(), next_poll, std::mem::take(pending), *deadline);
    reader.read();
    // One registration with the outbox's wake-up for the whole wait, renewed when it fires.
    let notified = s.outbox.notified();
    tokio::pin!(notified);
    let held = loop {
        let now = {
            let mut st = reader.state.lock();
            let answered = answer.answered(st.taken);
            // The client's next poll, if it continues this one, is held the same way once the
            // answer is written whole; the reader takes the polls after it.
            if answered && next_request && st.take_next(&reader, &s.outbox, &attached.wire) {
                next_request = !st.pending.is_empty();
                st.reading = !next_request;
                None
            } else {
                Some((answered, st.late))
            }
        };
        let Some((answered, late)) = now else {
            if !next_request {
                reader.read();
            }
            continue;
        };
        // Only an answer is written by the framer, so only an answer can be half written.
        let blocked = answered && s.outbox.is_blocked();
        if answered && !blocked && (late || next_request || answer.closed.load(Relaxed) != 0) {
            break Held::Answered;
        }
        tokio::select! {
            biased;
            // What the reader did not take: a request, or the end of the connection.
            handed = reader.handed(), if !next_request => match handed {
                // The client left while its poll was held: the poll ends.
                Handed::Gone => break Held::Gone,
                // The next request (or input sent before the answer, kept for it).
                Handed::Request => next_request = true,
            },
            // A later poll or stream took the session, it left this node, or the socket failed:
            // an answer written whole lets the connection go on; one cut short ends it.
            r = &mut detached => break match (r.is_ok(), answer.answered(reader.state.lock().taken)) {
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
                let mut st = reader.state.lock();
                if !st.late && timer.deadline() < st.deadline {
                    // A poll that continued this one moved the deadline on.
                    timer.as_mut().reset(st.deadline);
                } else if !answer.answered(st.taken) {
                    if s.outbox.detach_unanswered(&attached.wire) {
                        break Held::Unanswered;
                    }
                } else if st.late {
                    // An answer the client does not take.
                    break Held::Gone;
                } else {
                    st.late = true;
                    timer.as_mut().reset(st.deadline + write_timeout);
                }
            }
        }
    };
    // The connection's input and the last poll's deadline go back to the connection's task.
    {
        let mut st = reader.state.lock();
        st.reading = false;
        *pending = std::mem::take(&mut st.pending);
        *deadline = st.deadline;
    }
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

/// Reads a held poll's connection when the socket wakes it, on whichever thread runs the
/// I/O driver, so that a poller's steady rhythm — an answer, its next poll, the next answer —
/// wakes no task: the poll that continues the held one is taken there and the framer
/// rearmed, as the fan-out writes the answer. What it cannot take (another request, a poll
/// whose answer is not written whole yet, the end of the connection) it hands to the
/// poll's task, which then reads the connection until it arms the reader again.
///
/// It is the socket's waker for reading (the task does not wait on the socket meanwhile). It
/// holds the socket and the outbox weakly: the socket's registration holds the waker.
struct Reader {
    tcp: Weak<TcpStream>,
    outbox: Weak<Outbox>,
    answer: Arc<Answer>,
    next_poll: NextPoll,
    state: Mutex<Reading>,
}

/// What the reader and the poll's task share.
struct Reading {
    /// Read and not yet taken: the connection's unparsed input.
    pending: Vec<u8>,
    /// Answers written for the polls before the current one.
    taken: u64,
    /// When the current poll's time is up.
    deadline: Instant,
    /// The current answer is written, and the client did not take it in time.
    late: bool,
    /// The reader reads the socket; otherwise the task does, or the wait is over.
    reading: bool,
    /// What the reader handed to the task, and the task's waker.
    handed: Option<Handed>,
    task: Option<Waker>,
}

/// What the reader hands to the poll's task.
enum Handed {
    /// Input it did not take, in `Reading::pending`.
    Request,
    /// The client closed the connection, or it failed.
    Gone,
}

impl Reader {
    fn new(
        tcp: &Arc<TcpStream>,
        outbox: &Arc<Outbox>,
        answer: Arc<Answer>,
        next_poll: NextPoll,
        pending: Vec<u8>,
        deadline: Instant,
    ) -> Arc<Reader> {
        let state = Reading { pending, taken: 0, deadline, late: false, reading: true, handed: None, task: None };
        Arc::new(Reader {
            tcp: Arc::downgrade(tcp),
            outbox: Arc::downgrade(outbox),
            answer,
            next_poll,
            state: Mutex::new(state),
        })
    }

    /// Reads what the socket has, takes the polls that continue the held one, and waits for
    /// more; hands anything else to the task.
    fn read(self: &Arc<Self>) {
        let (Some(tcp), Some(outbox)) = (self.tcp.upgrade(), self.outbox.upgrade()) else { return };
        let wire: Arc<dyn Wire> = tcp.clone();
        let waker = Waker::from(self.clone());
        let mut st = self.state.lock();
        while st.reading {
            let handed = match http1::read_some(&tcp, &mut st.pending) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                Ok(0) | Err(_) => Some(Handed::Gone),
                Ok(_) => {
                    while !st.pending.is_empty() && st.take_next(self, &outbox, &wire) {}
                    (!st.pending.is_empty()).then_some(Handed::Request)
                }
            };
            let handed = match handed {
                Some(handed) => handed,
                // Nothing more to read: wait for the socket (or read what came meanwhile).
                None => match tcp.poll_read_ready(&mut Context::from_waker(&waker)) {
                    Poll::Pending => return,
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(_)) => Handed::Gone,
                },
            };
            st.reading = false;
            st.handed = Some(handed);
            let task = st.task.take();
            drop(st);
            if let Some(task) = task {
                task.wake();
            }
            return;
        }
    }

    /// What the reader hands over, once it does.
    async fn handed(&self) -> Handed {
        std::future::poll_fn(|cx| {
            let mut st = self.state.lock();
            if let Some(handed) = st.handed.take() {
                return Poll::Ready(handed);
            }
            if !st.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                st.task = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

impl Wake for Reader {
    fn wake(self: Arc<Self>) {
        self.read();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.read();
    }
}

impl Reading {
    /// Takes the poll at the start of the input if it continues the held one, whose answer is
    /// written whole: the framer answers it too.
    fn take_next(&mut self, r: &Reader, outbox: &Outbox, wire: &Arc<dyn Wire>) -> bool {
        if !r.answer.answered(self.taken) || self.late || r.answer.closed.load(Relaxed) != 0 {
            return false;
        }
        let Some((len, timeout)) = (r.next_poll)(&self.pending, r.answer.batch.load(Relaxed)) else { return false };
        if !outbox.rearm(wire) {
            return false;
        }
        http1::take_head(&mut self.pending, len);
        self.taken += 1;
        // The task's timer stays where it is, earlier: when it fires, it moves on to this.
        self.deadline = Instant::now() + timeout;
        true
    }
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
