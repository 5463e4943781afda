//! Where things live: the workspace root (`--root`) and the supervisor's state
//! directory (`--state-dir`), and every path derived from them.
//!
//! The two never overlap: overlayfs refuses an upper dir inside its lower
//! tree, and the sandbox must never see supervisor state (anchors, locks).

use std::path::{Path, PathBuf};

use turnstile_policy::SessionId;

use crate::error::{Result, SupervisorError};
use crate::store::ledger::LedgerKind;

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/turnstile";

/// The tier that holds turn ledgers.
pub const TURN_TIER: &str = "ho1";

/// A canonical, existing workspace root.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    root_str: String,
}

impl Workspace {
    /// Opens an existing workspace root. The path is canonicalized (symlinks
    /// resolved) because every pattern is matched against real paths.
    pub fn open(root: &Path) -> Result<Self> {
        let canonical = std::fs::canonicalize(root)
            .map_err(|e| SupervisorError::invalid("--root", format!("{}: {e}", root.display())))?;
        if !canonical.is_dir() {
            return Err(SupervisorError::invalid(
                "--root",
                format!("{} is not a directory", canonical.display()),
            ));
        }
        if canonical == Path::new("/") {
            return Err(SupervisorError::invalid(
                "--root",
                "the file system root cannot be a workspace",
            ));
        }
        let root_str = canonical
            .to_str()
            .ok_or_else(|| SupervisorError::invalid("--root", "path is not valid UTF-8"))?
            .to_owned();
        Ok(Self {
            root: canonical,
            root_str,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn root_str(&self) -> &str {
        &self.root_str
    }

    pub fn sessions_dir(&self, tier: &str) -> PathBuf {
        self.root.join("planes").join(tier).join("sessions")
    }

    pub fn ledger_dir(&self, tier: &str, session: &SessionId) -> PathBuf {
        self.sessions_dir(tier)
            .join(session.as_str())
            .join("ledger")
    }

    /// Workspace-relative: where the session keeps the pre-images of what
    /// its commits replace or remove (for `supervise revert`), beside its
    /// ledger directory.
    pub fn preimages_rel(tier: &str, session: &SessionId) -> String {
        format!("planes/{tier}/sessions/{}/preimages", session.as_str())
    }

    pub fn ledger_path(&self, tier: &str, session: &SessionId, kind: LedgerKind) -> PathBuf {
        self.ledger_dir(tier, session).join(kind.file_name())
    }

    /// `tmp/<sid>/`: the session's scratch space (TMPDIR inside a turn).
    pub fn scratch_dir(&self, session: &SessionId) -> PathBuf {
        self.root.join("tmp").join(session.as_str())
    }

    /// `tmp/.<sid>.t<n>.commit`: a commit's private staging directory,
    /// beside the scratch dir (same file system, outside the sandbox's
    /// writable scopes). Workspace-relative.
    pub fn commit_work_dir(session: &SessionId, turn: u64) -> String {
        format!("tmp/.{}.t{turn}.commit", session.as_str())
    }

    /// `output/<sid>/`: where committed outputs land.
    pub fn output_dir(&self, session: &SessionId) -> PathBuf {
        self.root.join("output").join(session.as_str())
    }

    /// Refuses a workspace whose session trees (`tmp`, `output`, `planes`)
    /// are anything but real directories, or absent: through a symbolic
    /// link there a session's directories were made outside the workspace
    /// (red-team M3, stop 54).
    pub fn check_session_trees(&self) -> Result<()> {
        for tree in ["tmp", "output", "planes"] {
            self.check_real_dir(tree, "--root", true)?;
        }
        Ok(())
    }

    /// A session's own `tmp/<sid>` and `output/<sid>` are real
    /// directories, checked before a turn runs: one replaced by a symbolic
    /// link (or a file) was found only at commit, after the command ran.
    pub fn check_session_dirs(&self, session: &SessionId) -> Result<()> {
        self.check_session_trees()?;
        for tree in ["tmp", "output"] {
            self.check_real_dir(&format!("{tree}/{}", session.as_str()), "--session", false)?;
        }
        Ok(())
    }

    fn check_real_dir(&self, rel: &str, field: &str, may_be_absent: bool) -> Result<()> {
        let path = self.root.join(rel);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && may_be_absent => Ok(()),
            Ok(m) => Err(SupervisorError::invalid(
                field,
                format!(
                    "`{rel}` in the workspace is {}, not a directory: a session's directories must lie in the workspace; nothing was run",
                    if m.file_type().is_symlink() {
                        "a symbolic link"
                    } else {
                        "not a directory"
                    }
                ),
            )),
            Err(e) => Err(SupervisorError::invalid(
                field,
                format!("`{rel}` in the workspace: {e}; nothing was run"),
            )),
        }
    }
}

/// The supervisor's private state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
}

impl StateDir {
    /// Resolves the state dir and checks it does not overlap the workspace.
    /// With `create`, a missing state dir is created (mode 0700).
    pub fn open(path: &Path, workspace: &Workspace, create: bool) -> Result<Self> {
        if !path.is_absolute() {
            return Err(SupervisorError::invalid(
                "--state-dir",
                format!("{} must be an absolute path", path.display()),
            ));
        }
        let resolved = resolve_existing_prefix(path);
        // The turn directories live here, and the OCI backends name their
        // overlay layers by path, where these separate options: refused now
        // (exit 2) rather than failing every turn (E2041) after a session
        // was made (red-team, stop 54).
        if resolved
            .to_str()
            .is_none_or(|s| s.contains([',', ':', '\\']))
        {
            return Err(SupervisorError::invalid(
                "--state-dir",
                format!(
                    "{}: a state directory's path must be UTF-8 without `,`, `:` or `\\` (turn directories under it are overlay layers)",
                    path.display()
                ),
            ));
        }
        let root = workspace.root();
        if resolved.starts_with(root) || root.starts_with(&resolved) {
            return Err(SupervisorError::invalid(
                "--state-dir",
                format!(
                    "{} overlaps the workspace root {}; supervisor state must live outside it",
                    path.display(),
                    root.display()
                ),
            ));
        }
        if create {
            crate::fsx::create_private_dir_all(&resolved)?;
        }
        Ok(Self { path: resolved })
    }

