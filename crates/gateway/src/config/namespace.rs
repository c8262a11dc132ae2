//! `[namespaces.<ns>]`: a namespace's options ([`Namespace`]) and defaults, and what a channel
//! gets from its namespace: the options, how long it is kept idle, its history and trend.

use std::time::Duration;

use serde::Deserialize;
use switchboard_broker::HistoryPolicy;

use super::{trend, Config};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Namespace {
    pub history_size: usize,
    pub history_ttl_s: u64,
    /// Slow subscribers get only the latest value per channel instead of a queue.
    pub conflate: bool,
    /// Clients may publish over WebSocket.
    pub client_publish: bool,
    /// Join/leave events and who-is-here.
    pub presence: bool,
    /// Who may subscribe, publish, see presence and read history.
    pub allow: crate::auth::Permissions,
    /// A channel with no subscriber, no present client and no publication for this long is
    /// forgotten entirely (epoch, offset, last value, history); 0 keeps channels forever.
    /// Unset: [`DEFAULT_CHANNEL_TTL_S`], except in the `pt` namespace (kept forever: a plant's
    /// tag set is fixed, and a valve that last changed a week ago must still show its value).
    pub channel_ttl_s: Option<u64>,
    /// How far back each channel's trend of numeric values reaches (s); 0 keeps none. Unset:
    /// an hour in the `pt` namespace, none elsewhere (see `switchboard_broker::trend`).
    pub trend_window_s: Option<u64>,
    /// Width of a trend bucket (s, at least 1).
    pub trend_step_s: u64,
    /// Trend tiers, finest first (instead of `trend_window_s` and `trend_step_s`): a read uses
    /// the finest that reaches back far enough (`config/trend.rs`).
    pub trend_tiers: Vec<trend::TrendTier>,
    /// The source (a `[[sources]]` name) that a permitted publish to a channel of this
    /// namespace is written to, instead of being published: the reply says whether the
    /// device accepted it.
    pub write_source: Option<String>,
    /// The subscribe hook decides every subscribe here (after the permission checks).
    pub proxy_subscribe: bool,
    /// The publish hook decides every client publish here (and may replace its data).
    pub proxy_publish: bool,
}

/// How far back a point channel's trend reaches unless its namespace says otherwise.
pub const DEFAULT_TREND_WINDOW_S: u64 = 3600;

/// How long an idle channel is kept unless its namespace says otherwise.
pub const DEFAULT_CHANNEL_TTL_S: u64 = 3600;
/// How long an internal channel (`$…`, messages between nodes) is kept once idle, whatever
/// the namespaces say: its last message goes soon, and a dead node's reply channel too.
pub const INTERNAL_CHANNEL_TTL_S: u64 = 60;

impl Default for Namespace {
    fn default() -> Namespace {
        DEFAULT_NAMESPACE.clone()
    }
}

impl Namespace {
    /// The history policy without a trend ([`Config::history_policy`] adds it).
    pub fn history(&self) -> HistoryPolicy {
        HistoryPolicy { size: self.history_size, ttl: Duration::from_secs(self.history_ttl_s), trend: None }
    }
}

impl Config {
    /// The options of a channel's namespace; unknown namespaces use the default namespace's.
    pub fn namespace(&self, name: &str) -> &Namespace {
        self.namespaces.get(name).or_else(|| self.namespaces.get("")).unwrap_or(&DEFAULT_NAMESPACE)
    }

    /// How long `channel` is kept once idle (zero: forever); see [`Namespace::channel_ttl_s`].
    pub fn channel_ttl(&self, channel: &str) -> Duration {
        if channel.starts_with('$') {
            return Duration::from_secs(INTERNAL_CHANNEL_TTL_S);
        }
        let name = switchboard_protocol::namespace_of(channel);
        // Point channels keep their last value for good, alarm channels their alarm's state.
        let kept = name == "pt" || name == crate::alarms::def::NAMESPACE;
        let ns = self.namespaces.get(name).unwrap_or_else(|| self.namespace(""));
        let default = if kept { 0 } else { DEFAULT_CHANNEL_TTL_S };
        Duration::from_secs(ns.channel_ttl_s.unwrap_or(default))
    }

    /// What `channel` keeps: its namespace's history and trend.
    pub fn history_policy(&self, channel: &str) -> HistoryPolicy {
        let name = switchboard_protocol::namespace_of(channel);
        let (name, ns) = match self.namespaces.get(name) {
            Some(ns) => (name, ns),
            None => ("", self.namespace("")),
        };
        HistoryPolicy { trend: trend::tiers(name, ns), ..ns.history() }
    }
}

/// What a namespace is unless the configuration says otherwise.
pub(super) static DEFAULT_NAMESPACE: Namespace = Namespace {
    history_size: 100,
    history_ttl_s: 300,
    conflate: false,
    client_publish: false,
    presence: false,
    allow: crate::auth::Permissions::DEFAULT,
    channel_ttl_s: None,
    trend_window_s: None,
    trend_step_s: 1,
    trend_tiers: Vec::new(),
    write_source: None,
    proxy_subscribe: false,
    proxy_publish: false,
};
