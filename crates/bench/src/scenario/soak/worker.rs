//! The worker half of `soak`: held subscribers, and churn.
//!
//! A worker process plays one role ([`SoakRole`]):
//!
//! - `hold`: its share of the `--subs` connections, each subscribed to `--points-per-sub`
//!   point channels for the whole run. Every delivery's offset is checked against the last one
//!   of its channel: the next offset is a new delivery (latency = arrival − the point's `t`),
//!   a jump is a gap (noted; what it skipped is lost, and shows as `expected − received` at
//!   the coordinator), an offset already passed is a duplicate. One offset per subscription,
//!   so a worker's memory does not grow with the length of the run (an
//!   [`crate::accounting::OffsetSet`] bitmap would).
//! - `churn`: its share of the `--churn` connections per second, each opened, subscribed to
//!   one point with `initial: true`, checked to have the channel's position (epoch and
//!   offset) in the reply, and closed. Successes count as established connections, failures
//!   by reason ([`WorkerCtx::failed_for`]).

use std::rc::Rc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use switchboard_client::connect::handshake;
use switchboard_client::frame::{decode_frame, ServerMessage};
use switchboard_protocol::Format;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use super::plan::Plan;
use crate::accounting::Tally;
use crate::common::{instant_of, source_addr, unix_micros};
use crate::histogram::Latency;
use crate::scenario::connect::due_us;
use crate::scenario::streams::feed::{encode, next_payload, read_frame, subscribe_chunks, Subscribed};
use crate::worker::WorkerCtx;

/// Most channels per subscribe command of a held subscriber.
const SUBSCRIBE_CHUNK: usize = 1000;
/// How long a held subscriber may take from connecting until every subscription is confirmed.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one soak worker does; `conns` is the number of held connections (0 for churn).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakWorker {
    pub target: String,
    pub plan: Plan,
    pub conns: usize,
    pub role: SoakRole,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SoakRole {
    Hold(HoldShare),
    Churn(ChurnShare),
}

/// The held subscribers `first_index .. first_index + conns`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HoldShare {
    pub first_index: usize,
    pub spread: bool,
    /// Handshakes in flight.
    pub concurrency: usize,
}

/// Churn connections `worker`, `worker + stride`, … of the run's schedule (`rate` per second
/// from `start_us`), `count` of them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChurnShare {
    pub worker: usize,
    pub stride: usize,
    pub count: u64,
    pub rate: f64,
    pub start_us: u64,
    pub timeout_ms: u64,
}

pub async fn run_worker(cfg: SoakWorker, ctx: Rc<WorkerCtx>) {
    let cfg = Rc::new(cfg);
    match &cfg.role {
        SoakRole::Hold(share) => {
            let sem = Rc::new(tokio::sync::Semaphore::new(share.concurrency.max(1)));
            for i in 0..cfg.conns {
                let g = share.first_index + i;
                tokio::task::spawn_local(hold(cfg.clone(), ctx.clone(), sem.clone(), g, source_addr(g, share.spread)));
            }
        }
        SoakRole::Churn(share) => {
            let share = share.clone();
            let (cfg, churn_ctx) = (cfg.clone(), ctx.clone());
            tokio::task::spawn_local(async move { churn(cfg, churn_ctx, share).await });
        }
    }
    ctx.wait_stop().await;
}

// ---------------------------------------------------------------------------------------------
// Held subscribers.

#[derive(Deserialize)]
pub(crate) struct PointPub {
    ch: String,
    off: u64,
    data: PointData,
}

/// A point's data, `{"v", "t"}`; only `t` (its publish time, unix ms) is read.
#[derive(Deserialize)]
pub(crate) struct PointData {
    t: u64,
}

/// The subscriptions of one held connection: the last offset of each, once confirmed.
pub(crate) struct Held {
    g: usize,
    last: Vec<Option<u64>>,
    confirmed: usize,
}

impl Held {
    pub(crate) fn new(plan: &Plan, g: usize) -> Held {
        Held { g, last: vec![None; plan.points_per_sub], confirmed: 0 }
    }

