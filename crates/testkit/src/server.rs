//! [`RedisServer`]: one `redis-server` process on a loopback port, in its own scratch
//! directory, killed on drop.

use std::fs::File;
use std::io::ErrorKind;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Cmd, Connection, FromRedisValue, RedisResult};

use crate::port;
use crate::scratch::Scratch;
use crate::wait::field;

/// How long a server may take from spawn to answering `PING`.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one command may take, so that a stopped or wedged server fails a test instead of
/// hanging it (a blocking command longer than this fails too).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Fresh ports tried when the chosen one was taken between choosing and binding.
const PORT_ATTEMPTS: usize = 5;
/// The server's stdout and stderr, in its scratch directory.
const LOG: &str = "redis.log";

/// The arguments for a port and a scratch directory. It may write files there (a sentinel's
/// configuration); it is kept so that [`RedisServer::restart`] runs the same command.
pub(crate) type Argv = Arc<dyn Fn(u16, &Path) -> Vec<String> + Send + Sync>;

/// Which port a new server gets.
#[derive(Clone, Copy)]
pub(crate) enum PortChoice {
    /// Exactly this one: a failure to bind is a failure to start.
    Fixed(u16),
    /// A spare one, another on failure.
    Spare,
    /// A spare one whose cluster bus port (+10000) is free too, another on failure.
    SpareWithBus,
}

/// A `redis-server` process on `127.0.0.1`, started by the kit.
///
/// It runs in its own [`Scratch`] directory (`--dir`, its log, any configuration), without
/// persistence unless the start arguments ask for it (`--save "" --appendonly no` come first,
/// later arguments override them), and a primary starts a full sync for a new replica at once
/// (`--repl-diskless-sync-delay 0`, instead of waiting 5 s for more replicas). Dropping it
/// kills the process (SIGKILL, by its PID) and removes the directory.
///
/// Every method is synchronous. Called from an async test it blocks that thread while it
/// waits, which is what setup wants; a wait that must let other tasks of a current-thread
/// runtime progress belongs in `spawn_blocking`.
pub struct RedisServer {
    child: Child,
    running: bool,
    port: u16,
    argv: Argv,
    // Dropped after the process is killed (`Drop` runs before the fields are dropped).
    scratch: Scratch,
}

impl RedisServer {
    /// A server on a spare port; returns once it answers `PING`.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// As [`RedisServer::start`], with extra `redis-server` arguments appended (for example
    /// `["--appendonly", "yes"]` for persistence across [`RedisServer::restart`]).
    pub fn start_with(args: &[&str]) -> RedisServer {
        RedisServer::launch("redis", PortChoice::Spare, data_argv(args))
    }

    /// A server on exactly `port` (say, the port of one that was killed); panics if the port
    /// is taken.
    pub fn start_on(port: u16) -> RedisServer {
        RedisServer::launch("redis", PortChoice::Fixed(port), data_argv(&[]))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The PID of the process last started (still reported after [`RedisServer::kill`]).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process was started and not killed by the kit. A process that died on its
    /// own still counts as running here; its commands fail.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// The scratch directory: `--dir` of the server, with its log (`redis.log`).
    pub fn dir(&self) -> &Path {
        self.scratch.path()
    }

    /// kill -9: SIGKILL to the process, then reap it. No shutdown, no save; idempotent.
    pub fn kill(&mut self) {
        if self.running {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.running = false;
        }
    }

    /// Kills the process if it runs and starts it again with the same arguments, on the same
    /// port and in the same directory; returns once it answers `PING`. Without persistence the
    /// data is gone; with it (`--appendonly yes`) the server loads it back first.
    pub fn restart(&mut self) {
        self.kill();
        let (child, result) = spawn_and_wait(self.port, &self.argv, &self.scratch);
        self.child = child;
        self.running = true;
        if let Err(why) = result {
            panic!("redis-server did not restart on port {}: {why}\n{}", self.port, log_tail(self.dir()));
        }
    }

    /// A new connection (RESP2, 5 s connect, read and write timeouts).
    pub fn connection(&self) -> RedisResult<Connection> {
        let client = redis::Client::open(self.url())?;
        let con = client.get_connection_with_timeout(COMMAND_TIMEOUT)?;
        con.set_read_timeout(Some(COMMAND_TIMEOUT))?;
        con.set_write_timeout(Some(COMMAND_TIMEOUT))?;
        Ok(con)
    }

    /// Runs `cmd` on a new connection; panics if it fails. For setup and assertions:
    /// `server.cmd::<String>(redis::cmd("GET").arg("k"))`. Nothing carries over from one call
    /// to the next: `WAIT` after a write, `MULTI`, `SELECT` or `CLIENT` settings need one
    /// [`RedisServer::connection`].
    pub fn cmd<T: FromRedisValue>(&self, cmd: &Cmd) -> T {
        self.try_cmd(cmd).unwrap_or_else(|e| panic!("command on redis-server :{}: {e}", self.port))
    }

    /// Runs `cmd` on a new connection, returning its error instead of panicking.
    pub fn try_cmd<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        cmd.query(&mut self.connection()?)
    }

