//! `switchboard demo`'s optional MQTT path: when mosquitto is installed, a mosquitto on a spare
//! loopback port, a few topics fed once a second by `mosquitto_pub -l`, and an MQTT source
//! (`demo-mqtt`) that reads `demo/#` into `pt:demo.*`. Without mosquitto: nothing, quietly.
//!
//! It also runs the control room's simulated device: a flow controller that takes its setpoint
//! on `set/demo/line1/flow` (heard through `mosquitto_sub`) and reports a flow that follows it
//! on `demo/line1/flow`. Operators write the setpoint through the namespace `cmd`, written to
//! the source `demo-set` (topics `set/#`, channels `cmd:{topic}`): a permitted publish to
//! `cmd:set.demo.line1.flow` becomes the MQTT publish the device reads, and the source hears it
//! back, so the channel shows the setpoint last written. `demo/line1/ambient` is published
//! once (retained) and never again: the demo's stale point.

use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::alarms::def::AlarmDef;
use crate::config::Config;

/// The processes of the demo's MQTT path; dropping it stops them and removes their directory.
pub struct DemoMqtt {
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for DemoMqtt {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A program on `PATH`, or in `/usr/sbin` (where Debian puts mosquitto).
fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain([PathBuf::from("/usr/sbin")]).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Topics the demo publishes and the value of each at second `i`; `flow` is the simulated
/// device's reported flow.
fn value(topic: &str, i: u64, flow: f64) -> String {
    match topic {
        "demo/line1/temperature" => format!("{:.2}", 60.0 + 5.0 * (i as f64 / 10.0).sin()),
        "demo/line1/running" => (i % 20 < 15).to_string(),
        "demo/line1/flow" => format!("{flow:.2}"),
        _ => (if i % 20 < 15 { "RUNNING" } else { "STOPPED" }).to_string(),
    }
}

/// The demo's alarms (`[[alarms]]`, docs/alarms.md) over the points of its MQTT path: the
/// line's temperature (HI, HIHI), its flow (LO, HI and HIHI as the operator's setpoint takes
/// it) and a pattern over every line 1 point (not updated for 10 s: the ambient point).
pub const DEMO_ALARMS: &str = include_str!("demo-alarms.toml");

/// The definitions of [`DEMO_ALARMS`], validated as the configuration's are.
pub fn alarms() -> Result<Vec<AlarmDef>, String> {
    #[derive(serde::Deserialize)]
    struct File {
        alarms: Vec<AlarmDef>,
    }
    let file: File = toml::from_str(DEMO_ALARMS).map_err(|e| e.to_string())?;
    for (i, def) in file.alarms.iter().enumerate() {
        def.validate().map_err(|e| format!("alarms[{i}].{e}"))?;
    }
    Ok(file.alarms)
}

const TOPICS: [&str; 4] = ["demo/line1/temperature", "demo/line1/running", "demo/line1/state", "demo/line1/flow"];
/// Where the simulated device takes its setpoint, and the setpoint it starts with.
const SETPOINT_TOPIC: &str = "set/demo/line1/flow";
const FIRST_SETPOINT: f64 = 40.0;

/// The simulated flow controller: each second the flow moves a third of the way to the
/// setpoint, with a little noise.
struct Device {
    setpoint: f64,
    flow: f64,
}

impl Device {
    fn step(&mut self) -> f64 {
        self.flow += (self.setpoint - self.flow) / 3.0 + (fastrand::f64() - 0.5) * 0.2;
        self.flow
    }
}

/// The setpoint in a command the device received: `{"v": 55, ...}`, or a bare number.
fn setpoint_of(line: &str) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    v.get("v").unwrap_or(&v).as_f64().filter(|f| f.is_finite())
}

/// Starts the MQTT path and adds its source to `config`; `None` when mosquitto or
/// `mosquitto_pub` is missing or the broker does not start.
pub fn start(config: &mut Config) -> Option<DemoMqtt> {
    let (broker, publisher) = (find("mosquitto")?, find("mosquitto_pub")?);
    let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
    let dir = std::env::temp_dir().join(format!("switchboard-demo-mqtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let conf = dir.join("mosquitto.conf");
    std::fs::write(&conf, format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")).ok()?;
    let quiet = |c: &mut Command| {
        c.stdout(Stdio::null()).stderr(Stdio::null());
    };
    let mut cmd = Command::new(broker);
    cmd.arg("-c").arg(&conf).stdin(Stdio::null());
    quiet(&mut cmd);
    let mut demo = DemoMqtt { children: vec![cmd.spawn().ok()?], dir };
    if !listening(port, Duration::from_secs(3)) {
        return None;
    }
    // The first setpoint and the stale point, retained so the sources find them when they
    // subscribe.
    for (topic, payload) in
        [(SETPOINT_TOPIC, format!("{{\"v\":{FIRST_SETPOINT}}}")), ("demo/line1/ambient", "21.5".into())]
    {
        let mut cmd = Command::new(&publisher);
        cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1", "-r", "-t", topic, "-m", &payload]);
        quiet(&mut cmd);
        cmd.status().ok()?;
    }
    let device = Arc::new(Mutex::new(Device { setpoint: FIRST_SETPOINT, flow: 0.0 }));
    let mut cmd = Command::new(find("mosquitto_sub")?);
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1", "-t", SETPOINT_TOPIC]).stdin(Stdio::null());
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut listener = cmd.spawn().ok()?;
    let commands = listener.stdout.take()?;
    demo.children.push(listener);
    let heard = device.clone();
    // The device's command line: until mosquitto_sub is gone (the demo stopped).
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(commands).lines().map_while(Result::ok) {
            if let (Some(sp), Ok(mut d)) = (setpoint_of(&line), heard.lock()) {
                d.setpoint = sp;
            }
        }
    });
    let mut feeds = Vec::new();
    for topic in TOPICS {
        let mut cmd = Command::new(&publisher);
        cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1", "-l", "-t", topic]).stdin(Stdio::piped());
        quiet(&mut cmd);
        let mut child = cmd.spawn().ok()?;
        feeds.push((topic, child.stdin.take()?));
        demo.children.push(child);
    }
    // One line per topic per second until the publishers are gone (the demo stopped).
    std::thread::spawn(move || {
        for i in 0.. {
            let flow = device.lock().map(|mut d| d.step()).unwrap_or(0.0);
            for (topic, feed) in &mut feeds {
                if writeln!(feed, "{}", value(topic, i, flow)).and_then(|_| feed.flush()).is_err() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let source = format!(
        "kind = \"mqtt\"\nname = \"demo-mqtt\"\nurl = \"mqtt://127.0.0.1:{port}\"\ntopics = [\"demo/#\"]\n\
         channel = \"pt:{{topic}}\"\nclean_session = true\n"
    );
    config.sources.push(toml::from_str(&source).ok()?);
    let writes = format!(
        "kind = \"mqtt\"\nname = \"demo-set\"\nurl = \"mqtt://127.0.0.1:{port}\"\ntopics = [\"set/#\"]\n\
         channel = \"cmd:{{topic}}\"\nclean_session = true\n"
    );
    config.sources.push(toml::from_str(&writes).ok()?);
    let namespace = "client_publish = true\nwrite_source = \"demo-set\"\nconflate = false\n";
    config.namespaces.insert("cmd".into(), toml::from_str(namespace).ok()?);
    // The alarms over the points this path publishes (the unit test keeps them valid).
    match alarms() {
        Ok(defs) => config.alarms.extend(defs),
        Err(e) => eprintln!("switchboard demo: the demo's alarms are not defined ({e})"),
    }
    eprintln!(
        "switchboard demo: MQTT sources on a mosquitto at 127.0.0.1:{port} (topics demo/#, channels pt:demo.*; \
         writes to cmd:set.demo.* go to set/demo/...)"
    );
    Some(demo)
}

fn listening(port: u16, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo's alarms are valid definitions over channels its MQTT path publishes.
    #[test]
    fn demo_alarms_are_valid_over_the_demo_points() {
        let defs = alarms().unwrap();
        assert_eq!(defs.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["line1-temp", "line1-flow", "stale"]);
        for d in &defs {
            assert!(d.channel.starts_with("pt:demo.line1."), "{}", d.channel);
        }
        assert!(defs[2].is_pattern() && defs[2].stale_s > 0.0);
    }
}
