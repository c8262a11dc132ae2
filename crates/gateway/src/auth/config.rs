//! `[auth]` of the configuration file ([`AuthConfig`], its grants and their dashboard rights),
//! the value types it is read with ([`Secret`], [`StringList`]), its defaults, and the limits of
//! `[limits]` that authentication enforces ([`AuthLimits`]).

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer};

/// A configuration value that must never be printed (`Debug` shows `<redacted>`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// A list of strings that may also be written as one comma-separated string (handy in
/// `SWITCHBOARD_*` variables).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StringList(pub Vec<String>);

impl<'de> Deserialize<'de> for StringList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<StringList, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            One(String),
            Many(Vec<String>),
        }
        Ok(StringList(match Form::deserialize(d)? {
            Form::One(s) => s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect(),
            Form::Many(v) => v,
        }))
    }
}

/// `[auth]` in the configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// HS256 shared secret (at least 32 bytes).
    pub jwt_secret: Option<Secret>,
    /// PEM file with an RSA (RS256) or EC P-256 (ES256) public key.
    pub jwt_public_key: Option<PathBuf>,
    /// JWK set file (RS256, ES256 and HS256 keys, chosen by `kid`).
    pub jwks: Option<PathBuf>,
    /// JWK set URL of an identity provider: fetched at start, every `jwks_refresh_s` and on an
    /// unknown `kid` (see [`super::jwks`]); combines with the other key sources.
    pub jwks_url: Option<String>,
    /// Seconds between two fetches of `jwks_url`; 300 when unset.
    pub jwks_refresh_s: Option<u64>,
    /// The longest token lifetime accepted (a token whose `exp` is further away is refused),
    /// and so how long a revocation is kept when it does not say (a user's `issued_before`
    /// plus this); 86400 when unset.
    pub revocation_keep_s: Option<u64>,
    /// Required `iss` claim, when set.
    pub jwt_issuer: Option<String>,
    /// Required `aud` claim, when set.
    pub jwt_audience: Option<String>,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds.
    pub jwt_leeway_s: u64,
    /// Users file for Basic authentication (`switchboard user add`).
    pub users: Option<PathBuf>,
    /// SHA-256 digests (`sha256:<hex>`) of the HTTP API keys.
    pub api_keys: StringList,
    /// Origins allowed to open browser WebSockets and to send writes to the HTTP API; empty
    /// means same-origin only, `*` any.
    pub allowed_origins: StringList,
    /// Host names of this node besides its listen address (`gw.example.com`; `*` any): a
    /// request whose `Host` names anything else is refused 403 (DNS rebinding). Checked when
    /// set, and always when `allowed_origins` is empty; see
    /// [`super::credentials::host_allowed`].
    pub hosts: StringList,
    /// Proxies whose `X-Forwarded-For` / `X-Real-IP` give the client address (IPs or CIDR).
    pub trusted_proxies: StringList,
    /// Per user (Basic user name or token `sub`): patterns for users whose credentials carry
    /// none (Basic users, tokens without `channels` / `publish` claims), and dashboard rights.
    pub grants: HashMap<String, Grant>,
}

/// `[auth.grants.<user>]`: what a user may subscribe to and publish to, and what it may do
/// with saved dashboards.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Grant {
    pub channels: Option<Vec<String>>,
    pub publish: Option<Vec<String>>,
    /// `"own"` (the default), `"edit"` or `"read"`; another value is a configuration error
    /// naming `auth.grants.<user>.dashboards`.
    pub dashboards: DashboardAccess,
}

/// What a user may do with the saved dashboards (`[auth.grants.<user>] dashboards`). Everyone
/// may read them; API keys may change any (see `crate::dashboards`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DashboardAccess {
    /// Create dashboards, and replace or delete its own and those created without credentials.
    #[default]
    Own,
    /// Also replace or delete anybody's (a dashboard keeps its owner).
    Edit,
    /// Read only: creating, replacing and deleting are refused (403).
    Read,
}

/// Seconds between two fetches of `auth.jwks_url` unless `jwks_refresh_s` says.
pub const DEFAULT_JWKS_REFRESH_S: u64 = 300;
/// How long a revocation is kept unless it or `auth.revocation_keep_s` says.
pub const DEFAULT_REVOCATION_KEEP_S: u64 = 86_400;

/// The limits of `[limits]` that authentication enforces (its defaults are `[limits]`'s, see
/// `config::Limits::auth`).
#[derive(Debug, Clone, Copy)]
pub struct AuthLimits {
    pub max_connections_per_ip: usize,
    pub handshakes_per_ip_per_s: usize,
    pub publishes_per_api_key_per_s: usize,
    pub publishes_per_user_per_s: usize,
    pub password_checks_per_ip_per_s: usize,
    pub exempt_loopback: bool,
}
