//! Commit: a verified turn's declared outputs land in the workspace, all or
//! nothing, and its scratch delta is applied to `tmp/<sid>/` — across
//! crashes too.
//!
//! The protocol is a journal in the state directory:
//!
//! 1. the journal is written (`phase: staging`) listing every operation,
//!    every staging name and every directory the commit will create;
//! 2. every output is copied from its upper dir into a staging file next to
//!    its destination, hashed from the same descriptor and checked against
//!    the capture; scratch files and symlinks are staged in a private
//!    directory beside `tmp/<sid>/`; everything staged is made durable;
//! 3. the journal moves to `phase: staged` — the commit point;
//! 4. the operations are applied: renames into place, scratch deletions and
//!    replaced directories moved aside (never removed in place, so applying
//!    again after a crash is harmless), new directories made;
//! 5. the journal is removed.
//!
//! [`recover`] finishes a journal a crash left behind: `staging` is rolled
//! back (staging files and created directories removed: nothing lands),
//! `staged` is rolled forward (every output lands with its recorded hash).
//! Never a subset; never staging debris left in the workspace.
//!
//! Nothing is ever opened through a symlink (openat2 RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS). Normalisation: outputs are 0644, or 0755 when the
//! turn made them executable; scratch keeps the permission bits the turn set
//! (never setuid, setgid or sticky), keeps symlinks (their targets as
//! written: they are only ever followed inside a sandbox), empty directories
//! and deletions, and drops FIFOs, sockets and device nodes. xattrs are
//! never copied. Outputs belong to `output_owner` (the workspace's owner),
//! scratch to `scratch_owner` (who the next turn must be able to change it
//! as).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2, renameat};
use nix::sys::stat::Mode;
use nix::unistd::unlinkat;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Result, SupervisorError};
use crate::fsx;
use crate::store::capture::{Kind, RealizedWrite, Scope};

