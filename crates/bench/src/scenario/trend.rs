//! `bench trend`: trends at plant scale. N point channels get their whole trend window at once
//! — S seconds of one value a second, each value carrying its own `t` in the past — through
//! `POST /api/publish {"batch": [...]}` as fast as the server takes them; then 200 of the full
//! trends are read over HTTP (`GET /api/channels/{ch}/trend?window_s=S`) and through one
//! WebSocket connection's `subscribe` with the `trend` option.
//!
//! The fill goes second by second across all points (second 0 of every point, then second 1,
//! ...), so a value's `t` stays within the trend's reach of the server's clock as long as the
//! fill runs faster than one value per point per second. The trend read then holds the seconds
//! not yet out of its window: `S` minus the whole seconds since the fill started.
//!
//! Values: per point, a slow sine with noise, rounded to hundredths as instruments report;
//! `--full-precision` keeps every bit instead (a computed quantity), the worst case for the
//! trend's compression.
//!
//! Reported: the server's RSS growth per stored bucket (`--server-pid`, from `/proc`), the fill
//! rate, and the time to read the trends each way. A subscribe reply carries only as many trends
//! as its byte bound allows (docs/protocol.md, "Reply bound"); the refused channels (413) are
//! asked again in the next command on the same connection, as a dashboard does, by the client
//! library's rule ([`SubscribeAll`]). The run fails
//! when a publication is refused or any read is short.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Map};
use switchboard_client::{ChannelResult, Client, HttpApi, SubscribeAll, SubscribeOptions};

use crate::accounting::MessageCounts;
use crate::common::{unix_micros, CommonArgs, WireFormat};
use crate::histogram::Latency;
use crate::probe::ProcessProbe;
use crate::progress::Progress;
use crate::report::{BenchResult, Connections, Criterion};
use crate::scenario::coordinator_runtime;

