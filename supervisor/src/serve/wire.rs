//! The daemon's socket protocol (README "Run turns through a daemon").
//!
//! One request per connection. The client sends one JSON line; with a `run`
//! request it attaches exactly two descriptors with SCM_RIGHTS — its stdout
//! and its stderr — which become the turn's stdout and stderr, so the
//! command's output reaches the client as in a local run. After the line,
//! each further byte the client sends is a signal number (1 SIGHUP, 2
//! SIGINT, 15 SIGTERM) the client received; the daemon delivers it to the
//! turn, which ends as `interrupted` exactly as a local run would. A client
//! that hangs up mid-turn counts as SIGHUP. The daemon answers with one
//! JSON line ([`Reply`]) and closes.

use std::io::{IoSlice, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Result, SupervisorError};

/// Longest request line the daemon reads (a request file is capped lower).
pub const MAX_REQUEST_LINE: usize = 1 << 20;

/// The version of this protocol. A client sends it in every request line
/// (`"protocol": N`) and checks it in every reply; the daemon refuses a
/// request of another version (TS1050) and stamps its own on every reply.
/// A request without it (written by hand) is read as this version. Bump it
/// when a request or reply changes meaning or loses a field.
pub const PROTOCOL_VERSION: u32 = 1;

/// The version of the `supervise` binary, reported by the daemon.
pub const BINARY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A `run` request: `supervise run`'s flags as JSON. Paths are absolute
/// (the client resolves them against its own working directory).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    pub root: PathBuf,
    pub package: String,
    #[serde(default)]
    pub session: Option<String>,
    /// The client's `--state-dir` when it named one; must be the daemon's.
    /// Absent: the daemon's own.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    #[serde(default)]
    pub backend: Option<String>,
    /// The tenant (pod namespace) a new session is owned by, with the
    /// package; a session's turns must come from its owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default)]
    pub config: Option<PathBuf>,
    #[serde(default)]
    pub rootfs: Option<PathBuf>,
    #[serde(default)]
    pub json: bool,
    #[serde(default)]
    pub events: Option<PathBuf>,
    /// `{"seed": N, "clock": "RFC3339"}` for a new deterministic session.
    #[serde(default)]
    pub deterministic: Option<DeterministicWire>,
    /// The TurnRequest document (DESIGN "Formats"), as `--request FILE`.
    pub request: Value,
    /// An ARA `receive` (issue 28): the input envelope; the daemon takes
    /// the command from the package's `entry.receive`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive: Option<ReceiveWire>,
}

/// A receive's input on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiveWire {
    pub envelope: Value,
    #[serde(default)]
    pub hop: u32,
    /// The router's retry of a delivery whose earlier turns were cut by a
    /// crash (see `turn::receive::request`).
    #[serde(default)]
    pub attempt: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeterministicWire {
    pub seed: u64,
    pub clock: String,
}

/// What the daemon is asked.
#[derive(Debug, Clone)]
pub enum Request {
    Run(Box<RunRequest>),
    Health(HealthRequest),
    /// `suspend` / `resume` of a session (issue 28): freeze or thaw its
    /// running turn and its warm sandbox.
    Suspend(LifecycleRequest),
    Resume(LifecycleRequest),
}

/// A `suspend` or `resume` request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifecycleRequest {
    /// The workspace root (absolute) the session belongs to.
    pub root: PathBuf,
    pub session: String,
    /// The tenant the client acts for (`--tenant`): a session another
    /// owner holds is refused (TS1041). None: the host's operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default)]
    pub json: bool,
    /// The client's `--state-dir` when it named one; must be the daemon's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
}

/// A `health` request.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthRequest {
    #[serde(default)]
    pub json: bool,
    /// The client's `--state-dir` when it named one; must be the daemon's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
}

impl Request {
    /// Parses one request line; a bad one is an error naming the field.
    pub fn parse(line: &[u8]) -> Result<Self> {
        // Strictly: a duplicate key is an error, not "the last one wins"
        // (`"tenant":"b","tenant":"a"` ran as tenant a: red-team, stop 54).
        let mut v: Value = turnstile_policy::canonical::parse_strict(line)
            .map_err(|e| SupervisorError::invalid("request", format!("not strict JSON: {e}")))?;
        let Some(obj) = v.as_object_mut() else {
            return Err(SupervisorError::invalid("request", "must be a JSON object"));
        };
        let op = obj.remove("op").ok_or_else(|| {
            SupervisorError::invalid("op", "missing (`run`, `health`, `suspend` or `resume`)")
        })?;
        if let Some(p) = obj.remove("protocol") {
            let Some(client) = p.as_u64() else {
                return Err(SupervisorError::invalid(
                    "protocol",
                    format!("{p}: expected the wire protocol version, an integer"),
                ));
            };
            if client != u64::from(PROTOCOL_VERSION) {
                return Err(SupervisorError::ProtocolMismatch {
                    client,
                    daemon: PROTOCOL_VERSION,
                    daemon_version: BINARY_VERSION.into(),
                });
            }
        }
        let rest = v;
        match op.as_str() {
            Some("run") => {
                let r: RunRequest = serde_path_to_error::deserialize(rest)
                    .map_err(|e| SupervisorError::invalid(&field_of(&e), e.inner().to_string()))?;
                Ok(Self::Run(Box::new(r)))
            }
            Some("health") => {
                let h: HealthRequest = serde_path_to_error::deserialize(rest)
                    .map_err(|e| SupervisorError::invalid(&field_of(&e), e.inner().to_string()))?;
                Ok(Self::Health(h))
            }
            Some(op @ ("suspend" | "resume")) => {
                let l: LifecycleRequest = serde_path_to_error::deserialize(rest)
                    .map_err(|e| SupervisorError::invalid(&field_of(&e), e.inner().to_string()))?;
                Ok(if op == "suspend" {
                    Self::Suspend(l)
                } else {
                    Self::Resume(l)
                })
            }
            _ => Err(SupervisorError::invalid(
                "op",
                format!("{op}: expected `run`, `health`, `suspend` or `resume`"),
            )),
        }
    }
}

