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

/// What a path is, as `lstat` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Read-only questions the compiler asks about the host's file system.
pub trait FsView {
    /// `lstat` kind of an absolute path, `None` if it does not exist.
    fn kind(&self, path: &str) -> Option<FileKind>;
    /// Entry names of a directory (empty when unreadable).
    fn list(&self, path: &str) -> Vec<String>;
    /// The path with every symlink resolved (`realpath`).
    fn canonical(&self, path: &str) -> Option<String>;
    /// Target of a symlink.
    fn read_link(&self, path: &str) -> Option<String>;
    /// The first bytes of a file (to find a `#!` interpreter).
    fn head(&self, path: &str, len: usize) -> Vec<u8>;
}

/// One step of the sandbox's mount plan, in order. Paths are absolute paths
/// as the sandbox sees them (the workspace keeps its host path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Mount {
    /// Bind a host path read-only at the same path (`nosuid,nodev`).
    BindReadOnly { path: String },
    /// Recreate a host symlink.
    Symlink { path: String, target: String },
    /// A minimal `/dev`: null, zero, full, random, urandom, tty and the
    /// standard symlinks; a private size-limited `/dev/shm`.
    Dev { shm_bytes: u64 },
    /// A fresh `/proc` for the turn's PID namespace.
    Proc,
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
    /// Read files and list directories.
    pub read: Vec<String>,
    /// Read and write (create, remove, rename, truncate, make dirs).
    pub read_write: Vec<String>,
    /// Execute (plus read) — executables and their interpreters only.
    pub execute: Vec<String>,
    /// Device files that may be read and written but nothing else.
    pub devices: Vec<String>,
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
    #[error("{0} is not supported by the native backend yet")]
    Unsupported(&'static str),
}

/// Host paths bound read-only into every sandbox, when they exist. Symlinks
/// (merged /usr) are recreated as symlinks.
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
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/alternatives",
    "/etc/ssl/certs",
];

/// Dynamic loaders granted execute alongside every executable.
const LOADERS: &[&str] = &[
    "/lib64/ld-linux-x86-64.so.2",
    "/usr/lib64/ld-linux-x86-64.so.2",
    "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
];

/// Devices a turn may use.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// Host environment variables passed through when set.
const ENV_PASSTHROUGH: &[&str] = &["LANG", "LC_ALL", "TZ", "TERM"];

fn join(root: &str, rel: &str) -> String {
    format!("{root}/{rel}")
}

/// Inputs to the compiler besides the manifest and the request.
#[derive(Debug, Clone)]
pub struct PlanContext<'a> {
    pub root: &'a str,
    pub turn_number: u64,
    /// Values of [`ENV_PASSTHROUGH`] variables on the host.
    pub host_env: Vec<(String, String)>,
}

/// Compiles the Plan of one allowed turn.
pub fn compile(
    ctx: &PlanContext<'_>,
    manifest: &Manifest,
    request: &BoundRequest,
    allowed: &Allowed,
    fs: &dyn FsView,
) -> Result<Plan, PlanError> {
    if manifest.network == Network::AllowEgress {
        // Refuse rather than silently run isolated.
        return Err(PlanError::Unsupported("network `allow_egress`"));
    }
    let root = ctx.root;
    let sid = request.session.as_str();
    let caps = &manifest.capabilities;
    let session = &request.session;
    let forbidden =
        PatternSet::compile(&caps.forbidden, session).unwrap_or_else(|_| empty_set(session));

    // --- writable scopes: scratch, session output, each write pattern's
    // static directory.
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

    // --- executables: argv[0] and every execute entry's program, resolved,
    // plus `#!` interpreters and the dynamic loader.
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

    // --- mounts, in order.
    let mut mounts = Vec::new();
    let mut baseline = Vec::new();
    for path in READ_BASELINE {
        match fs.kind(path) {
            Some(FileKind::Symlink) => {
                if let Some(target) = fs.read_link(path) {
                    mounts.push(Mount::Symlink {
                        path: (*path).into(),
                        target,
                    });
                    baseline.push((*path).to_owned());
                }
            }
            Some(FileKind::Dir | FileKind::File) => {
                mounts.push(Mount::BindReadOnly {
                    path: (*path).into(),
                });
                baseline.push((*path).to_owned());
            }
            _ => {}
        }
    }
    mounts.push(Mount::Dev {
        shm_bytes: 64 << 20,
    });
    mounts.push(Mount::Proc);
    mounts.push(Mount::BindReadOnly {
        path: root.to_owned(),
    });
    for (index, scope) in scopes.iter().enumerate() {
        mounts.push(Mount::Overlay {
            path: join(root, scope),
            index,
        });
    }
    // Masks go last so nothing mounted later can uncover them: forbidden
    // paths that exist (under the root and the baseline), and the ledgers
    // unless a read pattern names them.
    let mut masked: Vec<String> = Vec::new();
    let forbidden_roots: Vec<String> = std::iter::once(root.to_owned())
        .chain(
            baseline
                .iter()
                .filter(|b| fs.kind(b) == Some(FileKind::Dir))
                .cloned(),
        )
        .collect();
    for p in &caps.forbidden {
        let start = if p.is_absolute() {
            p.static_prefix(session)
        } else {
            join(root, &p.static_prefix(session))
        };
        if !forbidden_roots.iter().any(|r| {
            start == *r
                || start.starts_with(&format!("{r}/"))
                || r.starts_with(&format!("{start}/"))
        }) {
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
        for hit in enumerate(fs, root, &start, &forbidden)? {
            masked.push(hit);
        }
    }
    let planes = join(root, "planes");
    if fs.kind(&planes) == Some(FileKind::Dir)
        && !caps.read.iter().any(|r| r.as_str().starts_with("planes/"))
    {
        masked.push(planes);
    }
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
        } else {
            "forbidden"
        };
        match fs.kind(path) {
            Some(FileKind::Dir) => mounts.push(Mount::MaskDir {
                path: path.clone(),
                reason: reason.into(),
            }),
            Some(_) => mounts.push(Mount::MaskFile {
                path: path.clone(),
                reason: reason.into(),
            }),
            None => {}
        }
    }

    // --- Landlock.
    let read_set = PatternSet::compile(&caps.read, session).unwrap_or_else(|_| empty_set(session));
    let mut read: Vec<String> = baseline.iter().filter_map(|b| fs.canonical(b)).collect();
    read.push("/proc".into());
    for p in &caps.read {
        let start = if p.is_absolute() {
            p.static_prefix(session)
        } else {
            join(root, &p.static_prefix(session))
        };
        for hit in enumerate(fs, root, &start, &read_set)? {
            grant_excluding(fs, root, &hit, &forbidden, &masked, &mut read);
        }
    }
    read.sort();
    read.dedup();
    let mut read_write: Vec<String> = scopes.iter().map(|s| join(root, s)).collect();
    read_write.push("/dev/shm".into());

    // --- environment (FR-RT-012, FR-RT-014).
    let scratch = join(root, &format!("tmp/{sid}"));
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), scratch.clone()),
        ("TMPDIR".into(), scratch.clone()),
        ("TEMP".into(), scratch.clone()),
        ("TMP".into(), scratch),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ("TURNSTILE_SESSION_ID".into(), sid.to_owned()),
        ("TURNSTILE_TURN".into(), ctx.turn_number.to_string()),
    ];
    for (k, v) in &ctx.host_env {
        if ENV_PASSTHROUGH.contains(&k.as_str()) {
            env.push((k.clone(), v.clone()));
        }
    }

    let l = &manifest.limits;
    let timeout = request
        .timeout_seconds
        .unwrap_or(l.timeout_seconds)
        .min(l.timeout_seconds);
    let mut argv = request.command.clone();
    argv[0] = program_abs;
    Ok(Plan {
        session_id: sid.to_owned(),
        turn_number: ctx.turn_number,
        package_id: manifest.package_id.to_string(),
        root: root.to_owned(),
        argv,
        execute_entry: allowed.execute_entry.clone(),
        cwd: root.to_owned(),
        env,
        uid: NOBODY,
        gid: NOBODY,
        namespaces: ["mount", "pid", "ipc", "uts", "net", "cgroup"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        read_baseline: baseline,
        mounts,
        writable_scopes: scopes,
        landlock: LandlockRules {
            abi: LANDLOCK_ABI,
            read,
            read_write,
            execute,
            devices: DEVICES.iter().map(|d| (*d).to_owned()).collect(),
        },
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
        network: match manifest.network {
            Network::Isolated => "isolated".into(),
            Network::AllowEgress => "allow_egress".into(),
        },
    })
}

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

