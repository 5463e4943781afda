//! The task service against a recording fake runner and publisher: no
//! containerd, no `supervise`, no mounts. Each test builds a bundle
//! (`config.json`) and a shim options file in a temporary directory and
//! calls the service's lifecycle methods as containerd's ttrpc calls would.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::types::mount::Mount;
use nix::sys::signal::Signal;

use super::*;
use crate::contract::{Backend, OUTPUTS, PACKAGE, SESSION, WORKSPACE};
use crate::cri;
use crate::runner::Process;

/// What the service asked the runner to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Mount {
        rootfs: PathBuf,
        mounts: usize,
    },
    Unmount(PathBuf),
    Check {
        workspace: PathBuf,
        argv: Vec<String>,
        backend: Option<Backend>,
    },
    Record(PathBuf),
    Start {
        workspace: PathBuf,
        bundle: PathBuf,
        stdio: TaskStdio,
        backend: Option<Backend>,
    },
    Signal {
        pid: u32,
        signal: Signal,
    },
    SandboxCreate(String),
    SandboxStart(String, u32),
    SandboxDelete(String),
}

/// A runner step the fake can be told to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Mount,
    Check,
    Record,
    Start,
    Wait,
    Signal,
    SandboxCreate,
    SandboxDelete,
}

struct FakeRunner {
    calls: Mutex<Vec<Call>>,
    fail: Mutex<Option<Step>>,
    checked: Mutex<Checked>,
    exits: Mutex<HashMap<u32, mpsc::Sender<RunExit>>>,
    next_pid: AtomicU32,
}

impl Default for FakeRunner {
    fn default() -> Self {
        Self {
            calls: Mutex::new(Vec::new()),
            fail: Mutex::new(None),
            checked: Mutex::new(Checked::Admitted),
            exits: Mutex::new(HashMap::new()),
            next_pid: AtomicU32::new(4242),
        }
    }
}

struct FakeProcess {
    pid: u32,
    exit: mpsc::Receiver<RunExit>,
}

impl Process for FakeProcess {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn wait(self: Box<Self>) -> RunExit {
        // A dropped sender is a wait that failed: what the real runner
        // reports then.
        self.exit.recv().unwrap_or(RunExit::Other(255))
    }
}

impl FakeRunner {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn record(&self, c: Call) {
        self.calls.lock().unwrap().push(c);
    }

    fn failing(&self, step: Step) -> Result<(), ShimError> {
        if *self.fail.lock().unwrap() == Some(step) {
            return Err(ShimError::Io {
                op: "fake",
                path: PathBuf::from(format!("{step:?}")),
                source: std::io::Error::other("injected failure"),
            });
        }
        Ok(())
    }

    fn process(&self) -> Box<dyn Process> {
        let pid = self.next_pid.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel();
        if *self.fail.lock().unwrap() != Some(Step::Wait) {
            self.exits.lock().unwrap().insert(pid, tx);
        }
        Box::new(FakeProcess { pid, exit: rx })
    }

    /// The process `pid` ends with `exit`.
    fn exit(&self, pid: u32, exit: RunExit) {
        let tx = self.exits.lock().unwrap().remove(&pid).expect("a live pid");
        tx.send(exit).unwrap();
    }
}

impl TurnRunner for FakeRunner {
    fn suspend(
        &self,
        _turn: &crate::contract::Turn,
        _options: &crate::contract::Options,
        _pid: u32,
        _freeze: bool,
    ) -> Result<(), ShimError> {
        Err(ShimError::State("the fake runner suspends nothing".into()))
    }

    fn pod_cgroup(
        &self,
        path: &str,
        _resources: Option<&crate::contract::Resources>,
        _bundle: &Path,
    ) -> Result<crate::podcgroup::PodCgroup, ShimError> {
        Err(ShimError::PodCgroup {
            path: path.to_owned(),
            reason: "the fake runner makes no cgroups".into(),
        })
    }

    fn mount_rootfs(&self, mounts: &[Mount], rootfs: &Path) -> Result<(), ShimError> {
        self.failing(Step::Mount)?;
        self.record(Call::Mount {
            rootfs: rootfs.to_path_buf(),
            mounts: mounts.len(),
        });
        Ok(())
    }

    fn unmount_rootfs(&self, rootfs: &Path) {
        self.record(Call::Unmount(rootfs.to_path_buf()));
    }

    fn check(&self, turn: &Turn, options: &Options) -> Result<Checked, ShimError> {
        self.failing(Step::Check)?;
        self.record(Call::Check {
            workspace: turn.workspace.clone(),
            argv: turn.argv.clone(),
            backend: options.backend,
        });
        Ok(self.checked.lock().unwrap().clone())
    }

