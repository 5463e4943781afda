//! Denials explained (issue 11; FR-RT-003, FR-RT-010, FR-RT-011): what a
//! layer refused inside the sandbox is in the evidence — once per kind,
//! with its count, layer and hint — and a layer whose refusals cannot be
//! observed says so instead of showing an empty list.

use serde_json::Value;
use turnstile_tests::{Fixture, read_entries, require_root};

const MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["data/**"],
    "execute": ["/usr/bin/python3"]
  },
  "limits": {"timeout_seconds": 600}
}"#;
// 600 s: a loop of 100000 denials is 100000 seccomp user-notification
// round trips — seconds here, but over a minute on a loaded 2-vCPU QEMU
// guest without KVM (vm-test). What is bounded is the evidence, not time.

fn fixture() -> Fixture {
    let fx = Fixture::new();
    fx.install("d", MANIFEST);
    fx.write("data/a.txt", b"a");
    fx
}

fn turn(fx: &Fixture, code: &str) -> (Value, Value) {
    let r = fx.run(
        "d",
        &[
            "--json",
            "--no-outputs",
            "--",
            "/usr/bin/python3",
            "-c",
            code,
        ],
    );
    assert_eq!(r.status, 0, "{}\n{}", r.stdout, r.stderr);
    let v = r.json();
    let sid = v["session_id"].as_str().unwrap().to_owned();
    let evidence = read_entries(&fx.ledger(&sid, "evidence"));
    fx.assert_ledgers_intact(&sid);
    (v, evidence.last().unwrap().clone())
}

const SYSCALLS: &str = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n";

#[test]
fn fr_rt_011_a_denied_syscall_is_one_violation_with_layer_count_and_hint() {
    if !require_root("fr_rt_011_a_denied_syscall_is_one_violation_with_layer_count_and_hint") {
        return;
    }
    let fx = fixture();
    let code = format!(
        "{SYSCALLS}assert libc.syscall(272, 0x10000000) == -1 and ctypes.get_errno() == 1\nassert libc.syscall(272, 0x10000000) == -1"
    );
    let (result, e) = turn(&fx, &code);
    // The status is the command's: it handled EPERM and exited 0.
    assert_eq!(e["status"], "committed");
    let v: Vec<&Value> = e["violations"].as_array().unwrap().iter().collect();
    assert_eq!(v.len(), 1, "{v:?}");
    let d = v[0];
    assert_eq!(d["attempted_operation"], "syscall");
    assert_eq!(d["target"], "unshare");
    assert_eq!(d["layer"], "seccomp");
    assert_eq!(d["count"], 2);
    assert_eq!(d["violated_capability"]["kind"], "denied_syscall");
    assert_eq!(d["turn_number"], 1);
    assert_eq!(d["session_id"], e["session_id"]);
    assert!(d["timestamp"].as_str().unwrap().ends_with('Z'));
    assert!(
        d["hint"].as_str().unwrap().contains("namespaces"),
        "{}",
        d["hint"]
    );
    // --json lists them too.
    assert_eq!(result["violations"][0]["target"], "unshare");
}

#[test]
fn fr_rt_011_a_loop_of_100000_denials_is_one_counted_violation_and_bounded() {
    if !require_root("fr_rt_011_a_loop_of_100000_denials_is_one_counted_violation_and_bounded") {
        return;
    }
    let fx = fixture();
    let code = format!("{SYSCALLS}for _ in range(100000): libc.syscall(165, 0, 0, 0, 0, 0)");
    let (_, e) = turn(&fx, &code);
    let v = e["violations"].as_array().unwrap();
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0]["target"], "mount");
    assert_eq!(v[0]["count"], 100_000);
    let bytes = serde_json::to_vec(&e).unwrap().len();
    assert!(bytes < 16 * 1024, "evidence entry of {bytes} bytes");
}

#[test]
fn fr_rt_011_no_denial_records_none_and_unobservable_layers_say_so() {
    if !require_root("fr_rt_011_no_denial_records_none_and_unobservable_layers_say_so") {
        return;
    }
    let fx = fixture();
    // A read Landlock or the view refuses: not observable, and said so.
    let (_, e) = turn(
        &fx,
        "import os\ntry:\n    open('/etc/shadow')\nexcept OSError:\n    pass\nprint(open('data/a.txt').read())",
    );
    assert_eq!(e["violations"], serde_json::json!([]));
    let o = &e["enforcement"]["denials_observed"];
    assert_eq!(o["seccomp"]["observed"], true, "{o}");
    assert_eq!(o["landlock"]["observed"], false, "{o}");
    assert!(o["landlock"]["why"].as_str().unwrap().contains("audit"));
    assert_eq!(o["mount"]["observed"], false, "{o}");
}

#[test]
fn fr_rt_011_pre_execution_violations_carry_layer_and_the_entry_that_would_allow_them() {
    if !require_root(
        "fr_rt_011_pre_execution_violations_carry_layer_and_the_entry_that_would_allow_them",
    ) {
        return;
    }
    let fx = fixture();
    let r = fx.run(
        "d",
        &["--json", "--no-outputs", "--", "/bin/sh", "-c", "true"],
    );
    assert_eq!(r.status, 11, "{}", r.stderr);
    let v = r.json();
    let sid = v["session_id"].as_str().unwrap().to_owned();
    let e = read_entries(&fx.ledger(&sid, "evidence"));
    let viol = &e.last().unwrap()["violations"][0];
    assert_eq!(viol["layer"], "pre-execution");
    assert_eq!(viol["count"], 1);
    assert_eq!(viol["hint"], "add `/bin/sh` to capabilities.execute");
}

#[test]
fn fr_rt_011_explain_prints_the_denials_of_a_turn() {
    if !require_root("fr_rt_011_explain_prints_the_denials_of_a_turn") {
        return;
    }
    let fx = fixture();
    let (_, e) = turn(&fx, &format!("{SYSCALLS}libc.syscall(272, 0x10000000)"));
    let sid = e["session_id"].as_str().unwrap();
    let r = fx.supervise(&["explain"], &["--session", sid, "--turn", "1"]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("[seccomp] syscall unshare (x1)"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("hint: denied by the sandbox baseline"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("landlock refusals are not observable"),
        "{}",
        r.stdout
    );
    let j = fx.supervise(&["explain"], &["--session", sid, "--turn", "1", "--json"]);
    assert_eq!(j.json()["violations"][0]["count"], 1);
    let missing = fx.supervise(&["explain"], &["--session", sid, "--turn", "9"]);
    assert_eq!(missing.status, 2, "{}", missing.stderr);
    assert!(missing.stderr.contains("TS1006"), "{}", missing.stderr);
}
