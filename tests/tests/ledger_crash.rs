//! FR-RT-008 across crashes, at the ledger level and deterministically: an
//! append stopped at each step of its write-ahead protocol (and torn in the
//! middle of its bytes, and a torn anchor slot) is reported by `ledger
//! verify` as a warning — never as tampering — and settled by the next
//! writer: completed when every byte of its group landed, discarded (with a
//! `ledger.recovered` entry naming the bytes' sha256) otherwise. Forged
//! bytes without an announcement stay tampering.

use serde_json::{Map, Value, json};
use turnstile_policy::SessionId;
use turnstile_supervisor::store::layout::{StateDir, Workspace};
use turnstile_supervisor::store::ledger::{self, AppendStep, LedgerKind};
use turnstile_supervisor::store::session::Session;
use turnstile_tests::{Fixture, read_entries};

fn open(fx: &Fixture, sid: &str) -> Session {
    let ws = Workspace::open(&fx.root).unwrap();
    let state = StateDir::open(&fx.state, &ws, false).unwrap();
    Session::open(&ws, &state, &SessionId::parse(sid).unwrap(), None).unwrap()
}

fn entry(sid: &str, n: u64) -> Map<String, Value> {
    let Value::Object(m) = json!({"event": "note", "session_id": sid, "n": n}) else {
        unreachable!()
    };
    m
}

fn verify(fx: &Fixture, sid: &str) -> (i32, Value, String) {
    let r = fx.supervise(&["ledger", "verify"], &["--session", sid, "--json"]);
    (r.status, r.json(), r.stderr)
}

/// Stops a two-ledger group append at `step`, then optionally tears the
/// exec ledger's new bytes to `keep` of them.
fn interrupted(step: AppendStep, tear_exec_to: Option<u64>) -> (Fixture, String) {
    let fx = Fixture::new();
    let sid = fx.new_session();
    let session = open(&fx, &sid);
    let lock = session.lock().unwrap();
    let (exec, evidence) = (
        session.ledger(LedgerKind::Exec),
        session.ledger(LedgerKind::Evidence),
    );
    let before = std::fs::metadata(&exec.path).unwrap().len();
    ledger::append_group_until(
        &lock,
        vec![
            (&exec, vec![entry(&sid, 1), entry(&sid, 2)]),
            (&evidence, vec![entry(&sid, 1)]),
        ],
        step,
    )
    .unwrap();
    if let Some(keep) = tear_exec_to {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&exec.path)
            .unwrap();
        f.set_len(before + keep).unwrap();
    }
    (fx, sid)
}

fn settle(fx: &Fixture, sid: &str) -> Vec<ledger::TailRecovery> {
    let session = open(fx, sid);
    let lock = session.lock().unwrap();
    let files: Vec<_> = LedgerKind::ALL.iter().map(|k| session.ledger(*k)).collect();
    ledger::recover_tails(&lock, &files, "2026-01-01T00:00:00.000000Z").unwrap()
}

fn notes(fx: &Fixture, sid: &str, kind: &str) -> usize {
    read_entries(&fx.ledger(sid, kind))
        .iter()
        .filter(|e| e["event"] == "note")
        .count()
}

#[test]
fn fr_rt_008_crash_after_the_announcement_is_clean() {
    let (fx, sid) = interrupted(AppendStep::Announced, None);
    let (status, _, _) = verify(&fx, &sid);
    assert_eq!(status, 0);
    assert!(
        settle(&fx, &sid).is_empty(),
        "nothing landed, nothing to record"
    );
    assert_eq!(verify(&fx, &sid).0, 0);
    assert_eq!(notes(&fx, &sid, "exec"), 0);
}

#[test]
fn fr_rt_008_crash_after_every_byte_landed_is_completed() {
    let (fx, sid) = interrupted(AppendStep::Written, None);
    let (status, v, stderr) = verify(&fx, &sid);
    assert_eq!(status, 0, "an interrupted append is not tampering: {v}");
    assert!(stderr.contains("never acknowledged"), "{stderr}");
    let done = settle(&fx, &sid);
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|d| d.action == "completed"));
    assert_eq!(verify(&fx, &sid).0, 0);
    assert_eq!(notes(&fx, &sid, "exec"), 2);
    assert_eq!(notes(&fx, &sid, "evidence"), 1);
    let recovered: Vec<Value> = read_entries(&fx.ledger(&sid, "exec"))
        .into_iter()
        .filter(|e| e["event"] == "ledger.recovered")
        .collect();
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0]["action"], "completed");
}

