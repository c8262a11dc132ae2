//! The write audit: every attempt to write to a plant device through this node — who, which
//! channel, how many bytes, which source, the outcome and how long it took — as one `info` log
//! line (target [`LOG_TARGET`]), an entry of a bounded ring read by `GET /api/writes`, and a
//! count by source and outcome (`switchboard_source_write_attempts_total`).
//!
//! The node that received the client's request audits the write, since only it knows who made
//! it; a write forwarded to the node that runs the source (`super::forward`) is audited there
//! once, with `forwarded: true`. Writes are rare next to publications: one mutex per structure
//! is enough.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use switchboard_protocol::code;

use crate::auth::{Identity, Method};
use crate::error::ApiError;

/// Entries the ring keeps; the oldest goes when a new one comes.
pub const CAPACITY: usize = 1_000;
/// The `tracing` target of the audit's log lines, so they can be routed on their own
/// (`SWITCHBOARD_LOG=info,switchboard::writes=info`).
pub const LOG_TARGET: &str = "switchboard::writes";

/// The outcomes of a write attempt, as logged, listed and counted.
pub const OUTCOMES: [&str; 8] =
    ["written", "refused", "unavailable", "bad", "forbidden", "too_large", "limited", "error"];

/// What a write's reply code means for the audit: 502 the device refused, 503 the source was
/// not available (or did not answer in time), 400 not a writable channel or value, 401 / 403
/// the caller may not write there, 413 over `limits.max_publication_bytes`, 429 over the
/// caller's publish rate; anything else is `error`.
pub fn outcome(result: &Result<(), ApiError>) -> &'static str {
    match result {
        Ok(()) => "written",
        Err(e) => match e.code {
            code::DEVICE_REFUSED => "refused",
            code::UNAVAILABLE => "unavailable",
            code::BAD_REQUEST => "bad",
            code::UNAUTHORIZED | code::FORBIDDEN => "forbidden",
            code::TOO_LARGE => "too_large",
            code::LIMIT => "limited",
            _ => "error",
        },
    }
}

/// Who makes a write, as the audit names them: `by` is the caller with its kind
/// ([`Identity::principal`]: `user:<name>`, `hook:<name>`, `key:api-key-<index>`, or
/// `anonymous` while the node has no authentication).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Author {
    pub by: String,
    /// How the caller authenticated: `token`, `password`, `hook`, `api_key` or `anonymous`.
    pub auth: &'static str,
}

impl Author {
    pub fn of(who: &Identity) -> Author {
        let auth = match who.method {
            Method::Anonymous => "anonymous",
            Method::Token => "token",
            Method::Password => "password",
            Method::Hook => "hook",
            Method::ApiKey(_) => "api_key",
        };
        Author { by: who.principal(), auth }
    }
}

/// One write attempt.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Entry {
    /// When the attempt arrived, unix ms.
    pub t: u64,
    #[serde(flatten)]
    pub author: Author,
    pub channel: String,
    /// Size of the written data as the caller sent it.
    pub bytes: usize,
    /// The source the channel's namespace writes to (`write_source`).
    pub source: String,
    /// Made by another node of the cluster, the one that runs the source.
    pub forwarded: bool,
    /// One of [`OUTCOMES`].
    pub outcome: &'static str,
    /// The reply's code: 200, or the error's.
    pub code: u16,
    /// The error's message (none when written).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// From the attempt's arrival to its answer, in milliseconds.
    pub latency_ms: f64,
}