    /// The reply of `INFO section` (or `CLUSTER INFO` for `section == "cluster-info"`), or the
    /// error as text: the polling loops keep it as their last seen reason.
    pub(crate) fn info(&self, section: &str) -> Result<String, String> {
        let cmd = if section == "cluster-info" {
            redis::cmd("CLUSTER").arg("INFO").clone()
        } else {
            redis::cmd("INFO").arg(section).clone()
        };
        self.try_cmd::<String>(&cmd).map_err(|e| format!(":{} {e}", self.port))
    }

    /// The first element of `ROLE`: `master`, `slave` or `sentinel`.
    pub(crate) fn role(&self) -> Result<String, String> {
        let reply: Vec<redis::Value> = self.try_cmd(&redis::cmd("ROLE")).map_err(|e| format!(":{} {e}", self.port))?;
        match reply.first() {
            Some(v) => String::from_redis_value_ref(v).map_err(|e| e.to_string()),
            None => Err(format!(":{} empty ROLE reply", self.port)),
        }
    }

    /// Starts a server whose arguments `argv` builds; returns once it answers `PING`. A spare
    /// port that turns out taken (the process exits at start) is replaced by another.
    pub(crate) fn launch(label: &str, ports: PortChoice, argv: Argv) -> RedisServer {
        let attempts = if matches!(ports, PortChoice::Fixed(_)) { 1 } else { PORT_ATTEMPTS };
        let mut failures = Vec::new();
        for _ in 0..attempts {
            let port = match ports {
                PortChoice::Fixed(p) => p,
                PortChoice::Spare => port::spare(),
                PortChoice::SpareWithBus => port::spare_with_bus(),
            };
            // A fresh directory per attempt: a cluster node of a failed attempt may have
            // written a nodes.conf naming the port it could not bind.
            let scratch = Scratch::new(&format!("{label}-{port}"));
            let (child, result) = spawn_and_wait(port, &argv, &scratch);
            let mut server = RedisServer { child, running: true, port, argv: argv.clone(), scratch };
            match result {
                Ok(()) => return server,
                Err(Failure::Exited(status)) => {
                    failures.push(format!("port {port}: exited with {status}\n{}", log_tail(server.dir())));
                    server.kill();
                }
                Err(timeout) => {
                    panic!("redis-server on port {port}: {timeout}\n{}", log_tail(server.dir()));
                }
            }
        }
        panic!("redis-server did not start ({label}):\n{}", failures.join("\n"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.pid())
            .field("running", &self.running)
            .finish()
    }
}

/// `--port P --bind 127.0.0.1 --dir SCRATCH --save "" --appendonly no
/// --repl-diskless-sync-delay 0` and then `extra`.
pub(crate) fn data_argv(extra: &[&str]) -> Argv {
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    Arc::new(move |port, dir| {
        let mut args: Vec<String> = ["--port", &port.to_string(), "--bind", "127.0.0.1"]
            .into_iter()
            .chain(["--dir", &dir.display().to_string(), "--save", "", "--appendonly", "no"])
            // Replicas attached one after the other sync at once instead of 5 s later.
            .chain(["--repl-diskless-sync-delay", "0"])
            .map(String::from)
            .collect();
        args.extend(extra.iter().cloned());
        args
    })
}

/// Why a server did not come up.
enum Failure {
    /// It exited first, most likely because its port was taken.
    Exited(ExitStatus),
    /// It ran but did not answer within [`START_TIMEOUT`]; the last reason.
    Timeout(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Exited(status) => write!(f, "exited at start with {status}"),
            Failure::Timeout(last) => write!(f, "did not answer PING within {START_TIMEOUT:?} (last: {last})"),
        }
    }
}

fn spawn_and_wait(port: u16, argv: &Argv, scratch: &Scratch) -> (Child, Result<(), Failure>) {
    let args = argv(port, scratch.path());
    let log = File::create(scratch.path().join(LOG)).expect("create the redis-server log file");
    let err = log.try_clone().expect("clone the log file handle");
    let mut child = Command::new("redis-server")
        .args(&args)
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| match e.kind() {
            ErrorKind::NotFound => {
                panic!("redis-server not found on PATH: apt-get install -y redis-server (make redis-deps)")
            }
            _ => panic!("spawn redis-server {args:?}: {e}"),
        });
    let result = wait_ready(&mut child, port);
    (child, result)
}

/// Waits until the process on `port` answers `PING` and is `child` (not another test's server
/// that took the port first), or until it exits, or [`START_TIMEOUT`].
fn wait_ready(child: &mut Child, port: u16) -> Result<(), Failure> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Failure::Exited(status));
        }
        let last = match probe(port) {
            Ok(pid) if pid == child.id() => return Ok(()),
            Ok(pid) => format!("port {port} answered by another process ({pid})"),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(Failure::Timeout(last));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `PING`, then the `process_id` of `INFO server`.
fn probe(port: u16) -> RedisResult<u32> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut con = client.get_connection_with_timeout(Duration::from_secs(1))?;
    con.set_read_timeout(Some(Duration::from_secs(1)))?;
    redis::cmd("PING").query::<String>(&mut con)?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut con)?;
    Ok(field(&info, "process_id").and_then(|p| p.parse().ok()).unwrap_or(0))
}

/// The last lines of a server's log, for a panic message.
pub(crate) fn log_tail(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join(LOG)).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(15)..].join("\n");
    format!("--- {} (last lines) ---\n{tail}", dir.join(LOG).display())
}
