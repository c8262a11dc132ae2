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

mod body;
mod demo;
mod store;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

pub use body::{
    parse_body, validate_id, Dashboard, DashboardBody, Summary, Widget, WidgetKind, MAX_DASHBOARDS,
    MAX_DASHBOARD_BYTES, MAX_WIDGETS,
};
pub use demo::{control_room_dashboard, demo_dashboard, install_demo, DEMO_ID, PLANT_ID};
pub use store::{DashboardStore, Editor};

use crate::auth::http::Caller;
use crate::auth::{Auth, DashboardAccess, Method};
use crate::config::Config;
use crate::node::ApiError;

/// Where the built app lives relative to the repository root.
const WEB_BUILD: &str = "web/dashboard/dist";

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

#[cfg(test)]
mod tests;
