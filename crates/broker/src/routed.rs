//! [`RoutedBroker`]: one [`Broker`] over several Redis servers, each channel served by exactly
//! one of them, the one its [`Router`] names: a shard by hash of the name
//! ([`crate::sharded::HashShards`]) or the primary serving its Redis Cluster slot
//! ([`crate::cluster::ClusterSlots`]). Each server is a full [`RedisBroker`] (its own command
//! connection and pub/sub link), so every per-channel guarantee of [`RedisBroker`] holds, and
//! a call costs what it costs on one server.
//!
//! The rules that do not depend on the topology live here, once:
//! - A batch is split by target (item order kept within each part), and the parts go out in
//!   parallel: one round trip per target. Items a target no longer serves (a moved slot), not
//!   routable yet (a slot without a primary), or refused before running (a failover, no
//!   connection) are sent again where the router points after following the change, until
//!   [`crate::PUBLISH_WAIT`] has passed.
//! - Reads, presence and leases go to the channel's target; on an error a topology change would
//!   explain (`MOVED`, `CLUSTERDOWN`, a dead connection) a router whose routes can change is
//!   refreshed and the call tried again, for up to [`RETRY_FOR`]. Long-poll sessions go whole
//!   to the target [`Router::session_route`] names, the same way (`routed/sessions.rs`).
//! - What the node tells the broker once (handler, node id, channel keep) is kept in
//!   [`Settings`] and fanned out to every target, including those a router makes later.
//! - Node-wide figures are the union over all targets: ready when every channel has a target
//!   and every target is ready, the slowest round trip, the merged cluster figures.

mod sessions;

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::redis::{link_down, may_retry, page_over, session_name, RedisBroker};
use crate::sessions::{SessionNotice, SessionStore};
use crate::{
    Broker, BrokerError, BrokerHandler, ChannelPage, ChannelQuery, ChannelTtl, ClientInfo, ClusterInfo, HistoryResult,
    LogEntry, LogKeep, Outgoing, Position, Publication, Record, RecordPut, TrendBucket, TrendPolicy,
};

/// How long a call keeps retrying while a router's routes change (slots moving, a failover
/// completing).
pub const RETRY_FOR: Duration = Duration::from_secs(5);
/// Pause between retries (the router follows the topology before each).
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A channel's target: borrowed from a router that holds its targets for good, owned when the
/// router's targets can change under the caller.
pub type Route<'a> = Cow<'a, Arc<RedisBroker>>;

/// Which Redis server serves which channel.
pub trait Router: Send + Sync + 'static {
    /// The broker's kind for `/api/info`.
    const KIND: &'static str;
    /// Whether a channel's target can change while the broker runs (slots move, a primary fails
    /// over). When false, calls are never retried elsewhere and subscriptions need no record
    /// of where they are held.
    const MOVES: bool;

    /// The target serving `channel` now; `Err` when none does (a slot without a primary).
    fn route(&self, channel: &str) -> Result<Route<'_>, BrokerError>;

    /// Every target, in an order that stays the same while the topology does (the channel
    /// listing pages through them in it). A router that makes targets later must give each
    /// the [`Settings`] and list it under one lock, so that a setting made meanwhile reaches it
    /// one way or the other.
    fn targets(&self) -> Vec<Arc<RedisBroker>>;

    /// Whether every channel has a target (`/readyz`).
    fn covered(&self) -> bool {
        true
    }

    /// Follows a topology change after an error one would explain (reads the routes again, at
    /// most so often). Routers that never move do nothing.
    fn refresh(&self) -> impl Future<Output = ()> + Send;

    /// The target that keeps long-poll session `id`, and the notices sent to the node named
    /// `id` ([`crate::sessions`]): by default the one that serves the slot of the session's
    /// keys (`P:poll:{<id>}…`), as it would a channel of that name.
    fn session_route(&self, id: &str) -> Result<Route<'_>, BrokerError> {
        self.route(&session_name(id))
    }

    /// Starts delivering the session notices sent to `node` ([`SessionStore::listen`]), from
    /// wherever [`Router::session_route`] sends them.
    fn listen(&self, node: &str) -> mpsc::UnboundedReceiver<SessionNotice>;
}

/// What the node tells the broker once, kept for the targets a router makes later.
#[derive(Default)]
pub struct Settings {
    handler: OnceLock<Arc<dyn BrokerHandler>>,
    node_id: OnceLock<String>,
    keep: OnceLock<ChannelTtl>,
}

impl Settings {
    /// Gives a new target everything set so far.
    pub fn apply(&self, target: &RedisBroker) {
        if let Some(h) = self.handler.get() {
            target.set_handler(h.clone());
        }
        if let Some(id) = self.node_id.get() {
            target.set_node_id(id);
        }
        if let Some(keep) = self.keep.get() {
            target.set_channel_ttl(keep.clone());
        }
    }
}

