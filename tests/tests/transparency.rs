//! Issue 30: evidence an auditor can take away — signed checkpoints of a
//! session's ledgers, proofs, witnesses, in-toto attestations; and every
//! way of rewriting history after a checkpoint was handed out is caught,
//! with a stable code and the entry named.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use turnstile_policy::canonical;
use turnstile_policy::request::TurnRequest;
use turnstile_policy::{SessionId, Violations};
use turnstile_supervisor::ids::SystemClock;
use turnstile_supervisor::store::attest::{self, Envelope};
use turnstile_supervisor::store::layout::{StateDir, Workspace};
use turnstile_supervisor::store::session::Session;
use turnstile_supervisor::store::transparency as tp;
use turnstile_supervisor::turn::record_rejected_turn;
use turnstile_tests::{Fixture, HELLO_MANIFEST, Run, require_root, sha256_file};

fn open(fx: &Fixture, sid: &str) -> Session {
    let ws = Workspace::open(&fx.root).unwrap();
    let state = StateDir::open(&fx.state, &ws, false).unwrap();
    Session::open(&ws, &state, &SessionId::parse(sid).unwrap(), None).unwrap()
}

/// Appends `n` refused turns (no root needed) running `echo <tag><i>`.
fn add_turns(fx: &Fixture, sid: &str, n: usize, tag: &str) {
    let session = open(fx, sid);
    let ws = Workspace::open(&fx.root).unwrap();
    let manifest = turnstile_policy::Manifest::load(
        ws.root(),
        &turnstile_policy::PackageId::parse("hello-agent").unwrap(),
    )
    .unwrap();
    for i in 0..n {
        let req = json!({
            "command": ["/bin/sh", "-c", format!("echo {tag}{i}")],
            "declared_inputs": ["installed/hello-agent/secrets/key.pem"],
            "declared_outputs": [{"path": "output/<session_id>/r.md", "role": "report"}],
        });
        let req = TurnRequest::from_json(req.to_string().as_bytes()).unwrap();
        let bound = req.bind(&session.id).unwrap();
        let violations: Violations = turnstile_policy::check_turn(ws.root_str(), &manifest, &bound)
            .unwrap()
            .unwrap_err();
        let lock = session.lock().unwrap();
        record_rejected_turn(&session, &lock, &bound, "p", &violations, &SystemClock).unwrap();
    }
}

fn session(fx: &Fixture, turns: usize) -> String {
    fx.install("hello-agent", HELLO_MANIFEST);
    let sid = fx.new_session();
    add_turns(fx, &sid, turns, "t");
    sid
}

