//! `cargo xtask bench-ab [--rounds N] DIR…` and `bench-ab --save DIR`:
//! the before/after of a change, in one interleaved run.
//!
//! A change's effect is smaller than the drift between two host hours
//! (bare `/bin/true` took 0.68 to 1.37 ms on the same machine within a
//! day), so two builds are compared only side by side: each `DIR` holds one
//! build's `supervise` and `turnstile-init` (`--save DIR` copies the
//! current release build there), each gets its own workspace, state
//! directory and `supervise serve` daemon, and every round runs bare
//! `/bin/true` and, for each build, a cold turn (`supervise run`), a
//! served warm one (`supervise run --server`) and a cold turn of a new
//! session (`supervise run` without `--session`: the session's creation
//! included), in an order drawn anew each round
//! ([`crate::order::round_order`]). Prints medians, p90s, ratios to
//! bare and to the first build. Root (the native sandbox); nothing is written to the repository.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::order::round_order;
use crate::{BenchDaemon, is_root, new_session, percentile, timed, workspace_root};

/// The package every build's turns run (the bench manifest's limits).
const MANIFEST: &str = r#"{"capabilities":{"execute":["/bin/true"]},"limits":{"memory":"3Gi","disk":"2Gi","files":20000,"timeout_seconds":300}}"#;

/// The turns each build runs every round, in their slots' order.
#[derive(Clone, Copy)]
enum Kind {
    /// `supervise run --session S`: a cold sandbox, an existing session.
    Cold,
    /// The same through the build's daemon: a warm sandbox.
    Served,
    /// `supervise run` without `--session`: the session is made first.
    NewSession,
}

const KINDS: [(Kind, &str); 3] = [
    (Kind::Cold, "cold"),
    (Kind::Served, "served warm"),
    (Kind::NewSession, "cold, new session"),
];

/// One build under comparison: its binaries, workspace, daemon, sessions.
struct Build {
    label: String,
    sup: PathBuf,
    ws: PathBuf,
    state: PathBuf,
    socket: PathBuf,
    cold_session: String,
    served_session: String,
    _daemon: BenchDaemon,
}

impl Build {
    fn start(dir: &Path, n: usize) -> Result<Self> {
        let sup = dir.join("supervise");
        for bin in [&sup, &dir.join("turnstile-init")] {
            if !bin.is_file() {
                bail!(
                    "{} is missing: a build directory holds supervise and turnstile-init (make one with `cargo xtask bench-ab --save {}`)",
                    bin.display(),
                    dir.display()
                );
            }
        }
        let label = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| format!("build{n}"));
        let scratch = std::env::temp_dir().join(format!("ts-bench-ab-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        let (ws, state, socket) = (
            scratch.join("ws"),
            scratch.join("state"),
            scratch.join("serve.sock"),
        );
        std::fs::create_dir_all(ws.join("installed/ab"))?;
        std::fs::write(ws.join("installed/ab/manifest.json"), MANIFEST)?;
        let daemon = BenchDaemon::start(&sup, &scratch, &state, &socket)
            .with_context(|| format!("the daemon of {label}"))?;
        let session = || new_session(&sup, &ws, &state);
        let (cold_session, served_session) = (session()?, session()?);
        Ok(Self {
            label,
            sup,
            ws,
            state,
            socket,
            cold_session,
            served_session,
            _daemon: daemon,
        })
    }

    fn turn(&self, kind: Kind) -> Command {
        let mut c = Command::new(&self.sup);
        c.args(["run", "--root"])
            .arg(&self.ws)
            .arg("--state-dir")
            .arg(&self.state)
            .args(["--package", "ab", "--no-outputs"]);
        match kind {
            Kind::Cold => {
                c.arg("--session").arg(&self.cold_session);
            }
            Kind::Served => {
                c.arg("--session")
                    .arg(&self.served_session)
                    .arg("--server")
                    .arg(&self.socket);
            }
            Kind::NewSession => {}
        }
        c.args(["--", "/bin/true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }
}

pub fn bench_ab(args: &[String]) -> Result<()> {
    if !is_root() {
        bail!("bench-ab needs root (the native sandbox)");
    }
    let mut rounds = 150usize;
    let mut dirs = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| *n > 0)
                    .context("--rounds takes a positive number")?;
            }
            "--save" => {
                let dir = PathBuf::from(it.next().context("--save takes a directory")?);
                return save(&dir);
            }
            other if other.starts_with('-') => bail!("bench-ab: unknown option `{other}`"),
            dir => dirs.push(PathBuf::from(dir)),
        }
    }
    if dirs.is_empty() {
        bail!(
            "usage: cargo xtask bench-ab [--rounds N] DIR… (each DIR from `cargo xtask bench-ab --save DIR`)"
        );
    }
    let builds: Vec<Build> = dirs
        .iter()
        .enumerate()
        .map(|(n, d)| Build::start(d, n))
        .collect::<Result<_>>()?;
    // Warm-up: page cache, each session's first (cold) served turn.
    for _ in 0..5 {
        for b in &builds {
            for (kind, _) in KINDS {
                timed(&mut b.turn(kind))?;
            }
        }
    }
    // Slot 0 is bare; then each build's kinds of turn.
    let per = KINDS.len();
    let slots = 1 + per * builds.len();
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); slots];
    for round in 0..rounds {
        for slot in round_order(round, slots) {
            let ms = match slot {
                0 => timed(&mut Command::new("/bin/true"))?,
                s => {
                    let b = &builds[(s - 1) / per];
                    timed(&mut b.turn(KINDS[(s - 1) % per].0))?
                }
            };
            times[slot].push(ms);
        }
    }
    let mut med = Vec::with_capacity(slots);
    let mut p90 = Vec::with_capacity(slots);
    for t in &mut times {
        med.push(percentile(t, 0.5));
        p90.push(percentile(t, 0.9));
    }
    println!(
        "\n{rounds} interleaved rounds, order drawn anew each round (whole-process wall time, ms)\n"
    );
    println!(
        "| build | turn | median ms | p90 ms | × bare | × {} |",
        builds[0].label
    );
    println!("|---|---|---:|---:|---:|---:|");
    println!(
        "| bare `/bin/true` | | {:.3} | {:.3} | 1.00 | |",
        med[0], p90[0]
    );
    for (i, b) in builds.iter().enumerate() {
        for (j, (_, kind)) in KINDS.iter().enumerate() {
            let s = 1 + per * i + j;
            println!(
                "| {} | {kind} | {:.3} | {:.3} | {:.2} | {:.3} |",
                b.label,
                med[s],
                p90[s],
                med[s] / med[0],
                med[s] / med[1 + j]
            );
        }
    }
    Ok(())
}

/// Copies the release build (built now) into `dir`.
fn save(dir: &Path) -> Result<()> {
    crate::build_bins(true)?;
    let root = workspace_root();
    std::fs::create_dir_all(dir)?;
    for (from, name) in [
        (root.join("target/release/supervise"), "supervise"),
        (root.join("target/release/turnstile-init"), "turnstile-init"),
    ] {
        std::fs::copy(&from, dir.join(name))
            .with_context(|| format!("copy {} into {}", from.display(), dir.display()))?;
    }
    println!("xtask: release build saved in {}", dir.display());
    Ok(())
}
