//! Recovery: what a supervisor killed at any instant leaves behind is
//! settled by the next writer of the session (every command that opens a
//! session for writing goes through [`Session::lock_for_write`]) and by
//! `supervise recover` for every session at once.
//!
//! Under the session lock — so no live turn of the session exists — in
//! this order:
//!
//! 1. the dead turns' OCI containers are deleted from their runtime
//!    (`delete --force`), their cgroups killed and removed in every
//!    hierarchy (nothing of a turn outlives its supervisor for longer than
//!    this; an OCI turn's guard normally did all of it already);
//! 2. their turn directories are unmounted (the turn tmpfs and the scratch
//!    tmpfs inside it) and removed;
//! 3. interrupted ledger appends are settled ([`ledger::recover_tails`]);
//! 4. commit journals are rolled forward or back ([`commit::recover`]);
//! 5. a turn whose intent entry has no finish entry (the exec anchor's
//!    `open_turn`) gets one in both ledgers, in one group append: status
//!    `aborted`, or `committed` when its journal rolled forward, with what
//!    recovery found and did.
//!
//! Fast when there is nothing to do: a few directory listings and two
//! anchor reads.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use turnstile_policy::session::Clock;
use turnstile_policy::timefmt::rfc3339_micros;

use crate::error::{Result, SupervisorError};
use crate::sandbox::cgroup::Place;
use crate::sandbox::cgroup::TurnCgroup;
use crate::store::commit::{self, Settled};
use crate::store::evidence::{SCHEMA_VERSION, object};
use crate::store::layout::{StateDir, Workspace};
use crate::store::ledger::{self, LedgerKind, TailRecovery};
use crate::store::session::{Session, SessionLock};
use turnstile_policy::error::codes;

/// What recovery found and did for one session.
#[derive(Debug, Clone, Default)]
pub struct SessionRecovery {
    pub session_id: String,
    /// Cgroups of dead turns killed and removed (by name).
    pub cgroups: Vec<String>,
    /// Processes that were still running in them.
    pub processes_killed: usize,
    /// Turn directories unmounted and removed.
    pub turn_dirs: Vec<PathBuf>,
    /// Warm sandboxes (`serve`) of a dead worker removed, by id.
    pub warm: Vec<String>,
    pub tails: Vec<TailRecovery>,
    /// Commit journals settled: (turn, rolled forward?).
    pub journals: Vec<(u64, bool)>,
    /// Turns closed with a finish entry (turn, status).
    pub closed: Vec<(u64, &'static str)>,
}

impl SessionRecovery {
    pub fn is_empty(&self) -> bool {
        self.cgroups.is_empty()
            && self.turn_dirs.is_empty()
            && self.warm.is_empty()
            && self.tails.is_empty()
            && self.journals.is_empty()
            && self.closed.is_empty()
    }