fn field_of(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let p = e.path().to_string();
    if p == "." {
        // serde names an unknown or missing field in the message only.
        let m = e.inner().to_string();
        if let Some(f) = m.split('`').nth(1) {
            return f.to_owned();
        }
        return "request".into();
    }
    p
}

/// The daemon's answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reply {
    pub exit_status: u8,
    /// True when the turn's worker already wrote `stdout`/`stderr` to the
    /// client's descriptors (the client prints nothing more).
    #[serde(default)]
    pub printed: bool,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    /// The turn's `--json` value (or `{"error": …}`).
    #[serde(default)]
    pub value: Value,
    /// The package's trust level (for the daemon's metrics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_level: Option<String>,
    /// Worker to daemon only: the worker stays for the session's next turn
    /// (with its warm sandbox).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stays: bool,
    /// The daemon's wire protocol version ([`PROTOCOL_VERSION`]); absent
    /// (0) from a daemon older than versioning.
    #[serde(default)]
    pub protocol: u32,
    /// The daemon's `supervise` version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub daemon_version: String,
    /// The daemon's state directory (the one its turns use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
}

/// Sends `line` with `fds` attached (SCM_RIGHTS) in one message.
pub fn send_with_fds(sock: &UnixStream, line: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let iov = [IoSlice::new(line)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
        .map_err(std::io::Error::from)?;
    if sent < line.len() {
        use std::io::Write;
        (&*sock).write_all(&line[sent..])?;
    }
    Ok(())
}

/// What [`recv_line_with_fds`] read: the request line, bytes after it
/// (signal numbers), and the descriptors attached.
pub type Received = (Vec<u8>, Vec<u8>, Vec<OwnedFd>);

/// Reads the request line (up to '\n') and every descriptor attached to it.
pub fn recv_line_with_fds(sock: &UnixStream) -> std::io::Result<Received> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    loop {
        let (bytes, got) = recv_some_with_fds(sock)?;
        fds.extend(got);
        if bytes.is_empty() {
            return Ok((line, Vec::new(), fds));
        }
        line.extend_from_slice(&bytes);
        if let Some(end) = line.iter().position(|b| *b == b'\n') {
            let rest = line.split_off(end + 1);
            line.truncate(end);
            return Ok((line, rest, fds));
        }
        if line.len() > MAX_REQUEST_LINE {
            return Err(std::io::Error::other(format!(
                "request line longer than {MAX_REQUEST_LINE} bytes"
            )));
        }
    }
}

/// Descriptors one message may bring before the kernel truncates its
/// control data: more than the 2 a request carries, so a request with a
/// few too many is answered with how many it had.
const FD_ROOM: usize = 16;

/// One `recvmsg` of `sock`: the bytes it read (none at EOF) and the
/// descriptors that came with them (`SCM_RIGHTS`, close-on-exec). A
/// message with more than [`FD_ROOM`] descriptors is an `InvalidInput`
/// error — and those the kernel installed before truncating its control
/// data are closed, never leaked.
pub fn recv_some_with_fds(sock: &UnixStream) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    use nix::libc;
    let mut buf = [0u8; 8192];
    let room = (FD_ROOM * std::mem::size_of::<RawFd>()) as u32;
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    let mut control = vec![0u8; unsafe { libc::CMSG_SPACE(room) } as usize];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; zeroed is its empty value.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = control.as_mut_ptr().cast();
    hdr.msg_controllen = control.len() as _;
    let n = loop {
        // SAFETY: `hdr` points at `iov` (into `buf`) and `control`, both
        // alive and as long as it says.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut hdr, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* macros walk the control data the kernel wrote
    // within `hdr.msg_controllen`; each SCM_RIGHTS entry holds descriptors
    // the kernel just installed in this process, owned by nothing else.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let header = data as usize - c as usize;
                let count =
                    ((*c).cmsg_len as usize).saturating_sub(header) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&hdr, c);
        }
    }
    if hdr.msg_flags & libc::MSG_CTRUNC != 0 {
        drop(fds);
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "more than {FD_ROOM} descriptors came with the request (SCM_RIGHTS); a run request carries exactly 2 (stdout, stderr)"
            ),
        ));
    }
    Ok((buf[..n].to_vec(), fds))
}

/// Reads one line (without its '\n') up to `max` bytes, or to EOF.
pub fn read_line(r: &mut impl Read, max: usize) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        let n = r.read(&mut b)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&b[..n]);
        if let Some(end) = out.iter().position(|x| *x == b'\n') {
            out.truncate(end);
            return Ok(out);
        }
        if out.len() > max {
            return Err(std::io::Error::other("line too long"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Red-team, stop 54: a request line with a key twice ran with the
    /// last one (`"tenant":"b","tenant":"a"` as tenant a, `"op"` twice as
    /// the second op). Refused, naming the request.
    #[test]
    fn a_request_line_with_a_duplicate_key_is_refused() {
        for line in [
            r#"{"op":"health","op":"run"}"#,
            r#"{"op":"run","protocol":1,"run":{"tenant":"b","tenant":"a"}}"#,
        ] {
            let err = Request::parse(line.as_bytes()).unwrap_err();
            assert!(err.to_string().contains("duplicate key"), "{line}: {err}");
            assert_eq!(err.field(), Some("request"), "{line}");
        }
    }
}
