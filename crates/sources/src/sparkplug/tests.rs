//! Unit tests of Sparkplug B decoding, state, bounds and commands.

use super::proto::{Metric, Payload, Value as mv};
use super::*;
use crate::WriteError;
use prost::Message;

fn metric(name: Option<&str>, alias: Option<u64>, datatype: u32, value: Option<proto::Value>) -> Metric {
    Metric { name: name.map(str::to_string), alias, datatype: Some(datatype), value, ..Default::default() }
}

fn encode(ts: u64, metrics: Vec<Metric>) -> Vec<u8> {
    encode_seq(ts, 0, metrics)
}

fn encode_seq(ts: u64, seq: u64, metrics: Vec<Metric>) -> Vec<u8> {
    Payload { timestamp: Some(ts), metrics, seq: Some(seq), ..Default::default() }.encode_to_vec()
}

fn run(sp: &mut Sparkplug, topic: &str, payload: &[u8]) -> Decoded {
    run_at(sp, topic, payload, 999)
}

fn run_at(sp: &mut Sparkplug, topic: &str, payload: &[u8], now_ms: u64) -> Decoded {
    let t = parse_topic(topic).expect("sparkplug topic").expect("valid topic");
    sp.handle(&t, payload, now_ms).expect("decodes")
}

/// The edge node a decoded rebirth request goes to, if any.
fn rebirth_of(d: &Decoded) -> Option<&str> {
    d.rebirth.as_ref().map(|c| c.topic.as_str())
}

#[test]
fn sparkplug_topics_are_parsed_and_others_left_alone() {
    assert_eq!(parse_topic("plant/line1"), None);
    let t = parse_topic("spBv1.0/G1/DDATA/E1/D1").unwrap().unwrap();
    assert_eq!((t.group, t.kind, t.edge, t.device), ("G1", Kind::DData, "E1", Some("D1")));
    let t = parse_topic("spBv1.0/G1/NBIRTH/E1").unwrap().unwrap();
    assert_eq!((t.kind, t.device), (Kind::NBirth, None));
    assert_eq!(parse_topic("spBv1.0/G1/NCMD/E1").unwrap().unwrap().kind, Kind::Other);
    assert_eq!(parse_topic("spBv1.0/STATE/host").unwrap().unwrap().kind, Kind::Other);
    assert!(parse_topic("spBv1.0/G1/NDATA/E1/extra").unwrap().is_err());
    assert!(parse_topic("spBv1.0/G1/DDATA/E1").unwrap().is_err());
    assert!(parse_topic("spBv1.0/G1/BOGUS/E1").unwrap().is_err());
}

#[test]
fn sparkplug_birth_names_aliases_that_data_resolves() {
    let mut sp = Sparkplug::default();
    let birth = encode(
        1000,
        vec![
            metric(Some("Inputs/Temp 1"), Some(1), datatype::DOUBLE, Some(mv::DoubleValue(20.5))),
            metric(Some("Run"), Some(2), datatype::BOOLEAN, Some(mv::BooleanValue(true))),
            metric(Some("Offset"), Some(3), datatype::INT16, Some(mv::IntValue(0xffff_fffe))),
        ],
    );
    let d = run(&mut sp, "spBv1.0/G1/NBIRTH/E1", &birth);
    let got: Vec<(&str, serde_json::Value, bool)> =
        d.points.iter().map(|p| (p.path.as_str(), p.v.clone(), p.good)).collect();
    assert_eq!(
        got,
        vec![
            ("G1/E1/Inputs/Temp_1", 20.5.into(), true),
            ("G1/E1/Run", true.into(), true),
            ("G1/E1/Offset", (-2).into(), true),
        ]
    );
    assert_eq!(d.points[0].t, 1000, "the payload's timestamp");
    let mut by_alias = metric(None, Some(1), 0, Some(mv::DoubleValue(21.0)));
    by_alias.datatype = None;
    by_alias.timestamp = Some(2000);
    let d = run(&mut sp, "spBv1.0/G1/NDATA/E1", &encode(1500, vec![by_alias]));
    let want = Point {
        path: "G1/E1/Inputs/Temp_1".into(),
        device: false,
        v: 21.0.into(),
        t: 2000,
        good: true,
        historical: false,
    };
    assert_eq!(d.points, vec![want]);
    // An alias no birth declared is skipped and counted, never a crash.
    let d = run(&mut sp, "spBv1.0/G1/NDATA/E1", &encode(1500, vec![metric(None, Some(77), 0, None)]));
    assert_eq!((d.points.len(), d.skipped), (0, 1));
}

