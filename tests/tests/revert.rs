//! Issue 30 item 5: `supervise revert --session S --turn N` puts back what
//! turn N committed as a new turn in both ledgers; a file changed since is
//! a conflict that changes nothing; a revert can be reverted; a pre-image
//! dropped by the retention limit refuses the revert, naming it; a
//! SIGKILLed revert is settled all-or-nothing by recovery.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile_tests::{Fixture, for_this_kernel, read_entries, require_root, supervise_bin};

const MANIFEST: &str = r#"{
  "package_id": "rv",
  "version": "1.0.0",
  "trust_level": "standard",
  "capabilities": {
    "read": ["installed/rv/**", "out/**"],
    "write": ["out/**"],
    "execute": ["/bin/sh", "/bin/mkdir"]
  },
  "limits": {"memory": "256Mi", "cpu": "1", "pids": 64, "timeout_seconds": 60},
  "network": "isolated"
}"#;

fn fixture() -> Fixture {
    let fx = Fixture::new();
    fx.install("rv", &for_this_kernel(MANIFEST));
    fx
}

/// One committed turn writing the tree `out/**` with `script`.
fn turn(fx: &Fixture, sid: Option<&str>, script: &str) -> Value {
    let mut args = vec!["--json", "--output", "out/**:data"];
    if let Some(s) = sid {
        args.extend(["--session", s]);
    }
    args.extend(["--", "/bin/sh", "-c", script]);
    let r = fx.run("rv", &args);
    assert_eq!(r.status, 0, "{script}: {}", r.stderr);
    r.json()
}

fn read(fx: &Fixture, rel: &str) -> Option<String> {
    std::fs::read_to_string(fx.root.join(rel)).ok()
}

fn revert(fx: &Fixture, sid: &str, n: u64) -> turnstile_tests::Run {
    fx.supervise(
        &["revert"],
        &["--session", sid, "--turn", &n.to_string(), "--json"],
    )
}

fn last_evidence(fx: &Fixture, sid: &str) -> Value {
    read_entries(&fx.ledger(sid, "evidence"))
        .into_iter()
        .rev()
        .find(|e| e["event"] == "turn.finished")
        .unwrap()
}

