//! RFC 6455 framing, the parts a server needs: reading client frames ([`MessageReader`]:
//! headers, masks, fragments, control frames, close payloads and the UTF-8 of text messages,
//! each judged by the standard) and encoding (unmasked) server frames.
//!
//! Server frames carry no mask, so one encoded frame — header and payload — is byte-identical
//! for every recipient. The gateway builds it once per publication and hands the same bytes to
//! every connection; that is why framing lives here rather than behind a per-connection
//! WebSocket object.
//!
//! A client that breaks the standard gets a [`FrameError`]; its
//! [`close_code`](FrameError::close_code) (1002, 1007 or 1009) fails the connection.
//!
//! On a connection that negotiated permessage-deflate (RFC 7692; [`MessageReader::with_deflate`]),
//! RSV1 on the first frame of a data message marks it compressed: the reader joins its
//! fragments, inflates them within the message limit ([`deflate::inflate`]) and then
//! checks the UTF-8 of a text message. RSV1 anywhere else, or without the extension, is a
//! violation like the other reserved bits.

use crate::code::close;

pub mod deflate;

/// Frame opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    Continuation,
    Text,
    Binary,
    Close,
    Ping,
    Pong,
}

impl Opcode {
    fn from_bits(b: u8) -> Option<Opcode> {
        Some(match b {
            0 => Opcode::Continuation,
            1 => Opcode::Text,
            2 => Opcode::Binary,
            8 => Opcode::Close,
            9 => Opcode::Ping,
            10 => Opcode::Pong,
            _ => return None,
        })
    }

    fn bits(self) -> u8 {
        match self {
            Opcode::Continuation => 0,
            Opcode::Text => 1,
            Opcode::Binary => 2,
            Opcode::Close => 8,
            Opcode::Ping => 9,
            Opcode::Pong => 10,
        }
    }

    pub fn is_control(self) -> bool {
        matches!(self, Opcode::Close | Opcode::Ping | Opcode::Pong)
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub fin: bool,
    pub opcode: Opcode,
    pub mask: Option<[u8; 4]>,
    /// RSV1: with permessage-deflate, the first frame of a compressed message.
    pub compressed: bool,
    /// Bytes of header, including the mask key.
    pub header_len: usize,
    pub payload_len: usize,
}

/// Why a client frame is unacceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("reserved bits set without a negotiated extension")]
    ReservedBits,
    /// A compressed message that inflates past the limit (close 1009).
    #[error("compressed message inflates past the limit")]
    InflatedTooLarge,
    /// A compressed message that is not valid DEFLATE data (close 1007).
    #[error("compressed message is not valid DEFLATE data")]
    BadDeflate,
    #[error("unknown opcode {0}")]
    BadOpcode(u8),
    #[error("client frame is not masked")]
    Unmasked,
    #[error("control frame longer than 125 bytes or fragmented")]
    BadControl,
    /// The payload exceeds the configured maximum (close 1009).
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(u64),
    #[error("continuation frame without a message to continue")]
    UnexpectedContinuation,
    #[error("new message before the fragmented one ended")]
    UnfinishedMessage,
    #[error("close frame with a 1-byte payload")]
    BadClosePayload,
    #[error("close code {0} is not one a peer may send")]
    BadCloseCode(u16),
    /// A text message that is not UTF-8, found as soon as its bytes cannot start valid UTF-8
    /// (close 1007).
    #[error("text message is not valid UTF-8")]
    InvalidText,
    /// A close reason that is not UTF-8 (close 1007).
    #[error("close reason is not valid UTF-8")]
    InvalidCloseReason,
}

impl FrameError {
    /// The code that fails the connection (RFC 6455 §7.4.1): 1009 for a message past the
    /// limit (compressed or inflated), 1007 for invalid UTF-8 or invalid DEFLATE data (a
    /// payload inconsistent with its message, as other permessage-deflate servers answer it),
    /// 1002 for anything else.
    pub fn close_code(&self) -> u16 {
        match self {
            FrameError::TooLarge(_) | FrameError::InflatedTooLarge => close::MESSAGE_TOO_BIG,
            FrameError::InvalidText | FrameError::InvalidCloseReason | FrameError::BadDeflate => close::INVALID_PAYLOAD,
            _ => close::RFC_PROTOCOL_ERROR,
        }
    }
}

