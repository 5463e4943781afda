//! `supervise run` against the real kernel (root): each test is a real turn.
//! FR-RT-003, 011, 012, 014, 015, 016 and the turn transaction: commit with
//! the right hash, block undeclared or missing writes with nothing on the
//! host, enforcement inside the sandbox (EACCES / EROFS / EPERM), limits,
//! no survivors, and ledgers that verify after every case.

use serde_json::Value;
use sha2::{Digest, Sha256};
use turnstile_tests::{Fixture, pgrep_full, read_entries, require_root};

const MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["installed/t/**", "data/**"],
    "write": ["output/<session_id>/**", "reports/<session_id>/*.md"],
    "execute": ["/usr/bin/python3", "/bin/sh", "/bin/sleep"],
    "forbidden": ["data/secret/**", "installed/t/private.txt"]
  },
  "limits": {"memory": "128Mi", "pids": 32, "timeout_seconds": 20}
}"#;

fn fixture() -> Fixture {
    let fx = Fixture::new();
    fx.install("t", MANIFEST);
    fx.write("data/users.csv", b"id,name\n1,ada\n");
    fx.write("data/secret/key.pem", b"TOPSECRET");
    fx.write("installed/t/private.txt", b"PRIVATE");
    fx.write("installed/t/ok.txt", b"fine");
    fx
}

/// Runs python code as a turn with `--json`; returns (status, json, stderr).
fn py(fx: &Fixture, session: Option<&str>, outputs: &[&str], code: &str) -> (i32, Value, String) {
    let mut args: Vec<String> = vec!["--json".into()];
    if let Some(s) = session {
        args.extend(["--session".into(), s.into()]);
    }
    if outputs.is_empty() {
        args.push("--no-outputs".into());
    }
    for o in outputs {
        args.extend(["--output".into(), (*o).into()]);
    }
    args.extend([
        "--".into(),
        "/usr/bin/python3".into(),
        "-c".into(),
        code.into(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = fx.run("t", &refs);
    let v = r.json();
    (r.status, v, r.stderr)
}

fn sid(v: &Value) -> String {
    v["session_id"].as_str().unwrap().to_owned()
}

#[test]
fn fr_rt_015_declared_output_commits_with_the_right_hash() {
    if !require_root("fr_rt_015_declared_output_commits_with_the_right_hash") {
        return;
    }
    let fx = fixture();
    let code = "import os; open(f'output/{os.environ[\"TURNSTILE_SESSION_ID\"]}/r.md','w').write('hello\\n')";
    let (status, v, stderr) = py(&fx, None, &["output/<session_id>/r.md:report"], code);
    assert_eq!(status, 0, "{v}\n{stderr}");
    assert_eq!(v["status"], "committed");
    let s = sid(&v);
    let path = fx.root.join("output").join(&s).join("r.md");
    assert_eq!(std::fs::read(&path).unwrap(), b"hello\n");
    let want = hex::encode(Sha256::digest(b"hello\n"));
    assert_eq!(v["committed"][0]["sha256"], want.as_str());
    assert_eq!(v["realized_writes"][0]["sha256"], want.as_str());
    assert_eq!(v["realized_writes"][0]["kind"], "file");
    // FR-RT-015: the evidence records path, size and hash.
    let ev = read_entries(&fx.ledger(&s, "evidence"));
    let last = ev.last().unwrap();
    assert_eq!(
        last["realized_writes"][0]["path"],
        format!("output/{s}/r.md")
    );
    assert_eq!(last["realized_writes"][0]["size"], 6);
    assert_eq!(last["committed"][0]["sha256"], want.as_str());
    turnstile_tests::assert_landlock_as_strong_as_the_kernel_allows(&last["enforcement"]);
    assert!(last["enforcement"]["cgroup"].as_str().is_some());
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o644, "modes are normalised");
    fx.assert_ledgers_intact(&s);
}

#[test]
fn fr_rt_016_undeclared_write_blocks_and_nothing_reaches_the_host() {
    if !require_root("fr_rt_016_undeclared_write_blocks_and_nothing_reaches_the_host") {
        return;
    }
    let fx = fixture();
    let code = "import os; s=os.environ['TURNSTILE_SESSION_ID']; open(f'output/{s}/r.md','w').write('a'); open(f'output/{s}/extra.txt','w').write('b')";
    let (status, v, _) = py(&fx, None, &["output/<session_id>/r.md:report"], code);
    assert_eq!(status, 12, "{v}");
    assert_eq!(v["status"], "blocked");
    let s = sid(&v);
    assert_eq!(
        std::fs::read_dir(fx.root.join("output").join(&s))
            .unwrap()
            .count(),
        0,
        "nothing committed"
    );
    // FR-RT-011: the violation names operation, capability, session, turn, time.
    let viol = &v["violations"][0];
    assert_eq!(viol["attempted_operation"], "write");
    assert_eq!(viol["target"], format!("output/{s}/extra.txt"));
    assert_eq!(viol["violated_capability"]["kind"], "undeclared_write");
    assert_eq!(viol["session_id"], s.as_str());
    assert_eq!(viol["turn_number"], 1);
    assert!(viol["timestamp"].as_str().unwrap().ends_with('Z'));
    let ev = read_entries(&fx.ledger(&s, "evidence"));
    assert_eq!(
        ev.last().unwrap()["violations"][0]["target"],
        format!("output/{s}/extra.txt")
    );
    fx.assert_ledgers_intact(&s);
}

#[test]
fn fr_rt_016_missing_declared_output_blocks() {
    if !require_root("fr_rt_016_missing_declared_output_blocks") {
        return;
    }
    let fx = fixture();
    let (status, v, _) = py(&fx, None, &["output/<session_id>/never.md:report"], "pass");
    assert_eq!(status, 12, "{v}");
    assert_eq!(
        v["violations"][0]["violated_capability"]["kind"],
        "missing_declared_output"
    );
    fx.assert_ledgers_intact(&sid(&v));
}

#[test]
fn fr_rt_016_symlink_as_output_never_commits() {
    if !require_root("fr_rt_016_symlink_as_output_never_commits") {
        return;
    }
    let fx = fixture();
    let code = "import os; s=os.environ['TURNSTILE_SESSION_ID']; os.symlink('/etc/passwd', f'output/{s}/r.md')";
    let (status, v, _) = py(&fx, None, &["output/<session_id>/r.md:report"], code);
    assert_eq!(status, 12, "{v}");
    let s = sid(&v);
    assert!(
        fx.root
            .join("output")
            .join(&s)
            .join("r.md")
            .symlink_metadata()
            .is_err()
    );
    fx.assert_ledgers_intact(&s);
}

/// Probes run inside one turn, each printing `label errno-name` or `label OK`.
const PROBES: &str = r#"
import errno, os, ctypes
def attempt(label, fn):
    try:
        fn(); print(label, "OK")
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, e.errno))
s = os.environ["TURNSTILE_SESSION_ID"]
attempt("read_allowed", lambda: open("data/users.csv").read())
attempt("read_forbidden_in_allowed_tree", lambda: open("data/secret/key.pem").read())
attempt("read_forbidden_file", lambda: open("installed/t/private.txt").read())
attempt("read_sibling_of_forbidden", lambda: open("installed/t/ok.txt").read())
attempt("read_ungranted", lambda: open("installed/t/../../etc/hostname").read())
attempt("read_ledger", lambda: os.listdir("planes"))
attempt("write_workspace", lambda: open("data/new.txt", "w"))
attempt("write_root_tmp", lambda: open("/tmp/x", "w"))
attempt("write_usr", lambda: open("/usr/x", "w"))
attempt("write_scratch", lambda: open(os.environ["TMPDIR"] + "/scratch.txt", "w").write("s"))
attempt("exec_ungranted", lambda: os.execv("/usr/bin/id", ["id"]))
libc = ctypes.CDLL(None, use_errno=True)
def sys(label, nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    print(label, "OK" if r >= 0 else errno.errorcode.get(ctypes.get_errno()))
sys("unshare_user", 272, 0x10000000)
sys("mount", 165, 0, 0, 0, 0, 0)
sys("ptrace", 101, 16, 1, 0, 0)
sys("ioctl_tiocsti_high_bits", 16, 0, (1 << 32) | 0x5412, 0)
sys("clone3", 435, 0, 0)
print("TMPDIR", os.environ.get("TMPDIR"), os.environ.get("TEMP"), os.environ.get("TMP"))
print("PYTHONDONTWRITEBYTECODE", os.environ.get("PYTHONDONTWRITEBYTECODE"))
print("uid", os.getuid(), os.getgid())
print("fds", sorted(int(f) for f in os.listdir("/proc/self/fd")))
"#;

#[test]
fn fr_rt_003_fr_rt_012_fr_rt_014_enforcement_inside_the_sandbox() {
    if !require_root("fr_rt_003_fr_rt_012_fr_rt_014_enforcement_inside_the_sandbox") {
        return;
    }
    let fx = fixture();
    let r = fx.run(
        "t",
        &["--no-outputs", "--", "/usr/bin/python3", "-c", PROBES],
    );
    assert_eq!(r.status, 0, "{}\n{}", r.stdout, r.stderr);
    let out: std::collections::HashMap<&str, String> = r
        .stdout
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(k, v)| (k, v.to_owned())))
        .collect();
    let expect = [
        ("read_allowed", "OK"),
        ("read_forbidden_in_allowed_tree", "EACCES"),
        ("read_forbidden_file", "EACCES"),
        ("read_sibling_of_forbidden", "OK"),
        // Not granted, so not in the view at all (issue 9).
        ("read_ledger", "ENOENT"),
        ("write_workspace", "EROFS"),
        ("write_root_tmp", "EROFS"),
        ("write_usr", "EROFS"),
        ("write_scratch", "OK"),
        ("exec_ungranted", "EACCES"),
        ("unshare_user", "EPERM"),
        ("mount", "EPERM"),
        ("ptrace", "EPERM"),
        ("ioctl_tiocsti_high_bits", "EPERM"),
        ("clone3", "ENOSYS"),
    ];
    for (probe, want) in expect {
        assert_eq!(
            out.get(probe).map(String::as_str),
            Some(want),
            "probe {probe}:\n{}",
            r.stdout
        );
    }
    assert!(out["read_ungranted"] != "OK", "{}", r.stdout);
    let sid = r
        .stderr
        .split_whitespace()
        .find(|w| w.starts_with("SES-"))
        .unwrap()
        .trim_end_matches(':')
        .to_owned();
    let scratch = fx.root.join("tmp").join(&sid);
    let scratch_s = scratch.display().to_string();
    // FR-RT-014: TMPDIR, TEMP and TMP all point at tmp/<sid>/.
    assert_eq!(
        out["TMPDIR"],
        format!("{scratch_s} {scratch_s} {scratch_s}")
    );
    assert_eq!(out["PYTHONDONTWRITEBYTECODE"], "1");
    assert_eq!(out["uid"], "65534 65534");
    // The command's own descriptors are 0, 1, 2 (3 is listdir's own).
    assert_eq!(out["fds"], "[0, 1, 2, 3]");
    // FR-RT-012: the committed turn's scratch delta lands in tmp/<sid>/.
    assert_eq!(std::fs::read(scratch.join("scratch.txt")).unwrap(), b"s");
    fx.assert_ledgers_intact(&sid);
}

