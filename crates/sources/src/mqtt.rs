//! The MQTT source: subscribes to topics of an MQTT broker (a plant's unified namespace) and
//! publishes what arrives as points; writes to its channels become MQTT publishes.
//!
//! - Payloads: a JSON point `{"v", "t", "q"}` (passed through; `t` and `q` filled in when
//!   missing), a bare JSON value or plain text (wrapped as `{"v", "t": <arrival ms>,
//!   "q": "good"}`), or Sparkplug B on `spBv1.0/...` topics ([`crate::sparkplug`]). Anything
//!   else (a JSON object without `v`, a bad `t` or `q`, text that starts as JSON but is not,
//!   bytes that are not UTF-8, a topic that gives no valid channel name) is a decode error:
//!   counted, logged at debug, never fatal. Empty payloads (retained-message deletions) are
//!   ignored.
//! - Channels: the `channel` template with `{topic}` replaced by the topic, `/` turned into `.`.
//! - The connection: QoS `qos` (1 by default) subscriptions, made again after every connect; reconnects with jittered exponential backoff (0.5 s to
//!   30 s). When the connection drops every channel the source fed gets its last value again
//!   with `q: "bad"`; fresh values follow once it is back.
//! - Points go to the sink in batches: whatever arrived within [`BATCH_WAIT`] of the first,
//!   at most [`BATCH_MAX`]. One task publishes the batches in order, so each channel's points
//!   keep the order they arrived in.
//! - Writes: a channel maps back to its topic through the template (`.` becomes `/`) and is
//!   published with QoS 1 (not retained); the write is accepted once the broker acknowledges
//!   it (PUBACK). MQTT 3.1.1 has no way to refuse a publish: a broker that drops it (an ACL)
//!   still acknowledges. A channel fed by a Sparkplug B metric is written with an `NCMD` or
//!   `DCMD` instead ([`Sparkplug::command`]), also QoS 1 and accepted on PUBACK.
//! - Sparkplug B rebirth requests ([`crate::sparkplug`] says when) are published with QoS 0, as
//!   the specification wants commands, and counted in [`SourceStats::rebirths`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::{AsyncClient, Event, Incoming, MqttOptions, Outgoing, QoS, SubscribeFilter, Transport};
use serde_json::Value;
use switchboard_broker::{now_ms, Data};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::sparkplug::{self, Sparkplug};
use crate::{SourceCtx, SourceStats, Write, WriteError};

/// How long a batch waits for more points after its first one.
pub const BATCH_WAIT: Duration = Duration::from_millis(2);
/// Most points in one batch.
pub const BATCH_MAX: usize = 500;
/// Largest MQTT packet accepted or sent (a Sparkplug birth of thousands of metrics fits).
const MAX_PACKET: usize = 1024 * 1024;
/// Points decoded but not yet published; when full the source stops reading the socket, so a
/// slow node pushes back on the MQTT broker instead of growing memory.
const QUEUE: usize = 8192;

/// `kind = "mqtt"` settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttConfig {
    pub name: String,
    /// `mqtt://host:1883` or `mqtts://host:8883`.
    pub url: String,
    /// CA certificate (PEM) that signed the broker's certificate, for `mqtts://`; unset: the
    /// system's CA bundle.
    pub tls_ca: Option<std::path::PathBuf>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Unset: `switchboard-<name>`, the same on every node, so the node that takes the source
    /// over resumes its session (and the MQTT broker never serves two nodes at once).
    pub client_id: Option<String>,
    #[serde(default = "default_topics")]
    pub topics: Vec<String>,
    /// Channel of a topic: `{topic}` is replaced by the topic with `/` turned into `.`.
    #[serde(default = "default_channel")]
    pub channel: String,
    #[serde(default = "default_qos")]
    pub qos: u8,
    /// A persistent session (false): the broker keeps subscriptions and queues QoS 1
    /// messages while the source is away (a restart, a takeover by another node).
    #[serde(default)]
    pub clean_session: bool,
    #[serde(default = "default_keep_alive_s")]
    pub keep_alive_s: u64,
    /// How long a write waits for the broker's acknowledgement.
    #[serde(default = "default_write_timeout_ms")]
    pub write_timeout_ms: u64,
    /// What a write publishes: `json` the published data as it is, `value` the point's `v`
    /// alone (a string without quotes, numbers and booleans as text).
    #[serde(default)]
    pub write_format: WriteFormat,
    /// Ask a Sparkplug B edge node for a rebirth (`NCMD` `Node Control/Rebirth`) when its birth
    /// was not seen or its `seq` skipped.
    #[serde(default = "default_true")]
    pub sparkplug_rebirth: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteFormat {
    #[default]
    Json,
    Value,
}

