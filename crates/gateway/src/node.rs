//! [`Node`]: one gateway process — its configuration, broker, hub, connections and lifecycle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use switchboard_broker::{Broker, BrokerError, Data, Outgoing, Position};
use switchboard_protocol::code::{self, close};
use switchboard_protocol::command::check_idempotency_key;
use switchboard_protocol::message::single_line;
use switchboard_protocol::websocket::{self, Opcode};
use switchboard_protocol::{validate_channel, Format};
use tokio::sync::watch;

use crate::auth::Identity;
use crate::config::Config;
use crate::hub::Hub;
use crate::log_limit::LogLimit;
use crate::metrics::Metrics;
use crate::outbox::{Outbox, PullOptions, Wire};

pub use crate::error::ApiError;

/// Where a publication goes: a channel name that passed [`Node::target`]. Permission checks
/// take one, so they are never asked about a name that cannot exist.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a>(&'a str);

impl<'a> Target<'a> {
    pub fn channel(self) -> &'a str {
        self.0
    }
}

/// A publication that passed every check ([`Node::target`], then
/// [`Node::check_publication`]): the only thing [`Node::publish`], [`Node::publish_batch`] and
/// a write to a device take.
#[derive(Debug)]
pub struct Checked(Outgoing);

impl Checked {
    pub fn channel(&self) -> &str {
        &self.0.channel
    }

    /// The data on one line.
    pub fn data(&self) -> &Data {
        &self.0.data
    }

    /// The history and trend its namespace keeps.
    pub fn policy(&self) -> &switchboard_broker::HistoryPolicy {
        &self.0.policy
    }

    /// The same publication as a historical one ([`Outgoing::historical`]): a source's value
    /// from before the channel's newest (`crate::sources::historical`).
    pub fn historical(self) -> Checked {
        Checked(Outgoing { historical: true, ..self.0 })
    }
}

/// One gateway node.
pub struct Node {
    pub config: Config,
    pub id: String,
    pub broker: Arc<dyn Broker>,
    pub hub: Arc<Hub>,
    pub metrics: Arc<Metrics>,
    /// The plant data sources (`[[sources]]`), once started (`crate::sources::start`).
    pub sources: std::sync::OnceLock<switchboard_sources::Sources>,
    /// Writes forwarded to (and from) the node that runs their source, in a cluster.
    pub forwarded: crate::sources::forward::pending::Pending,
    /// Every write attempt made through this node, and their counts by outcome.
    pub writes: crate::sources::audit::Audit,
    /// Who each connection is, for disconnects and revocations (`crate::control`).
    pub owners: crate::control::owners::Owners,
    /// The alarm engine, once started (`crate::alarms::start`).
    pub alarms: std::sync::OnceLock<Arc<crate::alarms::engine::Alarms>>,
    /// Open connections by id, for heartbeats and shutdown. Touched once per connect and
    /// disconnect, never on the delivery path.
    conns: Mutex<HashMap<u64, Arc<Outbox>>>,
    next_conn: AtomicU64,
    started: Instant,
    stopping: AtomicBool,
    stop_tx: watch::Sender<bool>,
}

impl Node {
    pub fn new(config: Config, broker: Arc<dyn Broker>) -> Arc<Node> {
        let metrics = Arc::new(Metrics::default());
        let hub = Arc::new(Hub::new(metrics.clone()));
        broker.set_handler(hub.clone());
        let id = config.node_id.clone().unwrap_or_else(|| format!("n{:06x}", fastrand::u32(..) & 0xff_ffff));
        broker.set_node_id(&id);
        let (stop_tx, _) = watch::channel(false);
        Arc::new(Node {
            config,
            id,
            broker,
            hub,
            metrics,
            sources: std::sync::OnceLock::new(),
            forwarded: Default::default(),
            writes: Default::default(),
            owners: Default::default(),
            alarms: std::sync::OnceLock::new(),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            started: Instant::now(),
            stopping: AtomicBool::new(false),
            stop_tx,
        })
    }

    /// Registers a new connection. `Err` carries an outbox that is already closing with 4029
    /// when the connection limit is reached (so the client is told why).
    pub fn register(&self, format: Format, wire: Arc<dyn Wire>) -> Result<Arc<Outbox>, Arc<Outbox>> {
        let id = self.next_conn.fetch_add(1, Relaxed);
        self.admit(Arc::new(Outbox::new(id, format, wire, self.config.limits.max_pending_bytes, self.metrics.clone())))
    }

