//! Trend reads for clients: `GET /api/channels/{ch}/trend?window_s=&step_s=` and the `trend`
//! option of subscribe. The buckets come from the broker (`switchboard_broker::trend`), read
//! from the finest of the namespace's tiers that reaches back over the window, at its step,
//! and merged into wider ones when a coarser step is asked for.

use serde::Serialize;
use switchboard_broker::{now_ms, TrendBucket};
use switchboard_protocol::code;

use crate::node::{ApiError, Node};

/// What a trend read answers: `{"step_s", "buckets": [{"t", "min", "max", "last", "n"}]}`.
#[derive(Debug, Clone, Serialize)]
pub struct TrendReply {
    pub step_s: u64,
    pub buckets: Vec<TrendBucket>,
}

/// Reads `channel`'s trend over the last `window_s` seconds in buckets of `step_s` (default
/// and minimum: the step of the tier read; rounded up to a multiple of it otherwise). 400 naming the field for a
/// bad value, 404 when the channel's namespace keeps no trend.
pub async fn read(node: &Node, channel: &str, window_s: u64, step_s: Option<u64>) -> Result<TrendReply, ApiError> {
    let bad = |m: String| ApiError::new(code::BAD_REQUEST, m);
    let Some(tiers) = node.config.history_policy(channel).trend else {
        return Err(ApiError::new(
            code::NOT_FOUND,
            format!("{channel} keeps no trend (its namespace's trend_window_s is 0)"),
        ));
    };
    let option = switchboard_protocol::command::TrendOption { window_s, step_s };
    switchboard_protocol::bounds::trend(option).map_err(crate::sampling::bad_number)?;
    // The finest tier that reaches back over the window (the coarsest when none does).
    let policy = tiers.covering(window_s.saturating_mul(1000));
    let stored = (policy.step_ms / 1000).max(1);
    // A step between multiples of the stored one is rounded up to the next (the reply says
    // which): a client need not know the namespace's step to ask for about N buckets.
    let step_s = match step_s {
        None => stored,
        Some(s) => s.div_ceil(stored).saturating_mul(stored),
    };
    if step_s > window_s {
        return Err(bad(format!("step_s: {step_s} (a multiple of the stored step, {stored} s) exceeds window_s")));
    }
    let now = now_ms();
    let step_ms = step_s * 1000;
    // Whole buckets of the asked step, the current one included.
    let since = (now - now % step_ms).saturating_sub((window_s.div_ceil(step_s) - 1) * step_ms);
    let raw = node.broker.trend(channel, policy, since).await.map_err(|e| node.broker_error(e))?;
    let buckets = if step_s == stored { raw } else { switchboard_broker::trend::resample(raw, since, step_ms) };
    Ok(TrendReply { step_s, buckets })
}
