//! The Plan: everything a backend must enforce for one turn, compiled from
//! the manifest and the request — backend-neutral and inspectable
//! (`supervise plan`).
//!
//! Compiling needs to look at the file system (which forbidden paths exist,
//! what an executable resolves to, which interpreter a script names). That
//! happens through the [`FsView`] seam so this crate stays pure and the
//! compiler is unit-tested on a fake tree.

use serde::{Deserialize, Serialize};

use crate::check::Allowed;
use crate::manifest::{Manifest, Network};
use crate::pattern::{PatternSet, Target};
use crate::request::BoundRequest;
use crate::seccomp::SeccompProfile;

/// The Landlock ABI this code is written for (pinned, never derived from the
/// running kernel: rights the kernel lacks are recorded as degradations).
pub const LANDLOCK_ABI: u32 = 6;

/// Unprivileged identity a turn runs as.
pub const NOBODY: u32 = 65534;

/// Most paths a single pattern may expand to when the compiler enumerates it.
pub const MAX_ENUMERATED: usize = 10_000;

pub use crate::fsview::{FileKind, FsView};

/// One step of the sandbox's mount plan, in order (a parent always before
/// what is mounted inside it). Paths are absolute paths as the sandbox sees
/// them (the workspace keeps its host path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Mount {
    /// A host path shown read-only at the same path (`nosuid,nodev`): a
    /// directory through a read-only overlay (a pathname unix socket of a
    /// host process is not connectable through overlayfs), a regular file by
    /// a bind mount of that very file. Paths under the workspace root come
    /// through the idmapped workspace (see [`Plan::workspace_owner`]). The
    /// source is resolved without following any symlink; anything but a
    /// directory or a regular file is refused.
    ReadOnly { path: String },
    /// A system path of the baseline (`/usr`, `/lib`, the /etc set) bound
    /// read-only at the same path (`nosuid,nodev`): root's system files,
    /// where no host process keeps a socket. Cheaper than an overlay.
    SystemReadOnly { path: String },
    /// Recreate a host symlink.
    Symlink { path: String, target: String },
    /// An empty directory owned by root: the workspace root when the grants
    /// do not show it whole (only what they name is mounted inside).
    Dir { path: String },
    /// A read-only file written by the supervisor (`/etc/hosts`,
    /// `/etc/hostname`).
    Generated { path: String, contents: String },
    /// A minimal `/dev`: null, zero, full, random, urandom, tty, the standard
    /// symlinks, a private devpts instance (`/dev/pts`, `/dev/ptmx`), a
    /// private size-limited `/dev/shm` and the turn's IPC namespace's
    /// mqueue at [`DEV_MQUEUE`].
    Dev { shm_bytes: u64 },
    /// A private writable tmpfs (mode 1777, `bytes` large) for programs that
    /// ignore TMPDIR (`tmpfile(3)` uses `/tmp`): what a turn leaves there is
    /// recorded in the evidence and discarded with the turn. Only where it
    /// does not contain the workspace (a Landlock grant on it would cover
    /// the workspace's view).
    Ephemeral { path: String, bytes: u64 },
    /// A fresh `/proc` for the turn's PID namespace, with the OCI default
    /// masked and read-only paths (and the host's kernel command line).
    Proc {
        masked: Vec<String>,
        read_only: Vec<String>,
    },
    /// A writable overlay over `path` (a directory under the workspace
    /// root): the host directory is the lower layer; every write lands in an
    /// upper dir the supervisor owns.
    Overlay { path: String, index: usize },
    /// Hide a directory under an empty read-only tmpfs.
    MaskDir { path: String, reason: String },
    /// Hide a file under an empty read-only file.
    MaskFile { path: String, reason: String },
}

/// Landlock rules, as absolute paths in the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockRules {
    pub abi: u32,
    /// List directories (only): `/`, so every directory of the view lists.
    /// The view holds only what the grants name; masked paths stay
    /// unreadable (mode 0000, root's).
    #[serde(default)]
    pub list: Vec<String>,
    /// Read files and list directories.
    pub read: Vec<String>,
    /// Read and write (create, remove, rename, truncate, make dirs).
    pub read_write: Vec<String>,
    /// Execute (plus read) — executables and their interpreters only.
    pub execute: Vec<String>,
    /// Device files (and `/proc`'s files) that may be read and written in
    /// place, with device ioctls, but nothing created: `/dev/pts/N`, `echo x
    /// > /proc/self/comm`, thread names.
    pub devices: Vec<String>,
}

impl LandlockRules {
    /// Whether `other` holds the same rules but, perhaps, its execute
    /// rules (which follow from a turn's command; the rest from the view).
    /// Every field is named, so a new one does not compile until sorted.
    pub fn same_but_execute(&self, other: &LandlockRules) -> bool {
        let LandlockRules {
            abi,
            list,
            read,
            read_write,
            execute: _,
            devices,
        } = self;
        *abi == other.abi
            && *list == other.list
            && *read == other.read
            && *read_write == other.read_write
            && *devices == other.devices
    }
}

/// Resource limits, in plain numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanLimits {
    pub memory_bytes: u64,
    pub cpu_millis: u64,
    pub pids: u32,
    pub timeout_seconds: u64,
    pub disk_bytes: u64,
    pub files: u64,
    pub output_bytes: u64,
}

/// Everything one turn gets.
/// The part of a [`Plan`] that is the turn's own and not its sandbox's
/// ([`Plan::shape`] is the Plan with this part empty): the command and
/// what follows from it alone. A warm sandbox is built from a shape; its
/// turn is sent this part (a few hundred bytes, not the ~11 KB Plan).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnPart {
    pub argv: Vec<String>,
    pub execute_entry: String,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    pub turn_number: u64,
    /// The Landlock execute rules (`landlock.execute`).
    pub execute: Vec<String>,
    pub timeout_seconds: u64,
    pub output_bytes: u64,
    pub stdin: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub session_id: String,
    pub turn_number: u64,
    pub package_id: String,
    pub root: String,
    /// The command, `argv[0]` resolved to an absolute path.
    pub argv: Vec<String>,
    /// The execute entry that admitted it.
    pub execute_entry: String,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    pub uid: u32,
    pub gid: u32,
    /// The workspace root's host owner. The turn sees the workspace through
    /// an idmapped mount mapping this uid/gid to [`Plan::uid`]/[`Plan::gid`]:
    /// it has the access the owner has (0700 roots, 0600 granted files),
    /// never host uid 0, and Landlock and the view narrow it to the grants.
    pub workspace_owner: (u32, u32),
    pub hostname: String,
    pub namespaces: Vec<String>,
    /// Host paths every process needs to start (listed so a user sees them).
    pub read_baseline: Vec<String>,
    pub mounts: Vec<Mount>,
    /// Writable scopes, relative to the root, in overlay index order.
    pub writable_scopes: Vec<String>,
    pub landlock: LandlockRules,
    pub seccomp: SeccompProfile,
    pub limits: PlanLimits,
    pub network: String,
    /// The manifest's `egress` entries as written (`restricted`,
    /// `allow_egress`); the supervisor enforces them by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<String>,
    /// Layers the manifest lets a backend or kernel lack
    /// (`allow_degraded`, e.g. `landlock`).
    #[serde(default)]
    pub allow_degraded: Vec<String>,
    /// Where the system view comes from: `None`, the host's `/`; `Some(dir)`,
    /// an image rootfs (`run --rootfs`, the containerd shim). Every path of
    /// the Plan outside the workspace root is then a path *in* that rootfs:
    /// the baseline, absolute grants, executables and their loaders are
    /// resolved there, and backends take those mounts' sources from it. The
    /// workspace keeps its host path either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_root: Option<String>,
    /// What the command reads on its standard input: `None`, an empty
    /// pipe; `Some(text)`, these bytes (an ARA `receive` turn: the input
    /// envelope's canonical JSON), from a memory file the sandbox's init
    /// writes before the command starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// `run --forward-all-output` (a container's log, which the kubelet
    /// keeps and rotates): the command's streams are forwarded whole, not
    /// cut at `limits.output_bytes`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forward_all_output: bool,
}

/// Why a plan could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("executable `{0}` does not exist or is not a regular file")]
    ExecutableMissing(String),
    #[error("pattern `{pattern}` matches more than {MAX_ENUMERATED} paths; narrow it")]
    TooManyMatches { pattern: String },
    #[error("writable scope `{0}` is not a directory under the workspace root")]
    BadScope(String),
    #[error(
        "pattern `{0}` would show the whole host file system to the turn; grant the directories it needs"
    )]
    HostRoot(String),
    #[error(
        "pattern `{pattern}` reaches `{path}`, a symbolic link to `{target}`: a rule there would grant the turn's whole view or workspace; grant the directories it needs instead"
    )]
    LinkWidens {
        pattern: String,
        path: String,
        target: String,
    },
    #[error(
        "the grants reach the session tree `{tree}`, where only Landlock keeps another owner's sessions (those there now and those made while the turn runs) out of a turn, and backend `{backend}` applies none: narrow the read and execute grants (not `**`, `output/**`, `tmp/**` or `planes/**`) or use native, runc or crun"
    )]
    OtherSessionsExposed { backend: String, tree: String },
}

/// Host paths shown read-only in every sandbox, when they exist. Symlinks
/// (merged /usr) are recreated as symlinks. The /etc set is what ordinary
/// programs read at start (loader, users and groups, name service, time
/// zone, service and protocol names, TLS roots, OS identity); `/etc/hosts`
/// and `/etc/hostname` are generated ([`HOSTNAME`]).
pub const READ_BASELINE: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    // glibc reads it at every setlocale (Debian links /usr/share/locale/locale.alias here).
    "/etc/locale.alias",
    "/etc/timezone",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/ethertypes",
    "/etc/mime.types",
    "/etc/shells",
    "/etc/os-release",
    "/etc/debian_version",
    "/etc/alternatives",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
];

/// Private writable tmpfs mounts for programs that ignore TMPDIR.
pub const EPHEMERAL: &[&str] = &["/tmp", "/var/tmp"];

/// The address of the supervisor's resolver inside a turn's network
/// namespace (`restricted`, `allow_egress`).
pub const RESOLVER: &str = "127.0.0.53";

/// The sandbox's host name (its own UTS namespace); `/etc/hosts` resolves it.
pub const HOSTNAME: &str = "turnstile";

/// `/proc` paths hidden from a turn: the OCI runtime-spec default masked
/// paths, plus the host kernel's command line.
pub const PROC_MASKED: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/cmdline",
    "/proc/interrupts",
    "/proc/kallsyms",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/timer_list",
    "/proc/timer_stats",
];