/// The targets holding a channel's local subscriptions, with their counts (a channel can be
/// held by two for a moment while its slot moves).
type Held = Vec<(Arc<RedisBroker>, usize)>;

/// Several Redis servers behind one [`Broker`]: see the module documentation.
pub struct RoutedBroker<R: Router> {
    router: R,
    settings: Arc<Settings>,
    /// Where each channel's local subscriptions are held, so that an unsubscribe reaches the
    /// target that counted the subscribe even after the channel moved (routers that move only).
    subs: Mutex<HashMap<Arc<str>, Held>>,
}

/// A batch item no target serves yet: its place in the batch, the item, why.
type Unrouted = (usize, Outgoing, BrokerError);

/// One target's part of a batch: the items (in item order) and their places in the batch.
struct Part<'a> {
    target: Route<'a>,
    places: Vec<usize>,
    items: Vec<Outgoing>,
}

impl<R: Router> RoutedBroker<R> {
    /// A broker over `router`, whose later targets get `settings` ([`Settings::apply`]).
    pub(crate) fn with_router(router: R, settings: Arc<Settings>) -> RoutedBroker<R> {
        RoutedBroker { router, settings, subs: Mutex::new(HashMap::new()) }
    }

    /// Runs `call` on the channel's target; while the error is one a topology change explains,
    /// follows the change and tries again, for up to [`RETRY_FOR`] (routers that move only).
    async fn on_owner<'s, T, F, Fut>(&'s self, channel: &str, call: F) -> Result<T, BrokerError>
    where
        F: Fn(Route<'s>) -> Fut,
        Fut: Future<Output = Result<T, BrokerError>>,
    {
        self.on_route(|| self.router.route(channel), retriable, call).await
    }

    /// [`RoutedBroker::on_owner`] on the target `route` names at each attempt, trying again
    /// after the errors `again` accepts.
    async fn on_route<'s, T, F, Fut>(
        &'s self,
        route: impl Fn() -> Result<Route<'s>, BrokerError>,
        again: fn(&BrokerError) -> bool,
        call: F,
    ) -> Result<T, BrokerError>
    where
        F: Fn(Route<'s>) -> Fut,
        Fut: Future<Output = Result<T, BrokerError>>,
    {
        let deadline = Instant::now() + RETRY_FOR;
        loop {
            let result = match route() {
                Ok(target) => call(target).await,
                Err(e) => Err(e),
            };
            match result {
                Err(e) if R::MOVES && again(&e) && Instant::now() < deadline => {
                    self.router.refresh().await;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                other => return other,
            }
        }
    }

    /// Groups `pending` by target, in item order; items without a target come back apart.
    fn split(&self, pending: Vec<(usize, Outgoing)>) -> (Vec<Part<'_>>, Vec<Unrouted>) {
        let mut parts: Vec<Part<'_>> = Vec::new();
        let mut unrouted = Vec::new();
        for (place, item) in pending {
            match self.router.route(&item.channel) {
                Ok(target) => {
                    let part = match parts.iter_mut().position(|p| Arc::ptr_eq(&p.target, &target)) {
                        Some(i) => &mut parts[i],
                        None => {
                            parts.push(Part { target, places: Vec::new(), items: Vec::new() });
                            let last = parts.len() - 1;
                            &mut parts[last]
                        }
                    };
                    part.places.push(place);
                    part.items.push(item);
                }
                Err(e) => unrouted.push((place, item, e)),
            }
        }
        (parts, unrouted)
    }
}

/// Whether a failed call may succeed on another try after following a topology change.
fn retriable(e: &BrokerError) -> bool {
    let BrokerError::Unavailable(text) = e else { return false };
    [
        "MOVED",
        "ASK",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "non local key",
        "down",
        "connection",
        "refused",
        "timed out",
        "broken pipe",
        "reset",
    ]
    .iter()
    .any(|s| text.contains(s))
}

/// Whether a failed publish attempt of `item` may be sent again: whenever it may on one server
/// ([`crate::redis::may_retry`]), and when its slot moved or no primary serves it yet (the
/// script was refused before running, or never sent).
fn retriable_publish(e: &BrokerError, item: &Outgoing) -> bool {
    may_retry(e, item)
        || matches!(e, BrokerError::Unavailable(text) if ["MOVED", "ASK", "no node serves"].iter().any(|s| text.contains(s)))
}

#[async_trait::async_trait]
impl<R: Router> Broker for RoutedBroker<R> {
    fn kind(&self) -> &'static str {
        R::KIND
    }

    /// Kept before it is fanned out: a target made meanwhile gets it one way or the other
    /// ([`Router::targets`]). The same for the node id and the channel keep.
    fn set_handler(&self, handler: Arc<dyn BrokerHandler>) {
        let _ = self.settings.handler.set(handler.clone());
        for t in self.router.targets() {
            t.set_handler(handler.clone());
        }
    }

    fn set_node_id(&self, id: &str) {
        let _ = self.settings.node_id.set(id.to_string());
        for t in self.router.targets() {
            t.set_node_id(id);
        }
    }

    fn set_channel_ttl(&self, keep: ChannelTtl) {
        let _ = self.settings.keep.set(keep.clone());
        for t in self.router.targets() {
            t.set_channel_ttl(keep.clone());
        }
    }

    /// Splits the batch by target (item order kept within each part), publishes the parts in
    /// parallel, one attempt each, and sends again what may be sent again: to where the
    /// router points by then, after a pause. Hands nothing to the handler: each target's
    /// pub/sub link flushes once per burst it receives.
    async fn publish_batch(&self, items: Vec<Outgoing>) -> Vec<Result<Position, BrokerError>> {
        let deadline = Instant::now() + crate::PUBLISH_WAIT;
        let mut results: Vec<Option<Result<Position, BrokerError>>> = vec![None; items.len()];
        let mut pending: Vec<(usize, Outgoing)> = items.into_iter().enumerate().collect();
        loop {
            let (parts, unrouted) = self.split(pending);
            let calls = parts.iter().map(|p| p.target.publish_on_node(&p.items, deadline.into_std()));
            let answers = futures_util::future::join_all(calls).await;
            let mut again = Vec::new();
            let time_left = Instant::now() + RETRY_PAUSE < deadline;
            for (part, answer) in parts.into_iter().zip(answers) {
                for ((place, item), r) in part.places.into_iter().zip(part.items).zip(answer) {
                    match r {
                        Ok(Some(position)) => results[place] = Some(Ok(position)),
                        // Not served there (nothing was done): to the new owner.
                        Ok(None) => again.push((place, item)),
                        // The script did not run, or its outcome is unknown and the item's
                        // idempotency key makes a second attempt answer the first result:
                        // safe to send again.
                        Err(e) if time_left && retriable_publish(&e, &item) => again.push((place, item)),
                        Err(e) => results[place] = Some(Err(e)),
                    }
                }
            }
            for (place, item, e) in unrouted {
                if Instant::now() < deadline {
                    again.push((place, item));
                } else {
                    results[place] = Some(Err(e));
                }
            }
            if again.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                for (place, _) in again {
                    results[place].get_or_insert_with(|| {
                        Err(BrokerError::Unavailable("redis: the channel's server did not settle in time".into()))
                    });
                }
                break;
            }
            again.sort_unstable_by_key(|(place, _)| *place);
            pending = again;
            self.router.refresh().await;
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(BrokerError::Unavailable("redis: publish not answered".into()))))
            .collect()
    }

    /// A target whose pub/sub link is down fails the subscribe at once, after one more look at
    /// the topology when routes can change (a Cluster may have promoted a replica already): a
    /// subscribe names many channels, and those on healthy servers must not wait out a
    /// failover. The client subscribes the refused channel again (503). Moved slots are
    /// retried as elsewhere.
    async fn subscribe(&self, channel: &str) -> Result<(), BrokerError> {
        let deadline = Instant::now() + RETRY_FOR;
        let mut looked_again = false;
        let target = loop {
            let result = match self.router.route(channel) {
                Ok(target) => target.subscribe(channel).await.map(|()| target),
                Err(e) => Err(e),
            };
            match result {
                Ok(target) => break target,
                Err(e) if !R::MOVES => return Err(e),
                Err(e) if link_down(&e) => {
                    if looked_again {
                        return Err(e);
                    }
                    looked_again = true;
                    self.router.refresh().await;
                }
                Err(e) if retriable(&e) && Instant::now() < deadline => {
                    self.router.refresh().await;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => return Err(e),
            }
        };
        if R::MOVES {
            let mut subs = self.subs.lock();
            let held = subs.entry(Arc::from(channel)).or_default();
            match held.iter_mut().find(|(t, _)| Arc::ptr_eq(t, &target)) {
                Some((_, count)) => *count += 1,
                None => held.push((target.into_owned(), 1)),
            }
        }
        Ok(())
    }

    /// Releases the subscription where it is held (the oldest holder first while a channel is
    /// held by two).
    async fn unsubscribe(&self, channel: &str) -> Result<(), BrokerError> {
        if !R::MOVES {
            return self.router.route(channel)?.unsubscribe(channel).await;
        }
        let target = {
            let mut subs = self.subs.lock();
            let Some(held) = subs.get_mut(channel) else { return Ok(()) };
            let Some(first) = held.first_mut() else { return Ok(()) };
            first.1 -= 1;
            let target = first.0.clone();
            if first.1 == 0 {
                held.remove(0);
            }
            if held.is_empty() {
                subs.remove(channel);
            }
            target
        };
        target.unsubscribe(channel).await
    }

    async fn last_or_start(&self, channel: &str) -> Result<(Position, Option<Publication>), BrokerError> {
        self.on_owner(channel, |t| async move { t.last_or_start(channel).await }).await
    }

    async fn last_if_known(&self, channel: &str) -> Result<Option<(Position, Option<Publication>)>, BrokerError> {
        self.on_owner(channel, |t| async move { t.last_if_known(channel).await }).await
    }

    async fn history(
        &self,
        channel: &str,
        since: Option<&Position>,
        limit: usize,
    ) -> Result<HistoryResult, BrokerError> {
        self.on_owner(channel, |t| async move { t.history(channel, since, limit).await }).await
    }

    async fn trend(&self, channel: &str, policy: TrendPolicy, since_ms: u64) -> Result<Vec<TrendBucket>, BrokerError> {
        self.on_owner(channel, |t| async move { t.trend(channel, policy, since_ms).await }).await
    }

    async fn presence_add(&self, channel: &str, info: ClientInfo) -> Result<(), BrokerError> {
        let info = &info;
        self.on_owner(channel, |t| async move { t.presence_add(channel, info.clone()).await }).await
    }

    async fn presence_remove(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        self.on_owner(channel, |t| async move { t.presence_remove(channel, client).await }).await
    }

    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        self.on_owner(channel, |t| async move { t.presence(channel).await }).await
    }

    /// A record set lives whole on the target its name routes to, like a channel.
    async fn record_put(&self, set: &str, entry: &Record, now_ms: u64, max: usize) -> Result<RecordPut, BrokerError> {
        self.on_owner(set, |t| async move { t.record_put(set, entry, now_ms, max).await }).await
    }

    async fn records(&self, set: &str, now_ms: u64) -> Result<Vec<Record>, BrokerError> {
        self.on_owner(set, |t| async move { t.records(set, now_ms).await }).await
    }

    /// Tables and logs live whole on the target their name routes to, as record sets do.
    async fn table_put(&self, name: &str, key: &str, value: &str) -> Result<(), BrokerError> {
        self.on_owner(name, |t| async move { t.table_put(name, key, value).await }).await
    }

    async fn table_remove(&self, name: &str, key: &str) -> Result<(), BrokerError> {
        self.on_owner(name, |t| async move { t.table_remove(name, key).await }).await
    }

    async fn table_all(&self, name: &str) -> Result<Vec<(String, String)>, BrokerError> {
        self.on_owner(name, |t| async move { t.table_all(name).await }).await
    }

    async fn log_append(&self, name: &str, entry: &str, keep: LogKeep) -> Result<String, BrokerError> {
        self.on_owner(name, |t| async move { t.log_append(name, entry, keep).await }).await
    }

    async fn log_read(&self, name: &str, before: Option<&str>, count: usize) -> Result<Vec<LogEntry>, BrokerError> {
        self.on_owner(name, |t| async move { t.log_read(name, before, count).await }).await
    }

    /// Target after target in the router's order, each in `SCAN` order (a `SCAN` on a Cluster
    /// primary sees only its own slots).
    async fn channels(&self, query: &ChannelQuery<'_>) -> Result<ChannelPage, BrokerError> {
        let targets = self.router.targets();
        let parts: Vec<&RedisBroker> = targets.iter().map(|t| &**t).collect();
        page_over(&parts, query).await
    }

    /// Every channel has a target, and every target is reachable with its pub/sub link up (and
    /// has the node registered, once it was told its id).
    async fn ready(&self) -> bool {
        if !self.router.covered() {
            return false;
        }
        let targets = self.router.targets();
        !targets.is_empty()
            && futures_util::future::join_all(targets.iter().map(|t| t.ready())).await.into_iter().all(|r| r)
    }

    /// The slowest target's.
    fn round_trip(&self) -> Option<Duration> {
        self.router.targets().iter().filter_map(|t| t.round_trip()).max()
    }

    fn sessions(&self) -> &dyn SessionStore {
        self
    }

    /// On the target of the lease's name, as a channel of that name would be.
    async fn lease(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, BrokerError> {
        self.on_owner(name, |t| async move { t.lease(name, holder, ttl).await }).await
    }

    async fn lease_release(&self, name: &str, holder: &str) -> Result<(), BrokerError> {
        self.on_owner(name, |t| async move { t.lease_release(name, holder).await }).await
    }

    /// Every node registers on every target (under its id only, once told it); a channel's
    /// subscriber counts live on its target. A target that cannot be reached is left out of
    /// the figures.
    async fn cluster(&self) -> Result<Option<ClusterInfo>, BrokerError> {
        let targets = self.router.targets();
        ClusterInfo::merge(futures_util::future::join_all(targets.iter().map(|t| t.cluster())).await)
    }
}
