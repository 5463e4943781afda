//! Sessions: creation (both ledgers at once, FR-RT-018), lookup, and the
//! per-session lock that serializes turns and ledger appends.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg, OFlag};
use turnstile_policy::SessionId;
use turnstile_policy::canonical;
use turnstile_policy::session::{Clock, RandomSource, SessionIdGenerator};
use turnstile_policy::timefmt::rfc3339_micros;

use crate::error::{Result, SupervisorError};
use crate::fsx;
use crate::store::evidence;
use crate::store::layout::{StateDir, TURN_TIER, Workspace, check_tier};
use crate::store::ledger::{LedgerFiles, LedgerKind, VerifyReport};

pub use crate::store::lock::SessionLock;
use crate::store::lock::lock_path;

/// Who a session belongs to, recorded when it is created (issue 25): the
/// caller's uid, and for a pod's turn the tenant (its Kubernetes or
/// containerd namespace) and the package. Only the same owner may add
/// turns to it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    pub uid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
}

impl Owner {
    /// This process's caller: its real uid, no tenant.
    pub fn caller() -> Self {
        Self {
            uid: nix::unistd::getuid().as_raw(),
            tenant: None,
            package: None,
        }
    }

    /// A turn of `package` for `tenant` (if any), by this process's caller.
    /// A tenant's session also belongs to the package that created it.
    pub fn for_turn(tenant: Option<&str>, package: &str) -> Self {
        Self {
            tenant: tenant.map(str::to_owned),
            package: tenant.map(|_| package.to_owned()),
            ..Self::caller()
        }
    }

    /// A command about a session (not a turn) by this process's caller,
    /// for `tenant` when it names one.
    pub fn for_access(tenant: Option<&str>) -> Self {
        Self {
            tenant: tenant.map(str::to_owned),
            package: None,
            ..Self::caller()
        }
    }

    /// Whether `other` may use a session this owner owns: the same uid and
    /// tenant, and the same package when one is recorded.
    pub fn admits(&self, other: &Self) -> bool {
        self.uid == other.uid
            && self.tenant == other.tenant
            && (self.package.is_none() || self.package == other.package)
    }

    /// Whether `other` may inspect or manage (not add turns to) a session
    /// this owner owns: `suspend`, `resume`, `report`, `replay`, `ledger
    /// verify` and the other commands that name a session. The same uid
    /// (or root); a requester naming a tenant must name the owner's, and
    /// one naming none is the host's operator (of any package).
    pub fn admits_access(&self, other: &Self) -> bool {
        (other.uid == self.uid || other.uid == 0)
            && (other.tenant.is_none() || other.tenant == self.tenant)
    }
}

/// Checks a tenant name (`--tenant`, a daemon request's `tenant`): what
/// Kubernetes allows a namespace to be called, so it cannot name a path.
pub fn check_tenant(field: &str, t: &str) -> Result<()> {
    let ok = !t.is_empty()
        && t.len() <= 253
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(SupervisorError::invalid(
            field,
            format!("`{t}` is not a namespace name (1-253 of [A-Za-z0-9._-])"),
        ))
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uid {}", self.uid)?;
        if let Some(t) = &self.tenant {
            write!(f, ", tenant `{t}`")?;
        }
        if let Some(p) = &self.package {
            write!(f, ", package `{p}`")?;
        }
        Ok(())
    }
}

/// A session's record in the state directory (`session.json`): written
/// first when it is created, read whenever it is opened.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionRecord {
    #[serde(default)]
    pub session_id: String,
    #[serde(default = "default_tier")]
    pub tier: String,
    pub root: String,
    #[serde(default)]
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deterministic: Option<crate::ids::DeterministicDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
}

fn default_tier() -> String {
    TURN_TIER.to_owned()
}

/// Parses a session record (canonical JSON).
fn read_record(bytes: &[u8]) -> std::result::Result<SessionRecord, String> {
    let v = canonical::parse_canonical(bytes).map_err(|e| e.to_string())?;
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// Whether a turn of `me` is kept out of session `sid`'s directories:
/// another owner's (another uid or tenant; the package does not count), or
/// one whose record cannot be read (fail closed). A session created before
/// owners were recorded is open, as it was.
pub fn foreign_to(state: &StateDir, sid: &SessionId, me: &Owner) -> bool {
    match fsx::read_small(&state.session_dir(sid).join("session.json"), 64 * 1024)
        .ok()
        .and_then(|b| read_record(&b).ok())
    {
        None => true,
        Some(r) => r
            .owner
            .is_some_and(|o| o.uid != me.uid || o.tenant != me.tenant),
    }
}

/// A session of one workspace.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: SessionId,
    pub tier: String,
    workspace: Workspace,
    state: StateDir,
    /// Deterministic mode, as recorded when the session was created.
    pub deterministic: Option<crate::ids::Deterministic>,
    /// Who owns it (`None`: a session created before owners were
    /// recorded, open to its workspace's users as before).
    pub owner: Option<Owner>,
}