#[test]
fn sparkplug_null_and_death_mark_every_metric_bad() {
    let mut sp = Sparkplug::default();
    run(
        &mut sp,
        "spBv1.0/G/NBIRTH/E",
        &encode(1, vec![metric(Some("a"), Some(1), datatype::INT64, Some(mv::LongValue(u64::MAX)))]),
    );
    let d = run(
        &mut sp,
        "spBv1.0/G/DBIRTH/E/D",
        &encode(1, vec![metric(Some("s"), Some(2), datatype::STRING, Some(mv::StringValue("on".into())))]),
    );
    assert_eq!(d.points[0].path, "G/E/D/s");
    let mut null = metric(None, Some(2), 0, None);
    null.is_null = Some(true);
    let d = run(&mut sp, "spBv1.0/G/DDATA/E/D", &encode(5, vec![null]));
    assert_eq!(
        d.points,
        vec![Point { path: "G/E/D/s".into(), device: true, v: "on".into(), t: 5, good: false, historical: false }]
    );
    let d = run(&mut sp, "spBv1.0/G/DDEATH/E/D", &encode(6, vec![]));
    assert_eq!(d.points.iter().map(|p| (p.path.as_str(), p.good)).collect::<Vec<_>>(), vec![("G/E/D/s", false)]);
    let d = run(&mut sp, "spBv1.0/G/NDEATH/E", &[]);
    let got: Vec<(&str, serde_json::Value, bool)> =
        d.points.iter().map(|p| (p.path.as_str(), p.v.clone(), p.good)).collect();
    assert_eq!(got, vec![("G/E/a", (-1).into(), false), ("G/E/D/s", "on".into(), false)]);
}

#[test]
fn sparkplug_garbage_is_an_error_and_unsupported_values_are_skipped() {
    let mut sp = Sparkplug::default();
    let t = parse_topic("spBv1.0/G/NDATA/E").unwrap().unwrap();
    assert!(matches!(sp.handle(&t, &[0xff, 0xff, 0xff], 1), Err(DecodeError::Protobuf(_))));
    let bytes = metric(Some("blob"), None, 17, Some(mv::BytesValue(vec![1, 2])));
    let nan = metric(Some("nan"), None, 9, Some(mv::FloatValue(f32::NAN)));
    let d = run(&mut sp, "spBv1.0/G/NDATA/E", &encode(1, vec![bytes, nan]));
    assert_eq!((d.points.len(), d.skipped), (0, 2));
    assert_eq!(map_name("Motor 1/Speed (rpm)"), "Motor_1/Speed__rpm_");
}

