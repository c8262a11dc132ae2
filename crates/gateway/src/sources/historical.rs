//! Historical values from sources (`Item::historical`: a Sparkplug B `is_historical` metric, an
//! MQTT value older than its channel's newest, an OPC UA back-fill): published as historical
//! publications ([`Outgoing::historical`]). Each takes its channel's next offset and goes to
//! history, into the trend buckets of its own time that reach back to it, and to the
//! subscribers that get every publication, marked `"hist": true`; the channel's last value
//! stays the newest live one, and alarms never evaluate it (docs/sources.md, "Historical
//! values").
//!
//! Each value passes the checks every publication of a source passes ([`Node::check_own`]);
//! then its channel's namespace must keep history or a trend (else it is refused: it would
//! have nowhere to go). The counts of each outcome are on `/metrics`
//! (`switchboard_source_historical_total{outcome}`, [`crate::metrics::HistoricalCounts`]).
//!
//! [`Outgoing::historical`]: switchboard_broker::Outgoing::historical

use std::sync::atomic::Ordering::Relaxed;

use switchboard_broker::{Data, Position};
use switchboard_protocol::code;

use crate::node::{ApiError, Checked, Node};

/// Checks a historical value of `channel` as a source's publication, marked historical.
pub fn check(node: &Node, channel: &str, data: Data) -> Result<Checked, ApiError> {
    let checked = node.check_own(channel, data).inspect_err(|_| {
        node.metrics.historical.refused.fetch_add(1, Relaxed);
    })?;
    let policy = checked.policy();
    if policy.size == 0 && policy.trend.is_none() {
        node.metrics.historical.refused.fetch_add(1, Relaxed);
        return Err(ApiError::new(
            code::BAD_REQUEST,
            format!(
                "{channel}: a historical value goes to history and the trend, and its namespace keeps neither \
                 (history_size = 0, trend_window_s = 0); it is never published as the current value"
            ),
        ));
    }
    Ok(checked.historical())
}

/// Counts what the broker did with the historical values of a batch (`results` of the items
/// [`check`] let through).
pub fn count<'a>(node: &Node, results: impl Iterator<Item = &'a Result<Position, ApiError>>) {
    let c = &node.metrics.historical;
    for r in results {
        match r {
            Ok(_) => c.kept.fetch_add(1, Relaxed),
            Err(_) => c.failed.fetch_add(1, Relaxed),
        };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use switchboard_broker::{now_ms, MemoryBroker};
    use switchboard_sources::{Item, SinkError};

    use super::*;
    use crate::config::Config;

    fn item(channel: &str, data: String, historical: bool) -> Item {
        let data = Arc::new(serde_json::value::RawValue::from_string(data).unwrap());
        Item { channel: channel.to_string(), data, historical }
    }

    #[tokio::test]
    async fn sources_historical_values_go_to_history_and_trends_never_last_and_are_counted() {
        let mut config = Config::default();
        let unkept = toml::from_str("history_size = 0\ntrend_window_s = 0").unwrap();
        config.namespaces.insert("nk".into(), unkept);
        config.namespaces.get_mut("pt").unwrap().history_size = 10;
        let node = Arc::new(Node::new(config, Arc::new(MemoryBroker::new())));
        let sink = crate::sources::sink(&node);
        let now = now_ms();
        let old = now - 10_000;
        let live = format!(r#"{{"v": 1, "t": {now}}}"#);
        let items = vec![
            item("pt:a", live.clone(), false),
            item("pt:a", format!(r#"{{"v": 5, "t": {old}}}"#), true),
            item("pt:a", format!(r#"{{"v": 7, "t": {}}}"#, now - 86_400_000), true),
            item("pt:a", format!(r#"{{"v": "open", "t": {old}}}"#), true),
            item("nk:b", format!(r#"{{"v": 5, "t": {old}}}"#), true),
            item("bad name", format!(r#"{{"v": 5, "t": {old}}}"#), true),
        ];
        let results = sink.publish_batch(items).await;
        assert!(results[..4].iter().all(Result::is_ok), "{results:?}");
        assert!(matches!(&results[4], Err(SinkError::Refused(m)) if m.contains("keeps neither")), "{results:?}");
        assert!(matches!(&results[5], Err(SinkError::Refused(_))), "{results:?}");
        let c = &node.metrics.historical;
        let counts = [&c.kept, &c.refused, &c.failed].map(|n| n.load(Relaxed));
        assert_eq!(counts, [3, 2, 0], "kept, refused, failed");
        // The trend has the one numeric value within its reach, at its own time.
        let policy = node.config.history_policy("pt:a").trend.unwrap().finest();
        let trend = node.broker.trend("pt:a", policy, 0).await.unwrap();
        assert_eq!(
            trend.iter().map(|b| (b.t, b.last)).collect::<Vec<_>>(),
            vec![(old - old % 1000, 5.0), (now - now % 1000, 1.0)]
        );
        // History has every one, marked; the last value is the live one.
        let (position, last) = node.broker.last_or_start("pt:a").await.unwrap();
        assert_eq!((position.offset, last.unwrap().data.get()), (4, live.as_str()));
        let history = node.broker.history("pt:a", None, 10).await.unwrap().publications;
        assert_eq!(history.iter().map(|p| p.historical).collect::<Vec<_>>(), [false, true, true, true]);
        assert!(c.render().contains("switchboard_source_historical_total{outcome=\"kept\"} 3"));
    }
}
