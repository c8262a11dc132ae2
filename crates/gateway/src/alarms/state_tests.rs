use super::*;

fn alarm(toml: &str) -> Alarm {
    let mut d: AlarmDef = toml::from_str(&format!("id = \"a\"\nchannel = \"pt:x\"\n{toml}")).unwrap();
    d.validate().unwrap();
    d.id = "a".into();
    Alarm::new(Arc::new(d), "pt:x", None, 0)
}

fn kind(t: Option<Transition>) -> Option<&'static str> {
    t.map(|t| t.kind.as_str())
}

#[test]
fn alarm_raised_acked_returned_and_cleared_by_isa_states() {
    let mut a = alarm("hi = 80\nhihi = 95\ndeadband = 2");
    assert_eq!(kind(a.on_value(Some(50.0), false, 1)), None);
    assert_eq!(kind(a.on_value(Some(81.0), false, 2)), Some("raised"));
    assert_eq!(
        (a.status.state, a.status.severity, a.status.value),
        (State::ActiveUnacked, Some(Severity::Hi), Some(81.0))
    );
    assert_eq!(kind(a.on_value(Some(79.0), false, 3)), None, "within the deadband");
    let t = a.act(&Act::Ack, "user:ana", Some("seen".into()), 4).unwrap();
    assert_eq!(
        (t.kind, t.status.state, t.status.acked_by.as_deref()),
        (Kind::Acked, State::ActiveAcked, Some("user:ana"))
    );
    assert!(a.act(&Act::Ack, "user:bo", None, 5).unwrap_err().contains("already acknowledged by user:ana"));
    assert_eq!(kind(a.on_value(Some(96.0), false, 6)), Some("worsened"));
    assert_eq!(
        (a.status.state, a.status.acked_by.clone()),
        (State::ActiveUnacked, None),
        "worse is unacknowledged again"
    );
    a.act(&Act::Ack, "user:ana", None, 7).unwrap();
    assert_eq!(kind(a.on_value(Some(90.0), false, 8)), Some("improved"));
    assert_eq!(a.status.state, State::ActiveAcked, "better keeps its acknowledgement");
    assert_eq!(kind(a.on_value(Some(77.0), false, 9)), Some("cleared"));
    assert_eq!(a.status.state, State::Normal);
    assert_eq!(kind(a.on_value(Some(85.0), false, 10)), Some("raised"));
    assert_eq!(kind(a.on_value(Some(10.0), false, 11)), Some("returned"));
    assert_eq!(a.status.state, State::RtnUnacked);
    assert_eq!(kind(a.act(&Act::Ack, "user:bo", None, 12).ok()), Some("acked"));
    assert_eq!(a.status.state, State::Normal);
    assert!(a.act(&Act::Ack, "user:bo", None, 13).unwrap_err().contains("nothing to acknowledge"));
    assert_eq!(a.status.seq, 9, "one per transition");
}

#[test]
fn alarm_low_limits_bad_quality_and_values_without_the_field() {
    let mut a = alarm("lo = 10\nlolo = 5\ndeadband = 1");
    assert_eq!(kind(a.on_value(Some(4.0), false, 1)), Some("raised"));
    assert_eq!(a.status.severity, Some(Severity::Lolo));
    assert_eq!(kind(a.on_value(Some(5.5), false, 2)), None, "lolo holds within its deadband");
    assert_eq!(kind(a.on_value(Some(6.5), false, 3)), Some("improved"));
    assert_eq!(kind(a.on_value(None, false, 4)), None, "no number: nothing changes");
    assert_eq!(kind(a.on_value(None, true, 5)), Some("worsened"));
    assert_eq!(a.status.severity, Some(Severity::Bad));
    assert_eq!(kind(a.on_value(None, false, 6)), Some("returned"), "good again without a number");
}

#[test]
fn alarm_delays_wait_for_the_condition_to_hold() {
    let mut a = alarm("hi = 80\non_delay_s = 2\noff_delay_s = 1");
    assert_eq!(kind(a.on_value(Some(90.0), false, 1000)), None);
    assert_eq!(kind(a.tick(2500)), None);
    assert_eq!(kind(a.on_value(Some(70.0), false, 2600)), None, "gone before its delay: never raised");
    assert_eq!(kind(a.tick(5000)), None);
    assert_eq!(kind(a.on_value(Some(90.0), false, 6000)), None);
    assert_eq!(kind(a.on_value(Some(91.0), false, 7000)), None, "the delay runs from the first value");
    assert_eq!(kind(a.tick(8000)), Some("raised"));
    assert_eq!(a.status.value, Some(91.0), "the newest value while it waited");
    assert_eq!(kind(a.on_value(Some(50.0), false, 8100)), None);
    assert_eq!(kind(a.tick(9100)), Some("returned"));
}

#[test]
fn alarm_stale_shelved_and_out_of_service() {
    let mut a = alarm("hi = 80\nstale_s = 10");
    a.on_value(Some(1.0), false, 1000);
    assert_eq!(kind(a.tick(10_999)), None);
    assert_eq!(kind(a.tick(11_000)), Some("raised"));
    assert_eq!(a.status.severity, Some(Severity::Stale));
    assert_eq!(kind(a.on_value(Some(2.0), false, 12_000)), Some("returned"));
    let t = a.act(&Act::Shelve { until_ms: 20_000 }, "user:ana", Some("maintenance".into()), 13_000).unwrap();
    assert_eq!((t.kind, t.status.shelved_until), (Kind::Shelved, Some(20_000)));
    assert_eq!(kind(a.on_value(Some(99.0), false, 14_000)), None, "shelved: silent");
    assert!(a.status.active);
    assert_eq!(kind(a.tick(20_000)), Some("unshelved"));
    assert_eq!(a.status.state, State::ActiveUnacked, "the shelf ends into what the condition says");
    assert!(a.act(&Act::Unshelve, "user:ana", None, 21_000).unwrap_err().contains("not shelved"));
    let mut off = (*a.def).clone();
    off.enabled = false;
    assert_eq!(kind(a.redefine(Arc::new(off.clone()), 22_000)), Some("out_of_service"));
    assert!(a.act(&Act::Shelve { until_ms: 1 }, "user:ana", None, 23_000).is_err());
    assert_eq!(kind(a.on_value(Some(1.0), false, 24_000)), None);
    assert_eq!(kind(a.redefine(Arc::new(off), 25_000)), None, "no change, no transition");
    let on = (*a.def).clone();
    let on = AlarmDef { enabled: true, ..on };
    assert_eq!(kind(a.redefine(Arc::new(on), 26_000)), Some("in_service"));
    assert_eq!(a.status.state, State::Normal);
}
