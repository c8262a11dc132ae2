//! The MQTT source's settings (`kind = "mqtt"`): what serde reads, what [`MqttConfig::check`]
//! checks, and the client library's options (endpoint, credentials, TLS) built from them.

use std::sync::Arc;
use std::time::Duration;

use rumqttc::{MqttOptions, QoS, Transport};

use super::host::Host;
use super::payload::Template;
use super::{backlog, target};
use crate::DEFAULT_MAX_CHANNELS;

/// `max_packet_bytes` when neither it nor the node's `limits.max_publication_bytes` is larger:
/// a Sparkplug birth of thousands of metrics fits.
pub const DEFAULT_MAX_PACKET: usize = 1024 * 1024;
/// The packet size limit given to the client library, both ways: the largest remaining length
/// an MQTT fixed header can encode, so the library never refuses a packet the broker sends
/// (see the module doc); the source's own limit is `max_packet_bytes`.
pub const LIBRARY_MAX_PACKET: usize = 268_435_455;

/// `kind = "mqtt"` settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttConfig {
    pub name: String,
    /// `mqtt://host:1883` or `mqtts://host:8883`.
    pub url: String,
    /// CA certificate (PEM) that signed the broker's certificate, for `mqtts://`; unset: the
    /// system's CA bundle.
    pub tls_ca: Option<std::path::PathBuf>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Unset: `switchboard-<name>`, the same on every node, so the node that takes the source
    /// over resumes its session (and the MQTT broker never serves two nodes at once).
    pub client_id: Option<String>,
    #[serde(default = "default_topics")]
    pub topics: Vec<String>,
    /// Topic filters writes may go to; unset: `topics` (a write goes only where the source
    /// reads, [`target`]).
    pub write_topics: Option<Vec<String>>,
    /// Channel of a topic: `{topic}` is replaced by the topic with `/` turned into `.`.
    #[serde(default = "default_channel")]
    pub channel: String,
    #[serde(default = "default_qos")]
    pub qos: u8,
    /// A persistent session (false): the broker keeps subscriptions and queues QoS 1
    /// messages while the source is away (a restart, a takeover by another node) or while the
    /// node cannot commit them (they stay unacknowledged).
    #[serde(default)]
    pub clean_session: bool,
    /// Bytes of QoS 0 values that may wait while the node cannot commit ([`backlog`]); unset:
    /// [`backlog::DEFAULT_BUFFER_BYTES`].
    pub buffer_bytes: Option<usize>,
    /// Be a Sparkplug B primary host application with this host id ([`super::host`]).
    pub sparkplug_host_id: Option<String>,
    #[serde(default = "default_keep_alive_s")]
    pub keep_alive_s: u64,
    /// How long a write waits for the broker's acknowledgement.
    #[serde(default = "default_write_timeout_ms")]
    pub write_timeout_ms: u64,
    /// What a write publishes: `json` the published data as it is, `value` the point's `v`
    /// alone (a string without quotes, numbers and booleans as text).
    #[serde(default)]
    pub write_format: WriteFormat,
    /// Ask a Sparkplug B edge node for a rebirth (`NCMD` `Node Control/Rebirth`) when its birth
    /// was not seen or its `seq` skipped.
    #[serde(default = "default_true")]
    pub sparkplug_rebirth: bool,
    /// Largest MQTT message (the whole PUBLISH packet, in bytes) the source reads or writes.
    /// A larger one it receives is acknowledged and refused (`oversized`). Unset: the larger of
    /// the node's `limits.max_publication_bytes` and [`DEFAULT_MAX_PACKET`] (filled in by the
    /// node through [`crate::SourceConfig::with_node_limits`]).
    pub max_packet_bytes: Option<usize>,
    /// Most channels the source feeds (and Sparkplug B metrics and aliases it keeps): a new
    /// one past it is refused (`bound`), the ones it has carry on.
    #[serde(default = "default_max_channels")]
    pub max_channels: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteFormat {
    #[default]
    Json,
    Value,
}

