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

use std::collections::HashMap;

use serde_json::Value;

use crate::WriteError;

pub mod command;
pub mod value;

use command::{Command, Rebirths};

/// The Sparkplug B protobuf schema (the parts a point needs), written after the public
/// specification's `sparkplug_b.proto` (proto2). Fields not declared here are skipped by the
/// decoder.
pub mod proto {
    /// One Sparkplug message body.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Payload {
        /// Unix milliseconds when the message was made.
        #[prost(uint64, optional, tag = "1")]
        pub timestamp: Option<u64>,
        #[prost(message, repeated, tag = "2")]
        pub metrics: Vec<Metric>,
        #[prost(uint64, optional, tag = "3")]
        pub seq: Option<u64>,
        #[prost(string, optional, tag = "4")]
        pub uuid: Option<String>,
        #[prost(bytes = "vec", optional, tag = "5")]
        pub body: Option<Vec<u8>>,
    }

    /// One metric: named in births, by name or alias in data messages.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Metric {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(uint64, optional, tag = "2")]
        pub alias: Option<u64>,
        #[prost(uint64, optional, tag = "3")]
        pub timestamp: Option<u64>,
        /// One of the [`super::datatype`] codes.
        #[prost(uint32, optional, tag = "4")]
        pub datatype: Option<u32>,
        #[prost(bool, optional, tag = "5")]
        pub is_historical: Option<bool>,
        #[prost(bool, optional, tag = "6")]
        pub is_transient: Option<bool>,
        #[prost(bool, optional, tag = "7")]
        pub is_null: Option<bool>,
        #[prost(oneof = "Value", tags = "10, 11, 12, 13, 14, 15, 16")]
        pub value: Option<Value>,
    }

    /// The value forms of a metric (datasets, templates and extensions, tags 17–19, are not
    /// declared: such metrics decode with no value).
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        /// Int8, Int16, Int32 (two's complement in their width), UInt8 and UInt16
        /// ([`super::value`]).
        #[prost(uint32, tag = "10")]
        IntValue(u32),
        /// Int64 (two's complement), UInt32, UInt64 and DateTime (unix ms).
        #[prost(uint64, tag = "11")]
        LongValue(u64),
        #[prost(float, tag = "12")]
        FloatValue(f32),
        #[prost(double, tag = "13")]
        DoubleValue(f64),
        #[prost(bool, tag = "14")]
        BooleanValue(bool),
        /// String, Text and UUID.
        #[prost(string, tag = "15")]
        StringValue(String),
        #[prost(bytes = "vec", tag = "16")]
        BytesValue(Vec<u8>),
    }
}

/// Sparkplug B datatype codes (the specification's `DataType` enum, scalar part).
pub mod datatype {
    pub const INT8: u32 = 1;
    pub const INT16: u32 = 2;
    pub const INT32: u32 = 3;
    pub const INT64: u32 = 4;
    pub const UINT8: u32 = 5;
    pub const UINT16: u32 = 6;
    pub const UINT32: u32 = 7;
    pub const UINT64: u32 = 8;
    pub const FLOAT: u32 = 9;
    pub const DOUBLE: u32 = 10;
    pub const BOOLEAN: u32 = 11;
    pub const STRING: u32 = 12;
    pub const DATETIME: u32 = 13;
    pub const TEXT: u32 = 14;
    pub const UUID: u32 = 15;
    pub const BYTES: u32 = 17;

    /// The specification's name of a datatype code, for messages.
    pub fn name(code: u32) -> &'static str {
        const NAMES: [&str; 20] = [
            "Unknown", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float", "Double",
            "Boolean", "String", "DateTime", "Text", "UUID", "DataSet", "Bytes", "File", "Template",
        ];
        NAMES.get(code as usize).copied().unwrap_or("Unknown")
    }
}

/// The first topic level of Sparkplug B.
pub const NAMESPACE: &str = "spBv1.0";

/// What a Sparkplug message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    NBirth,
    NData,
    NDeath,
    DBirth,
    DData,
    DDeath,
    /// Commands and host state: nothing for a gateway to publish.
    Other,
}

/// A Sparkplug topic's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic<'a> {
    pub group: &'a str,
    pub kind: Kind,
    pub edge: &'a str,
    pub device: Option<&'a str>,
}

