//! Loading: the TOML file, then `SWITCHBOARD_*` variables mapped onto keys, then flags, merged
//! into one table over the built-in namespaces' defaults, deserialized and validated into a
//! [`Config`] with its security material and hooks built.

use super::namespace::DEFAULT_NAMESPACE;
use super::{Config, ConfigError};

/// The numbers of `[auth]`: read from the environment as numbers, where every other `auth` and
/// `tls` value (secrets, paths) stays text even when it looks like one.
const AUTH_NUMBERS: &[&str] = &["auth.jwt_leeway_s", "auth.jwks_refresh_s", "auth.revocation_keep_s"];

const LIMIT_KEYS: [&str; 20] = [
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
    "compression",
    "compression_min_bytes",
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
