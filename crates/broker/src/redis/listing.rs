//! Paged channel listings from Redis: `SCAN` over the channels' meta keys, a bounded number of
//! calls per page, the server's cursor handed back to the caller. Nothing is kept per listing
//! and no index is written on the publish path, so listings cost nothing until asked for.
//!
//! `SCAN` returns every key present from the first call to the last; a key may come twice
//! only while the keyspace shrinks (Redis resizes its table down), so a listing that runs
//! while channels expire may repeat one.

use std::sync::Arc;

use super::{Inner, RedisBroker};
use crate::{BrokerError, ChannelPage, ChannelQuery, ChannelSummary, Position};

/// Most `SCAN` calls one page makes: a page of a sparse prefix may come back short (with a
/// cursor to go on) rather than walk the whole keyspace in one request.
const SCAN_ROUNDS: usize = 16;

impl Inner {
    /// One page of this server's channels; the cursor is Redis's (decimal, `0` = start).
    pub(super) async fn channel_page(&self, query: &ChannelQuery<'_>) -> Result<ChannelPage, BrokerError> {
        let mut cursor: u64 = match query.cursor {
            None => 0,
            Some(c) => c.parse().map_err(|_| BrokerError::BadCursor("not a cursor of this listing".into()))?,
        };
        let limit = query.limit.max(1);
        // Channel names hold no glob characters (`*?[]\` are not allowed in them).
        let pattern = format!("{}:{{{}*}}:m", self.keys.prefix, query.prefix);
        let mut conn = self.conn().await?;
        let mut names: Vec<String> = Vec::new();
        for _ in 0..SCAN_ROUNDS {
            // Meta keys are about half the keys (history streams the rest): ask for twice the
            // channels still missing.
            let count = (2 * (limit - names.len().min(limit))).clamp(20, 20_000);
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(count)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.failed(e))?;
            // Internal channels (`$…`, messages between nodes) are never listed.
            let listed = keys.iter().filter_map(|k| self.keys.channel_of_meta(k)).filter(|ch| !ch.starts_with('$'));
            names.extend(listed.map(str::to_string));
            cursor = next;
            if cursor == 0 || names.len() >= limit {
                break;
            }
        }
        names.sort();
        names.dedup();
        let mut channels = Vec::with_capacity(names.len());
        for chunk in names.chunks(1000) {
            let mut pipe = redis::pipe();
            for ch in chunk {
                pipe.cmd("HMGET").arg(self.keys.meta(ch)).arg("e").arg("o");
            }
            let rows: Vec<(Option<String>, Option<u64>)> =
                pipe.query_async(&mut conn).await.map_err(|e| self.failed(e))?;
            for (ch, (epoch, offset)) in chunk.iter().zip(rows) {
                // Expired between the SCAN and the read: gone.
                if let Some(epoch) = epoch {
                    channels.push(ChannelSummary {
                        channel: Arc::from(ch.as_str()),
                        position: Position { epoch: epoch.into(), offset: offset.unwrap_or(0) },
                    });
                }
            }
        }
        Ok(ChannelPage { channels, next: (cursor != 0).then(|| cursor.to_string()) })
    }
}

/// Pages through several Redis servers (shards, Cluster primaries) one after the other: the
/// cursor is `<server index>.<that server's cursor>`. The servers must come in the same order
/// on every call (a topology change between pages may skip or repeat channels).
pub(crate) async fn page_over(parts: &[&RedisBroker], query: &ChannelQuery<'_>) -> Result<ChannelPage, BrokerError> {
    let bad = || BrokerError::BadCursor("not a cursor of this listing".into());
    let (mut part, mut inner_cursor) = match query.cursor {
        None => (0, None),
        Some(c) => {
            let (p, rest) = c.split_once('.').ok_or_else(bad)?;
            let p: usize = p.parse().map_err(|_| bad())?;
            (p, (rest != "0").then_some(rest))
        }
    };
    let limit = query.limit.max(1);
    let mut page = ChannelPage::default();
    while part < parts.len() && page.channels.len() < limit {
        let q = ChannelQuery { prefix: query.prefix, cursor: inner_cursor, limit: limit - page.channels.len() };
        let got = parts[part].inner.channel_page(&q).await?;
        page.channels.extend(got.channels);
        match got.next {
            Some(next) => {
                page.next = Some(format!("{part}.{next}"));
                // One server's bounded walk per page at most once it came back short.
                return Ok(page);
            }
            None => {
                part += 1;
                inner_cursor = None;
            }
        }
    }
    page.next = (part < parts.len()).then(|| format!("{part}.0"));
    Ok(page)
}
