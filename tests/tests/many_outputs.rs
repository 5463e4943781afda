//! 10,000 declared outputs commit (issue 29): the commit keeps no
//! descriptor per output (it syncs the file system once instead), so a
//! turn that writes thousands of files commits within a small descriptor
//! limit, all or nothing.

use turnstile_tests::{Fixture, require_root, supervise_bin};

/// `supervise run --root R --state-dir S ARGS…` under `prlimit
/// --nofile=NOFILE`, its output.
fn run_with_nofile(fx: &Fixture, nofile: u32, args: &[&str]) -> std::process::Output {
    std::process::Command::new("prlimit")
        .arg(format!("--nofile={nofile}"))
        .arg(supervise_bin())
        .args(["run", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn issue_29_ten_thousand_outputs_commit_under_a_256_descriptor_limit() {
    if !require_root("issue_29_ten_thousand_outputs_commit_under_a_256_descriptor_limit") {
        return;
    }
    const N: usize = 10_000;
    let fx = Fixture::new();
    fx.install(
        "many",
        r#"{"capabilities": {"write": ["output/<session_id>/**"], "execute": ["/usr/bin/python3"]},
            "limits": {"files": 20000, "disk": "256Mi", "timeout_seconds": 120}}"#,
    );
    let outputs: Vec<serde_json::Value> = (0..N)
        .map(|i| {
            serde_json::json!({"path": format!("output/<session_id>/d{}/f{i}.txt", i % 100), "role": "data"})
        })
        .collect();
    let request = serde_json::json!({
        "command": ["/usr/bin/python3", "-c",
            "import os\nsid = os.environ['TURNSTILE_SESSION_ID']\nfor i in range(10000):\n    d = f'output/{sid}/d{i % 100}'\n    os.makedirs(d, exist_ok=True)\n    open(f'{d}/f{i}.txt', 'w').write(str(i))\n"],
        "declared_outputs": outputs,
    });
    let file = fx.root.parent().unwrap().join(format!(
        "many-{}.json",
        fx.root.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&file, request.to_string()).unwrap();
    let out = run_with_nofile(
        &fx,
        256,
        &[
            "--package",
            "many",
            "--json",
            "--request",
            file.to_str().unwrap(),
        ],
    );
    let _ = std::fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["committed"].as_array().unwrap().len(), N);
    let sid = v["session_id"].as_str().unwrap();
    for i in [0, 1, 4_999, 9_999] {
        let p = fx.root.join(format!("output/{sid}/d{}/f{i}.txt", i % 100));
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            i.to_string(),
            "{}",
            p.display()
        );
    }
    fx.assert_ledgers_intact(sid);
}

/// Issue 29: a declared tree (`PATH/**:ROLE`) declares everything written
/// under it — 100,000 outputs need no 5 MB request — while a file outside
/// it, or a forbidden one inside it, still blocks with nothing committed.
#[test]
fn issue_29_a_declared_tree_commits_what_is_under_it_and_nothing_else() {
    if !require_root("issue_29_a_declared_tree_commits_what_is_under_it_and_nothing_else") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "tree",
        r#"{"capabilities": {"write": ["output/<session_id>/**"], "execute": ["/usr/bin/python3"],
            "forbidden": ["**/*.pem"]},
            "limits": {"files": 5000, "timeout_seconds": 60}}"#,
    );
    let run = |code: &str| {
        let r = fx.run(
            "tree",
            &[
                "--json",
                "--output",
                "output/<session_id>/dist/**:bundle",
                "--",
                "/usr/bin/python3",
                "-c",
                code,
            ],
        );
        (r.status, r.json())
    };
    let (status, v) = run(
        "import os\nsid = os.environ['TURNSTILE_SESSION_ID']\nfor i in range(2000):\n    d = f'output/{sid}/dist/m{i % 20}'\n    os.makedirs(d, exist_ok=True)\n    open(f'{d}/f{i}.js', 'w').write(str(i))\n",
    );
    assert_eq!(status, 0, "{v}");
    assert_eq!(v["committed"].as_array().unwrap().len(), 2000);
    let sid = v["session_id"].as_str().unwrap().to_owned();
    assert_eq!(
        std::fs::read_to_string(fx.root.join(format!("output/{sid}/dist/m7/f7.js"))).unwrap(),
        "7"
    );
    for (what, code, target) in [
        (
            "a file outside the tree",
            "import os\nsid = os.environ['TURNSTILE_SESSION_ID']\nos.makedirs(f'output/{sid}/dist', exist_ok=True)\nopen(f'output/{sid}/dist/ok.js', 'w').write('1')\nopen(f'output/{sid}/stray.txt', 'w').write('x')\n",
            "stray.txt",
        ),
        (
            "a forbidden file inside the tree",
            "import os\nsid = os.environ['TURNSTILE_SESSION_ID']\nos.makedirs(f'output/{sid}/dist', exist_ok=True)\nopen(f'output/{sid}/dist/ok.js', 'w').write('1')\nopen(f'output/{sid}/dist/key.pem', 'w').write('k')\n",
            "key.pem",
        ),
    ] {
        let (status, v) = run(code);
        assert_eq!(status, 12, "{what}: {v}");
        assert!(
            v["violations"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["target"].as_str().unwrap().ends_with(target)),
            "{what}: {v}"
        );
        assert!(v["committed"].as_array().unwrap().is_empty(), "{what}: {v}");
        let sid = v["session_id"].as_str().unwrap();
        let left: Vec<_> = std::fs::read_dir(fx.root.join(format!("output/{sid}")))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{what}: committed {left:?}");
    }
}

