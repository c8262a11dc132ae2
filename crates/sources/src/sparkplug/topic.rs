//! Sparkplug B topics: the `spBv1.0` namespace, what a message is ([`Kind`]) and whose
//! ([`Topic`]), read from its topic; [`DecodeError`], why a message could not be read.

/// The first topic level of Sparkplug B.
pub const NAMESPACE: &str = "spBv1.0";

/// What a Sparkplug message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    NBirth,
    NData,
    NDeath,
    DBirth,
    DData,
    DDeath,
    /// Commands and host state: nothing for a gateway to publish.
    Other,
}

/// A Sparkplug topic's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic<'a> {
    pub group: &'a str,
    pub kind: Kind,
    pub edge: &'a str,
    pub device: Option<&'a str>,
}

/// The parts of a `spBv1.0/...` topic; `None` for any other topic. `Err` for a topic in the
/// Sparkplug namespace that does not have the form of one.
pub fn parse_topic(topic: &str) -> Option<Result<Topic<'_>, DecodeError>> {
    let rest = topic.strip_prefix(NAMESPACE)?.strip_prefix('/')?;
    let parts: Vec<&str> = rest.split('/').collect();
    let bad = || Some(Err(DecodeError::Topic(topic.to_string())));
    if parts.first() == Some(&"STATE") || parts.get(1).is_some_and(|k| k.ends_with("CMD")) {
        return Some(Ok(Topic { group: parts[0], kind: Kind::Other, edge: "", device: None }));
    }
    let kind = match parts.get(1) {
        Some(&"NBIRTH") => Kind::NBirth,
        Some(&"NDATA") => Kind::NData,
        Some(&"NDEATH") => Kind::NDeath,
        Some(&"DBIRTH") => Kind::DBirth,
        Some(&"DDATA") => Kind::DData,
        Some(&"DDEATH") => Kind::DDeath,
        _ => return bad(),
    };
    let device_kind = matches!(kind, Kind::DBirth | Kind::DData | Kind::DDeath);
    let want = if device_kind { 4 } else { 3 };
    if parts.len() != want || parts.iter().any(|p| p.is_empty()) {
        return bad();
    }
    Some(Ok(Topic { group: parts[0], kind, edge: parts[2], device: device_kind.then(|| parts[3]) }))
}

/// Why a Sparkplug message (or one of its metrics) could not be read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("not a Sparkplug B topic: {0}")]
    Topic(String),
    #[error("not a Sparkplug B payload: {0}")]
    Protobuf(String),
}
