//! The turn request: what one turn wants to run and what it declares it will
//! read and write. The JSON form (`--request FILE`) and the CLI flags build
//! the same [`TurnRequest`].
//!
//! `declared_outputs` is required (FR-RT-013): an explicit empty list means
//! "this turn writes nothing"; a missing field is an error.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::PolicyError;
use crate::manifest::MAX_TIMEOUT_SECONDS;
use crate::path::{self, Absolute};
use crate::session::SessionId;

/// Largest request document accepted.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Most arguments in a command.
pub const MAX_ARGS: usize = 4096;
/// Longest single argument (the kernel's MAX_ARG_STRLEN).
pub const MAX_ARG_BYTES: usize = 128 * 1024;
/// Most declared inputs or outputs.
pub const MAX_DECLARED: usize = 10_000;

/// One declared output.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredOutput {
    pub path: String,
    pub role: String,
}

impl DeclaredOutput {
    pub fn to_value(&self) -> Value {
        json!({"path": self.path, "role": self.role})
    }
}

/// The request as written; everything optional so missing fields get our own
/// messages.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestDoc {
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub declared_inputs: Vec<String>,
    pub declared_outputs: Option<Vec<DeclaredOutput>>,
    pub work_order_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub timeout_seconds: Option<u64>,
}

/// A validated turn request, not yet bound to a session (paths may still
/// contain `<session_id>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRequest {
    pub command: Vec<String>,
    pub declared_inputs: Vec<String>,
    pub declared_outputs: Vec<DeclaredOutput>,
    pub work_order_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub timeout_seconds: Option<u64>,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> PolicyError {
    PolicyError::InvalidRequest {
        field: field.into(),
        reason: reason.into(),
    }
}

/// `[A-Za-z0-9][A-Za-z0-9._:-]*`, 1..=max bytes.
fn check_token(field: &str, value: &str, max: usize) -> Result<(), PolicyError> {
    let mut bytes = value.bytes();
    let ok = !value.is_empty()
        && value.len() <= max
        && bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!(
                "`{}` must be 1 to {max} characters: a letter or digit, then letters, digits, `.`, `_`, `:` or `-`",
                value.escape_debug()
            ),
        ))
    }
}

/// Checks declared input paths (relative or absolute).
pub fn validate_inputs(inputs: &[String]) -> Result<(), PolicyError> {
    if inputs.len() > MAX_DECLARED {
        return Err(invalid(
            "declared_inputs",
            format!("has more than {MAX_DECLARED} entries"),
        ));
    }
    for (i, input) in inputs.iter().enumerate() {
        path::check_syntax(input, Absolute::Allowed).map_err(|r| {
            invalid(
                format!("declared_inputs[{i}]"),
                format!("`{}` {r}", input.escape_debug()),
            )
        })?;
    }
    Ok(())
}

/// Checks declared outputs: relative paths, valid roles, no duplicates.
pub fn validate_outputs(outputs: &[DeclaredOutput]) -> Result<(), PolicyError> {
    if outputs.len() > MAX_DECLARED {
        return Err(invalid(
            "declared_outputs",
            format!("has more than {MAX_DECLARED} entries"),
        ));
    }
    for (i, out) in outputs.iter().enumerate() {
        path::check_syntax(&out.path, Absolute::Refused).map_err(|r| {
            invalid(
                format!("declared_outputs[{i}].path"),
                format!("`{}` {r}", out.path.escape_debug()),
            )
        })?;
        if out.role.is_empty() {
            return Err(invalid(format!("declared_outputs[{i}].role"), "is empty"));
        }
        check_token(&format!("declared_outputs[{i}].role"), &out.role, 64)?;
        if outputs[..i].iter().any(|o| o.path == out.path) {
            return Err(invalid(
                format!("declared_outputs[{i}].path"),
                format!("`{}` is declared twice", out.path),
            ));
        }
    }
    Ok(())
}

/// Checks a work order id.
pub fn validate_work_order(id: &str) -> Result<(), PolicyError> {
    check_token("work_order_id", id, 128)
}

