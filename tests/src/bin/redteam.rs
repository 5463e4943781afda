//! `cargo xtask redteam`: runs every red-team probe through the real
//! `supervise run`, prints the table, exits non-zero on any escape or
//! unexpected outcome. Needs root.

use turnstile_tests::redteam::{Suite, Verdict, probes, table};

fn main() {
    if !turnstile_tests::require_root("redteam") {
        std::process::exit(2);
    }
    let filter = std::env::args().nth(1);
    let suite = Suite::new();
    let outcomes: Vec<_> = probes()
        .iter()
        .filter(|p| {
            filter
                .as_deref()
                .is_none_or(|f| p.name.contains(f) || p.family == f)
        })
        .map(|p| suite.run(p))
        .collect();
    println!("backend: {}", turnstile_tests::redteam::backend());
    print!("{}", table(&outcomes));
    let backend = turnstile_tests::redteam::backend();
    for (b, probe, _, why) in turnstile_tests::redteam::DIFFERENCES {
        if turnstile_tests::redteam::applies(b, &backend) {
            println!("  differs on {b}: {probe}: {why}");
        }
    }
    for ((major, minor), probe, _, why) in turnstile_tests::redteam::kernel_differences() {
        println!("  differs on kernels before {major}.{minor}: {probe}: {why}");
    }
    let failed = outcomes.iter().any(|o| o.verdict != Verdict::Held);
    std::process::exit(if failed { 1 } else { 0 });
}
