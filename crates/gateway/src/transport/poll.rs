//! Long-polling (SPEC §3, docs/protocol.md): sessions that live between HTTP requests.
//!
//! - `POST /poll` opens a session and answers `{"session", "node", "poll_timeout_s",
//!   "session_ttl_s"}`; a body, if any, holds the first commands.
//! - `GET /poll/{session}?ack=<seq>` is held until messages are pending (or
//!   `transports.poll_timeout_s`, or `timeout=<s>` if shorter) and answers everything pending in
//!   one batch: `{"seq": n, "messages": [...]}`, each message exactly as on the WebSocket.
//!   `ack` is the `seq` of the last batch the client received: a batch that got lost on the
//!   way is sent again (`ack` one behind), a client further behind is told to recover (4008).
//! - `POST /poll/{session}` carries commands (the WebSocket command bodies, one or several
//!   JSON objects); their replies arrive in the polls, in order with the publications, as on
//!   a WebSocket. The POST answers 202 once the commands ran or were handed to the node that
//!   holds the session.
//! - `DELETE /poll/{session}` ends the session. Sessions also expire after
//!   `transports.poll_session_ttl_s` seconds without a request.
//! - `GET /sse?session=<id>` streams the session's messages as SSE events instead (the SDK's
//!   SSE transport: commands still go by `POST /poll/{session}`).
//!
//! A session is a [`Session`] with an outbox and a [`MessageWire`] like any connection: the
//! same commands, limits, permissions, conflation (a slow poller gets the latest value per
//! point channel) and 4008 bound apply. The session id (128 random bits) is the capability:
//! whoever holds it may poll and send commands.
//!
//! **Moving between nodes.** The node that serves a session keeps a live copy and writes its
//! [`Record`] to the [`PollStore`] (Redis with the Redis broker) after every batch and every
//! command: subscriptions with positions, replies not yet sent, the batch number. A poll
//! arriving at another node takes the session over: under the session's lock it claims the
//! record (compare-and-set), tells the old node to drop its copy, queues the stored replies,
//! resubscribes every channel with `recover` from its stored position and runs commands that
//! were queued for it. Nothing is lost: what the old node had not delivered is recovered from
//! history (a point channel whose history does not reach back gets its latest value; any
//! other such channel gets 4008 so the client recovers itself). Commands posted to a node that
//! does not hold the session are queued in the store and the holder is told to run them, so
//! replies still travel in order with the publications. No sticky sessions are needed; a load
//! balancer that hashes on the session id merely saves the moves.
//!
//! Locks: a session's `live` (Tokio) mutex, then the store's session lock, then the wire's
//! queue (inside the outbox). The registry map is never held across an await.

// Refusals are the response itself (status, body, headers), returned on the cold path of a
// request that answers with it anyway; boxing them would buy nothing.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use indexmap::IndexMap;
use parking_lot::Mutex;
use serde_json::value::RawValue;
use switchboard_protocol::code::{self, close};
use switchboard_protocol::message::{encode_disconnect, encode_error, encode_publication};
use switchboard_protocol::{namespace_of, Format};

use crate::auth::limits::IpGuard;
use crate::auth::pattern::PatternSet;
use crate::auth::{Identity, Method};
use crate::node::Node;
use crate::outbox::Outbox;
use crate::session::Session;
use crate::transport::conn::Peer;
use crate::transport::http::{self as transport_http, error, query_param};
use crate::transport::messages::{Kind, Message, MessageWire};
use crate::transport::poll_store::{self, Notice, PollStore, Record, StoredIdentity, StoredSub};
use crate::transport::sse::{self, ChannelPos, ReplyIn};

/// Id of the subscribe a node sends when it takes a session over; its reply becomes the
/// recovered publications. Clients must not use this id.
pub const RESUBSCRIBE_ID: u32 = u32::MAX;
/// Id given to a client's subscribe that has none, so the session learns the positions; its
/// reply is not delivered (only errors, as `id` 0, like on a WebSocket).
pub const SILENT_ID: u32 = u32::MAX - 1;

/// How long a request waits for a session's lock held by another node.
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// Sweeps for expired and closed sessions this often.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// A session streamed over SSE writes its record at most this often.
const STREAM_SAVE_EVERY: Duration = Duration::from_secs(1);

