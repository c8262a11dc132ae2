//! The MQTT source: subscribes to topics of an MQTT broker (a plant's unified namespace) and
//! publishes what arrives as points; writes to its channels become MQTT publishes.
//!
//! - Payloads ([`payload`]): a JSON point `{"v", "t", "q"}` (passed through; `t` and `q` filled
//!   in when missing), a bare JSON value or plain text (wrapped as `{"v", "t": <arrival ms>,
//!   "q": "good"}`), or Sparkplug B on `spBv1.0/...` topics ([`crate::sparkplug`]). Empty
//!   payloads (retained-message deletions) are ignored.
//! - Channels: the `channel` template with `{topic}` replaced by the topic, `/` turned into `.`.
//! - Refused input ([`refusals`]): a message larger than `max_packet_bytes` (`oversized`), one
//!   that does not decode (`decode`: a JSON object without `v`, a bad `t` or `q`, text that
//!   starts as JSON but is not, bytes that are not UTF-8, a bad Sparkplug topic or payload), a
//!   topic that gives no valid channel name (`topic`), and a new channel, Sparkplug edge node,
//!   device, metric or alias past its bound (`bound`) are counted by reason and logged at warn
//!   (rate-limited), never a reason to drop the connection. A refused message is acknowledged
//!   like any other, so the MQTT broker never delivers it again.
//! - Acknowledged after commit ([`backlog`], [`commit`]): a QoS 1 or 2 message is acknowledged
//!   (PUBACK, PUBREC) only once the node committed the points it gave (or refused them for
//!   good). While the node cannot commit, the MQTT broker keeps what is not acknowledged in the
//!   source's session (`clean_session = false`, the default, is what keeps it across a
//!   reconnect) and the points arrive in order once it can; QoS 0 values wait within
//!   `buffer_bytes`, the newest per channel kept when it is full, what is dropped counted.
//! - A value older than the newest its channel had (its own `t`) is historical
//!   ([`crate::Item::historical`]): it goes to the channel's trend at its time, not live.
//! - Sizes: the client library is given the largest packet MQTT can frame
//!   ([`LIBRARY_MAX_PACKET`]), so it never drops the connection over a packet's size (it would
//!   drop it before acknowledging, and under a persistent session the broker would deliver the
//!   same message again on every reconnect, forever); the source refuses by `max_packet_bytes`
//!   itself. The memory one message may take is bounded by the MQTT broker's own limit
//!   (mosquitto `message_size_limit`).
//! - The connection: QoS `qos` (1 by default) subscriptions, made again after every connect;
//!   reconnects with jittered exponential backoff ([`backoff`]: 0.5 s to 30 s, starting over
//!   only after a connection stayed up [`backoff::STABLE_AFTER`]). When the connection drops
//!   every channel the source fed gets its last value again with `q: "bad"`; fresh values
//!   follow once it is back.
//! - Points go to the sink in batches: whatever arrived within [`commit::BATCH_WAIT`] of the
//!   first, at most [`commit::BATCH_MAX`]. One task commits the batches in order, so each
//!   channel's points keep the order they arrived in.
//! - A Sparkplug B primary host application with `sparkplug_host_id` ([`host`]).
//! - Writes: a channel maps back to its topic through the template (`.` becomes `/`) and is
//!   published with QoS 1 (not retained); the write is accepted once the broker acknowledges
//!   it (PUBACK). MQTT 3.1.1 has no way to refuse a publish: a broker that drops it (an ACL)
//!   still acknowledges. A channel fed by a Sparkplug B metric is written with an `NCMD` or
//!   `DCMD` instead ([`Sparkplug::command`]), also QoS 1 and accepted on PUBACK. A write whose
//!   message would pass `max_packet_bytes` is not writable.
//! - Sparkplug B rebirth requests ([`crate::sparkplug`] says when) are published with QoS 0, as
//!   the specification wants commands, and counted in [`SourceStats::rebirths`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::{AsyncClient, Event, Incoming, MqttOptions, Outgoing, Publish, QoS, SubscribeFilter, Transport};
use switchboard_broker::now_ms;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::sparkplug::{self, Sparkplug};
use crate::{SourceCtx, SourceStats, WriteError};

pub mod backlog;
pub mod backoff;
pub mod commit;
pub mod fed;
pub mod host;
pub mod payload;
pub mod refusals;
pub mod target;
mod writes;

