//! Backends: who builds and runs a turn's sandbox. The lifecycle is OCI's —
//! create (built, parked before the command's first instruction: a warm-pool
//! entry), start, signal, wait (every process gone, cgroup empty on return),
//! delete — and every backend returns the same [`Execution`], so capture,
//! verify, commit and the ledgers never know which backend ran.
//!
//! `native` (the supervisor builds the sandbox itself from kernel
//! primitives), `runc` and `crun` (`runc.rs`), `runsc` (`runsc.rs`, gVisor).
//! `kata` is named so `--backend kata` is refused explicitly (E2040, never a
//! fallback); `supervise bundle --backend kata` writes its bundle.
//! Without `--backend`, the manifest's trust level picks one (`select.rs`).

pub mod bundle;
mod hostview;
pub mod kata;
mod native;
pub mod runc;
pub mod runsc;
pub mod runtime;
pub mod select;

use std::path::Path;
use std::sync::Arc;

use nix::sys::signal::Signal;
use turnstile_policy::plan::Plan;

use crate::error::{Result, SupervisorError};
use crate::sandbox::{Execution, TurnDir, posture::Posture};

pub use native::NativeBackend;

/// A sandbox implementation.
pub trait Backend {
    /// The name recorded in the ledgers (`backend`).
    fn name(&self) -> &'static str;

    /// Layers (manifest `allow_degraded` names) this backend cannot enforce
    /// on any turn, each with the reason: a turn whose manifest does not
    /// list one is refused before anything runs (exit 20).
    /// Default: what this kernel's Landlock lacks (an older kernel than
    /// the pinned ABI: the rights it cannot enforce).
    fn cannot_enforce(&self) -> Vec<(&'static str, String)> {
        crate::sandbox::landlock::gaps_here()
            .map(|why| ("landlock", why))
            .into_iter()
            .collect()
    }

    /// Who applies each enforcement layer on this backend, as every
    /// turn's evidence records it (`enforcement.applied_by`): (layer, who
    /// and how). A layer this backend does not apply is not listed here but
    /// in [`Backend::not_applied`] — never claimed.
    fn applied_by(&self) -> Vec<(&'static str, &'static str)>;

    /// Whether this backend enforces `network` (`restricted`,
    /// `allow_egress`): `Err(why)` refuses the turn (fail closed). Every
    /// backend enforces `isolated`.
    fn enforces_network(
        &self,
        network: turnstile_policy::manifest::Network,
    ) -> std::result::Result<(), String> {
        match network {
            turnstile_policy::manifest::Network::Isolated => Ok(()),
            _ => {
                Err("egress by name is enforced by the native, runc and crun backends only in this release".into())
            }
        }
    }

    /// The `allow_degraded` layer a turn with `network` needs on this
    /// backend (it enforces the policy, but only by giving up part of its
    /// own isolation), with why; `None` when nothing is given up. A
    /// manifest that does not list it is refused with TS1070.
    fn network_degradation(
        &self,
        _network: turnstile_policy::manifest::Network,
    ) -> Option<(&'static str, String)> {
        None
    }

    /// Layers this backend does not apply at all, with why.
    fn not_applied(&self) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }

    /// Builds the sandbox for `plan` in `turn` and parks it before the
    /// command runs.
    fn create(&self, plan: &Arc<Plan>, turn: &TurnDir) -> Result<Box<dyn Sandbox>>;

    /// A sandbox built before this turn from `plan`'s exact shape, if the
    /// backend keeps one (the native backend in a `serve` worker: see
    /// [`crate::sandbox::pool`]); `None`: the turn builds its own.
    fn take_warm(&self, _plan: &Plan) -> Option<Warm> {
        None
    }

    /// Whether a finished turn's directory removal waits until its finish
    /// entries are durable (a `serve` worker's, whose reply waits for
    /// them) instead of running beside them (see `turn::record::Cleanup`).
    fn cleans_up_after_reply(&self) -> bool {
        false
    }

    /// A finished turn's directory removal (running on its own thread):
    /// joined now, or — with a warm pool — after the reply.
    fn after_turn(&self, cleanup: crate::syncpool::Task<()>) {
        let _ = cleanup.join();
    }

    /// The turn of `plan` committed (its session's state directory is
    /// `session_dir`): build the next turn's sandbox from its shape, if
    /// this backend keeps one.
    fn refill(&self, _plan: &Arc<Plan>, _session_dir: &Path) {}
}

