//! The prompt header (FR-RT-005): the declared context of one turn, placed at
//! the top of the agent's prompt so the model — and anyone auditing it — knows
//! which session and turn it is in and exactly which inputs (by hash) it was
//! given.

use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::request::DeclaredOutput;
use crate::session::SessionId;
use crate::timefmt;

/// A declared input and the sha256 of its content when the header was built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashedInput {
    pub path: String,
    pub sha256: String,
}

/// The header of one turn's prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptHeader {
    pub session_id: SessionId,
    pub turn_number: u32,
    pub declared_inputs: Vec<HashedInput>,
    pub declared_outputs: Vec<DeclaredOutput>,
    pub context_as_of: OffsetDateTime,
    pub work_order_id: Option<String>,
}

impl PromptHeader {
    /// The JSON form; `work_order_id` is present only when set.
    pub fn to_value(&self) -> Value {
        let mut v = json!({
            "session_id": self.session_id.as_str(),
            "turn_number": self.turn_number,
            "declared_inputs": self.declared_inputs.iter()
                .map(|i| json!({"path": i.path, "sha256": i.sha256})).collect::<Vec<_>>(),
            "declared_outputs": self.declared_outputs.iter().map(DeclaredOutput::to_value).collect::<Vec<_>>(),
            "context_as_of": timefmt::rfc3339_micros(self.context_as_of),
        });
        if let (Some(w), Some(map)) = (&self.work_order_id, v.as_object_mut()) {
            map.insert("work_order_id".into(), json!(w));
        }
        v
    }

    /// The text form placed in a prompt.
    pub fn render_text(&self) -> String {
        let mut s = String::from("[turnstile prompt header]\n");
        s += &format!("session_id: {}\n", self.session_id);
        s += &format!("turn_number: {}\n", self.turn_number);
        if let Some(w) = &self.work_order_id {
            s += &format!("work_order_id: {w}\n");
        }
        s += &format!(
            "context_as_of: {}\n",
            timefmt::rfc3339_micros(self.context_as_of)
        );
        s += "declared_inputs:\n";
        if self.declared_inputs.is_empty() {
            s += "  (none)\n";
        }
        for i in &self.declared_inputs {
            s += &format!("  - {} sha256:{}\n", i.path.escape_debug(), i.sha256);
        }
        s += "declared_outputs:\n";
        if self.declared_outputs.is_empty() {
            s += "  (none)\n";
        }
        for o in &self.declared_outputs {
            s += &format!("  - {} ({})\n", o.path.escape_debug(), o.role);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(work_order: Option<&str>) -> PromptHeader {
        PromptHeader {
            session_id: SessionId::parse("SES-20261121T093700123456Z-00000000deadbeef").unwrap(),
            turn_number: 3,
            declared_inputs: vec![HashedInput {
                path: "registries/users.csv".into(),
                sha256: "ab".repeat(32),
            }],
            declared_outputs: vec![DeclaredOutput {
                path: "output/x/report.md".into(),
                role: "report".into(),
            }],
            context_as_of: OffsetDateTime::from_unix_timestamp(1_795_253_820).unwrap(),
            work_order_id: work_order.map(str::to_owned),
        }
    }

    #[test]
    fn fr_rt_005_header_carries_every_declared_field() {
        let v = header(Some("WO-42")).to_value();
        assert_eq!(
            v["session_id"],
            "SES-20261121T093700123456Z-00000000deadbeef"
        );
        assert_eq!(v["turn_number"], 3);
        assert_eq!(v["declared_inputs"][0]["sha256"], "ab".repeat(32));
        assert_eq!(v["declared_outputs"][0]["role"], "report");
        assert_eq!(v["context_as_of"], "2026-11-21T09:37:00.000000Z");
        assert_eq!(v["work_order_id"], "WO-42");
        let text = header(Some("WO-42")).render_text();
        assert!(text.contains("work_order_id: WO-42"));
        assert!(text.contains(&format!("registries/users.csv sha256:{}", "ab".repeat(32))));
    }

    #[test]
    fn fr_rt_005_work_order_only_when_present() {
        let v = header(None).to_value();
        assert!(v.get("work_order_id").is_none());
        assert!(!header(None).render_text().contains("work_order_id"));
    }
}
