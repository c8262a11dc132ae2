//! permessage-deflate in the outbox: a WebSocket connection that negotiated it
//! ([`Outbox::use_deflate`]) gets its messages of at least `compression_min_bytes` as compressed
//! frames (RSV1), the others as they are (RFC 7692 lets a sender leave any message
//! uncompressed).
//!
//! Encode once: a frame the hub shares between connections ([`Frame::message`]: a publication,
//! a presence event) carries the cache of its compressed forms, filled by the first connection
//! that needs each one ([`Frame::deflated`]); every other connection with the same window gets
//! the same bytes. Nothing is compressed for a frame no deflate connection receives. A frame of
//! one connection (a reply) is compressed where it is queued.
//!
//! Windows: a client may ask the server to compress with at most `server_max_window_bits`
//! (8..15). A message no longer than the window was compressed with any window it can read (no
//! back-reference reaches before the message's start), so the 15-bit form serves it; a longer
//! message gets a form compressed for that window, cached beside the 15-bit one. Clients that
//! ask for less than 15 bits are rare (browsers and the common libraries do not), so the narrow
//! forms live in a small list behind a lock rather than a slot per window in every frame.
//!
//! Compressed frames are written whole: the outbox never merges them with their neighbours
//! into one `\n`-separated frame, which would need compressing again per connection.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use switchboard_protocol::websocket::deflate::{deflate_frame, MAX_WINDOW_BITS, RSV1};
use switchboard_protocol::websocket::Opcode;

use super::{Frame, Outbox};
use crate::metrics::DeflateCounts;

/// permessage-deflate on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deflate {
    /// The largest window (bits) the client can inflate (`server_max_window_bits`, or 15).
    pub window: u8,
    /// Messages shorter than this go out uncompressed.
    pub min_bytes: usize,
}

/// The compressed forms of a shared frame; `None` where compressing did not make the message
/// smaller (it then goes out as is).
#[derive(Debug, Default)]
pub(super) struct Forms {
    /// The 15-bit form: what nearly every connection gets.
    wide: OnceLock<Option<Frame>>,
    /// Forms for narrower windows, by window bits.
    narrow: Mutex<Vec<(u8, Option<Frame>)>>,
}

impl Forms {
    pub(super) fn shared() -> Option<Arc<Forms>> {
        Some(Arc::new(Forms::default()))
    }
}

impl Frame {
    /// Whether this is a compressed message frame (RSV1).
    pub fn compressed(&self) -> bool {
        self.header_len > 0 && self.bytes.first().is_some_and(|b| b & RSV1 != 0)
    }

    /// This message as a connection with `deflate` receives it: compressed when it is at least
    /// `min_bytes` long and compressing makes it smaller, otherwise as it is. A shared frame is
    /// compressed once per window, whoever asks first.
    /// What compressing took and gave is added to `counts` (once per compression: a cached
    /// form costs nothing more).
    pub fn deflated(&self, deflate: &Deflate, counts: &DeflateCounts) -> Frame {
        let len = self.payload().len();
        if self.header_len == 0 || self.compressed() || len < deflate.min_bytes {
            return self.clone();
        }
        // A message within the window reads the same whatever window compressed it.
        let window = if len <= 1 << deflate.window { MAX_WINDOW_BITS } else { deflate.window };
        let made = match &self.forms {
            None => self.compress(window, counts),
            Some(cache) if window == MAX_WINDOW_BITS => {
                cache.wide.get_or_init(|| self.compress(window, counts)).clone()
            }
            Some(cache) => {
                let mut narrow = cache.narrow.lock();
                match narrow.iter().find(|(w, _)| *w == window) {
                    Some((_, f)) => f.clone(),
                    None => {
                        let f = self.compress(window, counts);
                        narrow.push((window, f.clone()));
                        f
                    }
                }
            }
        };
        made.unwrap_or_else(|| self.clone())
    }

