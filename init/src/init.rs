//! The sandbox's own init: `supervise __sandbox-init TURN_DIR`, started by
//! the supervisor with the turn's namespaces already unshared and already
//! in the turn's cgroup.
//!
//! It is a fresh, single-threaded process, so ordinary Rust is fine here;
//! the only post-fork code with async-signal-safety constraints is the
//! supervisor's `pre_exec` hook.
//!
//! Three stages:
//! - **S1** (this process when it was forked into the host PID namespace,
//!   with new mount/IPC/UTS/net/cgroup namespaces) forks and relays the
//!   exit status of
//! - **S2**, PID 1 of the turn's PID namespace — this process itself when
//!   the supervisor cloned it as PID 1 (`clone3` with `CLONE_NEWPID`, the
//!   usual case: no S1): brings up `lo`, builds the
//!   new root from the Plan's mount list (its `/proc` first, which the
//!   workspace's idmapping needs), pivots into it, and forks
//! - **S3**, which drops every privilege in a fixed order (see
//!   [`command_stage`]) and execs the command. Steps 2–4 (capabilities,
//!   no_new_privs, the turn's uid) are taken before the turn's Plan
//!   arrives: a warm sandbox's S3 waits for its turn already holding them
//!   — and, sent its built Plan (its last turn's) at once, Landlock and
//!   seccomp too; its turn then sends only its command ([`LAUNCH`]).
//!
//! When the command (S3) exits, S2 records its status, kills and reaps
//! every other process of the PID namespace — nothing a turn starts
//! outlives it — says so on `DONE_FD`, and exits (the supervisor captures
//! while that exit runs: [`end_turn`]). If S2 dies any other way, the
//! kernel kills the rest of the namespace as it goes. Every failure is
//! written to the report file (opened close-on-exec before the pivot, so
//! the command never sees it) and ends the stage with a non-zero status:
//! the supervisor fails the turn closed.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::Mode;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Pid, Uid, chdir, fork, pivot_root};
use serde_json::json;
use turnstile_policy::plan::{Mount, Plan};

use super::mountplan::{self, MountStep, Mounts};
use super::protocol::InitEvent;
use super::{landlock, sys};

/// Exit status of a stage that failed before the command ran.
pub const SETUP_FAILED: i32 = 125;

pub use super::turnpaths::{
    BPF_FILE, EMPTY_DIR, LOWER_DIR, PLAN_FILE, REPORT_FILE, ROOT_DIR, SCRATCH_DIR,
};

/// Descriptors of the posture handshake, placed by the supervisor's
/// pre_exec hook and marked close-on-exec here: S3 writes one byte on
/// `READY_FD` when fully restricted and waits for its go on `GO_FD`
/// ([`GO`] or [`LAUNCH`]).
pub const READY_FD: i32 = 3;
pub const GO_FD: i32 = 4;
/// Where S3, parked with the turn's root built and its identity taken,
/// reads its turn (up to EOF: [`SAME_PLAN`] or a [`TURN_PART`]) once the
/// supervisor has one for it. Before it reads, S3 writes [`PARKED`] on
/// `READY_FD`.
pub const TURN_FD: i32 = 5;
/// Where S2 says the turn is over: one [`DONE`] once the command has
/// ended, its status is in the report, and every other process of the
/// turn's PID namespace is killed and reaped. S2 exits right after; the
/// supervisor need not wait for that exit (its namespaces' teardown) to
/// capture. Closed with no byte when S2 ends any other way.
pub const DONE_FD: i32 = 6;
pub const DONE: u8 = b'D';
/// S3's first byte on `READY_FD`: the root is built, the sandbox waits for
/// its turn. (Its second, "restricted, waiting for go", is [`READY`].)
pub const PARKED: u8 = b'P';
pub const READY: u8 = b'R';
/// What the supervisor sends on `TURN_FD` for a turn whose Plan is the
/// one the sandbox was built from (`plan.json`: a cold turn's). A Plan in
/// JSON never starts with `=`.
pub const SAME_PLAN: &[u8] = b"=";
/// The first byte of a turn sent as its part alone
/// ([`turnstile_policy::plan::TurnPart`], JSON after this byte): the
/// supervisor checked that the turn has the built Plan's shape, and the
/// stage applies the part to that Plan — a warm turn's Plan is not sent,
/// read and parsed whole (~11 KB, ~0.4 ms of the turn's path).
pub const TURN_PART: u8 = b'+';

/// The largest turn Plan S3 accepts on `TURN_FD`.
const MAX_TURN_PLAN: u64 = 64 << 20;

/// What the supervisor writes on `GO_FD` (then closes it) to let the
/// command run with the Plan S3 was restricted with.
pub const GO: &[u8] = b"G";
/// The first byte of the other answer on `GO_FD`: the turn's own part
/// ([`turnstile_policy::plan::TurnPart`], JSON after this byte) for a
/// stage restricted ahead of its turn — a warm sandbox's, sent its built
/// Plan ([`SAME_PLAN`], its last turn's) as soon as it parked, so Landlock,
/// seccomp and the posture check are done before the turn arrives. Only
/// the command and its environment take effect: the part's restrictions
/// (execute rules, working directory, no stdin) must be the ones in force,
/// or the stage refuses to exec (the supervisor checks first).
pub const LAUNCH: u8 = b'L';

/// The report channel: one JSON object per line, one `write` each.
struct Report(File);

impl Report {
    fn event(&mut self, e: InitEvent) {
        let _ = self.0.write_all(e.to_line().as_bytes());
    }

    fn fail(&mut self, stage: &str, detail: impl std::fmt::Display) -> ! {
        self.event(InitEvent::Error {
            stage: stage.to_owned(),
            detail: detail.to_string(),
        });
        std::process::exit(SETUP_FAILED)
    }
}

trait OrFail<T> {
    fn or_fail(self, report: &mut Report, stage: &str) -> T;
}

impl<T, E: std::fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, report: &mut Report, stage: &str) -> T {
        match self {
            Ok(v) => v,
            Err(e) => report.fail(stage, e),
        }
    }
}

