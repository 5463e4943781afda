//! The one OCI-runtime driver runc, crun and runsc turns go through: find
//! the binary (E2040 when it is not installed), run a typed command line
//! ([`turnstile_oci::RuntimeCmd`], whose exact argv the oci crate pins)
//! with the runtime's state under [`RUNTIME_ROOT`], its stdin an empty pipe,
//! and — for crun on a hybrid cgroup host — in a private mount namespace.
//! Also what recovery and the guard need of every runtime: the records it
//! keeps ([`records`]) and forgetting one ([`forget`]).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::mount::{MsFlags, mount};
use turnstile_oci::{Runtime, RuntimeCmd};

use crate::error::{Result, SupervisorError};
use crate::sandbox::sandbox_err as err;

/// Every runtime's `--root` (its state), per host: `<this>/<runtime>`.
pub const RUNTIME_ROOT: &str = "/run/turnstile";

/// A runtime found on this host.
#[derive(Debug, Clone)]
pub struct Driver {
    pub runtime: Runtime,
    binary: PathBuf,
    /// runsc only: `--network=host` instead of `--network=none` (a turn
    /// with egress: the sentry's sockets are host sockets in the turn's
    /// own network namespace; see `sandbox::egress`).
    host_network: bool,
}

impl Driver {
    /// `runtime`, or E2040 when it is not installed.
    pub fn locate(runtime: Runtime) -> Result<Self> {
        let name = runtime.as_str();
        let binary = ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
            .ok_or_else(|| SupervisorError::RuntimeUnavailable {
                runtime: name.into(),
                reason: match runtime {
                    Runtime::Runsc => {
                        "runsc (gVisor) is not installed (apt-get install runsc)".into()
                    }
                    _ => format!("{name} is not installed (apt-get install {name})"),
                },
            })?;
        Ok(Self {
            runtime,
            binary,
            host_network: false,
        })
    }

    /// This driver with runsc's `--network=host` (hostinet) instead of
    /// `--network=none`.
    pub fn host_network(mut self) -> Self {
        self.host_network = true;
        self
    }

    /// The runtime's state directory.
    pub fn root(&self) -> PathBuf {
        Path::new(RUNTIME_ROOT).join(self.runtime.as_str())
    }

    /// The command for `cmd`, stdin an empty pipe (never a host device
    /// node: runsc and crun fchown their stdio), stdout and stderr left to
    /// the caller. crun refuses the hybrid cgroup layout (cgroup v1 plus a
    /// cgroup2 mount at /sys/fs/cgroup/unified): it runs in a private mount
    /// namespace where a tmpfs hides that mount (the host is unchanged;
    /// MACHINE-NOTES).
    pub fn command(&self, cmd: &RuntimeCmd<'_>, log: &Path) -> Result<Command> {
        let mut c = Command::new(&self.binary);
        let mut argv = self.runtime.argv(cmd, &self.root(), log);
        if self.host_network {
            for a in &mut argv {
                if a == "--network=none" {
                    "--network=host".clone_into(a);
                }
            }
        }
        c.args(argv).stdin(crate::sandbox::empty_stdin()?);
        let unified = Path::new("/sys/fs/cgroup/unified");
        if self.runtime == Runtime::Crun && unified.join("cgroup.controllers").exists() {
            // SAFETY: after fork, only unshare(2) and mount(2) with
            // arguments prepared before the fork (async-signal-safe).
            unsafe {
                c.pre_exec(|| {
                    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
                    mount(
                        None::<&str>,
                        "/",
                        None::<&str>,
                        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                        None::<&str>,
                    )?;
                    mount(
                        Some("tmpfs"),
                        "/sys/fs/cgroup/unified",
                        Some("tmpfs"),
                        MsFlags::empty(),
                        None::<&str>,
                    )?;
                    Ok(())
                });
            }
        }
        Ok(c)
    }

    /// Runs `cmd` (its output to the log only), killing it if it has not
    /// ended within `within`: whether it ended successfully, or why not.
    pub fn run_within(
        &self,
        cmd: &RuntimeCmd<'_>,
        log: &Path,
        within: std::time::Duration,
    ) -> Result<()> {
        let mut child = self
            .command(cmd, log)?
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| err("run runtime", format!("{}: {e}", self.runtime.as_str())))?;
        let until = std::time::Instant::now() + within;
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(err(
                        "run runtime",
                        format!("{} {cmd:?}: {status}", self.runtime.as_str()),
                    ));
                }
                Ok(None) if std::time::Instant::now() < until => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(err(
                        "run runtime",
                        format!(
                            "{} {cmd:?} did not end within {} s: killed",
                            self.runtime.as_str(),
                            within.as_secs()
                        ),
                    ));
                }
            }
        }
    }

    /// Runs `cmd` to its end: its stdout, or an error with its stderr and
    /// the last line of its log.
    pub fn run(&self, cmd: &RuntimeCmd<'_>, log: &Path) -> Result<Vec<u8>> {
        let out: Output = self
            .command(cmd, log)?
            .output()
            .map_err(|e| err("run runtime", format!("{}: {e}", self.runtime.as_str())))?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        let logged = std::fs::read_to_string(log).unwrap_or_default();
        Err(err(
            "run runtime",
            format!(
                "{} {cmd:?}: {}{}",
                self.runtime.as_str(),
                String::from_utf8_lossy(&out.stderr).trim(),
                logged.lines().last().unwrap_or_default()
            ),
        ))
    }
}

