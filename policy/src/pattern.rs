//! Capability patterns: globs relative to the workspace root (or absolute host
//! paths), with `<session_id>` expanded per session.
//!
//! Semantics (DESIGN "Capabilities — exact semantics"):
//! - `*`, `?`, `[..]`, `{a,b}` stay inside one path segment; `**` (a whole
//!   segment) crosses segments;
//! - matching is hierarchical, as Landlock is: a pattern that matches a
//!   directory covers everything below it;
//! - relative patterns are matched against workspace-relative paths, absolute
//!   patterns against absolute paths; a path under the root is seen both ways.

use std::fmt;

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use time::OffsetDateTime;

use crate::path::{self, Absolute};
use crate::session::SessionId;

/// A syntactically valid capability pattern, not yet bound to a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(String);

/// A session id used only to check patterns before a session exists. Every
/// session id has the same length and alphabet, so a list that compiles
/// with this id compiles with any.
pub(crate) fn probe_session() -> SessionId {
    SessionId::from_parts(OffsetDateTime::UNIX_EPOCH, 0)
}

fn glob(raw: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(raw)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
}

const GLOB_META: [char; 6] = ['*', '?', '[', ']', '{', '}'];

/// Most patterns in one capability list (`read`, `write`, `execute`,
/// `forbidden`). A list is compiled into one matcher; past this, manifests
/// stop being reviewable and the matcher's size grows without bound.
pub const MAX_PATTERNS: usize = 1024;

/// Longest pattern, in bytes, as written (before `<session_id>` expands).
/// Every segment is also at most 255 bytes (NAME_MAX), as for paths.
pub const MAX_PATTERN_BYTES: usize = 1024;

/// Why a list of patterns cannot be compiled into one matcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetError {
    /// The offending pattern's index in the list, when one pattern alone is
    /// the problem; `None` when only the list as a whole is too complex.
    pub index: Option<usize>,
    pub reason: String,
}

