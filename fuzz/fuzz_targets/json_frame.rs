//! JSON command frames (`switchboard.v1.json`): the decoder must never panic, and whatever
//! it accepts must be deliverable downstream:
//! - ping data is echoed inside a `\n`-separated frame, so `single_line` must leave no raw line
//!   break, whatever the data holds (numbers beyond `f64` included);
//! - publication data is refused by `check_data` exactly when `serde_json::Value` cannot hold
//!   it, and what passes encodes to MessagePack for binary subscribers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_protocol::message::{check_data, encode_publication, single_line, Data, Format, Pub};
use switchboard_protocol::{decode_json_frame, CommandBody};

fuzz_target!(|data: &[u8]| {
    let Ok(commands) = decode_json_frame(data) else { return };
    assert!(!commands.is_empty(), "an accepted frame holds at least one command");
    for c in commands {
        match c.body {
            CommandBody::Ping(p) => {
                if let Some(d) = p.data {
                    let one = single_line(&d).unwrap_or(d);
                    assert!(!one.get().contains(['\n', '\r']), "a line break would split the frame");
                }
            }
            CommandBody::Publish(p) => {
                let raw = p.data.get();
                let representable = serde_json::from_str::<serde_json::Value>(raw).is_ok();
                assert_eq!(check_data(raw).is_ok(), representable, "check_data must match the Value parser");
                if representable {
                    let tags = p.tags.as_ref();
                    let one = Pub { ch: "ch", off: 1, data: Data(&p.data), hist: false, tags };
                    let frame = encode_publication(Format::Msgpack, one);
                    let back: serde_json::Value = rmp_serde::from_slice(&frame).expect("MessagePack push decodes");
                    assert_eq!(back["pub"]["off"], 1);
                    if let Some(t) = tags.filter(|t| !t.is_empty()) {
                        assert_eq!(back["pub"]["tags"].as_object().map(|o| o.len()), Some(t.len()), "tags carried");
                    }
                }
            }
            _ => {}
        }
    }
});