/// Grants `path` — unless a forbidden or masked path lies beneath it, in
/// which case its children are granted instead, around the forbidden ones
/// (Landlock is hierarchical: a grant on a parent would cover them).
fn grant_excluding(
    fs: &dyn FsView,
    root: &str,
    path: &str,
    forbidden: &PatternSet,
    masked: &[String],
    out: &mut Vec<String>,
) {
    if forbidden.matching(&Target::new(root, path)).is_some() || masked.iter().any(|m| m == path) {
        return;
    }
    let contains_forbidden = masked.iter().any(|m| m.starts_with(&format!("{path}/")));
    if !contains_forbidden {
        out.push(path.to_owned());
        return;
    }
    for name in fs.list(path) {
        grant_excluding(fs, root, &format!("{path}/{name}"), forbidden, masked, out);
    }
}

impl Plan {
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
            "identity:  uid {} gid {}, no capabilities, no_new_privs\n",
            self.uid, self.gid
        );
        s += &format!("namespaces: {}\n", self.namespaces.join(", "));
        s += &format!("network:   {}\n", self.network);
        s += "mounts (in order):\n";
        for m in &self.mounts {
            let line = match m {
                Mount::BindReadOnly { path } => format!("bind ro   {path}"),
                Mount::Symlink { path, target } => format!("symlink   {path} -> {target}"),
                Mount::Dev { shm_bytes } => {
                    format!("dev       minimal /dev, /dev/shm {} MiB", shm_bytes >> 20)
                }
                Mount::Proc => "proc      /proc (own pid namespace)".into(),
                Mount::Overlay { path, .. } => format!("overlay   {path} (writes captured)"),
                Mount::MaskDir { path, reason } | Mount::MaskFile { path, reason } => {
                    format!("mask      {path} ({reason})")
                }
            };
            s += &format!("  {line}\n");
        }
        s += &format!("landlock (ABI {}):\n", self.landlock.abi);
        for (label, list) in [
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

    fn compile_for(manifest: &str, command: &[&str], fs: &FakeFs) -> Result<Plan, PlanError> {
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
            turn_number: 1,
            host_env: vec![
                ("TERM".into(), "xterm".into()),
                ("SECRET".into(), "x".into()),
            ],
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
        // Ledgers are masked when no read pattern names them.
        assert!(
            plan.mounts
                .iter()
                .any(|m| matches!(m, Mount::MaskDir { path, .. } if path == "/ws/planes"))
        );
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
        assert!(plan.mounts.contains(&Mount::BindReadOnly {
            path: "/etc/passwd".into()
        }));
        assert_eq!(plan.read_baseline, vec!["/usr", "/bin", "/etc/passwd"]);
        assert_eq!((plan.uid, plan.gid), (NOBODY, NOBODY));
        assert!(
            plan.render_text()
                .contains("mask      /ws/installed/p/secrets (forbidden)")
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
}
