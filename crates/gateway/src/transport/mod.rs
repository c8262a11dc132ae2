//! Transports: how clients reach a [`Session`](crate::session::Session). `conn` serves an
//! accepted TCP connection (TLS, HTTP/1.1, the peer address), with `http1`, the node's own
//! HTTP/1.1, for the requests that are cheaper off the socket than through hyper (an event
//! stream or a held poll that opens a plain connection); `tls` holds the TLS configuration
//! and the TLS wire a WebSocket connection writes through; `ws` is the WebSocket transport;
//! `owned` holds what the transports that own their socket share (deadlines, closing).
//! The HTTP transports share the session and outbox machinery and `http` (admission, CORS):
//! `sse` streams Server-Sent Events (a stream that opens a plain connection owns its socket and
//! is written by the fan-out like a WebSocket; otherwise hyper's body takes the framed events),
//! `poll` serves long-poll sessions over HTTP, `poll_socket` answers a held poll (and serves
//! the polls that follow on a connection a poll opened, where `poll_held` has the fan-out
//! answer a held one), `poll_session` holds their live copies (`poll_streamed`: what a socket
//! they own was written), `poll_wire` what their requests
//! and answers carry (batches, command bodies), `poll_store` keeps their state where any node
//! can continue them, `poll_takeover` continues one there, and `session_stream` streams a
//! session's messages as events (on a socket of its own when the stream opened the
//! connection, else through hyper).

pub mod conn;
pub mod http;
pub mod http1;
pub mod owned;
pub mod poll;
pub mod poll_held;
pub mod poll_session;
pub mod poll_socket;
pub mod poll_store;
pub mod poll_streamed;
pub mod poll_takeover;
pub mod poll_wire;
pub mod session_stream;
pub mod sse;
pub mod tls;
pub mod ws;
