//! The turn pipeline (DESIGN "The turn pipeline"):
//!
//! validate → compile → pre-execution check → intent entry → sandbox →
//! capture → verify → commit or block → exec + evidence entries.
//!
//! Bad input fails before anything is created. From the intent entry on,
//! every path — setup failure, command failure, limit, timeout, block,
//! commit — ends in one exec and one evidence entry (FR-RT-007, FR-RT-018).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use time::OffsetDateTime;
use turnstile_policy::plan::{self, Plan, PlanContext};
use turnstile_policy::request::{BoundRequest, TurnRequest};
use turnstile_policy::session::{Clock, SessionIdGenerator};
use turnstile_policy::timefmt::rfc3339_micros;
use turnstile_policy::{Manifest, SessionId, canonical};

pub mod admit;
pub mod context;
pub mod denials;
pub mod interrupt;
pub mod outcome;
pub mod realfs;
pub mod receive;
pub mod replay;
pub mod revert;

mod record;

pub use record::record_rejected_turn;
use record::{Outcome, interrupted_message, ledgers};

use crate::backend::Backend;
use crate::error::{Result, SupervisorError};
use crate::ids::{OsRandom, Sources, SystemClock};
use crate::sandbox::{Ending, TurnDir};
use crate::store::capture::{self, Scope};
use crate::store::commit::{self};
use crate::store::evidence::SCHEMA_VERSION;
use crate::store::layout::{StateDir, TURN_TIER, Workspace};
use crate::store::ledger::{LedgerKind, Reached};
use crate::store::record::Phases;
use crate::store::session::{Session, SessionLock};
use crate::store::status::{Ended, Observed, TurnStatus, classify};
use crate::turn::realfs::{HostFs, RootedFs};

/// Everything `supervise run` was asked.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub root: PathBuf,
    pub state_dir: PathBuf,
    pub package: String,
    pub session: Option<String>,
    pub request: TurnRequest,
    pub json: bool,
    pub cgroup_place: crate::sandbox::cgroup::Place,
    /// Clock and randomness (session ids, timestamps).
    pub sources: Sources,
    /// `--backend` (native, runc, crun, runsc, kata); `None`: the
    /// manifest's trust level picks it through `config`'s table.
    pub backend: Option<String>,
    /// `--tenant`: who a new session belongs to (with the package).
    pub tenant: Option<String>,
    /// Where the run registers the turn's cgroup for its interrupt
    /// watcher (the run installs the watcher: see `turn::outcome`).
    pub interrupts: crate::turn::interrupt::Interrupts,
    /// A serve worker's warm pool (`None` for `supervise run`).
    pub pool: Option<std::sync::Arc<crate::sandbox::pool::WarmPool>>,
    /// A serve worker's recovery of its session between turns (`None` for
    /// `supervise run`: it recovers before the turn).
    pub between: Option<std::sync::Arc<crate::recover::Between>>,
    /// The system configuration file (`--config`).
    pub config: PathBuf,
    /// Deterministic mode for the session `run` starts (without --session).
    pub deterministic: Option<crate::ids::Deterministic>,
    /// `--rootfs`: an image rootfs as the turn's system view instead of the
    /// host's (see `Plan::system_root`).
    pub rootfs: Option<PathBuf>,
    /// An ARA `receive` turn (issue 28): the envelope on the agent's stdin,
    /// its stdout read as envelopes.
    pub receive: Option<receive::ReceiveInput>,
    /// A manifest given in place of the package's installed one
    /// (`supervise learn`'s wide one; never written to the workspace).
    pub manifest: Option<turnstile_policy::Manifest>,
    /// `run --forward-all-output` (see `Plan::forward_all_output`).
    pub forward_all_output: bool,
    /// Given the turn's result as soon as it is durable (see [`OnDurable`]).
    pub on_durable: Option<OnDurable>,
}

/// Called with a turn's result once its finish entries are durable —
/// every byte synced, so a crash from then on leaves them for recovery to
/// complete — and before their anchors move, the last `fdatasync` of the
/// append. A serve worker answers its client from it. Not called for a
/// turn that ends before its finish entries (an error), nor for a keyed
/// turn (its idempotency record comes after them). The turn then goes on
/// as always and `run_turn` returns the same result, or an error if the
/// anchors cannot move (the entries stay for recovery, as after a crash).
#[derive(Clone)]
pub struct OnDurable(pub std::sync::Arc<dyn Fn(&TurnResult) + Send + Sync>);

impl OnDurable {
    pub fn call(&self, result: &TurnResult) {
        (self.0)(result)
    }
}

impl std::fmt::Debug for OnDurable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnDurable")
    }
}

pub use crate::store::status::TurnResult;

