//! The native backend, supervisor side (S0): prepares a turn's directory,
//! cgroup and seccomp program, starts `supervise __sandbox-init` inside the
//! turn's namespaces, streams the command's output, enforces the timeout and
//! tears everything down so that nothing of the turn is left running.

pub mod cgroup;
// What runs inside the sandbox, a crate of its own (its binary is the
// sandbox's init): re-exported under the paths the supervisor has always
// used.
pub use turnstile_init::{
    init, landlock, landlock_exec, mountplan, protocol, restrict, sys, turnpaths,
};
pub mod egress;
pub mod initbin;
pub mod notify;
pub mod observe;
pub mod pool;
pub mod posture;
pub mod seccomp;
pub mod spawn;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::CloneFlags;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use turnstile_policy::plan::Plan;

use crate::error::{Result, SupervisorError};
use protocol::InitEvent;

/// Grace period between SIGTERM and SIGKILL on timeout.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// Namespaces a turn gets (user namespaces only when rootless, later).
pub const NAMESPACES: [(&str, CloneFlags); 6] = [
    ("mount", CloneFlags::CLONE_NEWNS),
    ("pid", CloneFlags::CLONE_NEWPID),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("net", CloneFlags::CLONE_NEWNET),
    ("cgroup", CloneFlags::CLONE_NEWCGROUP),
];

pub(crate) fn sandbox_err(step: &'static str, detail: impl Into<String>) -> SupervisorError {
    SupervisorError::Sandbox {
        step,
        detail: detail.into(),
        source: None,
    }
}

/// Standard input for a turn, and for every runtime that starts one: an
/// empty pipe (a read ends at once, as from `/dev/null`), never a host
/// device node. runsc and crun `fchown` their stdio to the container user
/// (a host `/dev/null` given to them ended up owned by 65534), and a
/// descriptor of a host inode would let the turn `fchmod` it (issue 22).
pub fn empty_stdin() -> Result<Stdio> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| sandbox_err("stdin pipe", e.to_string()))?;
    drop(w);
    Ok(Stdio::from(r))
}

fn sandbox_io(step: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SupervisorError {
    let detail = path.display().to_string();
    move |source| SupervisorError::Sandbox {
        step,
        detail,
        source: Some(source),
    }
}

/// How the command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signaled {
        signal: i32,
        name: String,
    },
    /// Setup failed before the command ran (fail closed).
    SetupFailed {
        stage: String,
        detail: String,
    },
    /// The sandbox was built but execve failed.
    ExecFailed {
        errno: Option<i32>,
        error: String,
    },
}

/// One output stream of the command, as recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamRecord {
    pub bytes: u64,
    pub forwarded: u64,
    pub sha256: String,
    /// What was forwarded, when the stream was captured rather than
    /// forwarded (a receive turn's stdout: its envelopes).
    pub captured: Option<Vec<u8>>,
}

/// What running the command produced.
#[derive(Debug)]
pub struct Execution {
    pub ending: Ending,
    pub timed_out: bool,
    pub usage: cgroup::Usage,
    pub cgroup_version: cgroup::Version,
    pub landlock: Option<Value>,
    pub report: Vec<InitEvent>,
    pub stdout: StreamRecord,
    pub stderr: StreamRecord,
    pub output_truncated: bool,
    pub disk_full: bool,
    /// The posture check of the command's process, when it got that far.
    pub posture: Option<posture::Posture>,
    /// Where the sandbox's time went: (phase, microseconds).
    pub phases: Vec<(&'static str, u64)>,
    pub seccomp_unknown: Vec<String>,
    pub wall: Duration,
    /// Upper dirs, in scope order.
    pub uppers: Vec<PathBuf>,
    /// What the command left in its private `/dev/shm` and ephemeral tmpfs
    /// mounts, by directory (discarded).
    pub ephemeral: serde_json::Map<String, Value>,
    /// The syscalls seccomp denied, or why they could not be observed.
    pub denials: std::result::Result<notify::Denials, String>,
    /// The path operations the kernel refused (Landlock, the view), from
    /// the BPF observer, or why they could not be observed.
    pub observed: std::result::Result<observe::Observed, String>,
    /// What this backend could not do as the native one does (recorded in
    /// the evidence's `enforcement.degraded`).
    pub degraded: Vec<String>,
    /// The sandbox was built before the turn (a warm one from the pool),
    /// not for it.
    pub warm: bool,
    /// What a `restricted` or `allow_egress` turn's network saw (`None`:
    /// `isolated`).
    pub egress: Option<egress::Report>,
    /// What is left to release once the command and every process of the
    /// turn are gone (see [`Deferred`]).
    pub teardown: Deferred,
}

/// The rest of a sandbox's teardown, once every process of the turn is
/// gone and everything the turn reports was read: removing the (empty)
/// cgroups, an OCI runtime's record and the host view, letting the guard
/// go. Nothing of it is part of the turn's outcome, so the turn hands it
/// to its directory ([`TurnDir::defer`]), which runs it on the background
/// thread that removes the directory — beside the finish entries' syncs,
/// not before them — and always before the directory goes. Dropped
/// anywhere else, it runs there and then: it never goes undone.
#[derive(Default)]
pub struct Deferred(Option<Box<dyn FnOnce() + Send>>);

impl Deferred {
    pub fn new(f: impl FnOnce() + Send + 'static) -> Self {
        Self(Some(Box::new(f)))
    }

    /// Runs it now (once).
    pub fn run(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        self.run();
    }
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Deferred(pending)"
        } else {
            "Deferred(done)"
        })
    }
}

/// A turn's private directory in the state dir; its scratch tmpfs holds the
/// overlay upper and work dirs.
#[derive(Debug)]
pub struct TurnDir {
    pub path: PathBuf,
    dir_mounted: bool,
    scratch_mounted: bool,
    /// A warm sandbox's lock file (see [`pool`]), held while the directory
    /// exists and removed with it.
    hold: Option<(PathBuf, nix::fcntl::Flock<std::fs::File>)>,
    /// The sandbox's mount namespace, held so that its last process exits
    /// without tearing it down (unmounting a few hundred mounts and
    /// waiting for an RCU grace period: ~2 ms measured, in the turn's
    /// path); it goes with the directory, on the background thread.
    mount_ns: std::sync::Mutex<Option<std::os::fd::OwnedFd>>,
    /// The sandbox's teardown left for after the turn ([`Deferred`]): run
    /// first when the directory goes, since it may unmount what is in it.
    teardown: std::sync::Mutex<Deferred>,
}

