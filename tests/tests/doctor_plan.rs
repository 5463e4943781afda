//! `supervise doctor` and `supervise plan`.

use turnstile_tests::{Fixture, HELLO_MANIFEST, require_root};

#[test]
fn doctor_reports_what_this_host_enforces() {
    let r = Fixture::raw(&["doctor", "--json"]);
    let v = r.json();
    let status = v["status"].as_str().unwrap();
    assert!(["READY", "DEGRADED", "FAILED"].contains(&status));
    for key in [
        "landlock_abi",
        "seccomp",
        "overlayfs",
        "user_namespaces",
        "cgroup",
        "runtimes",
    ] {
        assert!(v.get(key).is_some(), "doctor lacks {key}: {v}");
    }
    assert_eq!(r.status, if status == "FAILED" { 20 } else { 0 });
    if status != "READY" {
        assert!(!v["reasons"].as_array().unwrap().is_empty(), "{v}");
    }
    if require_root("doctor_reports_what_this_host_enforces") {
        // On a host where the sandbox runs, nothing may be FAILED.
        assert_ne!(status, "FAILED", "{v}");
        assert!(v["landlock_abi"].as_u64().unwrap() >= 1);
    }
    let text = Fixture::raw(&["doctor"]);
    assert!(
        text.stdout.starts_with("turnstile doctor: "),
        "{}",
        text.stdout
    );
}

#[test]
fn plan_shows_masks_scopes_and_landlock_without_running() {
    let fx = Fixture::new();
    fx.install("hello-agent", HELLO_MANIFEST);
    fx.write("installed/hello-agent/main.py", b"print(1)\n");
    fx.write("installed/hello-agent/secrets/key", b"k");
    let before = fx.snapshot();
    let r = fx.supervise(&["plan"], &["--package", "hello-agent", "--json"]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    let v = r.json();
    assert_eq!(v["argv"][0], "/usr/bin/python3");
    let masks: Vec<&str> = v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["op"] == "mask_dir")
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert!(
        masks
            .iter()
            .any(|p| p.ends_with("installed/hello-agent/secrets")),
        "{masks:?}"
    );
    assert_eq!(v["uid"], 65534);
    assert!(
        v["landlock"]["execute"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().starts_with("/usr/bin/python3"))
    );
    assert_eq!(fx.snapshot(), before, "plan must not touch the disk");
    let text = fx.supervise(&["plan"], &["--package", "hello-agent"]);
    assert!(
        text.stdout.contains("landlock (ABI 6)") && text.stdout.contains("mask "),
        "{}",
        text.stdout
    );
}

/// `plan` without a command plans the first execute entry that names one
/// program; a glob (`/usr/bin/*`) names none: it was E2041 "executable
/// `/usr/bin/*` does not exist" (real-software audit). With only globs the
/// error asks for the command (exit 2, the flag named); nothing changes.
#[test]
fn plan_without_a_command_skips_glob_entries_and_asks_when_only_globs_are_left() {
    let fx = Fixture::new();
    fx.install(
        "g",
        r#"{"capabilities": {"execute": ["/usr/bin/*", "/bin/true"]}}"#,
    );
    fx.install("only", r#"{"capabilities": {"execute": ["/usr/bin/*"]}}"#);
    let before = fx.snapshot();
    let r = fx.supervise(&["plan"], &["--package", "g", "--json"]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    assert_eq!(r.json()["argv"][0], "/bin/true");
    let r = fx.supervise(&["plan"], &["--package", "only"]);
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("TS1006")
            && r.stderr
                .contains("every execute entry of the manifest is a glob"),
        "{}",
        r.stderr
    );
    assert_eq!(fx.snapshot(), before, "plan must not touch the disk");
}
