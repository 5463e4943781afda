//! FR-RT-006/007/008/017/018: ledgers are created together, chained, anchored,
//! and every kind of tampering is detected and named by `ledger verify`.

use std::path::Path;

use serde_json::{Value, json};
use turnstile_policy::canonical;
use turnstile_policy::request::TurnRequest;
use turnstile_policy::{SessionId, Violations};
use turnstile_supervisor::ids::SystemClock;
use turnstile_supervisor::store::layout::{StateDir, Workspace};
use turnstile_supervisor::store::ledger::{LedgerKind, genesis_hash};
use turnstile_supervisor::store::session::Session;
use turnstile_supervisor::turn::record_rejected_turn;
use turnstile_tests::{Fixture, HELLO_MANIFEST, read_entries};

fn open(fx: &Fixture, sid: &str) -> Session {
    let ws = Workspace::open(&fx.root).unwrap();
    let state = StateDir::open(&fx.state, &ws, false).unwrap();
    Session::open(&ws, &state, &SessionId::parse(sid).unwrap(), None).unwrap()
}

/// A session whose ledgers hold `turns` refused turns after session.started.
fn session_with_turns(fx: &Fixture, turns: usize, work_order: Option<&str>) -> String {
    fx.install("hello-agent", HELLO_MANIFEST);
    let sid = fx.new_session();
    let session = open(fx, &sid);
    for i in 0..turns {
        let mut req = json!({
            "command": ["/bin/sh", "-c", format!("echo {i}")],
            "declared_inputs": ["installed/hello-agent/secrets/key.pem"],
            "declared_outputs": [{"path": "output/<session_id>/r.md", "role": "report"}],
        });
        if let Some(w) = work_order {
            req["work_order_id"] = json!(w);
        }
        let req = TurnRequest::from_json(req.to_string().as_bytes()).unwrap();
        let bound = req.bind(&session.id).unwrap();
        let ws = Workspace::open(&fx.root).unwrap();
        let manifest = turnstile_policy::Manifest::load(
            ws.root(),
            &turnstile_policy::PackageId::parse("hello-agent").unwrap(),
        )
        .unwrap();
        let violations: Violations = turnstile_policy::check_turn(ws.root_str(), &manifest, &bound)
            .unwrap()
            .unwrap_err();
        let lock = session.lock().unwrap();
        let n =
            record_rejected_turn(&session, &lock, &bound, "p", &violations, &SystemClock).unwrap();
        assert_eq!(n, i as u64 + 1);
    }
    sid
}

fn verify(fx: &Fixture, sid: &str) -> (i32, Value) {
    let r = fx.supervise(&["ledger", "verify"], &["--session", sid, "--json"]);
    (r.status, r.json())
}

fn assert_intact(fx: &Fixture, sid: &str) {
    let (status, v) = verify(fx, sid);
    assert_eq!(status, 0, "{v}");
    assert_eq!(v["intact"], true);
}

