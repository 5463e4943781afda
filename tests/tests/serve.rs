//! `supervise serve` on the real binary (root): a turn through the daemon
//! is the same turn as `supervise run` (exit status, output bytes,
//! committed bytes, ledger entries modulo ids and times); a bad request is
//! exit 2 naming the field and creates nothing; kill -9 of the daemon
//! mid-turn is recovered by the next start with `run`'s crash guarantees;
//! a peer of another uid is refused; a stopped daemon leaves nothing behind.
//!
//! Every daemon a test starts is stopped by a guard's Drop, even when the
//! test fails.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile_tests::{Fixture, read_entries, require_root, supervise_bin};

const MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["installed/s/**"],
    "write": ["output/<session_id>/**"],
    "execute": ["/bin/sh", "/bin/true", "/bin/sleep", "/bin/echo"]
  },
  "limits": {"memory": "128Mi", "pids": 32, "timeout_seconds": 30}
}"#;

/// Set in each daemon's environment (its workers inherit it), so a test
/// finds the processes of its own daemon among those of parallel tests.
const TAG: &str = "TURNSTILE_TEST_DAEMON";

/// Processes (other than the test) whose environment has `TAG=dir`.
fn tagged(dir: &Path) -> Vec<String> {
    let want = format!("{TAG}={}", dir.display()).into_bytes();
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == me || !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(env) = std::fs::read(e.path().join("environ")) {
            if env.split(|b| *b == 0).any(|kv| kv == want.as_slice()) {
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                out.push(String::from_utf8_lossy(&cmd).replace('\0', " "));
            }
        }
    }
    out
}

/// A running daemon; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Daemon {
    pub child: Option<Child>,
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
    pub log: PathBuf,
}

impl Daemon {
    /// `health --json --server` against this daemon: its exit status and
    /// its JSON (null when it printed none).
    fn health(&self) -> (Option<i32>, Value) {
        let r = Command::new(supervise_bin())
            .args(["health", "--json", "--server"])
            .arg(&self.socket)
            .output()
            .unwrap();
        (
            r.status.code(),
            serde_json::from_slice(&r.stdout).unwrap_or(Value::Null),
        )
    }

    pub fn start(fx: &Fixture, extra: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ts-serve-")
            .tempdir()
            .unwrap();
        Self::start_at(fx, dir, extra)
    }

    fn start_at(fx: &Fixture, dir: tempfile::TempDir, extra: &[&str]) -> Self {
        let socket = dir.path().join("serve.sock");
        Self::start_at_path(fx, dir, socket, extra)
    }

    fn start_at_path(
        fx: &Fixture,
        dir: tempfile::TempDir,
        socket: PathBuf,
        extra: &[&str],
    ) -> Self {
        let log = dir.path().join(format!(
            "daemon-{}.log",
            Instant::now().elapsed().as_nanos()
        ));
        let child = Command::new(supervise_bin())
            .arg("serve")
            .arg("--state-dir")
            .arg(&fx.state)
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .env(TAG, dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn supervise serve");
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "daemon did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            child: Some(child),
            socket,
            _dir: dir,
            log,
        }
    }

    /// A daemon on an existing socket path (the directory is not owned).
    pub fn start_at_socket(fx: &Fixture, socket: &Path) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ts-serve-")
            .tempdir()
            .unwrap();
        let mut d = Self::start_at_path(fx, dir, socket.to_path_buf(), &[]);
        d.socket = socket.to_path_buf();
        d
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        signal(c.id() as i32, nix::libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return s.code();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            turnstile_tests::kill9_daemon(&mut c);
        }
    }

    /// SIGKILL and reap the daemon alone: its workers are still dying
    /// when this returns.
    pub fn kill9_now(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

fn signal(pid: i32, sig: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::try_from(sig).unwrap(),
    );
}

fn fixture() -> Fixture {
    let fx = Fixture::new();
    fx.install("s", MANIFEST);
    fx
}

/// `supervise run` with `args`, locally or through `server`.
fn run(fx: &Fixture, server: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(supervise_bin());
    cmd.arg("run")
        .arg("--root")
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state);
    if let Some(s) = server {
        cmd.arg("--server").arg(s);
    }
    cmd.args(args)
        .stdin(Stdio::null())
        .env_remove("TURNSTILE_LOG");
    cmd.output().unwrap()
}

/// A ledger entry with everything that differs between two runs of the
/// same turn replaced: ids, times, hashes, measurements.
fn normalize(v: &Value, sid: &str) -> Value {
    const DROP: &[&str] = &[
        "entry_hash",
        "previous_hash",
        "timestamp",
        "ts",
        "started_at",
        "finished_at",
        "durations",
        "resources",
        "posture",
        "wall_ms",
        "duration_ms",
        "query_hash",
        "result_hash",
        "timings",
        "pid",
        // Hashes over content that embeds the session id.
        "plan_hash",
        "request_hash",
    ];
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !DROP.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), normalize(v, sid)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|x| normalize(x, sid)).collect()),
        Value::String(s) => Value::String(s.replace(sid, "<sid>")),
        other => other.clone(),
    }
}

fn session_of(out: &Output) -> String {
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    v["session_id"].as_str().unwrap().to_owned()
}

/// What a stopped daemon and a killed turn must not leave: mounts under
/// the state dir, turnstile cgroups of the session, turn dirs, workers.
fn assert_nothing_left(fx: &Fixture, sid: &str) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let state = format!("{}/", fx.state.display());
    assert!(
        !mounts.lines().any(|l| l.contains(state.as_str())),
        "a mount under the state dir survived:\n{mounts}"
    );
    for controller in ["memory", "pids", "cpu", "cpuacct", "unified", ""] {
        let base = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join("turnstile");
        for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(
                !name.starts_with(sid),
                "cgroup {} survived",
                e.path().display()
            );
        }
    }
    for e in std::fs::read_dir(fx.state.join("sessions").join(sid))
        .unwrap()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(
            !name.starts_with("turn-") && !name.starts_with("warm-"),
            "{name} survived in the state dir"
        );
    }
}

/// Processes whose command line starts with `needle` (workers, sleeps;
/// not the clients, whose argv merely contains the command).
fn processes_with(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if !e
            .file_name()
            .to_string_lossy()
            .chars()
            .all(|c| c.is_ascii_digit())
        {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.starts_with(needle) || c.split(' ').nth(1) == Some(needle) {
                out.push(c);
            }
        }
    }
    out
}

