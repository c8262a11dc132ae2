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
//!   the specification wants commands, and counted in [`crate::SourceStats::rebirths`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::{AsyncClient, Event, Incoming, Outgoing, SubscribeFilter};
use switchboard_broker::now_ms;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::sparkplug::{self, Sparkplug};
use crate::SourceCtx;

pub mod backlog;
pub mod backoff;
pub mod commit;
mod config;
mod conn;
pub mod fed;
pub mod host;
pub mod payload;
pub mod refusals;
pub mod target;
mod writes;

pub use crate::DEFAULT_MAX_CHANNELS;
use backlog::Backlog;
use backoff::{Backoff, Flaps};
use config::qos;
pub use config::{MqttConfig, WriteFormat, DEFAULT_MAX_PACKET, LIBRARY_MAX_PACKET, MAX_BUFFER, MIN_BUFFER};
use conn::Conn;
use fed::{Accepted, Fed};
use host::Host;
pub use payload::{decode, point, Template};
use refusals::Refusals;

/// How long a stopping source waits for the batch under way to be committed.
const COMMIT_FINISH: Duration = Duration::from_secs(2);

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
