//! Issue 31, the newcomer's path: `supervise init` makes a package that a
//! real `supervise run` runs as it is (root), never overwrites a package,
//! keeps existing data; `supervise completions SHELL` and `supervise man`
//! come from the same clap definition as `--help`.

use std::process::{Command, Output, Stdio};

use serde_json::Value;
use turnstile_tests::{require_root, supervise_bin};

fn supervise(args: &[&str]) -> Output {
    Command::new(supervise_bin())
        .args(args)
        .stdin(Stdio::null())
        .env_remove("TURNSTILE_LOG")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn issue_31_init_then_a_real_run_of_the_package_commits() {
    if !require_root("issue_31_init_then_a_real_run_of_the_package_commits") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // The root does not exist yet: init creates it.
    let root = tmp.path().join("ws");
    let state = tmp.path().join("state");
    let (root_s, state_s) = (root.to_str().unwrap(), state.to_str().unwrap());
    let r = supervise(&["init", "--root", root_s, "--package", "demo", "--json"]);
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    let v: Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(
        v["created"],
        serde_json::json!([
            "installed/demo/main.py",
            "data/sample.csv",
            "installed/demo/manifest.json"
        ])
    );
    // The printed command, with this test's state dir, as the README says.
    let try_run: Vec<String> = v["try_run"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(try_run[0], "supervise");
    let run = Command::new(supervise_bin())
        .args(&try_run[1..2])
        .args(["--state-dir", state_s, "--json"])
        .args(&try_run[2..])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        run.status.code(),
        Some(0),
        "{}\n{}",
        text(&run.stdout),
        text(&run.stderr)
    );
    let out: Value = serde_json::from_slice(&run.stdout).unwrap();
    let sid = out["session_id"].as_str().unwrap();
    let summary =
        std::fs::read_to_string(root.join("output").join(sid).join("summary.txt")).unwrap();
    assert!(
        summary.starts_with("data/sample.csv: 4 lines, sha256 "),
        "{summary}"
    );
    // The package exists now: a second init is refused, naming the field,
    // and changes nothing.
    let manifest = root.join("installed/demo/manifest.json");
    let before = std::fs::read(&manifest).unwrap();
    std::fs::write(root.join("installed/demo/main.py"), "edited").unwrap();
    let r = supervise(&["init", "--root", root_s, "--package", "demo", "--json"]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r.stderr));
    let v: Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(v["error"]["field"], "--package", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already exists"),
        "{v}"
    );
    assert_eq!(std::fs::read(&manifest).unwrap(), before);
    assert_eq!(
        std::fs::read_to_string(root.join("installed/demo/main.py")).unwrap(),
        "edited"
    );
}

#[test]
fn issue_31_init_keeps_existing_data_and_refuses_bad_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::create_dir(root.join("data")).unwrap();
    std::fs::write(root.join("data/sample.csv"), "mine\n").unwrap();
    let root_s = root.to_str().unwrap();
    let r = supervise(&["init", "--root", root_s, "--package", "second", "--json"]);
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    let v: Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(
        v["created"],
        serde_json::json!(["installed/second/main.py", "installed/second/manifest.json"])
    );
    assert_eq!(
        std::fs::read_to_string(root.join("data/sample.csv")).unwrap(),
        "mine\n"
    );
    // The manifest loads as `check` loads it.
    let c = supervise(&[
        "check",
        "--root",
        root_s,
        "--state-dir",
        state.path().to_str().unwrap(),
        "--package",
        "second",
        "--json",
        "--output",
        "output/<session_id>/summary.txt:report",
        "--",
        "/usr/bin/python3",
        "installed/second/main.py",
    ]);
    assert_eq!(
        c.status.code(),
        Some(0),
        "{}{}",
        text(&c.stdout),
        text(&c.stderr)
    );
    for bad in ["../x", "", "a/b"] {
        let r = supervise(&["init", "--root", root_s, "--package", bad, "--json"]);
        assert_eq!(r.status.code(), Some(2), "{bad:?}");
        let v: Value = serde_json::from_slice(&r.stdout).unwrap();
        assert_eq!(v["error"]["code"], "TS1005", "{bad:?}: {v}");
    }
}

#[test]
fn issue_31_completions_for_every_shell_and_a_man_page() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let r = supervise(&["completions", shell]);
        assert_eq!(r.status.code(), Some(0), "{shell}: {}", text(&r.stderr));
        let s = text(&r.stdout);
        assert!(s.contains("supervise"), "{shell}: {s}");
        // Every subcommand is completed.
        for sub in ["run", "serve", "init", "completions"] {
            assert!(s.contains(sub), "{shell}: no `{sub}`");
        }
    }
    let r = supervise(&["completions", "tcsh"]);
    assert_eq!(r.status.code(), Some(2));
    let r = supervise(&["man"]);
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    let page = text(&r.stdout);
    assert!(page.contains(".TH supervise 1"), "{page}");
    assert!(page.contains("init") && page.contains("serve"), "{page}");
    // Rendered by man(1)'s formatter when there is one.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("supervise.1");
    let r = supervise(&["man", "--out", file.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), page);
    match Command::new("groff")
        .args(["-man", "-Tutf8"])
        .arg(&file)
        .output()
    {
        Ok(o) => {
            assert!(o.status.success(), "{}", text(&o.stderr));
            assert!(text(&o.stdout).contains("supervise"));
        }
        Err(_) => eprintln!("groff not installed: man page rendering by groff skipped"),
    }
}
