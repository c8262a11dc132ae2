//! The Lua scripts behind [`super::RedisBroker`]. Each runs atomically inside Redis, which is
//! what makes "append to history, bump the offset, store the last value, publish" one step.
//!
//! Key layout per channel `ch` (the `{ch}` hash tag keeps a channel's keys in one slot):
//! - `P:{ch}:m` hash: `e` epoch, `r` the server identity that wrote it (see [`IDENTITY`]), `o`
//!   offset, `d` last data, `t` its time (ms), `g` its tags (JSON), `lo` the last value's
//!   offset when a historical publication came after it (absent: `o`), `ttl` history ms, `h` history size, `x` when
//!   the history stream's expiry was last set to (ms), `k` the same for the hash itself (a
//!   channel unused for its keep expires: see [`crate::Broker::set_channel_ttl`])
//! - `P:{ch}:h` stream: entries `<offset>-0` with fields `d` and `t` (and `h` `1` for a
//!   historical publication, `g` its tags as JSON), capped near the history size (`MAXLEN ~`; reads return only the
//!   newest `h`)
//! - `P:{ch}:p` the pub/sub channel: `p<epoch> <offset> <ms> <data>` (`h…` for a historical
//!   publication; `P…` / `H…` with tags: `<epoch> <offset> <ms> <tags length> <tags><data>`),
//!   `j<info>`, `l<info>`
//! - `P:{ch}:pz` zset client → presence expiry (ms); `P:{ch}:pi` hash client → info JSON
//! - `P:{ch}:i:<key>` string `<epoch> <offset>`: the position of the publication published with
//!   idempotency key `<key>` (written by the publish script, expiring after
//!   [`crate::IDEMPOTENCY_WINDOW`])
//!
//! Cluster-wide: `P:nodes` zset node id → heartbeat expiry (ms), `P:node:<id>:subs` hash
//! channel → that node's subscription count. Times come from Redis `TIME`, so node clocks
//! never disagree about expiry.

use redis::Script;

/// The identity of the Redis server's data, which a channel's meta hash records (`r`): a
/// channel written under another identity may lack publications its subscribers saw, so its
/// next use starts a new epoch instead of reusing offsets. Shared by the scripts below.
///
/// The identity is the replication id (`master_replid`), which a restart and the promotion of
/// a replica both change, carried across a restart that kept every write. The server's
/// lineage record (`LINEAGE_KEY`, a hash: `id` the identity, `at` the replication id it was
/// last confirmed under, `durable` `1` when the server fsyncs every write to its append-only
/// file, noted by the nodes' heartbeat from `CONFIG GET`, see [`LINEAGE_NOTE`]) decides:
/// - the same replication id: the recorded identity;
/// - another one, with no previous replication id (`master_replid2` all zeros: a restart, not a
///   promotion) and a record saying the server was durable: the data is exactly what was
///   acknowledged, so the recorded identity stays, and with it every channel's epoch;
/// - otherwise (a promoted replica, which may not have caught up; a restart without
///   `appendfsync always`, which may have lost its last writes; no record): the new
///   replication id, so every channel starts a new epoch at its next use.
///
/// A record that cannot be read (on a Redis Cluster node whose registry slot moved away)
/// gives the replication id alone.
const IDENTITY: &str = r#"
local LINEAGE = LINEAGE_KEY
local function data_id()
  local info = redis.call('INFO', 'replication')
  local rid = string.match(info, 'master_replid:(%w+)') or ''
  local rec = redis.pcall('HMGET', LINEAGE, 'id', 'at', 'durable')
  if type(rec) ~= 'table' or rec.err then return rid end
  if rec[1] and rec[2] == rid then return rec[1] end
  local id = rid
  local before = string.match(info, 'master_replid2:(%w+)') or ''
  if rec[1] and rec[3] == '1' and not string.find(before, '[^0]') then id = rec[1] end
  redis.pcall('HSET', LINEAGE, 'id', id, 'at', rid)
  return id
