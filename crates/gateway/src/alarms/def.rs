//! Alarm definitions (`[[alarms]]`, `/api/alarms/defs/{id}`; docs/alarms.md): what is
//! compared, against which limits, and how it is told. One place validates them, for the
//! configuration and the API alike, each refusal naming its field.

use serde::{Deserialize, Serialize};
use switchboard_protocol::{namespace_of, validate_channel};

use crate::auth::pattern::Pattern;

/// Longest definition id.
pub const MAX_ID_LEN: usize = 64;
/// Longest `message`.
pub const MAX_MESSAGE_LEN: usize = 200;
/// Longest delay and staleness (s): a week.
pub const MAX_DELAY_S: f64 = 7.0 * 86_400.0;
/// The namespace of the channels alarms are published on; nobody else publishes there.
pub const NAMESPACE: &str = "alarm";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    Low,
    #[default]
    Medium,
    High,
    Critical,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Medium => "medium",
            Priority::High => "high",
            Priority::Critical => "critical",
        }
    }
}

/// One definition, as written in the configuration or sent to the API (which takes `id` from
/// the URL).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlarmDef {
    #[serde(default)]
    pub id: String,
    pub channel: String,
    #[serde(default = "default_field")]
    pub field: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hi: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hihi: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lo: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lolo: Option<f64>,
    #[serde(default)]
    pub deadband: f64,
    #[serde(default)]
    pub on_delay_s: f64,
    #[serde(default)]
    pub off_delay_s: f64,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default = "yes")]
    pub bad_quality: bool,
    #[serde(default)]
    pub stale_s: f64,
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn default_field() -> String {
    "v".into()
}

fn yes() -> bool {
    true
}

/// Whether `id` may name a definition: 1–64 of `[A-Za-z0-9_.-]`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(id_byte)
}

fn id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')
}

impl AlarmDef {
    /// Checks every field; the error names the first bad one (`hi: must be above lo`).
    pub fn validate(&self) -> Result<(), String> {
        if !valid_id(&self.id) {
            return Err(format!("id: 1-{MAX_ID_LEN} of A-Z a-z 0-9 _ . -"));
        }
        if self.channel.contains('*') {
            Pattern::parse(&self.channel).map_err(|e| format!("channel: {e}"))?;
        } else {
            validate_channel(&self.channel).map_err(|e| format!("channel: {e}"))?;
        }
        if namespace_of(&self.channel) == NAMESPACE || self.channel.starts_with('$') {
            return Err(format!("channel: the {NAMESPACE} namespace holds the alarms themselves"));
        }
        if self.field.is_empty() || self.field.len() > 64 {
            return Err("field: 1-64 bytes".into());
        }
        let limits = [("lolo", self.lolo), ("lo", self.lo), ("hi", self.hi), ("hihi", self.hihi)];
        for (name, v) in limits {
            if v.is_some_and(|v| !v.is_finite()) {
                return Err(format!("{name}: must be a finite number"));
            }
        }
        let given: Vec<(&str, f64)> = limits.iter().filter_map(|(n, v)| v.map(|v| (*n, v))).collect();
        for pair in given.windows(2) {
            if pair[1].1 <= pair[0].1 {
                return Err(format!("{}: must be above {}", pair[1].0, pair[0].0));
            }
        }
        if !(self.deadband.is_finite() && self.deadband >= 0.0) {
            return Err("deadband: a number of at least 0".into());
        }
        for (name, v) in [("on_delay_s", self.on_delay_s), ("off_delay_s", self.off_delay_s), ("stale_s", self.stale_s)]
        {
            if !(v.is_finite() && (0.0..=MAX_DELAY_S).contains(&v)) {
                return Err(format!("{name}: 0-{MAX_DELAY_S} seconds"));
            }
        }
        if self.message.as_ref().is_some_and(|m| m.len() > MAX_MESSAGE_LEN || m.contains(['\n', '\r'])) {
            return Err(format!("message: one line of at most {MAX_MESSAGE_LEN} bytes"));
        }
        if given.is_empty() && !self.bad_quality && self.stale_s == 0.0 {
            return Err("hi: a definition needs a limit (hi, hihi, lo, lolo), bad_quality or stale_s".into());
        }
        Ok(())
    }

    pub fn is_pattern(&self) -> bool {
        self.channel.contains('*')
    }

    /// The id of this definition's alarm on `channel`: the definition's own for a channel
    /// definition, `<id>.<channel without its namespace>` for a pattern, with every byte
    /// outside the id alphabet as `_`.
    pub fn alarm_id(&self, channel: &str) -> String {
        if !self.is_pattern() {
            return self.id.clone();
        }
        let rest = channel.split_once(':').map_or(channel, |(_, r)| r);
        let rest: String = rest.bytes().map(|b| if id_byte(b) { char::from(b) } else { '_' }).collect();
        format!("{}.{rest}", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(toml: &str) -> Result<AlarmDef, String> {
        let d: AlarmDef = toml::from_str(toml).map_err(|e| e.to_string())?;
        d.validate().map(|()| d)
    }

    #[test]
    fn alarm_definitions_are_checked_field_by_field() {
        let d = def("id = \"hot\"\nchannel = \"pt:line1.*\"\nhi = 80\nhihi = 95").unwrap();
        assert_eq!((d.field.as_str(), d.priority, d.bad_quality, d.enabled), ("v", Priority::Medium, true, true));
        assert_eq!(d.alarm_id("pt:line1.t3"), "hot.line1.t3");
        assert_eq!(d.alarm_id("pt:line1.a@b"), "hot.line1.a_b");
        let exact = def("id = \"b\"\nchannel = \"pt:boiler.temp\"\nlo = 1").unwrap();
        assert_eq!(exact.alarm_id("pt:boiler.temp"), "b");
        let bad = |t: &str, field: &str| {
            let e = def(t).unwrap_err();
            assert!(e.starts_with(field), "{t}: {e}");
        };
        bad("id = \"a b\"\nchannel = \"pt:x\"\nhi = 1", "id:");
        bad("id = \"a\"\nchannel = \"pt:x y\"\nhi = 1", "channel:");
        bad("id = \"a\"\nchannel = \"alarm:all\"\nhi = 1", "channel:");
        bad("id = \"a\"\nchannel = \"pt:x\"\nhi = 1\nlo = 2", "hi: must be above lo");
        bad("id = \"a\"\nchannel = \"pt:x\"\nhi = 1\nhihi = 1", "hihi: must be above hi");
        bad("id = \"a\"\nchannel = \"pt:x\"\nhi = 1\ndeadband = -1", "deadband:");
        bad("id = \"a\"\nchannel = \"pt:x\"\nhi = 1\non_delay_s = 1e9", "on_delay_s:");
        bad("id = \"a\"\nchannel = \"pt:x\"\nbad_quality = false", "hi: a definition needs");
        assert!(def("id = \"a\"\nchannel = \"pt:x\"\nhi = 1\nnope = 2").unwrap_err().contains("unknown field"));
        assert!(def("id = \"a\"\nchannel = \"pt:x\"\nhi = 1\npriority = \"urgent\"").is_err());
    }
}
