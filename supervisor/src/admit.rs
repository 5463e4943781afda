//! Admission: the one path from raw input (root, package, session, request)
//! to a validated turn — shared by `run`, `check` and `plan`, so the three
//! accept and refuse exactly the same input. Everything here is bad input
//! when it fails (exit 2) and nothing here touches the disk.

use std::path::Path;

use turnstile_policy::check::{Allowed, CompiledCapabilities};
use turnstile_policy::request::{BoundRequest, TurnRequest};
use turnstile_policy::{Manifest, PackageId, SessionId, Violations};

use crate::error::Result;
use crate::layout::{StateDir, Workspace};

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
}

/// Parses and binds everything; compiles the capabilities. `session` is
/// the session the turn belongs to (a probe id when it does not exist yet:
/// expansion errors still surface before anything is created).
pub fn admit(input: Input<'_>, session: SessionId) -> Result<Admission> {
    let package = PackageId::parse(input.package)?;
    let workspace = Workspace::open(input.root)?;
    let state = StateDir::open(input.state_dir, &workspace, false)?;
    let manifest = Manifest::load(workspace.root(), &package)?;
    // Entries that can grant nothing on this host (a missing absolute
    // executable, a read of a path that does not exist) are refused here.
    turnstile_policy::grants::check_on_host(
        &manifest.capabilities,
        &manifest.source,
        workspace.root_str(),
        &crate::realfs::HostFs,
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
