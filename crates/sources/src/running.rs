//! [`Sources`]: the running set. Each configured source has a supervisor task that stands by
//! until this node holds the source's lease (`source:<name>` through the broker), runs the
//! source while it holds it, and stops it when the lease is lost or the node stops.
//!
//! Why a lease and not a lock: a node that dies cannot unlock. The holder renews every third
//! of the ttl; when it cannot renew for two thirds of the ttl it stops the source itself, so
//! it has stopped before the lease expires and another node takes it (within a ttl of the
//! last renewal, plus the standby poll of a third of it). A node that stops cleanly releases
//! the lease, so the next holder starts at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use switchboard_broker::{Broker, Data};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::{Sink, SourceConfig, SourceCtx, SourceHandle, SourceStats, Write, WriteError};

/// How long a write waits for its source to take it and to answer (the source's own device
/// timeout is shorter).
pub const WRITE_WAIT: Duration = Duration::from_secs(10);
/// How long a stopping source has to finish before its task is aborted.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// Writes queued for one source.
const WRITE_QUEUE: usize = 64;

/// Which node runs each source: leases `source:<name>` held by `holder` through `broker`.
#[derive(Clone)]
pub struct Lease {
    pub broker: Arc<dyn Broker>,
    /// This node's id.
    pub holder: String,
    pub ttl: Duration,
}

/// One configured source as the running set keeps it.
struct Entry {
    handle: SourceHandle,
    /// Where writes go while the source runs on this node. A std mutex: held only to clone
    /// or swap the sender, never across an await.
    writes: Arc<Mutex<Option<mpsc::Sender<Write>>>>,
    /// True while writes go to the source (see [`Sources::watch_active`]).
    active: watch::Receiver<bool>,
}

/// The sources of a node.
pub struct Sources {
    entries: Vec<Entry>,
}

impl Sources {
    /// Starts one supervisor per source; they stop when `stop` turns true.
    pub fn start(
        configs: Vec<SourceConfig>,
        sink: Arc<dyn Sink>,
        lease: Lease,
        stop: watch::Receiver<bool>,
    ) -> Sources {
        let entries = configs
            .into_iter()
            .map(|cfg| {
                let handle = SourceHandle {
                    name: cfg.name().to_string(),
                    kind: cfg.kind(),
                    stats: Arc::new(SourceStats::default()),
                };
                let writes = Arc::new(Mutex::new(None));
                let (active_tx, active) = watch::channel(false);
                let supervisor = Supervisor {
                    cfg,
                    sink: sink.clone(),
                    stats: handle.stats.clone(),
                    writes: writes.clone(),
                    active: active_tx,
                    lease: lease.clone(),
                };
                switchboard_supervisor::register("source");
                tokio::spawn(supervisor.run(stop.clone()));
                Entry { handle, writes, active }
            })
            .collect();
        Sources { entries }
    }

    /// The sources and their counters, for metrics.
    pub fn handles(&self) -> Vec<SourceHandle> {
        self.entries.iter().map(|e| e.handle.clone()).collect()
    }

    /// Whether writes to `source` are taken on this node, and each change of it: true from
    /// the moment this node runs the source (holds its lease) until it stops it; false for an
    /// unknown source. The gateway listens for forwarded writes meanwhile.
    pub fn watch_active(&self, source: &str) -> watch::Receiver<bool> {
        match self.entries.iter().find(|e| e.handle.name == source) {
            Some(e) => e.active.clone(),
            None => watch::channel(false).1,
        }
    }

