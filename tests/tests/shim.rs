//! The containerd shim (issue 12) against a real, private containerd
//! 1.6: its own root, state, sockets and config, started and stopped by
//! this test; the shim registered as runtime `io.containerd.turnstile.v2`
//! (binary on containerd's PATH); an image built offline from
//! busybox-static and imported with `ctr images import`. Then `ctr run`
//! with the io.turnstile.* annotations: a declared output commits, an
//! undeclared write blocks (exit 12), a forbidden read fails, a capability
//! violation fails the create, absent outputs fail the create (FR-RT-013),
//! a hand-set CRI sandbox annotation is refused,
//! the ledgers verify — and nothing is left: no containerd, no shim, no
//! mount under its root or /run/containerd. Issue 25: hostile pods (a
//! workspace that is a path, an unknown `io.turnstile.*` key, a workspace
//! not for the container's namespace) are refused at Create with nothing
//! created, and without a configured backend the package's trust level
//! chooses (an untrusted package is not run under runc).
//!
//! The tests take one lock: each runs its own containerd, and both check
//! that nothing new is left under /run/containerd.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use turnstile_tests::containerd::{Containerd, Leftovers};
use turnstile_tests::{BUSYBOX_MANIFEST, Fixture, busybox_rootfs, require_root, supervise_bin};

const IMAGE: &str = "docker.io/turnstile/busybox:test";

static SERIAL: Mutex<()> = Mutex::new(());

/// The shim's options for a test: state in the test's own directory
/// (never /var/lib/turnstile), the workspace `ws` mapped to `ws` for
/// namespace `default`, plus `extra`; handed over as containerd's runtime
/// options do (`ctr run --runtime-config-path`).
fn options_file(dir: &Path, state: &Path, ws: &Path, extra: serde_json::Value) -> PathBuf {
    let p = dir.join("shim.json");
    let mut o = serde_json::json!({
        "state_dir": state,
        "supervise": supervise_bin(),
        "workspaces": {"ws": {"root": ws, "namespaces": ["default"]}},
    });
    if let (Some(o), serde_json::Value::Object(extra)) = (o.as_object_mut(), extra) {
        o.extend(extra);
    }
    std::fs::write(&p, o.to_string()).unwrap();
    p
}

/// What both tests need: the shim binary and an image archive.
struct Setup {
    shim: PathBuf,
    image_dir: tempfile::TempDir,
    archive: PathBuf,
}

/// The tools, the shim binary and the image; `None` (skipped, said why)
/// when a tool is missing and the run does not require them.
fn setup(test: &str) -> Option<Setup> {
    if !require_root(test) {
        return None;
    }
    let strict = std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() == Ok("1");
    for tool in ["containerd", "ctr", "python3"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            assert!(!strict, "{tool} is required (apt-get install containerd)");
            eprintln!("turnstile-test: SKIPPED: {tool} missing");
            return None;
        }
    }
    // The shim and supervise side by side, on containerd's PATH.
    let shim = supervise_bin().with_file_name("containerd-shim-turnstile-v2");
    assert!(
        shim.is_file(),
        "build the shim first: cargo build -p containerd-shim-turnstile-v2"
    );
    let image_dir = tempfile::tempdir().unwrap();
    let rootfs = image_dir.path().join("rootfs");
    if !busybox_rootfs(&rootfs) {
        assert!(!strict, "busybox-static is required");
        return None;
    }
    let archive = image_dir.path().join("image.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("images/oci_archive.py");
    let st = Command::new("python3")
        .arg(&script)
        .arg(&rootfs)
        .arg(&archive)
        .arg(IMAGE)
        .status()
        .unwrap();
    assert!(st.success());
    Some(Setup {
        shim,
        image_dir,
        archive,
    })
}

/// A private containerd with the image imported.
fn containerd(s: &Setup) -> Containerd {
    let c = Containerd::start(
        s.shim.parent().unwrap(),
        "[plugins.\"io.containerd.grpc.v1.cri\"]\n  disable = true",
    );
    let imported = c.ctr(&["images", "import", s.archive.to_str().unwrap()]);
    assert!(imported.status.success(), "{}", text(&imported));
    c
}

/// `ctr run --rm` through the shim with these annotations.
fn ctr_run(c: &Containerd, annotations: &[String], id: &str, argv: &[&str]) -> Output {
    let config = c.dir.path().join("shim.json").display().to_string();
    let fifos = c.dir.path().join("fifo").display().to_string();
    let mut args = vec![
        "run",
        "--rm",
        "--runtime",
        "io.containerd.turnstile.v2",
        "--runtime-config-path",
        &config,
        "--fifo-dir",
        &fifos,
    ];
    for a in annotations {
        args.extend(["--annotation", a.as_str()]);
    }
    args.extend([IMAGE, id]);
    args.extend(argv);
    c.ctr(&args)
}

