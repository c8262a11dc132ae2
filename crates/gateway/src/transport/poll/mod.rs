//! Long-polling (SPEC §3, docs/protocol.md): sessions that live between HTTP requests.
//!
//! - `POST /poll` opens a session and answers `{"session", "node", "poll_timeout_s",
//!   "session_ttl_s"}`; a body, if any, holds the first commands.
//! - `GET /poll/{session}?ack=<seq>` is held until messages are pending (or
//!   `transports.poll_timeout_s`, or `timeout=<s>` if shorter) and answers everything pending in
//!   one batch: `{"seq": n, "messages": [...]}`, each message exactly as on the WebSocket.
//!   `ack` is the `seq` of the last batch the client received: a batch that got lost on the
//!   way is sent again (`ack` one behind), a client further behind is told to recover (4008).
//! - `POST /poll/{session}` carries commands (the WebSocket command bodies, one or several
//!   JSON objects); their replies arrive in the polls, in order with the publications, as on
//!   a WebSocket. The POST answers 202 once the commands ran or were handed to the node that
//!   holds the session.
//! - `DELETE /poll/{session}` ends the session. Sessions also expire after
//!   `transports.poll_session_ttl_s` seconds without a request.
//! - `GET /sse?session=<id>` streams the session's messages as SSE events instead (the SDK's
//!   SSE transport: commands still go by `POST /poll/{session}`; `transport::poll::stream`).
//!
//! A session is a [`Session`](crate::session::Session) with an outbox like any connection,
//! one its polls take from (`outbox::pull`): the same commands, limits, permissions, conflation (a slow poller gets the latest value per
//! point channel) and 4008 bound apply. The session id (128 random bits) is the capability:
//! whoever holds it may poll and send commands.
//!
//! **Moving between nodes.** The node that serves a session keeps a live copy and writes its
//! [`Record`](record::Record) to the broker's session store
//! ([`SessionStore`](switchboard_broker::SessionStore); Redis with the Redis brokers) after every
//! batch and every command: subscriptions with positions, replies not yet sent, the batch number. A
//! poll arriving at another node takes the session over: under the session's lock it claims the
//! record (compare-and-set), tells the old node to drop its copy, queues the stored replies,
//! resubscribes every channel with `recover` from its stored position and runs commands that were
//! queued for it. Nothing is lost: what the old node had not delivered is recovered from history (a
//! point channel whose history does not reach back gets its latest value; any other such channel
//! gets 4008 so the client recovers itself). Commands posted to a node that does not hold the
//! session are queued in the store and the holder is told to run them, so replies still travel in
//! order with the publications. No sticky sessions are needed; a load balancer that hashes on the
//! session id merely saves the moves.
//!
//! **Layout.** This file is the HTTP side: routes, requests (each parsed by hyper, answered
//! whole through its body), and the tasks that expire sessions and act on what other nodes say.
//! `session`: the live sessions and everything that changes them; `takeover`: continuing a
//! session from its record; `record`: what the store keeps of a session; `wire`: what requests
//! and answers carry (batches, command bodies); `stream`: a session's messages as an SSE
//! stream.

// Refusals are the response itself (status, body, headers), returned on the cold path of a
// request that answers with it anyway; boxing them would buy nothing.
#![allow(clippy::result_large_err)]

pub mod record;
pub mod session;
pub mod stream;
pub mod takeover;
pub mod wire;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use switchboard_broker::SessionNotice;
use switchboard_protocol::code::{self, close};

use crate::node::Node;
use crate::transport::http::Peer;
use crate::transport::http::{self as transport_http, error, query_param};
use crate::transport::sse;
use record::random_id;
use session::*;

/// The routes of the HTTP transports: `/sse`, `/poll`, `/poll/{session}`.
pub fn router<S: Clone + Send + Sync + 'static>(node: Arc<Node>) -> Router<S> {
    let polls = Polls::new(node);
    // The receiver outlives a restart of its task: notices keep arriving in the same queue.
    let notices = Arc::new(tokio::sync::Mutex::new(polls.store().listen(&polls.node.id)));
    let weak = Arc::downgrade(&polls);
    switchboard_supervisor::spawn("poll-notices", move |_| {
        let (polls, notices) = (weak.clone(), notices.clone());
        async move { notice_task(polls, &mut *notices.lock().await).await }
    });
    let weak = Arc::downgrade(&polls);
    switchboard_supervisor::spawn("poll-sweeper", move |_| sweep_task(weak.clone()));
    Router::new()
        .route("/sse", get(sse_route).options(preflight))
        .route("/poll", post(open).options(preflight))
        .route("/poll/{session}", get(poll).post(command).delete(end).options(preflight))
        .with_state(polls)
}

