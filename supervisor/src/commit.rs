//! Commit: a verified turn's declared outputs land in the workspace, all or
//! nothing, and its scratch delta is applied to `tmp/<sid>/`.
//!
//! Every output is read from its upper dir through one descriptor opened
//! without following symlinks, hashed while it is copied into a staging file
//! next to its destination, checked against the hash recorded at capture,
//! fsync'd, and only when every output is staged are they renamed into place.
//! Destination directories are created component by component, never
//! through a symlink. Modes are normalised (0644 files, 0755 dirs); xattrs
//! are not copied.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2, renameat};
use nix::sys::stat::Mode;
use nix::unistd::unlinkat;
use sha2::{Digest, Sha256};

use crate::capture::{Kind, RealizedWrite, Scope};
use crate::error::{Result, SupervisorError};
use crate::fsx;

fn commit_err(detail: String) -> SupervisorError {
    SupervisorError::Sandbox {
        step: "commit",
        detail,
        source: None,
    }
}

fn beneath(flags: OFlag, mode: Mode) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .mode(mode)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        )
}

/// Opens (creating as needed, mode 0755) the directory `rel` under `root`,
/// one component at a time, never through a symlink.
pub(crate) fn open_dir_creating(root: &Path, rel: &str) -> Result<OwnedFd> {
    let mut fd: OwnedFd = File::open(root)
        .map_err(|e| commit_err(format!("{}: {e}", root.display())))?
        .into();
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        match nix::sys::stat::mkdirat(fd.as_fd(), part, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(commit_err(format!("mkdir {rel}: {e}"))),
        }
        fd = openat2(
            fd.as_fd(),
            part,
            beneath(OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()),
        )
        .map_err(|e| commit_err(format!("open {rel} (component `{part}`): {e}")))?;
    }
    Ok(fd)
}

/// Destination directories opened so far, by workspace-relative path: each
/// is walked and opened once per commit, however many files land in it.
type DirCache = std::collections::HashMap<String, std::rc::Rc<OwnedFd>>;

fn cached_dir(root: &Path, dir_rel: &str, cache: &mut DirCache) -> Result<std::rc::Rc<OwnedFd>> {
    if let Some(fd) = cache.get(dir_rel) {
        return Ok(std::rc::Rc::clone(fd));
    }
    let fd = std::rc::Rc::new(open_dir_creating(root, dir_rel)?);
    cache.insert(dir_rel.to_owned(), std::rc::Rc::clone(&fd));
    Ok(fd)
}

/// A staged file waiting for its rename.
struct Staged {
    dir: std::rc::Rc<OwnedFd>,
    temp: String,
    name: String,
    dir_rel: String,
}

/// Copies `source` (an upper-dir file) into a staging file in `dest_rel`'s
/// directory, hashing from the same descriptor; checks the hash. Not yet
/// durable: the caller syncs the file system once for all staged files.
fn stage(
    root: &Path,
    scope: &Scope,
    source_rel: &str,
    dest_rel: &str,
    expected: Option<&str>,
    dirs: &mut DirCache,
) -> Result<Staged> {
    let mut src = File::from(
        fsx::open_beneath(&scope.upper, source_rel)
            .map_err(|e| commit_err(format!("{dest_rel}: {e}")))?,
    );
    if !src.metadata().map(|m| m.is_file()).unwrap_or(false) {
        return Err(commit_err(format!("{dest_rel}: not a regular file")));
    }
    let (dir_rel, name) = dest_rel.rsplit_once('/').unwrap_or(("", dest_rel));
    let dir = cached_dir(root, dir_rel, dirs)?;
    let temp = format!(".{name}.turnstile-{:016x}", getrandom::u64().unwrap_or(0));
    let mut dst = File::from(
        openat2(
            dir.as_fd(),
            temp.as_str(),
            beneath(
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                Mode::from_bits_truncate(0o644),
            ),
        )
        .map_err(|e| commit_err(format!("stage {dest_rel}: {e}")))?,
    );
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let copy = (|| -> std::io::Result<()> {
        loop {
            let n = src.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            dst.write_all(&buf[..n])?;
        }
        Ok(())
    })();
    let staged = Staged {
        dir,
        temp,
        name: name.to_owned(),
        dir_rel: dir_rel.to_owned(),
    };
    if let Err(e) = copy {
        discard(&staged);
        return Err(commit_err(format!("copy {dest_rel}: {e}")));
    }
    let got = hex::encode(hasher.finalize());
    if let Some(want) = expected {
        if got != want {
            discard(&staged);
            return Err(commit_err(format!(
                "{dest_rel}: content changed between capture and commit"
            )));
        }
    }
    Ok(staged)
}

/// Makes the staged files durable: nothing to do for none, one fsync each
/// for a few, one syncfs of the workspace's file system for many (10,000
/// per-file fsyncs cost seconds; a syncfs also flushes unrelated dirty
/// data, which only pays off in bulk).
fn make_durable(root: &File, staged: &[Staged]) -> Result<()> {
    const PER_FILE_MAX: usize = 32;
    if staged.len() > PER_FILE_MAX {
        return nix::unistd::syncfs(root).map_err(|e| commit_err(format!("syncfs: {e}")));
    }
    for s in staged {
        let f = openat2(
            s.dir.as_fd(),
            s.temp.as_str(),
            beneath(OFlag::O_RDONLY, Mode::empty()),
        )
        .map_err(|e| commit_err(format!("{}/{}: {e}", s.dir_rel, s.name)))?;
        nix::unistd::fsync(f.as_fd())
            .map_err(|e| commit_err(format!("fsync {}/{}: {e}", s.dir_rel, s.name)))?;
    }
    Ok(())
}

