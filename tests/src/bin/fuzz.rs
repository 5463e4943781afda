//! `fuzz [--minutes M | --seconds N] [--seed S] [TARGET…]`: feeds mutated
//! inputs to the parsers hostile input reaches, each for M minutes or N
//! seconds (default 10 seconds), and
//! fails on a panic, a hang or an unbounded allocation.
//!
//! Mutation-based (stable Rust, no instrumentation, so not
//! coverage-guided): each input is a seed from `tests/fuzz-corpus/<TARGET>/`
//! (the ledger's seed is a real session's ledger, made at start) with 1-8
//! mutations — bit flips, JSON/YAML-significant bytes, inserted tokens
//! (huge numbers, deep nesting, `../`, NUL escapes, long strings), deleted,
//! duplicated and spliced ranges. A run is reproducible from `--seed`.
//!
//! Checks: a panic is caught, its input written to
//! `target/fuzz/crashes/<target>-<n>` and counted; an input that takes more
//! than `SLOW` of the thread's CPU time is counted as slow (written to
//! `target/fuzz/slow-<target>-<n>`; `fuzz --replay TARGET FILE…` re-times
//! kept inputs); one that takes more than `HANG` aborts
//! the process after writing it to `target/fuzz/hang-<target>`; the address
//! space is capped (RLIMIT_AS, `MEMORY_CAP`), so an unbounded allocation
//! aborts the run instead of passing. Prints, per target, executions, how
//! many inputs parsed, CPU seconds and the slowest input; exit 1 on any
//! finding.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use turnstile_policy::envelope::EventEnvelope;
use turnstile_policy::request::TurnRequest;
use turnstile_policy::{Manifest, PackageId, SessionId};
use turnstile_supervisor::store::ledger::{LedgerFiles, LedgerKind};

/// CPU time (the fuzzing thread's own, so a loaded host or `nice` does
/// not make an input "slow") past which an input is a finding.
const SLOW: Duration = Duration::from_millis(250);
const HANG: Duration = Duration::from_secs(10);
/// Address-space cap for the whole process: generous for a parser fed at
/// most `MAX_INPUT` bytes, small enough that a size read from the input and
/// trusted would hit it.
const MEMORY_CAP: u64 = 2 << 30;
const MAX_INPUT: usize = 256 * 1024;

const TARGETS: &[&str] = &[
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
];

/// Tokens that parsers of JSON and YAML treat specially.
const TOKENS: &[&str] = &[
    "null",
    "true",
    "false",
    "-1",
    "0",
    "1e999",
    "-0.0",
    "18446744073709551616",
    "9223372036854775807",
    "\"\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "{}",
    "[]",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
    "{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":",
    "\"**\"",
    "\"../../etc/shadow\"",
    "\"/\"",
    "\"<session_id>\"",
    "\"output/<session_id>/**\"",
    "\"1024Gi\"",
    "\"999999999999Mi\"",
    "\"capabilities\"",
    "\"op\":\"run\"",
    "\"protocol\":",
    "&anchor ",
    "*anchor",
    "!!binary ",
    "{{msg_run_0}}",
    "\n- ",
    ": ",
    "\u{feff}",
    "\u{10ffff}",
];

/// A small deterministic PRNG (xorshift64*): runs replay from their seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    for _ in 0..=rng.below(8) {
        let len = input.len();
        let at = rng.below(len + 1);
        match rng.below(9) {
            0 if len > 0 => input[at.min(len - 1)] ^= 1 << rng.below(8),
            1 if len > 0 => {
                input[at.min(len - 1)] = *b"\"{}[],:\\\n\0 -0123456789eE.#&*!|>'"
                    .get(rng.below(35))
                    .unwrap_or(&b'"')
            }
            2 => {
                let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                input.splice(at..at, t.iter().copied());
            }
            3 if len > 0 => {
                let end = (at + 1 + rng.below(16)).min(len);
                input.drain(at.min(len - 1)..end);
            }
            4 if len > 0 => {
                let from = rng.below(len);
                let end = (from + 1 + rng.below(64)).min(len);
                let piece = input[from..end].to_vec();
                input.splice(at..at, piece);
            }
            5 => {
                let other = &corpus[rng.below(corpus.len())];
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let end = (from + 1 + rng.below(128)).min(other.len());
                    input.splice(at..at, other[from..end].iter().copied());
                }
            }
            6 => {
                // A long run of one byte: lengths and repetition limits.
                let b = *b"a*\"[{/9 \n".get(rng.below(9)).unwrap_or(&b'a');
                let n = 1 << rng.below(16);
                input.splice(at..at, std::iter::repeat_n(b, n));
            }
            7 if len > 0 => input.truncate(at),
            _ => {
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(at..at, bytes);
            }
        }
        input.truncate(MAX_INPUT);
    }
}

