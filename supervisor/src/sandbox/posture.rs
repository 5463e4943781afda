//! The posture check: before the command's first instruction, the
//! supervisor inspects the sandboxed process from outside, through `/proc`,
//! the way gVisor's tests do — every thread must be in seccomp filter mode
//! with no_new_privs, hold no capability in any set, run as the planned
//! uid/gid, live in namespaces other than the supervisor's, and have no
//! descriptor above stderr that survives exec. A mismatch fails the turn.
//!
//! The `/proc` root is injectable so the parsing is tested on a fake tree.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// What was checked, and every finding that failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Posture {
    pub pid: i32,
    pub threads: usize,
    pub failures: Vec<String>,
    pub namespaces: Vec<String>,
}

impl Posture {
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }

    pub fn to_value(&self) -> Value {
        json!({
            "checked": true,
            "ok": self.ok(),
            "pid": self.pid,
            "threads": self.threads,
            "namespaces_differ": self.namespaces,
            "failures": self.failures,
        })
    }
}

/// The command stage (S3) of the init `init_pid`: the first child down the
/// chain PID 1 -> S3, or S1 -> S2 -> S3.
pub fn find_command(proc_root: &Path, init_pid: i32) -> Option<i32> {
    let children = |pid: i32| -> Option<i32> {
        let text =
            std::fs::read_to_string(proc_root.join(format!("{pid}/task/{pid}/children"))).ok()?;
        text.split_whitespace().next()?.parse().ok()
    };
    // PID 1's child when the supervisor cloned PID 1 itself; through S1,
    // S1's grandchild. The stage is parked and has no child of its own.
    let first = children(init_pid)?;
    Some(children(first).unwrap_or(first))
}

/// Why the parked sandbox of init `init_pid` can no longer take a turn:
/// a process of its chain (PID 1 -> S3, or S1 -> S2 -> S3) has ended or
/// is stopped (SIGSTOP, a ptrace stop) since it parked. `None`: each one
/// is alive and runnable. A warm sandbox waits between turns, where
/// anything with the rights to signal it may: a dead stage would end its
/// turn as a command killed by a signal, a dead PID 1 as E2041, a stopped
/// one at its timeout.
pub fn parked_chain_broken(proc_root: &Path, init_pid: i32) -> Option<String> {
    let broken = |pid: i32| match state_of(proc_root, pid) {
        None | Some('Z' | 'X' | 'x') => Some(format!("pid {pid} of it has ended")),
        Some('T' | 't') => Some(format!("pid {pid} of it is stopped")),
        Some(_) => None,
    };
    if let Some(why) = broken(init_pid) {
        return Some(why);
    }
    // The init is PID 1 itself (the last of its NSpid is 1), whose child
    // is the stage; or S1, whose grandchild is.
    let status =
        std::fs::read_to_string(proc_root.join(format!("{init_pid}/status"))).unwrap_or_default();
    let is_pid1 = field(&status, "NSpid").and_then(|v| v.split_whitespace().last()) == Some("1");
    let mut pid = init_pid;
    for _ in 0..if is_pid1 { 1 } else { 2 } {
        let child = std::fs::read_to_string(proc_root.join(format!("{pid}/task/{pid}/children")))
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse().ok());
        pid = match child {
            Some(c) => c,
            None => return Some(format!("pid {pid} of it has lost its child")),
        };
        if let Some(why) = broken(pid) {
            return Some(why);
        }
    }
    None
}

/// Field `n` after the command name (which may itself contain `)`) of
/// `<proc>/<pid>/stat`: 0 is the state, 1 the parent pid.
fn stat_field(proc: &Path, pid: i32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(n).map(str::to_owned)
}

/// The state letter of `pid`.
fn state_of(proc: &Path, pid: i32) -> Option<char> {
    stat_field(proc, pid, 0)?.chars().next()
}

/// The parent pid of `pid`.
pub fn parent_of(proc: &Path, pid: i32) -> Option<u32> {
    stat_field(proc, pid, 1)?.parse().ok()
}

fn field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::trim))
}

