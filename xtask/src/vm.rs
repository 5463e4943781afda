//! `cargo xtask vm-test [--kernel NAME]`: the security test harness in VMs.
//!
//! For each kernel of the matrix (a stock Debian kernel package, fetched
//! with `apt-get download` and unpacked with `dpkg-deb -x`, never
//! installed on the host) this builds an initramfs (busybox-static,
//! `vm-tests/init`, the modules the guest needs, loaded dependencies
//! first), boots it in QEMU (TCG: KVM hangs on these hosts) with a pure
//! cgroup v2 hierarchy, and runs the suites inside as root: the
//! `turnstile-tests` integration binaries and the red-team suite, with
//! `TURNSTILE_REQUIRE_KERNEL=1`. The guest's root is the host's `/`,
//! shared read-only over 9p under a tmpfs overlay, so the guest runs the
//! very binaries cargo built here (see `vm-tests/init`).
//!
//! Results come back on the serial console; `vm-tests/guest.sh` ends with
//! `TURNSTILE-VM-END status=N`. No marker, a non-zero status, a failed
//! suite or the timeout fail the run. QEMU never outlives xtask: it runs
//! under `setpriv --pdeathsig KILL` and is killed and reaped on every path
//! out of [`boot`].

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo, run, show, workspace_root};

/// The kernel series of the default matrix: Debian bookworm's 6.1
/// (Landlock ABI 2) and bookworm-backports' 6.12 (ABI 6), newest build of
/// each that the package lists have.
const DEFAULT_SERIES: &[&str] = &["6.1", "6.12"];

/// Modules the guest needs, by name; their dependencies are added from
/// each module's own `depends=` (the package ships no modules.dep).
/// Built-in ones (modules.builtin) are skipped.
const GUEST_MODULES: &[&str] = &[
    "virtio_pci",     // the bus of the 9p share and the scratch disk
    "9pnet_virtio",   // the host share's transport
    "9p",             // the host share
    "overlay",        // the guest root, and every turn's capture layer
    "virtio_blk",     // the scratch disk
    "ext4",           // /tmp: supports idmapped mounts on 6.1 (tmpfs: 6.3+)
    "crc32c_generic", // ext4 asks the crypto API for crc32c at mount time
    "loop",           // tests that need a small file system of their own
];

/// Whole-VM budget per kernel (boot, every suite, power-off).
const DEFAULT_TIMEOUT_SECS: u64 = 45 * 60;
/// One suite's budget inside the guest.
const SUITE_TIMEOUT_SECS: u64 = 20 * 60;

/// The reduced set `cargo xtask test` (CI) runs (`vm-test --ci`): the
/// kernel that differs most from the hosts (6.1: Landlock ABI 2, pure
/// cgroup v2), the suites that exercise the kernel (turns and their
/// limits, health and doctor, denials, the OCI backends) and the whole
/// red-team suite. 7.5 minutes measured; the full matrix takes 40-50.
const CI_KERNEL: &str = "6.1";
const CI_TESTS: &[&str] = &["run", "health", "doctor_plan", "denials", "backends"];

/// Tests of those suites the CI's VM run leaves to the host (`cargo xtask
/// test` runs them there) and to the full matrix (`cargo xtask vm-test`):
/// each repeats many turns on every OCI backend — minutes under TCG — to
/// prove backend behaviour the guest's older kernel does not change.
///
/// And one loop: 100,000 refused `mount` calls, each a seccomp user
/// notification the supervisor answers (16 s on the host, the most of the
/// guest's `denials` suite under TCG). The guest still proves a seccomp
/// refusal's record (`fr_rt_011_a_denied_syscall_is_one_violation_…`) and
/// the observer's counting and bound over 100,000 denials
/// (`issue_27_fr_rt_011_100000_denied_opens_…`).
const CI_HOST_ONLY: &[&str] = &[
    "issue_22_no_backend_changes_a_host_inode_whatever_the_stdin",
    "issue_23_outputs_in_new_directories_commit_and_the_rules_still_block",
    "issue_25_evidence_names_who_applied_each_layer_per_backend",
    "fr_rt_011_a_loop_of_100000_denials_is_one_counted_violation_and_bounded",
];

/// Red-team families the CI's VM run leaves to the host (which runs them on
/// every backend) and to the full matrix, with the reason: they attack the
/// supervisor's own logic, which no kernel changes.
const CI_REDTEAM_SKIP: &[(&str, &str)] = &[
    (
        "request-validation",
        "hostile requests refused before any sandbox exists: parsing and policy, no kernel call",
    ),
    (
        "ledger",
        "tampered and forged ledgers refused by hash-chain verification: file bytes, no kernel call",
    ),
];

