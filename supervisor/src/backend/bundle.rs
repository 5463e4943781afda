//! Writes an OCI bundle (from `turnstile_oci::build`) to a directory:
//! `config.json`, the read-only rootfs skeleton, the generated files, and
//! `scopes/<i>/`, where a runtime backend mounts each writable scope's
//! overlay before `create`.

use std::path::Path;

use turnstile_oci::Bundle;

use crate::error::{Result, SupervisorError};

use crate::fsx::state_io as io;

/// Writes `bundle` into `dir`, which must not exist (its parent must).
pub fn write(dir: &Path, bundle: &Bundle, scopes: usize) -> Result<()> {
    std::fs::create_dir(dir).map_err(io("create bundle dir", dir))?;
    let rootfs = dir.join("rootfs");
    std::fs::create_dir(&rootfs).map_err(io("create rootfs", &rootfs))?;
    for d in &bundle.rootfs_dirs {
        let p = rootfs.join(d.trim_start_matches('/'));
        std::fs::create_dir_all(&p).map_err(io("create rootfs dir", &p))?;
    }
    for (path, target) in &bundle.rootfs_symlinks {
        let p = rootfs.join(path.trim_start_matches('/'));
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(io("create rootfs dir", parent))?;
        }
        std::os::unix::fs::symlink(target, &p).map_err(io("create rootfs symlink", &p))?;
    }
    for (name, contents) in &bundle.generated {
        let p = dir.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(io("create bundle dir", parent))?;
        }
        std::fs::write(&p, contents).map_err(io("write generated file", &p))?;
    }
    // What masked files are bound from: empty and unreadable (0000).
    let mask = dir.join(turnstile_oci::MASK_FILE);
    if let Some(parent) = mask.parent() {
        std::fs::create_dir_all(parent).map_err(io("create bundle dir", parent))?;
    }
    std::fs::write(&mask, b"").map_err(io("write mask file", &mask))?;
    std::fs::set_permissions(&mask, std::os::unix::fs::PermissionsExt::from_mode(0o000))
        .map_err(io("write mask file", &mask))?;
    // What masked directories are bound from: empty and unlistable (0000).
    let mask_dir = dir.join(turnstile_oci::MASK_DIR);
    std::fs::create_dir(&mask_dir).map_err(io("create mask dir", &mask_dir))?;
    std::fs::set_permissions(
        &mask_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .map_err(io("create mask dir", &mask_dir))?;
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).map_err(io("create empty dir", &empty))?;
    for i in 0..scopes {
        let p = dir.join("scopes").join(i.to_string());
        std::fs::create_dir_all(&p).map_err(io("create scope mount point", &p))?;
    }
    let config = dir.join("config.json");
    let text = serde_json::to_string_pretty(&bundle.config)
        .map_err(|e| SupervisorError::invalid("config.json", e.to_string()))?;
    std::fs::write(&config, text + "\n").map_err(io("write config.json", &config))
}

/// The host's dynamic loader (the init's interpreter).
const HOST_LOADER: &str = if cfg!(target_arch = "aarch64") {
    "/lib/ld-linux-aarch64.so.1"
} else {
    "/lib64/ld-linux-x86-64.so.2"
};

/// Where a bundle's pieces are on the host.
#[derive(Debug, Clone)]
pub struct Place {
    pub bundle_dir: std::path::PathBuf,
    /// An empty directory (second lower layer of read-only overlays).
    pub empty_dir: std::path::PathBuf,
    /// The writable scopes' overlay merged dirs, in scope order.
    pub scope_sources: Vec<String>,
    /// The idmapped clone of the workspace root, if the backend made one.
    pub workspace_source: Option<String>,
}

/// The bundle options for `plan` shared by `supervise bundle` and the
/// runtime backends: turnstile's init (this binary) applies Landlock, the
/// Plan's read-only directories become read-only overlays over `empty_dir`
/// (binds under runsc: gVisor does not mount overlayfs from a bundle, and
/// its gofer refuses host unix sockets anyway).
pub fn options(
    plan: &turnstile_policy::plan::Plan,
    backend: &str,
    at: Place,
    declared_outputs: Vec<(String, String)>,
    vm_kernel: Option<turnstile_oci::VmKernel>,
) -> Result<turnstile_oci::BundleOptions> {
    let Place {
        bundle_dir,
        empty_dir,
        scope_sources,
        workspace_source,
    } = at;
    let exe = crate::sandbox::initbin::path()
        .map_err(|e| SupervisorError::invalid("supervise", e.to_string()))?;
    let runsc = backend == "runsc";
    // Where a path of the view is on the host: outside the workspace, in
    // the image rootfs when the system view comes from one.
    let on_host = |path: &str| -> std::path::PathBuf {
        let in_root = path
            .strip_prefix(plan.root.as_str())
            .is_some_and(|rel| rel.is_empty() || rel.starts_with('/'));
        match &plan.system_root {
            Some(system) if !in_root => Path::new(system).join(path.trim_start_matches('/')),
            _ => Path::new(path).to_path_buf(),
        }
    };
    let read_only_dirs = if runsc {
        Vec::new()
    } else {
        plan.mounts
            .iter()
            .filter_map(|m| match m {
                turnstile_policy::plan::Mount::ReadOnly { path } if on_host(path).is_dir() => {
                    Some(path.clone())
                }
                _ => None,
            })
            .collect()
    };
    Ok(turnstile_oci::BundleOptions {
        bundle_dir: bundle_dir.display().to_string(),
        backend: backend.to_owned(),
        scope_sources,
        declared_outputs,
        init: Some(turnstile_oci::InitBinary {
            host_path: exe.display().to_string(),
            build: crate::sandbox::initbin::BUILD_ID.to_owned(),
            report: if runsc {
                turnstile_oci::InitReport::Stderr {
                    allow_unenforced: plan.allow_degraded.iter().any(|l| l == "landlock"),
                }
            } else {
                turnstile_oci::InitReport::Handshake
            },
            // Over an image rootfs the init runs on the host's libraries.
            host_loader: plan
                .system_root
                .as_ref()
                .and_then(|_| std::fs::canonicalize(HOST_LOADER).ok())
                .map(|p| p.display().to_string()),
        }),
        vm_kernel,
        seccomp_arch: if cfg!(target_arch = "aarch64") {
            "SCMP_ARCH_AARCH64".into()
        } else {
            "SCMP_ARCH_X86_64".into()
        },
        read_only_dirs,
        empty_dir: Some(empty_dir.display().to_string()),
        workspace_source,
    })
}
