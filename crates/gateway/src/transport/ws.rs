//! The WebSocket transport: the `/ws` handshake and one task per connection that reads frames,
//! feeds the session, and takes over writes when the socket is full.
//!
//! The task holds no read buffer while idle: reads land in a stack buffer, and only a partial
//! frame is kept between reads. That keeps an idle connection to a few hundred bytes of heap.

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, Response, StatusCode};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use switchboard_protocol::code::close;
use switchboard_protocol::websocket::{self, FrameError, Opcode};
use switchboard_protocol::Format;
use tokio::net::TcpStream;

use crate::node::Node;
use crate::session::{CloseReason, Session};

/// How long a closing connection may take to write its last frames and see the peer go.
const CLOSE_GRACE: Duration = Duration::from_secs(3);

/// Handles `GET /ws`: validates the upgrade, picks the subprotocol and spawns the connection.
pub async fn handshake(State(node): State<Arc<Node>>, mut req: Request) -> Response<Body> {
    let h = req.headers();
    let has = |name: header::HeaderName, token: &str| {
        h.get_all(name)
            .iter()
            .any(|v| v.to_str().is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token))))
    };
    if req.method() != Method::GET || !has(header::UPGRADE, "websocket") || !has(header::CONNECTION, "upgrade") {
        return plain(StatusCode::BAD_REQUEST, "expected a WebSocket upgrade (GET with Upgrade: websocket)");
    }
    if h.get(header::SEC_WEBSOCKET_VERSION).and_then(|v| v.to_str().ok()) != Some("13") {
        let mut r = plain(StatusCode::UPGRADE_REQUIRED, "unsupported WebSocket version; use 13");
        r.headers_mut().insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        return r;
    }
    let Some(key) = h.get(header::SEC_WEBSOCKET_KEY) else {
        return plain(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let offered: Vec<String> = h
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(',').map(|p| p.trim().to_string()))
        .collect();
    let format = offered.iter().find_map(|p| match p.as_str() {
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
    let on_upgrade = hyper::upgrade::on(&mut req);
    let max_frame = node.config.limits.max_frame_bytes;
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed");
                return;
            }
        };
        match upgraded.downcast::<TokioIo<TcpStream>>() {
            Ok(parts) => {
                run(node, parts.io.into_inner(), parts.read_buf, format.unwrap_or(Format::Json), max_frame).await
            }
            Err(_) => tracing::error!("upgraded connection is not a TCP stream"),
        }
    });
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let hd = r.headers_mut();
    hd.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    hd.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        hd.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Some(f) = format {
        hd.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(f.subprotocol()));
    }
    r
}

fn plain(status: StatusCode, msg: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::from(msg));
    *r.status_mut() = status;
    r
}

/// What one read produced.
enum Event {
    Message(Opcode, Vec<u8>),
    Ping(Vec<u8>),
    Close(Vec<u8>),
}

/// Reassembles client frames across reads.
struct FrameReader {
    max: usize,
    /// A partial frame carried over to the next read; empty (unallocated) when idle.
    partial: Vec<u8>,
    /// A fragmented message being reassembled.
    fragments: Option<(Opcode, Vec<u8>)>,
}

enum ReadError {
    Eof,
    Io,
    Close(CloseReason),
}

impl FrameReader {
    /// Reads what the socket has without blocking and returns the complete events.
    fn read(&mut self, stream: &TcpStream, out: &mut Vec<Event>) -> Result<usize, ReadError> {
        let mut buf = [0u8; 8192];
        let n = match stream.try_read(&mut buf) {
            Ok(0) => return Err(ReadError::Eof),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(_) => return Err(ReadError::Io),
        };
        self.feed(&mut buf[..n], out)?;
        Ok(n)
    }

    fn feed(&mut self, data: &mut [u8], out: &mut Vec<Event>) -> Result<(), ReadError> {
        if self.partial.is_empty() {
            let used = self.parse(data, out)?;
            self.partial.extend_from_slice(&data[used..]);
        } else {
            let mut buf = std::mem::take(&mut self.partial);
            buf.extend_from_slice(data);
            let used = self.parse(&mut buf, out)?;
            buf.drain(..used);
            if buf.is_empty() {
                buf = Vec::new();
            }
            self.partial = buf;
        }
        Ok(())
    }

    fn parse(&mut self, data: &mut [u8], out: &mut Vec<Event>) -> Result<usize, ReadError> {
        let too_big = |n: u64| {
            ReadError::Close(CloseReason::new(close::MESSAGE_TOO_BIG, format!("message of {n} bytes is too big")))
        };
        let bad = |why: String| ReadError::Close(CloseReason::new(close::PROTOCOL_ERROR, why));
        let mut pos = 0;
        loop {
            let h = match websocket::parse_header(&data[pos..], self.max, true) {
                Ok(Some(h)) => h,
                Ok(None) => return Ok(pos),
                Err(FrameError::TooLarge(n)) => return Err(too_big(n)),
                Err(e) => return Err(bad(e.to_string())),
            };
            let end = pos + h.header_len + h.payload_len;
            if end > data.len() {
                return Ok(pos);
            }
            let payload = &mut data[pos + h.header_len..end];
            if let Some(mask) = h.mask {
                websocket::unmask(payload, mask, 0);
            }
            pos = end;
            match h.opcode {
                Opcode::Text | Opcode::Binary => {
                    if self.fragments.is_some() {
                        return Err(bad("new message before the fragmented one ended".into()));
                    }
                    if h.fin {
                        out.push(Event::Message(h.opcode, payload.to_vec()));
                    } else {
                        self.fragments = Some((h.opcode, payload.to_vec()));
                    }
                }
                Opcode::Continuation => {
                    let Some((op, mut buf)) = self.fragments.take() else {
                        return Err(bad("continuation frame without a message".into()));
                    };
                    if buf.len() + payload.len() > self.max {
                        return Err(too_big((buf.len() + payload.len()) as u64));
                    }
                    buf.extend_from_slice(payload);
                    if h.fin {
                        out.push(Event::Message(op, buf));
                    } else {
                        self.fragments = Some((op, buf));
                    }
                }
                Opcode::Ping => out.push(Event::Ping(payload.to_vec())),
                Opcode::Pong => {}
                Opcode::Close => {
                    out.push(Event::Close(payload.to_vec()));
                    return Ok(pos);
                }
            }
        }
    }
}

