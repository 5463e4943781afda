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
//! mount under its root or /run/containerd.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use turnstile_tests::containerd::{Containerd, Leftovers};
use turnstile_tests::{BUSYBOX_MANIFEST, Fixture, busybox_rootfs, require_root, supervise_bin};

const IMAGE: &str = "docker.io/turnstile/busybox:test";

/// The shim's options for this test: state in the test's own directory
/// (never /var/lib/turnstile), handed over as containerd's runtime
/// options do (`ctr run --runtime-config-path`).
fn options_file(dir: &Path, state: &Path) -> PathBuf {
    let p = dir.join("shim.json");
    std::fs::write(
        &p,
        serde_json::json!({ "state_dir": state, "supervise": supervise_bin() }).to_string(),
    )
    .unwrap();
    p
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

fn run(c: &Containerd, ws: &Path, id: &str, outputs: Option<&str>, script: &str) -> Output {
    let wsa = format!("io.turnstile.workspace={}", ws.display());
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

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn issue_12_ctr_run_through_the_turnstile_shim_commits_blocks_and_refuses() {
    if !require_root("issue_12_ctr_run_through_the_turnstile_shim_commits_blocks_and_refuses") {
        return;
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
            return;
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
        return;
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

    let before = Leftovers::before();
    let fx = Fixture::new();
    let mut sessions = Vec::new();
    {
        let mut c = Containerd::start(
            shim.parent().unwrap(),
            "[plugins.\"io.containerd.grpc.v1.cri\"]\n  disable = true",
        );
        options_file(c.dir.path(), &fx.state);
        let imported = c.ctr(&["images", "import", archive.to_str().unwrap()]);
        assert!(imported.status.success(), "{}", text(&imported));

        fx.install("bb", BUSYBOX_MANIFEST);
        fx.write("data/in.txt", b"hello\n");
        fx.write("data/secret/key", b"k\n");
        let ws = fx.root.clone();

        // A declared output commits (bytes + ledger).
        let out = run(
            &c,
            &ws,
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
            &ws,
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
        let out = run(&c, &ws, "forbidden", Some("[]"), "cat data/secret/key");
        sessions.extend(sessions_in(&text(&out)));
        assert_eq!(out.status.code(), Some(10), "{}", text(&out));
        assert_no_shim(&c, "a finished run");

        // A capability violation fails the create, naming it; nothing ran.
        let wsa = format!("io.turnstile.workspace={}", ws.display());
        let config = c.dir.path().join("shim.json").display().to_string();
        let out = c.ctr(&[
            "run",
            "--rm",
            "--runtime",
            "io.containerd.turnstile.v2",
            "--runtime-config-path",
            &config,
            "--annotation",
            &wsa,
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
        let out = run(&c, &ws, "no-outputs", None, "true");
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
        before.assert_clean(&mut c, &[&fx.root, &fx.state, image_dir.path()], &cgroups);
        for sid in &sessions {
            assert!(
                !Path::new("/var/lib/turnstile/sessions").join(sid).exists(),
                "{sid}: state written to /var/lib/turnstile"
            );
        }
    }
}
