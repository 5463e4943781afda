//! Many tenants, one node (issue 25): a session belongs to whoever created
//! it — the caller's uid, and for a pod's turn its tenant (namespace) and
//! package — and nobody else may add turns to it. A refusal changes nothing
//! but the owner's evidence ledger, where it is recorded.

use turnstile_tests::{Fixture, read_entries, require_root};

const MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["data/**"],
    "write": ["output/<session_id>/**"],
    "execute": ["/bin/true", "/usr/bin/python3"]
  }
}"#;

fn turn(
    fx: &Fixture,
    pkg: &str,
    session: Option<&str>,
    tenant: Option<&str>,
) -> (i32, serde_json::Value) {
    let mut args = vec!["--json", "--no-outputs"];
    if let Some(s) = session {
        args.extend(["--session", s]);
    }
    if let Some(t) = tenant {
        args.extend(["--tenant", t]);
    }
    args.extend(["--", "/bin/true"]);
    let r = fx.run(pkg, &args);
    (r.status, r.json())
}

#[test]
fn issue_25_a_session_belongs_to_its_tenant_and_package() {
    if !require_root("issue_25_a_session_belongs_to_its_tenant_and_package") {
        return;
    }
    let fx = Fixture::new();
    fx.install("k", MANIFEST);
    fx.install("other", MANIFEST);
    fx.write("data/x", b"x");
    let (status, v) = turn(&fx, "k", None, Some("team-a"));
    assert_eq!(status, 0, "{v}");
    let sid = v["session_id"].as_str().unwrap().to_owned();

    for (pkg, tenant, who) in [
        ("k", Some("team-b"), "another tenant"),
        ("k", None, "the node's CLI user, no tenant"),
        (
            "other",
            Some("team-a"),
            "another package of the same tenant",
        ),
    ] {
        let before: Vec<_> = fx
            .snapshot()
            .into_iter()
            .filter(|(p, _)| {
                !p.ends_with("evidence.jsonl") && !p.to_string_lossy().contains("/anchors/")
            })
            .collect();
        let evidence_before = read_entries(&fx.ledger(&sid, "evidence")).len();
        let (status, v) = turn(&fx, pkg, Some(&sid), tenant);
        assert_eq!(status, 2, "{who}: {v}");
        assert_eq!(v["error"]["code"], "TS1041", "{who}: {v}");
        assert_eq!(v["error"]["field"], "session", "{who}: {v}");
        // The refusal names no owner to the requester (red-team, wave 3):
        // neither its tenant nor its package; the owner's evidence does.
        let told = v["error"]["message"].as_str().unwrap();
        assert!(
            !told.contains("tenant `team-a`, package `k`"),
            "{who}: {told}"
        );
        let after: Vec<_> = fx
            .snapshot()
            .into_iter()
            .filter(|(p, _)| {
                !p.ends_with("evidence.jsonl") && !p.to_string_lossy().contains("/anchors/")
            })
            .collect();
        assert_eq!(
            before, after,
            "{who}: something but the owner's evidence changed"
        );
        let ev = read_entries(&fx.ledger(&sid, "evidence"));
        assert_eq!(ev.len(), evidence_before + 1, "{who}");
        let refused = ev.last().unwrap();
        assert_eq!(refused["event"], "session.access_refused", "{who}");
        assert_eq!(refused["owner"]["tenant"], "team-a");
        assert_eq!(refused["owner"]["package"], "k");
        assert_eq!(
            refused["requester"]["tenant"],
            tenant.map_or(serde_json::Value::Null, |t| t.into()),
            "{who}"
        );
        fx.assert_ledgers_intact(&sid);
    }
    // The owner goes on.
    let (status, v) = turn(&fx, "k", Some(&sid), Some("team-a"));
    assert_eq!(status, 0, "{v}");
    assert_eq!(v["turn_number"], 2);
    fx.assert_ledgers_intact(&sid);

    // A session the CLI user started is theirs: a tenant cannot take it.
    let (status, v) = turn(&fx, "k", None, None);
    assert_eq!(status, 0, "{v}");
    let mine = v["session_id"].as_str().unwrap().to_owned();
    let (status, v) = turn(&fx, "k", Some(&mine), Some("team-a"));
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (2, Some("TS1041")),
        "{v}"
    );
    let (status, v) = turn(&fx, "other", Some(&mine), None);
    assert_eq!(status, 0, "the CLI user's session takes any package: {v}");

    // A malformed tenant is bad input naming the flag; nothing is created.
    for bad in ["", "../team", "team a", "a/b"] {
        let before = fx.snapshot();
        let (status, v) = turn(&fx, "k", None, Some(bad));
        assert_eq!(status, 2, "{bad:?}: {v}");
        assert_eq!(v["error"]["field"], "--tenant", "{bad:?}: {v}");
        assert_eq!(before, fx.snapshot(), "{bad:?}: something was created");
    }
}