/// `ctr run --rm` through the shim of package `bb` in workspace `ws`, with
/// `extra` flags, in the background: stdout and stderr piped.
fn spawn_ctr_run(c: &Containerd, extra: &[&str], id: &str, argv: &[&str]) -> std::process::Child {
    let config = c.dir.path().join("shim.json").display().to_string();
    let fifos = c.dir.path().join("fifo").display().to_string();
    Command::new("ctr")
        .arg("-a")
        .arg(c.socket())
        .args([
            "run",
            "--rm",
            "--runtime",
            "io.containerd.turnstile.v2",
            "--runtime-config-path",
            &config,
            "--fifo-dir",
            &fifos,
            "--annotation",
            "io.turnstile.workspace=ws",
            "--annotation",
            "io.turnstile.package=bb",
        ])
        .args(extra)
        .arg(IMAGE)
        .arg(id)
        .args(argv)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until no shim of `c` is running (after a Create that failed or
/// a `--rm` run); panics naming what is left.
fn assert_no_shim(c: &Containerd, after: &str) {
    for _ in 0..50 {
        if c.processes().is_empty() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("after {after}: left running: {:?}", c.processes());
}

fn sessions_in(t: &str) -> Vec<String> {
    t.split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '-'))
        .filter(|w| w.starts_with("SES-"))
        .map(str::to_owned)
        .collect()
}

fn run(c: &Containerd, id: &str, outputs: Option<&str>, script: &str) -> Output {
    let wsa = "io.turnstile.workspace=ws".to_owned();
    let config = c.dir.path().join("shim.json").display().to_string();
    let fifos = c.dir.path().join("fifo").display().to_string();
    let mut args = vec![
        "run",
        "--rm",
        "--runtime",
        "io.containerd.turnstile.v2",
        "--runtime-config-path",
        &config,
        "--fifo-dir",
        &fifos,
        "--annotation",
        &wsa,
        "--annotation",
        "io.turnstile.package=bb",
    ];
    let out;
    if let Some(o) = outputs {
        out = format!("io.turnstile.outputs={o}");
        args.extend(["--annotation", &out]);
    }
    args.extend([IMAGE, id, "sh", "-c", script]);
    c.ctr(&args)
}

/// SIGKILLs `pid`, then waits (at most `secs`) for `ctr run` to end; its
/// exit status must not be success.
fn kill9_and_wait(
    c: &Containerd,
    child: &mut std::process::Child,
    pid: i32,
    secs: u64,
    what: &str,
) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(secs),
            "{what}: ctr run still waits {secs} s after the SIGKILL\n{}",
            c.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_ne!(status.code(), Some(0), "{what}");
}

