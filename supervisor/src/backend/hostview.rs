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
/// argv[0] of the guard's cleanup stage.
const GUARD_NAME: &str = "turnstile-guard";
// What the supervisor writes before it lets its guard go: the turn was
// torn down by the supervisor itself.
use turnstile_init::guard::DISARM;

/// A turn's guard: a process that ends an OCI turn whose supervisor died
/// — SIGKILL included, which no handler and no drop sees.
///
/// A runc, crun or runsc container outlives its supervisor: its processes
/// descend from the runtime, so a parent-death signal set where we spawn
/// the runtime fires when `run --detach` or `create` exits, not when we do;
/// and its runtime record, cgroup directories and the turn's mounts are
/// host state that no process death removes.
///
/// The guard holds only the read end of a pipe (as fd 0; 1 and 2 are
/// /dev/null, every other descriptor is closed) whose write end only the
/// supervisor holds (close-on-exec, so no runtime and no container
/// inherits it), and blocks reading it ([`turnstile_init::guard`]).
/// [`DISARM`] (the supervisor tore the turn down itself) ends it; EOF
/// without it means the supervisor's last descriptor table is gone, and it
/// execs this binary as `supervise __turn-guard RUNTIME ID TURN_DIR
/// CGROUP_ROOT BASE` ([`guard_main`]), which takes the session lock
/// (without waiting for it: a holder is a later writer, and every writer
/// recovers the session first, under that lock) and does what recovery
/// would: the runtime's `delete --force`, the cgroup's kill and removal in
/// every hierarchy, the turn's mounts and directory. The turn's finish
/// entries stay recovery's (they need the ledgers' writer).
///
/// Why the waiting stage is `turnstile-init`, started by `posix_spawn`: a
/// fresh `supervise` per turn cost ~1.3 ms of CPU (its loader and
/// relocations), and a forked child that waits keeps the supervisor's
/// memory shared for the whole turn, so every page the supervisor writes
/// after the fork is copied, each copy a fault and a TLB shootdown of its
/// other threads (5 % of the supervisor's samples in a runc turn's perf
/// profile). The static init starts in ~0.2 ms and shares nothing. Where
/// no `turnstile-init` is beside `supervise`, `supervise` waits instead
/// (it runs the same mode).
///
/// The guard is in its own process group (a SIGKILL to the supervisor's
/// group spares it) and ignores SIGHUP (what the kernel sends that group,
/// with SIGCONT, when the supervisor dies while the guard is stopped),
/// outside the turn's cgroup and namespaces, as root on
/// the host side: the turn (uid 65534, its own PID namespace, no
/// capabilities) cannot see, signal or write to it, and it reads nothing
/// but the pipe and the host's own records.
#[derive(Debug)]
pub struct Guard {
    pid: nix::unistd::Pid,
    /// The write end: dropping it without [`DISARM`] fires the guard.
    arm: Option<OwnedFd>,
    /// Where the guard says it is waiting ([`Guard::confirm`]).
    ready: Option<OwnedFd>,
}