/// A key pair under the fixture's temp state dir's parent.
fn keygen(fx: &Fixture, name: &str) -> PathBuf {
    let path = fx.state.parent().unwrap().join("keys").join(name);
    let r = Fixture::raw(&["key", "generate", "--out", path.to_str().unwrap()]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    path
}

fn pubkey(key: &Path) -> PathBuf {
    tp::pub_path(key)
}

fn checkpoint(fx: &Fixture, sid: &str, key: &Path, extra: &[&str]) -> (PathBuf, Value) {
    let mut args = vec!["--session", sid, "--key", key.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let r = fx.supervise(&["ledger", "checkpoint"], &args);
    assert_eq!(r.status, 0, "{}", r.stderr);
    let v = r.json();
    // Hand the auditor a copy: later checkpoints may reuse a name.
    let kept = PathBuf::from(v["checkpoint"].as_str().unwrap());
    let copy = fx.state.parent().unwrap().join(format!(
        "handed-out-{}-{}",
        key.file_name().unwrap().to_string_lossy(),
        v["tree_size"].as_u64().unwrap()
    ));
    std::fs::copy(&kept, &copy).unwrap();
    (copy, v)
}

fn verify_cp(fx: &Fixture, sid: &str, cp: &Path, key: &Path, extra: &[&str]) -> Run {
    let pk = pubkey(key);
    let mut args = vec![
        "--session",
        sid,
        "--checkpoint",
        cp.to_str().unwrap(),
        "--pubkey",
        pk.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    fx.supervise(&["ledger", "verify"], &args)
}

/// Asserts a failure with `status`, `code` and `needle` in the message.
fn assert_fails(r: &Run, status: i32, code: &str, needle: &str) {
    assert_eq!(r.status, status, "{}{}", r.stdout, r.stderr);
    let all = format!("{}{}", r.stdout, r.stderr);
    assert!(all.contains(code), "no {code} in: {all}");
    assert!(all.contains(needle), "no `{needle}` in: {all}");
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What someone holding the state directory can do: rewrite a ledger with
/// every `previous_hash`/`entry_hash` recomputed and the anchor moved to
/// the new head. `edit` changes the entries (and may drop some).
fn rewrite(fx: &Fixture, sid: &str, kind: &str, edit: impl FnOnce(&mut Vec<Value>)) {
    let path = fx.ledger(sid, kind);
    let mut entries: Vec<Value> = lines(&path)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    edit(&mut entries);
    let kind_enum = match kind {
        "exec" => turnstile_supervisor::store::ledger::LedgerKind::Exec,
        _ => turnstile_supervisor::store::ledger::LedgerKind::Evidence,
    };
    let mut prev = turnstile_supervisor::store::ledger::genesis_hash(
        kind_enum,
        &SessionId::parse(sid).unwrap(),
    );
    let mut out = String::new();
    let mut head = json!(null);
    for (i, e) in entries.iter_mut().enumerate() {
        let m = e.as_object_mut().unwrap();
        m.remove("entry_hash");
        m.insert("seq".into(), json!(i + 1));
        m.insert("previous_hash".into(), json!(prev));
        prev = canonical::hash_value(&Value::Object(m.clone())).unwrap();
        m.insert("entry_hash".into(), json!(prev));
        out += &canonical::to_string(e).unwrap();
        out.push('\n');
        head = e.clone();
    }
    std::fs::write(&path, &out).unwrap();
    let anchor = json!({"entry_hash": head["entry_hash"], "ledger": kind, "len": out.len(),
                        "seq": entries.len(), "session_id": sid});
    std::fs::write(
        fx.state
            .join("sessions")
            .join(sid)
            .join(format!("anchors/{kind}.json")),
        canonical::to_string(&anchor).unwrap(),
    )
    .unwrap();
}

#[test]
fn issue_30_key_generate_writes_0600_and_refuses_to_overwrite() {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new();
    let key = keygen(&fx, "supervisor");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(&pubkey(&key)), 0o644);
    let public = std::fs::read_to_string(pubkey(&key)).unwrap();
    assert!(public.starts_with("supervisor+"), "{public}");
    assert!(!public.contains("PRIVATE"));
    let before = std::fs::read(&key).unwrap();
    let r = Fixture::raw(&["key", "generate", "--out", key.to_str().unwrap()]);
    assert_fails(&r, 2, "TS1063", "refusing to overwrite");
    assert_eq!(std::fs::read(&key).unwrap(), before);
    // A private key others can read is refused.
    let sid = session(&fx, 1);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = fx.supervise(
        &["ledger", "checkpoint"],
        &["--session", &sid, "--key", key.to_str().unwrap()],
    );
    assert_fails(&r, 2, "TS1063", "chmod 600");
}

#[test]
fn issue_30_checkpoint_verifies_and_its_proofs_check() {
    let fx = Fixture::new();
    let sid = session(&fx, 3);
    let key = keygen(&fx, "supervisor");
    let (cp, v) = checkpoint(&fx, &sid, &key, &[]);
    let note = v["note"].as_str().unwrap();
    let mut body = note.lines();
    assert_eq!(body.next().unwrap(), format!("turnstile/{sid}"));
    let size: u64 = body.next().unwrap().parse().unwrap();
    let root = tp::parse_hash_b64(body.next().unwrap()).unwrap();
    assert!(note.contains("\n\n— supervisor "), "{note}");
    let exec = lines(&fx.ledger(&sid, "exec")).len() as u64;
    let evidence = lines(&fx.ledger(&sid, "evidence")).len() as u64;
    assert_eq!(size, exec + evidence);

    let r = verify_cp(&fx, &sid, &cp, &key, &[]);
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("checkpoint      matches"), "{}", r.stdout);

    for i in 0..size {
        let r = fx.supervise(
            &["ledger", "prove"],
            &["--session", &sid, "--inclusion", &i.to_string(), "--json"],
        );
        assert_eq!(r.status, 0, "{}", r.stderr);
        let p = r.json();
        let proof: Vec<_> = p["proof"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| tp::parse_hash_b64(h.as_str().unwrap()).unwrap())
            .collect();
        let leaf = tp::parse_hash_b64(p["leaf_hash"].as_str().unwrap()).unwrap();
        assert!(tp::check_inclusion(&proof, size, root, i, leaf), "leaf {i}");
        assert!(!tp::check_inclusion(&proof, size, root, (i + 1) % size, leaf) || size == 1);
    }
    // Out of range: bad input.
    let r = fx.supervise(
        &["ledger", "prove"],
        &["--session", &sid, "--inclusion", &size.to_string()],
    );
    assert_fails(&r, 2, "TS1006", "not in a tree");

    // Consistency from this checkpoint to a longer ledger.
    add_turns(&fx, &sid, 2, "later");
    let r = fx.supervise(
        &["ledger", "prove"],
        &[
            "--session",
            &sid,
            "--consistency",
            &size.to_string(),
            "--json",
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let p = r.json();
    let proof: Vec<_> = p["proof"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| tp::parse_hash_b64(h.as_str().unwrap()).unwrap())
        .collect();
    let new_size = p["tree_size"].as_u64().unwrap();
    let new_root = tp::parse_hash_b64(p["root_hash"].as_str().unwrap()).unwrap();
    assert_eq!(new_size, size + 4);
    assert!(tp::check_consistency(
        &proof, new_size, new_root, size, root
    ));
}

#[test]
fn issue_30_a_rehashed_rewrite_passes_ledger_verify_but_not_the_checkpoint() {
    let fx = Fixture::new();
    let sid = session(&fx, 3);
    let key = keygen(&fx, "supervisor");
    let (cp, _) = checkpoint(&fx, &sid, &key, &[]);
    // Rewrite the evidence of turn 1 (line 2) as if it had been committed.
    rewrite(&fx, &sid, "evidence", |e| {
        e[1]["status"] = json!("committed");
        e[1]["violations"] = json!([]);
    });
    fx.assert_ledgers_intact(&sid);
    let r = verify_cp(&fx, &sid, &cp, &key, &[]);
    assert_fails(
        &r,
        3,
        "TS1060",
        "first entry that differs from the signed checkpoint: evidence.jsonl seq 2",
    );
    let r = verify_cp(&fx, &sid, &cp, &key, &["--json"]);
    assert_eq!(r.status, 3);
    assert_eq!(r.json()["error"]["code"], "TS1060");
}

#[test]
fn issue_30_truncation_after_a_checkpoint_is_caught() {
    let fx = Fixture::new();
    let sid = session(&fx, 3);
    let key = keygen(&fx, "supervisor");
    let (cp, _) = checkpoint(&fx, &sid, &key, &[]);
    let exec = lines(&fx.ledger(&sid, "exec")).len();
    rewrite(&fx, &sid, "exec", |e| e.truncate(exec - 1));
    fx.assert_ledgers_intact(&sid);
    let r = verify_cp(&fx, &sid, &cp, &key, &[]);
    assert_fails(
        &r,
        3,
        "TS1060",
        &format!("truncated, first missing entry exec.jsonl seq {exec}"),
    );
}

#[test]
fn issue_30_a_forked_history_fails_the_other_branchs_checkpoint() {
    let fx = Fixture::new();
    let sid = session(&fx, 2);
    let key = keygen(&fx, "supervisor");
    let (cp1, _) = checkpoint(&fx, &sid, &key, &[]);
    // Save the state at the checkpoint: ledgers and anchors.
    let saved = fx.state.parent().unwrap().join("saved");
    let files = [
        fx.ledger(&sid, "exec"),
        fx.ledger(&sid, "evidence"),
        fx.state
            .join("sessions")
            .join(&sid)
            .join("anchors/exec.json"),
        fx.state
            .join("sessions")
            .join(&sid)
            .join("anchors/evidence.json"),
    ];
    std::fs::create_dir_all(&saved).unwrap();
    for (i, f) in files.iter().enumerate() {
        std::fs::copy(f, saved.join(i.to_string())).unwrap();
    }
    // History A.
    add_turns(&fx, &sid, 1, "branch-a");
    let (cp_a, _) = checkpoint(&fx, &sid, &key, &[]);
    // History B from the same checkpoint.
    for (i, f) in files.iter().enumerate() {
        std::fs::copy(saved.join(i.to_string()), f).unwrap();
    }
    add_turns(&fx, &sid, 1, "branch-b");
    fx.assert_ledgers_intact(&sid);
    // Both branches extend the first checkpoint...
    let r = verify_cp(&fx, &sid, &cp1, &key, &[]);
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    // ...but B is not what A's checkpoint signed.
    let r = verify_cp(&fx, &sid, &cp_a, &key, &[]);
    assert_fails(
        &r,
        3,
        "TS1060",
        "first entry that differs from the signed checkpoint: exec.jsonl seq",
    );
}

#[test]
fn issue_30_an_old_checkpoint_replayed_against_a_newer_ledger_is_consistent() {
    let fx = Fixture::new();
    let sid = session(&fx, 1);
    let key = keygen(&fx, "supervisor");
    let (old, v) = checkpoint(&fx, &sid, &key, &[]);
    add_turns(&fx, &sid, 3, "more");
    let (_new, v2) = checkpoint(&fx, &sid, &key, &[]);
    assert!(v2["tree_size"].as_u64() > v["tree_size"].as_u64());
    let r = verify_cp(&fx, &sid, &old, &key, &["--json"]);
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    let j = r.json();
    assert_eq!(j["checkpoint"]["consistent"], true, "{j}");
    assert_eq!(j["checkpoint"]["tree_size"], v["tree_size"]);
    assert_eq!(j["checkpoint"]["ledger_size"], v2["tree_size"]);
}

#[test]
fn issue_30_wrong_key_and_bad_note_syntax_are_refused() {
    let fx = Fixture::new();
    let sid = session(&fx, 1);
    let key = keygen(&fx, "supervisor");
    let other = keygen(&fx, "impostor");
    let (cp, _) = checkpoint(&fx, &sid, &key, &[]);
    // Verified with another key.
    let r = verify_cp(&fx, &sid, &cp, &other, &[]);
    assert_fails(&r, 3, "TS1061", "not signed by any key given");
    // Signed by another key.
    let (cp_other, _) = checkpoint(&fx, &sid, &other, &[]);
    let r = verify_cp(&fx, &sid, &cp_other, &key, &[]);
    assert_fails(&r, 3, "TS1061", "signed by: impostor");
    // A body changed under the signature.
    let text = std::fs::read_to_string(&cp).unwrap();
    let mut forged: Vec<String> = text.lines().map(str::to_owned).collect();
    forged[2] = tp::hash_b64(&tp::Hash([7u8; 32]));
    let forged_path = cp.with_extension("forged");
    std::fs::write(&forged_path, forged.join("\n") + "\n").unwrap();
    let r = verify_cp(&fx, &sid, &forged_path, &key, &[]);
    assert_fails(&r, 3, "TS1061", "changed after it was signed");
    // Not a signed note at all.
    let garbage = cp.with_extension("garbage");
    std::fs::write(&garbage, "hello\n").unwrap();
    let r = verify_cp(&fx, &sid, &garbage, &key, &[]);
    assert_fails(&r, 2, "TS1062", "signed-note");
    // A note whose body is not a checkpoint.
    let body = text.replacen(&format!("turnstile/{sid}\n"), "", 1);
    std::fs::write(&garbage, body).unwrap();
    let r = verify_cp(&fx, &sid, &garbage, &key, &[]);
    assert_fails(&r, 2, "TS1062", "malformed");
}

#[test]
fn issue_30_witnesses_cosign_and_are_counted() {
    let fx = Fixture::new();
    let sid = session(&fx, 1);
    let key = keygen(&fx, "supervisor");
    let w1 = keygen(&fx, "witness-one");
    let w2 = keygen(&fx, "witness-two");
    let inbox = fx.state.parent().unwrap().join("inbox");
    let (cp, v) = checkpoint(&fx, &sid, &key, &["--witness", inbox.to_str().unwrap()]);
    let copy = PathBuf::from(v["witness_copies"][0].as_str().unwrap());
    assert!(copy.starts_with(&inbox));
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&cp).unwrap());
    let (w1p, w2p) = (pubkey(&w1), pubkey(&w2));
    let wargs = |n: &'static str| {
        vec![
            "--witness-key".to_owned(),
            w1p.to_str().unwrap().to_owned(),
            "--witness-key".to_owned(),
            w2p.to_str().unwrap().to_owned(),
            "--witnesses-required".to_owned(),
            n.to_owned(),
        ]
    };
    let run = |n: &'static str| {
        let a = wargs(n);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        verify_cp(&fx, &sid, &cp, &key, &a)
    };
    assert_fails(&run("1"), 3, "TS1061", "0 of the 2 witness key(s)");
    let cosign = |k: &Path| {
        let r = Fixture::raw(&[
            "ledger",
            "cosign",
            "--checkpoint",
            cp.to_str().unwrap(),
            "--key",
            k.to_str().unwrap(),
        ]);
        assert_eq!(r.status, 0, "{}", r.stderr);
    };
    cosign(&w1);
    let r = run("1");
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("witnesses witness-one"), "{}", r.stdout);
    assert_fails(&run("2"), 3, "TS1061", "1 of the 2 witness key(s)");
    cosign(&w2);
    assert_eq!(run("2").status, 0);
    assert_eq!(
        std::fs::read_to_string(&cp)
            .unwrap()
            .matches("\n— ")
            .count(),
        3
    );
}