#[test]
fn fr_rt_012_scratch_carries_over_only_from_committed_turns() {
    if !require_root("fr_rt_012_scratch_carries_over_only_from_committed_turns") {
        return;
    }
    let fx = fixture();
    let write = |name: &str, exit: i32| {
        format!(
            "import os; open(os.environ['TMPDIR']+'/{name}','w').write('x'); raise SystemExit({exit})"
        )
    };
    let (status, v, _) = py(&fx, None, &[], &write("kept", 0));
    assert_eq!(status, 0, "{v}");
    let s = sid(&v);
    let (status, v2, _) = py(&fx, Some(&s), &[], &write("dropped", 3));
    assert_eq!(status, 10, "{v2}");
    assert_eq!(v2["turn_number"], 2);
    assert_eq!(v2["exit_code"], 3);
    assert_eq!(v2["termination"]["exited"], 3);
    let scratch = fx.root.join("tmp").join(&s);
    assert!(scratch.join("kept").exists());
    assert!(
        !scratch.join("dropped").exists(),
        "a failed turn's scratch must not carry over"
    );
    // The next turn sees (and may change) the committed scratch.
    let (status, v3, _) = py(
        &fx,
        Some(&s),
        &[],
        "import os; p=os.environ['TMPDIR']+'/kept'; assert open(p).read()=='x'; open(p,'w').write('y')",
    );
    assert_eq!(status, 0, "{v3}");
    assert_eq!(std::fs::read(scratch.join("kept")).unwrap(), b"y");
    fx.assert_ledgers_intact(&s);
}

#[test]
fn write_pattern_scopes_commit_declared_files() {
    if !require_root("write_pattern_scopes_commit_declared_files") {
        return;
    }
    let fx = fixture();
    let code =
        "import os; s=os.environ['TURNSTILE_SESSION_ID']; open(f'reports/{s}/a.md','w').write('A')";
    let (status, v, stderr) = py(&fx, None, &["reports/<session_id>/a.md:summary"], code);
    assert_eq!(status, 0, "{v}\n{stderr}");
    let s = sid(&v);
    assert_eq!(
        std::fs::read(fx.root.join("reports").join(&s).join("a.md")).unwrap(),
        b"A"
    );
}

#[test]
fn memory_limit_kills_with_exit_13() {
    if !require_root("memory_limit_kills_with_exit_13") {
        return;
    }
    let fx = fixture();
    let (status, v, _) = py(&fx, None, &[], "x = bytearray(400 * 1024 * 1024)");
    assert_eq!(status, 13, "{v}");
    assert_eq!(v["status"], "memory_limit");
    assert_eq!(v["error"]["code"], "E2071");
    assert!(v["resources"]["peak_memory_bytes"].as_u64().unwrap() > 64 << 20);
    fx.assert_ledgers_intact(&sid(&v));
}

