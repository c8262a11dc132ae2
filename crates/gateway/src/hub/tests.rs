use super::*;
use crate::outbox::tests::TestWire;
use serde_json::value::RawValue;

fn publication(off: u64, v: &str) -> Publication {
    Publication {
        offset: off,
        data: Arc::new(RawValue::from_string(v.into()).unwrap()),
        time_ms: 0,
        historical: false,
        tags: None,
    }
}

#[test]
fn hub_fans_one_encoding_out_to_every_subscriber() {
    let metrics = Arc::new(Metrics::default());
    let hub = Hub::new(metrics.clone());
    let ch: Arc<str> = "news".into();
    let wires: Vec<Arc<TestWire>> = (0..3).map(|_| TestWire::open(usize::MAX)).collect();
    let obs: Vec<Arc<Outbox>> = wires
        .iter()
        .enumerate()
        .map(|(i, w)| Arc::new(Outbox::new(i as u64, Format::Json, w.clone(), 1 << 20, metrics.clone())))
        .collect();
    assert!(hub.add(&ch, &obs[0], false, Rule::Every));
    assert!(!hub.add(&ch, &obs[1], false, Rule::Every));
    hub.add(&ch, &obs[2], false, Rule::Every);
    hub.on_publication("news", &publication(1, "{\"x\":1}"));
    hub.after_publications();
    for w in &wires {
        assert_eq!(w.messages(), vec![serde_json::json!({"pub": {"ch": "news", "off": 1, "data": {"x": 1}}})]);
    }
    assert!(!hub.remove("news", 0));
    assert!(!hub.remove("news", 1));
    assert!(hub.remove("news", 2));
    assert_eq!(hub.channel_count(), 0);
}

#[test]
fn hub_counts_channels_with_subscribers_as_they_come_and_go() {
    let metrics = Arc::new(Metrics::default());
    let hub = Hub::new(metrics.clone());
    let scan = |hub: &Hub| -> usize {
        hub.shards.iter().map(|s| s.read().values().filter(|subs| subs.len() > 0).count()).sum()
    };
    let obs: Vec<Arc<Outbox>> = (0..4)
        .map(|i| Arc::new(Outbox::new(i, Format::Json, TestWire::open(usize::MAX), 1 << 20, metrics.clone())))
        .collect();
    // Half of them subscribe again after on_missed (leave the channel), half are closed
    // (stay until their teardown).
    obs[0].accept_resubscribes();
    obs[2].accept_resubscribes();
    let rules = || {
        let rate = crate::sampling::parse(Some(10.0), None).unwrap().unwrap();
        let filter = Arc::new(Filter::Leaf { key: "unit".into(), cmp: switchboard_protocol::filter::Cmp::Ex });
        [Rule::Every, Rule::Sampled(rate), Rule::Filtered(filter), Rule::Delta]
    };
    // Channels gain subscribers under every rule, twice over (a repeat adds nothing), with
    // a tap slot on some; then lose them one by one, some through on_missed.
    hub.set_tap_slot("c:0", Some(Arc::new(1u32)));
    assert_eq!((hub.channel_count(), scan(&hub)), (0, 0));
    let mut state = 7u64;
    let mut step = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    for _ in 0..400 {
        // Each connection subscribes under its own rule, as a session holds one per channel.
        let (ch, ob) = (format!("c:{}", step() % 20), step() % 4);
        match step() % 3 {
            0 | 1 => {
                let rule = rules().into_iter().nth(ob).unwrap();
                hub.add(&Arc::from(ch.as_str()), &obs[ob], false, rule);
            }
            _ => {
                hub.remove(&ch, ob as u64);
            }
        }
        if step() % 17 == 0 {
            hub.on_missed(&ch);
        }
        assert_eq!(hub.channel_count(), scan(&hub));
    }
    for ch in 0..20 {
        for ob in 0..4 {
            hub.remove(&format!("c:{ch}"), ob);
        }
    }
    assert_eq!((hub.channel_count(), scan(&hub)), (0, 0));
}