/// The input being run: target, bytes, since when (None between targets).
type InFlight = (String, Vec<u8>, Option<Instant>);

/// Runs one input through a target: Ok(true) parsed, Ok(false) refused.
type Parse = Box<dyn FnMut(&[u8]) -> bool>;

fn target(name: &str, scratch: &Path) -> (Parse, Vec<Vec<u8>>) {
    let corpus_dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz-corpus")
        .join(name);
    let mut corpus: Vec<Vec<u8>> = std::fs::read_dir(&corpus_dir)
        .map(|d| {
            let mut files: Vec<PathBuf> = d.flatten().map(|e| e.path()).collect();
            files.sort();
            files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
        })
        .unwrap_or_default();
    let pkg = PackageId::parse("fuzz").unwrap_or_else(|e| panic!("{e}"));
    let parse: Parse = match name {
        "manifest" => Box::new(move |b| {
            Manifest::from_slice(b, &pkg, PathBuf::from("fuzz/manifest.json")).is_ok()
        }),
        "request" => Box::new(|b| TurnRequest::from_json(b).is_ok()),
        "envelope" => Box::new(|b| EventEnvelope::from_json(b).is_ok()),
        "wire" => Box::new(|b| turnstile_supervisor::serve::wire::Request::parse(b).is_ok()),
        "bus_message" => Box::new(|b| turnstile_supervisor::serve::bus::parse_message(b).is_ok()),
        "bus_rules" => {
            let file = scratch.join("rules.v0.1.yaml");
            Box::new(move |b| {
                std::fs::write(&file, b).is_ok()
                    && turnstile_supervisor::serve::bus::load_rules(&file).is_ok()
            })
        }
        "ledger" => {
            let (files, seed) = ledger_session(scratch);
            corpus.push(seed);
            let mut flip = false;
            Box::new(move |b| {
                flip = !flip;
                // Every other input against a missing anchor: then the
                // whole file is parsed, not just compared with the anchor.
                let f = if flip {
                    files.clone()
                } else {
                    LedgerFiles {
                        anchor: files.anchor.with_extension("absent"),
                        ..files.clone()
                    }
                };
                std::fs::write(&f.path, b).is_ok() && f.verify().is_ok()
            })
        }
        "config" => {
            Box::new(|b| turnstile_supervisor::backend::select::check_config_bytes(b).is_ok())
        }
        "checkpoint" => Box::new(|b| {
            turnstile_supervisor::store::transparency::read_unverified(
                Path::new("fuzz/checkpoint.note"),
                b,
            )
            .is_ok()
        }),
        // What a pod author chooses: the container's OCI spec (its
        // annotations, process, mounts) as the shim reads it at Create —
        // the CRI sandbox check, the unknown-key refusal, the namespace the
        // workspace is checked against, then the request it makes.
        "annotations" => Box::new(|b| {
            use containerd_shim_turnstile_v2::{contract, sandbox, workspaces};
            let Ok(spec) = serde_json::from_slice::<contract::Spec>(b) else {
                return false;
            };
            sandbox::is_cri_sandbox(&spec.annotations, "fuzz", "k8s.io").is_ok()
                & workspaces::namespace_of("k8s.io", &spec.annotations).is_ok()
                & contract::request_from_spec(&spec).is_ok()
        }),
        // The shim's options: the JSON document (workspaces and all) and
        // containerd's protobuf runtime options that name it.
        "shim_options" => Box::new(|b| {
            use containerd_shim_turnstile_v2::contract;
            let named = contract::config_path_from_options(b).is_some();
            let parsed = std::str::from_utf8(b)
                .is_ok_and(|t| contract::Options::parse(t, Path::new("fuzz/shim.json")).is_ok());
            named | parsed
        }),
        // What a sandboxed turn sends the supervisor's resolver and proxy:
        // DNS queries, TLS ClientHellos, HTTP/1 and h2c streams on port 80.
        "egress" => Box::new(turnstile_supervisor::sandbox::egress::fuzz_one),
        other => panic!("unknown target {other}; targets: {}", TARGETS.join(" ")),
    };
    assert!(!corpus.is_empty(), "no seed corpus for {name}");
    (parse, corpus)
}

