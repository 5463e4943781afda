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

/// Real-software audit #1: overlayfs copies a file up whenever it is
/// opened for writing — sqlite opening a database it only reads,
/// `open(…, "r+")`, `touch`, the source of a hard link. A copy with the
/// bytes and permission bits of the file below is not a write: the turn
/// commits (it was blocked as an undeclared write), and a change of the
/// same size, or of the mode, still blocks.
#[test]
fn a_file_opened_for_writing_but_left_unchanged_is_not_a_write() {
    if !require_root("a_file_opened_for_writing_but_left_unchanged_is_not_a_write") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "w",
        r#"{"capabilities": {"read": ["work/**"], "write": ["work/**"],
            "execute": ["/bin/sh", "/usr/bin/touch", "/bin/ln", "/bin/chmod"]}}"#,
    );
    for (name, bytes) in [
        ("a", "aaa\n"),
        ("b", "bbb\n"),
        ("c", "ccc\n"),
        ("e", "eee\n"),
    ] {
        fx.write(&format!("work/{name}.txt"), bytes.as_bytes());
    }
    let sid = fx.new_session();
    let run = |outputs: &[&str], script: &str| {
        let mut args = vec!["--json", "--session", sid.as_str()];
        if outputs.is_empty() {
            args.push("--no-outputs");
        }
        for o in outputs {
            args.extend(["--output", o]);
        }
        args.extend(["--", "/bin/sh", "-c", script]);
        let r = fx.run("w", &args);
        (r.status, r.json())
    };
    let (status, v) = run(
        &["work/d.txt:copy"],
        "set -e; : >> work/a.txt; touch work/b.txt; ln work/c.txt work/d.txt",
    );
    assert_eq!(status, 0, "{v}");
    assert_eq!(v["status"], "committed", "{v}");
    let written: Vec<&str> = v["realized_writes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["path"].as_str())
        .collect();
    assert_eq!(written, ["work/d.txt"], "{v}");
    assert_eq!(std::fs::read(fx.root.join("work/a.txt")).unwrap(), b"aaa\n");
    assert_eq!(std::fs::read(fx.root.join("work/d.txt")).unwrap(), b"ccc\n");

    // Same size, other bytes: a write, undeclared.
    let (status, v) = run(&[], "printf 'AAA\\n' > work/a.txt");
    assert_eq!(status, 12, "{v}");
    assert!(v["violations"].to_string().contains("work/a.txt"), "{v}");
    // Same bytes, other mode: a write too.
    let (status, v) = run(&[], "chmod 600 work/e.txt");
    assert_eq!(status, 12, "{v}");
    assert!(v["violations"].to_string().contains("work/e.txt"), "{v}");
    assert_eq!(std::fs::read(fx.root.join("work/a.txt")).unwrap(), b"aaa\n");
    fx.assert_ledgers_intact(&sid);
}

/// Real-software audit #5: a name that is not valid UTF-8 (a Latin-1
/// archive unpacked) was a sandbox error (exit 20) that named no file. The
/// ledgers hold paths as JSON strings, so it cannot be recorded or carried:
/// the turn is blocked (exit 12) naming it with the bad byte escaped, and
/// nothing of it reaches the session's tmp.
#[test]
fn a_name_that_is_not_utf8_blocks_the_turn_and_is_named() {
    if !require_root("a_name_that_is_not_utf8_blocks_the_turn_and_is_named") {
        return;
    }
    let fx = Fixture::new();
    fx.install("s", MANIFEST);
    let (status, v) = turn(
        &fx,
        None,
        &[],
        "printf x > \"$TMPDIR/caf$(printf '\\351').txt\"; mkdir \"$TMPDIR/d$(printf '\\377')\"; \
         printf y > \"$TMPDIR/d$(printf '\\377')/inside\"; printf z > \"$TMPDIR/ok\"",
    );
    assert_eq!(status, 12, "{v}");
    assert_eq!(v["status"], "blocked", "{v}");
    let sid = v["session_id"].as_str().unwrap().to_owned();
    let named: Vec<String> = v["violations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["violated_capability"]["realized_kind"] == "non_utf8_name")
        .filter_map(|x| x["target"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        named,
        [
            format!("tmp/{sid}/caf\\xe9.txt"),
            format!("tmp/{sid}/d\\xff")
        ],
        "{v}"
    );
    assert_eq!(
        std::fs::read_dir(fx.root.join("tmp").join(&sid))
            .unwrap()
            .count(),
        0,
        "nothing of a blocked turn is carried"
    );
    fx.assert_ledgers_intact(&sid);
}

/// Real-software audit #2: `git status` / `git diff` of a clean repository
/// in a write scope rewrote `.git/index` (through the idmapped mount every
/// entry's owner, and through the overlay its ctime, differ from what the
/// host's git recorded), so the turn blocked as an undeclared write. The
/// turn's environment relaxes git's stat checks (size, whole-second mtime,
/// mode): nothing is written, the turn commits, and the host's git still
/// finds the repository clean.
#[test]
fn git_status_of_a_clean_repository_in_a_write_scope_writes_nothing() {
    let test = "git_status_of_a_clean_repository_in_a_write_scope_writes_nothing";
    if !require_root(test) {
        return;
    }
    if !std::path::Path::new("/usr/bin/git").exists() {
        assert!(
            std::env::var_os("TURNSTILE_REQUIRE_KERNEL").is_none(),
            "{test}: /usr/bin/git is missing (run `cargo xtask setup`)"
        );
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "g",
        r#"{"capabilities": {"read": ["/usr/**", "/etc/**", "work/**"], "write": ["work/**"],
            "execute": ["/bin/sh", "/usr/bin/git", "/usr/lib/git-core/*"]}}"#,
    );
    fx.write("work/repo/f", b"x\n");
    let repo = fx.root.join("work/repo");
    let git = |args: &[&str]| {
        let o = std::process::Command::new("/usr/bin/git")
            .arg("-C")
            .arg(&repo)
            .args(["-c", "user.email=a@b", "-c", "user.name=a"])
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "git {args:?}: {o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    git(&["init", "-q"]);
    git(&["add", "f"]);
    git(&["commit", "-qm", "one"]);
    // Not racily clean: the file is older than the index.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(repo.join("f"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    assert_eq!(git(&["status", "--porcelain"]), "");
    let index = std::fs::read(repo.join(".git/index")).unwrap();
    let sid = fx.new_session();
    let r = fx.run(
        "g",
        &[
            "--json",
            "--session",
            &sid,
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            "set -e; cd work/repo; test -z \"$(git status --porcelain)\"; git diff --exit-code; echo clean",
        ],
    );
    let v = r.json();
    assert_eq!(r.status, 0, "{v}\n{}", r.stderr);
    assert_eq!(v["status"], "committed", "{v}");
    assert_eq!(v["realized_writes"], serde_json::json!([]), "{v}");
    assert_eq!(std::fs::read(repo.join(".git/index")).unwrap(), index);
    assert_eq!(git(&["status", "--porcelain"]), "");
    fx.assert_ledgers_intact(&sid);
}
