//! Real Redis topologies for tests: one server, independent shards, a Redis Cluster with
//! replicas, a primary with replicas under Redis Sentinel. Every process is a real
//! `redis-server` (Debian package `redis-server`, `make redis-deps`) on a spare `127.0.0.1`
//! port, in its own scratch directory under [`std::env::temp_dir`], without persistence unless
//! asked, and killed by its PID (SIGKILL) when its owner is dropped. No mocks.
//!
//! The API is synchronous (std processes, the blocking `redis` connection) so that plain and
//! `#[tokio::test]` tests use it alike. Every wait is bounded and panics with what it was
//! waiting for and what it saw last: a test kit's failed setup step should stop the test.
//!
//! ```no_run
//! use switchboard_testkit::{key_slot, RedisCluster};
//! use std::time::Duration;
//!
//! let mut cluster = RedisCluster::start(3, 1);
//! let slot = key_slot("sb:{pt:a.b}:m");
//! let old = cluster.kill_primary_of_slot(slot);
//! let new = cluster.wait_failover(slot, Duration::from_secs(20));
//! assert_ne!(old, new);
//! ```
//!
//! # Layout
//! - `server`: [`RedisServer`], one process: start on a spare or given port, wait for `PING`,
//!   commands, kill -9, restart on the same port.
//! - `shards`: [`Shards`], independent servers and their comma-joined URLs.
//! - `cluster`: [`RedisCluster`], nodes joined by `redis-cli --cluster create`; who serves a
//!   slot, killing that primary, waiting for its replica to take over.
//! - `sentinel`: [`Sentinels`], a primary, its replicas and the sentinels; killing the primary,
//!   waiting for the sentinels to name another.
//! - `slot`: [`key_slot`], Redis Cluster's CRC16 slot of a key (hash tags included).
//! - `tls`: [`TlsRedis`], a server that also listens with TLS, with a throwaway CA made by
//!   `openssl`.
//! - `scratch`: [`Scratch`], a process's own directory, removed on drop.
//! - `port`: spare loopback ports (cluster nodes: with a free bus port), never handed out
//!   twice by one test process.
//! - `wait`: the bounded polling loop and `INFO` field reading everything above uses.

mod cluster;
mod port;
mod scratch;
mod sentinel;
mod server;
mod shards;
mod slot;
mod tls;
mod wait;

pub use cluster::{ClusterNode, RedisCluster, Role};
pub use scratch::Scratch;
pub use sentinel::Sentinels;
pub use server::RedisServer;
pub use shards::Shards;
pub use slot::{key_slot, SLOTS};
pub use tls::TlsRedis;
