//! The byte stream under a client's WebSocket ([`Wire`]): it counts the bytes read and written
//! ([`WireStats`], what the bench reports per delivery), and, when the handshake offered
//! permessage-deflate ([`CLIENT_OFFER`]), inflates the server's compressed messages before the
//! WebSocket layer reads them.
//!
//! [`CLIENT_OFFER`]: switchboard_protocol::websocket::deflate::CLIENT_OFFER
//!
//! tokio-tungstenite has no permessage-deflate, and fails a frame with RSV1 set. So [`Wire`]
//! reads the server's bytes first: it finds the end of the handshake's response and judges its
//! `Sec-WebSocket-Extensions` ([`accepted`]); once the server accepted, it parses each server
//! frame ([`parse_header`]) and hands a compressed message on as one plain frame of its
//! inflated payload ([`inflate`], bounded by [`MAX_MESSAGE`]). Every other frame, control
//! frames included, goes on byte for byte, for the WebSocket layer to judge. The server
//! agreed to `server_no_context_takeover`, so each message inflates on its own and a
//! connection keeps no LZ77 window (the inflater is the protocol crate's, one per thread).
//! What the client sends is never compressed (RFC 7692 §6 lets any message go uncompressed):
//! its messages are commands, a few hundred bytes.
//!
//! A server that breaks RFC 7692 (an answer the offer does not allow, RSV1 on a continuation,
//! a new message inside a compressed one, data that does not inflate) fails the read with
//! [`io::ErrorKind::InvalidData`].

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};

use switchboard_protocol::websocket::deflate::{accepted, inflate, InflateError};
use switchboard_protocol::websocket::{encode_header, parse_header, Opcode, MAX_HEADER};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::tls::MaybeTls;

/// The largest message a compressed frame may inflate to: tungstenite's default message limit.
pub const MAX_MESSAGE: usize = 64 << 20;

/// The longest handshake response read before giving up on it.
const MAX_RESPONSE_HEAD: usize = 64 << 10;

/// What has crossed a connection, shared with whoever watches it (the bench).
#[derive(Debug, Default)]
pub struct WireStats {
    /// Bytes read from the socket (TLS: the decrypted bytes), the handshake included.
    pub read: AtomicU64,
    /// Bytes written to the socket.
    pub written: AtomicU64,
    /// The server accepted permessage-deflate.
    pub deflate: AtomicBool,
}

/// A client connection's byte stream: counted, and inflating when permessage-deflate was
/// offered and accepted.
pub struct Wire {
    inner: MaybeTls,
    stats: Arc<WireStats>,
    // Boxed: a connection that did not offer the extension carries one pointer of it.
    inflating: Option<Box<Inflating>>,
}

impl Wire {
    /// `inner` before the handshake; `offered` when the handshake request carries
    /// [`CLIENT_OFFER`](switchboard_protocol::websocket::deflate::CLIENT_OFFER).
    pub fn new(inner: MaybeTls, offered: bool) -> Wire {
        let inflating = offered.then(|| Box::new(Inflating::default()));
        Wire { inner, stats: Arc::default(), inflating }
    }

    pub fn stats(&self) -> &Arc<WireStats> {
        &self.stats
    }
}

/// Where the server's bytes are.
#[derive(Default, PartialEq, Eq)]
enum Phase {
    /// Before the end of the handshake's response.
    #[default]
    Response,
    /// permessage-deflate accepted: frames are read.
    Frames,
    /// Nothing to inflate (declined, or an answer that was not 101): bytes go on as read.
    Through,
}

#[derive(Default)]
struct Inflating {
    phase: Phase,
    /// Read and not handed on yet: the response head, or a frame not complete.
    raw: Vec<u8>,
    /// Ready for the WebSocket layer, from `out_pos`.
    out: Vec<u8>,
    out_pos: usize,
    /// The opcode and the payload so far of a fragmented compressed message.
    message: Option<(Opcode, Vec<u8>)>,
    eof: bool,
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

impl Inflating {
    /// Moves what `raw` holds complete onto `out`, inflated where compressed.
    fn process(&mut self, stats: &WireStats) -> io::Result<()> {
        if self.phase == Phase::Response {
            let Some(end) = self.raw.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4) else {
                if self.raw.len() > MAX_RESPONSE_HEAD {
                    return Err(invalid("handshake response head too long"));
                }
                return Ok(());
            };
            self.phase = judge_response(&self.raw[..end])?;
            stats.deflate.store(self.phase == Phase::Frames, Relaxed);
            self.out.extend_from_slice(&self.raw[..end]);
            self.raw.drain(..end);
        }
        if self.phase == Phase::Through {
            self.out.append(&mut self.raw);
            return Ok(());
        }
        let mut at = 0;
        while let Some(len) = self.frame(at)? {
            at += len;
        }
        self.raw.drain(..at);
        Ok(())
    }