/// Runs one turn.
pub fn run_turn(opts: &RunOptions) -> Result<TurnResult> {
    let system_root = opts
        .rootfs
        .as_deref()
        .map(|dir| admit::system_root(dir, &opts.root))
        .transpose()?;
    let input = admit::Input {
        root: &opts.root,
        state_dir: &opts.state_dir,
        package: &opts.package,
        request: &opts.request,
        system_root: system_root.as_deref(),
        manifest: opts.manifest.as_ref(),
    };
    let given = opts.session.as_deref().map(SessionId::parse).transpose()?;
    // An unknown backend is refused before anything exists (exit 2).
    let flag = opts
        .backend
        .as_deref()
        .map(str::parse::<crate::backend::BackendKind>)
        .transpose()?;
    // Everything is validated before a session is created for this turn
    // (exit 2 creates nothing).
    let mut admission = admit::admit(input, given.clone().unwrap_or_else(admit::probe_session))?;
    // One selection for the CLI, `serve` and the shim: never weaker than
    // the trust level's minimum (exit 20), never a fallback when the
    // chosen runtime is missing (E2040); nothing exists yet.
    let choice =
        crate::backend::select::choose(flag, admission.manifest.trust_level, &opts.config)?;
    let backend = crate::backend::by_name(
        choice.backend,
        &opts.cgroup_place,
        opts.json,
        opts.pool.clone(),
    )?;
    // A layer the backend cannot enforce refuses the turn (exit 20) unless
    // the manifest accepts running without it; nothing exists yet.
    let allowed_degraded: Vec<String> = admission
        .manifest
        .allow_degraded
        .iter()
        .map(|l| l.as_str().to_owned())
        .collect();
    crate::backend::check_network(backend.as_ref(), &admission.manifest)?;
    crate::backend::check_enforceable(backend.as_ref(), &allowed_degraded)?;
    if opts.receive.is_some() {
        // The input reaches the agent through the native sandbox's init;
        // another backend cannot deliver it: refused, nothing exists yet.
        if backend.name() != "native" {
            return Err(SupervisorError::ReceiveBackend {
                backend: backend.name().to_owned(),
            });
        }
        // Pure by construction: no network whatever the manifest says.
        admission.manifest.network = turnstile_policy::manifest::Network::Isolated;
        admission.manifest.egress.clear();
    }
    if let Some(t) = &opts.tenant {
        crate::store::session::check_tenant("--tenant", t)?;
    }
    let owner = crate::store::session::Owner::for_turn(
        opts.tenant.as_deref(),
        admission.manifest.package_id.as_str(),
    );
    let (session, created_lock) = match &given {
        Some(id) => {
            let session = Session::open(&admission.workspace, &admission.state, id, None)?;
            session.check_owner(&owner, opts.sources.now())?;
            (session, None)
        }
        None => {
            let state = StateDir::open(admission.state.path(), &admission.workspace, true)?;
            crate::store::session::sweep_unfinished(&state, Some(&admission.workspace))?;
            let src = opts
                .deterministic
                .as_ref()
                .map_or_else(|| opts.sources.clone(), |d| d.sources(0));
            let (session, lock) = Session::create_owned(
                &admission.workspace,
                &state,
                TURN_TIER,
                &SessionIdGenerator::new(src.clone(), src),
                opts.deterministic.clone(),
                owner,
            )?;
            (session, Some(lock))
        }
    };
    // Turns of one session are serialized; sessions run concurrently. What
    // a dead supervisor left of this session is settled first.
    // A session this turn created is still locked since before it existed:
    // no other writer has touched it, nothing is left to recover.
    let (lock, recovery) = match created_lock {
        Some(lock) => {
            if let Some(b) = &opts.between {
                b.arm(&session, &opts.cgroup_place, &opts.sources);
            }
            (lock, crate::recover::SessionRecovery::default())
        }
        None => match &opts.between {
            Some(b) => b.lock_for_turn(&session, &opts.cgroup_place, &opts.sources)?,
            None => crate::recover::lock_for_write(&session, &opts.cgroup_place, &opts.sources)?,
        },
    };
    if !recovery.is_empty() {
        tracing::warn!(session_id = %session.id, recovery = %recovery.to_value(), "recovered what a stopped supervisor left");
    }
    admission.rebind(&opts.request, session.id.clone())?;
    admission.workspace.check_session_dirs(&session.id)?;
    let request = &admission.request;
    // A deterministic session's turn takes its clock and ids from the seed.
    let sources = match &session.deterministic {
        Some(d) => d.sources(session.next_turn_number(&lock)?),
        None => opts.sources.clone(),
    };
    // Exactly once: a key that already ran returns what it returned.
    let key = request.idempotency_key.clone();
    let request_hash =
        crate::store::idempotency::request_hash(admission.manifest.package_id.as_str(), request);
    if let Some(key) = &key {
        if let Some(record) = crate::store::idempotency::lookup(&session, &lock, key)? {
            if record.request_hash != request_hash {
                return Err(SupervisorError::IdempotencyConflict {
                    key: key.clone(),
                    turn: record.turn_number,
                    recorded: record.request_hash,
                    given: request_hash,
                });
            }
            // A turn that never began (its supervisor died between the
            // record and the intent entry) runs now: nothing of it happened.
            if record.result.is_some()
                || crate::store::idempotency::began(&session, record.turn_number)?
            {
                return crate::store::idempotency::replay(&session, key, &record);
            }
        }
    }
    let allowed = match admission.check() {
        Ok(a) => a,
        Err(violations) => {
            let turn_number = record_rejected_turn(
                &session,
                &lock,
                request,
                admission.manifest.package_id.as_str(),
                &violations,
                &sources,
            )?;
            let rejected = crate::store::evidence::RejectedTurn {
                request,
                package_id: admission.manifest.package_id.as_str(),
                turn_number,
                violations: &violations,
                at: sources.now(),
            };
            let value = serde_json::to_value(crate::store::record::TurnReport {
                session_id: session.id.to_string(),
                turn_number,
                started_at: None,
                finished_at: None,
                status: TurnStatus::Violation,
                exit_code: None,
                termination: None,
                error: Some(rejected.error()),
                realized_writes: Vec::new(),
                committed: Vec::new(),
                ephemeral_writes: None,
                violations: rejected.violations(),
                enforcement: None,
                resources: None,
                ledgers: Some(ledgers(&session)),
                durations: None,
                replayed: false,
                idempotency_key: None,
                receive: None,
                output: None,
            })
            .unwrap_or_default();
            let result = TurnResult {
                exit_status: TurnStatus::Violation.exit_status(None),
                summary: format!("turn {turn_number}: refused before execution: {violations}"),
                value,
            };
            return finish_key(
                &session,
                &lock,
                key.as_deref(),
                &request_hash,
                turn_number,
                result,
            );
        }
    };
    let turn_number = session.next_turn_number(&lock)?;
    // Admitted: the session changes from here (its turn directory is made
    // beside the intent entry's append), so this holding's stamp stays.
    lock.mark_changed();
    // Durable before the intent entry, so before any effect of the turn.
    if let Some(key) = &key {
        crate::store::idempotency::begin(&session, &lock, key, &request_hash, turn_number)?;
    }
    let result = Turn {
        opts,
        backend,
        choice,
        session: &session,
        lock: &lock,
        request,
        manifest: &admission.manifest,
        workspace: &admission.workspace,
        turn_number,
        execute_entry: allowed.execute_entry.clone(),
        started: Instant::now(),
        started_at: sources.now(),
        sources: sources.clone(),
        system_root: system_root.as_deref().and_then(Path::to_str),
    }
    .run(&allowed)?;
    finish_key(
        &session,
        &lock,
        key.as_deref(),
        &request_hash,
        turn_number,
        result,
    )
}

