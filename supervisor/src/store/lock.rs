//! The per-session lock that serializes turns and ledger appends. Holding
//! a [`SessionLock`] is the proof every append asks for.
//!
//! Each holder also leaves its [`Stamp`] in the lock file as it takes the
//! lock, and learns what it found there. A holder that can leave something
//! for recovery ([`SessionLock::mark_changed`]: a turn once admitted, a
//! revert once it writes, a recovery that settled something, a ledger
//! append that failed) keeps its stamp, and so does one that dies holding
//! the lock; any other puts back what it found as it lets go — a request
//! refused under the lock changes no byte on disk, and a whole ledger
//! append leaves nothing to settle. A process that finds its own stamp
//! from an earlier holding therefore knows that no holder since can have
//! left anything to recover (see `recover::Between`).

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
        let nanos = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |ts| {
            (ts.tv_sec() as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(ts.tv_nsec() as u64)
        });
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&std::process::id().to_le_bytes());
        b[4..8].copy_from_slice(&HOLDINGS.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        b[8..].copy_from_slice(&nanos.to_le_bytes());
        Self(b)
    }

    /// Leaves a new stamp in the locked `file`; returns what the file held
    /// (at most [`Stamp::MAX_FOUND`] bytes: a longer file is left alone,
    /// and `None` for the new stamp says so) and the new stamp. A stamp
    /// that cannot be written is not an error: the file then holds
    /// something that is no one's stamp, and every later holder recovers,
    /// as before stamps existed.
    pub(crate) fn renew(file: &File) -> (Vec<u8>, Option<Stamp>) {
        let mut found = vec![0u8; Self::MAX_FOUND + 1];
        let n = file.read_at(&mut found, 0).unwrap_or(Self::MAX_FOUND + 1);
        if n > Self::MAX_FOUND {
            return (Vec::new(), None);
        }
        found.truncate(n);
        let mine = Self::new();
        if file.write_at(&mine.0, 0).ok() != Some(16) {
            let _ = file.set_len(0);
        } else if n > 16 {
            let _ = file.set_len(16);
        }
        (found, Some(mine))
    }

    /// The longest lock file whose content a holder keeps to put back.
    const MAX_FOUND: usize = 64;
}

/// Proof that the caller holds the session's exclusive lock. Ledger appends
/// and turns require it; it is released when dropped.
#[derive(Debug)]
pub struct SessionLock {
    flock: Flock<File>,
    /// What the lock file held when this holding began.
    found: Vec<u8>,
    /// This holding's stamp, once written.
    stamp: Option<Stamp>,
    /// Whether this holding changed the session (its stamp stays).
    changed: std::sync::atomic::AtomicBool,
}

impl SessionLock {
    /// Whether the last holder that kept its stamp (see the module docs)
    /// before this one was the holding stamped `earlier`.
    pub fn follows(&self, earlier: Stamp) -> bool {
        self.found.as_slice() == earlier.0.as_slice()
    }

    /// This holding's stamp, which stays in the lock file: the holder may
    /// leave something for recovery, or keeps the stamp to know its holding
    /// again (`recover::Between`). `None` when none could be written.
    pub fn mark_changed(&self) -> Option<Stamp> {
        self.changed.store(true, Ordering::Relaxed);
        self.stamp
    }
}

impl Drop for SessionLock {
    /// A holding that changed nothing puts back what it found, still under
    /// the lock (the flock goes with the descriptor after this).
    fn drop(&mut self) {
        if self.stamp.is_some() && !self.changed.load(Ordering::Relaxed) {
            if self.flock.write_at(&self.found, 0).ok() == Some(self.found.len()) {
                let _ = self.flock.set_len(self.found.len() as u64);
            }
        }
    }
}

/// Opens (creating) and exclusively locks a session lock file.
pub(crate) fn lock_path(path: &Path, id: &SessionId) -> Result<SessionLock> {
    // A blocking lock is never refused for being held.
    lock_path_as(path, id, FlockArg::LockExclusive)?.ok_or_else(|| SupervisorError::StateIo {
        op: "lock session",
        path: path.to_path_buf(),
        source: nix::errno::Errno::EWOULDBLOCK.into(),
    })
}

/// [`lock_path`] without waiting: `None` while another holds it.
pub(crate) fn try_lock_path(path: &Path, id: &SessionId) -> Result<Option<SessionLock>> {
    lock_path_as(path, id, FlockArg::LockExclusiveNonblock)
}

fn lock_path_as(path: &Path, id: &SessionId, mode: FlockArg) -> Result<Option<SessionLock>> {
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
    let flock = match Flock::lock(file, mode) {
        Ok(f) => f,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(None),
        Err((_, errno)) => {
            return Err(SupervisorError::StateIo {
                op: "lock session",
                path: path.to_path_buf(),
                source: errno.into(),
            });
        }
    };
    let (found, stamp) = Stamp::renew(&flock);
    Ok(Some(SessionLock {
        flock,
        found,
        stamp,
        changed: std::sync::atomic::AtomicBool::new(false),
    }))
}

#[cfg(test)]
impl SessionLock {
    /// Lets go as a process that dies holding the lock does: the
    /// descriptor closes, nothing is put back.
    pub(crate) fn die(self) {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped nor used again; the flock is read
        // out once and dropped here (closing the descriptor, releasing the
        // lock). The other fields leak, which a test can afford.
        drop(unsafe { std::ptr::read(&this.flock) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each holding that keeps its stamp leaves it for the next to find;
    /// any other leaves the file as it found it.
    #[test]
    fn issue_29_a_holding_finds_the_stamp_of_the_last_holder_that_changed_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let id = SessionId::parse("SES-20260101T000000000000Z-0123456789abcdef").unwrap();
        let first = lock_path(&path, &id).unwrap();
        assert!(first.found.is_empty(), "a new lock file holds no stamp");
        let a = first.mark_changed().unwrap();
        drop(first);
        let second = lock_path(&path, &id).unwrap();
        assert!(second.follows(a));
        let b = second.mark_changed().unwrap();
        assert_ne!(a, b);
        drop(second);
        // A holding that changes nothing: the bytes are as it found them.
        let before = std::fs::read(&path).unwrap();
        let idle = lock_path(&path, &id).unwrap();
        assert!(idle.follows(b) && !idle.follows(a));
        assert_ne!(std::fs::read(&path).unwrap(), before, "stamped while held");
        drop(idle);
        assert_eq!(std::fs::read(&path).unwrap(), before);
        let third = lock_path(&path, &id).unwrap();
        assert!(third.follows(b));
        // Died holding it: its stamp stays.
        third.die();
        let fourth = lock_path(&path, &id).unwrap();
        assert!(!fourth.follows(b));
        drop(fourth);
        // Another writer's bytes (an older build, a hand): kept as found.
        std::fs::write(&path, b"someone else's stamp").unwrap();
        let fifth = lock_path(&path, &id).unwrap();
        assert!(!fifth.follows(b));
        drop(fifth);
        assert_eq!(std::fs::read(&path).unwrap(), b"someone else's stamp");
    }
}
