//! The soak (issue 29, item 4): many sessions on one `supervise serve`
//! daemon for a while, then the invariants a long-lived daemon owes.
//!
//! One scratch directory holds a workspace, a state directory and the
//! daemon's socket and log. `sessions` sessions are opened; `threads`
//! client threads drive turns through the daemon (`supervise run --server
//! --json`, the real client) until `duration` has passed. Thread `t` owns
//! the sessions `i` with `i % threads == t` and visits them in turn; each
//! visit is two turns back to back:
//!
//! - an even session runs both with package `a`: the second can take the
//!   warm sandbox the worker built after the first (`warm`);
//! - an odd session runs the second with package `b`, whose view differs
//!   (other limits, so another `Plan::shape`): the warm sandbox is
//!   discarded and the turn builds its own (`cold`), as does every first
//!   turn of a visit (with `--pool-size` below the session count, the
//!   session's worker is long gone by its next visit).
//!
//! The commands rotate through four kinds with known outcomes: `/bin/true`
//! (exit 0, committed), a declared output written (0, committed, the file
//! holds the turn's bytes), `/bin/false` (10) and an undeclared write (12,
//! blocked). Meanwhile a sampler reads the daemon's open descriptors
//! (`/proc/PID/fd`), its RSS (`VmRSS`) and its threads every
//! `sample_every`.
//!
//! Then: the daemon stops (SIGTERM, exit 0); every session's ledgers
//! verify (`supervise ledger verify`) and its exec ledger holds one
//! `turn.finished` per turn driven; nothing is left (mounts under the
//! state directory, cgroups of these sessions, `turn-*`/`warm-*`
//! directories, processes of this daemon). [`Report::failures`] lists
//! every invariant broken; it never judges a duration.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Set in the daemon's environment (its workers inherit it): how this
/// soak finds its own processes among others'.
const TAG: &str = "TURNSTILE_SOAK";

/// Kept at most, of each kind of failure (the count is always kept).
const KEEP_ERRORS: usize = 20;

/// The issue's bound on the daemon's RSS.
pub const RSS_LIMIT_KIB: u64 = 64 * 1024;

/// RSS growth allowed between the first and the last sample under load.
pub const RSS_GROWTH_KIB: u64 = 8 * 1024;

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub sessions: usize,
    pub threads: usize,
    pub duration: Duration,
    /// The daemon's `--pool-size` (sessions whose worker stays warm).
    pub pool_size: usize,
    pub sample_every: Duration,
    /// Where the scratch directory goes (removed afterwards).
    pub scratch_parent: PathBuf,
    /// The `supervise` binary.
    pub supervise: PathBuf,
    /// Progress lines on stderr.
    pub verbose: bool,
}

/// One sample of the daemon.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at_s: f64,
    pub fds: u64,
    pub rss_kib: u64,
    pub threads: u64,
}

/// What a soak found.
#[derive(Debug, Default)]
pub struct Report {
    pub sessions: usize,
    pub threads: usize,
    pub pool_size: usize,
    pub seconds: f64,
    pub turns: usize,
    /// Turns by sandbox (`warm`, `cold`) and by kind.
    pub by_sandbox: BTreeMap<String, usize>,
    pub by_kind: BTreeMap<String, usize>,
    /// Turns whose reply was not what the kind promises.
    pub turn_errors: usize,
    pub turn_error_examples: Vec<String>,
    /// Samples under load, then one with the load stopped (idle).
    pub samples: Vec<Sample>,
    /// The daemon before the first turn (no worker yet).
    pub before: Option<Sample>,
    /// The daemon after the last turn, before it was stopped.
    pub after: Option<Sample>,
    pub daemon_exit: Option<i32>,
    pub verify_failures: Vec<String>,
    pub leftovers: Vec<String>,
    /// Set up or tear down went wrong (the soak could not judge).
    pub setup_error: Option<String>,
}

impl Report {
    /// The bound on descriptors after the load: the daemon before it, plus
    /// one control socket per waiting worker, plus slack for the
    /// connections still closing.
    pub fn fd_bound_after(&self) -> u64 {
        self.before.map_or(0, |b| b.fds) + self.pool_size as u64 + 8
    }