    pub fn to_value(&self) -> Value {
        json!({
            "session_id": self.session_id,
            "cgroups_removed": self.cgroups,
            "processes_killed": self.processes_killed,
            "turn_dirs_removed": self.turn_dirs,
            "warm_sandboxes_removed": self.warm,
            "ledger_tails": self.tails.iter().map(|t| json!({
                "ledger": t.kind.as_str(), "action": t.action, "bytes": t.bytes, "sha256": t.sha256,
            })).collect::<Vec<_>>(),
            "commit_journals": self.journals.iter().map(|(t, fwd)| json!({
                "turn_number": t, "rolled": if *fwd { "forward" } else { "back" },
            })).collect::<Vec<_>>(),
            "turns_closed": self.closed.iter().map(|(t, s)| json!({"turn_number": t, "status": s})).collect::<Vec<_>>(),
        })
    }
}

fn state_io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SupervisorError {
    let path = path.to_path_buf();
    move |source| SupervisorError::StateIo { op, path, source }
}

/// Removes what a dead owner left of its warm sandboxes in `session_dir`
/// (see [`crate::sandbox::pool`]): their cgroups (killing what runs in
/// them), turn directories and lock files. Returns their ids.
fn sweep_warm(session_dir: &Path, sid: &str, cgroup_place: &Place) -> Result<Vec<String>> {
    use crate::sandbox::pool;
    let mut ids = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(session_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix(pool::WARM_PREFIX) {
            ids.insert(rest.trim_end_matches(".lock").to_owned());
        }
    }
    // The lock file is made first and removed last (after the cgroup and
    // the directory, by the owner and by this sweep alike): a warm
    // sandbox's id is always found in the session directory, and a run that
    // finds none lists no cgroups (this is on every turn's path).
    // A live owner's (a serve worker's own, on each of its turns) is not
    // a leftover, and the cgroups are listed only for the dead: with a
    // thousand sessions, listing them reads a thousand entries per
    // hierarchy. Each dead owner's lock stays held until its sandbox is
    // gone.
    let dead: Vec<_> = ids
        .into_iter()
        .filter_map(|id| match pool::owner_alive(session_dir, &id) {
            (true, _) => None,
            (false, held) => Some((id, held)),
        })
        .collect();
    if dead.is_empty() {
        return Ok(Vec::new());
    }
    let cgroups = TurnCgroup::leftovers(cgroup_place, &pool::cgroup_name(sid, ""));
    let mut removed = Vec::new();
    for (id, _held) in dead {
        let name = pool::cgroup_name(sid, &id);
        for cg in cgroups.iter().filter(|cg| {
            cg.dirs()
                .first()
                .and_then(|d| d.file_name())
                .is_some_and(|n| n.to_string_lossy() == name)
        }) {
            if !cg.kill_all() {
                return Err(SupervisorError::Sandbox {
                    step: "recover",
                    detail: format!("processes of a dead warm sandbox ({name}) survived SIGKILL"),
                    source: None,
                });
            }
            cg.remove();
        }
        crate::sandbox::remove_turn_dir(&session_dir.join(format!("{}{id}", pool::WARM_PREFIX)))?;
        match std::fs::remove_file(pool::lock_path(session_dir, &id)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(state_io("remove a dead warm sandbox's lock", session_dir)(
                    e,
                ));
            }
        }
        removed.push(id);
    }
    Ok(removed)
}

/// Turn numbers of `turn-<n>` directories and `turn-<n>.commit` journals
/// in a session's state directory.
fn leftovers(state_dir: &Path) -> (Vec<u64>, Vec<u64>) {
    let (mut dirs, mut journals) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(state_dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("turn-") else {
            continue;
        };
        if let Some(n) = rest.strip_suffix(".commit").and_then(|n| n.parse().ok()) {
            journals.push(n);
        } else if let Ok(n) = rest.parse() {
            dirs.push(n);
        }
    }
    dirs.sort_unstable();
    journals.sort_unstable();
    (dirs, journals)
}

/// Takes the session's lock and recovers what a dead supervisor left of it
/// (see the module docs): every writer of a session goes through here.
pub fn lock_for_write(
    session: &Session,
    cgroup_place: &Place,
    clock: &dyn Clock,
) -> Result<(SessionLock, SessionRecovery)> {
    let lock = session.lock()?;
    let recovery = recover_held(session, &lock, cgroup_place, clock)?;
    Ok((lock, recovery))
}

/// [`recover_session`] under a lock just taken; a recovery that settled
/// something keeps the holding's stamp (see `store::lock`).
fn recover_held(
    session: &Session,
    lock: &SessionLock,
    cgroup_place: &Place,
    clock: &dyn Clock,
) -> Result<SessionRecovery> {
    let recovery = recover_session(session, lock, cgroup_place, clock)?;
    if !recovery.is_empty() {
        lock.mark_changed();
    }
    Ok(recovery)
}

