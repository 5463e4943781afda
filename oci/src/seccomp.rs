//! The policy's [`SeccompProfile`] as `linux.seccomp`: the same rule data
//! the native backend compiles with libseccomp, rule for rule.
//!
//! - default action `SCMP_ACT_ERRNO` with the profile's default errno
//!   (ENOSYS); architectures: the native one only (no x86/x32 sub-arch,
//!   which would reopen the i386 `int 0x80` path);
//! - argument rules and allowlists: an errno rule per refused
//!   masked-equal cube, an allow rule per allowed value or allow cube —
//!   disjoint, so the outcome never depends on rule order; every compare is
//!   `SCMP_CMP_MASKED_EQ` with a mask of at most 32 bits (low 32 bits only);
//! - the deny list: `SCMP_ACT_ERRNO` EPERM. The native backend answers
//!   these with a user notification it records; a bundle has no supervisor
//!   listening, so it refuses directly (and denials are not observed).
//!
//! What OCI cannot say: the action for a foreign architecture (the native
//! backend kills the process; a runtime applies its own refusal). The
//! foreign syscall does not run either way.

use serde_json::{Value, json};
use turnstile_policy::seccomp::{
    ENOSYS, EPERM, SeccompProfile, allow_conditions, complement_cubes,
};

fn names_value(names: &[String]) -> Value {
    Value::Array(names.iter().cloned().map(Value::String).collect())
}

fn arg(index: u32, mask: u32, value: u32) -> Value {
    json!({"index": index, "value": u64::from(mask), "valueTwo": u64::from(value), "op": "SCMP_CMP_MASKED_EQ"})
}

fn errno_rule(names: &[String], errno: i32, args: Vec<Value>) -> Value {
    let mut r = json!({"action": "SCMP_ACT_ERRNO", "errnoRet": errno});
    r["names"] = names_value(names);
    if !args.is_empty() {
        r["args"] = Value::Array(args);
    }
    r
}

fn allow_rule(names: &[String], args: Vec<Value>) -> Value {
    let mut r = json!({"action": "SCMP_ACT_ALLOW"});
    r["names"] = names_value(names);
    if !args.is_empty() {
        r["args"] = Value::Array(args);
    }
    r
}

/// `linux.seccomp` for `profile` on `arch` (`SCMP_ARCH_X86_64`, …).
pub fn linux_seccomp(profile: &SeccompProfile, arch: &str) -> Result<Value, String> {
    let mut syscalls = Vec::new();
    let one = |s: &str| vec![s.to_owned()];
    for r in &profile.arg_rules {
        syscalls.push(errno_rule(
            &one(&r.syscall),
            r.errno,
            vec![arg(r.arg, r.mask, r.value)],
        ));
    }
    for a in &profile.allowlists {
        let name = one(&a.syscall);
        for &v in &a.values {
            match a.refine.as_ref().filter(|r| r.value == v) {
                None => syscalls.push(allow_rule(&name, vec![arg(a.arg, u32::MAX, v)])),
                Some(r) => {
                    for &w in &r.values {
                        syscalls.push(allow_rule(
                            &name,
                            vec![arg(a.arg, u32::MAX, v), arg(r.arg2, u32::MAX, w)],
                        ));
                    }
                    for (mask, value) in complement_cubes(&r.values) {
                        syscalls.push(errno_rule(
                            &name,
                            a.errno,
                            vec![arg(a.arg, u32::MAX, v), arg(r.arg2, mask, value)],
                        ));
                    }
                }
            }
        }
        for (mask, value) in complement_cubes(&a.values) {
            syscalls.push(errno_rule(&name, a.errno, vec![arg(a.arg, mask, value)]));
        }
    }
    if !profile.deny.is_empty() {
        syscalls.push(errno_rule(&profile.deny, EPERM, Vec::new()));
    }
    if profile.default_errno != ENOSYS && !profile.enosys.is_empty() {
        syscalls.push(errno_rule(&profile.enosys, ENOSYS, Vec::new()));
    }
    let (conditional, unconditional): (Vec<&String>, Vec<&String>) = profile
        .allow
        .iter()
        .partition(|name| profile.arg_rules.iter().any(|r| r.syscall == **name));
    // The xattr setters the native listener inspects: no listener here, so
    // plain allows (the red-team table records the difference).
    let inspected: Vec<&String> = profile.xattr_checked.iter().map(|c| &c.syscall).collect();
    let unconditional: Vec<&String> = unconditional.into_iter().chain(inspected).collect();
    if !unconditional.is_empty() {
        let names: Vec<String> = unconditional.into_iter().cloned().collect();
        syscalls.push(allow_rule(&names, Vec::new()));
    }
    for name in conditional {
        let rules: Vec<_> = profile
            .arg_rules
            .iter()
            .filter(|r| r.syscall == *name)
            .collect();
        for c in allow_conditions(&rules)? {
            syscalls.push(allow_rule(&one(name), vec![arg(c.arg, c.mask, c.value)]));
        }
    }
    let mut section = json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": profile.default_errno,
        "architectures": [arch],
    });
    // Moved in, not through `json!`, which would copy the ~240 rules
    // value by value (most of this function's time, measured).
    section["syscalls"] = Value::Array(syscalls);
    Ok(section)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_compares_the_low_32_bits_and_the_lists_survive() {
        let p = SeccompProfile::default_profile();
        let s = linux_seccomp(&p, "SCMP_ARCH_X86_64").unwrap();
        assert_eq!(s["defaultErrnoRet"], 38);
        let rules = s["syscalls"].as_array().unwrap();
        for r in rules {
            for a in r["args"].as_array().into_iter().flatten() {
                assert!(a["value"].as_u64().unwrap() <= u64::from(u32::MAX), "{a}");
                assert_eq!(a["op"], "SCMP_CMP_MASKED_EQ");
            }
        }
        let names_with = |action: &str| -> Vec<String> {
            rules
                .iter()
                .filter(|r| r["action"] == action && r["args"].is_null())
                .flat_map(|r| {
                    r["names"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|n| n.as_str().unwrap().to_owned())
                })
                .collect()
        };
        assert!(names_with("SCMP_ACT_ERRNO").contains(&"mount".to_owned()));
        assert!(names_with("SCMP_ACT_ALLOW").contains(&"read".to_owned()));
        // socket: allowed only conditionally, AF_PACKET (17) refused.
        assert!(!names_with("SCMP_ACT_ALLOW").contains(&"socket".to_owned()));
        let refused_17 = rules.iter().any(|r| {
            r["names"][0] == "socket"
                && r["action"] == "SCMP_ACT_ERRNO"
                && r["args"].as_array().is_some_and(|a| {
                    a.len() == 1
                        && (17 & a[0]["value"].as_u64().unwrap())
                            == a[0]["valueTwo"].as_u64().unwrap()
                })
        });
        assert!(refused_17);
    }
}
