//! [`RedisCluster`]: a Redis Cluster of real nodes, formed with `redis-cli --cluster create`.

use std::fs::File;
use std::io::ErrorKind;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scratch::Scratch;
use crate::server::{data_argv, Argv, PortChoice, RedisServer};
use crate::wait::{field, until};

/// How long `redis-cli --cluster create` may run (it polls once a second until the nodes
/// agree on the configuration).
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long, after the create, until every node reports `cluster_state:ok` and every replica
/// has synced.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// What a node is now, as its `ROLE` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Primary,
    Replica,
    /// Killed by the kit, or not answering.
    Down,
}

/// One node of a [`RedisCluster`], as seen when [`RedisCluster::nodes`] was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterNode {
    pub port: u16,
    pub pid: u32,
    pub role: Role,
}

/// `primaries × (1 + replicas_per_primary)` `redis-server --cluster-enabled yes` nodes on
/// `127.0.0.1`, with `--cluster-node-timeout 1000` so that a killed primary is replaced within
/// seconds. Each node has a spare port whose cluster bus port (+10000) was free too, and its
/// own scratch directory holding `nodes.conf`. All nodes are killed on drop.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    // Holds the output of `redis-cli --cluster create`.
    _scratch: Scratch,
}

impl RedisCluster {
    /// Starts the nodes, joins them with `redis-cli --cluster create … --cluster-replicas R
    /// --cluster-yes` and returns once every node reports `cluster_state:ok`, knows every
    /// other node, and every replica's link to its primary is up. At least 3 primaries
    /// (`redis-cli` refuses fewer).
    pub fn start(primaries: usize, replicas_per_primary: usize) -> RedisCluster {
        assert!(primaries >= 3, "a Redis Cluster needs at least 3 primaries, not {primaries}");
        let total = primaries * (1 + replicas_per_primary);
        let nodes: Vec<RedisServer> =
            (0..total).map(|_| RedisServer::launch("cluster", PortChoice::SpareWithBus, cluster_argv())).collect();
        let scratch = Scratch::new("cluster-create");
        create(&nodes, replicas_per_primary, &scratch);
        let cluster = RedisCluster { nodes, _scratch: scratch };
        cluster.wait_formed(primaries, replicas_per_primary);
        cluster
    }

    /// `redis+cluster://127.0.0.1:P1`, P1 the port of the first node started (a primary when
    /// the cluster was created).
    pub fn seed_url(&self) -> String {
        format!("redis+cluster://127.0.0.1:{}", self.nodes[0].port())
    }

    /// Every node in start order, with its role now (asked with `ROLE`).
    pub fn nodes(&self) -> Vec<ClusterNode> {
        self.nodes
            .iter()
            .map(|n| {
                let role = match n.is_running().then(|| n.role()) {
                    Some(Ok(r)) => match r.as_str() {
                        "master" => Role::Primary,
                        "slave" => Role::Replica,
                        _ => Role::Down,
                    },
                    _ => Role::Down,
                };
                ClusterNode { port: n.port(), pid: n.pid(), role }
            })
            .collect()
    }

    /// The node on `port`, to run commands on it.
    pub fn server(&self, port: u16) -> Option<&RedisServer> {
        self.nodes.iter().find(|n| n.port() == port)
    }

    /// The node on `port`, to kill or restart it (it rejoins from its `nodes.conf`).
    pub fn server_mut(&mut self, port: u16) -> Option<&mut RedisServer> {
        self.nodes.iter_mut().find(|n| n.port() == port)
    }

