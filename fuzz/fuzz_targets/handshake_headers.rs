//! Handshake headers: `Authorization`, `Sec-WebSocket-Protocol` (with the
//! `switchboard.token.<jwt>` entry), the `token` query parameter and `Origin` checks. The
//! gateway's parser is compiled here from its source file, which depends on nothing else in
//! the gateway, so this crate does not build the TLS and crypto stack.
#![no_main]

#[path = "../../crates/gateway/src/auth/credentials.rs"]
#[allow(dead_code)]
mod credentials;

use credentials::{Credential, MAX_SECRET_LEN, TOKEN_PROTOCOL_PREFIX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match credentials::parse_authorization(data) {
        Ok(Credential::Bearer(t)) => {
            assert!(!t.is_empty() && t.len() <= MAX_SECRET_LEN && t.bytes().all(|b| b.is_ascii_graphic()));
            // Debug output never shows the secret.
            assert_eq!(format!("{:?}", Credential::Bearer(t.clone())), "Bearer(<redacted>)");
        }
        Ok(Credential::Basic { user, .. }) => assert!(!user.is_empty()),
        Err(e) => {
            let _ = e.to_string();
        }
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut parts = text.splitn(3, '\n');
    let first = parts.next().unwrap_or("");
    let host = parts.next();
    let list: Vec<String> = parts.next().unwrap_or("").split(' ').filter(|s| !s.is_empty()).map(String::from).collect();

    let (protocols, token) = credentials::split_subprotocols([first, "switchboard.v1.json"]);
    assert_eq!(protocols.last(), Some(&"switchboard.v1.json"));
    for p in &protocols {
        assert!(!p.starts_with(TOKEN_PROTOCOL_PREFIX), "a token entry must never be a protocol");
        assert!(!p.contains(',') && !p.is_empty() && p.trim() == *p);
    }
    if let Some(Ok(Credential::Bearer(t))) = &token {
        assert!(!t.is_empty() && t.len() <= MAX_SECRET_LEN);
    }
    if let Some(Ok(Credential::Bearer(t))) = credentials::token_from_query(first) {
        assert!(!t.is_empty() && t.len() <= MAX_SECRET_LEN);
    }
    let _ = credentials::percent_decode(first);
    let allowed = credentials::origin_allowed(Some(first), host, &list);
    if list.iter().any(|o| o == "*") {
        assert!(allowed);
    }
    assert!(credentials::origin_allowed(None, host, &list), "no Origin header: not a browser");
});
