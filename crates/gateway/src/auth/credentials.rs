//! Reading credentials and origins out of handshake headers (SPEC §6): `Authorization`
//! (`Bearer` or `Basic`), the `token` query parameter, and the `switchboard.token.<jwt>` entry of
//! `Sec-WebSocket-Protocol` — the only header a browser's WebSocket API lets a page set.
//!
//! Pure functions over header text, with no dependency on the rest of the crate, so the fuzz
//! crate compiles this file on its own. Nothing here verifies anything: it only takes the
//! request apart. [`Credential`]'s `Debug` never shows the secret.

use std::fmt;

use base64::Engine as _;

/// The subprotocol prefix that carries a token.
pub const TOKEN_PROTOCOL_PREFIX: &str = "switchboard.token.";

/// Longest accepted token or password, in bytes. Real JWTs are well under 2 KiB; the bound
/// keeps hostile headers from costing more than a header is worth.
pub const MAX_SECRET_LEN: usize = 8192;

/// What a client presented.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// A bearer token: a JWT, or an API key on the HTTP API.
    Bearer(String),
    /// A user name and password.
    Basic { user: String, password: String },
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            Credential::Basic { user, .. } => write!(f, "Basic({user:?}, <redacted>)"),
        }
    }
}

/// Why presented credentials could not even be read. The messages are safe to show the client
/// and to log: they never contain the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MalformedCredential {
    UnknownScheme,
    NotText,
    TooLong,
    BadBase64,
    NoColon,
    Empty,
}

impl fmt::Display for MalformedCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MalformedCredential::UnknownScheme => "Authorization scheme is neither Bearer nor Basic",
            MalformedCredential::NotText => "credentials are not printable text",
            MalformedCredential::TooLong => "credentials are too long",
            MalformedCredential::BadBase64 => "Basic credentials are not valid base64",
            MalformedCredential::NoColon => "Basic credentials have no `user:password` separator",
            MalformedCredential::Empty => "credentials are empty",
        })
    }
}

impl std::error::Error for MalformedCredential {}

/// Parses an `Authorization` header value.
pub fn parse_authorization(value: &[u8]) -> Result<Credential, MalformedCredential> {
    let text = std::str::from_utf8(value).map_err(|_| MalformedCredential::NotText)?.trim();
    if text.len() > MAX_SECRET_LEN + 16 {
        return Err(MalformedCredential::TooLong);
    }
    let (scheme, rest) = text.split_once(' ').ok_or(MalformedCredential::UnknownScheme)?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        bearer(rest)
    } else if scheme.eq_ignore_ascii_case("basic") {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(rest.as_bytes())
            .map_err(|_| MalformedCredential::BadBase64)?;
        let text = String::from_utf8(raw).map_err(|_| MalformedCredential::NotText)?;
        let (user, password) = text.split_once(':').ok_or(MalformedCredential::NoColon)?;
        if user.is_empty() {
            return Err(MalformedCredential::Empty);
        }
        if user.chars().any(char::is_control) {
            return Err(MalformedCredential::NotText);
        }
        Ok(Credential::Basic { user: user.to_string(), password: password.to_string() })
    } else {
        Err(MalformedCredential::UnknownScheme)
    }
}

fn bearer(token: &str) -> Result<Credential, MalformedCredential> {
    if token.is_empty() {
        return Err(MalformedCredential::Empty);
    }
    if token.len() > MAX_SECRET_LEN {
        return Err(MalformedCredential::TooLong);
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(MalformedCredential::NotText);
    }
    Ok(Credential::Bearer(token.to_string()))
}

/// The entries of `Sec-WebSocket-Protocol` header values, split into real subprotocols (in
/// order) and the token of a `switchboard.token.<jwt>` entry, if any. The token entry must
/// never be echoed back as the chosen subprotocol.
pub fn split_subprotocols<'a>(
    values: impl IntoIterator<Item = &'a str>,
) -> (Vec<&'a str>, Option<Result<Credential, MalformedCredential>>) {
    let mut protocols = Vec::new();
    let mut token = None;
    for entry in values.into_iter().flat_map(|v| v.split(',')).map(str::trim).filter(|e| !e.is_empty()) {
        match entry.strip_prefix(TOKEN_PROTOCOL_PREFIX) {
            Some(t) => {
                if token.is_none() {
                    token = Some(bearer(t));
                }
            }
            None => protocols.push(entry),
        }
    }
    (protocols, token)
}

/// The `token` parameter of a query string, percent-decoded.
pub fn token_from_query(query: &str) -> Option<Result<Credential, MalformedCredential>> {
    let raw = query.split('&').find_map(|kv| kv.strip_prefix("token="))?;
    if raw.len() > 3 * MAX_SECRET_LEN {
        return Some(Err(MalformedCredential::TooLong));
    }
    Some(match percent_decode(raw) {
        Some(t) => bearer(&t),
        None => Err(MalformedCredential::NotText),
    })
}

