//! Shared fixtures for turnstile's integration tests: a throwaway workspace
//! and state directory, the real `supervise` binary, and a snapshot of every
//! file so a test can prove a command changed nothing on disk.

pub mod containerd;
pub mod cri;
pub mod inet;
pub mod realsw;
pub mod redteam;
pub mod soak;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The `supervise` binary built alongside the tests
/// (`TURNSTILE_SUPERVISE` overrides).
pub fn supervise_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TURNSTILE_SUPERVISE") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<test-binary> or target/<profile>/<bin>
    // -> target/<profile>/supervise
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("target dir");
    let bin = [
        dir.join("supervise"),
        dir.parent()
            .map(|d| d.join("supervise"))
            .unwrap_or_default(),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_else(|| dir.join("supervise"));
    assert!(
        bin.exists(),
        "{} is missing: run the tests through `cargo xtask test` or `cargo test --workspace`, which build it",
        bin.display()
    );
    bin
}

/// `pgrep -a -f PATTERN`: the matching processes' pids and command lines.
pub fn pgrep_full(pattern: &str) -> Vec<String> {
    let out = std::process::Command::new("pgrep")
        .args(["-a", "-f", pattern])
        .output()
        .expect("pgrep (procps) is required");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// SIGKILLs a `supervise serve` (no goodbye) and waits until it and its
/// turn workers are gone. A worker dies with its daemon (PDEATHSIG) but a
/// moment later, holding its warm sandbox's lock until it has: a daemon
/// restarted in between takes that sandbox for a live worker's and leaves
/// it to the session's next turn, which a test may never run — its mounts
/// would outlive the test.
pub fn kill9_daemon(child: &mut std::process::Child) {
    let pid = child.id();
    // Children of every thread (the daemon starts its workers from a
    // thread of their own: they are listed under that thread).
    let workers: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while workers
        .iter()
        .any(|w| std::path::Path::new(&format!("/proc/{w}")).exists())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the workers {workers:?} of the killed daemon {pid} outlived it by 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The interpreter an ELF64 little-endian executable names (`PT_INTERP`,
/// e.g. `/lib64/ld-linux-x86-64.so.2`), or `None` for a static one.
pub fn elf_interpreter(path: &Path) -> std::io::Result<Option<String>> {
    let bytes = std::fs::read(path)?;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return Err(bad("not an ELF64 little-endian file"));
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let u64_at = |o: usize| -> std::io::Result<usize> {
        let b: [u8; 8] = bytes
            .get(o..o + 8)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| bad("truncated header"))?;
        usize::try_from(u64::from_le_bytes(b)).map_err(|_| bad("offset out of range"))
    };
    let (phoff, phentsize, phnum) = (u64_at(0x20)?, u16_at(0x36), u16_at(0x38));
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let p_type = bytes
            .get(ph..ph + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| bad("truncated program header"))?;
        if p_type == 3 {
            let (off, size) = (u64_at(ph + 8)?, u64_at(ph + 32)?);
            let name = bytes
                .get(off..off + size)
                .ok_or_else(|| bad("truncated interpreter"))?;
            let name = name.strip_suffix(&[0]).unwrap_or(name);
            return Ok(Some(String::from_utf8_lossy(name).into_owned()));
        }
    }
    Ok(None)
}

/// What one `supervise` invocation did.
#[derive(Debug)]
pub struct Run {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(out: Output) -> Self {
        Self {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// stdout parsed as the one JSON object `--json` promises.
    pub fn json(&self) -> Value {
        let trimmed = self.stdout.trim_end();
        assert!(
            !trimmed.contains('\n'),
            "more than one line on stdout: {}",
            self.stdout
        );
        serde_json::from_str(trimmed)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

/// A workspace root and a state directory, both temporary and separate.
#[derive(Debug)]
pub struct Fixture {
    _root: tempfile::TempDir,
    _state: tempfile::TempDir,
    pub root: PathBuf,
    pub state: PathBuf,
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture {
    pub fn new() -> Self {
        let root_dir = tempfile::Builder::new()
            .prefix("ts-root-")
            .tempdir()
            .unwrap();
        let state_dir = tempfile::Builder::new()
            .prefix("ts-state-")
            .tempdir()
            .unwrap();
        let root = std::fs::canonicalize(root_dir.path()).unwrap();
        let state = std::fs::canonicalize(state_dir.path())
            .unwrap()
            .join("state");
        Self {
            _root: root_dir,
            _state: state_dir,
            root,
            state,
        }
    }

    /// Writes `installed/<pkg>/manifest.json`.
    /// Installs `manifest` for `pkg`. On a kernel whose Landlock lacks
    /// rights turnstile asks for (the VM tests on 6.1 set
    /// `TURNSTILE_TEST_ALLOW_DEGRADED=landlock`), a manifest object without
    /// `allow_degraded` gets `["landlock"]`: every turn there is refused
    /// otherwise (fail closed), which `install_exact` tests keep proving.
    pub fn install(&self, pkg: &str, manifest: &str) {
        self.install_exact(pkg, &for_this_kernel(manifest));
    }

    /// Installs `manifest` for `pkg` byte for byte.
    pub fn install_exact(&self, pkg: &str, manifest: &str) {
        let dir = self.root.join("installed").join(pkg);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("manifest.json"), manifest).unwrap();
    }

    /// Writes a file under the root.
    pub fn write(&self, rel: &str, content: &[u8]) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    /// Runs `supervise <args…>`, inserting `--root` and `--state-dir` after
    /// the subcommand words.
    pub fn supervise(&self, words: &[&str], args: &[&str]) -> Run {
        Run::from(
            self.command(&supervise_bin(), words, args)
                .output()
                .expect("spawn supervise"),
        )
    }

    /// `bin <words…> --root R --state-dir S <args…>`, not started (to run
    /// in the background, or another copy of `supervise`).
    pub fn command(&self, bin: &Path, words: &[&str], args: &[&str]) -> Command {
        let mut cmd = Command::new(bin);
        cmd.args(words)
            .arg("--root")
            .arg(&self.root)
            .arg("--state-dir")
            .arg(&self.state)
            .args(args)
            .env_remove("TURNSTILE_LOG");
        cmd
    }

    /// Runs `supervise` with exactly these arguments.
    pub fn raw(args: &[&str]) -> Run {
        Run::from(
            Command::new(supervise_bin())
                .args(args)
                .output()
                .expect("spawn supervise"),
        )
    }

    /// `supervise session new`, returning the id.
    pub fn new_session(&self) -> String {
        let r = self.supervise(&["session", "new"], &[]);
        assert_eq!(r.status, 0, "session new failed: {}", r.stderr);
        r.stdout.trim().to_owned()
    }

    pub fn ledger(&self, sid: &str, kind: &str) -> PathBuf {
        self.root
            .join("planes/ho1/sessions")
            .join(sid)
            .join("ledger")
            .join(format!("{kind}.jsonl"))
    }

    /// Every path under the root and the state dir with a hash of its
    /// content (or its kind), for "nothing changed on disk" assertions.
    pub fn snapshot(&self) -> BTreeMap<PathBuf, String> {
        let mut out = BTreeMap::new();
        for base in [&self.root, &self.state] {
            walk(base, &mut out);
        }
        out
    }
}

fn walk(p: &Path, out: &mut BTreeMap<PathBuf, String>) {
    let Ok(meta) = p.symlink_metadata() else {
        return;
    };
    let tag = if meta.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for e in entries {
            walk(&e, out);
        }
        "dir".to_owned()
    } else if meta.is_file() {
        hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
    } else {
        format!("{:?}", meta.file_type())
    };
    out.insert(p.to_path_buf(), tag);
}

/// Reads a ledger as parsed JSON lines.
pub fn read_entries(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The standard example manifest used across tests.
pub const HELLO_MANIFEST: &str = r#"{
  "package_id": "hello-agent",
  "version": "1.0.0",
  "trust_level": "standard",
  "capabilities": {
    "read": ["installed/hello-agent/**", "registries/*.csv"],
    "write": ["reports/<session_id>/*.md"],
    "execute": ["/usr/bin/python3 installed/hello-agent/main.py", "/bin/true"],
    "forbidden": ["installed/hello-agent/secrets/**", "/etc/shadow"]
  },
  "limits": {"memory": "256Mi", "cpu": "1", "pids": 64, "timeout_seconds": 60},
  "network": "isolated"
}"#;

/// A turn's `enforcement` shows Landlock as strong as the kernel allows:
/// `fully_enforced` at or above the ABI turnstile pins; below it (the VM
/// tests' 6.1 has ABI 2) `partially_enforced`, with every right that ABI
/// lacks named in `landlock.unenforced` and in `degraded` — the list is
/// written out here from the kernel's ABI history, not taken from the
/// supervisor.
pub fn assert_landlock_as_strong_as_the_kernel_allows(enforcement: &Value) {
    let abi = enforcement["landlock_abi"].as_u64().unwrap_or(0);
    if abi >= u64::from(turnstile_policy::plan::LANDLOCK_ABI) {
        assert_eq!(
            enforcement["landlock_status"], "fully_enforced",
            "{enforcement}"
        );
        assert_eq!(
            enforcement["degraded"],
            serde_json::json!([]),
            "{enforcement}"
        );
        return;
    }
    assert_eq!(
        enforcement["landlock_status"], "partially_enforced",
        "{enforcement}"
    );
    let mut lacking = Vec::new();
    if abi < 2 {
        lacking.push("fs.refer");
    }
    if abi < 3 {
        lacking.push("fs.truncate");
    }
    if abi < 5 {
        lacking.push("fs.ioctl_dev");
    }
    if abi < 6 {
        lacking.extend(["scope.abstract_unix_socket", "scope.signal"]);
    }
    assert_eq!(
        enforcement["landlock"]["unenforced"],
        serde_json::json!(lacking),
        "{enforcement}"
    );
    let degraded = enforcement["degraded"].to_string();
    for right in lacking {
        assert!(
            degraded.contains(right),
            "{right} not in degraded: {enforcement}"
        );
    }
}

/// `manifest` as the tests install it on this kernel: with
/// `allow_degraded: ["landlock"]` added to a manifest object that has none
/// when [`allow_degraded_landlock`]; unchanged otherwise.
pub fn for_this_kernel(manifest: &str) -> String {
    allow_degraded_landlock()
        .then(|| serde_json::from_str::<Value>(manifest).ok())
        .flatten()
        .and_then(|mut v| {
            let m = v.as_object_mut()?;
            if m.contains_key("allow_degraded") {
                return None;
            }
            m.insert("allow_degraded".into(), serde_json::json!(["landlock"]));
            Some(v.to_string())
        })
        .unwrap_or_else(|| manifest.to_owned())
}

/// `TURNSTILE_TEST_ALLOW_DEGRADED=landlock`: the kernel's Landlock lacks
/// rights, and the tests' packages accept that (see [`Fixture::install`]).
pub fn allow_degraded_landlock() -> bool {
    std::env::var("TURNSTILE_TEST_ALLOW_DEGRADED").as_deref() == Ok("landlock")
}

/// Kernel-dependent tests call this first. Without root they are skipped
/// with a reason — unless `TURNSTILE_REQUIRE_KERNEL=1` (CI), where a missing
/// capability fails the run instead of hiding.
pub fn require_root(test: &str) -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    if root {
        return true;
    }
    let reason = "needs root (namespaces, mounts, cgroups)";
    if std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() == Ok("1") {
        panic!("{test}: {reason}, and TURNSTILE_REQUIRE_KERNEL=1 forbids skipping");
    }
    eprintln!("turnstile-test: SKIPPED {test}: {reason}");
    false
}

impl Fixture {
    /// `supervise run` for `pkg` with `args` (request flags, then `--`).
    pub fn run(&self, pkg: &str, args: &[&str]) -> Run {
        let mut all = vec!["--package", pkg];
        all.extend_from_slice(args);
        self.supervise(&["run"], &all)
    }

    /// Both ledgers of `sid` verify (exit 0).
    pub fn assert_ledgers_intact(&self, sid: &str) {
        let r = self.supervise(&["ledger", "verify"], &["--session", sid]);
        assert_eq!(
            r.status, 0,
            "ledgers of {sid} do not verify:\n{}{}",
            r.stdout, r.stderr
        );
    }
}

/// sha256 (hex) of a file's content.
/// The host inodes no turn may change (issue 22): the standard devices
/// every program opens and the workspace root itself — mode, owner and
/// ctime of each (ctime moves with any chmod, chown, utimes or xattr
/// change, even one that restores the old values).
pub const HOST_INTEGRITY_PATHS: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
];

/// Mode, owner and ctime of [`HOST_INTEGRITY_PATHS`] and `workspace`.
pub fn host_integrity(workspace: &Path) -> BTreeMap<PathBuf, String> {
    use std::os::unix::fs::MetadataExt;
    HOST_INTEGRITY_PATHS
        .iter()
        .map(PathBuf::from)
        .chain([workspace.to_path_buf()])
        .map(|p| {
            let state = match std::fs::symlink_metadata(&p) {
                Ok(m) => format!(
                    "mode {:o} owner {}:{} ctime {}.{:09}",
                    m.mode(),
                    m.uid(),
                    m.gid(),
                    m.ctime(),
                    m.ctime_nsec()
                ),
                Err(e) => format!("{e}"),
            };
            (p, state)
        })
        .collect()
}

/// What changed since `before` ([`host_integrity`]), as an escape message.
pub fn host_integrity_changed(
    before: &BTreeMap<PathBuf, String>,
    workspace: &Path,
) -> Option<String> {
    let after = host_integrity(workspace);
    let changed: Vec<String> = before
        .iter()
        .filter(|(p, s)| after.get(*p) != Some(*s))
        .map(|(p, s)| {
            format!(
                "host inode {} changed: {s} -> {}",
                p.display(),
                after.get(p).map_or("gone", String::as_str)
            )
        })
        .collect();
    (!changed.is_empty()).then(|| changed.join("; "))
}

pub fn sha256_file(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap_or_default()))
}

