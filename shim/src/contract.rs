//! The shim contract, pure: a container's `config.json` and annotations,
//! and the shim's options, become one typed [`Turn`], which becomes the
//! exact argv of `supervise check` (admission at Create) and `supervise
//! run` (the turn at Start). Nothing here touches the system but reading
//! the image rootfs to resolve `argv[0]` through the image's `PATH`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::ShimError;

/// Annotation keys (on the container, or on the pod: CRI copies pod
/// annotations it is configured to pass through).
pub const WORKSPACE: &str = "io.turnstile.workspace";
pub const PACKAGE: &str = "io.turnstile.package";
pub const SESSION: &str = "io.turnstile.session";
pub const OUTPUTS: &str = "io.turnstile.outputs";
pub const WORK_ORDER: &str = "io.turnstile.work-order";

/// Backends `supervise run` may use under the shim.
pub const BACKENDS: [&str; 4] = ["runc", "crun", "runsc", "native"];

/// The shim's options: a JSON file named by the runtime options'
/// `ConfigPath` (containerd's `[...runtimes.turnstile.options]`, or `ctr
/// run --runtime-config-path`), else [`DEFAULT_CONFIG`] when it exists,
/// else the defaults.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// The OCI runtime under the turn (`runc` by default).
    #[serde(default = "default_backend")]
    pub backend: String,
    /// Supervisor state (overlay uppers, anchors, locks).
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// The `supervise` binary (default: next to the shim, else on PATH).
    #[serde(default)]
    pub supervise: Option<PathBuf>,
}

/// Where the shim looks for its options when containerd names none.
pub const DEFAULT_CONFIG: &str = "/etc/turnstile/shim.json";

fn default_backend() -> String {
    "runc".into()
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/turnstile")
}

impl Default for Options {
    fn default() -> Self {
        Self {
            backend: default_backend(),
            state_dir: default_state_dir(),
            supervise: None,
        }
    }
}

impl Options {
    /// Parses the options file's text; the field at fault is named.
    pub fn parse(text: &str, source: &Path) -> Result<Self, ShimError> {
        let o: Options = serde_json::from_str(text).map_err(|e| ShimError::Options {
            path: source.to_path_buf(),
            reason: e.to_string(),
        })?;
        if !BACKENDS.contains(&o.backend.as_str()) {
            return Err(ShimError::Options {
                path: source.to_path_buf(),
                reason: format!(
                    "backend `{}` is not one of {}",
                    o.backend,
                    BACKENDS.join(", ")
                ),
            });
        }
        if !o.state_dir.is_absolute() {
            return Err(ShimError::Options {
                path: source.to_path_buf(),
                reason: "state_dir must be an absolute path".into(),
            });
        }
        Ok(o)
    }
}

/// One declared output.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Output {
    pub path: String,
    pub role: String,
}

/// What a container asks for, as a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub workspace: PathBuf,
    pub package: String,
    pub session: Option<String>,
    /// `[]` = writes nothing (`--no-outputs`).
    pub outputs: Vec<Output>,
    pub work_order: Option<String>,
    /// The container's process, `argv[0]` resolved in the image.
    pub argv: Vec<String>,
    /// The image rootfs (the turn's system view).
    pub rootfs: PathBuf,
}

