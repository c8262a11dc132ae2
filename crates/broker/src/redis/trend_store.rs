//! Trends in Redis, compressed: what the publish script writes, what nodes compress, what a
//! read merges.
//!
//! A channel's trend is cut into chunks of [`CHUNK_BUCKETS`] buckets (chunk `c` holds buckets
//! `c * CHUNK_BUCKETS ..` of the namespace's step, counted from the Unix epoch):
//! Each tier of a channel (its step) has chunks of its own, under keys that name the step.
//! - **raw chunks**, `P:{ch}:t:<step>:<c>`: what the publish script updates in
//!   place, 28 bytes per bucket (min, max, last as big-endian doubles, the count; 0 for a
//!   bucket without values), then 4 bytes per bucket: the time of its last, as an offset from
//!   its start (`scripts::TREND_BUCKET`). Updating a slot is a few `GETRANGE`s and `SETRANGE`s
//!   — no dearer for Redis than a hash field per bucket — and the string expires by itself
//!   once its last bucket is out of reach.
//! - **compressed chunks**, fields `<c>` of the hash `P:{ch}:tz:<step>`: a closed raw chunk encoded
//!   by a node ([`Chunk`], Gorilla-style, a few bytes per bucket) and swapped in by the
//!   `TREND_COMPACT` script, which does nothing when the raw chunk (or the field) changed since
//!   the node read it. The hash expires when its newest chunk is out of reach.
//!
//! Who compresses: the node that publishes a channel's value queues the chunk before it once
//! a value lands in a later chunk ([`Compactor::published`]), due after a grace of two steps
//! and a second (values of a batch published at once may still arrive); a read queues the
//! closed raw chunks it meets (a node that died before compressing, a late value for an old
//! chunk). The `redis-trend-compactor` task compresses what is due, a batch at a time; two
//! nodes compressing the same chunk do the work once (the second finds it gone).
//!
//! A read is one `MULTI`: `HGETALL` of the compressed hash and `MGET` of the raw chunks its
//! window spans, so a chunk being swapped is seen in one form or the other, never neither.
//!
//! Historical publications ([`crate::Outgoing::historical`]) go through the raw chunks of their
//! own time, like a late value, in the publish script, so every write to a channel's trend —
//! publications from any node, the compactor's swap (which checks the raw chunk did not
//! change) — is one atomic script in Redis, and concurrent writers never lose each other's
//! values. A raw chunk so written for a closed chunk is queued for compression
//! ([`Compactor::historical`]); until then a read merges it with the compressed form.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;

use super::Inner;
use crate::trend::chunk::Chunk;
use crate::trend::ring::CHUNK_BUCKETS;
use crate::trend::{TrendBucket, TrendPolicy};
use crate::BrokerError;

/// Bytes of one bucket of a raw chunk.
const SLOT_BYTES: usize = 28;
const CHUNK: u64 = CHUNK_BUCKETS as u64;
/// Where a raw chunk's offsets of the times of last begin (4 bytes per bucket).
const TIMES_AT: usize = SLOT_BYTES * CHUNK_BUCKETS as usize;
/// Chunks compressed at once by the compactor.
const COMPACT_BATCH: usize = 64;
/// How often the compactor looks for due chunks.
const COMPACT_EVERY: Duration = Duration::from_secs(1);
/// Tries of one chunk whose raw form keeps changing under the compactor (late values).
const COMPACT_TRIES: usize = 3;

/// The chunk holding the bucket of `at_ms`.
fn chunk_of(at_ms: u64, step_ms: u64) -> u64 {
    at_ms / step_ms.max(1) / CHUNK
}

/// When chunk `c` leaves the trend's reach (unix ms): its last bucket is older than the reach.
fn chunk_expiry(c: u64, policy: TrendPolicy) -> u64 {
    ((c + 1) * CHUNK + u64::from(policy.len)).saturating_mul(policy.step_ms.max(1))
}

/// The buckets with values of raw chunk `c`, oldest first.
fn raw_buckets(raw: &[u8], c: u64, step_ms: u64) -> Vec<TrendBucket> {
    let f = |s: &[u8]| f64::from_be_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
    let (slots, times) = raw.split_at(raw.len().min(TIMES_AT));
    // A bucket whose offset is missing (not written yet) has its last at its start.
    let offset =
        |i: usize| times.get(i * 4..i * 4 + 4).map_or(0, |b| u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])));
    slots
        .chunks_exact(SLOT_BYTES)
        .enumerate()
        .filter_map(|(i, s)| {
            let n = u32::from_be_bytes([s[24], s[25], s[26], s[27]]);
            let t = (c * CHUNK + i as u64) * step_ms.max(1);
            (n > 0).then(|| TrendBucket {
                t,
                min: f(&s[0..8]),
                max: f(&s[8..16]),
                last: f(&s[16..24]),
                n: u64::from(n),
                last_at: t + offset(i),
            })
        })
        .collect()
}

