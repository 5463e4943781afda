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
