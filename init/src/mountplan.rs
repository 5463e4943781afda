//! The native backend's mount plan: the Plan's mount list turned into the
//! concrete steps that build the turn's root (paths under the new root and
//! the turn dir resolved here, purely), and the driver that runs them in
//! order through a [`Mounts`] seam — the kernel in the init, a recording
//! fake in the unit tests below, which need no root.
//!
//! The order is the guarantee: `/` is made rprivate before anything is
//! mounted (nothing propagates to the host), the root tmpfs comes next,
//! the turn's `/proc` before the workspace's idmapping (which needs it),
//! the view in the Plan's order (so a mask always lands on top of what it
//! hides), the idmapped clone detached last. The first failing step stops
//! the build: nothing after it runs, and the turn fails closed.

use std::path::{Path, PathBuf};

use turnstile_policy::plan::{Mount, Plan};

use super::turnpaths::{EMPTY_DIR, LOWER_DIR, SCRATCH_DIR};

/// The file every masked file is bound from (in the new root, mode 0000).
pub const MASK_SOURCE: &str = ".masked";

/// One step of building the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountStep {
    /// `mount --make-rprivate /` in the turn's mount namespace.
    MakeRprivate,
    /// `lo` up in the turn's network namespace.
    LoopbackUp,
    RootTmpfs {
        target: PathBuf,
    },
    Proc {
        target: PathBuf,
    },
    /// The workspace root, idmapped owner -> the turn's ids, at `target`.
    IdmapWorkspace {
        /// The turn's `/proc` (the idmap helper's user namespace is set up
        /// through it).
        proc: PathBuf,
        source: PathBuf,
        target: PathBuf,
        owner: (u32, u32),
        ids: (u32, u32),
    },
    /// Opens the view's sources: the system's root (the host's `/`, or the
    /// image rootfs of `Plan::system_root`), the idmapped clone, the empty
    /// directory (held until [`MountStep::DetachWorkspace`]).
    OpenSources {
        system: PathBuf,
        /// The workspace root's path in the Plan (paths under it are taken
        /// from `workspace`).
        root: String,
        workspace: PathBuf,
        empty: PathBuf,
    },
    /// Creates the empty, mode-0000 file masks are bound from.
    MaskSource {
        file: PathBuf,
    },
    /// A granted path, read-only: a directory as a read-only overlay, a
    /// file as a bind, opened without following symlinks.
    ShowReadOnly {
        path: String,
        target: PathBuf,
    },
    /// The system baseline (`/usr`, …), bound read-only; from an image
    /// rootfs it is opened beneath the image without following symlinks.
    SystemReadOnly {
        path: String,
        target: PathBuf,
        in_image: bool,
    },
    Symlink {
        link: PathBuf,
        target: String,
    },
    Dir {
        target: PathBuf,
    },
    /// A generated file (hosts, passwd…) written to `file`, bound read-only.
    Generated {
        file: PathBuf,
        target: PathBuf,
        contents: String,
    },
    Dev {
        target: PathBuf,
        shm_bytes: u64,
    },
    Ephemeral {
        target: PathBuf,
        bytes: u64,
    },
    /// A writable scope: overlay of the workspace directory, upper and work
    /// on the turn's scratch tmpfs.
    Overlay {
        path: String,
        target: PathBuf,
        upper: PathBuf,
        work: PathBuf,
    },
    MaskDir {
        target: PathBuf,
    },
    MaskFile {
        source: PathBuf,
        target: PathBuf,
    },
    /// Closes the sources. The idmapped clone at `target` (in the turn
    /// directory, outside the new root) is detached with the old root
    /// after `pivot_root`, in the same unmount.
    DetachWorkspace {
        target: PathBuf,
    },
    /// The mount point `pivot_root` puts the old root on.
    OldRootDir {
        target: PathBuf,
    },
}

