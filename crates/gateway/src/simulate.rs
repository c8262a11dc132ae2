//! `--simulate N@HZ`: N point channels `pt:sim.<i>` with plant-like values, published through
//! the same path as the HTTP API, in one batch per tick.
//!
//! Channel `i` carries, by `i % 4`: a random walk (temperature-like), a sine (vibration), a
//! boolean that flips now and then (a valve), or a 64-bin spectrum array.

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;

use crate::node::Node;

struct Point {
    channel: String,
    value: f64,
}

/// Starts the simulator, supervised (task `simulator`: after a panic it starts again from fresh
/// values; the channels' offsets go on); it stops when the node shuts down.
pub fn spawn(node: Arc<Node>, n: usize, hz: f64) {
    switchboard_supervisor::spawn("simulator", move |_| run(node.clone(), n, hz));
}

async fn run(node: Arc<Node>, n: usize, hz: f64) {
    let mut points: Vec<Point> =
        (0..n).map(|i| Point { channel: format!("pt:sim.{i}"), value: 20.0 + (i % 50) as f64 }).collect();
    let mut stop = node.stopping();
    if *stop.borrow() {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / hz));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let start = std::time::Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        switchboard_supervisor::fault::hit("simulator.tick", "tick");
        let t_ms = switchboard_broker::now_ms();
        let secs = start.elapsed().as_secs_f64();
        let batch = points
            .iter_mut()
            .enumerate()
            .filter_map(|(i, p)| {
                let v = next_value(i, p, secs);
                let raw = RawValue::from_string(format!("{{\"v\":{v},\"t\":{t_ms},\"q\":\"good\"}}")).ok()?;
                Some(node.check_own(&p.channel, Arc::new(raw)))
            })
            .collect();
        let _ = node.publish_batch(batch).await;
    }
}

fn next_value(i: usize, p: &mut Point, secs: f64) -> String {
    match i % 4 {
        0 => {
            p.value += (fastrand::f64() - 0.5) * 0.4;
            format!("{:.3}", p.value)
        }
        1 => format!("{:.4}", (secs * (0.2 + (i % 7) as f64 * 0.1) * std::f64::consts::TAU).sin() * 10.0),
        2 => {
            if fastrand::f64() < 0.05 {
                p.value = if p.value > 0.5 { 0.0 } else { 1.0 };
            }
            (p.value > 0.5).to_string()
        }
        _ => {
            let peak = 8.0 + 4.0 * (secs * 0.3).sin();
            let bins: Vec<String> = (0..64)
                .map(|b| {
                    let x = b as f64 - peak;
                    format!("{:.2}", 40.0 * (-x * x / 6.0).exp() + fastrand::f64() * 3.0)
                })
                .collect();
            format!("[{}]", bins.join(","))
        }
    }
}

/// Chatter in two demo rooms, one message every couple of seconds.
pub fn spawn_rooms(node: Arc<Node>) {
    const LINES: [&str; 6] = [
        "boiler 2 pressure back in band",
        "shift handover at 14:00",
        "pump P-101 vibration trending up",
        "who has the key to substation B?",
        "alarm on line 3 acknowledged",
        "coffee machine fixed",
    ];
    switchboard_supervisor::spawn("demo-rooms", move |_| chatter(node.clone(), LINES));
}

async fn chatter(node: Arc<Node>, lines: [&'static str; 6]) {
    let mut stop = node.stopping();
    if *stop.borrow() {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    let mut n = 0usize;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        n += 1;
        let room = if n.is_multiple_of(3) { "room:ops" } else { "room:lobby" };
        let text = lines[n % lines.len()];
        let user = ["ana", "ben", "chen", "dara"][n % 4];
        let body = serde_json::json!({"user": user, "text": text, "t": switchboard_broker::now_ms()}).to_string();
        let checked = RawValue::from_string(body).ok().and_then(|raw| node.check_own(room, Arc::new(raw)).ok());
        if let Some(checked) = checked {
            let _ = node.publish(checked).await;
        }
    }
}