impl Session {
    /// Starts a new session: a fresh id, the state directory, `tmp/<sid>/`,
    /// `output/<sid>/`, and both ledgers, each opened with a
    /// `session.started` entry.
    pub fn create<C: Clock, R: RandomSource>(
        workspace: &Workspace,
        state: &StateDir,
        tier: &str,
        ids: &SessionIdGenerator<C, R>,
        deterministic: Option<crate::ids::Deterministic>,
    ) -> Result<Self> {
        Self::create_owned(workspace, state, tier, ids, deterministic, Owner::caller())
            .map(|(session, _lock)| session)
    }

    /// A new session of the turn tier with the system's clock and
    /// randomness, owned by the caller (what the daemon's router and bus
    /// start for the sessions they keep).
    pub fn create_default(workspace: &Workspace, state: &StateDir) -> Result<Self> {
        Self::create(
            workspace,
            state,
            crate::store::layout::TURN_TIER,
            &SessionIdGenerator::new(crate::ids::SystemClock, crate::ids::OsRandom),
            None,
        )
    }

    /// [`Session::create`] for `owner`, returning the session's lock still
    /// held: it was taken before the session existed and never let go, so
    /// no other writer has touched the session — there is nothing of a
    /// dead turn to recover before its first turn (`run` without
    /// `--session`).
    pub fn create_owned<C: Clock, R: RandomSource>(
        workspace: &Workspace,
        state: &StateDir,
        tier: &str,
        ids: &SessionIdGenerator<C, R>,
        deterministic: Option<crate::ids::Deterministic>,
        owner: Owner,
    ) -> Result<(Self, SessionLock)> {
        check_tier(tier)?;
        workspace.check_session_trees()?;
        let id = ids.generate()?;
        let session = Self {
            id,
            tier: tier.to_owned(),
            workspace: workspace.clone(),
            state: state.clone(),
            deterministic,
            owner: Some(owner),
        };
        let lock = session
            .initialize(ids.clock())
            .map_err(|e| SupervisorError::SessionStart(Box::new(e)))?;
        Ok((session, lock))
    }

    /// Builds the session under temporary names — the state side in
    /// `state/sessions/.new-<sid>/`, the ledgers in
    /// `planes/<tier>/sessions/.new-<sid>/`, the scratch and output
    /// directories as `tmp/.new-<sid>` and `output/.new-<sid>` — and renames
    /// them into place, the state directory last. A killed process leaves
    /// the renames in the order it made them: before the state directory's,
    /// only `.new-*` debris, which is not a session ([`Session::open`]
    /// refuses it) and which [`sweep_unfinished`] removes; after it, a
    /// complete session. A power cut may keep any subset of the unsynced
    /// steps of a round: see `build` for how each is settled
    /// ([`sweep_unfinished`], [`sweep_orphans`], [`roll_forward_creation`]).
    fn initialize(&self, clock: &dyn Clock) -> Result<SessionLock> {
        let sessions = self.state.path().join("sessions");
        fsx::create_private_dir_all(&sessions)?;
        let new_state = self.state.session_dir_new(&self.id);
        // Held for the whole creation: a concurrent sweep leaves a creation
        // whose lock is held alone.
        let creating = creation_lock_path(&new_state);
        let guard = lock_file_stable(&creating, FlockArg::LockExclusive)
            .map_err(|source| SupervisorError::StateIo {
                op: "lock session creation",
                path: creating.clone(),
                source,
            })?
            .ok_or_else(|| SupervisorError::invalid("session", "creation lock unavailable"))?;
        // create_dir_new fails if the id was somehow issued before.
        fsx::create_dir_new(&new_state, 0o700)?;
        let built = self.build(&new_state, clock);
        // Only a creation that never reached its commit point (the state
        // directory's rename) is debris: if the rename happened and the
        // sync after it failed, the session is whole and stays (its
        // creation still reports the error).
        if built.is_err() && !self.state.session_dir(&self.id).exists() {
            self.remove_partial(&new_state);
        }
        let _ = std::fs::remove_file(&creating);
        drop(guard);
        built
    }

