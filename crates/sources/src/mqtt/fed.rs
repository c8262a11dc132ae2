//! What the MQTT source feeds: each channel comes from one source path — one MQTT topic or one
//! Sparkplug B metric — and keeps the last value the node accepted on it.
//!
//! - One path per channel. The channel template turns `/` into `.`, so different paths can
//!   name one channel: topics `plant/a.b` and `plant/a/b`, or the Sparkplug metric `m` of
//!   device `X` of edge `E` in group `G` and the plain topic `G/E/X/m`. The first path that
//!   feeds a channel keeps it while the source runs; another one is refused (`collision`,
//!   warned about), so two streams never interleave on a channel and a write to it goes back
//!   to the path that fed it — never to whichever fed it last.
//! - Last values. A channel's bad marker (the connection dropped, a Sparkplug death) carries
//!   the last value the node accepted on it, which the publishing task records
//!   ([`Accepted`]) — not the last one decoded: the node may have refused that one (too
//!   large), and a marker carrying it would be refused too, leaving the channel good and stale.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;

/// Where a channel's values come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Path {
    /// A plain MQTT topic.
    Topic(String),
    /// A Sparkplug B metric: its point path (`group/edge[/device]/metric`) and whether it is a
    /// device's.
    Sparkplug { path: String, device: bool },
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Topic(t) => write!(f, "topic {t}"),
            Path::Sparkplug { path, .. } => write!(f, "Sparkplug B metric {path}"),
        }
    }
}

/// Why a path may not feed a channel.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Another path feeds the channel.
    Collision(String),
    /// The source feeds `max_channels` channels already.
    Bound(usize),
}

/// The channels one source feeds, at most `max`, each with its path.
pub struct Fed {
    paths: HashMap<String, Path>,
    /// The newest time of a value decoded per channel (unix ms).
    newest: HashMap<String, u64>,
    max: usize,
}

impl Fed {
    pub fn new(max: usize) -> Fed {
        Fed { paths: HashMap::new(), newest: HashMap::new(), max }
    }

    /// Whether a value of `channel` at `t` is older than the newest one seen (a historical
    /// value); records `t` when it is not.
    pub fn older(&mut self, channel: &str, t: u64) -> bool {
        match self.newest.get_mut(channel) {
            Some(newest) if t < *newest => true,
            Some(newest) => {
                *newest = t;
                false
            }
            None => {
                self.newest.insert(channel.to_string(), t);
                false
            }
        }
    }

    /// Records that `path` feeds `channel`; refused when another path feeds it, or when it is
    /// new and the source feeds `max` channels already.
    pub fn feed(&mut self, channel: &str, path: &Path) -> Result<(), Refused> {
        if let Some(known) = self.paths.get(channel) {
            return match known == path {
                true => Ok(()),
                false => Err(Refused::Collision(format!("channel {channel} is fed by {known}"))),
            };
        }
        if self.paths.len() >= self.max {
            return Err(Refused::Bound(self.max));
        }
        self.paths.insert(channel.to_string(), path.clone());
        Ok(())
    }

    /// The path that feeds `channel`.
    pub fn path(&self, channel: &str) -> Option<&Path> {
        self.paths.get(channel)
    }

    pub fn channels(&self) -> impl Iterator<Item = &str> {
        self.paths.keys().map(String::as_str)
    }
}

/// The last value the node accepted per channel; recorded by the publishing task, read by the
/// connection task for bad markers.
#[derive(Clone, Default)]
pub struct Accepted(Arc<Mutex<HashMap<String, Value>>>);

impl Accepted {
    /// Records the values of a batch's accepted points.
    pub fn record<'a>(&self, accepted: impl Iterator<Item = (&'a str, &'a Value)>) {
        let mut map = self.0.lock();
        for (ch, v) in accepted {
            match map.get_mut(ch) {
                Some(old) => *old = v.clone(),
                None => drop(map.insert(ch.to_string(), v.clone())),
            }
        }
    }

    /// The last value the node accepted on `channel`.
    pub fn get(&self, channel: &str) -> Option<Value> {
        self.0.lock().get(channel).cloned()
    }

    /// The last accepted value of each of `channels` that has one.
    pub fn of<'a>(&self, channels: impl Iterator<Item = &'a str>) -> Vec<(String, Value)> {
        let map = self.0.lock();
        channels.filter_map(|ch| map.get(ch).map(|v| (ch.to_string(), v.clone()))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_fed_keeps_one_path_per_channel_and_its_bound() {
        let mut fed = Fed::new(2);
        let dotted = Path::Topic("plant/a.b".into());
        let slashed = Path::Topic("plant/a/b".into());
        let metric = Path::Sparkplug { path: "plant/a/b".into(), device: false };
        assert_eq!(fed.feed("pt:plant.a.b", &dotted), Ok(()));
        assert_eq!(fed.feed("pt:plant.a.b", &dotted), Ok(()), "the same path again");
        let Err(Refused::Collision(why)) = fed.feed("pt:plant.a.b", &slashed) else { panic!("a second topic") };
        assert!(why.contains("topic plant/a.b"), "{why}");
        assert!(matches!(fed.feed("pt:plant.a.b", &metric), Err(Refused::Collision(_))), "a metric");
        assert_eq!(fed.path("pt:plant.a.b"), Some(&dotted));
        assert_eq!(fed.feed("pt:x", &Path::Topic("x".into())), Ok(()));
        assert_eq!(fed.feed("pt:y", &Path::Topic("y".into())), Err(Refused::Bound(2)));
        assert!(!fed.older("pt:x", 10));
        assert!(!fed.older("pt:x", 10), "as new as the newest");
        assert!(fed.older("pt:x", 9));
        assert!(!fed.older("pt:x", 11));
    }

    #[test]
    fn mqtt_accepted_values_are_the_latest_recorded() {
        let a = Accepted::default();
        let (one, two) = (Value::from(1), Value::from(2));
        a.record([("pt:a", &one), ("pt:b", &one)].into_iter());
        a.record([("pt:a", &two)].into_iter());
        assert_eq!(a.get("pt:a"), Some(two.clone()));
        let mut of = a.of(["pt:a", "pt:b", "pt:c"].into_iter());
        of.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(of, vec![("pt:a".to_string(), two), ("pt:b".to_string(), one)]);
    }
}
