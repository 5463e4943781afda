//! The policy crate's error type and the registry of stable error codes.
//!
//! Codes are part of the CLI contract: scripts match on them. Where the seed's
//! E2xxx registry has a fitting code it is used; turnstile's own input errors
//! use the `TS1xxx` range.

use std::path::PathBuf;

/// A stable, user-facing error code with its symbolic name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode {
    pub code: &'static str,
    pub name: &'static str,
}

macro_rules! codes {
    ($($ident:ident = $code:literal, $name:literal;)*) => {
        /// Every code turnstile emits.
        pub mod codes {
            use super::ErrorCode;
            $(pub const $ident: ErrorCode = ErrorCode { code: $code, name: $name };)*
            /// All codes, for documentation and uniqueness tests.
            pub const ALL: &[ErrorCode] = &[$($ident),*];
        }
    };
}

codes! {
    TIMEOUT = "E2002", "TOOL_TIMEOUT";
    RUNTIME_UNAVAILABLE = "E2040", "RUNTIME_CLASS_UNAVAILABLE";
    SANDBOX_CREATION_FAILED = "E2041", "SANDBOX_CREATION_FAILED";
    SECURITY_POLICY_VIOLATION = "E2042", "SECURITY_POLICY_VIOLATION";
    SESSION_START_FAILED = "E2050", "SESSION_START_FAILED";
    SESSION_NOT_FOUND = "E2054", "SESSION_NOT_FOUND";
    CPU_LIMIT_EXCEEDED = "E2070", "CPU_LIMIT_EXCEEDED";
    MEMORY_LIMIT_EXCEEDED = "E2071", "MEMORY_LIMIT_EXCEEDED";
    PACKAGE_NOT_FOUND = "TS1001", "PACKAGE_NOT_FOUND";
    MANIFEST_INVALID = "TS1002", "MANIFEST_INVALID";
    REQUEST_INVALID = "TS1003", "REQUEST_INVALID";
    SESSION_ID_INVALID = "TS1004", "SESSION_ID_INVALID";
    PACKAGE_ID_INVALID = "TS1005", "PACKAGE_ID_INVALID";
    ARGUMENT_INVALID = "TS1006", "ARGUMENT_INVALID";
    ENTRY_GRANTS_NOTHING = "TS1007", "ENTRY_GRANTS_NOTHING";
    IDEMPOTENCY_CONFLICT = "TS1008", "IDEMPOTENCY_CONFLICT";
    LEDGER_INTEGRITY = "TS1010", "LEDGER_INTEGRITY";
    LEDGER_IO = "TS1011", "LEDGER_IO";
    STATE_IO = "TS1012", "STATE_IO";
    INPUT_UNREADABLE = "TS1013", "INPUT_UNREADABLE";
    PIDS_LIMIT_EXCEEDED = "TS1020", "PIDS_LIMIT_EXCEEDED";
    DISK_LIMIT_EXCEEDED = "TS1021", "DISK_LIMIT_EXCEEDED";
    COMMIT_FAILED = "TS1022", "COMMIT_FAILED";
    TURN_ABORTED = "TS1023", "TURN_ABORTED";
    TURN_INTERRUPTED = "TS1024", "TURN_INTERRUPTED";
    LAYER_UNENFORCEABLE = "TS1025", "LAYER_UNENFORCEABLE";
    SERVER_UNAVAILABLE = "TS1030", "SERVER_UNAVAILABLE";
    PEER_REFUSED = "TS1031", "PEER_REFUSED";
    SERVE_WORKER_FAILED = "TS1032", "SERVE_WORKER_FAILED";
    BUS_MESSAGE_INVALID = "TS1033", "BUS_MESSAGE_INVALID";
    BUS_COMMAND_DISALLOWED = "TS1034", "BUS_COMMAND_DISALLOWED";
    BUS_NO_RULE = "TS1035", "BUS_NO_RULE";
    BUS_RULES_INVALID = "TS1036", "BUS_RULES_INVALID";
    BACKEND_BELOW_TRUST_MINIMUM = "TS1040", "BACKEND_BELOW_TRUST_MINIMUM";
    SESSION_NOT_OWNED = "TS1041", "SESSION_NOT_OWNED";
    CGROUP_PARENT_INVALID = "TS1051", "CGROUP_PARENT_INVALID";
    NO_RUNNING_TURN = "TS1052", "NO_RUNNING_TURN";
    SUSPEND_FAILED = "TS1053", "SUSPEND_FAILED";
    RESUME_FAILED = "E2024", "RESUME_FAILED";
    CHECKPOINT_MISMATCH = "TS1060", "CHECKPOINT_MISMATCH";
    CHECKPOINT_SIGNATURE = "TS1061", "CHECKPOINT_SIGNATURE";
    CHECKPOINT_MALFORMED = "TS1062", "CHECKPOINT_MALFORMED";
    KEY_INVALID = "TS1063", "KEY_INVALID";
    REVERT_CONFLICT = "TS1064", "REVERT_CONFLICT";
    PROTOCOL_MISMATCH = "TS1050", "PROTOCOL_MISMATCH";
    NETWORK_UNENFORCEABLE = "TS1070", "NETWORK_UNENFORCEABLE";
    RECEIVE_NO_ENTRY = "TS1090", "RECEIVE_NO_ENTRY";
    RECEIVE_ENVELOPE_INVALID = "TS1091", "RECEIVE_ENVELOPE_INVALID";
    RECEIVE_OUTPUT_TOO_LARGE = "TS1092", "RECEIVE_OUTPUT_TOO_LARGE";
    RECEIVE_FAILED = "TS1093", "RECEIVE_FAILED";
    BUS_HOP_LIMIT = "TS1094", "BUS_HOP_LIMIT";
    BUS_APPROVAL_IGNORED = "TS1095", "BUS_APPROVAL_IGNORED";
    BUS_NOT_SANDBOX_FIRST = "TS1096", "BUS_NOT_SANDBOX_FIRST";
    RECEIVE_BACKEND_UNSUPPORTED = "TS1097", "RECEIVE_BACKEND_UNSUPPORTED";
    DENIAL_OBSERVER_UNAVAILABLE = "TS1080", "DENIAL_OBSERVER_UNAVAILABLE";
    EGRESS_UDP_TOO_WIDE = "TS1075", "EGRESS_UDP_TOO_WIDE";
}