/// Integration-test binaries that do not run in the VM, with the reason.
const SKIPPED_TESTS: &[(&str, &str)] = &[
    (
        "realsw",
        "CPython's regression suite and toolchain workflows: hours under TCG; the host runs them (`cargo xtask test`, `cargo xtask realsw`)",
    ),
    (
        "package",
        "builds the .deb with cargo and dpkg, which the guest does not carry: packaging, not a kernel property (the host runs it)",
    ),
    (
        "report",
        "renders the session page in headless chromium, which the VM image does not carry: a browser test, not a kernel one (the host runs it)",
    ),
];

#[derive(Debug, Default)]
struct Options {
    kernels: Vec<String>,
    timeout: Duration,
    /// Integration-test binaries to run (by name, e.g. `run`); all but
    /// [`SKIPPED_TESTS`] when empty.
    tests: Vec<String>,
    redteam: bool,
    /// Red-team families left out of the guest's run ([`CI_REDTEAM_SKIP`]
    /// under `--ci`).
    redteam_skip: Vec<String>,
    /// Extra arguments for each test binary (a name filter).
    test_args: Vec<String>,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
        redteam: true,
        ..Options::default()
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--kernel" => o
                .kernels
                .push(it.next().context("--kernel needs a name")?.clone()),
            "--timeout" => {
                let secs: u64 = it
                    .next()
                    .context("--timeout needs seconds")?
                    .parse()
                    .context("--timeout: seconds")?;
                o.timeout = Duration::from_secs(secs);
            }
            "--test" => o
                .tests
                .push(it.next().context("--test needs a name")?.clone()),
            "--no-redteam" => o.redteam = false,
            "--ci" => {
                o.kernels.push(CI_KERNEL.to_owned());
                o.tests.extend(CI_TESTS.iter().map(|t| (*t).to_owned()));
                o.redteam_skip
                    .extend(CI_REDTEAM_SKIP.iter().map(|(f, _)| (*f).to_owned()));
                for t in CI_HOST_ONLY {
                    o.test_args.extend(["--skip".to_owned(), (*t).to_owned()]);
                }
            }
            "--" => o.test_args.extend(it.by_ref().cloned()),
            other => bail!(
                "vm-test: unknown argument {other}\n\
                 usage: cargo xtask vm-test [--ci] [--kernel SERIES|PACKAGE]… [--timeout SECS] [--test NAME]… [--no-redteam] [-- TEST-ARGS]"
            ),
        }
    }
    Ok(o)
}

/// What one kernel's run established.
#[derive(Debug, Default)]
struct Report {
    package: String,
    release: String,
    landlock_abi: String,
    doctor: String,
    degraded: Vec<String>,
    cgroup: String,
    /// suite → (passed, failed, rc, seconds)
    suites: BTreeMap<String, SuiteResult>,
    end_status: Option<i32>,
    leftover_cgroups: String,
    seconds: u64,
    error: Option<String>,
}

#[derive(Debug, Default, Clone)]
struct SuiteResult {
    passed: u64,
    failed: u64,
    ignored: u64,
    rc: Option<i32>,
    seconds: u64,
    /// What failed, by name, with the reason where the suite printed one
    /// (a libtest `test NAME ... FAILED`, a red-team probe's row and its
    /// `-> why`), and the red-team probes run twice: printed again in the
    /// matrix, the tail of a CI log.
    failures: Vec<String>,
    /// The previous line (a red-team row, before its `-> why`).
    last_line: String,
}

impl Report {
    fn ok(&self) -> bool {
        self.error.is_none()
            && self.end_status == Some(0)
            && !self.suites.is_empty()
            && self
                .suites
                .values()
                .all(|s| s.rc == Some(0) && s.failed == 0)
    }
}

pub fn vm_test(args: &[String]) -> Result<()> {
    let opts = parse(args)?;
    let root = workspace_root();
    let work = root.join("target/vm-tests");
    std::fs::create_dir_all(&work).with_context(|| work.display().to_string())?;
    for tool in [
        "qemu-system-x86_64",
        "dpkg-deb",
        "mkfs.ext4",
        "setpriv",
        "xz",
    ] {
        if !on_path(tool) {
            bail!("vm-test needs {tool} (`cargo xtask setup` installs the packages)");
        }
    }
    let busybox = Path::new("/bin/busybox");
    if !is_static(busybox) {
        bail!("vm-test needs a static /bin/busybox (package busybox-static)");
    }

    let packages = resolve_kernels(&opts.kernels, &work)?;
    // Everything of this run (the binaries' snapshot, initramfs, scratch
    // disks) in a directory of its own, removed on every way out: two runs
    // at once do not clobber each other's files.
    remove_stale_runs(&work);
    let run_dir = RunDir(work.join(format!("run-{}", std::process::id())));
    std::fs::create_dir_all(&run_dir.0)?;
    let logs = work.join("logs");
    std::fs::create_dir_all(&logs)?;
    let (target, tests) = build(&opts, &run_dir.0)?;

    let mut reports = Vec::new();
    for package in &packages {
        let started = Instant::now();
        let mut report = Report {
            package: package.clone(),
            ..Report::default()
        };
        let dirs = Dirs {
            work: &work,
            run: &run_dir.0,
            logs: &logs,
        };
        if let Err(e) = run_kernel(package, &dirs, &target, &tests, &opts, &mut report) {
            report.error = Some(format!("{e:#}"));
        }
        report.seconds = started.elapsed().as_secs();
        reports.push(report);
    }
    print_summary(&reports, &opts);
    if reports.iter().all(Report::ok) {
        Ok(())
    } else {
        bail!("vm-test failed (console logs under {})", logs.display())
    }
}

