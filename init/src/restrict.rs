//! The fixed restriction order of the command's stage (STYLE rule 5), as a
//! sequence over a [`Kernel`] seam: the real kernel in the sandbox's init,
//! a recording fake in unit tests (which run without root).
//!
//! 1. capabilities: the bounding set first (needs CAP_SETPCAP, which we
//!    still have), then ambient and inheritable, so no exec regains them;
//! 2. no_new_privs, so no setuid binary or file capability raises them;
//! 3. the unprivileged uid/gid and no supplementary groups (moving off uid
//!    0 empties the permitted and effective sets) …
//! 4. … which is then verified: no capability in any set;
//! 5. Landlock, built from sandbox paths (after the pivot); a ruleset the
//!    kernel enforced none of fails the turn;
//! 6. the working directory;
//! 7. seccomp last, so every step above may use what it forbids.
//!
//! The first failure stops the sequence and names its stage: nothing after
//! it runs, and the command is never executed (fail closed).

use turnstile_policy::plan::{LandlockRules, Plan};

use super::landlock::LandlockOutcome;

/// The kernel operations of the restriction order.
pub trait Kernel {
    fn drop_capabilities(&mut self) -> Result<(), String>;
    fn no_new_privs(&mut self) -> Result<(), String>;
    fn become_user(&mut self, uid: u32, gid: u32) -> Result<(), String>;
    fn verify_no_capabilities(&mut self) -> Result<(), String>;
    fn landlock(&mut self, rules: &LandlockRules) -> Result<LandlockOutcome, String>;
    fn chdir(&mut self, dir: &str) -> Result<(), String>;
    fn seccomp(&mut self, bpf: &[u8]) -> Result<(), String>;
}

