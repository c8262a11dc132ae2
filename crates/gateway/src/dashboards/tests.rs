//! Unit tests of the dashboard store and its validation.

use super::body::validate;
use super::*;
use switchboard_protocol::code;

fn body(json: &str) -> Result<DashboardBody, ApiError> {
    parse_body("d1", json.as_bytes())
}

#[test]
fn dashboards_accept_every_widget_type_and_keep_options() {
    let b = body(
        r#"{"title":"t","widgets":[
            {"type":"value","channel":"pt:a","x":0,"y":0,"w":2,"h":1,"options":{"units":"C"}},
            {"type":"led","channel":"b","x":1,"y":0,"w":1,"h":1},
            {"type":"gauge","channel":"","x":1,"y":0,"w":1,"h":1},
            {"type":"trend","channel":"c","x":1,"y":0,"w":1,"h":1},
            {"type":"spectrum","channel":"c","x":1,"y":0,"w":1,"h":1},
            {"type":"scatter","channel":"c","x":1,"y":0,"w":1,"h":1},
            {"type":"alarm-journal","x":1,"y":0,"w":1,"h":1,"options":{"alarm":"hot"}}]}"#,
    )
    .unwrap();
    assert_eq!(b.widgets.len(), 7);
    assert_eq!(b.widgets[0].options["units"], "C");
    assert_eq!(b.widgets[5].kind, WidgetKind::Scatter);
    assert_eq!(b.widgets[6].kind, WidgetKind::AlarmJournal);
    // The wire name is kept as written.
    let json = serde_json::to_value(&b.widgets[6]).unwrap();
    assert_eq!(json["type"], "alarm-journal");
}