    /// Returns the session's lock, held since before it existed.
    fn build(&self, new_state: &Path, clock: &dyn Clock) -> Result<SessionLock> {
        fsx::create_dir_new(&new_state.join("anchors"), 0o700)?;
        let lock = lock_path(&new_state.join("lock"), &self.id)?;
        // The record first: whoever sweeps an unfinished creation learns
        // from it which workspace to clean.
        let now = clock.now();
        let meta = SessionRecord {
            session_id: self.id.to_string(),
            tier: self.tier.clone(),
            root: self.workspace.root_str().to_owned(),
            created_at: rfc3339_micros(now),
            deterministic: self
                .deterministic
                .as_ref()
                .map(crate::ids::Deterministic::to_doc),
            owner: self.owner.clone(),
        };
        let value = serde_json::to_value(&meta)
            .map_err(|e| SupervisorError::invalid("session", e.to_string()))?;
        let bytes = canonical::to_vec(&value)
            .map_err(|e| SupervisorError::invalid("session", e.to_string()))?;
        // Not synced on its own (issue 29: that round was ~0.5-1.2 ms of
        // every new session): everything of the workspace side is made
        // under a `.new-` name until the record is durable with the rest,
        // so a power cut that keeps workspace debris and loses the record
        // leaves only `.new-` names, which `sweep_orphans` removes; from
        // the sync below on, the record is there for `sweep_unfinished`.
        let record = new_state.join("session.json");
        fsx::write_new_unsynced(&record, &bytes)?;

        let ledger_dir = self.workspace.ledger_dir(&self.tier, &self.id);
        let session_dir = ledger_dir.parent().unwrap_or(&ledger_dir).to_path_buf();
        let ws_sessions = session_dir.parent().unwrap_or(&session_dir).to_path_buf();
        fsx::create_dir_all(&ws_sessions)?;
        let new_ws = ws_sessions.join(format!(".new-{}", self.id));
        fsx::create_dir_new(&new_ws, 0o755)?;
        fsx::create_dir_new(&new_ws.join("ledger"), 0o755)?;
        let files: Vec<LedgerFiles> = LedgerKind::ALL
            .iter()
            .map(|&kind| LedgerFiles {
                kind,
                session: self.id.clone(),
                path: new_ws.join("ledger").join(kind.file_name()),
                anchor: new_state
                    .join("anchors")
                    .join(format!("{}.json", kind.as_str())),
            })
            .collect();
        // Everything below is made unsynced, the genesis entries too, then
        // synced at once before the renames (nothing under a temporary name
        // is a session: a crash before the last rename leaves debris the
        // sweep removes).
        for f in &files {
            f.create_unsynced(&lock)?;
        }
        crate::store::ledger::append_group_unsynced(
            &lock,
            files
                .iter()
                .map(|f| {
                    (
                        f,
                        vec![evidence::session_started(&self.id, &self.tier, f.kind, now)],
                    )
                })
                .collect(),
        )?;
        // The session's scratch and output directories, under temporary
        // names beside their final ones (same directory, so the rename
        // cannot cross a file system).
        let scratch_and_output = session_trees(&self.workspace, &self.id);
        for (new, _) in &scratch_and_output {
            fsx::create_dir_all(new.parent().unwrap_or(new))?;
            fsx::create_dir_new(new, 0o755)?;
        }
        let anchors = new_state.join("anchors");
        let ledgers = new_ws.join("ledger");
        let mut durable: Vec<&Path> = vec![&record, &anchors, new_state, &ledgers, &new_ws];
        for f in &files {
            durable.extend([f.path.as_path(), f.anchor.as_path()]);
        }
        durable.extend(scratch_and_output.iter().map(|(new, _)| new.as_path()));
        // One round for the whole new tree, the record included.
        fsx::sync_all_at_once(&durable)?;
        // Everything into place, the state directory last, and every
        // rename's directory synced at once (one round: the state
        // directory's rename is no longer made durable after the others').
        // A killed process leaves the renames as it issued them: all but
        // the state directory's are debris `sweep_unfinished` removes. A
        // power cut may keep any of them: without the state directory's,
        // the same; with it and not all the others, the session is not
        // one yet — `Session::open` refuses it while its ledger directory
        // has its temporary name — and `recover` completes the renames
        // (`roll_forward_creation`), every byte having been durable before
        // the first of them. It is reported only once all are durable.
        let final_state = self.state.session_dir(&self.id);
        let mut renamed: Vec<(&Path, &Path)> = vec![(&new_ws, &session_dir)];
        renamed.extend(
            scratch_and_output
                .iter()
                .map(|(n, f)| (n.as_path(), f.as_path())),
        );
        renamed.push((new_state, &final_state));
        for (from, to) in &renamed {
            rename_into_place(from, to)?;
        }
        let parents: Vec<&Path> = renamed
            .iter()
            .map(|(_, to)| to.parent().unwrap_or(to))
            .collect();
        fsx::sync_all_at_once(&parents)?;
        Ok(lock)
    }

    /// Best-effort removal of what an unfinished creation made.
    fn remove_partial(&self, new_state: &Path) {
        remove_partial_session(&self.workspace, &self.tier, &self.id);
        let _ = std::fs::remove_dir_all(new_state);
    }

