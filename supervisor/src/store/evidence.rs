//! The contents of ledger entries (DESIGN "Ledgers").
//!
//! exec entries say what happened (query and result hashes, status, exit
//! code, timings, backend); evidence entries say what was declared, what was
//! realized, what was violated and which enforcement was in force. Every turn
//! writes one of each, whatever its outcome (FR-RT-007, FR-RT-018); evidence
//! always carries session_id, the 1-based turn_number and the work order when
//! there is one (FR-RT-017).

use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use turnstile_policy::canonical;
use turnstile_policy::request::BoundRequest;
use turnstile_policy::timefmt::rfc3339_micros;
use turnstile_policy::{SessionId, Violations};

use crate::store::ledger::LedgerKind;

/// Version of the entry schema written here.
pub const SCHEMA_VERSION: u64 = 1;

/// A JSON object's map (empty for anything else): entry bodies are objects.
pub(crate) fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The first entry of both ledgers of a new session.
pub fn session_started(
    session: &SessionId,
    tier: &str,
    kind: LedgerKind,
    at: OffsetDateTime,
) -> Map<String, Value> {
    object(json!({
        "event": "session.started",
        "schema_version": SCHEMA_VERSION,
        "ledger": kind.as_str(),
        "session_id": session.as_str(),
        "tier": tier,
        "ts": rfc3339_micros(at),
    }))
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
    fn violations_value(&self) -> Vec<Value> {
        self.violations
            .0
            .iter()
            .map(|v| {
                let mut m = object(v.to_value());
                m.insert("layer".into(), json!("pre-execution"));
                m.insert(
                    "hint".into(),
                    json!(v.hint()),
                );
                m.insert("count".into(), json!(1));
                m.insert("session_id".into(), json!(self.request.session.as_str()));
                m.insert("turn_number".into(), json!(self.turn_number));
                m.insert("timestamp".into(), json!(rfc3339_micros(self.at)));
                Value::Object(m)
            })
            .collect()
    }

    /// The exec ledger entry.
    pub fn exec_entry(&self) -> Map<String, Value> {
        let query_hash = canonical::hash_value(&self.request.to_value()).unwrap_or_default();
        let result = json!({"status": "violation", "violations": self.violations_value()});
        let result_hash = canonical::hash_value(&result).unwrap_or_default();
        object(json!({
            "event": "turn.finished",
            "schema_version": SCHEMA_VERSION,
            "session_id": self.request.session.as_str(),
            "turn_number": self.turn_number,
            "query_hash": query_hash,
            "result_hash": result_hash,
            "status": "violation",
            "exit_code": null,
            "backend": "none",
            "timings": {"wall_us": 0},
            "ts": rfc3339_micros(self.at),
        }))
    }

    /// The evidence ledger entry.
    pub fn evidence_entry(&self) -> Map<String, Value> {
        let r = self.request;
        let mut m = object(json!({
            "event": "turn.finished",
            "schema_version": SCHEMA_VERSION,
            "session_id": r.session.as_str(),
            "turn_number": self.turn_number,
            "status": "violation",
            "package_id": self.package_id,
            "command": r.command,
            "timeout_seconds": r.timeout_seconds,
            "declared_reads": r.declared_inputs,
            "declared_writes": r.declared_outputs.iter().map(|o| o.to_value()).collect::<Vec<_>>(),
            "realized_writes": [],
            "external_calls": [],
            "violations": self.violations_value(),
            "enforcement": {"stage": "pre-execution check", "ran": false},
            "ts": rfc3339_micros(self.at),
        }));
        if let Some(w) = &r.work_order_id {
            m.insert("work_order_id".into(), json!(w));
        }
        if let Some(k) = &r.idempotency_key {
            m.insert("idempotency_key".into(), json!(k));
        }
        m
    }
}
