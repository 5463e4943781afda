//! The soak's CI-sized run (issue 29, item 4): 100 sessions on one
//! `supervise serve` daemon, 4 client threads, about 30 s of mixed warm and
//! cold turns (tests/src/soak.rs), then the same invariants as `cargo xtask
//! soak`'s 1,000 sessions for 10 minutes: every turn ended as its command
//! promises, the daemon stopped cleanly, every session's ledgers verify and
//! hold one `turn.finished` per turn driven, the daemon's descriptors and
//! RSS stayed within their bounds, nothing is left behind. No duration is
//! asserted. Root.

use std::time::Duration;

use turnstile_tests::soak::{self, Config};
use turnstile_tests::{require_root, supervise_bin};

#[test]
fn issue_29_soak_many_sessions_every_turn_verifies_and_the_daemon_stays_flat() {
    if !require_root("issue_29_soak_many_sessions_every_turn_verifies_and_the_daemon_stays_flat") {
        return;
    }
    let report = soak::run(&Config {
        sessions: 100,
        threads: 4,
        duration: Duration::from_secs(30),
        pool_size: 16,
        sample_every: Duration::from_secs(3),
        scratch_parent: std::env::temp_dir(),
        supervise: supervise_bin(),
        verbose: false,
    });
    let table = report.table();
    eprintln!("{table}");
    assert!(
        report.turn_error_examples.is_empty(),
        "{:#?}",
        report.turn_error_examples
    );
    // Both kinds of sandbox were exercised (counts, not times).
    assert!(
        report.by_sandbox.get("warm").copied().unwrap_or(0) > 0,
        "{table}"
    );
    assert!(
        report.by_sandbox.get("cold").copied().unwrap_or(0) > 0,
        "{table}"
    );
    assert!(report.samples.len() >= 2, "{table}");
    assert_eq!(report.failures(), Vec::<String>::new(), "{table}");
}
