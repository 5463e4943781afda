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

impl FileKind {
    /// The kind of a file type as `lstat` reports it.
    pub fn of(t: std::fs::FileType) -> Self {
        if t.is_symlink() {
            Self::Symlink
        } else if t.is_dir() {
            Self::Dir
        } else if t.is_file() {
            Self::File
        } else {
            Self::Other
        }
    }
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
    /// The permission bits of a path's target (`stat`), `None` when not
    /// known (the default: a view that cannot tell refuses nothing by it).
    fn mode(&self, _path: &str) -> Option<u32> {
        None
    }
}

/// An [`FsView`] that asks its inner view each question once: one plan's
/// compile asks the kind of the same paths several times (the baseline,
/// its Landlock rules, the grants), and resolves the same prefixes
/// (`/usr`, `/usr/bin`, `/lib` → `usr/lib`, …) for every program, loader
/// and baseline path. Answers are kept for the life of the memo (one
/// compile), so they are also consistent within it.
///
/// `canonical` of an absolute path is resolved here, component by
/// component, as `realpath(3)` does, from the memoized `kind` (lstat) and
/// `read_link` of each prefix: `.` and empty components are skipped, `..`
/// drops the last resolved component (the resolved prefix holds no
/// symlink, so that is its real parent), a symlink's target replaces it
/// (an absolute one from `/`), at most [`MAX_LINKS`] links are followed
/// (then `None`, as `ELOOP`), a missing component is `None` (`ENOENT`)
/// and anything but a directory followed by more of the path is `None`
/// (`ENOTDIR`, a trailing slash included). A relative path, or a symlink
/// whose target cannot be read, is the inner view's `canonical`.
pub struct Memo<'a> {
    inner: &'a dyn FsView,
    kinds: std::cell::RefCell<std::collections::HashMap<String, Option<FileKind>>>,
    links: std::cell::RefCell<std::collections::HashMap<String, Option<String>>>,
    canonical: std::cell::RefCell<std::collections::HashMap<String, Option<String>>>,
}

/// Symlinks [`Memo::canonical`] follows in one resolution before it gives
/// up, as the kernel's and glibc's limit (`ELOOP`).
pub const MAX_LINKS: usize = 40;

/// Where a resolution ends: resolved, or handed to the inner view.
enum Resolved {
    Path(Option<String>),
    Inner,
}

impl std::fmt::Debug for Memo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memo")
            .field("kinds", &self.kinds.borrow().len())
            .field("links", &self.links.borrow().len())
            .field("canonical", &self.canonical.borrow().len())
            .finish()
    }
}

impl<'a> Memo<'a> {
    pub fn new(inner: &'a dyn FsView) -> Self {
        Self {
            inner,
            kinds: Default::default(),
            links: Default::default(),
            canonical: Default::default(),
        }
    }

