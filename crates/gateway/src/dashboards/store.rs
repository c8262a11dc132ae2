//! The store of saved dashboards ([`DashboardStore`]): one JSON file each, replaced by an
//! atomic rename, listed from cached summaries; and who may change one ([`Editor`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Deserialize;
use switchboard_protocol::code;

use super::body::{validate_id, Dashboard, DashboardBody, Summary, MAX_DASHBOARDS};
use crate::auth::DashboardAccess;
use crate::log_limit::LogLimit;
use crate::node::ApiError;

/// Who saves or deletes a dashboard.
#[derive(Debug, Clone, Copy)]
pub struct Editor<'a> {
    /// The caller's user name (empty without credentials).
    pub user: &'a str,
    /// What the caller may do: `Edit` for an API key (operators' tooling), else the user's
    /// `[auth.grants.<user>] dashboards` (`Own` by default and without credentials).
    pub access: DashboardAccess,
}

impl Editor<'_> {
    /// Anyone, on a node without authentication (and in tests).
    pub const ANYONE: Editor<'static> = Editor { user: "", access: DashboardAccess::Edit };

    /// Whether this editor may create dashboard `id` (`owner` is `None`) or replace or delete
    /// it (`owner` is its owner, `""` for none). `Read` may do neither; `Edit` may do both;
    /// `Own` may create, and change only its own dashboards and those without an owner.
    fn may_change(&self, id: &str, owner: Option<&str>) -> Result<(), ApiError> {
        match (self.access, owner) {
            (DashboardAccess::Edit, _) | (DashboardAccess::Own, None) => Ok(()),
            (DashboardAccess::Own, Some(owner)) if owner.is_empty() || owner == self.user => Ok(()),
            (DashboardAccess::Own, Some(owner)) => Err(ApiError::new(
                code::FORBIDDEN,
                format!(
                    "dashboard {id:?} belongs to {owner:?}: only its owner, a user granted \
                     dashboards = \"edit\" or an API key may change it"
                ),
            )),
            (DashboardAccess::Read, _) => Err(ApiError::new(
                code::FORBIDDEN,
                format!(
                    "user {:?} may only read dashboards (its grant says dashboards = \"read\"): \
                     not allowed to change dashboard {id:?}",
                    self.user
                ),
            )),
        }
    }
}

/// The 500 of a store that failed: the client is told which step failed, the io error (paths,
/// `os error` numbers) goes to the log only.
fn internal(what: &str, e: std::io::Error) -> ApiError {
    // Every request meets a failing store: one line per interval for all of them.
    static STORE_FAILED: LogLimit = LogLimit::new();
    if let Some(suppressed) = STORE_FAILED.admit() {
        tracing::warn!(error = %e, what, suppressed, "dashboard store");
    }
    ApiError::new(code::INTERNAL, format!("dashboard store unavailable ({what})"))
}

/// Saved dashboards, one JSON file each in `dir`.
pub struct DashboardStore {
    dir: PathBuf,
    /// Serializes writers (PUT and DELETE are rare) so that the count limit holds and a
    /// temporary file has one writer. Readers take no lock: a rename replaces a file atomically.
    write: tokio::sync::Mutex<()>,
    tmp_seq: AtomicU64,
    /// Summaries by id with the file's modification time and length when read: a listing reads
    /// only the files that changed since (one `stat` per file otherwise). Bounded by the
    /// dashboards on disk (entries of removed files are dropped by the next listing).
    pub(super) summaries: parking_lot::Mutex<std::collections::HashMap<String, (std::time::SystemTime, u64, Summary)>>,
}

impl DashboardStore {
    pub fn new(dir: PathBuf) -> DashboardStore {
        DashboardStore {
            dir,
            write: tokio::sync::Mutex::new(()),
            tmp_seq: AtomicU64::new(0),
            summaries: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }

    fn file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// The stored file's bytes, exactly as `GET` returns them.
    pub async fn get(&self, id: &str) -> Result<Vec<u8>, ApiError> {
        validate_id(id)?;
        match tokio::fs::read(self.file(id)).await {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(ApiError::new(code::NOT_FOUND, format!("no dashboard {id:?}")))
            }
            Err(e) => Err(internal("reading dashboard", e)),
        }
    }

