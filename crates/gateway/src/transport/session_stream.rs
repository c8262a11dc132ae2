//! `GET /sse?session=<id>`: a long-poll session's messages as an event stream (the SDK's SSE
//! transport; its commands still go by `POST /poll/{session}`). Each message is a default
//! `message` event whose data is the message, exactly as a poll batch would hold it. The
//! stream ends when the session leaves this node, closes, or another poll or stream of it
//! starts. Who writes the events depends on who holds the connection:
//!
//! - A stream that is the first request of a plain connection owns the socket
//!   (`transport::http1`, [`on_socket`]). What the session holds when it starts is taken and
//!   framed the session's way (a takeover's recovered publications among it); then the
//!   session's outbox is attached to the socket (`Outbox::attach`) and the fan-out writes
//!   each delivery into it, framed by [`SessionEvents`], as it writes a WebSocket's: one
//!   write, no task wake-up. The framer notes what it wrote (`poll_streamed::Noting`:
//!   positions, replies) for the session's record. A later poll or stream detaches the
//!   socket, and the session's messages wait to be taken again.
//! - Any other (a kept-alive connection, TLS) is hyper's response body: [`SessionStream::next`]
//!   takes what the session has pending and frames it, chunk by chunk ([`attach`]).
//!
//! With a shared store, either kind writes the session's record at most once a second and
//! within a second of the last message, so a node that takes the session over continues from
//! what the stream delivered.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use switchboard_protocol::code;
use tokio::net::TcpStream;

use crate::outbox::{Framer, Message, Pushed, Wire};
use crate::transport::http::{self as transport_http, error, Peer};
use crate::transport::http1;
use crate::transport::owned::{discard_input, linger, CLOSE_GRACE};
use crate::transport::poll_session::{Busy, Found, Live, PollSession, Polls, STREAM_SAVE_EVERY};
use crate::transport::poll_streamed::Noting;
use crate::transport::sse;

/// One attached stream: which session, and where its framing stands.
pub(crate) struct SessionStream {
    polls: Arc<Polls>,
    session: Arc<PollSession>,
    /// Keeps the session from expiring while the stream is attached.
    _busy: Busy,
    /// This stream's number among the session's waiters: a later poll or stream supersedes it.
    me: u64,
    started: bool,
    saved: tokio::time::Instant,
    /// Messages were taken since the record was last written.
    unsaved: bool,
    heartbeat: Duration,
}

impl SessionStream {
    /// The next chunk of events (a `: ping` after `transports.sse_heartbeat_s` of silence);
    /// `None` once the stream is over.
    pub(crate) async fn next(mut self) -> Option<(Bytes, SessionStream)> {
        let s = self.session.clone();
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            out.extend_from_slice(sse::RETRY);
        }
        loop {
            if !s.serves(self.me) {
                if !out.is_empty() {
                    break;
                }
                return None;
            }
            let mut live = s.live.lock().await;
            let (taken, closed) = take_events(&self.polls, &s, &mut live, &mut out).await;
            if taken {
                // The record is where another node continues the session from; a store that
                // no other node reads (one node, the memory broker) needs no positions.
                self.unsaved = self.polls.store.shared();
            }
            if closed {
                break;
            }
            // At most once a second, and within a second of the last message taken.
            if self.unsaved && self.saved.elapsed() >= STREAM_SAVE_EVERY {
                self.saved = tokio::time::Instant::now();
                self.unsaved = false;
                self.polls.save(&s, &mut live).await;
            }
            drop(live);
            if !out.is_empty() {
                break;
            }
            tokio::select! {
                _ = s.outbox.notified() => {}
                _ = tokio::time::sleep_until(self.saved + STREAM_SAVE_EVERY), if self.unsaved => {}
                _ = tokio::time::sleep(self.heartbeat) => {
                    out.extend_from_slice(sse::PING);
                    break;
                }
            }
        }
        Some((Bytes::from(out), self))
    }
}

/// Takes what the session holds and appends it to `out` as events, the session's way (a
/// takeover's resubscribe replies become the recovered publications); what is taken leaves
/// `queued`. A session that closed is finished here. Whether anything was taken, and whether
/// the session closed.
async fn take_events(polls: &Polls, s: &Arc<PollSession>, live: &mut Live, out: &mut Vec<u8>) -> (bool, bool) {
    let (messages, closed) = polls.take_messages(s, live);
    for m in &messages {
        sse::write_event(out, None, None, m);
    }
    if !messages.is_empty() {
        live.queued.clear();
    }
    if let Some(code) = closed {
        polls.finish(s, live, code).await;
    }
    (!messages.is_empty(), closed.is_some())
}