/// Marks every inherited descriptor above stderr close-on-exec, so nothing
/// the supervisor's own parent leaked reaches the command.
fn cloexec_inherited_fds() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: `fd` came from /proc/self/fd of this single-threaded
        // process; F_SETFD on a stale number fails with EBADF, harmlessly.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let _ = nix::fcntl::fcntl(
            borrowed,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
    }
}

/// argv[1] that makes `supervise` the sandbox's own init (not a user
/// command).
pub const SANDBOX_INIT: &str = "__sandbox-init";
/// argv[0] of the init (its /proc cmdline names no host path).
pub const INIT_NAME: &str = "turnstile-init";
/// The environment variable that carries the turn directory to the init.
pub const TURN_DIR_ENV: &str = "TURNSTILE_TURN_DIR";

/// Entry point of `supervise __sandbox-init TURN_DIR`. Never returns.
pub fn main(turn_dir: &Path) -> ! {
    // S1 was given PR_SET_PDEATHSIG(SIGKILL) before exec (the pre_exec hook
    // of the supervisor): a supervise killed at any instant takes S1, and
    // through it the whole turn, with it.
    cloexec_inherited_fds();
    let report_file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_CLOEXEC | nix::libc::O_NOFOLLOW)
        .open(turn_dir.join(REPORT_FILE));
    let Ok(report_file) = report_file else {
        std::process::exit(SETUP_FAILED)
    };
    let mut report = Report(report_file);
    if std::env::var_os(crate::BUILD_ENV).is_none_or(|b| b != crate::BUILD_ID) {
        report.fail(
            "init build",
            format!(
                "this turnstile-init (build {}) is not from the sources of the supervise that started it: \
                 rebuild both (`cargo xtask build`), or remove turnstile-init to run the init from supervise",
                crate::BUILD_ID
            ),
        );
    }
    // On timeout the supervisor sends SIGTERM to every process of the turn;
    // the init stages must survive it so the command gets its grace period
    // (S3 restores the default before exec).
    set_sigterm(nix::sys::signal::SigHandler::SigIgn).or_fail(&mut report, "ignore SIGTERM");
    // The supervisor's child shared its memory and so exec'd this with
    // every signal blocked (no handler of the supervisor's may run there;
    // exec reset them all): the init's own handling starts here.
    nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    )
    .or_fail(&mut report, "clear signal mask");

    let plan: Plan = std::fs::read(turn_dir.join(PLAN_FILE))
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        .or_fail(&mut report, "read plan");
    let bpf = std::fs::read(turn_dir.join(BPF_FILE)).or_fail(&mut report, "read seccomp filter");
    let new_root = turn_dir.join(ROOT_DIR);

    // Cloned as PID 1 of its namespace (sandbox::spawn's clone3): this
    // process is S2, and no S1 stands between it and the supervisor — one
    // fork fewer to start, one process fewer for the command's exit to
    // travel through. Its death signal was set before exec.
    if nix::unistd::getpid().as_raw() == 1 {
        build_root(&plan, turn_dir, &new_root, &mut report);
        pid1(&plan, &new_root, &bpf, report)
    }

    // SAFETY: this process is single-threaded (a fresh exec of `supervise`
    // that has started no threads), so the child may run arbitrary code.
    match unsafe { fork() }.or_fail(&mut report, "fork pid 1") {
        ForkResult::Parent { child } => {
            close_handshake(&[READY_FD, GO_FD, TURN_FD, DONE_FD]);
            // S1 only relays: the command's status travels in the report.
            // PID 1 killed by a signal is relayed as 128 + its number (as a
            // shell does), so a PID 1 that never reported can be told from
            // one that failed its setup.
            let code = loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, c)) => break c,
                    Ok(WaitStatus::Signaled(_, signal, _)) => break 128 + signal as i32,
                    Err(nix::errno::Errno::EINTR) | Ok(_) => {}
                    Err(_) => break SETUP_FAILED,
                }
            };
            std::process::exit(code)
        }
        ForkResult::Child => {
            // PID 1 dies with S1 (which dies with supervise): the kernel then
            // kills everything in the turn's PID namespace. If S1 is already
            // gone, so is the turn.
            die_with_parent(&mut report);
            build_root(&plan, turn_dir, &new_root, &mut report);
            pid1(&plan, &new_root, &bpf, report)
        }
    }
}

/// PR_SET_PDEATHSIG(SIGKILL), then make sure the parent did not die before
/// it took effect (we would have been reparented already).
fn die_with_parent(report: &mut Report) {
    let parent = nix::unistd::getppid();
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .or_fail(report, "set parent-death signal");
    if nix::unistd::getppid() != parent {
        std::process::exit(SETUP_FAILED);
    }
}

fn cstr(s: &str, report: &mut Report) -> CString {
    CString::new(s).or_fail(report, "path with NUL")
}

fn under(new_root: &Path, path: &str) -> PathBuf {
    new_root.join(path.trim_start_matches('/'))
}

fn ensure_dir(p: &Path, report: &mut Report) {
    std::fs::create_dir_all(p).or_fail(report, "create mount point");
}

/// A file's mount point: an empty regular file at `p`, made by one
/// `mknod` (its parent directories only when missing: the view binds
/// ~20 files into directories it made once). An entry already there is
/// left as it is (binding over a directory fails and says so).
fn ensure_file(p: &Path, report: &mut Report) {
    use nix::sys::stat::{Mode, SFlag, mknod};
    let make = || match mknod(p, SFlag::S_IFREG, Mode::from_bits_truncate(0o644), 0) {
        Err(nix::errno::Errno::EEXIST) => Ok(()),
        r => r,
    };
    match make() {
        Err(nix::errno::Errno::ENOENT) => {
            if let Some(parent) = p.parent() {
                ensure_dir(parent, report);
            }
            make().or_fail(report, "create mount point");
        }
        r => r.or_fail(report, "create mount point"),
    }
}

