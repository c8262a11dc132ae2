//! [`Wire`] against a socket that writes chosen server bytes: what the WebSocket layer reads.

use switchboard_protocol::websocket::deflate::{deflate_frame, RSV1};
use switchboard_protocol::websocket::encode_frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

const ACCEPTED: &str = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
    Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover\r\n\r\n";
const DECLINED: &str = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";

/// What a [`Wire`] that `offered` reads when the server writes `chunks` (each flushed on its
/// own, a few bytes apart) and closes; with its stats.
async fn read_through(offered: bool, chunks: Vec<Vec<u8>>) -> (io::Result<Vec<u8>>, Arc<WireStats>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        for c in chunks {
            s.write_all(&c).await.unwrap();
            s.flush().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    });
    let mut wire = Wire::new(MaybeTls::Plain(TcpStream::connect(addr).await.unwrap()), offered);
    let mut got = Vec::new();
    let read = wire.read_to_end(&mut got).await.map(|_| got);
    server.await.unwrap();
    (read, wire.stats().clone())
}

fn document(i: usize) -> Vec<u8> {
    format!(r#"{{"pub":{{"ch":"pt:a","off":{i},"data":{{"v":{i},"unit":"degC","pad":"{}"}}}}}}"#, "x".repeat(600))
        .into_bytes()
}

fn compressed(opcode: Opcode, payload: &[u8]) -> Vec<u8> {
    deflate_frame(opcode, payload, 15).unwrap().0.to_vec()
}

/// A compressed message in two frames: the first with RSV1 and no FIN, then a continuation.
fn compressed_in_two(opcode: Opcode, payload: &[u8]) -> Vec<u8> {
    let (frame, header_len) = deflate_frame(opcode, payload, 15).unwrap();
    let body = &frame[header_len..];
    let (a, b) = body.split_at(body.len() / 2);
    let mut first = encode_frame(opcode, a);
    first[0] = (first[0] & !0x80) | RSV1;
    let mut last = encode_frame(Opcode::Continuation, b);
    last[0] |= 0x80;
    [first, last].concat()
}

#[tokio::test]
async fn wire_inflates_compressed_messages_and_hands_the_rest_on_unchanged() {
    let ping = encode_frame(Opcode::Ping, b"p");
    let plain = encode_frame(Opcode::Text, b"{\"pong\":{}}");
    let mut server = ACCEPTED.as_bytes().to_vec();
    server.extend(compressed(Opcode::Text, &document(1)));
    server.extend(&ping);
    server.extend(compressed_in_two(Opcode::Binary, &document(2)));
    server.extend(&plain);
    // The same bytes in pieces that cut headers and payloads anywhere.
    let pieces: Vec<Vec<u8>> = server.chunks(7).map(<[u8]>::to_vec).collect();
    let mut want = ACCEPTED.as_bytes().to_vec();
    want.extend(encode_frame(Opcode::Text, &document(1)));
    want.extend(&ping);
    want.extend(encode_frame(Opcode::Binary, &document(2)));
    want.extend(&plain);
    for chunks in [vec![server.clone()], pieces] {
        let (got, stats) = read_through(true, chunks).await;
        assert_eq!(got.unwrap(), want);
        assert!(stats.deflate.load(Relaxed));
        assert_eq!(stats.read.load(Relaxed), server.len() as u64, "the socket's bytes are counted, not the inflated");
    }
}

#[tokio::test]
async fn wire_passes_everything_on_when_compression_was_declined_or_not_offered() {
    let mut server = DECLINED.as_bytes().to_vec();
    server.extend(encode_frame(Opcode::Text, &document(3)));
    for offered in [true, false] {
        let (got, stats) = read_through(offered, vec![server.clone()]).await;
        assert_eq!(got.unwrap(), server);
        assert!(!stats.deflate.load(Relaxed));
        assert_eq!(stats.read.load(Relaxed), server.len() as u64);
    }
    // A refusal is not read for extensions.
    let refused = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n".to_vec();
    assert_eq!(read_through(true, vec![refused.clone()]).await.0.unwrap(), refused);
}

#[tokio::test]
async fn wire_fails_a_server_that_breaks_rfc_7692() {
    let answer = |ext: &str| {
        format!("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nSec-WebSocket-Extensions: {ext}\r\n\r\n")
            .into_bytes()
    };
    let accepted = ACCEPTED.as_bytes().to_vec();
    let two = compressed_in_two(Opcode::Text, &document(4));
    let first = parse_header(&two, MAX_MESSAGE, false).unwrap().unwrap();
    let first_len = first.header_len + first.payload_len;
    // RSV1 on the continuation as well.
    let mut rsv1_continuation = two.clone();
    rsv1_continuation[first_len] |= RSV1;
    // A plain message between the compressed one's two frames.
    let mut interleaved = two;
    interleaved.splice(first_len..first_len, encode_frame(Opcode::Text, b"{}"));
    let mut not_deflate = encode_frame(Opcode::Text, b"\xff\xff\xff\xff not deflate");
    not_deflate[0] |= RSV1;
    for (server, why) in [
        (answer("permessage-deflate; server_no_context_takeover; client_max_window_bits=10"), "client_max_window_bits"),
        (answer("permessage-deflate"), "server_no_context_takeover"),
        (answer("x-webkit-deflate-frame"), "not offered"),
        ([accepted.clone(), rsv1_continuation].concat(), "RSV1 on a continuation"),
        ([accepted.clone(), not_deflate].concat(), "not valid DEFLATE"),
        ([accepted.clone(), interleaved].concat(), "before the compressed one ended"),
    ] {
        let err = read_through(true, vec![server]).await.0.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains(why), "{why}: {err}");
    }
}