/// Adds a finished turn's result to its idempotency record, if it has a
/// key (after its finish entries are durable).
fn finish_key(
    session: &Session,
    lock: &crate::store::session::SessionLock,
    key: Option<&str>,
    request_hash: &str,
    turn: u64,
    result: TurnResult,
) -> Result<TurnResult> {
    if let Some(key) = key {
        crate::store::idempotency::finish(session, lock, key, request_hash, turn, &result)?;
    }
    Ok(result)
}

struct Turn<'a> {
    opts: &'a RunOptions,
    backend: Box<dyn Backend>,
    /// How the backend was chosen, and the trust level's minimum.
    choice: crate::backend::select::Choice,
    session: &'a Session,
    lock: &'a SessionLock,
    request: &'a BoundRequest,
    manifest: &'a Manifest,
    workspace: &'a Workspace,
    turn_number: u64,
    execute_entry: String,
    started: Instant,
    started_at: OffsetDateTime,
    /// The turn's clock and ids (the session's deterministic ones, or the
    /// system's).
    sources: Sources,
    /// The image rootfs the system view comes from (`--rootfs`).
    system_root: Option<&'a str>,
}

/// The intent entry being written on its own thread while the sandbox is
/// built. [`Intent::durable`] waits until its bytes are synced — from then
/// on a crash, a power cut included, leaves the entry for recovery to
/// complete, so the turn is visible. [`Intent::written`] waits until they
/// are written (in the page cache; their announcement synced): from then on
/// a crash of this process leaves the entry likewise, and only a power cut
/// in the next fdatasync's time could lose it — the gate of a command that
/// can have no effect but through what the turn captures (see
/// `Turn::run_sandbox`). The anchor's move (the append's last `fdatasync`)
/// overlaps the command's start either way. [`Intent::acknowledged`] waits
/// for the whole append (the gate before anything is committed),
/// [`Intent::finish`] returns how long the turn waited for it (the
/// `intent_entry` phase: the phases stay disjoint parts of the turn's wall
/// time), or why it failed.
struct Intent<'scope> {
    handle: Option<std::thread::ScopedJoinHandle<'scope, Result<()>>>,
    /// Signalled at [`Reached::Written`], then at [`Reached::Durable`].
    reached: std::sync::mpsc::Receiver<Reached>,
    /// How far the append is known to have come.
    seen: Option<Reached>,
    waited_us: u64,
    result: Option<Result<()>>,
}

impl<'scope> Intent<'scope> {
    fn spawn<'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        append: impl FnOnce(&mut dyn FnMut(Reached)) -> Result<()> + Send + 'scope,
    ) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel(2);
        Self {
            handle: Some(scope.spawn(move || {
                append(&mut |r| {
                    let _ = tx.send(r);
                })
            })),
            reached: rx,
            seen: None,
            waited_us: 0,
            result: None,
        }
    }

    fn join(&mut self) -> &Result<()> {
        if let Some(h) = self.handle.take() {
            let waiting = Instant::now();
            let joined = h.join().unwrap_or_else(|_| {
                Err(SupervisorError::Sandbox {
                    step: "intent entry",
                    detail: "the thread writing it panicked".into(),
                    source: None,
                })
            });
            self.waited_us += waiting.elapsed().as_micros() as u64;
            self.result = Some(joined);
        }
        self.result.get_or_insert(Ok(()))
    }

    /// Waits until the append has reached `point`; `false` if it failed
    /// before.
    fn reached(&mut self, point: Reached) -> bool {
        let waiting = Instant::now();
        while self.seen.is_none_or(|s| s < point) {
            match self.reached.recv() {
                Ok(r) => self.seen = Some(r),
                // No more signals: the append ended short of `point`.
                Err(_) => break,
            }
        }
        self.waited_us += waiting.elapsed().as_micros() as u64;
        self.seen.is_some_and(|s| s >= point) || {
            self.join();
            false
        }
    }

    /// Waits until the intent entry is durable; `false` if it failed.
    fn durable(&mut self) -> bool {
        self.reached(Reached::Durable)
    }

    /// Waits until the intent entry is written; `false` if it failed.
    fn written(&mut self) -> bool {
        self.reached(Reached::Written)
    }

    /// Waits until the intent entry is appended whole (its anchor moved);
    /// `false` if it failed.
    fn acknowledged(&mut self) -> bool {
        self.join().is_ok()
    }

    fn finish(mut self) -> Result<u64> {
        self.join();
        let waited = self.waited_us;
        self.result.take().unwrap_or(Ok(())).map(|()| waited)
    }
}

/// Rewrites every string under `v` that is `root` or starts with `root/`
/// to start with `<root>` instead.
fn root_relative(v: &mut Value, root: &str) {
    match v {
        // (No string made to compare: this runs over every string of a
        // Plan, on the intent entry's path.)
        Value::String(s)
            if s.strip_prefix(root)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')) =>
        {
            s.replace_range(..root.len(), "<root>");
        }
        Value::Array(a) => a.iter_mut().for_each(|x| root_relative(x, root)),
        Value::Object(m) => m.values_mut().for_each(|x| root_relative(x, root)),
        _ => {}
    }
}

/// Microseconds since `since`, restarting it.
fn lap(since: &mut Instant) -> u64 {
    let now = Instant::now();
    let us = now.duration_since(*since).as_micros() as u64;
    *since = now;
    us
}

/// The phase a turn is in, as a span (a child of the turn's): entering the
/// next closes the last.
#[derive(Default)]
struct Stage(Option<tracing::span::EnteredSpan>);

impl Stage {
    fn enter(&mut self, phase: &'static str) {
        self.0 = None;
        self.0 =
            Some(tracing::info_span!("phase", phase, "otel.name" = otel_phase(phase)).entered());
    }
}

/// A phase's span name for OpenTelemetry (seed 002 §9.3.3 style: the
/// object, then the operation).
fn otel_phase(phase: &str) -> &'static str {
    match phase {
        "plan" => "turn.plan",
        "prepare" => "sandbox.create",
        "sandbox" => "sandbox.run",
        "capture" => "turn.capture",
        "verify_commit" => "turn.commit",
        "teardown" => "sandbox.delete",
        _ => "turn.phase",
    }
}