/// The audit of one node: a ring of the last [`CAPACITY`] attempts and the counts of all.
#[derive(Default)]
pub struct Audit {
    ring: Mutex<VecDeque<Entry>>,
    /// Attempts by (source, outcome). Sources are those of the configuration, outcomes the
    /// fixed [`OUTCOMES`]: the map stays small.
    counts: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl Audit {
    /// Records one attempt: logs it, counts it, and keeps it in the ring. Every text field of
    /// the log line is quoted and escaped (`"`, `\\`, control characters, U+2028 / U+2029), so
    /// a name a client chose (a token's `sub`) can neither pass for other fields nor start a
    /// line of its own.
    pub fn record(&self, entry: Entry) {
        tracing::info!(
            target: LOG_TARGET,
            by = ?entry.author.by,
            auth = entry.author.auth,
            channel = ?entry.channel,
            bytes = entry.bytes,
            source = ?entry.source,
            forwarded = entry.forwarded,
            outcome = entry.outcome,
            code = entry.code,
            latency_ms = entry.latency_ms,
            message = ?entry.message.as_deref().unwrap_or(""),
            "write"
        );
        *self.counts.lock().entry((entry.source.clone(), entry.outcome)).or_insert(0) += 1;
        let mut ring = self.ring.lock();
        if ring.len() == CAPACITY {
            ring.pop_front();
        }
        ring.push_back(entry);
    }

    /// The newest `limit` entries, newest first.
    pub fn newest(&self, limit: usize) -> Vec<Entry> {
        self.ring.lock().iter().rev().take(limit).cloned().collect()
    }

    /// Prometheus text: attempts by source and outcome, every outcome of every source in
    /// `sources` (those a namespace writes to) present from the start, at 0.
    pub fn render(&self, sources: &[&str]) -> String {
        let name = "switchboard_source_write_attempts_total";
        let mut out = format!(
            "# HELP {name} Write attempts made through this node (the one that received the request), by outcome.\n\
             # TYPE {name} counter\n"
        );
        let counts = self.counts.lock();
        for source in sources {
            for outcome in OUTCOMES {
                let n = counts.get(&(source.to_string(), outcome)).copied().unwrap_or(0);
                let _ = writeln!(out, "{name}{{source=\"{source}\",outcome=\"{outcome}\"}} {n}");
            }
        }
        out
    }
}

/// Milliseconds of `d`, to the microsecond.
pub fn millis(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: usize, outcome: &'static str) -> Entry {
        Entry {
            t: i as u64,
            author: Author { by: "user:ana".into(), auth: "token" },
            channel: format!("cmd:set.{i}"),
            bytes: 2,
            source: "plant".into(),
            forwarded: false,
            outcome,
            code: 200,
            message: None,
            latency_ms: 1.0,
        }
    }

    #[test]
    fn audit_ring_keeps_the_newest_first_and_is_bounded() {
        let audit = Audit::default();
        for i in 0..CAPACITY + 5 {
            audit.record(entry(i, "written"));
        }
        let all = audit.newest(usize::MAX);
        assert_eq!(all.len(), CAPACITY);
        assert_eq!(all[0].t, (CAPACITY + 4) as u64);
        assert_eq!(all[CAPACITY - 1].t, 5);
        assert_eq!(audit.newest(2).iter().map(|e| e.t).collect::<Vec<_>>(), [CAPACITY as u64 + 4, CAPACITY as u64 + 3]);
    }

    #[test]
    fn audit_counts_by_source_and_outcome() {
        let audit = Audit::default();
        audit.record(entry(1, "written"));
        audit.record(entry(2, "too_large"));
        audit.record(entry(3, "too_large"));
        let text = audit.render(&["plant"]);
        assert!(text.contains("switchboard_source_write_attempts_total{source=\"plant\",outcome=\"written\"} 1\n"));
        assert!(text.contains("switchboard_source_write_attempts_total{source=\"plant\",outcome=\"too_large\"} 2\n"));
        assert!(text.contains("switchboard_source_write_attempts_total{source=\"plant\",outcome=\"refused\"} 0\n"));
    }

    #[test]
    fn audit_outcomes_follow_the_reply_codes() {
        let e = |c| Err(ApiError::new(c, "x"));
        assert_eq!(outcome(&Ok(())), "written");
        assert_eq!(outcome(&e(502)), "refused");
        assert_eq!(outcome(&e(503)), "unavailable");
        assert_eq!(outcome(&e(400)), "bad");
        assert_eq!(outcome(&e(401)), "forbidden");
        assert_eq!(outcome(&e(403)), "forbidden");
        assert_eq!(outcome(&e(413)), "too_large");
        assert_eq!(outcome(&e(429)), "limited");
        assert_eq!(outcome(&e(500)), "error");
    }

    #[test]
    fn audit_names_say_the_kind_of_caller() {
        let who = |method, user: &str| Identity { method, user: user.into(), ..Identity::anonymous() };
        let by = |method, user| Author::of(&who(method, user)).by;
        assert_eq!(
            Author::of(&who(Method::ApiKey(2), "api-key-2")),
            Author { by: "key:api-key-2".into(), auth: "api_key" }
        );
        assert_eq!(Author::of(&who(Method::Token, "ana")), Author { by: "user:ana".into(), auth: "token" });
        assert_eq!(by(Method::Password, "ben"), "user:ben");
        assert_eq!(by(Method::Hook, "cy"), "hook:cy");
        assert_eq!(Author::of(&Identity::anonymous()), Author { by: "anonymous".into(), auth: "anonymous" });
        // Names chosen to look like another kind keep their own kind.
        assert_eq!(by(Method::Token, "api-key-0"), "user:api-key-0");
        assert_eq!(by(Method::Token, "key:api-key-0"), "user:key:api-key-0");
        assert_eq!(by(Method::Token, "anonymous"), "user:anonymous");
    }
}
