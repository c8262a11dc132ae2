//! [`Revocations`]: tokens the application revoked (`POST /api/revoke`), checked by every token
//! verification (connect, refresh, HTTP) and matched against live connections.
//!
//! Two kinds of entry: one token by its `jti` (kept until its `expire_at`: the token is dead by
//! then anyway), and every token of a user issued before a time (kept until that time plus
//! `auth.revocation_keep_s`). That setting is also the longest token lifetime the node accepts
//! (a token whose `exp` is further away is refused), so an entry kept that long outlives every
//! token it can match, and an `expire_at` or `issued_before` further away than any token could
//! carry is refused ([`Revocation::check_bounds`]) rather than kept for years. Repeats are one
//! entry (the later expiry holds). The list is bounded by [`MAX_REVOCATIONS`]: a full list
//! drops expired entries first, then refuses new entries (429 with the time the soonest entry
//! leaves) rather than forget one that still holds.

use std::collections::HashMap;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Most entries kept (token ids and users together).
pub const MAX_REVOCATIONS: usize = 10_000;
/// Longest `jti` or user accepted.
const MAX_NAME: usize = 256;
/// How far ahead of this node's clock the API caller's may be: an `issued_before` or an
/// `expire_at` up to this much later than the bounds is still taken.
pub const CLOCK_SKEW_S: u64 = 300;

/// One revocation as the API takes it and as nodes pass it on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Revocation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_before: Option<u64>,
}

impl Revocation {
    /// `Err` says what is wrong: exactly `{"jti", "expire_at"?}` or `{"user", "issued_before"}`.
    pub fn check(&self) -> Result<(), String> {
        let name_ok = |s: &str| !s.is_empty() && s.len() <= MAX_NAME && !s.chars().any(char::is_control);
        match (&self.jti, &self.user) {
            (Some(j), None) if self.issued_before.is_none() => {
                if name_ok(j) {
                    Ok(())
                } else {
                    Err("jti must be 1 to 256 printable characters".into())
                }
            }
            (None, Some(u)) if self.expire_at.is_none() => {
                if !name_ok(u) {
                    Err("user must be 1 to 256 printable characters".into())
                } else if self.issued_before.is_none() {
                    Err("a user revocation needs issued_before (unix seconds)".into())
                } else {
                    Ok(())
                }
            }
            _ => Err("expected {\"jti\", \"expire_at\"} or {\"user\", \"issued_before\"}".into()),
        }
    }

    /// Whether the times fit a token this node accepts, at `now` with tokens living at most
    /// `lifetime_s`: `expire_at` at most `lifetime_s` away, `issued_before` not in the future
    /// (each give or take [`CLOCK_SKEW_S`]). `Err` names the field.
    pub fn check_bounds(&self, now: u64, lifetime_s: u64) -> Result<(), String> {
        let latest_exp = now.saturating_add(lifetime_s).saturating_add(CLOCK_SKEW_S);
        if self.expire_at.is_some_and(|e| e > latest_exp) {
            return Err(format!(
                "expire_at is more than auth.revocation_keep_s ({lifetime_s} s) from now: no token \
                 this node accepts lives that long (unix seconds expected)"
            ));
        }
        if self.issued_before.is_some_and(|b| b > now.saturating_add(CLOCK_SKEW_S)) {
            return Err("issued_before is in the future: no token was issued then (unix seconds expected)".into());
        }
        Ok(())
    }

    /// The key of the entry in a shared record set: repeats of one revocation share it.
    pub fn record_key(&self) -> String {
        match (&self.jti, &self.user) {
            (Some(j), _) => format!("jti:{j}"),
            (None, Some(u)) => format!("user:{u}"),
            (None, None) => String::new(),
        }
    }

    /// When the entry can be forgotten (unix seconds); `keep_s` covers what the entry does
    /// not say.
    pub fn expires(&self, now: u64, keep_s: u64) -> u64 {
        match (self.expire_at, self.issued_before) {
            (Some(e), _) => e,
            (None, Some(b)) => b.saturating_add(keep_s),
            (None, None) => now.saturating_add(keep_s),
        }
    }

    /// Whether a token of `user` with `jti` and `iat` is revoked by this entry.
    pub fn matches(&self, user: &str, jti: Option<&str>, iat: Option<u64>) -> bool {
        if let Some(j) = &self.jti {
            return jti == Some(j.as_str());
        }
        match (&self.user, self.issued_before) {
            (Some(u), Some(before)) => u == user && iat.is_none_or(|i| i < before),
            _ => false,
        }
    }
}

/// Why an entry was not added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddError {
    /// [`MAX_REVOCATIONS`] entries that still hold; the soonest leaves at `frees_at` (unix s).
    Full { frees_at: u64 },
}

#[derive(Default)]
struct Inner {
    /// `jti` → expiry.
    tokens: HashMap<String, u64>,
    /// user → (issued before, expiry); a later entry for a user keeps the later cut-off.
    users: HashMap<String, (u64, u64)>,
}

/// The node's revocation list. A `std`-style mutex (parking_lot): held for map lookups only,
/// never across an await.
#[derive(Default)]
pub struct Revocations {
    inner: Mutex<Inner>,
    keep_s: u64,
}

impl Revocations {
    pub fn new(keep_s: u64) -> Revocations {
        Revocations { inner: Mutex::new(Inner::default()), keep_s }
    }

