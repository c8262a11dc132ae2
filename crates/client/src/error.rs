//! [`Error`]: what the client's calls fail with.
//!
//! Each variant's message is complete on its own: no variant also exposes the error it wraps
//! as its `source`, so a caller printing the whole chain (`{:#}`) shows each cause once.

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
    /// The server answered the WebSocket handshake with HTTP `status` instead of upgrading.
    #[error("the server answered the WebSocket handshake with HTTP {status}{}", body_suffix(.body))]
    Handshake { status: u16, body: String },
    /// The URL is not a usable `http(s)://` or `ws(s)://` URL. `url` is shown without its
    /// password.
    #[error("invalid URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    /// No TCP connection could be made to `addr` (`host:port`).
    #[error("cannot connect to {addr}: {cause}")]
    Connect { addr: String, cause: std::io::Error },
    /// TLS could not be set up: no trusted roots, an unreadable CA file, a failed handshake.
    #[error("{0}")]
    Tls(String),
    /// The server presented a CA certificate as its own (rustls `CaUsedAsEndEntity`), as a
    /// self-signed certificate made with `openssl req -x509` is: TLS accepts a CA only as the
    /// signer of a server's certificate.
    #[error("the certificate of {host} is a CA certificate, which TLS does not accept as a server's own (CaUsedAsEndEntity)")]
    CaCertificate { host: String },
    /// The server's certificate did not verify against the trusted roots.
    #[error("the certificate of {host} is not trusted: {detail}")]
    UntrustedCertificate { host: String, detail: String },
    /// The connection is closed: `code` is the close code (1006 when none was received),
    /// `reason` the server's close reason (empty when it gave none).
    #[error("connection closed (code {code}{})", reason_suffix(.reason))]
    Closed { code: u16, reason: String },
    /// A message from the server could not be decoded.
    #[error("undecodable message from the server: {0}")]
    Decode(String),
    /// The call did not complete in time.
    #[error("timed out")]
    Timeout,
    #[error("WebSocket: {0}")]
    WebSocket(Box<tokio_tungstenite::tungstenite::Error>),
    #[error("{0}")]
    Io(std::io::Error),
}

fn body_suffix(body: &str) -> String {
    let body = body.trim();
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}

fn reason_suffix(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

impl Error {
    /// The server's error code for [`Error::Reply`], the close code for [`Error::Closed`].
    pub fn code(&self) -> Option<u16> {
        match self {
            Error::Reply(e) => Some(e.code),
            Error::Closed { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<tokio_tungstenite::tungstenite::Error> for Error {
    fn from(e: tokio_tungstenite::tungstenite::Error) -> Self {
        use tokio_tungstenite::tungstenite::Error as Ws;
        match e {
            Ws::Io(e) => Error::Io(e),
            Ws::Http(resp) => Error::Handshake {
                status: resp.status().as_u16(),
                body: resp.body().as_deref().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default(),
            },
            e => Error::WebSocket(Box::new(e)),
        }
    }
}