impl TurnDir {
    /// Creates the directory, mounts the scratch tmpfs (size = disk limit,
    /// inodes = files limit: the kernel enforces both with ENOSPC) and the
    /// per-scope upper/work dirs.
    pub fn create(path: PathBuf, plan: &Plan) -> Result<Self> {
        // Overlay options name layers by /proc/self/fd/N natively, so the
        // workspace's path may hold any character; the OCI backends name the
        // turn dir's layers by path.
        let p = path.display().to_string();
        if p.contains([',', ':', '\\']) {
            return Err(sandbox_err(
                "prepare turn",
                format!("{p}: paths with `,`, `:` or `\\` cannot be overlay layers"),
            ));
        }
        std::fs::create_dir(&path).map_err(sandbox_io("create turn dir", &path))?;
        let mut dir = Self {
            path,
            dir_mounted: false,
            scratch_mounted: false,
            hold: None,
            mount_ns: std::sync::Mutex::new(None),
            teardown: std::sync::Mutex::new(Deferred::default()),
        };
        // The turn directory is scratch too (plan, seccomp program, report,
        // mount points): keep it in memory, off the disk's journal. Measured
        // under load: `prepare` 1.4 ms on disk.
        mount(
            Some("tmpfs"),
            &dir.path,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0700,size=4m,nr_inodes=1024"),
        )
        .map_err(|e| sandbox_err("mount turn tmpfs", format!("{}: {e}", dir.path.display())))?;
        dir.dir_mounted = true;
        for sub in [
            init::ROOT_DIR,
            init::SCRATCH_DIR,
            init::LOWER_DIR,
            init::EMPTY_DIR,
        ] {
            let p = dir.path.join(sub);
            std::fs::create_dir(&p).map_err(sandbox_io("create turn dir", &p))?;
        }
        let scratch = dir.path.join(init::SCRATCH_DIR);
        let options = format!(
            "mode=0700,size={},nr_inodes={}",
            plan.limits.disk_bytes,
            plan.limits.files + 16 + 2 * plan.writable_scopes.len() as u64
        );
        mount(
            Some("tmpfs"),
            &scratch,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(|e| sandbox_err("mount scratch tmpfs", format!("{}: {e}", scratch.display())))?;
        dir.scratch_mounted = true;
        for i in 0..plan.writable_scopes.len() {
            for kind in ["upper", "work"] {
                let p = scratch.join(kind).join(i.to_string());
                std::fs::create_dir_all(&p).map_err(sandbox_io("create overlay dir", &p))?;
            }
            // The merged root of an overlay takes the upper dir's owner and
            // mode: the turn's uid must be able to create files in its
            // writable scopes.
            let upper = scratch.join("upper").join(i.to_string());
            std::os::unix::fs::chown(&upper, Some(plan.uid), Some(plan.gid))
                .map_err(sandbox_io("chown overlay upper", &upper))?;
        }
        Ok(dir)
    }

    pub fn upper(&self, index: usize) -> PathBuf {
        self.path
            .join(init::SCRATCH_DIR)
            .join("upper")
            .join(index.to_string())
    }

    /// Whether the scratch tmpfs is (nearly) full: the turn hit `disk` or
    /// `files`.
    pub fn scratch_full(&self) -> bool {
        scratch_full(&self.path.join(init::SCRATCH_DIR))
    }
}

/// Unmounts everything at or below turn directory `dir` (deepest first) and
/// removes it: what recovery and an OCI turn's guard do with a dead
/// turn's directory.
pub fn remove_turn_dir(dir: &Path) -> Result<()> {
    use nix::mount::{MntFlags, umount2};
    let state_io = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| SupervisorError::StateIo { op, path, source }
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(state_io(
        "read mountinfo",
        Path::new("/proc/self/mountinfo"),
    ))?;
    let prefix = dir.to_string_lossy().into_owned();
    let mut points: Vec<String> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p == &prefix || p.starts_with(&format!("{prefix}/")))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        match umount2(Path::new(&p), MntFlags::MNT_DETACH) {
            // Gone meanwhile (its own turn's cleanup got there first).
            Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
            Err(e) => {
                return Err(SupervisorError::StateIo {
                    op: "unmount a dead turn's tmpfs",
                    path: PathBuf::from(&p),
                    source: e.into(),
                });
            }
        }
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(state_io("remove a dead turn's directory", dir)(e)),
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            if let Some(v) = raw
                .get(i + 1..i + 4)
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the scratch tmpfs at `scratch` is full (blocks or inodes): the
/// turn hit its `disk` or `files` limit. Every backend asks this.
pub fn scratch_full(scratch: &Path) -> bool {
    nix::sys::statvfs::statvfs(scratch)
        .map(|s| s.blocks_available() == 0 || s.files_available() == 0)
        .unwrap_or(false)
}

impl TurnDir {
    /// Unmounts the turn's tmpfs mounts and removes the directory on a
    /// background thread, so both overlap the turn's final (fsync-bound)
    /// ledger appends (unmounting waits for an RCU grace period: ~1-4 ms).
    /// Join the handle before exiting.
    /// Keeps `teardown` until the directory goes, and runs it then, first
    /// (a teardown already held runs now).
    pub fn defer(&self, teardown: Deferred) {
        let mut slot = self
            .teardown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let previous = std::mem::replace(&mut *slot, teardown);
        drop(slot);
        drop(previous);
    }

    pub fn remove_in_background(self) -> crate::syncpool::Task<()> {
        crate::syncpool::spawn(move || drop(self))
    }

    /// Keeps `lock` (a locked file at `path`) until the directory is gone,
    /// then removes it.
    pub(crate) fn hold(&mut self, path: PathBuf, lock: nix::fcntl::Flock<std::fs::File>) {
        self.hold = Some((path, lock));
    }

    fn unmount(&mut self) {
        if self.scratch_mounted {
            let _ = umount2(&self.path.join(init::SCRATCH_DIR), MntFlags::MNT_DETACH);
            self.scratch_mounted = false;
        }
        if self.dir_mounted {
            let _ = umount2(&self.path, MntFlags::MNT_DETACH);
            self.dir_mounted = false;
        }
    }
}

impl Drop for TurnDir {
    fn drop(&mut self) {
        // What the sandbox left to release (an OCI turn's host view is
        // mounted in this directory), then its mounts (they hold the
        // directory's).
        self.teardown
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .run();
        if let Ok(ns) = self.mount_ns.get_mut() {
            drop(ns.take());
        }
        self.unmount();
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
        release(self.hold.take());
    }
}

/// Removes a held lock file, then unlocks it (closing it).
fn release(hold: Option<(PathBuf, nix::fcntl::Flock<std::fs::File>)>) {
    if let Some((path, file)) = hold {
        let _ = std::fs::remove_file(&path);
        drop(file);
    }
}

/// Copies a child's stream to `sink`, forwarding at most the shared budget
/// and hashing what was forwarded; the rest is read and dropped so the
/// command never blocks on a full pipe.
pub(crate) fn pump(
    mut src: impl Read,
    mut sink: impl Write,
    budget: Arc<AtomicU64>,
    truncated: Arc<AtomicBool>,
) -> StreamRecord {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let (mut bytes, mut forwarded) = (0u64, 0u64);
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        bytes += n as u64;
        let allowed = budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                Some(left.saturating_sub(n as u64))
            })
            .unwrap_or(0)
            .min(n as u64) as usize;
        if allowed < n {
            truncated.store(true, Ordering::SeqCst);
        }
        if allowed > 0 {
            hasher.update(&buf[..allowed]);
            forwarded += allowed as u64;
            let _ = sink.write_all(&buf[..allowed]);
            let _ = sink.flush();
        }
    }
    StreamRecord {
        bytes,
        forwarded,
        sha256: hex::encode(hasher.finalize()),
        captured: None,
    }
}

