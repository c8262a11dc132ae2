//! RFC 6455 framing, the parts a server needs: parsing (masked) client frames and encoding
//! (unmasked) server frames.
//!
//! Server frames carry no mask, so one encoded frame — header and payload — is byte-identical
//! for every recipient. The gateway builds it once per publication and hands the same bytes to
//! every connection; that is why framing lives here rather than behind a per-connection
//! WebSocket object.

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
    /// Bytes of header, including the mask key.
    pub header_len: usize,
    pub payload_len: usize,
}

/// Why a client frame is unacceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("reserved bits set without a negotiated extension")]
    ReservedBits,
    #[error("unknown opcode {0}")]
    BadOpcode(u8),
    #[error("client frame is not masked")]
    Unmasked,
    #[error("control frame longer than 125 bytes or fragmented")]
    BadControl,
    /// The payload exceeds the configured maximum (close 1009).
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(u64),
}

/// Parses the header at the start of `buf`. `Ok(None)` means more bytes are needed (the cheap
/// "incomplete" outcome, not a failure).
pub fn parse_header(buf: &[u8], max_payload: usize, require_mask: bool) -> Result<Option<FrameHeader>, FrameError> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let b0 = buf[0];
    let b1 = buf[1];
    if b0 & 0x70 != 0 {
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
    Ok(Some(FrameHeader { fin, opcode, mask, header_len: pos, payload_len: len as usize }))
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
        assert_eq!(parse_header(&[0xC1, 0x80, 0, 0, 0, 0], 100, true), Err(FrameError::ReservedBits));
        assert_eq!(parse_header(&[0x83, 0x80, 0, 0, 0, 0], 100, true), Err(FrameError::BadOpcode(3)));
        assert_eq!(parse_header(&[0x09, 0x80, 0, 0, 0, 0], 100, true), Err(FrameError::BadControl));
        let big = encode_client_frame(Opcode::Text, &[0; 200], [0; 4]);
        assert_eq!(parse_header(&big, 100, true), Err(FrameError::TooLarge(200)));
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
