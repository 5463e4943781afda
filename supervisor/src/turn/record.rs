//! Recording a turn: the finish entries of both ledgers (one group append:
//! both or neither), the `--json` object derived from the same values, and
//! the entries of a turn refused before execution.

use std::sync::Arc;

use serde_json::Value;
use turnstile_policy::Violations;
use turnstile_policy::canonical;
use turnstile_policy::plan::Plan;
use turnstile_policy::request::BoundRequest;
use turnstile_policy::session::Clock;
use turnstile_policy::timefmt::rfc3339_micros;

use super::{Turn, TurnResult};
use crate::error::Result;
use crate::sandbox::{self, Ending, Execution};
use crate::store::capture::{self, Verdict};
use crate::store::commit::Committed;
use crate::store::evidence::RejectedTurn;
use crate::store::ledger::LedgerKind;
use crate::store::record::{
    BackendMinimum, DeclaredWrite, Durations, Enforcement, EnforcementRecord, ErrorRecord, Event,
    EvidenceEntry, ExecEntry, Layer, LedgerPaths, OutputRecord, Phases, ReceiveRecord, Resources,
    SCHEMA_VERSION, SeccompFacts, StreamOut, Termination, Timings, TurnReport, ViolatedCapability,
    Violation, WriteRecord, WritesOmitted, to_object,
};
use crate::store::session::{Session, SessionLock};
use crate::store::status::TurnStatus;

/// Records a turn refused before execution in both ledgers and returns its
/// turn number.
pub fn record_rejected_turn(
    session: &Session,
    lock: &SessionLock,
    request: &BoundRequest,
    package_id: &str,
    violations: &Violations,
    clock: &dyn Clock,
) -> Result<u64> {
    let turn_number = session.next_turn_number(lock)?;
    let turn = RejectedTurn {
        request,
        package_id,
        turn_number,
        violations,
        at: clock.now(),
    };
    let (exec, evidence) = (
        session.ledger(LedgerKind::Exec),
        session.ledger(LedgerKind::Evidence),
    );
    crate::store::ledger::append_group(
        lock,
        vec![
            (&exec, vec![turn.exec_entry()]),
            (&evidence, vec![turn.evidence_entry()]),
        ],
    )?;
    Ok(turn_number)
}

pub(super) fn ledgers(session: &Session) -> LedgerPaths {
    LedgerPaths {
        exec: session.ledger(LedgerKind::Exec).path,
        evidence: session.ledger(LedgerKind::Evidence).path,
    }
}

/// How a turn ended, before rendering.
pub(super) struct Outcome {
    pub(super) status: TurnStatus,
    /// What went wrong, for statuses that carry an error code.
    pub(super) message: String,
    pub(super) execution: Option<Execution>,
    pub(super) writes: Vec<capture::RealizedWrite>,
    pub(super) verdict: Verdict,
    pub(super) committed: Vec<Committed>,
    pub(super) plan: Option<Arc<Plan>>,
    /// Where the time went, in order.
    pub(super) phases: Phases,
    /// The turn directory's removal: running while the ledgers are
    /// written, or held until they are durable (see [`Cleanup`]).
    pub(super) cleanup: Option<Cleanup>,
    /// `supervise suspend`/`resume` facts, read from the turn directory
    /// before it goes.
    pub(super) suspensions: Vec<crate::store::record::SuspensionFact>,
    /// A receive turn's envelopes (kept only if it commits).
    pub(super) emitted: Vec<turnstile_policy::envelope::EventEnvelope>,
    /// Why a receive turn's output was refused.
    pub(super) refused: Option<ErrorRecord>,
    /// The turn ran to its commit step: the backend may build the next
    /// turn's sandbox (serve's warm pool) once this one is durable.
    pub(super) refill: bool,
}

