//! History reads — the `history` command of every session transport and
//! `GET /api/channels/{ch}/history` — bounded by the budget of one reply
//! (`config::Limits::reply_budget`, docs/protocol.md "Reply bound"). Publications are read from
//! the broker in pages of [`PAGE`] and counted as they are added; past the budget the page ends
//! early with `more`, and the reader asks again from its last publication's offset. Both paths
//! read through [`read`], so they page the same way and differ only in how a publication is
//! written (and so counted).

use switchboard_broker::{Position, Publication};
use switchboard_protocol::code;

use crate::node::{ApiError, Node};

/// Publications read from the broker at once; each page is counted into the reply until the
/// budget is reached, so a read holds at most one page beyond what it answers.
const PAGE: usize = 64;

/// Publications a read returns when it names no `limit`.
const DEFAULT_LIMIT: usize = 100;

/// The most publications one read returns, whatever its `limit`.
pub const MAX_LIMIT: usize = 10_000;

/// One answer to a history read: the publications after `since` (or the newest `limit`), oldest
/// first.
#[derive(Debug)]
pub struct HistoryPage {
    pub publications: Vec<Publication>,
    /// The channel's position when the last page was read.
    pub position: Position,
    /// False when the history no longer reached back to `since` (or its epoch is gone): the
    /// reader missed publications it cannot get back.
    pub complete: bool,
    /// True when the page ended before `limit` — past the budget, or at an epoch change between
    /// two broker pages — and more may follow the last publication: read again with `since` at
    /// its offset (in `position`'s epoch).
    pub more: bool,
}

/// Reads `channel`'s history after `since` (without it, from where the newest `limit` begin),
/// at most `limit` publications (default 100, at most [`MAX_LIMIT`]) whose `cost` — the bytes
/// each takes in the caller's reply — adds up to at most `budget`. The first publication is
/// always taken, so every read makes progress; it is bounded by
/// `limits.max_publication_bytes`. An unknown channel is 404 (a read never creates one).
pub async fn read(
    node: &Node,
    channel: &str,
    since: Option<Position>,
    limit: Option<usize>,
    budget: usize,
    mut cost: impl FnMut(&Publication) -> usize,
) -> Result<HistoryPage, ApiError> {
    let limit = limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
    let known = node.broker.last_if_known(channel).await.map_err(|e| node.broker_error(e))?;
    let Some((head, _)) = known else {
        return Err(ApiError::new(code::NOT_FOUND, "unknown channel"));
    };
    let asked_since = since.is_some();
    let newest =
        |head: &Position| Position { epoch: head.epoch.clone(), offset: head.offset.saturating_sub(limit as u64) };
    let mut from = since.unwrap_or_else(|| newest(&head));
    let (mut publications, mut used, mut more, mut complete) = (Vec::new(), 0usize, false, true);
    let mut position = head.clone();
    let (mut first_page, mut renewed) = (true, false);
    'read: while publications.len() < limit {
        let want = (limit - publications.len()).min(PAGE);
        let r = node.broker.history(channel, Some(&from), want).await.map_err(|e| node.broker_error(e))?;
        if !asked_since && first_page && !renewed && r.position.epoch != from.epoch {
            // A new epoch began since the peek: its newest publications instead.
            from = newest(&r.position);
            renewed = true;
            continue;
        }
        if !publications.is_empty() && r.position.epoch != from.epoch {
            // A new epoch began between two pages: the reply ends with the old epoch's, and the
            // reader reads the new one's from where this reply ends.
            more = true;
            break;
        }
        // Without `since`, a history that holds fewer than `limit` is what was asked for.
        if asked_since || !first_page {
            complete &= r.complete;
        }
        first_page = false;
        // A `since` of another epoch reads the current epoch's publications: the pages that
        // follow continue in it.
        from.epoch = r.position.epoch.clone();
        position = r.position;
        let got = r.publications.len();
        for p in r.publications {
            let n = cost(&p);
            if used + n > budget && !publications.is_empty() {
                more = true;
                break 'read;
            }
            used += n;
            from.offset = p.offset;
            publications.push(p);
        }
        if got < want {
            break;
        }
    }
    Ok(HistoryPage { publications, position, complete, more })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use switchboard_broker::{Broker, HistoryPolicy, MemoryBroker};

    use super::*;
    use crate::config::Config;

    async fn node_with(channel: &str, n: usize) -> Arc<Node> {
        let broker: Arc<dyn Broker> = Arc::new(MemoryBroker::new());
        let node = Node::new(Config::default(), broker.clone());
        let policy = HistoryPolicy { size: 1000, ttl: std::time::Duration::ZERO, trend: None };
        for i in 0..n {
            let data = serde_json::value::RawValue::from_string(format!("{{\"i\":{i}}}")).unwrap();
            broker.publish(channel, Arc::new(data), policy).await.unwrap();
        }
        node
    }

    #[tokio::test]
    async fn history_pages_past_the_budget_end_with_more_and_page_on_exactly_once() {
        let node = node_with("h", 200).await;
        // Each publication costs 100 bytes: 7 fit in 700.
        let first = read(&node, "h", None, Some(200), 700, |_| 100).await.unwrap();
        assert_eq!(first.publications.iter().map(|p| p.offset).collect::<Vec<_>>(), (1..=7).collect::<Vec<_>>());
        assert!(first.more && first.complete);
        let mut seen: Vec<u64> = first.publications.iter().map(|p| p.offset).collect();
        let mut since = Position { epoch: first.position.epoch.clone(), offset: 7 };
        for _ in 0..100 {
            let page = read(&node, "h", Some(since.clone()), Some(200), 700, |_| 100).await.unwrap();
            assert!(page.complete);
            seen.extend(page.publications.iter().map(|p| p.offset));
            let Some(last) = page.publications.last() else { break };
            since.offset = last.offset;
            if !page.more {
                break;
            }
        }
        assert_eq!(seen, (1..=200).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn history_takes_one_publication_larger_than_the_budget_and_says_more() {
        let node = node_with("h", 3).await;
        let page = read(&node, "h", None, None, 10, |_| 100).await.unwrap();
        assert_eq!(page.publications.len(), 1);
        assert!(page.more);
        // Within the budget: all of them, and nothing more to read.
        let page = read(&node, "h", None, None, 300, |_| 100).await.unwrap();
        assert_eq!(page.publications.len(), 3);
        assert!(!page.more);
    }

    #[tokio::test]
    async fn history_of_an_unknown_channel_is_404() {
        let node = node_with("h", 1).await;
        let e = read(&node, "other", None, None, 1000, |_| 1).await.unwrap_err();
        assert_eq!(e.code, code::NOT_FOUND);
    }
}