    /// Registers a connection of an HTTP transport, whose outbox its transport takes from
    /// (`outbox::pull`). As [`Node::register`] otherwise.
    pub fn register_pull(&self, options: PullOptions) -> Result<Arc<Outbox>, Arc<Outbox>> {
        let id = self.next_conn.fetch_add(1, Relaxed);
        self.admit(Arc::new(Outbox::new_pull(id, self.config.limits.max_pending_bytes, self.metrics.clone(), options)))
    }

    /// Registers an SSE stream, whose outbox frames its messages with `framer` and keeps them
    /// for the response body (`outbox::framed`). As [`Node::register`] otherwise.
    pub fn register_framed(&self, framer: Box<dyn crate::outbox::Framer>) -> Result<Arc<Outbox>, Arc<Outbox>> {
        let id = self.next_conn.fetch_add(1, Relaxed);
        let max = self.config.limits.max_pending_bytes;
        self.admit(Arc::new(Outbox::new_framed(id, framer, max, self.metrics.clone())))
    }

    fn admit(&self, ob: Arc<Outbox>) -> Result<Arc<Outbox>, Arc<Outbox>> {
        let id = ob.id;
        let mut conns = self.conns.lock();
        if self.stopping.load(Relaxed) {
            drop(conns);
            ob.close(close::SHUTDOWN, "server shutting down", false);
            return Err(ob);
        }
        if conns.len() >= self.config.limits.max_connections {
            drop(conns);
            self.metrics.rejected_connections.fetch_add(1, Relaxed);
            ob.close(close::TOO_MANY, "too many connections", false);
            return Err(ob);
        }
        conns.insert(id, ob.clone());
        self.metrics.connections.store(conns.len() as u64, Relaxed);
        self.metrics.connections_total.fetch_add(1, Relaxed);
        Ok(ob)
    }

    pub fn unregister(&self, id: u64) {
        let mut conns = self.conns.lock();
        conns.remove(&id);
        self.metrics.connections.store(conns.len() as u64, Relaxed);
        drop(conns);
        self.owners.remove(id);
    }

    /// The outbox of open connection `id`.
    pub fn outbox(&self, id: u64) -> Option<Arc<Outbox>> {
        self.conns.lock().get(&id).cloned()
    }

