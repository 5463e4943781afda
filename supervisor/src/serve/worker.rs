//! A turn worker: `supervise __serve-worker`, started by the daemon, with
//! a socket to the daemon as stdin. Each turn comes as one [`Job`] line
//! with the client's stdout and stderr attached (SCM_RIGHTS); the worker
//! makes them its own for the turn, runs it, gives them back (stdout
//! /dev/null, stderr the daemon's log) and answers with one [`Reply`] line.
//! With `keep_warm` it then stays for the session's next turn, with that
//! turn's sandbox built and parked ([`crate::sandbox::pool`]), until the
//! daemon closes the socket.
//!
//! Why a re-executed process rather than a thread of the daemon: a turn
//! relies on process-global state — the SIGTERM/SIGINT/SIGHUP handlers and
//! the single "running turn" slot of [`crate::turn::interrupt`], the
//! child-subreaper flag the OCI backends set, and the output pumps that
//! copy the command's output into *this process's* stdout/stderr. Two turns
//! in one process at once would interrupt each other and mix their output;
//! one after another (a session's turns are serialized anyway) they do not.
//! A worker process also gives the daemon's turn exactly the code path,
//! evidence and exit statuses of `supervise run`.

use std::io::Write;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::wire::{MAX_REQUEST_LINE, Reply, RunRequest, recv_some_with_fds};
use crate::error::{Result, SupervisorError};
use crate::turn::RunOptions;

/// argv[1] of a turn worker.
pub const SERVE_WORKER: &str = "__serve-worker";

/// One turn for a worker (daemon to worker).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Stay afterwards for the session's next turn, with its sandbox warm.
    pub keep_warm: bool,
    pub run: RunRequest,
}

/// The line the daemon sends a waiting worker once the client has the
/// reply to its turn: the worker builds the session's next warm sandbox
/// now, not while the reply is on its way (the daemon's relay and the
/// client's exit would share the two cores with the build).
pub const DELIVERED: &[u8] = b"delivered";

/// The daemon's lines to this worker, in order. Two lines can arrive in
/// one read (a `delivered` and the next job): what follows a line is kept
/// for the next. A job's descriptors come with its bytes; `delivered`
/// carries none, so descriptors read with it wait for the job after it.
struct Inbox {
    sock: UnixStream,
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Inbox {
    /// The next line (without its '\n') and its descriptors; `None` at EOF.
    fn next(&mut self) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                line.pop();
                let fds = if line == DELIVERED {
                    Vec::new()
                } else {
                    std::mem::take(&mut self.fds)
                };
                return Ok(Some((line, fds)));
            }
            if self.buf.len() > MAX_REQUEST_LINE {
                return Err(std::io::Error::other(format!(
                    "a line longer than {MAX_REQUEST_LINE} bytes"
                )));
            }
            let (bytes, fds) = recv_some_with_fds(&self.sock)?;
            if bytes.is_empty() {
                return Ok(None);
            }
            self.buf.extend_from_slice(&bytes);
            self.fds.extend(fds);
        }
    }
}

/// Runs the worker; returns its process exit status.
pub fn main() -> u8 {
    // SAFETY: fd 0 is the socket the daemon passed as stdin; this process
    // owns it and nothing else in the process uses it.
    let stdin = unsafe { OwnedFd::from_raw_fd(0) };
    let sock = UnixStream::from(stdin);
    // The descriptors 1 and 2 go back to between turns.
    let (Ok(home_out), Ok(home_err)) = (
        std::io::stdout().as_fd().try_clone_to_owned(),
        std::io::stderr().as_fd().try_clone_to_owned(),
    ) else {
        return 1;
    };
    let mut status = 0;
    // The worker's warm pool, started by the first job that keeps it.
    let mut pool: Option<std::sync::Arc<crate::sandbox::pool::WarmPool>> = None;
    // Its session recovered between turns, off their path.
    let between = std::sync::Arc::new(crate::recover::Between::default());
    let Ok(inbox_sock) = sock.try_clone() else {
        return 1;
    };
    let mut inbox = Inbox {
        sock: inbox_sock,
        buf: Vec::new(),
        fds: Vec::new(),
    };
    // The last turn's directory removal and the session's recovery, due
    // before the next turn begins (see `between_turns`).
    let mut between_due = false;
    loop {
        let (line, fds) = match inbox.next() {
            Ok(Some(x)) if !x.0.is_empty() => x,
            // EOF: the daemon let this worker go — or it died, and its
            // sockets closed before its death signal (PDEATHSIG) reached
            // us. Wait for that signal before cleaning up: killed in the
            // middle of the warm sandbox's v1 kill (freeze, signal, thaw),
            // this worker would leave it frozen, holding the turn's
            // namespaces; killed before, the sandbox dies with it.
            _ => {
                std::thread::sleep(std::time::Duration::from_millis(200));
                break;
            }
        };
        if line == DELIVERED {
            // The last turn's client has its reply: its warm sandbox now,
            // built beside the last turn's cleanup and the session's
            // recovery (a session's next turn arriving at once waits for
            // the build, not for those first).
            if let Some(p) = &pool {
                p.build_armed();
            }
            if std::mem::take(&mut between_due) {
                between_turns(pool.as_deref(), &between);
            }
            continue;
        }
        // A job before the daemon said DELIVERED (the next turn came first).
        if std::mem::take(&mut between_due) {
            between_turns(pool.as_deref(), &between);
        }
        let job: std::result::Result<Job, _> = serde_json::from_slice(&line);
        let mut keep = job.as_ref().is_ok_and(|j| j.keep_warm);
        if keep && pool.is_none() {
            match crate::sandbox::pool::WarmPool::start() {
                Ok(p) => pool = Some(std::sync::Arc::new(p)),
                Err(e) => {
                    // The turn still runs, cold, and this worker does not
                    // stay.
                    tracing::warn!(error = %e, "no warm pool in this worker");
                    keep = false;
                }
            }
        }
        // The client's descriptors are this turn's stdout and stderr.
        if let [out, err] = fds.as_slice() {
            if nix::unistd::dup2_stdout(out).is_err() || nix::unistd::dup2_stderr(err).is_err() {
                status = 1;
                break;
            }
        }
        drop(fds);
        crate::turn::interrupt::reset();
        let Ok(replier) = Replier::new(&sock, (&home_out, &home_err), keep) else {
            status = 1;
            break;
        };
        let replier = std::sync::Arc::new(replier);
        turn(job, pool.as_ref().filter(|_| keep), &between, &replier);
        let (sent, homed) = replier.sent().unwrap_or((false, false));
        if !homed {
            status = 1;
            break;
        }
        if !sent || !keep {
            break;
        }
        between_due = true;
    }
    if let Some(p) = &pool {
        p.drain();
    }
    status
}

