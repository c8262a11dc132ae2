//! MessagePack command frames (`switchboard.v1.msgpack`): concatenated maps, all or nothing.
//! The decoder must never panic or overflow the stack (nesting is bounded), and accepted
//! publication data must be valid JSON text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_protocol::{decode_msgpack_frame, CommandBody};

fuzz_target!(|data: &[u8]| {
    let Ok(commands) = decode_msgpack_frame(data) else { return };
    assert!(!commands.is_empty(), "an accepted frame holds at least one command");
    for c in commands {
        if let CommandBody::Publish(p) = &c.body {
            serde_json::from_str::<serde_json::Value>(p.data.get()).expect("accepted data must be JSON");
        }
    }
});
