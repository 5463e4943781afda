//! What a command prints and exits with ([`Outcome`]), errors rendered the
//! one way every command renders them, and one turn as `supervise run`
//! performs and reports it — shared by the CLI and the daemon's workers,
//! which sit above it (neither imports the other for this).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use turnstile_policy::request::TurnRequest;

use crate::error::{Result, SupervisorError, exit};
use crate::store::record::{DeclaredWrite, TurnReport};

/// What a subcommand produced.
#[derive(Debug)]
pub struct Outcome {
    pub status: u8,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// Success with `stdout`.
    pub fn ok(stdout: String) -> Self {
        Self {
            status: exit::OK,
            stdout,
            stderr: String::new(),
        }
    }
}

/// An error as `--json` prints it: code, name, message (with causes),
/// field, and for integrity errors the ledger, line and seq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorObject {
    pub code: String,
    pub name: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub integrity: Option<IntegrityAt>,
}

/// Where an integrity error was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntegrityAt {
    pub ledger: PathBuf,
    pub line: Option<u64>,
    pub seq: Option<u64>,
}

/// The one JSON object of a failed command: the error and the exit status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: ErrorObject,
    pub exit_code: u8,
}

impl ErrorReply {
    pub fn of(e: &SupervisorError) -> Self {
        Self {
            error: error_object(e),
            exit_code: e.exit_status(),
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// The error as its JSON object.
pub fn error_object(e: &SupervisorError) -> ErrorObject {
    let code = e.code();
    ErrorObject {
        code: code.code.to_owned(),
        name: code.name.to_owned(),
        message: error_chain(e),
        field: e.field().map(str::to_owned),
        integrity: match e {
            SupervisorError::Integrity(i) => Some(IntegrityAt {
                ledger: i.ledger.clone(),
                line: i.line,
                seq: i.seq,
            }),
            _ => None,
        },
    }
}

/// The error as a JSON object ([`ErrorObject`]).
pub fn error_value(e: &SupervisorError) -> Value {
    serde_json::to_value(error_object(e)).unwrap_or_default()
}

fn error_chain(e: &SupervisorError) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(&format!(": {s}"));
        source = s.source();
    }
    message
}

/// Renders an error: code and message with its causes on stderr; with
/// `--json` also one object on stdout.
pub fn error_outcome(e: &SupervisorError, json: bool) -> Outcome {
    let code = e.code();
    let stdout = if json {
        format!("{}\n", ErrorReply::of(e).to_value())
    } else {
        String::new()
    };
    Outcome {
        status: e.exit_status(),
        stdout,
        stderr: format!(
            "supervise: error[{} {}]: {}\n",
            code.code,
            code.name,
            error_chain(e)
        ),
    }
}

/// One turn as `supervise run` performs and reports it: the [`Outcome`]
/// (what to print, the exit status) and the turn's `--json` value (or the
/// error object). Shared by `run` and the daemon's workers, so both print
/// and exit alike.
pub fn run_turn_outcome(
    opts: &crate::turn::RunOptions,
    events: Option<&std::path::Path>,
) -> (Outcome, Value) {
    match run_turn_inner(opts, events) {
        Ok((outcome, value)) => (outcome, value),
        Err(e) => (error_outcome(&e, opts.json), ErrorReply::of(&e).to_value()),
    }
}

fn run_turn_inner(
    opts: &crate::turn::RunOptions,
    events: Option<&std::path::Path>,
) -> Result<(Outcome, Value)> {
    // From here on SIGTERM/SIGINT/SIGHUP interrupt the turn (recorded as
    // `interrupted`, exit 128+signal) instead of killing supervise outright.
    let _watching = crate::turn::interrupt::install(&opts.interrupts).map_err(|source| {
        SupervisorError::StateIo {
            op: "install signal handlers",
            path: PathBuf::new(),
            source,
        }
    })?;
    // Checked before the turn, not found bad after it committed (a client
    // retrying that error would run the turn twice: red-team M2).
    if let Some(path) = events {
        check_events_path(path)?;
    }
    let r = crate::turn::run_turn(opts)?;
    if let Some(path) = events {
        emit_events(path, &opts.package, &opts.request, &r.value)?;
    }
    Ok((rendered(&r, opts.json), r.value))
}

/// What `supervise run` prints for a finished turn.
pub fn rendered(r: &crate::turn::TurnResult, json: bool) -> Outcome {
    Outcome {
        status: r.exit_status,
        stdout: if json {
            format!("{}\n", r.value)
        } else {
            String::new()
        },
        stderr: format!("supervise: {}\n", r.summary),
    }
}

/// Whether the turn's events can be appended to `path`: an existing
/// regular file (not through a symlink) open for appending, or a new name
/// in an existing directory; nothing is created here. An error names
/// `--events` (exit 2), before anything of the turn exists.
fn check_events_path(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let bad =
        |why: String| SupervisorError::invalid("--events", format!("{}: {why}", path.display()));
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(bad("is a symbolic link".into())),
        Ok(m) if !m.is_file() => Err(bad("is not a regular file".into())),
        Ok(_) => std::fs::OpenOptions::new()
            .append(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
            .open(path)
            .map(drop)
            .map_err(|e| bad(format!("cannot be opened for appending: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK)
                    .map_err(|e| bad(format!("its directory is not writable: {e}"))),
                Ok(_) => Err(bad("its parent is not a directory".into())),
                Err(e) => Err(bad(format!("its directory: {e}"))),
            }
        }
        Err(e) => Err(bad(e.to_string())),
    }
}

/// The turn's events as EventEnvelope v1 lines, appended to `path`
/// (created 0600; never through a symlink).
fn emit_events(
    path: &std::path::Path,
    package: &str,
    request: &TurnRequest,
    v: &Value,
) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use turnstile_policy::envelope::{EventEnvelope, SCHEMA_VERSION, Source};
    #[derive(Serialize)]
    struct Requested<'a> {
        command: &'a [String],
        declared_inputs: &'a [String],
        declared_outputs: Vec<DeclaredWrite>,
        work_order_id: &'a Option<String>,
        idempotency_key: &'a Option<String>,
        timeout_seconds: Option<u64>,
    }
    #[derive(Serialize)]
    struct Started<'a> {
        session_id: &'a str,
        turn_number: u64,
    }
    let report: TurnReport = serde_json::from_value(v.clone())
        .map_err(|e| SupervisorError::invalid("--events", format!("the turn's report: {e}")))?;
    let (sid, turn) = (report.session_id.as_str(), report.turn_number);
    let key = request
        .idempotency_key
        .clone()
        .unwrap_or_else(|| format!("{sid}/turn-{turn}"));
    let finished = report.finished_at.clone().unwrap_or_default();
    let started = report
        .started_at
        .clone()
        .unwrap_or_else(|| finished.clone());
    fn payload<T: Serialize>(x: &T) -> Value {
        serde_json::to_value(x).unwrap_or_default()
    }
    let mut events: Vec<(&str, String, Value)> = vec![
        (
            "turn.requested",
            started.clone(),
            payload(&Requested {
                command: &request.command,
                declared_inputs: &request.declared_inputs,
                declared_outputs: request
                    .declared_outputs
                    .iter()
                    .map(|d| DeclaredWrite {
                        path: d.path.clone(),
                        role: d.role.clone(),
                    })
                    .collect(),
                work_order_id: &request.work_order_id,
                idempotency_key: &request.idempotency_key,
                timeout_seconds: request.timeout_seconds,
            }),
        ),
        (
            "turn.started",
            started,
            payload(&Started {
                session_id: sid,
                turn_number: turn,
            }),
        ),
    ];
    for x in &report.violations {
        events.push(("turn.violation", finished.clone(), payload(x)));
    }
    // Durations are measurements (floating point), not part of the event.
    let mut result = payload(&report);
    if let Some(m) = result.as_object_mut() {
        m.remove("durations");
    }
    events.push(("turn.finished", finished, result));
    let mut out = Vec::new();
    for (n, (kind, ts, payload)) in events.into_iter().enumerate() {
        let e = EventEnvelope {
            id: format!("EVT-{sid}-{turn}-{n}"),
            ts,
            kind: kind.into(),
            schema_version: SCHEMA_VERSION.into(),
            idempotency_key: key.clone(),
            source: Source {
                agent: package.into(),
                adapter: "supervise-cli".into(),
            },
            payload,
        };
        out.extend(e.to_canonical()?);
        out.push(b'\n');
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .and_then(|mut f| f.write_all(&out))
        .map_err(|source| SupervisorError::StateIo {
            op: "write events",
            path: path.to_path_buf(),
            source,
        })
}