/// The parts of a `spBv1.0/...` topic; `None` for any other topic. `Err` for a topic in the
/// Sparkplug namespace that does not have the form of one.
pub fn parse_topic(topic: &str) -> Option<Result<Topic<'_>, DecodeError>> {
    let rest = topic.strip_prefix(NAMESPACE)?.strip_prefix('/')?;
    let parts: Vec<&str> = rest.split('/').collect();
    let bad = || Some(Err(DecodeError::Topic(topic.to_string())));
    if parts.first() == Some(&"STATE") || parts.get(1).is_some_and(|k| k.ends_with("CMD")) {
        return Some(Ok(Topic { group: parts[0], kind: Kind::Other, edge: "", device: None }));
    }
    let kind = match parts.get(1) {
        Some(&"NBIRTH") => Kind::NBirth,
        Some(&"NDATA") => Kind::NData,
        Some(&"NDEATH") => Kind::NDeath,
        Some(&"DBIRTH") => Kind::DBirth,
        Some(&"DDATA") => Kind::DData,
        Some(&"DDEATH") => Kind::DDeath,
        _ => return bad(),
    };
    let device_kind = matches!(kind, Kind::DBirth | Kind::DData | Kind::DDeath);
    let want = if device_kind { 4 } else { 3 };
    if parts.len() != want || parts.iter().any(|p| p.is_empty()) {
        return bad();
    }
    Some(Ok(Topic { group: parts[0], kind, edge: parts[2], device: device_kind.then(|| parts[3]) }))
}

/// Why a Sparkplug message (or one of its metrics) could not be read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("not a Sparkplug B topic: {0}")]
    Topic(String),
    #[error("not a Sparkplug B payload: {0}")]
    Protobuf(String),
}

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

/// What the state holds, counted against its [`Bounds`] (edge nodes are the map's length).
#[derive(Debug, Default)]
struct Held {
    devices: usize,
    metrics: usize,
    aliases: usize,
}

impl Held {
    /// Gives back what `edge` holds (before it is replaced by a new session).
    fn release(&mut self, edge: &Edge) {
        let metrics = edge.node.metrics.len() + edge.devices.values().map(|d| d.metrics.len()).sum::<usize>();
        self.devices = self.devices.saturating_sub(edge.devices.len());
        self.metrics = self.metrics.saturating_sub(metrics);
        self.aliases = self.aliases.saturating_sub(edge.aliases.len());
    }
}

/// A metric as the last birth declared it (or as data showed it, without a birth).
#[derive(Debug, Clone)]
struct Known {
    datatype: u32,
    last: Value,
    /// The metric's name (as sent, not mapped) and alias in the birth; `None` for a metric only
    /// data showed.
    birth: Option<(String, Option<u64>)>,
}

/// A node's or a device's metrics by (mapped) name.
#[derive(Debug, Default)]
struct Scope {
    metrics: HashMap<String, Known>,
    /// A device after its `DDEATH` (until its next `DBIRTH`).
    dead: bool,
}

/// One edge node: its metric aliases (devices included) and metrics.
#[derive(Debug, Default)]
struct Edge {
    /// alias → (device, mapped metric name).
    aliases: HashMap<u64, (Option<String>, String)>,
    node: Scope,
    devices: HashMap<String, Scope>,
    /// Its `NBIRTH` was seen (and no `NDEATH` since).
    born: bool,
    /// The `bdSeq` of its last `NBIRTH`, when it had one: the session an `NDEATH` must name.
    bd_seq: Option<u64>,
    /// After its `NDEATH` (until its next `NBIRTH`).
    dead: bool,
    /// The `seq` its next message should have; `None` before the first message.
    next_seq: Option<u8>,
    /// A metric or alias of it was refused at a bound since its last `NBIRTH`: data naming an
    /// alias no birth could record is expected then, and asks for no rebirth.
    bounded: bool,
}

