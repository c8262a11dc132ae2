//! Authentication, permissions and abuse limits (SPEC §6; docs/security.md).
//!
//! Who a client is — its [`Identity`] — is settled once per connection (handshake credentials
//! or a `connect` command) and once per HTTP request; what it may do is decided per command by
//! [`Auth::check`] from the channel's namespace permissions and the identity's patterns.
//!
//! # Layout
//! - this file: [`Auth`], the loaded state built from the configuration, and authentication
//!   (tokens, passwords, API keys) into an [`Identity`]; [`Security`].
//! - `config`: `[auth]` ([`AuthConfig`], grants, [`Secret`], [`StringList`]) and [`AuthLimits`].
//! - `identity`: [`Identity`], how it was established ([`Method`]), and [`AuthFailure`].
//! - `permissions`: namespace permissions ([`Access`], [`Permissions`], [`Action`]) and
//!   [`Auth::check`].
//! - [`credentials`]: taking credentials and origins out of handshake headers (pure, fuzzed).
//! - [`pattern`]: channel patterns with `*` and `**` (pure, fuzzed).
//! - [`jwt`]: token verification (HS256 / RS256 / ES256, PEM and JWK sets).
//! - [`jwks`]: reading JWK sets (files and URLs), and the set fetched from `auth.jwks_url`
//!   and kept fresh.
//! - [`revoke`]: revoked tokens (by `jti`, or a user's tokens issued before a time).
//! - [`users`]: the Argon2 users file for Basic authentication, and `switchboard user add`.
//! - [`pool`]: the threads that run Argon2 checks, with a bounded queue (429 when full).
//! - [`apikey`]: hashed API keys for the HTTP API.
//! - `stored`: [`StoredIdentity`], who a client is without secrets, as shared stores keep it
//!   (a moved long-poll session's client).
//! - [`limits`]: per-address connection and handshake limits, per-key and per-user publish
//!   rates, and the client address behind trusted proxies.
//! - `tests.rs`: unit tests of [`Auth`].
//! - [`http`]: the middleware in front of every route: `Host` checks (DNS rebinding), `Origin`
//!   checks on writes, HTTP API credentials (401 / 403).
//!
//! Secrets never leave this module in a printable form: [`Secret`] and
//! [`credentials::Credential`] redact themselves in `Debug`, error texts never quote a token,
//! and nothing here logs above `debug` level or logs credentials at all.

pub mod apikey;
mod config;
pub mod credentials;
pub mod http;
mod identity;
pub mod jwks;
pub mod jwt;
pub mod limits;
pub mod pattern;
mod permissions;
pub mod pool;
pub mod revoke;
mod stored;
pub mod users;

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

pub use self::config::{
    AuthConfig, AuthLimits, DashboardAccess, Grant, Secret, StringList, DEFAULT_JWKS_REFRESH_S,
    DEFAULT_REVOCATION_KEEP_S,
};
use self::credentials::Credential;
pub use self::identity::{AuthFailure, Identity, Method};
use self::jwt::{JwtVerifier, TokenError};
use self::limits::{Limiter, Net};
use self::pattern::PatternSet;
pub use self::permissions::{Access, Action, Permissions};
pub use self::stored::StoredIdentity;
use self::users::Users;
use crate::error::ConfigError;

/// Subscribe and publish patterns of a grant; `None` leaves that side unrestricted.
type Patterns = (Option<Arc<PatternSet>>, Option<Arc<PatternSet>>);

