//! `supervise revert` (issue 30): the workspace files turn N committed go
//! back to what they were before it, as a new turn recorded in both
//! ledgers.
//!
//! Every commit keeps what it replaces (content-addressed, under the
//! session's `preimages/`) and records it in its evidence (`committed[].
//! previous`: absent, or a file with its sha256). A revert checks, before
//! anything changes, that each file is still exactly what turn N committed
//! (otherwise a conflict, naming every path, exit 12, nothing changed) and
//! that each pre-image is still kept and intact; then commits through the
//! same journal as a turn (crash-safe alike: recovery rolls it back before
//! its commit point and forward after, and closes the turn), keeping what
//! it replaces or removes in turn, so a revert can itself be reverted.

use serde::Serialize;
use turnstile_policy::SessionId;
use turnstile_policy::canonical;
use turnstile_policy::session::Clock;
use turnstile_policy::timefmt::rfc3339_micros;

use crate::error::{Result, SupervisorError};
use crate::fsx;
use crate::store::commit::{self, Committed, Previous, Removal, Restore};
use crate::store::layout::{StateDir, Workspace};
use crate::store::ledger::LedgerKind;
use crate::store::record::{
    Event, EvidenceEntry, ExecEntry, SCHEMA_VERSION, Timings, TurnStartedEntry, read_all, to_object,
};
use crate::store::session::{Owner, Session};
use crate::store::status::TurnStatus;

/// What `supervise revert` was asked.
#[derive(Debug)]
pub struct RevertRequest<'a> {
    pub root: &'a std::path::Path,
    pub state_dir: &'a std::path::Path,
    pub session: &'a str,
    pub turn: u64,
    /// The tenant the session belongs to (as `run --tenant`).
    pub tenant: Option<&'a str>,
}

/// A revert that landed.
#[derive(Debug, Clone, Serialize)]
pub struct Reverted {
    pub session_id: String,
    /// The new turn that recorded the revert.
    pub turn_number: u64,
    pub reverted_turn: u64,
    pub status: TurnStatus,
    pub committed: Vec<Committed>,
}

/// One path and why the revert cannot put it back.
fn conflict(path: &str, why: impl std::fmt::Display) -> String {
    format!("{path}: {why}")
}

