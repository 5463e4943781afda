//! Issue 31 item 6: install as a service. `cargo xtask package --debug
//! --no-build` builds the .deb from the binaries the test run built; the test installs it into a clean root with dpkg
//! (`--root`, maintainer scripts chrootless with `$DPKG_ROOT`, the
//! libraries' dependencies taken from the host), checks the unit with
//! `systemd-analyze verify --root`, starts the daemon exactly as the unit
//! says (ExecStart, RuntimeDirectory, StateDirectory, Environment —
//! relocated under the root: these hosts' PID 1 is not systemd), runs a
//! turn over its socket, stops it with the unit's KillSignal and purges
//! the package: every file it installed is gone, the runtime directory
//! too, and the state directory is kept only because it holds a session's
//! evidence.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use turnstile_tests::{Fixture, HELLO_MANIFEST, require_root};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn tool(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn dpkg(root: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .args([
            "--force-script-chrootless",
            "--force-depends",
            "--force-not-root",
            "--log=/dev/null",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dpkg {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The unit's `Key=value` settings (the last of each key).
fn unit_settings(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

#[test]
fn issue_31_the_deb_installs_runs_a_turn_as_its_unit_says_and_purges() {
    if !require_root("issue_31_the_deb_installs_runs_a_turn_as_its_unit_says_and_purges") {
        return;
    }
    let strict = std::env::var_os("TURNSTILE_REQUIRE_KERNEL").is_some();
    for t in ["dpkg", "dpkg-deb", "systemd-analyze", "gzip"] {
        if !tool(t) {
            assert!(!strict, "{t} is required");
            eprintln!("SKIP: {t} missing");
            return;
        }
    }
    // The package, from the debug binaries the test run already built.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "run",
            "--quiet",
            "-p",
            "xtask",
            "--",
            "package",
            "--debug",
            "--no-build",
        ])
        .current_dir(workspace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo xtask package --debug: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .lines()
            .last()
            .unwrap(),
    );
    assert!(deb.is_file(), "{}", deb.display());
    let info = Command::new("dpkg-deb")
        .arg("--info")
        .arg(&deb)
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    for want in [
        "Package: turnstile",
        "Depends: libc6, libseccomp2",
        "postinst",
        "prerm",
        "postrm",
        "conffiles",
    ] {
        assert!(info.contains(want), "dpkg-deb --info lacks {want}:\n{info}");
    }

    // A clean root with an empty dpkg database.
    let root = tempfile::Builder::new()
        .prefix("ts-deb-root-")
        .tempdir()
        .unwrap();
    let r = root.path();
    for d in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
    ] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::write(r.join("var/lib/dpkg/status"), "").unwrap();
    dpkg(r, &["--install", deb.to_str().unwrap()]);
    let listed = dpkg(r, &["--listfiles", "turnstile"]);
    let files: Vec<PathBuf> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| r.join(l.trim_start_matches('/')))
        .filter(|p| p.is_file())
        .collect();
    for want in [
        "usr/bin/supervise",
        "usr/bin/turnstile-init",
        "usr/bin/containerd-shim-turnstile-v2",
        "lib/systemd/system/turnstile-serve.service",
        "etc/turnstile/config.json",
        "usr/share/man/man1/supervise.1.gz",
        "usr/share/bash-completion/completions/supervise",
    ] {
        assert!(
            files.contains(&r.join(want)),
            "not installed: {want} ({files:?})"
        );
    }
    let state = r.join("var/lib/turnstile");
    assert_eq!(
        std::fs::metadata(&state).unwrap().permissions().mode() & 0o777,
        0o700,
        "postinst makes the state dir 0700"
    );
    // The installed binary runs and its config is valid.
    let sup = r.join("usr/bin/supervise");
    let v = Command::new(&sup).arg("--version").output().unwrap();
    assert!(v.status.success());

    // The unit as systemd reads it.
    let unit_path = r.join("lib/systemd/system/turnstile-serve.service");
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", r.display()))
        // A clean root has no sysinit.target &c.: check this unit only.
        .arg("--recursive-errors=no")
        .arg("/lib/systemd/system/turnstile-serve.service")
        .output()
        .unwrap();
    let verr = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && !verr.contains("turnstile-serve.service:"),
        "systemd-analyze verify: {verr}"
    );
    let unit = unit_settings(&std::fs::read_to_string(&unit_path).unwrap());
    let relocate = |w: &str| -> String {
        if ["/usr/", "/var/", "/run/", "/etc/"]
            .iter()
            .any(|p| w.starts_with(p))
        {
            format!("{}{w}", r.display())
        } else if w.starts_with("127.0.0.1:") {
            "127.0.0.1:0".to_owned() // the port may be taken on a shared host
        } else {
            w.to_owned()
        }
    };
    let exec: Vec<String> = unit["ExecStart"].split_whitespace().map(relocate).collect();
    for (dir_key, mode_key, base) in [
        ("RuntimeDirectory", "RuntimeDirectoryMode", "run"),
        ("StateDirectory", "StateDirectoryMode", "var/lib"),
    ] {
        let d = r.join(base).join(&unit[dir_key]);
        std::fs::create_dir_all(&d).unwrap();
        let mode = u32::from_str_radix(&unit[mode_key], 8).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let (env_k, env_v) = unit["Environment"].split_once('=').unwrap();
    assert_eq!(unit["KillSignal"], "SIGTERM");
    let log = r.join("daemon.log");
    let mut daemon = Command::new(&exec[0])
        .args(&exec[1..])
        .env(env_k, env_v)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let socket = r.join("run/turnstile/turnstile.sock");
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(&socket).is_err() {
        assert!(
            Instant::now() < deadline,
            "the unit's daemon did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // A turn over the socket, with the installed client.
    let fx = Fixture::new();
    fx.install("hello-agent", HELLO_MANIFEST);
    let out = Command::new(&sup)
        .args(["run", "--server"])
        .arg(&socket)
        .arg("--root")
        .arg(&fx.root)
        .args([
            "--package",
            "hello-agent",
            "--no-outputs",
            "--json",
            "--",
            "/bin/true",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "committed");
    let sid = v["session_id"].as_str().unwrap().to_owned();
    let h = Command::new(&sup)
        .args(["health", "--server"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(h.status.success(), "{}", String::from_utf8_lossy(&h.stderr));

    // Stop as the unit does: SIGTERM, within TimeoutStopSec.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let stop_by = Instant::now() + Duration::from_secs(unit["TimeoutStopSec"].parse().unwrap());
    let status = loop {
        if let Some(s) = daemon.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < stop_by,
            "the daemon outlived TimeoutStopSec"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert!(!socket.exists(), "the socket is removed at stop");
    // The turn's ledgers verify against the package's state dir.
    let verify = Command::new(&sup)
        .args(["ledger", "verify", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&state)
        .args(["--session", &sid])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );

    // Purge: the package's files and runtime dir go; evidence stays.
    let purged = dpkg(r, &["--purge", "turnstile"]);
    let said = String::from_utf8_lossy(&purged.stderr);
    for f in &files {
        assert!(!f.exists(), "left after purge: {}", f.display());
    }
    assert!(
        !r.join("etc/turnstile").exists(),
        "the conffile's dir is gone"
    );
    assert!(!r.join("run/turnstile").exists(), "the runtime dir is gone");
    assert!(
        state.join("sessions").join(&sid).exists(),
        "the state dir with a session's evidence is kept"
    );
    assert!(said.contains("kept"), "purge says what it kept: {said}");
    let status = std::fs::read_to_string(r.join("var/lib/dpkg/status")).unwrap();
    assert!(!status.contains("Package: turnstile"), "{status}");
}