/// Validates JSON files against `schema_file` in `schema_dir` (whose
/// `$ref`s are files of the same directory) with the system's
/// python3-jsonschema through `tests/schema/validate.py`; one line per
/// document, `valid PATH` or `invalid PATH: reason`. A missing validator
/// fails the test (`cargo xtask setup` installs it).
pub fn validate_json(schema_dir: &Path, schema_file: &str, docs: &[&Path]) -> Vec<String> {
    let out = Command::new("/usr/bin/python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/schema/validate.py"))
        .arg(schema_dir)
        .arg(schema_file)
        .args(docs)
        .output()
        .expect("run /usr/bin/python3");
    assert!(
        out.status.success(),
        "validation needs /usr/bin/python3 with python3-jsonschema (`cargo xtask setup`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The applets an image rootfs built from busybox-static links.
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh", "cat", "echo", "ls", "true", "false", "sleep", "touch", "mkdir", "id", "env",
];

/// The package the image-rootfs tests (rootfs, shim, CRI) install as `bb`:
/// busybox's shell from the image, a readable `data/` with a forbidden
/// `data/secret/`, the session's output directory writable.
pub const BUSYBOX_MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["data/**"],
    "write": ["output/<session_id>/**"],
    "execute": ["/bin/sh", "/bin/busybox"],
    "forbidden": ["data/secret/**"]
  },
  "limits": {"timeout_seconds": 30}
}"#;

