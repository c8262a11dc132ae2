//! Server-Sent Events: `GET /sse?channels=a,b&initial=true` (SPEC §3, docs/protocol.md).
//!
//! A stream is a session like a WebSocket connection's — same outbox, same hub fan-out of one
//! shared encoding, same limits, permissions, conflation and 4008 bound — whose subscriptions
//! are fixed by the query and whose messages are written as events:
//!
//! - `event: subscribed` first, `data: {"subscribed": {"channels": {ch: {"epoch", "offset",
//!   "complete"} | {"error"}}}}`;
//! - each publication as a default (`message`) event, `data: {"pub": {"ch", "off", "data"}}`,
//!   with `id:` the stream's position (below) — recovered publications and the initial value
//!   (`initial=true`) first, then the live ones;
//! - `event: join` / `event: leave` for presence, `event: disconnect` before the server ends
//!   the stream (4008 slow consumer, 4000 shutdown, 4001 token expired);
//! - a `: ping` comment every `transports.sse_heartbeat_s` seconds of silence, for proxies.
//!
//! **Event ids.** An id is the position of every channel of the stream, `;`-separated:
//! `<ch>@<epoch>:<offset>` — exactly the SPEC form for a one-channel stream. A browser sends
//! the last id back in `Last-Event-ID` when it reconnects (polyfills that cannot set headers
//! use the `lastEventId` query parameter), and the new stream recovers every channel from its
//! position, on this node or any other. Streams of more than [`FULL_ID_CHANNELS`] channels
//! would pay for long ids on every event, so their ids name only the event's own channel: a
//! reconnect recovers the channels the id names and starts the others afresh (`initial`). A
//! client that needs exact recovery for many channels uses a session (long-polling, or SSE
//! attached to one: `GET /sse?session=<id>`, see `transport::poll::stream`).
//!
//! **Layout.** [`open`] admits, checks and subscribes a stream; its outbox frames the events
//! (`events`: the ids, `subscribed`, the recovered and initial publications), which hyper
//! writes from [`handle`]'s response body. [`respond`] drives every event stream's body (a
//! poll session's too, `transport::poll::stream`): taking, waking, the heartbeat, the end.

mod events;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use switchboard_protocol::code::{self, close};
use switchboard_protocol::command::{Command, CommandBody, Deadband, SubscribeRequest};
use switchboard_protocol::{namespace_of, validate_channel};

use crate::auth::limits::IpGuard;
use crate::auth::Action;
use crate::node::Node;
use crate::outbox::Outbox;
use crate::session::Session;
use crate::transport::http::Peer;
use crate::transport::http::{self as transport_http, error, query_flag, query_param};

use events::StreamEvents;
pub use events::{event_name, write_event};

/// Streams with at most this many channels carry every channel's position in each event id.
pub const FULL_ID_CHANNELS: usize = 32;

/// The field a stream starts with: how long a browser waits before reconnecting a dropped
/// stream (1 s).
pub(crate) const RETRY: &[u8] = b"retry: 1000\n\n";

/// The id of the subscribe command a stream sends for its query.
const SUBSCRIBE_ID: u32 = 1;

/// Whether `who` may subscribe to every channel of a stream; `Err` names the first refused
/// one, as the stream's answer says it.
fn permitted(node: &Node, who: &crate::auth::Identity, channels: &[String]) -> Result<(), crate::node::ApiError> {
    let auth = &node.config.security.auth;
    for ch in channels {
        if let Err(e) = auth.check(who, &node.config.namespace(namespace_of(ch)).allow, Action::Subscribe, ch) {
            return Err(crate::node::ApiError::new(e.code, format!("{ch}: {}", e.message)));
        }
    }
    Ok(())
}

/// What an event stream's body is taken from: a stream's framed outbox, or a poll session's
/// messages. [`respond`] drives it; the source only takes and says when to look again.
pub(crate) trait Events: Send + 'static {
    /// What is pending, as events (empty: nothing yet), and whether the stream is over after it.
    fn take(&mut self) -> impl std::future::Future<Output = (Bytes, bool)> + Send;
    /// Resolves when something may be pending, or once the source acted on a timer of its own.
    fn changed(&mut self) -> impl std::future::Future<Output = ()> + Send;
    /// A `: ping` went out.
    fn pinged(&mut self) {}
}

