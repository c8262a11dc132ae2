//! The demo's dashboards: the control room and the plant overview, written into the data
//! directory by `switchboard demo` unless already there.

use std::path::Path;

use super::body::{Dashboard, DashboardBody, Widget, WidgetKind};

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