#[test]
fn sparkplug_seq_gaps_are_found_across_message_kinds_and_wrap_at_255() {
    let mut sp = Sparkplug::default();
    let m = || vec![metric(Some("a"), Some(1), datatype::INT32, Some(mv::IntValue(1)))];
    let step = |sp: &mut Sparkplug, topic: &str, seq: u64, now: u64| run_at(sp, topic, &encode_seq(1, seq, m()), now);
    let d = step(&mut sp, "spBv1.0/G/NBIRTH/E", 254, 1000);
    assert_eq!((d.gap, rebirth_of(&d)), (None, None), "a birth sets the count");
    assert_eq!(step(&mut sp, "spBv1.0/G/NDATA/E", 255, 1000).gap, None);
    assert_eq!(step(&mut sp, "spBv1.0/G/DBIRTH/E/D", 0, 1000).gap, None, "255 wraps to 0");
    assert_eq!(step(&mut sp, "spBv1.0/G/DDATA/E/D", 1, 1000).gap, None);
    let d = step(&mut sp, "spBv1.0/G/DDATA/E/D", 3, 1000);
    assert_eq!(d.gap, Some((2, 3)), "seq 2 was lost");
    assert_eq!(rebirth_of(&d), Some("spBv1.0/G/NCMD/E"));
    assert_eq!(d.points.len(), 1, "the message itself still counts");
    let d = step(&mut sp, "spBv1.0/G/NDATA/E", 3, 1001);
    assert_eq!((d.gap, rebirth_of(&d)), (Some((4, 3)), None), "a repeat is a gap too; one rebirth request");
    let d = run_at(&mut sp, "spBv1.0/G/DDEATH/E/D", &encode_seq(1, 9, vec![]), 1000 + command::REBIRTH_INTERVAL_MS);
    assert_eq!((d.gap, rebirth_of(&d)), (Some((4, 9)), Some("spBv1.0/G/NCMD/E")), "a DDEATH counts");
    // Another edge node counts on its own; a new NBIRTH starts the count again.
    assert_eq!(step(&mut sp, "spBv1.0/G/NBIRTH/E2", 0, 1000).gap, None);
    assert_eq!(step(&mut sp, "spBv1.0/G/NBIRTH/E", 77, 20_000).gap, None);
    assert_eq!(step(&mut sp, "spBv1.0/G/NDATA/E", 78, 20_000).gap, None);
    assert_eq!(step(&mut sp, "spBv1.0/G/NDATA/E2", 1, 20_000).gap, None);
    // After a death the next birth sets the count, whatever seq the death left.
    run(&mut sp, "spBv1.0/G/NDEATH/E", &[]);
    assert_eq!(step(&mut sp, "spBv1.0/G/NBIRTH/E", 0, 30_000).gap, None);
}

#[test]
fn sparkplug_data_without_a_birth_asks_for_one_rebirth_per_interval() {
    let mut sp = Sparkplug::default();
    let data = || encode(1, vec![metric(Some("a"), None, datatype::DOUBLE, Some(mv::DoubleValue(1.5)))]);
    let d = run_at(&mut sp, "spBv1.0/G/NDATA/E", &data(), 1000);
    assert_eq!(d.points.len(), 1, "named metrics are published meanwhile");
    let cmd = d.rebirth.expect("a rebirth request");
    assert_eq!(cmd.topic, "spBv1.0/G/NCMD/E");
    let p = Payload::decode(cmd.payload.as_slice()).expect("decodes");
    assert_eq!(p.metrics[0].name.as_deref(), Some("Node Control/Rebirth"));
    assert_eq!(p.metrics[0].value, Some(mv::BooleanValue(true)));
    for now in [1001, 2000, 5999] {
        assert_eq!(rebirth_of(&run_at(&mut sp, "spBv1.0/G/DDATA/E/D", &data(), now)), None, "at {now}");
    }
    assert_eq!(rebirth_of(&run_at(&mut sp, "spBv1.0/G/NDATA/E", &data(), 6000)), Some("spBv1.0/G/NCMD/E"));
    // Born: no more requests, until an alias no birth declared shows up.
    run_at(&mut sp, "spBv1.0/G/NBIRTH/E", &encode_seq(1, 0, vec![]), 7000);
    let d = run_at(&mut sp, "spBv1.0/G/NDATA/E", &encode_seq(1, 1, vec![]), 20_000);
    assert_eq!((d.gap, rebirth_of(&d)), (None, None));
    let d = run_at(&mut sp, "spBv1.0/G/NDATA/E", &encode_seq(1, 2, vec![metric(None, Some(9), 0, None)]), 20_000);
    assert_eq!((d.skipped, rebirth_of(&d)), (1, Some("spBv1.0/G/NCMD/E")));
    // Switched off: never.
    let mut quiet = Sparkplug::new(false, Bounds::new(100));
    assert_eq!(rebirth_of(&run_at(&mut quiet, "spBv1.0/G/NDATA/E", &data(), 1000)), None);
}