/// Issue 31: a commit of many outputs draws a progress bar on a terminal's
/// stderr, and nothing under `--json` or when stderr is not a terminal.
#[test]
fn issue_31_a_long_commit_shows_progress_on_a_terminal_only() {
    if !require_root("issue_31_a_long_commit_shows_progress_on_a_terminal_only") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "many",
        r#"{"capabilities": {"write": ["output/<session_id>/**"], "execute": ["/usr/bin/python3"]},
            "limits": {"files": 20000, "disk": "256Mi", "timeout_seconds": 120}}"#,
    );
    let script = "import os\nsid = os.environ['TURNSTILE_SESSION_ID']\nos.makedirs(f'output/{sid}/t', exist_ok=True)\nfor i in range(2000):\n    open(f'output/{sid}/t/f{i}.txt', 'w').write(str(i))\n";
    let run = |json: bool, tty: bool| -> (i32, String) {
        let mut words: Vec<String> = vec![
            supervise_bin().display().to_string(),
            "run".into(),
            "--root".into(),
            fx.root.display().to_string(),
            "--state-dir".into(),
            fx.state.display().to_string(),
            "--package".into(),
            "many".into(),
            "--output".into(),
            "output/<session_id>/t/**:data".into(),
        ];
        if json {
            words.push("--json".into());
        }
        words.extend([
            "--".into(),
            "/usr/bin/python3".into(),
            "-c".into(),
            script.into(),
        ]);
        let quoted: Vec<String> = words
            .iter()
            .map(|w| format!("'{}'", w.replace('\'', "'\\''")))
            .collect();
        let out = if tty {
            // util-linux `script`: the command's stdio is a pty; its
            // transcript (stdout and stderr as the terminal saw them) is
            // what `script` prints.
            std::process::Command::new("script")
                .args(["-qfec", &quoted.join(" "), "/dev/null"])
                .output()
                .unwrap()
        } else {
            std::process::Command::new("sh")
                .args(["-c", &format!("{} 2>&1", quoted.join(" "))])
                .output()
                .unwrap()
        };
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (status, seen) = run(false, true);
    assert_eq!(status, 0, "{seen}");
    assert!(
        seen.contains("committing outputs"),
        "a terminal shows the commit's progress: {seen}"
    );
    let (status, seen) = run(true, true);
    assert_eq!(status, 0, "{seen}");
    assert!(
        !seen.contains("committing outputs"),
        "--json is quiet: {seen}"
    );
    let (status, seen) = run(false, false);
    assert_eq!(status, 0, "{seen}");
    assert!(
        !seen.contains("committing outputs"),
        "a pipe is quiet: {seen}"
    );
}