fn finished(fx: &Fixture, sid: &str, turn: u64) -> Vec<Value> {
    read_entries(&fx.ledger(sid, "exec"))
        .into_iter()
        .filter(|e| e["turn_number"] == turn && e["event"] == "turn.finished")
        .collect()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_turn_equals_run_fr_rt_007_fr_rt_018() {
    if !require_root("serve_turn_equals_run_fr_rt_007_fr_rt_018") {
        return;
    }
    let fx = fixture();
    let daemon = Daemon::start(&fx, &[]);
    // The command's output and a committed file; no tool beyond sh builtins.
    let sh = "d=${TMPDIR%/}; echo to-stdout; echo to-stderr >&2; printf 'bytes\\n' > output/${d##*/}/r.txt";
    for (json, cmd) in [
        (true, vec!["/bin/sh", "-c", sh]),
        (true, vec!["/bin/sh", "-c", "exit 3"]),
        (true, vec!["/bin/sleep", "0"]),
    ] {
        let mut args = vec![
            "--package",
            "s",
            "--output",
            "output/<session_id>/r.txt:report",
        ];
        if json {
            args.push("--json");
        }
        args.push("--");
        args.extend(cmd.iter().copied());
        let local = run(&fx, None, &args);
        let served = run(&fx, Some(&daemon.socket), &args);
        assert_eq!(
            local.status.code(),
            served.status.code(),
            "{cmd:?}: {}\n---\n{}",
            String::from_utf8_lossy(&local.stderr),
            String::from_utf8_lossy(&served.stderr)
        );
        let (ls, ss) = (session_of(&local), session_of(&served));
        assert_ne!(ls, ss);
        // stdout: one JSON object each, equal modulo ids and times.
        let lv: Value = serde_json::from_slice(&local.stdout).unwrap();
        let sv: Value = serde_json::from_slice(&served.stdout).unwrap();
        let (mut ln, mut sn) = (normalize(&lv, &ls), normalize(&sv, &ss));
        for v in [&mut ln, &mut sn] {
            v["enforcement"]["posture"] = Value::Null;
        }
        assert_eq!(ln, sn, "--json values differ for {cmd:?}");
        // stderr: the command's output and the summary, ids aside (two
        // pumps copy the command's stdout and stderr: their interleaving
        // varies from run to run, local or not, so lines are compared as a
        // multiset).
        let lines = |b: &[u8], sid: &str| {
            let mut l: Vec<String> = String::from_utf8_lossy(b)
                .replace(sid, "<sid>")
                .lines()
                .map(str::to_owned)
                .collect();
            l.sort();
            l
        };
        assert_eq!(
            lines(&local.stderr, &ls),
            lines(&served.stderr, &ss),
            "stderr differs for {cmd:?}"
        );
        // Committed bytes.
        let lf = fx.root.join("output").join(&ls).join("r.txt");
        let sf = fx.root.join("output").join(&ss).join("r.txt");
        assert_eq!(std::fs::read(&lf).ok(), std::fs::read(&sf).ok());
        // Both ledgers, entry by entry.
        for kind in ["exec", "evidence"] {
            let le: Vec<Value> = read_entries(&fx.ledger(&ls, kind))
                .iter()
                .map(|e| normalize(e, &ls))
                .collect();
            let se: Vec<Value> = read_entries(&fx.ledger(&ss, kind))
                .iter()
                .map(|e| normalize(e, &ss))
                .collect();
            assert_eq!(le.len(), se.len(), "{kind} ledger lengths differ");
            for (a, b) in le.iter().zip(&se) {
                assert_eq!(a, b, "{kind} ledger entries differ");
            }
        }
        fx.assert_ledgers_intact(&ls);
        fx.assert_ledgers_intact(&ss);
    }
    // Plain (non --json) mode: stdout is the command's own output.
    let args = ["--package", "s", "--no-outputs", "--", "/bin/echo", "plain"];
    let local = run(&fx, None, &args);
    let served = run(&fx, Some(&daemon.socket), &args);
    assert_eq!(local.stdout, served.stdout);
    assert_eq!(served.stdout, b"plain\n");
    assert_eq!(served.status.code(), Some(0));
    // A second turn in the same session through the daemon.
    let sid = {
        let r = run(
            &fx,
            Some(&daemon.socket),
            &[
                "--package",
                "s",
                "--no-outputs",
                "--json",
                "--",
                "/bin/true",
            ],
        );
        session_of(&r)
    };
    let r = served_turn(&fx, &daemon.socket, &sid, &["/bin/true"]);
    let v: Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(v["turn_number"], 2);
    fx.assert_ledgers_intact(&sid);
}

#[test]
fn serve_bad_request_is_exit_2_naming_the_field_and_creates_nothing_fr_rt_013() {
    if !require_root("serve_bad_request_is_exit_2_naming_the_field_and_creates_nothing_fr_rt_013") {
        return;
    }
    let fx = fixture();
    let daemon = Daemon::start(&fx, &[]);
    let before = fx.snapshot();
    let raw = |line: &str| -> Value {
        let mut s = UnixStream::connect(&daemon.socket).unwrap();
        s.write_all(line.as_bytes()).unwrap();
        s.write_all(b"\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        serde_json::from_str(out.trim()).unwrap()
    };
    let root = fx.root.display().to_string();
    let state = fx.state.display().to_string();
    let cases = [
        (
            format!(
                r#"{{"op":"run","root":"{root}","package":"s","request":{{"declared_outputs":[]}}}}"#
            ),
            "command",
        ),
        (
            format!(
                r#"{{"op":"run","root":"{root}","package":"s","request":{{"command":["/bin/true"]}}}}"#
            ),
            "declared_outputs",
        ),
        (
            format!(r#"{{"op":"run","root":"{root}","package":"s","bogus":1,"request":{{}}}}"#),
            "bogus",
        ),
        (
            format!(
                r#"{{"op":"run","root":"{root}","package":"s","state_dir":"/tmp","request":{{"command":["/bin/true"],"declared_outputs":[]}}}}"#
            ),
            "state_dir",
        ),
        (
            format!(
                r#"{{"op":"run","root":"{root}","package":"s","state_dir":"{state}","request":{{"command":["/bin/true"],"declared_outputs":[]}}}}"#
            ),
            "fds",
        ),
        (r#"{"op":"launch"}"#.to_owned(), "op"),
        ("not json".to_owned(), "request"),
    ];
    for (line, field) in &cases {
        let v = raw(line);
        assert_eq!(v["exit_status"], 2, "{line}: {v}");
        assert!(
            v["stderr"].as_str().unwrap().contains(field),
            "{line}: field `{field}` not named: {v}"
        );
        assert_eq!(v["value"]["error"]["field"], *field, "{line}: {v}");
    }
    // Through the client: a bad package id, and an unknown package.
    for (pkg, code) in [("../x", "TS1005"), ("nope", "TS1001")] {
        let r = run(
            &fx,
            Some(&daemon.socket),
            &[
                "--package",
                pkg,
                "--no-outputs",
                "--json",
                "--",
                "/bin/true",
            ],
        );
        assert_eq!(
            r.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&r.stderr)
        );
        let v: Value = serde_json::from_slice(&r.stdout).unwrap();
        assert_eq!(v["error"]["code"], code);
    }
    assert_eq!(before, fx.snapshot(), "a bad request created something");
}

/// A turn of `sid` (through `server`, or local) that writes its declared
/// output `k.txt` and then sleeps `secs` (a number no other test sleeps,
/// to find its command): stdin and stdout null, stderr for the caller.
fn writer_then_sleep(fx: &Fixture, server: Option<&Path>, sid: &str, secs: &str) -> Command {
    let mut c = Command::new(supervise_bin());
    c.arg("run");
    if let Some(s) = server {
        c.arg("--server").arg(s);
    }
    c.arg("--root")
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args([
            "--package",
            "s",
            "--session",
            sid,
            "--output",
            "output/<session_id>/k.txt:k",
            "--",
            "/bin/sh",
            "-c",
            &format!("d=${{TMPDIR%/}}; echo k > output/${{d##*/}}/k.txt; exec /bin/sleep {secs}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    c
}

#[test]
fn serve_kill9_mid_turn_then_restart_recovers_fr_rt_007() {
    if !require_root("serve_kill9_mid_turn_then_restart_recovers_fr_rt_007") {
        return;
    }
    let fx = fixture();
    let sid = fx.new_session();
    let mut daemon = Daemon::start(&fx, &[]);
    let dir = daemon.socket.parent().unwrap().to_path_buf();
    let client = writer_then_sleep(&fx, Some(&daemon.socket), &sid, "1003")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the turn's command", || {
        !processes_with("/bin/sleep 1003").is_empty()
    });
    daemon.kill9();
    let out = client.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The worker and the turn died with the daemon.
    wait_for("the turn to die with the daemon", || {
        processes_with("/bin/sleep 1003").is_empty() && tagged(&dir).is_empty()
    });
    // Restart: recovery closes the turn as aborted, nothing committed.
    let mut again = Daemon::start(&fx, &[]);
    let f = finished(&fx, &sid, 1);
    assert_eq!(f.len(), 1, "turn 1 finished {} times", f.len());
    assert_eq!(f[0]["status"], "aborted");
    assert_eq!(f[0]["error"]["code"], "TS1023");
    assert!(
        !fx.root.join("output").join(&sid).join("k.txt").exists(),
        "a killed turn committed"
    );
    fx.assert_ledgers_intact(&sid);
    assert_nothing_left(&fx, &sid);
    // The session goes on through the restarted daemon.
    let r = served_turn(&fx, &again.socket, &sid, &["/bin/true"]);
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert_eq!(again.stop(), Some(0));
}

/// Issue 29: a worker recovers its session after each turn, off the next
/// turn's path, and its next turn skips recovery only if no process held
/// the session since. Here another process does, between two served
/// turns: a local `supervise run` of the same session, killed with -9
/// mid-command. The next served turn must still settle what it left — its
/// turn closed `aborted`, its command dead, its directory and cgroups gone
/// — before it runs, exactly as after a daemon's own crash.
#[test]
fn issue_29_a_served_turn_recovers_what_a_killed_local_turn_left_between() {
    if !require_root("issue_29_a_served_turn_recovers_what_a_killed_local_turn_left_between") {
        return;
    }
    let fx = fixture();
    let sid = fx.new_session();
    let mut daemon = Daemon::start(&fx, &[]);
    let v = served_json(&fx, &daemon.socket, &sid, &["/bin/true"]);
    assert_eq!(v["status"], "committed", "{v}");
    // The worker is idle, its session recovered and its sandbox warm.
    wait_for("the warm sandbox", || warm_built(&fx, &sid));
    let mut local = writer_then_sleep(&fx, None, &sid, "1029")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the local turn's command", || {
        !processes_with("/bin/sleep 1029").is_empty()
    });
    signal(local.id() as i32, 9);
    let _ = local.wait();
    assert!(
        finished(&fx, &sid, 2).is_empty(),
        "the killed turn finished"
    );
    let v = served_json(&fx, &daemon.socket, &sid, &["/bin/true"]);
    assert_eq!(
        (v["status"].as_str(), v["turn_number"].as_u64()),
        (Some("committed"), Some(3)),
        "{v}"
    );
    let f = finished(&fx, &sid, 2);
    assert_eq!(f.len(), 1, "turn 2 finished {} times", f.len());
    assert_eq!(f[0]["status"], "aborted", "{}", f[0]);
    assert!(
        processes_with("/bin/sleep 1029").is_empty(),
        "the killed turn's command outlived the next turn"
    );
    assert!(
        !fx.root.join("output").join(&sid).join("k.txt").exists(),
        "a killed turn committed"
    );
    fx.assert_ledgers_intact(&sid);
    assert_eq!(daemon.stop(), Some(0));
    assert_nothing_left(&fx, &sid);
}

#[test]
fn serve_refuses_a_peer_of_another_uid() {
    if !require_root("serve_refuses_a_peer_of_another_uid") {
        return;
    }
    let fx = fixture();
    let daemon = Daemon::start(&fx, &[]);
    let mode = std::fs::metadata(&daemon.socket)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "socket mode");
    let as_nobody = |socket: &Path| {
        Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(supervise_bin())
            .args(["health", "--json", "--server"])
            .arg(socket)
            .output()
            .expect("setpriv (util-linux)")
    };
    // The socket's mode keeps others out…
    let r = as_nobody(&daemon.socket);
    assert_eq!(
        r.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(String::from_utf8_lossy(&r.stderr).contains("TS1030"));
    // …and SO_PEERCRED does even when the mode is opened up: the socket's
    // directory and the socket are made reachable for this check only.
    std::fs::set_permissions(
        daemon.socket.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let r = as_nobody(&daemon.socket);
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("TS1031") && stderr.contains("uid 65534"),
        "{stderr}"
    );
    // Root is served.
    let r = Command::new(supervise_bin())
        .args(["health", "--json", "--server"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(v["status"], "READY");
}

#[test]
fn serve_sigterm_interrupts_in_flight_turns_and_leaves_nothing() {
    if !require_root("serve_sigterm_interrupts_in_flight_turns_and_leaves_nothing") {
        return;
    }
    let fx = fixture();
    let sid = fx.new_session();
    let mut daemon = Daemon::start(&fx, &[]);
    let socket = daemon.socket.clone();
    let dir = socket.parent().unwrap().to_path_buf();
    let client = served_sleep(&fx, &socket, &sid, "1004", true, Stdio::piped);
    wait_for("the turn's command", || {
        !processes_with("/bin/sleep 1004").is_empty()
    });
    assert_eq!(
        daemon.stop(),
        Some(0),
        "daemon exit; log: {}",
        std::fs::read_to_string(&daemon.log).unwrap_or_default()
    );
    let out = client.wait_with_output().unwrap();
    // The client sees what a local run interrupted by SIGTERM prints.
    assert_eq!(
        out.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "interrupted");
    assert_eq!(v["error"]["code"], "TS1024");
    let f = finished(&fx, &sid, 1);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["status"], "interrupted");
    fx.assert_ledgers_intact(&sid);
    assert_nothing_left(&fx, &sid);
    assert!(!socket.exists(), "the socket survived the daemon");
    assert_eq!(
        tagged(&dir),
        Vec::<String>::new(),
        "a process of the daemon survived it"
    );
    assert!(processes_with("/bin/sleep 1004").is_empty());
}

#[test]
fn serve_client_signal_interrupts_its_turn_as_a_local_run() {
    if !require_root("serve_client_signal_interrupts_its_turn_as_a_local_run") {
        return;
    }
    let fx = fixture();
    let sid = fx.new_session();
    let daemon = Daemon::start(&fx, &[]);
    for (turn, sig) in [(1u64, nix::libc::SIGINT), (2, nix::libc::SIGHUP)] {
        let mut client = served_sleep(&fx, &daemon.socket, &sid, "1005", false, Stdio::null);
        wait_for("the turn's command", || {
            !processes_with("/bin/sleep 1005").is_empty()
        });
        signal(client.id() as i32, sig);
        let status = client.wait().unwrap();
        assert_eq!(status.code(), Some(128 + sig));
        let f = finished(&fx, &sid, turn);
        assert_eq!(f[0]["status"], "interrupted");
    }
    fx.assert_ledgers_intact(&sid);
    assert_nothing_left(&fx, &sid);
}

/// GET /metrics from `addr`; the body.
fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out.split("\r\n\r\n").nth(1).unwrap().to_owned()
}

/// The value of the sample `name{labels}` (labels exactly as rendered).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
}

#[test]
fn serve_seed_001_metrics_emission_health_and_json_logs_after_turns() {
    if !require_root("serve_seed_001_metrics_emission_health_and_json_logs_after_turns") {
        return;
    }
    let fx = fixture();
    let mut daemon = Daemon::start(&fx, &["--metrics", "127.0.0.1:0"]);
    let health = |d: &Daemon| -> Value {
        let r = Command::new(supervise_bin())
            .args(["health", "--json", "--server"])
            .arg(&d.socket)
            .output()
            .unwrap();
        assert_eq!(r.status.code(), Some(0));
        serde_json::from_slice(&r.stdout).unwrap()
    };
    let h = health(&daemon);
    assert_eq!(h["status"], "READY");
    let addr = h["daemon"]["metrics"].as_str().unwrap().to_owned();
    let ok = run(
        &fx,
        Some(&daemon.socket),
        &[
            "--package",
            "s",
            "--no-outputs",
            "--json",
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(ok.status.code(), Some(0));
    let sid = session_of(&ok);
    let r = run(
        &fx,
        Some(&daemon.socket),
        &[
            "--package",
            "s",
            "--session",
            &sid,
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            "exit 4",
        ],
    );
    assert_eq!(r.status.code(), Some(10));
    let r = run(
        &fx,
        Some(&daemon.socket),
        &[
            "--package",
            "s",
            "--session",
            &sid,
            "--no-outputs",
            "--",
            "/usr/bin/id",
        ],
    );
    assert_eq!(r.status.code(), Some(11));
    let r = run(
        &fx,
        Some(&daemon.socket),
        &["--package", "nope", "--no-outputs", "--", "/bin/true"],
    );
    assert_eq!(r.status.code(), Some(2));
    let h = health(&daemon);
    // Every run request that reached a worker (the unknown package too).
    assert_eq!(h["daemon"]["turns_served"], 4, "{h}");
    let m = scrape(&addr);
    let is = |series: &str, want: f64| {
        assert_eq!(sample(&m, series), Some(want), "{series} in:\n{m}");
    };
    is(r#"turns_total{status="committed",backend="native"}"#, 1.0);
    is(
        r#"turns_total{status="command_failed",backend="native"}"#,
        1.0,
    );
    is(r#"turns_total{status="violation",backend="none"}"#, 1.0);
    is(r#"turns_total{status="rejected",backend="none"}"#, 1.0);
    is(r#"violations_total{layer="pre-execution"}"#, 1.0);
    is(
        r#"agent_runtime_spawns_total{status="success",trust_level="standard",runtime_class="native"}"#,
        2.0,
    );
    is(
        r#"agent_runtime_spawn_duration_seconds_count{source="cold"}"#,
        2.0,
    );
    is(
        r#"agent_runtime_terminations_total{reason="completed"}"#,
        1.0,
    );
    is(r#"agent_runtime_terminations_total{reason="error"}"#, 2.0);
    // The session's worker waits with the next turn's sandbox.
    is("agent_runtime_warm_pool_size", 1.0);
    is(
        r#"agent_runtime_health_checks_total{type="readiness",status="success"}"#,
        2.0,
    );
    is("events_received_total", 4.0);
    is("events_emitted_total", 4.0);
    is("event_processing_duration_ms_count", 4.0);
    assert!(sample(&m, "event_processing_duration_ms_sum").unwrap() > 0.0);
    assert_eq!(daemon.stop(), Some(0));
    // JSON logs: one line per turn, inside a `turn` span naming the
    // session, the turn and the backend.
    let log = std::fs::read_to_string(&daemon.log).unwrap();
    let turns: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .filter(|v| v["fields"]["message"] == "turn finished")
        .collect();
    assert_eq!(turns.len(), 4, "{log}");
    assert_eq!(turns[0]["span"]["name"], "turn");
    assert_eq!(turns[0]["span"]["session_id"], sid.as_str());
    assert_eq!(turns[0]["span"]["turn"], 1);
    assert_eq!(turns[0]["span"]["backend"], "native");
    assert_eq!(turns[1]["span"]["turn"], 2);
}

const BUS_MANIFEST: &str = r#"{
  "capabilities": {
    "read": [],
    "write": ["output/<session_id>/**"],
    "execute": ["/usr/bin/echo", "/bin/true", "/usr/bin/sleep"]
  },
  "limits": {"memory": "128Mi", "pids": 32, "timeout_seconds": 30}
}"#;

fn bus_rules(ws: &Path) -> String {
    let ws = ws.display();
    format!(
        r#"rules:
  - id: live-echo
    trigger: {{command_type: exec, source: "agent-*"}}
    guards: {{phase: 2, category: [A, B], approval: none}}
    actions:
      - run: "{{{{msg_run_0}}}}"
        allowlist: ["echo", "cat", "sleep"]
        workspace: {ws}
        package: b
        mode: live
  - id: dry-echo
    trigger: {{command_type: exec, source: "*"}}
    guards: {{phase: 1}}
    actions:
      - run: "echo dry {{{{msg_id}}}}"
        allowlist: ["echo"]
        workspace: {ws}
        package: b
        mode: dry-run
  - id: only-phase-9
    trigger: {{command_type: exec, source: "*"}}
    guards: {{phase: 9}}
    actions:
      - run: "echo never"
        allowlist: ["echo"]
        workspace: {ws}
        package: b
  - id: approved-task
    trigger: {{command_type: task, source: "*"}}
    guards: {{category: [B], approval: required}}
    actions:
      - run: "echo approved {{{{title}}}}"
        allowlist: ["echo"]
        workspace: {ws}
        package: b
        mode: live
"#
    )
}

fn bus_message(id: &str, category: &str, command_type: &str, run: &str, phase: i64) -> String {
    serde_json::json!({
        "msg_id": id, "category": category, "msg_type": "COMMAND", "command_type": command_type,
        "title": format!("title-{id}"), "run": [run],
        "context": {"phase": phase, "requested_by": "agent-7"},
        "timestamp": "2026-11-23T10:00:00Z",
    })
    .to_string()
}

/// Evidence files (output/ and error/) by the message file they finish.
fn evidence(bus: &Path) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for sub in ["output", "error"] {
        for e in std::fs::read_dir(bus.join(sub)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let v: Value = serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap();
            out.push((sub.to_owned(), v["file"].as_str().unwrap().to_owned(), v));
        }
    }
    out
}

fn count_json(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .count()
}

#[test]
fn serve_bus_scenario_with_two_kill9_every_message_once_fr_rt_007() {
    if !require_root("serve_bus_scenario_with_two_kill9_every_message_once_fr_rt_007") {
        return;
    }
    let fx = Fixture::new();
    fx.install("b", BUS_MANIFEST);
    let busdir = tempfile::Builder::new()
        .prefix("ts-bus-")
        .tempdir()
        .unwrap();
    let bus = busdir.path().to_path_buf();
    for sub in ["input", "approvals"] {
        std::fs::create_dir_all(bus.join(sub)).unwrap();
    }
    std::fs::write(bus.join("rules.v0.1.yaml"), bus_rules(&fx.root)).unwrap();
    // 100 messages: what each must become.
    let mut expect: Vec<(String, &str, String)> = Vec::new(); // (file, kind, message)
    for i in 0..100 {
        let id = format!("m{i:03}");
        let (kind, msg) = match i % 10 {
            // The first live message is still running at the first kill.
            0 if i == 0 => ("slow", bus_message(&id, "A", "exec", "sleep 1006", 2)),
            0..=3 => (
                "live",
                bus_message(&id, "A", "exec", &format!("echo live {id}"), 2),
            ),
            4 => ("dry", bus_message(&id, "C", "exec", "ignored", 1)),
            5 => ("skipped", bus_message(&id, "A", "exec", "echo x", 5)),
            6 => ("held", bus_message(&id, "B", "task", "x", 3)),
            7 => ("bad", format!(r#"{{"msg_id":"{id}","msg_type":"EVENT"}}"#)),
            8 => ("disallowed", bus_message(&id, "A", "exec", "rm -rf /", 2)),
            _ => (
                "refused",
                bus_message(&id, "B", "exec", "cat /etc/hostname", 2),
            ),
        };
        expect.push((format!("{id}.json"), kind, msg));
    }
    // Messages arrive atomically (written aside, renamed in).
    let drop_in = |file: &str, msg: &str| {
        let tmp = bus.join(format!("input/.{file}.tmp"));
        std::fs::write(&tmp, msg).unwrap();
        std::fs::rename(&tmp, bus.join("input").join(file)).unwrap();
    };
    for (file, _, msg) in &expect[..50] {
        drop_in(file, msg);
    }
    let busarg = bus.display().to_string();
    // Approvals name an approver of the daemon's config (issue 28).
    let cfg = busdir.path().join("daemon.json");
    std::fs::write(&cfg, r#"{"approvers": ["alice"]}"#).unwrap();
    let cfg = cfg.display().to_string();
    let mut daemon = Daemon::start(&fx, &["--bus", &busarg, "--daemon-config", &cfg]);
    for (file, _, msg) in &expect[50..] {
        drop_in(file, msg);
    }
    // Two kill -9 while messages are being processed.
    for threshold in [0, 45] {
        if threshold == 0 {
            wait_for("the slow turn", || {
                !processes_with("/usr/bin/sleep 1006").is_empty()
            });
        } else {
            wait_for("evidence to accumulate", || {
                evidence(&bus).len() >= threshold
            });
        }
        daemon.kill9();
        daemon = Daemon::start(&fx, &["--bus", &busarg, "--daemon-config", &cfg]);
    }
    let held: Vec<&(String, &str, String)> = expect.iter().filter(|e| e.1 == "held").collect();
    // Settled: every message has its evidence and is gone from input/ and
    // processing/ but the held ones. The bus renames the evidence in
    // before it removes the message from processing/, so the last
    // message's file may outlive the evidence count for an instant.
    let settled = |n: usize, waiting: usize| {
        count_json(&bus.join("input")) == 0
            && evidence(&bus).len() == n
            && count_json(&bus.join("processing")) == waiting
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !settled(100 - held.len(), held.len()) {
        assert!(
            Instant::now() < deadline,
            "the bus did not settle: {} evidence files, {} messages in processing/ ({} held)",
            evidence(&bus).len(),
            count_json(&bus.join("processing")),
            held.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Held messages wait in processing/, listed by health.
    assert_eq!(count_json(&bus.join("processing")), held.len());
    let h = Command::new(supervise_bin())
        .args(["health", "--json", "--server"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let h: Value = serde_json::from_slice(&h.stdout).unwrap();
    assert_eq!(
        h["daemon"]["bus"]["held"].as_array().unwrap().len(),
        held.len(),
        "{h}"
    );
    for (file, _, msg) in &held {
        use sha2::Digest;
        let sha = hex::encode(sha2::Sha256::digest(msg.as_bytes()));
        std::fs::write(
            bus.join("approvals").join(file),
            format!(r#"{{"sha256": "{sha}", "approver": "alice"}}"#),
        )
        .unwrap();
    }
    wait_for("approved messages", || settled(100, 0));
    assert_eq!(count_json(&bus.join("processing")), 0);
    assert_eq!(daemon.stop(), Some(0));

    // Every message ends in exactly one place, with the expected outcome.
    let ev = evidence(&bus);
    let mut sessions = std::collections::BTreeSet::new();
    let mut live_turns = std::collections::BTreeSet::new();
    let mut aborted = 0;
    for (file, kind, _) in &expect {
        let mine: Vec<&(String, String, Value)> = ev.iter().filter(|e| &e.1 == file).collect();
        assert_eq!(
            mine.len(),
            1,
            "{file} ({kind}) has {} evidence files",
            mine.len()
        );
        let (sub, _, v) = mine[0];
        let action = &v["actions"][0];
        match *kind {
            "slow" => {
                // Killed mid-turn with its daemon: closed `aborted` by
                // recovery, then replayed (not run) for the message.
                assert_eq!(sub, "error", "{file}: {v}");
                assert_eq!(action["status"], "aborted", "{v}");
                assert_eq!(action["replayed"], true, "{v}");
                sessions.insert(action["session_id"].as_str().unwrap().to_owned());
            }
            "live" | "held" => {
                if action["status"] == "aborted" || action["status"] == "interrupted" {
                    // Killed mid-turn: recorded once, never run again.
                    assert_eq!(sub, "error", "{file}: {v}");
                    aborted += 1;
                } else {
                    assert_eq!(sub, "output", "{file}: {v}");
                    assert_eq!(action["status"], "committed", "{file}: {v}");
                    let want = if *kind == "live" {
                        format!("live {}\n", file.trim_end_matches(".json"))
                    } else {
                        format!("approved title-{}\n", file.trim_end_matches(".json"))
                    };
                    if action["replayed"] == false {
                        assert!(
                            action["output"].as_str().unwrap().starts_with(&want),
                            "{file}: {v}"
                        );
                    }
                }
                sessions.insert(action["session_id"].as_str().unwrap().to_owned());
                assert!(
                    live_turns.insert((
                        action["session_id"].clone().to_string(),
                        action["turn_number"].as_u64().unwrap()
                    )),
                    "{file}: a turn served two messages"
                );
            }
            "dry" => {
                assert_eq!(sub, "output", "{file}: {v}");
                assert_eq!(action["mode"], "dry-run");
                assert_eq!(action["would_execute"][0], "/usr/bin/echo");
                assert!(action.get("session_id").is_none(), "a dry run ran a turn");
            }
            "skipped" => {
                assert_eq!(sub, "error");
                assert_eq!(v["error"]["code"], "TS1035", "{v}");
                assert_eq!(v["skipped"][0]["rule"], "live-echo");
                assert_eq!(v["skipped"][0]["guard"], "phase");
            }
            "bad" => {
                assert_eq!(sub, "error");
                assert_eq!(v["error"]["code"], "TS1033", "{v}");
            }
            "disallowed" => {
                assert_eq!(sub, "error");
                assert_eq!(v["error"]["code"], "TS1034", "{v}");
                assert!(v["error"]["message"].as_str().unwrap().contains("`rm`"));
            }
            "refused" => {
                // On the rule's allowlist, not in the package's execute
                // capability: the turn's pre-execution check refuses it.
                assert_eq!(sub, "error", "{v}");
                assert_eq!(action["exit_status"], 11, "{v}");
                assert_eq!(action["status"], "violation");
            }
            _ => unreachable!(),
        }
    }
    assert!(
        aborted <= 1,
        "{aborted} more turns aborted by the second kill"
    );
    eprintln!(
        "bus scenario: {aborted} live turn(s) besides the slow one were cut by the second kill -9"
    );
    // Each live message's turn started exactly once in the ledgers.
    let live_like = expect
        .iter()
        .filter(|e| matches!(e.1, "live" | "held" | "refused" | "slow"))
        .count();
    let mut started = 0;
    for sid in &sessions {
        fx.assert_ledgers_intact(sid);
        assert_nothing_left(&fx, sid);
        started += read_entries(&fx.ledger(sid, "exec"))
            .iter()
            .filter(|e| e["event"] == "turn.started")
            .count();
        started += read_entries(&fx.ledger(sid, "exec"))
            .iter()
            .filter(|e| e["event"] == "turn.finished" && e["status"] == "violation")
            .count();
    }
    assert_eq!(started, live_like, "turns started != live messages");
}

#[test]
fn serve_max_turns_refuses_beyond_the_limit_and_runs_nothing() {
    if !require_root("serve_max_turns_refuses_beyond_the_limit_and_runs_nothing") {
        return;
    }
    let fx = fixture();
    let sid = fx.new_session();
    let daemon = Daemon::start(&fx, &["--max-turns", "1"]);
    let mut busy = served_sleep(&fx, &daemon.socket, &sid, "1008", false, Stdio::null);
    wait_for("the first turn", || {
        !processes_with("/bin/sleep 1008").is_empty()
    });
    let before = read_entries(&fx.ledger(&sid, "exec")).len();
    let r = served_turn(&fx, &daemon.socket, &sid, &["/bin/true"]);
    assert_eq!(
        r.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let v: Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(v["error"]["code"], "TS1032");
    assert!(v["error"]["message"].as_str().unwrap().contains("busy"));
    signal(busy.id() as i32, nix::libc::SIGTERM);
    assert_eq!(busy.wait().unwrap().code(), Some(143));
    // The refused request left no trace; the interrupted one its entries.
    let entries = read_entries(&fx.ledger(&sid, "exec"));
    assert_eq!(
        entries.len(),
        before + 1,
        "only the interrupted turn's finish entry was added"
    );
    fx.assert_ledgers_intact(&sid);
}

#[test]
fn serve_refuses_bad_startup_and_replaces_only_a_stale_socket() {
    if !require_root("serve_refuses_bad_startup_and_replaces_only_a_stale_socket") {
        return;
    }
    let fx = fixture();
    let serve = |args: &[&str]| {
        Command::new(supervise_bin())
            .arg("serve")
            .arg("--state-dir")
            .arg(&fx.state)
            .args(args)
            .output()
            .unwrap()
    };
    // A bad rules file: exit 2, TS1036, the field named; nothing listens.
    let busdir = tempfile::tempdir().unwrap();
    std::fs::write(
        busdir.path().join("rules.v0.1.yaml"),
        "rules:\n  - id: x\n    trigger: {command_type: exec}\n    actions:\n      - {run: 'echo', allowlist: [echo], workspace: relative, package: p}\n",
    )
    .unwrap();
    let sock = busdir.path().join("s.sock");
    let r = serve(&[
        "--bus",
        busdir.path().to_str().unwrap(),
        "--socket",
        sock.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("TS1036") && stderr.contains("rules[0].actions[0].workspace"),
        "{stderr}"
    );
    assert!(!sock.exists());
    // Neither a socket nor a bus: exit 2.
    assert_eq!(serve(&[]).status.code(), Some(2));
    // A live daemon's socket is not taken over; a stale one is replaced.
    let mut daemon = Daemon::start(&fx, &[]);
    let r = serve(&["--socket", daemon.socket.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("already listens"));
    let socket = daemon.socket.clone();
    daemon.kill9();
    assert!(socket.exists(), "kill -9 leaves the socket file");
    let again = Daemon::start_at_socket(&fx, &socket);
    let h = Command::new(supervise_bin())
        .args(["health", "--json", "--server"])
        .arg(&again.socket)
        .output()
        .unwrap();
    assert_eq!(h.status.code(), Some(0));
    // A path that is not a socket is never removed.
    let file = busdir.path().join("not-a-socket");
    std::fs::write(&file, b"keep").unwrap();
    let r = serve(&["--socket", file.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2));
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}

/// `supervise run [--json] --server SOCKET … -- /bin/sleep SECS` in
/// session `sid`, its output streams made by `out`.
fn served_sleep(
    fx: &Fixture,
    socket: &Path,
    sid: &str,
    secs: &str,
    json: bool,
    out: fn() -> Stdio,
) -> std::process::Child {
    let mut c = Command::new(supervise_bin());
    c.arg("run");
    if json {
        c.arg("--json");
    }
    c.arg("--server")
        .arg(socket)
        .arg("--root")
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args([
            "--package",
            "s",
            "--session",
            sid,
            "--no-outputs",
            "--",
            "/bin/sleep",
            secs,
        ])
        .stdin(Stdio::null())
        .stdout(out())
        .stderr(out())
        .spawn()
        .unwrap()
}

/// One turn of `sid` through `server`, `--json`, no outputs declared.
fn served_turn(fx: &Fixture, server: &Path, sid: &str, cmd: &[&str]) -> Output {
    let mut args = vec![
        "--package",
        "s",
        "--session",
        sid,
        "--no-outputs",
        "--json",
        "--",
    ];
    args.extend_from_slice(cmd);
    run(fx, Some(server), &args)
}

/// One turn of `sid` through `server`, `--json`: (exit code, stdout of
/// the command as captured by `sh`'s file, the --json value).
fn served_json(fx: &Fixture, server: &Path, sid: &str, cmd: &[&str]) -> Value {
    let out = served_turn(fx, server, sid, cmd);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // In --json mode the command's stdout goes to stderr.
    v["command_output"] = Value::String(String::from_utf8_lossy(&out.stderr).into_owned());
    v
}

/// The cgroup directories of the session's warm sandboxes.
fn warm_cgroups(sid: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for controller in ["memory", "pids", "unified", ""] {
        let base = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join("turnstile");
        for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{sid}-w"))
            {
                out.push(e.path());
            }
        }
    }
    out
}

/// Whether a warm sandbox of the session has its whole root built (its
/// init reported its laps: every mount is made, bind sources pinned).
/// Whether a warm sandbox of `sid` is built and waits for its turn: its
/// init reported its laps (its root is made) and no command of it ended.
/// A sandbox a turn took keeps its `warm-` directory until that turn's
/// cleanup removes it, its laps and its command's end in its report: it
/// is not the next turn's (waiting on it raced the next build).
fn warm_built(fx: &Fixture, sid: &str) -> bool {
    warm_entries(fx, sid)
        .iter()
        .filter(|n| !n.ends_with(".lock"))
        .any(|n| {
            let report = fx
                .state
                .join("sessions")
                .join(sid)
                .join(n)
                .join("report.jsonl");
            std::fs::read_to_string(report).is_ok_and(|r| {
                r.contains("\"init_laps\"")
                    && !r.contains("\"event\":\"exit\"")
                    && !r.contains("\"event\":\"signal\"")
            })
        })
}

fn sandbox_of(v: &Value) -> &str {
    v["durations"]["sandbox"].as_str().unwrap_or("?")
}

fn warm_entries(fx: &Fixture, sid: &str) -> Vec<String> {
    std::fs::read_dir(fx.state.join("sessions").join(sid))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("warm-"))
        .collect()
}

#[test]
fn serve_warm_sandbox_serves_only_a_turn_of_the_same_shape_issue_14() {
    if !require_root("serve_warm_sandbox_serves_only_a_turn_of_the_same_shape_issue_14") {
        return;
    }
    let fx = Fixture::new();
    let manifest = |extra: &str| {
        format!(
            r#"{{"capabilities": {{
                "read": ["installed/s/**", "notes.txt"{extra}],
                "write": ["output/<session_id>/**"],
                "execute": ["/bin/sh", "/bin/true", "/bin/echo"]}},
              "limits": {{"memory": "128Mi", "pids": 32, "timeout_seconds": 30}}}}"#
        )
    };
    fx.install("s", &manifest(""));
    fx.write("notes.txt", b"v1\n");
    fx.write("extra.txt", b"extra\n");
    let sid = fx.new_session();
    let mut daemon = Daemon::start(&fx, &[]);
    let show = [
        "/bin/sh",
        "-c",
        "read l < notes.txt; echo $l; echo turn=$TURNSTILE_TURN",
    ];
    // One turn: the sandbox it got must be `want`; returns the --json value
    // and what the command printed.
    let turn = |cmd: &[&str], want: &str| -> (Value, String) {
        let v = served_json(&fx, &daemon.socket, &sid, cmd);
        assert_eq!(sandbox_of(&v), want, "{cmd:?}: {v}");
        let out = v["command_output"].as_str().unwrap().to_owned();
        (v, out)
    };
    let read_extra = ["/bin/sh", "-c", "read l < extra.txt; echo $l"];
    // The session's first turn builds its sandbox; the next one was built
    // while the first one's entries were written.
    let (t1, _) = turn(&show, "cold");
    wait_for("the warm sandbox", || warm_built(&fx, &sid));
    // The turn's own part reaches a warm sandbox: its environment...
    let (t2, out) = turn(&show, "warm");
    assert!(out.contains("v1\nturn=2\n"), "{out}");
    // ... with the same enforcement as a cold one ...
    let enforcement = |v: &Value| {
        let mut e = v["enforcement"].clone();
        e["posture"]["pid"] = Value::Null;
        e
    };
    assert_eq!(enforcement(&t1), enforcement(&t2));
    // ... and another command of the same shape.
    let (_, out) = turn(&["/bin/echo", "other"], "warm");
    assert!(out.starts_with("other\n"), "{out}");
    // A granted file replaced on the host (a rename over it) after the warm
    // sandbox was built: its bind mount still shows the old one, so the
    // warm sandbox is not used.
    wait_for("the warm sandbox's root", || warm_built(&fx, &sid));
    fx.write("notes.new", b"v2\n");
    std::fs::rename(fx.root.join("notes.new"), fx.root.join("notes.txt")).unwrap();
    let (_, out) = turn(&show, "cold");
    assert!(out.contains("v2\nturn=4\n"), "{out}");
    // A manifest that grants one more file is another view: cold, and the
    // new grant is there; the old view's warm sandbox is gone.
    let (_, out) = turn(&read_extra, "warm");
    assert!(!out.contains("extra\n"), "{out}");
    fx.install("s", &manifest(", \"extra.txt\""));
    let (_, out) = turn(&read_extra, "cold");
    assert!(out.starts_with("extra\n"), "{out}");
    turn(&read_extra, "warm");
    // The next turn's sandbox is built after this turn's commit: what a
    // warm turn committed, the next warm turn sees.
    turn(&["/bin/sh", "-c", "echo carried > $TMPDIR/w.txt"], "warm");
    let (_, out) = turn(
        &["/bin/sh", "-c", "read l < $TMPDIR/w.txt; echo $l"],
        "warm",
    );
    assert!(out.starts_with("carried\n"), "{out}");
    // Without --json the command's stdout is the client's stdout: the warm
    // sandbox's output pumps are set up for the turn that takes it.
    let plain = run(
        &fx,
        Some(&daemon.socket),
        &[
            "--package",
            "s",
            "--session",
            &sid,
            "--no-outputs",
            "--",
            "/bin/echo",
            "plain",
        ],
    );
    assert_eq!(plain.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "plain\n");
    // (The daemon's log says which sandbox each turn got.)
    let log = std::fs::read_to_string(&daemon.log).unwrap();
    let last = log
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["fields"]["message"] == "turn finished")
        .unwrap();
    assert_eq!(last["fields"]["sandbox"], "warm", "{last}");
    fx.assert_ledgers_intact(&sid);
    // The daemon's health counts the waiting worker.
    let h = Command::new(supervise_bin())
        .args(["health", "--json", "--server"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let hv: Value = serde_json::from_slice(&h.stdout).unwrap();
    assert_eq!(hv["daemon"]["warm_pool_size"], 1, "{hv}");
    // Stopped: no warm sandbox, worker, mount or cgroup is left.
    assert_eq!(daemon.stop(), Some(0));
    wait_for("the workers to go", || {
        tagged(daemon.socket.parent().unwrap()).is_empty()
    });
    assert_nothing_left(&fx, &sid);
}

/// A warm sandbox waits with its command's stage already forked, holding
/// the turn's identity (uid and gid 65534, no capability in any set,
/// no_new_privs) and restricted as its last turn was (Landlock, seccomp),
/// its posture checked. A turn with those restrictions runs from it (its
/// own command and environment) with the posture of a cold one; a turn
/// with other execute rules does not take it, and runs with its own.
#[test]
fn issue_29_a_warm_sandbox_parks_its_command_stage_restricted_ahead() {
    if !require_root("issue_29_a_warm_sandbox_parks_its_command_stage_restricted_ahead") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "s",
        r#"{"capabilities": {"execute": ["/bin/sh", "/usr/bin/e*"]}, "limits": {"pids": 32}}"#,
    );
    let sid = fx.new_session();
    let daemon = Daemon::start(&fx, &[]);
    let cmd = ["/bin/sh", "-c", "echo ran"];
    let cold = served_json(&fx, &daemon.socket, &sid, &cmd);
    assert_eq!(sandbox_of(&cold), "cold", "{cold}");
    wait_for("the warm sandbox", || warm_built(&fx, &sid));
    // The warm sandbox's processes, from its cgroup: exactly one of them
    // (the parked command stage) has left root.
    let status =
        |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(':')
                    .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            })
            .unwrap_or_default()
    };
    let mut staged = Vec::new();
    wait_for("the parked command stage", || {
        staged = warm_cgroups(&sid)
            .iter()
            .filter(|d| d.starts_with("/sys/fs/cgroup/pids"))
            .flat_map(|d| {
                std::fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .map(|pid| status(&pid))
            .filter(|s| field(s, "Uid") == "65534 65534 65534 65534")
            .collect();
        // Parked: it drops root before it applies Landlock and seccomp, and
        // a look in between sees it on its way (waits it out: a stage
        // that never gets its filter fails below, after the wait).
        staged.len() == 1 && field(&staged[0], "Seccomp") == "2"
    });
    assert_eq!(staged.len(), 1, "{staged:?}");
    let s = &staged[0];
    assert_eq!(field(s, "Gid"), "65534 65534 65534 65534", "{s}");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(s, cap), "0000000000000000", "{cap}: {s}");
    }
    assert_eq!(field(s, "NoNewPrivs"), "1", "{s}");
    // Already: seccomp's filter, last of the restrictions (and Landlock
    // before it), in force while it waits for its turn.
    assert_eq!(field(s, "Seccomp"), "2", "{s}");
    // One turn, once the session's next sandbox is built: the sandbox it
    // got must be `sandbox`, its output start with `out`, its posture hold.
    let turn = |cmd: &[&str], sandbox: &str, out: &str| -> Value {
        wait_for("the warm sandbox", || warm_built(&fx, &sid));
        let v = served_json(&fx, &daemon.socket, &sid, cmd);
        assert_eq!(sandbox_of(&v), sandbox, "{v}");
        let printed = v["command_output"].as_str().unwrap();
        assert!(printed.starts_with(out), "{v}");
        assert_eq!(v["enforcement"]["posture"]["ok"], true, "{v}");
        v
    };
    // The turn that takes it — its own command and environment — is
    // checked and enforced as a cold one is.
    let other = ["/bin/sh", "-c", "echo ran again $TURNSTILE_TURN"];
    let warm = turn(&other, "warm", "ran again 2\n");
    let landlock = |v: &Value| v["enforcement"]["landlock"].clone();
    assert_eq!(landlock(&warm), landlock(&cold));
    assert_eq!(
        warm["enforcement"]["seccomp"],
        cold["enforcement"]["seccomp"]
    );
    assert_eq!(warm["enforcement"]["seccomp"]["mode"], "filter", "{warm}");
    // A command the glob admits has its own execute rule (the program,
    // resolved): the stage restricted ahead holds the last turn's, so this
    // turn builds its own sandbox...
    turn(&["/usr/bin/echo", "mine"], "cold", "mine\n");
    // ... and the next turn like it takes the sandbox restricted after it.
    turn(&["/usr/bin/echo", "again"], "warm", "again\n");
    fx.assert_ledgers_intact(&sid);
}

/// The processes of the session's waiting warm sandbox, from its `pids`
/// cgroup: (its PID 1 — pid 1 of its own PID namespace —, its parked
/// command stage — uid 65534 —, its cgroup directories), once the stage,
/// restricted ahead, waits for its go (a read(2) of descriptor 4, the
/// init's GO_FD): its builder has nothing left to wait for.
fn warm_processes(sid: &str) -> (i32, i32, Vec<PathBuf>) {
    let status =
        |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(':')
                    .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            })
            .unwrap_or_default()
    };
    let mut found = (0, 0, Vec::new());
    wait_for("the warm sandbox's PID 1 and parked stage", || {
        let cgroups = warm_cgroups(sid);
        let procs: Vec<String> = cgroups
            .iter()
            .filter(|d| d.starts_with("/sys/fs/cgroup/pids"))
            .flat_map(|d| {
                std::fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut pid1 = 0;
        let mut stage = 0;
        for p in &procs {
            let s = status(p);
            if field(&s, "NSpid").ends_with(" 1") {
                pid1 = p.parse().unwrap();
            } else if field(&s, "Uid") == "65534 65534 65534 65534" {
                stage = p.parse().unwrap();
            }
        }
        let waits_for_go = std::fs::read_to_string(format!("/proc/{stage}/syscall"))
            .is_ok_and(|s| s.starts_with("0 0x4 "));
        found = (pid1, stage, cgroups);
        pid1 != 0 && stage != 0 && waits_for_go
    });
    found
}

/// The state letter of `pid` (`/proc/<pid>/stat`), `None` once it is gone.
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Kill-point audit: a warm sandbox whose parked command stage or PID 1
/// was SIGKILLed or SIGSTOPped between turns is not handed to the next
/// turn (which would end `command_failed`, E2041 or at its timeout): it is
/// discarded — processes, cgroups, mounts, directory — and the turn builds
/// its own sandbox and runs as any turn does.
#[test]
fn serve_a_warm_sandbox_with_a_dead_or_stopped_stage_or_pid1_is_discarded_for_a_cold_turn() {
    if !require_root(
        "serve_a_warm_sandbox_with_a_dead_or_stopped_stage_or_pid1_is_discarded_for_a_cold_turn",
    ) {
        return;
    }
    let fx = Fixture::new();
    // A short timeout: a turn handed a stopped sandbox fails fast.
    fx.install(
        "s",
        &MANIFEST.replace(r#""timeout_seconds": 30"#, r#""timeout_seconds": 8"#),
    );
    let sid = fx.new_session();
    let mut daemon = Daemon::start(&fx, &[]);
    let first = served_json(&fx, &daemon.socket, &sid, &["/bin/echo", "first"]);
    assert_eq!(sandbox_of(&first), "cold", "{first}");
    let cases = [
        ("stage", nix::libc::SIGKILL),
        ("pid1", nix::libc::SIGKILL),
        ("stage", nix::libc::SIGSTOP),
        ("pid1", nix::libc::SIGSTOP),
    ];
    for (n, (victim, sig)) in cases.into_iter().enumerate() {
        let what = format!("{victim} sent signal {sig}");
        wait_for("the warm sandbox", || warm_built(&fx, &sid));
        let (pid1, stage, cgroups) = warm_processes(&sid);
        let target = if victim == "stage" { stage } else { pid1 };
        signal(target, sig);
        // Dead (gone or a zombie) or stopped before the turn asks for it.
        wait_for(&what, || match proc_state(target) {
            None | Some('Z' | 'X') => sig == nix::libc::SIGKILL,
            Some('T' | 't') => sig == nix::libc::SIGSTOP,
            _ => false,
        });
        let word = format!("turn{}", n + 2);
        let out = served_turn(&fx, &daemon.socket, &sid, &["/bin/echo", &word]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{what}: {stdout}{stderr}");
        let v: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["status"], "committed", "{what}: {v}");
        assert_eq!(v["turn_number"], n + 2, "{what}: {v}");
        assert_eq!(sandbox_of(&v), "cold", "{what}: {v}");
        // In --json mode the command's stdout is forwarded to stderr (after
        // the worker's warning that it discarded the sandbox).
        assert!(stderr.lines().any(|l| l == word), "{what}: {stderr}");
        // Nothing of the discarded sandbox is left: its processes and
        // cgroups went before the turn ran.
        for pid in [pid1, stage] {
            assert!(
                proc_state(pid).is_none(),
                "{what}: pid {pid} of the discarded sandbox is still there ({:?})",
                proc_state(pid)
            );
        }
        for cg in &cgroups {
            assert!(!cg.exists(), "{what}: cgroup {} survived", cg.display());
        }
    }
    fx.assert_ledgers_intact(&sid);
    assert_eq!(daemon.stop(), Some(0));
    wait_for("the workers to go", || {
        tagged(daemon.socket.parent().unwrap()).is_empty()
    });
    assert_nothing_left(&fx, &sid);
}

/// A warm sandbox whose PID 1 or stage is stopped while it is being built
/// left the pool's builder waiting on its pipe for ever, and the session's
/// next turn, which waits for that build, with it (kill-point audit, stop
/// 54). The turn waits a bounded time, then the build's processes are
/// killed (a stopped one too) and the turn builds its own sandbox. Each
/// round stops every process of the build as soon as one is seen in its
/// cgroup; at least one round must catch the build before it parked.
#[test]
fn serve_a_warm_build_stopped_midway_does_not_hang_the_next_turn() {
    if !require_root("serve_a_warm_build_stopped_midway_does_not_hang_the_next_turn") {
        return;
    }
    let fx = Fixture::new();
    fx.install("s", MANIFEST);
    let sid = fx.new_session();
    let daemon = Daemon::start(&fx, &[]);
    let mut caught_midway = 0;
    for round in 0..5 {
        // The reply comes before the next warm sandbox's build starts.
        let v = served_json(&fx, &daemon.socket, &sid, &["/bin/true"]);
        assert_eq!(v["status"], "committed", "{v}");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut stopped: Vec<i32> = Vec::new();
        while stopped.is_empty() && Instant::now() < deadline {
            for cg in warm_cgroups(&sid) {
                for pid in std::fs::read_to_string(cg.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.parse::<i32>().ok())
                {
                    signal(pid, nix::libc::SIGSTOP);
                    stopped.push(pid);
                }
            }
        }
        assert!(!stopped.is_empty(), "round {round}: no warm build was seen");
        if !warm_built(&fx, &sid) {
            caught_midway += 1;
        }
        // The next turn ends, whatever the build was doing.
        let mut client = Command::new(supervise_bin())
            .arg("run")
            .arg("--root")
            .arg(&fx.root)
            .arg("--state-dir")
            .arg(&fx.state)
            .arg("--server")
            .arg(&daemon.socket)
            .args([
                "--package",
                "s",
                "--session",
                &sid,
                "--no-outputs",
                "--json",
            ])
            .args(["--", "/bin/echo", "next"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        while client.try_wait().unwrap().is_none() {
            if Instant::now() > until {
                let _ = client.kill();
                panic!("round {round}: the turn after a stopped warm build hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = client.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "round {round}: {stdout}");
        let v: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["status"], "committed", "{v}");
        for pid in stopped {
            assert!(
                !matches!(proc_state(pid), Some('T' | 't')),
                "round {round}: pid {pid} of the stopped build is still there, stopped"
            );
        }
    }
    assert!(
        caught_midway > 0,
        "no round stopped a build before it parked"
    );
    fx.assert_ledgers_intact(&sid);
}

/// A daemon serves one turn of `sid`, builds its warm sandbox and is
/// SIGKILLed; returns once its worker and the parked sandbox died with it,
/// with the warm sandbox's cgroup directories (still there).
fn kill9_with_a_warm_sandbox(fx: &Fixture, sid: &str) -> Vec<PathBuf> {
    let mut daemon = Daemon::start(fx, &[]);
    let dir = daemon.socket.parent().unwrap().to_path_buf();
    served_json(fx, &daemon.socket, sid, &["/bin/true"]);
    // Built whole: the answer comes before the next warm sandbox is made
    // (its lock and directory first, its cgroup, then its root).
    wait_for("the warm sandbox", || {
        warm_entries(fx, sid).len() == 2 && warm_built(fx, sid)
    });
    // Listed while the sandbox lives: once its owner is dead, another
    // test's daemon starting meanwhile may already remove them (any start
    // sweeps the warm cgroups of dead owners, host-wide).
    let cgroups = warm_cgroups(sid);
    assert!(!cgroups.is_empty(), "the warm sandbox had no cgroup");
    daemon.kill9();
    wait_for("the worker to die with the daemon", || {
        tagged(&dir).is_empty()
    });
    wait_for("the parked sandbox to die", || {
        cgroups.iter().all(|cg| {
            !cg.exists()
                || std::fs::read_to_string(cg.join("cgroup.procs"))
                    .is_ok_and(|p| p.trim().is_empty())
        })
    });
    cgroups
}

#[test]
fn serve_kill9_with_a_warm_sandbox_then_restart_removes_it_issue_14() {
    if !require_root("serve_kill9_with_a_warm_sandbox_then_restart_removes_it_issue_14") {
        return;
    }
    let fx = fixture();
    let sid = fx.new_session();
    // Its worker and the parked sandbox die with the daemon...
    let _cgroups = kill9_with_a_warm_sandbox(&fx, &sid);
    // ... and the next start removes what they left.
    let mut again = Daemon::start(&fx, &["--pool-size", "0"]);
    assert!(
        warm_entries(&fx, &sid).is_empty(),
        "{:?}",
        warm_entries(&fx, &sid)
    );
    assert_nothing_left(&fx, &sid);
    let log = std::fs::read_to_string(&again.log).unwrap();
    assert!(log.contains("warm_sandboxes_removed"), "{log}");
    // --pool-size 0: every turn builds its own; nothing waits between.
    for _ in 0..2 {
        let v = served_json(&fx, &again.socket, &sid, &["/bin/true"]);
        assert_eq!(sandbox_of(&v), "cold");
        assert!(warm_entries(&fx, &sid).is_empty());
    }
    fx.assert_ledgers_intact(&sid);
    assert_eq!(again.stop(), Some(0));
    assert_nothing_left(&fx, &sid);
}

/// Issue 29, nothing left behind when a daemon is restarted at once after
/// a SIGKILL (`Restart=always`): its worker dies with it a moment later
/// and holds its warm sandbox's lock until it has, so the new daemon's
/// start-up recovery waits for an orphaned worker's lock instead of taking
/// the sandbox for a live worker's (and leaving it to a next turn that
/// may never come). Three times, each restart right after the kill.
#[test]
fn serve_kill9_and_immediate_restart_removes_the_warm_sandbox_issue_29() {
    if !require_root("serve_kill9_and_immediate_restart_removes_the_warm_sandbox_issue_29") {
        return;
    }
    let fx = fixture();
    let sid = fx.new_session();
    for round in 0..3 {
        let mut daemon = Daemon::start(&fx, &[]);
        served_json(&fx, &daemon.socket, &sid, &["/bin/true"]);
        wait_for("the warm sandbox", || {
            warm_entries(&fx, &sid).len() == 2 && warm_built(&fx, &sid)
        });
        daemon.kill9_now();
        let mut again = Daemon::start(&fx, &["--pool-size", "0"]);
        assert!(
            warm_entries(&fx, &sid).is_empty(),
            "round {round}: {:?}\n{}",
            warm_entries(&fx, &sid),
            std::fs::read_to_string(&again.log).unwrap_or_default()
        );
        assert_eq!(again.stop(), Some(0));
        assert_nothing_left(&fx, &sid);
    }
    fx.assert_ledgers_intact(&sid);
}

/// Issue 14, nothing left behind: a SIGKILLed daemon's warm sandbox dies
/// with it, but its cgroup directories stay; the session may live in a
/// state directory nobody serves again. Any daemon's start (here one on
/// another state directory) removes the cgroups whose owner pid is dead.
#[test]
fn serve_start_removes_the_warm_cgroups_of_any_dead_daemon_issue_14() {
    if !require_root("serve_start_removes_the_warm_cgroups_of_any_dead_daemon_issue_14") {
        return;
    }
    let fx = fixture();
    let sid = fx.new_session();
    let cgroups = kill9_with_a_warm_sandbox(&fx, &sid);
    // Nobody serves `fx`'s state directory again. A daemon on another one
    // starts: after it, the dead owner's cgroups are gone (this daemon's
    // sweep, or that of another test's daemon starting meanwhile — the
    // sweep is host-wide; without it they would stay for good).
    let still_there = cgroups.iter().any(|cg| cg.exists());
    let other = fixture();
    let mut again = Daemon::start(&other, &["--pool-size", "0"]);
    let left: Vec<&PathBuf> = cgroups.iter().filter(|cg| cg.exists()).collect();
    assert!(left.is_empty(), "left: {left:?}");
    let log = std::fs::read_to_string(&again.log).unwrap();
    assert!(log.contains("dead_warm_cgroups_removed"), "{log}");
    let name = cgroups[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    if still_there && !log.contains(&name) {
        eprintln!("{name} was removed by another test's daemon");
    }
    assert_eq!(again.stop(), Some(0));
    // The dead daemon's warm sandbox directory (mounted) is still in
    // `fx`'s state directory: recovery there removes it, and nothing of
    // the test stays mounted.
    let r = supervise(&[
        "recover",
        "--root",
        fx.root.to_str().unwrap(),
        "--state-dir",
        fx.state.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let state = format!("{}/", fx.state.display());
    assert!(
        !mounts.lines().any(|l| l.contains(state.as_str())),
        "a mount under the state dir survived recovery:\n{mounts}"
    );
}

/// Issue 28 item 5: the daemon's health looks at what it depends on — a
/// bus directory removed makes it FAILED (exit 1, the reason named), the
/// socket unlinked too; restored, READY again.
#[test]
fn issue_28_daemon_health_fails_when_a_dependency_breaks() {
    if !require_root("issue_28_daemon_health_fails_when_a_dependency_breaks") {
        return;
    }
    let fx = Fixture::new();
    fx.install("b", BUS_MANIFEST);
    let busdir = tempfile::Builder::new()
        .prefix("ts-bus-")
        .tempdir()
        .unwrap();
    let bus = busdir.path().to_path_buf();
    for sub in ["input", "approvals"] {
        std::fs::create_dir_all(bus.join(sub)).unwrap();
    }
    std::fs::write(bus.join("rules.v0.1.yaml"), bus_rules(&fx.root)).unwrap();
    let busarg = bus.display().to_string();
    let daemon = Daemon::start(&fx, &["--bus", &busarg, "--metrics", "127.0.0.1:0"]);
    let health = || daemon.health();
    let level = |h: &Value, name: &str| -> String {
        h["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["level"].as_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (code, h) = health();
    assert_eq!(
        (code, h["status"].as_str()),
        (Some(0), Some("READY")),
        "{h}"
    );
    for name in ["state_dir", "cgroups", "socket", "bus", "metrics"] {
        assert_eq!(level(&h, name), "ok", "{name}: {h}");
    }
    // A bus directory the daemon moves messages through, gone.
    std::fs::remove_dir_all(bus.join("approvals")).unwrap();
    let (code, h) = health();
    assert_eq!(
        (code, h["status"].as_str()),
        (Some(1), Some("FAILED")),
        "{h}"
    );
    assert_eq!(level(&h, "bus"), "failed", "{h}");
    assert!(
        h["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().contains("approvals")),
        "{h}"
    );
    std::fs::create_dir(bus.join("approvals")).unwrap();
    let (code, h) = health();
    assert_eq!(
        (code, h["status"].as_str()),
        (Some(0), Some("READY")),
        "{h}"
    );
}

/// `supervise ARGS…` (no --state-dir unless ARGS name one).
fn supervise(args: &[&str]) -> Output {
    Command::new(supervise_bin())
        .args(args)
        .stdin(Stdio::null())
        .env_remove("TURNSTILE_LOG")
        .output()
        .unwrap()
}

#[test]
fn issue_31_run_and_health_need_only_the_socket() {
    if !require_root("issue_31_run_and_health_need_only_the_socket") {
        return;
    }
    let fx = fixture();
    let daemon = Daemon::start(&fx, &[]);
    let socket = daemon.socket.to_str().unwrap();
    let root = fx.root.to_str().unwrap();
    // No --state-dir: the daemon's own is used (the default,
    // /var/lib/turnstile, is not this daemon's).
    let r = supervise(&[
        "run",
        "--server",
        socket,
        "--root",
        root,
        "--package",
        "s",
        "--no-outputs",
        "--json",
        "--",
        "/bin/echo",
        "hi",
    ]);
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let sid = session_of(&r);
    // The turn's anchors are in the daemon's state dir: its ledgers verify
    // against it.
    fx.assert_ledgers_intact(&sid);
    // The same state dir, named, is accepted too.
    let state = fx.state.to_str().unwrap();
    let r = supervise(&[
        "run",
        "--server",
        socket,
        "--root",
        root,
        "--state-dir",
        state,
        "--package",
        "s",
        "--session",
        &sid,
        "--no-outputs",
        "--",
        "/bin/true",
    ]);
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    // health --server: the socket alone; the daemon says its state dir,
    // its version and its protocol.
    let h = supervise(&["health", "--json", "--server", socket]);
    assert_eq!(
        h.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&h.stderr)
    );
    let v: Value = serde_json::from_slice(&h.stdout).unwrap();
    assert_eq!(v["daemon"]["state_dir"], state, "{v}");
    assert_eq!(v["daemon"]["version"], env!("CARGO_PKG_VERSION"), "{v}");
    assert_eq!(v["daemon"]["protocol"], 1, "{v}");
    let h = supervise(&["health", "--server", socket]);
    let text = String::from_utf8_lossy(&h.stdout);
    assert!(text.starts_with("READY") && text.contains(state), "{text}");
    // Every raw reply carries the same.
    let mut s = UnixStream::connect(&daemon.socket).unwrap();
    s.write_all(b"{\"op\":\"health\"}\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let reply: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(reply["protocol"], 1, "{reply}");
    assert_eq!(reply["state_dir"], state, "{reply}");
    assert_eq!(
        reply["daemon_version"],
        env!("CARGO_PKG_VERSION"),
        "{reply}"
    );
}

#[test]
fn issue_31_another_state_dir_is_refused_naming_both() {
    if !require_root("issue_31_another_state_dir_is_refused_naming_both") {
        return;
    }
    let fx = fixture();
    let daemon = Daemon::start(&fx, &[]);
    let socket = daemon.socket.to_str().unwrap();
    let root = fx.root.to_str().unwrap();
    let other = tempfile::tempdir().unwrap();
    let other = other.path().to_str().unwrap();
    let before = fx.snapshot();
    for args in [
        vec![
            "run",
            "--server",
            socket,
            "--root",
            root,
            "--state-dir",
            other,
            "--package",
            "s",
            "--no-outputs",
            "--json",
            "--",
            "/bin/true",
        ],
        vec!["health", "--server", socket, "--state-dir", other, "--json"],
    ] {
        let r = supervise(&args);
        assert_eq!(r.status.code(), Some(2), "{args:?}");
        let v: Value = serde_json::from_slice(&r.stdout).unwrap();
        assert_eq!(v["error"]["field"], "state_dir", "{v}");
        assert_eq!(v["error"]["code"], "TS1006", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(other) && msg.contains(fx.state.to_str().unwrap()),
            "both state dirs not named: {msg}"
        );
    }
    assert_eq!(before, fx.snapshot(), "a refused request created something");
}

#[test]
fn issue_31_protocol_mismatch_is_ts1050_both_ways() {
    if !require_root("issue_31_protocol_mismatch_is_ts1050_both_ways") {
        return;
    }
    let fx = fixture();
    let daemon = Daemon::start(&fx, &[]);
    let before = fx.snapshot();
    // A client of another protocol version: the daemon refuses it.
    let root = fx.root.display();
    let line = format!(
        r#"{{"op":"run","protocol":999,"root":"{root}","package":"s","request":{{"command":["/bin/true"],"declared_outputs":[]}}}}"#
    );
    let mut s = UnixStream::connect(&daemon.socket).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    s.write_all(b"\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let reply: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(reply["exit_status"], 2, "{reply}");
    assert_eq!(reply["value"]["error"]["code"], "TS1050", "{reply}");
    assert_eq!(reply["value"]["error"]["field"], "protocol", "{reply}");
    assert_eq!(reply["protocol"], 1, "{reply}");
    assert!(
        reply["stderr"].as_str().unwrap().contains("version 999"),
        "{reply}"
    );
    assert_eq!(before, fx.snapshot(), "a refused request created something");
    // A daemon older than protocol versions (its reply has none): the
    // client refuses to trust its answer.
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.sock");
    let listener = std::os::unix::net::UnixListener::bind(&old).unwrap();
    let fake = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        let mut b = [0u8; 4096];
        let _ = c.read(&mut b).unwrap();
        c.write_all(b"{\"exit_status\":0,\"stdout\":\"READY\\n\"}\n")
            .unwrap();
    });
    let r = supervise(&["health", "--json", "--server", old.to_str().unwrap()]);
    fake.join().unwrap();
    assert_eq!(
        r.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let v: Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(v["error"]["code"], "TS1050", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("predates protocol versions"),
        "{v}"
    );
}

/// The checkpoints kept for `sid`: (tree size, file), oldest first.
fn kept_checkpoints(fx: &Fixture, sid: &str) -> Vec<(u64, PathBuf)> {
    let dir = fx
        .ledger(sid, "exec")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("transparency");
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let size = name
                        .strip_prefix("checkpoint-")?
                        .strip_suffix(".note")?
                        .parse()
                        .ok()?;
                    Some((size, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[test]
fn issue_30_serve_signs_checkpoints_every_n_turns_every_t_seconds_and_at_stop() {
    if !require_root("issue_30_serve_signs_checkpoints_every_n_turns_every_t_seconds_and_at_stop") {
        return;
    }
    let fx = fixture();
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("sup");
    let g = Fixture::raw(&["key", "generate", "--out", key.to_str().unwrap()]);
    assert_eq!(g.status, 0, "{}", g.stderr);
    let pubkey = format!("{}.pub", key.display());
    let inbox = keys.path().join("witness-inbox");

    // Bad input refuses the start and creates no socket.
    for (args, field) in [
        (vec!["--checkpoint-key", "/nonexistent/key"], "TS1063"),
        (
            vec![
                "--checkpoint-key",
                key.to_str().unwrap(),
                "--checkpoint-every-turns",
                "0",
            ],
            "--checkpoint-every-turns",
        ),
    ] {
        let sock = keys.path().join("refused.sock");
        let out = Command::new(supervise_bin())
            .args(["serve", "--state-dir"])
            .arg(&fx.state)
            .arg("--socket")
            .arg(&sock)
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(field), "{args:?}: {err}");
        assert!(!sock.exists());
    }

    // Every 3 turns, or 2 s after the last checkpoint with turns since.
    let mut d = Daemon::start(
        &fx,
        &[
            "--checkpoint-key",
            key.to_str().unwrap(),
            "--checkpoint-every-turns",
            "3",
            "--checkpoint-every-seconds",
            "2",
            "--checkpoint-witness",
            inbox.to_str().unwrap(),
        ],
    );
    let first = run(
        &fx,
        Some(&d.socket),
        &[
            "--package",
            "s",
            "--no-outputs",
            "--json",
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(first.status.code(), Some(0));
    let sid = session_of(&first);
    for _ in 0..2 {
        served_json(&fx, &d.socket, &sid, &["/bin/true"]);
    }
    // Every entry of both ledgers is a leaf.
    let leaves = || {
        (read_entries(&fx.ledger(&sid, "exec")).len()
            + read_entries(&fx.ledger(&sid, "evidence")).len()) as u64
    };
    // Three turns: one checkpoint covering all of them, soon.
    let after_three = leaves();
    wait_for("the 3-turn checkpoint", || {
        !kept_checkpoints(&fx, &sid).is_empty()
    });
    let kept = kept_checkpoints(&fx, &sid);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].0, after_three, "{kept:?}");
    // A fourth turn: covered by the time rule (2 s), not the turn rule.
    served_json(&fx, &d.socket, &sid, &["/bin/true"]);
    let after_four = leaves();
    wait_for("the timed checkpoint", || {
        kept_checkpoints(&fx, &sid).len() == 2
    });
    assert_eq!(kept_checkpoints(&fx, &sid)[1].0, after_four);
    // A fifth turn and a clean stop: sealed at stop.
    served_json(&fx, &d.socket, &sid, &["/bin/true"]);
    let after_five = leaves();
    assert_eq!(d.stop(), Some(0));
    let kept = kept_checkpoints(&fx, &sid);
    assert_eq!(kept.len(), 3, "{kept:?}");
    assert_eq!(kept[2].0, after_five, "{kept:?}");
    // Each verifies offline against the ledgers, and the witness got each.
    for (_, cp) in &kept {
        let r = fx.supervise(
            &["ledger", "verify"],
            &[
                "--session",
                &sid,
                "--checkpoint",
                cp.to_str().unwrap(),
                "--pubkey",
                &pubkey,
            ],
        );
        assert_eq!(r.status, 0, "{}", r.stderr);
    }
    let copies = std::fs::read_dir(&inbox).unwrap().count();
    assert_eq!(
        copies,
        kept.len(),
        "one copy per checkpoint in the witness inbox"
    );
}

/// Issue 29 (and 28 item 5): the daemon's health does not re-read the
/// served ledgers that did not change since they last verified (it re-read
/// every one, whole, on every probe: 56 ms p50 after bench-serve's load),
/// yet a ledger edited in place — same size, its mtime put back — is
/// verified again and the daemon is FAILED, naming the session.
#[test]
fn issue_29_daemon_health_skips_unchanged_ledgers_and_still_sees_tampering() {
    if !require_root("issue_29_daemon_health_skips_unchanged_ledgers_and_still_sees_tampering") {
        return;
    }
    let fx = Fixture::new();
    fx.install("s", MANIFEST);
    let daemon = Daemon::start(&fx, &[]);
    let first = run(
        &fx,
        Some(&daemon.socket),
        &[
            "--package",
            "s",
            "--no-outputs",
            "--json",
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(first.status.code(), Some(0));
    let sid = session_of(&first);
    let health = || daemon.health();
    for _ in 0..2 {
        let (code, h) = health();
        assert_eq!(
            (code, h["status"].as_str()),
            (Some(0), Some("READY")),
            "{h}"
        );
    }
    // One byte of the acknowledged exec ledger changed in place.
    let ledger = fx.ledger(&sid, "exec");
    let before = std::fs::metadata(&ledger).unwrap();
    let mut bytes = std::fs::read(&ledger).unwrap();
    let at = bytes.iter().position(|&b| b == b'"').unwrap() + 1;
    bytes[at] = if bytes[at] == b'x' { b'y' } else { b'x' };
    std::fs::write(&ledger, &bytes).unwrap();
    let f = std::fs::File::options().write(true).open(&ledger).unwrap();
    f.set_modified(before.modified().unwrap()).unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(&ledger).unwrap().len(), before.len());
    let (code, h) = health();
    assert_eq!(
        (code, h["status"].as_str()),
        (Some(1), Some("FAILED")),
        "{h}"
    );
    assert!(h.to_string().contains(&sid), "{h}");
}

/// Red-team finding (wave 3): a run request's descriptors are checked
/// before any turn begins — too many (past what one message can bring, the
/// kernel truncates: those it installed in the daemon are closed, never
/// leaked), read-only, or a directory — each answered TS1006 naming
/// `fds`; the daemon holds no more descriptors afterwards and stays READY.
#[test]
fn serve_a_requests_descriptors_are_checked_and_never_leaked() {
    if !require_root("serve_a_requests_descriptors_are_checked_and_never_leaked") {
        return;
    }
    use std::io::IoSlice;
    use std::os::fd::{AsRawFd, RawFd};
    let fx = fixture();
    let daemon = Daemon::start(&fx, &[]);
    let pid = daemon.child.as_ref().unwrap().id();
    let open_fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let root = fx.root.display().to_string();
    let line = format!(
        "{{\"op\":\"run\",\"root\":\"{root}\",\"package\":\"s\",\"request\":{{\"command\":[\"/bin/true\"],\"declared_outputs\":[]}}}}\n"
    );
    let send = |fds: &[RawFd]| -> Value {
        let s = UnixStream::connect(&daemon.socket).unwrap();
        let cmsg = [nix::sys::socket::ControlMessage::ScmRights(fds)];
        nix::sys::socket::sendmsg::<()>(
            s.as_raw_fd(),
            &[IoSlice::new(line.as_bytes())],
            &cmsg,
            nix::sys::socket::MsgFlags::empty(),
            None,
        )
        .unwrap();
        let mut out = String::new();
        (&s).read_to_string(&mut out).unwrap();
        serde_json::from_str(out.trim()).unwrap()
    };
    let null_w = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    let null_r = std::fs::File::open("/dev/null").unwrap();
    let dir = std::fs::File::open(&fx.root).unwrap();
    // Warm the daemon's own descriptors (pool threads, logs) first.
    let _ = send(&[null_w.as_raw_fd(); 3]);
    let before = open_fds();
    let many: Vec<RawFd> = vec![null_w.as_raw_fd(); 250];
    for (fds, word) in [
        (many.clone(), "more than"),
        (vec![null_w.as_raw_fd(); 20], "more than"),
        (vec![null_w.as_raw_fd(); 3], "got 3"),
        (
            vec![null_r.as_raw_fd(), null_w.as_raw_fd()],
            "not open for writing",
        ),
        (
            vec![null_w.as_raw_fd(), dir.as_raw_fd()],
            "stderr descriptor",
        ),
    ] {
        for _ in 0..3 {
            let v = send(&fds);
            assert_eq!(v["exit_status"], 2, "{} fds: {v}", fds.len());
            assert_eq!(
                v["value"]["error"]["code"],
                "TS1006",
                "{} fds: {v}",
                fds.len()
            );
            assert_eq!(
                v["value"]["error"]["field"],
                "fds",
                "{} fds: {v}",
                fds.len()
            );
            assert!(v.to_string().contains(word), "{} fds: {v}", fds.len());
        }
    }
    assert_eq!(
        open_fds(),
        before,
        "the daemon kept descriptors it was sent"
    );
    assert_eq!(daemon.health().0, Some(0));
}
