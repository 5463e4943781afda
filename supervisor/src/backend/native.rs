//! The native backend: `supervise` builds the sandbox itself (see
//! [`crate::sandbox`]).

use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;
use turnstile_policy::plan::Plan;

use super::{Backend, Sandbox, Warm};
use crate::error::Result;
use crate::sandbox::{self, Created, Execution, TurnDir, posture::Posture};

/// Namespaces, mounts, cgroup, Landlock, seccomp — from the supervisor.
#[derive(Debug, Clone)]
pub struct NativeBackend {
    cgroup_root: PathBuf,
    json_mode: bool,
}

impl NativeBackend {
    /// `json_mode`: the command's stdout goes to our stderr (stdout carries
    /// the one JSON object).
    pub fn new(cgroup_root: &Path, json_mode: bool) -> Self {
        Self {
            cgroup_root: cgroup_root.to_path_buf(),
            json_mode,
        }
    }
}

impl Backend for NativeBackend {
    fn name(&self) -> &'static str {
        "native"
    }

    fn create(&self, plan: &Plan, turn: &TurnDir) -> Result<Box<dyn Sandbox>> {
        sandbox::pool::remember(plan, &turn.path, &self.cgroup_root);
        Ok(Box::new(sandbox::create(
            plan,
            turn,
            &self.cgroup_root,
            self.json_mode,
        )?))
    }

    fn take_warm(&self, plan: &Plan) -> Option<Warm> {
        let (dir, parked, cgroup) = sandbox::pool::take(plan)?.into_parts();
        sandbox::pool::remember(plan, &dir.path, &self.cgroup_root);
        let json_mode = self.json_mode;
        Some(Warm {
            dir,
            cgroup,
            begin: Box::new(move |plan| {
                Ok(Box::new(parked.begin(plan, json_mode)?) as Box<dyn Sandbox>)
            }),
        })
    }
}

impl Sandbox for Created {
    fn posture(&self) -> Option<&Posture> {
        Created::posture(self)
    }

    fn start(&mut self) {
        Created::start(self);
    }

    fn signal(&self, signal: Signal) {
        Created::signal(self, signal);
    }

    fn wait(self: Box<Self>) -> Result<Execution> {
        Created::wait(*self)
    }

    fn delete(self: Box<Self>) {
        // Drop kills and tears down whatever was not waited for.
        drop(self);
    }
}
