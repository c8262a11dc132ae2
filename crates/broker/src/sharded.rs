//! [`ShardedRedisBroker`]: channels spread over several independent Redis servers.
//!
//! `--broker "redis://a:6379,redis://b:6379,redis://c:6379"`. A channel lives on exactly one
//! shard, chosen by a stable hash of its name ([`shard_of`]): its offset, history, last value,
//! presence and pub/sub all stay there, so every per-channel guarantee of [`RedisBroker`]
//! holds unchanged. The broker is a [`RoutedBroker`] whose router, [`HashShards`], holds a
//! full [`RedisBroker`] per shard with its own command connection and one pub/sub connection,
//! so a publication costs the same whatever the number of shards, and capacity grows with the
//! Redis cores given.
//!
//! Every node must list the same servers in the same order: the order is the shard number.
//! Adding a server moves about 1/(n+1) of the channels (jump consistent hashing); a moved
//! channel starts a new epoch on its new shard, so its recovering clients learn
//! `complete: false` rather than miss publications.
//!
//! A shard that goes down takes only its channels with it: `/readyz` turns 503, the subscribers
//! of its channels are told to recover (4008) and publishing to them fails, while channels on
//! the other shards keep streaming.
//!
//! Long-poll sessions and the notices between nodes about them ([`crate::sessions`]) all live on
//! the first shard: sessions are few and small, and that is where every node of the cluster
//! looks for them.

use std::borrow::Cow;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::redis::RedisBroker;
use crate::routed::{Route, RoutedBroker, Router, Settings};
use crate::sessions::{SessionNotice, SessionStore};
use crate::BrokerError;

/// The shard (0..`shards`) of a channel: jump consistent hash of the FNV-1a hash of its name.
/// Stable across processes, versions and machines.
pub fn shard_of(channel: &str, shards: usize) -> usize {
    let mut key =
        channel.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    // Jump consistent hash: follow the key's pseudo-random jumps until one passes `shards`.
    let (mut b, mut j): (i64, i64) = (-1, 0);
    let n = shards.max(1) as i64;
    while j < n {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as usize
}

/// The [`Router`] of hash shards: the shard of a channel is [`shard_of`] its name.
pub struct HashShards {
    shards: Vec<Arc<RedisBroker>>,
}

/// Several Redis servers, each holding the channels that hash to it.
pub type ShardedRedisBroker = RoutedBroker<HashShards>;

impl RoutedBroker<HashShards> {
    /// Connects to every URL of a comma-separated list (each as [`RedisBroker::new`]).
    pub fn new(urls: &str) -> Result<ShardedRedisBroker, BrokerError> {
        let shards = urls.split(',').map(|u| RedisBroker::new(u.trim()).map(Arc::new)).collect::<Result<_, _>>()?;
        // Every shard exists from the start: settings reach them all through the fan-out.
        Ok(RoutedBroker::with_router(HashShards { shards }, Arc::new(Settings::default())))
    }
}

impl Router for HashShards {
    const KIND: &'static str = "redis-sharded";
    const MOVES: bool = false;

    fn route(&self, channel: &str) -> Result<Route<'_>, BrokerError> {
        Ok(Cow::Borrowed(&self.shards[shard_of(channel, self.shards.len())]))
    }

    /// In shard order.
    fn targets(&self) -> Vec<Arc<RedisBroker>> {
        self.shards.clone()
    }

    /// A shard's channels stay with it: nothing to follow.
    async fn refresh(&self) {}

    /// The first shard (a list names at least one).
    fn session_route(&self, _id: &str) -> Result<Route<'_>, BrokerError> {
        Ok(Cow::Borrowed(&self.shards[0]))
    }

    /// On the first shard, where notices are sent.
    fn listen(&self, node: &str) -> mpsc::UnboundedReceiver<SessionNotice> {
        self.shards[0].listen(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_sharded_hash_is_stable_and_even() {
        // Pinned values: every node of a cluster (and every version) must agree.
        assert_eq!(shard_of("pt:plant1.boiler.temp", 1), 0);
        let pinned: Vec<usize> =
            ["a", "room:42", "pt:x.y", "b", "c", "d", "e", "f"].iter().map(|c| shard_of(c, 3)).collect();
        assert_eq!(pinned, [2, 2, 2, 0, 0, 0, 2, 2]);
        let mut counts = [0usize; 3];
        for i in 0..30_000 {
            counts[shard_of(&format!("bench:streams.{i}"), 3)] += 1;
        }
        for c in counts {
            assert!((9_000..=11_000).contains(&c), "uneven: {counts:?}");
        }
        // Growing from 3 to 4 shards moves only about a quarter of the channels, all to the new one.
        let moved: Vec<usize> = (0..10_000)
            .map(|i| format!("c{i}"))
            .filter(|c| shard_of(c, 3) != shard_of(c, 4))
            .map(|c| shard_of(&c, 4))
            .collect();
        assert!((2_000..3_000).contains(&moved.len()), "{} moved", moved.len());
        assert!(moved.iter().all(|&s| s == 3));
    }
}