    /// `realpath` of an absolute `path` from memoized kinds and links
    /// (see [`Memo`]).
    fn resolve(&self, path: &str) -> Resolved {
        if !path.starts_with('/') {
            return Resolved::Inner;
        }
        // What is left to walk, last component first (so a link's target
        // is pushed in front of the rest).
        let mut left: Vec<String> = path.split('/').rev().map(str::to_owned).collect();
        left.pop(); // the empty component before the leading '/'
        let mut resolved = String::new();
        let mut links = 0usize;
        while let Some(part) = left.pop() {
            match part.as_str() {
                "" | "." => continue,
                ".." => {
                    let cut = resolved.rfind('/').unwrap_or(0);
                    resolved.truncate(cut);
                    continue;
                }
                _ => {}
            }
            let candidate = format!("{resolved}/{part}");
            match self.kind(&candidate) {
                None => return Resolved::Path(None),
                Some(FileKind::Dir) => resolved = candidate,
                Some(FileKind::Symlink) => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Resolved::Path(None);
                    }
                    let Some(target) = self.read_link(&candidate) else {
                        return Resolved::Inner;
                    };
                    if target.starts_with('/') {
                        resolved.clear();
                    }
                    left.extend(target.split('/').rev().map(str::to_owned));
                }
                Some(_) => {
                    // Only the last component may be other than a
                    // directory (a trailing slash is one more component).
                    if !left.is_empty() {
                        return Resolved::Path(None);
                    }
                    resolved = candidate;
                }
            }
        }
        Resolved::Path(Some(if resolved.is_empty() {
            "/".to_owned()
        } else {
            resolved
        }))
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
        let c = match self.resolve(path) {
            Resolved::Path(c) => c,
            Resolved::Inner => self.inner.canonical(path),
        };
        self.canonical
            .borrow_mut()
            .insert(path.to_owned(), c.clone());
        c
    }

    fn read_link(&self, path: &str) -> Option<String> {
        if let Some(l) = self.links.borrow().get(path) {
            return l.clone();
        }
        let l = self.inner.read_link(path);
        self.links.borrow_mut().insert(path.to_owned(), l.clone());
        l
    }

    fn head(&self, path: &str, len: usize) -> Vec<u8> {
        self.inner.head(path, len)
    }

    fn mode(&self, path: &str) -> Option<u32> {
        self.inner.mode(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::collections::HashMap;

    /// A tree of kinds and links; counts the questions; its `canonical`
    /// (asked only for what the memo hands on) resolves one link, `/bin`
    /// -> `/usr/bin`, as realpath would.
    struct Tree {
        kinds: HashMap<&'static str, FileKind>,
        asked_kind: Cell<usize>,
        asked_link: Cell<usize>,
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
            let p = path
                .strip_prefix("/bin")
                .map_or(path.to_owned(), |r| format!("/usr/bin{r}"));
            self.kinds.contains_key(p.as_str()).then_some(p)
        }
        fn read_link(&self, path: &str) -> Option<String> {
            self.asked_link.set(self.asked_link.get() + 1);
            match path {
                "/bin" => Some("usr/bin".into()),
                "/loop" => Some("/loop".into()),
                _ => None,
            }
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
                ("/loop", Symlink),
                ("/odd", Symlink),
                ("/usr", Dir),
                ("/usr/bin", Dir),
                ("/usr/bin/sh", File),
            ]),
            asked_kind: Cell::new(0),
            asked_link: Cell::new(0),
            asked_canonical: Cell::new(0),
        }
    }

    /// The memo resolves absolute paths itself from kinds and links asked
    /// once each; a relative path, or a link it cannot read, is the inner
    /// view's.
    #[test]
    fn issue_29_memo_resolves_paths_from_kinds_and_links_asked_once() {
        let t = tree();
        let m = Memo::new(&t);
        assert_eq!(m.canonical("/etc/passwd").as_deref(), Some("/etc/passwd"));
        assert_eq!(m.canonical("/etc/group").as_deref(), Some("/etc/group"));
        assert_eq!(m.canonical("/etc/ssl").as_deref(), Some("/etc/ssl"));
        assert_eq!(m.kind("/etc/passwd"), Some(FileKind::File));
        assert_eq!(
            t.asked_kind.get(),
            4,
            "/etc, /etc/passwd, /etc/group, /etc/ssl"
        );
        assert_eq!(m.canonical("/bin/sh").as_deref(), Some("/usr/bin/sh"));
        assert_eq!(m.canonical("/etc/nope"), None, "ENOENT");
        assert_eq!(m.canonical("/etc/./passwd").as_deref(), Some("/etc/passwd"));
        assert_eq!(m.canonical("/etc//ssl/").as_deref(), Some("/etc/ssl"));
        assert_eq!(
            m.canonical("/etc/ssl/../passwd").as_deref(),
            Some("/etc/passwd")
        );
        assert_eq!(m.canonical("/../etc").as_deref(), Some("/etc"));
        assert_eq!(
            m.canonical("/bin/../bin/sh").as_deref(),
            Some("/usr/bin/sh")
        );
        assert_eq!(m.canonical("/etc/passwd/x"), None, "ENOTDIR");
        assert_eq!(m.canonical("/etc/passwd/"), None, "ENOTDIR");
        assert_eq!(m.canonical("/etc/passwd/.."), None, "ENOTDIR");
        assert_eq!(m.canonical("/loop/x"), None, "ELOOP");
        assert_eq!(t.asked_canonical.get(), 0);
        // Handed on: a relative path, a link whose target is unreadable.
        assert_eq!(m.canonical("etc/passwd"), None);
        assert_eq!(
            m.canonical("/odd").as_deref(),
            Some("/odd"),
            "the inner view's answer"
        );
        assert_eq!(t.asked_canonical.get(), 2);
        // Asked again: nothing reaches the inner view.
        let asked = (
            t.asked_kind.get(),
            t.asked_link.get(),
            t.asked_canonical.get(),
        );
        assert_eq!(m.canonical("/bin/sh").as_deref(), Some("/usr/bin/sh"));
        assert_eq!(m.canonical("/usr/bin/sh").as_deref(), Some("/usr/bin/sh"));
        assert_eq!(m.kind("/etc/ssl"), Some(FileKind::Dir));
        assert_eq!(m.read_link("/bin").as_deref(), Some("usr/bin"));
        assert_eq!(
            (
                t.asked_kind.get(),
                t.asked_link.get(),
                t.asked_canonical.get()
            ),
            asked
        );
        assert_eq!(m.canonical("/").as_deref(), Some("/"));
    }

    /// The host's file system, as the supervisor's view answers.
    struct Real;

    impl FsView for Real {
        fn kind(&self, path: &str) -> Option<FileKind> {
            Some(FileKind::of(
                std::fs::symlink_metadata(path).ok()?.file_type(),
            ))
        }
        fn list(&self, _: &str) -> Vec<String> {
            Vec::new()
        }
        fn canonical(&self, _: &str) -> Option<String> {
            panic!("the memo resolves every absolute path of this test itself")
        }
        fn read_link(&self, path: &str) -> Option<String> {
            std::fs::read_link(path)
                .ok()?
                .into_os_string()
                .into_string()
                .ok()
        }
        fn head(&self, _: &str, _: usize) -> Vec<u8> {
            Vec::new()
        }
    }

    /// On a real tree of directories, a file, a socket and links (relative,
    /// absolute, chained, through `..`, dangling, looping), the memo's
    /// resolution is `realpath`'s, path for path.
    #[test]
    fn issue_29_memo_resolves_as_realpath_does() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let r = root.to_str().unwrap().to_owned();
        for d in ["a/b/c", "x/y", "e"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("a/b/f"), b"").unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(root.join("x/sock")).unwrap();
        let links: &[(&str, String)] = &[
            ("a/up", "..".into()),
            ("a/rel", "b/c".into()),
            ("a/abs", format!("{r}/x/y")),
            ("a/chain", "rel".into()),
            ("a/tofile", "b/f".into()),
            ("a/dotdot", "../x/./y/..".into()),
            ("a/dangling", "nowhere".into()),
            ("a/loop1", "loop2".into()),
            ("a/loop2", "loop1".into()),
            ("x/back", format!("{r}/a/up/a/chain")),
            ("e/root", "/".into()),
        ];
        for (at, to) in links {
            symlink(to, root.join(at)).unwrap();
        }
        let asked = [
            "",
            "/",
            "/a",
            "/a/",
            "/a/.",
            "/a/..",
            "/a/b/c",
            "/a/b/f",
            "/a/b/f/",
            "/a/b/f/..",
            "/a/b/f/x",
            "/a/up",
            "/a/up/a/up/x",
            "/a/rel",
            "/a/rel/..",
            "/a/rel/../f",
            "/a/abs",
            "/a/abs/../..",
            "/a/chain",
            "/a/chain/",
            "/a/tofile",
            "/a/tofile/",
            "/a/dotdot",
            "/a/dotdot/y",
            "/a/dangling",
            "/a/dangling/",
            "/a/loop1",
            "/a/loop1/x",
            "/x/back",
            "/x/back/..",
            "/x/sock",
            "/x/sock/",
            "/e/root",
            "/nope",
            "/a//b///c",
            "/./a/./b",
        ];
        let real = Real;
        let m = Memo::new(&real);
        for rel in asked {
            let path = format!("{r}{rel}");
            let expected = std::fs::canonicalize(&path)
                .ok()
                .map(|p| p.into_os_string().into_string().unwrap());
            assert_eq!(m.canonical(&path), expected, "realpath of {path}");
        }
        assert_eq!(
            m.canonical(&format!("{r}/e/root/../..")),
            Some("/".to_owned())
        );
        assert_eq!(
            m.canonical(&format!("{r}/e/root{r}/a/rel")),
            Some(format!("{r}/a/b/c"))
        );
    }
}
