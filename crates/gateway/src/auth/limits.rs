//! Abuse limits that need state: WebSocket connections and handshakes per client address,
//! publishes per connection, per API key and per user (HTTP publishes with a token or Basic
//! credentials). All token buckets, refilled continuously, holding twice the per-second rate so
//! short bursts pass.
//!
//! The per-address table is one `parking_lot::Mutex` around a map: it is touched once per
//! handshake and once per disconnect, never per message, and held for a map lookup. Entries
//! with no open connection and a full bucket are forgotten once the table doubles, so a flood
//! from many addresses cannot grow it without bound.
//!
//! The per-user table works the same way (one lock, held for a lookup once per HTTP publish
//! request, never per delivered message): a user whose bucket has refilled — nothing published
//! for two seconds at most — is idle and forgotten at the next sweep, so the table holds the
//! users that published in the last seconds, whatever the number of users who ever did.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

/// A token bucket. `rate` tokens per second, at most `2 × rate` kept.
#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub fn full(rate: f64, now: Instant) -> Bucket {
        Bucket { tokens: 2.0 * rate, last: now }
    }

    fn refill(&mut self, rate: f64, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * rate).min(2.0 * rate);
        self.last = now;
    }

    /// Takes one token if there is one.
    pub fn take(&mut self, rate: f64, now: Instant) -> bool {
        self.take_up_to(1, rate, now) == 1
    }

    /// Takes up to `n` tokens; returns how many were available.
    pub fn take_up_to(&mut self, n: usize, rate: f64, now: Instant) -> usize {
        self.refill(rate, now);
        let got = (self.tokens.floor().max(0.0) as usize).min(n);
        self.tokens -= got as f64;
        got
    }

    fn is_full(&mut self, rate: f64, now: Instant) -> bool {
        self.refill(rate, now);
        self.tokens >= 2.0 * rate
    }
}

struct IpEntry {
    conns: usize,
    handshakes: Bucket,
    passwords: Bucket,
}

/// What the per-address check decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    Ok,
    /// Too many handshakes per second from this address (HTTP 429).
    RateLimited,
}

/// Per-address, per-key and per-user counters of one node.
pub struct Limiter {
    per_ip: Mutex<IpTable>,
    per_user: Mutex<UserTable>,
    api_keys: Vec<Mutex<Bucket>>,
    max_conns_per_ip: usize,
    handshake_rate: f64,
    password_rate: f64,
    api_key_rate: f64,
    user_rate: f64,
}

struct IpTable {
    map: HashMap<IpAddr, IpEntry>,
    sweep_at: usize,
}

/// Publish buckets by user name (token `sub` or Basic user); swept like [`IpTable`].
struct UserTable {
    map: HashMap<Box<str>, Bucket>,
    sweep_at: usize,
}

/// Holds one connection slot of an address; frees it on drop.
pub struct IpGuard {
    limiter: Arc<Limiter>,
    ip: IpAddr,
}

impl IpGuard {
    /// The address whose slot this is.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }
}

impl Drop for IpGuard {
    fn drop(&mut self) {
        let mut t = self.limiter.per_ip.lock();
        if let Some(e) = t.map.get_mut(&key_of(self.ip)) {
            e.conns = e.conns.saturating_sub(1);
        }
    }
}

impl std::fmt::Debug for IpGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpGuard({})", self.ip)
    }
}

const MIN_SWEEP: usize = 1024;

