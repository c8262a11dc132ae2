//! Failure stays where it starts: supervised long-lived tasks, panic isolation for the work
//! done for one client or one device, and the failpoints that prove both.
//!
//! # Layout
//! - this file: [`spawn`], a supervised task — a panic is caught, logged at error with the
//!   task's name, counted in [`restarts`], and the task is started again after a backoff;
//!   [`catch`] and [`isolate`], one-shot isolation of a future or a closure (a panic becomes an
//!   `Err` the caller turns into a clean close, counted in [`panics`]).
//! - `fault`: named failpoints ([`fault::hit`]), compiled in only with the `failpoints`
//!   feature, which only test builds enable; [`fault::configure`] sets them at run time.
//!
//! # Contract
//! A supervised task is restarted only after a panic: returning ends it (its owner stopped it).
//! Restarting is not resuming: a task that owns state must rebuild it when it starts again, and
//! tell those who lost something the usual way (a link task marks its channels for recovery, so
//! their subscribers get 4008 and recover). The counters are process-wide (one node per
//! process; tests that run several nodes in one process share them).

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use parking_lot::Mutex;
use tokio::time::Instant;

pub mod fault;

/// First pause before a restart; doubled after each panic that came soon after a start.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A run that lasted this long was healthy: the next panic restarts after [`BACKOFF_MIN`].
const STABLE_AFTER: Duration = Duration::from_secs(30);

/// Restarts and panics by task name. A `Mutex` over a small map: touched once per spawn and
/// once per panic, never on a delivery path.
static RESTARTS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());
static PANICS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// Restarts of supervised tasks by name; every task spawned so far is listed (0 when it never
/// restarted).
pub fn restarts() -> Vec<(&'static str, u64)> {
    RESTARTS.lock().iter().map(|(k, v)| (*k, *v)).collect()
}

/// Panics caught by [`catch`] and [`isolate`] by site (a client's session, one subscriber's
/// delivery): each one closed what it belonged to and nothing else.
pub fn panics() -> Vec<(&'static str, u64)> {
    PANICS.lock().iter().map(|(k, v)| (*k, *v)).collect()
}

/// The text of a panic's payload (`panic!` with a message gives a `&str` or a `String`).
pub fn message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("panic without a message")
}

/// Logs every panic as one error line (`tracing`, with the panic's location) instead of the
/// standard report. Panics are caught and the node goes on, so the standard report — with a
/// backtrace resolved on the panicking thread when `RUST_BACKTRACE` is set, which can take
/// seconds — would stall the worker that caught it. With `RUST_BACKTRACE` set to anything but
/// `0`, the standard report (and its backtrace) is kept for debugging.
pub fn log_panics() {
    if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
        return;
    }
    std::panic::set_hook(Box::new(|info| {
        let location = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        tracing::error!(location, panic = message(info.payload()), "panic");
    }));
}

/// Which start of a supervised task this is: 0 the first, then 1, 2, … after each panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start(pub u64);

impl Start {
    /// Started again after a panic: the task must rebuild what it owned.
    pub fn is_restart(self) -> bool {
        self.0 > 0
    }
}

/// Runs `run(start)` under a supervisor on the current Tokio runtime. When the future it returns
/// panics, the panic is logged at error with `task`, counted in [`restarts`], and `run` is
/// called again after a backoff (100 ms doubling to 10 s; back to 100 ms after a run of 30 s).
/// When it returns, the supervisor ends.
pub fn spawn<F, Fut>(task: &'static str, run: F) -> tokio::task::JoinHandle<()>
where
    F: FnMut(Start) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(supervise(task, run))
}