/// A finished turn's directory removal (its mounts, its cgroups once the
/// init is reaped, the directory). A CLI turn starts it at once, beside
/// its finish entries (the process waits for both); a `serve` worker holds
/// it until the entries are durable ([`crate::backend::Backend::cleans_up_after_reply`]):
/// its unmounts and directory removals on the state directory's file
/// system joined the journal commit the ledgers' `fdatasync` waited for,
/// on the reply's path.
#[derive(Debug)]
pub(crate) enum Cleanup {
    Started(crate::syncpool::Task<()>),
    Held(crate::sandbox::TurnDir),
}

impl Cleanup {
    /// The removal, running (started now if it was held).
    pub(crate) fn start(self) -> crate::syncpool::Task<()> {
        match self {
            Self::Started(h) => h,
            Self::Held(dir) => dir.remove_in_background(),
        }
    }

    /// The removal, done.
    pub(crate) fn finish(self) {
        match self {
            Self::Started(h) => {
                let _ = h.join();
            }
            Self::Held(dir) => drop(dir),
        }
    }
}

/// The facts of one finished turn, typed: both ledger entries and the
/// `--json` report are made from them.
struct Facts {
    now: String,
    exit_code: Option<i32>,
    termination: Option<Termination>,
    violations: Vec<Violation>,
    realized: Vec<WriteRecord>,
    enforcement: Enforcement,
    resources: Option<Resources>,
    output: Option<OutputRecord>,
    error: Option<ErrorRecord>,
    wall_us: u64,
}

