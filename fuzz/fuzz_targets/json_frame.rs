//! JSON command frames (`switchboard.v1.json`): the decoder must never panic, and whatever
//! it accepts must be usable downstream — publication and ping data are raw JSON that the
//! gateway re-parses for MessagePack subscribers and for `\n`-safe framing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_protocol::{decode_json_frame, CommandBody};

fuzz_target!(|data: &[u8]| {
    let Ok(commands) = decode_json_frame(data) else { return };
    assert!(!commands.is_empty(), "an accepted frame holds at least one command");
    for c in commands {
        let raw = match &c.body {
            CommandBody::Publish(p) => Some(p.data.get()),
            CommandBody::Ping(p) => p.data.as_ref().map(|d| d.get()),
            _ => None,
        };
        if let Some(raw) = raw {
            let v: serde_json::Value =
                serde_json::from_str(raw).expect("accepted data must parse as a JSON value again");
            rmp_serde::to_vec_named(&v).expect("accepted data must encode as MessagePack");
        }
    }
});