/// What every backend watches while a turn runs: the command's two output
/// streams (pumped under one shared byte budget) and the timer (SIGTERM to
/// every process of the turn at the deadline, SIGKILL after the grace).
#[derive(Debug)]
pub struct Watch {
    streams: Option<(
        crate::syncpool::Task<StreamRecord>,
        crate::syncpool::Task<StreamRecord>,
    )>,
    truncated: Arc<AtomicBool>,
    timed_out: Arc<AtomicBool>,
    cancel: Option<mpsc::Sender<()>>,
    /// Whether the timer may still signal the turn: cleared by
    /// [`Watch::stop`] under the lock the timer holds while it signals, so
    /// nothing is signalled once `stop` returns — without waiting for the
    /// timer's thread to end (a join cost ~90 µs of every turn: the thread
    /// woken, scheduled and gone on busy cores). The thread ends on its own.
    armed: Arc<std::sync::Mutex<bool>>,
}

impl Watch {
    /// Pumps `out` and `err` (stdout goes to our stderr in `json_mode`,
    /// where stdout carries the one JSON object; into memory, within the
    /// same budget, with `capture`).
    pub fn pumps(
        out: impl Read + Send + 'static,
        err: impl Read + Send + 'static,
        output_bytes: u64,
        json_mode: bool,
        capture: bool,
    ) -> Self {
        let budget = Arc::new(AtomicU64::new(output_bytes));
        let truncated = Arc::new(AtomicBool::new(false));
        let out_thread = {
            let (budget, truncated) = (Arc::clone(&budget), Arc::clone(&truncated));
            crate::syncpool::spawn(move || {
                if capture {
                    let mut kept = Vec::new();
                    let mut record = pump(out, &mut kept, budget, truncated);
                    record.captured = Some(kept);
                    record
                } else if json_mode {
                    pump(out, std::io::stderr(), budget, truncated)
                } else {
                    pump(out, std::io::stdout(), budget, truncated)
                }
            })
        };
        let err_thread = {
            let (budget, truncated) = (Arc::clone(&budget), Arc::clone(&truncated));
            crate::syncpool::spawn(move || pump(err, std::io::stderr(), budget, truncated))
        };
        Self {
            streams: Some((out_thread, err_thread)),
            truncated,
            timed_out: Arc::new(AtomicBool::new(false)),
            cancel: None,
            armed: Arc::new(std::sync::Mutex::new(true)),
        }
    }

    /// Starts the turn's timer: SIGTERM to every process of `cg` after
    /// `timeout`, SIGKILL after [`KILL_GRACE`]; cancelled by [`Watch::stop`].
    pub fn start_timer(&mut self, cg: Arc<cgroup::TurnCgroup>, timeout: Duration) {
        let (cancel, cancelled) = mpsc::channel::<()>();
        let timed_out = Arc::clone(&self.timed_out);
        let armed = Arc::clone(&self.armed);
        // Runs `act` unless the watch was stopped; false when it was.
        let fire = move |act: &dyn Fn()| {
            let live = armed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *live {
                act();
            }
            *live
        };
        // Ends once cancelled (or its watch dropped): never joined.
        drop(crate::syncpool::spawn(move || {
            // The clock runs only while the turn is not frozen (`supervise
            // suspend`, the shim's Pause): checked every 50 ms.
            let mut left = timeout;
            let freezable = cg.can_freeze();
            let expired = loop {
                let tick = if freezable {
                    left.min(Duration::from_millis(50))
                } else {
                    left
                };
                let t0 = std::time::Instant::now();
                match cancelled.recv_timeout(tick) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => break false,
                }
                if !(freezable && cg.frozen()) {
                    left = left.saturating_sub(t0.elapsed());
                }
                if left.is_zero() {
                    break true;
                }
            };
            let term = || {
                timed_out.store(true, Ordering::SeqCst);
                cg.signal_all(Signal::SIGTERM);
            };
            if expired
                && fire(&term)
                && cancelled.recv_timeout(KILL_GRACE) == Err(mpsc::RecvTimeoutError::Timeout)
            {
                fire(&|| {
                    cg.kill_all();
                });
            }
        }));
        self.cancel = Some(cancel);
    }

    /// Stops the timer (the command is gone): once this returns, the timer
    /// signals nothing more (see [`Watch::armed`]).
    pub fn stop(&mut self) {
        if let Some(c) = self.cancel.take() {
            let _ = c.send(());
        }
        *self
            .armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = false;
    }

    /// The streams' records, once every process holding them is gone.
    pub fn streams(&mut self) -> (StreamRecord, StreamRecord) {
        match self.streams.take() {
            Some((o, e)) => (o.join().unwrap_or_default(), e.join().unwrap_or_default()),
            None => Default::default(),
        }
    }

    pub fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::SeqCst)
    }

    pub fn truncated(&self) -> bool {
        self.truncated.load(Ordering::SeqCst)
    }
}

/// A sandbox built and parked right before its command's first
/// instruction (OCI "created"): namespaces, cgroup, the new root, every
/// restriction but the final `execve` — and the command's posture already
/// checked from outside. [`Created::start`] lets it run; [`Created::wait`]
/// returns once it and every process it started are gone. Dropped without
/// `wait`, everything of it is killed.
#[derive(Debug)]
pub struct Created {
    cg: Arc<cgroup::TurnCgroup>,
    child: Option<spawn::InitChild>,
    go: Option<std::os::fd::OwnedFd>,
    /// Where PID 1 says the turn is over ([`init::DONE_FD`]).
    done: Option<std::os::fd::OwnedFd>,
    watch: Watch,
    posture: Option<posture::Posture>,
    phases: Vec<(&'static str, u64)>,
    last: Instant,
    started: Instant,
    seccomp_unknown: Vec<String>,
    uppers: Vec<PathBuf>,
    report_path: PathBuf,
    scratch: PathBuf,
    listener: std::result::Result<notify::Listener, String>,
    /// The turn's registration with the denial observer.
    observation: std::result::Result<observe::Registration, String>,
    warm: bool,
    egress: Option<egress::Running>,
    /// The command was let go (`start` wrote its go).
    released: bool,
    /// What `start` writes on the go pipe: [`init::GO`], or for a stage
    /// restricted ahead of its turn, [`init::LAUNCH`] and the turn's part.
    launch: Vec<u8>,
}

impl Created {
    fn lap(&mut self, name: &'static str) {
        let now = Instant::now();
        self.phases
            .push((name, now.duration_since(self.last).as_micros() as u64));
        self.last = now;
    }

