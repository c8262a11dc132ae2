//! The accept loop and the node's whole life as one call.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::node::Node;

/// How long shutdown waits for clients to take their close frames.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Accepts connections until the node stops. Each TCP connection is served by hyper (HTTP/1.1
/// with upgrades, behind TLS when configured; see `transport::conn`); `/ws` upgrades hand the
/// socket to the WebSocket transport.
pub async fn accept_loop(node: Arc<Node>, listener: TcpListener) {
    let app = crate::api::router(node.clone());
    let mut stop = node.stopping();
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, most likely: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        tokio::spawn(crate::transport::conn::serve(node.clone(), app.clone(), tcp, peer));
    }
}

/// Runs a node to completion: builds the runtime (`workers` threads, at most the cores),
/// binds, prints `switchboard listening on http://ADDR` on stdout, serves, and on SIGINT or
/// SIGTERM disconnects every client with 4000 and returns.
pub fn run(config: Config) -> anyhow::Result<()> {
    run_node(config, false)
}

/// [`run`] plus a few chat rooms (`room:lobby`, `room:ops`) with simulated chatter, for
/// `switchboard demo`.
pub fn run_demo(config: Config) -> anyhow::Result<()> {
    run_node(config, true)
}

/// How long a starting node waits for a shared broker before it gives up (exit 2).
const BROKER_STARTUP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn run_node(config: Config, demo: bool) -> anyhow::Result<()> {
    let workers = config.worker_threads();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .max_blocking_threads(2)
        .thread_name("switchboard-worker")
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let addr = config.listen_addr()?;
        let listener = bind(addr).map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        let local = listener.local_addr()?;
        let simulate = config.simulate.clone();
        // Shared brokers connect in the background: the node serves at once, `/readyz` tells
        // when Redis is reachable.
        let broker: std::sync::Arc<dyn switchboard_broker::Broker> = if config.broker == "memory" {
            std::sync::Arc::new(
                switchboard_broker::MemoryBroker::with_max_channels(config.limits.max_channels)
                    .keeping_in(config.data_dir.join("broker")),
            )
        } else {
            switchboard_broker::from_url(&config.broker).map_err(|e| anyhow::anyhow!("broker: {e}"))?
        };
        // A node whose Redis cannot be reached at all when it starts is misconfigured (a wrong
        // host or port): say so at once (exit 2) rather than serve 503s. Once running, a lost
        // Redis only turns `/readyz` 503 until it returns.
        if broker.kind() != "memory" {
            let deadline = tokio::time::Instant::now() + BROKER_STARTUP_WAIT;
            while !broker.ready().await {
                if tokio::time::Instant::now() >= deadline {
                    return Err(crate::config::ConfigError(format!(
                        "broker: Redis not reachable within {} s of starting (check the address and that every \
                         server of the broker URL is up)",
                        BROKER_STARTUP_WAIT.as_secs()
                    ))
                    .into());
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        // Keys from an identity provider: a node that cannot get them would refuse every token.
        if let Some(keys) = config.security.auth.remote_keys() {
            keys.fetch_at_start().await?;
            keys.spawn_refresh();
        }
        // Shared brokers forget idle channels by key expiry: tell them each channel's keep.
        let keep = config.clone();
        broker.set_channel_ttl(std::sync::Arc::new(move |ch: &str| keep.channel_ttl(ch)));
        let node = Node::new(config, broker);
        node.spawn_heartbeats();
        node.spawn_channel_sweeper();
        crate::sources::start(&node);
        crate::control::start(&node);
        crate::alarms::start(&node).await;
        if let Some(sim) = simulate {
            let (n, hz) = crate::config::parse_simulate(&sim).map_err(anyhow::Error::msg)?;
            crate::simulate::spawn(node.clone(), n, hz);
        }
        if demo {
            crate::simulate::spawn_rooms(node.clone());
        }
        let auth = if node.config.auth_configured() { "on" } else { "off (anyone may connect)" };
        tracing::info!(%local, workers, node = %node.id, broker = node.broker.kind(), auth, "listening");
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let scheme = if node.config.security.tls.is_some() { "https" } else { "http" };
            let _ = writeln!(out, "switchboard listening on {scheme}://{local}");
            let _ = out.flush();
        }
        let accept = tokio::spawn(accept_loop(node.clone(), listener));
        wait_for_signal().await;
        node.shutdown(SHUTDOWN_GRACE).await;
        crate::sources::stopped(&node, Duration::from_secs(2)).await;
        accept.abort();
        tracing::info!("stopped");
        Ok::<(), anyhow::Error>(())
    })?;
    rt.shutdown_timeout(Duration::from_millis(200));
    Ok(())
}

/// Pending connections the kernel may queue before `accept` (capped by `net.core.somaxconn`):
/// connection storms of thousands of clients overflow the usual 1,024 and turn into SYN
/// retransmits of a second or more.
const LISTEN_BACKLOG: u32 = 8192;

pub(crate) fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

pub(crate) async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