#[test]
fn sparkplug_writes_become_commands_named_and_typed_as_born() {
    let mut sp = Sparkplug::default();
    let nbirth =
        encode_seq(1, 0, vec![metric(Some("Set Point"), Some(5), datatype::DOUBLE, Some(mv::DoubleValue(1.0)))]);
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &nbirth);
    let dbirth = encode_seq(1, 1, vec![metric(Some("Outputs/Speed"), None, datatype::INT32, Some(mv::IntValue(0)))]);
    let d = run(&mut sp, "spBv1.0/G/DBIRTH/E/D", &dbirth);
    assert_eq!((d.points[0].path.as_str(), d.points[0].device), ("G/E/D/Outputs/Speed", true));
    let cmd = sp.command("G/E/Set_Point", false, &serde_json::json!(12), 77).expect("a command");
    assert_eq!(cmd.topic, "spBv1.0/G/NCMD/E");
    let m = Payload::decode(cmd.payload.as_slice()).expect("decodes").metrics.remove(0);
    assert_eq!(m.name.as_deref(), Some("Set Point"), "the birth's name, not the channel's");
    assert_eq!((m.alias, m.datatype, m.value), (Some(5), Some(datatype::DOUBLE), Some(mv::DoubleValue(12.0))));
    let cmd = sp.command("G/E/D/Outputs/Speed", true, &serde_json::json!(-3), 77).expect("a command");
    assert_eq!(cmd.topic, "spBv1.0/G/DCMD/E/D");
    let m = Payload::decode(cmd.payload.as_slice()).expect("decodes").metrics.remove(0);
    assert_eq!((m.name.as_deref(), m.alias), (Some("Outputs/Speed"), None));
    assert_eq!(m.value, Some(mv::IntValue(-3i32 as u32)));
    let e = sp.command("G/E/D/Outputs/Speed", true, &serde_json::json!("fast"), 77).unwrap_err();
    assert!(matches!(&e, WriteError::NotWritable(m) if m.contains("is not a valid Int32")), "{e}");
    // Unknown, unborn and dead: unavailable, saying which.
    let e = sp.command("G/X/m", false, &serde_json::json!(1), 77).unwrap_err();
    assert!(matches!(&e, WriteError::Unavailable(m) if m.contains("no birth")), "{e}");
    run(&mut sp, "spBv1.0/G/NDATA/F", &encode(1, vec![metric(Some("m"), None, datatype::INT8, Some(mv::IntValue(1)))]));
    let e = sp.command("G/F/m", false, &serde_json::json!(1), 77).unwrap_err();
    assert!(matches!(&e, WriteError::Unavailable(m) if m.contains("no birth")), "{e}");
    run(&mut sp, "spBv1.0/G/DDEATH/E/D", &encode_seq(1, 2, vec![]));
    let e = sp.command("G/E/D/Outputs/Speed", true, &serde_json::json!(1), 77).unwrap_err();
    assert!(matches!(&e, WriteError::Unavailable(m) if m.contains("DDEATH")), "{e}");
    assert!(sp.command("G/E/Set_Point", false, &serde_json::json!(1), 77).is_ok(), "the node lives on");
    run(&mut sp, "spBv1.0/G/NDEATH/E", &[]);
    let e = sp.command("G/E/Set_Point", false, &serde_json::json!(1), 77).unwrap_err();
    assert!(matches!(&e, WriteError::Unavailable(m) if m.contains("NDEATH")), "{e}");
}

