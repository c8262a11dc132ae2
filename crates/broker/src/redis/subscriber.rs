//! The pub/sub connection under a [`super::link`]: one kind of connection per kind of Redis.
//!
//! - *Classic* (one Redis server, or a Sentinel-managed primary): a dedicated RESP2 pub/sub
//!   connection; `SUBSCRIBE` takes up to a thousand channels per command.
//! - *Sharded* (a Redis Cluster node): sharded pub/sub (`SSUBSCRIBE`, Redis ≥ 7), so that a
//!   publication is delivered by the nodes serving its slot instead of travelling to every
//!   node of the cluster. It runs on a RESP3 connection whose push messages arrive on a
//!   channel; `SSUBSCRIBE` takes the channels of one slot only, so every channel is its own
//!   command (pipelined). A node that no longer serves a slot says so: for a channel that
//!   was subscribed, with an unasked `sunsubscribe` ([`Event::Dropped`]); for a new one, with a
//!   `MOVED` error answered to its `SSUBSCRIBE` ([`Refused`]).

use futures_util::{FutureExt, StreamExt};
use redis::aio::{MultiplexedConnection, PubSubSink, PubSubStream};
use redis::{AsyncConnectionConfig, Client, Msg, ProtocolVersion, PushInfo, PushKind, RedisError, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Sends the (un)subscribe commands and the keepalive PING.
pub(super) enum Sink {
    Classic(PubSubSink),
    Sharded(MultiplexedConnection),
}

/// What arrives on the connection.
pub(super) enum Source {
    Classic(PubSubStream),
    Sharded(UnboundedReceiver<PushInfo>),
}

pub(super) enum Event {
    Message(Msg),
    /// The server ended a subscription it was not asked to end (its slot moved to another node).
    Dropped(String),
}

/// Channels a `SSUBSCRIBE` was refused for (their slot is served elsewhere).
pub(super) struct Refused(pub Vec<String>);

/// Opens a pub/sub connection to the server `client` points at.
pub(super) async fn connect(client: &Client, sharded: bool) -> Result<(Sink, Source), RedisError> {
    if !sharded {
        let (sink, stream) = client.get_async_pubsub().await?.split();
        return Ok((Sink::Classic(sink), Source::Classic(stream)));
    }
    let info = client.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
    let resp3 = Client::open(info.set_redis_settings(settings))?;
    let (tx, rx) = unbounded_channel();
    let config = AsyncConnectionConfig::new().set_push_sender(tx);
    let conn = resp3.get_multiplexed_async_connection_with_config(&config).await?;
    Ok((Sink::Sharded(conn), Source::Sharded(rx)))
}

impl Sink {
    /// Subscribes to `names`. `Err` when the connection failed; the channels a cluster node
    /// refused come back in `Ok(Refused)`.
    pub async fn subscribe(&mut self, names: &[String]) -> Result<Refused, RedisError> {
        match self {
            Sink::Classic(sink) => sink.subscribe(names).await.map(|()| Refused(Vec::new())),
            Sink::Sharded(conn) => {
                let calls = names.iter().map(|name| {
                    let mut conn = conn.clone();
                    async move { redis::cmd("SSUBSCRIBE").arg(name).query_async::<Value>(&mut conn).await }
                });
                let mut refused = Vec::new();
                for (name, r) in names.iter().zip(futures_util::future::join_all(calls).await) {
                    match r {
                        Ok(_) => {}
                        Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => return Err(e),
                        Err(e) => {
                            tracing::debug!(error = %e, "redis cluster node refused a shard channel");
                            refused.push(name.clone());
                        }
                    }
                }
                Ok(Refused(refused))
            }
        }
    }

    pub async fn unsubscribe(&mut self, names: &[String]) -> Result<(), RedisError> {
        match self {
            Sink::Classic(sink) => sink.unsubscribe(names).await,
            Sink::Sharded(conn) => {
                let calls = names.iter().map(|name| {
                    let mut conn = conn.clone();
                    async move { redis::cmd("SUNSUBSCRIBE").arg(name).query_async::<Value>(&mut conn).await }
                });
                for r in futures_util::future::join_all(calls).await {
                    match r {
                        Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => return Err(e),
                        // A channel whose slot moved away is no longer subscribed anyway.
                        _ => {}
                    }
                }
                Ok(())
            }
        }
    }

    pub async fn ping(&mut self) -> Result<(), RedisError> {
        match self {
            Sink::Classic(sink) => sink.ping::<Value>().await.map(drop),
            Sink::Sharded(conn) => redis::cmd("PING").query_async::<Value>(conn).await.map(drop),
        }
    }
}

impl Source {
    /// The next event; `None` when the connection has ended.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            let push = match self {
                Source::Classic(stream) => return stream.next().await.map(Event::Message),
                Source::Sharded(rx) => rx.recv().await?,
            };
            if let Some(event) = sharded_event(push)? {
                return Some(event);
            }
        }
    }

    /// The next event if one is ready: `Some(None)` when the connection has ended, `None` when
    /// nothing is ready.
    pub fn try_next(&mut self) -> Option<Option<Event>> {
        loop {
            let push = match self {
                Source::Classic(stream) => return stream.next().now_or_never().map(|m| m.map(Event::Message)),
                Source::Sharded(rx) => match rx.try_recv() {
                    Ok(push) => push,
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => return None,
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return Some(None),
                },
            };
            match sharded_event(push) {
                None => return Some(None),
                Some(Some(event)) => return Some(Some(event)),
                Some(None) => {}
            }
        }
    }
}

/// A RESP3 push as an event: `None` for the end of the connection, `Some(None)` for pushes of
/// no interest (confirmations of our own commands, which also arrive here).
fn sharded_event(push: PushInfo) -> Option<Option<Event>> {
    match push.kind {
        PushKind::Disconnection => None,
        PushKind::SMessage | PushKind::Message => Some(Msg::from_push_info(push).map(Event::Message)),
        PushKind::SUnsubscribe => {
            let name = push.data.first().and_then(|v| redis::from_redis_value::<String>(v.clone()).ok());
            Some(name.map(Event::Dropped))
        }
        _ => Some(None),
    }
}
