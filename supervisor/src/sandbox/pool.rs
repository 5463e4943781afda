//! Warm sandboxes (`supervise serve`): a session's worker, after a turn,
//! builds the sandbox of the session's next turn from the shape of the
//! last Plan ([`Plan::shape`]: cgroup, namespaces, the new root with every
//! mount), parks its PID 1 before the command, and has the command's stage
//! restrict itself as the last turn's did (Landlock, seccomp; its posture
//! checked from outside: [`Parked::restrict_ahead`]). The next turn takes
//! it when the Plan compiled for it has exactly that shape and those
//! restrictions (the same execute rules and working directory, no stdin)
//! and sends it only its command and environment; otherwise the warm
//! sandbox is discarded and the turn builds its own (cold), as `supervise
//! run` always does. The Plan is compiled for every turn from the manifest
//! and the workspace as they are then, so a manifest or workspace change
//! that changes the view changes the shape.
//!
//! One warm sandbox per pool, one pool per worker (a worker serves one
//! session; the pool is the worker's, handed to the native backend). It
//! lives in the session's state directory as `warm-<id>` (its turn
//! directory), `warm-<id>.lock` (locked by the owner for as long as the
//! sandbox exists) and the cgroup `<session>-w<id>`; its init dies with the
//! owner (PDEATHSIG), and recovery removes what a dead owner left (any of
//! the three whose lock is not held): [`crate::recover`].

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use nix::fcntl::{Flock, FlockArg};
use turnstile_policy::plan::Plan;

use super::{Parked, TurnDir};
use crate::error::{Result, SupervisorError};
use crate::sandbox::cgroup::Place;

/// Names of a warm sandbox's turn directory and lock file start so.
pub const WARM_PREFIX: &str = "warm-";

/// The cgroup of warm sandbox `id` of session `sid`.
pub fn cgroup_name(sid: &str, id: &str) -> String {
    format!("{sid}-w{id}")
}

/// The lock file of warm sandbox `id` in `session_dir`.
pub fn lock_path(session_dir: &Path, id: &str) -> PathBuf {
    session_dir.join(format!("{WARM_PREFIX}{id}.lock"))
}

/// A warm sandbox: parked, in its own turn directory.
#[derive(Debug)]
pub struct Warm {
    // Dropped in this order: the processes first, then their mounts.
    parked: Parked,
    dir: TurnDir,
    cgroup: String,
}

impl Warm {
    /// (turn directory, the parked sandbox, its cgroup's name).
    pub fn into_parts(self) -> (TurnDir, Parked, String) {
        (self.dir, self.parked, self.cgroup)
    }
}

#[derive(Debug)]
struct Last {
    plan: Arc<Plan>,
    session_dir: PathBuf,
    cgroup_place: Place,
}

#[derive(Debug)]
enum Slot {
    Empty,
    /// The pool thread is building one.
    Building,
    Ready(Box<Warm>),
}

#[derive(Debug)]
struct Pool {
    /// Shared with the builder (not copied: a Plan is hundreds of
    /// strings).
    last: Option<Arc<Last>>,
    slot: Slot,
    made: u64,
    /// The last turn committed: its successor's sandbox is due once the
    /// reply is delivered ([`WarmPool::build_armed`]).
    armed: bool,
    /// The cgroup of the sandbox being built (with `Slot::Building`): what
    /// [`Shared::settled`] kills when a build does not end in time.
    building: Option<(Place, String)>,
}

/// How long a turn waits for its warm sandbox's build (a few milliseconds,
/// normally): a build whose PID 1 or stage was stopped (SIGSTOP, a ptrace
/// stop) waits on its pipe for ever. Past this, the build's processes are
/// killed, which ends it, and the turn builds its own.
const BUILD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What the pool's owner and its builder thread share.
#[derive(Debug)]
struct Shared {
    pool: Mutex<Pool>,
    built: Condvar,
    /// Turn directories being removed (see [`WarmPool::after_turn`]).
    cleanups: Mutex<Vec<crate::syncpool::Task<()>>>,
}

