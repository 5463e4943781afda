//! How a turn ended: one typed status, one pure classification, and the
//! stable code and exit status each status carries (DESIGN "Command-line
//! contract"). Every backend's outcome goes through [`classify`]; nothing
//! else decides a turn's status.

use turnstile_policy::error::{ErrorCode, codes};

use crate::error::exit;

/// The outcome of one turn, as `--json` prints it: the exit status of
/// `supervise run`, the `--json` object and the one-line summary.
#[derive(Debug, Clone)]
pub struct TurnResult {
    pub exit_status: u8,
    pub value: serde_json::Value,
    pub summary: String,
}

/// The status a turn is recorded with, in both ledgers and in `--json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    /// The command exited 0 and its writes matched the declaration.
    Committed,
    /// The command exited 0 but its writes did not match: nothing committed.
    Blocked,
    /// Refused by the pre-execution check: nothing ran.
    Violation,
    /// The command exited non-zero, was killed by a signal, or could not be
    /// executed.
    CommandFailed,
    Timeout,
    MemoryLimit,
    PidsLimit,
    /// The disk or files limit (the turn's write tmpfs is full).
    DiskLimit,
    /// The sandbox could not be built.
    SandboxError,
    /// The command's process did not have the posture it must have.
    PostureFailed,
    /// Host I/O failed while committing.
    CommitFailed,
    /// Closed by recovery after its supervisor stopped.
    Aborted,
    /// SIGTERM, SIGINT or SIGHUP to the supervisor.
    Interrupted,
}

impl TurnStatus {
    pub const ALL: [TurnStatus; 13] = [
        Self::Committed,
        Self::Blocked,
        Self::Violation,
        Self::CommandFailed,
        Self::Timeout,
        Self::MemoryLimit,
        Self::PidsLimit,
        Self::DiskLimit,
        Self::SandboxError,
        Self::PostureFailed,
        Self::CommitFailed,
        Self::Aborted,
        Self::Interrupted,
    ];

    /// The status named `s` (as recorded in the ledgers).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Committed => "committed",
            Self::Blocked => "blocked",
            Self::Violation => "violation",
            Self::CommandFailed => "command_failed",
            Self::Timeout => "timeout",
            Self::MemoryLimit => "memory_limit",
            Self::PidsLimit => "pids_limit",
            Self::DiskLimit => "disk_limit",
            Self::SandboxError => "sandbox_error",
            Self::PostureFailed => "posture_failed",
            Self::CommitFailed => "commit_failed",
            Self::Aborted => "aborted",
            Self::Interrupted => "interrupted",
        }
    }

    /// The exit status of `supervise run`. `signal` is the signal that
    /// interrupted the supervisor (for [`TurnStatus::Interrupted`]).
    pub fn exit_status(self, signal: Option<i32>) -> u8 {
        match self {
            Self::Committed => exit::OK,
            Self::Blocked => exit::WRITE_MISMATCH,
            Self::Violation => exit::VIOLATION,
            Self::CommandFailed => exit::COMMAND_FAILED,
            Self::Timeout => exit::TIMEOUT,
            Self::MemoryLimit | Self::PidsLimit | Self::DiskLimit => exit::RESOURCE_LIMIT,
            Self::SandboxError | Self::PostureFailed => exit::SANDBOX,
            Self::CommitFailed | Self::Aborted => exit::FAILURE,
            Self::Interrupted => u8::try_from(128 + signal.unwrap_or(0)).unwrap_or(u8::MAX),
        }
    }

    /// The stable error code a status carries (`None`: not an error).
    pub fn code(self) -> Option<ErrorCode> {
        match self {
            Self::Committed | Self::CommandFailed => None,
            Self::Blocked | Self::Violation => Some(codes::SECURITY_POLICY_VIOLATION),
            Self::Timeout => Some(codes::TIMEOUT),
            Self::MemoryLimit => Some(codes::MEMORY_LIMIT_EXCEEDED),
            Self::PidsLimit => Some(codes::PIDS_LIMIT_EXCEEDED),
            Self::DiskLimit => Some(codes::DISK_LIMIT_EXCEEDED),
            Self::SandboxError | Self::PostureFailed => Some(codes::SANDBOX_CREATION_FAILED),
            Self::CommitFailed => Some(codes::COMMIT_FAILED),
            Self::Aborted => Some(codes::TURN_ABORTED),
            Self::Interrupted => Some(codes::TURN_INTERRUPTED),
        }
    }
}

impl std::fmt::Display for TurnStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the command ended, as far as classification cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Exited(i32),
    /// Killed by a signal, or execve failed.
    Abnormally,
    /// The sandbox reported a setup failure (or ended without reporting).
    SetupFailed,
}

