//! What a long-poll session keeps in the broker's session store
//! ([`switchboard_broker::sessions`]) so that any node can continue it: its [`Record`].
//!
//! A record holds what cannot be re-read from the broker: the session's subscriptions with the
//! position the client will be at once it has everything it was sent or is about to be sent,
//! the replies it has not been sent yet, the number of the last batch it was sent, and who the
//! client is. Publications are not stored — a node that takes a session over recovers them
//! from history, starting at the stored positions. The store keeps the record as JSON beside
//! its version, and writes it only over the version the writer read (compare-and-set), so a
//! node that lost a session to another learns it on its next write instead of overwriting the
//! newer state.

use serde::{Deserialize, Serialize};
use switchboard_broker::{BrokerError, StoredSession};

use crate::auth::StoredIdentity;

/// A failed store operation (the broker unreachable, a corrupt record).
#[derive(Debug, thiserror::Error)]
#[error("poll session store: {0}")]
pub struct StoreError(pub String);

impl From<BrokerError> for StoreError {
    fn from(e: BrokerError) -> StoreError {
        StoreError(e.to_string())
    }
}

/// A channel's position in a stored session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSub {
    pub ch: String,
    pub epoch: String,
    pub off: u64,
}

/// A session's stored state. See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Bumped by every write; the compare-and-set token (the store keeps it beside the JSON).
    pub version: u64,
    /// The node holding the session's live copy; empty when none does.
    pub owner: String,
    pub identity: StoredIdentity,
    /// Number of the last batch sent to the client.
    pub seq: u64,
    /// Subscriptions, in subscription order.
    pub subs: Vec<StoredSub>,
    /// Replies (JSON messages) not yet in a batch.
    pub queued: Vec<String>,
}

impl Record {
    /// The record as the store keeps it.
    pub fn stored(&self) -> Result<StoredSession, StoreError> {
        let data = serde_json::to_string(self).map_err(|e| StoreError(e.to_string()))?;
        Ok(StoredSession { version: self.version, data })
    }

    /// The record the store kept, with the store's version.
    pub fn from_stored(s: StoredSession) -> Result<Record, StoreError> {
        let record: Record =
            serde_json::from_str(&s.data).map_err(|e| StoreError(format!("corrupt session record: {e}")))?;
        Ok(Record { version: s.version, ..record })
    }
}

/// Whether `id` has the form of a session id ([`random_id`]). Clients name sessions in URLs;
/// an id of another form names no session and never reaches the store, whose keys take the id
/// as their hash tag.
pub fn is_session_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// 128 random bits in hex: session ids.
pub fn random_id() -> String {
    let mut b = [0u8; 16];
    if getrandom::getrandom(&mut b).is_err() {
        // No OS randomness (never seen on the supported platforms): fall back to the
        // process's generator rather than refusing service.
        for x in b.iter_mut() {
            *x = fastrand::u8(..);
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_session_ids_are_random_hex() {
        assert!(random_id().len() == 32 && random_id() != random_id());
        assert!(is_session_id(&random_id()));
        assert!(!is_session_id("}0123456789abcdef0123456789abcde") && !is_session_id("abc"));
    }

    #[test]
    fn poll_records_round_trip_through_the_store_with_its_version() {
        let rec = Record {
            version: 3,
            owner: "n1".into(),
            seq: 7,
            subs: vec![StoredSub { ch: "a".into(), epoch: "e".into(), off: 4 }],
            queued: vec![r#"{"id":1,"ok":{}}"#.into()],
            ..Record::default()
        };
        let stored = rec.stored().unwrap();
        assert_eq!(stored.version, 3);
        assert_eq!(Record::from_stored(stored.clone()).unwrap(), rec);
        let bumped = StoredSession { version: 4, ..stored };
        assert_eq!(Record::from_stored(bumped).unwrap().version, 4, "the store's version counts");
        let corrupt = StoredSession { version: 1, data: "{".into() };
        assert!(Record::from_stored(corrupt).unwrap_err().to_string().contains("corrupt"));
    }
}