impl MountStep {
    /// The stage named in the report when this step fails.
    pub fn stage(&self) -> &'static str {
        match self {
            Self::MakeRprivate => "make / rprivate",
            Self::LoopbackUp => "bring up lo",
            Self::RootTmpfs { .. } => "mount root tmpfs",
            Self::Proc { .. } => "mount /proc",
            Self::IdmapWorkspace { .. } => "idmap workspace",
            Self::OpenSources { .. } => "open view source",
            Self::MaskSource { .. } => "create mask file",
            Self::ShowReadOnly { .. } => "show read-only",
            Self::SystemReadOnly { .. } => "bind mount",
            Self::Symlink { .. } => "create symlink",
            Self::Dir { .. } => "create mount point",
            Self::Generated { .. } => "write generated file",
            Self::Dev { .. } => "build /dev",
            Self::Ephemeral { .. } => "mount ephemeral tmpfs",
            Self::Overlay { .. } => "mount overlay",
            Self::MaskDir { .. } => "mask directory",
            Self::MaskFile { .. } => "mask file",
            Self::DetachWorkspace { .. } => "detach workspace clone",
            Self::OldRootDir { .. } => "create mount point",
        }
    }
}

/// `path` (absolute, as the sandbox sees it) under `new_root`.
pub fn under(new_root: &Path, path: &str) -> PathBuf {
    new_root.join(path.trim_start_matches('/'))
}

/// The steps that build `plan`'s root at `new_root`, for turn dir `turn`.
pub fn steps(plan: &Plan, turn: &Path, new_root: &Path) -> Vec<MountStep> {
    let lower = turn.join(LOWER_DIR);
    let scratch = turn.join(SCRATCH_DIR);
    let mask = new_root.join(MASK_SOURCE);
    let mut s = vec![
        MountStep::MakeRprivate,
        MountStep::LoopbackUp,
        MountStep::RootTmpfs {
            target: new_root.to_path_buf(),
        },
        MountStep::Proc {
            target: new_root.join("proc"),
        },
        MountStep::IdmapWorkspace {
            proc: new_root.join("proc"),
            source: PathBuf::from(&plan.root),
            target: lower.clone(),
            owner: plan.workspace_owner,
            ids: (plan.uid, plan.gid),
        },
        MountStep::OpenSources {
            system: PathBuf::from(plan.system_root.as_deref().unwrap_or("/")),
            root: plan.root.clone(),
            workspace: lower.clone(),
            empty: turn.join(EMPTY_DIR),
        },
        MountStep::MaskSource { file: mask.clone() },
    ];
    for (n, m) in plan.mounts.iter().enumerate() {
        s.push(match m {
            Mount::ReadOnly { path } => MountStep::ShowReadOnly {
                path: path.clone(),
                target: under(new_root, path),
            },
            Mount::SystemReadOnly { path } => MountStep::SystemReadOnly {
                path: path.clone(),
                target: under(new_root, path),
                in_image: plan.system_root.is_some(),
            },
            Mount::Symlink { path, target } => MountStep::Symlink {
                link: under(new_root, path),
                target: target.clone(),
            },
            Mount::Dir { path } => MountStep::Dir {
                target: under(new_root, path),
            },
            Mount::Generated { path, contents } => MountStep::Generated {
                file: turn.join(format!("generated-{n}")),
                target: under(new_root, path),
                contents: contents.clone(),
            },
            Mount::Dev { shm_bytes } => MountStep::Dev {
                target: new_root.join("dev"),
                shm_bytes: *shm_bytes,
            },
            Mount::Ephemeral { path, bytes } => MountStep::Ephemeral {
                target: under(new_root, path),
                bytes: *bytes,
            },
            // Mounted first (above); hardened by PID 1 after the view.
            Mount::Proc { .. } => continue,
            Mount::Overlay { path, index } => MountStep::Overlay {
                path: path.clone(),
                target: under(new_root, path),
                upper: scratch.join("upper").join(index.to_string()),
                work: scratch.join("work").join(index.to_string()),
            },
            Mount::MaskDir { path, .. } => MountStep::MaskDir {
                target: under(new_root, path),
            },
            Mount::MaskFile { path, .. } => MountStep::MaskFile {
                source: mask.clone(),
                target: under(new_root, path),
            },
        });
    }
    s.push(MountStep::DetachWorkspace { target: lower });
    s.push(MountStep::OldRootDir {
        target: new_root.join(".oldroot"),
    });
    s
}

