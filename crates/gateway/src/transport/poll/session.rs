//! The live side of long-poll sessions: [`Polls`], a node's sessions, and [`PollSession`],
//! one session's live copy — its [`Session`] and the outbox its polls take from — with what makes it
//! movable: writing its [`Record`] after every batch and command, running commands as its
//! holder, and turning pending messages into batches. Taking a session over from the store is
//! `transport::poll::takeover`; `transport::poll` has the HTTP side (routes, requests, the
//! sweeper); the protocol and the rules for moving between nodes are in its module docs.
//!
//! Locks: a session's `live` (Tokio) mutex, then the store's session lock, then the outbox's
//! state. The registry map is never held across an await.

// Refusals are the response itself (status, body, headers), returned on the cold path of a
// request that answers with it anyway; boxing them would buy nothing.
#![allow(clippy::result_large_err)]
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use indexmap::IndexMap;
use parking_lot::Mutex;
use switchboard_broker::SessionStore;
use switchboard_protocol::code::{self, close};
use switchboard_protocol::message::{encode_error, encode_publication};
use switchboard_protocol::{namespace_of, Format};

use crate::auth::limits::IpGuard;
use crate::auth::Identity;
use crate::auth::StoredIdentity;
use crate::log_limit::LogLimit;
use crate::message::{pub_of, Kind, Message, Outcome, Outcomes};
use crate::node::Node;
use crate::outbox::{Outbox, PullOptions};
use crate::session::Session;
use crate::transport::http::Peer;
use crate::transport::http::{self as transport_http, error};
use crate::transport::poll::record::{is_session_id, Record, StoreError, StoredSub};
use crate::transport::poll::wire::{batch_body, rewrite_commands, silent_reply, RESUBSCRIBE_ID, SILENT_ID};
use crate::transport::sse::ChannelPos;

/// How long a request waits for a session's lock held by another node.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(5);
/// Sweeps for expired and closed sessions this often.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// A session streamed over SSE writes its record at most this often.
pub(crate) const STREAM_SAVE_EVERY: Duration = Duration::from_secs(1);

/// Why a session left this node.
pub(crate) const LIVE: u8 = 0;
pub(crate) const MOVED: u8 = 1;
pub(crate) const ENDED: u8 = 2;

/// The live copy of a session on this node.
pub struct PollSession {
    pub(crate) id: String,
    pub(crate) outbox: Arc<Outbox>,
    pub(crate) live: tokio::sync::Mutex<Live>,
    /// Unix seconds of the last request.
    pub(crate) active: AtomicU64,
    /// Unix seconds when this copy last set its record's lease ([`Polls::lease`]).
    pub(crate) leased: AtomicU64,
    /// Requests in progress (a held poll or a stream counts until it returns).
    pub(crate) busy: AtomicUsize,
    /// Bumped by each poll or stream that starts waiting; an older one sees it and yields.
    pub(crate) waiter: AtomicU64,
    /// `LIVE`, `MOVED` (another node holds it now) or `ENDED`.
    pub(crate) state: AtomicU8,
    /// Subscriptions and the outbox were released.
    pub(crate) cleaned: AtomicBool,
}

impl PollSession {
    /// Makes the caller (a poll or a stream starting, counted in `busy`) the session's current
    /// waiter: an older poll or stream gives way. Its number, for [`PollSession::serves`].
    pub(crate) fn take_turn(&self) -> u64 {
        let me = self.waiter.fetch_add(1, Relaxed) + 1;
        // Only another request in progress can be waiting; a wake-up nobody waits for would
        // be kept, and end the caller's own first wait at once.
        if self.busy.load(Relaxed) > 1 {
            self.outbox.wake();
        }
        me
    }

    /// Whether waiter `me` still serves the session: it is live here and no later poll or
    /// stream took its turn.
    pub(crate) fn serves(&self, me: u64) -> bool {
        self.state.load(Relaxed) == LIVE && self.waiter.load(Relaxed) == me
    }
}

pub(crate) struct Live {
    pub(crate) session: Session,
    /// Version of the stored record this copy wrote or read last.
    pub(crate) version: u64,
    pub(crate) seq: u64,
    /// Position of every subscribed channel once the client has everything sent or queued.
    pub(crate) head: IndexMap<String, ChannelPos>,
    /// The last batch, kept to send again if it got lost.
    pub(crate) last_batch: Option<(u64, Bytes)>,
    /// Replies not yet in a batch.
    pub(crate) queued: Vec<String>,
    /// Holds the client address's connection slot while the session lives here.
    pub(crate) _slot: Option<IpGuard>,
}

