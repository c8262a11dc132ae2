//! The node's side of plant data sources (`[[sources]]`, docs/sources.md): the [`Sink`] they
//! publish through (live values, and historical ones marked so: [`historical`]), starting them under their leases, and write-back — a permitted publish to
//! a channel of a namespace with `write_source` goes to that source instead of the broker; in
//! a cluster, to the node that runs it ([`forward`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use switchboard_broker::{Data, Position};
use switchboard_protocol::code;
use switchboard_sources::{Item, Lease, Sink, SinkError, Sources, WriteError};

use crate::auth::Identity;
use crate::node::{ApiError, Checked, Node, Target};

pub mod audit;
pub mod demo;
pub mod forward;
pub mod historical;

/// Publishes a source's points through [`Node::publish_batch`], in order, each checked as any
/// publication is ([`Node::check_own`]): the same limits and broker as any publisher; its
/// historical ones marked so ([`historical::check`]), never the current value. Holds the node
/// weakly: the node owns its sources.
struct NodeSink(Weak<Node>);

/// The sink a node's sources publish through.
pub(crate) fn sink(node: &Arc<Node>) -> Arc<dyn Sink> {
    Arc::new(NodeSink(Arc::downgrade(node)))
}

#[async_trait::async_trait]
impl Sink for NodeSink {
    async fn publish_batch(&self, items: Vec<Item>) -> Vec<Result<(), SinkError>> {
        let Some(node) = self.0.upgrade() else {
            return items.iter().map(|_| Err(SinkError::Unavailable("the node stopped".to_string()))).collect();
        };
        // Which items go to the broker as historical ones, for their counts.
        let mut sent = Vec::with_capacity(items.len());
        let checked = items
            .into_iter()
            .map(|i| {
                let checked = match i.historical {
                    true => historical::check(&node, &i.channel, i.data),
                    false => node.check_own(&i.channel, i.data),
                };
                sent.push(i.historical && checked.is_ok());
                checked
            })
            .collect();
        let published = node.publish_batch(checked).await;
        historical::count(&node, published.iter().zip(sent).filter_map(|(r, sent)| sent.then_some(r)));
        published.into_iter().map(|r| r.map(drop).map_err(sink_error)).collect()
    }

    /// Looks among the channel's last [`HOLDS_LOOK`] publications (its history, or its last
    /// value when it keeps none).
    async fn holds(&self, channel: &str, data: &Data) -> Result<bool, SinkError> {
        let Some(node) = self.0.upgrade() else {
            return Err(SinkError::Unavailable("the node stopped".to_string()));
        };
        let unavailable = |e| SinkError::Unavailable(node.broker_error(e).to_string());
        let Some((position, last)) = node.broker.last_if_known(channel).await.map_err(unavailable)? else {
            return Ok(false);
        };
        if last.as_ref().is_some_and(|p| p.data.get() == data.get()) {
            return Ok(true);
        }
        let since = Position { offset: position.offset.saturating_sub(HOLDS_LOOK as u64), ..position };
        let recent = node.broker.history(channel, Some(&since), HOLDS_LOOK).await.map_err(unavailable)?;
        Ok(recent.publications.iter().any(|p| p.data.get() == data.get()))
    }

    async fn ready(&self) -> bool {
        match self.0.upgrade() {
            Some(node) => node.broker.ready().await,
            None => false,
        }
    }
}

/// How far back [`NodeSink::holds`] looks: more than one batch of a source's points.
const HOLDS_LOOK: usize = 1024;

/// What a source is told of a publication the node did not take: the broker could not commit
/// it (503: offer it again later), did not answer (504: it may have), or the node refused it.
fn sink_error(e: ApiError) -> SinkError {
    match e.code {
        code::UNAVAILABLE => SinkError::Unavailable(e.to_string()),
        code::OUTCOME_UNKNOWN => SinkError::Unknown(e.to_string()),
        _ => SinkError::Refused(e.to_string()),
    }
}

/// Starts the configured sources (none: nothing runs). Each runs only while this node holds
/// its lease in the broker; they stop when the node stops.
pub fn start(node: &Arc<Node>) {
    if node.config.sources.is_empty() {
        return;
    }
    let lease = Lease {
        broker: node.broker.clone(),
        holder: node.id.clone(),
        ttl: Duration::from_secs(node.config.source_lease_ttl_s),
    };
    let sink = sink(node);
    let max_publication = node.config.limits.max_publication_bytes;
    let cluster = node.config.cluster_tag();
    let configs = node
        .config
        .sources
        .iter()
        .map(|s| s.clone().with_node_limits(max_publication).with_cluster(&cluster))
        .collect();
    let sources = Sources::start(configs, sink, lease, node.stopping());
    forward::start(node, &sources);
    let _ = node.sources.set(sources);
}

