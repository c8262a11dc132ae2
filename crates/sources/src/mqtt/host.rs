//! The MQTT source as a Sparkplug B primary host application (`sparkplug_host_id`, Sparkplug
//! 3.0 §"Host Applications"): edge nodes that store and forward hold their data while their
//! primary host says it is offline, and send it, `is_historical`, once it is online again.
//!
//! - Each connection registers a Will of `{"online": false, "timestamp": T}` on
//!   `spBv1.0/STATE/{host_id}` (QoS 1, retained), T the time the connection was set up; once the
//!   source's subscriptions are acknowledged it publishes `{"online": true, "timestamp": T}`
//!   the same way. Every STATE of one connection carries its T, so an edge node, which ignores a
//!   STATE older than the last it saw, takes the Will as well as the births.
//! - Online means the node commits what the source offers ([`super::commit`]): while it cannot
//!   (its broker is down), the source publishes `online: false`, and `online: true` once it can.
//! - A source that stops publishes `online: false` before it disconnects (a clean disconnect
//!   fires no Will).
//! - STATE messages of other host ids are the source's to ignore (`spBv1.0/STATE/...` topics
//!   give no points).

use rumqttc::{LastWill, QoS};

use super::sparkplug;

/// A primary host's identity and its connection's timestamp.
pub struct Host {
    topic: String,
    /// T of the current connection (unix ms).
    pub timestamp: u64,
    /// The state last published on this connection; `None` before the first.
    pub said: Option<bool>,
}

impl Host {
    pub fn new(host_id: &str, timestamp: u64) -> Host {
        Host { topic: format!("{}/STATE/{host_id}", sparkplug::NAMESPACE), timestamp, said: None }
    }

    /// A host id Sparkplug allows: a topic level of its own (no `/`, `+`, `#`), 1 to 64 of
    /// `[A-Za-z0-9_.-]`.
    pub fn check(host_id: &str) -> Result<(), String> {
        let ok = !host_id.is_empty()
            && host_id.len() <= 64
            && host_id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        match ok {
            true => Ok(()),
            false => Err(format!("sparkplug_host_id: {host_id:?} is not 1 to 64 of [A-Za-z0-9_.-]")),
        }
    }

    /// A new connection is being set up at `now`: its Will, with the new T.
    pub fn reconnecting(&mut self, now: u64) -> LastWill {
        self.timestamp = now;
        self.said = None;
        LastWill::new(self.topic.clone(), self.payload(false), QoS::AtLeastOnce, true)
    }

    /// The STATE message saying `online` (topic, payload), unless it is what was said last.
    pub fn say(&mut self, online: bool) -> Option<(String, Vec<u8>)> {
        if self.said == Some(online) {
            return None;
        }
        self.said = Some(online);
        Some((self.topic.clone(), self.payload(online)))
    }

    fn payload(&self, online: bool) -> Vec<u8> {
        serde_json::json!({"online": online, "timestamp": self.timestamp}).to_string().into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_host_state_carries_its_connections_timestamp() {
        assert!(Host::check("scada-1").is_ok());
        assert!(Host::check("a/b").unwrap_err().starts_with("sparkplug_host_id"));
        assert!(Host::check("").is_err());
        let mut h = Host::new("h1", 5);
        let will = h.reconnecting(1000);
        assert_eq!(will.topic, "spBv1.0/STATE/h1");
        assert_eq!(&will.message[..], br#"{"online":false,"timestamp":1000}"#);
        assert!(will.retain);
        let (topic, online) = h.say(true).unwrap();
        assert_eq!((topic.as_str(), &online[..]), ("spBv1.0/STATE/h1", &br#"{"online":true,"timestamp":1000}"#[..]));
        assert_eq!(h.say(true), None, "said already");
        assert_eq!(h.say(false).unwrap().1, br#"{"online":false,"timestamp":1000}"#);
        h.reconnecting(2000);
        assert_eq!(h.say(false).unwrap().1, br#"{"online":false,"timestamp":2000}"#, "a new connection says it again");
    }
}
