//! `supervise run`'s (and `check`'s) exit statuses as one typed value: the
//! README's "Exit statuses" table, read by the task service instead of
//! integer literals. Pure.

/// How a `supervise run` (or `check`) process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunExit {
    /// 0: the command exited 0 and its writes were committed (`check`:
    /// admitted).
    Committed,
    /// 1: a host I/O failure.
    HostIo,
    /// 2: bad invocation, manifest, request, path or session id (nothing
    /// was created).
    BadInput,
    /// 3: a ledger integrity failure.
    LedgerIntegrity,
    /// 10: the command exited non-zero.
    CommandFailed,
    /// 11: a capability violation before execution (nothing ran).
    Violation,
    /// 12: realized writes differ from the declaration (nothing committed).
    Blocked,
    /// 13: a memory, pids, disk or files limit.
    Limit,
    /// 14: the turn's timeout.
    Timeout,
    /// 20: the sandbox could not be built (E2041), the backend is not
    /// installed (E2040), cannot enforce a layer the manifest requires
    /// (TS1025), or is weaker than the package's trust level allows
    /// (TS1040). Nothing ran.
    Unavailable,
    /// 128+N: ended by signal N (SIGTERM, SIGINT, SIGHUP: `run` recorded
    /// the turn as `interrupted`; SIGKILL: it could record nothing).
    Signaled(i32),
    /// Any other status: not part of the contract.
    Other(i32),
}

impl RunExit {
    /// The status of a process that exited with `code`.
    pub fn from_code(code: i32) -> Self {
        use turnstile_supervisor::error::exit;
        let Ok(c) = u8::try_from(code) else {
            return Self::Other(code);
        };
        match c {
            exit::OK => Self::Committed,
            exit::FAILURE => Self::HostIo,
            exit::BAD_INPUT => Self::BadInput,
            exit::INTEGRITY => Self::LedgerIntegrity,
            exit::COMMAND_FAILED => Self::CommandFailed,
            exit::VIOLATION => Self::Violation,
            exit::WRITE_MISMATCH => Self::Blocked,
            exit::RESOURCE_LIMIT => Self::Limit,
            exit::TIMEOUT => Self::Timeout,
            exit::SANDBOX => Self::Unavailable,
            129..=192 => Self::Signaled(code - 128),
            _ => Self::Other(code),
        }
    }

    /// The status of a process that exited with `code`, or was killed by
    /// `signal` (as a shell reports it: 128+N); 255 when neither is known.
    pub fn from_wait(code: Option<i32>, signal: Option<i32>) -> Self {
        match (code, signal) {
            (Some(c), _) => Self::from_code(c),
            (None, Some(n)) => Self::Signaled(n),
            (None, None) => Self::Other(255),
        }
    }

    /// The integer status (what containerd reports as the task's).
    pub fn code(self) -> i32 {
        use turnstile_supervisor::error::exit;
        i32::from(match self {
            Self::Committed => exit::OK,
            Self::HostIo => exit::FAILURE,
            Self::BadInput => exit::BAD_INPUT,
            Self::LedgerIntegrity => exit::INTEGRITY,
            Self::CommandFailed => exit::COMMAND_FAILED,
            Self::Violation => exit::VIOLATION,
            Self::Blocked => exit::WRITE_MISMATCH,
            Self::Limit => exit::RESOURCE_LIMIT,
            Self::Timeout => exit::TIMEOUT,
            Self::Unavailable => exit::SANDBOX,
            Self::Signaled(n) => return 128 + n,
            Self::Other(c) => return c,
        })
    }

    /// containerd's `exit_status` (unsigned; a negative code is 255).
    pub fn exit_status(self) -> u32 {
        u32::try_from(self.code()).unwrap_or(255)
    }

    /// What the status means, for the shim's log.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::Committed => "success (committed)",
            Self::HostIo => "host I/O failure",
            Self::BadInput => "bad input (nothing created)",
            Self::LedgerIntegrity => "ledger integrity failure",
            Self::CommandFailed => "the command exited non-zero",
            Self::Violation => "capability violation before execution (nothing ran)",
            Self::Blocked => "realized writes differ from the declaration (nothing committed)",
            Self::Limit => "a memory, pids, disk or files limit",
            Self::Timeout => "timeout",
            Self::Unavailable => "the backend could not run the turn (nothing ran)",
            Self::Signaled(_) => "ended by a signal",
            Self::Other(_) => "not a status of supervise's contract",
        }
    }
}

impl std::fmt::Display for RunExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.code(), self.meaning())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_24_every_documented_status_round_trips() {
        for code in [
            0, 1, 2, 3, 10, 11, 12, 13, 14, 20, 130, 143, 137, 5, 99, 255,
        ] {
            assert_eq!(RunExit::from_code(code).code(), code, "{code}");
        }
        assert_eq!(RunExit::from_code(143), RunExit::Signaled(15));
        assert_eq!(RunExit::from_code(20), RunExit::Unavailable);
        assert_eq!(RunExit::from_code(5), RunExit::Other(5));
        assert_eq!(RunExit::from_wait(None, Some(9)).code(), 137);
        assert_eq!(RunExit::from_wait(None, None).exit_status(), 255);
        assert_eq!(RunExit::Other(-1).exit_status(), 255);
    }
}