/// Decodes `%XX` escapes and `+` (a space in forms); `None` for broken escapes or non-UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let hi = (hex[0] as char).to_digit(16)?;
                let lo = (hex[1] as char).to_digit(16)?;
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Whether a browser handshake from `origin` may proceed.
///
/// - No `Origin` header: not a browser (browsers always send one on WebSocket handshakes), so
///   there is no cross-site request to stop; allowed.
/// - An empty allow-list means same-origin only: the origin's `host[:port]` must equal the
///   `Host` header (default ports ignored).
/// - Otherwise the origin must be in the list (scheme, host and port; case-insensitive; a
///   trailing `/` ignored) or the list must hold `*`.
pub fn origin_allowed(origin: Option<&str>, host: Option<&str>, allowed: &[String]) -> bool {
    let Some(origin) = origin else { return true };
    let origin = origin.trim().trim_end_matches('/');
    if allowed.is_empty() {
        let Some(host) = host else { return false };
        let Some((scheme, authority)) = origin.split_once("://") else { return false };
        return strip_default_port(scheme, authority).eq_ignore_ascii_case(strip_default_port(scheme, host.trim()));
    }
    allowed.iter().any(|a| {
        let a = a.trim().trim_end_matches('/');
        a == "*" || normalize(a).eq_ignore_ascii_case(&normalize(origin))
    })
}

/// Whether a request's `Host` header names this node (DNS rebinding, docs/security.md).
///
/// A page on a name the attacker controls can make that name resolve to this node's address
/// (a loopback node included); the browser then treats the node as same-origin with the page
/// and sends no `Origin` on reads. Its `Host` header still carries the attacker's name, so a
/// node accepts only names that are its own:
///
/// - no `Host` header (HTTP/1.0 tools): allowed — browsers always send one;
/// - `localhost` (and `*.localhost`, which browsers resolve to loopback themselves): allowed;
/// - an IP literal (`127.0.0.1`, `[::1]`): a rebinding needs a name, so an address is never
///   one; allowed when it is the bound address, any loopback address on a loopback node, or
///   any address on a node bound to all interfaces (`0.0.0.0`, `[::]`);
/// - any other name: only when listed in `names` (`auth.hosts`; `*` allows every name).
///
/// The port is ignored: a rebinding page can use the node's port as well.
pub fn host_allowed(host: Option<&str>, bound: std::net::IpAddr, names: &[String]) -> bool {
    let Some(host) = host else { return true };
    let Some(name) = host_name(host) else { return false };
    if names.iter().any(|n| n == "*" || host_name(n).is_some_and(|n| n.eq_ignore_ascii_case(name))) {
        return true;
    }
    let ip = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')).unwrap_or(name);
    if let Ok(ip) = ip.parse::<std::net::IpAddr>() {
        let ip = canonical_ip(ip);
        let bound = canonical_ip(bound);
        return bound.is_unspecified() || ip == bound || (bound.is_loopback() && ip.is_loopback());
    }
    let lower = name.to_ascii_lowercase();
    lower == "localhost" || lower.ends_with(".localhost")
}

/// The host part of a `Host` value (`name`, `name:port`, `[v6]`, `[v6]:port`), without a
/// trailing dot; `None` when it is not a plausible host.
fn host_name(host: &str) -> Option<&str> {
    let host = host.trim();
    let name = if host.starts_with('[') {
        let end = host.find(']')?;
        let rest = &host[end + 1..];
        if !(rest.is_empty() || rest.strip_prefix(':').is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))) {
            return None;
        }
        &host[..=end]
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) if p.bytes().all(|b| b.is_ascii_digit()) => n,
            Some(_) => return None,
            None => host,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    (!name.is_empty() && !name.contains(['/', '@', ' ', '\\'])).then_some(name)
}