/// Checks `pid` (every thread) against the expected posture.
pub fn check(proc_root: &Path, pid: i32, uid: u32, gid: u32, supervisor_pid: u32) -> Posture {
    let mut p = Posture {
        pid,
        ..Posture::default()
    };
    let base: PathBuf = proc_root.join(pid.to_string());
    let tasks: Vec<String> = std::fs::read_dir(base.join("task"))
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    if tasks.is_empty() {
        p.failures.push(format!("pid {pid}: no threads visible"));
    }
    p.threads = tasks.len();
    for tid in &tasks {
        let Ok(status) = std::fs::read_to_string(base.join("task").join(tid).join("status")) else {
            p.failures.push(format!("thread {tid}: status unreadable"));
            continue;
        };
        let expect = |p: &mut Posture, name: &str, want: &str| {
            let got = field(&status, name).unwrap_or("<missing>");
            if got != want {
                p.failures
                    .push(format!("thread {tid}: {name} is {got}, expected {want}"));
            }
        };
        expect(&mut p, "Seccomp", "2");
        expect(&mut p, "NoNewPrivs", "1");
        for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            expect(&mut p, cap, "0000000000000000");
        }
        for (name, want) in [("Uid", uid), ("Gid", gid)] {
            let ids: Vec<&str> = field(&status, name)
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            if ids.len() != 4 || ids.iter().any(|i| *i != want.to_string()) {
                p.failures.push(format!(
                    "thread {tid}: {name} is {ids:?}, expected {want} in every slot"
                ));
            }
        }
    }
    for ns in ["mnt", "pid", "net", "ipc", "uts", "cgroup"] {
        let theirs = std::fs::read_link(base.join("ns").join(ns));
        let ours = std::fs::read_link(
            proc_root
                .join(supervisor_pid.to_string())
                .join("ns")
                .join(ns),
        );
        match (theirs, ours) {
            (Ok(a), Ok(b)) if a != b => p.namespaces.push(ns.to_owned()),
            (Ok(_), Ok(_)) => p
                .failures
                .push(format!("{ns} namespace is the supervisor's")),
            _ => p.failures.push(format!("{ns} namespace unreadable")),
        }
    }
    // Descriptors: 0-2, plus only close-on-exec ones that vanish at execve.
    match std::fs::read_dir(base.join("fd")) {
        Ok(rd) => {
            for fd in rd.filter_map(|e| e.ok()?.file_name().into_string().ok()?.parse::<i32>().ok())
            {
                if fd <= 2 {
                    continue;
                }
                let info = std::fs::read_to_string(base.join("fdinfo").join(fd.to_string()))
                    .unwrap_or_default();
                let flags = field(&info, "flags").and_then(|f| u32::from_str_radix(f, 8).ok());
                const O_CLOEXEC: u32 = 0o2_000_000;
                if flags.is_none_or(|f| f & O_CLOEXEC == 0) {
                    let target = std::fs::read_link(base.join("fd").join(fd.to_string()))
                        .map(|t| t.display().to_string())
                        .unwrap_or_default();
                    p.failures
                        .push(format!("fd {fd} ({target}) would survive exec"));
                }
            }
        }
        Err(e) => p.failures.push(format!("fd table unreadable: {e}")),
    }
    p
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_parent_pid_is_read_past_a_command_name_with_parentheses() {
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir(proc.path().join("42")).unwrap();
        std::fs::write(
            proc.path().join("42/stat"),
            "42 (a) b (c)) S 7 42 42 0 -1 4194560 0 0 0 0\n",
        )
        .unwrap();
        assert_eq!(parent_of(proc.path(), 42), Some(7));
        assert_eq!(parent_of(proc.path(), 43), None);
    }

    use super::*;

    /// A parked sandbox is of use only while its PID 1 and its stage are
    /// alive and not stopped, through S1 too.
    #[test]
    fn a_parked_chain_with_an_ended_or_stopped_process_is_broken() {
        let proc = tempfile::tempdir().unwrap();
        let put = |pid: i32, nspid: &str, state: char, children: &str| {
            let task = proc.path().join(format!("{pid}/task/{pid}"));
            std::fs::create_dir_all(&task).unwrap();
            std::fs::write(task.join("children"), children).unwrap();
            std::fs::write(
                proc.path().join(format!("{pid}/stat")),
                format!("{pid} (turnstile (x)) {state} 1 1 1 0"),
            )
            .unwrap();
            std::fs::write(
                proc.path().join(format!("{pid}/status")),
                format!("Name:\tx\nNSpid:\t{nspid}\n"),
            )
            .unwrap();
        };
        let broken = |init: i32| parked_chain_broken(proc.path(), init);
        // PID 1 -> stage, both waiting.
        put(10, "10\t1", 'S', "11 ");
        put(11, "11\t2", 'S', "");
        assert_eq!(broken(10), None);
        // S1 -> S2 -> stage.
        put(20, "20", 'S', "21 ");
        put(21, "21\t1", 'S', "22 ");
        put(22, "22\t2", 'S', "");
        assert_eq!(broken(20), None);
        // The stage stopped; then reaped by PID 1 (S2).
        put(22, "22\t2", 'T', "");
        assert_eq!(broken(20).as_deref(), Some("pid 22 of it is stopped"));
        put(21, "21\t1", 'S', "");
        assert_eq!(
            broken(20).as_deref(),
            Some("pid 21 of it has lost its child")
        );
        put(11, "11\t2", 't', "");
        assert_eq!(broken(10).as_deref(), Some("pid 11 of it is stopped"));
        // PID 1 stopped, or a zombie.
        put(11, "11\t2", 'S', "");
        put(10, "10\t1", 'T', "11 ");
        assert_eq!(broken(10).as_deref(), Some("pid 10 of it is stopped"));
        put(10, "10\t1", 'Z', "");
        assert_eq!(broken(10).as_deref(), Some("pid 10 of it has ended"));
        // A child listed but already gone from /proc; no such init.
        put(30, "30\t1", 'S', "31 ");
        assert_eq!(broken(30).as_deref(), Some("pid 31 of it has ended"));
        assert_eq!(broken(99).as_deref(), Some("pid 99 of it has ended"));
    }

    fn fake(root: &Path, pid: i32, status: &str, fds: &[(i32, &str)]) {
        let task = root.join(format!("{pid}/task/{pid}"));
        std::fs::create_dir_all(&task).unwrap();
        std::fs::write(task.join("status"), status).unwrap();
        std::fs::create_dir_all(root.join(format!("{pid}/fd"))).unwrap();
        std::fs::create_dir_all(root.join(format!("{pid}/fdinfo"))).unwrap();
        for (fd, flags) in fds {
            std::os::unix::fs::symlink("/dev/null", root.join(format!("{pid}/fd/{fd}"))).unwrap();
            std::fs::write(
                root.join(format!("{pid}/fdinfo/{fd}")),
                format!("pos:\t0\nflags:\t{flags}\n"),
            )
            .unwrap();
        }
        std::fs::create_dir_all(root.join(format!("{pid}/ns"))).unwrap();
        for ns in ["mnt", "pid", "net", "ipc", "uts", "cgroup"] {
            std::os::unix::fs::symlink(
                format!("{ns}:[{pid}]"),
                root.join(format!("{pid}/ns/{ns}")),
            )
            .unwrap();
        }
    }

    const GOOD: &str = "Name:\tx\nUid:\t65534\t65534\t65534\t65534\nGid:\t65534\t65534\t65534\t65534\n\
        CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
        CapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";

    #[test]
    fn a_correct_posture_passes() {
        let d = tempfile::tempdir().unwrap();
        fake(d.path(), 10, GOOD, &[(0, "02"), (3, "02000002")]);
        fake(d.path(), 1, GOOD, &[]);
        let p = check(d.path(), 10, 65534, 65534, 1);
        assert!(p.ok(), "{:?}", p.failures);
        assert_eq!(p.namespaces.len(), 6);
    }

    #[test]
    fn every_deviation_is_named() {
        let d = tempfile::tempdir().unwrap();
        let bad = GOOD
            .replace("Seccomp:\t2", "Seccomp:\t0")
            .replace("CapBnd:\t0000000000000000", "CapBnd:\t000001ffffffffff");
        fake(d.path(), 10, &bad, &[(5, "0100002")]);
        fake(d.path(), 1, GOOD, &[]);
        // Same namespaces as the supervisor:
        std::fs::remove_file(d.path().join("10/ns/net")).unwrap();
        std::os::unix::fs::symlink("net:[1]", d.path().join("10/ns/net")).unwrap();
        let p = check(d.path(), 10, 65534, 65534, 1);
        let all = p.failures.join("\n");
        for needle in [
            "Seccomp is 0",
            "CapBnd",
            "fd 5",
            "net namespace is the supervisor's",
        ] {
            assert!(all.contains(needle), "missing {needle} in:\n{all}");
        }
    }
}