/// Red-team finding (wave 3): a grant cannot be widened to the turn's whole
/// view — through /proc's per-process links (`root`, `cwd`: refused at the
/// manifest, TS1002, exit 2) or through a host symbolic link to `/` or to
/// the workspace named by a read pattern (refused when the plan is built,
/// naming the pattern). Either way the file the grants leave out is not
/// read.
#[test]
fn a_grant_cannot_be_widened_to_the_whole_view() {
    if !require_root("a_grant_cannot_be_widened_to_the_whole_view") {
        return;
    }
    let fx = Fixture::new();
    fx.write("data/ok.csv", b"a,b\n");
    fx.write("data/secret.txt", b"SECRET-not-granted\n");
    let read_secret = [
        "--json",
        "--no-outputs",
        "--",
        "/usr/bin/python3",
        "-c",
        "print(open('data/secret.txt').read())",
    ];
    for (i, pattern) in [
        "/proc/self/root/**",
        "/proc/self/cwd/**",
        "/proc/thread-self/root/**",
    ]
    .iter()
    .enumerate()
    {
        let pkg = format!("p{i}");
        fx.install(
            &pkg,
            &format!(
                r#"{{"capabilities":{{"read":["data/*.csv","{pattern}"],"execute":["/usr/bin/python3"]}}}}"#
            ),
        );
        let r = fx.run(&pkg, &read_secret);
        assert_eq!(r.status, 2, "{pattern}: {}{}", r.stdout, r.stderr);
        assert!(!r.stdout.contains("SECRET") && !r.stderr.contains("SECRET-not"));
        let text = format!("{}{}", r.stdout, r.stderr);
        assert!(
            text.contains("TS1002") && text.contains("capabilities.read[1]"),
            "{pattern}: {text}"
        );
    }
    // A host link to `/` and one to the workspace root, each named by a
    // read pattern.
    let links = tempfile::tempdir().unwrap();
    for (i, target) in [std::path::Path::new("/"), fx.root.as_path()]
        .iter()
        .enumerate()
    {
        let link = links.path().join(format!("up{i}"));
        std::os::unix::fs::symlink(target, &link).unwrap();
        let pattern = format!("{}/**", link.display());
        let pkg = format!("l{i}");
        fx.install(
            &pkg,
            &format!(
                r#"{{"capabilities":{{"read":["data/*.csv","{pattern}"],"execute":["/usr/bin/python3"]}}}}"#
            ),
        );
        let r = fx.run(&pkg, &read_secret);
        assert_eq!(r.status, 20, "{pattern}: {}{}", r.stdout, r.stderr);
        assert!(!r.stdout.contains("SECRET-not") && !r.stderr.contains("SECRET-not"));
        let v = r.json();
        let text = v.to_string();
        assert!(
            text.contains("symbolic link") && text.contains(&pattern),
            "{pattern}: {text}"
        );
    }
}

