//! [`Session`]: one client's commands and subscriptions, independent of the transport.
//!
//! A transport decodes frames into payloads and hands them to [`Session::handle_payload`];
//! everything the session says goes through the connection's [`Outbox`]. Tests drive a session
//! with an in-memory wire.
//!
//! The session also owns the client's [`Identity`]: set by the transport from handshake
//! credentials, or by a `connect` command with a token, replaced by `refresh`. Every command
//! on a channel is checked against the namespace permissions ([`Auth::check`]). The transport
//! asks [`Session::deadline`] when the connection must be looked at again (the first message of
//! an unauthenticated client, the token's expiry) and closes it with what
//! [`Session::check_deadline`] returns (4001).
//!
//! Failure stays inside the session: a panic while a command is handled closes this client
//! with 4008 (reconnect and recover) and nobody else, and the session's teardown (hub entries,
//! subscription counts, broker subscriptions, presence, the node's connection slot) runs in
//! `Drop`, however the session ends.
//!
//! `session/subscribe.rs` holds `subscribe` and `unsubscribe`; `session/reply.rs` how their
//! replies are written within the connection's reply budget; `session/hooks.rs` the session's
//! side of the application's connect, subscribe and publish hooks.

mod hooks;
pub(crate) mod reply;
mod subscribe;

pub use hooks::ConnectContext;

use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::value::RawValue;
use switchboard_broker::{Position, Publication};
use switchboard_protocol::code::{self, close};
use switchboard_protocol::command::{AlarmAction, AlarmRequest, HistoryRequest, PublishRequest};
use switchboard_protocol::message::{encode_error, encode_ok, Data, Pub};
use switchboard_protocol::{
    decode_json_frame, decode_msgpack_frame, namespace_of, validate_channel, Command, CommandBody, Format,
};

use crate::auth::limits::Bucket;
use crate::auth::{Action, Auth, AuthFailure, Identity, Method};
use crate::message::Kind;
use crate::node::{ApiError, Node, Target};
use crate::outbox::{Outbox, Pushed};
use crate::publish::{self, Asked, Publisher};
use reply::pub_of;

/// Why a connection must close (sent as `disconnect` + close frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseReason {
    pub code: u16,
    pub reason: String,
}

impl CloseReason {
    pub fn new(code: u16, reason: impl Into<String>) -> CloseReason {
        CloseReason { code, reason: reason.into() }
    }
}

/// One connected client.
pub struct Session {
    node: Arc<Node>,
    outbox: Arc<Outbox>,
    client: String,
    user: String,
    subs: HashSet<Arc<str>>,
    /// Channels of the subscribe being handled that are admitted but not yet confirmed by the
    /// broker (empty between commands).
    pending: HashSet<Arc<str>>,
    /// Channels where this client is registered as present.
    present: HashSet<Arc<str>>,
    /// A reply was queued and the outbox wants a flush.
    needs_flush: bool,
    auth: Arc<Auth>,
    identity: Identity,
    /// An unauthenticated client on a node with authentication must send its first message
    /// before this (4001 otherwise).
    first_message_by: Option<SystemTime>,
    /// Publishes per second (none when the client is exempt from rate limits).
    publish_rate: Option<Bucket>,
    /// Presence joins per second (none when exempt): each is an event to every member, so a
    /// client subscribing and unsubscribing in a loop would amplify its churn to all of them.
    presence_rate: Option<Bucket>,
    /// The client's address when it is subject to per-address limits (password checks of
    /// `connect`).
    limited_ip: Option<std::net::IpAddr>,
    /// Set while the connection waits for the connect hook (no credentials, a hook configured).
    connect_hook: Option<ConnectContext>,
}

