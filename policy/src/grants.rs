//! Manifest entries that can grant nothing are refused at load, naming the
//! entry (DESIGN "Executables made by the turn"; issue 9). A silently inert
//! entry is a misunderstanding waiting to surface mid-task: the author
//! believes something is granted that never will be.
//!
//! Decided purely, at [`Manifest`](crate::Manifest) load ([`check_pure`]):
//!
//! 1. **Duplicates** — an entry repeating an earlier one of the same list
//!    (execute: same executable and same fixed arguments).
//! 2. **Covered by forbidden** — a read, write or execute entry every path of
//!    which a forbidden pattern matches (forbidden beats every grant).
//!    Decided segment by segment for patterns of the same kind (both relative
//!    or both absolute); when inclusion cannot be proven the entry is kept.
//! 3. **A write pattern with no directory** — `*.md`, `report.md`: its
//!    writable scope would be the workspace root, which is never overlaid.
//! 4. **Execute in the ledgers** — an execute entry under `planes/`: only
//!    the supervisor writes there, and never an executable.
//! 5. **Execute on a session path nobody can create** — a relative execute
//!    entry naming `<session_id>` exists only once a turn has created it, so
//!    it must lie where a turn can write: under `tmp/<session_id>/`,
//!    `output/<session_id>/`, or a write pattern. `tmp/<session_id>/**`
//!    (scratch is always writable) and `output/<session_id>/bin/*` are
//!    accepted; `build/<session_id>/*` without a write grant there is not.
//!
//! Decided against the host's file system, through the [`FsView`] seam
//! ([`check_on_host`], called by the supervisor before anything is created):
//!
//! 6. **A literal executable that does not exist** — `/usr/bin/pythno3`, or a
//!    relative `bin/run.sh` that no turn could create (not under a writable
//!    scope) and that is not in the workspace: refused with a suggestion of
//!    the nearest existing name in the same directory; and one that exists
//!    without any execute bit (`/etc/shadow`, a script never made
//!    executable), which `execve` refuses whoever calls it.
//!
//! Not refused: read patterns of `planes/` (a turn may read its ledgers, by
//! design), globs that match nothing *yet* (the workspace changes), entries
//! subsumed by a broader entry of the same list (redundant but not inert),
//! and absolute entries against relative forbidden patterns (the root is
//! only known at run time; the pre-execution check still applies).

use std::path::Path;

use crate::capabilities::Capabilities;
use crate::error::PolicyError;
use crate::fsview::{FileKind, FsView};
use crate::path::SESSION_PLACEHOLDER;
use crate::pattern::{Pattern, probe_session};

const GLOB_META: [char; 6] = ['*', '?', '[', ']', '{', '}'];

/// Where a turn may always write, besides the write patterns.
const ALWAYS_WRITABLE: [&str; 2] = ["tmp/<session_id>/**", "output/<session_id>/**"];

/// Where a turn may write: always its scratch and outputs, and every write
/// pattern.
fn writable_patterns(caps: &Capabilities) -> Vec<&str> {
    ALWAYS_WRITABLE
        .iter()
        .copied()
        .chain(caps.write.iter().map(Pattern::as_str))
        .collect()
}

fn grants_nothing(source: &Path, field: String, entry: &str, reason: String) -> PolicyError {
    PolicyError::EntryGrantsNothing {
        path: source.to_path_buf(),
        field,
        entry: entry.to_owned(),
        reason,
    }
}

fn segments(p: &str) -> Vec<&str> {
    p.trim_start_matches('/').split('/').collect()
}

fn is_glob(segment: &str) -> bool {
    segment.contains(GLOB_META)
}

/// Whether the one-segment glob `pattern` matches the literal `name`.
fn segment_matches(pattern: &str, name: &str) -> bool {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher().is_match(name))
        .unwrap_or(false)
}

/// True only when every path `p` grants (hierarchically: matches and what
/// lies below them) is matched, hierarchically, by `f`. `false` means "not
/// proven".
fn covered_by(p: &[&str], f: &[&str]) -> bool {
    if f == ["**"] {
        // `x/**` covers `x` itself and everything below it.
        return true;
    }
    match (p.split_first(), f.split_first()) {
        // `f` matched an ancestor (or `p` itself): everything below is covered.
        (_, None) => true,
        // `p` stops above what `f` matches: it grants more than `f` forbids.
        (None, Some(_)) => false,
        (Some((&"**", _)), _) | (_, Some((&"**", _))) => false,
        (Some((ps, p_rest)), Some((fs, f_rest))) => {
            let segment_covered =
                ps == fs || (is_glob(fs) && !is_glob(ps) && segment_matches(fs, ps)) || *fs == "*";
            segment_covered && covered_by(p_rest, f_rest)
        }
    }
}

