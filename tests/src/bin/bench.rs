//! `cargo xtask bench`: where turnstile stands against bare exec, unshare,
//! bwrap, crun, runc and runsc, plus the cost curves of capture, commit and
//! the ledgers. Writes bench/RESULTS.md and bench/latency.svg. Needs root.
//!
//! Whole-process wall times are measured interleaved (one run of each
//! system per round) so machine drift hits every system alike.

// The rounds' order, shared with the xtask benchmarks (one file, two
// crates that do not depend on each other).
#[path = "../../../xtask/src/order.rs"]
mod order;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone)]
struct Stats {
    n: usize,
    median: f64,
    p95: f64,
    min: f64,
    max: f64,
}

fn stats(samples: &[f64]) -> Stats {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    Stats {
        n: s.len(),
        median: at(0.5),
        p95: at(0.95),
        min: s[0],
        max: s[s.len() - 1],
    }
}

/// One system under test: how to build its command for round `i`.
struct System {
    name: &'static str,
    make: Box<dyn Fn(usize) -> Command>,
    missing: Option<String>,
}

fn which(name: &str) -> Option<PathBuf> {
    ["/usr/local/bin", "/usr/bin", "/usr/sbin", "/bin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// A peer's or a bare runtime's stdio: never the host's `/dev/null`. runsc
/// and crun `fchown` their stdio to the container's user, so a bare `runsc
/// run` with `Stdio::null()` gave the host's `/dev/null` to 65534 (issue
/// 22's cause, here in the harness: it happened during a bench run). An
/// empty regular file stands in for stdin and a scratch file takes the
/// output, both the bench's own.
fn quiet(mut c: Command) -> Command {
    let dir = stdio_dir();
    let files = std::fs::create_dir_all(&dir).and_then(|()| {
        let input = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(dir.join("empty"))?;
        input.set_len(0)?;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("output"))?;
        Ok((input, out.try_clone()?, out))
    });
    match files {
        Ok((input, out, err)) => {
            c.stdin(input).stdout(out).stderr(err);
        }
        Err(e) => panic!("bench: stdio files under {}: {e}", dir.display()),
    }
    c
}

/// Where [`quiet`] keeps its files: this process's, removed when the bench
/// ends ([`StdioDir`]).
fn stdio_dir() -> PathBuf {
    std::env::temp_dir().join(format!("turnstile-bench-stdio-{}", std::process::id()))
}

/// Removes [`stdio_dir`] when dropped (the bench's end, or a panic).
struct StdioDir;

impl Drop for StdioDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(stdio_dir());
    }
}

fn run_ok(c: &mut Command) -> bool {
    c.status().map(|s| s.success()).unwrap_or(false)
}

