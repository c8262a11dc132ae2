//! Writes of the MQTT source: a permitted client publish to one of its channels becomes an MQTT
//! publish (QoS 1) to the topic that fed the channel, or a Sparkplug B command for a metric's
//! channel, only inside the source's write filters ([`super::target`]); answered on PUBACK, or
//! with `Unavailable` when not connected, not sent or not acknowledged in time.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use rumqttc::QoS;
use serde_json::Value;
use switchboard_broker::now_ms;
use tokio::time::Instant;

use super::fed::Path;
use super::{sparkplug, target, Conn, WriteFormat};
use crate::{Write, WriteError};

impl Conn {
    /// Hands a write to the MQTT client.
    pub(super) fn write(&mut self, w: Write) {
        // Where it would go is checked first: a write outside the source's topics is refused
        // (403) whether or not the MQTT broker is reachable now.
        let target = self.target(&w).and_then(|t| match self.stats.connected.load(Relaxed) {
            true => Ok(t),
            false => Err(WriteError::Unavailable("not connected to the MQTT broker".into())),
        });
        let result = target.and_then(|(topic, payload)| {
            // The PUBLISH packet: fixed header (at most 5 bytes), topic, packet id, payload.
            let size = 5 + 2 + topic.len() + 2 + payload.len();
            if size > self.max_packet {
                return Err(WriteError::NotWritable(format!(
                    "the MQTT message would be {size} bytes, larger than max_packet_bytes ({})",
                    self.max_packet
                )));
            }
            self.client
                .try_publish(topic, QoS::AtLeastOnce, false, payload)
                .map_err(|e| WriteError::Unavailable(format!("MQTT client busy: {e}")))
        });
        match result {
            Ok(()) => self.unsent.push_back((Instant::now(), w.reply)),
            Err(e) => {
                self.stats.writes_failed.fetch_add(1, Relaxed);
                let _ = w.reply.send(Err(e));
            }
        }
    }

    /// The topic and payload of a write: a Sparkplug command for a channel a Sparkplug metric
    /// feeds, else the topic that fed the channel (or, for one not fed, the template's) with
    /// the data per `write_format` — only inside the source's write filters ([`target`]).
    fn target(&self, w: &Write) -> Result<(String, Vec<u8>), WriteError> {
        let topic = match self.fed.path(&w.channel) {
            Some(Path::Sparkplug { path, device }) => {
                let value = crate::write_value(w.data.get()).map_err(WriteError::NotWritable)?;
                let cmd = self.sparkplug.command(path, *device, &value, now_ms())?;
                return Ok((cmd.topic, cmd.payload));
            }
            Some(Path::Topic(t)) => t.clone(),
            None => self.template.topic(&w.channel).ok_or_else(|| {
                WriteError::NotWritable(format!("the channel is not of the form {}", self.cfg.channel))
            })?,
        };
        if topic.starts_with(sparkplug::NAMESPACE) {
            return Err(WriteError::NotWritable("Sparkplug B topics take no writes".into()));
        }
        let filters = self.cfg.write_topics.as_ref().unwrap_or(&self.cfg.topics);
        target::allowed(filters, &topic).map_err(|why| WriteError::Forbidden(format!("{}: {why}", w.channel)))?;
        let payload = match self.cfg.write_format {
            WriteFormat::Json => w.data.get().as_bytes().to_vec(),
            WriteFormat::Value => match crate::write_value(w.data.get()).unwrap_or(Value::Null) {
                Value::String(s) => s.into_bytes(),
                Value::Null | Value::Object(_) => return Err(WriteError::NotWritable("no value to write".into())),
                other => other.to_string().into_bytes(),
            },
        };
        Ok((topic, payload))
    }

    /// Answers writes older than `timeout` with `Unavailable`.
    pub(super) fn expire(&mut self, timeout: Duration) {
        let now = Instant::now();
        let old: Vec<u16> = self.inflight.iter().filter(|(_, (at, _))| now - *at > timeout).map(|(k, _)| *k).collect();
        for pkid in old {
            if let Some((_, reply)) = self.inflight.remove(&pkid) {
                self.stats.writes_failed.fetch_add(1, Relaxed);
                let _ = reply.send(Err(WriteError::Unavailable("the MQTT broker did not acknowledge in time".into())));
            }
        }
        while self.unsent.front().is_some_and(|(at, _)| now - *at > timeout) {
            if let Some((_, reply)) = self.unsent.pop_front() {
                self.stats.writes_failed.fetch_add(1, Relaxed);
                let _ = reply.send(Err(WriteError::Unavailable("the write was not sent in time".into())));
            }
        }
    }

    pub(super) fn fail_writes(&mut self, why: &str) {
        for (_, reply) in self.unsent.drain(..).chain(self.inflight.drain().map(|(_, w)| w)) {
            self.stats.writes_failed.fetch_add(1, Relaxed);
            let _ = reply.send(Err(WriteError::Unavailable(why.into())));
        }
    }
}