/// Carries out one step.
pub trait Mounts {
    fn apply(&mut self, step: &MountStep) -> Result<(), String>;
}

/// Runs `steps` in order; the first failure stops the build and is
/// returned with its stage.
pub fn build(m: &mut dyn Mounts, steps: &[MountStep]) -> Result<(), (&'static str, String)> {
    for step in steps {
        m.apply(step).map_err(|e| (step.stage(), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each step's stage and target; fails the `fail_at`-th.
    #[derive(Default)]
    struct Recording {
        done: Vec<MountStep>,
        fail_at: Option<usize>,
    }

    impl Mounts for Recording {
        fn apply(&mut self, step: &MountStep) -> Result<(), String> {
            if self.fail_at == Some(self.done.len()) {
                return Err("refused".into());
            }
            self.done.push(step.clone());
            Ok(())
        }
    }

    /// A Plan with one of each mount kind, in the order the policy emits
    /// them (a mask after the overlay and the read-only dir it covers).
    fn plan() -> Plan {
        let json = serde_json::json!({
            "session_id": "S", "turn_number": 1, "package_id": "p", "root": "/ws",
            "argv": ["/bin/true"], "execute_entry": "/bin/true", "cwd": "/ws", "env": [],
            "uid": 65534, "gid": 65534, "workspace_owner": [1000, 1000], "hostname": "turnstile",
            "namespaces": [], "read_baseline": [],
            "mounts": [
                {"op": "system_read_only", "path": "/usr"},
                {"op": "symlink", "path": "/bin", "target": "usr/bin"},
                {"op": "generated", "path": "/etc/passwd", "contents": "nobody:x:65534:65534::/:/bin/sh\n"},
                {"op": "dev", "shm_bytes": 1024},
                {"op": "proc", "masked": ["/proc/kcore"], "read_only": ["/proc/sys"]},
                {"op": "ephemeral", "path": "/tmp", "bytes": 4096},
                {"op": "dir", "path": "/ws"},
                {"op": "read_only", "path": "/ws/data"},
                {"op": "overlay", "path": "/ws/output/S", "index": 1},
                {"op": "mask_dir", "path": "/ws/data/secret", "reason": "forbidden"},
                {"op": "mask_file", "path": "/ws/output/S/key", "reason": "forbidden"}
            ],
            "writable_scopes": ["tmp/S", "output/S"],
            "landlock": {"abi": 6, "read": [], "read_write": [], "execute": [], "devices": []},
            "seccomp": {"default_errno": 38, "allow": [], "deny": [], "enosys": [], "arg_rules": []},
            "limits": {"memory_bytes": 1, "cpu_millis": 1, "pids": 1, "timeout_seconds": 1,
                       "disk_bytes": 1, "files": 1, "output_bytes": 1},
            "network": "isolated"
        });
        serde_json::from_value(json).unwrap()
    }

    fn position(done: &[MountStep], f: impl Fn(&MountStep) -> bool) -> usize {
        done.iter().position(f).unwrap()
    }

    #[test]
    fn issue_10_the_root_is_built_in_the_guaranteed_order() {
        let (turn, root) = (Path::new("/st/turn-1"), Path::new("/st/turn-1/root"));
        let steps = steps(&plan(), turn, root);
        let mut k = Recording::default();
        build(&mut k, &steps).unwrap();
        let d = &k.done;
        assert_eq!(d.len(), steps.len(), "every step ran once");
        // Nothing is mounted before / is private; the root tmpfs first of
        // all mounts; /proc before the idmapping that needs it.
        assert_eq!(d[0], MountStep::MakeRprivate);
        assert_eq!(
            d[2],
            MountStep::RootTmpfs {
                target: root.into()
            }
        );
        assert!(matches!(d[3], MountStep::Proc { .. }));
        assert_eq!(
            d[4],
            MountStep::IdmapWorkspace {
                proc: "/st/turn-1/root/proc".into(),
                source: "/ws".into(),
                target: "/st/turn-1/lower".into(),
                owner: (1000, 1000),
                ids: (65534, 65534),
            }
        );
        // Every target is inside the new root (or the turn dir): nothing
        // lands on the host's tree.
        for s in d {
            let targets: Vec<&PathBuf> = match s {
                MountStep::ShowReadOnly { target, .. }
                | MountStep::SystemReadOnly { target, .. }
                | MountStep::Dir { target }
                | MountStep::Dev { target, .. }
                | MountStep::Ephemeral { target, .. }
                | MountStep::MaskDir { target }
                | MountStep::OldRootDir { target } => vec![target],
                MountStep::Symlink { link, .. } => vec![link],
                MountStep::Generated { file, target, .. } => vec![file, target],
                MountStep::Overlay {
                    target,
                    upper,
                    work,
                    ..
                } => vec![target, upper, work],
                MountStep::MaskFile { source, target } => vec![source, target],
                _ => vec![],
            };
            for t in targets {
                assert!(t.starts_with(turn), "{s:?} writes outside the turn: {t:?}");
            }
        }
        // Masks land on top of what they hide.
        let overlay = position(d, |s| matches!(s, MountStep::Overlay { .. }));
        let shown = position(d, |s| matches!(s, MountStep::ShowReadOnly { .. }));
        let mask_dir = position(d, |s| matches!(s, MountStep::MaskDir { .. }));
        let mask_file = position(d, |s| matches!(s, MountStep::MaskFile { .. }));
        assert!(shown < mask_dir && overlay < mask_file);
        assert_eq!(
            d[overlay],
            MountStep::Overlay {
                path: "/ws/output/S".into(),
                target: "/st/turn-1/root/ws/output/S".into(),
                upper: "/st/turn-1/scratch/upper/1".into(),
                work: "/st/turn-1/scratch/work/1".into(),
            }
        );
        // The proc entry is not a view step (mounted first, hardened later).
        assert_eq!(
            d.iter()
                .filter(|s| matches!(s, MountStep::Proc { .. }))
                .count(),
            1
        );
        // The clone is detached after the last view step, then the pivot's
        // mount point.
        assert!(matches!(d[d.len() - 2], MountStep::DetachWorkspace { .. }));
        assert!(mask_file < d.len() - 2);
        // The clone is outside the new root: the old root's detach after
        // pivot_root takes it (the init does not unmount it on its own).
        let MountStep::DetachWorkspace { target } = &d[d.len() - 2] else {
            unreachable!()
        };
        let MountStep::RootTmpfs { target: new_root } = &d[2] else {
            panic!("the new root's tmpfs is the third step: {:?}", d[2])
        };
        assert!(
            !target.starts_with(new_root),
            "{target:?} under {new_root:?}"
        );
        assert!(matches!(d[d.len() - 1], MountStep::OldRootDir { .. }));
    }

    #[test]
    fn issue_10_a_failing_step_stops_the_build_and_names_its_stage() {
        let steps = steps(&plan(), Path::new("/t"), Path::new("/t/root"));
        for i in 0..steps.len() {
            let mut k = Recording {
                fail_at: Some(i),
                ..Recording::default()
            };
            let (stage, why) = build(&mut k, &steps).unwrap_err();
            assert_eq!(k.done.len(), i, "steps after the failure ran");
            assert_eq!(stage, steps[i].stage());
            assert_eq!(why, "refused");
        }
    }
}