    fn record_refusal(
        &self,
        _turn: &Turn,
        _options: &Options,
        bundle: &Path,
    ) -> Result<String, ShimError> {
        self.failing(Step::Record)?;
        self.record(Call::Record(bundle.to_path_buf()));
        Ok("supervise: SES-1 refused (recorded)".into())
    }

    fn start(
        &self,
        turn: &Turn,
        options: &Options,
        bundle: &Path,
        stdio: &TaskStdio,
    ) -> Result<Box<dyn Process>, ShimError> {
        self.failing(Step::Start)?;
        self.record(Call::Start {
            workspace: turn.workspace.clone(),
            bundle: bundle.to_path_buf(),
            stdio: stdio.clone(),
            backend: options.backend,
        });
        Ok(self.process())
    }

    fn signal(&self, pid: u32, signal: Signal) -> Result<(), ShimError> {
        self.failing(Step::Signal)?;
        self.record(Call::Signal { pid, signal });
        // `supervise run` records the turn as interrupted: 128+N.
        if let Some(tx) = self.exits.lock().unwrap().remove(&pid) {
            let _ = tx.send(RunExit::Signaled(signal as i32));
        }
        Ok(())
    }

    fn sandbox_create(&self, _runc: &Runc, _bundle: &Path, id: &str) -> Result<u32, ShimError> {
        self.failing(Step::SandboxCreate)?;
        self.record(Call::SandboxCreate(id.to_owned()));
        Ok(777)
    }

    fn sandbox_start(
        &self,
        _runc: &Runc,
        _bundle: &Path,
        id: &str,
        pid: u32,
    ) -> Result<Box<dyn Process>, ShimError> {
        self.record(Call::SandboxStart(id.to_owned(), pid));
        let (tx, rx) = mpsc::channel();
        self.exits.lock().unwrap().insert(pid, tx);
        Ok(Box::new(FakeProcess { pid, exit: rx }))
    }

    fn sandbox_delete(&self, _runc: &Runc, _bundle: &Path, id: &str) -> Result<(), ShimError> {
        self.failing(Step::SandboxDelete)?;
        self.record(Call::SandboxDelete(id.to_owned()));
        Ok(())
    }
}

/// One published event: (topic, namespace, event).
type Published = (String, String, Box<dyn MessageDyn>);

/// Every event published, in order.
#[derive(Default)]
struct Recorder(Mutex<Vec<Published>>);

impl Publisher for Recorder {
    fn publish(
        &self,
        topic: &str,
        namespace: &str,
        event: Box<dyn MessageDyn>,
    ) -> Result<(), String> {
        self.0
            .lock()
            .unwrap()
            .push((topic.to_owned(), namespace.to_owned(), event));
        Ok(())
    }
}

impl Recorder {
    fn topics(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().map(|e| e.0.clone()).collect()
    }

    /// Waits (the exit is published by the waiter thread) for `topic`.
    fn wait_for(&self, topic: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.topics().iter().any(|t| t == topic) {
            assert!(Instant::now() < deadline, "no {topic}: {:?}", self.topics());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn exit_event(&self) -> TaskExit {
        let events = self.0.lock().unwrap();
        let (_, _, e) = events
            .iter()
            .find(|e| e.0 == "/tasks/exit")
            .expect("a TaskExit");
        e.downcast_ref::<TaskExit>().expect("a TaskExit").clone()
    }
}

struct Fx {
    dir: tempfile::TempDir,
    ws: PathBuf,
    bundle: PathBuf,
    runner: Arc<FakeRunner>,
    events: Arc<Recorder>,
    svc: TaskService,
}

const ID: &str = "c1";

/// A service of containerd namespace `namespace` whose options map
/// workspace `ws` to a fresh directory for namespace `default`; `extra`
/// is merged into the options document.
fn fixture_in(namespace: &str, extra: serde_json::Value) -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    let mut options = serde_json::json!({
        "state_dir": dir.path().join("state"),
        "workspaces": {"ws": {"root": ws, "namespaces": ["default"]}},
    });
    if let (Some(o), serde_json::Value::Object(extra)) = (options.as_object_mut(), extra) {
        o.extend(extra);
    }
    std::fs::write(dir.path().join("shim.json"), options.to_string()).unwrap();
    let runner = Arc::new(FakeRunner::default());
    let events = Arc::new(Recorder::default());
    let svc = TaskService::new(
        namespace,
        Arc::new(ExitSignal::default()),
        runner.clone(),
        events.clone(),
    );
    Fx {
        dir,
        ws,
        bundle,
        runner,
        events,
        svc,
    }
}

fn fixture() -> Fx {
    fixture_in("default", serde_json::json!({}))
}

const CONTRACT: [(&str, &str); 3] = [(WORKSPACE, "ws"), (PACKAGE, "bb"), (OUTPUTS, "[]")];

impl Fx {
    fn spec(&self, annotations: &[(&str, &str)]) {
        let ann: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        let spec = serde_json::json!({
            "process": {"args": ["sh", "-c", "echo hi"], "env": ["PATH=/bin"], "terminal": false},
            "root": {"path": "rootfs"},
            "annotations": ann,
        });
        std::fs::write(self.bundle.join("config.json"), spec.to_string()).unwrap();
    }

