//! Node configuration: a TOML file, overlaid by `SWITCHBOARD_*` environment variables, overlaid
//! by command-line flags. Unknown keys and bad values are errors that name the key.
//!
//! Environment variables map onto keys by lower-casing and splitting on `__`:
//! `SWITCHBOARD_LISTEN` → `listen`, `SWITCHBOARD_LIMITS__MAX_CONNECTIONS` →
//! `limits.max_connections`, `SWITCHBOARD_NAMESPACES__PT__HISTORY_SIZE` →
//! `namespaces.pt.history_size`. A flat `SWITCHBOARD_MAX_CONNECTIONS` also reaches
//! `limits.max_connections`, since every limit key is unique.

mod trend;

pub use trend::TrendTier;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use switchboard_broker::HistoryPolicy;

pub use crate::error::ConfigError;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    pub listen: String,
    /// Runtime worker threads; 0 means one per core. Never more than the cores.
    pub workers: usize,
    /// `memory` (the embedded default) or `redis://host:port/db` (a cluster of nodes sharing
    /// one Redis; query options `prefix` and `presence_ttl_s`).
    pub broker: String,
    /// `/readyz` answers 503 while the broker's measured round trip
    /// ([`switchboard_broker::Broker::round_trip`]) is over this many ms; 0: never.
    pub broker_max_rtt_ms: u64,
    /// This node's id in replies and `/api/info`; random when unset.
    pub node_id: Option<String>,
    /// Names the deployment (every node of one cluster alike). It tells deployments apart
    /// where they meet — the default MQTT client id of a source is `switchboard-<cluster>-<name>`
    /// — so a staging and a production cluster sharing an MQTT broker never take each other's
    /// connections. Unset: a tag derived from the broker URL ([`Config::cluster_tag`]).
    pub cluster_name: Option<String>,
    /// `N@HZ`: simulate N point channels `pt:sim.<i>` at HZ each.
    pub simulate: Option<String>,
    /// Allow listening beyond loopback with no authentication configured.
    pub allow_anonymous: bool,
    /// Directory of the node's files (saved dashboards); created when first written.
    pub data_dir: std::path::PathBuf,
    /// Directory of the built dashboard app; unset means `web/dashboard/dist` found next to
    /// the working directory or the executable.
    pub web_dir: Option<std::path::PathBuf>,
    pub limits: Limits,
    /// Namespace options by namespace name; `""` is the default namespace.
    pub namespaces: HashMap<String, Namespace>,
    /// Authentication: JWT keys, users file, API keys, origins, proxies, grants.
    pub auth: crate::auth::AuthConfig,
    /// TLS certificate and key (serve `https://` and `wss://` directly).
    pub tls: crate::transport::tls::TlsConfig,
    /// The application's backend: connect, subscribe and publish hooks (`crate::proxy`).
    pub proxy: crate::proxy::ProxyConfig,
    /// SSE and long-polling: how long a poll is held, when idle poll sessions expire, SSE
    /// heartbeats.
    pub transports: Transports,
    /// `[[sources]]`: plant data sources (MQTT, OPC UA) that feed channels (docs/sources.md).
    pub sources: Vec<switchboard_sources::SourceConfig>,
    /// How long a node's lease on a source lasts without renewal (s): in a cluster, how soon
    /// another node takes a dead node's sources over. The alarms' lease lasts as long.
    pub source_lease_ttl_s: u64,
    /// `[[alarms]]`: alarm definitions (docs/alarms.md).
    pub alarms: Vec<crate::alarms::def::AlarmDef>,
    /// Days the alarm journal keeps its entries.
    pub alarm_journal_days: u64,
    /// Most entries the alarm journal keeps.
    pub alarm_journal_max_entries: usize,
    /// What `auth` and `tls` name, loaded and checked by [`Config::load`].
    #[serde(skip)]
    pub security: crate::auth::Security,
    /// The hooks `proxy` names, built by [`Config::load`].
    #[serde(skip)]
    pub hooks: std::sync::Arc<crate::proxy::Hooks>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub max_connections: usize,
    pub max_subscriptions: usize,
    /// Largest accepted client frame (and reassembled message) in bytes; larger closes 1009.
    pub max_frame_bytes: usize,
    /// Bound of a connection's queued, unwritten bytes (non-conflated) before 4008.
    pub max_pending_bytes: usize,
    /// Seconds between server pings; silent connections close after 3× this.
    pub ping_s: u64,
    /// Most channels one subscribe command may name.
    pub max_channels_per_subscribe: usize,
    /// Largest publication data in bytes (413).
    pub max_publication_bytes: usize,
    /// WebSocket connections from one client address; more are closed with 4029.
    pub max_connections_per_ip: usize,
    /// WebSocket handshakes per second from one client address (bursts of twice this pass);
    /// more are refused with HTTP 429.
    pub handshakes_per_ip_per_s: usize,
    /// Publishes per second on one connection (bursts of twice this pass); more get error 429.
    pub publishes_per_connection_per_s: usize,
    /// Presence joins per second on one connection — subscribes of channels in presence
    /// namespaces (bursts of twice this pass); more get error 429 for those channels. Leaves
    /// follow joins, so they are bounded too.
    pub presence_changes_per_connection_per_s: usize,
    /// Publications per second with one API key over the HTTP API; more get 429.
    pub publishes_per_api_key_per_s: usize,
    /// Publications per second by one user (token `sub` or Basic user name) over the HTTP API,
    /// all its requests together (bursts of twice this pass); more get 429.
    pub publishes_per_user_per_s: usize,
    /// Password checks (Argon2, tens of milliseconds each) per second for one client address;
    /// more are refused (WebSocket 4029, HTTP 429). Recently verified passwords skip the check.
    pub password_checks_per_ip_per_s: usize,
    /// Seconds a client has for its TLS handshake, each request head, and each WebSocket
    /// message once started (slowloris).
    pub handshake_timeout_s: u64,
    /// Seconds an unauthenticated client has for its first message when authentication is
    /// configured (4001 after).
    pub first_message_timeout_s: u64,
    /// Loopback clients (local tools and benchmarks, or a local proxy not listed in
    /// `auth.trusted_proxies`) skip the per-address and per-connection rate limits.
    pub exempt_loopback: bool,
    /// Most channels this node holds: in the memory broker every channel, with a shared broker
    /// the channels with local subscribers. Past it, publishing to or subscribing a new
    /// channel is refused with 429; existing channels keep working.
    pub max_channels: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Namespace {
    pub history_size: usize,
    pub history_ttl_s: u64,
    /// Slow subscribers get only the latest value per channel instead of a queue.
    pub conflate: bool,
    /// Clients may publish over WebSocket.
    pub client_publish: bool,
    /// Join/leave events and who-is-here.
    pub presence: bool,
    /// Who may subscribe, publish, see presence and read history.
    pub allow: crate::auth::Permissions,
    /// A channel with no subscriber, no present client and no publication for this long is
    /// forgotten entirely (epoch, offset, last value, history); 0 keeps channels forever.
    /// Unset: [`DEFAULT_CHANNEL_TTL_S`], except in the `pt` namespace (kept forever: a plant's
    /// tag set is fixed, and a valve that last changed a week ago must still show its value).
    pub channel_ttl_s: Option<u64>,
    /// How far back each channel's trend of numeric values reaches (s); 0 keeps none. Unset:
    /// an hour in the `pt` namespace, none elsewhere (see `switchboard_broker::trend`).
    pub trend_window_s: Option<u64>,
    /// Width of a trend bucket (s, at least 1).
    pub trend_step_s: u64,
    /// Trend tiers, finest first (instead of `trend_window_s` and `trend_step_s`): a read uses
    /// the finest that reaches back far enough (`config/trend.rs`).
    pub trend_tiers: Vec<trend::TrendTier>,
    /// The source (a `[[sources]]` name) that a permitted publish to a channel of this
    /// namespace is written to, instead of being published: the reply says whether the
    /// device accepted it.
    pub write_source: Option<String>,
    /// The subscribe hook decides every subscribe here (after the permission checks).
    pub proxy_subscribe: bool,
    /// The publish hook decides every client publish here (and may replace its data).
    pub proxy_publish: bool,
}