/// `limits.cpu` is a quota (v1 cfs_quota_us, v2 cpu.max): a turn that
/// spins for 1.5 s at 200m gets about a fifth of the time it asks for, and
/// the cgroup's accounting (v2 cpu.stat) says so.
#[test]
fn cpu_quota_caps_a_busy_turn() {
    if !require_root("cpu_quota_caps_a_busy_turn") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "t",
        r#"{"capabilities": {"execute": ["/usr/bin/python3"]},
            "limits": {"cpu": "200m", "timeout_seconds": 60}}"#,
    );
    let (status, v, stderr) = py(
        &fx,
        None,
        &[],
        "import time
t = time.monotonic()
while time.monotonic() - t < 1.5: pass",
    );
    assert_eq!(status, 0, "{stderr}");
    let used = v["resources"]["cpu_usage_us"].as_u64().unwrap();
    let wall_us = (v["durations"]["wall_ms"].as_f64().unwrap() * 1000.0) as u64;
    assert!(used > 0, "{v}");
    // 20% of the wall time, with room for one period's burst and the
    // accounting granularity; unthrottled it would be most of the wall.
    assert!(
        used <= wall_us * 3 / 10 + 100_000,
        "cpu {used} us in {wall_us} us of wall time at 200m: {v}"
    );
    fx.assert_ledgers_intact(&sid(&v));
}

#[test]
fn pids_limit_refuses_forks_with_exit_13() {
    if !require_root("pids_limit_refuses_forks_with_exit_13") {
        return;
    }
    let fx = fixture();
    let r = fx.run(
        "t",
        &[
            "--json",
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            "i=0; while [ $i -lt 100 ]; do /bin/sleep 5 & i=$((i+1)); done; wait",
        ],
    );
    assert_eq!(r.status, 13, "{}", r.stdout);
    let v = r.json();
    assert_eq!(v["status"], "pids_limit");
    assert_eq!(v["error"]["code"], "TS1020");
    fx.assert_ledgers_intact(&sid(&v));
}