/// A busybox bundle for the OCI runtimes (offline, from busybox-static).
fn busybox_bundle(dir: &Path) -> Result<PathBuf, String> {
    let busybox = which("busybox").ok_or("busybox-static is not installed")?;
    let bundle = dir.join("bundle");
    let bin = bundle.join("rootfs/bin");
    std::fs::create_dir_all(&bin).map_err(|e| e.to_string())?;
    std::fs::copy(&busybox, bin.join("busybox")).map_err(|e| e.to_string())?;
    for l in ["true", "sh"] {
        let _ = std::os::unix::fs::symlink("busybox", bin.join(l));
    }
    let runc = which("runc").ok_or("runc is not installed (needed for `runc spec`)")?;
    if !run_ok(Command::new(runc).arg("spec").current_dir(&bundle)) {
        return Err("runc spec failed".into());
    }
    let path = bundle.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    cfg["process"]["args"] = json!(["/bin/true"]);
    cfg["process"]["terminal"] = json!(false);
    std::fs::write(&path, serde_json::to_vec(&cfg).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    Ok(bundle)
}

struct Env {
    dir: PathBuf,
    supervise: PathBuf,
    ws: PathBuf,
    state: PathBuf,
}

impl Env {
    fn supervise(&self) -> Command {
        let mut c = Command::new(&self.supervise);
        c.env_remove("TURNSTILE_LOG");
        c
    }

    fn new_session(&self) -> String {
        let out = self
            .supervise()
            .args(["session", "new", "--root"])
            .arg(&self.ws)
            .arg("--state-dir")
            .arg(&self.state)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn run_args(&self, sid: &str) -> Vec<String> {
        vec![
            "run".into(),
            "--root".into(),
            self.ws.display().to_string(),
            "--state-dir".into(),
            self.state.display().to_string(),
            "--package".into(),
            "bench".into(),
            "--session".into(),
            sid.into(),
        ]
    }
}

fn systems(env: &Env, sid: &str) -> Vec<System> {
    let mut v: Vec<System> = Vec::new();
    v.push(System {
        name: "bare",
        make: Box::new(|_| quiet(Command::new("/bin/true"))),
        missing: None,
    });
    let unshare_missing = which("unshare")
        .is_none()
        .then(|| "util-linux unshare not found".to_owned());
    v.push(System {
        name: "unshare -mpf",
        make: Box::new(|_| {
            let mut c = quiet(Command::new("unshare"));
            c.args(["-mpf", "--mount-proc", "/bin/true"]);
            c
        }),
        missing: unshare_missing,
    });
    v.push(System {
        name: "bwrap",
        make: Box::new(|_| {
            let mut c = quiet(Command::new("bwrap"));
            c.args(["--unshare-all", "--ro-bind", "/", "/", "/bin/true"]);
            c
        }),
        missing: which("bwrap")
            .is_none()
            .then(|| "bubblewrap is not installed".into()),
    });
    let bundle = busybox_bundle(&env.dir);
    for (name, bin) in [("crun", "crun"), ("runc", "runc"), ("runsc", "runsc")] {
        let missing = match (&bundle, which(bin)) {
            (Err(e), _) => Some(e.clone()),
            (_, None) => Some(format!("{bin} is not installed")),
            _ => None,
        };
        let b = bundle.clone().unwrap_or_default();
        let root = env.dir.join(format!("{bin}-root"));
        v.push(System {
            name,
            make: Box::new(move |i| {
                let mut c = quiet(Command::new(bin));
                c.arg("--root").arg(&root);
                if bin == "runsc" {
                    c.args(["--platform=ptrace", "--network=none", "run", "-bundle"])
                        .arg(&b)
                        .arg(format!("b{i}"));
                } else {
                    c.args(["run", "-b"]).arg(&b).arg(format!("b{i}"));
                }
                c
            }),
            missing,
        });
    }
    let args = env.run_args(sid);
    let sup = env.supervise.clone();
    v.push(System {
        name: "turnstile",
        make: Box::new(move |_| {
            let mut c = quiet(Command::new(&sup));
            c.args(&args)
                .args(["--json", "--no-outputs", "--", "/bin/true"])
                .stdout(Stdio::piped());
            c
        }),
        missing: None,
    });
    // Issue 26: the same turn under `network: restricted` (its resolver,
    // proxy and nftables set up and torn down; no traffic). Piped: its
    // phases go to the network section, not the isolated turn's table.
    // Its upstream resolver is a closed port on the host's loopback: the
    // turn sends nothing, and if it ever did, nothing would leave the host.
    let mut net_args = env.run_args(&env.new_session());
    if let Some(p) = net_args.iter_mut().find(|a| *a == "bench") {
        *p = "bench-net".into();
    }
    let sup = env.supervise.clone();
    v.push(System {
        name: "turnstile restricted",
        make: Box::new(move |_| {
            let mut c = quiet(Command::new(&sup));
            c.args(&net_args)
                .args(["--json", "--no-outputs", "--", "/bin/true"])
                .env("TURNSTILE_DNS_UPSTREAM", NOWHERE)
                .stdout(Stdio::piped());
            c
        }),
        missing: which("nft")
            .is_none()
            .then(|| "nftables (`nft`) is not installed".into()),
    });
    v
}

/// Wall time of one run; the run's stdout when it was piped (turnstile's
/// `--json`, which carries its own phase timings).
fn time_once(mut c: Command) -> Option<(f64, Vec<u8>)> {
    let t = Instant::now();
    let out = c.output().ok()?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    out.status.success().then_some((ms, out.stdout))
}

fn main() {
    if !turnstile_tests::require_root("bench") {
        std::process::exit(2);
    }
    let rounds: usize = match std::env::var("BENCH_ROUNDS") {
        Err(_) => 100,
        Ok(s) => match s.parse() {
            Ok(n) if n >= 1 => n,
            _ => {
                eprintln!("bench: BENCH_ROUNDS={s:?}: a number of rounds, at least 1");
                std::process::exit(2);
            }
        },
    };
    // `BENCH_ONLY=network` (`cargo xtask bench network`): only the
    // isolated and restricted turns and the GETs; the network section of
    // RESULTS.md is replaced, the rest of the file kept.
    let network_only = match std::env::var("BENCH_ONLY").as_deref() {
        Err(_) | Ok("") => false,
        Ok("network") => true,
        Ok(other) => {
            eprintln!("bench: BENCH_ONLY={other:?}: the only section that runs alone is `network`");
            std::process::exit(2);
        }
    };
    let out_dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "bench".into()));
    let _stdio = StdioDir;
    let tmp = tempfile::Builder::new()
        .prefix("ts-bench-")
        .tempdir()
        .unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let env = Env {
        supervise: turnstile_tests::supervise_bin(),
        ws: dir.join("ws"),
        state: dir.join("state"),
        dir: dir.clone(),
    };
    // `bench-net` and `bench-get` are `bench` with a network policy and
    // nothing else changed, so a difference is the policy's cost.
    for (pkg, network) in [
        ("bench", ""),
        (
            "bench-net",
            r#","network":"restricted","egress":["bench.test:443"]"#,
        ),
        (
            "bench-get",
            r#","network":"restricted","egress":["good.test:8080"]"#,
        ),
    ] {
        std::fs::create_dir_all(env.ws.join("installed").join(pkg)).unwrap();
        std::fs::write(
            env.ws.join("installed").join(pkg).join("manifest.json"),
            format!(
                r#"{{"capabilities":{{"execute":["/bin/true","/usr/bin/python3"]}},
            "limits":{{"memory":"3Gi","disk":"2Gi","files":20000,"timeout_seconds":300}}{network}}}"#
            ),
        )
        .unwrap();
    }
    let sid = env.new_session();
    let mut report = String::new();
    let mut rows: Vec<(String, Option<Stats>, Option<String>)> = Vec::new();

    // Peak RSS of the supervisor: before any other child has run.
    for _ in 0..if network_only { 0 } else { 20 } {
        let mut c = env.supervise();
        c.args(env.run_args(&sid))
            .args(["--no-outputs", "--", "/bin/true"]);
        let _ = quiet(c).status();
    }
    let peak_rss_kib = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|u| u.max_rss())
        .unwrap_or(0);

    // 1. Interleaved whole-process wall time of /bin/true.
    eprintln!("bench: {rounds} interleaved rounds of /bin/true");
    let mut systems = systems(&env, &sid);
    if network_only {
        systems.retain(|s| s.name == "turnstile" || s.name == "turnstile restricted");
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    let mut failures: Vec<usize> = vec![0; systems.len()];
    let mut phases: Phases = Phases::new();
    let mut net_phases: Phases = Phases::new();
    for round in 0..(rounds + 5) {
        // A new order every round: a system's asynchronous teardown
        // (runsc's, above all) must not always land on the same neighbour
        // (a rotation put turnstile right after runsc in every round).
        for i in order::round_order(round, systems.len()) {
            let s = &systems[i];
            if s.missing.is_some() {
                continue;
            }
            match time_once((s.make)(round)) {
                Some((ms, stdout)) if round >= 5 => {
                    samples[i].push(ms);
                    match s.name {
                        "turnstile" => add_phases(&mut phases, &stdout),
                        "turnstile restricted" => add_phases(&mut net_phases, &stdout),
                        _ => {}
                    }
                }
                Some(_) => {}
                None => failures[i] += 1,
            }
        }
    }
    for (i, s) in systems.iter().enumerate() {
        let missing = s.missing.clone().or_else(|| {
            (samples[i].is_empty()).then(|| format!("every run failed ({} failures)", failures[i]))
        });
        rows.push((
            s.name.to_owned(),
            (!samples[i].is_empty()).then(|| stats(&samples[i])),
            missing,
        ));
    }
    let median = |name: &str| {
        rows.iter()
            .find(|r| r.0 == name)
            .and_then(|r| r.1.as_ref().map(|s| s.median))
    };
    let (bare, ts) = (
        median("bare").unwrap_or(f64::NAN),
        median("turnstile").unwrap_or(f64::NAN),
    );
    writeln!(
        report,
        "## Whole-process wall time of `/bin/true` ({rounds} interleaved rounds, order drawn anew each round, 5 warm-up)\n"
    )
    .unwrap();
    writeln!(report, "| system | median ms | p95 ms | min–max ms | × bare | × turnstile |\n|---|---:|---:|---|---:|---:|").unwrap();
    for (name, st, missing) in &rows {
        match (st, missing) {
            (Some(s), _) => writeln!(
                report,
                "| {name} | {:.2} | {:.2} | {:.2}–{:.2} | {:.1} | {:.2} |",
                s.median,
                s.p95,
                s.min,
                s.max,
                s.median / bare,
                s.median / ts
            )
            .unwrap(),
            (None, Some(why)) => writeln!(report, "| {name} | missing: {why} | | | | |").unwrap(),
            (None, None) => {}
        }
    }

    // Where turnstile's time went, from its own evidence, same rounds.
    if !phases.is_empty() {
        writeln!(report, "\n### Where a turnstile turn's time goes (medians over the same rounds, from each turn's own `--json` durations)\n\n| phase | median ms |\n|---|---:|").unwrap();
        let mut order: Vec<(String, f64)> = phases
            .iter()
            .map(|(k, v)| (k.clone(), stats(v).median))
            .collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1));
        let accounted: f64 = order
            .iter()
            .filter(|(k, _)| !k.starts_with('('))
            .map(|(_, m)| m)
            .sum();
        for (k, m) in &order {
            writeln!(report, "| {k} | {m:.3} |").unwrap();
        }
        let wall = median("turnstile").unwrap_or(f64::NAN);
        let ledger = phases
            .get("(ledger_entries_ms)")
            .map(|v| stats(v).median)
            .unwrap_or(0.0);
        writeln!(
            report,
            "| (the rest: process start-up, session open, manifest, check, exit) | {:.3} |",
            wall - accounted - ledger
        )
        .unwrap();
    }

    // 1a. What a network policy costs (issue 26 item 6): the restricted
    // turn of the same rounds, and a 1 MiB GET in and out of a turn.
    let net = network_cost(&env, rounds, network_only, &rows, &phases, &net_phases);
    if network_only {
        splice_network(&out_dir, &net.section);
        print!("{}", net.section);
        return;
    }
    report.push('\n');
    report.push_str(&net.section);

    // 1b. Each OCI backend's turn against the bare runtime running the same
    // bundle (issue 10 item 5), interleaved in one run.
    let oci = oci_backends(&env, rounds, &mut report);

    // 2. Cost curves: capture + hash + commit against files and bytes.
    writeln!(report, "\n## Capture, hash and commit\n\n| turn writes | wall ms | capture ms | commit ms | MB/s (capture) |\n|---|---:|---:|---:|---:|").unwrap();
    let mut curve = Vec::new();
    for (label, n, size) in [
        ("1 file", 1usize, 1024usize),
        ("100 files", 100, 1024),
        ("10,000 files", 10_000, 1024),
        ("one 1 GiB file", 1, 1 << 30),
    ] {
        let s = env.new_session();
        let outputs: Vec<Value> = (0..n)
            .map(|i| json!({"path": format!("output/{s}/f{i}"), "role": "data"}))
            .collect();
        let code = format!(
            "import os\nchunk = b'x' * min({size}, 1 << 20)\nfor i in range({n}):\n    with open(f'output/{s}/f{{i}}', 'wb') as f:\n        left = {size}\n        while left > 0:\n            f.write(chunk[:left]); left -= len(chunk[:left])\n"
        );
        let req = dir.join(format!("req-{n}-{size}.json"));
        std::fs::write(
            &req,
            json!({"command": ["/usr/bin/python3", "-c", code], "declared_outputs": outputs})
                .to_string(),
        )
        .unwrap();
        let mut c = env.supervise();
        c.args(env.run_args(&s))
            .arg("--json")
            .arg("--request")
            .arg(&req);
        let out = c.output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let d = &v["durations"];
        let ph = |k: &str| d["phases_ms"][k].as_f64().unwrap_or(f64::NAN);
        let bytes = (n * size) as f64;
        let mbps = bytes / 1e6 / (ph("capture") / 1000.0);
        writeln!(
            report,
            "| {label} ({}) | {:.1} | {:.1} | {:.1} | {:.0} |",
            v["status"].as_str().unwrap_or("?"),
            d["wall_ms"].as_f64().unwrap_or(f64::NAN),
            ph("capture"),
            ph("commit"),
            mbps
        )
        .unwrap();
        curve.push((label, mbps));
    }
    let buf = vec![0u8; 256 << 20];
    let t = Instant::now();
    let _ = Sha256::digest(&buf);
    let sha_mbps = buf.len() as f64 / 1e6 / t.elapsed().as_secs_f64();
    let gib = curve.last().map(|c| c.1).unwrap_or(f64::NAN);
    writeln!(report, "\nsha256 on this machine (one core, 256 MiB in memory): {sha_mbps:.0} MB/s; capture of the 1 GiB file: {gib:.0} MB/s = {:.2}× (target ≥ 0.8×).", gib / sha_mbps).unwrap();

    // 3. Ledgers: append latency (fsync'd) and verify throughput.
    let (append, verify_mbps, ledger_mb) = ledger_numbers(&env);
    writeln!(report, "\n## Ledgers\n\n- append (entry + anchor, fsync'd), {} appends: median {:.3} ms, p95 {:.3} ms", append.n, append.median, append.p95).unwrap();
    writeln!(report, "- `ledger verify` over a {ledger_mb:.1} MB ledger: {verify_mbps:.0} MB/s (target ≥ 200 MB/s)").unwrap();

    // 4. Eight concurrent sessions.
    let tps = concurrent(&env, 8, Duration::from_secs(5));
    writeln!(report, "\n## Concurrency\n\n- 8 concurrent sessions, `/bin/true` turns back to back for 5 s: {tps:.0} turns/s (target ≥ 300)").unwrap();
    writeln!(
        report,
        "- supervisor peak RSS (max over 20 turns): {} KiB",
        peak_rss_kib
    )
    .unwrap();

    // Targets.
    let bwrap = median("bwrap");
    let crun = median("crun");
    writeln!(
        report,
        "\n## Targets\n\n| target | measured | met |\n|---|---|---|"
    )
    .unwrap();
    let ratio = |x: Option<f64>| x.map(|b| ts / b);
    for (what, value, ok) in [
        (
            "turnstile ≤ 0.75× bwrap",
            ratio(bwrap).map(|r| format!("{r:.2}×")),
            ratio(bwrap).map(|r| r <= 0.75),
        ),
        (
            "turnstile ≤ 0.5× crun",
            ratio(crun).map(|r| format!("{r:.2}×")),
            ratio(crun).map(|r| r <= 0.5),
        ),
        (
            "turnstile --backend runc ≤ 1.1× bare runc (same bundle)",
            oci.runc.map(|r| format!("{r:.2}×")),
            oci.runc.map(|r| r <= 1.1),
        ),
        (
            "turnstile --backend crun ≤ 1.1× bare crun (same bundle)",
            oci.crun.map(|r| format!("{r:.2}×")),
            oci.crun.map(|r| r <= 1.1),
        ),
        (
            "capture hashing ≥ 0.8× sha256",
            Some(format!("{:.2}×", gib / sha_mbps)),
            Some(gib / sha_mbps >= 0.8),
        ),
        (
            "ledger verify ≥ 200 MB/s",
            Some(format!("{verify_mbps:.0} MB/s")),
            Some(verify_mbps >= 200.0),
        ),
        (
            "restricted turn's setup ≤ isolated + 2 ms",
            net.setup_ms.map(|d| format!("{d:+.2} ms")),
            net.setup_ms.map(|d| d <= 2.0),
        ),
        (
            "1 MiB GET through a restricted turn ≤ 1.5× outside",
            net.get_ratio.map(|r| format!("{r:.2}×")),
            net.get_ratio.map(|r| r <= 1.5),
        ),
        (
            "8 sessions ≥ 300 turns/s",
            Some(format!("{tps:.0} turns/s")),
            Some(tps >= 300.0),
        ),
    ] {
        writeln!(
            report,
            "| {what} | {} | {} |",
            value.unwrap_or_else(|| "peer missing".into()),
            match ok {
                Some(true) => "yes",
                Some(false) => "no",
                None => "n/a",
            }
        )
        .unwrap();
    }

    std::fs::create_dir_all(&out_dir).unwrap();
    let svg = svg_chart(&rows);
    std::fs::write(out_dir.join("latency.svg"), svg).unwrap();
    let header = format!(
        "# turnstile benchmark results\n\nProduced by `cargo xtask bench` (release build, as root) at commit {} on {} — {} cores, kernel {}, {}.\n\n![latency per system](latency.svg)\n\n",
        commit(),
        date(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel(),
        "cgroups v1 (hybrid); the whole bench runs in a private mount namespace with a tmpfs over /sys/fs/cgroup/unified so crun accepts the layout (MACHINE-NOTES)",
    );
    // `cargo xtask bench-shim` owns its marked section: keep it.
    let shim_section = std::fs::read_to_string(out_dir.join("RESULTS.md"))
        .ok()
        .and_then(|old| {
            let b = old.find("<!-- bench-shim -->")?;
            let e = old.find("<!-- /bench-shim -->")?;
            (e > b).then(|| format!("\n{}\n", &old[b..e + "<!-- /bench-shim -->".len()]))
        })
        .unwrap_or_default();
    std::fs::write(
        out_dir.join("RESULTS.md"),
        format!("{header}{report}{shim_section}"),
    )
    .unwrap();
    print!("{header}{report}");
}