    /// The compressed form for `window`, if it is smaller; counted.
    fn compress(&self, window: u8, counts: &DeflateCounts) -> Option<Frame> {
        let opcode = if self.bytes[0] & 0x0f == 2 { Opcode::Binary } else { Opcode::Text };
        let before = self.payload().len();
        let made = deflate_frame(opcode, self.payload(), window)
            .filter(|(bytes, _)| bytes.len() < self.bytes.len())
            .map(|(bytes, header_len)| Frame { bytes, header_len: header_len as u8, forms: None });
        counts.count(before, made.as_ref().map_or(before, |f| f.payload().len()));
        made
    }
}

impl Outbox {
    /// Compresses this connection's messages from now on: its client negotiated
    /// permessage-deflate. Called once, by the connection's task before its session runs (what
    /// was queued before stays as it is).
    pub fn use_deflate(&self, deflate: Deflate) {
        if self.deflate.set(deflate).is_ok() {
            self.metrics.deflate.connections.fetch_add(1, Relaxed);
        }
    }

    /// `frame` as this connection sends it (compressed or not).
    pub(super) fn on_wire(&self, frame: Frame) -> Frame {
        match self.deflate.get() {
            Some(d) => frame.deflated(d, &self.metrics.deflate),
            None => frame,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use switchboard_protocol::websocket::deflate::inflate;
    use switchboard_protocol::websocket::parse_header;
    use switchboard_protocol::Format;

    use super::*;
    use crate::message::Kind;
    use crate::metrics::Metrics;
    use crate::outbox::tests::TestWire;
    use crate::outbox::{Delivery, Pushed};

    fn publication(ch: &str, off: u64, text: &str) -> Delivery {
        let payload = format!(r#"{{"pub":{{"ch":"{ch}","off":{off},"data":{{"text":"{text}"}}}}}}"#);
        Delivery {
            frame: Frame::message(Format::Json, payload.as_bytes()),
            channel: ch.into(),
            offset: off,
            born: std::time::Instant::now(),
        }
    }

    fn outbox(wire: &Arc<TestWire>, deflate: Option<Deflate>) -> Outbox {
        outbox_with(wire, deflate, Arc::new(Metrics::default()))
    }

    fn outbox_with(wire: &Arc<TestWire>, deflate: Option<Deflate>, metrics: Arc<Metrics>) -> Outbox {
        let ob = Outbox::new(1, Format::Json, wire.clone(), 1 << 20, metrics);
        if let Some(d) = deflate {
            ob.use_deflate(d);
        }
        ob
    }

    /// The messages of the frames written, inflated where compressed: (compressed, text).
    fn messages(bytes: &[u8]) -> Vec<(bool, String)> {
        let mut out = Vec::new();
        let mut pos = 0;
        while let Some(h) = parse_header(&bytes[pos..], usize::MAX, false).unwrap() {
            let payload = &bytes[pos + h.header_len..pos + h.header_len + h.payload_len];
            let text = if h.compressed { inflate(payload, 1 << 20).unwrap() } else { payload.to_vec() };
            out.push((h.compressed, String::from_utf8(text).unwrap()));
            pos += h.header_len + h.payload_len;
        }
        assert_eq!(pos, bytes.len(), "whole frames");
        out
    }

    const WIDE: Deflate = Deflate { window: 15, min_bytes: 100 };

    #[test]
    fn outbox_deflate_compresses_a_publication_once_for_every_connection() {
        let long = "a publication long enough to be worth compressing ".repeat(4);
        let d = publication("room:1", 1, &long);
        let wires: Vec<Arc<TestWire>> = (0..3).map(|_| TestWire::open(usize::MAX)).collect();
        let metrics = Arc::new(Metrics::default());
        let deflating = outbox_with(&wires[0], Some(WIDE), metrics.clone());
        let also = outbox_with(&wires[1], Some(WIDE), metrics.clone());
        let plain = outbox_with(&wires[2], None, metrics);
        for ob in [&deflating, &also, &plain] {
            assert_eq!(ob.push(d.clone(), false), Pushed::Schedule);
            ob.flush();
        }
        let written: Vec<Vec<u8>> = wires.iter().map(|w| w.written.lock().clone()).collect();
        assert_eq!(written[0], written[1], "the same compressed bytes");
        assert!(written[0].len() < written[2].len());
        let text = String::from_utf8(d.frame.payload().to_vec()).unwrap();
        assert_eq!(messages(&written[0]), vec![(true, text.clone())]);
        assert_eq!(messages(&written[2]), vec![(false, text)]);
        // One compression, shared: both outboxes wrote the cache's bytes, and it was counted
        // once (the outboxes share the node's metrics).
        let counts = DeflateCounts::default();
        let cached = d.frame.deflated(&WIDE, &counts);
        assert!(cached.compressed());
        assert_eq!(cached.bytes.as_ptr(), d.frame.deflated(&WIDE, &counts).bytes.as_ptr());
        assert_eq!(counts.compressed.load(Relaxed), 0, "the cache was filled before");
        let m = &deflating.metrics.deflate;
        assert_eq!((m.connections.load(Relaxed), m.compressed.load(Relaxed)), (2, 1));
        assert_eq!(m.bytes_in.load(Relaxed), d.frame.payload().len() as u64);
        assert_eq!(m.bytes_out.load(Relaxed), cached.payload().len() as u64);
    }

    #[test]
    fn outbox_deflate_keeps_short_messages_plain_and_merges_only_those() {
        let wire = TestWire::open(usize::MAX);
        let ob = outbox(&wire, Some(WIDE));
        ob.hold();
        let long = "x".repeat(300);
        ob.push(publication("a", 1, "short"), false);
        ob.push(publication("a", 2, "also short"), false);
        ob.push(publication("a", 3, &long), false);
        ob.push(publication("a", 4, "short again"), false);
        ob.release_without_reply(&HashMap::new());
        let got = messages(&wire.written.lock());
        let kinds: Vec<bool> = got.iter().map(|m| m.0).collect();
        assert_eq!(kinds, vec![false, true, false], "two short ones merged, the long one alone");
        assert_eq!(got[0].1.lines().count(), 2);
        assert!(got[1].1.contains(&long));
    }

    #[test]
    fn outbox_deflate_compresses_replies_and_records_them_plain() {
        let wire = TestWire::open(usize::MAX);
        let ob = outbox(&wire, Some(Deflate { window: 15, min_bytes: 0 }));
        let reply = format!(r#"{{"id":1,"ok":{{"data":"{}"}}}}"#, "y".repeat(500));
        assert_eq!(ob.push_message(reply.as_bytes(), Kind::reply(1)), Pushed::Schedule);
        ob.flush();
        assert_eq!(messages(&wire.written.lock()), vec![(true, reply)]);
    }

    #[test]
    fn outbox_deflate_gives_a_narrow_window_a_form_it_can_read() {
        let long = (0..200).map(|i| format!("v{i}")).collect::<Vec<_>>().join(",");
        let d = publication("pt:x", 1, &long);
        assert!(d.frame.payload().len() > 512);
        let narrow = Deflate { window: 9, min_bytes: 0 };
        let counts = DeflateCounts::default();
        let a = d.frame.deflated(&narrow, &counts);
        let wide = d.frame.deflated(&WIDE, &counts);
        assert!(a.compressed() && wide.compressed());
        assert_ne!(a.bytes, wide.bytes, "a form of its own");
        assert_eq!(a.bytes.as_ptr(), d.frame.deflated(&narrow, &counts).bytes.as_ptr(), "cached");
        assert_eq!(inflate(a.payload(), 1 << 20).unwrap(), d.frame.payload());
        // A short message is read by any window: the 15-bit form serves it.
        let short = publication("pt:x", 2, &"z".repeat(100));
        assert_eq!(
            short.frame.deflated(&narrow, &counts).bytes.as_ptr(),
            short.frame.deflated(&WIDE, &counts).bytes.as_ptr()
        );
        assert_eq!(counts.compressed.load(Relaxed), 3, "the narrow form, the wide one, the short one's");
    }
}
