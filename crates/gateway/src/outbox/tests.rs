//! Unit tests of the outbox, and `TestWire`, the in-memory wire other modules' tests use.

use super::*;
use switchboard_protocol::message::{encode_publication, Data, Pub};

/// A socket stand-in that accepts `room` bytes until `open_up` is called.
#[derive(Default)]
pub struct TestWire {
    pub written: Mutex<Vec<u8>>,
    pub room: Mutex<usize>,
    pub writes: AtomicU64,
}

impl TestWire {
    pub fn open(room: usize) -> Arc<TestWire> {
        Arc::new(TestWire { room: Mutex::new(room), ..Default::default() })
    }
    /// Parses what was written into (opcode, payload) frames.
    pub fn frames(&self) -> Vec<(Opcode, Vec<u8>)> {
        let buf = self.written.lock().clone();
        let mut out = Vec::new();
        let mut pos = 0;
        while let Some(h) = websocket::parse_header(&buf[pos..], usize::MAX, false).unwrap() {
            let start = pos + h.header_len;
            out.push((h.opcode, buf[start..start + h.payload_len].to_vec()));
            pos = start + h.payload_len;
        }
        assert_eq!(pos, buf.len(), "trailing partial frame");
        out
    }
    /// Every JSON message written, split on newlines.
    pub fn messages(&self) -> Vec<serde_json::Value> {
        self.frames()
            .into_iter()
            .filter(|(op, _)| *op == Opcode::Text)
            .flat_map(|(_, p)| {
                String::from_utf8(p).unwrap().split('\n').map(|l| serde_json::from_str(l).unwrap()).collect::<Vec<_>>()
            })
            .collect()
    }
}

