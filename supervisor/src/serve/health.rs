//! What the daemon's health looks at (issue 28 item 5): not only whether it
//! is stopping, but whether what it depends on still works — its state
//! directory (writable, free space), the cgroup hierarchy turns are built
//! in, its socket, the bus directories, the metrics listener, the pool's
//! workers, the ledgers of the sessions it served, the denial observer
//! and the network policy's kernel pieces. Each check
//! ends `ok`, `degraded` or `failed` with why; the daemon is READY only
//! when every check is ok, FAILED when one failed, DEGRADED otherwise.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Ok,
    Degraded,
    Failed,
}

/// One dependency looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub level: Level,
    pub detail: String,
}

impl Check {
    pub fn ok(name: &str, detail: impl Into<String>) -> Self {
        Self::new(name, Level::Ok, detail)
    }

    pub fn degraded(name: &str, detail: impl Into<String>) -> Self {
        Self::new(name, Level::Degraded, detail)
    }

    fn new(name: &str, level: Level, detail: impl Into<String>) -> Self {
        Self {
            name: name.to_owned(),
            level,
            detail: detail.into(),
        }
    }
}

/// Free space below which the state directory makes the daemon DEGRADED.
pub const STATE_MIN_FREE_BYTES: u64 = 256 << 20;

/// What the checks look at.
#[derive(Debug)]
pub struct Deps<'a> {
    pub state_dir: &'a Path,
    pub socket: Option<&'a Path>,
    pub bus_dir: Option<&'a Path>,
    pub metrics: Option<std::net::SocketAddr>,
    pub cgroup_root: &'a Path,
}

/// Every check, in order.
pub fn checks(d: &Deps<'_>) -> Vec<Check> {
    let mut out = vec![state_dir(d.state_dir), cgroups(d.cgroup_root)];
    if let Some(s) = d.socket {
        out.push(socket(s));
    }
    if let Some(b) = d.bus_dir {
        out.push(bus(b));
    }
    if let Some(m) = d.metrics {
        out.push(metrics(m));
    }
    out
}

/// READY, DEGRADED or FAILED from the checks (and whether it is stopping).
pub fn status(checks: &[Check], stopping: bool) -> &'static str {
    if checks.iter().any(|c| c.level == Level::Failed) {
        "FAILED"
    } else if stopping || checks.iter().any(|c| c.level == Level::Degraded) {
        "DEGRADED"
    } else {
        "READY"
    }
}

/// A probe file written, synced and removed: the directory takes writes.
fn writable(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".health-{}", std::process::id()));
    let r = std::fs::write(&probe, b"ok").and_then(|()| std::fs::File::open(&probe)?.sync_all());
    let _ = std::fs::remove_file(&probe);
    r
}

fn state_dir(dir: &Path) -> Check {
    const NAME: &str = "state_dir";
    if let Err(e) = writable(dir) {
        return Check::new(
            NAME,
            Level::Failed,
            format!(
                "{} does not take writes ({e}): no turn can record",
                dir.display()
            ),
        );
    }
    match nix::sys::statvfs::statvfs(dir) {
        Ok(s) if s.blocks_available() * s.fragment_size() < STATE_MIN_FREE_BYTES => Check::new(
            NAME,
            Level::Degraded,
            format!(
                "{}: only {} MiB free (ledger anchors, commit journals and turn dirs live there)",
                dir.display(),
                (s.blocks_available() * s.fragment_size()) >> 20
            ),
        ),
        Ok(s) => Check::new(
            NAME,
            Level::Ok,
            format!(
                "{} writable, {} MiB free",
                dir.display(),
                (s.blocks_available() * s.fragment_size()) >> 20
            ),
        ),
        Err(e) => Check::new(NAME, Level::Failed, format!("{}: {e}", dir.display())),
    }
}

fn cgroups(root: &Path) -> Check {
    const NAME: &str = "cgroups";
    match crate::sandbox::cgroup::detect(root) {
        Some(v) => Check::new(
            NAME,
            Level::Ok,
            format!("{} under {}", v.as_str(), root.display()),
        ),
        None => Check::new(
            NAME,
            Level::Failed,
            format!(
                "no usable cgroup hierarchy (memory and pids) under {}: no sandbox can be built",
                root.display()
            ),
        ),
    }
}