fn default_topics() -> Vec<String> {
    vec!["#".into()]
}
fn default_channel() -> String {
    "pt:{topic}".into()
}
fn default_qos() -> u8 {
    1
}
fn default_keep_alive_s() -> u64 {
    15
}
fn default_write_timeout_ms() -> u64 {
    5000
}
fn default_true() -> bool {
    true
}
fn default_max_channels() -> usize {
    DEFAULT_MAX_CHANNELS
}

impl MqttConfig {
    /// Checks every setting without connecting; the message names the key.
    pub fn check(&self) -> Result<(), String> {
        self.endpoint()?;
        Template::parse(&self.channel)?;
        if self.qos > 2 {
            return Err("qos: 0, 1 or 2".into());
        }
        if self.topics.is_empty() {
            return Err("topics: at least one topic filter".into());
        }
        for t in &self.topics {
            target::valid_filter(t).map_err(|e| format!("topics: {e}"))?;
        }
        for t in self.write_topics.iter().flatten() {
            target::valid_filter(t).map_err(|e| format!("write_topics: {e}"))?;
        }
        if self.keep_alive_s < 5 {
            return Err("keep_alive_s: at least 5".into());
        }
        if self.username.is_none() && self.password.is_some() {
            return Err("password: needs a username".into());
        }
        if self.max_packet_bytes.is_some_and(|n| !(1024..=LIBRARY_MAX_PACKET).contains(&n)) {
            return Err(format!("max_packet_bytes: 1024 to {LIBRARY_MAX_PACKET}"));
        }
        if self.max_channels == 0 {
            return Err("max_channels: at least 1".into());
        }
        if self.buffer_bytes.is_some_and(|n| !(MIN_BUFFER..=MAX_BUFFER).contains(&n)) {
            return Err(format!("buffer_bytes: {MIN_BUFFER} to {MAX_BUFFER}"));
        }
        if let Some(id) = &self.sparkplug_host_id {
            Host::check(id)?;
        }
        Ok(())
    }

    /// Fills `max_packet_bytes` when unset: the larger of the node's largest publication and
    /// [`DEFAULT_MAX_PACKET`].
    pub fn with_node_limits(mut self, max_publication_bytes: usize) -> MqttConfig {
        self.max_packet_bytes.get_or_insert(max_publication_bytes.clamp(DEFAULT_MAX_PACKET, LIBRARY_MAX_PACKET));
        self
    }

    /// Bytes of QoS 0 values that may wait.
    pub fn buffer(&self) -> usize {
        self.buffer_bytes.unwrap_or(backlog::DEFAULT_BUFFER_BYTES)
    }

    /// The largest message the source reads or writes.
    pub fn max_packet(&self) -> usize {
        self.max_packet_bytes.unwrap_or(DEFAULT_MAX_PACKET)
    }

