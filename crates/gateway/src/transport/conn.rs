//! One accepted TCP connection: the TLS handshake when TLS is configured, then HTTP/1.1 with
//! upgrades, every request parsed by hyper (RFC 9112: request line, headers, `Content-Length`,
//! `Transfer-Encoding`, `Connection`, keep-alive and pipelining are hyper's; a request whose
//! framing hyper cannot read is answered 400 and the connection closed). Every request
//! carries the peer's address (`transport::http::Peer`) for the per-address limits.
//!
//! Before any route, [`host_refusal`] holds a request to the `Host` rules hyper leaves to the
//! server (RFC 9112 §3.2): exactly one `Host` in an HTTP/1.1 request, none doubled in any, and
//! an absolute-form target whose authority is that `Host`. A refused request is answered 400
//! with `Connection: close`, so hyper closes the connection after it: whatever followed on the
//! connection is never read as a request.
//!
//! Slow clients (slowloris) are cut: the TLS handshake and each request head must complete
//! within `limits.handshake_timeout_s`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Version};
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tower::ServiceExt;

use crate::node::Node;
use crate::transport::http::{error, Peer};

/// Serves one connection to its end (or to its upgrade).
pub async fn serve(node: Arc<Node>, app: Router, tcp: TcpStream, peer: SocketAddr) {
    let timeout = Duration::from_secs(node.config.limits.handshake_timeout_s);
    // hyper's connection and the TLS handshake are boxed: each is a large future, and a
    // connection needs only the ones it uses.
    match node.config.security.tls.clone() {
        None => Box::pin(serve_http(tcp, app, peer, timeout)).await,
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls);
            match Box::pin(tokio::time::timeout(timeout, acceptor.accept(tcp))).await {
                Ok(Ok(stream)) => Box::pin(serve_http(stream, app, peer, timeout)).await,
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        }
    }
}

/// Serves a connection with the node's routes, every request carrying `peer` ([`serve_with`]).
pub async fn serve_http<I>(io: I, app: Router, peer: SocketAddr, timeout: Duration)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_with(io, timeout, move |req| {
        let app = app.clone();
        async move {
            let mut req = req.map(Body::new);
            req.extensions_mut().insert(Peer(peer));
            match app.oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            }
        }
    })
    .await;
}

/// Serves a connection with hyper — HTTP/1.1 with upgrades, each request head within
/// `timeout` — answering each request with `handle`, once it passed [`host_refusal`].
pub async fn serve_with<I, F, Fut>(io: I, timeout: Duration, handle: F)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> Fut + Send + 'static,
    Fut: Future<Output = Response> + Send + 'static,
{
    let handle = Arc::new(handle);
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let refused = host_refusal(&req);
        let handle = handle.clone();
        async move {
            Ok::<Response, Infallible>(match refused {
                Some(r) => r,
                None => handle(req).await,
            })
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}

/// The `Host` rules of RFC 9112 §3.2 and §3.2.2 that hyper leaves to the server: an HTTP/1.1
/// request has exactly one `Host`; no request has two; an absolute-form target's authority is
/// the `Host`. `Some`: the 400 that closes the connection.
pub fn host_refusal<B>(req: &axum::http::Request<B>) -> Option<Response> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    let why = if hosts.next().is_some() {
        "more than one Host header"
    } else if host.is_none() && req.version() >= Version::HTTP_11 {
        "no Host header"
    } else if host.is_some_and(|h| !valid_host(h.as_bytes())) {
        "the Host header is not a host name with an optional port"
    } else {
        match (req.uri().authority(), host) {
            // Host names are case-insensitive (RFC 3986 §3.2.2).
            (Some(authority), Some(host)) if !authority.as_str().as_bytes().eq_ignore_ascii_case(host.as_bytes()) => {
                "the request target's authority is not the Host header"
            }
            (Some(_), None) => "the request target's authority is not the Host header",
            _ => return None,
        }
    };
    let mut r = error(400, why);
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    Some(r)
}

/// Whether `host` is `uri-host [ ":" port ]` (RFC 9110 §7.2): an authority without user
/// information, possibly empty (RFC 9112 §3.2 allows an empty `Host`).
fn valid_host(host: &[u8]) -> bool {
    host.is_empty() || (!host.contains(&b'@') && axum::http::uri::Authority::try_from(host).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(version: Version, target: &str, hosts: &[&str]) -> axum::http::Request<()> {
        let mut r = axum::http::Request::builder().version(version).uri(target);
        for h in hosts {
            r = r.header(header::HOST, *h);
        }
        r.body(()).unwrap()
    }

    #[test]
    fn conn_host_is_exact() {
        let ok = [
            req(Version::HTTP_11, "/api/info", &["127.0.0.1:8700"]),
            req(Version::HTTP_10, "/api/info", &[]),
            req(Version::HTTP_11, "http://127.0.0.1:8700/api/info", &["127.0.0.1:8700"]),
            req(Version::HTTP_11, "http://Node.Example/api/info", &["node.example"]),
        ];
        for r in &ok {
            assert!(host_refusal(r).is_none(), "{r:?}");
        }
        let refused = [
            req(Version::HTTP_11, "/api/info", &[]),
            req(Version::HTTP_11, "/api/info", &["a", "a"]),
            req(Version::HTTP_10, "/api/info", &["a", "b"]),
            req(Version::HTTP_11, "http://other.example/api/info", &["127.0.0.1:8700"]),
            req(Version::HTTP_10, "http://other.example/api/info", &[]),
            req(Version::HTTP_11, "/api/info", &["a, a"]),
            req(Version::HTTP_11, "/api/info", &["user@a"]),
            req(Version::HTTP_11, "/api/info", &["a b"]),
        ];
        for r in &refused {
            let answer = host_refusal(r).expect("refused");
            assert_eq!(answer.status(), 400, "{r:?}");
            assert_eq!(answer.headers()[header::CONNECTION], "close");
        }
    }
}
