//! Tables and logs in Redis ([`crate::kept`]): table `t` is the hash `P:tab:{t}`, log `l` the
//! stream `P:log:{l}` (its entries' field `e`), each in the slot of its hash tag on a Redis
//! Cluster. An append trims the stream by count (`MAXLEN ~`) and by age (`MINID ~`) in the
//! same round trip; Redis trims whole macro nodes, so a log may hold a little more than asked.
//! A table is read with `HSCAN`, never one reply the size of the table.

use redis::Value;

use super::Inner;
use crate::kept::Cursor;
use crate::{now_ms, BrokerError, LogEntry, LogKeep};

/// Entries asked of Redis per `HSCAN` step.
const SCAN_COUNT: usize = 1000;

impl Inner {
    fn table_key(&self, name: &str) -> String {
        format!("{}:tab:{{{name}}}", self.keys.prefix)
    }

    fn log_key(&self, name: &str) -> String {
        format!("{}:log:{{{name}}}", self.keys.prefix)
    }

    pub(crate) async fn table_put(&self, name: &str, key: &str, value: &str) -> Result<(), BrokerError> {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(self.table_key(name)).arg(key).arg(value);
        cmd.query_async::<()>(&mut self.conn().await?).await.map_err(|e| self.failed(e))
    }

    pub(crate) async fn table_remove(&self, name: &str, key: &str) -> Result<(), BrokerError> {
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(self.table_key(name)).arg(key);
        cmd.query_async::<()>(&mut self.conn().await?).await.map_err(|e| self.failed(e))
    }

    pub(crate) async fn table_all(&self, name: &str) -> Result<Vec<(String, String)>, BrokerError> {
        let key = self.table_key(name);
        let mut conn = self.conn().await?;
        let (mut cursor, mut out) = (0u64, Vec::new());
        loop {
            let mut cmd = redis::cmd("HSCAN");
            cmd.arg(&key).arg(cursor).arg("COUNT").arg(SCAN_COUNT);
            let (next, flat): (u64, Vec<String>) = cmd.query_async(&mut conn).await.map_err(|e| self.failed(e))?;
            let mut it = flat.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            if next == 0 {
                // HSCAN may return a key twice across steps.
                out.sort_unstable();
                out.dedup_by(|a, b| a.0 == b.0);
                return Ok(out);
            }
            cursor = next;
        }
    }

    pub(crate) async fn log_append(&self, name: &str, entry: &str, keep: LogKeep) -> Result<String, BrokerError> {
        let key = self.log_key(name);
        let mut pipe = redis::pipe();
        pipe.cmd("XADD").arg(&key).arg("MAXLEN").arg("~").arg(keep.max_entries).arg("*").arg("e").arg(entry);
        if keep.max_age_ms > 0 {
            let oldest = now_ms().saturating_sub(keep.max_age_ms);
            pipe.cmd("XTRIM").arg(&key).arg("MINID").arg("~").arg(oldest).ignore();
        }
        let (id,): (String,) = pipe.query_async(&mut self.conn().await?).await.map_err(|e| self.failed(e))?;
        Ok(id)
    }

    pub(crate) async fn log_read(
        &self,
        name: &str,
        before: Option<&str>,
        count: usize,
    ) -> Result<Vec<LogEntry>, BrokerError> {
        let end = match before {
            Some(b) => format!("({}", Cursor::parse(b).ok_or_else(|| BrokerError::BadCursor(b.to_string()))?),
            None => "+".to_string(),
        };
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(self.log_key(name)).arg(end).arg("-").arg("COUNT").arg(count.max(1));
        let reply: Value = cmd.query_async(&mut self.conn().await?).await.map_err(|e| self.failed(e))?;
        Ok(entries(reply))
    }
}

/// The entries of an `XREVRANGE` reply: `[[id, [field, value, …]], …]`, the value of field `e`.
fn entries(reply: Value) -> Vec<LogEntry> {
    let Value::Array(items) = reply else { return Vec::new() };
    items
        .into_iter()
        .filter_map(|item| {
            let Value::Array(mut pair) = item else { return None };
            let fields = pair.pop()?;
            let cursor: String = redis::from_redis_value(pair.pop()?).ok()?;
            let fields: Vec<String> = redis::from_redis_value(fields).ok()?;
            let entry = fields.chunks(2).find(|kv| kv[0] == "e").and_then(|kv| kv.get(1)).cloned()?;
            Some(LogEntry { cursor, entry })
        })
        .collect()
}
