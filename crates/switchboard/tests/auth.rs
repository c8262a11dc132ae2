//! Authentication against the real `switchboard` binary on 127.0.0.1:0, with our Rust client
//! (SPEC §6, docs/security.md): every way to present a token accepted, every bad token
//! refused with 4001, patterns enforced with 403, refresh and expiry, Basic users, API keys,
//! the `Origin` allow-list and TLS-free handshakes. Tokens are minted here with `jsonwebtoken`
//! from the test keys in `tests/fixtures/auth`.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use switchboard_client::{ChannelResult, Client, ConnectOptions, Event, Format, HttpApi, SubscribeOptions};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

mod support;
use support::Server;

const SECRET: &str = "test-secret-0123456789-abcdefghijklmnop";
const API_KEY: &str = "test-api-key-0123456789";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/auth").join(name)
}

fn fixture_arg(name: &str) -> String {
    fixture(name).to_string_lossy().into_owned()
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn hs256(claims: Value) -> String {
    encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(SECRET.as_bytes())).unwrap()
}

fn signed(alg: Algorithm, kid: Option<&str>, key_file: &str, claims: Value) -> String {
    let pem = std::fs::read(fixture(key_file)).unwrap();
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem).unwrap(),
        Algorithm::ES256 => EncodingKey::from_ec_pem(&pem).unwrap(),
        _ => unreachable!(),
    };
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_string);
    encode(&header, &claims, &key).unwrap()
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

fn jwt_server() -> Server {
    Server::start(&["--jwt-secret", SECRET, "--api-key", API_KEY])
}

fn keyed_api(server: &Server) -> HttpApi {
    server.api().with_token(API_KEY)
}

fn with_token(token: &str) -> ConnectOptions {
    let mut o = ConnectOptions::new(Format::Json);
    o.credentials = Some(switchboard_client::Credentials::Bearer(token.to_string()));
    o
}

/// Opens a WebSocket with extra handshake headers and returns the client and the response.
async fn connect_with_headers(
    url: &str,
    headers: &[(&str, &str)],
) -> Result<(Client, tokio_tungstenite::tungstenite::handshake::client::Response), tokio_tungstenite::tungstenite::Error>
{
    let mut request = url.into_client_request().unwrap();
    for (k, v) in headers {
        request.headers_mut().insert(
            tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    let authority = url.trim_start_matches("ws://").split('/').next().unwrap().to_string();
    let tcp = switchboard_client::MaybeTls::Plain(tokio::net::TcpStream::connect(authority).await?);
    let tcp = switchboard_client::Wire::new(tcp, false);
    let (ws, response) = tokio_tungstenite::client_async(request, tcp).await?;
    Ok((Client::from_stream(ws, Format::Json), response))
}

/// Reads events until the connection ends; returns the disconnect message's code, reason and
/// reconnect flag, and the close code.
async fn closed(c: &mut Client) -> (Option<(u16, String, bool)>, u16) {
    let mut disconnect = None;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), c.next_event()).await.expect("closed within 10 s") {
            Some(Event::Disconnect { code, reason, reconnect }) => disconnect = Some((code, reason, reconnect)),
            Some(Event::Closed { code, .. }) => return (disconnect, code),
            Some(_) => {}
            None => panic!("events ended without Closed"),
        }
    }
}

async fn next_pub(c: &mut Client) -> switchboard_client::Publication {
    loop {
        match tokio::time::timeout(Duration::from_secs(5), c.next_event()).await.expect("event within 5 s") {
            Some(Event::Publication(p)) => return p,
            Some(Event::Closed { code, .. }) => panic!("closed with {code}"),
            Some(_) => continue,
            None => panic!("connection ended"),
        }
    }
}

/// Subscribes to a fresh channel and checks a publication arrives: the connection is
/// authenticated and usable.
async fn proves_access(server: &Server, c: &mut Client, channel: &str) {
    let r = c.subscribe(SubscribeOptions::new([channel])).await.unwrap();
    assert!(matches!(r.channels[channel], ChannelResult::Subscribed(_)), "{r:?}");
    keyed_api(server).publish(channel, &json!({"to": channel})).await.unwrap();
    let p = next_pub(c).await;
    assert_eq!((p.ch.as_str(), p.data), (channel, json!({"to": channel})));
}