/// turnstile-over-bare ratios of the median wall time, per OCI runtime.
struct OciRatios {
    runc: Option<f64>,
    crun: Option<f64>,
}

/// The bundle `supervise bundle` writes for this turn, made runnable by the
/// bare runtime: everything as turnstile would hand it to the runtime
/// (rootfs skeleton, mounts, namespaces, seccomp, resources, uid) except
/// the process, which is the command itself instead of turnstile's init
/// (that one waits for the supervisor's posture check on fds 3 and 4).
/// The writable scopes stay binds of the bundle's empty `scopes/<i>` dirs,
/// where turnstile mounts overlays.
fn same_bundle(env: &Env, sid: &str, runtime: &str, argv: &[&str]) -> Result<PathBuf, String> {
    let out = env.dir.join(format!("{runtime}-same-bundle"));
    let status = env
        .supervise()
        .args(["bundle", "--root"])
        .arg(&env.ws)
        .arg("--state-dir")
        .arg(&env.state)
        .args([
            "--package",
            "bench",
            "--session",
            sid,
            "--backend",
            runtime,
            "--out",
        ])
        .arg(&out)
        .args(["--no-outputs", "--"])
        .args(argv)
        .stdout(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if !status.status.success() {
        return Err(format!(
            "supervise bundle --backend {runtime}: {}",
            String::from_utf8_lossy(&status.stderr).trim()
        ));
    }
    let path = out.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    cfg["process"]["args"] = json!(argv);
    std::fs::write(&path, serde_json::to_vec(&cfg).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// `/bin/true` as a turn through `supervise run --backend R` and as
/// `R run` of the same bundle, for runc and crun, interleaved (order
/// drawn anew each round); appends the table and the runc turn's phases.
fn oci_backends(env: &Env, rounds: usize, report: &mut String) -> OciRatios {
    eprintln!("bench: {rounds} interleaved rounds, OCI backends vs the bare runtime");
    let sid = env.new_session();
    let mut systems: Vec<System> = Vec::new();
    for runtime in ["runc", "crun"] {
        let installed = which(runtime);
        let bundle = match installed {
            None => Err(format!("{runtime} is not installed")),
            Some(_) => same_bundle(env, &sid, runtime, &["/bin/true"]),
        };
        let missing = bundle.as_ref().err().cloned();
        let b = bundle.unwrap_or_default();
        let root = env.dir.join(format!("{runtime}-bare-root"));
        systems.push(System {
            name: if runtime == "runc" {
                "bare runc, same bundle"
            } else {
                "bare crun, same bundle"
            },
            make: Box::new(move |i| {
                let mut c = quiet(Command::new(runtime));
                c.arg("--root")
                    .arg(&root)
                    .args(["run", "-b"])
                    .arg(&b)
                    .arg(format!("same{i}"));
                c
            }),
            missing: missing.clone(),
        });
        let (args, sup) = (env.run_args(&sid), env.supervise.clone());
        systems.push(System {
            name: if runtime == "runc" {
                "turnstile --backend runc"
            } else {
                "turnstile --backend crun"
            },
            make: Box::new(move |_| {
                let mut c = quiet(Command::new(&sup));
                c.args(&args)
                    .args([
                        "--backend",
                        runtime,
                        "--json",
                        "--no-outputs",
                        "--",
                        "/bin/true",
                    ])
                    .stdout(Stdio::piped());
                c
            }),
            missing,
        });
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    let mut failures = vec![0usize; systems.len()];
    let mut phases: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for round in 0..(rounds + 5) {
        for i in order::round_order(round, systems.len()) {
            let s = &systems[i];
            if s.missing.is_some() {
                continue;
            }
            match time_once((s.make)(round)) {
                Some((ms, stdout)) if round >= 5 => {
                    samples[i].push(ms);
                    if s.name == "turnstile --backend runc" {
                        if let Ok(v) = serde_json::from_slice::<Value>(&stdout) {
                            if let Some(m) = v["durations"]["phases_ms"].as_object() {
                                for (k, x) in m {
                                    phases
                                        .entry(k.clone())
                                        .or_default()
                                        .push(x.as_f64().unwrap_or(0.0));
                                }
                            }
                        }
                    }
                }
                Some(_) => {}
                None => failures[i] += 1,
            }
        }
    }
    writeln!(
        report,
        "\n## OCI backends: a turn against the bare runtime running the same bundle ({rounds} interleaved rounds, order drawn anew each round, 5 warm-up)\n\n\
         The bare run is `R run` of the bundle `supervise bundle --backend R` writes for the same turn (rootfs skeleton, mounts, namespaces, seccomp, resources, uid 65534), \
         with the process replaced by the command itself; the turn adds the idmapped workspace, the scope overlays, turnstile's init (Landlock, posture handshake), capture, verify and the ledger entries.\n\n\
         | system | median ms | p95 ms | min–max ms | failed runs | × bare runtime |\n|---|---:|---:|---|---:|---:|"
    )
    .unwrap();
    let mut medians = Vec::new();
    for (i, s) in systems.iter().enumerate() {
        let st = (!samples[i].is_empty()).then(|| stats(&samples[i]));
        medians.push(st.as_ref().map(|x| x.median));
        let bare = if i % 2 == 1 {
            medians[i - 1]
        } else {
            st.as_ref().map(|x| x.median)
        };
        match (&st, &s.missing) {
            (Some(x), _) => writeln!(
                report,
                "| {} | {:.2} | {:.2} | {:.2}–{:.2} | {} | {:.2} |",
                s.name,
                x.median,
                x.p95,
                x.min,
                x.max,
                failures[i],
                bare.map_or(f64::NAN, |b| x.median / b)
            )
            .unwrap(),
            (None, Some(why)) => {
                writeln!(report, "| {} | missing: {why} | | | | |", s.name).unwrap()
            }
            (None, None) => writeln!(
                report,
                "| {} | every run failed ({} failures) | | | | |",
                s.name, failures[i]
            )
            .unwrap(),
        }
    }
    if !phases.is_empty() {
        writeln!(report, "\n### Where a `--backend runc` turn's time goes (medians over the same rounds, from each turn's own `--json` durations)\n\n| phase | median ms |\n|---|---:|").unwrap();
        let mut order: Vec<(String, f64)> = phases
            .iter()
            .map(|(k, v)| (k.clone(), stats(v).median))
            .collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (k, m) in &order {
            writeln!(report, "| {k} | {m:.3} |").unwrap();
        }
    }
    let ratio = |t: usize| match (medians[t - 1], medians[t]) {
        (Some(b), Some(x)) => Some(x / b),
        _ => None,
    };
    OciRatios {
        runc: ratio(1),
        crun: ratio(3),
    }
}

type Phases = std::collections::BTreeMap<String, Vec<f64>>;

/// A turn's own phase timings from its `--json` stdout, and its wall and
/// ledger times in parentheses.
fn add_phases(into: &mut Phases, stdout: &[u8]) {
    if let Ok(v) = serde_json::from_slice::<Value>(stdout) {
        let d = &v["durations"];
        if let Some(m) = d["phases_ms"].as_object() {
            for (k, x) in m {
                into.entry(k.clone())
                    .or_default()
                    .push(x.as_f64().unwrap_or(0.0));
            }
        }
        for k in ["wall_ms", "ledger_entries_ms"] {
            into.entry(format!("({k})"))
                .or_default()
                .push(d[k].as_f64().unwrap_or(0.0));
        }
    }
}

/// The upstream resolver of the restricted turns that send nothing: a
/// closed port on the host's loopback (a stray query would stay on the
/// host).
const NOWHERE: &str = "127.0.0.1:9";

/// GETs per turn (and per outside process) in the GET comparison.
const GETS_PER_TURN: usize = 20;

/// `n` GETs of 1 MiB from `host`:8080, one after another, each timed by
/// the script itself: `RESOLVE` is getaddrinfo, `GET` is connect, the
/// request and reading the 1 MiB to EOF, `FIRST` the part of `GET` until
/// the first bytes came back (ms, one per GET, in order).
const BENCH_GETS: &str = r#"
import socket, sys, time
host, n = sys.argv[1], int(sys.argv[2])
res, get, first = [], [], []
for _ in range(n):
    t0 = time.perf_counter()
    fam, typ, proto, _, addr = socket.getaddrinfo(host, 8080, type=socket.SOCK_STREAM)[0]
    t1 = time.perf_counter()
    c = socket.socket(fam, typ, proto); c.settimeout(5); c.connect(addr)
    c.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
    k, tf = 0, None
    while True:
        d = c.recv(1 << 16)
        if tf is None: tf = time.perf_counter()
        if not d: break
        k += len(d)
    c.close()
    t2 = time.perf_counter()
    assert k == 1 << 20, k
    res.append((t1 - t0) * 1000); get.append((t2 - t1) * 1000); first.append((tf - t1) * 1000)
print("RESOLVE", *["%.4f" % x for x in res])
print("GET", *["%.4f" % x for x in get])
print("FIRST", *["%.4f" % x for x in first])
"#;

const NET_BEGIN: &str = "<!-- bench-network -->";
const NET_END: &str = "<!-- /bench-network -->";

/// The network section (between [`NET_BEGIN`] and [`NET_END`]) and the
/// two numbers the issue sets targets for.
struct NetCost {
    section: String,
    /// restricted − isolated median wall time of the same turn, ms.
    setup_ms: Option<f64>,
    /// Median resolve + GET inside a restricted turn over the same outside.
    get_ratio: Option<f64>,
}

fn network_cost(
    env: &Env,
    rounds: usize,
    network_only: bool,
    rows: &[(String, Option<Stats>, Option<String>)],
    iso_phases: &Phases,
    net_phases: &Phases,
) -> NetCost {
    let mut r = String::new();
    writeln!(
        r,
        "{NET_BEGIN}\n## Network policy cost (issue 26 item 6)\n\nAt commit {} on {}{}.\n",
        commit(),
        date(),
        if network_only {
            " (`BENCH_ONLY=network`: this section alone)"
        } else {
            ""
        }
    )
    .unwrap();
    // Setup: the two turnstile rows of the interleaved rounds.
    let row = |name: &str| rows.iter().find(|x| x.0 == name);
    let (iso, res) = (row("turnstile"), row("turnstile restricted"));
    writeln!(
        r,
        "### Setup: a `restricted` turn against the same `isolated` turn\n\n\
         `supervise run --json --no-outputs -- /bin/true`, whole-process wall time, {}: \
         the same manifest but for `\"network\":\"restricted\",\"egress\":[\"bench.test:443\"]`. \
         The restricted turn sends nothing; its cost is making the turn's resolver, proxy and nftables ruleset and removing them.\n\n\
         | turn | median ms | p95 ms | min–max ms |\n|---|---:|---:|---|",
        if network_only {
            format!("{rounds} interleaved rounds of these two alone (order drawn anew each round, 5 warm-up)")
        } else {
            "the two turnstile rows of the rounds above".to_owned()
        }
    )
    .unwrap();
    for (label, x) in [("isolated", iso), ("restricted", res)] {
        match x {
            Some((_, Some(s), _)) => writeln!(
                r,
                "| {label} | {:.2} | {:.2} | {:.2}–{:.2} |",
                s.median, s.p95, s.min, s.max
            )
            .unwrap(),
            Some((_, None, Some(why))) => writeln!(r, "| {label} | missing: {why} | | |").unwrap(),
            _ => writeln!(r, "| {label} | missing | | |").unwrap(),
        }
    }
    let setup_ms = match (iso, res) {
        (Some((_, Some(a), _)), Some((_, Some(b), _))) => Some(b.median - a.median),
        _ => None,
    };
    if let Some(d) = setup_ms {
        writeln!(
            r,
            "| **restricted − isolated** | **{d:+.2}** (target ≤ +2 ms) | | |"
        )
        .unwrap();
    }
    if !net_phases.is_empty() {
        writeln!(
            r,
            "\nWhere the two turns' time goes (medians over the same rounds, from each turn's own `--json` durations). \
             `egress_sockets` and `egress_nft` are laps of the egress setup thread, which runs while the sandbox is made: \
             they overlap the other phases. `until_parked` is the sandbox's init starting until it waits for its plan, and `egress_wait` \
             the wait for that thread after it: an isolated turn counts both in `init_until_ready`, so compare the row of their sum. `egress_finish` is stopping the proxy and reading its flows and counters after the command.\n\n\
             | phase | isolated ms | restricted ms | difference ms |\n|---|---:|---:|---:|"
        )
        .unwrap();
        // Per turn, then the median: the two laps split one wait.
        let sum = |p: &Phases| -> Option<f64> {
            let ready = p.get("init_until_ready")?;
            let at = |k: &str, i: usize| p.get(k).and_then(|w| w.get(i)).copied().unwrap_or(0.0);
            let v: Vec<f64> = ready
                .iter()
                .enumerate()
                .map(|(i, r)| r + at("egress_wait", i) + at("until_parked", i))
                .collect();
            (!v.is_empty()).then(|| stats(&v).median)
        };
        // Outside the turn's own clock: process start-up, session open,
        // manifest, policy check, exit.
        let rest = |st: Option<&Stats>, p: &Phases| -> Option<f64> {
            let m = |k: &str| p.get(k).map(|v| stats(v).median);
            Some(st?.median - m("(wall_ms)")? - m("(ledger_entries_ms)")?)
        };
        if let (Some(a), Some(b)) = (
            rest(iso.and_then(|x| x.1.as_ref()), iso_phases),
            rest(res.and_then(|x| x.1.as_ref()), net_phases),
        ) {
            writeln!(
                r,
                "| (the rest: whole process − wall_ms − ledger_entries_ms: start-up, session open, manifest, check, exit) | {a:.3} | {b:.3} | {:+.3} |",
                b - a
            )
            .unwrap();
        }
        if let (Some(a), Some(b)) = (sum(iso_phases), sum(net_phases)) {
            writeln!(
                r,
                "| (until_parked + egress_wait + init_until_ready) | {a:.3} | {b:.3} | {:+.3} |",
                b - a
            )
            .unwrap();
        }
        let med = |p: &Phases, k: &str| p.get(k).map(|v| stats(v).median);
        let mut keys: Vec<&String> = net_phases.keys().chain(iso_phases.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.sort_by(|a, b| {
            let m = |k: &str| med(net_phases, k).or(med(iso_phases, k)).unwrap_or(0.0);
            m(b).total_cmp(&m(a))
        });
        let cell = |x: Option<f64>| x.map_or("–".to_owned(), |m| format!("{m:.3}"));
        for k in keys {
            let (a, b) = (med(iso_phases, k), med(net_phases, k));
            writeln!(
                r,
                "| {k} | {} | {} | {} |",
                cell(a),
                cell(b),
                match (a, b) {
                    (Some(a), Some(b)) => format!("{:+.3}", b - a),
                    (None, Some(b)) => format!("{b:+.3}"),
                    _ => "–".into(),
                }
            )
            .unwrap();
        }
    }
    let get_ratio = get_cost(env, rounds, &mut r);
    writeln!(r, "\n{NET_END}").unwrap();
    NetCost {
        section: r,
        setup_ms,
        get_ratio,
    }
}

/// The turn's and the script's own lines `RESOLVE …` and `GET …`.
fn get_times(out: &str) -> Option<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let line = |tag: &str| -> Option<Vec<f64>> {
        out.lines()
            .rev()
            .find_map(|l| l.strip_prefix(tag))
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
    };
    let (res, get, first) = (line("RESOLVE ")?, line("GET ")?, line("FIRST ")?);
    [&res, &get, &first]
        .iter()
        .all(|v| v.len() == GETS_PER_TURN)
        .then_some((res, get, first))
}

/// An allowed 1 MiB GET through a restricted turn against the same GET
/// outside, interleaved, against the test internet (tests/src/inet.rs);
/// appends its table to `r`. The ratio of the medians of resolve + GET.
fn get_cost(env: &Env, rounds: usize, r: &mut String) -> Option<f64> {
    writeln!(
        r,
        "\n### An allowed 1 MiB GET: through a `restricted` turn against the same GET outside\n"
    )
    .unwrap();
    let missing = ["nft", "ip", "python3"]
        .iter()
        .find(|t| which(t).is_none())
        .map(|t| format!("`{t}` is not installed"));
    let net = match missing {
        Some(why) => Err(why),
        None => turnstile_tests::inet::Internet::try_up(),
    };
    let _net = match net {
        Ok(n) => n,
        Err(why) => {
            writeln!(r, "missing: {why}").unwrap();
            return None;
        }
    };
    eprintln!(
        "bench: {rounds} interleaved rounds of {GETS_PER_TURN} GETs of 1 MiB, in a restricted turn and outside"
    );
    let sid = env.new_session();
    let k = GETS_PER_TURN.to_string();
    let mut args = env.run_args(&sid);
    if let Some(p) = args.iter_mut().find(|a| *a == "bench") {
        *p = "bench-get".into();
    }
    let inside = || {
        let mut c = quiet(env.supervise());
        c.args(&args)
            .args(["--json", "--no-outputs", "--"])
            .args(["/usr/bin/python3", "-c", BENCH_GETS, "good.test", &k])
            .env("TURNSTILE_DNS_UPSTREAM", turnstile_tests::inet::UPSTREAM)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let outside = || {
        let mut c = quiet(Command::new("/usr/bin/python3"));
        c.args(["-c", BENCH_GETS, "203.0.113.10", &k])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    #[derive(Default)]
    struct Side {
        res: Vec<f64>,
        get: Vec<f64>,
        ttfb: Vec<f64>,
        rest: Vec<f64>,
        both: Vec<f64>,
        first: Vec<f64>,
        wall: Vec<f64>,
        failed: usize,
        why: Option<String>,
    }
    let (mut ins, mut outs) = (Side::default(), Side::default());
    let mut turn_phases = Phases::new();
    let warm = 2;
    for round in 0..(rounds + warm) {
        for which_side in [round % 2, 1 - round % 2] {
            let (mut c, side) = if which_side == 0 {
                (inside(), &mut ins)
            } else {
                (outside(), &mut outs)
            };
            let t = Instant::now();
            let out = c.output();
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            let out = match out {
                Ok(o) => o,
                Err(e) => {
                    side.failed += 1;
                    side.why = Some(e.to_string());
                    continue;
                }
            };
            // A turn's `--json` puts the command's stdout on stderr.
            let text = if which_side == 0 {
                String::from_utf8_lossy(&out.stderr).into_owned()
            } else {
                String::from_utf8_lossy(&out.stdout).into_owned()
            };
            let Some((res, get, first)) = get_times(&text).filter(|_| out.status.success()) else {
                side.failed += 1;
                side.why = Some(format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                ));
                continue;
            };
            if round < warm {
                continue;
            }
            if which_side == 0 {
                add_phases(&mut turn_phases, &out.stdout);
            }
            side.first.push(res[0] + get[0]);
            side.both.extend(res.iter().zip(&get).map(|(a, b)| a + b));
            side.ttfb.extend(first.iter().copied());
            side.rest.extend(get.iter().zip(&first).map(|(g, f)| g - f));
            side.res.extend(res);
            side.get.extend(get);
            side.wall.push(ms);
        }
    }
    writeln!(
        r,
        "{rounds} interleaved rounds (+{warm} warm-up), which side goes first alternating each round. \
         A round is one turn of package `bench-get` (the `bench` manifest with `\"network\":\"restricted\",\"egress\":[\"good.test:8080\"]`) \
         running a Python script that does {GETS_PER_TURN} GETs of 1 MiB from `good.test:8080`, one after another, \
         and the same script outside any sandbox against `203.0.113.10:8080`, the address `good.test` names. \
         The server is the test internet's (tests/src/inet.rs: a network namespace behind a veth pair holding documentation addresses; nothing leaves the host). \
         The script times each GET itself: *resolve* is `getaddrinfo` (inside, a query to the turn's resolver, which asks the test internet's resolver; \
         outside, a literal address: no query), *GET* is connect, the request and reading the 1 MiB to EOF \
         (inside, through the turn's transparent proxy, which connects upstream by name and splices the bytes). \
         Per-GET rows pool every GET of every round; *first* is each process's first GET (resolve + GET); \
         *whole process* is the wall time of the `supervise run` (turn set-up, Python's start-up, the GETs, teardown, ledger) against `python3` alone.\n"
    )
    .unwrap();
    for (label, side) in [("inside", &ins), ("outside", &outs)] {
        if side.failed > 0 {
            writeln!(
                r,
                "{label}: {} failed runs (last: {}).\n",
                side.failed,
                side.why.clone().unwrap_or_default()
            )
            .unwrap();
        }
    }
    if ins.get.is_empty() || outs.get.is_empty() {
        writeln!(r, "missing: every run failed on one side").unwrap();
        return None;
    }
    writeln!(
        r,
        "| measured | inside median ms | inside p95 ms | outside median ms | outside p95 ms | inside × outside |\n|---|---:|---:|---:|---:|---:|"
    )
    .unwrap();
    let mut ratio = None;
    let whole = format!("whole process: a turn doing {GETS_PER_TURN} GETs vs `python3` doing them");
    for (label, a, b) in [
        ("resolve + GET (per GET)", &ins.both, &outs.both),
        ("GET: connect to last byte (per GET)", &ins.get, &outs.get),
        (
            "… of which connect + request to the first bytes back",
            &ins.ttfb,
            &outs.ttfb,
        ),
        (
            "… of which the first bytes back to the last",
            &ins.rest,
            &outs.rest,
        ),
        ("resolve (per GET)", &ins.res, &outs.res),
        (
            "first GET of a process (resolve + GET)",
            &ins.first,
            &outs.first,
        ),
        (whole.as_str(), &ins.wall, &outs.wall),
    ] {
        let (a, b) = (stats(a), stats(b));
        if ratio.is_none() {
            ratio = Some(a.median / b.median);
        }
        writeln!(
            r,
            "| {label} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} |",
            a.median,
            a.p95,
            b.median,
            b.p95,
            a.median / b.median
        )
        .unwrap();
    }
    writeln!(
        r,
        "\nThroughput at the median GET: {:.0} MB/s inside, {:.0} MB/s outside. The target (≤ 1.5×) is read on the first row.",
        1.048576 / (stats(&ins.get).median / 1000.0),
        1.048576 / (stats(&outs.get).median / 1000.0)
    )
    .unwrap();
    if !turn_phases.is_empty() {
        let eg: Vec<String> = turn_phases
            .iter()
            .filter(|(k, _)| k.starts_with("egress") || k.starts_with('('))
            .map(|(k, v)| format!("{k} {:.3}", stats(v).median))
            .collect();
        writeln!(
            r,
            "\nThe GET turns' own egress phases and times (medians, ms): {}.",
            eg.join(", ")
        )
        .unwrap();
    }
    ratio
}

/// Replaces the network section of `out_dir/RESULTS.md` (or appends it).
fn splice_network(out_dir: &Path, section: &str) {
    let path = out_dir.join("RESULTS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let section = section.trim_end();
    let new = match (old.find(NET_BEGIN), old.find(NET_END)) {
        (Some(b), Some(e)) if e > b => {
            format!("{}{section}{}", &old[..b], &old[e + NET_END.len()..])
        }
        _ => format!("{}\n\n{section}\n", old.trim_end()),
    };
    std::fs::create_dir_all(out_dir).unwrap();
    std::fs::write(&path, new).unwrap();
}

/// The commit measured (`-dirty` with uncommitted changes).
fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        None => "unknown".into(),
        Some(c) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(s) if !s.is_empty() => format!("{c}-dirty"),
            _ => c,
        },
    }
}

fn date() -> String {
    Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn ledger_numbers(env: &Env) -> (Stats, f64, f64) {
    use turnstile_supervisor::store::layout::{StateDir, Workspace};
    use turnstile_supervisor::store::ledger::LedgerKind;
    use turnstile_supervisor::store::session::Session;
    let ws = Workspace::open(&env.ws).unwrap();
    let state = StateDir::open(&env.state, &ws, true).unwrap();
    let id = turnstile_policy::SessionId::parse(&env.new_session()).unwrap();
    let session = Session::open(&ws, &state, &id, None).unwrap();
    let lock = session.lock().unwrap();
    let body = |i: u64| {
        let v = json!({"event": "bench", "session_id": id.as_str(), "turn_number": i, "payload": "p".repeat(900)});
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    };
    let mut lat = Vec::new();
    for i in 0..2000 {
        let t = Instant::now();
        session
            .ledger(LedgerKind::Exec)
            .append(&lock, body(i))
            .unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    // Verify throughput over several passes of the same (~2 MB) ledger.
    let bytes = std::fs::metadata(session.ledger(LedgerKind::Exec).path)
        .unwrap()
        .len() as f64;
    let t = Instant::now();
    let passes = 10;
    for _ in 0..passes {
        session.ledger(LedgerKind::Exec).verify().unwrap();
    }
    let mbps = bytes * passes as f64 / 1e6 / t.elapsed().as_secs_f64();
    (stats(&lat), mbps, bytes / 1e6)
}

fn concurrent(env: &Env, n: usize, dur: Duration) -> f64 {
    let sessions: Vec<String> = (0..n).map(|_| env.new_session()).collect();
    let start = Instant::now();
    let total: usize = std::thread::scope(|s| {
        let hs: Vec<_> = sessions
            .iter()
            .map(|sid| {
                s.spawn(move || {
                    let mut count = 0;
                    while start.elapsed() < dur {
                        let mut c = env.supervise();
                        c.args(env.run_args(sid))
                            .args(["--no-outputs", "--", "/bin/true"]);
                        if quiet(c).status().map(|s| s.success()).unwrap_or(false) {
                            count += 1;
                        }
                    }
                    count
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    total as f64 / start.elapsed().as_secs_f64()
}

/// A horizontal bar chart of median latency (with the p95 as a whisker),
/// log-free, one bar per system; missing peers are labelled.
fn svg_chart(rows: &[(String, Option<Stats>, Option<String>)]) -> String {
    let max = rows
        .iter()
        .filter_map(|r| r.1.as_ref().map(|s| s.p95))
        .fold(1.0f64, f64::max);
    let (w, bar_h, left, top) = (860.0, 30.0, 150.0, 50.0);
    let scale = (w - left - 120.0) / max;
    let h = top + rows.len() as f64 * (bar_h + 12.0) + 40.0;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="13">
<rect width="100%" height="100%" fill="white"/>
<text x="{left}" y="28" font-size="16" font-weight="bold">Wall time of /bin/true per system (median, whisker = p95), ms</text>
"#
    );
    for (i, (name, st, missing)) in rows.iter().enumerate() {
        let y = top + i as f64 * (bar_h + 12.0);
        let color = if name == "turnstile" {
            "#d9480f"
        } else {
            "#1c7ed6"
        };
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{name}</text>"#,
            left - 8.0,
            y + bar_h * 0.65
        );
        match (st, missing) {
            (Some(st), _) => {
                let bw = (st.median * scale).max(1.0);
                let _ = writeln!(
                    s,
                    r#"<rect x="{left}" y="{y}" width="{bw:.1}" height="{bar_h}" fill="{color}"/>"#
                );
                let px = left + st.p95 * scale;
                let _ = writeln!(
                    s,
                    r#"<line x1="{:.1}" y1="{}" x2="{px:.1}" y2="{}" stroke="black"/>"#,
                    left + bw,
                    y + bar_h / 2.0,
                    y + bar_h / 2.0
                );
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{}">{:.2}</text>"#,
                    px + 6.0,
                    y + bar_h * 0.65,
                    st.median
                );
            }
            (None, why) => {
                let _ = writeln!(
                    s,
                    r#"<text x="{left}" y="{}" fill="gray">missing: {}</text>"#,
                    y + bar_h * 0.65,
                    why.clone().unwrap_or_default()
                );
            }
        }
    }
    s += "</svg>\n";
    s
}