fn discard(s: &Staged) {
    let _ = unlinkat(
        s.dir.as_fd(),
        s.temp.as_str(),
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    );
}

/// One committed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

fn scope_of<'a>(scopes: &'a [Scope], w: &RealizedWrite) -> Result<(&'a Scope, String)> {
    let scope = scopes
        .get(w.scope)
        .ok_or_else(|| commit_err(format!("{}: unknown scope", w.path)))?;
    let rel = w
        .path
        .strip_prefix(&format!("{}/", scope.relative))
        .ok_or_else(|| commit_err(format!("{}: outside its scope", w.path)))?;
    Ok((scope, rel.to_owned()))
}

/// Commits the declared outputs (`matched`), then applies the scratch delta.
/// Scratch files and directories are owned by `owner` (the turn's uid/gid)
/// so the session's next turn can change them; outputs stay root's.
pub fn commit(
    root: &Path,
    scopes: &[Scope],
    matched: &[RealizedWrite],
    scratch: &[RealizedWrite],
    owner: (u32, u32),
) -> Result<Vec<Committed>> {
    // 1. Stage every output; on any failure discard them all. One syncfs
    // then makes every staged byte durable (one flush instead of one fsync
    // per file: 10,000 outputs took 10.7 s with per-file fsync).
    let mut dirs = DirCache::new();
    let mut staged = Vec::new();
    for w in matched {
        let (scope, rel) = scope_of(scopes, w)?;
        match stage(root, scope, &rel, &w.path, w.sha256.as_deref(), &mut dirs) {
            Ok(s) => staged.push(s),
            Err(e) => {
                staged.iter().for_each(discard);
                return Err(e);
            }
        }
    }
    let root_fd = File::open(root).map_err(|e| commit_err(format!("{}: {e}", root.display())))?;
    if let Err(e) = make_durable(&root_fd, &staged) {
        staged.iter().for_each(discard);
        return Err(e);
    }
    // 2. Rename into place, then make the directory entries durable.
    for s in &staged {
        renameat(
            s.dir.as_fd(),
            s.temp.as_str(),
            s.dir.as_fd(),
            s.name.as_str(),
        )
        .map_err(|e| commit_err(format!("rename into {}/{}: {e}", s.dir_rel, s.name)))?;
    }
    // The directories that received renames (none for a turn that
    // committed nothing).
    for s in &staged {
        if dirs.remove(&s.dir_rel).is_some() {
            nix::unistd::fsync(s.dir.as_fd())
                .map_err(|e| commit_err(format!("fsync {}: {e}", s.dir_rel)))?;
        }
    }
    // 3. The scratch delta, in path order (parents before children).
    for w in scratch {
        let (scope, rel) = scope_of(scopes, w)?;
        let host = root.join(&w.path);
        match w.kind {
            Kind::Deleted => remove_host(&host)?,
            Kind::OpaqueDir | Kind::Dir => {
                if w.kind == Kind::OpaqueDir {
                    remove_host(&host)?;
                }
                let fd = open_dir_creating(root, &w.path)?;
                chown_fd(fd.as_fd(), owner, &w.path)?;
            }
            Kind::File => {
                let s = stage(root, scope, &rel, &w.path, w.sha256.as_deref(), &mut dirs)?;
                let staged = openat2(
                    s.dir.as_fd(),
                    s.temp.as_str(),
                    beneath(OFlag::O_RDONLY, Mode::empty()),
                )
                .map_err(|e| commit_err(format!("{}: {e}", w.path)))?;
                chown_fd(staged.as_fd(), owner, &w.path)?;
                renameat(
                    s.dir.as_fd(),
                    s.temp.as_str(),
                    s.dir.as_fd(),
                    s.name.as_str(),
                )
                .map_err(|e| commit_err(format!("rename {}: {e}", w.path)))?;
            }
            // Links and special files never leave the sandbox.
            Kind::Symlink | Kind::Special => {}
        }
    }
    if scratch
        .iter()
        .any(|w| w.kind != Kind::Symlink && w.kind != Kind::Special)
    {
        nix::unistd::syncfs(&root_fd).map_err(|e| commit_err(format!("syncfs: {e}")))?;
    }
    Ok(matched
        .iter()
        .map(|w| Committed {
            path: w.path.clone(),
            size: w.size,
            sha256: w.sha256.clone().unwrap_or_default(),
        })
        .collect())
}

fn chown_fd(fd: std::os::fd::BorrowedFd<'_>, (uid, gid): (u32, u32), what: &str) -> Result<()> {
    nix::unistd::fchown(
        fd,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )
    .map_err(|e| commit_err(format!("chown {what}: {e}")))
}

fn remove_host(path: &Path) -> Result<()> {
    match path.symlink_metadata() {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => Ok(()),
    }
    .map_err(|e| commit_err(format!("remove {}: {e}", path.display())))
}
