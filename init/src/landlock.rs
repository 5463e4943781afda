//! Applies the Plan's Landlock rules to the calling process (the turn's
//! final child, after `pivot_root`, so paths are as the sandbox sees them).
//!
//! The ABI is pinned ([`LANDLOCK_ABI`]); the crate's best-effort mode drops
//! what the running kernel cannot enforce and we record the real outcome
//! from `RestrictionStatus` — never branch on the kernel's ABI otherwise.

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, LandlockStatus,
    PathBeneath, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
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
    /// Rights the ruleset asked for that the kernel cannot enforce
    /// ([`unenforceable`] of the ABI it reported): the turn's Landlock
    /// degradations.
    pub unenforced: Vec<&'static str>,
}

impl LandlockOutcome {
    pub fn to_value(&self) -> Value {
        json!({"status": self.status, "kernel_abi": self.kernel_abi, "requested_abi": LANDLOCK_ABI, "skipped": self.skipped, "unenforced": self.unenforced})
    }
}

/// Filesystem rights by name, as evidence and `doctor` spell them.
const FS_RIGHTS: &[(AccessFs, &str)] = &[
    (AccessFs::Execute, "fs.execute"),
    (AccessFs::WriteFile, "fs.write_file"),
    (AccessFs::ReadFile, "fs.read_file"),
    (AccessFs::ReadDir, "fs.read_dir"),
    (AccessFs::RemoveDir, "fs.remove_dir"),
    (AccessFs::RemoveFile, "fs.remove_file"),
    (AccessFs::MakeChar, "fs.make_char"),
    (AccessFs::MakeDir, "fs.make_dir"),
    (AccessFs::MakeReg, "fs.make_reg"),
    (AccessFs::MakeSock, "fs.make_sock"),
    (AccessFs::MakeFifo, "fs.make_fifo"),
    (AccessFs::MakeBlock, "fs.make_block"),
    (AccessFs::MakeSym, "fs.make_sym"),
    (AccessFs::Refer, "fs.refer"),
    (AccessFs::Truncate, "fs.truncate"),
    (AccessFs::IoctlDev, "fs.ioctl_dev"),
];

const SCOPES: &[(Scope, &str)] = &[
    (Scope::AbstractUnixSocket, "scope.abstract_unix_socket"),
    (Scope::Signal, "scope.signal"),
];

const NET_RIGHTS: &[(AccessNet, &str)] = &[
    (AccessNet::BindTcp, "net.bind_tcp"),
    (AccessNet::ConnectTcp, "net.connect_tcp"),
];

/// Names of the rights in `wanted` but not in `available`.
fn names<T: landlock::Access>(
    table: &[(T, &'static str)],
    wanted: BitFlags<T>,
    available: BitFlags<T>,
) -> impl Iterator<Item = &'static str> {
    let missing = wanted & !available;
    table
        .iter()
        .filter(move |(flag, _)| missing.contains(*flag))
        .map(|(_, name)| *name)
}

/// The rights every turn's ruleset handles (filesystem and scoping at the
/// pinned ABI) that a kernel whose effective Landlock ABI is `effective`
/// cannot enforce. Empty at or above the pinned ABI. Network rights are
/// not in a turn's ruleset (its network is its own namespace), see
/// [`unenforceable_net`].
pub fn unenforceable(effective: ABI) -> Vec<&'static str> {
    let pinned = pinned_abi();
    names(
        FS_RIGHTS,
        AccessFs::from_all(pinned),
        AccessFs::from_all(effective),
    )
    .chain(names(
        SCOPES,
        Scope::from_all(pinned),
        Scope::from_all(effective),
    ))
    .collect()
}

/// TCP bind/connect rights of the pinned ABI that `effective` lacks. No
/// turn asks for them today (`network: isolated` is an empty namespace);
/// `allow_egress` will, and must then treat these as degradations.
pub fn unenforceable_net(effective: ABI) -> Vec<&'static str> {
    names(
        NET_RIGHTS,
        AccessNet::from_all(pinned_abi()),
        AccessNet::from_all(effective),
    )
    .collect()
}

/// [`unenforceable`] for the running kernel, probed without building a
/// ruleset: what `doctor` lists, and what a turn may check before it
/// launches (fail closed unless the manifest allows the degradation).
pub fn unenforceable_here(kernel_abi: u32) -> Vec<&'static str> {
    unenforceable(abi_of(kernel_abi))
}

/// The kernel's Landlock ABI version (0 when unavailable).
pub fn kernel_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: with a NULL attribute pointer, size 0 and the VERSION flag,
    // landlock_create_ruleset(2) only returns the ABI version (or an error);
    // it reads no memory and creates no descriptor.
    let rc = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(rc).unwrap_or(0)
}

