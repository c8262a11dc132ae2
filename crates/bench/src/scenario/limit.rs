//! `limit`: the machine's raw loopback fan-out floor, with no WebSocket library in the path.
//!
//! A tiny server inside the coordinator accepts M plain TCP connections from the workers and,
//! for each of K messages, writes one pre-built frame — a valid unmasked WebSocket text frame
//! of exactly `--size` bytes — to every connection with one `write` call each, from one
//! thread. The workers count bytes and messages. The writer thread's CPU time per delivery is
//! the floor the gateway's CPU per delivery is compared against: the gateway cannot fan out
//! for less than the kernel charges for the sends.
//!
//! Each frame's payload is `{"t":<unix µs, 16 digits>,"p":"xxx…"}`, stamped when the frame is
//! built (before its first write), so workers also measure how long a message takes to reach
//! every connection.

use std::io::Write;
use std::net::{SocketAddr, TcpStream as StdTcpStream};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

use crate::accounting::MessageCounts;
use crate::common::{source_addr, split, unix_micros, CommonArgs};
use crate::probe::{open_file_limit, self_cpu_seconds, thread_cpu_ns, ProcessProbe};
use crate::progress::{Progress, Rate};
use crate::report::{rss_per_connection, standard_criteria, BenchResult, Connections, Criterion};
use crate::scenario::{coordinator_runtime, WorkerConfig};
use crate::worker::{Pool, WorkerCtx};

/// Smallest frame that holds the timestamped payload.
pub const MIN_SIZE: usize = 32;
/// Digits of the timestamp (unix µs has 16 digits until the year 2286).
const T_DIGITS: usize = 16;
/// Offset of the timestamp digits in the payload: after `{"t":`.
const T_IN_PAYLOAD: usize = 5;

/// `switchboard bench limit`
#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// Subscriber connections.
    #[arg(long, default_value_t = 1000)]
    pub subs: usize,
    /// Bytes per frame on the wire, header included (128 and 129 are not encodable and become
    /// 130).
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Messages written to every connection.
    #[arg(long, default_value_t = 1000)]
    pub messages: u64,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// A limit worker's share.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitWorker {
    pub addr: SocketAddr,
    pub conns: usize,
    pub first_index: usize,
    pub spread: bool,
    /// Frame size on the wire.
    pub size: usize,
    pub messages: u64,
}

/// WebSocket header length for a payload of `len` bytes.
fn header_len(len: usize) -> usize {
    match len {
        0..=125 => 2,
        126..=65535 => 4,
        _ => 10,
    }
}

/// The payload length that makes a frame of `size` bytes, and the actual size (sizes that no
/// frame has are rounded up).
pub fn frame_layout(size: usize) -> (usize, usize) {
    for h in [2, 4, 10] {
        if size >= h && header_len(size - h) == h {
            return (size - h, size);
        }
    }
    // 128 or 129: the smallest 4-byte-header frame is 130 bytes.
    (126, 130)
}

/// A text frame of exactly `size` bytes (see [`frame_layout`]) carrying timestamp `t_us`.
pub fn build_frame(size: usize, t_us: u64) -> Vec<u8> {
    let (payload_len, _) = frame_layout(size);
    let mut payload = Vec::with_capacity(payload_len);
    let _ = write!(payload, "{{\"t\":{t_us:016},\"p\":\"");
    let pad = payload_len.saturating_sub(payload.len() + 2);
    payload.resize(payload.len() + pad, b'x');
    payload.extend_from_slice(b"\"}");
    switchboard_protocol::websocket::encode_frame(switchboard_protocol::websocket::Opcode::Text, &payload)
}

/// Where the timestamp digits sit in a frame of `size` bytes.
fn t_offset(size: usize) -> usize {
    let (payload_len, _) = frame_layout(size);
    header_len(payload_len) + T_IN_PAYLOAD
}

/// Reassembles messages from a byte stream cut anywhere, extracting each one's timestamp.
#[derive(Debug, Clone)]
pub struct FrameCounter {
    size: usize,
    t_off: usize,
    pos: usize,
    digits: [u8; T_DIGITS],
}

impl FrameCounter {
    pub fn new(size: usize) -> Self {
        let (_, size) = frame_layout(size);
        FrameCounter { size, t_off: t_offset(size), pos: 0, digits: [b'0'; T_DIGITS] }
    }