    /// Opens an existing session. `tier` overrides the tier recorded in the
    /// state directory (needed only when that record is gone).
    pub fn open(
        workspace: &Workspace,
        state: &StateDir,
        id: &SessionId,
        tier: Option<&str>,
    ) -> Result<Self> {
        if let Some(t) = tier {
            check_tier(t)?;
        }
        let meta_path = state.session_meta(id);
        let recorded = match fsx::read_small(&meta_path, 64 * 1024) {
            Ok(bytes) => Some(read_record(&bytes).map_err(|e| SupervisorError::StateIo {
                op: "parse session record",
                path: meta_path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(SupervisorError::StateIo {
                    op: "read session record",
                    path: meta_path,
                    source,
                });
            }
        };
        let tier = match &recorded {
            Some(meta) => {
                if meta.root != workspace.root_str() {
                    return Err(SupervisorError::SessionNotFound {
                        session: id.to_string(),
                        path: workspace.root().to_path_buf(),
                    });
                }
                // A creation a power cut interrupted between its renames
                // (see `build`): not a session until `recover` completes
                // it. (A ledger directory simply missing is still one,
                // whose verification reports it.)
                let ledgers = workspace.ledger_dir(&meta.tier, id);
                if let Some(new) = ledgers.parent().map(new_ledger_dir) {
                    if ledgers.symlink_metadata().is_err() && new.symlink_metadata().is_ok() {
                        return Err(SupervisorError::SessionNotFound {
                            session: id.to_string(),
                            path: new,
                        });
                    }
                }
                let recorded_tier = meta.tier.as_str();
                if let Some(t) = tier.filter(|t| *t != recorded_tier) {
                    return Err(SupervisorError::invalid(
                        "--tier",
                        format!("session {id} was created in tier `{recorded_tier}`, not `{t}`"),
                    ));
                }
                recorded_tier.to_owned()
            }
            None => {
                // Still being created, or a creation a crash interrupted:
                // not a session (yet).
                if state.session_dir_new(id).symlink_metadata().is_ok() {
                    return Err(SupervisorError::SessionNotFound {
                        session: id.to_string(),
                        path: state.session_dir_new(id),
                    });
                }
                // No state record: the session exists only if its ledger
                // directory does (then verification reports the missing
                // anchors as an integrity failure).
                let t = tier.unwrap_or(TURN_TIER).to_owned();
                let dir = workspace.ledger_dir(&t, id);
                if dir.symlink_metadata().is_err() {
                    return Err(SupervisorError::SessionNotFound {
                        session: id.to_string(),
                        path: dir,
                    });
                }
                t
            }
        };
        let deterministic = recorded
            .as_ref()
            .and_then(|m| m.deterministic.as_ref())
            .and_then(crate::ids::Deterministic::from_doc);
        let owner = recorded.and_then(|m| m.owner);
        Ok(Self {
            id: id.clone(),
            tier,
            workspace: workspace.clone(),
            state: state.clone(),
            deterministic,
            owner,
        })
    }

    /// Opens a session for `requester`, a command that inspects or manages
    /// it: refused (TS1041) unless its owner admits the requester
    /// ([`Owner::admits_access`]).
    pub fn open_as(
        workspace: &Workspace,
        state: &StateDir,
        id: &SessionId,
        tier: Option<&str>,
        requester: &Owner,
    ) -> Result<Self> {
        if let Some(t) = &requester.tenant {
            check_tenant("--tenant", t)?;
        }
        let session = Self::open(workspace, state, id, tier)?;
        session.check_access(requester, crate::ids::SystemClock.now())?;
        Ok(session)
    }

    /// Takes the session's exclusive lock, waiting for a concurrent turn.
    pub fn lock(&self) -> Result<SessionLock> {
        lock_path(&self.state.session_lock(&self.id), &self.id)
    }

    /// The session's lock if no one holds it (`None`: a live supervisor
    /// does, for a running turn).
    pub fn try_lock(&self) -> Result<Option<SessionLock>> {
        crate::store::lock::try_lock_path(&self.state.session_lock(&self.id), &self.id)
    }

    pub fn state(&self) -> &StateDir {
        &self.state
    }

    /// The files of one of the session's ledgers.
    pub fn ledger(&self, kind: LedgerKind) -> LedgerFiles {
        LedgerFiles {
            kind,
            session: self.id.clone(),
            path: self.workspace.ledger_path(&self.tier, &self.id, kind),
            anchor: self.state.anchor_path(&self.id, kind),
        }
    }

    /// Verifies both ledgers (FR-RT-008, FR-RT-018: both must exist and be
    /// intact). Returns the first failure.
    pub fn verify(&self) -> Result<Vec<VerifyReport>> {
        LedgerKind::ALL
            .iter()
            .map(|k| self.ledger(*k).verify())
            .collect()
    }

    /// The number the next turn gets: one more than the highest turn either
    /// ledger has recorded, from the anchors (O(1)). Each append re-checks
    /// the head entry and the length against its anchor; full verification
    /// happens on every read (`ledger verify`, prompt headers) and before a
    /// turn on a ledger changed since the last append. Anchors that
    /// predate the turn record fall back to a full verification.
    pub fn next_turn_number(&self, _lock: &SessionLock) -> Result<u64> {
        // Both ledgers are as this supervisor left them, or verify whole,
        // before a turn adds to either (red-team H2, stop 54).
        for kind in LedgerKind::ALL {
            self.ledger(kind).check_unchanged()?;
        }
        let mut last = 0;
        for kind in LedgerKind::ALL {
            match self.ledger(kind).last_turn()? {
                Some(t) => last = last.max(t),
                None => {
                    let reports = self.verify()?;
                    return Ok(reports.iter().map(|r| r.last_turn).max().unwrap_or(0) + 1);
                }
            }
        }
        Ok(last + 1)
    }

    /// Refuses `requester` unless this session's owner admits it to add a
    /// turn; the refusal is recorded in the owner's evidence ledger
    /// (`session.access_refused`) before it is returned.
    pub fn check_owner(&self, requester: &Owner, at: time::OffsetDateTime) -> Result<()> {
        match &self.owner {
            Some(owner) if !owner.admits(requester) => self.refuse(owner, requester, at, true),
            _ => Ok(()),
        }
    }

    /// Refuses `requester` unless this session's owner admits it to
    /// inspect or manage the session ([`Owner::admits_access`]). Recorded
    /// as [`Session::check_owner`]'s refusals, but without waiting: while
    /// a turn holds the session the refusal is returned unrecorded (and
    /// says so) rather than block behind the turn.
    pub fn check_access(&self, requester: &Owner, at: time::OffsetDateTime) -> Result<()> {
        match &self.owner {
            Some(owner) if !owner.admits_access(requester) => {
                self.refuse(owner, requester, at, false)
            }
            _ => Ok(()),
        }
    }

    fn refuse(
        &self,
        owner: &Owner,
        requester: &Owner,
        at: time::OffsetDateTime,
        wait: bool,
    ) -> Result<()> {
        let lock = if wait {
            Some(self.lock()?)
        } else {
            self.try_lock()?
        };
        let recorded = lock.is_some();
        if let Some(lock) = lock {
            let evidence = self.ledger(LedgerKind::Evidence);
            let entry =
                crate::store::record::to_object(&crate::store::record::AccessRefusedEntry {
                    event: crate::store::record::Event::SessionAccessRefused,
                    schema_version: crate::store::record::SCHEMA_VERSION,
                    ledger: LedgerKind::Evidence.as_str().to_owned(),
                    session_id: self.id.to_string(),
                    owner: owner.clone(),
                    requester: requester.clone(),
                    ts: rfc3339_micros(at),
                });
            crate::store::ledger::append_group(&lock, vec![(&evidence, vec![entry])])?;
        }
        Err(SupervisorError::SessionNotOwned {
            session: self.id.to_string(),
            requester: requester.to_string(),
            recorded,
        })
    }

    /// Records in the evidence ledger that the session's suspended warm
    /// sandbox could not be thawed for a turn of `package` (E2024): the turn
    /// never started, so this entry is its only trace in the ledgers.
    pub fn record_resume_failed(
        &self,
        package: &str,
        error: crate::store::record::ErrorRecord,
        at: time::OffsetDateTime,
    ) -> Result<()> {
        let lock = self.lock()?;
        let evidence = self.ledger(LedgerKind::Evidence);
        let entry = crate::store::record::to_object(&crate::store::record::ResumeFailedEntry {
            event: crate::store::record::Event::SessionResumeFailed,
            schema_version: crate::store::record::SCHEMA_VERSION,
            ledger: LedgerKind::Evidence.as_str().to_owned(),
            session_id: self.id.to_string(),
            package: package.to_owned(),
            error: Some(error),
            ts: rfc3339_micros(at),
        });
        crate::store::ledger::append_group(&lock, vec![(&evidence, vec![entry])])?;
        Ok(())
    }

    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }
}

/// `planes/<tier>/sessions/.new-<sid>` for `planes/<tier>/sessions/<sid>`.
fn new_ledger_dir(session_dir: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".new-");
    name.push(session_dir.file_name().unwrap_or_default());
    session_dir.with_file_name(name)
}

