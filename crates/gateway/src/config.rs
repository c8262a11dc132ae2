//! Node configuration: a TOML file, overlaid by `SWITCHBOARD_*` environment variables, overlaid
//! by command-line flags. Unknown keys and bad values are errors that name the key.
//!
//! Environment variables map onto keys by lower-casing and splitting on `__`:
//! `SWITCHBOARD_LISTEN` → `listen`, `SWITCHBOARD_LIMITS__MAX_CONNECTIONS` →
//! `limits.max_connections`, `SWITCHBOARD_NAMESPACES__PT__HISTORY_SIZE` →
//! `namespaces.pt.history_size`. A flat `SWITCHBOARD_MAX_CONNECTIONS` also reaches
//! `limits.max_connections`, since every limit key is unique.
//!
//! # Layout
//! - this file: [`Config`], its defaults, `[transports]` and what the node derives from it
//!   (cluster tag, listen address, worker threads).
//! - `load`: [`Config::load`], file, environment and flags merged into one configuration.
//! - `validate`: the checks of a loaded configuration.
//! - `limits`: `[limits]` ([`Limits`]), WebSocket compression among them ([`Compression`]).
//! - `namespace`: `[namespaces.<ns>]` ([`Namespace`]) and what a channel gets from its namespace.
//! - `trend`: a namespace's trend tiers.

mod limits;
mod load;
mod namespace;
mod trend;
mod validate;

pub use limits::{Compression, Limits};
pub use namespace::{Namespace, DEFAULT_CHANNEL_TTL_S, DEFAULT_TREND_WINDOW_S, INTERNAL_CHANNEL_TTL_S};
pub use trend::TrendTier;

use std::collections::HashMap;
use std::net::SocketAddr;

use serde::Deserialize;

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