    /// The posture check's result (`None` when the init never got that far).
    pub fn posture(&self) -> Option<&posture::Posture> {
        self.posture.as_ref()
    }

    /// Lets the command run: the parked process execs it. A sandbox whose
    /// posture check failed (or never happened) is killed instead.
    pub fn start(&mut self) {
        // The time since the last lap was spent at the intent-entry gate,
        // counted by the turn as `intent_entry`: not part of any phase here.
        self.last = Instant::now();
        match (&self.posture, self.go.take()) {
            (Some(p), Some(go)) if p.ok() => {
                // Closed once written: the stage reads its go to EOF.
                self.released = std::fs::File::from(go).write_all(&self.launch).is_ok();
            }
            _ => {
                self.cg.kill_all();
            }
        }
    }

    /// Sends `signal` to every process of the turn.
    pub fn signal(&self, signal: Signal) {
        self.cg.signal_all(signal);
    }

    /// Waits for the command and every process of the turn, tears the
    /// cgroup down and reports what happened. The cgroup is empty on return.
    pub fn wait(mut self) -> Result<Execution> {
        // Never started: nothing will ever run.
        if let Some(go) = self.go.take() {
            drop(go);
            self.cg.kill_all();
        }
        let mut init_ended = None;
        // PID 1 that ended the turn itself (DONE: the command's status in
        // the report, every other process of its namespace reaped) is left
        // to exit — its namespaces' teardown — beside the capture; the
        // teardown below reaps it. The cgroup must agree that nothing else
        // is left. Any other end (EOF: PID 1 died, was killed, failed) is
        // waited for here, as always.
        let said_done = self.done.take().is_some_and(|fd| said_done(&fd));
        let mut exiting = None;
        let status = match self.child.take() {
            Some(c) if said_done && self.cg.holds_only(c.id()) => {
                exiting = Some(c);
                Ok(())
            }
            Some(mut c) => c.wait().map(|()| init_ended = c.ended()),
            None => Err(std::io::Error::other("no sandbox process")),
        };
        self.watch.stop();
        // The pipes close once every process holding them is gone.
        if exiting.is_none() {
            self.cg.kill_all();
        }
        let (stdout, stderr) = self.watch.streams();
        status.map_err(|e| sandbox_err("wait for sandbox", e.to_string()))?;
        self.lap("command_and_exit");
        // Every process of the turn is gone: nothing more can be refused.
        let observed = std::mem::replace(&mut self.observation, Err(String::new()))
            .map(observe::Registration::finish);
        self.lap("observe_collect");

        let report =
            protocol::parse(&std::fs::read_to_string(&self.report_path).unwrap_or_default());
        let ending = ending_from(&report, init_ended, self.released);
        let mut landlock = None;
        let mut ephemeral = serde_json::Map::new();
        for e in &report {
            match e {
                // The init's own laps (cumulative µs since it started; a
                // warm sandbox's were spent before its turn).
                InitEvent::InitLaps { us } if !self.warm => {
                    let mut prev = 0;
                    for (name, at) in us {
                        let name = match name.as_str() {
                            "root_proc_lo" => "init_root_proc_lo",
                            "idmap" => "init_idmap",
                            "view" => "init_view",
                            _ => continue,
                        };
                        self.phases.push((name, at.saturating_sub(prev)));
                        prev = *at;
                    }
                }
                InitEvent::Landlock { outcome } => landlock = Some(outcome.clone()),
                InitEvent::Ephemeral {
                    dir,
                    files,
                    truncated,
                } => {
                    ephemeral.insert(dir.clone(), json!({"files": files, "truncated": truncated}));
                }
                _ => {}
            }
        }
        // Whatever happened: nothing of the turn keeps running (but an
        // exiting PID 1, which runs nothing).
        let empty = match &exiting {
            Some(init) => self.cg.holds_only(init.id()),
            None => self.cg.kill_all(),
        };
        let egress = self.egress.take().map(egress::Running::finish);
        if egress.is_some() {
            self.lap("egress_finish");
        }
        let usage = self.cg.usage();
        self.lap("cgroup_teardown");
        // Removing the emptied cgroups waits for the turn's finish entries
        // (see `Deferred`); on the error below it runs as it drops.
        let cg = Arc::clone(&self.cg);
        let teardown = Deferred::new(move || {
            // An exiting PID 1 leaves the cgroup once reaped. It is
            // killed first: stopped (SIGSTOP, a ptrace stop) on its way
            // out, it would never exit, and this wait — the turn's
            // teardown, a daemon worker's next turn behind it — would
            // never end (kill-point audit, stop 54). It runs nothing by
            // now: the kill only ends what was ending.
            if let Some(mut init) = exiting {
                let _ = init.kill();
                let _ = init.wait();
            }
            cg.remove()
        });
        if !empty {
            return Err(sandbox_err(
                "teardown",
                "processes of the turn survived SIGKILL",
            ));
        }
        let disk_full = scratch_full(&self.scratch);
        Ok(Execution {
            ending,
            timed_out: self.watch.timed_out(),
            usage,
            cgroup_version: self.cg.version,
            landlock,
            report,
            stdout,
            stderr,
            output_truncated: self.watch.truncated(),
            disk_full,
            posture: self.posture.take(),
            phases: std::mem::take(&mut self.phases),
            seccomp_unknown: std::mem::take(&mut self.seccomp_unknown),
            wall: self.started.elapsed(),
            uppers: std::mem::take(&mut self.uppers),
            ephemeral,
            denials: std::mem::replace(&mut self.listener, Err(String::new()))
                .map(notify::Listener::finish),
            observed,
            degraded: Vec::new(),
            warm: self.warm,
            egress,
            teardown,
        })
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        // Only a sandbox abandoned before `wait` still has a child here.
        if let Some(mut child) = self.child.take() {
            self.cg.kill_all();
            let _ = child.wait();
            self.watch.stop();
            self.cg.kill_all();
            self.cg.remove();
        }
    }
}

/// Builds the sandbox and parks it before the command's `execve` (see
/// [`Created`]): [`park`] then [`Parked::begin`] with the same Plan.
/// `netns`: its network namespace, if the caller started making it
/// earlier ([`spawn::new_netns`]).
pub fn create(
    plan: &Arc<Plan>,
    turn: &TurnDir,
    cgroup_place: &cgroup::Place,
    json_mode: bool,
    netns: Option<spawn::NetnsJob>,
) -> Result<Created> {
    let cg_name = crate::ids::TurnId::of(plan).to_string();
    park(plan, turn, cgroup_place, &cg_name, netns)?.begin(plan, json_mode)
}

/// A sandbox built before its turn is known: cgroup, namespaces, the new
/// root from the Plan's shape ([`Plan::shape`]) — its PID 1 parked before
/// the command. [`Parked::begin`] hands it a turn of that shape. Dropped
/// without `begin`, everything of it is killed and its cgroup removed.
#[derive(Debug)]
pub struct Parked {
    cg: Arc<cgroup::TurnCgroup>,
    child: Option<spawn::InitChild>,
    ready: std::os::fd::OwnedFd,
    go: Option<std::os::fd::OwnedFd>,
    turn: Option<std::os::fd::OwnedFd>,
    done: Option<std::os::fd::OwnedFd>,
    out: Option<std::fs::File>,
    err: Option<std::fs::File>,
    /// The Plan it was built from (its `plan.json`; shared, not copied):
    /// its shape is the sandbox's. A turn with exactly this Plan (a cold
    /// turn's) is handed over as [`init::SAME_PLAN`], another (a warm
    /// turn's, of the same shape) as its [`init::TURN_PART`].
    built: Arc<Plan>,
    /// `Some(true)` once PID 1 said it is parked, `Some(false)` if it ended
    /// before that; `None` not asked yet.
    parked: Option<bool>,
    started: Instant,
    phases: Vec<(&'static str, u64)>,
    last: Instant,
    seccomp_unknown: Vec<String>,
    uppers: Vec<PathBuf>,
    report_path: PathBuf,
    scratch: PathBuf,
    /// Every host path the sandbox shows (the workspace root, each mount's
    /// source) with the file it was when the sandbox was built.
    sources: Vec<(PathBuf, Option<(u64, u64)>)>,
    /// A `restricted` / `allow_egress` sandbox's egress, being set up in
    /// its network namespace while its init builds the rest.
    egress: Option<std::thread::JoinHandle<std::result::Result<egress::Running, String>>>,
    /// Its command stage, restricted ahead of its turn
    /// ([`Parked::restrict_ahead`]).
    ahead: Option<Ahead>,
}

/// A command stage restricted ahead of its turn, as its turn's would be:
/// its posture checked from outside, its seccomp listener taken.
#[derive(Debug)]
struct Ahead {
    posture: posture::Posture,
    listener: std::result::Result<notify::Listener, String>,
}

/// The host paths a Plan's mounts show, each with the (device, inode) it
/// is now. A bind mount or an overlay layer holds the file or directory it
/// was made from: a path replaced since (a rename over it) would still show
/// the old one. Read before the sandbox is built, so a replacement during
/// the build is seen too.
fn mount_sources(plan: &Plan) -> Vec<(PathBuf, Option<(u64, u64)>)> {
    use std::os::unix::fs::MetadataExt;
    use turnstile_policy::plan::Mount;
    let host = |path: &str| -> PathBuf {
        let in_workspace = path == plan.root || path.starts_with(&format!("{}/", plan.root));
        match &plan.system_root {
            Some(image) if !in_workspace => Path::new(image).join(path.trim_start_matches('/')),
            _ => PathBuf::from(path),
        }
    };
    std::iter::once(plan.root.as_str())
        .chain(plan.mounts.iter().filter_map(|m| match m {
            Mount::ReadOnly { path }
            | Mount::SystemReadOnly { path }
            | Mount::Overlay { path, .. } => Some(path.as_str()),
            _ => None,
        }))
        .map(|p| {
            let path = host(p);
            let id = std::fs::symlink_metadata(&path)
                .ok()
                .map(|m| (m.dev(), m.ino()));
            (path, id)
        })
        .collect()
}

/// Builds a sandbox from `plan`'s shape in `turn`, in a new cgroup named
/// `cg_name`, up to the point where it waits for its turn (`netns`: as
/// for [`create`]; `None` starts making it here).
pub fn park(
    plan: &Arc<Plan>,
    turn: &TurnDir,
    cgroup_place: &cgroup::Place,
    cg_name: &str,
    netns: Option<spawn::NetnsJob>,
) -> Result<Parked> {
    // Loaded while the sandbox is built (the verifier takes milliseconds),
    // where a turn has a cgroup v2 id to be observed by.
    if cgroup::has_v2(&cgroup_place.root) {
        observe::preload();
    }
    let started = Instant::now();
    // The network namespace the init joins: made while the filter and the
    // cgroup are prepared below, unless the caller started it earlier.
    let netns = netns.unwrap_or_else(spawn::new_netns);
    // A `restricted` / `allow_egress` turn's egress (resolver, proxy,
    // nftables) is set up in that namespace as soon as it exists: beside
    // the filter, the cgroup and the init's start below, not after them
    // (its ~3 ms were the longer branch once the init got faster). Where
    // the namespace could not be made beforehand, the egress starts in the
    // child's own, after the spawn, as before.
    let (netns, mut early_egress) = if plan.network == "isolated" {
        (EarlyNetns::Pending(netns), EgressSetup(None))
    } else {
        let fd = netns.join().ok().and_then(std::io::Result::ok);
        let setup = fd.as_ref().and_then(|fd| fd.try_clone().ok()).map(|ns| {
            let (network, entries) = (plan.network.clone(), plan.egress.clone());
            std::thread::spawn(move || egress::start(&network, &entries, ns))
        });
        (EarlyNetns::Joined(fd), EgressSetup(setup))
    };
    let mut phases = Vec::new();
    let mut last = Instant::now();
    let mut lap = |name: &'static str, phases: &mut Vec<(&'static str, u64)>| {
        let now = Instant::now();
        phases.push((name, now.duration_since(last).as_micros() as u64));
        last = now;
    };
    let bpf_path = turn.path.join(init::BPF_FILE);
    let cache = turn
        .path
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|state| state.join("cache"));
    let filter = match cache {
        Some(dir) => seccomp::compile_cached(&plan.seccomp, &dir, &bpf_path)?,
        None => seccomp::compile_to(&plan.seccomp, &bpf_path)?,
    };
    let plan_bytes =
        serde_json::to_vec(&**plan).map_err(|e| sandbox_err("write plan", e.to_string()))?;
    let plan_path = turn.path.join(init::PLAN_FILE);
    std::fs::write(&plan_path, plan_bytes).map_err(sandbox_io("write plan", &plan_path))?;
    lap("seccomp_compile", &mut phases);
    let sources = mount_sources(plan);
    let cg = Arc::new(cgroup::TurnCgroup::create(
        cgroup_place,
        cg_name,
        &plan.limits,
    )?);
    // Where `supervise suspend`/`resume` find it (in the turn's
    // directory).
    let _ = cg.publish(&crate::store::record::running_cgroup_file(&turn.path));
    lap("cgroup_create", &mut phases);
    // Where it could not be made beforehand, the child unshares one as
    // before: the same namespace, made later.
    let netns = match netns {
        EarlyNetns::Pending(job) => job.join().ok().and_then(std::io::Result::ok),
        EarlyNetns::Joined(fd) => fd,
    };
    let spawned = spawn_parked(turn, &cg, netns);
    let Spawned {
        mut child,
        ready,
        go,
        turn: turn_w,
        done,
    } = match spawned {
        Ok(x) => x,
        Err(e) => {
            cg.kill_all();
            cg.remove();
            return Err(e);
        }
    };
    lap("spawn", &mut phases);
    // Egress by name, in the sandbox's own network namespace, set up while
    // its init builds the rest (the shape carries the network policy).
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        cg.kill_all();
        cg.remove();
        return Err(sandbox_err("start sandbox init", "no output pipes"));
    };
    // Handed on only here, past the last early return (until then the
    // guard stops it on the way out).
    let egress = early_egress.0.take().or_else(|| {
        (plan.network != "isolated").then(|| {
            let ns = std::fs::File::open(format!("/proc/{}/ns/net", child.id()))
                .map(std::os::fd::OwnedFd::from);
            let (network, entries) = (plan.network.clone(), plan.egress.clone());
            std::thread::spawn(move || {
                egress::start(&network, &entries, ns.map_err(|e| e.to_string())?)
            })
        })
    });
    Ok(Parked {
        cg,
        child: Some(child),
        ready,
        go: Some(go),
        turn: Some(turn_w),
        done: Some(done),
        out: Some(out),
        err: Some(err),
        built: Arc::clone(plan),
        parked: None,
        started,
        phases,
        last,
        seccomp_unknown: filter.unknown_syscalls,
        uppers: (0..plan.writable_scopes.len())
            .map(|i| turn.upper(i))
            .collect(),
        report_path: turn.path.join(init::REPORT_FILE),
        scratch: turn.path.join(init::SCRATCH_DIR),
        sources,
        egress,
        ahead: None,
    })
}

