//! A Rust client for the Switchboard WebSocket protocol v1 and HTTP API (SPEC §2, §4).
//!
//! Used by the `switchboard publish` / `switchboard sub` tools, the bench and the black-box
//! tests. It reaches nodes over `ws://` / `http://` and, with rustls, `wss://` / `https://`
//! (verified against the system's roots or a given CA), with a token or Basic credentials.
//!
//! ```no_run
//! # async fn demo() -> Result<(), switchboard_client::Error> {
//! use switchboard_client::{Client, Event, Format, SubscribeOptions};
//! let mut client = Client::connect("ws://127.0.0.1:8700/ws", Format::Json).await?;
//! client.subscribe(SubscribeOptions::new(["room:1"]).initial(true)).await?;
//! client.publish("room:1", serde_json::json!({"text": "hi"})).await?;
//! while let Some(event) = client.next_event().await {
//!     if let Event::Publication(p) = event {
//!         println!("{} @{}: {}", p.ch, p.off, p.data);
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - [`client`]: [`Client`], one WebSocket connection: commands with replies matched by id, a
//!   background reader task, and the stream of server pushes ([`Events`]).
//! - [`endpoint`]: [`Endpoint`], a node's URL in any of its forms, the WebSocket URL and API
//!   base derived from it, and its password kept out of every message.
//! - [`connect`]: credentials ([`Credentials`]), TCP or TLS connections and the WebSocket
//!   handshake ([`handshake`]), shared with the bench which drives raw connections itself.
//! - [`tls`]: trusted roots ([`TlsConfig`]) and the plain-or-TLS stream ([`MaybeTls`]).
//! - [`wire`]: the byte stream under the WebSocket ([`Wire`]): bytes counted ([`WireStats`]),
//!   and with permessage-deflate ([`Compression`]) the server's compressed messages inflated
//!   before tungstenite, which has no such extension, reads them.
//! - [`frame`]: splitting a server frame into its messages (`\n`-separated JSON, concatenated
//!   MessagePack maps) and decoding them.
//! - [`event`]: server pushes ([`Event`], [`Publication`], historical ones flagged, the
//!   publisher's tags).
//! - [`delta`]: publications of `delta: "fossil"` subscriptions, rebuilt by the connection's
//!   reader from their text or Fossil delta ([`Chains`]); one that cannot be is
//!   [`Event::DeltaFailed`], and the subscriber resubscribes the channel with recovery.
//! - [`reply`]: command options and typed `ok` reply bodies.
//! - [`resume`]: [`Streams`], each channel's stream position and the rule for a channel
//!   subscribed again: recovered publications once and in order, and a gap ([`Gap`]) followed
//!   by the channel's latest value; [`Delivery`], a publication with its epoch.
//! - [`resubscribe`]: the subscribe-again rule, owned here for every Rust caller (the `sub`
//!   tool, the bench, the tests): [`SubscribeAll`] asks channels refused past a reply's byte
//!   budget (413) again in further commands while replies take some
//!   ([`Client::subscribe_all`]); [`Subscriber`] is a subscriber's whole loop on a connection,
//!   keeping channels refused for now (503) or ended by the server (`unsubscribed`) waiting
//!   with a doubling delay and subscribing them again with `recover` from their [`Streams`]
//!   position, and handing back what to report ([`Update`]).
//! - [`http`]: a minimal HTTP/1.1 client for the HTTP API ([`HttpApi`], [`http_publish`]).
//! - [`trend`]: trends ([`Trend`], its buckets and the namespace's tiers), read over the HTTP
//!   API ([`HttpApi::trend`], with `until_ms` for a past window) or from a subscribe result.
//! - [`cli`]: the `publish` and `sub` command-line tools.
//! - [`error`]: [`Error`], what every call here can fail with.

// Tests may unwrap: a panic is the failure report there.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod cli;
pub mod client;
pub mod connect;
pub mod delta;
pub mod endpoint;
pub mod error;
pub mod event;
pub mod frame;
pub mod http;
pub mod reply;
pub mod resubscribe;
pub mod resume;
pub mod tls;
pub mod trend;
pub mod wire;

pub use client::{Client, Events};
pub use connect::{handshake, Compression, ConnectOptions, Credentials, WsStream};
pub use delta::{Chains, DeltaError};
pub use endpoint::Endpoint;
pub use error::{Error, Result};
pub use event::{Event, Presence, Publication};
pub use http::{http_publish, http_publish_batch, HttpApi};
pub use reply::{
    ChannelResult, ConnectReply, HistoryReply, PresenceClient, PresenceReply, PublishReply, RefreshReply,
    SubscribeOptions, SubscribeReply, Subscribed,
};
pub use resubscribe::{SubscribeAll, Subscriber, Update, RETRY_FIRST, RETRY_MOST};
pub use resume::{Delivery, Gap, Resumed, Streams};
pub use switchboard_protocol::message::ErrorBody;
pub use switchboard_protocol::{Format, StreamPosition};
pub use tls::{MaybeTls, TlsConfig};
pub use trend::{Trend, TrendBucket, TrendTier};
pub use wire::{Wire, WireStats};