/// Completes a creation a power cut interrupted after its state directory's
/// rename (see `Session::build`): each workspace part still under its
/// `.new-` name whose final name is free is renamed into place, and the
/// renames made durable. Every byte of the session was durable before the
/// first rename, so this only finishes what the creation began. Returns
/// whether anything was renamed. For `recover`, before it opens the
/// session.
pub fn roll_forward_creation(
    state: &StateDir,
    workspace: &Workspace,
    id: &SessionId,
) -> Result<bool> {
    let Some(meta) = fsx::read_small(&state.session_meta(id), 64 * 1024)
        .ok()
        .and_then(|b| read_record(&b).ok())
    else {
        return Ok(false);
    };
    if meta.root != workspace.root_str() || check_tier(&meta.tier).is_err() {
        return Ok(false);
    }
    let ledgers = workspace.ledger_dir(&meta.tier, id);
    let session_dir = ledgers.parent().unwrap_or(&ledgers).to_path_buf();
    let mut parts = vec![(new_ledger_dir(&session_dir), session_dir)];
    parts.extend(session_trees(workspace, id));
    let mut parents = Vec::new();
    for (new, done) in &parts {
        if done.symlink_metadata().is_err() && new.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            rename_into_place(new, done)?;
            parents.extend(done.parent().map(Path::to_path_buf));
        }
    }
    let parents: Vec<&Path> = parents.iter().map(PathBuf::as_path).collect();
    fsx::sync_all_at_once(&parents)?;
    Ok(!parents.is_empty())
}