/// `supervise ledger verify` of `sid` passes.
fn assert_ledgers_verify(fx: &Fixture, sid: &str, what: &str) {
    let v = Command::new(supervise_bin())
        .args(["ledger", "verify", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args(["--session", sid])
        .output()
        .unwrap();
    assert!(v.status.success(), "{what}: {}", text(&v));
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn issue_12_ctr_run_through_the_turnstile_shim_commits_blocks_and_refuses() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(setup) =
        setup("issue_12_ctr_run_through_the_turnstile_shim_commits_blocks_and_refuses")
    else {
        return;
    };
    let before = Leftovers::before();
    let fx = Fixture::new();
    let mut sessions = Vec::new();
    {
        let mut c = containerd(&setup);
        // The runc backend named (as the default was before issue 25), so
        // this test keeps covering an explicit backend.
        options_file(
            c.dir.path(),
            &fx.state,
            &fx.root,
            serde_json::json!({"backend": "runc"}),
        );
        fx.install("bb", BUSYBOX_MANIFEST);
        fx.write("data/in.txt", b"hello\n");
        fx.write("data/secret/key", b"k\n");
        let ws = fx.root.clone();

        // A declared output commits (bytes + ledger).
        let out = run(
            &c,
            "commit",
            Some(r#"[{"path":"output/<session_id>/r.txt","role":"result"}]"#),
            r#"cat data/in.txt > "output/$TURNSTILE_SESSION_ID/r.txt"; cat data/secret/key && echo SECRET-READ; echo ok"#,
        );
        let t = text(&out);
        sessions.extend(sessions_in(&t));
        assert_eq!(out.status.code(), Some(0), "{t}\n{}", c.log());
        assert!(
            t.contains("committed") && t.contains("ok") && !t.contains("SECRET-READ"),
            "{t}"
        );
        let sid = t
            .split_whitespace()
            .find(|w| w.starts_with("SES-"))
            .unwrap()
            .trim_end_matches(':')
            .to_owned();
        assert_eq!(
            std::fs::read(ws.join(format!("output/{sid}/r.txt"))).unwrap(),
            b"hello\n"
        );
        let v = Command::new(supervise_bin())
            .args([
                "ledger",
                "verify",
                "--root",
                ws.to_str().unwrap(),
                "--state-dir",
                fx.state.to_str().unwrap(),
                "--session",
                &sid,
            ])
            .output()
            .unwrap();
        assert!(v.status.success(), "{}", text(&v));

        // An undeclared write blocks: exit 12, nothing committed.
        let out = run(
            &c,
            "block",
            Some("[]"),
            r#"echo x > "output/$TURNSTILE_SESSION_ID/r.txt""#,
        );
        let t = text(&out);
        sessions.extend(sessions_in(&t));
        assert_eq!(out.status.code(), Some(12), "{t}");
        let sid = t
            .split_whitespace()
            .find(|w| w.starts_with("SES-"))
            .unwrap()
            .trim_end_matches(':')
            .to_owned();
        assert!(!ws.join(format!("output/{sid}/r.txt")).exists());

        // A forbidden read fails inside the turn (exit 10: the command failed).
        let out = run(&c, "forbidden", Some("[]"), "cat data/secret/key");
        sessions.extend(sessions_in(&text(&out)));
        assert_eq!(out.status.code(), Some(10), "{}", text(&out));
        assert_no_shim(&c, "a finished run");

        // A capability violation fails the create, naming it; nothing ran.
        let config = c.dir.path().join("shim.json").display().to_string();
        let out = c.ctr(&[
            "run",
            "--rm",
            "--runtime",
            "io.containerd.turnstile.v2",
            "--runtime-config-path",
            &config,
            "--annotation",
            "io.turnstile.workspace=ws",
            "--annotation",
            "io.turnstile.package=bb",
            "--annotation",
            "io.turnstile.outputs=[]",
            IMAGE,
            "violation",
            "/bin/ls",
            "/",
        ]);
        let t = text(&out);
        sessions.extend(sessions_in(&t));
        assert!(!out.status.success() && t.contains("E2042"), "{t}");
        // A failed Create leaves no shim behind.
        assert_no_shim(&c, "a Create refused for a capability violation");

        // FR-RT-013: absent outputs fail the create, naming the annotation.
        let out = run(&c, "no-outputs", None, "true");
        let t = text(&out);
        assert!(
            !out.status.success() && t.contains("io.turnstile.outputs") && t.contains("TS1201"),
            "{t}"
        );
        assert_no_shim(&c, "a Create refused for absent outputs");

        // Only the CRI plugin's pod sandbox runs outside a turn: the
        // sandbox container-type set by hand (no matching sandbox-id) is
        // refused, not run through plain runc.
        let config = c.dir.path().join("shim.json").display().to_string();
        let out = c.ctr(&[
            "run",
            "--rm",
            "--runtime",
            "io.containerd.turnstile.v2",
            "--runtime-config-path",
            &config,
            "--annotation",
            "io.kubernetes.cri.container-type=sandbox",
            IMAGE,
            "fake-sandbox",
            "sh",
            "-c",
            "echo RAN",
        ]);
        let t = text(&out);
        assert!(
            !out.status.success() && t.contains("TS1202") && !t.contains("RAN"),
            "{t}"
        );
        assert_no_shim(&c, "a Create refused for a hand-made sandbox annotation");
        // Both of the CRI plugin's annotations, written by a client of a
        // namespace that is not the CRI plugin's (red-team, wave 3): still
        // refused, never run through plain runc.
        let out = c.ctr(&[
            "run",
            "--rm",
            "--runtime",
            "io.containerd.turnstile.v2",
            "--runtime-config-path",
            &config,
            "--annotation",
            "io.kubernetes.cri.container-type=sandbox",
            "--annotation",
            "io.kubernetes.cri.sandbox-id=posing-sandbox",
            IMAGE,
            "posing-sandbox",
            "sh",
            "-c",
            "echo RAN",
        ]);
        let t = text(&out);
        assert!(
            !out.status.success()
                && t.contains("TS1202")
                && t.contains("k8s.io")
                && !t.contains("RAN"),
            "{t}"
        );
        assert_no_shim(&c, "a Create refused for a sandbox posed outside k8s.io");

        let left = c.ctr(&["containers", "ls", "-q"]);
        assert_eq!(
            String::from_utf8_lossy(&left.stdout).trim(),
            "",
            "containers left"
        );

        // Nothing is left: no containerd, no shim or supervise, no mount
        // under the test's dirs or containerd's, no cgroup of the test's
        // sessions, nothing new under /run/containerd — and no state
        // outside the test's state dir.
        let cgroups: Vec<String> = sessions.iter().map(|s| format!("turnstile/{s}")).collect();
        assert!(!cgroups.is_empty());
        before.assert_clean(
            &mut c,
            &[&fx.root, &fx.state, setup.image_dir.path()],
            &cgroups,
        );
        for sid in &sessions {
            assert!(
                !Path::new("/var/lib/turnstile/sessions").join(sid).exists(),
                "{sid}: state written to /var/lib/turnstile"
            );
        }
    }
}

/// Every path under `dir` (recursively), for "nothing was created".
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

#[test]
fn issue_25_hostile_pods_are_refused_at_create_and_the_trust_level_picks_the_backend() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(setup) =
        setup("issue_25_hostile_pods_are_refused_at_create_and_the_trust_level_picks_the_backend")
    else {
        return;
    };
    let before = Leftovers::before();
    let fx = Fixture::new();
    // Another tenant's workspace, mapped for namespace `tenant-a` only.
    let other = tempfile::tempdir().unwrap();
    let hostile = tempfile::tempdir().unwrap();
    let never = hostile.path().join("never-created");
    let mut sessions = Vec::new();
    {
        let mut c = containerd(&setup);
        // No backend: `supervise` chooses by the package's trust level.
        options_file(
            c.dir.path(),
            &fx.state,
            &fx.root,
            serde_json::json!({"workspaces": {
                "ws": {"root": fx.root, "namespaces": ["default"]},
                "other": {"root": other.path(), "namespaces": ["tenant-a"]},
            }}),
        );
        fx.install("bb", BUSYBOX_MANIFEST);
        let untrusted = BUSYBOX_MANIFEST.replacen('{', r#"{"trust_level": "untrusted","#, 1);
        fx.install("bb-untrusted", &untrusted);
        let root_before = tree(&fx.root);
        let contract = |ws: &str, pkg: &str| {
            vec![
                format!("io.turnstile.workspace={ws}"),
                format!("io.turnstile.package={pkg}"),
                "io.turnstile.outputs=[]".to_owned(),
            ]
        };
        let refused = |annotations: Vec<String>, id: &str, code: &str, names: &str| {
            let out = ctr_run(
                &c,
                &annotations,
                id,
                &["sh", "-c", "echo RAN; touch /tmp/x"],
            );
            let t = text(&out);
            assert!(
                !out.status.success()
                    && t.contains(code)
                    && t.contains(names)
                    && !t.contains("RAN"),
                "{id}: want {code} naming {names}:\n{t}\n{}",
                c.log()
            );
            assert_no_shim(&c, id);
            // Nothing created: no session, no state, nothing in any
            // workspace, not the path the pod named.
            assert!(
                !fx.state.exists(),
                "{id}: state created: {:?}",
                tree(&fx.state)
            );
            assert_eq!(tree(&fx.root), root_before, "{id}");
            assert!(tree(other.path()).is_empty(), "{id}");
            assert!(!never.exists(), "{id}");
        };

        // A workspace annotation that is a host path: refused, whether the
        // path does not exist, is /etc, or is the very workspace's root.
        refused(
            contract(never.to_str().unwrap(), "bb"),
            "hostile-path",
            "TS1043",
            "io.turnstile.workspace",
        );
        refused(
            contract("/etc", "bb"),
            "hostile-etc",
            "TS1043",
            "never a host path",
        );
        refused(
            contract(fx.root.to_str().unwrap(), "bb"),
            "hostile-own-path",
            "TS1043",
            "io.turnstile.workspace",
        );
        refused(contract("..", "bb"), "hostile-dotdot", "TS1043", "`..`");
        // An io.turnstile.* key the contract does not know.
        let mut a = contract("ws", "bb");
        a.push("io.turnstile.foo=bar".to_owned());
        refused(a, "hostile-unknown-key", "TS1047", "io.turnstile.foo");
        // Another tenant's workspace, from namespace `default`.
        refused(
            contract("other", "bb"),
            "hostile-namespace",
            "TS1045",
            "namespace `default`",
        );
        // A name nobody configured.
        refused(
            contract("nope", "bb"),
            "hostile-unknown-name",
            "TS1044",
            "`nope`",
        );

        // No backend configured: a standard package runs on the backend its
        // trust level picks (the built-in table: native), recorded so.
        let out = ctr_run(
            &c,
            &contract("ws", "bb"),
            "by-trust-level",
            &["sh", "-c", "echo ok"],
        );
        let t = text(&out);
        sessions.extend(sessions_in(&t));
        assert_eq!(out.status.code(), Some(0), "{t}\n{}", c.log());
        let sid = sessions.last().expect("a session").clone();
        let ev = turnstile_tests::read_entries(&fx.ledger(&sid, "evidence"));
        let e = &ev.last().unwrap()["enforcement"];
        assert_eq!(e["backend"], "native", "{e}");
        assert!(
            e["backend_chosen_by"]
                .as_str()
                .is_some_and(|s| s.starts_with("trust_level standard")),
            "{e}"
        );
        // A foreign session: another package of the tenant names the
        // session `bb` started. Refused at Start (exit 2, TS1041), nothing
        // runs, and the refusal is in the owner's evidence.
        fx.install("bb2", BUSYBOX_MANIFEST);
        let mut foreign = contract("ws", "bb2");
        foreign.push(format!("io.turnstile.session={sid}"));
        let out = ctr_run(&c, &foreign, "foreign-session", &["sh", "-c", "echo RAN"]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}\n{}", c.log());
        assert!(t.contains("TS1041") && !t.contains("RAN"), "{t}");
        assert_no_shim(&c, "a foreign session");
        let ev = turnstile_tests::read_entries(&fx.ledger(&sid, "evidence"));
        let refusal = ev.last().unwrap();
        assert_eq!(refusal["event"], "session.access_refused", "{refusal}");
        assert_eq!(refusal["owner"]["tenant"], "default", "{refusal}");
        assert_eq!(refusal["requester"]["package"], "bb2", "{refusal}");
        fx.assert_ledgers_intact(&sid);

        // An untrusted package is not run under runc: its level's backend
        // (kata) is not installed here, so `supervise run` refuses (exit
        // 20, E2040, nothing ran) — the shim does not retry another one.
        let out = ctr_run(
            &c,
            &contract("ws", "bb-untrusted"),
            "untrusted",
            &["sh", "-c", "echo RAN"],
        );
        let t = text(&out);
        sessions.extend(sessions_in(&t));
        assert_eq!(out.status.code(), Some(20), "{t}\n{}", c.log());
        assert!(t.contains("E2040") && !t.contains("RAN"), "{t}");
        assert_no_shim(&c, "an untrusted package refused by its backend");

        let cgroups: Vec<String> = sessions.iter().map(|s| format!("turnstile/{s}")).collect();
        before.assert_clean(
            &mut c,
            &[&fx.root, &fx.state, other.path(), setup.image_dir.path()],
            &cgroups,
        );
    }
}

/// `ctr run` with these extra ctr flags (before the image) and the
/// contract of package `pkg` in workspace `ws`.
fn ctr_run_with(c: &Containerd, flags: &[&str], pkg: &str, id: &str, argv: &[&str]) -> Output {
    let config = c.dir.path().join("shim.json").display().to_string();
    let fifos = c.dir.path().join("fifo").display().to_string();
    let package = format!("io.turnstile.package={pkg}");
    let mut args = vec![
        "run",
        "--rm",
        "--runtime",
        "io.containerd.turnstile.v2",
        "--runtime-config-path",
        &config,
        "--fifo-dir",
        &fifos,
        "--annotation",
        "io.turnstile.workspace=ws",
        "--annotation",
        &package,
        "--annotation",
        "io.turnstile.outputs=[]",
    ];
    args.extend(flags);
    args.extend([IMAGE, id]);
    args.extend(argv);
    c.ctr(&args)
}

/// The memory hierarchy's directory of cgroup path `rel` (v1 hybrid
/// here; v2 unified elsewhere).
fn memory_dir(rel: &str) -> PathBuf {
    let v1 = Path::new("/sys/fs/cgroup/memory");
    if v1.join("memory.limit_in_bytes").exists() || v1.is_dir() {
        v1.join(rel.trim_start_matches('/'))
    } else {
        Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'))
    }
}

#[test]
fn issue_25_the_turn_cgroup_lives_under_the_pods_and_an_oom_reaches_containerd() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(setup) =
        setup("issue_25_the_turn_cgroup_lives_under_the_pods_and_an_oom_reaches_containerd")
    else {
        return;
    };
    let before = Leftovers::before();
    let fx = Fixture::new();
    let pod = format!("/turnstile-test-pod-{}", std::process::id());
    let mut sessions = Vec::new();
    {
        let mut c = containerd(&setup);
        options_file(c.dir.path(), &fx.state, &fx.root, serde_json::json!({}));
        // The manifest allows 256 MiB; the pod 32 MiB: the pod's wins.
        let manifest = BUSYBOX_MANIFEST.replace(
            r#""limits": {"timeout_seconds": 30}"#,
            r#""limits": {"timeout_seconds": 30, "memory": "256Mi"}"#,
        );
        fx.install("bb", &manifest);
        let pod_limit = (32u64 << 20).to_string();

        // The turn's cgroup is inside the container's (cgroupfs form): seen
        // from the host while the turn runs (the turn itself is in a cgroup
        // namespace), holding its processes, under the pod's limit.
        let cg = format!("{pod}/c1");
        let watch_dir = memory_dir(&cg);
        let watcher = std::thread::spawn(move || {
            for _ in 0..300 {
                for e in std::fs::read_dir(&watch_dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let procs =
                        std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
                    if e.path().is_dir() && !procs.trim().is_empty() {
                        let limit =
                            std::fs::read_to_string(watch_dir.join("memory.limit_in_bytes"))
                                .unwrap_or_default();
                        return Some((e.file_name().to_string_lossy().into_owned(), limit));
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            None
        });
        let out = ctr_run_with(
            &c,
            &["--cgroup", &cg, "--memory-limit", &pod_limit],
            "bb",
            "pod-cgroup",
            &["sh", "-c", "sleep 2; echo done"],
        );
        let t = text(&out);
        sessions.extend(sessions_in(&t));
        assert_eq!(out.status.code(), Some(0), "{t}\n{}", c.log());
        let sid = sessions.last().expect("a session").clone();
        let (seen, limit) = watcher
            .join()
            .unwrap()
            .expect("no turn cgroup under the pod's");
        assert_eq!(seen, format!("{sid}-t1"));
        if memory_dir("/").join("memory.limit_in_bytes").exists() {
            assert_eq!(limit.trim(), pod_limit);
        }
        let ev = turnstile_tests::read_entries(&fx.ledger(&sid, "evidence"));
        let r = &ev.last().unwrap()["resources"]["cgroup_parent"];
        assert_eq!(r["path"], cg.as_str(), "{r}");
        assert_eq!(r["parent_memory_bytes"], 32u64 << 20, "{r}");
        assert_eq!(r["manifest_memory_bytes"], 256u64 << 20, "{r}");
        assert_eq!(r["effective_memory_bytes"], 32u64 << 20, "{r}");
        assert_eq!(r["memory_bound_by"], "parent", "{r}");
        // Delete removed the container's cgroup the shim made (and the
        // pod directory above it, which it also made).
        assert!(!memory_dir(&cg).exists(), "{cg} left");

        // Beyond the pod's limit (below the manifest's): OOM-killed at the
        // pod's limit; containerd hears TaskOOM; the evidence says so.
        let events = std::process::Command::new("ctr")
            .arg("-a")
            .arg(c.socket())
            .arg("events")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let cg2 = format!("{pod}/c2");
        let out = ctr_run_with(
            &c,
            &["--cgroup", &cg2, "--memory-limit", &pod_limit],
            "bb",
            "pod-oom",
            &[
                "sh",
                "-c",
                "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo ${#x}",
            ],
        );
        let t = text(&out);
        sessions.extend(sessions_in(&t));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(events.id()).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        );
        let seen = events.wait_with_output().unwrap();
        let seen = String::from_utf8_lossy(&seen.stdout).into_owned();
        assert_eq!(out.status.code(), Some(13), "{t}\n{}", c.log());
        assert!(
            seen.lines()
                .any(|l| l.contains("/tasks/oom") && l.contains("pod-oom")),
            "no TaskOOM: {seen}"
        );
        let sid = sessions.last().expect("a session").clone();
        let ev = turnstile_tests::read_entries(&fx.ledger(&sid, "evidence"));
        let last = ev.last().unwrap();
        assert_eq!(last["status"], "memory_limit", "{last}");
        assert_eq!(last["resources"]["oom_killed"], true, "{last}");
        assert_eq!(
            last["resources"]["cgroup_parent"]["effective_memory_bytes"],
            32u64 << 20
        );
        // Its peak stayed at the pod's limit (the kernel charges in
        // batches: a few pages over), far below the manifest's.
        let peak = last["resources"]["peak_memory_bytes"].as_u64().unwrap();
        assert!(peak <= 33 << 20, "peak {peak}");
        fx.assert_ledgers_intact(&sid);

        // The systemd form, expanded as runc does.
        let slice = format!("turnstiletest{}.slice", std::process::id());
        let systemd = format!("{slice}:tstest:c3");
        let out = ctr_run_with(
            &c,
            &["--cgroup", &systemd],
            "bb",
            "pod-systemd",
            &["sh", "-c", "echo ok"],
        );
        let t = text(&out);
        sessions.extend(sessions_in(&t));
        assert_eq!(out.status.code(), Some(0), "{t}\n{}", c.log());
        let sid = sessions.last().expect("a session").clone();
        let ev = turnstile_tests::read_entries(&fx.ledger(&sid, "evidence"));
        assert_eq!(
            ev.last().unwrap()["resources"]["cgroup_parent"]["path"],
            format!("/{slice}/tstest-c3.scope").as_str()
        );
        // A cgroupsPath with `..`: refused at Create, nothing created.
        let out = ctr_run_with(
            &c,
            &["--cgroup", "/turnstile-test-x/../escape"],
            "bb",
            "pod-dotdot",
            &["sh", "-c", "echo RAN"],
        );
        let t = text(&out);
        assert!(
            !out.status.success() && t.contains("TS1042") && !t.contains("RAN"),
            "{t}"
        );
        assert!(!memory_dir("/turnstile-test-x").exists());
        assert!(!memory_dir("/escape").exists());
        assert_no_shim(&c, "a bad cgroupsPath");

        let mut cgroups: Vec<String> = sessions.iter().map(|s| format!("turnstile/{s}")).collect();
        cgroups.push(pod.trim_start_matches('/').to_owned());
        cgroups.push(slice.trim_end_matches(".slice").to_owned());
        before.assert_clean(
            &mut c,
            &[&fx.root, &fx.state, setup.image_dir.path()],
            &cgroups,
        );
    }
}

#[test]
fn issue_25_pause_resume_stats_exec_and_whole_logs_through_ctr() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(setup) = setup("issue_25_pause_resume_stats_exec_and_whole_logs_through_ctr") else {
        return;
    };
    let before = Leftovers::before();
    let fx = Fixture::new();
    let pod = format!("/turnstile-test-pause-{}", std::process::id());
    let mut sessions = Vec::new();
    {
        let mut c = containerd(&setup);
        options_file(c.dir.path(), &fx.state, &fx.root, serde_json::json!({}));
        // A 4 s timeout; the turn is ~3 s of work and is paused for 4 s.
        let manifest = BUSYBOX_MANIFEST.replace(
            r#""limits": {"timeout_seconds": 30}"#,
            r#""limits": {"timeout_seconds": 4}"#,
        );
        fx.install("bb", &manifest);
        let cg = format!("{pod}/c1");
        let mut child = spawn_ctr_run(
            &c,
            &["--annotation", "io.turnstile.outputs=[]", "--cgroup", &cg],
            "pausable",
            &[
                "sh",
                "-c",
                "i=0; while [ $i -lt 30 ]; do i=$((i+1)); echo tick$i; sleep 0.1; done",
            ],
        );
        let started = std::time::Instant::now();
        let lines = std::sync::Arc::new(Mutex::new(Vec::<String>::new()));
        let reader = {
            let lines = std::sync::Arc::clone(&lines);
            let out = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(l);
                }
            })
        };
        while lines.lock().unwrap().len() < 3 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "no output\n{}",
                c.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Stats: real numbers from the container's cgroup.
        let m = c.ctr(&["tasks", "metrics", "--format", "json", "pausable"]);
        let mt = text(&m);
        assert!(m.status.success(), "{mt}\n{}", c.log());
        let mv: serde_json::Value = serde_json::from_slice(&m.stdout).expect("metrics json");
        let usage = mv["memory"]["usage"]["usage"]
            .as_u64()
            .or_else(|| mv["memory"]["usage"].as_u64())
            .unwrap_or(0);
        assert!(usage > 0, "memory usage: {mt}");
        assert!(mv["pids"]["current"].as_u64().unwrap_or(0) >= 1, "{mt}");
        // Exec: refused, with why.
        let e = c.ctr(&[
            "tasks",
            "exec",
            "--exec-id",
            "x1",
            "pausable",
            "sh",
            "-c",
            "echo EXEC",
        ]);
        let et = text(&e);
        assert!(
            !e.status.success() && et.contains("TS1206") && et.contains("one admitted command"),
            "{et}"
        );
        // Pause: the counter stops, for longer than the whole timeout.
        let p = c.ctr(&["tasks", "pause", "pausable"]);
        assert!(p.status.success(), "{}\n{}", text(&p), c.log());
        std::thread::sleep(std::time::Duration::from_millis(300));
        let frozen_at = lines.lock().unwrap().len();
        let ls = c.ctr(&["tasks", "ls"]);
        assert!(
            text(&ls)
                .lines()
                .any(|l| l.contains("pausable") && l.contains("PAUSED")),
            "{}",
            text(&ls)
        );
        std::thread::sleep(std::time::Duration::from_millis(4000));
        assert_eq!(
            lines.lock().unwrap().len(),
            frozen_at,
            "advanced while paused"
        );
        let r = c.ctr(&["tasks", "resume", "pausable"]);
        assert!(r.status.success(), "{}\n{}", text(&r), c.log());
        let status = child.wait().unwrap();
        reader.join().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        sessions.extend(sessions_in(&err));
        assert!(started.elapsed() > std::time::Duration::from_secs(6));
        assert_eq!(status.code(), Some(0), "{err}\n{}", c.log());
        assert_eq!(lines.lock().unwrap().len(), 30);
        let sid = sessions.last().expect("a session").clone();
        let ev = turnstile_tests::read_entries(&fx.ledger(&sid, "evidence"));
        let last = ev.last().unwrap();
        assert_eq!(last["status"], "committed", "{last}");
        let facts: Vec<&str> = last["suspensions"]
            .as_array()
            .expect("suspensions")
            .iter()
            .filter_map(|f| f["event"].as_str())
            .collect();
        assert_eq!(facts, ["turn.suspended", "turn.resumed"]);
        assert_no_shim(&c, "the paused turn");

        // Logs over the manifest's 1 MiB output_bytes arrive whole.
        let out = ctr_run_with(
            &c,
            &[],
            "bb",
            "big-log",
            &["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' a"],
        );
        sessions.extend(sessions_in(&text(&out)));
        assert_eq!(out.status.code(), Some(0), "{}", c.log());
        assert_eq!(out.stdout.len(), 3_000_000);
        assert!(out.stdout.iter().all(|b| *b == b'a'));
        let sid = sessions.last().expect("a session").clone();
        let ev = turnstile_tests::read_entries(&fx.ledger(&sid, "evidence"));
        let o = &ev.last().unwrap()["output"];
        assert_eq!(o["stdout"]["forwarded"], 3_000_000, "{o}");
        assert_eq!(o["truncated"], false, "{o}");
        assert_eq!(o["forwarded_whole"], true, "{o}");

        let mut cgroups: Vec<String> = sessions.iter().map(|s| format!("turnstile/{s}")).collect();
        cgroups.push(pod.trim_start_matches('/').to_owned());
        before.assert_clean(
            &mut c,
            &[&fx.root, &fx.state, setup.image_dir.path()],
            &cgroups,
        );
    }
}

