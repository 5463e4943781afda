//! The supervisor's error type, its stable codes and CLI exit statuses, and
//! what can be wrong with a ledger (the integrity failures verification
//! names): errors sit below every wing, so the store and the error type
//! both use them without an import running back up.

use std::fmt;
use std::path::PathBuf;

use turnstile_policy::error::{ErrorCode, codes};
use turnstile_policy::{PolicyError, Violations};

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

    /// The supervisor was signalled while a commit staged, before its
    /// commit point: the staging was rolled back.
    #[error("the commit was interrupted before its commit point: nothing landed")]
    CommitInterrupted,

    #[error("capture limit: {0}")]
    CaptureLimit(String),

    #[error("runtime `{runtime}` is unavailable: {reason}")]
    RuntimeUnavailable { runtime: String, reason: String },

    #[error("`supervise learn` needs the denial observer, which is unavailable here: {why}")]
    ObserverUnavailable { why: String },

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
        "backend `{backend}` cannot enforce network `{network}`: {why}; the turn is refused rather than run with another network, nothing was run"
    )]
    NetworkUnenforceable {
        backend: String,
        network: String,
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

    /// The owner is not named to the requester (another tenant learns
    /// nothing of who holds the session); the owner's evidence records
    /// both.
    #[error(
        "session `{session}` is not {requester}'s: nothing was done ({})",
        if *recorded { "the refusal is recorded in the owner's evidence" } else { "not recorded: a turn holds the session" }
    )]
    SessionNotOwned {
        session: String,
        requester: String,
        recorded: bool,
    },

    #[error("invalid `--cgroup-parent` {value}: {reason}; nothing was created")]
    CgroupParentInvalid { value: String, reason: String },

    #[error("session `{session}` has no running turn to {action}")]
    NoRunningTurn {
        session: String,
        action: &'static str,
    },

    #[error("cannot suspend the running turn of session `{session}`: {detail}")]
    SuspendFailed { session: String, detail: String },

    #[error(
        "cannot resume the running turn of session `{session}`: {detail}; the turn was ended and fails with RESUME_FAILED"
    )]
    ResumeFailed { session: String, detail: String },

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

    /// The ledgers are not what a signed checkpoint says they were: an
    /// entry it covers was changed, removed or reordered (`entry` names the
    /// first one that differs, when the checkpoint lets us find it).
    #[error("checkpoint {}: {detail}", checkpoint.display())]
    CheckpointMismatch { checkpoint: PathBuf, detail: String },

    /// A checkpoint's signatures do not satisfy the trust asked for: wrong
    /// key, a bad signature, too few witnesses.
    #[error("checkpoint {}: {detail}", checkpoint.display())]
    CheckpointSignature { checkpoint: PathBuf, detail: String },

    /// Not a signed note holding a turnstile checkpoint.
    #[error("checkpoint {}: malformed: {detail}", checkpoint.display())]
    CheckpointMalformed { checkpoint: PathBuf, detail: String },

    /// A revert that cannot put every file back: each path and why
    /// (changed since, pre-image not kept). Nothing was changed.
    #[error("cannot revert turn {turn} of {session}, nothing was changed: {}", paths.join("; "))]
    RevertConflict {
        session: String,
        turn: u64,
        paths: Vec<String>,
    },

    /// A key file that cannot be made, read or used.
    #[error("key {}: {detail}", path.display())]
    KeyInvalid {
        path: PathBuf,
        detail: String,
        #[source]
        source: Option<std::io::Error>,
    },

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

    #[error(
        "package `{package}` has no ARA entry point: its manifest declares no `entry.receive`; nothing was run"
    )]
    ReceiveNoEntry { package: String },

    #[error(
        "a receive turn runs on the native backend only (its input reaches the agent through turnstile's own sandbox init); `{backend}` was chosen: nothing was run"
    )]
    ReceiveBackend { backend: String },
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
            Self::ObserverUnavailable { .. } => codes::DENIAL_OBSERVER_UNAVAILABLE,
            Self::Unenforceable { .. } => codes::LAYER_UNENFORCEABLE,
            Self::NetworkUnenforceable { .. } => codes::NETWORK_UNENFORCEABLE,
            Self::BelowTrustMinimum { .. } => codes::BACKEND_BELOW_TRUST_MINIMUM,
            Self::SessionNotOwned { .. } => codes::SESSION_NOT_OWNED,
            Self::CgroupParentInvalid { .. } => codes::CGROUP_PARENT_INVALID,
            Self::NoRunningTurn { .. } => codes::NO_RUNNING_TURN,
            Self::SuspendFailed { .. } => codes::SUSPEND_FAILED,
            Self::ResumeFailed { .. } => codes::RESUME_FAILED,
            Self::CaptureLimit(_) => codes::DISK_LIMIT_EXCEEDED,
            Self::Commit { .. } => codes::COMMIT_FAILED,
            Self::CommitInterrupted => codes::TURN_INTERRUPTED,
            Self::IdempotencyConflict { .. } => codes::IDEMPOTENCY_CONFLICT,
            Self::ServerUnavailable { .. } => codes::SERVER_UNAVAILABLE,
            Self::PeerRefused { .. } => codes::PEER_REFUSED,
            Self::WorkerFailed { .. } => codes::SERVE_WORKER_FAILED,
            Self::BusRules { .. } => codes::BUS_RULES_INVALID,
            Self::CheckpointMismatch { .. } => codes::CHECKPOINT_MISMATCH,
            Self::CheckpointSignature { .. } => codes::CHECKPOINT_SIGNATURE,
            Self::CheckpointMalformed { .. } => codes::CHECKPOINT_MALFORMED,
            Self::KeyInvalid { .. } => codes::KEY_INVALID,
            Self::RevertConflict { .. } => codes::REVERT_CONFLICT,
            Self::ProtocolMismatch { .. } => codes::PROTOCOL_MISMATCH,
            Self::ReceiveNoEntry { .. } => codes::RECEIVE_NO_ENTRY,
            Self::ReceiveBackend { .. } => codes::RECEIVE_BACKEND_UNSUPPORTED,
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
            | Self::CgroupParentInvalid { .. }
            | Self::NoRunningTurn { .. }
            | Self::PeerRefused { .. }
            | Self::ProtocolMismatch { .. }
            | Self::BusRules { .. }
            | Self::CheckpointMalformed { .. }
            | Self::KeyInvalid { .. }
            | Self::ReceiveNoEntry { .. } => exit::BAD_INPUT,
            Self::CheckpointMismatch { .. } | Self::CheckpointSignature { .. } => exit::INTEGRITY,
            Self::RevertConflict { .. } => exit::WRITE_MISMATCH,
            Self::ServerUnavailable { .. } | Self::WorkerFailed { .. } => exit::FAILURE,
            Self::Violation(_) => exit::VIOLATION,
            Self::Integrity(_) => exit::INTEGRITY,
            Self::LedgerIo { .. }
            | Self::StateIo { .. }
            | Self::Commit { .. }
            | Self::CommitInterrupted => exit::FAILURE,
            Self::SessionStart(inner) => inner.exit_status(),
            Self::Sandbox { .. }
            | Self::RuntimeUnavailable { .. }
            | Self::ObserverUnavailable { .. }
            | Self::Unenforceable { .. }
            | Self::NetworkUnenforceable { .. }
            | Self::BelowTrustMinimum { .. }
            | Self::SuspendFailed { .. }
            | Self::ResumeFailed { .. }
            | Self::ReceiveBackend { .. } => exit::SANDBOX,
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
            Self::NetworkUnenforceable { .. } => Some("network"),
            Self::BelowTrustMinimum { .. } => Some("--backend"),
            Self::CgroupParentInvalid { .. } => Some("--cgroup-parent"),
            Self::NoRunningTurn { .. } => Some("--session"),
            Self::ServerUnavailable { .. } => Some("--server"),
            Self::ProtocolMismatch { .. } => Some("protocol"),
            Self::BusRules { field, .. } => Some(field),
            Self::ReceiveNoEntry { .. } => Some("entry.receive"),
            Self::ReceiveBackend { .. } | Self::RuntimeUnavailable { .. } => Some("--backend"),
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

