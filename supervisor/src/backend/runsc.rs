//! The runsc (gVisor) backend: the same turn, behind gVisor's sentry.
//!
//! The host side is the runc backend's ([`super::hostview`]: the
//! idmapped workspace and one overlay per writable scope, captured the
//! same way) and the bundle is the same Plan's, with two differences
//! gVisor imposes: read-only directories are binds (gVisor mounts no
//! overlayfs from a bundle; its gofer refuses host unix sockets instead),
//! and turnstile's init reports through stderr (runsc cannot pass extra
//! descriptors in, and the host sees only the sentry, so the init checks
//! its own posture — what gVisor's kernel reports — before it execs the
//! command; see `sandbox::landlock_exec`).
//!
//! The lifecycle maps one to one: `runsc create` (sandbox and gofer up,
//! the command not started), `runsc start`, wait, `runsc delete --force`.
//! The sandbox joins the turn's cgroup through `linux.cgroupsPath`, so
//! limits, usage, the timer's kill and the final sweep are the native
//! backend's. The supervisor is the child subreaper, so the sandbox
//! process becomes its child when `runsc create` exits, and its exit
//! status is the command's — `runsc wait` is not used: once the sandbox is
//! gone it answers "exit status unavailable" (measured, in about 1 turn in
//! 50). The sandbox reports death by signal N as 128+N: statuses 129..=192
//! are recorded as that signal.
//!
//! gVisor has no Landlock (ENOSYS): the layer is reported unenforceable
//! ([`Backend::cannot_enforce`]), so the turn is refused before anything
//! runs unless the manifest's `allow_degraded` lists `landlock`; then the
//! init runs without it and the evidence says so.
//!
//! A supervisor killed during the turn (SIGKILL included) leaves the
//! sandbox, its record and the turn's mounts to the turn's guard
//! ([`super::hostview::Guard`]), which removes them within a second.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use turnstile_oci::REPORT_PREFIX;
use turnstile_policy::plan::Plan;

use super::runtime::Driver;
use super::{Backend, Sandbox};
use crate::error::Result;
use crate::sandbox::sandbox_err as err;
use crate::sandbox::{Ending, Execution, TurnDir, Watch, cgroup, init, posture::Posture};
use turnstile_oci::{Runtime, RuntimeCmd};

/// The runtime's `--root` (its state).
/// runsc's state (the driver's root for it).
const ROOT: &str = "/run/turnstile/runsc";

/// Host tasks gVisor itself needs in the turn's cgroup (the sentry's and
/// the gofer's threads, the ptrace stubs), added to the Plan's pids limit:
/// with the Plan's limit alone the sentry hits `pids.max` while it boots
/// and `runsc start` never returns (measured: 64 pids, `pids.events max 1`).
pub const PIDS_OVERHEAD: u32 = 256;

#[derive(Debug, Clone)]
pub struct RunscBackend {
    driver: Driver,
    cgroup_place: crate::sandbox::cgroup::Place,
    json_mode: bool,
}

impl RunscBackend {
    /// The runsc backend, or E2040 when runsc is not installed.
    pub fn new(cgroup_place: &crate::sandbox::cgroup::Place, json_mode: bool) -> Result<Self> {
        Ok(Self {
            driver: Driver::locate(Runtime::Runsc)?,
            cgroup_place: cgroup_place.clone(),
            json_mode,
        })
    }

    fn output(&self, cmd: &RuntimeCmd<'_>, log: &Path) -> Result<Vec<u8>> {
        self.driver.run(cmd, log)
    }
}

/// stderr of the sandbox, with the init's report line taken out of it:
/// the first line, if it starts with [`REPORT_PREFIX`], goes to `slot`;
/// everything else passes through unchanged.
struct ReportReader<R> {
    inner: R,
    scanning: Option<Vec<u8>>,
    pending: Vec<u8>,
    slot: Arc<Mutex<Option<Value>>>,
}

/// The longest report line accepted (the rest passes through as output).
const REPORT_MAX: usize = 64 * 1024;

