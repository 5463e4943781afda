//! The pre-execution check (FR-RT-003, FR-RT-010, FR-RT-013): before anything
//! runs, the turn's argv is matched against the execute entries, its declared
//! inputs against read, its declared outputs against write, and everything
//! against forbidden and reserved paths.
//!
//! The check is advisory about nothing: a violation means the turn does not
//! run. It is also not the only layer — the sandbox enforces the same
//! capabilities in the kernel — but it is the one that can say *why* before
//! any side effect.

use std::fmt;

use serde_json::{Value, json};

use crate::error::PolicyError;
use crate::manifest::{Manifest, RESERVED_WRITE};
use crate::path::{self, Absolute};
use crate::pattern::{Pattern, PatternSet, Target};
use crate::request::BoundRequest;

/// The kind of operation a violation is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
    Execute,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Execute => "execute",
        }
    }
}

/// Which capability a violation broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViolatedCapability {
    /// The target matches this forbidden pattern.
    Forbidden { pattern: String },
    /// The target lies in a reserved, supervisor-owned path.
    Reserved { path: String },
    /// No pattern of this capability list grants the target.
    NotGranted { capability: &'static str },
}

impl ViolatedCapability {
    pub fn to_value(&self) -> Value {
        match self {
            Self::Forbidden { pattern } => json!({"kind": "forbidden", "pattern": pattern}),
            Self::Reserved { path } => json!({"kind": "reserved", "path": path}),
            Self::NotGranted { capability } => {
                json!({"kind": "not_granted", "capability": capability})
            }
        }
    }
}

/// One capability violation: what was attempted, which capability forbids
/// it, and a human explanation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityViolation {
    pub operation: Operation,
    pub target: String,
    pub capability: ViolatedCapability,
    pub details: String,
}

impl CapabilityViolation {
    /// The hint for a pre-execution violation: the smallest manifest entry
    /// that would allow it, or why none can.
    pub fn hint(&self) -> String {
        match &self.capability {
            ViolatedCapability::Forbidden { pattern } => {
                format!("forbidden beats every grant (`{pattern}`); no entry can allow it")
            }
            ViolatedCapability::Reserved { path } => {
                format!("`{path}` is reserved for the supervisor; no entry can allow it")
            }
            ViolatedCapability::NotGranted { capability } => {
                // An execute target is the command line; the entry names
                // the program (a fixed argument prefix is optional).
                let target = if self.operation.as_str() == "execute" {
                    self.target.split(' ').next().unwrap_or(&self.target)
                } else {
                    self.target.as_str()
                };
                format!("add `{target}` to capabilities.{capability}")
            }
        }
    }

    /// The evidence form (the supervisor adds session, turn and timestamp).
    pub fn to_value(&self) -> Value {
        json!({
            "attempted_operation": self.operation.as_str(),
            "target": self.target,
            "violated_capability": self.capability.to_value(),
            "details": self.details,
        })
    }
}

impl fmt::Display for CapabilityViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} `{}`: {}",
            self.operation.as_str(),
            self.target,
            self.details
        )
    }
}

/// The non-empty set of violations of one turn: turnstile's
/// `CapabilityViolation` error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("capability violation: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Violations(pub Vec<CapabilityViolation>);

/// What the check allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The execute entry (as written in the manifest) that admitted argv.
    pub execute_entry: String,
}

/// A manifest's capabilities compiled for one session.
#[derive(Debug, Clone)]
pub struct CompiledCapabilities {
    root: String,
    read: PatternSet,
    write: PatternSet,
    forbidden: PatternSet,
    reserved: PatternSet,
    execute: Vec<(String, PatternSet, Vec<String>)>,
    session_output: String,
}

