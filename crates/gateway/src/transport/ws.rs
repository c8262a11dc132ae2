//! The WebSocket transport: the `/ws` handshake and one task per connection that reads frames,
//! feeds the session, and takes over writes when the socket is full.
//!
//! The handshake applies the admission rules of docs/security.md in order, cheapest first:
//! handshakes per second per client address (HTTP 429), the `Origin` allow-list (HTTP 403),
//! the upgrade itself, then credentials — `Authorization` (Bearer or Basic), the
//! `switchboard.token.<jwt>` subprotocol entry, or the `token` query parameter. Refused
//! credentials and full per-address slots still upgrade and then close with 4001 / 4029, so
//! that browsers, which never see the HTTP status of a failed handshake, learn why.
//!
//! Back-pressure: while the connection's outbox is full (the client does not read what it
//! asked for), the task stops reading its commands; everything queued counts against
//! `max_pending_bytes`, past which the connection closes with 4008 (`outbox`).
//!
//! An idle connection holds no buffers: reads land in a stack buffer, only a partial frame is
//! kept between reads, hyper's handshake buffer is freed with the upgrade, and the outbox frees
//! its queue once written out. What stays is the connection's task (the read loop's state,
//! under 2 KiB; command handling and teardown are boxed while they run), its session and its
//! outbox: under 4 KiB of server memory per idle subscribed connection (docs/benchmarks.md).
//!
//! Frames are judged by RFC 6455 (`socket`: the reader, the socket taken from hyper, the
//! closing; shared with the echo server, `crate::echo`): a violation fails the connection
//! with close 1002, 1007 or 1009 and no `disconnect` message. A valid frame that carries no
//! valid command is the application's concern: `disconnect` and close 4010.
//!
//! Compression: when `limits.compression` allows it and the client offers permessage-deflate
//! (RFC 7692), the handshake accepts the first offer it can honour ([`extension`]), always
//! without context takeover either way; the connection's reader then inflates compressed
//! messages and its outbox compresses what it sends from `limits.compression_min_bytes` on
//! (`crate::outbox::deflated`). No compression state stays with the connection.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};
use bytes::Bytes;
use switchboard_protocol::code::close;
use switchboard_protocol::websocket::deflate::{self, Agreed};
use switchboard_protocol::websocket::{self, Event, Opcode};
use switchboard_protocol::Format;

use crate::auth::credentials::{parse_authorization, split_subprotocols, token_from_query};
use crate::auth::limits::{Admission, IpGuard};
use crate::auth::{AuthFailure, Identity};
use crate::config::Compression;
use crate::node::Node;
use crate::outbox::Deflate;
use crate::session::{CloseReason, Session};
use crate::transport::http::Peer;
use crate::transport::owned::timer_at;

pub mod socket;

use socket::{finish, FrameReader, ReadError, Socket};