/// The response of an event stream: `events` taken chunk by chunk as hyper writes them, a
/// `: ping` comment after `heartbeat` of silence (for proxies), and the end once the source
/// is over (after its last events).
pub(crate) fn respond(events: impl Events, heartbeat: Duration) -> Response {
    let body = futures_util::stream::unfold(Some(events), move |state| async move {
        let mut events = state?;
        loop {
            let (chunk, over) = events.take().await;
            if !chunk.is_empty() {
                return Some((Ok::<Bytes, Infallible>(chunk), (!over).then_some(events)));
            }
            if over {
                return None;
            }
            tokio::select! {
                _ = events.changed() => {}
                _ = tokio::time::sleep(heartbeat) => {
                    events.pinged();
                    return Some((Ok(Bytes::from_static(PING)), Some(events)));
                }
            }
        }
    });
    let mut r = Response::new(Body::from_stream(body));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, no-transform"));
    // nginx: do not buffer the stream.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// A channel's position in a stream.
pub type ChannelPos = switchboard_protocol::StreamPosition;

/// Parses an event id (`<ch>@<epoch>:<offset>`, `;`-separated) into positions. Channel names
/// may contain `@` and `:`, epochs do not, so both splits are taken from the right.
pub fn parse_event_id(id: &str) -> Result<Vec<(String, ChannelPos)>, String> {
    let mut out = Vec::new();
    for part in id.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || {
            format!("event id part {:?} is not <channel>@<epoch>:<offset>", part.chars().take(80).collect::<String>())
        };
        let (rest, off) = part.rsplit_once(':').ok_or_else(bad)?;
        let (ch, epoch) = rest.rsplit_once('@').ok_or_else(bad)?;
        let offset: u64 = off.parse().map_err(|_| bad())?;
        if epoch.is_empty() || validate_channel(ch).is_err() {
            return Err(bad());
        }
        out.push((ch.to_string(), ChannelPos { epoch: epoch.to_string(), offset }));
    }
    Ok(out)
}

/// A stream admitted and subscribed, before its first event is written.
pub(crate) struct Opened {
    pub session: Session,
    pub outbox: Arc<Outbox>,
    pub slot: Option<IpGuard>,
}

/// Ends a stream's session: leaves the hub and the broker, then the node forgets it.
pub(crate) async fn end(node: Arc<Node>, mut session: Session, outbox: Arc<Outbox>) {
    outbox.close(close::NORMAL, "stream ended", true);
    session.cleanup().await;
    node.unregister(outbox.id);
}

/// A stream whose socket hyper holds: the response body takes its events from the outbox.
struct Stream {
    node: Arc<Node>,
    session: Option<Session>,
    outbox: Arc<Outbox>,
    /// The session's next deadline (token expiry) and its timer.
    deadline: Option<SystemTime>,
    _slot: Option<IpGuard>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        // The client went away or the stream ended.
        let Some(session) = self.session.take() else { return };
        tokio::spawn(end(self.node.clone(), session, self.outbox.clone()));
    }
}

impl Stream {
    /// The client was sent something: the node's heartbeat counts it as alive.
    fn seen(&self) {
        self.outbox.last_seen.store(crate::unix_s(), std::sync::atomic::Ordering::Relaxed);
    }
}

impl Events for Stream {
    async fn take(&mut self) -> (Bytes, bool) {
        let (out, closed) = self.outbox.take_framed();
        if !out.is_empty() {
            self.seen();
        }
        (out, closed.is_some())
    }

    async fn changed(&mut self) {
        let deadline = self.deadline.map(|d| d.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO));
        tokio::select! {
            _ = self.outbox.notified() => {}
            _ = async { match deadline { Some(d) => tokio::time::sleep(d).await, None => std::future::pending().await } } => {
                if let Some(session) = self.session.as_mut() {
                    if let Some(reason) = session.check_deadline() {
                        self.outbox.close(reason.code, &reason.reason, true);
                    }
                    self.deadline = session.deadline();
                }
            }
        }
    }

    fn pinged(&mut self) {
        self.seen();
    }
}

