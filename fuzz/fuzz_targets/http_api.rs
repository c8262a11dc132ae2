//! HTTP API bodies and query strings: `POST /api/publish` bodies (one item or a batch, their
//! tags checked as the node checks them) and the query strings of `GET /api/channels`,
//! `/history`, `/trend` and `/poll/{id}`, parsed as the API parses them (serde_json with raw
//! data, serde_urlencoded as axum's `Query`), then every value the API would publish normalised
//! as it does; plus the `Host` check (DNS rebinding) and the query-token parser on the same
//! bytes. The body and query types are the
//! API's own (`crates/gateway/src/api/bodies.rs`, included by path: the gateway itself is not
//! built here, it pulls in TLS and crypto); the poll query is read by hand in the poll handler
//! and is mirrored here.
#![no_main]

#[path = "../../crates/gateway/src/auth/credentials.rs"]
#[allow(dead_code)]
mod credentials;

#[path = "../../crates/gateway/src/api/bodies.rs"]
#[allow(dead_code)]
mod bodies;

use bodies::{HistoryQuery, ListQuery, PublishBody};
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;
use serde_json::value::RawValue;
use switchboard_protocol::command::check_idempotency_key;
use switchboard_protocol::filter::{check_tags, Tags, MAX_TAGS, MAX_TAG_KEY_BYTES, MAX_TAG_VALUE_BYTES};
use switchboard_protocol::message::{check_data, single_line};
use switchboard_protocol::validate_channel;

#[derive(Deserialize)]
#[allow(dead_code)]
struct PollQuery {
    ack: Option<u64>,
    timeout: Option<String>,
}

fn published(channel: &str, data: Box<RawValue>) {
    let _ = validate_channel(channel);
    if check_data(data.get()).is_ok() {
        let one = single_line(&data).unwrap_or(data);
        assert!(!one.get().contains(['\n', '\r']), "stored data is one line");
        assert!(serde_json::from_str::<serde_json::Value>(one.get()).is_ok(), "and still JSON");
    }
}

/// As the node checks a publish's key: a key that passes is 1-128 bytes of the documented
/// alphabet, so it can never reach outside its channel's Redis key (`P:{ch}:i:<key>`).
fn keyed(key: Option<String>) {
    if let Some(k) = key {
        if check_idempotency_key(&k).is_ok() {
            assert!((1..=128).contains(&k.len()) && !k.contains(['{', '}', ' ']));
        }
    }
}

/// As the node checks a publication's tags: tags that pass are within every bound.
fn tagged(tags: Option<Tags>) {
    if let Ok(Some(t)) = check_tags(tags) {
        assert!(!t.is_empty() && t.len() <= MAX_TAGS);
        assert!(t.iter().all(|(k, v)| (1..=MAX_TAG_KEY_BYTES).contains(&k.len()) && v.len() <= MAX_TAG_VALUE_BYTES));
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(body) = serde_json::from_slice::<PublishBody>(data) {
        match body {
            PublishBody { channel: Some(ch), data: Some(d), idempotency_key, tags, batch: None } => {
                keyed(idempotency_key);
                tagged(tags);
                published(&ch, d)
            }
            PublishBody { channel: None, data: None, idempotency_key: None, tags: None, batch: Some(items) } => {
                for p in items {
                    keyed(p.idempotency_key);
                    tagged(p.tags);
                    published(&p.channel, p.data);
                }
            }
            _ => {}
        }
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = serde_urlencoded::from_str::<ListQuery>(text);
    if let Ok(q) = serde_urlencoded::from_str::<HistoryQuery>(text) {
        let _ = q.limit.map(|l| l.min(10_000));
    }
    if let Ok(PollQuery { timeout: Some(t), .. }) = serde_urlencoded::from_str::<PollQuery>(text) {
        // As the poll handler: any number, however large or odd, is bounded without a panic.
        if let Ok(secs) = t.parse::<f64>() {
            if secs.is_finite() && secs >= 0.0 {
                let _ = std::time::Duration::try_from_secs_f64(secs.min(3600.0));
            }
        }
    }
    let _ = credentials::token_from_query(text);
    let bound = if data.first().is_some_and(|b| b & 1 == 1) { "0.0.0.0" } else { "127.0.0.1" };
    let names: Vec<String> = text.lines().skip(1).map(String::from).collect();
    let host = text.lines().next();
    let ok = credentials::host_allowed(host, bound.parse().unwrap(), &names);
    let plain_name = host.is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if host.is_none() || (plain_name && names.iter().any(|n| n == "*")) {
        assert!(ok, "no Host, or any name allowed");
    }
    if let (Some(h), true) = (host, names.is_empty()) {
        // Without names, a name is accepted only when it is loopback's own.
        let plain = h.trim().trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches(':').trim_end_matches('.');
        let plain = plain.to_ascii_lowercase();
        if ok && !plain.starts_with('[') && plain.parse::<std::net::IpAddr>().is_err() && !plain.is_empty() {
            assert!(
                plain == "localhost"
                    || plain.ends_with(".localhost")
                    || h.trim().parse::<std::net::IpAddr>().is_ok()
                    || h.trim().rsplit_once(':').is_some_and(|(a, _)| a.parse::<std::net::IpAddr>().is_ok()),
                "{h:?}"
            );
        }
    }
});
