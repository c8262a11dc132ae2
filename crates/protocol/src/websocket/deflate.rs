//! permessage-deflate (RFC 7692) without per-connection state: the negotiation ([`offer`]),
//! one message deflated for a peer's window ([`deflate_frame`]) and one message inflated within
//! the message limit ([`inflate`]).
//!
//! Every connection that negotiates the extension agrees to `server_no_context_takeover` and
//! `client_no_context_takeover` ([`offer::Agreed`]), so each message is compressed and
//! decompressed on its own. Nothing of the LZ77 window outlives a message: a connection holds
//! no compressor or decompressor (zlib's are 10–300 KiB each), and one compressed publication
//! is byte-identical for every subscriber with the same window, so the gateway compresses it
//! once. The (de)compressors are kept per thread ([`thread_local!`]) and reset before each
//! message: at most one decompressor and one compressor per window size per thread that used
//! them (docs/operations.md, "Compression").
//!
//! The codec is zlib (flate2 over zlib-rs): RFC 7692 lets a client ask for a server window of
//! 8 to 15 bits, and zlib's deflate takes 9 to 15. For 8 bits the message is compressed with a
//! 9-bit window and a full flush every 256 bytes, after which zlib refers to nothing before the
//! flush: no back-reference reaches further than 255 bytes, which a 256-byte window reads.

use std::cell::RefCell;

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::{encode_header, Opcode, MAX_HEADER};

pub mod offer;

pub use offer::{accepted, negotiate, Agreed, CLIENT_OFFER};

/// The smallest and the largest LZ77 window (bits) of RFC 7692 §7.1.2.
pub const MIN_WINDOW_BITS: u8 = 8;
pub const MAX_WINDOW_BITS: u8 = 15;

/// zlib's compression level: 1, the fastest. On JSON of 1 to 4 KiB it writes 20–60 % more bytes
/// than level 6 (1 KiB: 219 B against 180) in a third to a quarter of its time (6–7 µs against
/// 16–27; docs/benchmarks.md, "WebSocket compression"): the node compresses on the fan-out's
/// thread, where time is every subscriber's latency.
pub const LEVEL: u32 = 1;

/// What every sync-flushed message ends with; RFC 7692 §7.2.1 removes it on the wire and
/// §7.2.2 puts it back before inflating.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// A window of 8 bits is compressed with 9 and a full flush after every this many bytes.
const SMALL_WINDOW_CHUNK: usize = 1 << MIN_WINDOW_BITS;

thread_local! {
    /// Raw-deflate compressors by window bits − 9 (9..=15), made on first use.
    static COMPRESSORS: RefCell<[Option<Compress>; 7]> =
        const { RefCell::new([None, None, None, None, None, None, None]) };
    /// A raw-inflate decompressor with the largest window, which reads any window a client uses.
    static DECOMPRESSOR: RefCell<Option<Decompress>> = const { RefCell::new(None) };
}

/// A complete compressed server frame (RSV1 set) holding `payload` as one message of type
/// `opcode`, deflated for a peer whose window is `window` bits (8..=15); with the length of its
/// header. It may be longer than the message framed as it is (incompressible data): the caller
/// decides which to send (RFC 7692 §6 allows any message uncompressed). `None` if the
/// compressor failed.
pub fn deflate_frame(opcode: Opcode, payload: &[u8], window: u8) -> Option<(Bytes, usize)> {
    let window = window.clamp(MIN_WINDOW_BITS, MAX_WINDOW_BITS);
    // The header goes in front once the compressed length is known: room for the longest.
    let mut out = Vec::with_capacity(MAX_HEADER + payload.len() / 2 + 64);
    out.resize(MAX_HEADER, 0);
    let compressed = COMPRESSORS.with(|slots| {
        let mut slots = slots.borrow_mut();
        let bits = window.max(MIN_WINDOW_BITS + 1);
        let c = slots[usize::from(bits - 9)]
            .get_or_insert_with(|| Compress::new_with_window_bits(Compression::new(LEVEL), false, bits));
        c.reset();
        if window == MIN_WINDOW_BITS {
            payload.chunks(SMALL_WINDOW_CHUNK).try_for_each(|chunk| compress(c, chunk, &mut out, FlushCompress::Full))
        } else {
            compress(c, payload, &mut out, FlushCompress::Sync)
        }
    });
    if compressed.is_err() || !out.ends_with(&TAIL) {
        return None;
    }
    out.truncate(out.len() - TAIL.len());
    let len = out.len() - MAX_HEADER;
    let mut h = [0u8; MAX_HEADER];
    let n = encode_header(opcode, len, &mut h);
    h[0] |= RSV1;
    out[MAX_HEADER - n..MAX_HEADER].copy_from_slice(&h[..n]);
    Some((Bytes::from(out).slice(MAX_HEADER - n..), n))
}

