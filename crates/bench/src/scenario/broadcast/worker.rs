//! The broadcast worker: its share of the subscribers, each subscribing to the channel and
//! recording every delivery's latency, offset and burst, and the bytes its socket read for
//! them. With `--delta` each subscriber rebuilds every publication from the node's text or
//! Fossil delta, as an application would, before reading its stamp.

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use switchboard_client::connect::Compression;
use switchboard_client::frame::{decode_frame, for_each_message, ServerMessage};
use switchboard_client::{Chains, Event};
use switchboard_protocol::Format;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::accounting::{BurstTally, Delivery, OffsetSet, Tally};
use crate::common::{source_addr, unix_micros, WireFormat};
use crate::transport::{Conn, Transport};
use crate::worker::WorkerCtx;

/// A broadcast worker's share of the subscribers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BroadcastWorker {
    pub target: String,
    pub channel: String,
    pub conns: usize,
    pub first_index: usize,
    pub spread: bool,
    pub bursts: u64,
    pub format: WireFormat,
    pub concurrency: usize,
    #[serde(default)]
    pub transport: Transport,
    /// Offer permessage-deflate (`--compression`).
    #[serde(default = "crate::common::no_compression")]
    pub compression: Compression,
    /// Subscribe with `delta: "fossil"` and rebuild each publication (`--delta`).
    #[serde(default)]
    pub delta: bool,
}

