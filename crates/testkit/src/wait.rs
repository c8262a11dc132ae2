//! Bounded polling: every wait in the kit ends, with a message saying what did not happen.

use std::time::{Duration, Instant};

/// How often a condition is checked again.
const POLL: Duration = Duration::from_millis(50);

/// Checks `check` until it returns `Ok`, at most for `timeout`; panics naming `what` and the
/// last reason `check` gave for not being done yet.
pub(crate) fn until<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(v) => return v,
            Err(reason) if Instant::now() >= deadline => {
                panic!("{what}: not within {timeout:?}; last seen: {reason}")
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// The value of `name` in the `name:value` lines of an `INFO` or `CLUSTER INFO` reply.
pub(crate) fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim)
}