/// How far back a point channel's trend reaches unless its namespace says otherwise.
pub const DEFAULT_TREND_WINDOW_S: u64 = 3600;

/// The numbers of `[auth]`: read from the environment as numbers, where every other `auth` and
/// `tls` value (secrets, paths) stays text even when it looks like one.
const AUTH_NUMBERS: &[&str] = &["auth.jwt_leeway_s", "auth.jwks_refresh_s", "auth.revocation_keep_s"];

/// How long an idle channel is kept unless its namespace says otherwise.
pub const DEFAULT_CHANNEL_TTL_S: u64 = 3600;
/// How long an internal channel (`$…`, messages between nodes) is kept once idle, whatever
/// the namespaces say: its last message goes soon, and a dead node's reply channel too.
pub const INTERNAL_CHANNEL_TTL_S: u64 = 60;

impl Default for Config {
    fn default() -> Config {
        let mut namespaces = HashMap::new();
        namespaces.insert(String::new(), Namespace::default());
        namespaces.insert(
            "pt".to_string(),
            Namespace { history_size: 0, history_ttl_s: 0, conflate: true, ..Namespace::default() },
        );
        namespaces
            .insert("room".to_string(), Namespace { client_publish: true, presence: true, ..Namespace::default() });
        Config {
            listen: "127.0.0.1:8700".to_string(),
            workers: 0,
            broker: "memory".to_string(),
            broker_max_rtt_ms: 1000,
            node_id: None,
            cluster_name: None,
            simulate: None,
            allow_anonymous: false,
            data_dir: std::path::PathBuf::from("switchboard-data"),
            web_dir: None,
            limits: Limits::default(),
            namespaces,
            auth: crate::auth::AuthConfig::default(),
            tls: crate::transport::tls::TlsConfig::default(),
            proxy: crate::proxy::ProxyConfig::default(),
            transports: Transports::default(),
            sources: Vec::new(),
            source_lease_ttl_s: 5,
            alarms: Vec::new(),
            alarm_journal_days: 90,
            alarm_journal_max_entries: 1_000_000,
            security: crate::auth::Security::default(),
            hooks: Default::default(),
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 100_000,
            max_subscriptions: 10_000,
            max_frame_bytes: 64 * 1024,
            max_pending_bytes: 1024 * 1024,
            ping_s: 25,
            max_channels_per_subscribe: 10_000,
            max_publication_bytes: 64 * 1024,
            max_connections_per_ip: 1000,
            handshakes_per_ip_per_s: 50,
            publishes_per_connection_per_s: 100,
            presence_changes_per_connection_per_s: 20,
            publishes_per_api_key_per_s: 10_000,
            publishes_per_user_per_s: 1000,
            password_checks_per_ip_per_s: 5,
            handshake_timeout_s: 10,
            first_message_timeout_s: 5,
            exempt_loopback: true,
            max_channels: 1_000_000,
        }
    }
}

