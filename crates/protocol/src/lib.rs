//! The Switchboard wire protocol v1, shared by the gateway, the Rust client and the bench.
//!
//! Nothing here performs I/O: every function turns bytes into values or values into bytes, so
//! the decoders can be fuzzed and unit-tested in isolation.
//!
//! # Layout
//! - [`bounds`]: the documented range of every number a client sends, checked in one place.
//! - [`channel`]: channel-name validation and namespaces (SPEC §1).
//! - [`command`]: client → server commands and their decoding from JSON or MessagePack.
//! - [`filter`]: publication tags and the subscribe filters that select publications by them.
//! - [`message`]: server → client messages (replies, publications, presence, disconnects),
//!   encoded once per wire [`Format`].
//! - [`code`]: reply error codes and close / disconnect codes (SPEC §2).
//! - [`point`]: point data (`{v, t, q}` or a bare number) read once for trends and deadbands.
//! - [`websocket`]: RFC 6455 frame parsing (client frames, compressed messages inflated) and
//!   header encoding (server frames); permessage-deflate, RFC 7692 (`websocket::deflate`: the
//!   negotiation in `websocket::deflate::offer`, a message deflated once for every recipient
//!   with the same window, a client's message inflated within the message limit; no state per
//!   connection).

pub mod bounds;
pub mod channel;
pub mod code;
pub mod command;
pub mod filter;
pub mod message;
pub mod point;
pub mod websocket;

pub use channel::{namespace_of, validate_channel, ChannelError};
pub use command::{decode_json_frame, decode_msgpack_frame, Command, CommandBody, DecodeError};
pub use message::Format;

/// A value a client sent outside its documented range or shape ([`bounds`], [`filter`]): the
/// field and why; answered with 400.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfBounds {
    /// The field: its name, or its place in a structure the client sent (`filter.nodes[1].cmp`).
    pub field: std::borrow::Cow<'static, str>,
    pub message: String,
}

impl std::fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A position in a channel's stream: the epoch and the offset of the last publication seen.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamPosition {
    pub epoch: String,
    pub offset: u64,
}
