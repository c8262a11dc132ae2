//! Where an MQTT write may go. A write reaches only a topic the source was set up for:
//!
//! - a channel the source feeds is written to the topic that fed it (one path per channel,
//!   [`super::fed`]);
//! - any other channel maps to a topic through the template (`.` becomes `/`), which must be a
//!   plain topic — no wildcard (`+`, `#`), no empty level, no `.` or `..` level, not starting
//!   with `$`, no NUL — and
//! - either way the topic must match one of the source's write filters: `write_topics` when
//!   set, else its `topics`. A write outside them is forbidden (403): a permitted writer of
//!   `pt:*` cannot reach `elsewhere/valve` with the source's credentials because the source
//!   reads `plant/#`.

/// Whether `topic` is a plain topic a write may name; the reason when not.
pub fn plain(topic: &str) -> Result<(), String> {
    if topic.is_empty() {
        return Err("the topic is empty".into());
    }
    if topic.starts_with('$') {
        return Err(format!("topic {topic} starts with $ (broker topics take no writes)"));
    }
    if topic.contains(['+', '#', '\0']) {
        return Err(format!("topic {topic} contains a wildcard or NUL"));
    }
    if let Some(level) = topic.split('/').find(|l| l.is_empty() || *l == "." || *l == "..") {
        let what = if level.is_empty() { "an empty level" } else { "a . or .. level" };
        return Err(format!("topic {topic} has {what}"));
    }
    Ok(())
}

/// Whether `filter` is a valid topic filter (MQTT 3.1.1 §4.7.1): `#` only as the whole last
/// level, `+` only as a whole level, not empty, no NUL.
pub fn valid_filter(filter: &str) -> Result<(), String> {
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        let bad = match *level {
            "#" => i + 1 != levels.len(),
            "+" => false,
            l => l.contains(['#', '+']),
        };
        if bad {
            return Err(format!("{filter:?} is not a topic filter: + and # stand for whole levels, # only last"));
        }
    }
    if filter.is_empty() || filter.contains('\0') {
        return Err(format!("{filter:?} is not a topic filter"));
    }
    Ok(())
}

/// Whether the topic filter `filter` matches `topic` (MQTT 3.1.1 §4.7: `+` one level, `#` the
/// rest, at least the parent level; filters starting with a wildcard never match `$` topics).
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    let mut t = topic.split('/');
    for f in filter.split('/') {
        match (f, t.next()) {
            ("#", _) => return true,
            ("+", Some(_)) => {}
            (f, Some(level)) if f == level => {}
            _ => return false,
        }
    }
    t.next().is_none()
}

/// Checks a write's topic against the source's write filters.
pub fn allowed(filters: &[String], topic: &str) -> Result<(), String> {
    plain(topic)?;
    if filters.iter().any(|f| matches(f, topic)) {
        Ok(())
    } else {
        Err(format!("topic {topic} matches none of the source's write filters ({})", filters.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_filters_match_as_the_protocol_says() {
        assert!(matches("plant/#", "plant/a/b"));
        assert!(matches("plant/#", "plant"), "# includes the parent level");
        assert!(matches("plant/+/temp", "plant/l1/temp"));
        assert!(!matches("plant/+/temp", "plant/l1/x/temp"));
        assert!(!matches("plant/+", "plant/a/b"));
        assert!(matches("#", "anything/at/all"));
        assert!(!matches("#", "$SYS/broker"));
        assert!(!matches("+/x", "$SYS/x"));
        assert!(matches("$SYS/#", "$SYS/x"));
        assert!(!matches("plant/a", "plant/a/b"));
        assert!(!matches("plant/a/b", "plant/a"));
    }

    #[test]
    fn mqtt_filters_are_checked_as_the_protocol_says() {
        for ok in ["#", "+", "plant/#", "plant/+/temp", "+/+/#", "spBv1.0/#", "a b/c"] {
            assert!(valid_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["", "G+/#", "plant/#/x", "plant#", "a/+b", "a/b#"] {
            assert!(valid_filter(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mqtt_writes_go_only_to_plain_topics_inside_the_filters() {
        let filters = vec!["plant/#".to_string()];
        assert!(allowed(&filters, "plant/valve").is_ok());
        for bad in ["elsewhere/valve", "plant/+/x", "plant/#", "plant//x", "plant/../x", "plant/./x", "/", "", "$SYS/x"]
        {
            assert!(allowed(&filters, bad).is_err(), "{bad:?} allowed");
        }
        assert!(allowed(&filters, "plant/a/").is_err(), "a trailing empty level");
        let why = allowed(&filters, "elsewhere/valve").unwrap_err();
        assert!(why.contains("plant/#"), "{why}");
    }
}
