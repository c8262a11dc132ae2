//! `bench rooms`: collaboration rooms (the Silverlight polling-duplex collaboration experiment).
//!
//! T rooms of N members each, T × N connections. Every member subscribes to its room's channel
//! `--prefix<r>` (by default `room:bench.<r>`: the `room:` namespace lets clients publish).
//! Once every connection is up, the coordinator publishes one message to `--start-channel`,
//! which each room's first member (its publisher) is subscribed to as well; then every room
//! runs on its own, all at the same time:
//!
//! 1. the publisher publishes `{"us": <unix µs>, "seq": k}` to the room over its WebSocket;
//! 2. the room waits until its N − 1 other members have it (or `--timeout` passes);
//! 3. nothing happens in the room for `--pause` D seconds; then the next iteration.
//!
//! Latency is arrival − the publish time stamped in the message, one sample per member and
//! iteration, merged exactly over all worker processes: mean, median, stdev and p99 as in the
//! original table. Each member tracks the offsets it received, so losses and duplicates are
//! counted by offset; expected deliveries are T × (N − 1) × K.
//!
//! A room's members always live in the same worker process (rooms are split over processes,
//! never members), because the room's publisher must see its members' arrivals to know when
//! an iteration is complete. A worker ends once all its rooms have run their iterations.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use anyhow::bail;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map};
use switchboard_client::frame::for_each_message;
use switchboard_client::HttpApi;
use switchboard_protocol::Format;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::accounting::{BurstTally, Delivery, MessageCounts, OffsetSet};
use crate::common::{source_addr, split, unix_micros, CommonArgs, WireFormat, MAX_CONNS_PER_PROC};
use crate::probe::{CpuSample, ProcessProbe};
use crate::progress::{Progress, Rate};
use crate::report::{p99_criterion, rss_per_connection, standard_criteria, BenchResult, Connections, Criterion};
use crate::scenario::streams::feed::{encode, parse_subscribe_ok, payload, Incoming, Points, Subscribed};
use crate::scenario::{coordinator_runtime, WorkerConfig};
use crate::transport::{Conn, ConnStream, Transport};
use crate::worker::{Pool, WorkerCtx};

/// Iterations when neither `--iterations` nor `--duration` is given: the original script ran
/// at least 100.
const DEFAULT_ITERATIONS: u64 = 100;

/// `switchboard bench rooms`
#[derive(Debug, Clone, clap::Args)]
pub struct RoomsArgs {
    /// Rooms T.
    #[arg(long, default_value_t = 100)]
    pub rooms: usize,
    /// Members per room N (one publishes, N − 1 receive).
    #[arg(long, default_value_t = 5)]
    pub members: usize,
    /// Seconds of silence in a room after every member has an iteration's message.
    #[arg(long, default_value_t = 1.0)]
    pub pause: f64,
    /// Iterations per room K [default: 100, or --duration / --pause].
    #[arg(long)]
    pub iterations: Option<u64>,
    /// Seconds a room waits for all its members before moving on (the rest counts as lost).
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,
    /// Channel name prefix of the rooms (`<prefix><r>`); its namespace must allow client
    /// publish.
    #[arg(long, default_value = "room:bench.")]
    pub prefix: String,
    /// Channel the coordinator publishes to once to start every room.
    #[arg(long, default_value = "bench:rooms.start")]
    pub start_channel: String,
    /// Wire format of the members.
    #[arg(long, value_enum, default_value = "json")]
    pub format: WireFormat,
    /// How the members connect: WebSocket, SSE or long-polling. Over SSE and long-polling a
    /// member is a poll session, and the publisher publishes with `POST /poll/{session}`
    /// (the same command as on a WebSocket, under the same permissions and rates). JSON only.
    #[arg(long, value_enum, default_value = "ws")]
    pub transport: Transport,
    /// Handshakes in flight per worker process.
    #[arg(long, default_value_t = 200)]
    pub concurrency: usize,
    /// Token for the handshakes and the HTTP API (`Authorization: Bearer`).
    #[arg(long)]
    pub token: Option<String>,
    /// Largest delivery p99 (ms) of a passing run [default: the pause, or the timeout when
    /// there is no pause].
    #[arg(long)]
    pub max_p99_ms: Option<f64>,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl RoomsArgs {
    pub fn iterations(&self) -> u64 {
        self.iterations.unwrap_or_else(|| match self.common.duration {
            Some(d) if self.pause > 0.0 => (d / self.pause).ceil().max(1.0) as u64,
            _ => DEFAULT_ITERATIONS,
        })
    }
}

/// One worker's rooms: `first_room..first_room + rooms`, all their members.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoomsWorker {
    pub target: String,
    /// `rooms × members`.
    pub conns: usize,
    pub first_room: usize,
    pub rooms: usize,
    pub members: usize,
    pub iterations: u64,
    pub pause_ms: u64,
    pub timeout_ms: u64,
    /// The room channels of the whole run.
    pub channels: Points,
    pub start_channel: String,
    pub spread: bool,
    pub format: WireFormat,
    pub concurrency: usize,
    #[serde(default)]
    pub transport: Transport,
}