    /// The bound on descriptors under load: as after, plus three per
    /// client thread (its connection, its worker's control socket, the
    /// descriptors it passes).
    pub fn fd_bound_loaded(&self) -> u64 {
        self.fd_bound_after() + 4 * self.threads as u64
    }

    /// Every invariant broken, in words; empty when the soak passed.
    pub fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if let Some(e) = &self.setup_error {
            f.push(format!("setup: {e}"));
        }
        if self.turns == 0 {
            f.push("no turn ran".into());
        }
        if self.turn_errors > 0 {
            f.push(format!(
                "{} turn(s) did not end as expected, e.g. {:?}",
                self.turn_errors,
                self.turn_error_examples.first()
            ));
        }
        if self.daemon_exit != Some(0) {
            f.push(format!(
                "the daemon exited {:?} on SIGTERM (want 0)",
                self.daemon_exit
            ));
        }
        if !self.verify_failures.is_empty() {
            f.push(format!(
                "{} session(s) failed verification, e.g. {:?}",
                self.verify_failures.len(),
                self.verify_failures.first()
            ));
        }
        if !self.leftovers.is_empty() {
            f.push(format!("left behind: {:?}", self.leftovers));
        }
        let max = |k: fn(&Sample) -> u64| self.samples.iter().map(k).max().unwrap_or(0);
        if max(|s| s.fds) > self.fd_bound_loaded() {
            f.push(format!(
                "descriptors under load reached {} (bound {})",
                max(|s| s.fds),
                self.fd_bound_loaded()
            ));
        }
        if let Some(a) = self.after {
            if a.fds > self.fd_bound_after() {
                f.push(format!(
                    "descriptors after the load: {} (bound {}: {} before + {} waiting workers + 8)",
                    a.fds,
                    self.fd_bound_after(),
                    self.before.map_or(0, |b| b.fds),
                    self.pool_size
                ));
            }
        }
        if max(|s| s.rss_kib) > RSS_LIMIT_KIB {
            f.push(format!(
                "RSS reached {} KiB (bound {RSS_LIMIT_KIB} KiB)",
                max(|s| s.rss_kib)
            ));
        }
        if let (Some(first), Some(last)) = (self.samples.first(), self.samples.last()) {
            if last.rss_kib > first.rss_kib + RSS_GROWTH_KIB {
                f.push(format!(
                    "RSS grew from {} to {} KiB under the same load (bound +{RSS_GROWTH_KIB} KiB)",
                    first.rss_kib, last.rss_kib
                ));
            }
        }
        f
    }

    /// first / max / last of one measure under load.
    fn triple(&self, k: fn(&Sample) -> u64) -> (u64, u64, u64) {
        (
            self.samples.first().map_or(0, k),
            self.samples.iter().map(k).max().unwrap_or(0),
            self.samples.last().map_or(0, k),
        )
    }

    /// The results as a markdown table (also what the soak prints).
    pub fn table(&self) -> String {
        let mut r = String::new();
        let sandbox = |k: &str| self.by_sandbox.get(k).copied().unwrap_or(0);
        let _ = writeln!(r, "| what | value |\n|---|---|");
        let _ = writeln!(
            r,
            "| sessions / client threads / `--pool-size` | {} / {} / {} |",
            self.sessions, self.threads, self.pool_size
        );
        let _ = writeln!(
            r,
            "| turns (in {:.0} s; {:.1} turns/s) | {} |",
            self.seconds,
            self.turns as f64 / self.seconds.max(1e-9),
            self.turns
        );
        let _ = writeln!(
            r,
            "| turns by sandbox | {} warm, {} cold |",
            sandbox("warm"),
            sandbox("cold")
        );
        let kinds: Vec<String> = self
            .by_kind
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        let _ = writeln!(r, "| turns by kind | {} |", kinds.join(", "));
        let _ = writeln!(r, "| turns not as expected | {} |", self.turn_errors);
        let (f0, f1, f2) = self.triple(|s| s.fds);
        let (r0, r1, r2) = self.triple(|s| s.rss_kib);
        let (t0, t1, t2) = self.triple(|s| s.threads);
        let _ = writeln!(
            r,
            "| daemon descriptors under load, first / max / last ({} samples) | {f0} / {f1} / {f2} (bound {}) |",
            self.samples.len(),
            self.fd_bound_loaded()
        );
        let _ = writeln!(
            r,
            "| daemon RSS under load, first / max / last | {:.1} / {:.1} / {:.1} MiB (bound {} MiB, growth ≤ {} MiB) |",
            r0 as f64 / 1024.0,
            r1 as f64 / 1024.0,
            r2 as f64 / 1024.0,
            RSS_LIMIT_KIB / 1024,
            RSS_GROWTH_KIB / 1024
        );
        let _ = writeln!(
            r,
            "| daemon threads under load, first / max / last | {t0} / {t1} / {t2} |"
        );
        let show = |s: Option<Sample>| {
            s.map_or("?".to_owned(), |s| {
                format!(
                    "{} fds, {:.1} MiB, {} threads",
                    s.fds,
                    s.rss_kib as f64 / 1024.0,
                    s.threads
                )
            })
        };
        let _ = writeln!(
            r,
            "| daemon before the first turn | {} |",
            show(self.before)
        );
        let _ = writeln!(
            r,
            "| daemon after the last turn (bound {} fds) | {} |",
            self.fd_bound_after(),
            show(self.after)
        );
        let _ = writeln!(r, "| daemon exit on SIGTERM | {:?} |", self.daemon_exit);
        let _ = writeln!(
            r,
            "| sessions whose ledgers fail `ledger verify` or miss a turn | {} of {} |",
            self.verify_failures.len(),
            self.sessions
        );
        let _ = writeln!(
            r,
            "| left behind after the stop (mounts, cgroups, turn/warm dirs, processes) | {} |",
            self.leftovers.len()
        );
        let failures = self.failures();
        let _ = writeln!(
            r,
            "| verdict | {} |",
            if failures.is_empty() {
                "pass".to_owned()
            } else {
                format!("FAIL: {}", failures.join("; "))
            }
        );
        r
    }
}

