//! `cargo xtask bench`: where turnstile stands against bare exec, unshare,
//! bwrap, crun, runc and runsc, plus the cost curves of capture, commit and
//! the ledgers. Writes bench/RESULTS.md and bench/latency.svg. Needs root.
//!
//! Whole-process wall times are measured interleaved (one run of each
//! system per round) so machine drift hits every system alike.

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
    let dir = std::env::temp_dir().join(format!("turnstile-bench-stdio-{}", std::process::id()));
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
    // proxy and nftables set up and torn down; no traffic). Not piped:
    // its phases stay out of the isolated turn's table.
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
                .args(["--json", "--no-outputs", "--", "/bin/true"]);
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
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let out_dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "bench".into()));
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
    std::fs::create_dir_all(env.ws.join("installed/bench")).unwrap();
    std::fs::write(
        env.ws.join("installed/bench/manifest.json"),
        r#"{"capabilities":{"execute":["/bin/true","/usr/bin/python3"]},
            "limits":{"memory":"3Gi","disk":"2Gi","files":20000,"timeout_seconds":300}}"#,
    )
    .unwrap();
    std::fs::create_dir_all(env.ws.join("installed/bench-net")).unwrap();
    std::fs::write(
        env.ws.join("installed/bench-net/manifest.json"),
        r#"{"capabilities":{"execute":["/bin/true"]},"network":"restricted",
            "egress":["bench.test:443"],"limits":{"timeout_seconds":300}}"#,
    )
    .unwrap();
    let sid = env.new_session();
    let mut report = String::new();
    let mut rows: Vec<(String, Option<Stats>, Option<String>)> = Vec::new();

    // Peak RSS of the supervisor: before any other child has run.
    for _ in 0..20 {
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
    let systems = systems(&env, &sid);
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    let mut failures: Vec<usize> = vec![0; systems.len()];
    let mut phases: std::collections::BTreeMap<String, Vec<f64>> =
        std::collections::BTreeMap::new();
    for round in 0..(rounds + 5) {
        // Rotate the order every round: a system's asynchronous teardown
        // (runsc's, above all) must not always land on the same neighbour.
        for k in 0..systems.len() {
            let i = (k + round) % systems.len();
            let s = &systems[i];
            if s.missing.is_some() {
                continue;
            }
            match time_once((s.make)(round)) {
                Some((ms, stdout)) if round >= 5 => {
                    samples[i].push(ms);
                    if let Ok(v) = serde_json::from_slice::<Value>(&stdout) {
                        let d = &v["durations"];
                        if let Some(m) = d["phases_ms"].as_object() {
                            for (k, x) in m {
                                phases
                                    .entry(k.clone())
                                    .or_default()
                                    .push(x.as_f64().unwrap_or(0.0));
                            }
                        }
                        for k in ["wall_ms", "ledger_entries_ms"] {
                            phases
                                .entry(format!("({k})"))
                                .or_default()
                                .push(d[k].as_f64().unwrap_or(0.0));
                        }
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
        "## Whole-process wall time of `/bin/true` ({rounds} interleaved rounds, order rotated each round, 5 warm-up)\n"
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
        "# turnstile benchmark results\n\nProduced by `cargo xtask bench` (release build, as root) on {} — {} cores, kernel {}, {}.\n\n![latency per system](latency.svg)\n\n",
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
/// rotated each round); appends the table and the runc turn's phases.
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
        for k in 0..systems.len() {
            let i = (k + round) % systems.len();
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
        "\n## OCI backends: a turn against the bare runtime running the same bundle ({rounds} interleaved rounds, order rotated, 5 warm-up)\n\n\
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
