//! `GET /sse?session=<id>`: a long-poll session's messages as an event stream (the SDK's SSE
//! transport; its commands still go by `POST /poll/{session}`). Each message is a default
//! `message` event whose data is the message, exactly as a poll batch would hold it.
//!
//! [`SessionStream::next`] takes what the session has pending and frames it; the stream ends
//! when the session leaves this node, closes, or another poll or stream attaches to it. Who
//! writes the chunks depends on who holds the connection:
//!
//! - a stream that is the first request of a plain connection owns the socket
//!   (`sse::socket`) and writes each chunk itself ([`on_socket`]), with no HTTP machinery
//!   between the session and the socket;
//! - any other (a kept-alive connection, TLS) is hyper's response body ([`attach`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use switchboard_protocol::code;
use tokio::net::TcpStream;

use crate::transport::http::{self as transport_http, error, Peer};
use crate::transport::owned::{discard_input, linger, CLOSE_GRACE};
use crate::transport::poll_session::{Busy, Found, PollSession, Polls, LIVE, STREAM_SAVE_EVERY};
use crate::transport::sse::{self, socket};

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
            if s.state.load(Relaxed) != LIVE || s.waiter.load(Relaxed) != self.me {
                if !out.is_empty() {
                    break;
                }
                return None;
            }
            let mut live = s.live.lock().await;
            let (messages, closed) = self.polls.take_messages(&s, &mut live);
            for m in &messages {
                sse::write_event(&mut out, None, None, m);
            }
            if !messages.is_empty() {
                live.queued.clear();
            }
            if let Some(code) = closed {
                self.polls.finish(&s, &mut live, code).await;
                break;
            }
            // The record is where another node continues the session from; a store that no
            // other node reads (one node, the memory broker) needs no positions from a stream.
            if !messages.is_empty() && self.polls.store.shared() && self.saved.elapsed() >= STREAM_SAVE_EVERY {
                self.saved = tokio::time::Instant::now();
                self.polls.save(&s, &mut live).await;
            }
            drop(live);
            if !out.is_empty() {
                break;
            }
            tokio::select! {
                _ = s.outbox.notified() => {}
                _ = tokio::time::sleep(self.heartbeat) => {
                    out.extend_from_slice(sse::PING);
                    break;
                }
            }
        }
        s.outbox.last_seen.store(crate::unix_s(), Relaxed);
        Some((Bytes::from(out), self))
    }
}

/// Attaches a stream to session `id`. When the request offers its socket, the stream is left
/// in the offer for `sse::socket` to run and the answer is only the head.
pub async fn attach(polls: Arc<Polls>, req: Request, id: String) -> Response {
    let (parts, _) = req.into_parts();
    let s = match polls.find(&id, None, &parts.headers, parts.extensions.get::<Peer>()).await {
        Ok(Found::Session(s)) => s,
        Ok(Found::Lost(_)) => return error(code::NOT_FOUND, "unknown or expired session"),
        Err(r) => return r,
    };
    let busy = Busy::new(&s);
    let me = s.waiter.fetch_add(1, Relaxed) + 1;
    s.outbox.wake();
    let heartbeat = Duration::from_secs(polls.node.config.transports.sse_heartbeat_s);
    let node = polls.node.clone();
    let stream = SessionStream {
        polls,
        session: s,
        _busy: busy,
        me,
        started: false,
        saved: tokio::time::Instant::now(),
        heartbeat,
    };
    let mut r = match parts.extensions.get::<socket::SocketOffer>() {
        Some(offer) => {
            *offer.taken.lock() = Some(socket::OnSocket::Own(Box::new(move |tcp| Box::pin(on_socket(stream, tcp)))));
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

/// Runs an attached stream on the socket it owns, its head already written, until the stream
/// is over or the client is gone.
async fn on_socket(stream: SessionStream, tcp: Arc<TcpStream>) {
    // One future at a time, never dropped half-way: what it took from the session is written
    // before the next is started, even when the client's bytes arrive meanwhile.
    let mut next = Box::pin(stream.next());
    loop {
        tokio::select! {
            r = &mut next => match r {
                Some((chunk, stream)) => {
                    if socket::write_all(&tcp, &chunk).await.is_err() {
                        return;
                    }
                    next.set(stream.next());
                }
                None => break,
            },
            r = tcp.readable() => {
                if r.is_err() || discard_input(&tcp) {
                    return;
                }
            }
        }
    }
    linger(&tcp, tokio::time::Instant::now() + CLOSE_GRACE).await;
}
