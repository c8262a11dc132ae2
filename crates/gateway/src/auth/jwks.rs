//! Reading JWK sets (`auth.jwks` files and the `auth.jwks_url` set) into verification keys, the
//! strength every key must have, and [`RemoteKeys`]: the JWK set at `auth.jwks_url` — fetched
//! when the node starts, again every `jwks_refresh_s`, and when a token names a key id no key
//! source has (at most once per [`KID_REFETCH_GAP`]), so an identity provider rotates its keys
//! without a restart.
//!
//! A key the node cannot use — an unknown type, a broken key, another curve or algorithm, an
//! encryption key, an RSA modulus under [`MIN_RSA_BITS`], an `oct` key under
//! [`MIN_HMAC_KEY_BYTES`] — is skipped, logged once per load and counted; it never makes the
//! rest of the set unusable. A set with no usable key at all is an error. A failed refresh
//! (unreachable, not a JWK set, no usable key) keeps the last good set, logs a warning and
//! counts in `switchboard_jwks_refreshes_total{outcome="failed"}`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use hyper::Uri;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use parking_lot::RwLock;
use serde::Deserialize;

use crate::proxy::client::HttpClient;

/// Shortest HS256 key, in bytes, for `auth.jwt_secret` and the `oct` keys of a JWK set alike:
/// RFC 7518 §3.2 asks for a key at least as long as the hash's output.
pub const MIN_HMAC_KEY_BYTES: usize = 32;
/// Smallest RSA modulus accepted, in bits (NIST SP 800-131A): smaller keys can be factored,
/// and whoever factors one signs any token.
pub const MIN_RSA_BITS: usize = 2048;
/// Skipped keys named in the error of a set with no usable key; the rest are only counted.
const REASONS_SHOWN: usize = 4;

/// One verification key and the algorithm it is for.
pub(super) struct Key {
    pub(super) kid: Option<String>,
    pub(super) alg: Algorithm,
    pub(super) key: DecodingKey,
}

impl Key {
    /// An HS256 key; `Err` when it is shorter than [`MIN_HMAC_KEY_BYTES`]. The one check of a
    /// shared secret's strength, wherever it comes from.
    pub(super) fn hmac(kid: Option<String>, secret: &[u8]) -> Result<Key, String> {
        if secret.len() < MIN_HMAC_KEY_BYTES {
            return Err(format!("must be at least {MIN_HMAC_KEY_BYTES} bytes for HS256, has {}", secret.len()));
        }
        Ok(Key { kid, alg: Algorithm::HS256, key: DecodingKey::from_secret(secret) })
    }
}

/// A JWK field's bytes (base64url; trailing `=` padding tolerated).
fn b64url(field: &str, value: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(value.trim_end_matches('='))
        .map_err(|_| format!("its {field} is not base64url"))
}

/// Bits of an RSA public key's modulus, from a JWK's `n` and `e` (base64url, big-endian,
/// leading zero bytes allowed); `Err` when either is not a possible RSA public key's.
fn rsa_bits(n: &str, e: &str) -> Result<usize, String> {
    let significant = |b: &[u8]| b.iter().position(|&x| x != 0).map_or(Vec::new(), |i| b[i..].to_vec());
    let n = significant(&b64url("modulus n", n)?);
    let e = significant(&b64url("exponent e", e)?);
    // An exponent is odd and at least 3; verifiers take up to 64 bits.
    if e.is_empty() || e.len() > 8 || e[e.len() - 1] % 2 == 0 || e == [1] {
        return Err("its exponent e is not an RSA public exponent".into());
    }
    match n.first() {
        Some(first) if n[n.len() - 1] % 2 == 1 => Ok(n.len() * 8 - first.leading_zeros() as usize),
        _ => Err("its modulus n is not an RSA modulus (zero or even)".into()),
    }
}

/// A key of a set that the node does not use, and why.
#[derive(Debug)]
pub(super) struct Skipped {
    /// Its place in the set's `keys`.
    pub(super) index: usize,
    pub(super) kid: Option<String>,
    pub(super) reason: String,
    /// A key published for encryption (`"use": "enc"`): expected beside signing keys, so it
    /// is logged at debug, not as a warning.
    pub(super) encryption: bool,
}

