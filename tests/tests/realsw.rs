//! Real software runs unmodified (issue 9): programs nobody here wrote, in
//! real turns, in fresh 0700 root-owned workspaces (as `mktemp -d` makes
//! them, as real homes are). The harness is `turnstile_tests::realsw`.
//!
//! - CPython's own regression tests (Debian `libpython3.11-testsuite`) for
//!   the modules issue 9 names ([`modules::ISSUE`]), run outside as uid
//!   65534 with a writable TMPDIR and inside a turn: a test that passes
//!   outside and fails, errors, hangs, is skipped or is missing inside fails
//!   this suite unless `realsw::allowlist` names it with the reason a
//!   sandbox must deny it. `cargo xtask realsw` runs more modules.
//! - Toolchain workflows across turns of one session, each a test named for
//!   what it proves, asserting exit statuses and bytes.
//!
//! `cargo xtask test` runs all of it; with `TURNSTILE_REQUIRE_KERNEL=1` a
//! missing tool fails instead of skipping.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use turnstile_tests::realsw::{Req, Turn, Workspace, modules, required};
use turnstile_tests::require_root;

/// The tests of one binary share two cores: one CPython module at a time.
static SERIAL: Mutex<()> = Mutex::new(());

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

fn logs() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("realsw-logs")
}

fn cpython(module: &str) {
    let test = format!("issue_9_cpython_{module}");
    if !require_root(&test) || !have(&test, "/usr/lib/python3.11/test/regrtest.py") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = modules::by_name(module);
    let r = modules::run(m, &logs()).unwrap();
    let table = modules::table(std::slice::from_ref(&r));
    assert!(
        r.ok(),
        "{module}: {} tests pass outside and not inside (logs in {}):\n{table}",
        r.overblocked.len(),
        logs().display()
    );
    eprint!("{table}");
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
fn every_issue_module_has_a_test() {
    let me =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/realsw.rs")).unwrap();
    for m in modules::ISSUE {
        assert!(
            me.contains(&format!("fn issue_9_cpython_{}()", m.name)),
            "{} has no test",
            m.name
        );
        assert!(modules::ALL.iter().any(|a| a.name == m.name));
    }
}

/// The manifest the workflows get: the system readable, the usual tool
/// directories executable, and what a turn builds in its scratch.
const MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["/usr/**", "/etc/**", "data/**"],
    "write": ["output/<session_id>/**"],
    "execute": ["/usr/bin/*", "/bin/*", "/usr/lib/**", "/usr/libexec/**", "tmp/<session_id>/**"]
  },
  "limits": {"timeout_seconds": 600, "memory": "2Gi", "cpu": "2", "pids": 1024, "disk": "2Gi",
             "files": 200000, "output_bytes": "64Mi"}
}"#;

const PKG: &str = "sw";

fn workspace() -> (Workspace, String) {
    let ws = Workspace::new(PKG, MANIFEST).unwrap();
    let sid = ws.new_session().unwrap();
    (ws, sid)
}

/// Runs `script` in a turn of `sid` and asserts it exited 0 and committed.
fn ok(ws: &Workspace, sid: &str, script: &str) -> Turn {
    let t = ws.sh(PKG, sid, script).unwrap();
    assert_eq!(t.status(), 0, "{script}\n{}", t.describe());
    t
}