/// A real session (`supervise session new`, no root needed): its evidence
/// ledger's files and bytes.
fn ledger_session(scratch: &Path) -> (LedgerFiles, Vec<u8>) {
    let root = scratch.join("root");
    let state = scratch.join("state");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new(turnstile_tests::supervise_bin())
        .args(["session", "new", "--json", "--root"])
        .arg(&root)
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap_or_else(|e| panic!("supervise session new: {e}"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let sid = v["session_id"].as_str().unwrap_or_default().to_owned();
    // Two turns make the seed a chain of several entries (needs root; a
    // session's opening entries alone otherwise).
    let pkg = root.join("installed/f");
    std::fs::create_dir_all(&pkg).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        pkg.join("manifest.json"),
        r#"{"capabilities":{"execute":["/bin/true","/bin/false"]}}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for cmd in ["/bin/true", "/bin/false"] {
        let _ = std::process::Command::new(turnstile_tests::supervise_bin())
            .args([
                "run",
                "--package",
                "f",
                "--no-outputs",
                "--session",
                &sid,
                "--root",
            ])
            .arg(&root)
            .arg("--state-dir")
            .arg(&state)
            .args(["--", cmd])
            .output();
    }
    let kind = LedgerKind::Evidence;
    let path = root
        .join("planes/ho1/sessions")
        .join(&sid)
        .join("ledger")
        .join(kind.file_name());
    let anchor = find(&state, &format!("{}.json", kind.as_str()))
        .unwrap_or_else(|| panic!("no anchor under {}", state.display()));
    let seed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let files = LedgerFiles {
        kind,
        session: SessionId::parse(&sid).unwrap_or_else(|e| panic!("{e}")),
        path,
        anchor,
    };
    (files, seed)
}

/// `--replay TARGET FILE…`: each kept input through the target three
/// times; prints the CPU time of each run. Exit 1 when an input is slow on
/// every run (a real finding, not a scheduling delay), 2 when unreadable.
fn replay(name: &str, files: &[String]) -> i32 {
    let scratch = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (mut parse, _) = target(name, scratch.path());
    let mut rc = 0;
    for f in files {
        let input = match std::fs::read(f) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("fuzz: {f}: {e}");
                return 2;
            }
        };
        let runs: Vec<Duration> = (0..3)
            .map(|_| {
                let t = thread_cpu();
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse(&input)));
                thread_cpu().saturating_sub(t)
            })
            .collect();
        let slow = runs.iter().all(|d| *d > SLOW);
        println!(
            "{f}: {} bytes, CPU ms {:?}{}",
            input.len(),
            runs.iter()
                .map(|d| d.as_secs_f64() * 1000.0)
                .collect::<Vec<_>>(),
            if slow { "  SLOW" } else { "" }
        );
        if slow {
            rc = 1;
        }
    }
    rc
}

/// The CPU time this thread has used, to the nanosecond
/// (`CLOCK_THREAD_CPUTIME_ID`: the scheduler's runtime, brought up to date).
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = find(&p, name) {
                return Some(f);
            }
        } else if p.file_name().is_some_and(|n| n == name) {
            return Some(p);
        }
    }
    None
}

