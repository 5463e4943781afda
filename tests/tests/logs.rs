//! Spans (issue 24): one tracing span per turn, with a child span per
//! phase, and `--log-format json` on `run` (the daemon's default).

use turnstile_tests::{Fixture, require_root};

#[test]
fn issue_24_run_log_format_json_has_a_turn_span_and_a_span_per_phase() {
    if !require_root("issue_24_run_log_format_json_has_a_turn_span_and_a_span_per_phase") {
        return;
    }
    let fx = Fixture::new();
    fx.install(
        "k",
        r#"{"capabilities": {"read": ["data/**"], "execute": ["/bin/true"]}}"#,
    );
    fx.write("data/x", b"x");
    let r = fx.run(
        "k",
        &["--log-format", "json", "--no-outputs", "--", "/bin/true"],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let lines: Vec<serde_json::Value> = r
        .stderr
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let turn = lines
        .iter()
        .find(|l| l["span"]["name"] == "turn")
        .unwrap_or_else(|| panic!("no turn span: {}", r.stderr));
    let span = &turn["span"];
    assert_eq!(span["backend"], "native", "{turn}");
    assert_eq!(span["status"], "committed", "{turn}");
    assert!(span["duration_ms"].as_f64().is_some(), "{turn}");
    assert!(
        span["turn_id"]
            .as_str()
            .is_some_and(|t| t.ends_with("-t1") && t.starts_with("SES-")),
        "{turn}"
    );
    let phases: Vec<&str> = lines
        .iter()
        .filter(|l| l["span"]["name"] == "phase")
        .filter_map(|l| l["span"]["phase"].as_str())
        .collect();
    for p in [
        "plan",
        "prepare",
        "sandbox",
        "capture",
        "verify_commit",
        "teardown",
    ] {
        assert!(phases.contains(&p), "phase {p} missing: {phases:?}");
    }
    // Text (the default) stays quiet: the summary line only.
    let r = fx.run("k", &["--no-outputs", "--", "/bin/true"]);
    assert_eq!(r.status, 0);
    assert!(
        r.stderr.lines().all(|l| l.starts_with("supervise: ")),
        "{}",
        r.stderr
    );
    // A bad value is a usage error.
    let r = fx.run(
        "k",
        &["--log-format", "xml", "--no-outputs", "--", "/bin/true"],
    );
    assert_eq!(r.status, 2, "{}", r.stderr);
}
