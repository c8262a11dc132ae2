//! Node metrics: plain atomics on the hot path, rendered as Prometheus text on `/metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) of the delivery-lag histogram buckets.
const LAG_BOUNDS: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// Counters and gauges of one node. Every field is updated with relaxed atomics: the figures
/// are statistics, never used to synchronize.
#[derive(Default)]
pub struct Metrics {
    pub connections: AtomicU64,
    pub connections_total: AtomicU64,
    pub subscriptions: AtomicU64,
    pub messages_in: AtomicU64,
    pub bytes_in: AtomicU64,
    pub deliveries: AtomicU64,
    pub bytes_out: AtomicU64,
    pub writes: AtomicU64,
    pub publications: AtomicU64,
    pub conflated: AtomicU64,
    pub dropped: AtomicU64,
    pub slow_consumers: AtomicU64,
    /// Subscribers told to reconnect and recover because the broker lost publications.
    pub recover_disconnects: AtomicU64,
    /// Subscriptions ended with an `unsubscribed` push (the connection stays) because the
    /// broker lost publications of their channel.
    pub recover_unsubscribes: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub rejected_connections: AtomicU64,
    /// Idle channels forgotten (their namespace's `channel_ttl_s` passed).
    pub channels_forgotten: AtomicU64,
    /// New channels refused at `limits.max_channels`.
    pub channels_refused: AtomicU64,
    /// Answers 503: the broker was unreachable or failing over, nothing was done.
    pub broker_unavailable: AtomicU64,
    /// Answers 504: a publish sent to the broker and not answered (outcome unknown).
    pub broker_unknown: AtomicU64,
    /// Historical values from sources, by outcome.
    pub historical: HistoricalCounts,
    /// permessage-deflate: what compressing cost and saved.
    pub deflate: DeflateCounts,
    lag_buckets: [AtomicU64; LAG_BOUNDS.len() + 1],
    lag_sum_us: AtomicU64,
}

impl Metrics {
    /// Records how long a delivery waited between the broker accepting the publication and
    /// its bytes being handed to the socket.
    pub fn observe_lag(&self, lag: Duration) {
        let s = lag.as_secs_f64();
        let i = LAG_BOUNDS.iter().position(|b| s <= *b).unwrap_or(LAG_BOUNDS.len());
        self.lag_buckets[i].fetch_add(1, Relaxed);
        self.lag_sum_us.fetch_add(lag.as_micros() as u64, Relaxed);
    }

