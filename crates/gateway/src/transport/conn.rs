//! One accepted TCP connection: the TLS handshake when TLS is configured, then HTTP/1.1 with
//! upgrades. Every request carries the peer's address (`transport::http::Peer`) for the
//! per-address limits. A plain connection that opens with an event stream or a held poll is
//! served by the node's own HTTP/1.1 (`transport::http1`), in a task of its own; any other
//! is hyper's.
//!
//! Slow clients (slowloris) are cut: the TLS handshake and each request head must complete
//! within `limits.handshake_timeout_s`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpStream;

use crate::node::Node;
use crate::transport::http1::{self, First};

/// Serves one connection to its end (or to its upgrade).
pub async fn serve(node: Arc<Node>, app: Router, tcp: TcpStream, peer: SocketAddr) {
    let timeout = Duration::from_secs(node.config.limits.handshake_timeout_s);
    // hyper's connection and the TLS handshake are boxed: each is a large future, and a
    // connection needs only the ones it uses.
    match node.config.security.tls.clone() {
        None => match http1::first_request(&tcp, peer, timeout).await {
            // The request gets a task of its own that holds only what it serves; this one,
            // sized for hyper's connections, ends here.
            First::Owned(parts) => drop(tokio::spawn(http1::serve(node, app, tcp, peer, parts))),
            First::Http => Box::pin(http1::serve_http(tcp, app, peer, timeout)).await,
            First::Gone => {}
        },
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls);
            match Box::pin(tokio::time::timeout(timeout, acceptor.accept(tcp))).await {
                Ok(Ok(stream)) => Box::pin(http1::serve_http(stream, app, peer, timeout)).await,
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        }
    }
}