impl Default for Namespace {
    fn default() -> Namespace {
        Namespace {
            history_size: 100,
            history_ttl_s: 300,
            conflate: false,
            client_publish: false,
            presence: false,
            allow: crate::auth::Permissions::DEFAULT,
            channel_ttl_s: None,
            trend_window_s: None,
            trend_step_s: 1,
            trend_tiers: Vec::new(),
            write_source: None,
            proxy_subscribe: false,
            proxy_publish: false,
        }
    }
}

/// `[transports]`: the HTTP transports (SSE, long-polling; docs/protocol.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Transports {
    /// Seconds a `GET /poll/{session}` is held when nothing is pending.
    pub poll_timeout_s: u64,
    /// Seconds without a request after which a poll session expires.
    pub poll_session_ttl_s: u64,
    /// Seconds between `: ping` comments on an SSE stream.
    pub sse_heartbeat_s: u64,
}

impl Default for Transports {
    fn default() -> Transports {
        Transports { poll_timeout_s: 25, poll_session_ttl_s: 60, sse_heartbeat_s: 15 }
    }
}

impl Namespace {
    /// The history policy without a trend ([`Config::history_policy`] adds it).
    pub fn history(&self) -> HistoryPolicy {
        HistoryPolicy { size: self.history_size, ttl: Duration::from_secs(self.history_ttl_s), trend: None }
    }
}

