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

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use turnstile_policy::canonical;

use crate::error::{IntegrityError, Problem};
use crate::error::{Result, SupervisorError};
use crate::store::commit::Committed;
use crate::store::ledger::LedgerKind;
use crate::store::record::{Event, EvidenceEntry, Read, Violation, WriteRecord, read_all};
use crate::store::session::{Session, SessionLock};
use crate::store::status::TurnStatus;

/// Version of the checkpoint format.
pub const CHECKPOINT_VERSION: u64 = 1;

/// One turn in a context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnLine {
    pub turn_number: u64,
    pub status: Option<TurnStatus>,
    pub command: Option<Vec<String>>,
    pub exit_code: Option<i32>,
    pub ts: String,
}

/// A committed output in a context: its last writer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputLine {
    pub sha256: String,
    pub size: u64,
    pub turn_number: u64,
}

/// A session's context: the fold of its evidence ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Context {
    pub session_id: String,
    pub turns: Vec<TurnLine>,
    pub outputs: BTreeMap<String, OutputLine>,
    pub scratch: BTreeMap<String, WriteRecord>,
    pub violations: Vec<Violation>,
}

/// Which entry a checkpoint covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Covers {
    pub ledger: String,
    pub seq: Option<u64>,
    pub entry_hash: Option<String>,
    pub ts: Option<String>,
}

/// An HO2 checkpoint as written (its hash is over everything else).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub schema_version: u64,
    pub session_id: String,
    pub covers: Covers,
    pub state: Context,
}

/// `supervise context`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextReport {
    pub as_of: Option<String>,
    /// The checkpoint it started from, if any.
    pub checkpoint: Option<String>,
    pub entries_replayed: u64,
    pub context: Context,
}

impl Context {
    /// The empty context of a session.
    pub fn empty(session: &str) -> Self {
        Self {
            session_id: session.to_owned(),
            turns: Vec::new(),
            outputs: BTreeMap::new(),
            scratch: BTreeMap::new(),
            violations: Vec::new(),
        }
    }