/// A `serve` worker's recovery of its session between turns, off the
/// turns' path. Recovery settles what a writer of the session left when it
/// died; a worker's own turn leaves its cleanup to after its reply (see
/// `sandbox::pool`). So the worker recovers the session once that cleanup
/// is done ([`Between::recover`], under the lock, exactly as a turn would
/// before it starts), keeping the stamp of that holding; its next turn
/// skips recovery when the lock it takes follows that holding — no holder
/// since kept a stamp, so none can have left anything to settle (one that
/// may, or that died holding the lock, keeps its stamp: see `store::lock`
/// and [`SessionLock::follows`]). Any such holder in between, a failed
/// recovery, or a turn that never armed it, and the turn recovers first,
/// as every writer does.
#[derive(Debug, Default)]
pub struct Between {
    state: std::sync::Mutex<BetweenState>,
}

#[derive(Debug, Default)]
struct BetweenState {
    /// The session of the last turn, to recover once its cleanup is done.
    armed: Option<(Session, Place, crate::ids::Sources)>,
    /// The holding in which the session was last recovered.
    recovered: Option<crate::store::lock::Stamp>,
}

impl Between {
    fn state(&self) -> std::sync::MutexGuard<'_, BetweenState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`lock_for_write`], for a turn of the worker: recovery is skipped
    /// when no holder kept a stamp since the worker last recovered the
    /// session. Either way, the session is recovered again after this turn.
    pub fn lock_for_turn(
        &self,
        session: &Session,
        cgroup_place: &Place,
        sources: &crate::ids::Sources,
    ) -> Result<(SessionLock, SessionRecovery)> {
        let lock = session.lock()?;
        if self
            .arm(session, cgroup_place, sources)
            .is_some_and(|s| lock.follows(s))
        {
            let r = SessionRecovery {
                session_id: session.id.as_str().to_owned(),
                ..SessionRecovery::default()
            };
            return Ok((lock, r));
        }
        let recovery = recover_held(session, &lock, cgroup_place, sources)?;
        Ok((lock, recovery))
    }

    /// Arms the recovery of `session` after the turn that holds its lock
    /// now; returns the holding in which it was last recovered.
    pub fn arm(
        &self,
        session: &Session,
        cgroup_place: &Place,
        sources: &crate::ids::Sources,
    ) -> Option<crate::store::lock::Stamp> {
        let mut st = self.state();
        st.armed = Some((session.clone(), cgroup_place.clone(), sources.clone()));
        st.recovered.take()
    }

    /// Recovers the session of the last turn, if one was armed: call once
    /// that turn's cleanup is done. A failure is logged; the next turn
    /// then recovers first, and reports it.
    pub fn recover(&self) {
        let Some((session, place, sources)) = self.state().armed.take() else {
            return;
        };
        match lock_for_write(&session, &place, &sources) {
            Ok((lock, r)) => {
                if !r.is_empty() {
                    tracing::warn!(session_id = %session.id, recovery = %r.to_value(), "recovered what the last turn left");
                }
                // The stamp stays, so the next turn can know this holding.
                self.state().recovered = lock.mark_changed();
            }
            Err(e) => {
                tracing::warn!(session_id = %session.id, error = %e, "recovery after the turn failed; the next turn recovers first");
            }
        }
    }
}

