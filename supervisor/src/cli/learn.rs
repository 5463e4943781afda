//! `supervise learn` (issue 27): runs a command in a turn whose read and
//! execute view is wide (the workspace, the host's usual system
//! directories) but still isolated (no network, writes captured, nothing
//! committed), observes what it reads, executes and writes (the BPF
//! observer in learn mode: successful operations too, every exec), and
//! prints the smallest manifest `capabilities` that would let it run.
//! Secret-looking paths are flagged for `forbidden`, never granted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;
use turnstile_policy::request::{RequestDoc, TurnRequest};
use turnstile_policy::{Manifest, PackageId};

use super::{Common, Outcome, to_json};
use crate::error::{Result, SupervisorError};
use crate::sandbox::observe::{self, RawDenial};
use crate::store::record::TurnReport;

#[derive(Debug, Args)]
pub struct LearnArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, value_name = "PKG")]
    pub package: String,
    /// Compare with the package's installed manifest and print the diff.
    #[arg(long)]
    pub merge: bool,
    /// Seconds the command may run (default: the manifest's, or 600).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// The command and its arguments.
    #[arg(last = true, value_name = "CMD", required = true)]
    pub command: Vec<String>,
}

/// System directories the learning turn may read (besides the read
/// baseline every turn has), where they exist.
const WIDE_READ: &[&str] = &["/etc", "/opt", "/usr/local", "/var/lib", "/srv"];
/// Where the learning turn may execute from.
const WIDE_EXEC: &[&str] = &["/usr", "/bin", "/sbin", "/opt", "/lib", "/lib64"];
/// The execute entry for what a turn runs from its own scratch.
const SCRATCH_EXEC: &str = "tmp/<session_id>/**";
/// The turn's own directories: never in a manifest.
const OWN: &[&str] = &["/tmp", "/var/tmp", "/dev", "/proc", "/sys", "/run"];

/// What `learn` proposes.
#[derive(Debug, Default, Serialize)]
pub struct Learned {
    pub capabilities: Caps,
    /// Secret-looking paths the command touched: proposed for `forbidden`,
    /// granted nowhere. Check them.
    pub flagged_secrets: Vec<String>,
    /// Writes no manifest entry may allow (outside the workspace).
    pub ungrantable_writes: Vec<String>,
    /// The learning turn's session and status.
    pub session_id: String,
    pub status: String,
    /// Operations observed (distinct).
    pub observed: usize,
    /// Operations lost (over the per-turn bound or a full ring buffer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<Vec<String>>,
}

#[derive(Debug, Default, Serialize, Clone, PartialEq, Eq)]
pub struct Caps {
    pub read: Vec<String>,
    pub write: Vec<String>,
    pub execute: Vec<String>,
    pub forbidden: Vec<String>,
}

/// Whether `path` looks like a secret (keys, credentials, env files).
pub fn secret_looking(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    let dirs = [".ssh", ".gnupg", ".aws", ".kube", ".docker"];
    // Public trust anchors end in .pem too: the CA bundle (`cert.pem`),
    // anything in a `certs` or `ca-certificates` directory.
    let public_ca = name == "cert.pem"
        || path
            .split('/')
            .any(|c| c == "certs" || c == "ca-certificates");
    // The host's password and sudo databases (`su` reads them).
    let system = [
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/shadow-",
        "/etc/gshadow-",
        "/etc/sudoers",
    ];
    system.contains(&path)
        || path.starts_with("/etc/sudoers.d/")
        || path.split('/').any(|c| dirs.contains(&c))
        || name.ends_with(".pem") && !public_ca
        || name.ends_with(".key")
        || name == ".env"
        || name.starts_with(".env.")
        || name.starts_with("id_rsa")
        || name.starts_with("id_ed25519")
        || name == ".netrc"
        || name == ".git-credentials"
        || name == "credentials"
}

fn under(path: &str, dir: &str) -> bool {
    path == dir || path.starts_with(&format!("{dir}/"))
}