/// The four kinds of turn: (name, expected exit status).
const KINDS: [(&str, i32); 4] = [("true", 0), ("output", 0), ("false", 10), ("blocked", 12)];

fn manifest(memory: &str) -> String {
    format!(
        r#"{{"capabilities": {{
            "write": ["output/<session_id>/**"],
            "execute": ["/bin/sh", "/bin/true", "/bin/false"]}},
          "limits": {{"memory": "{memory}", "pids": 32, "timeout_seconds": 60}}}}"#
    )
}

fn daemon_sample(pid: u32, t0: Instant) -> Option<Sample> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some(Sample {
        at_s: t0.elapsed().as_secs_f64(),
        fds,
        rss_kib: field("VmRSS:"),
        threads: field("Threads:"),
    })
}

/// Processes (not this one) whose environment has `TAG=dir`.
fn tagged(dir: &Path) -> Vec<String> {
    let want = format!("{TAG}={}", dir.display()).into_bytes();
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == me || !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(env) = std::fs::read(e.path().join("environ")) {
            if env.split(|b| *b == 0).any(|kv| kv == want.as_slice()) {
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                out.push(format!(
                    "process {name}: {}",
                    String::from_utf8_lossy(&cmd).replace('\0', " ")
                ));
            }
        }
    }
    out
}

/// What the stopped daemon left of these sessions.
fn leftovers(ws: &Path, state: &Path, dir: &Path, sids: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let needle = format!("{}/", state.display());
    for l in std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
    {
        if l.contains(needle.as_str()) || l.contains(&format!("{}/", ws.display())) {
            out.push(format!("mount: {l}"));
        }
    }
    let ours = |name: &str| sids.iter().any(|s| name.starts_with(s.as_str()));
    for controller in [
        "", "memory", "pids", "cpu", "cpuacct", "cpuset", "freezer", "devices", "blkio", "unified",
        "systemd",
    ] {
        let base = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join("turnstile");
        for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            if ours(&e.file_name().to_string_lossy()) {
                out.push(format!("cgroup: {}", e.path().display()));
            }
        }
    }
    for sid in sids {
        let sdir = state.join("sessions").join(sid);
        for e in std::fs::read_dir(&sdir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("turn-") || name.starts_with("warm-") {
                out.push(format!("state: {}", e.path().display()));
            }
        }
    }
    out.extend(tagged(dir));
    out
}