/// Just what a subscriber needs from a push; everything else is skipped without allocating.
#[derive(Deserialize)]
struct Push {
    #[serde(default, rename = "pub")]
    publication: Option<PubIn>,
    #[serde(default)]
    disconnect: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct PubIn {
    off: u64,
    data: Stamp,
}

/// The load generator's data: publish time and sequence number (a point document's other
/// fields are skipped).
#[derive(Deserialize)]
struct Stamp {
    t: u64,
    seq: u64,
}

pub async fn run_worker(cfg: BroadcastWorker, ctx: Rc<WorkerCtx>) {
    ctx.tally.borrow_mut().bursts = vec![BurstTally::default(); cfg.bursts as usize];
    let format = cfg.format.format();
    let mut subscribe = json!({"id": 1, "subscribe": {"channels": [cfg.channel]}});
    if cfg.delta {
        subscribe["subscribe"]["delta"] = json!("fossil");
    }
    // Built once; cloning a message shares its bytes.
    let subscribe = match format {
        Format::Json => Message::text(subscribe.to_string()),
        Format::Msgpack => Message::binary(rmp_serde::to_vec_named(&subscribe).unwrap_or_default()),
    };
    let cfg = Rc::new(cfg);
    let token = crate::worker::token();
    let sem = Rc::new(tokio::sync::Semaphore::new(cfg.concurrency.max(1)));
    for i in 0..cfg.conns {
        let task = subscriber(i, cfg.clone(), token.clone(), ctx.clone(), sem.clone(), subscribe.clone());
        tokio::task::spawn_local(task);
    }
    ctx.wait_stop().await;
    crate::transport::end_sessions().await;
}

async fn subscriber(
    i: usize,
    cfg: Rc<BroadcastWorker>,
    token: Option<String>,
    ctx: Rc<WorkerCtx>,
    sem: Rc<tokio::sync::Semaphore>,
    subscribe: Message,
) {
    let format = cfg.format.format();
    let permit = sem.acquire().await;
    let t0 = Instant::now();
    let mut opts = crate::common::connect_options(format);
    opts.bind = source_addr(cfg.first_index + i, cfg.spread);
    opts.credentials = token.map(switchboard_client::Credentials::Bearer);
    opts.timeout = Duration::from_secs(30);
    opts.compression = cfg.compression;
    let mut ws = match Conn::connect(cfg.transport, &cfg.target, &opts).await {
        Ok(ws) => ws,
        Err(e) => return ctx.failed(&format!("connect: {e}")),
    };
    if let Err(e) = ws.send(subscribe).await {
        return ctx.failed(&format!("subscribe: {e}"));
    }
    let base = match tokio::time::timeout(Duration::from_secs(30), subscribe_reply(&mut ws, format, &cfg.channel)).await
    {
        Ok(Ok(off)) => off,
        Ok(Err(e)) => return ctx.failed(&e),
        Err(_) => return ctx.failed("subscribe: no reply within 30 s"),
    };
    // A subscriber sends nothing after its subscribe.
    ws.release_commands();
    drop(permit);
    ctx.established(t0.elapsed().as_micros() as u64);
    ctx.expect(ctx.snapshot().established * cfg.bursts);

    let mut seen = OffsetSet::new(base);
    // The socket's bytes from here on are the deliveries' (and the odd ping's).
    let wire = ws.wire_stats();
    let mut wire_seen = wire.as_ref().map_or(0, |w| w.read.load(Relaxed));
    if wire.as_ref().is_some_and(|w| w.deflate.load(Relaxed)) {
        ctx.tally.borrow_mut().deflated += 1;
    }
    let mut chains = cfg.delta.then(|| Chains::new(MAX_DOC_BYTES));
    // This frame's publications: offset and stamp (kept across frames, so nothing allocates).
    let mut arrived: Vec<(u64, Stamp)> = Vec::new();
    while let Some(msg) = ws.next().await {
        let (fmt, payload): (Format, &[u8]) = match &msg {
            Ok(Message::Text(t)) => (Format::Json, t.as_bytes()),
            Ok(Message::Binary(b)) => (Format::Msgpack, b),
            Ok(Message::Close(f)) => {
                let code = f.as_ref().map(|f| u16::from(f.code)).unwrap_or(1005);
                return ctx.dropped(&format!("closed by the server with code {code}"));
            }
            Ok(_) => continue,
            Err(e) => return ctx.dropped(&format!("read: {e}")),
        };
        let now = unix_micros();
        let mut got = false;
        // A publication every subscriber of this worker now has: reported at once, for a
        // coordinator that times each publication's cost (`--reference`).
        let mut burst_done = false;
        {
            let mut tally = ctx.tally.borrow_mut();
            let mut lat = ctx.latency.borrow_mut();
            if let Some(w) = &wire {
                let read = w.read.load(Relaxed);
                tally.wire_bytes += read - wire_seen;
                wire_seen = read;
            }
            arrived.clear();
            match chains.as_mut() {
                None => read_plain(fmt, payload, &mut tally, &mut arrived),
                Some(chains) => read_deltas(fmt, payload, chains, &mut tally, &mut arrived),
            }
            let established = tally.established;
            for (off, stamp) in arrived.drain(..) {
                let d = seen.insert(off);
                tally.count(d);
                if d == Delivery::New {
                    got = true;
                    lat.record(now.saturating_sub(stamp.t));
                    if let Some(b) = tally.bursts.get_mut(stamp.seq as usize) {
                        b.count += 1;
                        b.last_us = b.last_us.max(now);
                        burst_done |= b.count == established;
                    }
                }
            }
            if got {
                tally.last_arrival_us = now;
            }
        }
        if got {
            ctx.check_complete();
        }
        if burst_done {
            ctx.report_now();
        }
    }
    ctx.dropped("connection ended");
}

/// The largest publication text a delta subscriber rebuilds (a point document is ~1 KiB).
const MAX_DOC_BYTES: usize = 1 << 20;

/// A frame's publications, their data as sent.
fn read_plain(fmt: Format, payload: &[u8], tally: &mut Tally, arrived: &mut Vec<(u64, Stamp)>) {
    for_each_message::<Push, _>(fmt, payload, |m| {
        let Ok(m) = m else {
            tally.unexpected += 1;
            return;
        };
        if m.disconnect.is_some() {
            tally.note_error("server sent disconnect");
        }
        if let Some(p) = m.publication {
            arrived.push((p.off, p.data));
        }
    });
}

/// A frame's publications of a delta subscription, each rebuilt from its text or its delta
/// against the channel's previous one. One that cannot be rebuilt is an error of the run
/// (and its offset missing): the node sent a delta this subscriber had no base for, or a
/// wrong one.
fn read_deltas(fmt: Format, payload: &[u8], chains: &mut Chains, tally: &mut Tally, arrived: &mut Vec<(u64, Stamp)>) {
    for m in decode_frame(fmt, payload) {
        let publication = match m {
            Ok(ServerMessage::Encoded(push)) => match chains.decode(push) {
                Ok(p) => p,
                Err(e) => {
                    tally.note_error(&format!("a delta publication could not be rebuilt: {e}"));
                    continue;
                }
            },
            Ok(ServerMessage::Event(Event::Publication(p))) => p,
            Ok(ServerMessage::Event(Event::Disconnect { .. })) => {
                tally.note_error("server sent disconnect");
                continue;
            }
            Ok(_) => continue,
            Err(_) => {
                tally.unexpected += 1;
                continue;
            }
        };
        match Stamp::deserialize(&publication.data) {
            Ok(stamp) => arrived.push((publication.off, stamp)),
            Err(_) => tally.unexpected += 1,
        }
    }
}

/// Waits for the reply to the subscribe command (id 1) and returns the channel's offset.
pub(crate) async fn subscribe_reply<S, E>(ws: &mut S, format: Format, channel: &str) -> Result<u64, String>
where
    S: futures_util::Stream<Item = Result<Message, E>> + Unpin,
    E: std::fmt::Display,
{
    while let Some(msg) = ws.next().await {
        let payload: &[u8] = match &msg {
            Ok(Message::Text(t)) => t.as_bytes(),
            Ok(Message::Binary(b)) => b,
            Ok(Message::Close(f)) => {
                return Err(format!("closed before the subscribe reply: {:?}", f.as_ref().map(|f| u16::from(f.code))))
            }
            Ok(_) => continue,
            Err(e) => return Err(format!("read: {e}")),
        };
        for m in decode_frame(format, payload) {
            match m {
                Ok(ServerMessage::Reply { id: 1, result: Ok(v) }) => {
                    let ch = &v["channels"][channel];
                    if let Some(off) = ch["offset"].as_u64() {
                        return Ok(off);
                    }
                    return Err(format!("subscribe {channel}: {}", ch.get("error").unwrap_or(ch)));
                }
                Ok(ServerMessage::Reply { id: 1, result: Err(e) }) => {
                    return Err(format!("subscribe: error {}: {}", e.code, e.message))
                }
                _ => {}
            }
        }
    }
    Err("connection ended before the subscribe reply".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;
    use serde_json::Value;

    #[test]
    fn broadcast_worker_counts_latency_duplicates_and_bursts() {
        testutil::local(async {
            let url = testutil::serve(|msg| {
                let cmd: Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
                assert_eq!(cmd["subscribe"]["channels"], json!(["c"]));
                let t = unix_micros() - 2_000;
                let p = |off: u64, seq: u64| json!({"pub": {"ch": "c", "off": off, "data": {"t": t, "seq": seq}}});
                vec![
                    // The reply, then a batched frame with a duplicate, then the last one.
                    Message::text(
                        json!({"id": 1, "ok": {"channels": {"c": {"epoch": "e", "offset": 10}}}}).to_string(),
                    ),
                    Message::text(format!("{}\n{}\n{}", p(11, 0), p(12, 1), p(12, 1))),
                    Message::text(p(13, 2).to_string()),
                ]
            })
            .await;
            let ctx = WorkerCtx::new(1);
            let cfg = BroadcastWorker {
                target: url,
                channel: "c".into(),
                conns: 1,
                first_index: 0,
                spread: false,
                bursts: 3,
                format: WireFormat::Json,
                concurrency: 1,
                transport: Transport::Ws,
                compression: Compression::Off,
                delta: false,
            };
            let watcher = ctx.clone();
            tokio::task::spawn_local(async move {
                for _ in 0..500 {
                    if watcher.tally.borrow().received + watcher.tally.borrow().duplicated >= 4 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                watcher.stop();
            });
            run_worker(cfg, ctx.clone()).await;
            let t = ctx.tally.borrow();
            assert_eq!((t.established, t.failed, t.received, t.duplicated, t.unexpected), (1, 0, 3, 1, 0));
            assert_eq!(t.bursts.iter().map(|b| b.count).collect::<Vec<_>>(), vec![1, 1, 1]);
            let lat = ctx.latency.borrow();
            assert_eq!(lat.count(), 3, "duplicates are not latency samples");
            assert!(lat.value_at(0.5) >= 2_000, "latency is measured from the stamped time");
            assert_eq!(ctx.connect.borrow().count(), 1);
        });
    }
}
