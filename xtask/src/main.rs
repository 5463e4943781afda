//! `cargo xtask <task>`: the one entry point for automation.
//!
//! - `setup`: install the system packages the workspace needs (apt), if
//!   missing;
//! - `demo`:  build `supervise` and walk through a session on the example
//!   package in `examples/workspace`;
//! - `test`:  the README check (`readme-check`), setup, then fmt check, clippy -D warnings, every test, the
//!   red-team suite on each backend, the VM tests' reduced set
//!   (`vm-test --ci`), and a check that every in-scope requirement
//!   (FR-RT-0xx) has a test naming it;
//! - `realsw`: the real-software suite in full (more CPython modules than
//!   `test` runs, then the toolchain workflows);
//! - `vm-test`: the integration and red-team suites inside QEMU on stock
//!   Debian kernels (a matrix: 6.1 and 6.12), pure cgroup v2 (`vm.rs`).
//!
//! xtask depends on nothing that links a C library, so it builds on a fresh
//! machine before `libseccomp-dev` and friends are installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

mod bench_ab;
mod bench_outputs;
mod order;
mod readme_check;
mod vm;

/// System packages: the build (libseccomp), the schema tests
/// (python3-jsonschema), the real-software suite (tests/tests/realsw.rs:
/// CPython's own test suite, a C toolchain, git, venv, node) and the runc
/// and crun backends' tests and red-team runs; the shim's tests
/// (containerd, busybox-static for the offline images); the CRI test
/// (containernetworking-plugins for the pod's loopback and bridge networks,
/// iproute2 to remove the test's bridge, protobuf-compiler for the
/// `k8s-cri` crate's generated client); the VM tests
/// (`xtask/src/vm.rs`: QEMU, a static busybox for the initramfs, mkfs.ext4
/// for the guest's scratch disk, xz for compressed kernel modules).
const APT_PACKAGES: &[&str] = &[
    "libseccomp-dev",
    "pkg-config",
    // The BPF denial observer: clang compiles it, libbpf-rs builds libbpf
    // (headers, libelf, zlib).
    "clang",
    "libbpf-dev",
    "libelf-dev",
    "zlib1g-dev",
    // Its minimal BTF (`bpftool gen min_core_btf`, once per boot): without
    // it every process parses the kernel's whole BTF.
    "bpftool",
    "python3",
    "python3-jsonschema",
    "libpython3.11-testsuite",
    "python3-venv",
    "gcc",
    "make",
    "libc6-dev",
    "git",
    "nodejs",
    // `supervise report`'s page is checked in a real headless browser.
    "chromium",
    "runc",
    "containerd",
    "busybox-static",
    "crun",
    "runsc",
    "containernetworking-plugins",
    "iproute2",
    "protobuf-compiler",
    "qemu-system-x86",
    "e2fsprogs",
    "xz-utils",
    "nftables",
];

/// Requirements that must each have at least one test whose name contains
/// `fr_rt_0xx`. Grows as issues land.
const REQUIRED_FRS: &[u32] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("setup") => setup(),
        Some("demo") => demo(),
        Some("build") => build_bins(args.get(1).is_some_and(|a| a == "--release")),
        Some("test") => test(),
        Some("fr-coverage") => fr_coverage(),
        Some("readme-check") => readme_check::readme_check(&workspace_root()),
        Some("fuzz") => fuzz(&args[1..]),
        Some("redteam") => redteam(&args[1..]),
        Some("realsw") => realsw(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("bench-shim") => bench_shim(&args[1..]),
        Some("package" | "deb") => package(&args[1..]),
        Some("bench-serve") => bench_serve(&args[1..]),
        Some("bench-ab") => bench_ab::bench_ab(&args[1..]),
        Some("bench-outputs") => bench_outputs::bench_outputs(&workspace_root(), &args[1..]),
        Some("soak") => soak(&args[1..]),
        Some("vm-test") => {
            setup()?;
            vm::vm_test(&args[1..])
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <setup|demo|build [--release]|test|redteam [--backend NAME] [FILTER]|realsw [MODULE…]|vm-test [--kernel NAME] [--ci]|bench|bench-shim [ROUNDS]|bench-serve|bench-ab [--rounds N] DIR…|bench-ab --save DIR|bench-outputs [N] [ROUNDS]|soak [--sessions N] [--threads T] [--minutes M]|package [--debug] [--no-build]|fr-coverage|readme-check|fuzz [--minutes M|--seconds N] [TARGET…]>\n\
                 \n  setup        install missing system packages ({})\
                 \n  demo         run the example session end to end\
                 \n  build        supervise, its static turnstile-init beside it, the shim and the test binaries (--release: release build)\
                 \n  test         fmt, clippy, all tests, red-team suite, vm-test --ci, requirement coverage (what CI runs)\
                 \n  redteam      hostile turns through supervise run; table; non-zero on any escape (root)\
                 \n  realsw       CPython's regression tests inside a turn vs. outside, every module of the full set (or those named), then the toolchain workflows (root)\
                 \n  vm-test      the integration and red-team suites in QEMU on Debian kernels 6.1 and 6.12 (or --kernel SERIES|PACKAGE), pure cgroup v2 (root)\
                 \n  bench        turnstile vs bare/unshare/bwrap/crun/runc/runsc; writes bench/RESULTS.md (root)\
                 \n  bench-shim [ROUNDS]  ctr run via the turnstile shim vs the runc v2 shim; its section of bench/RESULTS.md (root)\
                 \n  package      build target/debian/turnstile_<version>_<arch>.deb (alias: deb): supervise, the containerd shim, the systemd unit, the default config, man page, completion (--debug: debug binaries)\
                 \n  bench-serve  supervise run --server vs supervise run vs bare /bin/true (interleaved medians), 8-session throughput, daemon RSS, health latency; writes bench/SERVE.md (root)\
                 \n  bench-ab [--rounds N] DIR…  builds side by side (each DIR from bench-ab --save DIR: the current release build's supervise and turnstile-init): bare /bin/true, each build's cold and served warm turn, interleaved, in an order drawn anew each round; medians and ratios to bare and to the first build (root)\
                 \n  bench-outputs [N] [ROUNDS]  a turn writing N declared outputs (default 100,000, one tree output) vs cp -a + sync; writes bench/OUTPUTS.md (root)\
                 \n  soak [--sessions N] [--threads T] [--minutes M] [--pool-size P]  N sessions (default 1,000) on one serve daemon, T client threads (8), M minutes (10): every turn as expected, every ledger verifies, descriptors and RSS flat, nothing left; writes bench/SOAK.md (root)\
                 \n  fr-coverage  check every in-scope FR-RT-0xx has a test naming it\
                 \n  fuzz         mutated inputs to the manifest, request, envelope, socket, bus and ledger parsers, M minutes or N seconds each (default 60 s); non-zero on a panic, hang or unbounded allocation\
                 \n  readme-check fail when figures the README states (probes, test binaries, commands, Rust version, links) drift from the repository",
                APT_PACKAGES.join(", ")
            );
            std::process::exit(2);
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: $ {}", show(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("spawning {}", show(cmd)))?;
    if !status.success() {
        bail!("`{}` failed with {status}", show(cmd));
    }
    Ok(())
}

fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn is_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn setup() -> Result<()> {
    ensure_init_target();
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !is_installed(p))
        .collect();
    if missing.is_empty() {
        eprintln!(
            "xtask: system packages present: {}",
            APT_PACKAGES.join(", ")
        );
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing packages {}; run as root or: sudo apt-get install -y {}",
            missing.join(", "),
            missing.join(" ")
        );
    }
    apt_install(&missing)
}

/// `apt-get update` then install `packages` (non-interactive, waiting for
/// the dpkg lock).
fn apt_install(packages: &[&str]) -> Result<()> {
    let lock = "DPkg::Lock::Timeout=600";
    run(Command::new("apt-get").args(["-o", lock, "update", "-q"]))?;
    run(Command::new("apt-get")
        .args(["-o", lock, "install", "-y", "-q", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

fn test() -> Result<()> {
    let started = std::time::Instant::now();
    // First: it reads files only, and a stale README fails in a second.
    readme_check::readme_check(&workspace_root())?;
    setup()?;
    fr_coverage()?;
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The init's binary needs its feature (init/Cargo.toml), which the
    // workspace's lint leaves out.
    run(cargo().args([
        "clippy",
        "-p",
        "turnstile-init",
        "--features",
        "standalone",
        "--bin",
        "turnstile-init",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Everything is built before the VM stage starts, so the two stages
    // below never wait on each other's cargo lock.
    let supervisor_tests = build_tests("turnstile-supervisor")?;
    build_bins(false)?;
    // The kernel matrix's reduced set (the full one is `cargo xtask
    // vm-test`, about 40 minutes): Debian 6.1 in QEMU, pure cgroup v2,
    // Landlock ABI 2. It runs beside the host's stages (QEMU is niced:
    // the host's tests keep their priority, the guest takes the idle
    // CPU), its output in a log printed when it ends.
    let vm = VmStage::start()?;
    let host = host_stages(&supervisor_tests);
    // Which of the two stages is the critical path, for the next trim.
    eprintln!(
        "xtask: host stages {} at {} s (the VM stage started at {} s)",
        if host.is_ok() { "passed" } else { "failed" },
        started.elapsed().as_secs(),
        started
            .elapsed()
            .saturating_sub(vm.started.elapsed())
            .as_secs()
    );
    let vm = vm.finish(host.is_err());
    host?;
    vm?;
    let took = started.elapsed();
    eprintln!(
        "xtask: all checks passed in {} min {} s",
        took.as_secs() / 60,
        took.as_secs() % 60
    );
    readme_check::record_ci_time(&workspace_root(), took)?;
    Ok(())
}

/// Builds every test binary of the workspace (`cargo test --workspace
/// --no-run`) and returns those of `package`, to be run as they are.
///
/// `cargo test` of the supervisor package would link cargo's dynamic
/// `supervise` back over the static one `build_bins` makes (its
/// integration test needs the binary), and `cargo test -p` of that
/// package alone resolves features apart from the workspace and rebuilds
/// half of it: so its test binaries, built here with the rest, are run
/// directly, and cargo tests the other packages.
fn build_tests(package: &str) -> Result<Vec<PathBuf>> {
    eprintln!("xtask: $ cargo test --workspace --no-run --message-format json-render-diagnostics");
    let out = cargo()
        .args([
            "test",
            "--workspace",
            "--no-run",
            "--message-format",
            "json-render-diagnostics",
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --workspace --no-run failed: {}", out.status);
    }
    let suffix = format!("#{package}@");
    let tests: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| {
            m["reason"] == "compiler-artifact"
                && m["profile"]["test"] == true
                && m["package_id"]
                    .as_str()
                    .is_some_and(|id| id.contains(&suffix))
        })
        .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
        .collect();
    if tests.is_empty() {
        bail!("cargo test --no-run named no test binary of {package}");
    }
    Ok(tests)
}

/// The host's stages of `test`: every test binary, then the red team on
/// each backend.
fn host_stages(supervisor_tests: &[PathBuf]) -> Result<()> {
    // The supervisor's own test binaries, as cargo runs them (from the
    // package's directory), against the static `supervise`; then every
    // other package through cargo (see `build_tests`).
    let dir = workspace_root().join("supervisor");
    let mut failed = Vec::new();
    for t in supervisor_tests {
        eprintln!("xtask: $ {}", t.display());
        if !Command::new(t).current_dir(&dir).status()?.success() {
            failed.push(t.display().to_string());
        }
    }
    let rest = run(cargo().args([
        "test",
        "--workspace",
        "--exclude",
        "turnstile-supervisor",
        "--no-fail-fast",
    ]));
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    rest?;
    redteam(&[])?;
    // The same suite through the runc backend (differences in
    // redteam::DIFFERENCES, each with its reason).
    redteam(&["--backend".to_owned(), "runc".to_owned()])?;
    redteam(&["--backend".to_owned(), "crun".to_owned()])?;
    redteam(&["--backend".to_owned(), "runsc".to_owned()])?;
    Ok(())
}

/// `vm-test --ci` in a process of its own, its output in a log file.
struct VmStage {
    child: std::process::Child,
    log: PathBuf,
    started: std::time::Instant,
}

impl VmStage {
    fn start() -> Result<Self> {
        let dir = workspace_root().join("target/vm-tests");
        std::fs::create_dir_all(&dir)?;
        let log = dir.join("ci-stage.log");
        let out = std::fs::File::create(&log).with_context(|| log.display().to_string())?;
        let mut cmd = Command::new(std::env::current_exe().context("the xtask binary")?);
        cmd.args(["vm-test", "--ci"])
            .current_dir(workspace_root())
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        eprintln!(
            "xtask: $ {} (in the background; output in {})",
            show(&cmd),
            log.display()
        );
        Ok(Self {
            child: cmd.spawn().context("spawning vm-test --ci")?,
            log,
            started: std::time::Instant::now(),
        })
    }

    /// Waits for the stage (stops it first when the host's stages failed:
    /// the run fails anyway) and prints its log.
    fn finish(mut self, abandon: bool) -> Result<()> {
        if abandon {
            let _ = self.child.kill();
        }
        let status = self.child.wait().context("waiting for vm-test --ci")?;
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        eprintln!(
            "xtask: ---- vm-test --ci ({} s, {status}) ----\n{log}xtask: ---- end of vm-test --ci ----",
            self.started.elapsed().as_secs()
        );
        if abandon {
            bail!("vm-test --ci stopped: the host's stages failed");
        }
        if !status.success() {
            bail!(
                "vm-test --ci failed with {status} (log: {})",
                self.log.display()
            );
        }
        Ok(())
    }
}

/// The target `turnstile-init` is built for: static, no glibc start-up
/// (see init/Cargo.toml and `sandbox::initbin`).
const INIT_TARGET: &str = "x86_64-unknown-linux-musl";

/// Whether rustup has [`INIT_TARGET`]'s standard library, adding it when
/// not (`setup`, and every build of the init). A toolchain without rustup,
/// or offline, builds the init for the host instead: the same code, ~1 ms
/// slower to start per turn; said, not hidden.
fn ensure_init_target() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(add_init_target)
}

fn add_init_target() -> bool {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == INIT_TARGET)
        });
    if installed {
        return true;
    }
    eprintln!("xtask: $ rustup target add {INIT_TARGET}");
    let added = Command::new("rustup")
        .args(["target", "add", INIT_TARGET])
        .status()
        .is_ok_and(|s| s.success());
    if !added {
        eprintln!(
            "xtask: note: no {INIT_TARGET} standard library (rustup target add {INIT_TARGET} failed): \
             turnstile-init is built for the host, and each cold turn starts it ~1 ms slower"
        );
    }
    added
}

/// Builds `turnstile-init` and puts it beside `supervise` in
/// `target/{debug,release}` (where `sandbox::initbin::path` looks): for
/// [`INIT_TARGET`], or the host when that target cannot be had. Written
/// as a new file renamed over the old, so a running turn's init is never
/// rewritten under it.
fn build_init(release: bool) -> Result<()> {
    let musl = ensure_init_target();
    let mut c = cargo();
    c.args([
        "build",
        "--quiet",
        "-p",
        "turnstile-init",
        "--features",
        "standalone",
        "--bin",
        "turnstile-init",
    ]);
    if musl {
        c.args(["--target", INIT_TARGET]);
    }
    if release {
        c.arg("--release");
    }
    run(&mut c)?;
    let profile = if release { "release" } else { "debug" };
    let target = workspace_root().join("target");
    let built = if musl {
        target.join(INIT_TARGET).join(profile)
    } else {
        target.join(profile)
    }
    .join("turnstile-init");
    let dest = target.join(profile).join("turnstile-init");
    if built != dest {
        // Two xtask stages may build at once (the VM stage beside the
        // host's): each copies to a name of its own, and the rename is
        // atomic.
        let tmp = dest.with_extension(format!("new.{}", std::process::id()));
        std::fs::copy(&built, &tmp)
            .with_context(|| format!("{} -> {}", built.display(), tmp.display()))?;
        std::fs::rename(&tmp, &dest).with_context(|| format!("rename to {}", dest.display()))?;
    }
    Ok(())
}

/// Builds `supervise` and the tests crate's binaries (redteam, bench),
/// and `turnstile-init` beside them.
fn build_bins(release: bool) -> Result<()> {
    build_init(release)?;
    let mut c = cargo();
    c.args([
        "build",
        "--quiet",
        "-p",
        "turnstile-tests",
        "-p",
        "containerd-shim-turnstile-v2",
        "--bins",
    ]);
    if release {
        c.arg("--release");
    }
    run(&mut c)?;
    build_supervise(release)
}

/// Links `supervise` against glibc statically (`crt-static`, a static
/// PIE): no `ld.so` at each start — no libc and libm to find, map and
/// relocate against, no symbol lookups — and a process of fewer mappings
/// to fork. Every turn starts the binary once (a `run`, a served client,
/// a serve worker, the runc guard): 2.56 → 2.06 ms for `--version`, a
/// cold turn 15.14 → 14.14 ms (40 interleaved rounds). It resolves no
/// names through NSS (no `getaddrinfo`, `getpwnam`: the linker would
/// warn), so nothing in it needs glibc's shared objects at run time.
///
/// The flag goes to this one binary's final compilation (`cargo rustc`):
/// set for the whole build it would reach the proc-macro crates, which
/// cannot be built with it. Only the link differs from `cargo build`'s
/// binary, which cargo keeps beside it (another hash): a later `cargo
/// build` or `cargo test` of the supervisor package links that one back
/// (`cargo xtask test` runs the supervisor's own test targets before this).
fn build_supervise(release: bool) -> Result<()> {
    let mut c = cargo();
    c.args([
        "rustc",
        "--quiet",
        "-p",
        "turnstile-supervisor",
        "--bin",
        "supervise",
    ]);
    if release {
        c.arg("--release");
    }
    c.args(["--", "-C", "target-feature=+crt-static"]);
    run(&mut c)?;
    // Said, not assumed: a dynamic binary run with the loader's trace set
    // lists its shared objects and exits; a static one has no loader and
    // answers `--version` itself.
    let bin = workspace_root()
        .join("target")
        .join(if release { "release" } else { "debug" })
        .join("supervise");
    let out = Command::new(&bin)
        .arg("--version")
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .output()
        .with_context(|| format!("run {}", bin.display()))?;
    if !out.status.success() || !out.stdout.starts_with(b"supervise ") {
        bail!(
            "{} is not statically linked: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(())
}

/// `fuzz [--minutes M | --seconds N] [TARGET…]`: the parsers' mutation
/// fuzzer (tests/src/bin/fuzz.rs), 60 seconds per target unless told.
fn fuzz(args: &[String]) -> Result<()> {
    build_bins(false)?;
    let mut cmd = Command::new(workspace_root().join("target/debug/fuzz"));
    if !args.iter().any(|a| a == "--seconds" || a == "--minutes") {
        cmd.args(["--seconds", "60"]);
    }
    run(cmd.args(args))
}

/// Runs the red-team suite (tests/src/redteam.rs) and prints its table.
/// `redteam [--backend NAME] [FILTER]`: the suite against one backend.
fn redteam(args: &[String]) -> Result<()> {
    build_bins(false)?;
    let mut cmd = Command::new(workspace_root().join("target/debug/redteam"));
    let mut rest = args.iter();
    while let Some(a) = rest.next() {
        if a == "--backend" {
            let name = rest.next().context("--backend needs a name")?;
            cmd.env("TURNSTILE_REDTEAM_BACKEND", name);
        } else {
            cmd.arg(a);
        }
    }
    run(&mut cmd)
}

/// The real-software suite in full (tests/src/realsw/, bin `realsw`):
/// every CPython module of `realsw::modules::ALL` (or the ones named)
/// inside a turn vs. outside, with the table; then, without arguments, the
/// toolchain workflows of tests/tests/realsw.rs. `cargo xtask test` runs
/// the issue's eight modules and the workflows.
fn realsw(modules: &[String]) -> Result<()> {
    setup()?;
    build_bins(false)?;
    run(Command::new(workspace_root().join("target/debug/realsw")).args(modules))?;
    if modules.is_empty() {
        run(cargo().args([
            "test",
            "-p",
            "turnstile-tests",
            "--test",
            "realsw",
            "--",
            "--skip",
            "issue_9_cpython_",
        ]))?;
    }
    Ok(())
}

/// Benchmark peers: installed when missing (reported as missing otherwise).
const BENCH_PACKAGES: &[&str] = &[
    "hyperfine",
    "bubblewrap",
    "runc",
    "crun",
    "runsc",
    "busybox-static",
    "util-linux",
];

/// Runs the benchmark (release build) in a private mount namespace whose
/// /sys/fs/cgroup/unified is hidden, so crun accepts this hybrid layout
/// (MACHINE-NOTES); every system sees the same view.
fn bench(args: &[String]) -> Result<()> {
    // `bench network`: only the network policy's cost (BENCH_ONLY=network).
    let only = match args.first().map(String::as_str) {
        None => None,
        Some("network") => Some("network"),
        Some(other) => bail!("bench: unknown section `{other}` (only `network` runs alone)"),
    };
    setup()?;
    let missing: Vec<&str> = BENCH_PACKAGES
        .iter()
        .copied()
        .filter(|p| !is_installed(p))
        .collect();
    if !missing.is_empty() && is_root() {
        // Best effort: a peer that cannot be installed is reported as missing.
        let _ = apt_install(&missing);
    }
    build_bins(true)?;
    let root = workspace_root();
    let bin = root.join("target/release/bench");
    let script = "mount -t tmpfs none /sys/fs/cgroup/unified 2>/dev/null; exec \"$0\" \"$@\"";
    let mut cmd = Command::new("unshare");
    if let Some(only) = only {
        cmd.env("BENCH_ONLY", only);
    }
    run(cmd
        .args(["-m", "--propagation", "private", "sh", "-c", script])
        .arg(&bin)
        .arg(root.join("bench"))
        .current_dir(&root))
}

/// `ctr run --rm` through the turnstile shim vs the runc v2 shim on a
/// private containerd (tests/src/bin/bench_shim.rs); not part of `test`.
fn bench_shim(args: &[String]) -> Result<()> {
    setup()?;
    build_bins(true)?;
    let root = workspace_root();
    run(Command::new(root.join("target/release/bench_shim"))
        .arg(root.join("bench"))
        .args(args)
        .current_dir(&root))
}

/// `soak [--sessions N] [--threads T] [--minutes M] [--pool-size P]`: many
/// sessions on one `supervise serve` daemon (tests/src/soak.rs, bin
/// `soak`), release build; writes bench/SOAK.md. Not part of `test`.
fn soak(args: &[String]) -> Result<()> {
    if !is_root() {
        bail!("soak needs root (the native sandbox)");
    }
    build_bins(true)?;
    let root = workspace_root();
    run(Command::new(root.join("target/release/soak"))
        .args(args)
        .arg("--out")
        .arg(root.join("bench/SOAK.md"))
        .current_dir(&root))
}

/// Every in-scope requirement has a test whose name contains `fr_rt_0xx`.
fn fr_coverage() -> Result<()> {
    let root = workspace_root();
    let mut sources = String::new();
    for dir in ["policy", "supervisor", "tests"] {
        collect_rs(&root.join(dir), &mut sources)?;
    }
    let test_names: Vec<&str> = sources
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("fn "))
        .filter_map(|l| l.split('(').next())
        .collect();
    let missing: Vec<String> = REQUIRED_FRS
        .iter()
        .map(|n| format!("fr_rt_{n:03}"))
        .filter(|fr| !test_names.iter().any(|t| t.contains(fr.as_str())))
        .collect();
    if !missing.is_empty() {
        bail!(
            "requirements without a test naming them: {}",
            missing.join(", ")
        );
    }
    eprintln!(
        "xtask: every in-scope requirement has a named test ({} FRs)",
        REQUIRED_FRS.len()
    );
    Ok(())
}

fn collect_rs(dir: &Path, out: &mut String) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let path = entry?.path();
        if path.is_dir() {
            collect_rs(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path)?);
            out.push('\n');
        }
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Runs `supervise`, echoing the command line and its output, and checks the
/// exit status.
fn supervise(bin: &Path, args: &[&str], expect: i32) -> Result<String> {
    println!("\n$ supervise {}", args.join(" "));
    let out = Command::new(bin).args(args).output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let code = out.status.code().unwrap_or(-1);
    println!("(exit {code})");
    if code != expect {
        bail!("expected exit {expect}, got {code}");
    }
    Ok(stdout)
}

fn demo() -> Result<()> {
    setup()?;
    run(cargo().args(["build", "--quiet", "-p", "turnstile-supervisor"]))?;
    build_init(false)?;
    let root = workspace_root();
    let bin = root.join("target/debug/supervise");
    let demo = root.join("target/demo");
    if demo.exists() {
        std::fs::remove_dir_all(&demo)?;
    }
    let ws = demo.join("workspace");
    let state = demo.join("state");
    copy_tree(&root.join("examples/workspace"), &ws)?;
    let (ws_s, state_s) = (ws.display().to_string(), state.display().to_string());
    let base = ["--root", ws_s.as_str(), "--state-dir", state_s.as_str()];
    let with = |words: &[&str], rest: &[&str]| -> Vec<String> {
        words
            .iter()
            .chain(base.iter())
            .chain(rest.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let call = |argv: Vec<String>, expect: i32| -> Result<String> {
        let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
        supervise(&bin, &refs, expect)
    };

    println!("turnstile demo: workspace {}", ws.display());
    call(vec!["doctor".into()], 0)?;
    let sid = call(with(&["session", "new"], &[]), 0)?.trim().to_owned();
    let turn = |title: &str, rest: &[&str], expect: i32| -> Result<String> {
        println!("\n# {title}");
        let mut args = vec!["--package", "hello-agent", "--session", sid.as_str()];
        args.extend_from_slice(rest);
        call(with(&["run"], &args), expect)
    };

    turn(
        "Turn 1 commits: python3 reads the registry and writes the declared report.",
        &[
            "--input",
            "registries/users.csv",
            "--output",
            "output/<session_id>/report.md:report",
            "--",
            "/usr/bin/python3",
            "installed/hello-agent/main.py",
            "output/<session_id>/report.md",
        ],
        0,
    )?;
    let report = ws.join("output").join(&sid).join("report.md");
    println!(
        "committed {}: {}",
        report.display(),
        std::fs::read_to_string(&report)?.trim()
    );

    turn(
        "Turn 2 is blocked: it declares summary.md but writes report2.md; nothing is committed.",
        &[
            "--output",
            "output/<session_id>/summary.md:summary",
            "--",
            "/usr/bin/python3",
            "installed/hello-agent/main.py",
            "output/<session_id>/report2.md",
        ],
        12,
    )?;
    println!(
        "on the host, report2.md exists: {}",
        ws.join("output").join(&sid).join("report2.md").exists()
    );

    turn(
        "Turn 3 never runs: a shell is no execute entry and secrets/ is forbidden.",
        &[
            "--no-outputs",
            "--input",
            "installed/hello-agent/secrets/api-key.txt",
            "--",
            "/bin/sh",
            "-c",
            "cat installed/hello-agent/secrets/api-key.txt",
        ],
        11,
    )?;

    println!("\n# Evidence summary (planes/ho1/sessions/{sid}/ledger/evidence.jsonl)");
    let evidence = std::fs::read_to_string(
        ws.join("planes/ho1/sessions")
            .join(&sid)
            .join("ledger/evidence.jsonl"),
    )?;
    for line in evidence.lines() {
        let e: serde_json::Value = serde_json::from_str(line)?;
        let text = |v: &serde_json::Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        println!(
            "  seq {:<3} {:<16} turn {:<5} status {:<10} committed {:<2} violations {}",
            e["seq"],
            text(&e["event"]),
            text(&e["turn_number"]),
            text(&e["status"]),
            e["committed"].as_array().map_or(0, Vec::len),
            e["violations"].as_array().map_or(0, Vec::len),
        );
    }

    println!("\n# Both ledgers verify: every hash, link and the acknowledged head.");
    call(with(&["ledger", "verify"], &["--session", &sid]), 0)?;
    println!(
        "\nDemo complete. Inspect {} and {}.",
        ws.display(),
        state.display()
    );
    Ok(())
}

/// `cargo xtask deb [--debug]`: a .deb with `supervise`, the containerd
/// shim and the systemd unit of `supervise serve`, built with dpkg-deb
/// (no cargo-deb needed). Prints the path of the package.
/// The package's maintainer scripts. They run chrootless too (`dpkg
/// --root DIR --force-script-chrootless`, as the install test does), so
/// every path is under `$DPKG_ROOT`, and systemd is touched only when it
/// runs the host being installed to.
const POSTINST: &str = r#"#!/bin/sh
set -e
install -d -m 0700 "$DPKG_ROOT/var/lib/turnstile"
# The unit is not enabled or started by the package: an operator decides
# (README "Operate the daemon").
if [ -z "$DPKG_ROOT" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
"#;

const PRERM: &str = r#"#!/bin/sh
set -e
# A running daemon interrupts its in-flight turns (recorded) and exits.
if [ -z "$DPKG_ROOT" ] && [ -d /run/systemd/system ]; then
    systemctl stop turnstile-serve.service || true
fi
"#;

const POSTRM: &str = r#"#!/bin/sh
set -e
if [ "$1" = purge ]; then
    state="$DPKG_ROOT/var/lib/turnstile"
    rm -rf "$DPKG_ROOT/run/turnstile"
    rmdir "$DPKG_ROOT/etc/turnstile" 2>/dev/null || true
    # The state dir holds the ledgers' anchors: evidence is never deleted
    # by a package manager. Without any session it goes.
    if [ -d "$state" ]; then
        if [ -n "$(ls -A "$state/sessions" 2>/dev/null)" ]; then
            echo "turnstile: kept $state (session state: the ledgers' anchors); remove it by hand once the evidence is archived" >&2
        else
            rm -rf "$state"
        fi
    fi
    if [ -z "$DPKG_ROOT" ] && [ -d /run/systemd/system ]; then
        systemctl daemon-reload || true
    fi
fi
"#;

/// The default system configuration the package installs (a conffile):
/// the built-in tables, written out so an operator sees what to change.
const DEFAULT_CONFIG_JSON: &str = r#"{
  "backends": {"trusted": "native", "standard": "native", "untrusted": "kata", "confidential": "kata"},
  "minimum_backends": {},
  "preimage_retention_bytes": 1073741824
}
"#;

/// `package [--debug]` (alias `deb`): builds
/// target/debian/turnstile_<version>_<arch>.deb — supervise, the containerd
/// shim, the systemd unit, the default config (a conffile), the man page,
/// bash completion, README and example shim config; maintainer scripts
/// that never enable the unit and never delete evidence.
fn package(args: &[String]) -> Result<()> {
    let release = !args.iter().any(|a| a == "--debug");
    let root = workspace_root();
    // --no-build: package the binaries as they are (the install test uses
    // those `cargo test --workspace` built: building them again with
    // `-p` would unify features differently and rebuild everything).
    if !args.iter().any(|a| a == "--no-build") {
        let mut c = cargo();
        c.args([
            "build",
            "-p",
            "turnstile-supervisor",
            "-p",
            "containerd-shim-turnstile-v2",
            "--bins",
        ]);
        if release {
            c.arg("--release");
        }
        run(&mut c)?;
        build_supervise(release)?;
        build_init(release)?;
    }
    let profile = if release { "release" } else { "debug" };
    let version = env!("CARGO_PKG_VERSION");
    let arch = Command::new("dpkg")
        .arg("--print-architecture")
        .output()
        .context("dpkg --print-architecture")?;
    let arch = String::from_utf8_lossy(&arch.stdout).trim().to_owned();
    if arch.is_empty() {
        bail!("dpkg --print-architecture printed nothing");
    }
    let out_dir = root.join("target/debian");
    let stage = out_dir.join(format!("turnstile_{version}_{arch}"));
    if stage.exists() {
        std::fs::remove_dir_all(&stage).with_context(|| format!("remove {}", stage.display()))?;
    }
    let write = |to: &str, bytes: &[u8], mode: u32| -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dest = stage.join(to);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&dest, bytes).with_context(|| dest.display().to_string())?;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    let read = |p: &Path| std::fs::read(p).with_context(|| p.display().to_string());
    let bin = root.join("target").join(profile);
    let supervise = bin.join("supervise");
    write("usr/bin/supervise", &read(&supervise)?, 0o755)?;
    // The sandbox's init, run from beside `supervise` (sandbox::initbin).
    write(
        "usr/bin/turnstile-init",
        &read(&bin.join("turnstile-init"))?,
        0o755,
    )?;
    write(
        "usr/bin/containerd-shim-turnstile-v2",
        &read(&bin.join("containerd-shim-turnstile-v2"))?,
        0o755,
    )?;
    write(
        "lib/systemd/system/turnstile-serve.service",
        &read(&root.join("packaging/turnstile-serve.service"))?,
        0o644,
    )?;
    write(
        "etc/turnstile/config.json",
        DEFAULT_CONFIG_JSON.as_bytes(),
        0o644,
    )?;
    write(
        "usr/share/doc/turnstile/README.md",
        &read(&root.join("README.md"))?,
        0o644,
    )?;
    write(
        "usr/share/doc/turnstile/examples/shim.json",
        &read(&root.join("examples/kubernetes/shim.json"))?,
        0o644,
    )?;
    let generated = |args: &[&str]| -> Result<Vec<u8>> {
        let out = Command::new(&supervise)
            .args(args)
            .output()
            .with_context(|| format!("supervise {}", args.join(" ")))?;
        if !out.status.success() {
            bail!("supervise {} failed", args.join(" "));
        }
        Ok(out.stdout)
    };
    let man = generated(&["man"])?;
    let mut gz = Vec::new();
    {
        let mut child = Command::new("gzip")
            .args(["-9n"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("gzip")?;
        use std::io::Write;
        child.stdin.take().context("gzip stdin")?.write_all(&man)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("gzip failed");
        }
        gz.extend_from_slice(&out.stdout);
    }
    write("usr/share/man/man1/supervise.1.gz", &gz, 0o644)?;
    write(
        "usr/share/bash-completion/completions/supervise",
        &generated(&["completions", "bash"])?,
        0o644,
    )?;
    let control = format!(
        "Package: turnstile\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: turnstile developers <turnstile@example.invalid>\n\
         Depends: libc6, libseccomp2\n\
         Recommends: runc, crun, runsc, containerd\n\
         Section: admin\n\
         Priority: optional\n\
         Homepage: https://example.invalid/turnstile\n\
         Description: sandbox supervisor for AI-agent turns\n \
         supervise runs each turn of an agent as one command in a fresh sandbox\n \
         (namespaces, overlay capture, Landlock, seccomp, cgroups), commits only\n \
         declared writes and keeps hash-chained ledgers. Includes the daemon's\n \
         systemd unit (turnstile-serve.service) and the containerd shim\n \
         containerd-shim-turnstile-v2.\n"
    );
    write("DEBIAN/control", control.as_bytes(), 0o644)?;
    write("DEBIAN/conffiles", b"/etc/turnstile/config.json\n", 0o644)?;
    write("DEBIAN/postinst", POSTINST.as_bytes(), 0o755)?;
    write("DEBIAN/prerm", PRERM.as_bytes(), 0o755)?;
    write("DEBIAN/postrm", POSTRM.as_bytes(), 0o755)?;
    let deb = out_dir.join(format!("turnstile_{version}_{arch}.deb"));
    // Debug binaries are hundreds of MB of debug info: xz would take
    // minutes; they are for tests, stored uncompressed.
    let compression: &[&str] = if release { &[] } else { &["-Znone"] };
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group"])
        .args(compression)
        .arg("--build")
        .arg(&stage)
        .arg(&deb))?;
    println!("{}", deb.display());
    Ok(())
}

/// A daemon and its scratch directory for `bench-serve`; stopped (SIGTERM)
/// and removed when dropped, even when the benchmark fails.
struct BenchDaemon {
    child: std::process::Child,
    dir: PathBuf,
}

impl BenchDaemon {
    /// Starts `sup serve` on `state` and `socket` (its log in
    /// `dir/daemon.log`; `dir` is removed with it) and waits until it
    /// answers.
    fn start(sup: &Path, dir: &Path, state: &Path, socket: &Path) -> Result<Self> {
        let log = dir.join("daemon.log");
        let child = Command::new(sup)
            .args(["serve", "--state-dir"])
            .arg(state)
            .arg("--socket")
            .arg(socket)
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("start {} serve", sup.display()))?;
        let daemon = Self {
            child,
            dir: dir.to_path_buf(),
        };
        let t0 = std::time::Instant::now();
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            if t0.elapsed() > std::time::Duration::from_secs(10) {
                bail!("the daemon did not start (see {})", log.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(daemon)
    }
}

/// `sup session new` in workspace `ws`: the new session's id.
fn new_session(sup: &Path, ws: &Path, state: &Path) -> Result<String> {
    let o = Command::new(sup)
        .args(["session", "new", "--root"])
        .arg(ws)
        .arg("--state-dir")
        .arg(state)
        .output()?;
    if !o.status.success() {
        bail!("session new: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn timed(cmd: &mut Command) -> Result<f64> {
    let t = std::time::Instant::now();
    let st = cmd.status().with_context(|| show(cmd))?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    if !st.success() {
        bail!("`{}` failed with {st}", show(cmd));
    }
    Ok(ms)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// `cargo xtask bench-serve [N]`: whole-process latency of
/// `supervise run --server S -- /bin/true`, `supervise run -- /bin/true`
/// and bare `/bin/true`, interleaved (N rounds, default 200); 8 sessions
/// in parallel through the daemon for 10 s; the daemon's RSS idle and after
/// load; `supervise health --server` latency. Release build, root.
fn bench_serve(args: &[String]) -> Result<()> {
    if !is_root() {
        bail!("bench-serve needs root (the native sandbox)");
    }
    let rounds: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(200);
    run(cargo().args(["build", "--release", "-p", "turnstile-supervisor", "--bins"]))?;
    build_init(true)?;
    let root = workspace_root();
    let sup = root.join("target/release/supervise");
    let dir = std::env::temp_dir().join(format!("ts-bench-serve-{}", std::process::id()));
    let ws = dir.join("ws");
    let state = dir.join("state");
    let socket = dir.join("serve.sock");
    std::fs::create_dir_all(ws.join("installed/b"))?;
    std::fs::write(
        ws.join("installed/b/manifest.json"),
        r#"{"capabilities": {"execute": ["/bin/true"]}}"#,
    )?;
    let daemon = BenchDaemon::start(&sup, &dir, &state, &socket)?;
    std::thread::sleep(std::time::Duration::from_millis(500));
    let idle_rss = rss_kib(daemon.child.id());
    let session = |sup: &Path| new_session(sup, &ws, &state);
    let turn = |sid: &str, server: bool| {
        let mut c = Command::new(&sup);
        c.args(["run", "--root"])
            .arg(&ws)
            .arg("--state-dir")
            .arg(&state)
            .args(["--package", "b", "--session", sid, "--no-outputs"]);
        if server {
            c.arg("--server").arg(&socket);
        }
        c.args(["--", "/bin/true"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        c
    };
    let (local_sid, served_sid) = (session(&sup)?, session(&sup)?);
    // Warm-up (page cache, first cgroup creation).
    for _ in 0..5 {
        timed(&mut turn(&local_sid, false))?;
        timed(&mut turn(&served_sid, true))?;
    }
    let (mut bare, mut local, mut served) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds {
        for k in order::round_order(i, 3) {
            match k {
                0 => bare.push(timed(&mut Command::new("/bin/true"))?),
                1 => local.push(timed(&mut turn(&local_sid, false))?),
                _ => served.push(timed(&mut turn(&served_sid, true))?),
            }
        }
    }
    // 8 sessions in parallel, 10 s, through the daemon, then locally.
    let throughput = |server: bool| -> Result<f64> {
        let sids: Vec<String> = (0..8).map(|_| session(&sup)).collect::<Result<_>>()?;
        let stop = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let t = std::time::Instant::now();
        let counts: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = sids
                .iter()
                .map(|sid| {
                    let mk = || turn(sid, server);
                    s.spawn(move || {
                        let mut n = 0;
                        while std::time::Instant::now() < stop {
                            if mk().status().is_ok_and(|st| st.success()) {
                                n += 1;
                            }
                        }
                        n
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        Ok(counts.iter().sum::<usize>() as f64 / t.elapsed().as_secs_f64())
    };
    // Which sandbox the served turns got (the daemon keeps each session's
    // worker with the next turn's sandbox warm).
    let served_sandbox = {
        let o = Command::new(&sup)
            .args(["run", "--root"])
            .arg(&ws)
            .arg("--state-dir")
            .arg(&state)
            .args([
                "--package",
                "b",
                "--session",
                &served_sid,
                "--no-outputs",
                "--json",
            ])
            .arg("--server")
            .arg(&socket)
            .args(["--", "/bin/true"])
            .output()?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        v["durations"]["sandbox"].as_str().unwrap_or("?").to_owned()
    };
    let tput_served = throughput(true)?;
    let loaded_rss = rss_kib(daemon.child.id());
    let tput_local = throughput(false)?;
    let mut health = Vec::new();
    for _ in 0..100 {
        health.push(timed(
            Command::new(&sup)
                .args(["health", "--server"])
                .arg(&socket)
                .stdout(std::process::Stdio::null()),
        )?);
    }
    let (b50, l50, s50) = (
        percentile(&mut bare, 0.5),
        percentile(&mut local, 0.5),
        percentile(&mut served, 0.5),
    );
    let (l90, s90) = (percentile(&mut local, 0.9), percentile(&mut served, 0.9));
    let h50 = percentile(&mut health, 0.5);
    // The commit measured, as bench/RESULTS.md names its own.
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(workspace_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "unknown".to_owned(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        );
    let report = format!(
        "# supervise serve: measurements\n\n\
         Release build at commit `{commit}`, {rounds} interleaved rounds, whole-process wall time of each command \
         (spawn to exit) measured by `cargo xtask bench-serve`, this machine (2 cores).\n\n\
         | what | median ms | p90 ms | ratio to bare |\n|---|---|---|---|\n\
         | bare `/bin/true` | {b50:.2} | {:.2} | 1.0 |\n\
         | `supervise run -- /bin/true` | {l50:.2} | {l90:.2} | {:.1}x |\n\
         | `supervise run --server S -- /bin/true` ({served_sandbox} sandbox) | {s50:.2} | {s90:.2} | {:.1}x |\n\n\
         | target (issue 14) | measured | met |\n|---|---|---|\n\
         | served turn <= 2x bare exec | {:.1}x | {} |\n\
         | 8 sessions >= 300 turns/s through the daemon | {tput_served:.0} turns/s (local `run`: {tput_local:.0}) | {} |\n\
         | daemon RSS <= 10 MiB idle | {:.1} MiB idle, {:.1} MiB after the load | {} |\n\
         | `supervise health --server` p50 < 10 ms | {h50:.2} ms (whole process) | {} |\n",
        percentile(&mut bare, 0.9),
        l50 / b50,
        s50 / b50,
        s50 / b50,
        if s50 <= 2.0 * b50 { "yes" } else { "no" },
        if tput_served >= 300.0 { "yes" } else { "no" },
        idle_rss as f64 / 1024.0,
        loaded_rss as f64 / 1024.0,
        if idle_rss <= 10 * 1024 { "yes" } else { "no" },
        if h50 < 10.0 { "yes" } else { "no" },
    );
    print!("{report}");
    std::fs::write(root.join("bench/SERVE.md"), &report)?;
    drop(daemon);
    Ok(())
}
