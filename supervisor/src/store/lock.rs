//! The per-session lock that serializes turns and ledger appends. Holding
//! a [`SessionLock`] is the proof every append asks for.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::{Flock, FlockArg, OFlag};
use turnstile_policy::SessionId;

use crate::error::{Result, SupervisorError};
use crate::fsx;

/// Proof that the caller holds the session's exclusive lock. Ledger appends
/// and turns require it; it is released when dropped.
#[derive(Debug)]
pub struct SessionLock {
    _flock: Flock<File>,
}

/// Opens (creating) and exclusively locks a session lock file.
pub(crate) fn lock_path(path: &Path, id: &SessionId) -> Result<SessionLock> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(fsx::libc_flags(OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC))
        .open(path)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => SupervisorError::SessionNotFound {
                session: id.to_string(),
                path: path.to_path_buf(),
            },
            _ => SupervisorError::StateIo {
                op: "open session lock",
                path: path.to_path_buf(),
                source,
            },
        })?;
    let flock = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| {
        SupervisorError::StateIo {
            op: "lock session",
            path: path.to_path_buf(),
            source: errno.into(),
        }
    })?;
    Ok(SessionLock { _flock: flock })
}
