use super::*;
use base64::Engine;
use serde_json::json;

/// The delta from `from` to `to`: the crate takes the new text first.
fn make(from: impl AsRef<[u8]>, to: impl AsRef<[u8]>) -> Vec<u8> {
    fossil_delta::delta(to, from)
}

fn push(off: u64, delta: bool, text: &[u8]) -> EncodedPush {
    EncodedPush { ch: "a".into(), off, historical: false, tags: None, delta, text: text.to_vec() }
}

#[test]
fn delta_chain_rebuilds_whole_then_deltas_then_whole_again() {
    let texts = [r#"{"x":1,"name":"boiler","list":[1,2,3]}"#, r#"{"x":2,"name":"boiler","list":[1,2,3]}"#];
    let third = r#"{"x":3,"name":"boiler","list":[1,2,3,4]}"#;
    let mut chains = Chains::default();
    let first = chains.decode(push(43, false, texts[0].as_bytes())).unwrap();
    assert_eq!((first.off, first.data), (43, json!({"x": 1, "name": "boiler", "list": [1, 2, 3]})));
    let d1 = make(texts[0], texts[1]);
    assert!(d1.len() < texts[1].len());
    assert_eq!(chains.decode(push(44, true, &d1)).unwrap().data["x"], json!(2));
    let d2 = make(texts[1], third);
    assert_eq!(chains.decode(push(45, true, &d2)).unwrap().data["list"], json!([1, 2, 3, 4]));
    // After a resubscription the first push is whole again, whatever the text was.
    let again = chains.decode(push(50, false, br#"{"x":9}"#)).unwrap();
    assert_eq!(again.data, json!({"x": 9}));
    let d3 = make(r#"{"x":9}"#, r#"{"x":10}"#);
    assert_eq!(chains.decode(push(51, true, &d3)).unwrap().data, json!({"x": 10}));
}

#[test]
fn delta_without_a_previous_text_or_after_a_failure_is_refused() {
    let mut chains = Chains::default();
    let d = make("{}", r#"{"a":1}"#);
    assert_eq!(chains.decode(push(1, true, &d)), Err(DeltaError::NoBase));
    chains.decode(push(1, false, b"{}")).unwrap();
    let mut bad = d.clone();
    let end = bad.len() - 2;
    bad[end] = if bad[end] == b'1' { b'2' } else { b'1' }; // the checksum's last digit
    assert_eq!(chains.decode(push(2, true, &bad)), Err(DeltaError::BadChecksum));
    // The chain is broken until the next whole push.
    assert_eq!(chains.decode(push(3, true, &d)), Err(DeltaError::NoBase));
    let ch = EncodedPush { ch: "b".into(), ..push(1, false, b"{not json") };
    assert!(matches!(chains.decode(ch), Err(DeltaError::NotJson(_))));
}

#[test]
fn delta_declaring_a_huge_output_is_refused_before_anything_is_allocated() {
    // "~~~~~" is 2^30 - 1 bytes: a 12-byte delta asking for a gigabyte.
    let huge = b"~~~~~\n0@0,5;";
    assert_eq!(apply(b"{}", huge, DEFAULT_MAX_BYTES), Err(DeltaError::TooLarge { size: (1 << 30) - 1, max: 1 << 20 }));
    // A bound of the client's own.
    let d = make(r#"{"x":1}"#, r#"{"x":1,"y":"a longer text than before"}"#);
    assert!(matches!(apply(br#"{"x":1}"#, &d, 16), Err(DeltaError::TooLarge { max: 16, .. })));
    let mut chains = Chains::new(8);
    assert!(matches!(chains.decode(push(1, false, br#"{"x":"0123456789"}"#)), Err(DeltaError::TooLarge { .. })));
}

#[test]
fn delta_malformed_deltas_are_errors_never_panics() {
    let base = br#"{"x":1,"y":2}"#;
    let good = make(base, br#"{"x":1,"y":3}"#);
    for cut in 0..good.len() {
        assert!(apply(base, &good[..cut], DEFAULT_MAX_BYTES).is_err(), "cut at {cut}");
    }
    for bad in [
        &b""[..],
        b"5",
        b"5\n",
        b"5\n5@0",
        b"5\n5@99,0;",
        b"5\n9:abc",
        b"5\n3:abc2:de0;",
        b"2\n3:abc0;",
        b"3\n3?abc0;",
        b"zzzzzzzzzzzzzzzz\n0;",
        b"5\nzzzzzzzzzzzzzz@zzzzzzzzzzzzzz,0;",
    ] {
        assert!(apply(base, bad, DEFAULT_MAX_BYTES).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
    assert_eq!(apply(base, &good, DEFAULT_MAX_BYTES).unwrap(), br#"{"x":1,"y":3}"#);
}

/// Deltas made by the npm package (`createDelta`) and by this crate's dependency for the
/// same texts, shared with the TypeScript and Python clients' tests: each applies both.
#[test]
fn delta_applies_deltas_made_by_the_npm_package_and_makes_the_same_as_recorded() {
    let cases: serde_json::Value =
        serde_json::from_str(include_str!("../../../../tests/fixtures/fossil-deltas.json")).unwrap();
    let b64 = |v: &serde_json::Value| base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for c in cases {
        let (source, target) = (b64(&c["source"]), b64(&c["target"]));
        let name = c["name"].as_str().unwrap();
        assert_eq!(make(&source, &target), b64(&c["rust"]), "{name}: the recorded Rust delta");
        for made_by in ["npm", "rust"] {
            assert_eq!(apply(&source, &b64(&c[made_by]), DEFAULT_MAX_BYTES).unwrap(), target, "{name} by {made_by}");
        }
    }
}

/// A frame of the scripted server: replies and plain messages as JSON values, delta
/// subscription pushes with their text or delta (a string in JSON, a binary in MessagePack).
enum Out {
    Msg(serde_json::Value),
    Push { off: u64, delta: bool, text: Vec<u8> },
}

/// MessagePack `bin` for the push's data (a JSON value has no binary).
struct Bin<'a>(&'a [u8]);

impl serde::Serialize for Bin<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

#[derive(serde::Serialize)]
struct PushBody<'a> {
    ch: &'a str,
    off: u64,
    data: Bin<'a>,
    delta: bool,
}

#[derive(serde::Serialize)]
struct PushMsg<'a> {
    #[serde(rename = "pub")]
    publication: PushBody<'a>,
}

fn frame(format: Format, outs: &[Out]) -> Message {
    match format {
        Format::Json => Message::text(
            outs.iter()
                .map(|o| match o {
                    Out::Msg(v) => v.to_string(),
                    Out::Push { off, delta, text } => {
                        let data = String::from_utf8(text.clone()).unwrap();
                        json!({"pub": {"ch": "a", "off": off, "data": data, "delta": delta}}).to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Format::Msgpack => {
            let mut bytes = Vec::new();
            for o in outs {
                bytes.extend(match o {
                    Out::Msg(v) => rmp_serde::to_vec_named(v).unwrap(),
                    Out::Push { off, delta, text } => {
                        let body = PushBody { ch: "a", off: *off, data: Bin(text), delta: *delta };
                        rmp_serde::to_vec_named(&PushMsg { publication: body }).unwrap()
                    }
                });
            }
            Message::binary(bytes)
        }
    }
}

fn text(x: u64) -> String {
    json!({"x": x, "name": "boiler 1", "unit": "degC", "history": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}).to_string()
}

fn whole(off: u64) -> Out {
    Out::Push { off, delta: false, text: text(off).into_bytes() }
}

fn delta(off: u64) -> Out {
    Out::Push { off, delta: true, text: make(text(off - 1), text(off)) }
}

fn plain(off: u64) -> serde_json::Value {
    json!({"ch": "a", "off": off, "data": serde_json::from_str::<serde_json::Value>(&text(off)).unwrap()})
}

use crate::client::tests::scripted_server;
use crate::event::Event;
use crate::frame::{decode_frame, ServerMessage};
use crate::reply::SubscribeOptions;
use crate::resubscribe::{Subscriber, Update};
use crate::Client;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchboard_protocol::Format;
use tokio_tungstenite::tungstenite::Message;

#[test]
fn delta_pushes_decode_as_encoded_in_json_and_msgpack_and_tags_are_read() {
    for format in [Format::Json, Format::Msgpack] {
        let outs = [whole(43), delta(44)];
        let payload = match frame(format, &outs) {
            Message::Text(t) => t.as_bytes().to_vec(),
            Message::Binary(b) => b.to_vec(),
            other => panic!("{other:?}"),
        };
        let got: Vec<_> = decode_frame(format, &payload).into_iter().map(Result::unwrap).collect();
        let [ServerMessage::Encoded(w), ServerMessage::Encoded(d)] = &got[..] else { panic!("{got:?}") };
        assert_eq!((w.off, w.delta, &w.text[..]), (43, false, text(43).as_bytes()), "{format:?}");
        assert_eq!((d.off, d.delta), (44, true), "{format:?}");
        let mut chains = Chains::default();
        chains.decode(w.clone()).unwrap();
        assert_eq!(chains.decode(d.clone()).unwrap().data["x"], json!(44));
    }
    let tagged = br#"{"pub":{"ch":"a","off":1,"data":{"v":1},"tags":{"kind":"alarm","site":"p1"}}}"#;
    let [Ok(ServerMessage::Event(Event::Publication(p)))] = &decode_frame(Format::Json, tagged)[..] else { panic!() };
    let tags = p.tags.as_ref().unwrap();
    assert_eq!((tags["kind"].as_str(), tags["site"].as_str()), ("alarm", "p1"));
    // A binary outside a delta publication, or a delta whose data is not text, is refused.
    #[derive(serde::Serialize)]
    struct Plain<'a> {
        ch: &'a str,
        off: u64,
        data: Bin<'a>,
    }
    #[derive(serde::Serialize)]
    struct PlainMsg<'a> {
        #[serde(rename = "pub")]
        publication: Plain<'a>,
    }
    let bad = rmp_serde::to_vec_named(&PlainMsg { publication: Plain { ch: "a", off: 1, data: Bin(b"{}") } }).unwrap();
    assert!(decode_frame(Format::Msgpack, &bad)[0].is_err());
    let numeric = br#"{"pub":{"ch":"a","off":1,"data":5,"delta":true}}"#;
    assert!(decode_frame(Format::Json, numeric)[0].is_err());
}

/// A subscriber with `delta: "fossil"` against a scripted node: whole, delta, delta; a delta
/// declaring a huge size, refused and resubscribed with recovery (no gap: history holds the
/// hole); whole and delta again; a bad checksum whose recovery history no longer covers (a gap,
/// then the latest value).
async fn delta_subscriber_rebuilds_and_resubscribes(format: Format) {
    let commands = Arc::new(Mutex::new(Vec::<serde_json::Value>::new()));
    let seen = commands.clone();
    let url = scripted_server(move |cmd| {
        let mut seen = seen.lock().unwrap();
        seen.push(cmd.clone());
        let id = cmd["id"].clone();
        let subscribes = seen.iter().filter(|c| c.get("subscribe").is_some()).count();
        let huge = Out::Push { off: 46, delta: true, text: b"~~~~~\n0@0,0;".to_vec() };
        let outs = match (cmd.get("subscribe").is_some(), subscribes) {
            (true, 1) => {
                let last = plain(42);
                let ok = json!({"id": id, "ok": {"channels": {"a": {"epoch": "e", "offset": 42, "last": last}}}});
                vec![Out::Msg(ok), whole(43), delta(44), delta(45), huge, delta(47)]
            }
            (true, 2) => {
                let recovered = [plain(46), plain(47)];
                let ok =
                    json!({"id": id, "ok": {"channels": {"a": {"epoch": "e", "offset": 47, "recovered": recovered}}}});
                let mut bad = make(text(48), text(49));
                let end = bad.len() - 2;
                bad[end] = if bad[end] == b'1' { b'2' } else { b'1' };
                vec![Out::Msg(ok), whole(48), Out::Push { off: 49, delta: true, text: bad }, delta(50)]
            }
            (true, _) => {
                let ok = json!({"id": id, "ok": {"channels": {"a": {
                    "epoch": "e", "offset": 52, "last": plain(52), "recovered": [], "complete": false}}}});
                vec![Out::Msg(ok), whole(53), delta(54)]
            }
            (false, _) => Vec::new(), // the unsubscribes, sent without id
        };
        if outs.is_empty() {
            Vec::new()
        } else {
            vec![frame(format, &outs)]
        }
    })
    .await;
    let mut client = Client::connect(&url, format).await.unwrap();
    let mut sub = Subscriber::new(SubscribeOptions::new(["a"]).initial(true).fossil_delta());
    let mut got = Vec::new();
    while got.len() < 13 {
        let u = tokio::time::timeout(Duration::from_secs(10), sub.next(&mut client)).await.unwrap().unwrap();
        got.push(match u {
            Update::Delivery(d) => {
                assert_eq!(d.data, serde_json::from_str::<serde_json::Value>(&text(d.off)).unwrap(), "{format:?}");
                format!("{}", d.off)
            }
            Update::Waiting { reason, .. } => format!("waiting: {reason}"),
            Update::Gap { gap, .. } => format!("gap after {}", gap.from.offset),
            other => panic!("{other:?}"),
        });
    }
    let huge =
        "waiting: publication 46 could not be rebuilt from its delta: the publication declares 1073741823 bytes, \
        more than the 1048576 allowed";
    let bad =
        "waiting: publication 49 could not be rebuilt from its delta: the delta's checksum does not match its result";
    let expected =
        ["42", "43", "44", "45", huge, "46", "47", "48", bad, "gap after 48", "52", "53", "54"].map(String::from);
    assert_eq!(got, expected, "{format:?}");
    let cmds = commands.lock().unwrap().clone();
    let shapes: Vec<String> = cmds
        .iter()
        .map(|c| match (c.get("subscribe"), c.get("unsubscribe")) {
            (Some(s), _) => {
                assert_eq!(s["delta"], json!("fossil"), "every subscribe asks for deltas");
                format!("subscribe recover {}", s["recover"]["a"]["offset"])
            }
            (_, Some(u)) => format!("unsubscribe {}", u["channels"]),
            _ => panic!("{c}"),
        })
        .collect();
    assert_eq!(
        shapes,
        [
            "subscribe recover null",
            "unsubscribe [\"a\"]",
            "subscribe recover 45",
            "unsubscribe [\"a\"]",
            "subscribe recover 48"
        ]
    );
}

#[tokio::test]
async fn delta_subscriber_rebuilds_and_resubscribes_in_json() {
    delta_subscriber_rebuilds_and_resubscribes(Format::Json).await;
}

#[tokio::test]
async fn delta_subscriber_rebuilds_and_resubscribes_in_msgpack() {
    delta_subscriber_rebuilds_and_resubscribes(Format::Msgpack).await;
}