impl Turn<'_> {
    fn run(self, allowed: &turnstile_policy::check::Allowed) -> Result<TurnResult> {
        // One span per turn (OpenTelemetry-style names), a child per phase.
        // The attributes seed 002 §9.3 names on `agent.execute` (OTel
        // style: `agent.id`, `agent.trust_level`, `agent.runtime_class`,
        // `session.id`), beside turnstile's own.
        let span = tracing::info_span!(
            "turn",
            turn_id = %crate::ids::TurnId::new(self.session.id.as_str(), self.turn_number),
            backend = self.backend.name(),
            status = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
            "otel.name" = "agent.execute",
            "agent.id" = self.manifest.package_id.as_str(),
            "agent.trust_level" = self.manifest.trust_level.as_str(),
            "agent.runtime_class" = self.backend.name(),
            "session.id" = self.session.id.as_str(),
        );
        let _in_turn = span.enter();
        let started = self.started;
        // `finish` records the status on this span, where it is known.
        let result = self.run_in_span(allowed);
        span.record("duration_ms", started.elapsed().as_secs_f64() * 1000.0);
        result
    }

    /// The sessions in the session trees the read grants reach whose
    /// owner is not this turn's ([`crate::store::session::foreign_to`]):
    /// none looked up for the usual grants, which reach no other session.
    fn foreign_sessions(&self, view: &dyn plan::FsView) -> Vec<String> {
        let trees =
            plan::session_trees_read(self.workspace.root_str(), view, &self.manifest.capabilities);
        let me = crate::store::session::Owner::for_turn(
            self.opts.tenant.as_deref(),
            self.manifest.package_id.as_str(),
        );
        let mut ids: Vec<SessionId> = trees
            .iter()
            .flat_map(|t| view.list(t))
            .filter_map(|name| SessionId::parse(plan::session_of_entry(&name)).ok())
            .filter(|id| *id != self.session.id)
            .collect();
        ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        ids.dedup();
        ids.into_iter()
            .filter(|id| crate::store::session::foreign_to(self.session.state(), id, &me))
            .map(|id| id.to_string())
            .collect()
    }

    /// `plan`, unless its grants reach a session tree and this turn's
    /// backend applies no Landlock: only Landlock's rules keep another
    /// owner's sessions — those there now, and those made while the turn
    /// runs, which no list made now can name — out of the view, so the
    /// turn is refused (red-team, stop 55: under runsc a session tenant a
    /// made during b's turn was read whole).
    fn keeps_other_sessions_out(
        &self,
        plan: plan::Plan,
        view: &dyn plan::FsView,
    ) -> std::result::Result<plan::Plan, plan::PlanError> {
        // A backend that applies no Landlock at all (runsc), not one on a
        // kernel whose Landlock lacks newer rights (6.1: read and execute,
        // which this rests on, are Landlock's first ABI).
        if !self
            .backend
            .not_applied()
            .iter()
            .any(|(layer, _)| *layer == "landlock")
        {
            return Ok(plan);
        }
        let root = self.workspace.root_str();
        match plan::session_trees_read(root, view, &self.manifest.capabilities).first() {
            None => Ok(plan),
            Some(tree) => Err(plan::PlanError::OtherSessionsExposed {
                backend: self.backend.name().to_owned(),
                tree: tree
                    .strip_prefix(&format!("{root}/"))
                    .unwrap_or(tree)
                    .to_owned(),
            }),
        }
    }

    fn run_in_span(self, allowed: &turnstile_policy::check::Allowed) -> Result<TurnResult> {
        let sid = self.session.id.as_str().to_owned();
        let query_hash = canonical::hash_value(&self.request.to_value()).unwrap_or_default();
        let mut clock = Instant::now();
        let rooted = self
            .system_root
            .map(|image| RootedFs::new(Path::new(image), self.workspace.root_str()));
        let view: &dyn plan::FsView = match &rooted {
            Some(r) => r,
            None => &HostFs,
        };
        // Each question about the host asked once per compile.
        let view = turnstile_policy::fsview::Memo::new(view);
        let foreign = self.foreign_sessions(&view);
        let ctx = PlanContext {
            root: self.workspace.root_str(),
            workspace_owner: workspace_owner(self.workspace.root()),
            turn_number: self.turn_number,
            host_env: ["LANG", "LC_ALL", "TZ", "TERM"]
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
                .collect(),
            system_root: self.system_root,
            foreign_sessions: &foreign,
        };
        let plan = {
            let _phase =
                tracing::info_span!("phase", phase = "plan", "otel.name" = otel_phase("plan"))
                    .entered();
            plan::compile(&ctx, self.manifest, self.request, allowed, &view)
                .and_then(|p| self.keeps_other_sessions_out(p, &view))
                .map(|mut p| {
                    p.forward_all_output = self.opts.forward_all_output;
                    if let Some(r) = &self.opts.receive {
                        // Its stdout is held in memory: bounded whatever the
                        // manifest's budget.
                        p.stdin = Some(r.stdin_text());
                        p.limits.output_bytes =
                            p.limits.output_bytes.min(receive::MAX_OUTPUT_BYTES);
                    }
                    // Shared from here (intent, pool, outcome), never copied.
                    Arc::new(p)
                })
        };
        let plan_us = lap(&mut clock);
        // Intent, before anything runs: a crash from here on is visible.
        // It is made and written on its own thread while the sandbox is
        // built (or taken warm) — the Plan's hash too, ~0.2 ms that were
        // on the turn's path; the command starts only once it is durable
        // (the gate in `execute_timed`), so no effect of the turn ever
        // precedes it.
        let hashed = plan.as_ref().ok().map(Arc::clone);
        let root = self.workspace.root_str();
        let mut entry = crate::store::record::TurnStartedEntry {
            event: crate::store::record::Event::TurnStarted,
            schema_version: SCHEMA_VERSION,
            session_id: sid.clone(),
            turn_number: self.turn_number,
            query_hash: query_hash.clone(),
            plan_hash: None,
            backend: self.backend.name().to_owned(),
            ts: rfc3339_micros(self.started_at),
        };
        let exec_ledger = self.session.ledger(LedgerKind::Exec);
        let lock = self.lock;
        let mut outcome = std::thread::scope(|scope| -> Result<Outcome> {
            let mut intent = Intent::spawn(scope, move |written| {
                // The plan's hash does not depend on where the workspace
                // is: its root is hashed as `<root>` (replay into another
                // directory, and deterministic sessions, give the same
                // hash).
                entry.plan_hash = hashed
                    .and_then(|p| serde_json::to_value(&*p).ok())
                    .map(|mut v| {
                        root_relative(&mut v, root);
                        v
                    })
                    .and_then(|v| canonical::hash_value(&v).ok());
                let body = crate::store::record::to_object(&entry);
                crate::store::ledger::append_group_then(
                    lock,
                    vec![(&exec_ledger, vec![body])],
                    written,
                )
                .map(|_| ())
            });
            let mut outcome = match plan {
                Ok(plan) if crate::turn::interrupt::received().is_some() => {
                    Outcome::interrupted(Some(plan))
                }
                Ok(plan) => self.execute(plan, &mut intent),
                Err(e) => Outcome::failed(
                    TurnStatus::SandboxError,
                    format!("cannot build the plan: {e}"),
                    None,
                ),
            };
            match intent.finish() {
                Ok(us) => {
                    outcome
                        .phases
                        .prepend([("plan", plan_us), ("intent_entry", us)]);
                    Ok(outcome)
                }
                Err(e) => {
                    // Nothing of the turn was committed (the gates held it;
                    // if the entry was durable before its anchor failed to
                    // move, the command ran): no finish entry follows an
                    // intent that is not whole. A durable one is settled
                    // by recovery, as after a crash at that instant.
                    if let Some(c) = outcome.cleanup.take() {
                        c.finish();
                    }
                    Err(e)
                }
            }
        })?;
        let cleanup = outcome.cleanup.take();
        let result = self.finish(&query_hash, outcome);
        // The finish entries are durable: the commit journal can go (a
        // crash before this point is settled by recovery, idempotently).
        if result.is_ok() {
            let journal = self
                .session
                .state()
                .commit_journal(&self.session.id, self.turn_number);
            if let Err(e) = commit::finish(self.workspace.root(), &journal) {
                tracing::warn!(error = %e, "commit journal left for recovery");
            }
        }
        if let Some(c) = cleanup {
            // A serve worker joins it after its reply (see sandbox::pool).
            self.backend.after_turn(c.start());
        }
        result
    }

    fn execute(&self, plan: Arc<Plan>, intent: &mut Intent<'_>) -> Outcome {
        let mut clock = Instant::now();
        let mut phases = Phases::new();
        let mut stage = Stage::default();
        let mut outcome = self
            .execute_timed(plan, intent, &mut clock, &mut phases, &mut stage)
            .unwrap_or_else(|o| *o);
        stage.enter("teardown");
        phases.push("teardown", lap(&mut clock));
        outcome.phases = phases;
        outcome
    }

    /// The turn from its plan to its commit, step by step: prepare, run,
    /// capture, judge, commit. A step that cannot go on returns the turn's
    /// outcome as its error.
    fn execute_timed(
        &self,
        plan: Arc<Plan>,
        intent: &mut Intent<'_>,
        clock: &mut Instant,
        phases: &mut Phases,
        stage: &mut Stage,
    ) -> std::result::Result<Outcome, Box<Outcome>> {
        stage.enter("prepare");
        let prepared = self.prepare(&plan, intent).map_err(|e| e.with(&plan))?;
        phases.push("prepare", lap(clock));
        stage.enter("sandbox");
        let execution = self
            .run_sandbox(
                &plan,
                intent,
                prepared.begin,
                &prepared.turn_dir,
                prepared.cgroup,
            )
            .map_err(|e| e.with(&plan))?;
        let _ = lap(clock);
        stage.enter("capture");
        phases.extend(execution.phases.iter().map(|(n, v)| ((*n).to_owned(), *v)));
        let (scopes, writes, verdict) = match self.capture(&plan, &execution) {
            Ok(c) => c,
            Err(f) => {
                let mut o = f.with(&plan);
                o.execution = Some(execution);
                return Err(o);
            }
        };
        // "capture" = enumerate + hash + compare with the declaration.
        phases.push("capture", lap(clock));
        stage.enter("verify_commit");
        // Nothing reaches the workspace before the intent entry is appended
        // whole: the command only waited for it to be durable.
        if !intent.acknowledged() {
            let mut o = Failed::new(
                TurnStatus::SandboxError,
                "the intent entry could not be written".into(),
            )
            .with(&plan);
            o.execution = Some(execution);
            return Err(o);
        }
        let mut outcome = judge(&plan, &execution, writes, verdict);
        self.judge_receive(&plan, &execution, &mut outcome);
        self.commit(&plan, &scopes, &mut outcome);
        phases.push("commit", lap(clock));
        // The workspace is as the next turn will find it: a serve worker
        // builds that turn's sandbox once this one is durable and answered
        // (see `finish`; a no-op elsewhere).
        outcome.refill = true;
        outcome.execution = Some(execution);
        outcome.plan = Some(plan);
        outcome.suspensions = crate::store::record::read_suspensions(&prepared.turn_dir.path);
        outcome.cleanup = Some(if self.backend.cleans_up_after_reply() {
            record::Cleanup::Held(prepared.turn_dir)
        } else {
            record::Cleanup::Started(prepared.turn_dir.remove_in_background())
        });
        Ok(outcome)
    }

    /// The writable scopes as mount points, then the turn's directory: a
    /// warm sandbox built before the turn from this plan's shape (serve's
    /// pool), or a directory for one built now.
    fn prepare(&self, plan: &Plan, intent: &mut Intent<'_>) -> StepResult<Prepared> {
        // Writable scopes must exist as mount points: create the missing
        // ones (empty directories, never through a symlink), as session
        // start does for tmp/<sid>/ and output/<sid>/. Creating one is a
        // change to the workspace: only after the intent entry is durable.
        let missing = plan
            .writable_scopes
            .iter()
            .any(|s| std::fs::symlink_metadata(self.workspace.root().join(s)).is_err());
        if missing && !intent.durable() {
            return Err(Failed::new(
                TurnStatus::SandboxError,
                "the intent entry could not be written".into(),
            ));
        }
        for scope in &plan.writable_scopes {
            commit::open_dir_creating(self.workspace.root(), scope).map_err(Failed::from)?;
        }
        let turn_path = self
            .session
            .state()
            .turn_dir(&self.session.id, self.turn_number);
        Ok(match self.backend.take_warm(plan) {
            Some(w) => Prepared {
                turn_dir: w.dir,
                cgroup: w.cgroup,
                begin: Some(w.begin),
            },
            None => Prepared {
                turn_dir: TurnDir::create(turn_path, plan).map_err(Failed::from)?,
                cgroup: crate::ids::TurnId::of(plan).to_string(),
                begin: None,
            },
        })
    }

    /// Builds (or begins the warm) sandbox, starts the command once the
    /// intent entry is durable, and waits for every process of the turn.
    fn run_sandbox(
        &self,
        plan: &Arc<Plan>,
        intent: &mut Intent<'_>,
        begin: Option<crate::backend::Begin>,
        turn_dir: &TurnDir,
        cgroup: String,
    ) -> StepResult<crate::sandbox::Execution> {
        // A SIGTERM/SIGINT/SIGHUP from here on kills the turn's cgroup.
        self.opts
            .interrupts
            .register(Some((self.opts.cgroup_place.clone(), cgroup)));
        let created = match begin {
            Some(begin) => begin(plan),
            None => self.backend.create(plan, turn_dir),
        };
        let executed = created.and_then(|mut sandbox| {
            // The gate: the command starts only once the intent entry is
            // durable; if it cannot be written, the sandbox goes unstarted.
            // A command whose every effect is captured — an isolated
            // network, writes to the turn's overlays, nothing committed
            // before the entry is acknowledged — starts once the entry is
            // written: a crash of this process from then on leaves it for
            // recovery, and a power cut before its sync loses the turn
            // whole, with every effect it could have had.
            let gated = if plan.network == "isolated" {
                intent.written()
            } else {
                intent.durable()
            };
            if !gated {
                sandbox.delete();
                return Err(SupervisorError::Sandbox {
                    step: "intent entry",
                    detail: "the intent entry could not be written; the command never started"
                        .into(),
                    source: None,
                });
            }
            sandbox.start();
            let mut execution = sandbox.wait()?;
            // What is left of the sandbox goes with the turn's directory,
            // beside the finish entries (see `Deferred`).
            turn_dir.defer(std::mem::take(&mut execution.teardown));
            Ok(execution)
        });
        self.opts.interrupts.register(None);
        executed.map_err(|e| {
            if crate::turn::interrupt::received().is_some() {
                Failed::new(TurnStatus::Interrupted, interrupted_message())
            } else {
                Failed::from(e)
            }
        })
    }

    /// What the turn wrote, enumerated from the overlay uppers and compared
    /// with its declaration.
    fn capture(
        &self,
        plan: &Plan,
        execution: &crate::sandbox::Execution,
    ) -> StepResult<(Vec<Scope>, Vec<capture::RealizedWrite>, capture::Verdict)> {
        let scopes: Vec<Scope> = plan
            .writable_scopes
            .iter()
            .zip(&execution.uppers)
            .map(|(rel, upper)| Scope {
                relative: rel.clone(),
                lower: self.workspace.root().join(rel),
                upper: upper.clone(),
            })
            .collect();
        let writes = capture::enumerate(&scopes, plan.limits.files + 1024, plan.limits.disk_bytes)
            .map_err(|e| match e {
                SupervisorError::CaptureLimit(_) => {
                    Failed::new(TurnStatus::DiskLimit, e.to_string())
                }
                e => Failed::from(e),
            })?;
        // A declared tree never carries a forbidden path through.
        let forbidden = turnstile_policy::pattern::PatternSet::compile(
            &self.manifest.capabilities.forbidden,
            &self.request.session,
        )
        .map_err(|e| Failed::new(TurnStatus::SandboxError, e))?;
        let root = self.workspace.root_str();
        let verdict = turnstile_policy::verdict::verify_trees(
            &writes,
            &self.request.declared_outputs,
            &format!("tmp/{}", self.session.id),
            &|p: &str| {
                forbidden
                    .matching(&turnstile_policy::pattern::Target::new(root, p))
                    .is_some()
            },
        );
        Ok((scopes, writes, verdict))
    }

    /// A receive turn's envelopes, read from its stdout: a turn whose agent
    /// printed something refused is not committed (it emits nothing).
    fn judge_receive(
        &self,
        plan: &Plan,
        execution: &crate::sandbox::Execution,
        outcome: &mut Outcome,
    ) {
        let Some(r) = &self.opts.receive else {
            return;
        };
        if outcome.status != TurnStatus::Committed {
            return;
        }
        match receive::parse_output(
            &r.envelope,
            self.manifest.package_id.as_str(),
            execution.stdout.captured.as_deref().unwrap_or_default(),
            execution.output_truncated,
            plan.limits.output_bytes,
        ) {
            Ok(emitted) => outcome.emitted = emitted,
            Err(refused) => {
                outcome.status = TurnStatus::CommandFailed;
                outcome.message = format!("[{}] {}", refused.code, refused.message);
                outcome.refused = Some(refused);
            }
        }
    }

    /// Commits a turn judged `committed` (unless an interrupt came after
    /// the command, before the commit point).
    /// Keeps the session's pre-images within the configured retention
    /// (best effort: a failure leaves more kept, never less).
    fn prune_preimages(&self) {
        let limit = crate::backend::select::preimage_retention(&self.opts.config)
            .unwrap_or(crate::backend::select::DEFAULT_PREIMAGE_RETENTION);
        let store = Workspace::preimages_rel(&self.session.tier, &self.session.id);
        if let Err(e) = commit::prune_preimages(self.workspace.root(), &store, limit) {
            tracing::warn!(error = %e, "pre-image retention");
        }
    }

    fn commit(&self, plan: &Plan, scopes: &[Scope], outcome: &mut Outcome) {
        if outcome.status != TurnStatus::Committed {
            return;
        }
        if crate::turn::interrupt::received().is_some() {
            // Interrupted after the command, before the commit (a signal
            // while it stages is asked about by the commit itself).
            outcome.status = TurnStatus::Interrupted;
            outcome.message = interrupted_message();
            return;
        }
        // Its finish entry must hold what it committed: a turn whose
        // writes could not be recorded commits nothing.
        let v = &outcome.verdict;
        let estimate = crate::store::record::recorded_bytes(
            v.matched
                .iter()
                .chain(&v.scratch)
                .chain(&v.implied)
                .chain(&v.undeclared)
                .map(|w| w.path.as_str()),
            v.scratch.iter().map(|w| w.path.as_str()),
            v.matched.iter().chain(&v.implied).map(|w| w.path.as_str()),
        );
        if estimate > crate::store::ledger::RECORD_BUDGET {
            outcome.status = TurnStatus::CommitFailed;
            outcome.message = format!(
                "nothing landed: the turn's {} writes ({} in scratch) would take about {estimate} bytes to record, more than a ledger entry holds ({} bytes); write fewer files or shorter paths, or archive them into one output",
                v.matched.len() + v.scratch.len() + v.implied.len() + v.undeclared.len(),
                v.scratch.len(),
                crate::store::ledger::RECORD_BUDGET
            );
            return;
        }
        let request = commit::CommitRequest {
            root: self.workspace.root(),
            scopes,
            matched: &outcome.verdict.matched,
            scratch: &outcome.verdict.scratch,
            output_owner: plan.workspace_owner,
            scratch_owner: plan.workspace_owner,
            turn_number: self.turn_number,
            journal: self
                .session
                .state()
                .commit_journal(&self.session.id, self.turn_number),
            work_dir: Workspace::commit_work_dir(&self.session.id, self.turn_number),
            preimages: Some(Workspace::preimages_rel(
                &self.session.tier,
                &self.session.id,
            )),
            progress: !self.opts.json,
            // A signal while staging: nothing lands (checked between the
            // staged files and right before the commit point; one after
            // it changes nothing).
            stop: || crate::turn::interrupt::received().is_some(),
        };
        match commit::commit(&request) {
            Ok(c) => {
                if c.iter()
                    .any(|c| matches!(c.previous, Some(commit::Previous::File { .. })))
                {
                    self.prune_preimages();
                }
                outcome.committed = c;
            }
            Err(SupervisorError::CommitInterrupted) => {
                // Signalled before the commit point: rolled back.
                outcome.status = TurnStatus::Interrupted;
                outcome.message = interrupted_message();
            }
            Err(e) => {
                // Host I/O (a full disk, EIO): exit 1, nothing landed — or,
                // past the commit point, the journal stays for recovery to
                // finish.
                outcome.status = TurnStatus::CommitFailed;
                outcome.message = e.to_string();
            }
        }
    }
}

