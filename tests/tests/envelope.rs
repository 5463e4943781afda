//! EventEnvelope v1 on the real binary (issue 13 item 2, seed 001): `run
//! --events` emits canonical envelopes that validate against
//! schemas/event-envelope-v1.schema.json; `run --envelope` receives one, and
//! the same envelope received again is not run again (idempotency).

use serde_json::Value;
use turnstile_tests::{Fixture, require_root};

/// Schema errors of `docs` (one line per invalid document).
fn schema_errors(docs: &[Value]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<std::path::PathBuf> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let p = dir.path().join(format!("{i}.json"));
            std::fs::write(&p, d.to_string()).unwrap();
            p
        })
        .collect();
    let refs: Vec<&std::path::Path> = paths.iter().map(|p| p.as_path()).collect();
    let schemas = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../schemas"));
    turnstile_tests::validate_json(schemas, "event-envelope-v1.schema.json", &refs)
        .into_iter()
        .filter(|l| !l.starts_with("valid "))
        .collect()
}

#[test]
fn issue_13_envelopes_are_emitted_canonical_valid_and_received_exactly_once() {
    if !require_root("issue_13_envelopes_are_emitted_canonical_valid_and_received_exactly_once") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "e",
        r#"{"capabilities":{"write":["output/<session_id>/**"],"execute":["/bin/sh"]}}"#,
    );
    let sid = fx.new_session();
    let events = fx.state.parent().unwrap().join("events.jsonl");
    let ev = events.display().to_string();
    let r = fx.run(
        "e",
        &[
            "--session",
            &sid,
            "--events",
            &ev,
            "--idempotency-key",
            "IDEM-123",
            "--output",
            "output/<session_id>/a.txt:a",
            "--",
            "/bin/sh",
            "-c",
            "echo hi > output/$TURNSTILE_SESSION_ID/a.txt",
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let text = std::fs::read_to_string(&events).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let docs: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = docs.iter().map(|d| d["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["turn.requested", "turn.started", "turn.finished"]);
    assert!(docs.iter().all(|d| d["idempotency_key"] == "IDEM-123"));
    assert_eq!(docs[2]["payload"]["status"], "committed");
    // Canonical: re-serializing with sorted keys gives the same bytes.
    for (l, d) in lines.iter().zip(&docs) {
        let again = turnstile_policy::canonical::to_vec(d).unwrap();
        assert_eq!(l.as_bytes(), again.as_slice());
    }
    assert_eq!(schema_errors(&docs), Vec::<String>::new());
    // The schema is not vacuous.
    let mut bad = docs[0].clone();
    bad.as_object_mut().unwrap().remove("idempotency_key");
    let mut extra = docs[0].clone();
    extra["surprise"] = Value::Bool(true);
    let mut version = docs[0].clone();
    version["schema_version"] = Value::String("2".into());
    assert_eq!(schema_errors(&[bad, extra, version]).len(), 3);

    // The requested event received again: not run again.
    let req = fx.state.parent().unwrap().join("req.json");
    std::fs::write(&req, lines[0]).unwrap();
    let again = fx.run(
        "e",
        &[
            "--session",
            &sid,
            "--json",
            "--envelope",
            &req.display().to_string(),
        ],
    );
    assert_eq!(again.status, 0, "{}", again.stderr);
    assert_eq!(again.json()["replayed"], true);

    // An envelope that does not request a turn is refused, naming the field.
    std::fs::write(&req, lines[2]).unwrap();
    let before = fx.snapshot();
    let wrong = fx.run(
        "e",
        &["--session", &sid, "--envelope", &req.display().to_string()],
    );
    assert_eq!(wrong.status, 2, "{}", wrong.stderr);
    assert!(wrong.stderr.contains("envelope.type"), "{}", wrong.stderr);
    assert_eq!(before, fx.snapshot());
}

/// Red-team M2 (stop 54): a bad `--events` path (a directory, a missing
/// directory, a device) was found only after the turn had committed — exit
/// 1, the outputs landed, and a client retrying the error would run the
/// turn twice. It is refused first: exit 2 naming `--events`, no session
/// made, nothing committed, nothing created.
#[test]
fn a_bad_events_path_is_refused_before_the_turn() {
    if !require_root("a_bad_events_path_is_refused_before_the_turn") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "e",
        r#"{"capabilities":{"write":["output/<session_id>/**"],"execute":["/bin/sh"]}}"#,
    );
    let missing = fx.state.parent().unwrap().join("no/such/dir/ev.jsonl");
    for bad in [
        std::path::PathBuf::from("/tmp"),
        missing.clone(),
        std::path::PathBuf::from("/dev/full"),
    ] {
        let before = fx.snapshot();
        let r = fx.run(
            "e",
            &[
                "--json",
                "--events",
                bad.to_str().unwrap(),
                "--output",
                "output/<session_id>/a.txt:a",
                "--",
                "/bin/sh",
                "-c",
                "echo hi > output/$TURNSTILE_SESSION_ID/a.txt",
            ],
        );
        assert_eq!(r.status, 2, "{}: {}{}", bad.display(), r.stdout, r.stderr);
        let v = r.json();
        assert_eq!(v["error"]["field"], "--events", "{v}");
        assert_eq!(
            fx.snapshot(),
            before,
            "{}: something changed",
            bad.display()
        );
        assert!(!missing.parent().unwrap().exists());
    }
}