fn commit_err(detail: String) -> SupervisorError {
    SupervisorError::Commit { detail }
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

fn open_root(root: &Path) -> Result<OwnedFd> {
    Ok(File::open(root)
        .map_err(|e| commit_err(format!("{}: {e}", root.display())))?
        .into())
}

/// Opens (creating as needed, mode 0755) the directory `rel` under `root`,
/// one component at a time, never through a symlink.
pub(crate) fn open_dir_creating(root: &Path, rel: &str) -> Result<OwnedFd> {
    let mut fd = open_root(root)?;
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

/// Opens the existing directory `rel` under `root` (no creation, no
/// symlinks); `None` when it does not exist.
fn open_dir(root: &Path, rel: &str) -> Result<Option<OwnedFd>> {
    let root_fd = open_root(root)?;
    let rel = if rel.is_empty() { "." } else { rel };
    match openat2(
        root_fd.as_fd(),
        rel,
        beneath(OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(e) => Err(commit_err(format!("open {rel}: {e}"))),
    }
}

fn exists_at(dir: &OwnedFd, name: &str) -> bool {
    nix::sys::stat::fstatat(dir.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
}

fn split(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

/// One committed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    pub path: String,
    pub size: u64,
    pub sha256: String,
    /// What the path held before (for `supervise revert`); absent in
    /// entries of releases that kept no pre-images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Previous>,
    /// The commit removed the path (a revert of its creation): `size` 0,
    /// `sha256` empty, `previous` what was removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// What a path held before a commit changed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Previous {
    /// Nothing: the commit created it.
    Absent,
    /// A regular file, kept (content-addressed) under the session's
    /// `preimages/<sha256>` until the retention limit drops it.
    File { sha256: String, size: u64 },
}

/// A declared output: staged next to its destination as `temp`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct OutputOp {
    path: String,
    temp: String,
    sha256: String,
    size: u64,
    mode: u32,
    /// What the destination held, found (and kept) while staging.
    #[serde(default)]
    previous: Option<Previous>,
}

/// A declared path a revert removes (the file must still be what the
/// reverted turn committed, `sha256`; it is kept as a pre-image first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct RemoveOp {
    path: String,
    sha256: String,
    size: u64,
}

/// One step of the scratch delta, applied in order (parents first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum ScratchOp {
    /// Move the host entry aside (a whiteout).
    Delete { path: String },
    /// Move the host entry aside and make an empty directory (opaque dir).
    ReplaceDir { path: String, mode: u32 },
    /// Make the directory if missing; set its mode.
    Dir { path: String, mode: u32 },
    /// Rename the staged entry `stage/<index>` into place (file or symlink).
    Place { path: String, index: usize },
}

/// The commit journal (`state/sessions/<sid>/turn-<n>.commit`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Journal {
    version: u32,
    phase: Phase,
    turn_number: u64,
    /// Workspace-relative: where scratch entries are staged (`stage/`) and
    /// where replaced or deleted ones are moved (`trash/`).
    work_dir: String,
    output_owner: (u32, u32),
    scratch_owner: (u32, u32),
    outputs: Vec<OutputOp>,
    /// Directories created for outputs, parents first (removed on roll-back
    /// when empty).
    created_dirs: Vec<String>,
    scratch: Vec<ScratchOp>,
    /// Applying failed after the commit point and the turn was recorded as
    /// `commit_failed`: recovery completes it and says so.
    #[serde(default)]
    failed: bool,
    /// Paths a revert removes (moved into `work_dir/trash/r<i>`).
    #[serde(default)]
    removals: Vec<RemoveOp>,
    /// Workspace-relative directory of the session's pre-images (none: a
    /// journal of a release that kept none).
    #[serde(default)]
    preimages: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Phase {
    Staging,
    Staged,
}

/// What a commit (or its recovery) is asked to do.
#[derive(Debug)]
pub struct CommitRequest<'a> {
    pub root: &'a Path,
    pub scopes: &'a [Scope],
    pub matched: &'a [RealizedWrite],
    pub scratch: &'a [RealizedWrite],
    pub output_owner: (u32, u32),
    pub scratch_owner: (u32, u32),
    pub turn_number: u64,
    /// The journal's path in the state directory.
    pub journal: PathBuf,
    /// Workspace-relative private directory for this commit
    /// (`tmp/.<sid>.t<n>.commit`).
    pub work_dir: String,
    /// Workspace-relative directory where what an output replaces is kept
    /// ([`crate::store::layout::Workspace::preimages_rel`]); `None` keeps nothing.
    pub preimages: Option<String>,
    /// Draw a progress bar on a terminal's stderr for many outputs (not
    /// under `--json`).
    pub progress: bool,
    /// Whether to stop (the supervisor was signalled): asked before each
    /// staged file and right before the commit point — `true` rolls the
    /// staging back and fails with [`SupervisorError::CommitInterrupted`],
    /// nothing landed. Never asked past the commit point: a commit that
    /// passed it completes, all or nothing.
    pub stop: fn() -> bool,
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

fn output_mode(turn_mode: u32) -> u32 {
    if turn_mode & 0o111 != 0 { 0o755 } else { 0o644 }
}

fn write_journal(path: &Path, journal: &Journal) -> Result<()> {
    let bytes = serde_json::to_vec(journal).map_err(|e| commit_err(format!("journal: {e}")))?;
    fsx::write_atomic(path, &bytes)
}

/// Reads a commit journal.
pub fn read_journal(path: &Path) -> Result<Journal> {
    let bytes = fsx::read_small(path, 64 << 20).map_err(|source| SupervisorError::StateIo {
        op: "read commit journal",
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|e| SupervisorError::StateIo {
        op: "parse commit journal",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

impl Journal {
    pub fn turn_number(&self) -> u64 {
        self.turn_number
    }

    fn committed(&self) -> Vec<Committed> {
        let outputs = self.outputs.iter().map(|o| Committed {
            path: o.path.clone(),
            size: o.size,
            sha256: o.sha256.clone(),
            previous: o.previous.clone(),
            removed: false,
        });
        let removed = self.removals.iter().map(|r| Committed {
            path: r.path.clone(),
            size: 0,
            sha256: String::new(),
            previous: Some(Previous::File {
                sha256: r.sha256.clone(),
                size: r.size,
            }),
            removed: true,
        });
        outputs.chain(removed).collect()
    }
}

/// Commits the declared outputs (`matched`) and the scratch delta, through
/// the journal. A turn with nothing to commit writes no journal.
pub fn commit(req: &CommitRequest<'_>) -> Result<Vec<Committed>> {
    let journal = plan_journal(req)?;
    if journal.outputs.is_empty() && journal.scratch.is_empty() {
        return Ok(Vec::new());
    }
    run_journal(req.root, &req.journal, journal, req.stop, |j| {
        stage_all(req, j)
    })
}

/// Writes `journal`, stages through `stage` (which may fill in what it
/// learnt, such as the outputs' previous contents), passes the commit
/// point — unless `stop` says so right before it — and applies.
fn run_journal(
    root: &Path,
    path: &Path,
    mut journal: Journal,
    stop: fn() -> bool,
    stage: impl FnOnce(&mut Journal) -> Result<()>,
) -> Result<Vec<Committed>> {
    write_journal(path, &journal)?;
    let staged = stage(&mut journal).and_then(|()| {
        if stop() {
            Err(SupervisorError::CommitInterrupted)
        } else {
            Ok(())
        }
    });
    if let Err(e) = staged {
        let _ = roll_back(root, &journal);
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    let staged = Journal {
        phase: Phase::Staged,
        ..journal
    };
    if let Err(e) = write_journal(path, &staged) {
        let _ = roll_back(root, &staged);
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    // Past the commit point: a failure from here on leaves the journal,
    // marked, for recovery to roll forward.
    if let Err(e) = apply(root, &staged, false) {
        let _ = write_journal(
            path,
            &Journal {
                failed: true,
                ..staged
            },
        );
        return Err(e);
    }
    // The journal stays until the turn's finish entries are durable
    // ([`finish`]): a crash in between must not read as "nothing landed".
    Ok(staged.committed())
}

/// Keeps what `path` holds now under `store` (content-addressed), so a
/// revert can put it back: a hard link to the file's inode when the store
/// is on the same file system (the commit renames a new file over the
/// path, so the kept inode never changes again), a copy otherwise. `None`
/// when the path holds something other than a regular file (not kept; a
/// revert of it is refused).
fn keep_preimage(
    root: &Path,
    store: &str,
    path: &str,
    tag: &str,
    durable: &mut Durability,
) -> Result<Option<Previous>> {
    let (dir_rel, name) = split(path);
    let Some(dir) = open_dir(root, dir_rel)? else {
        return Ok(Some(Previous::Absent));
    };
    match nix::sys::stat::fstatat(dir.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(nix::errno::Errno::ENOENT) => return Ok(Some(Previous::Absent)),
        Err(e) => return Err(commit_err(format!("stat {path}: {e}"))),
        Ok(st) if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFREG => return Ok(None),
        Ok(_) => {}
    }
    let store_fd = open_dir_creating(root, store)?;
    let temp = format!(".keep-{tag}");
    let _ = unlinkat(
        store_fd.as_fd(),
        temp.as_str(),
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    );
    let linked = nix::unistd::linkat(
        dir.as_fd(),
        name,
        store_fd.as_fd(),
        temp.as_str(),
        nix::fcntl::AtFlags::empty(),
    );
    if linked.is_err() {
        // Another file system (or links refused): a copy.
        let mut src = File::from(
            fsx::open_beneath(root, path).map_err(|e| commit_err(format!("{path}: {e}")))?,
        );
        let mut dst = File::from(
            openat2(
                store_fd.as_fd(),
                temp.as_str(),
                beneath(
                    OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                    Mode::from_bits_truncate(0o600),
                ),
            )
            .map_err(|e| commit_err(format!("keep {path}: {e}")))?,
        );
        std::io::copy(&mut src, &mut dst).map_err(|e| commit_err(format!("keep {path}: {e}")))?;
        durable.file(dst);
    }
    let (sha256, size) = fsx::hash_beneath(&root.join(store), &temp)
        .map_err(|e| commit_err(format!("hash the pre-image of {path}: {e}")))?;
    if exists_at(&store_fd, &sha256) {
        let _ = unlinkat(
            store_fd.as_fd(),
            temp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    } else {
        renameat(
            store_fd.as_fd(),
            temp.as_str(),
            store_fd.as_fd(),
            sha256.as_str(),
        )
        .map_err(|e| commit_err(format!("keep the pre-image of {path}: {e}")))?;
    }
    durable.dir(store, store_fd);
    Ok(Some(Previous::File { sha256, size }))
}

/// Drops the oldest pre-images (by when they were kept: the link's
/// ctime) until `store` holds at most `limit` bytes; returns how many went.
/// A revert that needs one dropped is refused, naming it.
pub fn prune_preimages(root: &Path, store: &str, limit: u64) -> Result<usize> {
    use std::os::unix::fs::MetadataExt;
    let dir = root.join(store);
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        _ => return Ok(0),
    }
    let mut kept: Vec<(i64, i64, u64, std::path::PathBuf)> = std::fs::read_dir(&dir)
        .map_err(|e| commit_err(format!("list {store}: {e}")))?
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            m.is_file()
                .then(|| (m.ctime(), m.ctime_nsec(), m.len(), e.path()))
        })
        .collect();
    let mut total: u64 = kept.iter().map(|k| k.2).sum();
    if total <= limit {
        return Ok(0);
    }
    kept.sort();
    let mut dropped = 0;
    for (_, _, size, path) in kept {
        if total <= limit {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= size;
            dropped += 1;
        }
    }
    Ok(dropped)
}

/// A file a revert puts back: the pre-image `sha256` (of `size` bytes)
/// becomes `path` again.
#[derive(Debug, Clone)]
pub struct Restore {
    pub path: String,
    pub sha256: String,
    pub size: u64,
}

/// A file a revert removes: it must still hold `sha256`.
#[derive(Debug, Clone)]
pub struct Removal {
    pub path: String,
    pub sha256: String,
    pub size: u64,
}

/// What a revert commits: files put back from the pre-image store and
/// files removed — through the same journal as a turn's commit (crash-safe
/// alike: recovery rolls it back before its commit point and forward
/// after), keeping what it replaces or removes, so a revert can be
/// reverted.
#[derive(Debug)]
pub struct RestoreRequest<'a> {
    pub root: &'a Path,
    pub preimages: &'a str,
    pub restores: &'a [Restore],
    pub removals: &'a [Removal],
    pub output_owner: (u32, u32),
    pub turn_number: u64,
    pub journal: PathBuf,
    pub work_dir: String,
}

pub fn commit_restore(req: &RestoreRequest<'_>) -> Result<Vec<Committed>> {
    let mut outputs = Vec::new();
    let mut created_dirs: Vec<String> = Vec::new();
    for r in req.restores {
        let (dir_rel, _) = split(&r.path);
        note_missing_dirs(req.root, dir_rel, &mut created_dirs)?;
        let kept = fsx::open_beneath(&req.root.join(req.preimages), &r.sha256)
            .map(File::from)
            .and_then(|f| f.metadata())
            .map_err(|e| commit_err(format!("{}: its pre-image is not kept: {e}", r.path)))?;
        outputs.push(OutputOp {
            path: r.path.clone(),
            temp: staging_name(&req.work_dir, &r.path),
            sha256: r.sha256.clone(),
            size: r.size,
            mode: output_mode(std::os::unix::fs::PermissionsExt::mode(&kept.permissions())),
            previous: None,
        });
    }
    let journal = Journal {
        version: 1,
        phase: Phase::Staging,
        turn_number: req.turn_number,
        work_dir: req.work_dir.clone(),
        output_owner: req.output_owner,
        scratch_owner: req.output_owner,
        outputs,
        created_dirs,
        scratch: Vec::new(),
        failed: false,
        removals: req
            .removals
            .iter()
            .map(|r| RemoveOp {
                path: r.path.clone(),
                sha256: r.sha256.clone(),
                size: r.size,
            })
            .collect(),
        preimages: Some(req.preimages.to_owned()),
    };
    if journal.outputs.is_empty() && journal.removals.is_empty() {
        return Ok(Vec::new());
    }
    // A revert is run by `supervise revert`, which installs no interrupt
    // handling: nothing asks it to stop.
    let never: fn() -> bool = || false;
    run_journal(req.root, &req.journal, journal, never, |j| {
        let mut durable = Durability::new(j.outputs.len() + j.removals.len());
        make_created_dirs(req.root, j, &mut durable)?;
        let store = req.root.join(req.preimages);
        for (i, op) in j.outputs.iter_mut().enumerate() {
            op.previous = keep_preimage(
                req.root,
                req.preimages,
                &op.path,
                &format!("t{}-{i}", req.turn_number),
                &mut durable,
            )?;
            let (dir_rel, _) = split(&op.path);
            let dir = open_dir_creating(req.root, dir_rel)?;
            let f = stage_file(
                &store,
                &op.sha256,
                &dir,
                &op.temp,
                StageAs {
                    expected: Some(&op.sha256),
                    mode: op.mode,
                    owner: j.output_owner,
                },
                &op.path,
            )?;
            durable.file(f);
            durable.dir(dir_rel, dir);
        }
        for (i, r) in j.removals.iter().enumerate() {
            match keep_preimage(
                req.root,
                req.preimages,
                &r.path,
                &format!("t{}-r{i}", req.turn_number),
                &mut durable,
            )? {
                Some(Previous::File { sha256, .. }) if sha256 == r.sha256 => {}
                _ => {
                    return Err(commit_err(format!(
                        "{}: changed since the revert was planned",
                        r.path
                    )));
                }
            }
        }
        durable.finish(req.root)
    })
}

/// Adds to `created` the components of `dir_rel` that do not exist yet.
fn note_missing_dirs(root: &Path, dir_rel: &str, created: &mut Vec<String>) -> Result<()> {
    let mut prefix = String::new();
    for part in dir_rel.split('/').filter(|p| !p.is_empty()) {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(part);
        if !created.contains(&prefix) && open_dir(root, &prefix)?.is_none() {
            created.push(prefix.clone());
        }
    }
    Ok(())
}

/// Removes a commit's private directory and its journal, once the turn's
/// finish entries are durable. Without a journal (nothing was committed)
/// it does nothing.
pub fn finish(root: &Path, journal: &Path) -> Result<()> {
    match read_journal(journal) {
        Ok(j) => finish_journal(root, &j, journal),
        Err(_) if !journal.exists() => Ok(()),
        Err(e) => Err(e),
    }
}

/// The name an output is staged under beside its final place until the
/// rename that commits it: the reserved prefix
/// ([`turnstile_policy::verdict::STAGING_PREFIX`], which no turn's write
/// may bear) and a digest of the commit's private directory (its session
/// and turn) and the output's path. So it is never an output's name, never
/// another output's, turn's or session's staging name, and never too long
/// whatever the output's name (red-team wave 4: `.{name}.turnstile-t{N}`
/// could be declared and written by the turn itself, or by an earlier one,
/// and the commit replaced or removed it).
fn staging_name(work_dir: &str, path: &str) -> String {
    let mut h = Sha256::new();
    h.update(work_dir.as_bytes());
    h.update([0]);
    h.update(path.as_bytes());
    format!(
        "{}{}",
        turnstile_policy::verdict::STAGING_PREFIX,
        hex::encode(&h.finalize()[..12])
    )
}

fn plan_journal(req: &CommitRequest<'_>) -> Result<Journal> {
    let mut outputs = Vec::new();
    let mut created_dirs: Vec<String> = Vec::new();
    for w in req.matched {
        let (dir_rel, _) = split(&w.path);
        note_missing_dirs(req.root, dir_rel, &mut created_dirs)?;
        outputs.push(OutputOp {
            path: w.path.clone(),
            temp: staging_name(&req.work_dir, &w.path),
            sha256: w.sha256.clone().unwrap_or_default(),
            size: w.size,
            mode: output_mode(w.mode),
            previous: None,
        });
    }
    let mut scratch = Vec::new();
    for (index, w) in req.scratch.iter().enumerate() {
        let path = w.path.clone();
        let mode = w.mode & 0o777;
        match w.kind {
            Kind::Deleted => scratch.push(ScratchOp::Delete { path }),
            Kind::OpaqueDir | Kind::DirOverFile => {
                scratch.push(ScratchOp::ReplaceDir { path, mode });
            }
            Kind::Dir | Kind::DirMode => scratch.push(ScratchOp::Dir { path, mode }),
            Kind::File | Kind::Symlink => scratch.push(ScratchOp::Place { path, index }),
            // FIFOs, sockets and device nodes never leave the sandbox; a
            // file over a directory blocks the turn (never in a verdict's
            // scratch list).
            Kind::Special | Kind::FileOverDir | Kind::NonUtf8Name => {}
        }
    }
    Ok(Journal {
        version: 1,
        phase: Phase::Staging,
        turn_number: req.turn_number,
        work_dir: req.work_dir.clone(),
        output_owner: req.output_owner,
        scratch_owner: req.scratch_owner,
        outputs,
        created_dirs,
        scratch,
        failed: false,
        removals: Vec::new(),
        preimages: req.preimages.clone(),
    })
}

/// Copies `source_rel` of `scope`'s upper dir into `temp` in `dir`, hashing
/// from the same descriptor; checks the hash; sets mode and owner.
/// How a staged file must end up.
struct StageAs<'a> {
    expected: Option<&'a str>,
    mode: u32,
    owner: (u32, u32),
}

fn stage_file(
    src_root: &Path,
    source_rel: &str,
    dir: &OwnedFd,
    temp: &str,
    want: StageAs<'_>,
    what: &str,
) -> Result<File> {
    let StageAs {
        expected,
        mode,
        owner: (uid, gid),
    } = want;
    let mut src = File::from(
        fsx::open_beneath(src_root, source_rel).map_err(|e| commit_err(format!("{what}: {e}")))?,
    );
    if !src.metadata().map(|m| m.is_file()).unwrap_or(false) {
        return Err(commit_err(format!("{what}: not a regular file")));
    }
    // A staging file left by an interrupted attempt is ours to replace.
    let _ = unlinkat(dir.as_fd(), temp, nix::unistd::UnlinkatFlags::NoRemoveDir);
    let mut dst = File::from(
        openat2(
            dir.as_fd(),
            temp,
            beneath(
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                Mode::from_bits_truncate(0o600),
            ),
        )
        .map_err(|e| commit_err(format!("stage {what}: {e}")))?,
    );
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = src
            .read(&mut buf)
            .map_err(|e| commit_err(format!("copy {what}: {e}")))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n])
            .map_err(|e| commit_err(format!("copy {what}: {e}")))?;
    }
    let got = hex::encode(hasher.finalize());
    if expected.is_some_and(|want| want != got) {
        return Err(commit_err(format!(
            "{what}: content changed between capture and commit"
        )));
    }
    nix::unistd::fchown(
        dst.as_fd(),
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )
    .map_err(|e| commit_err(format!("chown {what}: {e}")))?;
    // After chown, which clears set-id bits anyway: none are ever set.
    nix::sys::stat::fchmod(dst.as_fd(), Mode::from_bits_truncate(mode & 0o777))
        .map_err(|e| commit_err(format!("chmod {what}: {e}")))?;
    // The file keeps the times the turn gave it: build tools compare them
    // (make's "m.c is newer than m" must not depend on the order, or the
    // clock tick, in which the commit copied the two).
    let times = src
        .metadata()
        .and_then(|m| {
            Ok(std::fs::FileTimes::new()
                .set_accessed(m.accessed()?)
                .set_modified(m.modified()?))
        })
        .and_then(|t| dst.set_times(t));
    times.map_err(|e| commit_err(format!("set the times of {what}: {e}")))?;
    Ok(dst)
}

