//! Trend reads for clients: `GET /api/channels/{ch}/trend?window_s=&step_s=` and the `trend`
//! option of subscribe. The buckets come from the broker (`switchboard_broker::trend`), read
//! from the finest of the namespace's tiers that reaches back over the window, at its step,
//! and merged into wider ones when a coarser step is asked for. Every reply names the tiers the
//! namespace keeps, so a client knows which windows it can offer and where finer buckets are.
//!
//! A trend reply is bounded by the budget of one reply (`config::Limits::reply_budget`) on
//! every path: a subscribe counts it into its reply (`session::reply`), `GET …/trend` writes its
//! body within the budget ([`json_within`]); past it both answer the same 413 ([`too_large`]).

use switchboard_broker::now_ms;
use switchboard_protocol::code;

pub use crate::message::{TierInfo, TrendReply};
use crate::node::{ApiError, Node};

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

/// The 413 of a trend larger than a reply carries (`limit` bytes, the budget of one reply):
/// the same answer over HTTP and in a subscribe's result.
pub fn too_large(t: &TrendReply, limit: usize) -> ApiError {
    ApiError::new(
        code::TOO_LARGE,
        format!(
            "trend: {} buckets of {} s are more than a reply carries ({limit} bytes, half of \
             limits.max_pending_bytes); ask a coarser step_s or a shorter window_s",
            t.buckets.len(),
            t.step_s
        ),
    )
}

/// `reply` as the JSON body of `GET …/trend`, or its 413 ([`too_large`]) when the body takes
/// more than `limit` bytes. The body is written into a buffer that never holds more than
/// `limit` bytes: a reply past the bound is abandoned there, and an accepted one is kept at its
/// size, so a client that does not read what it asked for holds at most `limit` bytes of the
/// node's memory.
pub fn json_within(reply: &TrendReply, limit: usize) -> Result<Vec<u8>, ApiError> {
    /// A writer that refuses to grow past `limit` bytes.
    struct Capped {
        out: Vec<u8>,
        limit: usize,
    }
    impl std::io::Write for Capped {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.out.len() + buf.len() > self.limit {
                return Err(std::io::Error::other("past the reply budget"));
            }
            self.out.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = Capped { out: Vec::new(), limit };
    // The reply is plain numbers and strings, so the writer's refusal is the only error.
    match serde_json::to_writer(&mut w, reply) {
        Ok(()) => {
            // Growth by doubling may have reserved up to twice the body: kept at its size.
            w.out.shrink_to_fit();
            Ok(w.out)
        }
        Err(_) => Err(too_large(reply, limit)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_broker::TrendBucket;

    fn reply(buckets: usize) -> TrendReply {
        let b = |i: usize| {
            let t = 1_700_000_000_000 + 1000 * i as u64;
            TrendBucket::new(t, t, i as f64)
        };
        TrendReply { step_s: 1, buckets: (0..buckets).map(b).collect(), tiers: Vec::new() }
    }

    #[test]
    fn trend_http_body_within_the_budget_is_the_whole_reply() {
        let r = reply(100);
        let body = json_within(&r, 64 * 1024).unwrap();
        assert_eq!(body, serde_json::to_vec(&r).unwrap());
        assert_eq!(body.capacity(), body.len());
    }

    #[test]
    fn trend_http_body_past_the_budget_is_413_naming_the_bound() {
        let r = reply(100_000);
        let e = json_within(&r, 512 * 1024).unwrap_err();
        assert_eq!(e.code, code::TOO_LARGE);
        assert!(e.message.contains("524288 bytes") && e.message.contains("100000 buckets"), "{}", e.message);
        // Exactly at the bound passes; one byte less does not.
        let small = reply(3);
        let n = serde_json::to_vec(&small).unwrap().len();
        assert!(json_within(&small, n).is_ok());
        assert_eq!(json_within(&small, n - 1).unwrap_err().code, code::TOO_LARGE);
    }
}
