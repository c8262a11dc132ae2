//! The application's backend decides (`[proxy]`, SPEC §6a; docs/security.md): the connect hook
//! authenticates connections that bring no credentials, the subscribe and publish hooks allow,
//! refuse (or, for publish, replace) what clients of opted-in namespaces do.
//!
//! Every hook is an HTTP POST of a JSON object, answered by `{"result": {...}}` or
//! `{"error": {"code", "message"}}`. A hook that cannot be asked or does not answer properly
//! never lets anything through: it refuses with [`code::UNAVAILABLE`] (timeout, connection
//! error, HTTP 5xx) or [`code::BAD_GATEWAY`] (any other status, an answer that is not JSON or
//! has neither `result` nor `error`). This module owns those rules; sessions and transports
//! only act on its verdicts.
//!
//! The node's calls in flight to the backend, over all hooks and clients, are capped
//! (`proxy.max_in_flight`); a call waits for a slot within the hook's deadline
//! (`proxy.timeout_ms`, which covers the wait and the call), and one that gets none with time
//! left for the call fails as a timed-out hook (503 / 4503). What a failure tells the client is generic ("the
//! application's backend is unavailable (connect hook)"); why it failed — a refused
//! connection, a DNS failure, an HTTP status — goes to the log, at most one line per hook per
//! `log_limit::INTERVAL`.
//!
//! # Layout
//! - [`client`]: the pooled keep-alive HTTP client (also used for JWKS fetches).
//! - [`metrics`]: calls, errors and latency per hook, for `/metrics`.

pub mod client;
pub mod metrics;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hyper::Uri;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use switchboard_protocol::code::{self, close};
use tokio::sync::Semaphore;

use self::client::{CallError, HttpClient};
use self::metrics::HookMetrics;
use crate::error::{ApiError, ConfigError};
use crate::log_limit::LogLimit;

/// `[proxy]` in the configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Asked about every connection that brings no credentials.
    pub connect_url: Option<String>,
    /// Asked about every subscribe in namespaces with `proxy_subscribe`.
    pub subscribe_url: Option<String>,
    /// Asked about every client publish in namespaces with `proxy_publish`.
    pub publish_url: Option<String>,
    /// Deadline of one call (connect, request and answer).
    pub timeout_ms: u64,
    /// Request headers passed to the connect hook (case-insensitive; sent lower-cased).
    pub headers: crate::auth::StringList,
    /// Hook calls of the whole node in flight at once; more wait for a slot within
    /// `timeout_ms`.
    pub max_in_flight: usize,
}

/// Default of `proxy.max_in_flight`: the keep-alive connections the pool keeps per host.
pub const MAX_IN_FLIGHT: usize = 256;
/// Ceiling of `proxy.max_in_flight`.
const MAX_IN_FLIGHT_CEILING: usize = 65_536;

impl Default for ProxyConfig {
    fn default() -> ProxyConfig {
        ProxyConfig {
            connect_url: None,
            subscribe_url: None,
            publish_url: None,
            timeout_ms: 1000,
            headers: Default::default(),
            max_in_flight: MAX_IN_FLIGHT,
        }
    }
}

/// One configured hook.
struct Hook {
    url: Uri,
    metrics: HookMetrics,
    /// This hook's failure warnings.
    warnings: LogLimit,
}

/// How the node reaches its backend: the pooled client and the node-wide call slots.
struct Backend {
    http: HttpClient,
    /// `proxy.max_in_flight` permits; a call holds one from its request to its answer.
    slots: Semaphore,
    max_in_flight: usize,
}

/// The node's hooks, built from `[proxy]`. `Default`: none.
#[derive(Default)]
pub struct Hooks {
    /// Present when any hook is configured.
    backend: Option<Backend>,
    timeout: Duration,
    headers: Vec<String>,
    connect: Option<Hook>,
    subscribe: Option<Hook>,
    publish: Option<Hook>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("connect", &self.connect.as_ref().map(|h| h.url.to_string()))
            .field("subscribe", &self.subscribe.as_ref().map(|h| h.url.to_string()))
            .field("publish", &self.publish.as_ref().map(|h| h.url.to_string()))
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What the connect hook made of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub user: String,
    /// Unix seconds when the connection closes (4001) unless refreshed with a token.
    pub expire_at: Option<u64>,
    /// Server-side subscriptions.
    pub channels: Vec<String>,
}

