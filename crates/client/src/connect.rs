//! Opening connections: credentials, TCP (plain or TLS) and the WebSocket handshake, with
//! permessage-deflate offered when asked for ([`Compression`]; inflated by [`crate::wire`]).
//!
//! [`handshake`] is public because the bench drives thousands of raw connections itself (no
//! reader task, no reply map) but must connect exactly as [`crate::Client`] does.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine;
use switchboard_protocol::websocket::deflate::CLIENT_OFFER;
use switchboard_protocol::Format;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::header::{AUTHORIZATION, SEC_WEBSOCKET_EXTENSIONS, SEC_WEBSOCKET_PROTOCOL};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::WebSocketStream;

pub use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::tls::{MaybeTls, TlsConfig};
use crate::wire::Wire;

/// A client WebSocket over TCP or TLS; its [`Wire`] counts the bytes and inflates compressed
/// messages (`ws.get_ref().stats()`).
pub type WsStream = WebSocketStream<Wire>;

/// Whether a connection offers permessage-deflate (RFC 7692), `--compression`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Offer nothing: every message travels as it is.
    Off,
    /// Offer permessage-deflate without context takeover; the server's compressed messages
    /// are inflated as they arrive (the client's own go uncompressed). The default, as in
    /// browsers and the Python client.
    #[default]
    Deflate,
}

/// What a client authenticates with, sent as `Authorization` (SPEC §6).
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// An API key or a JWT: `Authorization: Bearer <token>`.
    Bearer(String),
    /// A user of the node's users file: `Authorization: Basic`.
    Basic { user: String, password: String },
}

impl Credentials {
    /// The `Authorization` header value, marked sensitive (kept out of debug output).
    pub fn header_value(&self) -> Result<HeaderValue> {
        let text = match self {
            Credentials::Bearer(t) => format!("Bearer {t}"),
            Credentials::Basic { user, password } => {
                if user.contains(':') {
                    return Err(Error::Url { url: user.clone(), reason: "a Basic user name cannot hold ':'".into() });
                }
                let pair = format!("{user}:{password}");
                format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
            }
        };
        let mut value = HeaderValue::from_str(&text).map_err(|_| Error::Url {
            url: String::new(),
            reason: "the credentials hold characters a header cannot carry".into(),
        })?;
        value.set_sensitive(true);
        Ok(value)
    }

    /// The credentials of a `user:password@` URL; a user without a password is an error
    /// (ask for it first, e.g. with a prompt, and pass [`Credentials::Basic`]).
    pub fn from_url(ep: &Endpoint) -> Result<Option<Credentials>> {
        match (&ep.user, ep.password()) {
            (None, _) => Ok(None),
            (Some(user), Some(password)) => {
                Ok(Some(Credentials::Basic { user: user.clone(), password: password.to_string() }))
            }
            (Some(user), None) => {
                Err(Error::Url { url: ep.to_string(), reason: format!("names user {user} but no password") })
            }
        }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            Credentials::Basic { user, .. } => write!(f, "Basic({user:?}, <redacted>)"),
        }
    }
}

/// How to open a WebSocket connection.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The wire format, offered as the subprotocol.
    pub format: Format,
    /// Offer the format's subprotocol. Off only for foreign echo servers (bench `echo
    /// --protocol json-echo`), which may refuse unknown subprotocols.
    pub offer_subprotocol: bool,
    /// Sent as `Authorization` with the handshake. Without them, a `user:password@` in the
    /// URL is sent as Basic credentials.
    pub credentials: Option<Credentials>,
    /// The roots `wss://` servers are verified against; the system's when `None`.
    pub tls: Option<TlsConfig>,
    /// Local address to bind before connecting. The bench spreads many connections over
    /// 127.0.0.x source addresses because one address has only ~28k ephemeral ports.
    pub bind: Option<IpAddr>,
    /// Initial read buffer per connection. Small by default: the bench holds tens of thousands
    /// of connections, and the buffer grows for larger frames anyway.
    pub read_buffer: usize,
    /// Deadline for TCP connect plus handshake.
    pub timeout: Duration,
    /// Offer permessage-deflate (by default).
    pub compression: Compression,
}

impl ConnectOptions {
    pub fn new(format: Format) -> Self {
        ConnectOptions {
            format,
            offer_subprotocol: true,
            credentials: None,
            tls: None,
            bind: None,
            read_buffer: 4096,
            timeout: Duration::from_secs(10),
            compression: Compression::Deflate,
        }
    }
}