impl Session {
    pub fn new(node: Arc<Node>, outbox: Arc<Outbox>) -> Session {
        let client = format!("{}-{}", node.id, outbox.id);
        let auth = node.config.security.auth.clone();
        let publish_rate = Some(Bucket::full(node.config.limits.publishes_per_connection_per_s as f64, Instant::now()));
        let presence_rate =
            Some(Bucket::full(node.config.limits.presence_changes_per_connection_per_s as f64, Instant::now()));
        let mut session = Session {
            node,
            outbox,
            client,
            user: String::new(),
            subs: HashSet::new(),
            pending: HashSet::new(),
            present: HashSet::new(),
            needs_flush: false,
            auth,
            identity: Identity::anonymous(),
            first_message_by: None,
            publish_rate,
            presence_rate,
            limited_ip: None,
            connect_hook: None,
        };
        session.set_identity(None);
        session
    }

    /// Sets who the client is, from the handshake. `None` (no credentials) on a node with
    /// authentication starts the first-message deadline: the client has
    /// `limits.first_message_timeout_s` to send a command — usually `connect` with a token.
    pub fn set_identity(&mut self, identity: Option<Identity>) {
        if let Some(i) = &identity {
            self.node.owners.set(self.outbox.id, i);
        }
        match identity {
            Some(i) => {
                self.user = i.user.clone();
                self.identity = i;
                self.first_message_by = None;
            }
            None => {
                self.user = String::new();
                self.identity = Identity::anonymous();
                self.first_message_by = self
                    .auth
                    .enabled()
                    .then(|| SystemTime::now() + Duration::from_secs(self.node.config.limits.first_message_timeout_s));
            }
        }
        self.show_deadline();
    }

    /// Writes the deadline, in whole seconds, where a sweep reads it without this session's
    /// lock (`Outbox::deadline_s`). A first message clears the first-message deadline
    /// without it: a deadline shown early costs the sweep only a look at the session.
    fn show_deadline(&self) {
        let at = self.deadline().map_or(u64::MAX, |d| d.duration_since(UNIX_EPOCH).map_or(0, |s| s.as_secs()));
        self.outbox.deadline_s.store(at, Relaxed);
    }

    /// Lifts the per-connection publish and presence rates (clients on exempt addresses, see
    /// `limits.exempt_loopback`).
    pub fn set_rate_exempt(&mut self, exempt: bool) {
        if exempt {
            self.publish_rate = None;
            self.presence_rate = None;
        }
    }

