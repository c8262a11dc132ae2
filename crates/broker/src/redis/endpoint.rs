//! Where a [`super::RedisBroker`] finds its Redis, and the command connection to it.
//!
//! - [`Endpoint::Fixed`]: one address (`redis://host:port/db`).
//! - [`Endpoint::Sentinel`]: Redis Sentinel (`redis+sentinel://s1:26379,s2:26379/name`): the
//!   sentinels are asked for the current primary on every (re)connect, so after a failover the
//!   broker follows the promoted replica.
//!
//! TLS: `rediss://…` and `rediss+sentinel://…` (TLS to the sentinels and to Redis). The server's
//! certificate is checked against the system's roots, or against the CA of the URL option
//! `tls_ca=/path/ca.pem` (read once, at start).
//!
//! [`Commands`] holds one multiplexed connection (every task's commands are pipelined on it)
//! and replaces it when it fails: a dead socket, a timeout, or a server that turned replica
//! (`READONLY`). The command that saw the failure returns its error; the next one reconnects,
//! through the sentinels where there are some. One reconnect at a time (a Tokio mutex held
//! across the connect, so a burst of failing commands causes one attempt, not one each).

use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{AsyncConnectionConfig, Client, RedisError, TlsCertificates, TlsMode};

use crate::BrokerError;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) enum Endpoint {
    Fixed(Client),
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

impl Endpoint {
    /// `redis://…` → a fixed address; `redis+sentinel://host:port,host:port/name[/db]` → the
    /// primary the sentinels name. The password of a fixed URL goes to Redis; a sentinel URL's
    /// user and password (`redis+sentinel://:pw@h:p/name`) go to both the sentinels and Redis.
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let (url, ca) = take_tls_ca(url)?;
        let url = url.as_str();
        let sentinel = url.strip_prefix("redis+sentinel://").map(|r| (r, false));
        if let Some((rest, tls)) = sentinel.or_else(|| url.strip_prefix("rediss+sentinel://").map(|r| (r, true))) {
            let (auth, rest) = match rest.rsplit_once('@') {
                Some((a, r)) => (Some(a), r),
                None => (None, rest),
            };
            let (hosts, path) =
                rest.split_once('/').ok_or("redis+sentinel:// needs /<primary name> after the sentinels")?;
            let mut path = path.split('/');
            let name = path.next().filter(|n| !n.is_empty()).ok_or("redis+sentinel:// needs a primary name")?;
            let db: i64 = match path.next() {
                Some(d) if !d.is_empty() => {
                    d.parse().map_err(|_| "redis+sentinel://…/name/<db>: db must be a number")?
                }
                _ => 0,
            };
            let nodes: Vec<String> = hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(|h| format!("{}://{h}", if tls { "rediss" } else { "redis" }))
                .collect();
            if nodes.is_empty() {
                return Err("redis+sentinel:// needs at least one sentinel host:port".into());
            }
            let mut builder = redis::sentinel::SentinelClientBuilder::new(
                nodes
                    .iter()
                    .map(|n| redis::IntoConnectionInfo::into_connection_info(n.as_str()).map(|i| i.addr().clone()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| "a sentinel address is not host:port")?,
                name,
                SentinelServerType::Master,
            )
            .map_err(|_| "not a valid sentinel list")?
            .set_client_to_redis_db(db);
            if let Some(auth) = auth {
                let (user, password) = auth.split_once(':').unwrap_or(("", auth));
                if !user.is_empty() {
                    builder = builder.set_client_to_redis_username(user).set_client_to_sentinel_username(user);
                }
                builder = builder.set_client_to_redis_password(password).set_client_to_sentinel_password(password);
            }
            if tls {
                builder = builder
                    .set_client_to_redis_tls_mode(TlsMode::Secure)
                    .set_client_to_sentinel_tls_mode(TlsMode::Secure);
                if let Some(pem) = &ca {
                    let certs = || TlsCertificates { client_tls: None, root_cert: Some(pem.clone()) };
                    builder =
                        builder.set_client_to_redis_certificates(certs()).set_client_to_sentinel_certificates(certs());
                }
            }
            let client = builder.build().map_err(|_| "not a valid sentinel configuration".to_string())?;
            return Ok(Endpoint::Sentinel(tokio::sync::Mutex::new(client)));
        }
        open(url, ca).map(Endpoint::Fixed)
    }

    /// A client for the server to talk to now.
    pub async fn client(&self) -> Result<Client, RedisError> {
        match self {
            Endpoint::Fixed(c) => Ok(c.clone()),
            Endpoint::Sentinel(s) => {
                let mut s = s.lock().await;
                tokio::time::timeout(CONNECT_TIMEOUT, s.async_get_client())
                    .await
                    .map_err(|_| RedisError::from((redis::ErrorKind::Io, "no sentinel answered in time")))?
            }
        }
    }
}

/// A client for a plain Redis URL (`redis://`, `rediss://`), with its `tls_ca` option applied.
pub fn client_for(url: &str) -> Result<Client, String> {
    let (url, ca) = take_tls_ca(url)?;
    open(&url, ca)
}

fn open(url: &str, ca: Option<Vec<u8>>) -> Result<Client, String> {
    let bad = |_| "not a valid Redis URL (redis://host:port/db)".to_string();
    match ca {
        Some(pem) if url.starts_with("rediss://") => {
            Client::build_with_tls(url, TlsCertificates { client_tls: None, root_cert: Some(pem) }).map_err(|e| {
                if e.to_string().to_lowercase().contains("cert") {
                    "tls_ca: not a PEM certificate".to_string()
                } else {
                    "not a valid Redis URL (rediss://host:port/db)".to_string()
                }
            })
        }
        Some(_) => Err("tls_ca: only with TLS (rediss://)".into()),
        None => Client::open(url).map_err(bad),
    }
}

/// Removes the `tls_ca=<path>` option from a URL's query and reads the PEM file it names.
/// Errors name the option, never the URL (which may carry a password).
pub fn take_tls_ca(url: &str) -> Result<(String, Option<Vec<u8>>), String> {
    let Some((base, query)) = url.split_once('?') else { return Ok((url.to_string(), None)) };
    let mut ca = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.strip_prefix("tls_ca=") {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| format!("tls_ca: cannot read the CA file: {e}"))?;
                if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                    return Err("tls_ca: the file holds no PEM certificate".into());
                }
                ca = Some(pem);
            }
            None => kept.push(pair),
        }
    }
    let url = if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
    Ok((url, ca))
}

