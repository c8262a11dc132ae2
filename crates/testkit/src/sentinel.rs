//! [`Sentinels`]: a primary, its replicas and the Redis Sentinels watching them.

use std::sync::Arc;
use std::time::Duration;

use crate::server::{Argv, PortChoice, RedisServer};
use crate::wait::{field, until};

/// How long replicas may take to finish their first sync.
const SYNC_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the sentinels may take to find each other (hello messages every 2 s) and the
/// replicas.
const WATCH_TIMEOUT: Duration = Duration::from_secs(30);

/// A primary, `n` replicas (`--replicaof`) and `s` `redis-server sentinel.conf --sentinel`
/// processes monitoring the primary under one name, with quorum `s / 2 + 1`,
/// `down-after-milliseconds 1000`, `failover-timeout 3000` and `parallel-syncs 1`. Every
/// process has a spare port and its own scratch directory; all are killed on drop, the
/// sentinels first.
pub struct Sentinels {
    // Field order is drop order: the sentinels go first, so none reconfigures a server that
    // is being stopped.
    sentinels: Vec<RedisServer>,
    /// The primary passed to [`Sentinels::start`], then the replicas, in start order.
    data: Vec<RedisServer>,
    name: String,
}

impl Sentinels {
    /// Takes `primary` over, starts `replicas` replicas of it and waits until each has synced
    /// (`master_link_status:up`), then starts `sentinels` sentinels monitoring it as `name` and
    /// waits until each knows the other sentinels and every replica.
    pub fn start(primary: RedisServer, replicas: usize, sentinels: usize, name: &str) -> Sentinels {
        assert!(sentinels >= 1, "a sentinel set needs at least one sentinel");
        let primary_port = primary.port();
        let of = primary_port.to_string();
        let mut data = vec![primary];
        data.extend((0..replicas).map(|_| RedisServer::start_with(&["--replicaof", "127.0.0.1", &of])));
        until(&format!("{replicas} replicas of :{primary_port} to sync"), SYNC_TIMEOUT, || {
            for replica in &data[1..] {
                let info = replica.info("replication")?;
                let link = field(&info, "master_link_status");
                if link != Some("up") {
                    return Err(format!("replica :{} master_link_status {link:?}", replica.port()));
                }
            }
            Ok(())
        });
        let argv = sentinel_argv(name, primary_port, sentinels / 2 + 1);
        let sentinels =
            (0..sentinels).map(|_| RedisServer::launch("sentinel", PortChoice::Spare, argv.clone())).collect();
        let set = Sentinels { sentinels, data, name: name.to_string() };
        set.wait_watching(replicas);
        set
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,…/NAME` over every sentinel; `name` need
    /// not be the monitored one (to test an unknown name).
    pub fn url(&self, name: &str) -> String {
        let addrs: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port())).collect();
        format!("redis+sentinel://{}/{name}", addrs.join(","))
    }

    /// The name the sentinels monitor the primary under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The port of the primary, as the first running sentinel that answers
    /// `SENTINEL get-master-addr-by-name` reports it.
    pub fn current_primary(&self) -> u16 {
        let mut last = String::from("no running sentinel");
        for sentinel in self.sentinels.iter().filter(|s| s.is_running()) {
            match self.primary_seen_by(sentinel) {
                Ok(port) => return port,
                Err(e) => last = e,
            }
        }
        panic!("no sentinel names the primary of {}: {last}", self.name)
    }

    /// kill -9 of the current primary; returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.current_primary();
        let server = self.server_mut(port).unwrap_or_else(|| panic!("the primary :{port} is not ours"));
        server.kill();
        port
    }

    /// Waits until every running sentinel reports the same primary, not `old_port`, and that
    /// server answers `ROLE` as master; returns its port. Panics after `timeout`.
    pub fn wait_failover(&self, old_port: u16, timeout: Duration) -> u16 {
        until(&format!("the sentinels to replace the primary :{old_port}"), timeout, || {
            let mut agreed = None;
            for sentinel in self.sentinels.iter().filter(|s| s.is_running()) {
                let seen = self.primary_seen_by(sentinel)?;
                if seen == old_port {
                    return Err(format!("sentinel :{} still names :{old_port}", sentinel.port()));
                }
                match agreed {
                    Some(p) if p != seen => return Err(format!("sentinels disagree: :{p} and :{seen}")),
                    _ => agreed = Some(seen),
                }
            }
            let port = agreed.ok_or("no running sentinel")?;
            let server = self.server(port).ok_or(format!("the sentinels name :{port}, not ours"))?;
            match server.role()?.as_str() {
                "master" => Ok(port),
                r => Err(format!("the new primary :{port} answers ROLE {r}")),
            }
        })
    }

    /// The primary and its replicas, in start order (the first one is the primary passed to
    /// [`Sentinels::start`], whatever its role now).
    pub fn servers(&self) -> &[RedisServer] {
        &self.data
    }

    /// The sentinel processes, in start order.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The primary or replica on `port`.
    pub fn server(&self, port: u16) -> Option<&RedisServer> {
        self.data.iter().find(|s| s.port() == port)
    }

    /// The primary or replica on `port`, to kill or restart it.
    pub fn server_mut(&mut self, port: u16) -> Option<&mut RedisServer> {
        self.data.iter_mut().find(|s| s.port() == port)
    }

    fn primary_seen_by(&self, sentinel: &RedisServer) -> Result<u16, String> {
        let addr: Option<(String, u16)> = sentinel
            .try_cmd(redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(&self.name))
            .map_err(|e| format!("sentinel :{}: {e}", sentinel.port()))?;
        addr.map(|(_, port)| port).ok_or(format!("sentinel :{} does not know {}", sentinel.port(), self.name))
    }

    /// Until each sentinel sees the primary up, every other sentinel and `replicas` replicas
    /// that it has reached: before that, a failover could not gather its quorum or would find
    /// no replica to promote.
    fn wait_watching(&self, replicas: usize) {
        let others = (self.sentinels.len() - 1).to_string();
        let replicas_s = replicas.to_string();
        until(&format!("{} sentinels to watch {}", self.sentinels.len(), self.name), WATCH_TIMEOUT, || {
            for sentinel in &self.sentinels {
                let port = sentinel.port();
                let master: Vec<String> = sentinel
                    .try_cmd(redis::cmd("SENTINEL").arg("MASTER").arg(&self.name))
                    .map_err(|e| format!("sentinel :{port}: {e}"))?;
                let get = |key: &str| master.chunks(2).find(|kv| kv[0] == key).and_then(|kv| kv.get(1)).cloned();
                let (flags, n_sentinels, n_replicas) = (get("flags"), get("num-other-sentinels"), get("num-slaves"));
                if flags.as_deref() != Some("master")
                    || n_sentinels.as_deref() != Some(others.as_str())
                    || n_replicas.as_deref() != Some(replicas_s.as_str())
                {
                    return Err(format!(
                        "sentinel :{port}: flags {flags:?}, {n_sentinels:?} other sentinels, {n_replicas:?} replicas"
                    ));
                }
                let entries: Vec<Vec<String>> = sentinel
                    .try_cmd(redis::cmd("SENTINEL").arg("REPLICAS").arg(&self.name))
                    .map_err(|e| format!("sentinel :{port}: {e}"))?;
                for entry in entries {
                    let flags = entry.chunks(2).find(|kv| kv[0] == "flags").and_then(|kv| kv.get(1)).cloned();
                    if flags.as_deref() != Some("slave") {
                        return Err(format!("sentinel :{port} sees a replica with flags {flags:?}"));
                    }
                }
            }
            Ok(())
        });
    }
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinels")
            .field("name", &self.name)
            .field("servers", &self.data)
            .field("sentinels", &self.sentinels)
            .finish()
    }
}

/// `<scratch>/sentinel.conf --sentinel`. The file is written on the first start only: a
/// sentinel rewrites it with what it learned, and a restart should keep that.
fn sentinel_argv(name: &str, primary: u16, quorum: usize) -> Argv {
    let name = name.to_string();
    Arc::new(move |port, dir| {
        let conf = dir.join("sentinel.conf");
        if !conf.exists() {
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {name} 127.0.0.1 {primary} {quorum}\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 3000\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = dir.display()
            );
            std::fs::write(&conf, text).unwrap_or_else(|e| panic!("write {}: {e}", conf.display()));
        }
        vec![conf.display().to_string(), "--sentinel".into()]
    })
}
