//! The shim's errors, each with a stable code, mapped to ttrpc codes at the
//! boundary (containerd shows the message to `ctr` and the kubelet).

use std::path::PathBuf;

use containerd_shim::protos::ttrpc;

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// An `io.turnstile.*` annotation is missing or malformed.
    #[error("annotation `{key}` {reason}")]
    Annotation { key: &'static str, reason: String },
    /// Something in `config.json` a turn cannot honour.
    #[error("config.json `{field}`: {reason}")]
    Spec { field: &'static str, reason: String },
    /// The shim's options file.
    #[error("shim options {}: {reason}", path.display())]
    Options { path: PathBuf, reason: String },
    /// The pre-execution check refused the turn (nothing ran; recorded).
    #[error(
        "capability violation before execution, nothing ran: {violations} (recorded: {recorded})"
    )]
    Violation {
        recorded: String,
        violations: String,
    },
    /// `supervise` refused the input (its exit 2), naming the field.
    #[error("{0}")]
    Refused(String),
    /// The runtime the options name is not available (`supervise` exit 20).
    #[error("{0}")]
    Unavailable(String),
    /// A request in the wrong state (Start twice, Delete while running…).
    #[error("{0}")]
    State(String),
    /// What a turn cannot do (exec into it, pause it).
    #[error("{0}")]
    Unsupported(String),
    /// A task id this shim does not run.
    #[error("task `{0}` not found in this shim")]
    NotFound(String),
    /// The OCI runtime running a CRI pod sandbox (pause) container failed.
    #[error("pod sandbox: `{op}` failed: {reason}")]
    Sandbox { op: String, reason: String },
    /// Host I/O (bundle, fifos, rootfs mounts, spawning `supervise`).
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ShimError {
    /// The stable code a user can look up.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Annotation { .. } => "TS1201",
            Self::Spec { .. } => "TS1202",
            Self::Options { .. } => "TS1203",
            Self::Violation { .. } => "E2042",
            Self::Refused(_) => "TS1204",
            Self::Unavailable(_) => "E2040",
            Self::State(_) => "TS1205",
            Self::Unsupported(_) => "TS1206",
            Self::NotFound(_) => "TS1207",
            Self::Io { .. } => "TS1208",
            Self::Sandbox { .. } => "TS1209",
        }
    }

    fn ttrpc_code(&self) -> ttrpc::Code {
        match self {
            Self::Annotation { .. } | Self::Spec { .. } | Self::Refused(_) => {
                ttrpc::Code::INVALID_ARGUMENT
            }
            Self::Options { .. } | Self::Violation { .. } | Self::State(_) => {
                ttrpc::Code::FAILED_PRECONDITION
            }
            Self::Unavailable(_) => ttrpc::Code::UNAVAILABLE,
            Self::Unsupported(_) => ttrpc::Code::UNIMPLEMENTED,
            Self::NotFound(_) => ttrpc::Code::NOT_FOUND,
            Self::Io { .. } | Self::Sandbox { .. } => ttrpc::Code::INTERNAL,
        }
    }

    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { op, path, source }
    }
}

impl From<ShimError> for ttrpc::Error {
    fn from(e: ShimError) -> Self {
        let mut message = format!("turnstile: {} {e}", e.code());
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message += &format!(": {s}");
            source = s.source();
        }
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.ttrpc_code(), message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_ttrpc_codes_with_the_stable_code_in_the_message() {
        for (e, code) in [
            (
                ShimError::Annotation {
                    key: "io.turnstile.outputs",
                    reason: "is required".into(),
                },
                ttrpc::Code::INVALID_ARGUMENT,
            ),
            (
                ShimError::Violation {
                    recorded: "S".into(),
                    violations: "v".into(),
                },
                ttrpc::Code::FAILED_PRECONDITION,
            ),
            (
                ShimError::Unsupported("exec".into()),
                ttrpc::Code::UNIMPLEMENTED,
            ),
            (ShimError::NotFound("x".into()), ttrpc::Code::NOT_FOUND),
        ] {
            let want = e.code();
            match ttrpc::Error::from(e) {
                ttrpc::Error::RpcStatus(s) => {
                    assert_eq!(s.code(), code);
                    assert!(s.message().contains(want), "{}", s.message());
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
