//! Issue 31: the parsers hostile input reaches survive mutated input — the
//! `fuzz` binary (tests/src/bin/fuzz.rs) for one second per target, with a
//! fixed seed, from the checked-in corpus in tests/fuzz-corpus/: no panic,
//! no input slower than 250 ms, no allocation past the address-space cap.
//! `cargo xtask fuzz --minutes M` runs it longer.

#[test]
fn issue_31_every_parser_survives_a_second_of_mutated_input() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fuzz"))
        .args(["--seconds", "1", "--seed", "31"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for target in [
        "manifest",
        "request",
        "envelope",
        "wire",
        "bus_message",
        "bus_rules",
        "ledger",
        "config",
        "checkpoint",
        "annotations",
        "shim_options",
        "egress",
    ] {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| {target} |")))
            .unwrap_or_else(|| panic!("no row for {target}: {table}"));
        let execs: u64 = row.split('|').nth(2).unwrap().trim().parse().unwrap();
        assert!(execs > 100, "{target}: only {execs} executions");
    }
}
