//! The native backend: `supervise` builds the sandbox itself (see
//! [`crate::sandbox`]).

use std::path::Path;
use std::sync::Arc;

use nix::sys::signal::Signal;
use turnstile_policy::plan::Plan;

use super::{Backend, Sandbox, Warm};
use crate::error::Result;
use crate::sandbox::cgroup::Place;
use crate::sandbox::pool::WarmPool;
use crate::sandbox::{self, Created, Execution, TurnDir, posture::Posture};

/// Namespaces, mounts, cgroup, Landlock, seccomp — from the supervisor.
#[derive(Debug)]
pub struct NativeBackend {
    cgroup_place: Place,
    json_mode: bool,
    /// A serve worker's warm pool (`None`: every turn builds its own).
    pool: Option<Arc<WarmPool>>,
    /// A network namespace started being made when the backend was chosen
    /// ([`NativeBackend::early_netns`]), for the first sandbox it creates.
    netns: std::sync::Mutex<Option<sandbox::spawn::NetnsJob>>,
}

impl NativeBackend {
    /// `json_mode`: the command's stdout goes to our stderr (stdout carries
    /// the one JSON object).
    pub fn new(cgroup_place: &Place, json_mode: bool) -> Self {
        Self {
            cgroup_place: cgroup_place.clone(),
            json_mode,
            pool: None,
            netns: std::sync::Mutex::new(None),
        }
    }

    /// Starts making the network namespace of the sandbox this backend
    /// will create, now: a cold turn's admission, session and Plan then
    /// run beside the ~0.6 ms the kernel takes for it. Wasted (made and
    /// dropped) if the turn is refused before its sandbox.
    pub fn early_netns(mut self) -> Self {
        self.netns = std::sync::Mutex::new(Some(sandbox::spawn::new_netns()));
        self
    }

    /// With a warm pool: turns take what it built for their shape, and it
    /// builds the next from theirs.
    pub fn pooled(mut self, pool: Option<Arc<WarmPool>>) -> Self {
        self.pool = pool;
        self
    }
}

impl Backend for NativeBackend {
    fn name(&self) -> &'static str {
        "native"
    }

    fn enforces_network(
        &self,
        network: turnstile_policy::manifest::Network,
    ) -> std::result::Result<(), String> {
        super::egress_in_own_netns(network)
    }

    fn applied_by(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "namespaces",
                "supervisor: clone of the init into new mount, pid, ipc, uts and cgroup namespaces, and into a new network namespace made beside it",
            ),
            (
                "rootfs_view",
                "supervisor: the init pivots into a tmpfs root holding only what the Plan grants",
            ),
            (
                "landlock",
                "supervisor: the command's stage restricts itself (landlock_restrict_self) before exec",
            ),
            (
                "seccomp",
                "supervisor: the command's stage loads the filter last, with a user-notification listener the supervisor answers",
            ),
            (
                "capabilities",
                "supervisor: the command's stage clears every set (bounding first); checked from outside before exec",
            ),
            (
                "no_new_privs",
                "supervisor: set by the command's stage; checked from outside before exec",
            ),
            (
                "cgroup_limits",
                "supervisor: the turn's cgroup, joined before exec",
            ),
            (
                "identity",
                "supervisor: uid/gid 65534, the workspace through an idmapped mount",
            ),
        ]
    }

    fn create(&self, plan: &Arc<Plan>, turn: &TurnDir) -> Result<Box<dyn Sandbox>> {
        let netns = self.netns.lock().ok().and_then(|mut slot| slot.take());
        Ok(Box::new(sandbox::create(
            plan,
            turn,
            &self.cgroup_place,
            self.json_mode,
            netns,
        )?))
    }

    fn take_warm(&self, plan: &Plan) -> Option<Warm> {
        let pool = self.pool.as_ref()?;
        let (dir, parked, cgroup) = pool.take(plan)?.into_parts();
        let json_mode = self.json_mode;
        Some(Warm {
            dir,
            cgroup,
            begin: Box::new(move |plan| {
                Ok(Box::new(parked.begin(plan, json_mode)?) as Box<dyn Sandbox>)
            }),
        })
    }

    fn cleans_up_after_reply(&self) -> bool {
        self.pool.is_some()
    }

    fn after_turn(&self, cleanup: crate::syncpool::Task<()>) {
        match &self.pool {
            Some(pool) => pool.after_turn(cleanup),
            None => {
                let _ = cleanup.join();
            }
        }
    }

    fn refill(&self, plan: &Arc<Plan>, session_dir: &Path) {
        if let Some(pool) = &self.pool {
            pool.refill(plan, session_dir, &self.cgroup_place);
        }
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