fn cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF)
        .map(|u| {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or(0.0)
}

fn main() {
    let mut seconds = 10.0f64;
    let mut seed = 0x5eed_u64;
    let mut names = Vec::new();
    let mut args = std::env::args().skip(1);
    let usage = |why: String| -> ! {
        eprintln!(
            "fuzz: {why}\nusage: fuzz [--minutes M | --seconds N] [--seed S] [TARGET…] | fuzz --replay TARGET FILE…"
        );
        std::process::exit(2);
    };
    let number = |flag: &str, args: &mut dyn Iterator<Item = String>| -> f64 {
        match args.next().map(|v| (v.parse::<f64>(), v)) {
            Some((Ok(n), _)) if n.is_finite() && n > 0.0 => n,
            Some((_, v)) => usage(format!("{flag}: `{v}` is not a positive number")),
            None => usage(format!("{flag} needs a value")),
        }
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--replay" => {
                let rest: Vec<String> = args.collect();
                let Some((name, files)) = rest.split_first() else {
                    usage("--replay needs a target and input files".into());
                };
                if !TARGETS.contains(&name.as_str()) {
                    usage(format!("unknown target `{name}`"));
                }
                std::process::exit(replay(name, files));
            }
            "--seconds" => seconds = number("--seconds", &mut args),
            "--minutes" => seconds = number("--minutes", &mut args) * 60.0,
            // A seed is a whole u64 (through f64 it would lose bits past 2^53).
            "--seed" => match args.next().map(|v| (v.parse::<u64>(), v)) {
                Some((Ok(n), _)) => seed = n,
                Some((_, v)) => usage(format!("--seed: `{v}` is not a whole number")),
                None => usage("--seed needs a value".into()),
            },
            t if TARGETS.contains(&t) => names.push(a),
            other => usage(format!(
                "unknown argument or target `{other}` (targets: {})",
                TARGETS.join(", ")
            )),
        }
    }
    if names.is_empty() {
        names = TARGETS.iter().map(|s| (*s).to_owned()).collect();
    }
    let _ = nix::sys::resource::setrlimit(
        nix::sys::resource::Resource::RLIMIT_AS,
        MEMORY_CAP,
        MEMORY_CAP,
    );
    let out_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz");
    let crashes = out_dir.join("crashes");
    std::fs::create_dir_all(&crashes).unwrap_or_else(|e| panic!("{e}"));
    // Panics are findings, reported below; keep their messages short.
    std::panic::set_hook(Box::new(|info| eprintln!("fuzz: panic: {info}")));

    // The watchdog: an input running longer than HANG is written out and
    // the process aborts (a parser stuck in a loop cannot be interrupted).
    let current: Arc<Mutex<InFlight>> = Arc::new(Mutex::new((String::new(), Vec::new(), None)));
    {
        let current = Arc::clone(&current);
        let out_dir = out_dir.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(500));
                if let Ok(c) = current.lock() {
                    if c.2.is_some_and(|t| t.elapsed() > HANG) {
                        let file = out_dir.join(format!("hang-{}", c.0));
                        let _ = std::fs::write(&file, &c.1);
                        eprintln!("fuzz: HANG in {} (input: {})", c.0, file.display());
                        std::process::exit(1);
                    }
                }
            }
        });
    }

    let mut findings = 0usize;
    println!("| target | executions | parsed | CPU s | slowest ms | panics | slow |");
    println!("|---|---|---|---|---|---|---|");
    for (i, name) in names.iter().enumerate() {
        // Targets that go through files write them to memory when they can.
        let shm = Path::new("/dev/shm");
        let scratch = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .unwrap_or_else(|e| panic!("{e}"));
        let (mut parse, corpus) = target(name, scratch.path());
        let mut rng = Rng(seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let (mut execs, mut parsed, mut panics, mut slow) = (0u64, 0u64, 0u64, 0u64);
        let mut slowest = Duration::ZERO;
        let cpu0 = cpu_seconds();
        let start = Instant::now();
        let deadline = Duration::from_secs_f64(seconds);
        while start.elapsed() < deadline {
            // Seeds as they are first, then mutations.
            let mut input = corpus[(execs as usize) % corpus.len()].clone();
            if execs as usize >= corpus.len() {
                mutate(&mut rng, &mut input, &corpus);
            }
            if let Ok(mut c) = current.lock() {
                *c = (name.clone(), input.clone(), Some(Instant::now()));
            }
            let t = thread_cpu();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse(&input)));
            let took = thread_cpu().saturating_sub(t);
            execs += 1;
            slowest = slowest.max(took);
            if took > SLOW {
                slow += 1;
                let _ = std::fs::write(out_dir.join(format!("slow-{name}-{slow}")), &input);
            }
            match r {
                Ok(true) => parsed += 1,
                Ok(false) => {}
                Err(_) => {
                    panics += 1;
                    let file = crashes.join(format!("{name}-{panics}"));
                    let _ = std::fs::write(&file, &input);
                    eprintln!("fuzz: {name}: panic; input in {}", file.display());
                }
            }
        }
        if let Ok(mut c) = current.lock() {
            c.2 = None;
        }
        findings += (panics + slow) as usize;
        println!(
            "| {name} | {execs} | {parsed} | {:.1} | {:.1} | {panics} | {slow} |",
            cpu_seconds() - cpu0,
            slowest.as_secs_f64() * 1000.0
        );
    }
    let rss = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .map(|u| u.max_rss())
        .unwrap_or(0);
    println!(
        "\npeak RSS {} MiB (address space capped at {} MiB); seed {seed}",
        rss / 1024,
        MEMORY_CAP >> 20
    );
    if findings > 0 {
        eprintln!(
            "fuzz: {findings} finding(s); inputs in {}",
            out_dir.display()
        );
        std::process::exit(1);
    }
}
