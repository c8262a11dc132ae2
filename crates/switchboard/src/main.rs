//! `switchboard`: parses the command line and hands each command to its crate.

mod token;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use switchboard_gateway::config::{Config, ConfigError};

/// jemalloc returns the buffers of finished handshakes to the OS, which keeps the resident
/// memory of many idle connections close to what they really hold.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "switchboard", version, about = "A real-time push gateway: live channels to many WebSocket clients.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a gateway node.
    #[command(after_help = "Every flag and every configuration key can also be set in the environment as \
SWITCHBOARD_<KEY>, sections joined with __ (SWITCHBOARD_LISTEN, SWITCHBOARD_BROKER, SWITCHBOARD_JWT_SECRET, \
SWITCHBOARD_MAX_CONNECTIONS, SWITCHBOARD_NAMESPACES__PT__TREND_WINDOW_S, ...); a flag wins over the \
environment, which wins over the --config file. docs/operations.md lists every key.")]
    Serve(Box<ServeArgs>),
    /// Run a node on 127.0.0.1 with a simulator of 1,000 points at 1 Hz, a few chat rooms and,
    /// when mosquitto is installed, a plant over MQTT (a control room with writes to devices).
    Demo(DemoArgs),
    /// Publish one JSON value to a channel over the HTTP API and print the node's answer.
    Publish(switchboard_client::cli::PublishArgs),
    /// Subscribe to channels and print each publication as a JSON line.
    Sub(switchboard_client::cli::SubArgs),
    /// Run a benchmark scenario against a Switchboard node or any WebSocket echo server.
    Bench(switchboard_bench::BenchCommand),
    /// Run a WebSocket echo server on the node's own WebSocket code: every text and binary
    /// message back as one frame of its type, pongs for pings, RFC 6455 closes. For the
    /// Autobahn TestSuite and `bench echo --protocol json-echo`.
    Echo(EchoArgs),
    /// Manage the users file of Basic authentication.
    #[command(subcommand)]
    User(UserCommand),
    /// Print a new random API key and the digest to put in the configuration
    /// (`auth.api_keys`), or with --hash the digest of a key read from stdin.
    ApiKey(ApiKeyArgs),
    /// Sign a JWT for a user with the node's secret or a private key, and print it.
    Token(token::TokenArgs),
}

#[derive(Subcommand)]
enum UserCommand {
    /// Add a user or change its password. The password is read from stdin when it is not a
    /// terminal, otherwise prompted for (twice, without echo).
    Add {
        /// User name: 1-64 of A-Z a-z 0-9 _ . @ -
        name: String,
        /// The users file to create or update.
        #[arg(long, env = "SWITCHBOARD_USERS", default_value = "switchboard.users")]
        users: PathBuf,
    },
}

#[derive(Args)]
struct ApiKeyArgs {
    /// Read a key from stdin and print only its digest.
    #[arg(long)]
    hash: bool,
}

/// Authentication, origin and TLS flags of `serve` (docs/security.md).
#[derive(Args)]
struct SecurityArgs {
    /// HS256 secret for JWTs (32+ bytes). Prefer SWITCHBOARD_JWT_SECRET or the config file:
    /// command lines are visible to other local users.
    #[arg(long, value_name = "SECRET")]
    jwt_secret: Option<String>,
    /// PEM public key (RSA for RS256, EC P-256 for ES256) that verifies JWTs.
    #[arg(long, value_name = "FILE")]
    jwt_public_key: Option<PathBuf>,
    /// JWK set file whose keys verify JWTs (chosen by `kid`).
    #[arg(long, value_name = "FILE")]
    jwks: Option<PathBuf>,
    /// Users file (Argon2 hashes) for Basic authentication; see `switchboard user add`.
    #[arg(long, value_name = "FILE")]
    users: Option<PathBuf>,
    /// HTTP API key, plain (hashed at startup) or as its `sha256:` digest. Repeatable.
    #[arg(long, value_name = "KEY")]
    api_key: Vec<String>,
    /// Origin allowed to open browser WebSockets (e.g. https://app.example.com; `*` for any).
    /// Repeatable. Without any, only pages of the node's own origin may connect.
    #[arg(long, value_name = "URL")]
    allowed_origin: Vec<String>,
    /// Proxy (IP or CIDR) whose X-Forwarded-For names the client address. Repeatable.
    #[arg(long, value_name = "IP")]
    trusted_proxy: Vec<String>,
    /// PEM certificate chain: serve https:// and wss:// directly.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
}