/// Collapses paths: a directory holding two or more of them becomes
/// `dir/**` (a system directory only below its second level, so never
/// `/etc/**`); patterns covered by another are dropped.
pub fn collapse(paths: &BTreeSet<String>, absolute: bool) -> Vec<String> {
    let mut by_parent: BTreeMap<String, usize> = BTreeMap::new();
    for p in paths {
        if let Some((parent, _)) = p.rsplit_once('/') {
            *by_parent.entry(parent.to_owned()).or_default() += 1;
        }
    }
    let deep_enough = |dir: &str| {
        if absolute {
            dir.matches('/').count() >= 2
        } else {
            !dir.is_empty()
        }
    };
    // The shallowest collapsed ancestor of each path wins.
    let collapsed: BTreeSet<String> = by_parent
        .iter()
        .filter(|(d, n)| **n >= 2 && deep_enough(d))
        .map(|(d, _)| d.clone())
        .collect();
    let mut out: BTreeSet<String> = BTreeSet::new();
    for p in paths {
        let dir = collapsed
            .iter()
            .filter(|d| under(p, d))
            .min_by_key(|d| d.len());
        out.insert(match dir {
            Some(d) => format!("{d}/**"),
            None => p.clone(),
        });
    }
    // Drop what a `dir/**` already covers.
    let globs: Vec<String> = out
        .iter()
        .filter_map(|p| p.strip_suffix("/**").map(str::to_owned))
        .collect();
    out.into_iter()
        .filter(|p| {
            let bare = p.strip_suffix("/**").unwrap_or(p);
            !globs.iter().any(|g| g != bare && under(bare, g))
        })
        .collect()
}

fn wide_manifest(
    root: &Path,
    package: &PackageId,
    argv0: &str,
    existing: Option<&Manifest>,
    timeout: Option<u64>,
) -> Result<Manifest> {
    let exists = |p: &&&str| Path::new(p).exists();
    let mut read: Vec<String> = vec!["**".into()];
    read.extend(WIDE_READ.iter().filter(exists).map(|d| format!("{d}/**")));
    // Its own scratch too: what a program builds or unpacks there (a
    // venv's entry points, npx's packages) runs, and is proposed.
    let mut execute: Vec<String> = vec![argv0.to_owned(), SCRATCH_EXEC.to_owned()];
    execute.extend(
        WIDE_EXEC
            .iter()
            .filter(exists)
            .filter(|d| std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir()))
            .map(|d| format!("{d}/**")),
    );
    // Writable: every top-level directory of the workspace but the
    // reserved ones (writes are captured; nothing is committed) and the
    // session trees (the turn's own `tmp/<sid>` and `output/<sid>` are
    // always writable; the rest are other sessions').
    let mut write = Vec::new();
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if ["planes", "installed"].contains(&name.as_str())
            || turnstile_policy::pattern::SESSION_TREES.contains(&name.as_str())
            || name.starts_with('.') && name.len() == 1
        {
            continue;
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            write.push(format!("{name}/**"));
        }
    }
    let timeout = timeout
        .or_else(|| existing.map(|m| m.limits.timeout_seconds))
        .unwrap_or(600);
    let doc = serde_json::json!({
        "package_id": package.as_str(),
        "capabilities": {"read": read, "write": write, "execute": execute},
        "limits": {"timeout_seconds": timeout},
        "network": "isolated",
        // A kernel whose Landlock lacks rights (6.1: ABI 2) may still be
        // learnt on: the wide view already grants the reads Landlock would
        // narrow, the network is isolated and nothing is committed. The
        // turn's evidence records the degradation; the learned manifest
        // carries none (the package's own choice).
        "allow_degraded": ["landlock"],
    });
    let bytes = serde_json::to_vec(&doc)
        .map_err(|e| SupervisorError::invalid("--package", e.to_string()))?;
    Ok(Manifest::from_slice(
        &bytes,
        package,
        PathBuf::from("(supervise learn's wide manifest)"),
    )?)
}