/// What `prepare` made ready for the sandbox.
struct Prepared {
    turn_dir: TurnDir,
    cgroup: String,
    begin: Option<crate::backend::Begin>,
}

/// A step that ended the turn: its status and why (the plan is attached by
/// the pipeline).
struct Failed {
    status: TurnStatus,
    message: String,
}

type StepResult<T> = std::result::Result<T, Failed>;

impl Failed {
    fn new(status: TurnStatus, message: String) -> Self {
        Self { status, message }
    }

    fn with(self, plan: &Arc<Plan>) -> Box<Outcome> {
        Box::new(Outcome::failed(
            self.status,
            self.message,
            Some(Arc::clone(plan)),
        ))
    }
}

impl From<SupervisorError> for Failed {
    fn from(e: SupervisorError) -> Self {
        Self::new(TurnStatus::SandboxError, e.to_string())
    }
}

/// How the command ended, for the classification table. An init that
/// ended without a word (stage `init`) in a turn the kernel's memory limit
/// killed in was taken by the OOM killer (that explains the silence), so
/// the limit decides, as it would for the command.
fn ended_of(ending: &Ending, oom_kills: u64) -> Ended {
    match ending {
        Ending::Exited(c) => Ended::Exited(*c),
        Ending::SetupFailed { stage, .. } if stage == "init" && oom_kills > 0 => Ended::Abnormally,
        Ending::SetupFailed { .. } => Ended::SetupFailed,
        Ending::Signaled { .. } | Ending::ExecFailed { .. } => Ended::Abnormally,
    }
}

