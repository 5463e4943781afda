//! Which backend runs a turn, for the CLI, `serve` and the shim alike
//! (all of them run turns through [`choose`]): `--backend` when given,
//! otherwise the manifest's trust level through the system configuration's
//! table (DESIGN "Trust level -> runtime") — and never a backend weaker
//! than the trust level's minimum isolation (issue 25).
//!
//! Isolation ranks native < runc = crun < runsc < kata
//! ([`BackendKind::isolation`]). The built-in minimums: trusted and
//! standard `native`, untrusted and confidential `kata`. The config file
//! (default `/etc/turnstile/config.json`) may set both tables:
//!
//! ```json
//! {"backends": {"trusted": "native", "standard": "runsc",
//!               "untrusted": "runsc", "confidential": "kata"},
//!  "minimum_backends": {"untrusted": "runsc"}}
//! ```
//!
//! `minimum_backends` is the only way to lower (or raise) a level's
//! minimum, and whatever it says is written in every turn's evidence
//! (`backend_minimum`). A `backends` entry weaker than its level's minimum
//! is a config error; an explicit `--backend` weaker than it is refused
//! (exit 20, TS1040, naming both) — never silently used. The built-in
//! `standard` is `native`, not the design card's `runsc`: gVisor cannot
//! enforce Landlock, so a standard package without `allow_degraded:
//! ["landlock"]` would be refused on every turn; an operator opts into
//! gVisor for standard packages with one line. A chosen backend that is
//! not installed is E2040 (exit 20), never a fallback.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use turnstile_policy::manifest::TrustLevel;

use super::BackendKind;
use crate::error::{Result, SupervisorError};

/// The default config file.
pub const DEFAULT_CONFIG: &str = "/etc/turnstile/config.json";

/// How the backend was chosen (recorded in the evidence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub backend: BackendKind,
    /// `--backend`, or `trust_level <level>` (with the table's origin).
    pub by: String,
    /// The weakest backend the trust level accepts.
    pub minimum: BackendKind,
    /// Where that minimum comes from: the built-in table, or the config
    /// file's `minimum_backends` (an operator's explicit choice).
    pub minimum_by: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigDoc {
    #[serde(default)]
    backends: BTreeMap<String, String>,
    #[serde(default)]
    minimum_backends: BTreeMap<String, String>,
    /// The most bytes of pre-images (what commits replaced or removed,
    /// kept for `supervise revert`) a session keeps; the oldest go first.
    #[serde(default)]
    preimage_retention_bytes: Option<u64>,
}

/// The largest config file read (it holds two small tables and a number).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The default of `preimage_retention_bytes`: 1 GiB per session.
pub const DEFAULT_PREIMAGE_RETENTION: u64 = 1 << 30;

/// The config file's `preimage_retention_bytes` (the default when the
/// file or the field is absent).
pub fn preimage_retention(config: &Path) -> Result<u64> {
    match crate::fsx::read_regular(config, MAX_CONFIG_BYTES) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DEFAULT_PREIMAGE_RETENTION),
        Err(e) => Err(SupervisorError::invalid(
            &format!("{}: (file)", config.display()),
            format!("unreadable: {e}"),
        )),
        Ok(bytes) => parse_doc(&bytes)
            .map(|d| {
                d.preimage_retention_bytes
                    .unwrap_or(DEFAULT_PREIMAGE_RETENTION)
            })
            .map_err(|(field, e)| {
                SupervisorError::invalid(&format!("{}: {field}", config.display()), e)
            }),
    }
}

/// Checks a config document as `run` would (both tables, the retention):
/// `Err` names the field. For the fuzzer and `doctor`.
pub fn check_config_bytes(bytes: &[u8]) -> std::result::Result<(), String> {
    tables(bytes, Path::new("(config)"))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The config document, or the field that is wrong and why.
fn parse_doc(bytes: &[u8]) -> std::result::Result<ConfigDoc, (String, String)> {
    // A duplicate key is an error, not "the last one wins": a reviewer
    // reading the first `standard` would see another backend than runs.
    turnstile_policy::canonical::parse_strict(bytes)
        .map_err(|e| ("(document)".to_owned(), e.to_string()))?;
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize::<_, ConfigDoc>(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "(document)".to_owned()
        } else {
            path
        };
        (field, e.into_inner().to_string())
    })
}

/// The built-in table.
pub fn builtin(level: TrustLevel) -> BackendKind {
    match level {
        TrustLevel::Trusted | TrustLevel::Standard => BackendKind::Native,
        TrustLevel::Untrusted | TrustLevel::Confidential => BackendKind::Kata,
    }
}