fn socket(path: &Path) -> Check {
    use std::os::unix::fs::FileTypeExt;
    const NAME: &str = "socket";
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            Check::new(NAME, Level::Ok, path.display().to_string())
        }
        Ok(_) => Check::new(
            NAME,
            Level::Failed,
            format!(
                "{} is no longer a socket: new clients cannot connect",
                path.display()
            ),
        ),
        Err(e) => Check::new(
            NAME,
            Level::Failed,
            format!(
                "{} is gone ({e}): new clients cannot connect",
                path.display()
            ),
        ),
    }
}

fn bus(dir: &Path) -> Check {
    const NAME: &str = "bus";
    for sub in ["input", "processing", "output", "error", "approvals"] {
        let d = dir.join(sub);
        if !d.is_dir() {
            return Check::new(
                NAME,
                Level::Failed,
                format!("{} is missing: messages cannot move", d.display()),
            );
        }
        if let Err(e) = writable(&d) {
            return Check::new(
                NAME,
                Level::Failed,
                format!("{} does not take writes: {e}", d.display()),
            );
        }
    }
    Check::new(NAME, Level::Ok, dir.display().to_string())
}

fn metrics(addr: std::net::SocketAddr) -> Check {
    const NAME: &str = "metrics";
    match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
        Ok(_) => Check::new(NAME, Level::Ok, addr.to_string()),
        Err(e) => Check::new(
            NAME,
            Level::Degraded,
            format!("the metrics listener at {addr} does not answer: {e}"),
        ),
    }
}