    /// The port of the primary serving `slot`, as the first running node that answers
    /// `CLUSTER NODES` sees it (right after a failover, views may differ for a moment:
    /// [`RedisCluster::wait_failover`] waits until they agree).
    pub fn primary_for_slot(&self, slot: u16) -> u16 {
        let mut last = String::from("no running node");
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            match owner_seen_by(node, slot) {
                Ok(port) => return port,
                Err(e) => last = e,
            }
        }
        panic!("no node says who serves slot {slot}: {last}")
    }

    /// kill -9 of the primary serving `slot`; returns its port.
    pub fn kill_primary_of_slot(&mut self, slot: u16) -> u16 {
        let port = self.primary_for_slot(slot);
        let node = self.server_mut(port).unwrap_or_else(|| panic!("slot {slot} is served by :{port}, not ours"));
        node.kill();
        port
    }

    /// Waits until every running node reports `cluster_state:ok` and agrees that `slot` is
    /// served by one running node that answers `ROLE` as primary (a promoted replica after
    /// [`RedisCluster::kill_primary_of_slot`]); returns its port. Panics after `timeout`.
    pub fn wait_failover(&self, slot: u16, timeout: Duration) -> u16 {
        until(&format!("a running primary to serve slot {slot} with cluster_state:ok"), timeout, || {
            let mut owner = None;
            for node in self.nodes.iter().filter(|n| n.is_running()) {
                let info = node.info("cluster-info")?;
                let state = field(&info, "cluster_state");
                if state != Some("ok") {
                    return Err(format!(":{} cluster_state {state:?}", node.port()));
                }
                let seen = owner_seen_by(node, slot)?;
                match owner {
                    Some(o) if o != seen => {
                        return Err(format!("nodes disagree on slot {slot}: :{o} and :{seen}"));
                    }
                    _ => owner = Some(seen),
                }
            }
            let port = owner.ok_or("no running node")?;
            let node = self.server(port).ok_or(format!("slot {slot} served by :{port}, not ours"))?;
            if !node.is_running() {
                return Err(format!("slot {slot} still served by the killed :{port}"));
            }
            match node.role()?.as_str() {
                "master" => Ok(port),
                r => Err(format!(":{port} serves slot {slot} but its ROLE is {r}")),
            }
        })
    }

    /// Moves `slot` to the primary on `to`, as `redis-cli --cluster reshard` does: `IMPORTING`
    /// on the target, `MIGRATING` on the source, `MIGRATE` of its keys `batch` at a time with
    /// `pause` between batches (so clients can meet the slot half-moved), then `SETSLOT NODE`
    /// on every primary. Returns the source's port.
    pub fn move_slot(&self, slot: u16, to: u16, batch: usize, pause: Duration) -> u16 {
        let from = self.primary_for_slot(slot);
        assert_ne!(from, to, "slot {slot} is already on :{to}");
        let (src, dst) = (self.server(from).expect("source is ours"), self.server(to).expect("target is ours"));
        let id = |n: &RedisServer| -> String { n.cmd(redis::cmd("CLUSTER").arg("MYID")) };
        let (src_id, dst_id) = (id(src), id(dst));
        let set = |n: &RedisServer, how: &str, node: &str| {
            let _: () = n.cmd(redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg(how).arg(node));
        };
        set(dst, "IMPORTING", &src_id);
        set(src, "MIGRATING", &dst_id);
        loop {
            let keys: Vec<String> = src.cmd(redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(batch));
            if keys.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate.arg("127.0.0.1").arg(to).arg("").arg(0).arg(5000).arg("KEYS").arg(&keys);
            let _: String = src.cmd(&migrate);
            std::thread::sleep(pause);
        }
        for node in self.nodes.iter().filter(|n| n.is_running() && n.role().as_deref() == Ok("master")) {
            set(node, "NODE", &dst_id);
        }
        from
    }

    fn wait_formed(&self, primaries: usize, replicas_per_primary: usize) {
        let total = self.nodes.len().to_string();
        until(&format!("the cluster of {total} nodes to form"), FORM_TIMEOUT, || {
            let mut seen_primaries = 0;
            for node in &self.nodes {
                let port = node.port();
                let info = node.info("cluster-info")?;
                let state = field(&info, "cluster_state");
                if state != Some("ok") {
                    return Err(format!(":{port} cluster_state {state:?}"));
                }
                let known = field(&info, "cluster_known_nodes");
                if known != Some(total.as_str()) {
                    return Err(format!(":{port} knows {known:?} nodes"));
                }
                let replication = node.info("replication")?;
                if node.role()? == "master" {
                    seen_primaries += 1;
                    let n = field(&replication, "connected_slaves");
                    if n != Some(replicas_per_primary.to_string().as_str()) {
                        return Err(format!(":{port} has {n:?} replicas"));
                    }
                } else {
                    let link = field(&replication, "master_link_status");
                    if link != Some("up") {
                        return Err(format!("replica :{port} master_link_status {link:?}"));
                    }
                }
            }
            if seen_primaries != primaries {
                return Err(format!("{seen_primaries} primaries"));
            }
            Ok(())
        });
    }
}

impl std::fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCluster").field("nodes", &self.nodes).finish()
    }
}

/// A plain server's arguments plus cluster mode, a 1 s node timeout and `nodes.conf` in the
/// node's scratch directory.
fn cluster_argv() -> Argv {
    let base = data_argv(&["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"]);
    Arc::new(move |port, dir| {
        let mut args = base(port, dir);
        args.push("--cluster-config-file".into());
        args.push(dir.join("nodes.conf").display().to_string());
        args
    })
}

/// `redis-cli --cluster create`, bounded by [`CREATE_TIMEOUT`]; its output goes to
/// `create.log` in `scratch` and into the panic message if it fails.
fn create(nodes: &[RedisServer], replicas_per_primary: usize, scratch: &Scratch) {
    let log_path = scratch.path().join("create.log");
    let log = File::create(&log_path).expect("create the redis-cli log file");
    let err = log.try_clone().expect("clone the log file handle");
    let mut cmd = Command::new("redis-cli");
    cmd.args(["--cluster", "create"]);
    cmd.args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())));
    cmd.args(["--cluster-replicas", &replicas_per_primary.to_string(), "--cluster-yes"]);
    let mut child = cmd.stdin(Stdio::null()).stdout(log).stderr(err).spawn().unwrap_or_else(|e| match e.kind() {
        ErrorKind::NotFound => panic!("redis-cli not found on PATH: apt-get install -y redis-server (make redis-deps)"),
        _ => panic!("spawn redis-cli --cluster create: {e}"),
    });
    let output = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let deadline = Instant::now() + CREATE_TIMEOUT;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("redis-cli --cluster create did not finish within {CREATE_TIMEOUT:?}:\n{}", output());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "redis-cli --cluster create failed ({status}):\n{}", output());
}

/// The port of the primary serving `slot` in `node`'s `CLUSTER NODES` view. Lines read
/// `<id> <ip:port@bus[,hostname]> <flags> <primary id> <ping> <pong> <epoch> <link> <slots>…`,
/// slots as `N` or `A-B` (`[…]` entries are migrations in progress, skipped).
fn owner_seen_by(node: &RedisServer, slot: u16) -> Result<u16, String> {
    let text: String =
        node.try_cmd(redis::cmd("CLUSTER").arg("NODES")).map_err(|e| format!(":{} CLUSTER NODES: {e}", node.port()))?;
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() < 9 || !parts[2].split(',').any(|f| f == "master") {
            continue;
        }
        let serves = parts[8..].iter().filter(|r| !r.starts_with('[')).any(|range| {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
        });
        if serves {
            let addr = parts[1].split(['@', ',']).next().unwrap_or_default();
            return addr.rsplit(':').next().and_then(|p| p.parse().ok()).ok_or(format!(
                ":{} CLUSTER NODES: bad address {}",
                node.port(),
                parts[1]
            ));
        }
    }
    Err(format!(":{} sees no primary for slot {slot}", node.port()))
}
