//! The one seam between the task service and the host: [`TurnRunner`],
//! the operations the service needs (mount the image, admit a turn, start
//! it with the container's stdio, signal it, clean up, and the CRI pod
//! sandbox's runc calls), and [`Publisher`], where task events go.
//!
//! [`SuperviseRunner`] is the real one: it spawns `supervise check` and
//! `supervise run` with the argv `contract` builds and reads their exit
//! statuses as [`RunExit`]. The service never spawns, mounts or signals
//! anything itself, so its lifecycle is unit-tested against a recording
//! fake (`service::tests`). Nothing here decides anything about a turn:
//! what runs is the contract's, whether it may run is `supervise`'s.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use containerd_shim::protos::protobuf::MessageDyn;
use containerd_shim::protos::types::mount::Mount;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{Context, info, warn};

use crate::contract::{CheckReport, Options, Turn};
use crate::error::ShimError;
use crate::exit::RunExit;
use crate::sandbox::{self, Runc};

/// The events file `supervise run --events` appends the turn's
/// EventEnvelope v1 lines to, in the bundle.
pub const EVENTS_FILE: &str = "turnstile-events.jsonl";
/// The pid of the running `supervise run`, in the bundle (for the shim's
/// `delete` action after a dead daemon).
pub const PID_FILE: &str = "turnstile-supervise.pid";

/// The fifos containerd hands over for the container's stdio (`""`: none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskStdio {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
}

/// What `supervise check` said at Create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Exit 0: the turn may run.
    Admitted,
    /// Exit 11: refused by the pre-execution check; the violations, one
    /// line.
    Violation { violations: String },
    /// Any other status (2 bad input, 20 unavailable…) and its message.
    Refused { exit: RunExit, message: String },
}

/// A process the service waits for: a turn's `supervise run`, or the pod
/// sandbox's init.
pub trait Process: Send {
    fn pid(&self) -> u32;
    /// Blocks until it ends.
    fn wait(self: Box<Self>) -> RunExit;
}

/// The operations the task service drives a turn (or a pod sandbox) with.
pub trait TurnRunner: Send + Sync {
    /// Create: mount the image containerd hands over at `rootfs`.
    fn mount_rootfs(&self, mounts: &[Mount], rootfs: &Path) -> Result<(), ShimError>;
    /// Undo [`mount_rootfs`](Self::mount_rootfs) (a refused Create, Delete).
    fn unmount_rootfs(&self, rootfs: &Path);
    /// Create: the container's cgroup (`linux.cgroupsPath`) with its
    /// resources, recorded in `bundle` for a later `delete` action.
    fn pod_cgroup(
        &self,
        path: &str,
        resources: Option<&crate::contract::Resources>,
        bundle: &Path,
    ) -> Result<crate::podcgroup::PodCgroup, ShimError>;
    /// Pause (`freeze`) / Resume: `supervise suspend|resume` of the
    /// running turn of `supervise run` process `pid`.
    fn suspend(
        &self,
        turn: &Turn,
        options: &Options,
        pid: u32,
        freeze: bool,
    ) -> Result<(), ShimError>;
    /// Create: the pre-execution check.
    fn check(&self, turn: &Turn, options: &Options) -> Result<Checked, ShimError>;
    /// Create, after a violation: `supervise run` records the refused turn
    /// (it refuses before running anything); its output, for the error.
    /// Its events go to [`EVENTS_FILE`] in `bundle`.
    fn record_refusal(
        &self,
        turn: &Turn,
        options: &Options,
        bundle: &Path,
    ) -> Result<String, ShimError>;
    /// Start: the turn, with the container's stdio; its events go to
    /// [`EVENTS_FILE`] in `bundle`.
    fn start(
        &self,
        turn: &Turn,
        options: &Options,
        bundle: &Path,
        stdio: &TaskStdio,
    ) -> Result<Box<dyn Process>, ShimError>;
    /// Kill: `signal` to the task's process.
    fn signal(&self, pid: u32, signal: nix::sys::signal::Signal) -> Result<(), ShimError>;
    /// Create of a CRI pod sandbox: `runc create`; its init's pid.
    fn sandbox_create(&self, runc: &Runc, bundle: &Path, id: &str) -> Result<u32, ShimError>;
    /// Start of a pod sandbox: `runc start`; its init (`pid`) to wait for.
    fn sandbox_start(
        &self,
        runc: &Runc,
        bundle: &Path,
        id: &str,
        pid: u32,
    ) -> Result<Box<dyn Process>, ShimError>;
    /// Delete of a pod sandbox (and cleanup of a failed create):
    /// `runc delete --force`.
    fn sandbox_delete(&self, runc: &Runc, bundle: &Path, id: &str) -> Result<(), ShimError>;
}

