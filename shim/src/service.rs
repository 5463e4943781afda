//! The shim v2 Task service: containerd's task lifecycle mapped onto one
//! `supervise run` process per container.
//!
//! - Create: mount the image rootfs containerd hands over, read the
//!   contract from `config.json` (see `contract`), run the pre-execution
//!   check (`supervise check`); a violation is recorded through `supervise
//!   run` (which refuses before running anything) and fails Create with the
//!   violations named. Nothing runs.
//! - Start: spawn `supervise run … --rootfs <image> -- argv` with the fifos
//!   as stdio; that process is the pid containerd sees, its exit status the
//!   task's (so it follows `run`'s exit-code contract).
//! - Kill: signal it (SIGTERM → the turn is `interrupted`, 128+15).
//! - Wait/State/Pids: from it. Delete: unmount, forget. Exec, Pause,
//!   Resume, ResizePty, Update, Stats: refused (UNIMPLEMENTED) with why.
//!
//! Events are published in order: TaskCreate, TaskStart (before the
//! waiter exists, so never after TaskExit), TaskExit, TaskDelete.
//!
//! The shim never builds a sandbox itself: `supervise` stays the one place
//! a turn is run. This service must never run the container's command
//! anywhere but through `supervise run` — with one exception, the CRI pod
//! sandbox (pause) container, which is not a turn and runs through `runc`
//! unchanged (see `sandbox` for why).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use containerd_shim::protos::events::task::{TaskCreate, TaskDelete, TaskExit, TaskIO, TaskStart};
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::protobuf::{MessageDyn, MessageField};
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{
    Context, DeleteResponse, ExitSignal, Flags, StartOpts, Task, TtrpcContext, TtrpcResult, api,
    info, warn,
};

use crate::contract::{self, Options, Turn};
use crate::error::ShimError;
use crate::sandbox::{self, Runc};

/// The events file `supervise run --events` appends the turn's
/// EventEnvelope v1 lines to, in the bundle.
pub const EVENTS_FILE: &str = "turnstile-events.jsonl";
/// The pid of the running `supervise run`, in the bundle (for `delete`).
pub const PID_FILE: &str = "turnstile-supervise.pid";

/// The shim binary's side: start (spawn the daemon), delete (clean up
/// after a dead daemon), serve.
pub struct Shim {
    exit: Arc<ExitSignal>,
    namespace: String,
    id: String,
}

impl containerd_shim::Shim for Shim {
    type T = TaskService;

    fn new(_runtime_id: &str, args: &Flags, _config: &mut containerd_shim::Config) -> Self {
        Self {
            exit: Arc::new(ExitSignal::default()),
            namespace: args.namespace.clone(),
            id: args.id.clone(),
        }
    }

    fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        // One shim per container: its id groups it.
        let grouping = opts.id.clone();
        let (_pid, address) = containerd_shim::spawn(opts, &grouping, Vec::new())?;
        containerd_shim::synchronous::util::write_address(&address)?;
        // containerd 1.6 (Debian's 1.6.20) reads the start reply as the bare
        // socket address; the library answers with the JSON of 1.7's
        // protocol, which 1.6 dials verbatim and fails. A bare address is
        // understood by both, so the reply is written here and the start
        // action ends (nothing follows it in the library but that reply).
        let mut out = std::io::stdout().lock();
        let written = out.write_all(address.as_bytes()).and_then(|()| out.flush());
        if let Err(e) = written {
            return Err(containerd_shim::Error::IoError {
                context: "write the start reply".into(),
                err: e,
            });
        }
        std::process::exit(0)
    }

    /// `containerd-shim-turnstile-v2 delete`, run in the bundle after the
    /// daemon is gone (or a Create failed): end a `supervise run` it left
    /// (SIGTERM: the turn is recorded as interrupted), unmount the rootfs.
    fn delete_shim(&mut self) -> containerd_shim::Result<DeleteResponse> {
        let bundle = std::env::current_dir().unwrap_or_default();
        let mut pid = 0;
        if let Ok(text) = std::fs::read_to_string(bundle.join(PID_FILE)) {
            if let Ok(p) = text.trim().parse::<i32>() {
                pid = p;
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        // A pod sandbox this shim ran: runc kills and forgets it.
        if let Ok(root) = std::fs::read_to_string(bundle.join(sandbox::ROOT_FILE)) {
            let runc = Runc {
                binary: PathBuf::from("runc"),
                root: PathBuf::from(root.trim()),
            };
            if let Err(e) = run_runc(&runc, &bundle, runc.delete_args(&self.id), "delete") {
                warn!("{e}");
            }
        }
        unmount_rootfs(&bundle);
        let mut r = DeleteResponse::new();
        r.pid = u32::try_from(pid).unwrap_or_default();
        r.exit_status = 128 + libc::SIGKILL as u32;
        r.exited_at = MessageField::some(now());
        Ok(r)
    }

    fn wait(&mut self) {
        self.exit.wait();
    }

    fn create_task_service(&self, publisher: RemotePublisher) -> TaskService {
        TaskService {
            namespace: self.namespace.clone(),
            exit: self.exit.clone(),
            publisher: Arc::new(publisher),
            state: Arc::new((Mutex::new(None), Condvar::new())),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Created,
    Running,
    Stopped,
}

/// What a task runs: a turn (every container but one), or the CRI pod
/// sandbox through runc.
#[derive(Debug)]
enum Kind {
    Turn(Turn),
    Sandbox(Runc),
}

#[derive(Debug)]
struct TaskState {
    id: String,
    bundle: PathBuf,
    kind: Kind,
    options: Options,
    supervise: PathBuf,
    stdio: [String; 3],
    phase: Phase,
    pid: u32,
    exit_status: u32,
    exited_at: Option<Timestamp>,
}

/// The ttrpc Task service of one shim (one container).
pub struct TaskService {
    namespace: String,
    exit: Arc<ExitSignal>,
    publisher: Arc<RemotePublisher>,
    state: Arc<(Mutex<Option<TaskState>>, Condvar)>,
}

fn lock(m: &Mutex<Option<TaskState>>) -> MutexGuard<'_, Option<TaskState>> {
    // A panicking holder leaves consistent data (plain fields): keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now() -> Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut t = Timestamp::new();
    t.seconds = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    t.nanos = i32::try_from(d.subsec_nanos()).unwrap_or_default();
    t
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

fn unmount_rootfs(bundle: &Path) {
    let rootfs = bundle.join("rootfs");
    if let Err(e) = nix::mount::umount2(&rootfs, nix::mount::MntFlags::MNT_DETACH) {
        if e != nix::errno::Errno::EINVAL && e != nix::errno::Errno::ENOENT {
            warn!("unmount {}: {e}", rootfs.display());
        }
    }
}

/// The shim's options: runtime options' ConfigPath, else the default file,
/// else the defaults.
fn load_options(req: &api::CreateTaskRequest) -> Result<Options, ShimError> {
    let named = req
        .options
        .as_ref()
        .and_then(|any| contract::config_path_from_options(&any.value));
    let path = match named {
        Some(p) => PathBuf::from(p),
        None if Path::new(contract::DEFAULT_CONFIG).exists() => {
            PathBuf::from(contract::DEFAULT_CONFIG)
        }
        None => return Ok(Options::default()),
    };
    let text = std::fs::read_to_string(&path).map_err(|e| ShimError::Options {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    Options::parse(&text, &path)
}

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

/// Runs runc in the bundle with no stdio (a container's init inherits
/// runc's: a pipe here would never reach EOF); its diagnostics are in the
/// `--log` file, quoted on failure.
fn run_runc(
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

/// `runc create` for the pod sandbox; its init's pid.
fn create_sandbox(runc: &Runc, bundle: &Path, id: &str) -> Result<u32, ShimError> {
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

/// The exit status of a process this shim reaps but did not spawn (the
/// sandbox's init, reparented to us as the subreaper when runc exited).
fn wait_reparented(pid: u32) -> i32 {
    use nix::sys::wait::{WaitStatus, waitpid};
    let p = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0));
    loop {
        match waitpid(p, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                warn!("wait for pid {pid}: {e}");
                return 255;
            }
        }
    }
}

/// Spawns `supervise run` for the turn with the fifos containerd handed
/// over as its stdio.
fn spawn_turn(turn: &Turn, t: &TaskState) -> Result<std::process::Child, ShimError> {
    let [stdin, stdout, stderr] = &t.stdio;
    let open_out = |p: &str| -> Result<Stdio, ShimError> {
        if p.is_empty() {
            return Ok(Stdio::null());
        }
        // Read+write: opening a fifo this way never blocks.
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .map(Stdio::from)
            .map_err(ShimError::io("open output fifo", p))
    };
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
    let events = t.bundle.join(EVENTS_FILE);
    Command::new(&t.supervise)
        .args(turn.run_args(&t.options, &events))
        .stdin(stdin)
        .stdout(open_out(stdout)?)
        .stderr(open_out(stderr)?)
        .spawn()
        .map_err(ShimError::io("spawn", &t.supervise))
}

impl TaskService {
    fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        if let Err(e) = self
            .publisher
            .publish(Context::default(), topic, &self.namespace, event)
        {
            warn!("publish {topic}: {e}");
        }
    }

    /// Create, before any state is kept: mount, parse, admit.
    fn admit(&self, req: &api::CreateTaskRequest) -> Result<TaskState, ShimError> {
        if req.terminal {
            return Err(ShimError::Spec {
                field: "process.terminal",
                reason:
                    "a turn has no terminal (its output is captured and recorded); run without -t"
                        .into(),
            });
        }
        let bundle = PathBuf::from(&req.bundle);
        let config = bundle.join("config.json");
        let raw = std::fs::read_to_string(&config).map_err(ShimError::io("read", &config))?;
        let spec: contract::Spec = serde_json::from_str(&raw).map_err(|e| ShimError::Spec {
            field: "config.json",
            reason: e.to_string(),
        })?;
        let is_sandbox = sandbox::is_cri_sandbox(&spec.annotations, &req.id)?;
        let options = load_options(req)?;
        let supervise = supervise_binary(&options);
        let rootfs = bundle.join("rootfs");
        for m in &req.rootfs {
            mount_one(&m.type_, &m.source, &m.options, &rootfs)?;
        }
        if is_sandbox {
            let runc = Runc::under(&options.state_dir);
            let pid = match create_sandbox(&runc, &bundle, &req.id) {
                Ok(pid) => pid,
                Err(e) => {
                    let _ = run_runc(&runc, &bundle, runc.delete_args(&req.id), "delete");
                    unmount_rootfs(&bundle);
                    return Err(e);
                }
            };
            return Ok(TaskState {
                id: req.id.clone(),
                bundle,
                kind: Kind::Sandbox(runc),
                options,
                supervise,
                stdio: [req.stdin.clone(), req.stdout.clone(), req.stderr.clone()],
                phase: Phase::Created,
                pid,
                exit_status: 0,
                exited_at: None,
            });
        }
        // From here on a refusal unmounts what it mounted.
        let admitted = (|| {
            // argv[0] is resolved in the mounted image.
            let turn = contract::turn_from_spec(&spec, &bundle)?;
            let check = output(
                Command::new(&supervise).args(turn.check_args(&options)),
                "run",
                &supervise,
            )?;
            match check.status.code() {
                Some(0) => Ok(turn),
                Some(11) => {
                    let violations = serde_json::from_slice::<serde_json::Value>(&check.stdout)
                        .ok()
                        .and_then(|v| {
                            v["violations"].as_array().map(|a| {
                                a.iter()
                                    .map(|x| {
                                        x["details"]
                                            .as_str()
                                            .map_or_else(|| x.to_string(), str::to_owned)
                                    })
                                    .collect::<Vec<_>>()
                                    .join("; ")
                            })
                        })
                        .unwrap_or_else(|| text(&check));
                    // Recorded: `run` refuses it before running anything and
                    // writes the violation to the session's ledgers.
                    let record = output(
                        Command::new(&supervise)
                            .args(turn.run_args(&options, &bundle.join(EVENTS_FILE))),
                        "run",
                        &supervise,
                    )?;
                    Err(ShimError::Violation {
                        recorded: text(&record),
                        violations,
                    })
                }
                Some(20) => Err(ShimError::Unavailable(text(&check))),
                _ => Err(ShimError::Refused(text(&check))),
            }
        })();
        let turn = match admitted {
            Ok(t) => t,
            Err(e) => {
                unmount_rootfs(&bundle);
                return Err(e);
            }
        };
        Ok(TaskState {
            id: req.id.clone(),
            bundle,
            kind: Kind::Turn(turn),
            options,
            supervise,
            stdio: [req.stdin.clone(), req.stdout.clone(), req.stderr.clone()],
            phase: Phase::Created,
            pid: 0,
            exit_status: 0,
            exited_at: None,
        })
    }

    fn start_turn(&self, id: &str) -> Result<u32, ShimError> {
        let (m, _) = &*self.state;
        let mut guard = lock(m);
        let t = guard
            .as_mut()
            .filter(|t| t.id == id)
            .ok_or_else(|| ShimError::NotFound(id.to_owned()))?;
        if t.phase != Phase::Created {
            return Err(ShimError::State(format!("task `{id}` was already started")));
        }
        let waiter: Box<dyn FnOnce() -> i32 + Send> = match &t.kind {
            Kind::Sandbox(runc) => {
                run_runc(runc, &t.bundle, runc.start_args(id), "start")?;
                let pid = t.pid;
                info!("task {id}: pod sandbox started as pid {pid} (runc)");
                Box::new(move || wait_reparented(pid))
            }
            Kind::Turn(turn) => {
                let mut child = spawn_turn(turn, t)?;
                let pid = child.id();
                t.pid = pid;
                let _ = std::fs::write(t.bundle.join(PID_FILE), pid.to_string());
                info!(
                    "task {id}: supervise run started as pid {pid} (backend {})",
                    t.options.backend
                );
                let id = id.to_owned();
                Box::new(move || match child.wait() {
                    Ok(s) => {
                        use std::os::unix::process::ExitStatusExt;
                        s.code()
                            .or_else(|| s.signal().map(|n| 128 + n))
                            .unwrap_or(255)
                    }
                    Err(e) => {
                        warn!("task {id}: wait for pid {pid}: {e}");
                        255
                    }
                })
            }
        };
        let pid = t.pid;
        t.phase = Phase::Running;
        drop(guard);
        // TaskStart before the waiter exists: never TaskExit first.
        self.publish(
            "/tasks/start",
            Box::new(TaskStart {
                container_id: id.to_owned(),
                pid,
                ..Default::default()
            }),
        );
        let state = self.state.clone();
        let publisher = self.publisher.clone();
        let namespace = self.namespace.clone();
        let id = id.to_owned();
        std::thread::spawn(move || {
            let code = waiter();
            let exit_status = u32::try_from(code).unwrap_or(255);
            let at = now();
            {
                let (m, cv) = &*state;
                let mut guard = lock(m);
                if let Some(t) = guard.as_mut() {
                    t.phase = Phase::Stopped;
                    t.exit_status = exit_status;
                    t.exited_at = Some(at.clone());
                    let _ = std::fs::remove_file(t.bundle.join(PID_FILE));
                    if let Ok(ev) = std::fs::read_to_string(t.bundle.join(EVENTS_FILE)) {
                        if let Some(last) = ev.lines().last() {
                            info!("task {id}: turn finished: {last}");
                        }
                    }
                }
                cv.notify_all();
            }
            info!("task {id}: supervise run exited {exit_status}");
            let event = TaskExit {
                container_id: id.clone(),
                id: id.clone(),
                pid,
                exit_status,
                exited_at: MessageField::some(at),
                ..Default::default()
            };
            if let Err(e) = publisher.publish(
                Context::default(),
                "/tasks/exit",
                &namespace,
                Box::new(event),
            ) {
                warn!("publish /tasks/exit: {e}");
            }
        });
        Ok(pid)
    }

    fn with_task<R>(
        &self,
        id: &str,
        f: impl FnOnce(&mut TaskState) -> Result<R, ShimError>,
    ) -> Result<R, ShimError> {
        let (m, _) = &*self.state;
        let mut guard = lock(m);
        match guard.as_mut() {
            Some(t) if t.id == id => f(t),
            _ => Err(ShimError::NotFound(id.to_owned())),
        }
    }
}

fn no_exec(exec_id: &str) -> Result<(), ShimError> {
    if exec_id.is_empty() {
        Ok(())
    } else {
        Err(ShimError::NotFound(format!(
            "exec `{exec_id}` (a turn has no execs)"
        )))
    }
}

impl Task for TaskService {
    fn connect(
        &self,
        _ctx: &TtrpcContext,
        _req: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        let (m, _) = &*self.state;
        let task_pid = lock(m).as_ref().map_or(0, |t| t.pid);
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ..Default::default()
        })
    }

    fn create(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        {
            let (m, _) = &*self.state;
            if lock(m).is_some() {
                return Err(ShimError::State(format!(
                    "this shim already runs a task; `{}` needs its own",
                    req.id
                ))
                .into());
            }
        }
        let t = match self.admit(&req) {
            Ok(t) => t,
            Err(e) => {
                warn!("task {}: create refused: {} {e}", req.id, e.code());
                return Err(e.into());
            }
        };
        match &t.kind {
            Kind::Turn(turn) => info!(
                "task {}: admitted (package {}, workspace {})",
                req.id,
                turn.package,
                turn.workspace.display()
            ),
            Kind::Sandbox(_) => info!(
                "task {}: CRI pod sandbox created through runc (pid {}); not a turn",
                req.id, t.pid
            ),
        }
        let pid = t.pid;
        {
            let (m, _) = &*self.state;
            *lock(m) = Some(t);
        }
        self.publish(
            "/tasks/create",
            Box::new(TaskCreate {
                container_id: req.id.clone(),
                bundle: req.bundle.clone(),
                rootfs: req.rootfs.clone(),
                io: MessageField::some(TaskIO {
                    stdin: req.stdin.clone(),
                    stdout: req.stdout.clone(),
                    stderr: req.stderr.clone(),
                    terminal: req.terminal,
                    ..Default::default()
                }),
                checkpoint: req.checkpoint.clone(),
                pid,
                ..Default::default()
            }),
        );
        Ok(api::CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    fn start(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        no_exec(&req.exec_id)?;
        let pid = self.start_turn(&req.id)?;
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
    }

    fn state(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        no_exec(&req.exec_id)?;
        Ok(self.with_task(&req.id, |t| {
            let status = match t.phase {
                Phase::Created => api::Status::CREATED,
                Phase::Running => api::Status::RUNNING,
                Phase::Stopped => api::Status::STOPPED,
            };
            Ok(api::StateResponse {
                id: t.id.clone(),
                bundle: t.bundle.display().to_string(),
                pid: t.pid,
                status: status.into(),
                stdin: t.stdio[0].clone(),
                stdout: t.stdio[1].clone(),
                stderr: t.stdio[2].clone(),
                exit_status: t.exit_status,
                exited_at: t
                    .exited_at
                    .clone()
                    .map_or_else(MessageField::none, MessageField::some),
                ..Default::default()
            })
        })?)
    }

    fn kill(&self, _ctx: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        no_exec(&req.exec_id)?;
        Ok(self.with_task(&req.id, |t| {
            if t.phase != Phase::Running {
                return Err(ShimError::NotFound(format!(
                    "task `{}`: process already finished or not started",
                    t.id
                )));
            }
            let signal = nix::sys::signal::Signal::try_from(i32::try_from(req.signal).unwrap_or(0))
                .map_err(|_| {
                    ShimError::Refused(format!("signal {} is not a signal", req.signal))
                })?;
            info!("task {}: {signal} to supervise run (pid {})", t.id, t.pid);
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(t.pid).unwrap_or(0)),
                signal,
            )
            .map_err(|e| ShimError::io("signal", format!("pid {}", t.pid))(e.into()))?;
            Ok(api::Empty::new())
        })?)
    }

    fn wait(&self, _ctx: &TtrpcContext, req: api::WaitRequest) -> TtrpcResult<api::WaitResponse> {
        no_exec(&req.exec_id)?;
        let (m, cv) = &*self.state;
        let mut guard = lock(m);
        loop {
            match guard.as_ref() {
                Some(t) if t.id == req.id => {
                    if let Some(at) = &t.exited_at {
                        return Ok(api::WaitResponse {
                            exit_status: t.exit_status,
                            exited_at: MessageField::some(at.clone()),
                            ..Default::default()
                        });
                    }
                }
                _ => return Err(ShimError::NotFound(req.id.clone()).into()),
            }
            guard = cv
                .wait(guard)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn delete(
        &self,
        _ctx: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        no_exec(&req.exec_id)?;
        let t = {
            let (m, _) = &*self.state;
            let mut guard = lock(m);
            match guard.as_ref() {
                Some(t) if t.id == req.id && t.phase == Phase::Running => {
                    return Err(ShimError::State(format!(
                        "task `{}` is running; kill it first",
                        req.id
                    ))
                    .into());
                }
                Some(t) if t.id == req.id => {
                    // runc kills what is left of the sandbox and removes its
                    // cgroup and state; if it cannot, the task stays (and
                    // Delete can be retried) rather than leak it.
                    if let Kind::Sandbox(runc) = &t.kind {
                        run_runc(runc, &t.bundle, runc.delete_args(&t.id), "delete")?;
                    }
                }
                _ => return Err(ShimError::NotFound(req.id.clone()).into()),
            }
            guard.take()
        };
        let Some(t) = t else {
            return Err(ShimError::NotFound(req.id).into());
        };
        unmount_rootfs(&t.bundle);
        let exited_at = t.exited_at.clone().unwrap_or_else(now);
        info!("task {}: deleted (exit {})", t.id, t.exit_status);
        self.publish(
            "/tasks/delete",
            Box::new(TaskDelete {
                container_id: t.id.clone(),
                id: t.id.clone(),
                pid: t.pid,
                exit_status: t.exit_status,
                exited_at: MessageField::some(exited_at.clone()),
                ..Default::default()
            }),
        );
        Ok(api::DeleteResponse {
            pid: t.pid,
            exit_status: t.exit_status,
            exited_at: MessageField::some(exited_at),
            ..Default::default()
        })
    }

    fn pids(&self, _ctx: &TtrpcContext, req: api::PidsRequest) -> TtrpcResult<api::PidsResponse> {
        Ok(self.with_task(&req.id, |t| {
            let mut r = api::PidsResponse::new();
            if t.phase == Phase::Running {
                r.processes
                    .push(containerd_shim::protos::types::task::ProcessInfo {
                        pid: t.pid,
                        ..Default::default()
                    });
            }
            Ok(r)
        })?)
    }

    fn exec(&self, _ctx: &TtrpcContext, _req: api::ExecProcessRequest) -> TtrpcResult<api::Empty> {
        Err(ShimError::Unsupported(
            "exec into a turn is refused: a turn is one admitted command whose every write is captured and verified against its declaration; another process in it would run unchecked by the pre-execution check and blur what the turn did".into(),
        )
        .into())
    }

    fn pause(&self, _ctx: &TtrpcContext, _req: api::PauseRequest) -> TtrpcResult<api::Empty> {
        Err(ShimError::Unsupported(
            "pause: a turn runs to its end or is interrupted (kill); it is not frozen".into(),
        )
        .into())
    }

    fn resume(&self, _ctx: &TtrpcContext, _req: api::ResumeRequest) -> TtrpcResult<api::Empty> {
        Err(ShimError::Unsupported("resume: turns are never paused".into()).into())
    }

    fn resize_pty(
        &self,
        _ctx: &TtrpcContext,
        _req: api::ResizePtyRequest,
    ) -> TtrpcResult<api::Empty> {
        Err(ShimError::Unsupported("resize_pty: a turn has no terminal".into()).into())
    }

    fn close_io(&self, _ctx: &TtrpcContext, _req: api::CloseIORequest) -> TtrpcResult<api::Empty> {
        Ok(api::Empty::new())
    }

    fn update(&self, _ctx: &TtrpcContext, _req: api::UpdateTaskRequest) -> TtrpcResult<api::Empty> {
        Err(
            ShimError::Unsupported("update: a turn's limits are its package's manifest's".into())
                .into(),
        )
    }

    fn shutdown(&self, _ctx: &TtrpcContext, _req: api::ShutdownRequest) -> TtrpcResult<api::Empty> {
        let (m, _) = &*self.state;
        if lock(m).as_ref().is_some_and(|t| t.phase == Phase::Running) {
            return Ok(api::Empty::new());
        }
        info!("shutting down");
        self.exit.signal();
        Ok(api::Empty::new())
    }
}

impl std::fmt::Debug for Shim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shim")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for TaskService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskService")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}