impl Shared {
    fn pool(&self) -> MutexGuard<'_, Pool> {
        self.pool
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits while the builder builds; returns the guard. A build still
    /// going after [`BUILD_WAIT`] is ended: its cgroup's processes are
    /// killed (a stopped one too), so the builder's reads see them gone
    /// and it gives up (its sandbox is torn down as it drops).
    fn settled(&self) -> MutexGuard<'_, Pool> {
        let deadline = std::time::Instant::now() + BUILD_WAIT;
        let mut killed = false;
        let mut p = self.pool();
        while matches!(p.slot, Slot::Building) {
            let now = std::time::Instant::now();
            if killed {
                // After the kill the builder ends promptly (its pipes
                // close); it is waited for as before.
                p = self
                    .built
                    .wait(p)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            if now < deadline {
                p = self
                    .built
                    .wait_timeout(p, deadline - now)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
                continue;
            }
            killed = true;
            let building = p.building.clone();
            drop(p);
            if let Some((place, name)) = building {
                tracing::warn!(cgroup = %name, "a warm sandbox's build did not end in {BUILD_WAIT:?} (a process of it stopped?): killing it; the turn builds its own");
                for cg in super::cgroup::TurnCgroup::leftovers(&place, &name)
                    .into_iter()
                    .filter(|cg| cg.name() == Some(name.as_str()))
                {
                    cg.kill_in_every_hierarchy();
                }
            }
            p = self.pool();
        }
        p
    }
}

/// One process's warm pool (a `serve` worker's; `supervise run` has none:
/// nothing would take what it built). Owned by the worker and handed to
/// the native backend for each turn; dropping it stops the builder thread.
#[derive(Debug)]
pub struct WarmPool {
    shared: Arc<Shared>,
    /// The builder thread's queue.
    builder: std::sync::mpsc::Sender<Arc<Last>>,
}

impl WarmPool {
    /// Starts the builder thread. A sandbox's init dies with the thread
    /// that started it, so that thread lives as long as the pool.
    pub fn start() -> Result<Self> {
        let shared = Arc::new(Shared {
            pool: Mutex::new(Pool {
                last: None,
                slot: Slot::Empty,
                made: 0,
                armed: false,
                building: None,
            }),
            built: Condvar::new(),
            cleanups: Mutex::new(Vec::new()),
        });
        let (tx, rx) = std::sync::mpsc::channel::<Arc<Last>>();
        let theirs = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("warm-pool".into())
            .spawn(move || {
                for last in rx {
                    let built = build(&theirs, &last);
                    let mut p = theirs.pool();
                    p.building = None;
                    p.slot = match built {
                        Ok(w) => Slot::Ready(Box::new(w)),
                        Err(e) => {
                            tracing::warn!(error = %e, "could not build a warm sandbox; the next turn builds its own");
                            Slot::Empty
                        }
                    };
                    theirs.built.notify_all();
                }
            })
            .map_err(|e| SupervisorError::Sandbox {
                step: "start the warm pool",
                detail: e.to_string(),
                source: Some(e),
            })?;
        Ok(Self {
            shared,
            builder: tx,
        })
    }

    /// The warm sandbox, when it was built from exactly `plan`'s shape (the
    /// same session, mounts, limits…), every host path it shows is still
    /// the file or directory it was built with, its PID 1 is parked, and
    /// its PID 1 and command stage are still alive and not stopped (either
    /// may be signalled between turns); anything else is discarded (killed,
    /// unmounted, removed) and the turn builds cold.
    pub fn take(&self, plan: &Plan) -> Option<Warm> {
        let slot = std::mem::replace(&mut self.shared.settled().slot, Slot::Empty);
        let Slot::Ready(mut warm) = slot else {
            return None;
        };
        if !plan.same_shape(warm.parked.built()) {
            tracing::debug!("warm sandbox discarded: the turn's plan has another shape");
            return None;
        }
        if warm.parked.sources_changed() {
            tracing::debug!(
                "warm sandbox discarded: a path it shows was replaced since it was built"
            );
            return None;
        }
        if !warm.parked.parked() {
            tracing::warn!("warm sandbox discarded: its init ended before it was parked");
            return None;
        }
        // Killed or stopped while it waited (it is discarded whole, as it
        // drops: its processes killed, its cgroups and mounts removed).
        if let Some(why) = warm.parked.broken() {
            tracing::warn!(reason = %why, "warm sandbox discarded: its processes are not all alive and runnable");
            return None;
        }
        if !warm.parked.fits(plan) {
            tracing::debug!(
                "warm sandbox discarded: its stage holds other restrictions than the turn's"
            );
            return None;
        }
        Some(*warm)
    }

