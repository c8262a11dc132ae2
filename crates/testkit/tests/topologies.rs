//! The kit against real `redis-server` processes: each topology starts, answers, and fails
//! over the way the tests built on it expect.

use std::time::{Duration, Instant};

use redis::cmd;
use switchboard_testkit::{key_slot, RedisCluster, RedisServer, Role, Sentinels, Shards};

/// Generous for a busy two-core machine; typical failovers take a few seconds.
const FAILOVER: Duration = Duration::from_secs(30);

#[test]
fn testkit_server_starts_answers_and_restarts_empty() {
    let mut server = RedisServer::start();
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}/0", server.port()));
    assert_eq!(server.cmd::<String>(&cmd("PING")), "PONG");
    let info: String = server.cmd(cmd("INFO").arg("server"));
    assert!(info.contains(&format!("process_id:{}", server.pid())), "the server on the port is ours");
    let _: () = server.cmd(cmd("SET").arg("k").arg("v"));
    assert_eq!(server.cmd::<String>(cmd("GET").arg("k")), "v");

    let (port, old_pid) = (server.port(), server.pid());
    server.kill();
    assert!(!server.is_running());
    assert!(server.try_cmd::<String>(&cmd("PING")).is_err(), "a killed server does not answer");

    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert_eq!(server.cmd::<Option<String>>(cmd("GET").arg("k")), None, "no persistence unless asked");
}

#[test]
fn testkit_server_keeps_data_across_restart_when_asked() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let _: () = server.cmd(cmd("SET").arg("k").arg("kept"));
    server.restart();
    assert_eq!(server.cmd::<String>(cmd("GET").arg("k")), "kept");
}

#[test]
fn testkit_server_start_on_a_given_port() {
    let mut first = RedisServer::start();
    let port = first.port();
    first.kill();
    let again = RedisServer::start_on(port);
    assert_eq!(again.port(), port);
    assert_eq!(again.cmd::<String>(&cmd("PING")), "PONG");
}

#[test]
#[should_panic(expected = "redis-server did not start")]
fn testkit_server_start_on_a_taken_port_panics_with_the_log() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    RedisServer::start_on(port);
}

#[test]
fn testkit_shards_are_independent_servers() {
    let shards = Shards::start(3);
    let ports: Vec<u16> = shards.servers().iter().map(RedisServer::port).collect();
    let expected: Vec<String> = ports.iter().map(|p| format!("redis://127.0.0.1:{p}/0")).collect();
    assert_eq!(shards.urls_joined(), expected.join(","));
    let _: () = shards.servers()[0].cmd(cmd("SET").arg("k").arg("0"));
    assert_eq!(shards.servers()[1].cmd::<Option<String>>(cmd("GET").arg("k")), None);
}

