//! Exactly-once turns (issue 13, seed 001 "Delivery Semantics"): a key
//! never runs twice — sequentially, concurrently, or after the supervisor
//! was killed mid-turn — and the same key for a different request is
//! refused without running anything.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use turnstile_tests::{Fixture, read_entries, require_root, supervise_bin};

const MANIFEST: &str = r#"{
  "capabilities": {
    "write": ["output/<session_id>/**"],
    "execute": ["/bin/sh", "/bin/sleep"]
  },
  "limits": {"timeout_seconds": 60}
}"#;

fn fixture() -> (Fixture, String) {
    let fx = Fixture::new();
    fx.install("i", MANIFEST);
    let sid = fx.new_session();
    (fx, sid)
}

fn run_args(fx: &Fixture, sid: &str, key: &str, script: &str) -> Vec<String> {
    [
        "run",
        "--root",
        &fx.root.display().to_string(),
        "--state-dir",
        &fx.state.display().to_string(),
        "--package",
        "i",
        "--session",
        sid,
        "--idempotency-key",
        key,
        "--output",
        "output/<session_id>/n.txt:count",
        "--json",
        "--",
        "/bin/sh",
        "-c",
        script,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// Appends a line to the output every run (it accumulates in the committed
/// file: each real execution adds one line).
const SCRIPT: &str = "o=output/$TURNSTILE_SESSION_ID/n.txt; x=; if [ -f $o ]; then read x < $o; fi; echo $x run > $o";

fn started(fx: &Fixture, sid: &str) -> usize {
    read_entries(&fx.ledger(sid, "exec"))
        .iter()
        .filter(|e| e["event"] == "turn.started")
        .count()
}

fn run(fx: &Fixture, sid: &str, key: &str, script: &str) -> (i32, Value, String) {
    let out = Command::new(supervise_bin())
        .args(run_args(fx, sid, key, script))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn issue_13_a_repeated_key_returns_the_recorded_result_without_running() {
    if !require_root("issue_13_a_repeated_key_returns_the_recorded_result_without_running") {
        return;
    }
    let (fx, sid) = fixture();
    let (s1, v1, e1) = run(&fx, &sid, "k", SCRIPT);
    assert_eq!(s1, 0, "{e1}");
    let (s2, v2, e2) = run(&fx, &sid, "k", SCRIPT);
    assert_eq!(s2, 0, "{e2}");
    assert_eq!(v2["replayed"], true);
    assert_eq!(v2["turn_number"], v1["turn_number"]);
    assert_eq!(v2["committed"], v1["committed"]);
    assert_eq!(started(&fx, &sid), 1);
    let out = fx.root.join("output").join(&sid).join("n.txt");
    assert_eq!(std::fs::read_to_string(out).unwrap(), "run\n");
    // A failing turn replays its failure with the same exit status.
    let (s3, _, _) = run(&fx, &sid, "f", "exit 7");
    let (s4, v4, _) = run(&fx, &sid, "f", "exit 7");
    assert_eq!((s3, s4), (10, 10));
    assert_eq!(v4["exit_code"], 7);
    assert_eq!(started(&fx, &sid), 2);
    fx.assert_ledgers_intact(&sid);
}

#[test]
fn issue_13_the_same_key_for_a_different_request_is_a_conflict() {
    if !require_root("issue_13_the_same_key_for_a_different_request_is_a_conflict") {
        return;
    }
    let (fx, sid) = fixture();
    assert_eq!(run(&fx, &sid, "k", SCRIPT).0, 0);
    let before = fx.snapshot();
    let (s, v, e) = run(&fx, &sid, "k", "echo different");
    assert_eq!(s, 2, "{e}");
    assert_eq!(v["error"]["code"], "TS1008", "{v}");
    assert_eq!(v["error"]["field"], "idempotency_key");
    assert!(
        e.contains("recorded request") && e.contains("this request"),
        "{e}"
    );
    assert_eq!(before, fx.snapshot(), "a conflict changed the workspace");
    assert_eq!(started(&fx, &sid), 1);
}

#[test]
fn issue_13_ten_concurrent_runs_with_one_key_execute_once() {
    if !require_root("issue_13_ten_concurrent_runs_with_one_key_execute_once") {
        return;
    }
    let (fx, sid) = fixture();
    let children: Vec<_> = (0..10)
        .map(|_| {
            Command::new(supervise_bin())
                .args(run_args(&fx, &sid, "k", SCRIPT))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let results: Vec<Value> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice(&out.stdout).unwrap()
        })
        .collect();
    assert_eq!(started(&fx, &sid), 1);
    assert_eq!(results.iter().filter(|v| v["replayed"] == true).count(), 9);
    assert!(results.iter().all(|v| v["turn_number"] == 1));
    let out = fx.root.join("output").join(&sid).join("n.txt");
    assert_eq!(std::fs::read_to_string(out).unwrap(), "run\n");
    fx.assert_ledgers_intact(&sid);
}

#[test]
fn issue_13_a_key_whose_supervisor_was_killed_mid_turn_is_not_run_again() {
    if !require_root("issue_13_a_key_whose_supervisor_was_killed_mid_turn_is_not_run_again") {
        return;
    }
    let (fx, sid) = fixture();
    let mut child = Command::new(supervise_bin())
        .args(run_args(&fx, &sid, "k", &format!("{SCRIPT}; sleep 30")))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the command runs (its intent entry is durable), then kill.
    for _ in 0..200 {
        if started(&fx, &sid) == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(started(&fx, &sid), 1);
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    // The retry recovers the session, finds the key, and replays the turn
    // as recovery closed it — without running it again.
    let (s, v, e) = run(&fx, &sid, "k", &format!("{SCRIPT}; sleep 30"));
    assert_eq!(v["replayed"], true, "{v}\n{e}");
    assert_eq!(v["status"], "aborted", "{v}");
    assert_eq!(s, 1, "{e}");
    assert_eq!(started(&fx, &sid), 1);
    fx.assert_ledgers_intact(&sid);
}

/// A supervisor killed between the key's record and the turn's intent
/// entry (found by the file bus's kill -9 scenario): the turn never began,
/// so the key runs it now instead of failing on a finish entry that cannot
/// exist.
#[test]
fn issue_13_a_key_whose_turn_never_began_runs_it() {
    if !require_root("issue_13_a_key_whose_turn_never_began_runs_it") {
        return;
    }
    use sha2::Digest;
    let (fx, sid) = fixture();
    let (s1, v1, e1) = run(&fx, &sid, "k", SCRIPT);
    assert_eq!(s1, 0, "{e1}");
    // The record a dead supervisor leaves for key k2 (the same request, so
    // the same request hash) naming the next turn, with no result and no
    // entry of that turn in the ledgers.
    let dir = fx.state.join("sessions").join(&sid).join("idempotency");
    let name = |k: &str| format!("{}.json", hex::encode(sha2::Sha256::digest(k.as_bytes())));
    let mut record: Value =
        serde_json::from_slice(&std::fs::read(dir.join(name("k"))).unwrap()).unwrap();
    let next = v1["turn_number"].as_u64().unwrap() + 1;
    let m = record.as_object_mut().unwrap();
    m.retain(|k, _| k == "request_hash");
    m.insert("key".into(), "k2".into());
    m.insert("turn_number".into(), next.into());
    std::fs::write(dir.join(name("k2")), format!("{record}\n")).unwrap();
    let (s2, v2, e2) = run(&fx, &sid, "k2", SCRIPT);
    assert_eq!(s2, 0, "{e2}");
    assert_ne!(v2["replayed"], true, "{v2}");
    assert_eq!(v2["turn_number"], next);
    assert_eq!(started(&fx, &sid), 2);
    let out = fx.root.join("output").join(&sid).join("n.txt");
    assert_eq!(std::fs::read_to_string(out).unwrap(), "run run\n");
    // And now it is recorded: the key replays.
    let (s3, v3, _) = run(&fx, &sid, "k2", SCRIPT);
    assert_eq!((s3, &v3["replayed"]), (0, &Value::Bool(true)));
    assert_eq!(started(&fx, &sid), 2);
    fx.assert_ledgers_intact(&sid);
}

/// A key without `--session` was accepted, and each retry started a new
/// session and ran the command again (red-team, stop 54): refused before
/// anything exists (exit 2, naming the flag).
#[test]
fn a_key_without_a_session_is_refused_before_anything() {
    let fx = Fixture::new();
    fx.install("i", MANIFEST);
    let before = fx.snapshot();
    let r = fx.run(
        "i",
        &[
            "--json",
            "--idempotency-key",
            "k",
            "--no-outputs",
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(r.status, 2, "{}", r.stdout);
    assert_eq!(r.json()["error"]["field"], "--idempotency-key");
    assert_eq!(before, fx.snapshot(), "something was made");
    assert!(!fx.state.exists(), "a state directory was made");
}