use backlog::{Backlog, Queued};
use backoff::{Backoff, Flaps};
use fed::{Accepted, Fed, Path};
use host::Host;
pub use payload::{decode, point, Template};
use refusals::Refusals;
/// `max_packet_bytes` when neither it nor the node's `limits.max_publication_bytes` is larger:
/// a Sparkplug birth of thousands of metrics fits.
pub const DEFAULT_MAX_PACKET: usize = 1024 * 1024;
/// The packet size limit given to the client library, both ways: the largest remaining length
/// an MQTT fixed header can encode, so the library never refuses a packet the broker sends
/// (see the module doc); the source's own limit is `max_packet_bytes`.
pub const LIBRARY_MAX_PACKET: usize = 268_435_455;
pub use crate::DEFAULT_MAX_CHANNELS;

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
    /// Topic filters writes may go to; unset: `topics` (a write goes only where the source
    /// reads, [`target`]).
    pub write_topics: Option<Vec<String>>,
    /// Channel of a topic: `{topic}` is replaced by the topic with `/` turned into `.`.
    #[serde(default = "default_channel")]
    pub channel: String,
    #[serde(default = "default_qos")]
    pub qos: u8,
    /// A persistent session (false): the broker keeps subscriptions and queues QoS 1
    /// messages while the source is away (a restart, a takeover by another node) or while the
    /// node cannot commit them (they stay unacknowledged).
    #[serde(default)]
    pub clean_session: bool,
    /// Bytes of QoS 0 values that may wait while the node cannot commit ([`backlog`]); unset:
    /// [`backlog::DEFAULT_BUFFER_BYTES`].
    pub buffer_bytes: Option<usize>,
    /// Be a Sparkplug B primary host application with this host id ([`host`]).
    pub sparkplug_host_id: Option<String>,
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
    /// Largest MQTT message (the whole PUBLISH packet, in bytes) the source reads or writes.
    /// A larger one it receives is acknowledged and refused (`oversized`). Unset: the larger of
    /// the node's `limits.max_publication_bytes` and [`DEFAULT_MAX_PACKET`] (filled in by the
    /// node through [`crate::SourceConfig::with_node_limits`]).
    pub max_packet_bytes: Option<usize>,
    /// Most channels the source feeds (and Sparkplug B metrics and aliases it keeps): a new
    /// one past it is refused (`bound`), the ones it has carry on.
    #[serde(default = "default_max_channels")]
    pub max_channels: usize,
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
fn default_max_channels() -> usize {
    DEFAULT_MAX_CHANNELS
}

impl MqttConfig {
    /// Checks every setting without connecting; the message names the key.
    pub fn check(&self) -> Result<(), String> {
        self.endpoint()?;
        Template::parse(&self.channel)?;
        if self.qos > 2 {
            return Err("qos: 0, 1 or 2".into());
        }
        if self.topics.is_empty() {
            return Err("topics: at least one topic filter".into());
        }
        for t in &self.topics {
            target::valid_filter(t).map_err(|e| format!("topics: {e}"))?;
        }
        for t in self.write_topics.iter().flatten() {
            target::valid_filter(t).map_err(|e| format!("write_topics: {e}"))?;
        }
        if self.keep_alive_s < 5 {
            return Err("keep_alive_s: at least 5".into());
        }
        if self.username.is_none() && self.password.is_some() {
            return Err("password: needs a username".into());
        }
        if self.max_packet_bytes.is_some_and(|n| !(1024..=LIBRARY_MAX_PACKET).contains(&n)) {
            return Err(format!("max_packet_bytes: 1024 to {LIBRARY_MAX_PACKET}"));
        }
        if self.max_channels == 0 {
            return Err("max_channels: at least 1".into());
        }
        if self.buffer_bytes.is_some_and(|n| !(MIN_BUFFER..=MAX_BUFFER).contains(&n)) {
            return Err(format!("buffer_bytes: {MIN_BUFFER} to {MAX_BUFFER}"));
        }
        if let Some(id) = &self.sparkplug_host_id {
            Host::check(id)?;
        }
        Ok(())
    }

    /// Fills `max_packet_bytes` when unset: the larger of the node's largest publication and
    /// [`DEFAULT_MAX_PACKET`].
    pub fn with_node_limits(mut self, max_publication_bytes: usize) -> MqttConfig {
        self.max_packet_bytes.get_or_insert(max_publication_bytes.clamp(DEFAULT_MAX_PACKET, LIBRARY_MAX_PACKET));
        self
    }

