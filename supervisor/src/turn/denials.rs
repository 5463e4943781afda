//! Denials explained (issue 11, FR-RT-003/010/011): what each layer refused,
//! in the evidence, in the shape of the pre-execution violations, with the
//! layer, a count and a hint — and, where a layer's refusals cannot be
//! observed, a statement saying so instead of an empty list.
//!
//! Observed today: seccomp's deny list, exactly, through the filter's user
//! notification ([`crate::sandbox::notify`]). Not observable: Landlock
//! (its denials go only to the kernel's audit subsystem, whose
//! configuration turnstile must not change, and which it does not read) and
//! the mount layer (EROFS on the read-only view, ENOENT for what is not in
//! it: no kernel record exists).

use std::collections::BTreeMap;

use turnstile_policy::seccomp::SeccompProfile;
use turnstile_policy::timefmt::rfc3339_micros;

use crate::sandbox::notify::Denials;
use crate::store::record::{Layer, Observed, ViolatedCapability, Violation};

/// Why Landlock's refusals are not in the evidence.
pub const LANDLOCK_UNOBSERVED: &str = "Landlock reports denials only to the kernel audit subsystem; turnstile never changes the host's audit configuration and does not read audit records, so a Landlock EACCES is not recorded";
/// Why the mount layer's refusals are not in the evidence.
pub const MOUNT_UNOBSERVED: &str =
    "the read-only view (EROFS) and what is not in it (ENOENT) leave no kernel record";

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

/// The hint for a syscall the turn's `profile` refused: why.
fn syscall_hint(profile: &SeccompProfile, name: &str) -> String {
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
            let r = profile.arg_rules.iter().find(|r| r.syscall == name)?;
            Some(format!("these arguments are refused ({})", r.why))
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
                hint: Some(syscall_hint(profile, &name)),
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

/// Which layers' denials this turn's evidence can show.
pub fn observability(denials: &Result<Denials, String>) -> BTreeMap<String, Observed> {
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
        ("landlock".to_owned(), not(LANDLOCK_UNOBSERVED)),
        ("mount".to_owned(), not(MOUNT_UNOBSERVED)),
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
