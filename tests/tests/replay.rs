//! `supervise replay` (issue 13 item 4, seed 001 "Replay Determinism"): a
//! recorded session re-run from clean state in a fresh workspace gives the
//! same final state — byte-identical ledgers for a deterministic session —
//! and a changed input is named as the first difference (exit 3).

use serde_json::Value;
use turnstile_tests::{Fixture, require_root};

const MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["data/**"],
    "write": ["output/<session_id>/**"],
    "execute": ["/bin/sh"]
  }
}"#;

fn turns(fx: &Fixture, sid: &str) {
    let copy = "read x < data/in.txt; echo \"$x\" > output/$TURNSTILE_SESSION_ID/copy.txt; echo scratch > $TMPDIR/s.txt";
    let r = fx.run(
        "r",
        &[
            "--session",
            sid,
            "--output",
            "output/<session_id>/copy.txt:c",
            "--",
            "/bin/sh",
            "-c",
            copy,
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let r = fx.run(
        "r",
        &[
            "--session",
            sid,
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            "exit 4",
        ],
    );
    assert_eq!(r.status, 10, "{}", r.stderr);
    let r = fx.run("r", &["--session", sid, "--no-outputs", "--", "/bin/nope"]);
    assert_eq!(r.status, 11, "{}", r.stderr);
}

fn replay(fx: &Fixture, sid: &str, into: &std::path::Path) -> (i32, Value) {
    let r = fx.supervise(
        &["replay"],
        &[
            "--session",
            sid,
            "--json",
            "--into",
            &into.display().to_string(),
        ],
    );
    (
        r.status,
        serde_json::from_str(r.stdout.trim()).unwrap_or(Value::Null),
    )
}

#[test]
fn issue_13_a_deterministic_session_replays_byte_for_byte() {
    if !require_root("issue_13_a_deterministic_session_replays_byte_for_byte") {
        return;
    }
    let fx = Fixture::new();
    fx.install("r", MANIFEST);
    fx.write("data/in.txt", b"hello\n");
    let s = fx.supervise(
        &["session", "new"],
        &[
            "--deterministic",
            "--seed",
            "42",
            "--clock",
            "2026-02-02T00:00:00Z",
        ],
    );
    assert_eq!(s.status, 0, "{}", s.stderr);
    let sid = s.stdout.trim().to_owned();
    turns(&fx, &sid);
    let into = fx.state.parent().unwrap().join("replay");
    let (status, v) = replay(&fx, &sid, &into);
    assert_eq!(status, 0, "{v}");
    assert_eq!(v["identical"], true);
    assert_eq!(v["turns"], 3);
    assert_eq!(v["replayed_session_id"], sid.as_str());
    for kind in ["exec", "evidence"] {
        let rel = format!("planes/ho1/sessions/{sid}/ledger/{kind}.jsonl");
        assert_eq!(
            std::fs::read(fx.root.join(&rel)).unwrap(),
            std::fs::read(into.join("root").join(&rel)).unwrap(),
            "{kind} ledger differs"
        );
    }
    // --into must be new.
    let (status, _) = replay(&fx, &sid, &into);
    assert_eq!(status, 2);
}

#[test]
fn issue_13_replay_names_the_first_difference() {
    if !require_root("issue_13_replay_names_the_first_difference") {
        return;
    }
    let fx = Fixture::new();
    fx.install("r", MANIFEST);
    fx.write("data/in.txt", b"hello\n");
    let sid = fx.new_session();
    turns(&fx, &sid);
    let base = fx.state.parent().unwrap();
    let (status, v) = replay(&fx, &sid, &base.join("same"));
    assert_eq!(status, 0, "{v}");
    assert_eq!(v["identical"], true);
    assert_ne!(v["replayed_session_id"], sid.as_str());
    // The input changed since: turn 1 commits another hash.
    fx.write("data/in.txt", b"changed\n");
    let (status, v) = replay(&fx, &sid, &base.join("other"));
    assert_eq!(status, 3, "{v}");
    let d = v["first_difference"].as_str().unwrap();
    assert!(d.starts_with("turn 1:") && d.contains("copy.txt"), "{d}");
}
