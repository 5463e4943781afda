//! Sessions: creation (both ledgers at once, FR-RT-018), lookup, and the
//! per-session lock that serializes turns and ledger appends.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;

use nix::fcntl::{Flock, FlockArg, OFlag};
use serde_json::{Value, json};
use turnstile_policy::SessionId;
use turnstile_policy::canonical;
use turnstile_policy::session::{Clock, RandomSource, SessionIdGenerator};
use turnstile_policy::timefmt::rfc3339_micros;

use crate::error::{Result, SupervisorError};
use crate::evidence;
use crate::fsx;
use crate::layout::{StateDir, TURN_TIER, Workspace, check_tier};
use crate::ledger::{LedgerFiles, LedgerKind, VerifyReport};

/// Proof that the caller holds the session's exclusive lock. Ledger appends
/// and turns require it; it is released when dropped.
#[derive(Debug)]
pub struct SessionLock {
    _flock: Flock<File>,
}

/// A session of one workspace.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: SessionId,
    pub tier: String,
    workspace: Workspace,
    state: StateDir,
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
    ) -> Result<Self> {
        check_tier(tier)?;
        let id = ids.generate()?;
        let session = Self {
            id,
            tier: tier.to_owned(),
            workspace: workspace.clone(),
            state: state.clone(),
        };
        session
            .initialize(ids.clock())
            .map_err(|e| SupervisorError::SessionStart(Box::new(e)))?;
        Ok(session)
    }

    fn initialize(&self, clock: &dyn Clock) -> Result<()> {
        let state_dir = self.state.session_dir(&self.id);
        fsx::create_private_dir_all(&self.state.path().join("sessions"))?;
        // create_dir_new fails if the id was somehow issued before.
        fsx::create_dir_new(&state_dir, 0o700)?;
        fsx::create_dir_new(&state_dir.join("anchors"), 0o700)?;
        let lock = self.lock()?;

        let ledger_dir = self.workspace.ledger_dir(&self.tier, &self.id);
        let session_dir = ledger_dir.parent().unwrap_or(&ledger_dir).to_path_buf();
        fsx::create_dir_all(session_dir.parent().unwrap_or(&session_dir))?;
        fsx::create_dir_new(&session_dir, 0o755)?;
        fsx::create_dir_new(&ledger_dir, 0o755)?;
        for dir in [
            self.workspace.scratch_dir(&self.id),
            self.workspace.output_dir(&self.id),
        ] {
            fsx::create_dir_all(dir.parent().unwrap_or(&dir))?;
            fsx::create_dir_new(&dir, 0o755)?;
        }

        let now = clock.now();
        for kind in LedgerKind::ALL {
            let files = self.ledger(kind);
            files.create(&lock)?;
            files.append(
                &lock,
                evidence::session_started(&self.id, &self.tier, kind, now),
            )?;
        }
        fsx::sync_dir(&ledger_dir)?;

        let meta = json!({
            "session_id": self.id.as_str(),
            "tier": self.tier,
            "root": self.workspace.root_str(),
            "created_at": rfc3339_micros(now),
        });
        let bytes = canonical::to_vec(&meta)
            .map_err(|e| SupervisorError::invalid("session", e.to_string()))?;
        fsx::write_atomic(&self.state.session_meta(&self.id), &bytes)
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
        let recorded =
            match fsx::read_small(&meta_path, 64 * 1024) {
                Ok(bytes) => Some(canonical::parse_canonical(&bytes).map_err(|e| {
                    SupervisorError::StateIo {
                        op: "parse session record",
                        path: meta_path.clone(),
                        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                    }
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
                if meta.get("root").and_then(Value::as_str) != Some(workspace.root_str()) {
                    return Err(SupervisorError::SessionNotFound {
                        session: id.to_string(),
                        path: workspace.root().to_path_buf(),
                    });
                }
                let recorded_tier = meta
                    .get("tier")
                    .and_then(Value::as_str)
                    .unwrap_or(TURN_TIER);
                if let Some(t) = tier.filter(|t| *t != recorded_tier) {
                    return Err(SupervisorError::invalid(
                        "--tier",
                        format!("session {id} was created in tier `{recorded_tier}`, not `{t}`"),
                    ));
                }
                recorded_tier.to_owned()
            }
            None => {
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
        Ok(Self {
            id: id.clone(),
            tier,
            workspace: workspace.clone(),
            state: state.clone(),
        })
    }

    /// Takes the session's exclusive lock, waiting for a concurrent turn.
    pub fn lock(&self) -> Result<SessionLock> {
        let path = self.state.session_lock(&self.id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(fsx::libc_flags(OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC))
            .open(&path)
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::NotFound => SupervisorError::SessionNotFound {
                    session: self.id.to_string(),
                    path: path.clone(),
                },
                _ => SupervisorError::StateIo {
                    op: "open session lock",
                    path: path.clone(),
                    source,
                },
            })?;
        let flock = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| {
            SupervisorError::StateIo {
                op: "lock session",
                path,
                source: errno.into(),
            }
        })?;
        Ok(SessionLock { _flock: flock })
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
    /// happens on every read (`ledger verify`, prompt headers). Anchors that
    /// predate the turn record fall back to a full verification.
    pub fn next_turn_number(&self, _lock: &SessionLock) -> Result<u64> {
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

    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }
}
