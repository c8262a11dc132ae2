//! Black-box tests: the real `switchboard` binary on 127.0.0.1:0, driven by our Rust client.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use serde_json::json;
use switchboard_client::{ChannelResult, Client, Compression, ConnectOptions, Event, Format, SubscribeOptions};

mod support;
use support::Server;

async fn next_pub(c: &mut Client) -> switchboard_client::Publication {
    loop {
        match tokio::time::timeout(Duration::from_secs(5), c.next_event()).await.expect("event within 5 s") {
            Some(Event::Publication(p)) => return p,
            Some(_) => continue,
            None => panic!("connection ended"),
        }
    }
}

fn subscribed(r: &ChannelResult) -> &switchboard_client::Subscribed {
    match r {
        ChannelResult::Subscribed(s) => s,
        ChannelResult::Error { error } => panic!("subscribe failed: {error:?}"),
    }
}

#[tokio::test]
async fn ws_publications_reach_json_and_msgpack_subscribers_with_initial_values() {
    let server = Server::start(&[]);
    let api = server.api();
    api.publish("pt:boiler.temp", &json!({"v": 71.5})).await.unwrap();
    let mut a = Client::connect(&server.ws(), Format::Json).await.unwrap();
    let mut b = Client::connect(&server.ws(), Format::Msgpack).await.unwrap();
    for c in [&a, &b] {
        let r = c.subscribe(SubscribeOptions::new(["pt:boiler.temp"]).initial(true)).await.unwrap();
        let s = subscribed(&r.channels["pt:boiler.temp"]);
        assert_eq!(s.offset, 1);
        assert_eq!(s.last.as_ref().unwrap().data, json!({"v": 71.5}));
    }
    api.publish("pt:boiler.temp", &json!({"v": 72.0})).await.unwrap();
    for c in [&mut a, &mut b] {
        let p = next_pub(c).await;
        assert_eq!((p.ch.as_str(), p.off, p.data), ("pt:boiler.temp", 2, json!({"v": 72.0})));
    }
    assert_eq!(a.ping(json!({"t": 1})).await.unwrap(), json!({"t": 1}));
}

#[tokio::test]
async fn ws_compressed_publications_arrive_identical_to_plain_ones_in_fewer_bytes() {
    let server = Server::start(&[]);
    let api = server.api();
    // One client as the library connects by default (offering permessage-deflate), one that
    // offers nothing, one in MessagePack offering it.
    let mut plain_opts = ConnectOptions::new(Format::Json);
    plain_opts.compression = Compression::Off;
    let mut deflated = Client::connect(&server.ws(), Format::Json).await.unwrap();
    let mut plain = Client::connect_with(&server.ws(), &plain_opts).await.unwrap();
    let mut packed = Client::connect(&server.ws(), Format::Msgpack).await.unwrap();
    assert!(deflated.wire().deflate.load(Relaxed) && packed.wire().deflate.load(Relaxed));
    assert!(!plain.wire().deflate.load(Relaxed));
    for c in [&deflated, &plain, &packed] {
        c.subscribe(SubscribeOptions::new(["doc:a"])).await.unwrap();
    }
    let read = |c: &Client| c.wire().read.load(Relaxed);
    let before = [read(&deflated), read(&plain)];
    // Documents of about 1.7 KiB, each different; past `compression_min_bytes`, so compressed.
    let docs: Vec<serde_json::Value> = (0..20)
        .map(|i| json!({"i": i, "rows": (0..60).map(|r| json!({"tag": format!("area{}/pt{r}", i % 3), "v": r * i})).collect::<Vec<_>>()}))
        .collect();
    for d in &docs {
        api.publish("doc:a", d).await.unwrap();
    }
    for c in [&mut deflated, &mut plain, &mut packed] {
        for (i, d) in docs.iter().enumerate() {
            let p = next_pub(c).await;
            assert_eq!((p.off, &p.data), (i as u64 + 1, d));
        }
    }
    let (compressed, whole) = (read(&deflated) - before[0], read(&plain) - before[1]);
    assert!(whole > 20 * 1600, "{whole} bytes for 20 documents of about 1.7 KiB");
    assert!(compressed * 2 < whole, "deflate read {compressed} bytes, plain {whole}");
}

#[tokio::test]
async fn ws_reconnect_recovers_exactly_the_missed_offsets() {
    let server = Server::start(&[]);
    let api = server.api();
    let c = Client::connect(&server.ws(), Format::Json).await.unwrap();
    let r = c.subscribe(SubscribeOptions::new(["orders"])).await.unwrap();
    let epoch = subscribed(&r.channels["orders"]).epoch.clone();
    for i in 1..=10 {
        api.publish("orders", &json!(i)).await.unwrap();
    }
    drop(c);
    for i in 11..=15 {
        api.publish("orders", &json!(i)).await.unwrap();
    }
    let mut c = Client::connect(&server.ws(), Format::Json).await.unwrap();
    let r = c.subscribe(SubscribeOptions::new(["orders"]).recover("orders", epoch.clone(), 10)).await.unwrap();
    let s = subscribed(&r.channels["orders"]);
    assert!(s.complete);
    assert_eq!(s.recovered.iter().map(|p| p.off).collect::<Vec<_>>(), vec![11, 12, 13, 14, 15]);
    assert_eq!(s.recovered[0].data, json!(11));
    api.publish("orders", &json!(16)).await.unwrap();
    assert_eq!(next_pub(&mut c).await.off, 16, "live delivery continues right after the recovered ones");
    let r = c.subscribe(SubscribeOptions::new(["x"]).recover("x", "not-the-epoch", 3)).await.unwrap();
    assert!(!subscribed(&r.channels["x"]).complete);
}