#[tokio::test]
async fn auth_token_is_accepted_from_header_query_subprotocol_and_connect() {
    let server = jwt_server();
    let token = hs256(json!({"sub": "alice", "exp": now() + 600}));

    let mut by_header = Client::connect_with(&server.ws(), &with_token(&token)).await.unwrap();
    proves_access(&server, &mut by_header, "h1").await;

    let mut by_query = Client::connect(&format!("{}?token={token}", server.ws()), Format::Json).await.unwrap();
    proves_access(&server, &mut by_query, "q1").await;

    let offer = format!("switchboard.v1.json, switchboard.token.{token}");
    let (mut by_protocol, response) =
        connect_with_headers(&server.ws(), &[("sec-websocket-protocol", &offer)]).await.unwrap();
    let chosen = response.headers().get("sec-websocket-protocol").unwrap().to_str().unwrap().to_string();
    assert_eq!(chosen, "switchboard.v1.json", "the real protocol is chosen, never the token entry");
    proves_access(&server, &mut by_protocol, "p1").await;

    let mut by_connect = Client::connect(&server.ws(), Format::Json).await.unwrap();
    let denied = by_connect.subscribe(SubscribeOptions::new(["c1"])).await.unwrap();
    assert!(matches!(&denied.channels["c1"], ChannelResult::Error { error } if error.code == 401), "{denied:?}");
    by_connect.connect_cmd(Some(&token), Some("test/1")).await.unwrap();
    proves_access(&server, &mut by_connect, "c2").await;

    // Presence names the token's subject.
    let room = by_header.subscribe(SubscribeOptions::new(["room:auth"])).await.unwrap();
    assert!(matches!(room.channels["room:auth"], ChannelResult::Subscribed(_)));
    let who = by_header.presence("room:auth").await.unwrap();
    assert_eq!(who.clients.iter().map(|c| c.user.clone()).collect::<Vec<_>>(), vec![Some("alice".to_string())]);
}