/// `switchboard bench trend`
#[derive(Debug, Clone, clap::Args)]
pub struct TrendArgs {
    /// Point channels N.
    #[arg(long, default_value_t = 1000)]
    pub points: usize,
    /// Trend window S (s): seconds of one-second values filled per point, and read back.
    #[arg(long, default_value_t = 3600)]
    pub window: u64,
    /// Channel name prefix of the points (`<prefix><i>`).
    #[arg(long, default_value = "pt:bench.trend.")]
    pub prefix: String,
    /// Values per `POST /api/publish` batch.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Publish requests in flight at once (one HTTP connection each).
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Trends read each way.
    #[arg(long, default_value_t = 200)]
    pub reads: usize,
    /// HTTP trend reads in flight at once (a browser opens about six connections).
    #[arg(long, default_value_t = 6)]
    pub read_concurrency: usize,
    /// Values with every bit of their mantissa (a computed quantity) instead of hundredths:
    /// the worst case for the trend's compression.
    #[arg(long)]
    pub full_precision: bool,
    /// Token for the handshake and the HTTP API (`Authorization: Bearer`).
    #[arg(long)]
    pub token: Option<String>,
    /// The Redis behind the server (`redis://…`): report its memory (`used_memory`) and CPU
    /// per stored bucket, measured once the nodes' trend compaction has settled.
    #[arg(long)]
    pub redis: Option<String>,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// The value point `i` has at second `k` of the window, rounded to hundredths unless `full`.
pub fn value(i: usize, k: u64, full: bool) -> f64 {
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ k.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 29;
    let noise = (x >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
    let base = 20.0 + (i % 80) as f64;
    let wave = 5.0 * (k as f64 * std::f64::consts::TAU / (600.0 + (i % 7) as f64 * 100.0)).sin();
    let v = base + wave + noise * 0.2;
    if full {
        v
    } else {
        (v * 100.0).round() / 100.0
    }
}

/// The body of one batch: values `from..to` of the fill order (second-major: index
/// `k * points + i` is point `i` at second `k`).
fn batch_body(prefix: &str, points: usize, base_ms: u64, full: bool, from: u64, to: u64) -> String {
    let mut s = String::with_capacity(((to - from) as usize) * 72 + 16);
    s.push_str("{\"batch\":[");
    for (n, idx) in (from..to).enumerate() {
        let (k, i) = (idx / points as u64, (idx % points as u64) as usize);
        if n > 0 {
            s.push(',');
        }
        let t = base_ms + k * 1000;
        s.push_str(&format!("{{\"channel\":\"{prefix}{i}\",\"data\":{{\"v\":{},\"t\":{t}}}}}", value(i, k, full)));
    }
    s.push_str("]}");
    s
}

/// Buckets a full trend read at `now_ms` holds: the window's seconds not yet out of it.
pub fn expected_buckets(window: u64, fill_start_ms: u64, now_ms: u64) -> u64 {
    window.saturating_sub((now_ms / 1000).saturating_sub(fill_start_ms / 1000))
}

fn now_ms() -> u64 {
    unix_micros() / 1000
}

/// `used_memory` (bytes) and CPU seconds (user + system) of a Redis server, from `INFO`.
async fn redis_figures(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<(u64, f64)> {
    let info: String = redis::cmd("INFO").query_async(conn).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
            .map(str::trim)
            .map(str::to_owned)
    };
    let memory = field("used_memory").and_then(|v| v.parse().ok()).unwrap_or(0);
    let cpu = ["used_cpu_user", "used_cpu_sys"].iter().filter_map(|f| field(f)?.parse::<f64>().ok()).sum();
    Ok((memory, cpu))
}

/// Redis figures once its memory stopped falling for three seconds in a row (the nodes
/// compress closed trend chunks in the background), at most two minutes.
async fn redis_settled(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<(u64, f64)> {
    let mut last = redis_figures(conn).await?;
    let mut steady = 0;
    for _ in 0..120 {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let now = redis_figures(conn).await?;
        steady = if now.0 >= last.0 { steady + 1 } else { 0 };
        last = now;
        if steady >= 3 {
            break;
        }
    }
    Ok(last)
}

pub fn run(args: TrendArgs) -> anyhow::Result<i32> {
    if args.points == 0 || args.window == 0 || args.batch == 0 || args.concurrency == 0 {
        bail!("--points, --window, --batch and --concurrency must be positive");
    }
    coordinator_runtime()?.block_on(coordinate(args))
}

/// What the fill came to.
struct Fill {
    accepted: u64,
    refused: u64,
    errors: Vec<String>,
    seconds: f64,
}

async fn fill(args: &TrendArgs, base_ms: u64, progress: &mut Progress) -> anyhow::Result<Fill> {
    let total = args.points as u64 * args.window;
    let next = Rc::new(Cell::new(0u64));
    let accepted = Rc::new(Cell::new(0u64));
    let refused = Rc::new(Cell::new(0u64));
    let errors = Rc::new(RefCell::new(Vec::<String>::new()));
    let started = Instant::now();
    let mut lanes = Vec::new();
    for _ in 0..args.concurrency {
        let mut api = HttpApi::new(&args.common.api_base()?)?.with_timeout(Duration::from_secs(120));
        if let Some(t) = &args.token {
            api = api.with_token(t.clone());
        }
        let (next, accepted, refused, errors) = (next.clone(), accepted.clone(), refused.clone(), errors.clone());
        let (prefix, points, batch, full) = (args.prefix.clone(), args.points, args.batch as u64, args.full_precision);
        lanes.push(async move {
            loop {
                let from = next.get();
                if from >= total {
                    break;
                }
                let to = (from + batch).min(total);
                next.set(to);
                let body = batch_body(&prefix, points, base_ms, full, from, to);
                match api.request("POST", "/api/publish", Some(body.as_bytes())).await {
                    Ok(r) if r.status == 200 => {
                        // A refused item is `{"error": ...}` in `results`; the rest are positions.
                        let text = String::from_utf8_lossy(&r.body);
                        let bad = text.matches("\"error\"").count() as u64;
                        accepted.set(accepted.get() + (to - from) - bad);
                        refused.set(refused.get() + bad);
                        if bad > 0 && errors.borrow().len() < 10 {
                            errors.borrow_mut().push(text.chars().take(300).collect());
                        }
                    }
                    other => {
                        refused.set(refused.get() + (to - from));
                        if errors.borrow().len() < 10 {
                            errors.borrow_mut().push(match other {
                                Ok(r) => format!("HTTP {}: {}", r.status, String::from_utf8_lossy(&r.body)),
                                Err(e) => e.to_string(),
                            });
                        }
                    }
                }
            }
        });
    }
    let all = futures_util::future::join_all(lanes);
    tokio::pin!(all);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = &mut all => break,
            _ = tick.tick() => {
                let s = started.elapsed().as_secs_f64().max(1e-3);
                progress.update(&format!("fill: {}/{total} values, {:.0}/s", accepted.get(), accepted.get() as f64 / s));
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let errors = errors.borrow().clone();
    Ok(Fill { accepted: accepted.get(), refused: refused.get(), errors, seconds })
}

/// The channels read back: `reads` points spread over all of them.
fn read_set(args: &TrendArgs) -> Vec<String> {
    let n = args.reads.min(args.points).max(1);
    (0..n).map(|j| format!("{}{}", args.prefix, j * args.points / n)).collect()
}

/// What a set of reads came to.
#[derive(Default)]
struct Reads {
    ms: f64,
    buckets: u64,
    short: Vec<String>,
    latency: Latency,
}

async fn read_http(args: &TrendArgs, channels: &[String], fill_start_ms: u64) -> anyhow::Result<Reads> {
    let started = Instant::now();
    let next = Rc::new(Cell::new(0usize));
    let out = Rc::new(RefCell::new(Reads::default()));
    let mut lanes = Vec::new();
    for _ in 0..args.read_concurrency.max(1) {
        let mut api = HttpApi::new(&args.common.api_base()?)?;
        if let Some(t) = &args.token {
            api = api.with_token(t.clone());
        }
        let (next, out, window) = (next.clone(), out.clone(), args.window);
        lanes.push(async move {
            loop {
                let j = next.get();
                let Some(ch) = channels.get(j) else { break };
                next.set(j + 1);
                let t0 = Instant::now();
                let asked_ms = now_ms();
                let got = api.get(&format!("/api/channels/{ch}/trend?window_s={window}")).await;
                let mut o = out.borrow_mut();
                o.latency.record(t0.elapsed().as_micros() as u64);
                match got {
                    Ok(v) => {
                        let n = v["buckets"].as_array().map_or(0, Vec::len) as u64;
                        o.buckets += n;
                        let want = expected_buckets(window, fill_start_ms, asked_ms);
                        if n + 2 < want {
                            o.short.push(format!("{ch}: {n} of {want} buckets"));
                        }
                    }
                    Err(e) => o.short.push(format!("{ch}: {e}")),
                }
            }
        });
    }
    futures_util::future::join_all(lanes).await;
    let mut r = Rc::try_unwrap(out).map_err(|_| anyhow::anyhow!("reads still shared"))?.into_inner();
    r.ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(r)
}

/// One connection, `subscribe` with `trend` for every channel, in as many commands as the
/// replies' byte budget needs: the client's [`SubscribeAll`] says which channels go again (413)
/// and when to stop; each command is timed here.
async fn read_ws(args: &TrendArgs, channels: &[String], fill_start_ms: u64) -> anyhow::Result<Reads> {
    let mut url = args.common.target.clone();
    if let Some(t) = &args.token {
        url = format!("{url}{}token={t}", if url.contains('?') { '&' } else { '?' });
    }
    let mut client = Client::connect(&url, WireFormat::Json.format()).await.context("trend subscribe connection")?;
    client.set_request_timeout(Duration::from_secs(60));
    let started = Instant::now();
    let mut r = Reads::default();
    let mut all = SubscribeAll::new(SubscribeOptions::new(channels.iter().cloned()).trend(args.window, None));
    while let Some(command) = all.next_command() {
        let t0 = Instant::now();
        let asked_ms = now_ms();
        let reply = client.subscribe(command).await?;
        for (ch, res) in &reply.channels {
            let ChannelResult::Subscribed(s) = res else { continue };
            r.latency.record(t0.elapsed().as_micros() as u64);
            let n = s.trend.as_ref().and_then(|t| t["buckets"].as_array()).map_or(0, Vec::len) as u64;
            r.buckets += n;
            let want = expected_buckets(args.window, fill_start_ms, asked_ms);
            if n + 2 < want {
                r.short.push(format!("{ch}: {n} of {want} buckets"));
            }
        }
        all.accept(reply);
    }
    // Refused for good: by a reply that took no channel, or for another reason.
    let reply = all.finish();
    let mut refused: Vec<String> =
        reply.errors().map(|(ch, e)| format!("{ch}: error {}: {}", e.code, e.message)).collect();
    refused.sort();
    r.short.extend(refused);
    r.ms = started.elapsed().as_secs_f64() * 1000.0;
    let _ = client.close().await;
    Ok(r)
}

async fn coordinate(args: TrendArgs) -> anyhow::Result<i32> {
    let started = unix_micros();
    let out = args.common.out_dir("trend");
    let mut progress = Progress::new(args.common.quiet);
    let probe = args.common.server_pid.map(ProcessProbe::new);
    let rss_before = probe.and_then(|p| p.memory().ok()).map(|m| m.rss);
    let cpu_before = probe.and_then(|p| p.cpu_seconds().ok());
    let mut redis_conn = match &args.redis {
        Some(url) => Some(
            redis::Client::open(url.as_str())
                .map_err(|e| anyhow::anyhow!("--redis {url}: {e}"))?
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| anyhow::anyhow!("--redis {url}: {e}"))?,
        ),
        None => None,
    };
    let redis_before = match redis_conn.as_mut() {
        Some(c) => Some(redis_figures(c).await?),
        None => None,
    };
    let fill_start_ms = now_ms();
    // Second k of the window starts at base + k s; the last one is the current second.
    let base_ms = (fill_start_ms - fill_start_ms % 1000).saturating_sub((args.window - 1) * 1000);
    let total = args.points as u64 * args.window;
    progress.note(&format!(
        "trend: {} points × {} s = {total} values in batches of {}",
        args.points, args.window, args.batch
    ));
    let f = fill(&args, base_ms, &mut progress).await?;
    let cpu_after = probe.and_then(|p| p.cpu_seconds().ok());
    let rss_after = probe.and_then(|p| p.memory().ok());
    let fill_rate = f.accepted as f64 / f.seconds.max(1e-9);
    let per_bucket = match (rss_before, rss_after) {
        (Some(a), Some(b)) if f.accepted > 0 => Some(b.rss.saturating_sub(a) as f64 / f.accepted as f64),
        _ => None,
    };
    progress.note(&format!("fill: {} values in {:.1} s, {fill_rate:.0}/s", f.accepted, f.seconds));
    let redis_fill = match redis_conn.as_mut() {
        Some(c) => Some(redis_figures(c).await?),
        None => None,
    };
    let redis_settled = match redis_conn.as_mut() {
        Some(c) => Some(redis_settled(c).await?),
        None => None,
    };
    let values = f.accepted.max(1) as f64;
    let redis_per_bucket = redis_before.zip(redis_settled).map(|(a, b)| b.0.saturating_sub(a.0) as f64 / values);
    let redis_cpu_fill = redis_before.zip(redis_fill).map(|(a, b)| (b.1 - a.1) * 1e6 / values);
    let redis_cpu_all = redis_before.zip(redis_settled).map(|(a, b)| (b.1 - a.1) * 1e6 / values);
    if let Some(b) = redis_per_bucket {
        progress.note(&format!("redis: {b:.1} B per bucket once compressed"));
    }

    let channels = read_set(&args);
    let http = read_http(&args, &channels, fill_start_ms).await?;
    progress.note(&format!("HTTP: {} trends in {:.0} ms", channels.len(), http.ms));
    let ws = read_ws(&args, &channels, fill_start_ms).await?;
    progress.note(&format!("subscribe: {} trends in {:.0} ms", channels.len(), ws.ms));
    let mut latency = http.latency;
    latency.merge(&ws.latency)?;

    let criteria = vec![
        Criterion::new(
            "every value accepted",
            f.refused == 0 && f.accepted == total,
            format!("{} of {total} accepted, {} refused", f.accepted, f.refused),
        ),
        Criterion::new(
            "every HTTP trend read full",
            http.short.is_empty(),
            match http.short.first() {
                None => format!("{} trends, {} buckets", channels.len(), http.buckets),
                Some(s) => format!("{} short, first: {s}", http.short.len()),
            },
        ),
        Criterion::new(
            "every subscribed trend read full",
            ws.short.is_empty(),
            match ws.short.first() {
                None => format!("{} trends, {} buckets", channels.len(), ws.buckets),
                Some(s) => format!("{} short, first: {s}", ws.short.len()),
            },
        ),
    ];
    let mut extra = Map::new();
    extra.insert("points".into(), json!(args.points));
    extra.insert("window_s".into(), json!(args.window));
    extra.insert("values".into(), json!(f.accepted));
    extra.insert("fill_s".into(), json!(f.seconds));
    extra.insert("fill_values_per_s".into(), json!(fill_rate));
    extra.insert("rss_before_bytes".into(), json!(rss_before));
    extra.insert("rss_after_fill_bytes".into(), json!(rss_after.map(|m| m.rss)));
    extra.insert("rss_per_bucket_bytes".into(), json!(per_bucket));
    extra.insert(
        "server_cpu_us_per_value".into(),
        json!(cpu_before.zip(cpu_after).filter(|_| f.accepted > 0).map(|(a, b)| (b - a) * 1e6 / f.accepted as f64)),
    );
    extra.insert("redis_used_memory_per_bucket_bytes".into(), json!(redis_per_bucket));
    extra.insert("redis_cpu_us_per_value_fill".into(), json!(redis_cpu_fill));
    extra.insert("redis_cpu_us_per_value_with_compaction".into(), json!(redis_cpu_all));
    extra.insert("http_read_ms".into(), json!(http.ms));
    extra.insert("http_buckets".into(), json!(http.buckets));
    extra.insert("subscribe_read_ms".into(), json!(ws.ms));
    extra.insert("subscribe_buckets".into(), json!(ws.buckets));
    extra.insert("trends_read".into(), json!(channels.len()));
    let errors: Vec<&String> = f.errors.iter().chain(&http.short).chain(&ws.short).take(20).collect();
    let params = json!({
        "points": args.points, "window_s": args.window, "prefix": args.prefix, "batch": args.batch,
        "concurrency": args.concurrency, "reads": args.reads, "read_concurrency": args.read_concurrency,
        "full_precision": args.full_precision, "redis": args.redis,
        "target": args.common.target,
    });
    let reads = (2 * channels.len()) as u64;
    let got = (channels.len() - http.short.len().min(channels.len()) + channels.len()
        - ws.short.len().min(channels.len())) as u64;
    let messages = MessageCounts { sent: reads, expected: reads, received: got, lost: reads - got, duplicated: 0 };
    let connections = Connections { target: 1, established: 1, failed: 0 };
    BenchResult::builder("trend", params, started)
        .measured(f.seconds, connections, messages, fill_rate)
        .latency(latency.summary())
        .server(cpu_before.zip(cpu_after).map(|(a, b)| b - a), rss_after.map(|m| m.hwm))
        .errors(&errors)
        .criteria(criteria)
        .extra(extra)
        .conclude(&latency, &out, &mut progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn trend_bench_values_are_hundredths_near_their_base() {
        for (i, k) in [(0, 0), (5, 100), (79, 3599), (12345, 7)] {
            let v = value(i, k, false);
            assert_eq!((v * 100.0).round() / 100.0, v);
            assert!((value(i, k, true) - v).abs() <= 0.005 + 1e-9);
            assert!((v - (20.0 + (i % 80) as f64)).abs() < 6.0, "{v}");
        }
        assert_eq!(value(3, 9, false), value(3, 9, false), "deterministic");
    }

    #[test]
    fn trend_bench_batches_go_second_by_second_across_points() {
        let body = batch_body("pt:x.", 3, 1_000_000, false, 2, 5);
        let v: Value = serde_json::from_str(&body).unwrap();
        let items = v["batch"].as_array().unwrap();
        let got: Vec<(&str, u64)> =
            items.iter().map(|i| (i["channel"].as_str().unwrap(), i["data"]["t"].as_u64().unwrap())).collect();
        assert_eq!(got, vec![("pt:x.2", 1_000_000), ("pt:x.0", 1_001_000), ("pt:x.1", 1_001_000)]);
    }

    #[test]
    fn trend_bench_expects_the_seconds_still_in_the_window() {
        assert_eq!(expected_buckets(3600, 10_500, 10_900), 3600);
        assert_eq!(expected_buckets(3600, 10_500, 13_100), 3597);
        assert_eq!(expected_buckets(10, 0, 60_000), 0);
    }
}
