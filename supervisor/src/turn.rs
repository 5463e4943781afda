//! The turn pipeline (DESIGN "The turn pipeline"):
//!
//! validate → compile → pre-execution check → intent entry → sandbox →
//! capture → verify → commit or block → exec + evidence entries.
//!
//! Bad input fails before anything is created. From the intent entry on,
//! every path — setup failure, command failure, limit, timeout, block,
//! commit — ends in one exec and one evidence entry (FR-RT-007, FR-RT-018).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{Value, json};
use time::OffsetDateTime;
use turnstile_policy::plan::{self, Plan, PlanContext};
use turnstile_policy::request::{BoundRequest, TurnRequest};
use turnstile_policy::session::{Clock, SessionIdGenerator};
use turnstile_policy::timefmt::rfc3339_micros;
use turnstile_policy::{Manifest, SessionId, Violations, canonical};

use crate::admit;
use crate::capture::{self, Scope, Verdict};
use crate::commit::{self, Committed};
use crate::error::{Result, SupervisorError};
use crate::evidence::{RejectedTurn, SCHEMA_VERSION, object};
use crate::ids::{OsRandom, SystemClock};
use crate::layout::{StateDir, TURN_TIER, Workspace};
use crate::ledger::LedgerKind;
use crate::realfs::HostFs;
use crate::sandbox::{self, Ending, Execution, TurnDir};
use crate::session::{Session, SessionLock};
use crate::status::{Ended, Observed, TurnStatus, classify};
use turnstile_policy::error::codes;

/// Records a turn refused before execution in both ledgers and returns its
/// turn number.
pub fn record_rejected_turn(
    session: &Session,
    lock: &SessionLock,
    request: &BoundRequest,
    violations: &Violations,
    clock: &dyn Clock,
) -> Result<u64> {
    let turn_number = session.next_turn_number(lock)?;
    let turn = RejectedTurn {
        request,
        turn_number,
        violations,
        at: clock.now(),
    };
    let (exec, evidence) = (
        session.ledger(LedgerKind::Exec),
        session.ledger(LedgerKind::Evidence),
    );
    crate::ledger::append_group(
        lock,
        vec![
            (&exec, vec![turn.exec_entry()]),
            (&evidence, vec![turn.evidence_entry()]),
        ],
    )?;
    Ok(turn_number)
}

/// Everything `supervise run` was asked.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub root: PathBuf,
    pub state_dir: PathBuf,
    pub package: String,
    pub session: Option<String>,
    pub request: TurnRequest,
    pub json: bool,
    pub cgroup_root: PathBuf,
}

/// The outcome of one turn, as `--json` prints it.
#[derive(Debug, Clone)]
pub struct TurnResult {
    pub exit_status: u8,
    pub value: Value,
    pub summary: String,
}