/// The comment a stream sends after `transports.sse_heartbeat_s` of silence.
pub(crate) const PING: &[u8] = b": ping\n\n";

/// `GET /sse`: a stream for the `channels` of the query. `session=<id>` streams a poll
/// session; `transport::poll` routes that.
pub async fn handle(State(node): State<Arc<Node>>, req: Request) -> Response {
    let query = req.uri().query().map(str::to_string);
    let (parts, _) = req.into_parts();
    let mut r = match open(&node, &parts, query.as_deref()).await {
        Err(r) => r,
        Ok(Opened { session, outbox, slot }) => {
            let stream = Stream {
                node: node.clone(),
                deadline: session.deadline(),
                session: Some(session),
                outbox,
                _slot: slot,
            };
            respond(stream, Duration::from_secs(node.config.transports.sse_heartbeat_s))
        }
    };
    transport_http::cors(&parts.headers, &node, &mut r);
    r
}

/// Admits, checks and subscribes a stream; `Err` is the response that refuses it.
pub(crate) async fn open(
    node: &Arc<Node>,
    req: &axum::http::request::Parts,
    q: Option<&str>,
) -> Result<Opened, Response> {
    let admitted = transport_http::admit(node, &req.headers, req.extensions.get::<Peer>(), q, true).await?;
    let auth = &node.config.security.auth;
    // No credentials and a connect hook: the hook decides once the connection exists.
    let hook = admitted.identity.is_none() && auth.has_connect_hook();
    if auth.enabled() && admitted.identity.is_none() && !hook {
        return Err(error(code::UNAUTHORIZED, "credentials required (Authorization header or token query parameter)"));
    }
    let Some(list) = query_param(q, "channels") else {
        return Err(error(code::BAD_REQUEST, "name the channels: /sse?channels=a,b"));
    };
    let mut channels: Vec<String> = Vec::new();
    for ch in list.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        if let Err(e) = validate_channel(ch) {
            return Err(error(
                code::BAD_REQUEST,
                format!("channel {:?}: {e}", ch.chars().take(64).collect::<String>()),
            ));
        }
        if !channels.iter().any(|c| c == ch) {
            channels.push(ch.to_string());
        }
    }
    if channels.is_empty() {
        return Err(error(code::BAD_REQUEST, "name the channels: /sse?channels=a,b"));
    }
    let limits = &node.config.limits;
    let most = limits.max_channels_per_subscribe.min(limits.max_subscriptions);
    if channels.len() > most {
        return Err(error(code::LIMIT, format!("{} channels in one stream; at most {most}", channels.len())));
    }
    let identity = admitted.identity.clone().unwrap_or_else(crate::auth::Identity::anonymous);
    if let (false, Err(e)) = (hook, permitted(node, &identity, &channels)) {
        return Err(error(e.code, e.message));
    }
    let last_id = req
        .headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| query_param(q, "lastEventId"));
    let mut recover = HashMap::new();
    if let Some(id) = last_id.filter(|s| !s.trim().is_empty()) {
        match parse_event_id(&id) {
            Ok(list) => {
                for (ch, pos) in list {
                    if channels.contains(&ch) {
                        recover.insert(ch, pos);
                    }
                }
            }
            Err(e) => return Err(error(code::BAD_REQUEST, format!("Last-Event-ID: {e}"))),
        }
    }
    let initial = query_flag(q, "initial").unwrap_or(false);
    let (max_rate_hz, deadband) = sampling(q).map_err(|e| error(e.code, e.message))?;
    let slot = transport_http::acquire_slot(node, &admitted)?;
    let subscribe = SubscribeRequest {
        channels: channels.clone(),
        // `last` comes with the reply only when asked for; a recovery that finds a gap needs it.
        initial: initial || !recover.is_empty(),
        recover: recover.clone(),
        max_rate_hz,
        deadband,
        trend: None,
        filter: None,
        delta: None,
    };
    let events = StreamEvents::new(channels.clone(), initial, recover, SUBSCRIBE_ID);
    let outbox = node.register_framed(Box::new(events)).map_err(|ob| crate::transport::http::not_registered(&ob))?;
    let mut session = Session::new(node.clone(), outbox.clone());
    session.set_identity(admitted.identity.clone());
    session.set_rate_exempt(admitted.exempt());
    if hook {
        let headers = node.config.hooks.pick_headers(req.headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())));
        let ctx = crate::session::ConnectContext { transport: "sse", headers };
        if let Err(r) = session.connect_with_hook(ctx).await {
            session.outbox().close(r.close, &r.reason, true);
            return Err(error(r.status, r.reason));
        }
        if let Err(e) = permitted(node, session.identity(), &channels) {
            session.outbox().close(close::FORBIDDEN, "not permitted", true);
            return Err(error(e.code, e.message));
        }
    }
    let cmd = Command { id: Some(SUBSCRIBE_ID), body: CommandBody::Subscribe(subscribe) };
    if let Err(reason) = session.command(cmd).await {
        outbox.close(reason.code, &reason.reason, true);
    }
    session.flush();
    Ok(Opened { session, outbox, slot })
}

