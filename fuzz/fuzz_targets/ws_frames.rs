//! WebSocket frame headers of client frames (RFC 6455): a stream of frames is parsed the way
//! the gateway's connection task does it — header, bounds, unmasking — and must never panic,
//! overflow or accept more than the limit. Client-encoded frames must parse back exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_protocol::websocket::{encode_client_frame, parse_header, unmask, Opcode};

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    // The first two bytes choose the size limit, like `limits.max_frame_bytes`.
    let max = usize::from(u16::from_le_bytes([data[0], data[1]])) + 1;
    let mut buf = data[2..].to_vec();
    let mut pos = 0usize;
    while pos < buf.len() {
        let h = match parse_header(&buf[pos..], max, true) {
            Ok(Some(h)) => h,
            Ok(None) | Err(_) => break,
        };
        assert!(h.payload_len <= max, "a header past the limit must be refused");
        assert!((2..=14).contains(&h.header_len));
        assert!(h.mask.is_some(), "unmasked client frames must be refused");
        if h.opcode.is_control() {
            assert!(h.fin && h.payload_len <= 125, "control frames are short and whole");
        }
        let Some(end) = pos.checked_add(h.header_len).and_then(|p| p.checked_add(h.payload_len)) else {
            panic!("frame bounds overflow");
        };
        if end > buf.len() {
            break; // incomplete: the reader keeps it for the next read
        }
        let mask = h.mask.unwrap_or([0; 4]);
        // Unmasking in two pieces (a split read) equals unmasking at once.
        let body = &mut buf[pos + h.header_len..end];
        let mut whole = body.to_vec();
        unmask(&mut whole, mask, 0);
        let cut = body.len() / 3;
        let (a, b) = body.split_at_mut(cut);
        unmask(a, mask, 0);
        unmask(b, mask, cut);
        assert_eq!(&whole[..], &buf[pos + h.header_len..end]);
        pos = end;
    }
    // Round trip through the client encoder.
    let payload = &data[2..data.len().min(2 + 70_000)];
    let frame = encode_client_frame(Opcode::Binary, payload, [data[0], data[1], 0x5a, 0xa5]);
    let h = parse_header(&frame, 1 << 20, true).expect("own frame parses").expect("own frame is complete");
    assert_eq!(h.opcode, Opcode::Binary);
    assert_eq!(h.header_len + h.payload_len, frame.len());
    let mut body = frame[h.header_len..].to_vec();
    unmask(&mut body, h.mask.expect("client frames are masked"), 0);
    assert_eq!(&body[..], payload);
});