/// Parses the header at the start of `buf`. `Ok(None)` means more bytes are needed (the cheap
/// "incomplete" outcome, not a failure). RSV2 and RSV3 are refused (no extension defines
/// them here); RSV1 is reported as [`FrameHeader::compressed`] for the reader to judge.
pub fn parse_header(buf: &[u8], max_payload: usize, require_mask: bool) -> Result<Option<FrameHeader>, FrameError> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let b0 = buf[0];
    let b1 = buf[1];
    if b0 & 0x30 != 0 {
        return Err(FrameError::ReservedBits);
    }
    let opcode = Opcode::from_bits(b0 & 0x0f).ok_or(FrameError::BadOpcode(b0 & 0x0f))?;
    let fin = b0 & 0x80 != 0;
    let masked = b1 & 0x80 != 0;
    if require_mask && !masked {
        return Err(FrameError::Unmasked);
    }
    let len7 = b1 & 0x7f;
    if opcode.is_control() && (len7 > 125 || !fin) {
        return Err(FrameError::BadControl);
    }
    let (len, mut pos) = match len7 {
        126 => {
            if buf.len() < 4 {
                return Ok(None);
            }
            (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4)
        }
        127 => {
            if buf.len() < 10 {
                return Ok(None);
            }
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            (u64::from_be_bytes(b), 10)
        }
        n => (u64::from(n), 2),
    };
    if len > max_payload as u64 {
        return Err(FrameError::TooLarge(len));
    }
    let mask = if masked {
        if buf.len() < pos + 4 {
            return Ok(None);
        }
        let m = [buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]];
        pos += 4;
        Some(m)
    } else {
        None
    };
    let compressed = b0 & deflate::RSV1 != 0;
    Ok(Some(FrameHeader { fin, opcode, mask, compressed, header_len: pos, payload_len: len as usize }))
}

/// XORs `payload` with the mask key; `offset` is the payload position of `payload[0]`.
pub fn unmask(payload: &mut [u8], mask: [u8; 4], offset: usize) {
    let mut key = [0u8; 8];
    for (i, k) in key.iter_mut().enumerate() {
        *k = mask[(offset + i) % 4];
    }
    let key64 = u64::from_ne_bytes(key);
    let mut chunks = payload.chunks_exact_mut(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        c.copy_from_slice(&(u64::from_ne_bytes(w) ^ key64).to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= key[i % 8];
    }
}

/// Longest server frame header.
pub const MAX_HEADER: usize = 10;

/// Writes an unmasked frame header for `len` payload bytes; returns the header bytes used.
pub fn encode_header(opcode: Opcode, len: usize, out: &mut [u8; MAX_HEADER]) -> usize {
    out[0] = 0x80 | opcode.bits();
    if len < 126 {
        out[1] = len as u8;
        2
    } else if len <= usize::from(u16::MAX) {
        out[1] = 126;
        out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        4
    } else {
        out[1] = 127;
        out[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    }
}

/// A complete unmasked frame.
pub fn encode_frame(opcode: Opcode, payload: &[u8]) -> Vec<u8> {
    let mut h = [0u8; MAX_HEADER];
    let n = encode_header(opcode, payload.len(), &mut h);
    let mut out = Vec::with_capacity(n + payload.len());
    out.extend_from_slice(&h[..n]);
    out.extend_from_slice(payload);
    out
}

/// A close frame with a status code and a reason (truncated to fit a control frame).
pub fn encode_close(code: u16, reason: &str) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    let mut r = reason;
    while r.len() > 123 {
        let mut cut = 123;
        while !r.is_char_boundary(cut) {
            cut -= 1;
        }
        r = &r[..cut];
    }
    payload.extend_from_slice(r.as_bytes());
    encode_frame(Opcode::Close, &payload)
}

/// A masked client frame (used by test and bench clients that speak raw frames).
pub fn encode_client_frame(opcode: Opcode, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut h = [0u8; MAX_HEADER];
    let n = encode_header(opcode, payload.len(), &mut h);
    h[1] |= 0x80;
    let mut out = Vec::with_capacity(n + 4 + payload.len());
    out.extend_from_slice(&h[..n]);
    out.extend_from_slice(&mask);
    let start = out.len();
    out.extend_from_slice(payload);
    unmask(&mut out[start..], mask, 0);
    out
}

/// Reads a close frame's payload (RFC 6455 §5.5.1, §7.4): none, or a code a peer may send
/// ([`close::sendable`]) and a UTF-8 reason.
pub fn parse_close(payload: &[u8]) -> Result<Option<(u16, &str)>, FrameError> {
    match payload {
        [] => Ok(None),
        [_] => Err(FrameError::BadClosePayload),
        [a, b, reason @ ..] => {
            let code = u16::from_be_bytes([*a, *b]);
            if !close::sendable(code) {
                return Err(FrameError::BadCloseCode(code));
            }
            let reason = std::str::from_utf8(reason).map_err(|_| FrameError::InvalidCloseReason)?;
            Ok(Some((code, reason)))
        }
    }
}

/// What a client's frames amount to ([`MessageReader::feed`]). Pongs need no answer and make
/// no event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A whole text or binary message, its fragments joined; a text message is valid UTF-8.
    Message(Opcode, Vec<u8>),
    /// A ping, answered with a pong that carries the same payload.
    Ping(Vec<u8>),
    /// The client's close frame, its payload checked: the code it gave, if any. Nothing the
    /// client sends after it is read.
    Close(Option<u16>),
}

