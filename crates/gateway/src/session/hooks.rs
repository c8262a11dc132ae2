//! A session's side of the application's hooks (`crate::proxy`): the connect hook for a
//! connection without credentials, with its server-side subscriptions, and the subscribe and
//! publish hooks of opted-in namespaces.

use std::collections::{BTreeMap, HashMap};

use serde_json::value::RawValue;
use switchboard_protocol::command::{CommandBody, SubscribeRequest};
use switchboard_protocol::{namespace_of, validate_channel, Command};

use super::{CloseReason, Session};
use crate::auth::Action;
use crate::node::ApiError;
use crate::proxy::Refused;

/// Subscribe hook calls of one subscribe in flight at once: a subscribe of many channels must
/// not open a connection to the backend per channel. The whole node's calls are capped too
/// (`proxy.max_in_flight`, in `crate::proxy`).
const HOOK_CONCURRENCY: usize = 32;

/// What the connect hook is told about a connection that is waiting for it.
pub struct ConnectContext {
    /// `websocket`, `sse` or `poll`.
    pub transport: &'static str,
    /// The request headers listed in `proxy.headers`.
    pub headers: BTreeMap<String, String>,
}

impl Session {
    /// The connection brought no credentials and a connect hook is configured: the hook is
    /// asked on the client's first message (a `connect` passes its `data`), before that
    /// message is handled.
    pub fn await_connect_hook(&mut self, ctx: ConnectContext) {
        self.connect_hook = Some(ctx);
    }

    /// Runs the connect hook now (SSE and long-poll, which have no first message): `data` is
    /// `null`. `Err` is the refusal, for the transport to answer.
    pub async fn connect_with_hook(&mut self, ctx: ConnectContext) -> Result<(), Refused> {
        self.ask_connect_hook(&ctx, None).await
    }

    /// Before the first commands of a connection waiting for the connect hook: asks it, unless
    /// the first command is a `connect` with credentials (those are checked as usual).
    pub(super) async fn connect_hook_first(&mut self, commands: &[Command]) -> Result<(), CloseReason> {
        let Some(ctx) = self.connect_hook.take() else { return Ok(()) };
        let data = match commands.first().map(|c| &c.body) {
            Some(CommandBody::Connect(c)) if c.token.is_some() || c.user.is_some() => return Ok(()),
            Some(CommandBody::Connect(c)) => c.data.as_deref(),
            _ => None,
        };
        self.ask_connect_hook(&ctx, data).await.map_err(|r| CloseReason::new(r.close, r.reason))
    }

    async fn ask_connect_hook(&mut self, ctx: &ConnectContext, data: Option<&RawValue>) -> Result<(), Refused> {
        let call = crate::proxy::ConnectCall {
            client: &self.client,
            transport: ctx.transport,
            encoding: match self.outbox.format {
                switchboard_protocol::Format::Json => "json",
                switchboard_protocol::Format::Msgpack => "msgpack",
            },
            headers: &ctx.headers,
            data,
        };
        let hooks = self.node.config.hooks.clone();
        let accepted = hooks.connect(&call).await.inspect_err(|r| {
            tracing::debug!(client = %self.client, code = r.close, reason = %r.reason, "connect hook refused");
        })?;
        let identity = self.auth.hook_identity(accepted.user, accepted.expire_at);
        self.set_identity(Some(identity));
        if !accepted.channels.is_empty() {
            let req = SubscribeRequest { channels: accepted.channels, ..SubscribeRequest::default() };
            self.subscribe_as(None, req, true).await;
        }
        Ok(())
    }

    /// The subscribe hook's refusals for the channels of a client's subscribe that it decides:
    /// those of `proxy_subscribe` namespaces that pass the name and permission checks (the
    /// others are refused by those checks, without asking). Asked [`HOOK_CONCURRENCY`] at a
    /// time.
    pub(super) async fn subscribe_hook_refusals(&self, channels: &[String]) -> HashMap<String, ApiError> {
        let hooks = self.node.config.hooks.clone();
        if !hooks.has_subscribe() {
            return HashMap::new();
        }
        let asked: Vec<&String> = channels
            .iter()
            .filter(|ch| {
                validate_channel(ch).is_ok()
                    && self.node.config.namespace(namespace_of(ch)).proxy_subscribe
                    && self.allow(Action::Subscribe, ch).is_ok()
                    && !self.subs.contains(ch.as_str())
            })
            .collect();
        let mut answers = Vec::with_capacity(asked.len());
        for chunk in asked.chunks(HOOK_CONCURRENCY) {
            let calls = chunk.iter().map(|ch| hooks.subscribe(&self.client, &self.identity.user, ch, None));
            answers.extend(futures_util::future::join_all(calls).await);
        }
        asked.into_iter().zip(answers).filter_map(|(ch, a)| a.err().map(|e| (ch.clone(), e))).collect()
    }

    /// The publish hook's verdict on a permitted client publish in a `proxy_publish`
    /// namespace: the data to publish (the client's, or the hook's replacement).
    pub(super) async fn publish_hook(&self, channel: &str, data: Box<RawValue>) -> Result<Box<RawValue>, ApiError> {
        if !self.node.config.namespace(namespace_of(channel)).proxy_publish {
            return Ok(data);
        }
        let hooks = self.node.config.hooks.clone();
        match hooks.publish(&self.client, &self.identity.user, channel, &data).await? {
            Some(replaced) => Ok(replaced),
            None => Ok(data),
        }
    }
}
