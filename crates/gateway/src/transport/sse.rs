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
//! attached to one: `GET /sse?session=<id>`, see `transport::poll`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::value::RawValue;
use switchboard_protocol::code::{self, close};
use switchboard_protocol::message::{encode_publication, ErrorBody};
use switchboard_protocol::{namespace_of, validate_channel, Format};

use crate::auth::limits::IpGuard;
use crate::auth::Action;
use crate::node::Node;
use crate::outbox::{Kind, Message, Outbox, PullOptions};
use crate::session::Session;
use crate::transport::conn::Peer;
use crate::transport::http::{self as transport_http, error, query_flag, query_param};

/// Streams with at most this many channels carry every channel's position in each event id.
pub const FULL_ID_CHANNELS: usize = 32;

/// How long a browser waits before reconnecting a dropped stream (the `retry:` field).
const RETRY_MS: u32 = 1000;

/// The id of the subscribe command a stream sends for its query.
const SUBSCRIBE_ID: u32 = 1;

/// Appends one event. `data` is one JSON message; the server's JSON has no raw line breaks,
/// but a text with some is still split into `data:` lines (readers join them with `\n`).
pub fn write_event(out: &mut Vec<u8>, event: Option<&str>, id: Option<&str>, data: &[u8]) {
    if let Some(e) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(e.as_bytes());
        out.push(b'\n');
    }
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.push(b'\n');
    }
    for line in data.split(|b| *b == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.strip_suffix(b"\r").unwrap_or(line));
        out.push(b'\n');
    }
    out.push(b'\n');
}

/// The SSE event name of a non-publication message (`None`: the default `message`).
pub fn event_name(m: &Message) -> Option<&'static str> {
    match m.kind {
        Kind::Pub { .. } => None,
        Kind::Disconnect { .. } => Some("disconnect"),
        Kind::Reply { .. } => Some("reply"),
        Kind::Other if m.text.starts_with(b"{\"join\"") => Some("join"),
        Kind::Other if m.text.starts_with(b"{\"leave\"") => Some("leave"),
        // Server-side subscriptions of the connect hook.
        Kind::Other if m.text.starts_with(b"{\"subscribed\"") => Some("subscribed"),
        Kind::Other => Some("message"),
    }
}

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

/// Response headers of an event stream.
pub fn stream_response(body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, no-transform"));
    // nginx: do not buffer the stream.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// A channel's position in a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelPos {
    pub epoch: String,
    pub offset: u64,
}

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

/// The positions of a stream's channels, in subscription order, and the event ids they make.
#[derive(Default)]
struct Positions {
    map: IndexMap<String, ChannelPos>,
    /// Subscribed channels: beyond [`FULL_ID_CHANNELS`] ids name one channel.
    channels: usize,
}

impl Positions {
    fn id(&self, own: Option<&str>) -> Option<String> {
        let one = |ch: &str, p: &ChannelPos| format!("{ch}@{}:{}", p.epoch, p.offset);
        if self.channels > FULL_ID_CHANNELS {
            let ch = own?;
            return self.map.get(ch).map(|p| one(ch, p));
        }
        if self.map.is_empty() {
            return None;
        }
        Some(self.map.iter().map(|(ch, p)| one(ch, p)).collect::<Vec<_>>().join(";"))
    }
}

/// A publication inside a subscribe reply (`last`, `recovered`).
#[derive(Deserialize)]
pub(crate) struct PubIn<'a> {
    pub ch: String,
    pub off: u64,
    #[serde(borrow)]
    pub data: &'a RawValue,
}

/// One channel's result in a subscribe reply.
#[derive(Deserialize)]
pub(crate) struct ChannelResult<'a> {
    pub epoch: Option<String>,
    pub offset: Option<u64>,
    #[serde(borrow, default)]
    pub last: Option<PubIn<'a>>,
    #[serde(borrow, default)]
    pub recovered: Vec<PubIn<'a>>,
    pub complete: Option<bool>,
    pub error: Option<ErrorBody>,
}

#[derive(Deserialize)]
pub(crate) struct SubscribeOk<'a> {
    #[serde(borrow)]
    pub channels: HashMap<String, ChannelResult<'a>>,
}

