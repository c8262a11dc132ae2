//! The MQTT source (placeholder until written).

/// `kind = "mqtt"` settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttConfig {
    pub name: String,
}

/// Runs the source until `ctx.stop` turns true.
pub async fn run(_cfg: MqttConfig, _ctx: crate::SourceCtx) {}
