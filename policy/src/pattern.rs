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

/// A session id used only to syntax-check patterns before a session exists.
fn probe_session() -> SessionId {
    SessionId::from_parts(OffsetDateTime::UNIX_EPOCH, 0)
}

fn glob(raw: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(raw)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
}

const GLOB_META: [char; 6] = ['*', '?', '[', ']', '{', '}'];

impl Pattern {
    /// Validates a pattern. The error is a reason, to be wrapped with the
    /// field it came from.
    pub fn parse(raw: &str) -> Result<Self, String> {
        path::check_syntax(raw, Absolute::Allowed)?;
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
#[derive(Debug, Clone)]
pub struct PatternSet {
    patterns: Vec<Pattern>,
    relative: GlobSet,
    relative_index: Vec<usize>,
    absolute: GlobSet,
    absolute_index: Vec<usize>,
}

impl PatternSet {
    pub fn compile(patterns: &[Pattern], session: &SessionId) -> Result<Self, String> {
        let mut rel = GlobSetBuilder::new();
        let mut abs = GlobSetBuilder::new();
        let (mut relative_index, mut absolute_index) = (Vec::new(), Vec::new());
        for (i, p) in patterns.iter().enumerate() {
            let expanded = p.expand(session);
            // `dir/**` covers `dir` itself too (globset alone would not
            // match it): a forbidden `secrets/**` hides the directory.
            let mut globs = vec![expanded.clone()];
            if let Some(dir) = expanded.strip_suffix("/**").filter(|d| !d.is_empty()) {
                globs.push(dir.to_owned());
            }
            for raw in globs {
                let g = glob(&raw).map_err(|e| format!("pattern `{p}`: {e}"))?;
                if p.is_absolute() {
                    abs.add(g);
                    absolute_index.push(i);
                } else {
                    rel.add(g);
                    relative_index.push(i);
                }
            }
        }
        Ok(Self {
            patterns: patterns.to_vec(),
            relative: rel.build().map_err(|e| e.to_string())?,
            relative_index,
            absolute: abs.build().map_err(|e| e.to_string())?,
            absolute_index,
        })
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

    #[test]
    fn reserved_overlap_is_conservative() {
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
