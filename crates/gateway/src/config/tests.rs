//! Unit tests of the configuration: files, environment, flags and their errors.

use std::time::Duration;

use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn config_cluster_tags_tell_deployments_apart_and_ignore_credentials() {
    let tag = |broker: &str, name: Option<&str>| {
        Config { broker: broker.into(), cluster_name: name.map(String::from), ..Config::default() }.cluster_tag()
    };
    let prod = tag("redis://10.0.0.5:6379/0?prefix=prod", None);
    assert_eq!(prod.len(), 8);
    assert_eq!(tag("redis://app:secret@10.0.0.5:6379/0?prefix=prod", None), prod, "credentials do not count");
    assert_ne!(tag("redis://10.0.0.5:6379/0?prefix=staging", None), prod);
    assert_eq!(tag("redis://a:1,redis://u:p@b:2", None), tag("redis://a:1,redis://b:2", None));
    assert_eq!(tag("redis://10.0.0.5:6379", Some("plant-a")), "plant-a");
}

#[test]
fn config_defaults_follow_the_spec() {
    let c = Config::load(None, vec![], &[]).unwrap();
    assert_eq!(c.listen, "127.0.0.1:8700");
    assert!(c.namespace("pt").conflate);
    assert!(c.namespace("room").client_publish && c.namespace("room").presence);
    assert_eq!(c.namespace("").history_size, 100);
    assert_eq!(c.namespace("").history_ttl_s, 300);
    assert!(!c.namespace("other").client_publish);
    assert_eq!(c.limits.max_frame_bytes, 65536);
}

#[test]
fn config_channel_ttl_defaults_keep_points_forever_and_namespaces_may_change_it() {
    let c = Config::default();
    let hour = Duration::from_secs(DEFAULT_CHANNEL_TTL_S);
    assert_eq!(c.channel_ttl("room:9f1c"), hour);
    assert_eq!(c.channel_ttl("news"), hour, "the default namespace");
    assert_eq!(c.channel_ttl("pt:plant.valve7"), Duration::ZERO);
    assert_eq!(c.channel_ttl("other:x"), hour, "an unconfigured namespace takes the default one's");
    assert_eq!(c.channel_ttl("$reply:n1"), Duration::from_secs(INTERNAL_CHANNEL_TTL_S), "internal channels");
    let set = |k: &str, v: i64| (k.to_string(), toml::Value::Integer(v));
    let (a, b) = (set("namespaces.pt.channel_ttl_s", 60), set("namespaces.room.channel_ttl_s", 0));
    let c = Config::load(None, vec![], &[(a.0.as_str(), a.1), (b.0.as_str(), b.1)]).unwrap();
    assert_eq!(c.channel_ttl("pt:x"), Duration::from_secs(60));
    assert_eq!(c.channel_ttl("room:x"), Duration::ZERO);
}

