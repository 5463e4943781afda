//! A turn's [`Plan`] as an OCI runtime-spec bundle: `config.json` plus the
//! rootfs skeleton and the files the supervisor generates.
//!
//! The Plan's view maps onto the spec as follows:
//! - read-only paths: non-recursive `bind` mounts `ro,nosuid,nodev` at the
//!   same path (the workspace keeps its host path);
//! - symlinks and empty directories (the workspace root shown only through
//!   its grants): the rootfs skeleton, which is read-only;
//! - generated files (`/etc/hosts`, `/etc/hostname`): files in the bundle,
//!   bound read-only;
//! - `/dev`: tmpfs with the runtime's default devices, a private devpts,
//!   `/dev/shm` and the IPC namespace's `/dev/mqueue`; `/tmp`, `/var/tmp`
//!   ephemeral tmpfs; `/proc` with the Plan's masked and read-only paths as
//!   `linux.maskedPaths`/`readonlyPaths`;
//! - writable scopes: read-write binds of the overlay merged directories the
//!   backend prepares (`scope_source`), so writes are captured from an
//!   overlay upper exactly as natively;
//! - masks (forbidden paths, the ledgers): explicit read-only binds — an
//!   empty mode-0000 directory over a directory, an empty mode-0000 file over a file
//!   (not `linux.maskedPaths`, which runc and crun fill differently).
//!
//! The process runs as 65534 with no capability in any set and
//! no_new_privs. Landlock is not in the OCI spec: with an
//! [`InitBinary`], the process is turnstile's small init (bound read-only),
//! which applies the Plan's Landlock rules and execs the command.
//!
//! The JSON is round-tripped through `oci_spec::runtime::Spec` (the typed
//! model: anything it cannot parse is an error); `vm.hwConfig` (runtime-spec
//! 1.3), which oci-spec does not model, is added from [`crate::vm`].

use serde_json::{Map, Value, json};
use turnstile_policy::plan::{Mount, Plan};

use crate::error::OciError;
use crate::vm::{VmConfig, VmKernel};

/// Where the container finds turnstile's init and its Landlock rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitBinary {
    /// Host path of the `supervise` binary (bound read-only).
    pub host_path: String,
    /// The init's build id as the supervisor knows it (`--init-build`).
    pub build: String,
    /// How the init reports to the supervisor.
    pub report: InitReport,
    /// The host's dynamic loader (its path), whose directory also holds the
    /// init's shared libraries. Used when the system view is an image
    /// rootfs (`Plan::system_root`), which may have no (or another) libc:
    /// the directory is bound read-only at [`INIT_LIB_DIR`] and the init is
    /// started through that loader. Landlock, applied by the init, grants
    /// the command nothing there.
    pub host_loader: Option<String>,
}

/// How turnstile's init in the container reports and waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitReport {
    /// Reports on fd 3 and waits for the go on fd 4 (the supervisor checks
    /// the posture from outside first): runc, crun (`--preserve-fds 2`).
    Handshake,
    /// Checks its own posture, reports as the first line of stderr, and
    /// execs without waiting (a runtime that cannot pass descriptors and
    /// whose processes the host cannot inspect: runsc). `allow_unenforced`:
    /// the manifest's `allow_degraded` lists Landlock, so a kernel that
    /// enforces none of its rules does not stop the turn.
    Stderr { allow_unenforced: bool },
}

/// argv flags of `__landlock-exec` for [`InitReport::Stderr`].
pub const REPORT_STDERR_FLAG: &str = "--report-stderr";
pub const ALLOW_UNENFORCED_FLAG: &str = "--allow-unenforced";
/// argv flag of `__landlock-exec`, `--init-build=ID`: the build id of the
/// init the supervisor expects ([`InitBinary::build`]); an init built from
/// other sources refuses to run.
pub const INIT_BUILD_FLAG: &str = "--init-build";
/// The first bytes of the init's stderr report line.
pub const REPORT_PREFIX: &str = "\u{1}turnstile-init ";

/// The bundle file every masked file is bound from: empty, mode 0000
/// (a read by the turn's uid fails EACCES, as natively).
pub const MASK_FILE: &str = "generated/masked";

/// The bundle directory every masked directory is bound from: empty, mode
/// 0000 (listing it fails EACCES, as natively).
pub const MASK_DIR: &str = "generated/masked.d";