/// Runs `supervise learn`.
pub fn learn(a: &LearnArgs) -> Result<Outcome> {
    let package = PackageId::parse(&a.package)?;
    let root = std::fs::canonicalize(&a.common.root)
        .map_err(|e| SupervisorError::invalid("--root", e.to_string()))?;
    let root_s = root.to_string_lossy().trim_end_matches('/').to_owned();
    let existing = Manifest::load(&root, &package).ok();
    if a.merge && existing.is_none() {
        return Err(SupervisorError::invalid(
            "--merge",
            format!("package `{package}` has no installed manifest to merge with"),
        ));
    }
    let argv0 = a.command.first().cloned().unwrap_or_default();
    let argv0 = if argv0.contains('/') {
        argv0
    } else {
        ["/usr/bin", "/bin", "/usr/local/bin"]
            .iter()
            .map(|d| format!("{d}/{argv0}"))
            .find(|p| Path::new(p).is_file())
            .ok_or_else(|| {
                SupervisorError::invalid(
                    "CMD",
                    format!("`{argv0}` is not in /usr/bin, /bin or /usr/local/bin; give its path"),
                )
            })?
    };
    observe::get().map_err(|why| SupervisorError::ObserverUnavailable { why })?;
    observe::set_learning();
    let manifest = wide_manifest(&root, &package, &argv0, existing.as_ref(), a.timeout)?;
    let mut command = a.command.clone();
    command[0] = argv0.clone();
    let request = TurnRequest::from_doc(RequestDoc {
        command: Some(command),
        declared_inputs: Vec::new(),
        declared_outputs: Some(Vec::new()),
        work_order_id: None,
        idempotency_key: None,
        timeout_seconds: None,
    })?;
    let opts = crate::turn::RunOptions {
        forward_all_output: false,
        on_durable: None,
        root: root.clone(),
        state_dir: a.common.state_dir.clone(),
        package: a.package.clone(),
        session: None,
        request,
        json: true,
        cgroup_place: crate::sandbox::cgroup::Place::host(),
        sources: crate::ids::Sources::system(),
        backend: Some("native".into()),
        tenant: None,
        pool: None,
        between: None,
        interrupts: crate::turn::interrupt::Interrupts::default(),
        config: PathBuf::from(crate::backend::select::DEFAULT_CONFIG),
        deterministic: None,
        rootfs: None,
        manifest: Some(manifest),
        receive: None,
    };
    let result = crate::turn::run_turn(&opts)?;
    let report: Option<TurnReport> = serde_json::from_value(result.value.clone()).ok();
    let ops = observe::take_learned();
    let mut learned = propose(&ops, &root_s, report.as_ref());
    learned.session_id = report
        .as_ref()
        .map(|r| r.session_id.clone())
        .unwrap_or_default();
    learned.status = report
        .as_ref()
        .map(|r| r.status.as_str().to_owned())
        .unwrap_or_default();
    if let Some(m) = existing.as_ref().filter(|_| a.merge) {
        learned.diff = Some(diff(m, &learned.capabilities));
    }
    if a.common.json {
        return Ok(Outcome::ok(format!("{}\n", to_json(&learned))));
    }
    let mut text = format!(
        "learned from turn 1 of {} ({}), {} distinct operations observed\n",
        learned.session_id, learned.status, learned.observed
    );
    match &learned.diff {
        Some(d) if d.is_empty() => {
            text += "the installed manifest already allows everything observed\n"
        }
        Some(d) => {
            text += "changes to the installed manifest's capabilities:\n";
            for l in d {
                text += &format!("{l}\n");
            }
        }
        None => {
            let caps = serde_json::to_string_pretty(
                &serde_json::json!({"capabilities": learned.capabilities}),
            )
            .unwrap_or_default();
            text += &format!("{caps}\n");
        }
    }
    for s in &learned.flagged_secrets {
        text +=
            &format!("flagged: `{s}` looks like a secret: proposed for `forbidden`, not granted\n");
    }
    for w in &learned.ungrantable_writes {
        text += &format!("note: `{w}` was written outside the workspace: no entry may allow it\n");
    }
    Ok(Outcome::ok(text))
}