impl TurnRequest {
    /// Parses the JSON form.
    pub fn from_json(bytes: &[u8]) -> Result<Self, PolicyError> {
        if bytes.len() > MAX_REQUEST_BYTES {
            return Err(invalid(
                "(document)",
                format!("is larger than {MAX_REQUEST_BYTES} bytes"),
            ));
        }
        let doc: RequestDoc = crate::strict::from_json_slice(bytes).map_err(|e| {
            let (field, reason) = e.field_and_reason();
            invalid(field, reason)
        })?;
        Self::from_doc(doc)
    }

    /// Validates a request document (also what the CLI flags build).
    pub fn from_doc(doc: RequestDoc) -> Result<Self, PolicyError> {
        let command = doc
            .command
            .ok_or_else(|| invalid("command", "is required"))?;
        if command.is_empty() {
            return Err(invalid(
                "command",
                "is empty; give the executable and its arguments",
            ));
        }
        if command.len() > MAX_ARGS {
            return Err(invalid(
                "command",
                format!("has more than {MAX_ARGS} arguments"),
            ));
        }
        for (i, arg) in command.iter().enumerate() {
            if arg.contains('\0') {
                return Err(invalid(format!("command[{i}]"), "contains a NUL byte"));
            }
            if arg.len() > MAX_ARG_BYTES {
                return Err(invalid(
                    format!("command[{i}]"),
                    format!("is longer than {MAX_ARG_BYTES} bytes"),
                ));
            }
        }
        let program = &command[0];
        path::check_syntax(program, Absolute::Allowed)
            .map_err(|r| invalid("command[0]", format!("`{}` {r}", program.escape_debug())))?;
        if !program.contains('/') {
            return Err(invalid(
                "command[0]",
                format!(
                    "`{program}` is a bare name; give the executable's path (e.g. /usr/bin/{program}) or a path relative to the workspace root — turnstile does not search PATH"
                ),
            ));
        }

        validate_inputs(&doc.declared_inputs)?;
        let outputs = doc.declared_outputs.ok_or_else(|| {
            invalid(
                "declared_outputs",
                "is required (FR-RT-013): list every file the turn writes, or give an empty list ([] / --no-outputs) for a turn that writes nothing",
            )
        })?;
        validate_outputs(&outputs)?;
        if let Some(w) = &doc.work_order_id {
            validate_work_order(w)?;
        }
        if let Some(k) = &doc.idempotency_key {
            check_token("idempotency_key", k, 256)?;
        }
        if let Some(t) = doc.timeout_seconds {
            if t == 0 || t > MAX_TIMEOUT_SECONDS {
                return Err(invalid(
                    "timeout_seconds",
                    format!("{t} is outside 1..={MAX_TIMEOUT_SECONDS}"),
                ));
            }
        }
        Ok(Self {
            command,
            declared_inputs: doc.declared_inputs,
            declared_outputs: outputs,
            work_order_id: doc.work_order_id,
            idempotency_key: doc.idempotency_key,
            timeout_seconds: doc.timeout_seconds,
        })
    }

    /// Expands `<session_id>` everywhere and re-checks for duplicates the
    /// expansion may have created.
    pub fn bind(&self, session: &SessionId) -> Result<BoundRequest, PolicyError> {
        let declared_outputs: Vec<DeclaredOutput> = self
            .declared_outputs
            .iter()
            .map(|o| DeclaredOutput {
                path: path::expand(&o.path, session),
                role: o.role.clone(),
            })
            .collect();
        for (i, out) in declared_outputs.iter().enumerate() {
            if declared_outputs[..i].iter().any(|o| o.path == out.path) {
                return Err(invalid(
                    format!("declared_outputs[{i}].path"),
                    format!(
                        "`{}` is declared twice (after expanding <session_id>)",
                        out.path
                    ),
                ));
            }
        }
        Ok(BoundRequest {
            session: session.clone(),
            command: self
                .command
                .iter()
                .map(|a| path::expand(a, session))
                .collect(),
            declared_inputs: self
                .declared_inputs
                .iter()
                .map(|p| path::expand(p, session))
                .collect(),
            declared_outputs,
            work_order_id: self.work_order_id.clone(),
            idempotency_key: self.idempotency_key.clone(),
            timeout_seconds: self.timeout_seconds,
        })
    }
}

