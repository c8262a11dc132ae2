//! [`Streams`]: where each subscribed channel's stream is, and what a subscriber delivers when a
//! channel is subscribed again after a lost connection or an ended subscription.
//!
//! The rule every Switchboard client follows (docs/protocol.md, "Gaps"): publications are
//! delivered in offset order and at most once; a resubscription recovers what was missed from
//! the channel's history; when the history no longer holds it (it was trimmed, the channel
//! keeps none, or the epoch changed after a restart), the gap is reported first ([`Gap`]) and
//! then the channel's latest value is delivered, if it has one, so that a subscriber never
//! keeps showing a value the channel has since replaced. A channel whose stream shows nothing
//! missed (never published before and after, or recovered without a hole) reports no gap.
//!
//! A subscription with a `filter` is sent only the publications that match it, live and
//! recovered, so holes in its offsets are not gaps: it reports one only when the server says
//! history no longer reached back (`complete: false`) or after publications of an old epoch.
//!
//! Live publications carry no epoch; a [`Delivery`] carries the one its channel's stream had
//! when it arrived, so that `off 1` of two epochs are told apart. A historical publication (a
//! back-filled value) moves the position like any other: it is part of the channel's stream,
//! only never its current value.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use serde::Serialize;
use switchboard_protocol::StreamPosition;

use crate::event::Publication;
use crate::reply::{SubscribeOptions, Subscribed};

/// A publication as a subscriber delivers it: with its stream's epoch, and whether it is a
/// historical one ([`Publication::historical`], `"hist": true` when printed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delivery {
    pub ch: String,
    pub epoch: String,
    pub off: u64,
    pub data: serde_json::Value,
    #[serde(rename = "hist", skip_serializing_if = "std::ops::Not::not")]
    pub historical: bool,
    /// The publisher's tags, when it gave some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
}

/// Publications of a channel that a resubscription could not deliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    pub ch: String,
    /// Where the subscriber was: its last delivered publication (offset 0: none).
    pub from: StreamPosition,
    /// Where the channel is now.
    pub to: StreamPosition,
}

impl Gap {
    /// Whether the channel's stream restarted under a new epoch (a node restart without
    /// persistence, a Redis that lost its data).
    pub fn epoch_changed(&self) -> bool {
        self.from.epoch != self.to.epoch
    }
}

impl fmt::Display for Gap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.epoch_changed() {
            write!(
                f,
                "{}: the channel's history restarted (epoch {} is now {}); publications after offset {} of epoch {} \
                 may be lost",
                self.ch, self.from.epoch, self.to.epoch, self.from.offset, self.from.epoch
            )
        } else {
            write!(f, "{}: publications after offset {} are no longer in history", self.ch, self.from.offset)
        }
    }
}

/// What a subscribe reply means for one channel: the gap, if any, then what to deliver, in
/// order (the recovered publications, then the latest value if it is newer).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resumed {
    pub gap: Option<Gap>,
    pub deliveries: Vec<Delivery>,
}

/// The stream position of every channel a subscriber follows: the epoch and the offset of the
/// last publication it delivered (or that a subscribe reply covered).
#[derive(Debug, Clone, Default)]
pub struct Streams {
    positions: HashMap<String, StreamPosition>,
    initial: bool,
    /// The subscriptions have a `filter`: holes in their offsets are not gaps.
    filtered: bool,
    /// Channels whose live publications are not delivered until their next subscribe result
    /// (a delta could not be rebuilt: what follows it would skip the hole).
    paused: HashSet<String>,
}

impl Streams {
    /// `initial`: a channel's first subscription delivers its latest publication.
    pub fn new(initial: bool) -> Streams {
        Streams { positions: HashMap::new(), initial, filtered: false, paused: HashSet::new() }
    }

    /// Streams of subscriptions with a `filter` (`true`): only the server's `complete: false`
    /// and an old epoch's publications make a gap, not holes in the offsets.
    pub fn with_filter(mut self, filtered: bool) -> Streams {
        self.filtered = filtered;
        self
    }

    /// Delivers no live publication of `ch` until its next subscribe result ([`Streams::accept`]):
    /// its stream has a hole the resubscription recovers. Whether it was not paused already.
    pub fn pause(&mut self, ch: &str) -> bool {
        self.knows(ch) && self.paused.insert(ch.to_string())
    }

    /// Whether `ch` has been subscribed (and so is resubscribed with `recover`).
    pub fn knows(&self, ch: &str) -> bool {
        self.positions.contains_key(ch)
    }

    /// The channels subscribed so far.
    pub fn channels(&self) -> impl Iterator<Item = &str> {
        self.positions.keys().map(String::as_str)
    }

    /// Stops following `ch` (refused for good): it is no longer resubscribed.
    pub fn forget(&mut self, ch: &str) {
        self.positions.remove(ch);
        self.paused.remove(ch);
    }

