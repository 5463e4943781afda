//! The shim v2 Task service: containerd's task lifecycle mapped onto one
//! turn per container, driven through a [`TurnRunner`] (the real one
//! spawns `supervise`; see `runner`) and a [`Publisher`] for task events.
//!
//! - Create: read the contract from `config.json` (see `contract`) and
//!   refuse what a pod may not ask for — an unknown `io.turnstile.*` key, a
//!   workspace that is not a configured name for the container's namespace
//!   (see `workspaces`) — before anything is mounted or run; then mount the
//!   image rootfs containerd hands over and run the pre-execution check; a
//!   violation is recorded (through `supervise run`, which refuses before
//!   running anything) and fails Create with the violations named. Nothing
//!   runs.
//! - Start: the runner starts `supervise run … --rootfs <image> -- argv`
//!   with the fifos as stdio; that process is the pid containerd sees, its
//!   exit status the task's (so it follows `run`'s exit statuses,
//!   [`RunExit`]).
//! - Kill: signal it (SIGTERM → the turn is `interrupted`, 128+15).
//! - Wait/State/Pids: from it. Delete: unmount, forget. Exec, Pause,
//!   Resume, ResizePty, Update, Stats: refused (UNIMPLEMENTED) with why.
//!
//! Events are published in order: TaskCreate, TaskStart (before the
//! waiter exists, so never after TaskExit), TaskExit, TaskDelete.
//!
//! The shim never builds a sandbox itself: `supervise` stays the one place
//! a turn is run. This service must never run the container's command
//! anywhere but through the runner's `start` — with one exception, the
//! CRI pod sandbox (pause) container, which is not a turn and runs through
//! `runc` unchanged (see `sandbox` for why).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use containerd_shim::protos::events::task::{
    TaskCreate, TaskDelete, TaskExit, TaskIO, TaskOOM, TaskPaused, TaskResumed, TaskStart,
};
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::protobuf::{MessageDyn, MessageField};
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{
    DeleteResponse, ExitSignal, Flags, StartOpts, Task, TtrpcContext, TtrpcResult, api, info, warn,
};

use crate::contract::{self, Options, Turn};
use crate::error::ShimError;
use crate::exit::RunExit;
use crate::podcgroup::{self, PodCgroup};
use crate::runner::{
    self, Checked, EVENTS_FILE, PID_FILE, Publisher, SuperviseRunner, TaskStdio, TurnRunner,
};
use crate::sandbox::{self, Runc};
use crate::workspaces;

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
            if let Err(e) = runner::run_runc(&runc, &bundle, runc.delete_args(&self.id), "delete") {
                warn!("{e}");
            }
        }
        runner::unmount_rootfs(&bundle.join("rootfs"));
        podcgroup::remove_saved(&bundle);
        remove_dead_socket(&bundle);
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
        TaskService::new(
            &self.namespace,
            self.exit.clone(),
            Arc::new(SuperviseRunner),
            Arc::new(publisher),
        )
    }
}