/// `/proc` paths a turn sees read-only (the OCI default read-only paths).
pub const PROC_READ_ONLY: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Dynamic loaders granted execute alongside every executable.
const LOADERS: &[&str] = &[
    "/lib64/ld-linux-x86-64.so.2",
    "/usr/lib64/ld-linux-x86-64.so.2",
    "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
];

/// Devices a turn may use, and the `/proc` files a process writes in
/// place: its own `comm` (`> /proc/self/comm`) and `oom_score_adj`. Not
/// `/proc` whole: a write grant there would reach every process's
/// `attr/*` (the LSM attribute files) and `mem`. `/proc/self` names the
/// command's own process: the rules are created in the process that execs
/// the command, so these grants are its files (a child names its thread
/// with `prctl(PR_SET_NAME)`, which needs no file).
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/pts",
    "/proc/self/comm",
    "/proc/self/oom_score_adj",
];

/// Where every backend mounts the turn's IPC namespace's mqueue
/// filesystem (its POSIX message queues), read-write under Landlock.
pub const DEV_MQUEUE: &str = "/dev/mqueue";

/// Host environment variables passed through when set.
const ENV_PASSTHROUGH: &[&str] = &["LANG", "LC_ALL", "TZ", "TERM"];

fn join(root: &str, rel: &str) -> String {
    format!("{root}/{rel}")
}

/// Inputs to the compiler besides the manifest and the request.
#[derive(Debug, Clone)]
pub struct PlanContext<'a> {
    pub root: &'a str,
    /// Host owner (uid, gid) of the workspace root.
    pub workspace_owner: (u32, u32),
    pub turn_number: u64,
    /// Values of [`ENV_PASSTHROUGH`] variables on the host.
    pub host_env: Vec<(String, String)>,
    /// The image rootfs the system view comes from (see
    /// [`Plan::system_root`]); `fs` must then answer for paths outside the
    /// workspace from that rootfs.
    pub system_root: Option<&'a str>,
    /// Sessions of this workspace whose owner is not this turn's (another
    /// tenant's, another uid's): their directories are left out of the read
    /// grants ([`foreign_session_dirs`]). The supervisor lists them only
    /// when the read patterns reach the session trees
    /// ([`session_trees_read`]).
    pub foreign_sessions: &'a [String],
}

/// Compiles the Plan of one allowed turn: the writable scopes, the
/// executables, the view (system baseline, /dev, /proc, the workspace as
/// the grants name it, generated files, masks), the Landlock rules and the
/// environment — one step each.
pub fn compile(
    ctx: &PlanContext<'_>,
    manifest: &Manifest,
    request: &BoundRequest,
    allowed: &Allowed,
    fs: &dyn FsView,
) -> Result<Plan, PlanError> {
    let c = Compiler::new(ctx, manifest, request, fs);
    let scopes = c.writable_scopes()?;
    let (program_abs, execute) = c.executables()?;
    let mut view = View::default();
    let ephemeral = c.system_view(&mut view);
    let scope_dirs: Vec<String> = scopes.iter().map(|s| join(c.root, s)).collect();
    c.workspace_view(&mut view, &scope_dirs, &execute)?;
    let masked = c.masks(&mut view)?;
    let landlock = c.landlock(&view, &masked, &scope_dirs, execute, ephemeral)?;
    let l = &manifest.limits;
    let timeout = request
        .timeout_seconds
        .unwrap_or(l.timeout_seconds)
        .min(l.timeout_seconds);
    let mut argv = request.command.clone();
    argv[0] = program_abs;
    Ok(Plan {
        session_id: c.sid.to_owned(),
        turn_number: ctx.turn_number,
        package_id: manifest.package_id.to_string(),
        root: c.root.to_owned(),
        argv,
        execute_entry: allowed.execute_entry.clone(),
        cwd: c.root.to_owned(),
        env: c.environment(&landlock.execute),
        uid: NOBODY,
        gid: NOBODY,
        workspace_owner: ctx.workspace_owner,
        hostname: HOSTNAME.into(),
        namespaces: ["mount", "pid", "ipc", "uts", "net", "cgroup"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        read_baseline: view.baseline,
        mounts: view.mounts,
        writable_scopes: scopes,
        landlock,
        seccomp: SeccompProfile::default_profile(),
        limits: PlanLimits {
            memory_bytes: l.memory.0,
            cpu_millis: l.cpu.0,
            pids: l.pids,
            timeout_seconds: timeout,
            disk_bytes: l.disk.0,
            files: l.files,
            output_bytes: l.output_bytes.0,
        },
        network: manifest.network.as_str().into(),
        egress: manifest.egress.iter().map(|e| e.raw.clone()).collect(),
        allow_degraded: manifest
            .allow_degraded
            .iter()
            .map(|l| l.as_str().to_owned())
            .collect(),
        system_root: ctx.system_root.map(str::to_owned),
        stdin: None,
        forward_all_output: false,
    })
}

/// `path` is `dir` or below it.
fn within(path: &str, dir: &str) -> bool {
    path == dir || path.starts_with(&format!("{dir}/"))
}

/// What one compilation reads: the inputs, and the forbidden patterns.
struct Compiler<'a> {
    ctx: &'a PlanContext<'a>,
    manifest: &'a Manifest,
    fs: &'a dyn FsView,
    root: &'a str,
    sid: &'a str,
    caps: &'a crate::capabilities::Capabilities,
    session: &'a crate::SessionId,
    request: &'a BoundRequest,
    forbidden: PatternSet,
}

/// The view as it is built: every mount in order, the system baseline
/// entries, and every directory or file mounted.
#[derive(Default)]
struct View {
    mounts: Vec<Mount>,
    baseline: Vec<String>,
    shown: Vec<String>,
}

impl<'a> Compiler<'a> {
    fn new(
        ctx: &'a PlanContext<'a>,
        manifest: &'a Manifest,
        request: &'a BoundRequest,
        fs: &'a dyn FsView,
    ) -> Self {
        let session = &request.session;
        let caps = &manifest.capabilities;
        Self {
            ctx,
            manifest,
            fs,
            root: ctx.root,
            sid: session.as_str(),
            caps,
            session,
            request,
            forbidden: PatternSet::compile(&caps.forbidden, session)
                .unwrap_or_else(|_| empty_set(session)),
        }
    }

    /// The writable scopes: scratch, session output, each write pattern's
    /// static directory (outermost only).
    fn writable_scopes(&self) -> Result<Vec<String>, PlanError> {
        let (sid, session, caps) = (self.sid, self.session, self.caps);
        let mut scopes: Vec<String> = vec![format!("tmp/{sid}"), format!("output/{sid}")];
        for p in &caps.write {
            let prefix = p.static_prefix(session);
            // A literal file pattern's scope is its directory.
            let dir = if prefix == p.expand(session) {
                prefix
                    .rsplit_once('/')
                    .map(|(d, _)| d.to_owned())
                    .unwrap_or_default()
            } else {
                prefix
            };
            if dir.is_empty() {
                return Err(PlanError::BadScope(p.to_string()));
            }
            if !scopes
                .iter()
                .any(|s| *s == dir || dir.starts_with(&format!("{s}/")))
            {
                scopes.retain(|s| !s.starts_with(&format!("{dir}/")));
                scopes.push(dir);
            }
        }
        Ok(scopes)
    }

    /// The executables: argv[0] (absolute, resolved) and every literal
    /// execute entry's program, resolved, with `#!` interpreters and the
    /// dynamic loader. Returns argv[0] as the sandbox names it.
    fn executables(&self) -> Result<(String, Vec<String>), PlanError> {
        let (root, fs, session, caps) = (self.root, self.fs, self.session, self.caps);
        let request = self.request;
        let program = &request.command[0];
        let program_abs = if program.starts_with('/') {
            program.clone()
        } else {
            join(root, program)
        };
        let resolved = match (fs.canonical(&program_abs), fs.kind(&program_abs)) {
            (Some(c), Some(_)) if fs.kind(&c) == Some(FileKind::File) => c,
            _ => return Err(PlanError::ExecutableMissing(program.clone())),
        };
        let mut execute = vec![resolved];
        for entry in &caps.execute {
            let raw = entry.program.expand(session);
            let abs = if raw.starts_with('/') {
                raw
            } else {
                join(root, &raw)
            };
            if let Some(c) = fs
                .canonical(&abs)
                .filter(|c| fs.kind(c) == Some(FileKind::File))
            {
                execute.push(c);
            }
        }
        let mut interpreters = Vec::new();
        for exe in &execute {
            if let Some(interp) = shebang(&fs.head(exe, 256)) {
                if let Some(c) = fs.canonical(&interp) {
                    interpreters.push(c);
                }
            }
        }
        execute.extend(interpreters);
        execute.extend(LOADERS.iter().filter_map(|l| fs.canonical(l)));
        execute.sort();
        execute.dedup();
        Ok((program_abs, execute))
    }

    /// The system view: the baseline (`/usr`, `/lib*`, the /etc set —
    /// left out where a grant names a host directory whole), `/dev`, the
    /// private ephemeral tmpfs mounts (returned) and `/proc`.
    fn system_view(&self, view: &mut View) -> Vec<String> {
        let (root, fs, session, caps, ctx) =
            (self.root, self.fs, self.session, self.caps, self.ctx);
        let manifest = self.manifest;
        // Host directories the grants name whole (`/etc/**`) replace the
        // baseline entries inside them.
        let host_granted: Vec<String> = caps
            .read
            .iter()
            .chain(caps.execute.iter().map(|e| &e.program))
            .filter(|p| p.is_absolute())
            .map(|p| p.static_prefix(session))
            .filter(|p| fs.kind(p) == Some(FileKind::Dir))
            .collect();
        for path in READ_BASELINE {
            if host_granted
                .iter()
                .any(|g| g.as_str() != *path && within(path, g))
            {
                view.baseline.push((*path).to_owned());
                continue;
            }
            // In an image rootfs, a baseline entry below a symlinked directory
            // is left out: its source path would be resolved on the host when
            // mounted. (The host's own baseline has none.)
            if ctx.system_root.is_some() {
                let parent = path.rsplit_once('/').map_or("", |(d, _)| d);
                if !parent.is_empty() && fs.canonical(parent).as_deref() != Some(parent) {
                    continue;
                }
            }
            match fs.kind(path) {
                Some(FileKind::Symlink) => {
                    if let Some(target) = fs.read_link(path) {
                        view.mounts.push(Mount::Symlink {
                            path: (*path).into(),
                            target,
                        });
                        view.baseline.push((*path).to_owned());
                    }
                }
                Some(FileKind::Dir | FileKind::File) => {
                    view.mounts.push(Mount::SystemReadOnly {
                        path: (*path).into(),
                    });
                    view.baseline.push((*path).to_owned());
                    view.shown.push((*path).to_owned());
                }
                _ => {}
            }
        }
        // /dev/shm is a tmpfs whose pages count against the turn's memory
        // cgroup. Half the memory limit (at least Docker's fixed 64 MiB;
        // red-team stop 61: a 200 MB multiprocessing.shared_memory block
        // died of SIGBUS under a 2 GiB limit, unrecorded): filling it is
        // ENOSPC, a clear errno, before the cgroup's OOM kill.
        view.mounts.push(Mount::Dev {
            shm_bytes: (manifest.limits.memory.0 / 2).max(64 << 20),
        });
        let ephemeral: Vec<String> = EPHEMERAL
            .iter()
            .filter(|e| !(root == **e || root.starts_with(&format!("{e}/"))))
            .map(|e| (*e).to_owned())
            .collect();
        for path in &ephemeral {
            view.mounts.push(Mount::Ephemeral {
                path: path.clone(),
                bytes: manifest.limits.disk.0,
            });
        }
        view.mounts.push(Mount::Proc {
            masked: PROC_MASKED.iter().map(|p| (*p).to_owned()).collect(),
            read_only: PROC_READ_ONLY.iter().map(|p| (*p).to_owned()).collect(),
        });
        ephemeral
    }

