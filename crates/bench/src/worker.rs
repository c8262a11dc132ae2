//! Worker processes: how load is spread, and how results come back.
//!
//! The coordinator starts `current_exe() bench worker <json config>` once per share of the
//! connections ([`Pool::spawn`]). A worker runs one single-threaded Tokio runtime (it shares
//! the machine's cores with the server under test, so it must not spin up a thread per core)
//! and talks to the coordinator over its standard streams:
//!
//! - stdout, one JSON object per line ([`WorkerMsg`]): `{"ready": ...}` once every connection
//!   is established or has failed, `{"progress": ...}` every second (and at once when the
//!   worker has received everything it expects), and a last `{"final": ...}` carrying its
//!   counters and its HDR histograms (base64 of the V2 serialization).
//! - stdin, one word per line: `stop` ends the measurement. End of file means the coordinator
//!   is gone and stops the worker too.
//!
//! The coordinator adds the histograms exactly ([`crate::histogram::Latency::merge`]).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::process::Stdio;
use std::rc::Rc;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::accounting::Tally;
use crate::histogram::Latency;
use crate::progress::Progress;

/// The environment variable carrying the auth token from the coordinator to its workers.
pub const TOKEN_ENV: &str = "SWITCHBOARD_BENCH_TOKEN";

/// The token the coordinator passed, if any.
pub fn token() -> Option<String> {
    std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty())
}

/// Distinct failure reasons a worker counts ([`WorkerCtx::failed_for`]).
pub const MAX_REASONS: usize = 16;

/// A running worker's counters, as reported in progress lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub established: u64,
    pub failed: u64,
    pub dropped: u64,
    pub sent: u64,
    pub received: u64,
    pub duplicated: u64,
    pub bytes: u64,
}

impl From<&Tally> for Snapshot {
    /// Progress lines count deliveries of unknown offsets as duplicates.
    fn from(t: &Tally) -> Snapshot {
        Snapshot {
            established: t.established,
            failed: t.failed,
            dropped: t.dropped,
            sent: t.sent,
            received: t.received,
            duplicated: t.duplicated + t.unexpected,
            bytes: t.bytes,
        }
    }
}

impl Snapshot {
    pub fn add(&mut self, o: &Snapshot) {
        self.established += o.established;
        self.failed += o.failed;
        self.dropped += o.dropped;
        self.sent += o.sent;
        self.received += o.received;
        self.duplicated += o.duplicated;
        self.bytes += o.bytes;
    }
}

/// A worker's last word.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FinalReport {
    pub tally: Tally,
    /// Delivery latency (or RTT) histogram, µs, base64 HdrHistogram V2.
    pub latency: String,
    /// Connect + handshake time histogram, µs, base64 HdrHistogram V2.
    pub connect: String,
    /// Peak resident memory of the worker process.
    #[serde(default)]
    pub rss_peak_bytes: u64,
}

/// One line from a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerMsg {
    Ready(Snapshot),
    Progress(Snapshot),
    Final(Box<FinalReport>),
}

// ---------------------------------------------------------------------------------------------
// Worker side.

/// State shared by the tasks of one worker process.
///
/// Everything runs on one thread (a `LocalSet`), so plain `Cell`/`RefCell` replace atomics and
/// locks on the per-delivery path.
pub struct WorkerCtx {
    pub tally: RefCell<Tally>,
    pub latency: RefCell<Latency>,
    pub connect: RefCell<Latency>,
    /// Connections this worker opens; `ready` is sent when all are settled.
    target: u64,
    ready_sent: Cell<bool>,
    /// Deliveries this worker expects in total (0: unknown); reaching it triggers a progress
    /// line at once, so the coordinator need not wait for the next tick.
    expected: Cell<u64>,
    stop_tx: watch::Sender<bool>,
}