    /// Applies one channel of a subscribe reply.
    pub(crate) fn confirm(&mut self, plan: &Plan, name: &str, outcome: Subscribed) -> Result<(), String> {
        let slot = plan.points.index(name).and_then(|p| plan.slot(self.g, p));
        let Some(slot) = slot else { return Err(format!("reply names unknown channel {name}")) };
        match outcome {
            Subscribed::Err(e) => Err(e),
            Subscribed::Ok { offset, .. } => {
                if self.last[slot].is_none() {
                    self.confirmed += 1;
                }
                self.last[slot] = Some(offset);
                Ok(())
            }
        }
    }

    /// Counts one delivery arriving at `now_us`.
    pub(crate) fn deliver(&mut self, plan: &Plan, p: &PointPub, now_us: u64, tally: &mut Tally, lat: &mut Latency) {
        let (ch, off) = (p.ch.as_str(), p.off);
        let slot = plan.points.index(ch).and_then(|i| plan.slot(self.g, i));
        let Some(last) = slot.and_then(|s| self.last[s].as_mut()) else {
            // Not a channel of this connection, or one whose subscription is not confirmed.
            tally.unexpected += 1;
            return;
        };
        if off <= *last {
            tally.duplicated += 1;
            return;
        }
        if off > *last + 1 {
            tally.note_error(&format!("gap on {ch}: {} offsets missing after {}", off - *last - 1, *last));
        }
        *last = off;
        tally.received += 1;
        tally.last_arrival_us = tally.last_arrival_us.max(now_us);
        lat.record(now_us.saturating_sub(p.data.t.saturating_mul(1000)));
    }
}