fn bind_read_only(source: &Path, target: &Path, report: &mut Report) {
    let flags = MsFlags::MS_BIND;
    mount(Some(source), target, None::<&str>, flags, None::<&str>)
        .map_err(|e| format!("bind {} -> {}: {e}", source.display(), target.display()))
        .or_fail(report, "bind mount");
    let ro = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV;
    mount(None::<&str>, target, None::<&str>, ro, None::<&str>)
        .map_err(|e| format!("remount read-only {}: {e}", target.display()))
        .or_fail(report, "bind mount");
}

/// Where S1 finds the sources of the view: the host's `/` (or the image
/// rootfs of `Plan::system_root`), and the workspace through its idmapped
/// clone.
struct Sources {
    host: OwnedFd,
    workspace: OwnedFd,
    root: String,
    /// An empty directory: the second lower layer of read-only overlays.
    empty: OwnedFd,
    /// Descriptors named by `/proc/self/fd/N` in mounted overlays' options;
    /// kept open until the root is built.
    held: Vec<OwnedFd>,
}

impl Sources {
    /// The inode `path` names, resolved without following any symlink.
    fn open(&self, path: &str) -> std::io::Result<OwnedFd> {
        match path.strip_prefix(self.root.as_str()) {
            Some(rel) if rel.is_empty() || rel.starts_with('/') => {
                sys::open_beneath(&self.workspace, rel)
            }
            _ => sys::open_beneath(&self.host, path),
        }
    }
}

fn open_dir(path: &Path, report: &mut Report) -> OwnedFd {
    nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", path.display()))
    .or_fail(report, "open view source")
}

/// Shows `path` read-only: a directory as a read-only overlay (its only
/// real layer the source; overlayfs makes a host process's unix socket
/// in it unconnectable), a regular file by a bind mount of that inode.
fn show_read_only(src: &mut Sources, path: &str, target: &Path, report: &mut Report) {
    let fd = src
        .open(path)
        .map_err(|e| format!("{path}: {e} (changed since the plan?)"))
        .or_fail(report, "open view source");
    let st = nix::sys::stat::fstat(&fd).or_fail(report, "open view source");
    match st.st_mode & nix::libc::S_IFMT {
        nix::libc::S_IFDIR => {
            ensure_dir(target, report);
            let options = format!(
                "lowerdir={}:{},xino=on",
                sys::fd_path(&fd),
                sys::fd_path(&src.empty)
            );
            mount(
                Some("overlay"),
                target,
                Some("overlay"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(options.as_str()),
            )
            .map_err(|e| format!("{path}: {e}"))
            .or_fail(report, "mount read-only overlay");
            src.held.push(fd);
        }
        nix::libc::S_IFREG => {
            ensure_file(target, report);
            bind_read_only(Path::new(&sys::fd_path(&fd)), target, report);
        }
        _ => report.fail(
            "open view source",
            format!("{path}: neither a directory nor a regular file"),
        ),
    }
}

/// S1: the new root, from the Plan's mount list, in the order of
/// [`mountplan::steps`] (unit-tested there through a fake [`Mounts`]).
fn build_root(plan: &Plan, turn_dir: &Path, new_root: &Path, report: &mut Report) {
    let steps = mountplan::steps(plan, turn_dir, new_root);
    let mut kernel = KernelMounts {
        report,
        src: None,
        t0: std::time::Instant::now(),
        laps: Vec::new(),
    };
    // KernelMounts fails the stage itself (exit, fail closed); an error
    // returned here is reported the same way.
    if let Err((stage, detail)) = mountplan::build(&mut kernel, &steps) {
        kernel.report.fail(stage, detail);
    }
    kernel.lap("view");
    let laps = std::mem::take(&mut kernel.laps);
    report.event(InitEvent::InitLaps {
        us: laps.into_iter().map(|(k, v)| (k, v as u64)).collect(),
    });
}

/// The mount plan's steps, carried out by the kernel. A failing step ends
/// the process through the report (fail closed), naming its stage.
struct KernelMounts<'r> {
    report: &'r mut Report,
    /// Open from `OpenSources` to `DetachWorkspace`.
    src: Option<Sources>,
    t0: std::time::Instant,
    laps: Vec<(String, u128)>,
}

impl KernelMounts<'_> {
    fn lap(&mut self, name: &str) {
        self.laps
            .push((name.to_owned(), self.t0.elapsed().as_micros()));
    }

    fn sources(&mut self) -> &mut Sources {
        match self.src {
            Some(ref mut s) => s,
            None => self
                .report
                .fail("open view source", "the view's sources are not open"),
        }
    }
}

