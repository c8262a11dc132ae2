//! The node's own HTTP/1.1 on a plain connection, for the requests that are cheaper served
//! off the socket than through hyper: an event stream (`GET /sse?…`) and a held long poll
//! (`GET /poll/{session}`) that open their connection.
//!
//! The accept path looks at a plain connection's first bytes ([`first_request`]): a complete
//! head of one of those requests is read off the socket and served here ([`serve`]); anything
//! else goes to hyper untouched (nothing was read). The request still goes through the node's
//! routes and middleware, with the socket offered to the route ([`SocketOffer`]); the route
//! says what follows its answer ([`OnSocket`]):
//!
//! - an event stream writes its events into the socket itself after the head
//!   ([`OnSocket::Stream`]): the response is `Connection: close` with no length, and ends when
//!   the socket does;
//! - a poll's answer is whole (`Content-Length`) and the connection stays open for the next
//!   request ([`OnSocket::KeepAlive`], `transport::poll_socket`), which reads each request
//!   with [`next_request`] and hands the connection to hyper ([`serve_http`], with the bytes
//!   it read, [`Rewind`]) at the first request that is not a poll;
//! - a route that took nothing: the answer is written whole and the connection closes.
//!
//! TLS connections, and every other request, are hyper's.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method};
use axum::response::Response;
use axum::Router;
use futures_util::future::BoxFuture;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tower::ServiceExt;

use crate::node::Node;
use crate::transport::http::Peer;
use crate::transport::owned::{linger, CLOSE_GRACE};

/// The request line prefixes of the requests served here.
const PREFIXES: [&[u8]; 2] = [b"GET /sse?", b"GET /poll/"];

/// Largest request head read here; a longer one goes to hyper.
pub(crate) const MAX_HEAD: usize = 16 * 1024;

/// Most headers read here; a request with more goes to hyper.
const MAX_HEADERS: usize = 64;

/// What the first bytes of a connection are.
pub enum First {
    /// A request served here, its head read off the socket.
    Owned(Box<Parts>),
    /// Something else, left unread for hyper.
    Http,
    /// Nothing came within the timeout, or the connection failed.
    Gone,
}

