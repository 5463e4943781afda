//! The OCI runtimes' command lines, typed: which runtime, which command,
//! and the exact arguments each gets (as containerd's runc crate builds
//! them). Pure: the supervisor's driver spawns them.

use std::path::Path;

/// An OCI runtime turnstile drives through its CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    Runc,
    Crun,
    /// gVisor.
    Runsc,
}

impl Runtime {
    pub const ALL: [Self; 3] = [Self::Runc, Self::Crun, Self::Runsc];

    /// Its binary's name (and the name of its state directory).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Crun => "crun",
            Self::Runsc => "runsc",
        }
    }

    /// The runtime named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// The global flags before the command. runsc: `--platform=ptrace`
    /// (the only platform that works on these hosts: kvm hangs, systrap is
    /// newer than Debian's runsc), `--network=none` (the sandbox's loopback
    /// only: `isolated`), `--oci-seccomp` (the bundle's filter installed
    /// inside the sandbox; off by default).
    fn globals(self, root: &Path, log: &Path) -> Vec<String> {
        let mut v = vec![
            "--root".to_owned(),
            root.display().to_string(),
            "--log".to_owned(),
            log.display().to_string(),
        ];
        if self == Self::Runsc {
            v.extend([
                "--platform=ptrace".to_owned(),
                "--network=none".to_owned(),
                "--oci-seccomp".to_owned(),
            ]);
        }
        v
    }

    /// The arguments after the binary for `cmd`, with the runtime's state
    /// in `root` and its log in `log`.
    pub fn argv(self, cmd: &RuntimeCmd<'_>, root: &Path, log: &Path) -> Vec<String> {
        let mut v = self.globals(root, log);
        match cmd {
            RuntimeCmd::RunDetached {
                bundle,
                pid_file,
                id,
                preserve_fds,
            } => {
                v.extend([
                    "run".into(),
                    "--detach".into(),
                    "--bundle".into(),
                    bundle.display().to_string(),
                    "--pid-file".into(),
                    pid_file.display().to_string(),
                ]);
                if *preserve_fds > 0 {
                    v.extend(["--preserve-fds".into(), preserve_fds.to_string()]);
                }
                v.push((*id).to_owned());
            }
            RuntimeCmd::Create {
                bundle,
                pid_file,
                id,
            } => v.extend([
                "create".into(),
                "--bundle".into(),
                bundle.display().to_string(),
                "--pid-file".into(),
                pid_file.display().to_string(),
                (*id).to_owned(),
            ]),
            RuntimeCmd::Start { id } => v.extend(["start".into(), (*id).to_owned()]),
            RuntimeCmd::Delete { id } => {
                v.extend(["delete".into(), "--force".into(), (*id).to_owned()]);
            }
        }
        v
    }
}

/// One invocation of a runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeCmd<'a> {
    /// `run --detach`: create and start at once (runc, crun); the
    /// container's process is turnstile's init, which parks until the
    /// supervisor's go. `preserve_fds`: descriptors past stdio it keeps.
    RunDetached {
        bundle: &'a Path,
        pid_file: &'a Path,
        id: &'a str,
        preserve_fds: u32,
    },
    /// `create` (runsc: its sandbox exists, the command waits for start).
    Create {
        bundle: &'a Path,
        pid_file: &'a Path,
        id: &'a str,
    },
    Start {
        id: &'a str,
    },
    /// `delete --force`: kills what is left and forgets the container.
    Delete {
        id: &'a str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn runc_and_crun_command_lines_are_exact() {
        let (root, log) = (Path::new("/run/t"), Path::new("/s/t/runc.log"));
        for rt in [Runtime::Runc, Runtime::Crun] {
            assert_eq!(
                rt.argv(
                    &RuntimeCmd::RunDetached {
                        bundle: Path::new("/s/t/bundle"),
                        pid_file: Path::new("/s/t/runc.pid"),
                        id: "SES-x-t1",
                        preserve_fds: 2,
                    },
                    root,
                    log
                ),
                strings(&[
                    "--root",
                    "/run/t",
                    "--log",
                    "/s/t/runc.log",
                    "run",
                    "--detach",
                    "--bundle",
                    "/s/t/bundle",
                    "--pid-file",
                    "/s/t/runc.pid",
                    "--preserve-fds",
                    "2",
                    "SES-x-t1"
                ])
            );
            assert_eq!(
                rt.argv(&RuntimeCmd::Delete { id: "i" }, root, log),
                strings(&[
                    "--root",
                    "/run/t",
                    "--log",
                    "/s/t/runc.log",
                    "delete",
                    "--force",
                    "i"
                ])
            );
        }
    }

    #[test]
    fn runsc_command_lines_are_exact() {
        let (root, log) = (Path::new("/run/t"), Path::new("/s/runsc.log"));
        let with = |tail: &[&str]| -> Vec<String> {
            strings(&[
                "--root",
                "/run/t",
                "--log",
                "/s/runsc.log",
                "--platform=ptrace",
                "--network=none",
                "--oci-seccomp",
            ])
            .into_iter()
            .chain(strings(tail))
            .collect()
        };
        let rt = Runtime::Runsc;
        assert_eq!(
            rt.argv(
                &RuntimeCmd::Create {
                    bundle: Path::new("/s/bundle"),
                    pid_file: Path::new("/s/runsc.pid"),
                    id: "S-t1"
                },
                root,
                log
            ),
            with(&[
                "create",
                "--bundle",
                "/s/bundle",
                "--pid-file",
                "/s/runsc.pid",
                "S-t1"
            ])
        );
        assert_eq!(
            rt.argv(&RuntimeCmd::Start { id: "i" }, root, log),
            with(&["start", "i"])
        );
        assert_eq!(
            rt.argv(&RuntimeCmd::Delete { id: "i" }, root, log),
            with(&["delete", "--force", "i"])
        );
    }

    #[test]
    fn names_round_trip_and_no_preserved_fds_means_no_flag() {
        for rt in Runtime::ALL {
            assert_eq!(Runtime::parse(rt.as_str()), Some(rt));
        }
        assert_eq!(Runtime::parse("kata"), None);
        let argv = Runtime::Runc.argv(
            &RuntimeCmd::RunDetached {
                bundle: Path::new("/b"),
                pid_file: Path::new("/p"),
                id: "i",
                preserve_fds: 0,
            },
            Path::new("/r"),
            Path::new("/l"),
        );
        assert!(!argv.iter().any(|a| a == "--preserve-fds"), "{argv:?}");
    }
}