/// The loaded authentication state of a node: keys, users, API keys, origin and proxy lists,
/// per-user grants and the abuse limiter. Built once from the configuration.
pub struct Auth {
    jwt: Option<JwtVerifier>,
    users: Option<Arc<Users>>,
    /// Where password checks run (present with a users file).
    passwords: Option<pool::PasswordPool>,
    api_keys: apikey::ApiKeys,
    allowed_origins: Vec<String>,
    /// `auth.hosts`, and whether `Host` is checked at all (see [`Auth::host_allowed`]).
    hosts: Vec<String>,
    check_host: bool,
    /// The listen address's IP, for the `Host` check.
    bound: IpAddr,
    trusted_proxies: Vec<Net>,
    grants: HashMap<String, Patterns>,
    /// `dashboards` of the grants, by user.
    dashboards: HashMap<String, DashboardAccess>,
    pub limiter: Arc<Limiter>,
    exempt_loopback: bool,
    leeway_s: u64,
    verified: PasswordCache,
    /// Tokens revoked through `/api/revoke` (on any node of the cluster).
    pub revoked: revoke::Revocations,
    /// A connect hook authenticates connections without credentials.
    connect_hook: bool,
}

/// Passwords verified in the last minute, so a client presenting Basic credentials on every
/// request (or reconnecting) costs one Argon2 run per minute, not one per request. Keyed by a
/// SHA-256 over a per-process random salt, the user and the password: the cache holds no
/// password and no digest that outlives the process or helps outside it.
struct PasswordCache {
    salt: [u8; 32],
    map: parking_lot::Mutex<HashMap<[u8; 32], std::time::Instant>>,
}

/// How long a verified password is remembered, and how many are.
const PASSWORD_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(60);
const PASSWORD_CACHE_MAX: usize = 4096;

impl PasswordCache {
    fn new() -> PasswordCache {
        use argon2::password_hash::rand_core::{OsRng, RngCore};
        let mut salt = [0u8; 32];
        OsRng.fill_bytes(&mut salt);
        PasswordCache { salt, map: parking_lot::Mutex::new(HashMap::new()) }
    }

    fn key(&self, user: &str, password: &str) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(self.salt);
        h.update((user.len() as u64).to_le_bytes());
        h.update(user.as_bytes());
        h.update(password.as_bytes());
        h.finalize().into()
    }

    fn hit(&self, key: &[u8; 32]) -> bool {
        let map = self.map.lock();
        map.get(key).is_some_and(|t| t.elapsed() < PASSWORD_CACHE_TTL)
    }

    fn insert(&self, key: [u8; 32]) {
        let mut map = self.map.lock();
        if map.len() >= PASSWORD_CACHE_MAX {
            map.retain(|_, t| t.elapsed() < PASSWORD_CACHE_TTL);
            if map.len() >= PASSWORD_CACHE_MAX {
                map.clear();
            }
        }
        map.insert(key, std::time::Instant::now());
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("jwt", &self.jwt.is_some())
            .field("users", &self.users.as_ref().map(|u| u.len()))
            .field("api_keys", &self.api_keys.len())
            .field("allowed_origins", &self.allowed_origins)
            .finish_non_exhaustive()
    }
}

impl Default for Auth {
    /// No authentication, default limits.
    fn default() -> Auth {
        let l = AuthLimits::default();
        Auth {
            jwt: None,
            users: None,
            passwords: None,
            api_keys: apikey::ApiKeys::default(),
            allowed_origins: Vec::new(),
            hosts: Vec::new(),
            check_host: true,
            bound: IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            trusted_proxies: Vec::new(),
            grants: HashMap::new(),
            dashboards: HashMap::new(),
            limiter: Arc::new(
                Limiter::new(l.max_connections_per_ip, l.handshakes_per_ip_per_s, 0, 1)
                    .with_user_rate(l.publishes_per_user_per_s),
            ),
            exempt_loopback: l.exempt_loopback,
            leeway_s: 0,
            verified: PasswordCache::new(),
            revoked: revoke::Revocations::new(DEFAULT_REVOCATION_KEEP_S),
            connect_hook: false,
        }
    }
}

