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

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use turnstile_policy::canonical;
use turnstile_policy::request::BoundRequest;

use crate::error::{Result, SupervisorError};
use crate::store::ledger::LedgerKind;
use crate::store::record::{Event, EvidenceEntry, TurnReport, read_all};
use crate::store::session::{Session, SessionLock};
use crate::store::status::{TurnResult, TurnStatus};

/// The request as the key binds it: what would make a different turn.
pub fn request_hash(package: &str, request: &BoundRequest) -> String {
    #[derive(Serialize)]
    struct Bound<'a> {
        package: &'a str,
        request: Value,
    }
    let mut v = request.to_value();
    if let Some(m) = v.as_object_mut() {
        m.remove("idempotency_key");
        m.remove("work_order_id");
    }
    let bound = serde_json::to_value(Bound {
        package,
        request: v,
    })
    .unwrap_or_default();
    canonical::hash_value(&bound).unwrap_or_default()
}

/// The record's file: the key, what it ran, and once finished what it
/// returned.
#[derive(Debug, Serialize, Deserialize)]
struct RecordDoc {
    key: String,
    request_hash: String,
    turn_number: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exit_status: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    summary: Option<String>,
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
    let doc: RecordDoc = serde_json::from_slice(&bytes).map_err(|e| {
        io("parse idempotency record", &p)(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    })?;
    let result = match (doc.exit_status, doc.result, doc.summary) {
        (Some(n), Some(r @ Value::Object(_)), Some(s)) => Some((n, r, s)),
        _ => None,
    };
    Ok(Some(Record {
        request_hash: doc.request_hash,
        turn_number: doc.turn_number,
        result,
    }))
}

fn write(session: &Session, doc: &RecordDoc) -> Result<()> {
    let p = path(session, &doc.key);
    if let Some(dir) = p.parent() {
        crate::fsx::create_private_dir_all(dir)?;
    }
    let text = serde_json::to_string(doc)
        .map_err(|e| SupervisorError::invalid("idempotency_key", e.to_string()))?;
    crate::fsx::write_atomic(&p, format!("{text}\n").as_bytes())
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
        &RecordDoc {
            key: key.to_owned(),
            request_hash: request_hash.to_owned(),
            turn_number,
            exit_status: None,
            result: None,
            summary: None,
        },
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
        &RecordDoc {
            key: key.to_owned(),
            request_hash: request_hash.to_owned(),
            turn_number,
            exit_status: Some(result.exit_status),
            result: Some(result.value.clone()),
            summary: Some(result.summary.clone()),
        },
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
        .any(|e| e.get("turn_number").and_then(Value::as_u64) == Some(turn)))
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
        m.insert("replayed".into(), Value::Bool(true));
        m.insert("idempotency_key".into(), Value::String(key.to_owned()));
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
    let raw = session.ledger(LedgerKind::Evidence).verified_entries()?;
    let entries = read_all::<EvidenceEntry>(&raw).map_err(|e| SupervisorError::Commit {
        detail: format!("an evidence entry does not read as one: {e}"),
    })?;
    let entry = entries
        .into_iter()
        .rev()
        .map(|e| e.body)
        .find(|e| e.event == Event::TurnFinished && e.turn_number == turn)
        .ok_or_else(|| SupervisorError::Commit {
            detail: format!(
                "the idempotency record names turn {turn}, which has no finish entry even after recovery"
            ),
        })?;
    let status = entry.status.unwrap_or(TurnStatus::Aborted);
    let report = TurnReport {
        session_id: session.id.to_string(),
        turn_number: turn,
        started_at: None,
        finished_at: None,
        status,
        exit_code: entry.exit_code(),
        termination: entry.termination.clone(),
        error: entry.error,
        realized_writes: entry.realized_writes,
        committed: entry.committed,
        ephemeral_writes: None,
        violations: entry.violations,
        enforcement: None,
        resources: None,
        ledgers: None,
        durations: None,
        replayed: false,
        idempotency_key: None,
        receive: entry.receive,
        output: entry.output,
    };
    Ok((
        status.exit_status(None),
        serde_json::to_value(report).unwrap_or_default(),
        format!("turn {turn} of {}: {}", session.id, status.as_str()),
    ))
}
