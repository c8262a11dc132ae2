//! An event stream that owns its socket: `GET /sse?…` as the first request of a plain TCP
//! connection.
//!
//! Through hyper, every delivery to a stream would wake the task polling its response body,
//! which then writes. A stream that owns its socket is written like a WebSocket connection
//! instead: the fan-out that finds it idle frames the events (`outbox::framed`) and calls
//! `try_write`, so a delivery costs one write call and no task wake-up, and the connection
//! keeps no HTTP buffers while idle. So the accept path looks at a plain connection's first
//! bytes ([`first_request`]): a complete `GET /sse?…` head is read off the socket and served
//! here; anything else goes to hyper untouched (nothing was read).
//!
//! The request still goes through the node's routes and middleware, with the socket offered
//! to the route ([`SocketOffer`]). A `?channels=` stream is opened on it by the same
//! [`open`](super::open) that admits and subscribes a stream through hyper, and the same
//! framer writes its events. A session's stream (`?session=`) runs its own loop on the
//! socket instead (`transport::session_stream`): its messages are taken from the session, not
//! written by the fan-out. The response is `Connection: close` and ends when the socket
//! does (no length, no chunks: an event stream is not reused for another request). A stream
//! over TLS, or one that comes after other requests on a kept-alive connection, is served by
//! hyper ([`super::handle`]).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method};
use axum::response::Response;
use tokio::net::TcpStream;

use axum::Router;
use tower::ServiceExt;

use super::{end, Opened, PING};
use crate::node::Node;
use crate::outbox::{Outbox, Pushed};
use crate::transport::http::Peer;
use crate::transport::owned::{discard_input, linger, timer_at, CLOSE_GRACE};

/// The request line prefix of a stream this module serves.
const PREFIX: &[u8] = b"GET /sse?";

/// Largest request head read here; a longer one goes to hyper.
const MAX_HEAD: usize = 16 * 1024;

/// Most headers read here; a request with more goes to hyper.
const MAX_HEADERS: usize = 64;

/// What the first bytes of a connection are.
pub enum First {
    /// A stream request, its head read off the socket.
    Stream(Box<Parts>),
    /// Something else, left unread for hyper.
    Http,
    /// Nothing came within the timeout, or the connection failed.
    Gone,
}

/// Looks at the first request of a plain connection, waiting at most `timeout` for it.
pub async fn first_request(tcp: &TcpStream, peer: SocketAddr, timeout: Duration) -> First {
    let mut start = [0u8; PREFIX.len()];
    match tokio::time::timeout(timeout, tcp.peek(&mut start)).await {
        Ok(Ok(n)) if n > 0 => {
            if start[..n] != PREFIX[..n] || n < PREFIX.len() {
                return First::Http;
            }
        }
        _ => return First::Gone,
    }
    let mut buf = vec![0u8; MAX_HEAD];
    let n = match tcp.peek(&mut buf).await {
        Ok(n) => n,
        Err(_) => return First::Gone,
    };
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    // An incomplete head (it came in pieces) or one that does not parse: hyper reads it and
    // answers as it does any request.
    let Ok(httparse::Status::Complete(len)) = req.parse(&buf[..n]) else { return First::Http };
    let Some(parts) = parts_of(&req, peer) else { return First::Http };
    // The head is in the socket's buffer (it was just peeked): read exactly it.
    match tcp.try_read(&mut buf[..len]) {
        Ok(got) if got == len => First::Stream(Box::new(parts)),
        _ => First::Gone,
    }
}

fn parts_of(req: &httparse::Request<'_, '_>, peer: SocketAddr) -> Option<Parts> {
    let mut b = axum::http::Request::builder().method(Method::GET).uri(req.path?);
    for h in req.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
        b = b.header(name, HeaderValue::from_bytes(h.value).ok()?);
    }
    let (mut parts, ()) = b.body(()).ok()?.into_parts();
    parts.extensions.insert(Peer(peer));
    Some(parts)
}

/// Offered to the `/sse` route by a request whose stream may own its socket: the route opens
/// the stream on the socket and leaves it here.
#[derive(Clone)]
pub(crate) struct SocketOffer {
    pub(crate) wire: Arc<TcpStream>,
    pub(crate) taken: Arc<parking_lot::Mutex<Option<OnSocket>>>,
}

