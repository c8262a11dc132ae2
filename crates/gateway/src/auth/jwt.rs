//! JWT verification (SPEC §6): HS256 with a shared secret, RS256 / ES256 with a PEM public key
//! or the keys of a JWK set file.
//!
//! Every key is bound to exactly one algorithm — HS256 for a secret or an `oct` JWK, RS256 for
//! an RSA key, ES256 for a P-256 key — and a token is only checked against keys of its header's
//! algorithm. That rules out `alg: none` (not an algorithm here at all), algorithm confusion
//! (an RS256 public key used as an HS256 secret) and downgrades to algorithms nobody
//! configured. `exp` and `sub` are required; `nbf` is checked when present.
//!
//! A token is checked against at most [`MAX_KEYS_PER_TOKEN`] keys, so a token cannot make the
//! node try every key of a large set: with a `kid`, the keys with that id and then the keys
//! without one; without a `kid`, the first keys of its algorithm in the order `jwt_secret`,
//! `jwt_public_key`, `jwks` (file order), `jwks_url` (set order).

use std::path::Path;
use std::sync::Arc;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::jwks::{keys_of_set, Key, RemoteKeys};
use super::pattern::PatternSet;

/// Most keys one token's signature is checked against (see the module's doc).
pub const MAX_KEYS_PER_TOKEN: usize = 8;

/// Longest `sub` accepted (it is shown to other clients in presence).
const MAX_SUB_LEN: usize = 256;

/// The configured keys and claim checks.
pub struct JwtVerifier {
    keys: Vec<Key>,
    /// Keys fetched from `auth.jwks_url`, replaced on every successful refresh.
    remote: Option<Arc<RemoteKeys>>,
    issuer: Option<String>,
    audience: Option<String>,
    leeway_s: u64,
}

/// A token that passed verification.
#[derive(Debug, Clone)]
pub struct VerifiedToken {
    pub sub: String,
    pub exp: u64,
    /// `jti` and `iat`, for revocations.
    pub jti: Option<String>,
    pub iat: Option<u64>,
    /// Subscribe patterns (`channels` claim), when the token restricts them.
    pub channels: Option<PatternSet>,
    /// Publish patterns (`publish` claim), when the token restricts them.
    pub publish: Option<PatternSet>,
}

/// Why a token was refused. The text goes to the client (disconnect reason, error message)
/// and to debug logs; it never contains the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token is not a JWT")]
    Malformed,
    #[error("token algorithm or key id is not accepted here")]
    Algorithm,
    /// The token names a key id that no key source has (yet): the JWK set is fetched again.
    #[error("token key id is unknown")]
    UnknownKey,
    #[error("token revoked")]
    Revoked,
    /// `exp` is further away than `auth.revocation_keep_s`, the longest lifetime accepted.
    #[error("token expires later than this node accepts (auth.revocation_keep_s)")]
    LivesTooLong,
    #[error("token signature does not verify")]
    Signature,
    /// A token without `kid` whose signature none of the first [`MAX_KEYS_PER_TOKEN`] keys
    /// of its algorithm verifies, while more keys were configured.
    #[error(
        "token has no key id (kid) and does not verify with the first {} keys of its algorithm",
        MAX_KEYS_PER_TOKEN
    )]
    KidNeeded,
    #[error("token expired")]
    Expired,
    #[error("token not valid yet (nbf)")]
    NotYetValid,
    #[error("token lacks the {0} claim")]
    MissingClaim(&'static str),
    #[error("token claim {0} is invalid")]
    BadClaim(String),
    #[error("token issuer or audience is not accepted")]
    Audience,
}

#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
    exp: Option<u64>,
    #[serde(default)]
    jti: Option<String>,
    #[serde(default)]
    iat: Option<u64>,
    #[serde(default)]
    channels: Option<Vec<String>>,
    #[serde(default)]
    publish: Option<Vec<String>>,
}

