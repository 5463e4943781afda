//! Admission: the one path from raw input (root, package, session, request)
//! to a validated turn — shared by `run`, `check` and `plan`, so the three
//! accept and refuse exactly the same input. Everything here is bad input
//! when it fails (exit 2) and nothing here touches the disk.

use std::path::Path;

use turnstile_policy::check::{Allowed, CompiledCapabilities};
use turnstile_policy::request::{BoundRequest, TurnRequest};
use turnstile_policy::{Manifest, PackageId, SessionId, Violations};

use crate::error::Result;
use crate::store::layout::{StateDir, Workspace};

/// A request admitted for one package of one workspace, bound to a session
/// id (the real one, or a probe until the session exists).
#[derive(Debug)]
pub struct Admission {
    pub package: PackageId,
    pub workspace: Workspace,
    pub state: StateDir,
    pub manifest: Manifest,
    pub session: SessionId,
    pub request: BoundRequest,
    pub capabilities: CompiledCapabilities,
}

/// What to admit.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub root: &'a Path,
    pub state_dir: &'a Path,
    pub package: &'a str,
    pub request: &'a TurnRequest,
    /// An image rootfs as the turn's system view (`--rootfs`): absolute
    /// manifest entries are checked against it instead of the host.
    pub system_root: Option<&'a Path>,
    /// Used instead of the installed manifest (`supervise learn`).
    pub manifest: Option<&'a Manifest>,
}

/// Parses and binds everything; compiles the capabilities. `session` is
/// the session the turn belongs to (a probe id when it does not exist yet:
/// expansion errors still surface before anything is created).
pub fn admit(input: Input<'_>, session: SessionId) -> Result<Admission> {
    let package = PackageId::parse(input.package)?;
    let workspace = Workspace::open(input.root)?;
    let state = StateDir::open(input.state_dir, &workspace, false)?;
    let manifest = match input.manifest {
        Some(m) => m.clone(),
        None => Manifest::load(workspace.root(), &package)?,
    };
    // Entries that can grant nothing on this host (a missing absolute
    // executable, a read of a path that does not exist) are refused here.
    let rooted = input
        .system_root
        .map(|image| crate::turn::realfs::RootedFs::new(image, workspace.root_str()));
    let view: &dyn turnstile_policy::plan::FsView = match &rooted {
        Some(r) => r,
        None => &crate::turn::realfs::HostFs,
    };
    turnstile_policy::grants::check_on_host(
        &manifest.capabilities,
        &manifest.source,
        workspace.root_str(),
        view,
    )?;
    let request = input.request.bind(&session)?;
    let capabilities = CompiledCapabilities::compile(workspace.root_str(), &manifest, &request)?;
    Ok(Admission {
        package,
        workspace,
        state,
        manifest,
        session,
        request,
        capabilities,
    })
}

impl Admission {
    /// Re-binds the request to the session that now exists.
    pub fn rebind(&mut self, raw: &TurnRequest, session: SessionId) -> Result<()> {
        // Admitted for this session already (`--session`): nothing to redo.
        if session == self.session {
            return Ok(());
        }
        self.request = raw.bind(&session)?;
        self.capabilities = CompiledCapabilities::compile(
            self.workspace.root_str(),
            &self.manifest,
            &self.request,
        )?;
        self.session = session;
        Ok(())
    }

    /// The pre-execution check (FR-RT-001/002/013).
    pub fn check(&self) -> Result<Allowed, Violations> {
        self.capabilities.check(&self.request)
    }
}

/// An id for a session that does not exist yet (never written anywhere).
pub fn probe_session() -> SessionId {
    SessionId::from_parts(time::OffsetDateTime::UNIX_EPOCH, 0)
}

/// `--rootfs DIR`: an existing directory, absolute after resolution, that
/// is neither the host's `/` nor inside or around the workspace (bad input,
/// exit 2, naming the flag).
pub fn system_root(dir: &Path, workspace_root: &Path) -> Result<std::path::PathBuf> {
    let bad = |why: String| crate::error::SupervisorError::invalid("--rootfs", why);
    let canon = std::fs::canonicalize(dir).map_err(|e| bad(format!("{}: {e}", dir.display())))?;
    if !canon.is_dir() {
        return Err(bad(format!("{} is not a directory", canon.display())));
    }
    if canon == Path::new("/") {
        return Err(bad(
            "the host's / is the default system view; give an image rootfs".into(),
        ));
    }
    let ws = std::fs::canonicalize(workspace_root).unwrap_or_else(|_| workspace_root.to_path_buf());
    if canon.starts_with(&ws) || ws.starts_with(&canon) {
        return Err(bad(format!(
            "{} overlaps the workspace {}; the image rootfs must be apart from it",
            canon.display(),
            ws.display()
        )));
    }
    Ok(canon)
}