/// The pool's waiting workers: each must still be alive (a dead one
/// means its session's warm sandbox is gone with it).
pub fn pool(dead: &[(String, u32)], waiting: usize) -> Check {
    const NAME: &str = "pool";
    if dead.is_empty() {
        return Check::ok(NAME, format!("{waiting} worker(s) waiting, all alive"));
    }
    Check::degraded(
        NAME,
        format!(
            "{} of {waiting} waiting worker(s) died: {} (their sessions' next turns build cold)",
            dead.len(),
            dead.iter()
                .map(|(s, p)| format!("pid {p} of session {s}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

/// The denial observer (issue 27): loaded, or why not (turns still run;
/// their Landlock and view refusals go unexplained).
pub fn observer() -> Check {
    const NAME: &str = "denial_observer";
    match crate::sandbox::observe::get() {
        Ok(o) => Check::ok(NAME, o.how()),
        Err(why) => Check::degraded(
            NAME,
            format!("{why}: turns run, their in-sandbox refusals are not attributed"),
        ),
    }
}

/// The network policy's kernel pieces: network namespaces (every turn's
/// `isolated` network) and nftables (`restricted` / `allow_egress`).
pub fn network() -> Check {
    const NAME: &str = "network";
    if !Path::new("/proc/self/ns/net").exists() {
        return Check::new(
            NAME,
            Level::Failed,
            "the kernel has no network namespaces: no turn's network can be isolated",
        );
    }
    match crate::sandbox::egress::host_support() {
        Ok(()) => Check::ok(
            NAME,
            "network namespaces; nftables for egress by name (runsc: on hostinet, with allow_degraded gvisor_netstack)",
        ),
        Err(why) => Check::degraded(
            NAME,
            format!("{why}: `restricted` and `allow_egress` turns are refused (TS1070)"),
        ),
    }
}

/// Most sessions whose ledgers one health check verifies.
pub const MAX_LEDGER_SESSIONS: usize = 64;

/// Per served session, the fingerprint its ledgers had when they last
/// verified (see [`ledgers`]).
pub type VerifiedLedgers = std::collections::HashMap<String, Vec<(u64, u64, i64, i64)>>;

/// (inode, size, ctime s, ctime ns) of each ledger and its anchor; `None`
/// when one cannot be read (then the ledgers are verified, which says why).
fn fingerprint(files: &[crate::store::ledger::LedgerFiles]) -> Option<Vec<(u64, u64, i64, i64)>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for f in files {
        for p in [&f.path, &f.anchor] {
            let m = std::fs::symlink_metadata(p).ok()?;
            out.push((m.ino(), m.size(), m.ctime(), m.ctime_nsec()));
        }
    }
    Some(out)
}

/// The ledgers of the sessions the daemon served (the most recent
/// [`MAX_LEDGER_SESSIONS`]): every hash and link up to the anchored head.
pub fn ledgers(
    state_dir: &Path,
    sessions: &[(String, std::path::PathBuf)],
    verified: &std::sync::Mutex<VerifiedLedgers>,
) -> Check {
    const NAME: &str = "ledgers";
    let mut bad = Vec::new();
    for (sid, root) in sessions.iter().take(MAX_LEDGER_SESSIONS) {
        let checked = (|| -> crate::error::Result<()> {
            let id = turnstile_policy::SessionId::parse(sid)?;
            let ws = crate::store::layout::Workspace::open(root)?;
            let state = crate::store::layout::StateDir::open(state_dir, &ws, false)?;
            let session = crate::store::session::Session::open(&ws, &state, &id, None)?;
            let files: Vec<_> = crate::store::ledger::LedgerKind::ALL
                .into_iter()
                .map(|kind| session.ledger(kind))
                .collect();
            // Unchanged since it last verified (same inodes, sizes and
            // change times of every ledger and anchor: any write, even
            // one that restores the size or the mtime, moves the ctime):
            // not read again. A busy daemon's health otherwise re-read
            // every served ledger whole on every probe (56 ms p50 after
            // bench-serve's load).
            let print = fingerprint(&files);
            if print.is_some() && verified.lock().ok().and_then(|v| v.get(sid).cloned()) == print {
                return Ok(());
            }
            for l in &files {
                l.verify()?;
            }
            if let (Some(p), Ok(mut v)) = (print, verified.lock()) {
                v.insert(sid.clone(), p);
            }
            Ok(())
        })();
        if let Err(e) = checked {
            if let Ok(mut v) = verified.lock() {
                v.remove(sid);
            }
            bad.push(format!("session {sid}: {e}"));
        }
    }
    if bad.is_empty() {
        Check::ok(
            NAME,
            format!(
                "{} served session(s) verified",
                sessions.len().min(MAX_LEDGER_SESSIONS)
            ),
        )
    } else {
        Check::new(NAME, Level::Failed, bad.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each dependency broken for real turns its check (and the status).
    #[test]
    fn issue_28_health_looks_at_what_the_daemon_depends_on() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let bus = dir.path().join("bus");
        for sub in ["input", "processing", "output", "error", "approvals"] {
            std::fs::create_dir_all(bus.join(sub)).unwrap();
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sock_path = dir.path().join("s.sock");
        let _sock = std::os::unix::net::UnixListener::bind(&sock_path).unwrap();
        let cg = Path::new("/sys/fs/cgroup");
        let deps = Deps {
            state_dir: &state,
            socket: Some(&sock_path),
            bus_dir: Some(&bus),
            metrics: Some(addr),
            cgroup_root: cg,
        };
        let all = checks(&deps);
        if crate::sandbox::cgroup::detect(cg).is_some() {
            assert_eq!(status(&all, false), "READY", "{all:?}");
            assert_eq!(status(&all, true), "DEGRADED");
        }
        let level = |deps: &Deps<'_>, name: &str| {
            checks(deps)
                .into_iter()
                .find(|c| c.name == name)
                .map(|c| c.level)
        };
        // The metrics listener gone: degraded.
        drop(listener);
        assert_eq!(level(&deps, "metrics"), Some(Level::Degraded));
        // A bus directory removed: failed.
        std::fs::remove_dir(bus.join("approvals")).unwrap();
        assert_eq!(level(&deps, "bus"), Some(Level::Failed));
        // The socket unlinked: failed.
        std::fs::remove_file(&sock_path).unwrap();
        assert_eq!(level(&deps, "socket"), Some(Level::Failed));
        // The state directory gone: failed, and so the daemon.
        std::fs::remove_dir_all(&state).unwrap();
        assert_eq!(level(&deps, "state_dir"), Some(Level::Failed));
        assert_eq!(status(&checks(&deps), false), "FAILED");
        // No cgroup hierarchy where turns are built: failed.
        assert_eq!(
            level(
                &Deps {
                    cgroup_root: dir.path(),
                    ..deps
                },
                "cgroups"
            ),
            Some(Level::Failed)
        );
    }
}