/// A request bound to a session: every path is concrete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundRequest {
    pub session: SessionId,
    pub command: Vec<String>,
    pub declared_inputs: Vec<String>,
    pub declared_outputs: Vec<DeclaredOutput>,
    pub work_order_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub timeout_seconds: Option<u64>,
}

impl BoundRequest {
    /// The request as a JSON value; its canonical hash is the turn's
    /// `query_hash`.
    pub fn to_value(&self) -> Value {
        json!({
            "session_id": self.session.as_str(),
            "command": self.command,
            "declared_inputs": self.declared_inputs,
            "declared_outputs": self.declared_outputs.iter().map(DeclaredOutput::to_value).collect::<Vec<_>>(),
            "work_order_id": self.work_order_id,
            "idempotency_key": self.idempotency_key,
            "timeout_seconds": self.timeout_seconds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid() -> SessionId {
        SessionId::parse("SES-20261121T093700123456Z-00000000deadbeef").unwrap()
    }

    #[test]
    fn fr_rt_013_declared_outputs_is_required_but_may_be_empty() {
        let err = TurnRequest::from_json(br#"{"command":["/bin/true"]}"#).unwrap_err();
        assert_eq!(err.field(), Some("declared_outputs"));
        assert!(err.to_string().contains("FR-RT-013"));
        let ok =
            TurnRequest::from_json(br#"{"command":["/bin/true"],"declared_outputs":[]}"#).unwrap();
        assert!(ok.declared_outputs.is_empty());
    }

    #[test]
    fn fr_rt_013_each_output_needs_path_and_role() {
        let err = TurnRequest::from_json(
            br#"{"command":["/bin/true"],"declared_outputs":[{"path":"output/x"}]}"#,
        )
        .unwrap_err();
        assert_eq!(err.field(), Some("declared_outputs[0]"), "{err}");
        assert!(err.to_string().contains("role"));
    }

    #[test]
    fn every_object_position_refuses_an_array_or_any_non_object() {
        let full = serde_json::json!({
            "command": ["/bin/true"],
            "declared_inputs": ["registries/users.csv"],
            "declared_outputs": [{"path": "output/<session_id>/a", "role": "report"},
                                 {"path": "output/<session_id>/b", "role": "log"}],
            "work_order_id": "WO-1",
            "idempotency_key": "K-1",
            "timeout_seconds": 30
        });
        TurnRequest::from_json(full.to_string().as_bytes()).unwrap();
        let mut positions = std::collections::BTreeSet::new();
        for replace in crate::strict::test_support::non_objects() {
            for (field, doc) in crate::strict::test_support::each_object_replaced(&full, &*replace)
            {
                positions.insert(field.clone());
                let err = TurnRequest::from_json(doc.to_string().as_bytes()).unwrap_err();
                assert_eq!(err.field(), Some(field.as_str()), "{doc}: {err}");
                assert_eq!(err.code().code, "TS1003", "{doc}: {err}");
                assert!(err.to_string().contains("JSON object"), "{doc}: {err}");
            }
        }
        assert_eq!(
            positions.into_iter().collect::<Vec<_>>(),
            ["(document)", "declared_outputs[0]", "declared_outputs[1]"]
        );
    }

    #[test]
    fn bind_expands_the_session_and_catches_duplicates() {
        let r = TurnRequest::from_json(
            br#"{"command":["/bin/sh","output/<session_id>/x"],"declared_inputs":["tmp/<session_id>/in"],
                 "declared_outputs":[{"path":"output/<session_id>/a","role":"report"},
                                     {"path":"output/SES-20261121T093700123456Z-00000000deadbeef/a","role":"r2"}]}"#,
        )
        .unwrap();
        let err = r.bind(&sid()).unwrap_err();
        assert_eq!(err.field(), Some("declared_outputs[1].path"));
        let r = TurnRequest::from_json(
            br#"{"command":["/bin/sh"],"declared_inputs":["tmp/<session_id>/in"],
                 "declared_outputs":[{"path":"output/<session_id>/a","role":"report"}]}"#,
        )
        .unwrap();
        let b = r.bind(&sid()).unwrap();
        assert_eq!(b.declared_outputs[0].path, format!("output/{}/a", sid()));
        assert_eq!(b.declared_inputs[0], format!("tmp/{}/in", sid()));
    }
}