/// Recovers one session (see the module docs). The caller holds its lock.
pub fn recover_session(
    session: &Session,
    lock: &SessionLock,
    cgroup_place: &Place,
    clock: &dyn Clock,
) -> Result<SessionRecovery> {
    let sid = session.id.as_str().to_owned();
    let mut r = SessionRecovery {
        session_id: sid.clone(),
        ..SessionRecovery::default()
    };
    // 1. Nothing of a dead turn keeps running. An OCI turn's runtime
    // record goes first (its guard normally removed it within a second of
    // the supervisor's death; see `backend::hostview::Guard`): `delete
    // --force` kills its container, and runsc's needs the sandbox's gofer
    // alive, which the cgroup's kill would take.
    // A cgroup its dying supervisor froze (killed between the freeze and
    // the thaw of `kill_all`) is thawed first: runsc's delete waits for
    // ever on a frozen sandbox, and a frozen task never dies.
    let prefix = format!("{sid}-t");
    let dead_cgroups = TurnCgroup::leftovers(cgroup_place, &prefix);
    for cg in &dead_cgroups {
        cg.thaw_if_frozen();
    }
    for id in crate::backend::runtime::records(&prefix) {
        crate::backend::runtime::forget(&id);
    }
    for cg in dead_cgroups {
        r.processes_killed += cg.pids().len();
        if !cg.kill_all() {
            return Err(SupervisorError::Sandbox {
                step: "recover",
                detail: format!(
                    "processes of a dead turn of {sid} survived SIGKILL ({})",
                    cg.dirs()
                        .first()
                        .map(|d| d.display().to_string())
                        .unwrap_or_default()
                ),
                source: None,
            });
        }
        cg.remove();
        if let Some(name) = cg.name() {
            // The directories an OCI runtime made in the other hierarchies.
            TurnCgroup::sweep_unmanaged(cgroup_place, name);
            r.cgroups.push(name.to_owned());
        }
    }
    // 2. Mounts and turn directories.
    let state_dir = session.state().session_dir(&session.id);
    let (dirs, journals) = leftovers(&state_dir);
    for n in dirs {
        let dir = session.state().turn_dir(&session.id, n);
        // An OCI turn's cgroup directories in the hierarchies turnstile
        // does not manage, if its managed ones were already gone.
        TurnCgroup::sweep_unmanaged(cgroup_place, &format!("{sid}-t{n}"));
        crate::sandbox::remove_turn_dir(&dir)?;
        r.turn_dirs.push(dir);
    }
    // ... and the warm sandboxes of a dead `serve` worker (a live one's
    // lock is held: it is not a leftover).
    r.warm = sweep_warm(&state_dir, &sid, cgroup_place)?;
    // 3. Interrupted ledger appends.
    let now = rfc3339_micros(clock.now());
    let files: Vec<_> = LedgerKind::ALL.iter().map(|k| session.ledger(*k)).collect();
    r.tails = ledger::recover_tails(lock, &files, &now)?;
    // 4. Commit journals, then 5. the turn left open, if any.
    let open = session
        .ledger(LedgerKind::Exec)
        .anchor()?
        .and_then(|a| a.open_turn);
    let mut open_outcome: Option<(&'static str, Vec<commit::Committed>, Option<String>)> = None;
    let mut settled_journals = Vec::new();
    for n in journals {
        let path = session.state().commit_journal(&session.id, n);
        settled_journals.push(path.clone());
        let (turn, s) = commit::recover(session.workspace().root(), &path, |t| Some(t) == open)?;
        r.journals
            .push((turn, matches!(s, Settled::RolledForward(_))));
        let is_open = Some(turn) == open;
        match s {
            Settled::RolledForward(c) if is_open => open_outcome = Some(("committed", c, None)),
            Settled::Unrecoverable(why) if is_open => {
                open_outcome = Some(("commit_failed", Vec::new(), Some(why)));
            }
            Settled::RolledForward(c) => {
                // Recorded as commit_failed, then completed here: say so.
                close_turn(
                    session,
                    lock,
                    turn,
                    "commit.recovered",
                    "committed",
                    &c,
                    None,
                    &r,
                    &now,
                )?;
            }
            Settled::Unrecoverable(why) => {
                close_turn(
                    session,
                    lock,
                    turn,
                    "commit.recovered",
                    "commit_failed",
                    &[],
                    Some(why),
                    &r,
                    &now,
                )?;
            }
            _ => {}
        }
    }
    if let Some(turn) = open {
        let (status, committed, why) = open_outcome.unwrap_or(("aborted", Vec::new(), None));
        r.closed.push((turn, status));
        close_turn(
            session,
            lock,
            turn,
            "turn.finished",
            status,
            &committed,
            why,
            &r,
            &now,
        )?;
    }
    // The outcomes are recorded: the journals can go.
    for path in settled_journals {
        commit::finish(session.workspace().root(), &path)?;
    }
    Ok(r)
}

/// Appends the finish entries of a turn recovery closes (or, for
/// `commit.recovered`, what became of a commit recorded as failed).
#[allow(clippy::too_many_arguments)]
fn close_turn(
    session: &Session,
    lock: &SessionLock,
    turn: u64,
    event: &str,
    status: &str,
    committed: &[commit::Committed],
    why: Option<String>,
    r: &SessionRecovery,
    now: &str,
) -> Result<()> {
    let sid = session.id.as_str();
    let error = match status {
        "aborted" => Some(json!({
            "code": codes::TURN_ABORTED.code,
            "name": codes::TURN_ABORTED.name,
            "message": "the supervisor stopped before the turn finished; recovery closed it and nothing was committed",
        })),
        "commit_failed" => Some(json!({
            "code": codes::COMMIT_FAILED.code,
            "name": codes::COMMIT_FAILED.name,
            "message": format!("recovery could not complete the commit: {}", why.unwrap_or_default()),
        })),
        _ => None,
    };
    let committed: Vec<Value> = committed
        .iter()
        .map(|c| json!({"path": c.path, "size": c.size, "sha256": c.sha256}))
        .collect();
    let recovery = r.to_value();
    let common = |kind: LedgerKind| -> Map<String, Value> {
        let mut m = object(json!({
            "event": event,
            "schema_version": SCHEMA_VERSION,
            "session_id": sid,
            "turn_number": turn,
            "status": status,
            "error": error,
            "recovery": recovery,
            "ts": now,
        }));
        if kind == LedgerKind::Evidence {
            m.insert("committed".into(), json!(committed));
            m.insert("realized_writes".into(), json!([]));
            m.insert("violations".into(), json!([]));
        } else {
            m.insert("exit_code".into(), Value::Null);
        }
        m
    };
    let exec = session.ledger(LedgerKind::Exec);
    let evidence = session.ledger(LedgerKind::Evidence);
    ledger::append_group(
        lock,
        vec![
            (&exec, vec![common(LedgerKind::Exec)]),
            (&evidence, vec![common(LedgerKind::Evidence)]),
        ],
    )?;
    Ok(())
}

/// `supervise recover`: unfinished session creations are swept, then every
/// session of the state directory (of `workspace` only, when given) is
/// recovered. Sessions of other workspaces are opened through the root
/// recorded in their state.
/// The sessions of the state directory (of `workspace` only, when given),
/// with their workspaces, as their records name them; sessions whose
/// workspace is gone are skipped.
pub fn known_sessions(
    state: &StateDir,
    workspace: Option<&Workspace>,
) -> Vec<(turnstile_policy::SessionId, Workspace)> {
    let sessions = state.path().join("sessions");
    let mut names: Vec<String> = std::fs::read_dir(&sessions)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let Ok(id) = turnstile_policy::SessionId::parse(&name) else {
            continue;
        };
        let meta = crate::fsx::read_small(&state.session_meta(&id), 64 * 1024)
            .ok()
            .and_then(|b| turnstile_policy::canonical::parse_canonical(&b).ok());
        let Some(root) = meta
            .as_ref()
            .and_then(|m| m.get("root"))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let ws = match workspace {
            Some(w) if w.root_str() == root => w.clone(),
            Some(_) => continue,
            None => match Workspace::open(Path::new(root)) {
                Ok(w) => w,
                Err(_) => continue,
            },
        };
        out.push((id, ws));
    }
    out
}