/// Issue 29: under a 64-descriptor limit a turn still runs whole: its
/// outputs commit, and the seccomp listener is taken (the command stage
/// names the descriptor it landed on; a fixed high number failed with
/// EBADF), so a denied syscall is refused with EPERM and recorded.
#[test]
fn issue_29_a_turn_under_a_64_descriptor_limit_commits_and_records_its_denials() {
    if !require_root("issue_29_a_turn_under_a_64_descriptor_limit_commits_and_records_its_denials")
    {
        return;
    }
    const N: usize = 2_000;
    let fx = Fixture::new();
    fx.install(
        "low",
        r#"{"capabilities": {"write": ["output/<session_id>/**"], "execute": ["/usr/bin/python3"]},
            "limits": {"files": 5000, "disk": "64Mi", "timeout_seconds": 120}}"#,
    );
    let code = "import ctypes, os\n\
        sid = os.environ['TURNSTILE_SESSION_ID']\n\
        for i in range(2000):\n\
        \x20   d = f'output/{sid}/t/d{i % 20}'\n\
        \x20   os.makedirs(d, exist_ok=True)\n\
        \x20   open(f'{d}/f{i}.txt', 'w').write(str(i))\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        assert libc.syscall(272, 0x10000000) == -1 and ctypes.get_errno() == 1\n";
    let out = run_with_nofile(
        &fx,
        64,
        &[
            "--package",
            "low",
            "--json",
            "--output",
            "output/<session_id>/t/**:data",
            "--",
            "/usr/bin/python3",
            "-c",
            code,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["status"], "committed", "{v}");
    assert_eq!(v["committed"].as_array().unwrap().len(), N, "{v}");
    let sid = v["session_id"].as_str().unwrap();
    assert_eq!(
        std::fs::read_to_string(fx.root.join(format!("output/{sid}/t/d19/f1999.txt"))).unwrap(),
        "1999"
    );
    assert_eq!(
        v["enforcement"]["denials_observed"]["seccomp"]["observed"], true,
        "{v}"
    );
    let denied: Vec<&serde_json::Value> = v["violations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["layer"] == "seccomp")
        .collect();
    assert_eq!(denied.len(), 1, "{v}");
    assert_eq!(denied[0]["target"], "unshare");
    fx.assert_ledgers_intact(sid);
}

/// Red-team wave 4: the commit staged `output/S/x` as
/// `output/S/.x.turnstile-t1`, a name the turn could declare and write
/// itself. The turn was recorded committed with `x`'s hash while `x` held
/// the other file's bytes, and that file was gone. Staging names now bear
/// a reserved prefix no write may bear, and are unique per session, turn
/// and output.
#[test]
fn a_turn_cannot_write_the_name_its_output_is_staged_under() {
    if !require_root("a_turn_cannot_write_the_name_its_output_is_staged_under") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "atk",
        r#"{"capabilities": {"write": ["output/<session_id>/**"], "execute": ["/bin/sh", "/usr/bin/**"]}}"#,
    );
    let sid = fx.new_session();
    // The old staging name: now an ordinary output, committed as written.
    let r = fx.run(
        "atk",
        &[
            "--session",
            &sid,
            "--json",
            "--output",
            "output/<session_id>/x:r",
            "--output",
            "output/<session_id>/.x.turnstile-t1:r",
            "--",
            "/bin/sh",
            "-c",
            "cd output/$TURNSTILE_SESSION_ID && echo GOOD > x && echo EVIL > .x.turnstile-t1",
        ],
    );
    let v = r.json();
    assert_eq!(v["status"], "committed", "{}", r.stdout);
    let dir = fx.root.join("output").join(&sid);
    assert_eq!(std::fs::read(dir.join("x")).unwrap(), b"GOOD\n");
    assert_eq!(
        std::fs::read(dir.join(".x.turnstile-t1")).unwrap(),
        b"EVIL\n"
    );
    let recorded = v["committed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"].as_str().is_some_and(|p| p.ends_with("/x")))
        .unwrap_or_else(|| panic!("{}", r.stdout))
        .clone();
    assert_eq!(
        recorded["sha256"].as_str().unwrap(),
        turnstile_tests::sha256_file(&dir.join("x"))
    );
    // The new prefix is reserved: such a write blocks the turn, nothing lands.
    let staged = format!(
        "output/<session_id>/{}0",
        turnstile_policy::verdict::STAGING_PREFIX
    );
    let r = fx.run(
        "atk",
        &[
            "--session",
            &sid,
            "--json",
            "--output",
            "output/<session_id>/y:r",
            "--output",
            &format!("{staged}:r"),
            "--",
            "/bin/sh",
            "-c",
            &format!(
                "cd output/$TURNSTILE_SESSION_ID && echo Y > y && echo Z > {}0",
                turnstile_policy::verdict::STAGING_PREFIX
            ),
        ],
    );
    let v = r.json();
    assert_eq!(v["status"], "blocked", "{}", r.stdout);
    assert!(!dir.join("y").exists());
    fx.assert_ledgers_intact(&sid);
}

