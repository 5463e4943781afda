//! The shim contract, pure: a container's `config.json` and annotations
//! become a typed [`Request`] (refused, naming the annotation, before
//! anything is mounted), which with the workspace root the shim's
//! [`Options`] map its name to becomes one [`Turn`], which becomes the
//! exact argv of `supervise check` (admission at Create) and `supervise
//! run` (the turn at Start). Also the typed outputs of `supervise` the
//! shim reads ([`CheckReport`]; exit statuses are `exit::RunExit`).
//! Nothing here touches the system but reading the image rootfs to
//! resolve `argv[0]` through the image's `PATH`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::ShimError;
use crate::workspaces::{WorkspaceName, Workspaces};

/// Annotation keys (on the container, or on the pod: CRI copies pod
/// annotations it is configured to pass through).
pub const WORKSPACE: &str = "io.turnstile.workspace";
pub const PACKAGE: &str = "io.turnstile.package";
pub const SESSION: &str = "io.turnstile.session";
pub const OUTPUTS: &str = "io.turnstile.outputs";
pub const WORK_ORDER: &str = "io.turnstile.work-order";

/// The contract's namespace: every annotation under it must be one of
/// [`KNOWN_ANNOTATIONS`] (a typo or a key of a later version is refused,
/// TS1047, never ignored).
pub const ANNOTATION_PREFIX: &str = "io.turnstile.";
/// Every `io.turnstile.*` annotation the shim reads — the one list.
pub const KNOWN_ANNOTATIONS: [&str; 5] = [WORKSPACE, PACKAGE, SESSION, OUTPUTS, WORK_ORDER];

/// A backend the options may name for `supervise run --backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Runc,
    Crun,
    Runsc,
    Native,
}

impl Backend {
    pub const ALL: [Backend; 4] = [Self::Runc, Self::Crun, Self::Runsc, Self::Native];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Crun => "crun",
            Self::Runsc => "runsc",
            Self::Native => "native",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = Self::ALL.iter().map(|b| b.as_str()).collect();
                format!("backend `{s}` is not one of {}", all.join(", "))
            })
    }
}

/// The shim's options: a JSON file named by the runtime options'
/// `ConfigPath` (containerd's `[...runtimes.turnstile.options]`, or `ctr
/// run --runtime-config-path`), else [`DEFAULT_CONFIG`] when it exists,
/// else the defaults (which map no workspace: every turn is refused until
/// `workspaces` names some).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The backend `supervise run` is told to use; `None` (the default):
    /// no `--backend`, so `supervise` chooses by the package's trust level.
    pub backend: Option<Backend>,
    /// Supervisor state (overlay uppers, anchors, locks).
    pub state_dir: PathBuf,
    /// The `supervise` binary (default: next to the shim, else on PATH).
    pub supervise: Option<PathBuf>,
    /// Workspace names -> host roots (see `workspaces`).
    pub workspaces: Workspaces,
}

/// The options document as written (`workspaces` parsed apart, so its
/// errors name the field).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OptionsDoc {
    #[serde(default)]
    backend: Option<String>,
    #[serde(default = "default_state_dir")]
    state_dir: PathBuf,
    #[serde(default)]
    supervise: Option<PathBuf>,
    #[serde(default)]
    workspaces: Option<serde_json::Value>,
}

/// Where the shim looks for its options when containerd names none.
pub const DEFAULT_CONFIG: &str = "/etc/turnstile/shim.json";

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/turnstile")
}

impl Default for Options {
    fn default() -> Self {
        Self {
            backend: None,
            state_dir: default_state_dir(),
            supervise: None,
            workspaces: Workspaces::default(),
        }
    }
}

