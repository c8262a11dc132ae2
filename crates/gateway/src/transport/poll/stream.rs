//! `GET /sse?session=<id>`: a long-poll session's messages as an event stream (the SDK's SSE
//! transport; its commands still go by `POST /poll/{session}`). Each message is a default
//! `message` event whose data is the message, exactly as a poll batch would hold it. The
//! stream ends when the session leaves this node, closes, or another poll or stream of it
//! starts. The events are hyper's response body, driven as every event stream's
//! ([`sse::respond`]): [`SessionStream`] takes what the session has pending and frames it.
//!
//! With a shared store, the stream writes the session's record at most once a second and
//! within a second of the last message, so a node that takes the session over continues from
//! what the stream delivered.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use switchboard_protocol::code;

use crate::transport::http::{self as transport_http, error, Peer};
use crate::transport::poll::session::{Busy, Found, Live, PollSession, Polls, STREAM_SAVE_EVERY};
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
}

impl sse::Events for SessionStream {
    /// What the session has pending, as events; over once the session closed or another poll
    /// or stream of it started.
    async fn take(&mut self) -> (Bytes, bool) {
        let s = self.session.clone();
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            out.extend_from_slice(sse::RETRY);
        }
        if !s.serves(self.me) {
            return (Bytes::from(out), true);
        }
        let mut live = s.live.lock().await;
        let (taken, closed) = take_events(&self.polls, &s, &mut live, &mut out).await;
        if taken {
            // The record is where another node continues the session from; a store that no
            // other node reads (one node, the memory broker) needs no positions.
            self.unsaved = self.polls.store().shared();
        }
        // At most once a second, and within a second of the last message taken.
        if !closed && self.unsaved && self.saved.elapsed() >= STREAM_SAVE_EVERY {
            self.saved = tokio::time::Instant::now();
            self.unsaved = false;
            self.polls.save(&s, &mut live).await;
        }
        (Bytes::from(out), closed)
    }

    async fn changed(&mut self) {
        tokio::select! {
            _ = self.session.outbox.notified() => {}
            _ = tokio::time::sleep_until(self.saved + STREAM_SAVE_EVERY), if self.unsaved => {}
        }
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

/// Attaches a stream to session `id`.
pub async fn attach(polls: Arc<Polls>, req: Request, id: String) -> Response {
    let (parts, _) = req.into_parts();
    let s = match polls.find(&id, None, &parts.headers, parts.extensions.get::<Peer>()).await {
        Ok(Found::Session(s)) => s,
        Ok(Found::Lost(_)) => return error(code::NOT_FOUND, "unknown or expired session"),
        Err(r) => return r,
    };
    let busy = Busy::new(&s);
    let me = s.take_turn();
    let heartbeat = Duration::from_secs(polls.node.config.transports.sse_heartbeat_s);
    let node = polls.node.clone();
    let saved = tokio::time::Instant::now();
    let stream = SessionStream { polls, session: s, _busy: busy, me, started: false, saved, unsaved: false };
    let mut r = sse::respond(stream, heartbeat);
    transport_http::cors(&parts.headers, &node, &mut r);
    r
}
