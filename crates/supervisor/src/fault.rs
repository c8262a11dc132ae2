//! Failpoints: named places where a test injects a panic, to prove that it stays inside the
//! client, the subscriber or the task it hits.
//!
//! Compiled in only with the `failpoints` feature (test builds); without it [`hit`] is an empty
//! inline function and [`configure`] refuses. With it, a failpoint is configured at run time
//! with the `fail` crate's actions: `return(<target>)` panics where the failpoint is hit for
//! that target only (a connection id, a channel, a topic), `return` panics for every target,
//! `off` disarms it; a count limits it (`1*return(7)` panics once).
//!
//! The failpoints (where [`hit`] is called, and the target it passes):
//! - `hub.deliver`: the fan-out of one publication to one subscriber (connection id);
//! - `session.command`: a client's command, before it is handled (connection id);
//! - `redis.link.deliver`: the Redis link's reader, on a publication (channel);
//! - `source.decode`: a source's decode of one message or value (topic or node id);
//! - `simulator.tick`: one tick of the built-in simulator (`tick`).

/// Panics when the failpoint `name` is configured for `target` (or for every target).
#[cfg(feature = "failpoints")]
pub fn hit(name: &str, target: impl std::fmt::Display) {
    let fire = fail::eval(name, |arg| arg.is_none_or(|a| a == target.to_string()));
    if fire == Some(true) {
        panic!("failpoint {name} hit for {target}");
    }
}

/// Without the `failpoints` feature a failpoint is nothing at all.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str, _target: impl std::fmt::Display) {}

/// Configures failpoint `name` with `actions` (`return(<target>)`, `return`, `off`, `1*…`).
#[cfg(feature = "failpoints")]
pub fn configure(name: &str, actions: &str) -> Result<(), String> {
    fail::cfg(name, actions)
}

/// Without the `failpoints` feature there is nothing to configure.
#[cfg(not(feature = "failpoints"))]
pub fn configure(name: &str, _actions: &str) -> Result<(), String> {
    Err(format!("failpoint {name}: this build has no failpoints"))
}

/// Whether this build has failpoints.
pub const ENABLED: bool = cfg!(feature = "failpoints");
