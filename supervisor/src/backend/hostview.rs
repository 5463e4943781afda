//! What the OCI backends (runc, crun, runsc) share: the host side of the
//! view — the workspace as its owner's, idmapped to the turn's uid/gid
//! (the source of every workspace mount, as natively), and one overlay per
//! writable scope (lower: the idmapped workspace directory; upper and
//! work: the turn's scratch tmpfs), whose merged directories the bundle
//! binds in; unmounted on drop, whatever step failed —, the turn's bundle
//! over that view, the phase laps, reaping the container's process, and
//! the turn's [`Guard`]: what ends the container when its supervisor is
//! SIGKILLed.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use turnstile_policy::plan::Plan;

use crate::error::Result;
use crate::sandbox::cgroup::Place;
use crate::sandbox::sandbox_err as err;
use crate::sandbox::{TurnDir, init};

#[derive(Debug)]
pub struct HostView {
    /// The idmapped clone of the workspace root.
    pub lower: PathBuf,
    lower_mounted: bool,
    /// The writable scopes' merged overlay dirs, in scope order.
    pub merged: Vec<PathBuf>,
}

impl HostView {
    /// Mounts the idmapped clone and the scope overlays under `turn`.
    pub fn mount(plan: &Plan, turn: &TurnDir) -> Result<Self> {
        let mut view = Self {
            lower: turn.path.join(init::LOWER_DIR),
            lower_mounted: false,
            merged: Vec::new(),
        };
        crate::sandbox::sys::idmapped_clone(
            Path::new("/proc"),
            Path::new(&plan.root),
            &view.lower,
            plan.workspace_owner,
            (plan.uid, plan.gid),
        )
        .map_err(|e| err("idmap workspace", e.to_string()))?;
        view.lower_mounted = true;
        let scratch = turn.path.join(init::SCRATCH_DIR);
        for (i, scope) in plan.writable_scopes.iter().enumerate() {
            let merged = turn.path.join("merged").join(i.to_string());
            std::fs::create_dir_all(&merged)
                .map_err(|e| err("create overlay dir", e.to_string()))?;
            let options = format!(
                "lowerdir={}/{scope},upperdir={},workdir={},xino=on",
                view.lower.display(),
                scratch.join("upper").join(i.to_string()).display(),
                scratch.join("work").join(i.to_string()).display()
            );
            mount(
                Some("overlay"),
                &merged,
                Some("overlay"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(options.as_str()),
            )
            .map_err(|e| err("mount overlay", format!("{scope}: {e}")))?;
            view.merged.push(merged);
        }
        Ok(view)
    }

    /// The merged dirs as bundle mount sources.
    pub fn scope_sources(&self) -> Vec<String> {
        self.merged
            .iter()
            .map(|m| m.display().to_string())
            .collect()
    }

    /// The bundle of `plan` for `runtime` over this view (in
    /// `<turn>/bundle`, not yet written), its sandbox joining the turn's
    /// cgroup `/turnstile/<id>`.
    pub fn bundle(
        &self,
        plan: &Plan,
        turn: &TurnDir,
        runtime: &str,
        id: &str,
        cgroups: &Place,
    ) -> Result<(PathBuf, turnstile_oci::Bundle)> {
        let bundle_dir = turn.path.join("bundle");
        let options = super::bundle::options(
            plan,
            runtime,
            super::bundle::Place {
                bundle_dir: bundle_dir.clone(),
                empty_dir: turn.path.join(init::EMPTY_DIR),
                scope_sources: self.scope_sources(),
                workspace_source: Some(self.lower.display().to_string()),
            },
            Vec::new(),
            None,
        )?;
        let mut bundle =
            turnstile_oci::build(plan, &options).map_err(|e| err("build bundle", e.to_string()))?;
        bundle.config["linux"]["cgroupsPath"] =
            serde_json::Value::String(format!("/{}/{id}", cgroups.base().display()));
        Ok((bundle_dir, bundle))
    }

    /// Unmounts everything (idempotent).
    pub fn unmount(&mut self) {
        for m in self.merged.drain(..) {
            let _ = umount2(&m, MntFlags::MNT_DETACH);
        }
        if std::mem::take(&mut self.lower_mounted) {
            let _ = umount2(&self.lower, MntFlags::MNT_DETACH);
        }
    }
}

impl Drop for HostView {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// A backend's phases as laps of one clock (durations, as the native
/// backend and the turn pipeline record them).
#[derive(Debug)]
pub struct Laps {
    started: Instant,
    last: Instant,
    phases: Vec<(&'static str, u64)>,
}

impl Laps {
    pub fn new() -> Self {
        let now = Instant::now();
        Self {
            started: now,
            last: now,
            phases: Vec::new(),
        }
    }