/// Renames `from` to `to` (not synced).
fn rename_into_place(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|source| SupervisorError::StateIo {
        op: "rename into place",
        path: to.to_path_buf(),
        source,
    })
}

/// `(temporary, final)` names of a session's scratch and output
/// directories: `tmp/.new-<sid>` becomes `tmp/<sid>`, `output/.new-<sid>`
/// becomes `output/<sid>`.
fn session_trees(workspace: &Workspace, id: &SessionId) -> [(PathBuf, PathBuf); 2] {
    [workspace.scratch_dir(id), workspace.output_dir(id)].map(|dir| {
        let new = dir.with_file_name(format!(".new-{id}"));
        (new, dir)
    })
}

/// Removes the workspace side of a session whose creation did not finish:
/// its ledgers (under either name) and its scratch and output directories
/// (under either name) when they are still empty.
fn remove_partial_session(workspace: &Workspace, tier: &str, id: &SessionId) {
    let ledger_dir = workspace.ledger_dir(tier, id);
    if let Some(session_dir) = ledger_dir.parent() {
        let _ = std::fs::remove_dir_all(session_dir);
        if let Some(parent) = session_dir.parent() {
            let _ = std::fs::remove_dir_all(parent.join(format!(".new-{id}")));
        }
    }
    remove_new_trees(workspace, id);
}

/// Removes `tmp/.new-<sid>` and `output/.new-<sid>` when empty, and the
/// final names when empty too.
fn remove_new_trees(workspace: &Workspace, id: &SessionId) {
    for (new, dir) in session_trees(workspace, id) {
        let _ = std::fs::remove_dir(new);
        let _ = std::fs::remove_dir(dir);
    }
}

/// Removes, in `workspace`, the `.new-` debris of a creation whose state
/// side kept no record (a power cut before the creation's one sync): its
/// ledger directory under the temporary name in every tier, and its
/// scratch and output directories under theirs. Never a final name: a
/// creation renames its workspace side into place only once its record
/// is durable.
fn remove_recordless_debris(workspace: &Workspace, id: &SessionId) {
    for sessions in tier_session_dirs(workspace) {
        let _ = std::fs::remove_dir_all(sessions.join(format!(".new-{id}")));
    }
    for (new, _) in session_trees(workspace, id) {
        let _ = std::fs::remove_dir(new);
    }
}

/// `planes/<tier>/sessions` of every tier the workspace has.
fn tier_session_dirs(workspace: &Workspace) -> Vec<PathBuf> {
    let planes = workspace.root().join("planes");
    std::fs::read_dir(&planes)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            check_tier(&name)
                .is_ok()
                .then(|| planes.join(name).join("sessions"))
        })
        .collect()
}