/// Asserts verify fails with exit 3 on `kind`, naming `line`/`seq` and a
/// message containing `needle`.
fn assert_tampered(
    fx: &Fixture,
    sid: &str,
    kind: &str,
    line: Option<u64>,
    seq: Option<u64>,
    needle: &str,
) {
    let (status, v) = verify(fx, sid);
    assert_eq!(status, 3, "{v}");
    assert_eq!(v["intact"], false);
    let ledger = v["ledgers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["ledger"] == kind)
        .unwrap();
    assert_eq!(ledger["intact"], false, "{v}");
    let err = &ledger["error"];
    assert_eq!(err["code"], "TS1010");
    assert_eq!(err["line"], json!(line), "{err}");
    assert_eq!(err["seq"], json!(seq), "{err}");
    let msg = err["message"].as_str().unwrap();
    assert!(msg.contains(needle), "expected `{needle}` in: {msg}");
    assert!(
        msg.contains(&format!("{kind}.jsonl")),
        "ledger not named: {msg}"
    );
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut s = lines.join("\n");
    if !lines.is_empty() {
        s.push('\n');
    }
    std::fs::write(path, s).unwrap();
}

/// Re-serializes an entry canonically, optionally recomputing its hash.
fn canonical_line(mut v: Value, rehash: bool) -> String {
    if rehash {
        let m = v.as_object_mut().unwrap();
        m.remove("entry_hash");
        let h = canonical::hash_value(&Value::Object(m.clone())).unwrap();
        m.insert("entry_hash".into(), json!(h));
    }
    canonical::to_string(&v).unwrap()
}

#[test]
fn fr_rt_018_session_start_creates_both_ledgers() {
    let fx = Fixture::new();
    let r = fx.supervise(&["session", "new"], &["--json"]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    let v = r.json();
    let sid = v["session_id"].as_str().unwrap();
    assert!(SessionId::parse(sid).is_ok());
    for kind in ["exec", "evidence"] {
        let path = fx.ledger(sid, kind);
        assert_eq!(v["ledgers"][kind], json!(path));
        let entries = read_entries(&path);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0]["event"], "session.started");
        assert_eq!(entries[0]["seq"], 1);
        assert_eq!(entries[0]["session_id"], sid);
    }
    assert!(fx.root.join("tmp").join(sid).is_dir());
    assert!(fx.root.join("output").join(sid).is_dir());
    assert_intact(&fx, sid);
}

#[test]
fn fr_rt_018_a_session_missing_either_ledger_is_invalid() {
    for kind in ["exec", "evidence"] {
        let fx = Fixture::new();
        let sid = fx.new_session();
        std::fs::remove_file(fx.ledger(&sid, kind)).unwrap();
        assert_tampered(&fx, &sid, kind, None, None, "missing");
        // The other ledger is still reported, and reported intact.
        let (_, v) = verify(&fx, &sid);
        let other = v["ledgers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["ledger"] != kind)
            .unwrap()
            .clone();
        assert_eq!(other["intact"], true);
    }
}

#[test]
fn fr_rt_006_exec_entries_are_chained_and_complete() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 3, None);
    let entries = read_entries(&fx.ledger(&sid, "exec"));
    assert_eq!(entries.len(), 4);
    let session = SessionId::parse(&sid).unwrap();
    let mut prev = genesis_hash(LedgerKind::Exec, &session);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e["seq"], i as u64 + 1);
        assert_eq!(e["previous_hash"], prev.as_str());
        let mut body = e.as_object().unwrap().clone();
        let recorded = body.remove("entry_hash").unwrap();
        assert_eq!(
            recorded,
            canonical::hash_value(&Value::Object(body))
                .unwrap()
                .as_str()
        );
        prev = recorded.as_str().unwrap().to_owned();
    }
    for (n, e) in entries[1..].iter().enumerate() {
        assert_eq!(e["session_id"], sid.as_str());
        assert_eq!(e["turn_number"], n as u64 + 1);
        assert_eq!(e["status"], "violation");
        for field in ["query_hash", "result_hash"] {
            assert_eq!(e[field].as_str().unwrap().len(), 64, "{field}");
        }
        assert!(
            e.get("backend").is_some()
                && e.get("timings").is_some()
                && e.get("exit_code").is_some()
        );
    }
    assert_intact(&fx, &sid);
}

#[test]
fn fr_rt_007_evidence_is_written_even_when_the_turn_is_refused() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    let entries = read_entries(&fx.ledger(&sid, "evidence"));
    assert_eq!(entries.len(), 2);
    let e = &entries[1];
    assert_eq!(e["session_id"], sid.as_str());
    assert_eq!(e["turn_number"], 1);
    assert_eq!(
        e["declared_reads"],
        json!(["installed/hello-agent/secrets/key.pem"])
    );
    assert_eq!(
        e["declared_writes"][0]["path"],
        format!("output/{sid}/r.md")
    );
    assert_eq!(e["external_calls"], json!([]));
    assert_eq!(e["realized_writes"], json!([]));
    assert!(e.get("work_order_id").is_none());
    assert_intact(&fx, &sid);
}