/// The implied parents (issue 23), parents first: owned and moded as
/// committed outputs are, and durable in their parents before the commit
/// point (a roll-forward must find the staged files under them).
fn make_created_dirs(root: &Path, journal: &Journal, durable: &mut Durability) -> Result<()> {
    for d in &journal.created_dirs {
        let fd = open_dir_creating(root, d)?;
        nix::unistd::fchown(
            fd.as_fd(),
            Some(nix::unistd::Uid::from_raw(journal.output_owner.0)),
            Some(nix::unistd::Gid::from_raw(journal.output_owner.1)),
        )
        .map_err(|e| commit_err(format!("chown {d}: {e}")))?;
        nix::sys::stat::fchmod(fd.as_fd(), Mode::from_bits_truncate(0o755))
            .map_err(|e| commit_err(format!("chmod {d}: {e}")))?;
        let (parent, _) = split(d);
        if let Some(p) = open_dir(root, parent)? {
            durable.dir(parent, p);
        }
    }
    Ok(())
}

fn stage_all(req: &CommitRequest<'_>, journal: &mut Journal) -> Result<()> {
    let staged = journal.outputs.len()
        + journal
            .scratch
            .iter()
            .filter(|op| matches!(op, ScratchOp::Place { .. }))
            .count();
    let mut durable = Durability::new(staged);
    make_created_dirs(req.root, journal, &mut durable)?;
    let turn = journal.turn_number;
    let bar = crate::store::progress::Progress::new(
        "committing outputs",
        journal.outputs.len() as u64,
        256,
        req.progress,
    );
    let mut last_dir = LastDir::default();
    for (i, (op, w)) in journal.outputs.iter_mut().zip(req.matched).enumerate() {
        if (req.stop)() {
            return Err(SupervisorError::CommitInterrupted);
        }
        bar.inc();
        if let Some(store) = &req.preimages {
            op.previous = keep_preimage(
                req.root,
                store,
                &op.path,
                &format!("t{turn}-{i}"),
                &mut durable,
            )?;
        }
        let (scope, rel) = scope_of(req.scopes, w)?;
        let (dir_rel, _) = split(&op.path);
        let dir = last_dir.open(req.root, dir_rel)?;
        let f = stage_file(
            &scope.upper,
            &rel,
            dir,
            &op.temp,
            StageAs {
                expected: Some(&op.sha256),
                mode: op.mode,
                owner: journal.output_owner,
            },
            &op.path,
        )?;
        durable.file(f);
        durable.dir_of(dir_rel, dir)?;
    }
    drop(last_dir);
    if journal
        .scratch
        .iter()
        .any(|op| matches!(op, ScratchOp::Place { .. }))
    {
        let stage = open_dir_creating(req.root, &format!("{}/stage", journal.work_dir))?;
        for op in &journal.scratch {
            let ScratchOp::Place { path, index } = op else {
                continue;
            };
            if (req.stop)() {
                return Err(SupervisorError::CommitInterrupted);
            }
            let w = req
                .scratch
                .get(*index)
                .ok_or_else(|| commit_err(format!("{path}: unknown scratch entry")))?;
            let (scope, rel) = scope_of(req.scopes, w)?;
            let name = index.to_string();
            match w.kind {
                Kind::Symlink => {
                    let (parent, leaf) = split(&rel);
                    let upper_dir = if parent.is_empty() {
                        File::open(&scope.upper).map(OwnedFd::from)
                    } else {
                        fsx::open_beneath(&scope.upper, parent)
                    }
                    .map_err(|e| commit_err(format!("{path}: {e}")))?;
                    let target = nix::fcntl::readlinkat(upper_dir.as_fd(), leaf)
                        .map_err(|e| commit_err(format!("readlink {path}: {e}")))?;
                    let _ = unlinkat(
                        stage.as_fd(),
                        name.as_str(),
                        nix::unistd::UnlinkatFlags::NoRemoveDir,
                    );
                    nix::unistd::symlinkat(target.as_os_str(), stage.as_fd(), name.as_str())
                        .map_err(|e| commit_err(format!("stage symlink {path}: {e}")))?;
                    nix::unistd::fchownat(
                        stage.as_fd(),
                        name.as_str(),
                        Some(nix::unistd::Uid::from_raw(journal.scratch_owner.0)),
                        Some(nix::unistd::Gid::from_raw(journal.scratch_owner.1)),
                        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| commit_err(format!("chown {path}: {e}")))?;
                }
                _ => {
                    let f = stage_file(
                        &scope.upper,
                        &rel,
                        &stage,
                        &name,
                        StageAs {
                            expected: w.sha256.as_deref(),
                            mode: w.mode & 0o777,
                            owner: journal.scratch_owner,
                        },
                        path,
                    )?;
                    durable.file(f);
                }
            }
        }
        durable.dir(&format!("{}/stage", journal.work_dir), stage);
    }
    durable.finish(req.root)
}

