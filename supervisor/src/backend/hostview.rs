//! What the OCI backends (runc, crun, runsc) share: the host side of the
//! view — the workspace as its owner's, idmapped to the turn's uid/gid
//! (the source of every workspace mount, as natively), and one overlay per
//! writable scope (lower: the idmapped workspace directory; upper and
//! work: the turn's scratch tmpfs), whose merged directories the bundle
//! binds in; unmounted on drop, whatever step failed —, the turn's bundle
//! over that view, the phase laps, and reaping the container's process.

use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use turnstile_policy::plan::Plan;

use crate::error::Result;
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
            serde_json::Value::String(format!("/turnstile/{id}"));
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