#[test]
fn issue_30_revert_round_trips_and_a_revert_can_be_reverted() {
    if !require_root("issue_30_revert_round_trips_and_a_revert_can_be_reverted") {
        return;
    }
    let fx = fixture();
    fx.write("out/keep.txt", b"host file\n");
    let v = turn(&fx, None, "printf one > out/a.md; printf t1 > out/keep.txt");
    let sid = v["session_id"].as_str().unwrap().to_owned();
    turn(
        &fx,
        Some(&sid),
        "printf two > out/a.md; mkdir -p out/new/deep; printf c > out/new/deep/c.md",
    );
    // The evidence of turn 2 says what each path held before.
    let e2 = last_evidence(&fx, &sid);
    let prev: Vec<(String, String)> = e2["committed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_owned(),
                c["previous"]["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        prev.contains(&("out/a.md".into(), "file".into())),
        "{prev:?}"
    );
    assert!(
        prev.contains(&("out/new/deep/c.md".into(), "absent".into())),
        "{prev:?}"
    );

    // Revert turn 2: a.md is turn 1's again, c.md is gone.
    let r = revert(&fx, &sid, 2);
    assert_eq!(r.status, 0, "{}", r.stderr);
    let v = r.json();
    assert_eq!(v["turn_number"], 3);
    assert_eq!(v["reverted_turn"], 2);
    assert_eq!(read(&fx, "out/a.md").as_deref(), Some("one"));
    assert_eq!(read(&fx, "out/new/deep/c.md"), None);
    assert_eq!(
        read(&fx, "out/keep.txt").as_deref(),
        Some("t1"),
        "turn 1's file untouched"
    );
    let e3 = last_evidence(&fx, &sid);
    assert_eq!(e3["turn_number"], 3);
    assert_eq!(e3["status"], "committed");
    assert_eq!(e3["reverts_turn"], 2);
    assert_eq!(e3["command"][1], "revert");
    let exec3: Vec<Value> = read_entries(&fx.ledger(&sid, "exec"))
        .into_iter()
        .filter(|e| e["turn_number"] == 3)
        .collect();
    assert_eq!(exec3.len(), 2, "turn.started and turn.finished: {exec3:?}");
    fx.assert_ledgers_intact(&sid);

    // Revert the revert: turn 2's state again.
    let r = revert(&fx, &sid, 3);
    assert_eq!(r.status, 0, "{}", r.stderr);
    assert_eq!(read(&fx, "out/a.md").as_deref(), Some("two"));
    assert_eq!(read(&fx, "out/new/deep/c.md").as_deref(), Some("c"));
    // And turn 1: keep.txt goes back to the host's file, a.md (absent
    // before turn 1) is removed — but a.md is turn 2's now, not turn 1's:
    // a conflict naming it, nothing changed.
    let before = fx.snapshot();
    let r = revert(&fx, &sid, 1);
    assert_eq!(r.status, 12, "{}", r.stderr);
    assert!(r.stderr.contains("TS1064"), "{}", r.stderr);
    assert!(
        r.stderr.contains("out/a.md: changed since turn 1"),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("out/keep.txt"),
        "keep.txt is turn 1's: {}",
        r.stderr
    );
    assert_eq!(fx.snapshot(), before, "a conflict changes nothing");
    fx.assert_ledgers_intact(&sid);
}

#[test]
fn issue_30_revert_conflicts_and_bad_input_change_nothing() {
    if !require_root("issue_30_revert_conflicts_and_bad_input_change_nothing") {
        return;
    }
    let fx = fixture();
    let v = turn(&fx, None, "printf one > out/a.md; printf b > out/b.md");
    let sid = v["session_id"].as_str().unwrap().to_owned();
    turn(
        &fx,
        Some(&sid),
        "printf two > out/a.md; printf bb > out/b.md",
    );
    // Someone edits both files on the host after turn 2.
    std::fs::write(fx.root.join("out/a.md"), "edited").unwrap();
    std::fs::remove_file(fx.root.join("out/b.md")).unwrap();
    let before = fx.snapshot();
    let r = revert(&fx, &sid, 2);
    assert_eq!(r.status, 12, "{}", r.stderr);
    assert!(
        r.stderr.contains("out/a.md: changed since turn 2"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("out/b.md: removed since turn 2"),
        "{}",
        r.stderr
    );
    assert_eq!(r.json()["error"]["code"], "TS1064");
    assert_eq!(fx.snapshot(), before);

    for (args, status, field) in [
        (vec!["--session", sid.as_str(), "--turn", "0"], 2, "--turn"),
        (vec!["--session", sid.as_str(), "--turn", "9"], 2, "--turn"),
        (vec!["--session", "SES-bogus", "--turn", "1"], 2, "session"),
        (vec!["--session", sid.as_str(), "--turn", "x"], 2, "--turn"),
    ] {
        let r = fx.supervise(&["revert"], &args);
        assert_eq!(r.status, status, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(field), "{args:?}: {}", r.stderr);
        assert_eq!(fx.snapshot(), before, "{args:?} changed something");
    }
    // A turn that committed nothing.
    let r = fx.run(
        "rv",
        &[
            "--session",
            &sid,
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            "true",
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let r = revert(&fx, &sid, 3);
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(r.stderr.contains("committed no file"), "{}", r.stderr);
}

#[test]
fn issue_30_a_preimage_dropped_by_retention_refuses_the_revert() {
    if !require_root("issue_30_a_preimage_dropped_by_retention_refuses_the_revert") {
        return;
    }
    let fx = fixture();
    let config = fx.state.parent().unwrap().join("config.json");
    std::fs::write(&config, r#"{"preimage_retention_bytes": 4}"#).unwrap();
    let v = turn(&fx, None, "printf 0123456789 > out/a.md");
    let sid = v["session_id"].as_str().unwrap().to_owned();
    let r = fx.run(
        "rv",
        &[
            "--session",
            &sid,
            "--config",
            config.to_str().unwrap(),
            "--output",
            "out/**:data",
            "--",
            "/bin/sh",
            "-c",
            "printf two > out/a.md",
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let before = fx.snapshot();
    let r = revert(&fx, &sid, 2);
    assert_eq!(r.status, 12, "{}", r.stderr);
    assert!(r.stderr.contains("no longer kept"), "{}", r.stderr);
    assert_eq!(fx.snapshot(), before);
    // A bad value is refused naming the field.
    std::fs::write(&config, r#"{"preimage_retention_bytes": "lots"}"#).unwrap();
    let r = fx.run(
        "rv",
        &[
            "--session",
            &sid,
            "--config",
            config.to_str().unwrap(),
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            "true",
        ],
    );
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("preimage_retention_bytes"),
        "{}",
        r.stderr
    );
}

fn spawn_revert(fx: &Fixture, sid: &str, n: u64) -> std::process::Child {
    Command::new(supervise_bin())
        .args(["revert", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args(["--session", sid, "--turn", &n.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The contents of out/f<i>.md for i in 0..n (None: absent).
fn tree(fx: &Fixture, n: usize) -> Vec<Option<String>> {
    (0..n).map(|i| read(fx, &format!("out/f{i}.md"))).collect()
}

#[test]
fn issue_30_a_killed_revert_lands_all_or_nothing() {
    if !require_root("issue_30_a_killed_revert_lands_all_or_nothing") {
        return;
    }
    const N: usize = 200;
    let fx = fixture();
    let v = turn(
        &fx,
        None,
        &format!("i=0; while [ $i -lt {N} ]; do printf old$i > out/f$i.md; i=$((i+1)); done"),
    );
    let sid = v["session_id"].as_str().unwrap().to_owned();
    let old = tree(&fx, N);
    // How long one revert takes, to spread the kill points over.
    let mut wall = Duration::ZERO;
    // Kill points from 30% to 118% of an unkilled revert's wall time.
    let at = |k: u32| 0.3 + 0.08 * f64::from(k);
    let mut points = 0;
    let mut aborted = 0;
    for k in 0..12u32 {
        turn(
            &fx,
            Some(&sid),
            &format!(
                "i=0; while [ $i -lt {N} ]; do printf new{k}$i > out/f$i.md; i=$((i+1)); done"
            ),
        );
        let new = tree(&fx, N);
        let reverted_turn =
            read_entries(&fx.ledger(&sid, "evidence")).last().unwrap()["turn_number"]
                .as_u64()
                .unwrap();
        let t0 = Instant::now();
        let mut child = spawn_revert(&fx, &sid, reverted_turn);
        if k == 0 {
            child.wait().unwrap();
            wall = t0.elapsed();
        } else {
            std::thread::sleep(wall.mul_f64(at(k)));
            let _ = child.kill();
            let _ = child.wait();
        }
        // Recovery settles it (every writer of a session runs it first).
        let r = fx.supervise(&["recover"], &["--json"]);
        assert_eq!(r.status, 0, "{}", r.stderr);
        fx.assert_ledgers_intact(&sid);
        let now = tree(&fx, N);
        let last = read_entries(&fx.ledger(&sid, "evidence"))
            .into_iter()
            .rev()
            .find(|e| e["event"] == "turn.finished")
            .unwrap();
        eprintln!(
            "kill {k} at {:?} of {wall:?}: {}",
            wall.mul_f64(at(k)),
            if now == new {
                "nothing landed"
            } else {
                "reverted"
            }
        );
        if now == new {
            aborted += usize::from(last["status"] == "aborted");
            // Nothing landed: the revert turn never started, or is aborted.
            assert!(
                last["turn_number"] == reverted_turn || last["status"] != "committed",
                "kill {k}: {last}"
            );
        } else {
            assert_eq!(now, old, "kill {k}: a partial revert");
            assert_eq!(last["status"], "committed", "kill {k}: {last}");
            points += 1;
        }
        // Back to a known state for the next round: the old tree.
        if now == new {
            let r = revert(&fx, &sid, reverted_turn);
            assert_eq!(r.status, 0, "{}", r.stderr);
        }
        assert_eq!(tree(&fx, N), old);
    }
    assert!(points >= 1, "at least the unkilled revert landed");
    eprintln!("{points} reverts landed, {aborted} were aborted by the kill");
}