/// A stream a route opened on an offered socket.
pub(crate) enum OnSocket {
    /// A `?channels=` stream: its outbox writes into the socket, as a WebSocket's does.
    Stream(Box<Opened>),
    /// A stream that runs its own writing loop on the socket (a session's,
    /// `transport::session_stream`), once the head is out.
    Own(Box<dyn FnOnce(Arc<TcpStream>) -> futures_util::future::BoxFuture<'static, ()> + Send>),
}

/// Serves the request `parts` on `tcp` through `app` — the node's routes and middleware, as
/// any request — and, when the route opened a stream on the socket, the stream to its end.
pub async fn serve(node: Arc<Node>, app: Router, tcp: TcpStream, parts: Box<Parts>) {
    // Boxed: the request's routing and answer need a large future, but only until the head is
    // out; an open stream keeps just its own small state.
    let Some((tcp, on)) = Box::pin(answer(&node, app, tcp, parts)).await else {
        return;
    };
    let Opened { mut session, outbox, slot } = match on {
        OnSocket::Stream(opened) => *opened,
        OnSocket::Own(run) => return run(tcp).await,
    };
    // The head is out: the events queued meanwhile (the subscribe's) follow it.
    outbox.flush_blocked();
    let gone = run(&node, &tcp, &mut session, &outbox).await;
    let teardown = Box::pin(end(node.clone(), session, outbox.clone()));
    match gone {
        true => teardown.await,
        false => drop(tokio::join!(teardown, Box::pin(finish(&tcp, &outbox)))),
    }
    drop(slot);
}

/// Routes the request and writes the answer's head; returns the stream the route opened on
/// the socket once its head is out. A refusal is written whole and the client let go.
async fn answer(
    node: &Arc<Node>,
    app: Router,
    tcp: TcpStream,
    parts: Box<Parts>,
) -> Option<(Arc<TcpStream>, OnSocket)> {
    let mut parts = *parts;
    let _ = tcp.set_nodelay(true);
    let tcp = Arc::new(tcp);
    let offer = SocketOffer { wire: tcp.clone(), taken: Arc::default() };
    parts.extensions.insert(offer.clone());
    let response = match app.oneshot(axum::extract::Request::from_parts(parts, Body::empty())).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let opened = offer.taken.lock().take();
    drop(offer);
    let timeout = Duration::from_secs(node.config.limits.handshake_timeout_s);
    let head = head_of(response, opened.is_some()).await?;
    let sent = tokio::time::timeout(timeout, write_all(&tcp, &head)).await.is_ok_and(|r| r.is_ok());
    match opened {
        Some(on) if sent => Some((tcp, on)),
        Some(OnSocket::Stream(opened)) => {
            let Opened { session, outbox, slot } = *opened;
            end(node.clone(), session, outbox).await;
            drop(slot);
            None
        }
        Some(OnSocket::Own(_)) => None,
        None => {
            if sent {
                linger(&tcp, tokio::time::Instant::now() + CLOSE_GRACE).await;
            }
            None
        }
    }
}

/// The bytes of `r`'s head — and of its body, unless it is the head of a `stream` — for a
/// connection that closes after it.
async fn head_of(r: Response, stream: bool) -> Option<Vec<u8>> {
    let (parts, body) = r.into_parts();
    let mut out = Vec::with_capacity(256);
    let status = parts.status;
    out.extend_from_slice(
        format!("HTTP/1.1 {} {}\r\n", status.as_u16(), status.canonical_reason().unwrap_or("")).as_bytes(),
    );
    for (name, value) in &parts.headers {
        // A stream's length is where the connection ends; an error's is set below.
        if name == axum::http::header::CONTENT_LENGTH || name == axum::http::header::TRANSFER_ENCODING {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"connection: close\r\n");
    if stream {
        // The event stream: it ends when the connection does.
        out.extend_from_slice(b"\r\n");
        return Some(out);
    }
    let body = axum::body::to_bytes(body, 1 << 20).await.ok()?;
    out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(&body);
    Some(out)
}

/// Writes all of `buf`, waiting for the socket to take it.
pub(crate) async fn write_all(tcp: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        tcp.writable().await?;
        match tcp.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Runs an open stream until it closes (`false`) or its client is gone (`true`).
async fn run(node: &Node, tcp: &TcpStream, session: &mut crate::session::Session, outbox: &Outbox) -> bool {
    let heartbeat = Duration::from_secs(node.config.transports.sse_heartbeat_s);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    let mut deadline = session.deadline();
    let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = deadline.map(timer_at);
    loop {
        if outbox.is_closing() {
            return false;
        }
        let blocked = outbox.is_blocked();
        tokio::select! {
            _ = outbox.notified() => {}
            r = tcp.writable(), if blocked => match r {
                Ok(()) => outbox.flush_blocked(),
                Err(_) => return true,
            },
            r = tcp.readable() => {
                if r.is_err() || discard_input(tcp) {
                    return true;
                }
            }
            _ = tick.tick() => {
                outbox.last_seen.store(crate::unix_s(), Relaxed);
                if !outbox.wrote_since() && outbox.push_control(bytes::Bytes::from_static(PING)) == Pushed::Schedule {
                    outbox.flush();
                }
            }
            _ = async { match timer.as_mut() { Some(t) => t.as_mut().await, None => std::future::pending().await } } => {
                if let Some(reason) = session.check_deadline() {
                    outbox.close(reason.code, &reason.reason, true);
                }
                deadline = session.deadline();
                timer = deadline.map(timer_at);
            }
        }
    }
}

/// Writes out the last events (the `disconnect`), then lets the client go.
async fn finish(tcp: &TcpStream, outbox: &Outbox) {
    let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
    while !outbox.finished() {
        tokio::select! {
            r = tcp.writable() => match r {
                Ok(()) => outbox.flush_blocked(),
                Err(_) => return,
            },
            _ = outbox.notified() => {}
            _ = tokio::time::sleep_until(deadline) => return,
        }
    }
    linger(tcp, deadline).await;
}
