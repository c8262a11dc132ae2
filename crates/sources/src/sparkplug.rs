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
//! Not handled: `NCMD`/`DCMD`/`STATE` messages (ignored), sequence-number checks, datasets,
//! templates, bytes and files (such metrics are skipped and counted).

use std::collections::HashMap;

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
        /// Int8, Int16, Int32 (two's complement) and UInt8, UInt16, UInt32.
        #[prost(uint32, tag = "10")]
        IntValue(u32),
        /// Int64 (two's complement), UInt64 and DateTime (unix ms).
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

/// Sparkplug B datatype codes used to read integer values.
pub mod datatype {
    pub const INT8: u32 = 1;
    pub const INT16: u32 = 2;
    pub const INT32: u32 = 3;
    pub const INT64: u32 = 4;
    pub const UINT64: u32 = 8;
    pub const DOUBLE: u32 = 10;
    pub const BOOLEAN: u32 = 11;
    pub const STRING: u32 = 12;
    pub const DATETIME: u32 = 13;
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
/// doc), `good` false for a null metric or a dead node or device.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub path: String,
    pub v: serde_json::Value,
    pub t: u64,
    pub good: bool,
}

/// What one message gave.
#[derive(Debug, Default, PartialEq)]
pub struct Decoded {
    pub points: Vec<Point>,
    /// Metrics that could not be placed: an alias no birth declared, no name, or a value form
    /// a point cannot carry (dataset, template, bytes).
    pub skipped: usize,
}

/// A metric as the last birth declared it.
#[derive(Debug, Clone)]
struct Known {
    datatype: u32,
    last: serde_json::Value,
}

/// A node's or a device's metrics by (mapped) name.
#[derive(Debug, Default)]
struct Scope {
    metrics: HashMap<String, Known>,
}

/// One edge node: its metric aliases (devices included) and metrics.
#[derive(Debug, Default)]
struct Edge {
    /// alias → (device, mapped metric name).
    aliases: HashMap<u64, (Option<String>, String)>,
    node: Scope,
    devices: HashMap<String, Scope>,
}