/// The built-in minimum isolation of a trust level.
pub fn builtin_minimum(level: TrustLevel) -> BackendKind {
    match level {
        TrustLevel::Trusted | TrustLevel::Standard => BackendKind::Native,
        TrustLevel::Untrusted | TrustLevel::Confidential => BackendKind::Kata,
    }
}

const LEVELS: [TrustLevel; 4] = [
    TrustLevel::Trusted,
    TrustLevel::Standard,
    TrustLevel::Untrusted,
    TrustLevel::Confidential,
];

/// The config file's two tables, checked (a missing file: both empty).
struct Tables {
    backends: BTreeMap<String, BackendKind>,
    minimums: BTreeMap<String, BackendKind>,
}

fn load(config: &Path) -> Result<Tables> {
    match crate::fsx::read_regular(config, MAX_CONFIG_BYTES) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Tables {
            backends: BTreeMap::new(),
            minimums: BTreeMap::new(),
        }),
        Err(e) => Err(SupervisorError::invalid(
            &format!("{}: (file)", config.display()),
            format!("unreadable: {e}"),
        )),
        Ok(bytes) => tables(&bytes, config),
    }
}

/// The two tables of the config document `bytes` (read from `config`,
/// which errors name), checked.
fn tables(bytes: &[u8], config: &Path) -> Result<Tables> {
    let invalid = |field: &str, reason: String| {
        SupervisorError::invalid(&format!("{}: {field}", config.display()), reason)
    };
    let doc = parse_doc(bytes).map_err(|(field, e)| invalid(&field, e))?;
    let table =
        |name: &str, t: BTreeMap<String, String>| -> Result<BTreeMap<String, BackendKind>> {
            t.into_iter()
                .map(|(key, value)| {
                    if !LEVELS.iter().any(|l| l.as_str() == key) {
                        return Err(invalid(
                            &format!("{name}.{key}"),
                            "not a trust level (trusted, standard, untrusted, confidential)".into(),
                        ));
                    }
                    let kind = value.parse::<BackendKind>().map_err(|_| {
                        invalid(
                            &format!("{name}.{key}"),
                            format!("`{value}` is not a backend ({})", BackendKind::names()),
                        )
                    })?;
                    Ok((key, kind))
                })
                .collect()
        };
    let tables = Tables {
        backends: table("backends", doc.backends)?,
        minimums: table("minimum_backends", doc.minimum_backends)?,
    };
    for level in LEVELS {
        let (minimum, _) = tables.minimum(level, config);
        if let Some(b) = tables.backends.get(level.as_str()) {
            if b.isolation() < minimum.isolation() {
                return Err(invalid(
                    &format!("backends.{}", level.as_str()),
                    format!(
                        "`{b}` is weaker than the {} minimum `{minimum}`; lower the minimum explicitly with `minimum_backends.{}` if that is meant",
                        level.as_str(),
                        level.as_str()
                    ),
                ));
            }
        }
    }
    Ok(tables)
}

impl Tables {
    fn minimum(&self, level: TrustLevel, config: &Path) -> (BackendKind, String) {
        let builtin = builtin_minimum(level);
        match self.minimums.get(level.as_str()) {
            Some(m) => (
                *m,
                format!(
                    "{}: minimum_backends.{} = {m} (built-in {builtin})",
                    config.display(),
                    level.as_str()
                ),
            ),
            None => (builtin, "built-in".into()),
        }
    }
}