impl Parked {
    /// The Plan this sandbox was built from (its shape is the sandbox's).
    pub fn built(&self) -> &Plan {
        &self.built
    }

    /// The cgroup the sandbox runs in.
    pub fn cgroup_name(&self) -> Option<String> {
        self.cg
            .dirs()
            .first()
            .and_then(|d| d.file_name())
            .map(|n| n.to_string_lossy().into_owned())
    }

    /// Whether a host path the sandbox shows is no longer the file or
    /// directory it was built with (or appeared or vanished).
    pub fn sources_changed(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        self.sources.iter().any(|(path, id)| {
            let now = std::fs::symlink_metadata(path)
                .ok()
                .map(|m| (m.dev(), m.ino()));
            now != *id
        })
    }

    /// Waits until PID 1 is parked; `false` if it ended before (its setup
    /// failed: the report file says why).
    pub fn parked(&mut self) -> bool {
        self.parked_within(None)
    }

    /// [`Parked::parked`], waiting at most `limit` (then `false`: a build
    /// that hangs is not waited for; dropping the sandbox kills it).
    pub fn parked_within(&mut self, limit: Option<Duration>) -> bool {
        if self.parked.is_none() {
            if let Some(limit) = limit {
                use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
                use std::os::fd::AsFd;
                let ms = u16::try_from(limit.as_millis()).unwrap_or(u16::MAX);
                let mut fds = [PollFd::new(self.ready.as_fd(), PollFlags::POLLIN)];
                if !matches!(poll(&mut fds, PollTimeout::from(ms)), Ok(n) if n > 0) {
                    return false;
                }
            }
            let mut byte = [0u8; 1];
            let got = loop {
                match nix::unistd::read(&self.ready, &mut byte) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    r => break r,
                }
            };
            self.parked = Some(matches!(got, Ok(1)) && byte[0] == init::PARKED);
        }
        self.parked == Some(true)
    }

    /// Why this parked sandbox can no longer take a turn: its PID 1 or its
    /// command stage ended or is stopped since it parked (see
    /// [`posture::parked_chain_broken`]). `None`: both wait, runnable.
    pub fn broken(&self) -> Option<String> {
        match &self.child {
            Some(c) => posture::parked_chain_broken(Path::new("/proc"), c.id() as i32),
            None => Some("it was handed a turn before".into()),
        }
    }

    /// Restricts the parked command stage now, with the Plan the sandbox
    /// was built from (a warm sandbox's: its last turn's), and checks its
    /// posture — Landlock, seccomp, the posture check and the listener's
    /// start leave the next turn's path (~0.8 ms of a served warm turn).
    /// A turn whose restrictions are those ([`Parked::fits`]) then sends
    /// only its command and environment with the go; another does not take
    /// this sandbox. A Plan with stdin (a receive turn's) is left to its
    /// turn: the stage writes it before it restricts itself. An error: the
    /// stage is gone (its report says why); the sandbox is of no use.
    pub fn restrict_ahead(&mut self) -> Result<()> {
        if self.built.stdin.is_some() {
            return Ok(());
        }
        if !self.parked() {
            return Err(sandbox_err(
                "restrict ahead",
                "the init ended before it parked",
            ));
        }
        let turn = self
            .turn
            .take()
            .ok_or_else(|| sandbox_err("restrict ahead", "the stage was sent a turn before"))?;
        std::fs::File::from(turn)
            .write_all(init::SAME_PLAN)
            .map_err(|e| sandbox_err("restrict ahead", e.to_string()))?;
        let fd = read_ready(&self.ready)
            .ok_or_else(|| sandbox_err("restrict ahead", "the stage ended before it was ready"))?;
        let pid = self.child.as_ref().map_or(0, |c| c.id() as i32);
        let (posture, listener) = inspect(&self.built, pid, fd);
        self.ahead = Some(Ahead { posture, listener });
        Ok(())
    }

    /// Whether `plan` (of this sandbox's shape) may take it: any turn,
    /// unless its stage was restricted ahead — then only a turn with the
    /// same restrictions (execute rules, working directory) and no stdin.
    pub fn fits(&self, plan: &Plan) -> bool {
        self.ahead.is_none()
            || (plan.landlock.execute == self.built.landlock.execute
                && plan.cwd == self.built.cwd
                && plan.stdin.is_none())
    }

    /// Hands the sandbox its turn: `plan` must have this sandbox's shape.
    /// Starts the turn's timer and output pumps, sends the Plan, and waits
    /// until the command is restricted and parked before its `execve`, its
    /// posture checked from outside (see [`Created`]) — at once for a stage
    /// restricted ahead ([`Parked::restrict_ahead`]), whose turn's part goes
    /// with the go instead. `warm`: built before this turn was known (its
    /// build time is not this turn's).
    pub fn begin(mut self, plan: &Plan, json_mode: bool) -> Result<Created> {
        if !plan.same_shape(&self.built) {
            return Err(sandbox_err(
                "begin turn",
                "the turn's plan does not have the shape this sandbox was built from",
            ));
        }
        let warm = self.parked.is_some();
        if warm {
            // Its build was not this turn's time.
            self.phases.clear();
            self.started = Instant::now();
            self.last = self.started;
        }
        let (Some(out), Some(err)) = (self.out.take(), self.err.take()) else {
            return Err(sandbox_err("begin turn", "the sandbox was begun before"));
        };
        let child = self.child.take();
        let mut watch = Watch::pumps(
            out,
            err,
            plan.output_budget(),
            json_mode,
            plan.stdin.is_some(),
        );
        // The timer runs from here: a sandbox that never becomes ready is
        // killed at the deadline like any turn.
        watch.start_timer(
            Arc::clone(&self.cg),
            Duration::from_secs(plan.limits.timeout_seconds),
        );
        let mut created = Created {
            cg: Arc::clone(&self.cg),
            child,
            go: self.go.take(),
            done: self.done.take(),
            watch,
            posture: None,
            phases: std::mem::take(&mut self.phases),
            last: self.last,
            started: self.started,
            seccomp_unknown: std::mem::take(&mut self.seccomp_unknown),
            uppers: std::mem::take(&mut self.uppers),
            report_path: std::mem::take(&mut self.report_path),
            scratch: std::mem::take(&mut self.scratch),
            listener: Err("the sandbox never became ready".into()),
            observation: Err("the sandbox never became ready".into()),
            warm,
            egress: None,
            released: false,
            launch: init::GO.to_vec(),
        };
        if !self.fits(plan) {
            return Err(sandbox_err(
                "begin turn",
                "the turn's restrictions are not the ones its stage holds",
            ));
        }
        let ahead = self.ahead.take();
        if self.parked() {
            if warm {
                created.lap("warm_take");
            }
            // Egress must be in force before the command can run: a setup
            // that failed refuses the turn.
            if let Some(setup) = self.egress.take() {
                // What is left of the setup once the init is parked.
                if !warm {
                    created.lap("until_parked");
                }
                match setup.join() {
                    Ok(Ok(running)) => {
                        if !warm {
                            created.phases.extend(running.phases.iter().copied());
                        }
                        created.lap("egress_wait");
                        created.egress = Some(running);
                    }
                    Ok(Err(e)) => return Err(sandbox_err("network egress", e)),
                    Err(_) => return Err(sandbox_err("network egress", "the setup panicked")),
                }
            }
            // A cold turn's PID 1 has its Plan already (plan.json): it is
            // not serialized, sent and parsed a second time. A warm turn's
            // has the built Plan's shape (checked above): only its own part
            // is sent, which the stage applies to the built Plan.
            let part = |first: u8| {
                let mut bytes = vec![first];
                serde_json::to_writer(&mut bytes, &plan.turn_part())
                    .map_err(|e| sandbox_err("send plan", e.to_string()))?;
                Ok::<_, SupervisorError>(bytes)
            };
            if ahead.is_some() {
                // Sent with the go: its stage holds its restrictions.
                created.launch = part(init::LAUNCH)?;
            } else {
                let bytes = if *plan == *self.built {
                    init::SAME_PLAN.to_vec()
                } else {
                    part(init::TURN_PART)?
                };
                if let Some(turn) = self.turn.take() {
                    // A PID 1 that died meanwhile: EPIPE here, EOF below.
                    let _ = std::fs::File::from(turn).write_all(&bytes);
                }
            }
        }
        self.turn = None;
        if let Some(Ahead { posture, listener }) = ahead {
            // Ready since before the turn, its posture checked then: the
            // stage cannot change while it waits for its go.
            created.lap("init_until_ready");
            created.posture = Some(posture);
            created.listener = listener;
        } else {
            // Posture: wait for S3's "ready" (or EOF if setup failed or the
            // timer killed the turn), inspect it from outside.
            if let Some(fd) = read_ready(&self.ready) {
                created.lap("init_until_ready");
                let pid = created.child.as_ref().map_or(0, |c| c.id() as i32);
                let (posture, listener) = inspect(plan, pid, fd);
                created.posture = Some(posture);
                created.listener = listener;
            }
        }
        created.lap("posture");
        if created.posture.is_some() {
            // Observed from here on: the command's execve is the first
            // operation that can be refused.
            // Without a v2 id there is nothing to wait for the load for
            // (why the observer cannot run at all is said first, as before).
            created.observation = match (observe::unavailable(), self.cg.v2_id()) {
                (Some(why), _) => Err(why),
                (None, None) => {
                    Err("the turn has no cgroup v2 directory to attribute its denials by".into())
                }
                (None, Some(id)) => {
                    observe::get().and_then(|o| o.register(id, observe::learning()))
                }
            };
            created.lap("observe_register");
        }
        Ok(created)
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        // Only a sandbox never handed a turn still has its child here.
        if let Some(mut child) = self.child.take() {
            self.turn = None;
            self.cg.kill_all();
            let _ = child.wait();
            self.cg.kill_all();
            self.cg.remove();
        }
    }
}