/// What [`recover_all`] did.
#[derive(Debug, Default)]
pub struct AllRecovery {
    /// Unfinished session creations removed.
    pub swept: Vec<String>,
    /// One per session found.
    pub sessions: Vec<SessionRecovery>,
    /// Cgroups of warm sandboxes whose building process is dead, removed
    /// host-wide (see [`sweep_dead_warm_cgroups`]).
    pub dead_warm_cgroups: Vec<String>,
    /// Sessions that could not be recovered (a damaged ledger, an
    /// unreadable journal): each is reported and left as it is; the others
    /// are recovered all the same (red-team wave 4: one broken session
    /// stopped `recover` and `serve` for the whole state directory).
    pub failed: Vec<FailedRecovery>,
}

/// A session [`recover_all`] could not recover, and why.
#[derive(Debug)]
pub struct FailedRecovery {
    pub session_id: String,
    pub error: SupervisorError,
}

impl FailedRecovery {
    pub fn to_value(&self) -> Value {
        serde_json::json!({
            "session_id": self.session_id,
            "code": self.error.code().code,
            "message": self.error.to_string(),
        })
    }
}

/// Whether [`recover_all`] waits for a session a live supervisor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// Wait for its turn to end, then recover (boot scripts, a starting
    /// daemon: every session is settled).
    Wait,
    /// Pass over it: a held lock is a live writer, which leaves nothing to
    /// settle (the containerd shim after its `supervise run` died, which
    /// must not wait on other pods' turns).
    Skip,
}

