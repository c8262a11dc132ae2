//! Sparkplug B commands the MQTT source sends: a write to a metric (`NCMD`/`DCMD` with the
//! value converted to the metric's datatype) and a rebirth request (`NCMD`
//! `Node Control/Rebirth`), with the rate limit that keeps rebirth requests to one per edge node
//! per [`REBIRTH_INTERVAL_MS`].

use std::collections::HashMap;

use serde_json::Value;

use super::proto::{self, Metric, Payload};
use super::{datatype, NAMESPACE};

/// The metric that asks an edge node to publish its births again.
pub const REBIRTH_METRIC: &str = "Node Control/Rebirth";
/// Least time between two rebirth requests to one edge node.
pub const REBIRTH_INTERVAL_MS: u64 = 5000;
/// Most edge nodes whose last rebirth request is remembered.
pub const REBIRTH_EDGES_MAX: usize = 4096;

/// One MQTT publish to make: a command's topic and its Sparkplug B payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub topic: String,
    pub payload: Vec<u8>,
}

/// The topic of a command to an edge node (`NCMD`) or to one of its devices (`DCMD`).
pub fn topic(group: &str, edge: &str, device: Option<&str>) -> String {
    match device {
        Some(device) => format!("{NAMESPACE}/{group}/DCMD/{edge}/{device}"),
        None => format!("{NAMESPACE}/{group}/NCMD/{edge}"),
    }
}

/// A command payload of one metric: its timestamp and the payload's are `now_ms`; no `seq`
/// (commands carry none).
pub fn payload(name: &str, alias: Option<u64>, datatype: u32, value: proto::Value, now_ms: u64) -> Vec<u8> {
    let metric = Metric {
        name: Some(name.to_string()),
        alias,
        timestamp: Some(now_ms),
        datatype: Some(datatype),
        value: Some(value),
        ..Default::default()
    };
    let payload = Payload { timestamp: Some(now_ms), metrics: vec![metric], ..Default::default() };
    prost::Message::encode_to_vec(&payload)
}

/// The rebirth request to an edge node: `NCMD` with `Node Control/Rebirth` = true.
pub fn rebirth(group: &str, edge: &str, now_ms: u64) -> Command {
    Command {
        topic: topic(group, edge, None),
        payload: payload(REBIRTH_METRIC, None, datatype::BOOLEAN, proto::Value::BooleanValue(true), now_ms),
    }
}

/// Converts a JSON value to a metric value of `datatype`: a whole number in range for the
/// integer types (300 is not a UInt8), unix milliseconds for DateTime, a number for Float
/// (in range) and Double, `true`/`false` (or 0/1) for Boolean, a string for String, Text and
/// UUID. The error names the datatype.
pub fn to_value(value: &Value, dt: u32) -> Result<proto::Value, String> {
    use proto::Value::*;
    let wrong = || format!("{value} is not a valid {}", datatype::name(dt));
    use crate::whole_number as int;
    // Signed 8/16/32-bit values go in `int_value` as their 32-bit two's complement.
    let int32 = |i: i32| IntValue(i as u32);
    Ok(match dt {
        datatype::INT8 => int32(int::<i8>(value).ok_or_else(wrong)?.into()),
        datatype::INT16 => int32(int::<i16>(value).ok_or_else(wrong)?.into()),
        datatype::INT32 => int32(int::<i32>(value).ok_or_else(wrong)?),
        datatype::UINT8 => IntValue(int::<u8>(value).ok_or_else(wrong)?.into()),
        datatype::UINT16 => IntValue(int::<u16>(value).ok_or_else(wrong)?.into()),
        datatype::UINT32 => IntValue(int::<u32>(value).ok_or_else(wrong)?),
        datatype::INT64 => LongValue(int::<i64>(value).ok_or_else(wrong)? as u64),
        datatype::UINT64 | datatype::DATETIME => LongValue(int::<u64>(value).ok_or_else(wrong)?),
        datatype::FLOAT => {
            let f = value.as_f64().ok_or_else(wrong)?;
            if f.abs() > f64::from(f32::MAX) {
                return Err(wrong());
            }
            FloatValue(f as f32)
        }
        datatype::DOUBLE => DoubleValue(value.as_f64().ok_or_else(wrong)?),
        datatype::BOOLEAN => match value {
            Value::Bool(b) => BooleanValue(*b),
            Value::Number(_) if value.as_f64() == Some(0.0) => BooleanValue(false),
            Value::Number(_) if value.as_f64() == Some(1.0) => BooleanValue(true),
            _ => return Err(wrong()),
        },
        datatype::STRING | datatype::TEXT | datatype::UUID => StringValue(value.as_str().ok_or_else(wrong)?.into()),
        other => return Err(format!("writing Sparkplug {} metrics is not supported", datatype::name(other))),
    })
}

/// When each edge node was last asked for a rebirth, so that it is asked at most once per
/// [`REBIRTH_INTERVAL_MS`] however many messages without a birth it sends. Bounded: at most
/// [`REBIRTH_EDGES_MAX`] edge nodes; when full, entries older than the interval are dropped,
/// and while every entry is recent, requests to further edge nodes are left out.
#[derive(Debug, Default)]
pub struct Rebirths {
    /// `{group}/{edge}` → unix ms of the last request (neither part contains `/`).
    last: HashMap<String, u64>,
}

