//! Numeric codes a client sees (SPEC §2): reply error codes and close / disconnect codes.

pub const BAD_REQUEST: u16 = 400;
pub const UNAUTHORIZED: u16 = 401;
pub const FORBIDDEN: u16 = 403;
pub const NOT_FOUND: u16 = 404;
pub const CONFLICT: u16 = 409;
pub const TOO_LARGE: u16 = 413;
pub const LIMIT: u16 = 429;
pub const INTERNAL: u16 = 500;
/// A write to a plant data source that the device (or its MQTT broker / OPC UA server) refused.
pub const DEVICE_REFUSED: u16 = 502;
/// Not done, try again later: a publish or read while the broker (Redis) is unreachable or
/// failing over, once the wait for it is over (nothing was published); a write to a plant
/// data source that could not be made now (the source is not connected, the device did not
/// answer in time, or in a cluster the node running the source did not answer the forwarded
/// write).
pub const UNAVAILABLE: u16 = 503;
/// The application's backend (a `[proxy]` hook) gave an answer that is not a verdict: an HTTP
/// status other than 2xx or 5xx, a body that is not JSON, or neither `result` nor `error`.
/// (Also a device's refusal of a write: [`DEVICE_REFUSED`].)
pub const BAD_GATEWAY: u16 = 502;
/// A publish whose outcome is unknown: it reached the broker but no answer came back in time,
/// so the publication may or may not have been committed. Retrying with the same
/// `idempotency_key` is safe (it answers the first result if there was one).
pub const OUTCOME_UNKNOWN: u16 = 504;

/// Close codes. The 1xxx codes are RFC 6455's: the WebSocket connection itself failed (a
/// frame broke the standard) and the close frame comes alone, with no `disconnect` message
/// before it. The 4xxx codes are Switchboard's: the frames were fine and the application ends
/// the connection, telling why in a `disconnect` message first.
pub mod close {
    pub const NORMAL: u16 = 1000;
    /// RFC 6455 protocol error: reserved bits or opcodes, an unmasked frame, a control frame
    /// longer than 125 bytes or fragmented, fragments out of order, a close frame with a
    /// 1-byte payload or a code no peer may send.
    pub const RFC_PROTOCOL_ERROR: u16 = 1002;
    /// RFC 6455 invalid payload: a text message or a close reason that is not UTF-8.
    pub const INVALID_PAYLOAD: u16 = 1007;
    /// RFC 6455 message too big: past `limits.max_frame_bytes`.
    pub const MESSAGE_TOO_BIG: u16 = 1009;
    /// Server shutting down; reconnect (to another node).
    pub const SHUTDOWN: u16 = 4000;
    /// Invalid or expired token; do not reconnect without a new one.
    pub const INVALID_TOKEN: u16 = 4001;
    pub const FORBIDDEN: u16 = 4003;
    /// Slow consumer: the outbound queue passed its bound; reconnect and recover.
    pub const SLOW_CONSUMER: u16 = 4008;
    /// A valid frame that carries no valid command (not JSON or MessagePack, not a command, a
    /// binary frame on the JSON subprotocol or a text frame on the MessagePack one), or a
    /// message the client did not complete within `limits.handshake_timeout_s`.
    pub const BAD_COMMAND: u16 = 4010;
    /// Too many connections or subscriptions.
    pub const TOO_MANY: u16 = 4029;
    /// Silent for three ping intervals.
    pub const STALE: u16 = 4011;
    /// The connect hook gave a bad answer (not JSON, no verdict, a status other than 2xx /
    /// 5xx); reconnect later.
    pub const HOOK_FAILED: u16 = 4502;
    /// The connect hook could not be asked (timeout, connection error, 5xx); reconnect later.
    pub const HOOK_UNAVAILABLE: u16 = 4503;

    /// Whether a peer may send `code` in a close frame (RFC 6455 §7.4): the standard's codes
    /// in use (1000–1003, 1007–1011, and 1012–1014 of its IANA registry), and those for
    /// libraries and applications (3000–4999). 1004–1006 and 1015 are reserved or only for
    /// reporting; anything else is unassigned.
    pub fn sendable(code: u16) -> bool {
        matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
    }

    /// Whether a client should reconnect after this code.
    pub fn reconnect(code: u16) -> bool {
        matches!(code, SHUTDOWN | SLOW_CONSUMER | STALE | TOO_MANY | HOOK_FAILED | HOOK_UNAVAILABLE)
    }
}