impl Guard {
    /// Starts the guard of container `id` (`runtime`) whose turn directory
    /// is `turn_dir` and cgroup `<cgroup_place>/…/turnstile/<id>`.
    pub fn spawn(runtime: &str, id: &str, turn_dir: &Path, cgroup_place: &Place) -> Result<Self> {
        use std::os::unix::process::CommandExt;
        let fail = |e: std::io::Error| err("start the turn's guard", e.to_string());
        // The cleanup stage runs this binary, by the path it was started
        // from (`/proc/self/exe` is gone with this process).
        let supervise = std::env::current_exe().map_err(fail)?;
        let waiter = crate::sandbox::initbin::path().map_err(fail)?;
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| err("guard pipe", e.to_string()))?;
        let (ready, said) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| err("guard pipe", e.to_string()))?;
        let child = std::process::Command::new(&waiter)
            .arg0(GUARD_NAME)
            .arg(turnstile_init::guard::GUARD_WAIT)
            .arg(&supervise)
            .arg(GUARD_NAME)
            .arg(GUARD)
            .args([runtime, id])
            .arg(turn_dir)
            .arg(&cgroup_place.root)
            .arg(cgroup_place.base())
            .env_clear()
            .env(
                crate::sandbox::initbin::BUILD_ENV,
                crate::sandbox::initbin::BUILD_ID,
            )
            .stdin(std::process::Stdio::from(read))
            .stdout(std::process::Stdio::from(said))
            .stderr(std::process::Stdio::null())
            // Its own group before it runs (a SIGKILL to ours spares it).
            .process_group(0)
            .spawn()
            .map_err(fail)?;
        Ok(Self {
            pid: nix::unistd::Pid::from_raw(child.id() as i32),
            arm: Some(write),
            ready: Some(ready),
        })
    }

    /// Fails unless the guard said it is waiting (an init of another build,
    /// or one that died, never does): called before the runtime starts the
    /// container, so no turn runs unguarded. By then the guard has long
    /// said it; this read does not wait in practice.
    pub fn confirm(&mut self) -> Result<()> {
        let Some(ready) = self.ready.take() else {
            return Ok(());
        };
        let mut byte = [0u8; 1];
        loop {
            match nix::unistd::read(&ready, &mut byte) {
                Ok(1) if byte[0] == turnstile_init::guard::READY => return Ok(()),
                Err(nix::errno::Errno::EINTR) => {}
                _ => {
                    return Err(err(
                        "start the turn's guard",
                        "the guard never said it was waiting (is turnstile-init beside supervise from another build? `cargo xtask build` rebuilds both)",
                    ));
                }
            }
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
    // Started only once the waiting stage (turnstile_init::guard) saw its
    // supervisor gone: nothing is left to wait for.
    let turn_dir = Path::new(turn_dir);
    let Some(lock) = session_lock(turn_dir) else {
        std::process::exit(0)
    };
    if !end_dead_turn(runtime, id, turn_dir, &place) {
        // The runtime was still creating the container after 5 s (`runsc
        // create` on a loaded host, once in CI): its record lands after the
        // deletes. Without holding the session (its next writer would wait
        // for this), wait for it, bounded, then end the turn again unless a
        // writer has the session now (and recovers it).
        drop(lock);
        if wait_runtime_gone(runtime, id, Duration::from_secs(120)) {
            if let Some(_lock) = session_lock(turn_dir) {
                end_dead_turn(runtime, id, turn_dir, &place);
            }
        }
    }
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
        .write(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&path)
    else {
        // No session lock: nothing can race us for this turn.
        return Some(None);
    };
    let deadline = Instant::now() + Duration::from_millis(500);
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                // A holder like any other: the next finds another's stamp.
                crate::store::lock::Stamp::renew(&lock);
                return Some(Some(lock));
            }
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
/// the like, do not) names container `id` in its arguments; whether none
/// does.
fn wait_runtime_gone(runtime: &str, id: &str, limit: Duration) -> bool {
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
    loop {
        if !running() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What is left of OCI turn `id` whose supervisor is dead, removed:
/// the runtime's record (`delete --force`, which also kills the
/// container; runsc's needs its gofer alive, so it goes before the
/// cgroup's kill), every process in the turn's cgroup, its directories
/// in every hierarchy, and every mount at or under `turn_dir`, then the
/// directory. The caller holds the session lock. Idempotent. Returns
/// whether the runtime had let go of the container by then (`false`: a
/// runtime still creating it may write its record after the delete).
pub fn end_dead_turn(runtime: &str, id: &str, turn_dir: &Path, cgroup_place: &Place) -> bool {
    use crate::sandbox::cgroup::TurnCgroup;
    // A runtime still creating the container when its supervisor died
    // (`crun run --detach`, `runsc create`: host processes, not in the
    // turn's cgroup) writes its record after a delete that came first:
    // wait for it (bounded), and delete again once the cgroup is empty.
    let gone = wait_runtime_gone(runtime, id, Duration::from_secs(5));
    // A cgroup its dying supervisor froze stays frozen, and runsc's
    // delete waits for ever on a frozen sandbox: thaw first.
    let leftovers: Vec<TurnCgroup> = TurnCgroup::leftovers(cgroup_place, id)
        .into_iter()
        .filter(|cg| cg.name() == Some(id))
        .collect();
    for cg in &leftovers {
        cg.thaw_if_frozen();
    }
    super::runtime::forget(id);
    for cg in leftovers {
        cg.kill_all();
        cg.remove();
    }
    super::runtime::forget(id);
    TurnCgroup::sweep_unmanaged(cgroup_place, id);
    let _ = crate::sandbox::remove_turn_dir(turn_dir);
    gone
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// The guard's wait for a runtime still creating a container says
    /// whether it ended within the limit: a `false` sends the guard into
    /// its longer wait and second delete (a runtime's record written after
    /// the first).
    #[test]
    fn issue_25_the_guard_tells_a_runtime_still_running_from_one_gone() {
        let id = format!("TURN-{}-t1", std::process::id());
        // It lives until killed (a short sleep could end before a loaded
        // host's first scan of /proc, as it once did in CI): the shell waits
        // in its own `read`, no child of its own left behind.
        let mut runtime = std::process::Command::new("/bin/sh")
            .arg0("/usr/local/bin/fake-rt")
            .args(["-c", "read line", "create", &id])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Until its execve, the child's command line is this test's: wait
        // for the runtime's own (as a runtime is found running).
        let cmdline = format!("/proc/{}/cmdline", runtime.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read(&cmdline).is_ok_and(|c| c.starts_with(b"/usr/local/bin/fake-rt\0")) {
            assert!(Instant::now() < deadline, "the fake runtime never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!wait_runtime_gone(
            "fake-rt",
            &id,
            Duration::from_millis(100)
        ));
        // Another container's id, or another runtime's name, is not it.
        assert!(wait_runtime_gone(
            "fake-rt",
            "TURN-other-t1",
            Duration::ZERO
        ));
        assert!(wait_runtime_gone("runsc", &id, Duration::ZERO));
        runtime.kill().unwrap();
        runtime.wait().unwrap();
        assert!(wait_runtime_gone("fake-rt", &id, Duration::from_secs(10)));
    }
}