/// Container paths of the init and its rules file.
pub const INIT_PATH: &str = "/.turnstile/init";
pub const LANDLOCK_RULES_PATH: &str = "/.turnstile/landlock.json";
/// Container path of the host libraries the init needs over an image rootfs.
pub const INIT_LIB_DIR: &str = "/.turnstile/lib";
/// argv[1] of the init mode that applies Landlock rules and execs.
pub const LANDLOCK_EXEC: &str = "__landlock-exec";

/// What the bundle needs besides the Plan.
#[derive(Debug, Clone)]
pub struct BundleOptions {
    /// Absolute path of the bundle directory (generated files live there).
    pub bundle_dir: String,
    /// The runtime the bundle is for (an annotation; `kata` adds `vm`).
    pub backend: String,
    /// Host paths of the writable scopes' overlay merged dirs, in the
    /// Plan's scope order.
    pub scope_sources: Vec<String>,
    /// Declared outputs (path, role), for the annotations.
    pub declared_outputs: Vec<(String, String)>,
    /// turnstile's init, which applies Landlock (None: no Landlock).
    pub init: Option<InitBinary>,
    /// For VM runtimes: the guest kernel.
    pub vm_kernel: Option<VmKernel>,
    /// `SCMP_ARCH_X86_64`, `SCMP_ARCH_AARCH64`.
    pub seccomp_arch: String,
    /// Read-only paths of the Plan that are directories: shown as read-only
    /// overlays (a host process's unix socket inside is not connectable
    /// through overlayfs), like the native backend; the rest are binds.
    pub read_only_dirs: Vec<String>,
    /// An empty directory: the second lower layer of read-only overlays
    /// (required with `read_only_dirs`).
    pub empty_dir: Option<String>,
    /// Where the workspace's files are taken from: an idmapped clone of the
    /// root prepared by the backend (its owner appears as the turn's uid),
    /// or `None` for the root itself.
    pub workspace_source: Option<String>,
}

/// The bundle, as data: the supervisor writes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Bundle {
    pub config: Value,
    /// Directories to create in `rootfs/` (mount points and the skeleton).
    pub rootfs_dirs: Vec<String>,
    /// Symlinks to create in `rootfs/` (path, target).
    pub rootfs_symlinks: Vec<(String, String)>,
    /// Files to write in the bundle dir (name relative to it, contents).
    pub generated: Vec<(String, String)>,
}

fn bind(destination: &str, source: &str, rw: bool) -> Value {
    let mode = if rw { "rw" } else { "ro" };
    json!({"destination": destination, "type": "bind", "source": source,
        "options": ["bind", mode, "nosuid", "nodev"]})
}

fn tmpfs(destination: &str, options: &[&str]) -> Value {
    json!({"destination": destination, "type": "tmpfs", "source": "tmpfs", "options": options})
}