/// The capabilities the observed operations need.
pub fn propose(ops: &[RawDenial], root: &str, report: Option<&TurnReport>) -> Learned {
    let native = libseccomp::ScmpArch::native();
    let baseline = turnstile_policy::plan::READ_BASELINE;
    let session_tmp = format!("{root}/tmp");
    let (mut reads, mut writes, mut execs) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    let (mut secrets, mut ungrantable) = (BTreeSet::new(), BTreeSet::new());
    let rel =
        |p: &str| -> Option<String> { p.strip_prefix(&format!("{root}/")).map(str::to_owned) };
    for op in ops {
        let name = crate::turn::denials::syscall_of(op.nr, native);
        let kind = crate::turn::denials::operation(&name, op.flags);
        let mut paths = vec![op.path.clone()];
        if kind == "execute" {
            if let Some(i) = op.path2.as_ref().filter(|i| i.starts_with('/')) {
                paths.push(i.clone());
            }
        }
        for path in paths {
            let inside = under(&path, root);
            // A program run from the turn's own scratch needs that one
            // entry, whatever it was called (red-team stop 61).
            if kind == "execute"
                && under(&path, &session_tmp)
                && matches!(op.errno, 0 | nix::libc::EACCES)
            {
                execs.insert(SCRATCH_EXEC.to_owned());
                continue;
            }
            if path == root
                || under(&path, &session_tmp)
                || (!inside && OWN.iter().any(|o| under(&path, o)))
            {
                continue;
            }
            // Another session's directory is never granted: proposing it
            // would teach a manifest another session's (tenant's) paths.
            if inside
                && rel(&path).is_some_and(|r| {
                    r.starts_with("output/") || r.starts_with("planes/") && r.contains("/sessions/")
                })
            {
                continue;
            }
            // A refusal counts only where something real was refused.
            let host = Path::new(&path);
            let real = op.errno == 0
                || op.errno == nix::libc::EROFS
                || op.errno == nix::libc::EACCES
                || (op.errno == nix::libc::ENOENT
                    && kind != "stat"
                    && std::fs::symlink_metadata(host).is_ok());
            if !real {
                continue;
            }
            if secret_looking(&path) {
                secrets.insert(rel(&path).unwrap_or_else(|| path.clone()));
                continue;
            }
            match kind {
                "execute" => {
                    if host.is_file() {
                        execs.insert(path.clone());
                    }
                }
                "read" | "stat" => {
                    // System directories only stat-ed need nothing of their
                    // own, nor listed ones every view holds — `/` and the
                    // directories above the baseline (`/etc`, `/usr`): a
                    // grant there would show all beneath (red-team stop 61:
                    // `ls /` proposed `/`, which no manifest may name). A
                    // workspace directory does (its owner, as git checks it,
                    // is the view's only where it is granted).
                    if host.is_dir()
                        && !inside
                        && (kind == "stat"
                            || path == "/"
                            || baseline.iter().any(|b| under(b, &path)))
                    {
                        continue;
                    }
                    // The ledgers are never a turn's to read.
                    if rel(&path).is_some_and(|r| r == "planes" || r.starts_with("planes/")) {
                        continue;
                    }
                    if baseline.iter().any(|b| under(&path, b)) {
                        continue;
                    }
                    reads.insert(path.clone());
                }
                _ => match rel(&path) {
                    Some(r) if !r.starts_with("planes") && !r.starts_with("installed/") => {
                        writes.insert(r);
                    }
                    Some(_) => {}
                    None => {
                        ungrantable.insert(path.clone());
                    }
                },
            }
        }
    }
    if let Some(r) = report {
        for w in &r.realized_writes {
            if !w.path.starts_with("tmp/") {
                writes.insert(w.path.clone());
            }
        }
    }
    let (ws_reads, sys_reads): (BTreeSet<String>, BTreeSet<String>) = reads
        .iter()
        .map(|p| rel(p).unwrap_or_else(|| p.clone()))
        .partition(|p| !p.starts_with('/'));
    // What is written is read back by most programs: the write grant
    // covers it (writable scopes are readable).
    let ws_reads: BTreeSet<String> = ws_reads
        .into_iter()
        .filter(|r| !writes.contains(r))
        .collect();
    let mut read = collapse(&ws_reads, false);
    read.extend(collapse(&sys_reads, true));
    Learned {
        capabilities: Caps {
            read,
            write: collapse(&writes, false),
            execute: execs.into_iter().collect(),
            forbidden: secrets.iter().cloned().collect(),
        },
        flagged_secrets: secrets.into_iter().collect(),
        ungrantable_writes: ungrantable.into_iter().collect(),
        observed: ops.len(),
        ..Learned::default()
    }
}