/// The directories of one run: the shared cache (`target/vm-tests`), this
/// run's own files, and the console logs.
#[derive(Debug)]
struct Dirs<'a> {
    work: &'a Path,
    run: &'a Path,
    logs: &'a Path,
}

/// Removes the directories of runs whose xtask is gone (killed: a SIGINT
/// or SIGKILL runs no destructor; its QEMU died with it).
fn remove_stale_runs(work: &Path) {
    for entry in std::fs::read_dir(work).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("run-") else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Removes this run's directory however [`vm_test`] returns.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Whether an ELF file has no PT_INTERP (a static binary), read from the
/// program headers.
fn is_static(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    let u = |at: usize, n: usize| -> Option<u64> {
        let b = bytes.get(at..at + n)?;
        Some(
            b.iter()
                .rev()
                .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)),
        )
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u(0x20, 8), u(0x36, 2), u(0x38, 2)) else {
        return false;
    };
    if bytes.get(..5) != Some(b"\x7fELF\x02") {
        return false;
    }
    const PT_INTERP: u64 = 3;
    (0..phnum).all(|i| {
        usize::try_from(phoff + i * phentsize)
            .ok()
            .and_then(|at| u(at, 4))
            .is_some_and(|t| t != PT_INTERP)
    })
}

/// Debian's numeric ordering of kernel package names: the digit runs
/// compared as numbers.
fn version_key(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// `linux-image-6.1.0-56-amd64` → `6.1`; `linux-image-6.12.117+deb12-amd64`
/// → `6.12`. None for meta packages and flavours other than plain amd64.
fn series_of(package: &str) -> Option<String> {
    let rest = package
        .strip_prefix("linux-image-")?
        .strip_suffix("-amd64")?;
    if rest.contains("-rt") || rest.contains("cloud") || rest.contains("unsigned") {
        return None;
    }
    let mut parts = rest.split(['.', '-', '+']);
    let (major, minor) = (parts.next()?, parts.next()?);
    // A versioned package has a third component (ABI or patch level).
    parts.next()?;
    if major.parse::<u32>().is_err() || minor.parse::<u32>().is_err() {
        return None;
    }
    Some(format!("{major}.{minor}"))
}

/// The kernel packages to test: for each wanted series the newest build in
/// the package lists (or, offline, in the download cache); a full package
/// name is taken as is.
fn resolve_kernels(wanted: &[String], work: &Path) -> Result<Vec<String>> {
    let mut known: BTreeSet<String> = BTreeSet::new();
    let out = Command::new("apt-cache")
        .args(["search", "--names-only", "^linux-image-[0-9].*-amd64$"])
        .output()
        .context("apt-cache search")?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(name) = line.split_whitespace().next() {
            known.insert(name.to_owned());
        }
    }
    for entry in std::fs::read_dir(work.join("debs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Some(name) = entry.file_name().to_string_lossy().split('_').next() {
            known.insert(name.to_owned());
        }
    }
    let newest = |series: &str| -> Option<String> {
        known
            .iter()
            .filter(|p| series_of(p).as_deref() == Some(series))
            .max_by_key(|p| version_key(p))
            .cloned()
    };
    let mut out = Vec::new();
    if wanted.is_empty() {
        for s in DEFAULT_SERIES {
            match newest(s) {
                Some(p) => out.push(p),
                None => eprintln!(
                    "xtask: vm-test: no linux-image-{s}*-amd64 in the package lists; the matrix runs without it"
                ),
            }
        }
        if out.is_empty() {
            bail!("no kernel package found: run `apt-get update` (cargo xtask setup does)");
        }
    } else {
        for w in wanted {
            if w.starts_with("linux-image-") {
                out.push(w.clone());
            } else {
                out.push(newest(w).with_context(|| {
                    format!("no linux-image-{w}*-amd64 package in the package lists")
                })?);
            }
        }
    }
    Ok(out)
}

