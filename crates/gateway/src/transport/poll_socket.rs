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
//!
//! A poller sends the same headers poll after poll: a head that repeats the last poll's header
//! lines byte for byte is read by its request line alone (`http1::next_request`) and answered
//! by what those headers gave the last time ([`Known`]: not refused, its answer's head), and
//! the session the connection polled last is found without a look-up (`Polls::find`). Such a
//! head that continues a held poll answered by the fan-out is held at once on the same
//! attachment (`poll_held::wait`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::Router;
use bytes::Bytes;
use switchboard_protocol::code;
use tokio::net::TcpStream;

use crate::transport::http::{self as transport_http, error, query_param, Peer};
use crate::transport::http1::{self, Ending, Next, Seen};
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
    let mut r = match session_of(polls, id, query, headers, peer, None).await {
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
/// `known`: the session the connection served last (`Polls::find`).
#[allow(clippy::result_large_err)]
async fn session_of(
    polls: &Arc<Polls>,
    id: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    peer: Option<&Peer>,
    known: Option<&Arc<PollSession>>,
) -> Result<(Arc<PollSession>, Option<u64>, Duration), Response> {
    let (ack, timeout) = ack_and_timeout(query, longest_wait(polls))?;
    match polls.find(id, ack, headers, peer, known).await? {
        Found::Lost(body) => Err(json_response(StatusCode::OK, body)),
        Found::Session(s) => Ok((s, ack, timeout)),
    }
}

/// How long a poll may be held at most (`transports.poll_timeout_s`).
fn longest_wait(polls: &Polls) -> Duration {
    Duration::from_secs(polls.node.config.transports.poll_timeout_s)
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
    let mut answer_head = AnswerHead::default();
    let mut known: Option<Known> = None;
    let mut session: Option<Arc<PollSession>> = None;
    let from = Peer(peer);
    let timer = tokio::time::sleep(idle);
    tokio::pin!(timer);
    loop {
        let same = known.as_ref().map_or(&[][..], |k| &k.lines[..]);
        let poll = match http1::next_request(&tcp, &mut pending, idle, head_timeout, same, poll_of).await {
            Next::Request(poll) => poll,
            Next::Other => break,
            Next::Gone => return,
        };
        let target = match poll {
            PollHead::Parsed { parts, lines, target } => {
                let headers = &parts.headers;
                // Refused requests are not remembered: a repeat is refused the same way again.
                if let Some(refused) = crate::auth::http::refusal(&node, &parts.method, parts.uri.path(), headers) {
                    known = None;
                    if !respond(&tcp, refused, head_timeout).await {
                        return;
                    }
                    continue;
                }
                let head = answer_head.of(headers, &node);
                known = Some(Known { lines, headers: parts.headers, head });
                target
            }
            PollHead::Same(target) => target,
        };
        let Some(k) = known.as_ref() else { return };
        let conn = Conn { tcp: &tcp, pending: &mut pending, timer: timer.as_mut() };
        let r = match serve_one(&polls, &target, k, &mut session, &from, conn, head_timeout).await {
            Served::Response(r) => r,
            Served::Answered => continue,
            Served::Gone => return,
        };
        if !respond(&tcp, r, head_timeout).await {
            return;
        }
    }
    // Another kind of request: hyper serves the rest of the connection.
    let Ok(tcp) = Arc::try_unwrap(tcp) else { return };
    http1::serve_http(http1::Rewind::new(pending, tcp), app, peer, head_timeout).await;
}

/// Writes `r` whole on the kept-alive connection; `false`: the connection cannot go on.
async fn respond(tcp: &TcpStream, r: Response, timeout: Duration) -> bool {
    let Some(bytes) = http1::response_bytes(r, Ending::KeepAlive).await else { return false };
    matches!(tokio::time::timeout(timeout, http1::write_all(tcp, &bytes)).await, Ok(Ok(())))
}

/// The connection's last poll head that was parsed whole and not refused: later polls that
/// repeat its header lines are read by their request line alone and answered by what it
/// parsed (the headers the answer depends on: its CORS head, the host check).
struct Known {
    /// Its header lines, as sent, and as parsed.
    lines: Vec<u8>,
    headers: HeaderMap,
    /// The head of a poll's answer for those headers (`AnswerHead`).
    head: Bytes,
}

/// A `GET /poll/{session}` read on a kept-alive connection (`poll_of`).
enum PollHead {
    /// Parsed whole: its parts, its header lines and its target.
    Parsed { parts: Box<Parts>, lines: Vec<u8>, target: String },
    /// Its header lines repeat the connection's `Known` ones: its target.
    Same(String),
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

/// Serves the poll for `target` (`/poll/{session}?{query}`) whose headers `known` holds, not
/// refused; `session`: the session the connection served last.
async fn serve_one(
    polls: &Arc<Polls>,
    target: &str,
    known: &Known,
    session: &mut Option<Arc<PollSession>>,
    peer: &Peer,
    conn: Conn<'_>,
    write_timeout: Duration,
) -> Served {
    let headers = &known.headers;
    let cors = |mut r: Response| {
        transport_http::cors(headers, &polls.node, &mut r);
        Served::Response(r)
    };
    let (path, query) = split_target(target);
    let id = session_id(path).unwrap_or_default();
    let (s, ack, timeout) = match session_of(polls, id, query, headers, Some(peer), session.as_ref()).await {
        Err(r) => return cors(r),
        Ok(found) => found,
    };
    if !session.as_ref().is_some_and(|k| Arc::ptr_eq(k, &s)) {
        *session = Some(s.clone());
    }
    let poll = match polls.start_poll(&s, ack).await {
        Err(r) => return cors(r),
        Ok(started) => started,
    };
    let mut deadline = tokio::time::Instant::now() + timeout;
    let tcp = conn.tcp;
    let max = longest_wait(polls);
    // The poll a poller sends again at once: the same headers, this session, the answered
    // batch acked. Anything else is read and served as any request is.
    let next_poll = |input: &[u8], seq: u64| {
        let (target, len) = http1::repeat_of(input, &known.lines)?;
        let (path, query) = split_target(target);
        if session_id(path) != Some(s.id.as_str()) {
            return None;
        }
        match ack_and_timeout(query, max) {
            Ok((Some(ack), timeout)) if ack == seq => Some((len, timeout)),
            _ => None,
        }
    };
    match poll_held::wait(polls, &s, &poll, &mut deadline, conn, known.head.clone(), &next_poll, write_timeout).await {
        Held::Answered => Served::Answered,
        Held::Gone => Served::Gone,
        Held::Unanswered => tokio::select! {
            r = polls.wait_and_answer(&s, poll.me, deadline) => cors(r),
            // A client that leaves while its poll is held ends the poll.
            () = http1::client_gone(tcp) => Served::Gone,
        },
    }
}

/// A plain `GET /poll/{session}` that this module serves: no body, no upgrade, no
/// `Connection: close`, an id that needs no decoding. A head that repeats the last one's
/// header lines passed those header checks then.
fn poll_of(seen: Seen<'_>) -> Option<PollHead> {
    match seen {
        Seen::Same(target) => {
            session_id(split_target(target).0)?;
            Some(PollHead::Same(target.to_string()))
        }
        Seen::Parsed(parts, lines) => {
            session_id(parts.uri.path())?;
            let h = &parts.headers;
            let has_body = h.get(header::CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0")
                || h.contains_key(header::TRANSFER_ENCODING);
            let closing = h.get_all(header::CONNECTION).iter().any(|v| {
                v.to_str().is_ok_and(|v| {
                    v.split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case("close") || t.trim().eq_ignore_ascii_case("upgrade"))
                })
            });
            if has_body || closing || h.contains_key(header::UPGRADE) || h.contains_key(header::EXPECT) {
                return None;
            }
            let target = parts.uri.path_and_query().map_or("/", |t| t.as_str()).to_string();
            Some(PollHead::Parsed { parts, lines: lines.to_vec(), target })
        }
    }
}

/// A request target's path and query.
fn split_target(target: &str) -> (&str, Option<&str>) {
    target.split_once('?').map_or((target, None), |(p, q)| (p, Some(q)))
}

/// The session id of a poll's path: not empty, no `/` or `%`.
fn session_id(path: &str) -> Option<&str> {
    path.strip_prefix("/poll/").filter(|id| !id.is_empty() && !id.contains(['/', '%']))
}