/// Red-team finding H1 (stop 54): only `run --session` and `revert`
/// checked a session's owner. Every command that names a session now takes
/// `--tenant`: another tenant is refused (exit 2, TS1041, recorded in the
/// owner's evidence, nothing else changed, nothing written where it asked);
/// the owner's tenant and the host's operator (no `--tenant`) are not.
#[test]
fn every_command_that_names_a_session_admits_only_its_tenant_or_the_operator() {
    if !require_root("every_command_that_names_a_session_admits_only_its_tenant_or_the_operator") {
        return;
    }
    let fx = Fixture::new();
    fx.install("k", MANIFEST);
    fx.write("data/x", b"x");
    let (status, v) = turn(&fx, "k", None, Some("team-a"));
    assert_eq!(status, 0, "{v}");
    let sid = v["session_id"].as_str().unwrap().to_owned();
    let out = tempfile::tempdir().unwrap();
    let html = out.path().join("r.html");
    let into = out.path().join("replay");
    let attest = out.path().join("att");
    let key = out.path().join("key");
    let g = Fixture::raw(&["key", "generate", "--out", key.to_str().unwrap()]);
    assert_eq!(g.status, 0, "{}", g.stderr);
    let (html, into, attest, key) = (
        html.to_str().unwrap(),
        into.to_str().unwrap(),
        attest.to_str().unwrap(),
        key.to_str().unwrap(),
    );
    let commands: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["suspend"], vec![]),
        (vec!["resume"], vec![]),
        (vec!["report"], vec!["--html", html]),
        (vec!["explain"], vec!["--turn", "1"]),
        (vec!["context"], vec![]),
        (vec!["prompt-header"], vec!["--turn", "2"]),
        (vec!["checkpoint"], vec![]),
        (vec!["ledger", "verify"], vec![]),
        (vec!["ledger", "checkpoint"], vec!["--key", key]),
        (vec!["ledger", "prove"], vec!["--inclusion", "0"]),
        (
            vec!["ledger", "export"],
            vec!["--format", "in-toto", "--key", key, "--out", attest],
        ),
        (vec!["replay"], vec!["--into", into]),
    ];
    // What an admitted command wrote goes before the next one.
    let clean = || {
        for p in [html, into, attest] {
            let p = std::path::Path::new(p);
            if p.is_dir() {
                std::fs::remove_dir_all(p).unwrap();
            } else if p.symlink_metadata().is_ok() {
                std::fs::remove_file(p).unwrap();
            }
        }
    };
    let unchanged = |fx: &Fixture| -> Vec<_> {
        fx.snapshot()
            .into_iter()
            .filter(|(p, _)| {
                !p.ends_with("evidence.jsonl") && !p.to_string_lossy().contains("/anchors/")
            })
            .collect()
    };
    for (words, extra) in &commands {
        let what = words.join(" ");
        let mut args = vec!["--json", "--session", sid.as_str()];
        args.extend(extra);

        clean();
        // Another tenant: refused, recorded, nothing else.
        let before = unchanged(&fx);
        let evidence_before = read_entries(&fx.ledger(&sid, "evidence")).len();
        let mut b = args.clone();
        b.extend(["--tenant", "team-b"]);
        let r = fx.supervise(words, &b);
        assert_eq!(r.status, 2, "{what} as team-b: {} {}", r.stdout, r.stderr);
        let v = r.json();
        assert_eq!(v["error"]["code"], "TS1041", "{what}: {v}");
        assert_eq!(v["error"]["field"], "session", "{what}: {v}");
        assert_eq!(before, unchanged(&fx), "{what}: something changed");
        for p in [html, into, attest] {
            assert!(
                std::path::Path::new(p).symlink_metadata().is_err(),
                "{what}: {p} written"
            );
        }
        let ev = read_entries(&fx.ledger(&sid, "evidence"));
        assert_eq!(ev.len(), evidence_before + 1, "{what}: not recorded");
        assert_eq!(ev.last().unwrap()["event"], "session.access_refused");
        assert_eq!(ev.last().unwrap()["requester"]["tenant"], "team-b");
        fx.assert_ledgers_intact(&sid);

        // A malformed tenant is bad input naming the flag.
        let mut m = args.clone();
        m.extend(["--tenant", "../team-a"]);
        let r = fx.supervise(words, &m);
        assert_eq!(r.status, 2, "{what}: {}", r.stdout);
        assert_eq!(r.json()["error"]["field"], "--tenant", "{what}");

        // The owner's tenant, and the operator: never TS1041.
        for who in [Some("team-a"), None] {
            clean();
            let mut a = args.clone();
            if let Some(t) = who {
                a.extend(["--tenant", t]);
            }
            let r = fx.supervise(words, &a);
            if matches!(words[0], "suspend" | "resume") {
                // Admitted, and told there is no running turn.
                assert_eq!(r.status, 2, "{what} as {who:?}: {}", r.stdout);
                assert_eq!(r.json()["error"]["code"], "TS1052", "{what} as {who:?}");
            } else {
                assert_eq!(r.status, 0, "{what} as {who:?}: {} {}", r.stdout, r.stderr);
            }
        }
    }
    // The refusals are each in the owner's evidence; the chain holds.
    fx.assert_ledgers_intact(&sid);
}