#[test]
fn background_processes_are_gone_when_run_returns() {
    if !require_root("background_processes_are_gone_when_run_returns") {
        return;
    }
    let fx = fixture();
    let marker = format!("{}", 4000 + std::process::id() % 1000);
    let r = fx.run(
        "t",
        &[
            "--json",
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            &format!("/bin/sleep {marker} & (/bin/sleep {marker} &) ; echo ok"),
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let survivors = pgrep_full(&format!("sleep {marker}"));
    assert!(survivors.is_empty(), "survivors: {survivors:?}");
    fx.assert_ledgers_intact(&sid(&r.json()));
}

/// Issue 29: PID 1 ends the turn itself (kills and reaps every other
/// process of its namespace, then says so) and the supervisor captures
/// while PID 1's own exit runs. A writer left in the background, appending
/// to a declared output as fast as it can, is dead before the capture: the
/// committed file's bytes are the ones its recorded hash names, and stay
/// so; no process of the turn is left.
#[test]
fn issue_29_a_background_writer_is_gone_before_the_capture() {
    if !require_root("issue_29_a_background_writer_is_gone_before_the_capture") {
        return;
    }
    let fx = fixture();
    let marker = format!("late-writer-{}", std::process::id());
    let r = fx.run(
        "t",
        &[
            "--json",
            "--output",
            "output/<session_id>/late.txt:log",
            "--",
            "/bin/sh",
            "-c",
            "i=0; while :; do echo $i >> output/$TURNSTILE_SESSION_ID/late.txt; i=$((i+1)); done & /bin/sleep 0.2; exit 0",
            &marker,
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let v = r.json();
    assert_eq!(v["status"], "committed", "{v}");
    let committed = &v["committed"][0];
    let path = fx.root.join(committed["path"].as_str().unwrap());
    let hash = || hex::encode(Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(hash(), committed["sha256"].as_str().unwrap(), "{v}");
    assert!(committed["size"].as_u64().unwrap() > 0, "{v}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(
        hash(),
        committed["sha256"].as_str().unwrap(),
        "written after the capture"
    );
    let survivors = pgrep_full(&marker);
    assert!(survivors.is_empty(), "survivors: {survivors:?}");
    fx.assert_ledgers_intact(&sid(&v));
}

#[test]
fn timeout_exits_14() {
    if !require_root("timeout_exits_14") {
        return;
    }
    let fx = fixture();
    let r = fx.run(
        "t",
        &[
            "--json",
            "--timeout",
            "1",
            "--no-outputs",
            "--",
            "/bin/sleep",
            "30",
        ],
    );
    assert_eq!(r.status, 14, "{}", r.stdout);
    assert_eq!(r.json()["error"]["code"], "E2002");
    fx.assert_ledgers_intact(&sid(&r.json()));
}

#[test]
fn fr_rt_007_failing_setup_still_writes_evidence() {
    if !require_root("fr_rt_007_failing_setup_still_writes_evidence") {
        return;
    }
    let fx = fixture();
    let sid = fx.new_session();
    let mut cmd = std::process::Command::new(turnstile_tests::supervise_bin());
    cmd.args(["run", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args([
            "--package",
            "t",
            "--session",
            &sid,
            "--json",
            "--no-outputs",
            "--",
            "/bin/sleep",
            "0",
        ])
        .env("TURNSTILE_CGROUP_ROOT", "/nonexistent-cgroupfs");
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(20),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "E2041");
    let exec = read_entries(&fx.ledger(&sid, "exec"));
    let events: Vec<&str> = exec.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["session.started", "turn.started", "turn.finished"]);
    assert_eq!(exec[2]["status"], "sandbox_error");
    let ev = read_entries(&fx.ledger(&sid, "evidence"));
    assert_eq!(ev.last().unwrap()["status"], "sandbox_error");
    assert_eq!(ev.last().unwrap()["turn_number"], 1);
    fx.assert_ledgers_intact(&sid);
}

#[test]
fn fr_rt_011_pre_execution_violation_is_recorded_and_nothing_runs() {
    if !require_root("fr_rt_011_pre_execution_violation_is_recorded_and_nothing_runs") {
        return;
    }
    let fx = fixture();
    let r = fx.run("t", &["--json", "--no-outputs", "--", "/usr/bin/id"]);
    assert_eq!(r.status, 11, "{}", r.stdout);
    let v = r.json();
    assert_eq!(v["status"], "violation");
    let s = sid(&v);
    let ev = read_entries(&fx.ledger(&s, "evidence"));
    assert_eq!(
        ev.last().unwrap()["violations"][0]["attempted_operation"],
        "execute"
    );
    fx.assert_ledgers_intact(&s);
}

#[test]
fn turns_of_one_session_are_numbered_sequentially() {
    if !require_root("turns_of_one_session_are_numbered_sequentially") {
        return;
    }
    let fx = fixture();
    let s = fx.new_session();
    for n in 1..=3 {
        let (status, v, _) = py(&fx, Some(&s), &[], "pass");
        assert_eq!(status, 0);
        assert_eq!(v["turn_number"], n);
    }
    fx.assert_ledgers_intact(&s);
}

#[test]
fn x32_syscall_numbers_kill_the_process() {
    if !require_root("x32_syscall_numbers_kill_the_process") {
        return;
    }
    let fx = fixture();
    // getpid with the x32 bit set: the native-only filter's bad-arch action.
    let (status, v, _) = py(
        &fx,
        None,
        &[],
        "import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 39); print('survived')",
    );
    assert_eq!(status, 10, "{v}");
    assert_eq!(v["status"], "command_failed");
    let s = sid(&v);
    let ev = read_entries(&fx.ledger(&s, "evidence"));
    let last = ev.last().unwrap();
    assert_eq!(last["status"], "command_failed");
    assert_eq!(last["termination"]["signal"], "SIGSYS", "{last}");
    assert_eq!(v["termination"]["signal"], "SIGSYS");
    fx.assert_ledgers_intact(&s);
}

#[test]
fn sessions_run_concurrently_and_stay_separate() {
    if !require_root("sessions_run_concurrently_and_stay_separate") {
        return;
    }
    let fx = fixture();
    let results: Vec<(i32, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let fx = &fx;
                scope.spawn(move || {
                    let code = format!("import os; open(f'output/{{os.environ[\"TURNSTILE_SESSION_ID\"]}}/r.md','w').write('{i}')");
                    let (status, v, _) = py(fx, None, &["output/<session_id>/r.md:report"], &code);
                    (status, v)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut sessions = std::collections::HashSet::new();
    for (status, v) in &results {
        assert_eq!(*status, 0, "{v}");
        let s = sid(v);
        assert!(sessions.insert(s.clone()));
        fx.assert_ledgers_intact(&s);
    }
    let contents: std::collections::HashSet<String> = sessions
        .iter()
        .map(|s| std::fs::read_to_string(fx.root.join("output").join(s).join("r.md")).unwrap())
        .collect();
    assert_eq!(contents.len(), 4, "each session committed its own output");
}

#[test]
fn unavailable_runtime_is_e2040_never_a_silent_fallback() {
    let fx = fixture();
    let r = fx.run(
        "t",
        &[
            "--json",
            "--backend",
            "kata",
            "--no-outputs",
            "--",
            "/bin/sleep",
            "0",
        ],
    );
    assert_eq!(r.status, 20, "{}", r.stdout);
    assert_eq!(r.json()["error"]["code"], "E2040");
    let r = fx.run(
        "t",
        &[
            "--json",
            "--backend",
            "docker",
            "--no-outputs",
            "--",
            "/bin/sleep",
            "0",
        ],
    );
    assert_eq!(r.status, 2);
    assert_eq!(r.json()["error"]["field"], "--backend");
}

#[test]
fn allow_egress_is_refused_not_silently_isolated() {
    if !require_root("allow_egress_is_refused_not_silently_isolated") {
        return;
    }
    // Enforced on native, runc and crun (tests/tests/network.rs); runsc
    // enforces it only on hostinet, which gives up gVisor's netstack: a
    // manifest that does not accept that (`allow_degraded:
    // gvisor_netstack`) is refused (TS1070), the field named.
    let fx = fixture();
    fx.install(
        "net",
        r#"{"capabilities":{"execute":["/bin/sleep"]},"network":"allow_egress"}"#,
    );
    let r = fx.run(
        "net",
        &[
            "--backend",
            "runsc",
            "--json",
            "--no-outputs",
            "--",
            "/bin/sleep",
            "0",
        ],
    );
    if r.json()["error"]["code"] == "E2040" {
        return; // runsc is not installed
    }
    assert_eq!(r.status, 20, "{}", r.stdout);
    let v = r.json();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("allow_egress"),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"gvisor_netstack\" to the manifest's `allow_degraded`"),
        "{v}"
    );
    assert_eq!(v["error"]["code"], "TS1070", "{v}");
}

#[test]
fn issue_9_dev_shm_and_tmp_writes_are_recorded_in_the_evidence_and_discarded() {
    if !require_root("issue_9_dev_shm_and_tmp_writes_are_recorded_in_the_evidence_and_discarded") {
        return;
    }
    // A workspace outside /tmp (as a home directory is): /tmp is then a
    // private writable tmpfs, for programs that ignore TMPDIR.
    let home = tempfile::Builder::new()
        .prefix("ts-home-")
        .tempdir_in("/var/lib")
        .unwrap();
    let root = home.path().join("ws");
    let state = home.path().join("state");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir_all(root.join("installed/t")).unwrap();
    std::fs::write(
        root.join("installed/t/manifest.json"),
        turnstile_tests::for_this_kernel(MANIFEST),
    )
    .unwrap();
    let run = |session: Option<&str>, code: &str| {
        let mut cmd = std::process::Command::new(turnstile_tests::supervise_bin());
        cmd.args(["run", "--json", "--no-outputs", "--package", "t", "--root"])
            .arg(&root)
            .arg("--state-dir")
            .arg(&state);
        if let Some(s) = session {
            cmd.args(["--session", s]);
        }
        let out = cmd
            .args(["--", "/usr/bin/python3", "-c", code])
            .output()
            .unwrap();
        (
            out.status.code(),
            serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (status, v, stderr) = run(
        None,
        "import ctypes\nopen('/dev/shm/seg', 'w').write('hidden')\nopen('/tmp/t.txt', 'w').write('tmp')\nlibc = ctypes.CDLL(None); libc.tmpfile.restype = ctypes.c_void_p\nassert libc.tmpfile()",
    );
    assert_eq!(status, Some(0), "{stderr}");
    let s = sid(&v);
    let evidence =
        read_entries(&root.join(format!("planes/ho1/sessions/{s}/ledger/evidence.jsonl")));
    let eph = &evidence.last().unwrap()["ephemeral_writes"];
    let shm = &eph["/dev/shm"]["files"][0];
    assert_eq!(shm["path"], "/dev/shm/seg", "{eph}");
    assert_eq!(shm["bytes"], 6);
    assert_eq!(
        shm["sha256"],
        hex::encode(Sha256::digest(b"hidden")),
        "{eph}"
    );
    assert_eq!(eph["/tmp"]["files"][0]["path"], "/tmp/t.txt", "{eph}");
    // Discarded: the next turn's /dev/shm and /tmp are empty.
    let (status, _, stderr) = run(
        Some(&s),
        "import os; assert os.listdir('/dev/shm') == [] and os.listdir('/tmp') == [], (os.listdir('/dev/shm'), os.listdir('/tmp'))",
    );
    assert_eq!(status, Some(0), "{stderr}");
}

#[test]
fn issue_9_a_0700_workspace_with_a_0600_granted_file_works_as_uid_65534() {
    if !require_root("issue_9_a_0700_workspace_with_a_0600_granted_file_works_as_uid_65534") {
        return;
    }
    let fx = fixture();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fx.root, std::fs::Permissions::from_mode(0o700)).unwrap();
    let f = fx.root.join("data/users.csv");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (status, v, stderr) = py(
        &fx,
        None,
        &["output/<session_id>/copy.csv:result"],
        "import os, shutil\nassert os.getuid() == 65534 and os.geteuid() == 65534\nshutil.copy('data/users.csv', os.environ['TMPDIR'] + '/../../output/' + os.environ['TURNSTILE_SESSION_ID'] + '/copy.csv')",
    );
    assert_eq!(status, 0, "{stderr}\n{v}");
    let s = sid(&v);
    let out = fx.root.join("output").join(&s).join("copy.csv");
    assert_eq!(std::fs::read(&out).unwrap(), b"id,name\n1,ada\n");
    // Committed outputs belong to the workspace's owner.
    use std::os::unix::fs::MetadataExt;
    let (m, r) = (
        std::fs::metadata(&out).unwrap(),
        std::fs::metadata(&fx.root).unwrap(),
    );
    assert_eq!((m.uid(), m.gid()), (r.uid(), r.gid()));
    fx.assert_ledgers_intact(&s);
}

/// The command's stage reports a failed execve after seccomp is loaded (the
/// report must survive the seccomp listener being parked: they once shared
/// a descriptor number and the report was silently lost).
#[test]
fn fr_rt_007_a_failed_exec_is_reported_with_its_errno_and_landlock_outcome() {
    if !require_root("fr_rt_007_a_failed_exec_is_reported_with_its_errno_and_landlock_outcome") {
        return;
    }
    let fx = fixture();
    fx.write("installed/t/not-executable.sh", b"#!/bin/sh\necho hi\n");
    // A glob entry: a literal one naming a file without an execute bit is
    // refused at load (it grants nothing), a glob matches what exists at
    // run time.
    let manifest = MANIFEST.replace(
        r#""execute": ["/usr/bin/python3","#,
        r#""execute": ["installed/t/*.sh", "/usr/bin/python3","#,
    );
    assert_ne!(manifest, MANIFEST, "the manifest fixture changed");
    fx.install("t", &manifest);
    let r = fx.run(
        "t",
        &[
            "--json",
            "--no-outputs",
            "--",
            "installed/t/not-executable.sh",
        ],
    );
    let v = r.json();
    assert_eq!(v["termination"]["errno"], 13, "{v}\n{}", r.stderr);
    assert_eq!(v["termination"]["exec_failed"], "Permission denied");
    turnstile_tests::assert_landlock_as_strong_as_the_kernel_allows(&v["enforcement"]);
    fx.assert_ledgers_intact(v["session_id"].as_str().unwrap());
}

/// A workspace whose path holds `:` and `,` (which overlay options cannot
/// carry) works natively: every layer is named by a descriptor.
#[test]
fn fr_rt_015_a_workspace_path_with_colon_and_comma_commits() {
    if !require_root("fr_rt_015_a_workspace_path_with_colon_and_comma_commits") {
        return;
    }
    let base = tempfile::Builder::new()
        .prefix("ts-odd-")
        .tempdir()
        .unwrap();
    let root = base.path().join("ws:odd,name");
    std::fs::create_dir_all(root.join("installed/t")).unwrap();
    std::fs::write(
        root.join("installed/t/manifest.json"),
        turnstile_tests::for_this_kernel(MANIFEST),
    )
    .unwrap();
    let out = std::process::Command::new(turnstile_tests::supervise_bin())
        .args(["run", "--json", "--package", "t", "--root"])
        .arg(&root)
        .arg("--state-dir")
        .arg(base.path().join("state"))
        .args([
            "--output",
            "output/<session_id>/r.md:report",
            "--",
            "/bin/sh",
            "-c",
        ])
        .arg("echo ok > output/$TURNSTILE_SESSION_ID/r.md")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = root.join("output").join(sid(&v)).join("r.md");
    assert_eq!(std::fs::read(r).unwrap(), b"ok\n");
}

/// Issue 26's manifest contract, failing closed: `egress` entries are
/// validated at load (the entry named), `isolated` with `egress` is a
/// manifest error, and a `/udp` range too wide to relay is refused before
/// anything runs — never run with another network.
#[test]
fn issue_26_network_policies_are_validated_and_refused_until_enforced() {
    let fx = Fixture::new();
    let manifest = |network: &str, egress: &str| {
        format!(
            r#"{{"capabilities": {{"execute": ["/bin/true"]}}, "network": "{network}", "egress": {egress}}}"#
        )
    };
    for (pkg, network, egress, field) in [
        ("iso", "isolated", r#"["pypi.org:443"]"#, "egress"),
        ("noport", "restricted", r#"["pypi.org"]"#, "egress[0]"),
        (
            "star",
            "restricted",
            r#"["pypi.org:443", "*:443"]"#,
            "egress[1]",
        ),
        ("empty", "restricted", "[]", "egress"),
    ] {
        fx.install_exact(pkg, &manifest(network, egress));
        let before = fx.snapshot();
        let r = fx.run(pkg, &["--json", "--no-outputs", "--", "/bin/true"]);
        assert_eq!(r.status, 2, "{pkg}: {}{}", r.stdout, r.stderr);
        let v = r.json();
        assert!(
            v["error"]["field"]
                .as_str()
                .unwrap_or_default()
                .ends_with(field),
            "{pkg}: {v}"
        );
        assert_eq!(before, fx.snapshot(), "{pkg}: something was created");
    }
    if !require_root("issue_26_network_policies_are_validated_and_refused_until_enforced") {
        return;
    }
    // `/udp` entries are enforced now (relayed port by port): a turn runs
    // under its own policy, and a range too wide to relay is refused at
    // load, the entry named, nothing run (TS1075, exit 2).
    for (pkg, network) in [("restricted", "restricted"), ("egress", "allow_egress")] {
        fx.install(pkg, &manifest(network, r#"["pypi.org:443/udp"]"#));
        let r = fx.run(pkg, &["--json", "--no-outputs", "--", "/bin/true"]);
        // A kernel without nftables (the VM's minimal image) refuses it
        // before the command runs (exit 20, nftables named): never another
        // network.
        if r.status == 20 {
            assert!(r.stdout.contains("nft"), "{pkg}: {}", r.stdout);
        } else {
            assert_eq!(r.status, 0, "{pkg}: {}{}", r.stdout, r.stderr);
        }
        let wide = format!("{pkg}-wide");
        fx.install(&wide, &manifest(network, r#"["pypi.org:1000-2000/udp"]"#));
        let before = fx.snapshot();
        let r = fx.run(&wide, &["--json", "--no-outputs", "--", "/bin/true"]);
        assert_eq!(r.status, 2, "{wide}: {}{}", r.stdout, r.stderr);
        assert_eq!(r.json()["error"]["code"], "TS1075", "{wide}: {}", r.stdout);
        assert_eq!(before, fx.snapshot(), "{wide}: something was created");
    }
}

/// The children of every thread of `pid` (`/proc/PID/task/*/children`).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The executable behind the sandbox init of a running `supervise run`:
/// its child's `/proc/PID/exe`, once that child has executed the init.
/// The file the sandbox init of `supervise`'s turn runs from, as (device,
/// inode): its `exe` link's path depends on when it is read (the host's,
/// or under `/.oldroot` between the init's pivot and the old root's
/// detach), the file it opens does not.
fn init_exe_of(supervise: u32) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    for _ in 0..500 {
        for c in children_of(supervise) {
            // Its arguments once it executed the init (before, a fork of
            // supervise: supervise's).
            let argv = std::fs::read(format!("/proc/{c}/cmdline")).unwrap_or_default();
            if argv == b"turnstile-init\0__sandbox-init\0" {
                if let Ok(m) = std::fs::metadata(format!("/proc/{c}/exe")) {
                    return Some((m.dev(), m.ino()));
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    None
}

/// Every path of the turn's Landlock rules is opened (O_PATH) and ruled,
/// devices included: none is skipped. Built for musl, the init once lost
/// `/dev/tty`'s rule (std's open drops O_PATH there, so the device was
/// opened for real and refused it); the red team's
/// `controlling_tty_absent` then saw EACCES instead of ENXIO.
#[test]
fn issue_29_the_static_init_rules_every_landlock_path_devices_included() {
    if !require_root("issue_29_the_static_init_rules_every_landlock_path_devices_included") {
        return;
    }
    let fx = fixture();
    let out = fx
        .command(
            &turnstile_tests::supervise_bin(),
            &["run"],
            &[
                "--package",
                "t",
                "--no-outputs",
                "--json",
                "--",
                "/bin/sleep",
                "0",
            ],
        )
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let landlock = &v["enforcement"]["landlock"];
    assert_eq!(landlock["skipped"], serde_json::json!([]), "{landlock}");
    // Fully enforced where the kernel has every right the Plan asks for;
    // partially (the rights it lacks listed) on older ABIs (6.1: ABI 2).
    let unenforced = landlock["unenforced"].as_array().map_or(0, Vec::len);
    let want = if unenforced == 0 {
        "fully_enforced"
    } else {
        "partially_enforced"
    };
    assert_eq!(landlock["status"], want, "{landlock}");
}

/// A `turnstile-init` from other sources than the `supervise` that starts
/// it (a stale binary left beside a rebuilt one) refuses to run: the build
/// id `supervise` hands it must be its own. The refusal is reported in the
/// turn directory with its stage, exit 125 (the init's setup failure,
/// which fails the turn closed); with the right id it goes on (and here
/// stops at the missing plan).
#[test]
fn issue_29_an_init_from_another_build_refuses_the_turn() {
    use turnstile_supervisor::sandbox::initbin::{BUILD_ENV, BUILD_ID};
    let beside = turnstile_tests::supervise_bin()
        .parent()
        .unwrap()
        .join("turnstile-init");
    assert!(
        beside.is_file(),
        "{} is not built (`cargo xtask test` builds it beside supervise)",
        beside.display()
    );
    for (build, stage) in [
        (Some("0000000000000000"), "init build"),
        (None, "init build"),
        (Some(BUILD_ID), "read plan"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new(&beside);
        cmd.arg("__sandbox-init")
            .env_clear()
            .env("TURNSTILE_TURN_DIR", dir.path());
        if let Some(b) = build {
            cmd.env(BUILD_ENV, b);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(125), "build {build:?}");
        let report = std::fs::read_to_string(dir.path().join("report.jsonl")).unwrap();
        assert!(
            report.contains(&format!("\"stage\":\"{stage}\"")),
            "build {build:?}: {report}"
        );
        if stage == "init build" {
            assert!(report.contains("cargo xtask build"), "{report}");
        }
    }
}

/// An OCI turn's guard waits as `turnstile-init __turn-guard-wait EXE
/// ARGV…` (issue 29: no fork of the supervisor stays alive beside the
/// turn). Of another build, or of none, it says nothing and exits 125 —
/// the supervisor then refuses the turn before the runtime starts it
/// (`Guard::confirm`). Of this build it says it is ready on fd 1, ends
/// on DISARM, and on EOF (its supervisor gone) execs the cleanup it was
/// given.
#[test]
fn issue_29_the_oci_guard_says_it_waits_and_execs_its_cleanup_on_eof() {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    use turnstile_supervisor::sandbox::initbin::{BUILD_ENV, BUILD_ID};
    let beside = turnstile_tests::supervise_bin()
        .parent()
        .unwrap()
        .join("turnstile-init");
    assert!(beside.is_file(), "{} is not built", beside.display());
    let guard = |build: Option<&str>| {
        let mut cmd = Command::new(&beside);
        cmd.args(["__turn-guard-wait", "/bin/sh", "sh", "-c", "exit 7"])
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(b) = build {
            cmd.env(BUILD_ENV, b);
        }
        cmd.spawn().unwrap()
    };
    for build in [Some("0000000000000000"), None] {
        let mut g = guard(build);
        let mut said = Vec::new();
        g.stdout.take().unwrap().read_to_end(&mut said).unwrap();
        assert_eq!(said, b"", "build {build:?}");
        assert_eq!(g.wait().unwrap().code(), Some(125), "build {build:?}");
    }
    // Disarmed: it ends, running nothing.
    let mut g = guard(Some(BUILD_ID));
    let mut out = g.stdout.take().unwrap();
    let mut byte = [0u8; 1];
    out.read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"R");
    g.stdin.take().unwrap().write_all(b"D").unwrap();
    assert_eq!(g.wait().unwrap().code(), Some(0));
    // Its supervisor gone (EOF): it execs the cleanup (here `exit 7`).
    let mut g = guard(Some(BUILD_ID));
    let mut out = g.stdout.take().unwrap();
    out.read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"R");
    drop(g.stdin.take());
    assert_eq!(g.wait().unwrap().code(), Some(7));
    // Its supervisor gone before it could say it waits (the pipe's read
    // end closed, stdin still open): the cleanup runs at once.
    let (read_end, write_end) = nix::unistd::pipe().unwrap();
    drop(read_end);
    let mut g = Command::new(&beside)
        .args(["__turn-guard-wait", "/bin/sh", "sh", "-c", "exit 7"])
        .env_clear()
        .env(BUILD_ENV, BUILD_ID)
        .stdin(Stdio::piped())
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _open = g.stdin.take();
    assert_eq!(g.wait().unwrap().code(), Some(7));
}

/// A cold turn's init runs from `turnstile-init` beside `supervise` (the
/// smaller binary starts faster: issue 29); a `supervise` copied alone
/// still runs every turn, its init from itself.
#[test]
fn issue_29_the_sandbox_init_runs_from_turnstile_init_or_else_from_supervise() {
    if !require_root("issue_29_the_sandbox_init_runs_from_turnstile_init_or_else_from_supervise") {
        return;
    }
    let fx = fixture();
    let alone = tempfile::tempdir().unwrap();
    let copy = alone.path().join("supervise");
    std::fs::copy(turnstile_tests::supervise_bin(), &copy).unwrap();
    let beside = turnstile_tests::supervise_bin()
        .parent()
        .unwrap()
        .join("turnstile-init");
    assert!(
        beside.is_file(),
        "{} is not built (`cargo xtask test` builds it beside supervise)",
        beside.display()
    );
    for (bin, want) in [
        (turnstile_tests::supervise_bin(), beside.clone()),
        (copy.clone(), copy.clone()),
    ] {
        let child = fx
            .command(
                &bin,
                &["run"],
                &[
                    "--package",
                    "t",
                    "--no-outputs",
                    "--json",
                    "--",
                    "/bin/sleep",
                    "1",
                ],
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let exe = init_exe_of(child.id());
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["status"], "committed", "{v}");
        let file = std::fs::metadata(&want).unwrap();
        assert_eq!(
            exe,
            Some((
                std::os::unix::fs::MetadataExt::dev(&file),
                std::os::unix::fs::MetadataExt::ino(&file)
            )),
            "the init of a turn run by {} is not {}",
            bin.display(),
            want.display()
        );
    }
}

/// Issue 29: the supervisor clones the sandbox's init as PID 1 of the
/// turn's PID namespace (`clone3` with `CLONE_NEWPID`): no intermediate
/// process, so the command is the init's child and its exit reaches the
/// supervisor through one process, not two.
#[test]
fn issue_29_the_sandbox_init_is_pid_1_and_the_supervisors_child() {
    if !require_root("issue_29_the_sandbox_init_is_pid_1_and_the_supervisors_child") {
        return;
    }
    let fx = fixture();
    let child = fx
        .command(
            &turnstile_tests::supervise_bin(),
            &["run"],
            &[
                "--package",
                "t",
                "--no-outputs",
                "--json",
                "--",
                "/bin/sleep",
                "1",
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let supervise = child.id();
    let children = children_of;
    let cmdline = |pid: u32| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    // Wait until the command runs: the init's child executed sleep.
    let mut seen = None;
    for _ in 0..500 {
        let inits: Vec<u32> = children(supervise)
            .into_iter()
            .filter(|c| cmdline(*c) == b"turnstile-init\0__sandbox-init\0")
            .collect();
        if let Some(&init) = inits.first() {
            let below = children(init);
            if below.iter().any(|c| cmdline(*c) == b"/bin/sleep\x001\0") {
                seen = Some((init, below));
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let status = seen.as_ref().map(|(init, _)| {
        std::fs::read_to_string(format!("/proc/{init}/status")).unwrap_or_default()
    });
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (init, below) = seen.expect("the init's child never ran the command");
    assert_eq!(below.len(), 1, "the init {init} has children {below:?}");
    // NSpid: its host pid, then 1 in the turn's PID namespace.
    let nspid = status
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:").map(str::to_owned))
        .unwrap_or_default();
    let ids: Vec<&str> = nspid.split_whitespace().collect();
    assert_eq!(ids, [init.to_string().as_str(), "1"], "NSpid of the init");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "committed", "{v}");
    assert_eq!(v["enforcement"]["posture"]["ok"], true, "{v}");
}

/// `run`'s arguments for a turn of package `t` whose command exits 7 (the
/// issue-29 tests read that code back through a changed start-up).
const EXIT_7_TURN: &[&str] = &[
    "--package",
    "t",
    "--no-outputs",
    "--json",
    "--",
    "/bin/sh",
    "-c",
    "exit 7",
];

/// Issue 29: the init's child shares the supervisor's memory until it
/// execs (`clone3` with `CLONE_VM | CLONE_VFORK`). Where `clone3` is
/// refused (ENOSYS: an older kernel, or a filter around the supervisor),
/// the spawn falls back to a plain fork and the turn is the same: run
/// here under a seccomp filter that answers every `clone3` with ENOSYS
/// (glibc's threads then start through `clone`).
#[cfg(target_arch = "x86_64")]
#[test]
fn issue_29_a_supervisor_refused_clone3_still_starts_the_same_sandbox() {
    if !require_root("issue_29_a_supervisor_refused_clone3_still_starts_the_same_sandbox") {
        return;
    }
    // python3 installs the filter (classic BPF: on x86_64, clone3 = 435 ->
    // ENOSYS, everything else runs; as root no no_new_privs is needed),
    // then execs the supervise command line it was given.
    const WRAP: &str = r#"
import ctypes, os, struct, sys
ins = [(0x20, 0, 0, 4), (0x15, 0, 3, 0xC000003E), (0x20, 0, 0, 0),
       (0x15, 0, 1, 435), (0x06, 0, 0, 0x00050000 | 38), (0x06, 0, 0, 0x7FFF0000)]
buf = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in ins))
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
prog = Prog(len(ins), ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
    sys.exit("PR_SET_SECCOMP: errno %d" % ctypes.get_errno())
os.execv(sys.argv[1], sys.argv[1:])
"#;
    let fx = fixture();
    let supervise = turnstile_tests::supervise_bin();
    let inner = fx.command(&supervise, &["run"], EXIT_7_TURN);
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(WRAP)
        .arg(&supervise)
        .args(inner.get_args())
        .env_remove("TURNSTILE_LOG")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no JSON; stderr: {}", String::from_utf8_lossy(&out.stderr)));
    // The command ran in a sandbox whose posture was checked, and its own
    // exit code came back.
    assert_eq!(v["exit_code"], 7, "{v}");
    assert_eq!(v["status"], "command_failed", "{v}");
    assert_eq!(v["enforcement"]["posture"]["ok"], true, "{v}");
    assert_eq!(out.status.code(), Some(10), "{v}");
}

/// The sandbox's network namespace is made beside the rest of its start
/// (a thread of the supervisor, then joined by the init) instead of by the
/// init: it must still be a fresh one per turn, with `lo` alone and up.
/// Freshness is read from `SO_NETNS_COOKIE` (never reused, unlike the
/// namespace's inode number).
#[test]
fn issue_29_each_turn_joins_a_fresh_network_namespace_with_lo_alone_and_up() {
    if !require_root("issue_29_each_turn_joins_a_fresh_network_namespace_with_lo_alone_and_up") {
        return;
    }
    let fx = fixture();
    let code = "import os, socket, struct\n\
        names = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]\n\
        s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n\
        c = socket.create_connection(s.getsockname(), timeout=5)\n\
        s6 = socket.socket(socket.AF_INET6); s6.bind(('::1', 0)); s6.listen()\n\
        c6 = socket.create_connection(s6.getsockname()[:2], timeout=5)\n\
        cookie = struct.unpack('Q', s.getsockopt(socket.SOL_SOCKET, 71, 8))[0]\n\
        print('netns', os.readlink('/proc/self/ns/net'), cookie, ','.join(names))";
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    let (status, v, err) = py(&fx, None, &[], code);
    assert_eq!(status, 0, "{err}");
    let sid = sid(&v);
    let (status2, _, err2) = py(&fx, Some(&sid), &[], code);
    assert_eq!(status2, 0, "{err2}");
    let lines: Vec<Vec<String>> = err
        .lines()
        .chain(err2.lines())
        .filter_map(|l| l.strip_prefix("netns "))
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect();
    assert_eq!(lines.len(), 2, "{err}\n{err2}");
    for l in &lines {
        assert_ne!(std::path::Path::new(&l[0]), host, "the host's namespace");
        assert_eq!(l[2], "lo", "interfaces of the turn's namespace");
    }
    assert_ne!(
        lines[0][1], lines[1][1],
        "two turns shared a network namespace"
    );
}

/// Issue 29: `supervise` starts without the dynamic loader's work. The
/// binary `cargo xtask build` links (the one every stage of `cargo xtask
/// test`, the bench and the package run) is a static PIE: glibc linked
/// in, no interpreter, nothing to load. The one a plain `cargo build`
/// links is dynamic, and then at least does not load the shared libgcc,
/// whose constructor probes the CPU at every start (181 µs here, where
/// `cpuid` traps to the hypervisor): its unwinder comes from
/// `libgcc_eh.a` (supervisor/build.rs); the dynamic loader lists what it
/// needs and exits (`LD_TRACE_LOADED_OBJECTS`, as `ldd` asks it). Either
/// way a turn runs, records its command's own exit code and exits with
/// the CLI contract's status for a failed command (10).
#[test]
fn issue_29_supervise_starts_without_the_shared_libgcc() {
    let bin = turnstile_tests::supervise_bin();
    match turnstile_tests::elf_interpreter(&bin).expect("read supervise's ELF headers") {
        None => {
            // Static: no loader runs, so none can list anything.
            let out = std::process::Command::new(&bin)
                .arg("--version")
                .env("LD_TRACE_LOADED_OBJECTS", "1")
                .output()
                .expect("run supervise");
            assert!(out.status.success(), "{out:?}");
            assert!(
                String::from_utf8_lossy(&out.stdout).starts_with("supervise "),
                "{out:?}"
            );
        }
        Some(_) => {
            let listed = std::process::Command::new(&bin)
                .env("LD_TRACE_LOADED_OBJECTS", "1")
                .output()
                .expect("run supervise under the loader's trace");
            let libs = String::from_utf8_lossy(&listed.stdout);
            assert!(listed.status.success(), "{libs}");
            assert!(libs.contains("libc.so.6"), "not the loader's list: {libs}");
            assert!(!libs.contains("libgcc_s"), "{libs}");
        }
    }
    if !require_root("issue_29_supervise_starts_without_the_shared_libgcc") {
        return;
    }
    let fx = fixture();
    let r = fx.supervise(&["run"], EXIT_7_TURN);
    assert_eq!(r.status, 10, "{}{}", r.stdout, r.stderr);
    let v = r.json();
    assert_eq!(v["status"], "command_failed", "{}", r.stdout);
    assert_eq!(v["exit_code"], 7, "{}", r.stdout);
}

/// The command starts with no signal blocked and ignoring nothing its
/// caller does not (an ignored disposition survives exec; the same shell
/// started by this test is the reference — a CI job started under `nohup`
/// ignores SIGHUP, one in the background SIGINT and SIGQUIT, and the
/// supervisor's own interrupt handlers make HUP, INT and TERM default
/// again at exec). The init is a Rust program, which ignores SIGPIPE
/// itself: until this was fixed a turn's `seq 100000 | head -1` printed
/// EPIPE errors and failed where outside it ends quietly. Read by the
/// shell's own builtins from /proc/self/status, so nothing else is
/// exec'd.
#[test]
fn the_command_starts_with_no_signal_blocked_or_newly_ignored() {
    if !require_root("the_command_starts_with_no_signal_blocked_or_newly_ignored") {
        return;
    }
    const SCRIPT: &str = "while read -r k v; do case $k in SigBlk:|SigIgn:) echo $k $v;; esac; done < /proc/self/status";
    let state = |text: &str| -> (u64, u64) {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
                .unwrap_or_else(|| panic!("no {name} in {text:?}"))
        };
        (field("SigBlk:"), field("SigIgn:"))
    };
    let outside = std::process::Command::new("/bin/sh")
        .args(["-c", SCRIPT])
        .output()
        .unwrap();
    let outside = String::from_utf8(outside.stdout).unwrap();
    let (_, ignored_outside) = state(&outside);
    const SIGPIPE: u64 = 1 << (13 - 1);
    assert_eq!(
        ignored_outside & SIGPIPE,
        0,
        "std's Command restores SIGPIPE: {outside}"
    );
    let fx = fixture();
    let r = fx.run("t", &["--no-outputs", "--", "/bin/sh", "-c", SCRIPT]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    let (blocked, ignored) = state(&r.stdout);
    assert_eq!(blocked, 0, "blocked inside: {}", r.stdout);
    assert_eq!(
        ignored & !ignored_outside,
        0,
        "ignored inside but not outside: {:#x} (outside {outside:?})",
        ignored & !ignored_outside
    );
    assert_eq!(ignored & SIGPIPE, 0);
}

/// Real-software audit #12: stdout cut at `limits.output_bytes` was said
/// only in the evidence entry. The summary says it, and `--json` carries
/// the same `output` record (bytes written, forwarded, `truncated`).
#[test]
fn output_cut_at_the_budget_is_said_in_the_summary_and_in_json() {
    if !require_root("output_cut_at_the_budget_is_said_in_the_summary_and_in_json") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "o",
        r#"{"capabilities": {"execute": ["/usr/bin/seq"]}, "limits": {"output_bytes": "1Ki"}}"#,
    );
    // 1..=1000, one per line: 3893 bytes.
    let r = fx.run("o", &["--no-outputs", "--", "/usr/bin/seq", "1000"]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    assert_eq!(r.stdout.len(), 1024, "{}", r.stdout);
    assert!(
        r.stderr.contains(
            "output cut: the command wrote 3893 bytes, 1024 were forwarded (limits.output_bytes)"
        ),
        "{}",
        r.stderr
    );
    let r = fx.run(
        "o",
        &["--json", "--no-outputs", "--", "/usr/bin/seq", "1000"],
    );
    let v = r.json();
    assert_eq!(v["output"]["truncated"], true, "{v}");
    assert_eq!(v["output"]["stdout"]["bytes"], 3893, "{v}");
    assert_eq!(v["output"]["stdout"]["forwarded"], 1024, "{v}");
    // Not cut: the record says so.
    let r = fx.run("o", &["--json", "--no-outputs", "--", "/usr/bin/seq", "3"]);
    let v = r.json();
    assert_eq!(v["output"]["truncated"], false, "{v}");
}

/// Red-team stop 61: `/dev/shm` was a fixed 64 MiB whatever the memory
/// limit: a 100 MiB `multiprocessing.shared_memory` block (what PyTorch's
/// DataLoader and Chromium lean on) died of SIGBUS, unrecorded. Its size
/// is half the memory limit now, at least 64 MiB (its pages count against it).
#[test]
fn dev_shm_holds_what_the_memory_limit_allows() {
    if !require_root("dev_shm_holds_what_the_memory_limit_allows") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "m",
        r#"{"capabilities": {"execute": ["/usr/bin/python3"]}, "limits": {"memory": "1Gi", "timeout_seconds": 60}}"#,
    );
    let r = fx.run(
        "m",
        &[
            "--json",
            "--no-outputs",
            "--",
            "/usr/bin/python3",
            "-c",
            "from multiprocessing import shared_memory\n\
s = shared_memory.SharedMemory(create=True, size=100 << 20)\n\
s.buf[:] = b'x' * (100 << 20)\nprint(s.buf[(100 << 20) - 1])\ns.close(); s.unlink()",
        ],
    );
    assert_eq!(r.status, 0, "{}\n{}", r.stdout, r.stderr);
    let v = r.json();
    assert_eq!(v["termination"]["exited"], 0, "{v}");
    assert_eq!(v["output"]["stdout"]["bytes"], 4, "{v}");
}