/// The directory of the previous output, held open. Outputs come in
/// capture order, so consecutive ones mostly share a directory, and each
/// would otherwise walk its directory's path again from the root, one
/// `mkdirat` and one `openat2` per component (at 100,000 outputs four
/// levels deep, some 900,000 path lookups per pass). One entry, so a
/// commit holds one more descriptor, whatever its size; the descriptor
/// was opened the same way (no symlinks, beneath the root) as each
/// output's own would have been.
#[derive(Default)]
struct LastDir {
    held: Option<(String, OwnedFd)>,
}

impl LastDir {
    /// `rel` under `root`, created as needed ([`open_dir_creating`]).
    fn open(&mut self, root: &Path, rel: &str) -> Result<&OwnedFd> {
        if !matches!(&self.held, Some((r, _)) if r == rel) {
            self.held = None;
            self.held = Some((rel.to_owned(), open_dir_creating(root, rel)?));
        }
        match &self.held {
            Some((_, fd)) => Ok(fd),
            None => Err(commit_err(format!("open {rel}: no descriptor held"))),
        }
    }
}

/// How a commit makes what it wrote durable. A few files: an fsync of each
/// file and of each directory touched (kept open until then). Many: one
/// syncfs of the workspace's file system at the end, which covers files
/// and directory entries alike — and no descriptor is kept per file, so
/// 10,000 outputs stay within any descriptor limit (10,000 per-file fsyncs
/// would also cost seconds).
struct Durability {
    per_file: bool,
    files: Vec<File>,
    dirs: std::collections::BTreeMap<String, OwnedFd>,
}