/// The parts of `config.json` the shim reads (the rest is containerd's and
/// the OCI runtime's business, and the turn's Plan replaces it).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Spec {
    #[serde(default)]
    pub process: Option<Process>,
    #[serde(default)]
    pub root: Option<Root>,
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Process {
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub terminal: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Root {
    pub path: String,
}

fn annotation<'a>(spec: &'a Spec, key: &'static str) -> Result<Option<&'a str>, ShimError> {
    match spec.annotations.get(key) {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Err(ShimError::Annotation {
            key,
            reason: "is empty".into(),
        }),
        Some(v) => Ok(Some(v.as_str())),
    }
}

fn required<'a>(spec: &'a Spec, key: &'static str) -> Result<&'a str, ShimError> {
    annotation(spec, key)?.ok_or(ShimError::Annotation {
        key,
        reason: "is required".into(),
    })
}

/// The turn a container's spec asks for; `bundle` is where its rootfs is
/// when `root.path` is relative. Refused, naming the field: a missing
/// workspace or package, absent outputs (FR-RT-013: `[]` is the explicit
/// "writes nothing"), malformed outputs, no process args, a terminal.
pub fn turn_from_spec(spec: &Spec, bundle: &Path) -> Result<Turn, ShimError> {
    let workspace = PathBuf::from(required(spec, WORKSPACE)?);
    if !workspace.is_absolute() {
        return Err(ShimError::Annotation {
            key: WORKSPACE,
            reason: format!("`{}` is not an absolute host path", workspace.display()),
        });
    }
    let package = required(spec, PACKAGE)?.to_owned();
    let session = annotation(spec, SESSION)?.map(str::to_owned);
    let outputs_raw = annotation(spec, OUTPUTS)?.ok_or(ShimError::Annotation {
        key: OUTPUTS,
        reason: "is required (FR-RT-013): declare the turn's outputs as a JSON list of {\"path\", \"role\"}, or [] for none".into(),
    })?;
    let outputs: Vec<Output> =
        serde_json::from_str(outputs_raw).map_err(|e| ShimError::Annotation {
            key: OUTPUTS,
            reason: format!("not a JSON list of {{\"path\", \"role\"}}: {e}"),
        })?;
    if let Some(o) = outputs
        .iter()
        .find(|o| o.path.is_empty() || o.role.is_empty() || o.role.contains(':'))
    {
        return Err(ShimError::Annotation {
            key: OUTPUTS,
            reason: format!(
                "output {{path: `{}`, role: `{}`}}: path and role must be non-empty, the role without ':'",
                o.path, o.role
            ),
        });
    }
    let work_order = annotation(spec, WORK_ORDER)?.map(str::to_owned);
    let process = spec.process.clone().unwrap_or_default();
    if process.terminal {
        return Err(ShimError::Spec {
            field: "process.terminal",
            reason: "a turn has no terminal (its output is captured and recorded); run without -t"
                .into(),
        });
    }
    if process.args.is_empty() {
        return Err(ShimError::Spec {
            field: "process.args",
            reason: "the container has no command".into(),
        });
    }
    let root = spec.root.as_ref().map_or("rootfs", |r| r.path.as_str());
    let rootfs = if Path::new(root).is_absolute() {
        PathBuf::from(root)
    } else {
        bundle.join(root)
    };
    let mut argv = process.args.clone();
    argv[0] = resolve_program(&argv[0], &process.env, &rootfs);
    Ok(Turn {
        workspace,
        package,
        session,
        outputs,
        work_order,
        argv,
        rootfs,
    })
}

/// `argv[0]` without a `/` is looked up in the image's `PATH` (the
/// container's env, else the usual default), as a container runtime would;
/// the first directory of the image holding that name wins. Anything else
/// is left to `supervise` (absolute: a path in the image; relative with a
/// `/`: relative to the workspace root).
fn resolve_program(program: &str, env: &[String], rootfs: &Path) -> String {
    if program.contains('/') {
        return program.to_owned();
    }
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .map(|d| format!("{}/{program}", d.trim_end_matches('/')))
        .find(|p| {
            rootfs
                .join(p.trim_start_matches('/'))
                .symlink_metadata()
                .is_ok()
        })
        .unwrap_or_else(|| program.to_owned())
}

impl Turn {
    /// The flags `check` and `run` share: workspace, state, package,
    /// session, outputs, rootfs.
    fn common(&self, options: &Options) -> Vec<String> {
        let mut a = vec![
            "--root".to_owned(),
            self.workspace.display().to_string(),
            "--state-dir".to_owned(),
            options.state_dir.display().to_string(),
            "--package".to_owned(),
            self.package.clone(),
        ];
        if let Some(s) = &self.session {
            a.extend(["--session".to_owned(), s.clone()]);
        }
        if self.outputs.is_empty() {
            a.push("--no-outputs".to_owned());
        }
        for o in &self.outputs {
            a.extend(["--output".to_owned(), format!("{}:{}", o.path, o.role)]);
        }
        a.extend(["--rootfs".to_owned(), self.rootfs.display().to_string()]);
        a
    }

    /// `supervise check --json …`: the pre-execution check at Create.
    pub fn check_args(&self, options: &Options) -> Vec<String> {
        let mut a = vec!["check".to_owned(), "--json".to_owned()];
        a.extend(self.common(options));
        a.push("--".to_owned());
        a.extend(self.argv.iter().cloned());
        a
    }

    /// `supervise run …`: the turn at Start (and the record of a refused
    /// one at Create). Without `--json`: the container's stdout is the
    /// command's; the turn's result goes to `events` (EventEnvelope v1
    /// lines) and its summary line to the container's stderr.
    pub fn run_args(&self, options: &Options, events: &Path) -> Vec<String> {
        let mut a = vec![
            "run".to_owned(),
            "--backend".to_owned(),
            options.backend.clone(),
            "--events".to_owned(),
            events.display().to_string(),
        ];
        a.extend(self.common(options));
        if let Some(w) = &self.work_order {
            a.extend(["--work-order".to_owned(), w.clone()]);
        }
        a.push("--".to_owned());
        a.extend(self.argv.iter().cloned());
        a
    }
}

/// Decodes containerd's runtime options (`runtimeoptions.v1.Options`, what
/// the CRI plugin and `ctr --runtime-config-path` send for a runtime that
/// is not runc): protobuf field 2, `config_path`. Field 1 (`type_url`) and
/// unknown fields are skipped. `None` when absent or malformed.
pub fn config_path_from_options(bytes: &[u8]) -> Option<String> {
    let mut i = 0;
    let mut found = None;
    let varint = |i: &mut usize| -> Option<u64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = *bytes.get(*i)?;
            *i += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    };
    while i < bytes.len() {
        let key = varint(&mut i)?;
        match key & 7 {
            0 => {
                varint(&mut i)?;
            }
            2 => {
                let len = usize::try_from(varint(&mut i)?).ok()?;
                let data = bytes.get(i..i.checked_add(len)?)?;
                i += len;
                if key >> 3 == 2 {
                    found = Some(String::from_utf8(data.to_vec()).ok()?);
                }
            }
            _ => return None,
        }
    }
    found.filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(annotations: &[(&str, &str)], args: &[&str]) -> Spec {
        Spec {
            process: Some(Process {
                args: args.iter().map(|s| (*s).to_owned()).collect(),
                env: vec!["PATH=/usr/bin:/bin".into()],
                terminal: false,
            }),
            root: Some(Root {
                path: "rootfs".into(),
            }),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    const BASE: [(&str, &str); 2] = [(WORKSPACE, "/ws"), (PACKAGE, "bb")];

    #[test]
    fn fr_rt_013_absent_outputs_are_refused_naming_the_annotation() {
        let e = turn_from_spec(&spec(&BASE, &["/bin/sh"]), Path::new("/b")).unwrap_err();
        assert_eq!(e.code(), "TS1201");
        assert!(e.to_string().contains(OUTPUTS), "{e}");
        assert!(e.to_string().contains("FR-RT-013"), "{e}");
    }

    #[test]
    fn missing_or_bad_fields_are_named() {
        for (ann, args, field) in [
            (
                vec![(PACKAGE, "bb"), (OUTPUTS, "[]")],
                vec!["/bin/sh"],
                WORKSPACE,
            ),
            (
                vec![(WORKSPACE, "rel"), (PACKAGE, "bb"), (OUTPUTS, "[]")],
                vec!["/bin/sh"],
                WORKSPACE,
            ),
            (
                vec![(WORKSPACE, "/ws"), (OUTPUTS, "[]")],
                vec!["/bin/sh"],
                PACKAGE,
            ),
            (
                vec![(WORKSPACE, "/ws"), (PACKAGE, "bb"), (OUTPUTS, "{}")],
                vec!["/bin/sh"],
                OUTPUTS,
            ),
            (
                vec![
                    (WORKSPACE, "/ws"),
                    (PACKAGE, "bb"),
                    (OUTPUTS, r#"[{"path":"a"}]"#),
                ],
                vec!["/bin/sh"],
                OUTPUTS,
            ),
            (
                vec![(WORKSPACE, "/ws"), (PACKAGE, "bb"), (OUTPUTS, "[]")],
                vec![],
                "process.args",
            ),
        ] {
            let e = turn_from_spec(&spec(&ann, &args), Path::new("/b")).unwrap_err();
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn argv_is_exact_for_check_and_run() {
        let mut ann = BASE.to_vec();
        ann.extend([
            (
                OUTPUTS,
                r#"[{"path":"output/<session_id>/r.txt","role":"result"}]"#,
            ),
            (SESSION, "SES-1"),
            (WORK_ORDER, "WO-7"),
        ]);
        let t = turn_from_spec(&spec(&ann, &["/bin/sh", "-c", "x"]), Path::new("/b")).unwrap();
        let o = Options::default();
        assert_eq!(
            t.check_args(&o),
            [
                "check",
                "--json",
                "--root",
                "/ws",
                "--state-dir",
                "/var/lib/turnstile",
                "--package",
                "bb",
                "--session",
                "SES-1",
                "--output",
                "output/<session_id>/r.txt:result",
                "--rootfs",
                "/b/rootfs",
                "--",
                "/bin/sh",
                "-c",
                "x"
            ]
        );
        assert_eq!(
            t.run_args(&o, Path::new("/b/turn-events.jsonl")),
            [
                "run",
                "--backend",
                "runc",
                "--events",
                "/b/turn-events.jsonl",
                "--root",
                "/ws",
                "--state-dir",
                "/var/lib/turnstile",
                "--package",
                "bb",
                "--session",
                "SES-1",
                "--output",
                "output/<session_id>/r.txt:result",
                "--rootfs",
                "/b/rootfs",
                "--work-order",
                "WO-7",
                "--",
                "/bin/sh",
                "-c",
                "x"
            ]
        );
        let mut ann = BASE.to_vec();
        ann.push((OUTPUTS, "[]"));
        let t = turn_from_spec(&spec(&ann, &["/bin/true"]), Path::new("/b")).unwrap();
        assert!(t.check_args(&o).contains(&"--no-outputs".to_owned()));
    }

    #[test]
    fn a_bare_program_name_is_found_on_the_images_path() {
        let image = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(image.path().join("bin")).unwrap();
        std::fs::write(image.path().join("bin/busybox"), b"").unwrap();
        std::os::unix::fs::symlink("busybox", image.path().join("bin/sh")).unwrap();
        let env = vec!["PATH=/usr/bin:/bin".to_owned()];
        assert_eq!(resolve_program("sh", &env, image.path()), "/bin/sh");
        assert_eq!(resolve_program("nope", &env, image.path()), "nope");
        assert_eq!(resolve_program("/x/y", &env, image.path()), "/x/y");
    }

    #[test]
    fn options_parse_with_defaults_and_refuse_unknown_fields() {
        let p = Path::new("/etc/turnstile/shim.json");
        assert_eq!(Options::parse("{}", p).unwrap(), Options::default());
        let o = Options::parse(r#"{"backend":"crun","state_dir":"/s"}"#, p).unwrap();
        assert_eq!(
            (o.backend.as_str(), o.state_dir.as_path()),
            ("crun", Path::new("/s"))
        );
        for bad in [
            r#"{"backend":"docker"}"#,
            r#"{"state_dir":"rel"}"#,
            r#"{"x":1}"#,
        ] {
            assert!(Options::parse(bad, p).is_err(), "{bad}");
        }
    }

    #[test]
    fn runtime_options_config_path_is_decoded() {
        // type_url = "runtimeoptions.v1.Options", config_path = "/c.json"
        let mut b = vec![0x0a, 25];
        b.extend_from_slice(b"runtimeoptions.v1.Options");
        b.extend([0x12, 7]);
        b.extend_from_slice(b"/c.json");
        assert_eq!(config_path_from_options(&b).as_deref(), Some("/c.json"));
        assert_eq!(config_path_from_options(&[]), None);
        assert_eq!(config_path_from_options(&[0x12, 9, b'x']), None);
    }
}