    fn request(&self) -> api::CreateTaskRequest {
        let config = self.dir.path().join("shim.json").display().to_string();
        // runtimeoptions.v1.Options { config_path (field 2) }.
        let mut value = vec![0x12, u8::try_from(config.len()).unwrap()];
        value.extend_from_slice(config.as_bytes());
        api::CreateTaskRequest {
            id: ID.into(),
            bundle: self.bundle.display().to_string(),
            rootfs: vec![Mount {
                type_: "overlay".into(),
                source: "overlay".into(),
                ..Default::default()
            }],
            stdin: String::new(),
            stdout: "/run/fifo/c1-stdout".into(),
            stderr: "/run/fifo/c1-stderr".into(),
            options: MessageField::some(Any {
                type_url: "runtimeoptions.v1.Options".into(),
                value,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn create(&self) -> Result<api::CreateTaskResponse, ShimError> {
        self.svc.create_task(&self.request())
    }

    fn start(&self) -> Result<u32, ShimError> {
        self.svc
            .start_task(&api::StartRequest {
                id: ID.into(),
                ..Default::default()
            })
            .map(|r| r.pid)
    }

    fn state(&self) -> Result<api::StateResponse, ShimError> {
        self.svc.task_state(&api::StateRequest {
            id: ID.into(),
            ..Default::default()
        })
    }

    fn kill(&self, signal: u32) -> Result<api::Empty, ShimError> {
        self.svc.kill_task(&api::KillRequest {
            id: ID.into(),
            signal,
            ..Default::default()
        })
    }

    fn wait(&self) -> Result<api::WaitResponse, ShimError> {
        self.svc.wait_task(&api::WaitRequest {
            id: ID.into(),
            ..Default::default()
        })
    }

    fn delete(&self) -> Result<api::DeleteResponse, ShimError> {
        self.svc.delete_task(&api::DeleteRequest {
            id: ID.into(),
            ..Default::default()
        })
    }

    fn rootfs(&self) -> PathBuf {
        self.bundle.join("rootfs")
    }

    /// A created and started turn; its pid.
    fn running(&self) -> u32 {
        self.spec(&CONTRACT);
        self.create().unwrap();
        self.start().unwrap()
    }

    /// A refused Create left nothing: no runner call but what is listed,
    /// no task, no event, nothing new in the bundle or the workspace.
    fn assert_refused_cleanly(&self, e: &ShimError, code: &str, calls: &[Call]) {
        assert_eq!(e.code(), code, "{e}");
        assert_eq!(self.runner.calls(), calls);
        assert!(
            self.events.topics().is_empty(),
            "{:?}",
            self.events.topics()
        );
        assert_eq!(self.state().unwrap_err().code(), "TS1207");
        let names = |d: &Path| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&self.bundle), ["config.json"]);
        assert!(names(&self.ws).is_empty());
        assert!(!self.dir.path().join("state").exists());
    }
}

#[test]
fn issue_24_create_admits_the_turn_after_mounting_and_publishes_task_create() {
    let f = fixture();
    f.spec(&CONTRACT);
    let r = f.create().unwrap();
    assert_eq!(r.pid, 0, "nothing runs before Start");
    assert_eq!(
        f.runner.calls(),
        [
            Call::Mount {
                rootfs: f.rootfs(),
                mounts: 1
            },
            Call::Check {
                workspace: f.ws.clone(),
                // A bare argv[0] not found in the (fake, empty) image is
                // left to supervise.
                argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
                backend: None,
            },
        ]
    );
    assert_eq!(f.events.topics(), ["/tasks/create"]);
    let s = f.state().unwrap();
    assert_eq!(s.status, api::Status::CREATED.into());
    assert_eq!((s.pid, s.bundle.as_str()), (0, f.bundle.to_str().unwrap()));
}

#[test]
fn issue_24_start_hands_the_containers_stdio_paths_to_the_runner() {
    let f = fixture();
    let pid = f.running();
    assert_eq!(pid, 4242);
    let start = f.runner.calls().pop().unwrap();
    assert_eq!(
        start,
        Call::Start {
            workspace: f.ws.clone(),
            bundle: f.bundle.clone(),
            stdio: TaskStdio {
                stdin: String::new(),
                stdout: "/run/fifo/c1-stdout".into(),
                stderr: "/run/fifo/c1-stderr".into(),
            },
            backend: None,
        }
    );
    let s = f.state().unwrap();
    assert_eq!(s.status, api::Status::RUNNING.into());
    assert_eq!(
        (
            s.pid,
            s.stdout.as_str(),
            s.stderr.as_str(),
            s.stdin.as_str()
        ),
        (4242, "/run/fifo/c1-stdout", "/run/fifo/c1-stderr", "")
    );
    assert_eq!(f.events.topics(), ["/tasks/create", "/tasks/start"]);
    let pids = f
        .svc
        .task_pids(&api::PidsRequest {
            id: ID.into(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(pids.processes.len(), 1);
    assert_eq!(pids.processes[0].pid, 4242);
    f.runner.exit(pid, RunExit::Committed);
    f.events.wait_for("/tasks/exit");
}

#[test]
fn issue_24_wait_returns_the_turns_exit_status_and_task_exit_follows() {
    let f = fixture();
    let pid = f.running();
    f.runner.exit(pid, RunExit::Blocked);
    let w = f.wait().unwrap();
    assert_eq!(w.exit_status, 12);
    assert!(w.exited_at.is_some());
    f.events.wait_for("/tasks/exit");
    let e = f.events.exit_event();
    assert_eq!((e.pid, e.exit_status, e.id.as_str()), (pid, 12, ID));
    let s = f.state().unwrap();
    assert_eq!((s.status, s.exit_status), (api::Status::STOPPED.into(), 12));
}

#[test]
fn issue_24_every_exit_status_of_run_is_the_tasks() {
    for exit in [
        RunExit::Committed,
        RunExit::HostIo,
        RunExit::BadInput,
        RunExit::CommandFailed,
        RunExit::Blocked,
        RunExit::Limit,
        RunExit::Timeout,
        RunExit::Unavailable,
        RunExit::Signaled(15),
        RunExit::Signaled(9),
        RunExit::Other(-1),
    ] {
        let f = fixture();
        let pid = f.running();
        f.runner.exit(pid, exit);
        assert_eq!(f.wait().unwrap().exit_status, exit.exit_status(), "{exit}");
        f.events.wait_for("/tasks/exit");
        assert_eq!(f.events.exit_event().exit_status, exit.exit_status());
    }
}

#[test]
fn issue_24_kill_signals_the_turn_which_ends_interrupted() {
    let f = fixture();
    let pid = f.running();
    f.kill(15).unwrap();
    assert_eq!(
        f.runner.calls().last().unwrap(),
        &Call::Signal {
            pid,
            signal: Signal::SIGTERM
        }
    );
    assert_eq!(f.wait().unwrap().exit_status, 143);
    f.events.wait_for("/tasks/exit");
    // After the exit, Kill is NOT_FOUND (containerd's runc shim does the same).
    assert_eq!(f.kill(9).unwrap_err().code(), "TS1207");
}

#[test]
fn issue_24_kill_before_start_or_with_no_signal_is_refused() {
    let f = fixture();
    f.spec(&CONTRACT);
    f.create().unwrap();
    assert_eq!(f.kill(15).unwrap_err().code(), "TS1207");
    f.start().unwrap();
    assert_eq!(f.kill(0).unwrap_err().code(), "TS1204");
    assert_eq!(f.kill(4096).unwrap_err().code(), "TS1204");
    assert!(
        !f.runner
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Signal { .. }))
    );
    f.kill(9).unwrap();
    f.events.wait_for("/tasks/exit");
}

#[test]
fn issue_24_delete_after_exit_unmounts_and_events_come_in_order() {
    let f = fixture();
    let pid = f.running();
    f.runner.exit(pid, RunExit::CommandFailed);
    f.wait().unwrap();
    f.events.wait_for("/tasks/exit");
    let d = f.delete().unwrap();
    assert_eq!((d.pid, d.exit_status), (pid, 10));
    assert_eq!(f.runner.calls().last().unwrap(), &Call::Unmount(f.rootfs()));
    assert_eq!(
        f.events.topics(),
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/exit",
            "/tasks/delete"
        ]
    );
    assert!(f.events.0.lock().unwrap().iter().all(|e| e.1 == "default"));
    assert_eq!(f.state().unwrap_err().code(), "TS1207");
    assert_eq!(f.delete().unwrap_err().code(), "TS1207");
}

#[test]
fn issue_24_delete_while_running_is_refused_and_the_task_kept() {
    let f = fixture();
    let pid = f.running();
    let e = f.delete().unwrap_err();
    assert_eq!(e.code(), "TS1205");
    assert!(e.to_string().contains("kill it first"), "{e}");
    assert!(
        !f.runner
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Unmount(_)))
    );
    f.runner.exit(pid, RunExit::Committed);
    f.wait().unwrap();
    f.delete().unwrap();
}

#[test]
fn issue_24_a_created_task_is_deleted_without_running() {
    let f = fixture();
    f.spec(&CONTRACT);
    f.create().unwrap();
    let d = f.delete().unwrap();
    assert_eq!((d.pid, d.exit_status), (0, 0));
    assert!(
        !f.runner
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Start { .. }))
    );
    assert_eq!(f.events.topics(), ["/tasks/create", "/tasks/delete"]);
}

