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

/// Close codes. 1000 and 1009 are RFC 6455's; the 4xxx codes are Switchboard's.
pub mod close {
    pub const NORMAL: u16 = 1000;
    pub const MESSAGE_TOO_BIG: u16 = 1009;
    /// Server shutting down; reconnect (to another node).
    pub const SHUTDOWN: u16 = 4000;
    /// Invalid or expired token; do not reconnect without a new one.
    pub const INVALID_TOKEN: u16 = 4001;
    pub const FORBIDDEN: u16 = 4003;
    /// Slow consumer: the outbound queue passed its bound; reconnect and recover.
    pub const SLOW_CONSUMER: u16 = 4008;
    /// Protocol error: a frame that is not a valid command.
    pub const PROTOCOL_ERROR: u16 = 4010;
    /// Too many connections or subscriptions.
    pub const TOO_MANY: u16 = 4029;
    /// Silent for three ping intervals.
    pub const STALE: u16 = 4011;
    /// The connect hook gave a bad answer (not JSON, no verdict, a status other than 2xx /
    /// 5xx); reconnect later.
    pub const HOOK_FAILED: u16 = 4502;
    /// The connect hook could not be asked (timeout, connection error, 5xx); reconnect later.
    pub const HOOK_UNAVAILABLE: u16 = 4503;

    /// Whether a client should reconnect after this code.
    pub fn reconnect(code: u16) -> bool {
        matches!(code, SHUTDOWN | SLOW_CONSUMER | STALE | TOO_MANY | HOOK_FAILED | HOOK_UNAVAILABLE)
    }
}