impl Durability {
    /// Per-file fsyncs up to this many files.
    const PER_FILE_MAX: usize = 32;

    fn new(files: usize) -> Self {
        Self {
            per_file: files <= Self::PER_FILE_MAX,
            files: Vec::new(),
            dirs: std::collections::BTreeMap::new(),
        }
    }

    fn file(&mut self, f: File) {
        if self.per_file {
            self.files.push(f);
        }
    }

    /// Directory `rel` (workspace-relative) was changed; `fd` is it.
    fn dir(&mut self, rel: &str, fd: OwnedFd) {
        if self.per_file {
            self.dirs.entry(rel.to_owned()).or_insert(fd);
        }
    }

    /// As [`Durability::dir`], for a descriptor the caller keeps: a
    /// duplicate is held only when the directory will be fsynced.
    fn dir_of(&mut self, rel: &str, fd: &OwnedFd) -> Result<()> {
        if self.per_file && !self.dirs.contains_key(rel) {
            let dup = fd
                .try_clone()
                .map_err(|e| commit_err(format!("dup the descriptor of {rel}: {e}")))?;
            self.dirs.insert(rel.to_owned(), dup);
        }
        Ok(())
    }

    fn finish(self, root: &Path) -> Result<()> {
        if !self.per_file {
            let root =
                File::open(root).map_err(|e| commit_err(format!("{}: {e}", root.display())))?;
            return nix::unistd::syncfs(&root).map_err(|e| commit_err(format!("syncfs: {e}")));
        }
        for f in &self.files {
            f.sync_all()
                .map_err(|e| commit_err(format!("fsync staged file: {e}")))?;
        }
        for d in self.dirs.values() {
            nix::unistd::fsync(d.as_fd()).map_err(|e| commit_err(format!("fsync: {e}")))?;
        }
        Ok(())
    }
}