    /// Prometheus text exposition.
    /// `channels`: the hub's channels (with local subscribers); `broker_channels`: the channels
    /// the broker holds, when it knows (the memory broker); `broker_rtt`: its measured round
    /// trip, for shared brokers.
    pub fn render(&self, channels: usize, broker_channels: Option<usize>, broker_rtt: Option<Duration>) -> String {
        let mut out = String::with_capacity(4096);
        g(&mut out, "connections", "Open client connections.", "gauge", self.connections.load(Relaxed));
        g(
            &mut out,
            "connections_accepted_total",
            "Client connections accepted.",
            "counter",
            self.connections_total.load(Relaxed),
        );
        g(
            &mut out,
            "connections_rejected_total",
            "Connections refused by the connection limit.",
            "counter",
            self.rejected_connections.load(Relaxed),
        );
        g(&mut out, "subscriptions", "Active subscriptions on this node.", "gauge", self.subscriptions.load(Relaxed));
        g(&mut out, "channels", "Channels with local subscribers.", "gauge", channels as u64);
        if let Some(n) = broker_channels {
            g(&mut out, "broker_channels", "Channels the node's memory broker holds.", "gauge", n as u64);
        }
        if let Some(rtt) = broker_rtt {
            let _ = writeln!(
                out,
                "# HELP switchboard_broker_rtt_seconds Round trip of the broker link's keepalive PING (or the age of \
                 one unanswered), the slowest server's.\n# TYPE switchboard_broker_rtt_seconds gauge\n\
                 switchboard_broker_rtt_seconds {}",
                rtt.as_secs_f64()
            );
        }
        g(&mut out, "messages_in_total", "Client frames received.", "counter", self.messages_in.load(Relaxed));
        g(&mut out, "bytes_in_total", "Client bytes received.", "counter", self.bytes_in.load(Relaxed));
        g(
            &mut out,
            "messages_out_total",
            "Messages delivered to clients (publications, replies, presence).",
            "counter",
            self.deliveries.load(Relaxed),
        );
        g(&mut out, "bytes_out_total", "Bytes written to client sockets.", "counter", self.bytes_out.load(Relaxed));
        g(&mut out, "socket_writes_total", "Write calls on client sockets.", "counter", self.writes.load(Relaxed));
        g(
            &mut out,
            "publications_total",
            "Publications accepted by this node.",
            "counter",
            self.publications.load(Relaxed),
        );
        g(
            &mut out,
            "conflated_total",
            "Deliveries replaced by a newer value before being written (conflation).",
            "counter",
            self.conflated.load(Relaxed),
        );
        g(
            &mut out,
            "dropped_total",
            "Deliveries dropped because their connection was closing or too slow.",
            "counter",
            self.dropped.load(Relaxed),
        );
        g(
            &mut out,
            "slow_consumer_disconnects_total",
            "Connections closed with 4008 because their outbound queue passed its bound.",
            "counter",
            self.slow_consumers.load(Relaxed),
        );
        self.deflate.render(&mut out);
        g(
            &mut out,
            "recover_disconnects_total",
            "Subscribers closed with 4008 to recover from history: the broker lost publications.",
            "counter",
            self.recover_disconnects.load(Relaxed),
        );
        g(
            &mut out,
            "recover_unsubscribes_total",
            "Subscriptions ended with an unsubscribed push (the client subscribes again and recovers; the connection stays): the broker lost publications of the channel.",
            "counter",
            self.recover_unsubscribes.load(Relaxed),
        );
        g(
            &mut out,
            "channels_forgotten_total",
            "Idle channels forgotten after their namespace's channel_ttl_s (no subscriber, presence or publication).",
            "counter",
            self.channels_forgotten.load(Relaxed),
        );
        g(
            &mut out,
            "channels_refused_total",
            "New channels refused because the node holds limits.max_channels.",
            "counter",
            self.channels_refused.load(Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP switchboard_broker_failures_total Commands answered 503 (unavailable: nothing was done) or 504 \
             (unknown: a publish sent and not answered) because of the broker.\n\
             # TYPE switchboard_broker_failures_total counter\n\
             switchboard_broker_failures_total{{outcome=\"unavailable\"}} {}\n\
             switchboard_broker_failures_total{{outcome=\"unknown\"}} {}",
            self.broker_unavailable.load(Relaxed),
            self.broker_unknown.load(Relaxed),
        );
        g(
            &mut out,
            "protocol_errors_total",
            "Connections closed for a protocol error or oversize frame.",
            "counter",
            self.protocol_errors.load(Relaxed),
        );
        render_tasks(&mut out);
        let name = "switchboard_delivery_lag_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time from publication accepted to bytes handed to the socket.\n# TYPE {name} histogram"
        );
        let mut cumulative = 0;
        for (i, b) in LAG_BOUNDS.iter().enumerate() {
            cumulative += self.lag_buckets[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        cumulative += self.lag_buckets[LAG_BOUNDS.len()].load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", self.lag_sum_us.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {cumulative}");
        out
    }
}

/// One sample with its help and type lines.
fn g(out: &mut String, name: &str, help: &str, kind: &str, v: u64) {
    let _ = writeln!(out, "# HELP switchboard_{name} {help}\n# TYPE switchboard_{name} {kind}\nswitchboard_{name} {v}");
}

/// permessage-deflate since the node started (`crate::outbox::deflated`).
#[derive(Debug, Default)]
pub struct DeflateCounts {
    /// WebSocket connections that negotiated it.
    pub connections: AtomicU64,
    /// Messages compressed: once per shared publication and window, once per reply.
    pub compressed: AtomicU64,
    /// Their payload bytes before compressing.
    pub bytes_in: AtomicU64,
    /// Their payload bytes as sent: compressed, or as they were where that was not smaller.
    pub bytes_out: AtomicU64,
}

impl DeflateCounts {
    /// Counts one message of `before` payload bytes compressed to `after` (`before` when the
    /// compressed form was not smaller and the message goes as it is).
    pub fn count(&self, before: usize, after: usize) {
        self.compressed.fetch_add(1, Relaxed);
        self.bytes_in.fetch_add(before as u64, Relaxed);
        self.bytes_out.fetch_add(after as u64, Relaxed);
    }

    fn render(&self, out: &mut String) {
        let counters = [
            ("deflate_connections_total", "WebSocket connections that negotiated permessage-deflate.", &self.connections),
            (
                "deflate_messages_total",
                "Messages compressed (once per publication and window, shared by every connection that gets it; once per reply).",
                &self.compressed,
            ),
            ("deflate_input_bytes_total", "Payload bytes of the compressed messages before compressing.", &self.bytes_in),
            (
                "deflate_output_bytes_total",
                "Payload bytes of the compressed messages as sent (as they were where compressing did not make them smaller).",
                &self.bytes_out,
            ),
        ];
        for (name, help, n) in counters {
            g(out, name, help, "counter", n.load(Relaxed));
        }
    }
}

/// Historical values from sources by outcome, since the node started
/// (`crate::sources::historical`).
#[derive(Debug, Default)]
pub struct HistoricalCounts {
    /// Published as historical publications (history, trend at their own time).
    pub kept: AtomicU64,
    /// Refused: a check failed, or the namespace keeps neither history nor a trend.
    pub refused: AtomicU64,
    /// The broker could not commit them (unavailable, or no answer).
    pub failed: AtomicU64,
}

impl HistoricalCounts {
    /// Prometheus text of the counts.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# HELP switchboard_source_historical_total Historical values from sources (before their channel's \
             newest): kept (in history, and in the trend at their own time), refused (a check failed, a \
             namespace without history or trend) or failed (the broker did not commit them).\n\
             # TYPE switchboard_source_historical_total counter\n",
        );
        for (outcome, n) in [("kept", &self.kept), ("refused", &self.refused), ("failed", &self.failed)] {
            let _ = writeln!(out, "switchboard_source_historical_total{{outcome=\"{outcome}\"}} {}", n.load(Relaxed));
        }
        out
    }
}