/// What the handshake decided about a connection, carried into its task.
struct Admitted {
    /// `Ok(None)`: no credentials presented.
    identity: Result<Option<Identity>, AuthFailure>,
    /// `Some(None)`: the client's address has no connection slot left (4029).
    slot: Option<Option<IpGuard>>,
    /// The client's address is exempt from per-connection rate limits.
    exempt: bool,
    /// The request headers the connect hook is told (`proxy.headers`).
    hook_headers: std::collections::BTreeMap<String, String>,
    format: Format,
    max_frame: usize,
    /// permessage-deflate, when negotiated.
    deflate: Option<Deflate>,
    /// Bytes that came after the handshake, before the connection's task read anything.
    leftover: Vec<u8>,
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Handles `GET /ws`: admission, the upgrade, the subprotocol, and spawns the connection.
pub async fn handshake(State(node): State<Arc<Node>>, mut req: Request) -> Response<Body> {
    let auth = node.config.security.auth.clone();
    if !is_upgrade(req.method(), req.headers()) {
        return plain(StatusCode::BAD_REQUEST, "expected a WebSocket upgrade (GET with Upgrade: websocket)");
    }
    let h = req.headers();
    let ip: Option<IpAddr> = req
        .extensions()
        .get::<Peer>()
        .map(|p| auth.client_ip(p.0.ip(), header_str(h, "x-forwarded-for"), header_str(h, "x-real-ip")));
    let limited = ip.filter(|ip| !auth.is_exempt(*ip));
    if let Some(ip) = limited {
        if auth.limiter.admit_handshake(ip) == Admission::RateLimited {
            node.metrics.rejected_connections.fetch_add(1, Relaxed);
            let mut r = plain(StatusCode::TOO_MANY_REQUESTS, "too many handshakes from this address; retry later");
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return r;
        }
    }
    if !auth.origin_allowed(header_str(h, "origin"), header_str(h, "host")) {
        node.metrics.rejected_connections.fetch_add(1, Relaxed);
        return plain(StatusCode::FORBIDDEN, "origin not allowed");
    }
    let accept = match accept_key(h) {
        Ok(accept) => accept,
        Err(refused) => return *refused,
    };
    // A `switchboard.token.<jwt>` entry carries credentials; it is never chosen (echoed).
    let (offered, protocol_token) =
        split_subprotocols(h.get_all(header::SEC_WEBSOCKET_PROTOCOL).iter().filter_map(|v| v.to_str().ok()));
    let format = offered.iter().find_map(|p| match *p {
        Format::JSON_PROTOCOL => Some(Format::Json),
        Format::MSGPACK_PROTOCOL => Some(Format::Msgpack),
        _ => None,
    });
    if format.is_none() && !offered.is_empty() {
        return plain(
            StatusCode::BAD_REQUEST,
            "no supported subprotocol offered; use switchboard.v1.json or switchboard.v1.msgpack",
        );
    }
    let presented = h
        .get(header::AUTHORIZATION)
        .map(|v| parse_authorization(v.as_bytes()))
        .or(protocol_token)
        .or_else(|| req.uri().query().and_then(token_from_query));
    let identity = match presented {
        // Without authentication configured, credentials are not needed and not checked.
        _ if !auth.enabled() => Ok(None),
        None => Ok(None),
        Some(Err(e)) => Err(AuthFailure::from(e)),
        Some(Ok(c)) => auth.authenticate_from(c, limited).await.map(Some),
    };
    if let Err(e) = &identity {
        tracing::debug!(ip = ?ip, reason = %e, "handshake credentials refused");
    }
    let hook_headers = node.config.hooks.pick_headers(req.headers().iter().map(|(n, v)| (n.as_str(), v.as_bytes())));
    let format = format.unwrap_or(Format::Json);
    let limits = &node.config.limits;
    let agreed = (limits.compression == Compression::Deflate).then(|| extension(req.headers())).flatten();
    let mut admitted = Admitted {
        identity,
        slot: limited.map(|ip| auth.limiter.acquire(ip)),
        exempt: limited.is_none(),
        hook_headers,
        format,
        max_frame: limits.max_frame_bytes,
        deflate: agreed.map(|a| Deflate { window: a.server_window, min_bytes: limits.compression_min_bytes }),
        leftover: Vec::new(),
    };
    // Echo the chosen protocol only when the client offered it.
    let echo = offered.contains(&format.subprotocol()).then_some(format.subprotocol());
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed");
                return;
            }
        };
        // The connection gets a task of its own, holding only the connection's state: not the
        // upgrade's, nor a slot for the TLS stream type it was not (rustls state is kilobytes).
        // A panic outside command handling (which the session catches itself) ends this
        // connection only; its session's teardown runs in `Drop` as the task unwinds.
        match socket::take(upgraded) {
            Some((socket, leftover)) => {
                admitted.leftover = leftover;
                tokio::spawn(switchboard_supervisor::catch("connection", run(node, socket, Box::new(admitted))));
            }
            None => tracing::error!("upgraded connection is neither TCP nor TLS over TCP"),
        }
    });
    switching_protocols(&accept, echo, agreed)
}