impl WorkerCtx {
    pub(crate) fn new(target: u64) -> Rc<WorkerCtx> {
        let (stop_tx, _) = watch::channel(false);
        Rc::new(WorkerCtx {
            tally: RefCell::default(),
            latency: RefCell::default(),
            connect: RefCell::default(),
            target,
            ready_sent: Cell::new(false),
            expected: Cell::new(0),
            stop_tx,
        })
    }

    /// Writes one message line to stdout.
    pub fn emit(&self, msg: &WorkerMsg) {
        use std::io::Write;
        let Ok(line) = serde_json::to_string(msg) else { return };
        let mut out = std::io::stdout().lock();
        // If the coordinator is gone there is nobody to tell.
        let _ = writeln!(out, "{line}").and_then(|_| out.flush());
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot::from(&*self.tally.borrow())
    }

    /// One connection is up, after `connect_us` of connect + handshake (+ subscribe).
    pub fn established(&self, connect_us: u64) {
        self.tally.borrow_mut().established += 1;
        self.connect.borrow_mut().record(connect_us);
        self.check_ready();
    }

    /// One connection could not be established.
    pub fn failed(&self, why: &str) {
        {
            let mut t = self.tally.borrow_mut();
            t.failed += 1;
            t.note_error(why);
        }
        self.check_ready();
    }

    /// One connection could not be established, counted under `reason` in
    /// [`Tally::failure_reasons`] (the first [`MAX_REASONS`] distinct reasons; later ones under
    /// "other") as well as in the errors.
    pub fn failed_for(&self, reason: &str) {
        {
            let mut t = self.tally.borrow_mut();
            let known = t.failure_reasons.contains_key(reason);
            let key = if known || t.failure_reasons.len() < MAX_REASONS { reason.to_string() } else { "other".into() };
            *t.failure_reasons.entry(key).or_default() += 1;
        }
        self.failed(reason);
    }

    /// An established connection ended early.
    pub fn dropped(&self, why: &str) {
        if self.stopping() {
            return;
        }
        let mut t = self.tally.borrow_mut();
        t.dropped += 1;
        t.note_error(why);
    }

    fn check_ready(&self) {
        let t = self.snapshot();
        if !self.ready_sent.get() && t.established + t.failed >= self.target {
            self.ready_sent.set(true);
            self.emit(&WorkerMsg::Ready(t));
        }
    }

    /// Sets the number of deliveries that completes this worker's share.
    pub fn expect(&self, n: u64) {
        self.expected.set(n);
    }

    /// Call after counting deliveries: reports at once when everything expected is in.
    pub fn check_complete(&self) {
        let e = self.expected.get();
        if e > 0 && self.tally.borrow().received == e {
            self.report_now();
        }
    }

    /// Sends this worker's progress at once rather than with the next second's line (a
    /// coordinator timing a step by when it is complete).
    pub fn report_now(&self) {
        self.emit(&WorkerMsg::Progress(self.snapshot()));
    }

    pub fn stopping(&self) -> bool {
        *self.stop_tx.borrow()
    }

    /// Resolves once the coordinator said `stop` (or went away).
    pub async fn wait_stop(&self) {
        let mut rx = self.stop_tx.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    pub fn stop(&self) {
        self.stop_tx.send_replace(true);
    }

    fn final_report(&self) -> FinalReport {
        FinalReport {
            tally: self.tally.borrow().clone(),
            latency: self.latency.borrow().to_base64(),
            connect: self.connect.borrow().to_base64(),
            rss_peak_bytes: crate::probe::ProcessProbe::new(std::process::id()).memory().map(|m| m.hwm).unwrap_or(0),
        }
    }
}

/// Runs the body of one worker process: `conns` connections to settle before `ready`, and
/// `body` (a scenario's worker half) on a single-threaded runtime beside the stdin watcher
/// and the progress ticker. Sends the final report once `body` returns. Which scenario runs
/// is decided above this engine, by `scenario::worker_main`: scenarios use the worker
/// machinery, never the other way round.
pub fn serve<F, Fut>(conns: usize, body: F) -> anyhow::Result<i32>
where
    F: FnOnce(Rc<WorkerCtx>) -> Fut,
    Fut: Future<Output = ()>,
{
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let ctx = WorkerCtx::new(conns as u64);
        if conns == 0 {
            ctx.check_ready();
        }
        tokio::task::spawn_local(watch_stdin(ctx.clone()));
        tokio::task::spawn_local(tick(ctx.clone()));
        body(ctx.clone()).await;
        ctx.stop();
        ctx.emit(&WorkerMsg::Final(Box::new(ctx.final_report())));
    });
    // Connection tasks still parked in the runtime are dropped here, closing their sockets.
    drop(rt);
    Ok(0)
}