/// The keys of one JWK set as read: the usable ones and the skipped ones.
pub(super) struct SetKeys {
    pub(super) keys: Vec<Key>,
    pub(super) skipped: Vec<Skipped>,
}

impl SetKeys {
    /// Logs each skipped key once (warning; debug for encryption keys) and the counts.
    /// `source` names the configuration key the set came from. The key ids are the set's
    /// text, so they are logged quoted and escaped.
    pub(super) fn log(&self, source: &str) {
        for s in &self.skipped {
            if s.encryption {
                tracing::debug!(source, index = s.index, kid = ?s.kid, reason = %s.reason, "JWK set key skipped");
            } else {
                tracing::warn!(source, index = s.index, kid = ?s.kid, reason = %s.reason, "JWK set key skipped");
            }
        }
        tracing::info!(source, keys = self.keys.len(), skipped = self.skipped.len(), "JWK set loaded");
    }
}

/// The set's outer shape only: each key is read on its own, so one key of an unknown type or
/// with broken fields is skipped instead of failing the whole set.
#[derive(Deserialize)]
struct RawSet {
    keys: Vec<serde_json::Value>,
}

/// One key of a set, or why it is skipped (and whether it is an encryption key).
fn key_of(raw: serde_json::Value) -> Result<Key, (String, bool)> {
    let jwk: Jwk = serde_json::from_value(raw).map_err(|e| (format!("unknown type or broken fields ({e})"), false))?;
    // Identity providers publish encryption keys and other algorithms beside the signing
    // keys; only RS256, ES256 and HS256 signing keys are taken.
    if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
        return Err(("for encryption (\"use\": \"enc\")".into(), true));
    }
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(p) => {
            let bits = rsa_bits(&p.n, &p.e).map_err(|e| (format!("broken RSA key: {e}"), false))?;
            if bits < MIN_RSA_BITS {
                return Err((format!("RSA modulus of {bits} bits, under {MIN_RSA_BITS}"), false));
            }
            Algorithm::RS256
        }
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::EllipticCurve(p) => {
            return Err((format!("curve {:?} is not supported (ES256 keys are P-256)", p.curve), false))
        }
        AlgorithmParameters::OctetKey(_) => Algorithm::HS256,
        AlgorithmParameters::OctetKeyPair(_) => return Err(("OKP keys (EdDSA) are not supported".into(), false)),
    };
    if let Some(named) = jwk.common.key_algorithm {
        if named.to_string().parse::<Algorithm>().ok() != Some(alg) {
            return Err((format!("its alg {named} is not {alg:?}"), false));
        }
    }
    let kid = jwk.common.key_id.clone();
    if let AlgorithmParameters::OctetKey(p) = &jwk.algorithm {
        let secret = b64url("k", &p.value).map_err(|e| (format!("broken oct key: {e}"), false))?;
        return Key::hmac(kid, &secret).map_err(|e| (format!("oct key {e}"), false));
    }
    let key = DecodingKey::from_jwk(&jwk).map_err(|e| (format!("broken: {e}"), false))?;
    Ok(Key { kid, alg, key })
}

