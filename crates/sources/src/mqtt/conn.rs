//! The MQTT source's connection task state ([`Conn`]) and what it does with what arrives: a
//! message's points decoded (plain or Sparkplug B) and held in the backlog, refusals counted, the
//! bad markers of a lost connection, a primary host's STATE and rebirth requests sent.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use rumqttc::{AsyncClient, Publish, QoS};
use switchboard_broker::now_ms;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::backlog::{Backlog, Queued};
use super::config::MqttConfig;
use super::fed::{self, Accepted, Fed, Path};
use super::host::Host;
use super::payload::{decode, point, Template};
use super::refusals::Refusals;
use crate::sparkplug::{self, Sparkplug};
use crate::{SourceStats, WriteError};

/// The connection task's state.
pub(super) struct Conn {
    pub(super) cfg: MqttConfig,
    pub(super) client: AsyncClient,
    pub(super) template: Template,
    pub(super) stats: Arc<SourceStats>,
    pub(super) sparkplug: Sparkplug,
    /// Every channel the source fed and its path, at most `cfg.max_channels`.
    pub(super) fed: Fed,
    /// The last value the node accepted per channel.
    pub(super) accepted: Accepted,
    pub(super) backlog: Arc<Backlog>,
    /// A Sparkplug B primary host's STATE ([`super::host`]).
    pub(super) host: Option<Host>,
    pub(super) refusals: Refusals,
    /// `cfg.max_packet()`.
    pub(super) max_packet: usize,
    /// Writes handed to the client, waiting for their packet id (assigned in order).
    pub(super) unsent: VecDeque<(Instant, oneshot::Sender<Result<(), WriteError>>)>,
    /// Writes sent, by packet id, waiting for PUBACK.
    pub(super) inflight: HashMap<u16, (Instant, oneshot::Sender<Result<(), WriteError>>)>,
}

impl Conn {
    pub(super) fn client_id(&self) -> String {
        self.cfg.client_id()
    }

    /// One MQTT publish received: its points go to the backlog, with the message to
    /// acknowledge once they are committed (QoS 1/2).
    pub(super) async fn received(&mut self, p: Publish) {
        self.stats.messages.fetch_add(1, Relaxed);
        let held = p.qos != QoS::AtMostOnce;
        let key = held.then(|| self.backlog.key(&p.topic, &p.payload));
        if let Some(key) = key.filter(|k| p.dup && self.backlog.committed_before(*k)) {
            // Delivered again after its acknowledgement was lost: committed already.
            self.stats.dropped.add("duplicate", 1);
            return self.backlog.hold(Vec::new(), p, key).await;
        }
        let mut points = self.points_in(&p.topic, &p.payload, p.size());
        // Delivered again, perhaps after an earlier run committed it: looked for in the
        // channels before it is published.
        points.iter_mut().for_each(|q| q.verify = p.dup);
        match key {
            Some(key) => self.backlog.hold(points, p, key).await,
            None => self.backlog.buffer(points),
        }
    }

    /// The points of one message (none when it is refused, counted and logged): `size` is the
    /// whole packet's.
    fn points_in(&mut self, topic: &str, payload: &[u8], size: usize) -> Vec<Queued> {
        if size > self.max_packet {
            let why = format!("{size} bytes, larger than max_packet_bytes ({})", self.max_packet);
            self.refusals.refuse("oversized", 1, topic, size, &why);
            return Vec::new();
        }
        let now = now_ms();
        // A panic while decoding one message (a bug meeting a device's bytes) refuses that
        // message like an undecodable one: the source and its connection go on.
        match switchboard_supervisor::isolate("source-decode", || {
            switchboard_supervisor::fault::hit("source.decode", topic);
            self.points_of(topic, payload, size, now)
        }) {
            Ok(items) => items,
            Err(panicked) => {
                self.undecodable(topic, size, &panicked.to_string());
                Vec::new()
            }
        }
    }

    /// The points of one message (none when it is refused, counted and logged).
    fn points_of(&mut self, topic: &str, payload: &[u8], size: usize, now: u64) -> Vec<Queued> {
        match sparkplug::parse_topic(topic) {
            Some(Ok(t)) => match self.sparkplug.handle(&t, payload, now) {
                Ok(decoded) => self.sparkplug_points(topic, size, decoded),
                Err(e) => {
                    self.undecodable(topic, size, &e.to_string());
                    Vec::new()
                }
            },
            Some(Err(e)) => {
                self.undecodable(topic, size, &e.to_string());
                Vec::new()
            }
            None => {
                let Some(ch) = self.template.channel(topic) else {
                    self.no_channel(topic, size, "the topic gives no valid channel name");
                    return Vec::new();
                };
                match decode(payload, now) {
                    Ok(Some((v, data, t))) => match self.feed(&ch, &Path::Topic(topic.to_string()), topic, size) {
                        true => {
                            let historical = self.fed.older(&ch, t);
                            vec![Queued { historical, ..Queued::new(ch, data, v) }]
                        }
                        false => Vec::new(),
                    },
                    Ok(None) => Vec::new(),
                    Err(e) => {
                        self.undecodable(topic, size, &e);
                        Vec::new()
                    }
                }
            }
        }
    }