/// Where task events go: containerd's event service, or a recorder.
pub trait Publisher: Send + Sync {
    fn publish(
        &self,
        topic: &str,
        namespace: &str,
        event: Box<dyn MessageDyn>,
    ) -> Result<(), String>;
}

impl Publisher for RemotePublisher {
    fn publish(
        &self,
        topic: &str,
        namespace: &str,
        event: Box<dyn MessageDyn>,
    ) -> Result<(), String> {
        RemotePublisher::publish(self, Context::default(), topic, namespace, event)
            .map_err(|e| e.to_string())
    }
}

/// The real runner: `supervise` and `runc` processes, mounts, signals.
#[derive(Debug, Clone, Copy, Default)]
pub struct SuperviseRunner;

/// `supervise`: the options' path, else next to this binary, else on PATH.
fn supervise_binary(options: &Options) -> PathBuf {
    if let Some(p) = &options.supervise {
        return p.clone();
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("supervise")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("supervise"))
}

fn output(
    cmd: &mut Command,
    what: &'static str,
    supervise: &Path,
) -> Result<std::process::Output, ShimError> {
    cmd.stdin(Stdio::null())
        .output()
        .map_err(ShimError::io(what, supervise))
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
    .trim()
    .to_owned()
}

fn exit_of(s: std::process::ExitStatus) -> RunExit {
    use std::os::unix::process::ExitStatusExt;
    RunExit::from_wait(s.code(), s.signal())
}

/// Mounts one of the rootfs mounts containerd hands over (the snapshot:
/// overlay, or a bind for the native snapshotter) at `target`. Done here,
/// not by the library's `mount_rootfs`, which waits for a helper child
/// through the library's reaper (this shim waits for its children itself).
fn mount_one(kind: &str, source: &str, options: &[String], target: &Path) -> Result<(), ShimError> {
    use nix::mount::MsFlags;
    let mut flags = MsFlags::empty();
    let mut data: Vec<&str> = Vec::new();
    for o in options {
        match o.as_str() {
            "ro" => flags |= MsFlags::MS_RDONLY,
            "rw" | "defaults" => {}
            "bind" => flags |= MsFlags::MS_BIND,
            "rbind" => flags |= MsFlags::MS_BIND | MsFlags::MS_REC,
            "nosuid" => flags |= MsFlags::MS_NOSUID,
            "nodev" => flags |= MsFlags::MS_NODEV,
            "noexec" => flags |= MsFlags::MS_NOEXEC,
            other => data.push(other),
        }
    }
    let data = data.join(",");
    let fstype = (!flags.contains(MsFlags::MS_BIND)).then_some(kind);
    let fail = |e: nix::errno::Errno| ShimError::Io {
        op: "mount the image rootfs at",
        path: target.to_path_buf(),
        source: std::io::Error::other(format!("{kind} from {source}: {e}")),
    };
    nix::mount::mount(
        Some(source),
        target,
        fstype,
        flags,
        (!data.is_empty()).then_some(data.as_str()),
    )
    .map_err(fail)?;
    if flags.contains(MsFlags::MS_BIND) && flags.contains(MsFlags::MS_RDONLY) {
        nix::mount::mount(
            None::<&str>,
            target,
            None::<&str>,
            flags | MsFlags::MS_REMOUNT,
            None::<&str>,
        )
        .map_err(fail)?;
    }
    Ok(())
}