    /// The client's address when it is subject to per-address limits: a password sent in
    /// `connect` is charged to it (`limits.password_checks_per_ip_per_s`).
    pub fn set_limited_ip(&mut self, ip: Option<std::net::IpAddr>) {
        self.limited_ip = ip;
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// When the transport must call [`check_deadline`](Self::check_deadline) next.
    pub fn deadline(&self) -> Option<SystemTime> {
        // A token's `exp` is the client's number: an expiry beyond what the clock can hold
        // means no deadline, never an overflow.
        let expiry = self
            .identity
            .expires
            .and_then(|exp| UNIX_EPOCH.checked_add(Duration::from_secs(exp.saturating_add(self.auth.leeway_s()))));
        match (self.first_message_by, expiry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The close reason once a deadline has passed: no first message in time, or an expired
    /// token that was not refreshed (4001, no reconnect without a new token). Otherwise the
    /// deadline is shown again as it now stands.
    pub fn check_deadline(&mut self) -> Option<CloseReason> {
        let now = SystemTime::now();
        if self.first_message_by.is_some_and(|t| t <= now) {
            return Some(CloseReason::new(
                close::INVALID_TOKEN,
                format!(
                    "no credentials: send connect with a token within {} s",
                    self.node.config.limits.first_message_timeout_s
                ),
            ));
        }
        if self.deadline().is_some_and(|t| t <= now) {
            let why = if self.identity.method == Method::Hook { "connection expired" } else { "token expired" };
            return Some(CloseReason::new(close::INVALID_TOKEN, why));
        }
        self.show_deadline();
        None
    }

    pub fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    /// Handles one complete message payload (a text or binary WebSocket message). A panic while
    /// handling it is caught here: the client is closed with 4008 (reconnect and recover).
    pub async fn handle_payload(&mut self, payload: &[u8]) -> Result<(), CloseReason> {
        match switchboard_supervisor::catch("session", self.handle_commands(payload)).await {
            Ok(handled) => handled,
            Err(_) => Err(CloseReason::new(close::SLOW_CONSUMER, "internal error; reconnect and recover")),
        }
    }

    /// Runs one command a transport made itself (an SSE stream's subscribe, a moved poll
    /// session's resubscribe) as a client's decoded command runs, a panic caught the same way.
    pub async fn command(&mut self, cmd: Command) -> Result<(), CloseReason> {
        let run = async {
            self.connect_hook_first(std::slice::from_ref(&cmd)).await?;
            self.dispatch(cmd).await
        };
        match switchboard_supervisor::catch("session", run).await {
            Ok(handled) => handled,
            Err(_) => Err(CloseReason::new(close::SLOW_CONSUMER, "internal error; reconnect and recover")),
        }
    }

    async fn handle_commands(&mut self, payload: &[u8]) -> Result<(), CloseReason> {
        self.first_message_by = None;
        self.node.metrics.messages_in.fetch_add(1, Relaxed);
        self.node.metrics.bytes_in.fetch_add(payload.len() as u64, Relaxed);
        // A WebSocket text message arrives as valid UTF-8 (its frame reader fails others with
        // 1007); JSON from the HTTP transports that is not UTF-8 is no command.
        let commands = match self.outbox.format {
            Format::Json => decode_json_frame(payload),
            Format::Msgpack => decode_msgpack_frame(payload),
        }
        .map_err(|e| CloseReason::new(close::BAD_COMMAND, e.to_string()))?;
        self.connect_hook_first(&commands).await?;
        for cmd in commands {
            self.dispatch(cmd).await?;
        }
        Ok(())
    }

    /// Writes replies queued by the commands handled since the last call.
    pub fn flush(&mut self) {
        if std::mem::take(&mut self.needs_flush) {
            self.outbox.flush();
        }
    }

    fn send(&mut self, bytes: Vec<u8>, kind: Kind) {
        if self.outbox.push_message(&bytes, kind) == Pushed::Schedule {
            self.needs_flush = true;
        }
    }

    fn ok<T: Serialize>(&mut self, id: Option<u32>, body: &T) {
        if let Some(id) = id {
            let bytes = encode_ok(self.outbox.format, id, body);
            self.send(bytes, Kind::reply(id));
        }
    }

    fn err(&mut self, id: Option<u32>, e: ApiError) {
        let id = id.unwrap_or(0);
        let bytes = encode_error(self.outbox.format, id, e.code, &e.message);
        self.send(bytes, Kind::Reply { id, error: Some(e.code), outcomes: None });
    }

    async fn dispatch(&mut self, cmd: Command) -> Result<(), CloseReason> {
        switchboard_supervisor::fault::hit("session.command", self.outbox.id);
        let id = cmd.id;
        let result = match cmd.body {
            CommandBody::Subscribe(req) => {
                self.subscribe_as(id, req, false).await;
                return Ok(());
            }
            CommandBody::Ping(p) => {
                #[derive(Serialize)]
                struct Echo<'a> {
                    #[serde(skip_serializing_if = "Option::is_none")]
                    data: Option<Data<'a>>,
                }
                let data = p.data.map(|d| switchboard_protocol::message::single_line(&d).unwrap_or(d));
                self.ok(id, &Echo { data: data.as_deref().map(Data) });
                return Ok(());
            }
            CommandBody::Publish(req) => self.publish(id, req).await,
            CommandBody::Unsubscribe(req) => {
                for ch in &req.channels {
                    self.unsubscribe(ch).await;
                }
                self.ok(id, &serde_json::json!({}));
                return Ok(());
            }
            CommandBody::History(req) => self.history(id, req).await,
            CommandBody::Presence(req) => self.presence(id, &req.channel).await,
            CommandBody::Connect(req) => {
                if let Some(name) = req.name {
                    tracing::debug!(client = %self.client, name = %name.chars().take(64).collect::<String>(), "connect");
                }
                match (req.token, req.user, req.password) {
                    (Some(token), None, None) => self.connect_token(&token).await?,
                    (None, Some(user), Some(password)) => self.connect_password(user, password).await?,
                    (None, None, None) => {}
                    _ => {
                        return Err(CloseReason::new(
                            close::INVALID_TOKEN,
                            "connect takes either a token or a user and a password",
                        ))
                    }
                }
                #[derive(Serialize)]
                struct Connected<'a> {
                    client: &'a str,
                    node: &'a str,
                    ping_s: u64,
                    #[serde(skip_serializing_if = "str::is_empty")]
                    user: &'a str,
                    #[serde(skip_serializing_if = "Option::is_none")]
                    expires: Option<u64>,
                }
                let body = Connected {
                    client: &self.client,
                    node: &self.node.id,
                    ping_s: self.node.config.limits.ping_s,
                    user: &self.identity.user,
                    expires: self.identity.expires,
                };
                if let Some(id) = id {
                    let bytes = encode_ok(self.outbox.format, id, &body);
                    self.send(bytes, Kind::reply(id));
                }
                return Ok(());
            }
            CommandBody::Refresh(req) => self.refresh(id, &req.token).await,
            CommandBody::Alarm(action, req) => self.alarm(id, action, req).await,
            CommandBody::Unknown(name) => Err(ApiError::new(code::NOT_FOUND, format!("unknown command {name:?}"))),
            CommandBody::Invalid(why) => Err(ApiError::new(code::BAD_REQUEST, why)),
        };
        if let Err(e) = result {
            self.err(id, e);
        }
        Ok(())
    }

    /// `connect` with a token: authenticates an anonymous connection (a bad token closes it
    /// with 4001), or acts as a `refresh` on an authenticated one.
    async fn connect_token(&mut self, token: &str) -> Result<(), CloseReason> {
        if !self.auth.enabled() {
            // Nothing to check against; the connection stays anonymous, as without a token.
            return Ok(());
        }
        let verified = match self.auth.verify_token(token).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(client = %self.client, reason = %e, "connect token refused");
                return Err(CloseReason::new(close::INVALID_TOKEN, e.to_string()));
            }
        };
        if !self.identity.is_anonymous() && verified.user != self.identity.user {
            return Err(CloseReason::new(close::INVALID_TOKEN, "token is for another user"));
        }
        self.set_identity(Some(verified));
        Ok(())
    }

    /// `connect` with a Basic user's name and password: checked as a handshake's `Authorization:
    /// Basic` would be (same cache and per-address limit); a refusal closes with 4001 (4029
    /// when the address made too many attempts).
    async fn connect_password(&mut self, user: String, password: String) -> Result<(), CloseReason> {
        if !self.auth.enabled() {
            return Ok(());
        }
        let verified = match self.auth.verify_password(user, password, self.limited_ip).await {
            Ok(v) => v,
            Err(AuthFailure::RateLimited) => {
                return Err(CloseReason::new(close::TOO_MANY, AuthFailure::RateLimited.to_string()))
            }
            Err(e) => {
                tracing::debug!(client = %self.client, reason = %e, "connect password refused");
                return Err(CloseReason::new(close::INVALID_TOKEN, e.to_string()));
            }
        };
        if !self.identity.is_anonymous() && verified.user != self.identity.user {
            return Err(CloseReason::new(close::INVALID_TOKEN, "credentials are for another user"));
        }
        self.set_identity(Some(verified));
        Ok(())
    }

    /// `refresh`: replaces the connection's token (same `sub`) before it expires; a connection
    /// the connect hook accepted moves to a token of the same user.
    async fn refresh(&mut self, id: Option<u32>, token: &str) -> Result<(), ApiError> {
        if !self.auth.has_jwt() {
            return Err(ApiError::new(code::BAD_REQUEST, "token authentication is not configured on this node"));
        }
        match self.identity.method {
            Method::Token | Method::Hook => {}
            Method::Anonymous => {
                return Err(ApiError::new(code::UNAUTHORIZED, "not authenticated; send connect with a token"));
            }
            _ => return Err(ApiError::new(code::BAD_REQUEST, "this connection did not authenticate with a token")),
        }
        let verified =
            self.auth.verify_token(token).await.map_err(|e| ApiError::new(code::UNAUTHORIZED, e.to_string()))?;
        if verified.user != self.identity.user {
            return Err(ApiError::new(code::FORBIDDEN, "token is for another user"));
        }
        let expires = verified.expires;
        self.set_identity(Some(verified));
        self.ok(id, &serde_json::json!({ "expires": expires }));
        Ok(())
    }

    /// Checks `action` on `channel` for this client.
    fn allow(&self, action: Action, channel: &str) -> Result<(), ApiError> {
        self.auth.check(&self.identity, &self.node.config.namespace(namespace_of(channel)).allow, action, channel)
    }

    async fn publish(&mut self, id: Option<u32>, req: PublishRequest) -> Result<(), ApiError> {
        let node = self.node.clone();
        let asked =
            Asked { channel: req.channel, data: req.data, idempotency_key: req.idempotency_key, tags: req.tags };
        let outcome = publish::one(&node, self, asked).await?;
        self.ok(id, &outcome);
        Ok(())
    }

    async fn history(&mut self, id: Option<u32>, req: HistoryRequest) -> Result<(), ApiError> {
        validate_channel(&req.channel).map_err(|e| ApiError::new(code::BAD_REQUEST, e.to_string()))?;
        self.allow(Action::History, &req.channel)?;
        let since = req.since.map(|s| Position { epoch: s.epoch.into(), offset: s.offset });
        // Each publication counted as the connection writes it, one separator included.
        let format = self.outbox.format;
        let cost = |p: &Publication| reply::encoded_len(format, &pub_of(&req.channel, p)) + 1;
        let budget = self.node.config.limits.reply_budget();
        let page = crate::history::read(&self.node, &req.channel, since, req.limit, budget, cost).await?;
        #[derive(Serialize)]
        struct HistoryReply<'a> {
            publications: Vec<Pub<'a>>,
            epoch: &'a str,
            offset: u64,
            complete: bool,
            more: bool,
        }
        let body = HistoryReply {
            publications: page.publications.iter().map(|p| pub_of(&req.channel, p)).collect(),
            epoch: &page.position.epoch,
            offset: page.position.offset,
            complete: page.complete,
            more: page.more,
        };
        self.ok(id, &body);
        Ok(())
    }

    /// `alarm_ack`, `alarm_shelve`, `alarm_unshelve`: the action as this connection's user
    /// ([`crate::alarms::act`]); the reply is the alarm's new state.
    async fn alarm(&mut self, id: Option<u32>, action: AlarmAction, req: AlarmRequest) -> Result<(), ApiError> {
        let act = match action {
            AlarmAction::Ack => crate::alarms::state::Act::Ack,
            AlarmAction::Shelve => crate::alarms::shelve_until(req.for_s)?,
            AlarmAction::Unshelve => crate::alarms::state::Act::Unshelve,
        };
        let status = crate::alarms::act(&self.node, &self.identity, &req.alarm, act, req.comment).await?;
        self.ok(id, &status);
        Ok(())
    }

    async fn presence(&mut self, id: Option<u32>, channel: &str) -> Result<(), ApiError> {
        validate_channel(channel).map_err(|e| ApiError::new(code::BAD_REQUEST, e.to_string()))?;
        if !self.node.config.namespace(namespace_of(channel)).presence {
            return Err(ApiError::new(code::FORBIDDEN, "presence is not enabled in this namespace"));
        }
        self.allow(Action::Presence, channel)?;
        let clients = self.node.broker.presence(channel).await.map_err(|e| self.node.broker_error(e))?;
        self.ok(id, &serde_json::json!({ "clients": clients }));
        Ok(())
    }

    /// Removes every subscription and presence entry, waiting for the broker; called when the
    /// connection ends. Whatever is left when the session is dropped (a panic, a task
    /// cancelled) is removed by `Drop`.
    pub async fn cleanup(&mut self) {
        for ch in std::mem::take(&mut self.pending) {
            self.node.hub.remove(&ch, self.outbox.id);
        }
        let subs: Vec<Arc<str>> = self.subs.iter().cloned().chain(self.present.iter().cloned()).collect();
        for ch in subs {
            self.unsubscribe(&ch).await;
        }
    }
}

