//! The dashboard app's server side (SPEC §7): saved dashboards under `/api/dashboards`, kept as
//! JSON files in the data directory, and the built web app served at `/` and `/assets/*`.
//!
//! # Saved dashboards
//! `GET /api/dashboards` lists `[{"id", "title", "widget_count", "updated"}]`;
//! `GET /api/dashboards/{id}` returns `{"id", "title", "widgets", "updated"}`; `PUT` stores a
//! `{"title", "widgets": [{"type", "channel", "x", "y", "w", "h", "options"}]}` body (201 when
//! new, 200 when replaced); `DELETE` removes it (204, or 404). Bad input is a 400 whose message
//! names the offending field. Each dashboard is one file `<data_dir>/dashboards/<id>.json`,
//! written to a temporary file, synced and renamed over the old one, so a reader or a crash sees
//! either the old or the new dashboard, never half of one.
//!
//! Anyone who may use the API reads every dashboard. A dashboard created with credentials
//! belongs to its creator (`owner`, kept on every save); who may create, replace and delete is
//! [`Editor::may_change`]: the caller's `[auth.grants.<user>] dashboards` — `own` (default:
//! create, change its own and unowned ones), `edit` (change any) or `read` (nothing) — and API
//! keys change any. Refusals are 403 naming the reason.
//!
//! # The web app
//! The app is built by npm (`web/dashboard`, output `web/dashboard/dist`) and served from that
//! directory rather than embedded in the binary: `cargo build` then works on a fresh clone before
//! npm has ever run, and the app can be rebuilt without rebuilding the server. The directory is
//! `web_dir` when configured, else `web/dashboard/dist` under the working directory or under an
//! ancestor of the executable's directory (`target/release/switchboard` finds the repository's).
//! Without a build, `/` serves a minimal live channel page that says how to build the app.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use switchboard_protocol::code;

use crate::auth::http::Caller;
use crate::auth::{Auth, DashboardAccess, Method};
use crate::config::Config;
use crate::log_limit::LogLimit;
use crate::node::ApiError;

/// Largest accepted dashboard body (10,000 widgets with options fit comfortably).
pub const MAX_DASHBOARD_BYTES: usize = 8 * 1024 * 1024;
/// Most widgets in one dashboard.
pub const MAX_WIDGETS: usize = 20_000;
/// Most dashboards kept in one data directory.
pub const MAX_DASHBOARDS: usize = 1_000;
const MAX_ID_LEN: usize = 64;
const MAX_TITLE_LEN: usize = 200;
/// Largest `options` object of one widget, serialized.
const MAX_OPTIONS_BYTES: usize = 4096;
/// Positions are grid cells; the board is at most this many cells wide and tall.
const MAX_POS: u32 = 100_000;
/// Widget sizes are 1..=this many grid cells.
const MAX_SIZE: u32 = 1_000;

/// Where the built app lives relative to the repository root.
const WEB_BUILD: &str = "web/dashboard/dist";

/// A widget's kind; the wire names are the lower-case variant names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WidgetKind {
    Value,
    Led,
    Gauge,
    Trend,
    Spectrum,
    Scatter,
    /// An operator control (button, toggle, setpoint) that publishes to its channel.
    Control,
    /// The node's latest writes to devices (`GET /api/writes`); bound to no channel.
    Writes,
    /// The alarm journal (`GET /api/alarms/journal`) with filters; bound to no channel.
    #[serde(rename = "alarm-journal")]
    AlarmJournal,
}

/// One widget: its kind, the channel it shows (`""` while unbound), its place and size in grid
/// cells, and kind-specific options (labels, units, ranges, thresholds), kept as given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Widget {
    #[serde(rename = "type")]
    pub kind: WidgetKind,
    #[serde(default)]
    pub channel: String,
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
    #[serde(default)]
    pub options: serde_json::Map<String, serde_json::Value>,
}

/// A dashboard as a client sends it. `id` and `updated` are accepted so that an exported
/// dashboard can be sent back as it is; `id`, when present, must name the same dashboard.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DashboardBody {
    pub title: String,
    pub widgets: Vec<Widget>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub updated: Option<u64>,
    /// Ignored: a dashboard keeps the owner it was created with.
    #[serde(default)]
    pub owner: Option<String>,
}

