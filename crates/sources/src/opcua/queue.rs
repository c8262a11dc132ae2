//! The queue between the session's event loop (which receives notifications) and the source's
//! publisher (which turns them into points), bounded in bytes.
//!
//! The event loop must never wait, so [`ChangeQueue::push`] never blocks. While the queued
//! values fit in the bound they are kept in arrival order. Past the bound the queue keeps only
//! the latest change of each node (a newer value replaces an older one that was not taken yet),
//! and a value that does not fit even then is replaced by a small [`Refusal::QueueFull`]
//! marker, so that its point is marked bad rather than left standing. Every value the queue
//! does not hand on is counted ([`Taken::dropped`]). The memory held is at most the bound plus
//! one marker per node.
//!
//! Order: the publisher takes everything at once ([`ChangeQueue::take`]); the kept-latest
//! changes are all newer than the in-order ones, so the values of one node stay in the order
//! the server sent them.

use std::collections::BTreeMap;

use opcua::types::{DataValue, Variant};

/// One value change of a monitored item, or why its value is not carried.
#[derive(Debug)]
pub struct Change {
    /// The monitored item's client handle (index of the point + 1).
    pub handle: u32,
    /// The value with its status and timestamps; its value is dropped when refused.
    pub value: DataValue,
    pub refused: Option<Refusal>,
}

/// Why a change reaches the publisher without its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The value's JSON would be at least this many bytes: more than the node takes.
    Oversized(usize),
    /// The queue was full and could not keep it.
    QueueFull,
}

/// Bytes a change is counted for besides its value's text and arrays (the DataValue with its
/// status and two timestamps, the handle, the queue slot).
const CHANGE_OVERHEAD: usize = 64;
/// Bytes one variant is counted for besides its text (the in-memory size of a `Variant`).
const VARIANT_OVERHEAD: usize = 24;

impl Change {
    /// The change with its value dropped, for `why`.
    pub fn refuse(mut self, why: Refusal) -> Change {
        self.value.value = None;
        self.refused = Some(why);
        self
    }

    /// What the change is counted for in the queue's bound: an estimate of the memory it holds.
    pub fn bytes(&self) -> usize {
        CHANGE_OVERHEAD + self.value.value.as_ref().map_or(0, mem_bytes)
    }
}

/// An estimate of the memory a variant holds (text, bytes, array elements).
pub fn mem_bytes(v: &Variant) -> usize {
    VARIANT_OVERHEAD
        + match v {
            Variant::String(s) => s.value().as_ref().map_or(0, |s| s.len()),
            Variant::ByteString(b) => b.value.as_ref().map_or(0, Vec::len),
            Variant::XmlElement(x) => x.to_string().len(),
            Variant::LocalizedText(t) => t.text.value().as_ref().map_or(0, |s| s.len()),
            Variant::Variant(inner) => mem_bytes(inner),
            Variant::Array(a) => a.values.iter().map(mem_bytes).sum(),
            _ => 0,
        }
}

/// A lower bound of the length of the variant's JSON ([`super::convert::JsonVariant`]): text is
/// at least its bytes, a ByteString its base64, an array one byte per element besides its
/// elements. A value whose bound is over the node's limit can be refused before it is encoded.
pub fn json_floor(v: &Variant) -> usize {
    match v {
        Variant::String(s) => s.value().as_ref().map_or(0, |s| s.len()),
        Variant::ByteString(b) => b.value.as_ref().map_or(0, |b| b.len() / 3 * 4),
        Variant::XmlElement(x) => x.to_string().len(),
        Variant::LocalizedText(t) => t.text.value().as_ref().map_or(0, |s| s.len()),
        Variant::Variant(inner) => json_floor(inner),
        Variant::Array(a) => a.values.iter().map(|e| json_floor(e) + 1).sum(),
        _ => 1,
    }
}

/// Changes queued for the publisher; see the module doc.
pub struct ChangeQueue {
    // A blocking mutex: held for a few map operations, never across an await, and taken from
    // the session's event loop, which must not yield while it hands over a notification.
    state: parking_lot::Mutex<State>,
    ready: tokio::sync::Notify,
    limit: usize,
}

#[derive(Default)]
struct State {
    in_order: Vec<Change>,
    /// While the queue is past its bound: the latest change of each node, all newer than
    /// `in_order`.
    latest: BTreeMap<u32, Change>,
    bytes: usize,
    dropped: u64,
}

/// What [`ChangeQueue::take`] hands over.
pub struct Taken {
    pub changes: Vec<Change>,
    /// Values not handed on since the last take (replaced by a newer one of the same node, or
    /// by a [`Refusal::QueueFull`] marker).
    pub dropped: u64,
}

impl ChangeQueue {
    /// A queue holding at most `limit` bytes of changes (plus one marker per node past it).
    pub fn new(limit: usize) -> ChangeQueue {
        ChangeQueue { state: parking_lot::Mutex::default(), ready: tokio::sync::Notify::new(), limit }
    }

