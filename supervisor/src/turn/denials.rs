//! Denials explained (issue 11, FR-RT-003/010/011): what each layer refused,
//! in the evidence, in the shape of the pre-execution violations, with the
//! layer, a count and a hint — and, where a layer's refusals cannot be
//! observed, a statement saying so instead of an empty list.
//!
//! Observed: seccomp's deny list, exactly, through the filter's user
//! notification ([`crate::sandbox::notify`]); Landlock's and the view's
//! refusals (issue 27) through the BPF observer ([`crate::sandbox::observe`]):
//! each path syscall of the turn that failed with EACCES (Landlock, once
//! the file's mode bits are seen to allow it), EROFS (the read-only view)
//! or ENOENT for a path that exists on the host but not in the view (a
//! hidden read). A path that exists nowhere is no violation; neither is an
//! EACCES the file's own permissions explain.

use std::collections::BTreeMap;

use turnstile_policy::seccomp::SeccompProfile;
use turnstile_policy::timefmt::rfc3339_micros;

use turnstile_policy::pattern::{PatternSet, Target};
use turnstile_policy::plan::Plan;

use crate::sandbox::notify::Denials;
use crate::sandbox::observe;
use crate::store::record::{Layer, Observed, ViolatedCapability, Violation};

/// How Landlock's and the view's refusals are observed.
pub const BPF_VIA: &str = "BPF on raw_syscalls:sys_exit, by the turn's cgroup (path syscalls that failed; counted in the kernel)";

/// The name of syscall `nr` of audit architecture `arch`.
fn syscall_name(arch: u32, nr: i32) -> String {
    let native = libseccomp::ScmpArch::native();
    let name = libseccomp::ScmpSyscall::from(nr)
        .get_name_by_arch(native)
        .ok();
    match name {
        Some(n) if arch == audit_arch(native) => n,
        _ => format!("syscall {nr} (arch {arch:#x})"),
    }
}

fn audit_arch(a: libseccomp::ScmpArch) -> u32 {
    match a {
        libseccomp::ScmpArch::X8664 => 0xc000_003e,
        libseccomp::ScmpArch::Aarch64 => 0xc000_00b7,
        _ => 0,
    }
}

/// The hint for a syscall the turn's `profile` refused: why. For a call
/// refused by an argument rule, the rule its first refused call's
/// arguments (`args`) match (each of clone's and unshare's namespace
/// flags has its own), else the syscall's first.
fn syscall_hint(profile: &SeccompProfile, name: &str, args: &[u64]) -> String {
    let why = turnstile_policy::seccomp::deny_reason(name)
        .map(str::to_owned)
        .or_else(|| {
            let a = profile.allowlists.iter().find(|a| a.syscall == name)?;
            Some(format!("these arguments are refused: {}", a.why))
        })
        .or_else(|| {
            profile
                .xattr_checked
                .iter()
                .any(|c| c.syscall == name)
                .then(|| turnstile_policy::seccomp::OVERLAY_XATTR_WHY.to_owned())
        })
        .or_else(|| {
            let mut rules = profile.arg_rules.iter().filter(|r| r.syscall == name);
            let first = rules.clone().next()?;
            let matched = rules.find(|r| {
                args.get(r.arg as usize)
                    .is_some_and(|a| (*a as u32) & r.mask == r.value)
            });
            Some(format!(
                "these arguments are refused ({})",
                matched.unwrap_or(first).why
            ))
        })
        .unwrap_or_else(|| {
            "it can change the kernel's or another process's state beyond the turn".into()
        });
    format!(
        "denied by the sandbox baseline, not by the manifest (no manifest entry allows it): {why}"
    )
}

/// When the turn started: its (injected) clock reading and the monotonic
/// instant, to date the first denials.
#[derive(Debug, Clone, Copy)]
pub struct TurnClock {
    pub at: time::OffsetDateTime,
    pub instant: std::time::Instant,
    /// A deterministic session: every denial is dated `at`, without pid.
    pub deterministic: bool,
}

