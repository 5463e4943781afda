//! The CLI contract: FR-RT-001 (package loading), FR-RT-005 (prompt header),
//! FR-RT-013 (declared outputs), and the bad-input table — every malformed
//! manifest, request, path, session id or argument gives exit 2, a stable
//! code, a message naming the field, and changes nothing on disk.

use std::path::Path;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use turnstile_tests::{Fixture, HELLO_MANIFEST};

#[test]
fn fr_rt_001_loads_the_package_manifest() {
    let fx = Fixture::new();
    fx.install("hello-agent", HELLO_MANIFEST);
    let r = fx.supervise(
        &["check"],
        &[
            "--package",
            "hello-agent",
            "--json",
            "--output",
            "output/<session_id>/r.md:report",
            "--",
            "/usr/bin/python3",
            "installed/hello-agent/main.py",
        ],
    );
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    let v = r.json();
    assert_eq!(v["allowed"], true);
    assert_eq!(
        v["execute_entry"],
        "/usr/bin/python3 installed/hello-agent/main.py"
    );
}

#[test]
fn fr_rt_001_missing_package_is_package_not_found_naming_the_path() {
    let fx = Fixture::new();
    let r = fx.supervise(
        &["check"],
        &[
            "--package",
            "ghost",
            "--json",
            "--no-outputs",
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(r.status, 2);
    let e = &r.json()["error"];
    assert_eq!(e["code"], "TS1001");
    assert_eq!(e["name"], "PACKAGE_NOT_FOUND");
    assert_eq!(e["field"], "package", "{e}");
    let expected = fx.root.join("installed/ghost/manifest.json");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains(&expected.display().to_string()),
        "{e}"
    );
}

#[test]
fn fr_rt_003_fr_rt_010_check_refuses_with_exit_11_and_details() {
    let fx = Fixture::new();
    fx.install("hello-agent", HELLO_MANIFEST);
    let r = fx.supervise(
        &["check"],
        &[
            "--package",
            "hello-agent",
            "--json",
            "--no-outputs",
            "--input",
            "installed/hello-agent/secrets/k",
            "--",
            "/bin/sh",
            "-c",
            "cat /etc/shadow",
        ],
    );
    assert_eq!(r.status, 11, "{}", r.stderr);
    let v = r.json();
    assert_eq!(v["allowed"], false);
    let ops: Vec<&str> = v["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["attempted_operation"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["execute", "read"]);
    assert_eq!(
        v["violations"][1]["violated_capability"]["pattern"],
        "installed/hello-agent/secrets/**"
    );
    // Text form lists each violation.
    let r = fx.supervise(
        &["check"],
        &["--package", "hello-agent", "--no-outputs", "--", "/bin/sh"],
    );
    assert_eq!(r.status, 11);
    assert!(r.stdout.contains("execute `/bin/sh`"), "{}", r.stdout);
}

#[test]
fn fr_rt_013_outputs_outside_write_and_session_output_are_violations() {
    let fx = Fixture::new();
    fx.install("hello-agent", HELLO_MANIFEST);
    let ok = fx.supervise(
        &["check"],
        &[
            "--package",
            "hello-agent",
            "--output",
            "reports/<session_id>/a.md:report",
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(ok.status, 0, "{}", ok.stderr);
    let bad = fx.supervise(
        &["check"],
        &[
            "--package",
            "hello-agent",
            "--json",
            "--output",
            "reports/a.md:report",
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(bad.status, 11);
    assert_eq!(
        bad.json()["violations"][0]["violated_capability"]["capability"],
        "write"
    );
}

#[test]
fn fr_rt_005_prompt_header_hashes_declared_inputs() {
    let fx = Fixture::new();
    let sid = fx.new_session();
    fx.write("registries/users.csv", b"id,name\n1,ada\n");
    let r = fx.supervise(
        &["prompt-header"],
        &[
            "--session",
            &sid,
            "--turn",
            "2",
            "--input",
            "registries/users.csv",
            "--output",
            "output/<session_id>/report.md:report",
            "--work-order",
            "WO-42",
            "--json",
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let v = r.json();
    assert_eq!(v["session_id"], sid.as_str());
    assert_eq!(v["turn_number"], 2);
    assert_eq!(v["work_order_id"], "WO-42");
    assert_eq!(v["declared_inputs"][0]["path"], "registries/users.csv");
    assert_eq!(
        v["declared_inputs"][0]["sha256"],
        hex::encode(Sha256::digest(b"id,name\n1,ada\n"))
    );
    assert_eq!(
        v["declared_outputs"][0],
        json!({"path": format!("output/{sid}/report.md"), "role": "report"})
    );
    assert!(v["context_as_of"].as_str().unwrap().ends_with('Z'));

    let text = fx.supervise(&["prompt-header"], &["--session", &sid, "--turn", "1"]);
    assert_eq!(text.status, 0);
    assert!(
        text.stdout.contains(&format!("session_id: {sid}"))
            && !text.stdout.contains("work_order_id")
    );
}

#[test]
fn fr_rt_005_prompt_header_never_follows_symlinks_out_of_the_root() {
    let fx = Fixture::new();
    let sid = fx.new_session();
    std::fs::create_dir_all(fx.root.join("registries")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", fx.root.join("registries/link.csv")).unwrap();
    let r = fx.supervise(
        &["prompt-header"],
        &[
            "--session",
            &sid,
            "--turn",
            "1",
            "--input",
            "registries/link.csv",
            "--json",
        ],
    );
    assert_eq!(r.status, 2);
    assert_eq!(r.json()["error"]["code"], "TS1013");
}

#[test]
fn prompt_header_refuses_a_tampered_session() {
    let fx = Fixture::new();
    let sid = fx.new_session();
    std::fs::write(fx.ledger(&sid, "exec"), b"").unwrap();
    let r = fx.supervise(
        &["prompt-header"],
        &["--session", &sid, "--turn", "1", "--json"],
    );
    assert_eq!(r.status, 3);
    assert_eq!(r.json()["error"]["code"], "TS1010");
}

/// One row of the bad-input table.
struct Case {
    name: &'static str,
    words: &'static [&'static str],
    args: Vec<String>,
    code: &'static str,
    /// The field the error must name (in `error.field` and the message).
    field: &'static str,
    /// Text the message must also contain (a limit, the kind of file…).
    says: Option<&'static str>,
}

impl Case {
    fn saying(mut self, text: &'static str) -> Self {
        self.says = Some(text);
        self
    }
}

fn case(
    name: &'static str,
    words: &'static [&'static str],
    args: &[&str],
    code: &'static str,
    field: &'static str,
) -> Case {
    Case {
        name,
        words,
        args: args.iter().map(|s| s.to_string()).collect(),
        code,
        field,
        says: None,
    }
}

const CHECK: &[&str] = &["check"];

fn manifest_case(
    fx: &Fixture,
    name: &'static str,
    manifest: &str,
    code: &'static str,
    field: &'static str,
) -> Case {
    let pkg = format!("pkg-{}", name.replace(' ', "-"));
    fx.install(&pkg, manifest);
    Case {
        name,
        words: CHECK,
        args: vec![
            "--package".into(),
            pkg,
            "--no-outputs".into(),
            "--".into(),
            "/bin/true".into(),
        ],
        code,
        field,
        says: None,
    }
}

#[test]
fn bad_input_table_exits_2_names_the_field_and_changes_nothing() {
    let fx = Fixture::new();
    fx.install("hello-agent", HELLO_MANIFEST);
    let sid = fx.new_session();
    let requests = tempfile::tempdir().unwrap();
    let req = |name: &str, body: &str| -> String {
        let p = requests.path().join(format!("{name}.json"));
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    };
    let m = |caps: &str| format!(r#"{{"capabilities":{caps}}}"#);
    const MI: &str = "TS1002";
    const RQ: &str = "TS1003";
    const ARG: &str = "TS1006";

    let mut cases = vec![
        manifest_case(
            &fx,
            "unknown top field",
            r#"{"capabilities":{},"extra":1}"#,
            MI,
            "extra",
        ),
        manifest_case(
            &fx,
            "unknown capability",
            &m(r#"{"reed":[]}"#),
            MI,
            "capabilities.reed",
        ),
        manifest_case(
            &fx,
            "no capabilities",
            r#"{"version":"1"}"#,
            MI,
            "(document)",
        ),
        manifest_case(
            &fx,
            "dotdot read",
            &m(r#"{"read":["a/../../etc/**"]}"#),
            MI,
            "capabilities.read[0]",
        ),
        manifest_case(
            &fx,
            "bad glob",
            &m(r#"{"read":["ok/**","a/[b"]}"#),
            MI,
            "capabilities.read[1]",
        ),
        manifest_case(
            &fx,
            "absolute write",
            &m(r#"{"write":["/etc/**"]}"#),
            MI,
            "capabilities.write[0]",
        ),
        manifest_case(
            &fx,
            "ledger write",
            &m(r#"{"write":["reports/**","planes/ho1/sessions/<session_id>/ledger/exec.jsonl"]}"#),
            "E2042",
            "capabilities.write[1]",
        ),
        manifest_case(
            &fx,
            "manifest write",
            &m(r#"{"write":["installed/*/manifest.json"]}"#),
            "E2042",
            "capabilities.write[0]",
        ),
        // Red-team wave 4: a package's code is its authority too.
        manifest_case(
            &fx,
            "another package code",
            &m(r#"{"write":["reports/**","installed/demo/*.py"]}"#),
            "E2042",
            "capabilities.write[1]",
        ),
        manifest_case(
            &fx,
            "empty execute",
            &m(r#"{"execute":["  "]}"#),
            MI,
            "capabilities.execute[0]",
        ),
        manifest_case(
            &fx,
            "read not a list",
            &m(r#"{"read":"x/**"}"#),
            MI,
            "capabilities.read",
        ),
        manifest_case(
            &fx,
            "bad memory",
            r#"{"capabilities":{},"limits":{"memory":"256MB"}}"#,
            MI,
            "limits.memory",
        ),
        manifest_case(
            &fx,
            "bad cpu",
            r#"{"capabilities":{},"limits":{"cpu":"-1"}}"#,
            MI,
            "limits.cpu",
        ),
        manifest_case(
            &fx,
            "zero pids",
            r#"{"capabilities":{},"limits":{"pids":0}}"#,
            MI,
            "limits.pids",
        ),
        manifest_case(
            &fx,
            "huge timeout",
            r#"{"capabilities":{},"limits":{"timeout_seconds":99999999}}"#,
            MI,
            "limits.timeout_seconds",
        ),
        manifest_case(
            &fx,
            "bad trust",
            r#"{"capabilities":{},"trust_level":"root"}"#,
            MI,
            "trust_level",
        ),
        manifest_case(
            &fx,
            "bad network",
            r#"{"capabilities":{},"network":"open"}"#,
            MI,
            "network",
        ),
        manifest_case(
            &fx,
            "wrong package id",
            r#"{"capabilities":{},"package_id":"other"}"#,
            MI,
            "package_id",
        ),
        manifest_case(
            &fx,
            "torn json",
            r#"{"capabilities":{"read":["#,
            MI,
            "capabilities.read",
        ),
        manifest_case(
            &fx,
            "duplicate field",
            r#"{"capabilities":{"read":[],"read":[]}}"#,
            MI,
            "capabilities.read",
        ),
        case(
            "bad package id",
            CHECK,
            &["--package", "../etc", "--no-outputs", "--", "/bin/true"],
            "TS1005",
            "package",
        ),
        case(
            "missing outputs",
            CHECK,
            &["--package", "hello-agent", "--", "/bin/true"],
            RQ,
            "declared_outputs",
        ),
        case(
            "absolute output",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--output",
                "/etc/passwd:r",
                "--",
                "/bin/true",
            ],
            RQ,
            "declared_outputs[0].path",
        ),
        case(
            "dotdot output",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--output",
                "output/../../x:r",
                "--",
                "/bin/true",
            ],
            RQ,
            "declared_outputs[0].path",
        ),
        case(
            "double slash output",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--output",
                "output//x:r",
                "--",
                "/bin/true",
            ],
            RQ,
            "declared_outputs[0].path",
        ),
        case(
            "trailing slash output",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--output",
                "output/x/:r",
                "--",
                "/bin/true",
            ],
            RQ,
            "declared_outputs[0].path",
        ),
        case(
            "unknown placeholder",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--output",
                "output/<sid>/x:r",
                "--",
                "/bin/true",
            ],
            RQ,
            "declared_outputs[0].path",
        ),
        case(
            "bad role",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--output",
                "output/x:r o",
                "--",
                "/bin/true",
            ],
            RQ,
            "declared_outputs[0].role",
        ),
        case(
            "output without role",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--output",
                "output/x",
                "--",
                "/bin/true",
            ],
            ARG,
            "--output",
        ),
        case(
            "outputs and no-outputs",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--no-outputs",
                "--output",
                "o/x:r",
                "--",
                "/bin/true",
            ],
            ARG,
            "--no-outputs",
        ),
        case(
            "duplicate output",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--output",
                "o/x:r",
                "--output",
                "o/x:s",
                "--",
                "/bin/true",
            ],
            RQ,
            "declared_outputs[1].path",
        ),
        case(
            "dotdot input",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--no-outputs",
                "--input",
                "../x",
                "--",
                "/bin/true",
            ],
            RQ,
            "declared_inputs[0]",
        ),
        case(
            "bare command",
            CHECK,
            &["--package", "hello-agent", "--no-outputs", "--", "true"],
            RQ,
            "command[0]",
        ),
        case(
            "no command",
            CHECK,
            &["--package", "hello-agent", "--no-outputs"],
            RQ,
            "command",
        ),
        case(
            "zero timeout",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--no-outputs",
                "--timeout",
                "0",
                "--",
                "/bin/true",
            ],
            RQ,
            "timeout_seconds",
        ),
        case(
            "bad work order",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--no-outputs",
                "--work-order",
                "WO 42",
                "--",
                "/bin/true",
            ],
            RQ,
            "work_order_id",
        ),
        case(
            "request unknown field",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--request",
                &req(
                    "unknown",
                    r#"{"command":["/bin/true"],"declared_outputs":[],"sudo":true}"#,
                ),
            ],
            RQ,
            "sudo",
        ),
        case(
            "request nul path",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--request",
                &req(
                    "nul",
                    r#"{"command":["/bin/true"],"declared_outputs":[{"path":"output/a\u0000b","role":"r"}]}"#,
                ),
            ],
            RQ,
            "declared_outputs[0].path",
        ),
        case(
            "request output no role",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--request",
                &req(
                    "norole",
                    r#"{"command":["/bin/true"],"declared_outputs":[{"path":"output/x"}]}"#,
                ),
            ],
            RQ,
            "declared_outputs[0]",
        ),
        case(
            "request float timeout",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--request",
                &req(
                    "float",
                    r#"{"command":["/bin/true"],"declared_outputs":[],"timeout_seconds":1.5}"#,
                ),
            ],
            RQ,
            "timeout_seconds",
        ),
        case(
            "request plus flags",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--request",
                &req(
                    "mixed",
                    r#"{"command":["/bin/true"],"declared_outputs":[]}"#,
                ),
                "--",
                "/bin/true",
            ],
            ARG,
            "--request",
        ),
        case(
            "request missing file",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--request",
                "/nonexistent/req.json",
            ],
            ARG,
            "--request",
        ),
        case(
            "check bad session",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--session",
                "SES-1",
                "--no-outputs",
                "--",
                "/bin/true",
            ],
            "TS1004",
            "session_id",
        ),
        case(
            "verify traversal session",
            &["ledger", "verify"],
            &["--session", "../../../etc/passwd"],
            "TS1004",
            "session_id",
        ),
        case(
            "verify unknown session",
            &["ledger", "verify"],
            &["--session", "SES-20200101T000000000000Z-0000000000000000"],
            "E2054",
            "session",
        ),
        case(
            "verify bad tier",
            &["ledger", "verify"],
            &["--session", &sid, "--tier", "ho1/../x"],
            ARG,
            "--tier",
        ),
        case(
            "new bad tier",
            &["session", "new"],
            &["--tier", "../x"],
            ARG,
            "--tier",
        ),
        case(
            "header turn zero",
            &["prompt-header"],
            &["--session", &sid, "--turn", "0"],
            ARG,
            "--turn",
        ),
        case(
            "header dotdot input",
            &["prompt-header"],
            &["--session", &sid, "--turn", "1", "--input", "a/../../x"],
            RQ,
            "declared_inputs[0]",
        ),
        case(
            "header missing input",
            &["prompt-header"],
            &["--session", &sid, "--turn", "1", "--input", "nope.csv"],
            "TS1013",
            "declared_inputs",
        ),
    ];
    // Issue 8: arrays (or any non-object) where an object is required, in
    // every manifest and request object; refused by `check` and by `run`
    // (which must create nothing, not even a session).
    const RUN: &[&str] = &["run"];
    let run_case = |name: &'static str, args: &[&str], code: &'static str, field: &'static str| {
        case(name, RUN, args, code, field)
    };
    cases.extend([
        manifest_case(
            &fx,
            "capabilities as arrays",
            r#"{"capabilities":[["**"],["output/<session_id>/**"],["/bin/sh"]]}"#,
            MI,
            "capabilities",
        ),
        manifest_case(
            &fx,
            "limits as array",
            r#"{"capabilities":{},"limits":["256Mi","1",64]}"#,
            MI,
            "limits",
        ),
        manifest_case(
            &fx,
            "manifest as array",
            r#"[null,null,"trusted",[["**"],[],["/bin/sh"],[]]]"#,
            MI,
            "(document)",
        ),
        manifest_case(&fx, "capabilities as string", r#"{"capabilities":"all"}"#, MI, "capabilities"),
        manifest_case(&fx, "capabilities null", r#"{"capabilities":null}"#, MI, "capabilities"),
        run_case(
            "run capabilities as arrays",
            &["--package", "pkg-capabilities-as-arrays", "--no-outputs", "--", "/bin/sh"],
            MI,
            "capabilities",
        ),
        case(
            "request as array",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--request",
                &req("array", r#"[["/bin/true"],[],[]]"#),
            ],
            RQ,
            "(document)",
        ),
        case(
            "request output as array",
            CHECK,
            &[
                "--package",
                "hello-agent",
                "--request",
                &req(
                    "outarray",
                    r#"{"command":["/bin/true"],"declared_outputs":[["output/<session_id>/x","report"]]}"#,
                ),
            ],
            RQ,
            "declared_outputs[0]",
        ),
        run_case(
            "run request output as array",
            &[
                "--package",
                "hello-agent",
                "--request",
                &req(
                    "runoutarray",
                    r#"{"command":["/bin/true"],"declared_outputs":[["output/<session_id>/x","report"]]}"#,
                ),
            ],
            RQ,
            "declared_outputs[0]",
        ),
        run_case(
            "run request as array",
            &[
                "--package",
                "hello-agent",
                "--request",
                &req("runarray", r#"[["/bin/true"],[],[]]"#),
            ],
            RQ,
            "(document)",
        ),
    ]);

    // Issue 8: a manifest that is not a regular file is refused without
    // blocking (a FIFO would hang `open`) and without following a symlink.
    let special =
        |name: &'static str, says: &'static str, make: &dyn Fn(&std::path::Path)| -> Case {
            let c = manifest_case(&fx, name, "{}", MI, "(file)").saying(says);
            let path = fx
                .root
                .join("installed")
                .join(&c.args[1])
                .join("manifest.json");
            std::fs::remove_file(&path).unwrap();
            make(&path);
            c
        };
    cases.extend([
        special("manifest fifo", "FIFO", &|p| {
            assert!(
                std::process::Command::new("mkfifo")
                    .arg(p)
                    .status()
                    .unwrap()
                    .success()
            );
        }),
        special("manifest directory", "directory", &|p| {
            std::fs::create_dir(p).unwrap()
        }),
        special("manifest symlink to dev zero", "symbolic link", &|p| {
            std::os::unix::fs::symlink("/dev/zero", p).unwrap()
        }),
        special("manifest symlink to fifo", "symbolic link", &|p| {
            let fifo = p.with_file_name("fifo");
            assert!(
                std::process::Command::new("mkfifo")
                    .arg(&fifo)
                    .status()
                    .unwrap()
                    .success()
            );
            std::os::unix::fs::symlink(fifo, p).unwrap()
        }),
        special("manifest symlink to regular", "symbolic link", &|p| {
            let real = p.with_file_name("real.json");
            std::fs::write(&real, r#"{"capabilities":{"execute":["/bin/true"]}}"#).unwrap();
            std::os::unix::fs::symlink(real, p).unwrap()
        }),
    ]);
    let run_fifo = case(
        "run manifest fifo",
        RUN,
        &[
            "--package",
            "pkg-manifest-fifo",
            "--no-outputs",
            "--",
            "/bin/true",
        ],
        MI,
        "(file)",
    )
    .saying("FIFO");
    cases.push(run_fifo);

    // Issue 8: 10,000 complex globs used to fail with "error building NFA"
    // naming nothing, and `run` created a session first.
    let globs: Vec<String> = (0..10_000)
        .map(|i| format!("data/{{a{i},b{i},c{i}}}/**/[a-z]*{i}?x/*.{{csv,txt,json}}"))
        .collect();
    let many = json!({"capabilities": {"read": globs, "execute": ["/bin/true"]}}).to_string();
    cases.push(manifest_case(
        &fx,
        "ten thousand globs",
        &many,
        MI,
        "capabilities.read",
    ));
    cases.push(run_case(
        "run ten thousand globs",
        &[
            "--package",
            "pkg-ten-thousand-globs",
            "--no-outputs",
            "--",
            "/bin/true",
        ],
        MI,
        "capabilities.read",
    ));

    // Issue 9: a manifest entry that can grant nothing is refused at load,
    // naming the entry (TS1007), by check and by run before anything exists.
    const NOTHING: &str = "TS1007";
    cases.extend([
        manifest_case(
            &fx,
            "duplicate read",
            &m(r#"{"read":["data/**","data/**"],"execute":["/bin/true"]}"#),
            NOTHING,
            "capabilities.read[1]",
        )
        .saying("repeats capabilities.read[0]"),
        manifest_case(
            &fx,
            "read covered by forbidden",
            &m(r#"{"read":["secrets/key.pem"],"execute":["/bin/true"],"forbidden":["secrets/**"]}"#),
            NOTHING,
            "capabilities.read[0]",
        )
        .saying("forbidden by `secrets/**`"),
        manifest_case(
            &fx,
            "execute covered by forbidden",
            &m(r#"{"execute":["/bin/true"],"forbidden":["/bin/*"]}"#),
            NOTHING,
            "capabilities.execute[0]",
        ),
        manifest_case(
            &fx,
            "write without directory",
            &m(r#"{"write":["*.md"],"execute":["/bin/true"]}"#),
            NOTHING,
            "capabilities.write[0]",
        )
        .saying("no fixed directory"),
        manifest_case(
            &fx,
            "execute session path not writable",
            &m(r#"{"execute":["/bin/true","build/<session_id>/app"]}"#),
            NOTHING,
            "capabilities.execute[1]",
        )
        .saying("no writable scope"),
        manifest_case(
            &fx,
            "execute in ledgers",
            &m(r#"{"execute":["/bin/true","planes/ho1/run"]}"#),
            NOTHING,
            "capabilities.execute[1]",
        ),
        run_case(
            "run read covered by forbidden",
            &["--package", "pkg-read-covered-by-forbidden", "--no-outputs", "--", "/bin/true"],
            NOTHING,
            "capabilities.read[0]",
        ),
        run_case(
            "run write without directory",
            &["--package", "pkg-write-without-directory", "--no-outputs", "--", "/bin/true"],
            NOTHING,
            "capabilities.write[0]",
        ),
    ]);

    // Arguments outside the request: a missing root and a state dir inside it.
    let missing_root = Case {
        name: "missing root",
        words: &["session", "new"],
        args: vec![],
        code: ARG,
        field: "--root",
        says: None,
    };
    cases.push(missing_root);
    assert!(cases.len() >= 25);

    // Every `check` row again as `run` without `--session`: exit 2 must mean
    // nothing was created — no session, no ledger, no scratch dir, no state.
    let as_run: Vec<Case> = cases
        .iter()
        .filter(|c| c.words == CHECK)
        .map(|c| Case {
            name: Box::leak(format!("{} (as run)", c.name).into_boxed_str()),
            words: RUN,
            args: c.args.clone(),
            code: c.code,
            field: c.field,
            says: c.says,
        })
        .collect();
    cases.extend(as_run);

    for c in &cases {
        let before = fx.snapshot();
        let mut args: Vec<&str> = c.args.iter().map(String::as_str).collect();
        args.push("--json");
        let r = if c.name == "missing root" {
            Fixture::raw(&[
                "session",
                "new",
                "--root",
                "/nonexistent/ws",
                "--state-dir",
                fx.state.to_str().unwrap(),
                "--json",
            ])
        } else {
            // `--json` must come before `--` for commands with a trailing CMD.
            if let Some(pos) = args.iter().position(|a| *a == "--") {
                args.pop();
                args.insert(pos, "--json");
            }
            fx.supervise(c.words, &args)
        };
        assert_eq!(
            r.status, 2,
            "case `{}`: status {} stdout {} stderr {}",
            c.name, r.status, r.stdout, r.stderr
        );
        let v: Value = r.json();
        let e = &v["error"];
        assert_eq!(e["code"], c.code, "case `{}`: {e}", c.name);
        assert_eq!(e["field"], c.field, "case `{}`: {e}", c.name);
        let msg = e["message"].as_str().unwrap();
        let field_leaf = c
            .field
            .rsplit('.')
            .next()
            .unwrap()
            .trim_end_matches(|ch: char| ch == ']' || ch.is_ascii_digit())
            .trim_end_matches('[');
        assert!(
            msg.contains(field_leaf) || c.field == "(document)" || c.field == "session_id",
            "case `{}`: message does not name `{}`: {msg}",
            c.name,
            c.field
        );
        if let Some(text) = c.says {
            assert!(
                msg.contains(text),
                "case `{}`: message lacks `{text}`: {msg}",
                c.name
            );
        }
        assert!(
            r.stderr.contains(c.code),
            "case `{}`: stderr lacks the code: {}",
            c.name,
            r.stderr
        );
        assert_eq!(fx.snapshot(), before, "case `{}` changed the disk", c.name);
    }
}

#[test]
fn bad_input_creates_no_state_dir_and_no_session() {
    let fx = Fixture::new();
    assert!(!fx.state.exists());
    for args in [
        &["--tier", "x"][..],
        &["--tier", "ho1", "--state-dir", "relative/state"][..],
    ] {
        let r = fx.supervise(&["session", "new"], args);
        assert_eq!(r.status, 2, "{}", r.stderr);
    }
    assert!(!fx.state.exists());
    assert!(!fx.root.join("planes").exists() && !fx.root.join("tmp").exists());
    // A state dir inside the root is refused before anything is created.
    let inside = fx.root.join("state");
    let r = Fixture::raw(&[
        "session",
        "new",
        "--root",
        fx.root.to_str().unwrap(),
        "--state-dir",
        inside.to_str().unwrap(),
    ]);
    assert_eq!(r.status, 2);
    assert!(r.stderr.contains("--state-dir"), "{}", r.stderr);
    assert!(!inside.exists());
    assert_eq!(std::fs::read_dir(&fx.root).unwrap().count(), 0);
    // A state dir whose path holds `,`, `:` or `\` (its turn directories
    // are overlay layers by path on the OCI backends) was accepted, and
    // every turn then failed E2041 (red-team, stop 54).
    for name in ["st,a", "st:b", "st\\c"] {
        let odd = fx.state.parent().unwrap().join(name);
        let r = Fixture::raw(&[
            "session",
            "new",
            "--root",
            fx.root.to_str().unwrap(),
            "--state-dir",
            odd.to_str().unwrap(),
        ]);
        assert_eq!(r.status, 2, "{name}: {}", r.stderr);
        assert!(r.stderr.contains("--state-dir"), "{}", r.stderr);
        assert!(!odd.exists(), "{name}");
    }
    assert_eq!(std::fs::read_dir(&fx.root).unwrap().count(), 0);
}

/// Issue 8: `--request` naming a FIFO, a device, a directory or a symlink is
/// refused at once (exit 2, TS1006 on `--request`, the file named), never a
/// hang, and nothing is created — for `check` and for `run` without
/// `--session`. (A FIFO that blocked `open` would be reported as a failure
/// after 10 s instead of hanging.)
#[test]
fn request_file_that_is_not_regular_is_refused_without_blocking() {
    use std::time::{Duration, Instant};
    let fx = Fixture::new();
    fx.install("hello-agent", HELLO_MANIFEST);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(d.join("fifo"))
            .status()
            .unwrap()
            .success()
    );
    std::os::unix::fs::symlink(d.join("fifo"), d.join("to-fifo")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", d.join("to-zero")).unwrap();
    std::fs::create_dir(d.join("dir")).unwrap();
    let cases = [
        (d.join("fifo"), "FIFO"),
        (d.join("to-fifo"), "symbolic link"),
        (d.join("to-zero"), "symbolic link"),
        (d.join("dir"), "directory"),
        ("/dev/zero".into(), "character device"),
    ];
    for words in [&["check"][..], &["run"][..]] {
        for (path, needle) in &cases {
            let before = fx.snapshot();
            let mut child = std::process::Command::new(turnstile_tests::supervise_bin())
                .args(words)
                .arg("--root")
                .arg(&fx.root)
                .arg("--state-dir")
                .arg(&fx.state)
                .args(["--package", "hello-agent", "--json", "--request"])
                .arg(path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let start = Instant::now();
            while child.try_wait().unwrap().is_none() {
                if start.elapsed() > Duration::from_secs(10) {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("{words:?} --request {} blocked", path.display());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let out = child.wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{words:?} {}", path.display());
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            let e = &v["error"];
            assert_eq!(e["code"], "TS1006", "{e}");
            assert_eq!(e["field"], "--request", "{e}");
            let msg = e["message"].as_str().unwrap();
            assert!(
                msg.contains(&path.display().to_string()) && msg.contains(needle),
                "{msg}"
            );
            assert_eq!(fx.snapshot(), before, "{words:?} {}", path.display());
        }
    }
}

/// Issue 9: a literal executable that does not exist is refused when the
/// manifest is loaded — by check, plan and run (before any session exists) —
/// with the nearest existing name.
#[test]
fn a_typo_in_an_executable_is_refused_before_anything_is_created() {
    let fx = Fixture::new();
    fx.install(
        "typo",
        r#"{"capabilities":{"execute":["/bin/true","/usr/bin/pythno3 -u"]}}"#,
    );
    for words in [&["check"][..], &["run"][..], &["plan"][..]] {
        let before = fx.snapshot();
        let args: &[&str] = if words == ["plan"] {
            &["--package", "typo", "--json"]
        } else {
            &[
                "--package",
                "typo",
                "--json",
                "--no-outputs",
                "--",
                "/bin/true",
            ]
        };
        let r = fx.supervise(words, args);
        assert_eq!(r.status, 2, "{words:?}: {}{}", r.stdout, r.stderr);
        let e = &r.json()["error"];
        assert_eq!(e["code"], "TS1007", "{e}");
        assert_eq!(e["field"], "capabilities.execute[1]", "{e}");
        let msg = e["message"].as_str().unwrap();
        assert!(
            msg.contains("/usr/bin/pythno3") && msg.contains("does not exist"),
            "{msg}"
        );
        assert_eq!(fx.snapshot(), before, "{words:?} changed the disk");
    }
}

/// Red-team finding (wave 3): `--config` names a small regular file. One
/// that never ends (`/dev/zero`) or never opens for reading (a FIFO with no
/// writer) is refused at once — exit 2, TS1006 naming the file — instead
/// of reading without bound or waiting for ever; nothing is created.
#[test]
fn a_config_that_is_not_a_small_regular_file_is_refused_at_once() {
    let fx = Fixture::new();
    fx.install("hello-agent", HELLO_MANIFEST);
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let big = dir.path().join("big.json");
    std::fs::write(&big, vec![b' '; (1 << 20) + 1]).unwrap();
    let before = fx.snapshot();
    for config in [Path::new("/dev/zero"), fifo.as_path(), big.as_path()] {
        let mut child = fx
            .command(
                &turnstile_tests::supervise_bin(),
                &["run"],
                &[
                    "--package",
                    "hello-agent",
                    "--json",
                    "--no-outputs",
                    "--config",
                ],
            )
            .arg(config)
            .args(["--", "/usr/bin/python3", "installed/hello-agent/main.py"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{}: still running after 20 s", config.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", config.display());
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["error"]["code"], "TS1006", "{v}");
        assert!(
            v["error"]["field"]
                .as_str()
                .unwrap()
                .starts_with(&config.display().to_string()),
            "{v}"
        );
    }
    assert_eq!(before, fx.snapshot(), "a refused config created something");
}

/// Red-team finding (wave 3): under `--json`, a command line clap refuses
/// is the contract's JSON error too (TS1006 naming the argument, exit 2),
/// not clap's text alone; without `--json` (or with it only in the
/// command's words) clap's text, exit 2; `--help` stays help.
#[test]
fn usage_errors_under_json_are_json() {
    for (args, field) in [
        (
            &[
                "run",
                "--json",
                "--root",
                "/tmp",
                "--package",
                "p",
                "--session",
            ][..],
            Some("--session"),
        ),
        (
            &[
                "run",
                "--json",
                "--root",
                "/tmp",
                "--package",
                "p",
                "--bogus",
                "--",
                "/bin/true",
            ][..],
            Some("--bogus"),
        ),
        (
            &["ledger", "verify", "--json", "--nope"][..],
            Some("--nope"),
        ),
        (
            &[
                "run",
                "--root",
                "/tmp",
                "--package",
                "p",
                "--bogus",
                "--",
                "/bin/true",
                "--json",
            ][..],
            None,
        ),
    ] {
        let r = Fixture::raw(args);
        assert_eq!(r.status, 2, "{args:?}: {}{}", r.stdout, r.stderr);
        match field {
            Some(field) => {
                let v = r.json();
                assert_eq!(v["error"]["code"], "TS1006", "{args:?}: {v}");
                assert_eq!(v["error"]["field"], field, "{args:?}: {v}");
            }
            None => {
                assert!(r.stdout.is_empty(), "{args:?}: {}", r.stdout);
                assert!(r.stderr.contains("unexpected argument"), "{}", r.stderr);
            }
        }
    }
    let r = Fixture::raw(&["run", "--json", "--help"]);
    assert_eq!(r.status, 0);
    assert!(r.stdout.contains("Usage"), "{}", r.stdout);
}

/// `recover --session SID` (needs --root) settles that one session, and
/// `--skip-busy` passes over a session a live supervisor holds instead of
/// waiting for it (the containerd shim's recovery after its `supervise run`
/// was killed, red-team wave 3).
#[test]
fn recover_one_session_or_skip_the_busy_ones() {
    let fx = Fixture::new();
    let sid = fx.new_session();
    let r = fx.supervise(&["recover"], &["--session", &sid, "--json"]);
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(r.json()["sessions_checked"], 1, "{}", r.stdout);
    let r = fx.supervise(&["recover"], &["--session", "SES-nope", "--json"]);
    assert_eq!(r.status, 2, "{}{}", r.stdout, r.stderr);
    assert_eq!(r.json()["error"]["code"], "TS1004", "{}", r.stdout);
    let state = fx.state.display().to_string();
    let r = Fixture::raw(&["recover", "--state-dir", &state, "--session", &sid]);
    assert_eq!(r.status, 2, "--session without --root: {}", r.stderr);
    // A session whose lock is held: passed over at once with --skip-busy.
    let lock = fx.state.join(format!("sessions/{sid}/lock"));
    assert!(lock.exists(), "{}", lock.display());
    let held = std::fs::File::open(&lock).unwrap();
    nix::fcntl::Flock::lock(held, nix::fcntl::FlockArg::LockExclusive)
        .map(|held| {
            let r = fx.supervise(&["recover"], &["--skip-busy", "--json"]);
            assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
            assert_eq!(r.json()["sessions_checked"], 0, "{}", r.stdout);
            drop(held);
        })
        .unwrap();
}

/// Red-team wave 4: one session that cannot be recovered (here its exec
/// anchor is damaged) stopped `recover` for the whole state directory,
/// and `serve` from starting. Now every other session is recovered, the
/// damaged one is named under `failed` with its code, and the exit status
/// is that error's.
#[test]
fn one_damaged_session_does_not_stop_the_recovery_of_the_others() {
    let fx = Fixture::new();
    let (good, bad) = (fx.new_session(), fx.new_session());
    let anchor = fx.state.join(format!("sessions/{bad}/anchors/exec.json"));
    assert!(anchor.exists(), "{}", anchor.display());
    std::fs::write(&anchor, b"not an anchor").unwrap();
    let r = fx.supervise(&["recover"], &["--json"]);
    assert_ne!(r.status, 0, "{}{}", r.stdout, r.stderr);
    let v = r.json();
    assert_eq!(v["sessions_checked"], 1, "{}", r.stdout);
    let failed = v["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{}", r.stdout);
    assert_eq!(failed[0]["session_id"], bad.as_str());
    assert!(failed[0]["code"].as_str().is_some_and(|c| !c.is_empty()));
    let text = fx.supervise(&["recover"], &[]);
    assert!(
        text.stdout.contains(&format!("{bad}: NOT recovered")),
        "{}",
        text.stdout
    );
    fx.assert_ledgers_intact(&good);
}

/// A manifest entry that grants nothing is an error, not a no-op (red-team
/// lows, stop 54): an execute entry naming a file without any execute bit
/// (`/etc/shadow`, a script never made executable), and an egress entry
/// that repeats another or names only loopback. Refused when the turn is
/// checked (exit 2, TS1007 ENTRY_GRANTS_NOTHING naming the field),
/// nothing created.
#[test]
fn entries_that_grant_nothing_are_refused_naming_the_field() {
    let fx = Fixture::new();
    fx.write("installed/p/run.sh", b"#!/bin/sh\necho hi\n");
    for (caps, extra, field) in [
        (
            r#"{"execute":["/etc/shadow"]}"#,
            "",
            "capabilities.execute[0]",
        ),
        (
            r#"{"execute":["/bin/true","installed/p/run.sh"]}"#,
            "",
            "capabilities.execute[1]",
        ),
        (
            r#"{"execute":["/bin/true"]}"#,
            r#","network":"restricted","egress":["a.test:443","a.test:443"]"#,
            "egress[1]",
        ),
        (
            r#"{"execute":["/bin/true"]}"#,
            r#","network":"restricted","egress":["127.0.0.1:8080"]"#,
            "egress[0]",
        ),
    ] {
        fx.install_exact("p", &format!(r#"{{"capabilities":{caps}{extra}}}"#));
        let before = fx.snapshot();
        let r = fx.supervise(
            &["run"],
            &[
                "--package",
                "p",
                "--json",
                "--no-outputs",
                "--",
                "/bin/true",
            ],
        );
        assert_eq!(r.status, 2, "{caps}{extra}: {}", r.stdout);
        let v = r.json();
        assert_eq!(v["error"]["code"], "TS1007", "{caps}{extra}: {v}");
        assert_eq!(v["error"]["field"], field, "{caps}{extra}: {v}");
        assert_eq!(before, fx.snapshot(), "{caps}{extra}: something was made");
    }
    // Made executable, the script is granted.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        fx.root.join("installed/p/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    fx.install_exact(
        "p",
        r#"{"capabilities":{"execute":["installed/p/run.sh"]}}"#,
    );
    let r = fx.supervise(
        &["check"],
        &["--package", "p", "--no-outputs", "--", "installed/p/run.sh"],
    );
    assert_eq!(r.status, 0, "{} {}", r.stdout, r.stderr);
}