/// Red-team finding M3 (stop 54): a workspace whose `output/` or `tmp/` is
/// a symbolic link had a new session's directories made where it points,
/// outside the workspace; a session's own `tmp/<sid>` replaced by a link
/// was found only at commit, after the command ran. Both are refused
/// before anything is made or run (exit 2, naming the flag).
#[test]
fn a_session_tree_replaced_by_a_symbolic_link_is_refused_before_anything() {
    if !require_root("a_session_tree_replaced_by_a_symbolic_link_is_refused_before_anything") {
        return;
    }
    let elsewhere = tempfile::tempdir().unwrap();
    for tree in ["output", "tmp"] {
        let fx = Fixture::new();
        fx.install("k", MANIFEST);
        std::os::unix::fs::symlink(elsewhere.path(), fx.root.join(tree)).unwrap();
        let (status, v) = turn(&fx, "k", None, None);
        assert_eq!(status, 2, "{tree}: {v}");
        assert_eq!(v["error"]["field"], "--root", "{tree}: {v}");
        assert_eq!(
            std::fs::read_dir(elsewhere.path()).unwrap().count(),
            0,
            "{tree}: something was made through the link"
        );
        assert!(
            !fx.root.join("planes").exists(),
            "{tree}: a session was started"
        );
    }
    // An existing session whose scratch or output directory became a link.
    for tree in ["tmp", "output"] {
        let fx = Fixture::new();
        fx.install("k", MANIFEST);
        let (status, v) = turn(&fx, "k", None, None);
        assert_eq!(status, 0, "{v}");
        let sid = v["session_id"].as_str().unwrap().to_owned();
        let own = fx.root.join(tree).join(&sid);
        std::fs::remove_dir(&own).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &own).unwrap();
        let exec_before = read_entries(&fx.ledger(&sid, "exec")).len();
        let (status, v) = turn(&fx, "k", Some(&sid), None);
        assert_eq!(status, 2, "{tree}: {v}");
        assert_eq!(v["error"]["field"], "--session", "{tree}: {v}");
        assert_eq!(
            read_entries(&fx.ledger(&sid, "exec")).len(),
            exec_before,
            "{tree}: the turn started"
        );
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }
}