impl Edge {
    /// Checks a message's `seq` against the one expected (the last plus one, 255 wrapping to
    /// 0) and expects the one after it; an `NBIRTH` only sets the expectation. Returns the gap
    /// (expected, received), if any. A message without `seq`, or with one above 255, is not
    /// checked.
    fn check_seq(&mut self, birth: bool, seq: Option<u64>) -> Option<(u8, u8)> {
        let got = u8::try_from(seq?).ok()?;
        match self.next_seq.replace(got.wrapping_add(1)) {
            Some(want) if !birth && want != got => Some((want, got)),
            _ => None,
        }
    }
}

/// The state of every edge node seen on one MQTT connection. Owned by that connection's task.
#[derive(Debug)]
pub struct Sparkplug {
    edges: HashMap<(String, String), Edge>,
    /// Ask edge nodes for a rebirth when needed.
    rebirth: bool,
    rebirths: Rebirths,
    bounds: Bounds,
    held: Held,
}

impl Default for Sparkplug {
    fn default() -> Sparkplug {
        Sparkplug::new(true, Bounds::new(crate::DEFAULT_MAX_CHANNELS))
    }
}

/// A metric name as it appears in a channel: spaces and characters outside the channel
/// alphabet become `_`, `/` is kept (the channel template turns it into `.`).
pub fn map_name(name: &str) -> String {
    name.chars()
        .map(
            |c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '/' | '@' | '=' | '-') { c } else { '_' },
        )
        .collect()
}

impl Sparkplug {
    /// The state of a source that has seen nothing yet, kept within `bounds`; `rebirth` false:
    /// edge nodes are never asked for a rebirth.
    pub fn new(rebirth: bool, bounds: Bounds) -> Sparkplug {
        Sparkplug { edges: HashMap::new(), rebirth, rebirths: Rebirths::default(), bounds, held: Held::default() }
    }

