//! The real-software suite: programs nobody here wrote, run inside a turn
//! (the real `supervise run`) and outside it (the same uid, 65534, with a
//! fresh writable TMPDIR), compared. Anything that works outside and fails
//! inside is over-blocking — a bug, unless the allowlist names the test with
//! the reason a sandbox must deny it.
//!
//! - [`modules`]: CPython's own regression tests (Debian
//!   `libpython3.11-testsuite`), parsed per test by [`pyunit`]; a test that
//!   hangs inside is recorded and the module re-run without it, so one hang
//!   does not hide the rest of the module.
//! - toolchain workflows across turns of one session (git, gcc + make,
//!   venv + pip + console script, node, /dev/stderr, ptys, loopback TCP/UDP
//!   over IPv4 and IPv6, a 0600 file in a 0700 workspace, a script made in
//!   TMPDIR) are `#[test]`s in `tests/tests/realsw.rs` on [`Workspace`].
//!
//! `cargo xtask test` (CI) runs the eight modules
//! ([`modules::ISSUE`]) and the workflows; `cargo xtask realsw` runs
//! [`modules::ALL`] through the `realsw` binary and prints the table.
//!
//! Every workspace is a fresh `mktemp -d`-style 0700 root-owned directory,
//! as real workspaces (in 0700 home directories) are.

pub mod allowlist;
pub mod modules;
pub mod pyunit;

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;

/// The uid/gid a turn runs as, and the outside baseline with it.
pub const NOBODY: u32 = 65534;

/// The python the CPython testsuite belongs to (Debian's 3.11; a pyenv
/// `python3` on PATH would not match `libpython3.11-testsuite`).
pub const PYTHON: &str = "/usr/bin/python3";

/// Environment of the outside baseline: what `supervise run` gives a turn
/// (PATH, HOME/TMPDIR/TEMP/TMP = the scratch dir, no .pyc writes, LANG).
/// PATH is what the modules' manifest gets: the default's directories it
/// may execute from (`/usr/bin/*`, `/bin/*`; not `/usr/local/bin`).
fn baseline_env(scratch: &Path) -> Vec<(String, String)> {
    let s = scratch.display().to_string();
    vec![
        ("PATH".into(), "/usr/bin:/bin".into()),
        ("HOME".into(), s.clone()),
        ("TMPDIR".into(), s.clone()),
        ("TEMP".into(), s.clone()),
        ("TMP".into(), s),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ("LANG".into(), "C.UTF-8".into()),
    ]
}

/// How a process run under a deadline ended.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    /// The harness killed it at its deadline.
    pub killed: bool,
    /// ... because its output stopped growing for the stall time.
    pub stalled: bool,
    pub elapsed: Duration,
}

/// Kill a run whose output file has not grown for this long.
#[derive(Debug, Clone)]
pub struct Stall {
    pub file: PathBuf,
    pub after: Duration,
}

/// Runs `cmd` in its own process group with stdin from /dev/null; at the
/// deadline (or when `stall` says the output stopped) the group gets
/// SIGTERM, then SIGKILL 20 s later.
pub fn run_with_deadline(
    cmd: &mut Command,
    deadline: Duration,
    stall: Option<&Stall>,
) -> Result<Finished, String> {
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("spawning {:?}: {e}", cmd.get_program()))?;
    let pgid = Pid::from_raw(i32::try_from(child.id()).map_err(|e| e.to_string())?);
    let mut killed = false;
    let mut stalled = false;
    let mut term_at: Option<Instant> = None;
    let mut last_len = 0;
    let mut last_growth = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                // Whatever the command left in its group goes with it.
                let _ = killpg(pgid, Signal::SIGKILL);
                return Ok(Finished {
                    code: status.code(),
                    killed,
                    stalled,
                    elapsed: started.elapsed(),
                });
            }
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for {:?}: {e}", cmd.get_program())),
        }
        let now = started.elapsed();
        if let Some(st) = stall {
            let len = std::fs::metadata(&st.file).map(|m| m.len()).unwrap_or(0);
            if len != last_len {
                last_len = len;
                last_growth = Instant::now();
            } else if term_at.is_none() && last_growth.elapsed() >= st.after {
                stalled = true;
            }
        }
        match term_at {
            None if now >= deadline || stalled => {
                killed = true;
                let _ = killpg(pgid, Signal::SIGTERM);
                term_at = Some(Instant::now());
            }
            Some(t) if t.elapsed() >= Duration::from_secs(20) => {
                let _ = killpg(pgid, Signal::SIGKILL);
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A directory owned by `NOBODY` (mode 0700) for the outside baseline.
pub fn nobody_dir(prefix: &str) -> Result<tempfile::TempDir, String> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| format!("tempdir: {e}"))?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("chmod {}: {e}", dir.path().display()))?;
    chown_nobody(dir.path())?;
    Ok(dir)
}