    /// A state directory without a workspace to check it against (for
    /// `supervise recover` across every workspace).
    pub fn at(path: &Path) -> Self {
        Self {
            path: resolve_existing_prefix(path),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn session_dir(&self, session: &SessionId) -> PathBuf {
        self.path.join("sessions").join(session.as_str())
    }

    pub fn session_lock(&self, session: &SessionId) -> PathBuf {
        self.session_dir(session).join("lock")
    }

    pub fn session_meta(&self, session: &SessionId) -> PathBuf {
        self.session_dir(session).join("session.json")
    }

    /// A turn's private directory (mount points, plan, upper dirs).
    pub fn turn_dir(&self, session: &SessionId, turn: u64) -> PathBuf {
        self.session_dir(session).join(format!("turn-{turn}"))
    }

    /// A turn's commit journal.
    pub fn commit_journal(&self, session: &SessionId, turn: u64) -> PathBuf {
        self.session_dir(session)
            .join(format!("turn-{turn}.commit"))
    }

    /// Where a session is assembled before it is renamed into place.
    pub fn session_dir_new(&self, session: &SessionId) -> PathBuf {
        self.path
            .join("sessions")
            .join(format!(".new-{}", session.as_str()))
    }

    pub fn anchor_path(&self, session: &SessionId, kind: LedgerKind) -> PathBuf {
        self.session_dir(session)
            .join("anchors")
            .join(format!("{}.json", kind.as_str()))
    }
}

/// Canonicalizes the longest existing prefix of `path` and appends the rest,
/// so overlap checks see through symlinks even before the directory exists.
fn resolve_existing_prefix(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = std::fs::canonicalize(&existing) {
            let mut out = c;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_owned());
                existing = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Validates a tier name: `ho` and one to three digits.
pub fn check_tier(tier: &str) -> Result<()> {
    let ok = tier
        .strip_prefix("ho")
        .is_some_and(|d| (1..=3).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()));
    if ok {
        Ok(())
    } else {
        Err(SupervisorError::invalid(
            "--tier",
            format!("`{}` is not a tier like `ho1`", tier.escape_debug()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_dir_may_not_overlap_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let inside = dir.path().join("state");
        assert!(StateDir::open(&inside, &ws, false).is_err());
        assert!(!inside.exists());
        assert!(StateDir::open(dir.path().parent().unwrap(), &ws, false).is_err());
        let other = tempfile::tempdir().unwrap();
        assert!(StateDir::open(&other.path().join("s"), &ws, false).is_ok());
    }

    #[test]
    fn tiers_are_validated() {
        assert!(check_tier("ho1").is_ok());
        assert!(check_tier("ho22").is_ok());
        for bad in ["", "ho", "h1", "ho1/..", "HO1", "ho1234"] {
            assert!(check_tier(bad).is_err(), "{bad}");
        }
    }
}
