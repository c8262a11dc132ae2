//! [`MemoryBroker`]: the embedded broker of a single node. Nothing survives a restart, so every
//! channel gets a fresh random epoch when it is first used in a process: a client recovering
//! with an offset from before the restart learns `complete: false` instead of silently missing
//! publications.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};

use crate::{
    now_ms, Broker, BrokerError, BrokerHandler, ChannelSummary, ClientInfo, Data, HistoryPolicy, HistoryResult,
    Outgoing, Position, Publication,
};

/// One channel's stream. Guarded by its own mutex so channels never wait on each other.
struct Stream {
    epoch: Arc<str>,
    offset: u64,
    history: VecDeque<Publication>,
    last: Option<Publication>,
}

impl Stream {
    fn new() -> Stream {
        Stream { epoch: new_epoch(), offset: 0, history: VecDeque::new(), last: None }
    }

    fn position(&self) -> Position {
        Position { epoch: self.epoch.clone(), offset: self.offset }
    }

    fn expire(&mut self, policy_ttl_ms: u64, now: u64) {
        while let Some(front) = self.history.front() {
            if now.saturating_sub(front.time_ms) > policy_ttl_ms {
                self.history.pop_front();
            } else {
                break;
            }
        }
    }
}

fn new_epoch() -> Arc<str> {
    format!("{:08x}", fastrand::u32(..)).into()
}

/// The in-memory broker.
///
/// Locking: the channel map's `RwLock` is held only to find or create a stream; a stream's
/// `Mutex` is held across offset assignment, history append and the handler's
/// `on_publication` (which only enqueues), which is what makes those one atomic step. The
/// handler's `after_publications` (socket writes) runs after the stream lock is released.
/// Lock order: `streams` map, then one stream; `presence` is never held with either.
#[derive(Default)]
pub struct MemoryBroker {
    streams: RwLock<HashMap<Arc<str>, Arc<Mutex<Stream>>>>,
    presence: Mutex<HashMap<Arc<str>, Vec<ClientInfo>>>,
    /// History TTL per channel, remembered from the last publish (reads use it to expire).
    ttl_ms: RwLock<HashMap<Arc<str>, u64>>,
    handler: OnceLock<Arc<dyn BrokerHandler>>,
}

impl MemoryBroker {
    pub fn new() -> MemoryBroker {
        MemoryBroker::default()
    }

    fn stream(&self, channel: &str) -> Arc<Mutex<Stream>> {
        if let Some(s) = self.streams.read().get(channel) {
            return s.clone();
        }
        let mut map = self.streams.write();
        map.entry(Arc::from(channel)).or_insert_with(|| Arc::new(Mutex::new(Stream::new()))).clone()
    }

    fn ttl_of(&self, channel: &str) -> u64 {
        self.ttl_ms.read().get(channel).copied().unwrap_or(u64::MAX)
    }

    /// Assigns the next offset, keeps history and hands the publication to the handler, under
    /// the stream's lock; the caller runs `after_publications` once the lock is released.
    fn append(&self, channel: &str, data: Data, policy: HistoryPolicy) -> Position {
        let stream = self.stream(channel);
        let ttl_ms = policy.ttl.as_millis() as u64;
        if policy.size > 0 && self.ttl_ms.read().get(channel) != Some(&ttl_ms) {
            self.ttl_ms.write().insert(Arc::from(channel), ttl_ms);
        }
        let mut s = stream.lock();
        s.offset += 1;
        let now = now_ms();
        let publication = Publication { offset: s.offset, data, time_ms: now };
        if policy.size > 0 {
            s.history.push_back(publication.clone());
            while s.history.len() > policy.size {
                s.history.pop_front();
            }
            s.expire(ttl_ms, now);
        } else if !s.history.is_empty() {
            s.history.clear();
        }
        if let Some(h) = self.handler.get() {
            h.on_publication(channel, &publication);
        }
        s.last = Some(publication);
        s.position()
    }
}

#[async_trait::async_trait]
impl Broker for MemoryBroker {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn set_handler(&self, handler: Arc<dyn BrokerHandler>) {
        let _ = self.handler.set(handler);
    }

    async fn publish(&self, channel: &str, data: Data, policy: HistoryPolicy) -> Result<Position, BrokerError> {
        let position = self.append(channel, data, policy);
        if let Some(h) = self.handler.get() {
            h.after_publications();
        }
        Ok(position)
    }