/// Detaches the image rootfs (not mounted, or gone: nothing to do).
pub fn unmount_rootfs(rootfs: &Path) {
    if let Err(e) = nix::mount::umount2(rootfs, nix::mount::MntFlags::MNT_DETACH) {
        if e != nix::errno::Errno::EINVAL && e != nix::errno::Errno::ENOENT {
            warn!("unmount {}: {e}", rootfs.display());
        }
    }
}

/// Runs runc in the bundle with no stdio (a container's init inherits
/// runc's: a pipe here would never reach EOF); its diagnostics are in the
/// `--log` file, quoted on failure.
pub fn run_runc(
    runc: &Runc,
    bundle: &Path,
    args: Vec<std::ffi::OsString>,
    op: &str,
) -> Result<(), ShimError> {
    let status = Command::new(&runc.binary)
        .args(args)
        .current_dir(bundle)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(ShimError::io("run", &runc.binary))?;
    if status.success() {
        return Ok(());
    }
    let log = std::fs::read_to_string(bundle.join(sandbox::LOG_FILE)).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(3).collect();
    Err(ShimError::Sandbox {
        op: format!("runc {op}"),
        reason: format!(
            "{status}; runc log: {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ),
    })
}

/// The exit status of a process this shim reaps but did not spawn (the
/// sandbox's init, reparented to us as the subreaper when runc exited).
fn wait_reparented(pid: u32) -> RunExit {
    use nix::sys::wait::{WaitStatus, waitpid};
    let p = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0));
    loop {
        match waitpid(p, None) {
            Ok(WaitStatus::Exited(_, code)) => return RunExit::from_code(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => return RunExit::Signaled(sig as i32),
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                warn!("wait for pid {pid}: {e}");
                return RunExit::Other(255);
            }
        }
    }
}

/// How long [`Recovery::settle`] waits for a dead run's orphans (its
/// OCI guard removes the container within about a second).
const ORPHAN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits until no live process has this one as its parent (the shim runs
/// one task: once its `supervise run` is dead, every child left is one of
/// that run's orphans, reparented to the subreaper), or `limit` passes.
fn wait_for_orphans(limit: std::time::Duration) {
    let me = std::process::id();
    let deadline = std::time::Instant::now() + limit;
    loop {
        let left = live_children(me);
        if left.is_empty() {
            return;
        }
        if std::time::Instant::now() > deadline {
            warn!(
                "the dead run's processes {left:?} outlived {} s; recovering anyway",
                limit.as_secs()
            );
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The pids whose parent is `parent` and that are not zombies.
fn live_children(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // `pid (comm) S ppid …`: fields after the last `)`.
                let mut f = stat
                    .rsplit_once(')')
                    .map(|(_, r)| r)
                    .unwrap_or("")
                    .split_whitespace();
                let state = f.next();
                let ppid = f.next().and_then(|p| p.parse::<u32>().ok());
                ppid == Some(parent) && !matches!(state, Some("Z" | "X"))
            })
        })
        .collect()
}

/// A `supervise run` this shim spawned; its pid file goes when it ends.
struct SuperviseProcess {
    child: std::process::Child,
    pid_file: PathBuf,
    /// What settles its turn if it dies before finishing it.
    recovery: Recovery,
}

/// `supervise recover` of the turn's session, for a `supervise run` that
/// ended without its `turn.finished` event (SIGKILLed, OOM-killed): a
/// native turn's mounts and cgroup stay until its session is recovered,
/// and a pod's session usually never has another turn.
struct Recovery {
    supervise: PathBuf,
    /// `recover --root R --state-dir S`.
    args: Vec<String>,
    events: PathBuf,
    /// The session the pod named, if it named one.
    session: Option<String>,
}

