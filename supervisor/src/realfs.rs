//! The host file system as the plan compiler's [`FsView`].

use std::io::Read;

use turnstile_policy::plan::{FileKind, FsView};

/// Reads the real file system (lstat, readdir, realpath, readlink).
#[derive(Debug, Default, Clone, Copy)]
pub struct HostFs;

impl FsView for HostFs {
    fn kind(&self, path: &str) -> Option<FileKind> {
        let m = std::fs::symlink_metadata(path).ok()?;
        let t = m.file_type();
        Some(if t.is_symlink() {
            FileKind::Symlink
        } else if t.is_dir() {
            FileKind::Dir
        } else if t.is_file() {
            FileKind::File
        } else {
            FileKind::Other
        })
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
}
