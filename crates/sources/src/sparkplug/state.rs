//! The per-edge-node state of one MQTT connection ([`Sparkplug`]): births, data and deaths
//! turned into points within its [`Bounds`], rebirths asked for, and writes to a metric turned
//! into the command its birth allows.

use std::collections::HashMap;

use serde_json::Value;

use super::command::{self, Command, Rebirths};
use super::topic::{DecodeError, Kind, Topic};
use super::{death_session, proto, value, Bounds, DeathSession, Decoded, Point};
use crate::WriteError;

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

/// The `bdSeq` metric's value in a payload (an `NBIRTH`, or the `NDEATH` of its session).
fn bd_seq(payload: &proto::Payload) -> Option<u64> {
    payload
        .metrics
        .iter()
        .find(|m| m.name.as_deref() == Some("bdSeq"))
        .and_then(|m| m.value.as_ref())
        .and_then(value::read_unsigned)
}
