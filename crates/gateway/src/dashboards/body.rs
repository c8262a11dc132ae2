//! Saved dashboards as the API carries them: [`Dashboard`], its widgets and list entries, the
//! limits a body must keep, and the validation of ids and bodies (400s naming the field).

use serde::{Deserialize, Serialize};
use switchboard_protocol::code;

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

/// One entry of the list.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub id: String,
    pub title: String,
    pub widget_count: usize,
    pub updated: u64,
}

pub(super) fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(code::BAD_REQUEST, message)
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

pub(super) fn validate(id: &str, body: &DashboardBody) -> Result<(), ApiError> {
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