/// Builds `supervise`, the red-team binary and the integration-test
/// binaries; returns the target dir and the test executables to run.
fn build(opts: &Options, run_dir: &Path) -> Result<(PathBuf, Vec<PathBuf>)> {
    super::build_bins(false)?;
    let mut c = cargo();
    c.args([
        "test",
        "-p",
        "turnstile-tests",
        "--tests",
        "--no-run",
        "--message-format=json",
    ]);
    eprintln!("xtask: $ {}", show(&c));
    let out = c
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --no-run failed");
    }
    let mut tests = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name)) = (msg["executable"].as_str(), msg["target"]["name"].as_str())
        else {
            continue;
        };
        if msg["target"]["kind"][0] != "test" {
            continue;
        }
        let wanted = if opts.tests.is_empty() {
            !SKIPPED_TESTS.iter().any(|(n, _)| *n == name)
        } else {
            opts.tests.iter().any(|t| t == name)
        };
        if wanted {
            tests.push(PathBuf::from(exe));
        }
    }
    for t in &opts.tests {
        if !tests.iter().any(|p| test_name(p) == *t) {
            bail!("no integration test binary named {t}");
        }
    }
    if opts.tests.is_empty() {
        for (name, why) in SKIPPED_TESTS {
            eprintln!("xtask: vm-test: not in the VM: tests/{name}.rs — {why}");
        }
    }
    tests.sort();
    snapshot(
        &workspace_root().join("target/debug"),
        tests,
        &run_dir.join("bin"),
    )
}

/// Hard-links `supervise`, `turnstile-init`, `redteam` and the test binaries into
/// this run's `bin`, so a `cargo build` during the run (cargo writes
/// new files, it does not rewrite these inodes) cannot change what the
/// guest executes half-way. The tests find `supervise` next to
/// themselves (`turnstile_tests::supervise_bin`).
fn snapshot(debug: &Path, tests: Vec<PathBuf>, bin: &Path) -> Result<(PathBuf, Vec<PathBuf>)> {
    std::fs::create_dir_all(bin)?;
    let link = |from: &Path| -> Result<PathBuf> {
        let to = bin.join(from.file_name().context("binary without a name")?);
        std::fs::hard_link(from, &to)
            .or_else(|_| std::fs::copy(from, &to).map(drop))
            .with_context(|| format!("{} -> {}", from.display(), to.display()))?;
        Ok(to)
    };
    for b in ["supervise", "turnstile-init", "redteam"] {
        link(&debug.join(b))?;
    }
    let tests = tests.iter().map(|t| link(t)).collect::<Result<Vec<_>>>()?;
    Ok((bin.to_path_buf(), tests))
}

/// `…/deps/run-0123abcd` → `run`.
fn test_name(exe: &Path) -> String {
    let file = exe
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    match file.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
        _ => file,
    }
}

fn run_kernel(
    package: &str,
    dirs: &Dirs<'_>,
    target: &Path,
    tests: &[PathBuf],
    opts: &Options,
    report: &mut Report,
) -> Result<()> {
    let tree = fetch_and_extract(package, dirs.work)?;
    let release = kernel_release(&tree)?;
    report.release.clone_from(&release);
    let dir = dirs.run.join(&release);
    std::fs::create_dir_all(&dir)?;
    let modules = module_closure(&tree, &release)?;
    let initramfs = dir.join("initramfs.cpio");
    build_initramfs(&initramfs, &modules, target, tests, opts)?;
    let scratch = dir.join("scratch.img");
    make_scratch(&scratch)?;
    let vmlinuz = tree.join("boot").join(format!("vmlinuz-{release}"));
    let log = dirs.logs.join(format!("{release}.console.log"));
    boot(&vmlinuz, &initramfs, &scratch, &log, opts.timeout, report)
}

/// The `.deb` (cached under `target/vm-tests/debs`) unpacked under
/// `target/vm-tests/kernels/PACKAGE`.
fn fetch_and_extract(package: &str, work: &Path) -> Result<PathBuf> {
    let tree = work.join("kernels").join(package);
    if tree.join("boot").is_dir() {
        return Ok(tree);
    }
    let debs = work.join("debs");
    std::fs::create_dir_all(&debs)?;
    let cached = |debs: &Path| -> Option<PathBuf> {
        std::fs::read_dir(debs)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|f| f.to_string_lossy().starts_with(&format!("{package}_")))
            })
    };
    let deb = match cached(&debs) {
        Some(d) => d,
        None => {
            run(Command::new("apt-get")
                .args(["download", package])
                .current_dir(&debs))?;
            cached(&debs).with_context(|| format!("apt-get download {package} left no .deb"))?
        }
    };
    let partial = work
        .join("kernels")
        .join(format!("{package}.partial-{}", std::process::id()));
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    std::fs::create_dir_all(&partial)?;
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    std::fs::rename(&partial, &tree)?;
    Ok(tree)
}

