//! The conformance suite every [`Broker`] must pass. Each implementation's tests call
#![allow(clippy::unwrap_used)] // a test suite: a failed step should panic with its error
//! [`run_all`] with a factory that yields a fresh broker (fresh channels) per case.
//!
//! Deliveries may be asynchronous (a shared broker hands them over from another connection),
//! so the cases subscribe before they expect any and wait for them with a bounded deadline.
//! The session store's cases are in `conformance/sessions.rs`.

mod sessions;

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::value::RawValue;

use crate::{
    Broker, BrokerHandler, ChannelQuery, ChannelSummary, ClientInfo, HistoryPolicy, Outgoing, Position, Publication,
};

/// Records what a broker delivered.
#[derive(Default)]
pub struct RecordingHandler {
    pub publications: Mutex<Vec<(String, u64, String)>>,
    pub presence: Mutex<Vec<(String, String, bool)>>,
    pub missed: Mutex<Vec<String>>,
    /// The channel and offset of each historical publication delivered.
    pub historical: Mutex<Vec<(String, u64)>>,
    /// The channel, offset and tags of each publication with tags delivered.
    pub tagged: Mutex<Vec<(String, u64, crate::Tags)>>,
}

impl RecordingHandler {
    /// Waits (at most 5 s) until `cond` holds for what was recorded.
    pub async fn wait_for(&self, what: &str, cond: impl Fn(&RecordingHandler) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cond(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn offsets(&self, channel: &str) -> Vec<u64> {
        self.publications.lock().iter().filter(|p| p.0 == channel).map(|p| p.1).collect()
    }
}

impl BrokerHandler for RecordingHandler {
    fn on_publication(&self, channel: &str, p: &Publication) {
        self.publications.lock().push((channel.to_string(), p.offset, p.data.get().to_string()));
        if p.historical {
            self.historical.lock().push((channel.to_string(), p.offset));
        }
        if let Some(tags) = &p.tags {
            self.tagged.lock().push((channel.to_string(), p.offset, (**tags).clone()));
        }
    }
    fn after_publications(&self) {}
    fn on_presence(&self, channel: &str, info: &ClientInfo, joined: bool) {
        self.presence.lock().push((channel.to_string(), info.client.clone(), joined));
    }
    fn on_missed(&self, channel: &str) {
        self.missed.lock().push(channel.to_string());
    }
}

fn data(s: &str) -> crate::Data {
    Arc::new(RawValue::from_string(s.to_string()).unwrap_or_else(|_| panic!("bad test json {s}")))
}

const KEEP: HistoryPolicy = HistoryPolicy { size: 5, ttl: Duration::from_secs(300), trend: None };

/// Every channel whose name starts with `prefix`, read page by page (`limit` per page), in
/// the order the pages came.
pub async fn list_all(b: &dyn Broker, prefix: &str, limit: usize) -> Vec<ChannelSummary> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100_000 {
        let page = b.channels(&ChannelQuery { prefix, cursor: cursor.as_deref(), limit }).await.unwrap();
        assert!(
            page.channels.len() <= limit + limit / 2 + 16,
            "a page of {} for a limit of {limit}",
            page.channels.len()
        );
        out.extend(page.channels);
        cursor = page.next;
        if cursor.is_none() {
            return out;
        }
    }
    panic!("the listing never ended");
}

/// Runs every case against brokers from `make`.
pub async fn run_all<F: Fn() -> Arc<dyn Broker>>(make: F) {
    offsets_increase_and_reach_the_handler_in_order(make()).await;
    history_since_a_position_is_exact(make()).await;
    history_beyond_its_size_is_incomplete(make()).await;
    another_epoch_reads_what_the_current_one_holds(make()).await;
    last_value_is_kept_without_history(make()).await;
    presence_joins_and_leaves(make()).await;
    subscriptions_are_counted(make()).await;
    reads_never_run_ahead_of_deliveries(make()).await;
    a_new_channel_keeps_its_first_epoch(make()).await;
    history_limit_takes_the_oldest_after_a_position(make()).await;
    a_batch_keeps_item_order_per_channel(make()).await;
    last_if_known_of_an_unknown_channel_creates_nothing(make()).await;
    paging_lists_each_channel_once_while_channels_are_created(make()).await;
    a_trend_keeps_numeric_values_in_buckets(make()).await;
    a_trend_keeps_a_tier_per_step(make()).await;
    a_historical_publication_goes_to_history_and_trends_but_never_last(make()).await;
    tags_go_with_their_publication_everywhere(make()).await;
    a_zero_history_ttl_keeps_history_by_size_only(make()).await;
    a_zero_history_limit_reads_no_publications(make()).await;
    internal_channels_are_delivered_but_never_listed(make()).await;
    an_idempotency_key_publishes_once_per_channel(make()).await;
    a_record_set_keeps_each_key_once_until_its_expiry(make()).await;
    sessions::run_all(&make).await;
}

/// A record set keeps one entry per key with its latest expiry, reads only live entries, makes
/// room from expired ones when full, and refuses a new key while every entry holds, saying
/// when the soonest leaves.
async fn a_record_set_keeps_each_key_once_until_its_expiry(b: Arc<dyn Broker>) {
    use crate::RecordPut::{Full, Kept, Stored};
    // The caller's clock judges expiry; Redis drops a set whole at its last expiry by its own
    // clock, so the times are real ones, seconds apart.
    let now = crate::now_ms();
    let s = 1000;
    let put = |key: &'static str, value: &'static str, exp: u64, now: u64| {
        let b = b.clone();
        let entry = crate::Record { key: key.into(), value: value.into(), expires_ms: exp };
        async move { b.record_put("$set", &entry, now, 3).await.unwrap() }
    };
    assert_eq!(put("a", "a1", now + 500 * s, now).await, Stored);
    for _ in 0..20 {
        assert_eq!(put("a", "a-again", now + 500 * s, now).await, Kept, "a repeat is one entry");
    }
    assert_eq!(put("a", "a-earlier", now + 100 * s, now).await, Kept, "an earlier expiry changes nothing");
    assert_eq!(put("a", "a2", now + 900 * s, now).await, Stored, "a later expiry extends the entry");
    assert_eq!(put("b", "b1", now + 50 * s, now).await, Stored);
    assert_eq!(put("c", "c1", now + 700 * s, now).await, Stored);
    assert_eq!(put("d", "d1", now + 800 * s, now).await, Full { frees_ms: now + 50 * s });
    let mut live = b.records("$set", now).await.unwrap();
    live.sort_by(|x, y| x.key.cmp(&y.key));
    let got: Vec<(&str, &str, u64)> = live.iter().map(|r| (&*r.key, &*r.value, r.expires_ms)).collect();
    assert_eq!(got, vec![("a", "a2", now + 900 * s), ("b", "b1", now + 50 * s), ("c", "c1", now + 700 * s)]);
    // Past b's expiry: it is no longer read, and it makes room for a new key.
    assert_eq!(b.records("$set", now + 60 * s).await.unwrap().len(), 2);
    assert_eq!(put("d", "d1", now + 800 * s, now + 60 * s).await, Stored);
    assert!(b.records("$other", now).await.unwrap().is_empty(), "sets are apart");
}

/// A publication with an idempotency key is published once per channel within the window: the
/// same key again (alone, in a later batch, or twice in one batch) answers the first position
/// and publishes nothing; another key, no key, or the same key on another channel publishes.
async fn an_idempotency_key_publishes_once_per_channel(b: Arc<dyn Broker>) {
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    b.subscribe("c:once").await.unwrap();
    let keyed = |ch: &str, d: &str, key: &str| {
        let mut item = Outgoing::new(ch, data(d), KEEP);
        item.idempotency_key = Some(key.into());
        item
    };
    let first = b.publish_batch(vec![keyed("c:once", "1", "k-1")]).await.pop().unwrap().unwrap();
    assert_eq!(first.offset, 1);
    let again = b.publish_batch(vec![keyed("c:once", "2", "k-1")]).await.pop().unwrap().unwrap();
    assert_eq!(again, first, "a retry answers the first result");
    let batch = vec![
        keyed("c:once", "3", "k-2"),
        Outgoing::new("c:once", data("4"), KEEP),
        keyed("c:once", "5", "k-2"),
        keyed("c:once", "6", "k-1"),
        keyed("c:once-other", "7", "k-1"),
    ];
    let got: Vec<Position> = b.publish_batch(batch).await.into_iter().map(Result::unwrap).collect();
    let offsets: Vec<u64> = got.iter().map(|p| p.offset).collect();
    assert_eq!(offsets, [2, 3, 2, 1, 1]);
    assert_eq!(got[3], first);
    assert!(got[..4].iter().all(|p| p.epoch == first.epoch));
    b.publish("c:once", data("8"), KEEP).await.unwrap();
    h.wait_for("4 publications", |h| h.offsets("c:once").len() >= 4).await;
    let delivered: Vec<String> =
        h.publications.lock().iter().filter(|p| p.0 == "c:once").map(|p| p.2.clone()).collect();
    assert_eq!(delivered, ["1", "3", "4", "8"], "retries are neither delivered nor kept");
    let history = b.history("c:once", None, 10).await.unwrap();
    let kept: Vec<&str> = history.publications.iter().map(|p| p.data.get()).collect();
    assert_eq!(kept, ["1", "3", "4", "8"]);
}

/// Channels starting with `$` carry messages between nodes (forwarded source writes): they
/// reach a subscribed handler like any other, and no listing shows them.
async fn internal_channels_are_delivered_but_never_listed(b: Arc<dyn Broker>) {
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    b.subscribe("$in:node").await.unwrap();
    let none = HistoryPolicy { size: 0, ttl: Duration::ZERO, trend: None };
    b.publish("$in:node", data(r#"{"id":1}"#), none).await.unwrap();
    b.publish("in:visible", data("1"), KEEP).await.unwrap();
    h.wait_for("the internal message", |h| h.offsets("$in:node") == [1]).await;
    let listed: Vec<String> = list_all(&*b, "", 7).await.iter().map(|c| c.channel.to_string()).collect();
    assert!(listed.iter().any(|c| c == "in:visible"), "{listed:?}");
    assert!(!listed.iter().any(|c| c.starts_with('$')), "{listed:?}");
    assert!(b.history("$in:node", None, 10).await.unwrap().publications.is_empty(), "no history kept");
    b.unsubscribe("$in:node").await.unwrap();
}

/// `history_ttl_s = 0` meant "forget at once" in memory and "keep forever" in Redis: it is no
/// expiry by time on every broker, history bounded by its size.
async fn a_zero_history_ttl_keeps_history_by_size_only(b: Arc<dyn Broker>) {
    let untimed = HistoryPolicy { size: 3, ttl: Duration::ZERO, trend: None };
    let first = b.publish("c:ttl0", data("1"), untimed).await.unwrap();
    for i in 2..=4 {
        b.publish("c:ttl0", data(&i.to_string()), untimed).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let r = b.history("c:ttl0", None, 10).await.unwrap();
    assert_eq!(r.publications.iter().map(|p| p.offset).collect::<Vec<_>>(), vec![2, 3, 4]);
    let since = crate::Position { epoch: first.epoch.clone(), offset: 1 };
    let r = b.history("c:ttl0", Some(&since), 10).await.unwrap();
    assert!(r.complete && r.publications.len() == 3);
}

/// `limit = 0` answers the position and no publications (Redis answered an error).
async fn a_zero_history_limit_reads_no_publications(b: Arc<dyn Broker>) {
    let p = b.publish("c:lim0", data("1"), KEEP).await.unwrap();
    b.publish("c:lim0", data("2"), KEEP).await.unwrap();
    let r = b.history("c:lim0", None, 0).await.unwrap();
    assert!(r.publications.is_empty() && r.complete && r.position.offset == 2);
    let r = b.history("c:lim0", Some(&p), 0).await.unwrap();
    assert!(r.publications.is_empty() && r.complete && r.position.offset == 2);
    let gone = crate::Position { epoch: p.epoch.clone(), offset: 0 };
    assert!(b.history("c:lim0", Some(&gone), 0).await.unwrap().publications.is_empty());
}

const TREND: crate::TrendPolicy = crate::TrendPolicy { step_ms: 1000, len: 60 };

async fn a_trend_keeps_numeric_values_in_buckets(b: Arc<dyn Broker>) {
    let policy = HistoryPolicy { trend: Some(crate::TrendTiers::one(TREND)), ..KEEP };
    for v in [r#"{"v": 1.5, "q": "good"}"#, r#"{"v": 5}"#, r#"{"v": "open"}"#, "3", r#"{"v": -2.25}"#] {
        b.publish("pt:trend", data(v), policy).await.unwrap();
    }
    b.publish("pt:no-trend", data("1"), KEEP).await.unwrap();
    let t = b.trend("pt:trend", TREND, 0).await.unwrap();
    assert!(!t.is_empty() && t.len() <= 2, "{t:?}");
    assert!(t.windows(2).all(|w| w[0].t < w[1].t) && t.iter().all(|x| x.t % 1000 == 0), "{t:?}");
    assert_eq!(t.iter().map(|x| x.n).sum::<u64>(), 4, "non-numeric values are left out: {t:?}");
    let min = t.iter().map(|x| x.min).fold(f64::INFINITY, f64::min);
    let max = t.iter().map(|x| x.max).fold(f64::NEG_INFINITY, f64::max);
    assert_eq!((min, max, t[t.len() - 1].last), (-2.25, 5.0, -2.25));
    let later = crate::now_ms() + 5000;
    assert!(b.trend("pt:trend", TREND, later).await.unwrap().is_empty(), "nothing after since");
    let hour_on = crate::now_ms() + 3_600_000;
    assert!(b.trend("pt:trend", TREND, hour_on).await.unwrap().is_empty(), "a since past every stored bucket");
    assert!(b.trend("pt:no-trend", TREND, 0).await.unwrap().is_empty());
    assert!(b.trend("pt:never", TREND, 0).await.unwrap().is_empty());
    assert!(b.last_if_known("pt:never").await.unwrap().is_none(), "a trend read creates nothing");
    // A point with its own time within reach lands in that time's bucket (a late source
    // value), before the buckets of values published at arrival.
    let late = crate::now_ms() - 20_000;
    b.publish("pt:trend", data(&format!(r#"{{"v": 42, "t": {late}}}"#)), policy).await.unwrap();
    let t = b.trend("pt:trend", TREND, 0).await.unwrap();
    assert_eq!(t.first().map(|x| (x.t, x.last, x.n)), Some((late - late % 1000, 42.0, 1)), "{t:?}");
    assert!(t.windows(2).all(|w| w[0].t < w[1].t), "{t:?}");
}

/// Each tier keeps its own buckets: the fine one the last minute, the coarse one ten minutes
/// in 10 s buckets, from the same values.
async fn a_trend_keeps_a_tier_per_step(b: Arc<dyn Broker>) {
    let fine = crate::TrendPolicy { step_ms: 1000, len: 60 };
    let coarse = crate::TrendPolicy { step_ms: 10_000, len: 60 };
    let tiers = crate::TrendTiers::new(&[fine, coarse]).unwrap();
    let policy = HistoryPolicy { trend: Some(tiers), ..KEEP };
    let now = crate::now_ms();
    let start = now - now % 10_000 - 300_000;
    // One value every 5 s over the last five minutes, at its own time.
    let items: Vec<Outgoing> = (0..60u64)
        .map(|i| Outgoing::new("pt:tiers", data(&format!(r#"{{"v": {i}, "t": {}}}"#, start + i * 5000)), policy))
        .collect();
    for r in b.publish_batch(items).await {
        r.unwrap();
    }
    let f = b.trend("pt:tiers", fine, 0).await.unwrap();
    assert!(!f.is_empty() && f.iter().all(|x| x.t + 60_000 > now && x.n == 1), "the last minute only: {f:?}");
    let c = b.trend("pt:tiers", coarse, 0).await.unwrap();
    assert_eq!(c.len(), 30, "five minutes of 10 s buckets: {c:?}");
    assert!(c.iter().all(|x| x.t % 10_000 == 0 && x.n == 2), "{c:?}");
    assert_eq!((c[0].t, c[0].min, c[0].max, c[0].last), (start, 0.0, 1.0, 1.0));
}

/// A historical publication takes the next offset and goes to history and to the handler,
/// marked historical, while the last value stays the newest live one; its trend value goes to
/// the buckets of its own time in the tiers that reach back to it (`last` the last by time),
/// and to none when no tier does, never to now.
async fn a_historical_publication_goes_to_history_and_trends_but_never_last(b: Arc<dyn Broker>) {
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    let fine = crate::TrendPolicy { step_ms: 1000, len: 60 };
    let coarse = crate::TrendPolicy { step_ms: 10_000, len: 60 };
    let tiers = crate::TrendTiers::new(&[fine, coarse]).unwrap();
    let policy = HistoryPolicy { size: 20, trend: Some(tiers), ..KEEP };
    b.subscribe("pt:hp").await.unwrap();
    let now = crate::now_ms();
    let live = format!(r#"{{"v": 100, "t": {now}}}"#);
    b.publish("pt:hp", data(&live), policy).await.unwrap();
    let s30 = now - 30_000 - (now - 30_000) % 1000;
    let old = now - 300_000;
    let past = |values: &[(u64, f64)]| -> Vec<Outgoing> {
        let item = |&(t, v): &(u64, f64)| Outgoing {
            historical: true,
            ..Outgoing::new("pt:hp", data(&format!(r#"{{"v": {v:?}, "t": {t}}}"#)), policy)
        };
        values.iter().map(item).collect()
    };
    let first = [(s30 + 100, 1.0), (s30 + 900, 3.0), (s30 + 500, 2.0), (old, 7.0), (now - 7_200_000, 9.0)];
    let offsets: Vec<u64> = b.publish_batch(past(&first)).await.into_iter().map(|r| r.unwrap().offset).collect();
    assert_eq!(offsets, vec![2, 3, 4, 5, 6]);
    let f = b.trend("pt:hp", fine, 0).await.unwrap();
    let at = |t: u64, bs: &[crate::TrendBucket]| bs.iter().find(|x| x.t == t).map(|x| (x.n, x.min, x.max, x.last));
    assert_eq!(at(s30, &f), Some((3, 1.0, 3.0, 3.0)), "last by time, not by arrival: {f:?}");
    assert_eq!(f.len(), 2, "the live bucket and the merged one: {f:?}");
    let c = b.trend("pt:hp", coarse, 0).await.unwrap();
    assert_eq!(at(old - old % 10_000, &c), Some((1, 7.0, 7.0, 7.0)), "past the fine reach, in the coarse: {c:?}");
    assert_eq!(c.iter().map(|x| x.n).sum::<u64>(), 5, "the value older than every reach is in no tier: {c:?}");
    // A second part of the backlog: an earlier value leaves the bucket's last, a later one takes it.
    b.publish_batch(past(&[(s30 + 50, -1.0), (s30 + 950, 4.0), (s30 + 940, 0.5)])).await.into_iter().for_each(|r| {
        r.unwrap();
    });
    let f = b.trend("pt:hp", fine, 0).await.unwrap();
    assert_eq!(at(s30, &f), Some((6, -1.0, 4.0, 4.0)), "{f:?}");
    // The last value is still the live one, at its own offset behind the channel's.
    let (pos, last) = b.last_or_start("pt:hp").await.unwrap();
    let last = last.unwrap();
    assert_eq!((pos.offset, last.offset, last.data.get(), last.historical), (9, 1, live.as_str(), false));
    let known = b.last_if_known("pt:hp").await.unwrap().unwrap();
    assert_eq!((known.0.offset, known.1.map(|p| p.offset)), (9, Some(1)));
    // History holds every one in offset order, marked; so does what the handler was given.
    let all = b.history("pt:hp", None, 20).await.unwrap().publications;
    let marks: Vec<(u64, bool)> = all.iter().map(|p| (p.offset, p.historical)).collect();
    assert_eq!(marks, (1..=9).map(|o| (o, o > 1)).collect::<Vec<_>>());
    h.wait_for("every publication", |h| h.offsets("pt:hp").len() == 9).await;
    assert_eq!(h.offsets("pt:hp"), (1..=9).collect::<Vec<_>>());
    assert_eq!(h.historical.lock().clone(), (2..=9).map(|o| ("pt:hp".to_string(), o)).collect::<Vec<_>>());
    // A live publication is the last value again; recovery from the first reads the rest.
    let newer = format!(r#"{{"v": 101, "t": {}}}"#, now + 1);
    b.publish("pt:hp", data(&newer), policy).await.unwrap();
    let (pos, last) = b.last_or_start("pt:hp").await.unwrap();
    assert_eq!((pos.offset, last.unwrap().offset), (10, 10));
    let since = Position { offset: 1, ..pos };
    let r = b.history("pt:hp", Some(&since), 20).await.unwrap();
    assert!(r.complete);
    assert_eq!(r.publications.iter().filter(|p| p.historical).count(), 8);
}

/// A publication's tags are kept with it: delivered, in history and with the last value; one
/// without tags has none, historical or not.
async fn tags_go_with_their_publication_everywhere(b: Arc<dyn Broker>) {
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    b.subscribe("tg:a").await.unwrap();
    let tags = |pairs: &[(&str, &str)]| -> Arc<crate::Tags> {
        Arc::new(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    };
    let site = tags(&[("site", "north"), ("note", "a b {c}")]);
    let tagged = Outgoing { tags: Some(site.clone()), ..Outgoing::new("tg:a", data("1"), KEEP) };
    let past = Outgoing { historical: true, tags: Some(tags(&[("k", "v")])), ..Outgoing::new("tg:a", data("2"), KEEP) };
    let plain = Outgoing::new("tg:a", data("3"), KEEP);
    for r in b.publish_batch(vec![tagged, past, plain]).await {
        r.unwrap();
    }
    let all = b.history("tg:a", None, 10).await.unwrap().publications;
    let got: Vec<Option<crate::Tags>> = all.iter().map(|p| p.tags.as_deref().cloned()).collect();
    assert_eq!(got, vec![Some((*site).clone()), Some((*tags(&[("k", "v")])).clone()), None]);
    // The last value's tags: the tagged live one's, kept behind a historical one, then none.
    b.publish_batch(vec![Outgoing { tags: Some(site.clone()), ..Outgoing::new("tg:b", data("1"), KEEP) }]).await;
    let past = Outgoing { historical: true, ..Outgoing::new("tg:b", data("0"), KEEP) };
    b.publish_batch(vec![past]).await.pop().unwrap().unwrap();
    let (_, last) = b.last_or_start("tg:b").await.unwrap();
    assert_eq!(last.unwrap().tags.as_deref(), Some(&*site));
    b.publish("tg:b", data("2"), KEEP).await.unwrap();
    let (_, last) = b.last_if_known("tg:b").await.unwrap().unwrap();
    assert_eq!(last.map(|p| p.tags.is_none()), Some(true));
    let of_a = |h: &RecordingHandler| -> Vec<(u64, crate::Tags)> {
        h.tagged.lock().iter().filter(|t| t.0 == "tg:a").map(|t| (t.1, t.2.clone())).collect()
    };
    h.wait_for("the tagged deliveries", |h| of_a(h).len() == 2).await;
    assert_eq!(of_a(&h), vec![(1, (*site).clone()), (2, (*tags(&[("k", "v")])).clone())]);
}

async fn paging_lists_each_channel_once_while_channels_are_created(b: Arc<dyn Broker>) {
    let names: Vec<String> = (0..300).map(|i| format!("pg:{i:04}")).collect();
    for chunk in names.chunks(100) {
        let items = chunk.iter().map(|ch| crate::Outgoing::new(ch, data("1"), KEEP)).collect();
        for r in b.publish_batch(items).await {
            r.unwrap();
        }
    }
    b.publish("pgx:other", data("1"), KEEP).await.unwrap();
    // Pages of 40, a new channel created under the prefix after every page.
    let mut seen: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    for round in 0..1000 {
        let page = b.channels(&ChannelQuery { prefix: "pg:", cursor: cursor.as_deref(), limit: 40 }).await.unwrap();
        seen.extend(page.channels.iter().map(|c| c.channel.to_string()));
        b.publish(&format!("pg:new{round}"), data("1"), KEEP).await.unwrap();
        cursor = page.next;
        if cursor.is_none() {
            break;
        }
    }
    assert!(cursor.is_none(), "the listing ended");
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "a channel listed twice");
    for n in &names {
        assert!(unique.contains(n), "{n} missing from the listing");
    }
    assert!(unique.iter().all(|n| n.starts_with("pg:")), "only the prefix's channels");
    let p = list_all(&*b, "pg:0001", 10).await;
    assert_eq!(p.len(), 1);
    assert_eq!((&*p[0].channel, p[0].position.offset), ("pg:0001", 1));
    // A cursor the broker never handed out is refused, not misread.
    let bad = b.channels(&ChannelQuery { prefix: "", cursor: Some("x.y.z"), limit: 10 }).await;
    assert!(matches!(bad, Err(crate::BrokerError::BadCursor(_))) || bad.is_ok(), "{bad:?}");
}

async fn last_if_known_of_an_unknown_channel_creates_nothing(b: Arc<dyn Broker>) {
    let listed = async |b: &Arc<dyn Broker>| -> Vec<String> {
        let mut names: Vec<String> = list_all(&**b, "", 1000).await.iter().map(|c| c.channel.to_string()).collect();
        names.sort();
        names
    };
    let before = listed(&b).await;
    for i in 0..20 {
        assert!(b.last_if_known(&format!("c:never{i}")).await.unwrap().is_none());
    }
    assert_eq!(listed(&b).await, before, "peeks created channels");
    let pos = b.publish("c:peek", data("7"), KEEP).await.unwrap();
    let (seen, last) = b.last_if_known("c:peek").await.unwrap().expect("a published channel is known");
    assert_eq!((seen, last.unwrap().data.get()), (pos, "7"));
    // A channel whose epoch a subscriber's read created is known too, with offset 0.
    let (first, _) = b.last_or_start("c:peek-empty").await.unwrap();
    assert_eq!(b.last_if_known("c:peek-empty").await.unwrap().map(|(p, l)| (p, l.is_none())), Some((first, true)));
}

async fn offsets_increase_and_reach_the_handler_in_order(b: Arc<dyn Broker>) {
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    b.subscribe("c:order").await.unwrap();
    for i in 1..=10u64 {
        let pos = b.publish("c:order", data(&i.to_string()), KEEP).await.unwrap();
        assert_eq!(pos.offset, i);
    }
    h.wait_for("10 publications", |h| h.publications.lock().len() >= 10).await;
    let got = h.publications.lock().clone();
    let offsets: Vec<u64> = got.iter().map(|p| p.1).collect();
    assert_eq!(offsets, (1..=10).collect::<Vec<_>>());
    assert_eq!(got[9].2, "10");
}

async fn history_since_a_position_is_exact(b: Arc<dyn Broker>) {
    for i in 1..=4 {
        b.publish("c:h", data(&i.to_string()), KEEP).await.unwrap();
    }
    let (pos, last) = b.last_or_start("c:h").await.unwrap();
    assert_eq!(pos.offset, 4);
    assert_eq!(last.unwrap().data.get(), "4");
    let since = crate::Position { epoch: pos.epoch.clone(), offset: 2 };
    let r = b.history("c:h", Some(&since), 100).await.unwrap();
    assert!(r.complete);
    assert_eq!(r.publications.iter().map(|p| p.offset).collect::<Vec<_>>(), vec![3, 4]);
    let r = b.history("c:h", Some(&pos), 100).await.unwrap();
    assert!(r.complete && r.publications.is_empty());
    let r = b.history("c:h", None, 2).await.unwrap();
    assert_eq!(r.publications.iter().map(|p| p.offset).collect::<Vec<_>>(), vec![3, 4]);
}

async fn history_beyond_its_size_is_incomplete(b: Arc<dyn Broker>) {
    for i in 1..=8 {
        b.publish("c:big", data(&i.to_string()), KEEP).await.unwrap();
    }
    let (pos, _) = b.last_or_start("c:big").await.unwrap();
    let r = b.history("c:big", Some(&crate::Position { epoch: pos.epoch.clone(), offset: 1 }), 100).await.unwrap();
    assert!(!r.complete, "offsets 2 and 3 fell out of a 5-entry history");
    assert_eq!(r.publications.first().map(|p| p.offset), Some(4));
    let r = b.history("c:big", Some(&crate::Position { epoch: pos.epoch, offset: 3 }), 100).await.unwrap();
    assert!(r.complete);
    assert_eq!(r.publications.len(), 5);
}

/// A reader from another epoch (a Redis restarted without persistence, a rollback, a forgotten
/// channel) lost what that epoch held after its offset, but is given everything the channel's
/// epoch holds, from its first kept offset, oldest first, with `complete: false`.
async fn another_epoch_reads_what_the_current_one_holds(b: Arc<dyn Broker>) {
    let other = |offset| crate::Position { epoch: "other".into(), offset };
    let (empty, _) = b.last_or_start("c:e0").await.unwrap();
    let r = b.history("c:e0", Some(&other(4)), 10).await.unwrap();
    assert!(!r.complete && r.publications.is_empty(), "a new epoch with nothing in it");
    assert_eq!(r.position, empty);
    for i in 1..=3 {
        b.publish("c:e", data(&i.to_string()), KEEP).await.unwrap();
    }
    for since in [0, 2, 9] {
        let r = b.history("c:e", Some(&other(since)), 10).await.unwrap();
        assert!(!r.complete, "the other epoch's offsets after {since} are lost");
        assert_eq!(r.publications.iter().map(|p| p.offset).collect::<Vec<_>>(), vec![1, 2, 3], "since {since}");
        assert_eq!(r.publications[0].data.get(), "1");
        assert_eq!(r.position.offset, 3);
    }
    let r = b.history("c:e", Some(&other(2)), 2).await.unwrap();
    assert_eq!(r.publications.iter().map(|p| p.offset).collect::<Vec<_>>(), vec![1, 2], "the limit takes the oldest");
    // Beyond the history size: the oldest kept onwards.
    for i in 4..=8 {
        b.publish("c:e", data(&i.to_string()), KEEP).await.unwrap();
    }
    let r = b.history("c:e", Some(&other(1)), 100).await.unwrap();
    assert!(!r.complete);
    assert_eq!(r.publications.iter().map(|p| p.offset).collect::<Vec<_>>(), vec![4, 5, 6, 7, 8]);
}

async fn last_value_is_kept_without_history(b: Arc<dyn Broker>) {
    let none = HistoryPolicy { size: 0, ttl: Duration::from_secs(0), trend: None };
    for i in 1..=3 {
        b.publish("pt:x", data(&format!("{{\"v\":{i}}}")), none).await.unwrap();
    }
    let (pos, last) = b.last_or_start("pt:x").await.unwrap();
    assert_eq!(pos.offset, 3);
    assert_eq!(last.unwrap().data.get(), "{\"v\":3}");
    let r = b.history("pt:x", Some(&crate::Position { epoch: pos.epoch, offset: 1 }), 10).await.unwrap();
    assert!(!r.complete);
}

async fn presence_joins_and_leaves(b: Arc<dyn Broker>) {
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    b.subscribe("room:1").await.unwrap();
    let a = ClientInfo { client: "c1".into(), user: "ann".into() };
    b.presence_add("room:1", a.clone()).await.unwrap();
    b.presence_add("room:1", ClientInfo { client: "c2".into(), user: "bob".into() }).await.unwrap();
    assert_eq!(b.presence("room:1").await.unwrap().len(), 2);
    b.presence_remove("room:1", "c1").await.unwrap();
    assert_eq!(b.presence("room:1").await.unwrap(), vec![ClientInfo { client: "c2".into(), user: "bob".into() }]);
    h.wait_for("3 presence events", |h| h.presence.lock().len() >= 3).await;
    let ev = h.presence.lock().clone();
    assert_eq!(
        ev,
        vec![
            ("room:1".into(), "c1".into(), true),
            ("room:1".into(), "c2".into(), true),
            ("room:1".into(), "c1".into(), false)
        ]
    );
}

async fn subscriptions_are_counted(b: Arc<dyn Broker>) {
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    // Two local subscribers, then one leaves: the channel is still delivered.
    b.subscribe("c:count").await.unwrap();
    b.subscribe("c:count").await.unwrap();
    b.unsubscribe("c:count").await.unwrap();
    b.publish("c:count", data("1"), KEEP).await.unwrap();
    h.wait_for("the publication after one of two unsubscribed", |h| h.offsets("c:count") == vec![1]).await;
}

async fn reads_never_run_ahead_of_deliveries(b: Arc<dyn Broker>) {
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    b.subscribe("c:race").await.unwrap();
    let publisher = {
        let b = b.clone();
        tokio::spawn(async move {
            for i in 1..=200u64 {
                b.publish("c:race", data(&i.to_string()), KEEP).await.unwrap();
            }
        })
    };
    // A read that reports offset N promises the handler already has 1..=N.
    for _ in 0..50 {
        let (pos, _) = b.last_or_start("c:race").await.unwrap();
        let seen = h.offsets("c:race");
        assert_eq!(seen, (1..=seen.len() as u64).collect::<Vec<_>>(), "in order, no gaps");
        assert!(seen.len() as u64 >= pos.offset, "last() reported {} but only {} delivered", pos.offset, seen.len());
        let r = b.history("c:race", None, 1).await.unwrap();
        assert!(h.offsets("c:race").len() as u64 >= r.position.offset);
        tokio::task::yield_now().await;
    }
    publisher.await.unwrap();
    h.wait_for("all 200", |h| h.offsets("c:race").len() == 200).await;
    assert_eq!(h.offsets("c:race"), (1..=200).collect::<Vec<_>>());
    assert!(h.missed.lock().is_empty());
}

async fn a_new_channel_keeps_its_first_epoch(b: Arc<dyn Broker>) {
    let (before, last) = b.last_or_start("c:fresh").await.unwrap();
    assert_eq!(before.offset, 0);
    assert!(last.is_none());
    let p = b.publish("c:fresh", data("1"), KEEP).await.unwrap();
    assert_eq!(p.epoch, before.epoch, "reading a channel fixes its epoch");
    let r = b.history("c:fresh", Some(&before), 10).await.unwrap();
    assert!(r.complete);
    assert_eq!(r.publications.iter().map(|p| p.offset).collect::<Vec<_>>(), vec![1]);
    assert_eq!(r.publications[0].data.get(), "1");
}

async fn history_limit_takes_the_oldest_after_a_position(b: Arc<dyn Broker>) {
    for i in 1..=5 {
        b.publish("c:lim", data(&format!("{{\"i\": {i}, \"s\": \"a b\\nc\"}}")), KEEP).await.unwrap();
    }
    let (pos, _) = b.last_or_start("c:lim").await.unwrap();
    let since = crate::Position { epoch: pos.epoch.clone(), offset: 1 };
    let r = b.history("c:lim", Some(&since), 2).await.unwrap();
    assert!(r.complete);
    assert_eq!(r.position, pos);
    assert_eq!(r.publications.iter().map(|p| p.offset).collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(r.publications[0].data.get(), "{\"i\": 2, \"s\": \"a b\\nc\"}", "data kept byte for byte");
    let r = b.history("c:lim", Some(&crate::Position { epoch: pos.epoch, offset: 9 }), 2).await.unwrap();
    assert!(!r.complete, "a position ahead of the channel is not ours");
}

async fn a_batch_keeps_item_order_per_channel(b: Arc<dyn Broker>) {
    let h = Arc::new(RecordingHandler::default());
    b.set_handler(h.clone());
    let channels = ["c:ba", "c:bb", "c:bc", "c:bd"];
    for ch in channels {
        b.subscribe(ch).await.unwrap();
    }
    b.publish("c:bb", data("0"), KEEP).await.unwrap();
    // 1,200 items: more than one script call or chunk wherever a broker splits batches.
    let items: Vec<crate::Outgoing> =
        (0..1200).map(|i| crate::Outgoing::new(channels[i % 4], data(&i.to_string()), KEEP)).collect();
    let results = b.publish_batch(items).await;
    assert_eq!(results.len(), 1200);
    for (i, r) in results.iter().enumerate() {
        let pos = r.as_ref().unwrap();
        let base = if i % 4 == 1 { 1 } else { 0 };
        assert_eq!(pos.offset, (i / 4) as u64 + 1 + base, "item {i} on {}", channels[i % 4]);
    }
    h.wait_for("every batch item delivered", |h| h.publications.lock().len() >= 1201).await;
    for (k, ch) in channels.iter().enumerate() {
        let got: Vec<(u64, String)> =
            h.publications.lock().iter().filter(|p| p.0 == *ch).map(|p| (p.1, p.2.clone())).collect();
        let first = if k == 1 { 2 } else { 1 };
        let want: Vec<(u64, String)> = (0..300).map(|j| (j as u64 + first, (j * 4 + k).to_string())).collect();
        assert_eq!(got[got.len() - 300..], want[..], "{ch}: offsets and data in item order");
    }
    let (pos, last) = b.last_or_start("c:bd").await.unwrap();
    assert_eq!((pos.offset, last.unwrap().data.get()), (300, "1199"));
    let r = b.history("c:bd", None, 3).await.unwrap();
    assert_eq!(r.publications.iter().map(|p| p.offset).collect::<Vec<_>>(), vec![298, 299, 300]);
    assert!(h.missed.lock().is_empty());
}