impl<R: Read> ReportReader<R> {
    fn scan(&mut self) -> std::io::Result<()> {
        let Some(mut seen) = self.scanning.take() else {
            return Ok(());
        };
        let mut buf = [0u8; 4096];
        loop {
            if let Some(nl) = seen.iter().position(|b| *b == b'\n') {
                let line = &seen[..nl];
                match line
                    .strip_prefix(REPORT_PREFIX.as_bytes())
                    .and_then(|j| serde_json::from_slice::<Value>(j).ok())
                {
                    Some(report) => {
                        if let Ok(mut s) = self.slot.lock() {
                            *s = Some(report);
                        }
                        self.pending = seen[nl + 1..].to_vec();
                    }
                    None => self.pending = seen,
                }
                return Ok(());
            }
            if seen.len() > REPORT_MAX {
                self.pending = seen;
                return Ok(());
            }
            match self.inner.read(&mut buf) {
                Ok(0) => {
                    self.pending = seen;
                    return Ok(());
                }
                Ok(n) => seen.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.pending = seen;
                    return Err(e);
                }
            }
        }
    }
}

impl<R: Read> Read for ReportReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.scan()?;
        if !self.pending.is_empty() {
            let n = buf.len().min(self.pending.len());
            buf[..n].copy_from_slice(&self.pending[..n]);
            self.pending.drain(..n);
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

/// A runsc sandbox, created (sentry and gofer up), the command not started.
struct RunscSandbox {
    backend: RunscBackend,
    id: String,
    log: PathBuf,
    cg: Arc<cgroup::TurnCgroup>,
    view: Option<super::hostview::HostView>,
    watch: Option<Watch>,
    /// The sandbox process (our child once `runsc create` exits).
    pid: i32,
    /// The gofer (our child too), from runsc's state file.
    gofer: Option<i32>,
    report: Arc<Mutex<Option<Value>>>,
    timeout: Duration,
    start_failed: Option<String>,
    laps: super::hostview::Laps,
    uppers: Vec<PathBuf>,
    scratch: PathBuf,
    created: bool,
    torn_down: bool,
    /// Ends the turn if the supervisor dies; disarmed once torn down.
    guard: Option<super::hostview::Guard>,
    /// The turn's egress (`restricted` / `allow_egress`), in the sandbox's
    /// network namespace.
    egress: Option<crate::sandbox::egress::Running>,
    /// The network policy runs on hostinet (`--network=host`).
    hostinet: bool,
}

impl Backend for RunscBackend {
    fn name(&self) -> &'static str {
        "runsc"
    }

    fn applied_by(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "namespaces",
                "gVisor: the turn's processes run on the sentry's kernel, itself in the sandbox's host namespaces",
            ),
            (
                "rootfs_view",
                "gVisor's gofer: the bundle's mounts over a read-only rootfs skeleton the supervisor wrote",
            ),
            (
                "seccomp",
                "gVisor's sentry: the bundle's filter installed inside the sandbox (--oci-seccomp); refusals answer EPERM",
            ),
            (
                "capabilities",
                "gVisor: empty process.capabilities; checked by turnstile's init inside the sandbox",
            ),
            (
                "no_new_privs",
                "gVisor: process.noNewPrivileges; checked by turnstile's init inside the sandbox",
            ),
            (
                "cgroup_limits",
                "supervisor: the turn's cgroup, which the sandbox (sentry and gofer too) joins",
            ),
            ("identity", "gVisor: process.user 65534"),
        ]
    }

    fn not_applied(&self) -> Vec<(&'static str, &'static str)> {
        vec![(
            "landlock",
            "gVisor implements no Landlock (its syscalls answer ENOSYS inside the sandbox)",
        )]
    }

    /// `restricted` / `allow_egress` are enforced by the supervisor's
    /// resolver, nftables and proxy in the turn's own network namespace,
    /// as natively — but only with `--network=host` (hostinet): gVisor's
    /// netstack has its own loopback and sends its packets past the
    /// namespace's nftables (see `sandbox::egress`). That gives up a
    /// layer of gVisor's isolation, so the manifest must accept it
    /// ([`Backend::network_degradation`]).
    fn enforces_network(
        &self,
        network: turnstile_policy::manifest::Network,
    ) -> std::result::Result<(), String> {
        super::egress_in_own_netns(network)
    }

    fn network_degradation(
        &self,
        network: turnstile_policy::manifest::Network,
    ) -> Option<(&'static str, String)> {
        (network != turnstile_policy::manifest::Network::Isolated).then(|| {
            (
                turnstile_policy::manifest::DegradableLayer::GvisorNetstack.as_str(),
                format!("runsc enforces network `{}` only on the host kernel's network stack (--network=host, in the turn's own network namespace), not on gVisor's netstack: the sentry's sockets are then host sockets", network.as_str()),
            )
        })
    }

    fn cannot_enforce(&self) -> Vec<(&'static str, String)> {
        vec![(
            "landlock",
            "gVisor's kernel has no Landlock (its syscalls return ENOSYS)".into(),
        )]
    }

    fn create(&self, plan: &Arc<Plan>, turn: &TurnDir) -> Result<Box<dyn Sandbox>> {
        // The sandbox process becomes ours when `runsc create` exits.
        nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| err("become subreaper", e.to_string()))?;
        let id = format!("{}-t{}", plan.session_id, plan.turn_number);
        // A turn with egress runs on hostinet, in the spec's (new, empty)
        // network namespace, where the supervisor's egress is set up
        // below; `check_network` refused it unless the manifest accepts
        // that (`allow_degraded: gvisor_netstack`).
        let hostinet = plan.network != "isolated";
        if hostinet
            && !plan
                .allow_degraded
                .iter()
                .any(|l| l == turnstile_policy::manifest::DegradableLayer::GvisorNetstack.as_str())
        {
            return Err(err(
                "network egress",
                format!(
                    "runsc runs network `{}` only on hostinet, which the manifest's `allow_degraded` does not list (gvisor_netstack)",
                    plan.network
                ),
            ));
        }
        let mut backend = self.clone();
        if hostinet {
            backend.driver = backend.driver.host_network();
        }
        // First: from here a SIGKILLed supervisor's turn is ended by its
        // guard (`runsc delete --force`, the cgroup, the mounts), not left
        // to the next recovery.
        let guard = super::hostview::Guard::spawn("runsc", &id, &turn.path, &self.cgroup_place)?;
        // The cgroup holds gVisor's own tasks too (PIDS_OVERHEAD).
        let mut limits = plan.limits.clone();
        limits.pids = limits.pids.saturating_add(PIDS_OVERHEAD);
        let cg = Arc::new(cgroup::TurnCgroup::create(
            &self.cgroup_place,
            &id,
            &limits,
        )?);
        let _ = cg.publish(&crate::store::record::running_cgroup_file(&turn.path));
        let mut sb = RunscSandbox {
            backend: backend.clone(),
            id: id.clone(),
            log: turn.path.join("runsc.log"),
            cg,
            view: None,
            watch: None,
            pid: 0,
            gofer: None,
            report: Arc::new(Mutex::new(None)),
            timeout: Duration::from_secs(plan.limits.timeout_seconds),
            start_failed: None,
            laps: super::hostview::Laps::new(),
            uppers: (0..plan.writable_scopes.len())
                .map(|i| turn.upper(i))
                .collect(),
            scratch: turn.path.join(init::SCRATCH_DIR),
            created: false,
            torn_down: false,
            guard: Some(guard),
            egress: None,
            hostinet,
        };
        // Drop tears down whatever was built if a step below fails.
        let view = sb
            .view
            .insert(super::hostview::HostView::mount(plan, turn)?);
        let (bundle_dir, mut bundle) = view.bundle(plan, turn, "runsc", &id, &self.cgroup_place)?;
        // gVisor (2022-12) returns EPERM for every errno action of an OCI
        // filter (it ignores errnoRet and defaultErrnoRet), so clone3 would
        // fail EPERM and glibc, which falls back to clone only on ENOSYS,
        // could not start threads. clone3 is let through to the sentry,
        // which does not implement it (ENOSYS, measured): the fallback
        // works, and clone's flags stay filtered.
        if let Some(rules) = bundle.config["linux"]["seccomp"]["syscalls"].as_array_mut() {
            rules.push(serde_json::json!({"names": ["clone3"], "action": "SCMP_ACT_ALLOW"}));
        }
        // gVisor always provides a synthetic /sys; the view has none (as
        // natively): an empty, unreadable tmpfs covers it.
        if let Some(mounts) = bundle.config["mounts"].as_array_mut() {
            mounts.push(serde_json::json!({"destination": "/sys", "type": "tmpfs", "source": "tmpfs",
                "options": ["ro", "nosuid", "nodev", "noexec", "mode=000", "size=4k", "nr_inodes=1"]}));
        }
        // runsc applies the bundle's resources to that cgroup.
        bundle.config["linux"]["resources"]["pids"]["limit"] = Value::from(limits.pids);
        super::bundle::write(&bundle_dir, &bundle, 0)?;
        sb.lap("bundle");

        let pid_file = turn.path.join("runsc.pid");
        let create = RuntimeCmd::Create {
            bundle: &bundle_dir,
            pid_file: &pid_file,
            id: &id,
        };
        // Nothing of the container exists before its guard is waiting.
        if let Some(g) = sb.guard.as_mut() {
            g.confirm()?;
        }
        // The sandbox inherits these pipes: the command's stdout and stderr.
        let mut child = backend
            .driver
            .command(&create, &sb.log)?
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| err("start runsc", e.to_string()))?;
        sb.created = true;
        if let (Some(out), Some(errs)) = (child.stdout.take(), child.stderr.take()) {
            let errs = ReportReader {
                inner: errs,
                scanning: Some(Vec::new()),
                pending: Vec::new(),
                slot: Arc::clone(&sb.report),
            };
            sb.watch = Some(Watch::pumps(
                out,
                errs,
                plan.output_budget(),
                self.json_mode,
                false,
            ));
        }
        let status = child
            .wait()
            .map_err(|e| err("runsc create", e.to_string()))?;
        if !status.success() {
            let logged = std::fs::read_to_string(&sb.log).unwrap_or_default();
            return Err(err(
                "runsc create",
                logged
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("failed")
                    .to_owned(),
            ));
        }
        sb.pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| err("runsc create", "no pid file"))?;
        sb.gofer = std::fs::read(Path::new(ROOT).join(format!("{id}_sandbox:{id}.state")))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["goferPid"].as_i64())
            .and_then(|p| i32::try_from(p).ok());
        sb.lap("runtime_create");
        // Egress by name in the sandbox's own network namespace (made by
        // runsc from the spec, empty), before the command may run: a setup
        // that fails refuses the turn.
        if hostinet {
            let running = crate::sandbox::egress::start_for(sb.pid, &plan.network, &plan.egress)
                .map_err(|e| err("network egress", e))?;
            sb.egress = Some(running);
            sb.lap("egress");
        }
        // The timer, from here: a `runsc start` or `wait` that hangs ends
        // with the sandbox it waits on.
        let cg = Arc::clone(&sb.cg);
        if let Some(w) = sb.watch.as_mut() {
            w.start_timer(cg, sb.timeout);
        }
        Ok(Box::new(sb))
    }
}