#[test]
fn issue_24_start_twice_create_twice_and_other_ids_are_refused() {
    let f = fixture();
    let pid = f.running();
    assert_eq!(f.start().unwrap_err().code(), "TS1205");
    assert_eq!(f.create().unwrap_err().code(), "TS1205");
    fn other<T: std::fmt::Debug>(r: Result<T, ShimError>) -> &'static str {
        r.unwrap_err().code()
    }
    assert_eq!(
        other(f.svc.task_state(&api::StateRequest {
            id: "c2".into(),
            ..Default::default()
        })),
        "TS1207"
    );
    assert_eq!(
        other(f.svc.wait_task(&api::WaitRequest {
            id: "c2".into(),
            ..Default::default()
        })),
        "TS1207"
    );
    assert_eq!(
        other(f.svc.start_task(&api::StartRequest {
            id: ID.into(),
            exec_id: "e1".into(),
            ..Default::default()
        })),
        "TS1207"
    );
    f.runner.exit(pid, RunExit::Committed);
    f.wait().unwrap();
}

#[test]
fn issue_24_the_configured_backend_reaches_check_and_start() {
    let f = fixture_in("default", serde_json::json!({"backend": "runc"}));
    f.running();
    let calls = f.runner.calls();
    assert!(matches!(
        &calls[1],
        Call::Check {
            backend: Some(Backend::Runc),
            ..
        }
    ));
    assert!(matches!(
        &calls[2],
        Call::Start {
            backend: Some(Backend::Runc),
            ..
        }
    ));
    f.kill(15).unwrap();
}

