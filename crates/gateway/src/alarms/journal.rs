//! The alarm journal: every transition and definition change, one entry each, kept by the
//! broker as the log `alarms.journal` (a Redis stream, or files in the memory broker's
//! directory), bounded by `alarm_journal_days` and `alarm_journal_max_entries`.
//!
//! A read (`GET /api/alarms/journal`) goes newest first from its cursor, keeps the entries its
//! filters take, and stops at its `limit` or after scanning [`SCAN`] entries: its `next`
//! cursor goes on from where it stopped, so a narrow filter over a long journal answers in
//! bounded time and pages on.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchboard_broker::{BrokerError, LogKeep};

use super::def::Priority;
use super::state::{Kind, Severity, State, Transition};
use crate::node::Node;

pub const JOURNAL: &str = "alarms.journal";
/// Entries scanned by one read at most.
const SCAN: usize = 10_000;
/// Entries asked of the broker per step.
const STEP: usize = 1000;
pub const MAX_LIMIT: usize = 1000;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cursor: String,
    pub t: u64,
    pub alarm: String,
    pub kind: Kind,
    pub state: Option<State>,
    pub severity: Option<Severity>,
    pub priority: Option<Priority>,
    pub value: Option<f64>,
    pub user: Option<String>,
    pub comment: Option<String>,
}

impl Entry {
    pub fn of(t: &Transition) -> Entry {
        Entry {
            cursor: String::new(),
            t: t.status.since,
            alarm: t.status.id.clone(),
            kind: t.kind,
            state: Some(t.status.state),
            severity: t.status.severity,
            priority: Some(t.status.priority),
            value: t.status.value,
            user: t.user.clone(),
            comment: t.comment.clone(),
        }
    }

    /// A definition made, changed or removed by `user`.
    pub fn definition(kind: Kind, id: &str, priority: Priority, user: String) -> Entry {
        Entry {
            cursor: String::new(),
            t: switchboard_broker::now_ms(),
            alarm: id.to_string(),
            kind,
            state: None,
            severity: None,
            priority: Some(priority),
            value: None,
            user: Some(user),
            comment: None,
        }
    }
}

pub fn keep(node: &Node) -> LogKeep {
    LogKeep {
        max_entries: node.config.alarm_journal_max_entries,
        max_age_ms: Duration::from_secs(node.config.alarm_journal_days.saturating_mul(86_400)).as_millis() as u64,
    }
}

pub async fn append(node: &Node, entry: &Entry) {
    let Ok(text) = serde_json::to_string(entry) else { return };
    super::retry(node, "journal an alarm transition", || node.broker.log_append(JOURNAL, &text, keep(node))).await;
}

/// What a read takes.
#[derive(Debug, Default)]
pub struct Query {
    pub since_ms: Option<u64>,
    pub until_ms: Option<u64>,
    /// An alarm id, or a definition id (its pattern's alarms too).
    pub alarm: Option<String>,
    pub kinds: Vec<String>,
    pub limit: usize,
    pub cursor: Option<String>,
}

impl Query {
    fn takes(&self, e: &Entry) -> bool {
        self.since_ms.is_none_or(|s| e.t >= s)
            && self.until_ms.is_none_or(|u| e.t <= u)
            && self
                .alarm
                .as_deref()
                .is_none_or(|a| e.alarm == a || e.alarm.strip_prefix(a).is_some_and(|r| r.starts_with('.')))
            && (self.kinds.is_empty() || self.kinds.iter().any(|k| k == e.kind.as_str()))
    }
}

/// Entries newest first, and the cursor to go on from (`None`: nothing older).
pub async fn read(node: &Node, q: &Query) -> Result<(Vec<Entry>, Option<String>), BrokerError> {
    let mut out = Vec::new();
    // Nothing after `until_ms` is wanted: start there (cursors are times).
    let mut before = q.cursor.clone().or_else(|| q.until_ms.map(|u| format!("{}-0", u.saturating_add(1))));
    let mut scanned = 0;
    loop {
        let page = node.broker.log_read(JOURNAL, before.as_deref(), STEP).await?;
        let full = page.len() == STEP;
        for item in page {
            scanned += 1;
            before = Some(item.cursor.clone());
            let Ok(mut e) = serde_json::from_str::<Entry>(&item.entry) else { continue };
            if q.since_ms.is_some_and(|s| e.t < s) {
                return Ok((out, None));
            }
            if q.takes(&e) {
                e.cursor = item.cursor;
                out.push(e);
                if out.len() >= q.limit {
                    return Ok((out, before));
                }
            }
            if scanned >= SCAN {
                return Ok((out, before));
            }
        }
        if !full {
            return Ok((out, None));
        }
    }
}
