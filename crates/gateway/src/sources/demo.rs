//! `switchboard demo`'s optional MQTT path: when mosquitto is installed, a mosquitto on a spare
//! loopback port, a few topics fed once a second by `mosquitto_pub -l`, and an MQTT source
//! (`demo-mqtt`) that reads `demo/#` into `pt:demo.*`. Without mosquitto: nothing, quietly.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// Topics the demo publishes and the value of each at second `i`.
fn value(topic: &str, i: u64) -> String {
    match topic {
        "demo/line1/temperature" => format!("{:.2}", 60.0 + 5.0 * (i as f64 / 10.0).sin()),
        "demo/line1/running" => (i % 20 < 15).to_string(),
        _ => (if i % 20 < 15 { "RUNNING" } else { "STOPPED" }).to_string(),
    }
}

const TOPICS: [&str; 3] = ["demo/line1/temperature", "demo/line1/running", "demo/line1/state"];

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
            for (topic, feed) in &mut feeds {
                if writeln!(feed, "{}", value(topic, i)).and_then(|_| feed.flush()).is_err() {
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
    eprintln!("switchboard demo: MQTT source on a mosquitto at 127.0.0.1:{port} (topics demo/#, channels pt:demo.*)");
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
