//! The memory broker's idempotency keys: per channel, the keys of the last
//! [`crate::IDEMPOTENCY_WINDOW`] with the position each publication got, bounded per channel
//! ([`crate::MAX_KEYS_PER_CHANNEL`]) and per broker ([`crate::MAX_KEYS`]). Past a bound a keyed
//! publication is refused ([`crate::BrokerError::KeysFull`]), never published without its key:
//! a retry would then publish twice. Keys leave when their window ends — on the channel's next
//! publication, or at the broker's sweep ([`crate::Broker::forget_idle`]) for a quiet one.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::{BrokerError, Position, IDEMPOTENCY_WINDOW, MAX_KEYS, MAX_KEYS_PER_CHANNEL};

/// How long a caller refused by the broker-wide bound is told to wait: keys leave as their
/// windows end, found by the sweep that runs at least this often.
const BROKER_FULL_RETRY_S: u64 = 10;

/// A channel's keys: key → position, and the keys in the order they were taken (which is the
/// order they expire in), so that expiry costs nothing per publication beyond dropping what
/// passed the window.
#[derive(Default)]
pub(super) struct RecentKeys {
    positions: HashMap<Arc<str>, Position>,
    /// (expiry ms, key), oldest first.
    order: VecDeque<(u64, Arc<str>)>,
}

impl RecentKeys {
    /// Drops the keys whose window ended by `now`, giving their places back to `held`.
    pub(super) fn expire(&mut self, now: u64, held: &AtomicUsize) {
        let before = self.order.len();
        while let Some((expiry, old)) = self.order.front() {
            if *expiry > now {
                break;
            }
            self.positions.remove(old);
            self.order.pop_front();
        }
        held.fetch_sub(before - self.order.len(), Relaxed);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    /// The position of a publication taken with `key` whose window has not ended.
    pub(super) fn find(&mut self, key: &str, now: u64, held: &AtomicUsize) -> Option<Position> {
        self.expire(now, held);
        self.positions.get(key).cloned()
    }

    /// Whether one more key fits this channel and the broker (`held` keys in all); `Err` is
    /// the refusal, with when to try again.
    pub(super) fn room(&self, now: u64, held: &AtomicUsize) -> Result<(), BrokerError> {
        if self.order.len() >= MAX_KEYS_PER_CHANNEL {
            let oldest = self.order.front().map_or(now, |(expiry, _)| *expiry);
            return Err(BrokerError::KeysFull {
                message: format!("the channel holds its maximum of {MAX_KEYS_PER_CHANNEL} idempotency keys"),
                retry_after_s: oldest.saturating_sub(now).div_ceil(1000),
            });
        }
        if held.load(Relaxed) >= MAX_KEYS {
            return Err(BrokerError::KeysFull {
                message: format!("this node holds its maximum of {MAX_KEYS} idempotency keys"),
                retry_after_s: BROKER_FULL_RETRY_S,
            });
        }
        Ok(())
    }

    /// Keeps `key`, which [`RecentKeys::find`] did not find, for the window from `now` (after
    /// [`RecentKeys::room`]).
    pub(super) fn insert(&mut self, key: Arc<str>, position: Position, now: u64, held: &AtomicUsize) {
        let window = IDEMPOTENCY_WINDOW.as_millis() as u64;
        self.order.push_back((now + window, key.clone()));
        self.positions.insert(key, position);
        held.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64) -> Position {
        Position { epoch: "e".into(), offset }
    }

    #[test]
    fn broker_memory_idempotency_keys_expire_after_the_window() {
        let window = IDEMPOTENCY_WINDOW.as_millis() as u64;
        let held = AtomicUsize::new(0);
        let mut keys = RecentKeys::default();
        keys.insert("a".into(), at(1), 1_000, &held);
        keys.insert("b".into(), at(2), 2_000, &held);
        assert_eq!(held.load(Relaxed), 2);
        assert_eq!(keys.find("a", 1_000 + window - 1, &held), Some(at(1)));
        assert_eq!(keys.find("a", 1_000 + window, &held), None, "expired with its window");
        assert_eq!(keys.find("b", 1_000 + window, &held), Some(at(2)));
        assert_eq!(keys.find("b", 2_000 + window, &held), None);
        assert!(keys.positions.is_empty() && keys.order.is_empty(), "expired keys are dropped");
        assert_eq!(held.load(Relaxed), 0, "and their places given back");
    }

    #[test]
    fn broker_memory_idempotency_keys_are_bounded_per_channel_and_in_all() {
        let held = AtomicUsize::new(0);
        let mut keys = RecentKeys::default();
        for i in 0..MAX_KEYS_PER_CHANNEL {
            keys.insert(Arc::from(i.to_string()), at(i as u64), 1_000 + i as u64, &held);
        }
        match keys.room(2_000, &held) {
            Err(BrokerError::KeysFull { message, retry_after_s }) => {
                assert!(message.contains("the channel holds its maximum"), "{message}");
                assert_eq!(retry_after_s, IDEMPOTENCY_WINDOW.as_secs() - 1, "when the oldest key leaves");
            }
            other => panic!("expected the channel's bound, got {other:?}"),
        }
        let window = IDEMPOTENCY_WINDOW.as_millis() as u64;
        keys.expire(1_000 + window, &held);
        assert!(keys.room(1_000 + window, &held).is_ok(), "the oldest key left: room for one");
        let other = RecentKeys::default();
        held.store(MAX_KEYS, Relaxed);
        assert!(matches!(other.room(0, &held), Err(BrokerError::KeysFull { retry_after_s: BROKER_FULL_RETRY_S, .. })));
    }
}
