//! `echo`: round trips over many connections (the "WebSocket benchmarking infrastructure"
//! ping/pong experiment), against Switchboard or any WebSocket echo server.
//!
//! N connections open at `--ramp` per second; each sends `--rate` messages per second until
//! the ramp plus `--duration` is over, then waits up to `--drain` seconds for the last
//! replies. Each message carries its *scheduled* send time, and its round trip is measured
//! from that time, so a stall (of the server or of the load generator) shows up as latency
//! instead of as fewer samples.
//!
//! - `--protocol switchboard`: the `ping` command, `{"id": n, "ping": {"data": {"t": µs}}}`;
//!   the reply is matched by id.
//! - `--protocol json-echo`: `{"data": "ping", "timestamp": µs}` with no subprotocol; any
//!   frame that comes back counts as the pong of the oldest outstanding ping.

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use anyhow::bail;
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map};
use switchboard_client::connect::handshake;
use switchboard_client::frame::for_each_message;
use switchboard_protocol::Format;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::accounting::MessageCounts;
use crate::common::{instant_of, source_addr, split, unix_micros, CommonArgs, WireFormat};
use crate::probe::{CpuSample, ProcessProbe};
use crate::progress::{Progress, Rate};
use crate::report::{rss_per_connection, standard_criteria, BenchResult, Connections, Criterion};
use crate::scenario::{coordinator_runtime, WorkerConfig};
use crate::worker::{Pool, WorkerCtx};

/// What the far end speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EchoProtocol {
    /// Switchboard's `ping` command.
    Switchboard,
    /// Plain JSON messages echoed back by any echo server.
    JsonEcho,
}

/// `switchboard bench echo`
#[derive(Debug, Clone, clap::Args)]
pub struct EchoArgs {
    /// Connections.
    #[arg(long, default_value_t = 100)]
    pub conns: usize,
    /// Messages per second per connection.
    #[arg(long, default_value_t = 1.0)]
    pub rate: f64,
    /// Connections opened per second.
    #[arg(long, default_value_t = 1000.0)]
    pub ramp: f64,
    /// What the server speaks.
    #[arg(long, value_enum, default_value = "switchboard")]
    pub protocol: EchoProtocol,
    /// Wire format (switchboard protocol only).
    #[arg(long, value_enum, default_value = "json")]
    pub format: WireFormat,
    /// Seconds to wait for outstanding replies after sending stops.
    #[arg(long, default_value_t = 5.0)]
    pub drain: f64,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// An echo worker's share.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EchoWorker {
    pub target: String,
    pub conns: usize,
    pub first_index: usize,
    pub spread: bool,
    /// Connections per second, over all workers.
    pub ramp: f64,
    pub rate: f64,
    /// When connection 0 opens, unix µs.
    pub start_us: u64,
    /// When sending stops, unix µs.
    pub send_until_us: u64,
    pub drain_ms: u64,
    pub protocol: EchoProtocol,
    pub format: WireFormat,
}

// ---------------------------------------------------------------------------------------------
// Worker.

pub async fn run_worker(cfg: EchoWorker, ctx: Rc<WorkerCtx>) {
    let cfg = Rc::new(cfg);
    let mut tasks = Vec::with_capacity(cfg.conns);
    for i in 0..cfg.conns {
        tasks.push(tokio::task::spawn_local(connection(i, cfg.clone(), ctx.clone())));
    }
    tokio::select! {
        _ = futures_util::future::join_all(tasks) => {}
        _ = ctx.wait_stop() => {}
    }
}

#[derive(Deserialize)]
struct Reply {
    #[serde(default)]
    id: Option<u32>,
    #[serde(default)]
    ok: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
}