    /// What the grants name: the static prefix of every read and execute
    /// pattern, every executable and its interpreter — host paths and the
    /// workspace's read-only parts — and the writable scopes' overlays,
    /// parents first; then the generated /etc/hosts and /etc/hostname.
    fn workspace_view(
        &self,
        view: &mut View,
        scope_dirs: &[String],
        execute: &[String],
    ) -> Result<(), PlanError> {
        let (root, fs, session, caps) = (self.root, self.fs, self.session, self.caps);
        // What the grants name: the static prefix of every read and execute
        // pattern, every executable the turn may start and its interpreter.
        let mut wanted: Vec<String> = Vec::new();
        for p in caps
            .read
            .iter()
            .chain(caps.execute.iter().map(|e| &e.program))
        {
            let prefix = p.static_prefix(session);
            if p.is_absolute() {
                if prefix == "/" {
                    return Err(PlanError::HostRoot(p.to_string()));
                }
                wanted.push(prefix);
            } else if prefix.is_empty() {
                wanted.push(root.to_owned());
            } else {
                wanted.push(join(root, &prefix));
            }
        }
        wanted.extend(execute.iter().cloned());
        wanted.sort();
        wanted.dedup();
        // Keep the outermost: a path inside another wanted path, a writable
        // scope, the baseline, /proc or /dev is already shown.
        let outer = wanted.clone();
        wanted.retain(|w| {
            !outer.iter().any(|o| o != w && within(w, o))
                && !scope_dirs.iter().any(|s| within(w, s))
                && !view.shown.iter().any(|b| within(w, b))
                && !["/proc", "/dev"].iter().any(|d| within(w, d))
        });
        // Workspace read-only parts and writable scopes, parents first.
        let mut ws: Vec<(String, Option<usize>)> = Vec::new();
        let mut host: Vec<String> = Vec::new();
        for w in wanted {
            if within(&w, root) {
                ws.push((w, None));
            } else {
                host.push(w);
            }
        }
        for (i, s) in scope_dirs.iter().enumerate() {
            ws.push((s.clone(), Some(i)));
        }
        ws.sort();
        if !ws.iter().any(|(p, i)| p == root && i.is_none()) {
            view.mounts.push(Mount::Dir {
                path: root.to_owned(),
            });
        }
        for path in host {
            // sysfs cannot be an overlay's lower layer (and holds no sockets):
            // bound as it is.
            let show_host = |p: &str| match show(fs, "/", p) {
                Some(Mount::ReadOnly { path }) if within(&path, "/sys") => {
                    Some(Mount::SystemReadOnly { path })
                }
                other => other,
            };
            if let Some(m) = show_host(&path) {
                if matches!(m, Mount::ReadOnly { .. } | Mount::SystemReadOnly { .. }) {
                    view.shown.push(path);
                }
                // A symlink of the baseline (`/bin`) is there already.
                if !view.mounts.contains(&m) {
                    view.mounts.push(m);
                }
            }
        }
        for (path, index) in ws {
            match index {
                Some(index) => {
                    view.shown.push(path.clone());
                    view.mounts.push(Mount::Overlay { path, index });
                }
                None => {
                    if let Some(m) = show(fs, root, &path) {
                        if matches!(m, Mount::ReadOnly { .. }) {
                            view.shown.push(path);
                        }
                        if !view.mounts.contains(&m) {
                            view.mounts.push(m);
                        }
                    }
                }
            }
        }
        for (path, contents) in [
            (
                "/etc/hosts",
                format!(
                    "127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                ),
            ),
            ("/etc/hostname", format!("{HOSTNAME}\n")),
        ] {
            view.mounts.push(Mount::Generated {
                path: path.into(),
                contents,
            });
        }
        // A turn with egress resolves names only through the supervisor's
        // resolver inside its network namespace.
        if self.manifest.network != Network::Isolated {
            view.mounts.push(Mount::Generated {
                path: "/etc/resolv.conf".into(),
                contents: format!("nameserver {RESOLVER}\noptions timeout:2 attempts:2\n"),
            });
        }
        Ok(())
    }

    /// The masks, last so nothing mounted later can uncover them:
    /// forbidden paths in the view, and the ledgers unless a read pattern
    /// names them. Returns the masked paths.
    fn masks(&self, view: &mut View) -> Result<Vec<String>, PlanError> {
        let (root, fs, session, caps) = (self.root, self.fs, self.session, self.caps);
        let forbidden = &self.forbidden;
        // Masks go last so nothing mounted later can uncover them: forbidden
        // paths that exist in the view, and the ledgers unless a read pattern
        // names them.
        let mut masked: Vec<String> = Vec::new();
        let forbidden_roots: Vec<String> = view
            .shown
            .iter()
            .filter(|b| fs.kind(b) == Some(FileKind::Dir))
            .cloned()
            .collect();
        for p in &caps.forbidden {
            let start = if p.is_absolute() {
                p.static_prefix(session)
            } else {
                join(root, &p.static_prefix(session))
            };
            if !forbidden_roots
                .iter()
                .any(|r| within(&start, r) || r.starts_with(&format!("{start}/")))
            {
                continue;
            }
            // `dir/**` forbids the directory itself: mask it whole.
            let expanded = p.expand(session);
            let prefix = p.static_prefix(session);
            if expanded.strip_suffix("/**") == Some(prefix.as_str())
                && fs.kind(&start) == Some(FileKind::Dir)
            {
                masked.push(start);
                continue;
            }
            for hit in enumerate(fs, root, &start, forbidden)? {
                masked.push(hit);
            }
        }
        let planes = join(root, "planes");
        if fs.kind(&planes) == Some(FileKind::Dir) {
            if !caps.read.iter().any(|r| r.as_str().starts_with("planes/")) {
                masked.push(planes.clone());
            } else {
                // The ledgers may be read; the pre-image store never is: it
                // keeps, as hard links, what commits replaced — a forbidden
                // file's old content too (red-team wave 4).
                masked.extend(preimage_stores(fs, &planes));
            }
        }
        // Only what is in the view needs hiding.
        masked.retain(|m| view.shown.iter().any(|s| within(m, s)));
        masked.sort();
        masked.dedup();
        // Drop masks nested inside another mask.
        let outer = masked.clone();
        masked.retain(|m| {
            !outer
                .iter()
                .any(|o| m != o && m.starts_with(&format!("{o}/")))
        });
        for path in &masked {
            let reason = if path.ends_with("/planes") {
                "reserved (ledgers)"
            } else if path.ends_with("/preimages") && path.starts_with(&format!("{planes}/")) {
                "reserved (pre-images)"
            } else {
                "forbidden"
            };
            match fs.kind(path) {
                Some(FileKind::Dir) => view.mounts.push(Mount::MaskDir {
                    path: path.clone(),
                    reason: reason.into(),
                }),
                Some(_) => view.mounts.push(Mount::MaskFile {
                    path: path.clone(),
                    reason: reason.into(),
                }),
                None => {}
            }
        }
        Ok(masked)
    }

    /// The Landlock rules: read (the baseline, /proc, the read grants minus
    /// what is forbidden or masked), read-write (the scopes, /dev/shm,
    /// /dev/mqueue, the ephemeral mounts), execute (the executables and the
    /// static prefix of each execute glob), devices.
    fn landlock(
        &self,
        view: &View,
        masked: &[String],
        scope_dirs: &[String],
        mut execute: Vec<String>,
        ephemeral: Vec<String>,
    ) -> Result<LandlockRules, PlanError> {
        let (root, fs, session, caps) = (self.root, self.fs, self.session, self.caps);
        let forbidden = &self.forbidden;
        let read_set =
            PatternSet::compile(&caps.read, session).unwrap_or_else(|_| empty_set(session));
        let mut read: Vec<String> = view
            .baseline
            .iter()
            .filter_map(|b| fs.canonical(b))
            .collect();
        read.push("/proc".into());
        read.extend(["/etc/hosts".to_owned(), "/etc/hostname".to_owned()]);
        // Another owner's sessions are never granted, whatever a read
        // pattern covers (`**`, `output/**`, `planes/**`): the grant goes
        // around their directories. A session tree a pattern reaches is
        // granted child by child, never whole, so a session made after
        // this compile is not granted either (red-team M5, stop 54).
        let trees = session_trees_read(root, fs, caps);
        let foreign = foreign_session_dirs(fs, &trees, self.ctx.foreign_sessions);
        // A session's directory under `planes/` is granted child by child
        // too: its pre-image store, made by a commit while this turn runs,
        // must not come with a grant made before it (red-team, stop 55:
        // a forbidden file's old content read through a same-owner
        // session's new `preimages/`).
        let session_dirs: Vec<String> = trees
            .iter()
            .filter(|t| t.ends_with("/sessions"))
            .flat_map(|t| fs.list(t).into_iter().map(move |n| format!("{t}/{n}")))
            .collect();
        let around = Around::new(
            masked.iter().cloned().chain(foreign),
            trees.into_iter().chain(session_dirs),
        );
        let around = &around;
        if self.manifest.network != Network::Isolated {
            read.push("/etc/resolv.conf".to_owned());
        }
        for p in &caps.read {
            let start = if p.is_absolute() {
                p.static_prefix(session)
            } else {
                join(root, &p.static_prefix(session))
            };
            for hit in enumerate(fs, root, &start, &read_set)? {
                // Landlock resolves a rule's path where it is made, in the
                // sandbox: a link there to `/` or above the workspace would
                // grant all of the view, whatever the pattern narrowed.
                let named = match hit.trim_end_matches('/') {
                    "" => "/",
                    h => h,
                };
                // Nor may a link lead to a session tree (or above one) or
                // into another owner's session: the rule would cover what
                // the grants go around (red-team, stop 55: a link in the
                // turn's own scratch to `output/`).
                if let Some(target) = fs.canonical(&hit).filter(|c| {
                    c != named
                        && (c == "/" || within(root, c) || around.reaches(c) || around.hides(c))
                }) {
                    return Err(PlanError::LinkWidens {
                        pattern: p.to_string(),
                        path: hit,
                        target,
                    });
                }
                // `named`: a `**` at the root hits `<root>/`, whose masks
                // would otherwise not be seen as beneath it.
                grant_excluding(fs, root, named, forbidden, around, &mut read);
            }
        }
        read.sort();
        read.dedup();
        // Execute on globs and on what the turn creates: Landlock cannot match a
        // glob, so an execute pattern grants its static prefix (`/usr/bin/*` ->
        // `/usr/bin`); under a writable scope, the nearest directory of it that
        // exists when the turn starts (rules need an existing inode; never above
        // the scope, where the turn may write anyway). Literal entries were
        // resolved above.
        for entry in &caps.execute {
            let raw = entry.program.static_prefix(session);
            let abs = if raw.starts_with('/') {
                raw
            } else {
                join(root, &raw)
            };
            let scope = scope_dirs.iter().find(|s| within(&abs, s));
            let expanded = entry.program.expand(session);
            let literal = abs == expanded || abs == join(root, &expanded);
            if literal && scope.is_none() {
                continue;
            }
            let floor = scope.cloned().unwrap_or_else(|| "/".into());
            let mut dir = abs.clone();
            while dir != floor && fs.kind(&dir) != Some(FileKind::Dir) {
                dir = match dir.rsplit_once('/') {
                    Some((d, _)) => d.to_owned(),
                    None => break,
                };
            }
            if !dir.is_empty() && dir != "/" {
                execute.push(dir);
            }
        }
        execute.sort();
        execute.dedup();
        // An execute rule grants reading too: it goes around another
        // owner's sessions, and a session tree is granted child by child,
        // as the read grants are (red-team, stop 55: `output/*/a.txt`
        // and `**` as execute entries read other tenants' outputs).
        let execute: Vec<String> = {
            let mut out = Vec::new();
            for e in &execute {
                grant_excluding(fs, root, e, forbidden, around, &mut out);
            }
            out.sort();
            out.dedup();
            out
        };
        let mut read_write: Vec<String> = scope_dirs.to_vec();
        read_write.push("/dev/shm".into());
        // The turn's own POSIX message queues (its IPC namespace's mqueue
        // instance): mq_open opens on the namespace's internal mount,
        // whose root inode is this mount's, so this rule is what lets it
        // (real-software audit: EACCES without). Where a backend has no
        // /dev/mqueue the rule is skipped, recorded in the outcome.
        read_write.push(DEV_MQUEUE.into());
        read_write.extend(ephemeral);
        Ok(LandlockRules {
            abi: LANDLOCK_ABI,
            list: vec!["/".into()],
            read,
            read_write,
            execute,
            devices: DEVICES.iter().map(|d| (*d).to_owned()).collect(),
        })
    }

    /// The environment (FR-RT-012, FR-RT-014): PATH (see [`Self::path`]),
    /// the session's scratch as HOME and TMPDIR, fixed variables, the
    /// passthrough set.
    fn environment(&self, execute: &[String]) -> Vec<(String, String)> {
        let (root, sid, ctx) = (self.root, self.sid, self.ctx);
        let scratch = join(root, &format!("tmp/{sid}"));
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), self.path(execute)),
            ("HOME".into(), scratch.clone()),
            ("TMPDIR".into(), scratch.clone()),
            ("TEMP".into(), scratch.clone()),
            ("TMP".into(), scratch),
            ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
            ("TURNSTILE_SESSION_ID".into(), sid.to_owned()),
            ("TURNSTILE_TURN".into(), ctx.turn_number.to_string()),
        ];
        env.extend(
            GIT_STAT_CONFIG
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        for (k, v) in &ctx.host_env {
            if ENV_PASSTHROUGH.contains(&k.as_str()) {
                env.push((k.clone(), v.clone()));
            }
        }
        env
    }

    /// PATH: the directories of [`DEFAULT_PATH`], in its order, from which
    /// the turn may execute something — a Landlock execute rule on the
    /// directory or an ancestor of it, or on a file directly in it (an
    /// executable named by a literal execute entry or argv[0] counts in the
    /// directory it is named in, if it is reached through a link), compared
    /// as resolved paths, as Landlock resolves them. A directory the turn
    /// sees (`read: /usr/**`) but cannot execute from was first on PATH:
    /// `git` resolved to `/usr/local/bin/git` and failed EACCES (126) where
    /// `/usr/bin/git` would run, and `shutil.which` returned the unusable
    /// path (real-software audit).
    ///
    /// Where no directory qualifies, PATH stays [`DEFAULT_PATH`] whole: an
    /// empty PATH means the working directory (the workspace root) to
    /// shells and `execvp`, and an unset one each program's own built-in
    /// list; a name looked up then fails EACCES, recorded as an execute
    /// denial naming the file to grant, rather than "not found". Neither a
    /// request nor a manifest sets the environment; a command that sets its
    /// own PATH (`env PATH=… cmd`, `PATH=… sh -c …`) has it.
    fn path(&self, execute: &[String]) -> String {
        let fs = self.fs;
        let parent = |p: &str| match p.rsplit_once('/') {
            Some(("", _)) => Some("/".to_owned()),
            Some((d, _)) => Some(d.to_owned()),
            None => None,
        };
        let is_dir = |p: &String| fs.kind(p) == Some(FileKind::Dir);
        let (mut beneath, mut direct) = (Vec::new(), Vec::new());
        for rule in execute {
            let Some(c) = fs.canonical(rule) else {
                continue;
            };
            match fs.kind(&c) {
                Some(FileKind::Dir) => beneath.push(c),
                Some(FileKind::File) => direct.extend(parent(&c)),
                _ => {}
            }
        }
        let named = self
            .caps
            .execute
            .iter()
            .map(|e| e.program.expand(self.session))
            .chain(self.request.command.first().cloned());
        for raw in named {
            let abs = if raw.starts_with('/') {
                raw
            } else {
                join(self.root, &raw)
            };
            let file = fs
                .canonical(&abs)
                .is_some_and(|c| fs.kind(&c) == Some(FileKind::File));
            if let Some(d) = parent(&abs).filter(|_| file) {
                direct.extend(fs.canonical(&d));
            }
        }
        let kept: Vec<&str> = DEFAULT_PATH
            .iter()
            .copied()
            .filter(|d| {
                fs.canonical(d)
                    .filter(is_dir)
                    .is_some_and(|c| direct.contains(&c) || beneath.iter().any(|b| within(&c, b)))
            })
            .collect();
        if kept.is_empty() {
            DEFAULT_PATH.join(":")
        } else {
            kept.join(":")
        }
    }
}