/// The supervisor loop of [`spawn`], for callers that run it in a task of their own.
pub async fn supervise<F, Fut>(task: &'static str, mut run: F)
where
    F: FnMut(Start) -> Fut,
    Fut: Future<Output = ()>,
{
    RESTARTS.lock().entry(task).or_insert(0);
    let mut backoff = BACKOFF_MIN;
    let mut start = 0;
    loop {
        let began = Instant::now();
        match AssertUnwindSafe(run(Start(start))).catch_unwind().await {
            Ok(()) => return,
            Err(payload) => {
                if began.elapsed() >= STABLE_AFTER {
                    backoff = BACKOFF_MIN;
                }
                *RESTARTS.lock().entry(task).or_insert(0) += 1;
                tracing::error!(
                    task,
                    panic = message(payload.as_ref()),
                    restart_in_ms = backoff.as_millis() as u64,
                    "supervised task panicked; restarting"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                start += 1;
            }
        }
    }
}

/// Counts a restart of `task` after a panic that its owner caught itself (a task it awaits
/// through a `JoinHandle`, restarted by its own loop), and logs it like [`spawn`] does.
pub fn restarted(task: &'static str, panic: &str) {
    *RESTARTS.lock().entry(task).or_insert(0) += 1;
    tracing::error!(task, panic, "supervised task panicked; restarting");
}

/// Lists `task` among the supervised tasks (with no restart yet), for a task whose owner
/// supervises it (see [`restarted`]).
pub fn register(task: &'static str) {
    RESTARTS.lock().entry(task).or_insert(0);
}

/// A caught panic: where it happened and what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Panicked {
    pub site: &'static str,
    pub message: String,
}

impl std::fmt::Display for Panicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "internal error in {}: {}", self.site, self.message)
    }
}

fn caught(site: &'static str, payload: &(dyn Any + Send)) -> Panicked {
    *PANICS.lock().entry(site).or_insert(0) += 1;
    let message = message(payload).to_string();
    tracing::error!(site, panic = %message, "panic isolated");
    Panicked { site, message }
}

/// Awaits `fut`; a panic inside it becomes `Err`, logged and counted under `site`. For work done
/// on behalf of one client (its commands), so a panic closes that client only.
///
/// A plain function returning the wrapped future: an `async fn` would keep `fut` twice in its
/// state (the argument and the future it awaits), doubling what a connection's task holds.
pub fn catch<T>(site: &'static str, fut: impl Future<Output = T>) -> impl Future<Output = Result<T, Panicked>> {
    AssertUnwindSafe(fut).catch_unwind().map(move |r| r.map_err(|p| caught(site, p.as_ref())))
}

/// Runs `f`; a panic inside it becomes `Err`, logged and counted under `site`. For the part of a
/// fan-out that belongs to one subscriber, so the publisher and the other subscribers go on.
/// Costs nothing until something panics.
pub fn isolate<T>(site: &'static str, f: impl FnOnce() -> T) -> Result<T, Panicked> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| caught(site, p.as_ref()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;

    fn count(list: Vec<(&'static str, u64)>, name: &str) -> u64 {
        list.into_iter().find(|(k, _)| *k == name).map_or(0, |(_, v)| v)
    }

    #[tokio::test(start_paused = true)]
    async fn supervisor_restarts_a_panicking_task_with_backoff_until_it_returns() {
        let runs = Arc::new(AtomicU64::new(0));
        let seen = runs.clone();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let record = starts.clone();
        let task = spawn("test-restarts", move |start| {
            let runs = seen.clone();
            let record = record.clone();
            async move {
                record.lock().push((start, Instant::now()));
                if runs.fetch_add(1, Relaxed) < 3 {
                    panic!("injected");
                }
            }
        });
        task.await.unwrap();
        assert_eq!(runs.load(Relaxed), 4);
        assert_eq!(count(restarts(), "test-restarts"), 3);
        let starts = starts.lock();
        assert_eq!(starts.iter().map(|(s, _)| s.0).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert!(!starts[0].0.is_restart() && starts[1].0.is_restart());
        // 100 ms, then 200 ms, then 400 ms between the starts.
        let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1].1 - w[0].1).collect();
        assert_eq!(gaps, vec![Duration::from_millis(100), Duration::from_millis(200), Duration::from_millis(400)]);
    }

    #[tokio::test]
    async fn supervisor_catch_and_isolate_turn_a_panic_into_an_error() {
        let before = count(panics(), "test-site");
        let e = catch("test-site", async { panic!("boom {}", 1) }).await.unwrap_err();
        assert_eq!(e.message, "boom 1");
        assert_eq!(catch("test-site", async { 5 }).await.unwrap(), 5);
        let e = isolate("test-site", || -> u8 { panic!("static text") }).unwrap_err();
        assert_eq!(e.to_string(), "internal error in test-site: static text");
        assert_eq!(isolate("test-site", || 7).unwrap(), 7);
        assert_eq!(count(panics(), "test-site"), before + 2);
    }
}