    /// Hands on the frame at `raw[at..]` if it is complete: its length in `raw`.
    fn frame(&mut self, at: usize) -> io::Result<Option<usize>> {
        let buf = &self.raw[at..];
        let h = match parse_header(buf, MAX_MESSAGE, false) {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(None),
            // RSV2/RSV3, an unknown opcode, a bad control frame: the WebSocket layer fails
            // the connection on them itself.
            Err(_) => {
                self.out.extend_from_slice(buf);
                self.phase = Phase::Through;
                return Ok(Some(buf.len()));
            }
        };
        let len = h.header_len + h.payload_len;
        if buf.len() < len {
            return Ok(None);
        }
        let payload = &buf[h.header_len..len];
        match (h.opcode, h.compressed, &mut self.message) {
            (Opcode::Close | Opcode::Ping | Opcode::Pong, _, _) => self.out.extend_from_slice(&buf[..len]),
            (Opcode::Text | Opcode::Binary, true, None) if h.fin => {
                let message = inflate_message(payload)?;
                emit(&mut self.out, h.opcode, &message);
            }
            (Opcode::Text | Opcode::Binary, true, None) => self.message = Some((h.opcode, payload.to_vec())),
            (Opcode::Continuation, false, Some((op, joined))) => {
                if joined.len() + payload.len() > MAX_MESSAGE {
                    return Err(invalid("compressed message past the limit"));
                }
                joined.extend_from_slice(payload);
                if h.fin {
                    let message = inflate_message(joined)?;
                    emit(&mut self.out, *op, &message);
                    self.message = None;
                }
            }
            (_, false, None) => self.out.extend_from_slice(&buf[..len]),
            (Opcode::Continuation, true, _) => return Err(invalid("RSV1 on a continuation frame")),
            (_, _, Some(_)) => return Err(invalid("a new message before the compressed one ended")),
        }
        Ok(Some(len))
    }
}

/// The response head's verdict: frames to read when the server accepted the offer.
fn judge_response(head: &[u8]) -> io::Result<Phase> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(invalid("malformed handshake response")),
    }
    if response.code != Some(101) {
        return Ok(Phase::Through);
    }
    let values = response
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("sec-websocket-extensions"))
        .map(|h| std::str::from_utf8(h.value).map_err(|_| invalid("Sec-WebSocket-Extensions is not text")))
        .collect::<io::Result<Vec<&str>>>()?;
    match accepted(values) {
        Ok(true) => Ok(Phase::Frames),
        Ok(false) => Ok(Phase::Through),
        Err(why) => Err(invalid(format!("the server's permessage-deflate answer: {why}"))),
    }
}

fn inflate_message(compressed: &[u8]) -> io::Result<Vec<u8>> {
    inflate(compressed, MAX_MESSAGE).map_err(|e| match e {
        InflateError::TooLarge => invalid("compressed message inflates past the limit"),
        InflateError::Invalid => invalid("compressed message is not valid DEFLATE data"),
    })
}

/// Appends one unfragmented, uncompressed frame of `payload`.
fn emit(out: &mut Vec<u8>, opcode: Opcode, payload: &[u8]) {
    let mut header = [0u8; MAX_HEADER];
    let n = encode_header(opcode, payload.len(), &mut header);
    out.extend_from_slice(&header[..n]);
    out.extend_from_slice(payload);
}

impl AsyncRead for Wire {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(inf) = this.inflating.as_deref_mut() else {
            let before = buf.filled().len();
            let read = Pin::new(&mut this.inner).poll_read(cx, buf);
            this.stats.read.fetch_add((buf.filled().len() - before) as u64, Relaxed);
            return read;
        };
        loop {
            if inf.out_pos < inf.out.len() {
                let n = (inf.out.len() - inf.out_pos).min(buf.remaining());
                buf.put_slice(&inf.out[inf.out_pos..inf.out_pos + n]);
                inf.out_pos += n;
                if inf.out_pos == inf.out.len() {
                    inf.out.clear();
                    inf.out_pos = 0;
                    // A large message's buffer is not kept for the connection's life.
                    if inf.out.capacity() > 64 << 10 {
                        inf.out = Vec::new();
                    }
                }
                return Poll::Ready(Ok(()));
            }
            if inf.eof {
                // What was left of a frame goes on, for the WebSocket layer to see it cut.
                if !inf.raw.is_empty() {
                    inf.out.append(&mut inf.raw);
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let got = read.filled();
            this.stats.read.fetch_add(got.len() as u64, Relaxed);
            if got.is_empty() {
                inf.eof = true;
                continue;
            }
            inf.raw.extend_from_slice(got);
            inf.process(&this.stats)?;
        }
    }
}

impl AsyncWrite for Wire {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.stats.written.fetch_add(n as u64, Relaxed);
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written {
            this.stats.written.fetch_add(n as u64, Relaxed);
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
