//! A namespace's trend tiers: `trend_tiers = [{step_s, window_s}, ...]`, finest first, or the
//! single tier of `trend_step_s` and `trend_window_s` (an hour of seconds in `pt` by default).

use serde::Deserialize;
use switchboard_broker::trend::MAX_TIERS;
use switchboard_broker::{TrendPolicy, TrendTiers};

use super::{ConfigError, Namespace, DEFAULT_TREND_WINDOW_S};

/// One tier: buckets of `step_s` reaching back `window_s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrendTier {
    pub step_s: u64,
    pub window_s: u64,
}

impl TrendTier {
    fn policy(self) -> TrendPolicy {
        let step = self.step_s.max(1);
        TrendPolicy { step_ms: step * 1000, len: u32::try_from(self.window_s.div_ceil(step)).unwrap_or(u32::MAX) }
    }
}

/// The tiers the namespace `name` keeps; `None` for no trend.
pub(super) fn tiers(name: &str, ns: &Namespace) -> Option<TrendTiers> {
    if !ns.trend_tiers.is_empty() {
        let policies: Vec<TrendPolicy> = ns.trend_tiers.iter().map(|t| t.policy()).collect();
        return TrendTiers::new(&policies);
    }
    let window = ns.trend_window_s.unwrap_or(if name == "pt" { DEFAULT_TREND_WINDOW_S } else { 0 });
    (window > 0).then(|| TrendTiers::one(TrendTier { step_s: ns.trend_step_s, window_s: window }.policy()))
}

/// `trend_tiers` of the namespace `name`: 1 to [`MAX_TIERS`] tiers, each window at least its
/// step and at most a week (the longest a read may ask for), steps and windows growing from one
/// tier to the next; not beside `trend_window_s`.
pub(super) fn validate(name: &str, ns: &Namespace) -> Result<(), ConfigError> {
    let key = format!("namespaces.{name}.trend_tiers");
    let t = &ns.trend_tiers;
    if t.is_empty() {
        return Ok(());
    }
    let fail = |m: String| Err(ConfigError(format!("{key}: {m}")));
    if ns.trend_window_s.is_some() {
        return fail("give either trend_tiers or trend_window_s and trend_step_s".into());
    }
    if t.len() > MAX_TIERS {
        return fail(format!("{} tiers; at most {MAX_TIERS}", t.len()));
    }
    let most = switchboard_protocol::bounds::MAX_TREND_WINDOW_S;
    for (i, tier) in t.iter().enumerate() {
        if tier.step_s == 0 || tier.window_s < tier.step_s || tier.window_s > most {
            return fail(format!(
                "tier {i}: step_s {} and window_s {} (need 1 <= step_s <= window_s <= {most})",
                tier.step_s, tier.window_s
            ));
        }
        if let Some(prev) = i.checked_sub(1).map(|j| t[j]) {
            if tier.step_s <= prev.step_s || tier.window_s <= prev.window_s {
                return fail(format!("tier {i}: each tier needs a larger step_s and window_s than the one before"));
            }
        }
    }
    Ok(())
}
