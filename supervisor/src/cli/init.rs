//! `supervise init`: a new workspace (or a new package in an existing one)
//! with a manifest that runs as it is — the first thing a newcomer types.
//!
//! It owns only the files it creates: it never overwrites a package, never
//! replaces a file under `data/`, and writes nothing under `planes/`, `tmp/`
//! or `output/` (sessions create those). The manifest it writes is parsed
//! back with the policy crate's loader before it reports success, so what
//! `init` prints is always a package `supervise run` accepts.

use std::io::Write;
use std::path::{Path, PathBuf};

use turnstile_policy::{Manifest, PackageId};

use crate::error::{Result, SupervisorError};
use crate::turn::outcome::Outcome;

/// The demo's sample input, in `data/` (created only when missing).
const SAMPLE_CSV: &str = "\
name,team,commits
ada,compiler,42
grace,runtime,17
linus,kernel,99
";

/// The demo program: reads every file under `data/`, writes one summary
/// under `output/<session_id>/`. Standard library only.
const MAIN_PY: &str = r#""""The demo agent `supervise init` writes.

Reads every file under data/ (the manifest grants `data/**`) and writes
output/<session_id>/summary.txt (the manifest grants
`output/<session_id>/**`; the turn's session id is TURNSTILE_SESSION_ID).
"""
import hashlib
import os

session = os.environ["TURNSTILE_SESSION_ID"]
lines = []
for top, dirs, files in os.walk("data"):
    dirs.sort()
    for name in sorted(files):
        path = os.path.join(top, name)
        with open(path, "rb") as f:
            body = f.read()
        digest = hashlib.sha256(body).hexdigest()
        count = body.count(b"\n")
        lines.append(f"{path}: {count} lines, sha256 {digest}")
out = os.path.join("output", session, "summary.txt")
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"wrote {out} ({len(lines)} file(s) summarized)")
"#;

/// The manifest, field by field as README "Start a workspace" explains.
fn manifest_text(id: &PackageId) -> String {
    format!(
        r#"{{
  "package_id": "{id}",
  "version": "0.1.0",
  "trust_level": "standard",
  "capabilities": {{
    "read": ["installed/{id}/**", "data/**"],
    "write": ["output/<session_id>/**"],
    "execute": ["/usr/bin/python3 installed/{id}/main.py"],
    "forbidden": ["data/private/**"]
  }},
  "limits": {{"memory": "256Mi", "cpu": "1", "pids": 64, "timeout_seconds": 60}},
  "network": "isolated"
}}
"#
    )
}

/// What `init` did (`--json`).
#[derive(Debug, serde::Serialize)]
pub struct InitReport {
    pub root: PathBuf,
    pub package: String,
    pub manifest: PathBuf,
    /// Files created, relative to the root (existing ones are kept).
    pub created: Vec<String>,
    /// The first turn to try, as argv.
    pub try_run: Vec<String>,
}

/// `supervise init --root DIR --package ID`.
pub fn init(root: &Path, package: &str, json: bool) -> Result<Outcome> {
    let id = PackageId::parse(package)?;
    let manifest = Manifest::path(root, &id);
    // Refuse before anything is created: an existing package (or anything
    // at its manifest's path, a dangling symlink included) is never touched.
    if manifest.symlink_metadata().is_ok() {
        return Err(SupervisorError::invalid(
            "--package",
            format!(
                "{}: package `{id}` already exists; init never overwrites a package (choose another id or edit it)",
                manifest.display()
            ),
        ));
    }
    if root.exists() && !root.is_dir() {
        return Err(SupervisorError::invalid(
            "--root",
            format!("{} exists and is not a directory", root.display()),
        ));
    }
    let io = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| SupervisorError::StateIo { op, path, source }
    };
    std::fs::create_dir_all(root).map_err(io("create workspace root", root))?;
    let root = std::fs::canonicalize(root).map_err(io("resolve workspace root", root))?;
    // The workspace as every other command opens it (refuses `/`).
    crate::store::layout::Workspace::open(&root)?;
    let pkg_dir = root.join("installed").join(id.as_str());
    let mut created = Vec::new();
    let mut create = |rel: String, body: &str| -> Result<()> {
        let path = root.join(&rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io("create directory", dir))?;
        }
        // create_new: a file that appeared meanwhile is kept, not replaced.
        match std::fs::File::create_new(&path) {
            Ok(mut f) => {
                f.write_all(body.as_bytes())
                    .and_then(|()| f.sync_all())
                    .map_err(io("write", &path))?;
                created.push(rel);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(io("create", &path)(e)),
        }
    };
    create(format!("installed/{id}/main.py"), MAIN_PY)?;
    create("data/sample.csv".into(), SAMPLE_CSV)?;
    // The manifest last: a package exists only once it is complete.
    create(format!("installed/{id}/manifest.json"), &manifest_text(&id))?;
    // What we wrote must load exactly as `run` will load it.
    Manifest::load(&root, &id)?;
    let try_run: Vec<String> = [
        "supervise",
        "run",
        "--root",
        &root.display().to_string(),
        "--package",
        id.as_str(),
        "--input",
        "data/sample.csv",
        "--output",
        "output/<session_id>/summary.txt:report",
        "--",
        "/usr/bin/python3",
        &format!("installed/{id}/main.py"),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let report = InitReport {
        root: root.clone(),
        package: id.to_string(),
        manifest: pkg_dir.join("manifest.json"),
        created,
        try_run,
    };
    let stdout = if json {
        format!("{}\n", serde_json::to_string(&report).unwrap_or_default())
    } else {
        let mut t = format!(
            "package `{id}` installed in {}\ncreated: {}\nnext, as root:\n  {}\n",
            root.display(),
            report.created.join(", "),
            shell_words::join(&report.try_run)
        );
        t.push_str(
            "(on a kernel older than Landlock ABI 6, e.g. Debian's 6.1, add \"allow_degraded\": [\"landlock\"] to the manifest; see README)\n",
        );
        t
    };
    Ok(Outcome::ok(stdout))
}

/// The man page of `supervise` (roff), from the same clap definition as
/// `--help`.
pub fn man_page() -> Result<Vec<u8>> {
    use clap::CommandFactory;
    let mut out = Vec::new();
    clap_mangen::Man::new(super::Cli::command())
        .render(&mut out)
        .map_err(|source| SupervisorError::StateIo {
            op: "render man page",
            path: PathBuf::new(),
            source,
        })?;
    Ok(out)
}

/// The completion script of `supervise` for `shell`.
pub fn completions(shell: clap_complete::Shell) -> Vec<u8> {
    use clap::CommandFactory;
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut super::Cli::command(), "supervise", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_written_loads_for_any_valid_id() {
        for id in ["demo", "a.b_c-1", "X"] {
            let id = PackageId::parse(id).unwrap();
            let text = manifest_text(&id);
            Manifest::from_slice(text.as_bytes(), &id, "m.json".into()).unwrap();
        }
    }

    #[test]
    fn completions_and_man_page_name_the_binary() {
        let bash = String::from_utf8(completions(clap_complete::Shell::Bash)).unwrap();
        assert!(bash.contains("supervise"), "{bash}");
        let man = String::from_utf8(man_page().unwrap()).unwrap();
        assert!(man.contains(".TH supervise"), "{man}");
    }
}