/// 128 random bits in hex: session ids and lock tokens.
pub fn random_id() -> String {
    let mut b = [0u8; 16];
    if getrandom::getrandom(&mut b).is_err() {
        // No OS randomness (never seen on the supported platforms): fall back to the
        // process's generator rather than refusing service.
        for x in b.iter_mut() {
            *x = fastrand::u8(..);
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Why a session left this node.
const LIVE: u8 = 0;
const MOVED: u8 = 1;
const ENDED: u8 = 2;

/// The live copy of a session on this node.
pub struct PollSession {
    id: String,
    wire: Arc<MessageWire>,
    outbox: Arc<Outbox>,
    live: tokio::sync::Mutex<Live>,
    /// Unix seconds of the last request.
    active: AtomicU64,
    /// Requests in progress (a held poll or a stream counts until it returns).
    busy: AtomicUsize,
    /// Bumped by each poll or stream that starts waiting; an older one sees it and yields.
    waiter: AtomicU64,
    /// `LIVE`, `MOVED` (another node holds it now) or `ENDED`.
    state: AtomicU8,
    /// Subscriptions and the outbox were released.
    cleaned: AtomicBool,
}

struct Live {
    session: Session,
    /// Version of the stored record this copy wrote or read last.
    version: u64,
    seq: u64,
    /// Position of every subscribed channel once the client has everything sent or queued.
    head: IndexMap<String, ChannelPos>,
    /// The last batch, kept to send again if it got lost.
    last_batch: Option<(u64, Bytes)>,
    /// Replies not yet in a batch.
    queued: Vec<String>,
    /// Holds the client address's connection slot while the session lives here.
    _slot: Option<IpGuard>,
}

/// The node's poll sessions.
pub struct Polls {
    node: Arc<Node>,
    store: Arc<dyn PollStore>,
    sessions: Mutex<HashMap<String, Arc<PollSession>>>,
    ttl: Duration,
}

/// The routes of the HTTP transports: `/sse`, `/poll`, `/poll/{session}`.
pub fn router<S: Clone + Send + Sync + 'static>(node: Arc<Node>) -> Router<S> {
    let store = poll_store::for_broker(&node.config.broker).unwrap_or_else(|e| {
        tracing::error!(error = %e, "poll session store unavailable; sessions stay on their node");
        Arc::new(poll_store::MemoryPollStore::new())
    });
    let polls = Polls::start(node, store);
    Router::new()
        .route("/sse", get(sse_route).options(preflight))
        .route("/poll", post(open).options(preflight))
        .route("/poll/{session}", get(poll).post(command).delete(end).options(preflight))
        .with_state(polls)
}

async fn sse_route(State(polls): State<Arc<Polls>>, req: Request) -> Response {
    let query = req.uri().query().map(str::to_string);
    if let Some(id) = query_param(query.as_deref(), "session") {
        return attach_sse(polls, req, id).await;
    }
    sse::handle(State(polls.node.clone()), req).await
}

async fn preflight(State(polls): State<Arc<Polls>>, headers: HeaderMap) -> Response {
    transport_http::preflight(State(polls.node.clone()), headers).await
}

fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn batch_body(seq: u64, messages: &[Bytes]) -> Bytes {
    let len: usize = messages.iter().map(|m| m.len() + 1).sum();
    let mut out = Vec::with_capacity(len + 40);
    out.extend_from_slice(format!("{{\"seq\":{seq},\"messages\":[").as_bytes());
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(m);
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

/// Decrements `busy` when a request ends.
struct Busy(Arc<PollSession>);

impl Busy {
    fn new(s: &Arc<PollSession>) -> Busy {
        s.busy.fetch_add(1, Relaxed);
        s.active.store(crate::unix_s(), Relaxed);
        Busy(s.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.active.store(crate::unix_s(), Relaxed);
        self.0.busy.fetch_sub(1, Relaxed);
    }
}

fn stored_identity(i: &Identity) -> StoredIdentity {
    let list = |p: &Option<Arc<PatternSet>>| p.as_ref().map(|p| p.0.iter().map(|x| x.to_string()).collect());
    StoredIdentity {
        method: match i.method {
            Method::Anonymous => "anonymous",
            Method::Token => "token",
            Method::Password => "password",
            Method::ApiKey(_) => "api_key",
        }
        .to_string(),
        user: i.user.clone(),
        expires: i.expires,
        channels: list(&i.channels),
        publish: list(&i.publish),
    }
}

fn identity_of(s: &StoredIdentity) -> Identity {
    // Patterns that no longer parse grant nothing.
    let set = |l: &Option<Vec<String>>| l.as_ref().map(|l| Arc::new(PatternSet::parse(l).unwrap_or_default()));
    let method = match s.method.as_str() {
        "token" => Method::Token,
        "password" => Method::Password,
        _ => return Identity::anonymous(),
    };
    Identity { method, user: s.user.clone(), channels: set(&s.channels), publish: set(&s.publish), expires: s.expires }
}

/// What a takeover found.
enum Found {
    Session(Arc<PollSession>),
    /// The client is behind what the store can give back: the final batch to answer.
    Lost(Bytes),
}

impl Polls {
    fn start(node: Arc<Node>, store: Arc<dyn PollStore>) -> Arc<Polls> {
        let ttl = Duration::from_secs(node.config.transports.poll_session_ttl_s);
        let polls = Arc::new(Polls { node, store, sessions: Mutex::new(HashMap::new()), ttl });
        let notices = polls.store.listen(&polls.node.id);
        tokio::spawn(notice_task(Arc::downgrade(&polls), notices));
        tokio::spawn(sweep_task(Arc::downgrade(&polls)));
        polls
    }

    fn local(&self, id: &str) -> Option<Arc<PollSession>> {
        self.sessions.lock().get(id).filter(|s| s.state.load(Relaxed) == LIVE).cloned()
    }

    /// A new live copy: wire, outbox (a connection of the node), session.
    fn create(
        &self,
        id: &str,
        identity: Option<Identity>,
        exempt: bool,
        slot: Option<IpGuard>,
    ) -> Result<Arc<PollSession>, Response> {
        let node = &self.node;
        let wire = Arc::new(sse::new_wire(node).record_replies().survive_shutdown(self.store.shared()));
        let outbox = match node.register(Format::Json, wire.clone()) {
            Ok(ob) => ob,
            Err(_) => {
                return Err(match wire.closed() {
                    Some(close::SHUTDOWN) => error(503, "server shutting down"),
                    _ => error(code::LIMIT, "too many connections"),
                })
            }
        };
        let mut session = Session::new(node.clone(), outbox.clone());
        session.set_identity(identity);
        session.set_rate_exempt(exempt);
        Ok(Arc::new(PollSession {
            id: id.to_string(),
            wire,
            outbox,
            live: tokio::sync::Mutex::new(Live {
                session,
                version: 0,
                seq: 0,
                head: IndexMap::new(),
                last_batch: None,
                queued: Vec::new(),
                _slot: slot,
            }),
            active: AtomicU64::new(crate::unix_s()),
            busy: AtomicUsize::new(0),
            waiter: AtomicU64::new(0),
            state: AtomicU8::new(LIVE),
            cleaned: AtomicBool::new(false),
        }))
    }

    fn record_of(&self, live: &Live) -> Record {
        Record {
            version: live.version + 1,
            owner: self.node.id.clone(),
            identity: stored_identity(live.session.identity()),
            seq: live.seq,
            subs: live
                .head
                .iter()
                .map(|(ch, p)| StoredSub { ch: ch.clone(), epoch: p.epoch.clone(), off: p.offset })
                .collect(),
            queued: live.queued.clone(),
        }
    }

    /// Writes the live copy's record. `false`: another node took the session; this copy is
    /// dropped.
    async fn save(&self, s: &Arc<PollSession>, live: &mut Live) -> bool {
        let rec = self.record_of(live);
        match self.store.save(&s.id, live.version, &rec, self.ttl).await {
            Ok(true) => {
                live.version = rec.version;
                true
            }
            Ok(false) => {
                tracing::debug!(session = %s.id, "poll session taken over by another node");
                self.drop_local(s, MOVED, live).await;
                false
            }
            Err(e) => {
                // The live copy goes on; a move in the meantime would start from the last
                // record written.
                tracing::warn!(error = %e, "poll session record not written");
                true
            }
        }
    }

    /// Drops the live copy: leaves the hub and the broker, frees the connection.
    async fn drop_local(&self, s: &Arc<PollSession>, why: u8, live: &mut Live) {
        s.state.store(why, Relaxed);
        {
            let mut map = self.sessions.lock();
            if map.get(&s.id).is_some_and(|x| Arc::ptr_eq(x, s)) {
                map.remove(&s.id);
            }
        }
        s.wire.wake();
        self.release(s, live).await;
    }

    async fn release(&self, s: &Arc<PollSession>, live: &mut Live) {
        if s.cleaned.swap(true, Relaxed) {
            return;
        }
        s.outbox.close(close::NORMAL, "session ended", true);
        live.session.cleanup().await;
        live._slot = None;
        self.node.unregister(s.outbox.id);
    }

    /// The session's live copy, here or taken over from the store.
    async fn find(
        &self,
        id: &str,
        ack: Option<u64>,
        headers: &HeaderMap,
        peer: Option<&Peer>,
    ) -> Result<Found, Response> {
        if let Some(s) = self.local(id) {
            // A client ahead of this copy was served by another node since: the copy is stale
            // (its notice may still be on the way).
            let stale = {
                let mut live = s.live.lock().await;
                let stale = self.store.shared() && ack.is_some_and(|a| a > live.seq);
                if stale {
                    self.drop_local(&s, MOVED, &mut live).await;
                }
                stale
            };
            if !stale {
                return Ok(Found::Session(s));
            }
        }
        let admitted = transport_http::admit(&self.node, headers, peer, None, false).await?;
        self.take_over(id, ack, admitted.exempt(), admitted.limited_ip).await
    }

    /// Takes the session over from the store (see the module docs).
    async fn take_over(
        &self,
        id: &str,
        ack: Option<u64>,
        exempt: bool,
        ip: Option<std::net::IpAddr>,
    ) -> Result<Found, Response> {
        let store_err = |e: poll_store::StoreError| error(code::INTERNAL, e.to_string());
        let token = match self.store.lock(id, LOCK_WAIT).await.map_err(store_err)? {
            Some(t) => t,
            None => return Err(error(503, "session busy; retry")),
        };
        let r = self.take_over_locked(id, ack, exempt, ip).await;
        let _ = self.store.unlock(id, token).await;
        r
    }

    async fn take_over_locked(
        &self,
        id: &str,
        ack: Option<u64>,
        exempt: bool,
        ip: Option<std::net::IpAddr>,
    ) -> Result<Found, Response> {
        let store_err = |e: poll_store::StoreError| error(code::INTERNAL, e.to_string());
        // Someone may have created the live copy here while this request waited for the lock.
        if let Some(s) = self.local(id) {
            return Ok(Found::Session(s));
        }
        let mut rec = None;
        for _ in 0..5 {
            let Some(r) = self.store.load(id).await.map_err(store_err)? else {
                return Err(error(code::NOT_FOUND, "unknown or expired session"));
            };
            if let Some(a) = ack.filter(|a| *a != r.seq) {
                tracing::debug!(session = %id, ack = a, seq = r.seq, "poll session moved with a batch lost");
                let _ = self.store.remove(id).await;
                if !r.owner.is_empty() && r.owner != self.node.id {
                    let _ = self.store.notify(&r.owner, Notice::Moved(id.to_string())).await;
                }
                let bye = Bytes::from(encode_disconnect(
                    Format::Json,
                    close::SLOW_CONSUMER,
                    "the last batch was lost while the session moved; reconnect and recover",
                ));
                return Ok(Found::Lost(batch_body(r.seq + 1, &[bye])));
            }
            // Claim it first, so the old node's next write fails instead of racing this one.
            let claim = Record { version: r.version + 1, owner: self.node.id.clone(), ..r.clone() };
            if self.store.save(id, r.version, &claim, self.ttl).await.map_err(store_err)? {
                if !r.owner.is_empty() && r.owner != self.node.id {
                    let _ = self.store.notify(&r.owner, Notice::Moved(id.to_string())).await;
                }
                rec = Some(claim);
                break;
            }
        }
        let Some(rec) = rec else { return Err(error(503, "session busy; retry")) };
        let slot = match ip {
            Some(ip) => match self.node.config.security.auth.limiter.acquire(ip) {
                Some(g) => Some(g),
                None => return Err(error(code::LIMIT, "too many connections from this address")),
            },
            None => None,
        };
        let identity = identity_of(&rec.identity);
        let s = self.create(id, Some(identity), exempt, slot)?;
        let mut live = s.live.lock().await;
        live.version = rec.version;
        live.seq = rec.seq;
        live.head =
            rec.subs.iter().map(|x| (x.ch.clone(), ChannelPos { epoch: x.epoch.clone(), offset: x.off })).collect();
        live.queued = rec.queued.clone();
        s.wire.push_raw(rec.queued.iter().map(|q| Bytes::from(q.clone())));
        let most = self.node.config.limits.max_channels_per_subscribe.max(1);
        let subs: Vec<&StoredSub> = rec.subs.iter().collect();
        for chunk in subs.chunks(most) {
            let recover: serde_json::Map<String, serde_json::Value> = chunk
                .iter()
                .map(|x| (x.ch.clone(), serde_json::json!({ "epoch": x.epoch, "offset": x.off })))
                .collect();
            let channels: Vec<&str> = chunk.iter().map(|x| x.ch.as_str()).collect();
            let cmd = serde_json::json!({
                "id": RESUBSCRIBE_ID,
                // `last` comes with the reply only when asked for; a point channel whose
                // history does not reach back gets it.
                "subscribe": { "channels": channels, "recover": recover, "initial": true }
            });
            let _ = live.session.handle_payload(cmd.to_string().as_bytes()).await;
            live.session.flush();
        }
        let _ = s.wire.take_replies();
        self.sessions.lock().insert(id.to_string(), s.clone());
        tracing::debug!(session = %id, from = %rec.owner, channels = rec.subs.len(), "poll session taken over");
        let pending = self.store.take_commands(id).await.unwrap_or_default();
        for body in pending {
            if let Err(e) = self.run(&s, &mut live, &body).await {
                tracing::debug!(session = %id, error = %e.message, "queued poll commands refused");
            }
        }
        self.save(&s, &mut live).await;
        drop(live);
        Ok(Found::Session(s))
    }

    /// Runs a command body in the live copy (the caller holds `live`, and the store lock
    /// when the store is shared) and records the replies and positions it produced.
    async fn run(&self, s: &Arc<PollSession>, live: &mut Live, body: &[u8]) -> Result<(), crate::node::ApiError> {
        // All or nothing, as a WebSocket frame: nothing runs if any part is not a command.
        switchboard_protocol::decode_json_frame(body)
            .map_err(|e| crate::node::ApiError::new(code::BAD_REQUEST, e.to_string()))?;
        let (commands, unsubscribed) = rewrite_commands(body)?;
        // One command at a time, each flushed, so replies keep the order of the commands.
        for cmd in commands {
            match live.session.handle_payload(&cmd).await {
                Ok(()) => live.session.flush(),
                Err(reason) => {
                    live.session.flush();
                    tracing::debug!(session = %s.id, code = reason.code, "closing poll session");
                    s.outbox.close(reason.code, &reason.reason, true);
                    break;
                }
            }
        }
        for ch in unsubscribed {
            live.head.shift_remove(&ch);
        }
        for reply in s.wire.take_replies() {
            let reply_id = match crate::transport::messages::classify(&reply) {
                Kind::Reply { id } => id,
                _ => continue,
            };
            if reply_id == RESUBSCRIBE_ID {
                continue;
            }
            if let Ok(ReplyIn { ok: Some(ok), .. }) = serde_json::from_slice::<ReplyIn<'_>>(&reply) {
                for (ch, r) in &ok.channels {
                    if let (None, Some(epoch), Some(offset)) = (&r.error, &r.epoch, r.offset) {
                        live.head.insert(ch.clone(), ChannelPos { epoch: epoch.clone(), offset });
                    }
                }
            }
            live.queued.push(String::from_utf8_lossy(&reply).into_owned());
        }
        Ok(())
    }

    /// Runs a command body as the session's holder: under the store lock, after checking
    /// that no other node took the session meanwhile. `Ok(false)`: it moved.
    async fn run_as_owner(&self, s: &Arc<PollSession>, body: &[u8]) -> Result<bool, Response> {
        let mut live = s.live.lock().await;
        if s.state.load(Relaxed) != LIVE {
            return Ok(false);
        }
        let token = if self.store.shared() {
            let store_err = |e: poll_store::StoreError| error(code::INTERNAL, e.to_string());
            let Some(t) = self.store.lock(&s.id, LOCK_WAIT).await.map_err(store_err)? else {
                return Err(error(503, "session busy; retry"));
            };
            let current = self.store.load(&s.id).await;
            let ours = matches!(&current, Ok(Some(r)) if r.owner == self.node.id && r.version == live.version);
            if !ours {
                let _ = self.store.unlock(&s.id, t).await;
                self.drop_local(s, MOVED, &mut live).await;
                return Ok(false);
            }
            Some(t)
        } else {
            None
        };
        let mut result = Ok(true);
        if !body.is_empty() {
            if let Err(e) = self.run(s, &mut live, body).await {
                result = Err(error(e.code, e.message));
            }
        }
        // Commands queued by other nodes run here too, after this body.
        if self.store.shared() {
            for queued in self.store.take_commands(&s.id).await.unwrap_or_default() {
                let _ = self.run(s, &mut live, &queued).await;
            }
        }
        self.save(s, &mut live).await;
        if let Some(t) = token {
            let _ = self.store.unlock(&s.id, t).await;
        }
        result
    }

    /// Takes what is pending and turns it into the messages of a batch: publications as
    /// they are, the takeover's resubscribe reply into recovered publications, silent
    /// subscribe replies into nothing (or their error). Advances the positions.
    fn take_messages(&self, s: &Arc<PollSession>, live: &mut Live) -> (Vec<Bytes>, Option<u16>) {
        let (msgs, mut closed) = s.wire.take_all();
        let mut out = Vec::with_capacity(msgs.len());
        let mut lost = false;
        for m in msgs {
            lost |= self.transform(live, m, &mut out);
        }
        if lost && closed.is_none() {
            s.outbox.close(
                close::SLOW_CONSUMER,
                "publications were missed while the session moved; reconnect and recover",
                true,
            );
            let (more, c) = s.wire.take_all();
            for m in more {
                self.transform(live, m, &mut out);
            }
            closed = c;
        }
        (out, closed)
    }

    /// One message into the batch; true when a channel's history could not be recovered.
    fn transform(&self, live: &mut Live, m: Message, out: &mut Vec<Bytes>) -> bool {
        match &m.kind {
            Kind::Pub { ch, off } => {
                if let Some(p) = live.head.get_mut(&**ch) {
                    p.offset = p.offset.max(*off);
                }
                out.push(m.text);
                false
            }
            Kind::Reply { id: RESUBSCRIBE_ID } => self.resubscribed(live, &m.text, out),
            Kind::Reply { id: SILENT_ID } => {
                if let Ok(r) = serde_json::from_slice::<ReplyIn<'_>>(&m.text) {
                    let failed =
                        r.error.or_else(|| r.ok.and_then(|ok| ok.channels.into_values().find_map(|c| c.error)));
                    if let Some(e) = failed {
                        out.push(Bytes::from(encode_error(
                            Format::Json,
                            0,
                            e.code,
                            "some channels could not be subscribed",
                        )));
                    }
                }
                false
            }
            _ => {
                out.push(m.text);
                false
            }
        }
    }

    fn resubscribed(&self, live: &mut Live, text: &[u8], out: &mut Vec<Bytes>) -> bool {
        let Ok(ReplyIn { ok: Some(ok), .. }) = serde_json::from_slice::<ReplyIn<'_>>(text) else { return false };
        let mut lost = false;
        let channels: Vec<String> = live.head.keys().filter(|ch| ok.channels.contains_key(*ch)).cloned().collect();
        for ch in channels {
            let Some(r) = ok.channels.get(&ch) else { continue };
            if let Some(e) = &r.error {
                out.push(Bytes::from(encode_error(Format::Json, 0, e.code, &format!("{ch}: {}", e.message))));
                live.head.shift_remove(&ch);
                continue;
            }
            let (Some(epoch), Some(offset)) = (&r.epoch, r.offset) else { continue };
            let from = live.head.get(&ch).filter(|p| &p.epoch == epoch).map(|p| p.offset);
            let mut at = from.unwrap_or(0);
            let start = at;
            for p in r.recovered.iter().filter(|p| p.off > start) {
                out.push(Bytes::from(encode_publication(Format::Json, &p.ch, p.off, p.data)));
                at = p.off;
            }
            if r.complete == Some(false) {
                if self.node.config.namespace(namespace_of(&ch)).conflate {
                    if let Some(l) = r.last.as_ref().filter(|l| from.is_none() || l.off > at) {
                        out.push(Bytes::from(encode_publication(Format::Json, &l.ch, l.off, l.data)));
                    }
                } else {
                    lost = true;
                }
            }
            live.head.insert(ch, ChannelPos { epoch: epoch.clone(), offset });
        }
        lost
    }

    /// The session closed (`code`): the record goes, or — on a node shutdown with a shared
    /// store — stays for another node to continue.
    async fn finish(&self, s: &Arc<PollSession>, live: &mut Live, code: u16) {
        if code == close::SHUTDOWN && self.store.shared() {
            let mut rec = self.record_of(live);
            rec.owner = String::new();
            let _ = self.store.save(&s.id, live.version, &rec, self.ttl).await;
        } else {
            let _ = self.store.remove(&s.id).await;
        }
        self.drop_local(s, ENDED, live).await;
    }

    /// One poll: waits for messages (up to `timeout`), then answers the batch.
    async fn poll_once(&self, s: &Arc<PollSession>, ack: Option<u64>, timeout: Duration) -> Response {
        let _busy = Busy::new(s);
        let me = s.waiter.fetch_add(1, Relaxed) + 1;
        // An older poll of the same session gives way.
        s.wire.wake();
        {
            let live = s.live.lock().await;
            match ack {
                Some(a) if a > live.seq => {
                    return error(code::BAD_REQUEST, format!("ack {a} is ahead of the session's batch {}", live.seq))
                }
                Some(a) if a + 1 == live.seq && live.last_batch.as_ref().is_some_and(|(seq, _)| *seq == live.seq) => {
                    if let Some((seq, body)) = live.last_batch.clone() {
                        tracing::debug!(session = %s.id, seq, "poll batch sent again");
                        return json_response(StatusCode::OK, body);
                    }
                }
                Some(a) if a < live.seq => {
                    s.outbox.close(close::SLOW_CONSUMER, "batches were lost; reconnect and recover", true);
                }
                _ => {}
            }
            drop(live);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match s.state.load(Relaxed) {
                MOVED => return json_response(StatusCode::OK, batch_body(s.live.lock().await.seq, &[])),
                ENDED => return error(code::NOT_FOUND, "unknown or expired session"),
                _ => {}
            }
            if s.waiter.load(Relaxed) != me {
                return error(code::CONFLICT, "superseded by a newer poll of this session");
            }
            if s.wire.has_pending() || s.wire.closed().is_some() {
                break;
            }
            tokio::select! {
                _ = s.wire.notified() => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        let mut live = s.live.lock().await;
        if s.state.load(Relaxed) != LIVE {
            return json_response(StatusCode::OK, batch_body(live.seq, &[]));
        }
        let (messages, closed) = self.take_messages(s, &mut live);
        if messages.is_empty() && closed.is_none() {
            let _ = self.store.touch(&s.id, self.ttl).await;
            return json_response(StatusCode::OK, batch_body(live.seq, &[]));
        }
        let seq = live.seq;
        if !messages.is_empty() {
            live.seq += 1;
            live.queued.clear();
        }
        let body = batch_body(live.seq, &messages);
        live.last_batch = Some((live.seq, body.clone()));
        if let Some(code) = closed {
            self.finish(s, &mut live, code).await;
        } else if !self.save(s, &mut live).await {
            // Another node holds the session now and recovers these from history.
            return json_response(StatusCode::OK, batch_body(seq, &[]));
        }
        json_response(StatusCode::OK, body)
    }
}

/// Gives every subscribe without `id` the silent id (so positions are learned from its
/// reply) and collects the channels of unsubscribes. Publication data is never re-encoded:
/// only subscribe commands are rewritten.
fn rewrite_commands(body: &[u8]) -> Result<(Vec<Vec<u8>>, Vec<String>), crate::node::ApiError> {
    let bad = |e: String| crate::node::ApiError::new(code::BAD_REQUEST, e);
    let mut out = Vec::new();
    let mut unsubscribed = Vec::new();
    for raw in serde_json::Deserializer::from_slice(body).into_iter::<&RawValue>() {
        let raw = raw.map_err(|e| bad(format!("commands are not JSON: {e}")))?;
        let text = raw.get();
        let peek: Option<serde_json::Map<String, serde_json::Value>> =
            if text.contains("\"subscribe\"") || text.contains("\"unsubscribe\"") {
                serde_json::from_str(text).ok()
            } else {
                None
            };
        match peek {
            Some(mut cmd) if cmd.contains_key("subscribe") && !cmd.contains_key("id") => {
                cmd.insert("id".into(), serde_json::Value::from(SILENT_ID));
                out.push(serde_json::Value::Object(cmd).to_string().into_bytes());
            }
            Some(cmd) => {
                if let Some(list) = cmd.get("unsubscribe").and_then(|u| u.get("channels")).and_then(|c| c.as_array()) {
                    unsubscribed.extend(list.iter().filter_map(|c| c.as_str()).map(str::to_string));
                }
                out.push(text.as_bytes().to_vec());
            }
            None => out.push(text.as_bytes().to_vec()),
        }
    }
    if out.is_empty() {
        return Err(bad("no command in the body".into()));
    }
    Ok((out, unsubscribed))
}

fn ack_and_timeout(q: Option<&str>, max: Duration) -> Result<(Option<u64>, Duration), Response> {
    let ack = match query_param(q, "ack") {
        None => None,
        Some(a) => Some(a.parse::<u64>().map_err(|_| error(code::BAD_REQUEST, "ack: expected a batch number"))?),
    };
    let timeout = match query_param(q, "timeout") {
        None => max,
        Some(t) => {
            let s: f64 = t.parse().map_err(|_| error(code::BAD_REQUEST, "timeout: expected seconds"))?;
            if s.is_nan() || s < 0.0 {
                return Err(error(code::BAD_REQUEST, "timeout: expected seconds"));
            }
            Duration::from_secs_f64(s).min(max)
        }
    };
    Ok((ack, timeout))
}

/// `POST /poll`: opens a session.
async fn open(State(polls): State<Arc<Polls>>, req: Request) -> Response {
    let headers = req.headers().clone();
    let mut r = open_inner(&polls, req).await;
    transport_http::cors(&headers, &polls.node, &mut r);
    r
}

async fn read_body(node: &Node, req: Request) -> Result<Bytes, Response> {
    let max = node.config.limits.max_frame_bytes;
    match axum::body::to_bytes(req.into_body(), max).await {
        Ok(b) => Ok(b),
        Err(_) => Err(error(code::TOO_LARGE, format!("commands larger than {max} bytes"))),
    }
}

async fn open_inner(polls: &Arc<Polls>, req: Request) -> Response {
    let node = &polls.node;
    let q = req.uri().query().map(str::to_string);
    let admitted =
        match transport_http::admit(node, req.headers(), req.extensions().get::<Peer>(), q.as_deref(), true).await {
            Ok(a) => a,
            Err(r) => return r,
        };
    let slot = match transport_http::acquire_slot(node, &admitted) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let body = match read_body(node, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let id = random_id();
    let s = match polls.create(&id, admitted.identity.clone(), admitted.exempt(), slot) {
        Ok(s) => s,
        Err(r) => return r,
    };
    {
        let mut live = s.live.lock().await;
        let rec = polls.record_of(&live);
        match polls.store.save(&id, 0, &rec, polls.ttl).await {
            Ok(true) => live.version = rec.version,
            Ok(false) => {
                polls.release(&s, &mut live).await;
                return error(code::INTERNAL, "session id collision");
            }
            Err(e) => {
                polls.release(&s, &mut live).await;
                return error(code::INTERNAL, e.to_string());
            }
        }
    }
    polls.sessions.lock().insert(id.clone(), s.clone());
    if !body.iter().all(u8::is_ascii_whitespace) {
        if let Err(r) = polls.run_as_owner(&s, &body).await {
            return r;
        }
    }
    let t = &node.config.transports;
    let reply = serde_json::json!({
        "session": id,
        "node": node.id,
        "poll_timeout_s": t.poll_timeout_s,
        "session_ttl_s": t.poll_session_ttl_s,
    });
    json_response(StatusCode::OK, reply.to_string())
}

/// `GET /poll/{session}`.
async fn poll(State(polls): State<Arc<Polls>>, Path(id): Path<String>, req: Request) -> Response {
    let headers = req.headers().clone();
    let q = req.uri().query().map(str::to_string);
    let max = Duration::from_secs(polls.node.config.transports.poll_timeout_s);
    let mut r = match ack_and_timeout(q.as_deref(), max) {
        Err(r) => r,
        Ok((ack, timeout)) => match polls.find(&id, ack, req.headers(), req.extensions().get::<Peer>()).await {
            Err(r) => r,
            Ok(Found::Lost(body)) => json_response(StatusCode::OK, body),
            Ok(Found::Session(s)) => polls.poll_once(&s, ack, timeout).await,
        },
    };
    transport_http::cors(&headers, &polls.node, &mut r);
    r
}

/// `POST /poll/{session}`: commands.
async fn command(State(polls): State<Arc<Polls>>, Path(id): Path<String>, req: Request) -> Response {
    let headers = req.headers().clone();
    let peer = req.extensions().get::<Peer>().copied();
    let mut r = command_inner(&polls, &id, &headers, peer, req).await;
    transport_http::cors(&headers, &polls.node, &mut r);
    r
}

async fn command_inner(
    polls: &Arc<Polls>,
    id: &str,
    headers: &HeaderMap,
    peer: Option<Peer>,
    req: Request,
) -> Response {
    let node = &polls.node;
    let body = match read_body(node, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return error(code::BAD_REQUEST, "no command in the body");
    }
    for _ in 0..3 {
        if let Some(s) = polls.local(id) {
            let _busy = Busy::new(&s);
            match polls.run_as_owner(&s, &body).await {
                Ok(true) => return accepted(),
                Ok(false) => continue,
                Err(r) => return r,
            }
        }
        let rec = match polls.store.load(id).await {
            Ok(Some(r)) => r,
            Ok(None) => return error(code::NOT_FOUND, "unknown or expired session"),
            Err(e) => return error(code::INTERNAL, e.to_string()),
        };
        if rec.owner.is_empty() || rec.owner == node.id {
            // Nobody holds it (or this node lost its copy): take it over and run here.
            if let Err(r) = polls.find(id, None, headers, peer.as_ref()).await {
                return r;
            }
            continue;
        }
        // Another node holds the session: queue the commands there, in order.
        if let Err(r) = transport_http::admit(node, headers, peer.as_ref(), None, false).await {
            return r;
        }
        if let Err(e) = polls.store.push_commands(id, &body, polls.ttl).await {
            return error(code::INTERNAL, e.to_string());
        }
        let _ = polls.store.notify(&rec.owner, Notice::Commands(id.to_string())).await;
        return accepted();
    }
    error(503, "session busy; retry")
}

fn accepted() -> Response {
    json_response(StatusCode::ACCEPTED, "{}")
}

/// `DELETE /poll/{session}`: the client leaves.
async fn end(State(polls): State<Arc<Polls>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    if let Some(s) = polls.local(&id) {
        let mut live = s.live.lock().await;
        polls.finish(&s, &mut live, close::NORMAL).await;
    } else {
        match polls.store.load(&id).await {
            Ok(Some(rec)) => {
                let _ = polls.store.remove(&id).await;
                if !rec.owner.is_empty() && rec.owner != polls.node.id {
                    let _ = polls.store.notify(&rec.owner, Notice::Moved(id.clone())).await;
                }
            }
            Ok(None) => return error(code::NOT_FOUND, "unknown or expired session"),
            Err(e) => return error(code::INTERNAL, e.to_string()),
        }
    }
    let mut r = StatusCode::NO_CONTENT.into_response();
    transport_http::cors(&headers, &polls.node, &mut r);
    r
}

/// `GET /sse?session=<id>`: the session's messages as an event stream (see `transport::sse`);
/// each message is a default `message` event whose data is the message.
pub async fn attach_sse(polls: Arc<Polls>, req: Request, id: String) -> Response {
    let headers = req.headers().clone();
    let s = match polls.find(&id, None, req.headers(), req.extensions().get::<Peer>()).await {
        Ok(Found::Session(s)) => s,
        Ok(Found::Lost(_)) => return error(code::NOT_FOUND, "unknown or expired session"),
        Err(r) => return r,
    };
    let busy = Busy::new(&s);
    let me = s.waiter.fetch_add(1, Relaxed) + 1;
    s.wire.wake();
    let heartbeat = Duration::from_secs(polls.node.config.transports.sse_heartbeat_s);
    let state = (polls.clone(), s, busy, me, false, tokio::time::Instant::now());
    let body = futures_util::stream::unfold(state, move |(polls, s, busy, me, mut started, mut saved)| async move {
        let mut out = Vec::new();
        if !started {
            started = true;
            out.extend_from_slice(b"retry: 1000\n\n");
        }
        loop {
            if s.state.load(Relaxed) != LIVE || s.waiter.load(Relaxed) != me {
                if !out.is_empty() {
                    break;
                }
                return None;
            }
            let mut live = s.live.lock().await;
            let (messages, closed) = polls.take_messages(&s, &mut live);
            for m in &messages {
                sse::write_event(&mut out, None, None, m);
            }
            if !messages.is_empty() {
                live.queued.clear();
            }
            if let Some(code) = closed {
                polls.finish(&s, &mut live, code).await;
                break;
            }
            if !messages.is_empty() && saved.elapsed() >= STREAM_SAVE_EVERY {
                saved = tokio::time::Instant::now();
                polls.save(&s, &mut live).await;
            }
            drop(live);
            if !out.is_empty() {
                break;
            }
            tokio::select! {
                _ = s.wire.notified() => {}
                _ = tokio::time::sleep(heartbeat) => {
                    out.extend_from_slice(b": ping\n\n");
                    break;
                }
            }
        }
        s.outbox.last_seen.store(crate::unix_s(), Relaxed);
        Some((Ok::<Bytes, std::convert::Infallible>(Bytes::from(out)), (polls, s, busy, me, started, saved)))
    });
    let mut r = sse::stream_response(Body::from_stream(body));
    transport_http::cors(&headers, &polls.node, &mut r);
    r
}

/// Acts on what other nodes say: drop moved sessions, run commands queued for ours.
async fn notice_task(polls: std::sync::Weak<Polls>, mut rx: tokio::sync::mpsc::UnboundedReceiver<Notice>) {
    while let Some(n) = rx.recv().await {
        let Some(polls) = polls.upgrade() else { return };
        match n {
            Notice::Moved(id) => {
                if let Some(s) = polls.local(&id) {
                    tokio::spawn(async move {
                        let mut live = s.live.lock().await;
                        polls.drop_local(&s, MOVED, &mut live).await;
                    });
                }
            }
            Notice::Commands(id) => {
                if let Some(s) = polls.local(&id) {
                    tokio::spawn(async move {
                        let _ = polls.run_as_owner(&s, &[]).await;
                    });
                }
            }
        }
    }
}

/// Every second (and often while the node stops): expires idle sessions, closes those whose
/// token expired, releases closed ones, and keeps the node's heartbeat from closing the
/// sessions that are alive.
async fn sweep_task(polls: std::sync::Weak<Polls>) {
    let mut stop = match polls.upgrade() {
        Some(p) => p.node.stopping(),
        None => return,
    };
    let mut stopping = false;
    loop {
        let pause = if stopping { Duration::from_millis(50) } else { SWEEP_EVERY };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            r = stop.changed(), if !stopping => {
                if r.is_err() {
                    return;
                }
                stopping = true;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let Some(polls) = polls.upgrade() else { return };
        let list: Vec<Arc<PollSession>> = polls.sessions.lock().values().cloned().collect();
        let now = crate::unix_s();
        for s in list {
            if let Ok(mut live) = s.live.try_lock() {
                let due = live.session.deadline().is_some_and(|d| d <= SystemTime::now());
                if due {
                    if let Some(reason) = live.session.check_deadline() {
                        s.outbox.close(reason.code, &reason.reason, true);
                    }
                }
            }
            if s.busy.load(Relaxed) > 0 {
                s.outbox.last_seen.store(now, Relaxed);
                continue;
            }
            let idle = now.saturating_sub(s.active.load(Relaxed));
            if let Some(code) = s.wire.closed() {
                // Nobody is polling: release what the session holds now; the disconnect waits
                // for the client's next poll (a shutdown's record stays for another node).
                if code == close::SHUTDOWN && polls.store.shared() {
                    if let Ok(mut live) = s.live.try_lock() {
                        polls.finish(&s, &mut live, code).await;
                    }
                } else if let Ok(mut live) = s.live.try_lock() {
                    polls.release(&s, &mut live).await;
                    if idle >= polls.ttl.as_secs() {
                        polls.finish(&s, &mut live, code).await;
                    }
                }
                continue;
            }
            if idle >= polls.ttl.as_secs() {
                if let Ok(mut live) = s.live.try_lock() {
                    tracing::debug!(session = %s.id, idle, "poll session expired");
                    polls.finish(&s, &mut live, close::NORMAL).await;
                }
                continue;
            }
            s.outbox.last_seen.store(now, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_rewrite_gives_silent_subscribes_an_id_and_keeps_data_bytes() {
        let body = br#"{"subscribe":{"channels":["a"]}}
{"id":2,"publish":{"channel":"room:1","data":{"x":1.50,"big":123456789012345678901234567890}}}
{"id":3,"unsubscribe":{"channels":["b","c"]}}"#;
        let (out, unsub) = rewrite_commands(body).unwrap();
        let lines: Vec<String> = out.into_iter().map(|c| String::from_utf8(c).unwrap()).collect();
        assert_eq!(lines.len(), 3);
        let first: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(first["id"], SILENT_ID);
        assert!(lines[1].contains("1.50") && lines[1].contains("123456789012345678901234567890"));
        assert_eq!(unsub, vec!["b", "c"]);
        assert!(rewrite_commands(b"{not json").is_err());
        assert!(rewrite_commands(b"   ").is_err());
    }

    #[test]
    fn poll_batches_concatenate_messages() {
        let b = batch_body(4, &[Bytes::from_static(b"{\"a\":1}"), Bytes::from_static(b"{\"b\":2}")]);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v, serde_json::json!({"seq": 4, "messages": [{"a": 1}, {"b": 2}]}));
        assert_eq!(&batch_body(0, &[])[..], b"{\"seq\":0,\"messages\":[]}");
    }

    #[test]
    fn poll_identities_survive_the_store() {
        let i = Identity {
            method: Method::Token,
            user: "ann".into(),
            channels: Some(Arc::new(PatternSet::parse(&["room:*", "pt:**"]).unwrap())),
            publish: None,
            expires: Some(99),
        };
        let back = identity_of(&stored_identity(&i));
        assert_eq!(back.method, Method::Token);
        assert_eq!(back.user, "ann");
        assert_eq!(back.expires, Some(99));
        assert!(back.channels.as_ref().unwrap().matches("room:7"));
        assert!(!back.channels.as_ref().unwrap().matches("other"));
        assert!(back.publish.is_none());
        assert!(random_id().len() == 32 && random_id() != random_id());
    }
}