/// The node's poll sessions.
pub struct Polls {
    pub(crate) node: Arc<Node>,
    pub(crate) sessions: Mutex<HashMap<String, Arc<PollSession>>>,
    pub(crate) ttl: Duration,
}

/// A failure of the session store, as the request's answer: 500 with what the store said.
pub(crate) fn store_error(e: impl Into<StoreError>) -> Response {
    error(code::INTERNAL, e.into().to_string())
}

pub(crate) fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Decrements `busy` when a request ends.
pub(crate) struct Busy(Arc<PollSession>);

impl Busy {
    pub(crate) fn new(s: &Arc<PollSession>) -> Busy {
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

/// A poll that started ([`Polls::start_poll`]).
pub(crate) struct Started {
    /// Keeps the session from expiring while the poll lives.
    _busy: Busy,
    /// The poll's turn as the session's waiter, for [`PollSession::serves`].
    pub(crate) me: u64,
}

/// What a takeover found.
pub(crate) enum Found {
    Session(Arc<PollSession>),
    /// The client is behind what the store can give back: the final batch to answer.
    Lost(Bytes),
}

impl Polls {
    /// The node's sessions; the transport starts their notice and sweep tasks
    /// (`poll::notice_task`, `poll::sweep_task`).
    pub(crate) fn new(node: Arc<Node>) -> Arc<Polls> {
        let ttl = Duration::from_secs(node.config.transports.poll_session_ttl_s);
        Arc::new(Polls { node, sessions: Mutex::new(HashMap::new()), ttl })
    }

    /// Where sessions keep their state: the broker's session store
    /// ([`switchboard_broker::sessions`]; Redis with the Redis brokers).
    pub(crate) fn store(&self) -> &dyn SessionStore {
        self.node.broker.sessions()
    }

    /// The session's stored record (none for an id no session can have).
    pub(crate) async fn load_record(&self, id: &str) -> Result<Option<Record>, StoreError> {
        if !is_session_id(id) {
            return Ok(None);
        }
        self.store().load(id).await?.map(Record::from_stored).transpose()
    }

    /// Writes `rec` if the stored version is still `expected` ([`SessionStore::save`], with
    /// the sessions' ttl). `Ok(false)`: another node wrote it since, and nothing was written.
    pub(crate) async fn save_record(&self, id: &str, expected: u64, rec: &Record) -> Result<bool, StoreError> {
        Ok(self.store().save(id, expected, &rec.stored()?, self.ttl).await?)
    }

    pub(crate) fn local(&self, id: &str) -> Option<Arc<PollSession>> {
        self.sessions.lock().get(id).filter(|s| s.state.load(Relaxed) == LIVE).cloned()
    }

    /// A new live copy: outbox (a connection of the node) and session.
    pub(crate) fn create(
        &self,
        id: &str,
        identity: Option<Identity>,
        exempt: bool,
        slot: Option<IpGuard>,
    ) -> Result<Arc<PollSession>, Response> {
        let node = &self.node;
        let options =
            PullOptions { record_replies: true, survive_shutdown: self.store().shared(), expires_with_session: true };
        let outbox = node.register_pull(options).map_err(|ob| crate::transport::http::not_registered(&ob))?;
        let mut session = Session::new(node.clone(), outbox.clone());
        session.set_identity(identity);
        session.set_rate_exempt(exempt);
        session.set_limited_ip(slot.as_ref().map(|g| g.ip()));
        Ok(Arc::new(PollSession {
            id: id.to_string(),
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
            leased: AtomicU64::new(crate::unix_s()),
            busy: AtomicUsize::new(0),
            waiter: AtomicU64::new(0),
            state: AtomicU8::new(LIVE),
            cleaned: AtomicBool::new(false),
        }))
    }

    pub(crate) fn record_of(&self, live: &Live) -> Record {
        Record {
            version: live.version + 1,
            owner: self.node.id.clone(),
            identity: StoredIdentity::of(live.session.identity()),
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
    pub(crate) async fn save(&self, s: &Arc<PollSession>, live: &mut Live) -> bool {
        let rec = self.record_of(live);
        match self.save_record(&s.id, live.version, &rec).await {
            Ok(true) => {
                live.version = rec.version;
                s.leased.store(crate::unix_s(), Relaxed);
                true
            }
            Ok(false) => {
                tracing::debug!(session = %s.id, "poll session taken over by another node");
                self.drop_local(s, MOVED, live).await;
                false
            }
            Err(e) => {
                // The live copy goes on; a move in the meantime would start from the last
                // record written. Every session's polls meet the same store failure: one line
                // per interval for all of them.
                static RECORD_FAILED: LogLimit = LogLimit::new();
                if let Some(suppressed) = RECORD_FAILED.admit() {
                    tracing::warn!(error = %e, suppressed, "poll session record not written");
                }
                true
            }
        }
    }

    /// Whether a quarter of the session's lease is spent at `now` (unix seconds).
    pub(crate) fn lease_spent(&self, s: &PollSession, now: u64) -> bool {
        now.saturating_sub(s.leased.load(Relaxed)) >= self.ttl.as_secs() / 4
    }

    /// Sets the record's lease to a full `ttl` from now, and notes when.
    pub(crate) async fn lease(&self, s: &PollSession) {
        s.leased.store(crate::unix_s(), Relaxed);
        let _ = self.store().touch(&s.id, self.ttl).await;
    }

    /// Drops the live copy: leaves the hub and the broker, frees the connection.
    pub(crate) async fn drop_local(&self, s: &Arc<PollSession>, why: u8, live: &mut Live) {
        s.state.store(why, Relaxed);
        {
            let mut map = self.sessions.lock();
            if map.get(&s.id).is_some_and(|x| Arc::ptr_eq(x, s)) {
                map.remove(&s.id);
            }
        }
        s.outbox.wake();
        // Boxed: the session's teardown waits on the broker, a large future that every poll
        // (which may end up here) would otherwise carry.
        Box::pin(self.release(s, live)).await;
    }

    pub(crate) async fn release(&self, s: &Arc<PollSession>, live: &mut Live) {
        if s.cleaned.swap(true, Relaxed) {
            return;
        }
        s.outbox.close(close::NORMAL, "session ended", true);
        live.session.cleanup().await;
        live._slot = None;
        self.node.unregister(s.outbox.id);
    }

    /// The session's live copy, here or taken over from the store.
    pub(crate) async fn find(
        &self,
        id: &str,
        ack: Option<u64>,
        headers: &HeaderMap,
        peer: Option<&Peer>,
    ) -> Result<Found, Response> {
        if !is_session_id(id) {
            return Err(error(code::NOT_FOUND, "unknown or expired session"));
        }
        if let Some(s) = self.local(id) {
            // A client ahead of this copy was served by another node since: the copy is stale
            // (its notice may still be on the way). Only a shared store has other nodes.
            if !self.store().shared() || ack.is_none() {
                return Ok(Found::Session(s));
            }
            let mut live = s.live.lock().await;
            if ack.is_some_and(|a| a <= live.seq) {
                drop(live);
                return Ok(Found::Session(s));
            }
            self.drop_local(&s, MOVED, &mut live).await;
        }
        // Boxed: a takeover waits on the store, a large future that a poll of a session held
        // here (every poll but a session's first on this node) would otherwise carry.
        Box::pin(async {
            let admitted = transport_http::admit(&self.node, headers, peer, None, false).await?;
            self.take_over(id, ack, admitted.exempt(), admitted.limited_ip).await
        })
        .await
    }

    /// Runs a command body in the live copy (the caller holds `live`, and the store lock
    /// when the store is shared) and records the replies and positions it produced.
    pub(crate) async fn run(
        &self,
        s: &Arc<PollSession>,
        live: &mut Live,
        body: &[u8],
    ) -> Result<(), crate::node::ApiError> {
        if let Some(reason) = live.session.check_deadline() {
            // Expired before the sweeper noticed: nothing runs with the old token.
            s.outbox.close(reason.code, &reason.reason, true);
            return Err(crate::node::ApiError::new(code::UNAUTHORIZED, reason.reason));
        }
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
        for reply in s.outbox.take_replies() {
            let Kind::Reply { id, outcomes, .. } = &reply.kind else { continue };
            if *id == RESUBSCRIBE_ID {
                continue;
            }
            for (ch, r) in outcomes.iter().flat_map(Outcomes::iter) {
                if let Outcome::Ok { position, .. } = r {
                    let pos = ChannelPos { epoch: position.epoch.to_string(), offset: position.offset };
                    live.head.insert(ch.to_string(), pos);
                }
            }
            // Kept as the client is to get it, for a node that takes the session over.
            let text = match *id {
                SILENT_ID => match silent_reply(&reply.kind) {
                    Some(text) => text,
                    None => continue,
                },
                _ => reply.text,
            };
            live.queued.push(String::from_utf8_lossy(&text).into_owned());
        }
        Ok(())
    }

    /// Runs a command body as the session's holder: under the store lock, after checking
    /// that no other node took the session meanwhile. `Ok(false)`: it moved.
    pub(crate) async fn run_as_owner(&self, s: &Arc<PollSession>, body: &[u8]) -> Result<bool, Response> {
        let mut live = s.live.lock().await;
        if s.state.load(Relaxed) != LIVE {
            return Ok(false);
        }
        if s.cleaned.load(Relaxed) || s.outbox.closed().is_some() {
            // Closed (4008, 4001, ...): only its disconnect is left for the next poll. Running
            // commands would subscribe and join presence again with nothing left to undo it.
            return Err(error(code::NOT_FOUND, "unknown or expired session"));
        }
        let token = if self.store().shared() {
            let Some(t) = self.store().lock(&s.id, LOCK_WAIT).await.map_err(store_error)? else {
                return Err(error(503, "session busy; retry"));
            };
            let current = self.load_record(&s.id).await;
            let ours = matches!(&current, Ok(Some(r)) if r.owner == self.node.id && r.version == live.version);
            if !ours {
                let _ = self.store().unlock(&s.id, t).await;
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
        if self.store().shared() {
            for queued in self.store().take_commands(&s.id).await.unwrap_or_default() {
                let _ = self.run(s, &mut live, &queued).await;
            }
        }
        self.save(s, &mut live).await;
        if let Some(t) = token {
            let _ = self.store().unlock(&s.id, t).await;
        }
        result
    }

    /// Takes what is pending and turns it into the messages of a batch: publications as
    /// they are, the takeover's resubscribe reply into recovered publications, silent
    /// subscribe replies into nothing (or their error). Advances the positions.
    pub(crate) fn take_messages(&self, s: &Arc<PollSession>, live: &mut Live) -> (Vec<Bytes>, Option<u16>) {
        let (msgs, mut closed) = s.outbox.take_messages();
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
            let (more, c) = s.outbox.take_messages();
            for m in more {
                self.transform(live, m, &mut out);
            }
            closed = c;
        }
        (out, closed)
    }

    /// One message into the batch; true when a channel's history could not be recovered.
    pub(crate) fn transform(&self, live: &mut Live, m: Message, out: &mut Vec<Bytes>) -> bool {
        match &m.kind {
            Kind::Pub { ch, off } => {
                if let Some(p) = live.head.get_mut(&**ch) {
                    p.offset = p.offset.max(*off);
                }
                out.push(m.text);
                false
            }
            Kind::Reply { id: RESUBSCRIBE_ID, outcomes, .. } => {
                outcomes.as_ref().is_some_and(|outcomes| self.resubscribed(live, outcomes, out))
            }
            Kind::Reply { id: SILENT_ID, .. } => {
                out.extend(silent_reply(&m.kind));
                false
            }
            _ => {
                out.push(m.text);
                false
            }
        }
    }

    /// The reply to a takeover's resubscribe into what the client missed: the recovered
    /// publications past each channel's position, or its latest value when the history does
    /// not reach back; true when a channel's history could not be recovered.
    pub(crate) fn resubscribed(&self, live: &mut Live, outcomes: &Outcomes, out: &mut Vec<Bytes>) -> bool {
        let mut lost = false;
        for (ch, r) in outcomes.iter() {
            if !live.head.contains_key(ch) {
                continue;
            }
            let (position, last, recovered, complete) = match r {
                Outcome::Ok { position, last, recovered, complete, .. } => (position, last, recovered, *complete),
                Outcome::Err(e) => {
                    // 413, past the reply's budget: a later command of the takeover subscribes
                    // it again and recovers it. 503, its shard fails over: the session closes
                    // with 4008 and the client's own subscribe (asked again while refused)
                    // recovers it.
                    lost |= e.code == code::UNAVAILABLE;
                    if e.code != code::TOO_LARGE && e.code != code::UNAVAILABLE {
                        out.push(Bytes::from(encode_error(Format::Json, 0, e.code, &format!("{ch}: {}", e.message))));
                        live.head.shift_remove(ch);
                    }
                    continue;
                }
            };
            let from = live.head.get(ch).filter(|p| *p.epoch == *position.epoch).map(|p| p.offset);
            let mut at = from.unwrap_or(0);
            let start = at;
            for p in recovered.iter().filter(|p| p.offset > start) {
                out.push(Bytes::from(encode_publication(Format::Json, pub_of(ch, p))));
                at = p.offset;
            }
            if !complete {
                if self.node.config.namespace(namespace_of(ch)).conflate {
                    if let Some(l) = last.as_ref().filter(|l| from.is_none() || l.offset > at) {
                        out.push(Bytes::from(encode_publication(Format::Json, pub_of(ch, l))));
                    }
                } else {
                    lost = true;
                }
            }
            live.head.insert(ch.to_string(), ChannelPos { epoch: position.epoch.to_string(), offset: position.offset });
        }
        lost
    }

    /// The session closed (`code`): the record goes, or — on a node shutdown with a shared
    /// store — stays for another node to continue.
    pub(crate) async fn finish(&self, s: &Arc<PollSession>, live: &mut Live, code: u16) {
        if code == close::SHUTDOWN && self.store().shared() {
            let mut rec = self.record_of(live);
            rec.owner = String::new();
            let _ = self.save_record(&s.id, live.version, &rec).await;
        } else {
            let _ = self.store().remove(&s.id).await;
        }
        self.drop_local(s, ENDED, live).await;
    }

    /// Starts a poll of `s`: it becomes the session's waiter (kept from expiring while
    /// [`Started`] lives) and its `ack` is checked. `Err`: the answer, at once — the last
    /// batch again, or an error. The poll then waits for its answer
    /// ([`Polls::wait_and_answer`]).
    #[allow(clippy::result_large_err)]
    pub(crate) async fn start_poll(&self, s: &Arc<PollSession>, ack: Option<u64>) -> Result<Started, Response> {
        let busy = Busy::new(s);
        let me = s.take_turn();
        self.check_ack(s, ack).await?;
        Ok(Started { _busy: busy, me })
    }

    /// What a poll's `ack` asks before it waits: the last batch again (it got lost), or an
    /// error; `Ok`: go on. Acks of lost batches close the session (4008).
    async fn check_ack(&self, s: &Arc<PollSession>, ack: Option<u64>) -> Result<(), Response> {
        let live = s.live.lock().await;
        match ack {
            Some(a) if a > live.seq => {
                return Err(error(code::BAD_REQUEST, format!("ack {a} is ahead of the session's batch {}", live.seq)))
            }
            Some(a) if a + 1 == live.seq && live.last_batch.as_ref().is_some_and(|(seq, _)| *seq == live.seq) => {
                if let Some((seq, body)) = live.last_batch.clone() {
                    tracing::debug!(session = %s.id, seq, "poll batch sent again");
                    return Err(json_response(StatusCode::OK, body));
                }
            }
            Some(a) if a < live.seq => {
                s.outbox.close(close::SLOW_CONSUMER, "batches were lost; reconnect and recover", true);
            }
            _ => {}
        }
        Ok(())
    }

    /// Waits (until `deadline`) for what poll `me` answers with, and answers it.
    pub(crate) async fn wait_and_answer(
        &self,
        s: &Arc<PollSession>,
        me: u64,
        deadline: tokio::time::Instant,
    ) -> Response {
        loop {
            match s.state.load(Relaxed) {
                MOVED => {
                    let live = s.live.lock().await;
                    return json_response(StatusCode::OK, batch_body(live.seq, &[]));
                }
                ENDED => return error(code::NOT_FOUND, "unknown or expired session"),
                _ => {}
            }
            if s.waiter.load(Relaxed) != me {
                return error(code::CONFLICT, "superseded by a newer poll of this session");
            }
            if s.outbox.has_pending() || s.outbox.closed().is_some() {
                break;
            }
            tokio::select! {
                _ = s.outbox.notified() => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        let mut live = s.live.lock().await;
        if s.state.load(Relaxed) != LIVE {
            return json_response(StatusCode::OK, batch_body(live.seq, &[]));
        }
        // The record is where another node continues the session from. A store no other node
        // reads needs it only to last as long as the live copy, and the sweep renews its lease.
        let shared = self.store().shared();
        let (messages, closed) = self.take_messages(s, &mut live);
        if messages.is_empty() && closed.is_none() {
            if shared {
                self.lease(s).await;
            }
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
            Box::pin(self.finish(s, &mut live, code)).await;
        } else if shared && !self.save(s, &mut live).await {
            // Another node holds the session now and recovers these from history.
            return json_response(StatusCode::OK, batch_body(seq, &[]));
        }
        json_response(StatusCode::OK, body)
    }
}