/// `+ kind: entry` for what the installed manifest lacks, `- kind: entry`
/// for what it grants that the command never used.
pub fn diff(m: &Manifest, learned: &Caps) -> Vec<String> {
    let have = |v: Vec<String>| -> BTreeSet<String> { v.into_iter().collect() };
    let c = &m.capabilities;
    let pairs = [
        (
            "read",
            have(c.read.iter().map(|p| p.to_string()).collect()),
            &learned.read,
        ),
        (
            "write",
            have(c.write.iter().map(|p| p.to_string()).collect()),
            &learned.write,
        ),
        (
            "execute",
            have(c.execute.iter().map(|e| e.as_str().to_owned()).collect()),
            &learned.execute,
        ),
        (
            "forbidden",
            have(c.forbidden.iter().map(|p| p.to_string()).collect()),
            &learned.forbidden,
        ),
    ];
    let mut out = Vec::new();
    for (kind, installed, wanted) in pairs {
        let wanted: BTreeSet<String> = wanted.iter().cloned().collect();
        for w in wanted.difference(&installed) {
            out.push(format!("+ {kind}: {w}"));
        }
        if kind != "forbidden" {
            for h in installed.difference(&wanted) {
                out.push(format!("- {kind}: {h}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapse_groups_siblings_and_never_widens_to_a_top_level_system_dir() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<BTreeSet<_>>();
        assert_eq!(
            collapse(&s(&["src/a.c", "src/b.c", "README"]), false),
            vec!["README", "src/**"]
        );
        assert_eq!(
            collapse(
                &s(&[".git/HEAD", ".git/config", ".git/objects/ab/cd"]),
                false
            ),
            vec![".git/**"]
        );
        assert_eq!(
            collapse(&s(&["/etc/gitconfig", "/etc/hosts"]), true),
            vec!["/etc/gitconfig", "/etc/hosts"]
        );
        assert_eq!(
            collapse(&s(&["/etc/py/a", "/etc/py/b"]), true),
            vec!["/etc/py/**"]
        );
    }

    #[test]
    fn secrets_are_recognized() {
        for p in [
            "/root/.ssh/id_rsa",
            "k/server.pem",
            ".env",
            "a/.env.local",
            "x.key",
        ] {
            assert!(secret_looking(p), "{p}");
        }
        for p in [
            "src/main.rs",
            "/etc/hosts",
            "environment",
            "/usr/lib/ssl/cert.pem",
            "/etc/ssl/certs/ISRG_Root_X1.pem",
        ] {
            assert!(!secret_looking(p), "{p}");
        }
        // Red-team stop 61: `su` reads these; never proposed for a grant.
        for p in ["/etc/shadow", "/etc/gshadow", "/etc/sudoers"] {
            assert!(secret_looking(p), "{p}");
        }
    }
}