impl RunscSandbox {
    fn lap(&mut self, name: &'static str) {
        self.laps.lap(name);
    }

    /// `runsc delete --force`, once. It must run before the cgroup is
    /// killed: with its gofer already gone, it waits for it until a 5 s
    /// deadline (measured); it kills whatever of the sandbox still runs.
    /// A `runsc create` cut short (SIGTERM/SIGINT to the supervisor, whose
    /// interrupt kills the turn's cgroup while the sandbox boots) leaves
    /// only its `<id>_sandbox:<id>.lock`, which `delete` does not know:
    /// [`super::runtime::forget`] removes what is left, as recovery would
    /// (when nothing is, it only looks).
    fn delete_container(&mut self) {
        if std::mem::take(&mut self.created) {
            let _ = self
                .backend
                .output(&RuntimeCmd::Delete { id: &self.id }, &self.log);
            super::runtime::forget(&self.id);
        }
    }

    fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        self.delete_container();
        self.cg.kill_all();
        if let Some(w) = self.watch.as_mut() {
            w.stop();
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
        // The gofer (and a sandbox never waited for) became our children
        // too: reap what has exited, never block.
        while let Ok(
            nix::sys::wait::WaitStatus::Exited(..) | nix::sys::wait::WaitStatus::Signaled(..),
        ) = nix::sys::wait::waitpid(
            None,
            Some(nix::sys::wait::WaitPidFlag::WNOHANG | nix::sys::wait::WaitPidFlag::__WALL),
        ) {}
    }