/// Opens a TCP connection with Nagle's algorithm off (pushes and pings are latency-bound).
pub async fn connect_tcp(host: &str, port: u16, bind: Option<IpAddr>) -> Result<TcpStream> {
    let addr = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    let mut last_err = None;
    let found =
        tokio::net::lookup_host((host, port)).await.map_err(|cause| Error::Connect { addr: addr.clone(), cause })?;
    for sock in found {
        match connect_addr(sock, bind).await {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last_err = Some(e),
        }
    }
    let cause = last_err.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "resolves to no address"));
    Err(Error::Connect { addr, cause })
}

async fn connect_addr(addr: SocketAddr, bind: Option<IpAddr>) -> std::io::Result<TcpStream> {
    match bind {
        None => TcpStream::connect(addr).await,
        Some(ip) => {
            let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
            socket.bind(SocketAddr::new(ip, 0))?;
            socket.connect(addr).await
        }
    }
}

/// Connects to `ep`'s host and port, with TLS for `https` and `wss` (verified against `tls`,
/// or the system's roots). The one connector of the WebSocket handshake and the HTTP API.
pub async fn connect_stream(ep: &Endpoint, bind: Option<IpAddr>, tls: Option<&TlsConfig>) -> Result<MaybeTls> {
    let tcp = connect_tcp(&ep.host, ep.port, bind).await?;
    if !ep.is_tls() {
        return Ok(MaybeTls::Plain(tcp));
    }
    let config = match tls {
        Some(c) => c.clone(),
        None => TlsConfig::system()?,
    };
    config.connect(&ep.host, tcp).await
}

/// Connects to `url` and performs the WebSocket handshake. `ws://` and `wss://` URLs are used
/// as given (`http://` and `https://` stand for them); [`Endpoint::websocket`] derives a
/// node's `/ws` URL from any form.
pub async fn handshake(url: &str, opts: &ConnectOptions) -> Result<WsStream> {
    let ep = Endpoint::parse(url)?;
    let credentials = match &opts.credentials {
        Some(c) => Some(c.clone()),
        None => Credentials::from_url(&ep)?,
    };
    let ws_url = format!("{}://{}{}", if ep.is_tls() { "wss" } else { "ws" }, ep.authority(), ep.path);
    let attempt = async {
        let offered = opts.compression == Compression::Deflate;
        let stream = Wire::new(connect_stream(&ep, opts.bind, opts.tls.as_ref()).await?, offered);
        let mut request = ws_url.as_str().into_client_request()?;
        if offered {
            request.headers_mut().insert(SEC_WEBSOCKET_EXTENSIONS, HeaderValue::from_static(CLIENT_OFFER));
        }
        if opts.offer_subprotocol {
            request.headers_mut().insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(opts.format.subprotocol()));
        }
        if let Some(c) = &credentials {
            request.headers_mut().insert(AUTHORIZATION, c.header_value()?);
        }
        // Write each message at once (latency over batching); keep the initial read buffer
        // small, it grows to the largest frame seen.
        let config = WebSocketConfig::default().read_buffer_size(opts.read_buffer).write_buffer_size(0);
        let (ws, _response) = tokio_tungstenite::client_async_with_config(request, stream, Some(config)).await?;
        Ok(ws)
    };
    tokio::time::timeout(opts.timeout, attempt).await.map_err(|_| Error::Timeout)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_credentials_make_authorization_headers_and_hide_secrets() {
        let basic = Credentials::Basic { user: "alice".into(), password: "s3:cret".into() };
        // base64("alice:s3:cret")
        assert_eq!(basic.header_value().unwrap(), "Basic YWxpY2U6czM6Y3JldA==");
        assert!(basic.header_value().unwrap().is_sensitive());
        assert_eq!(Credentials::Bearer("t".into()).header_value().unwrap(), "Bearer t");
        assert!(!format!("{basic:?}").contains("s3"));
        let bad = Credentials::Basic { user: "a:b".into(), password: "x".into() };
        assert!(bad.header_value().is_err());
        let ep = Endpoint::parse("https://bob:pw@h/").unwrap();
        assert_eq!(
            Credentials::from_url(&ep).unwrap(),
            Some(Credentials::Basic { user: "bob".into(), password: "pw".into() })
        );
        let err = Credentials::from_url(&Endpoint::parse("https://bob@h/").unwrap()).unwrap_err();
        assert!(err.to_string().contains("no password"), "{err}");
    }

    #[tokio::test]
    async fn connect_refused_names_the_address_once() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let err = connect_tcp("127.0.0.1", port, None).await.unwrap_err();
        let text = format!("{:#}", anyhow::Error::new(err));
        assert!(text.starts_with(&format!("cannot connect to 127.0.0.1:{port}: ")), "{text}");
        assert_eq!(text.matches("refused").count(), 1, "{text}");
    }
}
