//! `cargo xtask bench-outputs [N] [ROUNDS]` (issue 29, item 3): a turn that
//! writes N declared outputs (default 100,000) as one tree output
//! `output/<session_id>/t/**:data` against `cp -a` of the same tree plus
//! `sync`, interleaved (ROUNDS rounds, default 3); writes bench/OUTPUTS.md.
//! Release build, root. The ratio is what the issue targets (within 3×).

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The tree both sides produce: N files of a few bytes, 1,000 per directory.
const WRITER: &str = "import os, sys\nbase, n = sys.argv[1], int(sys.argv[2])\nfor d in range((n + 999) // 1000):\n    os.makedirs(f'{base}/d{d}', exist_ok=True)\nfor i in range(n):\n    with open(f'{base}/d{i // 1000}/f{i}.txt', 'w') as f:\n        f.write(str(i))\n";

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

pub fn bench_outputs(root: &Path, args: &[String]) -> Result<()> {
    if !super::is_root() {
        bail!("bench-outputs needs root (the native sandbox)");
    }
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    super::run(super::cargo().args([
        "build",
        "--release",
        "-p",
        "turnstile-supervisor",
        "--bins",
    ]))?;
    super::build_init(true)?;
    let sup = root.join("target/release/supervise");
    // On the disk (not a tmpfs): both sides pay for durability.
    let dir = Path::new("/var/tmp").join(format!("ts-bench-outputs-{}", std::process::id()));
    let ws = dir.join("ws");
    let state = dir.join("state");
    std::fs::create_dir_all(ws.join("installed/many"))?;
    std::fs::write(
        ws.join("installed/many/manifest.json"),
        format!(
            r#"{{"capabilities": {{"write": ["output/<session_id>/**"], "execute": ["/usr/bin/python3"]}},
                "limits": {{"files": {}, "disk": "4Gi", "memory": "2Gi", "timeout_seconds": 1800}}}}"#,
            n + 10_000
        ),
    )?;
    let result = (|| -> Result<String> {
        let (mut turn, mut cp, mut gen_out) = (Vec::new(), Vec::new(), Vec::new());
        let (mut capture, mut commit) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            eprintln!("bench-outputs: round {}/{rounds}", round + 1);
            // The baseline: the same tree written outside, then `cp -a` + sync.
            let src = dir.join(format!("src{round}"));
            let t = std::time::Instant::now();
            let st = Command::new("/usr/bin/python3")
                .args(["-c", WRITER])
                .arg(&src)
                .arg(n.to_string())
                .status()?;
            if !st.success() {
                bail!("writing the tree outside failed");
            }
            gen_out.push(t.elapsed().as_secs_f64() * 1000.0);
            let _ = Command::new("sync").status();
            let dst = dir.join(format!("dst{round}"));
            let t = std::time::Instant::now();
            let st = Command::new("cp").arg("-a").arg(&src).arg(&dst).status()?;
            let st2 = Command::new("sync").status()?;
            if !st.success() || !st2.success() {
                bail!("cp -a + sync failed");
            }
            cp.push(t.elapsed().as_secs_f64() * 1000.0);
            // The turn: a fresh session, the tree as one declared output.
            let t = std::time::Instant::now();
            let out = Command::new(&sup)
                .args(["run", "--root"])
                .arg(&ws)
                .arg("--state-dir")
                .arg(&state)
                .args([
                    "--package",
                    "many",
                    "--json",
                    "--output",
                    "output/<session_id>/t/**:data",
                    "--",
                    "/usr/bin/python3",
                    "-c",
                    &format!(
                        "import os, sys\nsys.argv = ['w', 'output/' + os.environ['TURNSTILE_SESSION_ID'] + '/t', '{n}']\n{WRITER}"
                    ),
                ])
                .output()
                .with_context(|| format!("{}", sup.display()))?;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let committed = v["committed"].as_array().map_or(0, Vec::len);
            if !out.status.success() || committed != n {
                bail!(
                    "the turn did not commit {n} outputs (status {}, {committed} committed): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            turn.push(ms);
            let phase = |k: &str| v["durations"]["phases_ms"][k].as_f64().unwrap_or(f64::NAN);
            capture.push(phase("capture"));
            commit.push(phase("commit"));
            for p in [&src, &dst] {
                let _ = std::fs::remove_dir_all(p);
            }
            if let Some(sid) = v["session_id"].as_str() {
                let _ = std::fs::remove_dir_all(ws.join("output").join(sid));
            }
        }
        let (t, c) = (median(&mut turn), median(&mut cp));
        let mut r = String::new();
        writeln!(
            r,
            "# {n} declared outputs: a turn against `cp -a` + `sync`\n\n\
             Produced by `cargo xtask bench-outputs {n} {rounds}` (release build, as root), {rounds} interleaved rounds, medians; \
             workspace on the root disk (/var/tmp). Each turn writes {n} files of a few bytes (1,000 per directory) under \
             one tree output `output/<session_id>/t/**:data`; the baseline copies the same tree, written outside, with `cp -a` and then runs `sync`.\n"
        )?;
        writeln!(r, "| what | median ms |\n|---|---:|")?;
        writeln!(
            r,
            "| writing the tree outside (python, no sync; context) | {:.0} |",
            median(&mut gen_out)
        )?;
        writeln!(r, "| `cp -a` + `sync` | {c:.0} |")?;
        writeln!(
            r,
            "| turn, whole process (sandbox, the command writing the tree, capture, verify, commit, ledgers) | {t:.0} |"
        )?;
        writeln!(
            r,
            "| turn phase `capture` (enumerate + hash) | {:.0} |",
            median(&mut capture)
        )?;
        writeln!(
            r,
            "| turn phase `commit` (stage, fsync/syncfs, rename) | {:.0} |",
            median(&mut commit)
        )?;
        writeln!(
            r,
            "\nturn / (`cp -a` + `sync`) = **{:.2}×** (target ≤ 3×: {})",
            t / c,
            if t / c <= 3.0 { "met" } else { "not met" }
        )?;
        Ok(r)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let report = result?;
    print!("{report}");
    std::fs::write(root.join("bench/OUTPUTS.md"), report)?;
    Ok(())
}
