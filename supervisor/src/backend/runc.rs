//! The runc backend: the same turn, run by an OCI runtime (issue 10).
//!
//! `create` mounts each writable scope's overlay (lower: the host
//! directory; upper and work: the turn's scratch tmpfs) under the turn dir,
//! creates the turn's cgroup (runc joins it through `linux.cgroupsPath`, so
//! limits, usage, killing and cleanup are the native backend's), writes the
//! bundle (`turnstile_oci::build`) into the turn dir and runs `runc run
//! --detach` with the posture handshake passed as fds 3 and 4
//! (`--preserve-fds 2`). One runtime invocation, not `create` then `start`:
//! the command cannot start before the supervisor's go anyway (turnstile's
//! init parks on fd 4), and each invocation of the runtime costs about
//! 10 ms (bench/RESULTS.md). The container's process is turnstile's init
//! (`supervise __landlock-exec`, bound read-only): it applies the Plan's
//! Landlock rules, reports the outcome on fd 3 and waits on fd 4; the
//! supervisor checks its posture from outside (seccomp filter, no_new_privs,
//! no capability, uid 65534, its own namespaces) and only then lets it exec
//! the command. The supervisor is the container's child subreaper, so it
//! waits for the command itself; on return the cgroup is empty, the
//! container deleted and the overlays unmounted. A supervisor killed
//! meanwhile (SIGKILL included) leaves that to the turn's guard
//! ([`super::hostview::Guard`], started before anything of the turn
//! exists), within milliseconds of its death.
//!
//! Differences from native, recorded as degradations: the workspace is not
//! idmapped (runc 1.1 has no idmapped mounts: the owner's DAC bits apply to
//! uid 65534), and seccomp refusals are plain errnos (no listener: denials
//! are not observed).

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use turnstile_policy::plan::Plan;

use super::runtime::Driver;
use super::{Backend, Sandbox};
use crate::error::{Result, SupervisorError};
use crate::sandbox::cgroup::Place;
use crate::sandbox::{Ending, Execution, TurnDir, Watch, cgroup, init, posture::Posture};
use turnstile_oci::{Runtime, RuntimeCmd};

use crate::sandbox::sandbox_err as err;

pub use super::hostview::{GUARD, guard_main};

/// An OCI runtime binary driven through its CLI: runc, or crun (the same
/// command line).
#[derive(Debug, Clone)]
pub struct RuncBackend {
    /// runc or crun.
    runtime: &'static str,
    driver: Driver,
    cgroup_place: Place,
    json_mode: bool,
}

impl RuncBackend {
    /// The runc backend, or E2040 when runc is not installed.
    pub fn new(cgroup_place: &Place, json_mode: bool) -> Result<Self> {
        Self::named("runc", cgroup_place, json_mode)
    }

    /// `runtime` (runc or crun), or E2040 when it is not installed.
    pub fn named(runtime: &'static str, cgroup_place: &Place, json_mode: bool) -> Result<Self> {
        let which = Runtime::parse(runtime)
            .filter(|r| *r != Runtime::Runsc)
            .ok_or_else(|| {
                SupervisorError::invalid("--backend", format!("`{runtime}` is not runc or crun"))
            })?;
        Ok(Self {
            runtime,
            driver: Driver::locate(which)?,
            cgroup_place: cgroup_place.clone(),
            json_mode,
        })
    }
}

/// A runc container parked before the command (see the module doc).
struct RuncSandbox {
    /// The turn's registration with the denial observer (the container's
    /// processes are in the turn's cgroup: runc joins it in every
    /// hierarchy, the hybrid layout's unified one too).
    observation: std::result::Result<crate::sandbox::observe::Registration, String>,
    backend: RuncBackend,
    id: String,
    pid: i32,
    log: PathBuf,
    cg: Arc<cgroup::TurnCgroup>,
    view: Option<super::hostview::HostView>,
    go: Option<OwnedFd>,
    watch: Option<Watch>,
    posture: Option<Posture>,
    landlock: Option<Value>,
    laps: super::hostview::Laps,
    uppers: Vec<PathBuf>,
    scratch: PathBuf,
    torn_down: bool,
    /// The container's init was reaped (by [`super::hostview::reap`]):
    /// its PID namespace, and so every process of the container, is gone.
    reaped: bool,
    /// Ends the turn if the supervisor dies; disarmed once torn down.
    guard: Option<super::hostview::Guard>,
    /// A `restricted` / `allow_egress` turn's egress, in the container's
    /// network namespace.
    egress: Option<crate::sandbox::egress::Running>,
}