/// The longest client frame header: 2 bytes, 8 of extended length, 4 of mask.
const MAX_CLIENT_HEADER: usize = 14;

/// Capacity reserved for a data frame when its header arrives: its whole payload when it is
/// small, otherwise the buffer grows as bytes come (a header alone does not hold megabytes).
const RESERVE: usize = 64 * 1024;

/// A frame whose payload is arriving.
#[derive(Debug, Clone, Copy)]
struct Arriving {
    header: FrameHeader,
    received: usize,
}

/// Reads the frames of a client (masked, as a server receives them) from bytes in pieces of
/// any size, as reads return them, and judges them by RFC 6455: headers and their bounds,
/// masks, fragments in order, control frames between fragments, close payloads, and the UTF-8
/// of text messages. UTF-8 fails fast: as soon as the bytes received cannot begin valid UTF-8,
/// not at the end of the message (a compressed message: once inflated). Between calls it keeps
/// only the frame in progress: at most a partial header, and the message being assembled
/// (bounded by `max`, compressed and inflated alike).
#[derive(Debug)]
pub struct MessageReader {
    /// Largest message, fragments joined (close 1009 past it).
    max: usize,
    /// A header not complete yet.
    head: [u8; MAX_CLIENT_HEADER],
    head_len: u8,
    frame: Option<Arriving>,
    /// The opcode of the data message in progress (none between messages) and its bytes.
    message: Option<Opcode>,
    bytes: Vec<u8>,
    /// How many of `bytes` are known to begin valid UTF-8 (text messages).
    valid: usize,
    /// The payload of the control frame in progress (at most 125 bytes).
    control: Vec<u8>,
    /// A close frame or a violation was read: nothing more is.
    done: bool,
    /// permessage-deflate was negotiated: RSV1 marks a compressed message.
    deflate: bool,
    /// The message in progress is compressed (its first frame had RSV1).
    compressed: bool,
}

impl MessageReader {
    pub fn new(max_message: usize) -> MessageReader {
        MessageReader {
            max: max_message,
            head: [0; MAX_CLIENT_HEADER],
            head_len: 0,
            frame: None,
            message: None,
            bytes: Vec::new(),
            valid: 0,
            control: Vec::new(),
            done: false,
            deflate: false,
            compressed: false,
        }
    }

    /// A reader for a connection that negotiated permessage-deflate (`negotiated`), which
    /// takes compressed messages and inflates them.
    pub fn with_deflate(mut self, negotiated: bool) -> MessageReader {
        self.deflate = negotiated;
        self
    }

    /// Whether a frame or a fragmented message is partly received.
    pub fn in_progress(&self) -> bool {
        self.head_len > 0 || self.frame.is_some() || self.message.is_some()
    }