/// Supervised tasks' restarts (every supervised task listed) and the panics isolated inside one
/// client's session or one subscriber's delivery (`switchboard_supervisor`).
fn render_tasks(out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP switchboard_task_restarts_total Restarts of a supervised task after a panic.\n\
         # TYPE switchboard_task_restarts_total counter"
    );
    for (task, n) in switchboard_supervisor::restarts() {
        let _ = writeln!(out, "switchboard_task_restarts_total{{task=\"{task}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP switchboard_panics_isolated_total Panics caught inside one client's work (site session, fanout, \
         connection); each closed that client only.\n# TYPE switchboard_panics_isolated_total counter"
    );
    for (site, n) in switchboard_supervisor::panics() {
        let _ = writeln!(out, "switchboard_panics_isolated_total{{site=\"{site}\"}} {n}");
    }
}

/// Prometheus text of the plant data sources: per-source counters labelled `source` and
/// `kind` (empty when none is configured).
pub fn render_sources(sources: &[switchboard_sources::SourceHandle]) -> String {
    let mut out = String::new();
    if sources.is_empty() {
        return out;
    }
    type Field = fn(&switchboard_sources::SourceStats) -> u64;
    let series: [(&str, &str, &str, Field); 11] = [
        ("source_messages_total", "counter", "Messages (MQTT) or value changes (OPC UA) a source received.", |s| {
            s.messages.load(Relaxed)
        }),
        ("source_points_total", "counter", "Points a source published into channels.", |s| s.points.load(Relaxed)),
        ("source_decode_errors_total", "counter", "Payloads or values a source could not decode.", |s| {
            s.decode_errors.load(Relaxed)
        }),
        ("source_reconnects_total", "counter", "Reconnections of a source to its upstream system.", |s| {
            s.reconnects.load(Relaxed)
        }),
        ("source_writes_total", "counter", "Writes a source's device accepted.", |s| s.writes_ok.load(Relaxed)),
        ("source_writes_failed_total", "counter", "Writes refused, unanswered or not sent.", |s| {
            s.writes_failed.load(Relaxed)
        }),
        ("source_rebirths_total", "counter", "Sparkplug B rebirth requests a source sent.", |s| {
            s.rebirths.load(Relaxed)
        }),
        ("source_backfilled_total", "counter", "Values an OPC UA source back-filled from the server's history.", |s| {
            s.backfilled.load(Relaxed)
        }),
        ("source_connected", "gauge", "1 while a source is connected to its upstream system.", |s| {
            s.connected.load(Relaxed) as u64
        }),
        ("source_active", "gauge", "1 while this node runs a source (holds its lease).", |s| {
            s.active.load(Relaxed) as u64
        }),
        ("source_backlog", "gauge", "Values a source received that the node has not committed yet.", |s| {
            s.backlog.load(Relaxed)
        }),
    ];
    for (name, kind, help, field) in series {
        let _ = writeln!(out, "# HELP switchboard_{name} {help}\n# TYPE switchboard_{name} {kind}");
        for h in sources {
            let _ =
                writeln!(out, "switchboard_{name}{{source=\"{}\",kind=\"{}\"}} {}", h.name, h.kind, field(&h.stats));
        }
    }
    let now = switchboard_broker::now_ms();
    let _ = writeln!(
        out,
        "# HELP switchboard_source_backlog_age_seconds How long the oldest value of a source's backlog has \
         waited (0: none waits).\n# TYPE switchboard_source_backlog_age_seconds gauge"
    );
    for h in sources {
        let age = h.stats.backlog_age_s(now);
        let _ =
            writeln!(out, "switchboard_source_backlog_age_seconds{{source=\"{}\",kind=\"{}\"}} {age}", h.name, h.kind);
    }
    type Reasons = fn(&switchboard_sources::SourceStats) -> &switchboard_sources::ByReason;
    let by_reason: [(&str, &str, Reasons); 2] = [
        (
            "source_dropped_total",
            "Values a source received and dropped before the node saw them, by reason (buffer: a QoS 0 value \
             replaced by a newer one while the buffer was full; duplicate: a message delivered again that was \
             committed already).",
            |s| &s.dropped,
        ),
        (
            "source_refused_total",
            "Messages or values a source refused, by reason (node: the node refused the point).",
            |s| &s.refusals,
        ),
    ];
    for (name, help, counts) in by_reason {
        let _ = writeln!(out, "# HELP switchboard_{name} {help}\n# TYPE switchboard_{name} counter");
        for h in sources {
            for (reason, n) in counts(&h.stats).list() {
                let _ = writeln!(
                    out,
                    "switchboard_{name}{{source=\"{}\",kind=\"{}\",reason=\"{reason}\"}} {n}",
                    h.name, h.kind
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_lag_histogram_is_cumulative() {
        let m = Metrics::default();
        m.observe_lag(Duration::from_micros(50));
        m.observe_lag(Duration::from_millis(3));
        m.observe_lag(Duration::from_secs(9));
        let text = m.render(0, None, None);
        assert!(text.contains("switchboard_delivery_lag_seconds_bucket{le=\"0.0001\"} 1\n"));
        assert!(text.contains("switchboard_delivery_lag_seconds_bucket{le=\"0.005\"} 2\n"));
        assert!(text.contains("switchboard_delivery_lag_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("switchboard_delivery_lag_seconds_count 3\n"));
    }
}
