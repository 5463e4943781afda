//! Reading the one kind of file the policy layer is handed: a small regular
//! file (a manifest, a `--request` document).
//!
//! A path given by a user or found in the workspace may name a FIFO (an
//! `open` that never returns), a device (`/dev/zero`: endless bytes; a tape:
//! a rewind on open; a tty: a controlling terminal), a directory, a socket or
//! a symlink to any of them. [`read_regular_file`] never blocks on any of
//! them and never follows a symlink in the last component:
//!
//! 1. `open` with `O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC` — a FIFO
//!    opens at once instead of waiting for a writer, a symlink fails with
//!    `ELOOP`, a socket with `ENXIO`, a tty never becomes ours;
//! 2. `fstat` the descriptor (not the path: no race with a rename) and refuse
//!    anything but a regular file, naming what it is;
//! 3. refuse a size above the limit before reading, and read at most
//!    `limit + 1` bytes in case the file grows meanwhile.
//!
//! (`O_NONBLOCK` does not affect reads of a regular file.)

use std::fs::{File, FileType, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Why a file could not be read. The caller names the file.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("is {kind}, not a regular file; give a regular file")]
    NotRegular { kind: &'static str },
    #[error("is a symbolic link; give the file itself (symlinks are not followed here)")]
    Symlink,
    #[error("is {size} bytes, larger than the limit of {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    #[error("cannot be read: {0}")]
    Io(#[source] std::io::Error),
}

impl InputError {
    /// True when the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// How a file type is named in errors.
fn describe(ft: FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Reads the whole of `path`, which must be a regular file of at most
/// `limit` bytes, without blocking and without following a symlink in its
/// last component.
pub fn read_regular_file(path: &Path, limit: u64) -> Result<Vec<u8>, InputError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // ELOOP: the last component is a symlink (O_NOFOLLOW); ENXIO: a
            // socket. Say what the path is when lstat can tell.
            Some(libc::ELOOP | libc::ENXIO) => match path.symlink_metadata() {
                Ok(m) if m.file_type().is_symlink() => InputError::Symlink,
                Ok(m) => InputError::NotRegular {
                    kind: describe(m.file_type()),
                },
                Err(_) => InputError::Io(e),
            },
            _ => InputError::Io(e),
        })?;
    read_open_file(file, limit)
}

fn read_open_file(file: File, limit: u64) -> Result<Vec<u8>, InputError> {
    let meta = file.metadata().map_err(InputError::Io)?;
    if !meta.file_type().is_file() {
        return Err(InputError::NotRegular {
            kind: describe(meta.file_type()),
        });
    }
    if meta.len() > limit {
        return Err(InputError::TooLarge {
            size: meta.len(),
            limit,
        });
    }
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(InputError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(InputError::TooLarge {
            size: bytes.len() as u64,
            limit,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Runs the read on a thread: a blocking open must fail the test, not
    /// hang it.
    fn read_within_5s(path: &Path, limit: u64) -> Result<Vec<u8>, InputError> {
        let (tx, rx) = mpsc::channel();
        let owned = path.to_path_buf();
        std::thread::spawn(move || {
            let _ = tx.send(read_regular_file(&owned, limit));
        });
        rx.recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("reading {} blocked", path.display()))
    }

    fn mkfifo(path: &Path) {
        let ok = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mkfifo {}", path.display());
    }

    #[test]
    fn reads_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.json");
        std::fs::write(&p, b"{}").unwrap();
        assert_eq!(read_within_5s(&p, 2).unwrap(), b"{}");
    }

    #[test]
    fn refuses_every_non_regular_file_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let fifo = d.join("fifo");
        mkfifo(&fifo);
        std::os::unix::fs::symlink(&fifo, d.join("to-fifo")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.join("to-zero")).unwrap();
        std::fs::write(d.join("real"), b"{}").unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("to-real")).unwrap();
        std::fs::create_dir(d.join("dir")).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(d.join("sock")).unwrap();
        let cases: &[(&Path, &str)] = &[
            (&fifo, "FIFO"),
            (&d.join("to-fifo"), "symbolic link"),
            (&d.join("to-zero"), "symbolic link"),
            (&d.join("to-real"), "symbolic link"),
            (&d.join("dir"), "directory"),
            (&d.join("sock"), "socket"),
            (Path::new("/dev/zero"), "character device"),
            (Path::new("/dev/null"), "character device"),
        ];
        for (path, needle) in cases {
            let err = read_within_5s(path, 1 << 20).unwrap_err();
            assert!(
                err.to_string().contains(needle),
                "{}: {err}",
                path.display()
            );
        }
    }

    #[test]
    fn caps_the_size_and_reports_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big");
        std::fs::write(&p, vec![b' '; 11]).unwrap();
        let err = read_within_5s(&p, 10).unwrap_err();
        assert!(
            matches!(
                err,
                InputError::TooLarge {
                    size: 11,
                    limit: 10
                }
            ),
            "{err}"
        );
        assert_eq!(read_within_5s(&p, 11).unwrap().len(), 11);
        assert!(
            read_within_5s(&dir.path().join("nope"), 10)
                .unwrap_err()
                .is_not_found()
        );
    }
}
