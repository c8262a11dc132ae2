//! Leases in Redis ([`crate::Broker::lease`]): one key per lease, `P:lease:{name}`, holding
//! the holder's id with a millisecond expiry. Taking, renewing and releasing are each one Lua
//! script, so two nodes asking at once cannot both win: the key is set only when it is absent
//! or already names the asker. The expiry is Redis's own (`PX`), so node clocks play no part.

use std::time::Duration;

use redis::Script;

use super::Inner;
use crate::BrokerError;

/// KEYS[1] the lease key; ARGV[1] the holder, ARGV[2] the ttl in ms. 1 when the holder holds
/// the lease now (taken or renewed), 0 when another does.
const TAKE: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"#;

/// KEYS[1] the lease key; ARGV[1] the holder. Deletes it only when the holder holds it.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

pub(crate) struct Leases {
    take: Script,
    release: Script,
}

impl Leases {
    pub(crate) fn new() -> Leases {
        Leases { take: Script::new(TAKE), release: Script::new(RELEASE) }
    }
}

impl Inner {
    /// The key of lease `name`; the `{...}` hash tag keeps it whole on a Redis Cluster.
    pub(crate) fn lease_key(&self, name: &str) -> String {
        format!("{}:lease:{{{name}}}", self.keys.prefix)
    }

    pub(crate) async fn lease(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, BrokerError> {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut call = self.leases.take.key(self.lease_key(name));
        call.arg(holder).arg(ms);
        let held: i64 = call.invoke_async(&mut self.conn().await?).await.map_err(|e| self.failed(e))?;
        Ok(held == 1)
    }

    pub(crate) async fn lease_release(&self, name: &str, holder: &str) -> Result<(), BrokerError> {
        let mut call = self.leases.release.key(self.lease_key(name));
        call.arg(holder);
        let _: i64 = call.invoke_async(&mut self.conn().await?).await.map_err(|e| self.failed(e))?;
        Ok(())
    }
}