/// Removes sessions whose creation a crash interrupted (`.new-*` in the
/// state directory whose lock nobody holds), in `workspace` only when
/// given. Returns the ids removed.
pub fn sweep_unfinished(state: &StateDir, workspace: Option<&Workspace>) -> Result<Vec<String>> {
    let sessions = state.path().join("sessions");
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(&sessions) else {
        return Ok(removed);
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(raw) = name.strip_prefix(".new-") else {
            continue;
        };
        if let Some(dir_name) = name.strip_suffix(".lock") {
            // A creation that died before its directory existed.
            if !sessions.join(dir_name).exists() {
                if let Ok(Some(_held)) =
                    lock_file_stable(&entry.path(), FlockArg::LockExclusiveNonblock)
                {
                    if !sessions.join(dir_name).exists() {
                        let _ = std::fs::remove_file(entry.path());
                    }
                }
            }
            continue;
        }
        let Ok(id) = SessionId::parse(raw) else {
            continue;
        };
        let dir = entry.path();
        // A creation in progress holds its creation lock: leave it alone.
        let creating = creation_lock_path(&dir);
        let Ok(Some(_held)) = lock_file_stable(&creating, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        if state.session_dir(&id).exists() {
            // It finished while we looked: a complete session, not debris.
            let _ = std::fs::remove_file(&creating);
            continue;
        }
        let meta = fsx::read_small(&dir.join("session.json"), 64 * 1024)
            .ok()
            .and_then(|b| read_record(&b).ok());
        if let Some(meta) = meta {
            let (root, tier) = (meta.root.as_str(), meta.tier.as_str());
            let ws = match workspace {
                Some(w) if w.root_str() == root => Some(w.clone()),
                Some(_) => continue,
                None => Workspace::open(Path::new(root)).ok(),
            };
            if let Some(ws) = ws {
                remove_partial_session(&ws, tier, &id);
            }
        } else if let Some(ws) = workspace {
            // No record: a power cut kept less of the state side than of
            // the workspace's (another workspace's debris, if it was
            // another's, is left to `sweep_orphans`).
            remove_recordless_debris(ws, &id);
        }
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(&creating);
        removed.push(id.to_string());
    }
    Ok(removed)
}

/// Removes, in `workspace`, `.new-<sid>` debris no state side accounts
/// for: a creation's workspace side is made under `.new-` names and synced
/// in the same round as its record, so a power cut (never a killed
/// process: its record is written first) can keep the former and lose the
/// latter, when the state directory lies on another file system or the
/// file system does not order the two. Such debris is never a session
/// ([`Session::open`] looks only at final names). Only entries last
/// changed before this boot are removed — no creation survives a reboot,
/// so a live one (of this or of another state directory) is never taken
/// for debris — and only when this state directory has no creation of that
/// id in progress. Returns the ids whose debris went.
pub fn sweep_orphans(state: &StateDir, workspace: &Workspace) -> Vec<String> {
    boot_time().map_or_else(Vec::new, |boot| {
        sweep_orphans_made_before(state, workspace, boot)
    })
}

/// [`sweep_orphans`] for debris last changed before `boot` (seconds since
/// the epoch).
fn sweep_orphans_made_before(state: &StateDir, workspace: &Workspace, boot: i64) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut removed = Vec::new();
    let mut dirs = tier_session_dirs(workspace);
    dirs.extend([
        workspace.root().join("tmp"),
        workspace.root().join("output"),
    ]);
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_prefix(".new-")
                .and_then(|raw| SessionId::parse(raw).ok())
            else {
                continue;
            };
            let before_boot = entry
                .metadata()
                .is_ok_and(|m| m.is_dir() && m.ctime() < boot);
            let new_state = state.session_dir_new(&id);
            if !before_boot
                || new_state.symlink_metadata().is_ok()
                || state.session_dir(&id).symlink_metadata().is_ok()
            {
                continue;
            }
            let creating = creation_lock_path(&new_state);
            let Ok(Some(_held)) = lock_file_stable(&creating, FlockArg::LockExclusiveNonblock)
            else {
                continue;
            };
            let _ = std::fs::remove_dir_all(entry.path());
            let _ = std::fs::remove_file(&creating);
            if !removed.contains(&id.to_string()) {
                removed.push(id.to_string());
            }
        }
    }
    removed
}

/// When this boot began, in seconds since the epoch (`btime` in
/// `/proc/stat`).
fn boot_time() -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// Opens (creating) and flocks `path`, making sure the lock is on the file
/// the path names *after* locking: lock files are removed once used, and a
/// lock taken on an unlinked inode would protect nothing. `Ok(None)`: a
/// non-blocking attempt found it held.
fn lock_file_stable(path: &Path, mode: FlockArg) -> std::io::Result<Option<Flock<File>>> {
    use std::os::unix::fs::MetadataExt;
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(fsx::libc_flags(OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC))
            .open(path)?;
        let held = match Flock::lock(file, mode) {
            Ok(h) => h,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, e)) => return Err(e.into()),
        };
        let ours = held.metadata()?.ino();
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.ino() == ours => return Ok(Some(held)),
            // Unlinked or replaced between open and lock: try again.
            _ => continue,
        }
    }
}

