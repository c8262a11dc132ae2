//! Taking a long-poll session over from the store: a poll or command for a session this node
//! holds no live copy of claims its [`Record`] (compare-and-set), tells the old holder to drop
//! its copy, and builds the live copy from the record — its replies not yet sent, every channel
//! resubscribed with `recover` from its stored position, the commands queued for it run. The
//! rules are in `transport::poll`'s module docs; the live copy is `transport::poll::session`'s.

// Refusals are the response itself (status, body, headers), returned on the cold path of a
// request that answers with it anyway; boxing them would buy nothing.
#![allow(clippy::result_large_err)]

use axum::response::Response;
use bytes::Bytes;
use switchboard_broker::SessionNotice;
use switchboard_protocol::code::{self, close};
use switchboard_protocol::command::{Command, CommandBody, SubscribeRequest};
use switchboard_protocol::message::encode_disconnect;
use switchboard_protocol::Format;

use crate::message::{Kind, Message, Outcome, Outcomes};
use crate::transport::http::error;
use crate::transport::poll::record::{Record, StoredSub};
use crate::transport::poll::session::{store_error, Found, Polls, LOCK_WAIT};
use crate::transport::poll::wire::{batch_body, RESUBSCRIBE_ID};
use crate::transport::sse::ChannelPos;

impl Polls {
    /// Takes the session over from the store (see the module docs).
    pub(crate) async fn take_over(
        &self,
        id: &str,
        ack: Option<u64>,
        exempt: bool,
        ip: Option<std::net::IpAddr>,
    ) -> Result<Found, Response> {
        let token = match self.store().lock(id, LOCK_WAIT).await.map_err(store_error)? {
            Some(t) => t,
            None => return Err(error(503, "session busy; retry")),
        };
        let r = self.take_over_locked(id, ack, exempt, ip).await;
        let _ = self.store().unlock(id, token).await;
        r
    }

    pub(crate) async fn take_over_locked(
        &self,
        id: &str,
        ack: Option<u64>,
        exempt: bool,
        ip: Option<std::net::IpAddr>,
    ) -> Result<Found, Response> {
        // Someone may have created the live copy here while this request waited for the lock.
        if let Some(s) = self.local(id) {
            return Ok(Found::Session(s));
        }
        let mut rec = None;
        for _ in 0..5 {
            let Some(r) = self.load_record(id).await.map_err(store_error)? else {
                return Err(error(code::NOT_FOUND, "unknown or expired session"));
            };
            if let Some(a) = ack.filter(|a| *a != r.seq) {
                tracing::debug!(session = %id, ack = a, seq = r.seq, "poll session moved with a batch lost");
                let _ = self.store().remove(id).await;
                if !r.owner.is_empty() && r.owner != self.node.id {
                    let _ = self.store().notify(&r.owner, &SessionNotice::Moved(id.to_string())).await;
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
            if self.save_record(id, r.version, &claim).await.map_err(store_error)? {
                if !r.owner.is_empty() && r.owner != self.node.id {
                    let _ = self.store().notify(&r.owner, &SessionNotice::Moved(id.to_string())).await;
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
        let identity = rec.identity.identity();
        let s = self.create(id, Some(identity), exempt, slot)?;
        let mut live = s.live.lock().await;
        live.version = rec.version;
        live.seq = rec.seq;
        live.head =
            rec.subs.iter().map(|x| (x.ch.clone(), ChannelPos { epoch: x.epoch.clone(), offset: x.off })).collect();
        live.queued = rec.queued.clone();
        s.outbox.push_raw(rec.queued.iter().map(|q| Bytes::from(q.clone())));
        if let Some(reason) = live.session.check_deadline() {
            // The token expired while the session was stored: it ends (4001, for the next
            // poll) before anything — resubscribing, queued commands — runs on its behalf.
            s.outbox.close(reason.code, &reason.reason, true);
            let _ = self.store().take_commands(id).await;
            self.sessions.lock().insert(id.to_string(), s.clone());
            drop(live);
            return Ok(Found::Session(s));
        }
        let most = self.node.config.limits.max_channels_per_subscribe.max(1);
        let mut todo: Vec<&StoredSub> = rec.subs.iter().collect();
        while !todo.is_empty() && s.outbox.closed().is_none() {
            let chunk: Vec<&StoredSub> = todo.drain(..todo.len().min(most)).collect();
            let subscribe = SubscribeRequest {
                channels: chunk.iter().map(|x| x.ch.clone()).collect(),
                recover: chunk
                    .iter()
                    .map(|x| (x.ch.clone(), ChannelPos { epoch: x.epoch.clone(), offset: x.off }))
                    .collect(),
                // `last` comes with the reply only when asked for; a point channel whose
                // history does not reach back gets it.
                initial: true,
                ..SubscribeRequest::default()
            };
            let cmd = Command { id: Some(RESUBSCRIBE_ID), body: CommandBody::Subscribe(subscribe) };
            let _ = live.session.command(cmd).await;
            live.session.flush();
            // Channels past the reply's budget (413) go first in the next command. Each reply
            // takes at least its first channel (a recovery too large alone is cut and marked
            // incomplete), so this ends; a reply that took none closes the session (4008: the
            // client recovers itself) rather than leave channels unsubscribed.
            let again = too_large(&s.outbox.take_replies());
            let sent = chunk.len();
            let retry: Vec<&StoredSub> = chunk.into_iter().filter(|x| again.contains(&x.ch)).collect();
            if !retry.is_empty() && retry.len() == sent {
                s.outbox.close(close::SLOW_CONSUMER, "the recovery does not fit a reply; reconnect and recover", true);
                break;
            }
            todo.splice(0..0, retry);
        }
        let _ = s.outbox.take_replies();
        self.sessions.lock().insert(id.to_string(), s.clone());
        tracing::debug!(session = %id, from = %rec.owner, channels = rec.subs.len(), "poll session taken over");
        let pending = self.store().take_commands(id).await.unwrap_or_default();
        for body in pending {
            if let Err(e) = self.run(&s, &mut live, &body).await {
                tracing::debug!(session = %id, error = %e.message, "queued poll commands refused");
            }
        }
        self.save(&s, &mut live).await;
        drop(live);
        Ok(Found::Session(s))
    }
}

/// The channels that a takeover's resubscribe replies refused for the reply's size (413).
fn too_large(replies: &[Message]) -> std::collections::HashSet<String> {
    replies
        .iter()
        .filter_map(|m| match &m.kind {
            Kind::Reply { outcomes: Some(outcomes), .. } => Some(outcomes),
            _ => None,
        })
        .flat_map(Outcomes::iter)
        .filter(|(_, r)| matches!(r, Outcome::Err(e) if e.code == code::TOO_LARGE))
        .map(|(ch, _)| ch.to_string())
        .collect()
}
