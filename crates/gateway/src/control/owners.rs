//! [`Owners`]: who each connection of the node is, for disconnects and revocations
//! (`crate::control`). Depends on nothing of the node, which holds it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::auth::{Identity, Method};

/// Who one connection is.
pub struct Owner {
    pub user: String,
    /// Whether it authenticated with a token (revocations only close those).
    pub token: bool,
    pub jti: Option<Arc<str>>,
    pub iat: Option<u64>,
}

/// Connection id → who it is; touched when a connection authenticates or ends, and read by
/// disconnects and revocations (a scan: both are rare). A parking_lot mutex, never held
/// across an await.
#[derive(Default)]
pub struct Owners {
    map: Mutex<HashMap<u64, Owner>>,
    pub counts: Closes,
}

/// Connections closed by disconnects and revocations on this node.
#[derive(Default)]
pub struct Closes {
    pub disconnected: AtomicU64,
    pub revoked: AtomicU64,
}

impl Owners {
    /// Records connection `id`'s identity (anonymous connections are forgotten).
    pub fn set(&self, id: u64, i: &Identity) {
        let mut map = self.map.lock();
        if i.is_anonymous() {
            map.remove(&id);
        } else {
            let owner =
                Owner { user: i.user.clone(), token: i.method == Method::Token, jti: i.jti.clone(), iat: i.issued_at };
            map.insert(id, owner);
        }
    }

    pub fn remove(&self, id: u64) {
        self.map.lock().remove(&id);
    }

    /// The connections whose owner passes `f`.
    pub fn matching(&self, f: impl Fn(&Owner) -> bool) -> Vec<u64> {
        self.map.lock().iter().filter(|(_, o)| f(o)).map(|(id, _)| *id).collect()
    }

    /// `switchboard_control_closes_total` by reason.
    pub fn render(&self) -> String {
        format!(
            "# HELP switchboard_control_closes_total Connections closed by /api/disconnect (4003) or a revocation (4001), on this node.\n\
             # TYPE switchboard_control_closes_total counter\n\
             switchboard_control_closes_total{{reason=\"disconnect\"}} {}\n\
             switchboard_control_closes_total{{reason=\"revoked\"}} {}\n",
            self.counts.disconnected.load(Relaxed),
            self.counts.revoked.load(Relaxed)
        )
    }
}