/// A dashboard as stored and returned.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Dashboard {
    pub id: String,
    pub title: String,
    pub widgets: Vec<Widget>,
    /// Unix milliseconds of the last save.
    pub updated: u64,
    /// The user who created it (empty: created without credentials); only this user, a user
    /// granted `dashboards = "edit"` or an API key may change or delete it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
}

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

/// One entry of the list.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub id: String,
    pub title: String,
    pub widget_count: usize,
    pub updated: u64,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(code::BAD_REQUEST, message)
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

/// Dashboard ids are 1–64 characters of `[A-Za-z0-9_-]`: safe as file names on every platform
/// and in URLs without escaping.
pub fn validate_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(bad(format!("dashboard id {id:?}: must be 1-{MAX_ID_LEN} characters of A-Z a-z 0-9 _ -")))
    }
}

/// Parses and validates a dashboard body for `id`.
pub fn parse_body(id: &str, bytes: &[u8]) -> Result<DashboardBody, ApiError> {
    if bytes.len() > MAX_DASHBOARD_BYTES {
        return Err(ApiError::new(code::TOO_LARGE, format!("dashboard larger than {MAX_DASHBOARD_BYTES} bytes")));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let body: DashboardBody = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." { String::new() } else { format!("{path}: ") };
        bad(format!("{at}{} (expected {{\"title\", \"widgets\": [{{\"type\", \"channel\", \"x\", \"y\", \"w\", \"h\", \"options\"}}]}})", e.inner()))
    })?;
    validate(id, &body)?;
    Ok(body)
}

fn validate(id: &str, body: &DashboardBody) -> Result<(), ApiError> {
    if let Some(given) = &body.id {
        if given != id {
            return Err(bad(format!("id: body names dashboard {given:?} but the URL names {id:?}")));
        }
    }
    if body.title.chars().count() > MAX_TITLE_LEN {
        return Err(bad(format!("title: longer than {MAX_TITLE_LEN} characters")));
    }
    if body.widgets.len() > MAX_WIDGETS {
        return Err(ApiError::new(code::TOO_LARGE, format!("widgets: more than {MAX_WIDGETS}")));
    }
    for (i, w) in body.widgets.iter().enumerate() {
        if !w.channel.is_empty() {
            switchboard_protocol::validate_channel(&w.channel)
                .map_err(|e| bad(format!("widgets[{i}].channel: {e}")))?;
        }
        if w.x > MAX_POS || w.y > MAX_POS {
            return Err(bad(format!("widgets[{i}]: x and y must be 0-{MAX_POS} grid cells")));
        }
        if !(1..=MAX_SIZE).contains(&w.w) || !(1..=MAX_SIZE).contains(&w.h) {
            return Err(bad(format!("widgets[{i}]: w and h must be 1-{MAX_SIZE} grid cells")));
        }
        let options_len = serde_json::to_vec(&w.options).map(|v| v.len()).unwrap_or(usize::MAX);
        if options_len > MAX_OPTIONS_BYTES {
            return Err(bad(format!("widgets[{i}].options: larger than {MAX_OPTIONS_BYTES} bytes")));
        }
    }
    Ok(())
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
    summaries: parking_lot::Mutex<std::collections::HashMap<String, (std::time::SystemTime, u64, Summary)>>,
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

/// The built web app's directory, looked up on each request for `/` so that building the app
/// while the server runs is enough.
pub struct WebApp {
    candidates: Vec<PathBuf>,
}

impl WebApp {
    /// `configured` wins; otherwise `web/dashboard/dist` under the working directory, then under
    /// each ancestor of the executable's directory.
    pub fn new(configured: Option<&Path>) -> WebApp {
        if let Some(dir) = configured {
            return WebApp { candidates: vec![dir.to_path_buf()] };
        }
        let mut candidates = vec![PathBuf::from(WEB_BUILD)];
        if let Ok(exe) = std::env::current_exe() {
            candidates.extend(exe.ancestors().skip(1).take(4).map(|a| a.join(WEB_BUILD)));
        }
        WebApp { candidates }
    }

    /// The first candidate that holds a built app.
    pub fn dir(&self) -> Option<&Path> {
        self.candidates.iter().map(PathBuf::as_path).find(|d| d.join("index.html").is_file())
    }
}

/// The page served when the app is not built.
const FALLBACK_PAGE: &str = include_str!("index.html");

/// Shared state of the dashboard routes.
pub struct Dashboards {
    pub store: DashboardStore,
    pub app: WebApp,
    /// For each caller's `dashboards` grant.
    pub auth: Arc<Auth>,
}

impl Dashboards {
    pub fn new(config: &Config) -> Dashboards {
        Dashboards {
            store: DashboardStore::new(config.data_dir.join("dashboards")),
            app: WebApp::new(config.web_dir.as_deref()),
            auth: config.security.auth.clone(),
        }
    }
}

/// The dashboard routes: `/api/dashboards[/{id}]`, `/` and `/assets/{file}`.
pub fn router<S: Clone + Send + Sync + 'static>(config: &Config) -> Router<S> {
    let state = Arc::new(Dashboards::new(config));
    match state.app.dir() {
        Some(dir) => tracing::info!(web_dir = %dir.display(), "serving the dashboard app"),
        None => tracing::info!("dashboard app not built (make build); serving the minimal page at /"),
    }
    Router::new()
        .route("/api/dashboards", get(list))
        .route("/api/dashboards/{id}", get(get_one).put(put_one).delete(delete_one))
        .route("/", get(index))
        .route("/assets/{file}", get(asset))
        .with_state(state)
}

