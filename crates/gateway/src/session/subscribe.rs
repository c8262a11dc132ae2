//! A session's `subscribe` and `unsubscribe`: admission of each channel (name, permission,
//! limits), the broker work (counted subscription, then its position, last value, recovered
//! publications or trend), and the reply, written within the connection's reply budget
//! (`reply.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use switchboard_broker::{ClientInfo, Position};
use switchboard_protocol::code;
use switchboard_protocol::command::SubscribeRequest;
use switchboard_protocol::message::{encode_error, encode_ok, encode_subscribed, ErrorBody};
use switchboard_protocol::{namespace_of, validate_channel};

use super::reply::{asked, Outcome, ReplyBudget, SubscribeReply};
use super::Session;
use crate::auth::Action;
use crate::hub::Rule;
use crate::message::{Kind, Outcomes};
use crate::node::{ApiError, Node};
use crate::sampling::PointView;
use switchboard_protocol::filter::Filter;

/// Channels of one subscribe whose broker work runs at once (pipelined on a shared broker).
const SUBSCRIBE_CONCURRENCY: usize = 256;

/// The same for a subscribe with `trend`: each result is large, and a reply carries only a few
/// (its budget), so reading few at once keeps what is read but not sent small.
const TREND_CONCURRENCY: usize = 8;

/// What the broker said to one channel of a subscribe.
enum Attached {
    /// The broker counts the subscription; the reads that followed may still have failed.
    Subscribed(Result<Outcome, ApiError>),
    Refused(ApiError),
}

/// The broker side of subscribing `ch`: count it (publications flow from here on), then read
/// its position, last value or missed publications.
async fn attach(node: &Node, ch: &Arc<str>, req: &SubscribeRequest, rule: &Rule) -> Attached {
    // Every subscription goes to the broker, not only the node's first one on the channel:
    // the broker counts them, and returns only once publications flow to this node, so the
    // position read below cannot run ahead of the live stream (a shared broker subscribes
    // asynchronously, and a second subscriber must not read before the first one's
    // subscription is confirmed).
    if let Err(e) = node.broker.subscribe(ch).await {
        return Attached::Refused(node.broker_error(e));
    }
    Attached::Subscribed(read_start(node, ch, req, rule).await)
}

/// Which publications the subscribe's channels are sent: its sampling, its filter or deltas,
/// each checked (400 naming the field); they do not combine.
fn rule_of(req: &SubscribeRequest) -> Result<Rule, ApiError> {
    let sampling = switchboard_protocol::bounds::subscribe(req).map_err(crate::sampling::bad_number)?;
    let bad = |m: &str| Err(ApiError::new(code::BAD_REQUEST, m.to_string()));
    match (&req.delta, &req.filter) {
        (Some(d), _) if d != "fossil" => bad("delta: the one delta format is \"fossil\""),
        (Some(_), Some(_)) => bad("delta: cannot be combined with filter"),
        (Some(_), None) if sampling.is_some() => bad("delta: cannot be combined with max_rate_hz or deadband"),
        (Some(_), None) => Ok(Rule::Delta),
        (None, Some(spec)) => {
            let filter = Filter::compile(spec).map_err(crate::sampling::bad_number)?;
            match sampling {
                Some(_) => bad("filter: cannot be combined with max_rate_hz or deadband"),
                None => Ok(Rule::Filtered(Arc::new(filter))),
            }
        }
        (None, None) => Ok(sampling.map_or(Rule::Every, Rule::Sampled)),
    }
}

/// The channel's start for a new subscriber: position, last value, recovered publications,
/// trend. A filtered subscriber is given only what its filter matches (its last value too).
async fn read_start(node: &Node, name: &str, req: &SubscribeRequest, rule: &Rule) -> Result<Outcome, ApiError> {
    let broker_err = |e| node.broker_error(e);
    let (mut position, mut recovered, mut complete) = (None, Vec::new(), true);
    let mut last = None;
    // The trend is read first: the live stream continues it from the reply's position (a
    // publication landing between the two reads is in `last`, not in a bucket).
    let trend = match req.trend {
        Some(t) => Some(crate::trend::read(node, name, t.window_s, t.step_s, None).await?),
        None => None,
    };
    // The last value is read before the history: the reply's position must be the later
    // read's, and only the history read returns everything up to its position. (Read the
    // other way round, publications landing between the two reads were covered by the reply's
    // offset but in neither `recovered` nor `last`: lost.)
    if req.initial || !req.recover.contains_key(name) {
        let (pos, l) = node.broker.last_or_start(name).await.map_err(broker_err)?;
        if req.deadband.is_some() && l.as_ref().is_some_and(|p| PointView::of(p.data.get()).v.is_none()) {
            return Err(ApiError::new(
                code::BAD_REQUEST,
                format!("deadband: the values of {name} are not numeric (a point's \"v\" or a number)"),
            ));
        }
        position = Some(pos);
        if req.initial {
            last = l;
        }
    }
    if let Some(from) = req.recover.get(name) {
        let since = Position { epoch: from.epoch.as_str().into(), offset: from.offset };
        let r = node.broker.history(name, Some(&since), usize::MAX).await.map_err(broker_err)?;
        position = Some(r.position);
        recovered = r.publications;
        complete = r.complete;
    }
    let position = position.ok_or_else(|| ApiError::new(code::INTERNAL, "no position"))?;
    if let Rule::Filtered(filter) = rule {
        recovered.retain(|p| filter.matches(p.tags.as_deref()));
        last = last.filter(|p| filter.matches(p.tags.as_deref()));
    }
    Ok(Outcome::Ok { position, last, recovered, complete, trend })
}