pub fn recover_all(
    state: &StateDir,
    workspace: Option<&Workspace>,
    busy: Busy,
    cgroup_place: &Place,
    clock: &dyn Clock,
) -> Result<AllRecovery> {
    let mut swept = crate::store::session::sweep_unfinished(state, workspace)?;
    let known = known_sessions(state, workspace);
    // Every workspace this state directory knows of, for the debris of
    // creations a power cut cut off from their state side.
    let mut roots: Vec<&Workspace> = workspace.into_iter().collect();
    for (_, ws) in &known {
        if !roots.iter().any(|r| r.root() == ws.root()) {
            roots.push(ws);
        }
    }
    for ws in roots {
        for id in crate::store::session::sweep_orphans(state, ws) {
            if !swept.contains(&id) {
                swept.push(id);
            }
        }
    }
    let mut sessions = Vec::new();
    let mut failed = Vec::new();
    for (id, ws) in known {
        let one = || -> Result<Option<SessionRecovery>> {
            if crate::store::session::roll_forward_creation(state, &ws, &id)? {
                tracing::warn!(session_id = %id.as_str(), "completed a creation a power cut interrupted");
            }
            let session = Session::open(&ws, state, &id, None)?;
            let lock = match busy {
                Busy::Wait => session.lock()?,
                Busy::Skip => match session.try_lock()? {
                    Some(lock) => lock,
                    None => return Ok(None),
                },
            };
            recover_held(&session, &lock, cgroup_place, clock).map(Some)
        };
        match one() {
            Ok(Some(r)) => sessions.push(r),
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(session_id = %id.as_str(), error = %error, "this session could not be recovered; the others are");
                failed.push(FailedRecovery {
                    session_id: id.as_str().to_owned(),
                    error,
                });
            }
        }
    }
    Ok(AllRecovery {
        swept,
        sessions,
        dead_warm_cgroups: sweep_dead_warm_cgroups(cgroup_place),
        failed,
    })
}

/// The pid in a warm sandbox's cgroup name (`<sid>-w<pid>-<n>`, see
/// `pool::cgroup_name`): the process that built it and owns it.
fn warm_owner(name: &str) -> Option<u32> {
    let (_, rest) = name.rsplit_once("-w")?;
    let (pid, n) = rest.split_once('-')?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(())?;
    pid.parse().ok()
}

/// Whether `pid` is a live process (a zombie, not yet reaped, is dead).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // `pid (comm) S …`: the state follows the last `)`.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}

