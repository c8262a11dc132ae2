//! What becomes of a transition, in the order they happened (one task): the state is stored
//! for whichever node evaluates next (table `alarms.states`), published on `alarm:{id}` and
//! `alarm:all`, appended to the journal (`alarms::journal`) and counted. A new alarm's first
//! state is stored and published the same way, without a journal entry. An operator's action
//! is told when its transition is through, so that its answer follows the journal entry. A
//! broker that fails is tried again a few times; what still fails is logged (at a bounded
//! rate) and the next transition goes on.

use std::sync::{Arc, Weak};

use serde_json::value::RawValue;
use tokio::sync::mpsc;

use super::engine::{Alarms, Job, ALL};
use super::state::{Kind, Status};
use super::{channel_of, journal, STATES};
use crate::node::Node;

pub(super) async fn run(alarms: Arc<Alarms>, node: Weak<Node>, mut queue: mpsc::UnboundedReceiver<Job>) {
    while let Some(job) = queue.recv().await {
        let Some(node) = node.upgrade() else { return };
        match job {
            Job::Transition(t, done) => {
                store(&node, &t.status).await;
                publish(&node, &t.status, true).await;
                journal::append(&node, &journal::Entry::of(&t)).await;
                count(&alarms, t.status.priority.as_str(), t.kind);
                if let Some(done) = done {
                    let _ = done.send(());
                }
            }
            Job::Fresh(status) => {
                store(&node, &status).await;
                publish(&node, &status, true).await;
            }
            Job::Follow(channel) => super::follow(&alarms, &node, channel),
        }
    }
}

async fn store(node: &Node, status: &Status) {
    let Ok(state) = serde_json::to_string(status) else { return };
    super::retry(node, "store an alarm state", || node.broker.table_put(STATES, &status.id, &state)).await;
}

pub(super) fn count(alarms: &Alarms, priority: &'static str, kind: Kind) {
    *alarms.transitions.lock().entry((priority, kind.as_str())).or_default() += 1;
}

/// Publishes `status` on its `alarm:` channel, and on `alarm:all` when `all`.
pub(super) async fn publish(node: &Node, status: &Status, all: bool) {
    let Ok(json) = serde_json::to_string(status) else { return };
    let Ok(data) = RawValue::from_string(json) else { return };
    let data = Arc::new(data);
    let own = channel_of(&status.id);
    let mut channels = vec![own.as_str()];
    if all {
        channels.push(ALL);
    }
    let items = channels.iter().map(|ch| node.check_alarm_state(ch, data.clone())).collect();
    for r in node.publish_batch(items).await {
        if let Err(e) = r {
            super::warn(node, "publish an alarm state", &e.message);
        }
    }
}

/// An alarm whose definition is gone: its stored state leaves, its screens are told.
pub(super) async fn remove(alarms: &Alarms, node: &Arc<Node>, mut status: Status) {
    alarms.view.write().remove(&status.id);
    super::retry(node, "remove an alarm state", || node.broker.table_remove(STATES, &status.id)).await;
    status.removed = true;
    status.seq += 1;
    status.since = switchboard_broker::now_ms();
    publish(node, &status, true).await;
}
