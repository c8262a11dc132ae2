//! `switchboard echo`: a WebSocket echo server made of the node's own WebSocket code — the
//! handshake checks of `/ws` (`transport::ws`), its frame reader and closing
//! (`transport::ws::socket`), and the outbox that writes a node's frames — so that the
//! Autobahn TestSuite cases that need an echo, and `switchboard bench echo --protocol
//! json-echo`, run against the code that serves clients.
//!
//! Any path upgrades (`ws://ADDR/`), without subprotocols. permessage-deflate is negotiated as
//! on `/ws` (`transport::ws::extension`: RFC 7692, no context takeover, the server window the
//! client asks for), so the Autobahn cases of compression (12.x, 13.x) run here. Every text and
//! binary message (fragments joined, inflated when compressed, up to `max_message_bytes`) comes
//! back as one frame of the same type, compressed on a connection that negotiated it — every
//! message, even one that compression makes longer: the runner of the Autobahn cases hands an
//! uncompressed text echo on such a connection to the 12.x and 13.x cases in a form they fail
//! on, and RFC 7692 allows either. Pings get pongs with their payload; a close frame is
//! answered with its code; a violation of RFC 6455 fails the connection with 1002, 1007 or 1009
//! as on `/ws`. The server sends no pings of its own (an Autobahn case would count them as
//! unexpected events), and serves plain TCP only. Requests are read by the node's HTTP/1.1
//! (`transport::conn::serve_with`: hyper, the `Host` rules).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use bytes::Bytes;
use hyper::body::Incoming;
use switchboard_protocol::websocket::deflate::{deflate_frame, Agreed};
use switchboard_protocol::websocket::{self, Event};
use switchboard_protocol::Format;
use tokio::net::{TcpListener, TcpStream};

use crate::metrics::Metrics;
use crate::outbox::{Outbox, Pushed};
use crate::transport::ws::socket::{self, finish, FrameReader, Socket};
use crate::transport::ws::{accept_key, extension, is_upgrade, switching_protocols};

/// How long a client may take to send its upgrade request.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Room in the outbox beyond two of the largest messages (one being written, one queued) for
/// the small answers of one read.
const OUTBOX_SLACK: usize = 64 * 1024;

/// What `switchboard echo` was asked for.
#[derive(Debug, Clone)]
pub struct EchoOptions {
    pub listen: SocketAddr,
    /// Largest message echoed, fragments joined; larger fails the connection with 1009.
    pub max_message_bytes: usize,
    /// Worker threads (at most the cores).
    pub workers: usize,
}

/// Runs the echo server to its end: builds the runtime, binds, prints `switchboard echo
/// listening on ws://ADDR/` on stdout, and serves until SIGINT or SIGTERM.
pub fn run(options: EchoOptions) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.workers.max(1))
        .thread_name("switchboard-echo")
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = crate::server::bind(options.listen)
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", options.listen))?;
        let local = listener.local_addr()?;
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "switchboard echo listening on ws://{local}/");
            let _ = out.flush();
        }
        tracing::info!(%local, max_message_bytes = options.max_message_bytes, "echo server listening");
        let accept = tokio::spawn(accept_loop(listener, options.max_message_bytes));
        crate::server::wait_for_signal().await;
        accept.abort();
        Ok::<(), anyhow::Error>(())
    })?;
    rt.shutdown_timeout(Duration::from_millis(200));
    Ok(())
}

async fn accept_loop(listener: TcpListener, max_message: usize) {
    // Counted like a node's connections, though nothing reads them: the outbox needs some.
    let metrics = Arc::new(Metrics::default());
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of file descriptors, most likely: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        tokio::spawn(serve(tcp, max_message, metrics.clone()));
    }
}

/// Serves one TCP connection with hyper until its upgrade (or its end).
async fn serve(tcp: TcpStream, max_message: usize, metrics: Arc<Metrics>) {
    crate::transport::conn::serve_with(tcp, HANDSHAKE_TIMEOUT, move |req| {
        std::future::ready(handshake(req, max_message, metrics.clone()))
    })
    .await;
}

/// Answers an upgrade request on any path, and spawns the connection once upgraded.
fn handshake(mut req: Request<Incoming>, max_message: usize, metrics: Arc<Metrics>) -> Response<Body> {
    if !is_upgrade(req.method(), req.headers()) {
        let mut r = Response::new(Body::from("a WebSocket echo server: connect with ws://"));
        *r.status_mut() = StatusCode::BAD_REQUEST;
        return r;
    }
    let accept = match accept_key(req.headers()) {
        Ok(accept) => accept,
        Err(refused) => return *refused,
    };
    let agreed = extension(req.headers());
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await.ok().and_then(socket::take) {
            Some((socket, leftover)) => connection(socket, leftover, max_message, metrics, agreed).await,
            None => tracing::debug!("upgrade failed"),
        }
    });
    switching_protocols(&accept, None, agreed)
}

/// Echoes one connection's messages until it closes or fails. `deflate`: what the connection
/// agreed to, when it negotiated permessage-deflate.
async fn connection(
    socket: Socket,
    leftover: Vec<u8>,
    max_message: usize,
    metrics: Arc<Metrics>,
    deflate: Option<Agreed>,
) {
    let _ = socket.tcp().set_nodelay(true);
    let bound = max_message.saturating_mul(2).saturating_add(OUTBOX_SLACK);
    let outbox = Outbox::new(0, Format::Json, socket.wire(), bound, metrics);
    let window = deflate.map(|a| a.server_window);
    let mut reader = FrameReader::new(max_message, deflate.is_some());
    let mut events = Vec::new();
    let mut read = reader.feed(&leftover, &mut events);
    loop {
        // What came before a violation is answered before the connection fails.
        answer(&outbox, &mut events, window);
        if let Err(e) = std::mem::replace(&mut read, Ok(())) {
            e.close(&outbox);
        }
        if outbox.is_closing() {
            break;
        }
        // Back-pressure: a client that does not read its echoes is not read either.
        let full = outbox.is_full();
        tokio::select! {
            _ = outbox.notified() => {}
            r = socket.tcp().writable(), if outbox.is_blocked() => match r {
                Ok(()) => outbox.flush_blocked(),
                Err(_) => break,
            },
            r = socket.tcp().readable(), if !full => match r {
                Ok(()) => read = reader.read(&socket, &mut events).map(drop),
                Err(_) => break,
            },
        }
    }
    finish(&socket, &outbox).await;
}

/// Queues the answers to `events` and writes them; `window`: compress the echoes for a client
/// window of this many bits (permessage-deflate).
fn answer(outbox: &Outbox, events: &mut Vec<Event>, window: Option<u8>) {
    let mut flush = false;
    for ev in events.drain(..) {
        let pushed = match ev {
            Event::Message(opcode, payload) => {
                // Each echo is its own message, compressed on its own: written as is.
                let frame = window.and_then(|w| deflate_frame(opcode, &payload, w)).map(|(f, _)| f);
                outbox.push_control(frame.unwrap_or_else(|| Bytes::from(websocket::encode_frame(opcode, &payload))))
            }
            Event::Ping(payload) => {
                outbox.push_control(Bytes::from(websocket::encode_frame(websocket::Opcode::Pong, &payload)))
            }
            Event::Close(code) => {
                socket::answer_close(outbox, code);
                break;
            }
        };
        flush |= pushed == Pushed::Schedule;
    }
    events.clear();
    if flush {
        outbox.flush();
    }
}
