//! Writes an OCI bundle (from `turnstile_oci::build`) to a directory:
//! `config.json`, the read-only rootfs skeleton, the generated files, and
//! `scopes/<i>/`, where a runtime backend mounts each writable scope's
//! overlay before `create`.

use std::path::Path;

use turnstile_oci::Bundle;

use crate::error::{Result, SupervisorError};

fn io(op: &'static str, p: &Path) -> impl FnOnce(std::io::Error) -> SupervisorError {
    let path = p.to_path_buf();
    move |source| SupervisorError::StateIo { op, path, source }
}

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
    for i in 0..scopes {
        let p = dir.join("scopes").join(i.to_string());
        std::fs::create_dir_all(&p).map_err(io("create scope mount point", &p))?;
    }
    let config = dir.join("config.json");
    let text = serde_json::to_string_pretty(&bundle.config)
        .map_err(|e| SupervisorError::invalid("config.json", e.to_string()))?;
    std::fs::write(&config, text + "\n").map_err(io("write config.json", &config))
}
