//! Recording a turn: the finish entries of both ledgers (one group append:
//! both or neither), the `--json` object derived from the same values, and
//! the entries of a turn refused before execution.

use serde_json::{Value, json};
use turnstile_policy::Violations;
use turnstile_policy::canonical;
use turnstile_policy::plan::Plan;
use turnstile_policy::request::BoundRequest;
use turnstile_policy::session::Clock;
use turnstile_policy::timefmt::rfc3339_micros;

use super::{Turn, TurnResult};
use crate::error::{Result, SupervisorError};
use crate::sandbox::{self, Ending, Execution};
use crate::store::capture::{self, Verdict};
use crate::store::commit::Committed;
use crate::store::evidence::{RejectedTurn, SCHEMA_VERSION, object};
use crate::store::ledger::LedgerKind;
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

pub(super) fn ledgers(session: &Session) -> Value {
    json!({
        "exec": session.ledger(LedgerKind::Exec).path,
        "evidence": session.ledger(LedgerKind::Evidence).path,
    })
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
    pub(super) plan: Option<Plan>,
    /// Where the time went: (phase, microseconds), in order.
    pub(super) phases: Vec<(&'static str, u64)>,
    /// The turn directory's removal, running while the ledgers are written.
    pub(super) cleanup: Option<std::thread::JoinHandle<()>>,
}

impl Turn<'_> {
    pub(super) fn finish(&self, query_hash: &str, o: Outcome) -> Result<TurnResult> {
        let sid = self.session.id.as_str();
        let now = rfc3339_micros(self.sources.now());
        let deterministic = self.session.deterministic.is_some();
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
                "details": format!("`{}` ({}) was written but not declared: {}", w.path, w.kind.as_str(), w.kind.why_blocked()),
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
        for v in &mut violations {
            if let Value::Object(m) = v {
                m.insert("layer".into(), json!("verify"));
                m.insert("count".into(), json!(1));
            }
        }
        // Denials observed inside the sandbox (FR-RT-011): they do not
        // change the status (a program may handle EPERM), they are listed.
        if let (Some(Ok(d)), Some(plan)) = (x.map(|x| &x.denials), o.plan.as_ref()) {
            violations.extend(crate::turn::denials::syscall_violations(
                d,
                &plan.seccomp,
                sid,
                self.turn_number,
                crate::turn::denials::TurnClock {
                    at: self.started_at,
                    instant: self.started,
                    deterministic,
                },
            ));
        }
        let implied: std::collections::HashSet<&str> =
            o.verdict.implied.iter().map(|w| w.path.as_str()).collect();
        let realized: Vec<Value> = o
            .writes
            .iter()
            .map(|w| {
                let mut v = w.to_value();
                if implied.contains(w.path.as_str()) {
                    v["implied_parent"] = json!(true);
                }
                v
            })
            .collect();
        let committed: Vec<Value> = o
            .committed
            .iter()
            .map(|c| json!({"path": c.path, "size": c.size, "sha256": c.sha256}))
            .collect();
        let enforcement = self.enforcement(&o);
        let measured = |v: Option<u64>| if deterministic { Value::Null } else { json!(v) };
        let resources = x.map(|x| {
            json!({
                "peak_memory_bytes": measured(x.usage.peak_memory_bytes),
                "cpu_usage_us": measured(x.usage.cpu_usage_us),
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
            "backend": self.backend.name(),
            // Wall-clock measurements vary run to run: a deterministic
            // session keeps them out of its ledgers (--json still has them).
            "timings": if deterministic { Value::Null } else { json!({"wall_us": wall_us, "phases_us": phases}) },
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
            "timeout_seconds": r.timeout_seconds,
            "execute_entry": self.execute_entry,
            "declared_reads": r.declared_inputs,
            "declared_writes": r.declared_outputs.iter().map(|d| d.to_value()).collect::<Vec<_>>(),
            "realized_writes": realized,
            "scratch_writes": o.verdict.scratch.iter().map(|w| w.to_value()).collect::<Vec<_>>(),
            // Written where nothing is ever committed: recorded, discarded.
            "ephemeral_writes": o.execution.as_ref().map(|x| x.ephemeral.clone()),
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
        crate::store::ledger::append_group(
            self.lock,
            vec![
                (&exec, vec![exec_entry]),
                (&evidence_ledger, vec![evidence]),
            ],
        )?;

        let value = json!({
            "session_id": sid,
            "turn_number": self.turn_number,
            "started_at": rfc3339_micros(self.started_at),
            "finished_at": now,
            "status": o.status.as_str(),
            "exit_code": command_exit,
            "termination": termination,
            "error": error,
            "realized_writes": realized,
            "committed": committed,
            "ephemeral_writes": o.execution.as_ref().map(|x| x.ephemeral.clone()),
            "violations": violations,
            "enforcement": enforcement,
            "resources": resources,
            "ledgers": ledgers(self.session),
            "durations": {
                "wall_ms": wall_us as f64 / 1000.0,
                // Whether the sandbox was built for this turn (cold) or
                // before it, from this plan's shape (serve's warm pool).
                "sandbox": match &o.execution {
                    Some(x) if x.warm => "warm",
                    Some(_) => "cold",
                    None => "none",
                },
                "ledger_entries_ms": self.started.elapsed().as_micros() as f64 / 1000.0 - wall_us as f64 / 1000.0,
                "phases_ms": o.phases.iter().map(|(k, v)| ((*k).to_owned(), json!(*v as f64 / 1000.0))).collect::<serde_json::Map<String, Value>>(),
            },
        });
        let mut summary = format!("turn {} of {sid}: {}", self.turn_number, o.status);
        if let Some(code) = o.status.code() {
            summary += &format!(" [{}] {}", code.code, o.message);
        }
        for v in &violations {
            summary += &format!(
                "\n  - [{}] {}",
                v["layer"].as_str().unwrap_or("verify"),
                v["details"].as_str().unwrap_or_default()
            );
            if let Some(h) = v["hint"].as_str() {
                summary += &format!("\n    hint: {h}");
            }
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
        json!({
            "backend": self.backend.name(),
            "backend_chosen_by": self.choice.by,
            "backend_minimum": {"backend": self.choice.minimum.as_str(), "by": self.choice.minimum_by},
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
            "posture": o.execution.as_ref().and_then(|x| x.posture.as_ref()).map(|p| {
                let mut v = p.to_value();
                if self.session.deterministic.is_some() {
                    v["pid"] = Value::Null;
                }
                v
            }),
            "denials_observed": o.execution.as_ref().map(|x| crate::turn::denials::observability(&x.denials)),
            "degraded": degraded,
        })
    }
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
    pub(super) fn failed(status: TurnStatus, message: String, plan: Option<Plan>) -> Self {
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

    pub(super) fn interrupted(plan: Option<Plan>) -> Self {
        Self::failed(TurnStatus::Interrupted, interrupted_message(), plan)
    }

    pub(super) fn from_error(e: &SupervisorError, plan: Option<Plan>) -> Self {
        Self::failed(TurnStatus::SandboxError, e.to_string(), plan)
    }

    /// The error object of the entries and `--json` (none for statuses
    /// that are not errors).
    pub(super) fn error(&self) -> Option<Value> {
        self.status
            .code()
            .map(|code| json!({"code": code.code, "name": code.name, "message": self.message}))
    }

    pub(super) fn exit_status(&self) -> u8 {
        self.status
            .exit_status(crate::interrupt::received().map(|s| s as i32))
    }
}

pub(super) fn interrupted_message() -> String {
    format!(
        "supervise received {}; the turn was killed and nothing was committed",
        crate::interrupt::received().map_or("a signal", |s| s.as_str())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
