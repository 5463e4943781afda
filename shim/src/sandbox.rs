//! The CRI pod sandbox ("pause") container: not a turn.
//!
//! The CRI plugin creates one sandbox container per pod before any of the
//! pod's containers (`io.kubernetes.cri.container-type: sandbox`). Its only
//! job is to hold the pod's namespaces and cgroup while the pod lives; it
//! runs the cluster's configured `sandbox_image`, not the workload, writes
//! nothing, declares no outputs and has no package. Making it a turn would
//! need a package and outputs for a process that has neither, and would put
//! a meaningless turn in every pod's session ledger. So the shim runs it as
//! the runc v2 shim would — through `runc`, from the bundle containerd
//! wrote, unchanged (the pod's network namespace from CNI, the pod cgroup)
//! — and keeps no evidence of it. Every other container of the pod is a
//! turn.
//!
//! The exemption trusts `io.kubernetes.cri.container-type` and
//! `io.kubernetes.cri.sandbox-id` (naming the container itself), which the
//! CRI plugin sets last on every spec it writes; a runtime handler's
//! `pod_annotations` / `container_annotations` pass-through lists must not
//! let `io.kubernetes.*` through (the shipped config passes only
//! `io.turnstile.*`).
//!
//! This module is pure: the exact runc argv. The service runs it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::cri::{CRI_CONTAINER_TYPE, CRI_CONTAINERD_NAMESPACE, CRI_SANDBOX, CRI_SANDBOX_ID};
use crate::error::ShimError;

/// The pid file `runc create` writes, in the bundle.
pub const PID_FILE: &str = "turnstile-sandbox.pid";
/// runc's own diagnostics, in the bundle (read when it fails).
pub const LOG_FILE: &str = "turnstile-sandbox.log";
/// Where the runc state root is recorded, in the bundle, for `delete`
/// after a dead daemon (which has no options).
pub const ROOT_FILE: &str = "turnstile-sandbox-runc-root";

/// Whether a spec's annotations mark container `id`, in containerd
/// namespace `namespace`, as the CRI pod sandbox: `container-type:
/// sandbox` and the CRI plugin's own `sandbox-id` naming this very
/// container, in the CRI plugin's namespace (`k8s.io`) — the only one
/// whose specs the CRI plugin writes. `container-type: sandbox` anywhere
/// else, or without that id (e.g. set by hand on `ctr run`), is refused
/// rather than run as a turn or a sandbox: a client of any other namespace
/// could otherwise run anything through plain runc, outside every turn.
pub fn is_cri_sandbox(
    annotations: &std::collections::BTreeMap<String, String>,
    id: &str,
    namespace: &str,
) -> Result<bool, ShimError> {
    if annotations.get(CRI_CONTAINER_TYPE).map(String::as_str) != Some(CRI_SANDBOX) {
        return Ok(false);
    }
    let cri = CRI_CONTAINERD_NAMESPACE;
    if namespace != cri {
        return Err(ShimError::Spec {
            field: "annotations",
            reason: format!(
                "`{CRI_CONTAINER_TYPE}: {CRI_SANDBOX}` on container `{id}` in containerd namespace `{namespace}`: only the CRI plugin's pod sandbox, in namespace `{cri}`, runs outside a turn"
            ),
        });
    }
    match annotations.get(CRI_SANDBOX_ID) {
        Some(s) if s == id => Ok(true),
        other => Err(ShimError::Spec {
            field: "annotations",
            reason: format!(
                "`{CRI_CONTAINER_TYPE}: {CRI_SANDBOX}` on container `{id}` whose `{CRI_SANDBOX_ID}` is {}: only the CRI plugin's pod sandbox runs outside a turn",
                other.map_or_else(|| "absent".to_owned(), |s| format!("`{s}`"))
            ),
        }),
    }
}

/// `runc` with a state root of the shim's own (under its state dir), so
/// its containers never mix with another runc user's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runc {
    pub binary: PathBuf,
    pub root: PathBuf,
}

