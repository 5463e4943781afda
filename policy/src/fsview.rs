//! The file-system seam of the pure policy code: what the plan compiler
//! and the host checks of manifest entries ask about the host, answered by
//! the supervisor's real file system or by a fake tree in unit tests.

/// What a path is, as `lstat` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Read-only questions the compiler asks about the host's file system.
pub trait FsView {
    /// `lstat` kind of an absolute path, `None` if it does not exist.
    fn kind(&self, path: &str) -> Option<FileKind>;
    /// Entry names of a directory (empty when unreadable).
    fn list(&self, path: &str) -> Vec<String>;
    /// The path with every symlink resolved (`realpath`).
    fn canonical(&self, path: &str) -> Option<String>;
    /// Target of a symlink.
    fn read_link(&self, path: &str) -> Option<String>;
    /// The first bytes of a file (to find a `#!` interpreter).
    fn head(&self, path: &str, len: usize) -> Vec<u8>;
}

/// An [`FsView`] that asks its inner view each question once: one plan's
/// compile asks the kind of the same paths several times (the baseline,
/// its Landlock rules, the grants), and the canonical form of paths whose
/// every component is a real directory — the path itself. Answers are
/// kept for the life of the memo (one compile), so they are also
/// consistent within it.
///
/// `canonical` answers without the inner view when the path is absolute
/// and normalized (no empty, `.` or `..` component), every proper prefix
/// is a directory and the path itself exists and is not a symlink (all as
/// `kind` says): `realpath` of such a path is the path. Anything else —
/// a symlink anywhere on the way, a missing or non-directory parent — is
/// the inner view's `canonical`.
pub struct Memo<'a> {
    inner: &'a dyn FsView,
    kinds: std::cell::RefCell<std::collections::HashMap<String, Option<FileKind>>>,
    canonical: std::cell::RefCell<std::collections::HashMap<String, Option<String>>>,
}

impl std::fmt::Debug for Memo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memo")
            .field("kinds", &self.kinds.borrow().len())
            .field("canonical", &self.canonical.borrow().len())
            .finish()
    }
}

impl<'a> Memo<'a> {
    pub fn new(inner: &'a dyn FsView) -> Self {
        Self {
            inner,
            kinds: Default::default(),
            canonical: Default::default(),
        }
    }

    /// The path itself when it is its own canonical form (see [`Memo`]).
    fn plain(&self, path: &str) -> Option<String> {
        let rest = path.strip_prefix('/')?;
        if rest.is_empty() {
            return Some("/".to_owned());
        }
        let mut end = 0;
        let parts: Vec<&str> = rest.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            if part.is_empty() || *part == "." || *part == ".." {
                return None;
            }
            end += 1 + part.len();
            let kind = self.kind(&path[..end])?;
            let last = i + 1 == parts.len();
            match kind {
                FileKind::Symlink => return None,
                FileKind::Dir => {}
                _ if last => {}
                _ => return None,
            }
        }
        Some(path.to_owned())
    }
}

impl FsView for Memo<'_> {
    fn kind(&self, path: &str) -> Option<FileKind> {
        if let Some(k) = self.kinds.borrow().get(path) {
            return *k;
        }
        let k = self.inner.kind(path);
        self.kinds.borrow_mut().insert(path.to_owned(), k);
        k
    }

    fn list(&self, path: &str) -> Vec<String> {
        self.inner.list(path)
    }

    fn canonical(&self, path: &str) -> Option<String> {
        if let Some(c) = self.canonical.borrow().get(path) {
            return c.clone();
        }
        let c = self.plain(path).or_else(|| self.inner.canonical(path));
        self.canonical
            .borrow_mut()
            .insert(path.to_owned(), c.clone());
        c
    }

    fn read_link(&self, path: &str) -> Option<String> {
        self.inner.read_link(path)
    }

    fn head(&self, path: &str, len: usize) -> Vec<u8> {
        self.inner.head(path, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::collections::HashMap;

    /// A tree of kinds; counts the questions; `canonical` resolves one
    /// link, `/bin` -> `/usr/bin`, as realpath would.
    struct Tree {
        kinds: HashMap<&'static str, FileKind>,
        asked_kind: Cell<usize>,
        asked_canonical: Cell<usize>,
    }

    impl FsView for Tree {
        fn kind(&self, path: &str) -> Option<FileKind> {
            self.asked_kind.set(self.asked_kind.get() + 1);
            self.kinds.get(path).copied()
        }
        fn list(&self, _: &str) -> Vec<String> {
            Vec::new()
        }
        fn canonical(&self, path: &str) -> Option<String> {
            self.asked_canonical.set(self.asked_canonical.get() + 1);
            let p = path.replace("/./", "/").replace("/bin/", "/usr/bin/");
            let p = p
                .strip_prefix("/bin")
                .map_or(p.clone(), |r| format!("/usr/bin{r}"));
            self.kinds.contains_key(p.as_str()).then_some(p)
        }
        fn read_link(&self, _: &str) -> Option<String> {
            None
        }
        fn head(&self, _: &str, _: usize) -> Vec<u8> {
            Vec::new()
        }
    }

    fn tree() -> Tree {
        use FileKind::*;
        Tree {
            kinds: HashMap::from([
                ("/", Dir),
                ("/etc", Dir),
                ("/etc/passwd", File),
                ("/etc/group", File),
                ("/etc/ssl", Dir),
                ("/bin", Symlink),
                ("/usr", Dir),
                ("/usr/bin", Dir),
                ("/usr/bin/sh", File),
            ]),
            asked_kind: Cell::new(0),
            asked_canonical: Cell::new(0),
        }
    }

    /// A path of real directories is its own canonical form, found from
    /// kinds asked once each; anything else is the inner view's answer.
    #[test]
    fn issue_29_memo_answers_plain_paths_itself_and_asks_each_kind_once() {
        let t = tree();
        let m = Memo::new(&t);
        assert_eq!(m.canonical("/etc/passwd").as_deref(), Some("/etc/passwd"));
        assert_eq!(m.canonical("/etc/group").as_deref(), Some("/etc/group"));
        assert_eq!(m.canonical("/etc/ssl").as_deref(), Some("/etc/ssl"));
        assert_eq!(m.kind("/etc/passwd"), Some(FileKind::File));
        assert_eq!(t.asked_canonical.get(), 0);
        assert_eq!(
            t.asked_kind.get(),
            4,
            "/etc, /etc/passwd, /etc/group, /etc/ssl"
        );
        // A symlink on the way, a missing path, `.`, a relative path, a
        // trailing slash, a file as a directory: the inner view resolves.
        assert_eq!(m.canonical("/bin/sh").as_deref(), Some("/usr/bin/sh"));
        assert_eq!(m.canonical("/etc/nope"), None);
        assert_eq!(m.canonical("/etc/./passwd").as_deref(), Some("/etc/passwd"));
        assert_eq!(m.canonical("etc/passwd"), None);
        assert_eq!(m.canonical("/etc/"), None);
        assert_eq!(m.canonical("/etc/passwd/x"), None);
        assert_eq!(t.asked_canonical.get(), 6);
        // Asked again: nothing reaches the inner view.
        let (k, c) = (t.asked_kind.get(), t.asked_canonical.get());
        assert_eq!(m.canonical("/bin/sh").as_deref(), Some("/usr/bin/sh"));
        assert_eq!(m.kind("/etc/ssl"), Some(FileKind::Dir));
        assert_eq!((t.asked_kind.get(), t.asked_canonical.get()), (k, c));
        assert_eq!(m.canonical("/").as_deref(), Some("/"));
    }
}
