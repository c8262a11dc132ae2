//! The OPC UA source (placeholder until written).

/// `kind = "opcua"` settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpcuaConfig {
    pub name: String,
}

/// Runs the source until `ctx.stop` turns true.
pub async fn run(_cfg: OpcuaConfig, _ctx: crate::SourceCtx) {}
