//! The Switchboard wire protocol v1, shared by the gateway, the Rust client and the bench.
//!
//! Nothing here performs I/O: every function turns bytes into values or values into bytes, so
//! the decoders can be fuzzed and unit-tested in isolation.
//!
//! # Layout
//! - [`bounds`]: the documented range of every number a client sends, checked in one place.
//! - [`channel`]: channel-name validation and namespaces (SPEC §1).
//! - [`command`]: client → server commands and their decoding from JSON or MessagePack.
//! - [`message`]: server → client messages (replies, publications, presence, disconnects),
//!   encoded once per wire [`Format`].
//! - [`code`]: reply error codes and close / disconnect codes (SPEC §2).
//! - [`point`]: point data (`{v, t, q}` or a bare number) read once for trends and deadbands.
//! - [`websocket`]: RFC 6455 frame parsing (client frames) and header encoding (server frames).

pub mod bounds;
pub mod channel;
pub mod code;
pub mod command;
pub mod message;
pub mod point;
pub mod websocket;

pub use channel::{namespace_of, validate_channel, ChannelError};
pub use command::{decode_json_frame, decode_msgpack_frame, Command, CommandBody, DecodeError};
pub use message::Format;

/// A position in a channel's stream: the epoch and the offset of the last publication seen.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamPosition {
    pub epoch: String,
    pub offset: u64,
}
