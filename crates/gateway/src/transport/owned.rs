//! What a transport that owns its socket needs (a WebSocket connection after the upgrade, the
//! node's and the echo server's): deadlines as timers, and letting a client go without losing
//! the last bytes written to it (discarding what it still sends).

use std::io;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// How long a closing connection may take to write its last bytes and see the peer go.
pub const CLOSE_GRACE: Duration = Duration::from_secs(3);

/// A timer for the wall-clock `deadline` (a session's token expiry, a message in progress),
/// boxed so that a connection carries one only while it has a deadline.
pub fn timer_at(deadline: SystemTime) -> Pin<Box<Sleep>> {
    let at = Instant::now() + deadline.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
    Box::pin(tokio::time::sleep_until(at))
}

/// Reads what the client sent and discards it (a bounded amount per call); true when the
/// client closed or reset the connection.
fn discard_input(tcp: &TcpStream) -> bool {
    let mut buf = [0u8; 512];
    for _ in 0..128 {
        match tcp.try_read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
    false
}

/// Half-closes, then waits until `deadline` at most for the client to close, so what was
/// written is not lost to a reset (closing with unread input would send one).
pub async fn linger(tcp: &TcpStream, deadline: Instant) {
    let _ = socket2::SockRef::from(tcp).shutdown(std::net::Shutdown::Write);
    let _ = tokio::time::timeout_at(deadline, async {
        while tcp.readable().await.is_ok() {
            if discard_input(tcp) {
                return;
            }
        }
    })
    .await;
}