/// What the running kernel's Landlock cannot enforce of the pinned ABI,
/// said as a reason (`None`: everything holds).
pub fn gaps_here() -> Option<String> {
    let abi = kernel_abi();
    let missing = unenforceable_here(abi);
    (!missing.is_empty()).then(|| {
        format!(
            "this kernel's Landlock (ABI {abi}) cannot enforce {}",
            missing.join(", ")
        )
    })
}

/// [`unenforceable_net`] for the running kernel's ABI.
pub fn unenforceable_net_here(kernel_abi: u32) -> Vec<&'static str> {
    unenforceable_net(abi_of(kernel_abi))
}

/// The crate's ABI for a version number the kernel reported (newer than
/// the crate knows: the newest it knows).
fn abi_of(kernel_abi: u32) -> ABI {
    ABI::from(i32::try_from(kernel_abi).unwrap_or(i32::MAX))
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
    prepare(rules)?.finish(rules)
}

/// A ruleset with every rule of a Plan's shape (all but the execute
/// rules, which are its turn's), not yet in force: made while a warm
/// sandbox's command stage waits for its turn, so the turn adds only its
/// execute rules before `landlock_restrict_self` (~0.28 ms of a warm
/// turn's path otherwise, bpftrace). A rule is bound to the inode its path
/// names when it is added: the same moment the sandbox's view was bound to
/// the workspace, and a turn of another workspace state has another shape
/// (`Plan::shape`), so it never gets this sandbox.
pub struct Prepared {
    created: landlock::RulesetCreated,
    skipped: Vec<String>,
    /// The rules it holds (execute rules left empty).
    shape: LandlockRules,
}

/// The rights of each group of rules, in the order list, read,
/// read-write, execute (read included: an interpreter reads what it runs),
/// devices.
fn rights(abi: ABI) -> [BitFlags<AccessFs>; 5] {
    // The crate's `from_read` includes Execute; read rules must not grant
    // it (measured: with it, every binary under /usr ran).
    let read = AccessFs::from_read(abi) & !AccessFs::Execute;
    let all = AccessFs::from_all(abi);
    let read_write = all & !AccessFs::Execute;
    let execute = AccessFs::from_read(abi);
    // In place: `> /proc/self/comm` opens with O_TRUNC.
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
    let list = landlock::BitFlags::from(AccessFs::ReadDir);
    [list, read, read_write, execute, device]
}

/// Makes the ruleset of `rules`' shape: handled rights, scopes, and the
/// list, read, read-write and device rules.
pub fn prepare(rules: &LandlockRules) -> Result<Prepared, String> {
    let abi = pinned_abi();
    let [list, read, read_write, _, device] = rights(abi);
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| e.to_string())?;
    let mut created = ruleset
        .scope(Scope::from_all(abi))
        .map_err(|e| e.to_string())?
        .create()
        .map_err(|e| e.to_string())?;
    let mut skipped = Vec::new();
    for (paths, access) in [
        (&rules.list, list),
        (&rules.read, read),
        (&rules.read_write, read_write),
        (&rules.devices, device),
    ] {
        created = add(created, &mut skipped, paths, access, abi)?;
    }
    Ok(Prepared {
        created,
        skipped,
        shape: LandlockRules {
            execute: Vec::new(),
            ..rules.clone()
        },
    })
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("shape", &self.shape)
            .field("skipped", &self.skipped)
            .finish_non_exhaustive()
    }
}

impl Prepared {
    /// Adds `rules`' execute rules and restricts the calling process.
    /// `rules` must be those it was prepared from but for the execute
    /// rules (anything else is an error: [`Prepared::holds`]).
    pub fn finish(mut self, rules: &LandlockRules) -> Result<LandlockOutcome, String> {
        if !self.holds(rules) {
            return Err("the prepared ruleset is not this turn's".into());
        }
        let abi = pinned_abi();
        let [_, _, _, execute, _] = rights(abi);
        let created = add(
            self.created,
            &mut self.skipped,
            &rules.execute,
            execute,
            abi,
        )?;
        let status = created.restrict_self().map_err(|e| e.to_string())?;
        let (kernel_abi, unenforced) = match status.landlock {
            LandlockStatus::Available { effective_abi, .. } => {
                (Some(effective_abi as u32), unenforceable(effective_abi))
            }
            _ => (None, unenforceable(ABI::Unsupported)),
        };
        Ok(LandlockOutcome {
            status: match status.ruleset {
                RulesetStatus::FullyEnforced => "fully_enforced",
                RulesetStatus::PartiallyEnforced => "partially_enforced",
                RulesetStatus::NotEnforced => "not_enforced",
            },
            kernel_abi,
            skipped: self.skipped,
            unenforced,
        })
    }

    /// Whether `rules` are the ones it was prepared from, execute rules
    /// aside.
    pub fn holds(&self, rules: &LandlockRules) -> bool {
        rules.same_but_execute(&self.shape)
    }
}