/// Runs one turn.
pub fn run_turn(opts: &RunOptions) -> Result<TurnResult> {
    let input = admit::Input {
        root: &opts.root,
        state_dir: &opts.state_dir,
        package: &opts.package,
        request: &opts.request,
    };
    let given = opts.session.as_deref().map(SessionId::parse).transpose()?;
    // Everything is validated before a session is created for this turn
    // (exit 2 creates nothing).
    let mut admission = admit::admit(input, given.clone().unwrap_or_else(admit::probe_session))?;
    let session = match &given {
        Some(id) => Session::open(&admission.workspace, &admission.state, id, None)?,
        None => {
            let state = StateDir::open(admission.state.path(), &admission.workspace, true)?;
            crate::session::sweep_unfinished(&state, Some(&admission.workspace))?;
            Session::create(
                &admission.workspace,
                &state,
                TURN_TIER,
                &SessionIdGenerator::new(SystemClock, OsRandom),
            )?
        }
    };
    // Turns of one session are serialized; sessions run concurrently. What
    // a dead supervisor left of this session is settled first.
    let (lock, recovery) = crate::recover::lock_for_write(&session, &opts.cgroup_root)?;
    if !recovery.is_empty() {
        tracing::warn!(session_id = %session.id, recovery = %recovery.to_value(), "recovered what a stopped supervisor left");
    }
    admission.rebind(&opts.request, session.id.clone())?;
    let request = &admission.request;
    let allowed = match admission.check() {
        Ok(a) => a,
        Err(violations) => {
            let turn_number =
                record_rejected_turn(&session, &lock, request, &violations, &SystemClock)?;
            let value = json!({
                "session_id": session.id.as_str(),
                "turn_number": turn_number,
                "status": TurnStatus::Violation.as_str(),
                "exit_code": null,
                "error": {"code": codes::SECURITY_POLICY_VIOLATION.code, "name": codes::SECURITY_POLICY_VIOLATION.name, "message": violations.to_string()},
                "realized_writes": [],
                "committed": [],
                "violations": violations.0.iter().map(|v| v.to_value()).collect::<Vec<_>>(),
                "ledgers": ledgers(&session),
            });
            return Ok(TurnResult {
                exit_status: TurnStatus::Violation.exit_status(None),
                summary: format!("turn {turn_number}: refused before execution: {violations}"),
                value,
            });
        }
    };
    let turn_number = session.next_turn_number(&lock)?;
    Turn {
        opts,
        session: &session,
        lock: &lock,
        request,
        manifest: &admission.manifest,
        workspace: &admission.workspace,
        turn_number,
        execute_entry: allowed.execute_entry.clone(),
        started: Instant::now(),
        started_at: SystemClock.now(),
    }
    .run(&allowed)
}

fn ledgers(session: &Session) -> Value {
    json!({
        "exec": session.ledger(LedgerKind::Exec).path,
        "evidence": session.ledger(LedgerKind::Evidence).path,
    })
}

struct Turn<'a> {
    opts: &'a RunOptions,
    session: &'a Session,
    lock: &'a SessionLock,
    request: &'a BoundRequest,
    manifest: &'a Manifest,
    workspace: &'a Workspace,
    turn_number: u64,
    execute_entry: String,
    started: Instant,
    started_at: OffsetDateTime,
}