/// What a backend observed about a turn that ran (or tried to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    pub ended: Ended,
    /// The supervisor was interrupted (SIGTERM, SIGINT, SIGHUP).
    pub interrupted: bool,
    /// The posture check failed.
    pub posture_failed: bool,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub pids_limited: bool,
    pub disk_full: bool,
    /// Realized writes match the declaration.
    pub writes_match: bool,
}

/// The one decision table. Order matters and is deliberate: what the
/// supervisor did to the turn (interrupt, posture kill, timeout) explains
/// whatever the sandbox reported after it; a setup failure explains the
/// command's absence; a limit the kernel enforced explains a failure; only
/// a command that exited 0 is judged on its writes.
pub fn classify(o: &Observed) -> TurnStatus {
    match o.ended {
        _ if o.interrupted => TurnStatus::Interrupted,
        _ if o.posture_failed => TurnStatus::PostureFailed,
        _ if o.timed_out => TurnStatus::Timeout,
        Ended::SetupFailed => TurnStatus::SandboxError,
        _ if o.oom_killed => TurnStatus::MemoryLimit,
        Ended::Exited(0) if o.writes_match => TurnStatus::Committed,
        Ended::Exited(0) => TurnStatus::Blocked,
        _ if o.pids_limited => TurnStatus::PidsLimit,
        _ if o.disk_full => TurnStatus::DiskLimit,
        _ => TurnStatus::CommandFailed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(ended: Ended) -> Observed {
        Observed {
            ended,
            interrupted: false,
            posture_failed: false,
            timed_out: false,
            oom_killed: false,
            pids_limited: false,
            disk_full: false,
            writes_match: true,
        }
    }

    /// Every ending × every flag, against the table written out by hand.
    #[test]
    fn classify_covers_every_ending_and_flag() {
        let endings = [
            Ended::Exited(0),
            Ended::Exited(1),
            Ended::Abnormally,
            Ended::SetupFailed,
        ];
        type Flag = fn(&mut Observed);
        let flags: [(&str, Flag); 8] = [
            ("none", |_| {}),
            ("interrupted", |o| o.interrupted = true),
            ("posture", |o| o.posture_failed = true),
            ("timeout", |o| o.timed_out = true),
            ("oom", |o| o.oom_killed = true),
            ("pids", |o| o.pids_limited = true),
            ("disk", |o| o.disk_full = true),
            ("mismatch", |o| o.writes_match = false),
        ];
        use TurnStatus as S;
        for ended in endings {
            for (name, set) in flags {
                let mut o = observed(ended);
                set(&mut o);
                let want = match (name, ended) {
                    ("interrupted", _) => S::Interrupted,
                    ("posture", _) => S::PostureFailed,
                    ("timeout", _) => S::Timeout,
                    (_, Ended::SetupFailed) => S::SandboxError,
                    ("oom", _) => S::MemoryLimit,
                    ("mismatch", Ended::Exited(0)) => S::Blocked,
                    (_, Ended::Exited(0)) => S::Committed,
                    ("pids", _) => S::PidsLimit,
                    ("disk", _) => S::DiskLimit,
                    _ => S::CommandFailed,
                };
                assert_eq!(classify(&o), want, "{ended:?} + {name}");
            }
        }
    }

    #[test]
    fn a_term_ignoring_command_at_timeout_is_a_timeout_not_a_setup_failure() {
        let mut o = observed(Ended::SetupFailed);
        o.timed_out = true;
        assert_eq!(classify(&o), TurnStatus::Timeout);
        assert_eq!(TurnStatus::Timeout.exit_status(None), 14);
    }

    #[test]
    fn exit_statuses_and_codes_follow_the_contract() {
        use TurnStatus as S;
        let table = [
            (S::Committed, 0, None),
            (S::Blocked, 12, Some("E2042")),
            (S::Violation, 11, Some("E2042")),
            (S::CommandFailed, 10, None),
            (S::Timeout, 14, Some("E2002")),
            (S::MemoryLimit, 13, Some("E2071")),
            (S::PidsLimit, 13, Some("TS1020")),
            (S::DiskLimit, 13, Some("TS1021")),
            (S::SandboxError, 20, Some("E2041")),
            (S::PostureFailed, 20, Some("E2041")),
            (S::CommitFailed, 1, Some("TS1022")),
            (S::Aborted, 1, Some("TS1023")),
        ];
        assert_eq!(table.len() + 1, S::ALL.len());
        for (s, exit, code) in table {
            assert_eq!(s.exit_status(None), exit, "{s}");
            assert_eq!(s.code().map(|c| c.code), code, "{s}");
        }
        assert_eq!(S::Interrupted.exit_status(Some(15)), 143);
        assert_eq!(S::Interrupted.exit_status(Some(2)), 130);
        assert_eq!(S::Interrupted.exit_status(Some(1)), 129);
        assert_eq!(S::Interrupted.code().map(|c| c.code), Some("TS1024"));
    }
}
