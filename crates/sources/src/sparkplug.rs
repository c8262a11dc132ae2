//! Sparkplug B payloads of the MQTT source: the protobuf schema, the topic namespace and the
//! per-edge-node state that turns births, data and deaths into points.
//!
//! Topics are `spBv1.0/{group}/{NBIRTH|NDATA|NDEATH}/{edge}` for an edge node and
//! `spBv1.0/{group}/{DBIRTH|DDATA|DDEATH}/{edge}/{device}` for a device behind it. A birth
//! certificate lists every metric of its node or device with its name, alias, datatype and
//! first value; data messages may name a metric by alias only, resolved through the last birth
//! of that edge node (aliases are unique per edge node, devices included). A death says the
//! node (with all its devices) or the device is gone: every metric it had gets `q: "bad"`.
//!
//! Each metric becomes the point path `{group}/{edge}/{metric}` (node metrics) or
//! `{group}/{edge}/{device}/{metric}` (device metrics); the MQTT source puts that path into its
//! channel template as it does a plain topic, so `/` becomes `.`. In metric names `/` is kept
//! (so `Inputs/Temp` becomes `Inputs.Temp` in the channel), a space becomes `_`, and so does
//! every other character outside the channel alphabet.
//!
//! Sequence numbers: `seq` counts 0 to 255 and wraps, per edge node, over its `NBIRTH`,
//! `NDATA`, `DBIRTH`, `DDATA` and `DDEATH`; an `NBIRTH` starts the count again. A message whose
//! `seq` is not the one expected reports the gap: a message was lost (or came out of order), so
//! values may be missing.
//!
//! Sessions ([`death_session`]): an `NBIRTH` carries the metric `bdSeq`, and the `NDEATH` that
//! ends that session (the MQTT will the edge node registered with it, or the one it publishes
//! before a clean disconnect) carries the same number.
//! `bdSeq` counts 0 to 255 and wraps, one step per MQTT connection, so an `NDEATH`'s is read
//! against the current birth's modulo 256: the same number ends the session; one up to 127
//! ahead ends it too, and is reported ([`Decoded::death_ahead`]: an edge node that numbers its
//! death ahead of its birth, whose death must still never be missed); one behind (128 to 255
//! ahead) is the late will of an earlier session and is ignored ([`Decoded::stale_death`]). An
//! `NDEATH` without `bdSeq`, or after an `NBIRTH` without it, ends the current session.
//!
//! Values ([`value`]): each datatype is read from and written to the protobuf field and width
//! Sparkplug gives it; a Float is published in its shortest decimal form.
//!
//! Historical metrics (`is_historical`, an edge node's store-and-forward backlog) become points
//! with [`Point::historical`] set: kept in their channel's trend at their own time, never the
//! current value. They leave the metric's last value (what a null or a death carries) as it
//! was.
//!
//! Commands ([`command`]): a write to a metric becomes an `NCMD` (node metric) or `DCMD`
//! (device metric) naming the metric as its birth did, with the birth's datatype, only while
//! its edge node (and device) is born and alive; an edge node
//! whose birth was not seen (data or a device birth before any `NBIRTH`, an alias no birth
//! declared) or whose `seq` skipped is asked for a rebirth (`NCMD` `Node Control/Rebirth`), at
//! most once per edge node per [`command::REBIRTH_INTERVAL_MS`].
//!
//! Bounds ([`Bounds`]): the state kept for edge nodes, devices, metrics and aliases has a
//! ceiling each; past it a message of a new edge node or device, or a new metric or alias, is
//! refused and reported ([`Decoded::bounded`]), never asked to be born again (a new birth would
//! meet the same bound), while everything already known carries on.
//!
//! Not handled: `NCMD`/`DCMD`/`STATE` messages (ignored), waiting for a message that came out
//! of order, datasets, templates, bytes and files (such metrics are skipped and counted; they
//! take no writes).

pub mod command;
pub mod datatype;
pub mod proto;
mod state;
mod topic;
pub mod value;

use command::Command;
pub use state::{map_name, Sparkplug};
pub use topic::{parse_topic, DecodeError, Kind, Topic, NAMESPACE};

