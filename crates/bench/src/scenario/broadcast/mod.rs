//! `broadcast`: one channel, M subscribers, a publication every P seconds (the Silverlight
//! polling-duplex broadcast experiment).
//!
//! Subscribers spread over worker processes subscribe to one channel; once all are in, the
//! coordinator publishes K publications `{"t": <unix µs>, "seq": k}` through `POST
//! /api/publish`, one every P seconds. Every subscriber records each delivery's latency
//! (arrival − `t`) and which offsets it saw. A burst is complete when all M subscribers have
//! it; its completion time is the last arrival − `t`, and it passes if that is within P.
//! Every attempted publication is expected at every subscriber, so a publish that fails (a
//! dead server) shows as lost deliveries as well as a failed criterion.
//! `--search` doubles M until a burst misses its period (or `--search-max`).
//! `--doc-bytes` publishes point documents of that size instead (module `document`);
//! `--compression deflate` and `--delta fossil` make the subscribers take them compressed or
//! as deltas, and every run reports the bytes the subscribers' sockets read per delivery.
//! `--reference TRANSPORT` adds M subscribers over a second transport on a second channel and
//! compares the two transports' server CPU per delivery within the run ([`reference`]); with
//! `--reference-compression` and `--reference-delta` the two lanes may differ in those too,
//! and their bytes per delivery are compared as well.
//!
//! # Layout
//! - this file: [`BroadcastArgs`] and [`run`].
//! - `worker`: [`BroadcastWorker`], the subscribers of one worker process.
//! - `coordinator`: the run itself: workers, paced publications, bursts, `--search`, result.
//! - `reference`: `--reference`, two transports' cost per delivery compared.
//! - `document`: the point documents of `--doc-bytes`.
//! - `lane`: one channel's subscribers and what they ask for (compression, deltas), and the
//!   bytes they read per delivery.

mod coordinator;
mod document;
mod lane;
mod reference;
mod worker;

use anyhow::bail;

pub(crate) use worker::subscribe_reply;
pub use worker::{run_worker, BroadcastWorker};

use switchboard_client::Compression;

use crate::common::{CommonArgs, PaceArgs, WireFormat};
use crate::scenario::coordinator_runtime;
use crate::transport::Transport;

/// `switchboard bench broadcast`
#[derive(Debug, Clone, clap::Args)]
pub struct BroadcastArgs {
    /// Subscribers (the starting point with --search).
    #[arg(long, default_value_t = 1000)]
    pub subs: usize,
    /// Seconds between publications; a burst must reach every subscriber within it.
    #[arg(long, default_value_t = 1.0)]
    pub period: f64,
    /// Publications [default: 10, or --duration / --period].
    #[arg(long)]
    pub bursts: Option<u64>,
    /// Channel to use.
    #[arg(long, default_value = "bench:broadcast")]
    pub channel: String,
    /// Wire format of the subscribers.
    #[arg(long, value_enum, default_value = "json")]
    pub format: WireFormat,
    /// How the subscribers connect: WebSocket, SSE or long-polling (the HTTP transports
    /// subscribe through a poll session; JSON only).
    #[arg(long, value_enum, default_value = "ws")]
    pub transport: Transport,
    /// Double --subs until a burst misses its period, then bisect between the last passing and
    /// the first failing count; report the largest that passed.
    #[arg(long)]
    pub search: bool,
    /// Upper bound for --search (tried itself when doubling would pass it).
    #[arg(long, default_value_t = 64_000)]
    pub search_max: usize,
    /// Bisection steps after the first failure (each is a full run of --bursts).
    #[arg(long, default_value_t = 3)]
    pub search_refine: usize,
    /// Handshakes in flight per worker process.
    #[arg(long, default_value_t = 200)]
    pub concurrency: usize,
    /// Token for the handshakes and the HTTP API (`Authorization: Bearer`).
    #[arg(long)]
    pub token: Option<String>,
    /// More nodes of the same cluster (repeatable): worker process i subscribes through the
    /// i-th of --target and these, round robin; publications still go to --api.
    #[arg(long = "also-target", value_name = "URL")]
    pub also_targets: Vec<String>,
    /// Also subscribe as many clients over this transport to a second channel and publish to
    /// both each period, half a period apart: the server's CPU time from each publish to its
    /// last delivery gives both transports' cost per delivery in the same run (`reference`
    /// module). `server_cpu_us_per_delivery` is then --transport's from those windows, and
    /// `extra.reference` holds the reference's and the ratio. Needs --server-pid.
    #[arg(long, value_enum, value_name = "TRANSPORT")]
    pub reference: Option<Transport>,
    /// With --reference: the run fails when a delivery costs more than this many times a
    /// reference delivery (the median over the periods of the two windows' ratio).
    #[arg(long, requires = "reference")]
    pub max_ratio: Option<f64>,
    /// Subscribers offer permessage-deflate (WebSocket): the bytes their sockets read per
    /// delivery are reported either way (`wire_bytes_per_delivery`).
    #[arg(long, value_enum, default_value = "off")]
    pub compression: Compression,
    /// Subscribers subscribe with `delta: "fossil"` and rebuild every publication from the
    /// node's text or delta (WebSocket).
    #[arg(long, value_name = "FORMAT", value_parser = ["fossil"])]
    pub delta: Option<String>,
    /// The reference subscribers' --compression (so that one run compares a compressed
    /// delivery with a plain one).
    #[arg(long, value_enum, default_value = "off", requires = "reference")]
    pub reference_compression: Compression,
    /// The reference subscribers' --delta.
    #[arg(long, value_name = "FORMAT", value_parser = ["fossil"], requires = "reference")]
    pub reference_delta: Option<String>,
    /// With --reference: the run fails when a delivery reads more than this many times a
    /// reference delivery's bytes.
    #[arg(long, requires = "reference")]
    pub max_bytes_ratio: Option<f64>,
    /// Publish point documents of about this many bytes of JSON instead of the bare stamp: a
    /// plant point's fields and its neighbours' last values, of which only the value (beside
    /// the stamp) changes from one publication to the next.
    #[arg(long, default_value_t = 0)]
    pub doc_bytes: usize,
    #[command(flatten)]
    pub pace: PaceArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl BroadcastArgs {
    fn bursts(&self) -> u64 {
        self.bursts.unwrap_or_else(|| match self.common.duration {
            Some(d) => (d / self.period).ceil().max(1.0) as u64,
            None => 10,
        })
    }
}

pub fn run(args: BroadcastArgs) -> anyhow::Result<i32> {
    if args.subs == 0 || args.period <= 0.0 || args.bursts() == 0 {
        bail!("--subs, --period and --bursts must be positive");
    }
    args.transport.check_format(args.format.format())?;
    for (transport, compression, delta, flag) in [
        (args.transport, args.compression, &args.delta, ""),
        (args.reference.unwrap_or_default(), args.reference_compression, &args.reference_delta, "reference-"),
    ] {
        if transport != Transport::Ws && (compression != Compression::Off || delta.is_some()) {
            bail!("--{flag}compression and --{flag}delta are for WebSocket subscribers (--transport ws)");
        }
    }
    if let Some(r) = args.reference {
        r.check_format(args.format.format())?;
        if args.common.server_pid.is_none() || !args.also_targets.is_empty() {
            bail!("--reference measures one server: it needs --server-pid and no --also-target");
        }
    }
    coordinator_runtime()?.block_on(coordinator::coordinate(args))
}