/// The permessage-deflate offer of a request's `Sec-WebSocket-Extensions` that this server
/// accepts, if any (`websocket::deflate::offer`: RFC 7692's rules).
pub(crate) fn extension(h: &HeaderMap) -> Option<Agreed> {
    deflate::negotiate(h.get_all(header::SEC_WEBSOCKET_EXTENSIONS).iter().filter_map(|v| v.to_str().ok()))
}

/// Whether a request asks for a WebSocket upgrade (RFC 6455 §4.2.1): a GET with `Upgrade:
/// websocket` and `Connection: upgrade`.
pub(crate) fn is_upgrade(method: &Method, h: &HeaderMap) -> bool {
    let has = |name: header::HeaderName, token: &str| {
        h.get_all(name)
            .iter()
            .any(|v| v.to_str().is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token))))
    };
    method == Method::GET && has(header::UPGRADE, "websocket") && has(header::CONNECTION, "upgrade")
}

/// The `Sec-WebSocket-Accept` of an upgrade request (RFC 6455 §4.2.2), or the answer that
/// refuses it: 426 for a version other than 13, 400 without a key.
pub(crate) fn accept_key(h: &HeaderMap) -> Result<String, Box<Response<Body>>> {
    if h.get(header::SEC_WEBSOCKET_VERSION).and_then(|v| v.to_str().ok()) != Some("13") {
        let mut r = plain(StatusCode::UPGRADE_REQUIRED, "unsupported WebSocket version; use 13");
        r.headers_mut().insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        return Err(Box::new(r));
    }
    let Some(key) = h.get(header::SEC_WEBSOCKET_KEY) else {
        return Err(Box::new(plain(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key")));
    };
    Ok(tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()))
}

/// The 101 answer that completes an upgrade, naming the chosen subprotocol and the accepted
/// permessage-deflate offer if any.
pub(crate) fn switching_protocols(
    accept: &str,
    protocol: Option<&'static str>,
    deflate: Option<Agreed>,
) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let hd = r.headers_mut();
    hd.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    hd.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(accept) {
        hd.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Some(p) = protocol {
        hd.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p));
    }
    if let Some(Ok(v)) = deflate.map(|a| HeaderValue::from_str(&a.response())) {
        hd.insert(header::SEC_WEBSOCKET_EXTENSIONS, v);
    }
    r
}

fn plain(status: StatusCode, msg: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::from(msg));
    *r.status_mut() = status;
    r
}

/// What woke the connection task.
enum Wake {
    Read,
    Writable,
    Deadline,
    Other,
}