/// One value for a channel: `path` is `{group}/{edge}[/{device}]/{metric}` (see the module
/// doc), `device` true for a device metric, `good` false for a null metric or a dead node or
/// device, `historical` true for a metric flagged `is_historical` (a value from before the
/// channel's newest: for its trend, never its current value).
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub path: String,
    pub device: bool,
    pub v: serde_json::Value,
    pub t: u64,
    pub good: bool,
    pub historical: bool,
}

/// What one message gave.
#[derive(Debug, Default, PartialEq)]
pub struct Decoded {
    pub points: Vec<Point>,
    /// Metrics that could not be placed: an alias no birth declared, no name, or a value form
    /// a point cannot carry (dataset, template, bytes).
    pub skipped: usize,
    /// The `seq` expected and the one received, when they differ: messages of the edge node
    /// were lost (or came out of order).
    pub gap: Option<(u8, u8)>,
    /// A rebirth request to publish: the edge node's birth was not seen, an alias could not be
    /// resolved, or `seq` skipped (never more than one per edge node per
    /// [`command::REBIRTH_INTERVAL_MS`]).
    pub rebirth: Option<Command>,
    /// Refused because the state reached one of its [`Bounds`]: the whole message (a new edge
    /// node or device) or metrics of it (a new metric, a new alias, or data naming an alias
    /// refused so).
    pub bounded: usize,
    /// Which bound, and its value, when `bounded` is not 0.
    pub bound: Option<(&'static str, usize)>,
    /// An `NDEATH` ignored because it ends an earlier session: its `bdSeq` and the current
    /// session's.
    pub stale_death: Option<(u64, u64)>,
    /// An `NDEATH` that ended the current session though its `bdSeq` is ahead of the session's
    /// (the edge node does not number its death as its birth): its `bdSeq` and the session's.
    pub death_ahead: Option<(u64, u64)>,
}

impl Decoded {
    fn refuse(&mut self, what: &'static str, bound: usize) {
        self.bounded += 1;
        self.bound = Some((what, bound));
    }
}

/// Most edge nodes one source keeps state for.
pub const MAX_EDGE_NODES: usize = 4096;
/// Most devices, over all edge nodes, one source keeps state for.
pub const MAX_DEVICES: usize = 65_536;

/// How much state one source keeps: past a bound, messages of a new edge node or device, and
/// new metrics and aliases, are refused (reported in [`Decoded::bounded`]), while everything
/// already known carries on. An `NBIRTH` gives back what its edge node held, a `DBIRTH` what
/// its device held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub edge_nodes: usize,
    pub devices: usize,
    /// Metrics of edge nodes and devices together.
    pub metrics: usize,
    /// Aliases of all edge nodes together.
    pub aliases: usize,
}

impl Bounds {
    /// The bounds of a source that feeds at most `max_channels` channels: one metric, and one
    /// alias, per channel; [`MAX_EDGE_NODES`] and [`MAX_DEVICES`].
    pub fn new(max_channels: usize) -> Bounds {
        Bounds { edge_nodes: MAX_EDGE_NODES, devices: MAX_DEVICES, metrics: max_channels, aliases: max_channels }
    }
}

/// Which session an `NDEATH` ends, by its `bdSeq` against the current `NBIRTH`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeathSession {
    /// The same number: the current session's death, as Sparkplug 3.0 pairs them.
    Current,
    /// 1 to 127 ahead: a death numbered after the birth it ends (some edge nodes send their
    /// clean disconnect's `NDEATH` with the `bdSeq` of their next connection), or the death of
    /// a later session whose birth was not seen. The session held is over either way.
    Ahead,
    /// 128 to 255 ahead, that is 1 to 128 behind: the will of an earlier session, delivered
    /// after the edge node connected again and was born.
    Earlier,
}

/// The rule that pairs an `NDEATH` with a session: `bdSeq` counts 0 to 255 and wraps (255 is
/// followed by 0), so the two are compared modulo 256, the nearer way round deciding whether
/// the death is ahead or behind. Values above 255 are taken modulo 256 too.
pub fn death_session(death: u64, birth: u64) -> DeathSession {
    // 2^64 is a multiple of 256: the wrapped difference modulo 256 is the difference modulo 256.
    match death.wrapping_sub(birth) % 256 {
        0 => DeathSession::Current,
        1..=127 => DeathSession::Ahead,
        _ => DeathSession::Earlier,
    }
}

#[cfg(test)]
mod tests;
