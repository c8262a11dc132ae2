//! URL parsing and the WebSocket handshake.
//!
//! [`handshake`] is public because the bench drives thousands of raw connections itself (no
//! reader task, no reply map) but must connect exactly as [`crate::Client`] does.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use switchboard_protocol::Format;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::header::{AUTHORIZATION, SEC_WEBSOCKET_PROTOCOL};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::WebSocketStream;

use crate::error::{Error, Result};

/// A client WebSocket over plain TCP.
pub type WsStream = WebSocketStream<TcpStream>;

/// How to open a WebSocket connection.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The wire format, offered as the subprotocol.
    pub format: Format,
    /// Offer the format's subprotocol. Off only for foreign echo servers (bench `echo
    /// --protocol json-echo`), which may refuse unknown subprotocols.
    pub offer_subprotocol: bool,
    /// Sent as `Authorization: Bearer <token>` with the handshake.
    pub token: Option<String>,
    /// Local address to bind before connecting. The bench spreads many connections over
    /// 127.0.0.x source addresses because one address has only ~28k ephemeral ports.
    pub bind: Option<IpAddr>,
    /// Initial read buffer per connection. Small by default: the bench holds tens of thousands
    /// of connections, and the buffer grows for larger frames anyway.
    pub read_buffer: usize,
    /// Deadline for TCP connect plus handshake.
    pub timeout: Duration,
}

impl ConnectOptions {
    pub fn new(format: Format) -> Self {
        ConnectOptions {
            format,
            offer_subprotocol: true,
            token: None,
            bind: None,
            read_buffer: 4096,
            timeout: Duration::from_secs(10),
        }
    }
}

/// The parts of a `ws://` or `http://` URL this client uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `ws` or `http`.
    pub scheme: String,
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// Path and query, at least `/`.
    pub path: String,
}

impl Endpoint {
    /// Parses `ws://host[:port][/path]` or `http://host[:port][/path]`. TLS schemes are refused:
    /// put a TLS-terminating proxy in front and speak plain text to it.
    pub fn parse(url: &str) -> Result<Endpoint> {
        let bad = || Error::Url(url.to_string());
        let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "ws" && scheme != "http" {
            return Err(bad());
        }
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'?' => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, "/".to_string()),
        };
        if authority.contains('@') {
            return Err(bad());
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(bad)?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad())?,
                None if after.is_empty() => 80,
                None => return Err(bad()),
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad())?),
                None => (authority.to_string(), 80),
            }
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Endpoint { scheme, host, port, path })
    }

    /// `host:port` as written in a `Host` header.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Whether the host is a loopback IP address literal or `localhost`.
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost" || self.host.parse::<IpAddr>().map(|ip| ip.is_loopback()).unwrap_or(false)
    }
}

/// Opens a TCP connection with Nagle's algorithm off (pushes and pings are latency-bound).
pub async fn connect_tcp(host: &str, port: u16, bind: Option<IpAddr>) -> Result<TcpStream> {
    let mut last_err = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match connect_addr(addr, bind).await {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.map(Error::Io).unwrap_or_else(|| Error::Url(format!("{host}:{port} resolves to no address"))))
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

/// Connects to `url` (`ws://host:port/path`) and performs the WebSocket handshake.
pub async fn handshake(url: &str, opts: &ConnectOptions) -> Result<WsStream> {
    let ep = Endpoint::parse(url)?;
    if ep.scheme != "ws" {
        return Err(Error::Url(url.to_string()));
    }
    let attempt = async {
        let stream = connect_tcp(&ep.host, ep.port, opts.bind).await?;
        let mut request = url.into_client_request()?;
        if opts.offer_subprotocol {
            request.headers_mut().insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(opts.format.subprotocol()));
        }
        if let Some(token) = &opts.token {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| Error::Url("token is not a valid header value".into()))?;
            value.set_sensitive(true);
            request.headers_mut().insert(AUTHORIZATION, value);
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
    fn connect_parses_urls() {
        let e = Endpoint::parse("ws://127.0.0.1:8700/ws").unwrap();
        assert_eq!((e.scheme.as_str(), e.host.as_str(), e.port, e.path.as_str()), ("ws", "127.0.0.1", 8700, "/ws"));
        assert!(e.is_loopback());
        let e = Endpoint::parse("http://localhost").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.path.as_str()), ("localhost", 80, "/"));
        let e = Endpoint::parse("ws://[::1]:9000/ws?token=x").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.path.as_str()), ("::1", 9000, "/ws?token=x"));
        assert_eq!(e.authority(), "[::1]:9000");
        let e = Endpoint::parse("http://example.com:81?x=1").unwrap();
        assert_eq!(e.path, "/?x=1");
        assert!(!e.is_loopback());
        for bad in ["wss://a/ws", "127.0.0.1:80", "ws://:80/", "ws://a:x/", "ws://u@a/", "ftp://a"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }
}