/// The sampling of a stream's query (`max_rate_hz=F`, `deadband_abs=X` or `deadband_pct=P`).
fn sampling(q: Option<&str>) -> Result<(Option<f64>, Option<Deadband>), crate::node::ApiError> {
    let number = |key: &str| {
        let Some(text) = query_param(q, key) else { return Ok(None) };
        let bad = |why: &str| crate::node::ApiError::new(code::BAD_REQUEST, format!("{key}: {why}"));
        match text.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(Some(v)),
            Ok(_) => Err(bad("not a finite number")),
            Err(_) => Err(bad("not a number")),
        }
    };
    let max_rate_hz = number("max_rate_hz")?;
    let (abs, pct) = (number("deadband_abs")?, number("deadband_pct")?);
    let deadband = (abs.is_some() || pct.is_some()).then_some(Deadband { abs, pct });
    crate::sampling::parse(max_rate_hz, deadband)?;
    Ok((max_rate_hz, deadband))
}

#[cfg(test)]
mod tests {
    use super::events::Positions;
    use super::*;

    #[test]
    fn sse_event_ids_round_trip_with_odd_channel_names() {
        let mut p = Positions { channels: 2, ..Positions::default() };
        p.map.insert("room:a@b".into(), ChannelPos { epoch: "0abc".into(), offset: 7 });
        p.map.insert("pt:x/y=z".into(), ChannelPos { epoch: "ff".into(), offset: 0 });
        let id = p.id(None).unwrap();
        assert_eq!(id, "room:a@b@0abc:7;pt:x/y=z@ff:0");
        let back = parse_event_id(&id).unwrap();
        assert_eq!(back[0], ("room:a@b".to_string(), ChannelPos { epoch: "0abc".into(), offset: 7 }));
        assert_eq!(back[1].0, "pt:x/y=z");
        assert!(parse_event_id("a@e:x").is_err());
        assert!(parse_event_id("nochannel").is_err());
        assert!(parse_event_id("bad name@e:1").is_err());
    }

    #[test]
    fn sse_large_streams_name_only_the_events_channel() {
        let mut p = Positions { channels: FULL_ID_CHANNELS + 1, ..Positions::default() };
        p.map.insert("a".into(), ChannelPos { epoch: "e".into(), offset: 1 });
        p.map.insert("b".into(), ChannelPos { epoch: "e".into(), offset: 2 });
        assert_eq!(p.id(Some("b")).as_deref(), Some("b@e:2"));
        assert_eq!(p.id(None), None);
    }

    #[test]
    fn sse_events_split_raw_line_breaks_into_data_lines() {
        let mut out = Vec::new();
        write_event(&mut out, Some("x"), Some(b"a@e:1"), b"{\"a\":\n1}");
        assert_eq!(out, b"event: x\nid: a@e:1\ndata: {\"a\":\ndata: 1}\n\n");
    }
}
