//! An event stream that owns its socket: `GET /sse?channels=…` as the first request of a
//! plain connection (`transport::http1` reads it off the socket and routes it).
//!
//! Through hyper, every delivery to a stream would wake the task polling its response body,
//! which then writes. A stream that owns its socket is written like a WebSocket connection
//! instead: the fan-out that finds it idle frames the events (`outbox::framed`) and calls
//! `try_write`, so a delivery costs one write call and no task wake-up, and the connection
//! keeps no HTTP buffers while idle. The stream is opened by the same
//! [`open`](super::open) that admits and subscribes a stream through hyper, and the same
//! framer writes its events; [`run_opened`] serves it once its head is out. (A session's
//! stream, `?session=`, runs its own loop on the socket: `transport::session_stream`.)

use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use super::{end, Opened, PING};
use crate::node::Node;
use crate::outbox::{Outbox, Pushed};
use crate::transport::owned::{discard_input, linger, timer_at, CLOSE_GRACE};

/// Serves a stream opened on its socket once its head is written.
pub(crate) async fn run_opened(node: Arc<Node>, tcp: Arc<TcpStream>, opened: Box<Opened>) {
    // Boxed until here: an argument taken apart is kept in the future beside its parts, and
    // a session is large.
    let Opened { mut session, outbox, slot } = *opened;
    // The head is out: the events queued meanwhile (the subscribe's) follow it.
    outbox.flush_blocked();
    let gone = run(&node, &tcp, &mut session, &outbox).await;
    let teardown = Box::pin(end(node.clone(), session, outbox.clone()));
    match gone {
        true => teardown.await,
        false => drop(tokio::join!(teardown, Box::pin(finish(&tcp, &outbox)))),
    }
    drop(slot);
}

/// Runs an open stream until it closes (`false`) or its client is gone (`true`).
async fn run(node: &Node, tcp: &TcpStream, session: &mut crate::session::Session, outbox: &Outbox) -> bool {
    let heartbeat = Duration::from_secs(node.config.transports.sse_heartbeat_s);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    let mut deadline = session.deadline();
    let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = deadline.map(timer_at);
    loop {
        if outbox.is_closing() {
            return false;
        }
        let blocked = outbox.is_blocked();
        tokio::select! {
            _ = outbox.notified() => {}
            r = tcp.writable(), if blocked => match r {
                Ok(()) => outbox.flush_blocked(),
                Err(_) => return true,
            },
            r = tcp.readable() => {
                if r.is_err() || discard_input(tcp) {
                    return true;
                }
            }
            _ = tick.tick() => {
                outbox.last_seen.store(crate::unix_s(), Relaxed);
                if !outbox.wrote_since() && outbox.push_control(bytes::Bytes::from_static(PING)) == Pushed::Schedule {
                    outbox.flush();
                }
            }
            _ = async { match timer.as_mut() { Some(t) => t.as_mut().await, None => std::future::pending().await } } => {
                if let Some(reason) = session.check_deadline() {
                    outbox.close(reason.code, &reason.reason, true);
                }
                deadline = session.deadline();
                timer = deadline.map(timer_at);
            }
        }
    }
}

/// Writes out the last events (the `disconnect`), then lets the client go.
async fn finish(tcp: &TcpStream, outbox: &Outbox) {
    let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
    while !outbox.finished() {
        tokio::select! {
            r = tcp.writable() => match r {
                Ok(()) => outbox.flush_blocked(),
                Err(_) => return,
            },
            _ = outbox.notified() => {}
            _ = tokio::time::sleep_until(deadline) => return,
        }
    }
    linger(tcp, deadline).await;
}