/// The backend for a turn of a package at `level`: `flag` when given and
/// at least the level's minimum, else the config file's table (a missing
/// file: the built-in table; an unreadable or invalid one: an error naming
/// the field, never a guess).
pub fn choose(flag: Option<BackendKind>, level: TrustLevel, config: &Path) -> Result<Choice> {
    let tables = load(config)?;
    let (minimum, minimum_by) = tables.minimum(level, config);
    let (backend, by) = match (flag, tables.backends.get(level.as_str())) {
        (Some(b), _) => (b, "--backend".to_owned()),
        (None, Some(b)) => (
            *b,
            format!("trust_level {} ({})", level.as_str(), config.display()),
        ),
        (None, None) => (
            builtin(level),
            format!("trust_level {} (built-in table)", level.as_str()),
        ),
    };
    if backend.isolation() < minimum.isolation() {
        return Err(SupervisorError::BelowTrustMinimum {
            backend: backend.as_str().to_owned(),
            level: level.as_str().to_owned(),
            minimum: minimum.as_str().to_owned(),
            minimum_by,
        });
    }
    Ok(Choice {
        backend,
        by,
        minimum,
        minimum_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_10_the_flag_wins_then_the_file_then_the_builtin_table() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.json");
        let c = choose(Some(BackendKind::Runc), TrustLevel::Standard, &missing).unwrap();
        assert_eq!((c.backend, c.by.as_str()), (BackendKind::Runc, "--backend"));
        for (level, want) in [
            (TrustLevel::Trusted, BackendKind::Native),
            (TrustLevel::Standard, BackendKind::Native),
            (TrustLevel::Untrusted, BackendKind::Kata),
            (TrustLevel::Confidential, BackendKind::Kata),
        ] {
            let c = choose(None, level, &missing).unwrap();
            assert_eq!(c.backend, want);
            assert!(c.by.contains("built-in"), "{}", c.by);
        }
        let file = dir.path().join("config.json");
        std::fs::write(&file, r#"{"backends":{"standard":"runsc"}}"#).unwrap();
        assert_eq!(
            choose(None, TrustLevel::Standard, &file).unwrap().backend,
            BackendKind::Runsc
        );
        assert_eq!(
            choose(None, TrustLevel::Trusted, &file).unwrap().backend,
            BackendKind::Native
        );
    }

    #[test]
    fn issue_10_a_bad_config_is_an_error_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        for (doc, field) in [
            (r#"{"backends":{"standard":"docker"}}"#, "backends.standard"),
            (r#"{"backends":{"admin":"native"}}"#, "backends.admin"),
            (r#"{"backend":{}}"#, "backend"),
            (r#"{"backends":{"untrusted":"runc"}}"#, "backends.untrusted"),
            (
                r#"{"minimum_backends":{"untrusted":"vm"}}"#,
                "minimum_backends.untrusted",
            ),
            (
                r#"{"minimum_backends":{"root":"kata"}}"#,
                "minimum_backends.root",
            ),
            (r#"{"minimum_backends":[]}"#, "minimum_backends"),
            (
                r#"{"preimage_retention_bytes":"lots"}"#,
                "preimage_retention_bytes",
            ),
            ("not json", "(document)"),
            // Red-team, stop 54: the last of two keys won.
            (
                r#"{"backends":{"standard":"runsc","standard":"native"}}"#,
                "(document)",
            ),
        ] {
            std::fs::write(&file, doc).unwrap();
            let err = choose(None, TrustLevel::Standard, &file).unwrap_err();
            assert_eq!(err.exit_status(), 2, "{doc}: {err}");
            assert!(
                err.field().is_some_and(|f| f.ends_with(field)),
                "{doc}: {:?}",
                err.field()
            );
        }
    }

    /// Issue 25: an explicit backend weaker than the trust level's minimum
    /// is refused (exit 20, TS1040, naming both), whatever asks for it; the
    /// operator lowers a minimum only through `minimum_backends`, and the
    /// choice says so.
    #[test]
    fn issue_25_a_backend_below_the_trust_minimum_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.json");
        for weak in [
            BackendKind::Native,
            BackendKind::Runc,
            BackendKind::Crun,
            BackendKind::Runsc,
        ] {
            for level in [TrustLevel::Untrusted, TrustLevel::Confidential] {
                let err = choose(Some(weak), level, &missing).unwrap_err();
                assert_eq!(err.exit_status(), 20, "{err}");
                assert_eq!(err.code().code, "TS1040");
                let msg = err.to_string();
                assert!(msg.contains(weak.as_str()) && msg.contains("kata"), "{msg}");
            }
        }
        // Trusted and standard accept anything.
        for b in BackendKind::ALL {
            assert_eq!(
                choose(Some(b), TrustLevel::Standard, &missing)
                    .unwrap()
                    .backend,
                b
            );
        }
        let file = dir.path().join("config.json");
        std::fs::write(
            &file,
            r#"{"backends":{"untrusted":"runsc"},"minimum_backends":{"untrusted":"runsc"}}"#,
        )
        .unwrap();
        let c = choose(None, TrustLevel::Untrusted, &file).unwrap();
        assert_eq!(
            (c.backend, c.minimum),
            (BackendKind::Runsc, BackendKind::Runsc)
        );
        assert!(
            c.minimum_by.contains("minimum_backends.untrusted"),
            "{}",
            c.minimum_by
        );
        assert!(choose(Some(BackendKind::Runsc), TrustLevel::Untrusted, &file).is_ok());
        assert_eq!(
            choose(Some(BackendKind::Runc), TrustLevel::Untrusted, &file)
                .unwrap_err()
                .exit_status(),
            20
        );
        // Confidential keeps its built-in minimum.
        assert!(choose(Some(BackendKind::Runsc), TrustLevel::Confidential, &file).is_err());
        assert_eq!(
            choose(None, TrustLevel::Standard, &file)
                .unwrap()
                .minimum_by,
            "built-in"
        );
    }
}