#[test]
fn issue_24_a_violation_is_recorded_then_create_fails_and_unmounts() {
    let f = fixture();
    *f.runner.checked.lock().unwrap() = Checked::Violation {
        violations: "execute /bin/ls is not granted".into(),
    };
    f.spec(&CONTRACT);
    let e = f.create().unwrap_err();
    assert_eq!(e.code(), "E2042");
    let t = e.to_string();
    assert!(
        t.contains("execute /bin/ls") && t.contains("recorded"),
        "{t}"
    );
    let calls = f.runner.calls();
    assert_eq!(calls[2], Call::Record(f.bundle.clone()));
    assert_eq!(calls[3], Call::Unmount(f.rootfs()));
    assert!(f.events.topics().is_empty());
    assert_eq!(f.state().unwrap_err().code(), "TS1207");
}

#[test]
fn issue_25_a_backend_refusal_at_check_fails_create_with_its_message_and_no_retry() {
    for (exit, message, code) in [
        (
            RunExit::Unavailable,
            "supervise: TS1040 BACKEND_TOO_WEAK: `runc` is weaker than untrusted allows",
            "TS1040",
        ),
        (
            RunExit::Unavailable,
            "supervise: E2040 backend `kata` is not installed",
            "E2040",
        ),
        (
            RunExit::BadInput,
            "supervise: TS1001 no such package",
            "TS1204",
        ),
    ] {
        let f = fixture_in("default", serde_json::json!({"backend": "runc"}));
        *f.runner.checked.lock().unwrap() = Checked::Refused {
            exit,
            message: message.into(),
        };
        f.spec(&CONTRACT);
        let e = f.create().unwrap_err();
        assert_eq!(e.code(), code, "{e}");
        assert!(e.to_string().contains(message), "{e}");
        let checks = f
            .runner
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::Check { .. }))
            .count();
        assert_eq!(checks, 1, "never retried with another backend");
        assert_eq!(f.runner.calls().last().unwrap(), &Call::Unmount(f.rootfs()));
        assert!(f.events.topics().is_empty());
    }
}

