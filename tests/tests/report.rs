//! Issue 30 item 6: `supervise report --html` — a session's page, checked
//! in a real headless browser (Debian's chromium): the DOM the browser
//! built has one timeline cell and one section per turn, coloured by
//! outcome, the committed outputs with their hashes, the violations with
//! their hints, and the verification status on top; a file name chosen by
//! the agent to be markup stays text. A screenshot is kept as an artifact
//! (`target/test-artifacts/report-*.png`).

use std::path::{Path, PathBuf};
use std::process::Command;

use turnstile_tests::{Fixture, for_this_kernel, require_root, sha256_file};

const MANIFEST: &str = r#"{
  "package_id": "rep",
  "version": "1.0.0",
  "trust_level": "standard",
  "capabilities": {
    "read": ["installed/rep/**"],
    "write": ["out/<session_id>/**"],
    "execute": ["/bin/sh", "/bin/true", "/bin/false", "/bin/mkdir"],
    "forbidden": ["installed/rep/secrets/**"]
  },
  "limits": {"memory": "256Mi", "cpu": "1", "pids": 64, "timeout_seconds": 60},
  "network": "isolated"
}"#;

/// The browser, or a failure under TURNSTILE_REQUIRE_KERNEL=1 (the xtask
/// installs it); `None` otherwise.
fn browser() -> Option<PathBuf> {
    for b in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(b).exists() {
            return Some(PathBuf::from(b));
        }
    }
    assert!(
        std::env::var_os("TURNSTILE_REQUIRE_KERNEL").is_none(),
        "chromium is missing (apt-get install chromium; `cargo xtask test` installs it)"
    );
    eprintln!("SKIP: chromium is not installed");
    None
}

fn headless(browser: &Path, profile: &Path) -> Command {
    let mut c = Command::new(browser);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// The DOM as the browser built it from the page.
fn dump_dom(browser: &Path, profile: &Path, page: &Path) -> String {
    let out = headless(browser, profile)
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium --dump-dom failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("the DOM is UTF-8")
}

fn screenshot(browser: &Path, profile: &Path, page: &Path, png: &Path) {
    let out = headless(browser, profile)
        .arg(format!("--screenshot={}", png.display()))
        .arg("--window-size=1200,1600")
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(png).expect("the screenshot was written");
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000,
        "not a real screenshot ({} bytes)",
        bytes.len()
    );
}

fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn issue_30_the_session_report_of_50_turns_renders_in_a_real_browser() {
    if !require_root("issue_30_the_session_report_of_50_turns_renders_in_a_real_browser") {
        return;
    }
    let Some(browser) = browser() else { return };
    let fx = Fixture::new();
    fx.install("rep", &for_this_kernel(MANIFEST));
    let first = fx.run("rep", &["--json", "--no-outputs", "--", "/bin/true"]);
    assert_eq!(first.status, 0, "{}", first.stderr);
    let sid = first.json()["session_id"].as_str().unwrap().to_owned();
    let hostile = "<img src=x onerror=alert(1)>.txt";
    let mut want = Vec::new(); // (status, class)
    want.push(("committed", "ok"));
    for i in 2..=50u32 {
        let (args, status, class): (Vec<String>, &str, &str) = match i % 5 {
            // Committed, with an output whose name (chosen by the agent,
            // under a declared tree) is markup.
            0 => (
                vec![
                    "--output".into(),
                    format!("out/<session_id>/h{i}/**:report"),
                    "--".into(),
                    "/bin/sh".into(),
                    "-c".into(),
                    format!("mkdir out/{sid}/h{i} && printf t{i} > 'out/{sid}/h{i}/{hostile}'"),
                ],
                "committed",
                "ok",
            ),
            // Blocked: writes a file it did not declare.
            1 => (
                vec![
                    "--output".into(),
                    "out/<session_id>/declared.md:report".into(),
                    "--".into(),
                    "/bin/sh".into(),
                    "-c".into(),
                    format!("printf x > out/{sid}/declared.md; printf y > out/{sid}/undeclared.md"),
                ],
                "blocked",
                "blocked",
            ),
            // Refused before execution: reads a forbidden path.
            2 => (
                vec![
                    "--input".into(),
                    "installed/rep/secrets/key.pem".into(),
                    "--no-outputs".into(),
                    "--".into(),
                    "/bin/true".into(),
                ],
                "violation",
                "blocked",
            ),
            // The command fails.
            3 => (
                vec!["--no-outputs".into(), "--".into(), "/bin/false".into()],
                "command_failed",
                "failed",
            ),
            _ => (
                vec![
                    "--output".into(),
                    format!("out/<session_id>/r{i}.md:report"),
                    "--".into(),
                    "/bin/sh".into(),
                    "-c".into(),
                    format!("printf r{i} > out/{sid}/r{i}.md"),
                ],
                "committed",
                "ok",
            ),
        };
        let mut all: Vec<&str> = vec!["--session", &sid, "--json"];
        all.extend(args.iter().map(String::as_str));
        let r = fx.run("rep", &all);
        assert_eq!(r.json()["status"], status, "turn {i}: {}", r.stderr);
        want.push((status, class));
    }

    let page = fx.state.parent().unwrap().join("session.html");
    let r = fx.supervise(
        &["report"],
        &[
            "--session",
            &sid,
            "--html",
            page.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    assert_eq!(r.json()["turns"], 50);
    assert_eq!(r.json()["verified"], true);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("default-src 'none'"),
        "the page forbids every fetch"
    );
    assert!(!html.contains("<script"), "the page has no script");

    let profile = tempfile::tempdir().unwrap();
    let dom = dump_dom(&browser, profile.path(), &page);
    // The markup the agent chose stayed text: no element was made of it.
    assert!(!dom.contains("<img"), "the hostile name became an element");
    assert_eq!(
        count(&dom, "&lt;img src=x onerror=alert(1)&gt;.txt"),
        20,
        "each of the 10 hostile names is shown as text, in its command and in its output row"
    );
    assert_eq!(
        count(&dom, "/&lt;img src=x onerror=alert(1)&gt;.txt</code></td>"),
        10
    );
    assert!(dom.contains("id=\"integrity\" class=\"integrity good\" data-verified=\"true\""));
    assert!(dom.contains("data-state=\"none\""), "no checkpoint yet");
    assert_eq!(count(&dom, "<section class=\"turn "), 50);
    for (i, (status, class)) in want.iter().enumerate() {
        let n = i + 1;
        assert!(
            dom.contains(&format!(
                "<section class=\"turn {class}\" id=\"turn-{n}\" data-status=\"{status}\">"
            )),
            "turn {n} should be {status} ({class})"
        );
        assert!(
            dom.contains(&format!("<a class=\"{class}\" href=\"#turn-{n}\"")),
            "timeline cell {n}"
        );
    }
    // An output's hash is the file's.
    let r9 = fx.root.join(format!("out/{sid}/r9.md"));
    assert!(dom.contains(&sha256_file(&r9)), "r9.md's sha256 is shown");
    // Violations come with their hints.
    let v = count(&dom, "class=\"violation\"");
    assert_eq!(
        v, 19,
        "9 blocked and 10 refused turns list one violation each"
    );
    assert!(dom.contains("installed/rep/secrets/key.pem"));
    assert!(
        count(&dom, "class=\"hint\"") >= 1,
        "at least one hint is shown"
    );

    let png = artifacts().join("report-50-turns.png");
    screenshot(&browser, profile.path(), &page, &png);
}

#[test]
fn issue_30_the_report_says_when_ledgers_fail_or_differ_from_the_checkpoint() {
    if !require_root("issue_30_the_report_says_when_ledgers_fail_or_differ_from_the_checkpoint") {
        return;
    }
    let Some(browser) = browser() else { return };
    let fx = Fixture::new();
    fx.install("rep", &for_this_kernel(MANIFEST));
    let r = fx.run("rep", &["--json", "--no-outputs", "--", "/bin/true"]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    let sid = r.json()["session_id"].as_str().unwrap().to_owned();
    let key = fx.state.parent().unwrap().join("keys/sup");
    let g = Fixture::raw(&["key", "generate", "--out", key.to_str().unwrap()]);
    assert_eq!(g.status, 0, "{}", g.stderr);
    let c = fx.supervise(
        &["ledger", "checkpoint"],
        &["--session", &sid, "--key", key.to_str().unwrap()],
    );
    assert_eq!(c.status, 0, "{}", c.stderr);
    let r = fx.run(
        "rep",
        &["--session", &sid, "--no-outputs", "--", "/bin/true"],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);

    let page = fx.state.parent().unwrap().join("ok.html");
    let pubkey = format!("{}.pub", key.display());
    let r = fx.supervise(
        &["report"],
        &[
            "--session",
            &sid,
            "--html",
            page.to_str().unwrap(),
            "--pubkey",
            &pubkey,
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let profile = tempfile::tempdir().unwrap();
    let dom = dump_dom(&browser, profile.path(), &page);
    assert!(dom.contains("data-state=\"matches\""), "{dom}");
    assert!(dom.contains("signed by sup"), "the signature was checked");
    assert_eq!(count(&dom, "<section class=\"turn "), 2);

    // Tamper: change a byte of the evidence ledger's first turn entry.
    let evidence = fx.ledger(&sid, "evidence");
    let text = std::fs::read_to_string(&evidence).unwrap();
    let tampered = text.replacen("\"/bin/true\"", "\"/bin/tru3\"", 1);
    assert_ne!(text, tampered);
    std::fs::write(&evidence, tampered).unwrap();
    let bad = fx.state.parent().unwrap().join("bad.html");
    let r = fx.supervise(
        &["report"],
        &["--session", &sid, "--html", bad.to_str().unwrap()],
    );
    assert_eq!(r.status, 3, "integrity exit status: {}", r.stderr);
    assert!(r.stderr.contains("TS1010"), "{}", r.stderr);
    let dom = dump_dom(&browser, profile.path(), &bad);
    assert!(dom.contains("class=\"integrity bad\" data-verified=\"false\""));
    assert!(dom.contains("FAILED verification"));
    assert_eq!(
        count(&dom, "<section class=\"turn "),
        0,
        "nothing unverifiable is listed"
    );

    // Bad input: an unknown session, a directory as the page.
    let r = fx.supervise(
        &["report"],
        &[
            "--session",
            "SES-nope",
            "--html",
            fx.state.parent().unwrap().join("x.html").to_str().unwrap(),
        ],
    );
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(!fx.state.parent().unwrap().join("x.html").exists());
    let r = fx.supervise(
        &["report"],
        &["--session", &sid, "--html", fx.state.to_str().unwrap()],
    );
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--html"), "{}", r.stderr);
}