    /// Sends a write to `source` and waits for the device's answer. `NotHere` when the source
    /// does not run on this node (another node of the cluster holds its lease, or it is
    /// starting); `Unavailable` when it is not connected or does not answer within
    /// [`WRITE_WAIT`].
    pub async fn write(&self, source: &str, channel: &str, data: Data) -> Result<(), WriteError> {
        let entry = self
            .entries
            .iter()
            .find(|e| e.handle.name == source)
            .ok_or_else(|| WriteError::Unavailable(format!("no source named {source}")))?;
        let tx = entry.writes.lock().map(|w| w.clone()).unwrap_or(None).ok_or_else(|| {
            WriteError::NotHere(format!(
                "source {source} does not run on this node (another node of the cluster holds its lease, or it is \
                 starting)"
            ))
        })?;
        let (reply, answer) = oneshot::channel();
        let write = Write { channel: channel.to_string(), data, reply };
        let deadline = Instant::now() + WRITE_WAIT;
        match tokio::time::timeout_at(deadline, tx.send(write)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(WriteError::Unavailable(format!("source {source} stopped"))),
            Err(_) => return Err(WriteError::Unavailable(format!("source {source} is busy"))),
        }
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(WriteError::Unavailable(format!("source {source} stopped before answering"))),
            Err(_) => Err(WriteError::Unavailable(format!("source {source} did not answer in time"))),
        }
    }
}

struct Supervisor {
    cfg: SourceConfig,
    sink: Arc<dyn Sink>,
    stats: Arc<SourceStats>,
    writes: Arc<Mutex<Option<mpsc::Sender<Write>>>>,
    active: watch::Sender<bool>,
    lease: Lease,
}

impl Supervisor {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        use std::sync::atomic::Ordering::Relaxed;
        let name = self.cfg.name().to_string();
        let key = format!("source:{name}");
        let (ttl, holder) = (self.lease.ttl, self.lease.holder.as_str());
        let period = ttl / 3;
        loop {
            // Stand by until this node holds the lease.
            loop {
                if *stop.borrow() {
                    return;
                }
                match self.lease.broker.lease(&key, holder, ttl).await {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => tracing::debug!(source = %name, "source lease not reachable: {e}"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(period) => {}
                    _ = stop.changed() => {}
                }
            }
            let mut renewed = Instant::now();
            self.stats.active.store(true, Relaxed);
            tracing::info!(source = %name, "source runs on this node");
            let (run_stop, run_stopped) = watch::channel(false);
            let (wtx, wrx) = mpsc::channel(WRITE_QUEUE);
            if let Ok(mut w) = self.writes.lock() {
                *w = Some(wtx);
            }
            // `send_replace`: the value changes even while nobody watches.
            self.active.send_replace(true);
            let ctx = SourceCtx {
                name: name.clone(),
                sink: self.sink.clone(),
                stats: self.stats.clone(),
                writes: wrx,
                stop: run_stopped,
            };
            let mut task = tokio::spawn(self.cfg.clone().run(ctx));
            let mut tick = tokio::time::interval_at(Instant::now() + period, period);
            let node_stops = loop {
                tokio::select! {
                    _ = tick.tick() => match self.lease.broker.lease(&key, holder, ttl).await {
                        Ok(true) => renewed = Instant::now(),
                        Ok(false) => {
                            tracing::warn!(source = %name, "source lease taken by another node; standing by");
                            break false;
                        }
                        Err(e) if renewed.elapsed() >= ttl * 2 / 3 => {
                            tracing::warn!(source = %name, "source lease not renewed in time ({e}); standing by");
                            break false;
                        }
                        Err(_) => {}
                    },
                    _ = stop.changed() => break true,
                    ended = &mut task => {
                        match ended {
                            // Counted and logged as a supervised task's restart: the loop starts the
                            // source again (a new connection, its state rebuilt from the device).
                            Err(e) if e.is_panic() => {
                                let panic = e.into_panic();
                                switchboard_supervisor::restarted("source", switchboard_supervisor::message(panic.as_ref()));
                            }
                            _ => tracing::warn!(source = %name, "source ended by itself; retrying after a pause"),
                        }
                        tokio::time::sleep(period).await;
                        break false;
                    }
                }
            };
            if let Ok(mut w) = self.writes.lock() {
                *w = None;
            }
            self.active.send_replace(false);
            let _ = run_stop.send(true);
            if !task.is_finished() && tokio::time::timeout(STOP_WAIT, &mut task).await.is_err() {
                task.abort();
            }
            self.stats.active.store(false, Relaxed);
            self.stats.connected.store(false, Relaxed);
            if node_stops {
                let _ = self.lease.broker.lease_release(&key, holder).await;
                return;
            }
        }
    }
}
