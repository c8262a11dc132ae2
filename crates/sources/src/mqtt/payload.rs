//! What the MQTT source makes of a message: the channel of its topic ([`Template`]) and the
//! point of a plain (not Sparkplug B) payload ([`decode`]).

use std::sync::Arc;

use serde_json::Value;
use switchboard_broker::Data;

/// The channel template split around `{topic}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    prefix: String,
    suffix: String,
}

impl Template {
    pub fn parse(text: &str) -> Result<Template, String> {
        let (prefix, suffix) =
            text.split_once("{topic}").ok_or_else(|| format!("channel: {text:?} has no {{topic}}"))?;
        if suffix.contains("{topic}") {
            return Err(format!("channel: {text:?} has {{topic}} more than once"));
        }
        switchboard_protocol::validate_channel(&format!("{prefix}x{suffix}"))
            .map_err(|e| format!("channel: {text:?} does not make channel names ({e})"))?;
        Ok(Template { prefix: prefix.into(), suffix: suffix.into() })
    }

    /// The channel of a topic (or a Sparkplug point path), if it makes a valid name.
    pub fn channel(&self, topic: &str) -> Option<String> {
        let mut ch = String::with_capacity(self.prefix.len() + topic.len() + self.suffix.len());
        ch.push_str(&self.prefix);
        ch.extend(topic.chars().map(|c| if c == '/' { '.' } else { c }));
        ch.push_str(&self.suffix);
        switchboard_protocol::validate_channel(&ch).is_ok().then_some(ch)
    }

    /// The topic a write to `channel` goes to: the inverse of [`Template::channel`], every `.`
    /// becoming `/`.
    pub fn topic(&self, channel: &str) -> Option<String> {
        let mid = channel.strip_prefix(&self.prefix)?.strip_suffix(&self.suffix)?;
        (!mid.is_empty()).then(|| mid.replace('.', "/"))
    }
}

/// A point as published: `{"v", "t", "q"}`.
pub fn point(v: &Value, t: u64, good: bool) -> Data {
    let q = if good { "good" } else { "bad" };
    let text = serde_json::json!({"v": v, "t": t, "q": q}).to_string();
    // Serialized from a JSON value: always valid JSON.
    Arc::new(serde_json::value::RawValue::from_string(text).unwrap_or_else(|_| raw_null()))
}

fn raw_null() -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::NULL.to_owned()
}

/// Reads a non-Sparkplug payload: the point's value, the data to publish and the point's time
/// (its own `t`, else `now_ms`); `Ok(None)` for an empty payload.
pub fn decode(payload: &[u8], now_ms: u64) -> Result<Option<(Value, Data, u64)>, String> {
    if payload.is_empty() {
        return Ok(None);
    }
    let text = std::str::from_utf8(payload).map_err(|_| "payload is not UTF-8 text".to_string())?.trim();
    if text.starts_with('{') {
        let Value::Object(mut obj) = serde_json::from_str::<Value>(text).map_err(|e| format!("bad JSON: {e}"))? else {
            return Err("bad JSON object".into());
        };
        let v = obj.get("v").cloned().ok_or("a JSON object without \"v\"")?;
        let t = match obj.get("t") {
            None => None,
            Some(t) if t.is_u64() => t.as_u64(),
            Some(_) => return Err("\"t\" is not unix milliseconds".into()),
        };
        let q_ok = match obj.get("q") {
            None => false,
            Some(Value::String(q)) if matches!(q.as_str(), "good" | "bad" | "uncertain") => true,
            Some(_) => return Err("\"q\" is not \"good\", \"bad\" or \"uncertain\"".into()),
        };
        if let (Some(t), true) = (t, q_ok) {
            let raw = serde_json::value::RawValue::from_string(text.to_string()).map_err(|e| e.to_string())?;
            return Ok(Some((v, Arc::new(raw), t)));
        }
        obj.entry("t").or_insert(now_ms.into());
        obj.entry("q").or_insert("good".into());
        let raw =
            serde_json::value::RawValue::from_string(Value::Object(obj).to_string()).map_err(|e| e.to_string())?;
        return Ok(Some((v, Arc::new(raw), t.unwrap_or(now_ms))));
    }
    let v = match serde_json::from_str::<Value>(text) {
        Ok(v) => v,
        Err(e) if text.starts_with(['[', '"']) => return Err(format!("bad JSON: {e}")),
        Err(_) => Value::String(text.to_string()),
    };
    let data = point(&v, now_ms, true);
    Ok(Some((v, data, now_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_template_maps_topics_to_channels_and_back() {
        let t = Template::parse("pt:{topic}").unwrap();
        assert_eq!(t.channel("plant/line1/temp").as_deref(), Some("pt:plant.line1.temp"));
        assert_eq!(t.channel("plant/line 1"), None, "a space is outside the channel alphabet");
        assert_eq!(t.topic("pt:plant.line1.sp").as_deref(), Some("plant/line1/sp"));
        assert_eq!(t.topic("room:x"), None);
        let t = Template::parse("pt:site1.{topic}.raw").unwrap();
        assert_eq!(t.channel("a/b").as_deref(), Some("pt:site1.a.b.raw"));
        assert_eq!(t.topic("pt:site1.a.b.raw").as_deref(), Some("a/b"));
        assert!(Template::parse("pt:x").is_err());
        assert!(Template::parse("p t:{topic}").is_err());
    }

    #[test]
    fn mqtt_payloads_decode_to_points() {
        let v = |p: &str| decode(p.as_bytes(), 7).map(|o| o.map(|(_, d, _)| d.get().to_string()));
        assert_eq!(v("21.5").unwrap().unwrap(), r#"{"q":"good","t":7,"v":21.5}"#);
        assert_eq!(v("true").unwrap().unwrap(), r#"{"q":"good","t":7,"v":true}"#);
        assert_eq!(v(" RUNNING ").unwrap().unwrap(), r#"{"q":"good","t":7,"v":"RUNNING"}"#);
        assert_eq!(v("[1,2]").unwrap().unwrap(), r#"{"q":"good","t":7,"v":[1,2]}"#);
        let full = r#"{"v":1,"t":5,"q":"uncertain"}"#;
        assert_eq!(v(full).unwrap().unwrap(), full, "a full point passes through");
        assert_eq!(decode(full.as_bytes(), 7).unwrap().unwrap().2, 5, "with its own time");
        assert_eq!(v(r#"{"v":1}"#).unwrap().unwrap(), r#"{"q":"good","t":7,"v":1}"#);
        assert_eq!(v("").unwrap(), None);
        for bad in [r#"{"x":1}"#, r#"{"v":1,"q":"meh"}"#, r#"{"v":1,"t":-3}"#, "{oops", "[1,", "\"open"] {
            assert!(v(bad).is_err(), "{bad}");
        }
        assert!(decode(&[0xff, 0xfe], 1).is_err());
    }
}