/// Held subscriber `g`, until the worker stops.
async fn hold(
    cfg: Rc<SoakWorker>,
    ctx: Rc<WorkerCtx>,
    sem: Rc<tokio::sync::Semaphore>,
    g: usize,
    bind: Option<std::net::IpAddr>,
) {
    let mut permit = Some(sem.acquire().await);
    let mut opts = crate::common::connect_options(Format::Json);
    opts.bind = bind;
    opts.credentials = crate::worker::token().map(switchboard_client::Credentials::Bearer);
    opts.timeout = Duration::from_secs(30);
    let t0 = Instant::now();
    let mut ws = match handshake(&cfg.target, &opts).await {
        Ok(ws) => ws,
        Err(e) => return ctx.failed(&format!("connect: {e}")),
    };
    let plan = &cfg.plan;
    let names: Vec<String> = plan.points_of(g).map(|p| plan.points.name(p)).collect();
    let chunks = subscribe_chunks(&names, SUBSCRIBE_CHUNK);
    for (i, c) in chunks.iter().enumerate() {
        let cmd = json!({"id": i + 1, "subscribe": {"channels": &names[c.clone()]}});
        if let Err(e) = ws.send(encode(Format::Json, &cmd)).await {
            return ctx.failed(&format!("subscribe: {e}"));
        }
    }
    let mut held = Held::new(plan, g);
    let deadline = t0 + SUBSCRIBE_TIMEOUT;
    let mut established = false;
    loop {
        if !established && held.confirmed == names.len() {
            established = true;
            permit.take();
            ctx.established(t0.elapsed().as_micros() as u64);
        }
        let next = tokio::select! {
            m = ws.next() => m,
            _ = tokio::time::sleep_until(deadline), if !established => {
                return ctx.failed(&format!(
                    "{} of {} subscriptions confirmed after {} s",
                    held.confirmed, names.len(), SUBSCRIBE_TIMEOUT.as_secs()
                ));
            }
        };
        let end = |why: String| if established { ctx.dropped(&why) } else { ctx.failed(&why) };
        let frame = match next_payload(&next) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(why) => return end(why),
        };
        let now = unix_micros();
        let mut lat = ctx.latency.borrow_mut();
        let read = read_frame(
            frame,
            chunks.len(),
            &mut held,
            &mut ctx.tally.borrow_mut(),
            |held, p: &PointPub, tally| {
                held.deliver(plan, p, now, tally, &mut lat);
                false
            },
            |held, name, o| held.confirm(plan, name, o),
        );
        drop(lat);
        if let Some(why) = read.fail {
            return end(why);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Churn.

/// Opens this worker's churn connections on schedule; each runs as its own task, so a slow
/// one does not hold up the next.
async fn churn(cfg: Rc<SoakWorker>, ctx: Rc<WorkerCtx>, share: ChurnShare) {
    let token = crate::worker::token();
    let settled = Rc::new(std::cell::Cell::new(0u64));
    for i in 0..share.count {
        let g = share.worker + i as usize * share.stride;
        let due = due_us(share.start_us, share.rate, g);
        tokio::select! {
            _ = tokio::time::sleep_until(instant_of(due)) => {}
            _ = ctx.wait_stop() => return,
        }
        let (cfg, ctx, token, settled) = (cfg.clone(), ctx.clone(), token.clone(), settled.clone());
        let count = share.count;
        let timeout = Duration::from_millis(share.timeout_ms);
        tokio::task::spawn_local(async move {
            let channel = cfg.plan.points.name(g % cfg.plan.points.count.max(1));
            let t0 = Instant::now();
            match churn_one(&cfg.target, &channel, token, source_addr(g, false), timeout).await {
                Ok(()) => ctx.established(t0.elapsed().as_micros() as u64),
                Err(reason) => ctx.failed_for(&reason),
            }
            settled.set(settled.get() + 1);
            // All of this worker's churn is settled: tell the coordinator at once.
            if settled.get() == count {
                ctx.emit(&crate::worker::WorkerMsg::Progress(ctx.snapshot()));
            }
        });
    }
}

/// One churn connection: handshake, subscribe to `channel` with `initial: true`, check the
/// reply carries the channel's position, close. The error is the failure's reason.
async fn churn_one(
    target: &str,
    channel: &str,
    token: Option<String>,
    bind: Option<std::net::IpAddr>,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut opts = crate::common::connect_options(Format::Json);
    opts.bind = bind;
    opts.credentials = token.map(switchboard_client::Credentials::Bearer);
    opts.timeout = timeout;
    let mut ws = handshake(target, &opts).await.map_err(|e| format!("handshake: {e}"))?;
    let cmd = json!({"id": 1, "subscribe": {"channels": [channel], "initial": true}});
    ws.send(Message::text(cmd.to_string())).await.map_err(|e| format!("subscribe: send: {e}"))?;
    let reply = async {
        while let Some(msg) = ws.next().await {
            let bytes: &[u8] = match &msg {
                Ok(Message::Text(t)) => t.as_bytes(),
                Ok(Message::Close(f)) => {
                    let code = f.as_ref().map(|f| u16::from(f.code)).unwrap_or(1005);
                    return Err(format!("subscribe: closed by the server with code {code}"));
                }
                Ok(_) => continue,
                Err(e) => return Err(format!("subscribe: read: {e}")),
            };
            for m in decode_frame(Format::Json, bytes) {
                match m {
                    Ok(ServerMessage::Reply { id: 1, result: Ok(v) }) => return check_position(&v, channel),
                    Ok(ServerMessage::Reply { id: 1, result: Err(e) }) => {
                        return Err(format!("subscribe: error {}: {}", e.code, e.message))
                    }
                    _ => {}
                }
            }
        }
        Err("subscribe: connection ended before the reply".into())
    };
    tokio::time::timeout_at(deadline, reply)
        .await
        .map_err(|_| "subscribe: no reply within the timeout".to_string())??;
    // Close, and wait for the server's side of the close handshake.
    let close = async {
        ws.close(None).await.map_err(|e| format!("close: {e}"))?;
        while let Some(m) = ws.next().await {
            if m.is_err() {
                break;
            }
        }
        Ok::<(), String>(())
    };
    tokio::time::timeout_at(deadline, close)
        .await
        .map_err(|_| "close: the server did not complete the close within the timeout".to_string())?
}

/// The subscribe reply `ok` names `channel` with its position: an epoch and an offset.
pub(crate) fn check_position(ok: &Value, channel: &str) -> Result<(), String> {
    let ch = &ok["channels"][channel];
    if let Some(e) = ch.get("error") {
        return Err(format!("subscribe {channel}: {e}"));
    }
    let has_epoch = ch["epoch"].as_str().is_some_and(|e| !e.is_empty());
    if ch["offset"].as_u64().is_none() || !has_epoch {
        return Err("subscribe reply without the channel's position (epoch, offset)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::streams::feed::Points;
    use crate::testutil;

    fn plan() -> Plan {
        Plan { points: Points { prefix: "pt:soak.".into(), count: 10 }, subs: 4, points_per_sub: 3 }
    }

    fn pubn(ch: &str, off: u64, t: u64) -> PointPub {
        PointPub { ch: ch.into(), off, data: PointData { t } }
    }

    #[test]
    fn soak_held_counts_in_order_gaps_and_repeats_per_channel() {
        let p = plan();
        // Subscriber 3 holds points 9, 0 and 1.
        let mut h = Held::new(&p, 3);
        let (mut t, mut lat) = (Tally::default(), Latency::new());
        assert!(h.confirm(&p, "pt:soak.5", Subscribed::Ok { offset: 0, last: None }).is_err(), "not its point");
        h.confirm(&p, "pt:soak.9", Subscribed::Ok { offset: 4, last: None }).unwrap();
        h.confirm(&p, "pt:soak.0", Subscribed::Ok { offset: 0, last: None }).unwrap();
        assert_eq!(h.confirmed, 2);
        let now = 10_000_000;
        h.deliver(&p, &pubn("pt:soak.9", 5, 9_990), now, &mut t, &mut lat);
        h.deliver(&p, &pubn("pt:soak.9", 5, 9_990), now, &mut t, &mut lat);
        h.deliver(&p, &pubn("pt:soak.9", 8, 9_995), now, &mut t, &mut lat);
        h.deliver(&p, &pubn("pt:soak.9", 4, 9_980), now, &mut t, &mut lat);
        h.deliver(&p, &pubn("pt:soak.0", 1, 9_999), now, &mut t, &mut lat);
        // Point 1's subscription is not confirmed yet, point 5 is not this connection's.
        h.deliver(&p, &pubn("pt:soak.1", 1, 9_999), now, &mut t, &mut lat);
        h.deliver(&p, &pubn("pt:soak.5", 1, 9_999), now, &mut t, &mut lat);
        assert_eq!((t.received, t.duplicated, t.unexpected), (3, 2, 2));
        assert_eq!(t.errors, ["gap on pt:soak.9: 2 offsets missing after 5"]);
        // Latency from the point's `t` (ms): 10 ms, 5 ms and 1 ms.
        assert_eq!(lat.count(), 3);
        assert!((9_990..=10_010).contains(&lat.max_us()), "{} µs (HDR precision)", lat.max_us());
        assert_eq!(t.last_arrival_us, now);
    }

    #[test]
    fn soak_churn_checks_the_position_in_the_reply() {
        let ok = json!({"channels": {"pt:soak.1": {"epoch": "e1", "offset": 7, "last": null}}});
        assert_eq!(check_position(&ok, "pt:soak.1"), Ok(()));
        assert!(check_position(&ok, "pt:soak.2").is_err());
        let no_epoch = json!({"channels": {"c": {"offset": 7}}});
        assert!(check_position(&no_epoch, "c").unwrap_err().contains("position"));
        let refused = json!({"channels": {"c": {"error": {"code": 403, "message": "no"}}}});
        assert!(check_position(&refused, "c").unwrap_err().contains("403"));
    }

    #[test]
    fn soak_churn_worker_settles_every_connection_and_counts_reasons() {
        testutil::local(async {
            // Subscribes to even points get their position, odd ones a reply without it.
            let url = testutil::serve(|msg| {
                let cmd: Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
                let ch = cmd["subscribe"]["channels"][0].as_str().unwrap().to_string();
                assert_eq!(cmd["subscribe"]["initial"], json!(true));
                let even = ch.trim_start_matches("pt:soak.").parse::<u64>().unwrap() % 2 == 0;
                let pos = if even { json!({"epoch": "e", "offset": 3}) } else { json!({"offset": 3}) };
                vec![Message::text(json!({"id": 1, "ok": {"channels": {ch: pos}}}).to_string())]
            })
            .await;
            let share =
                ChurnShare { worker: 0, stride: 1, count: 6, rate: 200.0, start_us: unix_micros(), timeout_ms: 2_000 };
            let cfg = SoakWorker { target: url, plan: plan(), conns: 0, role: SoakRole::Churn(share) };
            let ctx = WorkerCtx::new(0);
            let watcher = ctx.clone();
            tokio::task::spawn_local(async move {
                for _ in 0..500 {
                    let s = watcher.snapshot();
                    if s.established + s.failed >= 6 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                watcher.stop();
            });
            run_worker(cfg, ctx.clone()).await;
            let t = ctx.tally.borrow();
            assert_eq!((t.established, t.failed), (3, 3), "{:?}", t.errors);
            let reason = "subscribe reply without the channel's position (epoch, offset)";
            assert_eq!(t.failure_reasons.get(reason), Some(&3), "{:?}", t.failure_reasons);
        });
    }
}
