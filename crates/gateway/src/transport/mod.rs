//! Transports: how clients reach a [`Session`](crate::session::Session). WebSocket today;
//! SSE and long-polling share the session and outbox machinery. `conn` serves an accepted TCP
//! connection (TLS, HTTP/1.1, the peer address); `tls` holds the TLS configuration and the
//! TLS wire a WebSocket connection writes through.

pub mod conn;
pub mod tls;
pub mod ws;