#[test]
fn fr_rt_010_fr_rt_011_violations_are_logged_with_details() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    let e = &read_entries(&fx.ledger(&sid, "evidence"))[1];
    let violations = e["violations"].as_array().unwrap();
    assert_eq!(violations.len(), 2, "{e}");
    let exec = violations
        .iter()
        .find(|v| v["attempted_operation"] == "execute")
        .unwrap();
    assert_eq!(
        exec["violated_capability"],
        json!({"kind": "not_granted", "capability": "execute"})
    );
    let read = violations
        .iter()
        .find(|v| v["attempted_operation"] == "read")
        .unwrap();
    assert_eq!(
        read["violated_capability"],
        json!({"kind": "forbidden", "pattern": "installed/hello-agent/secrets/**"})
    );
    for v in violations {
        assert_eq!(v["session_id"], sid.as_str());
        assert_eq!(v["turn_number"], 1);
        let ts = v["timestamp"].as_str().unwrap();
        assert!(ts.ends_with('Z') && ts.len() == 27, "{ts}");
        assert!(!v["details"].as_str().unwrap().is_empty());
    }
}

#[test]
fn fr_rt_017_evidence_links_session_turn_and_work_order() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 2, Some("WO-42"));
    let entries = read_entries(&fx.ledger(&sid, "evidence"));
    for (i, e) in entries[1..].iter().enumerate() {
        assert_eq!(e["session_id"], sid.as_str());
        assert_eq!(
            e["turn_number"],
            i as u64 + 1,
            "turn numbers are 1-based and sequential"
        );
        assert_eq!(e["work_order_id"], "WO-42");
    }
}

#[test]
fn concurrent_appends_stay_one_chain() {
    let fx = Fixture::new();
    let sid = fx.new_session();
    let session = open(&fx, &sid);
    std::thread::scope(|s| {
        for t in 0..8 {
            let session = &session;
            s.spawn(move || {
                for i in 0..25 {
                    let lock = session.lock().unwrap();
                    let body =
                        json!({"event": "test", "session_id": session.id.as_str(), "t": t, "i": i});
                    let Value::Object(m) = body else {
                        unreachable!()
                    };
                    session.ledger(LedgerKind::Exec).append(&lock, m).unwrap();
                }
            });
        }
    });
    assert_eq!(read_entries(&fx.ledger(&sid, "exec")).len(), 201);
    assert_intact(&fx, &sid);
}

// ---- FR-RT-008: every tampering is detected and named ----------------------

#[test]
fn fr_rt_008_field_edit_is_detected() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 3, None);
    let path = fx.ledger(&sid, "exec");
    let mut ls = lines(&path);
    let mut v: Value = serde_json::from_str(&ls[2]).unwrap();
    v["status"] = json!("committed");
    ls[2] = canonical_line(v, false);
    write_lines(&path, &ls);
    assert_tampered(
        &fx,
        &sid,
        "exec",
        Some(3),
        Some(3),
        "does not match the content",
    );
}

#[test]
fn fr_rt_008_one_rehashed_entry_breaks_the_next_link() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 3, None);
    let path = fx.ledger(&sid, "evidence");
    let mut ls = lines(&path);
    let mut v: Value = serde_json::from_str(&ls[1]).unwrap();
    v["violations"] = json!([]);
    ls[1] = canonical_line(v, true);
    write_lines(&path, &ls);
    assert_tampered(
        &fx,
        &sid,
        "evidence",
        Some(3),
        Some(3),
        "does not link to the previous entry",
    );
}