    /// `auth.revocation_keep_s`: how long an entry that names no expiry is kept after its
    /// cut-off, and the longest token lifetime the node accepts.
    pub fn keep_s(&self) -> u64 {
        self.keep_s
    }

    /// Adds an entry (already [`checked`](Revocation::check)); entries already past their
    /// expiry are ignored. Returns whether it was new or extended.
    pub fn add(&self, r: &Revocation, now: u64) -> Result<bool, AddError> {
        let expires = r.expires(now, self.keep_s);
        if expires <= now {
            return Ok(false);
        }
        let mut inner = self.inner.lock();
        if inner.tokens.len() + inner.users.len() >= MAX_REVOCATIONS {
            inner.tokens.retain(|_, e| *e > now);
            inner.users.retain(|_, (_, e)| *e > now);
            if inner.tokens.len() + inner.users.len() >= MAX_REVOCATIONS {
                let soonest = inner.tokens.values().chain(inner.users.values().map(|(_, e)| e)).min();
                return Err(AddError::Full { frees_at: soonest.copied().unwrap_or(now) });
            }
        }
        if let Some(j) = &r.jti {
            let e = inner.tokens.entry(j.clone()).or_insert(0);
            let new = *e < expires;
            *e = (*e).max(expires);
            return Ok(new);
        }
        if let (Some(u), Some(before)) = (&r.user, r.issued_before) {
            let e = inner.users.entry(u.clone()).or_insert((0, 0));
            let new = e.0 < before;
            *e = (e.0.max(before), e.1.max(expires));
            return Ok(new);
        }
        Ok(false)
    }

    /// Whether a token is revoked at `now`.
    pub fn is_revoked(&self, user: &str, jti: Option<&str>, iat: Option<u64>, now: u64) -> bool {
        let inner = self.inner.lock();
        if inner.tokens.is_empty() && inner.users.is_empty() {
            return false;
        }
        if let Some(e) = jti.and_then(|j| inner.tokens.get(j)) {
            if *e > now {
                return true;
            }
        }
        inner.users.get(user).is_some_and(|(before, e)| *e > now && iat.is_none_or(|i| i < *before))
    }

    pub fn len(&self) -> usize {
        let inner = self.inner.lock();
        inner.tokens.len() + inner.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jti(j: &str, exp: u64) -> Revocation {
        Revocation { jti: Some(j.into()), expire_at: Some(exp), user: None, issued_before: None }
    }

    #[test]
    fn auth_revocations_match_tokens_and_expire() {
        let r = Revocations::new(100);
        assert_eq!(r.add(&jti("t1", 50), 10), Ok(true));
        assert!(r.is_revoked("ann", Some("t1"), Some(5), 10));
        assert!(!r.is_revoked("ann", Some("t2"), Some(5), 10));
        assert!(!r.is_revoked("ann", Some("t1"), Some(5), 50), "expired at expire_at");
        let u = Revocation { jti: None, expire_at: None, user: Some("bob".into()), issued_before: Some(20) };
        assert_eq!(r.add(&u, 10), Ok(true));
        assert!(r.is_revoked("bob", None, Some(19), 30));
        assert!(r.is_revoked("bob", None, None, 30), "no iat: revoked");
        assert!(!r.is_revoked("bob", None, Some(20), 30), "issued at the cut-off: valid");
        assert!(!r.is_revoked("bob", None, Some(1), 121), "kept issued_before + keep");
        assert_eq!(r.add(&jti("old", 5), 10), Ok(false), "already expired: ignored");
    }

    #[test]
    fn auth_revocations_are_checked_and_bounded() {
        let bad = [
            Revocation { jti: None, expire_at: None, user: None, issued_before: None },
            Revocation { jti: Some("a".into()), expire_at: None, user: Some("u".into()), issued_before: None },
            Revocation { jti: None, expire_at: None, user: Some("u".into()), issued_before: None },
            Revocation { jti: Some(String::new()), expire_at: None, user: None, issued_before: None },
        ];
        for b in bad {
            assert!(b.check().is_err(), "{b:?}");
        }
        let user =
            |before| Revocation { jti: None, expire_at: None, user: Some("u".into()), issued_before: Some(before) };
        let now = 1_000_000;
        assert_eq!(jti("t", now + 3600 + CLOCK_SKEW_S).check_bounds(now, 3600), Ok(()));
        let far = jti("t", u64::MAX).check_bounds(now, 3600).unwrap_err();
        assert!(far.starts_with("expire_at is more than auth.revocation_keep_s (3600 s)"), "{far}");
        assert_eq!(user(now + CLOCK_SKEW_S).check_bounds(now, 3600), Ok(()));
        let millis = user(now * 1000).check_bounds(now, 3600).unwrap_err();
        assert!(millis.starts_with("issued_before is in the future"), "{millis}");
        let r = Revocations::new(100);
        for i in 0..MAX_REVOCATIONS {
            r.add(&jti(&i.to_string(), 1000), 1).unwrap();
        }
        assert_eq!(r.add(&jti("one more", 1000), 1), Err(AddError::Full { frees_at: 1000 }));
        assert_eq!(r.add(&jti("after expiry", 2000), 1000), Ok(true), "expired entries make room");
    }
}
