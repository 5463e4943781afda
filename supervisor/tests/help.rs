//! The binary's own contract: `--help` documents every subcommand and the
//! exit codes; usage errors exit 2. (Also makes `cargo test` build
//! `supervise` for the workspace's integration tests.)

// Test helpers may panic on a broken environment; that is the failure report.
#![allow(clippy::unwrap_used)]

use std::process::Command;

fn supervise(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_supervise"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn help_lists_subcommands_and_exit_codes() {
    let out = supervise(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    for word in [
        "session",
        "ledger",
        "check",
        "prompt-header",
        "Exit status",
        "11",
    ] {
        assert!(text.contains(word), "--help lacks {word}:\n{text}");
    }
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(supervise(&[]).status.code(), Some(2));
    assert_eq!(supervise(&["session", "new"]).status.code(), Some(2));
    assert_eq!(supervise(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(
        supervise(&[
            "prompt-header",
            "--root",
            "/",
            "--session",
            "x",
            "--turn",
            "-1"
        ])
        .status
        .code(),
        Some(2)
    );
}
