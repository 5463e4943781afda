//! Syntax rules for every path a manifest or a request names.
//!
//! Paths are refused, never normalised: a `..`, an empty segment, a trailing
//! `/`, a NUL or a control character is an error naming the field. This runs
//! before any file system operation, so a malformed path can never make the
//! supervisor create or touch anything.

use crate::session::SessionId;

/// The placeholder that expands to the turn's session id.
pub const SESSION_PLACEHOLDER: &str = "<session_id>";

/// Longest path accepted (PATH_MAX minus the terminating NUL).
pub const MAX_PATH_BYTES: usize = 4095;
/// Longest single path segment accepted (NAME_MAX).
pub const MAX_SEGMENT_BYTES: usize = 255;

/// Whether a path may be absolute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Absolute {
    Allowed,
    Refused,
}

/// Checks the syntax of `raw`. Returns the reason it is invalid.
pub fn check_syntax(raw: &str, absolute: Absolute) -> Result<(), String> {
    if raw.is_empty() {
        return Err("is empty".into());
    }
    if raw.contains('\0') {
        return Err("contains a NUL byte".into());
    }
    if raw.chars().any(char::is_control) {
        return Err("contains a control character".into());
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(format!("is longer than {MAX_PATH_BYTES} bytes"));
    }
    let body = match raw.strip_prefix('/') {
        Some(rest) => {
            if absolute == Absolute::Refused {
                return Err("is absolute; it must be relative to the workspace root".into());
            }
            if rest.is_empty() {
                return Err("names the file system root `/`".into());
            }
            rest
        }
        None => raw,
    };
    if body.ends_with('/') {
        return Err("has a trailing `/`".into());
    }
    for segment in body.split('/') {
        match segment {
            "" => return Err("contains an empty segment (`//`)".into()),
            "." => return Err("contains a `.` segment".into()),
            ".." => {
                return Err("contains a `..` segment (paths may not escape their base)".into());
            }
            s if s.len() > MAX_SEGMENT_BYTES => {
                return Err(format!(
                    "has a segment longer than {MAX_SEGMENT_BYTES} bytes"
                ));
            }
            _ => {}
        }
    }
    if raw.replace(SESSION_PLACEHOLDER, "").contains(['<', '>']) {
        return Err(format!(
            "contains `<` or `>` outside the only placeholder, `{SESSION_PLACEHOLDER}`"
        ));
    }
    Ok(())
}

/// The field a JSON deserialization error is about, as a dotted path
/// (`capabilities.read[2]`); a duplicated key names the key itself.
pub fn json_error_field(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let base = match e.path().to_string() {
        p if p == "." => String::new(),
        p => p,
    };
    let message = e.inner().to_string();
    let duplicate = message
        .strip_prefix("duplicate field `")
        .and_then(|rest| rest.split('`').next());
    match (base.is_empty(), duplicate) {
        (true, Some(key)) => key.to_owned(),
        (false, Some(key)) => format!("{base}.{key}"),
        (true, None) => "(document)".to_owned(),
        (false, None) => base,
    }
}

/// Replaces every `<session_id>` with the session id.
pub fn expand(raw: &str, session: &SessionId) -> String {
    raw.replace(SESSION_PLACEHOLDER, session.as_str())
}

/// True for a path that starts with `/`.
pub fn is_absolute(raw: &str) -> bool {
    raw.starts_with('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_relative_and_absolute_paths() {
        assert_eq!(
            check_syntax("output/<session_id>/a.md", Absolute::Refused),
            Ok(())
        );
        assert_eq!(check_syntax("/usr/lib/**", Absolute::Allowed), Ok(()));
        assert_eq!(check_syntax("a b/[draft].md", Absolute::Refused), Ok(()));
    }

    #[test]
    fn refuses_every_malformed_form() {
        let cases: &[(&str, Absolute, &str)] = &[
            ("", Absolute::Allowed, "empty"),
            ("a\0b", Absolute::Allowed, "NUL"),
            ("a\nb", Absolute::Allowed, "control"),
            ("/etc/passwd", Absolute::Refused, "absolute"),
            ("/", Absolute::Allowed, "root"),
            ("a/", Absolute::Allowed, "trailing"),
            ("a//b", Absolute::Allowed, "empty segment"),
            ("./a", Absolute::Allowed, "`.`"),
            ("a/../../etc", Absolute::Allowed, "`..`"),
            ("..", Absolute::Allowed, "`..`"),
            ("a/<sid>/b", Absolute::Allowed, "placeholder"),
            ("a/<session_id", Absolute::Allowed, "placeholder"),
        ];
        for (raw, abs, needle) in cases {
            let err = check_syntax(raw, *abs).expect_err(raw);
            assert!(err.contains(needle), "{raw:?}: {err}");
        }
        let long = "a/".repeat(2048) + "b";
        assert!(check_syntax(&long, Absolute::Refused).is_err());
        let seg = "x".repeat(256);
        assert!(check_syntax(&seg, Absolute::Refused).is_err());
    }
}

#[cfg(test)]
mod json_field_tests {
    #[test]
    fn duplicate_keys_name_the_key() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Inner {
            read: Vec<String>,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Outer {
            capabilities: Inner,
        }
        let mut de =
            serde_json::Deserializer::from_str(r#"{"capabilities":{"read":[],"read":[]}}"#);
        let e = serde_path_to_error::deserialize::<_, Outer>(&mut de).unwrap_err();
        assert_eq!(
            super::json_error_field(&e),
            "capabilities.read",
            "{:?} / {}",
            e.path().to_string(),
            e.inner()
        );
    }
}
