//! A turn worker: `supervise __serve-worker`, started by the daemon for
//! each turn, with the client's stdout and stderr as its own and a socket
//! to the daemon as stdin.
//!
//! Why a re-executed process per turn rather than a thread of the daemon:
//! a turn relies on process-global state — the SIGTERM/SIGINT/SIGHUP
//! handlers and the single "running turn" slot of [`crate::interrupt`],
//! the child-subreaper flag the OCI backends set, and the output pumps that
//! copy the command's output into *this process's* stdout/stderr. Two turns
//! in one process would interrupt each other and mix their output. A fresh
//! process also gives the daemon's turn exactly the code path, evidence and
//! exit statuses of `supervise run`. It costs one exec (~1 ms).

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::wire::{Reply, RunRequest, read_line};
use crate::error::{Result, SupervisorError};
use crate::turn::RunOptions;

/// argv[1] of a turn worker.
pub const SERVE_WORKER: &str = "__serve-worker";

/// Runs the worker; returns its process exit status (0: a reply was sent).
pub fn main() -> u8 {
    // SAFETY: fd 0 is the socket the daemon passed as stdin; this process
    // owns it and nothing else in the process uses it.
    let stdin = unsafe { OwnedFd::from_raw_fd(0) };
    let mut sock = UnixStream::from(stdin);
    let line = match read_line(&mut sock, super::wire::MAX_REQUEST_LINE) {
        Ok(l) => l,
        Err(_) => return 1,
    };
    let mut trust_level = None;
    let (outcome, value) = match options(&line) {
        Ok((opts, events)) => {
            let r = crate::cli::run_turn_outcome(&opts, events.as_deref());
            trust_level = turnstile_policy::PackageId::parse(&opts.package)
                .ok()
                .and_then(|p| turnstile_policy::Manifest::load(&opts.root, &p).ok())
                .map(|m| m.trust_level.as_str().to_owned());
            r
        }
        Err(e) => (
            crate::cli::error_outcome(&e, false),
            serde_json::json!({"error": crate::cli::error_value(&e), "exit_code": e.exit_status()}),
        ),
    };
    let _ = std::io::stdout().write_all(outcome.stdout.as_bytes());
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().write_all(outcome.stderr.as_bytes());
    let reply = Reply {
        exit_status: outcome.status,
        printed: true,
        stdout: String::new(),
        stderr: outcome.stderr,
        value,
        trust_level,
    };
    let mut text = serde_json::to_vec(&reply).unwrap_or_default();
    text.push(b'\n');
    match sock.write_all(&text) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// The worker's RunOptions from a request the daemon already validated.
fn options(line: &[u8]) -> Result<(RunOptions, Option<std::path::PathBuf>)> {
    let r: RunRequest = serde_json::from_slice(line)
        .map_err(|e| SupervisorError::invalid("request", e.to_string()))?;
    to_options(&r)
}

/// `supervise run`'s options for a daemon request (the state directory is
/// the daemon's; the daemon checked that the client named the same).
pub fn to_options(r: &RunRequest) -> Result<(RunOptions, Option<std::path::PathBuf>)> {
    let request = turnstile_policy::request::TurnRequest::from_json(
        &serde_json::to_vec(&r.request).unwrap_or_default(),
    )?;
    let deterministic = match &r.deterministic {
        None => None,
        Some(d) => {
            let clock = time::OffsetDateTime::parse(
                &d.clock,
                &time::format_description::well_known::Rfc3339,
            )
            .map_err(|e| {
                SupervisorError::invalid(
                    "deterministic.clock",
                    format!("not an RFC 3339 time: {e}"),
                )
            })?;
            if r.session.is_some() {
                return Err(SupervisorError::invalid(
                    "deterministic",
                    "deterministic mode is a property of the session: only a run that starts a session may set it",
                ));
            }
            Some(crate::ids::Deterministic {
                seed: d.seed,
                clock,
            })
        }
    };
    let state_dir = r
        .state_dir
        .clone()
        .ok_or_else(|| SupervisorError::invalid("state_dir", "missing"))?;
    Ok((
        RunOptions {
            root: r.root.clone(),
            state_dir,
            package: r.package.clone(),
            session: r.session.clone(),
            request,
            json: r.json,
            cgroup_root: crate::cli::cgroup_root(),
            sources: crate::ids::Sources::system(),
            backend: r.backend.clone(),
            config: r
                .config
                .clone()
                .unwrap_or_else(|| crate::backend::select::DEFAULT_CONFIG.into()),
            deterministic,
            rootfs: r.rootfs.clone(),
        },
        r.events.clone(),
    ))
}
