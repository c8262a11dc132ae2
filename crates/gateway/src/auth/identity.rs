//! Who a client is ([`Identity`], established by a [`Method`]) and why credentials were refused
//! ([`AuthFailure`]).

use std::sync::Arc;

use super::credentials;
use super::jwt::TokenError;
use super::pattern::PatternSet;

/// How an identity was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// No credentials.
    Anonymous,
    /// A verified JWT.
    Token,
    /// A users-file password.
    Password,
    /// An HTTP API key (index into the configured list); full access to the HTTP API.
    ApiKey(usize),
    /// Accepted by the connect hook (`[proxy] connect_url`) as the user it named.
    Hook,
}

/// Who a client is.
#[derive(Debug, Clone)]
pub struct Identity {
    pub method: Method,
    /// `sub` or user name; empty for anonymous clients.
    pub user: String,
    /// Subscribe patterns (also used for presence and history), when restricted.
    pub channels: Option<Arc<PatternSet>>,
    /// Publish patterns, when restricted.
    pub publish: Option<Arc<PatternSet>>,
    /// Unix seconds when the token (or the connect hook's `expire_at`) expires.
    pub expires: Option<u64>,
    /// The token's `jti` and `iat`, matched by revocations.
    pub jti: Option<Arc<str>>,
    pub issued_at: Option<u64>,
}

impl Identity {
    pub fn anonymous() -> Identity {
        Identity {
            method: Method::Anonymous,
            user: String::new(),
            channels: None,
            publish: None,
            expires: None,
            jti: None,
            issued_at: None,
        }
    }

    pub fn is_anonymous(&self) -> bool {
        self.method == Method::Anonymous
    }

    /// The caller with its kind, so that a name one kind chose cannot pass for another kind's
    /// (a token whose `sub` is `api-key-0` is `user:api-key-0`, never the API key
    /// `key:api-key-0`): `user:<name>` (a token's `sub`, a users-file name), `hook:<name>` (the
    /// user the connect hook named), `key:api-key-<index>` (the API key at that place of the
    /// configured list), or `anonymous`. The write audit names callers so, and idempotency
    /// keys belong to it.
    pub fn principal(&self) -> String {
        let kind = match self.method {
            Method::Anonymous => return "anonymous".into(),
            Method::Token | Method::Password => "user",
            Method::Hook => "hook",
            Method::ApiKey(_) => "key",
        };
        format!("{kind}:{}", self.user)
    }
}

/// Why credentials were refused; the text is safe for clients and logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthFailure {
    #[error("{0}")]
    Malformed(#[from] credentials::MalformedCredential),
    #[error("{0}")]
    Token(#[from] TokenError),
    #[error("bad user name or password")]
    Password,
    #[error("unknown API key")]
    ApiKey,
    #[error("{0} is not configured on this node")]
    NotConfigured(&'static str),
    /// Too many password checks from this address (WebSocket 4029, HTTP 429).
    #[error("too many password checks (from this address, or waiting at this node); retry later")]
    RateLimited,
}
