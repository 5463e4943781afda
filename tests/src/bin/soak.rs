//! `cargo xtask soak`: many sessions on one `supervise serve` daemon for
//! minutes (tests/src/soak.rs says what it drives and checks); prints the
//! table and writes it, with the commit measured, to the file given.
//! Needs root. Exit 1 when an invariant broke.
//!
//! usage: soak [--sessions N] [--threads T] [--minutes M] [--pool-size P]
//!             [--out FILE]

use std::path::PathBuf;
use std::time::Duration;

use turnstile_tests::soak::{self, Config};
use turnstile_tests::supervise_bin;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut cfg = Config {
        sessions: 1000,
        threads: 8,
        duration: Duration::from_secs(600),
        pool_size: 64,
        sample_every: Duration::from_secs(10),
        scratch_parent: PathBuf::from("/var/tmp"),
        supervise: supervise_bin(),
        verbose: true,
    };
    let mut out: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> String {
            it.next().cloned().unwrap_or_else(|| {
                eprintln!("soak: {name} needs a value");
                std::process::exit(2)
            })
        };
        let number = |name: &str, v: String| -> f64 {
            v.parse::<f64>()
                .ok()
                .filter(|x| *x > 0.0)
                .unwrap_or_else(|| {
                    eprintln!("soak: {name} must be a positive number, not {v:?}");
                    std::process::exit(2)
                })
        };
        match a.as_str() {
            "--sessions" => cfg.sessions = number(a, value(a)) as usize,
            "--threads" => cfg.threads = number(a, value(a)) as usize,
            "--minutes" => cfg.duration = Duration::from_secs_f64(60.0 * number(a, value(a))),
            "--pool-size" => {
                cfg.pool_size = value(a).parse().unwrap_or_else(|_| {
                    eprintln!("soak: --pool-size must be a whole number");
                    std::process::exit(2)
                })
            }
            "--out" => out = Some(PathBuf::from(value(a))),
            other => {
                eprintln!(
                    "soak: unknown argument {other:?}\nusage: soak [--sessions N] [--threads T] [--minutes M] [--pool-size P] [--out FILE]"
                );
                std::process::exit(2)
            }
        }
    }
    // The commit measured is the tree's when the soak starts.
    let commit = soak::commit_of(&std::env::current_dir().unwrap_or_default());
    let report = soak::run(&cfg);
    let table = report.table();
    print!("{table}");
    if let Some(path) = out {
        let doc = format!(
            "# Soak: {} sessions on one daemon\n\n\
             Produced by `cargo xtask soak --sessions {} --threads {} --minutes {}` \
             (release build, as root, under `nice -n 10`) at commit `{}`, on {} \
             (kernel {}). Each client thread visits its sessions in turn, two turns per visit \
             through `supervise run --server --json`: even sessions run both with one package \
             (the second can take the warm sandbox), odd ones switch package for the second \
             (another shape: the warm sandbox is discarded). Commands rotate: `/bin/true`, a \
             declared output, `/bin/false` (exit 10), an undeclared write (exit 12). The \
             daemon is sampled every {} s; then stopped (SIGTERM); then every session's \
             ledgers are verified and what is left behind is looked for. \
             tests/src/soak.rs has the bounds.\n\n{table}",
            cfg.sessions,
            cfg.sessions,
            cfg.threads,
            cfg.duration.as_secs_f64() / 60.0,
            commit,
            host(),
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim(),
            cfg.sample_every.as_secs(),
        );
        if let Err(e) = std::fs::write(&path, doc) {
            eprintln!("soak: {}: {e}", path.display());
            std::process::exit(1);
        }
    }
    let failures = report.failures();
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("soak: FAIL: {f}");
        }
        if !report.turn_error_examples.is_empty() {
            eprintln!("soak: turns not as expected:");
            for e in &report.turn_error_examples {
                eprintln!("  {e}");
            }
        }
        std::process::exit(1);
    }
}

/// "N cores, M GiB" of this machine.
fn host() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    format!("{cores} cores, {} GiB", mem / (1024 * 1024))
}