/// The evidence violations for the syscalls the listener saw, explained
/// from the profile the turn ran with.
pub fn syscall_violations(
    d: &Denials,
    profile: &SeccompProfile,
    session: &str,
    turn: u64,
    clock: TurnClock,
) -> Vec<Violation> {
    let baseline = || ViolatedCapability::DeniedSyscall {
        capability: "sandbox baseline".into(),
        pattern: None,
    };
    let mut out: Vec<Violation> = d
        .syscalls
        .iter()
        .map(|s| {
            let name = syscall_name(s.arch, s.nr);
            // Arguments hold pointers (ASLR) and pids vary: a deterministic
            // session records neither.
            let first = if clock.deterministic {
                String::new()
            } else {
                format!(
                    "; first by pid {} with arguments {:x?}",
                    s.first_pid, s.first_args
                )
            };
            let at = if clock.deterministic {
                clock.at
            } else {
                clock.at + s.first_at.saturating_duration_since(clock.instant)
            };
            Violation {
                attempted_operation: "syscall".into(),
                target: name.clone(),
                violated_capability: baseline(),
                details: format!(
                    "`{name}` was refused with {} {} time(s){first}",
                    nix::errno::Errno::from_raw(s.errno),
                    s.count
                ),
                layer: Layer::Seccomp,
                hint: Some(syscall_hint(profile, &name, &s.first_args)),
                count: s.count,
                session_id: session.to_owned(),
                turn_number: turn,
                timestamp: Some(rfc3339_micros(at)),
            }
        })
        .collect();
    if d.overflow > 0 {
        out.push(Violation {
            attempted_operation: "syscall".into(),
            target: "(other syscalls)".into(),
            violated_capability: baseline(),
            details: format!(
                "{} more denials of syscalls beyond the first {} distinct ones",
                d.overflow,
                crate::sandbox::notify::MAX_DISTINCT
            ),
            layer: Layer::Seccomp,
            hint: Some("denied by the sandbox baseline".into()),
            count: d.overflow,
            session_id: session.to_owned(),
            turn_number: turn,
            timestamp: None,
        });
    }
    out
}

/// Distinct path refusals itemized per turn; the rest are one counted
/// record (the evidence stays bounded).
pub const MAX_RECORDED: usize = 256;

/// The name of syscall `nr` of the native architecture (`exec` for the
/// observer's -1: a program that started).
pub fn syscall_of(nr: i32, native: libseccomp::ScmpArch) -> String {
    if nr == -1 {
        return "exec".into();
    }
    libseccomp::ScmpSyscall::from(nr)
        .get_name_by_arch(native)
        .unwrap_or_else(|_| format!("syscall {nr}"))
}

/// What a path syscall attempted: `read`, `write`, `create`, `remove`,
/// `rename`, `link`, `execute`, `stat` or `chmod`/`chown`.
pub fn operation(name: &str, flags: u32) -> &'static str {
    let acc = flags & (nix::libc::O_ACCMODE as u32);
    let writes = acc != nix::libc::O_RDONLY as u32
        || flags & (nix::libc::O_CREAT | nix::libc::O_TRUNC) as u32 != 0;
    match name {
        "open" | "openat" | "openat2" if flags & nix::libc::O_CREAT as u32 != 0 => "create",
        "open" | "openat" | "openat2" if writes => "write",
        "open" | "openat" | "openat2" => "read",
        "creat" | "mkdir" | "mkdirat" | "mknod" | "mknodat" | "symlink" | "symlinkat" => "create",
        "link" | "linkat" => "link",
        "unlink" | "unlinkat" | "rmdir" => "remove",
        "rename" | "renameat" | "renameat2" => "rename",
        "truncate" => "write",
        "execve" | "execveat" | "exec" => "execute",
        "chmod" | "fchmodat" | "fchmodat2" => "chmod",
        "chown" | "lchown" | "fchownat" => "chown",
        _ => "stat",
    }
}