    /// Reaps the sandbox process; its status is the command's.
    fn reap(&self) -> Ending {
        // The sandbox itself killed (a limit, the timer) stays a signal.
        match super::hostview::reap(self.pid, "runsc", "sandbox") {
            Ending::Exited(code) => Self::ending(Some(code.into())),
            other => other,
        }
    }

    /// Reaps the gofer, which exits once the sandbox is gone. It must not
    /// linger as a zombie: `runsc delete` takes a live-looking gofer for a
    /// running one and waits 5 s for it (measured). Killed after 2 s.
    fn reap_gofer(&mut self) {
        use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
        let Some(pid) = self.gofer.take().map(nix::unistd::Pid::from_raw) else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match waitpid(pid, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(500));
                }
                Ok(WaitStatus::StillAlive) => {
                    let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                    let _ = waitpid(pid, Some(WaitPidFlag::__WALL));
                    return;
                }
                Err(nix::errno::Errno::EINTR) => {}
                _ => return,
            }
        }
    }

    /// The command's ending from the sandbox's exit status.
    fn ending(status: Option<i64>) -> Ending {
        match status {
            Some(s @ 129..=192) => {
                let signal = (s - 128) as i32;
                Ending::Signaled {
                    signal,
                    name: Signal::try_from(signal)
                        .map(|s| s.as_str().to_owned())
                        .unwrap_or_else(|_| format!("signal {signal}")),
                }
            }
            Some(s) => Ending::Exited(s as i32),
            None => Ending::SetupFailed {
                stage: "runsc".into(),
                detail: "the sandbox reported no exit status".into(),
            },
        }
    }
}

