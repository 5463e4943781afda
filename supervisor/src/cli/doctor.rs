//! `supervise doctor`: what this host can enforce, and what to do about
//! what it cannot. READY / DEGRADED / FAILED with reasons.

use std::path::Path;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::store::record::Observed;

use crate::sandbox::{cgroup, landlock};

/// The kernel's Landlock ABI version (0 when unavailable).
pub fn landlock_abi() -> u32 {
    landlock::kernel_abi()
}

fn which(name: &str) -> Option<String> {
    [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
    .iter()
    .map(|d| Path::new(d).join(name))
    .find(|p| p.is_file())
    .map(|p| p.display().to_string())
}

/// An installed runtime, or not.
#[derive(Debug, Clone, Serialize)]
pub struct Runtime {
    pub name: &'static str,
    pub path: Option<String>,
}

/// What this host has of Kata.
#[derive(Debug, Clone, Serialize)]
pub struct KataStatus {
    pub usable: bool,
    pub binary: Option<std::path::PathBuf>,
    pub kvm: bool,
    pub missing: Vec<String>,
}

/// `supervise doctor --json`.
#[derive(Debug, Clone, Serialize)]
pub struct DoctorReport {
    pub status: &'static str,
    pub reasons: Vec<String>,
    pub root: bool,
    pub landlock_abi: u32,
    pub landlock_abi_required: u32,
    pub landlock_unenforced: Vec<String>,
    pub seccomp: bool,
    pub overlayfs: bool,
    /// Network `restricted` / `allow_egress` (issue 26): how the native
    /// backend enforces them here, or why it cannot (such turns are then
    /// refused, TS1070).
    #[serde(default)]
    pub network_egress: String,
    pub user_namespaces: u64,
    pub cgroup: Option<&'static str>,
    pub runtimes: Vec<Runtime>,
    pub denials_observed: BTreeMap<String, Observed>,
    pub host_devices: Vec<String>,
    pub kata: KataStatus,
}

/// One session in `supervise health --json`.
#[derive(Debug, Clone, Serialize)]
pub struct SessionHealth {
    pub session_id: String,
    pub root: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub integrity: Option<String>,
    pub warnings: Vec<String>,
    pub leftovers: Vec<String>,
}

/// `supervise health --json`.
#[derive(Debug, Clone, Serialize)]
pub struct HealthReport {
    pub status: &'static str,
    pub reasons: Vec<String>,
    pub host: DoctorReport,
    pub state_dir: String,
    pub state_free_bytes: Option<u64>,
    pub sessions: Vec<SessionHealth>,
}

/// The health report.
pub fn report() -> (String, DoctorReport) {
    let mut failed = Vec::new();
    let mut degraded = Vec::new();
    let root = nix::unistd::geteuid().is_root();
    if !root {
        failed.push("not running as root: the native backend needs root for namespaces, mounts and cgroups (run with sudo)".to_owned());
    }
    let abi = landlock_abi();
    let unenforced = landlock::unenforceable_here(abi);
    let unenforced_net = landlock::unenforceable_net_here(abi);
    if abi == 0 {
        failed.push("Landlock is unavailable: boot with lsm=...,landlock or use a kernel with CONFIG_SECURITY_LANDLOCK".into());
    } else if abi < turnstile_policy::plan::LANDLOCK_ABI {
        degraded.push(format!(
            "Landlock ABI {abi} < {}: cannot enforce {}; recorded as degradations per turn{}",
            turnstile_policy::plan::LANDLOCK_ABI,
            unenforced.join(", "),
            if unenforced_net.is_empty() {
                String::new()
            } else {
                format!(
                    " (nor {}: unused while a turn's network is its own namespace)",
                    unenforced_net.join(", ")
                )
            }
        ));
    }
    let seccomp = Path::new("/proc/sys/kernel/seccomp/actions_avail").exists();
    if !seccomp {
        failed.push("seccomp filters are unavailable (CONFIG_SECCOMP_FILTER)".into());
    }
    // Denials explained (issue 11): seccomp's through user notification.
    let user_notif = std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail")
        .unwrap_or_default()
        .split_whitespace()
        .any(|a| a == "user_notif");
    let not = |why: &str| Observed {
        observed: false,
        via: None,
        why: Some(why.to_owned()),
    };
    // Landlock's and the view's (issue 27): the BPF observer, loaded here
    // for real (what is missing, if it cannot be).
    let bpf = match crate::sandbox::observe::get() {
        Ok(o) => Observed {
            observed: true,
            via: Some(format!("{} ({})", crate::turn::denials::BPF_VIA, o.how())),
            why: None,
        },
        Err(why) => not(&why),
    };
    let denials = BTreeMap::from([
        (
            "seccomp".to_owned(),
            if user_notif {
                Observed {
                    observed: true,
                    via: Some("seccomp user notification".into()),
                    why: None,
                }
            } else {
                not("the kernel lacks SECCOMP_RET_USER_NOTIF")
            },
        ),
        ("landlock".to_owned(), bpf.clone()),
        ("mount".to_owned(), bpf),
    ]);
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    let overlay = filesystems
        .lines()
        .any(|l| l.trim_end().ends_with("overlay"));
    if !overlay {
        failed.push("overlayfs is unavailable: modprobe overlay".into());
    }
    let userns = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let cg = cgroup::detect(Path::new("/sys/fs/cgroup"));
    if cg.is_none() {
        failed.push(
            "no usable cgroup hierarchy (memory and pids controllers) under /sys/fs/cgroup".into(),
        );
    }
    let kata = crate::backend::kata::detect();
    let kata_missing = kata.missing();
    let host_devices = host_device_damage(Path::new("/dev"));
    degraded.extend(host_devices.iter().cloned());
    let runtimes: Vec<Runtime> = ["runc", "crun", "runsc", "kata-runtime", "bwrap"]
        .iter()
        .map(|r| Runtime {
            name: r,
            path: which(r),
        })
        .collect();
    let egress = match crate::sandbox::egress::host_support() {
        Ok(()) => "native, runc, crun: the turn's own network namespace with nftables (loaded by the supervisor over netlink) and the supervisor's resolver and proxy; runsc too on hostinet (--network=host in the turn's own namespace) when the manifest's allow_degraded lists gvisor_netstack, else refused (TS1070)".to_owned(),
        Err(why) => format!("refused on every backend (TS1070): {why}"),
    };
    let status = status_of(&failed, &degraded);
    let value = DoctorReport {
        status,
        reasons: failed.iter().chain(&degraded).cloned().collect(),
        root,
        landlock_abi: abi,
        landlock_abi_required: turnstile_policy::plan::LANDLOCK_ABI,
        landlock_unenforced: unenforced
            .iter()
            .chain(&unenforced_net)
            .map(|s| s.to_string())
            .collect(),
        seccomp,
        overlayfs: overlay,
        network_egress: egress.clone(),
        user_namespaces: userns,
        cgroup: cg.map(cgroup::Version::as_str),
        runtimes,
        denials_observed: denials,
        host_devices,
        kata: KataStatus {
            usable: kata_missing.is_empty(),
            binary: kata.binary.clone(),
            kvm: kata.kvm,
            missing: kata_missing.clone(),
        },
    };
    let mut text = format!("turnstile doctor: {status}\n");
    text += &format!("  root:            {}\n", if root { "yes" } else { "no" });
    text += &format!(
        "  landlock:        ABI {abi} (turnstile is written for ABI {})\n",
        turnstile_policy::plan::LANDLOCK_ABI
    );
    text += &format!(
        "  seccomp:         {}\n",
        if seccomp { "yes" } else { "no" }
    );
    text += &format!(
        "  overlayfs:       {}\n",
        if overlay { "yes" } else { "no" }
    );
    text += &format!("  user namespaces: {userns}\n");
    text += &format!("  network egress:  {egress}\n");
    text += &format!(
        "  cgroups:         {}\n",
        cg.map_or("none", cgroup::Version::as_str)
    );
    text += &format!(
        "  denials seen:    seccomp {}; landlock no (audit only); mount layer no\n",
        if user_notif {
            "yes (user notification)"
        } else {
            "no"
        }
    );
    for r in &value.runtimes {
        text += &format!(
            "  {:<15}  {}\n",
            r.name,
            r.path.as_deref().unwrap_or("not installed")
        );
    }
    text += &format!(
        "  kata:            {}\n",
        if kata_missing.is_empty() {
            "binary and /dev/kvm present (turns under Kata are not run yet: E2040)".to_owned()
        } else {
            format!("not usable: {}", kata_missing.join("; "))
        }
    );
    for reason in failed.iter().chain(&degraded) {
        text += &format!("  - {reason}\n");
    }
    (text, value)
}

/// The host's standard character devices, as every program expects them:
/// (name, major, minor). Each must be a character device, mode 0666,
/// owned by root.
const HOST_DEVICES: [(&str, u64, u64); 5] = [
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
];

/// What is wrong with the standard devices under `dev` (empty: nothing).
/// An older turnstile let runsc and crun `fchown` the host's `/dev/null`
/// to the turn's user (issue 22); a host damaged that way fails every
/// non-root program that opens it.
pub fn host_device_damage(dev: &Path) -> Vec<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out = Vec::new();
    for (name, major, minor) in HOST_DEVICES {
        let path = dev.join(name);
        let fix = format!(
            "(fix: rm -f {p} && mknod -m 0666 {p} c {major} {minor})",
            p = path.display()
        );
        match std::fs::symlink_metadata(&path) {
            Err(e) => out.push(format!("{}: {e} {fix}", path.display())),
            Ok(m) if !m.file_type().is_char_device() => {
                out.push(format!(
                    "{} is not a character device {fix}",
                    path.display()
                ));
            }
            Ok(m) => {
                let rdev = (
                    nix::sys::stat::major(m.rdev()),
                    nix::sys::stat::minor(m.rdev()),
                );
                let mut wrong = Vec::new();
                if rdev != (major, minor) {
                    wrong.push(format!(
                        "device {}:{} (expected {major}:{minor})",
                        rdev.0, rdev.1
                    ));
                }
                if m.mode() & 0o7777 != 0o666 {
                    wrong.push(format!("mode {:04o} (expected 0666)", m.mode() & 0o7777));
                }
                if m.uid() != 0 {
                    wrong.push(format!("owner uid {} (expected root)", m.uid()));
                }
                if !wrong.is_empty() {
                    out.push(format!(
                        "host {} is damaged: {} {fix}",
                        path.display(),
                        wrong.join(", ")
                    ));
                }
            }
        }
    }
    out
}