#[test]
fn hub_hands_the_tap_each_publication_with_its_channels_slot_subscribed_or_not() {
    #[derive(Default)]
    struct Seen(Mutex<Vec<(String, Option<u32>)>>);
    impl PublicationTap for Seen {
        fn on_publication(&self, channel: &str, slot: Option<&TapSlot>, _: &Publication) {
            let slot = slot.and_then(|s| s.downcast_ref::<u32>()).copied();
            self.0.lock().push((channel.to_string(), slot));
        }
    }
    let metrics = Arc::new(Metrics::default());
    let hub = Hub::new(metrics.clone());
    let seen = Arc::new(Seen::default());
    hub.set_tap(seen.clone());
    hub.set_tap_slot("plant:t1", Some(Arc::new(7u32)));
    let ch: Arc<str> = "plant:t1".into();
    let wire = TestWire::open(usize::MAX);
    let ob = Arc::new(Outbox::new(1, Format::Json, wire.clone(), 1 << 20, metrics.clone()));
    // The slot's entry is no subscriber: the first subscriber is still the first.
    assert_eq!(hub.channel_count(), 0);
    assert!(hub.add(&ch, &ob, false, Rule::Every));
    hub.on_publication("plant:t1", &publication(1, "1"));
    hub.on_publication("plant:t2", &publication(1, "2"));
    assert!(hub.remove("plant:t1", 1));
    // The slot outlives the channel's last subscriber, until it is cleared.
    hub.on_publication("plant:t1", &publication(2, "3"));
    hub.set_tap_slot("plant:t1", None);
    hub.on_publication("plant:t1", &publication(3, "4"));
    hub.after_publications();
    let expected = [("plant:t1", Some(7)), ("plant:t2", None), ("plant:t1", Some(7)), ("plant:t1", None)];
    let expected: Vec<(String, Option<u32>)> = expected.iter().map(|(c, s)| (c.to_string(), *s)).collect();
    assert_eq!(*seen.0.lock(), expected);
    assert_eq!(wire.messages().len(), 1, "only the publication made while subscribed is delivered");
    assert_eq!(hub.channel_count(), 0);
}

#[test]
fn hub_sends_a_historical_publication_marked_only_to_subscribers_of_every_publication() {
    #[derive(Default)]
    struct Seen(Mutex<usize>);
    impl PublicationTap for Seen {
        fn on_publication(&self, _: &str, _: Option<&TapSlot>, _: &Publication) {
            *self.0.lock() += 1;
        }
    }
    let metrics = Arc::new(Metrics::default());
    let hub = Hub::new(metrics.clone());
    let seen = Arc::new(Seen::default());
    hub.set_tap(seen.clone());
    let wires: Vec<Arc<TestWire>> = (0..3).map(|_| TestWire::open(usize::MAX)).collect();
    let ob = |i: usize| Arc::new(Outbox::new(i as u64, Format::Json, wires[i].clone(), 1 << 20, metrics.clone()));
    let rate = Rule::Sampled(crate::sampling::parse(Some(100.0), None).unwrap().unwrap());
    hub.add(&Arc::from("log:a"), &ob(0), false, Rule::Every);
    hub.add(&Arc::from("log:a"), &ob(1), false, rate);
    hub.add(&Arc::from("pt:a"), &ob(2), true, Rule::Every);
    let past = |off| Publication { historical: true, ..publication(off, "5") };
    hub.on_publication("log:a", &past(2));
    hub.on_publication("pt:a", &past(2));
    hub.after_publications();
    let marked = serde_json::json!({"pub": {"ch": "log:a", "off": 2, "data": 5, "hist": true}});
    assert_eq!(wires[0].messages(), vec![marked]);
    assert!(wires[1].messages().is_empty(), "a rate keeps the current value");
    assert!(wires[2].messages().is_empty(), "a conflating channel keeps the current value");
    assert_eq!(*seen.0.lock(), 0, "alarms never see a historical value");
}

