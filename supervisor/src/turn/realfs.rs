//! The host file system as the plan compiler's [`FsView`].

use std::io::Read;

use turnstile_policy::plan::{FileKind, FsView};

/// Reads the real file system (lstat, readdir, realpath, readlink).
#[derive(Debug, Default, Clone, Copy)]
pub struct HostFs;

impl FsView for HostFs {
    fn kind(&self, path: &str) -> Option<FileKind> {
        Some(FileKind::of(
            std::fs::symlink_metadata(path).ok()?.file_type(),
        ))
    }

    fn list(&self, path: &str) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(path) else {
            return Vec::new();
        };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }

    fn canonical(&self, path: &str) -> Option<String> {
        std::fs::canonicalize(path)
            .ok()?
            .into_os_string()
            .into_string()
            .ok()
    }

    fn read_link(&self, path: &str) -> Option<String> {
        std::fs::read_link(path)
            .ok()?
            .into_os_string()
            .into_string()
            .ok()
    }

    fn head(&self, path: &str, len: usize) -> Vec<u8> {
        let mut buf = Vec::new();
        if let Ok(f) = std::fs::File::open(path) {
            let _ = f.take(len as u64).read_to_end(&mut buf);
        }
        buf
    }

    fn mode(&self, path: &str) -> Option<u32> {
        use std::os::unix::fs::PermissionsExt;
        Some(std::fs::metadata(path).ok()?.permissions().mode() & 0o7777)
    }
}

/// An image rootfs as the system view (`run --rootfs DIR`), the workspace
/// at its host path: paths under `workspace` are answered by the host,
/// every other path inside `image`, resolving symlinks the way the turn
/// will (an absolute link target starts at the image's root, `..` never
/// climbs above it). Nothing outside `image` or the workspace is looked at.
#[derive(Debug, Clone)]
pub struct RootedFs {
    image: std::path::PathBuf,
    workspace: String,
}

/// Symlinks followed while resolving one path (the kernel's limit).
const MAX_LINKS: usize = 40;

impl RootedFs {
    /// `image` must be an absolute, canonical directory; `workspace` the
    /// workspace root's absolute path.
    pub fn new(image: &std::path::Path, workspace: &str) -> Self {
        Self {
            image: image.to_path_buf(),
            workspace: workspace.trim_end_matches('/').to_owned(),
        }
    }

    fn in_workspace(&self, path: &str) -> bool {
        path == self.workspace || path.starts_with(&format!("{}/", self.workspace))
    }

    fn host(&self, inner: &str) -> std::path::PathBuf {
        self.image.join(inner.trim_start_matches('/'))
    }

    /// `path` as a path of the image with every symlink resolved (the last
    /// component too when `follow_last`); `None` when a component is
    /// missing, not a directory where one is needed, or the links loop.
    fn resolve(&self, path: &str, follow_last: bool) -> Option<String> {
        let mut pending: Vec<String> = path
            .split('/')
            .filter(|s| !s.is_empty())
            .rev()
            .map(str::to_owned)
            .collect();
        let mut done: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(part) = pending.pop() {
            match part.as_str() {
                "." => continue,
                ".." => {
                    done.pop();
                    continue;
                }
                _ => {}
            }
            let candidate =
                format!("/{}", [done.join("/"), part.clone()].join("/")).replace("//", "/");
            let last = pending.is_empty();
            let meta = match std::fs::symlink_metadata(self.host(&candidate)) {
                Ok(m) => m,
                // A missing last component is still a path (lstat says None).
                Err(_) if last && !follow_last => {
                    done.push(part);
                    continue;
                }
                Err(_) => return None,
            };
            if meta.file_type().is_symlink() && (!last || follow_last) {
                links += 1;
                if links > MAX_LINKS {
                    return None;
                }
                let target = std::fs::read_link(self.host(&candidate)).ok()?;
                let target = target.to_str()?;
                if target.starts_with('/') {
                    done.clear();
                }
                pending.extend(
                    target
                        .split('/')
                        .filter(|s| !s.is_empty())
                        .rev()
                        .map(str::to_owned),
                );
                continue;
            }
            if !last && !meta.is_dir() {
                return None;
            }
            done.push(part);
        }
        Some(format!("/{}", done.join("/")))
    }
}

impl FsView for RootedFs {
    fn kind(&self, path: &str) -> Option<FileKind> {
        if self.in_workspace(path) {
            return HostFs.kind(path);
        }
        let inner = self.resolve(path, false)?;
        HostFs.kind(self.host(&inner).to_str()?)
    }

    fn list(&self, path: &str) -> Vec<String> {
        if self.in_workspace(path) {
            return HostFs.list(path);
        }
        match self.resolve(path, true) {
            Some(inner) => self
                .host(&inner)
                .to_str()
                .map(|p| HostFs.list(p))
                .unwrap_or_default(),
            None => Vec::new(),
        }
    }

    fn canonical(&self, path: &str) -> Option<String> {
        if self.in_workspace(path) {
            return HostFs.canonical(path);
        }
        let inner = self.resolve(path, true)?;
        std::fs::symlink_metadata(self.host(&inner)).ok()?;
        Some(inner)
    }

    fn read_link(&self, path: &str) -> Option<String> {
        if self.in_workspace(path) {
            return HostFs.read_link(path);
        }
        let inner = self.resolve(path, false)?;
        HostFs.read_link(self.host(&inner).to_str()?)
    }

    fn head(&self, path: &str, len: usize) -> Vec<u8> {
        if self.in_workspace(path) {
            return HostFs.head(path, len);
        }
        match self.resolve(path, true) {
            Some(inner) => self
                .host(&inner)
                .to_str()
                .map(|p| HostFs.head(p, len))
                .unwrap_or_default(),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_inside_the_image_and_the_workspace_on_the_host() {
        let image = tempfile::tempdir().unwrap();
        let root = image.path();
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::write(root.join("usr/bin/busybox"), b"#!/bin/interp\n").unwrap();
        std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
        std::os::unix::fs::symlink("busybox", root.join("usr/bin/sh")).unwrap();
        // Absolute and climbing targets stay inside the image.
        std::os::unix::fs::symlink("/usr/bin/busybox", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../../etc", root.join("usr/up")).unwrap();
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        let ws = tempfile::tempdir().unwrap();
        let ws_str = ws.path().to_str().unwrap();
        let fs = RootedFs::new(root, ws_str);

        assert_eq!(fs.kind("/bin"), Some(FileKind::Symlink));
        assert_eq!(fs.kind("/bin/sh"), Some(FileKind::Symlink));
        assert_eq!(fs.canonical("/bin/sh").as_deref(), Some("/usr/bin/busybox"));
        assert_eq!(fs.canonical("/abs").as_deref(), Some("/usr/bin/busybox"));
        assert_eq!(fs.kind("/usr/bin/busybox"), Some(FileKind::File));
        assert_eq!(fs.head("/bin/sh", 2), b"#!");
        assert_eq!(fs.list("/bin"), vec!["busybox", "sh"]);
        // /etc does not exist in the image: not the host's /etc.
        assert_eq!(fs.kind("/etc/passwd"), None);
        assert_eq!(fs.canonical("/usr/up"), None);
        assert_eq!(fs.canonical("/loop"), None);
        assert_eq!(fs.kind(ws_str), Some(FileKind::Dir));
        assert_eq!(fs.canonical(ws_str).as_deref(), Some(ws_str));
    }
}
