//! Server pushes (SPEC §2): publications, presence, ended subscriptions, disconnects, and the end
//! of the connection.

use serde::{Deserialize, Serialize};
use switchboard_protocol::message::ErrorBody;

/// A publication in its WebSocket form `{"ch", "off", "data"}`: pushed live, and inside the
/// `last` / `recovered` fields of a subscribe reply and in `history` replies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Publication {
    pub ch: String,
    pub off: u64,
    pub data: serde_json::Value,
}

/// A presence change: `{"join": {...}}` or `{"leave": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Presence {
    pub ch: String,
    pub client: String,
    #[serde(default)]
    pub user: Option<String>,
}

/// Something the server sent that is not the reply to a pending command.
///
/// Events arrive in the order the server sent them; a publication never precedes the subscribe
/// reply of its channel (docs/protocol.md, "Ordering").
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Publication(Publication),
    Join(Presence),
    Leave(Presence),
    /// The server is about to close the connection with `code` (SPEC §2 close codes).
    Disconnect {
        code: u16,
        reason: String,
        reconnect: bool,
    },
    /// The server ended the subscription of `ch` (its broker shard may have lost publications
    /// of it); the connection stays. Subscribe it again with `recover` from the last offset.
    Unsubscribed {
        ch: String,
        code: u16,
        reason: String,
    },
    /// Server-side subscriptions the application's connect hook made for this connection
    /// (docs/backend.md): the `{"channels": {...}}` body, shaped as a subscribe reply (read it
    /// with `serde_json::from_value::<SubscribeReply>`).
    Subscribed(serde_json::Value),
    /// An error reply nobody waits for: a failed command sent without id (the server reports
    /// it with id 0).
    Error(ErrorBody),
    /// The connection ended; the last event. `code` is the close frame's code, or 1006 when
    /// the connection dropped without one; `reason` the frame's reason (empty without one).
    Closed {
        code: u16,
        reason: String,
    },
}