/// Gives `p` to uid/gid 65534.
pub fn chown_nobody(p: &Path) -> Result<(), String> {
    nix::unistd::chown(
        p,
        Some(nix::unistd::Uid::from_raw(NOBODY)),
        Some(nix::unistd::Gid::from_raw(NOBODY)),
    )
    .map_err(|e| format!("chown {}: {e}", p.display()))
}

/// Runs `argv` outside any sandbox as uid/gid 65534 (no supplementary
/// groups, no capabilities), with the turn's environment pointed at
/// `scratch` (owned by 65534), cwd `scratch`, SIGINT at its default, and
/// stdout+stderr into `log` (a file owned by 65534, as a user's own
/// terminal or redirect would be). With `stall`, it is stopped when `log`
/// stops growing for that long.
pub fn run_outside(
    scratch: &Path,
    log: &Path,
    argv: &[&str],
    deadline: Duration,
    stall: Option<Duration>,
) -> Result<Finished, String> {
    let out = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    chown_nobody(log)?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new("/usr/bin/env");
    cmd.arg("--default-signal=INT").arg("-i");
    for (k, v) in baseline_env(scratch) {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.args([
        "/usr/bin/setpriv",
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "--",
    ])
    .args(argv)
    .current_dir(scratch)
    .stdout(out)
    .stderr(err);
    let stall = stall.map(|after| Stall {
        file: log.to_path_buf(),
        after,
    });
    run_with_deadline(&mut cmd, deadline, stall.as_ref())
}

/// One `supervise run`: its exit status, the `--json` object, and the
/// command's output (stdout and stderr, forwarded to supervise's stderr).
#[derive(Debug, Clone)]
pub struct Turn {
    pub finished: Finished,
    pub json: Option<Value>,
    pub output: String,
}

impl Turn {
    /// `supervise run`'s exit status (-1 when it was killed).
    pub fn status(&self) -> i32 {
        self.finished.code.unwrap_or(-1)
    }

    pub fn session(&self) -> Option<String> {
        self.json
            .as_ref()
            .and_then(|v| v["session_id"].as_str())
            .map(str::to_owned)
    }

    /// The turn's status word (`committed`, `command_failed`, …).
    pub fn turn_status(&self) -> String {
        self.json
            .as_ref()
            .and_then(|v| v["status"].as_str())
            .unwrap_or("?")
            .to_owned()
    }

    /// A one-line account for failure messages: exit, status, error, and
    /// the tail of the output.
    pub fn describe(&self) -> String {
        let err = self
            .json
            .as_ref()
            .map(|v| {
                format!(
                    "{} {}",
                    v["error"]["code"].as_str().unwrap_or(""),
                    v["error"]["message"].as_str().unwrap_or("")
                )
            })
            .unwrap_or_default();
        let tail: Vec<&str> = self.output.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "supervise exit {} (turn {}{}{}), output tail:\n{}",
            self.status(),
            self.turn_status(),
            if err.trim().is_empty() { "" } else { ": " },
            err.trim(),
            tail.join("\n")
        )
    }
}

/// What a turn is asked for, besides its argv.
#[derive(Debug, Clone, Copy)]
pub struct Req<'a> {
    pub pkg: &'a str,
    pub session: Option<&'a str>,
    /// `PATH:ROLE` entries; empty means `--no-outputs`.
    pub outputs: &'a [&'a str],
    /// `--timeout` (the manifest's when `None`).
    pub timeout_secs: Option<u64>,
    /// The harness kills `supervise` after this long.
    pub deadline: Duration,
    pub stall: Option<Duration>,
}

impl<'a> Req<'a> {
    /// A turn of `pkg` in a new session, no outputs, a 10-minute deadline.
    pub fn new(pkg: &'a str) -> Self {
        Self {
            pkg,
            session: None,
            outputs: &[],
            timeout_secs: None,
            deadline: Duration::from_secs(600),
            stall: None,
        }
    }

    pub fn session(mut self, sid: Option<&'a str>) -> Self {
        self.session = sid;
        self
    }

    pub fn outputs(mut self, outputs: &'a [&'a str]) -> Self {
        self.outputs = outputs;
        self
    }

    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
}

/// A throwaway workspace: a 0700 root-owned root (as `mktemp -d` makes
/// it), a separate state dir, and a dir for logs.
#[derive(Debug)]
pub struct Workspace {
    _root: tempfile::TempDir,
    _state: tempfile::TempDir,
    pub root: PathBuf,
    pub state: PathBuf,
    pub logs: PathBuf,
    pub supervise: PathBuf,
    counter: std::cell::Cell<u32>,
}