async fn connection(i: usize, cfg: Rc<EchoWorker>, ctx: Rc<WorkerCtx>) {
    let g = cfg.first_index + i;
    let open_us = cfg.start_us + (g as f64 / cfg.ramp * 1e6) as u64;
    tokio::time::sleep_until(instant_of(open_us)).await;
    let format = cfg.format.format();
    let mut opts = crate::common::connect_options(format);
    opts.offer_subprotocol = cfg.protocol == EchoProtocol::Switchboard;
    opts.bind = source_addr(g, cfg.spread);
    opts.timeout = Duration::from_secs(30);
    let t0 = Instant::now();
    let mut ws = match handshake(&cfg.target, &opts).await {
        Ok(ws) => ws,
        Err(e) => return ctx.failed(&format!("connect: {e}")),
    };
    ctx.established(t0.elapsed().as_micros() as u64);

    let interval_us = (1e6 / cfg.rate) as u64;
    // Start sending one interval after the scheduled open (not after the handshake), so a slow
    // handshake delays the first ping's reply, not its schedule.
    let mut next_us = open_us + interval_us;
    let end = instant_of(cfg.send_until_us + cfg.drain_ms * 1000);
    // Outstanding pings: (id, scheduled µs), oldest first.
    let mut outstanding: VecDeque<(u32, u64)> = VecDeque::new();
    let mut id: u32 = 0;
    loop {
        let sending = next_us < cfg.send_until_us;
        if !sending && outstanding.is_empty() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(instant_of(next_us)), if sending => {
                id = id.wrapping_add(1).max(1);
                let msg = match cfg.protocol {
                    EchoProtocol::Switchboard => {
                        let cmd = json!({"id": id, "ping": {"data": {"t": next_us}}});
                        match format {
                            Format::Json => Message::text(cmd.to_string()),
                            Format::Msgpack => Message::binary(rmp_serde::to_vec_named(&cmd).unwrap_or_default()),
                        }
                    }
                    EchoProtocol::JsonEcho => Message::text(format!("{{\"data\":\"ping\",\"timestamp\":{next_us}}}")),
                };
                if let Err(e) = ws.send(msg).await {
                    return ctx.dropped(&format!("send: {e}"));
                }
                outstanding.push_back((id, next_us));
                ctx.tally.borrow_mut().sent += 1;
                next_us += interval_us;
            }
            msg = ws.next() => {
                let (fmt, payload): (Format, &[u8]) = match &msg {
                    Some(Ok(Message::Text(t))) => (Format::Json, t.as_bytes()),
                    Some(Ok(Message::Binary(b))) => (Format::Msgpack, b),
                    Some(Ok(Message::Close(f))) => {
                        let code = f.as_ref().map(|f| u16::from(f.code)).unwrap_or(1005);
                        return ctx.dropped(&format!("closed by the server with code {code}"));
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return ctx.dropped(&format!("read: {e}")),
                    None => return ctx.dropped("connection ended"),
                };
                let now = unix_micros();
                let mut tally = ctx.tally.borrow_mut();
                let mut lat = ctx.latency.borrow_mut();
                match cfg.protocol {
                    EchoProtocol::JsonEcho => match outstanding.pop_front() {
                        Some((_, t)) => {
                            tally.received += 1;
                            lat.record(now.saturating_sub(t));
                        }
                        None => tally.unexpected += 1,
                    },
                    EchoProtocol::Switchboard => for_each_message::<Reply, _>(fmt, payload, |r| {
                        let Ok(r) = r else { return tally.unexpected += 1 };
                        let Some(rid) = r.id else { return };
                        if r.error.is_some() {
                            tally.note_error("ping answered with an error");
                        }
                        if r.ok.is_none() && r.error.is_none() {
                            return;
                        }
                        match outstanding.iter().position(|(i, _)| *i == rid) {
                            Some(pos) => {
                                // Replies come in order; `pos` is 0 unless one went missing.
                                if let Some((_, t)) = outstanding.remove(pos) {
                                    tally.received += 1;
                                    lat.record(now.saturating_sub(t));
                                }
                            }
                            None => tally.duplicated += 1,
                        }
                    }),
                }
                tally.last_arrival_us = now;
            }
            _ = tokio::time::sleep_until(end) => break,
        }
    }
    // Pings still outstanding are lost; the coordinator counts them as sent − received.
    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
}

// ---------------------------------------------------------------------------------------------
// Coordinator.

pub fn run(args: EchoArgs) -> anyhow::Result<i32> {
    if args.conns == 0 || args.rate <= 0.0 || args.ramp <= 0.0 {
        bail!("--conns, --rate and --ramp must be positive");
    }
    coordinator_runtime()?.block_on(coordinate(args))
}

