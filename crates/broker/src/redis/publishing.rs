//! Publishing on one Redis server: the publish script's call, and waiting for a server that
//! is unreachable or failing over ([`crate::PUBLISH_WAIT`]) without ever publishing an item
//! twice.

use std::time::{Duration, Instant};

use super::{moved, new_epoch, Inner};
use crate::{BrokerError, Outgoing, Position};

/// Publications per publish script call: bounds how long one call holds Redis (a few ms).
const PUBLISH_CHUNK: usize = 500;
/// Pause between attempts of a publish waiting for Redis ([`crate::PUBLISH_WAIT`]).
const PUBLISH_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Whether a failed publish attempt of `item` may be sent again: it was certainly not
/// published and the cause may pass (a connection, a failover, a server loading), or its
/// outcome is unknown and its idempotency key makes a second attempt harmless.
pub(crate) fn may_retry(e: &BrokerError, item: &Outgoing) -> bool {
    match e {
        BrokerError::Unknown(_) => item.idempotency_key.is_some(),
        BrokerError::Unavailable(text) => {
            ["not connected", "READONLY", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"]
                .iter()
                .any(|s| text.contains(s))
        }
        _ => false,
    }
}

impl Inner {
    /// Publishes `items` with one script call (one round trip, one `TIME`): offsets in item
    /// order per channel. The positions come back in item order; `None` for an item whose
    /// slot a Cluster node does not serve (nothing was done for it). Gives up at `deadline`.
    ///
    /// Errors say whether the items may have been published: [`BrokerError::Unavailable`]
    /// when the script was never sent or Redis refused it (no connection, a replica, loading),
    /// [`BrokerError::Unknown`] when it was sent and no answer came back (a timeout, a
    /// connection lost on the way).
    pub(crate) async fn publish_chunk(
        &self,
        items: &[Outgoing],
        deadline: Instant,
    ) -> Result<Vec<Option<Position>>, BrokerError> {
        let mut conn = match tokio::time::timeout_at(deadline.into(), self.conn()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(BrokerError::Unavailable(e))) => {
                return Err(BrokerError::Unavailable(format!("not connected: {e}")))
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(BrokerError::Unavailable("redis: not connected in time".into())),
        };
        let mut call = self.scripts.publish.prepare_invoke();
        call.arg(new_epoch());
        if self.cluster {
            call.arg(items.len());
            for item in items {
                call.arg(self.keys.meta(&item.channel)).arg(self.keys.history(&item.channel));
            }
        } else {
            for item in items {
                call.key(self.keys.meta(&item.channel)).key(self.keys.history(&item.channel));
            }
        }
        let window_ms = crate::IDEMPOTENCY_WINDOW.as_millis() as u64;
        // Where each trend value goes, for the compactor (`trend_store`) once it is published.
        let now = crate::now_ms();
        let mut trends = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let ttl_ms = u64::try_from(item.policy.ttl.as_millis()).unwrap_or(u64::MAX);
            call.arg(item.data.get()).arg(item.policy.size).arg(ttl_ms).arg(self.keys.pubsub(&item.channel));
            call.arg(self.keep_ms(&item.channel));
            match (item.policy.trend, item.policy.trend.and_then(|_| crate::trend::sample(item.data.get()))) {
                (Some(tiers), Some((v, Some(at)))) if item.historical => {
                    // At its own time only: the script skips a tier that does not reach it
                    // by Redis's clock.
                    let mut spec = format!("{v:?}");
                    for t in tiers.backfill_placements(now, at) {
                        trends.push((index, &*item.channel, t, at));
                        spec.push_str(&format!(";{},{},{at}", t.step_ms.max(1), t.len.max(1)));
                    }
                    call.arg(spec)
                }
                (Some(tiers), Some((v, at))) if !item.historical => {
                    let mut spec = format!("{v:?}");
                    for (t, placed) in tiers.placements(now, at) {
                        let Some(placed) = placed else { continue };
                        trends.push((index, &*item.channel, t, placed));
                        // The script places a value at Redis's time when its own one is not
                        // given (0) or out of this tier's reach there.
                        let own = if at.is_some() && placed != now { placed } else { 0 };
                        spec.push_str(&format!(";{},{},{own}", t.step_ms.max(1), t.len.max(1)));
                    }
                    call.arg(spec)
                }
                _ => call.arg(""),
            };
            match &item.idempotency_key {
                Some(key) => call.arg(self.keys.idempotency(&item.channel, key)),
                None => call.arg(""),
            };
            call.arg(window_ms).arg(if item.historical { "1" } else { "" });
            match &item.tags {
                Some(tags) => call.arg(serde_json::to_string(&**tags).unwrap_or_default()),
                None => call.arg(""),
            };
        }
        let answer = tokio::time::timeout_at(deadline.into(), call.invoke_async::<Vec<(String, u64)>>(&mut conn)).await;
        let flat = match answer {
            Ok(Ok(flat)) => flat,
            Ok(Err(e)) if e.is_timeout() || e.is_io_error() || e.is_connection_dropped() => {
                let e = self.failed(e);
                return Err(BrokerError::Unknown(e.to_string()));
            }
            Ok(Err(e)) => return Err(self.failed(e)),
            Err(_) => return Err(BrokerError::Unknown("redis: no answer in time".into())),
        };
        if flat.len() != items.len() {
            return Err(BrokerError::Unavailable("redis answered a publish batch with the wrong count".into()));
        }
        for (index, channel, policy, at) in trends {
            // An empty epoch: a Cluster node that does not serve the slot published nothing.
            if flat[index].0.is_empty() {
                continue;
            }
            match items[index].historical {
                true => self.trends.historical(channel, policy, at, now),
                false => self.trends.published(channel, policy, at),
            }
        }
        Ok(flat
            .into_iter()
            .map(|(epoch, offset)| (!epoch.is_empty()).then(|| Position { epoch: epoch.into(), offset }))
            .collect())
    }

    /// [`Self::publish_chunk`] over any number of items, in chunks of [`PUBLISH_CHUNK`], one
    /// attempt each (for several servers, [`crate::routed`] retries where the router points).
    pub(crate) async fn publish_all(
        &self,
        items: &[Outgoing],
        deadline: Instant,
    ) -> Vec<Result<Option<Position>, BrokerError>> {
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(PUBLISH_CHUNK) {
            match self.publish_chunk(chunk, deadline).await {
                Ok(positions) => out.extend(positions.into_iter().map(Ok)),
                Err(e) => out.extend(chunk.iter().map(|_| Err(e.clone()))),
            }
        }
        out
    }

    /// [`Self::publish_all`] that waits for Redis up to [`crate::PUBLISH_WAIT`]: items that
    /// were certainly not published (no connection, a replica that has not been replaced
    /// yet, a server loading its data) are sent again every [`PUBLISH_RETRY_PAUSE`], and so are
    /// items with an idempotency key whose outcome is unknown (Redis answers the first
    /// result for them if the first attempt was committed). Items without a key whose outcome
    /// is unknown are answered [`BrokerError::Unknown`] at once: sending them again could
    /// publish them twice.
    pub(super) async fn publish_waiting(&self, items: &[Outgoing]) -> Vec<Result<Position, BrokerError>> {
        let deadline = Instant::now() + crate::PUBLISH_WAIT;
        let mut results: Vec<Option<Result<Position, BrokerError>>> = vec![None; items.len()];
        let mut pending: Vec<usize> = (0..items.len()).collect();
        loop {
            // The first attempt sends the items as given; a retry only those still pending.
            let answers = if pending.len() == items.len() {
                self.publish_all(items, deadline).await
            } else {
                let batch: Vec<Outgoing> = pending.iter().map(|&i| items[i].clone()).collect();
                self.publish_all(&batch, deadline).await
            };
            let mut again = Vec::new();
            let time_left = Instant::now() + PUBLISH_RETRY_PAUSE < deadline;
            for (&i, answer) in pending.iter().zip(answers) {
                match answer {
                    Ok(Some(position)) => results[i] = Some(Ok(position)),
                    Ok(None) => results[i] = Some(Err(moved())),
                    Err(e) if time_left && may_retry(&e, &items[i]) => again.push(i),
                    Err(e) => results[i] = Some(Err(e)),
                }
            }
            if again.is_empty() {
                break;
            }
            pending = again;
            tokio::time::sleep(PUBLISH_RETRY_PAUSE).await;
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(BrokerError::Unavailable("redis: publish not answered".into()))))
            .collect()
    }
}
