//! One pipeline, many backends (issue 10): the same turn through `native`
//! and `runc` — a declared output commits with the same hash, an
//! undeclared write blocks, a forbidden read fails, a 0600 file in a 0700
//! workspace reads (idmapped on both), the ledgers verify and name the
//! backend — and a runtime that is not wired or not installed is exit 20
//! E2040, never a fallback.

use serde_json::Value;
use turnstile_tests::{Fixture, read_entries, require_root};

const MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["data/**"],
    "write": ["output/<session_id>/**"],
    "execute": ["/usr/bin/python3"],
    "forbidden": ["data/secret/**"]
  },
  "limits": {"timeout_seconds": 60}
}"#;

const CODE: &str = r#"
import os, errno
out = f"output/{os.environ['TURNSTILE_SESSION_ID']}/r.txt"
open(out, "w").write(open("data/in.txt").read().upper())
try:
    open("data/secret/key").read(); print("SECRET READ")
except OSError as e:
    print("secret", errno.errorcode[e.errno])
print("uid", os.getuid())
"#;

fn fixture() -> Fixture {
    let fx = Fixture::new();
    fx.install("k", MANIFEST);
    fx.write("data/in.txt", b"hello\n");
    fx.write("data/secret/key", b"k");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fx.root, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(
        fx.root.join("data/in.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    fx
}

fn turn(fx: &Fixture, backend: &str, outputs: &[&str], code: &str) -> (i32, Value, String) {
    let mut args = vec!["--json", "--backend", backend];
    if outputs.is_empty() {
        args.push("--no-outputs");
    }
    for o in outputs {
        args.extend(["--output", o]);
    }
    args.extend(["--", "/usr/bin/python3", "-c", code]);
    let r = fx.run("k", &args);
    let v = r.json();
    (r.status, v, r.stderr)
}

#[test]
fn issue_10_native_runc_and_crun_commit_the_same_hash_and_block_the_same_write() {
    if !require_root("issue_10_native_runc_and_crun_commit_the_same_hash_and_block_the_same_write")
    {
        return;
    }
    let mut hashes = Vec::new();
    for backend in ["native", "runc", "crun"] {
        let fx = fixture();
        let (status, v, stderr) = turn(&fx, backend, &["output/<session_id>/r.txt:result"], CODE);
        assert_eq!(status, 0, "{backend}: {stderr}");
        assert!(
            stderr.contains("secret ") && !stderr.contains("SECRET READ"),
            "{backend}: {stderr}"
        );
        assert!(stderr.contains("uid 65534"), "{backend}: {stderr}");
        // Phases are laps of one clock: together they fit in the wall time
        // (a backend reporting cumulative marks would overshoot it). The
        // native init's own laps (`init_idmap`, `init_view`, …) are nested
        // in `init_until_ready`, so they are left out of the sum.
        let d = &v["durations"];
        let laps: f64 = d["phases_ms"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| !k.starts_with("init_") || *k == "init_until_ready")
            .map(|(_, x)| x.as_f64().unwrap())
            .sum();
        assert!(
            laps <= d["wall_ms"].as_f64().unwrap(),
            "{backend}: phases sum to {laps} ms, more than the turn's wall time: {d}"
        );
        let sid = v["session_id"].as_str().unwrap().to_owned();
        let committed = &v["committed"][0];
        assert_eq!(committed["path"], format!("output/{sid}/r.txt"));
        hashes.push(committed["sha256"].as_str().unwrap().to_owned());
        let out = std::fs::read(fx.root.join(format!("output/{sid}/r.txt"))).unwrap();
        assert_eq!(out, b"HELLO\n");
        let ev = read_entries(&fx.ledger(&sid, "evidence"));
        assert_eq!(ev.last().unwrap()["enforcement"]["backend"], backend);
        fx.assert_ledgers_intact(&sid);

        // An undeclared write blocks, nothing reaches the workspace.
        let (status, v, stderr) = turn(&fx, backend, &[], CODE);
        assert_eq!(status, 12, "{backend}: {stderr}");
        let sid = v["session_id"].as_str().unwrap().to_owned();
        assert!(!fx.root.join(format!("output/{sid}/r.txt")).exists());
        fx.assert_ledgers_intact(&sid);
    }
    assert!(
        hashes.iter().all(|h| *h == hashes[0]),
        "native, runc and crun committed different bytes: {hashes:?}"
    );
}

#[test]
fn issue_10_a_runtime_not_wired_or_not_installed_is_e2040_never_a_fallback() {
    let fx = fixture();
    for backend in ["kata", "runsc"] {
        let before = fx.snapshot();
        let (status, v, stderr) = turn(&fx, backend, &[], "print(1)");
        assert_eq!(status, 20, "{backend}: {stderr}");
        assert_eq!(v["error"]["code"], "E2040", "{backend}: {v}");
        assert_eq!(before, fx.snapshot(), "{backend}: something was created");
    }
}