#[test]
fn issue_24_a_runner_failing_at_create_fails_create_and_keeps_nothing() {
    // At the mount: nothing to undo, no check.
    let f = fixture();
    *f.runner.fail.lock().unwrap() = Some(Step::Mount);
    f.spec(&CONTRACT);
    assert_eq!(f.create().unwrap_err().code(), "TS1208");
    assert!(f.runner.calls().is_empty());
    // At the check, or while recording a violation: unmounted.
    for step in [Step::Check, Step::Record] {
        let f = fixture();
        *f.runner.fail.lock().unwrap() = Some(step);
        *f.runner.checked.lock().unwrap() = Checked::Violation {
            violations: "v".into(),
        };
        f.spec(&CONTRACT);
        let e = f.create().unwrap_err();
        assert_eq!(e.code(), "TS1208", "{step:?}: {e}");
        assert!(e.to_string().contains("injected failure"), "{e}");
        assert_eq!(f.runner.calls().last().unwrap(), &Call::Unmount(f.rootfs()));
        assert!(f.events.topics().is_empty());
        assert_eq!(f.state().unwrap_err().code(), "TS1207");
    }
}

#[test]
fn issue_24_a_runner_failing_at_start_leaves_the_task_created() {
    let f = fixture();
    f.spec(&CONTRACT);
    f.create().unwrap();
    *f.runner.fail.lock().unwrap() = Some(Step::Start);
    assert_eq!(f.start().unwrap_err().code(), "TS1208");
    assert_eq!(f.events.topics(), ["/tasks/create"], "no TaskStart");
    let s = f.state().unwrap();
    assert_eq!((s.status, s.pid), (api::Status::CREATED.into(), 0));
    // It can be deleted (and unmounted) as never started.
    f.delete().unwrap();
    assert_eq!(f.runner.calls().last().unwrap(), &Call::Unmount(f.rootfs()));
}

#[test]
fn issue_24_a_runner_failing_at_wait_ends_the_task_with_255() {
    let f = fixture();
    f.spec(&CONTRACT);
    f.create().unwrap();
    *f.runner.fail.lock().unwrap() = Some(Step::Wait);
    f.start().unwrap();
    assert_eq!(f.wait().unwrap().exit_status, 255);
    f.events.wait_for("/tasks/exit");
    assert_eq!(f.events.exit_event().exit_status, 255);
    f.delete().unwrap();
}

#[test]
fn issue_24_a_runner_failing_at_kill_fails_kill_and_the_turn_runs_on() {
    let f = fixture();
    let pid = f.running();
    *f.runner.fail.lock().unwrap() = Some(Step::Signal);
    assert_eq!(f.kill(15).unwrap_err().code(), "TS1208");
    assert_eq!(f.state().unwrap().status, api::Status::RUNNING.into());
    f.runner.exit(pid, RunExit::Committed);
    assert_eq!(f.wait().unwrap().exit_status, 0);
}

#[test]
fn issue_24_a_runner_failing_at_delete_keeps_the_sandbox_for_a_retry() {
    let f = fixture_in(crate::cri::CRI_CONTAINERD_NAMESPACE, serde_json::json!({}));
    f.spec(&[
        (cri::CRI_CONTAINER_TYPE, cri::CRI_SANDBOX),
        (cri::CRI_SANDBOX_ID, ID),
    ]);
    assert_eq!(f.create().unwrap().pid, 777);
    assert_eq!(f.start().unwrap(), 777);
    f.runner.exit(777, RunExit::Signaled(9));
    assert_eq!(f.wait().unwrap().exit_status, 137);
    *f.runner.fail.lock().unwrap() = Some(Step::SandboxDelete);
    assert_eq!(f.delete().unwrap_err().code(), "TS1208");
    assert!(f.state().is_ok(), "kept for a retry");
    *f.runner.fail.lock().unwrap() = None;
    f.delete().unwrap();
    let calls = f.runner.calls();
    assert_eq!(
        calls,
        [
            Call::Mount {
                rootfs: f.rootfs(),
                mounts: 1
            },
            Call::SandboxCreate(ID.into()),
            Call::SandboxStart(ID.into(), 777),
            Call::SandboxDelete(ID.into()),
            Call::Unmount(f.rootfs()),
        ]
    );
}