async fn watch_stdin(ctx: Rc<WorkerCtx>) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(l)) if l.trim() == "stop" => break,
            Ok(Some(_)) => continue,
            // End of file or an error: the coordinator is gone.
            _ => break,
        }
    }
    ctx.stop();
}

async fn tick(ctx: Rc<WorkerCtx>) {
    let mut iv = tokio::time::interval(Duration::from_secs(1));
    iv.tick().await;
    loop {
        iv.tick().await;
        if ctx.stopping() {
            return;
        }
        ctx.emit(&WorkerMsg::Progress(ctx.snapshot()));
    }
}

// ---------------------------------------------------------------------------------------------
// Coordinator side.

/// What the coordinator knows about one worker.
#[derive(Debug, Default)]
pub struct WorkerState {
    pub snapshot: Snapshot,
    pub ready: bool,
    pub final_report: Option<FinalReport>,
    /// Set when its stdout ended; `final_report` is `None` if it died before reporting.
    pub ended: bool,
    pub garbage: Option<String>,
}

enum Incoming {
    Msg(WorkerMsg),
    Garbage(String),
    Eof,
}

/// The worker processes of one run.
pub struct Pool {
    children: Vec<Child>,
    stdins: Vec<Option<ChildStdin>>,
    /// Kept for workers added later ([`Pool::add`]); the end of the messages is therefore
    /// known from every worker having ended, not from the channel closing.
    tx: mpsc::UnboundedSender<(usize, Incoming)>,
    rx: mpsc::UnboundedReceiver<(usize, Incoming)>,
    pub workers: Vec<WorkerState>,
    /// When the next progress line is due; kept across [`Pool::run_until`] calls so that
    /// short waits (one per publication) still show a line a second.
    next_progress: Instant,
}

/// Merged results of all workers.
#[derive(Debug, Default)]
pub struct Merged {
    pub tally: Tally,
    pub latency: Latency,
    pub connect: Latency,
    /// Workers that ended without a final report.
    pub missing: usize,
    /// Sum of the workers' peak resident memory.
    pub rss_peak_bytes: u64,
}