#[test]
fn testkit_key_slot_matches_cluster_keyslot() {
    // A lone cluster-mode server computes slots without any being assigned to it.
    let server = RedisServer::start_with(&["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]);
    let keys = [
        "",
        "a",
        "foo",
        "123456789",
        "sb:{pt:a.b}:m",
        "sb:{pt:a.b}:h",
        "sb:{pt:a.b}:p",
        "{user1000}.following",
        "foo{}{bar}",
        "foo{{bar}}zap",
        "foo{bar}{zap}",
        "{}",
        "}{",
        "ü{ñ}",
        "sb:channel:with:a:long:name:0123456789abcdef",
    ];
    for key in keys {
        let redis_says: u16 = server.cmd(cmd("CLUSTER").arg("KEYSLOT").arg(key));
        assert_eq!(key_slot(key), redis_says, "slot of {key:?}");
    }
    assert_eq!(key_slot("sb:{pt:a.b}:m"), key_slot("pt:a.b"));
}

#[test]
fn testkit_cluster_forms_serves_and_fails_over() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start(3, 1);
    eprintln!("testkit: 3+3 cluster formed in {:?}", started.elapsed());

    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 6);
    assert_eq!(nodes.iter().filter(|n| n.role == Role::Primary).count(), 3);
    assert_eq!(nodes.iter().filter(|n| n.role == Role::Replica).count(), 3);
    assert_eq!(cluster.seed_url(), format!("redis+cluster://127.0.0.1:{}", nodes[0].port));

    let key = "sb:{pt:a.b}:m";
    let slot = key_slot(key);
    let owner = cluster.primary_for_slot(slot);
    let primary = cluster.server(owner).expect("the owner is a node of ours");
    // WAIT counts replicas that have this connection's writes: one connection for both.
    let mut con = primary.connection().expect("connect to the owner");
    let _: () = cmd("SET").arg(key).arg("before").query(&mut con).expect("SET");
    let acked: i64 = cmd("WAIT").arg(1).arg(5000).query(&mut con).expect("WAIT");
    assert_eq!(acked, 1, "the replica has the write, so it survives the failover");
    assert_eq!(primary.cmd::<String>(cmd("GET").arg(key)), "before");
    // Another primary redirects: the slot map is real.
    let other = nodes.iter().find(|n| n.role == Role::Primary && n.port != owner).expect("another primary");
    let moved = cluster.server(other.port).expect("node").try_cmd::<String>(cmd("GET").arg(key));
    let err = moved.expect_err("a non-owner redirects");
    let owner_addr = format!("127.0.0.1:{owner}");
    assert_eq!(err.redirect_node(), Some((owner_addr.as_str(), slot)), "MOVED to the owner: {err}");

    let started = Instant::now();
    let killed = cluster.kill_primary_of_slot(slot);
    assert_eq!(killed, owner);
    let promoted = cluster.wait_failover(slot, FAILOVER);
    eprintln!("testkit: cluster failover took {:?}", started.elapsed());
    assert_ne!(promoted, killed);
    assert_eq!(cluster.primary_for_slot(slot), promoted);
    assert_eq!(cluster.server(promoted).expect("node").cmd::<String>(cmd("GET").arg(key)), "before");
    let roles = cluster.nodes();
    assert_eq!(roles.iter().find(|n| n.port == killed).map(|n| n.role), Some(Role::Down));
    assert_eq!(roles.iter().find(|n| n.port == promoted).map(|n| n.role), Some(Role::Primary));
}

#[test]
fn testkit_sentinels_form_and_fail_over() {
    let started = Instant::now();
    let primary = RedisServer::start();
    let first = primary.port();
    let mut set = Sentinels::start(primary, 2, 3, "mymaster");
    eprintln!("testkit: primary + 2 replicas + 3 sentinels ready in {:?}", started.elapsed());

    let sentinel_ports: Vec<String> = set.sentinels().iter().map(|s| format!("127.0.0.1:{}", s.port())).collect();
    assert_eq!(set.url("mymaster"), format!("redis+sentinel://{}/mymaster", sentinel_ports.join(",")));
    assert_eq!(set.current_primary(), first);
    let primary = set.server(first).expect("the primary");
    let mut con = primary.connection().expect("connect to the primary");
    let _: () = cmd("SET").arg("k").arg("before").query(&mut con).expect("SET");
    let acked: i64 = cmd("WAIT").arg(2).arg(5000).query(&mut con).expect("WAIT");
    assert_eq!(acked, 2, "both replicas have the write");

    let started = Instant::now();
    let killed = set.kill_primary();
    assert_eq!(killed, first);
    let promoted = set.wait_failover(killed, FAILOVER);
    eprintln!("testkit: sentinel failover took {:?}", started.elapsed());
    assert_ne!(promoted, killed);
    assert_eq!(set.current_primary(), promoted);
    let new_primary = set.server(promoted).expect("a replica of ours");
    assert_eq!(new_primary.cmd::<String>(cmd("GET").arg("k")), "before");
    let _: () = new_primary.cmd(cmd("SET").arg("k").arg("after"));
}