/// Runs one connection to its end.
async fn run(node: Arc<Node>, socket: Socket, admitted: Box<Admitted>) {
    // Unboxed at once, so the connection's state keeps no copy of what the handshake decided.
    let Admitted { identity, slot, exempt, hook_headers, format, max_frame, deflate, leftover } = *admitted;
    let _ = socket.tcp().set_nodelay(true);
    let outbox = match node.register(format, socket.wire()) {
        Ok(ob) => ob,
        Err(ob) => {
            Box::pin(finish(&socket, &ob)).await;
            return;
        }
    };
    if let Some(d) = deflate {
        outbox.use_deflate(d);
    }
    // A WebSocket client subscribes again on its connection: a channel whose publications
    // the broker lost ends with an `unsubscribed` push, the others keep streaming.
    outbox.accept_resubscribes();
    // Refusals that waited for the upgrade so the client can be told why.
    let refusal = match (&slot, &identity) {
        (Some(None), _) => {
            node.metrics.rejected_connections.fetch_add(1, Relaxed);
            Some(CloseReason::new(close::TOO_MANY, "too many connections from this address"))
        }
        (_, Err(AuthFailure::RateLimited)) => {
            node.metrics.rejected_connections.fetch_add(1, Relaxed);
            Some(CloseReason::new(close::TOO_MANY, AuthFailure::RateLimited.to_string()))
        }
        (_, Err(e)) => Some(CloseReason::new(close::INVALID_TOKEN, e.to_string())),
        _ => None,
    };
    if let Some(reason) = refusal {
        outbox.close(reason.code, &reason.reason, false);
        Box::pin(finish(&socket, &outbox)).await;
        node.unregister(outbox.id);
        return;
    }
    // Held until the connection ends: it frees the address's slot on drop.
    let _slot = slot;
    let mut session = Session::new(node.clone(), outbox.clone());
    let identity = identity.ok().flatten();
    if identity.is_none() && node.config.security.auth.has_connect_hook() {
        let ctx = crate::session::ConnectContext { transport: "websocket", headers: hook_headers };
        session.await_connect_hook(ctx);
    }
    session.set_identity(identity);
    session.set_rate_exempt(exempt);
    session.set_limited_ip(_slot.as_ref().and_then(|g| g.as_ref().map(|g| g.ip())));
    let mut reader = FrameReader::new(max_frame, deflate.is_some());
    let message_timeout = Duration::from_secs(node.config.limits.handshake_timeout_s);
    let mut stop = node.stopping();
    if !leftover.is_empty() {
        let mut events = Vec::new();
        let read = reader.feed(&leftover, &mut events);
        if let Err(reason) = Box::pin(handle_events(&mut session, &mut events)).await {
            close_with(&node, &session, reason);
        }
        if let Err(e) = read {
            read_failed(&node, &session, e);
        }
    }
    // The next deadline — the session's (first message, token expiry) or the message in
    // progress's — and its timer: boxed and only present while there is one, so an idle
    // connection without authentication carries no timer.
    let mut deadline: Option<SystemTime> = None;
    let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
    // The closing frames are written and the socket shut (see `handle_until_closed`).
    let mut finished = false;
    loop {
        if outbox.is_closing() {
            break;
        }
        let next = match (session.deadline(), reader.started.map(|t| t + message_timeout)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if next != deadline {
            deadline = next;
            timer = next.map(timer_at);
        }
        let blocked = outbox.is_blocked() || socket.tls_pending();
        // Back-pressure: while the client's queue is full (it does not read), its commands are
        // not read either; they wait in the kernel's buffers and then in the client's.
        let full = outbox.is_full();
        let buffered = socket.buffered() && !full;
        let wake = tokio::select! {
            _ = outbox.notified() => Wake::Other,
            _ = socket.tls_notified() => Wake::Other,
            r = socket.tcp().writable(), if blocked => if r.is_ok() { Wake::Writable } else { break },
            r = socket.tcp().readable(), if !buffered && !full => if r.is_ok() { Wake::Read } else { break },
            _ = std::future::ready(()), if buffered => Wake::Read,
            _ = async { match timer.as_mut() { Some(t) => t.as_mut().await, None => std::future::pending().await } } => Wake::Deadline,
            _ = stop.changed() => Wake::Other,
        };
        match wake {
            Wake::Other => {}
            Wake::Writable => match socket.flush_tls() {
                Ok(()) if outbox.is_blocked() => outbox.flush_blocked(),
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The peer is gone (reset): nothing more can be written, and a writable socket
                // with records left would wake this loop forever.
                Err(_) => {
                    read_failed(&node, &session, ReadError::Io);
                    finished = true;
                    break;
                }
            },
            Wake::Deadline => {
                timer = None;
                deadline = None;
                if reader.started.is_some_and(|t| t + message_timeout <= SystemTime::now()) {
                    let why = format!("message not completed within {} s", message_timeout.as_secs());
                    close_with(&node, &session, CloseReason::new(close::BAD_COMMAND, why));
                } else if let Some(reason) = session.check_deadline() {
                    tracing::debug!(code = reason.code, reason = %reason.reason, "closing connection at its deadline");
                    session.outbox().close(reason.code, &reason.reason, true);
                }
            }
            Wake::Read => {
                // The events of one read: allocated only while a read has some.
                let mut events = Vec::new();
                let read = reader.read(&socket, &mut events);
                if !matches!(read, Ok(0)) {
                    outbox.last_seen.store(crate::unix_s(), Relaxed);
                }
                // What came before a violation is answered before the connection fails.
                if !events.is_empty() {
                    // Boxed: command handling needs a large future, but only while a command
                    // runs; an idle connection keeps just this loop's small state.
                    let (handled, done) =
                        Box::pin(handle_until_closed(&mut session, &mut events, &socket, &outbox)).await;
                    finished |= done;
                    if let Err(reason) = handled {
                        close_with(&node, &session, reason);
                    }
                }
                if let Err(e) = read {
                    read_failed(&node, &session, e);
                }
            }
        }
    }
    // The client is let go at once; the teardown (which may wait on a failing broker: presence
    // entries, unsubscribes) runs meanwhile instead of holding the close back.
    let teardown = Box::pin(session.cleanup());
    match finished {
        true => teardown.await,
        false => drop(tokio::join!(teardown, Box::pin(finish(&socket, &outbox)))),
    }
    node.unregister(outbox.id);
}

/// Ends a connection whose reading stopped: a client that broke RFC 6455 gets the close code
/// of its violation and no `disconnect` message; a gone client, nothing it could read.
fn read_failed(node: &Node, session: &Session, e: ReadError) {
    if let ReadError::Frame(e) = &e {
        node.metrics.protocol_errors.fetch_add(1, Relaxed);
        tracing::debug!(code = e.close_code(), reason = %e, "failing connection");
    }
    e.close(session.outbox());
}

/// Closes a connection whose frames were valid but not what the application takes: a
/// `disconnect` message, then the close frame.
fn close_with(node: &Node, session: &Session, reason: CloseReason) {
    node.metrics.protocol_errors.fetch_add(1, Relaxed);
    tracing::debug!(code = reason.code, reason = %reason.reason, "closing connection");
    session.outbox().close(reason.code, &reason.reason, true);
}

async fn handle_events(session: &mut Session, events: &mut Vec<Event>) -> Result<(), CloseReason> {
    for ev in events.drain(..) {
        if session.outbox().is_closing() {
            // Closed meanwhile (slow consumer, say): the rest of the read goes unanswered.
            continue;
        }
        match ev {
            Event::Message(op, payload) => {
                let expected = match session.outbox().format {
                    Format::Json => Opcode::Text,
                    Format::Msgpack => Opcode::Binary,
                };
                if op != expected {
                    return Err(CloseReason::new(close::BAD_COMMAND, "frame type does not match the subprotocol"));
                }
                session.handle_payload(&payload).await?;
            }
            Event::Ping(p) => {
                let _ = session.outbox().push_control(Bytes::from(websocket::encode_frame(Opcode::Pong, &p)));
                session.outbox().flush();
            }
            Event::Close(code) => {
                session.flush();
                socket::answer_close(session.outbox(), code);
                return Ok(());
            }
        }
    }
    session.flush();
    Ok(())
}

/// Runs the commands read. When the connection closes meanwhile — a slow consumer, a broker
/// gap, while a command still waits on the broker — its closing frames are written and the
/// socket shut at once rather than after the command: the client learns of the close without
/// waiting, and the command still runs to its end (a broker subscription is never abandoned
/// half made; the session's teardown undoes it). Returns whether the socket was finished.
async fn handle_until_closed(
    session: &mut Session,
    events: &mut Vec<Event>,
    socket: &Socket,
    outbox: &crate::outbox::Outbox,
) -> (Result<(), CloseReason>, bool) {
    let mut handled = Box::pin(handle_events(session, events));
    let closed = async {
        while !outbox.is_closing() {
            outbox.notified().await;
        }
    };
    tokio::select! {
        biased;
        r = &mut handled => return (r, false),
        () = closed => {}
    }
    let (r, ()) = tokio::join!(handled, finish(socket, outbox));
    (r, true)
}