/// Why the connect hook did not accept a connection: what a WebSocket is closed with and
/// what an SSE or long-poll open is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Close code: the hook's own when it is a 4xxx code, 4003 for other refusals, 4503 / 4502
    /// when the hook failed.
    pub close: u16,
    /// HTTP status: the hook's code when it is 400–599, 403 otherwise; 503 / 502 on failure.
    pub status: u16,
    pub reason: String,
}

/// What a connection tells the connect hook.
#[derive(Serialize)]
pub struct ConnectCall<'a> {
    pub client: &'a str,
    /// `websocket`, `sse` or `poll`.
    pub transport: &'a str,
    /// `json` or `msgpack`.
    pub encoding: &'a str,
    pub headers: &'a BTreeMap<String, String>,
    pub data: Option<&'a RawValue>,
}

#[derive(Serialize)]
struct ChannelCall<'a> {
    client: &'a str,
    user: &'a str,
    channel: &'a str,
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    result: Option<Box<RawValue>>,
    #[serde(default)]
    error: Option<HookError>,
}

#[derive(Deserialize)]
struct HookError {
    code: u64,
    #[serde(default)]
    message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectResult {
    user: String,
    #[serde(default)]
    expire_at: Option<u64>,
    #[serde(default)]
    channels: Vec<String>,
}

#[derive(Deserialize)]
struct PublishResult {
    #[serde(default)]
    data: Option<Box<RawValue>>,
}

/// A hook's verdict before it is turned into what the caller needs.
enum Verdict {
    /// `result`: its raw value.
    Result(Box<RawValue>),
    /// `error`: the hook's code and message.
    Refused(u64, String),
    /// No usable answer: 503 or 502 and why.
    Failed(u16, String),
}

/// Longest hook message passed on to a client.
const MAX_MESSAGE: usize = 256;
/// Longest `user` a connect hook may name (as a token's `sub`).
const MAX_USER: usize = 256;

impl Hooks {
    /// Builds the hooks; a bad URL is a configuration error naming its key.
    pub fn build(c: &ProxyConfig) -> Result<Hooks, ConfigError> {
        let hook = |key: &str, url: &Option<String>| -> Result<Option<Hook>, ConfigError> {
            url.as_deref()
                .map(|u| {
                    client::parse_url(u)
                        .map(|url| Hook { url, metrics: HookMetrics::default(), warnings: LogLimit::new() })
                        .map_err(|e| ConfigError(format!("proxy.{key}: {e}")))
                })
                .transpose()
        };
        if c.timeout_ms == 0 || c.timeout_ms > 60_000 {
            return Err(ConfigError(format!("proxy.timeout_ms: {} is not within 1..=60000", c.timeout_ms)));
        }
        if !(1..=MAX_IN_FLIGHT_CEILING).contains(&c.max_in_flight) {
            return Err(ConfigError(format!(
                "proxy.max_in_flight: {} is not within 1..={MAX_IN_FLIGHT_CEILING}",
                c.max_in_flight
            )));
        }
        let any = c.connect_url.is_some() || c.subscribe_url.is_some() || c.publish_url.is_some();
        let backend = any.then(|| Backend {
            http: HttpClient::new(),
            slots: Semaphore::new(c.max_in_flight),
            max_in_flight: c.max_in_flight,
        });
        Ok(Hooks {
            backend,
            timeout: Duration::from_millis(c.timeout_ms),
            headers: c.headers.0.iter().map(|h| h.trim().to_ascii_lowercase()).collect(),
            connect: hook("connect_url", &c.connect_url)?,
            subscribe: hook("subscribe_url", &c.subscribe_url)?,
            publish: hook("publish_url", &c.publish_url)?,
        })
    }

    pub fn has_connect(&self) -> bool {
        self.connect.is_some()
    }

    pub fn has_subscribe(&self) -> bool {
        self.subscribe.is_some()
    }

    pub fn has_publish(&self) -> bool {
        self.publish.is_some()
    }