    /// Reads one message of `topic`; `now_ms` stands for missing timestamps.
    pub fn handle(&mut self, topic: &Topic<'_>, payload: &[u8], now_ms: u64) -> Result<Decoded, DecodeError> {
        let mut out = Decoded::default();
        if topic.kind == Kind::Other {
            return Ok(out);
        }
        let key = (topic.group.to_string(), topic.edge.to_string());
        let base = format!("{}/{}", topic.group, topic.edge);
        match topic.kind {
            Kind::NDeath => {
                // The payload carries only the bdSeq of the session it ends; an unreadable one
                // is still a death. The next NBIRTH starts the seq count again.
                let Some(edge) = self.edges.get_mut(&key) else { return Ok(out) };
                let ended = <proto::Payload as prost::Message>::decode(payload).ok().and_then(|p| bd_seq(&p));
                if let (Some(ended), Some(current)) = (ended, edge.bd_seq) {
                    match death_session(ended, current) {
                        DeathSession::Current => {}
                        DeathSession::Ahead => out.death_ahead = Some((ended, current)),
                        DeathSession::Earlier => {
                            out.stale_death = Some((ended, current));
                            return Ok(out);
                        }
                    }
                }
                (edge.born, edge.dead, edge.next_seq) = (false, true, None);
                out.points = dead(&base, None, &edge.node, now_ms);
                for (device, scope) in &edge.devices {
                    out.points.extend(dead(&base, Some(device), scope, now_ms));
                }
                return Ok(out);
            }
            Kind::DDeath => {
                let device = topic.device.unwrap_or_default();
                let Some(edge) = self.edges.get_mut(&key) else { return Ok(out) };
                // Only its seq is read: an unreadable payload is still a death.
                let seq = <proto::Payload as prost::Message>::decode(payload).ok().and_then(|p| p.seq);
                out.gap = edge.check_seq(false, seq);
                if let Some(scope) = edge.devices.get_mut(device) {
                    scope.dead = true;
                    out.points = dead(&base, Some(device), scope, now_ms);
                }
                if out.gap.is_some() {
                    self.ask_rebirth(topic, &mut out, now_ms);
                }
                return Ok(out);
            }
            _ => {}
        }
        let payload =
            <proto::Payload as prost::Message>::decode(payload).map_err(|e| DecodeError::Protobuf(e.to_string()))?;
        let at = payload.timestamp.unwrap_or(now_ms);
        let bounds = self.bounds;
        if !self.edges.contains_key(&key) && self.edges.len() >= bounds.edge_nodes {
            out.refuse("edge nodes", bounds.edge_nodes);
            return Ok(out);
        }
        let edge = self.edges.entry(key).or_default();
        let held = &mut self.held;
        let birth = matches!(topic.kind, Kind::NBirth | Kind::DBirth);
        if topic.kind == Kind::NBirth {
            // A new session of the node: its devices will be born again too.
            held.release(edge);
            *edge = Edge { born: true, bd_seq: bd_seq(&payload), ..Edge::default() };
        }
        out.gap = edge.check_seq(topic.kind == Kind::NBirth, payload.seq);
        if let Some(device) = topic.device {
            match edge.devices.get_mut(device) {
                Some(scope) if topic.kind == Kind::DBirth => {
                    held.metrics = held.metrics.saturating_sub(scope.metrics.len());
                    *scope = Scope::default();
                }
                Some(_) => {}
                None if held.devices >= bounds.devices => {
                    out.refuse("devices", bounds.devices);
                    return Ok(out);
                }
                None => {
                    held.devices += 1;
                    edge.devices.insert(device.to_string(), Scope::default());
                }
            }
            if topic.kind == Kind::DBirth {
                let before = edge.aliases.len();
                edge.aliases.retain(|_, (d, _)| d.as_deref() != Some(device));
                held.aliases = held.aliases.saturating_sub(before - edge.aliases.len());
            }
        }
        // Data (or a device birth) from an edge node whose birth was not seen: its aliases and
        // datatypes are unknown, and it takes no commands until it is born again.
        let mut rebirth = out.gap.is_some() || !edge.born;
        for m in payload.metrics {
            // Which metric: by name when given, else by the alias of the last birth.
            let name = match (&m.name, m.alias) {
                (Some(name), _) => map_name(name),
                (None, Some(alias)) => match edge.aliases.get(&alias) {
                    Some((_, name)) => name.clone(),
                    None if edge.bounded => {
                        out.refuse("aliases", bounds.aliases);
                        continue;
                    }
                    None => {
                        out.skipped += 1;
                        rebirth = true;
                        continue;
                    }
                },
                (None, None) => {
                    out.skipped += 1;
                    continue;
                }
            };
            let scope = match topic.device {
                // Present: a device's scope is made (or the message refused) above.
                Some(device) => match edge.devices.get_mut(device) {
                    Some(scope) => scope,
                    None => continue,
                },
                None => &mut edge.node,
            };
            if !scope.metrics.contains_key(&name) {
                if held.metrics >= bounds.metrics {
                    out.refuse("metrics", bounds.metrics);
                    edge.bounded = true;
                    continue;
                }
                held.metrics += 1;
            }
            if birth {
                if let Some(alias) = m.alias {
                    if edge.aliases.contains_key(&alias) || held.aliases < bounds.aliases {
                        let owner = (topic.device.map(str::to_string), name.clone());
                        if edge.aliases.insert(alias, owner).is_none() {
                            held.aliases += 1;
                        }
                    } else {
                        // The metric is kept (data naming it works); data naming the alias is
                        // refused.
                        out.refuse("aliases", bounds.aliases);
                        edge.bounded = true;
                    }
                }
                let datatype = m.datatype.unwrap_or(0);
                let named = m.name.clone().map(|n| (n, m.alias));
                scope.metrics.insert(name.clone(), Known { datatype, last: Value::Null, birth: named });
            }
            let known = scope.metrics.entry(name.clone()).or_insert(Known {
                datatype: m.datatype.unwrap_or(0),
                last: Value::Null,
                birth: None,
            });
            let t = m.timestamp.unwrap_or(at);
            let path = match topic.device {
                Some(device) => format!("{base}/{device}/{name}"),
                None => format!("{base}/{name}"),
            };
            let device = topic.device.is_some();
            let historical = m.is_historical == Some(true);
            if m.is_null == Some(true) {
                out.points.push(Point { path, device, v: known.last.clone(), t, good: false, historical });
                continue;
            }
            let datatype = m.datatype.unwrap_or(known.datatype);
            match m.value.as_ref().and_then(|v| value::read(v, datatype)) {
                Some(v) => {
                    if !historical {
                        known.last = v.clone();
                    }
                    out.points.push(Point { path, device, v, t, good: true, historical });
                }
                None => out.skipped += 1,
            }
        }
        if rebirth {
            self.ask_rebirth(topic, &mut out, now_ms);
        }
        Ok(out)
    }

