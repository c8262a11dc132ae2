//! What a node keeps for the cluster beside channels: *tables* (keys to values, kept until
//! removed) and *logs* (entries appended in time order, read newest first, bounded by count
//! and age). The alarm engine keeps its alarms' states and definitions in tables and its
//! journal in a log, so that whichever node evaluates the alarms next goes on from them.
//!
//! Redis keeps a table as a hash and a log as a stream (`redis::kept`); the memory broker
//! keeps them in its directory when it was given one ([`crate::MemoryBroker::keeping_in`]),
//! in memory otherwise (`memory::kept`). A log entry's cursor is the time it was appended
//! and a sequence, `<unix ms>-<n>` (a Redis stream id), increasing within a log.

use std::cmp::Ordering;
use std::fmt;

/// Most bytes of one table value or log entry: what a node keeps is small state, not data.
pub const MAX_KEPT_BYTES: usize = 64 * 1024;

/// How much of a log is kept: at most `max_entries` (within one part of the store, see the
/// implementations) and nothing older than `max_age_ms` (0: no age bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogKeep {
    pub max_entries: usize,
    pub max_age_ms: u64,
}

/// One log entry: where it stands and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub cursor: String,
    pub entry: String,
}

/// A parsed cursor, `<ms>-<n>`: ordered by time, then sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cursor {
    pub ms: u64,
    pub seq: u64,
}

impl Cursor {
    /// `None` for text that is not `<ms>-<n>` (or a bare `<ms>`, which is `<ms>-0`).
    pub fn parse(s: &str) -> Option<Cursor> {
        let (ms, seq) = s.split_once('-').unwrap_or((s, "0"));
        Some(Cursor { ms: ms.parse().ok()?, seq: seq.parse().ok()? })
    }

    /// The cursor after `self` for an entry appended at `now_ms` (a clock that went back
    /// still gets a later cursor).
    pub fn next(self, now_ms: u64) -> Cursor {
        match now_ms.cmp(&self.ms) {
            Ordering::Greater => Cursor { ms: now_ms, seq: 0 },
            _ => Cursor { ms: self.ms, seq: self.seq + 1 },
        }
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// Whether `name` may name a table or log: 1–128 of `[A-Za-z0-9_.-]`, so that it is a safe
/// file name and Redis key part everywhere.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && !name.starts_with('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_cursors_order_by_time_then_sequence_and_never_go_back() {
        let c = Cursor::parse("1700-3").unwrap();
        assert_eq!(c, Cursor { ms: 1700, seq: 3 });
        assert_eq!(Cursor::parse("1700"), Some(Cursor { ms: 1700, seq: 0 }));
        assert_eq!(Cursor::parse("x-1"), None);
        assert!(Cursor::parse("1700-4").unwrap() > c);
        assert!(Cursor::parse("1701-0").unwrap() > c);
        assert_eq!(c.next(1800), Cursor { ms: 1800, seq: 0 });
        assert_eq!(c.next(1700), Cursor { ms: 1700, seq: 4 });
        assert_eq!(c.next(1000), Cursor { ms: 1700, seq: 4 }, "a clock gone back");
        assert_eq!(c.to_string(), "1700-3");
        assert!(valid_name("alarms.state") && !valid_name("../x") && !valid_name("") && !valid_name("a b"));
    }
}
