//! ARA `receive` as a turn (issue 28, seed 001 "Pure Receive Function"):
//! the input envelope's canonical JSON on the agent's stdin, its stdout
//! read — within the turn's output budget — as EventEnvelope v1 lines.
//!
//! Each line is validated: the v1 schema, `source.agent` = the package, no
//! runtime type (`turn.*`, `agent.*`); the fields an agent may leave out
//! are derived deterministically from the input (`id` and
//! `idempotency_key` from the input key and the line's index, `ts` the
//! input's, `source.adapter` `ara`). One bad line refuses them all: the
//! turn fails and emits nothing.
//!
//! Purity is by construction, not by asking: the turn's network is
//! isolated whatever the manifest says (`turn::run_turn`), it writes only
//! its declared outputs (capture and verify), and it has no bus — what it
//! returns is all it can say.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use turnstile_policy::envelope::{EventEnvelope, SCHEMA_VERSION, Source, is_reserved};
use turnstile_policy::error::{ErrorCode, codes};

use crate::store::record::ErrorRecord;

/// The most of an agent's output a receive turn reads (its stdout is
/// held in memory); a manifest's smaller `limits.output_bytes` applies.
pub const MAX_OUTPUT_BYTES: u64 = 16 << 20;

/// The adapter named by envelopes an agent returns without one.
pub const ADAPTER: &str = "ara";

/// A receive turn's input.
#[derive(Debug, Clone)]
pub struct ReceiveInput {
    pub envelope: EventEnvelope,
    /// Routed hops from the chain's first envelope (0 from a client).
    pub hop: u32,
}

impl ReceiveInput {
    /// The agent's stdin: the envelope's canonical JSON and a newline.
    pub fn stdin_text(&self) -> String {
        let bytes = self.envelope.to_canonical().unwrap_or_default();
        format!("{}\n", String::from_utf8_lossy(&bytes))
    }
}

/// What an agent may print per line: the envelope, with the fields the
/// runtime derives left out if it likes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    id: Option<String>,
    ts: Option<String>,
    #[serde(rename = "type")]
    kind: String,
    schema_version: Option<String>,
    idempotency_key: Option<String>,
    source: Option<Source>,
    payload: Option<Value>,
}

fn refused(code: ErrorCode, message: String) -> ErrorRecord {
    ErrorRecord {
        code: code.code.to_owned(),
        name: code.name.to_owned(),
        message,
    }
}

/// `key:index`, or its digest's when that would exceed 256 characters.
fn derived(key: &str, index: usize) -> String {
    let d = format!("{key}:{index}");
    if d.len() <= 256 {
        d
    } else {
        format!(
            "sha256:{}:{index}",
            hex::encode(Sha256::digest(key.as_bytes()))
        )
    }
}