impl SecurityArgs {
    /// Configuration overrides; plain API keys are hashed here and never kept.
    fn overrides(&self) -> Result<Vec<(&'static str, toml::Value)>, ConfigError> {
        let mut o = Vec::new();
        let list = |v: &[String]| toml::Value::Array(v.iter().cloned().map(toml::Value::String).collect());
        if let Some(v) = &self.jwt_secret {
            o.push(("auth.jwt_secret", toml::Value::String(v.clone())));
        }
        for (key, v) in [
            ("auth.jwt_public_key", &self.jwt_public_key),
            ("auth.jwks", &self.jwks),
            ("auth.users", &self.users),
            ("tls.cert", &self.tls_cert),
            ("tls.key", &self.tls_key),
        ] {
            if let Some(p) = v {
                o.push((key, path_value(p)));
            }
        }
        if !self.api_key.is_empty() {
            let hashed = self
                .api_key
                .iter()
                .map(|k| switchboard_gateway::auth::apikey::stored_form(k))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ConfigError(format!("--api-key: {e}")))?;
            o.push(("auth.api_keys", list(&hashed)));
        }
        if !self.allowed_origin.is_empty() {
            o.push(("auth.allowed_origins", list(&self.allowed_origin)));
        }
        if !self.trusted_proxy.is_empty() {
            o.push(("auth.trusted_proxies", list(&self.trusted_proxy)));
        }
        Ok(o)
    }
}

#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file (every key can also be set as SWITCHBOARD_<KEY>).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8700].
    #[arg(long)]
    listen: Option<String>,
    /// Broker [default: memory]:
    /// `memory` (embedded, one node);
    /// `redis://[user:pw@]host:port[/db]` (`rediss://` for TLS): nodes sharing one Redis;
    /// `"redis://a:6379,redis://b:6379"`: channels hashed over several Redis shards;
    /// `redis+cluster://host:port[,host:port]`: a Redis Cluster (seed nodes);
    /// `redis+sentinel://host:26379[,host:26379]/primary-name`: Redis behind Sentinel.
    /// Options as query: `?prefix=sb&presence_ttl_s=15` (docs/operations.md).
    #[arg(long, verbatim_doc_comment)]
    broker: Option<String>,
    /// Worker threads (at most the number of cores) [default: one per core].
    #[arg(long)]
    workers: Option<usize>,
    /// Simulate N point channels at HZ each, e.g. 1000@1.
    #[arg(long, value_name = "N@HZ")]
    simulate: Option<String>,
    /// Node id in replies and /api/info [default: random].
    #[arg(long)]
    node_id: Option<String>,
    /// Serve beyond loopback without authentication.
    #[arg(long)]
    allow_anonymous: bool,
    /// Most simultaneous connections.
    #[arg(long)]
    max_connections: Option<usize>,
    /// Most subscriptions per connection.
    #[arg(long)]
    max_subscriptions: Option<usize>,
    /// Largest client frame in bytes (larger closes with 1009).
    #[arg(long)]
    max_frame_bytes: Option<usize>,
    /// Bound of a connection's unwritten bytes before it is closed with 4008.
    #[arg(long)]
    max_pending_bytes: Option<usize>,
    /// Seconds between server pings.
    #[arg(long)]
    ping_s: Option<u64>,
    /// Directory for saved dashboards [default: ./switchboard-data].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Directory of the built dashboard app [default: web/dashboard/dist near the working
    /// directory or the executable].
    #[arg(long)]
    web_dir: Option<PathBuf>,
    #[command(flatten)]
    security: SecurityArgs,
}

