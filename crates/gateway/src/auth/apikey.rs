//! API keys for the HTTP API (SPEC §4, §6), stored as `sha256:<hex>` digests.
//!
//! Keys are long random strings (`switchboard api-key` makes 256-bit ones), so a plain SHA-256
//! digest is as safe to store as a slow password hash while costing microseconds per request:
//! nobody can search a 2^256 key space, however fast the hash. Plain keys given on the command
//! line or in `SWITCHBOARD_API_KEY` are hashed on startup and never kept.

use argon2::password_hash::rand_core::{OsRng, RngCore};
use base64::Engine as _;
use sha2::{Digest, Sha256};

const PREFIX: &str = "sha256:";

/// Shortest plain key accepted.
pub const MIN_KEY_LEN: usize = 16;

/// The configured keys.
#[derive(Default)]
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The stored form of a plain key.
pub fn hash_key(key: &str) -> String {
    let d = digest(key);
    let mut s = String::with_capacity(PREFIX.len() + 64);
    s.push_str(PREFIX);
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Whether `s` is in the stored form.
pub fn is_hashed(s: &str) -> bool {
    parse_hash(s).is_some()
}

fn parse_hash(s: &str) -> Option<[u8; 32]> {
    let hex = s.strip_prefix(PREFIX)?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The stored form of a key given on the command line or in the environment: kept if already
/// hashed, hashed if plain (and long enough).
pub fn stored_form(key: &str) -> Result<String, String> {
    let key = key.trim();
    if is_hashed(key) {
        return Ok(key.to_string());
    }
    if key.len() < MIN_KEY_LEN {
        return Err(format!("an API key needs at least {MIN_KEY_LEN} characters (`switchboard api-key` makes one)"));
    }
    Ok(hash_key(key))
}

/// A new random key: 32 bytes from the OS, base64url.
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    format!("sbk_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

impl ApiKeys {
    /// Parses stored digests; `Err` carries the index of the first bad entry.
    pub fn parse(list: &[String]) -> Result<ApiKeys, usize> {
        let digests = list.iter().enumerate().map(|(i, s)| parse_hash(s.trim()).ok_or(i)).collect::<Result<_, _>>()?;
        Ok(ApiKeys { digests })
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// The index of the key `presented` is, if any. Every configured digest is compared in
    /// full, without early exit.
    pub fn find(&self, presented: &str) -> Option<usize> {
        let d = digest(presented);
        let mut found = None;
        for (i, k) in self.digests.iter().enumerate() {
            let diff = k.iter().zip(d.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 && found.is_none() {
                found = Some(i);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_api_keys_are_found_by_digest() {
        let a = generate();
        let b = generate();
        assert_ne!(a, b);
        let keys = ApiKeys::parse(&[hash_key(&a), stored_form(&hash_key(&b)).unwrap()]).unwrap();
        assert_eq!(keys.find(&a), Some(0));
        assert_eq!(keys.find(&b), Some(1));
        assert_eq!(keys.find("sbk_nope"), None);
        assert_eq!(keys.find(&hash_key(&a)), None, "the digest itself is not a key");
        assert!(stored_form("short").is_err());
        assert_eq!(ApiKeys::parse(&["sha256:xyz".into()]).err(), Some(0));
    }
}