    /// Reads `data`, the next bytes from the client, and pushes the events it completes onto
    /// `out`, in order. An error fails the connection (close with
    /// [`FrameError::close_code`]); the events pushed before it came before the violation and
    /// are still answered. After an error or a close frame, nothing more is read.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<Event>) -> Result<(), FrameError> {
        let read = self.read(data, out);
        if read.is_err() {
            self.done = true;
        }
        read
    }

    fn read(&mut self, mut data: &[u8], out: &mut Vec<Event>) -> Result<(), FrameError> {
        while !self.done {
            let mut frame = match self.frame.take() {
                Some(f) => f,
                None => {
                    let Some(header) = self.header(&mut data)? else { return Ok(()) };
                    self.begin(&header)?;
                    Arriving { header, received: 0 }
                }
            };
            let take = (frame.header.payload_len - frame.received).min(data.len());
            let (chunk, rest) = data.split_at(take);
            data = rest;
            self.receive(&frame.header, frame.received, chunk)?;
            frame.received += take;
            if frame.received < frame.header.payload_len {
                // Every byte of `data` went into this frame.
                self.frame = Some(frame);
                return Ok(());
            }
            self.end(&frame.header, out)?;
        }
        Ok(())
    }

    /// The next frame header, from the bytes kept and `data` (advanced past it); `None` when
    /// it is not complete yet (its bytes are kept).
    fn header(&mut self, data: &mut &[u8]) -> Result<Option<FrameHeader>, FrameError> {
        if self.head_len == 0 {
            // Usually the whole header is in the read.
            if let Some(h) = parse_header(data, self.max, true)? {
                *data = &data[h.header_len..];
                return Ok(Some(h));
            }
        }
        let have = usize::from(self.head_len);
        let add = (MAX_CLIENT_HEADER - have).min(data.len());
        self.head[have..have + add].copy_from_slice(&data[..add]);
        match parse_header(&self.head[..have + add], self.max, true)? {
            // The kept bytes were not a whole header, so it takes some of `data`.
            Some(h) => {
                *data = &data[h.header_len - have..];
                self.head_len = 0;
                Ok(Some(h))
            }
            // Fewer bytes than the longest header: all of `data` was kept.
            None => {
                *data = &data[add..];
                self.head_len = (have + add) as u8;
                Ok(None)
            }
        }
    }

    /// Checks where a frame stands in the message sequence, before its payload is read.
    fn begin(&mut self, h: &FrameHeader) -> Result<(), FrameError> {
        // RSV1 belongs on the first frame of a data message, and only with the extension
        // (RFC 7692 §6.1: never on a continuation or a control frame).
        if h.compressed && !(self.deflate && matches!(h.opcode, Opcode::Text | Opcode::Binary)) {
            return Err(FrameError::ReservedBits);
        }
        match h.opcode {
            Opcode::Text | Opcode::Binary => {
                if self.message.is_some() {
                    return Err(FrameError::UnfinishedMessage);
                }
                self.message = Some(h.opcode);
                self.compressed = h.compressed;
                self.bytes = Vec::with_capacity(h.payload_len.min(RESERVE));
            }
            Opcode::Continuation => {
                if self.message.is_none() {
                    return Err(FrameError::UnexpectedContinuation);
                }
                let total = self.bytes.len() as u64 + h.payload_len as u64;
                if total > self.max as u64 {
                    return Err(FrameError::TooLarge(total));
                }
            }
            Opcode::Close | Opcode::Ping | Opcode::Pong => self.control = Vec::with_capacity(h.payload_len),
        }
        Ok(())
    }

    /// Takes the payload bytes `chunk`, which start at `offset` in the frame's payload.
    fn receive(&mut self, h: &FrameHeader, offset: usize, chunk: &[u8]) -> Result<(), FrameError> {
        let into = if h.opcode.is_control() { &mut self.control } else { &mut self.bytes };
        let start = into.len();
        into.extend_from_slice(chunk);
        if let Some(mask) = h.mask {
            unmask(&mut into[start..], mask, offset);
        }
        // A compressed message's UTF-8 is checked once inflated.
        if !h.opcode.is_control() && self.message == Some(Opcode::Text) && !self.compressed {
            self.check_text()?;
        }
        Ok(())
    }

    /// Fails as soon as the text received cannot begin valid UTF-8; a character cut at the
    /// end (by a frame or a read) waits for its next bytes.
    fn check_text(&mut self) -> Result<(), FrameError> {
        match std::str::from_utf8(&self.bytes[self.valid..]) {
            Ok(_) => self.valid = self.bytes.len(),
            // `error_len` is `None` only when the bytes left are a valid beginning of a character.
            Err(e) if e.error_len().is_none() => self.valid += e.valid_up_to(),
            Err(_) => return Err(FrameError::InvalidText),
        }
        Ok(())
    }

    /// A frame's payload is complete.
    fn end(&mut self, h: &FrameHeader, out: &mut Vec<Event>) -> Result<(), FrameError> {
        match h.opcode {
            Opcode::Ping => out.push(Event::Ping(std::mem::take(&mut self.control))),
            Opcode::Pong => self.control = Vec::new(),
            Opcode::Close => {
                let code = parse_close(&self.control)?.map(|(code, _)| code);
                self.control = Vec::new();
                self.done = true;
                out.push(Event::Close(code));
            }
            Opcode::Text | Opcode::Binary | Opcode::Continuation if h.fin => {
                // `begin` opened the message this frame ends.
                if let Some(opcode) = self.message.take() {
                    let mut bytes = std::mem::take(&mut self.bytes);
                    if std::mem::take(&mut self.compressed) {
                        bytes = deflate::inflate(&bytes, self.max).map_err(|e| match e {
                            deflate::InflateError::TooLarge => FrameError::InflatedTooLarge,
                            deflate::InflateError::Invalid => FrameError::BadDeflate,
                        })?;
                        if opcode == Opcode::Text && std::str::from_utf8(&bytes).is_err() {
                            return Err(FrameError::InvalidText);
                        }
                    } else if opcode == Opcode::Text && self.valid != bytes.len() {
                        return Err(FrameError::InvalidText);
                    }
                    self.valid = 0;
                    out.push(Event::Message(opcode, bytes));
                }
            }
            Opcode::Text | Opcode::Binary | Opcode::Continuation => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_round_trips_client_frames_of_every_length_class() {
        for len in [0usize, 5, 125, 126, 300, 65535, 65536, 70000] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let frame = encode_client_frame(Opcode::Binary, &payload, [1, 2, 3, 4]);
            let h = parse_header(&frame, 1 << 20, true).unwrap().unwrap();
            assert_eq!(h.payload_len, len);
            assert_eq!(h.opcode, Opcode::Binary);
            let mut body = frame[h.header_len..].to_vec();
            // Unmask in two uneven pieces, as a partial read would.
            let split = len / 3;
            let (a, b) = body.split_at_mut(split);
            unmask(a, h.mask.unwrap(), 0);
            unmask(b, h.mask.unwrap(), split);
            assert_eq!(body, payload);
        }
    }

    #[test]
    fn websocket_incomplete_headers_ask_for_more() {
        let frame = encode_client_frame(Opcode::Text, &[b'x'; 300], [9, 9, 9, 9]);
        for cut in 0..8 {
            assert_eq!(parse_header(&frame[..cut], 1 << 20, true), Ok(None), "cut {cut}");
        }
    }

    #[test]
    fn websocket_rejects_bad_frames() {
        let unmasked = encode_frame(Opcode::Text, b"hi");
        assert_eq!(parse_header(&unmasked, 100, true), Err(FrameError::Unmasked));
        assert_eq!(parse_header(&[0xA1, 0x80, 0, 0, 0, 0], 100, true), Err(FrameError::ReservedBits));
        assert_eq!(parse_header(&[0x91, 0x80, 0, 0, 0, 0], 100, true), Err(FrameError::ReservedBits));
        // RSV1 is the reader's to judge (permessage-deflate).
        assert!(parse_header(&[0xC1, 0x80, 0, 0, 0, 0], 100, true).unwrap().unwrap().compressed);
        assert_eq!(parse_header(&[0x83, 0x80, 0, 0, 0, 0], 100, true), Err(FrameError::BadOpcode(3)));
        assert_eq!(parse_header(&[0x09, 0x80, 0, 0, 0, 0], 100, true), Err(FrameError::BadControl));
        let big = encode_client_frame(Opcode::Text, &[0; 200], [0; 4]);
        assert_eq!(parse_header(&big, 100, true), Err(FrameError::TooLarge(200)));
    }

    /// A masked client frame; `fin: false` for a fragment that more frames follow.
    fn frame(opcode: Opcode, payload: &[u8], fin: bool) -> Vec<u8> {
        let mut f = encode_client_frame(opcode, payload, [0x37, 0xfa, 0x21, 0x3d]);
        if !fin {
            f[0] &= 0x7f;
        }
        f
    }

    fn feed_all(bytes: &[u8], max: usize) -> (Vec<Event>, Result<(), FrameError>) {
        let mut r = MessageReader::new(max);
        let mut out = Vec::new();
        let res = r.feed(bytes, &mut out);
        (out, res)
    }

    #[test]
    fn websocket_reader_gives_the_same_events_whatever_the_reads() {
        let text = "héllo wörld €😀".as_bytes();
        let cut = 8; // inside "ö"
        let stream = [
            frame(Opcode::Text, b"one", true),
            frame(Opcode::Binary, &[0, 255, 7], true),
            frame(Opcode::Text, &text[..cut], false),
            frame(Opcode::Ping, b"p", true),
            frame(Opcode::Continuation, &text[cut..], true),
            frame(Opcode::Pong, b"unsolicited", true),
            frame(Opcode::Text, b"", true),
            frame(Opcode::Binary, &vec![9u8; 70_000], true),
            frame(Opcode::Close, &[0x03, 0xe8, b'b', b'y', b'e'], true),
            frame(Opcode::Text, b"after the close", true),
        ]
        .concat();
        let expected = vec![
            Event::Message(Opcode::Text, b"one".to_vec()),
            Event::Message(Opcode::Binary, vec![0, 255, 7]),
            Event::Ping(b"p".to_vec()),
            Event::Message(Opcode::Text, text.to_vec()),
            Event::Message(Opcode::Text, Vec::new()),
            Event::Message(Opcode::Binary, vec![9u8; 70_000]),
            Event::Close(Some(1000)),
        ];
        assert_eq!(feed_all(&stream, 1 << 20), (expected.clone(), Ok(())));
        for step in [1, 2, 3, 7, 13, 1000] {
            let mut r = MessageReader::new(1 << 20);
            let mut out = Vec::new();
            for piece in stream.chunks(step) {
                r.feed(piece, &mut out).unwrap();
            }
            assert_eq!(out, expected, "reads of {step} bytes");
        }
    }

    #[test]
    fn websocket_reader_fails_invalid_utf8_at_the_first_bad_fragment() {
        let mut r = MessageReader::new(1 << 20);
        let mut out = Vec::new();
        r.feed(&frame(Opcode::Text, "κόσμε".as_bytes(), false), &mut out).unwrap();
        // 0xF4 0x90 can never begin a character (above U+10FFFF): the message is not finished,
        // and the fragment fails at once.
        let bad = frame(Opcode::Continuation, &[b'a', 0xf4, 0x90, 0x80, 0x80], false);
        assert_eq!(r.feed(&bad, &mut out), Err(FrameError::InvalidText));
        assert_eq!(FrameError::InvalidText.close_code(), 1007);
        assert!(out.is_empty());
        // Nothing more is read.
        assert_eq!(r.feed(&frame(Opcode::Ping, b"", true), &mut out), Ok(()));
        assert!(out.is_empty());
    }

    #[test]
    fn websocket_reader_fails_invalid_utf8_within_a_frame_before_its_end() {
        let payload = [b"valid text ".as_slice(), &[0xed, 0xa0, 0x80], &[b'x'; 200]].concat(); // a surrogate
        let f = frame(Opcode::Text, &payload, true);
        let mut r = MessageReader::new(1 << 20);
        let mut out = Vec::new();
        let head = 4; // 126-byte payload: 2 + 2 length bytes, then the mask
        r.feed(&f[..head + 4 + 11], &mut out).unwrap();
        assert_eq!(r.feed(&f[head + 4 + 11..head + 4 + 13], &mut out), Err(FrameError::InvalidText));
    }

    #[test]
    fn websocket_reader_checks_utf8_at_the_end_of_a_message() {
        // A character cut by the end of the message, and one cut between fragments that stays
        // cut at the end.
        let (_, r) = feed_all(&frame(Opcode::Text, &[b'a', 0xe2, 0x82], true), 100);
        assert_eq!(r, Err(FrameError::InvalidText));
        let s = [frame(Opcode::Text, &[0xe2], false), frame(Opcode::Continuation, &[0x82], true)].concat();
        assert_eq!(feed_all(&s, 100).1, Err(FrameError::InvalidText));
        // Binary messages are not text.
        let (out, r) = feed_all(&frame(Opcode::Binary, &[0xff, 0xfe], true), 100);
        assert_eq!((out, r), (vec![Event::Message(Opcode::Binary, vec![0xff, 0xfe])], Ok(())));
    }

    #[test]
    fn websocket_reader_keeps_the_events_before_a_violation() {
        let s = [frame(Opcode::Text, b"first", true), frame(Opcode::Ping, b"p", true), vec![0xa1, 0x80, 0, 0, 0, 0]]
            .concat();
        let (out, r) = feed_all(&s, 100);
        assert_eq!(out, vec![Event::Message(Opcode::Text, b"first".to_vec()), Event::Ping(b"p".to_vec())]);
        assert_eq!(r, Err(FrameError::ReservedBits));
        assert_eq!(FrameError::ReservedBits.close_code(), 1002);
    }

    #[test]
    fn websocket_reader_refuses_fragments_out_of_order() {
        assert_eq!(feed_all(&frame(Opcode::Continuation, b"x", true), 100).1, Err(FrameError::UnexpectedContinuation));
        let s = [frame(Opcode::Text, b"a", false), frame(Opcode::Text, b"b", true)].concat();
        assert_eq!(feed_all(&s, 100).1, Err(FrameError::UnfinishedMessage));
        let s = [frame(Opcode::Binary, b"a", false), frame(Opcode::Binary, b"b", true)].concat();
        assert_eq!(feed_all(&s, 100).1, Err(FrameError::UnfinishedMessage));
        // A fragmented ping (FIN clear) and a long one.
        assert_eq!(feed_all(&frame(Opcode::Ping, b"x", false), 100).1, Err(FrameError::BadControl));
        assert_eq!(feed_all(&frame(Opcode::Ping, &[0; 126], true), 1000).1, Err(FrameError::BadControl));
    }

    #[test]
    fn websocket_reader_bounds_the_message_not_only_the_frame() {
        let s = [frame(Opcode::Text, &[b'a'; 60], false), frame(Opcode::Continuation, &[b'a'; 60], true)].concat();
        let (out, r) = feed_all(&s, 100);
        assert_eq!((out, r), (vec![], Err(FrameError::TooLarge(120))));
        assert_eq!(FrameError::TooLarge(120).close_code(), 1009);
        let (out, r) = feed_all(&s, 120);
        assert_eq!((out.len(), r), (1, Ok(())));
    }

    #[test]
    fn websocket_close_payloads_are_judged_by_the_rfc() {
        assert_eq!(parse_close(&[]), Ok(None));
        assert_eq!(parse_close(&[0x03]), Err(FrameError::BadClosePayload));
        for code in [1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999]
        {
            assert_eq!(parse_close(&code.to_be_bytes()), Ok(Some((code, ""))), "{code}");
        }
        for code in [0u16, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535] {
            assert_eq!(parse_close(&code.to_be_bytes()), Err(FrameError::BadCloseCode(code)), "{code}");
        }
        assert_eq!(parse_close(&[0x03, 0xe8, b'o', b'k']), Ok(Some((1000, "ok"))));
        assert_eq!(parse_close(&[0x03, 0xe8, 0xce, 0xba, 0xe1]), Err(FrameError::InvalidCloseReason));
        assert_eq!(FrameError::InvalidCloseReason.close_code(), 1007);
        assert_eq!(FrameError::BadCloseCode(1005).close_code(), 1002);
        let (out, r) = feed_all(&frame(Opcode::Close, &[0x03], true), 100);
        assert_eq!((out, r), (vec![], Err(FrameError::BadClosePayload)));
        assert_eq!(feed_all(&frame(Opcode::Close, &[], true), 100), (vec![Event::Close(None)], Ok(())));
    }

    #[test]
    fn websocket_reader_holds_nothing_between_messages() {
        let mut r = MessageReader::new(1 << 20);
        let mut out = Vec::new();
        let f = frame(Opcode::Text, &[b'z'; 1000], true);
        r.feed(&f[..3], &mut out).unwrap();
        assert!(r.in_progress());
        r.feed(&f[3..], &mut out).unwrap();
        assert!(!r.in_progress());
        assert_eq!((r.bytes.capacity(), r.control.capacity()), (0, 0));
    }

    #[test]
    fn websocket_close_frame_carries_code_and_bounded_reason() {
        let f = encode_close(4008, &"x".repeat(500));
        let h = parse_header(&f, 1000, false).unwrap().unwrap();
        assert_eq!(h.opcode, Opcode::Close);
        assert_eq!(h.payload_len, 125);
        assert_eq!(&f[h.header_len..h.header_len + 2], &4008u16.to_be_bytes());
    }
}