#[test]
fn sparkplug_state_is_bounded_and_refusals_are_reported() {
    let bounds = Bounds { edge_nodes: 2, devices: 2, metrics: 4, aliases: 3 };
    let mut sp = Sparkplug::new(true, bounds);
    let named = |names: &[(&str, u64)]| {
        names.iter().map(|(n, a)| metric(Some(n), Some(*a), datatype::INT32, Some(mv::IntValue(1)))).collect()
    };
    // Metrics: four kept, the fifth refused; the node's aliases stop at three.
    let d = run(
        &mut sp,
        "spBv1.0/G/NBIRTH/E1",
        &encode_seq(1, 0, named(&[("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)])),
    );
    assert_eq!(d.points.iter().map(|p| p.path.as_str()).collect::<Vec<_>>(), ["G/E1/a", "G/E1/b", "G/E1/c", "G/E1/d"]);
    assert_eq!((d.bounded, d.bound), (2, Some(("metrics", 4))), "metric e, and alias 4 of metric d");
    // Data naming the refused alias is refused too, and asks for no rebirth (a new birth would
    // meet the same bound).
    let by_alias = |alias| metric(None, Some(alias), 0, Some(mv::IntValue(2)));
    let d = run(&mut sp, "spBv1.0/G/NDATA/E1", &encode_seq(1, 1, vec![by_alias(1), by_alias(4)]));
    assert_eq!((d.points.len(), d.bounded, d.bound, d.rebirth), (1, 1, Some(("aliases", 3)), None));
    // Devices: a third is refused whole; a device of a full source's second edge node too.
    let d = run(&mut sp, "spBv1.0/G/DDATA/E1/D1", &encode_seq(1, 2, vec![]));
    assert_eq!(d.bounded, 0);
    assert_eq!(run(&mut sp, "spBv1.0/G/DDATA/E2/D2", &encode_seq(1, 0, vec![])).bounded, 0);
    let d = run(&mut sp, "spBv1.0/G/DDATA/E2/D3", &encode_seq(1, 1, vec![]));
    assert_eq!((d.bounded, d.bound), (1, Some(("devices", 2))));
    // Edge nodes: a third is refused whole, and not asked for a rebirth.
    let d = run(&mut sp, "spBv1.0/G/NDATA/E3", &encode_seq(1, 0, named(&[("x", 9)])));
    assert_eq!((d.points.len(), d.bounded, d.bound, d.rebirth), (0, 1, Some(("edge nodes", 2)), None));
    // A new birth gives back what the edge node held: its new metrics fit again.
    let d = run(&mut sp, "spBv1.0/G/NBIRTH/E1", &encode_seq(1, 0, named(&[("p", 1), ("q", 2)])));
    assert_eq!((d.points.len(), d.bounded), (2, 0));
    let unaliased = |name| metric(Some(name), None, datatype::INT32, Some(mv::IntValue(1)));
    let mut dbirth = named(&[("r", 7)]);
    dbirth.push(unaliased("s"));
    let d = run(&mut sp, "spBv1.0/G/DBIRTH/E2/D2", &encode_seq(1, 2, dbirth));
    assert_eq!((d.points.len(), d.bounded), (2, 0), "{d:?}");
    let mut dbirth = named(&[("r", 7)]);
    dbirth.push(unaliased("t"));
    let d = run(&mut sp, "spBv1.0/G/DBIRTH/E2/D2", &encode_seq(1, 3, dbirth));
    assert_eq!((d.points.len(), d.bounded), (2, 0), "a device's new birth gives back its metrics and aliases");
    let d = run(&mut sp, "spBv1.0/G/NDATA/E2", &encode_seq(1, 4, named(&[("u", 10)])));
    assert_eq!((d.points.len(), d.bounded, d.bound), (0, 1, Some(("metrics", 4))), "p, q, r, t held");
}

#[test]
fn sparkplug_ndeath_of_an_earlier_session_is_ignored_by_its_bdseq() {
    let mut sp = Sparkplug::default();
    let bd = |n: u64| metric(Some("bdSeq"), None, datatype::UINT64, Some(mv::LongValue(n)));
    let birth =
        |n: u64| encode_seq(1, 0, vec![bd(n), metric(Some("a"), Some(1), datatype::INT32, Some(mv::IntValue(7)))]);
    let death = |n: u64| encode(2, vec![bd(n)]);
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &birth(3));
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &birth(4));
    // The will of session 3 arrives after session 4 was born: nothing goes bad.
    let d = run(&mut sp, "spBv1.0/G/NDEATH/E", &death(3));
    assert_eq!((d.points.len(), d.stale_death), (0, Some((3, 4))));
    assert!(sp.command("G/E/a", false, &serde_json::json!(1), 9).is_ok(), "still alive: takes commands");
    // Session 4's own death does.
    let d = run(&mut sp, "spBv1.0/G/NDEATH/E", &death(4));
    assert_eq!((d.points.len(), d.points[0].good, d.stale_death), (2, false, None));
    let e = sp.command("G/E/a", false, &serde_json::json!(1), 9).unwrap_err();
    assert!(matches!(&e, WriteError::Unavailable(m) if m.contains("NDEATH")), "{e}");
    // Without a bdSeq on either side, a death ends the current session (as a bdSeq in an
    // unreadable payload would).
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &birth(5));
    let d = run(&mut sp, "spBv1.0/G/NDEATH/E", &encode(3, vec![]));
    assert_eq!((d.points.len(), d.stale_death), (2, None));
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &encode_seq(1, 0, vec![metric(Some("a"), None, datatype::INT32, None)]));
    let d = run(&mut sp, "spBv1.0/G/NDEATH/E", &death(9));
    assert_eq!((d.points.len(), d.stale_death), (1, None), "a birth without bdSeq: any death ends it");
    // bdSeq as an Int64 in long_value or in int_value (some edge nodes send it so) matches too.
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &encode_seq(1, 0, vec![metric(Some("bdSeq"), None, 4, Some(mv::IntValue(6)))]));
    let d = run(&mut sp, "spBv1.0/G/NDEATH/E", &death(6));
    assert_eq!(d.stale_death, None);
}