/// A reply as far as subscribe results go (the session's own encoding of it).
#[derive(Deserialize)]
pub(crate) struct ReplyIn<'a> {
    #[serde(borrow)]
    pub ok: Option<SubscribeOk<'a>>,
    pub error: Option<ErrorBody>,
}

/// One SSE stream: its session and the state that turns messages into events.
struct Stream {
    node: Arc<Node>,
    session: Option<Session>,
    outbox: Arc<Outbox>,
    /// Requested channels, in order.
    channels: Vec<String>,
    initial: bool,
    recover: HashMap<String, ChannelPos>,
    positions: Positions,
    started: bool,
    ended: bool,
    heartbeat: Duration,
    /// The session's next deadline (token expiry) and its timer.
    deadline: Option<SystemTime>,
    _slot: Option<IpGuard>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        // The client went away or the stream ended: leave the hub and the broker.
        let Some(mut session) = self.session.take() else { return };
        let node = self.node.clone();
        let outbox = self.outbox.clone();
        outbox.close(close::NORMAL, "stream ended", true);
        tokio::spawn(async move {
            session.cleanup().await;
            node.unregister(outbox.id);
        });
    }
}

impl Stream {
    /// The next chunk of the body; `None` ends the stream.
    async fn next(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            out.extend_from_slice(format!("retry: {RETRY_MS}\n\n").as_bytes());
        }
        loop {
            let (msgs, closed) = self.outbox.take_messages();
            for m in &msgs {
                self.write(&mut out, m);
            }
            if closed.is_some() {
                self.ended = true;
            }
            if !out.is_empty() {
                self.outbox.last_seen.store(crate::unix_s(), std::sync::atomic::Ordering::Relaxed);
                return Some(Bytes::from(out));
            }
            if self.ended {
                return None;
            }
            let deadline = self.deadline.map(|d| d.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO));
            tokio::select! {
                _ = self.outbox.notified() => {}
                _ = tokio::time::sleep(self.heartbeat) => {
                    self.outbox.last_seen.store(crate::unix_s(), std::sync::atomic::Ordering::Relaxed);
                    return Some(Bytes::from_static(b": ping\n\n"));
                }
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
    }

    fn write(&mut self, out: &mut Vec<u8>, m: &Message) {
        match &m.kind {
            Kind::Pub { ch, off } => {
                if let Some(p) = self.positions.map.get_mut(&**ch) {
                    p.offset = *off;
                }
                let id = self.positions.id(Some(ch));
                write_event(out, None, id.as_deref(), &m.text);
            }
            Kind::Reply { id } if *id == SUBSCRIBE_ID && !self.positions_known() => self.subscribed(out, &m.text),
            _ => write_event(out, event_name(m), None, &m.text),
        }
    }

    fn positions_known(&self) -> bool {
        self.positions.channels > 0
    }

