//! Compiles the policy's [`SeccompProfile`] into a BPF filter with
//! libseccomp — once, in the supervisor, before any fork — and loads it as
//! the very last step before `execve`.
//!
//! Native architecture only: no `add_arch`. Adding x86 or x32 would let the
//! i386 `int $0x80` path through with its own syscall numbers (MACHINE-NOTES);
//! with a native-only filter those and x32 numbers hit the bad-arch action,
//! which kills the process.

use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};
use turnstile_policy::seccomp::complement_cubes;
use turnstile_policy::seccomp::{SeccompProfile, allow_conditions};

use crate::error::{Result, SupervisorError};

fn err(detail: String) -> SupervisorError {
    SupervisorError::Sandbox {
        step: "compile seccomp filter",
        detail,
        source: None,
    }
}

/// A compiled filter and the names this libseccomp/arch did not know (those
/// fall to the default action, which is recorded, not hidden).
#[derive(Debug)]
pub struct CompiledFilter {
    pub unknown_syscalls: Vec<String>,
}

/// How a refusal of the profile is compiled: a user notification, which the
/// supervisor answers with `errno` and records (sandbox::notify) — so every
/// refusal a rule makes is observed, not just the deny list's.
fn refusal(_errno: i32) -> ScmpAction {
    ScmpAction::Notify
}

/// The errno the listener answers for each syscall number whose refusal
/// is not EPERM (argument allowlists such as socket families).
pub fn notify_errnos(profile: &SeccompProfile) -> Vec<(i32, i32)> {
    profile
        .allowlists
        .iter()
        .filter(|a| a.errno != turnstile_policy::seccomp::EPERM)
        .filter_map(|a| Some((i32::from(ScmpSyscall::from_name(&a.syscall).ok()?), a.errno)))
        .chain(
            profile
                .arg_rules
                .iter()
                .filter(|r| r.errno != turnstile_policy::seccomp::EPERM)
                .filter_map(|r| {
                    Some((i32::from(ScmpSyscall::from_name(&r.syscall).ok()?), r.errno))
                }),
        )
        .collect()
}

/// The syscall numbers whose xattr name the listener checks, with the
/// index of the name argument.
pub fn xattr_checked(profile: &SeccompProfile) -> Vec<(i32, u32)> {
    profile
        .xattr_checked
        .iter()
        .filter_map(|c| {
            let nr = match ScmpSyscall::from_name(&c.syscall) {
                Ok(s) => i32::from(s),
                Err(_) => turnstile_policy::seccomp::UNIFIED_NUMBERS
                    .iter()
                    .find(|(n, _)| *n == c.syscall)
                    .map(|(_, nr)| *nr)?,
            };
            Some((nr, c.name_arg))
        })
        .collect()
}