#[test]
fn sparkplug_ndeath_numbered_ahead_of_its_birth_ends_the_session_modulo_256() {
    let mut sp = Sparkplug::default();
    let bd = |n: u64| metric(Some("bdSeq"), None, datatype::INT64, Some(mv::LongValue(n)));
    let birth =
        |n: u64| encode_seq(1, 0, vec![bd(n), metric(Some("a"), Some(1), datatype::INT32, Some(mv::IntValue(7)))]);
    let death = |n: u64| encode(2, vec![bd(n)]);
    let alive = |sp: &Sparkplug| sp.command("G/E/a", false, &serde_json::json!(1), 9).is_ok();
    fn bad(d: &Decoded) -> Vec<(&str, bool)> {
        d.points.iter().map(|p| (p.path.as_str(), p.good)).collect()
    }
    // Every metric of the birth, bdSeq included, goes bad.
    let ended = vec![("G/E/a", false), ("G/E/bdSeq", false)];
    // The birth's bdSeq plus one (a clean disconnect numbered for the next connection): the
    // session ends as for its own death, and the numbering is reported.
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &birth(5));
    let d = run(&mut sp, "spBv1.0/G/NDEATH/E", &death(6));
    assert_eq!((bad(&d), d.death_ahead, d.stale_death), (ended.clone(), Some((6, 5)), None));
    let e = sp.command("G/E/a", false, &serde_json::json!(1), 9).unwrap_err();
    assert!(matches!(&e, WriteError::Unavailable(m) if m.contains("NDEATH")), "{e}");
    // 255 wraps to 0: a death of 0 is one ahead of a birth of 255.
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &birth(255));
    assert!(alive(&sp));
    let d = run(&mut sp, "spBv1.0/G/NDEATH/E", &death(0));
    assert_eq!((bad(&d), d.death_ahead), (ended.clone(), Some((0, 255))));
    assert!(!alive(&sp));
    // ... and a death of 255 is one behind a birth of 0: an earlier session's will, ignored.
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &birth(0));
    let d = run(&mut sp, "spBv1.0/G/NDEATH/E", &death(255));
    assert_eq!((d.points.len(), d.stale_death, d.death_ahead), (0, Some((255, 0)), None));
    assert!(alive(&sp));
    // The same number ends the session and is not reported.
    let d = run(&mut sp, "spBv1.0/G/NDEATH/E", &death(0));
    assert_eq!((bad(&d), d.stale_death, d.death_ahead), (ended, None, None));
    // Up to 127 ahead ends the session; 128 ahead is 128 behind, an earlier session's.
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &birth(200));
    assert_eq!(run(&mut sp, "spBv1.0/G/NDEATH/E", &death(72)).stale_death, Some((72, 200)));
    assert!(alive(&sp));
    assert_eq!(run(&mut sp, "spBv1.0/G/NDEATH/E", &death(71)).death_ahead, Some((71, 200)));
    assert!(!alive(&sp));
    // A bdSeq above 255 counts modulo 256 (256 is 0).
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &birth(256));
    assert_eq!(run(&mut sp, "spBv1.0/G/NDEATH/E", &death(255)).stale_death, Some((255, 256)));
    assert_eq!(run(&mut sp, "spBv1.0/G/NDEATH/E", &death(1)).death_ahead, Some((1, 256)));
    assert_eq!(
        [(0, 0), (1, 0), (127, 0), (128, 0), (255, 0), (0, 255), (3, 258)].map(|(d, b)| death_session(d, b)),
        [
            DeathSession::Current,
            DeathSession::Ahead,
            DeathSession::Ahead,
            DeathSession::Earlier,
            DeathSession::Earlier,
            DeathSession::Ahead,
            DeathSession::Ahead,
        ]
    );
}