/// What runs between a worker's turns, before the next one begins: the
/// last turn's directory goes, then the session is recovered (which the
/// next turn then need not do). A warm sandbox the pool builds meanwhile
/// is no leftover: its lock, held by this live worker, is linked into
/// place before its directory and its cgroup exist, and recovery passes
/// over a held one.
fn between_turns(pool: Option<&crate::sandbox::pool::WarmPool>, between: &crate::recover::Between) {
    if let Some(p) = pool {
        p.settle();
    }
    between.recover();
}

/// Answers a job once: the turn's output to the client's descriptors,
/// then this worker's own descriptors back (never hold the client's while
/// waiting: a reader of them waits for every writer to close), then the
/// reply line to the daemon. From the turn as soon as it is durable
/// ([`crate::turn::OnDurable`]: the client has its answer while the
/// ledgers' anchors move), or after the turn.
struct Replier {
    sock: UnixStream,
    home: (OwnedFd, OwnedFd),
    stays: bool,
    /// Once answered: (the reply line was sent, fds 1 and 2 are home).
    sent: std::sync::Mutex<Option<(bool, bool)>>,
}

impl Replier {
    fn new(sock: &UnixStream, home: (&OwnedFd, &OwnedFd), stays: bool) -> std::io::Result<Self> {
        Ok(Self {
            sock: sock.try_clone()?,
            home: (home.0.try_clone()?, home.1.try_clone()?),
            stays,
            sent: std::sync::Mutex::new(None),
        })
    }

    fn answer(&self, outcome: &crate::turn::outcome::Outcome, value: Value, trust: Option<String>) {
        let Ok(mut sent) = self.sent.lock() else {
            return;
        };
        if sent.is_some() {
            return;
        }
        let _ = std::io::stdout().write_all(outcome.stdout.as_bytes());
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().write_all(outcome.stderr.as_bytes());
        let _ = std::io::stderr().flush();
        let homed = nix::unistd::dup2_stdout(&self.home.0).is_ok()
            && nix::unistd::dup2_stderr(&self.home.1).is_ok();
        let mut text = serde_json::to_vec(&Reply {
            exit_status: outcome.status,
            printed: true,
            stdout: String::new(),
            stderr: outcome.stderr.clone(),
            value,
            trust_level: trust,
            stays: self.stays,
            ..Reply::default()
        })
        .unwrap_or_default();
        text.push(b'\n');
        *sent = Some((homed && (&self.sock).write_all(&text).is_ok(), homed));
    }

    fn sent(&self) -> Option<(bool, bool)> {
        self.sent.lock().ok().and_then(|s| *s)
    }
}