/// `stored` (compressed) and `raw` buckets of one chunk as one list: a bucket in both got a
/// late or historical value after its chunk was compressed, and is merged (its `last` the
/// later by time, [`TrendBucket::merge`]).
fn merge(stored: Vec<TrendBucket>, raw: Vec<TrendBucket>) -> Vec<TrendBucket> {
    if stored.is_empty() {
        return raw;
    }
    let mut by_t: std::collections::BTreeMap<u64, TrendBucket> = stored.into_iter().map(|b| (b.t, b)).collect();
    for b in raw {
        by_t.entry(b.t).and_modify(|s| s.merge(&b)).or_insert(b);
    }
    by_t.into_values().collect()
}

/// The compressed hash read whole: chunk number → stored chunk.
type StoredChunks = HashMap<u64, Vec<u8>>;

fn decode(bytes: &[u8]) -> Vec<TrendBucket> {
    Chunk::from_bytes(bytes).map(|c| c.decode().collect()).unwrap_or_default()
}

/// The channel's buckets from `since_ms`, oldest first; closed raw chunks met on the way are
/// queued for compression.
pub(super) async fn read(
    inner: &Inner,
    channel: &str,
    policy: TrendPolicy,
    since_ms: u64,
) -> Result<Vec<TrendBucket>, BrokerError> {
    let step = policy.step_ms.max(1);
    let now = crate::now_ms();
    let oldest = chunk_of(now.saturating_sub(policy.reach_ms()), step).max(chunk_of(since_ms, step));
    let newest = chunk_of(now, step);
    if oldest > newest {
        // `since_ms` is in a chunk not begun yet: nothing to read (and `MGET` needs a key).
        return Ok(Vec::new());
    }
    let chunks: Vec<u64> = (oldest..=newest).collect();
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("HGETALL").arg(inner.keys.trend_compressed(channel, step));
    pipe.cmd("MGET");
    for c in &chunks {
        pipe.arg(inner.keys.trend_raw(channel, step, *c));
    }
    let (stored, raw): (StoredChunks, Vec<Option<Vec<u8>>>) =
        pipe.query_async(&mut inner.conn().await?).await.map_err(|e| inner.failed(e))?;
    let closed_before = chunk_of(now.saturating_sub(grace(policy).as_millis() as u64), step);
    let mut out = Vec::new();
    for (c, raw) in chunks.iter().zip(raw) {
        let from_store = stored.get(c).map(|b| decode(b)).unwrap_or_default();
        let from_raw = raw.as_deref().map(|r| raw_buckets(r, *c, step)).unwrap_or_default();
        if !from_raw.is_empty() && *c < closed_before {
            inner.trends.queue(channel, policy, *c, Instant::now());
        }
        out.extend(merge(from_store, from_raw).into_iter().filter(|b| b.t >= since_ms));
    }
    Ok(out)
}

/// How long after a chunk closed it is compressed: values of a batch published at once may
/// still arrive for its last buckets.
fn grace(policy: TrendPolicy) -> Duration {
    Duration::from_millis(2 * policy.step_ms.max(1)) + Duration::from_secs(1)
}

struct Due {
    channel: String,
    policy: TrendPolicy,
    chunk: u64,
    at: Instant,
}

/// What this node has to compress, and the newest chunk it saw each channel write to.
#[derive(Default)]
pub(super) struct Compactor {
    due: Mutex<VecDeque<Due>>,
    /// (channel, step, chunk) in `due`.
    queued: Mutex<HashSet<(String, u64, u64)>>,
    /// Step → channel → the newest chunk a value of it went to, for [`Compactor::published`]
    /// (by step first, so the publish path looks a channel up without allocating its name).
    newest: Mutex<HashMap<u64, HashMap<String, u64>>>,
}

impl Compactor {
    /// A value of `channel` was recorded at `at_ms`: when it went to a later chunk than the
    /// channel's last one here, that one is queued (due after the grace).
    pub(super) fn published(&self, channel: &str, policy: TrendPolicy, at_ms: u64) {
        let step = policy.step_ms.max(1);
        let c = chunk_of(at_ms, step);
        let before = {
            let mut newest = self.newest.lock();
            let newest = newest.entry(step).or_default();
            match newest.get_mut(channel) {
                Some(seen) if *seen >= c => return,
                Some(seen) => std::mem::replace(seen, c),
                None => {
                    newest.insert(channel.to_string(), c);
                    return;
                }
            }
        };
        self.queue(channel, policy, before, Instant::now() + grace(policy));
    }