#[test]
fn issue_9_git_commit_in_one_turn_status_clean_and_commit_in_the_next() {
    if !require_root("issue_9_git") || !have("issue_9_git", "/usr/bin/git") {
        return;
    }
    let (ws, sid) = workspace();
    let t = ok(
        &ws,
        &sid,
        "set -e; cd $TMPDIR; git init -q repo; cd repo; git config user.email a@b; git config user.name a; \
         echo hi > f; ln -s f link; printf '#!/bin/sh\\necho run\\n' > run.sh; chmod +x run.sh; \
         git add .; git commit -qm one; echo status:$(git status --porcelain):end",
    );
    assert!(t.output.contains("status::end"), "{}", t.describe());
    let t = ok(
        &ws,
        &sid,
        "set -e; cd $TMPDIR/repo; echo status:$(git status --porcelain):end; ./run.sh; test -L link; \
         git ls-files -s run.sh link; echo more >> f; git commit -qam two; git log --oneline | wc -l",
    );
    let out = &t.output;
    assert!(out.contains("status::end"), "dirty in turn 2:\n{out}");
    assert!(out.contains("run\n"), "{out}");
    assert!(out.contains("100755 ") && out.contains("120000 "), "{out}");
    assert!(out.contains("2\n"), "{out}");
}

#[test]
fn issue_9_gcc_make_build_and_run_in_the_same_and_the_next_turn() {
    if !require_root("issue_9_gcc")
        || !have("issue_9_gcc", "/usr/bin/gcc")
        || !have("issue_9_gcc", "/usr/bin/make")
    {
        return;
    }
    let (ws, sid) = workspace();
    let t = ok(
        &ws,
        &sid,
        "set -e; mkdir -p $TMPDIR/p; cd $TMPDIR/p; \
         printf '#include <stdio.h>\\nint main(void){puts(\"built ok\");return 3;}\\n' > m.c; \
         printf 'm: m.c\\n\\tgcc -O1 -o m m.c\\n' > Makefile; make -s; ./m || echo exit=$?",
    );
    assert!(t.output.contains("built ok\nexit=3"), "{}", t.describe());
    let t = ok(
        &ws,
        &sid,
        "set -e; cd $TMPDIR/p; test -x m; ./m || echo exit=$?; make -q && echo up-to-date",
    );
    assert!(
        t.output.contains("built ok\nexit=3") && t.output.contains("up-to-date"),
        "{}",
        t.describe()
    );
}

/// A wheel written by hand (no network, no build backend): a package and a
/// console script.
fn write_wheel(path: &Path) {
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
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let made = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
}

#[test]
fn issue_9_venv_pip_install_of_a_local_wheel_then_its_console_script_in_the_next_turn() {
    if !require_root("issue_9_venv")
        || !have("issue_9_venv", "/usr/lib/python3.11/ensurepip/__init__.py")
    {
        return;
    }
    let (ws, sid) = workspace();
    write_wheel(&ws.root.join("data/hello_ts-0.1-py3-none-any.whl"));
    ok(
        &ws,
        &sid,
        "set -e; python3 -m venv $TMPDIR/venv; \
         $TMPDIR/venv/bin/pip install -q --no-index data/hello_ts-0.1-py3-none-any.whl",
    );
    let t = ok(
        &ws,
        &sid,
        "set -e; test -L $TMPDIR/venv/bin/python; $TMPDIR/venv/bin/hello-ts; \
         $TMPDIR/venv/bin/python -c 'import hello_ts, sys; print(sys.prefix == sys.argv[1])' $TMPDIR/venv",
    );
    assert!(
        t.output.contains("hello from a console script\nTrue"),
        "{}",
        t.describe()
    );
}

#[test]
fn issue_9_node_writes_and_reads_tmpdir_and_sees_the_hostname() {
    if !require_root("issue_9_node") || !have("issue_9_node", "/usr/bin/node") {
        return;
    }
    let (ws, sid) = workspace();
    let t = ok(
        &ws,
        &sid,
        "node -e \"const fs=require('fs'),os=require('os'),p=os.tmpdir()+'/n.txt'; fs.writeFileSync(p,'x'); console.log('node', fs.readFileSync(p,'utf8'), os.hostname())\"",
    );
    assert!(t.output.contains("node x turnstile"), "{}", t.describe());
}