/// A turn's command line for `kind` in session `sid`: (request flags and
/// command, what its declared output must then hold).
fn command(kind: &str, sid: &str, n: usize) -> (Vec<String>, Option<(String, String)>) {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<String>>();
    match kind {
        "true" => (s(&["--no-outputs", "--", "/bin/true"]), None),
        "false" => (s(&["--no-outputs", "--", "/bin/false"]), None),
        "output" => {
            let rel = format!("output/{sid}/soak.txt");
            let body = format!("turn {n}");
            (
                s(&[
                    "--output",
                    &format!("{rel}:data"),
                    "--",
                    "/bin/sh",
                    "-c",
                    &format!("echo '{body}' > {rel}"),
                ]),
                Some((rel, format!("{body}\n"))),
            )
        }
        _ => (
            s(&[
                "--no-outputs",
                "--",
                "/bin/sh",
                "-c",
                &format!("echo x > output/{sid}/undeclared.txt"),
            ]),
            None,
        ),
    }
}

/// What the client threads share.
struct Shared<'a> {
    cfg: &'a Config,
    ws: &'a Path,
    socket: &'a Path,
    sids: &'a [String],
    deadline: Instant,
    /// Turns driven per session.
    per_session: Mutex<Vec<usize>>,
    by_sandbox: Mutex<BTreeMap<String, usize>>,
    by_kind: Mutex<BTreeMap<String, usize>>,
    errors: Mutex<(usize, Vec<String>)>,
}

