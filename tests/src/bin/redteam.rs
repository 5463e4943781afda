//! `cargo xtask redteam`: runs every red-team probe through the real
//! `supervise run`, prints the table, exits non-zero on any escape or
//! unexpected outcome. Needs root.
//!
//! Two variables narrow a run (the VM stage of `cargo xtask test` uses
//! both): `TURNSTILE_REDTEAM_SHARD=K/N` runs every N-th probe from the K-th
//! (1-based), so N processes share the suite; `TURNSTILE_REDTEAM_SKIP_FAMILIES`
//! (comma-separated) leaves out families that test the supervisor's own
//! logic, not the kernel. Both are printed with the table, so a narrowed run
//! never reads as the whole suite.

use turnstile_tests::redteam::{Suite, Verdict, probes, table};

fn main() {
    if !turnstile_tests::require_root("redteam") {
        std::process::exit(2);
    }
    let filter = std::env::args().nth(1);
    let (shard, shards) = match shard() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("redteam: TURNSTILE_REDTEAM_SHARD: {why}");
            std::process::exit(2);
        }
    };
    let skipped: Vec<String> = std::env::var("TURNSTILE_REDTEAM_SKIP_FAMILIES")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    let families: std::collections::BTreeSet<&str> = probes().iter().map(|p| p.family).collect();
    if let Some(f) = skipped.iter().find(|f| !families.contains(f.as_str())) {
        eprintln!(
            "redteam: TURNSTILE_REDTEAM_SKIP_FAMILIES: no probe family `{f}` (families: {families:?})"
        );
        std::process::exit(2);
    }
    // TURNSTILE_REDTEAM_RETRY=1 (the VM stage: a TCG guest niced under the
    // host's own suites, where a turn can stall past its timeout): a probe
    // whose outcome was unexpected runs once more, and the second outcome
    // counts; both are printed. An escape is never retried, and no more
    // than MAX_RETRIES probes are (a kernel that upsets every probe fails
    // in the time of one run, not two).
    const MAX_RETRIES: usize = 3;
    let retry = std::env::var_os("TURNSTILE_REDTEAM_RETRY").is_some_and(|v| v == "1");
    let mut retried = Vec::new();
    let suite = Suite::new();
    let outcomes: Vec<_> = probes()
        .iter()
        .filter(|p| {
            filter
                .as_deref()
                .is_none_or(|f| p.name.contains(f) || p.family == f)
        })
        .filter(|p| !skipped.iter().any(|f| f == p.family))
        .enumerate()
        .filter(|(i, _)| i % shards == shard)
        .map(|(_, p)| {
            let first = suite.run(p);
            match &first.verdict {
                Verdict::Unexpected(why) if retry && retried.len() < MAX_RETRIES => {
                    let second = suite.run(p);
                    retried.push(format!(
                        "retried: {}: first {} ({why}); then {}",
                        p.name,
                        first.observed,
                        match &second.verdict {
                            Verdict::Held => "held".to_owned(),
                            v @ (Verdict::Unexpected(w) | Verdict::Escape(w)) =>
                                format!("{} ({w})", v.label()),
                        }
                    ));
                    second
                }
                _ => first,
            }
        })
        .collect();
    println!("backend: {}", turnstile_tests::redteam::backend());
    if shards > 1 {
        println!(
            "shard {} of {shards}: every {shards}-th probe from probe {}",
            shard + 1,
            shard + 1
        );
    }
    if !skipped.is_empty() {
        println!("families left out: {}", skipped.join(", "));
    }
    print!("{}", table(&outcomes));
    for r in &retried {
        println!("  {r}");
    }
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
    // process::exit runs no destructor: the suite's workspaces, state
    // directories and canaries are removed here, not left in /tmp.
    drop(suite);
    std::process::exit(if failed { 1 } else { 0 });
}

/// `TURNSTILE_REDTEAM_SHARD=K/N` as (K-1, N); (0, 1) when unset.
fn shard() -> Result<(usize, usize), String> {
    let Ok(v) = std::env::var("TURNSTILE_REDTEAM_SHARD") else {
        return Ok((0, 1));
    };
    let (k, n) = v
        .split_once('/')
        .ok_or_else(|| format!("`{v}` is not K/N"))?;
    let (k, n): (usize, usize) = (
        k.parse().map_err(|_| format!("`{k}` is not a number"))?,
        n.parse().map_err(|_| format!("`{n}` is not a number"))?,
    );
    if n == 0 || k == 0 || k > n {
        return Err(format!("`{v}`: need 1 <= K <= N"));
    }
    Ok((k - 1, n))
}
