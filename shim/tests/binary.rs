//! The shim binary itself. Being an integration test, this also makes
//! `cargo test --workspace` build `target/<profile>/containerd-shim-turnstile-v2`,
//! which `tests/tests/shim.rs` and `tests/tests/cri.rs` put on containerd's
//! PATH.

use std::process::Command;

#[test]
fn run_by_hand_without_containerds_flags_it_fails_closed_naming_what_is_missing() {
    let out = Command::new(env!("CARGO_BIN_EXE_containerd-shim-turnstile-v2"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("io.containerd.turnstile.v2") && err.contains("namespace"),
        "{err}"
    );
}