#[test]
fn issue_24_a_sandbox_that_runc_cannot_create_is_cleaned_up() {
    let f = fixture_in(crate::cri::CRI_CONTAINERD_NAMESPACE, serde_json::json!({}));
    f.spec(&[
        (cri::CRI_CONTAINER_TYPE, cri::CRI_SANDBOX),
        (cri::CRI_SANDBOX_ID, ID),
    ]);
    *f.runner.fail.lock().unwrap() = Some(Step::SandboxCreate);
    assert_eq!(f.create().unwrap_err().code(), "TS1208");
    assert_eq!(
        f.runner.calls()[1..],
        [Call::SandboxDelete(ID.into()), Call::Unmount(f.rootfs())]
    );
    assert!(f.events.topics().is_empty());
}

#[test]
fn issue_24_missing_and_bad_annotations_fail_create_before_any_runner_call() {
    for (ann, code, named) in [
        (vec![(PACKAGE, "bb"), (OUTPUTS, "[]")], "TS1201", WORKSPACE),
        (vec![(WORKSPACE, "ws"), (OUTPUTS, "[]")], "TS1201", PACKAGE),
        (vec![(WORKSPACE, "ws"), (PACKAGE, "bb")], "TS1201", OUTPUTS),
        (
            vec![(WORKSPACE, "ws"), (PACKAGE, "bb"), (OUTPUTS, "{")],
            "TS1201",
            OUTPUTS,
        ),
        (
            vec![
                (WORKSPACE, "ws"),
                (PACKAGE, "bb"),
                (OUTPUTS, "[]"),
                (SESSION, " "),
            ],
            "TS1201",
            SESSION,
        ),
    ] {
        let f = fixture();
        f.spec(&ann);
        let e = f.create().unwrap_err();
        assert!(e.to_string().contains(named), "{named}: {e}");
        f.assert_refused_cleanly(&e, code, &[]);
    }
    // A terminal is refused from the request alone.
    let f = fixture();
    f.spec(&CONTRACT);
    let mut req = f.request();
    req.terminal = true;
    let e = f.svc.create_task(&req).unwrap_err();
    f.assert_refused_cleanly(&e, "TS1202", &[]);
}

#[test]
fn issue_25_a_workspace_path_is_refused_with_nothing_mounted_or_created() {
    for value in ["/etc", "/tmp/ts-hostile-never-created", "ws/..", "..", ""] {
        let f = fixture();
        // The host path the pod names exists and is the very workspace:
        // still refused — a path is never a name.
        let as_path = f.ws.display().to_string();
        for v in [value, as_path.as_str()] {
            let mut ann = CONTRACT.to_vec();
            ann[0] = (WORKSPACE, v);
            f.spec(&ann);
            let e = f.create().unwrap_err();
            assert!(e.to_string().contains(WORKSPACE), "{e}");
            f.assert_refused_cleanly(&e, "TS1043", &[]);
        }
        assert!(!Path::new("/tmp/ts-hostile-never-created").exists());
    }
}

/// Red-team finding (wave 3): a client of any containerd namespace but the
/// CRI plugin's wrote both sandbox annotations (its own id as the sandbox
/// id) and had its container run through plain runc, outside every turn.
/// Now refused before anything is mounted or run.
#[test]
fn the_sandbox_exemption_holds_only_in_the_cri_namespace() {
    for ns in ["default", "tenant-b"] {
        let f = fixture_in(ns, serde_json::json!({}));
        f.spec(&[
            (cri::CRI_CONTAINER_TYPE, cri::CRI_SANDBOX),
            (cri::CRI_SANDBOX_ID, ID),
        ]);
        let e = f.create().unwrap_err();
        assert!(e.to_string().contains("k8s.io"), "{e}");
        f.assert_refused_cleanly(&e, "TS1202", &[]);
    }
}

#[test]
fn issue_25_an_unknown_io_turnstile_annotation_is_refused_even_on_a_sandbox() {
    let f = fixture();
    let mut ann = CONTRACT.to_vec();
    ann.push(("io.turnstile.foo", "bar"));
    f.spec(&ann);
    let e = f.create().unwrap_err();
    assert!(e.to_string().contains("io.turnstile.foo"), "{e}");
    f.assert_refused_cleanly(&e, "TS1047", &[]);
    let f = fixture_in(crate::cri::CRI_CONTAINERD_NAMESPACE, serde_json::json!({}));
    f.spec(&[
        (cri::CRI_CONTAINER_TYPE, cri::CRI_SANDBOX),
        (cri::CRI_SANDBOX_ID, ID),
        ("io.turnstile.workspace-root", "/etc"),
    ]);
    let e = f.create().unwrap_err();
    f.assert_refused_cleanly(&e, "TS1047", &[]);
}

