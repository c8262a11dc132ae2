//! [`Endpoint`]: a node's URL as this client uses it, and the one place that knows how a
//! node's WebSocket URL and HTTP API base follow from each other.
//!
//! Every form a user may write names the same node: `http://host:port`, `https://host:port`,
//! `ws://host:port`, `wss://host:port/ws`, each with an optional path prefix (a proxy's
//! `/switchboard`). [`Endpoint::websocket`] and [`Endpoint::api`] derive the rest. A password in
//! the URL (`user:password@`) is kept for Basic authentication and never shown: the
//! `Display` form and every error name the URL without it.

use std::fmt;
use std::net::IpAddr;

use crate::error::{Error, Result};

/// The parts of an `http(s)://` or `ws(s)://` URL this client uses.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http`, `https`, `ws` or `wss`.
    pub scheme: String,
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// Path and query, at least `/`.
    pub path: String,
    /// The user of `user[:password]@`, percent-decoded.
    pub user: Option<String>,
    /// The password of `user:password@`, percent-decoded. Never printed.
    password: Option<String>,
}

impl Endpoint {
    /// Parses `http(s)://[user[:password]@]host[:port][/path][?query]` or the same with
    /// `ws(s)://`. The port defaults to the scheme's (80, 443).
    pub fn parse(raw: &str) -> Result<Endpoint> {
        let bad = |reason: String| Error::Url { url: redact(raw), reason };
        if !raw.contains("://") {
            return Err(bad(format!("no scheme; write it as http://{0} (or https://, ws://, wss://)", redact(raw))));
        }
        let url = url::Url::parse(raw).map_err(|e| bad(e.to_string()))?;
        let scheme = url.scheme().to_string();
        if !matches!(scheme.as_str(), "http" | "https" | "ws" | "wss") {
            return Err(bad(format!("scheme {scheme}:// is not one of http, https, ws, wss")));
        }
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_string(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(bad("no host".into())),
        };
        if host.is_empty() {
            return Err(bad("no host".into()));
        }
        // Known for all four schemes.
        let port = url.port_or_known_default().ok_or_else(|| bad("no port".into()))?;
        let mut path = url.path().to_string();
        if let Some(q) = url.query() {
            path.push('?');
            path.push_str(q);
        }
        let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
        let user = (!url.username().is_empty()).then(|| decode(url.username()));
        let password = url.password().map(decode);
        Ok(Endpoint { scheme, host, port, path, user, password })
    }

    /// Whether the connection runs over TLS (`https`, `wss`).
    pub fn is_tls(&self) -> bool {
        self.scheme == "https" || self.scheme == "wss"
    }

    /// The node's WebSocket endpoint: `ws` or `wss` (as the scheme asks for TLS or not), the
    /// path ending in `/ws` (appended unless it is there), the query kept.
    pub fn websocket(&self) -> Endpoint {
        let (path, query) = self.path.split_once('?').map_or((self.path.as_str(), None), |(p, q)| (p, Some(q)));
        let base = path.trim_end_matches('/');
        let mut path = if base.ends_with("/ws") { base.to_string() } else { format!("{base}/ws") };
        if let Some(q) = query {
            path.push('?');
            path.push_str(q);
        }
        Endpoint { scheme: if self.is_tls() { "wss" } else { "ws" }.into(), path, ..self.clone() }
    }

    /// The node's HTTP API base: `http` or `https`, the path prefix without a trailing `/ws`,
    /// no query.
    pub fn api(&self) -> Endpoint {
        let path = self.path.split('?').next().unwrap_or("").trim_end_matches('/');
        let prefix = path.strip_suffix("/ws").unwrap_or(path).trim_end_matches('/');
        Endpoint {
            scheme: if self.is_tls() { "https" } else { "http" }.into(),
            path: format!("{prefix}/"),
            ..self.clone()
        }
    }

    /// `host:port` as written in a `Host` header.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The URL to send: without credentials.
    pub fn url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.authority(), self.path)
    }

    /// The password of `user:password@`, if the URL had one.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// Whether the host is a loopback IP address literal or `localhost`.
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost" || self.host.parse::<IpAddr>().map(|ip| ip.is_loopback()).unwrap_or(false)
    }
}

/// The URL with its password (if any) as `***`.
impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme)?;
        if let Some(user) = &self.user {
            let hidden = if self.password.is_some() { ":***" } else { "" };
            write!(f, "{user}{hidden}@")?;
        }
        write!(f, "{}{}", self.authority(), self.path)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Endpoint({self})")
    }
}

