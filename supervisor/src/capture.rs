//! Capture and verification (FR-RT-015, FR-RT-016).
//!
//! After every process of the turn is gone, the overlay upper dirs hold
//! exactly what the turn wrote. Enumeration never follows a symlink: the
//! walk uses `lstat`, and every file is opened with openat2
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` under its upper dir before it is
//! hashed. Counts and depth are capped (the scratch tmpfs already bounds
//! bytes and inodes).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use turnstile_policy::request::DeclaredOutput;

use crate::error::{Result, SupervisorError};
use crate::fsx;

/// Deepest directory level enumerated.
pub const MAX_DEPTH: usize = 256;

/// What kind of change an upper-dir entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    /// A directory the turn created.
    Dir,
    /// A directory the turn replaced (removed and recreated).
    OpaqueDir,
    Symlink,
    /// A deletion (overlay whiteout).
    Deleted,
    /// A FIFO, socket or device node.
    Special,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Dir => "dir",
            Self::OpaqueDir => "opaque_dir",
            Self::Symlink => "symlink",
            Self::Deleted => "deleted",
            Self::Special => "special",
        }
    }
}

/// One realized write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealizedWrite {
    /// Relative to the workspace root.
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    pub sha256: Option<String>,
    /// Which writable scope (overlay index) it is in.
    pub scope: usize,
    /// Permission bits as the turn left them (files, dirs; 0 otherwise).
    pub mode: u32,
}

impl RealizedWrite {
    pub fn to_value(&self) -> Value {
        json!({"path": self.path, "kind": self.kind.as_str(), "size": self.size, "sha256": self.sha256})
    }
}

/// One writable scope: its path relative to the root, the host directory
/// (the overlay's lower layer) and its upper dir.
#[derive(Debug, Clone)]
pub struct Scope {
    pub relative: String,
    pub lower: PathBuf,
    pub upper: PathBuf,
}

fn capture_err(detail: String) -> SupervisorError {
    SupervisorError::Sandbox {
        step: "capture",
        detail,
        source: None,
    }
}

fn is_opaque(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut value = [0u8; 2];
    for name in [c"trusted.overlay.opaque", c"user.overlay.opaque"] {
        // SAFETY: `c` and `name` are NUL-terminated; `value` is a writable
        // buffer of the length passed; lgetxattr does not follow symlinks.
        let n = unsafe {
            nix::libc::lgetxattr(
                c.as_ptr(),
                name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if n == 1 && value[0] == b'y' {
            return true;
        }
    }
    false
}

/// Enumerates every upper dir: at most `max_entries` entries and
/// `max_bytes` of regular-file content by apparent size — checked before
/// anything is hashed, so a sparse file cannot make capture (or commit)
/// read gigabytes of zeros.
pub fn enumerate(scopes: &[Scope], max_entries: u64, max_bytes: u64) -> Result<Vec<RealizedWrite>> {
    let mut out = Vec::new();
    let mut bytes = 0u64;
    for (index, scope) in scopes.iter().enumerate() {
        let mut stack: Vec<(String, usize)> = vec![(String::new(), 0)];
        while let Some((rel_dir, depth)) = stack.pop() {
            if depth > MAX_DEPTH {
                return Err(SupervisorError::CaptureLimit(format!(
                    "{}: deeper than {MAX_DEPTH} levels",
                    scope.relative
                )));
            }
            let dir = if rel_dir.is_empty() {
                scope.upper.clone()
            } else {
                scope.upper.join(&rel_dir)
            };
            let entries = std::fs::read_dir(&dir)
                .map_err(|e| capture_err(format!("{}: {e}", dir.display())))?;
            let mut names: Vec<_> = entries
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .collect();
            names.sort();
            for name in names {
                let Some(name) = name.to_str().map(str::to_owned) else {
                    return Err(capture_err(format!(
                        "{}: a file name is not valid UTF-8",
                        scope.relative
                    )));
                };
                let rel = if rel_dir.is_empty() {
                    name
                } else {
                    format!("{rel_dir}/{name}")
                };
                let host = scope.upper.join(&rel);
                let meta = std::fs::symlink_metadata(&host)
                    .map_err(|e| capture_err(format!("{rel}: {e}")))?;
                let ft = meta.file_type();
                let path = format!("{}/{rel}", scope.relative);
                let (kind, size, sha256) = if ft.is_file() {
                    bytes = bytes.saturating_add(meta.len());
                    if bytes > max_bytes {
                        return Err(SupervisorError::CaptureLimit(format!(
                            "realized files exceed {max_bytes} bytes (apparent size, at {path})"
                        )));
                    }
                    let (h, n) = fsx::hash_beneath(&scope.upper, &rel)
                        .map_err(|e| capture_err(format!("{path}: {e}")))?;
                    (Kind::File, n, Some(h))
                } else if ft.is_dir() {
                    stack.push((rel.clone(), depth + 1));
                    if is_opaque(&host) {
                        (Kind::OpaqueDir, 0, None)
                    } else if scope
                        .lower
                        .join(&rel)
                        .symlink_metadata()
                        .is_ok_and(|m| m.is_dir() && m.mode() & 0o7777 == meta.mode() & 0o7777)
                    {
                        // Copied up to hold a change below it: structure,
                        // not a write of its own (a chmod of it is one).
                        continue;
                    } else {
                        (Kind::Dir, 0, None)
                    }
                } else if ft.is_symlink() {
                    (Kind::Symlink, meta.len(), None)
                } else if ft.is_char_device() && meta.rdev() == 0 {
                    (Kind::Deleted, 0, None)
                } else {
                    (Kind::Special, 0, None)
                };
                out.push(RealizedWrite {
                    path,
                    kind,
                    size,
                    sha256,
                    scope: index,
                    mode: if ft.is_file() || ft.is_dir() {
                        meta.mode() & 0o7777
                    } else {
                        0
                    },
                });
                if out.len() as u64 > max_entries {
                    return Err(capture_err(format!(
                        "more than {max_entries} realized writes"
                    )));
                }
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Realized writes compared with the declaration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Declared outputs found as regular files.
    pub matched: Vec<RealizedWrite>,
    /// Writes in the session's scratch space (recorded, never a violation).
    pub scratch: Vec<RealizedWrite>,
    /// Writes nobody declared (or that can never commit: links, deletions,
    /// special files outside scratch).
    pub undeclared: Vec<RealizedWrite>,
    /// Declared outputs the turn did not produce as regular files.
    pub missing: Vec<String>,
}

impl Verdict {
    pub fn matches(&self) -> bool {
        self.undeclared.is_empty() && self.missing.is_empty()
    }
}

/// Compares realized writes with `declared` (FR-RT-016). `scratch` is
/// `tmp/<sid>`.
pub fn verify(writes: &[RealizedWrite], declared: &[DeclaredOutput], scratch: &str) -> Verdict {
    use std::collections::HashSet;
    let mut v = Verdict::default();
    let scratch_prefix = format!("{scratch}/");
    // Sets, not scans: 10,000 declared outputs must not cost 10^8 compares.
    let declared_paths: HashSet<&str> = declared.iter().map(|d| d.path.as_str()).collect();
    let declared_ancestors: HashSet<&str> = declared
        .iter()
        .flat_map(|d| d.path.match_indices('/').map(move |(i, _)| &d.path[..i]))
        .collect();
    for w in writes {
        if w.path.starts_with(&scratch_prefix) {
            v.scratch.push(w.clone());
            continue;
        }
        match w.kind {
            Kind::File if declared_paths.contains(w.path.as_str()) => v.matched.push(w.clone()),
            Kind::Dir if declared_ancestors.contains(w.path.as_str()) => {}
            _ => v.undeclared.push(w.clone()),
        }
    }
    let matched: HashSet<&str> = v.matched.iter().map(|m| m.path.as_str()).collect();
    let missing: Vec<String> = declared
        .iter()
        .filter(|d| !matched.contains(d.path.as_str()))
        .map(|d| d.path.clone())
        .collect();
    v.missing = missing;
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(path: &str, kind: Kind) -> RealizedWrite {
        RealizedWrite {
            path: path.into(),
            kind,
            size: 1,
            sha256: None,
            scope: 0,
            mode: 0o644,
        }
    }

    fn out(path: &str) -> DeclaredOutput {
        DeclaredOutput {
            path: path.into(),
            role: "r".into(),
        }
    }

    #[test]
    fn fr_rt_016_undeclared_and_missing_block() {
        let writes = [
            w("output/S/a.md", Kind::File),
            w("output/S/b.md", Kind::File),
            w("tmp/S/x", Kind::File),
        ];
        let v = verify(
            &writes,
            &[out("output/S/a.md"), out("output/S/c.md")],
            "tmp/S",
        );
        assert_eq!(v.matched.len(), 1);
        assert_eq!(v.undeclared, vec![w("output/S/b.md", Kind::File)]);
        assert_eq!(v.missing, vec!["output/S/c.md".to_owned()]);
        assert_eq!(v.scratch.len(), 1);
        assert!(!v.matches());
    }

    #[test]
    fn fr_rt_016_only_regular_files_commit() {
        for kind in [Kind::Symlink, Kind::Special, Kind::Deleted, Kind::OpaqueDir] {
            let v = verify(
                &[w("output/S/a.md", kind)],
                &[out("output/S/a.md")],
                "tmp/S",
            );
            assert!(!v.matches(), "{kind:?}");
            assert_eq!(v.missing, vec!["output/S/a.md".to_owned()]);
        }
        // New parent directories of declared outputs are implied.
        let v = verify(
            &[w("reports/S", Kind::Dir), w("reports/S/a.md", Kind::File)],
            &[out("reports/S/a.md")],
            "tmp/S",
        );
        assert!(v.matches());
        let v = verify(&[w("output/S/empty", Kind::Dir)], &[], "tmp/S");
        assert!(!v.matches());
    }
}