/// The one release directory under `lib/modules`.
fn kernel_release(tree: &Path) -> Result<String> {
    let mut releases: Vec<String> = std::fs::read_dir(tree.join("lib/modules"))
        .context("lib/modules in the kernel package")?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    releases.sort();
    match releases.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!("expected one kernel release in the package, found {releases:?}"),
    }
}

/// A module to put in the initramfs: its name and uncompressed bytes.
#[derive(Debug)]
struct Module {
    name: String,
    bytes: Vec<u8>,
}

/// The modules of [`GUEST_MODULES`] and their dependencies, in load
/// order (every module after the ones it depends on).
fn module_closure(tree: &Path, release: &str) -> Result<Vec<Module>> {
    let base = tree.join("lib/modules").join(release);
    let mut files: BTreeMap<String, PathBuf> = BTreeMap::new();
    index_modules(&base.join("kernel"), &mut files)?;
    let builtin: BTreeSet<String> = std::fs::read_to_string(base.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit('/').next())
        .map(module_name)
        .collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for m in GUEST_MODULES {
        visit(m, &files, &builtin, &mut seen, &mut order, 0)?;
    }
    Ok(order)
}

/// `ext4.ko.xz` → `ext4`; `-` and `_` are the same in module names.
fn module_name(file: &str) -> String {
    file.trim_end_matches(".xz")
        .trim_end_matches(".zst")
        .trim_end_matches(".ko")
        .replace('-', "_")
}

fn index_modules(dir: &Path, out: &mut BTreeMap<String, PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let path = entry?.path();
        if path.is_dir() {
            index_modules(&path, out)?;
        } else if let Some(f) = path.file_name().map(|f| f.to_string_lossy().into_owned()) {
            if f.ends_with(".ko") || f.ends_with(".ko.xz") {
                out.insert(module_name(&f), path);
            }
        }
    }
    Ok(())
}

fn visit(
    name: &str,
    files: &BTreeMap<String, PathBuf>,
    builtin: &BTreeSet<String>,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<Module>,
    depth: usize,
) -> Result<()> {
    let name = module_name(name);
    if depth > 32 {
        bail!("module dependency loop at {name}");
    }
    if seen.contains(&name) || builtin.contains(&name) {
        return Ok(());
    }
    let path = files
        .get(&name)
        .with_context(|| format!("module {name} is neither built in nor in the package"))?;
    let bytes = if path.extension().is_some_and(|e| e == "xz") {
        let out = Command::new("xz")
            .arg("-dc")
            .arg(path)
            .output()
            .with_context(|| format!("xz -dc {}", path.display()))?;
        if !out.status.success() {
            bail!("xz -dc {} failed", path.display());
        }
        out.stdout
    } else {
        std::fs::read(path)?
    };
    for dep in depends(&bytes) {
        visit(&dep, files, builtin, seen, order, depth + 1)?;
    }
    seen.insert(name.clone());
    order.push(Module { name, bytes });
    Ok(())
}