/// `kill -9` of the shim mid-turn, under the trust level's backend and
/// under runc: containerd runs the shim's `delete` for the dead shim,
/// which ends the turn it left (SIGTERM: recorded `interrupted`). The
/// turn's declared output, already written, is not committed; the
/// ledgers verify; `ctr run` sees the task end; nothing is left (no
/// supervise, no runtime record, no mount, no cgroup).
#[test]
fn issue_25_a_sigkilled_shim_ends_its_turn_recorded_and_leaves_nothing() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(setup) = setup("issue_25_a_sigkilled_shim_ends_its_turn_recorded_and_leaves_nothing")
    else {
        return;
    };
    let before = Leftovers::before();
    let fx = Fixture::new();
    let mut sessions = Vec::new();
    {
        let mut c = containerd(&setup);
        fx.install("bb", BUSYBOX_MANIFEST);
        for (i, backend) in [None, Some("runc")].into_iter().enumerate() {
            let extra = match backend {
                Some(b) => serde_json::json!({ "backend": b }),
                None => serde_json::json!({}),
            };
            options_file(c.dir.path(), &fx.state, &fx.root, extra);
            let id = format!("shimkill{i}");
            let known: std::collections::BTreeSet<String> =
                std::fs::read_dir(fx.state.join("sessions"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
            let mut child = spawn_ctr_run(
                &c,
                &[
                    "--annotation",
                    r#"io.turnstile.outputs=[{"path":"output/<session_id>/r.txt","role":"result"}]"#,
                ],
                &id,
                &[
                    "sh",
                    "-c",
                    r#"echo partial > "output/$TURNSTILE_SESSION_ID/r.txt"; echo READY; sleep 30"#,
                ],
            );
            let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            std::io::BufRead::read_line(&mut out, &mut line).unwrap();
            assert_eq!(line.trim(), "READY", "{backend:?}: {line}\n{}", c.log());
            let shims: Vec<(i32, String)> = c
                .processes()
                .into_iter()
                .filter(|(_, cmd)| {
                    cmd.contains("containerd-shim-turnstile-v2") && cmd.contains(&id)
                })
                .collect();
            assert_eq!(shims.len(), 1, "{backend:?}: {shims:?}");
            let sid = std::fs::read_dir(fx.state.join("sessions"))
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|s| !known.contains(s))
                .expect("the turn's session");
            sessions.push(sid.clone());
            // ctr sees the task end (containerd ran the dead shim's delete).
            kill9_and_wait(
                &c,
                &mut child,
                shims[0].0,
                30,
                &format!("{backend:?}: the shim"),
            );
            // The turn ended, recorded; nothing of it committed.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            let last = loop {
                let ev = turnstile_tests::read_entries(&fx.ledger(&sid, "evidence"));
                if let Some(last) = ev.last().filter(|e| e["turn_number"] == 1) {
                    break last.clone();
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{backend:?}: no finish entry 20 s after the shim's SIGKILL\n{}",
                    c.log()
                );
                std::thread::sleep(std::time::Duration::from_millis(100));
            };
            assert_eq!(last["status"], "interrupted", "{backend:?}: {last}");
            assert!(
                !fx.root.join(format!("output/{sid}/r.txt")).exists(),
                "{backend:?}: the killed turn's output was committed"
            );
            assert_ledgers_verify(&fx, &sid, &format!("{backend:?}"));
            let left: Vec<(i32, String)> = turnstile_tests::containerd::processes_naming(&sid);
            assert!(left.is_empty(), "{backend:?}: left running: {left:?}");
        }
        let cgroups: Vec<String> = sessions.iter().map(|s| format!("turnstile/{s}")).collect();
        before.assert_clean(
            &mut c,
            &[&fx.root, &fx.state, setup.image_dir.path()],
            &cgroups,
        );
    }
}