impl Mounts for KernelMounts<'_> {
    fn apply(&mut self, step: &MountStep) -> Result<(), String> {
        let stage = step.stage();
        match step {
            // Nothing we mount may propagate back to the host.
            MountStep::MakeRprivate => mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .or_fail(self.report, stage),
            // `isolated`: the empty network namespace is the boundary, its
            // loopback works (IPv4 and IPv6).
            MountStep::LoopbackUp => sys::loopback_up().or_fail(self.report, stage),
            MountStep::RootTmpfs { target } => mount(
                Some("tmpfs"),
                target,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some("mode=0755,size=1m,nr_inodes=4096"),
            )
            .or_fail(self.report, stage),
            // This PID namespace's /proc, first: the idmap helper is found
            // there.
            MountStep::Proc { target } => {
                ensure_dir(target, self.report);
                mount(
                    Some("proc"),
                    target,
                    Some("proc"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                    None::<&str>,
                )
                .or_fail(self.report, stage);
                self.lap("root_proc_lo");
            }
            // The workspace as its owner's: idmapped to the turn's uid/gid.
            MountStep::IdmapWorkspace {
                proc,
                source,
                target,
                owner,
                ids,
            } => {
                sys::idmapped_clone(proc, source, target, *owner, *ids).or_fail(self.report, stage);
                self.lap("idmap");
            }
            MountStep::OpenSources {
                system,
                root,
                workspace,
                empty,
            } => {
                let src = Sources {
                    host: open_dir(system, self.report),
                    workspace: open_dir(workspace, self.report),
                    root: root.clone(),
                    empty: open_dir(empty, self.report),
                    held: Vec::new(),
                };
                self.src = Some(src);
            }
            // The file masks are bound from, unreadable by the turn's uid.
            MountStep::MaskSource { file } => {
                File::create(file).or_fail(self.report, stage);
                std::fs::set_permissions(file, std::os::unix::fs::PermissionsExt::from_mode(0o000))
                    .or_fail(self.report, stage);
            }
            MountStep::ShowReadOnly { path, target } => {
                let Some(mut src) = self.src.take() else {
                    self.report.fail(stage, "the view's sources are not open")
                };
                show_read_only(&mut src, path, target, self.report);
                self.src = Some(src);
            }
            MountStep::SystemReadOnly {
                path,
                target,
                in_image: true,
            } => {
                // An image's file: opened beneath the image without
                // following any symlink (its links must not reach the host).
                let fd = self
                    .sources()
                    .open(path)
                    .map_err(|e| format!("{path}: {e} (in the image rootfs)"))
                    .or_fail(self.report, "open view source");
                let st = nix::sys::stat::fstat(&fd).or_fail(self.report, "open view source");
                if st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR {
                    ensure_dir(target, self.report);
                } else {
                    ensure_file(target, self.report);
                }
                bind_read_only(Path::new(&sys::fd_path(&fd)), target, self.report);
            }
            MountStep::SystemReadOnly { path, target, .. } => {
                if Path::new(path).is_dir() {
                    ensure_dir(target, self.report);
                } else {
                    ensure_file(target, self.report);
                }
                bind_read_only(Path::new(path), target, self.report);
            }
            MountStep::Symlink { link, target } => {
                if let Some(parent) = link.parent() {
                    ensure_dir(parent, self.report);
                }
                std::os::unix::fs::symlink(target, link).or_fail(self.report, stage);
            }
            MountStep::Dir { target } => ensure_dir(target, self.report),
            MountStep::Generated {
                file,
                target,
                contents,
            } => {
                std::fs::write(file, contents).or_fail(self.report, stage);
                std::fs::set_permissions(file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
                    .or_fail(self.report, stage);
                ensure_file(target, self.report);
                bind_read_only(file, target, self.report);
            }
            MountStep::Dev { target, shm_bytes } => build_dev(target, *shm_bytes, self.report),
            MountStep::Ephemeral { target, bytes } => {
                ensure_dir(target, self.report);
                mount(
                    Some("tmpfs"),
                    target,
                    Some("tmpfs"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                    Some(format!("mode=1777,size={bytes}").as_str()),
                )
                .map_err(|e| format!("{}: {e}", target.display()))
                .or_fail(self.report, stage);
            }
            MountStep::Overlay {
                path,
                target,
                upper,
                work,
            } => {
                let lowerdir = self
                    .sources()
                    .open(path)
                    .map_err(|e| format!("{path}: {e}"))
                    .or_fail(self.report, stage);
                let upper = open_dir(upper, self.report);
                let work = open_dir(work, self.report);
                let options = format!(
                    "lowerdir={},upperdir={},workdir={},xino=on",
                    sys::fd_path(&lowerdir),
                    sys::fd_path(&upper),
                    sys::fd_path(&work)
                );
                ensure_dir(target, self.report);
                mount(
                    Some("overlay"),
                    target,
                    Some("overlay"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                    Some(options.as_str()),
                )
                .map_err(|e| format!("overlay on {path}: {e}"))
                .or_fail(self.report, stage);
                self.sources().held.extend([lowerdir, upper, work]);
            }
            MountStep::MaskDir { target } => mask_dir(target, self.report),
            MountStep::MaskFile { source, target } => bind_read_only(source, target, self.report),
            // The idmapped clone is only a source: the layers hold what
            // they need. It is mounted in the turn directory, outside the
            // new root: after pivot_root it lies under the old root, and
            // PID 1's detach of the old root (recursive) takes it along
            // before any command stage exists. Detached here on its own,
            // its unmount waited for an RCU grace period of its own
            // (~0.4 ms measured, on the turn's path).
            // (mountplan's tests: its target is never under the new root.)
            MountStep::DetachWorkspace { .. } => self.src = None,
            MountStep::OldRootDir { target } => ensure_dir(target, self.report),
        }
        Ok(())
    }
}

fn mask_dir(target: &Path, report: &mut Report) {
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0000,size=4k,nr_inodes=1"),
    )
    .map_err(|e| format!("mask {}: {e}", target.display()))
    .or_fail(report, "mask directory");
}

/// The character devices every turn gets: (name, major, minor).
const DEVICES: [(&str, u64, u64); 6] = [
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

/// The minimal `/dev`: the usual character devices, the standard symlinks, a private
/// devpts instance, `/dev/shm` and the turn's `/dev/mqueue`; read-only once built.
fn build_dev(dev: &Path, shm_bytes: u64, report: &mut Report) {
    ensure_dir(dev, report);
    mount(
        Some("tmpfs"),
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k,nr_inodes=64"),
    )
    .or_fail(report, "mount /dev");
    // Nodes of the turn's own on its /dev tmpfs, never binds of the host's:
    // a bound host inode is the host's to lose (chmod, chown and utimes
    // through the bind change it — issue 22). /dev is read-only once built,
    // so the turn cannot change these either (EROFS).
    for (name, major, minor) in DEVICES {
        let target = dev.join(name);
        nix::sys::stat::mknod(
            &target,
            nix::sys::stat::SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(major, minor),
        )
        .map_err(|e| format!("mknod /dev/{name}: {e}"))
        .or_fail(report, "create device");
        // mknod's mode passes through the umask.
        nix::sys::stat::fchmodat(
            nix::fcntl::AT_FDCWD,
            &target,
            Mode::from_bits_truncate(0o666),
            nix::sys::stat::FchmodatFlags::NoFollowSymlink,
        )
        .map_err(|e| format!("chmod /dev/{name}: {e}"))
        .or_fail(report, "create device");
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link)).or_fail(report, "create /dev symlink");
    }
    // A devpts of the turn's own: its ptys are invisible to the host's and
    // the host's to it.
    let pts = dev.join("pts");
    ensure_dir(&pts, report);
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .or_fail(report, "mount /dev/pts");
    let shm = dev.join("shm");
    ensure_dir(&shm, report);
    mount(
        Some("tmpfs"),
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(format!("mode=1777,size={shm_bytes}").as_str()),
    )
    .or_fail(report, "mount /dev/shm");
    // The turn's POSIX message queues: an mqueue instance belongs to the
    // IPC namespace of the process that mounts it, and this init runs in
    // the turn's own (the supervisor unshared it), so this is that
    // namespace's — its queues die with the turn. mq_open(3) never walks
    // this path (the kernel opens on the namespace's internal mount), but
    // Landlock refused that open (EACCES) for want of a rule: the Plan's
    // read-write rule on this mount's root inode, the superblock's only
    // root, covers the internal mount too (real-software audit).
    let mqueue = dev.join("mqueue");
    ensure_dir(&mqueue, report);
    mount(
        Some("mqueue"),
        &mqueue,
        Some("mqueue"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .or_fail(report, "mount /dev/mqueue");
    // /dev itself read-only: nobody creates nodes there.
    mount(
        None::<&str>,
        dev,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .or_fail(report, "remount /dev read-only");
}

/// `/proc`'s masked and read-only paths (those this kernel has).
fn harden_proc(plan: &Plan, new_root: &Path, report: &mut Report) {
    let Some(Mount::Proc { masked, read_only }) =
        plan.mounts.iter().find(|m| matches!(m, Mount::Proc { .. }))
    else {
        return;
    };
    let empty = new_root.join(".masked");
    for path in masked {
        let target = under(new_root, path);
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => mask_dir(&target, report),
            Ok(_) => bind_read_only(&empty, &target, report),
            Err(_) => {}
        }
    }
    for path in read_only {
        let target = under(new_root, path);
        if std::fs::symlink_metadata(&target).is_ok() {
            bind_read_only(&target, &target, report);
        }
    }
}

/// S3, parked: the root is built and the command's stage holds the
/// turn's identity (restriction steps 1–4). Says so on `READY_FD` and waits
/// for its turn on `TURN_FD` — for a warm sandbox, a turn that comes
/// later: the built Plan itself ([`SAME_PLAN`]) or the turn's own part
/// ([`TURN_PART`]) on it, so the turn's Plan has the shape this sandbox was
/// built from ([`Plan::shape`]); what differs (the command, its
/// environment and execute rules) takes effect in the steps that follow.
/// EOF without a turn: the sandbox was discarded; S3 exits, and S2 with
/// it, taking the namespace along.
fn await_turn<'a>(built: &'a Plan, report: &mut Report) -> std::borrow::Cow<'a, Plan> {
    use std::io::Read;
    // SAFETY: READY_FD was placed by the supervisor for this process tree
    // and stays open in S2; it is borrowed for one write.
    let ready = unsafe { std::os::fd::BorrowedFd::borrow_raw(READY_FD) };
    if nix::unistd::write(ready, &[PARKED]) != Ok(1) {
        report.fail("park", "the supervisor is gone");
    }
    // SAFETY: TURN_FD was placed by the supervisor for S3 alone (S1 and S2
    // closed their copies); S3 takes ownership here and it is closed once
    // read.
    let turn = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(TURN_FD) };
    let mut bytes = Vec::new();
    turn.take(MAX_TURN_PLAN)
        .read_to_end(&mut bytes)
        .or_fail(report, "read the turn's plan");
    if bytes.is_empty() {
        // Discarded unused (a warm sandbox nobody took): not an error. (The
        // supervisor kills a discarded sandbox's cgroup; nobody reads what
        // S2 reports of this exit.)
        std::process::exit(0)
    }
    if bytes == SAME_PLAN {
        return std::borrow::Cow::Borrowed(built);
    }
    // Only the turn's own part: the rest is the built Plan's, so the
    // turn's Plan has this sandbox's shape by construction.
    match bytes.split_first() {
        Some((&TURN_PART, part)) => {
            let part: turnstile_policy::plan::TurnPart =
                serde_json::from_slice(part).or_fail(report, "read the turn's plan");
            std::borrow::Cow::Owned(built.with_turn_part(part))
        }
        _ => report.fail(
            "park",
            "the turn was sent neither as the built plan nor as its turn part",
        ),
    }
}