/// The state of every edge node seen on one MQTT connection. Owned by that connection's task.
#[derive(Debug, Default)]
pub struct Sparkplug {
    edges: HashMap<(String, String), Edge>,
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
    /// Reads one message of `topic`; `now_ms` stands for missing timestamps.
    pub fn handle(&mut self, topic: &Topic<'_>, payload: &[u8], now_ms: u64) -> Result<Decoded, DecodeError> {
        if topic.kind == Kind::Other {
            return Ok(Decoded::default());
        }
        let key = (topic.group.to_string(), topic.edge.to_string());
        let base = format!("{}/{}", topic.group, topic.edge);
        match topic.kind {
            Kind::NDeath => {
                // The payload carries only the bdSeq; a death needs nothing from it.
                let Some(edge) = self.edges.get(&key) else { return Ok(Decoded::default()) };
                let mut points = dead(&base, None, &edge.node, now_ms);
                for (device, scope) in &edge.devices {
                    points.extend(dead(&base, Some(device), scope, now_ms));
                }
                return Ok(Decoded { points, skipped: 0 });
            }
            Kind::DDeath => {
                let device = topic.device.unwrap_or_default();
                let scope = self.edges.get(&key).and_then(|e| e.devices.get(device));
                let points = scope.map(|s| dead(&base, Some(device), s, now_ms)).unwrap_or_default();
                return Ok(Decoded { points, skipped: 0 });
            }
            _ => {}
        }
        let payload =
            <proto::Payload as prost::Message>::decode(payload).map_err(|e| DecodeError::Protobuf(e.to_string()))?;
        let at = payload.timestamp.unwrap_or(now_ms);
        let edge = self.edges.entry(key).or_default();
        let birth = matches!(topic.kind, Kind::NBirth | Kind::DBirth);
        match (topic.kind, topic.device) {
            // A new session of the node: its devices will be born again too.
            (Kind::NBirth, _) => *edge = Edge::default(),
            (Kind::DBirth, Some(device)) => {
                edge.aliases.retain(|_, (d, _)| d.as_deref() != Some(device));
                edge.devices.insert(device.to_string(), Scope::default());
            }
            _ => {}
        }
        let mut out = Decoded::default();
        for m in payload.metrics {
            // Which metric: by name when given, else by the alias of the last birth.
            let name = match (&m.name, m.alias) {
                (Some(name), _) => map_name(name),
                (None, Some(alias)) => match edge.aliases.get(&alias) {
                    Some((_, name)) => name.clone(),
                    None => {
                        out.skipped += 1;
                        continue;
                    }
                },
                (None, None) => {
                    out.skipped += 1;
                    continue;
                }
            };
            let scope = match topic.device {
                Some(device) => edge.devices.entry(device.to_string()).or_default(),
                None => &mut edge.node,
            };
            if birth {
                if let Some(alias) = m.alias {
                    edge.aliases.insert(alias, (topic.device.map(str::to_string), name.clone()));
                }
                let datatype = m.datatype.unwrap_or(0);
                scope.metrics.insert(name.clone(), Known { datatype, last: serde_json::Value::Null });
            }
            let known = scope
                .metrics
                .entry(name.clone())
                .or_insert(Known { datatype: m.datatype.unwrap_or(0), last: serde_json::Value::Null });
            let t = m.timestamp.unwrap_or(at);
            let path = match topic.device {
                Some(device) => format!("{base}/{device}/{name}"),
                None => format!("{base}/{name}"),
            };
            if m.is_null == Some(true) {
                out.points.push(Point { path, v: known.last.clone(), t, good: false });
                continue;
            }
            let datatype = m.datatype.unwrap_or(known.datatype);
            match m.value.as_ref().and_then(|v| json_of(v, datatype)) {
                Some(v) => {
                    known.last = v.clone();
                    out.points.push(Point { path, v, t, good: true });
                }
                None => out.skipped += 1,
            }
        }
        Ok(out)
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
        .map(|(name, k)| Point { path: format!("{prefix}{name}"), v: k.last.clone(), t: now_ms, good: false })
        .collect();
    points.sort_by(|a, b| a.path.cmp(&b.path));
    points
}

/// A metric value as JSON; `None` for forms a point cannot carry (bytes, non-finite floats).
fn json_of(v: &proto::Value, datatype: u32) -> Option<serde_json::Value> {
    use proto::Value::*;
    Some(match *v {
        IntValue(i) => match datatype {
            datatype::INT8 => (i as u8 as i8).into(),
            datatype::INT16 => (i as u16 as i16).into(),
            datatype::INT32 => (i as i32).into(),
            _ => i.into(),
        },
        LongValue(l) => match datatype {
            datatype::INT64 => (l as i64).into(),
            _ => l.into(),
        },
        FloatValue(f) => serde_json::Number::from_f64(f as f64)?.into(),
        DoubleValue(d) => serde_json::Number::from_f64(d)?.into(),
        BooleanValue(b) => b.into(),
        StringValue(ref s) => s.clone().into(),
        BytesValue(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::proto::{Metric, Payload, Value as mv};
    use super::*;
    use prost::Message;

    fn metric(name: Option<&str>, alias: Option<u64>, datatype: u32, value: Option<proto::Value>) -> Metric {
        Metric { name: name.map(str::to_string), alias, datatype: Some(datatype), value, ..Default::default() }
    }

    fn encode(ts: u64, metrics: Vec<Metric>) -> Vec<u8> {
        Payload { timestamp: Some(ts), metrics, seq: Some(0), ..Default::default() }.encode_to_vec()
    }

    fn run(sp: &mut Sparkplug, topic: &str, payload: &[u8]) -> Decoded {
        let t = parse_topic(topic).expect("sparkplug topic").expect("valid topic");
        sp.handle(&t, payload, 999).expect("decodes")
    }

    #[test]
    fn sparkplug_topics_are_parsed_and_others_left_alone() {
        assert_eq!(parse_topic("plant/line1"), None);
        let t = parse_topic("spBv1.0/G1/DDATA/E1/D1").unwrap().unwrap();
        assert_eq!((t.group, t.kind, t.edge, t.device), ("G1", Kind::DData, "E1", Some("D1")));
        let t = parse_topic("spBv1.0/G1/NBIRTH/E1").unwrap().unwrap();
        assert_eq!((t.kind, t.device), (Kind::NBirth, None));
        assert_eq!(parse_topic("spBv1.0/G1/NCMD/E1").unwrap().unwrap().kind, Kind::Other);
        assert_eq!(parse_topic("spBv1.0/STATE/host").unwrap().unwrap().kind, Kind::Other);
        assert!(parse_topic("spBv1.0/G1/NDATA/E1/extra").unwrap().is_err());
        assert!(parse_topic("spBv1.0/G1/DDATA/E1").unwrap().is_err());
        assert!(parse_topic("spBv1.0/G1/BOGUS/E1").unwrap().is_err());
    }

    #[test]
    fn sparkplug_birth_names_aliases_that_data_resolves() {
        let mut sp = Sparkplug::default();
        let birth = encode(
            1000,
            vec![
                metric(Some("Inputs/Temp 1"), Some(1), datatype::DOUBLE, Some(mv::DoubleValue(20.5))),
                metric(Some("Run"), Some(2), datatype::BOOLEAN, Some(mv::BooleanValue(true))),
                metric(Some("Offset"), Some(3), datatype::INT16, Some(mv::IntValue(0xffff_fffe))),
            ],
        );
        let d = run(&mut sp, "spBv1.0/G1/NBIRTH/E1", &birth);
        let got: Vec<(&str, serde_json::Value, bool)> =
            d.points.iter().map(|p| (p.path.as_str(), p.v.clone(), p.good)).collect();
        assert_eq!(
            got,
            vec![
                ("G1/E1/Inputs/Temp_1", 20.5.into(), true),
                ("G1/E1/Run", true.into(), true),
                ("G1/E1/Offset", (-2).into(), true),
            ]
        );
        assert_eq!(d.points[0].t, 1000, "the payload's timestamp");
        let mut by_alias = metric(None, Some(1), 0, Some(mv::DoubleValue(21.0)));
        by_alias.datatype = None;
        by_alias.timestamp = Some(2000);
        let d = run(&mut sp, "spBv1.0/G1/NDATA/E1", &encode(1500, vec![by_alias]));
        assert_eq!(d.points, vec![Point { path: "G1/E1/Inputs/Temp_1".into(), v: 21.0.into(), t: 2000, good: true }]);
        // An alias no birth declared is skipped and counted, never a crash.
        let d = run(&mut sp, "spBv1.0/G1/NDATA/E1", &encode(1500, vec![metric(None, Some(77), 0, None)]));
        assert_eq!((d.points.len(), d.skipped), (0, 1));
    }

    #[test]
    fn sparkplug_null_and_death_mark_every_metric_bad() {
        let mut sp = Sparkplug::default();
        run(
            &mut sp,
            "spBv1.0/G/NBIRTH/E",
            &encode(1, vec![metric(Some("a"), Some(1), datatype::INT64, Some(mv::LongValue(u64::MAX)))]),
        );
        let d = run(
            &mut sp,
            "spBv1.0/G/DBIRTH/E/D",
            &encode(1, vec![metric(Some("s"), Some(2), datatype::STRING, Some(mv::StringValue("on".into())))]),
        );
        assert_eq!(d.points[0].path, "G/E/D/s");
        let mut null = metric(None, Some(2), 0, None);
        null.is_null = Some(true);
        let d = run(&mut sp, "spBv1.0/G/DDATA/E/D", &encode(5, vec![null]));
        assert_eq!(d.points, vec![Point { path: "G/E/D/s".into(), v: "on".into(), t: 5, good: false }]);
        let d = run(&mut sp, "spBv1.0/G/DDEATH/E/D", &encode(6, vec![]));
        assert_eq!(d.points.iter().map(|p| (p.path.as_str(), p.good)).collect::<Vec<_>>(), vec![("G/E/D/s", false)]);
        let d = run(&mut sp, "spBv1.0/G/NDEATH/E", &[]);
        let got: Vec<(&str, serde_json::Value, bool)> =
            d.points.iter().map(|p| (p.path.as_str(), p.v.clone(), p.good)).collect();
        assert_eq!(got, vec![("G/E/a", (-1).into(), false), ("G/E/D/s", "on".into(), false)]);
    }

    #[test]
    fn sparkplug_garbage_is_an_error_and_unsupported_values_are_skipped() {
        let mut sp = Sparkplug::default();
        let t = parse_topic("spBv1.0/G/NDATA/E").unwrap().unwrap();
        assert!(matches!(sp.handle(&t, &[0xff, 0xff, 0xff], 1), Err(DecodeError::Protobuf(_))));
        let bytes = metric(Some("blob"), None, 17, Some(mv::BytesValue(vec![1, 2])));
        let nan = metric(Some("nan"), None, 9, Some(mv::FloatValue(f32::NAN)));
        let d = run(&mut sp, "spBv1.0/G/NDATA/E", &encode(1, vec![bytes, nan]));
        assert_eq!((d.points.len(), d.skipped), (0, 2));
        assert_eq!(map_name("Motor 1/Speed (rpm)"), "Motor_1/Speed__rpm_");
    }
}