/// The turn's status from what the sandbox observed and what it wrote
/// (the one classification table), and the outcome before any commit.
fn judge(
    plan: &Plan,
    execution: &crate::sandbox::Execution,
    writes: Vec<capture::RealizedWrite>,
    mut verdict: capture::Verdict,
) -> Outcome {
    let u = &execution.usage;
    // A check that found no command process in a turn its timeout killed
    // (the timeout fell in the sandbox's setup: a 1 s timeout under the
    // 6.1 guest's TCG) is explained by the timeout; the command never ran.
    let posture_failure = execution
        .posture
        .as_ref()
        .filter(|p| !p.ok())
        .filter(|p| !(execution.timed_out && p.pid == 0))
        .map(|p| p.failures.join("; "));
    let observed = Observed {
        ended: ended_of(&execution.ending, u.oom_kills),
        interrupted: crate::turn::interrupt::received().is_some(),
        posture_failed: posture_failure.is_some(),
        timed_out: execution.timed_out,
        oom_killed: u.oom_kills > 0,
        pids_limited: u.pids_limit_hits > 0,
        disk_full: execution.disk_full,
        writes_match: verdict.matches(),
    };
    let status = classify(&observed);
    if !matches!(status, TurnStatus::Committed | TurnStatus::Blocked) {
        // The declaration only decides a turn whose command exited 0;
        // otherwise the realized writes are recorded, not judged.
        verdict.undeclared.clear();
        verdict.missing.clear();
    }
    Outcome {
        status,
        message: status_message(status, plan, execution, posture_failure),
        execution: None,
        writes,
        verdict,
        committed: Vec::new(),
        plan: None,
        phases: Phases::new(),
        cleanup: None,
        suspensions: Vec::new(),
        emitted: Vec::new(),
        refused: None,
        refill: false,
    }
}