/// Removes, host-wide, the cgroups of warm sandboxes whose owner process is
/// gone (a SIGKILLed daemon's worker): their processes died with it
/// (PDEATHSIG) but the directories stay, and the session they belong to
/// may live in a state directory nobody recovers again. Only a dead owner
/// pid is acted on: a live one (or a reused pid) keeps its cgroup, and the
/// session's own recovery handles it. Returns the names removed.
pub fn sweep_dead_warm_cgroups(cgroup_place: &Place) -> Vec<String> {
    let mut removed = Vec::new();
    for cg in TurnCgroup::leftovers(cgroup_place, "SES-") {
        let Some(name) = cg
            .dirs()
            .first()
            .and_then(|d| d.file_name())
            .map(|n| n.to_string_lossy().into_owned())
        else {
            continue;
        };
        let Some(pid) = warm_owner(&name) else {
            continue;
        };
        if alive(pid) {
            continue;
        }
        if cg.kill_all() {
            cg.remove();
            if cg.dirs().iter().all(|d| !d.exists()) {
                removed.push(name);
            }
        } else {
            tracing::warn!(cgroup = %name, "a dead owner's warm sandbox survived SIGKILL");
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::{Between, warm_owner};
    use crate::ids::{OsRandom, Sources, SystemClock};
    use crate::sandbox::cgroup::Place;
    use crate::store::layout::{StateDir, Workspace};
    use crate::store::session::Session;
    use turnstile_policy::session::SessionIdGenerator;

    /// A worker's turn skips recovery only when the worker recovered the
    /// session after its last turn and no process held the lock since. A
    /// leftover planted without the lock (which no writer does) shows
    /// which: a skipped recovery leaves it, a recovery removes it.
    #[test]
    fn issue_29_a_worker_skips_recovery_only_after_its_own_with_no_holder_between() {
        let dir = tempfile::tempdir().unwrap();
        let (root, state_path, cgroups) = (
            dir.path().join("ws"),
            dir.path().join("state"),
            dir.path().join("cgroup"),
        );
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&cgroups).unwrap();
        let ws = Workspace::open(&root).unwrap();
        let state = StateDir::open(&state_path, &ws, true).unwrap();
        let ids = SessionIdGenerator::new(SystemClock, OsRandom);
        let session = Session::create(&ws, &state, "ho1", &ids, None).unwrap();
        let (place, sources) = (Place::new(cgroups), Sources::system());
        let leftover = state.turn_dir(&session.id, 7);
        let between = Between::default();
        // A worker's turn, with the leftover planted (without the lock)
        // just before: whether its recovery ran (and removed it).
        let turn = || {
            std::fs::create_dir(&leftover).unwrap();
            let (lock, r) = between.lock_for_turn(&session, &place, &sources).unwrap();
            drop(lock);
            let recovered = r.turn_dirs == vec![leftover.clone()];
            assert!(
                recovered || (r.is_empty() && leftover.is_dir()),
                "{:?}",
                r.to_value()
            );
            recovered
        };
        // Never recovered by the worker: the turn recovers.
        assert!(turn());
        // Recovered after the turn, nobody since: the next turn skips it.
        between.recover();
        assert!(!turn());
        // Recovered after that turn (which removes the plant), then a holder
        // that changed the session: the next turn recovers.
        between.recover();
        assert!(!leftover.exists());
        session.lock().unwrap().mark_changed();
        assert!(turn());
        // A holder that changed nothing (a refused request) does not count.
        between.recover();
        drop(session.lock().unwrap());
        assert!(!turn());
        between.recover();
        assert!(!leftover.exists());
        // A turn that did not arm the recovery after it: the next recovers
        // even with no other holder.
        drop(between.lock_for_turn(&session, &place, &sources).unwrap());
        let _ = between.state().armed.take();
        between.recover();
        assert!(turn());
    }

    #[test]
    fn a_warm_cgroup_name_gives_its_owner_pid() {
        assert_eq!(
            warm_owner("SES-20261126T121121071323Z-395e4794536f25bb-w1441-1"),
            Some(1441)
        );
        assert_eq!(
            warm_owner("SES-20261126T121314302602Z-914e5d140ea08c1e-t1"),
            None
        );
        assert_eq!(warm_owner("SES-x-w12-"), None);
        assert_eq!(warm_owner("SES-x-w12-3a"), None);
        assert_eq!(warm_owner("SES-x-wab-3"), None);
    }
}
