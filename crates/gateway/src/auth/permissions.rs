//! Namespace permissions: who may do what in a namespace ([`Access`], [`Permissions`]), what a
//! command wants ([`Action`]), and the decision for one identity ([`Auth::check`]).

use serde::Deserialize;
use switchboard_protocol::code;

use super::identity::{Identity, Method};
use super::Auth;
use crate::error::ApiError;

/// Who may do something in a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Everybody, with or without credentials.
    Anonymous,
    /// Any authenticated user whose patterns (if it has any) match the channel.
    Authenticated,
    /// Authenticated users whose patterns match the channel; no patterns, no access.
    Claims,
}

/// `[namespaces.<ns>.allow]`: who may subscribe, publish, see presence and read history. An
/// unset entry means `anonymous` on a node without authentication and `authenticated` on one
/// with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Permissions {
    pub subscribe: Option<Access>,
    pub publish: Option<Access>,
    pub presence: Option<Access>,
    pub history: Option<Access>,
    /// Acknowledge and shelve the alarms of the namespace's channels (docs/alarms.md).
    pub alarm_ack: Option<Access>,
}

impl Permissions {
    pub const DEFAULT: Permissions =
        Permissions { subscribe: None, publish: None, presence: None, history: None, alarm_ack: None };
}

/// What a command wants to do with a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Subscribe,
    Publish,
    Presence,
    History,
    /// Acknowledge or shelve the alarm of a channel.
    AlarmAck,
}

impl Auth {
    /// Whether `who` may do `action` on `channel` of namespace `ns`. `Err` is 401 for
    /// anonymous clients that need credentials, 403 otherwise.
    pub fn check(&self, who: &Identity, allow: &Permissions, action: Action, channel: &str) -> Result<(), ApiError> {
        if let Method::ApiKey(_) = who.method {
            return Ok(());
        }
        let set = match action {
            Action::Subscribe => allow.subscribe,
            Action::Publish => allow.publish,
            Action::Presence => allow.presence,
            Action::History => allow.history,
            Action::AlarmAck => allow.alarm_ack,
        };
        let level = set.unwrap_or(if self.enabled() { Access::Authenticated } else { Access::Anonymous });
        if level == Access::Anonymous {
            return Ok(());
        }
        if who.is_anonymous() {
            return Err(ApiError::new(code::UNAUTHORIZED, "authentication required"));
        }
        let patterns = match action {
            Action::Publish => &who.publish,
            _ => &who.channels,
        };
        let allowed = match (level, patterns) {
            (_, Some(p)) => p.matches(channel),
            (Access::Authenticated, None) => true,
            _ => false,
        };
        if allowed {
            Ok(())
        } else {
            let what = match action {
                Action::Subscribe => "subscribe to",
                Action::Publish => "publish to",
                Action::Presence => "see presence of",
                Action::History => "read history of",
                Action::AlarmAck => "acknowledge or shelve the alarms of",
            };
            Err(ApiError::new(code::FORBIDDEN, format!("not allowed to {what} this channel")))
        }
    }
}
