//! The MQTT source's committing task: takes the backlog ([`super::backlog`]) from its front in
//! batches, offers the points to the node, and acknowledges each QoS 1/2 message once every
//! point it gave is committed or refused for good.
//!
//! - While the node cannot commit (its broker is down or failing over), what was not taken goes
//!   back to the backlog's front and is offered again after a pause that doubles from
//!   [`PAUSE_MIN`] to [`PAUSE_MAX`]; the source reads as not committing (a Sparkplug B primary
//!   host says it is offline, [`super::host`]).
//! - A point the node did not answer for (its outcome unknown) is looked for in the channel
//!   before it is offered again ([`crate::Sink::holds`]): committed once, never twice.
//! - Acknowledgements go out in the order the messages came (MQTT 3.1.1 §4.6): a message done
//!   behind one that is not waits, without its points, for its turn. A message of an earlier
//!   connection is not acknowledged on this one.
//! - A point the node refused for good (a limit, a value it cannot carry) is counted
//!   (`node`) and its message acknowledged: offered again, it would be refused again.
//! - While nothing waits, the node's readiness is asked every [`PROBE`], so that the source
//!   says it cannot commit before a value is lost to it; a batch the node has not answered
//!   within [`SLOW`] says so too (a broker that hangs answers only after its timeout).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::AsyncClient;
use tokio::sync::watch;

use super::backlog::{Backlog, Message};
use super::fed::Accepted;
use crate::{Item, Sink, SinkError, SourceStats};

/// How long a batch waits for more points after its first one.
pub const BATCH_WAIT: Duration = Duration::from_millis(2);
/// Most points in one batch.
pub const BATCH_MAX: usize = 500;
/// First pause before offering again what the node could not commit.
pub const PAUSE_MIN: Duration = Duration::from_millis(100);
/// Longest pause between offers while the node cannot commit.
pub const PAUSE_MAX: Duration = Duration::from_secs(1);
/// How often an idle source asks whether the node can commit.
pub const PROBE: Duration = Duration::from_secs(1);
/// How long the node may take to answer a batch before the source reads as not committing.
pub const SLOW: Duration = Duration::from_secs(1);

/// What the committing task works with.
pub struct Committer {
    pub backlog: Arc<Backlog>,
    pub sink: Arc<dyn Sink>,
    pub client: AsyncClient,
    pub stats: Arc<SourceStats>,
    pub name: String,
    pub accepted: Accepted,
    /// Whether the node commits what the source offers; watched by the Sparkplug host state.
    pub committing: watch::Sender<bool>,
    /// Turns true when the source stops: the batch under way is finished, acknowledgements
    /// included, and nothing more is taken.
    pub stop: watch::Receiver<bool>,
}

/// Commits the backlog until the source stops.
pub async fn run(mut c: Committer) {
    let mut pause = PAUSE_MIN;
    while !*c.stop.borrow() {
        let taken = tokio::select! {
            _ = c.stop.changed() => return,
            taken = c.backlog.take(BATCH_MAX) => taken,
            _ = tokio::time::sleep(PROBE) => {
                if c.backlog.idle() {
                    let ready = tokio::time::timeout(SLOW, c.sink.ready()).await.unwrap_or(false);
                    c.set_committing(ready);
                }
                continue;
            }
        };
        let mut taken = taken;
        let first: usize = taken.iter().map(|m| m.points.len()).sum();
        if first < BATCH_MAX {
            tokio::time::sleep(BATCH_WAIT).await;
            if let Some(more) = c.backlog.take_now(BATCH_MAX - first) {
                taken.extend(more);
            }
        }
        // A node that takes longer than SLOW to answer is not committing now, whatever it
        // answers later.
        let held_back = {
            let offer = c.offer(&mut taken);
            tokio::pin!(offer);
            tokio::select! {
                held_back = &mut offer => held_back,
                _ = tokio::time::sleep(SLOW) => {
                    c.set_committing(false);
                    offer.await
                }
            }
        };
        let (done, back) = split(taken);
        let acks: Vec<_> = {
            let conn = c.backlog.conn();
            done.iter().filter(|m| m.conn == conn).filter_map(|m| m.ack.clone()).collect()
        };
        c.backlog.done(done.len(), &done);
        for publish in &acks {
            // An error: the connection is gone, and the MQTT broker delivers the message again.
            let _ = c.client.ack(publish).await;
        }
        let retry = held_back;
        if !back.is_empty() {
            c.backlog.put_back(back.len(), back);
        }
        c.set_committing(!retry);
        if retry {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = c.stop.changed() => return,
            }
            pause = (pause * 2).min(PAUSE_MAX);
        } else {
            pause = PAUSE_MIN;
        }
    }
}