/// Hands a warm sandbox its turn (what `create` does for a cold one).
pub type Begin = Box<dyn FnOnce(&Plan) -> Result<Box<dyn Sandbox>>>;

/// A warm sandbox taken for a turn: its turn directory, its cgroup's name,
/// and how to hand it the turn.
pub struct Warm {
    pub dir: TurnDir,
    pub cgroup: String,
    pub begin: Begin,
}

impl std::fmt::Debug for Warm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warm")
            .field("dir", &self.dir)
            .field("cgroup", &self.cgroup)
            .finish_non_exhaustive()
    }
}

/// One created sandbox.
pub trait Sandbox {
    /// The command's posture as checked before it ran (`None`: the sandbox
    /// never got that far).
    fn posture(&self) -> Option<&Posture>;

    /// Lets the command run (a sandbox that failed its posture check is
    /// killed instead).
    fn start(&mut self);

    /// Sends `signal` to every process of the turn.
    fn signal(&self, signal: Signal);

    /// Waits for the command and every process it started; tears down.
    fn wait(self: Box<Self>) -> Result<Execution>;

    /// Kills and tears down a sandbox that will not be waited for.
    fn delete(self: Box<Self>);
}

/// The backends `--backend` knows, weakest isolation first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Native,
    Runc,
    Crun,
    Runsc,
    Kata,
}

impl BackendKind {
    pub const ALL: [Self; 5] = [
        Self::Native,
        Self::Runc,
        Self::Crun,
        Self::Runsc,
        Self::Kata,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Runc => "runc",
            Self::Crun => "crun",
            Self::Runsc => "runsc",
            Self::Kata => "kata",
        }
    }

    /// How strongly the backend isolates a turn from the host kernel:
    /// native (the host kernel's namespaces, Landlock, seccomp) < runc =
    /// crun (the same kernel primitives, set up by an OCI runtime) < runsc
    /// (gVisor: a user-space kernel between the turn and the host's) <
    /// kata (a virtual machine). A trust level's minimum is a rank.
    pub fn isolation(self) -> u8 {
        match self {
            Self::Native => 0,
            Self::Runc | Self::Crun => 1,
            Self::Runsc => 2,
            Self::Kata => 3,
        }
    }

    /// The names, for messages: `native, runc, crun, runsc, kata`.
    pub fn names() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = SupervisorError;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                SupervisorError::invalid(
                    "--backend",
                    format!("`{s}` is not a backend ({})", Self::names()),
                )
            })
    }
}

/// The backend `kind`, or E2040 for a runtime that is not installed (never
/// a silent fallback).
pub fn by_name(
    kind: BackendKind,
    cgroup_place: &crate::sandbox::cgroup::Place,
    json_mode: bool,
    pool: Option<std::sync::Arc<crate::sandbox::pool::WarmPool>>,
) -> Result<Box<dyn Backend>> {
    match kind {
        // A turn without a warm pool (the CLI's cold turn) builds its
        // sandbox for certain: its network namespace is started now.
        BackendKind::Native if pool.is_none() => Ok(Box::new(
            NativeBackend::new(cgroup_place, json_mode).early_netns(),
        )),
        BackendKind::Native => Ok(Box::new(
            NativeBackend::new(cgroup_place, json_mode).pooled(pool),
        )),
        BackendKind::Runc => Ok(Box::new(runc::RuncBackend::new(cgroup_place, json_mode)?)),
        BackendKind::Crun => Ok(Box::new(runc::RuncBackend::named(
            "crun",
            cgroup_place,
            json_mode,
        )?)),
        BackendKind::Runsc => Ok(Box::new(runsc::RunscBackend::new(cgroup_place, json_mode)?)),
        BackendKind::Kata => Err(SupervisorError::RuntimeUnavailable {
            runtime: kind.as_str().to_owned(),
            reason: kata::unavailable(),
        }),
    }
}