impl Wire for TestWire {
    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.writes.fetch_add(1, Relaxed);
        let mut room = self.room.lock();
        if *room == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(*room);
        *room -= n;
        self.written.lock().extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

pub fn delivery(ch: &str, off: u64, v: &str) -> Delivery {
    let data = serde_json::value::RawValue::from_string(v.to_string()).unwrap();
    Delivery {
        frame: Frame::message(
            Format::Json,
            &encode_publication(Format::Json, Pub { ch, off, data: Data(&data), hist: false, tags: None }),
        ),
        channel: ch.into(),
        offset: off,
        born: Instant::now(),
    }
}

fn outbox(wire: &Arc<TestWire>, max_pending: usize) -> Outbox {
    Outbox::new(1, Format::Json, wire.clone(), max_pending, Arc::new(Metrics::default()))
}

#[test]
fn outbox_idle_connection_gets_the_shared_frame_in_one_write() {
    let wire = TestWire::open(usize::MAX);
    let ob = outbox(&wire, 1 << 20);
    let d = delivery("a", 1, "1");
    assert_eq!(ob.push(d.clone(), false), Pushed::Schedule);
    ob.flush();
    assert_eq!(wire.writes.load(Relaxed), 1);
    assert_eq!(*wire.written.lock(), d.frame.bytes.to_vec());
}

#[test]
fn outbox_merges_queued_messages_into_one_frame_and_one_write() {
    let wire = TestWire::open(usize::MAX);
    let ob = outbox(&wire, 1 << 20);
    assert_eq!(ob.push(delivery("a", 1, "1"), false), Pushed::Schedule);
    for i in 2..=50 {
        assert_eq!(ob.push(delivery("a", i, &i.to_string()), false), Pushed::Queued);
    }
    ob.flush();
    assert_eq!(wire.writes.load(Relaxed), 1);
    assert_eq!(wire.frames().len(), 1);
    let offs: Vec<u64> = wire.messages().iter().map(|m| m["pub"]["off"].as_u64().unwrap()).collect();
    assert_eq!(offs, (1..=50).collect::<Vec<_>>());
}

#[test]
fn outbox_conflates_a_stalled_point_channel_to_its_latest_value() {
    let wire = TestWire::open(0);
    let ob = outbox(&wire, 4096);
    for i in 1..=10_000u64 {
        for ch in ["pt:a", "pt:b"] {
            let _ = ob.push(delivery(ch, i, &format!("{{\"v\":{i}}}")), true);
        }
        ob.flush();
    }
    assert_eq!(ob.backlog().1, 2, "one pending value per channel, however many arrived");
    assert!(!ob.is_closing());
    *wire.room.lock() = usize::MAX;
    ob.flush_blocked();
    let msgs = wire.messages();
    // The chunk already handed to the socket when it filled up cannot be taken back; after
    // it, each channel gets exactly one message: its latest value.
    assert!(msgs.len() <= 4, "{} messages", msgs.len());
    for ch in ["pt:a", "pt:b"] {
        let last = msgs.iter().rev().find(|m| m["pub"]["ch"] == ch).unwrap();
        assert_eq!(last["pub"]["data"]["v"], 10_000);
        assert_eq!(msgs.iter().filter(|m| m["pub"]["ch"] == ch && m["pub"]["data"]["v"] == 10_000).count(), 1);
    }
}

#[test]
fn outbox_slow_consumer_is_closed_with_4008_and_memory_stays_bounded() {
    let wire = TestWire::open(0);
    let ob = outbox(&wire, 10_000);
    let mut dropped = 0;
    for i in 1..=1000u64 {
        if ob.push(delivery("a", i, "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\""), false) == Pushed::Dropped {
            dropped += 1;
        }
        ob.flush();
        assert!(ob.backlog().0 < 10_200);
    }
    assert!(dropped > 800);
    assert!(ob.is_closing());
    *wire.room.lock() = usize::MAX;
    ob.flush_blocked();
    assert!(ob.finished());
    let frames = wire.frames();
    let (op, last) = frames.last().unwrap();
    assert_eq!(*op, Opcode::Close);
    assert_eq!(&last[..2], &4008u16.to_be_bytes());
    let msgs = wire.messages();
    assert_eq!(msgs.last().unwrap()["disconnect"]["code"], 4008);
    // Only the frame in flight when the socket filled is completed; the backlog is dropped.
    assert_eq!(msgs.len(), 2, "in-flight publication + disconnect");
    assert_eq!(msgs[0]["pub"]["off"], 1);
}

#[test]
fn outbox_replies_pongs_and_presence_count_against_the_bound() {
    // Regression: only publications were counted, so a client pipelining large `history`
    // commands (or pings) without reading made the node queue without bound.
    let big = format!("{{\"id\":1,\"ok\":\"{}\"}}", "x".repeat(30_000));
    for kind in ["reply", "pong", "presence"] {
        let wire = TestWire::open(0);
        let ob = outbox(&wire, 10_000);
        // One large reply on an empty queue is taken whatever its size.
        let _ = ob.push_message(big.as_bytes(), Kind::reply(1));
        ob.flush();
        assert!(!ob.is_closing() && ob.is_full());
        let presence = Frame::message(Format::Json, br#"{"join":{"ch":"a","client":"c","user":""}}"#);
        for _ in 0..1000 {
            let _ = match kind {
                "reply" => ob.push_message(b"{\"id\":2,\"ok\":{}}", Kind::reply(2)),
                "pong" => ob.push_control(Bytes::from(websocket::encode_frame(Opcode::Pong, b"0123456789"))),
                _ => ob.push_frame(&presence, Kind::Join),
            };
            assert!(ob.backlog().0 < 40_000 + 10_000, "{kind}");
        }
        assert!(ob.is_closing(), "{kind}");
        *wire.room.lock() = usize::MAX;
        ob.flush_blocked();
        assert_eq!(wire.messages().last().unwrap()["disconnect"]["code"], 4008, "{kind}");
    }
}

#[test]
fn outbox_partial_writes_resume_where_they_stopped() {
    let wire = TestWire::open(7);
    let ob = outbox(&wire, 1 << 20);
    let _ = ob.push(delivery("a", 1, "\"hello world\""), false);
    ob.flush();
    assert!(ob.is_blocked());
    let _ = ob.push(delivery("a", 2, "2"), false);
    *wire.room.lock() = usize::MAX;
    ob.flush_blocked();
    let offs: Vec<u64> = wire.messages().iter().map(|m| m["pub"]["off"].as_u64().unwrap()).collect();
    assert_eq!(offs, vec![1, 2]);
}

#[test]
fn outbox_reply_follows_earlier_replies_and_precedes_publications_queued_while_held() {
    let wire = TestWire::open(usize::MAX);
    let ob = outbox(&wire, 1 << 20);
    // The socket is full: a ping reply and a publication of another channel wait.
    *wire.room.lock() = 0;
    ob.push_message(br#"{"id":1,"ok":{}}"#, Kind::reply(1));
    ob.flush();
    let _ = ob.push(delivery("b", 3, "0"), false);
    ob.hold();
    let _ = ob.push(delivery("a", 7, "0"), false);
    // Writable again while the subscribe runs: nothing may go out before its reply.
    *wire.room.lock() = usize::MAX;
    ob.flush_blocked();
    assert!(wire.messages().is_empty(), "nothing is written while a subscribe holds the outbox");
    let covered: HashMap<Arc<str>, u64> = [(Arc::from("a"), 6)].into_iter().collect();
    ob.release(br#"{"id":2,"ok":{}}"#, Kind::reply(2), &covered);
    let order: Vec<String> = wire
        .messages()
        .iter()
        .map(|m| match m.get("id") {
            Some(id) => format!("reply {id}"),
            None => format!("{} {}", m["pub"]["ch"].as_str().unwrap(), m["pub"]["off"]),
        })
        .collect();
    assert_eq!(order, vec!["reply 1", "b 3", "reply 2", "a 7"]);
}

#[test]
fn outbox_hold_puts_the_reply_first_and_drops_covered_publications() {
    let wire = TestWire::open(usize::MAX);
    let ob = outbox(&wire, 1 << 20);
    ob.hold();
    for i in 5..=8 {
        assert_eq!(ob.push(delivery("a", i, "0"), false), Pushed::Queued);
    }
    ob.flush();
    assert!(wire.written.lock().is_empty(), "nothing is written while held");
    let covered: HashMap<Arc<str>, u64> = [(Arc::from("a"), 6)].into_iter().collect();
    ob.release(br#"{"id":1,"ok":{}}"#, Kind::reply(1), &covered);
    let msgs = wire.messages();
    assert_eq!(msgs[0]["id"], 1);
    let offs: Vec<u64> = msgs[1..].iter().map(|m| m["pub"]["off"].as_u64().unwrap()).collect();
    assert_eq!(offs, vec![7, 8]);
}

#[test]
fn outbox_close_while_a_subscribe_holds_drops_what_it_held() {
    // A publication of the channel being subscribed (and any other) queued while the subscribe
    // runs must never reach the client without that subscribe's reply: a close in the meantime
    // (slow consumer, a broker's 4008) drops what the hold kept back; the client recovers it.
    let wire = TestWire::open(usize::MAX);
    let ob = outbox(&wire, 1 << 20);
    let _ = ob.push(delivery("a", 1, "0"), false);
    ob.flush();
    ob.hold();
    let _ = ob.push(delivery("b", 163, "0"), false);
    let _ = ob.push(delivery("a", 2, "0"), true);
    ob.close(4008, "publications may have been missed; reconnect and recover", false);
    let msgs = wire.messages();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert_eq!(msgs[0]["pub"]["off"], 1, "what was sent before the subscribe stays");
    assert_eq!(msgs[1]["disconnect"]["code"], 4008);
}

#[test]
fn outbox_written_out_keeps_no_queue_no_conflation_map_and_no_frame() {
    let wire = TestWire::open(0);
    let ob = outbox(&wire, 1 << 20);
    let shared = delivery("a", 1, "1");
    let _ = ob.push(shared.clone(), false);
    for i in 2..=20u64 {
        let _ = ob.push(delivery("a", i, &i.to_string()), false);
        let _ = ob.push(delivery("pt:b", i, &i.to_string()), true);
    }
    ob.flush();
    {
        let st = ob.state.lock();
        assert!(st.queue.capacity() > 0 && st.latest.capacity() > 0, "a blocked outbox holds what is queued");
    }
    *wire.room.lock() = usize::MAX;
    ob.flush_blocked();
    let offs = |ch: &str| -> Vec<u64> {
        wire.messages().iter().filter(|m| m["pub"]["ch"] == ch).map(|m| m["pub"]["off"].as_u64().unwrap()).collect()
    };
    assert_eq!((offs("a"), offs("pt:b")), ((1..=20).collect(), vec![20]));
    let st = ob.state.lock();
    assert_eq!((st.queue.capacity(), st.latest.capacity(), st.current.len()), (0, 0, 0));
    drop(st);
    let frame = shared.frame.bytes.clone();
    drop(shared);
    assert!(frame.is_unique(), "the outbox keeps no reference to a frame it wrote");
}