/// What the per-address limits count by: the address, or for IPv6 its /64 (one host is
/// commonly given a whole /64, so single addresses would let it pass every per-address limit).
fn key_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(std::net::Ipv6Addr::from(bits))
        }
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl Limiter {
    pub fn new(max_conns_per_ip: usize, handshakes_per_s: usize, api_keys: usize, api_key_rate: usize) -> Limiter {
        let now = Instant::now();
        Limiter {
            per_ip: Mutex::new(IpTable { map: HashMap::new(), sweep_at: MIN_SWEEP }),
            per_user: Mutex::new(UserTable { map: HashMap::new(), sweep_at: MIN_SWEEP }),
            api_keys: (0..api_keys).map(|_| Mutex::new(Bucket::full(api_key_rate as f64, now))).collect(),
            max_conns_per_ip,
            handshake_rate: handshakes_per_s as f64,
            password_rate: 5.0,
            api_key_rate: api_key_rate as f64,
            user_rate: 1000.0,
        }
    }

    /// Sets the HTTP publishes per second per user (default 1000).
    pub fn with_user_rate(mut self, per_s: usize) -> Limiter {
        self.user_rate = per_s as f64;
        self
    }

    /// Sets the password checks per second per address (default 5).
    pub fn with_password_rate(mut self, per_s: usize) -> Limiter {
        self.password_rate = per_s as f64;
        self
    }

    /// The address's entry, made when missing. Every path that makes entries sweeps first, so
    /// the table holds the addresses with open connections or recently used rates (idle
    /// entries go once the table doubles), whoever calls.
    fn entry<'t>(&self, t: &'t mut IpTable, ip: IpAddr, now: Instant) -> &'t mut IpEntry {
        let ip = key_of(ip);
        if !t.map.contains_key(&ip) {
            self.sweep(t, now);
        }
        let (h, p) = (self.handshake_rate, self.password_rate);
        t.map.entry(ip).or_insert_with(|| IpEntry {
            conns: 0,
            handshakes: Bucket::full(h, now),
            passwords: Bucket::full(p, now),
        })
    }

    /// Counts a password check (an Argon2 verification) from `ip` against its rate.
    pub fn admit_password_check(&self, ip: IpAddr) -> bool {
        let now = Instant::now();
        let mut t = self.per_ip.lock();
        let rate = self.password_rate;
        self.entry(&mut t, ip, now).passwords.take(rate, now)
    }

    /// Counts a handshake from `ip` against its rate.
    pub fn admit_handshake(&self, ip: IpAddr) -> Admission {
        self.admit_handshake_at(ip, Instant::now())
    }

    fn admit_handshake_at(&self, ip: IpAddr, now: Instant) -> Admission {
        let mut t = self.per_ip.lock();
        let rate = self.handshake_rate;
        let e = self.entry(&mut t, ip, now);
        if e.handshakes.take(rate, now) {
            Admission::Ok
        } else {
            Admission::RateLimited
        }
    }

    /// Takes a connection slot of `ip`; `None` when the address already has the maximum.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr) -> Option<IpGuard> {
        let now = Instant::now();
        let mut t = self.per_ip.lock();
        let e = self.entry(&mut t, ip, now);
        if e.conns >= self.max_conns_per_ip {
            return None;
        }
        e.conns += 1;
        Some(IpGuard { limiter: self.clone(), ip })
    }

    /// Open connections counted for `ip`.
    pub fn connections_of(&self, ip: IpAddr) -> usize {
        self.per_ip.lock().map.get(&key_of(ip)).map_or(0, |e| e.conns)
    }

    /// Takes up to `n` publish tokens of API key `index`; returns how many were granted.
    pub fn take_api_key(&self, index: usize, n: usize) -> usize {
        match self.api_keys.get(index) {
            Some(b) => b.lock().take_up_to(n, self.api_key_rate, Instant::now()),
            None => n,
        }
    }

    /// Takes up to `n` publish tokens of `user` (a token's `sub` or a Basic user name); returns
    /// how many were granted. One bucket per user, whichever credentials it came with.
    pub fn take_user(&self, user: &str, n: usize) -> usize {
        self.take_user_at(user, n, Instant::now())
    }

    fn take_user_at(&self, user: &str, n: usize, now: Instant) -> usize {
        if n == 0 {
            return 0;
        }
        let rate = self.user_rate;
        let mut t = self.per_user.lock();
        if let Some(b) = t.map.get_mut(user) {
            return b.take_up_to(n, rate, now);
        }
        if t.map.len() >= t.sweep_at {
            t.map.retain(|_, b| !b.is_full(rate, now));
            t.sweep_at = (2 * t.map.len()).max(MIN_SWEEP);
        }
        t.map.entry(user.into()).or_insert_with(|| Bucket::full(rate, now)).take_up_to(n, rate, now)
    }

    /// Users with a publish bucket in the table.
    pub fn users_tracked(&self) -> usize {
        self.per_user.lock().map.len()
    }

    fn sweep(&self, t: &mut IpTable, now: Instant) {
        if t.map.len() < t.sweep_at {
            return;
        }
        let (h, p) = (self.handshake_rate, self.password_rate);
        t.map.retain(|_, e| e.conns > 0 || !e.handshakes.is_full(h, now) || !e.passwords.is_full(p, now));
        t.sweep_at = (2 * t.map.len()).max(MIN_SWEEP);
    }
}

