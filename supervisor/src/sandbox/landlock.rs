//! Applies the Plan's Landlock rules to the calling process (the turn's
//! final child, after `pivot_root`, so paths are as the sandbox sees them).
//!
//! The ABI is pinned ([`LANDLOCK_ABI`]); the crate's best-effort mode drops
//! what the running kernel cannot enforce and we record the real outcome
//! from `RestrictionStatus` — never branch on the kernel's ABI otherwise.

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, LandlockStatus, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};
use serde_json::{Value, json};
use turnstile_policy::plan::{LANDLOCK_ABI, LandlockRules};

/// What Landlock actually enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LandlockOutcome {
    pub status: &'static str,
    pub kernel_abi: Option<u32>,
    /// Paths in the plan that do not exist in the sandbox (no rule added).
    pub skipped: Vec<String>,
}

impl LandlockOutcome {
    pub fn to_value(&self) -> Value {
        json!({"status": self.status, "kernel_abi": self.kernel_abi, "requested_abi": LANDLOCK_ABI, "skipped": self.skipped})
    }
}

fn pinned_abi() -> ABI {
    // LANDLOCK_ABI is 6: filesystem rights incl. truncate and ioctl-dev, TCP
    // bind/connect, abstract-unix-socket and signal scoping.
    ABI::V6
}

/// Restricts the calling process. Network rights are not handled: a turn's
/// network is `isolated`, its own empty network namespace, where loopback
/// must work (DESIGN "Network"); `allow_egress` will add port rules.
pub fn apply(rules: &LandlockRules) -> Result<LandlockOutcome, String> {
    let abi = pinned_abi();
    // The crate's `from_read` includes Execute; read rules must not grant
    // it (measured: with it, every binary under /usr ran).
    let read = AccessFs::from_read(abi) & !AccessFs::Execute;
    let all = AccessFs::from_all(abi);
    let read_write = all & !AccessFs::Execute;
    let execute = AccessFs::from_read(abi);
    // In place: `> /proc/self/comm` opens with O_TRUNC.
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
    let list = landlock::BitFlags::from(AccessFs::ReadDir);

    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(|e| e.to_string())?;
    let mut created = ruleset
        .scope(Scope::from_all(abi))
        .map_err(|e| e.to_string())?
        .create()
        .map_err(|e| e.to_string())?;

    let mut skipped = Vec::new();
    let groups: [(&Vec<String>, _); 5] = [
        (&rules.list, list),
        (&rules.read, read),
        (&rules.read_write, read_write),
        (&rules.execute, execute),
        (&rules.devices, device),
    ];
    for (paths, access) in groups {
        for path in paths {
            let fd = match PathFd::new(path) {
                Ok(fd) => fd,
                Err(_) => {
                    skipped.push(path.clone());
                    continue;
                }
            };
            // Directory-only rights on a file would make the rule partial;
            // trim them (what path_beneath_rules does).
            let is_dir = std::fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false);
            let access = if is_dir {
                access
            } else {
                access & AccessFs::from_file(abi)
            };
            created = created
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|e| format!("{path}: {e}"))?;
        }
    }
    let status = created.restrict_self().map_err(|e| e.to_string())?;
    let kernel_abi = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => Some(effective_abi as u32),
        _ => None,
    };
    Ok(LandlockOutcome {
        status: match status.ruleset {
            RulesetStatus::FullyEnforced => "fully_enforced",
            RulesetStatus::PartiallyEnforced => "partially_enforced",
            RulesetStatus::NotEnforced => "not_enforced",
        },
        kernel_abi,
        skipped,
    })
}