async fn list(State(d): State<Arc<Dashboards>>) -> Result<Response, ApiError> {
    Ok(Json(d.store.list().await?).into_response())
}

async fn get_one(State(d): State<Arc<Dashboards>>, UrlPath(id): UrlPath<String>) -> Result<Response, ApiError> {
    let bytes = d.store.get(&id).await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], bytes).into_response())
}

/// Who is calling, from the authentication middleware (no user when the node has no
/// authentication), and what its grant lets it do.
fn editor<'a>(auth: &Auth, caller: &'a Option<axum::Extension<Caller>>) -> Editor<'a> {
    let who = caller.as_ref().map(|c| &c.0 .0);
    match who.map(|i| (i.method, i.user.as_str())) {
        Some((Method::ApiKey(_), user)) => Editor { user, access: DashboardAccess::Edit },
        Some((Method::Token | Method::Password | Method::Hook, user)) => {
            Editor { user, access: auth.dashboard_access(user) }
        }
        Some((Method::Anonymous, _)) | None => Editor { user: "", access: DashboardAccess::Own },
    }
}

async fn put_one(
    State(d): State<Arc<Dashboards>>,
    UrlPath(id): UrlPath<String>,
    caller: Option<axum::Extension<Caller>>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    validate_id(&id)?;
    let body = parse_body(&id, &body)?;
    let (summary, created) = d.store.put(&id, body, editor(&d.auth, &caller)).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(summary)).into_response())
}

async fn delete_one(
    State(d): State<Arc<Dashboards>>,
    UrlPath(id): UrlPath<String>,
    caller: Option<axum::Extension<Caller>>,
) -> Result<Response, ApiError> {
    d.store.delete(&id, editor(&d.auth, &caller)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn index(State(d): State<Arc<Dashboards>>) -> Response {
    if let Some(dir) = d.app.dir() {
        if let Ok(html) = tokio::fs::read(dir.join("index.html")).await {
            return ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], html)
                .into_response();
        }
    }
    Html(FALLBACK_PAGE).into_response()
}