    /// Records the time since the previous lap as phase `name`.
    pub fn lap(&mut self, name: &'static str) {
        let now = Instant::now();
        self.phases
            .push((name, now.duration_since(self.last).as_micros() as u64));
        self.last = now;
    }

    /// Moves the lap mark to now without recording a phase: the time since
    /// the last lap was spent at the intent-entry gate, which the turn counts
    /// as its own `intent_entry` phase (phases stay disjoint).
    pub fn skip(&mut self) {
        self.last = Instant::now();
    }

    /// The phases so far (taken), and the wall time since `new`.
    pub fn take(&mut self) -> (Vec<(&'static str, u64)>, std::time::Duration) {
        (std::mem::take(&mut self.phases), self.started.elapsed())
    }
}

/// Reaps `pid` (the container's process, our child as subreaper) and says
/// how it ended; `what` names it in a failure.
pub fn reap(pid: i32, runtime: &str, what: &str) -> crate::sandbox::Ending {
    use crate::sandbox::Ending;
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let status = loop {
        match waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::__WALL)) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other,
        }
    };
    match status {
        Ok(WaitStatus::Exited(_, code)) => Ending::Exited(code),
        Ok(WaitStatus::Signaled(_, s, _)) => Ending::Signaled {
            signal: s as i32,
            name: s.as_str().to_owned(),
        },
        other => Ending::SetupFailed {
            stage: runtime.into(),
            detail: format!("waiting for the {what}: {other:?}"),
        },
    }
}

/// argv[1] that makes `supervise` a turn's guard (not a user command).
pub const GUARD: &str = "__turn-guard";
/// argv[0] of the guard once it execs.
const GUARD_NAME: &str = "turnstile-guard";
/// The waiting guard's name (`comm`, 15 bytes at most).
const GUARD_COMM: &[u8] = b"turnstile-guard\0";
/// What the supervisor writes before it lets its guard go: the turn was
/// torn down by the supervisor itself.
const DISARM: u8 = b'D';

/// A turn's guard: a process that ends an OCI turn whose supervisor died
/// — SIGKILL included, which no handler and no drop sees.
///
/// A runc, crun or runsc container outlives its supervisor: its processes
/// descend from the runtime, so a parent-death signal set where we spawn
/// the runtime fires when `run --detach` or `create` exits, not when we do;
/// and its runtime record, cgroup directories and the turn's mounts are
/// host state that no process death removes.
///
/// The guard is a fork of the supervisor that holds only the read end of a
/// pipe (as fd 0; every other descriptor is closed) whose write end only
/// the supervisor holds (close-on-exec, so no runtime and no container
/// inherits it), and blocks reading it. [`DISARM`] (the supervisor tore the
/// turn down itself) ends it; EOF without it means the supervisor's last
/// descriptor table is gone, and it execs this binary as
/// `supervise __turn-guard RUNTIME ID TURN_DIR CGROUP_ROOT` ([`guard_main`]),
/// which takes the session lock (without waiting for it: a holder is a
/// later writer, and every writer recovers the session first, under that
/// lock) and does what recovery would: the runtime's `delete --force`, the
/// cgroup's kill and removal in every hierarchy, the turn's mounts and
/// directory. The turn's finish entries stay recovery's (they need the
/// ledgers' writer).
///
/// Why a fork that execs only when needed: a guard that is a fresh exec of
/// this binary cost every turn ~1.3 ms of CPU (the loader and relocations
/// of a 38 MB binary) and, on these 2-core hosts under load, ~3-4 ms of
/// wall time (measured in pairs, release build); the fork's waiting child
/// runs nothing but a few syscalls.
///
/// The guard is in its own process group (a SIGKILL to the supervisor's
/// group spares it), outside the turn's cgroup and namespaces, as root on
/// the host side: the turn (uid 65534, its own PID namespace, no
/// capabilities) cannot see, signal or write to it, and it reads nothing
/// but the pipe and the host's own records.
#[derive(Debug)]
pub struct Guard {
    pid: nix::unistd::Pid,
    /// The write end: dropping it without [`DISARM`] fires the guard.
    arm: Option<OwnedFd>,
}

impl Guard {
    /// Starts the guard of container `id` (`runtime`) whose turn directory
    /// is `turn_dir` and cgroup `<cgroup_place>/…/turnstile/<id>`.
    pub fn spawn(runtime: &str, id: &str, turn_dir: &Path, cgroup_place: &Place) -> Result<Self> {
        use std::ffi::CString;
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let cstr =
            |b: &[u8]| CString::new(b).map_err(|e| err("start the turn's guard", e.to_string()));
        // Everything the child needs, built before the fork.
        let exe = cstr(b"/proc/self/exe")?;
        let argv = [
            cstr(GUARD_NAME.as_bytes())?,
            cstr(GUARD.as_bytes())?,
            cstr(runtime.as_bytes())?,
            cstr(id.as_bytes())?,
            cstr(turn_dir.as_os_str().as_bytes())?,
            cstr(cgroup_place.root.as_os_str().as_bytes())?,
            cstr(cgroup_place.base().as_os_str().as_bytes())?,
        ];
        let mut argv_ptrs: Vec<*const nix::libc::c_char> =
            argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let envp: [*const nix::libc::c_char; 1] = [std::ptr::null()];
        let devnull = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(|e| err("start the turn's guard", format!("/dev/null: {e}")))?;
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| err("guard pipe", e.to_string()))?;
        let (read_fd, null_fd) = (read.as_raw_fd(), devnull.as_raw_fd());
        // SAFETY: the child runs only async-signal-safe raw syscalls
        // (setpgid, sigaction, sigprocmask, dup2, close_range/close, read,
        // execve, _exit) on values prepared above — the CStrings and the
        // pointer arrays outlive the fork in both processes — and ends in
        // execve or _exit: no allocation, lock or unwinding after the fork
        // of this multi-threaded process.
        match unsafe { nix::unistd::fork() } {
            // SAFETY: this is the fork's child; `exe`, `argv_ptrs` and
            // `envp` are the null-terminated C strings and arrays built
            // above, which its copy of memory still holds.
            Ok(nix::unistd::ForkResult::Child) => unsafe {
                guard_child(read_fd, null_fd, &exe, &argv_ptrs, &envp)
            },
            Ok(nix::unistd::ForkResult::Parent { child }) => {
                // The child does it too; either way its group is its own
                // before anything of the turn exists.
                let _ = nix::unistd::setpgid(child, child);
                Ok(Self {
                    pid: child,
                    arm: Some(write),
                })
            }
            Err(e) => Err(err("start the turn's guard", e.to_string())),
        }
    }