#[test]
fn issue_30_an_auditors_copy_without_state_verifies_against_the_checkpoint() {
    let fx = Fixture::new();
    let sid = session(&fx, 2);
    let key = keygen(&fx, "supervisor");
    let (cp, _) = checkpoint(&fx, &sid, &key, &[]);
    let empty = tempfile::tempdir().unwrap();
    let pk = pubkey(&key);
    let args = |state: &Path| {
        Fixture::raw(&[
            "ledger",
            "verify",
            "--root",
            fx.root.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--session",
            &sid,
            "--checkpoint",
            cp.to_str().unwrap(),
            "--pubkey",
            pk.to_str().unwrap(),
        ])
    };
    let r = args(empty.path());
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("no head anchors here"), "{}", r.stderr);
    // Without a checkpoint the missing anchors still fail, as before.
    let r = Fixture::raw(&[
        "ledger",
        "verify",
        "--root",
        fx.root.to_str().unwrap(),
        "--state-dir",
        empty.path().to_str().unwrap(),
        "--session",
        &sid,
    ]);
    assert_fails(&r, 3, "TS1010", "anchor");
}

const RUN_MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["installed/t/**"],
    "write": ["output/<session_id>/**"],
    "execute": ["/bin/sh"]
  },
  "limits": {"memory": "128Mi", "pids": 32, "timeout_seconds": 20}
}"#;