    /// Queues changes without waiting (see the module doc for what happens past the bound).
    pub fn push(&self, changes: impl IntoIterator<Item = Change>) {
        let mut st = self.state.lock();
        let mut any = false;
        for change in changes {
            any = true;
            let size = change.bytes();
            if st.latest.is_empty() && st.bytes + size <= self.limit {
                st.bytes += size;
                st.in_order.push(change);
                continue;
            }
            let replaced = st.latest.get(&change.handle).map_or(0, Change::bytes);
            let change = if st.bytes - replaced + size > self.limit {
                st.dropped += 1;
                change.refuse(Refusal::QueueFull)
            } else {
                change
            };
            st.bytes += change.bytes();
            if let Some(old) = st.latest.insert(change.handle, change) {
                st.bytes -= old.bytes();
                if old.refused != Some(Refusal::QueueFull) {
                    st.dropped += 1;
                }
            }
        }
        drop(st);
        if any {
            self.ready.notify_one();
        }
    }

    /// Everything queued, once there is something (waits until then).
    pub async fn take(&self) -> Taken {
        loop {
            {
                let mut st = self.state.lock();
                if !st.in_order.is_empty() || !st.latest.is_empty() {
                    let mut changes = std::mem::take(&mut st.in_order);
                    changes.extend(std::mem::take(&mut st.latest).into_values());
                    st.bytes = 0;
                    return Taken { changes, dropped: std::mem::take(&mut st.dropped) };
                }
            }
            // `notify_one` keeps a permit when nobody waits: a push between the check above
            // and this wait is not missed.
            self.ready.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(handle: u32, text: &str) -> Change {
        Change { handle, value: DataValue::value_only(Variant::from(text)), refused: None }
    }

    fn text(c: &Change) -> Option<String> {
        match &c.value.value {
            Some(Variant::String(s)) => s.value().clone(),
            _ => None,
        }
    }

    #[tokio::test]
    async fn opcua_queue_keeps_order_within_its_bound() {
        let q = ChangeQueue::new(10_000);
        q.push([change(1, "a"), change(2, "b"), change(1, "c")]);
        let taken = q.take().await;
        let got: Vec<_> = taken.changes.iter().map(|c| (c.handle, text(c))).collect();
        assert_eq!(got, [(1, Some("a".into())), (2, Some("b".into())), (1, Some("c".into()))]);
        assert_eq!(taken.dropped, 0);
    }

    #[tokio::test]
    async fn opcua_queue_past_its_bound_keeps_the_latest_value_per_node() {
        let q = ChangeQueue::new(1000);
        q.push([change(1, "a"), change(2, "b")]);
        // Too large for what is left: node 3's value becomes a marker, and from here on only
        // the latest change of each node is kept.
        q.push([change(3, &"x".repeat(5000)), change(1, "c"), change(2, "d"), change(1, "e")]);
        let taken = q.take().await;
        let got: Vec<_> = taken.changes.iter().map(|c| (c.handle, text(c), c.refused)).collect();
        assert_eq!(
            got,
            [
                (1, Some("a".into()), None),
                (2, Some("b".into()), None),
                (1, Some("e".into()), None),
                (2, Some("d".into()), None),
                (3, None, Some(Refusal::QueueFull)),
            ]
        );
        // Not handed on: node 3's value (a marker instead) and node 1's "c" (replaced by "e").
        assert_eq!(taken.dropped, 2);
        // The bound is released with the take: values queue in order again.
        q.push([change(3, "f"), change(3, "g")]);
        let got: Vec<_> = q.take().await.changes.iter().map(text).collect();
        assert_eq!(got, [Some("f".into()), Some("g".into())]);
    }

    #[tokio::test]
    async fn opcua_queue_turns_values_that_do_not_fit_into_markers() {
        let one = change(1, "x").bytes();
        let q = ChangeQueue::new(2 * one);
        // The third value finds the queue full: a marker; so does every value after it that
        // does not fit in the room left beside the markers.
        q.push((1..=5).map(|h| change(h, "x")));
        let taken = q.take().await;
        let refused: Vec<_> = taken.changes.iter().map(|c| (c.handle, c.refused.is_some())).collect();
        assert_eq!(refused, [(1, false), (2, false), (3, true), (4, true), (5, true)]);
        assert_eq!(taken.dropped, 3);
    }

    #[test]
    fn opcua_json_floor_is_below_the_json() {
        use super::super::convert::JsonVariant;
        let values = [
            Variant::from("x".repeat(100)),
            Variant::from("\"quoted\"\n".to_string()),
            Variant::ByteString(opcua::types::ByteString::from(vec![7u8; 1000])),
            Variant::from(vec![0.0f64; 50]),
            Variant::from(vec!["ab".to_string(); 10]),
            Variant::from(12345i32),
        ];
        for v in &values {
            let json = serde_json::to_string(&JsonVariant(v)).expect("json");
            assert!(json_floor(v) <= json.len(), "{v:?}: floor {} > {}", json_floor(v), json.len());
        }
    }
}