/// Builds the filter context for `profile`.
pub fn build(profile: &SeccompProfile) -> Result<(ScmpFilterContext, Vec<String>)> {
    let mut f = ScmpFilterContext::new(ScmpAction::Errno(profile.default_errno))
        .map_err(|e| err(e.to_string()))?;
    f.set_act_badarch(ScmpAction::KillProcess)
        .map_err(|e| err(e.to_string()))?;
    // no_new_privs is set explicitly earlier, in the fixed order.
    f.set_ctl_nnp(false).map_err(|e| err(e.to_string()))?;
    // A binary tree over syscall numbers instead of one comparison per
    // rule in a row. Loading the filter, the kernel runs it once per
    // syscall number to build its allow cache; on the ~1,000-instruction
    // row that took ~450 µs of every turn's critical path (bpftrace on
    // turnstile-init, warm turns). The tree also shortens the walk of each
    // syscall the command makes that the cache does not settle.
    f.set_ctl_optimize(2).map_err(|e| err(e.to_string()))?;
    let mut unknown = Vec::new();
    // Newer than this libseccomp: the unified number, on the archs that use
    // it.
    let unified = matches!(
        libseccomp::ScmpArch::native(),
        libseccomp::ScmpArch::X8664 | libseccomp::ScmpArch::Aarch64
    );
    let mut resolve = |name: &str| match ScmpSyscall::from_name(name) {
        Ok(s) => Some(s),
        Err(_) => match turnstile_policy::seccomp::UNIFIED_NUMBERS
            .iter()
            .find(|(n, _)| *n == name)
            .filter(|_| unified)
        {
            Some((_, nr)) => Some(ScmpSyscall::from(*nr)),
            None => {
                unknown.push(name.to_owned());
                None
            }
        },
    };
    for rule in &profile.arg_rules {
        let Some(sys) = resolve(&rule.syscall) else {
            continue;
        };
        let cmp = ScmpArgCompare::new(
            rule.arg,
            ScmpCompareOp::MaskedEqual(u64::from(rule.mask)),
            u64::from(rule.value),
        );
        f.add_rule_conditional(refusal(rule.errno), sys, &[cmp])
            .map_err(|e| err(format!("{} ({}): {e}", rule.syscall, rule.why)))?;
    }
    // The deny list notifies the supervisor, which answers EPERM and
    // records the denial (sandbox::notify); without a listener the kernel
    // answers ENOSYS.
    for name in &profile.deny {
        if let Some(sys) = resolve(name) {
            f.add_rule(ScmpAction::Notify, sys)
                .map_err(|e| err(format!("{name}: {e}")))?;
        }
    }
    // Setters of extended attributes: the listener reads the name and
    // refuses overlay-private ones (sandbox::notify), the rest continue.
    for c in &profile.xattr_checked {
        if let Some(sys) = resolve(&c.syscall) {
            f.add_rule(ScmpAction::Notify, sys)
                .map_err(|e| err(format!("{}: {e}", c.syscall)))?;
        }
    }
    // libseccomp refuses a rule equal to the default action; with the
    // default already ENOSYS the explicit list is documentation.
    let explicit_enosys = profile.default_errno != turnstile_policy::seccomp::ENOSYS;
    for name in profile.enosys.iter().filter(|_| explicit_enosys) {
        if let Some(sys) = resolve(name) {
            f.add_rule(ScmpAction::Errno(turnstile_policy::seccomp::ENOSYS), sys)
                .map_err(|e| err(format!("{name}: {e}")))?;
        }
    }
    for name in &profile.allow {
        let Some(sys) = resolve(name) else { continue };
        let conditional: Vec<_> = profile
            .arg_rules
            .iter()
            .filter(|r| r.syscall == *name)
            .collect();
        if conditional.is_empty() {
            f.add_rule(ScmpAction::Allow, sys)
                .map_err(|e| err(format!("{name}: {e}")))?;
        } else {
            // Allow rules disjoint from the errno rules (see
            // `allow_conditions`): overlapping rules would leave the outcome
            // to libseccomp's tree order.
            for c in allow_conditions(&conditional).map_err(err)? {
                let cmp = ScmpArgCompare::new(
                    c.arg,
                    ScmpCompareOp::MaskedEqual(u64::from(c.mask)),
                    u64::from(c.value),
                );
                f.add_rule_conditional(ScmpAction::Allow, sys, &[cmp])
                    .map_err(|e| err(format!("{name}: {e}")))?;
            }
        }
    }
    // Argument allowlists: an allow rule per listed value, errno for the
    // complement (as masked-equal cubes, so allow and errno never overlap);
    // every compare on the low 32 bits.
    let low = |arg: u32, mask: u32, value: u32| {
        ScmpArgCompare::new(
            arg,
            ScmpCompareOp::MaskedEqual(u64::from(mask)),
            u64::from(value),
        )
    };
    for a in &profile.allowlists {
        let Some(sys) = resolve(&a.syscall) else {
            continue;
        };
        let e = |x: libseccomp::error::SeccompError| err(format!("{} ({}): {x}", a.syscall, a.why));
        for &v in &a.values {
            match a.refine.as_ref().filter(|r| r.value == v) {
                None => {
                    f.add_rule_conditional(ScmpAction::Allow, sys, &[low(a.arg, u32::MAX, v)])
                        .map_err(e)?;
                }
                Some(r) => {
                    for &w in &r.values {
                        f.add_rule_conditional(
                            ScmpAction::Allow,
                            sys,
                            &[low(a.arg, u32::MAX, v), low(r.arg2, u32::MAX, w)],
                        )
                        .map_err(e)?;
                    }
                    for (mask, value) in complement_cubes(&r.values) {
                        f.add_rule_conditional(
                            refusal(a.errno),
                            sys,
                            &[low(a.arg, u32::MAX, v), low(r.arg2, mask, value)],
                        )
                        .map_err(e)?;
                    }
                }
            }
        }
        for (mask, value) in complement_cubes(&a.values) {
            f.add_rule_conditional(refusal(a.errno), sys, &[low(a.arg, mask, value)])
                .map_err(e)?;
        }
    }
    Ok((f, unknown))
}

