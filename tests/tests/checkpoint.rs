//! FR-RT-009: HO2 checkpoints. `context` finds the latest checkpoint before
//! the target time, replays only the HO1 entries since, merges — and equals
//! a replay from the start; a checkpoint that does not match the ledger it
//! claims to cover is refused as an integrity error (exit 3).

use serde_json::Value;
use turnstile_tests::{Fixture, read_entries, require_root};

const MANIFEST: &str = r#"{
  "capabilities": {
    "write": ["output/<session_id>/**"],
    "execute": ["/bin/sh"]
  }
}"#;

fn turn(fx: &Fixture, sid: &str, n: u32) {
    let script = format!(
        "echo {n} > output/$TURNSTILE_SESSION_ID/out.txt; echo {n} > output/$TURNSTILE_SESSION_ID/t{n}.txt"
    );
    let r = fx.run(
        "c",
        &[
            "--session",
            sid,
            "--output",
            "output/<session_id>/out.txt:o",
            "--output",
            &format!("output/<session_id>/t{n}.txt:t"),
            "--",
            "/bin/sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
}

fn context(fx: &Fixture, sid: &str, as_of: Option<&str>) -> (i32, Value) {
    let mut args = vec!["--session", sid, "--json"];
    if let Some(t) = as_of {
        args.extend(["--as-of", t]);
    }
    let r = fx.supervise(&["context"], &args);
    (
        r.status,
        serde_json::from_str(r.stdout.trim()).unwrap_or(Value::Null),
    )
}

#[test]
fn fr_rt_009_checkpoint_plus_recent_entries_equals_a_full_replay() {
    if !require_root("fr_rt_009_checkpoint_plus_recent_entries_equals_a_full_replay") {
        return;
    }
    let fx = Fixture::new();
    fx.install("c", MANIFEST);
    let sid = fx.new_session();
    turn(&fx, &sid, 1);
    turn(&fx, &sid, 2);
    let cp = fx.supervise(&["checkpoint"], &["--session", &sid, "--json"]);
    assert_eq!(cp.status, 0, "{}", cp.stderr);
    let cp_path = cp.json()["path"].as_str().unwrap().to_owned();
    assert!(cp_path.contains(&format!("planes/ho2/sessions/{sid}/checkpoints/")));
    turn(&fx, &sid, 3);

    let (s, with) = context(&fx, &sid, None);
    assert_eq!(s, 0);
    assert_eq!(with["checkpoint"], cp_path.as_str());
    // Only the entries after the checkpoint were replayed: turn 3's.
    assert_eq!(with["entries_replayed"], 1, "{with}");
    let c = &with["context"];
    assert_eq!(c["turns"].as_array().unwrap().len(), 3);
    let out = format!("output/{sid}/out.txt");
    let ev = read_entries(&fx.ledger(&sid, "evidence"));
    let last_commit = ev.last().unwrap()["committed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == out.as_str())
        .unwrap()["sha256"]
        .clone();
    assert_eq!(
        c["outputs"][&out]["sha256"], last_commit,
        "last writer wins"
    );
    assert_eq!(c["outputs"][&out]["turn_number"], 3);

    // Equal to a replay from the start (no checkpoint).
    let cp_dir = std::path::Path::new(&cp_path).parent().unwrap().to_owned();
    let saved = std::fs::read(&cp_path).unwrap();
    std::fs::remove_file(&cp_path).unwrap();
    let (_, full) = context(&fx, &sid, None);
    assert_eq!(full["checkpoint"], Value::Null);
    assert_eq!(full["context"], with["context"]);
    std::fs::write(&cp_path, &saved).unwrap();

    // As of a time before turn 2 finished: the checkpoint (after it) is not
    // used, and only turn 1 is in the context.
    let t1 = ev
        .iter()
        .find(|e| e["event"] == "turn.finished" && e["turn_number"] == 1)
        .unwrap()["ts"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, early) = context(&fx, &sid, Some(&t1));
    assert_eq!(early["checkpoint"], Value::Null);
    assert_eq!(early["context"]["turns"].as_array().unwrap().len(), 1);

    // A checkpoint whose content was edited is refused.
    let text = String::from_utf8(saved.clone()).unwrap();
    std::fs::write(
        &cp_path,
        text.replacen("\"turn_number\":1", "\"turn_number\":9", 1),
    )
    .unwrap();
    let (s, _) = context(&fx, &sid, None);
    assert_eq!(s, 3, "an edited checkpoint must be an integrity error");
    // A consistent checkpoint that claims another entry hash is refused.
    let mut forged: Value = serde_json::from_slice(&saved).unwrap();
    forged["covers"]["entry_hash"] = Value::String("0".repeat(64));
    forged.as_object_mut().unwrap().remove("checkpoint_hash");
    let h = turnstile_policy::canonical::hash_value(&forged).unwrap();
    forged["checkpoint_hash"] = Value::String(h);
    std::fs::write(&cp_path, forged.to_string()).unwrap();
    let (s, _) = context(&fx, &sid, None);
    assert_eq!(
        s, 3,
        "a checkpoint of another ledger must be an integrity error"
    );
    assert!(cp_dir.is_dir());
}