    /// Stores `body` as dashboard `id`; returns its summary and whether it is new.
    pub async fn put(&self, id: &str, body: DashboardBody, editor: Editor<'_>) -> Result<(Summary, bool), ApiError> {
        validate_id(id)?;
        let _guard = self.write.lock().await;
        tokio::fs::create_dir_all(&self.dir).await.map_err(|e| internal("creating the data directory", e))?;
        let path = self.file(id);
        let existed = tokio::fs::try_exists(&path).await.map_err(|e| internal("reading dashboard", e))?;
        // An existing dashboard keeps its owner, whatever the editor's rights.
        let owner = if existed { Some(self.owner(id).await) } else { None };
        editor.may_change(id, owner.as_deref())?;
        let owner = owner.unwrap_or_else(|| editor.user.to_string());
        let dashboard = Dashboard {
            id: id.to_string(),
            title: body.title,
            widgets: body.widgets,
            updated: switchboard_broker::now_ms(),
            owner,
        };
        let bytes =
            serde_json::to_vec(&dashboard).map_err(|e| internal("writing dashboard", std::io::Error::other(e)))?;
        if !existed && self.ids().await?.len() >= MAX_DASHBOARDS {
            return Err(ApiError::new(code::LIMIT, format!("at most {MAX_DASHBOARDS} dashboards are kept")));
        }
        let seq = self.tmp_seq.fetch_add(1, Relaxed);
        let tmp = self.dir.join(format!(".{id}.{}.{seq}.tmp", std::process::id()));
        let written = write_synced(&tmp, bytes).await;
        if let Err(e) = written {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(internal("writing dashboard", e));
        }
        if let Err(e) = tokio::fs::rename(&tmp, &path).await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(internal("writing dashboard", e));
        }
        let summary = Summary {
            id: dashboard.id,
            title: dashboard.title,
            widget_count: dashboard.widgets.len(),
            updated: dashboard.updated,
        };
        Ok((summary, !existed))
    }

    /// The owner recorded in a stored dashboard ('' for none, or a file that does not parse).
    async fn owner(&self, id: &str) -> String {
        #[derive(Deserialize)]
        struct Owner {
            #[serde(default)]
            owner: String,
        }
        let bytes = tokio::fs::read(self.file(id)).await.unwrap_or_default();
        serde_json::from_slice::<Owner>(&bytes).map(|o| o.owner).unwrap_or_default()
    }

    pub async fn delete(&self, id: &str, editor: Editor<'_>) -> Result<(), ApiError> {
        validate_id(id)?;
        let _guard = self.write.lock().await;
        editor.may_change(id, Some(&self.owner(id).await))?;
        match tokio::fs::remove_file(self.file(id)).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(ApiError::new(code::NOT_FOUND, format!("no dashboard {id:?}")))
            }
            Err(e) => Err(internal("deleting dashboard", e)),
        }
    }

    /// Ids of the stored dashboards, sorted.
    async fn ids(&self) -> Result<Vec<String>, ApiError> {
        let mut dir = match tokio::fs::read_dir(&self.dir).await {
            Ok(dir) => dir,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(internal("listing dashboards", e)),
        };
        let mut ids = Vec::new();
        while let Some(entry) = dir.next_entry().await.map_err(|e| internal("listing dashboards", e))? {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else { continue };
            if validate_id(id).is_ok() {
                ids.push(id.to_string());
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// Summaries of every stored dashboard, sorted by id. A file that no longer parses (edited
    /// by hand) is listed with its id and an empty title rather than hiding the others.
    pub async fn list(&self) -> Result<Vec<Summary>, ApiError> {
        let mut out = Vec::new();
        let ids = self.ids().await?;
        for id in &ids {
            let path = self.file(id);
            let Ok(meta) = tokio::fs::metadata(&path).await else { continue };
            let stamp = (meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len());
            let cached = self.summaries.lock().get(id).filter(|(m, l, _)| (*m, *l) == stamp).map(|(_, _, s)| s.clone());
            if let Some(summary) = cached {
                out.push(summary);
                continue;
            }
            let Ok(bytes) = tokio::fs::read(&path).await else { continue };
            let summary = match serde_json::from_slice::<Dashboard>(&bytes) {
                Ok(d) => Summary { id: id.clone(), title: d.title, widget_count: d.widgets.len(), updated: d.updated },
                Err(e) => {
                    tracing::warn!(dashboard = %id, error = %e, "unreadable dashboard file");
                    Summary { id: id.clone(), title: String::new(), widget_count: 0, updated: 0 }
                }
            };
            self.summaries.lock().insert(id.clone(), (stamp.0, stamp.1, summary.clone()));
            out.push(summary);
        }
        self.summaries.lock().retain(|id, _| ids.binary_search(id).is_ok());
        Ok(out)
    }
}

async fn write_synced(path: &Path, bytes: Vec<u8>) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut f = tokio::fs::File::create(path).await?;
    f.write_all(&bytes).await?;
    f.sync_all().await
}