const LIMIT_KEYS: [&str; 18] = [
    "max_connections",
    "max_subscriptions",
    "max_frame_bytes",
    "max_pending_bytes",
    "ping_s",
    "max_channels_per_subscribe",
    "max_publication_bytes",
    "max_connections_per_ip",
    "handshakes_per_ip_per_s",
    "publishes_per_connection_per_s",
    "presence_changes_per_connection_per_s",
    "publishes_per_api_key_per_s",
    "publishes_per_user_per_s",
    "password_checks_per_ip_per_s",
    "handshake_timeout_s",
    "first_message_timeout_s",
    "exempt_loopback",
    "max_channels",
];

/// Keys of `[transports]`, also reachable as flat `SWITCHBOARD_POLL_TIMEOUT_S` etc.
const TRANSPORT_KEYS: [&str; 3] = ["poll_timeout_s", "poll_session_ttl_s", "sse_heartbeat_s"];

/// `SWITCHBOARD_*` variables that are not configuration keys: `SWITCHBOARD_LOG` is the log
/// filter (read by the binary before the configuration); `SWITCHBOARD_BIN` names the binary
/// for the test and benchmark scripts, which start servers with their environment;
/// `SWITCHBOARD_TOKEN`, `SWITCHBOARD_USER` and `SWITCHBOARD_PASSWORD` are the credentials of
/// the `publish` and `sub` tools, which a shell that runs both a node and the tools exports.
const NOT_CONFIG_VARS: [&str; 5] = ["LOG", "BIN", "TOKEN", "USER", "PASSWORD"];

/// Flat `SWITCHBOARD_*` names of the security settings (the flags' names) and their keys.
const SECURITY_KEYS: [(&str, &str, &str); 12] = [
    ("jwt_secret", "auth", "jwt_secret"),
    ("jwt_public_key", "auth", "jwt_public_key"),
    ("jwks", "auth", "jwks"),
    ("users", "auth", "users"),
    ("api_key", "auth", "api_keys"),
    ("api_keys", "auth", "api_keys"),
    ("allowed_origin", "auth", "allowed_origins"),
    ("allowed_origins", "auth", "allowed_origins"),
    ("trusted_proxies", "auth", "trusted_proxies"),
    ("tls_cert", "tls", "cert"),
    ("tls_key", "tls", "key"),
    ("jwt_leeway_s", "auth", "jwt_leeway_s"),
];

