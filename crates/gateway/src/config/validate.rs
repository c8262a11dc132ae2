//! Validation of a loaded configuration: every limit positive, the broker URL, the simulator,
//! namespaces' trends, sources and alarms, and no anonymous node beyond loopback. Errors name
//! the key.

use super::{parse_simulate, trend, Config, ConfigError};

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.listen_addr()?;
        // The message never repeats the URL: it may carry the Redis password.
        switchboard_broker::check_url(&self.broker).map_err(|e| ConfigError(format!("broker: {e}")))?;
        if let Some(sim) = &self.simulate {
            parse_simulate(sim).map_err(|e| ConfigError(format!("simulate: {e}")))?;
        }
        let l = &self.limits;
        for (key, v) in [
            ("limits.max_connections", l.max_connections),
            ("limits.max_subscriptions", l.max_subscriptions),
            ("limits.max_frame_bytes", l.max_frame_bytes),
            ("limits.max_pending_bytes", l.max_pending_bytes),
            ("limits.ping_s", l.ping_s as usize),
            ("limits.max_channels_per_subscribe", l.max_channels_per_subscribe),
            ("limits.max_channels", l.max_channels),
            ("limits.max_publication_bytes", l.max_publication_bytes),
            ("limits.max_connections_per_ip", l.max_connections_per_ip),
            ("limits.handshakes_per_ip_per_s", l.handshakes_per_ip_per_s),
            ("limits.publishes_per_connection_per_s", l.publishes_per_connection_per_s),
            ("limits.presence_changes_per_connection_per_s", l.presence_changes_per_connection_per_s),
            ("limits.publishes_per_api_key_per_s", l.publishes_per_api_key_per_s),
            ("limits.publishes_per_user_per_s", l.publishes_per_user_per_s),
            ("limits.password_checks_per_ip_per_s", l.password_checks_per_ip_per_s),
            ("limits.handshake_timeout_s", l.handshake_timeout_s as usize),
            ("limits.first_message_timeout_s", l.first_message_timeout_s as usize),
            ("transports.poll_timeout_s", self.transports.poll_timeout_s as usize),
            ("transports.poll_session_ttl_s", self.transports.poll_session_ttl_s as usize),
            ("transports.sse_heartbeat_s", self.transports.sse_heartbeat_s as usize),
            ("source_lease_ttl_s", self.source_lease_ttl_s as usize),
            ("alarm_journal_days", self.alarm_journal_days as usize),
            ("alarm_journal_max_entries", self.alarm_journal_max_entries),
        ] {
            if v == 0 {
                return Err(ConfigError(format!("{key}: must be greater than 0")));
            }
        }
        for (name, ns) in &self.namespaces {
            trend::validate(name, ns)?;
        }
        self.validate_sources()?;
        self.validate_alarms()?;
        if l.max_frame_bytes < 125 {
            return Err(ConfigError("limits.max_frame_bytes: must be at least 125".into()));
        }
        if !self.allow_anonymous && !self.listen_addr()?.ip().is_loopback() && !self.auth_configured() {
            return Err(ConfigError(format!(
                "listen: {} is beyond loopback and no authentication is configured (--jwt-secret, --jwt-public-key, --jwks or --users); pass --allow-anonymous to serve anyway",
                self.listen
            )));
        }
        Ok(())
    }

    /// Each alarm definition, unique ids, at most [`crate::alarms::def::MAX_DEFS`].
    fn validate_alarms(&self) -> Result<(), ConfigError> {
        let max = crate::alarms::def::MAX_DEFS;
        if self.alarms.len() > max {
            return Err(ConfigError(format!("alarms: at most {max} definitions")));
        }
        let mut ids = std::collections::HashSet::new();
        for (i, def) in self.alarms.iter().enumerate() {
            def.validate().map_err(|e| ConfigError(format!("alarms[{i}].{e}")))?;
            if !ids.insert(def.id.as_str()) {
                return Err(ConfigError(format!("alarms[{i}].id: {:?} is used twice", def.id)));
            }
        }
        Ok(())
    }

    /// Each source's settings, unique names, and every namespace's `write_source` naming one.
    fn validate_sources(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::HashSet::new();
        for (i, source) in self.sources.iter().enumerate() {
            source.check().map_err(|e| ConfigError(format!("sources[{i}].{e}")))?;
            if !names.insert(source.name()) {
                return Err(ConfigError(format!("sources[{i}].name: {:?} is used twice", source.name())));
            }
        }
        for (ns, options) in &self.namespaces {
            if let Some(w) = &options.write_source {
                if !names.contains(w.as_str()) {
                    return Err(ConfigError(format!(
                        "namespaces.{ns}.write_source: no source named {w:?} in [[sources]]"
                    )));
                }
            }
        }
        Ok(())
    }
}
