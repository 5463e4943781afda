//! EventEnvelope v1 (seed 001 "EventEnvelope V1 Schema"): the unit the
//! runtime receives and emits — turn requested, started, finished,
//! violation. Serialized canonically (keys sorted, no insignificant
//! whitespace), so the same content is the same bytes. The JSON Schema is
//! `schemas/event-envelope-v1.schema.json`; [`EventEnvelope::to_cloudevent`]
//! gives the CloudEvents 1.0 JSON form.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::canonical;
use crate::error::PolicyError;

/// The envelope schema version this code reads and writes.
pub const SCHEMA_VERSION: &str = "1";

/// The runtime's own event types. Any other dotted name (see
/// [`valid_type`]) is an agent's; `turn.*` and `agent.*` are reserved for
/// the runtime.
pub const TYPES: &[&str] = &[
    "turn.requested",
    "turn.started",
    "turn.finished",
    "turn.violation",
];

/// The type prefixes only the runtime emits.
pub const RESERVED_PREFIXES: &[&str] = &["turn.", "agent."];

/// Whether `kind` is a dotted name: two or more segments of
/// `[A-Za-z0-9_-]`, each starting with a letter, at most 128 characters.
pub fn valid_type(kind: &str) -> bool {
    kind.len() <= 128
        && kind.split('.').count() >= 2
        && kind.split('.').all(|seg| {
            seg.starts_with(|c: char| c.is_ascii_alphabetic())
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// Whether `kind` belongs to the runtime (`turn.*`, `agent.*`).
pub fn is_reserved(kind: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|p| kind.starts_with(p))
}

/// Who sent the event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    pub agent: String,
    pub adapter: String,
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventEnvelope {
    pub id: String,
    /// RFC 3339 UTC.
    pub ts: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub schema_version: String,
    pub idempotency_key: String,
    pub source: Source,
    #[serde(default)]
    pub payload: Value,
}

fn invalid(field: &str, reason: impl Into<String>) -> PolicyError {
    PolicyError::InvalidRequest {
        field: format!("envelope.{field}"),
        reason: reason.into(),
    }
}

impl EventEnvelope {
    /// Parses and validates an envelope (unknown fields, a missing
    /// mandatory field, an unknown type or version are errors naming the
    /// field).
    pub fn from_json(bytes: &[u8]) -> Result<Self, PolicyError> {
        // Duplicate keys (and floats, which no canonical envelope holds)
        // are errors, not "the last one wins".
        canonical::parse_strict(bytes).map_err(|e| invalid("(document)", e.to_string()))?;
        let v: Self =
            serde_json::from_slice(bytes).map_err(|e| invalid("(document)", e.to_string()))?;
        v.validate()?;
        Ok(v)
    }

    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(invalid(
                "schema_version",
                format!(
                    "`{}` is not supported (only `{SCHEMA_VERSION}`)",
                    self.schema_version
                ),
            ));
        }
        if !valid_type(&self.kind) {
            return Err(invalid(
                "type",
                format!(
                    "`{}` is not a dotted name (segments of [A-Za-z0-9_-] starting with a letter, e.g. `invoice.received`)",
                    self.kind
                ),
            ));
        }
        if self.kind.starts_with("turn.") && !TYPES.contains(&self.kind.as_str()) {
            return Err(invalid(
                "type",
                format!(
                    "`{}`: `turn.*` is the runtime's and must be one of {TYPES:?}",
                    self.kind
                ),
            ));
        }
        for (field, value) in [
            ("id", &self.id),
            ("idempotency_key", &self.idempotency_key),
            ("source.agent", &self.source.agent),
            ("source.adapter", &self.source.adapter),
        ] {
            if value.is_empty() || value.len() > 256 || value.chars().any(char::is_control) {
                return Err(invalid(
                    field,
                    "must be 1-256 characters without control characters",
                ));
            }
        }
        time::OffsetDateTime::parse(&self.ts, &time::format_description::well_known::Rfc3339)
            .ok()
            .filter(|_| self.ts.ends_with('Z'))
            .ok_or_else(|| invalid("ts", "must be an RFC 3339 UTC time ending in Z"))?;
        if !self.payload.is_object() {
            return Err(invalid("payload", "must be an object"));
        }
        Ok(())
    }

    /// The canonical bytes: keys sorted, no whitespace; the same content
    /// gives the same bytes. Canonical JSON has no floating-point numbers:
    /// a payload holding one is an error naming the payload.
    pub fn to_canonical(&self) -> Result<Vec<u8>, PolicyError> {
        let v = serde_json::to_value(self).map_err(|e| invalid("payload", e.to_string()))?;
        canonical::to_vec(&v).map_err(|e| invalid("payload", e.to_string()))
    }

    /// The same event as CloudEvents 1.0 (structured JSON mode).
    pub fn to_cloudevent(&self) -> Value {
        json!({
            "specversion": "1.0",
            "id": self.id,
            "source": format!("turnstile://{}/{}", self.source.agent, self.source.adapter),
            "type": format!("org.turnstile.{}", self.kind),
            "time": self.ts,
            "datacontenttype": "application/json",
            "dataschema": format!("turnstile:event-envelope/v{SCHEMA_VERSION}"),
            "idempotencykey": self.idempotency_key,
            "data": self.payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EventEnvelope {
        EventEnvelope {
            id: "EVT-1".into(),
            ts: "2026-01-01T00:00:00.000000Z".into(),
            kind: "turn.requested".into(),
            schema_version: "1".into(),
            idempotency_key: "IDEM-123".into(),
            source: Source {
                agent: "hello-agent".into(),
                adapter: "cli".into(),
            },
            payload: json!({"z": 1, "a": {"y": 2, "b": 3}}),
        }
    }

    #[test]
    fn seed_001_stable_serialization_canonical_bytes_sort_keys() {
        let e = sample();
        let bytes = e.to_canonical().unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with("{\"id\":\"EVT-1\",\"idempotency_key\":\"IDEM-123\",\"payload\":{\"a\":{\"b\":3,\"y\":2},\"z\":1},\"schema_version\":\"1\",\"source\":{\"adapter\":\"cli\",\"agent\":\"hello-agent\"},\"ts\":"), "{text}");
        // Round trip: bit-for-bit identical.
        let back = EventEnvelope::from_json(&bytes).unwrap();
        assert_eq!(back.to_canonical().unwrap(), bytes);
        // Field order in the input does not matter.
        let shuffled = r#"{"type":"turn.requested","source":{"agent":"hello-agent","adapter":"cli"},"ts":"2026-01-01T00:00:00.000000Z","schema_version":"1","payload":{"z":1,"a":{"b":3,"y":2}},"idempotency_key":"IDEM-123","id":"EVT-1"}"#;
        assert_eq!(
            EventEnvelope::from_json(shuffled.as_bytes())
                .unwrap()
                .to_canonical()
                .unwrap(),
            bytes
        );
    }

    #[test]
    fn seed_001_mandatory_fields_bad_envelopes_name_the_field() {
        let cases = [
            (r#"{"id":"x"}"#, "envelope.(document)"),
            (
                &sample()
                    .to_canonical()
                    .unwrap()
                    .iter()
                    .map(|&b| b as char)
                    .collect::<String>()
                    .replace("\"1\"", "\"2\""),
                "envelope.schema_version",
            ),
            (
                &String::from_utf8(sample().to_canonical().unwrap())
                    .unwrap()
                    .replace("turn.requested", "turn.exploded"),
                "envelope.type",
            ),
            (
                &String::from_utf8(sample().to_canonical().unwrap())
                    .unwrap()
                    .replace("IDEM-123", ""),
                "envelope.idempotency_key",
            ),
            (
                &String::from_utf8(sample().to_canonical().unwrap())
                    .unwrap()
                    .replace("00.000000Z", "00.000000+01:00"),
                "envelope.ts",
            ),
            (
                &String::from_utf8(sample().to_canonical().unwrap())
                    .unwrap()
                    .replace("\"id\":", "\"extra\":1,\"id\":"),
                "envelope.(document)",
            ),
        ];
        for (doc, field) in cases {
            match EventEnvelope::from_json(doc.as_bytes()) {
                Err(PolicyError::InvalidRequest { field: f, .. }) => assert_eq!(f, field, "{doc}"),
                other => panic!("{doc}: {other:?}"),
            }
        }
    }

    /// Issue 28: any dotted name is a type; `turn.*` stays the runtime's.
    /// Red-team, stop 54: a duplicated key was accepted (the last won).
    #[test]
    fn an_envelope_with_a_duplicate_key_is_refused() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["payload"] = json!({"n": 1});
        let text = v.to_string().replacen("{\"n\":1}", "{\"n\":1,\"n\":2}", 1);
        assert!(text.contains("\"n\":2"), "{text}");
        let err = EventEnvelope::from_json(text.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("duplicate key `n`"), "{err}");
        assert!(EventEnvelope::from_json(v.to_string().as_bytes()).is_ok());
    }

    #[test]
    fn issue_28_types_are_dotted_names() {
        for ok in [
            "invoice.received",
            "a.b.c",
            "Order_x.paid-late",
            "agent.suspended",
        ] {
            assert!(valid_type(ok), "{ok}");
        }
        for bad in ["invoice", ".a", "a.", "a..b", "1a.b", "a.b c", "a.b/c", ""] {
            assert!(!valid_type(bad), "{bad}");
        }
        assert!(is_reserved("turn.finished") && is_reserved("agent.resumed"));
        assert!(!is_reserved("turnover.x"));
        let mut e = sample();
        e.kind = "invoice.received".into();
        e.validate().unwrap();
        e.kind = "invoice".into();
        assert!(e.validate().is_err());
    }

    #[test]
    fn cloudevents_form_carries_every_field() {
        let c = sample().to_cloudevent();
        assert_eq!(c["specversion"], "1.0");
        assert_eq!(c["type"], "org.turnstile.turn.requested");
        assert_eq!(c["source"], "turnstile://hello-agent/cli");
        assert_eq!(c["idempotencykey"], "IDEM-123");
        assert_eq!(c["data"]["z"], 1);
    }
}