    /// Whether a warm sandbox is waiting or being built.
    pub fn is_warm(&self) -> bool {
        !matches!(self.shared.pool().slot, Slot::Empty)
    }

    /// Arms the build of the warm sandbox for the session's next turn,
    /// from the shape of `plan`, the turn's: call once the turn's commit
    /// is done (the sandbox shows the workspace as the next turn will find
    /// it). `session_dir` is the session's state directory. The build
    /// starts at [`WarmPool::build_armed`], once the daemon has delivered
    /// the turn's reply.
    pub fn refill(&self, plan: &Arc<Plan>, session_dir: &Path, cgroup_place: &Place) {
        let mut p = self.shared.pool();
        p.last = Some(Arc::new(Last {
            plan: Arc::clone(plan),
            session_dir: session_dir.to_path_buf(),
            cgroup_place: cgroup_place.clone(),
        }));
        p.armed = true;
    }

    /// Builds the armed warm sandbox, if one is armed and none is waiting
    /// (the daemon delivered the last turn's reply: see
    /// `serve::worker::DELIVERED`).
    pub fn build_armed(&self) {
        let mut p = self.shared.pool();
        if !std::mem::take(&mut p.armed) || !matches!(p.slot, Slot::Empty) {
            return;
        }
        let Some(last) = p.last.clone() else {
            return;
        };
        if self.builder.send(last).is_ok() {
            p.slot = Slot::Building;
        }
    }

    /// A finished turn's directory removal, joined by [`WarmPool::settle`]
    /// once the reply is sent, so the client does not wait for the
    /// unmounts.
    pub fn after_turn(&self, cleanup: crate::syncpool::Task<()>) {
        self.shared
            .cleanups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(cleanup);
    }

    /// Joins the turn directory removals [`WarmPool::after_turn`] deferred.
    pub fn settle(&self) {
        let all: Vec<_> = self
            .shared
            .cleanups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
            .collect();
        for c in all {
            let _ = c.join();
        }
    }

    /// Discards the warm sandbox, if any (the worker is going away).
    pub fn drain(&self) {
        self.settle();
        let slot = std::mem::replace(&mut self.shared.settled().slot, Slot::Empty);
        drop(slot);
    }
}

/// Builds a warm sandbox in the session's state directory: its lock file
/// first (created already locked: an O_TMPFILE file linked into place, so
/// no recovery ever sees it unlocked while its owner lives), then the turn
/// directory and the parked sandbox.
fn build(shared: &Shared, last: &Last) -> Result<Warm> {
    let id = {
        let mut p = shared.pool();
        p.made += 1;
        let id = format!("{}-{}", std::process::id(), p.made);
        p.building = Some((
            last.cgroup_place.clone(),
            cgroup_name(&last.plan.session_id, &id),
        ));
        id
    };
    let lock_file = lock_path(&last.session_dir, &id);
    let io = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source: std::io::Error| SupervisorError::StateIo { op, path, source }
    };
    let file = OpenOptions::new()
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_TMPFILE | nix::libc::O_CLOEXEC)
        .open(&last.session_dir)
        .map_err(io("create a warm sandbox's lock", &last.session_dir))?;
    let file = lock_exclusive(file, &lock_file)?;
    let fd_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&*file));
    nix::unistd::linkat(
        nix::fcntl::AT_FDCWD,
        fd_path.as_str(),
        nix::fcntl::AT_FDCWD,
        &lock_file,
        nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
    )
    .map_err(|e| io("link a warm sandbox's lock", &lock_file)(e.into()))?;
    let mut dir = match TurnDir::create(
        last.session_dir.join(format!("{WARM_PREFIX}{id}")),
        &last.plan,
    ) {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_file(&lock_file);
            return Err(e);
        }
    };
    dir.hold(lock_file, file);
    let cgroup = cgroup_name(&last.plan.session_id, &id);
    let mut parked = super::park(&last.plan, &dir, &last.cgroup_place, &cgroup, None)?;
    // Its command stage restricted now, as its last turn's was: the next
    // turn with those restrictions only sends its command.
    parked.restrict_ahead()?;
    Ok(Warm {
        parked,
        dir,
        cgroup,
    })
}