/// `raw` with the password of a `user:password@` part replaced by `***`, for messages about a
/// URL that did not parse (where the parser cannot say where the password is).
pub fn redact(raw: &str) -> String {
    let start = raw.find("://").map_or(0, |i| i + 3);
    let rest = &raw[start..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..end].rfind('@') else { return raw.to_string() };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{}{user}:***{}", &raw[..start], &rest[at..]),
        None => raw.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(e: &Endpoint) -> (&str, &str, u16, &str) {
        (e.scheme.as_str(), e.host.as_str(), e.port, e.path.as_str())
    }

    #[test]
    fn endpoint_parses_every_scheme_with_default_ports() {
        let e = Endpoint::parse("ws://127.0.0.1:8700/ws").unwrap();
        assert_eq!(parts(&e), ("ws", "127.0.0.1", 8700, "/ws"));
        assert!(e.is_loopback() && !e.is_tls());
        let e = Endpoint::parse("http://localhost").unwrap();
        assert_eq!(parts(&e), ("http", "localhost", 80, "/"));
        let e = Endpoint::parse("ws://[::1]:9000/ws?token=x").unwrap();
        assert_eq!(parts(&e), ("ws", "::1", 9000, "/ws?token=x"));
        assert_eq!(e.authority(), "[::1]:9000");
        let e = Endpoint::parse("http://example.com:81?x=1").unwrap();
        assert_eq!(e.path, "/?x=1");
        assert!(!e.is_loopback());
        let e = Endpoint::parse("HTTPS://Node.example").unwrap();
        assert_eq!(parts(&e), ("https", "node.example", 443, "/"));
        assert!(e.is_tls());
        assert_eq!(Endpoint::parse("wss://h/ws").unwrap().port, 443);
    }

    #[test]
    fn endpoint_refuses_bad_urls_saying_why() {
        for (bad, why) in [
            ("127.0.0.1:8700", "write it as http://127.0.0.1:8700"),
            ("localhost:8700", "no scheme"),
            ("ws://:80/", "host"),
            ("ws://a:x/", "port"),
            ("ftp://a", "scheme ftp://"),
        ] {
            let e = Endpoint::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn endpoint_derives_the_websocket_and_api_urls_from_any_form() {
        for (given, ws, api) in [
            ("http://h:1", "ws://h:1/ws", "http://h:1/"),
            ("http://h:1/", "ws://h:1/ws", "http://h:1/"),
            ("ws://h:1", "ws://h:1/ws", "http://h:1/"),
            ("ws://h:1/ws", "ws://h:1/ws", "http://h:1/"),
            ("wss://h/ws/", "wss://h:443/ws", "https://h:443/"),
            ("https://h:2/sb", "wss://h:2/sb/ws", "https://h:2/sb/"),
            ("ws://h:1/sb/ws?token=t", "ws://h:1/sb/ws?token=t", "http://h:1/sb/"),
        ] {
            let e = Endpoint::parse(given).unwrap();
            assert_eq!(e.websocket().url(), ws, "{given}");
            assert_eq!(e.api().url(), api, "{given}");
        }
    }

    #[test]
    fn endpoint_keeps_credentials_but_never_shows_the_password() {
        let e = Endpoint::parse("https://alice:p%40ss:w0rd@h:8443/x").unwrap();
        assert_eq!((e.user.as_deref(), e.password()), (Some("alice"), Some("p@ss:w0rd")));
        assert_eq!(e.to_string(), "https://alice:***@h:8443/x");
        assert_eq!(e.url(), "https://h:8443/x");
        assert!(!format!("{e:?}").contains("w0rd"));
        let e = Endpoint::parse("http://bob@h").unwrap();
        assert_eq!((e.user.as_deref(), e.password()), (Some("bob"), None));
        assert_eq!(e.to_string(), "http://bob@h:80/");
        // Unparsable URLs are echoed without their password too.
        let err = Endpoint::parse("http://carol:s3cret@h:notaport/").unwrap_err().to_string();
        assert!(!err.contains("s3cret") && err.contains("carol:***@h:notaport"), "{err}");
        assert!(!Endpoint::parse("carol:s3cret@h:8700").unwrap_err().to_string().contains("s3cret"));
        assert_eq!(redact("http://h/a@b"), "http://h/a@b");
    }
}