/// Deliveries a run owes: every iteration of every room reaches its N − 1 other members.
pub fn expected_deliveries(rooms: usize, members: usize, iterations: u64) -> u64 {
    rooms as u64 * members.saturating_sub(1) as u64 * iterations
}

/// Worker processes for T rooms of N members: `--procs` (or one per 10,000 connections),
/// raised so that no process holds more than [`MAX_CONNS_PER_PROC`] connections when whole
/// rooms are packed, and never more than there are rooms.
pub fn rooms_procs(common: &CommonArgs, rooms: usize, members: usize) -> anyhow::Result<usize> {
    if members > MAX_CONNS_PER_PROC {
        bail!("--members {members}: a room lives in one worker process, which holds at most {MAX_CONNS_PER_PROC} connections");
    }
    let rooms_per_proc = (MAX_CONNS_PER_PROC / members.max(1)).max(1);
    let needed = rooms.div_ceil(rooms_per_proc);
    Ok(common.procs_for(rooms * members).max(needed).min(rooms.max(1)))
}

// ---------------------------------------------------------------------------------------------
// Worker.

/// One room's progress, shared by its member tasks (single-threaded: `Cell`s suffice).
#[derive(Default)]
struct Room {
    /// Iteration being delivered now; `None` before the first.
    current: Cell<Option<u64>>,
    /// Members other than the publisher that have the current iteration.
    got: Cell<usize>,
    /// The server refused the current iteration's publish: nothing to wait for.
    refused: Cell<bool>,
    /// The start signal reached the publisher.
    started: Cell<bool>,
    /// Wakes the publisher on any of the above; it re-checks them.
    changed: Notify,
}

impl Room {
    fn begin(&self, seq: u64) {
        self.got.set(0);
        self.refused.set(false);
        self.current.set(Some(seq));
    }

    /// A member received iteration `seq` for the first time; `receivers` is N − 1. Returns
    /// whether that completed the current iteration.
    fn arrived(&self, seq: u64, receivers: usize) -> bool {
        if self.current.get() != Some(seq) {
            // A late arrival of an iteration the room already gave up on.
            return false;
        }
        self.got.set(self.got.get() + 1);
        let complete = self.got.get() == receivers;
        if complete {
            self.changed.notify_one();
        }
        complete
    }

    fn complete(&self, receivers: usize) -> bool {
        self.got.get() >= receivers || self.refused.get()
    }
}

struct Shared {
    cfg: RoomsWorker,
    ctx: Rc<WorkerCtx>,
    token: Option<String>,
    sem: tokio::sync::Semaphore,
}

pub async fn run_worker(cfg: RoomsWorker, ctx: Rc<WorkerCtx>) {
    ctx.tally.borrow_mut().bursts = vec![BurstTally::default(); cfg.iterations as usize];
    ctx.expect(expected_deliveries(cfg.rooms, cfg.members, cfg.iterations));
    let sem = tokio::sync::Semaphore::new(cfg.concurrency.max(1));
    let s = Rc::new(Shared { cfg, ctx: ctx.clone(), token: crate::worker::token(), sem });
    let mut drivers = Vec::new();
    for i in 0..s.cfg.rooms {
        let r = s.cfg.first_room + i;
        let room = Rc::new(Room::default());
        for m in 0..s.cfg.members {
            let g = r * s.cfg.members + m;
            if m == 0 {
                drivers.push(tokio::task::spawn_local(publisher(s.clone(), room.clone(), r, g)));
            } else {
                tokio::task::spawn_local(member(s.clone(), room.clone(), r, g));
            }
        }
    }
    tokio::select! {
        _ = futures_util::future::join_all(drivers) => {}
        _ = ctx.wait_stop() => {}
    }
    // The measurement is over (the worker stops on return anyway): ending the sessions now
    // is not a dropped connection.
    ctx.stop();
    crate::transport::end_sessions().await;
}

