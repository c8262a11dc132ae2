//! [`PasswordPool`]: the threads that run Argon2 checks, with a bounded queue.
//!
//! Argon2 is slow on purpose (tens of milliseconds and megabytes per check). On the runtime's
//! blocking pool, whose queue has no bound, checks from many addresses (each within its own
//! `limits.password_checks_per_ip_per_s`) would queue without end and hold up everything else
//! that pool does — dashboard files, `tokio::fs`. Here they run on their own few threads; a
//! check that finds the queue full is refused at once (429 / 4029) instead of waiting.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use parking_lot::Mutex;

type Job = Box<dyn FnOnce() + Send>;

/// See the module docs. Its threads end when it is dropped.
pub struct PasswordPool {
    tx: SyncSender<Job>,
}

/// Threads checking passwords at once, and checks that may wait for them.
pub const THREADS: usize = 2;
pub const QUEUE: usize = 64;

impl PasswordPool {
    pub fn new(threads: usize, queue: usize) -> PasswordPool {
        let (tx, rx) = sync_channel::<Job>(queue);
        let rx: Arc<Mutex<Receiver<Job>>> = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new().name(format!("switchboard-password-{i}")).spawn(move || loop {
                // The lock is held only while waiting for the next job, never while running it.
                let job = rx.lock().recv();
                match job {
                    Ok(job) => job(),
                    Err(_) => return,
                }
            });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "password check thread not started");
            }
        }
        PasswordPool { tx }
    }

    /// Runs `f` on the pool; `None` when the queue is full (or the pool is gone).
    pub async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (done, result) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = done.send(f());
        });
        match self.tx.try_send(job) {
            Ok(()) => result.await.ok(),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn auth_password_pool_refuses_past_its_queue() {
        let pool = Arc::new(PasswordPool::new(1, 1));
        let slow = || {
            std::thread::sleep(std::time::Duration::from_millis(400));
            true
        };
        // One running, one waiting: a third is refused at once, not queued.
        let running = tokio::spawn({
            let pool = pool.clone();
            async move { pool.run(slow).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let waiting = tokio::spawn({
            let pool = pool.clone();
            async move { pool.run(slow).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(pool.run(|| true).await, None);
        assert_eq!(running.await.unwrap(), Some(true));
        assert_eq!(waiting.await.unwrap(), Some(true));
        assert_eq!(pool.run(|| 7).await, Some(7));
    }
}