    pub fn connection_count(&self) -> usize {
        self.conns.lock().len()
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// What a client sees of a broker failure: 429 when a new channel would pass
    /// `limits.max_channels` (counted in `switchboard_channels_refused_total`), 400 for a
    /// listing cursor the broker never handed out, 503 when the broker could not be reached
    /// (or failed over) within its wait and nothing was done, 504 when a publish was sent but
    /// not answered, so the publication may or may not exist.
    ///
    /// The 503 and 504 say what the client may do, never the broker's own error text (Redis
    /// addresses, socket errors): that goes to the log, at most one line per kind per interval
    /// (`log_limit`), since every request meets a broker that is down.
    pub fn broker_error(&self, e: BrokerError) -> ApiError {
        static UNAVAILABLE: LogLimit = LogLimit::new();
        static UNKNOWN: LogLimit = LogLimit::new();
        match e {
            BrokerError::Full(_) => {
                self.metrics.channels_refused.fetch_add(1, Relaxed);
                ApiError::new(code::LIMIT, format!("{e}: new channels are refused until idle ones are forgotten"))
            }
            BrokerError::BadCursor(_) => ApiError::new(code::BAD_REQUEST, e.to_string()),
            BrokerError::KeysFull { message, retry_after_s } => ApiError::new(
                code::LIMIT,
                format!("{message}: keyed publications wait until older keys leave (5 minutes after they came)"),
            )
            .retry_after(retry_after_s),
            BrokerError::Unavailable(detail) => {
                self.metrics.broker_unavailable.fetch_add(1, Relaxed);
                if let Some(suppressed) = UNAVAILABLE.admit() {
                    tracing::warn!(error = %detail, suppressed, "broker unavailable");
                }
                ApiError::new(code::UNAVAILABLE, "broker unavailable; nothing was done, retry later")
            }
            BrokerError::Unknown(detail) => {
                self.metrics.broker_unknown.fetch_add(1, Relaxed);
                if let Some(suppressed) = UNKNOWN.admit() {
                    tracing::warn!(error = %detail, suppressed, "broker did not answer a publish");
                }
                ApiError::new(
                    code::OUTCOME_UNKNOWN,
                    "outcome unknown: the broker did not answer; the publication may have been committed: retry \
                     with the same idempotency_key (a retry without one may publish it twice)",
                )
            }
        }
    }

    /// [`Node::broker_error`] of a step that followed others already done: the same code and
    /// log line, and a message that starts with what was done (`done`, e.g. "done on this node
    /// only, not passed on to the others") and names the failure without the broker's text.
    pub fn broker_error_after(&self, done: &str, e: BrokerError) -> ApiError {
        let brief = match &e {
            BrokerError::Unavailable(_) => Some("broker unavailable"),
            BrokerError::Unknown(_) => Some("the broker did not answer"),
            BrokerError::Full(_) | BrokerError::BadCursor(_) | BrokerError::KeysFull { .. } => None,
        };
        let e = self.broker_error(e);
        let message = format!("{done}: {}", brief.unwrap_or(&e.message));
        ApiError { message, ..e }
    }

    /// Whether one more channel with local subscribers passes `limits.max_channels` (the
    /// ceiling that holds with a shared broker, whose channels live in Redis).
    pub fn hub_has_room(&self, channel: &str) -> Result<(), ApiError> {
        let max = self.config.limits.max_channels;
        if self.hub.subscriber_count(channel) == 0 && self.hub.channel_count() >= max {
            return Err(self.broker_error(BrokerError::Full(format!("this node holds its maximum of {max} channels"))));
        }
        Ok(())
    }

    /// Publishes a checked publication ([`Node::check_publication`]) on behalf of the HTTP API,
    /// the simulator, a source or a client. A retry with the same idempotency key on the same
    /// channel within [`switchboard_broker::IDEMPOTENCY_WINDOW`] answers the first
    /// publication's position.
    pub async fn publish(&self, publication: Checked) -> Result<Position, ApiError> {
        let mut out = self.broker.publish_batch(vec![publication.0]).await;
        let published = out.pop().unwrap_or_else(|| Err(BrokerError::Unavailable("broker returned no result".into())));
        published.map_err(|e| self.broker_error(e))
    }

    /// Publishes several publications, each checked or refused already: the checked ones go
    /// to the broker as one batch (one round trip per Redis shard) and every subscriber is
    /// written to once for the whole batch (the broker flushes after it, see
    /// [`Broker::publish_batch`]); a refusal stays the item's result. One result per item, in
    /// order.
    pub async fn publish_batch(&self, items: Vec<Result<Checked, ApiError>>) -> Vec<Result<Position, ApiError>> {
        let mut valid: Vec<Outgoing> = Vec::with_capacity(items.len());
        let slots: Vec<Result<(), ApiError>> = items.into_iter().map(|c| c.map(|c| valid.push(c.0))).collect();
        let mut published = self.broker.publish_batch(valid).await.into_iter();
        slots
            .into_iter()
            .map(|slot| {
                slot?;
                published
                    .next()
                    .unwrap_or_else(|| Err(BrokerError::Unavailable("broker returned too few results".into())))
                    .map_err(|e| self.broker_error(e))
            })
            .collect()
    }

    /// The first check of every publication: a valid channel name (400). It comes before the
    /// caller's permission (which only a [`Target`] is asked about), so a name that cannot
    /// exist is 400 whoever publishes it; the rest waits for [`Node::check_publication`].
    pub fn target<'a>(&self, channel: &'a str) -> Result<Target<'a>, ApiError> {
        validate_channel(channel).map_err(|e| ApiError::new(code::BAD_REQUEST, e.to_string()))?;
        if switchboard_protocol::namespace_of(channel) == crate::alarms::def::NAMESPACE {
            return Err(ApiError::new(code::FORBIDDEN, "alarm channels are published by the node's alarm engine only"));
        }
        Ok(Target(channel))
    }

    /// An alarm's state, published by the alarm engine on its `alarm:` channel
    /// ([`Node::target`] refuses that namespace to every other publisher).
    pub(crate) fn check_alarm_state(&self, channel: &str, data: Data) -> Result<Checked, ApiError> {
        validate_channel(channel).map_err(|e| ApiError::new(code::BAD_REQUEST, e.to_string()))?;
        self.check_publication(Target(channel), data, None, None)
    }

    /// The checks every publication passes after its target ([`Node::target`]) and the
    /// caller's permission, wherever it goes (the broker, or a device as a write,
    /// `crate::sources::write`): data of at most `limits.max_publication_bytes` (413) that
    /// every format can carry (400), a well-formed idempotency key (400) and tags within their
    /// bounds (400, [`switchboard_protocol::filter::check_tags`]). The data is put
    /// on one line, as it is stored and sent: every transport frames messages by line, so a
    /// pretty-printed publication kept verbatim would cut every reply and batch that carries it
    /// ([`switchboard_protocol::message::single_line`]; data already on one line is kept as it
    /// came). The namespace's history policy is attached.
    ///
    /// An idempotency key belongs to its publisher (`(key, publisher)`): the broker is given
    /// it scoped by [`Identity::principal`], so nobody's retry answers for another's
    /// publication, however guessable the keys.
    pub fn check_publication(
        &self,
        target: Target<'_>,
        data: Data,
        idempotency: Option<(&str, &Identity)>,
        tags: Option<switchboard_protocol::filter::Tags>,
    ) -> Result<Checked, ApiError> {
        let channel = target.0;
        if data.get().len() > self.config.limits.max_publication_bytes {
            return Err(ApiError::new(
                code::TOO_LARGE,
                format!("publication data larger than {} bytes", self.config.limits.max_publication_bytes),
            ));
        }
        // Data every subscriber can take, whatever its format (no silent empty deliveries).
        switchboard_protocol::message::check_data(data.get()).map_err(|e| ApiError::new(code::BAD_REQUEST, e))?;
        if let Some((key, _)) = idempotency {
            check_idempotency_key(key).map_err(|e| ApiError::new(code::BAD_REQUEST, e))?;
        }
        let tags = switchboard_protocol::filter::check_tags(tags)
            .map_err(|e| ApiError::new(code::BAD_REQUEST, e.to_string()))?;
        let data = single_line(&data).map(Arc::new).unwrap_or(data);
        let mut item = Outgoing { tags, ..Outgoing::new(channel, data, self.config.history_policy(channel)) };
        // Length-prefixed: no principal and key can spell another pair.
        item.idempotency_key = idempotency.map(|(key, publisher)| {
            let p = publisher.principal();
            Arc::from(format!("{}:{p}:{key}", p.len()))
        });
        Ok(Checked(item))
    }

    /// A publication of the node's own publishers (sources, the simulator), which no caller's
    /// permission governs: [`Node::target`], then [`Node::check_publication`] without an
    /// idempotency key.
    pub fn check_own(&self, channel: &str, data: Data) -> Result<Checked, ApiError> {
        self.check_publication(self.target(channel)?, data, None, None)
    }

    /// A receiver that turns true when the node starts shutting down.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stop_tx.subscribe()
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Relaxed)
    }

    /// Sends every client `disconnect` 4000 and a close frame, then waits (up to `grace`) for
    /// the connections to finish.
    pub async fn shutdown(&self, grace: Duration) {
        self.stopping.store(true, Relaxed);
        let _ = self.stop_tx.send(true);
        let conns: Vec<Arc<Outbox>> = self.conns.lock().values().cloned().collect();
        tracing::info!(connections = conns.len(), "shutting down");
        for ob in conns {
            ob.close(close::SHUTDOWN, "server shutting down", false);
        }
        let deadline = Instant::now() + grace;
        while self.connection_count() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Forgets idle channels in the broker (see [`Broker::forget_idle`]) every half of the
    /// shortest channel ttl configured, between 0.2 s and 10 s. Supervised (task
    /// `channel-sweeper`).
    pub fn spawn_channel_sweeper(self: &Arc<Self>) {
        let shortest = self
            .config
            .namespaces
            .iter()
            .map(|(name, ns)| {
                ns.channel_ttl_s.unwrap_or(if name == "pt" { 0 } else { crate::config::DEFAULT_CHANNEL_TTL_S })
            })
            .filter(|s| *s > 0)
            .min()
            // Channels that were never published go after a while even where channels are kept
            // forever.
            .unwrap_or(switchboard_broker::UNPUBLISHED_KEEP.as_secs());
        let period = (Duration::from_secs(shortest) / 2).clamp(Duration::from_millis(200), Duration::from_secs(10));
        let node = Arc::downgrade(self);
        switchboard_supervisor::spawn("channel-sweeper", move |_| {
            let node = node.clone();
            async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(node) = node.upgrade() else { return };
                    let keep = |ch: &str| node.config.channel_ttl(ch);
                    let n = node.broker.forget_idle(&keep).await;
                    if n > 0 {
                        node.metrics.channels_forgotten.fetch_add(n as u64, Relaxed);
                        tracing::debug!(channels = n, "idle channels forgotten");
                    }
                }
            }
        });
    }

    /// Pings every connection each `ping_s` and closes those silent for three intervals; a
    /// poll session's outbox is left to the session's own expiry. Supervised (task
    /// `heartbeats`).
    pub fn spawn_heartbeats(self: &Arc<Self>) {
        let node = Arc::downgrade(self);
        let period = Duration::from_secs(self.config.limits.ping_s);
        switchboard_supervisor::spawn("heartbeats", move |_| {
            let node = node.clone();
            async move {
                let ping = Bytes::from(websocket::encode_frame(Opcode::Ping, b""));
                let mut tick = tokio::time::interval(period);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let Some(node) = node.upgrade() else { return };
                    let now = crate::unix_s();
                    let limit = 3 * node.config.limits.ping_s;
                    let conns: Vec<Arc<Outbox>> = node.conns.lock().values().cloned().collect();
                    for ob in conns {
                        if ob.expires_with_session() {
                            continue;
                        }
                        if now.saturating_sub(ob.last_seen.load(Relaxed)) >= limit {
                            ob.close(close::STALE, "no pong for three ping intervals", true);
                        } else if ob.websocket() && ob.push_control(ping.clone()) == crate::outbox::Pushed::Schedule {
                            ob.flush();
                        }
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_publication_data_is_kept_on_one_line() {
        let config = Config::load(None, Vec::new(), &[]).unwrap();
        let node = Node::new(config, Arc::new(switchboard_broker::MemoryBroker::new()));
        let target = node.target("room:1").unwrap();
        let one_line = |data: Data| node.check_publication(target, data, None, None).unwrap().data().clone();
        let raw = |s: &str| Arc::new(serde_json::value::RawValue::from_string(s.into()).unwrap());
        let d = one_line(raw("{\"a\":\r\n 1,\n\"s\": \"x\\ny\"}"));
        assert_eq!(d.get(), "{\"a\":   1, \"s\": \"x\\ny\"}");
        let v: serde_json::Value = serde_json::from_str(d.get()).unwrap();
        assert_eq!(v, serde_json::json!({"a": 1, "s": "x\ny"}));
        let same = raw("[1,2]");
        assert!(Arc::ptr_eq(&one_line(same.clone()), &same), "untouched when already one line");
    }

    #[test]
    fn node_broker_errors_keep_the_code_and_leave_the_broker_text_out() {
        let config = Config::load(None, Vec::new(), &[]).unwrap();
        let node = Node::new(config, Arc::new(switchboard_broker::MemoryBroker::new()));
        let detail = || "redis: Connection refused (os error 111) at 127.0.0.1:6390".to_string();
        let e = node.broker_error(BrokerError::Unavailable(detail()));
        assert_eq!(
            (e.code, e.message.as_str()),
            (code::UNAVAILABLE, "broker unavailable; nothing was done, retry later")
        );
        let e = node.broker_error(BrokerError::Unknown(detail()));
        assert_eq!(e.code, code::OUTCOME_UNKNOWN);
        assert!(e.message.contains("idempotency_key") && !e.message.contains("os error"), "{}", e.message);
        let e = node.broker_error_after("done on this node only", BrokerError::Unavailable(detail()));
        assert_eq!((e.code, e.message.as_str()), (code::UNAVAILABLE, "done on this node only: broker unavailable"));
        // The node's own refusals are not internal: they keep saying why.
        let e = node.broker_error(BrokerError::Full("this node holds its maximum of 3 channels".into()));
        assert!(e.code == code::LIMIT && e.message.contains("maximum of 3 channels"), "{}", e.message);
        assert_eq!(node.metrics.broker_unavailable.load(Relaxed), 2);
    }
}