/// Connects and subscribes to `channels`; returns the connection and each channel's offset.
async fn join(s: &Shared, g: usize, channels: &[String]) -> Result<(Conn, Vec<u64>), String> {
    let format = s.cfg.format.format();
    let mut opts = crate::common::connect_options(format);
    opts.bind = source_addr(g, s.cfg.spread);
    opts.credentials = s.token.clone().map(switchboard_client::Credentials::Bearer);
    opts.timeout = Duration::from_secs(30);
    let mut ws = Conn::connect(s.cfg.transport, &s.cfg.target, &opts).await.map_err(|e| format!("connect: {e}"))?;
    let cmd = json!({"id": 1, "subscribe": {"channels": channels}});
    ws.send(encode(format, &cmd)).await.map_err(|e| format!("subscribe: {e}"))?;
    let reply = async {
        while let Some(msg) = ws.next().await {
            let msg = msg.map_err(|e| format!("read: {e}"))?;
            let Some((fmt, bytes)) = payload(&msg)? else { continue };
            let mut result: Option<Result<Vec<u64>, String>> = None;
            for_each_message::<Incoming, _>(fmt, bytes, |m| {
                let Ok(m) = m else { return };
                if m.id != Some(1) || result.is_some() {
                    return;
                }
                result = Some(match (&m.error, &m.ok) {
                    (Some(e), _) => Err(format!("subscribe: error {}: {}", e.code, e.message)),
                    (None, Some(ok)) => parse_subscribe_ok(ok).and_then(|chs| {
                        channels
                            .iter()
                            .map(|c| match chs.iter().find(|(n, _)| n == c) {
                                Some((_, Subscribed::Ok { offset, .. })) => Ok(*offset),
                                Some((_, Subscribed::Err(e))) => Err(e.clone()),
                                None => Err(format!("subscribe: {c} missing from the reply")),
                            })
                            .collect()
                    }),
                    (None, None) => Err("subscribe: empty reply".into()),
                });
            });
            if let Some(r) = result {
                return r;
            }
        }
        Err("connection ended before the subscribe reply".into())
    };
    match tokio::time::timeout(Duration::from_secs(30), reply).await {
        Ok(Ok(offsets)) => Ok((ws, offsets)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("subscribe: no reply within 30 s".into()),
    }
}

/// A receiving member: counts every delivery of its room by offset until the worker ends.
async fn member(s: Rc<Shared>, room: Rc<Room>, r: usize, g: usize) {
    let ctx = &s.ctx;
    let channel = s.cfg.channels.name(r);
    let permit = s.sem.acquire().await;
    let t0 = Instant::now();
    let (mut ws, offsets) = match join(&s, g, std::slice::from_ref(&channel)).await {
        Ok(j) => j,
        Err(e) => return ctx.failed(&e),
    };
    drop(permit);
    ctx.established(t0.elapsed().as_micros() as u64);
    let receivers = s.cfg.members - 1;
    let mut seen = OffsetSet::new(offsets[0]);
    while let Some(msg) = ws.next().await {
        let msg = match msg {
            Ok(m) => m,
            Err(e) => return ctx.dropped(&format!("read: {e}")),
        };
        let (fmt, bytes) = match payload(&msg) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(why) => return ctx.dropped(&why),
        };
        let now = unix_micros();
        let mut got = false;
        {
            let mut tally = ctx.tally.borrow_mut();
            let mut lat = ctx.latency.borrow_mut();
            for_each_message::<Incoming, _>(fmt, bytes, |m| {
                let Ok(m) = m else {
                    tally.unexpected += 1;
                    return;
                };
                if m.disconnect.is_some() {
                    tally.note_error("server sent disconnect");
                }
                let Some(p) = m.publication else { return };
                if p.ch != channel {
                    tally.unexpected += 1;
                    return;
                }
                let d = seen.insert(p.off);
                tally.count(d);
                if d == Delivery::New {
                    got = true;
                    lat.record(now.saturating_sub(p.data.us));
                    if let Some(b) = tally.bursts.get_mut(p.data.seq as usize) {
                        b.count += 1;
                        b.last_us = b.last_us.max(now);
                    }
                    room.arrived(p.data.seq, receivers);
                }
            });
            if got {
                tally.last_arrival_us = now;
            }
        }
        if got {
            ctx.check_complete();
        }
    }
    ctx.dropped("connection ended");
}