/// How long [`forget`] lets a runtime's `delete --force` run.
const FORGET_WITHIN: std::time::Duration = std::time::Duration::from_secs(15);

/// Deletes every runtime's record of container `id`, if there is one
/// (recovery of a turn whose supervisor died, its guard, and the runsc
/// backend's own teardown of a `create` cut short).
pub fn forget(id: &str) {
    for runtime in Runtime::ALL {
        if !has_record(runtime, id) {
            continue;
        }
        if let Ok(d) = Driver::locate(runtime) {
            let log = std::env::temp_dir()
                .join(format!("turnstile-{}-forget-{id}.log", runtime.as_str()));
            // Bounded: a runtime that never returns (runsc's delete of a
            // sandbox it cannot reach) must not hold the session's
            // recovery, and every turn of it, for ever; what it leaves is
            // killed through the cgroup after, and the next recovery
            // deletes again.
            if let Err(e) = d.run_within(&RuntimeCmd::Delete { id }, &log, FORGET_WITHIN) {
                tracing::warn!(error = %e, container = id, "the runtime's delete did not end");
            }
            let _ = std::fs::remove_file(log);
        }
        if runtime == Runtime::Runsc {
            // A `runsc create` killed before it wrote the sandbox's state
            // leaves only its lock file, which `delete` does not know
            // (measured: SIGKILL of supervise during `create`).
            let root = Path::new(RUNTIME_ROOT).join("runsc");
            if !root.join(format!("{id}_sandbox:{id}.state")).exists() {
                let _ = std::fs::remove_file(root.join(format!("{id}_sandbox:{id}.lock")));
            }
        }
    }
}

/// Removes what runc or crun keeps of container `id` once every process
/// of it is gone: its state directory. That is what their `delete` does
/// for a stopped container besides removing its cgroups, which are the
/// turn's own and removed by the caller (runc's `destroy`: the cgroup
/// manager's paths, the state directory, poststop hooks, of which a turn's
/// bundle has none). `false` for another runtime or a directory that would
/// not go: the caller runs `delete` then.
pub fn remove_stopped_record(runtime: Runtime, id: &str) -> bool {
    let plain = !id.is_empty() && id != "." && id != ".." && !id.contains('/');
    if !plain || !matches!(runtime, Runtime::Runc | Runtime::Crun) {
        return false;
    }
    let dir = Path::new(RUNTIME_ROOT).join(runtime.as_str()).join(id);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Whether `runtime` keeps anything of container `id`: runc and crun a
/// directory named `id`; runsc files named after its sandbox.
fn has_record(runtime: Runtime, id: &str) -> bool {
    let root = Path::new(RUNTIME_ROOT).join(runtime.as_str());
    match runtime {
        Runtime::Runc | Runtime::Crun => root.join(id).exists(),
        Runtime::Runsc => std::fs::read_dir(root)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().contains(id))
            })
            .unwrap_or(false),
    }
}

/// The container ids `<prefix><n>` that any runtime still has a record of
/// under [`RUNTIME_ROOT`]: a dead session's turns are `<session>-t<n>`
/// (runsc names its files `<id>_sandbox:<id>.state` and the like, so only
/// the leading digits count).
pub fn records(prefix: &str) -> std::collections::BTreeSet<String> {
    records_in(Path::new(RUNTIME_ROOT), prefix)
}

fn records_in(root: &Path, prefix: &str) -> std::collections::BTreeSet<String> {
    let mut ids = std::collections::BTreeSet::new();
    for runtime in Runtime::ALL {
        for entry in std::fs::read_dir(root.join(runtime.as_str()))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
                continue;
            };
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits > 0 {
                ids.insert(format!("{prefix}{}", &rest[..digits]));
            }
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_records_name_the_turns_of_a_session_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for d in [
            "runc/SES-a-t1",
            "crun/SES-a-t12",
            "runc/SES-b-t1",
            "runc/SES-a-w3",
        ] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        std::fs::create_dir_all(r.join("runsc")).unwrap();
        for f in [
            "SES-a-t7_sandbox:SES-a-t7.state",
            "SES-a-t7_sandbox:SES-a-t7.lock",
            "SES-a-tx",
        ] {
            std::fs::write(r.join("runsc").join(f), "").unwrap();
        }
        let ids: Vec<String> = records_in(r, "SES-a-t").into_iter().collect();
        assert_eq!(ids, ["SES-a-t1", "SES-a-t12", "SES-a-t7"]);
        assert!(records_in(&r.join("none"), "SES-a-t").is_empty());
    }
}
