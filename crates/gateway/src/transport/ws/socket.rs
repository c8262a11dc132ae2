//! What a WebSocket connection does with its socket, the same for `/ws` and for the echo
//! server (`crate::echo`): the socket taken out of hyper after the upgrade (plain TCP or
//! TLS), its frames read ([`FrameReader`], judged by
//! [`MessageReader`](switchboard_protocol::websocket::MessageReader)), and its closing
//! ([`finish`]).
//!
//! A violation of RFC 6455 fails the connection with the close code the protocol crate gives
//! it (1002, 1007, 1009) and nothing else: the events read before it are still answered, and
//! nothing the client sends after it is read. On a connection that negotiated
//! permessage-deflate the reader inflates compressed messages (RFC 7692), within the same
//! message limit.

use std::io;
use std::sync::Arc;
use std::time::SystemTime;

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use switchboard_protocol::websocket::{Event, FrameError, MessageReader};
use tokio::net::TcpStream;

use crate::outbox::{Outbox, Wire};
use crate::transport::owned::{linger, CLOSE_GRACE};
use crate::transport::tls::TlsWire;

/// A connection's socket: plain TCP, or TCP under a TLS session.
#[derive(Clone)]
pub enum Socket {
    Plain(Arc<TcpStream>),
    Tls(Arc<TlsWire>),
}

/// Takes the socket out of hyper after an upgrade, with the bytes that came after the
/// handshake (copied out of hyper's read buffer, usually none, so that buffer is freed here).
/// `None` for a connection that is neither TCP nor TLS over TCP.
pub fn take(upgraded: Upgraded) -> Option<(Socket, Vec<u8>)> {
    match upgraded.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => Some((Socket::Plain(Arc::new(parts.io.into_inner())), parts.read_buf.to_vec())),
        Err(u) => match u.downcast::<TokioIo<tokio_rustls::server::TlsStream<TcpStream>>>() {
            Ok(parts) => {
                let (tcp, session) = parts.io.into_inner().into_inner();
                Some((Socket::Tls(Arc::new(TlsWire::new(tcp, session))), parts.read_buf.to_vec()))
            }
            Err(_) => None,
        },
    }
}

impl Socket {
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Socket::Plain(s) => s,
            Socket::Tls(t) => t.tcp(),
        }
    }

    pub fn wire(&self) -> Arc<dyn Wire> {
        match self {
            Socket::Plain(s) => s.clone(),
            Socket::Tls(t) => t.clone(),
        }
    }

    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Plain(s) => s.try_read(buf),
            Socket::Tls(t) => t.read_plain(buf),
        }
    }

    /// Decrypted bytes are waiting: read without waiting for the socket.
    pub fn buffered(&self) -> bool {
        matches!(self, Socket::Tls(t) if t.has_buffered())
    }

    /// Encrypted records wait for the socket.
    pub fn tls_pending(&self) -> bool {
        matches!(self, Socket::Tls(t) if t.wants_write())
    }

    pub fn flush_tls(&self) -> io::Result<()> {
        match self {
            Socket::Plain(_) => Ok(()),
            Socket::Tls(t) => t.flush(),
        }
    }

    pub async fn tls_notified(&self) {
        match self {
            Socket::Plain(_) => std::future::pending().await,
            Socket::Tls(t) => t.notified().await,
        }
    }
}

/// Why reading stopped.
pub enum ReadError {
    /// The client closed the connection.
    Eof,
    /// The socket failed.
    Io,
    /// The client broke RFC 6455: fail the connection with [`FrameError::close_code`].
    Frame(FrameError),
}

impl ReadError {
    /// Closes `outbox` as the end of reading asks: a violation fails the connection with its
    /// close code and nothing else; a client gone gets the bare close frame, if it still reads.
    pub fn close(self, outbox: &Outbox) {
        match self {
            ReadError::Frame(e) => outbox.fail_connection(e.close_code(), &e.to_string()),
            ReadError::Eof | ReadError::Io => outbox.close_echo(&[]),
        }
    }
}

/// Answers the client's close frame with its own code (RFC 6455 §5.5.1; an empty close frame
/// for an empty one).
pub fn answer_close(outbox: &Outbox, code: Option<u16>) {
    let echo = code.map(u16::to_be_bytes);
    outbox.close_echo(echo.as_ref().map_or(&[][..], |c| &c[..]));
}

/// Reads a connection's frames as they arrive. Reads land in a stack buffer; between reads
/// only the frame in progress is kept (an idle connection holds no buffer).
pub struct FrameReader {
    frames: MessageReader,
    /// When the message now in progress (a partial frame or fragments) started. A client that
    /// trickles a message byte by byte is closed once it has taken too long (slowloris on an
    /// open WebSocket); the connection decides how long.
    pub started: Option<SystemTime>,
}

impl FrameReader {
    /// A reader of messages up to `max_message` bytes (fragments joined, and inflated when
    /// compressed); `deflate`: the connection negotiated permessage-deflate.
    pub fn new(max_message: usize, deflate: bool) -> FrameReader {
        FrameReader { frames: MessageReader::new(max_message).with_deflate(deflate), started: None }
    }

    /// Reads what the socket has without blocking and pushes the complete events onto `out`.
    /// Returns the bytes read (0: nothing was waiting). On an error, the events pushed before
    /// it are still to be answered.
    pub fn read(&mut self, socket: &Socket, out: &mut Vec<Event>) -> Result<usize, ReadError> {
        let mut buf = [0u8; 8192];
        let n = match socket.try_read(&mut buf) {
            Ok(0) => return Err(ReadError::Eof),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(_) => return Err(ReadError::Io),
        };
        self.feed(&buf[..n], out)?;
        Ok(n)
    }

    /// Reads bytes already taken off the socket (those that came with the handshake).
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<Event>) -> Result<(), ReadError> {
        let fed = self.frames.feed(data, out);
        match (self.frames.in_progress(), self.started) {
            (true, None) => self.started = Some(SystemTime::now()),
            (false, Some(_)) => self.started = None,
            _ => {}
        }
        fed.map_err(ReadError::Frame)
    }
}

/// Writes out the closing frames (waiting for writability), half-closes, and waits briefly
/// for the peer to close so the last frames are not lost to a reset.
pub async fn finish(socket: &Socket, outbox: &Outbox) {
    let stream = socket.tcp();
    let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
    while !outbox.finished() || socket.tls_pending() {
        tokio::select! {
            r = stream.writable() => {
                if r.is_err() {
                    return;
                }
                match socket.flush_tls() {
                    Ok(()) => outbox.flush_blocked(),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    // The peer is gone: the socket stays writable and nothing more goes out, so
                    // waiting would spin this task (and stall its worker) until the grace ends.
                    Err(_) => return,
                }
            }
            _ = outbox.notified() => {}
            _ = socket.tls_notified() => {}
            _ = tokio::time::sleep_until(deadline) => return,
        }
    }
    if let Socket::Tls(t) = socket {
        t.close_notify();
        let _ = t.flush();
    }
    linger(stream, deadline).await;
}