fn lock_exclusive(file: File, path: &Path) -> Result<Flock<File>> {
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        SupervisorError::StateIo {
            op: "lock a warm sandbox",
            path: path.to_path_buf(),
            source: errno.into(),
        }
    })
}

/// Whether the owner of warm sandbox `id` is alive (holds its lock). When
/// it is not, the lock comes back held, so nobody else sweeps it meanwhile.
///
/// A worker dies with its daemon (PDEATHSIG), but a moment later: it
/// holds the lock until its exit has unmapped its memory and closed its
/// files. A daemon restarted at once (`Restart=always`) would take it for
/// a live worker's and leave its sandbox to the session's next turn. So a
/// held lock whose owner is orphaned — its parent is no longer a
/// `supervise serve` — is waited for, [`ORPHAN_EXIT_WAIT`] at most.
pub(crate) fn owner_alive(session_dir: &Path, id: &str) -> (bool, Option<Flock<File>>) {
    let Ok(mut file) = File::open(lock_path(session_dir, id)) else {
        return (false, None);
    };
    let mut deadline = None;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(f) => return (false, Some(f)),
            Err((back, nix::errno::Errno::EWOULDBLOCK)) => {
                let waited = *deadline.get_or_insert_with(|| {
                    owner_pid(id)
                        .filter(|pid| orphaned(Path::new("/proc"), *pid))
                        .map(|_| std::time::Instant::now() + ORPHAN_EXIT_WAIT)
                });
                match waited {
                    Some(until) if std::time::Instant::now() < until => {
                        file = back;
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    _ => return (true, None),
                }
            }
            Err(_) => return (false, None),
        }
    }
}

/// How long [`owner_alive`] waits for an orphaned worker's exit.
const ORPHAN_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The pid in a warm sandbox's id (`<pid>-<n>`, see `build`).
fn owner_pid(id: &str) -> Option<i32> {
    id.split_once('-')?.0.parse().ok()
}

/// Whether `pid` (under `proc`) is alive but no longer the child of a
/// `supervise serve`: a worker whose daemon died (it is on its way out).
fn orphaned(proc: &Path, pid: i32) -> bool {
    let Some(ppid) = super::posture::parent_of(proc, pid) else {
        return false;
    };
    let cmdline = std::fs::read(proc.join(ppid.to_string()).join("cmdline")).unwrap_or_default();
    !cmdline
        .split(|b| *b == 0)
        .skip(1)
        .any(|a| a == b"serve".as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker is orphaned once its parent is no longer a `supervise
    /// serve` (its daemon died: init, or a subreaper, took it); a missing
    /// process is not (its lock is free, or it is not ours).
    #[test]
    fn issue_29_a_worker_whose_daemon_died_is_orphaned() {
        let proc = tempfile::tempdir().unwrap();
        let put = |pid: u32, stat_ppid: Option<u32>, cmdline: &[u8]| {
            let d = proc.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            if let Some(pp) = stat_ppid {
                std::fs::write(d.join("stat"), format!("{pid} (exe (x) y) S {pp} 1 1 0")).unwrap();
            }
            std::fs::write(d.join("cmdline"), cmdline).unwrap();
        };
        put(10, None, b"/x/supervise\0serve\0--state-dir\0/s\0");
        put(11, Some(10), b"/proc/self/exe\0__serve-worker\0");
        put(1, None, b"/sbin/init\0");
        put(12, Some(1), b"/proc/self/exe\0__serve-worker\0");
        put(21, None, b"/x/supervise\0--log-format\0json\0serve\0");
        put(14, Some(21), b"/proc/self/exe\0__serve-worker\0");
        assert!(!orphaned(proc.path(), 11), "its daemon lives");
        assert!(orphaned(proc.path(), 12), "init took it");
        assert!(!orphaned(proc.path(), 14), "a daemon with options first");
        assert!(!orphaned(proc.path(), 99), "no such process");
        assert_eq!(owner_pid("4242-7"), Some(4242));
        assert_eq!(owner_pid("junk"), None);
    }
}
