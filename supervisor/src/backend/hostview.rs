//! The host side of an OCI backend's view, shared by runc, crun and runsc:
//! the workspace as its owner's, idmapped to the turn's uid/gid (the
//! source of every workspace mount, as natively), and one overlay per
//! writable scope (lower: the idmapped workspace directory; upper and
//! work: the turn's scratch tmpfs), whose merged directories the bundle
//! binds in. Unmounted on drop, whatever step failed.

use std::path::{Path, PathBuf};

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