/// Runs one job and answers it (see [`Replier`]).
fn turn(
    job: std::result::Result<Job, serde_json::Error>,
    pool: Option<&std::sync::Arc<crate::sandbox::pool::WarmPool>>,
    between: &std::sync::Arc<crate::recover::Between>,
    replier: &std::sync::Arc<Replier>,
) {
    let parsed = job
        .map_err(|e| SupervisorError::invalid("request", e.to_string()))
        .and_then(|j| to_options(&j.run));
    let (mut opts, events) = match parsed {
        Ok(p) => p,
        Err(e) => {
            return replier.answer(
                &crate::turn::outcome::error_outcome(&e, false),
                crate::turn::outcome::ErrorReply::of(&e).to_value(),
                None,
            );
        }
    };
    opts.pool = pool.cloned();
    // Only a worker that stays recovers after the turn.
    opts.between = pool.map(|_| std::sync::Arc::clone(between));
    // Loaded once, from the canonical root as admission would (a manifest
    // that does not load is left to admission, which says why).
    let manifest = turnstile_policy::PackageId::parse(&opts.package)
        .ok()
        .zip(std::fs::canonicalize(&opts.root).ok())
        .and_then(|(p, root)| turnstile_policy::Manifest::load(&root, &p).ok());
    let trust = manifest.as_ref().map(|m| m.trust_level.as_str().to_owned());
    opts.manifest = manifest;
    // A plain turn answers as soon as it is durable. A receive turn's
    // output is rendered after it, and a turn with `--events` appends
    // them after it: those answer at the end.
    if opts.receive.is_none() && events.is_none() {
        let early = std::sync::Arc::clone(replier);
        let (json, trust) = (opts.json, trust.clone());
        let early: std::sync::Arc<dyn Fn(&crate::turn::TurnResult) + Send + Sync> =
            std::sync::Arc::new(move |r: &crate::turn::TurnResult| {
                early.answer(
                    &crate::turn::outcome::rendered(r, json),
                    r.value.clone(),
                    trust.clone(),
                );
            });
        opts.on_durable = Some(crate::turn::OnDurable(early));
    }
    let (outcome, value) = crate::turn::outcome::run_turn_outcome(&opts, events.as_deref());
    let (outcome, value) = if opts.receive.is_some() {
        crate::turn::receive::render(opts.json, outcome, value)
    } else {
        (outcome, value)
    };
    if replier.sent().is_some() {
        // Answered when durable; an error since (the anchors could not
        // move: recovery completes the entries) is only logged.
        if value.get("status").is_none() && value.get("error").is_some_and(|e| !e.is_null()) {
            tracing::error!(error = %value["error"], "after the turn's answer");
        }
        return;
    }
    replier.answer(&outcome, value, trust);
}

/// `supervise run`'s options for a daemon request (the state directory is
/// the daemon's; the daemon checked that the client named the same).
pub fn to_options(r: &RunRequest) -> Result<(RunOptions, Option<std::path::PathBuf>)> {
    let mut request = turnstile_policy::request::TurnRequest::from_json(
        &serde_json::to_vec(&r.request).unwrap_or_default(),
    )?;
    // A receive's command is the package's entry point, whatever was sent.
    let receive = match &r.receive {
        None => None,
        Some(w) => {
            let envelope = turnstile_policy::envelope::EventEnvelope::from_json(
                &serde_json::to_vec(&w.envelope).unwrap_or_default(),
            )?;
            request = crate::turn::receive::request(
                &r.root,
                &r.package,
                &envelope,
                w.attempt,
                request.declared_inputs.clone(),
                Some(request.declared_outputs.clone()),
                request.timeout_seconds,
            )?;
            Some(crate::turn::receive::ReceiveInput {
                envelope,
                hop: w.hop,
            })
        }
    };
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
            forward_all_output: false,
            on_durable: None,
            root: r.root.clone(),
            state_dir,
            package: r.package.clone(),
            session: r.session.clone(),
            request,
            manifest: None,
            json: r.json,
            cgroup_place: crate::sandbox::cgroup::Place::host(),
            sources: crate::ids::Sources::system(),
            backend: r.backend.clone(),
            tenant: r.tenant.clone(),
            pool: None,
            between: None,
            interrupts: crate::turn::interrupt::Interrupts::default(),
            config: r
                .config
                .clone()
                .unwrap_or_else(|| crate::backend::select::DEFAULT_CONFIG.into()),
            deterministic,
            rootfs: r.rootfs.clone(),
            receive,
        },
        r.events.clone(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    /// A `delivered` line and the next job queued before the worker reads:
    /// one read can return both. Each comes out whole and in order, the
    /// job with its descriptors; a line split over reads is joined.
    #[test]
    fn issue_29_the_inbox_keeps_what_follows_a_line_and_gives_fds_to_the_job() {
        let (daemon, worker) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        (&daemon).write_all(b"delivered\n").unwrap();
        super::super::wire::send_with_fds(&daemon, b"{\"job\":1}\n{\"jo", &[file.as_raw_fd()])
            .unwrap();
        let mut inbox = Inbox {
            sock: worker,
            buf: Vec::new(),
            fds: Vec::new(),
        };
        let (line, fds) = inbox.next().unwrap().unwrap();
        assert_eq!((line.as_slice(), fds.len()), (DELIVERED, 0));
        let (line, fds) = inbox.next().unwrap().unwrap();
        assert_eq!((line.as_slice(), fds.len()), (&b"{\"job\":1}"[..], 1));
        (&daemon).write_all(b"b\":2}\n").unwrap();
        let (line, fds) = inbox.next().unwrap().unwrap();
        assert_eq!((line.as_slice(), fds.len()), (&b"{\"job\":2}"[..], 0));
        drop(daemon);
        assert!(inbox.next().unwrap().is_none());
    }
}