/// Errors of the pure policy layer. Every variant names the field, path or
/// value involved.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("package `{package}` not found: no manifest at {}", path.display())]
    PackageNotFound { package: String, path: PathBuf },

    #[error("cannot read manifest {}", path.display())]
    ManifestUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("invalid manifest {}: field `{field}`: {reason}", path.display())]
    InvalidManifest {
        path: PathBuf,
        field: String,
        reason: String,
    },

    #[error(
        "manifest {}: field `{field}`: pattern `{pattern}` would grant write on reserved path `{reserved}` (ledgers and supervisor-owned files can never be written by a turn)",
        path.display()
    )]
    ReservedWrite {
        path: PathBuf,
        field: String,
        pattern: String,
        reserved: String,
    },

    #[error(
        "manifest {}: field `{field}`: entry `{entry}` can grant nothing: {reason}",
        path.display()
    )]
    EntryGrantsNothing {
        path: PathBuf,
        field: String,
        entry: String,
        reason: String,
    },

    #[error(
        "manifest {}: field `{field}`: entry `{entry}`: {reason}",
        path.display()
    )]
    EgressUdpTooWide {
        path: PathBuf,
        field: String,
        entry: String,
        reason: String,
    },

    #[error("invalid turn request: field `{field}`: {reason}")]
    InvalidRequest { field: String, reason: String },

    #[error("invalid session id `{}`: {reason}", shown(value))]
    InvalidSessionId { value: String, reason: String },

    #[error("invalid package id `{}`: {reason}", shown(value))]
    InvalidPackageId { value: String, reason: String },

    #[error("the random source failed: {0}")]
    Random(String),
}

/// `s` fit for a terminal: control characters (C0, DEL, C1: an escape
/// sequence, a line feed) and bidirectional overrides written as Rust
/// escapes (`\u{1b}`, `\n`, `\u{202e}`), everything else as it is. What a
/// violation says comes partly from the turn — a DNS name it asked, a TLS
/// server name, a path it opened — and is printed to the operator's
/// terminal by `run` and `explain` (red-team wave 4, W8: a name with an
/// escape sequence recolored it, one with a line feed added a line).
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| {
        c.is_control()
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(bad) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(
        s.chars()
            .map(|c| {
                if bad(c) {
                    c.escape_debug().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// A refused value as a message echoes it: [`printable`], and at most
/// [`SHOWN_MAX`] characters of it (an id is far shorter; a 100 kB one is
/// not copied into every log and reply).
pub fn shown(value: &str) -> String {
    let head: String = value.chars().take(SHOWN_MAX).collect();
    let mut out = printable(&head).into_owned();
    let rest = value.chars().count().saturating_sub(SHOWN_MAX);
    if rest > 0 {
        out += &format!("… ({rest} more characters)");
    }
    out
}

/// See [`shown`].
const SHOWN_MAX: usize = 96;

impl PolicyError {
    /// The stable code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::PackageNotFound { .. } => codes::PACKAGE_NOT_FOUND,
            Self::ManifestUnreadable { .. } | Self::InvalidManifest { .. } => {
                codes::MANIFEST_INVALID
            }
            Self::ReservedWrite { .. } => codes::SECURITY_POLICY_VIOLATION,
            Self::EntryGrantsNothing { .. } => codes::ENTRY_GRANTS_NOTHING,
            Self::EgressUdpTooWide { .. } => codes::EGRESS_UDP_TOO_WIDE,
            Self::InvalidRequest { .. } => codes::REQUEST_INVALID,
            Self::InvalidSessionId { .. } => codes::SESSION_ID_INVALID,
            Self::InvalidPackageId { .. } => codes::PACKAGE_ID_INVALID,
            Self::Random(_) => codes::SESSION_START_FAILED,
        }
    }

    /// The field the error is about, when there is one (for `--json` output).
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::InvalidManifest { field, .. }
            | Self::ReservedWrite { field, .. }
            | Self::EntryGrantsNothing { field, .. }
            | Self::EgressUdpTooWide { field, .. }
            | Self::InvalidRequest { field, .. } => Some(field),
            Self::InvalidSessionId { .. } => Some("session_id"),
            Self::InvalidPackageId { .. } | Self::PackageNotFound { .. } => Some("package"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::codes;
    use std::collections::HashSet;

    #[test]
    fn a_refused_id_is_echoed_bounded_and_escaped() {
        let e = super::PolicyError::InvalidSessionId {
            value: format!("SES-{}\n", "a".repeat(100_000)),
            reason: "wrong length".into(),
        };
        let m = e.to_string();
        assert!(m.len() < 300, "{}", m.len());
        assert!(m.contains("more characters"), "{m}");
        let e = super::PolicyError::InvalidPackageId {
            value: "a\nb".into(),
            reason: "r".into(),
        };
        assert!(e.to_string().contains("a\\nb"), "{e}");
    }

    #[test]
    fn codes_are_unique() {
        let mut seen = HashSet::new();
        for c in codes::ALL {
            assert!(seen.insert(c.code), "duplicate code {}", c.code);
        }
    }
}