end
-- A channel's keys made by a reader (a subscriber's starting point): kept `keep` ms (0:
-- forever) unless used, as by a publication.
local function create(epoch, keep)
  redis.call('HSET', KEYS[1], 'e', epoch, 'r', data_id(), 'o', 0)
  if keep > 0 then
    local t = redis.call('TIME')
    local hold = math.min(2 * keep, 1e15)
    redis.call('HSET', KEYS[1], 'k', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + hold)
    redis.call('PEXPIRE', KEYS[1], hold)
  end
end
"#;

/// Publishes a batch: KEYS meta, history for each item (a channel may repeat; its items get
/// offsets in order); ARGV[1] a seed for new epochs, then per item: data, history size,
/// history ttl ms, pub/sub channel, channel keep ms (0: forever), trend (`value;step,len,t;…` or
/// `''`), idempotency key name (`''`: none), how long it is kept (ms), `1` for a historical
/// publication (`''`: live; [`crate::Outgoing::historical`]), its tags as JSON (`''`: none).
/// One `TIME` and one
/// identity read for the whole batch.
/// Returns `{epoch, offset, ...}`, one pair per item. An item whose idempotency key exists is
/// not published: it is answered the position stored under the key (the first publication's).
/// The key is in the channel's slot (`P:{ch}:i:<key>`) but travels in ARGV, like the cluster
/// keys below.
///
/// On a Redis Cluster node the keys of many slots cannot be declared in one call, so they
/// travel in ARGV instead (no KEYS; ARGV[2] the item count, then the meta, history pairs, then
/// the items as above) and the script is flagged `allow-cross-slot-keys`. An item whose slot
/// this node does not serve (moved, or being migrated) is left untouched and answered with
/// the epoch `''`: the caller learns the new owner and sends it there, in order.
///
/// Per item: `HMGET` (epoch, offset, identity, previous ttl and size, history expiry), `XADD`
/// with an approximate cap (whole stream nodes are dropped, which is cheaper; reads skip what
/// lies beyond the size), one `HSET` (offset, value and time only, unless settings changed),
/// `PUBLISH`. The history's expiry is not pushed on every publication: it is set to twice the
/// ttl whenever less than one ttl is left (or the settings changed, or the stream is new), so
/// the stream outlives its last publication by one to two ttls (reads skip entries older
/// than the ttl anyway); a `PERSIST` when the ttl was dropped.
const PUBLISH: &str = r#"
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local rid = data_id()
local K, base = KEYS, 1
if #KEYS == 0 then
  local n = tonumber(ARGV[2])
  K = {}
  for i = 1, 2 * n do K[i] = ARGV[2 + i] end
  base = 2 + 2 * n
end
-- The trends, beside the meta key, one per tier (TREND_BUCKET). `spec` is
-- "value;step,len,t;..." for the tiers the value goes to (t: where in that tier, 0 for now;
-- used when within the tier's reach and not ahead of now, else now, or for a historical value
-- nowhere in that tier).
local function trend(base, spec, historical)
  local vs, tiers = string.match(spec, '^([^;]+)(.*)$')
  local v = tonumber(vs)
  for sstep, slen, ts in string.gmatch(tiers, ';(%d+),(%d+),(%d+)') do
    local step, len = tonumber(sstep), tonumber(slen)
    local at = tonumber(ts)
    local out = at == 0 or at > ms or at + step * len <= ms
    if out then at = ms end
    if not (out and historical) then
      local c = math.floor(math.floor(at / step) / CHUNK_BUCKETS)
      add_to_bucket(base .. sstep .. ':' .. c, step, len, at, v)
    end
  end