#[test]
fn fr_rt_008_torn_bytes_are_discarded_with_their_hash_and_the_whole_group_goes() {
    for keep in [1u64, 40, 200] {
        let (fx, sid) = interrupted(AppendStep::Written, Some(keep));
        let exec = fx.ledger(&sid, "exec");
        let content = std::fs::read(&exec).unwrap();
        let (status, _, stderr) = verify(&fx, &sid);
        assert_eq!(status, 0, "torn at {keep}: {stderr}");
        assert!(stderr.contains("unfinished append"), "{stderr}");
        let done = settle(&fx, &sid);
        // The evidence half was whole, but a group lands together or not
        // at all: both are cut back.
        assert_eq!(done.len(), 2, "{done:?}");
        assert!(done.iter().all(|d| d.action == "discarded"));
        let torn = done.iter().find(|d| d.kind == LedgerKind::Exec).unwrap();
        assert_eq!(torn.bytes, keep);
        let tail = &content[content.len() - keep as usize..];
        assert_eq!(torn.sha256, turnstile_policy::canonical::sha256_hex(tail));
        assert_eq!(verify(&fx, &sid).0, 0);
        assert_eq!(notes(&fx, &sid, "exec"), 0);
        assert_eq!(notes(&fx, &sid, "evidence"), 0);
        let recovered: Vec<Value> = read_entries(&exec)
            .into_iter()
            .filter(|e| e["event"] == "ledger.recovered")
            .collect();
        assert_eq!(recovered[0]["sha256"], json!(torn.sha256));
        // And the session goes on.
        let session = open(&fx, &sid);
        let lock = session.lock().unwrap();
        session
            .ledger(LedgerKind::Exec)
            .append(&lock, entry(&sid, 9))
            .unwrap();
        drop(lock);
        assert_eq!(verify(&fx, &sid).0, 0);
    }
}

#[test]
fn fr_rt_008_a_torn_anchor_slot_leaves_the_previous_state_standing() {
    let fx = Fixture::new();
    let sid = fx.new_session();
    let session = open(&fx, &sid);
    let lock = session.lock().unwrap();
    let exec = session.ledger(LedgerKind::Exec);
    exec.append(&lock, entry(&sid, 1)).unwrap();
    drop(lock);
    // Tear the newest slot: flip a byte in it.
    let bytes = std::fs::read(&exec.anchor).unwrap();
    assert_eq!(bytes.len(), 2048);
    let anchor = exec.anchor().unwrap().unwrap();
    let slot = (anchor.generation % 2) as usize;
    let mut torn = bytes.clone();
    torn[slot * 1024 + 100] ^= 0x20;
    std::fs::write(&exec.anchor, &torn).unwrap();
    // The older slot is the announcement of that append: whole bytes →
    // the next writer completes it.
    let (status, _, stderr) = verify(&fx, &sid);
    assert_eq!(status, 0, "{stderr}");
    settle(&fx, &sid);
    assert_eq!(verify(&fx, &sid).0, 0);
    assert_eq!(notes(&fx, &sid, "exec"), 1);
}

#[test]
fn fr_rt_008_bytes_beyond_the_anchor_without_an_announcement_stay_tampering() {
    let (fx, sid) = interrupted(AppendStep::Acknowledged, None);
    let exec = fx.ledger(&sid, "exec");
    let mut content = std::fs::read(&exec).unwrap();
    let last = content[..content.len() - 1]
        .iter()
        .rposition(|&b| b == b'\n')
        .unwrap();
    let dup = content[last + 1..].to_vec();
    content.extend_from_slice(&dup);
    std::fs::write(&exec, &content).unwrap();
    assert_eq!(verify(&fx, &sid).0, 3);
    // Recovery does not bless it either.
    assert!(settle(&fx, &sid).is_empty());
    assert_eq!(verify(&fx, &sid).0, 3);
}