impl Backend for RuncBackend {
    fn name(&self) -> &'static str {
        self.runtime
    }

    fn applied_by(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "namespaces",
                "the OCI runtime: the bundle's linux.namespaces (mount, pid, ipc, uts, net, cgroup)",
            ),
            (
                "rootfs_view",
                "the OCI runtime: the bundle's mounts over a read-only rootfs skeleton the supervisor wrote",
            ),
            (
                "landlock",
                "turnstile's init inside the container (__landlock-exec) restricts itself before exec",
            ),
            (
                "seccomp",
                "the OCI runtime: the bundle's linux.seccomp (no listener: refusals are plain errnos)",
            ),
            (
                "capabilities",
                "the OCI runtime: empty process.capabilities; checked by the supervisor from outside before exec",
            ),
            (
                "no_new_privs",
                "the OCI runtime: process.noNewPrivileges; checked from outside before exec",
            ),
            (
                "cgroup_limits",
                "supervisor: the turn's cgroup, which the runtime joins through linux.cgroupsPath",
            ),
            (
                "identity",
                "the OCI runtime: process.user 65534 (the workspace is not idmapped)",
            ),
        ]
    }

    fn enforces_network(
        &self,
        network: turnstile_policy::manifest::Network,
    ) -> std::result::Result<(), String> {
        super::egress_in_own_netns(network)
    }

    fn create(&self, plan: &Arc<Plan>, turn: &TurnDir) -> Result<Box<dyn Sandbox>> {
        // The container's processes become ours when runc exits.
        nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| err("become subreaper", e.to_string()))?;
        let id = format!("{}-t{}", plan.session_id, plan.turn_number);
        // First: from here a SIGKILLed supervisor's turn is ended by its
        // guard, not left to the next recovery.
        let guard =
            super::hostview::Guard::spawn(self.runtime, &id, &turn.path, &self.cgroup_place)?;
        let cg = Arc::new(cgroup::TurnCgroup::create(
            &self.cgroup_place,
            &id,
            &plan.limits,
        )?);
        let _ = cg.publish(&crate::store::record::running_cgroup_file(&turn.path));
        crate::sandbox::observe::preload();
        let mut sb = RuncSandbox {
            observation: Err("the container never started".into()),
            backend: self.clone(),
            id: id.clone(),
            pid: 0,
            log: turn.path.join(format!("{}.log", self.runtime)),
            cg: Arc::clone(&cg),
            view: None,
            go: None,
            watch: None,
            posture: None,
            landlock: None,
            laps: super::hostview::Laps::new(),
            uppers: (0..plan.writable_scopes.len())
                .map(|i| turn.upper(i))
                .collect(),
            scratch: turn.path.join(init::SCRATCH_DIR),
            torn_down: false,
            reaped: false,
            guard: Some(guard),
            egress: None,
        };
        // Drop tears down whatever was built if a step below fails.
        let view = sb
            .view
            .insert(super::hostview::HostView::mount(plan, turn)?);
        let (bundle_dir, bundle) =
            view.bundle(plan, turn, self.runtime, &id, &self.cgroup_place)?;
        super::bundle::write(&bundle_dir, &bundle, 0)?;
        sb.lap("bundle");

        // The handshake: fds 3 (ready) and 4 (go) in the container.
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| err("pipe", e.to_string()))
        };
        let (ready_r, ready_w) = pipe()?;
        let (go_r, go_w) = pipe()?;
        let (rw, gr) = (ready_w.as_raw_fd(), go_r.as_raw_fd());
        let pid_file = turn.path.join("runc.pid");
        let create = RuntimeCmd::RunDetached {
            bundle: &bundle_dir,
            pid_file: &pid_file,
            id: &id,
            preserve_fds: 2,
        };
        let mut cmd = self.driver.command(&create, &sb.log)?;
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        // SAFETY: after fork, only dup2(2) of descriptors opened before the
        // fork (async-signal-safe); errors are returned as raw errno.
        unsafe {
            cmd.pre_exec(move || {
                for (from, to) in [(rw, 3), (gr, 4)] {
                    if nix::libc::dup2(from, to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        // Nothing of the container exists before its guard is waiting.
        if let Some(g) = sb.guard.as_mut() {
            g.confirm()?;
        }
        let mut child = cmd.spawn().map_err(|e| err("start runc", e.to_string()))?;
        drop(ready_w);
        drop(go_r);
        if let (Some(out), Some(errs)) = (child.stdout.take(), child.stderr.take()) {
            sb.watch = Some(Watch::pumps(
                out,
                errs,
                plan.output_budget(),
                self.json_mode,
                false,
            ));
        }
        // The step errors name the runtime that ran (this type drives crun
        // too).
        let step = if self.runtime == "crun" {
            "crun run"
        } else {
            "runc run"
        };
        let status = child.wait().map_err(|e| err(step, e.to_string()))?;
        if !status.success() {
            let logged = std::fs::read_to_string(&sb.log).unwrap_or_default();
            return Err(err(
                step,
                logged.lines().last().unwrap_or("failed").to_owned(),
            ));
        }
        sb.pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| err(step, "no pid file"))?;
        sb.lap("runtime_run");
        // Egress by name in the container's own network namespace (made
        // by the runtime, empty), before the command may run: a setup that
        // fails refuses the turn.
        if plan.network != "isolated" {
            let running = crate::sandbox::egress::start_for(sb.pid, &plan.network, &plan.egress)
                .map_err(|e| err("network egress", e))?;
            sb.egress = Some(running);
            sb.lap("egress");
        }
        // The timer, from here.
        if let Some(w) = sb.watch.as_mut() {
            w.start_timer(
                Arc::clone(&cg),
                Duration::from_secs(plan.limits.timeout_seconds),
            );
        }
        sb.go = Some(go_w);
        // Our init applied Landlock and reports before parking.
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        let mut ready = std::fs::File::from(ready_r);
        while let Ok(1) = ready.read(&mut byte) {
            if byte[0] == b'\n' {
                break;
            }
            line.push(byte[0]);
        }
        sb.lap("init_until_ready");
        // `crun run --detach` can return while the container's process is
        // still the child of an intermediate crun process (seen in about 1
        // turn in 10): it must be ours (we are the subreaper) before the
        // command may run, or another process reaps its exit status. Our
        // init is parked on fd 4, so it is alive while we wait here.
        let deadline = Instant::now() + Duration::from_secs(2);
        while crate::sandbox::posture::parent_of(Path::new("/proc"), sb.pid)
            != Some(std::process::id())
        {
            if Instant::now() > deadline {
                return Err(err(
                    step,
                    format!(
                        "the container's process {} never became the supervisor's child",
                        sb.pid
                    ),
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        if let Ok(v) = serde_json::from_slice::<Value>(&line) {
            sb.landlock = Some(v);
            sb.posture = Some(crate::sandbox::posture::check(
                Path::new("/proc"),
                sb.pid,
                plan.uid,
                plan.gid,
                std::process::id(),
            ));
        }
        Ok(Box::new(sb))
    }
}

impl RuncSandbox {
    fn lap(&mut self, name: &'static str) {
        self.laps.lap(name);
    }

    fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        let empty = self.stop();
        self.release(empty);
    }

    /// Ends every process of the turn and stops the watch; whether the
    /// cgroup is empty.
    fn stop(&mut self) -> bool {
        self.go.take();
        let empty = self.cg.kill_all();
        if let Some(w) = self.watch.as_mut() {
            w.stop();
        }
        empty
    }

    /// Removes what the container leaves once its processes are gone: the
    /// runtime's record, the host view, the cgroups; then lets the guard go.
    fn release(&mut self, empty: bool) {
        // A container known stopped needs no `delete` process (a runtime
        // starting again, ~10 ms of runc's): its record is removed here.
        let removed = self.reaped
            && empty
            && super::runtime::remove_stopped_record(self.backend.driver.runtime, &self.id);
        if !removed {
            let _ = self
                .backend
                .driver
                .run(&RuntimeCmd::Delete { id: &self.id }, &self.log);
        }
        if let Some(view) = self.view.as_mut() {
            view.unmount();
        }
        self.cg.kill_all();
        self.cg.remove();
        cgroup::TurnCgroup::sweep_unmanaged(&self.backend.cgroup_place, &self.id);
        if let Some(mut guard) = self.guard.take() {
            guard.disarm();
        }
    }
}

impl Drop for RuncSandbox {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The cgroup v2 id of the container's process `pid`, read from where it
/// actually is (`/proc/PID/cgroup`): a runtime that left it outside a
/// cgroup of the turn's own (crun on the hybrid layout stays in the
/// unified root) is refused, never attributed by a shared cgroup.
fn container_cgroup_id(
    cgroup_place: &Place,
    pid: i32,
    name: &str,
) -> std::result::Result<u64, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| format!("reading the container's cgroup: {e}"))?;
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("the container's process is in no cgroup v2")?;
    if !path.ends_with(&format!("/{name}")) {
        return Err(format!(
            "the container's process is in cgroup v2 `{path}`, not one of the turn's own, so its denials cannot be attributed"
        ));
    }
    let root = &cgroup_place.root;
    let base = match cgroup::detect(root) {
        Some(cgroup::Version::V2) => root.clone(),
        _ => root.join("unified"),
    };
    crate::sandbox::observe::cgroup_id(&base.join(path.trim_start_matches('/'))).ok_or_else(|| {
        format!(
            "the container's cgroup `{path}` is not under {}",
            base.display()
        )
    })
}

impl Sandbox for RuncSandbox {
    fn posture(&self) -> Option<&Posture> {
        self.posture.as_ref()
    }

    fn start(&mut self) {
        self.laps.skip();
        match (&self.posture, self.go.take()) {
            (Some(p), Some(go)) if p.ok() => {
                self.observation = crate::sandbox::observe::get().and_then(|o| {
                    let mut id =
                        container_cgroup_id(&self.backend.cgroup_place, self.pid, &self.id);
                    if id.is_err() {
                        // crun on the hybrid layout leaves the unified
                        // hierarchy alone: the container's parked process
                        // joins the turn's v2 directory (its children follow).
                        if let Some(dir) = self.cg.v2_dir() {
                            let _ = cgroup::write_control(
                                &dir.join("cgroup.procs"),
                                &self.pid.to_string(),
                            );
                            id =
                                container_cgroup_id(&self.backend.cgroup_place, self.pid, &self.id);
                        }
                    }
                    let id = id?;
                    o.register(id, crate::sandbox::observe::learning())
                });
                let _ = nix::unistd::write(&go, b"G");
            }
            _ => {
                self.cg.kill_all();
            }
        }
    }

    fn signal(&self, signal: Signal) {
        self.cg.signal_all(signal);
    }

    fn wait(mut self: Box<Self>) -> Result<Execution> {
        self.go.take();
        let ending = super::hostview::reap(self.pid, self.backend.runtime, "container");
        self.reaped = matches!(ending, Ending::Exited(_) | Ending::Signaled { .. });
        self.lap("command_and_exit");
        let empty = self.cg.kill_all();
        let egress = self
            .egress
            .take()
            .map(crate::sandbox::egress::Running::finish);
        let observed = std::mem::replace(&mut self.observation, Err(String::new()))
            .map(crate::sandbox::observe::Registration::finish)
            .map_err(|why| format!("{}: {why}", self.backend.runtime));
        let usage = self.cg.usage();
        let version = self.cg.version;
        let empty = self.stop() && empty;
        let (stdout, stderr) = self.watch.as_mut().map(Watch::streams).unwrap_or_default();
        if !empty {
            self.teardown();
            return Err(err("teardown", "processes of the turn survived SIGKILL"));
        }
        let disk_full = crate::sandbox::scratch_full(&self.scratch);
        let landlock = self.landlock.clone();
        // No report: our init ended (or was killed) before the command
        // existed — the sandbox failed to start, as natively, not a
        // command that failed.
        let ending = match ending {
            Ending::Exited(code) if landlock.is_none() && self.posture.is_none() => {
                Ending::SetupFailed {
                    stage: "init".into(),
                    detail: format!(
                        "turnstile's init in the container never reported (it exited {code}; {} log: see the turn dir)",
                        self.backend.runtime
                    ),
                }
            }
            Ending::Signaled { name, .. } if landlock.is_none() && self.posture.is_none() => {
                Ending::SetupFailed {
                    stage: "init".into(),
                    detail: format!(
                        "turnstile's init in the container never reported (it was killed by {name})"
                    ),
                }
            }
            other => other,
        };
        let (phases, wall) = self.laps.take();
        Ok(Execution {
            ending,
            timed_out: self.watch.as_ref().is_some_and(Watch::timed_out),
            usage,
            cgroup_version: version,
            landlock,
            report: Vec::new(),
            stdout,
            stderr,
            output_truncated: self.watch.as_ref().is_some_and(Watch::truncated),
            disk_full,
            posture: self.posture.take(),
            phases,
            seccomp_unknown: Vec::new(),
            wall,
            uppers: std::mem::take(&mut self.uppers),
            ephemeral: serde_json::Map::new(),
            denials: Err(format!(
                "{}: seccomp refusals are plain errnos (no listener), so they are not observed",
                self.backend.runtime
            )),
            observed,
            degraded: vec![
                format!(
                    "{}: what the turn leaves in /dev/shm, /tmp and /var/tmp is discarded but not recorded",
                    self.backend.runtime
                ),
                format!(
                    "{}: syscalls newer than its libseccomp (2.5.4) fall to ENOSYS (the native backend compiles them by number)",
                    self.backend.runtime
                ),
            ],
            warm: false,
            egress,
            // The runtime's record, the view and the cgroups go after the
            // turn's finish entries (see `Deferred`). Its processes were
            // stopped above and the cgroup found empty: only the release is
            // left (the drop that follows finds it torn down).
            teardown: crate::sandbox::Deferred::new(move || {
                let mut sandbox = self;
                sandbox.torn_down = true;
                sandbox.release(true);
            }),
        })
    }

    fn delete(mut self: Box<Self>) {
        self.teardown();
    }
}