/// How a turn ended, before rendering.
struct Outcome {
    status: TurnStatus,
    /// What went wrong, for statuses that carry an error code.
    message: String,
    execution: Option<Execution>,
    writes: Vec<capture::RealizedWrite>,
    verdict: Verdict,
    committed: Vec<Committed>,
    plan: Option<Plan>,
    /// Where the time went: (phase, microseconds), in order.
    phases: Vec<(&'static str, u64)>,
    /// The turn directory's removal, running while the ledgers are written.
    cleanup: Option<std::thread::JoinHandle<()>>,
}

/// Microseconds since `since`, restarting it.
fn lap(since: &mut Instant) -> u64 {
    let now = Instant::now();
    let us = now.duration_since(*since).as_micros() as u64;
    *since = now;
    us
}

impl Turn<'_> {
    fn run(self, allowed: &turnstile_policy::check::Allowed) -> Result<TurnResult> {
        let sid = self.session.id.as_str().to_owned();
        let query_hash = canonical::hash_value(&self.request.to_value()).unwrap_or_default();
        let ctx = PlanContext {
            root: self.workspace.root_str(),
            turn_number: self.turn_number,
            host_env: ["LANG", "LC_ALL", "TZ", "TERM"]
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
                .collect(),
        };
        let mut clock = Instant::now();
        let plan = plan::compile(&ctx, self.manifest, self.request, allowed, &HostFs);
        let plan_us = lap(&mut clock);
        let plan_hash = plan
            .as_ref()
            .ok()
            .and_then(|p| serde_json::to_value(p).ok())
            .and_then(|v| canonical::hash_value(&v).ok());

        // Intent, before anything runs: a crash from here on is visible.
        self.session.ledger(LedgerKind::Exec).append(
            self.lock,
            object(json!({
                "event": "turn.started",
                "schema_version": SCHEMA_VERSION,
                "session_id": sid,
                "turn_number": self.turn_number,
                "query_hash": query_hash,
                "plan_hash": plan_hash,
                "backend": "native",
                "ts": rfc3339_micros(self.started_at),
            })),
        )?;

        let intent_us = lap(&mut clock);
        let mut outcome = match plan {
            Ok(plan) if crate::interrupt::received().is_some() => Outcome::interrupted(Some(plan)),
            Ok(plan) => self.execute(plan),
            Err(e) => Outcome::failed(
                TurnStatus::SandboxError,
                format!("cannot build the plan: {e}"),
                None,
            ),
        };
        outcome
            .phases
            .splice(0..0, [("plan", plan_us), ("intent_entry", intent_us)]);
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
            let _ = c.join();
        }
        result
    }

    fn execute(&self, plan: Plan) -> Outcome {
        let mut clock = Instant::now();
        let mut phases = Vec::new();
        let mut outcome = self.execute_timed(plan, &mut clock, &mut phases);
        phases.push(("teardown", lap(&mut clock)));
        outcome.phases = phases;
        outcome
    }

    fn execute_timed(
        &self,
        plan: Plan,
        clock: &mut Instant,
        phases: &mut Vec<(&'static str, u64)>,
    ) -> Outcome {
        let turn_path = self
            .session
            .state()
            .turn_dir(&self.session.id, self.turn_number);
        // Writable scopes must exist as mount points: create the missing
        // ones (empty directories, never through a symlink), as session
        // start does for tmp/<sid>/ and output/<sid>/.
        for scope in &plan.writable_scopes {
            if let Err(e) = commit::open_dir_creating(self.workspace.root(), scope) {
                return Outcome::from_error(&e, Some(plan));
            }
        }
        let turn_dir = match TurnDir::create(turn_path, &plan) {
            Ok(d) => d,
            Err(e) => return Outcome::from_error(&e, Some(plan)),
        };
        phases.push(("prepare", lap(clock)));
        // A SIGTERM/SIGINT/SIGHUP from here on kills the turn's cgroup.
        crate::interrupt::register(Some((
            self.opts.cgroup_root.clone(),
            format!("{}-t{}", plan.session_id, plan.turn_number),
        )));
        let executed = sandbox::execute(&plan, &turn_dir, &self.opts.cgroup_root, self.opts.json);
        crate::interrupt::register(None);
        let execution = match executed {
            Ok(x) => x,
            Err(_) if crate::interrupt::received().is_some() => {
                return Outcome::interrupted(Some(plan));
            }
            Err(e) => return Outcome::from_error(&e, Some(plan)),
        };
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
        let _ = lap(clock);
        phases.extend(execution.phases.iter().copied());
        let writes =
            match capture::enumerate(&scopes, plan.limits.files + 1024, plan.limits.disk_bytes) {
                Ok(w) => w,
                Err(e) => {
                    let mut o = Outcome::from_error(&e, Some(plan));
                    if let SupervisorError::CaptureLimit(_) = e {
                        o.status = TurnStatus::DiskLimit;
                    }
                    o.execution = Some(execution);
                    return o;
                }
            };

        let verdict = capture::verify(
            &writes,
            &self.request.declared_outputs,
            &format!("tmp/{}", self.session.id),
        );
        // "capture" = enumerate + hash + compare with the declaration.
        phases.push(("capture", lap(clock)));
        let u = &execution.usage;
        let posture_failure = execution
            .posture
            .as_ref()
            .filter(|p| !p.ok())
            .map(|p| p.failures.join("; "));
        let observed = Observed {
            ended: match &execution.ending {
                Ending::Exited(c) => Ended::Exited(*c),
                Ending::SetupFailed { .. } => Ended::SetupFailed,
                Ending::Signaled { .. } | Ending::ExecFailed { .. } => Ended::Abnormally,
            },
            interrupted: crate::interrupt::received().is_some(),
            posture_failed: posture_failure.is_some(),
            timed_out: execution.timed_out,
            oom_killed: u.oom_kills > 0,
            pids_limited: u.pids_limit_hits > 0,
            disk_full: execution.disk_full,
            writes_match: verdict.matches(),
        };
        let status = classify(&observed);
        let limits = &plan.limits;
        let message = match status {
            TurnStatus::Interrupted => interrupted_message(),
            TurnStatus::PostureFailed => {
                format!(
                    "posture check failed: {}",
                    posture_failure.unwrap_or_default()
                )
            }
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
        };
        let mut verdict = verdict;
        if !matches!(status, TurnStatus::Committed | TurnStatus::Blocked) {
            // The declaration only decides a turn whose command exited 0;
            // otherwise the realized writes are recorded, not judged.
            verdict.undeclared.clear();
            verdict.missing.clear();
        }
        let mut outcome = Outcome {
            status,
            message,
            execution: None,
            writes,
            verdict,
            committed: Vec::new(),
            plan: None,
            phases: Vec::new(),
            cleanup: None,
        };
        if status == TurnStatus::Committed && crate::interrupt::received().is_some() {
            // Interrupted after the command, before the commit point.
            outcome.status = TurnStatus::Interrupted;
            outcome.message = interrupted_message();
        } else if status == TurnStatus::Committed {
            let request = commit::CommitRequest {
                root: self.workspace.root(),
                scopes: &scopes,
                matched: &outcome.verdict.matched,
                scratch: &outcome.verdict.scratch,
                output_owner: workspace_owner(self.workspace.root()),
                scratch_owner: (plan.uid, plan.gid),
                turn_number: self.turn_number,
                journal: self
                    .session
                    .state()
                    .commit_journal(&self.session.id, self.turn_number),
                work_dir: Workspace::commit_work_dir(&self.session.id, self.turn_number),
            };
            match commit::commit(&request) {
                Ok(c) => outcome.committed = c,
                Err(e) => {
                    // Host I/O (a full disk, EIO): exit 1, nothing landed —
                    // or, past the commit point, the journal stays for
                    // recovery to finish.
                    outcome.status = TurnStatus::CommitFailed;
                    outcome.message = e.to_string();
                }
            }
        }
        phases.push(("commit", lap(clock)));
        outcome.execution = Some(execution);
        outcome.plan = Some(plan);
        outcome.cleanup = Some(turn_dir.remove_in_background());
        outcome
    }

    fn finish(&self, query_hash: &str, o: Outcome) -> Result<TurnResult> {
        let sid = self.session.id.as_str();
        let now = rfc3339_micros(SystemClock.now());
        let x = o.execution.as_ref();
        let command_exit = x.and_then(|x| match x.ending {
            Ending::Exited(c) => Some(c),
            _ => None,
        });
        let termination = x.map(|x| match &x.ending {
            Ending::Exited(c) => json!({"exited": c}),
            Ending::Signaled { signal, name } => json!({"signal": name, "number": signal}),
            Ending::SetupFailed { stage, detail } => {
                json!({"setup_failed": stage, "detail": detail})
            }
            Ending::ExecFailed { errno, error } => json!({"exec_failed": error, "errno": errno}),
        });
        let mut violations: Vec<Value> = Vec::new();
        for w in &o.verdict.undeclared {
            violations.push(json!({
                "attempted_operation": "write",
                "target": w.path,
                "violated_capability": {"kind": "undeclared_write", "realized_kind": w.kind.as_str()},
                "details": format!("`{}` ({}) was written but not declared; only declared regular files commit", w.path, w.kind.as_str()),
                "session_id": sid, "turn_number": self.turn_number, "timestamp": now,
            }));
        }
        for m in &o.verdict.missing {
            violations.push(json!({
                "attempted_operation": "write",
                "target": m,
                "violated_capability": {"kind": "missing_declared_output"},
                "details": format!("declared output `{m}` was not produced as a regular file"),
                "session_id": sid, "turn_number": self.turn_number, "timestamp": now,
            }));
        }
        let realized: Vec<Value> = o.writes.iter().map(|w| w.to_value()).collect();
        let committed: Vec<Value> = o
            .committed
            .iter()
            .map(|c| json!({"path": c.path, "size": c.size, "sha256": c.sha256}))
            .collect();
        let enforcement = self.enforcement(&o);
        let resources = x.map(|x| {
            json!({
                "peak_memory_bytes": x.usage.peak_memory_bytes,
                "cpu_usage_us": x.usage.cpu_usage_us,
                "oom_kills": x.usage.oom_kills,
                "pids_limit_hits": x.usage.pids_limit_hits,
                "disk_full": x.disk_full,
            })
        });
        let output = x.map(|x| {
            json!({
                "stdout": {"bytes": x.stdout.bytes, "forwarded": x.stdout.forwarded, "sha256": x.stdout.sha256},
                "stderr": {"bytes": x.stderr.bytes, "forwarded": x.stderr.forwarded, "sha256": x.stderr.sha256},
                "truncated": x.output_truncated,
            })
        });
        let wall_us = self.started.elapsed().as_micros() as u64;
        let phases: serde_json::Map<String, Value> = o
            .phases
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        let error = o.error();
        let result = json!({"status": o.status.as_str(), "exit_code": command_exit, "realized_writes": realized, "committed": committed, "violations": violations});
        let result_hash = canonical::hash_value(&result).unwrap_or_default();

        let exec_entry = object(json!({
            "event": "turn.finished",
            "schema_version": SCHEMA_VERSION,
            "session_id": sid,
            "turn_number": self.turn_number,
            "query_hash": query_hash,
            "result_hash": result_hash,
            "status": o.status.as_str(),
            "exit_code": command_exit,
            "termination": termination,
            "error": error,
            "backend": "native",
            "timings": {"wall_us": wall_us, "phases_us": phases},
            "ts": now,
        }));
        let r = self.request;
        let mut evidence = object(json!({
            "event": "turn.finished",
            "schema_version": SCHEMA_VERSION,
            "session_id": sid,
            "turn_number": self.turn_number,
            "package_id": self.manifest.package_id.as_str(),
            "status": o.status.as_str(),
            "command": r.command,
            "execute_entry": self.execute_entry,
            "declared_reads": r.declared_inputs,
            "declared_writes": r.declared_outputs.iter().map(|d| d.to_value()).collect::<Vec<_>>(),
            "realized_writes": realized,
            "scratch_writes": o.verdict.scratch.iter().map(|w| w.to_value()).collect::<Vec<_>>(),
            "committed": committed,
            "external_calls": [],
            "violations": violations,
            "enforcement": enforcement,
            "resources": resources,
            "output": output,
            "termination": termination,
            "error": error,
            "ts": now,
        }));
        if let Some(w) = &r.work_order_id {
            evidence.insert("work_order_id".into(), json!(w));
        }
        if let Some(k) = &r.idempotency_key {
            evidence.insert("idempotency_key".into(), json!(k));
        }
        // Both finish entries land together or not at all.
        let (exec, evidence_ledger) = (
            self.session.ledger(LedgerKind::Exec),
            self.session.ledger(LedgerKind::Evidence),
        );
        crate::ledger::append_group(
            self.lock,
            vec![
                (&exec, vec![exec_entry]),
                (&evidence_ledger, vec![evidence]),
            ],
        )?;

        let value = json!({
            "session_id": sid,
            "turn_number": self.turn_number,
            "status": o.status.as_str(),
            "exit_code": command_exit,
            "termination": termination,
            "error": error,
            "realized_writes": realized,
            "committed": committed,
            "violations": violations,
            "enforcement": enforcement,
            "resources": resources,
            "ledgers": ledgers(self.session),
            "durations": {
                "wall_ms": wall_us as f64 / 1000.0,
                "ledger_entries_ms": self.started.elapsed().as_micros() as f64 / 1000.0 - wall_us as f64 / 1000.0,
                "phases_ms": o.phases.iter().map(|(k, v)| ((*k).to_owned(), json!(*v as f64 / 1000.0))).collect::<serde_json::Map<String, Value>>(),
            },
        });
        let mut summary = format!("turn {} of {sid}: {}", self.turn_number, o.status);
        if let Some(code) = o.status.code() {
            summary += &format!(" [{}] {}", code.code, o.message);
        }
        for v in &violations {
            summary += &format!("\n  - {}", v["details"].as_str().unwrap_or_default());
        }
        Ok(TurnResult {
            exit_status: o.exit_status(),
            value,
            summary,
        })
    }

    fn enforcement(&self, o: &Outcome) -> Value {
        let mut degraded: Vec<String> = Vec::new();
        let landlock = o.execution.as_ref().and_then(|x| x.landlock.clone());
        if let Some(l) = &landlock {
            if l["status"] != "fully_enforced" {
                degraded.push(format!(
                    "landlock {}",
                    l["status"].as_str().unwrap_or("unknown")
                ));
            }
        }
        if let Some(x) = &o.execution {
            if !x.seccomp_unknown.is_empty() {
                degraded.push(format!(
                    "seccomp: syscalls unknown to libseccomp fall to ENOSYS: {}",
                    x.seccomp_unknown.join(", ")
                ));
            }
        }
        json!({
            "backend": "native",
            "namespaces": sandbox::NAMESPACES.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            "landlock_abi": landlock.as_ref().and_then(|l| l.get("kernel_abi").cloned()),
            "landlock_status": landlock.as_ref().and_then(|l| l.get("status").cloned()),
            "landlock": landlock,
            "seccomp": o.plan.as_ref().map(|p| json!({
                "mode": "filter", "default": "ENOSYS", "allowed": p.seccomp.allow.len(),
                "denied_eperm": p.seccomp.deny.len(), "bad_arch": "kill_process"})),
            "cgroup": o.execution.as_ref().map(|x| x.cgroup_version.as_str()),
            "capabilities": "none",
            "no_new_privs": true,
            "uid": o.plan.as_ref().map(|p| p.uid),
            "network": o.plan.as_ref().map(|p| p.network.clone()),
            "posture": o.execution.as_ref().and_then(|x| x.posture.as_ref()).map(|p| p.to_value()),
            "degraded": degraded,
        })
    }
}

