//! Issue 25, Kubernetes resources, without containerd: `supervise run
//! --cgroup-parent` refuses a bad parent with nothing created (TS1051),
//! and `supervise suspend` / `resume` freeze and thaw the running turn's
//! cgroup — its processes stop (a counter does not advance), its timeout
//! does not run while it is frozen, and both facts are in its evidence.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use turnstile_tests::{Fixture, read_entries, require_root, supervise_bin};

const MANIFEST: &str = r#"{
  "capabilities": {
    "read": [],
    "write": [],
    "execute": ["/bin/sh", "/bin/sleep"]
  },
  "limits": {"timeout_seconds": 3}
}"#;

/// Every cgroup directory (in any hierarchy) whose name starts `prefix`
/// at the top.
fn cgroups_named(prefix: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        for e in std::fs::read_dir(h.path()).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                out.push(e.path());
            }
        }
    }
    out
}

#[test]
fn issue_25_a_bad_cgroup_parent_is_refused_with_nothing_created() {
    if !require_root("issue_25_a_bad_cgroup_parent_is_refused_with_nothing_created") {
        return;
    }
    let fx = Fixture::new();
    fx.install("p", MANIFEST);
    let before = fx.snapshot();
    let missing = format!("/turnstile-test-missing-{}", std::process::id());
    for bad in [
        "relative/pod",
        "/turnstile-test-a/../b",
        "/./x",
        "/",
        missing.as_str(),
        "/sys/fs/cgroup/memory",
    ] {
        let r = fx.run(
            "p",
            &[
                "--cgroup-parent",
                bad,
                "--no-outputs",
                "--",
                "/bin/sh",
                "-c",
                "echo RAN",
            ],
        );
        assert_eq!(r.status, 2, "{bad}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stderr.contains("TS1051") && r.stderr.contains("--cgroup-parent"),
            "{bad}: {}",
            r.stderr
        );
        assert!(!r.stdout.contains("RAN"), "{bad}");
        assert_eq!(fx.snapshot(), before, "{bad}: something changed on disk");
    }
    assert!(cgroups_named("turnstile-test-missing-").is_empty());
}

#[test]
fn issue_25_suspend_freezes_the_turn_and_its_timeout_waits() {
    if !require_root("issue_25_suspend_freezes_the_turn_and_its_timeout_waits") {
        return;
    }
    let fx = Fixture::new();
    fx.install("p", MANIFEST);
    let sid = fx.new_session();
    // No turn runs: refused, TS1052.
    let r = fx.supervise(&["suspend"], &["--session", &sid]);
    assert_eq!(r.status, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("TS1052"), "{}", r.stderr);

    // 20 ticks of 0.1 s: ~2 s of a 3 s timeout.
    let mut child = Command::new(supervise_bin())
        .args(["run", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args([
            "--package",
            "p",
            "--session",
            &sid,
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            "i=0; while [ $i -lt 20 ]; do i=$((i+1)); echo $i; sleep 0.1; done",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = Arc::clone(&lines);
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        })
    };
    while lines.lock().unwrap().len() < 3 {
        assert!(started.elapsed() < Duration::from_secs(10), "no output");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = fx.supervise(&["suspend"], &["--session", &sid]);
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    std::thread::sleep(Duration::from_millis(300));
    let frozen_at = lines.lock().unwrap().len();
    // Frozen for 3.5 s, longer than the whole timeout.
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(
        lines.lock().unwrap().len(),
        frozen_at,
        "the counter advanced while frozen"
    );
    let r = fx.supervise(&["resume"], &["--session", &sid]);
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    // Not timed out although it ran for longer than its timeout.
    assert!(started.elapsed() > Duration::from_secs(4));
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(lines.lock().unwrap().len(), 20);
    let ev = read_entries(&fx.ledger(&sid, "evidence"));
    let last = ev.last().unwrap();
    assert_eq!(last["status"], "committed", "{last}");
    let s = last["suspensions"].as_array().expect("suspensions");
    let events: Vec<&str> = s.iter().filter_map(|f| f["event"].as_str()).collect();
    assert_eq!(events, ["turn.suspended", "turn.resumed"], "{last}");
    // After the turn: nothing to resume.
    let r = fx.supervise(&["resume"], &["--session", &sid]);
    assert_eq!(r.status, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("TS1052"), "{}", r.stderr);
    fx.assert_ledgers_intact(&sid);
}