/// S2: PID 1 of the turn.
fn pid1(built: &Plan, new_root: &Path, bpf: &[u8], mut report: Report) -> ! {
    harden_proc(built, new_root, &mut report);
    chdir(new_root).or_fail(&mut report, "chdir new root");
    pivot_root(".", ".oldroot").or_fail(&mut report, "pivot_root");
    chdir("/").or_fail(&mut report, "chdir /");
    umount2("/.oldroot", MntFlags::MNT_DETACH).or_fail(&mut report, "detach old root");
    std::fs::remove_dir("/.oldroot").or_fail(&mut report, "remove old root mount point");
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .or_fail(&mut report, "remount / read-only");
    let _ = nix::unistd::sethostname(&built.hostname);

    // The command's stage is forked before its turn is known, and parks
    // holding the turn's identity: a warm turn starts at Landlock, not at
    // fork (measured on served warm turns: fork, signal setup and steps
    // 1–4 took ~0.3 ms of the turn's path).
    // SAFETY: S2 is single-threaded (a fresh exec, or forked from
    // single-threaded S1).
    match unsafe { fork() }.or_fail(&mut report, "fork command") {
        ForkResult::Child => command_stage(built, bpf, report),
        ForkResult::Parent { child } => {
            // S2 keeps DONE_FD (end_turn).
            close_handshake(&[READY_FD, GO_FD, TURN_FD]);
            // What S2 reports of the turn depends on the shape alone.
            reap(built, child, report)
        }
    }
}

/// Most files described per ephemeral directory; files up to this size
/// are hashed.
const EPHEMERAL_LISTED: usize = 256;
const EPHEMERAL_HASHED_BYTES: u64 = 16 << 20;