#[tokio::test]
async fn auth_bad_tokens_are_refused_with_4001() {
    let server = jwt_server();
    let exp = now() + 600;
    let good = hs256(json!({"sub": "alice", "exp": exp}));
    let parts: Vec<&str> = good.split('.').collect();
    let wrong_key = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "alice", "exp": exp}),
        &EncodingKey::from_secret(b"another-secret-another-secret-0000"),
    )
    .unwrap();
    let wrong_alg = encode(
        &Header::new(Algorithm::HS512),
        &json!({"sub": "alice", "exp": exp}),
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap();
    let rs256 = signed(Algorithm::RS256, None, "rsa.key.pem", json!({"sub": "alice", "exp": exp}));
    let none = format!("{}.{}.", b64(r#"{"alg":"none","typ":"JWT"}"#), parts[1]);
    let tampered = format!("{}.{}.{}", parts[0], b64(&json!({"sub": "root", "exp": exp}).to_string()), parts[2]);
    let expired = hs256(json!({"sub": "alice", "exp": now() - 30}));
    let not_yet = hs256(json!({"sub": "alice", "exp": exp, "nbf": now() + 3600}));
    let no_exp = hs256(json!({"sub": "alice"}));
    let cases = [
        ("wrong key", wrong_key, "signature"),
        ("wrong alg", wrong_alg, "algorithm"),
        ("RS256 on an HS256 node", rs256, "algorithm"),
        ("alg none", none, ""),
        ("tampered payload", tampered, "signature"),
        ("expired", expired, "expired"),
        ("not yet valid", not_yet, "not valid yet"),
        ("no exp", no_exp, "exp"),
        ("garbage", "not.a.jwt".to_string(), ""),
    ];
    for (name, token, why) in &cases {
        let mut c = Client::connect_with(&server.ws(), &with_token(token)).await.unwrap();
        let (disconnect, code) = closed(&mut c).await;
        assert_eq!(code, 4001, "{name}");
        let (dcode, reason, reconnect) = disconnect.unwrap_or_else(|| panic!("{name}: no disconnect message"));
        assert_eq!((dcode, reconnect), (4001, false), "{name}");
        assert!(reason.contains(why), "{name}: reason {reason:?} should mention {why:?}");
        assert!(!reason.contains(token.as_str()), "{name}: the reason must not echo the token");
    }
    // The same through the `connect` command.
    for (name, token, _) in &cases {
        let mut c = Client::connect(&server.ws(), Format::Json).await.unwrap();
        let _ = c.connect_cmd(Some(token), None).await;
        assert_eq!(closed(&mut c).await.1, 4001, "connect with {name}");
    }
    // The node is unharmed.
    let mut ok = Client::connect_with(&server.ws(), &with_token(&good)).await.unwrap();
    proves_access(&server, &mut ok, "after").await;
}

#[tokio::test]
async fn auth_claims_restrict_subscribe_and_publish_patterns() {
    let server = jwt_server();
    let token = hs256(json!({
        "sub": "bob", "exp": now() + 600,
        "channels": ["room:team.*", "pt:plant1.**"],
        "publish": ["room:team.chat"],
    }));
    let mut c = Client::connect_with(&server.ws(), &with_token(&token)).await.unwrap();
    let r = c
        .subscribe(SubscribeOptions::new([
            "room:team.chat",
            "pt:plant1.boiler.temp",
            "room:other",
            "pt:plant2.x",
            "room:team.a.b",
        ]))
        .await
        .unwrap();
    let code = |ch: &str| match &r.channels[ch] {
        ChannelResult::Subscribed(_) => 200,
        ChannelResult::Error { error } => error.code,
    };
    assert_eq!(
        ["room:team.chat", "pt:plant1.boiler.temp", "room:other", "pt:plant2.x", "room:team.a.b"].map(code),
        [200, 200, 403, 403, 403]
    );
    c.publish("room:team.chat", json!("hello")).await.unwrap();
    assert_eq!(next_pub(&mut c).await.data, json!("hello"));
    assert_eq!(c.publish("room:team.other", json!("x")).await.unwrap_err().code(), Some(403));
    assert_eq!(c.history("room:other", None, None).await.unwrap_err().code(), Some(403));
    assert_eq!(c.presence("room:other").await.unwrap_err().code(), Some(403));
    assert!(c.history("room:team.chat", None, None).await.is_ok());
    // A forbidden request does not close the connection.
    assert_eq!(c.ping(json!(1)).await.unwrap(), json!(1));
}

#[tokio::test]
async fn auth_rs256_pem_and_jwks_with_rs256_and_es256() {
    let pem = Server::start(&["--jwt-public-key", &fixture_arg("rsa.pub.pem")]);
    let claims = json!({"sub": "carol", "exp": now() + 600});
    let ok = signed(Algorithm::RS256, None, "rsa.key.pem", claims.clone());
    let c = Client::connect_with(&pem.ws(), &with_token(&ok)).await.unwrap();
    assert_eq!(c.ping(json!("rs")).await.unwrap(), json!("rs"));
    let other_key = signed(Algorithm::RS256, None, "rsa-other.key.pem", claims.clone());
    let mut bad = Client::connect_with(&pem.ws(), &with_token(&other_key)).await.unwrap();
    assert_eq!(closed(&mut bad).await.1, 4001);
    // An HS256 token whose "secret" is the public key (algorithm confusion) is refused.
    let confused = encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(&std::fs::read(fixture("rsa.pub.pem")).unwrap()),
    )
    .unwrap();
    let mut bad = Client::connect_with(&pem.ws(), &with_token(&confused)).await.unwrap();
    assert_eq!(closed(&mut bad).await.1, 4001);

    let jwks = Server::start(&["--jwks", &fixture_arg("jwks.json")]);
    // (algorithm, key id, signing key, another key of the same type)
    for (alg, kid, key, other) in [
        (Algorithm::RS256, "rsa-1", "rsa.key.pem", "rsa-other.key.pem"),
        (Algorithm::ES256, "ec-1", "ec.key.pem", "tls.key.pem"),
    ] {
        let t = signed(alg, Some(kid), key, claims.clone());
        let c = Client::connect_with(&jwks.ws(), &with_token(&t)).await.unwrap();
        assert_eq!(c.ping(json!(kid)).await.unwrap(), json!(kid), "{kid}");
        // A key the set does not hold, claiming the set's key id, does not verify.
        let forged = signed(alg, Some(kid), other, claims.clone());
        let mut bad = Client::connect_with(&jwks.ws(), &with_token(&forged)).await.unwrap();
        assert_eq!(closed(&mut bad).await.1, 4001, "{kid}");
    }
}

#[tokio::test]
async fn auth_refresh_keeps_the_connection_and_expiry_closes_4001() {
    let server = jwt_server();
    let first_exp = now() + 2;
    let short = hs256(json!({"sub": "dave", "exp": first_exp}));
    let mut refreshed = Client::connect_with(&server.ws(), &with_token(&short)).await.unwrap();
    let mut lapsed = Client::connect_with(&server.ws(), &with_token(&short)).await.unwrap();
    refreshed.subscribe(SubscribeOptions::new(["ticks"])).await.unwrap();

    let later = now() + 600;
    let reply = refreshed.refresh(&hs256(json!({"sub": "dave", "exp": later}))).await.unwrap();
    assert_eq!(reply.expires, later);
    // A refresh for somebody else, or with a bad token, is refused and changes nothing.
    let other = refreshed.refresh(&hs256(json!({"sub": "eve", "exp": later}))).await.unwrap_err();
    assert_eq!(other.code(), Some(403));
    let bad = refreshed.refresh(&hs256(json!({"sub": "dave", "exp": now() - 5}))).await.unwrap_err();
    assert_eq!(bad.code(), Some(401));

    let (disconnect, code) = closed(&mut lapsed).await;
    assert_eq!(code, 4001);
    assert_eq!(disconnect.map(|d| (d.0, d.1, d.2)), Some((4001, "token expired".to_string(), false)));

    // Past the first token's expiry the refreshed connection still streams.
    while now() <= first_exp {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    keyed_api(&server).publish("ticks", &json!(1)).await.unwrap();
    assert_eq!(next_pub(&mut refreshed).await.data, json!(1));
    assert_eq!(refreshed.closed(), None);
}

#[tokio::test]
async fn auth_without_credentials_the_first_message_must_come_in_time() {
    let server = Server::start_env(&["--jwt-secret", SECRET], &[("SWITCHBOARD_FIRST_MESSAGE_TIMEOUT_S", "1")]);
    let mut silent = Client::connect(&server.ws(), Format::Json).await.unwrap();
    let (disconnect, code) = closed(&mut silent).await;
    assert_eq!(code, 4001);
    assert!(disconnect.unwrap().1.contains("connect"));
    // A client that authenticates in time stays.
    let c = Client::connect(&server.ws(), Format::Json).await.unwrap();
    c.connect_cmd(Some(&hs256(json!({"sub": "f", "exp": now() + 600}))), None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(c.ping(json!("here")).await.unwrap(), json!("here"));
}

#[tokio::test]
async fn auth_basic_users_from_the_users_file() {
    let dir = std::env::temp_dir().join(format!("sb-auth-users-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The directory goes when the test ends, however it ends (after the server, declared later).
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Gone(dir.clone());
    let users = dir.join("users");
    let _ = std::fs::remove_file(&users);
    let mut add = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["user", "add", "grace", "--users"])
        .arg(&users)
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    add.stdin.take().unwrap().write_all(b"correct horse\n").unwrap();
    assert!(add.wait().unwrap().success());
    assert!(!std::fs::read_to_string(&users).unwrap().contains("correct horse"));

    let server = Server::start(&["--users", users.to_str().unwrap(), "--api-key", API_KEY]);
    use base64::Engine as _;
    let basic = |up: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(up));
    let (mut ok, _) =
        connect_with_headers(&server.ws(), &[("authorization", &basic("grace:correct horse"))]).await.unwrap();
    proves_access(&server, &mut ok, "basic.ok").await;
    for wrong in ["grace:wrong", "nobody:correct horse"] {
        let (mut c, _) = connect_with_headers(&server.ws(), &[("authorization", &basic(wrong))]).await.unwrap();
        assert_eq!(closed(&mut c).await.1, 4001, "{wrong}");
    }
    // The HTTP API wants credentials too (Basic over HTTP is checked in test_auth.py).
    let resp = server.api().request("GET", "/api/channels/basic.ok", None).await.unwrap();
    assert_eq!(resp.status, 401);
}

#[tokio::test]
async fn auth_http_api_needs_a_key_or_token() {
    let server = jwt_server();
    let open = server.api();
    let r = open.request("POST", "/api/publish", Some(br#"{"channel":"k","data":1}"#)).await.unwrap();
    assert_eq!(r.status, 401);
    let wrong = server.api().with_token("not-the-key-0123456789");
    assert!(wrong.publish("k", &json!(1)).await.unwrap_err().to_string().contains("401"));
    assert_eq!(keyed_api(&server).publish("k", &json!(1)).await.unwrap().offset, 1);
    // Health and metrics stay open.
    assert_eq!(open.request("GET", "/healthz", None).await.unwrap().status, 200);
    // A token may publish only where clients may (the `room` namespace) and its claims allow.
    let token = hs256(json!({"sub": "h", "exp": now() + 600, "publish": ["room:h"]}));
    let user = server.api().with_token(token);
    assert!(user.publish("room:h", &json!(1)).await.is_ok());
    assert!(user.publish("room:x", &json!(1)).await.unwrap_err().to_string().contains("403"));
    assert!(user.publish("k", &json!(1)).await.unwrap_err().to_string().contains("403"));
}

#[tokio::test]
async fn auth_origin_allow_list_refuses_other_origins_with_403() {
    let server = Server::start(&["--allowed-origin", "https://app.example.com"]);
    let (c, _) = connect_with_headers(&server.ws(), &[("origin", "https://app.example.com")]).await.unwrap();
    assert_eq!(c.ping(json!(1)).await.unwrap(), json!(1));
    match connect_with_headers(&server.ws(), &[("origin", "https://evil.example.net")]).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 403),
        Err(e) => panic!("expected HTTP 403, got {e}"),
        Ok(_) => panic!("a foreign origin was let in"),
    }
    // Without an allow-list only the node's own origin may connect.
    let same = Server::start(&[]);
    let own = format!("http://127.0.0.1:{}", same.port);
    assert!(connect_with_headers(&same.ws(), &[("origin", &own)]).await.is_ok());
    assert!(connect_with_headers(&same.ws(), &[("origin", "http://evil.example.net")]).await.is_err());
    // Clients without an Origin header (not browsers) are not affected.
    assert!(Client::connect(&same.ws(), Format::Json).await.is_ok());
}