impl Turn<'_> {
    pub(super) fn finish(&self, query_hash: &str, o: Outcome) -> Result<TurnResult> {
        // The turn's span (entered by `Turn::run`) gets its status here.
        tracing::Span::current().record("status", o.status.as_str());
        let facts = self.facts(&o);
        let deterministic = self.session.deterministic.is_some();
        let result = serde_json::to_value(ResultDigest {
            status: o.status,
            exit_code: facts.exit_code,
            realized_writes: &facts.realized,
            committed: &o.committed,
            violations: &facts.violations,
        })
        .unwrap_or_default();
        let exec_entry = ExecEntry {
            event: Event::TurnFinished,
            schema_version: SCHEMA_VERSION,
            session_id: self.session.id.to_string(),
            turn_number: self.turn_number,
            query_hash: query_hash.to_owned(),
            result_hash: canonical::hash_value(&result).unwrap_or_default(),
            status: Some(o.status),
            exit_code: facts.exit_code,
            termination: facts.termination.clone(),
            error: facts.error.clone(),
            backend: self.backend.name().to_owned(),
            // Wall-clock measurements vary run to run: a deterministic
            // session keeps them out of its ledgers (--json still has them).
            timings: (!deterministic).then(|| Timings {
                wall_us: facts.wall_us,
                phases_us: Some(o.phases.clone()),
            }),
            ts: facts.now.clone(),
        };
        let evidence = self.evidence_entry(&facts, &o);
        // Both finish entries land together or not at all.
        let (exec, evidence_ledger) = (
            self.session.ledger(LedgerKind::Exec),
            self.session.ledger(LedgerKind::Evidence),
        );
        let mut report = self.report(facts, &o);
        let summary = report.summary(&o.message);
        // The result as given out now: `durations.ledger_entries_ms` is the
        // time since the turn started, less its `wall_ms` — the finish
        // entries up to that moment (durable for a turn answered then,
        // anchors moved otherwise).
        let result_now = |report: &mut crate::store::record::TurnReport| {
            if let Some(d) = report.durations.as_mut() {
                d.ledger_entries_ms =
                    self.started.elapsed().as_micros() as f64 / 1000.0 - d.wall_ms;
            }
            TurnResult {
                exit_status: o.exit_status(),
                value: serde_json::to_value(&*report).unwrap_or_default(),
                summary: summary.clone(),
            }
        };
        // Durable once both entries' bytes are synced: whoever waits for
        // the result (a serve worker's client) may have it then, while the
        // anchors move. Not a keyed turn: its idempotency record is
        // written after, and its reply waits for that too.
        let early = self
            .opts
            .on_durable
            .as_ref()
            .filter(|_| self.request.idempotency_key.is_none());
        crate::store::ledger::append_group_then(
            self.lock,
            vec![
                (&exec, vec![to_object(&exec_entry)]),
                (&evidence_ledger, vec![to_object(&evidence)]),
            ],
            &mut |reached| {
                if reached != crate::store::ledger::Reached::Durable {
                    return;
                }
                if let Some(h) = early {
                    h.call(&result_now(&mut report));
                }
                // Answered: the next turn's warm sandbox is due, built
                // once the daemon has delivered this reply — not before,
                // where it would share the two cores with this turn's last
                // steps, the daemon's relay and the client's exit.
                if let Some(plan) = o.plan.as_ref().filter(|_| o.refill)
                    && crate::turn::interrupt::received().is_none()
                {
                    self.backend
                        .refill(plan, &self.session.state().session_dir(&self.session.id));
                }
            },
        )?;
        Ok(result_now(&mut report))
    }

    /// What the turn's outcome says, typed once.
    fn facts(&self, o: &Outcome) -> Facts {
        let now = rfc3339_micros(self.sources.now());
        let x = o.execution.as_ref();
        let exit_code = x.and_then(|x| match x.ending {
            Ending::Exited(c) => Some(c),
            _ => None,
        });
        let termination = x.map(|x| match &x.ending {
            Ending::Exited(c) => Termination::Exited { exited: *c },
            Ending::Signaled { signal, name } => Termination::Signaled {
                signal: name.clone(),
                number: *signal,
            },
            Ending::SetupFailed { stage, detail } => Termination::SetupFailed {
                setup_failed: stage.clone(),
                detail: detail.clone(),
            },
            Ending::ExecFailed { errno, error } => Termination::ExecFailed {
                exec_failed: error.clone(),
                errno: *errno,
            },
        });
        let implied: std::collections::HashSet<&str> =
            o.verdict.implied.iter().map(|w| w.path.as_str()).collect();
        let realized = o
            .writes
            .iter()
            .map(|w| WriteRecord {
                implied_parent: implied.contains(w.path.as_str()),
                ..WriteRecord::of(w)
            })
            .collect();
        let measured = |v: Option<u64>| v.filter(|_| self.session.deterministic.is_none());
        Facts {
            violations: self.violations(o, &now),
            exit_code,
            termination,
            realized,
            enforcement: self.enforcement(o),
            resources: x.map(|x| Resources {
                peak_memory_bytes: measured(x.usage.peak_memory_bytes),
                cpu_usage_us: measured(x.usage.cpu_usage_us),
                oom_kills: x.usage.oom_kills,
                pids_limit_hits: x.usage.pids_limit_hits,
                disk_full: x.disk_full,
                oom_killed: x.usage.oom_kills > 0,
                cgroup_parent: o
                    .plan
                    .as_ref()
                    .and_then(|p| cgroup_parent_record(&self.opts.cgroup_place, &p.limits)),
            }),
            output: x.map(|x| {
                let stream = |s: &crate::sandbox::StreamRecord| StreamOut {
                    bytes: s.bytes,
                    forwarded: s.forwarded,
                    sha256: s.sha256.clone(),
                };
                OutputRecord {
                    stdout: stream(&x.stdout),
                    stderr: stream(&x.stderr),
                    truncated: x.output_truncated,
                    forwarded_whole: self.opts.forward_all_output,
                }
            }),
            error: o.error(),
            wall_us: self.started.elapsed().as_micros() as u64,
            now,
        }
    }

    /// Verify's violations, then the denials observed inside the sandbox
    /// (FR-RT-011): those do not change the status (a program may handle
    /// EPERM), they are listed.
    fn violations(&self, o: &Outcome, now: &str) -> Vec<Violation> {
        let sid = self.session.id.as_str();
        let verify = |target: &str, capability, details| Violation {
            attempted_operation: "write".into(),
            target: target.to_owned(),
            violated_capability: capability,
            details,
            layer: Layer::Verify,
            hint: None,
            count: 1,
            session_id: sid.to_owned(),
            turn_number: self.turn_number,
            timestamp: Some(now.to_owned()),
        };
        let mut violations: Vec<Violation> = o
            .verdict
            .undeclared
            .iter()
            .map(|w| {
                verify(
                    &w.path,
                    ViolatedCapability::UndeclaredWrite {
                        realized_kind: w.kind.as_str().to_owned(),
                    },
                    format!(
                        "`{}` ({}) was written but not declared: {}",
                        w.path,
                        w.kind.as_str(),
                        w.kind.why_blocked()
                    ),
                )
            })
            .collect();
        violations.extend(o.verdict.missing.iter().map(|m| {
            verify(
                m,
                ViolatedCapability::MissingDeclaredOutput,
                format!("declared output `{m}` was not produced as a regular file"),
            )
        }));
        let x = o.execution.as_ref();
        if let (Some(Ok(d)), Some(plan)) = (x.map(|x| &x.denials), o.plan.as_ref()) {
            violations.extend(crate::turn::denials::syscall_violations(
                d,
                &plan.seccomp,
                sid,
                self.turn_number,
                crate::turn::denials::TurnClock {
                    at: self.started_at,
                    instant: self.started,
                    deterministic: self.session.deterministic.is_some(),
                },
            ));
        }
        violations.extend(self.network(o).1);
        if let (Some(Ok(d)), Some(plan)) = (x.map(|x| &x.observed), o.plan.as_ref()) {
            let forbidden = turnstile_policy::pattern::PatternSet::compile(
                &self.manifest.capabilities.forbidden,
                &self.session.id,
            )
            .ok();
            violations.extend(crate::turn::denials::path_violations(
                d,
                plan,
                forbidden.as_ref(),
                sid,
                self.turn_number,
                crate::turn::denials::TurnClock {
                    at: self.started_at,
                    instant: self.started,
                    deterministic: self.session.deterministic.is_some(),
                },
            ));
        }
        violations
    }

    /// The turn's network flows and their violations (issue 26).
    fn network(&self, o: &Outcome) -> (Vec<crate::store::record::ExternalCall>, Vec<Violation>) {
        match o.execution.as_ref().and_then(|x| x.egress.as_ref()) {
            Some(r) => crate::turn::denials::network_records(
                r,
                self.session.id.as_str(),
                self.turn_number,
                crate::turn::denials::TurnClock {
                    at: self.started_at,
                    instant: self.started,
                    deterministic: self.session.deterministic.is_some(),
                },
            ),
            None => (Vec::new(), Vec::new()),
        }
    }

    fn evidence_entry(&self, f: &Facts, o: &Outcome) -> EvidenceEntry {
        let r = self.request;
        let (realized_writes, scratch_writes, writes_omitted) = bounded_writes(
            f.realized.clone(),
            o.verdict.scratch.iter().map(WriteRecord::of).collect(),
        );
        let suspensions = o.suspensions.clone();
        // A resume that could not thaw the turn ended it: that is its error.
        let error = suspensions
            .iter()
            .find_map(|s| s.error.clone())
            .or_else(|| f.error.clone());
        EvidenceEntry {
            event: Event::TurnFinished,
            schema_version: SCHEMA_VERSION,
            session_id: self.session.id.to_string(),
            turn_number: self.turn_number,
            package_id: Some(self.manifest.package_id.to_string()),
            status: Some(o.status),
            command: Some(r.command.clone()),
            timeout_seconds: r.timeout_seconds,
            execute_entry: Some(self.execute_entry.clone()),
            declared_reads: r.declared_inputs.clone(),
            declared_writes: declared(r),
            realized_writes,
            scratch_writes,
            writes_omitted,
            // Written where nothing is ever committed: recorded, discarded.
            ephemeral_writes: o.execution.as_ref().map(|x| x.ephemeral.clone()),
            committed: o.committed.clone(),
            external_calls: self.network(o).0,
            violations: f.violations.clone(),
            enforcement: Some(EnforcementRecord::Ran(Box::new(f.enforcement.clone()))),
            resources: f.resources.clone(),
            output: f.output.clone(),
            termination: f.termination.clone(),
            error,
            ts: f.now.clone(),
            work_order_id: r.work_order_id.clone(),
            idempotency_key: r.idempotency_key.clone(),
            reverts_turn: None,
            suspensions,
            receive: self.receive_record(o),
        }
    }

    /// A receive turn's record: what it was given and, if it committed,
    /// what it emitted.
    fn receive_record(&self, o: &Outcome) -> Option<ReceiveRecord> {
        self.opts.receive.as_ref().map(|r| ReceiveRecord {
            input: r.envelope.clone(),
            emitted: if o.status == TurnStatus::Committed {
                o.emitted.clone()
            } else {
                Vec::new()
            },
            refused: o.refused.clone(),
            hop: r.hop,
        })
    }

    /// The `--json` report, from the same facts as the entries.
    fn report(&self, f: Facts, o: &Outcome) -> TurnReport {
        let wall_ms = f.wall_us as f64 / 1000.0;
        TurnReport {
            session_id: self.session.id.to_string(),
            turn_number: self.turn_number,
            started_at: Some(rfc3339_micros(self.started_at)),
            finished_at: Some(f.now),
            status: o.status,
            exit_code: f.exit_code,
            termination: f.termination,
            error: f.error,
            realized_writes: f.realized,
            committed: o.committed.clone(),
            ephemeral_writes: o.execution.as_ref().map(|x| x.ephemeral.clone()),
            violations: f.violations,
            enforcement: Some(f.enforcement),
            resources: f.resources,
            ledgers: Some(ledgers(self.session)),
            durations: Some(Durations {
                wall_ms,
                // Whether the sandbox was built for this turn (cold) or
                // before it, from this plan's shape (serve's warm pool).
                sandbox: match &o.execution {
                    Some(x) if x.warm => "warm",
                    Some(_) => "cold",
                    None => "none",
                }
                .into(),
                // Set when the result is given out (`finish`).
                ledger_entries_ms: 0.0,
                phases_ms: o.phases.millis(),
            }),
            replayed: false,
            idempotency_key: None,
            receive: self.receive_record(o),
            output: f.output.clone(),
        }
    }

    fn enforcement(&self, o: &Outcome) -> Enforcement {
        let mut degraded: Vec<String> = Vec::new();
        let landlock = o.execution.as_ref().and_then(|x| x.landlock.clone());
        if let Some(l) = &landlock {
            if l["status"] != "fully_enforced" {
                degraded.push(landlock_degradation(l));
            }
        }
        if let Some(x) = &o.execution {
            degraded.extend(x.degraded.iter().cloned());
            if !x.seccomp_unknown.is_empty() {
                degraded.push(format!(
                    "seccomp: syscalls unknown to libseccomp fall to ENOSYS: {}",
                    x.seccomp_unknown.join(", ")
                ));
            }
        }
        Enforcement {
            backend: self.backend.name().to_owned(),
            backend_chosen_by: Some(self.choice.by.clone()),
            backend_minimum: Some(BackendMinimum {
                backend: self.choice.minimum.as_str().to_owned(),
                by: self.choice.minimum_by.clone(),
            }),
            namespaces: sandbox::NAMESPACES
                .iter()
                .map(|(n, _)| (*n).to_owned())
                .collect(),
            landlock_abi: landlock.as_ref().and_then(|l| l.get("kernel_abi").cloned()),
            landlock_status: landlock.as_ref().and_then(|l| l.get("status").cloned()),
            landlock,
            seccomp: o.plan.as_ref().map(|p| SeccompFacts {
                mode: "filter".into(),
                default: "ENOSYS".into(),
                allowed: p.seccomp.allow.len() as u64,
                denied_eperm: p.seccomp.deny.len() as u64,
                bad_arch: "kill_process".into(),
            }),
            cgroup: o
                .execution
                .as_ref()
                .map(|x| x.cgroup_version.as_str().to_owned()),
            capabilities: "none".into(),
            no_new_privs: true,
            uid: o.plan.as_ref().map(|p| p.uid),
            network: o.plan.as_ref().map(|p| p.network.clone()),
            posture: o
                .execution
                .as_ref()
                .and_then(|x| x.posture.as_ref())
                .map(|p| {
                    let mut v = p.to_value();
                    if self.session.deterministic.is_some() {
                        v["pid"] = Value::Null;
                    }
                    v
                }),
            denials_observed: o
                .execution
                .as_ref()
                .map(|x| {
                    let mut m = crate::turn::denials::observability(&x.denials, &x.observed);
                    if x.egress.is_some() {
                        m.insert(
                            "network".to_owned(),
                            crate::store::record::Observed {
                                observed: true,
                                via: Some(
                                    "the supervisor's resolver and proxy, and the turn namespace's nftables counters (exact, per turn)"
                                        .into(),
                                ),
                                why: None,
                            },
                        );
                    }
                    m
                }),
            degraded,
            // Only for a turn whose sandbox ran: nothing was applied
            // otherwise.
            applied_by: if o.execution.is_some() {
                self.backend
                    .applied_by()
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect()
            } else {
                Default::default()
            },
            not_applied: self
                .backend
                .not_applied()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        }
    }
}

