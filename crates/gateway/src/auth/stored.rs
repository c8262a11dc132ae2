//! Who a client is, without secrets, as shared stores keep it ([`StoredIdentity`]): a moved
//! long-poll session's client is rebuilt from it on another node.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::pattern::PatternSet;
use super::{Identity, Method};

/// Who the client is, without secrets: enough to rebuild its identity on another node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredIdentity {
    /// `anonymous`, `token` or `password`.
    pub method: String,
    pub user: String,
    pub expires: Option<u64>,
    pub channels: Option<Vec<String>>,
    pub publish: Option<Vec<String>>,
}

impl StoredIdentity {
    /// What is kept of `i`: no secret, only what its checks need.
    pub fn of(i: &Identity) -> StoredIdentity {
        let list = |p: &Option<Arc<PatternSet>>| p.as_ref().map(|p| p.0.iter().map(|x| x.to_string()).collect());
        StoredIdentity {
            method: match i.method {
                Method::Anonymous => "anonymous",
                Method::Token => "token",
                Method::Password => "password",
                Method::Hook => "hook",
                Method::ApiKey(_) => "api_key",
            }
            .to_string(),
            user: i.user.clone(),
            expires: i.expires,
            channels: list(&i.channels),
            publish: list(&i.publish),
        }
    }

    /// The identity back (its token's expiry included: a takeover checks it first).
    pub fn identity(&self) -> Identity {
        // Patterns that no longer parse grant nothing.
        let set = |l: &Option<Vec<String>>| l.as_ref().map(|l| Arc::new(PatternSet::parse(l).unwrap_or_default()));
        let method = match self.method.as_str() {
            "token" => Method::Token,
            "password" => Method::Password,
            "hook" => Method::Hook,
            _ => return Identity::anonymous(),
        };
        Identity {
            method,
            user: self.user.clone(),
            channels: set(&self.channels),
            publish: set(&self.publish),
            expires: self.expires,
            jti: None,
            issued_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn auth_stored_identities_come_back_with_their_patterns_and_expiry() {
        let i = Identity {
            method: Method::Token,
            user: "ann".into(),
            channels: Some(Arc::new(PatternSet::parse(&["room:*", "pt:**"]).unwrap())),
            publish: None,
            expires: Some(99),
            ..Identity::anonymous()
        };
        let back = StoredIdentity::of(&i).identity();
        assert_eq!(back.method, Method::Token);
        assert_eq!(back.user, "ann");
        assert_eq!(back.expires, Some(99));
        assert!(back.channels.as_ref().unwrap().matches("room:7"));
        assert!(!back.channels.as_ref().unwrap().matches("other"));
        assert!(back.publish.is_none());
    }
}
