//! Which backend runs a turn: `--backend` when given, otherwise the
//! manifest's trust level through the system configuration's table
//! (DESIGN "Trust level -> runtime"). The table lives in the `backends`
//! object of the config file (default `/etc/turnstile/config.json`):
//!
//! ```json
//! {"backends": {"trusted": "native", "standard": "runsc",
//!               "untrusted": "kata", "confidential": "kata"}}
//! ```
//!
//! Every level not in the file keeps its built-in default. The built-in
//! `standard` is `native`, not the design card's `runsc`: gVisor cannot
//! enforce Landlock, so a standard package without `allow_degraded:
//! ["landlock"]` would be refused on every turn; an operator opts into
//! gVisor for standard packages with the one line above. A chosen backend
//! that is not installed is E2040 (exit 20), never a fallback.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use turnstile_policy::manifest::TrustLevel;

use crate::error::{Result, SupervisorError};

/// The default config file.
pub const DEFAULT_CONFIG: &str = "/etc/turnstile/config.json";

/// How the backend was chosen (recorded in the evidence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub name: String,
    /// `--backend`, or `trust_level <level>` (with the table's origin).
    pub by: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigDoc {
    #[serde(default)]
    backends: BTreeMap<String, String>,
}

/// The built-in table.
pub fn builtin(level: TrustLevel) -> &'static str {
    match level {
        TrustLevel::Trusted | TrustLevel::Standard => "native",
        TrustLevel::Untrusted | TrustLevel::Confidential => "kata",
    }
}

const LEVELS: [TrustLevel; 4] = [
    TrustLevel::Trusted,
    TrustLevel::Standard,
    TrustLevel::Untrusted,
    TrustLevel::Confidential,
];

/// The backend for a turn of a package at `level`: `flag` when given,
/// else the config file's table (a missing file: the built-in table; an
/// unreadable or invalid one: an error naming the field, never a guess).
pub fn choose(flag: Option<&str>, level: TrustLevel, config: &Path) -> Result<Choice> {
    if let Some(name) = flag {
        return Ok(Choice {
            name: name.to_owned(),
            by: "--backend".into(),
        });
    }
    let invalid = |field: &str, reason: String| {
        SupervisorError::invalid(&format!("{}: {field}", config.display()), reason)
    };
    let table = match std::fs::read(config) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => return Err(invalid("(file)", format!("unreadable: {e}"))),
        Ok(bytes) => {
            let doc: ConfigDoc =
                serde_json::from_slice(&bytes).map_err(|e| invalid("(document)", e.to_string()))?;
            for (key, value) in &doc.backends {
                if !LEVELS.iter().any(|l| l.as_str() == key) {
                    return Err(invalid(
                        &format!("backends.{key}"),
                        "not a trust level (trusted, standard, untrusted, confidential)".into(),
                    ));
                }
                if !super::NAMES.contains(&value.as_str()) {
                    return Err(invalid(
                        &format!("backends.{key}"),
                        format!("`{value}` is not a backend ({})", super::NAMES.join(", ")),
                    ));
                }
            }
            doc.backends
        }
    };
    Ok(match table.get(level.as_str()) {
        Some(name) => Choice {
            name: name.clone(),
            by: format!("trust_level {} ({})", level.as_str(), config.display()),
        },
        None => Choice {
            name: builtin(level).to_owned(),
            by: format!("trust_level {} (built-in table)", level.as_str()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_10_the_flag_wins_then_the_file_then_the_builtin_table() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.json");
        let c = choose(Some("runc"), TrustLevel::Untrusted, &missing).unwrap();
        assert_eq!((c.name.as_str(), c.by.as_str()), ("runc", "--backend"));
        for (level, want) in [
            (TrustLevel::Trusted, "native"),
            (TrustLevel::Standard, "native"),
            (TrustLevel::Untrusted, "kata"),
            (TrustLevel::Confidential, "kata"),
        ] {
            let c = choose(None, level, &missing).unwrap();
            assert_eq!(c.name, want);
            assert!(c.by.contains("built-in"), "{}", c.by);
        }
        let file = dir.path().join("config.json");
        std::fs::write(&file, r#"{"backends":{"standard":"runsc"}}"#).unwrap();
        assert_eq!(
            choose(None, TrustLevel::Standard, &file).unwrap().name,
            "runsc"
        );
        assert_eq!(
            choose(None, TrustLevel::Trusted, &file).unwrap().name,
            "native"
        );
    }

    #[test]
    fn issue_10_a_bad_config_is_an_error_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        for (doc, field) in [
            (r#"{"backends":{"standard":"docker"}}"#, "backends.standard"),
            (r#"{"backends":{"admin":"native"}}"#, "backends.admin"),
            (r#"{"backend":{}}"#, "(document)"),
            ("not json", "(document)"),
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
}
