//! What the fan-out wrote of a session's messages into a socket the session's stream or held
//! poll owns, for the session's live copy to take in ([`Streamed`]), and the framer's side of
//! it ([`Noting`]), which keeps the channel written last without a lock.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::outbox::{Kind, Message};
use crate::transport::poll_wire::{silent_reply, RESUBSCRIBE_ID, SILENT_ID};

/// What the fan-out wrote of a session's messages into a stream's or a held poll's socket, for
/// the live copy to take in (`Polls::take_streamed`): the highest offset per channel, how
/// many replies (the oldest of `Live::queued`, which were written in their order), and the
/// batch a poll was answered with (its number and body, kept to send again).
#[derive(Default)]
pub(crate) struct Streamed {
    offsets: HashMap<Arc<str>, u64>,
    pub(crate) replies: usize,
    pub(crate) batch: Option<(u64, Bytes)>,
}

impl Streamed {
    /// Keeps the highest offset noted for `ch`.
    fn note_offset(&mut self, ch: Arc<str>, off: u64) {
        let kept = self.offsets.entry(ch).or_insert(off);
        *kept = (*kept).max(off);
    }

    /// Whether any offset was noted since the last [`Streamed::take_offsets`].
    pub(crate) fn has_offsets(&self) -> bool {
        !self.offsets.is_empty()
    }

    /// The highest offset noted per channel.
    pub(crate) fn take_offsets(&mut self) -> impl Iterator<Item = (Arc<str>, u64)> + '_ {
        self.offsets.drain()
    }
}

/// A framer's side of a session's [`Streamed`]: the channel it wrote last and that offset,
/// and the batch a held poll was answered with last, are kept here, without a lock, and
/// handed over when another channel comes (the position), when the framer settles
/// ([`crate::outbox::Framer::settle`], before the live copy reads what was written) and when
/// it is dropped (detached). A session of one channel (a dashboard's value) notes each
/// publication with a comparison, and a poller's answers take no lock.
pub(crate) struct Noting {
    streamed: Arc<Mutex<Streamed>>,
    last: Option<(Arc<str>, u64)>,
    batch: Option<(u64, Bytes)>,
}

impl Noting {
    pub(crate) fn new(streamed: Arc<Mutex<Streamed>>) -> Noting {
        Noting { streamed, last: None, batch: None }
    }

    /// Notes `m`, which the fan-out is writing into a session's socket, and gives what the
    /// client sees of it: the message (lent: the publication's count, which every subscriber
    /// shares, is not touched), or for a subscribe sent without `id` only its error (`None`:
    /// nothing).
    pub(crate) fn note<'m>(&mut self, m: &'m Message) -> Option<Cow<'m, Bytes>> {
        match &m.kind {
            Kind::Pub { ch, off } => self.note_offset(ch, *off),
            Kind::Reply { id: SILENT_ID } => {
                self.streamed.lock().replies += 1;
                return silent_reply(&m.text).map(Cow::Owned);
            }
            // A takeover's resubscribe replies are all queued before its copy is found, so
            // whoever took the session over took them; they never enter `queued`.
            Kind::Reply { id } if *id != RESUBSCRIBE_ID => self.streamed.lock().replies += 1,
            _ => {}
        }
        Some(Cow::Borrowed(&m.text))
    }

    fn note_offset(&mut self, ch: &Arc<str>, off: u64) {
        if let Some((last, at)) = &mut self.last {
            if Arc::ptr_eq(last, ch) || **last == **ch {
                *at = (*at).max(off);
                return;
            }
        }
        if let Some((ch, at)) = self.last.replace((ch.clone(), off)) {
            self.streamed.lock().note_offset(ch, at);
        }
    }

    /// Keeps `body`, the batch numbered `seq` a held poll was answered with, until it is handed
    /// over in place of any kept before.
    pub(crate) fn keep_batch(&mut self, seq: u64, body: Bytes) {
        self.batch = Some((seq, body));
    }

    /// Hands what is kept here to the session's [`Streamed`].
    pub(crate) fn settle(&mut self) {
        if self.last.is_none() && self.batch.is_none() {
            return;
        }
        let mut st = self.streamed.lock();
        if let Some((ch, at)) = self.last.take() {
            st.note_offset(ch, at);
        }
        if let Some(batch) = self.batch.take() {
            st.batch = Some(batch);
        }
    }
}

impl Drop for Noting {
    fn drop(&mut self) {
        self.settle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publication(ch: &str, off: u64) -> Message {
        Message { text: Bytes::new(), kind: Kind::Pub { ch: Arc::from(ch), off } }
    }

    #[test]
    fn noting_keeps_the_highest_offset_per_channel_however_channels_alternate() {
        let streamed = Arc::new(Mutex::new(Streamed::default()));
        let mut noting = Noting::new(streamed.clone());
        assert!(!streamed.lock().has_offsets());
        // Another handle on the same name is the same channel.
        for (ch, off) in [("a", 3), ("a", 5), ("b", 1), ("a", 4), ("b", 7), ("a", 6)] {
            noting.note(&publication(ch, off));
        }
        noting.settle();
        let mut st = streamed.lock();
        assert!(st.has_offsets());
        let highest: HashMap<Arc<str>, u64> = st.take_offsets().collect();
        assert_eq!(highest, HashMap::from([(Arc::from("a"), 6), (Arc::from("b"), 7)]));
        assert!(!st.has_offsets(), "taken");
    }

    #[test]
    fn noting_hands_a_position_over_on_another_channel_on_settling_and_when_dropped() {
        let streamed = Arc::new(Mutex::new(Streamed::default()));
        let taken = |streamed: &Mutex<Streamed>| {
            let mut st = streamed.lock();
            let mut v: Vec<(String, u64)> = st.take_offsets().map(|(c, o)| (c.to_string(), o)).collect();
            v.sort();
            v
        };
        let mut noting = Noting::new(streamed.clone());
        noting.note(&publication("a", 1));
        noting.note(&publication("a", 2));
        assert!(!streamed.lock().has_offsets(), "one channel's position stays with the framer");
        noting.note(&publication("b", 5));
        assert_eq!(taken(&streamed), [("a".to_string(), 2)]);
        noting.settle();
        assert_eq!(taken(&streamed), [("b".to_string(), 5)]);
        noting.note(&publication("b", 6));
        drop(noting);
        assert_eq!(taken(&streamed), [("b".to_string(), 6)]);
    }

    #[test]
    fn noting_hands_the_last_answered_batch_over_on_settling_and_when_dropped() {
        let streamed = Arc::new(Mutex::new(Streamed::default()));
        let batch = |streamed: &Mutex<Streamed>| streamed.lock().batch.take().map(|(seq, b)| (seq, b.to_vec()));
        let mut noting = Noting::new(streamed.clone());
        noting.keep_batch(3, Bytes::from_static(b"three"));
        noting.keep_batch(4, Bytes::from_static(b"four"));
        assert_eq!(batch(&streamed), None, "kept by the framer");
        noting.settle();
        assert_eq!(batch(&streamed), Some((4, b"four".to_vec())), "the last one only");
        noting.settle();
        assert_eq!(batch(&streamed), None, "handed over once");
        noting.keep_batch(5, Bytes::from_static(b"five"));
        drop(noting);
        assert_eq!(batch(&streamed), Some((5, b"five".to_vec())));
    }
}
