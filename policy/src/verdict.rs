//! The verdict (FR-RT-015, FR-RT-016): realized writes, as capture
//! enumerated them, compared with what the turn declared. Pure: the
//! supervisor enumerates, this decides.

use serde_json::{Value, json};

use crate::request::DeclaredOutput;

/// What kind of change an upper-dir entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    /// A directory the turn created where nothing was.
    Dir,
    /// An existing directory whose permission bits the turn changed.
    DirMode,
    /// An existing directory the turn replaced (removed and recreated): it
    /// hides what the directory held.
    OpaqueDir,
    /// A directory the turn made where a file (or link) was.
    DirOverFile,
    /// A regular file the turn made where a directory was (`rm -r d` then
    /// a file `d`): it would hide what the directory held, and no rename
    /// can put it in place — never committed, in scratch neither.
    FileOverDir,
    Symlink,
    /// A deletion (overlay whiteout).
    Deleted,
    /// A FIFO, socket or device node.
    Special,
    /// An entry whose name is not valid UTF-8: the ledgers record paths as
    /// JSON strings, so it can be neither recorded nor committed faithfully
    /// (its path is shown with the bad bytes as `\xNN`); never committed,
    /// in scratch neither. A directory's contents are not looked into.
    NonUtf8Name,
}

impl Kind {
    /// Why a write of this kind outside the scratch space does not commit
    /// unless it is a declared output or an implied parent of one.
    pub fn why_blocked(self) -> &'static str {
        match self {
            Self::File => "only declared files commit",
            Self::Dir => {
                "a new directory commits only as the parent of declared outputs, holding nothing else"
            }
            Self::DirMode => "an existing directory's permissions never change by a commit",
            Self::OpaqueDir => {
                "an existing directory was removed and recreated, which would hide what it held"
            }
            Self::DirOverFile => "a directory would replace an existing file",
            Self::FileOverDir => "a file would replace an existing directory, hiding what it held",
            Self::Symlink => "symbolic links never commit",
            Self::Deleted => {
                "a deletion (or the old name of a renamed file or directory) never commits"
            }
            Self::Special => "FIFOs, sockets and device nodes never commit",
            Self::NonUtf8Name => {
                "a name that is not valid UTF-8 cannot be recorded in the ledgers; rename it (e.g. `convmv`, or unpack archives with a UTF-8 name encoding)"
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Dir => "dir",
            Self::DirMode => "dir_mode",
            Self::OpaqueDir => "opaque_dir",
            Self::DirOverFile => "dir_over_file",
            Self::FileOverDir => "file_over_dir",
            Self::Symlink => "symlink",
            Self::Deleted => "deleted",
            Self::Special => "special",
            Self::NonUtf8Name => "non_utf8_name",
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
    /// New directories that hold only declared outputs (or directories
    /// leading to them): they commit with them, as Bazel creates the
    /// parents of declared outputs.
    pub implied: Vec<RealizedWrite>,
}

impl Verdict {
    pub fn matches(&self) -> bool {
        self.undeclared.is_empty() && self.missing.is_empty()
    }
}

/// The name prefix the commit stages an output under beside its final
/// place: reserved. A write bearing it in any component never commits
/// (nor does a scratch write), so no turn can make a file the commit
/// would take for its own.
pub const STAGING_PREFIX: &str = ".turnstile-stage-";

/// Whether a component of `path` bears [`STAGING_PREFIX`].
pub fn is_staging_name(path: &str) -> bool {
    path.split('/').any(|c| c.starts_with(STAGING_PREFIX))
}

/// Compares realized writes with `declared` (FR-RT-016). `scratch` is
/// `tmp/<sid>`.
pub fn verify(writes: &[RealizedWrite], declared: &[DeclaredOutput], scratch: &str) -> Verdict {
    verify_trees(writes, declared, scratch, &|_: &str| false)
}

/// The directory a declared tree output (`PATH/**`) names, if it is one.
pub fn tree_of(declared: &str) -> Option<&str> {
    declared.strip_suffix("/**").filter(|p| !p.is_empty())
}

/// [`verify`], where a declared output `PATH/**` is a tree (as Bazel's
/// tree artifacts): every file written under PATH is declared, and the new
/// directories under it are its implied parents — except a file `forbidden`
/// names, which stays undeclared (a tree never carries a forbidden path
/// through). A tree declares no file it must hold.
pub fn verify_trees(
    writes: &[RealizedWrite],
    declared: &[DeclaredOutput],
    scratch: &str,
    forbidden: &dyn Fn(&str) -> bool,
) -> Verdict {
    use std::collections::HashSet;
    let mut v = Verdict::default();
    let scratch_prefix = format!("{scratch}/");
    let trees: Vec<String> = declared
        .iter()
        .filter_map(|d| tree_of(&d.path))
        .map(|t| format!("{t}/"))
        .collect();
    let in_tree = |p: &str| trees.iter().any(|t| p.starts_with(t.as_str()));
    let is_tree_or_in =
        |p: &str| in_tree(p) || trees.iter().any(|t| t.strip_suffix('/') == Some(p));
    // Sets, not scans: 10,000 declared outputs must not cost 10^8 compares.
    let declared_paths: HashSet<&str> = declared.iter().map(|d| d.path.as_str()).collect();
    let declared_ancestors: HashSet<&str> = declared
        .iter()
        .flat_map(|d| d.path.match_indices('/').map(move |(i, _)| &d.path[..i]))
        .collect();
    for w in writes {
        if is_staging_name(&w.path) || matches!(w.kind, Kind::FileOverDir | Kind::NonUtf8Name) {
            v.undeclared.push(w.clone());
            continue;
        }
        if w.path.starts_with(&scratch_prefix) {
            // Scratch commits too (to the session's tmp/): never a path
            // `forbidden` names (red-team wave 4: it was committed unjudged).
            if forbidden(&w.path) {
                v.undeclared.push(w.clone());
            } else {
                v.scratch.push(w.clone());
            }
            continue;
        }
        match w.kind {
            Kind::File if declared_paths.contains(w.path.as_str()) => v.matched.push(w.clone()),
            Kind::File if in_tree(&w.path) && !forbidden(&w.path) => v.matched.push(w.clone()),
            // A new directory on the way to a declared output, or inside a
            // declared tree: implied. Anything else in it is a write of its
            // own and judged so, so an implied parent never carries an
            // undeclared file through.
            Kind::Dir if declared_ancestors.contains(w.path.as_str()) || is_tree_or_in(&w.path) => {
                v.implied.push(w.clone());
            }
            _ => v.undeclared.push(w.clone()),
        }
    }
    let matched: HashSet<&str> = v.matched.iter().map(|m| m.path.as_str()).collect();
    let missing: Vec<String> = declared
        .iter()
        .filter(|d| tree_of(&d.path).is_none() && !matched.contains(d.path.as_str()))
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
    fn a_file_over_a_directory_or_a_non_utf8_name_never_commits_not_even_in_scratch() {
        let writes = [
            w("out/z", Kind::FileOverDir),
            w("tmp/s/d", Kind::FileOverDir),
            w("out/caf\\xe9", Kind::NonUtf8Name),
            w("tmp/s/caf\\xe9", Kind::NonUtf8Name),
        ];
        let v = verify(&writes, &[out("out/z")], "tmp/s");
        assert!(v.matched.is_empty() && v.scratch.is_empty(), "{v:?}");
        assert_eq!(v.undeclared.len(), 4);
        assert_eq!(v.missing, vec!["out/z".to_owned()]);
    }

    #[test]
    fn a_forbidden_path_in_scratch_blocks() {
        let writes = [w("tmp/s/secret/x", Kind::File), w("tmp/s/ok", Kind::File)];
        let v = verify_trees(&writes, &[], "tmp/s", &|p: &str| {
            p.starts_with("tmp/s/secret/")
        });
        assert_eq!(v.scratch.len(), 1);
        assert_eq!(v.undeclared.len(), 1);
        assert!(!v.matches());
    }

    #[test]
    fn a_staging_name_is_never_a_turns_write() {
        let x = format!("out/{STAGING_PREFIX}0123");
        let writes = [
            w("out/a", Kind::File),
            w(&x, Kind::File),
            w(&format!("tmp/s/{STAGING_PREFIX}1/f"), Kind::File),
        ];
        let v = verify(&writes, &[out("out/a"), out(&x)], "tmp/s");
        assert_eq!(v.matched.len(), 1);
        assert_eq!(v.undeclared.len(), 2, "{v:?}");
        assert_eq!(v.missing, vec![x.clone()]);
        assert!(!v.matches());
        assert!(!is_staging_name("out/.turnstile-t1"));
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

    /// Issue 29: a declared tree (`PATH/**`) declares every file written
    /// under it and implies its new directories; a forbidden file under it,
    /// or anything outside it, still blocks; an empty tree is not missing.
    #[test]
    fn a_declared_tree_declares_what_is_written_under_it() {
        let writes = [
            w("output/S/dist", Kind::Dir),
            w("output/S/dist/a", Kind::Dir),
            w("output/S/dist/a/x.js", Kind::File),
            w("output/S/dist/y.js", Kind::File),
        ];
        let tree = [out("output/S/dist/**")];
        let v = verify_trees(&writes, &tree, "tmp/S", &|_: &str| false);
        assert!(v.matches(), "{v:?}");
        assert_eq!(v.matched.len(), 2);
        assert_eq!(v.implied.len(), 2);
        let v = verify_trees(&writes, &tree, "tmp/S", &|p: &str| p.ends_with("y.js"));
        assert_eq!(v.undeclared, vec![w("output/S/dist/y.js", Kind::File)]);
        let mut outside = writes.to_vec();
        outside.push(w("output/S/other.txt", Kind::File));
        let v = verify_trees(&outside, &tree, "tmp/S", &|_: &str| false);
        assert_eq!(v.undeclared, vec![w("output/S/other.txt", Kind::File)]);
        let v = verify_trees(&[], &tree, "tmp/S", &|_: &str| false);
        assert!(v.matches(), "an empty tree is not missing");
        // A symlink in a tree is no more a file than elsewhere.
        let v = verify_trees(
            &[w("output/S/dist/l", Kind::Symlink)],
            &tree,
            "tmp/S",
            &|_: &str| false,
        );
        assert!(!v.matches());
    }

    /// Issue 23: the new directories leading to a declared output are
    /// implied; a new directory leading to none, an existing directory's
    /// chmod, a replaced directory and a directory over a file all block.
    #[test]
    fn new_parents_of_declared_outputs_are_implied() {
        let writes = [
            w("output/S/a", Kind::Dir),
            w("output/S/a/b", Kind::Dir),
            w("output/S/a/b/c", Kind::Dir),
            w("output/S/a/b/c/r.txt", Kind::File),
        ];
        let v = verify(&writes, &[out("output/S/a/b/c/r.txt")], "tmp/S");
        assert!(v.matches(), "{v:?}");
        assert_eq!(v.implied.len(), 3);
        assert_eq!(v.matched.len(), 1);

        for (extra, kind) in [
            ("output/S/a/empty", Kind::Dir),
            ("output/S/a/b/x.txt", Kind::File),
            ("output/S/a", Kind::DirMode),
            ("output/S/a", Kind::OpaqueDir),
            ("output/S/a", Kind::DirOverFile),
            ("output/S/old", Kind::Deleted),
        ] {
            let mut ws: Vec<RealizedWrite> =
                writes.iter().filter(|x| x.path != extra).cloned().collect();
            ws.push(w(extra, kind));
            let v = verify(&ws, &[out("output/S/a/b/c/r.txt")], "tmp/S");
            assert!(!v.matches(), "{extra} {kind:?}");
            assert_eq!(v.undeclared, vec![w(extra, kind)], "{extra} {kind:?}");
            assert!(!kind.why_blocked().is_empty());
        }
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