    /// The request headers passed to the connect hook, picked out of `all` (name, value) and
    /// lower-cased; values that are not text are left out.
    pub fn pick_headers<'a>(&self, all: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if self.connect.is_none() || self.headers.is_empty() {
            return out;
        }
        for (name, value) in all {
            let name = name.to_ascii_lowercase();
            if self.headers.contains(&name) {
                if let Ok(v) = std::str::from_utf8(value) {
                    out.entry(name)
                        .and_modify(|e: &mut String| {
                            e.push_str(", ");
                            e.push_str(v);
                        })
                        .or_insert_with(|| v.to_string());
                }
            }
        }
        out
    }

    /// Asks the connect hook about a connection without credentials.
    pub async fn connect(&self, call: &ConnectCall<'_>) -> Result<Accepted, Refused> {
        let Some(hook) = &self.connect else {
            return Err(Refused {
                close: close::INVALID_TOKEN,
                status: code::UNAUTHORIZED,
                reason: "credentials required".into(),
            });
        };
        match self.ask(hook, call).await {
            Verdict::Result(raw) => match serde_json::from_str::<ConnectResult>(raw.get()) {
                Ok(r) if valid_user(&r.user) => {
                    Ok(Accepted { user: r.user, expire_at: r.expire_at, channels: r.channels })
                }
                Ok(_) => Err(self.bad_answer(hook, "connect", "its user is empty, too long or not printable")),
                Err(e) => Err(self.bad_answer(hook, "connect", &format!("its result does not fit: {e}"))),
            },
            Verdict::Refused(c, message) => {
                let close = if (4000..=4999).contains(&c) { c as u16 } else { close::FORBIDDEN };
                let status = if (400..=599).contains(&c) { c as u16 } else { code::FORBIDDEN };
                Err(Refused { close, status, reason: message })
            }
            Verdict::Failed(status, reason) => Err(Refused { close: close_of_failure(status), status, reason }),
        }
    }

    fn bad_answer(&self, hook: &Hook, name: &str, why: &str) -> Refused {
        hook.metrics.error();
        if let Some(suppressed) = hook.warnings.admit() {
            tracing::warn!(hook = name, suppressed, "bad answer from the application's backend: {why}");
        }
        Refused {
            close: close::HOOK_FAILED,
            status: code::BAD_GATEWAY,
            reason: format!("the application's backend gave a bad answer to the {name} hook"),
        }
    }

    /// Asks the subscribe hook whether `user` may subscribe to `channel`. `Ok` when the
    /// hook allows it (or no subscribe hook is configured).
    pub async fn subscribe(
        &self,
        client: &str,
        user: &str,
        channel: &str,
        data: Option<&RawValue>,
    ) -> Result<(), ApiError> {
        let Some(hook) = &self.subscribe else { return Ok(()) };
        match self.ask(hook, &ChannelCall { client, user, channel, data }).await {
            Verdict::Result(_) => Ok(()),
            Verdict::Refused(c, message) => Err(refusal(c, message)),
            Verdict::Failed(status, reason) => Err(ApiError::new(status, reason)),
        }
    }

    /// Asks the publish hook about a client's publish: `Ok(None)` publishes the data as sent,
    /// `Ok(Some(x))` publishes `x` instead.
    pub async fn publish(
        &self,
        client: &str,
        user: &str,
        channel: &str,
        data: &RawValue,
    ) -> Result<Option<Box<RawValue>>, ApiError> {
        let Some(hook) = &self.publish else { return Ok(None) };
        match self.ask(hook, &ChannelCall { client, user, channel, data: Some(data) }).await {
            Verdict::Result(raw) => match serde_json::from_str::<PublishResult>(raw.get()) {
                Ok(r) => Ok(r.data),
                Err(e) => {
                    hook.metrics.error();
                    if let Some(suppressed) = hook.warnings.admit() {
                        tracing::warn!(hook = "publish", suppressed, "bad answer from the application's backend: {e}");
                    }
                    Err(ApiError::new(
                        code::BAD_GATEWAY,
                        "the application's backend gave a bad answer to the publish hook",
                    ))
                }
            },
            Verdict::Refused(c, message) => Err(refusal(c, message)),
            Verdict::Failed(status, reason) => Err(ApiError::new(status, reason)),
        }
    }

    /// One call: a slot, the POST, the verdict, all within the hook's deadline; counted and
    /// timed. A failure's reason for the client is generic; its cause is logged.
    async fn ask(&self, hook: &Hook, body: &impl Serialize) -> Verdict {
        let name = self.name_of(hook);
        let Some(backend) = &self.backend else {
            return Verdict::Failed(
                code::UNAVAILABLE,
                format!("the application's backend is unavailable ({name} hook)"),
            );
        };
        let body = match serde_json::to_vec(body) {
            Ok(b) => b,
            Err(e) => return self.failed(hook, name, code::BAD_GATEWAY, format_args!("its request: {e}")),
        };
        let started = Instant::now();
        // The wait for a slot counts against the deadline: a client never waits longer than
        // `timeout_ms` for a verdict, however many calls are queued before it. A slot must come
        // with time left for a call ([`least_left`]); a request that cannot be answered in time
        // is not sent.
        let wait = self.timeout - least_left(self.timeout);
        let Ok(Ok(_slot)) = tokio::time::timeout(wait, backend.slots.acquire()).await else {
            hook.metrics.busy();
            let (ms, n) = (self.timeout.as_millis(), backend.max_in_flight);
            return self.failed(
                hook,
                name,
                code::UNAVAILABLE,
                format_args!("no call slot within {ms} ms: proxy.max_in_flight ({n}) calls in flight"),
            );
        };
        let called = Instant::now();
        let left = self.timeout.saturating_sub(called - started);
        let answer = backend.http.post_json(&hook.url, body, left).await;
        hook.metrics.observe(called.elapsed());
        match answer {
            Err(e) => {
                let status = match e {
                    CallError::Status(s) if !(500..=599).contains(&s) => code::BAD_GATEWAY,
                    CallError::Body => code::BAD_GATEWAY,
                    _ => code::UNAVAILABLE,
                };
                self.failed(hook, name, status, format_args!("{e}"))
            }
            Ok(bytes) => match serde_json::from_slice::<Answer>(&bytes) {
                Ok(Answer { error: Some(e), .. }) => Verdict::Refused(e.code, one_line(&e.message)),
                Ok(Answer { result: Some(r), .. }) if r.get().trim_start().starts_with('{') => Verdict::Result(r),
                Ok(_) | Err(_) => self.failed(
                    hook,
                    name,
                    code::BAD_GATEWAY,
                    format_args!("it answered neither a result object nor an error"),
                ),
            },
        }
    }

    /// A call without a usable answer: counted, its cause logged (within the hook's log
    /// limit), and a generic reason for the client — causes such as a refused connection or a
    /// DNS failure describe the node's network, not the client's request.
    fn failed(&self, hook: &Hook, name: &str, status: u16, cause: std::fmt::Arguments<'_>) -> Verdict {
        hook.metrics.error();
        if let Some(suppressed) = hook.warnings.admit() {
            tracing::warn!(hook = name, suppressed, "the application's backend failed: {cause}");
        }
        let what = if status == code::UNAVAILABLE { "is unavailable" } else { "gave a bad answer" };
        Verdict::Failed(status, format!("the application's backend {what} ({name} hook)"))
    }

    fn name_of(&self, hook: &Hook) -> &'static str {
        if self.connect.as_ref().is_some_and(|h| std::ptr::eq(h, hook)) {
            "connect"
        } else if self.subscribe.as_ref().is_some_and(|h| std::ptr::eq(h, hook)) {
            "subscribe"
        } else {
            "publish"
        }
    }

    /// The hooks' metrics in Prometheus text.
    pub fn render(&self) -> String {
        let hooks: Vec<(&str, &HookMetrics)> =
            [("connect", &self.connect), ("subscribe", &self.subscribe), ("publish", &self.publish)]
                .into_iter()
                .filter_map(|(n, h)| h.as_ref().map(|h| (n, &h.metrics)))
                .collect();
        metrics::render(&hooks)
    }
}

