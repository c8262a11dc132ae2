//! One accepted TCP connection: the TLS handshake when TLS is configured, then HTTP/1.1 with
//! upgrades. Every request carries the peer's address (`transport::http::Peer`) for the
//! per-address limits. A plain connection that opens with an event stream request is served by
//! the stream itself (`transport::sse::socket`), in a task of its own, which owns its socket as
//! a WebSocket connection does.
//!
//! Slow clients (slowloris) are cut: the TLS handshake and each request head must complete
//! within `limits.handshake_timeout_s`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tower::ServiceExt;

use crate::node::Node;
use crate::transport::http::Peer;
use crate::transport::sse::{self, socket::First};

/// Serves one connection to its end (or to its upgrade).
pub async fn serve(node: Arc<Node>, app: Router, tcp: TcpStream, peer: SocketAddr) {
    let timeout = Duration::from_secs(node.config.limits.handshake_timeout_s);
    let svc = app.clone().map_request(move |mut req: Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(Peer(peer));
        req
    });
    // hyper's connection and the TLS handshake are boxed: each is a large future, and a
    // connection needs only the ones it uses.
    match node.config.security.tls.clone() {
        None => match sse::socket::first_request(&tcp, peer, timeout).await {
            // The stream gets a task of its own that holds only the stream's state; this one,
            // sized for hyper's connections, ends here.
            First::Stream(parts) => drop(tokio::spawn(sse::socket::serve(node, app, tcp, parts))),
            First::Http => Box::pin(serve_http(TokioIo::new(tcp), svc, timeout)).await,
            First::Gone => {}
        },
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls);
            match Box::pin(tokio::time::timeout(timeout, acceptor.accept(tcp))).await {
                Ok(Ok(stream)) => Box::pin(serve_http(TokioIo::new(stream), svc, timeout)).await,
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        }
    }
}

async fn serve_http<I, S>(io: TokioIo<I>, svc: S, timeout: Duration)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<Request<hyper::body::Incoming>, Response = axum::response::Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .serve_connection(io, TowerToHyperService::new(svc))
        .with_upgrades();
    let _ = conn.await;
}