/// The keys of a JWK set's text: RS256 (modulus of at least [`MIN_RSA_BITS`]), ES256 (P-256)
/// and HS256 (at least [`MIN_HMAC_KEY_BYTES`]) signing keys; every other key is skipped with
/// its reason. `Err` when the text is not a JWK set or no key is usable.
pub(super) fn keys_of_set(text: &str) -> Result<SetKeys, String> {
    let set: RawSet = serde_json::from_str(text).map_err(|e| format!("not a JWK set: {e}"))?;
    let mut got = SetKeys { keys: Vec::new(), skipped: Vec::new() };
    for (index, raw) in set.keys.into_iter().enumerate() {
        let kid = raw.get("kid").and_then(|k| k.as_str()).map(str::to_string);
        match key_of(raw) {
            Ok(key) => got.keys.push(key),
            Err((reason, encryption)) => got.skipped.push(Skipped { index, kid, reason, encryption }),
        }
    }
    if got.keys.is_empty() {
        let mut why = String::new();
        for s in got.skipped.iter().take(REASONS_SHOWN) {
            why.push_str(&format!("; key {} ({:?}): {}", s.index, s.kid.as_deref().unwrap_or(""), s.reason));
        }
        if got.skipped.len() > REASONS_SHOWN {
            why.push_str(&format!("; {} more skipped", got.skipped.len() - REASONS_SHOWN));
        }
        return Err(format!("no RS256, ES256 (P-256) or HS256 signing key the node can use in the set{why}"));
    }
    Ok(got)
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
    /// Usable and skipped keys of the set in use (the last good fetch).
    usable: AtomicU64,
    skipped: AtomicU64,
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
            usable: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        })
    }

    /// The current keys (empty before the first good fetch).
    pub(super) fn keys(&self) -> Arc<Vec<Key>> {
        self.keys.read().clone()
    }

    /// Fetches the set once; on success it replaces the keys and logs its skipped keys.
    /// Counted either way.
    pub async fn fetch(&self) -> Result<usize, String> {
        let got = match self.client.get(&self.url, FETCH_TIMEOUT).await {
            Ok(body) => std::str::from_utf8(&body).map_err(|_| "not UTF-8 text".to_string()).and_then(keys_of_set),
            Err(e) => Err(e.to_string()),
        };
        match got {
            Ok(set) => {
                set.log("auth.jwks_url");
                let n = set.keys.len();
                self.usable.store(n as u64, Relaxed);
                self.skipped.store(set.skipped.len() as u64, Relaxed);
                *self.keys.write() = Arc::new(set.keys);
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
                Ok(_) => return Ok(()),
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

    /// `switchboard_jwks_refreshes_total` by outcome, and `switchboard_jwks_keys` of the set in
    /// use by state.
    pub fn render(&self) -> String {
        format!(
            "# HELP switchboard_jwks_refreshes_total Fetches of auth.jwks_url (a failed one keeps the last good set).\n\
             # TYPE switchboard_jwks_refreshes_total counter\n\
             switchboard_jwks_refreshes_total{{outcome=\"ok\"}} {}\n\
             switchboard_jwks_refreshes_total{{outcome=\"failed\"}} {}\n\
             # HELP switchboard_jwks_keys Keys of the auth.jwks_url set in use: usable, or skipped (unknown type, broken, too weak, other algorithm or use).\n\
             # TYPE switchboard_jwks_keys gauge\n\
             switchboard_jwks_keys{{state=\"usable\"}} {}\n\
             switchboard_jwks_keys{{state=\"skipped\"}} {}\n",
            self.ok.load(Relaxed),
            self.failed.load(Relaxed),
            self.usable.load(Relaxed),
            self.skipped.load(Relaxed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    /// An RSA JWK whose modulus has exactly `bits` bits (odd, top bit set): the strength
    /// checks read the modulus only, so no real key is needed.
    fn rsa(bits: usize, kid: &str) -> serde_json::Value {
        let mut n = vec![0xA5u8; bits.div_ceil(8)];
        n[0] = 1 << ((bits - 1) % 8);
        json!({"kty": "RSA", "n": b64(&n), "e": "AQAB", "kid": kid})
    }

    fn oct(len: usize, kid: &str) -> serde_json::Value {
        json!({"kty": "oct", "k": b64(&vec![7u8; len]), "kid": kid})
    }

    fn set(keys: &[serde_json::Value]) -> Result<SetKeys, String> {
        keys_of_set(&json!({ "keys": keys }).to_string())
    }

    fn kids(set: &SetKeys) -> Vec<&str> {
        set.keys.iter().map(|k| k.kid.as_deref().unwrap_or("")).collect()
    }

    #[test]
    fn auth_jwks_rsa_keys_need_2048_bit_moduli() {
        assert_eq!(rsa_bits(&b64(&[0, 0, 0x80, 1]), "AQAB"), Ok(16), "leading zero bytes do not count");
        let got =
            set(&[rsa(512, "r512"), rsa(1024, "r1024"), rsa(2047, "r2047"), rsa(2048, "r2048"), rsa(4096, "r4096")])
                .unwrap();
        assert_eq!(kids(&got), ["r2048", "r4096"]);
        let reasons: Vec<&str> = got.skipped.iter().map(|s| s.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "RSA modulus of 512 bits, under 2048",
                "RSA modulus of 1024 bits, under 2048",
                "RSA modulus of 2047 bits, under 2048"
            ]
        );
        assert!(got.skipped.iter().all(|s| !s.encryption));
    }

    #[test]
    fn auth_jwks_oct_keys_share_the_jwt_secret_floor() {
        let got = set(&[oct(1, "o1"), oct(31, "o31"), oct(32, "o32"), oct(64, "o64")]).unwrap();
        assert_eq!(kids(&got), ["o32", "o64"]);
        assert_eq!(got.skipped.len(), 2);
        assert!(got.skipped[0].reason.contains("at least 32 bytes"), "{:?}", got.skipped[0]);
        // The same rule as `auth.jwt_secret`'s.
        assert!(Key::hmac(None, &[0; MIN_HMAC_KEY_BYTES - 1]).is_err());
        assert!(Key::hmac(None, &[0; MIN_HMAC_KEY_BYTES]).is_ok());
    }

    #[test]
    fn auth_jwks_unknown_broken_and_foreign_keys_are_skipped_not_fatal() {
        let p256 = json!({"kty": "EC", "crv": "P-256", "kid": "ec",
            "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRjm2h-I3qBmGLLzJbxIM4OdhuOYWFm0lhG9Wqo"});
        let p384 = json!({"kty": "EC", "crv": "P-384", "kid": "ec384",
            "x": "iA7lWQLzVrKGEFjfGMfMHfTEZ2KnLiKU7JuNT3E7ygsfE7ygsfE7ygsfE7ygsfE7",
            "y": "iA7lWQLzVrKGEFjfGMfMHfTEZ2KnLiKU7JuNT3E7ygsfE7ygsfE7ygsfE7ygsfE7"});
        let akp = json!({"kty": "AKP", "alg": "ML-DSA-44", "pub": "AAAA", "kid": "pq"});
        let no_n = json!({"kty": "RSA", "e": "AQAB", "kid": "no-n"});
        let bad_n = json!({"kty": "RSA", "n": "!!not base64!!", "e": "AQAB", "kid": "bad-n"});
        let even_e = json!({"kty": "RSA", "n": rsa(2048, "x")["n"], "e": "Ag", "kid": "even-e"});
        let enc = json!({"kty": "RSA", "n": rsa(2048, "x")["n"], "e": "AQAB", "use": "enc", "kid": "enc"});
        let ps = json!({"kty": "RSA", "n": rsa(2048, "x")["n"], "e": "AQAB", "alg": "PS256", "kid": "ps"});
        let okp = json!({"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"});
        let got =
            set(&[akp, no_n, bad_n, even_e, enc, ps, okp, p384, "a string".into(), p256, rsa(2048, "good")]).unwrap();
        assert_eq!(kids(&got), ["ec", "good"]);
        let skipped: Vec<(usize, Option<&str>)> = got.skipped.iter().map(|s| (s.index, s.kid.as_deref())).collect();
        assert_eq!(
            skipped,
            [
                (0, Some("pq")),
                (1, Some("no-n")),
                (2, Some("bad-n")),
                (3, Some("even-e")),
                (4, Some("enc")),
                (5, Some("ps")),
                (6, None),
                (7, Some("ec384")),
                (8, None)
            ]
        );
        let encryption: Vec<bool> = got.skipped.iter().map(|s| s.encryption).collect();
        assert_eq!(encryption, [false, false, false, false, true, false, false, false, false]);
        assert!(got.skipped[2].reason.starts_with("broken RSA key"), "{:?}", got.skipped[2]);
        assert!(got.skipped[3].reason.contains("exponent"), "{:?}", got.skipped[3]);
    }

    #[test]
    fn auth_jwks_a_set_without_a_usable_key_is_refused_with_the_reasons() {
        let e = set(&[rsa(1024, "weak"), oct(31, "short")]).err().unwrap();
        assert!(e.starts_with("no RS256, ES256 (P-256) or HS256 signing key"), "{e}");
        assert!(e.contains(r#"key 0 ("weak"): RSA modulus of 1024 bits"#), "{e}");
        assert!(e.contains(r#"key 1 ("short"): oct key must be at least 32 bytes"#), "{e}");
        let many: Vec<_> = (0..REASONS_SHOWN + 3).map(|i| oct(1, &format!("k{i}"))).collect();
        assert!(set(&many).err().unwrap().ends_with("; 3 more skipped"));
        assert!(set(&[]).is_err());
        assert!(keys_of_set(r#"{"keys": {}}"#).err().unwrap().starts_with("not a JWK set"));
    }
}