/// What the command left in its private `/dev/shm` and ephemeral tmpfs
/// mounts (discarded with the turn, never committed — but recorded, so the
/// evidence shows it): path, kind, size and sha256 (files up to 16 MiB), at
/// most 256 entries per directory, never crossing into another mount.
fn report_ephemeral(plan: &Plan, report: &mut Report) {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::MetadataExt;
    let mut dirs = vec!["/dev/shm".to_owned()];
    dirs.extend(plan.mounts.iter().filter_map(|m| match m {
        Mount::Ephemeral { path, .. } => Some(path.clone()),
        _ => None,
    }));
    for top in dirs {
        let Ok(dev) = std::fs::symlink_metadata(&top).map(|m| m.dev()) else {
            continue;
        };
        let mut files = Vec::new();
        let mut stack = vec![PathBuf::from(&top)];
        let mut more = false;
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let Ok(m) = e.path().symlink_metadata() else {
                    continue;
                };
                // A mount point inside (the workspace's path): not ours.
                if m.dev() != dev {
                    continue;
                }
                if files.len() >= EPHEMERAL_LISTED {
                    more = true;
                    break;
                }
                let path = e.path();
                if m.is_dir() {
                    stack.push(path.clone());
                }
                let sha256 = (m.is_file() && m.len() <= EPHEMERAL_HASHED_BYTES)
                    .then(|| std::fs::read(&path).ok())
                    .flatten()
                    .map(|b| hex::encode(Sha256::digest(&b)));
                files.push(json!({
                    "path": path.display().to_string(),
                    "kind": if m.is_dir() { "dir" } else if m.is_file() { "file" } else if m.file_type().is_symlink() { "symlink" } else { "other" },
                    "bytes": m.len(),
                    "sha256": sha256,
                }));
            }
        }
        if !files.is_empty() {
            report.event(InitEvent::Ephemeral {
                dir: top,
                files,
                truncated: more,
            });
        }
    }
}

/// S2's loop: reap every child; when the command exits, report its status
/// and exit, which makes the kernel kill the rest of the namespace.
fn reap(plan: &Plan, command: Pid, mut report: Report) -> ! {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == command => {
                report_ephemeral(plan, &mut report);
                report.event(InitEvent::Exit { code });
                end_turn()
            }
            Ok(WaitStatus::Signaled(pid, signal, core)) if pid == command => {
                report_ephemeral(plan, &mut report);
                report.event(InitEvent::Signal {
                    signal: signal as i32,
                    name: signal.as_str().to_owned(),
                    core,
                });
                end_turn()
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => report.fail("reap", e),
        }
    }
}

/// S2 once the command has ended and its status is reported: kills every
/// other process of the PID namespace (what the kernel does when PID 1
/// exits) and reaps them all, closes its copies of the turn's stdio (the
/// supervisor reads the output pipes to EOF), says [`DONE`] on `DONE_FD`
/// and exits. The supervisor captures from here on, while this process's
/// exit — its namespaces' teardown — runs beside it; the cgroup tells it
/// that nothing but this process is left.
fn end_turn() -> ! {
    let _ = nix::sys::signal::kill(Pid::from_raw(-1), nix::sys::signal::Signal::SIGKILL);
    // Until ECHILD: no process of the namespace is left.
    while let Ok(_) | Err(nix::errno::Errno::EINTR) =
        waitpid(Pid::from_raw(-1), Some(WaitPidFlag::__WALL))
    {}
    close_handshake(&[0, 1, 2]);
    // SAFETY: DONE_FD was placed by the supervisor for this process tree
    // and is still open in S2 (only S1 and S3 close it); borrowed for one
    // write.
    let done = unsafe { std::os::fd::BorrowedFd::borrow_raw(DONE_FD) };
    let _ = nix::unistd::write(done, &[DONE]);
    std::process::exit(0)
}

/// S3. The fixed restriction order (STYLE rule 5), each step relying on the
/// one before:
/// 1. namespaces, mounts and pivot_root — done by S1/S2; the cgroup was
///    joined before exec;
/// 2. capabilities: clear the bounding set first (needs CAP_SETPCAP, which
///    we still have), then ambient and inheritable, so no exec can regain
///    them;
/// 3. no_new_privs, so no setuid binary or file capability raises them;
/// 4. the unprivileged uid/gid (and no supplementary groups): moving off
///    uid 0 empties the permitted and effective sets, which we then verify;
/// 5. Landlock, built from sandbox paths (after the pivot);
/// 6. seccomp last, right before execve, so everything above may use the
///    syscalls it forbids.
///
/// Steps 2–4 depend on the Plan's shape only and run as soon as S3 is
/// forked; it then parks ([`await_turn`]), and 5–6 follow with the turn's
/// own Plan — or, for a warm sandbox's stage restricted ahead, with its
/// built Plan, before the turn, whose command then comes with the go.
fn command_stage(built: &Plan, bpf: &[u8], mut report: Report) -> ! {
    // Only S2 says the turn is over.
    close_handshake(&[DONE_FD]);
    let _ = nix::unistd::setsid();
    set_sigterm(nix::sys::signal::SigHandler::SigDfl).or_fail(&mut report, "restore SIGTERM");
    // The Rust runtime ignores SIGPIPE in this process, and an ignored
    // disposition survives exec: the command gets the default, as it
    // would outside (`seq 100000 | head -1` ends quietly, not with EPIPE
    // errors), and as std's Command gives the OCI path's command.
    set_disposition(
        nix::sys::signal::Signal::SIGPIPE,
        nix::sys::signal::SigHandler::SigDfl,
    )
    .or_fail(&mut report, "restore SIGPIPE");
    nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    )
    .or_fail(&mut report, "clear signal mask");
    // 2.-4. of the restriction order (see sandbox::restrict): what the
    // shape decides, before the turn is known.
    if let Err((stage, why)) =
        super::restrict::restrict_identity(&mut RealKernel::default(), built.uid, built.gid)
    {
        report.fail(stage, why)
    }
    // The shape's Landlock rules, before the turn is known (not in force
    // until the turn's execute rules join them). One that cannot be made
    // now is made, or fails, with the turn's, as before.
    let mut kernel = RealKernel {
        landlock: landlock::prepare(&built.landlock).ok(),
        ..RealKernel::default()
    };
    let plan = &await_turn(built, &mut report);

    // A receive turn's stdin: the input envelope, from a memory file
    // (never a host inode), written before Landlock and seccomp.
    if let Some(text) = &plan.stdin {
        stdin_from_memory(text.as_bytes()).or_fail(&mut report, "stdin");
    }
    // 5.-7. the rest of the restriction order, seccomp last.
    let (argv, env) = command_line(&plan.argv, &plan.env, &mut report);
    let outcome = match super::restrict::restrict_access(&mut kernel, plan, bpf) {
        Ok(o) => o,
        Err((stage, why)) => report.fail(stage, why),
    };
    report.event(InitEvent::Landlock {
        outcome: outcome.to_value(),
    });
    report.event(InitEvent::Exec {
        pid: std::process::id(),
    });
    // Fully restricted: let the supervisor inspect us from outside before
    // the command's first instruction; exec only on its go.
    let (argv, env) = match handshake(kernel.notify_fd) {
        Some(Go::Plan) => (argv, env),
        Some(Go::Launch(part)) => {
            // Restricted ahead of this turn: its command, with the
            // restrictions already in force — which must be its own. (Its
            // Plan would be the built one with this part: only the part's
            // fields are compared and used, nothing is rebuilt.)
            if part.execute != plan.landlock.execute || part.cwd != plan.cwd || part.stdin.is_some()
            {
                report.fail(
                    "launch",
                    "the turn's restrictions are not the ones this stage holds",
                )
            }
            command_line(&part.argv, &part.env, &mut report)
        }
        None => {
            report.event(InitEvent::Error {
                stage: "posture".into(),
                detail: "the supervisor did not approve the sandbox posture".into(),
            });
            std::process::exit(SETUP_FAILED);
        }
    };
    if argv.is_empty() {
        report.fail("launch", "the turn has no command")
    }
    let err = nix::unistd::execve(&argv[0], &argv, &env).err();
    // seccomp is in force: only write/exit are certain to work now.
    report.event(InitEvent::ExecFailed {
        errno: err.map(|e| e as i32),
        error: err.map(|e| e.desc().to_owned()),
    });
    std::process::exit(if err == Some(nix::errno::Errno::ENOENT) {
        127
    } else {
        126
    })
}