impl Options {
    /// Parses the options file's text; the field at fault is named.
    pub fn parse(text: &str, source: &Path) -> Result<Self, ShimError> {
        let invalid = |reason: String| ShimError::Options {
            path: source.to_path_buf(),
            reason,
        };
        let doc: OptionsDoc = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let backend = doc
            .backend
            .as_deref()
            .map(str::parse::<Backend>)
            .transpose()
            .map_err(invalid)?;
        if !doc.state_dir.is_absolute() {
            return Err(invalid("state_dir must be an absolute path".into()));
        }
        let workspaces = match &doc.workspaces {
            None => Workspaces::default(),
            Some(v) => Workspaces::from_value(v).map_err(|e| ShimError::OptionsField {
                path: source.to_path_buf(),
                field: e.field,
                reason: e.reason,
            })?,
        };
        Ok(Self {
            backend,
            state_dir: doc.state_dir,
            supervise: doc.supervise,
            workspaces,
        })
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
    /// The name the container gave (`io.turnstile.workspace`).
    pub workspace_name: WorkspaceName,
    /// Its host root, from the shim's `workspaces`.
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
    /// The namespace the workspace was resolved for (the pod's Kubernetes
    /// namespace on the CRI path, else the containerd namespace): the
    /// tenant a session it starts belongs to (`supervise run --tenant`).
    pub tenant: String,
    /// The container's cgroup (the pod's, `linux.cgroupsPath`) the turn's
    /// is made under (`supervise run --cgroup-parent`).
    pub cgroup_parent: Option<String>,
}

/// A container's contract as its spec states it, before anything is
/// mounted or resolved: the workspace is still a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub workspace: WorkspaceName,
    pub package: String,
    pub session: Option<String>,
    pub outputs: Vec<Output>,
    pub work_order: Option<String>,
    process: Process,
    root: String,
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
    #[serde(default)]
    pub linux: Option<Linux>,
}

/// The part of `linux` the shim honours: where the container's cgroup is
/// (the pod's, on the CRI path) and its resources.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Linux {
    #[serde(default, rename = "cgroupsPath")]
    pub cgroups_path: Option<String>,
    #[serde(default)]
    pub resources: Option<Resources>,
}