    /// A historical value of `channel` was recorded at `at_ms`: a chunk already closed is
    /// queued to be compressed again with it (due after the grace).
    pub(super) fn historical(&self, channel: &str, policy: TrendPolicy, at_ms: u64, now_ms: u64) {
        let step = policy.step_ms.max(1);
        let c = chunk_of(at_ms, step);
        if c < chunk_of(now_ms, step) {
            self.queue(channel, policy, c, Instant::now() + grace(policy));
        }
    }

    fn queue(&self, channel: &str, policy: TrendPolicy, chunk: u64, at: Instant) {
        if self.queued.lock().insert((channel.to_string(), policy.step_ms.max(1), chunk)) {
            self.due.lock().push_back(Due { channel: channel.to_string(), policy, chunk, at });
        }
    }

    /// Up to `most` chunks due by `now`.
    fn take_due(&self, now: Instant, most: usize) -> Vec<Due> {
        let mut due = self.due.lock();
        let mut out = Vec::new();
        let mut later = VecDeque::new();
        while let Some(d) = due.pop_front() {
            if out.len() < most && d.at <= now {
                out.push(d);
            } else {
                later.push_back(d);
            }
        }
        *due = later;
        out
    }

    fn done(&self, d: &Due) {
        self.queued.lock().remove(&(d.channel.clone(), d.policy.step_ms.max(1), d.chunk));
    }

    /// Forgets channels whose newest chunk is long closed (they stopped publishing here), so
    /// the map holds about the channels this node publishes now.
    fn prune(&self, now_ms: u64) {
        let mut newest = self.newest.lock();
        for (step, channels) in newest.iter_mut() {
            channels.retain(|_, c| *c + 2 >= chunk_of(now_ms, *step));
        }
        newest.retain(|_, channels| !channels.is_empty());
    }
}

/// The `redis-trend-compactor` task: compresses the chunks that are due, [`COMPACT_BATCH`] at a
/// time, until `stop` closes. A chunk Redis could not take (a failover) stays raw until a read
/// queues it again or it expires.
pub(super) async fn run(inner: Arc<Inner>, mut stop: watch::Receiver<()>) {
    let mut tick = tokio::time::interval(COMPACT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pruned = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        loop {
            let batch = inner.trends.take_due(Instant::now(), COMPACT_BATCH);
            if batch.is_empty() {
                break;
            }
            let results = futures_util::future::join_all(batch.iter().map(|d| compact(&inner, d))).await;
            for (d, r) in batch.into_iter().zip(results) {
                if let Err(e) = r {
                    // Left raw: the next read of the channel queues it again, else it expires.
                    tracing::debug!(channel = %d.channel, chunk = d.chunk, error = %e, "trend chunk not compressed");
                }
                inner.trends.done(&d);
            }
        }
        if pruned.elapsed() > Duration::from_secs(60) {
            inner.trends.prune(crate::now_ms());
            pruned = Instant::now();
        }
    }
}