impl Committer {
    /// Offers the points of `taken` to the node and removes those done (committed or refused
    /// for good) from their messages; true when any stays because the node could not commit
    /// it (or could not say whether it had).
    async fn offer(&self, taken: &mut [Message]) -> bool {
        let unverified = self.verify(taken).await;
        let items: Vec<Item> = taken
            .iter()
            .flat_map(|m| &m.points)
            .filter(|p| !p.verify)
            .map(|p| Item { channel: p.channel.clone(), data: p.data.clone(), historical: p.historical })
            .collect();
        if items.is_empty() {
            return unverified;
        }
        let mut results = self.sink.publish_batch(items).await.into_iter();
        let (mut ok, mut refused, mut kept) = (0u64, 0u64, unverified);
        let mut first_refusal = None;
        for m in taken.iter_mut() {
            m.points.retain_mut(|p| {
                if p.verify {
                    return true;
                }
                match results.next() {
                    Some(Ok(())) => {
                        ok += 1;
                        self.accepted_one(p);
                        false
                    }
                    Some(Err(SinkError::Refused(why))) => {
                        refused += 1;
                        first_refusal.get_or_insert(why);
                        false
                    }
                    Some(Err(SinkError::Unknown(_))) => {
                        p.verify = true;
                        kept = true;
                        true
                    }
                    Some(Err(SinkError::Unavailable(_))) | None => {
                        kept = true;
                        true
                    }
                }
            });
        }
        self.stats.points.fetch_add(ok, Relaxed);
        if let Some(why) = first_refusal {
            self.stats.refusals.add("node", refused);
            tracing::warn!(source = %self.name, refused, "the node refused MQTT points: {why}");
        }
        kept
    }

    fn accepted_one(&self, p: &super::backlog::Queued) {
        if !p.historical {
            self.accepted.record(std::iter::once((p.channel.as_str(), &p.v)));
        }
    }

    /// Points whose outcome was unknown: those the channel holds now are done, those it does
    /// not are offered again; true when the node could not say (they stay marked).
    async fn verify(&self, taken: &mut [Message]) -> bool {
        let mut unanswered = false;
        for m in taken.iter_mut() {
            let mut kept = Vec::with_capacity(m.points.len());
            for mut p in std::mem::take(&mut m.points) {
                if p.verify {
                    match self.sink.holds(&p.channel, &p.data).await {
                        Ok(true) => {
                            self.stats.points.fetch_add(1, Relaxed);
                            self.accepted_one(&p);
                            continue;
                        }
                        Ok(false) => p.verify = false,
                        Err(_) => unanswered = true,
                    }
                }
                kept.push(p);
            }
            m.points = kept;
        }
        unanswered
    }

    fn set_committing(&self, now: bool) {
        let was = self.committing.send_replace(now);
        if was != now {
            match now {
                true => tracing::info!(source = %self.name, "the node commits the source's values again"),
                false => tracing::warn!(
                    source = %self.name,
                    "the node cannot commit the source's values: QoS 1/2 messages stay unacknowledged in the MQTT \
                     broker's session, QoS 0 values wait within buffer_bytes"
                ),
            }
        }
    }
}

/// Splits taken messages into those done, from the front up to the first that is not, and the
/// rest (which go back, see the module doc).
fn split(taken: Vec<Message>) -> (Vec<Message>, Vec<Message>) {
    let at = taken.iter().position(|m| !m.points.is_empty()).unwrap_or(taken.len());
    let mut done = taken;
    let back = done.split_off(at);
    (done, back)
}
