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
use crate::transport::poll_held::{self, AnswerHead, Answering, Conn, Held};
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
    // The poll a poller sends again at once: this one again, acking the batch just answered.
    // Anything else is read and served as any request is.
    let again = Again::of(target, &known.lines);
    let next_poll = Box::new(move |input: &[u8], seq: u64| Some((again.as_ref()?.len_in(input, seq)?, timeout)));
    let answering = Answering { head: known.head.clone(), next_poll, write_timeout };
    match poll_held::wait(polls, &s, &poll, &mut deadline, conn, answering).await {
        Held::Answered => Served::Answered,
        Held::Gone => Served::Gone,
        Held::Unanswered => tokio::select! {
            r = polls.wait_and_answer(&s, poll.me, deadline) => cors(r),
            // A client that leaves while its poll is held ends the poll.
            () = http1::client_gone(tcp) => Served::Gone,
        },
    }
}

/// A poll sent again as it was, its `ack` the batch its answer carried: the head of the
/// poll that continues a held one. Its bytes are the held poll's but for the `ack` value, so it
/// reads as the held poll read — this session, the same headers and `timeout` — and comparing
/// it with them is all the reading it needs.
struct Again {
    /// `GET {target up to the first ack's value}`, then `{the rest of the target} HTTP/1.1\r\n`
    /// and the header lines; `at`: where the value goes.
    head: Vec<u8>,
    at: usize,
}

impl Again {
    /// `target`'s poll sent again; `None` when its first `ack` (the one `ack_and_timeout`
    /// reads) is not a plain number.
    fn of(target: &str, lines: &[u8]) -> Option<Again> {
        let query = target.find('?')? + 1;
        let mut start = query;
        for kv in target[query..].split('&') {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            if k == "ack" {
                if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let (at, end) = (start + 4, start + kv.len());
                let mut head = Vec::with_capacity(4 + target.len() + 11 + lines.len());
                head.extend_from_slice(b"GET ");
                head.extend_from_slice(&target.as_bytes()[..at]);
                head.extend_from_slice(&target.as_bytes()[end..]);
                head.extend_from_slice(b" HTTP/1.1\r\n");
                head.extend_from_slice(lines);
                return Some(Again { head, at: 4 + at });
            }
            start += kv.len() + 1;
        }
        None
    }

    /// The length of the head at the start of `input` if it is this poll acking `seq`.
    fn len_in(&self, input: &[u8], seq: u64) -> Option<usize> {
        let (before, after) = self.head.split_at(self.at);
        let rest = input.strip_prefix(before)?;
        let digits = rest.iter().take(20).take_while(|b| b.is_ascii_digit()).count();
        let ack: u64 = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
        (ack == seq && rest[digits..].starts_with(after)).then_some(self.head.len() + digits)
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

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: &[u8] = b"Host: 127.0.0.1\r\nOrigin: http://a.example\r\n\r\n";
    const MAX: Duration = Duration::from_secs(30);

    fn head(target: &str, lines: &[u8]) -> Vec<u8> {
        [format!("GET {target} HTTP/1.1\r\n").as_bytes(), lines].concat()
    }

    /// How the full reading of a poll reads the head at the start of `input`: its session id,
    /// `ack` and `timeout`.
    fn read(input: &[u8]) -> (String, Option<u64>, Duration) {
        let (target, _) = http1::repeat_of(input, LINES).expect("a poll head");
        let (path, query) = split_target(target);
        let (ack, timeout) = ack_and_timeout(query, MAX).expect("a valid poll");
        (session_id(path).expect("a session").to_string(), ack, timeout)
    }

    #[test]
    fn a_poll_sent_again_acking_the_answered_batch_continues_it_and_reads_as_it_did() {
        let held = "/poll/abc?timeout=2.5&ack=7&x=1";
        let again = Again::of(held, LINES).expect("a poll with an ack");
        for next in ["/poll/abc?timeout=2.5&ack=8&x=1", "/poll/abc?timeout=2.5&ack=08&x=1"] {
            let mut input = head(next, LINES);
            let len = input.len();
            input.extend_from_slice(b"GET /poll/abc?ack=9 HTTP/1.1\r\n");
            assert_eq!(again.len_in(&input, 8), Some(len), "{next}");
            // The full reading agrees: the same session and timeout, the batch acked.
            let (id, _, timeout) = read(&head(held, LINES));
            assert_eq!(read(&input), (id, Some(8), timeout), "{next}");
        }
        // The largest batch number is read whole.
        let last = head(&format!("/poll/abc?ack={}", u64::MAX), LINES);
        assert_eq!(Again::of("/poll/abc?ack=0", LINES).unwrap().len_in(&last, u64::MAX), Some(last.len()));
    }

    #[test]
    fn anything_else_does_not_continue_it() {
        let again = Again::of("/poll/abc?ack=7&timeout=2.5", LINES).unwrap();
        let other_lines = b"Host: 127.0.0.1\r\nOrigin: http://b.example\r\n\r\n";
        let cases = [
            (head("/poll/abc?ack=8&timeout=2.5", LINES), 9, "another batch acked"),
            (head("/poll/abc?ack=7&timeout=2.5", LINES), 8, "the answered batch's predecessor"),
            (head("/poll/abd?ack=8&timeout=2.5", LINES), 8, "another session"),
            (head("/poll/abc?ack=8&timeout=3", LINES), 8, "another timeout"),
            (head("/poll/abc?ack=8", LINES), 8, "no timeout"),
            (head("/poll/abc?ack=8&timeout=2.5", other_lines), 8, "other headers"),
            (head("/poll/abc?ack=+8&timeout=2.5", LINES), 8, "a signed ack"),
            (head("/poll/abc?ack=100000000000000000008&timeout=2.5", LINES), 8, "an ack past u64"),
            (head("/poll/abc?ack=8&timeout=2.5", LINES)[..40].to_vec(), 8, "half a head"),
            ([&b"PUT"[..], &head("/poll/abc?ack=8&timeout=2.5", LINES)[3..]].concat(), 8, "another method"),
        ];
        for (input, seq, why) in cases {
            assert_eq!(again.len_in(&input, seq), None, "{why}");
        }
    }

    #[test]
    fn a_poll_whose_first_ack_is_not_a_plain_number_has_no_continuation_here() {
        for target in ["/poll/abc", "/poll/abc?timeout=1", "/poll/abc?ack", "/poll/abc?ack=", "/poll/abc?ack=x&ack=7"] {
            assert!(Again::of(target, LINES).is_none(), "{target}");
        }
    }
}