/// Runs one connection to its end.
async fn run(node: Arc<Node>, stream: TcpStream, leftover: Bytes, format: Format, max_frame: usize) {
    let _ = stream.set_nodelay(true);
    let stream = Arc::new(stream);
    let outbox = match node.register(format, stream.clone()) {
        Ok(ob) => ob,
        Err(ob) => {
            Box::pin(finish(&stream, &ob)).await;
            return;
        }
    };
    let mut session = Session::new(node.clone(), outbox.clone());
    let mut reader = FrameReader { max: max_frame, partial: Vec::new(), fragments: None };
    let mut events = Vec::new();
    let mut stop = node.stopping();
    if !leftover.is_empty() {
        let mut data = leftover.to_vec();
        match reader.feed(&mut data, &mut events) {
            Ok(()) => {
                if let Err(reason) = Box::pin(handle_events(&mut session, &mut events)).await {
                    close_with(&node, &session, reason);
                }
            }
            Err(e) => read_failed(&node, &session, e),
        }
    }
    loop {
        if outbox.is_closing() {
            break;
        }
        let blocked = outbox.is_blocked();
        tokio::select! {
            _ = outbox.notified() => {}
            r = stream.writable(), if blocked => {
                if r.is_ok() {
                    outbox.flush_blocked();
                }
            }
            r = stream.readable() => {
                if r.is_err() {
                    break;
                }
                match reader.read(&stream, &mut events) {
                    Ok(0) => {}
                    Ok(_) => {
                        outbox.last_seen.store(crate::unix_s(), Relaxed);
                        // Boxed: command handling needs a large future, but only while a
                        // command runs; an idle connection keeps just this loop's small state.
                        if let Err(reason) = Box::pin(handle_events(&mut session, &mut events)).await {
                            close_with(&node, &session, reason);
                        }
                    }
                    Err(e) => read_failed(&node, &session, e),
                }
            }
            _ = stop.changed() => {}
        }
    }
    Box::pin(session.cleanup()).await;
    Box::pin(finish(&stream, &outbox)).await;
    node.unregister(outbox.id);
}

fn read_failed(node: &Node, session: &Session, e: ReadError) {
    match e {
        ReadError::Close(reason) => close_with(node, session, reason),
        ReadError::Eof | ReadError::Io => session.outbox().close_echo(&[]),
    }
}

fn close_with(node: &Node, session: &Session, reason: CloseReason) {
    node.metrics.protocol_errors.fetch_add(1, Relaxed);
    tracing::debug!(code = reason.code, reason = %reason.reason, "closing connection");
    session.outbox().close(reason.code, &reason.reason, true);
}

async fn handle_events(session: &mut Session, events: &mut Vec<Event>) -> Result<(), CloseReason> {
    for ev in events.drain(..) {
        match ev {
            Event::Message(op, payload) => {
                let expected = match session.outbox().format {
                    Format::Json => Opcode::Text,
                    Format::Msgpack => Opcode::Binary,
                };
                if op != expected {
                    return Err(CloseReason::new(close::PROTOCOL_ERROR, "frame type does not match the subprotocol"));
                }
                session.handle_payload(&payload).await?;
            }
            Event::Ping(p) => {
                let _ = session.outbox().push_control(Bytes::from(websocket::encode_frame(Opcode::Pong, &p)));
                session.outbox().flush();
            }
            Event::Close(p) => {
                let echo = if p.len() >= 2 { p[..2].to_vec() } else { Vec::new() };
                session.flush();
                session.outbox().close_echo(&echo);
                return Ok(());
            }
        }
    }
    session.flush();
    Ok(())
}

/// Writes out the closing frames (waiting for writability), half-closes, and waits briefly
/// for the peer to close so the last frames are not lost to a reset.
async fn finish(stream: &TcpStream, outbox: &crate::outbox::Outbox) {
    let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
    while !outbox.finished() {
        tokio::select! {
            r = stream.writable() => {
                if r.is_err() {
                    return;
                }
                outbox.flush_blocked();
            }
            _ = outbox.notified() => {}
            _ = tokio::time::sleep_until(deadline) => return,
        }
    }
    let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
    let mut buf = [0u8; 1024];
    loop {
        tokio::select! {
            r = stream.readable() => {
                if r.is_err() {
                    return;
                }
                match stream.try_read(&mut buf) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
            _ = tokio::time::sleep_until(deadline) => return,
        }
    }
}
