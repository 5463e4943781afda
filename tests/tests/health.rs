//! `supervise health` (issue 13 item 6): READY on a clean state dir,
//! DEGRADED when a stopped supervisor left something unrecovered, FAILED
//! (exit 1) naming the session whose ledger does not verify. Read-only.

use turnstile_tests::{Fixture, require_root, supervise_bin};

fn health(fx: &Fixture) -> (i32, serde_json::Value) {
    let out = std::process::Command::new(supervise_bin())
        .args(["health", "--json", "--state-dir"])
        .arg(&fx.state)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

/// A clean state dir adds no reason of its own: the status is the host's
/// (READY here; DEGRADED on a kernel that lacks something, such as the VM
/// tests' 6.1 with Landlock ABI 2 — never FAILED).
fn assert_clean(status: i32, v: &serde_json::Value) {
    assert_eq!(status, 0, "{v}");
    assert_eq!(v["reasons"], v["host"]["reasons"], "{v}");
    let host = v["host"]["status"].as_str();
    assert!(matches!(host, Some("READY" | "DEGRADED")), "{v}");
    assert_eq!(v["status"].as_str(), host, "{v}");
}

#[test]
fn issue_13_health_reports_ready_degraded_and_failed_state() {
    if !require_root("issue_13_health_reports_ready_degraded_and_failed_state") {
        return;
    }
    let fx = Fixture::new();
    let sid = fx.new_session();
    let (s, v) = health(&fx);
    assert_clean(s, &v);
    assert_eq!(v["sessions"][0]["session_id"], sid.as_str());

    // A supervisor killed mid-turn: a started turn with no finish entry.
    fx.install(
        "h",
        r#"{"capabilities":{"execute":["/bin/sleep"]},"limits":{"timeout_seconds":60}}"#,
    );
    let mut child = std::process::Command::new(supervise_bin())
        .args(["run", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args([
            "--package",
            "h",
            "--session",
            &sid,
            "--no-outputs",
            "--",
            "/bin/sleep",
            "30",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let exec = fx.ledger(&sid, "exec");
    for _ in 0..200 {
        if std::fs::read_to_string(&exec)
            .unwrap()
            .contains("turn.started")
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    child.kill().unwrap();
    child.wait().unwrap();
    let before = fx.snapshot();
    let (s, v) = health(&fx);
    assert_eq!((s, v["status"].as_str()), (0, Some("DEGRADED")), "{v}");
    assert!(
        v["reasons"].to_string().contains("supervise recover"),
        "{v}"
    );
    assert_eq!(before, fx.snapshot(), "health changed something");
    // Recovery settles it, and leaves no mount, cgroup or turn dir.
    let r = std::process::Command::new(supervise_bin())
        .args(["recover", "--state-dir"])
        .arg(&fx.state)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let (s, v) = health(&fx);
    assert_clean(s, &v);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(fx.state.to_str().unwrap()),
        "mounts left under the state dir"
    );

    // Tampering: an acknowledged entry edited.
    let text = std::fs::read_to_string(&exec).unwrap();
    std::fs::write(
        &exec,
        text.replacen("session.started", "session.startex", 1),
    )
    .unwrap();
    let (s, v) = health(&fx);
    assert_eq!((s, v["status"].as_str()), (1, Some("FAILED")), "{v}");
    assert!(v["reasons"].to_string().contains(&sid), "{v}");
}

/// Issue 28 item 5: a state directory that cannot take writes (a
/// read-only mount over it, for real) is FAILED, naming it; health itself
/// writes nothing.
#[test]
fn issue_28_health_fails_on_a_read_only_state_dir() {
    if !require_root("issue_28_health_fails_on_a_read_only_state_dir") {
        return;
    }
    let fx = Fixture::new();
    let _sid = fx.new_session();
    let (s, v) = health(&fx);
    assert_clean(s, &v);
    let target = fx.state.to_str().unwrap();
    let ok = std::process::Command::new("mount")
        .args(["--bind", target, target])
        .status()
        .unwrap()
        .success()
        && std::process::Command::new("mount")
            .args(["-o", "remount,bind,ro", target])
            .status()
            .unwrap()
            .success();
    let (s, v) = health(&fx);
    let _ = std::process::Command::new("umount").arg(target).status();
    assert!(ok, "could not mount the state dir read-only");
    assert_eq!((s, v["status"].as_str()), (1, Some("FAILED")), "{v}");
    assert!(
        v["reasons"].to_string().contains("does not take writes"),
        "{v}"
    );
    let (s, v) = health(&fx);
    assert_clean(s, &v);
}