/// A room's publisher: waits for the start signal, then runs the room's iterations.
async fn publisher(s: Rc<Shared>, room: Rc<Room>, r: usize, g: usize) {
    let ctx = s.ctx.clone();
    let cfg = &s.cfg;
    let channel = cfg.channels.name(r);
    let permit = s.sem.acquire().await;
    let t0 = Instant::now();
    let (ws, _) = match join(&s, g, &[channel.clone(), cfg.start_channel.clone()]).await {
        Ok(j) => j,
        Err(e) => return ctx.failed(&e),
    };
    drop(permit);
    ctx.established(t0.elapsed().as_micros() as u64);
    let (mut sink, stream) = ws.split();
    tokio::task::spawn_local(publisher_reader(stream, room.clone(), ctx.clone(), cfg.start_channel.clone()));

    while !room.started.get() {
        tokio::select! {
            _ = room.changed.notified() => {}
            _ = ctx.wait_stop() => return,
        }
    }
    let format = cfg.format.format();
    let receivers = cfg.members - 1;
    let timeout = Duration::from_millis(cfg.timeout_ms);
    for k in 0..cfg.iterations {
        room.begin(k);
        let cmd = json!({"id": k + 2, "publish": {"channel": channel, "data": {"us": unix_micros(), "seq": k}}});
        if let Err(e) = sink.send(encode(format, &cmd)).await {
            return ctx.dropped(&format!("publish: {e}"));
        }
        ctx.tally.borrow_mut().sent += 1;
        let deadline = Instant::now() + timeout;
        while !room.complete(receivers) {
            tokio::select! {
                _ = room.changed.notified() => {}
                _ = tokio::time::sleep_until(deadline) => {
                    ctx.tally.borrow_mut().note_error(&format!(
                        "an iteration did not reach every member of its room within {} s",
                        timeout.as_secs_f64()
                    ));
                    break;
                }
                _ = ctx.wait_stop() => return,
            }
        }
        if k + 1 < cfg.iterations {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(cfg.pause_ms)) => {}
                _ = ctx.wait_stop() => return,
            }
        }
    }
}

/// The publisher's incoming side: the start signal, publish replies, and its own echoes (not
/// counted: the publisher is not one of the N − 1 receivers).
async fn publisher_reader(mut stream: ConnStream, room: Rc<Room>, ctx: Rc<WorkerCtx>, start_channel: String) {
    while let Some(msg) = stream.next().await {
        let msg = match msg {
            Ok(m) => m,
            Err(e) => return ctx.dropped(&format!("read: {e}")),
        };
        let (fmt, bytes): (Format, &[u8]) = match payload(&msg) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(why) => return ctx.dropped(&why),
        };
        for_each_message::<Incoming, _>(fmt, bytes, |m| {
            let Ok(m) = m else { return };
            if let Some(p) = &m.publication {
                if p.ch == start_channel && !room.started.get() {
                    room.started.set(true);
                    room.changed.notify_one();
                }
            } else if let (Some(id), Some(e)) = (m.id, &m.error) {
                ctx.tally.borrow_mut().note_error(&format!("publish: error {}: {}", e.code, e.message));
                if room.current.get() == Some(u64::from(id).wrapping_sub(2)) {
                    room.refused.set(true);
                    room.changed.notify_one();
                }
            } else if m.disconnect.is_some() {
                ctx.tally.borrow_mut().note_error("server sent disconnect");
            }
        });
    }
    ctx.dropped("connection ended");
}

// ---------------------------------------------------------------------------------------------
// Coordinator.

pub fn run(args: RoomsArgs) -> anyhow::Result<i32> {
    if args.rooms == 0 || args.members < 2 {
        bail!("--rooms must be positive and --members at least 2 (one publisher, one receiver)");
    }
    args.transport.check_format(args.format.format())?;
    let finite_pause = args.pause >= 0.0 && args.pause.is_finite();
    if !finite_pause || args.timeout <= 0.0 || !args.timeout.is_finite() {
        bail!("--pause must be zero or more and --timeout positive");
    }
    if args.iterations() == 0 {
        bail!("--iterations must be positive");
    }
    coordinator_runtime()?.block_on(coordinate(args))
}

