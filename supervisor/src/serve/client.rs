//! The client side: `supervise run --server SOCKET …` and `supervise
//! health --server SOCKET`. It validates the request as a local run would
//! (a bad flag fails here, before anything is sent), passes its own stdout
//! and stderr to the daemon, forwards SIGTERM/SIGINT/SIGHUP, and exits with
//! the turn's status.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use turnstile_policy::request::TurnRequest;

use super::wire::{
    HealthRequest, LifecycleRequest, PROTOCOL_VERSION, Reply, RunRequest, send_with_fds,
};
use crate::error::{Result, SupervisorError};
use crate::turn::outcome::Outcome;

/// `p` made absolute against this process's working directory.
pub fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).map_err(|e| {
        SupervisorError::invalid(
            "path",
            format!("{}: cannot be made absolute: {e}", p.display()),
        )
    })
}

/// The TurnRequest document of a validated request.
pub fn request_doc(r: &TurnRequest) -> serde_json::Value {
    #[derive(serde::Serialize)]
    struct Doc<'a> {
        command: &'a [String],
        declared_inputs: &'a [String],
        declared_outputs: Vec<crate::store::record::DeclaredWrite>,
        work_order_id: &'a Option<String>,
        idempotency_key: &'a Option<String>,
        timeout_seconds: Option<u64>,
    }
    serde_json::to_value(Doc {
        command: &r.command,
        declared_inputs: &r.declared_inputs,
        declared_outputs: r
            .declared_outputs
            .iter()
            .map(|d| crate::store::record::DeclaredWrite {
                path: d.path.clone(),
                role: d.role.clone(),
            })
            .collect(),
        work_order_id: &r.work_order_id,
        idempotency_key: &r.idempotency_key,
        timeout_seconds: r.timeout_seconds,
    })
    .unwrap_or_default()
}

/// A request line as the daemon reads it: the protocol version, and `op`
/// naming the request.
#[derive(serde::Serialize)]
struct Line<'a> {
    protocol: u32,
    #[serde(flatten)]
    op: Op<'a>,
}

#[derive(serde::Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op<'a> {
    Run(&'a RunRequest),
    Health(&'a HealthRequest),
    Suspend(&'a LifecycleRequest),
    Resume(&'a LifecycleRequest),
}

impl<'a> Line<'a> {
    fn of(op: Op<'a>) -> Self {
        Self {
            protocol: PROTOCOL_VERSION,
            op,
        }
    }
}

/// `supervise run --server SOCKET …` with the request the CLI built
/// (paths absolute: the daemon has its own working directory).
pub fn run(socket: &Path, wire: &RunRequest) -> Result<Outcome> {
    let v = serde_json::to_value(Line::of(Op::Run(wire))).unwrap_or_default();
    // A signal from here on is forwarded to the turn (`wait_reply`), not
    // fatal here. Nothing here is the turn's to kill: the handlers only
    // record it.
    crate::turn::interrupt::record_only().map_err(|source| SupervisorError::StateIo {
        op: "install signal handlers",
        path: PathBuf::new(),
        source,
    })?;
    exchange(socket, &v, true)
}

/// `supervise health --server SOCKET`.
pub fn health(socket: &Path, request: &HealthRequest) -> Result<Outcome> {
    let v = serde_json::to_value(Line::of(Op::Health(request))).unwrap_or_default();
    exchange(socket, &v, false)
}

/// `supervise suspend|resume --server SOCKET` (`freeze`: suspend).
pub fn lifecycle(socket: &Path, request: &LifecycleRequest, freeze: bool) -> Result<Outcome> {
    let op = if freeze {
        Op::Suspend(request)
    } else {
        Op::Resume(request)
    };
    let v = serde_json::to_value(Line::of(op)).unwrap_or_default();
    exchange(socket, &v, false)
}

fn exchange(socket: &Path, v: &serde_json::Value, with_fds: bool) -> Result<Outcome> {
    let unavailable = |source| SupervisorError::ServerUnavailable {
        socket: socket.to_path_buf(),
        source,
    };
    let sock = UnixStream::connect(socket).map_err(unavailable)?;
    let mut line = v.to_string().into_bytes();
    line.push(b'\n');
    let fds = if with_fds {
        vec![std::io::stdout().as_raw_fd(), std::io::stderr().as_raw_fd()]
    } else {
        Vec::new()
    };
    // A daemon that refuses the peer answers and closes at once, maybe
    // before the request is sent: read its answer even when sending failed.
    let sent = send_with_fds(&sock, &line, &fds);
    let reply = match (sent, wait_reply(&sock)) {
        (_, Ok(r)) => r,
        (Err(e), Err(_)) | (Ok(()), Err(e)) => return Err(unavailable(e)),
    };
    let reply: Reply =
        serde_json::from_slice(&reply).map_err(|e| SupervisorError::WorkerFailed {
            detail: format!(
                "the daemon's reply is not valid ({e}); the turn's outcome is in its ledgers"
            ),
        })?;
    if reply.protocol != PROTOCOL_VERSION {
        return Err(SupervisorError::ProtocolMismatch {
            client: u64::from(PROTOCOL_VERSION),
            daemon: reply.protocol,
            daemon_version: if reply.daemon_version.is_empty() {
                "unknown (it predates protocol versions)".into()
            } else {
                reply.daemon_version
            },
        });
    }
    Ok(if reply.printed {
        let _ = std::io::stdout().flush();
        Outcome {
            status: reply.exit_status,
            stdout: String::new(),
            stderr: String::new(),
        }
    } else {
        Outcome {
            status: reply.exit_status,
            stdout: reply.stdout,
            stderr: reply.stderr,
        }
    })
}

/// Waits for the reply line, forwarding each signal this process receives.
fn wait_reply(sock: &UnixStream) -> std::io::Result<Vec<u8>> {
    let mut forwarded = false;
    let mut out = Vec::new();
    loop {
        if !forwarded {
            if let Some(sig) = crate::turn::interrupt::received() {
                (&*sock).write_all(&[sig as i32 as u8])?;
                forwarded = true;
            }
        }
        let mut fds = [PollFd::new(
            std::os::fd::AsFd::as_fd(sock),
            PollFlags::POLLIN,
        )];
        let timeout =
            PollTimeout::try_from(Duration::from_millis(if forwarded { 1000 } else { 20 }))
                .unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let mut b = [0u8; 8192];
        let n = std::io::Read::read(&mut &*sock, &mut b)?;
        if n == 0 {
            if out.is_empty() {
                return Err(std::io::Error::other(
                    "the daemon closed the connection without a reply",
                ));
            }
            return Ok(out);
        }
        out.extend_from_slice(&b[..n]);
        if let Some(end) = out.iter().position(|x| *x == b'\n') {
            out.truncate(end);
            return Ok(out);
        }
    }
}
