//! Real software runs unmodified (issue 9): programs nobody here wrote, in
//! real turns, in fresh 0700 root-owned workspaces (as `mktemp -d` makes
//! them, as real homes are).
//!
//! - CPython's own regression tests (Debian `libpython3.11-testsuite`), per
//!   module, run outside as uid 65534 with a writable TMPDIR and inside a
//!   turn: any test that passes outside and fails, errors or is missing
//!   inside fails this suite, unless [`ALLOWED`] names it with the reason a
//!   sandbox must deny it. A test skipped inside that passed outside is
//!   over-blocking too, unless its skip reason is in [`ALLOWED_SKIPS`].
//! - Toolchain workflows across turns of one session: git, gcc + make,
//!   venv + pip + console script, node, /dev/stderr, ptys, loopback TCP and
//!   UDP over IPv4 and IPv6, a 0600 file in a 0700 workspace, a script built
//!   in TMPDIR.
//!
//! `cargo xtask test` runs all of it; with `TURNSTILE_REQUIRE_KERNEL=1` a
//! missing tool fails instead of skipping.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;
use turnstile_tests::{require_root, supervise_bin};

/// CPython test modules the suite compares (the issue's list).
const MODULES: &[&str] = &[
    "test_os",
    "test_tempfile",
    "test_subprocess",
    "test_shutil",
    "test_pathlib",
    "test_socket",
    "test_signal",
    "test_threading",
];

/// Tests that may pass outside and fail inside, each with the reason a
/// sandbox must deny what it needs. Empty: nothing is over-blocked.
const ALLOWED: &[(&str, &str)] = &[];

/// Skip reasons that may differ inside, and why that is not over-blocking.
const ALLOWED_SKIPS: &[(&str, &str)] = &[(
    "AF_UNIX path",
    "TMPDIR is <root>/tmp/<session_id> (FR-RT-014): CPython nests its test dirs there and the socket path exceeds sun_path's 108 bytes; the same TMPDIR outside skips the same tests",
)];

/// The tests of one binary share two cores: one CPython module at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn required() -> bool {
    std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() == Ok("1")
}

/// Whether the tool exists; under CI a missing tool is a failure.
fn have(test: &str, path: &str) -> bool {
    if Path::new(path).exists() {
        return true;
    }
    assert!(
        !required(),
        "{test}: {path} is missing (run `cargo xtask setup`)"
    );
    eprintln!("SKIP {test}: {path} is missing");
    false
}

/// A fresh workspace: a 0700 root-owned root, a separate state dir.
struct Ws {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    root: PathBuf,
    state: PathBuf,
}

impl Ws {
    fn new(manifest: &str) -> Self {
        let root_dir = tempfile::Builder::new()
            .prefix("realsw-")
            .tempdir()
            .unwrap();
        let state_dir = tempfile::Builder::new()
            .prefix("realsw-state-")
            .tempdir()
            .unwrap();
        let root = std::fs::canonicalize(root_dir.path()).unwrap();
        // As `mktemp -d` makes it and real homes are.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(
            std::fs::metadata(&root).unwrap().permissions().mode() & 0o7777,
            0o700
        );
        let state = state_dir.path().join("state");
        let ws = Self {
            _dirs: (root_dir, state_dir),
            root,
            state,
        };
        ws.write("installed/sw/manifest.json", manifest.as_bytes());
        ws
    }

    fn write(&self, rel: &str, content: &[u8]) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    fn session(&self) -> String {
        let out = Command::new(supervise_bin())
            .args(["session", "new", "--root"])
            .arg(&self.root)
            .arg("--state-dir")
            .arg(&self.state)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// One turn; returns (exit status, --json, the command's output).
    fn turn(&self, sid: &str, outputs: &[&str], argv: &[&str]) -> (i32, Value, String) {
        let mut cmd = Command::new("/usr/bin/env");
        cmd.arg("--default-signal=INT")
            .arg(supervise_bin())
            .args([
                "run",
                "--json",
                "--package",
                "sw",
                "--session",
                sid,
                "--root",
            ])
            .arg(&self.root)
            .arg("--state-dir")
            .arg(&self.state)
            .env_remove("TURNSTILE_LOG");
        if outputs.is_empty() {
            cmd.arg("--no-outputs");
        }
        for o in outputs {
            cmd.args(["--output", o]);
        }
        let out = cmd.arg("--").args(argv).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn sh(&self, sid: &str, script: &str) -> (i32, String) {
        let (s, _, out) = self.turn(sid, &[], &["/bin/sh", "-c", script]);
        (s, out)
    }
}

/// The manifest real software gets: the system readable, the usual tool
/// directories executable, and what a turn builds in its scratch.
const MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["/usr/**", "/etc/**", "data/**"],
    "write": ["output/<session_id>/**"],
    "execute": ["/usr/bin/*", "/bin/*", "/usr/lib/**", "/usr/libexec/**", "tmp/<session_id>/**"]
  },
  "limits": {"timeout_seconds": 900, "memory": "2Gi", "pids": 1024, "disk": "2Gi",
             "files": 200000, "output_bytes": "64Mi"}
}"#;