impl Drop for RunscSandbox {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl Sandbox for RunscSandbox {
    fn posture(&self) -> Option<&Posture> {
        // Checked inside, by the init (module doc); known after `wait`.
        None
    }

    fn start(&mut self) {
        self.laps.skip();
        if let Err(e) = self
            .backend
            .output(&RuntimeCmd::Start { id: &self.id }, &self.log)
        {
            self.start_failed = Some(e.to_string());
            self.cg.kill_all();
            return;
        }
        self.lap("runtime_start");
    }

    fn signal(&self, signal: Signal) {
        self.cg.signal_all(signal);
    }

    fn wait(mut self: Box<Self>) -> Result<Execution> {
        let ending = match self.start_failed.take() {
            Some(detail) => Ending::SetupFailed {
                stage: "runsc start".into(),
                detail,
            },
            None => self.reap(),
        };
        self.lap("command_and_exit");
        // The command is over: the timer stops (whatever it decided stays).
        if let Some(w) = self.watch.as_mut() {
            w.stop();
        }
        self.reap_gofer();
        self.delete_container();
        self.lap("runtime_delete");
        let empty = self.cg.kill_all();
        let egress = self
            .egress
            .take()
            .map(crate::sandbox::egress::Running::finish);
        let usage = self.cg.usage();
        // A sandbox a limit or the timer killed (the sentry with the
        // command) leaves `runsc wait` without a status: the command was
        // killed, and the classification names the limit from the usage.
        let timed_out = self.watch.as_ref().is_some_and(Watch::timed_out);
        let ending = match ending {
            Ending::SetupFailed { stage, .. }
                if stage == "runsc"
                    && (usage.oom_kills > 0 || usage.pids_limit_hits > 0 || timed_out) =>
            {
                Ending::Signaled {
                    signal: Signal::SIGKILL as i32,
                    name: Signal::SIGKILL.as_str().to_owned(),
                }
            }
            other => other,
        };
        let version = self.cg.version;
        self.teardown();
        let (stdout, stderr) = self.watch.as_mut().map(Watch::streams).unwrap_or_default();
        if !empty {
            return Err(err("teardown", "processes of the turn survived SIGKILL"));
        }
        let report = self.report.lock().ok().and_then(|mut r| r.take());
        let (landlock, posture) = match &report {
            Some(r) => (
                Some(r["landlock"].clone()),
                Some(Posture {
                    pid: 0,
                    threads: 1,
                    failures: r["posture"]["failures"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .map(|f| format!("(inside gVisor) {}", f.as_str().unwrap_or("?")))
                                .collect()
                        })
                        .unwrap_or_default(),
                    namespaces: Vec::new(),
                }),
            ),
            None => (None, None),
        };
        let ending = match (&report, ending) {
            (None, Ending::Exited(_) | Ending::Signaled { .. }) => Ending::SetupFailed {
                stage: "init".into(),
                detail: "turnstile's init in the sandbox never reported (its reason, if it gave one, is on the turn's stderr)".into(),
            },
            (_, e) => e,
        };
        let disk_full = crate::sandbox::scratch_full(&self.scratch);
        let mut degraded = vec![
                "runsc: the posture was checked by turnstile's init inside gVisor (no_new_privs, seccomp mode, capabilities, ids as gVisor's kernel reports them); the host sees only the sentry".into(),
                "runsc: the workspace's read-only directories are bind mounts, not overlays (gVisor's gofer refuses host unix sockets instead)".into(),
                "runsc: what the turn leaves in /dev/shm, /tmp and /var/tmp is discarded but not recorded".into(),
                "runsc: syscalls newer than its libseccomp (2.5.4) fall to ENOSYS".into(),
                format!("runsc: the cgroup also holds gVisor's sentry and gofer: its pids limit is the plan's + {PIDS_OVERHEAD}, and their memory counts against the turn's limit"),
            ];
        if self.hostinet {
            degraded.push("runsc: gvisor_netstack (allowed by the manifest): the network policy ran on hostinet (--network=host) in the turn's own network namespace, not on gVisor's netstack: the sentry's sockets were host-kernel sockets there, filtered by the supervisor's nftables, resolver and proxy".into());
        }
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
            posture,
            phases,
            seccomp_unknown: Vec::new(),
            wall,
            uppers: std::mem::take(&mut self.uppers),
            ephemeral: serde_json::Map::new(),
            denials: Err(
                "runsc: seccomp refusals are plain errnos inside gVisor, so they are not observed"
                    .into(),
            ),
            observed: Err(
                "runsc: file operations are served by gVisor's sentry and gofer, not by the host kernel's Landlock or view, so the BPF observer has nothing to attribute"
                    .into(),
            ),
            degraded,
            warm: false,
            egress,
            teardown: crate::sandbox::Deferred::default(),
        })
    }

    fn delete(mut self: Box<Self>) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(input: &[u8]) -> (Vec<u8>, Option<Value>) {
        let slot = Arc::new(Mutex::new(None));
        let mut r = ReportReader {
            inner: input,
            scanning: Some(Vec::new()),
            pending: Vec::new(),
            slot: Arc::clone(&slot),
        };
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        let report = slot.lock().unwrap().take();
        (rest, report)
    }

    #[test]
    fn the_init_report_is_taken_out_of_stderr_and_nothing_else() {
        let line = format!("{REPORT_PREFIX}{{\"landlock\":{{\"status\":\"x\"}}}}\nafter\n");
        let (rest, report) = split(line.as_bytes());
        assert_eq!(rest, b"after\n");
        assert_eq!(report.unwrap()["landlock"]["status"], "x");
        // A first line that is not a report (the init failed before it, or
        // a command imitates it later: it cannot come first) passes through.
        for text in [
            "turnstile-init: landlock: boom\n".to_owned(),
            format!("out\n{REPORT_PREFIX}{{}}\n"),
            format!("{REPORT_PREFIX}not json\n"),
            String::new(),
            "no newline".to_owned(),
        ] {
            let (rest, report) = split(text.as_bytes());
            assert_eq!(rest, text.as_bytes());
            assert!(report.is_none(), "{text:?}");
        }
    }

    #[test]
    fn sandbox_exit_statuses_become_endings() {
        let ending = RunscSandbox::ending;
        assert_eq!(ending(Some(3)), Ending::Exited(3));
        assert_eq!(ending(Some(128)), Ending::Exited(128));
        assert_eq!(
            ending(Some(137)),
            Ending::Signaled {
                signal: 9,
                name: "SIGKILL".into()
            }
        );
        assert!(matches!(ending(None), Ending::SetupFailed { .. }));
    }
}