/// Attaches a stream to session `id`. When the request offers its socket, the stream is left
/// in the offer for `transport::http1` to run and the answer is only the head.
pub async fn attach(polls: Arc<Polls>, req: Request, id: String) -> Response {
    let (parts, _) = req.into_parts();
    let s = match polls.find(&id, None, &parts.headers, parts.extensions.get::<Peer>(), None).await {
        Ok(Found::Session(s)) => s,
        Ok(Found::Lost(_)) => return error(code::NOT_FOUND, "unknown or expired session"),
        Err(r) => return r,
    };
    let busy = Busy::new(&s);
    let me = s.take_turn();
    let heartbeat = Duration::from_secs(polls.node.config.transports.sse_heartbeat_s);
    let node = polls.node.clone();
    let stream = SessionStream {
        polls,
        session: s,
        _busy: busy,
        me,
        started: false,
        saved: tokio::time::Instant::now(),
        unsaved: false,
        heartbeat,
    };
    let mut r = match parts.extensions.get::<http1::SocketOffer>() {
        Some(offer) => {
            // A head that could not be written leaves nothing to run: the session stays.
            let run: http1::StreamRun = Box::new(move |tcp| match tcp {
                Some(tcp) => Box::pin(on_socket(stream, tcp)),
                None => Box::pin(std::future::ready(())),
            });
            *offer.taken.lock() = Some(http1::OnSocket::Stream(run));
            sse::stream_response(Body::empty())
        }
        None => {
            let body = futures_util::stream::unfold(stream, |st| async move {
                st.next().await.map(|(b, st)| (Ok::<Bytes, std::convert::Infallible>(b), st))
            });
            sse::stream_response(Body::from_stream(body))
        }
    };
    transport_http::cors(&parts.headers, &node, &mut r);
    r
}

/// How a stream on its own socket ended.
enum End {
    /// A later poll or stream took the session, or it left this node.
    Detached,
    /// The client is gone.
    Gone,
    /// The session closed (the code its `disconnect` carried), everything written.
    Closed(u16),
}

/// Runs an attached stream on the socket it owns, its head already written. What the session
/// holds is framed the session's way once (a takeover's recovered publications among it);
/// from then on the fan-out writes each delivery into the socket as it does a WebSocket's
/// (`Outbox::attach`), and this task only waits for the socket, heartbeats and the session's
/// record, until the stream is detached, its client is gone or the session closes.
async fn on_socket(stream: SessionStream, tcp: Arc<TcpStream>) {
    let SessionStream { polls, session: s, _busy, me, heartbeat, .. } = stream;
    let mut first = sse::RETRY.to_vec();
    let closed = {
        let mut live = s.live.lock().await;
        if !s.serves(me) {
            return;
        }
        take_events(&polls, &s, &mut live, &mut first).await.1
    };
    if http1::write_all(&tcp, &first).await.is_err() {
        return;
    }
    if closed {
        return linger(&tcp, tokio::time::Instant::now() + CLOSE_GRACE).await;
    }
    let framer = SessionEvents { noting: Noting::new(s.streamed.clone()) };
    let wire: Arc<dyn Wire> = tcp.clone();
    let mut detached = s.outbox.attach(wire.clone(), Box::new(framer));
    // A poll or stream that came between the take and the attach found nothing to detach.
    if !s.serves(me) {
        s.outbox.detach_if(&wire);
    }
    s.outbox.flush_blocked();
    let end = run(&polls, &s, &tcp, &mut detached, heartbeat).await;
    s.outbox.detach_if(&wire);
    match end {
        End::Gone => {}
        End::Detached => linger(&tcp, tokio::time::Instant::now() + CLOSE_GRACE).await,
        End::Closed(code) => {
            polls.finish(&s, &mut *s.live.lock().await, code).await;
            linger(&tcp, tokio::time::Instant::now() + CLOSE_GRACE).await;
        }
    }
}

async fn run(
    polls: &Polls,
    s: &Arc<PollSession>,
    tcp: &TcpStream,
    detached: &mut tokio::sync::oneshot::Receiver<()>,
    heartbeat: Duration,
) -> End {
    let outbox = &s.outbox;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    // The record is where another node continues the session from; one node's store needs
    // no positions from a stream.
    let shared = polls.store.shared();
    let mut save = tokio::time::interval_at(tokio::time::Instant::now() + STREAM_SAVE_EVERY, STREAM_SAVE_EVERY);
    let mut closing_since: Option<tokio::time::Instant> = None;
    loop {
        if let Some(code) = outbox.closed() {
            // The `disconnect` goes out first, within the grace a closing connection gets.
            let since = *closing_since.get_or_insert_with(tokio::time::Instant::now);
            if outbox.finished() || since.elapsed() >= CLOSE_GRACE {
                return End::Closed(code);
            }
        }
        let blocked = outbox.is_blocked();
        tokio::select! {
            _ = &mut *detached => return End::Detached,
            _ = outbox.notified() => {}
            r = tcp.writable(), if blocked => match r {
                Ok(()) => outbox.flush_blocked(),
                Err(_) => return End::Gone,
            },
            r = tcp.readable() => {
                if r.is_err() || discard_input(tcp) {
                    return End::Gone;
                }
            }
            _ = tick.tick() => {
                if !outbox.wrote_since() && outbox.push_control(Bytes::from_static(sse::PING)) == Pushed::Schedule {
                    outbox.flush();
                }
            }
            _ = save.tick(), if shared => {
                outbox.settle_framer();
                let written = { let st = s.streamed.lock(); st.has_offsets() || st.replies > 0 };
                if written {
                    // A save that finds the session taken over drops this copy (and detaches).
                    polls.save(s, &mut *s.live.lock().await).await;
                }
            }
            _ = tokio::time::sleep(CLOSE_GRACE), if closing_since.is_some() => {}
        }
    }
}

/// Frames a session's messages for a stream that owns its socket — the same events
/// [`SessionStream::next`] writes — under the outbox's lock, and notes what it wrote for the
/// session's live copy ([`Noting`]).
struct SessionEvents {
    noting: Noting,
}

impl Framer for SessionEvents {
    fn frame(&mut self, out: &mut Vec<u8>, m: &Message) {
        if let Some(text) = self.noting.note(m) {
            sse::write_event(out, None, None, &text);
        }
    }

    fn settle(&mut self) {
        self.noting.settle();
    }
}
