//! Delivery accounting: what was expected, received once, received twice, or never.
//!
//! Each subscriber tracks the offsets it received in an [`OffsetSet`] relative to the channel
//! position its subscribe reply reported, so a duplicate is caught even if it arrives out of
//! order. Totals travel from workers to the coordinator in a [`Tally`], and the coordinator
//! derives loss from what it knows was published: `lost = expected - received`, where
//! `received` counts each (subscriber, offset) pair once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Largest offset distance from the base that a subscriber tracks (bits; 2 MiB of bitmap).
const MAX_SPAN: u64 = 1 << 24;

/// What happened to one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// First time this offset arrived.
    New,
    /// This offset had already arrived.
    Duplicate,
    /// At or before the subscription's base offset, or absurdly far beyond it.
    Unexpected,
}

/// The offsets one subscriber received after `base` (the offset in its subscribe reply).
#[derive(Debug, Clone, Default)]
pub struct OffsetSet {
    base: u64,
    bits: Vec<u64>,
}

impl OffsetSet {
    pub fn new(base: u64) -> Self {
        OffsetSet { base, bits: Vec::new() }
    }

    /// Marks `off` as received.
    pub fn insert(&mut self, off: u64) -> Delivery {
        if off <= self.base || off - self.base > MAX_SPAN {
            return Delivery::Unexpected;
        }
        let i = (off - self.base - 1) as usize;
        let (word, bit) = (i / 64, i % 64);
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        let mask = 1u64 << bit;
        if self.bits[word] & mask != 0 {
            Delivery::Duplicate
        } else {
            self.bits[word] |= mask;
            Delivery::New
        }
    }

    /// How many distinct offsets were received.
    pub fn distinct(&self) -> u64 {
        self.bits.iter().map(|w| u64::from(w.count_ones())).sum()
    }
}

/// Completion of one publication (burst) as seen by one worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BurstTally {
    /// Distinct deliveries of this publication.
    pub count: u64,
    /// Arrival time of the last one, unix µs (0 if none).
    pub last_us: u64,
}

impl BurstTally {
    pub fn merge(&mut self, other: &BurstTally) {
        self.count += other.count;
        self.last_us = self.last_us.max(other.last_us);
    }
}

/// Counters of one worker (and, summed, of a whole run).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Connections established (handshake and, where applicable, subscribe done).
    pub established: u64,
    /// Connections that could not be established.
    pub failed: u64,
    /// Established connections that ended before the run did.
    pub dropped: u64,
    /// Messages sent by the load generator (pings, publications).
    pub sent: u64,
    /// Distinct deliveries (or pongs) received.
    pub received: u64,
    pub duplicated: u64,
    /// Deliveries of offsets nobody published in this run, or pongs with no ping outstanding.
    pub unexpected: u64,
    /// Bytes received (the `limit` scenario).
    pub bytes: u64,
    /// Bytes read from the subscribers' sockets after their subscribe (WebSocket): what the
    /// deliveries cost on the wire, compressed or not (`broadcast`, `streams`).
    #[serde(default)]
    pub wire_bytes: u64,
    /// Connections whose server accepted permessage-deflate.
    #[serde(default)]
    pub deflated: u64,
    /// Arrival of the last delivery, unix µs.
    pub last_arrival_us: u64,
    /// Per publication, indexed by `seq`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bursts: Vec<BurstTally>,
    /// The first few distinct error messages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Failed connections counted by reason (scenarios that classify their failures).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failure_reasons: BTreeMap<String, u64>,
}

/// How many distinct error messages a tally keeps.
pub const MAX_ERRORS: usize = 8;

impl Tally {
    /// Bytes the sockets read per distinct delivery; `None` before any delivery.
    pub fn wire_bytes_per_delivery(&self) -> Option<f64> {
        (self.received > 0).then(|| self.wire_bytes as f64 / self.received as f64)
    }