/// The turn's PATH before it is narrowed ([`Compiler::path`]), in order.
pub const DEFAULT_PATH: [&str; 3] = ["/usr/local/bin", "/usr/bin", "/bin"];

/// git's stat checks, relaxed to what a turn sees of the workspace as the
/// host wrote it (real-software audit #2): through the idmapped mount a
/// file's owner shows as 65534, and its ctime and inode come through the
/// overlay, so git found every entry of a clean repository's index stale
/// and rewrote `.git/index` — `git status` blocked the turn as an
/// undeclared write. `core.checkStat=minimal` compares size, whole-second
/// mtime and mode; `core.trustctime=false` drops ctime. Given as
/// `GIT_CONFIG_COUNT`/`_KEY_n`/`_VALUE_n` (git ≥ 2.31; an older git ignores
/// them): a command that sets its own `GIT_CONFIG_COUNT` replaces them.
pub const GIT_STAT_CONFIG: [(&str, &str); 5] = [
    ("GIT_CONFIG_COUNT", "2"),
    ("GIT_CONFIG_KEY_0", "core.checkStat"),
    ("GIT_CONFIG_VALUE_0", "minimal"),
    ("GIT_CONFIG_KEY_1", "core.trustctime"),
    ("GIT_CONFIG_VALUE_1", "false"),
];

fn empty_set(session: &crate::SessionId) -> PatternSet {
    // An empty list always compiles.
    match PatternSet::compile(&[], session) {
        Ok(s) => s,
        Err(_) => unreachable!("an empty pattern set cannot fail to compile"),
    }
}

/// The `#!` interpreter of a script, if any.
fn shebang(head: &[u8]) -> Option<String> {
    let rest = head.strip_prefix(b"#!")?;
    let line = rest.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim();
    let interp = line.split_ascii_whitespace().next()?;
    interp.starts_with('/').then(|| interp.to_owned())
}

/// How `path` (under `base`, `/` or the workspace root) is shown read-only:
/// walking down from `base`, the first symlink is recreated (never followed:
/// what it points to is shown only if granted itself); a directory or a
/// regular file is mounted; anything else, or a missing path, is not shown.
fn show(fs: &dyn FsView, base: &str, path: &str) -> Option<Mount> {
    let rest = path.strip_prefix(base)?.trim_start_matches('/');
    let mut current = base.trim_end_matches('/').to_owned();
    for segment in rest.split('/').filter(|s| !s.is_empty()) {
        current = format!("{current}/{segment}");
        match fs.kind(&current)? {
            FileKind::Symlink => {
                return Some(Mount::Symlink {
                    target: fs.read_link(&current)?,
                    path: current,
                });
            }
            FileKind::Dir => {}
            FileKind::File if current == path => {}
            FileKind::File | FileKind::Other => return None,
        }
    }
    matches!(fs.kind(path)?, FileKind::Dir | FileKind::File).then(|| Mount::ReadOnly {
        path: path.to_owned(),
    })
}