/// Looks at the first request of a plain connection, waiting at most `timeout` for it.
pub async fn first_request(tcp: &TcpStream, peer: SocketAddr, timeout: Duration) -> First {
    let mut start = [0u8; 10];
    match tokio::time::timeout(timeout, tcp.peek(&mut start)).await {
        Ok(Ok(n)) if n > 0 => {
            if !PREFIXES.iter().any(|p| start[..n].starts_with(p)) {
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
    // An incomplete head (it came in pieces) or one that does not parse: hyper reads it and
    // answers as it does any request.
    let Head::Complete(mut parts, len) = parse_head(&buf[..n]) else { return First::Http };
    // The head is in the socket's buffer (it was just peeked): read exactly it.
    match tcp.try_read(&mut buf[..len]) {
        Ok(got) if got == len => {
            // Routed as any request: with the peer, as hyper's requests carry it.
            parts.extensions.insert(Peer(peer));
            First::Owned(parts)
        }
        _ => First::Gone,
    }
}

/// A request head parsed from the start of a buffer.
pub(crate) enum Head {
    /// The request and the length of its head.
    Complete(Box<Parts>, usize),
    /// More bytes are needed.
    Partial,
    /// Not a request this module reads (malformed, a header it cannot carry): hyper's.
    Other,
}

/// Parses the request head at the start of `buf` by the parser hyper itself uses, so a
/// request served here is read by the same rules as any other.
pub(crate) fn parse_head(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => match parts_of(&req) {
            Some(parts) => Head::Complete(Box::new(parts), len),
            None => Head::Other,
        },
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => Head::Partial,
        _ => Head::Other,
    }
}

/// The request's parts, with no extensions: the polls of a kept-alive connection pass their
/// peer along themselves rather than allocate an extension map for each.
fn parts_of(req: &httparse::Request<'_, '_>) -> Option<Parts> {
    // Only `GET` heads are read here; HTTP/1.0 and its keep-alive rules are hyper's.
    if req.method? != "GET" || req.version? != 1 {
        return None;
    }
    let (mut parts, ()) = axum::http::Request::new(()).into_parts();
    parts.method = Method::GET;
    parts.uri = req.path?.parse().ok()?;
    parts.headers.reserve(req.headers.len());
    for h in req.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
        parts.headers.append(name, HeaderValue::from_bytes(h.value).ok()?);
    }
    Some(parts)
}

/// Offered to the routes by a request served here: a route that serves what follows on the
/// socket leaves it in `taken`.
#[derive(Clone)]
pub(crate) struct SocketOffer {
    pub(crate) wire: Arc<TcpStream>,
    pub(crate) taken: Arc<parking_lot::Mutex<Option<OnSocket>>>,
}

/// Runs an event stream once its head is written (`None`: the head could not be written, and
/// the stream only ends).
pub(crate) type StreamRun = Box<dyn FnOnce(Option<Arc<TcpStream>>) -> BoxFuture<'static, ()> + Send>;

/// Serves a kept-alive connection once the answer is written: the socket, the node's routes
/// (for hyper, should another kind of request come) and the peer.
pub(crate) type KeepAliveRun = Box<dyn FnOnce(Arc<TcpStream>, Router, SocketAddr) -> BoxFuture<'static, ()> + Send>;

/// What a route serves on an offered socket after its answer.
pub(crate) enum OnSocket {
    /// An event stream: the head only, then the stream writes the socket to its end.
    Stream(StreamRun),
    /// A whole answer, and the connection stays open for the next request.
    KeepAlive(KeepAliveRun),
}

/// Serves the request `parts` on `tcp` through `app` — the node's routes and middleware, as
/// any request — and then what the route left on the socket.
pub async fn serve(node: Arc<Node>, app: Router, tcp: TcpStream, peer: SocketAddr, parts: Box<Parts>) {
    // Boxed: the request's routing and answer need a large future, but only until the answer
    // is out; what follows keeps just its own small state.
    let Some((tcp, on)) = Box::pin(answer(&node, app.clone(), tcp, parts)).await else {
        return;
    };
    match on {
        OnSocket::Stream(run) => run(Some(tcp)).await,
        OnSocket::KeepAlive(run) => run(tcp, app, peer).await,
    }
}

/// Routes the request and writes the answer; returns what the route left on the socket once
/// the answer is out. Any other answer is written whole and the client let go.
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
    let request = app.oneshot(Request::from_parts(parts, Body::empty()));
    // A client that leaves while its request is held (a long poll) ends the request.
    let response = tokio::select! {
        r = request => match r {
            Ok(r) => r,
            Err(never) => match never {},
        },
        () = client_gone(&tcp) => None?,
    };
    let taken = offer.taken.lock().take();
    drop(offer);
    let ending = match &taken {
        Some(OnSocket::Stream(_)) => Ending::Stream,
        Some(OnSocket::KeepAlive(_)) => Ending::KeepAlive,
        None => Ending::Close,
    };
    let timeout = Duration::from_secs(node.config.limits.handshake_timeout_s);
    let sent = match response_bytes(response, ending).await {
        Some(bytes) => tokio::time::timeout(timeout, write_all(&tcp, &bytes)).await.is_ok_and(|r| r.is_ok()),
        None => false,
    };
    match taken {
        Some(on) if sent => Some((tcp, on)),
        Some(OnSocket::Stream(run)) => {
            run(None).await;
            None
        }
        Some(OnSocket::KeepAlive(_)) => None,
        None => {
            if sent {
                linger(&tcp, tokio::time::Instant::now() + CLOSE_GRACE).await;
            }
            None
        }
    }
}

/// How a response written here ends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// An event stream: the head, then events until the connection closes.
    Stream,
    /// A whole answer on a connection that closes after it.
    Close,
    /// A whole answer on a connection that stays open.
    KeepAlive,
}

/// The bytes of `r` as `ending` says (an event stream's: its head only).
pub(crate) async fn response_bytes(r: Response, ending: Ending) -> Option<Vec<u8>> {
    let (parts, body) = r.into_parts();
    let mut out = head_lines(&parts);
    if ending == Ending::Stream {
        end_head(&mut out, ending, None);
        return Some(out);
    }
    let body = axum::body::to_bytes(body, 1 << 20).await.ok()?;
    end_head(&mut out, ending, Some(body.len()));
    out.extend_from_slice(&body);
    Some(out)
}