/// IPv4-mapped IPv6 addresses compare as the IPv4 address they carry.
fn canonical_ip(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map(std::net::IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

fn normalize(origin: &str) -> String {
    match origin.split_once("://") {
        Some((scheme, authority)) => format!("{}://{}", scheme, strip_default_port(scheme, authority)),
        None => origin.to_string(),
    }
}

fn strip_default_port<'a>(scheme: &str, authority: &'a str) -> &'a str {
    let default = if scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("wss") {
        ":443"
    } else if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("ws") {
        ":80"
    } else {
        return authority;
    };
    authority.strip_suffix(default).unwrap_or(authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user_pass: &str) -> Vec<u8> {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(user_pass)).into_bytes()
    }

    #[test]
    fn credentials_authorization_schemes() {
        assert_eq!(parse_authorization(b"Bearer abc.def.ghi"), Ok(Credential::Bearer("abc.def.ghi".into())));
        assert_eq!(parse_authorization(b"bearer  x "), Ok(Credential::Bearer("x".into())));
        assert_eq!(
            parse_authorization(&basic("alice:s3:cret")),
            Ok(Credential::Basic { user: "alice".into(), password: "s3:cret".into() })
        );
        assert_eq!(parse_authorization(b"Digest x"), Err(MalformedCredential::UnknownScheme));
        assert_eq!(parse_authorization(b"Bearer"), Err(MalformedCredential::UnknownScheme));
        assert_eq!(parse_authorization(b"Basic !!!"), Err(MalformedCredential::BadBase64));
        assert_eq!(parse_authorization(&basic("nocolon")), Err(MalformedCredential::NoColon));
        assert_eq!(parse_authorization(&basic(":pw")), Err(MalformedCredential::Empty));
        assert_eq!(parse_authorization(b"Bearer \xff"), Err(MalformedCredential::NotText));
    }

    #[test]
    fn credentials_debug_hides_secrets() {
        let c = Credential::Basic { user: "alice".into(), password: "hunter2".into() };
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(!format!("{:?}", Credential::Bearer("tok".into())).contains("tok"));
    }

    #[test]
    fn credentials_token_subprotocol_is_split_off() {
        let (p, t) = split_subprotocols(["switchboard.v1.json, switchboard.token.a.b.c", "x"]);
        assert_eq!(p, vec!["switchboard.v1.json", "x"]);
        assert_eq!(t, Some(Ok(Credential::Bearer("a.b.c".into()))));
        let (p, t) = split_subprotocols(["switchboard.token."]);
        assert!(p.is_empty());
        assert_eq!(t, Some(Err(MalformedCredential::Empty)));
    }

    #[test]
    fn credentials_query_token_is_percent_decoded() {
        assert_eq!(token_from_query("a=1&token=x%2Ey"), Some(Ok(Credential::Bearer("x.y".into()))));
        assert_eq!(token_from_query("a=1"), None);
        assert_eq!(token_from_query("token=%zz"), Some(Err(MalformedCredential::NotText)));
    }

    #[test]
    fn credentials_host_rebinding() {
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let none: Vec<String> = vec![];
        for ok in [
            None,
            Some("127.0.0.1:8700"),
            Some("localhost:1"),
            Some("LOCALHOST."),
            Some("[::1]:8700"),
            Some("127.3.4.5"),
        ] {
            assert!(host_allowed(ok, lo, &none), "{ok:?}");
        }
        for bad in ["evil.test:8700", "evil.test", "10.0.0.1:8700", "localhost.evil.test", "", ":80", "a b", "[::1"] {
            assert!(!host_allowed(Some(bad), lo, &none), "{bad:?}");
        }
        let public: std::net::IpAddr = "192.0.2.7".parse().unwrap();
        assert!(host_allowed(Some("192.0.2.7:443"), public, &none));
        assert!(!host_allowed(Some("192.0.2.8"), public, &none));
        assert!(!host_allowed(Some("gw.example.com"), public, &none));
        let names = vec!["gw.example.com".to_string()];
        assert!(host_allowed(Some("GW.example.com.:8700"), public, &names));
        let any: std::net::IpAddr = "0.0.0.0".parse().unwrap();
        assert!(host_allowed(Some("10.1.2.3:8700"), any, &none));
        assert!(host_allowed(Some("[::ffff:10.1.2.3]"), any, &none));
        assert!(!host_allowed(Some("switchboard:8700"), any, &none));
        assert!(host_allowed(Some("whatever"), any, &["*".to_string()]));
    }

    #[test]
    fn credentials_origin_allow_list() {
        let none: Vec<String> = vec![];
        assert!(origin_allowed(None, Some("h:1"), &none));
        assert!(origin_allowed(Some("http://h:1"), Some("h:1"), &none));
        assert!(origin_allowed(Some("https://example.com"), Some("example.com:443"), &none));
        assert!(!origin_allowed(Some("http://evil:1"), Some("h:1"), &none));
        assert!(!origin_allowed(Some("null"), Some("h:1"), &none));
        let list = vec!["https://app.example.com".to_string()];
        assert!(origin_allowed(Some("https://APP.example.com/"), Some("x"), &list));
        assert!(origin_allowed(Some("https://app.example.com:443"), Some("x"), &list));
        assert!(!origin_allowed(Some("http://app.example.com"), Some("x"), &list));
        assert!(!origin_allowed(Some("https://app.example.com.evil.net"), Some("x"), &list));
        assert!(origin_allowed(Some("http://anything"), None, &["*".to_string()]));
    }
}
