//! What the black-box tests share: the real binary as a server ([`Server`]), a real
//! `redis-server` from the test kit ([`Redis`]) and scratch directories ([`TempDir`]). Each
//! test file includes it with `mod support;` and uses the part it needs.
#![allow(dead_code)] // every test crate compiles this module; none uses all of it

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use switchboard_client::HttpApi;
use switchboard_testkit::RedisServer;

pub const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// A `switchboard serve` process on 127.0.0.1:0; killed (SIGKILL) on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Server {
    /// `serve --listen 127.0.0.1:0 ARGS`, once it printed its `listening on` line.
    pub fn start(args: &[&str]) -> Server {
        Server::start_env(args, &[])
    }

    /// As [`Server::start`], with `env` set and no `SWITCHBOARD_*` variable of the calling
    /// environment (settings come from the test alone).
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--listen", "127.0.0.1:0"]).args(args).stdout(Stdio::piped()).stderr(Stdio::null());
        for (k, _) in std::env::vars() {
            if k.starts_with("SWITCHBOARD_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().expect("start switchboard");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("listening line");
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Server { child, port }
    }

    /// A cluster node on `redis`.
    pub fn node(redis: &Redis, id: &str) -> Server {
        Server::node_on(&redis.url(), id, &[])
    }

    /// A cluster node on the broker at `url`, with `env`.
    pub fn node_on(url: &str, id: &str, env: &[(&str, &str)]) -> Server {
        Server::start_env(&["--broker", url, "--node-id", id], env)
    }

    pub fn ws(&self) -> String {
        format!("ws://127.0.0.1:{}/ws", self.port)
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn api(&self) -> HttpApi {
        HttpApi::new(&self.base()).expect("api")
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// kill -9: no goodbye to clients, no cleanup anywhere.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, the graceful shutdown; its exit status once it is gone (at most 15 s).
    pub fn terminate(&mut self) -> ExitStatus {
        let _ = Command::new("kill").args(["-TERM", &self.pid()]).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(Instant::now() < deadline, "server did not exit within 15 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `/readyz` answers 200.
    pub async fn ready(&self) -> bool {
        matches!(self.api().request("GET", "/readyz", None).await, Ok(r) if r.status == 200)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A `redis-server` on a spare loopback port, without persistence; killed (SIGKILL) on drop.
/// The kit's [`RedisServer`], with the port as a field for the tests that kill the server
/// and start another on the same port.
pub struct Redis {
    pub server: RedisServer,
    pub port: u16,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::from(RedisServer::start())
    }

    pub fn start_on(port: u16) -> Redis {
        Redis::from(RedisServer::start_on(port))
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn kill(&mut self) {
        self.server.kill();
    }
}

impl From<RedisServer> for Redis {
    fn from(server: RedisServer) -> Redis {
        Redis { port: server.port(), server }
    }
}

/// A fresh, empty directory under the system temp dir; removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("sb-test-{}-{n}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Bounds for the timing checks of the paced bench scenarios that a busy test machine cannot
/// fail: these tests check counts, losses and reports, not speed (which the bench measures,
/// docs/benchmarks.md). Append to `switchboard bench <args>`; nothing when `args` set a bound
/// themselves.
pub fn loose_bounds(args: &[&str]) -> &'static [&'static str] {
    if args.iter().any(|a| a.starts_with("--max-")) {
        return &[];
    }
    match args.first().copied().unwrap_or_default() {
        "streams" | "dashboard" | "broadcast" => &["--max-p99-ms", "60000", "--max-publish-late-ms", "60000"],
        "rooms" => &["--max-p99-ms", "60000"],
        _ => &[],
    }
}

/// Runs `switchboard bench ARGS` (with [`loose_bounds`]) against `server` — `--target`,
/// `--server-pid`, `--quiet` and a scratch `--out` — killing it and failing the test after
/// `limit`. Checks that `result.csv` holds a header and one row and that `latency.svg` and each
/// of `charts` are SVG documents; returns the exit status and `result.json`.
pub fn run_bench(server: &Server, args: &[&str], limit: Duration, charts: &[&str]) -> (ExitStatus, serde_json::Value) {
    let out = TempDir::new(args[0]);
    let mut child = Command::new(BIN)
        .arg("bench")
        .args(args)
        .args(loose_bounds(args))
        .args(["--target", &server.ws(), "--server-pid", &server.pid(), "--quiet"])
        .arg("--out")
        .arg(&out.0)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start bench");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("bench {args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let json = std::fs::read(out.0.join("result.json"))
        .unwrap_or_else(|e| panic!("bench {args:?} exited {status} without result.json: {e}"));
    let result = serde_json::from_slice(&json).unwrap();
    let csv = std::fs::read_to_string(out.0.join("result.csv")).unwrap();
    assert_eq!(csv.lines().count(), 2, "header and one row");
    assert!(csv.starts_with("scenario,"), "{csv}");
    for chart in std::iter::once(&"latency.svg").chain(charts) {
        let svg = std::fs::read_to_string(out.0.join(chart)).unwrap();
        assert!(svg.starts_with("<svg"), "{chart}");
    }
    (status, result)
}