/// Builds a minimal image rootfs in `dir` (which must not exist): the
/// statically linked `/bin/busybox` (Debian's busybox-static), its applets
/// as symlinks, `/etc/passwd` and `/etc/group` naming root and nobody, and
/// `/etc/os-release` saying what it is. Returns false (with the reason on
/// stderr) when busybox-static is not installed.
pub fn busybox_rootfs(dir: &Path) -> bool {
    let busybox = Path::new("/bin/busybox");
    let is_static = std::fs::read(busybox).is_ok_and(|b| elf64_without_interpreter(&b));
    if !is_static {
        eprintln!(
            "turnstile-test: /bin/busybox missing or not static (apt-get install busybox-static)"
        );
        return false;
    }
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::copy(busybox, dir.join("bin/busybox")).unwrap();
    for applet in BUSYBOX_APPLETS {
        std::os::unix::fs::symlink("busybox", dir.join("bin").join(applet)).unwrap();
    }
    std::fs::write(
        dir.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    )
    .unwrap();
    std::fs::write(dir.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n").unwrap();
    std::fs::write(
        dir.join("etc/os-release"),
        "NAME=\"turnstile test image\"\nID=busybox\n",
    )
    .unwrap();
    true
}

/// An ELF64 file with no PT_INTERP program header (statically linked).
fn elf64_without_interpreter(b: &[u8]) -> bool {
    let u16_at = |o: usize| {
        b.get(o..o + 2)
            .map(|x| u16::from_le_bytes([x[0], x[1]]) as usize)
    };
    let u64_at = |o: usize| {
        b.get(o..o + 8)
            .and_then(|x| x.try_into().ok())
            .map(|x: [u8; 8]| u64::from_le_bytes(x) as usize)
    };
    if b.get(..5) != Some(b"\x7fELF\x02") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..phnum).all(|i| {
        let at = phoff + i * phentsize;
        b.get(at..at + 4) != Some(&[3, 0, 0, 0][..])
    })
}