async fn coordinate(args: RoomsArgs) -> anyhow::Result<i32> {
    let started = unix_micros();
    let out = args.common.out_dir("rooms");
    let mut progress = Progress::new(args.common.quiet);
    let probe = args.common.server_pid.map(ProcessProbe::new);
    let mem_before = probe.and_then(|p| p.memory().ok());
    let mut api = HttpApi::new(&args.common.api_base()?)?;
    if let Some(t) = &args.token {
        api = api.with_token(t.clone());
    }
    let (rooms, members, iterations) = (args.rooms, args.members, args.iterations());
    let conns = rooms * members;
    let procs = rooms_procs(&args.common, rooms, members)?;
    let spread = args.common.spread_sources(conns);
    let channels = Points { prefix: args.prefix.clone(), count: rooms };
    let configs: Vec<WorkerConfig> = split(rooms, procs)
        .into_iter()
        .map(|(first_room, n)| {
            WorkerConfig::Rooms(RoomsWorker {
                target: args.common.target.clone(),
                conns: n * members,
                first_room,
                rooms: n,
                members,
                iterations,
                pause_ms: (args.pause * 1000.0) as u64,
                timeout_ms: (args.timeout * 1000.0) as u64,
                channels: channels.clone(),
                start_channel: args.start_channel.clone(),
                spread,
                format: args.format,
                concurrency: args.concurrency,
                transport: args.transport,
            })
        })
        .collect();
    progress.note(&format!(
        "rooms: {rooms} rooms × {members} members = {conns} connections over {} worker processes, {iterations} iterations, pause {} s",
        configs.len(),
        args.pause
    ));
    let pool = Pool::spawn(&configs, args.token.as_deref())?;
    let connect_deadline = Instant::now() + Duration::from_secs(30) + Duration::from_millis(conns as u64 * 5);
    let mut pool =
        pool.establish(connect_deadline, &mut progress, "joining", conns, "no member could join its room").await?;
    let mem_connected = probe.and_then(|p| p.memory().ok());
    let cpu0 = probe.and_then(|p| p.cpu_sample().ok());

    let start_us = unix_micros();
    if let Err(e) = api.publish(&args.start_channel, &json!({"us": start_us, "seq": 0})).await {
        pool.finish(Duration::from_secs(10), &mut progress).await?;
        bail!("publishing the start signal to {}: {e}", args.start_channel);
    }
    let expected = expected_deliveries(rooms, members, iterations);
    let publications = rooms as u64 * iterations;
    let per_iteration = Duration::from_secs_f64(args.pause + args.timeout);
    let deadline = Instant::now() + per_iteration * iterations.min(u32::MAX as u64) as u32 + Duration::from_secs(30);
    let mut rate = Rate::default();
    pool.run_until(
        deadline,
        &mut progress,
        |p| {
            let t = p.totals();
            format!(
                "published {}/{publications}, delivered {}/{expected} ({:.0}/s), {} dropped",
                t.sent,
                t.received,
                rate.per_s(t.received),
                t.dropped
            )
        },
        |p| p.workers.iter().all(|w| w.final_report.is_some() || w.ended),
    )
    .await;
    let cpu1 = probe.and_then(|p| p.cpu_sample().ok());
    let mem_end = probe.and_then(|p| p.memory().ok());
    let merged = pool.finish(Duration::from_secs(30), &mut progress).await?;
    let t = &merged.tally;

    let connections = Connections::settled(conns as u64, t.established, t.failed);
    let messages = MessageCounts::from_tally(t.sent, expected, t);
    let receivers = (rooms * (members - 1)) as u64;
    let incomplete = (0..iterations as usize).filter(|k| t.bursts.get(*k).map_or(0, |b| b.count) < receivers).count();
    let span_us = t.last_arrival_us.saturating_sub(start_us).max(1);
    let cpu_s = CpuSample::between(&cpu0, &cpu1);
    let mut criteria = standard_criteria(&connections, t.dropped, &messages);
    criteria.push(Criterion::new(
        "every room published every iteration",
        t.sent == publications,
        format!("{}/{publications} publications sent", t.sent),
    ));
    criteria.push(Criterion::workers_reported(merged.missing));
    let l = merged.latency.summary();
    let max_p99_ms = args.max_p99_ms.unwrap_or(if args.pause > 0.0 { args.pause } else { args.timeout } * 1000.0);
    criteria.push(p99_criterion(l.p99, max_p99_ms));

    let mut extra = Map::new();
    extra.insert("clients".into(), json!(conns));
    extra.insert("latency_mean_ms".into(), json!(l.mean));
    extra.insert("latency_median_ms".into(), json!(l.p50));
    extra.insert("latency_stdev_ms".into(), json!(l.stdev));
    extra.insert("latency_p99_ms".into(), json!(l.p99));
    extra.insert("iterations_incomplete".into(), json!(incomplete));
    extra.insert(
        "server_cpu_us_per_delivery".into(),
        json!(cpu_s.filter(|_| t.received > 0).map(|c| c * 1e6 / t.received as f64)),
    );
    let cs = merged.connect.summary();
    extra.insert("join_ms_p50".into(), json!(cs.p50));
    extra.insert("join_ms_p99".into(), json!(cs.p99));
    extra.insert("join_ms_max".into(), json!(cs.max));
    let (before, connected) = (mem_before.map(|m| m.rss), mem_connected.map(|m| m.rss));
    let params = json!({
        "rooms": rooms, "members": members, "pause_s": args.pause, "iterations": iterations,
        "timeout_s": args.timeout, "prefix": args.prefix, "format": args.format,
        "procs": configs.len(), "target": args.common.target, "transport": args.transport,
        "max_p99_ms": max_p99_ms,
    });
    BenchResult::builder("rooms", params, started)
        .measured(span_us as f64 / 1e6, connections, messages, t.received as f64 * 1e6 / span_us as f64)
        .latency(l)
        .server(cpu_s, mem_end.map(|m| m.hwm))
        .rss_sampled(before, connected)
        .rss_per_connection(rss_per_connection(before, connected, t.established))
        .procs(configs.len())
        .load_generator_rss(merged.rss_peak_bytes)
        .errors(&t.errors)
        .criteria(criteria)
        .extra(extra)
        .conclude(&merged.latency, &out, &mut progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: RoomsArgs,
    }

    #[test]
    fn rooms_expected_deliveries_exclude_the_publisher() {
        // Silverlight's first row: 100 rooms of 5, 100 iterations: 4 receivers per room.
        assert_eq!(expected_deliveries(100, 5, 100), 40_000);
        assert_eq!(expected_deliveries(5, 3, 5), 50);
        assert_eq!(expected_deliveries(1, 2, 1), 1);
    }

    #[test]
    fn rooms_iterations_default_to_100_or_duration_over_pause() {
        let t = T::parse_from(["t"]);
        assert_eq!(t.a.iterations(), 100);
        let t = T::parse_from(["t", "--duration", "30", "--pause", "15"]);
        assert_eq!(t.a.iterations(), 2);
        let t = T::parse_from(["t", "--duration", "30", "--pause", "0", "--iterations", "7"]);
        assert_eq!(t.a.iterations(), 7);
        let t = T::parse_from(["t", "--duration", "30", "--pause", "0"]);
        assert_eq!(t.a.iterations(), 100, "no pause: duration says nothing about iterations");
    }

    #[test]
    fn rooms_are_split_whole_over_worker_processes() {
        let t = T::parse_from(["t"]);
        // 500 rooms of 3 = 1,500 connections: one process by default.
        assert_eq!(rooms_procs(&t.a.common, 500, 3).unwrap(), 1);
        // 1,000 rooms of 40 = 40,000 connections: whole rooms of 40 pack 375 per process.
        let procs = rooms_procs(&t.a.common, 1000, 40).unwrap();
        assert_eq!(procs, 4);
        let parts = split(1000, procs);
        assert!(parts.iter().all(|(_, n)| n * 40 <= MAX_CONNS_PER_PROC), "{parts:?}");
        assert_eq!(parts.iter().map(|(_, n)| n).sum::<usize>(), 1000);
        // Consecutive workers' rooms (and so connection indices r × N + m) follow on.
        for w in parts.windows(2) {
            assert_eq!(w[0].0 + w[0].1, w[1].0);
        }
        // Never more processes than rooms.
        let t = T::parse_from(["t", "--procs", "8"]);
        assert_eq!(rooms_procs(&t.a.common, 3, 2).unwrap(), 3);
        assert!(rooms_procs(&t.a.common, 1, MAX_CONNS_PER_PROC + 1).is_err());
    }

    #[test]
    fn rooms_iteration_completes_once_every_receiver_has_it() {
        let room = Room::default();
        assert!(!room.arrived(0, 2), "nothing before the first iteration");
        room.begin(0);
        assert!(!room.complete(2));
        assert!(!room.arrived(0, 2));
        assert!(room.arrived(0, 2));
        assert!(room.complete(2));
        room.begin(1);
        assert!(!room.complete(2));
        assert!(!room.arrived(0, 2), "a late arrival of iteration 0 does not count for 1");
        assert_eq!(room.got.get(), 0);
        room.refused.set(true);
        assert!(room.complete(2), "a refused publish is not waited for");
    }
}