impl Session {
    /// A subscribe: the client's (`server` false: answered with a reply when it has an id), or
    /// server-side subscriptions of the connect hook (`server`: no permission checks or
    /// subscribe hook, the backend decided; announced with a `subscribed` push).
    pub(super) async fn subscribe_as(&mut self, id: Option<u32>, req: SubscribeRequest, server: bool) {
        self.forget_lost();
        let limits = &self.node.config.limits;
        if req.channels.len() > limits.max_channels_per_subscribe {
            let e = ApiError::new(
                code::LIMIT,
                format!(
                    "{} channels in one subscribe; at most {}",
                    req.channels.len(),
                    limits.max_channels_per_subscribe
                ),
            );
            return self.err(id, e);
        }
        let rule = match rule_of(&req) {
            Ok(rule) => rule,
            Err(e) => return self.err(id, e),
        };
        let mut hook_refusals = if server { HashMap::new() } else { self.subscribe_hook_refusals(&req.channels).await };
        let mut budget = ReplyBudget::new(self.outbox.format, limits.reply_budget());
        let concurrency = if req.trend.is_some() { TREND_CONCURRENCY } else { SUBSCRIBE_CONCURRENCY };
        self.outbox.hold();
        let mut results: Vec<(String, Outcome)> = Vec::with_capacity(req.channels.len());
        let mut covered: HashMap<Arc<str>, u64> = HashMap::new();
        let mut seen: HashSet<&str> = HashSet::new();
        let unique: Vec<&String> = req.channels.iter().filter(|name| seen.insert(name.as_str())).collect();
        for chunk in unique.chunks(concurrency) {
            // Admission is checked in order (limits count the channels admitted before); the
            // broker work of the admitted ones runs concurrently, so a shared broker gets them
            // pipelined instead of one round trip after the other. Once the reply is full,
            // channels asking for data are refused unread.
            let admitted: Vec<Result<Arc<str>, ApiError>> = chunk
                .iter()
                .map(|name| match asked(&req, name) {
                    Some(what) if budget.is_full() => Err(budget.refusal(&what)),
                    _ => match hook_refusals.remove(name.as_str()) {
                        Some(refused) => Err(refused),
                        None => self.admit(name, &rule, server),
                    },
                })
                .collect();
            let node = &self.node;
            let attached = futures_util::future::join_all(admitted.iter().map(|a| async {
                match a {
                    Ok(ch) => Some(attach(node, ch, &req, &rule).await),
                    Err(_) => None,
                }
            }))
            .await;
            for ((name, admission), attachment) in chunk.iter().zip(admitted).zip(attached) {
                let outcome = match (admission, attachment) {
                    (Ok(ch), Some(Attached::Subscribed(read))) => {
                        let what = asked(&req, name).unwrap_or_default();
                        match read.and_then(|outcome| budget.fit(name, outcome, &what)) {
                            Ok(outcome) => {
                                self.count_subscription(&ch);
                                if let Outcome::Ok { position, .. } = &outcome {
                                    covered.insert(ch, position.offset);
                                }
                                outcome
                            }
                            Err(e) => {
                                // Counted by the broker, but the client is told it failed (or
                                // to ask again): undone, so that a retry is not refused as
                                // already subscribed.
                                self.node.hub.remove(&ch, self.outbox.id);
                                self.pending.remove(&ch);
                                let _ = self.node.broker.unsubscribe(&ch).await;
                                Outcome::Err(ErrorBody { code: e.code, message: e.message })
                            }
                        }
                    }
                    (Ok(ch), refused) => {
                        let e = match refused {
                            Some(Attached::Refused(e)) => e,
                            _ => ApiError::new(code::INTERNAL, "subscription not attempted"),
                        };
                        self.node.hub.remove(&ch, self.outbox.id);
                        self.pending.remove(&ch);
                        Outcome::Err(ErrorBody { code: e.code, message: e.message })
                    }
                    (Err(e), _) => Outcome::Err(ErrorBody { code: e.code, message: e.message }),
                };
                if let Outcome::Err(e) = &outcome {
                    budget.count_error(name, e);
                }
                results.push(((*name).clone(), outcome));
            }
        }
        // One shared copy of the results: the reply is encoded from it, and the pull
        // transports read it typed (`Kind::Reply` / `Kind::Subscribed`).
        let outcomes = Outcomes(Arc::from(results));
        let format = self.outbox.format;
        let reply = match id {
            _ if server => {
                Some((encode_subscribed(format, &SubscribeReply(&outcomes.0)), Kind::Subscribed(outcomes.clone())))
            }
            Some(id) => Some((
                encode_ok(format, id, &SubscribeReply(&outcomes.0)),
                Kind::Reply { id, error: None, outcomes: Some(outcomes.clone()) },
            )),
            // Without id only a failure is answered: the first failed channel's code.
            None => outcomes.first_error().map(|e| e.code).map(|code| {
                let bytes = encode_error(format, 0, code, "some channels could not be subscribed");
                (bytes, Kind::Reply { id: 0, error: Some(code), outcomes: Some(outcomes.clone()) })
            }),
        };
        match reply {
            Some((bytes, kind)) => self.outbox.release(&bytes, kind, &covered),
            None => self.outbox.release_without_reply(&covered),
        }
        // Presence joins go out after the reply, so a member sees itself join after subscribing.
        let joins: Vec<Arc<str>> =
            covered.keys().filter(|ch| self.node.config.namespace(namespace_of(ch)).presence).cloned().collect();
        for ch in joins {
            let info = ClientInfo { client: self.client.clone(), user: self.user.clone() };
            if self.node.broker.presence_add(&ch, info).await.is_ok() {
                self.present.insert(ch);
            }
        }
    }