#[test]
fn fr_rt_008_rehashed_head_entry_is_caught_by_the_anchor() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 2, None);
    let path = fx.ledger(&sid, "exec");
    let mut ls = lines(&path);
    let last = ls.len() - 1;
    let mut v: Value = serde_json::from_str(&ls[last]).unwrap();
    v["status"] = json!("committed");
    ls[last] = canonical_line(v, true);
    write_lines(&path, &ls);
    assert_tampered(
        &fx,
        &sid,
        "exec",
        None,
        Some(3),
        "differs from the acknowledged head",
    );
}

#[test]
fn fr_rt_008_interior_delete_is_detected() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 3, None);
    let path = fx.ledger(&sid, "exec");
    let mut ls = lines(&path);
    ls.remove(1);
    write_lines(&path, &ls);
    assert_tampered(
        &fx,
        &sid,
        "exec",
        Some(2),
        Some(3),
        "deleted, inserted or reordered",
    );
}

#[test]
fn fr_rt_008_reorder_is_detected() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 3, None);
    let path = fx.ledger(&sid, "evidence");
    let mut ls = lines(&path);
    ls.swap(2, 3);
    write_lines(&path, &ls);
    assert_tampered(
        &fx,
        &sid,
        "evidence",
        Some(3),
        Some(4),
        "deleted, inserted or reordered",
    );
}

#[test]
fn fr_rt_008_tail_truncation_is_detected() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 3, None);
    let path = fx.ledger(&sid, "exec");
    let mut ls = lines(&path);
    ls.truncate(2);
    write_lines(&path, &ls);
    assert_tampered(
        &fx,
        &sid,
        "exec",
        None,
        None,
        "ends at seq 2, but 4 entries were acknowledged",
    );
}

#[test]
fn fr_rt_008_whole_file_truncation_is_detected() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    let path = fx.ledger(&sid, "evidence");
    std::fs::write(&path, b"").unwrap();
    assert_tampered(
        &fx,
        &sid,
        "evidence",
        None,
        None,
        "empty, but 2 entries were acknowledged",
    );
}

#[test]
fn fr_rt_008_deleted_file_is_detected() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    std::fs::remove_file(fx.ledger(&sid, "exec")).unwrap();
    assert_tampered(
        &fx,
        &sid,
        "exec",
        None,
        None,
        "missing, but 2 entries were acknowledged",
    );
}

#[test]
fn fr_rt_008_splice_from_another_session_is_detected() {
    let fx = Fixture::new();
    let victim = session_with_turns(&fx, 2, None);
    let donor = session_with_turns(&fx, 2, None);
    let path = fx.ledger(&victim, "exec");
    let mut ls = lines(&path);
    ls[2] = lines(&fx.ledger(&donor, "exec"))[2].clone();
    write_lines(&path, &ls);
    assert_tampered(
        &fx,
        &victim,
        "exec",
        Some(3),
        Some(3),
        "spliced from another session",
    );
    // Even with the session id rewritten (and re-hashed), the link breaks.
    let mut v: Value = serde_json::from_str(&ls[2]).unwrap();
    v["session_id"] = json!(victim);
    ls[2] = canonical_line(v, true);
    write_lines(&path, &ls);
    assert_tampered(&fx, &victim, "exec", Some(3), Some(3), "does not link");
    // The whole donor ledger in place of the victim's fails at line 1.
    std::fs::copy(fx.ledger(&donor, "exec"), &path).unwrap();
    assert_tampered(
        &fx,
        &victim,
        "exec",
        Some(1),
        Some(1),
        "spliced from another session",
    );
}

#[test]
fn fr_rt_008_torn_last_line_is_detected() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    let path = fx.ledger(&sid, "exec");
    let content = std::fs::read(&path).unwrap();
    std::fs::write(&path, &content[..content.len() - 20]).unwrap();
    assert_tampered(&fx, &sid, "exec", Some(2), None, "torn line");
}

