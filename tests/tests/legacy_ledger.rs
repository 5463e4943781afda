//! A ledger written by the wave-2 release still verifies, reads context and
//! replays (issue 24: the entries became typed; the on-disk format stays
//! readable). The fixture is `tests/fixtures/wave2-ledger/` (see its
//! README).

use std::path::Path;

use turnstile_tests::{require_root, supervise_bin};

const SID: &str = "SES-20261126T025929691027Z-6b74e994c0577d5e";

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

fn supervise(args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = std::process::Command::new(supervise_bin())
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null),
        format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn issue_24_a_wave2_ledger_verifies_reads_context_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/wave2-ledger");
    copy(&fixture.join("root"), &base.join("root"));
    copy(&fixture.join("state"), &base.join("state"));
    let root = base.join("root");
    let state = base.join("state");
    // The scratch dir (empty in git) and the workspace root of the record.
    std::fs::create_dir_all(root.join("tmp").join(SID)).unwrap();
    let meta = state.join("sessions").join(SID).join("session.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(
        &meta,
        text.replace("/tmp/fixture/root", root.to_str().unwrap()),
    )
    .unwrap();
    let (r, s) = (root.display().to_string(), state.display().to_string());
    let common = [
        "--root",
        r.as_str(),
        "--state-dir",
        s.as_str(),
        "--session",
        SID,
        "--json",
    ];

    let (status, v, out) = supervise(&[&["ledger", "verify"][..], &common].concat());
    assert_eq!(status, 0, "{out}");
    assert_eq!(v["intact"], true, "{v}");

    let (status, v, out) = supervise(&[&["context"][..], &common].concat());
    assert_eq!(status, 0, "{out}");
    let ctx = &v["context"];
    let statuses: Vec<&str> = ctx["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            "committed",
            "blocked",
            "violation",
            "command_failed",
            "committed",
            "committed"
        ]
    );
    assert!(
        ctx["outputs"][format!("output/{SID}/r.txt")]["sha256"].is_string(),
        "{ctx}"
    );
    assert!(
        !v["checkpoint"].is_null(),
        "the release's checkpoint is used: {v}"
    );
    let layers: Vec<&str> = ctx["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["layer"].as_str().unwrap())
        .collect();
    assert_eq!(layers, ["verify", "pre-execution", "seccomp"], "{ctx}");

    if !require_root("issue_24_a_wave2_ledger_verifies_reads_context_and_replays") {
        return;
    }
    let into = base.join("replay");
    let i = into.display().to_string();
    let (status, v, out) = supervise(&[&["replay", "--into", i.as_str()][..], &common].concat());
    assert_eq!(status, 0, "{out}");
    assert_eq!(v["identical"], true, "{v}");
    assert_eq!(v["turns"], 6, "{v}");
}