    /// Checks one channel of a subscribe (name, permission, not yet subscribed, the limit) and
    /// adds this connection to the hub's subscribers of it.
    fn admit(&mut self, name: &str, rule: &Rule, server: bool) -> Result<Arc<str>, ApiError> {
        validate_channel(name).map_err(|e| ApiError::new(code::BAD_REQUEST, e.to_string()))?;
        if !server {
            self.allow(Action::Subscribe, name)?;
        }
        if self.subs.contains(name) {
            return Err(ApiError::new(code::CONFLICT, "already subscribed"));
        }
        if self.subs.len() + self.pending.len() >= self.node.config.limits.max_subscriptions {
            return Err(ApiError::new(
                code::LIMIT,
                format!("subscription limit of {} reached", self.node.config.limits.max_subscriptions),
            ));
        }
        self.node.hub_has_room(name)?;
        let ns = self.node.config.namespace(namespace_of(name));
        if matches!(rule, Rule::Delta) && (ns.conflate || ns.history_size == 0) {
            // A delta is against the previous publication: its subscriber must get every one.
            return Err(ApiError::new(
                code::BAD_REQUEST,
                format!("delta: {name} conflates or keeps no history; deltas need every publication in order"),
            ));
        }
        if let (true, Some(bucket)) = (ns.presence, &mut self.presence_rate) {
            let rate = self.node.config.limits.presence_changes_per_connection_per_s;
            if !bucket.take(rate as f64, Instant::now()) {
                return Err(ApiError::new(code::LIMIT, format!("more than {rate} presence joins per second")));
            }
        }
        let ch: Arc<str> = Arc::from(name);
        self.node.hub.add(&ch, &self.outbox, ns.conflate, rule.clone());
        self.pending.insert(ch.clone());
        Ok(ch)
    }

    /// A subscription the broker confirmed: it is this session's from now on.
    fn count_subscription(&mut self, ch: &Arc<str>) {
        self.pending.remove(ch);
        self.subs.insert(ch.clone());
        self.node.metrics.subscriptions.fetch_add(1, Relaxed);
    }

    pub(super) async fn unsubscribe(&mut self, name: &str) {
        if let Some(ch) = self.subs.take(name) {
            self.node.metrics.subscriptions.fetch_sub(1, Relaxed);
            self.node.hub.remove(&ch, self.outbox.id);
            self.outbox.forget_channel(&ch);
            let _ = self.node.broker.unsubscribe(&ch).await;
        }
        // A channel ended by the hub (below) keeps its presence entry until the client
        // unsubscribes or leaves: it is subscribing again.
        if self.present.remove(name) {
            let _ = self.node.broker.presence_remove(name, &self.client).await;
        }
    }

    /// Forgets the channels the hub ended with an `unsubscribed` push (their broker shard lost
    /// publications), so the client can subscribe them again. Their broker counts are released
    /// in a task: the broker serving them may be failing over, and the subscribe that follows
    /// must not wait for it (a count taken again meanwhile is not affected).
    pub(super) fn forget_lost(&mut self) {
        for name in self.outbox.take_lost() {
            let Some(ch) = self.subs.take(&name) else { continue };
            self.node.metrics.subscriptions.fetch_sub(1, Relaxed);
            self.node.hub.remove(&ch, self.outbox.id);
            self.outbox.forget_channel(&ch);
            let node = self.node.clone();
            tokio::spawn(async move {
                let _ = node.broker.unsubscribe(&ch).await;
            });
        }
    }
}