/// A stage that failed, and why.
pub type Failure = (&'static str, String);

/// Applies every restriction of `plan` in the fixed order; returns what
/// Landlock enforced, or the first failure.
pub fn restrict(k: &mut dyn Kernel, plan: &Plan, bpf: &[u8]) -> Result<LandlockOutcome, Failure> {
    restrict_identity(k, plan.uid, plan.gid)?;
    restrict_access(k, plan, bpf)
}

/// Steps 1–4: no capability in any set, no_new_privs, the turn's uid and
/// gid. They depend only on a Plan's shape (uid and gid are part of it),
/// so a warm sandbox's command stage takes them before its turn is known.
pub fn restrict_identity(k: &mut dyn Kernel, uid: u32, gid: u32) -> Result<(), Failure> {
    k.drop_capabilities()
        .map_err(|e| ("drop capabilities", e))?;
    k.no_new_privs().map_err(|e| ("set no_new_privs", e))?;
    k.become_user(uid, gid)
        .map_err(|e| ("become the turn's user", e))?;
    k.verify_no_capabilities()
        .map_err(|e| ("drop capabilities", e))
}

/// Steps 5–7, after [`restrict_identity`]: Landlock (its execute rules are
/// the turn's), the working directory, seccomp last.
pub fn restrict_access(
    k: &mut dyn Kernel,
    plan: &Plan,
    bpf: &[u8],
) -> Result<LandlockOutcome, Failure> {
    let outcome = k.landlock(&plan.landlock).map_err(|e| ("landlock", e))?;
    if outcome.status == "not_enforced" && !plan.allow_degraded.iter().any(|l| l == "landlock") {
        return Err((
            "landlock",
            "the kernel enforced none of the Landlock rules".into(),
        ));
    }
    k.chdir(&plan.cwd)
        .map_err(|e| ("chdir to workspace root", e))?;
    k.seccomp(bpf).map_err(|e| ("load seccomp filter", e))?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records every call; fails the one named `fail_at`.
    #[derive(Default)]
    struct Recording {
        calls: Vec<String>,
        fail_at: Option<&'static str>,
        landlock_status: Option<&'static str>,
    }

    impl Recording {
        fn step(&mut self, name: &'static str, detail: String) -> Result<(), String> {
            self.calls.push(detail);
            if self.fail_at == Some(name) {
                return Err(format!("{name} refused"));
            }
            Ok(())
        }
    }

    impl Kernel for Recording {
        fn drop_capabilities(&mut self) -> Result<(), String> {
            self.step("caps", "drop capabilities".into())
        }
        fn no_new_privs(&mut self) -> Result<(), String> {
            self.step("nnp", "no_new_privs".into())
        }
        fn become_user(&mut self, uid: u32, gid: u32) -> Result<(), String> {
            self.step("user", format!("become {uid}:{gid}"))
        }
        fn verify_no_capabilities(&mut self) -> Result<(), String> {
            self.step("verify", "verify no capabilities".into())
        }
        fn landlock(&mut self, rules: &LandlockRules) -> Result<LandlockOutcome, String> {
            self.step(
                "landlock",
                format!("landlock ({} read rules)", rules.read.len()),
            )?;
            Ok(LandlockOutcome {
                status: self.landlock_status.unwrap_or("fully_enforced"),
                unenforced: Vec::new(),
                kernel_abi: Some(7),
                skipped: Vec::new(),
            })
        }
        fn chdir(&mut self, dir: &str) -> Result<(), String> {
            self.step("chdir", format!("chdir {dir}"))
        }
        fn seccomp(&mut self, bpf: &[u8]) -> Result<(), String> {
            self.step("seccomp", format!("seccomp ({} bytes)", bpf.len()))
        }
    }

    fn plan() -> Plan {
        let json = serde_json::json!({
            "session_id": "S", "turn_number": 1, "package_id": "p", "root": "/ws",
            "argv": ["/bin/true"], "execute_entry": "/bin/true", "cwd": "/ws", "env": [],
            "uid": 65534, "gid": 65534, "workspace_owner": [0, 0], "hostname": "turnstile",
            "namespaces": [], "read_baseline": [], "mounts": [], "writable_scopes": [],
            "landlock": {"abi": 6, "read": ["/usr"], "read_write": [], "execute": [], "devices": []},
            "seccomp": {"default_errno": 38, "allow": [], "deny": [], "enosys": [], "arg_rules": []},
            "limits": {"memory_bytes": 1, "cpu_millis": 1, "pids": 1, "timeout_seconds": 1,
                       "disk_bytes": 1, "files": 1, "output_bytes": 1},
            "network": "isolated"
        });
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_restrictions_run_in_the_fixed_order_seccomp_last() {
        let mut k = Recording::default();
        let outcome = restrict(&mut k, &plan(), &[0; 8]).unwrap();
        assert_eq!(outcome.status, "fully_enforced");
        assert_eq!(
            k.calls,
            [
                "drop capabilities",
                "no_new_privs",
                "become 65534:65534",
                "verify no capabilities",
                "landlock (1 read rules)",
                "chdir /ws",
                "seccomp (8 bytes)",
            ]
        );
    }

    #[test]
    fn the_first_failure_stops_everything_after_it_and_names_its_stage() {
        let order = [
            "caps", "nnp", "user", "verify", "landlock", "chdir", "seccomp",
        ];
        for (i, step) in order.iter().enumerate() {
            let mut k = Recording {
                fail_at: Some(step),
                ..Recording::default()
            };
            let (stage, why) = restrict(&mut k, &plan(), &[]).unwrap_err();
            assert_eq!(
                k.calls.len(),
                i + 1,
                "{step}: later steps ran: {:?}",
                k.calls
            );
            assert!(why.contains("refused"), "{step}: {why}");
            assert!(!stage.is_empty());
        }
        // A ruleset the kernel enforced none of is a failure too, before
        // chdir and seccomp.
        let mut k = Recording {
            landlock_status: Some("not_enforced"),
            ..Recording::default()
        };
        assert_eq!(restrict(&mut k, &plan(), &[]).unwrap_err().0, "landlock");
        assert_eq!(k.calls.len(), 5);
        // ... unless the manifest's `allow_degraded` lists Landlock: then
        // everything else still runs, seccomp last, and the outcome says
        // what Landlock enforced (the evidence records the degradation).
        let mut k = Recording {
            landlock_status: Some("not_enforced"),
            ..Recording::default()
        };
        let mut allowing = plan();
        allowing.allow_degraded = vec!["landlock".into()];
        let outcome = restrict(&mut k, &allowing, &[]).unwrap();
        assert_eq!(outcome.status, "not_enforced");
        assert_eq!(k.calls.len(), 7);
        assert!(k.calls[6].starts_with("seccomp"));
    }
}