#[test]
fn issue_9_echo_to_dev_stderr_and_dev_stdout() {
    if !require_root("issue_9_stderr") {
        return;
    }
    let (ws, sid) = workspace();
    let t = ok(
        &ws,
        &sid,
        "echo to-stderr > /dev/stderr && echo to-stdout > /dev/stdout && echo fd2 >&2",
    );
    for want in ["to-stderr", "to-stdout", "fd2"] {
        assert!(t.output.contains(want), "{want}: {}", t.describe());
    }
}

#[test]
fn issue_9_openpty_and_script_get_a_pty() {
    if !require_root("issue_9_pty") || !have("issue_9_pty", "/usr/bin/script") {
        return;
    }
    let (ws, sid) = workspace();
    let py = r#"
import os, subprocess
m, s = os.openpty(); os.write(s, b'pty-ok\n'); print(os.read(m, 100).decode().strip(), os.ttyname(s))
print('script:', subprocess.run(['script', '-qc', 'tty', '/dev/null'], capture_output=True, text=True).stdout.strip())
"#;
    let t = ws
        .run(
            &Req::new(PKG).session(Some(&sid)),
            &["/usr/bin/python3", "-c", py],
        )
        .unwrap();
    assert_eq!(t.status(), 0, "{}", t.describe());
    assert!(t.output.contains("pty-ok /dev/pts/"), "{}", t.describe());
    assert!(t.output.contains("script: /dev/pts/"), "{}", t.describe());
}

#[test]
fn issue_9_loopback_tcp_and_udp_server_and_client_on_127_0_0_1_and_ipv6() {
    if !require_root("issue_9_loopback") {
        return;
    }
    let (ws, sid) = workspace();
    let py = r#"
import socket
for fam, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):
    srv = socket.socket(fam); srv.bind((host, 0)); srv.listen()
    c = socket.create_connection(srv.getsockname()[:2], 5); a, _ = srv.accept()
    c.sendall(b'tcp-' + host.encode()); a.settimeout(5); print(fam.name, a.recv(64).decode())
    u = socket.socket(fam, socket.SOCK_DGRAM); u.bind((host, 0)); v = socket.socket(fam, socket.SOCK_DGRAM)
    v.sendto(b'udp-' + host.encode(), u.getsockname()[:2]); u.settimeout(5); print(fam.name, u.recv(64).decode())
print(socket.gethostbyname(socket.gethostname()), socket.getservbyname('ssh'))
"#;
    let t = ws
        .run(
            &Req::new(PKG).session(Some(&sid)),
            &["/usr/bin/python3", "-c", py],
        )
        .unwrap();
    assert_eq!(t.status(), 0, "{}", t.describe());
    for want in [
        "AF_INET tcp-127.0.0.1",
        "AF_INET udp-127.0.0.1",
        "AF_INET6 tcp-::1",
        "AF_INET6 udp-::1",
        "127.0.1.1 22",
    ] {
        assert!(
            t.output.contains(want),
            "missing `{want}`:\n{}",
            t.describe()
        );
    }
}