/// Applies a staged journal. Idempotent: run again after a crash part-way,
/// it finishes the job. With `recovering`, an output whose staging file is
/// gone must already be in place with its recorded hash.
fn apply(root: &Path, j: &Journal, recovering: bool) -> Result<()> {
    let mut durable = Durability::new(j.outputs.len() + j.scratch.len());
    let mut last_dir = LastDir::default();
    for o in &j.outputs {
        let (dir_rel, name) = split(&o.path);
        let dir = last_dir.open(root, dir_rel)?;
        if exists_at(dir, &o.temp) {
            if recovering {
                let (sha, _) = fsx::hash_beneath(root, &format!("{dir_rel}/{}", o.temp))
                    .map_err(|e| commit_err(format!("{}: {e}", o.path)))?;
                if sha != o.sha256 {
                    return Err(commit_err(format!(
                        "{}: the staged file changed since it was staged",
                        o.path
                    )));
                }
            }
            renameat(dir.as_fd(), o.temp.as_str(), dir.as_fd(), name)
                .map_err(|e| commit_err(format!("rename into {}: {e}", o.path)))?;
            durable.dir_of(dir_rel, dir)?;
        } else {
            let landed = fsx::hash_beneath(root, &o.path).map(|(sha, _)| sha);
            if landed.as_deref().ok() != Some(o.sha256.as_str()) {
                return Err(commit_err(format!(
                    "{}: neither staged nor in place with its recorded hash",
                    o.path
                )));
            }
        }
    }
    drop(last_dir);
    if !j.removals.is_empty() {
        let work = open_dir_creating(root, &j.work_dir)?;
        let trash = open_dir_creating(root, &format!("{}/trash", j.work_dir))?;
        for (i, r) in j.removals.iter().enumerate() {
            let aside = format!("r{i}");
            let (dir_rel, name) = split(&r.path);
            let Some(dir) = open_dir(root, dir_rel)? else {
                continue; // removed before the crash
            };
            if exists_at(&dir, name) && !exists_at(&trash, &aside) {
                renameat(dir.as_fd(), name, trash.as_fd(), aside.as_str())
                    .map_err(|e| commit_err(format!("remove {}: {e}", r.path)))?;
                durable.dir(dir_rel, dir);
            }
        }
        durable.dir(&j.work_dir, work);
    }
    if !j.scratch.is_empty() {
        let work = open_dir_creating(root, &j.work_dir)?;
        let stage = open_dir_creating(root, &format!("{}/stage", j.work_dir))?;
        let trash = open_dir_creating(root, &format!("{}/trash", j.work_dir))?;
        for (i, op) in j.scratch.iter().enumerate() {
            apply_scratch(root, j, op, i, &stage, &trash)?;
        }
        durable.dir(&j.work_dir, work);
    }
    durable.finish(root)
}

