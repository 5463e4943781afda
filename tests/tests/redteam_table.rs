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
