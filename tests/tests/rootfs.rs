//! `supervise run --rootfs DIR` (issue 12): the turn's system view from an
//! image rootfs instead of the host — the image's files are there, the
//! host's `/usr` is not — while the workspace keeps its host path and its
//! writes are captured, verified and committed or blocked exactly as
//! without it. On native and runc (the containerd shim's default).

use turnstile_tests::{BUSYBOX_MANIFEST, Fixture, busybox_rootfs, require_root};

const SCRIPT: &str = r#"cat data/in.txt > "output/$TURNSTILE_SESSION_ID/r.txt"
cat /etc/os-release
test -e /usr/bin/python3 && echo HOST-USR-VISIBLE
cat data/secret/key && echo SECRET-READ
id -u"#;

#[test]
fn issue_12_rootfs_is_the_system_view_on_native_and_runc() {
    if !require_root("issue_12_rootfs_is_the_system_view_on_native_and_runc") {
        return;
    }
    let image = tempfile::tempdir().unwrap();
    let rootfs = image.path().join("rootfs");
    if !busybox_rootfs(&rootfs) {
        assert!(
            std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() != Ok("1"),
            "busybox-static is required"
        );
        return;
    }
    let rootfs = rootfs.to_str().unwrap();
    for backend in ["native", "runc"] {
        let fx = Fixture::new();
        fx.install("bb", BUSYBOX_MANIFEST);
        fx.write("data/in.txt", b"hello\n");
        fx.write("data/secret/key", b"k\n");
        let common = ["--json", "--backend", backend, "--rootfs", rootfs];

        let mut args = common.to_vec();
        args.extend([
            "--output",
            "output/<session_id>/r.txt:result",
            "--",
            "/bin/sh",
            "-c",
            SCRIPT,
        ]);
        let r = fx.run("bb", &args);
        let v = r.json();
        assert_eq!(r.status, 0, "{backend}: {}", r.stderr);
        assert!(
            r.stderr.contains("turnstile test image"),
            "{backend}: {}",
            r.stderr
        );
        assert!(
            !r.stderr.contains("HOST-USR-VISIBLE"),
            "{backend}: {}",
            r.stderr
        );
        assert!(!r.stderr.contains("SECRET-READ"), "{backend}: {}", r.stderr);
        assert!(r.stderr.contains("65534"), "{backend}: {}", r.stderr);
        let sid = v["session_id"].as_str().unwrap().to_owned();
        assert_eq!(v["status"], "committed", "{backend}: {v}");
        assert_eq!(
            std::fs::read(fx.root.join(format!("output/{sid}/r.txt"))).unwrap(),
            b"hello\n"
        );
        fx.assert_ledgers_intact(&sid);

        // An undeclared write blocks (exit 12), nothing reaches the host.
        let mut args = common.to_vec();
        args.extend(["--no-outputs", "--", "/bin/sh", "-c", SCRIPT]);
        let r = fx.run("bb", &args);
        let v = r.json();
        assert_eq!(r.status, 12, "{backend}: {}", r.stderr);
        let sid = v["session_id"].as_str().unwrap().to_owned();
        assert!(!fx.root.join(format!("output/{sid}/r.txt")).exists());
        fx.assert_ledgers_intact(&sid);

        // A program the image does not have is refused before anything
        // runs, even though the host has it.
        let mut args = common.to_vec();
        args.extend(["--no-outputs", "--", "/usr/bin/python3", "-c", "1"]);
        let r = fx.run("bb", &args);
        assert_ne!(r.status, 0, "{backend}: {}", r.stderr);
    }
}

#[test]
fn issue_12_rootfs_must_be_an_image_dir_apart_from_the_workspace() {
    let fx = Fixture::new();
    fx.install("bb", BUSYBOX_MANIFEST);
    let inside = fx.root.join("data");
    std::fs::create_dir_all(&inside).unwrap();
    for bad in ["/", "/nonexistent/rootfs", inside.to_str().unwrap()] {
        let before = fx.snapshot();
        let r = fx.run(
            "bb",
            &[
                "--json",
                "--rootfs",
                bad,
                "--no-outputs",
                "--",
                "/bin/sh",
                "-c",
                "true",
            ],
        );
        assert_eq!(r.status, 2, "{bad}: {}", r.stderr);
        assert!(r.stdout.contains("--rootfs"), "{bad}: {}", r.stdout);
        assert_eq!(before, fx.snapshot(), "{bad}: something was created");
    }
}