/// An address or a CIDR block (`10.0.0.0/8`, `::1`), for `trusted_proxies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for Net {
    type Err = String;

    fn from_str(s: &str) -> Result<Net, String> {
        let s = s.trim();
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().map_err(|_| format!("{s:?} is not an IP address or CIDR block"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => {
                p.parse::<u8>().ok().filter(|&p| p <= max).ok_or_else(|| format!("{s:?} has a bad prefix length"))?
            }
            None => max,
        };
        Ok(Net { addr, prefix })
    }
}

impl Net {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`, seen on dual-stack sockets) as IPv4.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// The client's address: the peer, or — when the peer is a trusted proxy — the nearest
/// untrusted address of `X-Forwarded-For` (then `X-Real-IP`). Headers from untrusted peers are
/// ignored, so clients cannot pick their own address.
pub fn client_ip(peer: IpAddr, trusted: &[Net], forwarded_for: Option<&str>, real_ip: Option<&str>) -> IpAddr {
    let peer = canonical(peer);
    if !trusted.iter().any(|n| n.contains(peer)) {
        return peer;
    }
    if let Some(xff) = forwarded_for {
        for hop in xff.rsplit(',') {
            match hop.trim().parse::<IpAddr>() {
                Ok(ip) if trusted.iter().any(|n| n.contains(ip)) => continue,
                Ok(ip) => return canonical(ip),
                Err(_) => break,
            }
        }
    }
    real_ip.and_then(|r| r.trim().parse::<IpAddr>().ok()).map(canonical).unwrap_or(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn limits_bucket_refills_at_its_rate_and_holds_two_seconds() {
        let t0 = Instant::now();
        let mut b = Bucket::full(10.0, t0);
        assert_eq!(b.take_up_to(100, 10.0, t0), 20);
        assert!(!b.take(10.0, t0));
        assert_eq!(b.take_up_to(100, 10.0, t0 + Duration::from_millis(500)), 5);
        assert_eq!(b.take_up_to(100, 10.0, t0 + Duration::from_secs(60)), 20);
    }

    #[test]
    fn limits_connections_per_ip_are_counted_and_freed() {
        let l = Arc::new(Limiter::new(2, 100, 0, 1));
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let a = l.acquire(ip).unwrap();
        let _b = l.acquire(ip).unwrap();
        assert!(l.acquire(ip).is_none());
        assert!(l.acquire("10.0.0.2".parse().unwrap()).is_some());
        drop(a);
        assert_eq!(l.connections_of(ip), 1);
        assert!(l.acquire(ip).is_some());
    }

    #[test]
    fn limits_handshake_rate_per_ip() {
        let l = Limiter::new(10, 5, 0, 1);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let ok = (0..30).filter(|_| l.admit_handshake(ip) == Admission::Ok).count();
        assert!((10..=11).contains(&ok), "{ok}");
        assert_eq!(l.admit_handshake("10.0.0.9".parse().unwrap()), Admission::Ok);
    }

    #[test]
    fn limits_table_forgets_idle_addresses() {
        let l = Limiter::new(10, 1000, 0, 1);
        let t0 = Instant::now();
        let ip = |i: u32| IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        for i in 0..5000u32 {
            let _ = l.admit_handshake_at(ip(i), t0);
        }
        // Right after their handshakes the buckets are not full: every address is kept.
        assert_eq!(l.per_ip.lock().map.len(), 5000);
        // Once they have refilled, the next sweep (when the table has doubled) forgets them
        // and keeps the addresses seen since.
        for i in 0..3500u32 {
            let _ = l.admit_handshake_at(ip(10_000 + i), t0 + Duration::from_secs(10));
        }
        let len = l.per_ip.lock().map.len();
        assert!(len <= 3500, "{len}");
    }

    #[test]
    fn limits_ipv6_count_by_slash_64_and_password_checks_sweep_too() {
        let l = Arc::new(Limiter::new(2, 1000, 0, 1));
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let _g1 = l.acquire(a).unwrap();
        let _g2 = l.acquire(b).unwrap();
        assert!(l.acquire("2001:db8:1:2::7".parse().unwrap()).is_none(), "one /64 is one client");
        assert!(l.acquire("2001:db8:1:3::1".parse().unwrap()).is_some(), "another /64 is another");
        // Password checks from ever new addresses (the HTTP guard's path) are swept as well.
        let t0 = Instant::now();
        for i in 0..20_000u32 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + i));
            let mut t = l.per_ip.lock();
            let _ = l.entry(&mut t, ip, t0 + Duration::from_secs(u64::from(i / 1000) * 10));
        }
        let len = l.per_ip.lock().map.len();
        assert!(len <= 4096, "{len}");
    }

    #[test]
    fn limits_user_publish_rate_is_per_user() {
        let l = Limiter::new(10, 100, 1, 1000).with_user_rate(5);
        let t0 = Instant::now();
        // A burst of two seconds' worth, then nothing until the bucket refills.
        assert_eq!(l.take_user_at("alice", 100, t0), 10);
        assert_eq!(l.take_user_at("alice", 1, t0), 0);
        // Another user, and the API key, have their own buckets.
        assert_eq!(l.take_user_at("bob", 3, t0), 3);
        assert_eq!(l.take_api_key(0, 50), 50);
        assert_eq!(l.take_user_at("alice", 100, t0 + Duration::from_millis(400)), 2);
        assert_eq!(l.take_user_at("alice", 100, t0 + Duration::from_secs(60)), 10);
    }

    #[test]
    fn limits_user_table_forgets_idle_users() {
        let l = Limiter::new(10, 100, 0, 1).with_user_rate(10);
        let t0 = Instant::now();
        for i in 0..5000 {
            assert_eq!(l.take_user_at(&format!("u{i}"), 1, t0), 1);
        }
        // Every one of them published a moment ago: all are kept.
        assert_eq!(l.users_tracked(), 5000);
        // Ten seconds on their buckets are full again; the users seen since are what stays.
        for i in 0..6000 {
            assert_eq!(l.take_user_at(&format!("v{i}"), 1, t0 + Duration::from_secs(10)), 1);
        }
        let len = l.users_tracked();
        assert!(len <= 6000, "{len}");
        // A steady stream of new names never grows the table past twice the active ones.
        for round in 0..20u64 {
            for i in 0..1000 {
                let _ = l.take_user_at(&format!("w{round}-{i}"), 1, t0 + Duration::from_secs(20 + 10 * round));
            }
        }
        let len = l.users_tracked();
        assert!(len <= 4096, "{len}");
        // A user kept through the sweeps still has its (drained) bucket.
        assert_eq!(l.take_user_at("w19-0", 100, t0 + Duration::from_secs(210)), 19);
    }

    #[test]
    fn limits_password_checks_per_ip() {
        let l = Limiter::new(10, 100, 0, 1).with_password_rate(2);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let ok = (0..20).filter(|_| l.admit_password_check(ip)).count();
        assert!((4..=5).contains(&ok), "{ok}");
        assert!(l.admit_password_check("10.0.0.2".parse().unwrap()));
    }

    #[test]
    fn limits_client_ip_trusts_only_configured_proxies() {
        let trusted: Vec<Net> = vec!["127.0.0.1".parse().unwrap(), "10.0.0.0/8".parse().unwrap()];
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let far: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(
            client_ip(lo, &trusted, Some("198.51.100.1, 10.1.2.3"), None),
            "198.51.100.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(client_ip(far, &trusted, Some("198.51.100.1"), None), far, "untrusted peers cannot spoof");
        assert_eq!(client_ip(lo, &trusted, None, Some("198.51.100.2")), "198.51.100.2".parse::<IpAddr>().unwrap());
        assert_eq!(client_ip(lo, &trusted, None, None), lo);
        assert!("::1".parse::<Net>().unwrap().contains("::1".parse().unwrap()));
        assert!("10.0.0.0/8".parse::<Net>().unwrap().contains("::ffff:10.9.9.9".parse().unwrap()));
        assert!("1.2.3.4/33".parse::<Net>().is_err());
        assert!("0.0.0.0/0".parse::<Net>().unwrap().contains(far));
    }
}