/// Files of the built app. Names are plain file names (no directories, no leading dot), so a
/// request cannot leave the assets directory.
async fn asset(State(d): State<Arc<Dashboards>>, UrlPath(file): UrlPath<String>) -> Response {
    let safe = !file.starts_with('.')
        && file.len() <= 128
        && file.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    let Some(dir) = d.app.dir().filter(|_| safe) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match tokio::fs::read(dir.join("assets").join(&file)).await {
        Ok(bytes) => {
            ([(header::CONTENT_TYPE, content_type(&file)), (header::CACHE_CONTROL, "no-cache")], bytes).into_response()
        }
        Err(_) => StatusCode::NOT_FOUND.into_response(),
    }
}

fn content_type(file: &str) -> &'static str {
    match file.rsplit('.').next().unwrap_or("") {
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "woff2" => "font/woff2",
        "html" => "text/html; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// Id of the dashboard `switchboard demo` opens: the control room ([`control_room_dashboard`]).
pub const DEMO_ID: &str = "control-room";
/// Id of the demo's plant overview ([`demo_dashboard`]), installed beside the control room.
pub const PLANT_ID: &str = "demo";

/// The demo's control room, on the channels of its MQTT path (`crate::sources::demo`, present
/// when mosquitto is installed): the operator's setpoint written to a simulated flow
/// controller, the flow it reports (with colouring limits), the write audit, a stale point, a
/// temperature that crosses its limit now and then, and the journal of the demo's alarms
/// (`sources/demo-alarms.toml`) — value in, alarm, operator write, device answer and audit on
/// one screen.
pub fn control_room_dashboard() -> DashboardBody {
    use serde_json::json;
    use WidgetKind::*;
    let o = |pairs: &[(&str, serde_json::Value)]| -> serde_json::Map<String, serde_json::Value> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    };
    let w =
        |kind, channel: &str, x, y, w, h, options| Widget { kind, channel: channel.to_string(), x, y, w, h, options };
    let flow_limits = [("lo", json!(10)), ("hi", json!(70)), ("hihi", json!(85))];
    let widgets = vec![
        w(
            Control,
            "cmd:set.demo.line1.flow",
            0,
            0,
            8,
            5,
            o(&[
                ("label", json!("Flow setpoint (operator)")),
                ("control", json!("setpoint")),
                ("min", json!(0)),
                ("max", json!(100)),
                ("units", json!("m³/h")),
            ]),
        ),
        w(
            Value,
            "pt:demo.line1.flow",
            8,
            0,
            8,
            5,
            o(&[
                &[("label", json!("Flow (device)")), ("units", json!("m³/h")), ("decimals", json!(1))],
                &flow_limits[..],
            ]
            .concat()),
        ),
        w(
            Value,
            "pt:demo.line1.ambient",
            16,
            0,
            8,
            5,
            o(&[("label", json!("Ambient (no longer sent)")), ("units", json!("°C")), ("stale_s", json!(10))]),
        ),
        w(Value, "pt:demo.line1.state", 24, 0, 8, 5, o(&[("label", json!("Line 1 state")), ("stale_s", json!(10))])),
        w(
            Trend,
            "pt:demo.line1.flow",
            0,
            5,
            16,
            8,
            o(&[&[("label", json!("Flow follows the setpoint")), ("window_s", json!(120))], &flow_limits[..]].concat()),
        ),
        w(Writes, "", 16, 5, 20, 8, o(&[("label", json!("Write audit"))])),
        w(
            Value,
            "pt:demo.line1.temperature",
            0,
            13,
            8,
            4,
            o(&[("label", json!("Line 1 temp")), ("units", json!("°C")), ("decimals", json!(1)), ("hi", json!(64))]),
        ),
        w(Led, "pt:demo.line1.running", 8, 13, 4, 4, o(&[("label", json!("Running"))])),
        w(AlarmJournal, "", 12, 13, 24, 9, o(&[("label", json!("Alarm journal"))])),
    ];
    DashboardBody { title: "Control room".to_string(), widgets, id: None, updated: None, owner: None }
}