/// READY, DEGRADED (something recorded as degraded) or FAILED.
fn status_of(failed: &[String], degraded: &[String]) -> &'static str {
    if !failed.is_empty() {
        "FAILED"
    } else if !degraded.is_empty() {
        "DEGRADED"
    } else {
        "READY"
    }
}

/// Free space below which the state dir (ledger anchors, journals, turn
/// dirs) makes the host DEGRADED.
const STATE_MIN_FREE_BYTES: u64 = 256 << 20;

/// `supervise health`: the host ([`report`]) plus the state directory —
/// writable (FAILED when not), free space, sessions whose ledgers do not verify (FAILED), and what a
/// stopped supervisor left unrecovered (DEGRADED: run `supervise recover`).
/// Read-only: nothing is recovered or changed.
pub fn health(state_dir: &Path) -> (String, HealthReport) {
    let (_, host) = report();
    let mut failed: Vec<String> = Vec::new();
    let mut degraded: Vec<String> = Vec::new();
    for r in &host.reasons {
        if host.status == "FAILED" {
            failed.push(r.clone());
        } else {
            degraded.push(r.clone());
        }
    }
    let mut sessions = Vec::new();
    let free = nix::sys::statvfs::statvfs(state_dir)
        .ok()
        .map(|s| s.blocks_available() * s.fragment_size());
    match free {
        None => degraded.push(format!(
            "state dir {} does not exist yet (created by the first session)",
            state_dir.display()
        )),
        Some(f) if f < STATE_MIN_FREE_BYTES => degraded.push(format!(
            "state dir {}: only {} MiB free (ledger anchors, commit journals and turn dirs live there)",
            state_dir.display(),
            f >> 20
        )),
        Some(_) => {}
    }
    // Writable, looked at without writing (health changes nothing): a
    // read-only mount or a denied write means no turn can record.
    if free.is_some() {
        let ro = nix::sys::statvfs::statvfs(state_dir)
            .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY));
        let denied = nix::unistd::access(state_dir, nix::unistd::AccessFlags::W_OK).err();
        if ro || denied.is_some() {
            failed.push(format!(
                "state dir {} does not take writes ({}): no turn can record",
                state_dir.display(),
                if ro {
                    "read-only file system".to_owned()
                } else {
                    denied.map(|e| e.to_string()).unwrap_or_default()
                }
            ));
        }
    }
    let state = crate::store::layout::StateDir::at(state_dir);
    for (id, ws) in crate::recover::known_sessions(&state, None) {
        let mut entry = SessionHealth {
            session_id: id.to_string(),
            root: ws.root_str().to_owned(),
            error: None,
            integrity: None,
            warnings: Vec::new(),
            leftovers: Vec::new(),
        };
        let session = match crate::store::session::Session::open(&ws, &state, &id, None) {
            Ok(s) => s,
            Err(e) => {
                failed.push(format!("session {id}: {e}"));
                entry.error = Some(e.to_string());
                sessions.push(entry);
                continue;
            }
        };
        let mut warnings = Vec::new();
        for kind in crate::store::ledger::LedgerKind::ALL {
            match session.ledger(kind).verify() {
                Ok(r) => warnings.extend(r.warnings),
                Err(e) => {
                    failed.push(format!("session {id}: {} ledger: {e}", kind.as_str()));
                    entry.integrity = Some(e.to_string());
                }
            }
        }
        let leftovers: Vec<String> = std::fs::read_dir(state.session_dir(&id))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("turn-"))
            .collect();
        if !warnings.is_empty() || !leftovers.is_empty() {
            degraded.push(format!(
                "session {id}: unrecovered ({}) — run `supervise recover`",
                warnings
                    .iter()
                    .chain(&leftovers)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        entry.warnings = warnings;
        entry.leftovers = leftovers;
        sessions.push(entry);
    }
    let status = status_of(&failed, &degraded);
    let value = HealthReport {
        status,
        reasons: failed.iter().chain(&degraded).cloned().collect(),
        host,
        state_dir: state_dir.display().to_string(),
        state_free_bytes: free,
        sessions,
    };
    let mut text = format!("turnstile health: {status}\n");
    text += &format!(
        "  state dir: {} ({} sessions, {} MiB free)\n",
        state_dir.display(),
        value.sessions.len(),
        free.map_or(0, |f| f >> 20)
    );
    for reason in failed.iter().chain(&degraded) {
        text += &format!("  - {reason}\n");
    }
    (text, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 22: a host `/dev/null` given to 65534 (what runsc's `fchown`
    /// of its stdio did) or chmodded is reported, with the fix; intact
    /// nodes are not. Needs root (mknod).
    #[test]
    fn doctor_reports_a_damaged_host_dev_null() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("TURNSTILE_REQUIRE_KERNEL").is_none(),
                "root is required"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        for (name, major, minor) in HOST_DEVICES {
            let p = dir.path().join(name);
            nix::sys::stat::mknod(
                &p,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(major, minor),
            )
            .unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o666))
                .unwrap();
        }
        assert_eq!(host_device_damage(dir.path()), Vec::<String>::new());
        assert!(
            host_device_damage(Path::new("/dev")).is_empty(),
            "this host's /dev"
        );
        let null = dir.path().join("null");
        nix::unistd::chown(&null, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        std::fs::set_permissions(&null, std::os::unix::fs::PermissionsExt::from_mode(0o000))
            .unwrap();
        let damage = host_device_damage(dir.path());
        assert_eq!(damage.len(), 1, "{damage:?}");
        assert!(damage[0].contains("owner uid 65534"), "{damage:?}");
        assert!(damage[0].contains("mode 0000"), "{damage:?}");
        assert!(damage[0].contains("mknod -m 0666"), "{damage:?}");
        std::fs::remove_file(dir.path().join("zero")).unwrap();
        std::fs::write(dir.path().join("zero"), b"").unwrap();
        assert_eq!(host_device_damage(dir.path()).len(), 2);
    }
}