/// A connection as a publisher (its `publish` command, SPEC §3).
impl Publisher for Session {
    fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Whether this client may publish to `channel` now: its namespace takes client
    /// publications, its permissions allow it, and it is within its publish rate.
    fn permit(&mut self, target: Target<'_>) -> Result<(), ApiError> {
        let channel = target.channel();
        if !self.node.config.namespace(namespace_of(channel)).client_publish {
            return Err(ApiError::new(code::FORBIDDEN, "clients may not publish in this namespace"));
        }
        self.allow(Action::Publish, channel)?;
        let rate = self.node.config.limits.publishes_per_connection_per_s;
        if let Some(bucket) = &mut self.publish_rate {
            if !bucket.take(rate as f64, Instant::now()) {
                return Err(ApiError::new(code::LIMIT, format!("more than {rate} publishes per second")));
            }
        }
        Ok(())
    }

    async fn hook(&self, channel: &str, data: Box<RawValue>) -> Result<Box<RawValue>, ApiError> {
        self.publish_hook(channel, data).await
    }
}

impl Drop for Session {
    /// The teardown that runs however the session ends: the hub entries and counts go at once,
    /// the broker's subscriptions and presence entries in a task (they need the broker), and the
    /// node forgets the connection. After [`Session::cleanup`] only the last step is left.
    fn drop(&mut self) {
        let id = self.outbox.id;
        // Admitted channels of a subscribe cut short: in the hub, not yet counted. The broker
        // may or may not have counted them; they are left to its idle sweep rather than risk
        // releasing another subscriber's count.
        for ch in self.pending.drain() {
            self.node.hub.remove(&ch, id);
        }
        let subs: Vec<Arc<str>> = self.subs.drain().collect();
        let present = std::mem::take(&mut self.present);
        for ch in &subs {
            self.node.metrics.subscriptions.fetch_sub(1, Relaxed);
            self.node.hub.remove(ch, id);
        }
        if !subs.is_empty() || !present.is_empty() {
            tracing::debug!(client = %self.client, subs = subs.len(), "session dropped without cleanup");
            let (node, client) = (self.node.clone(), std::mem::take(&mut self.client));
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    for ch in subs {
                        let _ = node.broker.unsubscribe(&ch).await;
                    }
                    for ch in present {
                        let _ = node.broker.presence_remove(&ch, &client).await;
                    }
                });
            }
        }
        if !self.outbox.is_closing() {
            self.outbox.close(close::SLOW_CONSUMER, "internal error; reconnect and recover", true);
        }
        self.node.unregister(id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::Config;
    use crate::outbox::tests::TestWire;
    use jsonwebtoken::{encode, EncodingKey, Header};

    const SECRET: &str = "session-test-secret-0123456789abcdef";

    fn node() -> Arc<Node> {
        let env = vec![("SWITCHBOARD_JWT_SECRET".to_string(), SECRET.to_string())];
        let config = Config::load(None, env, &[]).unwrap();
        Node::new(config, Arc::new(switchboard_broker::MemoryBroker::new()))
    }

    fn token(sub: &str, exp: u64) -> String {
        let claims = serde_json::json!({"sub": sub, "exp": exp, "channels": ["room:*"]});
        encode(&Header::default(), &claims, &EncodingKey::from_secret(SECRET.as_bytes())).unwrap()
    }

    fn session(node: &Arc<Node>) -> (Session, Arc<TestWire>) {
        let wire = TestWire::open(1 << 20);
        let Ok(outbox) = node.register(Format::Json, wire.clone()) else { panic!("registered") };
        (Session::new(node.clone(), outbox), wire)
    }

    async fn command(s: &mut Session, wire: &TestWire, frame: serde_json::Value) -> serde_json::Value {
        s.handle_payload(frame.to_string().as_bytes()).await.unwrap();
        s.flush();
        // The reply, not the presence events that may follow it.
        wire.messages().into_iter().rev().find(|m| m["id"] == frame["id"]).unwrap()
    }

    #[tokio::test]
    async fn session_auth_anonymous_then_connect_then_refresh() {
        let node = node();
        let (mut s, wire) = session(&node);
        let first = s.deadline().expect("an unauthenticated client has a first-message deadline");
        assert!(first > SystemTime::now());
        let r = command(&mut s, &wire, serde_json::json!({"id": 1, "subscribe": {"channels": ["room:a"]}})).await;
        assert_eq!(r["ok"]["channels"]["room:a"]["error"]["code"], 401);
        assert_eq!(s.deadline(), None, "the first message arrived");

        let exp = crate::unix_s() + 600;
        let r = command(&mut s, &wire, serde_json::json!({"id": 2, "connect": {"token": token("ann", exp)}})).await;
        assert_eq!((r["ok"]["user"].as_str(), r["ok"]["expires"].as_u64()), (Some("ann"), Some(exp)));
        assert_eq!(s.deadline(), Some(UNIX_EPOCH + Duration::from_secs(exp)));
        let r =
            command(&mut s, &wire, serde_json::json!({"id": 3, "subscribe": {"channels": ["room:a", "pt:x"]}})).await;
        assert_eq!(r["ok"]["channels"]["room:a"]["offset"], 0);
        assert_eq!(r["ok"]["channels"]["pt:x"]["error"]["code"], 403, "outside the token's patterns");

        let r = command(&mut s, &wire, serde_json::json!({"id": 4, "refresh": {"token": token("bob", exp)}})).await;
        assert_eq!(r["error"]["code"], 403);
        let r = command(&mut s, &wire, serde_json::json!({"id": 5, "refresh": {"token": "x.y.z"}})).await;
        assert_eq!(r["error"]["code"], 401);
        let r =
            command(&mut s, &wire, serde_json::json!({"id": 6, "refresh": {"token": token("ann", exp + 60)}})).await;
        assert_eq!(r["ok"]["expires"], exp + 60);
        assert_eq!(s.deadline(), Some(UNIX_EPOCH + Duration::from_secs(exp + 60)));
        assert_eq!(s.check_deadline(), None);
        // An `exp` past what the clock can hold (or just past auth.revocation_keep_s) is a
        // token no revocation could outlive: refused, and the deadline stays.
        let far = u64::MAX - 10;
        let r = command(&mut s, &wire, serde_json::json!({"id": 7, "refresh": {"token": token("ann", far)}})).await;
        assert_eq!(r["error"]["code"], 401);
        assert!(r["error"]["message"].as_str().unwrap_or("").contains("auth.revocation_keep_s"), "{r}");
        assert_eq!(s.deadline(), Some(UNIX_EPOCH + Duration::from_secs(exp + 60)));
        assert_eq!(s.check_deadline(), None);
        // An expiry past what the clock can hold (a connect hook's `expire_at`) is no deadline
        // at all, never an overflow in the connection's task.
        s.identity.expires = Some(far);
        assert_eq!(s.deadline(), None);
        assert_eq!(s.check_deadline(), None);
    }

    #[tokio::test]
    async fn session_auth_deadlines_close_with_4001() {
        let node = node();
        let (mut s, _wire) = session(&node);
        s.first_message_by = Some(SystemTime::now() - Duration::from_secs(1));
        assert_eq!(s.check_deadline().map(|r| r.code), Some(close::INVALID_TOKEN));

        let (mut s, _wire) = session(&node);
        let mut id = node.config.security.auth.verify_token(&token("ann", crate::unix_s() + 60)).await.unwrap();
        id.expires = Some(crate::unix_s() - 1);
        s.set_identity(Some(id));
        assert_eq!(s.check_deadline(), Some(CloseReason::new(close::INVALID_TOKEN, "token expired")));

        let (mut s, _wire) = session(&node);
        let bad = serde_json::json!({"id": 1, "connect": {"token": token("ann", crate::unix_s() - 30)}});
        let err = s.handle_payload(bad.to_string().as_bytes()).await.unwrap_err();
        assert_eq!((err.code, err.reason.as_str()), (close::INVALID_TOKEN, "token expired"));
    }
}