/// The agent's envelopes from its stdout, or why they are refused
/// (TS1092 beyond the budget, TS1091 for a bad line).
pub fn parse_output(
    input: &EventEnvelope,
    package: &str,
    stdout: &[u8],
    truncated: bool,
    budget: u64,
) -> Result<Vec<EventEnvelope>, ErrorRecord> {
    if truncated {
        return Err(refused(
            codes::RECEIVE_OUTPUT_TOO_LARGE,
            format!(
                "the agent printed more than its output budget ({budget} bytes, `limits.output_bytes`): its envelopes are refused"
            ),
        ));
    }
    let bad = |n: usize, what: String| {
        refused(
            codes::RECEIVE_ENVELOPE_INVALID,
            format!("stdout line {n}: {what}; nothing is emitted"),
        )
    };
    let mut out = Vec::new();
    for (i, raw) in stdout.split(|&b| b == b'\n').enumerate() {
        let n = i + 1;
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let line: Line = serde_json::from_slice(raw)
            .map_err(|e| bad(n, format!("not an EventEnvelope v1 object: {e}")))?;
        let index = out.len();
        let source = line.source.unwrap_or_else(|| Source {
            agent: package.to_owned(),
            adapter: ADAPTER.to_owned(),
        });
        if source.agent != package {
            return Err(bad(
                n,
                format!(
                    "envelope.source.agent `{}` is not the package `{package}`",
                    source.agent
                ),
            ));
        }
        if is_reserved(&line.kind) {
            return Err(bad(
                n,
                format!(
                    "envelope.type `{}`: `turn.*` and `agent.*` are the runtime's",
                    line.kind
                ),
            ));
        }
        let e = EventEnvelope {
            id: line.id.unwrap_or_else(|| {
                format!(
                    "EVT-{}",
                    &hex::encode(Sha256::digest(derived(&input.idempotency_key, index)))[..32]
                )
            }),
            ts: line.ts.unwrap_or_else(|| input.ts.clone()),
            kind: line.kind,
            schema_version: line
                .schema_version
                .unwrap_or_else(|| SCHEMA_VERSION.to_owned()),
            idempotency_key: line
                .idempotency_key
                .unwrap_or_else(|| derived(&input.idempotency_key, index)),
            source,
            payload: line
                .payload
                .unwrap_or_else(|| Value::Object(Default::default())),
        };
        e.validate().map_err(|err| bad(n, err.to_string()))?;
        e.to_canonical().map_err(|err| bad(n, err.to_string()))?;
        out.push(e);
    }
    Ok(out)
}

/// The turn request of a receive: the manifest's `entry.receive` as the
/// command, the envelope's key as the turn's (a key received twice runs
/// once), the declared inputs and outputs given (none by default: a pure
/// receive writes nothing). `attempt` > 0 (the daemon's router only): a
/// new try after attempts whose turns were cut by a crash (`aborted`:
/// nothing of them committed), under the key `<key>:attempt<N>`.
pub fn request(
    root: &std::path::Path,
    package: &str,
    envelope: &EventEnvelope,
    attempt: u32,
    declared_inputs: Vec<String>,
    declared_outputs: Option<Vec<turnstile_policy::request::DeclaredOutput>>,
    timeout_seconds: Option<u64>,
) -> crate::error::Result<turnstile_policy::request::TurnRequest> {
    let id = turnstile_policy::PackageId::parse(package)?;
    let manifest = turnstile_policy::Manifest::load(root, &id)?;
    let command =
        manifest
            .receive
            .ok_or_else(|| crate::error::SupervisorError::ReceiveNoEntry {
                package: package.to_owned(),
            })?;
    Ok(turnstile_policy::request::TurnRequest::from_doc(
        turnstile_policy::request::RequestDoc {
            command: Some(command),
            declared_inputs,
            declared_outputs: Some(declared_outputs.unwrap_or_default()),
            work_order_id: None,
            idempotency_key: Some(attempt_key(&envelope.idempotency_key, attempt)),
            timeout_seconds,
        },
    )?)
}

/// The turn's idempotency key for an attempt: the envelope's key (its
/// digest, `sha256:<hex>`, when it is not a turn key's token), then
/// `:attempt<N>` after the first.
fn attempt_key(key: &str, attempt: u32) -> String {
    let token = key.len() <= 240
        && key.starts_with(|c: char| c.is_ascii_alphanumeric())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    let base = if token {
        key.to_owned()
    } else {
        format!("sha256:{}", hex::encode(Sha256::digest(key.as_bytes())))
    };
    if attempt == 0 {
        base
    } else {
        format!("{base}:attempt{attempt}")
    }
}

/// `receive --json`: the turn and the envelopes it emitted.
#[derive(Debug, Serialize, Deserialize)]
pub struct Received {
    pub session_id: String,
    pub turn_number: u64,
    pub status: crate::store::status::TurnStatus,
    #[serde(default)]
    pub replayed: bool,
    pub emitted: Vec<EventEnvelope>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorRecord>,
    pub exit_code: u8,
}