    /// Consumes `bytes`, calling `done(timestamp µs)` for every message completed.
    pub fn feed(&mut self, mut bytes: &[u8], mut done: impl FnMut(u64)) {
        while !bytes.is_empty() {
            let take = bytes.len().min(self.size - self.pos);
            let (start, end) = (self.pos, self.pos + take);
            let (t0, t1) = (self.t_off, self.t_off + T_DIGITS);
            if start < t1 && end > t0 {
                let (a, b) = (start.max(t0), end.min(t1));
                self.digits[a - t0..b - t0].copy_from_slice(&bytes[a - start..b - start]);
            }
            self.pos = end;
            bytes = &bytes[take..];
            if self.pos == self.size {
                self.pos = 0;
                let t = self.digits.iter().fold(0u64, |acc, d| acc * 10 + u64::from(d.wrapping_sub(b'0') % 10));
                done(t);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Worker.

pub async fn run_worker(cfg: LimitWorker, ctx: Rc<WorkerCtx>) {
    let cfg = Rc::new(cfg);
    ctx.expect(cfg.conns as u64 * cfg.messages);
    // One receive buffer for all connections: tasks on this thread never hold it across an
    // await, so thousands of connections cost no per-connection buffer.
    let scratch = Rc::new(std::cell::RefCell::new(vec![0u8; 64 * 1024]));
    let sem = Rc::new(tokio::sync::Semaphore::new(256));
    for i in 0..cfg.conns {
        tokio::task::spawn_local(receiver(i, cfg.clone(), ctx.clone(), scratch.clone(), sem.clone()));
    }
    ctx.wait_stop().await;
}

async fn receiver(
    i: usize,
    cfg: Rc<LimitWorker>,
    ctx: Rc<WorkerCtx>,
    scratch: Rc<std::cell::RefCell<Vec<u8>>>,
    sem: Rc<tokio::sync::Semaphore>,
) {
    let permit = sem.acquire().await;
    let t0 = Instant::now();
    let stream = match connect(cfg.addr, source_addr(cfg.first_index + i, cfg.spread)).await {
        Ok(s) => s,
        Err(e) => return ctx.failed(&format!("connect: {e}")),
    };
    drop(permit);
    ctx.established(t0.elapsed().as_micros() as u64);
    let mut counter = FrameCounter::new(cfg.size);
    let mut got = 0u64;
    while got < cfg.messages {
        if let Err(e) = stream.readable().await {
            return ctx.dropped(&format!("read: {e}"));
        }
        let mut buf = scratch.borrow_mut();
        match stream.try_read(&mut buf) {
            Ok(0) => return ctx.dropped("connection closed by the limit server"),
            Ok(n) => {
                let now = unix_micros();
                let mut done = 0u64;
                let mut lat = ctx.latency.borrow_mut();
                counter.feed(&buf[..n], |t| {
                    done += 1;
                    lat.record(now.saturating_sub(t));
                });
                drop(lat);
                got += done;
                let mut tally = ctx.tally.borrow_mut();
                tally.bytes += n as u64;
                tally.received += done;
                if done > 0 {
                    tally.last_arrival_us = now;
                }
                drop(tally);
                if done > 0 {
                    ctx.check_complete();
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return ctx.dropped(&format!("read: {e}")),
        }
    }
    // Keep the socket open until the run ends so the server never sees an early close.
    ctx.wait_stop().await;
}

async fn connect(addr: SocketAddr, bind: Option<std::net::IpAddr>) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    if let Some(ip) = bind {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    socket.connect(addr).await
}

// ---------------------------------------------------------------------------------------------
// Coordinator.

/// What the writer thread measured.
#[derive(Debug, Default)]
struct WriterStats {
    started_us: u64,
    ended_us: u64,
    cpu_ns: u64,
    writes: u64,
    /// Writes that did not take the whole frame at once (then completed with more calls).
    partial: u64,
    errors: u64,
}

/// Writes `messages` frames to every connection, one `write` call per frame and connection.
fn write_all_frames(mut conns: Vec<StdTcpStream>, size: usize, messages: u64) -> WriterStats {
    let mut st = WriterStats { started_us: unix_micros(), ..Default::default() };
    let cpu0 = thread_cpu_ns().unwrap_or(0);
    let mut alive = vec![true; conns.len()];
    for _ in 0..messages {
        let frame = build_frame(size, unix_micros());
        for (c, ok) in conns.iter_mut().zip(alive.iter_mut()) {
            if !*ok {
                continue;
            }
            st.writes += 1;
            match c.write(&frame) {
                Ok(n) if n == frame.len() => {}
                Ok(n) => {
                    st.partial += 1;
                    if c.write_all(&frame[n..]).is_err() {
                        st.errors += 1;
                        *ok = false;
                    }
                }
                Err(_) => {
                    st.errors += 1;
                    *ok = false;
                }
            }
        }
    }
    st.cpu_ns = thread_cpu_ns().unwrap_or(0).saturating_sub(cpu0);
    st.ended_us = unix_micros();
    // Closing happens when the coordinator is done, not here: `conns` drops with the thread,
    // after every byte was handed to the kernel, which delivers it before the FIN.
    st
}

pub fn run(args: LimitArgs) -> anyhow::Result<i32> {
    if args.subs == 0 || args.messages == 0 {
        bail!("--subs and --messages must be at least 1");
    }
    if args.size < MIN_SIZE {
        bail!("--size must be at least {MIN_SIZE} bytes (the timestamped payload)");
    }
    let (_, size) = frame_layout(args.size);
    if let Some(limit) = open_file_limit() {
        if args.subs as u64 + 256 > limit {
            bail!(
                "--subs {} needs more open files than this process may have ({limit}); the in-process \
                 server holds one socket per subscriber (raise `ulimit -n`)",
                args.subs
            );
        }
    }
    coordinator_runtime()?.block_on(coordinate(args, size))
}

async fn coordinate(args: LimitArgs, size: usize) -> anyhow::Result<i32> {
    let started = unix_micros();
    let out = args.common.out_dir("limit");
    let mut progress = Progress::new(args.common.quiet);
    let me = ProcessProbe::new(std::process::id());
    let mem_before = me.memory().ok();

    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind("127.0.0.1:0".parse()?)?;
    let listener = socket.listen(4096)?;
    let addr = listener.local_addr()?;
    let m = args.subs;
    let accept = tokio::spawn(async move {
        let mut conns = Vec::with_capacity(m);
        while conns.len() < m {
            match listener.accept().await {
                Ok((s, _)) => conns.push(s),
                Err(e) => return Err(e),
            }
        }
        Ok(conns)
    });

    let procs = args.common.procs_for(m);
    let spread = m > crate::common::CONNS_PER_SOURCE_ADDR;
    let configs: Vec<WorkerConfig> = split(m, procs)
        .into_iter()
        .map(|(first, n)| {
            WorkerConfig::Limit(LimitWorker {
                addr,
                conns: n,
                first_index: first,
                spread,
                size,
                messages: args.messages,
            })
        })
        .collect();
    progress.note(&format!(
        "limit: {m} connections over {} worker processes, {} messages of {size} bytes each",
        configs.len(),
        args.messages
    ));
    let mut pool = Pool::spawn(&configs, None)?;
    let connect_deadline = Instant::now() + Duration::from_secs(30) + Duration::from_millis(m as u64);
    pool.run_until(
        connect_deadline,
        &mut progress,
        |p| {
            let t = p.totals();
            format!("connecting {}/{m} ({} failed)", t.established, t.failed)
        },
        Pool::all_ready,
    )
    .await;
    let conns = match tokio::time::timeout_at(connect_deadline + Duration::from_secs(5), accept).await {
        Ok(Ok(Ok(c))) => c,
        Ok(Ok(Err(e))) => bail!("accepting connections: {e}"),
        _ => bail!("only {} of {m} connections arrived", pool.totals().established),
    };
    let mem_connected = me.memory().ok();
    let mut std_conns = Vec::with_capacity(conns.len());
    for c in conns {
        let s = c.into_std()?;
        s.set_nonblocking(false)?;
        s.set_nodelay(true)?;
        std_conns.push(s);
    }

    // Measured phase: the writer thread runs flat out while this thread follows progress.
    let expected = m as u64 * args.messages;
    let finished = Arc::new(AtomicBool::new(false));
    let cpu0 = self_cpu_seconds().ok();
    let writer = {
        let finished = finished.clone();
        let messages = args.messages;
        std::thread::Builder::new()
            .name("limit-writer".into())
            .spawn(move || {
                let st = write_all_frames(std_conns, size, messages);
                finished.store(true, Ordering::Release);
                st
            })
            .context("starting the writer thread")?
    };
    let mut rate = Rate::default();
    let deadline = Instant::now() + Duration::from_secs(30) + Duration::from_micros(expected * 10);
    pool.run_until(
        deadline,
        &mut progress,
        |p| {
            let t = p.totals();
            format!(
                "writing: {}/{expected} delivered ({:.0}/s){}",
                t.received,
                rate.per_s(t.received),
                if finished.load(Ordering::Acquire) { ", writer done" } else { "" }
            )
        },
        |p| p.totals().received >= expected,
    )
    .await;
    // The writer is done or blocked on a connection nobody reads any more; stopping the
    // workers closes their sockets, which unblocks it with an error.
    let merged = pool.finish(Duration::from_secs(30), &mut progress).await?;
    let st = tokio::task::spawn_blocking(move || writer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the writer thread panicked"))?;
    let cpu1 = self_cpu_seconds().ok();
    let mem_end = me.memory().ok();

    let t = &merged.tally;
    let connections = Connections::settled(m as u64, t.established, t.failed);
    let messages = MessageCounts::from_tally(st.writes, expected, t);
    let span_us = t.last_arrival_us.saturating_sub(st.started_us).max(1);
    let deliveries_per_s = t.received as f64 * 1e6 / span_us as f64;
    let writer_us_per_delivery = if st.writes > 0 { st.cpu_ns as f64 / 1000.0 / st.writes as f64 } else { 0.0 };
    let process_cpu = match (cpu0, cpu1) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    let mut criteria = standard_criteria(&connections, t.dropped, &messages);
    criteria.push(Criterion::workers_reported(merged.missing));
    criteria.push(Criterion::new("every write succeeded", st.errors == 0, format!("{} failed writes", st.errors)));
    let mut extra = Map::new();
    extra.insert("frame_bytes".into(), json!(size));
    extra.insert("writer_cpu_s".into(), json!(st.cpu_ns as f64 / 1e9));
    extra.insert("writer_cpu_us_per_delivery".into(), json!(writer_us_per_delivery));
    extra.insert("process_cpu_us_per_delivery".into(), json!(process_cpu.map(|c| c * 1e6 / st.writes.max(1) as f64)));
    extra.insert("write_phase_s".into(), json!(st.ended_us.saturating_sub(st.started_us) as f64 / 1e6));
    extra.insert("partial_writes".into(), json!(st.partial));
    extra.insert("throughput_mib_per_s".into(), json!(t.bytes as f64 / 1048576.0 * 1e6 / span_us as f64));
    extra.insert("connect_ms_p99".into(), json!(merged.connect.summary().p99));
    let params = json!({"subs": m, "size": size, "messages": args.messages, "procs": configs.len()});
    BenchResult::builder("limit", params, started)
        .measured(span_us as f64 / 1e6, connections, messages, deliveries_per_s)
        .latency(merged.latency.summary())
        .server(Some(st.cpu_ns as f64 / 1e9), mem_end.map(|m| m.hwm))
        .rss_per_connection(rss_per_connection(mem_before.map(|m| m.rss), mem_connected.map(|m| m.rss), t.established))
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

    #[test]
    fn limit_frames_have_the_exact_size_and_parse_as_websocket_text() {
        for size in [32usize, 100, 127, 130, 200, 1000, 65539, 70_000] {
            let f = build_frame(size, 1_700_000_000_123_456);
            assert_eq!(f.len(), size, "size {size}");
            let h = switchboard_protocol::websocket::parse_header(&f, 1 << 20, false).unwrap().unwrap();
            assert_eq!(h.opcode, switchboard_protocol::websocket::Opcode::Text);
            assert_eq!(h.header_len + h.payload_len, size);
            let v: serde_json::Value = serde_json::from_slice(&f[h.header_len..]).unwrap();
            assert_eq!(v["t"], serde_json::json!(1_700_000_000_123_456u64));
        }
        assert_eq!(frame_layout(128), (126, 130));
        assert_eq!(build_frame(129, 1_700_000_000_000_000).len(), 130);
    }

    #[test]
    fn limit_counter_reassembles_messages_cut_anywhere() {
        let size = 100;
        let stamps = [1_700_000_000_000_001u64, 1_700_000_000_000_002, 1_700_000_000_000_003];
        let stream: Vec<u8> = stamps.iter().flat_map(|t| build_frame(size, *t)).collect();
        for cut in [1usize, 3, 7, 16, 99, 100, 101, 299, 300] {
            let mut c = FrameCounter::new(size);
            let mut got = Vec::new();
            for chunk in stream.chunks(cut) {
                c.feed(chunk, |t| got.push(t));
            }
            assert_eq!(got, stamps, "chunks of {cut}");
        }
    }
}
