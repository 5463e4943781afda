//! What a command prints and exits with ([`Outcome`]), errors rendered the
//! one way every command renders them, and one turn as `supervise run`
//! performs and reports it — shared by the CLI and the daemon's workers,
//! which sit above it (neither imports the other for this).

use std::path::PathBuf;

use serde_json::{Value, json};
use turnstile_policy::request::TurnRequest;

use crate::error::{Result, SupervisorError, exit};

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

/// The error as a JSON object: code, name, message (with causes), field, and
/// for integrity errors the ledger, line and seq.
pub fn error_value(e: &SupervisorError) -> Value {
    let code = e.code();
    let mut err = json!({"code": code.code, "name": code.name, "message": error_chain(e)});
    if let Some(m) = err.as_object_mut() {
        if let Some(f) = e.field() {
            m.insert("field".into(), json!(f));
        }
        if let SupervisorError::Integrity(i) = e {
            m.insert("ledger".into(), json!(i.ledger));
            m.insert("line".into(), json!(i.line));
            m.insert("seq".into(), json!(i.seq));
        }
    }
    err
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
        format!(
            "{}\n",
            json!({"error": error_value(e), "exit_code": e.exit_status()})
        )
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
        Err(e) => (
            error_outcome(&e, opts.json),
            json!({"error": error_value(&e), "exit_code": e.exit_status()}),
        ),
    }
}

fn run_turn_inner(
    opts: &crate::turn::RunOptions,
    events: Option<&std::path::Path>,
) -> Result<(Outcome, Value)> {
    // From here on SIGTERM/SIGINT/SIGHUP interrupt the turn (recorded as
    // `interrupted`, exit 128+signal) instead of killing supervise outright.
    crate::interrupt::install().map_err(|source| SupervisorError::StateIo {
        op: "install signal handlers",
        path: PathBuf::new(),
        source,
    })?;
    let r = crate::turn::run_turn(opts)?;
    if let Some(path) = events {
        emit_events(path, &opts.package, &opts.request, &r.value)?;
    }
    Ok((
        Outcome {
            status: r.exit_status,
            stdout: if opts.json {
                format!("{}\n", r.value)
            } else {
                String::new()
            },
            stderr: format!("supervise: {}\n", r.summary),
        },
        r.value,
    ))
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
    let sid = v["session_id"].as_str().unwrap_or_default();
    let turn = v["turn_number"].as_u64().unwrap_or(0);
    let key = request
        .idempotency_key
        .clone()
        .unwrap_or_else(|| format!("{sid}/turn-{turn}"));
    let finished = v["finished_at"].as_str().unwrap_or_default().to_owned();
    let started = v["started_at"].as_str().unwrap_or(&finished).to_owned();
    let mut events: Vec<(&str, String, Value)> = vec![
        (
            "turn.requested",
            started.clone(),
            json!({
                "command": request.command,
                "declared_inputs": request.declared_inputs,
                "declared_outputs": request.declared_outputs.iter().map(|d| d.to_value()).collect::<Vec<_>>(),
                "work_order_id": request.work_order_id,
                "idempotency_key": request.idempotency_key,
                "timeout_seconds": request.timeout_seconds,
            }),
        ),
        (
            "turn.started",
            started,
            json!({"session_id": sid, "turn_number": turn}),
        ),
    ];
    for x in v["violations"].as_array().into_iter().flatten() {
        events.push(("turn.violation", finished.clone(), x.clone()));
    }
    // Durations are measurements (floating point), not part of the event.
    let mut result = v.clone();
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
