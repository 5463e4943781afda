//! The supervisor's error type, its stable codes and CLI exit statuses.

use std::path::PathBuf;

use turnstile_policy::error::{ErrorCode, codes};
use turnstile_policy::{PolicyError, Violations};

use crate::store::integrity::IntegrityError;

/// Exit statuses of `supervise` (DESIGN "Command-line contract").
pub mod exit {
    pub const OK: u8 = 0;
    /// An unexpected operational failure (I/O on the host side).
    pub const FAILURE: u8 = 1;
    pub const BAD_INPUT: u8 = 2;
    pub const INTEGRITY: u8 = 3;
    pub const COMMAND_FAILED: u8 = 10;
    pub const VIOLATION: u8 = 11;
    pub const WRITE_MISMATCH: u8 = 12;
    pub const RESOURCE_LIMIT: u8 = 13;
    pub const TIMEOUT: u8 = 14;
    pub const SANDBOX: u8 = 20;
}

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error(transparent)]
    Policy(#[from] PolicyError),

    #[error(transparent)]
    Violation(#[from] Violations),

    #[error(transparent)]
    Integrity(#[from] IntegrityError),

    #[error("session `{session}` not found: {}", path.display())]
    SessionNotFound { session: String, path: PathBuf },

    #[error("invalid argument `{field}`: {reason}")]
    InvalidArgument { field: String, reason: String },

    #[error(
        "field `declared_inputs`: `{path}` cannot be read (it must be a regular file under the root, reached without symlinks)"
    )]
    InputUnreadable {
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("ledger I/O: {op} {}", path.display())]
    LedgerIo {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("state I/O: {op} {}", path.display())]
    StateIo {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("sandbox setup failed at `{step}`: {detail}")]
    Sandbox {
        step: &'static str,
        detail: String,
        #[source]
        source: Option<std::io::Error>,
    },

    #[error("commit failed: {detail}")]
    Commit { detail: String },

    #[error("capture limit: {0}")]
    CaptureLimit(String),

    #[error("runtime `{runtime}` is unavailable: {reason}")]
    RuntimeUnavailable { runtime: String, reason: String },

    #[error(
        "backend `{backend}` cannot enforce {}: {why}; the manifest's `allow_degraded` does not list {}, so nothing was run",
        missing.join(", "), if missing.len() == 1 { "it" } else { "them" }
    )]
    Unenforceable {
        backend: String,
        missing: Vec<String>,
        why: String,
    },

    #[error(
        "backend `{backend}` is weaker than `{minimum}`, the minimum isolation of trust level `{level}` ({minimum_by}); nothing was run"
    )]
    BelowTrustMinimum {
        backend: String,
        level: String,
        minimum: String,
        minimum_by: String,
    },

    #[error(
        "session `{session}` belongs to {owner}, not to {requester}: nothing was run (the refusal is recorded in the owner's evidence)"
    )]
    SessionNotOwned {
        session: String,
        owner: String,
        requester: String,
    },

    #[error("cannot reach the daemon at {} (`--server`): is `supervise serve` running?", socket.display())]
    ServerUnavailable {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "peer refused: uid {uid} may not use this daemon (only uid {daemon_uid}, its owner, and root may)"
    )]
    PeerRefused { uid: u32, daemon_uid: u32 },

    #[error("bus rules {}: field `{field}`: {reason}", path.display())]
    BusRules {
        path: PathBuf,
        field: String,
        reason: String,
    },

    #[error(
        "wire protocol mismatch: the client speaks version {client}, the daemon speaks version {daemon} (daemon: supervise {daemon_version}; client: supervise {}); nothing was run — use the `supervise` binary the daemon was started from",
        env!("CARGO_PKG_VERSION")
    )]
    ProtocolMismatch {
        client: u64,
        daemon: u32,
        daemon_version: String,
    },

    #[error("the daemon's turn worker failed: {detail}")]
    WorkerFailed { detail: String },

    #[error("cannot start session")]
    SessionStart(#[source] Box<SupervisorError>),
    #[error(
        "idempotency key `{key}` was used by turn {turn} for a different request (recorded request {recorded}, this request {given}); nothing was run"
    )]
    IdempotencyConflict {
        key: String,
        turn: u64,
        recorded: String,
        given: String,
    },
}