#[test]
fn issue_30_in_toto_envelopes_verify_and_name_the_committed_files() {
    if !require_root("issue_30_in_toto_envelopes_verify_and_name_the_committed_files") {
        return;
    }
    let fx = Fixture::new();
    fx.install("t", RUN_MANIFEST);
    let r = fx.run(
        "t",
        &[
            "--json",
            "--output",
            "output/<session_id>/a.txt:report",
            "--output",
            "output/<session_id>/b.txt:report",
            "--",
            "/bin/sh",
            "-c",
            "echo alpha > output/$TURNSTILE_SESSION_ID/a.txt; echo beta > output/$TURNSTILE_SESSION_ID/b.txt",
        ],
    );
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    let sid = r.json()["session_id"].as_str().unwrap().to_owned();
    let key = keygen(&fx, "supervisor");
    let out = fx.state.parent().unwrap().join("att");
    let r = fx.supervise(
        &["ledger", "export"],
        &[
            "--session",
            &sid,
            "--format",
            "in-toto",
            "--key",
            key.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let env: Envelope =
        serde_json::from_slice(&std::fs::read(out.join("turn-1.intoto.json")).unwrap()).unwrap();
    assert_eq!(env.payload_type, "application/vnd.in-toto+json");
    // Verify the DSSE signature independently: PAE over the payload, with
    // the raw Ed25519 key from the PEM.
    let pem = std::fs::read_to_string(format!("{}.pub.pem", key.display())).unwrap();
    let der = B64
        .decode(
            pem.lines()
                .filter(|l| !l.starts_with("-----"))
                .collect::<String>(),
        )
        .unwrap();
    let vk = ed25519_dalek::VerifyingKey::from_bytes(der[12..].try_into().unwrap()).unwrap();
    let payload = B64.decode(&env.payload).unwrap();
    let pae = [
        format!(
            "DSSEv1 {} {} {} ",
            env.payload_type.len(),
            env.payload_type,
            payload.len()
        )
        .into_bytes(),
        payload.clone(),
    ]
    .concat();
    let sig =
        ed25519_dalek::Signature::from_slice(&B64.decode(&env.signatures[0].sig).unwrap()).unwrap();
    vk.verify_strict(&pae, &sig).unwrap();
    let st = attest::open(&env, &vk).unwrap();
    assert_eq!(st.statement_type, "https://in-toto.io/Statement/v1");
    let mut subjects: Vec<(String, String)> = st
        .subject
        .iter()
        .map(|s| (s.name.clone(), s.digest.sha256.clone()))
        .collect();
    subjects.sort();
    let want: Vec<(String, String)> = ["a.txt", "b.txt"]
        .iter()
        .map(|f| {
            let rel = format!("output/{sid}/{f}");
            (rel.clone(), sha256_file(&fx.root.join(&rel)))
        })
        .collect();
    assert_eq!(subjects, want);
    assert_eq!(st.predicate.turn_number, 1);
    assert!(st.predicate.enforcement.is_some());
    // The checkpoint it cites includes its evidence entry.
    let cp = &st.predicate.checkpoint;
    let root = tp::parse_hash_b64(&cp.root_hash).unwrap();
    let proof: Vec<_> = cp
        .inclusion_proof
        .iter()
        .map(|h| tp::parse_hash_b64(h).unwrap())
        .collect();
    let evidence = lines(&fx.ledger(&sid, "evidence"));
    let entry = &evidence[st.predicate.evidence_entry.seq as usize - 1];
    let leaf = tlog_leaf(entry.as_bytes());
    assert!(tp::check_inclusion(
        &proof,
        cp.tree_size,
        root,
        st.predicate.evidence_entry.leaf_index,
        leaf
    ));
    // A forged payload does not verify.
    let mut forged = env.clone();
    forged.payload = B64.encode(
        String::from_utf8(payload)
            .unwrap()
            .replace("a.txt", "z.txt"),
    );
    assert!(attest::open(&forged, &vk).is_err());
}

/// RFC 6962 leaf hash, computed here: SHA-256(0x00 || line).
fn tlog_leaf(line: &[u8]) -> tp::Hash {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(line);
    tp::Hash(h.finalize().into())
}
