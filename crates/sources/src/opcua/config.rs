//! The OPC UA source's settings (`kind = "opcua"`): what serde reads, what [`OpcuaConfig::check`]
//! checks, and the byte limits that follow the node's.

use std::path::PathBuf;

use super::session;

/// Security of the connection to the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Security {
    /// No signing or encryption (`SecurityPolicy#None`).
    #[default]
    None,
    /// `Basic256Sha256`, SignAndEncrypt, with the source's own certificate.
    Basic256Sha256,
}

/// `kind = "opcua"` settings.
#[derive(Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpcuaConfig {
    pub name: String,
    /// `opc.tcp://host:4840[/path]`.
    pub url: String,
    #[serde(default)]
    pub security: Security,
    /// The source's certificate (`.der` or `.pem`) and private key (PEM), for Basic256Sha256.
    pub certificate: Option<PathBuf>,
    pub private_key: Option<PathBuf>,
    /// The server certificate to trust (`.der` or `.pem`).
    pub trust_server: Option<PathBuf>,
    /// Trust any server certificate (tests only: it defeats the point of Basic256Sha256).
    #[serde(default)]
    pub trust_any: bool,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Node ids to subscribe (`ns=2;s=Line1.Temp`); or `browse`.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Subscribe every variable below this path of browse names (`Objects/Plant`) or node id.
    pub browse: Option<String>,
    /// At most this many variables from `browse`.
    #[serde(default = "default_max_nodes")]
    pub max_nodes: usize,
    /// How often the server samples each variable.
    #[serde(default = "default_sampling_ms")]
    pub sampling_ms: u64,
    /// How often the server sends the changes it sampled (default: `sampling_ms`).
    pub publishing_ms: Option<u64>,
    /// Channel of each variable; `{name}` is its browse path below the browse root joined by
    /// `.`, or for `nodes` its identifier (characters outside the channel alphabet become `_`).
    #[serde(default = "default_channel")]
    pub channel: String,
    /// Largest point (its JSON, bytes) the source publishes; a larger value is refused and its
    /// point marked bad. Default: the node's `limits.max_publication_bytes`.
    pub max_value_bytes: Option<usize>,
    /// Largest message the client takes from the server (bytes); strings, byte strings and
    /// arrays may be as long as a message. Default: 16 MiB, or four times the node's
    /// `limits.max_publication_bytes` when that is more.
    pub max_message_bytes: Option<usize>,
    /// After a reconnect, read each point's gap from the server's history (nodes whose
    /// AccessLevel allows HistoryRead) and send it as historical values.
    #[serde(default = "default_backfill")]
    pub backfill: bool,
    /// The longest stretch back from a gap's end that is back-filled (seconds).
    #[serde(default = "default_backfill_max_s")]
    pub backfill_max_s: u64,
}

/// `max_value_bytes` when the node did not fill it: the node's default largest publication.
const DEFAULT_MAX_VALUE: usize = 64 * 1024;
/// `max_message_bytes` by default, and its range.
const DEFAULT_MAX_MESSAGE: usize = 16 << 20;
const MESSAGE_BYTES_RANGE: std::ops::RangeInclusive<usize> = (64 * 1024)..=(1 << 30);

fn default_max_nodes() -> usize {
    10_000
}
fn default_sampling_ms() -> u64 {
    250
}
fn default_channel() -> String {
    "pt:{name}".into()
}
fn default_backfill() -> bool {
    true
}
fn default_backfill_max_s() -> u64 {
    3600
}
/// `backfill_max_s` range: a second to a week.
const BACKFILL_MAX_S_RANGE: std::ops::RangeInclusive<u64> = 1..=7 * 86_400;

// By hand: the password never reaches a log line.
impl std::fmt::Debug for OpcuaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpcuaConfig")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("security", &self.security)
            .field("certificate", &self.certificate)
            .field("private_key", &self.private_key)
            .field("trust_server", &self.trust_server)
            .field("trust_any", &self.trust_any)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("nodes", &self.nodes)
            .field("browse", &self.browse)
            .field("max_nodes", &self.max_nodes)
            .field("sampling_ms", &self.sampling_ms)
            .field("publishing_ms", &self.publishing_ms)
            .field("channel", &self.channel)
            .field("max_value_bytes", &self.max_value_bytes)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("backfill", &self.backfill)
            .field("backfill_max_s", &self.backfill_max_s)
            .finish()
    }
}

