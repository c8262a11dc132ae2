//! Channel patterns (`*` one segment, `**` any rest): the matcher must never panic, stay
//! linear, and agree with a slow, obviously correct backtracking reference on short inputs.
#![no_main]

#[path = "../../crates/gateway/src/auth/pattern.rs"]
#[allow(dead_code)]
mod pattern;

use libfuzzer_sys::fuzz_target;
use pattern::{is_separator, Pattern};

/// Reference semantics, by brute force over the pattern text.
fn reference(p: &[u8], name: &[u8]) -> bool {
    if p.starts_with(b"**") {
        return (0..=name.len()).any(|k| reference(&p[2..], &name[k..]));
    }
    if p.first() == Some(&b'*') {
        // One or more bytes of a single segment.
        let run = name.iter().take_while(|b| !is_separator(**b)).count();
        return (1..=run).any(|k| reference(&p[1..], &name[k..]));
    }
    match (p.first(), name.first()) {
        (None, None) => true,
        (Some(a), Some(b)) if a == b => reference(&p[1..], &name[1..]),
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (p, name) = text.split_once('\n').unwrap_or((text, ""));
    let Ok(pattern) = Pattern::parse(p) else { return };
    assert_eq!(pattern.to_string(), p, "a parsed pattern prints as written");
    let got = pattern.matches(name);
    if p.len() <= 16 && name.len() <= 32 {
        assert_eq!(got, reference(p.as_bytes(), name.as_bytes()), "pattern {p:?} on {name:?}");
    }
    // A pattern without wildcards matches exactly itself.
    if !p.contains('*') {
        assert!(pattern.matches(p));
    }
});