impl Auth {
    /// Loads every file the configuration names and checks every value; errors name the key.
    /// `listen` is the node's listen address, for the `Host` check.
    pub fn build(c: &AuthConfig, limits: &AuthLimits, listen: IpAddr) -> Result<Auth, ConfigError> {
        let err = |key: &str, msg: String| ConfigError(format!("auth.{key}: {msg}"));
        let jwt = JwtVerifier::new(
            c.jwt_secret.as_ref().map(|s| s.0.as_str()),
            c.jwt_public_key.as_deref(),
            c.jwks.as_deref(),
            c.jwt_issuer.clone(),
            c.jwt_audience.clone(),
            c.jwt_leeway_s,
        )
        .map_err(|(key, msg)| err(key, msg))?;
        let jwt = match &c.jwks_url {
            Some(url) => {
                let remote = jwks::RemoteKeys::new(url, c.jwks_refresh_s.unwrap_or(DEFAULT_JWKS_REFRESH_S))
                    .map_err(|e| err("jwks_url", e))?;
                jwt.with_remote(Arc::new(remote))
            }
            None => jwt,
        };
        let jwt = (!jwt.is_empty()).then_some(jwt);
        let users = c.users.as_deref().map(Users::load).transpose().map_err(|e| err("users", e))?.map(Arc::new);
        let api_keys = apikey::ApiKeys::parse(&c.api_keys.0).map_err(|i| {
            err(
                &format!("api_keys[{i}]"),
                "not a `sha256:<64 hex digits>` digest (`switchboard api-key` prints one)".into(),
            )
        })?;
        let trusted_proxies = c
            .trusted_proxies
            .0
            .iter()
            .enumerate()
            .map(|(i, s)| s.parse::<Net>().map_err(|e| err(&format!("trusted_proxies[{i}]"), e)))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, o) in c.allowed_origins.0.iter().enumerate() {
            if o != "*" && !(o.starts_with("http://") || o.starts_with("https://")) {
                return Err(err(
                    &format!("allowed_origins[{i}]"),
                    format!("{o:?} is not `*` nor an http(s):// origin"),
                ));
            }
        }
        for (i, h) in c.hosts.0.iter().enumerate() {
            if h.is_empty() || h.contains("://") || h.contains('/') {
                return Err(err(&format!("hosts[{i}]"), format!("{h:?} is not a host name (like gw.example.com)")));
            }
        }
        let mut grants = HashMap::new();
        for (user, g) in &c.grants {
            let parse = |what: &str, list: &Option<Vec<String>>| {
                list.as_ref()
                    .map(|l| {
                        PatternSet::parse(l)
                            .map(Arc::new)
                            .map_err(|(i, e)| err(&format!("grants.{user}.{what}[{i}]"), e.to_string()))
                    })
                    .transpose()
            };
            grants.insert(user.clone(), (parse("channels", &g.channels)?, parse("publish", &g.publish)?));
        }
        let dashboards = c.grants.iter().map(|(user, g)| (user.clone(), g.dashboards)).collect();
        let limiter = Limiter::new(
            limits.max_connections_per_ip,
            limits.handshakes_per_ip_per_s,
            api_keys.len(),
            limits.publishes_per_api_key_per_s,
        )
        .with_password_rate(limits.password_checks_per_ip_per_s)
        .with_user_rate(limits.publishes_per_user_per_s);
        let passwords = users.is_some().then(|| pool::PasswordPool::new(pool::THREADS, pool::QUEUE));
        Ok(Auth {
            jwt,
            users,
            passwords,
            api_keys,
            allowed_origins: c.allowed_origins.0.clone(),
            hosts: c.hosts.0.clone(),
            check_host: c.allowed_origins.0.is_empty() || !c.hosts.0.is_empty(),
            bound: listen,
            trusted_proxies,
            grants,
            dashboards,
            limiter: Arc::new(limiter),
            exempt_loopback: limits.exempt_loopback,
            leeway_s: c.jwt_leeway_s,
            verified: PasswordCache::new(),
            revoked: revoke::Revocations::new(c.revocation_keep_s.unwrap_or(DEFAULT_REVOCATION_KEEP_S)),
            connect_hook: false,
        })
    }

    /// Connections without credentials are asked about at the connect hook.
    pub fn with_connect_hook(mut self, on: bool) -> Auth {
        self.connect_hook = on;
        self
    }

    /// Whether clients must authenticate: a JWT key, a users file or a connect hook is
    /// configured.
    pub fn enabled(&self) -> bool {
        self.jwt.is_some() || self.users.is_some() || self.connect_hook
    }

    /// Whether connections without credentials go to the connect hook.
    pub fn has_connect_hook(&self) -> bool {
        self.connect_hook
    }

    /// The JWK set fetched from `auth.jwks_url`, when configured.
    pub fn remote_keys(&self) -> Option<&Arc<jwks::RemoteKeys>> {
        self.jwt.as_ref().and_then(|j| j.remote())
    }

    /// Whether the HTTP API asks for credentials: client authentication or API keys are
    /// configured.
    pub fn http_enabled(&self) -> bool {
        self.enabled() || !self.api_keys.is_empty()
    }

    pub fn has_jwt(&self) -> bool {
        self.jwt.is_some()
    }

    /// Clock skew tolerated on token times; a connection closes this long after `exp`.
    pub fn leeway_s(&self) -> u64 {
        self.leeway_s
    }

    /// The client address of a request (see [`limits::client_ip`]).
    pub fn client_ip(&self, peer: IpAddr, forwarded_for: Option<&str>, real_ip: Option<&str>) -> IpAddr {
        limits::client_ip(peer, &self.trusted_proxies, forwarded_for, real_ip)
    }

    /// Whether `ip` skips the per-address and per-connection rate limits (`exempt_loopback`).
    pub fn is_exempt(&self, ip: IpAddr) -> bool {
        self.exempt_loopback && ip.is_loopback()
    }

    pub fn origin_allowed(&self, origin: Option<&str>, host: Option<&str>) -> bool {
        credentials::origin_allowed(origin, host, &self.allowed_origins)
    }

    /// Whether a request's `Host` names this node (DNS rebinding): checked when `auth.hosts`
    /// is set or no origin allow-list is (a node with an allow-list and no `hosts` accepts
    /// any `Host`: its allow-list already keeps other sites' pages out).
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        !self.check_host || credentials::host_allowed(host, self.bound, &self.hosts)
    }

    /// Verifies a token (handshake, `connect`, `refresh`, HTTP): signature, claims, and that it
    /// is not revoked. A key id no key source has makes the JWK set be fetched again (see
    /// [`jwks::RemoteKeys::refetch_for_unknown_kid`]) before the token is refused.
    pub async fn verify_token(&self, token: &str) -> Result<Identity, AuthFailure> {
        let jwt = self.jwt.as_ref().ok_or(AuthFailure::NotConfigured("JWT authentication"))?;
        let t = match jwt.verify(token) {
            Err(TokenError::UnknownKey) => match jwt.remote() {
                Some(remote) if remote.refetch_for_unknown_kid().await => jwt.verify(token)?,
                _ => return Err(TokenError::UnknownKey.into()),
            },
            other => other?,
        };
        let now = crate::unix_s();
        // A revocation is kept `revocation_keep_s`: a token living longer could outlive it.
        if t.exp > now.saturating_add(self.revoked.keep_s()).saturating_add(self.leeway_s) {
            return Err(TokenError::LivesTooLong.into());
        }
        if self.revoked.is_revoked(&t.sub, t.jti.as_deref(), t.iat, now) {
            return Err(TokenError::Revoked.into());
        }
        let (grant_channels, grant_publish) = self.grant(&t.sub);
        Ok(Identity {
            method: Method::Token,
            channels: t.channels.map(Arc::new).or(grant_channels),
            publish: t.publish.map(Arc::new).or(grant_publish),
            user: t.sub,
            expires: Some(t.exp),
            jti: t.jti.map(Arc::from),
            issued_at: t.iat,
        })
    }

    /// The identity of a connection the connect hook accepted as `user`: that user's grant
    /// patterns (if any), expiring at `expire_at`.
    pub fn hook_identity(&self, user: String, expire_at: Option<u64>) -> Identity {
        let (channels, publish) = self.grant(&user);
        Identity { method: Method::Hook, user, channels, publish, expires: expire_at, jti: None, issued_at: None }
    }

    fn grant(&self, user: &str) -> Patterns {
        self.grants.get(user).cloned().unwrap_or((None, None))
    }

    /// What `user` (a Basic user's name or a token's `sub`) may do with saved dashboards: its
    /// grant's `dashboards`, `own` without one.
    pub fn dashboard_access(&self, user: &str) -> DashboardAccess {
        self.dashboards.get(user).copied().unwrap_or_default()
    }

    /// Verifies a user name and password: from the cache of recent successes, or on the
    /// password pool (Argon2 is slow on purpose; a full queue is `RateLimited`), at most `limits.password_checks_per_ip_per_s` times
    /// per second for `ip` (`None`: the address is exempt or unknown).
    pub async fn verify_password(
        &self,
        user: String,
        password: String,
        ip: Option<IpAddr>,
    ) -> Result<Identity, AuthFailure> {
        let users = self.users.clone().ok_or(AuthFailure::NotConfigured("Basic authentication"))?;
        let key = self.verified.key(&user, &password);
        if !self.verified.hit(&key) {
            if let Some(ip) = ip {
                if !self.limiter.admit_password_check(ip) {
                    return Err(AuthFailure::RateLimited);
                }
            }
            let name = user.clone();
            let pool = self.passwords.as_ref().ok_or(AuthFailure::NotConfigured("Basic authentication"))?;
            let ok = pool.run(move || users.verify(&name, &password)).await.ok_or(AuthFailure::RateLimited)?;
            if !ok {
                return Err(AuthFailure::Password);
            }
            self.verified.insert(key);
        }
        let (channels, publish) = self.grant(&user);
        Ok(Identity { method: Method::Password, user, channels, publish, expires: None, jti: None, issued_at: None })
    }

    /// Authenticates what a client presented, with no per-address limit on password checks.
    pub async fn authenticate(&self, c: Credential) -> Result<Identity, AuthFailure> {
        self.authenticate_from(c, None).await
    }

    /// Authenticates what a WebSocket client presented at the handshake; `ip` (unless exempt)
    /// is charged for password checks.
    pub async fn authenticate_from(&self, c: Credential, ip: Option<IpAddr>) -> Result<Identity, AuthFailure> {
        match c {
            Credential::Bearer(token) => self.verify_token(&token).await,
            Credential::Basic { user, password } => self.verify_password(user, password, ip).await,
        }
    }

    /// Authenticates an HTTP API request: an API key, a token or a password.
    pub async fn authenticate_http(&self, c: Credential, ip: Option<IpAddr>) -> Result<Identity, AuthFailure> {
        match c {
            Credential::Bearer(token) => {
                if let Some(i) = self.api_keys.find(&token) {
                    return Ok(Identity {
                        method: Method::ApiKey(i),
                        user: format!("api-key-{i}"),
                        channels: None,
                        publish: None,
                        expires: None,
                        jti: None,
                        issued_at: None,
                    });
                }
                // Only something shaped like a JWT (three dot-separated parts) is tried as
                // one, so a mistyped API key is reported as such.
                if self.jwt.is_none() || token.split('.').count() != 3 {
                    return Err(AuthFailure::ApiKey);
                }
                self.verify_token(&token).await
            }
            basic => self.authenticate_from(basic, ip).await,
        }
    }
}

/// The node's loaded security material: authentication state and the TLS server
/// configuration. Built by [`crate::config::Config::load`] so that a bad key file is a
/// configuration error (exit 2) naming its key.
#[derive(Clone, Default)]
pub struct Security {
    pub auth: Arc<Auth>,
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl fmt::Debug for Security {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Security").field("auth", &self.auth).field("tls", &self.tls.is_some()).finish()
    }
}

#[cfg(test)]
mod tests;