/// Refuses (exit 20, TS1070, nothing run) a turn whose network policy
/// `backend` cannot enforce.
pub fn check_network(
    backend: &dyn Backend,
    manifest: &turnstile_policy::manifest::Manifest,
) -> Result<()> {
    // Every reason at once: what the host lacks, and what the manifest
    // would have to accept (one answer, not one per attempt).
    let mut why: Vec<String> = [
        backend.enforces_network(manifest.network),
        crate::sandbox::egress::supported(&manifest.egress),
    ]
    .into_iter()
    .filter_map(std::result::Result::err)
    .collect();
    if let Some((layer, w)) = backend.network_degradation(manifest.network) {
        if !manifest.allow_degraded.iter().any(|l| l.as_str() == layer) {
            why.push(format!(
                "{w}; add \"{layer}\" to the manifest's `allow_degraded` to accept that, or use native, runc or crun"
            ));
        }
    }
    if why.is_empty() {
        return Ok(());
    }
    Err(SupervisorError::NetworkUnenforceable {
        backend: backend.name().to_owned(),
        network: manifest.network.as_str().to_owned(),
        why: why.join("; "),
    })
}

/// Refuses (exit 20, nothing run) a turn on `backend` whose manifest does
/// not list, in `allow_degraded`, a layer the backend cannot enforce.
pub fn check_enforceable(backend: &dyn Backend, allowed: &[String]) -> Result<()> {
    let missing: Vec<(&str, String)> = backend
        .cannot_enforce()
        .into_iter()
        .filter(|(layer, _)| !allowed.iter().any(|a| a == layer))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(SupervisorError::Unenforceable {
        backend: backend.name().to_owned(),
        missing: missing.iter().map(|(l, _)| (*l).to_owned()).collect(),
        why: missing
            .iter()
            .map(|(_, w)| w.as_str())
            .collect::<Vec<_>>()
            .join("; "),
    })
}

/// `enforces_network` of a backend whose turn has its own network
/// namespace the supervisor can enter (native, runc, crun): egress by name
/// where the host has what it takes.
pub(crate) fn egress_in_own_netns(
    network: turnstile_policy::manifest::Network,
) -> std::result::Result<(), String> {
    match network {
        turnstile_policy::manifest::Network::Isolated => Ok(()),
        _ => crate::sandbox::egress::host_support(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_policy::manifest::Network;

    /// A backend whose host lacks nftables (`lacking`) and that runs
    /// egress only degraded; or one that enforces every network.
    struct Fake {
        lacking: bool,
    }

    impl Backend for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn applied_by(&self) -> Vec<(&'static str, &'static str)> {
            Vec::new()
        }
        fn enforces_network(&self, _: Network) -> std::result::Result<(), String> {
            match self.lacking {
                true => Err("the kernel has no nftables netlink".into()),
                false => Ok(()),
            }
        }
        fn network_degradation(&self, _: Network) -> Option<(&'static str, String)> {
            self.lacking
                .then(|| ("gvisor_netstack", "only on the host's stack".into()))
        }
        fn create(&self, _: &Arc<Plan>, _: &TurnDir) -> Result<Box<dyn Sandbox>> {
            Err(SupervisorError::invalid(
                "backend",
                "a test backend runs nothing",
            ))
        }
    }

    /// A turn refused for its network names every reason at once: what
    /// the host lacks and what the manifest would have to accept.
    #[test]
    fn issue_29_a_refused_network_names_every_reason() {
        let pkg = turnstile_policy::PackageId::parse("p").unwrap();
        let manifest = |doc: &str| {
            turnstile_policy::Manifest::from_slice(doc.as_bytes(), &pkg, "m.json".into()).unwrap()
        };
        let lacking = Fake { lacking: true };
        let m = manifest(r#"{"capabilities":{"execute":["/bin/true"]},"network":"allow_egress"}"#);
        let e = check_network(&lacking, &m).unwrap_err().to_string();
        assert!(e.contains("no nftables netlink"), "{e}");
        assert!(
            e.contains("\"gvisor_netstack\" to the manifest's `allow_degraded`"),
            "{e}"
        );
        let m = manifest(
            r#"{"capabilities":{"execute":["/bin/true"]},"network":"allow_egress","allow_degraded":["gvisor_netstack"]}"#,
        );
        let e = check_network(&lacking, &m).unwrap_err().to_string();
        assert!(e.contains("no nftables netlink"), "{e}");
        assert!(!e.contains("allow_degraded"), "{e}");
        let m = manifest(r#"{"capabilities":{"execute":["/bin/true"]}}"#);
        assert!(check_network(&Fake { lacking: false }, &m).is_ok());
    }
}