impl Recovery {
    fn settle(&self) {
        let events = std::fs::read_to_string(&self.events).unwrap_or_default();
        let (finished, named) = finished_and_session(&events);
        if finished {
            return;
        }
        // Its session: named by the pod (or in its events, written when a
        // turn ends); else every session of the workspace but those a live
        // supervisor holds. A dead one's lock went with it — but an OCI
        // turn's guard, which outlives it to remove the container, takes
        // the session's lock for that cleanup (red-team wave 4: the session
        // was passed over as busy and its turn never closed). The guard is
        // this shim's child now (the shim is the subreaper): wait for the
        // dead run's orphans to end first, for a bounded time.
        let session = named.or_else(|| self.session.clone());
        if session.is_none() {
            wait_for_orphans(ORPHAN_WAIT);
        }
        let which = match &session {
            Some(sid) => vec!["--session", sid.as_str()],
            None => vec!["--skip-busy"],
        };
        let sid = session.as_deref().unwrap_or("(the workspace's)");
        let child = Command::new(&self.supervise)
            .args(&self.args)
            .args(which)
            .arg("--json")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                warn!("session {sid}: recover: {e}");
                return;
            }
        };
        // The exit is reported either way: a recovery that cannot take the
        // session's lock in time is left to the next turn or `recover`.
        let deadline = std::time::Instant::now() + RECOVER_WAIT;
        while matches!(child.try_wait(), Ok(None)) {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                warn!(
                    "session {sid}: recover after its supervise run died took over {} s; stopped",
                    RECOVER_WAIT.as_secs()
                );
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        match child.wait_with_output() {
            Ok(o) if o.status.success() => info!(
                "session {sid}: recovered after its supervise run died: {}",
                String::from_utf8_lossy(&o.stdout).trim()
            ),
            Ok(o) => warn!(
                "session {sid}: recover after its supervise run died failed: {}",
                text(&o)
            ),
            Err(e) => warn!("session {sid}: recover: {e}"),
        }
    }
}

/// How long a dead turn's recovery may take before the exit is reported
/// without it.
const RECOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether `events` (EventEnvelope v1 lines) hold a `turn.finished`, and
/// the session id the first line naming one names.
fn finished_and_session(events: &str) -> (bool, Option<String>) {
    let mut finished = false;
    let mut session = None;
    for line in events.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        finished |= v["type"] == "turn.finished";
        if session.is_none() {
            session = v["payload"]["session_id"].as_str().map(str::to_owned);
        }
    }
    (finished, session)
}

impl Process for SuperviseProcess {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait(mut self: Box<Self>) -> RunExit {
        use std::os::unix::process::ExitStatusExt as _;
        let (exit, killed) = match self.child.wait() {
            Ok(s) => (exit_of(s), s.signal().is_some()),
            Err(e) => {
                warn!("wait for pid {}: {e}", self.child.id());
                (RunExit::Other(255), false)
            }
        };
        let _ = std::fs::remove_file(&self.pid_file);
        // Killed (SIGKILL, the OOM killer): what it left is settled before
        // containerd hears of the exit. A run that ended itself closed its
        // turn, or never began one.
        if killed {
            self.recovery.settle();
        }
        exit
    }
}

/// The pod sandbox's init, reparented to this shim.
struct Reparented(u32);

impl Process for Reparented {
    fn pid(&self) -> u32 {
        self.0
    }

    fn wait(self: Box<Self>) -> RunExit {
        wait_reparented(self.0)
    }
}

/// The container's stdio as `supervise run`'s: the output fifos opened
/// read+write (which never blocks), stdin read-only without blocking on
/// a writer, then made blocking again.
fn open_stdio(stdio: &TaskStdio) -> Result<[Stdio; 3], ShimError> {
    let open_out = |p: &str| -> Result<Stdio, ShimError> {
        if p.is_empty() {
            return Ok(Stdio::null());
        }
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .map(Stdio::from)
            .map_err(ShimError::io("open output fifo", p))
    };
    let stdin = &stdio.stdin;
    let stdin = if stdin.is_empty() {
        Stdio::null()
    } else {
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(stdin)
            .map_err(ShimError::io("open stdin fifo", stdin))?;
        let flags = nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_GETFL)
            .map_err(|e| ShimError::io("open stdin fifo", stdin)(e.into()))?;
        let mut flags = nix::fcntl::OFlag::from_bits_truncate(flags);
        flags.remove(nix::fcntl::OFlag::O_NONBLOCK);
        nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_SETFL(flags))
            .map_err(|e| ShimError::io("open stdin fifo", stdin)(e.into()))?;
        Stdio::from(f)
    };
    Ok([stdin, open_out(&stdio.stdout)?, open_out(&stdio.stderr)?])
}