/// Per test id, `ok`, `FAIL`, `ERROR`, `skipped <reason>`…, from `-v` output.
fn results(log: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        // "test_x (test.test_os.Class.test_x) ... ok"
        let Some((head, verdict)) = line.split_once(" ... ") else {
            continue;
        };
        let Some(id) = head
            .split_once(" (")
            .and_then(|(_, rest)| rest.strip_suffix(')'))
        else {
            continue;
        };
        out.insert(id.to_owned(), verdict.trim().to_owned());
    }
    out
}

fn cpython(module: &str) {
    let test = format!("issue_9_cpython_{module}");
    if !require_root(&test) || !have(&test, "/usr/lib/python3.11/test/regrtest.py") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Outside: uid 65534, a writable TMPDIR of its own, SIGINT default.
    let scratch = tempfile::Builder::new()
        .prefix("realsw-out-")
        .tempdir()
        .unwrap();
    nix::unistd::chown(
        scratch.path(),
        Some(nix::unistd::Uid::from_raw(65534)),
        Some(nix::unistd::Gid::from_raw(65534)),
    )
    .unwrap();
    let s = scratch.path().display().to_string();
    let outside = Command::new("/usr/bin/env")
        .args([
            "--default-signal=INT",
            "-i",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "LANG=C.UTF-8",
            "PYTHONDONTWRITEBYTECODE=1",
        ])
        .args([
            format!("HOME={s}"),
            format!("TMPDIR={s}"),
            format!("TEMP={s}"),
            format!("TMP={s}"),
        ])
        .args([
            "/usr/bin/setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ])
        .args(["/usr/bin/python3", "-m", "test", "-j1", "-v", module])
        .current_dir(scratch.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let outside = String::from_utf8_lossy(&outside.stdout).into_owned()
        + &String::from_utf8_lossy(&outside.stderr);
    let ws = Ws::new(MANIFEST);
    let sid = ws.session();
    let (status, json, inside) = ws.turn(
        &sid,
        &[],
        &["/usr/bin/python3", "-m", "test", "-j1", "-v", module],
    );
    let (out, ins) = (results(&outside), results(&inside));
    assert!(
        out.len() > 20,
        "{module}: outside ran {} tests:\n{outside}",
        out.len()
    );
    let mut over_blocked = Vec::new();
    for (id, verdict) in &out {
        if verdict != "ok" {
            continue;
        }
        let got = ins.get(id).map_or("(did not run)", String::as_str);
        if got == "ok" || ALLOWED.iter().any(|(t, _)| t == id) {
            continue;
        }
        if got.starts_with("skipped") && ALLOWED_SKIPS.iter().any(|(r, _)| got.contains(r)) {
            continue;
        }
        over_blocked.push(format!("{id}: outside ok, inside {got}"));
    }
    let tail: String = inside
        .lines()
        .rev()
        .take(30)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        over_blocked.is_empty(),
        "{module}: {} tests over-blocked (turn status {} {}):\n{}\n--- inside tail:\n{tail}",
        over_blocked.len(),
        status,
        json["status"],
        over_blocked.join("\n")
    );
    eprintln!(
        "{module}: {} tests pass outside, all pass inside ({} skipped inside, {} outside)",
        out.values().filter(|v| *v == "ok").count(),
        ins.values().filter(|v| v.starts_with("skipped")).count(),
        out.values().filter(|v| v.starts_with("skipped")).count()
    );
}

#[test]
fn issue_9_cpython_test_os() {
    cpython("test_os");
}
#[test]
fn issue_9_cpython_test_tempfile() {
    cpython("test_tempfile");
}
#[test]
fn issue_9_cpython_test_subprocess() {
    cpython("test_subprocess");
}
#[test]
fn issue_9_cpython_test_shutil() {
    cpython("test_shutil");
}
#[test]
fn issue_9_cpython_test_pathlib() {
    cpython("test_pathlib");
}
#[test]
fn issue_9_cpython_test_socket() {
    cpython("test_socket");
}
#[test]
fn issue_9_cpython_test_signal() {
    cpython("test_signal");
}
#[test]
fn issue_9_cpython_test_threading() {
    cpython("test_threading");
}

#[test]
fn modules_cover_the_issue_list_and_every_one_has_a_test() {
    let me =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/realsw.rs")).unwrap();
    for m in MODULES {
        assert!(
            me.contains(&format!("fn issue_9_cpython_{m}()")),
            "{m} has no test"
        );
    }
}

#[test]
fn issue_9_git_worktree_survives_across_turns() {
    if !require_root("issue_9_git") || !have("issue_9_git", "/usr/bin/git") {
        return;
    }
    let ws = Ws::new(MANIFEST);
    let sid = ws.session();
    let (s, out) = ws.sh(
        &sid,
        "set -e; cd $TMPDIR; git init -q repo; cd repo; git config user.email a@b; git config user.name a; \
         echo hi > f; ln -s f link; printf '#!/bin/sh\\necho run\\n' > run.sh; chmod +x run.sh; mkdir empty; \
         git add .; git commit -qm one; git status --porcelain",
    );
    assert_eq!(s, 0, "{out}");
    let (s, out) = ws.sh(
        &sid,
        "set -e; cd $TMPDIR/repo; test -z \"$(git status --porcelain)\"; ./run.sh; test -L link; \
         echo more >> f; git commit -qam two; git log --oneline | wc -l",
    );
    assert_eq!(s, 0, "{out}");
    assert!(out.contains("run\n") && out.contains("2\n"), "{out}");
}

#[test]
fn issue_9_gcc_make_build_and_run_in_the_same_and_the_next_turn() {
    if !require_root("issue_9_gcc")
        || !have("issue_9_gcc", "/usr/bin/gcc")
        || !have("issue_9_gcc", "/usr/bin/make")
    {
        return;
    }
    let ws = Ws::new(MANIFEST);
    let sid = ws.session();
    let (s, out) = ws.sh(
        &sid,
        "set -e; mkdir -p $TMPDIR/p; cd $TMPDIR/p; \
         printf '#include <stdio.h>\\nint main(void){puts(\"built ok\");return 0;}\\n' > m.c; \
         printf 'm: m.c\\n\\tgcc -O1 -o m m.c\\n' > Makefile; make -s; ./m",
    );
    assert_eq!(s, 0, "{out}");
    assert!(out.contains("built ok"), "{out}");
    let (s, out) = ws.sh(
        &sid,
        "set -e; cd $TMPDIR/p; test -x m; ./m; make -s -q && echo up-to-date",
    );
    assert_eq!(s, 0, "{out}");
    assert!(
        out.contains("built ok") && out.contains("up-to-date"),
        "{out}"
    );
}

#[test]
fn issue_9_venv_pip_local_wheel_console_script_across_turns() {
    if !require_root("issue_9_venv")
        || !have("issue_9_venv", "/usr/lib/python3.11/ensurepip/__init__.py")
    {
        return;
    }
    let ws = Ws::new(MANIFEST);
    // A wheel written by hand (no network, no build backend).
    let wheel = ws.root.join("data/hello_ts-0.1-py3-none-any.whl");
    std::fs::create_dir_all(wheel.parent().unwrap()).unwrap();
    let script = r#"
import sys, zipfile, hashlib, base64
files = {
    'hello_ts/__init__.py': b'def main():\n    print("hello from a console script")\n',
    'hello_ts-0.1.dist-info/METADATA': b'Metadata-Version: 2.1\nName: hello-ts\nVersion: 0.1\n',
    'hello_ts-0.1.dist-info/WHEEL': b'Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n',
    'hello_ts-0.1.dist-info/entry_points.txt': b'[console_scripts]\nhello-ts = hello_ts:main\n',
}
rec = []
with zipfile.ZipFile(sys.argv[1], 'w') as z:
    for n, b in files.items():
        z.writestr(n, b)
        h = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()
        rec.append(f'{n},sha256={h},{len(b)}')
    rec.append('hello_ts-0.1.dist-info/RECORD,,')
    z.writestr('hello_ts-0.1.dist-info/RECORD', '\n'.join(rec) + '\n')
"#;
    let made = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(&wheel)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let sid = ws.session();
    let (s, out) = ws.sh(
        &sid,
        "set -e; python3 -m venv $TMPDIR/venv; $TMPDIR/venv/bin/pip install -q --no-index data/hello_ts-0.1-py3-none-any.whl; $TMPDIR/venv/bin/hello-ts",
    );
    assert_eq!(s, 0, "{out}");
    let (s, out) = ws.sh(&sid, "set -e; test -L $TMPDIR/venv/bin/python; $TMPDIR/venv/bin/hello-ts; $TMPDIR/venv/bin/python -c 'import hello_ts'");
    assert_eq!(s, 0, "{out}");
    assert!(out.contains("hello from a console script"), "{out}");
}

#[test]
fn issue_9_node_runs() {
    if !require_root("issue_9_node") || !have("issue_9_node", "/usr/bin/node") {
        return;
    }
    let ws = Ws::new(MANIFEST);
    let sid = ws.session();
    let (s, out) = ws.sh(
        &sid,
        "node -e \"const fs=require('fs'),os=require('os'),p=os.tmpdir()+'/n.txt'; fs.writeFileSync(p,'x'); console.log('node', fs.readFileSync(p,'utf8'), os.hostname())\"",
    );
    assert_eq!(s, 0, "{out}");
    assert!(out.contains("node x turnstile"), "{out}");
}

#[test]
fn issue_9_stderr_ptys_loopback_and_a_0600_file() {
    if !require_root("issue_9_misc") {
        return;
    }
    let ws = Ws::new(MANIFEST);
    ws.write("data/secret.txt", b"mine\n");
    std::fs::set_permissions(
        ws.root.join("data/secret.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let sid = ws.session();
    let (s, out) = ws.sh(
        &sid,
        "echo to-stderr > /dev/stderr && echo to-stdout > /dev/stdout && cat data/secret.txt",
    );
    assert_eq!(s, 0, "{out}");
    assert!(
        out.contains("to-stderr") && out.contains("to-stdout") && out.contains("mine"),
        "{out}"
    );
    let py = r#"
import os, pty, socket, subprocess
m, s = os.openpty(); os.write(s, b'pty-ok\n'); print(os.read(m, 100).decode().strip(), os.ttyname(s))
for fam, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):
    srv = socket.socket(fam); srv.bind((host, 0)); srv.listen()
    c = socket.create_connection(srv.getsockname()[:2], 5); a, _ = srv.accept(); c.sendall(b'tcp'); print(fam.name, a.recv(3).decode())
    u = socket.socket(fam, socket.SOCK_DGRAM); u.bind((host, 0)); v = socket.socket(fam, socket.SOCK_DGRAM)
    v.sendto(b'udp', u.getsockname()[:2]); u.settimeout(5); print(fam.name, u.recv(3).decode())
print(subprocess.run(['script', '-qc', 'tty', '/dev/null'], capture_output=True, text=True).stdout.strip())
print(socket.gethostbyname(socket.gethostname()), socket.getservbyname('ssh'))
"#;
    let (s, _, out) = ws.turn(&sid, &[], &["/usr/bin/python3", "-c", py]);
    assert_eq!(s, 0, "{out}");
    for want in [
        "pty-ok /dev/pts/0",
        "AF_INET tcp",
        "AF_INET udp",
        "AF_INET6 tcp",
        "AF_INET6 udp",
        "/dev/pts/",
        "127.0.1.1 22",
    ] {
        assert!(out.contains(want), "missing `{want}`:\n{out}");
    }
}