/// Waits for the command stage's "ready" on `ready` (or EOF if its setup
/// failed or the timer killed the turn): two bytes, written at once —
/// READY, and the number of the descriptor that holds the stage's seccomp
/// listener (returned). `None`: the stage never became ready.
fn read_ready(ready: &std::os::fd::OwnedFd) -> Option<u8> {
    let mut msg = [0u8; 2];
    let mut got = 0;
    while got < msg.len() {
        match nix::unistd::read(ready, &mut msg[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    (got == msg.len() && msg[0] == init::READY).then_some(msg[1])
}

/// Inspects the ready command stage from outside (`init_pid`: the
/// sandbox's init) and takes its seccomp listener (descriptor `fd` in it).
fn inspect(
    plan: &Plan,
    init_pid: i32,
    fd: u8,
) -> (
    posture::Posture,
    std::result::Result<notify::Listener, String>,
) {
    let proc_root = Path::new("/proc");
    let command = posture::find_command(proc_root, init_pid);
    let p = match command {
        Some(pid) => posture::check(proc_root, pid, plan.uid, plan.gid, std::process::id()),
        None => posture::Posture {
            failures: vec!["the command's process was not found".into()],
            ..posture::Posture::default()
        },
    };
    // The deny list's listener, taken out of the parked command.
    let listener = match command {
        Some(pid) => notify::take_fd(pid, i32::from(fd))
            .and_then(|fd| {
                notify::Listener::spawn(
                    fd,
                    seccomp::notify_errnos(&plan.seccomp),
                    seccomp::xattr_checked(&plan.seccomp),
                )
            })
            .map_err(|e| format!("taking the seccomp listener: {e}")),
        None => Err("the sandbox never became ready".into()),
    };
    (p, listener)
}

/// The network namespace [`create`] hands the init: still being made (an
/// `isolated` turn joins it at the last moment), or already joined (a turn
/// with egress needed it first).
enum EarlyNetns {
    Pending(spawn::NetnsJob),
    Joined(Option<std::os::fd::OwnedFd>),
}

/// An egress setup started before the sandbox exists; if [`create`] fails
/// before handing it on, it is waited for and stopped, not left serving.
struct EgressSetup(Option<std::thread::JoinHandle<std::result::Result<egress::Running, String>>>);

impl Drop for EgressSetup {
    fn drop(&mut self) {
        if let Some(Ok(running)) = self.0.take().and_then(|h| h.join().ok()) {
            let _ = running.finish();
        }
    }
}

/// Starts `supervise __sandbox-init` in the turn's cgroup and namespaces
/// (see [`spawn`]), with the handshake pipes.
fn spawn_parked(
    turn: &TurnDir,
    cg: &Arc<cgroup::TurnCgroup>,
    netns: Option<std::os::fd::OwnedFd>,
) -> Result<Spawned> {
    let exe = initbin::path().map_err(|e| sandbox_err("locate supervise", e.to_string()))?;
    let joins = cg.joins()?;
    // The posture handshake pipes, numbered >= 10 so the dup2 onto 3 and 4
    // in the child can never clobber one another.
    let pipe = || spawn::pipe().map_err(|e| sandbox_err("pipe", e.to_string()));
    let (ready_r, ready_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    let (turn_r, turn_w) = pipe()?;
    let (done_r, done_w) = pipe()?;
    let mut flags = NAMESPACES
        .iter()
        .fold(CloneFlags::empty(), |f, (_, flag)| f | *flag);
    if netns.is_some() {
        flags.remove(CloneFlags::CLONE_NEWNET);
    }
    // No host path in the sandbox PID 1's command line (world-readable in
    // its /proc): the turn directory travels in the environment, which only
    // root may read there. The handshake ends at fixed numbers (the init
    // sets close-on-exec on them again at once).
    let spec = spawn::Spec {
        exe: &exe,
        argv0: init::INIT_NAME,
        arg: init::SANDBOX_INIT,
        env: (init::TURN_DIR_ENV, &turn.path),
        fds: [
            (std::os::fd::AsRawFd::as_raw_fd(&ready_w), init::READY_FD),
            (std::os::fd::AsRawFd::as_raw_fd(&go_r), init::GO_FD),
            (std::os::fd::AsRawFd::as_raw_fd(&turn_r), init::TURN_FD),
            (std::os::fd::AsRawFd::as_raw_fd(&done_w), init::DONE_FD),
        ],
        unshare: flags,
        netns: netns.as_ref().map(std::os::fd::AsRawFd::as_raw_fd),
        parent: nix::unistd::getpid(),
    };
    let (child, _into_cgroup) = spawn::spawn(&spec, &joins)
        .map_err(|e| sandbox_err("start sandbox init", format!("{}: {e}", exe.display())))?;
    // Its namespaces exist (it unshared them before exec): keep its mount
    // namespace with the turn directory (see `TurnDir::mount_ns`).
    if let (Ok(ns), Ok(mut slot)) = (
        std::fs::File::open(format!("/proc/{}/ns/mnt", child.id())),
        turn.mount_ns.lock(),
    ) {
        *slot = Some(ns.into());
    }
    // Only the sandbox holds the child ends now: EOF on `ready` means every
    // stage that could answer is gone.
    drop(ready_w);
    drop(go_r);
    drop(turn_r);
    drop(done_w);
    Ok(Spawned {
        child,
        ready: ready_r,
        go: go_w,
        turn: turn_w,
        done: done_r,
    })
}

/// The sandbox's PID 1 and the supervisor's ends of its handshake pipes.
struct Spawned {
    child: spawn::InitChild,
    ready: std::os::fd::OwnedFd,
    go: std::os::fd::OwnedFd,
    /// Where the turn's Plan is sent.
    turn: std::os::fd::OwnedFd,
    /// Where PID 1 says the turn is over ([`init::DONE_FD`]).
    done: std::os::fd::OwnedFd,
}

/// Whether PID 1 said [`init::DONE`] on `done` (blocks until it does, or
/// until every holder of the pipe's other end is gone).
fn said_done(done: &std::os::fd::OwnedFd) -> bool {
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(done, &mut byte) {
            Ok(1) => return byte[0] == init::DONE,
            Err(nix::errno::Errno::EINTR) => {}
            _ => return false,
        }
    }
}

/// How the turn ended, from the init's report; `init` is how the
/// supervisor's child (S1, which relays PID 1's end: 128 + N for a signal)
/// ended, `released` whether the command was let go. Both only explain a
/// report that says nothing.
fn ending_from(
    report: &[InitEvent],
    init: Option<std::result::Result<i32, Signal>>,
    released: bool,
) -> Ending {
    // A setup error or a failed exec explains the exit status that follows
    // it, so they take precedence.
    for e in report {
        if let InitEvent::Error { stage, detail } = e {
            return Ending::SetupFailed {
                stage: stage.clone(),
                detail: detail.clone(),
            };
        }
    }
    for e in report {
        if let InitEvent::ExecFailed { errno, error } = e {
            return Ending::ExecFailed {
                errno: *errno,
                error: error.clone().unwrap_or_default(),
            };
        }
    }
    for e in report {
        match e {
            InitEvent::Signal { signal, name, .. } => {
                return Ending::Signaled {
                    signal: *signal,
                    name: name.clone(),
                };
            }
            InitEvent::Exit { code } => return Ending::Exited(*code),
            _ => {}
        }
    }
    let how = match init {
        Some(Ok(code)) if code > 128 => match Signal::try_from(code - 128) {
            Ok(s) => format!("its PID 1 was killed by {}", s.as_str()),
            Err(_) => format!("it exited {code}"),
        },
        Some(Ok(code)) => format!("it exited {code}"),
        Some(Err(s)) => format!("it was killed by {}", s.as_str()),
        None => "it was not reaped".into(),
    };
    let when = if released {
        "after the command was let go"
    } else {
        "before the command ran"
    };
    Ending::SetupFailed {
        stage: "init".into(),
        detail: format!("the sandbox init ended without reporting {when} ({how})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox's deferred teardown runs exactly once: where it is run,
    /// or else where it drops (never left undone, never twice).
    #[test]
    fn issue_29_a_deferred_teardown_runs_once_wherever_it_ends() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = || {
            let runs = Arc::clone(&runs);
            Deferred::new(move || {
                runs.fetch_add(1, Ordering::SeqCst);
            })
        };
        drop(counted());
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let mut d = counted();
        d.run();
        d.run();
        drop(d);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // Taken out of an execution, the default left behind is empty.
        let mut slot = counted();
        let taken = std::mem::take(&mut slot);
        drop(slot);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        drop(taken);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    /// An init that ended without a word says how it ended and whether the
    /// command had been let go: a PID 1 killed by a signal (relayed by S1
    /// as 128 + N) is told apart from one that exited.
    #[test]
    fn a_silent_init_is_described_by_how_it_ended() {
        let detail = |init, released| match ending_from(&[], init, released) {
            Ending::SetupFailed { stage, detail } => {
                assert_eq!(stage, "init");
                detail
            }
            other => panic!("{other:?}"),
        };
        let d = detail(Some(Ok(128 + 9)), true);
        assert!(d.contains("after the command was let go"), "{d}");
        assert!(d.contains("PID 1 was killed by SIGKILL"), "{d}");
        let d = detail(Some(Ok(125)), false);
        assert!(d.contains("before the command ran (it exited 125)"), "{d}");
        let d = detail(Some(Err(Signal::SIGKILL)), false);
        assert!(d.contains("it was killed by SIGKILL"), "{d}");
        // A report explains itself.
        assert!(matches!(
            ending_from(&[InitEvent::Exit { code: 3 }], Some(Ok(0)), true),
            Ending::Exited(3)
        ));
    }
}