    /// The position of `ch`, if it has been subscribed.
    pub fn position(&self, ch: &str) -> Option<&StreamPosition> {
        self.positions.get(ch)
    }

    /// A subscribe of `channels`: known ones recover from their position; every channel asks
    /// for its latest publication, which ends a gap (and starts a first subscription when
    /// `initial`).
    pub fn subscribe_options<I, S>(&self, channels: I) -> SubscribeOptions
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut opts = SubscribeOptions::new(channels).initial(true);
        for ch in &opts.channels.clone() {
            if let Some(pos) = self.positions.get(ch) {
                opts = opts.recover(ch.clone(), pos.epoch.clone(), pos.offset);
            }
        }
        opts
    }

    /// Applies `ch`'s subscribe result and says what to report and deliver.
    pub fn accept(&mut self, ch: &str, s: &Subscribed) -> Resumed {
        self.paused.remove(ch);
        let Some(prev) = self.positions.get(ch).cloned() else {
            // A first subscription: the latest value if asked for, then live publications.
            self.positions.insert(ch.to_string(), StreamPosition { epoch: s.epoch.clone(), offset: s.offset });
            let deliveries = match &s.last {
                Some(p) if self.initial => vec![delivery(p, &s.epoch)],
                _ => Vec::new(),
            };
            return Resumed { gap: None, deliveries };
        };
        let same_epoch = prev.epoch == s.epoch;
        // A position ahead of the channel in its own epoch: the broker lost its newest
        // publications, and the channel's next offsets are new ones, not repeats.
        let behind = same_epoch && !s.complete && s.offset < prev.offset;
        // In a new epoch everything the channel holds is new to the subscriber.
        let mut at = match (same_epoch, behind) {
            (true, false) => prev.offset,
            (true, true) => s.offset,
            (false, _) => 0,
        };
        let mut hole = behind;
        let mut deliveries = Vec::new();
        for p in s.recovered.iter().chain(s.last.as_ref()) {
            if p.off <= at {
                continue;
            }
            hole |= p.off != at + 1;
            at = p.off;
            deliveries.push(delivery(p, &s.epoch));
        }
        // Offsets up to the channel's position that nothing above delivered were missed; so
        // may the old epoch's publications after the last one delivered from it be. A filtered
        // subscription's offsets have holes of publications that did not match: only the
        // server can say history did not reach back.
        if self.filtered {
            hole = same_epoch && !s.complete;
        } else {
            hole |= s.offset > at;
        }
        hole |= !same_epoch && prev.offset > 0;
        let offset = at.max(s.offset);
        self.positions.insert(ch.to_string(), StreamPosition { epoch: s.epoch.clone(), offset });
        let gap = hole.then(|| Gap {
            ch: ch.to_string(),
            from: prev,
            to: StreamPosition { epoch: s.epoch.clone(), offset: s.offset },
        });
        Resumed { gap, deliveries }
    }

    /// A live publication of a subscribed channel: delivered with its stream's epoch, unless
    /// a subscribe reply already delivered or covered it (`None`, as for unknown channels).
    pub fn live(&mut self, p: Publication) -> Option<Delivery> {
        let pos = self.positions.get_mut(&p.ch)?;
        if p.off <= pos.offset || self.paused.contains(&p.ch) {
            return None;
        }
        pos.offset = p.off;
        Some(Delivery {
            ch: p.ch,
            epoch: pos.epoch.clone(),
            off: p.off,
            data: p.data,
            historical: p.historical,
            tags: p.tags,
        })
    }
}