/// Whether a `turn.finished` event line (the last of [`EVENTS_FILE`])
/// says the kernel's OOM killer ended a process of the turn.
pub fn oom_killed(line: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Finished {
        #[serde(rename = "type")]
        kind: String,
        payload: turnstile_supervisor::store::record::TurnReport,
    }
    serde_json::from_str::<Finished>(line).is_ok_and(|f| {
        f.kind == "turn.finished"
            && f.payload
                .resources
                .is_some_and(|r| r.oom_killed || r.oom_kills > 0)
    })
}

/// The parent pid of `pid` (`/proc/<pid>/stat`'s fourth field).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(1)?.parse().ok()
}

/// Whether `pid` descends from `ancestor`.
fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..64 {
        if pid == ancestor {
            return true;
        }
        match parent_of(pid) {
            Some(p) if p > 1 => pid = p,
            _ => return false,
        }
    }
    false
}

/// The session of the turn `supervise run` process `pid` runs: the
/// `turn-N/cgroup.where` file (which `supervise` publishes in the turn's
/// directory while it runs) whose cgroup holds a descendant of `pid`.
fn running_session(state_dir: &Path, pid: u32) -> Option<String> {
    for s in std::fs::read_dir(state_dir.join("sessions"))
        .ok()?
        .flatten()
    {
        for f in std::fs::read_dir(s.path()).into_iter().flatten().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if !name.starts_with("turn-") {
                continue;
            }
            let where_file = turnstile_supervisor::store::record::running_cgroup_file(&f.path());
            let Ok(text) = std::fs::read_to_string(where_file) else {
                continue;
            };
            // Line 3: the pids hierarchy's directory.
            let Some(pids) = text.lines().nth(2) else {
                continue;
            };
            let procs =
                std::fs::read_to_string(Path::new(pids).join("cgroup.procs")).unwrap_or_default();
            if procs
                .lines()
                .filter_map(|l| l.trim().parse::<u32>().ok())
                .any(|p| descends_from(p, pid))
            {
                return Some(s.file_name().to_string_lossy().into_owned());
            }
        }
    }
    None
}

impl TurnRunner for SuperviseRunner {
    fn suspend(
        &self,
        turn: &Turn,
        options: &Options,
        pid: u32,
        freeze: bool,
    ) -> Result<(), ShimError> {
        let action = if freeze { "suspend" } else { "resume" };
        let session = running_session(&options.state_dir, pid).ok_or_else(|| {
            ShimError::State(format!(
                "{action}: no running turn of supervise pid {pid} (not started yet, or finished)"
            ))
        })?;
        let supervise = supervise_binary(options);
        let out = output(
            Command::new(&supervise)
                .arg(action)
                .arg("--root")
                .arg(&turn.workspace)
                .arg("--state-dir")
                .arg(&options.state_dir)
                .arg("--session")
                .arg(&session)
                // The pod's own session: as its turn's owner, not the
                // host's operator.
                .arg("--tenant")
                .arg(&turn.tenant),
            "run",
            &supervise,
        )?;
        match exit_of(out.status) {
            RunExit::Committed => Ok(()),
            RunExit::Unavailable => Err(ShimError::Unavailable(text(&out))),
            _ => Err(ShimError::Refused(text(&out))),
        }
    }

    fn pod_cgroup(
        &self,
        path: &str,
        resources: Option<&crate::contract::Resources>,
        bundle: &Path,
    ) -> Result<crate::podcgroup::PodCgroup, ShimError> {
        let cg = crate::podcgroup::PodCgroup::create(
            &turnstile_supervisor::sandbox::cgroup::root(),
            path,
            resources,
        )?;
        cg.save(bundle);
        Ok(cg)
    }

    fn mount_rootfs(&self, mounts: &[Mount], rootfs: &Path) -> Result<(), ShimError> {
        for m in mounts {
            mount_one(&m.type_, &m.source, &m.options, rootfs)?;
        }
        Ok(())
    }

    fn unmount_rootfs(&self, rootfs: &Path) {
        unmount_rootfs(rootfs);
    }