impl Pool {
    /// Starts one worker per config (the JSON argument of `bench worker`, a scenario's
    /// `WorkerConfig`). `token`, if any, reaches the workers through the environment
    /// ([`TOKEN_ENV`]), not the command line, which every user can read.
    pub fn spawn<C: Serialize>(configs: &[C], token: Option<&str>) -> anyhow::Result<Pool> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut pool = Pool {
            children: Vec::new(),
            stdins: Vec::new(),
            tx,
            rx,
            workers: Vec::new(),
            next_progress: Instant::now() + Duration::from_secs(1),
        };
        pool.add(configs, token)?;
        Ok(pool)
    }

    /// Starts more workers into a running pool (a phase that begins once the first workers
    /// are ready). They take the next indexes of [`Pool::workers`].
    pub fn add<C: Serialize>(&mut self, configs: &[C], token: Option<&str>) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("locating the bench executable")?;
        for cfg in configs {
            let i = self.workers.len();
            let json = serde_json::to_string(cfg)?;
            let mut cmd = Command::new(&exe);
            if let Some(t) = token {
                cmd.env(TOKEN_ENV, t);
            }
            let mut child = cmd
                .args(["bench", "worker", &json])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting worker {i} ({})", exe.display()))?;
            self.stdins.push(child.stdin.take());
            let stdout = child.stdout.take().context("worker stdout")?;
            let tx = self.tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let m = match serde_json::from_str::<WorkerMsg>(&line) {
                        Ok(m) => Incoming::Msg(m),
                        Err(_) => Incoming::Garbage(line),
                    };
                    if tx.send((i, m)).is_err() {
                        return;
                    }
                }
                let _ = tx.send((i, Incoming::Eof));
            });
            self.children.push(child);
            self.workers.push(WorkerState::default());
        }
        Ok(())
    }

    /// Sum of the latest progress of every worker.
    pub fn totals(&self) -> Snapshot {
        self.totals_of(0..self.workers.len())
    }

    /// Sum of the latest progress of the workers numbered `workers` (one role of several).
    pub fn totals_of(&self, workers: std::ops::Range<usize>) -> Snapshot {
        let mut s = Snapshot::default();
        for w in self.workers.get(workers).unwrap_or_default() {
            s.add(&w.snapshot);
        }
        s
    }

    /// Every worker has reported `ready` (or ended).
    pub fn all_ready(&self) -> bool {
        self.workers.iter().all(|w| w.ready || w.ended)
    }

    /// Every worker has ended.
    pub fn all_ended(&self) -> bool {
        self.workers.iter().all(|w| w.ended)
    }

    /// Workers that ended before sending their final report.
    pub fn crashed(&self) -> usize {
        self.workers.iter().filter(|w| w.ended && w.final_report.is_none()).count()
    }

    fn apply(&mut self, i: usize, m: Incoming) {
        let w = &mut self.workers[i];
        match m {
            Incoming::Msg(WorkerMsg::Ready(s)) => {
                w.ready = true;
                w.snapshot = s;
            }
            Incoming::Msg(WorkerMsg::Progress(s)) => w.snapshot = s,
            Incoming::Msg(WorkerMsg::Final(f)) => {
                w.snapshot = Snapshot::from(&f.tally);
                w.final_report = Some(*f);
            }
            Incoming::Garbage(line) => {
                if w.garbage.is_none() {
                    w.garbage = Some(line);
                }
            }
            Incoming::Eof => w.ended = true,
        }
    }

    /// Handles worker messages until `done` holds or `deadline` passes, calling `status` for a
    /// progress line once a second. Returns whether `done` held.
    pub async fn run_until(
        &mut self,
        deadline: Instant,
        progress: &mut Progress,
        mut status: impl FnMut(&Pool) -> String,
        done: impl Fn(&Pool) -> bool,
    ) -> bool {
        loop {
            if done(self) {
                return true;
            }
            // Every worker's output ended (its end of file is its reader's last message):
            // nothing more will arrive.
            if self.all_ended() {
                return false;
            }
            tokio::select! {
                m = self.rx.recv() => match m {
                    Some((i, m)) => self.apply(i, m),
                    None => return done(self),
                },
                _ = tokio::time::sleep_until(self.next_progress) => {
                    progress.update(&status(self));
                    self.next_progress = Instant::now() + Duration::from_secs(1);
                }
                _ = tokio::time::sleep_until(deadline) => return done(self),
            }
        }
    }

    /// The connection phase: waits until every worker has settled its `total` connections (or
    /// `deadline`), showing "`verb` n/total (f failed, r/s)". When not a single connection came
    /// up the run cannot measure anything: the workers are collected and the run fails with
    /// `nothing` and their errors.
    pub async fn establish(
        mut self,
        deadline: Instant,
        progress: &mut Progress,
        verb: &str,
        total: usize,
        nothing: &str,
    ) -> anyhow::Result<Pool> {
        let mut rate = crate::progress::Rate::default();
        let allowed = deadline.saturating_duration_since(Instant::now());
        self.run_until(
            deadline,
            progress,
            |p| {
                let t = p.totals();
                format!("{verb} {}/{total} ({} failed, {:.0}/s)", t.established, t.failed, rate.per_s(t.established))
            },
            Pool::all_ready,
        )
        .await;
        if self.totals().established == 0 {
            let merged = self.finish(Duration::from_secs(10), progress).await?;
            let errors = &merged.tally.errors;
            match errors.is_empty() {
                // Nothing failed: every attempt was still under way when the time was up.
                true => anyhow::bail!("{nothing}: none was done within {:.0} s", allowed.as_secs_f64()),
                false => anyhow::bail!("{nothing}: {}", errors.join("; ")),
            }
        }
        Ok(self)
    }

    /// Tells every worker to stop.
    pub async fn stop(&mut self) {
        for s in self.stdins.iter_mut() {
            if let Some(stdin) = s.as_mut() {
                let _ = stdin.write_all(b"stop\n").await;
                let _ = stdin.flush().await;
            }
        }
    }

    /// Stops the workers, collects their final reports (waiting up to `timeout`), reaps the
    /// processes and merges everything.
    pub async fn finish(self, timeout: Duration, progress: &mut Progress) -> anyhow::Result<Merged> {
        let mut groups = self.finish_groups(timeout, progress, |_| 0).await?;
        Ok(groups.pop().unwrap_or_default())
    }

    /// As [`Pool::finish`], merging the workers into separate results by `group_of(index)`
    /// (for runs whose workers play different roles). Returns one [`Merged`] per group number
    /// up to the largest used, at least one.
    pub async fn finish_groups(
        mut self,
        timeout: Duration,
        progress: &mut Progress,
        group_of: impl Fn(usize) -> usize,
    ) -> anyhow::Result<Vec<Merged>> {
        self.stop().await;
        let deadline = Instant::now() + timeout;
        self.run_until(deadline, progress, |_| "collecting worker reports".into(), |p| p.all_ended()).await;
        for c in self.children.iter_mut() {
            match tokio::time::timeout(Duration::from_secs(5), c.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    let _ = c.kill().await;
                }
            }
        }
        let n = (0..self.workers.len()).map(&group_of).max().unwrap_or(0) + 1;
        let mut groups: Vec<Merged> = (0..n).map(|_| Merged::default()).collect();
        for (i, w) in self.workers.iter().enumerate() {
            let m = &mut groups[group_of(i)];
            match &w.final_report {
                Some(f) => {
                    m.tally.merge(&f.tally);
                    m.latency.merge(&Latency::from_base64(&f.latency)?)?;
                    m.connect.merge(&Latency::from_base64(&f.connect)?)?;
                    m.rss_peak_bytes += f.rss_peak_bytes;
                }
                None => {
                    m.missing += 1;
                    if let Some(g) = &w.garbage {
                        m.tally.note_error(&format!("worker said: {}", g.chars().take(200).collect::<String>()));
                    }
                }
            }
        }
        Ok(groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_messages_round_trip_as_tagged_lines() {
        let mut lat = Latency::new();
        lat.record(42);
        let f = WorkerMsg::Final(Box::new(FinalReport {
            tally: Tally { established: 3, received: 9, ..Default::default() },
            latency: lat.to_base64(),
            connect: Latency::new().to_base64(),
            rss_peak_bytes: 0,
        }));
        let line = serde_json::to_string(&f).unwrap();
        assert!(line.starts_with("{\"final\":{"), "{line}");
        assert!(!line.contains('\n'));
        let WorkerMsg::Final(back) = serde_json::from_str(&line).unwrap() else { panic!() };
        assert_eq!(back.tally.received, 9);
        assert_eq!(Latency::from_base64(&back.latency).unwrap().count(), 1);
        let p = serde_json::to_string(&WorkerMsg::Progress(Snapshot { received: 5, ..Default::default() })).unwrap();
        assert!(p.starts_with("{\"progress\":{"), "{p}");
    }
}
