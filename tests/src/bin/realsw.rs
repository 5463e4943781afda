//! `cargo xtask realsw [MODULE…]`: CPython's regression tests inside a turn
//! vs. outside (uid 65534 both times), module by module — by default every
//! module of `realsw::modules::ALL` — then the table; exit 1 when a test
//! that passes outside does not pass inside and the allowlist does not name
//! it. Needs root. Logs of both sides go to `$TURNSTILE_REALSW_LOGS`
//! (default `target/realsw-logs`). `TURNSTILE_SUPERVISE=PATH` measures
//! another build of `supervise` (an older commit, for a before/after).

use std::path::PathBuf;

use turnstile_tests::realsw::modules::{self, ModuleResult};

fn main() {
    if !turnstile_tests::require_root("realsw") {
        std::process::exit(2);
    }
    let names: Vec<String> = std::env::args().skip(1).collect();
    let selected: Vec<modules::Module> = if names.is_empty() {
        modules::ALL.to_vec()
    } else {
        names.iter().map(|n| modules::by_name(n)).collect()
    };
    let logs = std::env::var_os("TURNSTILE_REALSW_LOGS").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/realsw-logs"),
        PathBuf::from,
    );
    let mut results: Vec<ModuleResult> = Vec::new();
    let mut errors = Vec::new();
    for m in selected {
        eprintln!("realsw: {} …", m.name);
        match modules::run(m, &logs) {
            Ok(r) => {
                eprintln!(
                    "realsw: {}: {} pass outside, {} over-blocked ({:.0} s out, {:.0} s in)",
                    r.module,
                    r.passing_outside,
                    r.overblocked.len(),
                    r.outside_secs,
                    r.inside_secs
                );
                results.push(r);
            }
            Err(e) => {
                eprintln!("realsw: {}: {e}", m.name);
                errors.push(e);
            }
        }
    }
    print!("{}", modules::table(&results));
    for e in &errors {
        println!("error: {e}");
    }
    println!("logs: {}", logs.display());
    let failed = !errors.is_empty() || results.iter().any(|r| !r.ok());
    std::process::exit(i32::from(failed));
}
