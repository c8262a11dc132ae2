//! Transports: how clients reach a [`Session`](crate::session::Session). WebSocket today;
//! SSE and long-polling share the session and outbox machinery.

pub mod ws;