#[test]
fn issue_25_an_unknown_name_or_a_namespace_not_listed_is_refused() {
    let f = fixture();
    let mut ann = CONTRACT.to_vec();
    ann[0] = (WORKSPACE, "other-tenant");
    f.spec(&ann);
    let e = f.create().unwrap_err();
    assert!(!e.to_string().contains(f.ws.to_str().unwrap()), "{e}");
    f.assert_refused_cleanly(&e, "TS1044", &[]);
    // `ws` is for `default` only.
    let f = fixture_in("tenant-b", serde_json::json!({}));
    f.spec(&CONTRACT);
    let e = f.create().unwrap_err();
    assert!(e.to_string().contains("tenant-b"), "{e}");
    assert!(
        !e.to_string().contains(f.ws.to_str().unwrap()),
        "no root leaked: {e}"
    );
    f.assert_refused_cleanly(&e, "TS1045", &[]);
}

#[test]
fn issue_25_on_the_cri_path_the_pods_namespace_is_checked() {
    let cri = |pod_ns: &'static str| {
        let mut ann = CONTRACT.to_vec();
        ann.extend([
            (cri::CRI_CONTAINER_TYPE, "container"),
            (cri::CRI_SANDBOX_ID, "sb1"),
            (cri::CRI_SANDBOX_NAMESPACE, pod_ns),
        ]);
        ann
    };
    // containerd's namespace is k8s.io for every pod: the pod's counts.
    let f = fixture_in("k8s.io", serde_json::json!({}));
    f.spec(&cri("default"));
    f.create().unwrap();
    let f = fixture_in("k8s.io", serde_json::json!({}));
    f.spec(&cri("kube-system"));
    let e = f.create().unwrap_err();
    f.assert_refused_cleanly(&e, "TS1045", &[]);
    // A CRI container whose pod namespace is missing.
    let f = fixture_in("k8s.io", serde_json::json!({}));
    f.spec(&cri(""));
    let e = f.create().unwrap_err();
    f.assert_refused_cleanly(&e, "TS1049", &[]);
}

#[test]
fn issue_25_a_symlinked_or_missing_root_is_refused() {
    let f = fixture();
    let link = f.dir.path().join("link");
    std::os::unix::fs::symlink(&f.ws, &link).unwrap();
    let options = serde_json::json!({
        "state_dir": f.dir.path().join("state"),
        "workspaces": {
            "ws": {"root": link},
            "gone": {"root": f.dir.path().join("gone")},
        },
    });
    std::fs::write(f.dir.path().join("shim.json"), options.to_string()).unwrap();
    f.spec(&CONTRACT);
    let e = f.create().unwrap_err();
    assert!(e.to_string().contains("symlink"), "{e}");
    f.assert_refused_cleanly(&e, "TS1046", &[]);
    let mut ann = CONTRACT.to_vec();
    ann[0] = (WORKSPACE, "gone");
    f.spec(&ann);
    let e = f.create().unwrap_err();
    f.assert_refused_cleanly(&e, "TS1046", &[]);
    assert!(!f.dir.path().join("gone").exists());
}

#[test]
fn issue_25_malformed_options_fail_create_naming_the_field() {
    for (options, code, field) in [
        (
            serde_json::json!({"workspaces": ["ws"]}),
            "TS1048",
            "`workspaces`",
        ),
        (
            serde_json::json!({"workspaces": {"ws": {"namespaces": ["a"]}}}),
            "TS1048",
            "`workspaces.ws.root`",
        ),
        (
            serde_json::json!({"workspaces": {"ws": {"root": "/srv", "namespaces": "a"}}}),
            "TS1048",
            "`workspaces.ws.namespaces`",
        ),
        (serde_json::json!({"backend": "docker"}), "TS1203", "docker"),
    ] {
        let f = fixture();
        std::fs::write(f.dir.path().join("shim.json"), options.to_string()).unwrap();
        f.spec(&CONTRACT);
        let e = f.create().unwrap_err();
        assert!(e.to_string().contains(field), "{field}: {e}");
        f.assert_refused_cleanly(&e, code, &[]);
    }
}