/// Bumped whenever [`build`] changes what a profile compiles to (2: the
/// deny list notifies instead of returning EPERM; 3: argument allowlists,
/// unified numbers of newer syscalls; 4: argument refusals notify too;
/// 5: xattr setters notify, for the name check; 6: a binary tree).
const COMPILER_VERSION: u32 = 6;

/// The compiled program for `profile`, from `cache_dir` when this exact
/// profile (by the sha256 of its JSON) was compiled before —
/// compiling costs ~2.3 ms per turn here, loading the cached copy ~0.05 ms.
/// The cache lives in the supervisor's private state dir; entries are
/// written atomically and named by content hash, so a stale or partial
/// entry cannot be picked up.
pub fn compile_cached(
    profile: &SeccompProfile,
    cache_dir: &std::path::Path,
    out: &std::path::Path,
) -> Result<CompiledFilter> {
    // The key covers how the profile is compiled, too. The profile's own
    // serialization is deterministic (lists only, fields in declaration
    // order), so its bytes are hashed as they come: no JSON value built
    // and canonicalized (~400 strings) at every sandbox's build. Another
    // serialization (a field added) only misses the cache.
    let mut bytes = format!("compiler {COMPILER_VERSION}\n").into_bytes();
    serde_json::to_writer(&mut bytes, profile).map_err(|e| err(e.to_string()))?;
    let key = turnstile_policy::canonical::sha256_hex(&bytes);
    let cached = cache_dir.join(format!("seccomp-{key}.bpf"));
    let unknown = cache_dir.join(format!("seccomp-{key}.unknown"));
    if let (Ok(bpf), Ok(names)) = (std::fs::read(&cached), std::fs::read_to_string(&unknown)) {
        if !bpf.is_empty() && std::fs::write(out, &bpf).is_ok() {
            return Ok(CompiledFilter {
                unknown_syscalls: names.lines().map(str::to_owned).collect(),
            });
        }
    }
    let filter = compile_to(profile, out)?;
    if crate::fsx::create_private_dir_all(cache_dir).is_ok() {
        if let Ok(bpf) = std::fs::read(out) {
            let _ =
                crate::fsx::write_atomic(&unknown, filter.unknown_syscalls.join("\n").as_bytes());
            let _ = crate::fsx::write_atomic(&cached, &bpf);
        }
    }
    Ok(filter)
}

/// Compiles the profile to BPF into `out` (done once, in the supervisor,
/// before any fork; the sandbox only loads the bytes).
pub fn compile_to(profile: &SeccompProfile, out: &std::path::Path) -> Result<CompiledFilter> {
    let (f, unknown_syscalls) = build(profile)?;
    let file = std::fs::File::create(out).map_err(|e| err(format!("{}: {e}", out.display())))?;
    f.export_bpf(&file).map_err(|e| err(e.to_string()))?;
    Ok(CompiledFilter { unknown_syscalls })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile's program comes from the cache the second time (the same
    /// bytes), and another profile gets its own entry: the key tells them
    /// apart.
    #[test]
    fn issue_29_the_cache_gives_each_profile_its_own_program() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let entries = || std::fs::read_dir(&cache).unwrap().count();
        let p = SeccompProfile::default_profile();
        let (a, b) = (dir.path().join("a.bpf"), dir.path().join("b.bpf"));
        compile_cached(&p, &cache, &a).unwrap();
        assert_eq!(entries(), 2, "the program and its unknown names");
        compile_cached(&p, &cache, &b).unwrap();
        assert_eq!(entries(), 2);
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let mut q = p.clone();
        q.deny.retain(|n| n != "ptrace");
        assert_ne!(p, q);
        let c = dir.path().join("c.bpf");
        compile_cached(&q, &cache, &c).unwrap();
        assert_eq!(entries(), 4);
        assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&c).unwrap());
    }

    /// Every name of the default profile compiles to a rule on this
    /// machine's architecture: a name libseccomp does not know (and that has
    /// no unified number) would silently fall to the default ENOSYS.
    #[test]
    fn default_profile_compiles_with_every_name_known() {
        let native = libseccomp::ScmpArch::native();
        if native != libseccomp::ScmpArch::X8664 {
            eprintln!("skipped: the profile's names are checked on x86_64 ({native:?} here)");
            return;
        }
        let (_, unknown) = build(&SeccompProfile::default_profile()).unwrap();
        assert!(unknown.is_empty(), "unknown here: {unknown:?}");
    }
}