    /// Folds one evidence entry in.
    pub fn fold(&mut self, entry: &EvidenceEntry) {
        if entry.event != Event::TurnFinished {
            return;
        }
        self.turns.push(TurnLine {
            turn_number: entry.turn_number,
            status: entry.status,
            command: entry.command.clone(),
            exit_code: None,
            ts: entry.ts.clone(),
        });
        for Committed {
            path, size, sha256, ..
        } in &entry.committed
        {
            self.outputs.insert(
                path.clone(),
                OutputLine {
                    sha256: sha256.clone(),
                    size: *size,
                    turn_number: entry.turn_number,
                },
            );
        }
        if entry.status == Some(TurnStatus::Committed) {
            for w in &entry.scratch_writes {
                if w.kind == "deleted" {
                    self.scratch.remove(&w.path);
                } else {
                    self.scratch.insert(w.path.clone(), w.clone());
                }
            }
        }
        self.violations.extend(entry.violations.iter().cloned());
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

/// The checkpoint body's hash (everything but `checkpoint_hash`), over the
/// document as written.
fn body_hash(c: &Value) -> String {
    let mut body = c.clone();
    if let Some(m) = body.as_object_mut() {
        m.remove("checkpoint_hash");
    }
    canonical::hash_value(&body).unwrap_or_default()
}

/// The session's evidence entries, verified and typed. The exec ledger is
/// verified too: a read of a session verifies both (FR-RT-008), not only
/// the one it reads from.
fn evidence(session: &Session) -> Result<Vec<Read<EvidenceEntry>>> {
    session.ledger(LedgerKind::Exec).verify()?;
    let raw = session.ledger(LedgerKind::Evidence).verified_entries()?;
    read_all(&raw).map_err(|e| {
        tampered(
            &session.ledger(LedgerKind::Evidence).path,
            format!("an evidence entry does not read as one: {e}"),
        )
    })
}

/// Writes a checkpoint of everything the evidence ledger holds now: its
/// path, the document and the seq of the entry it covers.
pub fn checkpoint(session: &Session, _lock: &SessionLock) -> Result<(PathBuf, Value, Option<u64>)> {
    let entries = evidence(session)?;
    let mut state = Context::empty(session.id.as_str());
    for e in &entries {
        state.fold(&e.body);
    }
    let last = entries.last();
    let seq = last.map(|e| e.chain.seq);
    let ts = last.map(|e| e.body.ts.clone());
    let mut c = serde_json::to_value(Checkpoint {
        schema_version: CHECKPOINT_VERSION,
        session_id: session.id.to_string(),
        covers: Covers {
            ledger: "evidence".into(),
            seq,
            entry_hash: last.map(|e| e.chain.entry_hash.clone()),
            ts: ts.clone(),
        },
        state,
    })
    .map_err(|e| SupervisorError::invalid("checkpoint", e.to_string()))?;
    let hash = body_hash(&c);
    if let Some(m) = c.as_object_mut() {
        m.insert("checkpoint_hash".into(), Value::String(hash));
    }
    let d = dir(session);
    crate::fsx::create_dir_all(&d)?;
    // Named by the covered entry's time (sortable) and seq.
    let name_ts = ts.as_deref().unwrap_or("0").replace(':', "");
    let name_seq = seq.map_or_else(|| "null".to_owned(), |s| s.to_string());
    let path = d.join(format!("{name_ts}-{name_seq}.json"));
    crate::fsx::write_atomic(&path, format!("{c}\n").as_bytes())?;
    Ok((path, c, seq))
}

/// A checkpoint file, checked against its own hash, its session and the
/// ledger entry it claims to cover.
fn read_checkpoint(
    path: &std::path::Path,
    session: &Session,
    entries: &[Read<EvidenceEntry>],
) -> Result<Checkpoint> {
    let bytes =
        crate::fsx::read_small(path, 64 << 20).map_err(|e| tampered(path, e.to_string()))?;
    let raw: Value =
        serde_json::from_slice(&bytes).map_err(|e| tampered(path, format!("not JSON: {e}")))?;
    if raw.get("checkpoint_hash").and_then(Value::as_str) != Some(body_hash(&raw).as_str()) {
        return Err(tampered(path, "its hash does not match its content".into()));
    }
    let c: Checkpoint = serde_json::from_value(raw)
        .map_err(|e| tampered(path, format!("not a checkpoint: {e}")))?;
    if c.session_id != session.id.as_str() {
        return Err(tampered(path, "it belongs to another session".into()));
    }
    let seq = c.covers.seq.unwrap_or(0);
    let entry = entries.iter().find(|e| e.chain.seq == seq);
    if entry.map(|e| &e.chain.entry_hash) != c.covers.entry_hash.as_ref() {
        return Err(tampered(
            path,
            format!("it claims to cover evidence entry {seq}, whose hash differs"),
        ));
    }
    Ok(c)
}

/// The context as of `as_of` (an RFC 3339 UTC time; `None`: now), from the
/// latest checkpoint not after it plus the entries since.
pub fn context(session: &Session, as_of: Option<&str>) -> Result<ContextReport> {
    let entries = evidence(session)?;
    let not_after = |ts: Option<&str>| as_of.is_none_or(|t| ts.is_some_and(|ts| ts <= t));
    // The checkpoints, newest first; the first that is not after `as_of`.
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir(session))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut base = None;
    for path in files.iter().rev() {
        let c = read_checkpoint(path, session, &entries)?;
        if not_after(c.covers.ts.as_deref()) {
            base = Some((path.display().to_string(), c));
            break;
        }
    }
    let (mut state, from_seq, used) = match base {
        None => (Context::empty(session.id.as_str()), 0, None),
        Some((path, c)) => (c.state, c.covers.seq.unwrap_or(0), Some(path)),
    };
    let mut replayed = 0u64;
    for e in entries
        .iter()
        .filter(|e| e.chain.seq > from_seq)
        .filter(|e| not_after(Some(e.body.ts.as_str())))
    {
        state.fold(&e.body);
        replayed += 1;
    }
    Ok(ContextReport {
        as_of: as_of.map(str::to_owned),
        checkpoint: used,
        entries_replayed: replayed,
        context: state,
    })
}