impl Shared<'_> {
    fn error(&self, e: String) {
        if let Ok(mut g) = self.errors.lock() {
            g.0 += 1;
            if g.1.len() < KEEP_ERRORS {
                g.1.push(e);
            }
        }
    }

    /// One turn of session `i` with `package`; counts it.
    fn turn(&self, i: usize, package: &str, seq: usize) {
        let sid = &self.sids[i];
        let (kind, want) = KINDS[seq % KINDS.len()];
        let (args, output) = command(kind, sid, seq);
        let out = Command::new(&self.cfg.supervise)
            .arg("run")
            .arg("--server")
            .arg(self.socket)
            .arg("--root")
            .arg(self.ws)
            .args(["--package", package, "--session", sid, "--json"])
            .args(&args)
            .stdin(Stdio::null())
            .env_remove("TURNSTILE_LOG")
            .output();
        if let Ok(mut p) = self.per_session.lock() {
            p[i] += 1;
        }
        let out = match out {
            Ok(o) => o,
            Err(e) => return self.error(format!("{sid}: spawn the client: {e}")),
        };
        let code = out.status.code().unwrap_or(-1);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let sandbox = v["durations"]["sandbox"].as_str().unwrap_or("none");
        if let Ok(mut m) = self.by_sandbox.lock() {
            *m.entry(sandbox.to_owned()).or_default() += 1;
        }
        if let Ok(mut m) = self.by_kind.lock() {
            *m.entry(kind.to_owned()).or_default() += 1;
        }
        let status_ok = match kind {
            "blocked" => v["status"] == "blocked",
            "false" => v["status"] == "command_failed",
            _ => v["status"] == "committed",
        };
        if code != want || v["session_id"] != sid.as_str() || !status_ok {
            return self.error(format!(
                "{sid} {kind} ({package}): exit {code} (want {want}), status {}, stderr {}",
                v["status"],
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        if let Some((rel, body)) = output {
            let got = std::fs::read_to_string(self.ws.join(&rel)).unwrap_or_default();
            if got != body {
                self.error(format!("{sid}: {rel} holds {got:?}, want {body:?}"));
            }
        }
    }

    /// Client thread `t`: visits its sessions until the deadline.
    fn drive(&self, t: usize) {
        let mine: Vec<usize> = (0..self.sids.len())
            .filter(|i| i % self.cfg.threads == t)
            .collect();
        let mut seq = t;
        'outer: loop {
            for &i in &mine {
                if Instant::now() >= self.deadline {
                    break 'outer;
                }
                self.turn(i, "a", seq);
                seq += 1;
                self.turn(i, if i % 2 == 0 { "a" } else { "b" }, seq);
                seq += 1;
            }
        }
    }
}

/// Runs one soak; the report says what held (see [`Report::failures`]).
pub fn run(cfg: &Config) -> Report {
    let mut report = Report {
        sessions: cfg.sessions,
        threads: cfg.threads,
        pool_size: cfg.pool_size,
        ..Report::default()
    };
    let dir = cfg
        .scratch_parent
        .join(format!("ts-soak-{}", std::process::id()));
    if let Err(e) = soak(cfg, &dir, &mut report) {
        report.setup_error = Some(e);
    }
    // The state is removed only when nothing of the daemon runs there.
    if tagged(&dir).is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    report
}

fn say(cfg: &Config, what: &str) {
    if cfg.verbose {
        eprintln!("soak: {what}");
    }
}

fn soak(cfg: &Config, dir: &Path, report: &mut Report) -> Result<(), String> {
    let ws = dir.join("ws");
    let state = dir.join("state");
    let socket = dir.join("serve.sock");
    for (pkg, memory) in [("a", "128Mi"), ("b", "96Mi")] {
        let p = ws.join("installed").join(pkg);
        std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        std::fs::write(p.join("manifest.json"), manifest(memory))
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    std::fs::create_dir_all(&state).map_err(|e| format!("{}: {e}", state.display()))?;
    let log = dir.join("daemon.log");
    let mut child = Command::new(&cfg.supervise)
        .arg("serve")
        .arg("--state-dir")
        .arg(&state)
        .arg("--socket")
        .arg(&socket)
        .args(["--pool-size", &cfg.pool_size.to_string()])
        .args(["--max-turns", &(cfg.threads * 2).to_string()])
        .env(TAG, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?)
        .spawn()
        .map_err(|e| format!("spawn supervise serve: {e}"))?;
    let pid = child.id();
    let stop = |child: &mut std::process::Child| -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                return s.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if t0.elapsed() > Duration::from_secs(30) || matches!(child.try_wait(), Ok(Some(_))) {
            stop(&mut child);
            return Err(format!(
                "the daemon did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Sessions, opened by the client threads in parallel.
    say(cfg, &format!("opening {} sessions", cfg.sessions));
    let sids: Vec<String> = {
        let next = Mutex::new(Vec::new());
        let failed = Mutex::new(None);
        std::thread::scope(|s| {
            for t in 0..cfg.threads {
                let (next, failed, ws, state) = (&next, &failed, &ws, &state);
                s.spawn(move || {
                    for i in (t..cfg.sessions).step_by(cfg.threads) {
                        let o = Command::new(&cfg.supervise)
                            .args(["session", "new", "--root"])
                            .arg(ws)
                            .arg("--state-dir")
                            .arg(state)
                            .output();
                        match o {
                            Ok(o) if o.status.success() => {
                                if let Ok(mut v) = next.lock() {
                                    v.push((
                                        i,
                                        String::from_utf8_lossy(&o.stdout).trim().to_owned(),
                                    ));
                                }
                            }
                            other => {
                                if let Ok(mut f) = failed.lock() {
                                    *f = Some(format!("session new: {other:?}"));
                                }
                                return;
                            }
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().ok().flatten() {
            stop(&mut child);
            return Err(e);
        }
        let mut v = next.into_inner().unwrap_or_default();
        v.sort();
        v.into_iter().map(|(_, s)| s).collect()
    };
    report.before = daemon_sample(pid, t0);
    say(
        cfg,
        &format!(
            "driving turns from {} threads for {} s",
            cfg.threads,
            cfg.duration.as_secs()
        ),
    );
    let shared = Shared {
        cfg,
        ws: &ws,
        socket: &socket,
        sids: &sids,
        deadline: Instant::now() + cfg.duration,
        per_session: Mutex::new(vec![0; sids.len()]),
        by_sandbox: Mutex::new(BTreeMap::new()),
        by_kind: Mutex::new(BTreeMap::new()),
        errors: Mutex::new((0, Vec::new())),
    };
    let started = Instant::now();
    let done = AtomicBool::new(false);
    let samples = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut next = Instant::now() + cfg.sample_every;
            while !done.load(Ordering::SeqCst) {
                if Instant::now() >= next {
                    next += cfg.sample_every;
                    if let (Some(x), Ok(mut v)) = (daemon_sample(pid, t0), samples.lock()) {
                        if cfg.verbose {
                            eprintln!(
                                "soak: {:.0} s: {} fds, {} KiB, {} threads",
                                x.at_s, x.fds, x.rss_kib, x.threads
                            );
                        }
                        v.push(x);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let clients: Vec<_> = (0..cfg.threads)
            .map(|t| {
                let shared = &shared;
                s.spawn(move || shared.drive(t))
            })
            .collect();
        for c in clients {
            let _ = c.join();
        }
        done.store(true, Ordering::SeqCst);
        let _ = sampler.join();
    });
    report.seconds = started.elapsed().as_secs_f64();
    report.samples = samples.into_inner().unwrap_or_default();
    let per_session = shared.per_session.into_inner().unwrap_or_default();
    report.turns = per_session.iter().sum();
    report.by_sandbox = shared.by_sandbox.into_inner().unwrap_or_default();
    report.by_kind = shared.by_kind.into_inner().unwrap_or_default();
    let (n, examples) = shared.errors.into_inner().unwrap_or_default();
    report.turn_errors = n;
    report.turn_error_examples = examples;
    // The connections' threads end just after their replies.
    std::thread::sleep(Duration::from_millis(500));
    report.after = daemon_sample(pid, t0);
    say(cfg, "stopping the daemon");
    report.daemon_exit = stop(&mut child);
    // Workers discard their warm sandboxes as they go; the daemon waited
    // for each, but give the kernel a moment to tear the cgroups down.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        report.leftovers = leftovers(&ws, &state, dir, &sids);
        if report.leftovers.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    say(cfg, &format!("verifying {} sessions", sids.len()));
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..cfg.threads {
            let (failures, sids, per_session, ws, state) =
                (&failures, &sids, &per_session, &ws, &state);
            s.spawn(move || {
                for i in (t..sids.len()).step_by(cfg.threads) {
                    if let Some(e) = verify(cfg, ws, state, &sids[i], per_session[i]) {
                        if let Ok(mut f) = failures.lock() {
                            f.push(e);
                        }
                    }
                }
            });
        }
    });
    report.verify_failures = failures.into_inner().unwrap_or_default();
    Ok(())
}

/// `ledger verify` of one session and its count of finished turns; what
/// is wrong, if anything.
fn verify(cfg: &Config, ws: &Path, state: &Path, sid: &str, turns: usize) -> Option<String> {
    let o = Command::new(&cfg.supervise)
        .args(["ledger", "verify", "--root"])
        .arg(ws)
        .arg("--state-dir")
        .arg(state)
        .args(["--session", sid])
        .output();
    match o {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return Some(format!(
                "{sid}: ledger verify exit {:?}: {}",
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Err(e) => return Some(format!("{sid}: ledger verify: {e}")),
    }
    let exec = ws
        .join("planes/ho1/sessions")
        .join(sid)
        .join("ledger/exec.jsonl");
    let text = std::fs::read_to_string(&exec).unwrap_or_default();
    let finished = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "turn.finished")
        .count();
    (finished != turns).then(|| {
        format!(
            "{sid}: {finished} turn.finished entries in {}, {turns} turns driven",
            exec.display()
        )
    })
}

/// The commit measured: `git rev-parse --short HEAD` (plus `-dirty`).
pub fn commit_of(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let head = git(&["rev-parse", "--short", "HEAD"]);
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    format!("{head}{}", if dirty { "-dirty" } else { "" })
}
