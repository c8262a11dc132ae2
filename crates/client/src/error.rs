//! [`Error`]: what the client's calls fail with.

use switchboard_protocol::message::ErrorBody;

/// A client result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a client call failed.
///
/// [`Error::Reply`] is the server's answer (an `error` reply, SPEC §2 codes); every other
/// variant is a failure to get an answer at all.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server replied with `{"error": {"code", "message"}}`.
    #[error("server error {}: {}", .0.code, .0.message)]
    Reply(ErrorBody),
    /// An HTTP API call returned a non-success status.
    #[error("HTTP {status}: {body}")]
    Http { status: u16, body: String },
    /// The URL is not a usable `ws://` or `http://` URL.
    #[error("invalid URL {0:?}")]
    Url(String),
    /// The connection is closed; `code` is the close code (1006 when none was received).
    #[error("connection closed (code {code})")]
    Closed { code: u16 },
    /// A message from the server could not be decoded.
    #[error("undecodable message from the server: {0}")]
    Decode(String),
    /// The call did not complete in time.
    #[error("timed out")]
    Timeout,
    #[error("WebSocket: {0}")]
    WebSocket(#[from] Box<tokio_tungstenite::tungstenite::Error>),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The server's error code for [`Error::Reply`], the close code for [`Error::Closed`].
    pub fn code(&self) -> Option<u16> {
        match self {
            Error::Reply(e) => Some(e.code),
            Error::Closed { code } => Some(*code),
            _ => None,
        }
    }
}

impl From<tokio_tungstenite::tungstenite::Error> for Error {
    fn from(e: tokio_tungstenite::tungstenite::Error) -> Self {
        Error::WebSocket(Box::new(e))
    }
}