/// What went wrong, in words, for a status that carries an error.
fn status_message(
    status: TurnStatus,
    plan: &Plan,
    execution: &crate::sandbox::Execution,
    posture_failure: Option<String>,
) -> String {
    let limits = &plan.limits;
    match status {
        TurnStatus::Interrupted => interrupted_message(),
        TurnStatus::PostureFailed => format!(
            "posture check failed: {}",
            posture_failure.unwrap_or_default()
        ),
        TurnStatus::Timeout => format!("the turn exceeded {} s", limits.timeout_seconds),
        TurnStatus::SandboxError => match &execution.ending {
            Ending::SetupFailed { stage, detail } => format!("{stage}: {detail}"),
            _ => "the sandbox failed".into(),
        },
        TurnStatus::MemoryLimit => {
            format!("the memory limit ({} bytes) was hit", limits.memory_bytes)
        }
        TurnStatus::Blocked => {
            "realized writes differ from the declared outputs; nothing was committed".into()
        }
        TurnStatus::PidsLimit => format!("the process limit ({}) was hit", limits.pids),
        TurnStatus::DiskLimit => format!(
            "the disk ({} bytes) or files ({}) limit was hit",
            limits.disk_bytes, limits.files
        ),
        _ => String::new(),
    }
}

/// `supervise plan`: the Plan a turn would get, without running anything.
pub fn plan_only(input: admit::Input<'_>, session: Option<&str>) -> Result<Plan> {
    let session = match session {
        Some(s) => SessionId::parse(s)?,
        None => SessionIdGenerator::new(SystemClock, OsRandom).generate()?,
    };
    let system_root = input.system_root.and_then(Path::to_str);
    let admission = admit::admit(input, session)?;
    let allowed = admission.check()?;
    let ctx = PlanContext {
        root: admission.workspace.root_str(),
        workspace_owner: workspace_owner(admission.workspace.root()),
        turn_number: 0,
        host_env: Vec::new(),
        system_root,
        foreign_sessions: &[],
    };
    let rooted =
        system_root.map(|image| RootedFs::new(Path::new(image), admission.workspace.root_str()));
    let view: &dyn plan::FsView = match &rooted {
        Some(r) => r,
        None => &HostFs,
    };
    plan::compile(
        &ctx,
        &admission.manifest,
        &admission.request,
        &allowed,
        &turnstile_policy::fsview::Memo::new(view),
    )
    .map_err(|e| SupervisorError::Sandbox {
        step: "compile plan",
        detail: e.to_string(),
        source: None,
    })
}