/// A response's status line and header lines, but for those [`end_head`] writes.
pub(crate) fn head_lines(parts: &axum::http::response::Parts) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let status = parts.status;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        // The length is set by `end_head` (a stream's is where the connection ends).
        if name == axum::http::header::CONTENT_LENGTH
            || name == axum::http::header::TRANSFER_ENCODING
            || name == axum::http::header::CONNECTION
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Ends a head: its `date`, `connection: close` unless the connection stays open, and the
/// length of a whole answer's body (`None`: a stream's head).
pub(crate) fn end_head(out: &mut Vec<u8>, ending: Ending, body_len: Option<usize>) {
    write_date(out);
    if ending != Ending::KeepAlive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    if let Some(n) = body_len {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends the `date` line for now. Its text changes once a second, so each thread formats
/// it once a second and copies it otherwise (a held poll's answer carries one).
fn write_date(out: &mut Vec<u8>) {
    thread_local! {
        static DATE: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let now = std::time::SystemTime::now();
    let second = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, line)| {
        if *at != second {
            *line = format!("date: {}\r\n", httpdate::HttpDate::from(now));
            *at = second;
        }
        out.extend_from_slice(line.as_bytes());
    });
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

/// Completes when the client has closed or reset the connection. Bytes it sends meanwhile (a
/// pipelined request) are left in the socket for whoever reads the next request.
pub(crate) async fn client_gone(tcp: &TcpStream) {
    let mut one = [0u8; 1];
    match tcp.peek(&mut one).await {
        Ok(0) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}

/// What [`next_request`] found.
pub(crate) enum Next<T> {
    /// A request `pick` took, its head taken from `pending`, and what `pick` made of it.
    Request(T),
    /// A request `pick` did not take, or bytes that are no request this module reads: left
    /// in `pending`, whole.
    Other,
    /// The client closed the connection, or sent nothing in time.
    Gone,
}

/// What [`next_request`] shows `pick` of a request head.
pub(crate) enum Seen<'a> {
    /// The head parsed whole, with its header lines as sent (from the end of the request line
    /// to the empty line that ends the head, included).
    Parsed(Box<Parts>, &'a [u8]),
    /// A `GET … HTTP/1.1` whose header lines are byte for byte the `same` lines given: its
    /// request target (path and query) only.
    Same(&'a str),
}

/// Reads the next request head on a kept-alive connection into `pending` (which may already
/// hold it), waiting at most `idle` for it to start and then `timeout` for it to be complete;
/// takes it if `pick` does. The parts carry no extensions (no `Peer`).
///
/// `same`: the header lines of a request the caller took before on this connection (empty:
/// none). A client sends the same headers request after request; a head that repeats them is
/// not parsed again ([`repeat_of`]), and `pick` sees only its target.
pub(crate) async fn next_request<T>(
    tcp: &TcpStream,
    pending: &mut Vec<u8>,
    idle: Duration,
    timeout: Duration,
    same: &[u8],
    pick: impl Fn(Seen<'_>) -> Option<T>,
) -> Next<T> {
    let mut deadline = tokio::time::Instant::now() + idle;
    let mut started = false;
    loop {
        if let Some((target, len)) = repeat_of(pending, same) {
            let Some(picked) = pick(Seen::Same(target)) else { return Next::Other };
            take_head(pending, len);
            return Next::Request(picked);
        }
        if !pending.is_empty() {
            match parse_head(pending) {
                Head::Complete(parts, len) => {
                    let lines = pending[..len].iter().position(|&b| b == b'\n').map_or(len, |at| at + 1);
                    let Some(picked) = pick(Seen::Parsed(parts, &pending[lines..len])) else { return Next::Other };
                    take_head(pending, len);
                    return Next::Request(picked);
                }
                Head::Partial if !started => {
                    started = true;
                    deadline = tokio::time::Instant::now() + timeout;
                }
                Head::Partial => {}
                Head::Other => return Next::Other,
            }
        }
        match tokio::time::timeout_at(deadline, tcp.readable()).await {
            Ok(Ok(())) => {}
            _ => return Next::Gone,
        }
        match read_some(tcp, pending) {
            Ok(0) => return Next::Gone,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Next::Gone,
        }
    }
}

/// Removes a request head of `len` bytes from the start of `pending`.
pub(crate) fn take_head(pending: &mut Vec<u8>, len: usize) {
    pending.drain(..len);
    if pending.is_empty() {
        // An idle connection keeps no buffer.
        *pending = Vec::new();
    }
}

/// The target and length of the head at the start of `buf` if it is `GET {target} HTTP/1.1`
/// followed by the header lines `same`, byte for byte. The target is held to a part of the
/// grammar that the full parse (`parse_head`, then the URI's) accepts, so that such a head reads
/// as the full parse would read it: it starts with `/`, and has only letters, digits and
/// ``!$%&'()*+,-./:;=?@_~``.
pub(crate) fn repeat_of<'a>(buf: &'a [u8], same: &[u8]) -> Option<(&'a str, usize)> {
    const GET: &[u8] = b"GET ";
    const VERSION: &[u8] = b" HTTP/1.1\r\n";
    if same.is_empty() || !buf.starts_with(GET) {
        return None;
    }
    let line = buf.iter().position(|&b| b == b'\n')? + 1;
    let target = buf[..line].strip_prefix(GET)?.strip_suffix(VERSION)?;
    let fits = |b: &u8| matches!(b, b'!' | b'$'..=b';' | b'=' | b'?'..=b'Z' | b'_' | b'a'..=b'z' | b'~');
    if !target.starts_with(b"/") || !target.iter().all(fits) || !buf[line..].starts_with(same) {
        return None;
    }
    Some((std::str::from_utf8(target).ok()?, line + same.len()))
}

/// Appends what the socket has to `pending`, through a buffer on the stack so that a
/// connection holds only the bytes it has. A read shorter than the buffer took all there was,
/// so the socket's readiness is cleared with it, as Tokio's own `poll_read` does: the next
/// wait for input sleeps at once instead of making a read that finds nothing (bytes that come
/// later raise a new readiness event).
pub(crate) fn read_some(tcp: &TcpStream, pending: &mut Vec<u8>) -> io::Result<usize> {
    use std::io::Read;
    let mut buf = [0u8; 4096];
    let mut got = 0;
    let r = tcp.try_io(tokio::io::Interest::READABLE, || {
        got = (&*socket2::SockRef::from(tcp)).read(&mut buf)?;
        if got > 0 && got < buf.len() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(got)
    });
    match r {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => {}
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    pending.extend_from_slice(&buf[..got]);
    Ok(got)
}

/// Serves a connection with hyper (HTTP/1.1 with upgrades), every request carrying `peer`.
pub async fn serve_http<I>(io: I, app: Router, peer: SocketAddr, timeout: Duration)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = app.map_request(move |mut req: Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(Peer(peer));
        req
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc))
        .with_upgrades();
    let _ = conn.await;
}

/// A connection handed to hyper with the bytes already read off it, which hyper reads first.
pub(crate) struct Rewind {
    read: Vec<u8>,
    at: usize,
    tcp: TcpStream,
}

impl Rewind {
    pub(crate) fn new(read: Vec<u8>, tcp: TcpStream) -> Rewind {
        Rewind { read, at: 0, tcp }
    }
}

impl AsyncRead for Rewind {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.at < self.read.len() {
            let n = buf.remaining().min(self.read.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.read[at..at + n]);
            self.at += n;
            if self.at == self.read.len() {
                self.read = Vec::new();
                self.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: &[u8] = b"Host: 127.0.0.1\r\nOrigin: http://a.example\r\n\r\n";

    #[test]
    fn a_head_that_repeats_the_header_lines_is_read_by_its_request_line() {
        let mut buf = b"GET /poll/abc?ack=7&timeout=2.5 HTTP/1.1\r\n".to_vec();
        buf.extend_from_slice(LINES);
        let len = buf.len();
        buf.extend_from_slice(b"GET /poll/abc?ack=8 HTTP/1.1\r\n");
        assert_eq!(repeat_of(&buf, LINES), Some(("/poll/abc?ack=7&timeout=2.5", len)));
        // The full parse reads the same target and the same length.
        let Head::Complete(parts, parsed) = parse_head(&buf) else { panic!("not parsed") };
        assert_eq!((parts.uri.path_and_query().unwrap().as_str(), parsed), ("/poll/abc?ack=7&timeout=2.5", len));
    }

    #[test]
    fn any_other_head_is_parsed_whole() {
        let head = |line: &str, lines: &[u8]| [line.as_bytes(), lines].concat();
        let cases = [
            head("GET /poll/abc HTTP/1.1\r\n", b"Host: 127.0.0.1\r\nOrigin: http://b.example\r\n\r\n"),
            head("GET /poll/abc HTTP/1.1\r\n", b"Host: 127.0.0.1\r\n"),
            head("GET /poll/abc HTTP/1.1\r\n", b"Host: 127.0.0.1\r\nOrigin: http://a.example\r\nX: y\r\n\r\n"),
            head("POST /poll/abc HTTP/1.1\r\n", LINES),
            head("GET /poll/abc HTTP/1.0\r\n", LINES),
            head("GET /poll/a{b} HTTP/1.1\r\n", LINES),
            head("GET /poll/a\"b HTTP/1.1\r\n", LINES),
            head("GET poll/abc HTTP/1.1\r\n", LINES),
            head("GET /poll/abc  HTTP/1.1\r\n", LINES),
            head("GET /poll/abc HTTP/1.1\n", LINES),
        ];
        for case in cases {
            assert_eq!(repeat_of(&case, LINES), None, "{}", String::from_utf8_lossy(&case));
        }
        assert_eq!(repeat_of(b"GET /poll/abc HTTP/1.1\r\n\r\n", b""), None, "no lines to repeat");
    }
}
