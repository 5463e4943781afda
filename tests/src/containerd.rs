//! A private containerd 1.6 for the shim tests (`tests/shim.rs`,
//! `tests/cri.rs`): its own root, state, sockets and config in a temporary
//! directory, the turnstile shim on its PATH, started by the test and
//! killed on drop — with every process that names its directory (shims,
//! `supervise run`) and every mount under it, also when the test fails.
//! [`Leftovers`] is the "nothing left behind" check.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

/// A private containerd daemon.
#[derive(Debug)]
pub struct Containerd {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Containerd {
    /// Starts containerd with `extra` appended to its config (plugin
    /// sections), `shim_dir` first on its PATH. `{d}` in `extra` is the
    /// daemon's directory.
    pub fn start(shim_dir: &Path, extra: &str) -> Self {
        Self::start_with_env(shim_dir, extra, &[])
    }

    /// [`start`](Self::start) with `env` set in the daemon's environment
    /// (which its shims and their `supervise` inherit).
    pub fn start_with_env(shim_dir: &Path, extra: &str, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ts-containerd-")
            .tempdir()
            .unwrap();
        let d = dir.path().display().to_string();
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
{extra}
"#,
            extra = extra.replace("{d}", &d)
        );
        std::fs::write(dir.path().join("config.toml"), config).unwrap();
        let path = format!(
            "{}:{}",
            shim_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let log = std::fs::File::create(dir.path().join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.path().join("config.toml"))
            .env("PATH", path)
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn containerd");
        let c = Self {
            dir,
            child: Some(child),
        };
        for _ in 0..200 {
            if c.ctr(&["version"]).status.success() {
                return c;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("containerd did not come up: {}", c.log());
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// `ctr -a SOCKET args…` (namespace `default` unless `args` say).
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("-a")
            .arg(self.socket())
            .args(args)
            .output()
            .expect("spawn ctr")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// Processes (other than containerd itself) whose command line names
    /// this daemon's directory: its shims (`-address DIR/containerd.sock`)
    /// and what they run with a bundle path (`supervise run --events …`).
    pub fn processes(&self) -> Vec<(i32, String)> {
        let me = self.child.as_ref().map(Child::id);
        processes_naming(&self.dir.path().display().to_string())
            .into_iter()
            .filter(|(pid, _)| Some(u32::try_from(*pid).unwrap_or(0)) != me)
            .collect()
    }

    /// Stops the daemon now (what drop does), so the test can check what
    /// is left while the directory still exists.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0)),
                nix::sys::signal::Signal::SIGTERM,
            );
            for _ in 0..100 {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// After [`stop`]: kill what is left of ours and unmount under the
    /// directory (deepest first). Returns what had to be cleaned.
    fn sweep(&self) -> Vec<String> {
        let mut left = Vec::new();
        for (pid, cmd) in self.processes() {
            left.push(format!("process {pid}: {cmd}"));
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // A shim killed here cannot remove its socket (under
        // /run/containerd/s whatever the config says); each bundle's
        // `address` file names it.
        let tasks = self.dir.path().join("state/io.containerd.runtime.v2.task");
        for ns in std::fs::read_dir(&tasks).into_iter().flatten().flatten() {
            for bundle in std::fs::read_dir(ns.path()).into_iter().flatten().flatten() {
                let Ok(address) = std::fs::read_to_string(bundle.path().join("address")) else {
                    continue;
                };
                let socket = address.trim().trim_start_matches("unix://").to_owned();
                if Path::new(&socket).exists() {
                    left.push(format!("shim socket {socket}"));
                    let _ = std::fs::remove_file(&socket);
                }
            }
        }
        for m in mounts_under(self.dir.path()) {
            left.push(format!("mount {m}"));
            let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
        left
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let _ = self.sweep();
    }
}

/// `(pid, cmdline)` of every process whose command line contains `needle`.
pub fn processes_naming(needle: &str) -> Vec<(i32, String)> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            if u32::try_from(pid).ok()? == me {
                return None;
            }
            let raw = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmd.contains(needle).then_some((pid, cmd.trim().to_owned()))
        })
        .collect()
}

/// Mount points at or under `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut ours: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| *m == prefix || m.starts_with(&format!("{prefix}/")))
        .map(str::to_owned)
        .collect();
    ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
    ours
}

/// Entries (two levels deep) under `/run/containerd`, which containerd
/// and shims use whatever their config says.
fn run_containerd() -> BTreeSet<PathBuf> {
    let mut all = BTreeSet::new();
    for e in std::fs::read_dir("/run/containerd").into_iter().flatten() {
        let Ok(e) = e else { continue };
        all.insert(e.path());
        for e2 in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
            all.insert(e2.path());
        }
    }
    all
}

/// What existed before a test, to prove it left nothing behind.
#[derive(Debug)]
pub struct Leftovers {
    run_containerd: BTreeSet<PathBuf>,
}

impl Default for Leftovers {
    fn default() -> Self {
        Self::before()
    }
}

impl Leftovers {
    pub fn before() -> Self {
        Self {
            run_containerd: run_containerd(),
        }
    }

    /// Stops `c` and asserts nothing is left: no containerd, no process
    /// naming its directory (shim, supervise), no mount under its
    /// directory or any of `dirs`, no cgroup named by `cgroups` (paths
    /// relative to a v1 hierarchy, e.g. `turnstile/SES-…`, matched as
    /// prefixes of the last component) in any hierarchy, nothing new
    /// under /run/containerd.
    pub fn assert_clean(&self, c: &mut Containerd, dirs: &[&Path], cgroups: &[String]) {
        c.stop();
        // A shim exits on its own once containerd is gone or after Delete;
        // give it a moment.
        let mut left = Vec::new();
        for _ in 0..50 {
            left = c.processes();
            if left.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let mut problems: Vec<String> = left
            .iter()
            .map(|(p, cmd)| format!("process {p} left: {cmd}"))
            .collect();
        for d in dirs.iter().copied().chain([c.dir.path()]) {
            problems.extend(
                mounts_under(d)
                    .into_iter()
                    .map(|m| format!("mount left: {m}")),
            );
        }
        for rel in cgroups {
            let rel = Path::new(rel);
            let (parent, name) = (
                rel.parent().unwrap_or(Path::new("")),
                rel.file_name().unwrap().to_string_lossy().into_owned(),
            );
            for h in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten() {
                let Ok(h) = h else { continue };
                for e in std::fs::read_dir(h.path().join(parent))
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    if e.file_name().to_string_lossy().starts_with(&name) && e.path().is_dir() {
                        problems.push(format!("cgroup left: {}", e.path().display()));
                    }
                }
            }
        }
        let new: Vec<PathBuf> = run_containerd()
            .difference(&self.run_containerd)
            // An empty directory (`s/` for shim sockets) is containerd's
            // layout, not a leftover.
            .filter(|p| std::fs::read_dir(p).map_or(true, |mut d| d.next().is_some()))
            .cloned()
            .collect();
        problems.extend(
            new.iter()
                .map(|p| format!("new under /run/containerd: {}", p.display())),
        );
        let swept = c.sweep();
        assert!(
            problems.is_empty(),
            "left behind:\n{}\n(swept: {swept:?})\ncontainerd log:\n{}",
            problems.join("\n"),
            c.log()
        );
    }
}