fn default_topics() -> Vec<String> {
    vec!["#".into()]
}
fn default_channel() -> String {
    "pt:{topic}".into()
}
fn default_qos() -> u8 {
    1
}
fn default_keep_alive_s() -> u64 {
    15
}
fn default_write_timeout_ms() -> u64 {
    5000
}
fn default_true() -> bool {
    true
}

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

impl MqttConfig {
    /// Checks every setting without connecting; the message names the key.
    pub fn check(&self) -> Result<(), String> {
        self.endpoint()?;
        Template::parse(&self.channel)?;
        if self.qos > 2 {
            return Err("qos: 0, 1 or 2".into());
        }
        if self.topics.is_empty() || self.topics.iter().any(|t| t.is_empty()) {
            return Err("topics: at least one non-empty topic filter".into());
        }
        if self.keep_alive_s < 5 {
            return Err("keep_alive_s: at least 5".into());
        }
        if self.username.is_none() && self.password.is_some() {
            return Err("password: needs a username".into());
        }
        Ok(())
    }

    /// Host, port and TLS from the URL.
    fn endpoint(&self) -> Result<(String, u16, bool), String> {
        let (scheme, rest) = self.url.split_once("://").ok_or("url: expected mqtt://host:port or mqtts://host:port")?;
        let tls = match scheme {
            "mqtt" | "tcp" => false,
            "mqtts" | "ssl" => true,
            _ => return Err("url: expected mqtt://host:port or mqtts://host:port".into()),
        };
        let rest = rest.trim_end_matches('/');
        if rest.contains('@') || rest.contains('/') {
            return Err("url: host and port only (username and password are their own keys)".into());
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| "url: bad port")?),
            None => (rest, if tls { 8883 } else { 1883 }),
        };
        if host.is_empty() {
            return Err("url: no host".into());
        }
        Ok((host.trim_matches(|c| c == '[' || c == ']').to_string(), port, tls))
    }

    fn options(&self) -> Result<MqttOptions, String> {
        let (host, port, tls) = self.endpoint()?;
        let id = self.client_id.clone().unwrap_or_else(|| format!("switchboard-{}", self.name));
        let mut o = MqttOptions::new(id, host, port);
        o.set_keep_alive(Duration::from_secs(self.keep_alive_s))
            .set_clean_session(self.clean_session)
            .set_max_packet_size(MAX_PACKET, MAX_PACKET);
        if let Some(user) = &self.username {
            o.set_credentials(user.clone(), self.password.clone().unwrap_or_default());
        }
        if tls {
            o.set_transport(Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(Arc::new(self.tls()?))));
        }
        Ok(o)
    }

    fn tls(&self) -> Result<rustls::ClientConfig, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let path = self.tls_ca.clone().unwrap_or_else(|| "/etc/ssl/certs/ca-certificates.crt".into());
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(&path).map_err(|e| format!("tls_ca {}: {e}", path.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("tls_ca {}: {e}", path.display()))?;
            roots.add(cert).map_err(|e| format!("tls_ca {}: {e}", path.display()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("tls: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth())
    }
}

fn qos(level: u8) -> QoS {
    match level {
        0 => QoS::AtMostOnce,
        2 => QoS::ExactlyOnce,
        _ => QoS::AtLeastOnce,
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

/// Reads a non-Sparkplug payload: the point's value and the data to publish; `Ok(None)` for an
/// empty payload.
pub fn decode(payload: &[u8], now_ms: u64) -> Result<Option<(Value, Data)>, String> {
    if payload.is_empty() {
        return Ok(None);
    }
    let text = std::str::from_utf8(payload).map_err(|_| "payload is not UTF-8 text".to_string())?.trim();
    if text.starts_with('{') {
        let Value::Object(mut obj) = serde_json::from_str::<Value>(text).map_err(|e| format!("bad JSON: {e}"))? else {
            return Err("bad JSON object".into());
        };
        let v = obj.get("v").cloned().ok_or("a JSON object without \"v\"")?;
        let t_ok = match obj.get("t") {
            None => false,
            Some(t) if t.is_u64() => true,
            Some(_) => return Err("\"t\" is not unix milliseconds".into()),
        };
        let q_ok = match obj.get("q") {
            None => false,
            Some(Value::String(q)) if matches!(q.as_str(), "good" | "bad" | "uncertain") => true,
            Some(_) => return Err("\"q\" is not \"good\", \"bad\" or \"uncertain\"".into()),
        };
        if t_ok && q_ok {
            let raw = serde_json::value::RawValue::from_string(text.to_string()).map_err(|e| e.to_string())?;
            return Ok(Some((v, Arc::new(raw))));
        }
        obj.entry("t").or_insert(now_ms.into());
        obj.entry("q").or_insert("good".into());
        let raw =
            serde_json::value::RawValue::from_string(Value::Object(obj).to_string()).map_err(|e| e.to_string())?;
        return Ok(Some((v, Arc::new(raw))));
    }
    let v = match serde_json::from_str::<Value>(text) {
        Ok(v) => v,
        Err(e) if text.starts_with(['[', '"']) => return Err(format!("bad JSON: {e}")),
        Err(_) => Value::String(text.to_string()),
    };
    let data = point(&v, now_ms, true);
    Ok(Some((v, data)))
}

/// What the connection task knows of one channel it fed.
struct Fed {
    last: Value,
    /// For a channel fed by a Sparkplug metric: its point path and whether it is a device's.
    sparkplug: Option<(String, bool)>,
}

/// The connection task's state.
struct Conn {
    cfg: MqttConfig,
    client: AsyncClient,
    template: Template,
    stats: Arc<SourceStats>,
    sparkplug: Sparkplug,
    fed: HashMap<String, Fed>,
    points: mpsc::Sender<(String, Data)>,
    /// Writes handed to the client, waiting for their packet id (assigned in order).
    unsent: VecDeque<(Instant, oneshot::Sender<Result<(), WriteError>>)>,
    /// Writes sent, by packet id, waiting for PUBACK.
    inflight: HashMap<u16, (Instant, oneshot::Sender<Result<(), WriteError>>)>,
}

/// Runs the source until `ctx.stop` turns true.
pub async fn run(cfg: MqttConfig, mut ctx: SourceCtx) {
    let name = ctx.name.clone();
    let (options, template) = match (cfg.options(), Template::parse(&cfg.channel)) {
        (Ok(o), Ok(t)) => (o, t),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(source = %name, "MQTT source not started: {e}");
            return;
        }
    };
    let (client, mut events) = AsyncClient::new(options, 256);
    let (tx, rx) = mpsc::channel(QUEUE);
    let publisher = tokio::spawn(publish_batches(rx, ctx.sink.clone(), ctx.stats.clone(), name.clone()));
    let mut conn = Conn {
        sparkplug: Sparkplug::new(cfg.sparkplug_rebirth),
        cfg,
        client: client.clone(),
        template,
        stats: ctx.stats.clone(),
        fed: HashMap::new(),
        points: tx,
        unsent: VecDeque::new(),
        inflight: HashMap::new(),
    };
    let write_timeout = Duration::from_millis(conn.cfg.write_timeout_ms);
    let mut backoff = Duration::from_millis(500);
    let mut connected_once = false;
    let mut expiry = tokio::time::interval(Duration::from_millis(200));
    loop {
        if *ctx.stop.borrow() {
            break;
        }
        tokio::select! {
            changed = ctx.stop.changed() => if changed.is_err() { break },
            Some(w) = ctx.writes.recv() => conn.write(w),
            _ = expiry.tick() => conn.expire(write_timeout),
            ev = events.poll() => match ev {
                Ok(Event::Incoming(Incoming::ConnAck(ack))) => {
                    conn.stats.connected.store(true, Relaxed);
                    if connected_once {
                        conn.stats.reconnects.fetch_add(1, Relaxed);
                    }
                    connected_once = true;
                    backoff = Duration::from_millis(500);
                    tracing::info!(source = %name, session_present = ack.session_present, "MQTT connected");
                    // Subscribed on every connect, even when the broker says it kept the
                    // session: a broker restarted without persistence, or one that reports a
                    // session it does not have, would otherwise leave the source deaf.
                    let filters = conn.cfg.topics.iter().map(|t| SubscribeFilter::new(t.clone(), qos(conn.cfg.qos)));
                    if let Err(e) = client.try_subscribe_many(filters) {
                        tracing::warn!(source = %name, "MQTT subscribe not sent: {e}");
                    }
                }
                Ok(Event::Incoming(Incoming::SubAck(ack))) => {
                    let refused = ack.return_codes.iter().filter(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure)).count();
                    if refused > 0 {
                        tracing::warn!(source = %name, refused, "MQTT broker refused topic filters");
                    }
                }
                Ok(Event::Incoming(Incoming::Publish(p))) => conn.received(&p.topic, &p.payload).await,
                Ok(Event::Incoming(Incoming::PubAck(ack))) => {
                    if let Some((_, reply)) = conn.inflight.remove(&ack.pkid) {
                        conn.stats.writes_ok.fetch_add(1, Relaxed);
                        let _ = reply.send(Ok(()));
                    }
                }
                Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                    if pkid != 0 && !conn.inflight.contains_key(&pkid) {
                        if let Some(w) = conn.unsent.pop_front() {
                            conn.inflight.insert(pkid, w);
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    let was = conn.stats.connected.swap(false, Relaxed);
                    if was {
                        tracing::warn!(source = %name, "MQTT connection lost: {e}");
                        conn.lost().await;
                    } else {
                        tracing::debug!(source = %name, "MQTT connect failed: {e}");
                    }
                    // Writes not acknowledged are answered now and never sent later.
                    events.pending.clear();
                    conn.fail_writes("the MQTT connection was lost before the broker acknowledged the write");
                    let wait = backoff.mul_f64(0.5 + fastrand::f64());
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = ctx.stop.changed() => break,
                    }
                }
            },
        }
    }
    conn.fail_writes("the source stopped");
    let _ = client.try_disconnect();
    // Lets the event loop send the DISCONNECT (bounded: the broker may be gone).
    let _ = tokio::time::timeout(Duration::from_millis(200), async {
        while let Ok(ev) = events.poll().await {
            if matches!(ev, Event::Outgoing(Outgoing::Disconnect)) {
                break;
            }
        }
    })
    .await;
    conn.stats.connected.store(false, Relaxed);
    drop(conn);
    let _ = publisher.await;
}

impl Conn {
    /// One MQTT publish received.
    async fn received(&mut self, topic: &str, payload: &[u8]) {
        self.stats.messages.fetch_add(1, Relaxed);
        let now = now_ms();
        let items = match sparkplug::parse_topic(topic) {
            Some(Ok(t)) => match self.sparkplug.handle(&t, payload, now) {
                Ok(decoded) => {
                    if decoded.skipped > 0 {
                        self.stats.decode_errors.fetch_add(decoded.skipped as u64, Relaxed);
                        tracing::debug!(source = %self.cfg.name, topic, skipped = decoded.skipped, "Sparkplug metrics skipped");
                    }
                    if let Some((expected, got)) = decoded.gap {
                        self.stats.decode_errors.fetch_add(1, Relaxed);
                        tracing::debug!(source = %self.cfg.name, topic, expected, got, "Sparkplug seq gap: messages lost");
                    }
                    if let Some(cmd) = decoded.rebirth {
                        self.rebirth(cmd);
                    }
                    let mut items = Vec::with_capacity(decoded.points.len());
                    for p in decoded.points {
                        match self.template.channel(&p.path) {
                            Some(ch) => {
                                let data = point(&p.v, p.t, p.good);
                                self.fed.insert(ch.clone(), Fed { last: p.v, sparkplug: Some((p.path, p.device)) });
                                items.push((ch, data));
                            }
                            None => self.bad_input(topic, "the metric gives no valid channel name"),
                        }
                    }
                    items
                }
                Err(e) => return self.bad_input(topic, &e.to_string()),
            },
            Some(Err(e)) => return self.bad_input(topic, &e.to_string()),
            None => {
                let Some(ch) = self.template.channel(topic) else {
                    return self.bad_input(topic, "the topic gives no valid channel name");
                };
                match decode(payload, now) {
                    Ok(Some((v, data))) => {
                        self.fed.insert(ch.clone(), Fed { last: v, sparkplug: None });
                        vec![(ch, data)]
                    }
                    Ok(None) => return,
                    Err(e) => return self.bad_input(topic, &e),
                }
            }
        };
        for item in items {
            if self.points.send(item).await.is_err() {
                return;
            }
        }
    }

    fn bad_input(&self, topic: &str, why: &str) {
        self.stats.decode_errors.fetch_add(1, Relaxed);
        tracing::debug!(source = %self.cfg.name, topic = %topic.chars().take(200).collect::<String>(), "MQTT payload not decoded: {why}");
    }

    /// The connection dropped: every channel fed gets its last value with `q: "bad"`.
    async fn lost(&mut self) {
        let now = now_ms();
        let mut bad: Vec<(String, Data)> =
            self.fed.iter().map(|(ch, f)| (ch.clone(), point(&f.last, now, false))).collect();
        bad.sort_by(|a, b| a.0.cmp(&b.0));
        for item in bad {
            if self.points.send(item).await.is_err() {
                return;
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

    /// Hands a write to the MQTT client.
    fn write(&mut self, w: Write) {
        let target = if self.stats.connected.load(Relaxed) {
            self.target(&w)
        } else {
            Err(WriteError::Unavailable("not connected to the MQTT broker".into()))
        };
        let result = target.and_then(|(topic, payload)| {
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
    /// feeds, else the template's topic with the data per `write_format`.
    fn target(&self, w: &Write) -> Result<(String, Vec<u8>), WriteError> {
        if let Some(Fed { sparkplug: Some((path, device)), .. }) = self.fed.get(&w.channel) {
            let value = crate::write_value(w.data.get()).map_err(WriteError::NotWritable)?;
            let cmd = self.sparkplug.command(path, *device, &value, now_ms())?;
            return Ok((cmd.topic, cmd.payload));
        }
        let Some(topic) = self.template.topic(&w.channel) else {
            return Err(WriteError::NotWritable(format!("the channel is not of the form {}", self.cfg.channel)));
        };
        if topic.starts_with(sparkplug::NAMESPACE) {
            return Err(WriteError::NotWritable("Sparkplug B topics take no writes".into()));
        }
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
    fn expire(&mut self, timeout: Duration) {
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

    fn fail_writes(&mut self, why: &str) {
        for (_, reply) in self.unsent.drain(..).chain(self.inflight.drain().map(|(_, w)| w)) {
            self.stats.writes_failed.fetch_add(1, Relaxed);
            let _ = reply.send(Err(WriteError::Unavailable(why.into())));
        }
    }
}

/// Publishes decoded points in batches, in the order they were decoded.
async fn publish_batches(
    mut rx: mpsc::Receiver<(String, Data)>,
    sink: Arc<dyn crate::Sink>,
    stats: Arc<SourceStats>,
    name: String,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = Vec::with_capacity(64);
        batch.push(first);
        let deadline = Instant::now() + BATCH_WAIT;
        while batch.len() < BATCH_MAX {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(item)) => batch.push(item),
                    _ => break,
                },
            }
        }
        let results = sink.publish_batch(batch).await;
        let ok = results.iter().filter(|r| r.is_ok()).count();
        stats.points.fetch_add(ok as u64, Relaxed);
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            stats.refused.fetch_add((results.len() - ok) as u64, Relaxed);
            tracing::warn!(source = %name, refused = results.len() - ok, "the node refused MQTT points: {e}");
        }
    }
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
        let v = |p: &str| decode(p.as_bytes(), 7).map(|o| o.map(|(_, d)| d.get().to_string()));
        assert_eq!(v("21.5").unwrap().unwrap(), r#"{"q":"good","t":7,"v":21.5}"#);
        assert_eq!(v("true").unwrap().unwrap(), r#"{"q":"good","t":7,"v":true}"#);
        assert_eq!(v(" RUNNING ").unwrap().unwrap(), r#"{"q":"good","t":7,"v":"RUNNING"}"#);
        assert_eq!(v("[1,2]").unwrap().unwrap(), r#"{"q":"good","t":7,"v":[1,2]}"#);
        let full = r#"{"v":1,"t":5,"q":"uncertain"}"#;
        assert_eq!(v(full).unwrap().unwrap(), full, "a full point passes through");
        assert_eq!(v(r#"{"v":1}"#).unwrap().unwrap(), r#"{"q":"good","t":7,"v":1}"#);
        assert_eq!(v("").unwrap(), None);
        for bad in [r#"{"x":1}"#, r#"{"v":1,"q":"meh"}"#, r#"{"v":1,"t":-3}"#, "{oops", "[1,", "\"open"] {
            assert!(v(bad).is_err(), "{bad}");
        }
        assert!(decode(&[0xff, 0xfe], 1).is_err());
    }

    #[test]
    fn mqtt_config_is_checked_by_key() {
        let cfg = |url: &str| MqttConfig {
            name: "m".into(),
            url: url.into(),
            tls_ca: None,
            username: None,
            password: None,
            client_id: None,
            topics: default_topics(),
            channel: default_channel(),
            qos: 1,
            clean_session: false,
            keep_alive_s: 15,
            write_timeout_ms: 5000,
            write_format: WriteFormat::Json,
            sparkplug_rebirth: true,
        };
        assert_eq!(cfg("mqtt://127.0.0.1:1884").endpoint().unwrap(), ("127.0.0.1".into(), 1884, false));
        assert_eq!(cfg("mqtts://broker").endpoint().unwrap(), ("broker".into(), 8883, true));
        assert!(cfg("http://x").check().unwrap_err().starts_with("url"));
        assert!(cfg("mqtt://u:p@x:1").check().unwrap_err().starts_with("url"));
        let mut c = cfg("mqtt://x");
        c.qos = 3;
        assert!(c.check().unwrap_err().starts_with("qos"));
    }
}
