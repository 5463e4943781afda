//! `cargo xtask bench-shim`: `ctr run --rm` through the turnstile shim
//! against the runc v2 shim (`io.containerd.runc.v2`), same private
//! containerd, same image (busybox-static, built offline), same command
//! (`true`), interleaved rounds with the order rotated each round. The
//! turnstile rows include the whole turn: admission (`supervise check`),
//! the sandbox, capture, verify and both ledgers. Writes its section of
//! bench/RESULTS.md (between the `bench-shim` markers, which `cargo xtask
//! bench` keeps). Needs root, containerd, runc, busybox-static, python3.
//!
//! usage: bench_shim BENCH_DIR [ROUNDS]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use turnstile_tests::containerd::Containerd;
use turnstile_tests::{Fixture, busybox_rootfs, supervise_bin};

const IMAGE: &str = "docker.io/turnstile/busybox:bench";
const BEGIN: &str = "<!-- bench-shim -->";
const END: &str = "<!-- /bench-shim -->";
const MANIFEST: &str = r#"{
  "capabilities": {"execute": ["/bin/true", "/bin/busybox"]},
  "limits": {"timeout_seconds": 30}
}"#;

struct System {
    label: &'static str,
    runtime: &'static str,
    /// `--runtime-config-path` (the shim's options), if any.
    config: Option<PathBuf>,
    /// `--annotation`s.
    annotations: Vec<String>,
}

fn median(samples: &[f64]) -> (f64, f64, f64, f64) {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.95), s[0], s[s.len() - 1])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let out_dir = PathBuf::from(args.get(1).map_or("bench", String::as_str));
    let rounds: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(40);
    let warmup = 3;

    let shim = supervise_bin().with_file_name("containerd-shim-turnstile-v2");
    assert!(shim.is_file(), "{} is missing", shim.display());
    let images = tempfile::tempdir().unwrap();
    let rootfs = images.path().join("rootfs");
    assert!(busybox_rootfs(&rootfs), "busybox-static is required");
    let archive = images.path().join("image.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("images/oci_archive.py");
    assert!(
        Command::new("python3")
            .arg(&script)
            .arg(&rootfs)
            .arg(&archive)
            .arg(IMAGE)
            .status()
            .unwrap()
            .success()
    );

    let fx = Fixture::new();
    fx.install("bench", MANIFEST);
    let c = Containerd::start(
        shim.parent().unwrap(),
        "[plugins.\"io.containerd.grpc.v1.cri\"]\n  disable = true",
    );
    let imported = c.ctr(&["images", "import", archive.to_str().unwrap()]);
    assert!(imported.status.success(), "{imported:?}");
    let options = |backend: &str| {
        let p = c.dir.path().join(format!("shim-{backend}.json"));
        std::fs::write(
            &p,
            serde_json::json!({
                "backend": backend,
                "state_dir": fx.state,
                "supervise": supervise_bin(),
                "workspaces": {"bench": {"root": fx.root}},
            })
            .to_string(),
        )
        .unwrap();
        p
    };
    let turn_annotations = vec![
        "io.turnstile.workspace=bench".to_owned(),
        "io.turnstile.package=bench".to_owned(),
        "io.turnstile.outputs=[]".to_owned(),
    ];
    let systems = [
        System {
            label: "runc v2 shim (io.containerd.runc.v2)",
            runtime: "io.containerd.runc.v2",
            config: None,
            annotations: Vec::new(),
        },
        System {
            label: "turnstile shim, backend runc",
            runtime: "io.containerd.turnstile.v2",
            config: Some(options("runc")),
            annotations: turn_annotations.clone(),
        },
        System {
            label: "turnstile shim, backend native",
            runtime: "io.containerd.turnstile.v2",
            config: Some(options("native")),
            annotations: turn_annotations,
        },
    ];
    let fifos = c.dir.path().join("fifo").display().to_string();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    let mut failures = vec![0usize; systems.len()];
    for round in 0..warmup + rounds {
        for k in 0..systems.len() {
            let i = (round + k) % systems.len();
            let s = &systems[i];
            let id = format!("b{round}-{i}");
            let mut a: Vec<String> = vec![
                "run".into(),
                "--rm".into(),
                "--runtime".into(),
                s.runtime.into(),
                "--fifo-dir".into(),
                fifos.clone(),
            ];
            if let Some(p) = &s.config {
                a.extend(["--runtime-config-path".into(), p.display().to_string()]);
            }
            for an in &s.annotations {
                a.extend(["--annotation".into(), an.clone()]);
            }
            a.extend([IMAGE.into(), id, "true".into()]);
            let refs: Vec<&str> = a.iter().map(String::as_str).collect();
            let t0 = Instant::now();
            let out = c.ctr(&refs);
            let ms = t0.elapsed().as_secs_f64() * 1000.0;
            if !out.status.success() {
                failures[i] += 1;
                eprintln!(
                    "{}: failed: {}{}",
                    s.label,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            }
            if round >= warmup {
                samples[i].push(ms);
            }
        }
    }

    let base = median(&samples[0]).0;
    let mut report = String::new();
    writeln!(
        report,
        "{BEGIN}\n## containerd shim: `ctr run --rm` through turnstile vs the runc v2 shim ({rounds} interleaved rounds, order rotated, {warmup} warm-up)\n\nProduced by `cargo xtask bench-shim` (release build, as root) on {} — containerd {}, same private daemon, image (busybox-static) and command (`true`) for every row; wall time of the whole `ctr run --rm` (shim start, create, start, wait, delete). A turnstile row is a whole turn: `supervise check` at Create, then `supervise run` (sandbox, capture, verify, both ledgers).\n\n| system | median ms | p95 ms | min–max ms | failed runs | × runc v2 shim |\n|---|---:|---:|---|---:|---:|",
        date(),
        containerd_version()
    )
    .unwrap();
    for (i, s) in systems.iter().enumerate() {
        if samples[i].is_empty() {
            writeln!(report, "| {} | – | – | – | {} | – |", s.label, failures[i]).unwrap();
            continue;
        }
        let (m, p95, min, max) = median(&samples[i]);
        writeln!(
            report,
            "| {} | {m:.1} | {p95:.1} | {min:.1}–{max:.1} | {} | {:.2} |",
            s.label,
            failures[i],
            m / base
        )
        .unwrap();
    }
    writeln!(report, "{END}").unwrap();
    print!("{report}");
    drop(c);

    let path = out_dir.join("RESULTS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if e > b => {
            format!(
                "{}{report}{}",
                &old[..b],
                &old[e + END.len()..].trim_start_matches('\n')
            )
        }
        _ => format!("{}\n{report}", old.trim_end()),
    };
    std::fs::write(&path, new).unwrap();
}

fn date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn containerd_version() -> String {
    Command::new("containerd")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .unwrap_or("?")
                .to_owned()
        })
        .unwrap_or_default()
}