/// Red-team wave 4: 40,000 scratch files with long names made a 21 MB
/// evidence line, longer than the ledger's reader takes: the session's
/// ledger no longer verified and its every later turn failed. A line is
/// now never longer than the reader takes, and a turn whose writes could
/// not all be recorded commits nothing (TS1022) while its entry lists a
/// bounded part with the count and digest of the rest; the session goes on.
#[test]
fn a_turn_writing_more_than_a_ledger_entry_holds_commits_nothing_and_the_session_goes_on() {
    if !require_root(
        "a_turn_writing_more_than_a_ledger_entry_holds_commits_nothing_and_the_session_goes_on",
    ) {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "big",
        r#"{"capabilities": {"execute": ["/usr/bin/python3"]},
            "limits": {"files": 200000, "disk": "2Gi", "timeout_seconds": 300}}"#,
    );
    let sid = fx.new_session();
    let r = fx.run(
        "big",
        &[
            "--session", &sid, "--json", "--no-outputs", "--",
            "/usr/bin/python3", "-c",
            "import os\nd = os.environ['TMPDIR']\nfor i in range(90000):\n    open(f'{d}/{i:0200d}', 'w').close()\n",
        ],
    );
    let v = r.json();
    assert_eq!(
        v["status"],
        "commit_failed",
        "{}",
        &r.stdout[..r.stdout.len().min(2000)]
    );
    assert_eq!(v["error"]["code"], "TS1022");
    assert!(
        !fx.root
            .join("tmp")
            .join(&sid)
            .join(format!("{:0200}", 0))
            .exists()
    );
    fx.assert_ledgers_intact(&sid);
    let entries = turnstile_tests::read_entries(&fx.ledger(&sid, "evidence"));
    let last = entries.last().unwrap();
    let omitted = &last["writes_omitted"];
    assert!(omitted["realized"].as_u64().unwrap() > 0, "{omitted}");
    assert_eq!(
        last["realized_writes"].as_array().unwrap().len() as u64
            + omitted["realized"].as_u64().unwrap(),
        90000
    );
    let r = fx.run(
        "big",
        &[
            "--session",
            &sid,
            "--json",
            "--no-outputs",
            "--",
            "/usr/bin/python3",
            "-c",
            "print(1)",
        ],
    );
    assert_eq!(r.json()["status"], "committed", "{}", r.stdout);
    fx.assert_ledgers_intact(&sid);
}