impl fmt::Display for SetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl Pattern {
    /// Validates a pattern. The error is a reason, to be wrapped with the
    /// field it came from.
    pub fn parse(raw: &str) -> Result<Self, String> {
        path::check_syntax(raw, Absolute::Allowed)?;
        if raw.len() > MAX_PATTERN_BYTES {
            return Err(format!(
                "is {} bytes long; a pattern may be at most {MAX_PATTERN_BYTES} bytes",
                raw.len()
            ));
        }
        for segment in raw.trim_start_matches('/').split('/') {
            if segment.contains("**") && segment != "**" {
                return Err(format!(
                    "segment `{segment}`: `**` must be a whole path segment (e.g. `dir/**/file`)"
                ));
            }
        }
        glob(&path::expand(raw, &probe_session()))
            .map_err(|e| format!("is not a valid glob: {e}"))?;
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_absolute(&self) -> bool {
        path::is_absolute(&self.0)
    }

    /// The pattern with `<session_id>` expanded.
    pub fn expand(&self, session: &SessionId) -> String {
        path::expand(&self.0, session)
    }

    /// The leading segments that contain no glob characters: the directory
    /// every match lies in (or the whole path for a literal pattern).
    pub fn static_prefix(&self, session: &SessionId) -> String {
        let expanded = self.expand(session);
        let absolute = expanded.starts_with('/');
        let literal: Vec<&str> = expanded
            .trim_start_matches('/')
            .split('/')
            .take_while(|s| !s.contains(GLOB_META))
            .collect();
        let joined = literal.join("/");
        if absolute {
            format!("/{joined}")
        } else {
            joined
        }
    }

    /// Whether some path this pattern grants (hierarchically) could lie at or
    /// under `reserved`. `reserved` is a relative path whose segments are
    /// literals or `*` (any one segment). Errs on the side of "yes".
    pub fn may_cover(&self, reserved: &str) -> bool {
        if self.is_absolute() {
            return false;
        }
        let expanded = self.expand(&probe_session());
        let pattern: Vec<&str> = expanded.split('/').collect();
        let reserved: Vec<&str> = reserved.split('/').collect();
        overlaps(&pattern, &reserved)
    }
}

/// The workspace trees that hold one directory per session (besides
/// `planes/<tier>/sessions`).
pub const SESSION_TREES: [&str; 2] = ["output", "tmp"];

/// `tmp/<sid>`, `output/<sid>` or `planes/<tier>/sessions/<sid>` when the
/// workspace-relative path `rel` lies in such a directory of a session
/// other than `own` (what no turn reads, writes or commits into).
pub fn other_session_dir(rel: &str, own: &str) -> Option<String> {
    let parts: Vec<&str> = rel.split('/').collect();
    let (tree, sid) = match parts.as_slice() {
        [t, sid, ..] if SESSION_TREES.contains(t) => ((*t).to_owned(), *sid),
        ["planes", tier, "sessions", sid, ..] => (format!("planes/{tier}/sessions"), *sid),
        _ => return None,
    };
    (sid != own).then(|| format!("{tree}/{sid}"))
}

impl Pattern {
    /// Whether this pattern could name, in the session tree `tree`
    /// (workspace-relative; a `*` segment stands for any one, as in
    /// `planes/*/sessions`), anything but the turn's own `<session_id>`
    /// directory: the tree itself, or another session's directory — a
    /// literal id, a glob, `**` — or what lies below one. `root` is the
    /// workspace root, to judge absolute patterns (`None`: they never
    /// reach, as for write patterns, which must be relative). Decided on
    /// the pattern's segments, not by probing one id: `output/SES-2026*/**`
    /// and a literal other id reach as much as `output/**` does.
    pub fn reaches_in_tree(&self, tree: &str, root: Option<&str>) -> bool {
        let raw = self.as_str();
        let rel = if self.is_absolute() {
            let Some(root) = root.map(|r| r.trim_end_matches('/')) else {
                return false;
            };
            let prefix = self.static_prefix(&probe_session());
            // At or above the root (`/**`, `/srv/**`): every tree.
            if prefix == "/" || root == prefix || root.starts_with(&format!("{prefix}/")) {
                return true;
            }
            match raw.strip_prefix(&format!("{root}/")) {
                Some(r) => r,
                None => return false,
            }
        } else {
            raw
        };
        let segs: Vec<&str> = rel.split('/').collect();
        let mut i = 0;
        for t in tree.split('/') {
            match segs.get(i) {
                // The pattern ends at an ancestor of the tree it matched
                // so far: a grant there covers the tree.
                None => return true,
                Some(&"**") => return true,
                Some(p) if t == "*" || glob(p).is_ok_and(|g| g.compile_matcher().is_match(t)) => {
                    i += 1;
                }
                Some(_) => return false,
            }
        }
        // Matched the tree; what follows names a directory in it.
        !matches!(segs.get(i), Some(&path::SESSION_PLACEHOLDER))
    }

    /// The session tree (`output`, `tmp`) in which this (relative) pattern
    /// could name another session's directory ([`Pattern::reaches_in_tree`]):
    /// a write grant there would reach every session in the workspace
    /// (other tenants' in a shared one).
    pub fn reaches_other_sessions(&self) -> Option<&'static str> {
        SESSION_TREES
            .into_iter()
            .find(|tree| self.reaches_in_tree(tree, None))
    }
}