/// Builds the bundle of `plan`.
pub fn build(plan: &Plan, o: &BundleOptions) -> Result<Bundle, OciError> {
    let mut mounts: Vec<Value> = Vec::new();
    let mut masked: Vec<String> = Vec::new();
    let mut read_only: Vec<String> = Vec::new();
    let mut dirs: Vec<String> = Vec::new();
    let mut symlinks = Vec::new();
    let mut generated = Vec::new();
    let gen_path = |name: &str| format!("{}/{name}", o.bundle_dir.trim_end_matches('/'));
    // Host path of what the container sees at `path`: the workspace's
    // files from its (idmapped) source, the rest from the host's `/` or the
    // image rootfs (`Plan::system_root`).
    let in_root = |path: &str| {
        path.strip_prefix(plan.root.as_str())
            .is_some_and(|rel| rel.is_empty() || rel.starts_with('/'))
    };
    let source = |path: &str| -> String {
        match (&o.workspace_source, path.strip_prefix(plan.root.as_str())) {
            (Some(src), Some(rel)) if rel.is_empty() || rel.starts_with('/') => {
                format!("{src}{rel}")
            }
            _ => match &plan.system_root {
                Some(system) if !in_root(path) => {
                    format!("{}{path}", system.trim_end_matches('/'))
                }
                _ => path.to_owned(),
            },
        }
    };
    for (n, m) in plan.mounts.iter().enumerate() {
        match m {
            Mount::ReadOnly { path } => match (&o.empty_dir, o.read_only_dirs.contains(path)) {
                (Some(empty), true) => mounts.push(json!({
                    "destination": path, "type": "overlay", "source": "overlay",
                    "options": ["ro", "nosuid", "nodev", format!("lowerdir={}:{empty}", source(path)), "xino=on"],
                })),
                _ => mounts.push(bind(path, &source(path), false)),
            },
            Mount::SystemReadOnly { path } => mounts.push(bind(path, &source(path), false)),
            Mount::Symlink { path, target } => symlinks.push((path.clone(), target.clone())),
            Mount::Dir { path } => dirs.push(path.clone()),
            Mount::Generated { path, contents } => {
                let name = format!("generated/{n}");
                generated.push((name.clone(), contents.clone()));
                mounts.push(bind(path, &gen_path(&name), false));
            }
            Mount::Dev { shm_bytes } => {
                mounts.push(tmpfs(
                    "/dev",
                    &["nosuid", "strictatime", "mode=755", "size=65536k"],
                ));
                mounts.push(
                    json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                    "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
                );
                let size = format!("size={shm_bytes}");
                mounts.push(tmpfs(
                    "/dev/shm",
                    &["nosuid", "noexec", "nodev", "mode=1777", &size],
                ));
                // The container's IPC namespace's message queues, as
                // natively (and as runc's default spec has them): the
                // Plan's Landlock rule on it lets mq_open work.
                mounts.push(
                    json!({"destination": turnstile_policy::plan::DEV_MQUEUE, "type": "mqueue", "source": "mqueue",
                    "options": ["nosuid", "noexec", "nodev"]}),
                );
            }
            Mount::Ephemeral { path, bytes } => {
                let size = format!("size={bytes}");
                mounts.push(tmpfs(path, &["nosuid", "nodev", "mode=1777", &size]));
            }
            Mount::Proc {
                masked: m,
                read_only: r,
            } => {
                mounts.push(
                    json!({"destination": "/proc", "type": "proc", "source": "proc",
                    "options": ["nosuid", "noexec", "nodev"]}),
                );
                masked.extend(m.iter().cloned());
                read_only.extend(r.iter().cloned());
            }
            Mount::Overlay { path, index } => {
                let source =
                    o.scope_sources
                        .get(*index)
                        .ok_or_else(|| OciError::Unrepresentable {
                            field: format!("mounts[{n}]"),
                            reason: format!(
                                "no prepared overlay for writable scope {index} ({path})"
                            ),
                        })?;
                mounts.push(bind(path, source, true));
            }
            // Explicit mounts, never `maskedPaths`: gVisor honours
            // maskedPaths under /proc alone (measured: a forbidden directory
            // stayed readable under runsc), and runc and crun apply
            // maskedPaths after the mounts, putting a world-listable empty
            // tmpfs (mode 1777) over a directory and /dev/null over a file —
            // not the native view, where a forbidden path is mode 0000 and
            // every access is EACCES (issue 22: one view on every backend).
            // A bind of an empty mode-0000 directory, not a tmpfs with
            // `mode=000`: runc chmods a tmpfs to its mount point's mode.
            Mount::MaskDir { path, .. } => {
                mounts.push(bind(path, &gen_path(MASK_DIR), false));
            }
            Mount::MaskFile { path, .. } => {
                mounts.push(bind(path, &gen_path(MASK_FILE), false));
            }
        }
    }
    let mut args: Vec<String> = Vec::new();
    if let Some(init) = &o.init {
        mounts.push(bind(INIT_PATH, &init.host_path, false));
        let rules = serde_json::to_string(&plan.landlock).map_err(OciError::Json)?;
        generated.push(("generated/landlock.json".into(), rules));
        mounts.push(bind(
            LANDLOCK_RULES_PATH,
            &gen_path("generated/landlock.json"),
            false,
        ));
        if let (Some(_), Some(loader)) = (&plan.system_root, &init.host_loader) {
            let (dir, name) = loader.rsplit_once('/').unwrap_or(("", loader.as_str()));
            if dir.is_empty() || name.is_empty() {
                return Err(OciError::Unrepresentable {
                    field: "init.host_loader".into(),
                    reason: format!("`{loader}` is not an absolute file path"),
                });
            }
            mounts.push(bind(INIT_LIB_DIR, dir, false));
            args.extend([
                format!("{INIT_LIB_DIR}/{name}"),
                "--library-path".to_owned(),
                INIT_LIB_DIR.to_owned(),
            ]);
        }
        args.extend([
            INIT_PATH.to_owned(),
            LANDLOCK_EXEC.to_owned(),
            LANDLOCK_RULES_PATH.to_owned(),
            format!("{INIT_BUILD_FLAG}={}", init.build),
        ]);
        if let InitReport::Stderr { allow_unenforced } = init.report {
            args.push(REPORT_STDERR_FLAG.to_owned());
            if allow_unenforced {
                args.push(ALLOW_UNENFORCED_FLAG.to_owned());
            }
        }
        args.push("--".to_owned());
    }
    args.extend(plan.argv.iter().cloned());
    let env: Vec<String> = plan.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let none: Vec<String> = Vec::new();
    let namespaces: Vec<Value> = plan
        .namespaces
        .iter()
        .map(|n| json!({"type": if n == "net" { "network" } else { n.as_str() }}))
        .collect();
    let l = &plan.limits;
    let outputs: Vec<Value> = o
        .declared_outputs
        .iter()
        .map(|(p, r)| json!({"path": p, "role": r}))
        .collect();
    let mut annotations = Map::new();
    for (k, v) in [
        ("org.turnstile.package", plan.package_id.clone()),
        ("org.turnstile.session", plan.session_id.clone()),
        ("org.turnstile.turn", plan.turn_number.to_string()),
        ("org.turnstile.backend", o.backend.clone()),
        ("org.turnstile.outputs", Value::Array(outputs).to_string()),
        ("org.turnstile.network", plan.network.clone()),
    ] {
        annotations.insert(k.into(), Value::String(v));
    }
    let seccomp =
        crate::seccomp::linux_seccomp(&plan.seccomp, &o.seccomp_arch).map_err(|reason| {
            OciError::Unrepresentable {
                field: "seccomp".into(),
                reason,
            }
        })?;
    let mut config = json!({
        // The spec version the runtime implements: only VM runtimes need
        // 1.3 (vm.hwConfig); crun 1.8 refuses versions it does not know,
        // and nothing else emitted here is newer than 1.0.2.
        "ociVersion": if o.backend == "kata" { "1.3.0" } else { "1.0.2" },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": plan.hostname,
        "process": {
            "terminal": false,
            "user": {"uid": plan.uid, "gid": plan.gid, "additionalGids": []},
            "args": args,
            "env": env,
            "cwd": plan.cwd,
            "noNewPrivileges": true,
            "capabilities": {"bounding": none, "effective": none, "permitted": none, "inheritable": none, "ambient": none},
        },
        "annotations": annotations,
        "linux": {
            "namespaces": namespaces,
            "resources": {
                "memory": {"limit": l.memory_bytes, "swap": l.memory_bytes},
                "cpu": {"quota": l.cpu_millis * 100, "period": 100_000u64},
                "pids": {"limit": l.pids},
            },
            "maskedPaths": masked,
            "readonlyPaths": read_only,
        },
    });
    // The two large parts moved in, not copied value by value by `json!`.
    config["mounts"] = Value::Array(mounts);
    config["linux"]["seccomp"] = seccomp;
    // The typed model first: what oci-spec cannot parse is not a bundle.
    let spec: oci_spec::runtime::Spec = serde_json::from_value(config).map_err(OciError::Json)?;
    let mut config = serde_json::to_value(&spec).map_err(OciError::Json)?;
    if o.backend == "kata" {
        let kernel = o
            .vm_kernel
            .clone()
            .ok_or_else(|| OciError::Unrepresentable {
                field: "vm.kernel".into(),
                reason: "a VM runtime needs a guest kernel".into(),
            })?;
        let vm = VmConfig::for_limits(kernel, &plan.limits);
        config["vm"] = serde_json::to_value(vm).map_err(OciError::Json)?;
    }
    // The skeleton: the runtime creates mount points itself (before the
    // rootfs turns read-only).
    dirs.sort();
    dirs.dedup();
    Ok(Bundle {
        config,
        rootfs_dirs: dirs,
        rootfs_symlinks: symlinks,
        generated,
    })
}