impl Workspace {
    /// A fresh workspace with `installed/<pkg>/manifest.json`.
    pub fn new(pkg: &str, manifest: &str) -> Result<Self, String> {
        let mk = |p: &str| {
            tempfile::Builder::new()
                .prefix(p)
                .tempdir()
                .map_err(|e| format!("tempdir: {e}"))
        };
        let root_dir = mk("realsw-ws-")?;
        let state_dir = mk("realsw-state-")?;
        let root = std::fs::canonicalize(root_dir.path()).map_err(|e| e.to_string())?;
        // As `mktemp -d` makes it (the tempfile crate leaves it to the umask).
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("chmod {}: {e}", root.display()))?;
        let mode = std::fs::metadata(&root)
            .map_err(|e| e.to_string())?
            .permissions()
            .mode()
            & 0o7777;
        if mode != 0o700 {
            return Err(format!("{} is {mode:o}, expected 0700", root.display()));
        }
        let state = std::fs::canonicalize(state_dir.path())
            .map_err(|e| e.to_string())?
            .join("state");
        let logs = state_dir.path().join("logs");
        std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
        let ws = Self {
            _root: root_dir,
            _state: state_dir,
            root,
            state,
            logs,
            supervise: crate::supervise_bin(),
            counter: std::cell::Cell::new(0),
        };
        ws.write(
            &format!("installed/{pkg}/manifest.json"),
            manifest.as_bytes(),
        )?;
        Ok(ws)
    }

    /// `supervise session new`: a session whose turns share `tmp/<sid>/`.
    pub fn new_session(&self) -> Result<String, String> {
        let out = Command::new(&self.supervise)
            .args(["session", "new", "--root"])
            .arg(&self.root)
            .arg("--state-dir")
            .arg(&self.state)
            .output()
            .map_err(|e| format!("spawning supervise session new: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "supervise session new: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The session's scratch dir as the host sees it (the turn's TMPDIR).
    pub fn scratch(&self, sid: &str) -> PathBuf {
        self.root.join("tmp").join(sid)
    }

    /// One turn of session `sid` running `/bin/sh -c script`, no outputs,
    /// a 5-minute deadline.
    pub fn sh(&self, pkg: &str, sid: &str, script: &str) -> Result<Turn, String> {
        self.run(
            &Req::new(pkg)
                .session(Some(sid))
                .deadline(Duration::from_secs(300)),
            &["/bin/sh", "-c", script],
        )
    }

    /// Writes a file under the root (parents created).
    pub fn write(&self, rel: &str, content: &[u8]) -> Result<(), String> {
        let p = self.root.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&p, content).map_err(|e| format!("{}: {e}", p.display()))
    }

    /// `supervise run --json --root … --state-dir … --package PKG
    /// [--session SID] (--output P:R… | --no-outputs) [--timeout T] -- argv`,
    /// with SIGINT at its default, the harness deadline, and (with `stall`)
    /// a kill when the output stops growing for that long.
    pub fn run(&self, req: &Req<'_>, argv: &[&str]) -> Result<Turn, String> {
        let Req {
            pkg,
            session,
            outputs,
            timeout_secs,
            deadline,
            stall,
        } = *req;
        let n = self.counter.get() + 1;
        self.counter.set(n);
        let out_path = self.logs.join(format!("turn-{n}.json"));
        let err_path = self.logs.join(format!("turn-{n}.log"));
        let out = File::create(&out_path).map_err(|e| e.to_string())?;
        let err = File::create(&err_path).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("/usr/bin/env");
        cmd.arg("--default-signal=INT")
            .arg(&self.supervise)
            .arg("run")
            .arg("--json")
            .arg("--root")
            .arg(&self.root)
            .arg("--state-dir")
            .arg(&self.state)
            .args(["--package", pkg]);
        if let Some(s) = session {
            cmd.args(["--session", s]);
        }
        if outputs.is_empty() {
            cmd.arg("--no-outputs");
        }
        for o in outputs {
            cmd.args(["--output", o]);
        }
        if let Some(t) = timeout_secs {
            cmd.args(["--timeout", &t.to_string()]);
        }
        cmd.arg("--")
            .args(argv)
            .env("LANG", "C.UTF-8")
            .env_remove("LC_ALL")
            .env_remove("TERM")
            .env_remove("TZ")
            .env_remove("TURNSTILE_LOG")
            .stdout(out)
            .stderr(err);
        let stall = stall.map(|after| Stall {
            file: err_path.clone(),
            after,
        });
        let finished = run_with_deadline(&mut cmd, deadline, stall.as_ref())?;
        if finished.killed && finished.code.is_none() {
            // A supervisor killed mid-turn leaves its cgroup, mounts and
            // an unfinished turn: settle them as an operator would.
            let _ = Command::new(&self.supervise)
                .arg("recover")
                .arg("--root")
                .arg(&self.root)
                .arg("--state-dir")
                .arg(&self.state)
                .output();
        }
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let output =
            String::from_utf8_lossy(&std::fs::read(&err_path).unwrap_or_default()).into_owned();
        let json = serde_json::from_str(stdout.trim()).ok();
        Ok(Turn {
            finished,
            json,
            output,
        })
    }
}

/// Whether `TURNSTILE_REQUIRE_KERNEL=1` (CI): a missing tool fails.
pub fn required() -> bool {
    std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() == Ok("1")
}

/// The first of `paths` that exists, or why none does.
pub fn find_tool(paths: &[&str]) -> Option<PathBuf> {
    paths.iter().map(PathBuf::from).find(|p| p.exists())
}