    /// Turns the reply of the stream's subscribe into `subscribed`, then the recovered and
    /// initial publications.
    fn subscribed(&mut self, out: &mut Vec<u8>, text: &[u8]) {
        let reply: ReplyIn<'_> = match serde_json::from_slice(text) {
            Ok(r) => r,
            Err(_) => return write_event(out, Some("reply"), None, text),
        };
        let Some(ok) = reply.ok else { return write_event(out, Some("reply"), None, text) };
        let mut summary = serde_json::Map::new();
        let mut plan: Vec<(&str, &ChannelResult<'_>)> = Vec::new();
        for ch in &self.channels {
            let Some(r) = ok.channels.get(ch) else { continue };
            let entry = match (&r.error, &r.epoch, r.offset) {
                (Some(e), _, _) => serde_json::json!({ "error": e }),
                (None, Some(epoch), Some(offset)) => {
                    // Where a reconnect must resume if the stream breaks before this channel's
                    // recovered and initial publications got through.
                    let before = match self.recover.get(ch) {
                        Some(p) => p.clone(),
                        None if self.initial && r.last.is_some() => {
                            ChannelPos { epoch: epoch.clone(), offset: offset.saturating_sub(1) }
                        }
                        None => ChannelPos { epoch: epoch.clone(), offset },
                    };
                    self.positions.map.insert(ch.clone(), before);
                    plan.push((ch, r));
                    serde_json::json!({ "epoch": epoch, "offset": offset, "complete": r.complete.unwrap_or(true) })
                }
                _ => continue,
            };
            summary.insert(ch.clone(), entry);
        }
        self.positions.channels = self.channels.len().max(1);
        let body = serde_json::json!({ "subscribed": { "channels": summary } });
        let id = self.positions.id(None);
        write_event(out, Some("subscribed"), id.as_deref(), body.to_string().as_bytes());
        for (ch, r) in plan {
            let (Some(epoch), Some(offset)) = (&r.epoch, r.offset) else { continue };
            let from = self.recover.get(ch).filter(|p| &p.epoch == epoch).map(|p| p.offset);
            let mut at = from.unwrap_or(0);
            let emit = |out: &mut Vec<u8>, positions: &mut Positions, p: &PubIn<'_>| {
                // The epoch too: a recovery from another epoch delivers the current one's.
                if let Some(pos) = positions.map.get_mut(ch) {
                    *pos = ChannelPos { epoch: epoch.clone(), offset: p.off };
                }
                let id = positions.id(Some(ch));
                write_event(out, None, id.as_deref(), &encode_publication(Format::Json, &p.ch, p.off, p.data));
            };
            if self.recover.contains_key(ch) {
                let start = at;
                for p in r.recovered.iter().filter(|p| p.off > start) {
                    emit(out, &mut self.positions, p);
                    at = p.off;
                }
                // The history did not reach back (or the epoch changed): the latest value is
                // what can still be given, unless the recovered publications hold it.
                if r.complete == Some(false) {
                    if let Some(l) = r.last.as_ref().filter(|l| l.off > at) {
                        emit(out, &mut self.positions, l);
                    }
                }
            } else if self.initial {
                if let Some(l) = &r.last {
                    emit(out, &mut self.positions, l);
                }
            }
            if let Some(pos) = self.positions.map.get_mut(ch) {
                *pos = ChannelPos { epoch: epoch.clone(), offset };
            }
        }
    }
}

/// `GET /sse`: a stream for the `channels` of the query. (`session=<id>` streams a poll
/// session instead; `transport::poll` routes that.)
pub async fn handle(State(node): State<Arc<Node>>, req: Request) -> Response {
    let query = req.uri().query().map(str::to_string);
    let q = query.as_deref();
    let (parts, _) = req.into_parts();
    let mut r = open(&node, &parts, q).await;
    transport_http::cors(&parts.headers, &node, &mut r);
    r
}

