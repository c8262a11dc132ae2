//! What a connection is sent, as data: each message a session, the hub or the outbox queues
//! comes with its [`Kind`], said by whoever queued it, so that each transport writes it in its
//! own wire form (a WebSocket frame, an SSE event, a poll batch entry) without reading back
//! what the node itself encoded. A subscribe's reply carries what each channel came to
//! ([`Outcomes`]): the SSE stream and the long-poll session take positions and recovered
//! publications from it.

use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use switchboard_broker::{Position, Publication, TrendBucket};
use switchboard_protocol::message::{Data, ErrorBody, Pub};

/// What one channel of a subscribe came to: its start (position, last value, recovered
/// publications, trend) or its error.
#[derive(Debug)]
pub enum Outcome {
    Ok {
        position: Position,
        last: Option<Publication>,
        recovered: Vec<Publication>,
        complete: bool,
        trend: Option<TrendReply>,
    },
    Err(ErrorBody),
}

/// What a trend read answers: `{"step_s", "buckets": [{"t", "min", "max", "last", "n"}],
/// "tiers": [{"step_s", "window_s"}]}` (the namespace's tiers, finest first).
#[derive(Debug, Clone, Serialize)]
pub struct TrendReply {
    pub step_s: u64,
    pub buckets: Vec<TrendBucket>,
    pub tiers: Vec<TierInfo>,
}

/// One tier a namespace keeps: buckets of `step_s` reaching back `window_s`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TierInfo {
    pub step_s: u64,
    pub window_s: u64,
}

/// Every channel of one subscribe with what it came to, in request order; shared by the reply
/// and whoever reads it.
#[derive(Debug, Clone)]
pub struct Outcomes(pub Arc<[(String, Outcome)]>);

impl Outcomes {
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Outcome)> {
        self.0.iter().map(|(ch, o)| (ch.as_str(), o))
    }

    /// The error of the first channel that failed, in request order.
    pub fn first_error(&self) -> Option<&ErrorBody> {
        self.0.iter().find_map(|(_, o)| match o {
            Outcome::Err(e) => Some(e),
            Outcome::Ok { .. } => None,
        })
    }
}

/// What a queued message is.
#[derive(Debug, Clone)]
pub enum Kind {
    /// `{"pub": {"ch", "off", "data"}}`.
    Pub { ch: Arc<str>, off: u64 },
    /// `{"id": n, "ok" | "error": ...}`: `error` the code of an error reply, `outcomes` what a
    /// subscribe's channels came to.
    Reply { id: u32, error: Option<u16>, outcomes: Option<Outcomes> },
    /// `{"subscribed": ...}`: subscriptions the node made for the client (the connect hook's).
    Subscribed(Outcomes),
    /// `{"unsubscribed": ...}`: the node ended a subscription; the client subscribes again.
    Unsubscribed,
    /// `{"join": ...}`.
    Join,
    /// `{"leave": ...}`.
    Leave,
    /// `{"disconnect": {"code", "reason"}}`.
    Disconnect { code: u16 },
    /// A message that did not come from this node's session (a moved poll session's stored
    /// replies), passed on as it is.
    Other,
}

impl Kind {
    /// A reply without an error or a subscribe's results.
    pub fn reply(id: u32) -> Kind {
        Kind::Reply { id, error: None, outcomes: None }
    }
}

/// One protocol message taken from an outbox: its JSON text (no trailing newline) and what it is.
#[derive(Debug, Clone)]
pub struct Message {
    pub text: Bytes,
    pub kind: Kind,
}

/// A publication in its wire form on `ch` (pushes, `last`, `recovered`, `history`): the one
/// place a broker's publication becomes what a client reads, its historical mark included.
pub fn pub_of<'a>(ch: &'a str, p: &'a Publication) -> Pub<'a> {
    Pub { ch, off: p.offset, data: Data(&p.data), hist: p.historical, tags: p.tags.as_deref() }
}
