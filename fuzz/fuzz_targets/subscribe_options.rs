//! Subscribe options from any client, JSON or MessagePack (the first byte picks the format):
//! whatever `bounds::subscribe` accepts must be safe for every computation the node makes from
//! it — the sampling interval as a timer and as an instant, the trend's step in milliseconds
//! and its bucket count — and whatever it refuses names a field. Never a panic.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use switchboard_protocol::bounds::{self, Band};
use switchboard_protocol::{decode_json_frame, decode_msgpack_frame, CommandBody};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, frame)) = data.split_first() else { return };
    let decoded = if pick % 2 == 0 { decode_json_frame(frame) } else { decode_msgpack_frame(frame) };
    let Ok(commands) = decoded else { return };
    for c in commands {
        let CommandBody::Subscribe(req) = c.body else { continue };
        match bounds::subscribe(&req) {
            Err(e) => assert!(!e.field.is_empty() && !e.message.is_empty()),
            Ok(sampling) => {
                if let Some(s) = sampling {
                    if let Some(min) = s.min_interval {
                        assert!(min <= Duration::from_secs(100) && min >= Duration::from_millis(1));
                        let now = Instant::now();
                        assert!(now.checked_add(min).is_some());
                        assert!(now.checked_add(min * 2).is_some());
                    }
                    if let Some(Band::Abs(w) | Band::Pct(w)) = s.band {
                        assert!(w.is_finite() && w >= 0.0);
                    }
                }
                if let Some(t) = req.trend {
                    let step = t.step_s.unwrap_or(1);
                    let step_ms = step.checked_mul(1000).expect("the step in milliseconds");
                    let buckets = t.window_s.div_ceil(step);
                    assert!(buckets >= 1 && (buckets - 1).checked_mul(step_ms).is_some());
                }
            }
        }
    }
});