impl Outcome {
    fn failed(status: TurnStatus, message: String, plan: Option<Plan>) -> Self {
        Self {
            status,
            message,
            execution: None,
            writes: Vec::new(),
            verdict: Verdict::default(),
            committed: Vec::new(),
            plan,
            phases: Vec::new(),
            cleanup: None,
        }
    }

    fn interrupted(plan: Option<Plan>) -> Self {
        Self::failed(TurnStatus::Interrupted, interrupted_message(), plan)
    }

    fn from_error(e: &SupervisorError, plan: Option<Plan>) -> Self {
        Self::failed(TurnStatus::SandboxError, e.to_string(), plan)
    }

    /// The error object of the entries and `--json` (none for statuses
    /// that are not errors).
    fn error(&self) -> Option<Value> {
        self.status
            .code()
            .map(|code| json!({"code": code.code, "name": code.name, "message": self.message}))
    }

    fn exit_status(&self) -> u8 {
        self.status
            .exit_status(crate::interrupt::received().map(|s| s as i32))
    }
}

/// `supervise plan`: the Plan a turn would get, without running anything.
pub fn plan_only(input: admit::Input<'_>, session: Option<&str>) -> Result<Plan> {
    let session = match session {
        Some(s) => SessionId::parse(s)?,
        None => SessionIdGenerator::new(SystemClock, OsRandom).generate()?,
    };
    let admission = admit::admit(input, session)?;
    let allowed = admission.check()?;
    let ctx = PlanContext {
        root: admission.workspace.root_str(),
        turn_number: 0,
        host_env: Vec::new(),
    };
    plan::compile(
        &ctx,
        &admission.manifest,
        &admission.request,
        &allowed,
        &HostFs,
    )
    .map_err(|e| SupervisorError::Sandbox {
        step: "compile plan",
        detail: e.to_string(),
        source: None,
    })
}

fn interrupted_message() -> String {
    format!(
        "supervise received {}; the turn was killed and nothing was committed",
        crate::interrupt::received().map_or("a signal", |s| s.as_str())
    )
}

/// The owner of the workspace root: committed outputs belong to it.
fn workspace_owner(root: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(root).map_or((0, 0), |m| (m.uid(), m.gid()))
}