/// The owner of the workspace root: committed outputs belong to it.
fn workspace_owner(root: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(root).map_or((0, 0), |m| (m.uid(), m.gid()))
}

#[cfg(test)]
mod ended_tests {
    use super::*;

    #[test]
    fn a_silent_init_in_an_oom_killed_turn_is_the_memory_limit() {
        let silent = Ending::SetupFailed {
            stage: "init".into(),
            detail: "the sandbox init ended without reporting".into(),
        };
        assert_eq!(ended_of(&silent, 0), Ended::SetupFailed);
        assert_eq!(ended_of(&silent, 1), Ended::Abnormally);
        let o = Observed {
            ended: ended_of(&silent, 1),
            interrupted: false,
            posture_failed: false,
            timed_out: false,
            oom_killed: true,
            pids_limited: false,
            disk_full: false,
            writes_match: true,
        };
        assert_eq!(classify(&o), TurnStatus::MemoryLimit);
        // A setup stage that said why stays a setup failure.
        let said = Ending::SetupFailed {
            stage: "bind mount".into(),
            detail: "x".into(),
        };
        assert_eq!(ended_of(&said, 1), Ended::SetupFailed);
    }

    /// The workspace root, and only it or a path below it, becomes
    /// `<root>`, at any depth.
    #[test]
    fn root_relative_rewrites_the_root_and_paths_below_it_only() {
        let mut v = serde_json::json!({
            "a": "/ws",
            "b": ["/ws/x", "/wsx", "x/ws", {"c": "/ws/"}],
            "d": 1,
        });
        root_relative(&mut v, "/ws");
        assert_eq!(
            v,
            serde_json::json!({
                "a": "<root>",
                "b": ["<root>/x", "/wsx", "x/ws", {"c": "<root>/"}],
                "d": 1,
            })
        );
    }
}

#[cfg(test)]
mod intent_tests {
    use super::*;
    use std::sync::mpsc;

    /// The gates open in order: `written` once the bytes are written while
    /// their sync is still under way, `durable` only after it, and an
    /// append that fails before a point opens neither gate past it.
    #[test]
    fn the_written_gate_opens_before_the_durable_one_and_a_failure_opens_neither() {
        let (sync_done, wait_sync) = mpsc::channel::<()>();
        std::thread::scope(|scope| {
            let mut intent = Intent::spawn(scope, move |reached| {
                reached(Reached::Written);
                // The sync: until the test lets it finish.
                wait_sync.recv().unwrap();
                reached(Reached::Durable);
                Ok(())
            });
            assert!(intent.written());
            // Still syncing: the append has not ended.
            assert!(intent.handle.as_ref().is_some_and(|h| !h.is_finished()));
            assert_eq!(intent.seen, Some(Reached::Written));
            sync_done.send(()).unwrap();
            assert!(intent.durable());
            assert!(intent.acknowledged());
            assert!(intent.finish().is_ok());
        });
        std::thread::scope(|scope| {
            let mut intent = Intent::spawn(scope, |reached| {
                reached(Reached::Written);
                Err(SupervisorError::invalid("x", "the sync failed"))
            });
            assert!(intent.written());
            assert!(!intent.durable());
            assert!(!intent.acknowledged());
            assert!(intent.finish().is_err());
        });
        std::thread::scope(|scope| {
            let mut intent = Intent::spawn(scope, |_| Err(SupervisorError::invalid("x", "no")));
            assert!(!intent.written());
            assert!(!intent.durable());
        });
    }
}
