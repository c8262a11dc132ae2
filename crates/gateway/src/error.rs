//! The errors every layer of the node shares: [`ApiError`], what a client is told (SPEC §2
//! reply codes, also HTTP statuses), and [`ConfigError`], a refused configuration. They live
//! apart from the node and the configuration so that authentication, TLS and sampling can
//! report errors without depending on either.

/// An error with the code a client sees (SPEC §2 reply codes, also used as HTTP statuses).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub message: String,
    /// A 429's `Retry-After` in seconds (1 when not set).
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn new(code: u16, message: impl Into<String>) -> ApiError {
        ApiError { code, message: message.into(), retry_after_s: None }
    }

    /// The same error, telling a 429's caller to try again after `s` seconds (at least 1).
    pub fn retry_after(mut self, s: u64) -> ApiError {
        self.retry_after_s = Some(s.max(1));
        self
    }
}

/// A configuration error; the message names the offending key. Binaries exit 2 on it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);