    /// The points of a decoded Sparkplug B message, with its skipped metrics, `seq` gap,
    /// refusals and rebirth request accounted for.
    fn sparkplug_points(&mut self, topic: &str, size: usize, decoded: sparkplug::Decoded) -> Vec<Queued> {
        if decoded.skipped > 0 {
            self.stats.decode_errors.fetch_add(decoded.skipped as u64, Relaxed);
            tracing::debug!(source = %self.cfg.name, topic, skipped = decoded.skipped, "Sparkplug metrics skipped");
        }
        if let Some((expected, got)) = decoded.gap {
            self.stats.decode_errors.fetch_add(1, Relaxed);
            tracing::debug!(source = %self.cfg.name, topic, expected, got, "Sparkplug seq gap: messages lost");
        }
        if let Some((what, bound)) = decoded.bound {
            let why = format!("the source keeps at most {bound} Sparkplug B {what}");
            self.refusals.refuse("bound", decoded.bounded as u64, topic, size, &why);
        }
        if let Some((ended, current)) = decoded.stale_death {
            tracing::info!(
                source = %self.cfg.name,
                topic,
                ended,
                current,
                "Sparkplug NDEATH of an earlier session (bdSeq) ignored: the edge node stays alive"
            );
        }
        if let Some((ended, current)) = decoded.death_ahead {
            // Counted like a seq gap: the edge node does not number its messages as Sparkplug
            // says, though nothing is lost (its death is taken).
            self.stats.decode_errors.fetch_add(1, Relaxed);
            tracing::warn!(
                source = %self.cfg.name,
                topic,
                ended,
                current,
                "Sparkplug NDEATH numbered ahead of its session's NBIRTH (bdSeq): the edge node is offline; it \
                 should send its birth's bdSeq"
            );
        }
        if let Some(cmd) = decoded.rebirth {
            self.rebirth(cmd);
        }
        let mut items = Vec::with_capacity(decoded.points.len());
        for p in decoded.points {
            let Some(ch) = self.template.channel(&p.path) else {
                self.no_channel(topic, size, "a metric gives no valid channel name");
                continue;
            };
            if !self.feed(&ch, &Path::Sparkplug { path: p.path, device: p.device }, topic, size) {
                continue;
            }
            // A bad marker (a death, a null) carries the last value the node accepted.
            let v = match p.good {
                true => p.v,
                false => self.accepted.get(&ch).unwrap_or(p.v),
            };
            items.push(Queued { historical: p.historical, ..Queued::new(ch, point(&v, p.t, p.good), v) });
        }
        items
    }

    /// Records that `path` feeds `ch`; false when refused: another path feeds it
    /// (`collision`), or it is new past `max_channels` (`bound`).
    fn feed(&mut self, ch: &str, path: &Path, topic: &str, size: usize) -> bool {
        match self.fed.feed(ch, path) {
            Ok(()) => true,
            Err(fed::Refused::Collision(why)) => {
                self.refusals.refuse("collision", 1, topic, size, &format!("{why}; one channel, one source path"));
                false
            }
            Err(fed::Refused::Bound(max)) => {
                let why = format!("the source feeds at most max_channels ({max}) channels");
                self.refusals.refuse("bound", 1, topic, size, &why);
                false
            }
        }
    }

    /// A message that does not decode: counted as a decode error and refused (`decode`).
    fn undecodable(&mut self, topic: &str, size: usize, why: &str) {
        self.stats.decode_errors.fetch_add(1, Relaxed);
        self.refusals.refuse("decode", 1, topic, size, &format!("not decoded: {why}"));
    }

    /// A topic (or Sparkplug metric) that gives no channel name: counted as a decode error and
    /// refused (`topic`).
    fn no_channel(&mut self, topic: &str, size: usize, why: &str) {
        self.stats.decode_errors.fetch_add(1, Relaxed);
        self.refusals.refuse("topic", 1, topic, size, why);
    }

    /// The connection dropped: every channel fed gets the last value the node accepted on it
    /// with `q: "bad"`.
    pub(super) fn lost(&mut self) {
        let now = now_ms();
        let mut bad: Vec<Queued> = self
            .accepted
            .of(self.fed.channels())
            .into_iter()
            .map(|(ch, v)| Queued::new(ch, point(&v, now, false), v))
            .collect();
        bad.sort_by(|a, b| a.channel.cmp(&b.channel));
        self.backlog.buffer(bad);
    }

    /// Publishes a primary host's STATE (QoS 1, retained) when it says something new.
    pub(super) fn say_state(&mut self, online: bool) {
        let Some((topic, payload)) = self.host.as_mut().and_then(|h| h.say(online)) else { return };
        if let Err(e) = self.client.try_publish(topic, QoS::AtLeastOnce, true, payload) {
            tracing::warn!(source = %self.cfg.name, "Sparkplug B host STATE not sent: {e}");
            if let Some(h) = self.host.as_mut() {
                h.said = None;
            }
        }
    }

    /// Publishes a Sparkplug rebirth request (QoS 0: nothing waits for it).
    fn rebirth(&self, cmd: sparkplug::command::Command) {
        match self.client.try_publish(cmd.topic.clone(), QoS::AtMostOnce, false, cmd.payload) {
            Ok(()) => {
                self.stats.rebirths.fetch_add(1, Relaxed);
                tracing::info!(source = %self.cfg.name, topic = %cmd.topic, "Sparkplug rebirth requested");
            }
            Err(e) => tracing::debug!(source = %self.cfg.name, "Sparkplug rebirth request not sent: {e}"),
        }
    }
}
