//! [`PresenceTable`]: who is present in which channel, for the memory broker.
//!
//! Indexed per channel and by client within a channel, so a join or leave costs O(1)
//! whatever the channel's size: a reconnect storm of N clients into one room is O(N), not the
//! O(N²) of scanning a member list per join. The table is split into shards by channel name,
//! each behind its own `parking_lot::Mutex` held only for that O(1) step (never across an
//! await), so joins in different channels rarely meet on a lock.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::ClientInfo;

/// Shards of the table; a power of two.
const SHARDS: usize = 32;

/// One channel's members: a list for reading out, an index for O(1) joins and leaves.
#[derive(Default)]
struct Members {
    list: Vec<ClientInfo>,
    /// Client id → its place in `list`.
    index: HashMap<String, usize>,
}

/// See the module docs.
pub(super) struct PresenceTable {
    hasher: RandomState,
    shards: Vec<Mutex<HashMap<Arc<str>, Members>>>,
}

impl Default for PresenceTable {
    fn default() -> PresenceTable {
        PresenceTable { hasher: RandomState::new(), shards: (0..SHARDS).map(|_| Mutex::default()).collect() }
    }
}

impl PresenceTable {
    fn shard(&self, channel: &str) -> &Mutex<HashMap<Arc<str>, Members>> {
        &self.shards[self.hasher.hash_one(channel) as usize & (SHARDS - 1)]
    }

    /// Adds `info` to `channel`; false when the client was present already.
    pub(super) fn add(&self, channel: &str, info: ClientInfo) -> bool {
        let mut shard = self.shard(channel).lock();
        let members = match shard.get_mut(channel) {
            Some(m) => m,
            None => shard.entry(Arc::from(channel)).or_default(),
        };
        if members.index.contains_key(&info.client) {
            return false;
        }
        members.index.insert(info.client.clone(), members.list.len());
        members.list.push(info);
        true
    }

    /// Removes `client` from `channel`, returning what it was present as.
    pub(super) fn remove(&self, channel: &str, client: &str) -> Option<ClientInfo> {
        let mut shard = self.shard(channel).lock();
        let members = shard.get_mut(channel)?;
        let i = members.index.remove(client)?;
        let info = members.list.swap_remove(i);
        if let Some(moved) = members.list.get(i) {
            members.index.insert(moved.client.clone(), i);
        }
        if members.list.is_empty() {
            shard.remove(channel);
        }
        Some(info)
    }

    /// The members of `channel`, in no particular order.
    pub(super) fn members(&self, channel: &str) -> Vec<ClientInfo> {
        self.shard(channel).lock().get(channel).map(|m| m.list.clone()).unwrap_or_default()
    }

    /// Whether anyone is present in `channel`.
    pub(super) fn contains(&self, channel: &str) -> bool {
        self.shard(channel).lock().contains_key(channel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(c: &str) -> ClientInfo {
        ClientInfo { client: c.into(), user: String::new() }
    }

    #[test]
    fn broker_memory_presence_index_survives_swaps() {
        let t = PresenceTable::default();
        for i in 0..100 {
            assert!(t.add("room:a", info(&format!("c{i}"))));
        }
        assert!(!t.add("room:a", info("c5")), "present already");
        for i in (0..100).step_by(3) {
            assert_eq!(t.remove("room:a", &format!("c{i}")).unwrap().client, format!("c{i}"));
        }
        assert!(t.remove("room:a", "c0").is_none());
        let mut left: Vec<String> = t.members("room:a").into_iter().map(|c| c.client).collect();
        left.sort();
        let mut want: Vec<String> = (0..100).filter(|i| i % 3 != 0).map(|i| format!("c{i}")).collect();
        want.sort();
        assert_eq!(left, want);
        for c in want {
            assert!(t.remove("room:a", &c).is_some());
        }
        assert!(!t.contains("room:a") && t.members("room:a").is_empty());
    }
}