impl OpcuaConfig {
    /// Checks what serde cannot: one of `nodes`/`browse`, the settings security needs, a
    /// channel template with `{name}`, node ids that parse. Errors name the setting.
    pub fn check(&self) -> Result<(), String> {
        if !self.url.starts_with("opc.tcp://") {
            return Err(format!("url: {:?} is not an opc.tcp:// URL", self.url));
        }
        match (self.nodes.is_empty(), &self.browse) {
            (true, None) => return Err("give nodes = [...] or browse = \"Objects/...\"".into()),
            (false, Some(_)) => return Err("nodes and browse exclude each other".into()),
            _ => {}
        }
        for node in &self.nodes {
            session::parse_node(node).map_err(|e| format!("nodes: {e}"))?;
        }
        if !self.channel.contains("{name}") {
            return Err(format!("channel: {:?} has no {{name}}", self.channel));
        }
        if self.max_nodes == 0 || self.sampling_ms == 0 || self.publishing_ms == Some(0) {
            return Err("max_nodes, sampling_ms and publishing_ms must be positive".into());
        }
        if self.max_value_bytes == Some(0) {
            return Err("max_value_bytes must be positive".into());
        }
        if self.max_message_bytes.is_some_and(|n| !MESSAGE_BYTES_RANGE.contains(&n)) {
            let (lo, hi) = (MESSAGE_BYTES_RANGE.start(), MESSAGE_BYTES_RANGE.end());
            return Err(format!("max_message_bytes: {lo} to {hi}"));
        }
        if !BACKFILL_MAX_S_RANGE.contains(&self.backfill_max_s) {
            let (lo, hi) = (BACKFILL_MAX_S_RANGE.start(), BACKFILL_MAX_S_RANGE.end());
            return Err(format!("backfill_max_s: {lo} to {hi}"));
        }
        if self.username.is_some() != self.password.is_some() {
            return Err("username and password go together".into());
        }
        if self.security == Security::Basic256Sha256 {
            if self.certificate.is_none() || self.private_key.is_none() {
                return Err("security = \"basic256sha256\" needs certificate and private_key".into());
            }
            if self.trust_server.is_none() && !self.trust_any {
                return Err("security = \"basic256sha256\" needs trust_server (or trust_any = true)".into());
            }
        }
        Ok(())
    }

    /// Fills the byte limits left unset from the node's largest publication (see
    /// `max_value_bytes` and `max_message_bytes`).
    pub fn with_node_limits(mut self, max_publication_bytes: usize) -> OpcuaConfig {
        self.max_value_bytes.get_or_insert(max_publication_bytes);
        let message = DEFAULT_MAX_MESSAGE.max(max_publication_bytes.saturating_mul(4));
        self.max_message_bytes.get_or_insert(message.min(*MESSAGE_BYTES_RANGE.end()));
        self
    }

    pub fn max_value_bytes(&self) -> usize {
        self.max_value_bytes.unwrap_or(DEFAULT_MAX_VALUE)
    }

    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes.unwrap_or(DEFAULT_MAX_MESSAGE)
    }

    /// Bound of the queue between the session and the publisher: two messages' worth.
    pub(super) fn queue_bytes(&self) -> usize {
        self.max_message_bytes().saturating_mul(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<OpcuaConfig, String> {
        let cfg: OpcuaConfig = serde_json::from_value(json).map_err(|e| e.to_string())?;
        cfg.check().map(|()| cfg)
    }

    #[test]
    fn opcua_config_defaults_and_checks() {
        let cfg = parse(serde_json::json!({"name": "plc", "url": "opc.tcp://h:4840", "browse": "Objects/Plant"}))
            .expect("valid");
        assert_eq!((cfg.sampling_ms, cfg.max_nodes, cfg.channel.as_str()), (250, 10_000, "pt:{name}"));
        assert_eq!(cfg.security, Security::None);
        let bad = |j: serde_json::Value| parse(j).expect_err("invalid");
        assert!(bad(
            serde_json::json!({"name": "p", "url": "opc.tcp://h", "nodes": ["ns=2;s=A"], "browse": "Objects"})
        )
        .contains("exclude"));
        assert!(bad(serde_json::json!({"name": "p", "url": "opc.tcp://h"})).contains("nodes"));
        assert!(bad(serde_json::json!({"name": "p", "url": "http://h", "browse": "Objects"})).contains("url"));
        assert!(bad(serde_json::json!({"name": "p", "url": "opc.tcp://h", "nodes": ["nonsense"]})).contains("node id"));
        assert!(bad(serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "channel": "pt:x"}))
            .contains("{name}"));
        assert!(bad(
            serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "security": "basic256sha256"})
        )
        .contains("certificate"));
        assert!(bad(
            serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "security": "basic256sha256",
            "certificate": "c.der", "private_key": "k.pem"})
        )
        .contains("trust_server"));
        assert!(
            bad(serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "colour": 1})).contains("colour")
        );
        assert!(bad(serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "max_message_bytes": 1000}))
            .contains("max_message_bytes"));
        assert_eq!((cfg.backfill, cfg.backfill_max_s), (true, 3600));
        for n in [0, 7 * 86_400 + 1] {
            assert!(bad(serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O", "backfill_max_s": n}))
                .contains("backfill_max_s"));
        }
    }

    #[test]
    fn opcua_byte_limits_follow_the_node_unless_set() {
        let cfg = |extra: serde_json::Value| {
            let mut json = serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O"});
            json.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
            parse(json).expect("valid")
        };
        let c = cfg(serde_json::json!({}));
        assert_eq!((c.max_value_bytes(), c.max_message_bytes()), (64 * 1024, 16 << 20));
        let c = cfg(serde_json::json!({})).with_node_limits(8 << 20);
        assert_eq!((c.max_value_bytes(), c.max_message_bytes()), (8 << 20, 32 << 20));
        let c =
            cfg(serde_json::json!({"max_value_bytes": 1000, "max_message_bytes": 1 << 20})).with_node_limits(8 << 20);
        assert_eq!((c.max_value_bytes(), c.max_message_bytes()), (1000, 1 << 20), "settings win");
        assert_eq!(c.queue_bytes(), 2 << 20);
    }

    #[test]
    fn opcua_config_debug_hides_the_password() {
        let cfg = parse(serde_json::json!({"name": "p", "url": "opc.tcp://h", "browse": "O",
            "username": "op", "password": "hunter2"}))
        .expect("valid");
        let text = format!("{cfg:?}");
        assert!(text.contains("op") && !text.contains("hunter2"), "{text}");
    }
}