end
local function one(i, meta, hist, a)
  local ikey = ARGV[a + 6]
  if ikey ~= '' then
    local first = redis.call('GET', ikey)
    if first then
      local e, o = string.match(first, '^(%S+) (%d+)$')
      if e then return e, tonumber(o) end
    end
  end
  local data, size, ttl, keep = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], tonumber(ARGV[a + 4])
  local historical, tags = ARGV[a + 8] == '1', ARGV[a + 9]
  local m = redis.call('HMGET', meta, 'e', 'o', 'r', 'ttl', 'h', 'x', 'k', 'lo', 'g')
  local epoch, offset = m[1], 1
  local fresh = not (epoch and m[3] == rid)
  -- The same history settings as the last publication.
  local same = m[4] == ttl and m[5] == ARGV[a + 1]
  if fresh then
    epoch = ARGV[1] .. string.format('%x', i)
    redis.call('DEL', hist)
  else
    offset = tonumber(m[2]) + 1
  end
  -- The stream lives its history ttl past the last publication, or the channel's keep when
  -- history has no ttl or a longer one: a forgotten channel's history is never read again
  -- (its next use starts a new epoch), so it must not outlive the channel.
  local t = tonumber(ttl)
  if t == 0 or (keep > 0 and keep < t) then t = keep end
  local x
  if size > 0 then
    local e = {'d', data, 't', ms}
    if historical then e[#e + 1] = 'h'; e[#e + 1] = 1 end
    if tags ~= '' then e[#e + 1] = 'g'; e[#e + 1] = tags end
    redis.call('XADD', hist, 'MAXLEN', '~', size, offset .. '-0', unpack(e))
    if t > 0 then
      if fresh or not same or (tonumber(m[6]) or 0) - ms < t then
        local hold = math.min(2 * t, 1e15)
        x = ms + hold
        redis.call('PEXPIRE', hist, hold)
      end
    elseif m[6] and m[6] ~= '0' then
      x = 0
      redis.call('PERSIST', hist)
    end
  elseif m[5] ~= '0' then
    redis.call('DEL', hist)
  end
  -- The channel itself lives its keep past its last use.
  local k, hold
  if keep > 0 then
    if fresh or (tonumber(m[7]) or 0) - ms < keep then
      hold = math.min(2 * keep, 1e15)
      k = ms + hold
    end
  elseif m[7] and m[7] ~= '0' then
    k = 0
  end
  -- A historical value leaves the last value as it was: `lo` then keeps its offset (absent
  -- while the last value is the newest publication). `g` holds the last value's tags.
  local f = {'o', offset}
  if not historical then
    f[3] = 'd'; f[4] = data; f[5] = 't'; f[6] = ms
    if tags ~= '' then f[7] = 'g'; f[8] = tags end
    if m[8] then redis.call('HDEL', meta, 'lo') end
    if m[9] and tags == '' then redis.call('HDEL', meta, 'g') end
  elseif fresh then
    redis.call('HDEL', meta, 'd', 't', 'lo', 'g')
  elseif not m[8] then
    f[3] = 'lo'; f[4] = m[2]
  end
  if fresh then
    f[#f + 1] = 'e'; f[#f + 1] = epoch; f[#f + 1] = 'r'; f[#f + 1] = rid
  end
  if fresh or not same then
    f[#f + 1] = 'ttl'; f[#f + 1] = ttl; f[#f + 1] = 'h'; f[#f + 1] = size
  end
  if x then f[#f + 1] = 'x'; f[#f + 1] = x end
  if k then f[#f + 1] = 'k'; f[#f + 1] = k end
  redis.call('HSET', meta, unpack(f))
  if hold then
    redis.call('PEXPIRE', meta, hold)
  elseif k == 0 then
    redis.call('PERSIST', meta)
  end
  local tr = ARGV[a + 5]
  if tr ~= '' then
    trend(string.sub(meta, 1, -2) .. 't:', tr, historical)
  end
  local kind = historical and 'h' or 'p'
  if tags == '' then
    redis.call('PUBLISH', ARGV[a + 3], kind .. epoch .. ' ' .. offset .. ' ' .. ms .. ' ' .. data)
  else
    local head = string.upper(kind) .. epoch .. ' ' .. offset .. ' ' .. ms .. ' ' .. #tags .. ' '
    redis.call('PUBLISH', ARGV[a + 3], head .. tags .. data)
  end
  if ikey ~= '' then
    redis.call('SET', ikey, epoch .. ' ' .. offset, 'PX', ARGV[a + 7])
  end
  return epoch, offset
end
local out = {}
for i = 1, #K / 2 do
  local meta, hist = K[2 * i - 1], K[2 * i]
  if here(meta, hist) then
    out[2 * i - 1], out[2 * i] = one(i, meta, hist, base + 1 + (i - 1) * 10)
  else
    out[2 * i - 1], out[2 * i] = '', 0
  end
end
return out
"#;

/// Adds one value to its trend bucket, for [`PUBLISH`]. The
/// buckets of chunk `c` of the tier of `step` (CHUNK_BUCKETS buckets from bucket
/// `c * CHUNK_BUCKETS`) are a string `P:{ch}:t:<step>:<c>`: CHUNK_BUCKETS 28-byte slots — min,
/// max and last as big-endian doubles and the count, 0 for a bucket without values — then one
/// 4-byte big-endian offset per slot, the time of its last from the bucket's start (a chunk
/// written without the offsets reads them as 0). Both are updated in place; nodes compress
/// closed chunks into the hash `P:{ch}:tz:<step>` (crate::redis::trend_store). A value becomes
/// its bucket's last unless the last's time is later (crate::trend, "Historical values"). A
/// chunk string expires once its last bucket is out of reach.
const TREND_BUCKET: &str = r#"
local function add_to_bucket(key, step, len, at, v)
  local slot = math.floor(at / step)
  local c = math.floor(slot / CHUNK_BUCKETS)
  local i = slot % CHUNK_BUCKETS
  local off, toff = i * 28, CHUNK_BUCKETS * 28 + i * 4
  local dt = math.min(at - slot * step, 4294967295)
  local cur = redis.call('GETRANGE', key, off, off + 27)
  local mn, mx, last, n, later = v, v, v, 0, true
  if #cur == 28 then
    local a, b, l, k = struct.unpack('>dddI4', cur)
    if k > 0 then
      mn, mx, n = math.min(a, v), math.max(b, v), k
      local was = redis.call('GETRANGE', key, toff, toff + 3)
      if #was == 4 and struct.unpack('>I4', was) > dt then
        last, later = l, false
      end
    end
  end
  redis.call('SETRANGE', key, off, struct.pack('>dddI4', mn, mx, last, n + 1))
  if later then
    redis.call('SETRANGE', key, toff, struct.pack('>I4', dt))
  end
  if n == 0 then
    redis.call('PEXPIREAT', key, ((c + 1) * CHUNK_BUCKETS + len) * step)
  end
end
"#;

/// Replaces a closed raw trend chunk by its compressed form: KEYS raw chunk, compressed hash;
/// ARGV the SHA-1 of the raw chunk and of the hash field (`''`: none) as the node read them,
/// the field (the chunk number), the compressed bytes, when the chunk leaves the trend's reach
/// (unix ms) and the oldest chunk number still in reach. Nothing is done (0) when either
/// changed since the node read them (a late value, another node compacting): the node reads
/// them again. Fields out of reach are dropped; the hash lives until its newest chunk is out of
/// reach.
const TREND_COMPACT: &str = r#"
local raw = redis.call('GET', KEYS[1])
if not raw or redis.sha1hex(raw) ~= ARGV[1] then return 0 end
local old = redis.call('HGET', KEYS[2], ARGV[3])
if (old and redis.sha1hex(old) or '') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('DEL', KEYS[1])
local oldest = tonumber(ARGV[6])
for _, f in ipairs(redis.call('HKEYS', KEYS[2])) do
  if (tonumber(f) or 0) < oldest then redis.call('HDEL', KEYS[2], f) end
end
local now = redis.call('TIME')
local left = tonumber(ARGV[5]) - (tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
if redis.call('PTTL', KEYS[2]) < left then
  redis.call('PEXPIRE', KEYS[2], math.max(left, 1))
end
return 1
"#;

/// Whether this server holds a channel's keys: always on a single Redis; on a Cluster node,
/// whether it serves their slot now (an access to another node's key is an error, caught).
const HERE_SINGLE: &str = "local function here(meta, hist) return true end\n";
const HERE_CLUSTER: &str = r#"#!lua flags=allow-cross-slot-keys
local function here(meta, hist)
  return type(redis.pcall('EXISTS', meta, hist)) == 'number'
end
"#;

/// Position and last value: KEYS meta, history; ARGV an epoch to use if the channel has none,
/// the channel's keep ms.
/// Returns `{epoch, offset, the last value's offset, its tags (`''`: none), last data or nil,
/// its time or nil}`.
/// Reads do not check the server identity: a promoted replica's older position makes
/// recovering readers `complete: false`, and the next publication starts the new epoch.
const POSITION: &str = r#"
local m = redis.call('HMGET', KEYS[1], 'e', 'o', 'd', 't', 'lo', 'g')
local epoch = m[1]
if not epoch then
  epoch = ARGV[1]
  redis.call('DEL', KEYS[2])
  create(epoch, tonumber(ARGV[2]))
end
local o = tonumber(m[2]) or 0
return {epoch, o, tonumber(m[5]) or o, m[6] or '', m[3], m[4]}
"#;

/// Position and last value of a known channel, creating nothing: KEYS meta. Returns `nil` for
/// an unknown channel, else as [`POSITION`].
const PEEK: &str = r#"
local m = redis.call('HMGET', KEYS[1], 'e', 'o', 'd', 't', 'lo', 'g')
if not m[1] then return nil end
local o = tonumber(m[2]) or 0
return {m[1], o, tonumber(m[5]) or o, m[6] or '', m[3], m[4]}
"#;

/// History: KEYS meta, history; ARGV an epoch to use if the channel has none, the reader's
/// epoch (`''`: no position, the newest entries), its offset, the limit, the channel's keep ms.
/// Returns `{epoch, offset, complete (0/1), {{offset, ms, data, historical (0/1), tags (`''`:
/// none)}, ...}}`, oldest first.
/// Entries older than the namespace's history TTL count as gone, as in the memory broker.
const HISTORY: &str = r#"
local epoch = redis.call('HGET', KEYS[1], 'e')
if not epoch then
  epoch = ARGV[1]
  redis.call('DEL', KEYS[2])
  create(epoch, tonumber(ARGV[5]))
end
local m = redis.call('HMGET', KEYS[1], 'o', 'ttl', 'h')
local offset = tonumber(m[1]) or 0
local ttl = tonumber(m[2]) or 0
-- The stream is trimmed approximately (`MAXLEN ~`): entries at or below `floor` are beyond
-- the history size and count as gone.
local floor = 0
local keep = tonumber(m[3])
if keep and keep > 0 then floor = offset - keep end
local cutoff = 0
if ttl > 0 then
  local now = redis.call('TIME')
  cutoff = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - ttl
end
local limit = tonumber(ARGV[4])
-- COUNT 0 answers nil inside a script: read one entry (for `complete`) and return none.
local none = limit == 0
if none then limit = 1 end
local function entry(e)
  local off = tonumber(string.match(e[1], '^(%d+)'))
  local f = e[2]
  local d, t, h, g = nil, nil, 0, ''
  for i = 1, #f, 2 do
    local k = f[i]
    if k == 'd' then d = f[i + 1] elseif k == 't' then t = tonumber(f[i + 1])
    elseif k == 'h' then h = 1 elseif k == 'g' then g = f[i + 1] end
  end
  return off, t or 0, d, h, g
end
local out = {}
if ARGV[2] == '' then
  if none then return {epoch, offset, 1, out} end
  local entries = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', limit)
  for i = #entries, 1, -1 do
    local off, t, d, h, g = entry(entries[i])
    if t >= cutoff and off > floor then out[#out + 1] = {off, t, d, h, g} end
  end
  return {epoch, offset, 1, out}
end
local since = tonumber(ARGV[3])
-- A position of another epoch: what the reader had is lost, but everything this epoch holds
-- is new to it, from its first offset. A position ahead of the channel in its own epoch: the
-- reader has every offset kept here, and more that are lost.
local lost = ARGV[2] ~= epoch
if lost then
  since = 0
elseif since > offset then
  return {epoch, offset, 0, out}
end
if since == offset then
  if lost then return {epoch, offset, 0, out} end
  return {epoch, offset, 1, out}
end
local entries = redis.call('XRANGE', KEYS[2], (math.max(since, floor) + 1) .. '-0', '+', 'COUNT', limit)
local complete = 0
for i = 1, #entries do
  local off, t, d, h, g = entry(entries[i])
  if t >= cutoff then
    if i == 1 and off == since + 1 and not lost then complete = 1 end
    if not none then out[#out + 1] = {off, t, d, h, g} end
  end
end
return {epoch, offset, complete, out}
"#;

/// Sweeps expired presence entries (their node stopped refreshing them), publishing a leave
/// for each. Shared by the presence scripts below; expects KEYS zset, hash and `pubsub`.
const SWEEP: &str = r#"
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
local function sweep(now, pubsub)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
  for _, c in ipairs(dead) do
    local info = redis.call('HGET', KEYS[2], c)
    redis.call('ZREM', KEYS[1], c)
    redis.call('HDEL', KEYS[2], c)
    if info then redis.call('PUBLISH', pubsub, 'l' .. info) end
  end
end
"#;

/// KEYS zset, hash; ARGV client, info JSON, ttl ms, pub/sub channel. Publishes a join when
/// the client was not present yet. Returns 1 when added.
const PRESENCE_ADD: &str = r#"
local now = now_ms()
local added = redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if added == 1 then redis.call('PUBLISH', ARGV[4], 'j' .. ARGV[2]) end
return added
"#;

/// KEYS zset, hash; ARGV client, pub/sub channel. Publishes a leave when it was present.
const PRESENCE_REMOVE: &str = r#"
local info = redis.call('HGET', KEYS[2], ARGV[1])
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if removed == 1 and info then redis.call('PUBLISH', ARGV[2], 'l' .. info) end
return removed
"#;

/// KEYS zset, hash; ARGV pub/sub channel. Returns the info JSON of every live member.
const PRESENCE_LIST: &str = r#"
sweep(now_ms(), ARGV[1])
return redis.call('HVALS', KEYS[2])
"#;

/// Heartbeat of one node's present clients on a channel: KEYS zset, hash; ARGV ttl ms, mode
/// (`1`: re-add with info, after a reconnect; `0`: extend only the entries still there), pub/sub
/// channel, then client, info pairs. Also sweeps entries of dead nodes.
const PRESENCE_REFRESH: &str = r#"
local now = now_ms()
local ttl = tonumber(ARGV[1])
for i = 4, #ARGV, 2 do
  if ARGV[2] == '1' then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  else
    redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i])
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
sweep(now, ARGV[3])
return 1
"#;

/// Node heartbeat: KEYS nodes zset, this node's subscription hash; ARGV node id, ttl ms,
/// replace (`1`: the counts below replace the hash), then channel, count pairs.
const NODE_BEAT: &str = r#"
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], ms + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ms)
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[2])
  for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
end
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
"#;

/// KEYS nodes zset; ARGV key prefix. Returns `{node id, {channel, count, ...}, ...}` for the
/// live nodes. Reads keys it was not given, so it suits a single Redis, not Redis Cluster.
const CLUSTER: &str = r#"
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], ms, '+inf')
local out = {}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGETALL', ARGV[1] .. ':node:' .. id .. ':subs')
end
return out
"#;

/// A channel's offsets went backwards within its epoch (a rollback the data identity did not
/// reveal): KEYS meta; ARGV the epoch seen, a new one. Replaces the epoch when it is still the
/// one seen (a compare-and-set: of several nodes noticing, one changes it), so offsets
/// reused from here on never pass for the publications clients saw. Returns 1 when changed.
const EPOCH_BUMP: &str = r#"
if redis.call('HGET', KEYS[1], 'e') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'e', ARGV[2])
  return 1
end
return 0
"#;

/// The heartbeat's lineage note (see [`IDENTITY`]): confirms the identity (so a promotion is
/// recorded within one heartbeat even when nothing is published), then records ARGV[1], `1`
/// when the server is durable, `0` when not, `''` when the node could not tell (`CONFIG` not
/// allowed), which leaves the record as it was. Returns the identity.
const LINEAGE_NOTE: &str = r#"
local id = data_id()
if ARGV[1] ~= '' then redis.pcall('HSET', LINEAGE, 'durable', ARGV[1]) end
return id
"#;

/// The compiled scripts; Redis caches them by SHA1 (`EVALSHA`, reloaded after a restart).
pub(super) struct Scripts {
    pub publish: Script,
    pub position: Script,
    pub peek: Script,
    pub history: Script,
    pub presence_add: Script,
    pub presence_remove: Script,
    pub presence_list: Script,
    pub presence_refresh: Script,
    pub node_beat: Script,
    pub cluster: Script,
    pub epoch_bump: Script,
    pub lineage_note: Script,
    pub trend_compact: Script,
}

impl Scripts {
    /// `cluster`: for a Redis Cluster node, where publications go out with sharded pub/sub
    /// (`SPUBLISH`, delivered only by the nodes serving the channel's slot) and the publish
    /// script takes its keys in ARGV (see [`PUBLISH`]). `lineage`: the key of the server's
    /// lineage record (see [`IDENTITY`]).
    pub fn new(cluster: bool, lineage: &str) -> Scripts {
        let text =
            |body: String| if cluster { body.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'") } else { body };
        let script = |body: &str| Script::new(&text(body.to_string()));
        let with_sweep = |body: &str| Script::new(&text(format!("{SWEEP}{body}")));
        let identity = IDENTITY.replace("LINEAGE_KEY", &lua_string(lineage));
        let with_identity = |body: &str| Script::new(&text(format!("{identity}{body}")));
        let here = if cluster { HERE_CLUSTER } else { HERE_SINGLE };
        let chunk = |body: String| body.replace("CHUNK_BUCKETS", &crate::trend::ring::CHUNK_BUCKETS.to_string());
        Scripts {
            publish: Script::new(&chunk(text(format!("{here}{identity}{TREND_BUCKET}{PUBLISH}")))),
            trend_compact: script(TREND_COMPACT),
            position: with_identity(POSITION),
            peek: script(PEEK),
            history: with_identity(HISTORY),
            presence_add: with_sweep(PRESENCE_ADD),
            presence_remove: script(PRESENCE_REMOVE),
            presence_list: with_sweep(PRESENCE_LIST),
            presence_refresh: with_sweep(PRESENCE_REFRESH),
            node_beat: script(NODE_BEAT),
            cluster: script(CLUSTER),
            epoch_bump: script(EPOCH_BUMP),
            lineage_note: with_identity(LINEAGE_NOTE),
        }
    }
}

/// `s` as a Lua string literal: every byte but letters, digits and `:{}_.-` as a `\ddd` escape.
fn lua_string(s: &str) -> String {
    let mut out = String::from("'");
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b":{}_.-".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\{b:03}"));
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::lua_string;

    #[test]
    fn broker_redis_lua_strings_escape_what_could_end_them() {
        assert_eq!(lua_string("sb:{a-1}:lineage"), "'sb:{a-1}:lineage'");
        assert_eq!(lua_string("a'b\\c d"), "'a\\039b\\092c\\032d'");
    }
}