/// Compresses chunk `d.chunk` of `d.channel`: reads its raw form and compressed field, encodes
/// their buckets and swaps them in, unless either changed meanwhile (then reads again).
async fn compact(inner: &Inner, d: &Due) -> Result<(), BrokerError> {
    let step = d.policy.step_ms.max(1);
    let (raw_key, hash_key) =
        (inner.keys.trend_raw(&d.channel, step, d.chunk), inner.keys.trend_compressed(&d.channel, step));
    let oldest = chunk_of(crate::now_ms().saturating_sub(d.policy.reach_ms()), step);
    for _ in 0..COMPACT_TRIES {
        let mut conn = inner.conn().await?;
        let (raw, old): (Option<Vec<u8>>, Option<Vec<u8>>) = redis::pipe()
            .atomic()
            .cmd("GET")
            .arg(&raw_key)
            .cmd("HGET")
            .arg(&hash_key)
            .arg(d.chunk)
            .query_async(&mut conn)
            .await
            .map_err(|e| inner.failed(e))?;
        let Some(raw) = raw else { return Ok(()) };
        let buckets = merge(old.as_deref().map(decode).unwrap_or_default(), raw_buckets(&raw, d.chunk, step));
        if buckets.is_empty() {
            return Ok(());
        }
        let bytes = Chunk::encode(&buckets).to_bytes();
        let sha = |b: &[u8]| sha1_smol::Sha1::from(b).digest().to_string();
        let swapped: i64 = inner
            .scripts
            .trend_compact
            .key(&raw_key)
            .key(&hash_key)
            .arg(sha(&raw))
            .arg(old.as_deref().map(sha).unwrap_or_default())
            .arg(d.chunk)
            .arg(bytes)
            .arg(chunk_expiry(d.chunk, d.policy))
            .arg(oldest)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| inner.failed(e))?;
        if swapped == 1 {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(min: f64, max: f64, last: f64, n: u32) -> Vec<u8> {
        [min.to_be_bytes(), max.to_be_bytes(), last.to_be_bytes()].concat().into_iter().chain(n.to_be_bytes()).collect()
    }

    #[test]
    fn trend_store_raw_chunk_slots_are_buckets_of_their_chunk() {
        let mut raw = slot(1.0, 3.0, 2.0, 4);
        raw.extend(vec![0u8; SLOT_BYTES]); // an empty bucket (SETRANGE pads with zeros)
        raw.extend(slot(-1.5, -1.5, -1.5, 1));
        let b = raw_buckets(&raw, 7, 1000);
        let t0 = 7 * CHUNK * 1000;
        assert_eq!(
            b,
            vec![
                TrendBucket { t: t0, min: 1.0, max: 3.0, last: 2.0, n: 4, last_at: t0 },
                TrendBucket { t: t0 + 2000, min: -1.5, max: -1.5, last: -1.5, n: 1, last_at: t0 + 2000 },
            ]
        );
        assert!(raw_buckets(&raw[..SLOT_BYTES - 1], 0, 1000).is_empty(), "a torn slot is not a bucket");
        // The offsets of the times of last follow the slots.
        raw.resize(TIMES_AT, 0);
        raw.extend(250u32.to_be_bytes());
        raw.extend(0u32.to_be_bytes());
        raw.extend(999u32.to_be_bytes());
        let timed: Vec<u64> = raw_buckets(&raw, 7, 1000).iter().map(|b| b.last_at).collect();
        assert_eq!(timed, vec![t0 + 250, t0 + 2999]);
    }

    #[test]
    fn trend_store_merges_a_late_raw_value_into_its_compressed_bucket() {
        let stored = vec![TrendBucket::new(1000, 1500, 5.0), TrendBucket::new(2000, 2500, 6.0)];
        let chunk = Chunk::from_bytes(&Chunk::encode(&stored).to_bytes()).unwrap();
        let decoded: Vec<TrendBucket> = chunk.decode().collect();
        assert_eq!(decoded, stored);
        // Raw values for a compressed bucket: the later by time is its last, whichever form
        // holds it.
        let late = vec![
            TrendBucket::new(1000, 1700, 1.0),
            TrendBucket::new(2000, 2100, 1.0),
            TrendBucket::new(3000, 3000, 2.0),
        ];
        let merged = merge(decoded, late);
        assert_eq!(
            merged,
            vec![
                TrendBucket { t: 1000, min: 1.0, max: 5.0, last: 1.0, n: 2, last_at: 1700 },
                TrendBucket { t: 2000, min: 1.0, max: 6.0, last: 6.0, n: 2, last_at: 2500 },
                TrendBucket::new(3000, 3000, 2.0),
            ]
        );
        assert!(Chunk::from_bytes(&[0u8; 10]).is_none(), "too short for a chunk");
        let mut liar = Chunk::encode(&stored).to_bytes();
        liar[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Chunk::from_bytes(&liar).is_none(), "more buckets than bits");
    }

    #[test]
    fn trend_store_queues_the_chunk_before_once_a_value_lands_in_a_later_one() {
        let c = Compactor::default();
        let p = TrendPolicy { step_ms: 1000, len: 3600 };
        let t0 = 1_000 * CHUNK * 1000;
        c.published("pt:a", p, t0);
        c.published("pt:a", p, t0 + 5_000);
        assert!(c.take_due(Instant::now() + Duration::from_secs(60), 10).is_empty(), "same chunk");
        c.published("pt:a", p, t0 + CHUNK * 1000);
        c.published("pt:a", p, t0 + 3_000); // a late value: no new chunk
        assert!(c.take_due(Instant::now(), 10).is_empty(), "not before the grace");
        let due = c.take_due(Instant::now() + Duration::from_secs(60), 10);
        assert_eq!(due.iter().map(|d| (d.channel.as_str(), d.chunk)).collect::<Vec<_>>(), vec![("pt:a", 1_000)]);
        c.done(&due[0]);
        c.queue("pt:a", p, 1_000, Instant::now());
        c.queue("pt:a", p, 1_000, Instant::now());
        assert_eq!(c.take_due(Instant::now(), 10).len(), 1, "queued once");
        c.prune(t0 + 10 * CHUNK * 1000);
        assert!(c.newest.lock().is_empty(), "a channel that stopped publishing here is forgotten");
    }
}
