//! The red-team table itself (the suite runs as `cargo xtask redteam`, which
//! CI runs as part of `cargo xtask test`).

use std::collections::{BTreeMap, HashSet};

use turnstile_tests::redteam::probes;

#[test]
fn at_least_sixty_probes_with_unique_names_and_every_family_covered() {
    let probes = probes();
    assert!(probes.len() >= 60, "{} probes", probes.len());
    let mut names = HashSet::new();
    let mut families: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &probes {
        assert!(names.insert(p.name), "duplicate probe {}", p.name);
        assert!(!p.note.is_empty(), "{} documents nothing", p.name);
        assert!(!p.expect.status.is_empty(), "{} expects no status", p.name);
        *families.entry(p.family).or_default() += 1;
    }
    for family in [
        "fd-leak",
        "procfs-sysfs-dev",
        "mounts-namespaces",
        "seccomp-bypass",
        "kernel-interfaces",
        "network",
        "landlock-gaps",
        "capture-commit",
        "resources",
        "request-validation",
        "ledger",
    ] {
        assert!(
            families.get(family).copied().unwrap_or(0) >= 3,
            "family {family}: {families:?}"
        );
    }
}

/// Kernel-version differences only relax over-blocking probes (family
/// kernel-interfaces, a positive `OK` expectation) and name real probes:
/// an attack probe must hold on every kernel, by another layer if need be.
#[test]
fn kernel_differences_only_relax_over_blocking_probes() {
    let probes = probes();
    for (_, name, expect, why) in turnstile_tests::redteam::KERNEL_DIFFERENCES {
        let p = probes
            .iter()
            .find(|p| p.name == *name)
            .unwrap_or_else(|| panic!("no probe {name}"));
        assert!(
            p.expect.result.iter().all(|r| r.starts_with("OK")),
            "{name} is not an over-blocking probe"
        );
        assert!(!why.is_empty() && !expect.result.is_empty(), "{name}");
    }
}

/// The VM tests' longer turn timeout changes that number and nothing else.
#[test]
fn the_timeout_override_changes_only_the_timeout() {
    let base = turnstile_tests::redteam::MANIFEST;
    assert!(base.contains(r#""timeout_seconds": 4,"#));
    let raised = base.replace(r#""timeout_seconds": 4,"#, r#""timeout_seconds": 12,"#);
    assert_ne!(base, raised);
    // manifest() reads the environment; without the variable it is MANIFEST.
    if std::env::var_os("TURNSTILE_REDTEAM_TIMEOUT").is_none() {
        assert_eq!(turnstile_tests::redteam::manifest(), base);
    }
}