/// Whether some path could be granted (hierarchically) by both `a` and `b`.
/// `true` means "possibly".
fn may_overlap(a: &[&str], b: &[&str]) -> bool {
    match (a.split_first(), b.split_first()) {
        (None, _) | (_, None) => true,
        (Some((&"**", _)), _) | (_, Some((&"**", _))) => true,
        (Some((x, a_rest)), Some((y, b_rest))) => {
            let compatible = x == y
                || (is_glob(x) && (is_glob(y) || segment_matches(x, y)))
                || (is_glob(y) && segment_matches(y, x));
            compatible && may_overlap(a_rest, b_rest)
        }
    }
}

/// The first earlier entry equal to entry `i`.
fn duplicate_of<T: PartialEq>(list: &[T], i: usize) -> Option<usize> {
    list[..i].iter().position(|e| *e == list[i])
}

/// The directory a write pattern's overlay covers (as the plan compiler
/// computes it): its static prefix, or for a literal file its parent.
fn write_scope(p: &Pattern) -> String {
    let session = probe_session();
    let prefix = p.static_prefix(&session);
    if prefix == p.expand(&session) {
        prefix
            .rsplit_once('/')
            .map(|(d, _)| d.to_owned())
            .unwrap_or_default()
    } else {
        prefix
    }
}

