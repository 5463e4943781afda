//! A session's context, reconstructed from its ledgers (FR-RT-009, seed 004
//! "Context from Ledgers"): HO2 checkpoints accelerate it.
//!
//! The context is a fold of the evidence ledger's entries: the turns (number,
//! status, command, exit code, time), the committed outputs with their
//! hashes (last writer wins), the scratch paths the turns left, and every
//! violation. A checkpoint (`planes/ho2/sessions/<sid>/checkpoints/<ts>.json`)
//! is that fold up to one entry, bound to the entry's `seq` and
//! `entry_hash` and hashed itself; `context --as-of TS` takes the latest
//! checkpoint whose entry is not after TS, folds only the entries since,
//! and is equal to a fold from the start. A checkpoint that does not match
//! the ledger it claims to cover is an IntegrityError (exit 3).

use std::path::PathBuf;

use serde_json::{Map, Value, json};
use turnstile_policy::canonical;

use crate::error::{Result, SupervisorError};
use crate::store::integrity::{IntegrityError, Problem};
use crate::store::ledger::LedgerKind;
use crate::store::session::{Session, SessionLock};

/// Version of the checkpoint format.
pub const CHECKPOINT_VERSION: u64 = 1;

/// The empty context of a session.
pub fn empty(session: &str) -> Value {
    json!({"session_id": session, "turns": [], "outputs": {}, "scratch": {}, "violations": []})
}

/// Folds one evidence entry into `state`.
pub fn fold(state: &mut Value, entry: &Value) {
    if entry["event"] != "turn.finished" {
        return;
    }
    let turn = json!({
        "turn_number": entry["turn_number"],
        "status": entry["status"],
        "command": entry["command"],
        "exit_code": entry["exit_code"],
        "ts": entry["ts"],
    });
    if let Some(t) = state["turns"].as_array_mut() {
        t.push(turn);
    }
    if let Some(outputs) = state["outputs"].as_object_mut() {
        for c in entry["committed"].as_array().into_iter().flatten() {
            if let Some(p) = c["path"].as_str() {
                outputs.insert(
                    p.to_owned(),
                    json!({"sha256": c["sha256"], "size": c["size"], "turn_number": entry["turn_number"]}),
                );
            }
        }
    }
    if entry["status"] == "committed" {
        if let Some(scratch) = state["scratch"].as_object_mut() {
            for w in entry["scratch_writes"].as_array().into_iter().flatten() {
                if let Some(p) = w["path"].as_str() {
                    if w["kind"] == "deleted" {
                        scratch.remove(p);
                    } else {
                        scratch.insert(p.to_owned(), w.clone());
                    }
                }
            }
        }
    }
    if let Some(v) = state["violations"].as_array_mut() {
        for x in entry["violations"].as_array().into_iter().flatten() {
            v.push(x.clone());
        }
    }
}

fn dir(session: &Session) -> PathBuf {
    session
        .workspace()
        .root()
        .join("planes/ho2/sessions")
        .join(session.id.as_str())
        .join("checkpoints")
}

fn tampered(path: &std::path::Path, detail: String) -> SupervisorError {
    SupervisorError::Integrity(IntegrityError {
        ledger: path.to_path_buf(),
        line: None,
        seq: None,
        problem: Problem::Checkpoint(detail),
    })
}

/// The checkpoint body's hash (everything but `checkpoint_hash`).
fn body_hash(c: &Value) -> String {
    let mut body = c.clone();
    if let Some(m) = body.as_object_mut() {
        m.remove("checkpoint_hash");
    }
    canonical::hash_value(&body).unwrap_or_default()
}

/// Writes a checkpoint of everything the evidence ledger holds now.
pub fn checkpoint(session: &Session, _lock: &SessionLock) -> Result<(PathBuf, Value)> {
    let entries = session.ledger(LedgerKind::Evidence).verified_entries()?;
    let mut state = empty(session.id.as_str());
    for e in &entries {
        fold(&mut state, e);
    }
    let last = entries.last().cloned().unwrap_or(Value::Null);
    let mut c = json!({
        "schema_version": CHECKPOINT_VERSION,
        "session_id": session.id.as_str(),
        "covers": {"ledger": "evidence", "seq": last["seq"], "entry_hash": last["entry_hash"], "ts": last["ts"]},
        "state": state,
    });
    let hash = body_hash(&c);
    c["checkpoint_hash"] = json!(hash);
    let d = dir(session);
    crate::fsx::create_dir_all(&d)?;
    // Named by the covered entry's time (sortable) and seq.
    let ts = last["ts"].as_str().unwrap_or("0").replace(':', "");
    let path = d.join(format!("{ts}-{}.json", last["seq"]));
    crate::fsx::write_atomic(&path, format!("{c}\n").as_bytes())?;
    Ok((path, c))
}

/// The context as of `as_of` (an RFC 3339 UTC time; `None`: now), from the
/// latest checkpoint not after it plus the entries since.
pub fn context(session: &Session, as_of: Option<&str>) -> Result<Value> {
    let entries = session.ledger(LedgerKind::Evidence).verified_entries()?;
    let within = |e: &Value| as_of.is_none_or(|t| e["ts"].as_str().is_some_and(|ts| ts <= t));
    // The checkpoints, newest first; the first that is not after `as_of`.
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir(session))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut base: Option<(PathBuf, Value)> = None;
    for path in files.iter().rev() {
        let bytes =
            crate::fsx::read_small(path, 64 << 20).map_err(|e| tampered(path, e.to_string()))?;
        let c: Value =
            serde_json::from_slice(&bytes).map_err(|e| tampered(path, format!("not JSON: {e}")))?;
        let covers = &c["covers"];
        let ts_ok = as_of.is_none_or(|t| covers["ts"].as_str().is_some_and(|ts| ts <= t));
        if !ts_ok {
            continue;
        }
        base = Some((path.clone(), c));
        break;
    }
    let (mut state, from_seq, used) = match base {
        None => (empty(session.id.as_str()), 0, Value::Null),
        Some((path, c)) => {
            if c["checkpoint_hash"] != json!(body_hash(&c)) {
                return Err(tampered(
                    &path,
                    "its hash does not match its content".into(),
                ));
            }
            if c["session_id"] != session.id.as_str() {
                return Err(tampered(&path, "it belongs to another session".into()));
            }
            let seq = c["covers"]["seq"].as_u64().unwrap_or(0);
            let entry = entries.iter().find(|e| e["seq"].as_u64() == Some(seq));
            if entry.map(|e| &e["entry_hash"]) != Some(&c["covers"]["entry_hash"]) {
                return Err(tampered(
                    &path,
                    format!("it claims to cover evidence entry {seq}, whose hash differs"),
                ));
            }
            (c["state"].clone(), seq, json!(path.display().to_string()))
        }
    };
    let mut replayed = 0u64;
    for e in entries
        .iter()
        .filter(|e| e["seq"].as_u64().is_some_and(|s| s > from_seq))
        .filter(|e| within(e))
    {
        fold(&mut state, e);
        replayed += 1;
    }
    let mut out = Map::new();
    out.insert("as_of".into(), json!(as_of));
    out.insert("checkpoint".into(), used);
    out.insert("entries_replayed".into(), json!(replayed));
    out.insert("context".into(), state);
    Ok(Value::Object(out))
}