    /// Host, port and TLS from the URL.
    fn endpoint(&self) -> Result<(String, u16, bool), String> {
        let (scheme, rest) = self.url.split_once("://").ok_or("url: expected mqtt://host:port or mqtts://host:port")?;
        let tls = match scheme {
            "mqtt" | "tcp" => false,
            "mqtts" | "ssl" => true,
            _ => return Err("url: expected mqtt://host:port or mqtts://host:port".into()),
        };
        let rest = rest.trim_end_matches('/');
        if rest.contains('@') || rest.contains('/') {
            return Err("url: host and port only (username and password are their own keys)".into());
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| "url: bad port")?),
            None => (rest, if tls { 8883 } else { 1883 }),
        };
        if host.is_empty() {
            return Err("url: no host".into());
        }
        Ok((host.trim_matches(|c| c == '[' || c == ']').to_string(), port, tls))
    }

    /// The MQTT client id: `client_id`, or `switchboard-<name>` when no node filled it in
    /// ([`crate::SourceConfig::with_cluster`]).
    pub fn client_id(&self) -> String {
        self.client_id.clone().unwrap_or_else(|| format!("switchboard-{}", self.name))
    }

    pub(super) fn options(&self) -> Result<MqttOptions, String> {
        let (host, port, tls) = self.endpoint()?;
        let id = self.client_id();
        let mut o = MqttOptions::new(id, host, port);
        // Messages are acknowledged once committed ([`commit`]), not when read.
        o.set_keep_alive(Duration::from_secs(self.keep_alive_s))
            .set_clean_session(self.clean_session)
            .set_manual_acks(true)
            .set_max_packet_size(LIBRARY_MAX_PACKET, LIBRARY_MAX_PACKET);
        if let Some(user) = &self.username {
            o.set_credentials(user.clone(), self.password.clone().unwrap_or_default());
        }
        if tls {
            o.set_transport(Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(Arc::new(self.tls()?))));
        }
        Ok(o)
    }

    fn tls(&self) -> Result<rustls::ClientConfig, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let path = self.tls_ca.clone().unwrap_or_else(|| "/etc/ssl/certs/ca-certificates.crt".into());
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(&path).map_err(|e| format!("tls_ca {}: {e}", path.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("tls_ca {}: {e}", path.display()))?;
            roots.add(cert).map_err(|e| format!("tls_ca {}: {e}", path.display()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("tls: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth())
    }
}

pub(super) fn qos(level: u8) -> QoS {
    match level {
        0 => QoS::AtMostOnce,
        2 => QoS::ExactlyOnce,
        _ => QoS::AtLeastOnce,
    }
}

/// Smallest and largest `buffer_bytes`.
pub const MIN_BUFFER: usize = 64 * 1024;
pub const MAX_BUFFER: usize = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_config_is_checked_by_key() {
        let cfg = |url: &str| MqttConfig {
            name: "m".into(),
            url: url.into(),
            tls_ca: None,
            username: None,
            password: None,
            client_id: None,
            topics: default_topics(),
            write_topics: None,
            channel: default_channel(),
            qos: 1,
            clean_session: false,
            buffer_bytes: None,
            sparkplug_host_id: None,
            keep_alive_s: 15,
            write_timeout_ms: 5000,
            write_format: WriteFormat::Json,
            sparkplug_rebirth: true,
            max_packet_bytes: None,
            max_channels: DEFAULT_MAX_CHANNELS,
        };
        assert_eq!(cfg("mqtt://127.0.0.1:1884").endpoint().unwrap(), ("127.0.0.1".into(), 1884, false));
        assert_eq!(cfg("mqtts://broker").endpoint().unwrap(), ("broker".into(), 8883, true));
        assert!(cfg("http://x").check().unwrap_err().starts_with("url"));
        assert!(cfg("mqtt://u:p@x:1").check().unwrap_err().starts_with("url"));
        let mut c = cfg("mqtt://x");
        c.qos = 3;
        assert!(c.check().unwrap_err().starts_with("qos"));
        let mut c = cfg("mqtt://x");
        c.max_packet_bytes = Some(100);
        assert!(c.check().unwrap_err().starts_with("max_packet_bytes"));
        c.max_packet_bytes = Some(LIBRARY_MAX_PACKET + 1);
        assert!(c.check().unwrap_err().starts_with("max_packet_bytes"));
        c.max_packet_bytes = None;
        c.max_channels = 0;
        assert!(c.check().unwrap_err().starts_with("max_channels"));
        // Unset, the largest packet follows the node's largest publication, never below 1 MiB.
        assert_eq!(cfg("mqtt://x").with_node_limits(64 * 1024).max_packet(), DEFAULT_MAX_PACKET);
        assert_eq!(cfg("mqtt://x").with_node_limits(4 << 20).max_packet(), 4 << 20);
        let mut c = cfg("mqtt://x");
        c.max_packet_bytes = Some(2048);
        assert_eq!(c.with_node_limits(4 << 20).max_packet(), 2048, "a setting wins");
    }
}