/// Rules 1–5: everything decidable from the manifest alone.
pub(crate) fn check_pure(caps: &Capabilities, source: &Path) -> Result<(), PolicyError> {
    // A read or execute pattern whose static prefix is `/` would put the
    // whole host into the turn's view (the state dir and every host socket
    // included): refused, naming the entry.
    let sid = probe_session();
    let shown = caps
        .read
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("capabilities.read[{i}]"), p))
        .chain(
            caps.execute
                .iter()
                .enumerate()
                .map(|(i, e)| (format!("capabilities.execute[{i}]"), &e.program)),
        );
    for (field, p) in shown {
        let prefix = p.static_prefix(&sid);
        if p.is_absolute() && prefix == "/" {
            return Err(PolicyError::InvalidManifest {
                path: source.to_path_buf(),
                field,
                reason: format!(
                    "`{p}` would show the whole host file system to every turn; grant the directories the package needs (e.g. `/usr/**`, `/etc/**`)"
                ),
            });
        }
        // The turn's /proc is its own, readable in every turn; a grant
        // beneath it adds nothing — except through a process's `root`,
        // `cwd` or `fd/N` links, which in the sandbox name its whole view
        // or the workspace.
        if p.is_absolute() && (prefix == "/proc" || prefix.starts_with("/proc/")) {
            return Err(PolicyError::InvalidManifest {
                path: source.to_path_buf(),
                field,
                reason: format!(
                    "`{p}` is beneath /proc, the turn's own procfs: every turn reads it already, and through a process's root, cwd or fd links it would name the turn's whole view; remove the entry"
                ),
            });
        }
    }
    let lists: [(&str, &[Pattern]); 3] = [
        ("read", &caps.read),
        ("write", &caps.write),
        ("forbidden", &caps.forbidden),
    ];
    for (name, list) in lists {
        for (i, p) in list.iter().enumerate() {
            if let Some(j) = duplicate_of(list, i) {
                return Err(grants_nothing(
                    source,
                    format!("capabilities.{name}[{i}]"),
                    p.as_str(),
                    format!("it repeats capabilities.{name}[{j}]; remove the duplicate"),
                ));
            }
        }
    }
    let exec_keys: Vec<(&str, &[String])> = caps
        .execute
        .iter()
        .map(|e| (e.program.as_str(), e.args.as_slice()))
        .collect();
    for (i, e) in caps.execute.iter().enumerate() {
        if let Some(j) = duplicate_of(&exec_keys, i) {
            return Err(grants_nothing(
                source,
                format!("capabilities.execute[{i}]"),
                e.as_str(),
                format!(
                    "it repeats capabilities.execute[{j}] (same executable, same fixed arguments); remove the duplicate"
                ),
            ));
        }
    }

    // Rule 2: covered by a forbidden pattern.
    let granted = caps
        .read
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("capabilities.read[{i}]"), p, p.as_str()))
        .chain(
            caps.write
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("capabilities.write[{i}]"), p, p.as_str())),
        )
        .chain(
            caps.execute
                .iter()
                .enumerate()
                .map(|(i, e)| (format!("capabilities.execute[{i}]"), &e.program, e.as_str())),
        );
    for (field, pattern, entry) in granted {
        for (k, f) in caps.forbidden.iter().enumerate() {
            if pattern.is_absolute() == f.is_absolute()
                && covered_by(&segments(pattern.as_str()), &segments(f.as_str()))
            {
                return Err(grants_nothing(
                    source,
                    field,
                    entry,
                    format!(
                        "every path it names is forbidden by `{f}` (capabilities.forbidden[{k}]), and forbidden beats every grant"
                    ),
                ));
            }
        }
    }

    // Rule 3: a write pattern needs a directory of its own.
    for (i, p) in caps.write.iter().enumerate() {
        if write_scope(p).is_empty() {
            return Err(grants_nothing(
                source,
                format!("capabilities.write[{i}]"),
                p.as_str(),
                "it has no fixed directory, so its writable scope would be the workspace root itself, which is never made writable; put the files in a directory (e.g. `reports/<session_id>/*.md`)".into(),
            ));
        }
    }

    // Rules 4 and 5: execute entries a turn can never find an executable in.
    let writable = writable_patterns(caps);
    for (i, e) in caps.execute.iter().enumerate() {
        let program = e.program.as_str();
        if e.program.is_absolute() {
            continue;
        }
        let field = format!("capabilities.execute[{i}]");
        if covered_by(&segments(program), &["planes"]) {
            return Err(grants_nothing(
                source,
                field,
                e.as_str(),
                "it lies in `planes/`, which holds only ledgers the supervisor writes; nothing there is ever executable".into(),
            ));
        }
        if program.contains(SESSION_PLACEHOLDER)
            && !writable
                .iter()
                .any(|w| may_overlap(&segments(program), &segments(w)))
        {
            return Err(grants_nothing(
                source,
                field,
                e.as_str(),
                format!(
                    "it names the session's own path, which exists only if a turn creates it, but no writable scope covers it: a turn writes only under `tmp/<session_id>/`, `output/<session_id>/` and the write patterns ({}); add a write pattern or move it under one",
                    if caps.write.is_empty() {
                        "none".to_owned()
                    } else {
                        caps.write
                            .iter()
                            .map(|w| format!("`{w}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            ));
        }
    }
    Ok(())
}

/// Edit distance between two short names.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            let next = (row[j] + 1).min(row[j + 1] + 1).min(prev + cost);
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The existing entry of `path`'s directory whose name is nearest to its
/// last component (at most two edits away).
fn nearest(fs: &dyn FsView, path: &str) -> Option<String> {
    let (dir, name) = path.rsplit_once('/')?;
    let listing = fs.list(if dir.is_empty() { "/" } else { dir });
    listing
        .into_iter()
        .map(|candidate| (distance(name, &candidate), candidate))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, candidate)| format!("{dir}/{candidate}"))
}

/// Rule 6: literal executables must exist on this host (or be creatable by
/// a turn). `root` is the absolute workspace root. Call it right after
/// loading the manifest, before a session or anything else is created.
pub fn check_on_host(
    caps: &Capabilities,
    source: &Path,
    root: &str,
    fs: &dyn FsView,
) -> Result<(), PolicyError> {
    let root = root.trim_end_matches('/');
    let writable = writable_patterns(caps);
    for (i, e) in caps.execute.iter().enumerate() {
        let program = e.program.as_str();
        if program.contains(GLOB_META) || program.contains(SESSION_PLACEHOLDER) {
            continue;
        }
        let absolute = if e.program.is_absolute() {
            program.to_owned()
        } else {
            // A turn may create it: the executable need not exist yet.
            if writable
                .iter()
                .any(|w| may_overlap(&segments(program), &segments(w)))
            {
                continue;
            }
            format!("{root}/{program}")
        };
        let is_file = fs
            .canonical(&absolute)
            .is_some_and(|c| fs.kind(&c) == Some(FileKind::File));
        if !is_file {
            let what = match fs.kind(&absolute) {
                None => "does not exist on this host",
                Some(FileKind::Dir) => "is a directory, not an executable file",
                Some(_) => "does not resolve to a regular file",
            };
            let hint = nearest(fs, &absolute)
                .filter(|n| *n != absolute)
                .map(|n| format!(" — did you mean `{n}`?"))
                .unwrap_or_default();
            return Err(grants_nothing(
                source,
                format!("capabilities.execute[{i}]"),
                e.as_str(),
                format!("`{absolute}` {what}{hint}"),
            ));
        }
        // execve needs an execute bit, for root too: a file with none can
        // never run (`/etc/shadow`, a script never made executable).
        if let Some(mode) = fs.mode(&absolute).filter(|m| m & 0o111 == 0) {
            return Err(grants_nothing(
                source,
                format!("capabilities.execute[{i}]"),
                e.as_str(),
                format!(
                    "`{absolute}` is not executable (mode {mode:04o}): make it executable, or grant the interpreter that runs it, with it as the interpreter's argument"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{Manifest, PackageId};
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    fn load(caps: &str) -> Result<Manifest, PolicyError> {
        Manifest::from_slice(
            format!(r#"{{"capabilities":{caps}}}"#).as_bytes(),
            &PackageId::parse("p").unwrap(),
            PathBuf::from("installed/p/manifest.json"),
        )
    }

    /// Red-team finding (wave 3): a read or execute pattern beneath /proc
    /// grants nothing every turn does not read already — and through a
    /// process's root, cwd or fd links it would name the whole view.
    #[test]
    fn patterns_beneath_proc_are_refused_naming_the_entry() {
        for (caps, field) in [
            (
                r#"{"read":["data/*.csv","/proc/self/root/**"]}"#,
                "capabilities.read[1]",
            ),
            (r#"{"read":["/proc/self/cwd/**"]}"#, "capabilities.read[0]"),
            (
                r#"{"read":["/proc/thread-self/root/etc/**"]}"#,
                "capabilities.read[0]",
            ),
            (r#"{"read":["/proc/1/root"]}"#, "capabilities.read[0]"),
            (r#"{"read":["/proc/**"]}"#, "capabilities.read[0]"),
            (
                r#"{"execute":["/proc/self/root/bin/sh"]}"#,
                "capabilities.execute[0]",
            ),
            (
                r#"{"execute":["/proc/self/exe"]}"#,
                "capabilities.execute[0]",
            ),
        ] {
            match load(caps) {
                Err(PolicyError::InvalidManifest {
                    field: f, reason, ..
                }) => {
                    assert_eq!(f, field, "{caps}");
                    assert!(reason.contains("/proc"), "{caps}: {reason}");
                }
                other => panic!("{caps}: {other:?}"),
            }
        }
        // A name that merely starts so is not beneath /proc.
        assert!(load(r#"{"read":["/procedures/**"]}"#).is_ok());
    }

    /// Each row: capabilities, the field named, a word of the reason.
    #[test]
    fn issue_9_entries_that_grant_nothing_are_refused_naming_the_entry() {
        let cases = [
            (
                r#"{"read":["data/**","data/**"]}"#,
                "capabilities.read[1]",
                "repeats capabilities.read[0]",
            ),
            (
                r#"{"forbidden":["/etc/shadow","/etc/shadow"]}"#,
                "capabilities.forbidden[1]",
                "repeats",
            ),
            (
                r#"{"execute":["/bin/true","/bin/true"]}"#,
                "capabilities.execute[1]",
                "repeats",
            ),
            (
                r#"{"execute":["/bin/sh -c","/bin/sh  -c"]}"#,
                "capabilities.execute[1]",
                "same fixed arguments",
            ),
            (
                r#"{"read":["secrets/key.pem"],"forbidden":["secrets/**"]}"#,
                "capabilities.read[0]",
                "forbidden by `secrets/**`",
            ),
            (
                r#"{"read":["secrets/**"],"forbidden":["secrets/**"]}"#,
                "capabilities.read[0]",
                "forbidden",
            ),
            (
                r#"{"read":["secrets/*.pem"],"forbidden":["secrets"]}"#,
                "capabilities.read[0]",
                "forbidden",
            ),
            (
                r#"{"read":["a/b/c.txt"],"forbidden":["a/*/*.txt"]}"#,
                "capabilities.read[0]",
                "forbidden",
            ),
            (
                r#"{"read":["a/x/**"],"forbidden":["a/*"]}"#,
                "capabilities.read[0]",
                "forbidden",
            ),
            (
                r#"{"read":["/etc/shadow"],"forbidden":["/etc/shadow"]}"#,
                "capabilities.read[0]",
                "forbidden",
            ),
            (
                r#"{"write":["reports/<session_id>/*.md"],"forbidden":["reports/**"]}"#,
                "capabilities.write[0]",
                "forbidden",
            ),
            (
                r#"{"execute":["bin/run.sh --fast"],"forbidden":["bin"]}"#,
                "capabilities.execute[0]",
                "forbidden",
            ),
            (
                r#"{"execute":["/usr/bin/python3"],"forbidden":["/usr/bin/python*"]}"#,
                "capabilities.execute[0]",
                "forbidden",
            ),
            (
                r#"{"write":["*.md"]}"#,
                "capabilities.write[0]",
                "no fixed directory",
            ),
            (
                r#"{"write":["report.md"]}"#,
                "capabilities.write[0]",
                "no fixed directory",
            ),
            (
                r#"{"execute":["planes/ho1/x"]}"#,
                "capabilities.execute[0]",
                "planes",
            ),
            (
                r#"{"execute":["build/<session_id>/app"]}"#,
                "capabilities.execute[0]",
                "no writable scope",
            ),
            (
                r#"{"execute":["build/<session_id>/*"],"write":["build/other/*"]}"#,
                "capabilities.execute[0]",
                "`build/other/*`",
            ),
        ];
        for (caps, field, needle) in cases {
            let err = load(caps).unwrap_err();
            assert_eq!(err.field(), Some(field), "{caps}: {err}");
            assert_eq!(err.code().code, "TS1007", "{caps}: {err}");
            assert!(err.to_string().contains(needle), "{caps}: {err}");
            assert!(err.to_string().contains("grant nothing"), "{caps}: {err}");
        }
    }

    #[test]
    fn issue_9_a_pattern_showing_the_whole_host_is_refused_naming_the_entry() {
        for (caps, field) in [
            (r#"{"read":["/usr/**","/**"]}"#, "capabilities.read[1]"),
            (r#"{"execute":["/*"]}"#, "capabilities.execute[0]"),
        ] {
            match load(caps) {
                Err(PolicyError::InvalidManifest {
                    field: f, reason, ..
                }) => {
                    assert_eq!(f, field, "{caps}");
                    assert!(reason.contains("whole host"), "{reason}");
                }
                other => panic!("{caps}: {other:?}"),
            }
        }
        assert!(load(r#"{"read":["/usr/**","/etc/*.conf"]}"#).is_ok());
    }

    #[test]
    fn entries_that_can_grant_are_accepted() {
        for caps in [
            // Executables the turn creates in its writable scopes.
            r#"{"execute":["tmp/<session_id>/**"]}"#,
            r#"{"execute":["tmp/<session_id>/venv/bin/python --version"]}"#,
            r#"{"execute":["output/<session_id>/bin/*"]}"#,
            r#"{"execute":["build/<session_id>/app"],"write":["build/<session_id>/**"]}"#,
            r#"{"execute":["build/<session_id>/*"],"write":["build/*/app"]}"#,
            // Same executable with different fixed arguments.
            r#"{"execute":["/bin/sh -c","/bin/sh -e"]}"#,
            // Forbidden inside a granted tree: the rest is still granted.
            r#"{"read":["installed/p/**"],"forbidden":["installed/p/secrets/**"]}"#,
            r#"{"read":["a/**"],"forbidden":["a/*"]}"#,
            r#"{"read":["data/*.csv"],"forbidden":["data/private.csv"]}"#,
            r#"{"read":["data/x*"],"forbidden":["data/x?"]}"#,
            // Ledgers may be read (DESIGN: masked unless a read pattern names them).
            r#"{"read":["planes/ho1/sessions/<session_id>/ledger/*.jsonl"]}"#,
            // Absolute vs relative cannot be compared without the root.
            r#"{"read":["/ws/secrets/x"],"forbidden":["secrets/**"]}"#,
            // Redundant but not inert.
            r#"{"read":["a/**","a/b"],"write":["output/<session_id>/**"]}"#,
        ] {
            assert!(load(caps).is_ok(), "{caps}: {:?}", load(caps).err());
        }
    }

    #[test]
    fn coverage_and_overlap_by_segment() {
        let c = |p: &str, f: &str| covered_by(&segments(p), &segments(f));
        assert!(c("a/b", "a"));
        assert!(c("a", "a/**"));
        assert!(c("a/**", "**"));
        assert!(!c("a", "a/*"));
        assert!(!c("a/**", "a/*/**"));
        assert!(!c("a/*", "a/b"));
        assert!(!c("a/**/x", "a/*/x"));
        let o = |a: &str, b: &str| may_overlap(&segments(a), &segments(b));
        assert!(o("tmp/<session_id>/**", "tmp/<session_id>/**"));
        assert!(o("x/<session_id>/bin/*", "x/*/bin/tool"));
        assert!(!o("x/<session_id>/bin/*", "y/**"));
        assert!(!o("a/b/c", "a/c/**"));
        assert_eq!(distance("pythno3", "python3"), 2);
        assert_eq!(distance("", "ab"), 2);
    }

    #[derive(Default)]
    struct Tree(BTreeMap<String, FileKind>);

    impl FsView for Tree {
        fn kind(&self, path: &str) -> Option<FileKind> {
            self.0.get(path).copied()
        }
        fn list(&self, path: &str) -> Vec<String> {
            let prefix = format!("{}/", path.trim_end_matches('/'));
            self.0
                .keys()
                .filter_map(|k| k.strip_prefix(&prefix))
                .filter(|r| !r.contains('/'))
                .map(str::to_owned)
                .collect()
        }
        fn canonical(&self, path: &str) -> Option<String> {
            self.0.contains_key(path).then(|| path.to_owned())
        }
        fn read_link(&self, _: &str) -> Option<String> {
            None
        }
        fn head(&self, _: &str, _: usize) -> Vec<u8> {
            Vec::new()
        }
    }

    fn tree() -> Tree {
        Tree(
            [
                ("/usr/bin", FileKind::Dir),
                ("/usr/bin/python3", FileKind::File),
                ("/usr/bin/perl", FileKind::File),
                ("/ws/installed/p/bin", FileKind::Dir),
                ("/ws/installed/p/bin/run.sh", FileKind::File),
            ]
            .into_iter()
            .map(|(p, k)| (p.to_owned(), k))
            .collect(),
        )
    }

    #[test]
    fn issue_9_a_typo_in_a_literal_executable_is_refused_with_a_suggestion() {
        let m = load(r#"{"execute":["/usr/bin/python3","/usr/bin/pythno3 -u"]}"#).unwrap();
        let err = check_on_host(&m.capabilities, &m.source, "/ws", &tree()).unwrap_err();
        assert_eq!(err.field(), Some("capabilities.execute[1]"));
        assert_eq!(err.code().code, "TS1007");
        let msg = err.to_string();
        assert!(msg.contains("does not exist on this host"), "{msg}");
        assert!(msg.contains("did you mean `/usr/bin/python3`?"), "{msg}");

        let m = load(r#"{"execute":["installed/p/bin/rnu.sh"]}"#).unwrap();
        let msg = check_on_host(&m.capabilities, &m.source, "/ws/", &tree())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("did you mean `/ws/installed/p/bin/run.sh`?"),
            "{msg}"
        );

        let m = load(r#"{"execute":["/usr/bin"]}"#).unwrap();
        let msg = check_on_host(&m.capabilities, &m.source, "/ws", &tree())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("is a directory"), "{msg}");
    }

    #[test]
    fn executables_that_exist_or_a_turn_can_create_pass_the_host_check() {
        let m = load(
            r#"{"execute":["/usr/bin/python3 -u","installed/p/bin/run.sh","/usr/bin/*",
                "tmp/<session_id>/a.out","out/app","output/<session_id>/bin/x"],
                "write":["out/*"]}"#,
        )
        .unwrap();
        check_on_host(&m.capabilities, &m.source, "/ws", &tree()).unwrap();
    }
}