// ---- ledger integrity: what verification names (no dependency on the store)

/// What is wrong with a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    FileMissing {
        acknowledged: u64,
    },
    NotRegularFile,
    AnchorMissing,
    AnchorInvalid(String),
    TornLine,
    EmptyLine,
    Malformed(String),
    NotCanonical,
    NotObject,
    MissingField(&'static str),
    SeqMismatch {
        found: String,
    },
    WrongSession {
        found: String,
    },
    BrokenLink {
        expected: String,
        found: String,
    },
    HashMismatch {
        recorded: String,
        computed: String,
    },
    LegacyAfterHashed,
    Truncated {
        acknowledged: u64,
        found: u64,
    },
    BeyondAnchor {
        acknowledged: u64,
        found: u64,
    },
    AnchorHashMismatch {
        acknowledged: String,
        found: String,
    },
    SizeMismatch {
        acknowledged: u64,
        found: u64,
    },
    PendingAppend,
    /// An HO2 checkpoint that does not match the ledger it claims to cover.
    Checkpoint(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FileMissing { acknowledged } => write!(
                f,
                "the ledger file is missing, but {acknowledged} entries were acknowledged (deleted?)"
            ),
            Self::NotRegularFile => write!(f, "is not a regular file (symlink or special file)"),
            Self::AnchorMissing => write!(
                f,
                "no head anchor in the state directory: truncation or deletion cannot be ruled out"
            ),
            Self::AnchorInvalid(why) => write!(f, "the head anchor is invalid: {why}"),
            Self::TornLine => write!(f, "torn line: the last line has no terminating newline"),
            Self::EmptyLine => write!(f, "empty line"),
            Self::Malformed(why) => write!(f, "malformed JSON: {why}"),
            Self::NotCanonical => write!(
                f,
                "not canonical JSON (whitespace, key order, escapes or number form were changed)"
            ),
            Self::NotObject => write!(f, "entry is not a JSON object"),
            Self::MissingField(name) => write!(f, "missing or mistyped field `{name}`"),
            Self::SeqMismatch { found } => write!(
                f,
                "seq is {found}: an entry was deleted, inserted or reordered before this line"
            ),
            Self::WrongSession { found } => write!(
                f,
                "entry belongs to session `{found}` (spliced from another session)"
            ),
            Self::BrokenLink { expected, found } => write!(
                f,
                "previous_hash {found} does not link to the previous entry ({expected}): the previous entry was altered, or this one was spliced in"
            ),
            Self::HashMismatch { recorded, computed } => write!(
                f,
                "entry_hash {recorded} does not match the content (computed {computed}): the entry was edited"
            ),
            Self::LegacyAfterHashed => write!(
                f,
                "an entry without hashes follows hashed entries (downgrade): legacy entries may only precede the chain"
            ),
            Self::Truncated {
                acknowledged,
                found,
            } => {
                if *found == 0 {
                    write!(
                        f,
                        "the ledger is empty, but {acknowledged} entries were acknowledged (truncated)"
                    )
                } else {
                    write!(
                        f,
                        "the ledger ends at seq {found}, but {acknowledged} entries were acknowledged (tail truncated)"
                    )
                }
            }
            Self::BeyondAnchor {
                acknowledged,
                found,
            } => write!(
                f,
                "the ledger has entries up to seq {found}, but only {acknowledged} were acknowledged (appended outside the supervisor, or an append never completed)"
            ),
            Self::AnchorHashMismatch {
                acknowledged,
                found,
            } => write!(
                f,
                "the head entry hash {found} differs from the acknowledged head {acknowledged} (the tail was rewritten)"
            ),
            Self::SizeMismatch {
                acknowledged,
                found,
            } => write!(
                f,
                "the file is {found} bytes, but {acknowledged} bytes were acknowledged (changed outside the supervisor)"
            ),
            Self::PendingAppend => write!(
                f,
                "an earlier append did not finish; the session must be recovered before appending"
            ),
            Self::Checkpoint(detail) => write!(f, "checkpoint refused: {detail}"),
        }
    }
}

/// A ledger failed verification. Names the ledger, the entry (line and,
/// when known, seq) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct IntegrityError {
    pub ledger: PathBuf,
    pub line: Option<u64>,
    pub seq: Option<u64>,
    pub problem: Problem,
}

impl fmt::Display for IntegrityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ledger {}", self.ledger.display())?;
        match (self.line, self.seq) {
            (Some(line), Some(seq)) => write!(f, ": entry seq {seq} (line {line})")?,
            (Some(line), None) => write!(f, ": line {line}")?,
            (None, Some(seq)) => write!(f, ": entry seq {seq}")?,
            (None, None) => {}
        }
        write!(f, ": {}", self.problem)
    }
}