#[test]
fn fr_rt_008_duplicate_keys_are_detected() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    let path = fx.ledger(&sid, "exec");
    let mut ls = lines(&path);
    // Same bytes otherwise; a second `status` key would win in a lax parser.
    ls[1] = ls[1].replacen("{", "{\"status\":\"committed\",", 1);
    write_lines(&path, &ls);
    assert_tampered(&fx, &sid, "exec", Some(2), None, "duplicate key `status`");
}

#[test]
fn fr_rt_008_non_canonical_bytes_are_detected() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    let path = fx.ledger(&sid, "exec");
    let mut ls = lines(&path);
    ls[1] = ls[1].replacen(",", ", ", 1);
    write_lines(&path, &ls);
    assert_tampered(&fx, &sid, "exec", Some(2), Some(2), "not canonical");
}

#[test]
fn fr_rt_008_forged_appended_entry_is_detected() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    let path = fx.ledger(&sid, "exec");
    let mut ls = lines(&path);
    let mut v: Value = serde_json::from_str(&ls[1]).unwrap();
    v["previous_hash"] = v["entry_hash"].clone();
    v["seq"] = json!(3);
    v["turn_number"] = json!(2);
    ls.push(canonical_line(v, true));
    write_lines(&path, &ls);
    assert_tampered(&fx, &sid, "exec", None, Some(3), "only 2 were acknowledged");
    // And the supervisor refuses to append after it.
    let session = open(&fx, &sid);
    let lock = session.lock().unwrap();
    let Value::Object(m) = json!({"event": "x", "session_id": sid}) else {
        unreachable!()
    };
    let err = session
        .ledger(LedgerKind::Exec)
        .append(&lock, m)
        .unwrap_err();
    assert!(err.to_string().contains("bytes were acknowledged"), "{err}");
}

#[test]
fn fr_rt_008_missing_anchor_fails_closed() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    std::fs::remove_file(
        fx.state
            .join("sessions")
            .join(&sid)
            .join("anchors/evidence.json"),
    )
    .unwrap();
    assert_tampered(&fx, &sid, "evidence", None, None, "no head anchor");
}

#[test]
fn fr_rt_008_symlinked_ledger_is_refused() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    let path = fx.ledger(&sid, "exec");
    let copy = fx.root.join("copy.jsonl");
    std::fs::rename(&path, &copy).unwrap();
    std::os::unix::fs::symlink(&copy, &path).unwrap();
    assert_tampered(&fx, &sid, "exec", None, None, "not a regular file");
}

#[test]
fn fr_rt_008_legacy_entries_warn_as_a_prefix_and_fail_after_the_chain() {
    let fx = Fixture::new();
    let sid = fx.new_session();
    let session = SessionId::parse(&sid).unwrap();
    let path = fx.ledger(&sid, "exec");
    // A ledger imported from before hashing: one legacy entry, then the chain.
    let legacy = canonical::to_string(&json!({"event": "legacy", "turn_number": 0})).unwrap();
    let mut first: Value = serde_json::from_str(&lines(&path)[0]).unwrap();
    first["seq"] = json!(2);
    first["previous_hash"] = json!(genesis_hash(LedgerKind::Exec, &session));
    let first = canonical_line(first, true);
    write_lines(&path, &[legacy.clone(), first.clone()]);
    // Point the anchor at the new head so only the legacy handling is tested.
    let head: Value = serde_json::from_str(&first).unwrap();
    let anchor = json!({"entry_hash": head["entry_hash"], "ledger": "exec", "len": legacy.len() + first.len() + 2,
                        "seq": 2, "session_id": sid});
    std::fs::write(
        fx.state
            .join("sessions")
            .join(&sid)
            .join("anchors/exec.json"),
        canonical::to_string(&anchor).unwrap(),
    )
    .unwrap();
    let r = fx.supervise(&["ledger", "verify"], &["--session", &sid, "--json"]);
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    let v = r.json();
    assert_eq!(v["ledgers"][0]["legacy_entries"], 1);
    assert!(
        v["ledgers"][0]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("legacy entry")
    );
    assert!(
        r.stderr.contains("warning") && r.stderr.contains("line 1"),
        "{}",
        r.stderr
    );

    // A legacy (hash-stripped) entry after the chain is a downgrade.
    write_lines(&path, &[legacy.clone(), first, legacy]);
    assert_tampered(&fx, &sid, "exec", Some(3), None, "downgrade");
}

