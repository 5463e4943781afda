//! The contents of ledger entries (DESIGN "Ledgers").
//!
//! exec entries say what happened (query and result hashes, status, exit
//! code, timings, backend); evidence entries say what was declared, what was
//! realized, what was violated and which enforcement was in force. Every turn
//! writes one of each, whatever its outcome (FR-RT-007, FR-RT-018); evidence
//! always carries session_id, the 1-based turn_number and the work order when
//! there is one (FR-RT-017).

use serde::Serialize;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use turnstile_policy::canonical;
use turnstile_policy::check::{self, CapabilityViolation};
use turnstile_policy::request::BoundRequest;
use turnstile_policy::timefmt::rfc3339_micros;
use turnstile_policy::{SessionId, Violations};

use super::record::{
    DeclaredWrite, EnforcementRecord, ErrorRecord, Event, EvidenceEntry, ExecEntry, Layer, Timings,
    ViolatedCapability, Violation, to_object,
};
use super::status::TurnStatus;
use crate::store::ledger::LedgerKind;

pub use super::record::SCHEMA_VERSION;

/// A JSON object's map (empty for anything else): entry bodies are objects.
pub(crate) fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The first entry of both ledgers of a new session.
#[derive(Debug, Serialize)]
struct SessionStarted<'a> {
    event: Event,
    schema_version: u64,
    ledger: &'static str,
    session_id: &'a str,
    tier: &'a str,
    ts: String,
}

/// The first entry of both ledgers of a new session.
pub fn session_started(
    session: &SessionId,
    tier: &str,
    kind: LedgerKind,
    at: OffsetDateTime,
) -> Map<String, Value> {
    to_object(&SessionStarted {
        event: Event::SessionStarted,
        schema_version: SCHEMA_VERSION,
        ledger: kind.as_str(),
        session_id: session.as_str(),
        tier,
        ts: rfc3339_micros(at),
    })
}

/// A pre-execution violation as recorded: the policy's violation with its
/// layer, hint, count and place.
pub fn pre_execution_violation(
    v: &CapabilityViolation,
    session: &str,
    turn_number: u64,
    at: OffsetDateTime,
) -> Violation {
    Violation {
        attempted_operation: v.operation.as_str().to_owned(),
        target: v.target.clone(),
        violated_capability: match &v.capability {
            check::ViolatedCapability::Forbidden { pattern } => ViolatedCapability::Forbidden {
                pattern: pattern.clone(),
            },
            check::ViolatedCapability::Reserved { path } => {
                ViolatedCapability::Reserved { path: path.clone() }
            }
            check::ViolatedCapability::NotGranted { capability } => {
                ViolatedCapability::NotGranted {
                    capability: (*capability).to_owned(),
                }
            }
        },
        details: v.details.clone(),
        layer: Layer::PreExecution,
        hint: Some(v.hint()),
        count: 1,
        session_id: session.to_owned(),
        turn_number,
        timestamp: Some(rfc3339_micros(at)),
    }
}

/// A turn stopped by the pre-execution check: nothing ran.
#[derive(Debug)]
pub struct RejectedTurn<'a> {
    pub request: &'a BoundRequest,
    pub package_id: &'a str,
    pub turn_number: u64,
    pub violations: &'a Violations,
    pub at: OffsetDateTime,
}

impl RejectedTurn<'_> {
    /// The violations as recorded.
    pub fn violations(&self) -> Vec<Violation> {
        self.violations
            .0
            .iter()
            .map(|v| {
                pre_execution_violation(v, self.request.session.as_str(), self.turn_number, self.at)
            })
            .collect()
    }

    /// The error both entries carry.
    pub fn error(&self) -> ErrorRecord {
        let code = turnstile_policy::error::codes::SECURITY_POLICY_VIOLATION;
        ErrorRecord {
            code: code.code.to_owned(),
            name: code.name.to_owned(),
            message: self.violations.to_string(),
        }
    }

    /// The exec ledger entry.
    pub fn exec_entry(&self) -> Map<String, Value> {
        #[derive(Serialize)]
        struct Digest {
            status: TurnStatus,
            violations: Vec<Violation>,
        }
        let query_hash = canonical::hash_value(&self.request.to_value()).unwrap_or_default();
        let result = serde_json::to_value(Digest {
            status: TurnStatus::Violation,
            violations: self.violations(),
        })
        .unwrap_or_default();
        to_object(&ExecEntry {
            event: Event::TurnFinished,
            schema_version: SCHEMA_VERSION,
            session_id: self.request.session.to_string(),
            turn_number: self.turn_number,
            query_hash,
            result_hash: canonical::hash_value(&result).unwrap_or_default(),
            status: Some(TurnStatus::Violation),
            exit_code: None,
            termination: None,
            error: Some(self.error()),
            backend: "none".into(),
            timings: Some(Timings {
                wall_us: 0,
                phases_us: None,
            }),
            ts: rfc3339_micros(self.at),
        })
    }

    /// The evidence ledger entry.
    pub fn evidence_entry(&self) -> Map<String, Value> {
        let r = self.request;
        to_object(&EvidenceEntry {
            event: Event::TurnFinished,
            schema_version: SCHEMA_VERSION,
            session_id: r.session.to_string(),
            turn_number: self.turn_number,
            package_id: Some(self.package_id.to_owned()),
            status: Some(TurnStatus::Violation),
            command: Some(r.command.clone()),
            timeout_seconds: r.timeout_seconds,
            declared_reads: r.declared_inputs.clone(),
            declared_writes: r
                .declared_outputs
                .iter()
                .map(|d| DeclaredWrite {
                    path: d.path.clone(),
                    role: d.role.clone(),
                })
                .collect(),
            violations: self.violations(),
            enforcement: Some(EnforcementRecord::not_run()),
            error: Some(self.error()),
            ts: rfc3339_micros(self.at),
            work_order_id: r.work_order_id.clone(),
            idempotency_key: r.idempotency_key.clone(),
            ..EvidenceEntry::default()
        })
    }
}