    async fn publish_batch(&self, items: Vec<Outgoing>) -> Vec<Result<Position, BrokerError>> {
        let out = items.into_iter().map(|i| Ok(self.append(&i.channel, i.data, i.policy))).collect();
        if let Some(h) = self.handler.get() {
            h.after_publications();
        }
        out
    }

    async fn subscribe(&self, _channel: &str) -> Result<(), BrokerError> {
        // Every publication already reaches this (only) node's handler.
        Ok(())
    }

    async fn unsubscribe(&self, _channel: &str) -> Result<(), BrokerError> {
        Ok(())
    }

    async fn last(&self, channel: &str) -> Result<(Position, Option<Publication>), BrokerError> {
        let stream = self.stream(channel);
        let s = stream.lock();
        Ok((s.position(), s.last.clone()))
    }

    async fn peek(&self, channel: &str) -> Result<Option<(Position, Option<Publication>)>, BrokerError> {
        let Some(stream) = self.streams.read().get(channel).cloned() else { return Ok(None) };
        let s = stream.lock();
        Ok(Some((s.position(), s.last.clone())))
    }

    async fn history(
        &self,
        channel: &str,
        since: Option<&Position>,
        limit: usize,
    ) -> Result<HistoryResult, BrokerError> {
        let ttl = self.ttl_of(channel);
        let stream = self.stream(channel);
        let mut s = stream.lock();
        s.expire(ttl, now_ms());
        let position = s.position();
        let Some(since) = since else {
            let skip = s.history.len().saturating_sub(limit);
            let publications = s.history.iter().skip(skip).cloned().collect();
            return Ok(HistoryResult { publications, position, complete: true });
        };
        if since.epoch != s.epoch || since.offset > s.offset {
            // Offsets of another epoch mean nothing here: the reader must re-read state.
            return Ok(HistoryResult { publications: Vec::new(), position, complete: false });
        }
        let oldest_kept = s.history.front().map(|p| p.offset).unwrap_or(s.offset + 1);
        let complete = since.offset + 1 >= oldest_kept;
        let publications = s.history.iter().filter(|p| p.offset > since.offset).take(limit).cloned().collect();
        Ok(HistoryResult { publications, position, complete })
    }

    async fn presence_add(&self, channel: &str, info: ClientInfo) -> Result<(), BrokerError> {
        {
            let mut map = self.presence.lock();
            let list = map.entry(Arc::from(channel)).or_default();
            if list.iter().any(|c| c.client == info.client) {
                return Ok(());
            }
            list.push(info.clone());
        }
        if let Some(h) = self.handler.get() {
            h.on_presence(channel, &info, true);
            h.after_publications();
        }
        Ok(())
    }

    async fn presence_remove(&self, channel: &str, client: &str) -> Result<(), BrokerError> {
        let removed = {
            let mut map = self.presence.lock();
            let Some(list) = map.get_mut(channel) else { return Ok(()) };
            let removed = list.iter().position(|c| c.client == client).map(|i| list.swap_remove(i));
            if list.is_empty() {
                map.remove(channel);
            }
            removed
        };
        if let (Some(info), Some(h)) = (removed, self.handler.get()) {
            h.on_presence(channel, &info, false);
            h.after_publications();
        }
        Ok(())
    }

    async fn presence(&self, channel: &str) -> Result<Vec<ClientInfo>, BrokerError> {
        Ok(self.presence.lock().get(channel).cloned().unwrap_or_default())
    }

    async fn channels(&self) -> Result<Vec<ChannelSummary>, BrokerError> {
        let streams: Vec<(Arc<str>, Arc<Mutex<Stream>>)> =
            self.streams.read().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Ok(streams.into_iter().map(|(channel, s)| ChannelSummary { channel, position: s.lock().position() }).collect())
    }

    async fn ready(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn broker_memory_passes_the_conformance_suite() {
        crate::conformance::run_all(|| Arc::new(MemoryBroker::new()) as Arc<dyn Broker>).await;
    }

    #[tokio::test]
    async fn broker_memory_new_process_means_new_epoch() {
        let a = MemoryBroker::new();
        let b = MemoryBroker::new();
        let pa = a.last("x").await.unwrap().0;
        let pb = b.last("x").await.unwrap().0;
        assert_ne!(pa.epoch, pb.epoch);
    }
}