impl Rebirths {
    /// Whether a rebirth request to `group`/`edge` may go out at `now_ms`; if so, it counts
    /// as sent.
    pub fn allow(&mut self, group: &str, edge: &str, now_ms: u64) -> bool {
        // A clock that went back counts as long ago, so a jump back never silences an edge node.
        let recent = |at: u64| now_ms >= at && now_ms - at < REBIRTH_INTERVAL_MS;
        let key = format!("{group}/{edge}");
        if let Some(at) = self.last.get_mut(&key) {
            if recent(*at) {
                return false;
            }
            *at = now_ms;
            return true;
        }
        if self.last.len() >= REBIRTH_EDGES_MAX {
            self.last.retain(|_, at| recent(*at));
            if self.last.len() >= REBIRTH_EDGES_MAX {
                return false;
            }
        }
        self.last.insert(key, now_ms);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write_value;
    use prost::Message;
    use serde_json::json;

    #[test]
    fn sparkplug_command_payload_carries_name_alias_datatype_and_value() {
        let bytes =
            payload("Outputs/Speed", Some(7), datatype::INT32, to_value(&json!(-5), datatype::INT32).unwrap(), 42);
        let p = Payload::decode(bytes.as_slice()).expect("decodes");
        assert_eq!((p.timestamp, p.seq, p.metrics.len()), (Some(42), None, 1));
        let m = &p.metrics[0];
        assert_eq!(m.name.as_deref(), Some("Outputs/Speed"));
        assert_eq!((m.alias, m.datatype, m.timestamp), (Some(7), Some(datatype::INT32), Some(42)));
        assert_eq!(m.value, Some(proto::Value::IntValue(0xffff_fffb)));
        let r = rebirth("G", "E", 9);
        assert_eq!(r.topic, "spBv1.0/G/NCMD/E");
        let p = Payload::decode(r.payload.as_slice()).expect("decodes");
        assert_eq!(p.metrics[0].name.as_deref(), Some(REBIRTH_METRIC));
        assert_eq!(p.metrics[0].datatype, Some(datatype::BOOLEAN));
        assert_eq!(p.metrics[0].value, Some(proto::Value::BooleanValue(true)));
        assert_eq!(topic("G", "E", Some("D")), "spBv1.0/G/DCMD/E/D");
    }

    #[test]
    fn sparkplug_command_values_convert_to_the_datatype_or_name_it() {
        use proto::Value::*;
        let ok = |v: Value, dt: u32| to_value(&v, dt).unwrap();
        assert_eq!(ok(json!(-1), datatype::INT8), IntValue(u32::MAX));
        assert_eq!(ok(json!(300.0), datatype::INT16), IntValue(300));
        assert_eq!(ok(json!(255), datatype::UINT8), IntValue(255));
        assert_eq!(ok(json!(4294967295u64), datatype::UINT32), IntValue(u32::MAX));
        assert_eq!(ok(json!(-2), datatype::INT64), LongValue(u64::MAX - 1));
        assert_eq!(ok(json!(u64::MAX), datatype::UINT64), LongValue(u64::MAX));
        assert_eq!(ok(json!(1700000000000u64), datatype::DATETIME), LongValue(1700000000000));
        assert_eq!(ok(json!(1.5), datatype::FLOAT), FloatValue(1.5));
        assert_eq!(ok(json!(3), datatype::DOUBLE), DoubleValue(3.0));
        assert_eq!(ok(json!(true), datatype::BOOLEAN), BooleanValue(true));
        assert_eq!(ok(json!(0), datatype::BOOLEAN), BooleanValue(false));
        assert_eq!(ok(json!("on"), datatype::TEXT), StringValue("on".into()));
        let err = |v: Value, dt: u32| to_value(&v, dt).unwrap_err();
        assert_eq!(err(json!("abc"), datatype::INT32), r#""abc" is not a valid Int32"#);
        assert_eq!(err(json!(256), datatype::UINT8), "256 is not a valid UInt8");
        assert_eq!(err(json!(-1), datatype::UINT64), "-1 is not a valid UInt64");
        assert_eq!(err(json!(12.5), datatype::INT32), "12.5 is not a valid Int32");
        assert_eq!(err(json!(1e39), datatype::FLOAT), "1e+39 is not a valid Float");
        assert_eq!(err(json!("true"), datatype::BOOLEAN), r#""true" is not a valid Boolean"#);
        assert_eq!(err(json!(5), datatype::STRING), "5 is not a valid String");
        assert_eq!(err(json!("AA=="), datatype::BYTES), "writing Sparkplug Bytes metrics is not supported");
        assert_eq!(write_value(r#"{"v":42,"t":1}"#), Ok(json!(42)));
        assert_eq!(write_value("\"x\""), Ok(json!("x")));
        assert!(write_value("{").is_err());
    }

    #[test]
    fn sparkplug_rebirth_requests_are_rate_limited_per_edge_node() {
        let mut r = Rebirths::default();
        assert!(r.allow("G", "E1", 1000));
        assert!(!r.allow("G", "E1", 1001), "again at once: no");
        assert!(!r.allow("G", "E1", 1000 + REBIRTH_INTERVAL_MS - 1));
        assert!(r.allow("G", "E2", 1001), "another edge node has its own limit");
        assert!(r.allow("G", "E1", 1000 + REBIRTH_INTERVAL_MS));
        assert!(r.allow("G", "E2", 10), "a clock that went back never silences an edge node");
        // Bounded: full of recent entries, further edge nodes wait; old entries make room.
        let mut r = Rebirths::default();
        for i in 0..REBIRTH_EDGES_MAX {
            assert!(r.allow("G", &format!("E{i}"), 1000));
        }
        assert!(!r.allow("G", "new", 1000 + REBIRTH_INTERVAL_MS - 1));
        assert_eq!(r.last.len(), REBIRTH_EDGES_MAX);
        assert!(r.allow("G", "new", 1000 + REBIRTH_INTERVAL_MS));
        assert_eq!(r.last.len(), 1);
    }
}