#[test]
fn config_env_and_overrides_layer_over_the_file() {
    let dir = std::env::temp_dir().join(format!("sbcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:9000\"\n[limits]\nmax_connections = 5\n[namespaces.chat]\nclient_publish = true\n",
    )
    .unwrap();
    let c = Config::load(
        Some(&path),
        env(&[
            ("SWITCHBOARD_MAX_SUBSCRIPTIONS", "7"),
            ("SWITCHBOARD_AUTH__REVOCATION_KEEP_S", "7200"),
            ("SWITCHBOARD_AUTH__JWKS_REFRESH_S", "60"),
            ("SWITCHBOARD_NAMESPACES__PT__HISTORY_SIZE", "3"),
            ("OTHER", "x"),
            ("SWITCHBOARD_BIN", "/usr/local/bin/switchboard"),
            // The command-line tools' credentials, exported in the same shell.
            ("SWITCHBOARD_TOKEN", "t"),
            ("SWITCHBOARD_USER", "alice"),
            ("SWITCHBOARD_PASSWORD", "pw"),
        ]),
        &[("limits.max_connections", toml::Value::Integer(6))],
    )
    .unwrap();
    assert_eq!(c.listen, "127.0.0.1:9000");
    assert_eq!(c.limits.max_connections, 6);
    assert_eq!(c.limits.max_subscriptions, 7);
    assert_eq!((c.auth.revocation_keep_s, c.auth.jwks_refresh_s), (Some(7200), Some(60)), "auth numbers");
    assert_eq!(c.namespace("pt").history_size, 3);
    assert!(c.namespace("pt").conflate, "a built-in namespace keeps what it is not told");
    assert_eq!(c.namespace("pt").history_ttl_s, 0);
    assert!(c.namespace("chat").client_publish);
}

#[test]
fn config_errors_name_the_key() {
    let e = Config::load(None, env(&[("SWITCHBOARD_LIMITS__MAX_CONECTIONS", "1")]), &[]).unwrap_err();
    assert!(e.0.contains("max_conections"), "{e}");
    let e = Config::load(None, env(&[("SWITCHBOARD_MAX_CONNECTIONS", "lots")]), &[]).unwrap_err();
    assert!(e.0.contains("max_connections"), "{e}");
    let e = Config::load(None, vec![], &[("listen", toml::Value::String("0.0.0.0:80".into()))]).unwrap_err();
    assert!(e.0.contains("listen") && e.0.contains("--allow-anonymous"), "{e}");
    let e = Config::load(None, vec![], &[("simulate", toml::Value::String("ten".into()))]).unwrap_err();
    assert!(e.0.contains("simulate"), "{e}");
}

#[test]
fn config_sources_are_checked_and_write_source_must_name_one() {
    let dir = std::env::temp_dir().join(format!("sbcfg-src-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let load = |text: &str| {
        let path = dir.join("s.toml");
        std::fs::write(&path, text).unwrap();
        Config::load(Some(&path), vec![], &[])
    };
    let mqtt =
        "[[sources]]\nkind = \"mqtt\"\nname = \"plant\"\nurl = \"mqtt://127.0.0.1:1883\"\ntopics = [\"plant/#\"]\n";
    let c = load(&format!("{mqtt}[namespaces.pt]\nwrite_source = \"plant\"\n")).unwrap();
    assert_eq!(c.sources.len(), 1);
    assert_eq!(c.namespace("pt").write_source.as_deref(), Some("plant"));
    let e = load(&format!("{mqtt}[namespaces.pt]\nwrite_source = \"plc\"\n")).unwrap_err();
    assert!(e.0.contains("namespaces.pt.write_source"), "{e}");
    let e = load(&mqtt.replace("mqtt://", "http://")).unwrap_err();
    assert!(e.0.starts_with("sources[0].url"), "{e}");
    let e = load(&mqtt.replace("topics", "topicz")).unwrap_err();
    assert!(e.0.contains("sources") && e.0.contains("topicz"), "{e}");
    let e = load(&format!("{mqtt}{mqtt}")).unwrap_err();
    assert!(e.0.contains("used twice"), "{e}");
}

#[test]
fn config_broker_accepts_memory_and_redis_forms_and_refuses_the_rest() {
    let broker = |url: &str| Config::load(None, env(&[("SWITCHBOARD_BROKER", url)]), &[]).map(|c| c.broker);
    assert_eq!(broker("memory").unwrap(), "memory");
    assert_eq!(broker("redis://127.0.0.1:6379/0?prefix=a").unwrap(), "redis://127.0.0.1:6379/0?prefix=a");
    assert_eq!(broker("redis+cluster://10.0.0.1:7000").unwrap(), "redis+cluster://10.0.0.1:7000");
    let e = broker("redis+cluster://user:hunter2@10.0.0.1:7000/2").unwrap_err();
    assert!(e.0.starts_with("broker:") && e.0.contains("db") && !e.0.contains("hunter2"), "{e}");
    let e = broker("kafka://x").unwrap_err();
    assert!(e.0.contains("memory") && e.0.contains("redis://"), "{e}");
}

#[test]
fn config_beyond_loopback_needs_some_authentication_an_idp_or_a_connect_hook_counts() {
    let load = |pairs: &[(&str, &str)]| Config::load(None, env(pairs), &[]);
    let e = load(&[("SWITCHBOARD_LISTEN", "0.0.0.0:8700")]).unwrap_err();
    assert!(e.0.starts_with("listen:") && e.0.contains("--allow-anonymous"), "{e}");
    for (key, value) in [
        ("SWITCHBOARD_AUTH__JWKS_URL", "https://idp.example/certs"),
        ("SWITCHBOARD_PROXY__CONNECT_URL", "http://app.example/sb/connect"),
        ("SWITCHBOARD_JWT_SECRET", "a-secret-of-at-least-thirty-two-bytes!!"),
    ] {
        assert!(load(&[("SWITCHBOARD_LISTEN", "0.0.0.0:8700"), (key, value)]).is_ok(), "{key}");
    }
}

#[test]
fn config_compression_defaults_to_deflate_and_is_set_by_name() {
    let c = Config::load(None, vec![], &[]).unwrap();
    assert_eq!((c.limits.compression, c.limits.compression_min_bytes), (Compression::Deflate, 256));
    let c = Config::load(
        None,
        env(&[("SWITCHBOARD_COMPRESSION", "off"), ("SWITCHBOARD_LIMITS__COMPRESSION_MIN_BYTES", "0")]),
        &[],
    )
    .unwrap();
    assert_eq!((c.limits.compression, c.limits.compression_min_bytes), (Compression::Off, 0));
    let e = Config::load(None, env(&[("SWITCHBOARD_COMPRESSION", "gzip")]), &[]).unwrap_err();
    assert!(e.0.starts_with("limits.compression:"), "{e}");
}