impl Config {
    /// What tells this deployment apart: `cluster_name`, or else eight hex digits of a hash of
    /// what its nodes share — the broker URL without credentials (or, for the embedded broker,
    /// the host name and listen address of the one node).
    pub fn cluster_tag(&self) -> String {
        if let Some(name) = &self.cluster_name {
            return name.clone();
        }
        let shared = match self.broker.as_str() {
            "memory" => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                format!("memory@{}/{}", host.trim(), self.listen)
            }
            url => without_credentials(url),
        };
        // FNV-1a: stable across processes, versions and machines.
        let hash = shared.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
        format!("{hash:08x}")
    }

    /// Loads the file (if any), then the environment, then `overrides` (flag key paths and
    /// values), and validates the result.
    pub fn load(
        file: Option<&std::path::Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &[(&str, toml::Value)],
    ) -> Result<Config, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| ConfigError(format!("config file {}: {e}", path.display())))?;
                text.parse::<toml::Table>().map_err(|e| ConfigError(format!("config file {}: {e}", path.display())))?
            }
            None => toml::Table::new(),
        };
        for (key, value) in env {
            let Some(rest) = key.strip_prefix("SWITCHBOARD_") else { continue };
            if NOT_CONFIG_VARS.contains(&rest) {
                continue;
            }
            let mut path: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
            if path.len() == 1 && LIMIT_KEYS.contains(&path[0].as_str()) {
                path.insert(0, "limits".to_string());
            }
            if path.len() == 1 && TRANSPORT_KEYS.contains(&path[0].as_str()) {
                path.insert(0, "transports".to_string());
            }
            if path.len() == 1 {
                if let Some((_, section, name)) = SECURITY_KEYS.iter().find(|(flat, _, _)| *flat == path[0]) {
                    path = vec![section.to_string(), name.to_string()];
                }
            }
            let dotted = path.join(".");
            let value = if dotted == "auth.api_keys" {
                // A plain key from the environment is hashed here and never kept.
                api_keys_value(&value).map_err(|e| ConfigError(format!("environment {key} ({dotted}): {e}")))?
            } else if (path[0] == "auth" || path[0] == "tls") && !AUTH_NUMBERS.contains(&dotted.as_str()) {
                // Secrets and paths stay text, even when they look like numbers.
                toml::Value::String(value)
            } else {
                env_value(&value)
            };
            set_path(&mut table, &path, value)
                .map_err(|e| ConfigError(format!("environment {key} ({dotted}): {e}")))?;
        }
        for (dotted, value) in overrides {
            let path: Vec<String> = dotted.split('.').map(str::to_string).collect();
            set_path(&mut table, &path, value.clone()).map_err(|e| ConfigError(format!("{dotted}: {e}")))?;
        }
        // Namespaces given in the file start from the built-in defaults of that namespace: a
        // `[namespaces.pt]` that sets only `history_size` keeps pt's conflation.
        if let Some(toml::Value::Table(given)) = table.get_mut("namespaces") {
            for (name, key, value) in BUILT_IN_NAMESPACE_KEYS.iter() {
                if let Some(toml::Value::Table(ns)) = given.get_mut(*name) {
                    ns.entry(key.to_string()).or_insert_with(|| value.clone());
                }
            }
        }
        let mut config: Config = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| ConfigError(format!("{}: {}", e.path(), e.inner().message().trim())))?;
        let defaults = Config::default();
        for (name, ns) in defaults.namespaces {
            config.namespaces.entry(name).or_insert(ns);
        }
        config.validate()?;
        let hooks = crate::proxy::Hooks::build(&config.proxy)?;
        for (name, ns) in &config.namespaces {
            if ns.proxy_subscribe && !hooks.has_subscribe() {
                return Err(ConfigError(format!("namespaces.{name}.proxy_subscribe: needs proxy.subscribe_url")));
            }
            if ns.proxy_publish && !hooks.has_publish() {
                return Err(ConfigError(format!("namespaces.{name}.proxy_publish: needs proxy.publish_url")));
            }
        }
        let auth = crate::auth::Auth::build(&config.auth, &config.limits.auth(), config.listen_addr()?.ip())?
            .with_connect_hook(hooks.has_connect());
        config.security =
            crate::auth::Security { auth: std::sync::Arc::new(auth), tls: crate::transport::tls::load(&config.tls)? };
        config.hooks = std::sync::Arc::new(hooks);
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.listen_addr()?;
        // The message never repeats the URL: it may carry the Redis password.
        switchboard_broker::check_url(&self.broker).map_err(|e| ConfigError(format!("broker: {e}")))?;
        if let Some(sim) = &self.simulate {
            parse_simulate(sim).map_err(|e| ConfigError(format!("simulate: {e}")))?;
        }
        let l = &self.limits;
        for (key, v) in [
            ("limits.max_connections", l.max_connections),
            ("limits.max_subscriptions", l.max_subscriptions),
            ("limits.max_frame_bytes", l.max_frame_bytes),
            ("limits.max_pending_bytes", l.max_pending_bytes),
            ("limits.ping_s", l.ping_s as usize),
            ("limits.max_channels_per_subscribe", l.max_channels_per_subscribe),
            ("limits.max_channels", l.max_channels),
            ("limits.max_publication_bytes", l.max_publication_bytes),
            ("limits.max_connections_per_ip", l.max_connections_per_ip),
            ("limits.handshakes_per_ip_per_s", l.handshakes_per_ip_per_s),
            ("limits.publishes_per_connection_per_s", l.publishes_per_connection_per_s),
            ("limits.presence_changes_per_connection_per_s", l.presence_changes_per_connection_per_s),
            ("limits.publishes_per_api_key_per_s", l.publishes_per_api_key_per_s),
            ("limits.publishes_per_user_per_s", l.publishes_per_user_per_s),
            ("limits.password_checks_per_ip_per_s", l.password_checks_per_ip_per_s),
            ("limits.handshake_timeout_s", l.handshake_timeout_s as usize),
            ("limits.first_message_timeout_s", l.first_message_timeout_s as usize),
            ("transports.poll_timeout_s", self.transports.poll_timeout_s as usize),
            ("transports.poll_session_ttl_s", self.transports.poll_session_ttl_s as usize),
            ("transports.sse_heartbeat_s", self.transports.sse_heartbeat_s as usize),
            ("source_lease_ttl_s", self.source_lease_ttl_s as usize),
            ("alarm_journal_days", self.alarm_journal_days as usize),
            ("alarm_journal_max_entries", self.alarm_journal_max_entries),
        ] {
            if v == 0 {
                return Err(ConfigError(format!("{key}: must be greater than 0")));
            }
        }
        for (name, ns) in &self.namespaces {
            trend::validate(name, ns)?;
        }
        self.validate_sources()?;
        self.validate_alarms()?;
        if l.max_frame_bytes < 125 {
            return Err(ConfigError("limits.max_frame_bytes: must be at least 125".into()));
        }
        if !self.allow_anonymous && !self.listen_addr()?.ip().is_loopback() && !self.auth_configured() {
            return Err(ConfigError(format!(
                "listen: {} is beyond loopback and no authentication is configured (--jwt-secret, --jwt-public-key, --jwks or --users); pass --allow-anonymous to serve anyway",
                self.listen
            )));
        }
        Ok(())
    }

    /// Each alarm definition, unique ids, at most [`crate::alarms::engine::MAX_DEFS`].
    fn validate_alarms(&self) -> Result<(), ConfigError> {
        let max = crate::alarms::engine::MAX_DEFS;
        if self.alarms.len() > max {
            return Err(ConfigError(format!("alarms: at most {max} definitions")));
        }
        let mut ids = std::collections::HashSet::new();
        for (i, def) in self.alarms.iter().enumerate() {
            def.validate().map_err(|e| ConfigError(format!("alarms[{i}].{e}")))?;
            if !ids.insert(def.id.as_str()) {
                return Err(ConfigError(format!("alarms[{i}].id: {:?} is used twice", def.id)));
            }
        }
        Ok(())
    }

    /// Each source's settings, unique names, and every namespace's `write_source` naming one.
    fn validate_sources(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::HashSet::new();
        for (i, source) in self.sources.iter().enumerate() {
            source.check().map_err(|e| ConfigError(format!("sources[{i}].{e}")))?;
            if !names.insert(source.name()) {
                return Err(ConfigError(format!("sources[{i}].name: {:?} is used twice", source.name())));
            }
        }
        for (ns, options) in &self.namespaces {
            if let Some(w) = &options.write_source {
                if !names.contains(w.as_str()) {
                    return Err(ConfigError(format!(
                        "namespaces.{ns}.write_source: no source named {w:?} in [[sources]]"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Whether clients must authenticate: a JWT key source or a users file is configured.
    /// (API keys alone protect only the HTTP API.)
    /// Whether clients must authenticate: a JWT key source, a users file, or the application's
    /// connect hook deciding who connects.
    pub fn auth_configured(&self) -> bool {
        let a = &self.auth;
        a.jwt_secret.is_some()
            || a.jwt_public_key.is_some()
            || a.jwks.is_some()
            || a.jwks_url.is_some()
            || a.users.is_some()
            || self.proxy.connect_url.is_some()
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen
            .parse()
            .map_err(|e| ConfigError(format!("listen: {:?} is not an address like 127.0.0.1:8700 ({e})", self.listen)))
    }

    /// The options of a channel's namespace; unknown namespaces use the default namespace's.
    pub fn namespace(&self, name: &str) -> &Namespace {
        self.namespaces.get(name).or_else(|| self.namespaces.get("")).unwrap_or(&DEFAULT_NAMESPACE)
    }

    /// How long `channel` is kept once idle (zero: forever); see [`Namespace::channel_ttl_s`].
    pub fn channel_ttl(&self, channel: &str) -> Duration {
        if channel.starts_with('$') {
            return Duration::from_secs(INTERNAL_CHANNEL_TTL_S);
        }
        let name = switchboard_protocol::namespace_of(channel);
        // Point channels keep their last value for good, alarm channels their alarm's state.
        let kept = name == "pt" || name == crate::alarms::def::NAMESPACE;
        let ns = self.namespaces.get(name).unwrap_or_else(|| self.namespace(""));
        let default = if kept { 0 } else { DEFAULT_CHANNEL_TTL_S };
        Duration::from_secs(ns.channel_ttl_s.unwrap_or(default))
    }

    /// What `channel` keeps: its namespace's history and trend.
    pub fn history_policy(&self, channel: &str) -> HistoryPolicy {
        let name = switchboard_protocol::namespace_of(channel);
        let (name, ns) = match self.namespaces.get(name) {
            Some(ns) => (name, ns),
            None => ("", self.namespace("")),
        };
        HistoryPolicy { trend: trend::tiers(name, ns), ..ns.history() }
    }

    /// Worker threads: the configured number, capped at the cores.
    pub fn worker_threads(&self) -> usize {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        if self.workers == 0 {
            cores
        } else {
            self.workers.min(cores)
        }
    }
}

/// What the built-in namespaces set beyond [`DEFAULT_NAMESPACE`] (as in [`Config::default`]),
/// kept when a configuration names one of them.
static BUILT_IN_NAMESPACE_KEYS: std::sync::LazyLock<Vec<(&str, &str, toml::Value)>> = std::sync::LazyLock::new(|| {
    let defaults = Config::default();
    let mut keys = Vec::new();
    for name in ["pt", "room"] {
        let ns = defaults.namespace(name);
        if ns.history_size != DEFAULT_NAMESPACE.history_size {
            keys.push((name, "history_size", toml::Value::Integer(ns.history_size as i64)));
        }
        if ns.history_ttl_s != DEFAULT_NAMESPACE.history_ttl_s {
            keys.push((name, "history_ttl_s", toml::Value::Integer(ns.history_ttl_s as i64)));
        }
        for (key, on, default) in [
            ("conflate", ns.conflate, DEFAULT_NAMESPACE.conflate),
            ("client_publish", ns.client_publish, DEFAULT_NAMESPACE.client_publish),
            ("presence", ns.presence, DEFAULT_NAMESPACE.presence),
        ] {
            if on != default {
                keys.push((name, key, toml::Value::Boolean(on)));
            }
        }
    }
    keys
});

impl Limits {
    /// The bytes of data one reply may carry — a subscribe's `last`, `recovered` and `trend`, a
    /// `history` page, the body of `GET …/trend` — on every transport: half of
    /// `max_pending_bytes` (docs/protocol.md, "Reply bound"). The other half stays for what a
    /// connection queues while its reply is built (a reply that pushes a non-empty queue past
    /// the bound closes the connection with 4008).
    pub fn reply_budget(&self) -> usize {
        self.max_pending_bytes / 2
    }

    /// The limits authentication enforces.
    pub fn auth(&self) -> crate::auth::AuthLimits {
        crate::auth::AuthLimits {
            max_connections_per_ip: self.max_connections_per_ip,
            handshakes_per_ip_per_s: self.handshakes_per_ip_per_s,
            publishes_per_api_key_per_s: self.publishes_per_api_key_per_s,
            publishes_per_user_per_s: self.publishes_per_user_per_s,
            password_checks_per_ip_per_s: self.password_checks_per_ip_per_s,
            exempt_loopback: self.exempt_loopback,
        }
    }
}

/// Authentication's limits default to `[limits]`'s (one place for the numbers).
impl Default for crate::auth::AuthLimits {
    fn default() -> crate::auth::AuthLimits {
        Limits::default().auth()
    }
}

static DEFAULT_NAMESPACE: Namespace = Namespace {
    history_size: 100,
    history_ttl_s: 300,
    conflate: false,
    client_publish: false,
    presence: false,
    allow: crate::auth::Permissions::DEFAULT,
    channel_ttl_s: None,
    trend_window_s: None,
    trend_step_s: 1,
    trend_tiers: Vec::new(),
    write_source: None,
    proxy_subscribe: false,
    proxy_publish: false,
};

/// Parses `N@HZ`.
pub fn parse_simulate(s: &str) -> Result<(usize, f64), String> {
    let (n, hz) = s.split_once('@').ok_or_else(|| format!("{s:?} is not N@HZ, e.g. 1000@1"))?;
    let n: usize = n.trim().parse().map_err(|_| format!("{n:?} is not a count"))?;
    let hz: f64 = hz.trim().parse().map_err(|_| format!("{hz:?} is not a rate"))?;
    if n == 0 || !(hz > 0.0 && hz <= 1000.0) {
        return Err(format!("{s:?}: need N > 0 and 0 < HZ <= 1000"));
    }
    Ok((n, hz))
}

fn env_value(s: &str) -> toml::Value {
    if let Ok(i) = s.parse::<i64>() {
        return toml::Value::Integer(i);
    }
    if let Ok(f) = s.parse::<f64>() {
        return toml::Value::Float(f);
    }
    match s {
        "true" => toml::Value::Boolean(true),
        "false" => toml::Value::Boolean(false),
        _ => toml::Value::String(s.to_string()),
    }
}

/// `auth.api_keys` from the environment: one key or a comma-separated list, each plain (hashed
/// here) or already a `sha256:` digest.
fn api_keys_value(text: &str) -> Result<toml::Value, String> {
    let keys = text
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(|k| crate::auth::apikey::stored_form(k).map(toml::Value::String))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(toml::Value::Array(keys))
}

fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), String> {
    let (last, parents) = path.split_last().ok_or("empty key")?;
    let mut t = table;
    for p in parents {
        let entry = t.entry(p.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry.as_table_mut().ok_or_else(|| format!("{p} is not a table"))?;
    }
    t.insert(last.clone(), value);
    Ok(())
}

/// A broker URL (or comma-separated list) without the `user:password@` of each part.
fn without_credentials(url: &str) -> String {
    url.split(',')
        .map(|part| match (part.find("://"), part.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => format!("{}{}", &part[..scheme + 3], &part[at + 1..]),
            _ => part.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests;
