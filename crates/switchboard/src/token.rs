//! `switchboard token`: signs a JWT that a node accepts (docs/security.md, "Making tokens"):
//! `sub`, `iat`, `exp` and the optional `channels` / `publish` pattern claims, with the
//! node's HS256 secret or with an RS256 / ES256 private key whose public half the node has.

use std::path::PathBuf;

use clap::Args;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use switchboard_gateway::auth::jwt::JwtVerifier;
use switchboard_gateway::auth::pattern::PatternSet;
use switchboard_gateway::config::ConfigError;

#[derive(Args)]
pub struct TokenArgs {
    /// The user the token names (`sub`).
    #[arg(long)]
    sub: String,
    /// Lifetime: seconds, or a number with s, m, h or d (90s, 15m, 1h, 7d).
    #[arg(long, default_value = "1h")]
    ttl: String,
    /// Channel pattern the token may subscribe to (`channels` claim; `*` one segment, `**` the
    /// rest). Repeatable. Without any, the namespaces' own rules apply.
    #[arg(long = "channels", value_name = "PATTERN")]
    channels: Vec<String>,
    /// Channel pattern the token may publish to (`publish` claim). Repeatable.
    #[arg(long = "publish", value_name = "PATTERN")]
    publish: Vec<String>,
    /// HS256 secret, as the node's `auth.jwt_secret` (at least 32 bytes: what the node refuses
    /// is refused here too).
    #[arg(long, env = "SWITCHBOARD_JWT_SECRET", hide_env_values = true, value_name = "SECRET")]
    jwt_secret: Option<String>,
    /// The node's configuration file: signs with its `auth.jwt_secret`.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// PEM private key: RSA signs RS256, EC P-256 signs ES256 (the node verifies with the public
    /// key or a JWK set).
    #[arg(long, value_name = "FILE")]
    private_key: Option<PathBuf>,
    /// `kid` header: which key of the node's JWK set verifies the token.
    #[arg(long)]
    kid: Option<String>,
}

/// Seconds of `90s`, `15m`, `1h`, `7d` or a bare number.
fn parse_ttl(text: &str) -> Option<u64> {
    let (number, unit) = match text.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&text[..i], c),
        _ => (text, 's'),
    };
    let n: u64 = number.parse().ok().filter(|n| *n > 0)?;
    let scale = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// The signing key and its algorithm: the private key file, else the secret given, else the
/// configuration's.
fn key(args: &TokenArgs) -> anyhow::Result<(Algorithm, EncodingKey)> {
    if let Some(path) = &args.private_key {
        let pem = std::fs::read(path).map_err(|e| ConfigError(format!("--private-key {}: {e}", path.display())))?;
        if let Ok(k) = EncodingKey::from_rsa_pem(&pem) {
            return Ok((Algorithm::RS256, k));
        }
        if let Ok(k) = EncodingKey::from_ec_pem(&pem) {
            return Ok((Algorithm::ES256, k));
        }
        return Err(
            ConfigError(format!("--private-key {}: not a PEM RSA or EC P-256 private key", path.display())).into()
        );
    }
    let secret = match (&args.jwt_secret, &args.config) {
        (Some(s), _) => {
            // The node's own check of `auth.jwt_secret`: a token is signed only with a secret
            // a node would verify it with.
            JwtVerifier::new(Some(s), None, None, None, None, 0).map_err(|(_, e)| {
                ConfigError(format!(
                    "--jwt-secret (or SWITCHBOARD_JWT_SECRET): {e}; `switchboard serve` refuses it too"
                ))
            })?;
            s.clone()
        }
        (None, Some(path)) => {
            let config = switchboard_gateway::config::Config::load(Some(path), std::env::vars(), &[])?;
            config
                .auth
                .jwt_secret
                .map(|s| s.0)
                .ok_or_else(|| ConfigError(format!("{}: no auth.jwt_secret to sign with", path.display())))?
        }
        (None, None) => {
            return Err(ConfigError(
                "no key to sign with: give --jwt-secret (or SWITCHBOARD_JWT_SECRET), --config with \
                 auth.jwt_secret, or --private-key"
                    .into(),
            )
            .into())
        }
    };
    Ok((Algorithm::HS256, EncodingKey::from_secret(secret.as_bytes())))
}

/// Prints the signed token on stdout.
pub fn run(args: &TokenArgs) -> anyhow::Result<()> {
    let ttl = parse_ttl(&args.ttl)
        .ok_or_else(|| ConfigError(format!("--ttl {:?}: a positive number of s, m, h or d (e.g. 1h)", args.ttl)))?;
    for (flag, list) in [("--channels", &args.channels), ("--publish", &args.publish)] {
        PatternSet::parse(list).map_err(|(i, e)| ConfigError(format!("{flag} {:?}: {e}", list[i])))?;
    }
    let (alg, key) = key(args)?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let mut claims = serde_json::json!({ "sub": args.sub, "iat": now, "exp": now.saturating_add(ttl) });
    if !args.channels.is_empty() {
        claims["channels"] = serde_json::json!(args.channels);
    }
    if !args.publish.is_empty() {
        claims["publish"] = serde_json::json!(args.publish);
    }
    let header = Header { alg, kid: args.kid.clone(), ..Header::default() };
    println!("{}", jsonwebtoken::encode(&header, &claims, &key)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ttl_takes_seconds_and_units() {
        assert_eq!(parse_ttl("90"), Some(90));
        assert_eq!(parse_ttl("90s"), Some(90));
        assert_eq!(parse_ttl("15m"), Some(900));
        assert_eq!(parse_ttl("1h"), Some(3600));
        assert_eq!(parse_ttl("7d"), Some(604_800));
        for bad in ["", "0", "h", "1w", "-5m", "1.5h"] {
            assert_eq!(parse_ttl(bad), None, "{bad:?}");
        }
    }
}
