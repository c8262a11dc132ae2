//! Trend reads for clients: `GET /api/channels/{ch}/trend?window_s=&step_s=` and the `trend`
//! option of subscribe. The buckets come from the broker (`switchboard_broker::trend`), read
//! from the finest of the namespace's tiers that reaches back over the window, at its step,
//! and merged into wider ones when a coarser step is asked for. Every reply names the tiers the
//! namespace keeps, so a client knows which windows it can offer and where finer buckets are.

use serde::Serialize;
use switchboard_broker::{now_ms, TrendBucket};
use switchboard_protocol::code;

use crate::node::{ApiError, Node};

/// What a trend read answers: `{"step_s", "buckets": [{"t", "min", "max", "last", "n"}],
/// "tiers": [{"step_s", "window_s"}]}` (the namespace's tiers, finest first).
#[derive(Debug, Clone, Serialize)]
pub struct TrendReply {
    pub step_s: u64,
    pub buckets: Vec<TrendBucket>,
    pub tiers: Vec<TierInfo>,
}

/// One tier a namespace keeps: buckets of `step_s` reaching back `window_s`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TierInfo {
    pub step_s: u64,
    pub window_s: u64,
}

/// Reads `channel`'s trend over the `window_s` seconds before `until_ms` (unix ms; now when
/// `None`) in buckets of `step_s` (default and minimum: the step of the tier read; rounded up
/// to a multiple of it otherwise). The tier read is the finest that reaches back to the
/// window's start, so a past range (a zoom) gets finer buckets than the whole window would.
/// 400 naming the field for a bad value, 404 when the channel's namespace keeps no trend.
pub async fn read(
    node: &Node,
    channel: &str,
    window_s: u64,
    step_s: Option<u64>,
    until_ms: Option<u64>,
) -> Result<TrendReply, ApiError> {
    let bad = |m: String| ApiError::new(code::BAD_REQUEST, m);
    let Some(tiers) = node.config.history_policy(channel).trend else {
        return Err(ApiError::new(
            code::NOT_FOUND,
            format!("{channel} keeps no trend (its namespace's trend_window_s is 0)"),
        ));
    };
    let option = switchboard_protocol::command::TrendOption { window_s, step_s };
    switchboard_protocol::bounds::trend(option).map_err(crate::sampling::bad_number)?;
    let now = now_ms();
    // A window ending after now (a client's clock ahead of the node's) ends now.
    let until = match until_ms {
        Some(u) if u < window_s.saturating_mul(1000) => {
            return Err(bad(format!("until_ms: {u} is earlier than window_s after the epoch")))
        }
        Some(u) => u.min(now),
        None => now,
    };
    // The finest tier that reaches back to the window's start (the coarsest when none does).
    let policy = tiers.covering((now - until).saturating_add(window_s.saturating_mul(1000)));
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
    let step_ms = step_s * 1000;
    // Whole buckets of the asked step that overlap the window: from the one holding the
    // window's start (which may begin before it) to the one holding `until`. A window of one
    // step thus still covers the last `window_s` seconds, not just the current bucket.
    let start = until.saturating_sub(window_s.saturating_mul(1000));
    let since = start - start % step_ms;
    let mut raw = node.broker.trend(channel, policy, since).await.map_err(|e| node.broker_error(e))?;
    if until < now {
        raw.retain(|b| b.t <= until);
    }
    let buckets = if step_s == stored { raw } else { switchboard_broker::trend::resample(raw, since, step_ms) };
    let tiers =
        tiers.iter().map(|t| TierInfo { step_s: (t.step_ms / 1000).max(1), window_s: t.reach_ms() / 1000 }).collect();
    Ok(TrendReply { step_s, buckets, tiers })
}