fn apply_scratch(
    root: &Path,
    j: &Journal,
    op: &ScratchOp,
    i: usize,
    stage: &OwnedFd,
    trash: &OwnedFd,
) -> Result<()> {
    let aside = i.to_string();
    // Moves `path` into trash/<i> unless that already happened.
    let move_aside = |path: &str| -> Result<()> {
        let (dir_rel, name) = split(path);
        let Some(dir) = open_dir(root, dir_rel)? else {
            return Ok(());
        };
        if exists_at(&dir, name) && !exists_at(trash, &aside) {
            renameat(dir.as_fd(), name, trash.as_fd(), aside.as_str())
                .map_err(|e| commit_err(format!("move {path} aside: {e}")))?;
        }
        Ok(())
    };
    let make_dir = |path: &str, mode: u32| -> Result<()> {
        let fd = open_dir_creating(root, path)?;
        nix::unistd::fchown(
            fd.as_fd(),
            Some(nix::unistd::Uid::from_raw(j.scratch_owner.0)),
            Some(nix::unistd::Gid::from_raw(j.scratch_owner.1)),
        )
        .map_err(|e| commit_err(format!("chown {path}: {e}")))?;
        nix::sys::stat::fchmod(fd.as_fd(), Mode::from_bits_truncate(mode & 0o777))
            .map_err(|e| commit_err(format!("chmod {path}: {e}")))
    };
    match op {
        ScratchOp::Delete { path } => move_aside(path),
        ScratchOp::ReplaceDir { path, mode } => {
            move_aside(path)?;
            make_dir(path, *mode)
        }
        ScratchOp::Dir { path, mode } => {
            // A directory where the host has a file: the file goes aside.
            let (dir_rel, name) = split(path);
            if let Some(dir) = open_dir(root, dir_rel)? {
                let is_dir = nix::sys::stat::fstatat(
                    dir.as_fd(),
                    name,
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR);
                if is_dir == Ok(false) {
                    move_aside(path)?;
                }
            }
            make_dir(path, *mode)
        }
        ScratchOp::Place { path, index } => {
            let staged = index.to_string();
            if !exists_at(stage, &staged) {
                return Ok(()); // placed before the crash
            }
            let (dir_rel, name) = split(path);
            let dir = open_dir_creating(root, dir_rel)?;
            // A directory in the way (the turn replaced it by a file or a
            // link): it goes aside first.
            let in_the_way = nix::sys::stat::fstatat(
                dir.as_fd(),
                name,
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .is_ok_and(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR);
            if in_the_way {
                move_aside(path)?;
            }
            renameat(stage.as_fd(), staged.as_str(), dir.as_fd(), name)
                .map_err(|e| commit_err(format!("place {path}: {e}")))
        }
    }
}

/// Removes the journal's private directory and the journal itself.
fn finish_journal(root: &Path, j: &Journal, journal: &Path) -> Result<()> {
    remove_work_dir(root, j)?;
    std::fs::remove_file(journal).map_err(|source| SupervisorError::StateIo {
        op: "remove commit journal",
        path: journal.to_path_buf(),
        source,
    })
}

fn remove_work_dir(root: &Path, j: &Journal) -> Result<()> {
    if open_dir(root, &j.work_dir)?.is_some() {
        // Checked above to be a real directory reached without symlinks;
        // remove_dir_all does not follow symlinks inside it.
        std::fs::remove_dir_all(root.join(&j.work_dir))
            .map_err(|e| commit_err(format!("remove {}: {e}", j.work_dir)))?;
    }
    Ok(())
}

/// Undoes a journal that never reached its commit point: staging files,
/// the private directory and directories created for outputs go.
fn roll_back(root: &Path, j: &Journal) -> Result<()> {
    for o in &j.outputs {
        let (dir_rel, _) = split(&o.path);
        if let Some(dir) = open_dir(root, dir_rel)? {
            let _ = unlinkat(
                dir.as_fd(),
                o.temp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
    }
    for d in j.created_dirs.iter().rev() {
        let (parent, name) = split(d);
        if let Some(p) = open_dir(root, parent)? {
            // Only when empty: anything else is not ours.
            let _ = unlinkat(p.as_fd(), name, nix::unistd::UnlinkatFlags::RemoveDir);
        }
    }
    remove_work_dir(root, j)
}

/// How recovery settled a commit journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The journal was past its commit point: every output is in place.
    RolledForward(Vec<Committed>),
    /// It was not: nothing landed.
    RolledBack,
    /// The turn's finish entries were already durable: only the journal
    /// and the private directory were left to remove.
    AlreadyRecorded,
    /// Past the commit point, but the staged files no longer match what
    /// was recorded (changed by someone else): nothing more is applied.
    Unrecoverable(String),
}

/// Settles a commit journal a crash left behind (see the module docs).
/// `turn_open`: whether the journal's turn still lacks its finish entries.
/// Never fails on the workspace's state — a journal that cannot be applied
/// any more is reported, not retried forever. The journal itself stays:
/// the caller removes it with [`finish`] once the turn's outcome is
/// recorded (a crash in between must not lose what the journal proves).
pub fn recover(
    root: &Path,
    journal_path: &Path,
    turn_open: impl Fn(u64) -> bool,
) -> Result<(u64, Settled)> {
    let j = read_journal(journal_path)?;
    let settled = match j.phase {
        Phase::Staging => {
            roll_back(root, &j)?;
            Settled::RolledBack
        }
        Phase::Staged if !turn_open(j.turn_number) && !j.failed => Settled::AlreadyRecorded,
        Phase::Staged => match apply(root, &j, true) {
            Ok(()) => Settled::RolledForward(j.committed()),
            Err(e) => Settled::Unrecoverable(e.to_string()),
        },
    };
    if settled == Settled::RolledBack {
        // Nothing to prove any more; a later pass must not roll it back
        // again over a newer turn's staging names.
        finish_journal(root, &j, journal_path)?;
    }
    Ok((j.turn_number, settled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static WHILE_STAGING: AtomicUsize = AtomicUsize::new(0);
    static AT_COMMIT_POINT: AtomicUsize = AtomicUsize::new(0);

    /// Stops once two of the four outputs are staged.
    fn stop_while_staging() -> bool {
        WHILE_STAGING.fetch_add(1, Ordering::SeqCst) >= 2
    }

    /// Stops only when asked right before the commit point (the fifth
    /// time: once per output first).
    fn stop_at_commit_point() -> bool {
        AT_COMMIT_POINT.fetch_add(1, Ordering::SeqCst) >= 4
    }

    /// A commit asked to stop before its commit point (a signal to the
    /// supervisor) rolls its staging back: no output, no staging file, no
    /// journal; one never asked to stop lands every output.
    #[test]
    fn a_commit_asked_to_stop_before_its_commit_point_lands_nothing() {
        let root = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let upper = tempfile::tempdir().unwrap();
        let out = root.path().join("output/S");
        std::fs::create_dir_all(&out).unwrap();
        for name in ["a", "b", "c", "d"] {
            std::fs::write(upper.path().join(format!("{name}.txt")), name).unwrap();
        }
        let scopes = [Scope {
            relative: "output/S".into(),
            lower: out.clone(),
            upper: upper.path().to_path_buf(),
        }];
        let writes = crate::store::capture::enumerate(&scopes, 100, 1 << 20).unwrap();
        assert_eq!(writes.len(), 4);
        let me = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let journal = state.path().join("turn-1.commit");
        let request = |stop: fn() -> bool| CommitRequest {
            root: root.path(),
            scopes: &scopes,
            matched: &writes,
            scratch: &[],
            output_owner: me,
            scratch_owner: me,
            turn_number: 1,
            journal: journal.clone(),
            work_dir: "tmp/.S.t1.commit".into(),
            preimages: None,
            progress: false,
            stop,
        };
        for stop in [
            stop_while_staging as fn() -> bool,
            stop_at_commit_point,
            || true,
        ] {
            let got = commit(&request(stop));
            assert!(
                matches!(got, Err(SupervisorError::CommitInterrupted)),
                "{got:?}"
            );
            let left: Vec<_> = std::fs::read_dir(&out)
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert!(left.is_empty(), "{left:?}");
            assert!(!journal.exists());
        }
        let committed = commit(&request(|| false)).unwrap();
        assert_eq!(committed.len(), 4);
        assert_eq!(std::fs::read_to_string(out.join("c.txt")).unwrap(), "c");
    }
}