async fn coordinate(args: EchoArgs) -> anyhow::Result<i32> {
    let started = unix_micros();
    let out = args.common.out_dir("echo");
    let mut progress = Progress::new(args.common.quiet);
    let n = args.conns;
    let duration = args.common.duration.unwrap_or(10.0);
    let probe = args.common.server_pid.map(ProcessProbe::new);
    let mem_before = probe.and_then(|p| p.memory().ok());
    let cpu0 = probe.and_then(|p| p.cpu_sample().ok());

    let ramp_s = n as f64 / args.ramp;
    // Give the worker processes a moment to start before connection 0 is due.
    let start_us = unix_micros() + 1_500_000;
    let send_until_us = start_us + ((ramp_s + duration) * 1e6) as u64;
    let drain_ms = (args.drain * 1000.0) as u64;
    let procs = args.common.procs_for(n);
    let spread = args.common.spread_sources(n);
    let configs: Vec<WorkerConfig> = split(n, procs)
        .into_iter()
        .map(|(first, c)| {
            WorkerConfig::Echo(EchoWorker {
                target: args.common.target.clone(),
                conns: c,
                first_index: first,
                spread,
                ramp: args.ramp,
                rate: args.rate,
                start_us,
                send_until_us,
                drain_ms,
                protocol: args.protocol,
                format: args.format,
            })
        })
        .collect();
    progress.note(&format!(
        "echo: {n} connections ({:?}) over {} worker processes, ramp {} /s, {} msg/s each, {duration} s",
        args.protocol,
        configs.len(),
        args.ramp,
        args.rate
    ));
    let mut pool = Pool::spawn(&configs, None)?;
    let mut rate = Rate::default();
    let mut status = move |p: &Pool| {
        let t = p.totals();
        format!(
            "conns {}/{n} ({} failed, {} dropped), sent {}, replies {} ({:.0}/s)",
            t.established,
            t.failed,
            t.dropped,
            t.sent,
            t.received,
            rate.per_s(t.received)
        )
    };
    let ramp_deadline = instant_of(start_us + (ramp_s * 1e6) as u64) + Duration::from_secs(30);
    pool.run_until(ramp_deadline, &mut progress, &mut status, Pool::all_ready).await;
    let mem_connected = probe.and_then(|p| p.memory().ok());
    let established_at_ramp = pool.totals().established;
    let end_deadline = instant_of(send_until_us + drain_ms * 1000) + Duration::from_secs(10);
    pool.run_until(end_deadline, &mut progress, &mut status, |p| {
        p.workers.iter().all(|w| w.final_report.is_some() || w.ended)
    })
    .await;
    let cpu1 = probe.and_then(|p| p.cpu_sample().ok());
    let mem_end = probe.and_then(|p| p.memory().ok());
    let merged = pool.finish(Duration::from_secs(30), &mut progress).await?;
    let t = &merged.tally;

    let connections = Connections::settled(n as u64, t.established, t.failed);
    let messages = MessageCounts::from_tally(t.sent, t.sent, t);
    let window_s = (send_until_us - start_us) as f64 / 1e6;
    let mut criteria = standard_criteria(&connections, t.dropped, &messages);
    criteria.push(Criterion::workers_reported(merged.missing));
    criteria.push(Criterion::new("replies received", t.received > 0, format!("{} replies", t.received)));
    let cpu_s = CpuSample::between(&cpu0, &cpu1);
    let cs = merged.connect.summary();
    let mut extra = Map::new();
    extra.insert("connect_ms_p50".into(), json!(cs.p50));
    extra.insert("connect_ms_p99".into(), json!(cs.p99));
    extra.insert("connect_ms_max".into(), json!(cs.max));
    extra.insert("dropped".into(), json!(t.dropped));
    extra.insert("sent_per_s".into(), json!(t.sent as f64 / window_s));
    extra.insert(
        "server_cpu_us_per_reply".into(),
        json!(cpu_s.filter(|_| t.received > 0).map(|c| c * 1e6 / t.received as f64)),
    );
    let (before, connected) = (mem_before.map(|m| m.rss), mem_connected.map(|m| m.rss));
    let params = json!({
        "conns": n, "rate": args.rate, "ramp": args.ramp, "duration_s": duration, "drain_s": args.drain,
        "protocol": args.protocol, "format": args.format, "procs": configs.len(), "target": args.common.target,
    });
    BenchResult::builder("echo", params, started)
        .measured(window_s, connections, messages, t.received as f64 / window_s)
        .latency(merged.latency.summary())
        .server(cpu_s, mem_end.map(|m| m.hwm))
        .rss_sampled(before, connected)
        .rss_per_connection(rss_per_connection(before, connected, established_at_ramp))
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
    use crate::testutil;

    fn config(target: String, protocol: EchoProtocol) -> EchoWorker {
        let now = unix_micros();
        EchoWorker {
            target,
            conns: 2,
            first_index: 0,
            spread: false,
            ramp: 100.0,
            rate: 50.0,
            start_us: now,
            send_until_us: now + 300_000,
            drain_ms: 1000,
            protocol,
            format: WireFormat::Json,
        }
    }

    #[test]
    fn echo_json_echo_counts_every_frame_as_a_pong() {
        testutil::local(async {
            let url = testutil::serve(|msg| vec![msg.clone()]).await;
            let ctx = WorkerCtx::new(2);
            run_worker(config(url, EchoProtocol::JsonEcho), ctx.clone()).await;
            let t = ctx.tally.borrow();
            assert_eq!((t.established, t.failed, t.dropped), (2, 0, 0), "{:?}", t.errors);
            assert!(t.sent >= 20, "sent {}", t.sent);
            assert_eq!(t.received, t.sent);
            assert_eq!(t.unexpected + t.duplicated, 0);
            assert_eq!(ctx.latency.borrow().count(), t.sent);
        });
    }

    #[test]
    fn echo_switchboard_matches_by_id_and_counts_duplicates_and_losses() {
        testutil::local(async {
            // Answers ping 2 twice and never answers ping 3.
            let url = testutil::serve(|msg| {
                let cmd: serde_json::Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
                let id = cmd["id"].as_u64().unwrap();
                let reply = Message::text(json!({"id": id, "ok": {"data": cmd["ping"]["data"]}}).to_string());
                match id {
                    2 => vec![reply.clone(), reply],
                    3 => vec![],
                    _ => vec![reply],
                }
            })
            .await;
            let mut cfg = config(url, EchoProtocol::Switchboard);
            cfg.drain_ms = 200;
            let ctx = WorkerCtx::new(2);
            run_worker(cfg, ctx.clone()).await;
            let t = ctx.tally.borrow();
            assert_eq!(t.established, 2);
            assert_eq!(t.duplicated, 2, "one per connection");
            assert_eq!(t.received, t.sent - 2, "ping 3 of each connection is lost");
            let m = MessageCounts::from_tally(t.sent, t.sent, &t);
            assert_eq!((m.lost, m.duplicated), (2, 2));
        });
    }
}