impl JwtVerifier {
    /// Builds a verifier; `Err` names what is wrong with which key source (the caller prefixes
    /// the configuration key).
    pub fn new(
        secret: Option<&str>,
        public_key: Option<&Path>,
        jwks: Option<&Path>,
        issuer: Option<String>,
        audience: Option<String>,
        leeway_s: u64,
    ) -> Result<JwtVerifier, (&'static str, String)> {
        let mut keys = Vec::new();
        if let Some(secret) = secret {
            keys.push(Key::hmac(None, secret.as_bytes()).map_err(|e| ("jwt_secret", e))?);
        }
        if let Some(path) = public_key {
            let pem = std::fs::read(path).map_err(|e| ("jwt_public_key", format!("{}: {e}", path.display())))?;
            let key = if let Ok(k) = DecodingKey::from_rsa_pem(&pem) {
                Key { kid: None, alg: Algorithm::RS256, key: k }
            } else if let Ok(k) = DecodingKey::from_ec_pem(&pem) {
                Key { kid: None, alg: Algorithm::ES256, key: k }
            } else {
                return Err(("jwt_public_key", format!("{}: not a PEM RSA or EC (P-256) public key", path.display())));
            };
            keys.push(key);
        }
        if let Some(path) = jwks {
            let text = std::fs::read_to_string(path).map_err(|e| ("jwks", format!("{}: {e}", path.display())))?;
            let set = keys_of_set(&text).map_err(|e| ("jwks", format!("{}: {e}", path.display())))?;
            set.log("auth.jwks");
            keys.extend(set.keys);
        }
        Ok(JwtVerifier { keys, remote: None, issuer, audience, leeway_s })
    }

    /// Adds the keys fetched from a JWKS URL to the configured ones.
    pub fn with_remote(mut self, remote: Arc<RemoteKeys>) -> JwtVerifier {
        self.remote = Some(remote);
        self
    }

    pub fn remote(&self) -> Option<&Arc<RemoteKeys>> {
        self.remote.as_ref()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.remote.is_none()
    }

    /// Verifies a token's signature and claims at the current time.
    pub fn verify(&self, token: &str) -> Result<VerifiedToken, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::InvalidAlgorithmName => TokenError::Algorithm,
            _ => TokenError::Malformed,
        })?;
        let fetched = self.remote.as_ref().map(|r| r.keys()).unwrap_or_default();
        let of_alg = || self.keys.iter().chain(fetched.iter()).filter(|k| k.alg == header.alg);
        let mut candidates: Vec<&Key> = match &header.kid {
            Some(want) => of_alg()
                .filter(|k| k.kid.as_ref() == Some(want))
                .chain(of_alg().filter(|k| k.kid.is_none()))
                .take(MAX_KEYS_PER_TOKEN + 1)
                .collect(),
            None => of_alg().take(MAX_KEYS_PER_TOKEN + 1).collect(),
        };
        // One key past the bound is taken only to know whether the bound cut the list.
        let cut = candidates.len() > MAX_KEYS_PER_TOKEN;
        candidates.truncate(MAX_KEYS_PER_TOKEN);
        if candidates.is_empty() {
            if header.kid.is_some() && self.remote.is_some() {
                return Err(TokenError::UnknownKey);
            }
            return Err(TokenError::Algorithm);
        }
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.leeway_s;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        match &self.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                validation.required_spec_claims.insert("aud".into());
            }
            None => validation.validate_aud = false,
        }
        if let Some(iss) = &self.issuer {
            validation.set_issuer(&[iss]);
            validation.required_spec_claims.insert("iss".into());
        }
        let mut last = TokenError::Signature;
        for key in candidates {
            match jsonwebtoken::decode::<Claims>(token, &key.key, &validation) {
                Ok(data) => return checked(data.claims),
                Err(e) => {
                    use jsonwebtoken::errors::ErrorKind as K;
                    last = match e.kind() {
                        K::InvalidSignature | K::InvalidEcdsaKey | K::InvalidRsaKey(_) | K::InvalidKeyFormat => {
                            TokenError::Signature
                        }
                        K::ExpiredSignature => return Err(TokenError::Expired),
                        K::ImmatureSignature => return Err(TokenError::NotYetValid),
                        K::MissingRequiredClaim(c) if c == "exp" => return Err(TokenError::MissingClaim("exp")),
                        K::MissingRequiredClaim(c) if c == "sub" => return Err(TokenError::MissingClaim("sub")),
                        K::InvalidIssuer | K::InvalidAudience | K::MissingRequiredClaim(_) => {
                            return Err(TokenError::Audience)
                        }
                        K::InvalidAlgorithm | K::MissingAlgorithm => TokenError::Algorithm,
                        K::InvalidClaimFormat(c) => return Err(TokenError::BadClaim(c.clone())),
                        K::Json(_) => return Err(TokenError::BadClaim("set".into())),
                        _ => TokenError::Malformed,
                    };
                }
            }
        }
        if cut && header.kid.is_none() && last == TokenError::Signature {
            return Err(TokenError::KidNeeded);
        }
        Err(last)
    }
}