/// `sessions/.new-<sid>.lock`: held while a session is being created.
fn creation_lock_path(new_state: &Path) -> std::path::PathBuf {
    let mut name = new_state.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    new_state.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{OsRandom, SystemClock};

    /// A session created for a turn comes with its lock held since before
    /// it existed (so that turn skips recovery): nobody else can take it
    /// until the creator lets go.
    #[test]
    fn issue_29_a_session_created_for_its_owner_stays_locked_until_let_go() {
        let ws_dir = tempfile::tempdir().unwrap();
        let state_dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(ws_dir.path()).unwrap();
        let state = StateDir::open(&state_dir.path().join("s"), &ws, true).unwrap();
        let ids = SessionIdGenerator::new(SystemClock, OsRandom);
        let (session, lock) =
            Session::create_owned(&ws, &state, "ho1", &ids, None, Owner::caller()).unwrap();
        let try_lock = || {
            let f = File::open(state.session_lock(&session.id)).unwrap();
            Flock::lock(f, FlockArg::LockExclusiveNonblock).is_ok()
        };
        assert!(!try_lock(), "the creator's lock was let go");
        // The session is whole meanwhile: its ledgers verify.
        assert_eq!(session.verify().unwrap().len(), 2);
        drop(lock);
        assert!(try_lock(), "the lock is still held");
    }

    /// Issue 29: a new session's renames are made durable in one round, so
    /// a power cut may keep the state directory's and lose the others'. Such
    /// a session is not one until `recover` completes its renames; then it
    /// is whole.
    #[test]
    fn issue_29_a_creation_cut_off_between_its_renames_is_rolled_forward() {
        let ws_dir = tempfile::tempdir().unwrap();
        let state_dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(ws_dir.path()).unwrap();
        let state = StateDir::open(&state_dir.path().join("s"), &ws, true).unwrap();
        let ids = SessionIdGenerator::new(SystemClock, OsRandom);
        let id = Session::create(&ws, &state, "ho1", &ids, None).unwrap().id;
        assert!(
            !roll_forward_creation(&state, &ws, &id).unwrap(),
            "nothing to do"
        );
        // What the power cut kept: the state directory's rename alone.
        let session_dir = ws.ledger_dir("ho1", &id).parent().unwrap().to_path_buf();
        let mut parts = vec![(new_ledger_dir(&session_dir), session_dir)];
        parts.extend(session_trees(&ws, &id));
        for (new, done) in &parts {
            std::fs::rename(done, new).unwrap();
        }
        let err = Session::open(&ws, &state, &id, None).unwrap_err();
        assert!(
            matches!(err, SupervisorError::SessionNotFound { .. }),
            "{err}"
        );
        assert!(roll_forward_creation(&state, &ws, &id).unwrap());
        for (new, done) in &parts {
            assert!(!new.exists() && done.is_dir(), "{}", done.display());
        }
        let session = Session::open(&ws, &state, &id, None).unwrap();
        assert_eq!(session.verify().unwrap().len(), 2);
    }

    /// Issue 29: a new session's record is synced with the rest of its tree,
    /// not before the workspace side is made, so a power cut may keep the
    /// workspace's `.new-` debris and lose the record (or the whole state
    /// side). Both are swept; a complete session and a final name never are.
    #[test]
    fn issue_29_debris_without_its_record_is_swept_and_sessions_are_not() {
        let ws_dir = tempfile::tempdir().unwrap();
        let state_dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(ws_dir.path()).unwrap();
        let state = StateDir::open(&state_dir.path().join("s"), &ws, true).unwrap();
        let ids = SessionIdGenerator::new(SystemClock, OsRandom);
        let kept = Session::create(&ws, &state, "ho1", &ids, None).unwrap();
        // The creation's workspace side is under `.new-` names only.
        let root = ws.root();
        for (new, done) in session_trees(&ws, &kept.id) {
            assert!(!new.exists() && done.is_dir(), "{}", done.display());
        }
        let debris = |id: &SessionId| -> Vec<PathBuf> {
            vec![
                root.join("planes/ho1/sessions").join(format!(".new-{id}")),
                root.join("tmp").join(format!(".new-{id}")),
                root.join("output").join(format!(".new-{id}")),
            ]
        };
        let make = |id: &SessionId| {
            for d in debris(id) {
                std::fs::create_dir_all(&d).unwrap();
            }
        };
        // A state side kept without its record.
        let recordless = ids.generate().unwrap();
        make(&recordless);
        std::fs::create_dir_all(state.session_dir_new(&recordless).join("anchors")).unwrap();
        let swept = sweep_unfinished(&state, Some(&ws)).unwrap();
        assert_eq!(swept, vec![recordless.to_string()]);
        assert!(debris(&recordless).iter().all(|d| !d.exists()));
        assert!(!state.session_dir_new(&recordless).exists());
        // No state side at all: this boot's debris may be a live creation
        // (of another state directory), so it stays...
        let orphan = ids.generate().unwrap();
        make(&orphan);
        assert!(sweep_orphans(&state, &ws).is_empty());
        assert!(debris(&orphan).iter().all(|d| d.is_dir()));
        // ...and from before this boot it goes (a boot after it is
        // supposed: a ctime cannot be set back).
        let later = time::OffsetDateTime::now_utc().unix_timestamp() + 60;
        assert_eq!(
            sweep_orphans_made_before(&state, &ws, later),
            vec![orphan.to_string()]
        );
        assert!(debris(&orphan).iter().all(|d| !d.exists()));
        assert!(boot_time().is_some_and(|b| b < later));
        // The complete session was never touched.
        assert_eq!(kept.verify().unwrap().len(), 2);
        for (_, done) in session_trees(&ws, &kept.id) {
            assert!(done.is_dir());
        }
    }
}
