//! Small, careful file-system helpers: durable atomic writes, private
//! directories, append-only opens, and reads that never leave the workspace.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::Mode;
use sha2::{Digest, Sha256};

use crate::error::{Result, SupervisorError};

/// Maps an I/O error on `path` in the state dir (or another supervisor-owned
/// place) to `SupervisorError::StateIo`.
pub(crate) fn state_io(
    op: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> SupervisorError {
    let path = path.to_path_buf();
    move |source| SupervisorError::StateIo { op, path, source }
}

/// `mkdir -p` with mode 0700 for every directory it creates.
pub fn create_private_dir_all(path: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(state_io("create directory", path))
}

/// Creates exactly `path` (its parent must exist); fails if it exists.
pub fn create_dir_new(path: &Path, mode: u32) -> Result<()> {
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(state_io("create directory", path))
}

/// `mkdir -p` with mode 0755 for workspace directories.
pub fn create_dir_all(path: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(state_io("create directory", path))
}

/// fsyncs a directory so entries created or renamed in it are durable.
pub fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(state_io("fsync directory", path))
}

/// fsyncs every one of `paths` (files or directories) at once — the first
/// on the calling thread, the others on parked workers
/// ([`crate::syncpool`]) — and returns when all are durable: their flushes
/// go to the file system together and share its journal commits, instead
/// of queueing one behind the other (~0.25 ms each on the test host's
/// virtio disk). The first error, in `paths` order.
pub fn sync_all_at_once(paths: &[&Path]) -> Result<()> {
    let jobs = paths
        .iter()
        .map(|p| {
            let p = p.to_path_buf();
            Box::new(move || -> Result<()> {
                File::open(&p)
                    .and_then(|f| f.sync_all())
                    .map_err(state_io("fsync", &p))
            }) as Box<dyn FnOnce() -> Result<()> + Send>
        })
        .collect();
    crate::syncpool::run_all(jobs).into_iter().collect()
}

/// Writes `bytes` to a new file `path` (mode 0600, not following a link),
/// without syncing it: for a directory still being built under a temporary
/// name, synced as a whole ([`sync_all_at_once`]) before it is renamed
/// into place.
pub fn write_new_unsynced(path: &Path, bytes: &[u8]) -> Result<()> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc_flags(OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC))
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(state_io("write", path))
}

/// Writes `bytes` to `path` atomically and durably: a temporary file in the
/// same directory, fsync, rename over `path`, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().ok_or_else(|| {
        SupervisorError::invalid("path", format!("{} has no parent", path.display()))
    })?;
    // Only a regular file is replaced: the rename would put a file in the
    // place of a FIFO, a device (`report --html /dev/full` replaced the
    // host's node) or a symlink.
    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(state_io("write", path)(not_regular()));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc_flags(OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC))
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(state_io("write", path)(e));
    }
    sync_dir(dir)
}

/// The error for a path that is there but no regular file.
pub fn not_regular() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")
}

/// Reads a whole small file (at most `limit` bytes) without following a
/// symlink in its last component.
pub fn read_small(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    // O_NONBLOCK: a FIFO put in a file's place must not hang the open (or
    // the read: it is refused below); a regular file ignores the flag.
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc_flags(
            OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        ))
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(not_regular());
    }
    // Sized from the file's length (`take` hides it from `read_to_end`,
    // which would otherwise probe with 32 bytes and double: eight reads
    // for a 2 KB anchor instead of two).
    let len = f.metadata().map_or(0, |m| m.len()).min(limit);
    read_at_most(f, len, limit)
}

/// The rest of `f` (about `len` bytes), an `InvalidData` error past `limit`.
fn read_at_most(f: std::fs::File, len: u64, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0).saturating_add(1));
    f.take(limit + 1).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(out)
}

/// Reads the regular file `path` (symlinks followed) up to `limit` bytes:
/// a FIFO, a device or a directory is refused without waiting on it
/// (opened non-blocking), and a larger file is an `InvalidData` error —
/// for files a caller names (`--config`), never `/dev/zero` read for ever.
pub fn read_regular(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc_flags(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC))
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    read_at_most(f, meta.len().min(limit), limit)
}

pub(crate) fn libc_flags(flags: OFlag) -> i32 {
    flags.bits()
}

/// Opens `relative` under `root` for reading without ever leaving `root` and
/// without following any symlink (openat2 RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS). Absolute paths are accepted
/// only when they lie under `root`.
pub fn open_beneath(root: &Path, path: &str) -> std::io::Result<OwnedFd> {
    let root_str = root.to_string_lossy();
    let relative = match path.strip_prefix('/') {
        Some(_) => path
            .strip_prefix(root_str.as_ref())
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "absolute path outside the workspace root",
                )
            })?,
        None => path,
    };
    let dir = File::open(root)?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY)
        .mode(Mode::empty())
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    Ok(openat2(dir.as_fd(), relative, how)?)
}

/// sha256 (lowercase hex) and size of a regular file opened with
/// [`open_beneath`].
pub fn hash_beneath(root: &Path, path: &str) -> std::io::Result<(String, u64)> {
    let mut file = File::from(open_beneath(root, path)?);
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_refuse_existing_files_and_sync_at_once_names_what_failed() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        write_new_unsynced(&a, b"one").unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"one");
        // create_new: an existing file (or a link planted there) is refused.
        assert!(write_new_unsynced(&a, b"two").is_err());
        assert_eq!(std::fs::read(&a).unwrap(), b"one");
        sync_all_at_once(&[&a, dir.path()]).unwrap();
        let missing = dir.path().join("missing");
        let err = sync_all_at_once(&[&a, &missing, dir.path()]).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn open_beneath_refuses_symlinks_and_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a.txt"), b"abc").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        std::fs::create_dir(root.join("d")).unwrap();
        std::os::unix::fs::symlink(root.join("d"), root.join("dlink")).unwrap();
        std::fs::write(root.join("d/x"), b"x").unwrap();

        let (h, n) = hash_beneath(root, "a.txt").unwrap();
        assert_eq!(n, 3);
        assert_eq!(
            h,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let abs = format!("{}/a.txt", root.display());
        assert!(hash_beneath(root, &abs).is_ok());
        assert!(hash_beneath(root, "link").is_err());
        assert!(hash_beneath(root, "dlink/x").is_err());
        assert!(hash_beneath(root, "../etc/passwd").is_err());
        assert!(hash_beneath(root, "/etc/passwd").is_err());
        assert!(hash_beneath(root, "d").is_err());
    }

    #[test]
    fn write_atomic_replaces_content() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
