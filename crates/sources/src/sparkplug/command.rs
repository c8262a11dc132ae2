//! Sparkplug B commands the MQTT source sends: a write to a metric (`NCMD`/`DCMD` with the
//! value converted to the metric's datatype by [`super::value::write`]) and a rebirth request (`NCMD`
//! `Node Control/Rebirth`), with the rate limit that keeps rebirth requests to one per edge node
//! per [`REBIRTH_INTERVAL_MS`].

use std::collections::HashMap;

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
    use prost::Message;

    #[test]
    fn sparkplug_command_payload_carries_name_alias_datatype_and_value() {
        let bytes = payload("Outputs/Speed", Some(7), datatype::INT32, proto::Value::IntValue(0xffff_fffb), 42);
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
