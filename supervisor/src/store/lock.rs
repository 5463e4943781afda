//! The per-session lock that serializes turns and ledger appends. Holding
//! a [`SessionLock`] is the proof every append asks for.
//!
//! Each holder also leaves its [`Stamp`] in the lock file as it takes the
//! lock, and learns the stamp it found there: the stamp of the last holder.
//! A process that finds its own stamp from an earlier holding knows that no
//! other process held the session since — so nothing of another, possibly
//! dead, writer can be left to recover (see `recover::Between`).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::fcntl::{Flock, FlockArg, OFlag};
use turnstile_policy::SessionId;

use crate::error::{Result, SupervisorError};
use crate::fsx;

/// Which holding of a session lock: unique among the holdings of any
/// live process (this process's pid, a counter of its holdings, and the
/// monotonic clock's nanoseconds when it was taken — a pid of another pid
/// namespace cannot share the instant too). Not a time of day: it is never
/// recorded anywhere but in the lock file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp([u8; 16]);

impl Stamp {
    fn new() -> Self {
        static HOLDINGS: AtomicU32 = AtomicU32::new(0);
        let mut ts = nix::libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call.
        unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut ts) };
        let nanos = (ts.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64);
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&std::process::id().to_le_bytes());
        b[4..8].copy_from_slice(&HOLDINGS.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        b[8..].copy_from_slice(&nanos.to_le_bytes());
        Self(b)
    }

    /// Leaves a new stamp in the locked `file`; returns (the stamp found,
    /// the new one). A stamp that cannot be written is not an error: the
    /// file then holds something that is no one's stamp — every later
    /// holder recovers, as before stamps existed.
    pub(crate) fn renew(file: &File) -> (Option<Stamp>, Stamp) {
        let mut found = [0u8; 16];
        let found = matches!(file.read_at(&mut found, 0), Ok(16)).then_some(Stamp(found));
        let mine = Self::new();
        if file.write_at(&mine.0, 0).ok() != Some(16) {
            let _ = file.set_len(0);
        }
        (found, mine)
    }
}

/// Proof that the caller holds the session's exclusive lock. Ledger appends
/// and turns require it; it is released when dropped.
#[derive(Debug)]
pub struct SessionLock {
    _flock: Flock<File>,
    /// The stamp of the last holder before this one.
    found: Option<Stamp>,
    /// This holding's.
    stamp: Stamp,
}

impl SessionLock {
    /// Whether the last holder before this one was the holding stamped
    /// `earlier`: no process held the session in between.
    pub fn follows(&self, earlier: Stamp) -> bool {
        self.found == Some(earlier)
    }

    /// This holding's stamp.
    pub fn stamp(&self) -> Stamp {
        self.stamp
    }
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
    let (found, stamp) = Stamp::renew(&flock);
    Ok(SessionLock {
        _flock: flock,
        found,
        stamp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each holding finds the stamp of the one before it, and no other.
    #[test]
    fn issue_29_a_holding_finds_the_stamp_of_the_last_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let id = SessionId::parse("SES-20260101T000000000000Z-0123456789abcdef").unwrap();
        let first = lock_path(&path, &id).unwrap();
        let a = first.stamp();
        assert_eq!(first.found, None, "a new lock file holds no stamp");
        drop(first);
        let second = lock_path(&path, &id).unwrap();
        assert!(second.follows(a));
        let b = second.stamp();
        assert_ne!(a, b);
        drop(second);
        let third = lock_path(&path, &id).unwrap();
        assert!(third.follows(b) && !third.follows(a));
        drop(third);
        // Another holder in between (here: a write of its stamp).
        std::fs::write(&path, b"someone else's stamp").unwrap();
        let fourth = lock_path(&path, &id).unwrap();
        assert!(!fourth.follows(b));
    }
}