impl CompiledCapabilities {
    /// `root` is the absolute, canonical workspace root.
    pub fn compile(
        root: &str,
        manifest: &Manifest,
        request: &BoundRequest,
    ) -> Result<Self, PolicyError> {
        let session = &request.session;
        // Cannot fail for a loaded manifest (its lists were compiled at load
        // with a probe id of the same shape); kept as an error, never a panic.
        let compile = |patterns: &[Pattern], field: &str| {
            PatternSet::compile_checked(patterns, session).map_err(|e| {
                PolicyError::InvalidManifest {
                    path: manifest.source.clone(),
                    field: match e.index {
                        Some(i) => format!("{field}[{i}]"),
                        None => field.to_owned(),
                    },
                    reason: e.reason,
                }
            })
        };
        let caps = &manifest.capabilities;
        let reserved: Vec<Pattern> = RESERVED_WRITE
            .iter()
            .filter_map(|r| Pattern::parse(r).ok())
            .collect();
        let execute = caps
            .execute
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let set = compile(std::slice::from_ref(&e.program), "capabilities.execute")
                    .map_err(|err| match err {
                        PolicyError::InvalidManifest { path, reason, .. } => {
                            PolicyError::InvalidManifest {
                                path,
                                field: format!("capabilities.execute[{i}]"),
                                reason,
                            }
                        }
                        other => other,
                    })?;
                Ok((e.as_str().to_owned(), set, e.args.clone()))
            })
            .collect::<Result<Vec<_>, PolicyError>>()?;
        Ok(Self {
            root: root.trim_end_matches('/').to_owned(),
            read: compile(&caps.read, "capabilities.read")?,
            write: compile(&caps.write, "capabilities.write")?,
            forbidden: compile(&caps.forbidden, "capabilities.forbidden")?,
            reserved: compile(&reserved, "(reserved)")?,
            execute,
            session_output: format!("output/{session}"),
        })
    }

    fn target(&self, p: &str) -> Target {
        Target::new(&self.root, p)
    }

    /// The directory of another session than this check's that `p` lies
    /// in, if any ([`crate::pattern::other_session_dir`]).
    fn other_session_dir(&self, p: &str) -> Option<String> {
        let own = self.session_output.strip_prefix("output/")?;
        crate::pattern::other_session_dir(&self.target(p).relative?, own)
    }

    fn forbidden(
        &self,
        op: Operation,
        target_path: &str,
        out: &mut Vec<CapabilityViolation>,
    ) -> bool {
        if let Some(p) = self.forbidden.matching(&self.target(target_path)) {
            out.push(CapabilityViolation {
                operation: op,
                target: target_path.to_owned(),
                capability: ViolatedCapability::Forbidden {
                    pattern: p.to_string(),
                },
                details: format!("matches forbidden pattern `{p}`; forbidden beats every grant"),
            });
            true
        } else {
            false
        }
    }

    /// Runs the pre-execution check on `request`.
    pub fn check(&self, request: &BoundRequest) -> Result<Allowed, Violations> {
        let mut v = Vec::new();
        let argv = &request.command;
        let program = argv.first().map(String::as_str).unwrap_or_default();
        let display = argv.join(" ");

        // Execute: argv[0] against the entries' executables, then the fixed
        // argument prefix.
        let mut execute_entry = None;
        if !self.forbidden(Operation::Execute, program, &mut v) {
            let target = self.target(program);
            let mut path_matches = Vec::new();
            for (raw, set, prefix) in &self.execute {
                if set.matching(&target).is_none() {
                    continue;
                }
                path_matches.push(raw.as_str());
                let args = &argv[1..];
                if args.len() >= prefix.len() && args[..prefix.len()] == prefix[..] {
                    execute_entry = Some(raw.clone());
                    break;
                }
            }
            if execute_entry.is_none() {
                let details = if path_matches.is_empty() {
                    format!("`{program}` matches no execute entry")
                } else {
                    format!(
                        "`{program}` is allowed only with a fixed argument prefix: {}",
                        path_matches
                            .iter()
                            .map(|e| format!("`{e}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                v.push(CapabilityViolation {
                    operation: Operation::Execute,
                    target: display.clone(),
                    capability: ViolatedCapability::NotGranted {
                        capability: "execute",
                    },
                    details,
                });
            }
        }
        // Arguments that name forbidden paths are refused too: masking makes
        // them unreadable anyway, but saying so before the run is clearer.
        for arg in &argv[1..] {
            if path::check_syntax(arg, Absolute::Allowed).is_ok() {
                self.forbidden(Operation::Execute, arg, &mut v);
            }
        }

        for input in &request.declared_inputs {
            if self.forbidden(Operation::Read, input, &mut v) {
                continue;
            }
            if self.read.matching(&self.target(input)).is_none() {
                v.push(CapabilityViolation {
                    operation: Operation::Read,
                    target: input.clone(),
                    capability: ViolatedCapability::NotGranted { capability: "read" },
                    details: format!("declared input `{input}` matches no read pattern"),
                });
            }
        }

        for out in &request.declared_outputs {
            let p = &out.path;
            if self.forbidden(Operation::Write, p, &mut v) {
                continue;
            }
            if let Some(r) = self.reserved.matching(&self.target(p)) {
                v.push(CapabilityViolation {
                    operation: Operation::Write,
                    target: p.clone(),
                    capability: ViolatedCapability::Reserved {
                        path: r.to_string(),
                    },
                    details: format!("`{p}` lies in reserved path `{r}`; no turn may write there"),
                });
                continue;
            }
            // Another session's directory (another tenant's, in a shared
            // workspace): never, whatever a pattern says.
            if let Some(other) = self.other_session_dir(p) {
                v.push(CapabilityViolation {
                    operation: Operation::Write,
                    target: p.clone(),
                    capability: ViolatedCapability::Reserved {
                        path: other.clone(),
                    },
                    details: format!(
                        "`{p}` lies in another session's directory `{other}/`; a turn writes only its own session's"
                    ),
                });
                continue;
            }
            let under_session_output = p
                .strip_prefix(&self.session_output)
                .is_some_and(|rest| rest.starts_with('/'));
            if !under_session_output && self.write.matching(&self.target(p)).is_none() {
                v.push(CapabilityViolation {
                    operation: Operation::Write,
                    target: p.clone(),
                    capability: ViolatedCapability::NotGranted { capability: "write" },
                    details: format!(
                        "declared output `{p}` matches no write pattern and is not under `{}/` (FR-RT-013)",
                        self.session_output
                    ),
                });
            }
        }

        match execute_entry {
            Some(execute_entry) if v.is_empty() => Ok(Allowed { execute_entry }),
            _ => Err(Violations(v)),
        }
    }
}

/// Compiles `manifest` for the request's session and checks the request.
/// The outer error is a malformed policy; the inner one the violations.
pub fn check_turn(
    root: &str,
    manifest: &Manifest,
    request: &BoundRequest,
) -> Result<Result<Allowed, Violations>, PolicyError> {
    Ok(CompiledCapabilities::compile(root, manifest, request)?.check(request))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::PackageId;
    use crate::request::TurnRequest;
    use crate::session::SessionId;
    use std::path::PathBuf;

    const SID: &str = "SES-20261121T093700123456Z-00000000deadbeef";

    fn manifest() -> Manifest {
        Manifest::from_slice(
            br#"{"capabilities":{
                "read":["installed/hello-agent/**","registries/*.csv","planes/ho1/sessions/<session_id>/ledger/*.jsonl"],
                "write":["reports/<session_id>/*.md"],
                "execute":["/usr/bin/python3 installed/hello-agent/main.py","installed/hello-agent/bin/run.sh --fast","/bin/true"],
                "forbidden":["installed/hello-agent/secrets/**","/etc/shadow","registries/private.csv"]}}"#,
            &PackageId::parse("hello-agent").unwrap(),
            PathBuf::from("m.json"),
        )
        .unwrap()
    }

    fn run(json: &str) -> Result<Allowed, Violations> {
        let req = TurnRequest::from_json(json.as_bytes()).unwrap();
        let bound = req.bind(&SessionId::parse(SID).unwrap()).unwrap();
        check_turn("/ws", &manifest(), &bound).unwrap()
    }

    fn only(json: &str) -> CapabilityViolation {
        let v = run(json).unwrap_err().0;
        assert_eq!(v.len(), 1, "{v:?}");
        v.into_iter().next().unwrap()
    }

    #[test]
    fn fr_rt_003_allowed_turn_names_its_execute_entry() {
        let ok = run(
            r#"{"command":["/usr/bin/python3","installed/hello-agent/main.py","--x"],
            "declared_inputs":["registries/users.csv"],
            "declared_outputs":[{"path":"output/<session_id>/r.md","role":"report"},
                                {"path":"reports/<session_id>/summary.md","role":"summary"}]}"#,
        )
        .unwrap();
        assert_eq!(
            ok.execute_entry,
            "/usr/bin/python3 installed/hello-agent/main.py"
        );
    }

    #[test]
    fn fr_rt_003_execute_requires_entry_and_argument_prefix() {
        let v = only(r#"{"command":["/bin/sh","-c","id"],"declared_outputs":[]}"#);
        assert_eq!(v.operation, Operation::Execute);
        assert_eq!(
            v.capability,
            ViolatedCapability::NotGranted {
                capability: "execute"
            }
        );
        let v = only(r#"{"command":["/usr/bin/python3","-c","print(1)"],"declared_outputs":[]}"#);
        assert!(v.details.contains("fixed argument prefix"), "{}", v.details);
        assert!(
            run(
                r#"{"command":["installed/hello-agent/bin/run.sh","--fast"],"declared_outputs":[]}"#
            )
            .is_ok()
        );
        assert!(
            run(r#"{"command":["installed/hello-agent/bin/run.sh"],"declared_outputs":[]}"#)
                .is_err()
        );
    }

    #[test]
    fn fr_rt_003_reads_need_a_read_pattern() {
        let v = only(
            r#"{"command":["/bin/true"],"declared_inputs":["registries/sub/x.csv"],"declared_outputs":[]}"#,
        );
        assert_eq!(v.operation, Operation::Read);
        assert_eq!(
            v.capability,
            ViolatedCapability::NotGranted { capability: "read" }
        );
        assert!(run(&format!(
            r#"{{"command":["/bin/true"],"declared_inputs":["planes/ho1/sessions/{SID}/ledger/exec.jsonl"],"declared_outputs":[]}}"#
        ))
        .is_ok());
    }

    #[test]
    fn fr_rt_013_outputs_must_match_write_or_session_output() {
        let v = only(
            r#"{"command":["/bin/true"],"declared_outputs":[{"path":"reports/other/x.md","role":"r"}]}"#,
        );
        assert_eq!(v.operation, Operation::Write);
        assert!(v.details.contains("FR-RT-013"));
        let v = only(
            r#"{"command":["/bin/true"],"declared_outputs":[{"path":"output/SES-20261121T093700123456Z-0000000000000001/x","role":"r"}]}"#,
        );
        // Another session's directory: reserved, whatever a pattern says.
        assert_eq!(
            v.capability,
            ViolatedCapability::Reserved {
                path: "output/SES-20261121T093700123456Z-0000000000000001".into()
            }
        );
        assert!(v.details.contains("another session"), "{}", v.details);
        // `output/<sid>` itself (not below it) is a directory, never an output file.
        assert!(run(r#"{"command":["/bin/true"],"declared_outputs":[{"path":"output/<session_id>","role":"r"}]}"#).is_err());
    }

    #[test]
    fn fr_rt_010_forbidden_beats_every_grant_with_details() {
        let v = only(
            r#"{"command":["/bin/true"],"declared_inputs":["installed/hello-agent/secrets/key.pem"],"declared_outputs":[]}"#,
        );
        assert_eq!(v.operation, Operation::Read);
        assert_eq!(
            v.capability,
            ViolatedCapability::Forbidden {
                pattern: "installed/hello-agent/secrets/**".into()
            }
        );
        assert!(v.details.contains("forbidden"));
        let v = only(
            r#"{"command":["/bin/true"],"declared_inputs":["registries/private.csv"],"declared_outputs":[]}"#,
        );
        assert!(matches!(v.capability, ViolatedCapability::Forbidden { .. }));
        // Absolute forms of a relative forbidden path are caught too.
        let v = only(
            r#"{"command":["/bin/true"],"declared_inputs":["/ws/registries/private.csv"],"declared_outputs":[]}"#,
        );
        assert!(matches!(v.capability, ViolatedCapability::Forbidden { .. }));
        let v = only(
            r#"{"command":["/usr/bin/python3","installed/hello-agent/main.py","/etc/shadow"],"declared_outputs":[]}"#,
        );
        assert_eq!(
            v.capability,
            ViolatedCapability::Forbidden {
                pattern: "/etc/shadow".into()
            }
        );
        let e = run(r#"{"command":["/bin/true"],"declared_outputs":[{"path":"installed/hello-agent/secrets/x","role":"r"}]}"#)
            .unwrap_err();
        assert!(
            e.to_string().starts_with("capability violation: write"),
            "{e}"
        );
    }

    #[test]
    fn reserved_outputs_are_refused_even_when_written_under_planes() {
        let v = only(&format!(
            r#"{{"command":["/bin/true"],"declared_outputs":[{{"path":"planes/ho1/sessions/{SID}/ledger/exec.jsonl","role":"r"}}]}}"#
        ));
        assert!(matches!(v.capability, ViolatedCapability::Reserved { .. }));
    }

    #[test]
    fn every_violation_is_reported_not_just_the_first() {
        let v = run(r#"{"command":["/bin/sh"],"declared_inputs":["x"],"declared_outputs":[{"path":"y","role":"r"}]}"#)
            .unwrap_err();
        assert_eq!(v.0.len(), 3);
    }
}