    /// Bytes of QoS 0 values that may wait.
    pub fn buffer(&self) -> usize {
        self.buffer_bytes.unwrap_or(backlog::DEFAULT_BUFFER_BYTES)
    }

    /// The largest message the source reads or writes.
    pub fn max_packet(&self) -> usize {
        self.max_packet_bytes.unwrap_or(DEFAULT_MAX_PACKET)
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

    /// The MQTT client id: `client_id`, or `switchboard-<name>` when no node filled it in
    /// ([`crate::SourceConfig::with_cluster`]).
    pub fn client_id(&self) -> String {
        self.client_id.clone().unwrap_or_else(|| format!("switchboard-{}", self.name))
    }

    fn options(&self) -> Result<MqttOptions, String> {
        let (host, port, tls) = self.endpoint()?;
        let id = self.client_id();
        let mut o = MqttOptions::new(id, host, port);
        // Messages are acknowledged once committed ([`commit`]), not when read.
        o.set_keep_alive(Duration::from_secs(self.keep_alive_s))
            .set_clean_session(self.clean_session)
            .set_manual_acks(true)
            .set_max_packet_size(LIBRARY_MAX_PACKET, LIBRARY_MAX_PACKET);
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

/// How long a stopping source waits for the batch under way to be committed.
const COMMIT_FINISH: Duration = Duration::from_secs(2);
/// Smallest and largest `buffer_bytes`.
pub const MIN_BUFFER: usize = 64 * 1024;
pub const MAX_BUFFER: usize = 1 << 30;

/// The connection task's state.
struct Conn {
    cfg: MqttConfig,
    client: AsyncClient,
    template: Template,
    stats: Arc<SourceStats>,
    sparkplug: Sparkplug,
    /// Every channel the source fed and its path, at most `cfg.max_channels`.
    fed: Fed,
    /// The last value the node accepted per channel.
    accepted: Accepted,
    backlog: Arc<Backlog>,
    /// A Sparkplug B primary host's STATE ([`host`]).
    host: Option<Host>,
    refusals: Refusals,
    /// `cfg.max_packet()`.
    max_packet: usize,
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
    let accepted = Accepted::default();
    let backlog = Arc::new(Backlog::new(ctx.stats.clone(), cfg.buffer(), !cfg.clean_session));
    let (committing, mut committing_rx) = watch::channel(true);
    let (stop_committing, committer_stop) = watch::channel(false);
    let mut committer = tokio::spawn(commit::run(commit::Committer {
        backlog: backlog.clone(),
        sink: ctx.sink.clone(),
        client: client.clone(),
        stats: ctx.stats.clone(),
        name: name.clone(),
        accepted: accepted.clone(),
        committing,
        stop: committer_stop,
    }));
    let mut host = cfg.sparkplug_host_id.as_deref().map(|id| Host::new(id, now_ms()));
    if let Some(h) = host.as_mut() {
        events.mqtt_options.set_last_will(h.reconnecting(now_ms()));
    }
    let max_channels = cfg.max_channels;
    let mut conn = Conn {
        sparkplug: Sparkplug::new(cfg.sparkplug_rebirth, sparkplug::Bounds::new(cfg.max_channels)),
        refusals: Refusals::new(name.clone(), ctx.stats.clone()),
        max_packet: cfg.max_packet(),
        cfg,
        client: client.clone(),
        template,
        stats: ctx.stats.clone(),
        fed: Fed::new(max_channels),
        accepted,
        backlog,
        host,
        unsent: VecDeque::new(),
        inflight: HashMap::new(),
    };
    let write_timeout = Duration::from_millis(conn.cfg.write_timeout_ms);
    let mut backoff = Backoff::default();
    let mut flaps = Flaps::default();
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
            Ok(()) = committing_rx.changed(), if conn.host.is_some() => {
                let online = *committing_rx.borrow_and_update();
                if conn.host.as_ref().is_some_and(|h| h.said.is_some()) {
                    conn.say_state(online);
                }
            }
            ev = events.poll() => match ev {
                Ok(Event::Incoming(Incoming::ConnAck(ack))) => {
                    conn.stats.connected.store(true, Relaxed);
                    if connected_once {
                        conn.stats.reconnects.fetch_add(1, Relaxed);
                    }
                    connected_once = true;
                    backoff.up(Instant::now());
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
                    // Subscribed: a primary host says whether it takes data now.
                    conn.say_state(*committing_rx.borrow());
                }
                Ok(Event::Incoming(Incoming::Publish(p))) => conn.received(p).await,
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
                        let now = Instant::now();
                        if let Some(n) = backoff.up_for(now).and_then(|up| flaps.dropped(up, now)) {
                            tracing::warn!(
                                source = %name,
                                client_id = %conn.client_id(),
                                "the MQTT broker closed the connection {n} times within a minute, each soon after it \
                                 was made: another client is probably connected with this client id and they take \
                                 the connection from each other (a second deployment on this broker? give each \
                                 deployment its own cluster_name, or the source its own client_id)"
                            );
                        }
                        conn.lost();
                    } else {
                        tracing::debug!(source = %name, "MQTT connect failed: {e}");
                    }
                    // Writes not acknowledged are answered now and never sent later.
                    events.pending.clear();
                    conn.backlog.new_connection();
                    if let Some(h) = conn.host.as_mut() {
                        events.mqtt_options.set_last_will(h.reconnecting(now_ms()));
                    }
                    conn.fail_writes("the MQTT connection was lost before the broker acknowledged the write");
                    let wait = backoff.down(Instant::now());
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = ctx.stop.changed() => break,
                    }
                }
            },
        }
    }
    conn.fail_writes("the source stopped");
    // The batch under way is finished and acknowledged before the connection goes; what is
    // not acknowledged the MQTT broker keeps for the next run.
    let _ = stop_committing.send(true);
    let finish = async {
        loop {
            tokio::select! {
                _ = &mut committer => return,
                ev = events.poll() => if ev.is_err() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                },
            }
        }
    };
    if tokio::time::timeout(COMMIT_FINISH, finish).await.is_err() {
        committer.abort();
    }
    // A clean disconnect fires no Will: a primary host says it goes offline itself.
    if conn.stats.connected.load(Relaxed) {
        conn.say_state(false);
    }
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
    conn.backlog.abandon();
}