impl Runc {
    /// The runc state root under the shim's state dir.
    pub fn under(state_dir: &Path) -> Self {
        Self {
            binary: PathBuf::from("runc"),
            root: state_dir.join("cri-sandbox-runc"),
        }
    }

    fn base(&self) -> Vec<OsString> {
        vec![
            "--root".into(),
            self.root.clone().into_os_string(),
            "--log".into(),
            // Relative to the bundle, which is runc's working directory.
            LOG_FILE.into(),
        ]
    }

    /// `runc create`: the container's init waits for `start`.
    pub fn create_args(&self, bundle: &Path, id: &str) -> Vec<OsString> {
        let mut a = self.base();
        a.extend([
            "create".into(),
            "--bundle".into(),
            bundle.as_os_str().to_owned(),
            "--pid-file".into(),
            bundle.join(PID_FILE).into_os_string(),
            id.into(),
        ]);
        a
    }

    pub fn start_args(&self, id: &str) -> Vec<OsString> {
        let mut a = self.base();
        a.extend(["start".into(), id.into()]);
        a
    }

    /// `runc delete --force`: kills what is left, removes the cgroup and
    /// runc's state.
    pub fn delete_args(&self, id: &str) -> Vec<OsString> {
        let mut a = self.base();
        a.extend(["delete".into(), "--force".into(), id.into()]);
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[OsString]) -> Vec<&str> {
        v.iter().map(|s| s.to_str().unwrap()).collect()
    }

    #[test]
    fn runc_argv_is_exact() {
        let r = Runc::under(Path::new("/s"));
        assert_eq!(
            strs(&r.create_args(Path::new("/b"), "sb1")),
            [
                "--root",
                "/s/cri-sandbox-runc",
                "--log",
                LOG_FILE,
                "create",
                "--bundle",
                "/b",
                "--pid-file",
                "/b/turnstile-sandbox.pid",
                "sb1"
            ]
        );
        assert_eq!(
            strs(&r.start_args("sb1")),
            [
                "--root",
                "/s/cri-sandbox-runc",
                "--log",
                LOG_FILE,
                "start",
                "sb1"
            ]
        );
        assert_eq!(
            strs(&r.delete_args("sb1")),
            [
                "--root",
                "/s/cri-sandbox-runc",
                "--log",
                LOG_FILE,
                "delete",
                "--force",
                "sb1"
            ]
        );
    }

    #[test]
    fn only_the_cri_plugins_sandbox_annotations_mark_a_sandbox() {
        let k8s = CRI_CONTAINERD_NAMESPACE;
        let mut a = std::collections::BTreeMap::new();
        assert!(!is_cri_sandbox(&a, "sb1", k8s).unwrap());
        a.insert(CRI_CONTAINER_TYPE.to_owned(), "container".to_owned());
        a.insert(CRI_SANDBOX_ID.to_owned(), "sb1".to_owned());
        assert!(!is_cri_sandbox(&a, "c1", k8s).unwrap());
        a.insert(CRI_CONTAINER_TYPE.to_owned(), CRI_SANDBOX.to_owned());
        assert!(is_cri_sandbox(&a, "sb1", k8s).unwrap());
        // Red-team finding (wave 3): the same annotations from any other
        // containerd namespace are refused, not run through plain runc.
        for ns in ["default", "tenant-b", "k8s.io2", ""] {
            let e = is_cri_sandbox(&a, "sb1", ns).unwrap_err();
            assert_eq!(e.code(), "TS1202");
            assert!(e.to_string().contains(&format!("`{ns}`")), "{e}");
        }
        // Sandbox type on another container, or without a sandbox id: refused.
        let e = is_cri_sandbox(&a, "c1", k8s).unwrap_err();
        assert_eq!(e.code(), "TS1202");
        assert!(e.to_string().contains("`sb1`"), "{e}");
        a.remove(CRI_SANDBOX_ID);
        assert!(
            is_cri_sandbox(&a, "sb1", k8s)
                .unwrap_err()
                .to_string()
                .contains("absent")
        );
    }
}