fn checked(c: Claims) -> Result<VerifiedToken, TokenError> {
    let sub = c.sub.ok_or(TokenError::MissingClaim("sub"))?;
    if sub.is_empty() || sub.len() > MAX_SUB_LEN || sub.chars().any(char::is_control) {
        return Err(TokenError::BadClaim("sub".into()));
    }
    let exp = c.exp.ok_or(TokenError::MissingClaim("exp"))?;
    let patterns = |name: &str, list: Option<Vec<String>>| -> Result<Option<PatternSet>, TokenError> {
        list.map(|l| PatternSet::parse(&l).map_err(|(i, e)| TokenError::BadClaim(format!("{name}[{i}] ({e})"))))
            .transpose()
    };
    if c.jti.as_ref().is_some_and(|j| j.len() > MAX_SUB_LEN) {
        return Err(TokenError::BadClaim("jti".into()));
    }
    Ok(VerifiedToken {
        sub,
        exp,
        jti: c.jti,
        iat: c.iat,
        channels: patterns("channels", c.channels)?,
        publish: patterns("publish", c.publish)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn now() -> u64 {
        crate::unix_s()
    }

    fn hs(claims: serde_json::Value, secret: &str, alg: Algorithm) -> String {
        encode(&Header::new(alg), &claims, &EncodingKey::from_secret(secret.as_bytes())).unwrap()
    }

    fn verifier() -> JwtVerifier {
        JwtVerifier::new(Some(SECRET), None, None, None, None, 0).unwrap()
    }

    #[test]
    fn auth_jwt_hs256_accepts_good_tokens_with_claims() {
        let t = hs(
            serde_json::json!({"sub": "alice", "exp": now() + 60, "channels": ["room:*"], "publish": ["room:1"]}),
            SECRET,
            Algorithm::HS256,
        );
        let v = verifier().verify(&t).unwrap();
        assert_eq!(v.sub, "alice");
        assert!(v.channels.unwrap().matches("room:7"));
        assert!(!v.publish.unwrap().matches("room:2"));
    }

    #[test]
    fn auth_jwt_refuses_bad_tokens() {
        let v = verifier();
        let exp = now() + 60;
        let ok = serde_json::json!({"sub": "a", "exp": exp});
        assert_eq!(
            v.verify(&hs(ok.clone(), "another-secret-another-secret-xx", Algorithm::HS256)).unwrap_err(),
            TokenError::Signature
        );
        assert_eq!(v.verify(&hs(ok.clone(), SECRET, Algorithm::HS512)).unwrap_err(), TokenError::Algorithm);
        let expired = serde_json::json!({"sub": "a", "exp": now() - 10});
        assert_eq!(v.verify(&hs(expired, SECRET, Algorithm::HS256)).unwrap_err(), TokenError::Expired);
        let early = serde_json::json!({"sub": "a", "exp": exp, "nbf": now() + 600});
        assert_eq!(v.verify(&hs(early, SECRET, Algorithm::HS256)).unwrap_err(), TokenError::NotYetValid);
        let no_exp = serde_json::json!({"sub": "a"});
        assert_eq!(v.verify(&hs(no_exp, SECRET, Algorithm::HS256)).unwrap_err(), TokenError::MissingClaim("exp"));
        let bad_pattern = serde_json::json!({"sub": "a", "exp": exp, "channels": ["a b"]});
        assert!(matches!(v.verify(&hs(bad_pattern, SECRET, Algorithm::HS256)), Err(TokenError::BadClaim(_))));
        // alg: none, with and without a signature.
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let body = b64(&ok.to_string());
        for header in [r#"{"alg":"none","typ":"JWT"}"#, r#"{"alg":"None"}"#] {
            let t = format!("{}.{}.", b64(header), body);
            assert!(v.verify(&t).is_err(), "{header}");
        }
        // A tampered payload keeps the old signature.
        let good = hs(ok, SECRET, Algorithm::HS256);
        let parts: Vec<&str> = good.split('.').collect();
        let forged = b64(&serde_json::json!({"sub": "admin", "exp": exp}).to_string());
        assert_eq!(v.verify(&format!("{}.{}.{}", parts[0], forged, parts[2])).unwrap_err(), TokenError::Signature);
        assert_eq!(v.verify("garbage").unwrap_err(), TokenError::Malformed);
    }

    #[test]
    fn auth_jwt_sets_skip_unsupported_keys_and_unknown_kids_ask_for_a_refetch() {
        let oct = serde_json::json!({"kty": "oct", "k": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY", "kid": "h"});
        let okp =
            serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"});
        let enc = serde_json::json!({"kty": "oct", "k": "eA", "use": "enc"});
        let set = keys_of_set(&serde_json::json!({"keys": [okp, enc, oct]}).to_string()).unwrap();
        assert_eq!((set.keys.len(), set.skipped.len()), (1, 2));
        assert!(keys_of_set(&serde_json::json!({"keys": [okp]}).to_string()).err().unwrap().contains("no RS256"));
        assert!(keys_of_set("[]").err().unwrap().contains("not a JWK set"));
        let remote = Arc::new(RemoteKeys::new("http://127.0.0.1:9/certs", 300).unwrap());
        let v = verifier().with_remote(remote);
        let claims = serde_json::json!({"sub": "a", "exp": now() + 60});
        // The signature is never checked: no key has the token's kid.
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let forged = format!("{}.{}.sig", b64(r#"{"alg":"RS256","kid":"rotated"}"#), b64(&claims.to_string()));
        assert_eq!(v.verify(&forged).unwrap_err(), TokenError::UnknownKey);
        let no_kid = format!("{}.{}.sig", b64(r#"{"alg":"RS256"}"#), b64(&claims.to_string()));
        assert_eq!(v.verify(&no_kid).unwrap_err(), TokenError::Algorithm, "no kid: nothing to fetch for");
        let hs = hs(claims, SECRET, Algorithm::HS256);
        assert_eq!(v.verify(&hs).unwrap().sub, "a", "the other key sources still work");
    }

    #[test]
    fn auth_jwt_a_token_is_checked_against_a_bounded_number_of_keys() {
        let secret = |i: usize| format!("{SECRET}-{i:02}");
        let keys = (0..MAX_KEYS_PER_TOKEN + 3)
            .map(|i| Key::hmac(Some(format!("k{i}")), secret(i).as_bytes()).unwrap())
            .collect();
        let v = JwtVerifier { keys, remote: None, issuer: None, audience: None, leeway_s: 0 };
        let claims = serde_json::json!({"sub": "a", "exp": now() + 60});
        let signed = |i: usize, kid: Option<&str>| {
            let header = Header { kid: kid.map(str::to_string), ..Header::new(Algorithm::HS256) };
            encode(&header, &claims, &EncodingKey::from_secret(secret(i).as_bytes())).unwrap()
        };
        // Without a kid: the first MAX_KEYS_PER_TOKEN keys, not one more.
        assert_eq!(v.verify(&signed(0, None)).unwrap().sub, "a");
        assert_eq!(v.verify(&signed(MAX_KEYS_PER_TOKEN - 1, None)).unwrap().sub, "a");
        assert_eq!(v.verify(&signed(MAX_KEYS_PER_TOKEN, None)).unwrap_err(), TokenError::KidNeeded);
        // With its kid, any key of the set.
        let last = MAX_KEYS_PER_TOKEN + 2;
        assert_eq!(v.verify(&signed(last, Some(&format!("k{last}")))).unwrap().sub, "a");
        assert_eq!(v.verify(&signed(last, Some("k0"))).unwrap_err(), TokenError::Signature);
        // A wrong secret within a short list is a plain signature failure.
        let few = JwtVerifier { keys: v.keys.into_iter().take(2).collect(), ..verifier() };
        let stranger = encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret(9).as_bytes()));
        assert_eq!(few.verify(&stranger.unwrap()).unwrap_err(), TokenError::Signature);
    }

    #[test]
    fn auth_jwt_short_secrets_are_refused() {
        assert!(JwtVerifier::new(Some("short"), None, None, None, None, 0).is_err());
    }
}