/// Red-team finding (wave 3): a `supervise run` SIGKILLed under the shim
/// (native backend: its turn's mounts and cgroup outlive it) is recovered
/// by the shim before containerd hears the exit — the turn closed in its
/// ledger, no turn directory, mount or process left — not only by a later
/// `supervise recover` (a pod's session seldom has another turn).
#[test]
fn a_sigkilled_supervise_run_under_the_shim_is_recovered_by_the_shim() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(setup) = setup("a_sigkilled_supervise_run_under_the_shim_is_recovered_by_the_shim")
    else {
        return;
    };
    // Natively, and under runc: an OCI turn's guard outlives the run and
    // takes the session's lock to remove the container (red-team wave 4:
    // the shim's recovery passed the session over as busy).
    for backend in [None, Some("runc")] {
        let before = Leftovers::before();
        let fx = Fixture::new();
        let sid;
        {
            let mut c = containerd(&setup);
            fx.install("bb", BUSYBOX_MANIFEST);
            options_file(
                c.dir.path(),
                &fx.state,
                &fx.root,
                backend.map_or_else(
                    || serde_json::json!({}),
                    |b| serde_json::json!({ "backend": b }),
                ),
            );
            let id = if backend.is_some() {
                "runkill-oci"
            } else {
                "runkill"
            };
            let mut child = spawn_ctr_run(
                &c,
                &["--annotation", "io.turnstile.outputs=[]"],
                id,
                &["sh", "-c", "echo READY; sleep 30"],
            );
            let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            std::io::BufRead::read_line(&mut out, &mut line).unwrap();
            assert_eq!(line.trim(), "READY", "{line}\n{}", c.log());
            sid = std::fs::read_dir(fx.state.join("sessions"))
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|s| s.starts_with("SES-"))
                .expect("the turn's session");
            let runs: Vec<(i32, String)> = c
                .processes()
                .into_iter()
                .filter(|(_, cmd)| {
                    cmd.contains("supervise") && cmd.contains(" run ") && cmd.contains(id)
                })
                .collect();
            assert_eq!(runs.len(), 1, "{runs:?}");
            kill9_and_wait(&c, &mut child, runs[0].0, 60, "supervise run");
            // By the time containerd heard the exit, the shim had recovered it.
            let ev = turnstile_tests::read_entries(&fx.ledger(&sid, "evidence"));
            let last = ev.last().expect("evidence entries");
            assert_eq!(last["turn_number"], 1, "{backend:?}: {last}");
            assert_eq!(last["status"], "aborted", "{backend:?}: {last}");
            assert!(
                !fx.state.join(format!("sessions/{sid}/turn-1")).exists(),
                "the killed turn's directory is left"
            );
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            assert!(
                !mounts.contains(&fx.state.display().to_string()),
                "mounts left under the state dir"
            );
            assert_ledgers_verify(&fx, &sid, "supervise run");
            let left = turnstile_tests::containerd::processes_naming(&sid);
            assert!(left.is_empty(), "left running: {left:?}");
            before.assert_clean(
                &mut c,
                &[&fx.root, &fx.state, setup.image_dir.path()],
                &[format!("turnstile/{sid}")],
            );
        }
    }
}
