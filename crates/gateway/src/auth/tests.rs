//! Unit tests of `Auth`: levels and patterns, grants, secrets kept out of `Debug`.

use super::*;
use serde::Deserialize;

fn user(channels: Option<&[&str]>) -> Identity {
    Identity {
        method: Method::Token,
        user: "u".into(),
        channels: channels.map(|c| Arc::new(PatternSet::parse(c).unwrap())),
        publish: None,
        expires: None,
        jti: None,
        issued_at: None,
    }
}

fn enabled() -> Auth {
    let c = AuthConfig { jwt_secret: Some(Secret("x".repeat(32))), ..AuthConfig::default() };
    Auth::build(&c, &crate::config::Limits::default().auth(), IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)).unwrap()
}

#[test]
fn auth_without_authentication_everything_is_anonymous() {
    let a = Auth::default();
    assert!(!a.enabled());
    assert!(a.check(&Identity::anonymous(), &Permissions::DEFAULT, Action::Subscribe, "x").is_ok());
    let strict = Permissions { subscribe: Some(Access::Authenticated), ..Permissions::DEFAULT };
    assert_eq!(a.check(&Identity::anonymous(), &strict, Action::Subscribe, "x").unwrap_err().code, 401);
}

#[test]
fn auth_levels_and_patterns() {
    let a = enabled();
    let d = Permissions::DEFAULT;
    assert_eq!(a.check(&Identity::anonymous(), &d, Action::Subscribe, "x").unwrap_err().code, 401);
    assert!(a.check(&user(None), &d, Action::Subscribe, "x").is_ok());
    assert!(a.check(&user(Some(&["room:*"])), &d, Action::Subscribe, "room:1").is_ok());
    assert_eq!(a.check(&user(Some(&["room:*"])), &d, Action::Subscribe, "pt:1").unwrap_err().code, 403);
    assert_eq!(a.check(&user(Some(&["room:*"])), &d, Action::History, "pt:1").unwrap_err().code, 403);
    let claims = Permissions { subscribe: Some(Access::Claims), ..Permissions::DEFAULT };
    assert_eq!(a.check(&user(None), &claims, Action::Subscribe, "x").unwrap_err().code, 403);
    assert!(a.check(&user(Some(&["**"])), &claims, Action::Subscribe, "x").is_ok());
    let public = Permissions { subscribe: Some(Access::Anonymous), ..Permissions::DEFAULT };
    assert!(a.check(&Identity::anonymous(), &public, Action::Subscribe, "x").is_ok());
    assert_eq!(a.check(&Identity::anonymous(), &public, Action::Publish, "x").unwrap_err().code, 401);
    let key = Identity { method: Method::ApiKey(0), ..Identity::anonymous() };
    assert!(a.check(&key, &claims, Action::Publish, "x").is_ok());
}

#[test]
fn auth_debug_output_holds_no_secrets() {
    let c =
        AuthConfig { jwt_secret: Some(Secret("s3cr3t-s3cr3t-s3cr3t-s3cr3t-s3cr3t".into())), ..AuthConfig::default() };
    assert!(!format!("{c:?}").contains("s3cr3t"));
    let a =
        Auth::build(&c, &crate::config::Limits::default().auth(), IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)).unwrap();
    assert!(!format!("{a:?}").contains("s3cr3t"));
}

#[test]
fn auth_configured_counts_for_listening_beyond_loopback() {
    use crate::config::Config;
    let wide = ("listen", toml::Value::String("0.0.0.0:8700".into()));
    let err = Config::load(None, vec![], std::slice::from_ref(&wide)).unwrap_err();
    assert!(err.0.contains("--allow-anonymous"), "{err}");
    // API keys alone protect only the HTTP API.
    let key = ("auth.api_keys", toml::Value::String(apikey::hash_key("k".repeat(20).as_str())));
    assert!(Config::load(None, vec![], &[wide.clone(), key]).is_err());
    let secret = ("SWITCHBOARD_JWT_SECRET".to_string(), "s".repeat(32));
    let c = Config::load(None, vec![secret], std::slice::from_ref(&wide)).unwrap();
    assert!(c.security.auth.enabled());
    let anon = ("allow_anonymous", toml::Value::Boolean(true));
    assert!(Config::load(None, vec![], &[wide, anon]).is_ok());
}

#[test]
fn auth_grants_dashboards_parse_and_unknown_values_name_the_key() {
    use crate::config::Config;
    let set = |key: &'static str, v: &str| (key, toml::Value::String(v.into()));
    let grants = [
        set("auth.grants.ed.dashboards", "edit"),
        set("auth.grants.ro.dashboards", "read"),
        set("auth.grants.me.dashboards", "own"),
    ];
    let c = Config::load(None, vec![], &grants).unwrap();
    let a = &c.security.auth;
    assert_eq!(a.dashboard_access("ed"), DashboardAccess::Edit);
    assert_eq!(a.dashboard_access("ro"), DashboardAccess::Read);
    assert_eq!(a.dashboard_access("me"), DashboardAccess::Own);
    assert_eq!(a.dashboard_access("nobody"), DashboardAccess::Own, "no grant: own");
    let g: Grant = toml::from_str("channels = [\"a\"]").unwrap();
    assert_eq!(g.dashboards, DashboardAccess::Own, "a grant without the key: own");
    let err = Config::load(None, vec![], &[set("auth.grants.bob.dashboards", "write")]).unwrap_err();
    assert!(err.0.contains("auth.grants.bob.dashboards") && err.0.contains("write"), "{err}");
}

#[test]
fn auth_string_lists_accept_commas() {
    #[derive(Deserialize)]
    struct T {
        l: StringList,
    }
    let t: T = toml::from_str("l = \"a, b,,c\"").unwrap();
    assert_eq!(t.l.0, vec!["a", "b", "c"]);
    let t: T = toml::from_str("l = [\"a,b\"]").unwrap();
    assert_eq!(t.l.0, vec!["a,b"]);
}