#[test]
fn sparkplug_values_are_read_by_datatype_width_and_floats_are_shortest() {
    let mut sp = Sparkplug::default();
    let m = |name: &str, dt: u32, v: mv| metric(Some(name), None, dt, Some(v));
    let d = run(
        &mut sp,
        "spBv1.0/G/NBIRTH/E",
        &encode(
            1,
            vec![
                m("i8", datatype::INT8, mv::IntValue(0xfb)),
                m("i8x", datatype::INT8, mv::IntValue(0xffff_fffb)),
                m("i16", datatype::INT16, mv::IntValue(0x8000)),
                m("u32", datatype::UINT32, mv::LongValue(3_000_000_000)),
                m("f", datatype::FLOAT, mv::FloatValue(21.7)),
                m("bad", datatype::UINT8, mv::IntValue(300)),
            ],
        ),
    );
    let got: Vec<String> = d.points.iter().map(|p| format!("{}={}", p.path, p.v)).collect();
    assert_eq!(got, ["G/E/i8=-5", "G/E/i8x=-5", "G/E/i16=-32768", "G/E/u32=3000000000", "G/E/f=21.7"]);
    assert_eq!(d.skipped, 1, "a UInt8 of 300 is no UInt8");
}

#[test]
fn sparkplug_commands_need_the_edge_nodes_birth_too() {
    // A device born while its edge node's NBIRTH was not seen: no commands until it is.
    let mut sp = Sparkplug::new(true, Bounds::new(100));
    let dbirth = |seq| encode_seq(1, seq, vec![metric(Some("m"), None, datatype::INT8, Some(mv::IntValue(1)))]);
    let d = run(&mut sp, "spBv1.0/G/DBIRTH/E/D", &dbirth(5));
    assert_eq!(rebirth_of(&d), Some("spBv1.0/G/NCMD/E"));
    let e = sp.command("G/E/D/m", true, &serde_json::json!(-5), 9).unwrap_err();
    assert!(matches!(&e, WriteError::Unavailable(m) if m.contains("no birth")), "{e}");
    run(&mut sp, "spBv1.0/G/NBIRTH/E", &encode_seq(1, 0, vec![]));
    run(&mut sp, "spBv1.0/G/DBIRTH/E/D", &dbirth(1));
    let cmd = sp.command("G/E/D/m", true, &serde_json::json!(-5), 9).expect("born: a command");
    let m = Payload::decode(cmd.payload.as_slice()).expect("decodes").metrics.remove(0);
    assert_eq!((m.datatype, m.value), (Some(datatype::INT8), Some(mv::IntValue(0xfb))), "Int8 -5 in 8 bits");
}

#[test]
fn sparkplug_historical_metrics_are_marked_and_leave_the_last_value() {
    let mut sp = Sparkplug::default();
    let temp = |v: f64| metric(None, Some(1), 0, Some(mv::DoubleValue(v)));
    run(
        &mut sp,
        "spBv1.0/G/NBIRTH/E",
        &encode(1000, vec![metric(Some("T"), Some(1), datatype::DOUBLE, Some(mv::DoubleValue(20.0)))]),
    );
    let d = run(&mut sp, "spBv1.0/G/NDATA/E", &encode_seq(5000, 1, vec![temp(21.0)]));
    assert!(!d.points[0].historical);
    let backlog: Vec<Metric> = (0..3)
        .map(|i| Metric { timestamp: Some(2000 + i * 100), is_historical: Some(true), ..temp(10.0 + i as f64) })
        .collect();
    let d = run(&mut sp, "spBv1.0/G/NDATA/E", &encode_seq(5100, 2, backlog));
    let got: Vec<(u64, bool)> = d.points.iter().map(|p| (p.t, p.historical)).collect();
    assert_eq!(got, vec![(2000, true), (2100, true), (2200, true)], "each at its own time");
    // A null (and a death) carries the newest live value, not the backlog's.
    let mut null = metric(None, Some(1), 0, None);
    null.is_null = Some(true);
    let d = run(&mut sp, "spBv1.0/G/NDATA/E", &encode_seq(5200, 3, vec![null]));
    assert_eq!((d.points[0].v.clone(), d.points[0].historical), (21.0.into(), false));
}