/// Removes the socket a dead shim served on (the `address` file its start
/// wrote in the bundle): a SIGKILLed shim cannot, and containerd leaves it
/// to the shim's `delete` (as runc's v2 shim does). Only a socket is
/// removed, and only at the address this bundle names.
fn remove_dead_socket(bundle: &std::path::Path) {
    let Ok(address) = std::fs::read_to_string(bundle.join("address")) else {
        return;
    };
    let address = address.trim();
    let path = std::path::Path::new(address.strip_prefix("unix://").unwrap_or(address));
    let is_socket = std::fs::symlink_metadata(path)
        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
    if is_socket {
        if let Err(e) = std::fs::remove_file(path) {
            warn!("removing the dead shim's socket {}: {e}", path.display());
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Created,
    Running,
    /// Frozen by Pause (`supervise suspend`): still running, its timeout
    /// stopped.
    Paused,
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
    stdio: TaskStdio,
    phase: Phase,
    pid: u32,
    exit_status: u32,
    exited_at: Option<Timestamp>,
    /// The container's cgroup (`linux.cgroupsPath`) the shim made.
    pod_cgroup: Option<PodCgroup>,
}

type Shared = Arc<(Mutex<Option<TaskState>>, Condvar)>;

/// The ttrpc Task service of one shim (one container).
pub struct TaskService {
    namespace: String,
    exit: Arc<ExitSignal>,
    runner: Arc<dyn TurnRunner>,
    publisher: Arc<dyn Publisher>,
    state: Shared,
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

fn no_exec(exec_id: &str) -> Result<(), ShimError> {
    if exec_id.is_empty() {
        Ok(())
    } else {
        Err(ShimError::NotFound(format!(
            "exec `{exec_id}` (a turn has no execs)"
        )))
    }
}

fn backend_of(options: &Options) -> String {
    options.backend.map_or_else(
        || "chosen by the package's trust level".to_owned(),
        |b| b.to_string(),
    )
}

impl TaskService {
    /// The service for a container of containerd namespace `namespace`.
    pub fn new(
        namespace: &str,
        exit: Arc<ExitSignal>,
        runner: Arc<dyn TurnRunner>,
        publisher: Arc<dyn Publisher>,
    ) -> Self {
        Self {
            namespace: namespace.to_owned(),
            exit,
            runner,
            publisher,
            state: Arc::new((Mutex::new(None), Condvar::new())),
        }
    }

    fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        if let Err(e) = self.publisher.publish(topic, &self.namespace, event) {
            warn!("publish {topic}: {e}");
        }
    }

    /// Create, before any state is kept: parse, refuse, mount, admit.
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
        let is_sandbox = sandbox::is_cri_sandbox(&spec.annotations, &req.id, &self.namespace)?;
        contract::refuse_unknown_annotations(&spec.annotations)?;
        let options = load_options(req)?;
        let stdio = TaskStdio {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
        };
        let rootfs = bundle.join("rootfs");
        let state = |kind, options, pid| TaskState {
            id: req.id.clone(),
            bundle: bundle.clone(),
            kind,
            options,
            stdio: stdio.clone(),
            phase: Phase::Created,
            pid,
            exit_status: 0,
            exited_at: None,
            pod_cgroup: None,
        };
        if is_sandbox {
            self.runner.mount_rootfs(&req.rootfs, &rootfs)?;
            let runc = Runc::under(&options.state_dir);
            let pid = match self.runner.sandbox_create(&runc, &bundle, &req.id) {
                Ok(pid) => pid,
                Err(e) => {
                    let _ = self.runner.sandbox_delete(&runc, &bundle, &req.id);
                    self.runner.unmount_rootfs(&rootfs);
                    return Err(e);
                }
            };
            return Ok(state(Kind::Sandbox(runc), options, pid));
        }
        // What the pod asks for is refused here, before anything is
        // mounted, checked or created: the contract, then the workspace
        // name for the container's namespace (one lstat of its root).
        let request = contract::request_from_spec(&spec)?;
        let namespace = workspaces::namespace_of(&self.namespace, &spec.annotations)?;
        let workspace = options.workspaces.resolve(&request.workspace, &namespace)?;
        // The container's (the pod's) cgroup, which the turn's is made in:
        // its limits bound the turn.
        let pod_cgroup = match spec.linux.as_ref().and_then(|l| l.cgroups_path.as_deref()) {
            Some(path) if !path.is_empty() => Some(self.runner.pod_cgroup(
                path,
                spec.linux.as_ref().and_then(|l| l.resources.as_ref()),
                &bundle,
            )?),
            _ => None,
        };
        if let Err(e) = self.runner.mount_rootfs(&req.rootfs, &rootfs) {
            if let Some(cg) = &pod_cgroup {
                cg.remove();
            }
            return Err(e);
        }
        // argv[0] is resolved in the mounted image.
        let mut turn = request.into_turn(workspace, &bundle, &namespace);
        turn.cgroup_parent = pod_cgroup.as_ref().map(|c| c.path.clone());
        // From here on a refusal unmounts what it mounted.
        let admitted = match self.runner.check(&turn, &options) {
            Ok(Checked::Admitted) => Ok(()),
            Ok(Checked::Violation { violations }) => self
                .runner
                .record_refusal(&turn, &options, &bundle)
                .and_then(|recorded| {
                    Err(ShimError::Violation {
                        recorded,
                        violations,
                    })
                }),
            Ok(Checked::Refused {
                exit: RunExit::Unavailable,
                message,
            }) => Err(ShimError::Unavailable(turn.redact(&message))),
            Ok(Checked::Refused { message, .. }) => Err(ShimError::Refused(turn.redact(&message))),
            Err(e) => Err(e),
        };
        if let Err(e) = admitted {
            self.runner.unmount_rootfs(&rootfs);
            if let Some(cg) = &pod_cgroup {
                cg.remove();
            }
            return Err(e);
        }
        let mut t = state(Kind::Turn(turn), options, 0);
        t.pod_cgroup = pod_cgroup;
        Ok(t)
    }

    /// Create: one task per shim; refused, nothing is kept.
    pub fn create_task(
        &self,
        req: &api::CreateTaskRequest,
    ) -> Result<api::CreateTaskResponse, ShimError> {
        {
            let (m, _) = &*self.state;
            if lock(m).is_some() {
                return Err(ShimError::State(format!(
                    "this shim already runs a task; `{}` needs its own",
                    req.id
                )));
            }
        }
        let t = match self.admit(req) {
            Ok(t) => t,
            Err(e) => {
                warn!("task {}: create refused: {} {e}", req.id, e.code());
                return Err(e);
            }
        };
        match &t.kind {
            Kind::Turn(turn) => info!(
                "task {}: admitted (package {}, workspace {} at {}, backend {})",
                req.id,
                turn.package,
                turn.workspace_name,
                turn.workspace.display(),
                backend_of(&t.options)
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

    /// Start: the turn (or the sandbox) runs; a waiter publishes its exit.
    pub fn start_task(&self, req: &api::StartRequest) -> Result<api::StartResponse, ShimError> {
        no_exec(&req.exec_id)?;
        let id = req.id.as_str();
        let (m, _) = &*self.state;
        let mut guard = lock(m);
        let t = guard
            .as_mut()
            .filter(|t| t.id == id)
            .ok_or_else(|| ShimError::NotFound(id.to_owned()))?;
        if t.phase != Phase::Created {
            return Err(ShimError::State(format!("task `{id}` was already started")));
        }
        let process = match &t.kind {
            Kind::Sandbox(runc) => {
                let p = self.runner.sandbox_start(runc, &t.bundle, id, t.pid)?;
                info!("task {id}: pod sandbox started as pid {} (runc)", p.pid());
                p
            }
            Kind::Turn(turn) => {
                let p = self.runner.start(turn, &t.options, &t.bundle, &t.stdio)?;
                info!(
                    "task {id}: supervise run started as pid {} (backend {})",
                    p.pid(),
                    backend_of(&t.options)
                );
                p
            }
        };
        let pid = process.pid();
        let is_turn = matches!(t.kind, Kind::Turn(_));
        t.pid = pid;
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
            let exit = process.wait();
            let exit_status = exit.exit_status();
            let at = now();
            let mut oom = false;
            {
                let (m, cv) = &*state;
                let mut guard = lock(m);
                if let Some(t) = guard.as_mut() {
                    t.phase = Phase::Stopped;
                    t.exit_status = exit_status;
                    t.exited_at = Some(at.clone());
                    if let Ok(ev) = std::fs::read_to_string(t.bundle.join(EVENTS_FILE)) {
                        if let Some(last) = ev.lines().last() {
                            info!("task {id}: turn finished: {last}");
                            oom = runner::oom_killed(last);
                        }
                    }
                }
                cv.notify_all();
            }
            if is_turn {
                info!("task {id}: supervise run exited {exit}");
            } else {
                info!("task {id}: pod sandbox exited {}", exit.code());
            }
            // The kernel's OOM killer ended a process of the turn (its
            // evidence says `oom_killed`): containerd hears it as TaskOOM,
            // before the exit, as from runc's shim.
            if oom {
                let event = TaskOOM {
                    container_id: id.clone(),
                    ..Default::default()
                };
                if let Err(e) = publisher.publish("/tasks/oom", &namespace, Box::new(event)) {
                    warn!("publish /tasks/oom: {e}");
                }
            }
            let event = TaskExit {
                container_id: id.clone(),
                id: id.clone(),
                pid,
                exit_status,
                exited_at: MessageField::some(at),
                ..Default::default()
            };
            if let Err(e) = publisher.publish("/tasks/exit", &namespace, Box::new(event)) {
                warn!("publish /tasks/exit: {e}");
            }
        });
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
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

    pub fn task_state(&self, req: &api::StateRequest) -> Result<api::StateResponse, ShimError> {
        no_exec(&req.exec_id)?;
        self.with_task(&req.id, |t| {
            let status = match t.phase {
                Phase::Created => api::Status::CREATED,
                Phase::Running => api::Status::RUNNING,
                Phase::Paused => api::Status::PAUSED,
                Phase::Stopped => api::Status::STOPPED,
            };
            Ok(api::StateResponse {
                id: t.id.clone(),
                bundle: t.bundle.display().to_string(),
                pid: t.pid,
                status: status.into(),
                stdin: t.stdio.stdin.clone(),
                stdout: t.stdio.stdout.clone(),
                stderr: t.stdio.stderr.clone(),
                exit_status: t.exit_status,
                exited_at: t
                    .exited_at
                    .clone()
                    .map_or_else(MessageField::none, MessageField::some),
                ..Default::default()
            })
        })
    }

    pub fn kill_task(&self, req: &api::KillRequest) -> Result<api::Empty, ShimError> {
        no_exec(&req.exec_id)?;
        self.with_task(&req.id, |t| {
            if !matches!(t.phase, Phase::Running | Phase::Paused) {
                return Err(ShimError::NotFound(format!(
                    "task `{}`: process already finished or not started",
                    t.id
                )));
            }
            let signal = nix::sys::signal::Signal::try_from(i32::try_from(req.signal).unwrap_or(0))
                .map_err(|_| {
                    ShimError::Refused(format!("signal {} is not a signal", req.signal))
                })?;
            info!("task {}: {signal} to pid {}", t.id, t.pid);
            self.runner.signal(t.pid, signal)?;
            Ok(api::Empty::new())
        })
    }

    pub fn wait_task(&self, req: &api::WaitRequest) -> Result<api::WaitResponse, ShimError> {
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
                _ => return Err(ShimError::NotFound(req.id.clone())),
            }
            guard = cv
                .wait(guard)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    pub fn delete_task(&self, req: &api::DeleteRequest) -> Result<api::DeleteResponse, ShimError> {
        no_exec(&req.exec_id)?;
        let t = {
            let (m, _) = &*self.state;
            let mut guard = lock(m);
            match guard.as_ref() {
                Some(t) if t.id == req.id && matches!(t.phase, Phase::Running | Phase::Paused) => {
                    return Err(ShimError::State(format!(
                        "task `{}` is running; kill it first",
                        req.id
                    )));
                }
                Some(t) if t.id == req.id => {
                    // runc kills what is left of the sandbox and removes its
                    // cgroup and state; if it cannot, the task stays (and
                    // Delete can be retried) rather than leak it.
                    if let Kind::Sandbox(runc) = &t.kind {
                        self.runner.sandbox_delete(runc, &t.bundle, &t.id)?;
                    }
                }
                _ => return Err(ShimError::NotFound(req.id.clone())),
            }
            guard.take()
        };
        let Some(t) = t else {
            return Err(ShimError::NotFound(req.id.clone()));
        };
        self.runner.unmount_rootfs(&t.bundle.join("rootfs"));
        if let Some(cg) = &t.pod_cgroup {
            cg.remove();
        }
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

    pub fn task_pids(&self, req: &api::PidsRequest) -> Result<api::PidsResponse, ShimError> {
        self.with_task(&req.id, |t| {
            let mut r = api::PidsResponse::new();
            if matches!(t.phase, Phase::Running | Phase::Paused) {
                r.processes
                    .push(containerd_shim::protos::types::task::ProcessInfo {
                        pid: t.pid,
                        ..Default::default()
                    });
            }
            Ok(r)
        })
    }

    fn is_running(&self) -> bool {
        let (m, _) = &*self.state;
        lock(m)
            .as_ref()
            .is_some_and(|t| matches!(t.phase, Phase::Running | Phase::Paused))
    }

    /// Pause (`freeze`) / Resume: the turn's cgroup frozen or thawed by
    /// `supervise suspend|resume` (recorded in the turn's evidence; its
    /// timeout does not run while frozen).
    pub fn pause_task(&self, id: &str, freeze: bool) -> Result<api::Empty, ShimError> {
        let (want, next, topic) = if freeze {
            (Phase::Running, Phase::Paused, "/tasks/paused")
        } else {
            (Phase::Paused, Phase::Running, "/tasks/resumed")
        };
        self.with_task(id, |t| {
            let Kind::Turn(turn) = &t.kind else {
                return Err(ShimError::Unsupported(
                    "pause/resume of the CRI pod sandbox: it is not a turn".into(),
                ));
            };
            if t.phase != want {
                return Err(ShimError::State(format!(
                    "task `{id}` is {:?}, not {want:?}",
                    t.phase
                )));
            }
            self.runner.suspend(turn, &t.options, t.pid, freeze)?;
            t.phase = next;
            info!("task {id}: {}", if freeze { "paused" } else { "resumed" });
            Ok(())
        })?;
        let event: Box<dyn MessageDyn> = if freeze {
            Box::new(TaskPaused {
                container_id: id.to_owned(),
                ..Default::default()
            })
        } else {
            Box::new(TaskResumed {
                container_id: id.to_owned(),
                ..Default::default()
            })
        };
        self.publish(topic, event);
        Ok(api::Empty::new())
    }

    /// Stats: the container's cgroup (see [`PodCgroup::metrics`]).
    pub fn task_stats(&self, id: &str) -> Result<api::StatsResponse, ShimError> {
        self.with_task(id, |t| {
            let cg = t.pod_cgroup.as_ref().ok_or_else(|| {
                ShimError::Unsupported(
                    "stats: the container has no cgroup of its own (no linux.cgroupsPath)".into(),
                )
            })?;
            let any = cg.metrics(&turnstile_supervisor::sandbox::cgroup::root())?;
            Ok(api::StatsResponse {
                stats: MessageField::some(any),
                ..Default::default()
            })
        })
    }

    /// Update: the resources (`specs.LinuxResources`, JSON in the Any)
    /// applied to the container's cgroup, inside which the manifest's
    /// limits stay in force: an update never widens what the manifest
    /// allows.
    pub fn update_task(&self, req: &api::UpdateTaskRequest) -> Result<api::Empty, ShimError> {
        let resources: contract::Resources = match req.resources.as_ref() {
            Some(any) => serde_json::from_slice(&any.value).map_err(|e| ShimError::Spec {
                field: "update.resources",
                reason: e.to_string(),
            })?,
            None => return Ok(api::Empty::new()),
        };
        self.with_task(&req.id, |t| {
            let cg = t.pod_cgroup.as_ref().ok_or_else(|| {
                ShimError::Unsupported(
                    "update: the container has no cgroup of its own (no linux.cgroupsPath)".into(),
                )
            })?;
            cg.update(&turnstile_supervisor::sandbox::cgroup::root(), &resources)?;
            info!("task {}: resources updated: {resources:?}", t.id);
            Ok(api::Empty::new())
        })
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
        Ok(self.create_task(&req)?)
    }

    fn start(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        Ok(self.start_task(&req)?)
    }

    fn state(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        Ok(self.task_state(&req)?)
    }

    fn kill(&self, _ctx: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        Ok(self.kill_task(&req)?)
    }

    fn wait(&self, _ctx: &TtrpcContext, req: api::WaitRequest) -> TtrpcResult<api::WaitResponse> {
        Ok(self.wait_task(&req)?)
    }

    fn delete(
        &self,
        _ctx: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        Ok(self.delete_task(&req)?)
    }

    fn pids(&self, _ctx: &TtrpcContext, req: api::PidsRequest) -> TtrpcResult<api::PidsResponse> {
        Ok(self.task_pids(&req)?)
    }

    fn exec(&self, _ctx: &TtrpcContext, _req: api::ExecProcessRequest) -> TtrpcResult<api::Empty> {
        Err(ShimError::Unsupported(
            "exec into a turn is refused: a turn is one admitted command whose every write is captured and verified against its declaration; another process in it would run unchecked by the pre-execution check and blur what the turn did".into(),
        )
        .into())
    }

    fn pause(&self, _ctx: &TtrpcContext, req: api::PauseRequest) -> TtrpcResult<api::Empty> {
        Ok(self.pause_task(&req.id, true)?)
    }

    fn resume(&self, _ctx: &TtrpcContext, req: api::ResumeRequest) -> TtrpcResult<api::Empty> {
        Ok(self.pause_task(&req.id, false)?)
    }

    fn stats(
        &self,
        _ctx: &TtrpcContext,
        req: api::StatsRequest,
    ) -> TtrpcResult<api::StatsResponse> {
        Ok(self.task_stats(&req.id)?)
    }

    fn resize_pty(
        &self,
        _ctx: &TtrpcContext,
        _req: api::ResizePtyRequest,
    ) -> TtrpcResult<api::Empty> {
        // Create refuses `process.terminal`: the shim holds no pty master
        // to resize.
        Err(ShimError::Unsupported(
            "resize_pty: a turn has no terminal (Create refuses process.terminal; its output is captured and recorded), so there is no pty to resize".into(),
        )
        .into())
    }

    fn close_io(&self, _ctx: &TtrpcContext, _req: api::CloseIORequest) -> TtrpcResult<api::Empty> {
        Ok(api::Empty::new())
    }

    fn update(&self, _ctx: &TtrpcContext, req: api::UpdateTaskRequest) -> TtrpcResult<api::Empty> {
        Ok(self.update_task(&req)?)
    }

    fn shutdown(&self, _ctx: &TtrpcContext, _req: api::ShutdownRequest) -> TtrpcResult<api::Empty> {
        if self.is_running() {
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

#[cfg(test)]
mod tests;