impl Conn {
    fn client_id(&self) -> String {
        self.cfg.client_id()
    }

    /// One MQTT publish received: its points go to the backlog, with the message to
    /// acknowledge once they are committed (QoS 1/2).
    async fn received(&mut self, p: Publish) {
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
    fn lost(&mut self) {
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
    fn say_state(&mut self, online: bool) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
            write_topics: None,
            channel: default_channel(),
            qos: 1,
            clean_session: false,
            buffer_bytes: None,
            sparkplug_host_id: None,
            keep_alive_s: 15,
            write_timeout_ms: 5000,
            write_format: WriteFormat::Json,
            sparkplug_rebirth: true,
            max_packet_bytes: None,
            max_channels: DEFAULT_MAX_CHANNELS,
        };
        assert_eq!(cfg("mqtt://127.0.0.1:1884").endpoint().unwrap(), ("127.0.0.1".into(), 1884, false));
        assert_eq!(cfg("mqtts://broker").endpoint().unwrap(), ("broker".into(), 8883, true));
        assert!(cfg("http://x").check().unwrap_err().starts_with("url"));
        assert!(cfg("mqtt://u:p@x:1").check().unwrap_err().starts_with("url"));
        let mut c = cfg("mqtt://x");
        c.qos = 3;
        assert!(c.check().unwrap_err().starts_with("qos"));
        let mut c = cfg("mqtt://x");
        c.max_packet_bytes = Some(100);
        assert!(c.check().unwrap_err().starts_with("max_packet_bytes"));
        c.max_packet_bytes = Some(LIBRARY_MAX_PACKET + 1);
        assert!(c.check().unwrap_err().starts_with("max_packet_bytes"));
        c.max_packet_bytes = None;
        c.max_channels = 0;
        assert!(c.check().unwrap_err().starts_with("max_channels"));
        // Unset, the largest packet follows the node's largest publication, never below 1 MiB.
        assert_eq!(cfg("mqtt://x").with_node_limits(64 * 1024).max_packet(), DEFAULT_MAX_PACKET);
        assert_eq!(cfg("mqtt://x").with_node_limits(4 << 20).max_packet(), 4 << 20);
        let mut c = cfg("mqtt://x");
        c.max_packet_bytes = Some(2048);
        assert_eq!(c.with_node_limits(4 << 20).max_packet(), 2048, "a setting wins");
    }
}
