//! Server pushes (SPEC §2): publications, presence, ended subscriptions, disconnects, and the end
//! of the connection.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use switchboard_protocol::message::ErrorBody;

use crate::delta::error::DeltaError;

/// A publication in its WebSocket form `{"ch", "off", "data"}`: pushed live, and inside the
/// `last` / `recovered` fields of a subscribe reply and in `history` replies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Publication {
    pub ch: String,
    pub off: u64,
    pub data: serde_json::Value,
    /// `"hist": true` (absent otherwise): a value a plant source back-filled from before the
    /// channel's newest (a Sparkplug B `is_historical` metric, an OPC UA back-fill). It has its
    /// own offset and comes in offset order like any other publication, its data carries its
    /// own time (`t`), and it is never the channel's current value (a subscribe reply's `last`
    /// never is one).
    #[serde(default, rename = "hist", skip_serializing_if = "std::ops::Not::not")]
    pub historical: bool,
    /// The publisher's tags (`"tags": {"k": "v"}`, absent when none): what a subscription's
    /// `filter` compares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
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
    /// A publication of a `delta: "fossil"` subscription could not be rebuilt ([`DeltaError`]):
    /// the channel's stream has a hole from `off` on, though the server still holds the
    /// subscription. Unsubscribe the channel and subscribe it again with `recover` from the
    /// last publication delivered ([`crate::Subscriber`] does).
    DeltaFailed {
        ch: String,
        off: u64,
        error: DeltaError,
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