    fn check(&self, turn: &Turn, options: &Options) -> Result<Checked, ShimError> {
        let supervise = supervise_binary(options);
        let check = output(
            Command::new(&supervise).args(turn.check_args(options)),
            "run",
            &supervise,
        )?;
        Ok(match exit_of(check.status) {
            RunExit::Committed => Checked::Admitted,
            RunExit::Violation => Checked::Violation {
                violations: CheckReport::summary_of(&check.stdout).unwrap_or_else(|| text(&check)),
            },
            exit => Checked::Refused {
                exit,
                message: text(&check),
            },
        })
    }

    fn record_refusal(
        &self,
        turn: &Turn,
        options: &Options,
        bundle: &Path,
    ) -> Result<String, ShimError> {
        let supervise = supervise_binary(options);
        let record = output(
            Command::new(&supervise).args(turn.run_args(options, &bundle.join(EVENTS_FILE))),
            "run",
            &supervise,
        )?;
        Ok(text(&record))
    }

    fn start(
        &self,
        turn: &Turn,
        options: &Options,
        bundle: &Path,
        stdio: &TaskStdio,
    ) -> Result<Box<dyn Process>, ShimError> {
        let supervise = supervise_binary(options);
        let [stdin, stdout, stderr] = open_stdio(stdio)?;
        let child = Command::new(&supervise)
            .args(turn.run_args(options, &bundle.join(EVENTS_FILE)))
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(ShimError::io("spawn", &supervise))?;
        let pid_file = bundle.join(PID_FILE);
        let _ = std::fs::write(&pid_file, child.id().to_string());
        let recovery = Recovery {
            supervise,
            args: turn.recover_args(options),
            events: bundle.join(EVENTS_FILE),
            session: turn.session.clone(),
        };
        Ok(Box::new(SuperviseProcess {
            child,
            pid_file,
            recovery,
        }))
    }

    fn signal(&self, pid: u32, signal: nix::sys::signal::Signal) -> Result<(), ShimError> {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0)),
            signal,
        )
        .map_err(|e| ShimError::io("signal", format!("pid {pid}"))(e.into()))
    }

    fn sandbox_create(&self, runc: &Runc, bundle: &Path, id: &str) -> Result<u32, ShimError> {
        std::fs::create_dir_all(&runc.root).map_err(ShimError::io("create", &runc.root))?;
        let root_file = bundle.join(sandbox::ROOT_FILE);
        std::fs::write(&root_file, runc.root.display().to_string())
            .map_err(ShimError::io("write", &root_file))?;
        run_runc(runc, bundle, runc.create_args(bundle, id), "create")?;
        let pid_file = bundle.join(sandbox::PID_FILE);
        let text = std::fs::read_to_string(&pid_file).map_err(ShimError::io("read", &pid_file))?;
        text.trim().parse::<u32>().map_err(|e| ShimError::Sandbox {
            op: "runc create".into(),
            reason: format!("pid file {}: {e}", pid_file.display()),
        })
    }

    fn sandbox_start(
        &self,
        runc: &Runc,
        bundle: &Path,
        id: &str,
        pid: u32,
    ) -> Result<Box<dyn Process>, ShimError> {
        run_runc(runc, bundle, runc.start_args(id), "start")?;
        Ok(Box::new(Reparented(pid)))
    }

    fn sandbox_delete(&self, runc: &Runc, bundle: &Path, id: &str) -> Result<(), ShimError> {
        run_runc(runc, bundle, runc.delete_args(id), "delete")
    }
}

#[cfg(test)]
mod tests {
    use super::finished_and_session;

    /// A killed run's events: finished or not, and the session they name.
    #[test]
    fn events_say_whether_the_turn_finished_and_its_session() {
        assert_eq!(finished_and_session(""), (false, None));
        let started = r#"{"type":"turn.started","payload":{"session_id":"SES-1"}}"#;
        let finished = r#"{"type":"turn.finished","payload":{"session_id":"SES-1"}}"#;
        assert_eq!(
            finished_and_session(&format!("{started}\n")),
            (false, Some("SES-1".to_owned()))
        );
        assert_eq!(
            finished_and_session(&format!("not json\n{started}\n{finished}\n")),
            (true, Some("SES-1".to_owned()))
        );
    }
}
