//! [`ShardedRedisBroker`]: channels spread over several independent Redis servers.
//!
//! `--broker "redis://a:6379,redis://b:6379,redis://c:6379"`. A channel lives on exactly one
//! shard, chosen by a stable hash of its name ([`shard_of`]): its offset, history, last value,
//! presence and pub/sub all stay there, so every per-channel guarantee of [`RedisBroker`]
//! holds unchanged. Each shard is a full [`RedisBroker`] with its own command connection and
//! one pub/sub connection, so a publication costs the same whatever the number of shards, and
//! capacity grows with the Redis cores given.
//!
//! Every node must list the same servers in the same order: the order is the shard number.
//! Adding a server moves about 1/(n+1) of the channels (jump consistent hashing); a moved
//! channel starts a new epoch on its new shard, so its recovering clients learn
//! `complete: false` rather than miss publications.
//!
//! A shard that goes down takes only its channels with it: `/readyz` turns 503, the subscribers
//! of its channels are told to recover (4008) and publishing to them fails, while channels on
//! the other shards keep streaming.

use std::sync::Arc;

use crate::redis::RedisBroker;
use crate::{
    Broker, BrokerError, BrokerHandler, ChannelPage, ChannelQuery, ChannelTtl, ClientInfo, ClusterInfo, Data,
    HistoryPolicy, HistoryResult, Outgoing, Position, Publication, TrendBucket, TrendPolicy,
};

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

/// Several Redis servers, each holding the channels that hash to it.
pub struct ShardedRedisBroker {
    shards: Vec<RedisBroker>,
}

impl ShardedRedisBroker {
    /// Connects to every URL of a comma-separated list (each as [`RedisBroker::new`]).
    pub fn new(urls: &str) -> Result<ShardedRedisBroker, BrokerError> {
        let shards = urls.split(',').map(|u| RedisBroker::new(u.trim())).collect::<Result<Vec<_>, _>>()?;
        Ok(ShardedRedisBroker { shards })
    }

    fn shard(&self, channel: &str) -> &RedisBroker {
        &self.shards[shard_of(channel, self.shards.len())]
    }
}

#[async_trait::async_trait]
impl Broker for ShardedRedisBroker {
    fn kind(&self) -> &'static str {
        "redis-sharded"
    }

    fn set_handler(&self, handler: Arc<dyn BrokerHandler>) {
        for s in &self.shards {
            s.set_handler(handler.clone());
        }
    }

    fn set_node_id(&self, id: &str) {
        for s in &self.shards {
            s.set_node_id(id);
        }
    }

    fn set_channel_ttl(&self, keep: ChannelTtl) {
        for s in &self.shards {
            s.set_channel_ttl(keep.clone());
        }
    }

    async fn publish(&self, channel: &str, data: Data, policy: HistoryPolicy) -> Result<Position, BrokerError> {
        self.shard(channel).publish(channel, data, policy).await
    }

    /// Splits the batch by shard (keeping item order within each) and publishes every shard's
    /// part at once: one round trip per shard, in parallel.
    async fn publish_batch(&self, items: Vec<Outgoing>) -> Vec<Result<Position, BrokerError>> {
        let n = self.shards.len();
        let mut parts: Vec<Vec<Outgoing>> = vec![Vec::new(); n];
        let mut placed = Vec::with_capacity(items.len());
        for item in items {
            let s = shard_of(&item.channel, n);
            placed.push(s);
            parts[s].push(item);
        }
        let calls = self.shards.iter().zip(parts).map(|(shard, part)| shard.publish_batch(part));
        let mut answers: Vec<std::vec::IntoIter<Result<Position, BrokerError>>> =
            futures_util::future::join_all(calls).await.into_iter().map(Vec::into_iter).collect();
        placed
            .into_iter()
            .map(|s| {
                answers[s]
                    .next()
                    .unwrap_or_else(|| Err(BrokerError::Unavailable("shard returned too few results".into())))
            })
            .collect()
    }

    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
        self.shard(channel).subscribe(channel).await
    }

    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
        self.shard(channel).unsubscribe(channel).await
    }

    async fn last(&self, channel: &str) -> Result<(Position, Option<Publication>), BrokerError> {
        self.shard(channel).last(channel).await
    }

    async fn peek(&self, channel: &str) -> Result<Option<(Position, Option<Publication>)>, BrokerError> {
        self.shard(channel).peek(channel).await
    }

    async fn history(
        &self,
        channel: &str,
        since: Option<&Position>,
        limit: usize,
    ) -> Result<HistoryResult, BrokerError> {
        self.shard(channel).history(channel, since, limit).await
    }

    async fn trend(&self, channel: &str, policy: TrendPolicy, since_ms: u64) -> Result<Vec<TrendBucket>, BrokerError> {
        self.shard(channel).trend(channel, policy, since_ms).await
    }

    async fn presence_add(&self, channel: &str, info: ClientInfo) -> Result<(), BrokerError> {
        self.shard(channel).presence_add(channel, info).await
    }

    async fn presence_remove(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        self.shard(channel).presence_remove(channel, client).await
    }

    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        self.shard(channel).presence(channel).await
    }

    /// Shard after shard, each in `SCAN` order.
    async fn channels(&self, query: &ChannelQuery<'_>) -> Result<ChannelPage, BrokerError> {
        let parts: Vec<&RedisBroker> = self.shards.iter().collect();
        crate::redis::page_over(&parts, query).await
    }

    /// Every shard is ready (and has the node registered, once it told its id).
    async fn ready(&self) -> bool {
        futures_util::future::join_all(self.shards.iter().map(|s| s.ready())).await.into_iter().all(|r| r)
    }

    /// The slowest shard's.
    fn round_trip(&self) -> Option<std::time::Duration> {
        self.shards.iter().filter_map(|s| s.round_trip()).max()
    }

    /// On the shard the lease's name hashes to, as a channel of that name would.
    async fn lease(&self, name: &str, holder: &str, ttl: std::time::Duration) -> Result<bool, BrokerError> {
        self.shard(name).lease(name, holder, ttl).await
    }

    async fn lease_release(&self, name: &str, holder: &str) -> Result<(), BrokerError> {
        self.shard(name).lease_release(name, holder).await
    }

    /// Every node registers on every shard (under its id only, once told it); a channel's
    /// subscriber counts live on its shard. A shard that cannot be reached is left out of the
    /// figures.
    async fn cluster(&self) -> Result<Option<ClusterInfo>, BrokerError> {
        ClusterInfo::merge(futures_util::future::join_all(self.shards.iter().map(|s| s.cluster())).await)
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
