//! `[limits]`: the node's limits ([`Limits`]), their defaults, the reply budget they give and the
//! share authentication enforces; the WebSocket compression it allows ([`Compression`]).

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub max_connections: usize,
    pub max_subscriptions: usize,
    /// Largest accepted client frame (and reassembled message) in bytes; larger closes 1009.
    pub max_frame_bytes: usize,
    /// Bound of a connection's queued, unwritten bytes (non-conflated) before 4008.
    pub max_pending_bytes: usize,
    /// Seconds between server pings; silent connections close after 3× this.
    pub ping_s: u64,
    /// Most channels one subscribe command may name.
    pub max_channels_per_subscribe: usize,
    /// Largest publication data in bytes (413).
    pub max_publication_bytes: usize,
    /// WebSocket connections from one client address; more are closed with 4029.
    pub max_connections_per_ip: usize,
    /// WebSocket handshakes per second from one client address (bursts of twice this pass);
    /// more are refused with HTTP 429.
    pub handshakes_per_ip_per_s: usize,
    /// Publishes per second on one connection (bursts of twice this pass); more get error 429.
    pub publishes_per_connection_per_s: usize,
    /// Presence joins per second on one connection — subscribes of channels in presence
    /// namespaces (bursts of twice this pass); more get error 429 for those channels. Leaves
    /// follow joins, so they are bounded too.
    pub presence_changes_per_connection_per_s: usize,
    /// Publications per second with one API key over the HTTP API; more get 429.
    pub publishes_per_api_key_per_s: usize,
    /// Publications per second by one user (token `sub` or Basic user name) over the HTTP API,
    /// all its requests together (bursts of twice this pass); more get 429.
    pub publishes_per_user_per_s: usize,
    /// Password checks (Argon2, tens of milliseconds each) per second for one client address;
    /// more are refused (WebSocket 4029, HTTP 429). Recently verified passwords skip the check.
    pub password_checks_per_ip_per_s: usize,
    /// Seconds a client has for its TLS handshake, each request head, and each WebSocket
    /// message once started (slowloris).
    pub handshake_timeout_s: u64,
    /// Seconds an unauthenticated client has for its first message when authentication is
    /// configured (4001 after).
    pub first_message_timeout_s: u64,
    /// Loopback clients (local tools and benchmarks, or a local proxy not listed in
    /// `auth.trusted_proxies`) skip the per-address and per-connection rate limits.
    pub exempt_loopback: bool,
    /// Most channels this node holds: in the memory broker every channel, with a shared broker
    /// the channels with local subscribers. Past it, publishing to or subscribing a new
    /// channel is refused with 429; existing channels keep working.
    pub max_channels: usize,
    /// permessage-deflate (RFC 7692) on WebSocket connections whose client offers it.
    pub compression: Compression,
    /// Messages shorter than this go out uncompressed on a compressing connection: below it,
    /// compressing saves fewer bytes than it costs (docs/operations.md, "Compression").
    pub compression_min_bytes: usize,
}

/// `limits.compression`: what the node's WebSocket may negotiate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Never: offers are declined, every frame goes out as it is.
    Off,
    /// permessage-deflate when the client offers it (browsers do).
    Deflate,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 100_000,
            max_subscriptions: 10_000,
            max_frame_bytes: 64 * 1024,
            max_pending_bytes: 1024 * 1024,
            ping_s: 25,
            max_channels_per_subscribe: 10_000,
            max_publication_bytes: 64 * 1024,
            max_connections_per_ip: 1000,
            handshakes_per_ip_per_s: 50,
            publishes_per_connection_per_s: 100,
            presence_changes_per_connection_per_s: 20,
            publishes_per_api_key_per_s: 10_000,
            publishes_per_user_per_s: 1000,
            password_checks_per_ip_per_s: 5,
            handshake_timeout_s: 10,
            first_message_timeout_s: 5,
            exempt_loopback: true,
            max_channels: 1_000_000,
            compression: Compression::Deflate,
            compression_min_bytes: COMPRESSION_MIN_BYTES,
        }
    }
}

/// The default of `limits.compression_min_bytes`: JSON shorter than this saves at most about
/// 100 bytes, no more than the headers of the packet that carries it, for the compressor's fixed
/// 3 µs (docs/benchmarks.md, "WebSocket compression").
pub const COMPRESSION_MIN_BYTES: usize = 256;

impl Limits {
    /// The bytes of data one reply may carry — a subscribe's `last`, `recovered` and `trend`, a
    /// `history` page, the body of `GET …/trend` — on every transport: half of
    /// `max_pending_bytes` (docs/protocol.md, "Reply bound"). The other half stays for what a
    /// connection queues while its reply is built (a reply that pushes a non-empty queue past
    /// the bound closes the connection with 4008).
    pub fn reply_budget(&self) -> usize {
        self.max_pending_bytes / 2
    }

    /// The limits authentication enforces.
    pub fn auth(&self) -> crate::auth::AuthLimits {
        crate::auth::AuthLimits {
            max_connections_per_ip: self.max_connections_per_ip,
            handshakes_per_ip_per_s: self.handshakes_per_ip_per_s,
            publishes_per_api_key_per_s: self.publishes_per_api_key_per_s,
            publishes_per_user_per_s: self.publishes_per_user_per_s,
            password_checks_per_ip_per_s: self.password_checks_per_ip_per_s,
            exempt_loopback: self.exempt_loopback,
        }
    }
}

/// Authentication's limits default to `[limits]`'s (one place for the numbers).
impl Default for crate::auth::AuthLimits {
    fn default() -> crate::auth::AuthLimits {
        Limits::default().auth()
    }
}