fn delivery(p: &Publication, epoch: &str) -> Delivery {
    Delivery {
        ch: p.ch.clone(),
        epoch: epoch.to_string(),
        off: p.off,
        data: p.data.clone(),
        historical: p.historical,
        tags: p.tags.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn publication(off: u64) -> Publication {
        Publication { ch: "c".into(), off, data: json!({ "v": off }), historical: false, tags: None }
    }

    fn historical(off: u64) -> Publication {
        Publication { historical: true, ..publication(off) }
    }

    fn subscribed(epoch: &str, offset: u64, last: Option<u64>, recovered: &[u64], complete: bool) -> Subscribed {
        Subscribed {
            epoch: epoch.into(),
            offset,
            last: last.map(publication),
            recovered: recovered.iter().copied().map(publication).collect(),
            complete,
            trend: None,
        }
    }

    fn offsets(r: &Resumed) -> Vec<(String, u64)> {
        r.deliveries.iter().map(|d| (d.epoch.clone(), d.off)).collect()
    }

    fn at(epoch: &str, offset: u64) -> StreamPosition {
        StreamPosition { epoch: epoch.into(), offset }
    }

    #[test]
    fn resume_first_subscription_delivers_the_latest_only_when_initial() {
        let mut s = Streams::new(true);
        let r = s.accept("c", &subscribed("e", 6, Some(6), &[], true));
        assert_eq!((r.gap.clone(), offsets(&r)), (None, vec![("e".into(), 6)]));
        let mut quiet = Streams::new(false);
        assert_eq!(quiet.accept("c", &subscribed("e", 6, Some(6), &[], true)), Resumed::default());
        assert_eq!(quiet.position("c"), Some(&at("e", 6)));
    }

    #[test]
    fn resume_complete_recovery_delivers_the_missed_without_a_gap_or_a_repeat() {
        let mut s = Streams::new(true);
        s.accept("c", &subscribed("e", 6, Some(6), &[], true));
        let r = s.accept("c", &subscribed("e", 9, Some(9), &[7, 8, 9], true));
        assert_eq!((r.gap.clone(), offsets(&r)), (None, vec![("e".into(), 7), ("e".into(), 8), ("e".into(), 9)]));
        assert_eq!(s.live(publication(9)), None, "delivered once");
        assert_eq!(s.live(publication(10)).map(|d| d.off), Some(10));
    }

    #[test]
    fn resume_gap_without_history_ends_with_the_latest_value() {
        // A point channel keeps no history: offsets 7 and 8 are gone, 9 is the latest.
        let mut s = Streams::new(true);
        s.accept("c", &subscribed("e", 6, Some(6), &[], true));
        let r = s.accept("c", &subscribed("e", 9, Some(9), &[], false));
        assert_eq!(r.gap, Some(Gap { ch: "c".into(), from: at("e", 6), to: at("e", 9) }));
        assert_eq!(r.gap.as_ref().unwrap().to_string(), "c: publications after offset 6 are no longer in history");
        assert_eq!(offsets(&r), vec![("e".into(), 9)]);
        assert_eq!(s.position("c"), Some(&at("e", 9)));
    }

    #[test]
    fn resume_trimmed_history_reports_the_gap_then_what_is_kept() {
        let mut s = Streams::new(false);
        s.accept("c", &subscribed("e", 0, None, &[], true));
        let r = s.accept("c", &subscribed("e", 5, Some(5), &[3, 4, 5], false));
        assert!(r.gap.is_some());
        assert_eq!(offsets(&r).into_iter().map(|(_, o)| o).collect::<Vec<_>>(), vec![3, 4, 5]);
    }

    #[test]
    fn resume_one_missed_publication_that_is_the_latest_is_no_gap() {
        // No history, but the one publication missed is the latest value itself.
        let mut s = Streams::new(true);
        s.accept("c", &subscribed("e", 6, Some(6), &[], true));
        let r = s.accept("c", &subscribed("e", 7, Some(7), &[], false));
        assert_eq!((r.gap.clone(), offsets(&r)), (None, vec![("e".into(), 7)]));
    }

    #[test]
    fn resume_new_epoch_after_a_restart_reports_it_and_delivers_with_the_new_epoch() {
        let mut s = Streams::new(true);
        s.accept("c", &subscribed("a", 1, Some(1), &[], true));
        let r = s.accept("c", &subscribed("b", 1, Some(1), &[1], false));
        let gap = r.gap.clone().expect("offset 1 of epoch a was followed: what came after is unknown");
        assert!(gap.epoch_changed() && gap.to_string().contains("epoch a is now b"), "{gap}");
        assert_eq!(offsets(&r), vec![("b".into(), 1)], "off 1 of the new epoch, told apart by its epoch");
        assert_eq!(s.live(publication(2)).map(|d| (d.epoch, d.off)), Some(("b".into(), 2)));
    }

    #[test]
    fn resume_channel_never_published_reports_no_gap_across_a_restart() {
        let mut s = Streams::new(true);
        s.accept("c", &subscribed("a", 0, None, &[], true));
        let r = s.accept("c", &subscribed("b", 0, None, &[], false));
        assert_eq!(r, Resumed::default());
        // Published first while the subscriber was away: delivered, nothing missed.
        let mut s = Streams::new(true);
        s.accept("c", &subscribed("a", 0, None, &[], true));
        let r = s.accept("c", &subscribed("b", 1, Some(1), &[], false));
        assert_eq!((r.gap.clone(), offsets(&r)), (None, vec![("b".into(), 1)]));
    }

    #[test]
    fn resume_position_ahead_of_the_channel_is_a_gap_and_follows_the_channel() {
        // The broker lost its newest publications without a new epoch: the channel's next
        // offsets are new publications, not repeats.
        let mut s = Streams::new(true);
        s.accept("c", &subscribed("e", 9, Some(9), &[], true));
        let r = s.accept("c", &subscribed("e", 7, Some(7), &[], false));
        assert!(r.gap.is_some() && r.deliveries.is_empty());
        assert_eq!(s.live(publication(8)).map(|d| d.off), Some(8));
    }

    #[test]
    fn resume_filtered_holes_are_not_gaps_only_complete_false_and_old_epochs_are() {
        let mut s = Streams::new(true).with_filter(true);
        s.accept("c", &subscribed("e", 43, Some(40), &[], true));
        // Live: only matching publications come, with holes between them.
        assert_eq!(s.live(publication(47)).map(|d| d.off), Some(47));
        // Recovered with holes, the channel ahead of the last match: no gap.
        let r = s.accept("c", &subscribed("e", 60, None, &[50, 55], true));
        assert_eq!((r.gap, r.deliveries.iter().map(|d| d.off).collect::<Vec<_>>()), (None, vec![50, 55]));
        assert_eq!(s.position("c"), Some(&at("e", 60)));
        // The server says history did not reach back: a gap.
        let r = s.accept("c", &subscribed("e", 70, Some(68), &[], false));
        assert_eq!(r.gap.map(|g| g.from), Some(at("e", 60)));
        // A new epoch after publications of the old one: a gap; before any, none.
        assert!(s.accept("c", &subscribed("f", 3, None, &[2], false)).gap.is_some());
        let mut fresh = Streams::new(true).with_filter(true);
        fresh.accept("d", &subscribed("e", 0, None, &[], true));
        assert_eq!(fresh.accept("d", &subscribed("f", 3, None, &[2], false)).gap, None);
        // Without a filter the same holes are a gap.
        let mut plain = Streams::new(true);
        plain.accept("c", &subscribed("e", 43, None, &[], true));
        assert!(plain.accept("c", &subscribed("e", 60, None, &[50, 55], true)).gap.is_some());
    }

    #[test]
    fn resume_paused_channel_delivers_nothing_live_until_its_next_result() {
        let mut s = Streams::new(false);
        assert!(!s.pause("c"), "an unknown channel");
        s.accept("c", &subscribed("e", 5, None, &[], true));
        assert!(s.pause("c") && !s.pause("c"), "paused once");
        assert_eq!(s.live(publication(7)), None, "a publication after the hole is not delivered");
        assert_eq!(s.position("c"), Some(&at("e", 5)));
        let r = s.accept("c", &subscribed("e", 7, None, &[6, 7], true));
        assert_eq!(r.deliveries.len(), 2);
        assert_eq!(s.live(publication(8)).map(|d| d.off), Some(8));
    }

    #[test]
    fn resume_tags_are_delivered_and_printed() {
        let mut s = Streams::new(false);
        s.accept("c", &subscribed("e", 0, None, &[], true));
        let tags: BTreeMap<String, String> = [("kind".to_string(), "alarm".to_string())].into();
        let d = s.live(Publication { tags: Some(tags), ..publication(1) }).unwrap();
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!({"ch": "c", "epoch": "e", "off": 1, "data": {"v": 1}, "tags": {"kind": "alarm"}})
        );
        assert_eq!(serde_json::to_value(s.live(publication(2)).unwrap()).unwrap().get("tags"), None);
    }

    #[test]
    fn resume_historical_publications_are_delivered_flagged_and_move_the_position() {
        let mut s = Streams::new(true);
        s.accept("c", &subscribed("e", 6, Some(6), &[], true));
        let d = s.live(historical(7)).expect("delivered in offset order like any other");
        assert!(d.historical);
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!({"ch": "c", "epoch": "e", "off": 7, "data": {"v": 7}, "hist": true})
        );
        assert_eq!(s.position("c"), Some(&at("e", 7)));
        assert_eq!(s.live(historical(7)), None, "once");
        let live = s.live(publication(8)).unwrap();
        assert!(!live.historical);
        assert_eq!(serde_json::to_value(&live).unwrap().get("hist"), None);
        // A resubscription recovers after the historical one; recovered historical ones keep
        // the flag, and nothing is a gap.
        assert_eq!(s.subscribe_options(["c"]).recover["c"], at("e", 8));
        let mut reply = subscribed("e", 10, None, &[], true);
        reply.recovered = vec![historical(9), publication(10)];
        let r = s.accept("c", &reply);
        assert_eq!(r.gap, None);
        assert_eq!(r.deliveries.iter().map(|d| (d.off, d.historical)).collect::<Vec<_>>(), [(9, true), (10, false)]);
    }

    #[test]
    fn resume_options_recover_known_channels_and_ask_for_the_latest() {
        let mut s = Streams::new(false);
        s.accept("c", &subscribed("e", 4, None, &[], true));
        let opts = s.subscribe_options(["c", "d"]);
        assert!(opts.initial);
        assert_eq!(opts.recover.len(), 1);
        assert_eq!(opts.recover["c"], at("e", 4));
    }
}