#[derive(Args)]
struct DemoArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8700")]
    listen: String,
    /// Directory for saved dashboards [default: ./switchboard-data].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Directory of the built dashboard app.
    #[arg(long)]
    web_dir: Option<PathBuf>,
}

#[derive(Args)]
struct EchoArgs {
    /// Address to listen on; any path upgrades (ws://ADDR/).
    #[arg(long, default_value = "127.0.0.1:9001")]
    listen: String,
    /// Largest message echoed, fragments joined (larger fails the connection with 1009).
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    max_message_bytes: usize,
    /// Worker threads [default: one per core].
    #[arg(long)]
    workers: Option<usize>,
    /// Listen beyond loopback: anyone who reaches the address may make the server hold
    /// messages of up to --max-message-bytes.
    #[arg(long)]
    allow_anonymous: bool,
}

/// `switchboard echo`.
fn echo(args: &EchoArgs) -> anyhow::Result<()> {
    let listen: std::net::SocketAddr =
        args.listen.parse().map_err(|e| ConfigError(format!("--listen {}: {e}", args.listen)))?;
    if !listen.ip().is_loopback() && !args.allow_anonymous {
        return Err(ConfigError(format!(
            "--listen {listen} is beyond loopback and the echo server has no authentication; pass --allow-anonymous to serve anyway"
        ))
        .into());
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    switchboard_gateway::echo::run(switchboard_gateway::echo::EchoOptions {
        listen,
        max_message_bytes: args.max_message_bytes,
        workers: args.workers.unwrap_or(cores).min(cores),
    })
}

/// A path as a configuration value.
fn path_value(p: &std::path::Path) -> toml::Value {
    toml::Value::String(p.to_string_lossy().into_owned())
}

impl ServeArgs {
    fn overrides(&self) -> Vec<(&'static str, toml::Value)> {
        let mut o = Vec::new();
        let s = |v: &String| toml::Value::String(v.clone());
        let n = |v: usize| toml::Value::Integer(v as i64);
        if let Some(v) = &self.listen {
            o.push(("listen", s(v)));
        }
        if let Some(v) = &self.broker {
            o.push(("broker", s(v)));
        }
        if let Some(v) = self.workers {
            o.push(("workers", n(v)));
        }
        if let Some(v) = &self.simulate {
            o.push(("simulate", s(v)));
        }
        if let Some(v) = &self.node_id {
            o.push(("node_id", s(v)));
        }
        if self.allow_anonymous {
            o.push(("allow_anonymous", toml::Value::Boolean(true)));
        }
        if let Some(v) = &self.data_dir {
            o.push(("data_dir", path_value(v)));
        }
        if let Some(v) = &self.web_dir {
            o.push(("web_dir", path_value(v)));
        }
        for (key, v) in [
            ("limits.max_connections", self.max_connections),
            ("limits.max_subscriptions", self.max_subscriptions),
            ("limits.max_frame_bytes", self.max_frame_bytes),
            ("limits.max_pending_bytes", self.max_pending_bytes),
            ("limits.ping_s", self.ping_s.map(|v| v as usize)),
        ] {
            if let Some(v) = v {
                o.push((key, n(v)));
            }
        }
        o
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SWITCHBOARD_LOG")
        // The OPC UA client library logs a missing own certificate as an error on every
        // connect with security "none", where none is needed.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,opcua_core::comms::secure_channel=off"));
    // Colors only on a terminal: logs redirected to files stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
    switchboard_supervisor::log_panics();
}

fn load(config: Option<&std::path::Path>, overrides: &[(&str, toml::Value)]) -> Result<Config, ConfigError> {
    Config::load(config, std::env::vars(), overrides)
}

/// `switchboard user add NAME`: the password from stdin (not a terminal) or a prompt.
fn user_add(name: &str, users: &std::path::Path) -> anyhow::Result<()> {
    use std::io::{BufRead, IsTerminal};
    let password = if std::io::stdin().is_terminal() {
        let first = rpassword::prompt_password(format!("password for {name}: "))?;
        let again = rpassword::prompt_password("again: ")?;
        if first != again {
            anyhow::bail!("the passwords differ");
        }
        first
    } else {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        line.trim_end_matches(['\r', '\n']).to_string()
    };
    let existed = switchboard_gateway::auth::users::add_user(users, name, &password).map_err(anyhow::Error::msg)?;
    eprintln!("{} user {name} in {}", if existed { "updated" } else { "added" }, users.display());
    Ok(())
}

/// `switchboard api-key [--hash]`.
fn api_key(args: &ApiKeyArgs) -> anyhow::Result<()> {
    use std::io::BufRead;
    use switchboard_gateway::auth::apikey;
    if args.hash {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        println!("{}", apikey::stored_form(line.trim()).map_err(anyhow::Error::msg)?);
    } else {
        let key = apikey::generate();
        println!("key:    {key}");
        println!("config: api_keys = [\"{}\"]   # under [auth]", apikey::hash_key(&key));
    }
    Ok(())
}

fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command {
        Command::Serve(args) => match args.security.overrides().and_then(|mut o| {
            o.extend(args.overrides());
            load(args.config.as_deref(), &o)
        }) {
            Ok(config) => switchboard_gateway::server::run(config),
            Err(e) => {
                eprintln!("switchboard: {e}");
                return ExitCode::from(2);
            }
        },
        Command::Demo(args) => {
            let mut overrides = vec![
                ("listen", toml::Value::String(args.listen.clone())),
                ("simulate", toml::Value::String("1000@1".into())),
            ];
            if let Some(v) = &args.data_dir {
                overrides.push(("data_dir", path_value(v)));
            }
            if let Some(v) = &args.web_dir {
                overrides.push(("web_dir", path_value(v)));
            }
            match load(None, &overrides) {
                Ok(mut config) => {
                    use switchboard_gateway::dashboards::{install_demo, DEMO_ID};
                    // With mosquitto installed, plant data over MQTT too (quietly absent otherwise).
                    let _mqtt = switchboard_gateway::sources::demo::start(&mut config);
                    // The demo still serves without its dashboard (e.g. a read-only directory).
                    if let Err(e) = install_demo(&config.data_dir) {
                        eprintln!(
                            "switchboard demo: cannot write the demo dashboard into {} ({e}); serving without it",
                            config.data_dir.display()
                        );
                    }
                    eprintln!(
                        "switchboard demo: open http://{}/?dashboard={DEMO_ID} in a browser (Ctrl-C stops)",
                        args.listen
                    );
                    switchboard_gateway::server::run_demo(config)
                }
                Err(e) => {
                    eprintln!("switchboard: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        Command::Publish(args) => client_runtime().and_then(|rt| rt.block_on(switchboard_client::cli::publish(args))),
        Command::Sub(args) => client_runtime().and_then(|rt| rt.block_on(switchboard_client::cli::sub(args))),
        Command::User(UserCommand::Add { name, users }) => user_add(&name, &users),
        Command::ApiKey(args) => api_key(&args),
        Command::Token(args) => token::run(&args),
        Command::Echo(args) => echo(&args),
        Command::Bench(cmd) => match switchboard_bench::run(cmd) {
            // 0: the run passed its criteria; 1: it ran but failed them.
            Ok(code) => return ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e)
            if e.downcast_ref::<ConfigError>().is_some()
                || e.downcast_ref::<switchboard_client::cli::UsageError>().is_some() =>
        {
            eprintln!("switchboard: {e:#}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("switchboard: {e:#}");
            ExitCode::from(1)
        }
    }
}
