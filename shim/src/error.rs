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
    /// The backend cannot run the turn (`supervise` exit 20): not
    /// installed (E2040), cannot enforce a required layer (TS1025), weaker
    /// than the package's trust level allows (TS1040), or the sandbox could
    /// not be built (E2041). Never retried with another backend.
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
    /// `io.turnstile.workspace` is not a workspace name (a path, `..`,
    /// empty…): it names an entry of the shim's `workspaces`, never a path.
    #[error(
        "annotation `io.turnstile.workspace` `{value}` {reason}: it names one of the shim's `workspaces`, never a host path"
    )]
    WorkspaceName { value: String, reason: String },
    /// The workspace name is not in the shim's `workspaces` (the known
    /// names are not listed: a pod must not learn other tenants').
    #[error(
        "annotation `io.turnstile.workspace`: no workspace `{name}` in the shim's `workspaces`"
    )]
    WorkspaceUnknown { name: String },
    /// The workspace is not for the container's namespace.
    #[error(
        "annotation `io.turnstile.workspace`: workspace `{name}` is not for namespace `{namespace}` (its `namespaces` list)"
    )]
    WorkspaceNamespace { name: String, namespace: String },
    /// The configured root cannot be a workspace (a symlink, missing, not
    /// a directory): the shim's configuration is at fault.
    #[error("annotation `io.turnstile.workspace`: workspace `{name}`: `workspaces.{name}.root` `{}` {reason}", root.display())]
    WorkspaceRoot {
        name: String,
        root: PathBuf,
        reason: String,
    },
    /// An `io.turnstile.*` annotation the contract does not know.
    #[error("annotation `{key}` is not part of the contract (known: {known})")]
    UnknownAnnotation { key: String, known: String },
    /// A malformed field of the shim's options (`workspaces…`), named.
    #[error("shim options {}: `{field}` {reason}", path.display())]
    OptionsField {
        path: PathBuf,
        field: String,
        reason: String,
    },
    /// `linux.cgroupsPath` cannot be the container's cgroup, or it cannot
    /// be made (nothing of it is left).
    #[error("config.json `linux.cgroupsPath` `{path}`: {reason}; nothing was created")]
    PodCgroup { path: String, reason: String },
    /// The namespace a workspace is checked against cannot be told.
    #[error("namespace: {0}")]
    Namespace(String),
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
            Self::Unavailable(m) => unavailable_code(m),
            Self::State(_) => "TS1205",
            Self::Unsupported(_) => "TS1206",
            Self::NotFound(_) => "TS1207",
            Self::Io { .. } => "TS1208",
            Self::Sandbox { .. } => "TS1209",
            Self::WorkspaceName { .. } => "TS1043",
            Self::WorkspaceUnknown { .. } => "TS1044",
            Self::WorkspaceNamespace { .. } => "TS1045",
            Self::WorkspaceRoot { .. } => "TS1046",
            Self::UnknownAnnotation { .. } => "TS1047",
            Self::OptionsField { .. } => "TS1048",
            Self::Namespace(_) => "TS1049",
            Self::PodCgroup { .. } => "TS1042",
        }
    }

    fn ttrpc_code(&self) -> ttrpc::Code {
        match self {
            Self::Annotation { .. }
            | Self::Spec { .. }
            | Self::Refused(_)
            | Self::WorkspaceName { .. }
            | Self::WorkspaceUnknown { .. }
            | Self::UnknownAnnotation { .. }
            | Self::PodCgroup { .. }
            | Self::Namespace(_) => ttrpc::Code::INVALID_ARGUMENT,
            Self::WorkspaceNamespace { .. } => ttrpc::Code::PERMISSION_DENIED,
            Self::Options { .. }
            | Self::OptionsField { .. }
            | Self::WorkspaceRoot { .. }
            | Self::Violation { .. }
            | Self::State(_) => ttrpc::Code::FAILED_PRECONDITION,
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

/// The code of a `supervise` exit-20 refusal, as its message names it
/// (E2040 when it names none).
fn unavailable_code(message: &str) -> &'static str {
    ["TS1040", "TS1025", "E2041", "E2040"]
        .into_iter()
        .find(|c| message.contains(c))
        .unwrap_or("E2040")
}

/// The most of an error message containerd (and the pod's events) get:
/// a value the pod chose is echoed, but never a 100 kB one.
const MESSAGE_MAX: usize = 2048;

/// `message` cut at [`MESSAGE_MAX`] bytes (on a character boundary),
/// saying how much was left out.
fn bounded(mut message: String) -> String {
    if message.len() <= MESSAGE_MAX {
        return message;
    }
    let mut cut = MESSAGE_MAX;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let left = message.len() - cut;
    message.truncate(cut);
    message + &format!("… ({left} more bytes)")
}

impl From<ShimError> for ttrpc::Error {
    fn from(e: ShimError) -> Self {
        let mut message = format!("turnstile: {} {e}", e.code());
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message += &format!(": {s}");
            source = s.source();
        }
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.ttrpc_code(), bounded(message)))
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
            (
                ShimError::WorkspaceNamespace {
                    name: "a".into(),
                    namespace: "b".into(),
                },
                ttrpc::Code::PERMISSION_DENIED,
            ),
            (
                ShimError::UnknownAnnotation {
                    key: "io.turnstile.foo".into(),
                    known: String::new(),
                },
                ttrpc::Code::INVALID_ARGUMENT,
            ),
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

    #[test]
    fn a_message_to_containerd_is_bounded() {
        let long = "é".repeat(60_000);
        match ttrpc::Error::from(ShimError::Refused(format!("TS1004 session `{long}`"))) {
            ttrpc::Error::RpcStatus(s) => {
                assert!(
                    s.message().len() <= MESSAGE_MAX + 40,
                    "{}",
                    s.message().len()
                );
                assert!(s.message().contains("TS1004"));
                assert!(
                    s.message().ends_with("more bytes)"),
                    "{}",
                    &s.message()[2000..]
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(bounded("short".into()), "short");
    }
}