#[test]
fn hub_sends_delta_subscribers_a_whole_publication_then_fossil_deltas_computed_once() {
    let metrics = Arc::new(Metrics::default());
    let hub = Hub::new(metrics.clone());
    let wires: Vec<Arc<TestWire>> = (0..2).map(|_| TestWire::open(usize::MAX)).collect();
    let obs: Vec<Arc<Outbox>> = (0..2)
        .map(|i| Arc::new(Outbox::new(i as u64, Format::Json, wires[i].clone(), 1 << 20, metrics.clone())))
        .collect();
    let doc = |i: u64| {
        let fields: Vec<String> = (0..40).map(|f| format!(r#""field{f}":"value {f} of the document""#)).collect();
        format!(r#"{{"n":{i},{}}}"#, fields.join(","))
    };
    let ch: Arc<str> = "log:doc".into();
    hub.add(&ch, &obs[0], false, Rule::Delta);
    for off in 1..=2 {
        hub.on_publication("log:doc", &publication(off, &doc(off)));
    }
    hub.add(&ch, &obs[1], false, Rule::Delta);
    hub.on_publication("log:doc", &publication(3, &doc(3)));
    // A gap in the channel's offsets: the next one cannot be a delta.
    hub.on_publication("log:doc", &publication(5, &doc(5)));
    hub.after_publications();
    let pushes = |w: &TestWire| -> Vec<(u64, bool, String)> {
        let m = w.messages();
        m.iter()
            .map(|m| {
                let p = &m["pub"];
                (p["off"].as_u64().unwrap(), p["delta"].as_bool().unwrap(), p["data"].as_str().unwrap().to_string())
            })
            .collect()
    };
    let first = pushes(&wires[0]);
    assert_eq!(
        first.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(),
        vec![(1, false), (2, true), (3, true), (5, false)]
    );
    let mut text = first[0].2.clone();
    assert_eq!(text, doc(1));
    for (off, delta, data) in &first[1..] {
        text = match delta {
            true => String::from_utf8(fossil_delta::apply(text.as_bytes(), data.as_bytes()).unwrap()).unwrap(),
            false => data.clone(),
        };
        assert_eq!(text, doc(*off));
        assert!(!delta || data.len() * 5 < doc(*off).len(), "a delta is much smaller: {}", data.len());
    }
    let second = pushes(&wires[1]);
    assert_eq!(second.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(), vec![(3, false), (5, false)], "whole first");
    assert_eq!(second[0].2, doc(3));
}

#[test]
fn hub_sends_msgpack_subscribers_msgpack() {
    let metrics = Arc::new(Metrics::default());
    let hub = Hub::new(metrics.clone());
    let w = TestWire::open(usize::MAX);
    let ob = Arc::new(Outbox::new(9, Format::Msgpack, w.clone(), 1 << 20, metrics));
    hub.add(&Arc::from("m"), &ob, false, Rule::Every);
    hub.on_publication("m", &publication(3, "[1,2]"));
    hub.after_publications();
    let frames = w.frames();
    assert_eq!(frames.len(), 1);
    let v: serde_json::Value = rmp_serde_decode(&frames[0].1);
    assert_eq!(v, serde_json::json!({"pub": {"ch": "m", "off": 3, "data": [1, 2]}}));
}

#[test]
fn hub_hands_internal_channels_to_the_internal_handler_only() {
    struct Seen(Mutex<Vec<(String, String)>>);
    impl InternalHandler for Seen {
        fn on_internal(&self, channel: &str, data: &Data) {
            self.0.lock().push((channel.to_string(), data.get().to_string()));
        }
    }
    let metrics = Arc::new(Metrics::default());
    let hub = Hub::new(metrics.clone());
    hub.on_publication("$write:plant", &publication(1, "1"));
    let seen = Arc::new(Seen(Mutex::new(Vec::new())));
    hub.add_internal("$write:", seen.clone());
    let w = TestWire::open(usize::MAX);
    let ob = Arc::new(Outbox::new(1, Format::Json, w.clone(), 1 << 20, metrics.clone()));
    hub.add(&Arc::from("$write:plant"), &ob, false, Rule::Every);
    hub.on_publication("$write:plant", &publication(2, "{\"id\":7}"));
    hub.after_publications();
    assert_eq!(*seen.0.lock(), vec![("$write:plant".to_string(), "{\"id\":7}".to_string())]);
    assert!(w.messages().is_empty(), "never fanned out");
    assert_eq!(metrics.publications.load(Relaxed), 0, "not counted as publications");
}

#[test]
fn hub_missed_channel_ends_that_subscription_only_or_closes_clients_that_cannot_resubscribe() {
    let metrics = Arc::new(Metrics::default());
    let hub = Hub::new(metrics.clone());
    let (lost, healthy): (Arc<str>, Arc<str>) = ("lost".into(), "healthy".into());
    let ws = TestWire::open(usize::MAX);
    let ws_ob = Arc::new(Outbox::new(1, Format::Json, ws.clone(), 1 << 20, metrics.clone()));
    ws_ob.accept_resubscribes();
    let sse = TestWire::open(usize::MAX);
    let sse_ob = Arc::new(Outbox::new(2, Format::Json, sse.clone(), 1 << 20, metrics.clone()));
    for ob in [&ws_ob, &sse_ob] {
        hub.add(&lost, ob, false, Rule::Every);
        hub.add(&healthy, ob, false, Rule::Every);
    }
    hub.on_publication("lost", &publication(1, "1"));
    hub.on_missed("lost");
    hub.on_publication("lost", &publication(5, "5"));
    hub.on_publication("healthy", &publication(1, "1"));
    hub.after_publications();
    assert_eq!(
        ws.messages(),
        vec![
            serde_json::json!({"pub": {"ch": "lost", "off": 1, "data": 1}}),
            serde_json::json!({"unsubscribed": {"ch": "lost", "code": 4008,
                "reason": "publications may have been missed; subscribe again with recover", "resubscribe": true}}),
            serde_json::json!({"pub": {"ch": "healthy", "off": 1, "data": 1}}),
        ],
        "what came before the hole, the notice, then only the other channel"
    );
    assert_eq!(ws_ob.take_lost(), vec![lost.clone()]);
    assert!(!ws_ob.is_closing());
    assert!(sse_ob.is_closing(), "a stream that cannot subscribe again is closed to recover");
    assert_eq!(sse.messages()[0], serde_json::json!({"pub": {"ch": "lost", "off": 1, "data": 1}}));
    assert_eq!(sse.messages()[1]["disconnect"]["code"], 4008);
    assert_eq!(hub.subscriber_count("lost"), 1, "the closing stream leaves with its session");
    assert_eq!((metrics.recover_unsubscribes.load(Relaxed), metrics.recover_disconnects.load(Relaxed)), (1, 1));
}

fn rmp_serde_decode(b: &[u8]) -> serde_json::Value {
    rmp_serde::from_slice(b).unwrap()
}