/// The write lists an evidence entry holds: whole while they fit
/// [`crate::store::ledger::RECORD_BUDGET`] (always so for a turn that
/// committed: see `Turn::commit`), else as much of each as fits, with the
/// count left out and the digest of both whole lists.
fn bounded_writes(
    realized: Vec<WriteRecord>,
    scratch: Vec<WriteRecord>,
) -> (Vec<WriteRecord>, Vec<WriteRecord>, Option<WritesOmitted>) {
    let budget = crate::store::ledger::RECORD_BUDGET;
    let total: usize = realized
        .iter()
        .chain(&scratch)
        .map(WriteRecord::recorded_bytes)
        .sum();
    if total <= budget {
        return (realized, scratch, None);
    }
    let sha256 = canonical::hash_value(&serde_json::json!({
        "realized_writes": realized,
        "scratch_writes": scratch,
    }))
    .unwrap_or_default();
    let keep = |list: Vec<WriteRecord>| {
        let whole = list.len();
        let mut used = 0;
        let kept: Vec<WriteRecord> = list
            .into_iter()
            .take_while(|w| {
                used += w.recorded_bytes();
                used <= budget / 2
            })
            .collect();
        let left = (whole - kept.len()) as u64;
        (kept, left)
    };
    let (realized, r_left) = keep(realized);
    let (scratch, s_left) = keep(scratch);
    (
        realized,
        scratch,
        Some(WritesOmitted {
            realized: r_left,
            scratch: s_left,
            sha256,
        }),
    )
}