/// `linux.resources`: the container's limits (the pod's on the CRI path).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Resources {
    #[serde(default)]
    pub memory: Option<MemoryResources>,
    #[serde(default)]
    pub cpu: Option<CpuResources>,
    #[serde(default)]
    pub pids: Option<PidsResources>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MemoryResources {
    #[serde(default)]
    pub limit: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct CpuResources {
    #[serde(default)]
    pub quota: Option<i64>,
    #[serde(default)]
    pub period: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PidsResources {
    #[serde(default)]
    pub limit: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
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
        // Never a valid value, and never passed on as an argument.
        Some(v) if v.contains('\0') => Err(ShimError::Annotation {
            key,
            reason: "holds a NUL byte".into(),
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

/// Refuses any `io.turnstile.*` annotation that is not one of
/// [`KNOWN_ANNOTATIONS`] (TS1047): every container, the pod sandbox too.
pub fn refuse_unknown_annotations(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<(), ShimError> {
    match annotations
        .keys()
        .find(|k| k.starts_with(ANNOTATION_PREFIX) && !KNOWN_ANNOTATIONS.contains(&k.as_str()))
    {
        Some(key) => Err(ShimError::UnknownAnnotation {
            key: key.clone(),
            known: KNOWN_ANNOTATIONS.join(", "),
        }),
        None => Ok(()),
    }
}

/// The request a container's spec makes. Refused, naming the field: an
/// unknown `io.turnstile.*` key (TS1047), a workspace that is not a name
/// (TS1043), a missing workspace or package, absent outputs (FR-RT-013:
/// `[]` is the explicit "writes nothing"), malformed outputs, no process
/// args, a terminal. Pure: nothing is read or created.
pub fn request_from_spec(spec: &Spec) -> Result<Request, ShimError> {
    refuse_unknown_annotations(&spec.annotations)?;
    let workspace = match spec.annotations.get(WORKSPACE) {
        None => {
            return Err(ShimError::Annotation {
                key: WORKSPACE,
                reason: "is required: the name of one of the shim's `workspaces`".into(),
            });
        }
        Some(v) => {
            WorkspaceName::try_from(v.as_str()).map_err(|reason| ShimError::WorkspaceName {
                value: v.clone(),
                reason,
            })?
        }
    };
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
    if let Some(o) = outputs.iter().find(|o| {
        o.path.is_empty()
            || o.role.is_empty()
            || o.role.contains(':')
            || o.path.contains('\0')
            || o.role.contains('\0')
    }) {
        return Err(ShimError::Annotation {
            key: OUTPUTS,
            reason: format!(
                "output {{path: `{}`, role: `{}`}}: path and role must be non-empty and hold no NUL byte, the role without ':'",
                o.path.escape_debug(),
                o.role.escape_debug()
            ),
        });
    }
    let work_order = annotation(spec, WORK_ORDER)?.map(str::to_owned);
    // Checked at Create as `supervise run` would at Start: a value it
    // refuses (or one that reads as a flag) never gets that far.
    if let Some(w) = &work_order {
        turnstile_policy::request::validate_work_order(w).map_err(|e| ShimError::Annotation {
            key: WORK_ORDER,
            reason: e.to_string(),
        })?;
    }
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
    let root = spec
        .root
        .as_ref()
        .map_or_else(|| "rootfs".to_owned(), |r| r.path.clone());
    Ok(Request {
        workspace,
        package,
        session,
        outputs,
        work_order,
        process,
        root,
    })
}

impl Request {
    /// The turn, once the workspace name is resolved to `workspace` and
    /// the image is mounted: `bundle` is where the rootfs is when
    /// `root.path` is relative; `argv[0]` is resolved in the image.
    pub fn into_turn(self, workspace: PathBuf, bundle: &Path, tenant: &str) -> Turn {
        let rootfs = if Path::new(&self.root).is_absolute() {
            PathBuf::from(&self.root)
        } else {
            bundle.join(&self.root)
        };
        let mut argv = self.process.args;
        if let Some(first) = argv.first_mut() {
            *first = resolve_program(first, &self.process.env, &rootfs, &workspace);
        }
        Turn {
            workspace_name: self.workspace,
            workspace,
            package: self.package,
            session: self.session,
            outputs: self.outputs,
            work_order: self.work_order,
            argv,
            rootfs,
            tenant: tenant.to_owned(),
            cgroup_parent: None,
        }
    }
}

/// `argv[0]` without a `/` is looked up in the image's `PATH` (the
/// container's env, else the usual default), as a container runtime would;
/// the first directory of the image holding that name wins. Anything else
/// is left to `supervise` (absolute: a path in the image; relative with a
/// `/`: relative to the workspace root).
/// A bare `program` found on the container's `PATH` as the turn will see
/// it: inside the image, every link resolved there (never on the host, as
/// `rootfs.join(..)` did: a pod's `PATH=/../../etc` then learnt which host
/// files exist — red-team, stop 55), the workspace at its own path. A
/// `PATH` entry that is not absolute or holds `.`/`..` is skipped.
fn resolve_program(program: &str, env: &[String], rootfs: &Path, workspace: &Path) -> String {
    use turnstile_policy::plan::FsView as _;
    if program.contains('/') {
        return program.to_owned();
    }
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    let view =
        turnstile_supervisor::turn::realfs::RootedFs::new(rootfs, &workspace.to_string_lossy());
    path.split(':')
        .filter(|d| d.starts_with('/') && !d.split('/').any(|s| s == "." || s == ".."))
        .map(|d| format!("{}/{program}", d.trim_end_matches('/')))
        .find(|p| view.kind(p).is_some())
        .unwrap_or_else(|| program.to_owned())
}

impl Turn {
    /// `supervise`'s message as the pod may read it: the workspace's host
    /// root is shown as the name the pod gave it (a pod learns no host
    /// path of the node through a refusal).
    pub fn redact(&self, message: &str) -> String {
        let root = self.workspace.to_string_lossy();
        if root.is_empty() || root == "/" {
            return message.to_owned();
        }
        message.replace(
            root.as_ref(),
            &format!("<workspace {}>", self.workspace_name),
        )
    }

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

    /// `supervise recover --root R --state-dir S`: its session's recovery
    /// (the caller adds `--session`), after a `supervise run` that died.
    pub fn recover_args(&self, options: &Options) -> Vec<String> {
        vec![
            "recover".to_owned(),
            "--root".to_owned(),
            self.workspace.display().to_string(),
            "--state-dir".to_owned(),
            options.state_dir.display().to_string(),
        ]
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
        let mut a = vec!["run".to_owned()];
        // No backend configured: `supervise` chooses by the package's
        // trust level (and refuses an explicit one that is too weak).
        if let Some(b) = options.backend {
            a.extend(["--backend".to_owned(), b.to_string()]);
        }
        a.extend(["--events".to_owned(), events.display().to_string()]);
        // A session belongs to the tenant (and package) that started it;
        // another pod's turns are refused (TS1041).
        a.extend(["--tenant".to_owned(), self.tenant.clone()]);
        if let Some(p) = &self.cgroup_parent {
            a.extend(["--cgroup-parent".to_owned(), p.clone()]);
        }
        // The container's log is whole (the kubelet keeps and rotates it).
        a.push("--forward-all-output".to_owned());
        a.extend(self.common(options));
        if let Some(w) = &self.work_order {
            a.extend(["--work-order".to_owned(), w.clone()]);
        }
        a.push("--".to_owned());
        a.extend(self.argv.iter().cloned());
        a
    }
}

/// What `supervise check --json` prints, the part the shim reads: the
/// violations of a refused turn (exit 11).
#[derive(Debug, Clone, Deserialize)]
pub struct CheckReport {
    pub violations: Vec<CheckViolation>,
}

/// One violation: its `details` sentence (the rest is kept to quote it
/// whole when there is none).
#[derive(Debug, Clone, Deserialize)]
pub struct CheckViolation {
    #[serde(default)]
    pub details: Option<String>,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

impl CheckReport {
    /// The violations as one line (`; ` between them), or `None` when
    /// `stdout` is not a check report.
    pub fn summary_of(stdout: &[u8]) -> Option<String> {
        let report: CheckReport = serde_json::from_slice(stdout).ok()?;
        Some(
            report
                .violations
                .into_iter()
                .map(|v| {
                    v.details
                        .unwrap_or_else(|| serde_json::Value::Object(v.rest).to_string())
                })
                .collect::<Vec<_>>()
                .join("; "),
        )
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
            linux: None,
        }
    }

    const BASE: [(&str, &str); 2] = [(WORKSPACE, "ws"), (PACKAGE, "bb")];

    fn turn(ann: &[(&str, &str)], args: &[&str]) -> Result<Turn, ShimError> {
        Ok(request_from_spec(&spec(ann, args))?.into_turn(
            PathBuf::from("/ws"),
            Path::new("/b"),
            "team-a",
        ))
    }

    #[test]
    fn a_refusal_shows_the_pod_its_workspace_name_not_the_host_path() {
        let mut t = turn(
            &[(WORKSPACE, "ws"), (PACKAGE, "bb"), (OUTPUTS, "[]")],
            &["/bin/sh"],
        )
        .unwrap();
        t.workspace = PathBuf::from("/srv/tenants/a");
        let shown = t.redact(
            "error[TS1001 PACKAGE_NOT_FOUND]: package `nope` not found: no manifest at /srv/tenants/a/installed/nope/manifest.json",
        );
        assert!(!shown.contains("/srv/tenants"), "{shown}");
        assert!(
            shown.contains("<workspace ws>/installed/nope/manifest.json"),
            "{shown}"
        );
    }

    #[test]
    fn fr_rt_013_absent_outputs_are_refused_naming_the_annotation() {
        let e = turn(&BASE, &["/bin/sh"]).unwrap_err();
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
                vec![(WORKSPACE, "ws"), (OUTPUTS, "[]")],
                vec!["/bin/sh"],
                PACKAGE,
            ),
            (
                vec![(WORKSPACE, "ws"), (PACKAGE, "bb"), (OUTPUTS, "{}")],
                vec!["/bin/sh"],
                OUTPUTS,
            ),
            (
                vec![
                    (WORKSPACE, "ws"),
                    (PACKAGE, "bb"),
                    (OUTPUTS, r#"[{"path":"a"}]"#),
                ],
                vec!["/bin/sh"],
                OUTPUTS,
            ),
            (
                vec![(WORKSPACE, "ws"), (PACKAGE, "bb"), (OUTPUTS, "[]")],
                vec![],
                "process.args",
            ),
            // Red-team (wave 3): refused at Create, naming the annotation,
            // not when `supervise run` reads them at Start.
            (
                vec![
                    (WORKSPACE, "ws"),
                    (PACKAGE, "bb"),
                    (OUTPUTS, r#"[{"path":"a\u0000b","role":"r"}]"#),
                ],
                vec!["/bin/sh"],
                OUTPUTS,
            ),
            (
                vec![
                    (WORKSPACE, "ws"),
                    (PACKAGE, "bb"),
                    (OUTPUTS, "[]"),
                    (WORK_ORDER, "--backend=native"),
                ],
                vec!["/bin/sh"],
                WORK_ORDER,
            ),
            (
                vec![
                    (WORKSPACE, "ws"),
                    (PACKAGE, "bb"),
                    (OUTPUTS, "[]"),
                    (WORK_ORDER, "WO-1\nx"),
                ],
                vec!["/bin/sh"],
                WORK_ORDER,
            ),
        ] {
            let e = turn(&ann, &args).unwrap_err();
            assert!(e.to_string().contains(field), "{field}: {e}");
            if field != "process.args" {
                assert_eq!(e.code(), "TS1201", "{field}: {e}");
            }
        }
    }

    #[test]
    fn issue_25_a_workspace_path_or_non_name_is_refused_at_the_contract() {
        for (value, why) in [
            ("/etc", "a path"),
            ("/srv/agents/other-tenant", "a path"),
            ("team/../b", "a path"),
            ("..", "`..`"),
            ("", "empty"),
            ("ws name", "contains"),
        ] {
            let ann = [(WORKSPACE, value), (PACKAGE, "bb"), (OUTPUTS, "[]")];
            let e = turn(&ann, &["/bin/true"]).unwrap_err();
            assert_eq!(e.code(), "TS1043", "{value:?}: {e}");
            let t = e.to_string();
            assert!(t.contains(WORKSPACE) && t.contains(why), "{value:?}: {t}");
        }
    }

    #[test]
    fn issue_25_unknown_io_turnstile_keys_are_refused_others_are_not_ours() {
        let mut ann = BASE.to_vec();
        ann.extend([(OUTPUTS, "[]"), ("io.turnstile.foo", "1")]);
        let e = turn(&ann, &["/bin/true"]).unwrap_err();
        assert_eq!(e.code(), "TS1047");
        assert!(e.to_string().contains("io.turnstile.foo"), "{e}");
        assert!(e.to_string().contains(WORKSPACE), "lists the known: {e}");
        // A near miss of a known key is unknown too.
        let mut ann = BASE.to_vec();
        ann.extend([(OUTPUTS, "[]"), ("io.turnstile.output", "[]")]);
        assert_eq!(turn(&ann, &["/bin/true"]).unwrap_err().code(), "TS1047");
        // Other prefixes are not the contract's business.
        let mut ann = BASE.to_vec();
        ann.extend([
            (OUTPUTS, "[]"),
            ("io.turnstilex", "1"),
            ("org.example.x", "1"),
        ]);
        assert!(turn(&ann, &["/bin/true"]).is_ok());
        for key in KNOWN_ANNOTATIONS {
            assert!(key.starts_with(ANNOTATION_PREFIX), "{key}");
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
        let t = turn(&ann, &["/bin/sh", "-c", "x"]).unwrap();
        assert_eq!(t.workspace_name.to_string(), "ws");
        let o = Options {
            backend: Some(Backend::Runc),
            ..Options::default()
        };
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
                "--tenant",
                "team-a",
                "--forward-all-output",
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
        let t = turn(&ann, &["/bin/true"]).unwrap();
        assert!(t.check_args(&o).contains(&"--no-outputs".to_owned()));
    }

    #[test]
    fn issue_25_without_a_configured_backend_run_passes_none() {
        let mut ann = BASE.to_vec();
        ann.push((OUTPUTS, "[]"));
        let t = turn(&ann, &["/bin/true"]).unwrap();
        let args = t.run_args(&Options::default(), Path::new("/b/e.jsonl"));
        assert!(!args.iter().any(|a| a == "--backend"), "{args:?}");
        assert_eq!(args[..3], ["run", "--events", "/b/e.jsonl"]);
        let o = Options {
            backend: Some(Backend::Crun),
            ..Options::default()
        };
        assert_eq!(
            t.run_args(&o, Path::new("/e"))[..3],
            ["run", "--backend", "crun"]
        );
        // `check` never names a backend (it only admits).
        assert!(!t.check_args(&o).iter().any(|a| a == "--backend"));
    }

    #[test]
    fn a_bare_program_name_is_found_on_the_images_path() {
        let image = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(image.path().join("bin")).unwrap();
        std::fs::write(image.path().join("bin/busybox"), b"").unwrap();
        std::os::unix::fs::symlink("busybox", image.path().join("bin/sh")).unwrap();
        let env = vec!["PATH=/usr/bin:/bin".to_owned()];
        let ws = Path::new("/srv/ws");
        assert_eq!(resolve_program("sh", &env, image.path(), ws), "/bin/sh");
        assert_eq!(resolve_program("nope", &env, image.path(), ws), "nope");
        assert_eq!(resolve_program("/x/y", &env, image.path(), ws), "/x/y");
        // Never looked up on the host: not through `..`, not through an
        // absolute link of the image (red-team, stop 55).
        let up = vec!["PATH=/../../../../etc:/bin/../../etc".to_owned()];
        assert_eq!(resolve_program("passwd", &up, image.path(), ws), "passwd");
        std::os::unix::fs::symlink("/etc", image.path().join("hostetc")).unwrap();
        let link = vec!["PATH=/hostetc".to_owned()];
        assert_eq!(resolve_program("passwd", &link, image.path(), ws), "passwd");
    }

    #[test]
    fn options_parse_with_defaults_and_refuse_unknown_fields() {
        let p = Path::new("/etc/turnstile/shim.json");
        assert_eq!(Options::parse("{}", p).unwrap(), Options::default());
        let o = Options::parse(r#"{"backend":"crun","state_dir":"/s"}"#, p).unwrap();
        assert_eq!(
            (o.backend, o.state_dir.as_path()),
            (Some(Backend::Crun), Path::new("/s"))
        );
        for bad in [
            r#"{"backend":"docker"}"#,
            r#"{"backend":7}"#,
            r#"{"state_dir":"rel"}"#,
            r#"{"x":1}"#,
        ] {
            let e = Options::parse(bad, p).unwrap_err();
            assert_eq!(e.code(), "TS1203", "{bad}: {e}");
        }
    }

    #[test]
    fn issue_25_backend_has_no_default() {
        let p = Path::new("/s.json");
        assert_eq!(Options::default().backend, None);
        assert_eq!(
            Options::parse(r#"{"state_dir":"/s"}"#, p).unwrap().backend,
            None
        );
        for b in Backend::ALL {
            let o = Options::parse(&format!(r#"{{"backend":"{b}"}}"#), p).unwrap();
            assert_eq!(o.backend, Some(b));
        }
    }

    #[test]
    fn issue_25_options_workspaces_errors_name_the_field_and_code() {
        let p = Path::new("/s.json");
        for (text, field) in [
            (r#"{"workspaces":["a"]}"#, "`workspaces`"),
            (r#"{"workspaces":{"a":{}}}"#, "`workspaces.a.root`"),
            (
                r#"{"workspaces":{"a":{"root":"/x","namespaces":[1]}}}"#,
                "`workspaces.a.namespaces[0]`",
            ),
            (
                r#"{"workspaces":{"a":{"root":"/x","namespaces":{"x":1}}}}"#,
                "`workspaces.a.namespaces`",
            ),
        ] {
            let e = Options::parse(text, p).unwrap_err();
            assert_eq!(e.code(), "TS1048", "{text}: {e}");
            assert!(e.to_string().contains(field), "{text}: {e}");
        }
        let o = Options::parse(
            r#"{"workspaces":{"a":{"root":"/srv/a","namespaces":["n"]}}}"#,
            p,
        )
        .unwrap();
        let a = WorkspaceName::try_from("a").unwrap();
        assert_eq!(o.workspaces.get(&a).unwrap().root, Path::new("/srv/a"));
    }

    #[test]
    fn issue_25_the_example_pod_uses_a_workspace_the_example_shim_config_maps() {
        let options = Options::parse(
            include_str!("../../examples/kubernetes/shim.json"),
            Path::new("examples/kubernetes/shim.json"),
        )
        .unwrap();
        assert_eq!(
            options.backend, None,
            "the example lets trust levels choose"
        );
        let pod = include_str!("../../examples/kubernetes/runtimeclass.yaml");
        let value = |key: &str| {
            pod.lines()
                .find_map(|l| l.trim().strip_prefix(key))
                .map(str::trim)
                .unwrap_or_else(|| panic!("no `{key}` in the example pod"))
        };
        let name = WorkspaceName::try_from(value("io.turnstile.workspace:")).unwrap();
        let entry = options.workspaces.get(&name).expect("mapped");
        let namespace = value("namespace:");
        assert!(
            entry
                .namespaces
                .as_ref()
                .is_some_and(|n| n.iter().any(|x| x == namespace)),
            "{entry:?} is not for namespace {namespace}"
        );
    }

    #[test]
    fn issue_24_check_report_violations_are_summarised() {
        let out = br#"{"decision":"refused","violations":[{"details":"execute /bin/ls"},{"kind":"read"}]}"#;
        assert_eq!(
            CheckReport::summary_of(out).as_deref(),
            Some(r#"execute /bin/ls; {"kind":"read"}"#)
        );
        assert_eq!(CheckReport::summary_of(b"{}"), None);
        assert_eq!(CheckReport::summary_of(b"not json"), None);
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
