//! What the broker's integration tests share.

use std::time::{Duration, Instant};

/// Waits until `cond` holds, looking every 20 ms; panics naming `what` after `limit`.
pub async fn until(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
