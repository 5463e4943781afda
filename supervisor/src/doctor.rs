//! `supervise doctor`: what this host can enforce, and what to do about
//! what it cannot. READY / DEGRADED / FAILED with reasons.

use std::path::Path;

use serde_json::{Value, json};

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

/// The health report.
pub fn report() -> (String, Value) {
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
    let denials = json!({
        "seccomp": if user_notif { json!({"observed": true, "via": "seccomp user notification"}) }
            else { json!({"observed": false, "why": "the kernel lacks SECCOMP_RET_USER_NOTIF"}) },
        "landlock": {"observed": false, "why": crate::denials::LANDLOCK_UNOBSERVED},
        "mount": {"observed": false, "why": crate::denials::MOUNT_UNOBSERVED},
    });
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
    let runtimes: Vec<Value> = ["runc", "crun", "runsc", "kata-runtime", "bwrap"]
        .iter()
        .map(|r| json!({"name": r, "path": which(r)}))
        .collect();
    let status = status_of(&failed, &degraded);
    let value = json!({
        "status": status,
        "reasons": failed.iter().chain(&degraded).collect::<Vec<_>>(),
        "root": root,
        "landlock_abi": abi,
        "landlock_abi_required": turnstile_policy::plan::LANDLOCK_ABI,
        "landlock_unenforced": unenforced.iter().chain(&unenforced_net).collect::<Vec<_>>(),
        "seccomp": seccomp,
        "overlayfs": overlay,
        "user_namespaces": userns,
        "cgroup": cg.map(cgroup::Version::as_str),
        "runtimes": runtimes,
        "denials_observed": denials,
    });
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
    for r in &runtimes {
        text += &format!(
            "  {:<15}  {}\n",
            r["name"].as_str().unwrap_or_default(),
            r["path"].as_str().unwrap_or("not installed")
        );
    }
    for reason in failed.iter().chain(&degraded) {
        text += &format!("  - {reason}\n");
    }
    (text, value)
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
/// free space, sessions whose ledgers do not verify (FAILED), and what a
/// stopped supervisor left unrecovered (DEGRADED: run `supervise recover`).
/// Read-only: nothing is recovered or changed.
pub fn health(state_dir: &Path) -> (String, Value) {
    let (_, host) = report();
    let mut failed: Vec<String> = Vec::new();
    let mut degraded: Vec<String> = Vec::new();
    for r in host["reasons"].as_array().into_iter().flatten() {
        let r = r.as_str().unwrap_or_default().to_owned();
        if host["status"] == "FAILED" {
            failed.push(r);
        } else {
            degraded.push(r);
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
    let state = crate::layout::StateDir::at(state_dir);
    for (id, ws) in crate::recover::known_sessions(&state, None) {
        let mut entry = json!({"session_id": id.as_str(), "root": ws.root_str()});
        let session = match crate::session::Session::open(&ws, &state, &id, None) {
            Ok(s) => s,
            Err(e) => {
                failed.push(format!("session {id}: {e}"));
                entry["error"] = json!(e.to_string());
                sessions.push(entry);
                continue;
            }
        };
        let mut warnings = Vec::new();
        for kind in crate::ledger::LedgerKind::ALL {
            match session.ledger(kind).verify() {
                Ok(r) => warnings.extend(r.warnings),
                Err(e) => {
                    failed.push(format!("session {id}: {} ledger: {e}", kind.as_str()));
                    entry["integrity"] = json!(e.to_string());
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
        entry["warnings"] = json!(warnings);
        entry["leftovers"] = json!(leftovers);
        sessions.push(entry);
    }
    let status = status_of(&failed, &degraded);
    let value = json!({
        "status": status,
        "reasons": failed.iter().chain(&degraded).collect::<Vec<_>>(),
        "host": host,
        "state_dir": state_dir.display().to_string(),
        "state_free_bytes": free,
        "sessions": sessions,
    });
    let mut text = format!("turnstile health: {status}\n");
    text += &format!(
        "  state dir: {} ({} sessions, {} MiB free)\n",
        state_dir.display(),
        value["sessions"].as_array().map_or(0, Vec::len),
        free.map_or(0, |f| f >> 20)
    );
    for reason in failed.iter().chain(&degraded) {
        text += &format!("  - {reason}\n");
    }
    (text, value)
}
