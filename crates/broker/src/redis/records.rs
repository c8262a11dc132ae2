//! Record sets in Redis ([`crate::Broker::record_put`], [`crate::Broker::records`]): set `s` is
//! a hash `P:rec:{s}` (key → value) and a sorted set `P:rec:{s}:x` (key → expiry ms), both in
//! the slot of the hash tag `{s}` on a Redis Cluster. A put is one Lua script, so two nodes
//! putting at once cannot pass the bound or lose the later expiry; both keys expire (Redis's
//! own `PEXPIREAT`) with the set's last entry, so a set nobody uses again leaves nothing.

use redis::Script;

use super::Inner;
use crate::{BrokerError, Record, RecordPut};

/// KEYS[1] the values, KEYS[2] the expiries; ARGV[1] key, ARGV[2] value, ARGV[3] expiry ms,
/// ARGV[4] now ms, ARGV[5] most live entries. `{1}` stored, `{0}` kept, `{2, ms}` full until ms.
const PUT: &str = r#"
local exp, now, max = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local cur = redis.call('ZSCORE', KEYS[2], ARGV[1])
if cur then
  if tonumber(cur) >= exp then return {0} end
elseif redis.call('ZCARD', KEYS[2]) >= max then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for i = 1, #gone, 500 do
    redis.call('HDEL', KEYS[1], unpack(gone, i, math.min(i + 499, #gone)))
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= max then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {2, tonumber(first[2])}
  end
end
redis.call('ZADD', KEYS[2], exp, ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
redis.call('PEXPIREAT', KEYS[2], last[2])
return {1}
"#;

/// KEYS[1] the values, KEYS[2] the expiries; ARGV[1] now ms. Flat: key, value, expiry ms, …
/// for every entry that expires after now.
const LIVE: &str = r#"
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[1], '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  local v = redis.call('HGET', KEYS[1], live[i])
  if v then
    out[#out + 1] = live[i]
    out[#out + 1] = v
    out[#out + 1] = live[i + 1]
  end
end
return out
"#;

pub(crate) struct RecordScripts {
    put: Script,
    live: Script,
}

impl RecordScripts {
    pub(crate) fn new() -> RecordScripts {
        RecordScripts { put: Script::new(PUT), live: Script::new(LIVE) }
    }
}

impl Inner {
    /// The keys of record set `set`: its values and its expiries.
    fn record_keys(&self, set: &str) -> (String, String) {
        let values = format!("{}:rec:{{{set}}}", self.keys.prefix);
        let expiries = format!("{values}:x");
        (values, expiries)
    }

    pub(crate) async fn record_put(
        &self,
        set: &str,
        entry: &Record,
        now_ms: u64,
        max: usize,
    ) -> Result<RecordPut, BrokerError> {
        let (values, expiries) = self.record_keys(set);
        let mut call = self.records.put.key(values);
        call.key(expiries).arg(&entry.key).arg(&entry.value).arg(entry.expires_ms).arg(now_ms).arg(max);
        let answer: Vec<u64> = call.invoke_async(&mut self.conn().await?).await.map_err(|e| self.failed(e))?;
        Ok(match answer.as_slice() {
            [1] => RecordPut::Stored,
            [0] => RecordPut::Kept,
            [2, frees_ms] => RecordPut::Full { frees_ms: *frees_ms },
            other => return Err(BrokerError::Unavailable(format!("unexpected record answer {other:?}"))),
        })
    }

    pub(crate) async fn records(&self, set: &str, now_ms: u64) -> Result<Vec<Record>, BrokerError> {
        let (values, expiries) = self.record_keys(set);
        let mut call = self.records.live.key(values);
        call.key(expiries).arg(now_ms);
        let flat: Vec<String> = call.invoke_async(&mut self.conn().await?).await.map_err(|e| self.failed(e))?;
        let mut out = Vec::with_capacity(flat.len() / 3);
        let mut it = flat.into_iter();
        while let (Some(key), Some(value), Some(expires)) = (it.next(), it.next(), it.next()) {
            // Redis formats a sorted set's scores as doubles; every expiry put is a whole number.
            let expires_ms = expires.parse::<f64>().map(|e| e as u64).unwrap_or(0);
            out.push(Record { key, value, expires_ms });
        }
        Ok(out)
    }
}