#[test]
fn fr_rt_008_text_output_names_the_entry() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 2, None);
    let path = fx.ledger(&sid, "exec");
    let mut ls = lines(&path);
    ls[1] = ls[1].replace("\"violation\"", "\"committed\"");
    write_lines(&path, &ls);
    let r = fx.supervise(&["ledger", "verify"], &["--session", &sid]);
    assert_eq!(r.status, 3);
    assert!(
        r.stdout.contains("exec.jsonl") && r.stdout.contains("TAMPERED"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("entry seq 2 (line 2)"), "{}", r.stdout);
    assert!(r.stdout.contains("evidence.jsonl  intact"), "{}", r.stdout);
    assert!(r.stderr.contains("TS1010 LEDGER_INTEGRITY"), "{}", r.stderr);
}

#[test]
fn fr_rt_008_append_refuses_after_a_same_length_edit_of_the_head() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    let path = fx.ledger(&sid, "exec");
    let content = std::fs::read_to_string(&path).unwrap();
    // Same length, different bytes: the length check alone cannot see it.
    let edited = content.replacen("\"status\":\"violation\"", "\"status\":\"violatiom\"", 1);
    assert_eq!(edited.len(), content.len());
    std::fs::write(&path, edited).unwrap();
    let session = open(&fx, &sid);
    let lock = session.lock().unwrap();
    let Value::Object(m) = json!({"event": "x", "session_id": sid}) else {
        unreachable!()
    };
    let err = session
        .ledger(LedgerKind::Exec)
        .append(&lock, m)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("differs from the acknowledged head"),
        "{err}"
    );
    assert_tampered(
        &fx,
        &sid,
        "exec",
        Some(2),
        Some(2),
        "does not match the content",
    );
}