pub type Result<T, E = SupervisorError> = std::result::Result<T, E>;

impl SupervisorError {
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Policy(e) => e.code(),
            Self::Violation(_) => codes::SECURITY_POLICY_VIOLATION,
            Self::Integrity(_) => codes::LEDGER_INTEGRITY,
            Self::SessionNotFound { .. } => codes::SESSION_NOT_FOUND,
            Self::InvalidArgument { .. } => codes::ARGUMENT_INVALID,
            Self::InputUnreadable { .. } => codes::INPUT_UNREADABLE,
            Self::LedgerIo { .. } => codes::LEDGER_IO,
            Self::StateIo { .. } => codes::STATE_IO,
            Self::SessionStart(_) => codes::SESSION_START_FAILED,
            Self::Sandbox { .. } => codes::SANDBOX_CREATION_FAILED,
            Self::RuntimeUnavailable { .. } => codes::RUNTIME_UNAVAILABLE,
            Self::Unenforceable { .. } => codes::LAYER_UNENFORCEABLE,
            Self::BelowTrustMinimum { .. } => codes::BACKEND_BELOW_TRUST_MINIMUM,
            Self::SessionNotOwned { .. } => codes::SESSION_NOT_OWNED,
            Self::CaptureLimit(_) => codes::DISK_LIMIT_EXCEEDED,
            Self::Commit { .. } => codes::COMMIT_FAILED,
            Self::IdempotencyConflict { .. } => codes::IDEMPOTENCY_CONFLICT,
            Self::ServerUnavailable { .. } => codes::SERVER_UNAVAILABLE,
            Self::PeerRefused { .. } => codes::PEER_REFUSED,
            Self::WorkerFailed { .. } => codes::SERVE_WORKER_FAILED,
            Self::BusRules { .. } => codes::BUS_RULES_INVALID,
            Self::ProtocolMismatch { .. } => codes::PROTOCOL_MISMATCH,
        }
    }

    pub fn exit_status(&self) -> u8 {
        match self {
            Self::Policy(PolicyError::Random(_)) => exit::FAILURE,
            Self::Policy(_)
            | Self::SessionNotFound { .. }
            | Self::InvalidArgument { .. }
            | Self::InputUnreadable { .. }
            | Self::IdempotencyConflict { .. }
            | Self::SessionNotOwned { .. }
            | Self::PeerRefused { .. }
            | Self::ProtocolMismatch { .. }
            | Self::BusRules { .. } => exit::BAD_INPUT,
            Self::ServerUnavailable { .. } | Self::WorkerFailed { .. } => exit::FAILURE,
            Self::Violation(_) => exit::VIOLATION,
            Self::Integrity(_) => exit::INTEGRITY,
            Self::LedgerIo { .. } | Self::StateIo { .. } | Self::Commit { .. } => exit::FAILURE,
            Self::SessionStart(inner) => inner.exit_status(),
            Self::Sandbox { .. }
            | Self::RuntimeUnavailable { .. }
            | Self::Unenforceable { .. }
            | Self::BelowTrustMinimum { .. } => exit::SANDBOX,
            Self::CaptureLimit(_) => exit::RESOURCE_LIMIT,
        }
    }

    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Policy(e) => e.field(),
            Self::InvalidArgument { field, .. } => Some(field),
            Self::SessionNotFound { .. } | Self::SessionNotOwned { .. } => Some("session"),
            Self::InputUnreadable { .. } => Some("declared_inputs"),
            Self::IdempotencyConflict { .. } => Some("idempotency_key"),
            Self::Unenforceable { .. } => Some("allow_degraded"),
            Self::BelowTrustMinimum { .. } => Some("--backend"),
            Self::ServerUnavailable { .. } => Some("--server"),
            Self::ProtocolMismatch { .. } => Some("protocol"),
            Self::BusRules { field, .. } => Some(field),
            _ => None,
        }
    }

    pub fn invalid(field: &str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.to_owned(),
            reason: reason.into(),
        }
    }
}