/// A receive turn as the CLI and the daemon print it: the emitted
/// envelopes, canonical, one per line (with `--json`, one [`Received`]
/// object); a refused agent output as its TS109x error. Anything else (a
/// timeout, a limit, an error before the turn) as `run` prints it.
pub fn render(
    json: bool,
    outcome: crate::turn::outcome::Outcome,
    value: Value,
) -> (crate::turn::outcome::Outcome, Value) {
    let Ok(report) = serde_json::from_value::<crate::store::record::TurnReport>(value.clone())
    else {
        return (outcome, value);
    };
    let Some(rec) = report.receive else {
        return (outcome, value);
    };
    let committed = report.status == crate::store::status::TurnStatus::Committed;
    if !committed && rec.refused.is_none() {
        return (outcome, value);
    }
    let received = Received {
        session_id: report.session_id,
        turn_number: report.turn_number,
        status: report.status,
        replayed: report.replayed,
        emitted: rec.emitted,
        error: rec.refused,
        exit_code: outcome.status,
    };
    let v = serde_json::to_value(&received).unwrap_or_default();
    let stdout = if json {
        format!("{v}\n")
    } else {
        received
            .emitted
            .iter()
            .filter_map(|e| e.to_canonical().ok())
            .map(|b| format!("{}\n", String::from_utf8_lossy(&b)))
            .collect()
    };
    let stderr = match &received.error {
        Some(e) => format!(
            "supervise: error[{} {}]: {}\n{}",
            e.code, e.name, e.message, outcome.stderr
        ),
        None => outcome.stderr,
    };
    (
        crate::turn::outcome::Outcome {
            status: outcome.status,
            stdout,
            stderr,
        },
        v,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> EventEnvelope {
        EventEnvelope {
            id: "EVT-in".into(),
            ts: "2026-01-01T00:00:00.000000Z".into(),
            kind: "invoice.received".into(),
            schema_version: "1".into(),
            idempotency_key: "IDEM-123".into(),
            source: Source {
                agent: "client".into(),
                adapter: "cli".into(),
            },
            payload: serde_json::json!({}),
        }
    }

    #[test]
    fn issue_28_agent_lines_get_derived_fields_and_bad_ones_refuse_all() {
        let out = b"{\"type\":\"invoice.checked\",\"payload\":{\"n\":1}}\n\n{\"type\":\"invoice.paid\",\"idempotency_key\":\"mine\"}\n";
        let e = parse_output(&input(), "a", out, false, 1 << 20).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].idempotency_key, "IDEM-123:0");
        assert_eq!(attempt_key("IDEM-123", 0), "IDEM-123");
        assert_eq!(attempt_key("IDEM-123", 2), "IDEM-123:attempt2");
        assert!(attempt_key("has space#", 0).starts_with("sha256:"));
        assert_eq!(e[1].idempotency_key, "mine");
        assert_eq!(e[0].source.agent, "a");
        assert_eq!(e[0].ts, input().ts);
        // Same input, same bytes.
        let again = parse_output(&input(), "a", out, false, 1 << 20).unwrap();
        assert_eq!(e, again);
        for (bad, what) in [
            (&b"{\"type\":\"turn.finished\"}\n"[..], "runtime's"),
            (
                b"{\"type\":\"x.y\",\"source\":{\"agent\":\"b\",\"adapter\":\"x\"}}",
                "not the package",
            ),
            (b"{\"type\":\"x.y\"}\nnot json\n", "line 2"),
            (
                b"{\"type\":\"x.y\",\"schema_version\":\"2\"}",
                "schema_version",
            ),
            (b"{\"type\":\"x.y\",\"extra\":1}", "unknown field"),
            (b"{\"type\":\"nodot\"}", "envelope.type"),
        ] {
            let err = parse_output(&input(), "a", bad, false, 1 << 20).unwrap_err();
            assert_eq!(err.code, "TS1091");
            assert!(err.message.contains(what), "{}", err.message);
        }
        let err = parse_output(&input(), "a", b"", true, 10).unwrap_err();
        assert_eq!(err.code, "TS1092");
    }
}
