//! Exactly-once turns (seed 001 "Delivery Semantics", issue 13): a turn
//! with an idempotency key that already ran is not run again.
//!
//! The record lives in the supervisor's state dir, one file per key and
//! session: `sessions/<sid>/idempotency/<sha256(key)>.json`. It is written
//! (atomically, fsync'd, directory fsync'd) under the session lock **before
//! the turn's intent entry** — so before any effect of the turn — naming the
//! request's hash and the turn number; the turn's `--json` result and exit
//! status are added once its finish entries are durable.
//!
//! Replays: a record with a result returns it (`"replayed": true`). A record
//! without one is a turn whose supervisor died: recovery (which always runs
//! first, under the same lock) closed it in the ledgers, so the result is
//! rebuilt from its finish entry — unless the turn never began (the
//! supervisor died between the record and the intent entry: no entry of
//! that turn exists), in which case nothing of it happened and it runs now. Either way nothing runs and nothing is
//! appended. The same key with a different request is a conflict (exit 2,
//! TS1008, both hashes named). Concurrent runs with one key serialize on
//! the session lock: the first runs, the others find its record.

use std::path::PathBuf;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use turnstile_policy::canonical;
use turnstile_policy::request::BoundRequest;

use crate::error::{Result, SupervisorError};
use crate::store::ledger::LedgerKind;
use crate::store::session::{Session, SessionLock};
use crate::store::status::{TurnResult, TurnStatus};

/// The request as the key binds it: what would make a different turn.
pub fn request_hash(package: &str, request: &BoundRequest) -> String {
    let mut v = request.to_value();
    if let Some(m) = v.as_object_mut() {
        m.remove("idempotency_key");
        m.remove("work_order_id");
    }
    canonical::hash_value(&json!({"package": package, "request": v})).unwrap_or_default()
}

fn path(session: &Session, key: &str) -> PathBuf {
    let digest = hex::encode(Sha256::digest(key.as_bytes()));
    session
        .state()
        .session_dir(&session.id)
        .join("idempotency")
        .join(format!("{digest}.json"))
}

use crate::fsx::state_io as io;

/// A recorded key: what it ran, and (once finished) what it returned.
#[derive(Debug, Clone)]
pub struct Record {
    pub request_hash: String,
    pub turn_number: u64,
    pub result: Option<(u8, Value, String)>,
}

/// The record of `key` in `session`, if the key was used.
pub fn lookup(session: &Session, _lock: &SessionLock, key: &str) -> Result<Option<Record>> {
    let p = path(session, key);
    let bytes = match crate::fsx::read_small(&p, 16 << 20) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("read idempotency record", &p)(e)),
    };
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
        io("parse idempotency record", &p)(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    })?;
    let result = match (&v["exit_status"], &v["result"], &v["summary"]) {
        (Value::Number(n), r @ Value::Object(_), Value::String(s)) => {
            Some((n.as_u64().unwrap_or(1) as u8, r.clone(), s.clone()))
        }
        _ => None,
    };
    Ok(Some(Record {
        request_hash: v["request_hash"].as_str().unwrap_or_default().to_owned(),
        turn_number: v["turn_number"].as_u64().unwrap_or(0),
        result,
    }))
}

fn write(session: &Session, key: &str, v: &Value) -> Result<()> {
    let p = path(session, key);
    if let Some(dir) = p.parent() {
        crate::fsx::create_private_dir_all(dir)?;
    }
    crate::fsx::write_atomic(&p, format!("{v}\n").as_bytes())
}

/// Records that `key` is about to run turn `turn_number` (durable before
/// the turn's intent entry).
pub fn begin(
    session: &Session,
    _lock: &SessionLock,
    key: &str,
    request_hash: &str,
    turn_number: u64,
) -> Result<()> {
    write(
        session,
        key,
        &json!({"key": key, "request_hash": request_hash, "turn_number": turn_number}),
    )
}

/// Adds the turn's result (after its finish entries are durable).
pub fn finish(
    session: &Session,
    _lock: &SessionLock,
    key: &str,
    request_hash: &str,
    turn_number: u64,
    result: &TurnResult,
) -> Result<()> {
    write(
        session,
        key,
        &json!({"key": key, "request_hash": request_hash, "turn_number": turn_number,
            "exit_status": result.exit_status, "result": result.value, "summary": result.summary}),
    )
}

/// Whether turn `turn` of `session` began: its intent entry is in the exec
/// ledger. A record whose turn never began is a supervisor that died
/// between the record and the intent entry — nothing of the turn happened.
pub fn began(session: &Session, turn: u64) -> Result<bool> {
    Ok(session
        .ledger(LedgerKind::Exec)
        .verified_entries()?
        .iter()
        .any(|e| e["turn_number"] == turn))
}

/// What a repeated key returns: the recorded result, or — for a turn whose
/// supervisor died before recording it — the result rebuilt from the turn's
/// finish entry (recovery has written one). Marked `"replayed": true`.
pub fn replay(session: &Session, key: &str, record: &Record) -> Result<TurnResult> {
    let (exit_status, mut value, summary) = match &record.result {
        Some(r) => r.clone(),
        None => from_ledger(session, record.turn_number)?,
    };
    if let Some(m) = value.as_object_mut() {
        m.insert("replayed".into(), json!(true));
        m.insert("idempotency_key".into(), json!(key));
    }
    Ok(TurnResult {
        exit_status,
        value,
        summary: format!(
            "{summary} (replayed: idempotency key already used by turn {})",
            record.turn_number
        ),
    })
}

fn from_ledger(session: &Session, turn: u64) -> Result<(u8, Value, String)> {
    let entry = session
        .ledger(LedgerKind::Evidence)
        .verified_entries()?
        .into_iter()
        .rev()
        .find(|e| e["event"] == "turn.finished" && e["turn_number"] == turn)
        .ok_or_else(|| SupervisorError::Commit {
            detail: format!(
                "the idempotency record names turn {turn}, which has no finish entry even after recovery"
            ),
        })?;
    let status = TurnStatus::parse(entry["status"].as_str().unwrap_or_default())
        .unwrap_or(TurnStatus::Aborted);
    let value = json!({
        "session_id": session.id.as_str(),
        "turn_number": turn,
        "status": status.as_str(),
        "exit_code": entry["exit_code"],
        "error": entry["error"],
        "realized_writes": entry["realized_writes"],
        "committed": entry["committed"],
        "violations": entry["violations"],
    });
    Ok((
        status.exit_status(None),
        value,
        format!("turn {turn} of {}: {}", session.id, status.as_str()),
    ))
}