/// A refusal of a subscribe or publish: the hook's code when it is 400–599, 403 otherwise.
fn refusal(c: u64, message: String) -> ApiError {
    let status = if (400..=599).contains(&c) { c as u16 } else { code::FORBIDDEN };
    ApiError::new(status, message)
}

fn close_of_failure(status: u16) -> u16 {
    if status == code::UNAVAILABLE {
        close::HOOK_UNAVAILABLE
    } else {
        close::HOOK_FAILED
    }
}

fn valid_user(u: &str) -> bool {
    !u.is_empty() && u.len() <= MAX_USER && !u.chars().any(char::is_control)
}

/// A hook's message as a client sees it: one line, at most [`MAX_MESSAGE`] bytes.
fn one_line(m: &str) -> String {
    let mut out: String = m.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if out.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

/// The least time a call must have left once it has a slot: 10 ms (half the deadline when
/// `timeout_ms` is shorter). A slot freed just before a waiting call's deadline would otherwise
/// send a request that cannot be answered in time, and the next call in line after it.
fn least_left(timeout: Duration) -> Duration {
    Duration::from_millis(10).min(timeout / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_refusal_codes_are_kept_in_range() {
        assert_eq!(refusal(404, "x".into()).code, 404);
        assert_eq!(refusal(7, "x".into()).code, 403);
        assert_eq!(refusal(4001, "x".into()).code, 403);
        assert_eq!(one_line("a\nb"), "a b");
        assert_eq!(one_line(&"é".repeat(300)).len(), 256);
        assert!(!valid_user(""));
        assert!(valid_user("alice"));
    }

    #[test]
    fn proxy_bad_config_names_the_key() {
        let c = ProxyConfig { connect_url: Some("ftp://x".into()), ..ProxyConfig::default() };
        assert!(Hooks::build(&c).err().unwrap().0.contains("proxy.connect_url"));
        let c = ProxyConfig { timeout_ms: 0, ..ProxyConfig::default() };
        assert!(Hooks::build(&c).err().unwrap().0.contains("proxy.timeout_ms"));
        let c = ProxyConfig { max_in_flight: 0, ..ProxyConfig::default() };
        assert!(Hooks::build(&c).err().unwrap().0.contains("proxy.max_in_flight"));
    }

    /// A connect hook on `port` of loopback, 300 ms per call, one call in flight at a time.
    fn one_slot_connect_hook(port: u16) -> Hooks {
        let c = ProxyConfig {
            connect_url: Some(format!("http://127.0.0.1:{port}/connect")),
            timeout_ms: 300,
            max_in_flight: 1,
            ..ProxyConfig::default()
        };
        Hooks::build(&c).unwrap()
    }

    #[tokio::test]
    async fn proxy_failures_tell_the_client_a_generic_reason_and_calls_wait_for_a_slot() {
        // A port nobody listens on: the call fails with the node's own socket error.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let hooks = one_slot_connect_hook(port);
        let headers = BTreeMap::new();
        let call =
            ConnectCall { client: "c1", transport: "websocket", encoding: "json", headers: &headers, data: None };
        let refused = hooks.connect(&call).await.unwrap_err();
        assert_eq!((refused.close, refused.status), (close::HOOK_UNAVAILABLE, code::UNAVAILABLE));
        assert_eq!(refused.reason, "the application's backend is unavailable (connect hook)");
        // The only slot taken: the next call waits out its deadline and fails unsent, as a
        // timed-out hook.
        let backend = hooks.backend.as_ref().unwrap();
        let held = backend.slots.acquire().await.unwrap();
        let refused = hooks.connect(&call).await.unwrap_err();
        assert_eq!((refused.close, refused.status), (close::HOOK_UNAVAILABLE, code::UNAVAILABLE));
        assert!(hooks.render().contains("switchboard_hook_busy_total{hook=\"connect\"} 1"), "{}", hooks.render());
        drop(held);
        assert_eq!(backend.slots.available_permits(), 1);
    }

    #[tokio::test]
    async fn proxy_a_slot_freed_just_before_the_deadline_sends_no_call() {
        // A backend that would take the call: whatever connects is seen.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let hooks = one_slot_connect_hook(listener.local_addr().unwrap().port());
        let headers = BTreeMap::new();
        let call =
            ConnectCall { client: "c1", transport: "websocket", encoding: "json", headers: &headers, data: None };
        // The slot comes free 5 ms before the waiting call's deadline: too late for a call.
        let held = hooks.backend.as_ref().unwrap().slots.acquire().await.unwrap();
        let release = async {
            tokio::time::sleep(Duration::from_millis(295)).await;
            drop(held);
        };
        let (refused, ()) = tokio::join!(hooks.connect(&call), release);
        let refused = refused.unwrap_err();
        assert_eq!((refused.close, refused.status), (close::HOOK_UNAVAILABLE, code::UNAVAILABLE));
        assert!(hooks.render().contains("switchboard_hook_busy_total{hook=\"connect\"} 1"), "{}", hooks.render());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(listener.accept().is_err(), "a call was sent with no time left to answer it");
        assert_eq!(least_left(Duration::from_millis(1000)), Duration::from_millis(10));
        assert_eq!(least_left(Duration::from_millis(4)), Duration::from_millis(2));
    }
}