/// Adds a rule for each of `paths` with `access` (a path that cannot be
/// opened is recorded in `skipped`).
fn add(
    mut created: landlock::RulesetCreated,
    skipped: &mut Vec<String>,
    paths: &[String],
    access: BitFlags<AccessFs>,
    abi: ABI,
) -> Result<landlock::RulesetCreated, String> {
    for path in paths {
        // O_PATH opened here, not with the crate's PathFd: that goes
        // through std's OpenOptions, whose custom flags lose O_PATH on
        // musl (there O_ACCMODE includes O_PATH, and std masks it out), so
        // a device was opened for real: /dev/tty refused it (ENXIO) and
        // lost its rule. The static init is built for musl.
        //
        // Never through a magic link (`/proc/PID/root`, `cwd`, `fd/N`…):
        // resolved here, in the sandbox, such a path names the view's root
        // or the workspace, and a rule there would grant all of it. Such a
        // rule is not made (ELOOP: recorded in `skipped`); the manifest
        // check refuses those patterns before any turn.
        let how = nix::fcntl::OpenHow::new()
            .flags(nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC)
            .resolve(nix::fcntl::ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let fd = match nix::fcntl::openat2(nix::fcntl::AT_FDCWD, path.as_str(), how) {
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
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Red-team finding (wave 3): a rule is never made through a magic
    /// link — in the sandbox `/proc/self/root` or `cwd` names the whole
    /// view — whatever reaches the init; an ordinary path, and the plain
    /// `/proc/self` link, still get theirs. Nothing restricts the test
    /// process (the ruleset is only created).
    #[test]
    fn rules_are_never_made_through_a_magic_link() {
        let rules = LandlockRules {
            abi: LANDLOCK_ABI,
            list: Vec::new(),
            read: vec![
                "/proc/self/root".into(),
                "/proc/self/cwd".into(),
                "/proc/thread-self/root/usr".into(),
                "/usr".into(),
            ],
            read_write: Vec::new(),
            execute: Vec::new(),
            devices: vec!["/proc/self/comm".into()],
        };
        let prepared = prepare(&rules).expect("a ruleset is created unprivileged");
        assert_eq!(
            prepared.skipped,
            [
                "/proc/self/root",
                "/proc/self/cwd",
                "/proc/thread-self/root/usr"
            ]
        );
    }

    /// Issue 29: a ruleset prepared from a shape serves only a turn of that
    /// shape — another execute list is the turn's own, any other rule
    /// change is refused (never silently applied from the prepared set).
    /// Nothing here restricts the test process: `finish` is only called
    /// where it must refuse before `landlock_restrict_self`.
    #[test]
    fn issue_29_a_prepared_ruleset_serves_only_its_shape() {
        let shape = LandlockRules {
            abi: LANDLOCK_ABI,
            list: vec!["/".into()],
            read: vec!["/usr".into()],
            read_write: vec!["/tmp".into()],
            execute: Vec::new(),
            devices: vec!["/dev/null".into()],
        };
        let prepared = prepare(&shape).unwrap();
        let turn = LandlockRules {
            execute: vec!["/usr/bin/true".into()],
            ..shape.clone()
        };
        assert!(prepared.holds(&shape));
        assert!(prepared.holds(&turn));
        let wider = LandlockRules {
            read: vec!["/usr".into(), "/etc".into()],
            ..turn.clone()
        };
        assert!(!prepared.holds(&wider));
        let writable = LandlockRules {
            read_write: vec!["/tmp".into(), "/var/tmp".into()],
            ..turn
        };
        assert!(!prepared.holds(&writable));
        let err = prepared.finish(&wider).unwrap_err();
        assert!(err.contains("not this turn's"), "{err}");
    }

    #[test]
    fn abi_2_lacks_truncate_ioctl_dev_and_scoping() {
        assert_eq!(
            unenforceable(ABI::V2),
            [
                "fs.truncate",
                "fs.ioctl_dev",
                "scope.abstract_unix_socket",
                "scope.signal"
            ]
        );
        assert_eq!(
            unenforceable_net(ABI::V2),
            ["net.bind_tcp", "net.connect_tcp"]
        );
        assert_eq!(unenforceable_here(2), unenforceable(ABI::V2));
    }

    #[test]
    fn the_pinned_abi_and_newer_lack_nothing() {
        for abi in [ABI::V6, ABI::V7] {
            assert!(unenforceable(abi).is_empty(), "{abi:?}");
            assert!(unenforceable_net(abi).is_empty(), "{abi:?}");
        }
        assert!(unenforceable_here(7).is_empty());
    }

    #[test]
    fn abi_1_also_lacks_refer_and_none_lacks_everything() {
        assert!(unenforceable(ABI::V1).contains(&"fs.refer"));
        let none = unenforceable(ABI::Unsupported);
        assert!(none.contains(&"fs.read_file") && none.contains(&"scope.signal"));
        assert_eq!(unenforceable_here(0), none);
    }
}
