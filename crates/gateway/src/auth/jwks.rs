//! [`RemoteKeys`]: the JWK set at `auth.jwks_url` — fetched when the node starts, again every
//! `jwks_refresh_s`, and when a token names a key id no key source has (at most once per
//! [`KID_REFETCH_GAP`]), so an identity provider rotates its keys without a restart.
//!
//! A failed refresh (unreachable, not a JWK set, no usable key) keeps the last good set, logs a
//! warning and counts in `switchboard_jwks_refreshes_total{outcome="failed"}`. Keys of other
//! types, curves or uses in the set are skipped (see [`keys_of_set`], also used for `auth.jwks` files).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::Uri;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use parking_lot::RwLock;

use crate::proxy::client::HttpClient;

/// One verification key and the algorithm it is for.
pub(super) struct Key {
    pub(super) kid: Option<String>,
    pub(super) alg: Algorithm,
    pub(super) key: DecodingKey,
}

/// The usable keys of a JWK set's text: RS256, ES256 (P-256) and HS256 signing keys; keys of
/// other types, curves or uses are skipped. `Err` when the text is not a JWK set, a usable
/// key is broken, or no key is usable.
pub(super) fn keys_of_set(text: &str) -> Result<Vec<Key>, String> {
    let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWK set: {e}"))?;
    let mut keys = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        // Identity providers publish encryption keys and other algorithms beside the
        // signing keys; only RS256, ES256 and HS256 signing keys are taken.
        if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
            continue;
        }
        let alg = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
            AlgorithmParameters::OctetKey(_) => Algorithm::HS256,
            _ => continue,
        };
        if let Some(named) = jwk.common.key_algorithm {
            if named.to_string().parse::<Algorithm>().ok() != Some(alg) {
                continue;
            }
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key {i} is unusable: {e}"))?;
        keys.push(Key { kid: jwk.common.key_id.clone(), alg, key });
    }
    if keys.is_empty() {
        return Err("no RS256, ES256 (P-256) or HS256 signing key in the set".into());
    }
    Ok(keys)
}

/// Shortest time between two fetches caused by unknown key ids: tokens with made-up `kid`s
/// must not turn into a flood of requests to the identity provider.
pub const KID_REFETCH_GAP: Duration = Duration::from_secs(10);
/// Deadline of one fetch.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a starting node tries before it gives up (exit 2).
pub const STARTUP_WAIT: Duration = Duration::from_secs(10);

/// The fetched keys and their refresh state. Shared by the verifier and the refresh task.
pub struct RemoteKeys {
    url: Uri,
    refresh: Duration,
    client: HttpClient,
    /// Replaced whole on each good fetch; readers clone the `Arc` and never wait on a fetch.
    keys: RwLock<Arc<Vec<Key>>>,
    /// Held while a fetch for an unknown key id runs (others wait for it instead of fetching
    /// too), with when the last such fetch started.
    kid_fetch: tokio::sync::Mutex<Option<Instant>>,
    ok: AtomicU64,
    failed: AtomicU64,
}

impl RemoteKeys {
    /// `Err` names what is wrong with the URL or the refresh period.
    pub fn new(url: &str, refresh_s: u64) -> Result<RemoteKeys, String> {
        let url = crate::proxy::client::parse_url(url)?;
        if refresh_s == 0 {
            return Err("jwks_refresh_s must be at least 1".into());
        }
        Ok(RemoteKeys {
            url,
            refresh: Duration::from_secs(refresh_s),
            client: HttpClient::new(),
            keys: RwLock::new(Arc::new(Vec::new())),
            kid_fetch: tokio::sync::Mutex::new(None),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// The current keys (empty before the first good fetch).
    pub(super) fn keys(&self) -> Arc<Vec<Key>> {
        self.keys.read().clone()
    }

    /// Fetches the set once; on success it replaces the keys. Counted either way.
    pub async fn fetch(&self) -> Result<usize, String> {
        let got = match self.client.get(&self.url, FETCH_TIMEOUT).await {
            Ok(body) => std::str::from_utf8(&body).map_err(|_| "not UTF-8 text".to_string()).and_then(keys_of_set),
            Err(e) => Err(e.to_string()),
        };
        match got {
            Ok(keys) => {
                let n = keys.len();
                *self.keys.write() = Arc::new(keys);
                self.ok.fetch_add(1, Relaxed);
                Ok(n)
            }
            Err(e) => {
                self.failed.fetch_add(1, Relaxed);
                Err(e)
            }
        }
    }

    /// The first fetch of a starting node: tried until it succeeds or [`STARTUP_WAIT`] passes;
    /// `Err` is the configuration error (exit 2).
    pub async fn fetch_at_start(&self) -> Result<(), crate::error::ConfigError> {
        let deadline = Instant::now() + STARTUP_WAIT;
        loop {
            match self.fetch().await {
                Ok(n) => {
                    tracing::info!(keys = n, "JWK set fetched");
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(crate::error::ConfigError(format!(
                        "auth.jwks_url: no usable JWK set within {} s of starting: {e}",
                        STARTUP_WAIT.as_secs()
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }

    /// Fetches the set again because a token named an unknown key id, unless such a fetch
    /// started less than [`KID_REFETCH_GAP`] ago. Returns whether the keys may have changed
    /// (the caller verifies once more).
    pub async fn refetch_for_unknown_kid(&self) -> bool {
        let mut last = self.kid_fetch.lock().await;
        if last.is_some_and(|t| t.elapsed() < KID_REFETCH_GAP) {
            // A fetch ran moments ago (possibly while this caller waited for it).
            return true;
        }
        *last = Some(Instant::now());
        match self.fetch().await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!("JWK set refresh for an unknown key id failed, the last good set stays: {e}");
                false
            }
        }
    }

    /// Refreshes every `jwks_refresh_s` while `self` lives. Supervised (task `jwks-refresh`).
    pub fn spawn_refresh(self: &Arc<Self>) {
        let keys = Arc::downgrade(self);
        let period = self.refresh;
        switchboard_supervisor::spawn("jwks-refresh", move |_| {
            let keys = keys.clone();
            async move {
                loop {
                    tokio::time::sleep(period).await;
                    let Some(k) = keys.upgrade() else { return };
                    if let Err(e) = k.fetch().await {
                        tracing::warn!("JWK set refresh failed, the last good set stays: {e}");
                    }
                }
            }
        });
    }

    /// `switchboard_jwks_refreshes_total` by outcome.
    pub fn render(&self) -> String {
        format!(
            "# HELP switchboard_jwks_refreshes_total Fetches of auth.jwks_url (a failed one keeps the last good set).\n\
             # TYPE switchboard_jwks_refreshes_total counter\n\
             switchboard_jwks_refreshes_total{{outcome=\"ok\"}} {}\n\
             switchboard_jwks_refreshes_total{{outcome=\"failed\"}} {}\n",
            self.ok.load(Relaxed),
            self.failed.load(Relaxed)
        )
    }
}
