//! A client's byte stream read by the gateway's WebSocket message reader (RFC 6455): frames,
//! fragments, control frames between them, close payloads and the UTF-8 of text messages; on a
//! connection that negotiated permessage-deflate (RFC 7692), compressed messages inflated. The
//! reader must never panic, never give a message past its limit (inflated ones included) or a
//! text message that is not UTF-8, and must read the same stream the same way however the
//! reads cut it: the same events and the same verdict whole or in pieces.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_protocol::websocket::{Event, MessageReader, Opcode};

/// Feeds `stream` in pieces of the given sizes (cycled; all at once when empty) until the end
/// or the first violation; the events and the verdict.
fn read(max: usize, deflate: bool, stream: &[u8], cuts: &[u8]) -> (Vec<Event>, Result<(), String>) {
    let mut reader = MessageReader::new(max).with_deflate(deflate);
    let mut events = Vec::new();
    let mut pos = 0;
    let mut i = 0;
    while pos < stream.len() {
        let n = match cuts.get(i % cuts.len().max(1)) {
            Some(&c) if !cuts.is_empty() => usize::from(c).max(1),
            _ => stream.len(),
        };
        i += 1;
        let end = (pos + n).min(stream.len());
        if let Err(e) = reader.feed(&stream[pos..end], &mut events) {
            return (events, Err(format!("{e:?}")));
        }
        pos = end;
        if matches!(events.last(), Some(Event::Close(_))) {
            break;
        }
    }
    (events, Ok(()))
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    // The first two bytes choose the message limit, the third how many bytes after the
    // stream are read sizes (its low four bits) and whether permessage-deflate was negotiated.
    let max = usize::from(u16::from_le_bytes([data[0], data[1]])) + 1;
    let deflate = data[2] & 0x10 != 0;
    let cut_bytes = usize::from(data[2] % 16).min(data.len() - 3);
    let (stream, cuts) = data[3..].split_at(data.len() - 3 - cut_bytes);
    let whole = read(max, deflate, stream, &[]);
    for e in &whole.0 {
        if let Event::Message(op, bytes) = e {
            assert!(bytes.len() <= max, "a message past the limit");
            assert!(matches!(op, Opcode::Text | Opcode::Binary));
            if *op == Opcode::Text {
                assert!(std::str::from_utf8(bytes).is_ok(), "a text message that is not UTF-8");
            }
        }
        if let Event::Ping(p) = e {
            assert!(p.len() <= 125, "a ping longer than a control frame");
        }
    }
    let pieces = read(max, deflate, stream, cuts);
    assert_eq!(whole, pieces, "the same stream read whole and in pieces");
});
