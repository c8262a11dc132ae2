//! `GET /poll/{session}`: a held poll, and the kept-alive connection a poller sends them on.
//!
//! A poller sends one poll after the other on one connection. Through hyper, each costs its
//! connection machinery, the router and the middleware. When a poll is the first request of a
//! plain connection (`transport::http1` reads it and routes it), the route leaves the
//! connection to [`keep_alive`]: its answer is written whole and the node reads the next
//! request itself. Each further `GET /poll/{session}` gets the same refusals as any request
//! (`auth::http::refusal`: the host check; a poll needs no credentials, its session id is the
//! capability) and the same answer as through hyper; one that has to wait is held on the
//! socket and answered by the fan-out (`transport::poll_held`). At the first request that is
//! not a poll the connection goes to hyper, with what was read of it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::Router;
use switchboard_protocol::code;
use tokio::net::TcpStream;

use crate::transport::http::{self as transport_http, error, query_param, Peer};
use crate::transport::http1::{self, Ending, Next};
use crate::transport::poll_held::{self, AnswerHead, Conn, Held};
use crate::transport::poll_session::{json_response, Found, PollSession, Polls};

/// Answers `GET /poll/{id}` (`query`: the request's query).
pub(crate) async fn answer(
    polls: &Arc<Polls>,
    id: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    peer: Option<&Peer>,
) -> Response {
    let mut r = match session_of(polls, id, query, headers, peer).await {
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
#[allow(clippy::result_large_err)]
async fn session_of(
    polls: &Arc<Polls>,
    id: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    peer: Option<&Peer>,
) -> Result<(Arc<PollSession>, Option<u64>, Duration), Response> {
    let max = Duration::from_secs(polls.node.config.transports.poll_timeout_s);
    let (ack, timeout) = ack_and_timeout(query, max)?;
    match polls.find(id, ack, headers, peer).await? {
        Found::Lost(body) => Err(json_response(StatusCode::OK, body)),
        Found::Session(s) => Ok((s, ack, timeout)),
    }
}

// A refusal is the response itself, returned on the cold path of a request that answers with
// it anyway; boxing it would buy nothing.
#[allow(clippy::result_large_err)]
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

/// Serves the polls that follow on a kept-alive connection, its first answer written; hands
/// the connection to hyper at the first other request.
pub(crate) async fn keep_alive(polls: Arc<Polls>, tcp: Arc<TcpStream>, app: Router, peer: SocketAddr) {
    let node = polls.node.clone();
    let head_timeout = Duration::from_secs(node.config.limits.handshake_timeout_s);
    // A poller polls again at once; a connection quiet for a session's lifetime serves none.
    let idle = Duration::from_secs(node.config.transports.poll_session_ttl_s.max(1));
    let mut pending = Vec::new();
    let mut head = AnswerHead::default();
    let from = Peer(peer);
    loop {
        let (parts, id) = match http1::next_request(&tcp, &mut pending, idle, head_timeout, poll_of).await {
            Next::Request(parts, id) => (parts, id),
            Next::Other => break,
            Next::Gone => return,
        };
        let conn = Conn { tcp: &tcp, pending: &mut pending };
        let r = match serve_one(&polls, &id, &parts, &from, conn, &mut head, head_timeout).await {
            Served::Response(r) => r,
            Served::Answered => continue,
            Served::Gone => return,
        };
        let Some(bytes) = http1::response_bytes(r, Ending::KeepAlive).await else { return };
        match tokio::time::timeout(head_timeout, http1::write_all(&tcp, &bytes)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
    }
    // Another kind of request: hyper serves the rest of the connection.
    let Ok(tcp) = Arc::try_unwrap(tcp) else { return };
    http1::serve_http(http1::Rewind::new(pending, tcp), app, peer, head_timeout).await;
}

/// What became of one poll on a kept-alive connection.
enum Served {
    /// The answer to write.
    Response(Response),
    /// The fan-out wrote the answer (`transport::poll_held`).
    Answered,
    /// The connection ends.
    Gone,
}

async fn serve_one(
    polls: &Arc<Polls>,
    id: &str,
    parts: &Parts,
    peer: &Peer,
    conn: Conn<'_>,
    head: &mut AnswerHead,
    write_timeout: Duration,
) -> Served {
    let headers = &parts.headers;
    if let Some(refused) = crate::auth::http::refusal(&polls.node, &parts.method, parts.uri.path(), headers) {
        return Served::Response(refused);
    }
    let cors = |mut r: Response| {
        transport_http::cors(headers, &polls.node, &mut r);
        Served::Response(r)
    };
    let (s, ack, timeout) = match session_of(polls, id, parts.uri.query(), headers, Some(peer)).await {
        Err(r) => return cors(r),
        Ok(found) => found,
    };
    let poll = match polls.start_poll(&s, ack).await {
        Err(r) => return cors(r),
        Ok(started) => started,
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let head = head.of(headers, &polls.node);
    let tcp = conn.tcp;
    match poll_held::wait(polls, &s, &poll, deadline, conn, head, write_timeout).await {
        Held::Answered => Served::Answered,
        Held::Gone => Served::Gone,
        Held::Unanswered => tokio::select! {
            r = polls.wait_and_answer(&s, poll.me, deadline) => cors(r),
            // A client that leaves while its poll is held ends the poll.
            () = http1::client_gone(tcp) => Served::Gone,
        },
    }
}

/// The session of a plain `GET /poll/{session}` that this module serves: no body, no
/// upgrade, no `Connection: close`, an id that needs no decoding.
fn poll_of(parts: &Parts) -> Option<String> {
    let id = parts.uri.path().strip_prefix("/poll/")?;
    if id.is_empty() || id.contains(['/', '%']) {
        return None;
    }
    let h = &parts.headers;
    let has_body = h.get(header::CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0")
        || h.contains_key(header::TRANSFER_ENCODING);
    let closing = h.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close") || t.trim().eq_ignore_ascii_case("upgrade"))
        })
    });
    (!has_body && !closing && !h.contains_key(header::UPGRADE) && !h.contains_key(header::EXPECT))
        .then(|| id.to_string())
}