#[test]
fn issue_9_a_0600_file_in_a_0700_workspace_is_read_through_its_grant() {
    if !require_root("issue_9_0600") {
        return;
    }
    let (ws, sid) = workspace();
    assert_eq!(
        std::fs::metadata(&ws.root).unwrap().permissions().mode() & 0o7777,
        0o700
    );
    ws.write("data/secret.txt", b"mine\n").unwrap();
    std::fs::set_permissions(
        ws.root.join("data/secret.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let t = ok(&ws, &sid, "cat data/secret.txt; id -u");
    assert!(t.output.contains("mine\n65534"), "{}", t.describe());
}

#[test]
fn issue_9_a_script_made_in_tmpdir_runs_in_its_turn_and_as_the_next_turns_command() {
    if !require_root("issue_9_tmpdir_exec") {
        return;
    }
    let (ws, sid) = workspace();
    let t = ok(
        &ws,
        &sid,
        "set -e; mkdir -p $TMPDIR/bin; printf '#!/bin/sh\\necho made-here \"$@\"\\n' > $TMPDIR/bin/hi; \
         chmod 755 $TMPDIR/bin/hi; $TMPDIR/bin/hi one",
    );
    assert!(t.output.contains("made-here one"), "{}", t.describe());
    // Turn 2: the script itself is the turn's command (argv[0] a path under
    // `tmp/<session_id>/**`, the manifest's execute entry).
    let script = ws.scratch(&sid).join("bin/hi");
    assert_eq!(
        std::fs::metadata(&script).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let t = ws
        .run(
            &Req::new(PKG).session(Some(&sid)),
            &[script.to_str().unwrap(), "two"],
        )
        .unwrap();
    assert_eq!(t.status(), 0, "{}", t.describe());
    assert!(t.output.contains("made-here two"), "{}", t.describe());
}

/// POSIX message queues (real-software audit): `mq_open` opens a file on
/// the IPC namespace's internal mqueue mount, which Landlock refused
/// (EACCES) where no rule covered it. Each turn's own `/dev/mqueue` (its
/// IPC namespace's instance) carries the rule, and covers that internal
/// mount too (one superblock, one root inode). A queue one turn leaves is
/// not in the next turn (a fresh IPC namespace), nor on the host.
#[test]
fn posix_message_queue_round_trip_in_a_turn_and_gone_in_the_next() {
    if !require_root("posix_mq") {
        return;
    }
    let (ws, sid) = workspace();
    let name = format!("/ts-mq-{}", std::process::id());
    let py = r#"
import ctypes, os, sys
rt = ctypes.CDLL('librt.so.1', use_errno=True)
rt.mq_open.restype = ctypes.c_int
rt.mq_receive.restype = ctypes.c_ssize_t
name = sys.argv[1].encode()
def fail(what):
    print(what, 'failed:', os.strerror(ctypes.get_errno())); sys.exit(3)
if sys.argv[2] == 'make':
    q = rt.mq_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600, None)
    if q < 0: fail('mq_open')
    msg = b'hello over mqueue'
    if rt.mq_send(q, msg, len(msg), 1) != 0: fail('mq_send')
    buf = ctypes.create_string_buffer(1 << 16)
    prio = ctypes.c_uint(0)
    n = rt.mq_receive(q, buf, len(buf), ctypes.byref(prio))
    if n < 0: fail('mq_receive')
    print('received', buf.raw[:n].decode(), 'prio', prio.value)
    print('in /dev/mqueue:', os.path.exists('/dev/mqueue' + sys.argv[1]))
    # Left behind on purpose: the next turn must not see it.
else:
    q = rt.mq_open(name, os.O_RDWR, 0, None)
    print('reopen:', 'found' if q >= 0 else os.strerror(ctypes.get_errno()))
"#;
    let req = Req::new(PKG).session(Some(&sid));
    let t = ws
        .run(&req, &["/usr/bin/python3", "-c", py, &name, "make"])
        .unwrap();
    assert_eq!(t.status(), 0, "{}", t.describe());
    assert!(
        t.output
            .contains("received hello over mqueue prio 1\nin /dev/mqueue: True"),
        "{}",
        t.describe()
    );
    let t = ws
        .run(&req, &["/usr/bin/python3", "-c", py, &name, "reopen"])
        .unwrap();
    assert_eq!(t.status(), 0, "{}", t.describe());
    assert!(
        t.output.contains("reopen: No such file or directory"),
        "a queue outlived its turn:\n{}",
        t.describe()
    );
    // Nor did it reach the host's IPC namespace.
    let host = Command::new("/usr/bin/python3")
        .args(["-c", py, &name, "reopen"])
        .output()
        .unwrap();
    let host = String::from_utf8_lossy(&host.stdout);
    assert!(host.contains("reopen: No such file or directory"), "{host}");
}

/// The turn's PATH names only directories it may execute from (real-software
/// audit): `/usr/local/bin` was first on it, visible (`read: /usr/**`) but
/// without an execute rule, so `git` resolved to `/usr/local/bin/git` where
/// one exists and failed "Permission denied" (126), and `shutil.which`
/// returned the unusable path. With execute only `/usr/bin/*`, PATH keeps
/// `/usr/bin`, and `/bin` only where it is `/usr/bin` (merged /usr).
#[test]
fn path_names_only_directories_the_turn_may_execute_from() {
    if !require_root("path_exec") || !have("path_exec", "/usr/bin/git") {
        return;
    }
    let manifest =
        r#"{"capabilities": {"read": ["/usr/**", "/etc/**"], "execute": ["/usr/bin/*"]}}"#;
    let ws = Workspace::new(PKG, manifest).unwrap();
    let sid = ws.new_session().unwrap();
    let script = "echo \"PATH=$PATH\"; command -v true; true && echo true-ran; \
         /usr/bin/bash -c 'git --version >/dev/null && echo bash-git-ran'; \
         python3 -c 'import shutil; print(\"which:\", shutil.which(\"git\"))'";
    // `/usr/bin/sh`: argv[0] must match the execute entry as written.
    let t = ws
        .run(
            &Req::new(PKG).session(Some(&sid)),
            &["/usr/bin/sh", "-c", script],
        )
        .unwrap();
    assert_eq!(t.status(), 0, "{}", t.describe());
    let merged = std::fs::canonicalize("/bin").ok() == Some(PathBuf::from("/usr/bin"));
    let want = if merged { "/usr/bin:/bin" } else { "/usr/bin" };
    let out = &t.output;
    assert!(out.contains(&format!("PATH={want}\n")), "{}", t.describe());
    assert!(
        out.contains("true-ran") && out.contains("bash-git-ran"),
        "{out}"
    );
    assert!(out.contains("which: /usr/bin/git"), "{out}");
    assert!(!out.contains("/usr/local/bin"), "{out}");
}

/// `unshare(CLONE_FS)` and `unshare(CLONE_FILES)` create no namespace and
/// are allowed (real-software audit: they were refused EPERM with the rest
/// of unshare); with a namespace flag unshare is still refused EPERM and
/// recorded as a seccomp denial.
#[test]
fn unshare_without_a_namespace_flag_runs_and_with_one_is_refused_and_recorded() {
    if !require_root("unshare_fs") {
        return;
    }
    let (ws, sid) = workspace();
    let py = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def unshare(flags):
    r = libc.unshare(flags)
    return 'ok' if r == 0 else os.strerror(ctypes.get_errno())
for name, flags in (('CLONE_FS', 0x200), ('CLONE_FILES', 0x400), ('CLONE_NEWUSER', 0x10000000), ('CLONE_NEWNS', 0x20000)):
    print(name, unshare(flags))
"#;
    let t = ws
        .run(
            &Req::new(PKG).session(Some(&sid)),
            &["/usr/bin/python3", "-c", py],
        )
        .unwrap();
    assert_eq!(t.status(), 0, "{}", t.describe());
    for want in [
        "CLONE_FS ok",
        "CLONE_FILES ok",
        "CLONE_NEWUSER Operation not permitted",
        "CLONE_NEWNS Operation not permitted",
    ] {
        assert!(t.output.contains(want), "{want}: {}", t.describe());
    }
    let json = t.json.as_ref().expect("--json");
    let unshare: Vec<&serde_json::Value> = json["violations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["layer"] == "seccomp" && v["target"] == "unshare")
        .collect();
    assert_eq!(unshare.len(), 1, "{json}");
    assert_eq!(unshare[0]["count"], 2, "only the namespace flags: {json}");
    let hint = unshare[0]["hint"].as_str().unwrap_or("");
    assert!(hint.contains("CLONE_NEWUSER"), "{hint}");
}