/// Issue 29: a ledger large enough to be verified on several threads and
/// in more than one window of lines (4,500 entries of ~1 KB: past the
/// 256 KiB threshold and the 4,096-line window) verifies intact, and with
/// two problems planted in parts that different threads examine, the one
/// reported is the first a line-by-line pass meets — whatever its kind.
#[test]
fn issue_29_a_large_ledger_verified_in_parallel_names_its_first_problem() {
    let fx = Fixture::new();
    fx.install("hello-agent", HELLO_MANIFEST);
    let sid = fx.new_session();
    let session = open(&fx, &sid);
    let lock = session.lock().unwrap();
    for i in 0..4500u64 {
        let Value::Object(m) = json!({
            "event": "bulk",
            "session_id": sid,
            "turn_number": i,
            "payload": "p".repeat(900),
        }) else {
            unreachable!()
        };
        session.ledger(LedgerKind::Exec).append(&lock, m).unwrap();
    }
    drop(lock);
    let path = fx.ledger(&sid, "exec");
    let original = lines(&path);
    assert_eq!(original.len(), 4501, "session.started and 4,500 entries");
    assert!(std::fs::metadata(&path).unwrap().len() > 4 << 20);
    let (status, v) = verify(&fx, &sid);
    assert_eq!(status, 0, "{v}");
    let exec = v["ledgers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["ledger"] == "exec")
        .unwrap();
    assert_eq!(exec["entries"], 4501, "{v}");

    // Same length, new content, old hash: the hash no longer matches.
    let edited = |line: usize| {
        let mut v: Value = serde_json::from_str(&original[line - 1]).unwrap();
        v["payload"] = json!("q".repeat(900));
        canonical_line(v, false)
    };
    let rehashed = |line: usize| {
        let mut v: Value = serde_json::from_str(&original[line - 1]).unwrap();
        v["payload"] = json!("r".repeat(900));
        canonical_line(v, true)
    };
    let spaced = |line: usize| original[line - 1].replacen(",", ", ", 1);
    type Plant<'a> = (usize, &'a dyn Fn(usize) -> String);
    let cases: [(&[Plant<'_>], u64, &str); 4] = [
        // A hash mismatch late in the first window, a non-canonical line
        // in the second: the mismatch.
        (
            &[(3900, &edited), (4300, &spaced)],
            3900,
            "does not match the content",
        ),
        // A rehashed entry early (its successor no longer links) and a
        // mismatch in the other thread's half: the link.
        (
            &[(10, &rehashed), (3000, &edited)],
            11,
            "does not link to the previous entry",
        ),
        // A non-canonical line in the second half, a mismatch later.
        (&[(2500, &spaced), (4400, &edited)], 2500, "not canonical"),
        // Only in the second window.
        (&[(4450, &edited)], 4450, "does not match the content"),
    ];
    for (plants, line, needle) in cases {
        let mut ls = original.clone();
        for (at, plant) in plants {
            ls[at - 1] = plant(*at);
        }
        write_lines(&path, &ls);
        assert_tampered(&fx, &sid, "exec", Some(line), Some(line), needle);
    }
    write_lines(&path, &original);
    assert_intact(&fx, &sid);
}

/// Red-team (stop 54): a FIFO put in a ledger's place made `run`, `ledger
/// verify`, `report` and `health` hang for ever in open(2) or read(2) (a
/// SIGTERM did not end `run`: it held the session's lock, a mount and a
/// cgroup). Ledgers are opened O_NONBLOCK and must be regular files: each
/// command fails at once, exit 3, TS1010 naming the file. And `report
/// --html` over something that is not a regular file refuses to replace it
/// (it turned a FIFO, or `/dev/full`, into a regular file).
#[test]
fn a_fifo_in_place_of_a_ledger_fails_closed_at_once() {
    use std::os::unix::fs::FileTypeExt as _;
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 1, None);
    let ledger = fx.ledger(&sid, "exec");
    std::fs::remove_file(&ledger).unwrap();
    nix::unistd::mkfifo(&ledger, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let bounded = |words: &[&str], args: &[&str]| {
        let mut child = fx
            .command(&turnstile_tests::supervise_bin(), words, args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > until {
                let _ = child.kill();
                panic!("`supervise {words:?}` hung on a FIFO ledger");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (status, err) = bounded(&["ledger", "verify"], &["--session", &sid]);
    assert_eq!(status, 3, "{err}");
    assert!(
        err.contains("TS1010") && err.contains("not a regular file"),
        "{err}"
    );
    let html = fx.root.join("page.fifo");
    nix::unistd::mkfifo(&html, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let (status, err) = bounded(
        &["report"],
        &["--session", &sid, "--html", html.to_str().unwrap()],
    );
    assert_ne!(status, 0, "{err}");
    assert!(
        std::fs::symlink_metadata(&html)
            .unwrap()
            .file_type()
            .is_fifo(),
        "report replaced a FIFO with a file"
    );
    if nix::unistd::geteuid().is_root() {
        fx.install("t", r#"{"capabilities": {"execute": ["/usr/bin/true"]}}"#);
        let (status, err) = bounded(
            &["run"],
            &[
                "--package",
                "t",
                "--session",
                &sid,
                "--no-outputs",
                "--",
                "/usr/bin/true",
            ],
        );
        assert_eq!(status, 3, "{err}");
        assert!(
            err.contains("TS1010") && err.contains("not a regular file"),
            "{err}"
        );
    }
}

/// Red-team finding H2 (stop 54): an append checked the head entry and the
/// length, so a turn extended a chain edited further back (same length,
/// head untouched). Unless the ledger file is exactly as the supervisor's
/// last append left it (its change stamp, kept in the anchor), the whole
/// chain is verified first: the turn is refused (exit 3, TS1010 naming the
/// entry) and neither ledger changes.
#[test]
fn fr_rt_008_a_turn_refuses_to_extend_a_chain_edited_further_back() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 3, None);
    // Untouched, a turn appends (the stamp matches: no full verify needed).
    let r = fx.run(
        "hello-agent",
        &[
            "--session",
            &sid,
            "--json",
            "--no-outputs",
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(r.status, 0, "{} {}", r.stdout, r.stderr);
    assert_intact(&fx, &sid);
    for kind in ["exec", "evidence"] {
        let path = fx.ledger(&sid, kind);
        let before = std::fs::read(&path).unwrap();
        // `echo 1` of the second turn becomes `echo 7`: same length, an
        // interior entry, the head untouched.
        let needle = b"echo 1";
        let at = before
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap_or_else(|| panic!("{kind}: no `echo 1`"));
        let head_starts = before[..before.len() - 1]
            .iter()
            .rposition(|&b| b == b'\n')
            .unwrap();
        assert!(at < head_starts, "{kind}: the edit must not be the head");
        let mut edited = before.clone();
        edited[at + needle.len() - 1] = b'7';
        std::fs::write(&path, &edited).unwrap();
        let others: Vec<_> = ["exec", "evidence"]
            .iter()
            .map(|k| std::fs::read(fx.ledger(&sid, k)).unwrap())
            .collect();
        let r = fx.run(
            "hello-agent",
            &[
                "--session",
                &sid,
                "--json",
                "--no-outputs",
                "--",
                "/bin/true",
            ],
        );
        assert_eq!(r.status, 3, "{kind}: {} {}", r.stdout, r.stderr);
        let v = r.json();
        assert_eq!(v["error"]["code"], "TS1010", "{kind}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("{kind}.jsonl")),
            "{kind}: {v}"
        );
        let after: Vec<_> = ["exec", "evidence"]
            .iter()
            .map(|k| std::fs::read(fx.ledger(&sid, k)).unwrap())
            .collect();
        assert_eq!(others, after, "{kind}: a ledger changed");
        std::fs::write(&path, &before).unwrap();
    }
}

/// `explain`, `context` and `checkpoint` read the evidence ledger and
/// verified only it (red-team low, stop 54): an edited exec ledger went
/// unnoticed. A read of a session verifies both: exit 3, TS1010 naming
/// `exec.jsonl`, and the checkpoint is not written.
#[test]
fn fr_rt_008_reads_of_the_evidence_verify_the_exec_ledger_too() {
    let fx = Fixture::new();
    let sid = session_with_turns(&fx, 2, None);
    let path = fx.ledger(&sid, "exec");
    let mut ls = lines(&path);
    let mut v: Value = serde_json::from_str(&ls[1]).unwrap();
    v["status"] = json!("committed");
    ls[1] = canonical_line(v, false);
    write_lines(&path, &ls);
    for (words, extra) in [
        (vec!["explain"], vec!["--turn", "1"]),
        (vec!["context"], vec![]),
        (vec!["checkpoint"], vec![]),
    ] {
        let mut args = vec!["--json", "--session", sid.as_str()];
        args.extend(extra);
        let r = fx.supervise(&words, &args);
        assert_eq!(r.status, 3, "{words:?}: {}", r.stdout);
        let v = r.json();
        assert_eq!(v["error"]["code"], "TS1010", "{words:?}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("exec.jsonl"),
            "{words:?}: {v}"
        );
    }
    assert!(
        !fx.root
            .join(format!("planes/ho2/sessions/{sid}/checkpoints"))
            .exists(),
        "a checkpoint was written"
    );
}