    /// Lets the guard go without it doing anything (the supervisor tore
    /// the turn down itself), and reaps it. Idempotent.
    pub fn disarm(&mut self) {
        if let Some(arm) = self.arm.take() {
            let _ = nix::unistd::write(&arm, &[DISARM]);
            drop(arm);
            while let Err(nix::errno::Errno::EINTR) =
                nix::sys::wait::waitpid(self.pid, Some(nix::sys::wait::WaitPidFlag::__WALL))
            {
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// The guard's side of the fork: its own process group, default signal
/// handling, fd 0 the pipe, 1 and 2 /dev/null, nothing else open (no copy
/// of the supervisor's session lock, pipes or sockets); waits; on EOF,
/// execs the cleanup.
///
/// # Safety
///
/// Called only in the child of a fork, with `exe`, `argv` (null-terminated)
/// and `envp` (null-terminated) valid C strings and arrays.
unsafe fn guard_child(
    read_fd: i32,
    null_fd: i32,
    exe: &std::ffi::CStr,
    argv: &[*const nix::libc::c_char],
    envp: &[*const nix::libc::c_char],
) -> ! {
    use nix::libc;
    // SAFETY: raw syscalls on descriptors and buffers valid in this
    // process (the caller's contract); none allocates.
    unsafe {
        libc::setpgid(0, 0);
        // Named for `ps` (its argv is still the supervisor's until exec).
        libc::prctl(libc::PR_SET_NAME, GUARD_COMM.as_ptr());
        // The supervisor's SIGTERM/SIGINT/SIGHUP handler is not ours.
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaction(sig, &default, std::ptr::null_mut());
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        if libc::dup2(read_fd, 0) < 0 || libc::dup2(null_fd, 1) < 0 || libc::dup2(null_fd, 2) < 0 {
            libc::_exit(1);
        }
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            for fd in 3..65536 {
                libc::close(fd);
            }
        }
        let mut byte = 0u8;
        loop {
            match libc::read(0, (&raw mut byte).cast(), 1) {
                1 if byte == DISARM => libc::_exit(0),
                0 => break,
                n if n < 0 && *libc::__errno_location() != libc::EINTR => break,
                _ => {}
            }
        }
        libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
        libc::_exit(127)
    }
}

/// Entry point of `supervise __turn-guard RUNTIME ID TURN_DIR CGROUP_ROOT BASE`
/// (see [`Guard`]). Never returns.
pub fn guard_main(args: &[OsString]) -> ! {
    let [runtime, id, turn_dir, cgroup_root, base] = args else {
        std::process::exit(2)
    };
    // Where the supervisor that started this guard made its turns' cgroups.
    let mut place = Place::new(PathBuf::from(cgroup_root));
    if base.as_os_str() != "turnstile" {
        place = place.under(PathBuf::from(base));
    }
    let (Some(runtime), Some(id)) = (runtime.to_str(), id.to_str()) else {
        std::process::exit(2)
    };
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(std::io::stdin(), &mut byte) {
            Ok(1) if byte[0] == DISARM => std::process::exit(0),
            Ok(0) => break,
            Err(nix::errno::Errno::EINTR) | Ok(_) => {}
            // The pipe is unreadable: the supervisor cannot be told from
            // here; fail closed (what follows is idempotent).
            Err(_) => break,
        }
    }
    let turn_dir = Path::new(turn_dir);
    let Some(_lock) = session_lock(turn_dir) else {
        std::process::exit(0)
    };
    end_dead_turn(runtime, id, turn_dir, &place);
    std::process::exit(0)
}

/// The session lock of `turn_dir` (`<session state>/lock`), taken without
/// blocking: `None` when a later writer holds it (that writer recovered
/// the session under it). The dead supervisor's descriptors close in the
/// same exit as its end of the pipe: a moment's retry covers that.
fn session_lock(turn_dir: &Path) -> Option<Option<nix::fcntl::Flock<std::fs::File>>> {
    use nix::fcntl::{Flock, FlockArg};
    use std::os::unix::fs::OpenOptionsExt;
    let path = turn_dir.parent()?.join("lock");
    let Ok(mut file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&path)
    else {
        // No session lock: nothing can race us for this turn.
        return Some(None);
    };
    let deadline = Instant::now() + Duration::from_millis(500);
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Some(Some(lock)),
            Err((f, nix::errno::Errno::EWOULDBLOCK | nix::errno::Errno::EINTR))
                if Instant::now() < deadline =>
            {
                file = f;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => return None,
        }
    }
}

/// Waits up to `limit` until no `runtime` process (its argv[0] ends with
/// the runtime's name; the container's own processes, `runsc-sandbox` and
/// the like, do not) names container `id` in its arguments.
fn wait_runtime_gone(runtime: &str, id: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    let running = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                    let mut args = c.split(|b| *b == 0);
                    args.next()
                        .is_some_and(|a0| a0.ends_with(runtime.as_bytes()))
                        && args.any(|a| a == id.as_bytes())
                })
            })
    };
    while running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What is left of OCI turn `id` whose supervisor is dead, removed:
/// the runtime's record (`delete --force`, which also kills the
/// container; runsc's needs its gofer alive, so it goes before the
/// cgroup's kill), every process in the turn's cgroup, its directories
/// in every hierarchy, and every mount at or under `turn_dir`, then the
/// directory. The caller holds the session lock. Idempotent.
pub fn end_dead_turn(runtime: &str, id: &str, turn_dir: &Path, cgroup_place: &Place) {
    use crate::sandbox::cgroup::TurnCgroup;
    // A runtime still creating the container when its supervisor died
    // (`crun run --detach`, `runsc create`: host processes, not in the
    // turn's cgroup) writes its record after a delete that came first:
    // wait for it (bounded), and delete again once the cgroup is empty.
    wait_runtime_gone(runtime, id, Duration::from_secs(5));
    super::runtime::forget(id);
    for cg in TurnCgroup::leftovers(cgroup_place, id)
        .into_iter()
        .filter(|cg| cg.name() == Some(id))
    {
        cg.kill_all();
        cg.remove();
    }
    super::runtime::forget(id);
    TurnCgroup::sweep_unmanaged(cgroup_place, id);
    let _ = crate::sandbox::remove_turn_dir(turn_dir);
}
