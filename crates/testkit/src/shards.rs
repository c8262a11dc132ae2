//! [`Shards`]: independent servers, as a sharded broker sees them.

use crate::server::RedisServer;

/// `n` independent [`RedisServer`]s, each on its own spare port; all killed on drop.
#[derive(Debug)]
pub struct Shards {
    servers: Vec<RedisServer>,
}

impl Shards {
    /// Starts `n` servers one after the other; returns once each answers `PING`.
    pub fn start(n: usize) -> Shards {
        Shards { servers: (0..n).map(|_| RedisServer::start()).collect() }
    }

    /// `redis://127.0.0.1:A/0,redis://127.0.0.1:B/0,...` in start order.
    pub fn urls_joined(&self) -> String {
        self.servers.iter().map(RedisServer::url).collect::<Vec<_>>().join(",")
    }

    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// Mutable access, to kill or restart one shard.
    pub fn servers_mut(&mut self) -> &mut [RedisServer] {
        &mut self.servers
    }
}