/// What the exec entry's `result_hash` covers.
#[derive(serde::Serialize)]
struct ResultDigest<'a> {
    status: TurnStatus,
    exit_code: Option<i32>,
    realized_writes: &'a [WriteRecord],
    committed: &'a [Committed],
    violations: &'a [Violation],
}

/// The request's declared outputs as recorded.
pub(crate) fn declared(r: &BoundRequest) -> Vec<DeclaredWrite> {
    r.declared_outputs
        .iter()
        .map(|d| DeclaredWrite {
            path: d.path.clone(),
            role: d.role.clone(),
        })
        .collect()
}

/// The evidence's line for a Landlock ruleset the kernel enforced only in
/// part: the status, and the rights it could not enforce (by name, from
/// the kernel's ABI), so the evidence says what the turn ran without.
fn landlock_degradation(l: &Value) -> String {
    let status = l["status"].as_str().unwrap_or("unknown");
    let rights: Vec<&str> = l["unenforced"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if rights.is_empty() {
        return format!("landlock {status}");
    }
    format!(
        "landlock {status}: the kernel (Landlock ABI {}) cannot enforce {}",
        l["kernel_abi"],
        rights.join(", ")
    )
}

impl Outcome {
    pub(super) fn failed(status: TurnStatus, message: String, plan: Option<Arc<Plan>>) -> Self {
        Self {
            status,
            message,
            execution: None,
            writes: Vec::new(),
            verdict: Verdict::default(),
            committed: Vec::new(),
            plan,
            phases: Phases::new(),
            cleanup: None,
            suspensions: Vec::new(),
            emitted: Vec::new(),
            refused: None,
            refill: false,
        }
    }

    pub(super) fn interrupted(plan: Option<Arc<Plan>>) -> Self {
        Self::failed(TurnStatus::Interrupted, interrupted_message(), plan)
    }

    /// The error object of the entries and `--json` (none for statuses
    /// that are not errors).
    pub(super) fn error(&self) -> Option<ErrorRecord> {
        self.status.code().map(|code| ErrorRecord {
            code: code.code.to_owned(),
            name: code.name.to_owned(),
            message: self.message.clone(),
        })
    }

    pub(super) fn exit_status(&self) -> u8 {
        self.status
            .exit_status(crate::turn::interrupt::received().map(|s| s as i32))
    }
}

pub(super) fn interrupted_message() -> String {
    format!(
        "supervise received {}; the turn was killed and nothing was committed",
        crate::turn::interrupt::received().map_or("a signal", |s| s.as_str())
    )
}

/// The cgroup parent of this process's turns and which limits won (see
/// `run --cgroup-parent`); `None` without one.
fn cgroup_parent_record(
    place: &crate::sandbox::cgroup::Place,
    limits: &turnstile_policy::plan::PlanLimits,
) -> Option<crate::store::record::CgroupParentRecord> {
    use crate::sandbox::cgroup;
    let rel = place.parent()?;
    let b = cgroup::parent_bounds(&place.root, rel);
    let pick = |parent: Option<u64>, manifest: u64| match parent {
        Some(p) if p < manifest => (p, "parent".to_owned()),
        _ => (manifest, "manifest".to_owned()),
    };
    let (effective_memory_bytes, memory_bound_by) = pick(b.memory_bytes, limits.memory_bytes);
    let (effective_pids, pids_bound_by) = pick(b.pids, u64::from(limits.pids));
    Some(crate::store::record::CgroupParentRecord {
        path: format!("/{}", rel.display()),
        parent_memory_bytes: b.memory_bytes,
        manifest_memory_bytes: limits.memory_bytes,
        effective_memory_bytes,
        memory_bound_by,
        parent_pids: b.pids,
        manifest_pids: u64::from(limits.pids),
        effective_pids,
        pids_bound_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_partial_landlock_names_the_rights_it_ran_without() {
        let l = json!({"status": "partially_enforced", "kernel_abi": 2,
            "unenforced": ["fs.truncate", "fs.ioctl_dev", "scope.abstract_unix_socket", "scope.signal"]});
        assert_eq!(
            landlock_degradation(&l),
            "landlock partially_enforced: the kernel (Landlock ABI 2) cannot enforce fs.truncate, fs.ioctl_dev, scope.abstract_unix_socket, scope.signal"
        );
        // An outcome recorded before `unenforced` existed still reads.
        assert_eq!(
            landlock_degradation(&json!({"status": "partially_enforced"})),
            "landlock partially_enforced"
        );
    }
}