async fn sse_route(State(polls): State<Arc<Polls>>, req: Request) -> Response {
    let query = req.uri().query().map(str::to_string);
    if let Some(id) = query_param(query.as_deref(), "session") {
        return stream::attach(polls, req, id).await;
    }
    sse::handle(State(polls.node.clone()), req).await
}

async fn preflight(State(polls): State<Arc<Polls>>, headers: HeaderMap) -> Response {
    transport_http::preflight(State(polls.node.clone()), headers).await
}

/// `POST /poll`: opens a session.
async fn open(State(polls): State<Arc<Polls>>, req: Request) -> Response {
    let headers = req.headers().clone();
    let mut r = open_inner(&polls, req).await;
    transport_http::cors(&headers, &polls.node, &mut r);
    r
}

async fn read_body(node: &Node, req: Request) -> Result<Bytes, Response> {
    let max = node.config.limits.max_frame_bytes;
    match axum::body::to_bytes(req.into_body(), max).await {
        Ok(b) => Ok(b),
        Err(_) => Err(error(code::TOO_LARGE, format!("commands larger than {max} bytes"))),
    }
}

async fn open_inner(polls: &Arc<Polls>, req: Request) -> Response {
    let node = &polls.node;
    let q = req.uri().query().map(str::to_string);
    let admitted =
        match transport_http::admit(node, req.headers(), req.extensions().get::<Peer>(), q.as_deref(), true).await {
            Ok(a) => a,
            Err(r) => return r,
        };
    let slot = match transport_http::acquire_slot(node, &admitted) {
        Ok(s) => s,
        Err(r) => return r,
    };
    // No credentials and a connect hook: the hook decides on the session's first commands.
    let hook = (admitted.identity.is_none() && node.config.security.auth.has_connect_hook())
        .then(|| node.config.hooks.pick_headers(req.headers().iter().map(|(n, v)| (n.as_str(), v.as_bytes()))));
    let body = match read_body(node, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let id = random_id();
    let s = match polls.create(&id, admitted.identity.clone(), admitted.exempt(), slot) {
        Ok(s) => s,
        Err(r) => return r,
    };
    {
        let mut live = s.live.lock().await;
        if let Some(headers) = hook {
            live.session.await_connect_hook(crate::session::ConnectContext { transport: "poll", headers });
        }
        let rec = polls.record_of(&live);
        match polls.save_record(&id, 0, &rec).await {
            Ok(true) => live.version = rec.version,
            Ok(false) => {
                polls.release(&s, &mut live).await;
                return error(code::INTERNAL, "session id collision");
            }
            Err(e) => {
                polls.release(&s, &mut live).await;
                return store_error(e);
            }
        }
    }
    polls.sessions.lock().insert(id.clone(), s.clone());
    if !no_commands(&body) {
        if let Err(r) = polls.run_as_owner(&s, &body).await {
            return r;
        }
    }
    let t = &node.config.transports;
    let reply = serde_json::json!({
        "session": id,
        "node": node.id,
        "poll_timeout_s": t.poll_timeout_s,
        "session_ttl_s": t.poll_session_ttl_s,
    });
    json_response(StatusCode::OK, reply.to_string())
}

/// An opening body that carries no commands: empty, blank, or `{}` (what many HTTP clients
/// send by default for a JSON POST).
fn no_commands(body: &[u8]) -> bool {
    body.iter().all(u8::is_ascii_whitespace)
        || matches!(serde_json::from_slice::<serde_json::Value>(body), Ok(serde_json::Value::Object(m)) if m.is_empty())
}

/// `GET /poll/{session}?ack=&timeout=`: held until the session has messages, the poll's time
/// is up, or a later poll or stream of the session takes its turn.
async fn poll(State(polls): State<Arc<Polls>>, Path(id): Path<String>, req: Request) -> Response {
    let (query, headers) = (req.uri().query(), req.headers());
    let mut r = match session_of(&polls, &id, query, headers, req.extensions().get::<Peer>()).await {
        Err(r) => r,
        Ok((s, ack, timeout)) => match polls.start_poll(&s, ack).await {
            Err(r) => r,
            Ok(poll) => polls.wait_and_answer(&s, poll.me, tokio::time::Instant::now() + timeout).await,
        },
    };
    transport_http::cors(headers, &polls.node, &mut r);
    r
}

/// The session a poll is for, with its `ack` and how long it may wait; `Err`: the answer,
/// given at once (a refusal, or the final batch of a client behind what the store keeps).
async fn session_of(
    polls: &Arc<Polls>,
    id: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    peer: Option<&Peer>,
) -> Result<(Arc<PollSession>, Option<u64>, Duration), Response> {
    let longest = Duration::from_secs(polls.node.config.transports.poll_timeout_s);
    let (ack, timeout) = ack_and_timeout(query, longest)?;
    match polls.find(id, ack, headers, peer).await? {
        Found::Lost(body) => Err(json_response(StatusCode::OK, body)),
        Found::Session(s) => Ok((s, ack, timeout)),
    }
}

/// A poll's `ack` (the batch it received last) and how long it may be held: `timeout`
/// seconds, at most `max` (`transports.poll_timeout_s`).
fn ack_and_timeout(q: Option<&str>, max: Duration) -> Result<(Option<u64>, Duration), Response> {
    let ack = match query_param(q, "ack") {
        None => None,
        Some(a) => Some(a.parse::<u64>().map_err(|_| error(code::BAD_REQUEST, "ack: expected a batch number"))?),
    };
    let timeout = match query_param(q, "timeout") {
        None => max,
        Some(t) => {
            let s: f64 = t.parse().map_err(|_| error(code::BAD_REQUEST, "timeout: expected seconds"))?;
            if s.is_nan() || s < 0.0 {
                return Err(error(code::BAD_REQUEST, "timeout: expected seconds"));
            }
            // Any number of seconds, however large (`inf`, `1e20`), is at most the maximum.
            Duration::try_from_secs_f64(s).map_or(max, |d| d.min(max))
        }
    };
    Ok((ack, timeout))
}

/// `POST /poll/{session}`: commands.
async fn command(State(polls): State<Arc<Polls>>, Path(id): Path<String>, req: Request) -> Response {
    let headers = req.headers().clone();
    let peer = req.extensions().get::<Peer>().copied();
    let mut r = command_inner(&polls, &id, &headers, peer, req).await;
    transport_http::cors(&headers, &polls.node, &mut r);
    r
}

async fn command_inner(
    polls: &Arc<Polls>,
    id: &str,
    headers: &HeaderMap,
    peer: Option<Peer>,
    req: Request,
) -> Response {
    let node = &polls.node;
    let body = match read_body(node, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return error(code::BAD_REQUEST, "no command in the body");
    }
    for _ in 0..3 {
        if let Some(s) = polls.local(id) {
            let _busy = Busy::new(&s);
            match polls.run_as_owner(&s, &body).await {
                Ok(true) => return accepted(),
                Ok(false) => continue,
                Err(r) => return r,
            }
        }
        let rec = match polls.load_record(id).await {
            Ok(Some(r)) => r,
            Ok(None) => return error(code::NOT_FOUND, "unknown or expired session"),
            Err(e) => return store_error(e),
        };
        if rec.owner.is_empty() || rec.owner == node.id {
            // Nobody holds it (or this node lost its copy): take it over and run here.
            if let Err(r) = polls.find(id, None, headers, peer.as_ref()).await {
                return r;
            }
            continue;
        }
        // Another node holds the session: queue the commands there, in order.
        if let Err(r) = transport_http::admit(node, headers, peer.as_ref(), None, false).await {
            return r;
        }
        if let Err(e) = polls.store().push_commands(id, &body, polls.ttl).await {
            return store_error(e);
        }
        let _ = polls.store().notify(&rec.owner, &SessionNotice::Commands(id.to_string())).await;
        return accepted();
    }
    error(503, "session busy; retry")
}

fn accepted() -> Response {
    json_response(StatusCode::ACCEPTED, "{}")
}

/// `DELETE /poll/{session}`: the client leaves.
async fn end(State(polls): State<Arc<Polls>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    if let Some(s) = polls.local(&id) {
        let mut live = s.live.lock().await;
        polls.finish(&s, &mut live, close::NORMAL).await;
    } else {
        match polls.load_record(&id).await {
            Ok(Some(rec)) => {
                let _ = polls.store().remove(&id).await;
                if !rec.owner.is_empty() && rec.owner != polls.node.id {
                    let _ = polls.store().notify(&rec.owner, &SessionNotice::Moved(id.clone())).await;
                }
            }
            Ok(None) => return error(code::NOT_FOUND, "unknown or expired session"),
            Err(e) => return store_error(e),
        }
    }
    let mut r = StatusCode::NO_CONTENT.into_response();
    transport_http::cors(&headers, &polls.node, &mut r);
    r
}

/// Acts on what other nodes say: drop moved sessions, run commands queued for ours.
async fn notice_task(polls: std::sync::Weak<Polls>, rx: &mut tokio::sync::mpsc::UnboundedReceiver<SessionNotice>) {
    while let Some(n) = rx.recv().await {
        let Some(polls) = polls.upgrade() else { return };
        match n {
            SessionNotice::Moved(id) => {
                if let Some(s) = polls.local(&id) {
                    tokio::spawn(async move {
                        let mut live = s.live.lock().await;
                        polls.drop_local(&s, MOVED, &mut live).await;
                    });
                }
            }
            SessionNotice::Commands(id) => {
                if let Some(s) = polls.local(&id) {
                    tokio::spawn(async move {
                        let _ = polls.run_as_owner(&s, &[]).await;
                    });
                }
            }
        }
    }
}

/// Every second (and often while the node stops): expires idle sessions, closes those whose
/// token expired, releases closed ones and renews the leases that are due.
async fn sweep_task(polls: std::sync::Weak<Polls>) {
    let mut stop = match polls.upgrade() {
        Some(p) => p.node.stopping(),
        None => return,
    };
    let mut stopping = false;
    loop {
        let pause = if stopping { Duration::from_millis(50) } else { SWEEP_EVERY };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            r = stop.changed(), if !stopping => {
                if r.is_err() {
                    return;
                }
                stopping = true;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let Some(polls) = polls.upgrade() else { return };
        // One reading of the clock serves the whole sweep. It looks at every session once a
        // second, so that look is a few counters read under the map's lock, nothing written:
        // only a session with something due is taken out (a lease a quarter spent, a deadline
        // that may have passed, nobody polling) and dealt with after the lock is released.
        let now = crate::unix_s();
        let shared = polls.store().shared();
        let due: Vec<Arc<PollSession>> = polls
            .sessions
            .lock()
            .values()
            .filter(|s| {
                s.busy.load(Relaxed) == 0
                    || s.outbox.deadline_s.load(Relaxed) <= now
                    || (!shared && polls.lease_spent(s, now))
            })
            .cloned()
            .collect();
        for s in due {
            if !shared && polls.lease_spent(&s, now) && s.state.load(Relaxed) == LIVE && s.outbox.closed().is_none() {
                polls.lease(&s).await;
            }
            if s.outbox.deadline_s.load(Relaxed) <= now {
                // Its lock taken only now that the deadline it shows may have passed.
                if let Ok(mut live) = s.live.try_lock() {
                    if let Some(reason) = live.session.check_deadline() {
                        s.outbox.close(reason.code, &reason.reason, true);
                    }
                }
            }
            if s.busy.load(Relaxed) > 0 {
                continue;
            }
            let idle = now.saturating_sub(s.active.load(Relaxed));
            if let Some(code) = s.outbox.closed() {
                // Nobody is polling: release what the session holds now; the disconnect waits
                // for the client's next poll (a shutdown's record stays for another node).
                if code == close::SHUTDOWN && polls.store().shared() {
                    if let Ok(mut live) = s.live.try_lock() {
                        polls.finish(&s, &mut live, code).await;
                    }
                } else if let Ok(mut live) = s.live.try_lock() {
                    if !s.cleaned.load(Relaxed) {
                        // Released for good: no node may take the record over (and subscribe
                        // again); the live copy stays only to hand the disconnect to a poll.
                        let _ = polls.store().remove(&s.id).await;
                    }
                    polls.release(&s, &mut live).await;
                    if idle >= polls.ttl.as_secs() {
                        polls.finish(&s, &mut live, code).await;
                    }
                }
                continue;
            }
            if idle >= polls.ttl.as_secs() {
                if let Ok(mut live) = s.live.try_lock() {
                    tracing::debug!(session = %s.id, idle, "poll session expired");
                    polls.finish(&s, &mut live, close::NORMAL).await;
                }
            }
        }
    }
}
