//! Spare loopback ports.
//!
//! The kernel picks a free port (bind `127.0.0.1:0`), the listener is dropped and the port is
//! handed to a `redis-server`. Between the two another process may take it; callers therefore
//! retry with a fresh port when the server exits at start. Within one test process a port is
//! handed out only once, so concurrent tests of the same binary never race for one.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::{Mutex, PoisonError};

/// A cluster node also listens on its port + 10000 (the cluster bus).
pub(crate) const BUS_OFFSET: u16 = 10000;

/// Every port handed out by this process, bus ports included.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A port nobody listens on right now.
pub(crate) fn spare() -> u16 {
    pick(false)
}

/// A port that is free together with its cluster bus port (port + 10000).
pub(crate) fn spare_with_bus() -> u16 {
    pick(true)
}

fn pick(with_bus: bool) -> u16 {
    // A poisoned lock only means another test panicked while holding it; the set is still valid.
    let mut guard = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    let taken = guard.get_or_insert_with(HashSet::new);
    for _ in 0..1000 {
        let port = free_port();
        if taken.contains(&port) {
            continue;
        }
        if !with_bus {
            taken.insert(port);
            return port;
        }
        let Some(bus) = port.checked_add(BUS_OFFSET) else { continue };
        if taken.contains(&bus) || TcpListener::bind(("127.0.0.1", bus)).is_err() {
            continue;
        }
        taken.insert(port);
        taken.insert(bus);
        return port;
    }
    panic!("no spare loopback port found in 1000 attempts")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("bind 127.0.0.1:0: {e}"))
}