/// The RSV1 bit of a frame's first byte: "Per-Message Compressed" (RFC 7692 §6).
pub const RSV1: u8 = 0x40;

/// Compresses all of `input` onto `out` and flushes with `flush`, growing `out` as needed.
fn compress(c: &mut Compress, input: &[u8], out: &mut Vec<u8>, flush: FlushCompress) -> Result<(), ()> {
    let start = c.total_in();
    loop {
        if out.len() == out.capacity() {
            out.reserve(out.capacity().max(256));
        }
        let taken = (c.total_in() - start) as usize;
        c.compress_vec(&input[taken..], out, flush).map_err(drop)?;
        // Done once every byte is taken and the flush left room: zlib had nothing more to write.
        if (c.total_in() - start) as usize == input.len() && out.len() < out.capacity() {
            return Ok(());
        }
    }
}

/// Why a compressed message could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateError {
    /// It inflates to more than the limit (close 1009).
    TooLarge,
    /// It is not valid DEFLATE data (close 1007).
    Invalid,
}

/// Inflates one message's payload (RFC 7692 §7.2.2: the tail appended, raw inflate) into at
/// most `max` bytes: a message that would inflate past it stops there (a few bytes of a
/// "deflate bomb" never become gigabytes). Whatever follows a final block is ignored.
pub fn inflate(compressed: &[u8], max: usize) -> Result<Vec<u8>, InflateError> {
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        let d = d.get_or_insert_with(|| Decompress::new(false));
        d.reset(false);
        // Text compresses about 4:1; the buffer grows from there, never past the limit.
        let mut out = Vec::with_capacity(compressed.len().saturating_mul(4).max(64).min(max.saturating_add(1)));
        for input in [compressed, &TAIL[..]] {
            if inflate_into(d, input, &mut out, max)? == Status::StreamEnd {
                break;
            }
        }
        Ok(out)
    })
}