/// The command connection: multiplexed, replaced after a failure.
pub(crate) struct Commands {
    current: Mutex<Option<MultiplexedConnection>>,
    connecting: tokio::sync::Mutex<()>,
}

impl Commands {
    pub fn new() -> Commands {
        Commands { current: Mutex::new(None), connecting: tokio::sync::Mutex::new(()) }
    }

    /// The current connection, connecting first when there is none.
    pub async fn get(&self, endpoint: &Endpoint) -> Result<MultiplexedConnection, BrokerError> {
        if let Some(c) = self.current.lock().clone() {
            return Ok(c);
        }
        let _one = self.connecting.lock().await;
        if let Some(c) = self.current.lock().clone() {
            return Ok(c);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let client = endpoint.client().await.map_err(super::unavailable)?;
        let conn = client.get_multiplexed_async_connection_with_config(&config).await.map_err(super::unavailable)?;
        *self.current.lock() = Some(conn.clone());
        Ok(conn)
    }

    /// Drops the connection: the next command connects anew (the pub/sub link calls this when
    /// its own connection to the same server failed).
    pub fn reset(&self) {
        self.current.lock().take();
    }

    /// Looks at a command's error: a failed connection (or a server that is now a replica)
    /// is dropped so the next command reconnects. Returns the error for the caller.
    pub fn failed(&self, e: RedisError) -> BrokerError {
        let replica = e.to_string().contains("READONLY");
        if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error() || replica {
            self.current.lock().take();
        }
        super::unavailable(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_redis_tls_urls_and_the_ca_option_are_checked() {
        assert!(matches!(Endpoint::parse("rediss://127.0.0.1:6380/0"), Ok(Endpoint::Fixed(_))));
        let e = Endpoint::parse("rediss+sentinel://127.0.0.1:26379/main");
        assert!(matches!(e, Ok(Endpoint::Sentinel(_))), "{:?}", e.err());
        let dir = std::env::temp_dir().join(format!("sb-tls-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let url = |path: &std::path::Path| format!("rediss://u:secret@127.0.0.1:6380/0?tls_ca={}", path.display());
        let e = Endpoint::parse(&url(&not_pem)).err().unwrap();
        assert!(e.contains("tls_ca") && !e.contains("secret"), "{e}");
        let e = Endpoint::parse(&url(&dir.join("missing.pem"))).err().unwrap();
        assert!(e.contains("tls_ca") && !e.contains("secret"), "{e}");
        let plain = format!("redis://127.0.0.1:6379/0?tls_ca={}", not_pem.display());
        assert!(Endpoint::parse(&plain).err().unwrap().contains("tls_ca"));
        assert_eq!(take_tls_ca("redis://h:1/0?protocol=resp3").unwrap(), ("redis://h:1/0?protocol=resp3".into(), None));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