/// Waits (up to `limit`) until no source runs on this node: a stopping node gives its leases
/// back before the process exits, so another node starts the sources at once.
pub async fn stopped(node: &Node, limit: Duration) {
    let Some(sources) = node.sources.get() else { return };
    let deadline = tokio::time::Instant::now() + limit;
    while sources.handles().iter().any(|h| h.stats.active.load(Relaxed)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The supervisors release their leases right after their sources stop.
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// The source writes to `channel` go to, if its namespace names one.
pub fn write_source<'a>(node: &'a Node, channel: &str) -> Option<&'a str> {
    node.config.namespace(switchboard_protocol::namespace_of(channel)).write_source.as_deref()
}

/// Writes a publication to `source` on behalf of `who` and waits for the device's answer:
/// `{"written": true, "source": name}`, or the refusal.
///
/// `permitted` is the outcome of the checks of the channel name ([`Node::target`]) and of the
/// caller's permission and rate, made as for any publish; a refusal there is answered (and
/// audited) as it is. The data then passes the checks every publication passes
/// ([`Node::check_publication`]: size against `limits.max_publication_bytes` 413, data every
/// format can carry 400) before the source sees it. The source answers 502 (the device
/// refused), 503 (not available now, or no answer in time), 400 (not a writable channel or
/// value) or 403 (a target the source is not set up for). In a cluster a write whose source runs on another node is forwarded there
/// ([`forward`]) and answered the same way. Every attempt is audited here ([`audit`]), on the
/// node that received it.
pub async fn write(
    node: &Node,
    who: &Identity,
    source: &str,
    channel: &str,
    data: Data,
    permitted: Result<Target<'_>, ApiError>,
) -> Result<serde_json::Value, ApiError> {
    let (t, started) = (switchboard_broker::now_ms(), Instant::now());
    let bytes = data.get().len();
    let author = audit::Author::of(who);
    let mut forwarded = false;
    let result = match permitted.and_then(|t| node.check_publication(t, data, None, None)) {
        Ok(checked) => deliver(node, source, &checked, &mut forwarded).await,
        Err(e) => Err(e),
    };
    node.writes.record(audit::Entry {
        t,
        author,
        channel: channel.to_string(),
        bytes,
        source: source.to_string(),
        forwarded,
        outcome: audit::outcome(&result),
        code: result.as_ref().map_or_else(|e| e.code, |()| 200),
        message: result.as_ref().err().map(|e| e.message.clone()),
        latency_ms: audit::millis(started.elapsed()),
    });
    result?;
    Ok(serde_json::json!({"written": true, "source": source}))
}

/// Hands a checked publication to the source here, or to the node that runs it (`forwarded`
/// set; that node checks it again, against its own limits, and writes it).
async fn deliver(node: &Node, source: &str, checked: &Checked, forwarded: &mut bool) -> Result<(), ApiError> {
    let sources =
        node.sources.get().ok_or_else(|| ApiError::new(code::UNAVAILABLE, "the node's sources are not running"))?;
    let (channel, data) = (checked.channel(), checked.data());
    match sources.write(source, channel, data.clone()).await {
        Err(WriteError::NotHere(_)) if forward::in_cluster(node) => {
            *forwarded = true;
            forward::send(node, source, channel, data.clone()).await
        }
        result => result.map_err(api_error),
    }
}

/// Sources some namespace writes to (`write_source`), each once, in name order.
fn written_sources(node: &Node) -> Vec<&str> {
    let mut names: Vec<&str> = node.config.namespaces.values().filter_map(|ns| ns.write_source.as_deref()).collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// What a client is told of a failed write.
fn api_error(e: WriteError) -> ApiError {
    let code = match e {
        WriteError::Refused(_) => code::DEVICE_REFUSED,
        WriteError::Unavailable(_) | WriteError::NotHere(_) => code::UNAVAILABLE,
        WriteError::NotWritable(_) => code::BAD_REQUEST,
        WriteError::Forbidden(_) => code::FORBIDDEN,
    };
    ApiError::new(code, e.to_string())
}

/// Prometheus text of the sources (none configured: empty): their counters, and the writes
/// forwarded between nodes.
pub fn render_metrics(node: &Node) -> String {
    let Some(sources) = node.sources.get() else { return String::new() };
    crate::metrics::render_sources(&sources.handles())
        + &node.metrics.historical.render()
        + &node.forwarded.render()
        + &node.writes.render(&written_sources(node))
}
