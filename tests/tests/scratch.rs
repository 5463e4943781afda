//! Scratch carry-over is lossless for what programs need (root, real
//! turns): exec bits (never set-id), symlinks, empty directories, deletions
//! and replaced directories reach `tmp/<sid>/` exactly; declared outputs
//! keep their exec bit and belong to the workspace's owner.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use turnstile_tests::{Fixture, require_root};

const MANIFEST: &str = r#"{
  "capabilities": {
    "write": ["output/<session_id>/**"],
    "execute": ["/bin/sh", "/bin/chmod", "/bin/ln", "/bin/mkdir", "/bin/rm", "/usr/bin/basename"]
  }
}"#;

fn turn(
    fx: &Fixture,
    sid: Option<&str>,
    outputs: &[&str],
    script: &str,
) -> (i32, serde_json::Value) {
    let mut args: Vec<&str> = vec!["--json"];
    if let Some(s) = sid {
        args.extend(["--session", s]);
    }
    if outputs.is_empty() {
        args.push("--no-outputs");
    }
    for o in outputs {
        args.extend(["--output", o]);
    }
    args.extend(["--", "/bin/sh", "-c", script]);
    let r = fx.run("s", &args);
    (r.status, r.json())
}

#[test]
fn fr_rt_012_scratch_keeps_modes_symlinks_empty_dirs_and_deletions() {
    if !require_root("fr_rt_012_scratch_keeps_modes_symlinks_empty_dirs_and_deletions") {
        return;
    }
    let fx = Fixture::new();
    fx.install("s", MANIFEST);
    let (status, v) = turn(
        &fx,
        None,
        &[],
        "set -e; cd $TMPDIR; printf '#!/bin/sh\\necho hi\\n' > run.sh; chmod 755 run.sh; \
         echo data > plain; chmod 640 plain; echo s > suid; chmod 4755 suid; \
         ln -s run.sh link; ln -s /etc/shadow dangling; mkdir -p empty tree/sub; \
         echo x > tree/sub/x; echo gone > gone",
    );
    assert_eq!(status, 0, "{v}");
    let sid = v["session_id"].as_str().unwrap().to_owned();
    let tmp = fx.root.join("tmp").join(&sid);
    let mode = |p: &str| {
        std::fs::symlink_metadata(tmp.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("run.sh"), 0o755);
    assert_eq!(mode("plain"), 0o640);
    assert_eq!(mode("suid"), 0o755, "set-id bits never carry over");
    assert_eq!(
        std::fs::read_link(tmp.join("link")).unwrap().to_str(),
        Some("run.sh")
    );
    assert_eq!(
        std::fs::read_link(tmp.join("dangling")).unwrap().to_str(),
        Some("/etc/shadow")
    );
    assert!(tmp.join("empty").is_dir());
    assert_eq!(std::fs::read(tmp.join("tree/sub/x")).unwrap(), b"x\n");

    // The next turn sees all of it, runs the script through the symlink,
    // deletes a file, replaces a directory.
    let (status, v) = turn(
        &fx,
        Some(&sid),
        &[],
        "set -e; cd $TMPDIR; test \"$(/bin/sh ./link)\" = hi; test -d empty; rm gone; \
         rm -r tree; mkdir tree; echo new > tree/only",
    );
    assert_eq!(status, 0, "{v}");
    assert!(!tmp.join("gone").exists());
    assert!(
        !tmp.join("tree/sub").exists(),
        "the replaced dir kept old entries"
    );
    assert_eq!(std::fs::read(tmp.join("tree/only")).unwrap(), b"new\n");
    // No commit debris beside the scratch dir.
    for e in std::fs::read_dir(fx.root.join("tmp")).unwrap().flatten() {
        assert_eq!(e.file_name().to_str(), Some(sid.as_str()));
    }
}

#[test]
fn fr_rt_015_outputs_keep_their_exec_bit_and_belong_to_the_workspace_owner() {
    if !require_root("fr_rt_015_outputs_keep_their_exec_bit_and_belong_to_the_workspace_owner") {
        return;
    }
    let fx = Fixture::new();
    fx.install("s", MANIFEST);
    // A workspace owned by someone else than root.
    std::os::unix::fs::chown(&fx.root, Some(1234), Some(2345)).unwrap();
    let (status, v) = turn(
        &fx,
        None,
        &[
            "output/<session_id>/tool:bin",
            "output/<session_id>/notes.txt:doc",
        ],
        "set -e; o=output/$(basename $TMPDIR); printf '#!/bin/sh\\n' > $o/tool; chmod 4755 $o/tool; echo n > $o/notes.txt",
    );
    assert_eq!(status, 0, "{v}");
    let sid = v["session_id"].as_str().unwrap();
    let out = fx.root.join("output").join(sid);
    let tool = std::fs::metadata(out.join("tool")).unwrap();
    let notes = std::fs::metadata(out.join("notes.txt")).unwrap();
    assert_eq!(tool.permissions().mode() & 0o7777, 0o755);
    assert_eq!(notes.permissions().mode() & 0o7777, 0o644);
    for m in [&tool, &notes] {
        assert_eq!((m.uid(), m.gid()), (1234, 2345));
    }
}

#[test]
fn fr_rt_012_committed_files_keep_the_times_the_turn_gave_them() {
    if !require_root("fr_rt_012_committed_files_keep_the_times_the_turn_gave_them") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "s",
        &MANIFEST.replace(
            "\"/usr/bin/basename\"",
            "\"/usr/bin/basename\", \"/usr/bin/touch\"",
        ),
    );
    // `old` is older than `new` although the commit copies `new` first
    // (the order build tools like make depend on).
    let (status, v) = turn(
        &fx,
        None,
        &["output/<session_id>/o.txt:o"],
        "set -e; d=$(basename $TMPDIR); cd $TMPDIR; echo n > new; echo o > old; \
         touch -m -d @1000000000 old; touch -m -d @1500000000 new; \
         echo out > ../../output/$d/o.txt; touch -m -d @1200000000 ../../output/$d/o.txt",
    );
    assert_eq!(status, 0, "{v}");
    let sid = v["session_id"].as_str().unwrap().to_owned();
    let mtime = |p: std::path::PathBuf| std::fs::metadata(&p).unwrap().mtime();
    let tmp = fx.root.join("tmp").join(&sid);
    assert_eq!(mtime(tmp.join("old")), 1_000_000_000);
    assert_eq!(mtime(tmp.join("new")), 1_500_000_000);
    assert_eq!(
        mtime(fx.root.join("output").join(&sid).join("o.txt")),
        1_200_000_000
    );
}
