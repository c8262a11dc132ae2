//! Historical values from sources (`Item::historical`: a Sparkplug B `is_historical` metric, a
//! back-fill): merged into their channel's trend at their own time ([`Broker::backfill`]),
//! never published — no offset, no delivery to subscribers, no history entry, the channel's
//! last value unchanged (docs/sources.md, "Historical values").
//!
//! Each value passes the checks every publication of a source passes ([`Node::check_own`]);
//! then its channel's namespace must keep a trend (else it is refused: it would have nowhere
//! to go), and its numeric value and own time `t` are merged. A value that is not numeric, or
//! older than every tier's reach, is taken and dropped: offered again it would be dropped
//! again. The counts of each outcome are on `/metrics`
//! (`switchboard_source_historical_total{outcome}`, [`crate::metrics::HistoricalCounts`]).
//!
//! [`Broker::backfill`]: switchboard_broker::Broker::backfill

use std::sync::atomic::Ordering::Relaxed;

use switchboard_sources::{Item, SinkError};

use crate::node::Node;

/// One channel's values of a batch: where their results go, and what the broker merges.
struct Merge {
    channel: String,
    tiers: switchboard_broker::TrendTiers,
    /// Indexes (in the batch) of the items merged.
    places: Vec<usize>,
    values: Vec<(u64, f64)>,
}

/// Merges the historical `items` into their channels' trends; one result per item, in order.
/// Each channel's values go to the broker in one call (channels in parallel); a channel's
/// items all get the broker's answer.
pub async fn merge(node: &Node, items: Vec<Item>) -> Vec<Result<(), SinkError>> {
    let counts = &node.metrics.historical;
    let mut results: Vec<Result<(), SinkError>> = vec![Ok(()); items.len()];
    let mut merges: Vec<Merge> = Vec::new();
    let mut unplaced = 0;
    for (i, item) in items.into_iter().enumerate() {
        let checked = match node.check_own(&item.channel, item.data) {
            Ok(checked) => checked,
            Err(e) => {
                counts.refused.fetch_add(1, Relaxed);
                results[i] = Err(super::sink_error(e));
                continue;
            }
        };
        let Some(tiers) = checked.policy().trend else {
            counts.refused.fetch_add(1, Relaxed);
            results[i] = Err(SinkError::Refused(format!(
                "{}: a historical value goes to the channel's trend only, and its namespace keeps none \
                 (trend_window_s = 0); it is never published as the current value",
                item.channel
            )));
            continue;
        };
        let Some((v, Some(t))) = switchboard_broker::trend::sample(checked.data().get()) else {
            unplaced += 1;
            continue;
        };
        match merges.iter_mut().find(|m| m.channel == item.channel) {
            Some(m) => {
                m.places.push(i);
                m.values.push((t, v));
            }
            None => merges.push(Merge { channel: item.channel, tiers, places: vec![i], values: vec![(t, v)] }),
        }
    }
    counts.dropped.fetch_add(unplaced, Relaxed);
    let answers = futures_util::future::join_all(
        merges.iter().map(|m| node.broker.backfill(&m.channel, m.values.clone(), m.tiers)),
    )
    .await;
    for (m, answer) in merges.iter().zip(answers) {
        match answer {
            Ok(kept) => {
                counts.kept.fetch_add(kept as u64, Relaxed);
                counts.dropped.fetch_add(m.values.len().saturating_sub(kept) as u64, Relaxed);
            }
            Err(e) => {
                counts.failed.fetch_add(m.values.len() as u64, Relaxed);
                let e = super::sink_error(node.broker_error(e));
                for &i in &m.places {
                    results[i] = Err(e.clone());
                }
            }
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use switchboard_broker::{now_ms, MemoryBroker};

    use super::*;
    use crate::config::Config;

    fn item(channel: &str, data: String, historical: bool) -> Item {
        let data = Arc::new(serde_json::value::RawValue::from_string(data).unwrap());
        Item { channel: channel.to_string(), data, historical }
    }

    #[tokio::test]
    async fn sources_historical_values_go_to_trends_only_and_are_counted() {
        let node = Node::new(Config::default(), Arc::new(MemoryBroker::new()));
        let now = now_ms();
        let old = now - 10_000;
        let live = format!(r#"{{"v": 1, "t": {now}}}"#);
        node.publish(
            node.check_own("pt:a", Arc::new(serde_json::value::RawValue::from_string(live.clone()).unwrap())).unwrap(),
        )
        .await
        .unwrap();
        let items = vec![
            item("pt:a", format!(r#"{{"v": 5, "t": {old}}}"#), true),
            item("pt:a", format!(r#"{{"v": 7, "t": {}}}"#, now - 86_400_000), true),
            item("pt:a", format!(r#"{{"v": "open", "t": {old}}}"#), true),
            item("room:b", format!(r#"{{"v": 5, "t": {old}}}"#), true),
            item("bad name", format!(r#"{{"v": 5, "t": {old}}}"#), true),
        ];
        let results = merge(&node, items).await;
        assert!(results[..3].iter().all(Result::is_ok), "{results:?}");
        assert!(matches!(&results[3], Err(SinkError::Refused(m)) if m.contains("keeps none")), "{results:?}");
        assert!(matches!(&results[4], Err(SinkError::Refused(_))), "{results:?}");
        let c = &node.metrics.historical;
        let counts = [&c.kept, &c.dropped, &c.refused, &c.failed].map(|n| n.load(Relaxed));
        assert_eq!(counts, [1, 2, 2, 0], "kept, dropped, refused, failed");
        let policy = node.config.history_policy("pt:a").trend.unwrap().finest();
        let trend = node.broker.trend("pt:a", policy, 0).await.unwrap();
        assert_eq!(
            trend.iter().map(|b| (b.t, b.last)).collect::<Vec<_>>(),
            vec![(old - old % 1000, 5.0), (now - now % 1000, 1.0)]
        );
        let (position, last) = node.broker.last_or_start("pt:a").await.unwrap();
        assert_eq!((position.offset, last.unwrap().data.get()), (1, live.as_str()), "nothing published");
        assert!(c.render().contains("switchboard_source_historical_total{outcome=\"dropped\"} 2"));
    }
}