/// Red-team finding M5 (stop 54), and what it led to: a read grant that
/// covers the session trees (`**`, `output/**`, `planes/**`) read every
/// session's outputs, scratch and ledgers in the workspace — other tenants'
/// in a shared one — and a write pattern `output/**` let a turn commit a
/// declared output into another session's directory. Now another owner's
/// session directories are never granted (the read goes around them), a
/// write pattern reaching other sessions is refused at load, and a
/// declared output in one is a violation. The owner's sessions stay
/// readable to each other.
#[test]
fn other_sessions_directories_are_never_granted() {
    if !require_root("other_sessions_directories_are_never_granted") {
        return;
    }
    let fx = Fixture::new();
    let reader = |read: &str| {
        format!(r#"{{"capabilities":{{"read":{read},"execute":["/bin/sh","/bin/cat"]}}}}"#)
    };
    fx.install("all", &reader(r#"["**"]"#));
    fx.install("outs", &reader(r#"["output/**","tmp/**","planes/**"]"#));
    // Session A (tenant a) leaves an output, scratch and its ledgers.
    let r = fx.run(
        "all",
        &[
            "--json",
            "--tenant",
            "team-a",
            "--output",
            "output/<session_id>/a.txt:r",
            "--",
            "/bin/sh",
            "-c",
            "echo SECRET-OUT > output/$TURNSTILE_SESSION_ID/a.txt; echo SECRET-TMP > tmp/$TURNSTILE_SESSION_ID/s.txt",
        ],
    );
    assert_eq!(r.status, 0, "{} {}", r.stdout, r.stderr);
    let a = r.json()["session_id"].as_str().unwrap().to_owned();
    assert_eq!(
        std::fs::read_to_string(fx.root.join(format!("output/{a}/a.txt"))).unwrap(),
        "SECRET-OUT\n"
    );
    // Tenant b, with each manifest: nothing of A's is read.
    let probe = format!(
        "for f in output/{a}/a.txt tmp/{a}/s.txt planes/ho1/sessions/{a}/ledger/exec.jsonl; do cat $f 2>/dev/null && echo LEAK $f; done; echo done"
    );
    for pkg in ["all", "outs"] {
        let r = fx.run(
            pkg,
            &[
                "--tenant",
                "team-b",
                "--no-outputs",
                "--",
                "/bin/sh",
                "-c",
                &probe,
            ],
        );
        let out = r.stdout.clone();
        assert!(out.contains("done"), "{pkg}: {out} {}", r.stderr);
        assert!(
            !out.contains("SECRET") && !out.contains("LEAK"),
            "{pkg}: {out}"
        );
    }
    // Another session of the same owner (tenant a) reads it: sessions of
    // one owner are not kept from each other.
    let r = fx.run(
        "outs",
        &[
            "--tenant",
            "team-a",
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            &format!("cat output/{a}/a.txt"),
        ],
    );
    assert_eq!(r.status, 0, "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("SECRET-OUT"), "{}", r.stdout);
    // A's own later turn still reads what A wrote.
    let r = fx.run(
        "all",
        &[
            "--tenant",
            "team-a",
            "--session",
            &a,
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            "cat output/$TURNSTILE_SESSION_ID/a.txt",
        ],
    );
    assert_eq!(r.status, 0, "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("SECRET-OUT"), "{}", r.stdout);

    // A write pattern that reaches other sessions: refused at load.
    for write in ["output/**", "tmp/*/x", "output/SES-*/**"] {
        fx.install(
            "w",
            &format!(r#"{{"capabilities":{{"write":["{write}"],"execute":["/bin/sh"]}}}}"#),
        );
        let before = fx.snapshot();
        let r = fx.run(
            "w",
            &["--json", "--no-outputs", "--", "/bin/sh", "-c", "true"],
        );
        assert_eq!(r.status, 2, "{write}: {}", r.stdout);
        let v = r.json();
        assert_eq!(v["error"]["code"], "TS1002", "{write}: {v}");
        assert_eq!(v["error"]["field"], "capabilities.write[0]", "{write}: {v}");
        assert_eq!(before, fx.snapshot(), "{write}");
    }
    // A declared output in another session's directory: a violation,
    // nothing written there.
    let r = fx.run(
        "all",
        &[
            "--json",
            "--tenant",
            "team-b",
            "--output",
            &format!("output/{a}/evil.txt:r"),
            "--",
            "/bin/sh",
            "-c",
            "true",
        ],
    );
    assert_eq!(r.status, 11, "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("another session"), "{}", r.stdout);
    assert!(!fx.root.join(format!("output/{a}/evil.txt")).exists());
}

/// The red team's second pass (stop 55) over the rule above, every shape a
/// grant can take: an execute entry (which grants reading too) under
/// `output/`, `**` as an execute entry, a literal other session id, a
/// glob that matches real ids but not a probe, an absolute pattern deeper
/// than the tree, a symbolic link in the turn's own scratch leading to
/// `output/`, and a session another tenant makes while the turn runs.
/// None of them reads tenant a's files; a write glob reaching other
/// sessions is refused at load.
#[test]
fn another_owners_sessions_stay_out_of_reach_of_every_grant_shape() {
    if !require_root("another_owners_sessions_stay_out_of_reach_of_every_grant_shape") {
        return;
    }
    let fx = Fixture::new();
    fx.install("a", r#"{"capabilities":{"execute":["/bin/sh"]}}"#);
    // A session of tenant a, made while a turn of tenant b (which reads
    // `**`) is already running: b waits until a's directory is listed
    // (listing is granted everywhere), then tries to read what a wrote.
    fx.install(
        "all",
        r#"{"capabilities":{"read":["**"],"execute":["/bin/sh","/bin/cat","/bin/ls","/bin/sleep"]}}"#,
    );
    let waiter = fx
        .command(
            &turnstile_tests::supervise_bin(),
            &["run"],
            &[
                "--package",
                "all",
                "--tenant",
                "team-b",
                "--no-outputs",
                "--",
                "/bin/sh",
                "-c",
                "i=0; while [ $i -lt 200 ]; do set -- output/*; [ $# -ge 2 ] && break; sleep 0.05; i=$((i+1)); done; [ $# -ge 2 ] && echo SEEN; sleep 1; cat output/*/a.txt tmp/*/s.txt 2>/dev/null; echo done",
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let r = fx.run(
        "a",
        &[
            "--json",
            "--tenant",
            "team-a",
            "--output",
            "output/<session_id>/a.txt:r",
            "--",
            "/bin/sh",
            "-c",
            "echo SECRET-OUT > output/$TURNSTILE_SESSION_ID/a.txt; echo SECRET-TMP > tmp/$TURNSTILE_SESSION_ID/s.txt",
        ],
    );
    assert_eq!(r.status, 0, "{} {}", r.stdout, r.stderr);
    let a = r.json()["session_id"].as_str().unwrap().to_owned();
    let out = waiter.wait_with_output().unwrap();
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(
        seen.contains("SEEN") && seen.contains("done"),
        "{seen} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !seen.contains("SECRET"),
        "a session made during the turn: {seen}"
    );

    let probe = format!(
        "for f in output/{a}/a.txt tmp/{a}/s.txt planes/ho1/sessions/{a}/ledger/exec.jsonl {root}/tmp/{a}/s.txt; do cat $f 2>/dev/null && echo LEAK $f; done; echo done",
        root = fx.root.display()
    );
    let root = fx.root.display().to_string();
    for (name, manifest) in [
        (
            "execute under output",
            r#"{"capabilities":{"execute":["/bin/sh","/bin/cat","output/*/a.txt"]}}"#.to_owned(),
        ),
        (
            "execute **",
            r#"{"capabilities":{"execute":["/bin/sh","/bin/cat","**"]}}"#.to_owned(),
        ),
        (
            "literal ids",
            format!(
                r#"{{"capabilities":{{"read":["output/{a}/a.txt","tmp/{a}/**","planes/ho1/sessions/{a}/ledger/exec.jsonl"],"execute":["/bin/sh","/bin/cat"]}}}}"#
            ),
        ),
        (
            "globs matching real ids",
            r#"{"capabilities":{"read":["output/SES-2*/**","tmp/*[a-f]*/**","planes/ho1/sessions/SES-2*/**"],"execute":["/bin/sh","/bin/cat"]}}"#.to_owned(),
        ),
        (
            "absolute, deeper than the tree",
            format!(
                r#"{{"capabilities":{{"read":["{root}/tmp/{a}/**"],"execute":["/bin/sh","/bin/cat"]}}}}"#
            ),
        ),
    ] {
        fx.install("b", &manifest);
        let r = fx.run(
            "b",
            &["--tenant", "team-b", "--no-outputs", "--", "/bin/sh", "-c", &probe],
        );
        assert!(
            !r.stdout.contains("SECRET") && !r.stdout.contains("LEAK"),
            "{name}: {}",
            r.stdout
        );
        // Refused whole, or run and refused the reads: either way no byte.
        assert!(
            r.stdout.contains("done") || r.status == 20 || r.status == 2,
            "{name}: {} {} {}",
            r.status,
            r.stdout,
            r.stderr
        );
    }

    // A link in b's own scratch to `output/`, named by a read pattern.
    fx.install(
        "l",
        r#"{"capabilities":{"read":["data/**","tmp/<session_id>/l/**"],"execute":["/bin/sh","/bin/cat","/bin/ln"]}}"#,
    );
    let r = fx.run(
        "l",
        &[
            "--json",
            "--tenant",
            "team-b",
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            &format!("ln -s {root}/output $TMPDIR/l"),
        ],
    );
    assert_eq!(r.status, 0, "{} {}", r.stdout, r.stderr);
    let b = r.json()["session_id"].as_str().unwrap().to_owned();
    let r = fx.run(
        "l",
        &[
            "--tenant",
            "team-b",
            "--session",
            &b,
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            &format!("cat $TMPDIR/l/{a}/a.txt; echo done"),
        ],
    );
    assert!(!r.stdout.contains("SECRET"), "link: {}", r.stdout);

    // A write glob that matches real ids: refused at load.
    fx.install(
        "g",
        r#"{"capabilities":{"write":["output/SES-2*/**"],"execute":["/bin/sh"]}}"#,
    );
    let r = fx.run(
        "g",
        &["--json", "--no-outputs", "--", "/bin/sh", "-c", "true"],
    );
    assert_eq!(r.status, 2, "{}", r.stdout);
    assert_eq!(r.json()["error"]["field"], "capabilities.write[0]");
}

/// Red-team, stop 55: under runsc, which applies no Landlock, a session
/// tenant a made while b's turn ran (reading `**`) was read whole — the
/// refusal looked only at the sessions there when the plan was made. A
/// grant reaching a session tree is refused under runsc whatever exists
/// now (E2041, exit 20, saying why); a narrow grant runs.
#[test]
fn under_runsc_a_grant_reaching_the_session_trees_is_refused() {
    if !require_root("under_runsc_a_grant_reaching_the_session_trees_is_refused") {
        return;
    }
    let fx = Fixture::new();
    fx.write("data/x", b"x\n");
    for (read, refused) in [
        (r#"["**"]"#, true),
        (r#"["output/**"]"#, true),
        (r#"["data/**"]"#, false),
    ] {
        fx.install_exact(
            "u",
            &format!(
                r#"{{"capabilities":{{"read":{read},"execute":["/bin/cat"]}},"allow_degraded":["landlock"]}}"#
            ),
        );
        let r = fx.run(
            "u",
            &[
                "--json",
                "--backend",
                "runsc",
                "--no-outputs",
                "--",
                "/bin/cat",
                "data/x",
            ],
        );
        if refused {
            assert_eq!(r.status, 20, "{read}: {} {}", r.stdout, r.stderr);
            assert!(r.stdout.contains("session tree"), "{read}: {}", r.stdout);
        } else {
            assert_eq!(r.status, 0, "{read}: {} {}", r.stdout, r.stderr);
        }
    }
}
