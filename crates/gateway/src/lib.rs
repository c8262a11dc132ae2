//! The Switchboard gateway node: it accepts client connections, keeps their subscriptions and
//! fans publications out to them.
//!
//! # Layout
//! - [`error`]: the errors every layer shares: `ApiError` (what a client is told) and
//!   `ConfigError`; they depend on nothing else in the crate.
//! - [`config`]: the TOML file, `SWITCHBOARD_*` variables and flags, merged and validated
//!   (`config::load`: the merge; `config::validate`: the checks; `config::limits` and
//!   `config::namespace`: `[limits]` and `[namespaces.<ns>]`; `config::trend`: trend tiers).
//! - [`node`]: [`Node`], one process's lifecycle: connections, publish entry points, heartbeats,
//!   shutdown.
//! - [`hub`]: channel → local subscribers; encodes a publication once and fans it out, to each
//!   subscriber by its rule (every one, sampled, filtered on tags, Fossil deltas); internal channels (`$…`, messages between nodes) go to the internal handler registered
//!   for their prefix instead.
//! - [`message`]: what a connection is sent, as data: each queued message's kind, said by
//!   whoever queued it, and a subscribe's typed results, so no transport reads back what the
//!   node encoded.
//! - [`outbox`]: a connection's bounded outbound queue, conflation and socket writes; the
//!   permessage-deflate forms of a shared frame, compressed once for every connection that
//!   negotiated it (`outbox::deflated`); an SSE stream's events framed by the stream
//!   (`outbox::framed`); for the HTTP transports whose socket hyper holds, the same queue taken
//!   as typed messages (`outbox::pull`).
//! - [`sampling`]: per-subscription `max_rate_hz` and deadbands, beside the hub's fan-out.
//! - [`history`]: history reads (the `history` command, `/api/channels/{ch}/history`), paged
//!   within the budget of one reply.
//! - [`trend`]: trend reads (`/api/channels/{ch}/trend`, the `trend` option of subscribe).
//! - [`session`]: one client's commands and subscriptions, transport-free (`session/subscribe.rs`:
//!   subscribe and unsubscribe; `session/reply.rs`: replies within the connection's budget).
//! - [`transport`]: the accepted connection (`transport::conn`: every request parsed by hyper,
//!   the `Host` rules; TLS in `transport::tls`), the WebSocket handshake (permessage-deflate
//!   negotiated there) and connection task (`transport::ws`; the socket, frame reader and
//!   closing it shares with [`echo`] in `transport::ws::socket`), Server-Sent Events
//!   (`transport::sse`: events in `sse/events.rs`) and
//!   long-poll sessions (`transport::poll`, all in `transport/poll/`: the routes in
//!   `poll/mod.rs`, live copies in `poll/session.rs`, batches and command bodies in
//!   `poll/wire.rs`, the record kept in the broker's session store in `poll/record.rs`, taken
//!   over from it in `poll/takeover.rs`, streamed as events by `poll/stream.rs`), which take
//!   their messages from the outbox.
//! - [`publish`]: the publish sequence every caller goes through (name, permission and rate,
//!   write-back, publish hook, checks of the data, broker); a caller says only who publishes.
//! - [`api`]: the HTTP API and route table (`api::writes`: the write audit at `/api/writes`;
//!   `api::sources`: the sources and their backlogs at `/api/sources`;
//!   `api::query`: query strings, a malformed one answered with the JSON 400).
//! - [`auth`]: authentication (JWT from files and a JWKS URL, Basic, API keys), revoked
//!   tokens, namespace permissions, `Origin` checks and per-address / per-key abuse limits
//!   (`auth::config`: `[auth]`; `auth::identity`: who a client is; `auth::permissions`: what
//!   it may do in a namespace; the rest listed in `auth`'s own `# Layout`).
//! - [`proxy`]: the application's hooks (`[proxy]`): connect, subscribe and publish, over a
//!   pooled HTTP client; the rule that a failing hook refuses.
//! - [`control`]: `/api/disconnect` and `/api/revoke` across the cluster (internal `$`
//!   channels); `control::owners`, the node's record of who each connection is.
//! - [`dashboards`]: saved dashboards (`/api/dashboards`, files in the data directory) and the
//!   built web app served at `/` (`dashboards::body`: a dashboard's types and validation;
//!   `dashboards::store`: its files and who may change them; `dashboards::demo`: the demo's
//!   dashboards).
//! - [`metrics`]: counters and the delivery-lag histogram, rendered for Prometheus.
//! - [`log_limit`]: warnings clients can cause in bulk, written once per kind per interval
//!   with a count of those left out.
//! - [`alarms`]: server-side alarms (ISA-18.2 states, the `alarms` lease, the journal,
//!   `/api/alarms…` and the WebSocket alarm commands' handling).
//! - [`simulate`]: the built-in point simulator (`--simulate N@HZ`).
//! - [`sources`]: plant data sources (`[[sources]]`: MQTT, OPC UA) started under their
//!   leases and publishing through the node; write-back of publishes to `write_source`
//!   namespaces; `sources::forward`, writes forwarded between nodes to the one running the
//!   source (internal `$` channels, which the hub hands to it; the node's record of them in
//!   `sources::forward::pending`); `sources::audit`, the record of every write attempt (a
//!   log line, a bounded ring, counts by outcome); `sources::historical`, sources' historical
//!   values merged into trends, never published; `sources::demo`, the demo's MQTT path and
//!   simulated device (mosquitto when installed).
//! - [`server`]: the accept loop and [`server::run`], the whole node as a blocking call.
//! - [`echo`]: the `switchboard echo` server, a WebSocket echo made of the node's own
//!   WebSocket code (`transport::ws`, permessage-deflate included) for the Autobahn TestSuite;
//!   it serves no session.

pub mod alarms;
pub mod api;
pub mod auth;
pub mod config;
pub mod control;
pub mod dashboards;
pub mod echo;
pub mod error;
pub mod history;
pub mod hub;
pub mod log_limit;
pub mod message;
pub mod metrics;
pub mod node;
pub mod outbox;
pub mod proxy;
pub(crate) mod publish;
pub mod sampling;
pub mod server;
pub mod session;
pub mod simulate;
pub mod sources;
pub mod transport;
pub mod trend;

pub use config::Config;
pub use node::Node;

/// Unix time in whole seconds.
pub fn unix_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