/// Inflates all of `input` onto `out` (at most `max` bytes in all); `StreamEnd` after a final
/// block.
fn inflate_into(d: &mut Decompress, input: &[u8], out: &mut Vec<u8>, max: usize) -> Result<Status, InflateError> {
    let start = d.total_in();
    loop {
        if out.len() == out.capacity() {
            if out.len() > max {
                return Err(InflateError::TooLarge);
            }
            // One byte past the limit tells a message that is too large from one that fits.
            let room = out.capacity().max(4096).min(max + 1 - out.len());
            out.reserve_exact(room);
        }
        let before = (d.total_in(), out.len());
        let status = d.decompress_vec(&input[(d.total_in() - start) as usize..], out, FlushDecompress::None);
        let status = status.map_err(|_| InflateError::Invalid)?;
        if out.len() > max {
            return Err(InflateError::TooLarge);
        }
        let taken = (d.total_in() - start) as usize;
        match status {
            Status::StreamEnd => return Ok(Status::StreamEnd),
            _ if taken == input.len() && out.len() < out.capacity() => return Ok(status),
            // Neither input taken nor output made with room for both: the data is stuck.
            _ if before == (d.total_in(), out.len()) && out.len() < out.capacity() => {
                return Err(InflateError::Invalid)
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(len: usize) -> Vec<u8> {
        let mut s = String::from("[");
        let mut i = 0;
        while s.len() < len {
            s.push_str(&format!(
                r#"{{"ch":"pt:plant1.boiler{}.temp","v":{}.{},"q":"good","t":17000000{:05}}},"#,
                i % 7,
                20 + i % 13,
                i % 10,
                i
            ));
            i += 1;
        }
        s.truncate(len);
        s.into_bytes()
    }

    /// The payload of a compressed frame, inflated as a client would.
    fn read(frame: &[u8], header: usize) -> Vec<u8> {
        assert_eq!(frame[0] & 0xf0, 0x80 | RSV1, "FIN and RSV1");
        inflate(&frame[header..], 1 << 24).unwrap()
    }

    #[test]
    fn deflate_round_trips_every_window() {
        for len in [200, 1000, 4096, 70_000] {
            let payload = json(len);
            for window in MIN_WINDOW_BITS..=MAX_WINDOW_BITS {
                let (frame, header) = deflate_frame(Opcode::Text, &payload, window).expect("JSON compresses");
                assert!(frame.len() < payload.len(), "{len} bytes, window {window}");
                assert_eq!(frame[0] & 0x0f, 1, "a text frame");
                assert_eq!(read(&frame, header), payload, "{len} bytes, window {window}");
            }
        }
    }

    #[test]
    fn deflate_frames_incompressible_messages_all_the_same() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let noise: Vec<u8> = (0..300)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let (frame, header) = deflate_frame(Opcode::Binary, &noise, 15).unwrap();
        assert!(frame.len() > noise.len() + 2, "{} bytes", frame.len());
        assert_eq!(read(&frame, header), noise);
        let (empty, header) = deflate_frame(Opcode::Text, b"", 15).unwrap();
        assert_eq!((&empty[..], header), (&[0xc1, 0x01, 0x00][..], 2), "an empty stored block");
    }

    #[test]
    fn deflate_messages_are_independent_and_alike_for_every_recipient() {
        // No context takeover: the same message compresses to the same bytes whatever came
        // before it on the thread.
        let a = deflate_frame(Opcode::Text, &json(1000), 15).unwrap();
        deflate_frame(Opcode::Text, &json(3000), 15).unwrap();
        assert_eq!(deflate_frame(Opcode::Text, &json(1000), 15).unwrap(), a);
    }

    #[test]
    fn deflate_inflate_stops_at_the_limit() {
        let big = vec![b'a'; 1 << 20];
        let (frame, header) = deflate_frame(Opcode::Text, &big, 15).unwrap();
        assert!(frame.len() < 20_000, "a megabyte of one byte compresses to {} bytes", frame.len());
        assert_eq!(inflate(&frame[header..], (1 << 20) - 1), Err(InflateError::TooLarge));
        assert_eq!(inflate(&frame[header..], 1 << 20).map(|v| v.len()), Ok(1 << 20));
        assert_eq!(inflate(&frame[header..], 0), Err(InflateError::TooLarge));
    }

    #[test]
    fn deflate_inflate_refuses_invalid_data_and_takes_a_final_block() {
        // BTYPE 11 is reserved.
        assert_eq!(inflate(&[0xff, 0xff, 0xff], 1000), Err(InflateError::Invalid));
        // A stored block whose length and its complement disagree.
        assert_eq!(inflate(&[0x00, 0x05, 0x00, 0x00, 0x00, b'x'], 1000), Err(InflateError::Invalid));
        // "Hello" as one final fixed-Huffman block (BFINAL = 1), as some clients send it.
        assert_eq!(inflate(&[0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00], 1000), Ok(b"Hello".to_vec()));
        // The same without BFINAL, the tail removed (RFC 7692 §7.2.3.1).
        assert_eq!(inflate(&[0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00], 1000), Ok(b"Hello".to_vec()));
        // An empty message compressed: an empty stored block.
        assert_eq!(inflate(&[0x00], 1000), Ok(Vec::new()));
        // A decompressor that failed is reset for the next message.
        assert_eq!(inflate(&[0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00], 5), Ok(b"Hello".to_vec()));
    }

    /// Compressed size and time of JSON documents, plain vs deflate, by level and window.
    /// `cargo test --release -p switchboard-protocol --lib deflate_measure -- --ignored --nocapture`
    #[test]
    #[ignore = "benchmark: run by hand, see the doc comment"]
    fn deflate_measure() {
        let docs = |len: usize| -> Vec<Vec<u8>> {
            (0..64)
                .map(|k| {
                    let mut d = json(len + 64 * k);
                    d.truncate(len);
                    d
                })
                .collect()
        };
        println!(
            "{:>6} {:>5} {:>6} {:>9} {:>7} {:>9} {:>9}",
            "bytes", "level", "window", "deflated", "ratio", "µs/msg", "MB/s"
        );
        for len in [100usize, 200, 300, 1024, 4096, 16384] {
            let set = docs(len);
            for (level, window) in [(1u32, 15u8), (2, 15), (3, 15), (4, 15), (6, 15), (9, 15), (LEVEL, 9), (LEVEL, 12)]
            {
                let mut c = Compress::new_with_window_bits(Compression::new(level), false, window);
                let mut size = 0;
                let rounds = (2_000_000 / len).max(200);
                let t = std::time::Instant::now();
                for r in 0..rounds {
                    let doc = &set[r % set.len()];
                    let mut out = Vec::with_capacity(doc.len() + 64);
                    c.reset();
                    compress(&mut c, doc, &mut out, FlushCompress::Sync).unwrap();
                    if r < set.len() {
                        size += out.len() - TAIL.len();
                    }
                }
                let per = t.elapsed().as_secs_f64() / rounds as f64;
                let size = size as f64 / set.len() as f64;
                println!(
                    "{len:>6} {level:>5} {window:>6} {size:>9.0} {:>7.2} {:>9.2} {:>9.0}",
                    size / len as f64,
                    per * 1e6,
                    len as f64 / per / 1e6
                );
            }
            let frame = deflate_frame(Opcode::Text, &set[0], 15).unwrap();
            let rounds = (2_000_000 / len).max(200);
            let t = std::time::Instant::now();
            for _ in 0..rounds {
                inflate(&frame.0[frame.1..], 1 << 20).unwrap();
            }
            println!("{len:>6} inflate {:>38.2} µs/msg", t.elapsed().as_secs_f64() / rounds as f64 * 1e6);
        }
    }
}

#[cfg(test)]
mod reader_tests {
    //! permessage-deflate in [`MessageReader`]: compressed messages inflated, RSV1 judged.
    use super::*;
    use crate::websocket::{encode_client_frame, Event, FrameError, MessageReader};

    const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    /// A client's compressed message (`payload` deflated) cut into frames of `pieces` bytes of
    /// compressed data, RSV1 on the first.
    fn compressed(opcode: Opcode, payload: &[u8], pieces: usize) -> Vec<u8> {
        let (frame, header) = deflate_frame(opcode, payload, 15).expect("compresses");
        let data = &frame[header..];
        let chunks: Vec<&[u8]> = data.chunks(pieces.max(1)).collect();
        let mut out = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let op = if i == 0 { opcode } else { Opcode::Continuation };
            let mut f = encode_client_frame(op, chunk, MASK);
            if i == 0 {
                f[0] |= RSV1;
            }
            if i + 1 < chunks.len() {
                f[0] &= 0x7f;
            }
            out.extend_from_slice(&f);
        }
        out
    }

    fn feed(stream: &[u8], max: usize, deflate: bool) -> (Vec<Event>, Result<(), FrameError>) {
        let mut r = MessageReader::new(max).with_deflate(deflate);
        let mut out = Vec::new();
        let res = r.feed(stream, &mut out);
        (out, res)
    }

    #[test]
    fn websocket_deflate_reader_inflates_compressed_messages_between_plain_ones() {
        let text = "κόσμε, a compressed message ".repeat(40);
        let stream = [
            encode_client_frame(Opcode::Text, b"plain", MASK),
            compressed(Opcode::Text, text.as_bytes(), 7),
            encode_client_frame(Opcode::Ping, b"p", MASK),
            compressed(Opcode::Binary, &[7u8; 5000], 1000),
        ]
        .concat();
        let expected = vec![
            Event::Message(Opcode::Text, b"plain".to_vec()),
            Event::Message(Opcode::Text, text.clone().into_bytes()),
            Event::Ping(b"p".to_vec()),
            Event::Message(Opcode::Binary, vec![7u8; 5000]),
        ];
        assert_eq!(feed(&stream, 1 << 20, true), (expected.clone(), Ok(())));
        for step in [1, 3, 100] {
            let mut r = MessageReader::new(1 << 20).with_deflate(true);
            let mut out = Vec::new();
            for piece in stream.chunks(step) {
                r.feed(piece, &mut out).unwrap();
            }
            assert_eq!(out, expected, "reads of {step} bytes");
        }
    }

    #[test]
    fn websocket_deflate_reader_refuses_rsv1_where_the_rfc_does() {
        let message = compressed(Opcode::Text, "hello hello hello hello".as_bytes(), 1000);
        assert_eq!(feed(&message, 1000, false).1, Err(FrameError::ReservedBits), "not negotiated");
        let mut continuation = encode_client_frame(Opcode::Text, b"a", MASK);
        continuation[0] &= 0x7f;
        let mut second = encode_client_frame(Opcode::Continuation, b"b", MASK);
        second[0] |= RSV1;
        continuation.extend_from_slice(&second);
        assert_eq!(feed(&continuation, 1000, true).1, Err(FrameError::ReservedBits), "on a continuation");
        let mut ping = encode_client_frame(Opcode::Ping, b"", MASK);
        ping[0] |= RSV1;
        assert_eq!(feed(&ping, 1000, true).1, Err(FrameError::ReservedBits), "on a control frame");
        assert_eq!(FrameError::ReservedBits.close_code(), 1002);
    }

    #[test]
    fn websocket_deflate_reader_bounds_inflation_and_judges_the_result() {
        // 64 KiB of zeros compress to a few hundred bytes: past a 10 KB limit once inflated.
        let bomb = compressed(Opcode::Binary, &[0u8; 65536], 1000);
        assert!(bomb.len() < 1000);
        assert_eq!(feed(&bomb, 10_000, true), (vec![], Err(FrameError::InflatedTooLarge)));
        assert_eq!(FrameError::InflatedTooLarge.close_code(), 1009);
        assert_eq!(feed(&bomb, 65536, true).0.len(), 1);
        let mut garbage = encode_client_frame(Opcode::Text, &[0xff, 0xff, 0xff], MASK);
        garbage[0] |= RSV1;
        assert_eq!(feed(&garbage, 1000, true).1, Err(FrameError::BadDeflate));
        assert_eq!(FrameError::BadDeflate.close_code(), 1007);
        let bad_text =
            compressed(Opcode::Text, &[b'a', b'b', 0xed, 0xa0, 0x80, b'a', b'b', b'a', b'b', b'a', b'b'].repeat(8), 5);
        assert_eq!(feed(&bad_text, 1000, true).1, Err(FrameError::InvalidText));
    }
}