/// The `depends=a,b` string of a module's `.modinfo` section (NUL-separated
/// `key=value` strings; modpost always writes `depends=`).
fn depends(ko: &[u8]) -> Vec<String> {
    let key = b"\0depends=";
    ko.windows(key.len())
        .position(|w| w == key)
        .map(|at| {
            let rest = &ko[at + key.len()..];
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            String::from_utf8_lossy(&rest[..end])
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A `newc` cpio archive, written by hand: a handful of entries does not
/// justify a dependency, and the format is a fixed ASCII header per file.
#[derive(Debug, Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) -> Result<()> {
        self.ino += 1;
        let namesize = u32::try_from(name.len() + 1)?;
        let filesize = u32::try_from(data.len())?;
        let fields = [
            self.ino, mode, 0, 0, 1, 0, filesize, 0, 0, rdev.0, rdev.1, namesize, 0,
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
        Ok(())
    }

    fn pad(&mut self) {
        while self.buf.len() % 4 != 0 {
            self.buf.push(0);
        }
    }

    fn dir(&mut self, name: &str) -> Result<()> {
        self.entry(name, 0o040_755, (0, 0), &[])
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<()> {
        self.entry(name, 0o100_000 | mode, (0, 0), data)
    }

    fn finish(mut self) -> Result<Vec<u8>> {
        self.entry("TRAILER!!!", 0, (0, 0), &[])?;
        Ok(self.buf)
    }
}

/// Shell-quotes a value for `vm.env` (sourced by busybox sh).
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn build_initramfs(
    out: &Path,
    modules: &[Module],
    target: &Path,
    tests: &[PathBuf],
    opts: &Options,
) -> Result<()> {
    let root = workspace_root();
    let mut c = Cpio::default();
    for d in [
        "bin",
        "dev",
        "proc",
        "sys",
        "lib",
        "lib/modules",
        "host",
        "rw",
        "newroot",
    ] {
        c.dir(d)?;
    }
    // The kernel opens /dev/console for init's stdio before devtmpfs exists.
    c.entry("dev/console", 0o020_600, (5, 1), &[])?;
    c.file("bin/busybox", 0o755, &std::fs::read("/bin/busybox")?)?;
    // Both scripts travel in the initramfs: editing vm-tests/ during a run
    // cannot change what a running guest's shell reads next.
    for script in ["init", "guest.sh"] {
        let path = root.join("vm-tests").join(script);
        c.file(
            script,
            0o755,
            &std::fs::read(&path).with_context(|| path.display().to_string())?,
        )?;
    }
    let mut order = String::new();
    for m in modules {
        let file = format!("{}.ko", m.name);
        c.file(&format!("lib/modules/{file}"), 0o644, &m.bytes)?;
        order += &file;
        order.push('\n');
    }
    c.file("modules", 0o644, order.as_bytes())?;
    let tests: Vec<String> = tests.iter().map(|t| t.display().to_string()).collect();
    let env = format!(
        "VM_WORKSPACE={}\nVM_TARGET={}\nVM_TESTS={}\nVM_TEST_ARGS={}\nVM_REDTEAM={}\nVM_REDTEAM_SKIP={}\nVM_SUITE_TIMEOUT={}\n",
        quote(&root.display().to_string()),
        quote(&target.display().to_string()),
        quote(&tests.join(" ")),
        quote(&opts.test_args.join(" ")),
        if opts.redteam { "1" } else { "''" },
        quote(&opts.redteam_skip.join(",")),
        SUITE_TIMEOUT_SECS.min(opts.timeout.as_secs()),
    );
    c.file("vm.env", 0o644, env.as_bytes())?;
    std::fs::write(out, c.finish()?).with_context(|| out.display().to_string())
}

/// A fresh sparse ext4 image for the guest's /tmp and /var/lib (nothing
/// on it survives the run, so no metadata checksums; ext4 still asks for
/// crc32c at mount time, hence `crc32c_generic` in [`GUEST_MODULES`]).
fn make_scratch(path: &Path) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let f = std::fs::File::create(path)?;
    f.set_len(8 << 30)?;
    drop(f);
    run(Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-O",
            "^metadata_csum",
            "-E",
            "lazy_itable_init=1",
        ])
        .arg(path))
}