/// Existing paths at or under `start` that `set` matches (hierarchically:
/// a matching directory is returned and not descended). Never follows
/// symlinks.
fn enumerate(
    fs: &dyn FsView,
    root: &str,
    start: &str,
    set: &PatternSet,
) -> Result<Vec<String>, PlanError> {
    let mut out = Vec::new();
    let mut stack = vec![start.to_owned()];
    let mut visited = 0usize;
    while let Some(path) = stack.pop() {
        visited += 1;
        if visited > MAX_ENUMERATED * 10 {
            return Err(PlanError::TooManyMatches {
                pattern: start.to_owned(),
            });
        }
        let Some(kind) = fs.kind(&path) else { continue };
        if set.matching(&Target::new(root, &path)).is_some() {
            out.push(path);
            if out.len() > MAX_ENUMERATED {
                return Err(PlanError::TooManyMatches {
                    pattern: start.to_owned(),
                });
            }
            continue;
        }
        if kind == FileKind::Dir {
            for name in fs.list(&path) {
                stack.push(format!("{path}/{name}"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Every session's pre-image store under `planes`
/// (`planes/<tier>/sessions/<sid>/preimages`) that exists.
fn preimage_stores(fs: &dyn FsView, planes: &str) -> Vec<String> {
    let mut out = Vec::new();
    for tier in fs.list(planes) {
        let sessions = format!("{planes}/{tier}/sessions");
        for sid in fs.list(&sessions) {
            let store = format!("{sessions}/{sid}/preimages");
            if fs.kind(&store) == Some(FileKind::Dir) {
                out.push(store);
            }
        }
    }
    out
}

/// The session trees a read or execute pattern of `caps` reaches beyond
/// the turn's own `<session_id>` directory (absolute): `output`, `tmp`,
/// `planes/<tier>/sessions` — by `**`, `output/**`, `planes/**`, a
/// literal other id, `output/*/bin/x` and the like; none for the usual
/// `output/<session_id>/**`.
pub fn session_trees_read(
    root: &str,
    fs: &dyn FsView,
    caps: &crate::capabilities::Capabilities,
) -> Vec<String> {
    let root = root.trim_end_matches('/');
    // Execute entries too: an execute rule grants reading.
    let reaches = |tree: &str| {
        caps.read
            .iter()
            .chain(caps.execute.iter().map(|e| &e.program))
            .any(|p| p.reaches_in_tree(tree, Some(root)))
    };
    let mut trees: Vec<String> = crate::pattern::SESSION_TREES
        .into_iter()
        .filter(|t| reaches(t))
        .map(|t| join(root, t))
        .collect();
    for tier in fs.list(&join(root, "planes")) {
        let sessions = format!("planes/{tier}/sessions");
        if reaches(&sessions) {
            trees.push(join(root, &sessions));
        }
    }
    trees
}

/// The session a directory of a session tree belongs to: `<sid>`; a
/// session being created, `.new-<sid>` (renamed into place later: a rule
/// made on it would follow its inode to `<sid>`); a commit's staging
/// directory in `tmp/`, `.<sid>.t<n>.commit`.
pub fn session_of_entry(name: &str) -> &str {
    if let Some(sid) = name.strip_prefix(".new-") {
        return sid;
    }
    name.strip_prefix('.')
        .and_then(|n| n.split_once(".t"))
        .map_or(name, |(sid, _)| sid)
}

/// The directories of `foreign` sessions in `trees` (the session trees
/// the grants reach, [`session_trees_read`]): what the plan's Landlock
/// read and execute rules go around.
pub fn foreign_session_dirs(fs: &dyn FsView, trees: &[String], foreign: &[String]) -> Vec<String> {
    if foreign.is_empty() {
        return Vec::new();
    }
    let foreign: std::collections::HashSet<&str> = foreign.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    for tree in trees {
        for name in fs.list(tree) {
            if foreign.contains(session_of_entry(&name)) {
                out.push(format!("{tree}/{name}"));
            }
        }
    }
    out
}

/// Grants `path` — unless a forbidden or masked path lies beneath it, in
/// which case its children are granted instead, around the forbidden ones
/// (Landlock is hierarchical: a grant on a parent would cover them).
fn grant_excluding(
    fs: &dyn FsView,
    root: &str,
    path: &str,
    forbidden: &PatternSet,
    around: &Around,
    out: &mut Vec<String>,
) {
    // `<root>/` (a `**` at the root) is `<root>`: with the slash nothing
    // beneath it would be seen as masked.
    let path = match path.trim_end_matches('/') {
        "" => "/",
        p => p,
    };
    if forbidden.matching(&Target::new(root, path)).is_some() || around.hides(path) {
        return;
    }
    if !around.reaches(path) {
        out.push(path.to_owned());
        return;
    }
    for name in fs.list(path) {
        grant_excluding(fs, root, &format!("{path}/{name}"), forbidden, around, out);
    }
}

/// What grants go around: masked paths (never granted, nor anything in
/// them) and directories granted child by child, never whole (the session
/// trees and the sessions' `planes/` directories). Sorted sets: a
/// workspace may hold thousands of sessions, and each grant asks both.
struct Around {
    masked: std::collections::BTreeSet<String>,
    descend: std::collections::BTreeSet<String>,
}

impl Around {
    fn new(
        masked: impl IntoIterator<Item = String>,
        descend: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            masked: masked.into_iter().collect(),
            descend: descend.into_iter().collect(),
        }
    }

    /// `path` is masked or lies in a masked path.
    fn hides(&self, path: &str) -> bool {
        let mut p = path;
        loop {
            if self.masked.contains(p) {
                return true;
            }
            match p.rsplit_once('/') {
                Some(("", _)) | None => return self.masked.contains("/"),
                Some((parent, _)) => p = parent,
            }
        }
    }

    /// A grant on `path` must go child by child: it is to be descended, or
    /// something masked or to be descended lies beneath it.
    fn reaches(&self, path: &str) -> bool {
        let beneath = if path == "/" {
            "/".to_owned()
        } else {
            format!("{path}/")
        };
        let under = |set: &std::collections::BTreeSet<String>| {
            set.range(beneath.clone()..)
                .next()
                .is_some_and(|m| m.starts_with(&beneath))
        };
        self.descend.contains(path) || under(&self.masked) || under(&self.descend)
    }
}

impl Plan {
    /// The bytes of output forwarded before the streams are cut (see
    /// [`Plan::forward_all_output`]).
    pub fn output_budget(&self) -> u64 {
        if self.forward_all_output {
            u64::MAX
        } else {
            self.limits.output_bytes
        }
    }

    /// The part of the Plan a sandbox is built from before its turn is
    /// known (a warm sandbox's pool key): everything but the command and
    /// what follows from it alone — argv, the execute entry, cwd, the
    /// environment, the turn number, the Landlock execute rules, the
    /// timeout and the output budget, all of which take effect after the
    /// sandbox is parked (the restriction and exec stage, the supervisor's
    /// timer and pumps). Two plans with equal shapes get the same view:
    /// the same mounts, identity, namespaces, scopes, read and write rules,
    /// seccomp profile and cgroup limits.
    pub fn shape(&self) -> Plan {
        self.with_turn_part(TurnPart::default())
    }

    /// Whether `self.shape() == other.shape()`, without building either:
    /// a warm sandbox is matched against its turn twice per turn, and a
    /// shape is a copy of the whole Plan (its seccomp lists alone are
    /// hundreds of strings). Every field is named below, the turn part's as
    /// ignored, so a field added to the Plan does not compile until it is
    /// sorted into one or the other (keep it in step with
    /// [`Plan::with_turn_part`]).
    pub fn same_shape(&self, other: &Plan) -> bool {
        let Plan {
            session_id,
            turn_number: _,
            package_id,
            root,
            argv: _,
            execute_entry: _,
            cwd: _,
            env: _,
            uid,
            gid,
            workspace_owner,
            hostname,
            namespaces,
            read_baseline,
            mounts,
            writable_scopes,
            landlock,
            seccomp,
            limits,
            network,
            egress,
            allow_degraded,
            system_root,
            stdin: _,
            forward_all_output,
        } = self;
        let PlanLimits {
            memory_bytes,
            cpu_millis,
            pids,
            timeout_seconds: _,
            disk_bytes,
            files,
            output_bytes: _,
        } = limits;
        let (shape, m) = (other, &other.limits);
        *session_id == shape.session_id
            && *package_id == shape.package_id
            && *root == shape.root
            && *uid == shape.uid
            && *gid == shape.gid
            && *workspace_owner == shape.workspace_owner
            && *hostname == shape.hostname
            && *namespaces == shape.namespaces
            && *read_baseline == shape.read_baseline
            && *mounts == shape.mounts
            && *writable_scopes == shape.writable_scopes
            && landlock.same_but_execute(&shape.landlock)
            && *seccomp == shape.seccomp
            && (*memory_bytes, *cpu_millis, *pids, *disk_bytes, *files)
                == (m.memory_bytes, m.cpu_millis, m.pids, m.disk_bytes, m.files)
            && *network == shape.network
            && *egress == shape.egress
            && *allow_degraded == shape.allow_degraded
            && *system_root == shape.system_root
            && *forward_all_output == shape.forward_all_output
    }

    /// What this Plan adds to its [`Plan::shape`]: everything `shape`
    /// clears, and nothing else.
    pub fn turn_part(&self) -> TurnPart {
        TurnPart {
            argv: self.argv.clone(),
            execute_entry: self.execute_entry.clone(),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            turn_number: self.turn_number,
            execute: self.landlock.execute.clone(),
            timeout_seconds: self.limits.timeout_seconds,
            output_bytes: self.limits.output_bytes,
            stdin: self.stdin.clone(),
        }
    }

    /// This Plan with `part` in place of its own turn part: for a plan `p`
    /// whose shape is this one's, `self.with_turn_part(p.turn_part()) ==
    /// p` — what a warm sandbox's parked stage rebuilds its turn's Plan
    /// from, sent only that part.
    pub fn with_turn_part(&self, part: TurnPart) -> Plan {
        let mut p = self.clone();
        p.argv = part.argv;
        p.execute_entry = part.execute_entry;
        p.cwd = part.cwd;
        p.env = part.env;
        p.turn_number = part.turn_number;
        p.landlock.execute = part.execute;
        p.limits.timeout_seconds = part.timeout_seconds;
        p.limits.output_bytes = part.output_bytes;
        p.stdin = part.stdin;
        p
    }

    /// Human-readable rendering for `supervise plan`.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        s += &format!(
            "turn {} of session {} (package {})\n",
            self.turn_number, self.session_id, self.package_id
        );
        s += &format!(
            "command:   {}\n  admitted by execute entry `{}`\n",
            self.argv.join(" "),
            self.execute_entry
        );
        s += &format!(
            "identity:  uid {} gid {}, no capabilities, no_new_privs; the workspace owner {}:{} appears as {}:{}\n",
            self.uid, self.gid, self.workspace_owner.0, self.workspace_owner.1, self.uid, self.gid
        );
        s += &format!("namespaces: {}\n", self.namespaces.join(", "));
        s += &format!("network:   {}\n", self.network);
        s += "mounts (in order):\n";
        for m in &self.mounts {
            let line = match m {
                Mount::ReadOnly { path } => format!("read-only {path}"),
                Mount::SystemReadOnly { path } => format!("system ro {path}"),
                Mount::Symlink { path, target } => format!("symlink   {path} -> {target}"),
                Mount::Dir { path } => format!("empty dir {path} (only the grants inside)"),
                Mount::Ephemeral { path, bytes } => {
                    format!(
                        "tmpfs     {path} ({} MiB, recorded and discarded)",
                        bytes >> 20
                    )
                }
                Mount::Generated { path, .. } => format!("generated {path}"),
                Mount::Dev { shm_bytes } => format!(
                    "dev       minimal /dev, private /dev/pts, /dev/shm {} MiB, own /dev/mqueue",
                    shm_bytes >> 20
                ),
                Mount::Proc { masked, read_only } => format!(
                    "proc      /proc (own pid namespace; {} paths masked, {} read-only)",
                    masked.len(),
                    read_only.len()
                ),
                Mount::Overlay { path, .. } => format!("overlay   {path} (writes captured)"),
                Mount::MaskDir { path, reason } | Mount::MaskFile { path, reason } => {
                    format!("mask      {path} ({reason})")
                }
            };
            s += &format!("  {line}\n");
        }
        s += &format!("landlock (ABI {}):\n", self.landlock.abi);
        for (label, list) in [
            ("list", &self.landlock.list),
            ("read", &self.landlock.read),
            ("read+write", &self.landlock.read_write),
            ("execute", &self.landlock.execute),
            ("devices", &self.landlock.devices),
        ] {
            s += &format!("  {label}:\n");
            for p in list {
                s += &format!("    {p}\n");
            }
        }
        s += &format!(
            "seccomp: {} syscalls allowed, {} denied with EPERM, everything else ENOSYS; foreign architectures kill\n",
            self.seccomp.allow.len(),
            self.seccomp.deny.len()
        );
        let l = &self.limits;
        s += &format!(
            "limits: memory {} MiB, cpu {}m, pids {}, timeout {} s, disk {} MiB, files {}, output {} KiB\n",
            l.memory_bytes >> 20,
            l.cpu_millis,
            l.pids,
            l.timeout_seconds,
            l.disk_bytes >> 20,
            l.files,
            l.output_bytes >> 10
        );
        s += "environment:\n";
        for (k, v) in &self.env {
            s += &format!("  {k}={v}\n");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsview::Memo;
    use crate::manifest::PackageId;
    use crate::request::TurnRequest;
    use crate::session::SessionId;
    use std::collections::BTreeMap;

    /// A fake tree: path -> kind; symlinks map to targets.
    #[derive(Default)]
    struct FakeFs {
        kinds: BTreeMap<String, FileKind>,
        links: BTreeMap<String, String>,
        heads: BTreeMap<String, Vec<u8>>,
    }

    impl FakeFs {
        fn with(paths: &[(&str, FileKind)]) -> Self {
            let mut fs = Self::default();
            for (p, k) in paths {
                fs.kinds.insert((*p).to_owned(), *k);
            }
            fs
        }
    }

    impl FsView for FakeFs {
        fn kind(&self, path: &str) -> Option<FileKind> {
            self.kinds.get(path).copied()
        }
        fn list(&self, path: &str) -> Vec<String> {
            let prefix = format!("{path}/");
            self.kinds
                .keys()
                .filter_map(|k| k.strip_prefix(&prefix))
                .filter(|rest| !rest.contains('/'))
                .map(str::to_owned)
                .collect()
        }
        fn canonical(&self, path: &str) -> Option<String> {
            match self.links.get(path) {
                Some(t) => Some(t.clone()),
                None => self.kinds.contains_key(path).then(|| path.to_owned()),
            }
        }
        fn read_link(&self, path: &str) -> Option<String> {
            self.links.get(path).cloned()
        }
        fn head(&self, path: &str, _len: usize) -> Vec<u8> {
            self.heads.get(path).cloned().unwrap_or_default()
        }
    }

    const SID: &str = "SES-20261121T093700123456Z-00000000deadbeef";

    fn compile_for(manifest: &str, command: &[&str], fs: &dyn FsView) -> Result<Plan, PlanError> {
        let m = Manifest::from_slice(
            manifest.as_bytes(),
            &PackageId::parse("p").unwrap(),
            "m.json".into(),
        )
        .unwrap();
        let req = TurnRequest::from_json(
            serde_json::json!({"command": command, "declared_outputs": []})
                .to_string()
                .as_bytes(),
        )
        .unwrap()
        .bind(&SessionId::parse(SID).unwrap())
        .unwrap();
        let allowed = crate::check::check_turn("/ws", &m, &req).unwrap().unwrap();
        let ctx = PlanContext {
            root: "/ws",
            workspace_owner: (1000, 1000),
            turn_number: 1,
            host_env: vec![
                ("TERM".into(), "xterm".into()),
                ("SECRET".into(), "x".into()),
            ],
            system_root: None,
            foreign_sessions: &[],
        };
        compile(&ctx, &m, &req, &allowed, fs)
    }

    fn tree() -> FakeFs {
        use FileKind::*;
        let mut fs = FakeFs::with(&[
            ("/usr", Dir),
            ("/usr/bin", Dir),
            ("/usr/bin/python3.11", File),
            ("/bin", Symlink),
            ("/lib64/ld-linux-x86-64.so.2", File),
            ("/etc/passwd", File),
            ("/ws", Dir),
            ("/ws/installed", Dir),
            ("/ws/installed/p", Dir),
            ("/ws/installed/p/run.sh", File),
            ("/ws/installed/p/lib", Dir),
            ("/ws/installed/p/secrets", Dir),
            ("/ws/installed/p/secrets/key", File),
            ("/ws/data", Dir),
            ("/ws/data/a.csv", File),
            ("/ws/data/b.txt", File),
            ("/ws/planes", Dir),
        ]);
        fs.links.insert("/bin".into(), "usr/bin".into());
        fs.links
            .insert("/usr/bin/python3".into(), "/usr/bin/python3.11".into());
        fs.kinds.insert("/usr/bin/python3".into(), Symlink);
        fs.heads.insert(
            "/ws/installed/p/run.sh".into(),
            b"#!/usr/bin/python3 -u\nprint(1)\n".to_vec(),
        );
        fs
    }

    const MANIFEST: &str = r#"{"capabilities":{
        "read":["installed/p/**","data/*.csv"],
        "write":["output/<session_id>/**","reports/<session_id>/*.md"],
        "execute":["installed/p/run.sh"],
        "forbidden":["installed/p/secrets/**"]}}"#;

    #[test]
    fn forbidden_paths_are_masked_and_siblings_granted_instead_of_the_parent() {
        let plan = compile_for(MANIFEST, &["installed/p/run.sh"], &tree()).unwrap();
        assert!(plan.mounts.contains(&Mount::MaskDir {
            path: "/ws/installed/p/secrets".into(),
            reason: "forbidden".into()
        }));
        let read = &plan.landlock.read;
        assert!(
            !read.contains(&"/ws/installed/p".to_owned()),
            "parent of a forbidden path granted: {read:?}"
        );
        assert!(read.contains(&"/ws/installed/p/run.sh".to_owned()));
        assert!(read.contains(&"/ws/installed/p/lib".to_owned()));
        assert!(!read.iter().any(|p| p.contains("secrets")));
        // Globs are enumerated exactly: a.csv, not b.txt.
        assert!(read.contains(&"/ws/data/a.csv".to_owned()));
        assert!(!read.contains(&"/ws/data/b.txt".to_owned()));
        // The ledgers are not in the view: nothing grants them.
        assert!(!plan.render_text().contains("/ws/planes"));
    }

    /// Red-team wave 4: a read grant naming `planes/` unmasked the whole
    /// tree, the pre-image stores with it (a forbidden file's old content).
    #[test]
    fn the_preimage_stores_stay_masked_when_the_ledgers_are_read() {
        let mut fs = tree();
        for (p, k) in [
            ("/ws/planes/ho1", FileKind::Dir),
            ("/ws/planes/ho1/sessions", FileKind::Dir),
            ("/ws/planes/ho1/sessions/S1", FileKind::Dir),
            ("/ws/planes/ho1/sessions/S1/ledger", FileKind::Dir),
            ("/ws/planes/ho1/sessions/S1/preimages", FileKind::Dir),
            ("/ws/planes/ho1/sessions/S1/preimages/abc", FileKind::File),
        ] {
            fs.kinds.insert(p.into(), k);
        }
        let m = r#"{"capabilities":{"read":["installed/p/**","planes/**"],
            "execute":["installed/p/run.sh"]}}"#;
        let plan = compile_for(m, &["installed/p/run.sh"], &fs).unwrap();
        assert!(
            plan.mounts.contains(&Mount::MaskDir {
                path: "/ws/planes/ho1/sessions/S1/preimages".into(),
                reason: "reserved (pre-images)".into()
            }),
            "{}",
            plan.render_text()
        );
        assert!(!plan.landlock.read.iter().any(|p| p.contains("preimages")));
    }

    /// Red-team, stop 55: a session directory under `planes/` granted
    /// whole let a pre-image store made later (a commit of that session
    /// while this turn ran) be read — a forbidden file's old content. The
    /// session directories are granted child by child: `ledger/` is, a
    /// `preimages/` made after the plan is not.
    #[test]
    fn a_session_directory_under_planes_is_granted_child_by_child() {
        let mut fs = tree();
        for (p, k) in [
            ("/ws/planes/ho1", FileKind::Dir),
            ("/ws/planes/ho1/sessions", FileKind::Dir),
            ("/ws/planes/ho1/sessions/S2", FileKind::Dir),
            ("/ws/planes/ho1/sessions/S2/ledger", FileKind::Dir),
        ] {
            fs.kinds.insert(p.into(), k);
        }
        let m = r#"{"capabilities":{"read":["installed/p/**","planes/**"],
            "execute":["installed/p/run.sh"]}}"#;
        let plan = compile_for(m, &["installed/p/run.sh"], &fs).unwrap();
        let read = &plan.landlock.read;
        assert!(
            read.contains(&"/ws/planes/ho1/sessions/S2/ledger".to_owned()),
            "{read:?}"
        );
        for whole in [
            "/ws/planes",
            "/ws/planes/ho1/sessions",
            "/ws/planes/ho1/sessions/S2",
        ] {
            assert!(!read.contains(&whole.to_owned()), "{whole}: {read:?}");
        }
    }

    fn shown(plan: &Plan) -> Vec<String> {
        plan.mounts
            .iter()
            .filter_map(|m| match m {
                Mount::ReadOnly { path } => Some(format!("ro {path}")),
                Mount::Dir { path } => Some(format!("dir {path}")),
                Mount::Overlay { path, .. } => Some(format!("rw {path}")),
                Mount::Symlink { path, target } => Some(format!("ln {path} -> {target}")),
                _ => None,
            })
            .filter(|m| m.contains("/ws"))
            .collect()
    }

    #[test]
    fn issue_9_the_view_holds_what_the_grants_name_parents_first() {
        let plan = compile_for(MANIFEST, &["installed/p/run.sh"], &tree()).unwrap();
        assert_eq!(
            shown(&plan),
            vec![
                "dir /ws".to_owned(),
                "ro /ws/data".into(),
                "ro /ws/installed/p".into(),
                format!("rw /ws/output/{SID}"),
                format!("rw /ws/reports/{SID}"),
                format!("rw /ws/tmp/{SID}"),
            ]
        );
        // `**` shows the root whole (the ledgers then masked), scopes on top.
        let m = r#"{"capabilities":{"read":["**"],"execute":["installed/p/run.sh"]}}"#;
        let plan = compile_for(m, &["installed/p/run.sh"], &tree()).unwrap();
        assert_eq!(
            shown(&plan),
            vec![
                "ro /ws".to_owned(),
                format!("rw /ws/output/{SID}"),
                format!("rw /ws/tmp/{SID}"),
            ]
        );
        assert!(plan.mounts.contains(&Mount::MaskDir {
            path: "/ws/planes".into(),
            reason: "reserved (ledgers)".into()
        }));
        // Every directory of the view lists; /dev/pts and /proc are
        // writable in place; hosts resolve the sandbox's name.
        assert_eq!(plan.landlock.list, vec!["/"]);
        assert!(plan.landlock.devices.contains(&"/dev/pts".to_owned()));
        assert!(plan.mounts.iter().any(|m| matches!(m,
            Mount::Generated { path, contents } if path == "/etc/hosts" && contents.contains(HOSTNAME))));
        assert!(plan.mounts.iter().any(|m| matches!(m,
            Mount::Proc { masked, .. } if masked.contains(&"/proc/kcore".to_owned()))));
    }

    #[test]
    fn issue_9_symlinks_in_a_granted_prefix_are_recreated_never_followed() {
        let mut fs = tree();
        fs.kinds.insert("/ws/link".into(), FileKind::Symlink);
        fs.links.insert("/ws/link".into(), "/etc".into());
        let m = r#"{"capabilities":{"read":["link/shadow"],"execute":["installed/p/run.sh"]}}"#;
        let plan = compile_for(m, &["installed/p/run.sh"], &fs).unwrap();
        assert!(shown(&plan).contains(&"ln /ws/link -> /etc".to_owned()));
        assert!(!shown(&plan).iter().any(|s| s.contains("shadow")));
        // `/**` is refused at manifest load (grants::check_pure); the plan
        // compiler refuses it again (PlanError::HostRoot) as defense in depth.
    }

    /// Red-team finding (wave 3): a read hit that is a link to `/` or to
    /// the workspace (or above it) is refused, naming the pattern: its
    /// rule, resolved in the sandbox, would grant the whole view. A link
    /// to a directory beside the workspace is still recreated and granted.
    #[test]
    fn a_read_through_a_link_to_the_root_or_the_workspace_is_refused() {
        // (The fake file system resolves one link, to an absolute target.)
        for target in ["/", "/ws"] {
            let mut fs = tree();
            fs.kinds.insert("/opt".into(), FileKind::Dir);
            fs.kinds.insert("/opt/up".into(), FileKind::Symlink);
            fs.links.insert("/opt/up".into(), target.into());
            fs.kinds.insert("/ws/data/up".into(), FileKind::Symlink);
            fs.links.insert("/ws/data/up".into(), target.into());
            // A link inside a granted directory is harmless (Landlock checks
            // the path it resolves to); one that is itself a hit is not.
            for (pattern, path) in [
                ("/opt/up/**", "/opt/up"),
                ("data/*", "/ws/data/up"),
                ("data/up", "/ws/data/up"),
            ] {
                let m = format!(
                    r#"{{"capabilities":{{"read":["{pattern}"],"execute":["installed/p/run.sh"]}}}}"#
                );
                let err = compile_for(&m, &["installed/p/run.sh"], &fs).unwrap_err();
                let text = err.to_string();
                assert!(
                    text.contains(pattern) && text.contains(path),
                    "{target} {pattern}: {text}"
                );
            }
        }
        // `**` names the workspace root itself (`/ws/`): not a link.
        let m = r#"{"capabilities":{"read":["**"],"execute":["installed/p/run.sh"]}}"#;
        assert!(compile_for(m, &["installed/p/run.sh"], &tree()).is_ok());
        let mut fs = tree();
        fs.kinds.insert("/ws/data/etc".into(), FileKind::Symlink);
        fs.links.insert("/ws/data/etc".into(), "/etc".into());
        let m = r#"{"capabilities":{"read":["data/*"],"execute":["installed/p/run.sh"]}}"#;
        let plan = compile_for(m, &["installed/p/run.sh"], &fs).unwrap();
        assert!(plan.landlock.read.contains(&"/ws/data/etc".to_owned()));
    }

    #[test]
    fn issue_9_execute_under_a_writable_scope_grants_what_the_turn_creates() {
        let m = r#"{"capabilities":{"execute":["installed/p/run.sh","tmp/<session_id>/**","output/<session_id>/bin/*"]}}"#;
        let mut fs = tree();
        fs.kinds.insert(format!("/ws/tmp/{SID}"), FileKind::Dir);
        fs.kinds.insert(format!("/ws/output/{SID}"), FileKind::Dir);
        let plan = compile_for(m, &["installed/p/run.sh"], &fs).unwrap();
        let exe = &plan.landlock.execute;
        assert!(exe.contains(&format!("/ws/tmp/{SID}")), "{exe:?}");
        // bin/ does not exist yet: its nearest existing directory, the scope.
        assert!(exe.contains(&format!("/ws/output/{SID}")), "{exe:?}");
        assert!(!exe.iter().any(|e| e == "/ws/output" || e == "/ws/tmp"));
    }

    #[test]
    fn execute_covers_the_script_its_interpreter_and_the_loader_only() {
        let plan = compile_for(MANIFEST, &["installed/p/run.sh"], &tree()).unwrap();
        assert_eq!(
            plan.landlock.execute,
            vec![
                "/lib64/ld-linux-x86-64.so.2",
                "/usr/bin/python3.11",
                "/ws/installed/p/run.sh"
            ]
        );
        assert_eq!(plan.argv[0], "/ws/installed/p/run.sh");
    }

    #[test]
    fn an_image_rootfs_is_recorded_and_its_symlinked_parents_are_left_out() {
        use FileKind::*;
        // The image's view (what a rooted FsView answers): /etc is a
        // symlink into the image, so /etc/passwd's source would be resolved
        // on the host if it were mounted by path.
        let mut fs = FakeFs::with(&[
            ("/bin", Dir),
            ("/bin/busybox", File),
            ("/etc", Symlink),
            ("/etc/passwd", File),
            ("/ws", Dir),
            ("/ws/installed", Dir),
        ]);
        fs.links.insert("/etc".into(), "/private/etc".into());
        let m = Manifest::from_slice(
            br#"{"capabilities": {"execute": ["/bin/busybox"]}}"#,
            &PackageId::parse("p").unwrap(),
            "m.json".into(),
        )
        .unwrap();
        let req =
            TurnRequest::from_json(br#"{"command": ["/bin/busybox"], "declared_outputs": []}"#)
                .unwrap()
                .bind(&SessionId::parse(SID).unwrap())
                .unwrap();
        let allowed = crate::check::check_turn("/ws", &m, &req).unwrap().unwrap();
        let ctx = PlanContext {
            root: "/ws",
            workspace_owner: (0, 0),
            turn_number: 1,
            host_env: Vec::new(),
            system_root: Some("/images/busybox"),
            foreign_sessions: &[],
        };
        let plan = compile(&ctx, &m, &req, &allowed, &fs).unwrap();
        assert_eq!(plan.system_root.as_deref(), Some("/images/busybox"));
        assert!(plan.mounts.contains(&Mount::SystemReadOnly {
            path: "/bin".into()
        }));
        assert!(
            !plan
                .mounts
                .iter()
                .any(|m| matches!(m, Mount::SystemReadOnly { path } if path == "/etc/passwd"))
        );
        // Without an image the host's Plan serializes as before.
        let host = compile_for(MANIFEST, &["installed/p/run.sh"], &tree()).unwrap();
        assert!(host.system_root.is_none());
        assert!(
            !serde_json::to_string(&host)
                .unwrap()
                .contains("system_root")
        );
    }

    #[test]
    fn writable_scopes_environment_and_baseline() {
        let plan = compile_for(MANIFEST, &["installed/p/run.sh"], &tree()).unwrap();
        assert_eq!(
            plan.writable_scopes,
            vec![
                format!("tmp/{SID}"),
                format!("output/{SID}"),
                format!("reports/{SID}")
            ]
        );
        let env: BTreeMap<_, _> = plan.env.iter().cloned().collect();
        let scratch = format!("/ws/tmp/{SID}");
        for k in ["TMPDIR", "TEMP", "TMP", "HOME"] {
            assert_eq!(env[k], scratch, "{k}");
        }
        assert_eq!(env["PYTHONDONTWRITEBYTECODE"], "1");
        assert_eq!(env["TERM"], "xterm");
        assert!(
            !env.contains_key("SECRET"),
            "only allowlisted host variables pass"
        );
        assert!(plan.mounts.contains(&Mount::Symlink {
            path: "/bin".into(),
            target: "usr/bin".into()
        }));
        assert!(plan.mounts.contains(&Mount::SystemReadOnly {
            path: "/etc/passwd".into()
        }));
        assert_eq!(plan.read_baseline, vec!["/usr", "/bin", "/etc/passwd"]);
        assert_eq!((plan.uid, plan.gid), (NOBODY, NOBODY));
        assert!(
            plan.render_text()
                .contains("mask      /ws/installed/p/secrets (forbidden)")
        );
    }

    /// A host with merged /usr (`/bin` -> `usr/bin`) or without, git in
    /// both `/usr/local/bin` and `/usr/bin`, and a tool reached through a
    /// link in `/usr/local/bin`.
    fn path_tree(merged: bool) -> FakeFs {
        use FileKind::*;
        let mut fs = FakeFs::with(&[
            ("/usr", Dir),
            ("/usr/bin", Dir),
            ("/usr/bin/dash", File),
            ("/usr/bin/sh", Symlink),
            ("/usr/bin/git", File),
            ("/usr/local", Dir),
            ("/usr/local/bin", Dir),
            ("/usr/local/bin/git", File),
            ("/usr/local/bin/tool", Symlink),
            ("/opt", Dir),
            ("/opt/tool", Dir),
            ("/opt/tool/bin", Dir),
            ("/opt/tool/bin/tool", File),
            ("/lib64/ld-linux-x86-64.so.2", File),
            ("/ws", Dir),
        ]);
        fs.links.insert("/usr/bin/sh".into(), "dash".into());
        fs.links
            .insert("/usr/local/bin/tool".into(), "/opt/tool/bin/tool".into());
        if merged {
            fs.kinds.insert("/bin".into(), Symlink);
            fs.links.insert("/bin".into(), "usr/bin".into());
        } else {
            fs.kinds.insert("/bin".into(), Dir);
            fs.kinds.insert("/bin/sh".into(), File);
        }
        fs
    }

    fn path_of(merged: bool, execute: &str, argv0: &str) -> String {
        let fs = path_tree(merged);
        let m = format!(r#"{{"capabilities":{{"read":["/usr/**"],"execute":{execute}}}}}"#);
        let plan = compile_for(&m, &[argv0, "-c", "git --version"], &Memo::new(&fs)).unwrap();
        let env: BTreeMap<_, _> = plan.env.iter().cloned().collect();
        env["PATH"].clone()
    }

    /// Real-software audit: PATH names only the directories the turn may
    /// execute from, in the default order, so a name resolves where it can
    /// run (`/usr/bin/git`, not the visible but unexecutable
    /// `/usr/local/bin/git`).
    #[test]
    fn path_keeps_only_directories_with_an_execute_rule() {
        // `/bin` is `/usr/bin` on a merged-/usr host: it stays.
        assert_eq!(
            path_of(true, r#"["/usr/bin/*"]"#, "/usr/bin/sh"),
            "/usr/bin:/bin"
        );
        // A real `/bin` without a grant does not.
        assert_eq!(
            path_of(false, r#"["/usr/bin/*"]"#, "/usr/bin/sh"),
            "/usr/bin"
        );
        assert_eq!(
            path_of(false, r#"["/usr/bin/*", "/bin/*"]"#, "/bin/sh"),
            "/usr/bin:/bin"
        );
        // Every directory granted: the default, in its order.
        assert_eq!(
            path_of(true, r#"["/usr/local/bin/*", "/usr/bin/*"]"#, "/usr/bin/sh"),
            DEFAULT_PATH.join(":")
        );
        // An ancestor's rule covers the directories below it.
        assert_eq!(
            path_of(false, r#"["/usr/**"]"#, "/usr/bin/sh"),
            "/usr/local/bin:/usr/bin"
        );
    }

    /// A rule on one file in a directory keeps the directory (argv[0] and
    /// literal execute entries included), also where the file is reached
    /// through a link whose target lies elsewhere.
    #[test]
    fn path_keeps_the_directory_of_a_granted_file_and_of_the_link_naming_it() {
        assert_eq!(
            path_of(
                true,
                r#"["/usr/local/bin/git", "/usr/bin/sh"]"#,
                "/usr/bin/sh"
            ),
            DEFAULT_PATH.join(":")
        );
        assert_eq!(
            path_of(false, r#"["/usr/bin/sh"]"#, "/usr/bin/sh"),
            "/usr/bin"
        );
        assert_eq!(
            path_of(false, r#"["/usr/local/bin/tool"]"#, "/usr/local/bin/tool"),
            "/usr/local/bin"
        );
    }

    /// With no directory of the default to execute from, PATH stays the
    /// default: never empty (the working directory to a shell) nor unset.
    #[test]
    fn path_without_any_executable_directory_stays_the_default() {
        assert_eq!(
            path_of(false, r#"["/opt/tool/bin/tool"]"#, "/opt/tool/bin/tool"),
            DEFAULT_PATH.join(":")
        );
    }

    #[test]
    fn missing_executable_is_a_plan_error() {
        let m = r#"{"capabilities":{"execute":["/opt/ghost"]}}"#;
        assert_eq!(
            compile_for(m, &["/opt/ghost"], &tree()).unwrap_err(),
            PlanError::ExecutableMissing("/opt/ghost".into())
        );
    }

    #[test]
    fn the_shape_leaves_out_only_what_follows_from_the_command() {
        let m = r#"{"capabilities":{"read":["data/*.csv"],"execute":["/usr/bin/*"]}}"#;
        let a = compile_for(m, &["/usr/bin/python3", "-c", "1"], &tree()).unwrap();
        let b = compile_for(m, &["/usr/bin/python3.11", "-V"], &tree()).unwrap();
        assert_ne!(a.argv, b.argv);
        assert_eq!(a.shape(), b.shape());
        // A grant that shows one more file is another view.
        let wider = r#"{"capabilities":{"read":["data/*"],"execute":["/usr/bin/*"]}}"#;
        let c = compile_for(wider, &["/usr/bin/python3", "-c", "1"], &tree()).unwrap();
        assert_ne!(a.shape(), c.shape());
        // So is another workspace state: a new file the glob matches.
        let mut fs = tree();
        fs.kinds.insert("/ws/data/c.csv".into(), FileKind::File);
        let d = compile_for(m, &["/usr/bin/python3", "-c", "1"], &fs).unwrap();
        assert_ne!(a.shape(), d.shape());
        // Limits the sandbox is built with are part of it.
        let tight = r#"{"capabilities":{"read":["data/*.csv"],"execute":["/usr/bin/*"]},"limits":{"memory":"64Mi"}}"#;
        let e = compile_for(tight, &["/usr/bin/python3", "-c", "1"], &tree()).unwrap();
        assert_ne!(a.shape(), e.shape());
    }

    /// Issue 29: a warm sandbox's stage is sent only its turn's part; with
    /// the Plan it was built from, that part gives back the turn's whole
    /// Plan, and the shape is exactly the Plan with that part empty.
    #[test]
    fn issue_29_a_turn_part_on_the_built_plan_is_the_turns_plan() {
        let m = r#"{"capabilities":{"read":["data/*.csv"],"execute":["/usr/bin/*"]}}"#;
        let built = compile_for(m, &["/usr/bin/python3", "-c", "1"], &tree()).unwrap();
        let mut turn = compile_for(m, &["/usr/bin/python3.11", "-V"], &tree()).unwrap();
        turn.turn_number = 7;
        turn.stdin = Some("envelope".into());
        turn.limits.timeout_seconds = 5;
        turn.env.push(("X".into(), "1".into()));
        assert_ne!(built, turn);
        assert_eq!(built.with_turn_part(turn.turn_part()), turn);
        assert_eq!(turn.with_turn_part(built.turn_part()), built);
        assert_eq!(turn.with_turn_part(TurnPart::default()), turn.shape());
        let sent = serde_json::to_vec(&turn.turn_part()).unwrap();
        assert!(sent.len() < 1024, "{} bytes", sent.len());
        let back: TurnPart = serde_json::from_slice(&sent).unwrap();
        assert_eq!(built.with_turn_part(back), turn);
        // A field the stage does not know is refused, not dropped.
        let mut v: serde_json::Value = serde_json::from_slice(&sent).unwrap();
        v["mounts"] = serde_json::json!([]);
        assert!(serde_json::from_value::<TurnPart>(v).is_err());
    }

    /// Issue 29: `same_shape` answers what comparing shapes answers, for a
    /// change to any one field of the Plan (each field of the JSON form,
    /// and of its nested objects, changed in turn).
    #[test]
    fn entries_of_a_session_tree_are_attributed_to_their_session() {
        let sid = "SES-20261129T030815684030Z-f0311854d3971558";
        for name in [
            sid.to_owned(),
            format!(".new-{sid}"),
            format!(".{sid}.t3.commit"),
        ] {
            assert_eq!(session_of_entry(&name), sid, "{name}");
        }
        assert_eq!(session_of_entry("notes"), "notes");
    }

    #[test]
    fn issue_29_same_shape_is_comparing_shapes_for_every_field() {
        fn changed(v: &serde_json::Value) -> Option<serde_json::Value> {
            use serde_json::Value;
            Some(match v {
                Value::String(s) => Value::String(format!("{s}x")),
                Value::Number(n) => serde_json::json!(n.as_u64()? + 1),
                Value::Bool(b) => Value::Bool(!b),
                Value::Null => Value::String("x".into()),
                Value::Array(a) if a.is_empty() => serde_json::json!(["x"]),
                Value::Array(a) => Value::Array(a[..a.len() - 1].to_vec()),
                Value::Object(_) => return None,
            })
        }
        let m = r#"{"capabilities":{"read":["data/*.csv"],"write":["out/*"],"execute":["/usr/bin/*"]}}"#;
        let mut a = compile_for(m, &["/usr/bin/python3", "-c", "1"], &tree()).unwrap();
        a.stdin = Some("in".into());
        let base = serde_json::to_value(&a).unwrap();
        let shape = a.shape();
        assert!(a.same_shape(&shape));
        assert!(shape.same_shape(&a));
        assert!(a.same_shape(&a));
        let mut tried = 0;
        let obj = base.as_object().unwrap();
        for (k, v) in obj {
            let nested: Vec<(Option<&String>, &serde_json::Value)> = match v.as_object() {
                Some(o) => o.iter().map(|(n, x)| (Some(n), x)).collect(),
                None => vec![(None, v)],
            };
            for (inner, x) in nested {
                let Some(new) = changed(x) else { continue };
                let mut w = base.clone();
                match inner {
                    Some(n) => w[k][n] = new,
                    None => w[k] = new,
                }
                let Ok(b) = serde_json::from_value::<Plan>(w) else {
                    continue;
                };
                tried += 1;
                assert_eq!(
                    b.same_shape(&a),
                    b.shape() == shape,
                    "field {k}{}",
                    inner.map_or(String::new(), |n| format!(".{n}"))
                );
            }
        }
        assert!(tried > 30, "{tried} fields changed");
    }
}