/// A dashboard of the demo plant: the simulator's channels `pt:sim.<i>` (by `i % 4`: random
/// walk, sine, boolean, 64-bin spectrum) and the demo chat room.
pub fn demo_dashboard() -> DashboardBody {
    let o = |pairs: &[(&str, serde_json::Value)]| -> serde_json::Map<String, serde_json::Value> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    };
    use serde_json::json;
    use WidgetKind::*;
    let w =
        |kind, channel: &str, x, y, w, h, options| Widget { kind, channel: channel.to_string(), x, y, w, h, options };
    let widgets = vec![
        w(
            Value,
            "pt:sim.0",
            0,
            0,
            8,
            4,
            o(&[("label", json!("Boiler 1 temp")), ("units", json!("°C")), ("decimals", json!(2))]),
        ),
        w(
            Value,
            "pt:sim.4",
            8,
            0,
            8,
            4,
            o(&[("label", json!("Boiler 2 temp")), ("units", json!("°C")), ("decimals", json!(2))]),
        ),
        w(
            Gauge,
            "pt:sim.8",
            16,
            0,
            8,
            8,
            o(&[("label", json!("Header temp")), ("min", json!(0)), ("max", json!(60)), ("units", json!("°C"))]),
        ),
        w(
            Gauge,
            "pt:sim.1",
            24,
            0,
            8,
            8,
            o(&[("label", json!("Pump P-101 vibration")), ("min", json!(-10)), ("max", json!(10))]),
        ),
        w(Led, "pt:sim.2", 0, 4, 4, 4, o(&[("label", json!("Valve V-2"))])),
        w(Led, "pt:sim.6", 4, 4, 4, 4, o(&[("label", json!("Valve V-6"))])),
        w(Led, "pt:sim.10", 8, 4, 4, 4, o(&[("label", json!("Valve V-10"))])),
        w(Led, "pt:sim.12", 12, 4, 4, 4, o(&[("label", json!("Tank > 32")), ("threshold", json!(32))])),
        w(Trend, "pt:sim.1", 0, 8, 16, 8, o(&[("label", json!("Vibration")), ("window_s", json!(60))])),
        w(Trend, "pt:sim.0", 16, 8, 16, 8, o(&[("label", json!("Boiler 1 temp")), ("window_s", json!(120))])),
        w(
            Spectrum,
            "pt:sim.3",
            0,
            16,
            16,
            8,
            o(&[("label", json!("Pump P-101 spectrum")), ("min", json!(0)), ("max", json!(50))]),
        ),
        w(Scatter, "pt:sim.1", 16, 16, 8, 8, o(&[("label", json!("Vibration X/Y")), ("x_channel", json!("pt:sim.5"))])),
        w(
            Spectrum,
            "pt:sim.7",
            24,
            16,
            8,
            8,
            o(&[("label", json!("Fan spectrum")), ("min", json!(0)), ("max", json!(50))]),
        ),
        w(Value, "room:lobby", 0, 24, 16, 3, o(&[("label", json!("room:lobby")), ("field", json!("text"))])),
        w(Value, "room:ops", 16, 24, 16, 3, o(&[("label", json!("room:ops")), ("field", json!("text"))])),
    ];
    DashboardBody { title: "Demo plant".to_string(), widgets, id: None, updated: None, owner: None }
}

/// Writes the demo's dashboards (the control room and the plant overview) into `data_dir`,
/// each unless one is already there (a user may have edited it). Runs before the runtime
/// starts, hence blocking I/O. Returns whether any was written.
pub fn install_demo(data_dir: &Path) -> std::io::Result<bool> {
    let mut written = false;
    for (id, body) in [(DEMO_ID, control_room_dashboard()), (PLANT_ID, demo_dashboard())] {
        written |= install(data_dir, id, body)?;
    }
    Ok(written)
}

fn install(data_dir: &Path, id: &str, body: DashboardBody) -> std::io::Result<bool> {
    let dir = data_dir.join("dashboards");
    let path = dir.join(format!("{id}.json"));
    if path.exists() {
        return Ok(false);
    }
    std::fs::create_dir_all(&dir)?;
    let d = Dashboard {
        id: id.to_string(),
        title: body.title,
        widgets: body.widgets,
        updated: switchboard_broker::now_ms(),
        owner: String::new(),
    };
    let bytes = serde_json::to_vec(&d).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!(".{id}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &path)?;
    Ok(true)
}

#[cfg(test)]
mod tests;
