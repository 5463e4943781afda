//! Backends: who builds and runs a turn's sandbox. The lifecycle is OCI's —
//! create (built, parked before the command's first instruction: a warm-pool
//! entry), start, signal, wait (every process gone, cgroup empty on return),
//! delete — and every backend returns the same [`Execution`], so capture,
//! verify, commit and the ledgers never know which backend ran.
//!
//! Today: `native` (the supervisor builds the sandbox itself from kernel
//! primitives). The OCI runtimes (runc, crun, runsc, kata) are named here so
//! `--backend` can refuse them explicitly (E2040, never a fallback) until
//! they are wired.

pub mod bundle;
mod native;
pub mod runc;

use nix::sys::signal::Signal;
use turnstile_policy::plan::Plan;

use crate::error::{Result, SupervisorError};
use crate::sandbox::{Execution, TurnDir, posture::Posture};

pub use native::NativeBackend;

/// A sandbox implementation.
pub trait Backend {
    /// The name recorded in the ledgers (`backend`).
    fn name(&self) -> &'static str;

    /// Builds the sandbox for `plan` in `turn` and parks it before the
    /// command runs.
    fn create(&self, plan: &Plan, turn: &TurnDir) -> Result<Box<dyn Sandbox>>;
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

/// The backend called `name`: native, or E2040 for a known runtime that is
/// not wired (never a silent fallback), or bad input for anything else.
pub fn by_name(
    name: &str,
    cgroup_root: &std::path::Path,
    json_mode: bool,
) -> Result<Box<dyn Backend>> {
    match name {
        "native" => Ok(Box::new(NativeBackend::new(cgroup_root, json_mode))),
        "runc" => Ok(Box::new(runc::RuncBackend::new(cgroup_root, json_mode)?)),
        "crun" => Ok(Box::new(runc::RuncBackend::named("crun", cgroup_root, json_mode)?)),
        "runsc" | "kata" => Err(SupervisorError::RuntimeUnavailable {
            runtime: name.to_owned(),
            reason: "not wired yet (runc is; see `supervise bundle` for this runtime's bundle); never a fallback".into(),
        }),
        other => Err(SupervisorError::invalid(
            "--backend",
            format!("`{other}` is not a backend ({})", NAMES.join(", ")),
        )),
    }
}