    /// Puts a rebirth request to the topic's edge node into `out`, unless rebirths are off or
    /// one went to that edge node within the interval.
    fn ask_rebirth(&mut self, topic: &Topic<'_>, out: &mut Decoded, now_ms: u64) {
        if self.rebirth && self.rebirths.allow(topic.group, topic.edge, now_ms) {
            out.rebirth = Some(command::rebirth(topic.group, topic.edge, now_ms));
        }
    }

    /// The command that writes `value` to the metric behind a point's `path` (`device` as the
    /// point's): an `NCMD` or `DCMD` naming the metric as its birth did (name, and alias when
    /// the birth gave one), with the birth's datatype and `value` converted to it.
    /// `Unavailable` while the edge node or device is dead or its birth was not seen;
    /// `NotWritable` for a value that does not convert (the message names the datatype) or a
    /// datatype that takes no writes.
    pub fn command(&self, path: &str, device: bool, value: &Value, now_ms: u64) -> Result<Command, WriteError> {
        let n = if device { 4 } else { 3 };
        let parts: Vec<&str> = path.splitn(n, '/').collect();
        let not_ours = || WriteError::NotWritable(format!("{path} is not a Sparkplug B metric"));
        let [group, edge_name, rest @ ..] = parts.as_slice() else { return Err(not_ours()) };
        let (dev, name) = match rest {
            [name] if !device => (None, *name),
            [dev, name] if device => (Some(*dev), *name),
            _ => return Err(not_ours()),
        };
        let who = match dev {
            Some(d) => format!("device {group}/{edge_name}/{d}"),
            None => format!("edge node {group}/{edge_name}"),
        };
        let unborn = || {
            WriteError::Unavailable(format!(
                "no birth of metric {name} of {who} seen; it takes commands once its edge node is born again (a \
                 rebirth is requested when its data arrives)"
            ))
        };
        let edge = self.edges.get(&(group.to_string(), edge_name.to_string())).ok_or_else(unborn)?;
        if edge.dead {
            return Err(WriteError::Unavailable(format!(
                "edge node {group}/{edge_name} is offline (NDEATH); it takes commands again after its next birth"
            )));
        }
        if !edge.born {
            return Err(unborn());
        }
        let scope = match dev {
            Some(d) => edge.devices.get(d).ok_or_else(unborn)?,
            None => &edge.node,
        };
        if scope.dead {
            return Err(WriteError::Unavailable(format!(
                "{who} is offline (DDEATH); it takes commands again after its next birth"
            )));
        }
        let known = scope.metrics.get(name).ok_or_else(unborn)?;
        let Some((birth_name, alias)) = &known.birth else { return Err(unborn()) };
        let v = value::write(value, known.datatype)
            .map_err(|e| WriteError::NotWritable(format!("{e} (Sparkplug metric {birth_name} of {who})")))?;
        Ok(Command {
            topic: command::topic(group, edge_name, dev),
            payload: command::payload(birth_name, *alias, known.datatype, v, now_ms),
        })
    }
}

/// `q: "bad"` for every metric of a dead node or device, with its last value.
fn dead(base: &str, device: Option<&str>, scope: &Scope, now_ms: u64) -> Vec<Point> {
    let prefix = match device {
        Some(d) => format!("{base}/{d}/"),
        None => format!("{base}/"),
    };
    let mut points: Vec<Point> = scope
        .metrics
        .iter()
        .map(|(name, k)| Point {
            path: format!("{prefix}{name}"),
            device: device.is_some(),
            v: k.last.clone(),
            t: now_ms,
            good: false,
            historical: false,
        })
        .collect();
    points.sort_by(|a, b| a.path.cmp(&b.path));
    points
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

/// The `bdSeq` metric's value in a payload (an `NBIRTH`, or the `NDEATH` of its session).
fn bd_seq(payload: &proto::Payload) -> Option<u64> {
    payload
        .metrics
        .iter()
        .find(|m| m.name.as_deref() == Some("bdSeq"))
        .and_then(|m| m.value.as_ref())
        .and_then(value::read_unsigned)
}

#[cfg(test)]
mod tests;