fn overlaps(pattern: &[&str], reserved: &[&str]) -> bool {
    match (pattern.split_first(), reserved.split_first()) {
        // The pattern ends at or above the reserved path: a hierarchical grant
        // on an ancestor covers it. The reserved path ends first: the pattern
        // reaches inside the reserved subtree.
        (None, _) | (_, None) => true,
        (Some((&"**", _)), _) => true,
        (Some((p, p_rest)), Some((r, r_rest))) => {
            let compatible = *r == "*"
                || glob(p)
                    .map(|g| g.compile_matcher().is_match(r))
                    .unwrap_or(true);
            compatible && overlaps(p_rest, r_rest)
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A path to test against patterns, seen relative to the workspace root (when
/// it lies inside it) and as an absolute path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub relative: Option<String>,
    pub absolute: String,
}

impl Target {
    /// `root` is the absolute workspace root without a trailing `/`; `path`
    /// has passed [`path::check_syntax`].
    pub fn new(root: &str, path: &str) -> Self {
        if path::is_absolute(path) {
            let relative = path
                .strip_prefix(root)
                .and_then(|rest| rest.strip_prefix('/'))
                .map(str::to_owned);
            Self {
                relative,
                absolute: path.to_owned(),
            }
        } else {
            Self {
                relative: Some(path.to_owned()),
                absolute: format!("{root}/{path}"),
            }
        }
    }
}

/// Patterns bound to one session and compiled for matching.
/// The sets this process compiled last (see
/// [`PatternSet::compile_checked`]), with the session each was compiled
/// for: a pure function of the two, nothing else reaches the matcher.
static COMPILED: crate::recent::Recent<(SessionId, PatternSet)> = crate::recent::Recent::new(16);

#[derive(Debug, Clone)]
pub struct PatternSet {
    patterns: Vec<Pattern>,
    relative: GlobSet,
    relative_index: Vec<usize>,
    absolute: GlobSet,
    absolute_index: Vec<usize>,
}

impl PatternSet {
    /// Compiles `patterns` for `session`. The error names the pattern when
    /// one pattern is the problem, or says the list as a whole is too
    /// complex.
    pub fn compile(patterns: &[Pattern], session: &SessionId) -> Result<Self, String> {
        Self::compile_checked(patterns, session).map_err(|e| e.reason)
    }

    /// [`PatternSet::compile`] with the offending pattern's index.
    ///
    /// A compiled set depends on the patterns and the session alone, and
    /// building its matcher (globset's regexes) is most of a manifest's
    /// load and of a plan's compile: one turn compiles the same lists
    /// several times (the manifest's check, the request's check, the plan,
    /// the forbidden list of the record), and a serve worker every turn.
    /// The last 16 sets built in this process are kept and handed out as
    /// clones.
    pub fn compile_checked(patterns: &[Pattern], session: &SessionId) -> Result<Self, SetError> {
        let kept = COMPILED
            .find(|(s, set)| (s == session && set.patterns == patterns).then(|| set.clone()));
        if let Some(set) = kept {
            return Ok(set);
        }
        let set = Self::build_checked(patterns, session)?;
        COMPILED.keep((session.clone(), set.clone()));
        Ok(set)
    }

    fn build_checked(patterns: &[Pattern], session: &SessionId) -> Result<Self, SetError> {
        if patterns.len() > MAX_PATTERNS {
            return Err(SetError {
                index: None,
                reason: format!(
                    "has {} patterns; a capability list may have at most {MAX_PATTERNS}: use `*`, `**` or `{{a,b}}` to cover several paths with one pattern",
                    patterns.len()
                ),
            });
        }
        let mut rel = GlobSetBuilder::new();
        let mut abs = GlobSetBuilder::new();
        let (mut relative_index, mut absolute_index) = (Vec::new(), Vec::new());
        for (i, p) in patterns.iter().enumerate() {
            for g in Self::globs(p, session).map_err(|reason| SetError {
                index: Some(i),
                reason,
            })? {
                if p.is_absolute() {
                    abs.add(g);
                    absolute_index.push(i);
                } else {
                    rel.add(g);
                    relative_index.push(i);
                }
            }
        }
        let build = |builder: GlobSetBuilder, index: &[usize]| {
            builder
                .build()
                .map_err(|e| Self::diagnose(patterns, session, index, &e))
        };
        Ok(Self {
            patterns: patterns.to_vec(),
            relative: build(rel, &relative_index)?,
            relative_index,
            absolute: build(abs, &absolute_index)?,
            absolute_index,
        })
    }

    /// The globs one pattern compiles to: `dir/**` also covers `dir` itself
    /// (globset alone would not match it), so a forbidden `secrets/**` hides
    /// the directory.
    fn globs(p: &Pattern, session: &SessionId) -> Result<Vec<Glob>, String> {
        let expanded = p.expand(session);
        let mut raw = vec![expanded.clone()];
        if let Some(dir) = expanded.strip_suffix("/**").filter(|d| !d.is_empty()) {
            raw.push(dir.to_owned());
        }
        raw.iter()
            .map(|r| glob(r).map_err(|e| format!("pattern `{p}`: {e}")))
            .collect()
    }

    /// A set failed to build (the matcher's size limit, "error building
    /// NFA"): find the pattern that fails on its own, or blame the list.
    fn diagnose(
        patterns: &[Pattern],
        session: &SessionId,
        index: &[usize],
        error: &globset::Error,
    ) -> SetError {
        let mut members: Vec<usize> = index.to_vec();
        members.dedup();
        for &i in &members {
            let alone = Self::globs(&patterns[i], session).and_then(|globs| {
                let mut b = GlobSetBuilder::new();
                for g in globs {
                    b.add(g);
                }
                b.build().map(|_| ()).map_err(|e| e.to_string())
            });
            if let Err(e) = alone {
                return SetError {
                    index: Some(i),
                    reason: format!(
                        "pattern `{}` is too complex for the matcher ({e}); simplify it (fewer `{{a,b}}` alternatives, `[..]` classes and wildcards)",
                        patterns[i]
                    ),
                };
            }
        }
        SetError {
            index: None,
            reason: format!(
                "its {} patterns are too complex together for the matcher ({error}), although each compiles alone; merge or simplify them (limits: at most {MAX_PATTERNS} patterns of at most {MAX_PATTERN_BYTES} bytes per list, and the list must compile as one matcher)",
                members.len()
            ),
        }
    }

    /// The first pattern (in manifest order) that matches `target` or one of
    /// its ancestors.
    pub fn matching(&self, target: &Target) -> Option<&Pattern> {
        let mut best: Option<usize> = None;
        let mut consider = |set: &GlobSet, index: &[usize], path: &str| {
            for candidate in ancestors_and_self(path) {
                if let Some(&m) = set.matches(candidate).iter().min() {
                    let i = index[m];
                    best = Some(best.map_or(i, |b| b.min(i)));
                }
            }
        };
        if let Some(rel) = &target.relative {
            consider(&self.relative, &self.relative_index, rel);
        }
        consider(&self.absolute, &self.absolute_index, &target.absolute);
        best.map(|i| &self.patterns[i])
    }
}

/// `a/b/c` -> `a/b/c`, `a/b`, `a`; `/x/y` -> `/x/y`, `/x`.
fn ancestors_and_self(path: &str) -> impl Iterator<Item = &str> {
    let mut next = Some(path);
    std::iter::from_fn(move || {
        let current = next?;
        next = current.rfind('/').filter(|&i| i > 0).map(|i| &current[..i]);
        Some(current)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid() -> SessionId {
        SessionId::parse("SES-20261121T093700123456Z-00000000deadbeef").unwrap()
    }

    fn set(patterns: &[&str]) -> PatternSet {
        let ps: Vec<Pattern> = patterns
            .iter()
            .map(|p| Pattern::parse(p).unwrap())
            .collect();
        PatternSet::compile(&ps, &sid()).unwrap()
    }

    fn matches(set: &PatternSet, path: &str) -> Option<String> {
        set.matching(&Target::new("/ws", path))
            .map(|p| p.to_string())
    }

    /// A kept set is the one its patterns and session compile to: another
    /// session's expansion of `<session_id>` is never handed out for it.
    #[test]
    fn issue_29_a_kept_set_is_only_handed_out_for_its_patterns_and_session() {
        let other = SessionId::parse("SES-20261121T093700123456Z-00000000cafef00d").unwrap();
        let ps = vec![Pattern::parse("output/<session_id>/**").unwrap()];
        let mine = PatternSet::compile(&ps, &sid()).unwrap();
        let theirs = PatternSet::compile(&ps, &other).unwrap();
        let again = PatternSet::compile(&ps, &sid()).unwrap();
        let path = |s: &SessionId| format!("output/{s}/x");
        for (set, yes, no) in [
            (&mine, sid(), other.clone()),
            (&again, sid(), other.clone()),
            (&theirs, other.clone(), sid()),
        ] {
            assert!(matches(set, &path(&yes)).is_some());
            assert!(matches(set, &path(&no)).is_none());
        }
    }

    #[test]
    fn fr_rt_002_star_stays_in_segment_double_star_crosses() {
        let s = set(&["registries/*.csv"]);
        assert!(matches(&s, "registries/users.csv").is_some());
        assert!(matches(&s, "registries/sub/users.csv").is_none());
        let s = set(&["registries/**/*.csv"]);
        assert!(matches(&s, "registries/sub/deeper/users.csv").is_some());
        assert!(matches(&s, "registries/users.csv").is_some());
        assert!(matches(&s, "other/users.csv").is_none());
    }

    #[test]
    fn fr_rt_002_session_placeholder_expands() {
        let s = set(&["output/<session_id>/**"]);
        assert!(matches(&s, &format!("output/{}/report.md", sid())).is_some());
        assert!(
            matches(
                &s,
                "output/SES-20261121T093700123456Z-0000000000000000/r.md"
            )
            .is_none()
        );
    }

    #[test]
    fn matching_is_hierarchical_and_sees_both_forms() {
        let s = set(&["installed/pkg"]);
        assert_eq!(
            matches(&s, "installed/pkg/secrets/key").as_deref(),
            Some("installed/pkg")
        );
        assert!(matches(&s, "installed/pkg2").is_none());
        let s = set(&["/ws/data/**", "/etc/passwd"]);
        assert!(matches(&s, "data/x").is_some());
        assert!(matches(&s, "/etc/passwd").is_some());
        assert!(matches(&s, "/etc/shadow").is_none());
    }

    #[test]
    fn double_star_suffix_covers_the_directory_itself() {
        let s = set(&["installed/pkg/secrets/**"]);
        assert!(matches(&s, "installed/pkg/secrets").is_some());
        assert!(matches(&s, "installed/pkg/secrets/k").is_some());
        assert!(matches(&s, "installed/pkg/secretsX").is_none());
    }

    #[test]
    fn first_pattern_in_manifest_order_is_reported() {
        let s = set(&["a/**", "a/b/*"]);
        assert_eq!(matches(&s, "a/b/c").as_deref(), Some("a/**"));
    }

    #[test]
    fn static_prefix_stops_at_the_first_glob() {
        let p = Pattern::parse("output/<session_id>/**/*.md").unwrap();
        assert_eq!(p.static_prefix(&sid()), format!("output/{}", sid()));
        assert_eq!(
            Pattern::parse("/usr/lib/**").unwrap().static_prefix(&sid()),
            "/usr/lib"
        );
        assert_eq!(
            Pattern::parse("a/b.txt").unwrap().static_prefix(&sid()),
            "a/b.txt"
        );
    }

    #[test]
    fn rejects_bad_globs_and_partial_double_star() {
        assert!(Pattern::parse("a/**b").is_err());
        assert!(Pattern::parse("a/[b").is_err());
        assert!(Pattern::parse("a/{b").is_err());
        assert!(Pattern::parse("../x").is_err());
    }

    fn heavy(i: usize) -> Pattern {
        let alternatives: Vec<String> = (0..14).map(|j| format!("[a-z]*{i}x{j}?")).collect();
        let segment = format!("{{{}}}", alternatives.join(","));
        Pattern::parse(&format!("d{i}/{segment}/{segment}/{segment}")).unwrap()
    }

    #[test]
    fn issue_8_too_many_patterns_is_refused_with_the_limit() {
        let many: Vec<Pattern> = (0..=MAX_PATTERNS)
            .map(|i| Pattern::parse(&format!("data/f{i}.csv")).unwrap())
            .collect();
        let err = PatternSet::compile_checked(&many, &sid()).unwrap_err();
        assert_eq!(err.index, None);
        assert!(
            err.reason.contains("1025 patterns") && err.reason.contains("1024"),
            "{err}"
        );
        assert!(PatternSet::compile_checked(&many[..MAX_PATTERNS], &sid()).is_ok());
        let long = format!("data/{}", "a/".repeat(MAX_PATTERN_BYTES / 2));
        let err = Pattern::parse(long.trim_end_matches('/')).unwrap_err();
        assert!(err.contains("at most 1024 bytes"), "{err}");
    }

    #[test]
    fn issue_8_a_list_too_complex_together_says_so_and_names_the_limits() {
        // Each compiles alone; 1024 of them exceed the matcher's size limit
        // ("error building NFA", which used to be the whole message).
        let set: Vec<Pattern> = (0..MAX_PATTERNS).map(heavy).collect();
        assert!(PatternSet::compile_checked(&set[..1], &sid()).is_ok());
        let err = PatternSet::compile_checked(&set, &sid()).unwrap_err();
        assert_eq!(err.index, None, "{err}");
        assert!(err.reason.contains("too complex together"), "{err}");
        assert!(err.reason.contains("at most 1024 patterns"), "{err}");
    }

    #[test]
    fn reserved_overlap_is_conservative() {
        let others = |p: &str| Pattern::parse(p).unwrap().reaches_other_sessions();
        for p in [
            "output/**",
            "output",
            "tmp/*/x",
            "*/SES-*/**",
            "**/x",
            "tmp/**/y",
            "output/SES-2026*/**",
            "tmp/SES-20261129T030815684030Z-f0311854d3971558/**",
            "o*/*[a-f]*/x",
        ] {
            assert!(others(p).is_some(), "{p}");
        }
        let abs = |p: &str| {
            let p = Pattern::parse(p).unwrap();
            ["output", "tmp", "planes/*/sessions"]
                .iter()
                .any(|t| p.reaches_in_tree(t, Some("/ws")))
        };
        for p in [
            "/**",
            "/ws/**",
            "/ws/tmp/SES-x/**",
            "/ws/planes/ho1/sessions/S/l",
        ] {
            assert!(abs(p), "{p}");
        }
        for p in [
            "/usr/**",
            "/ws/data/**",
            "/ws/output/<session_id>/**",
            "/wsx/**",
        ] {
            assert!(!abs(p), "{p}");
        }
        for p in [
            "output/<session_id>/**",
            "tmp/<session_id>/a/*",
            "reports/**",
            "out/**",
            "build/<session_id>/app",
        ] {
            assert_eq!(others(p), None, "{p}");
        }
        let covers = |p: &str, r: &str| Pattern::parse(p).unwrap().may_cover(r);
        assert!(covers("planes/**", "planes"));
        assert!(covers(
            "planes/ho1/sessions/<session_id>/ledger/exec.jsonl",
            "planes"
        ));
        assert!(covers("**/report.md", "planes"));
        assert!(covers("p*/x", "planes"));
        assert!(covers("installed/pkg", "installed/*/manifest.json"));
        assert!(covers("installed/*/*.json", "installed/*/manifest.json"));
        assert!(!covers(
            "installed/pkg/data/**",
            "installed/*/manifest.json"
        ));
        assert!(!covers("output/<session_id>/**", "planes"));
        assert!(!covers("/planes/**", "planes"));
    }
}
