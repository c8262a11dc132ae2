//! Record sets ([`crate::Broker::record_put`], [`crate::Broker::records`]): small named sets of
//! entries that every node of a cluster shares, each entry kept until its own expiry. A node's
//! revocation list lives in one, so that a node started at any time reads exactly the entries
//! that still hold, and an entry sent again and again is still one entry.
//!
//! An entry is a key, a value and an expiry (unix ms). Putting a key that is there keeps the
//! later of the two expiries, with its value: a repeat, or the same key with an earlier expiry,
//! changes nothing. A set holds at most `max` live entries: when it is full, the entries past
//! their expiry leave first, and if none has, the put is refused with the time the soonest
//! entry leaves (a caller says when to try again; nothing that still holds is forgotten).
//!
//! [`RecordSets`] is the memory broker's table; the Redis broker keeps a set as a hash and a
//! sorted set of expiries (`redis::records`) with the same rules in one script.

use std::collections::HashMap;

use parking_lot::Mutex;

/// One live entry of a record set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: String,
    pub value: String,
    /// Unix milliseconds.
    pub expires_ms: u64,
}

/// What [`crate::Broker::record_put`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordPut {
    /// The entry is new, or now expires later than it did.
    Stored,
    /// The key was there with the same or a later expiry: nothing changed.
    Kept,
    /// The set holds its maximum of live entries; the soonest leaves at `frees_ms` (unix ms).
    Full { frees_ms: u64 },
}

/// One set's entries: key → (value, expiry ms).
type Entries = HashMap<String, (String, u64)>;

/// Record sets in memory, by name.
#[derive(Default)]
pub(crate) struct RecordSets {
    sets: Mutex<HashMap<String, Entries>>,
}

impl RecordSets {
    pub(crate) fn put(&self, set: &str, entry: &Record, now_ms: u64, max: usize) -> RecordPut {
        let mut sets = self.sets.lock();
        let entries = sets.entry(set.to_string()).or_default();
        if let Some((_, e)) = entries.get(&entry.key) {
            if *e >= entry.expires_ms {
                return RecordPut::Kept;
            }
        } else if entries.len() >= max {
            entries.retain(|_, (_, e)| *e > now_ms);
            if entries.len() >= max {
                let frees_ms = entries.values().map(|(_, e)| *e).min().unwrap_or(now_ms);
                return RecordPut::Full { frees_ms };
            }
        }
        entries.insert(entry.key.clone(), (entry.value.clone(), entry.expires_ms));
        RecordPut::Stored
    }

    /// The entries of `set` that expire after `now_ms`; forgets the others.
    pub(crate) fn live(&self, set: &str, now_ms: u64) -> Vec<Record> {
        let mut sets = self.sets.lock();
        let Some(entries) = sets.get_mut(set) else { return Vec::new() };
        entries.retain(|_, (_, e)| *e > now_ms);
        let out =
            entries.iter().map(|(k, (v, e))| Record { key: k.clone(), value: v.clone(), expires_ms: *e }).collect();
        if entries.is_empty() {
            sets.remove(set);
        }
        out
    }
}