/// A command and environment as `execve` takes them.
fn command_line(
    argv: &[String],
    env: &[(String, String)],
    report: &mut Report,
) -> (Vec<CString>, Vec<CString>) {
    let argv = argv.iter().map(|a| cstr(a, report)).collect();
    let env = env
        .iter()
        .map(|(k, v)| cstr(&format!("{k}={v}"), report))
        .collect();
    (argv, env)
}

/// Makes `bytes` this process's standard input: a sealed-size memory file,
/// rewound, on descriptor 0.
fn stdin_from_memory(bytes: &[u8]) -> std::result::Result<(), String> {
    use std::io::{Seek, Write};
    let fd =
        nix::sys::memfd::memfd_create(c"turnstile-stdin", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .map_err(|e| format!("memfd_create: {e}"))?;
    let mut file = File::from(fd);
    file.write_all(bytes)
        .and_then(|()| file.rewind())
        .map_err(|e| format!("write the input: {e}"))?;
    // dup2 clears close-on-exec on the new descriptor.
    nix::unistd::dup2_stdin(&file).map_err(|e| format!("dup2: {e}"))?;
    Ok(())
}

/// The real kernel behind the restriction order.
#[derive(Default)]
struct RealKernel {
    /// Where the seccomp listener is, once the filter is loaded.
    notify_fd: Option<i32>,
    /// The shape's Landlock rules, made while the stage waited for its
    /// turn ([`landlock::prepare`]): the turn adds its execute rules.
    landlock: Option<landlock::Prepared>,
}

impl super::restrict::Kernel for RealKernel {
    fn drop_capabilities(&mut self) -> Result<(), String> {
        // One prctl per capability the kernel knows, and one for the whole
        // ambient set: `caps::clear` read each capability of each set
        // before dropping it (~165 syscalls on every turn's stage, against
        // ~44 here). The bounding set: PR_CAPBSET_DROP of each number up
        // to the first the kernel does not know (EINVAL: past
        // cap_last_cap); any other error fails the stage.
        for cap in 0..=u64::from(u8::MAX) {
            // SAFETY: prctl(2) with integer arguments only.
            let r = unsafe {
                nix::libc::prctl(
                    nix::libc::PR_CAPBSET_DROP,
                    cap as nix::libc::c_ulong,
                    0,
                    0,
                    0,
                )
            };
            if r == 0 {
                continue;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(nix::libc::EINVAL) && cap > 0 {
                break;
            }
            return Err(format!("drop capability {cap} from the bounding set: {e}"));
        }
        // SAFETY: prctl(2) with integer arguments only.
        let r = unsafe {
            nix::libc::prctl(
                nix::libc::PR_CAP_AMBIENT,
                nix::libc::PR_CAP_AMBIENT_CLEAR_ALL as nix::libc::c_ulong,
                0,
                0,
                0,
            )
        };
        if r != 0 {
            return Err(format!(
                "clear the ambient set: {}",
                std::io::Error::last_os_error()
            ));
        }
        caps::clear(None, caps::CapSet::Inheritable).map_err(|e| e.to_string())
    }

    fn no_new_privs(&mut self) -> Result<(), String> {
        nix::sys::prctl::set_no_new_privs().map_err(|e| e.to_string())
    }

    fn become_user(&mut self, uid: u32, gid: u32) -> Result<(), String> {
        let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
        // The turn's own output pipes become its uid's, so that `echo x >
        // /dev/stderr` (a reopen through /proc/self/fd) works.
        for fd in [1, 2] {
            // SAFETY: descriptors 1 and 2 are open for the life of this
            // process.
            let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            if nix::sys::stat::fstat(borrowed)
                .is_ok_and(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFIFO)
            {
                nix::unistd::fchown(borrowed, Some(uid), Some(gid))
                    .map_err(|e| format!("hand the output pipes to the turn: {e}"))?;
            }
        }
        nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
        nix::unistd::setresgid(gid, gid, gid).map_err(|e| format!("setresgid: {e}"))?;
        nix::unistd::setresuid(uid, uid, uid).map_err(|e| format!("setresuid: {e}"))
    }

    fn verify_no_capabilities(&mut self) -> Result<(), String> {
        // Three capget(2)s. The ambient set is not read capability by
        // capability (41 prctls): the kernel keeps it a subset of
        // permitted ∩ inheritable (capabilities(7), "ambient"), so with
        // those two verified empty it is empty.
        for set in [
            caps::CapSet::Permitted,
            caps::CapSet::Effective,
            caps::CapSet::Inheritable,
        ] {
            let held = caps::read(None, set).map_err(|e| e.to_string())?;
            if !held.is_empty() {
                return Err(format!("{set:?} still holds {held:?}"));
            }
        }
        Ok(())
    }

    fn landlock(
        &mut self,
        rules: &turnstile_policy::plan::LandlockRules,
    ) -> Result<landlock::LandlockOutcome, String> {
        match self.landlock.take() {
            Some(prepared) if prepared.holds(rules) => prepared.finish(rules),
            _ => landlock::apply(rules),
        }
    }

    fn chdir(&mut self, dir: &str) -> Result<(), String> {
        chdir(dir).map_err(|e| e.to_string())
    }

    fn seccomp(&mut self, bpf: &[u8]) -> Result<(), String> {
        self.notify_fd = Some(load_seccomp(bpf)?);
        Ok(())
    }
}

/// Closes the handshake descriptors in a stage that does not use them, so
/// the supervisor sees end-of-file when the command's stage dies early.
fn close_handshake(fds: &[i32]) {
    for &fd in fds {
        // SAFETY: the callers pass handshake descriptors the supervisor
        // placed for this process tree that are still open here and that
        // nothing else in this process refers to, so taking ownership and
        // dropping (closing) them is sound.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    }
}

/// The supervisor's answer on `GO_FD`.
enum Go {
    /// [`GO`]: the Plan S3 was restricted with.
    Plan,
    /// [`LAUNCH`]: the turn's own part, for a stage restricted ahead.
    Launch(turnstile_policy::plan::TurnPart),
}

/// S3's side of the posture handshake: "ready" and the number of the
/// descriptor that holds the seccomp listener (one byte each, one write),
/// then wait for "go" (read to EOF: the supervisor closes its end once
/// written). `None`: no go (the supervisor refused or is gone). Runs under
/// seccomp: it reads, allocates and parses, nothing else.
fn handshake(notify_fd: Option<i32>) -> Option<Go> {
    use std::io::Read;
    // SAFETY: READY_FD is open in S3 for its whole life (inherited from S1
    // through fork); borrowing it for one write is sound.
    let ready = unsafe { std::os::fd::BorrowedFd::borrow_raw(READY_FD) };
    let fd = notify_fd.and_then(|fd| u8::try_from(fd).ok())?;
    if nix::unistd::write(ready, &[READY, fd]) != Ok(2) {
        return None;
    }
    // SAFETY: GO_FD was placed by the supervisor for this process tree and
    // S3 is its only reader (S1 and S2 closed their copies); S3 takes
    // ownership here and closes it once read.
    let go = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(GO_FD) };
    let mut answer = Vec::new();
    go.take(MAX_TURN_PLAN).read_to_end(&mut answer).ok()?;
    match answer.split_first() {
        _ if answer == GO => Some(Go::Plan),
        Some((&LAUNCH, part)) => serde_json::from_slice(part).ok().map(Go::Launch),
        _ => None,
    }
}

fn set_sigterm(handler: nix::sys::signal::SigHandler) -> nix::Result<()> {
    set_disposition(nix::sys::signal::Signal::SIGTERM, handler)
}

/// `signal`'s disposition: [`SigHandler::SigIgn`] or
/// [`SigHandler::SigDfl`] (no handler function).
///
/// [`SigHandler::SigIgn`]: nix::sys::signal::SigHandler::SigIgn
/// [`SigHandler::SigDfl`]: nix::sys::signal::SigHandler::SigDfl
fn set_disposition(
    signal: nix::sys::signal::Signal,
    handler: nix::sys::signal::SigHandler,
) -> nix::Result<()> {
    let action = nix::sys::signal::SigAction::new(
        handler,
        nix::sys::signal::SaFlags::empty(),
        nix::sys::signal::SigSet::empty(),
    );
    // SAFETY: callers pass SIG_IGN or SIG_DFL, which are not functions;
    // installing them cannot run code in signal context.
    unsafe { nix::sys::signal::sigaction(signal, &action) }.map(|_| ())
}

/// Loads a BPF program compiled by libseccomp in the supervisor.
fn load_seccomp(bpf: &[u8]) -> Result<i32, String> {
    const INSN: usize = std::mem::size_of::<nix::libc::sock_filter>();
    if bpf.is_empty() || bpf.len() % INSN != 0 || bpf.len() / INSN > usize::from(u16::MAX) {
        return Err(format!("malformed BPF program ({} bytes)", bpf.len()));
    }
    let insns: Vec<nix::libc::sock_filter> = bpf
        .chunks_exact(INSN)
        .map(|c| nix::libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    let prog = nix::libc::sock_fprog {
        len: insns.len() as u16,
        filter: insns.as_ptr().cast_mut(),
    };
    // A new listener for the deny list's notifications (see
    // sandbox::notify): close-on-exec, on the lowest free descriptor, whose
    // number the handshake tells the supervisor, which takes it. (A fixed
    // high number failed with EBADF under a low RLIMIT_NOFILE.)
    // SAFETY: `prog` points at `insns`, a valid array of `len` sock_filter
    // structs that outlives the call; the kernel copies the program.
    // no_new_privs is already set, as seccomp(2) requires of an unprivileged
    // caller.
    let rc = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_seccomp,
            nix::libc::SECCOMP_SET_MODE_FILTER,
            nix::libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &prog as *const nix::libc::sock_fprog,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let listener = rc as i32;
    if u8::try_from(listener).is_err() {
        return Err(format!(
            "the listener landed on descriptor {listener}, which the handshake cannot name"
        ));
    }
    Ok(listener)
}
