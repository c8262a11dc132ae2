//! Transports: how clients reach a [`Session`](crate::session::Session). `conn` serves an
//! accepted TCP connection (TLS, then HTTP/1.1 parsed by hyper, the `Host` rules, the peer
//! address); `tls` holds the TLS configuration and the TLS wire a WebSocket connection writes
//! through; `ws` is the WebSocket transport (`ws::socket`: its frame reader and closing,
//! shared with `crate::echo`, the `switchboard echo` server for the Autobahn TestSuite);
//! `owned` holds what a transport that owns its socket (a WebSocket after the upgrade) needs
//! (deadlines, closing).
//! The HTTP transports write through hyper's response bodies and share the session and outbox
//! machinery and `http` (admission, CORS): `sse` streams Server-Sent Events, `poll` serves
//! long-poll sessions over HTTP (`poll/`: their live copies in `poll::session`, what the
//! broker's session store keeps of them in `poll::record`, taken over from it in
//! `poll::takeover`, what their requests and answers carry in `poll::wire`, and a session's
//! messages streamed as events in `poll::stream`).

pub mod conn;
pub mod http;
pub mod owned;
pub mod poll;
pub mod sse;
pub mod tls;
pub mod ws;