#[tokio::test]
async fn ws_presence_and_client_publish_in_rooms_only() {
    let server = Server::start(&[]);
    let mut a = Client::connect(&server.ws(), Format::Json).await.unwrap();
    let b = Client::connect(&server.ws(), Format::Json).await.unwrap();
    a.subscribe(SubscribeOptions::new(["room:7"])).await.unwrap();
    b.subscribe(SubscribeOptions::new(["room:7"])).await.unwrap();
    assert_eq!(b.presence("room:7").await.unwrap().clients.len(), 2);
    b.publish("room:7", json!({"text": "hi"})).await.unwrap();
    assert_eq!(next_pub(&mut a).await.data, json!({"text": "hi"}));
    let err = b.publish("news", json!(1)).await.unwrap_err();
    assert_eq!(err.code(), Some(403));
    drop(b);
    let left = loop {
        match tokio::time::timeout(Duration::from_secs(5), a.next_event()).await.unwrap() {
            Some(Event::Leave(p)) => break p,
            Some(_) => continue,
            None => panic!("closed"),
        }
    };
    assert_eq!(left.ch, "room:7");
}

#[tokio::test]
async fn limits_oversize_frame_closes_1009_and_garbage_closes_4010_while_others_stream_on() {
    let server = Server::start(&["--max-frame-bytes", "1024"]);
    let api = server.api();
    let mut bystander = Client::connect(&server.ws(), Format::Json).await.unwrap();
    bystander.subscribe(SubscribeOptions::new(["feed"])).await.unwrap();

    let mut big = Client::connect(&server.ws(), Format::Json).await.unwrap();
    big.send_text(format!("{{\"ping\":{{\"data\":\"{}\"}}}}", "x".repeat(2000))).unwrap();
    let mut garbage = Client::connect(&server.ws(), Format::Json).await.unwrap();
    garbage.send_text("this is not json").unwrap();
    for (c, code) in [(&mut big, 1009), (&mut garbage, 4010)] {
        let closed = loop {
            match tokio::time::timeout(Duration::from_secs(5), c.next_event()).await.unwrap() {
                Some(Event::Closed { code, .. }) => break code,
                Some(_) => continue,
                None => panic!("no close"),
            }
        };
        assert_eq!(closed, code);
    }
    for i in 1..=3 {
        api.publish("feed", &json!(i)).await.unwrap();
        assert_eq!(next_pub(&mut bystander).await.off, i);
    }
}

#[tokio::test]
async fn limits_connection_and_subscription_limits_answer_4029_and_429() {
    let server = Server::start(&["--max-connections", "2", "--max-subscriptions", "3"]);
    let a = Client::connect(&server.ws(), Format::Json).await.unwrap();
    let b = Client::connect(&server.ws(), Format::Json).await.unwrap();
    // A connection is registered by its task after the 101 response: a reply proves a and b
    // hold their slots before c arrives.
    a.ping(json!(1)).await.unwrap();
    b.ping(json!(2)).await.unwrap();
    let mut c = Client::connect(&server.ws(), Format::Json).await.unwrap();
    let mut saw = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(5), c.next_event()).await {
        match ev {
            Event::Disconnect { code, reconnect, .. } => saw.push((code, reconnect)),
            Event::Closed { code, .. } => {
                saw.push((code, false));
                break;
            }
            _ => {}
        }
    }
    assert_eq!(saw, vec![(4029, true), (4029, false)]);
    let r = a.subscribe(SubscribeOptions::new(["a", "b", "c", "d", "bad name"])).await.unwrap();
    assert!(matches!(r.channels["c"], ChannelResult::Subscribed(_)));
    assert!(matches!(&r.channels["d"], ChannelResult::Error { error } if error.code == 429));
    assert!(matches!(&r.channels["bad name"], ChannelResult::Error { error } if error.code == 400));
    let r = a.subscribe(SubscribeOptions::new(["a"])).await.unwrap();
    assert!(matches!(&r.channels["a"], ChannelResult::Error { error } if error.code == 409));
}

#[tokio::test]
async fn shutdown_sigterm_disconnects_every_client_with_4000_and_exits_0() {
    let mut server = Server::start(&[]);
    let mut clients = Vec::new();
    for _ in 0..5 {
        let c = Client::connect(&server.ws(), Format::Json).await.unwrap();
        c.subscribe(SubscribeOptions::new(["x"])).await.unwrap();
        clients.push(c);
    }
    let status = tokio::task::spawn_blocking(move || {
        let s = server.terminate();
        drop(server);
        s
    });
    for c in &mut clients {
        let mut got = (None, None);
        while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(5), c.next_event()).await {
            match ev {
                Event::Disconnect { code, reconnect, .. } => got.0 = Some((code, reconnect)),
                Event::Closed { code, .. } => {
                    got.1 = Some(code);
                    break;
                }
                _ => {}
            }
        }
        assert_eq!(got, (Some((4000, true)), Some(4000)));
    }
    assert!(status.await.unwrap().success());
}
