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
mod native;
pub mod runc;
pub mod runsc;
pub mod select;

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

    /// Builds the sandbox for `plan` in `turn` and parks it before the
    /// command runs.
    fn create(&self, plan: &Plan, turn: &TurnDir) -> Result<Box<dyn Sandbox>>;

    /// A sandbox built before this turn from `plan`'s exact shape, if the
    /// backend keeps one (the native backend in a `serve` worker: see
    /// [`crate::sandbox::pool`]); `None`: the turn builds its own.
    fn take_warm(&self, _plan: &Plan) -> Option<Warm> {
        None
    }
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

/// The backends `--backend` knows.
pub const NAMES: [&str; 5] = ["native", "runc", "crun", "runsc", "kata"];

/// The backend called `name`, or E2040 for a known runtime that is not
/// installed (never a silent fallback), or bad input for anything else.
pub fn by_name(
    name: &str,
    cgroup_root: &std::path::Path,
    json_mode: bool,
) -> Result<Box<dyn Backend>> {
    match name {
        "native" => Ok(Box::new(NativeBackend::new(cgroup_root, json_mode))),
        "runc" => Ok(Box::new(runc::RuncBackend::new(cgroup_root, json_mode)?)),
        "crun" => Ok(Box::new(runc::RuncBackend::named("crun", cgroup_root, json_mode)?)),
        "runsc" => Ok(Box::new(runsc::RunscBackend::new(cgroup_root, json_mode)?)),
        "kata" => Err(SupervisorError::RuntimeUnavailable {
            runtime: name.to_owned(),
            reason: "Kata Containers is not installed on this host (it has no Debian package); `supervise bundle --backend kata` writes the bundle it would run; never a fallback".into(),
        }),
        other => Err(SupervisorError::invalid(
            "--backend",
            format!("`{other}` is not a backend ({})", NAMES.join(", ")),
        )),
    }
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