    pub fn merge(&mut self, o: &Tally) {
        self.established += o.established;
        self.failed += o.failed;
        self.dropped += o.dropped;
        self.sent += o.sent;
        self.received += o.received;
        self.duplicated += o.duplicated;
        self.unexpected += o.unexpected;
        self.wire_bytes += o.wire_bytes;
        self.deflated += o.deflated;
        self.bytes += o.bytes;
        self.last_arrival_us = self.last_arrival_us.max(o.last_arrival_us);
        if self.bursts.len() < o.bursts.len() {
            self.bursts.resize(o.bursts.len(), BurstTally::default());
        }
        for (a, b) in self.bursts.iter_mut().zip(&o.bursts) {
            a.merge(b);
        }
        for e in &o.errors {
            self.note_error(e);
        }
        for (reason, n) in &o.failure_reasons {
            *self.failure_reasons.entry(reason.clone()).or_default() += n;
        }
    }

    /// Keeps `msg` if it is new and there is room.
    pub fn note_error(&mut self, msg: &str) {
        if self.errors.len() < MAX_ERRORS && !self.errors.iter().any(|e| e == msg) {
            self.errors.push(msg.to_string());
        }
    }

    /// Counts one delivery outcome.
    pub fn count(&mut self, d: Delivery) {
        match d {
            Delivery::New => self.received += 1,
            Delivery::Duplicate => self.duplicated += 1,
            Delivery::Unexpected => self.unexpected += 1,
        }
    }
}

/// Expected versus observed, for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageCounts {
    pub sent: u64,
    pub expected: u64,
    pub received: u64,
    pub lost: u64,
    pub duplicated: u64,
}

impl MessageCounts {
    /// `received` must count distinct deliveries only; loss is whatever of `expected` is
    /// missing. Unexpected deliveries count as duplicates: they are deliveries nobody asked for.
    pub fn from_tally(sent: u64, expected: u64, t: &Tally) -> Self {
        MessageCounts {
            sent,
            expected,
            received: t.received,
            lost: expected.saturating_sub(t.received),
            duplicated: t.duplicated + t.unexpected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounting_detects_duplicates_even_out_of_order() {
        let mut s = OffsetSet::new(41);
        assert_eq!(s.insert(42), Delivery::New);
        assert_eq!(s.insert(44), Delivery::New);
        assert_eq!(s.insert(43), Delivery::New);
        assert_eq!(s.insert(42), Delivery::Duplicate);
        assert_eq!(s.insert(44), Delivery::Duplicate);
        assert_eq!(s.insert(41), Delivery::Unexpected);
        assert_eq!(s.insert(41 + MAX_SPAN + 1), Delivery::Unexpected);
        assert_eq!(s.insert(200), Delivery::New);
        assert_eq!(s.distinct(), 4);
    }

    #[test]
    fn accounting_loss_is_expected_minus_distinct_received() {
        // Two subscribers, three publications (offsets 11..=13 after base 10). The first gets
        // everything and one duplicate; the second misses offset 12.
        let mut t = Tally::default();
        let mut a = OffsetSet::new(10);
        for off in [11, 12, 12, 13] {
            t.count(a.insert(off));
        }
        let mut b = OffsetSet::new(10);
        for off in [11, 13] {
            t.count(b.insert(off));
        }
        let m = MessageCounts::from_tally(3, 3 * 2, &t);
        assert_eq!(m, MessageCounts { sent: 3, expected: 6, received: 5, lost: 1, duplicated: 1 });
        // A duplicate never hides a loss: 6 arrivals but still one missing.
        assert_eq!(t.received + t.duplicated, 6);
    }

    #[test]
    fn accounting_tallies_merge_across_workers() {
        let mut a = Tally { established: 2, received: 5, last_arrival_us: 10, ..Default::default() };
        a.bursts = vec![BurstTally { count: 2, last_us: 7 }];
        a.note_error("x");
        let mut b = Tally { established: 3, failed: 1, received: 6, last_arrival_us: 9, ..Default::default() };
        b.bursts = vec![BurstTally { count: 3, last_us: 8 }, BurstTally { count: 3, last_us: 9 }];
        b.note_error("x");
        b.note_error("y");
        a.merge(&b);
        assert_eq!((a.established, a.failed, a.received, a.last_arrival_us), (5, 1, 11, 10));
        assert_eq!(a.bursts, vec![BurstTally { count: 5, last_us: 8 }, BurstTally { count: 3, last_us: 9 }]);
        assert_eq!(a.errors, vec!["x", "y"]);
    }
}