pub fn revert(req: &RevertRequest<'_>, clock: &dyn Clock) -> Result<Reverted> {
    if req.turn == 0 {
        return Err(SupervisorError::invalid(
            "--turn",
            "turns are numbered from 1",
        ));
    }
    let id = SessionId::parse(req.session)?;
    let ws = Workspace::open(req.root)?;
    let state = StateDir::open(req.state_dir, &ws, false)?;
    let session = Session::open(&ws, &state, &id, None)?;
    let evidence = session.ledger(LedgerKind::Evidence).verified_entries()?;
    session.ledger(LedgerKind::Exec).verify()?;
    let target = read_all::<EvidenceEntry>(&evidence)
        .map_err(|e| {
            SupervisorError::invalid("--session", format!("an evidence entry does not read: {e}"))
        })?
        .into_iter()
        .map(|r| r.body)
        .rfind(|e| e.event == Event::TurnFinished && e.turn_number == req.turn)
        .ok_or_else(|| {
            SupervisorError::invalid(
                "--turn",
                format!("session {id} has no finished turn {}", req.turn),
            )
        })?;
    let package = target.package_id.clone().unwrap_or_default();
    session.check_owner(&Owner::for_turn(req.tenant, &package), clock.now())?;
    let (lock, _) =
        crate::recover::lock_for_write(&session, &crate::sandbox::cgroup::Place::host(), clock)?;
    if target.status != Some(TurnStatus::Committed) {
        return Err(SupervisorError::invalid(
            "--turn",
            format!(
                "turn {} is `{}`: it committed nothing to revert",
                req.turn,
                target.status.map_or("unknown", TurnStatus::as_str)
            ),
        ));
    }
    if target.committed.is_empty() {
        return Err(SupervisorError::invalid(
            "--turn",
            format!("turn {} committed no file", req.turn),
        ));
    }

    // What each path must hold now, and what it goes back to.
    let store = Workspace::preimages_rel(&session.tier, &session.id);
    let store_abs = ws.root().join(&store);
    let mut conflicts = Vec::new();
    let mut restores = Vec::new();
    let mut removals = Vec::new();
    for c in &target.committed {
        let now = match fsx::hash_beneath(ws.root(), &c.path) {
            Ok((sha, size)) => Some((sha, size)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                conflicts.push(conflict(&c.path, format!("unreadable: {e}")));
                continue;
            }
        };
        let expected_now = (!c.removed).then_some(c.sha256.as_str());
        match (&now, expected_now) {
            (Some((sha, _)), Some(want)) if sha == want => {}
            (None, None) => {}
            (Some((sha, _)), _) => conflicts.push(conflict(
                &c.path,
                format!(
                    "changed since turn {} (sha256 {sha}, turn {} left {})",
                    req.turn,
                    req.turn,
                    expected_now.unwrap_or("nothing")
                ),
            )),
            (None, Some(_)) => conflicts.push(conflict(
                &c.path,
                format!("removed since turn {}", req.turn),
            )),
        }
        match &c.previous {
            None => conflicts.push(conflict(
                &c.path,
                "its pre-image was not kept (a turn of an earlier release, or not a regular file)",
            )),
            Some(Previous::Absent) => {
                if let Some((sha, size)) = now {
                    removals.push(Removal {
                        path: c.path.clone(),
                        sha256: sha,
                        size,
                    });
                }
            }
            Some(Previous::File { sha256, size }) => match fsx::hash_beneath(&store_abs, sha256) {
                Ok((kept, _)) if &kept == sha256 => restores.push(Restore {
                    path: c.path.clone(),
                    sha256: sha256.clone(),
                    size: *size,
                }),
                Ok(_) => conflicts.push(conflict(
                    &c.path,
                    format!("its kept pre-image {sha256} was changed"),
                )),
                Err(_) => conflicts.push(conflict(
                    &c.path,
                    format!(
                        "its pre-image {sha256} is no longer kept (dropped by the retention limit)"
                    ),
                )),
            },
        }
    }
    if !conflicts.is_empty() {
        return Err(SupervisorError::RevertConflict {
            session: id.to_string(),
            turn: req.turn,
            paths: conflicts,
        });
    }

    let turn_number = session.next_turn_number(&lock)?;
    // It writes from here (its journal, the workspace): see `store::lock`.
    lock.mark_changed();
    let command = vec![
        "supervise".to_owned(),
        "revert".to_owned(),
        "--turn".to_owned(),
        req.turn.to_string(),
    ];
    #[derive(Serialize)]
    struct Query<'a> {
        revert: u64,
        session_id: &'a str,
        command: &'a [String],
    }
    let query_hash = canonical::hash_value(
        &serde_json::to_value(Query {
            revert: req.turn,
            session_id: id.as_str(),
            command: &command,
        })
        .unwrap_or_default(),
    )
    .unwrap_or_default();
    let started_at = clock.now();
    session.ledger(LedgerKind::Exec).append(
        &lock,
        to_object(&TurnStartedEntry {
            event: Event::TurnStarted,
            schema_version: SCHEMA_VERSION,
            session_id: id.to_string(),
            turn_number,
            query_hash: query_hash.clone(),
            plan_hash: None,
            backend: "none".into(),
            ts: rfc3339_micros(started_at),
        }),
    )?;
    let owner = std::fs::metadata(ws.root())
        .map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.uid(), m.gid())
        })
        .unwrap_or((0, 0));
    let journal = state.commit_journal(&id, turn_number);
    let committed = commit::commit_restore(&commit::RestoreRequest {
        root: ws.root(),
        preimages: &store,
        restores: &restores,
        removals: &removals,
        output_owner: owner,
        turn_number,
        journal: journal.clone(),
        work_dir: Workspace::commit_work_dir(&id, turn_number),
    })?;
    let now = clock.now();
    #[derive(Serialize)]
    struct Digest<'a> {
        status: TurnStatus,
        committed: &'a [Committed],
    }
    let result_hash = canonical::hash_value(
        &serde_json::to_value(Digest {
            status: TurnStatus::Committed,
            committed: &committed,
        })
        .unwrap_or_default(),
    )
    .unwrap_or_default();
    let wall_us = u64::try_from((now - started_at).whole_microseconds()).unwrap_or(0);
    let exec = to_object(&ExecEntry {
        event: Event::TurnFinished,
        schema_version: SCHEMA_VERSION,
        session_id: id.to_string(),
        turn_number,
        query_hash,
        result_hash,
        status: Some(TurnStatus::Committed),
        exit_code: None,
        termination: None,
        error: None,
        backend: "none".into(),
        timings: session.deterministic.is_none().then_some(Timings {
            wall_us,
            phases_us: None,
        }),
        ts: rfc3339_micros(now),
    });
    let evidence = to_object(&EvidenceEntry {
        event: Event::TurnFinished,
        schema_version: SCHEMA_VERSION,
        session_id: id.to_string(),
        turn_number,
        package_id: target.package_id.clone(),
        status: Some(TurnStatus::Committed),
        command: Some(command),
        committed: committed.clone(),
        reverts_turn: Some(req.turn),
        ts: rfc3339_micros(now),
        ..EvidenceEntry::default()
    });
    crate::store::ledger::append_group(
        &lock,
        vec![
            (&session.ledger(LedgerKind::Exec), vec![exec]),
            (&session.ledger(LedgerKind::Evidence), vec![evidence]),
        ],
    )?;
    commit::finish(ws.root(), &journal)?;
    let limit = crate::backend::select::preimage_retention(std::path::Path::new(
        crate::backend::select::DEFAULT_CONFIG,
    ))
    .unwrap_or(crate::backend::select::DEFAULT_PREIMAGE_RETENTION);
    if let Err(e) = commit::prune_preimages(ws.root(), &store, limit) {
        tracing::warn!(error = %e, "pre-image retention");
    }
    Ok(Reverted {
        session_id: id.to_string(),
        turn_number,
        reverted_turn: req.turn,
        status: TurnStatus::Committed,
        committed,
    })
}