async fn open(node: &Arc<Node>, req: &axum::http::request::Parts, q: Option<&str>) -> Response {
    let admitted = match transport_http::admit(node, &req.headers, req.extensions.get::<Peer>(), q, true).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let auth = &node.config.security.auth;
    // No credentials and a connect hook: the hook decides once the connection exists.
    let hook = admitted.identity.is_none() && auth.has_connect_hook();
    if auth.enabled() && admitted.identity.is_none() && !hook {
        return error(code::UNAUTHORIZED, "credentials required (Authorization header or token query parameter)");
    }
    let Some(list) = query_param(q, "channels") else {
        return error(code::BAD_REQUEST, "name the channels: /sse?channels=a,b");
    };
    let mut channels: Vec<String> = Vec::new();
    for ch in list.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        if let Err(e) = validate_channel(ch) {
            return error(code::BAD_REQUEST, format!("channel {:?}: {e}", ch.chars().take(64).collect::<String>()));
        }
        if !channels.iter().any(|c| c == ch) {
            channels.push(ch.to_string());
        }
    }
    if channels.is_empty() {
        return error(code::BAD_REQUEST, "name the channels: /sse?channels=a,b");
    }
    let limits = &node.config.limits;
    let most = limits.max_channels_per_subscribe.min(limits.max_subscriptions);
    if channels.len() > most {
        return error(code::LIMIT, format!("{} channels in one stream; at most {most}", channels.len()));
    }
    let identity = admitted.identity.clone().unwrap_or_else(crate::auth::Identity::anonymous);
    if let (false, Err(e)) = (hook, permitted(node, &identity, &channels)) {
        return error(e.code, e.message);
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
            Err(e) => return error(code::BAD_REQUEST, format!("Last-Event-ID: {e}")),
        }
    }
    let initial = query_flag(q, "initial").unwrap_or(false);
    // Sampling (`max_rate_hz=F`, `deadband_abs=X` or `deadband_pct=P`), as in a subscribe.
    let mut sampling = serde_json::Map::new();
    for (key, field) in [("max_rate_hz", None), ("deadband_abs", Some("abs")), ("deadband_pct", Some("pct"))] {
        let Some(text) = query_param(q, key) else { continue };
        let Ok(v) = text.parse::<f64>() else { return error(code::BAD_REQUEST, format!("{key}: not a number")) };
        let Some(number) = serde_json::Number::from_f64(v) else {
            return error(code::BAD_REQUEST, format!("{key}: not a finite number"));
        };
        match field {
            None => sampling.insert(key.into(), number.into()),
            Some(f) => sampling
                .entry("deadband")
                .or_insert_with(|| serde_json::json!({}))
                .as_object_mut()
                .and_then(|band| band.insert(f.into(), number.into())),
        };
    }
    let deadband = sampling.get("deadband").cloned().map(serde_json::from_value);
    let rate = sampling.get("max_rate_hz").and_then(serde_json::Value::as_f64);
    if let Err(e) = crate::sampling::parse(rate, deadband.transpose().ok().flatten()) {
        return error(e.code, e.message);
    }
    let slot = match transport_http::acquire_slot(node, &admitted) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let outbox = match node.register_pull(PullOptions::default()) {
        Ok(ob) => ob,
        Err(ob) => {
            return match ob.closed() {
                Some(close::SHUTDOWN) => error(503, "server shutting down"),
                _ => error(code::LIMIT, "too many connections"),
            }
        }
    };
    let mut session = Session::new(node.clone(), outbox.clone());
    session.set_identity(admitted.identity.clone());
    session.set_rate_exempt(admitted.exempt());
    if hook {
        let headers = node.config.hooks.pick_headers(req.headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())));
        let ctx = crate::session::ConnectContext { transport: "sse", headers };
        if let Err(r) = session.connect_with_hook(ctx).await {
            session.outbox().close(r.close, &r.reason, true);
            return error(r.status, r.reason);
        }
        if let Err(e) = permitted(node, session.identity(), &channels) {
            session.outbox().close(close::FORBIDDEN, "not permitted", true);
            return error(e.code, e.message);
        }
    }
    // `last` comes with the reply only when asked for; a recovery that finds a gap needs it.
    let mut body = serde_json::json!({ "channels": channels, "initial": initial || !recover.is_empty() });
    for (k, v) in sampling {
        body[k] = v;
    }
    if !recover.is_empty() {
        let r: serde_json::Map<String, serde_json::Value> = recover
            .iter()
            .map(|(ch, p)| (ch.clone(), serde_json::json!({ "epoch": p.epoch, "offset": p.offset })))
            .collect();
        body["recover"] = serde_json::Value::Object(r);
    }
    let cmd = serde_json::json!({ "id": SUBSCRIBE_ID, "subscribe": body }).to_string();
    if let Err(reason) = session.handle_payload(cmd.as_bytes()).await {
        outbox.close(reason.code, &reason.reason, true);
    }
    session.flush();
    let deadline = session.deadline();
    let stream = Stream {
        node: node.clone(),
        session: Some(session),
        outbox,
        channels,
        initial,
        recover,
        positions: Positions::default(),
        started: false,
        ended: false,
        heartbeat: Duration::from_secs(node.config.transports.sse_heartbeat_s),
        deadline,
        _slot: slot,
    };
    let body =
        futures_util::stream::unfold(
            stream,
            |mut s| async move { s.next().await.map(|b| (Ok::<Bytes, Infallible>(b), s)) },
        );
    stream_response(Body::from_stream(body))
}

#[cfg(test)]
mod tests {
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
        write_event(&mut out, Some("x"), Some("a@e:1"), b"{\"a\":\n1}");
        assert_eq!(out, b"event: x\nid: a@e:1\ndata: {\"a\":\ndata: 1}\n\n");
    }
}