/// Kills and reaps QEMU whichever way [`boot`] returns.
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn boot(
    vmlinuz: &Path,
    initramfs: &Path,
    scratch: &Path,
    log: &Path,
    timeout: Duration,
    report: &mut Report,
) -> Result<()> {
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "10", "setpriv", "--pdeathsig", "KILL", "--"])
        .arg("qemu-system-x86_64")
        .args([
            "-accel",
            "tcg",
            "-m",
            "2G",
            "-smp",
            "2",
            "-nographic",
            "-no-reboot",
        ])
        .args(["-nic", "none"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .arg("-append")
        .arg("console=ttyS0 quiet loglevel=3 panic=-1 cgroup_no_v1=all rdinit=/init")
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        ])
        .arg("-drive")
        .arg(format!("file={},if=virtio,format=raw", scratch.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    eprintln!("xtask: $ {}", show(&cmd));
    // Spawned from the main thread: the pdeathsig fires when this thread
    // (xtask) dies, so QEMU goes with it on Ctrl-C or a kill.
    let mut child = cmd.spawn().context("spawning qemu-system-x86_64")?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    let qemu = Qemu(child);
    let mut logf = std::fs::File::create(log)?;
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = Vec::new();
        while r
            .read_until(b'\n', &mut line)
            .map(|n| n > 0)
            .unwrap_or(false)
        {
            let text = strip_escapes(String::from_utf8_lossy(&line).trim_end_matches(['\r', '\n']));
            line.clear();
            if tx.send(text).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + timeout;
    let mut current: Option<String> = None;
    let mut out = std::io::stdout();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            report.error = Some(format!("timeout after {}s", timeout.as_secs()));
            break;
        }
        let line = match rx.recv_timeout(left) {
            Ok(l) => l,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let _ = writeln!(logf, "{line}");
        let _ = writeln!(out, "[vm {}] {line}", report.release);
        parse_line(&line, &mut current, report);
        if report.end_status.is_some() {
            break;
        }
    }
    // Let QEMU power off on its own for a moment, then make sure.
    let mut qemu = qemu;
    for _ in 0..50 {
        if qemu.0.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(qemu);
    if report.end_status.is_none() && report.error.is_none() {
        report.error =
            Some("the guest stopped without the end marker (see the console log)".into());
    }
    Ok(())
}

/// The line without terminal escape sequences (the firmware clears the
/// screen on the serial console): `ESC [ … final-byte` and two-byte `ESC x`.
fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next_if_eq(&'[').is_some() {
            for n in chars.by_ref() {
                if ('@'..='~').contains(&n) {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn parse_line(line: &str, current: &mut Option<String>, report: &mut Report) {
    // The console may glue a marker to the end of firmware output.
    let line = line.find("TURNSTILE-VM-").map_or(line, |at| &line[at..]);
    if let Some(rest) = line.strip_prefix("TURNSTILE-VM-INFO ") {
        if let Some(k) = field(rest, "kernel") {
            report.release = k.to_owned();
        } else if let Some(c) = field(rest, "cgroup") {
            report.cgroup = match c {
                "v2-pure" => "v2 (pure)".to_owned(),
                other => other.to_owned(),
            };
        } else if let Some(d) = rest.strip_prefix("doctor=") {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(d) {
                report.landlock_abi = v["landlock_abi"].to_string();
                report.doctor = v["status"].as_str().unwrap_or_default().to_owned();
                report.degraded = v["reasons"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r.as_str().map(str::to_owned))
                    .collect();
            }
        } else if let Some(n) = field(rest, "leftover_cgroups") {
            report.leftover_cgroups = n.to_owned();
        }
    } else if let Some(name) = line.strip_prefix("TURNSTILE-VM-SUITE-BEGIN ") {
        *current = Some(name.trim().to_owned());
        report.suites.entry(name.trim().to_owned()).or_default();
    } else if let Some(rest) = line.strip_prefix("TURNSTILE-VM-SUITE-END ") {
        let name = rest
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned();
        let s = report.suites.entry(name).or_default();
        s.rc = field(rest, "rc").and_then(|v| v.parse().ok());
        s.seconds = field(rest, "seconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        *current = None;
    } else if let Some(rest) = line.strip_prefix("TURNSTILE-VM-END ") {
        report.end_status = field(rest, "status").and_then(|v| v.parse().ok());
    } else if let Some(name) = current.as_ref() {
        let s = report.suites.entry(name.clone()).or_default();
        // libtest: "test NAME ... FAILED"; red-team: a row, then "    -> why".
        if let Some(t) = line.trim().strip_prefix("test ") {
            if let Some(name) = t.strip_suffix(" ... FAILED") {
                s.failures.push(format!("failed: {name}"));
            }
        }
        if let Some(why) = line.trim_start().strip_prefix("-> ") {
            let probe = s.last_line.split_whitespace().next().unwrap_or("?");
            s.failures.push(format!("failed: {probe}: {why}"));
        }
        // red-team: "  retried: NAME: first …; then …".
        if let Some(r) = line.trim_start().strip_prefix("retried: ") {
            s.failures.push(format!("retried: {r}"));
        }
        s.last_line = line.to_owned();
        // libtest: "test result: ok. 3 passed; 0 failed; 1 ignored; …"
        if let Some(r) = line.trim().strip_prefix("test result: ") {
            let count = |what: &str| -> u64 {
                r.split(';')
                    .find_map(|p| {
                        p.trim()
                            .trim_start_matches(|c: char| !c.is_ascii_digit())
                            .strip_suffix(what)
                    })
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or(0)
            };
            s.passed += count(" passed");
            s.failed += count(" failed");
            s.ignored += count(" ignored");
        }
        // redteam: "126 probes, 0 escapes, 0 unexpected; …"
        if let Some((probes, rest)) = line.split_once(" probes, ") {
            let n = |t: &str| t.trim().parse::<u64>().ok();
            let mut parts = rest.split([',', ';']);
            if let (Some(total), Some(esc), Some(unexp)) = (
                n(probes),
                parts
                    .next()
                    .and_then(|p| n(p.trim().trim_end_matches(" escapes"))),
                parts
                    .next()
                    .and_then(|p| n(p.trim().trim_end_matches(" unexpected"))),
            ) {
                // One summary per shard (vm-tests/guest.sh runs two).
                s.passed += total.saturating_sub(esc + unexp);
                s.failed += esc + unexp;
            }
        }
    }
}

fn print_summary(reports: &[Report], opts: &Options) {
    println!("\nvm-test matrix");
    if opts.tests.is_empty() {
        for (name, why) in SKIPPED_TESTS {
            println!("not run in the VM: tests/{name}.rs — {why}");
        }
    } else {
        println!("integration tests run: {} (--test)", opts.tests.join(", "));
    }
    for (family, why) in CI_REDTEAM_SKIP {
        if opts.redteam_skip.iter().any(|f| f == family) {
            println!("red-team family left to the host: {family} — {why}");
        }
    }
    for r in reports {
        println!(
            "\n{} — kernel {}, Landlock ABI {}, cgroup {}, doctor {}: {} in {}s",
            r.package,
            r.release,
            if r.landlock_abi.is_empty() {
                "?"
            } else {
                &r.landlock_abi
            },
            if r.cgroup.is_empty() { "?" } else { &r.cgroup },
            if r.doctor.is_empty() { "?" } else { &r.doctor },
            if r.ok() { "PASS" } else { "FAIL" },
            r.seconds
        );
        for d in &r.degraded {
            println!("  doctor: {d}");
        }
        for (name, s) in &r.suites {
            println!(
                "  {:<28} {:>4} passed {:>3} failed {:>3} ignored  rc {:<4} {:>5}s",
                name,
                s.passed,
                s.failed,
                s.ignored,
                s.rc.map_or("none".to_owned(), |c| c.to_string()),
                s.seconds
            );
            for f in &s.failures {
                println!("    {f}");
            }
        }
        if !r.leftover_cgroups.is_empty() {
            println!("  turn cgroups left behind: {}", r.leftover_cgroups);
        }
        if let Some(e) = &r.error {
            println!("  error: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_and_newest_build() {
        assert_eq!(
            series_of("linux-image-6.1.0-56-amd64").as_deref(),
            Some("6.1")
        );
        assert_eq!(
            series_of("linux-image-6.12.117+deb12-amd64").as_deref(),
            Some("6.12")
        );
        assert_eq!(series_of("linux-image-6.12-amd64"), None);
        assert_eq!(series_of("linux-image-6.1.0-56-rt-amd64"), None);
        assert_eq!(series_of("linux-image-6.1.0-56-cloud-amd64"), None);
        assert!(
            version_key("linux-image-6.1.0-56-amd64") > version_key("linux-image-6.1.0-9-amd64")
        );
    }

    #[test]
    fn depends_reads_modinfo() {
        let ko = b"\x7fELF junk\0license=GPL\0depends=virtio,9pnet,virtio_ring\0name=x\0";
        assert_eq!(depends(ko), ["virtio", "9pnet", "virtio_ring"]);
        assert!(depends(b"\0depends=\0name=overlay\0").is_empty());
        assert_eq!(module_name("crc32c-generic.ko.xz"), "crc32c_generic");
    }

    #[test]
    fn escapes_are_stripped() {
        assert_eq!(
            strip_escapes("\u{1b}c\u{1b}[?7l\u{1b}[2JSeaBIOS \u{1b}[0mok"),
            "SeaBIOS ok"
        );
        assert_eq!(strip_escapes("plain"), "plain");
    }

    #[test]
    fn cpio_entries_are_aligned_and_terminated() {
        let mut c = Cpio::default();
        c.file("init", 0o755, b"abc").unwrap();
        let buf = c.finish().unwrap();
        assert!(buf.starts_with(b"070701"));
        assert_eq!(buf.len() % 4, 0);
        assert!(buf.windows(10).any(|w| w == b"TRAILER!!!"));
    }

    #[test]
    fn parses_suite_results_and_the_end_marker() {
        let mut r = Report::default();
        let mut cur = None;
        for l in [
            "Booting from ROM..TURNSTILE-VM-INFO kernel=6.1.0-56-amd64",
            "TURNSTILE-VM-SUITE-BEGIN test:run",
            "test run::slow_turn ... FAILED",
            "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 3.2s",
            "TURNSTILE-VM-SUITE-END test:run rc=0 seconds=40",
            "TURNSTILE-VM-SUITE-BEGIN redteam",
            "fork_bomb_limited                        resources            exit 13|14                 exit 0                     UNEXPECTED no",
            "    -> exit 0, not 13|14",
            "  retried: cpu_spin_times_out: first exit 0 (exit 0, not 14); then held",
            "126 probes, 1 escapes, 2 unexpected; 90 recorded in the evidence",
            "TURNSTILE-VM-SUITE-END redteam rc=1 seconds=100",
            "TURNSTILE-VM-END status=1",
        ] {
            parse_line(l, &mut cur, &mut r);
        }
        let run = &r.suites["test:run"];
        assert_eq!(
            (run.passed, run.failed, run.ignored, run.rc),
            (12, 0, 1, Some(0))
        );
        let rt = &r.suites["redteam"];
        assert_eq!((rt.passed, rt.failed, rt.rc), (123, 3, Some(1)));
        assert_eq!(run.failures, ["failed: run::slow_turn"]);
        assert_eq!(
            rt.failures,
            [
                "failed: fork_bomb_limited: exit 0, not 13|14",
                "retried: cpu_spin_times_out: first exit 0 (exit 0, not 14); then held"
            ]
        );
        assert_eq!(r.end_status, Some(1));
        assert_eq!(r.release, "6.1.0-56-amd64");
        assert!(!r.ok());
    }
}