#[test]
fn dashboards_reject_bad_input_naming_the_field() {
    let cases = [
        (r#"{"title":"t","widgets":[{"type":"pie","channel":"a","x":0,"y":0,"w":1,"h":1}]}"#, "widgets[0].type"),
        (r#"{"title":"t","widgets":[{"type":"led","channel":"a b","x":0,"y":0,"w":1,"h":1}]}"#, "widgets[0].channel"),
        (r#"{"title":"t","widgets":[{"type":"led","channel":"a","x":0,"y":0,"w":0,"h":1}]}"#, "widgets[0]"),
        (r#"{"title":"t","widgets":[{"type":"led","channel":"a","x":-1,"y":0,"w":1,"h":1}]}"#, "widgets[0].x"),
        (r#"{"title":"t","widgets":[{"type":"led","channel":"a","x":0,"y":0,"w":1,"h":1,"options":[]}]}"#, "options"),
        (r#"{"title":"t","widgets":[{"type":"led","channel":"a","x":0,"y":0,"w":1,"h":1,"colour":1}]}"#, "colour"),
        (r#"{"widgets":[]}"#, "title"),
        (r#"{"title":"t","widgets":[],"id":"other"}"#, "id"),
        (r#"not json"#, "expected"),
    ];
    for (json, needle) in cases {
        let e = body(json).unwrap_err();
        assert_eq!(e.code, 400, "{json}");
        assert!(e.message.contains(needle), "{json}: {}", e.message);
    }
    let big = format!(
        r#"{{"title":"t","widgets":[{{"type":"led","channel":"a","x":0,"y":0,"w":1,"h":1,"options":{{"s":"{}"}}}}]}}"#,
        "x".repeat(5000)
    );
    assert!(body(&big).unwrap_err().message.contains("options"));
}

#[test]
fn dashboards_ids_are_limited_to_a_safe_charset() {
    for ok in ["a", "demo", "Plant_1-b", &"x".repeat(64)] {
        assert!(validate_id(ok).is_ok(), "{ok}");
    }
    for bad in ["", "..", "a.json", "a/b", "a b", "ü", &"x".repeat(65)] {
        assert_eq!(validate_id(bad).unwrap_err().code, 400, "{bad}");
    }
}

#[test]
fn dashboards_demo_is_valid() {
    let d = demo_dashboard();
    validate(DEMO_ID, &d).unwrap();
    for kind in [WidgetKind::Value, WidgetKind::Led, WidgetKind::Gauge, WidgetKind::Trend, WidgetKind::Spectrum] {
        assert!(d.widgets.iter().any(|w| w.kind == kind), "{kind:?}");
    }
}

#[tokio::test]
async fn dashboards_store_round_trips_lists_and_deletes_across_instances() {
    let dir = std::env::temp_dir().join(format!("sb-dash-{}-{}", std::process::id(), fastrand::u32(..)));
    let store = DashboardStore::new(dir.clone());
    assert!(store.list().await.unwrap().is_empty());
    assert_eq!(store.get("a").await.unwrap_err().code, 404);
    let b = body(r#"{"title":"First","widgets":[{"type":"gauge","channel":"pt:x","x":3,"y":4,"w":5,"h":6}]}"#).unwrap();
    let (s, created) = store.put("a", b.clone(), Editor::ANYONE).await.unwrap();
    assert!(created && s.widget_count == 1 && s.title == "First");
    let (_, created) = store.put("a", b, Editor::ANYONE).await.unwrap();
    assert!(!created);

    // A new store over the same directory (a restarted server) sees the same dashboard.
    let again = DashboardStore::new(dir.clone());
    let d: Dashboard = serde_json::from_slice(&again.get("a").await.unwrap()).unwrap();
    assert_eq!((d.id.as_str(), d.title.as_str(), d.widgets[0].x, d.widgets[0].h), ("a", "First", 3, 6));
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("a.json")], "no temporary files left behind");
    assert_eq!(again.list().await.unwrap().len(), 1);
    again.delete("a", Editor::ANYONE).await.unwrap();
    assert_eq!(again.delete("a", Editor::ANYONE).await.unwrap_err().code, 404);
    assert!(store.list().await.unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn dashboards_belong_to_their_creator_and_only_the_owner_an_editor_or_an_api_key_changes_them() {
    let dir = std::env::temp_dir().join(format!("sb-dash-o-{}-{}", std::process::id(), fastrand::u32(..)));
    let store = DashboardStore::new(dir.clone());
    let b = body(r#"{"title":"Alice's","widgets":[]}"#).unwrap();
    let alice = Editor { user: "alice", access: DashboardAccess::Own };
    let bob = Editor { user: "bob", access: DashboardAccess::Own };
    let anonymous = Editor { user: "", access: DashboardAccess::Own };
    let key = Editor { user: "api-key-0", access: DashboardAccess::Edit };
    let editor = Editor { user: "erin", access: DashboardAccess::Edit };
    let reader = Editor { user: "rita", access: DashboardAccess::Read };
    assert!(store.put("a", b.clone(), alice).await.unwrap().1, "created");
    for who in [bob, anonymous] {
        let e = store.put("a", b.clone(), who).await.unwrap_err();
        assert!(e.code == 403 && e.message.contains("belongs to \"alice\""), "{e}");
        assert_eq!(store.delete("a", who).await.unwrap_err().code, 403);
    }
    store.put("a", b.clone(), alice).await.unwrap();
    store.put("a", b.clone(), key).await.unwrap();
    store.put("a", b.clone(), editor).await.unwrap();
    let d: Dashboard = serde_json::from_slice(&store.get("a").await.unwrap()).unwrap();
    assert_eq!(d.owner, "alice", "saving keeps the owner, whoever saves");
    // A reader may neither create nor change nor delete, even a dashboard without an owner.
    store.put("open", b.clone(), anonymous).await.unwrap();
    for (id, what) in [("a", "change"), ("open", "change"), ("new", "create")] {
        let e = store.put(id, b.clone(), reader).await.unwrap_err();
        assert!(e.code == 403 && e.message.contains("may only read dashboards"), "{what} {id}: {e}");
        assert_eq!(store.delete(id, reader).await.unwrap_err().code, 403, "delete {id}");
    }
    assert_eq!(store.get("new").await.unwrap_err().code, 404, "the reader created nothing");
    // A dashboard created without credentials is anybody's (but a reader's).
    store.put("open", b.clone(), bob).await.unwrap();
    store.delete("open", anonymous).await.unwrap();
    // An editor deletes anybody's; its own creations belong to it.
    store.delete("a", editor).await.unwrap();
    store.put("e", b, editor).await.unwrap();
    let d: Dashboard = serde_json::from_slice(&store.get("e").await.unwrap()).unwrap();
    assert_eq!(d.owner, "erin");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn dashboards_listing_reads_only_changed_files_and_sees_every_change() {
    let dir = std::env::temp_dir().join(format!("sb-dash-l-{}-{}", std::process::id(), fastrand::u32(..)));
    let store = DashboardStore::new(dir.clone());
    let b = body(r#"{"title":"One","widgets":[]}"#).unwrap();
    store.put("a", b.clone(), Editor::ANYONE).await.unwrap();
    store.put("b", b, Editor::ANYONE).await.unwrap();
    assert_eq!(store.list().await.unwrap().len(), 2);
    // A cached summary is kept while its file is unchanged: a stale cache entry planted
    // for an unchanged file shows, proving the file was not read again.
    {
        let mut cache = store.summaries.lock();
        let entry = cache.get_mut("b").unwrap();
        entry.2.title = "cached".into();
    }
    let titles = |l: Vec<Summary>| l.into_iter().map(|s| s.title).collect::<Vec<_>>();
    assert_eq!(titles(store.list().await.unwrap()), vec!["One", "cached"]);
    // A file changed behind the store's back (edited by hand, or by another node sharing
    // the directory) is read again; a removed one leaves the listing and the cache.
    std::fs::write(dir.join("b.json"), r#"{"id":"b","title":"Edited by hand","widgets":[],"updated":1}"#).unwrap();
    assert_eq!(titles(store.list().await.unwrap()), vec!["One", "Edited by hand"]);
    std::fs::remove_file(dir.join("a.json")).unwrap();
    assert_eq!(titles(store.list().await.unwrap()), vec!["Edited by hand"]);
    assert_eq!(store.summaries.lock().len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dashboards_install_demo_keeps_an_edited_demo() {
    let dir = std::env::temp_dir().join(format!("sb-demo-{}-{}", std::process::id(), fastrand::u32(..)));
    assert!(install_demo(&dir).unwrap());
    let path = dir.join("dashboards/demo.json");
    std::fs::write(&path, b"{\"id\":\"demo\",\"title\":\"mine\",\"widgets\":[],\"updated\":1}").unwrap();
    assert!(!install_demo(&dir).unwrap());
    assert!(std::fs::read_to_string(&path).unwrap().contains("mine"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn dashboards_store_failure_is_500_naming_the_step_not_the_io_error() {
    // A file where the store's directory should be: reads fail however privileged the test is.
    let dir = std::env::temp_dir().join(format!("sb-dash-broken-{}-{}", std::process::id(), fastrand::u32(..)));
    std::fs::write(&dir, b"not a directory").unwrap();
    let store = DashboardStore::new(dir.clone());
    let e = store.list().await.unwrap_err();
    assert_eq!((e.code, e.message.as_str()), (code::INTERNAL, "dashboard store unavailable (listing dashboards)"));
    let e = store.get("plant").await.unwrap_err();
    assert_eq!((e.code, e.message.as_str()), (code::INTERNAL, "dashboard store unavailable (reading dashboard)"));
    let _ = std::fs::remove_file(&dir);
}