/// What the turn needed to see or change for one refused operation.
fn needs(op: &str) -> &'static str {
    match op {
        "read" | "stat" => "read",
        "execute" => "execute",
        _ => "write",
    }
}

/// Directories whose host content the view never shows (the turn gets its
/// own): an ENOENT there says nothing about the grants.
const OWN_DIRS: [&str; 7] = [
    "/tmp", "/var/tmp", "/dev", "/proc", "/sys", "/run", "/dev/shm",
];

/// Whether the file's mode bits alone refuse `need` to the turn's user (the
/// workspace is seen through an idmapped mount as its owner's).
fn dac_refuses(meta: &std::fs::Metadata, need: &str, as_owner: bool) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode();
    let bits = if as_owner { (mode >> 6) & 7 } else { mode & 7 };
    let want = match need {
        "read" => 4,
        "execute" => 1,
        _ => 2,
    };
    bits & want == 0
}

/// The evidence violations for the path operations the kernel refused
/// (Landlock and the view), explained from the plan and the manifest's
/// forbidden patterns.
#[allow(clippy::too_many_arguments)]
pub fn path_violations(
    o: &observe::Observed,
    plan: &Plan,
    forbidden: Option<&PatternSet>,
    session: &str,
    turn: u64,
    clock: TurnClock,
) -> Vec<Violation> {
    let root = plan.root.trim_end_matches('/');
    let host = |p: &str| -> std::path::PathBuf {
        match (
            &plan.system_root,
            p.starts_with(&format!("{root}/")) || p == root,
        ) {
            (Some(sys), false) => std::path::Path::new(sys).join(p.trim_start_matches('/')),
            _ => std::path::PathBuf::from(p),
        }
    };
    let native = libseccomp::ScmpArch::native();
    // (operation, target, layer) -> violation being built.
    let mut merged: BTreeMap<(String, String, &'static str), (Violation, std::time::Instant)> =
        BTreeMap::new();
    let mut skipped_distinct = 0u64;
    for d in &o.denials {
        let name = syscall_of(d.nr, native);
        let op = operation(&name, d.flags);
        let need = needs(op);
        let inside = d.path == root || d.path.starts_with(&format!("{root}/"));
        let meta = std::fs::metadata(host(&d.path));
        // What the turn may write: its writable scopes, its session tmp
        // dir (HOME, TMPDIR) and its own ephemeral dirs.
        let in_scope = (inside
            && plan.writable_scopes.iter().any(|s| {
                let s = format!("{root}/{}", s.trim_matches('/'));
                s == root || d.path == s || d.path.starts_with(&format!("{s}/"))
            }))
            || d.path.starts_with(&format!("{root}/tmp/"))
            || (!inside
                && OWN_DIRS
                    .iter()
                    .any(|o| d.path == *o || d.path.starts_with(&format!("{o}/"))));
        let layer = match d.errno {
            nix::libc::EROFS => Layer::Mount,
            nix::libc::EACCES => {
                // Landlock never refuses a stat or access probe, and what
                // the turn can write (its scopes, its tmp) it can also
                // chmod: an EACCES there is the file's own mode (the host's
                // copy, if any, says nothing about the turn's).
                if op == "stat" {
                    continue;
                }
                // Executing is the exception: Landlock refuses it wherever
                // no execute rule reaches (a binary the turn built, a
                // script in its scratch, a venv's entry points), whatever
                // the file's mode (red-team stop 61: such refusals went
                // unrecorded). Only under an execute rule can the mode be
                // why.
                let executable = || {
                    plan.landlock.execute.iter().any(|r| {
                        let r = r.trim_end_matches('/');
                        d.path == r || d.path.starts_with(&format!("{r}/"))
                    })
                };
                if in_scope && (op != "execute" || executable()) {
                    continue;
                }
                if let Ok(m) = &meta {
                    if need != "write" && !in_scope && dac_refuses(m, need, inside) {
                        continue;
                    }
                }
                Layer::Landlock
            }
            nix::libc::ENOENT => {
                // A stat or access probe is not an attempt: programs probe
                // many paths (PATH searches, optional config files), and
                // the view answers a hidden path as a missing one.
                if op == "stat"
                    || (!inside
                        && OWN_DIRS
                            .iter()
                            .any(|o| d.path == *o || d.path.starts_with(&format!("{o}/"))))
                {
                    continue;
                }
                let exists = if need == "read" || need == "execute" {
                    std::fs::symlink_metadata(host(&d.path)).is_ok()
                } else {
                    // A create in a directory the view hides.
                    std::path::Path::new(&d.path).parent().is_some_and(|p| {
                        std::fs::symlink_metadata(host(&p.to_string_lossy())).is_ok()
                    }) && std::fs::symlink_metadata(host(&d.path)).is_err()
                };
                if !exists || in_scope {
                    continue;
                }
                Layer::Mount
            }
            _ => continue,
        };
        // What a hidden symlink leads to is what the grant must name.
        let path = if d.errno == nix::libc::ENOENT {
            std::fs::canonicalize(host(&d.path))
                .ok()
                .filter(|_| plan.system_root.is_none())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_else(|| d.path.clone())
        } else {
            d.path.clone()
        };
        let inside = path == root || path.starts_with(&format!("{root}/"));
        let target = if inside {
            path.strip_prefix(&format!("{root}/"))
                .unwrap_or(".")
                .to_owned()
        } else {
            path.clone()
        };
        let pattern =
            forbidden.and_then(|f| f.matching(&Target::new(root, &path)).map(|p| p.to_string()));
        let (violated, hint) = match pattern {
            Some(p) => (
                ViolatedCapability::Forbidden { pattern: p.clone() },
                format!("forbidden beats every grant (`{p}`); no entry can allow it"),
            ),
            None => {
                // `/tmp` and `/var/tmp` are a turn's own writable tmpfs —
                // unless the workspace lies beneath one: then it stays
                // read-only (a write grant on it would cover the
                // workspace's view), and only moving the workspace helps.
                let tmp_over_root = ["/tmp", "/var/tmp"].into_iter().find(|t| {
                    (path == *t || path.starts_with(&format!("{t}/")))
                        && root.starts_with(&format!("{t}/"))
                });
                // Another session's directory: never granted, so the usual
                // "add it to the manifest" would mislead.
                let other_session = inside
                    && turnstile_policy::pattern::other_session_dir(&target, session).is_some();
                let hint = match (need, inside, tmp_over_root) {
                    _ if other_session => format!(
                        "`{target}` lies in another session's directory: a turn writes only its own session's, and reads none of another owner's (tenant or uid) whatever its manifest grants; pass what it needs as a declared input or through the file bus"
                    ),
                    ("write", false, Some(t)) => format!(
                        "`{t}` is read-only in this turn because the workspace ({root}) lies beneath it: use $TMPDIR (the session's scratch), or put the workspace outside `{t}`"
                    ),
                    ("write", false, None) => "writes outside the workspace are never granted: the system view is read-only".to_owned(),
                    ("write", true, _) if d.errno == nix::libc::EROFS => format!("add `{target}` (or a pattern covering it) to `capabilities.write`: that part of the workspace is read-only in the view"),
                    ("execute", _, _) => format!("add `{target}` to `capabilities.execute` (and to `read`)"),
                    (cap, _, _) => format!("add `{target}` (or a pattern covering it) to `capabilities.{cap}`"),
                };
                (
                    ViolatedCapability::NotGranted {
                        capability: need.to_owned(),
                    },
                    hint,
                )
            }
        };
        let why = match layer {
            Layer::Mount if d.errno == nix::libc::ENOENT => {
                "it exists on the host but the turn's view does not show it"
            }
            Layer::Mount => "the view is read-only there",
            _ => "Landlock refused it",
        };
        let key = (op.to_owned(), target.clone(), layer.as_str());
        if let Some((v, first)) = merged.get_mut(&key) {
            v.count += d.count;
            if d.first_at < *first {
                *first = d.first_at;
            }
            continue;
        }
        if merged.len() >= MAX_RECORDED {
            skipped_distinct += d.count;
            continue;
        }
        let first = if clock.deterministic {
            String::new()
        } else {
            format!("; first by pid {}", d.pid)
        };
        let errno = nix::errno::Errno::from_raw(d.errno);
        let v = Violation {
            attempted_operation: op.to_owned(),
            target: target.clone(),
            violated_capability: violated,
            details: format!(
                "`{name}` ({op}) of `{}` was refused with {errno}: {why}{first}",
                d.path
            ),
            layer,
            hint: Some(hint),
            count: d.count,
            session_id: session.to_owned(),
            turn_number: turn,
            timestamp: None,
        };
        merged.insert(key, (v, d.first_at));
    }
    let mut out: Vec<(Violation, std::time::Instant)> = merged.into_values().collect();
    out.sort_by_key(|(_, at)| *at);
    let mut out: Vec<Violation> = out
        .into_iter()
        .map(|(mut v, at)| {
            let at = if clock.deterministic {
                clock.at
            } else {
                clock.at + at.saturating_duration_since(clock.instant)
            };
            v.details = format!("{} ({} time(s))", v.details, v.count);
            v.timestamp = Some(rfc3339_micros(at));
            v
        })
        .collect();
    if o.unreadable > 0 {
        out.push(Violation {
            attempted_operation: "file".into(),
            target: "(unreadable paths)".into(),
            violated_capability: ViolatedCapability::NotGranted {
                capability: "file access".into(),
            },
            details: format!(
                "{} refused path operations whose path could not be read from the process's memory when the call returned (counted, not itemized)",
                o.unreadable
            ),
            layer: Layer::Landlock,
            hint: None,
            count: o.unreadable,
            session_id: session.to_owned(),
            turn_number: turn,
            timestamp: None,
        });
    }
    let more = o.overflow + skipped_distinct;
    if more > 0 {
        out.push(Violation {
            attempted_operation: "file".into(),
            target: "(other paths)".into(),
            violated_capability: ViolatedCapability::NotGranted {
                capability: "file access".into(),
            },
            details: format!(
                "{more} more refused path operations beyond the first {MAX_RECORDED} distinct ones (counted, not itemized)"
            ),
            layer: Layer::Landlock,
            hint: None,
            count: more,
            session_id: session.to_owned(),
            turn_number: turn,
            timestamp: None,
        });
    }
    out
}

/// Which layers' denials this turn's evidence can show.
pub fn observability(
    denials: &Result<Denials, String>,
    paths: &Result<observe::Observed, String>,
) -> BTreeMap<String, Observed> {
    let bpf = || match paths {
        Ok(_) => Observed {
            observed: true,
            via: Some(BPF_VIA.into()),
            why: None,
        },
        Err(why) => Observed {
            observed: false,
            via: None,
            why: Some(why.clone()),
        },
    };
    let not = |why: &str| Observed {
        observed: false,
        via: None,
        why: Some(why.to_owned()),
    };
    BTreeMap::from([
        (
            "seccomp".to_owned(),
            match denials {
                Ok(_) => Observed {
                    observed: true,
                    via: Some("seccomp user notification (exact, per turn)".into()),
                    why: None,
                },
                Err(why) => not(why),
            },
        ),
        ("landlock".to_owned(), bpf()),
        ("mount".to_owned(), bpf()),
    ])
}

/// The evidence's `external_calls[]` and the `network` violations of a
/// turn's egress (issue 26): one violation per denied flow, with the
/// `egress` entry that would allow it as the hint.
pub fn network_records(
    r: &crate::sandbox::egress::Report,
    session: &str,
    turn: u64,
    clock: TurnClock,
) -> (Vec<crate::store::record::ExternalCall>, Vec<Violation>) {
    let date = |i: Option<std::time::Instant>| {
        i.map(|i| {
            if clock.deterministic {
                rfc3339_micros(clock.at)
            } else {
                rfc3339_micros(clock.at + i.saturating_duration_since(clock.instant))
            }
        })
    };
    let mut calls = Vec::new();
    let mut violations = Vec::new();
    for f in &r.flows {
        calls.push(crate::store::record::ExternalCall {
            name: f.name.clone(),
            address: f.address.clone(),
            port: f.port,
            protocol: f.protocol.to_owned(),
            allowed: f.allowed,
            decided_by: f.decided_by.clone(),
            count: f.count,
            bytes_out: f.bytes_out,
            bytes_in: f.bytes_in,
            first: date(f.first),
            last: date(f.last),
            error: f.error.clone(),
        });
        if f.allowed {
            continue;
        }
        let target = match &f.name {
            Some(n) => format!("{n}:{}", f.port),
            None if f.address.contains(':') => format!("[{}]:{}", f.address, f.port),
            None => format!("{}:{}", f.address, f.port),
        };
        violations.push(Violation {
            attempted_operation: match f.protocol {
                "dns" => "resolve".into(),
                p => format!("{p} connect"),
            },
            target: target.clone(),
            violated_capability: ViolatedCapability::NotGranted {
                capability: "egress".into(),
            },
            details: format!("{} refused {} time(s): {}", target, f.count, f.decided_by),
            layer: Layer::Network,
            hint: Some(match &f.hint {
                Some(h) => format!("add `{h}` to `egress`"),
                None => f.decided_by.clone(),
            }),
            count: f.count,
            session_id: session.to_owned(),
            turn_number: turn,
            timestamp: date(f.first),
        });
    }
    if r.dropped > 0 {
        violations.push(Violation {
            attempted_operation: "connect".into(),
            target: "(other destinations)".into(),
            violated_capability: ViolatedCapability::NotGranted {
                capability: "egress".into(),
            },
            details: format!(
                "{} more refused flows beyond the first {} distinct ones",
                r.dropped,
                crate::sandbox::egress::MAX_FLOWS
            ),
            layer: Layer::Network,
            hint: None,
            count: r.dropped,
            session_id: session.to_owned(),
            turn_number: turn,
            timestamp: None,
        });
    }
    (calls, violations)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal by an argument rule is explained by the rule the call's
    /// arguments matched: unshare(CLONE_NEWUSER) names CLONE_NEWUSER, not
    /// the syscall's first rule.
    #[test]
    fn an_argument_refusal_names_the_flag_the_call_used() {
        let p = SeccompProfile::default_profile();
        let hint = syscall_hint(&p, "unshare", &[0x1000_0000, 0, 0, 0, 0, 0]);
        assert!(hint.contains("unshare with CLONE_NEWUSER"), "{hint}");
        assert!(hint.contains("namespaces"), "{hint}");
        let hint = syscall_hint(&p, "unshare", &[0x80, 0, 0, 0, 0, 0]);
        assert!(hint.contains("CLONE_NEWTIME"), "{hint}");
        let hint = syscall_hint(&p, "clone", &[0x4000_0011, 0, 0, 0, 0, 0]);
        assert!(hint.contains("clone with CLONE_NEWNET"), "{hint}");
        // High bits do not count (the filter compares the low 32).
        let hint = syscall_hint(&p, "unshare", &[(1 << 40) | 0x2000_0000, 0, 0, 0, 0, 0]);
        assert!(hint.contains("CLONE_NEWPID"), "{hint}");
        let hint = syscall_hint(&p, "setns", &[0; 6]);
        assert!(hint.contains("enters namespaces"), "{hint}");
    }
}
