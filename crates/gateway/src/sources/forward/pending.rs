//! [`Pending`]: what a node keeps of forwarded writes ([`super`]): those it forwarded and waits
//! for, by request id, and the counters. Apart from the forwarding so that the node owns it
//! without depending on how writes travel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::error::ApiError;

/// Forwarded writes waiting for their answers on one node, at most; more are answered 503.
pub const MAX_WAITING: usize = 4096;

/// What a forwarded write's answer is: written, or what the caller is told.
pub type Answer = Result<(), ApiError>;

/// One node's forwarded writes.
pub struct Pending {
    /// Request ids start at a random number: a node restarted under the same id must not take
    /// a late answer to its previous life's request for one of its own.
    next_id: AtomicU64,
    /// Writes waiting for their answer, by request id. Held only to insert or remove, never
    /// across an await; bounded by [`MAX_WAITING`].
    waiting: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    /// Set once this node is subscribed to its reply channel.
    pub replies: tokio::sync::OnceCell<()>,
    /// Writes this node forwarded to the node running their source.
    pub sent: AtomicU64,
    /// Forwarded writes this node made for other nodes and answered.
    pub served: AtomicU64,
    /// Forwarded writes not answered in time.
    pub timed_out: AtomicU64,
}

impl Default for Pending {
    fn default() -> Pending {
        Pending {
            next_id: AtomicU64::new(fastrand::u64(..) >> 12),
            waiting: Mutex::new(HashMap::new()),
            replies: tokio::sync::OnceCell::new(),
            sent: AtomicU64::new(0),
            served: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
        }
    }
}

/// A write waiting for its answer; dropping it removes the entry however the wait ends
/// (answered, timed out, or the caller went away and its future was dropped).
pub struct Waiting<'a> {
    pending: &'a Pending,
    pub id: u64,
    pub answer: oneshot::Receiver<Answer>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.pending.waiting.lock().remove(&self.id);
    }
}

impl Pending {
    /// A new waiting write with a fresh id; `None` when [`MAX_WAITING`] already wait.
    pub fn add(&self) -> Option<Waiting<'_>> {
        let id = self.next_id.fetch_add(1, Relaxed);
        let (tx, answer) = oneshot::channel();
        let mut waiting = self.waiting.lock();
        if waiting.len() >= MAX_WAITING {
            return None;
        }
        waiting.insert(id, tx);
        Some(Waiting { pending: self, id, answer })
    }

    /// Hands the answer to write `id`; dropped when that write no longer waits (timed out,
    /// its caller left, or an answer came already).
    pub fn answer(&self, id: u64, answer: Answer) {
        if let Some(tx) = self.waiting.lock().remove(&id) {
            let _ = tx.send(answer);
        }
    }

    /// Prometheus text of the counters.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, help, v) in [
            ("sent", "Writes forwarded to the node that runs their source.", &self.sent),
            ("served", "Writes forwarded by other nodes that this node made and answered.", &self.served),
            ("timed_out", "Forwarded writes not answered in time (503).", &self.timed_out),
        ] {
            let name = format!("switchboard_source_forwarded_writes_{name}_total");
            out += &format!("# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n", v.load(Relaxed));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_answers_reach_their_waiting_write_once() {
        let p = Pending::default();
        let mut w = p.add().unwrap();
        p.answer(w.id, Err(ApiError::new(502, "device refused the write: no")));
        assert_eq!(w.answer.try_recv().unwrap(), Err(ApiError::new(502, "device refused the write: no")));
        assert!(p.waiting.lock().is_empty());
        // A late or unknown answer changes nothing.
        p.answer(w.id, Ok(()));
        p.answer(12345, Ok(()));
        let mut v = p.add().unwrap();
        assert_ne!(v.id, w.id);
        p.answer(v.id, Ok(()));
        assert_eq!(v.answer.try_recv().unwrap(), Ok(()));
    }

    #[test]
    fn forward_waiting_entries_go_when_the_wait_ends_and_are_bounded() {
        let p = Pending::default();
        let w = p.add().unwrap();
        drop(w);
        assert!(p.waiting.lock().is_empty(), "a dropped wait leaves nothing behind");
        let all: Vec<Waiting<'_>> = (0..MAX_WAITING).map(|_| p.add().unwrap()).collect();
        assert!(p.add().is_none(), "bounded");
        drop(all);
        assert!(p.add().is_some());
    }
}
