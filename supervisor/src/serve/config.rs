//! The daemon's own configuration (`supervise serve --daemon-config FILE`,
//! issue 28): event subscriptions, bus approvers, the bus's role.
//!
//! ```json
//! {
//!   "subscriptions": [{"type": "invoice.*", "root": "/ws", "package": "b"}],
//!   "max_hops": 8,
//!   "approvers": ["alice"],
//!   "suspend_idle_after_seconds": 300,
//!   "bus": {"role": "production", "sandbox_bus": "/srv/bus-sandbox",
//!           "require_sandbox_first": true}
//! }
//! ```
//!
//! Every field is optional; unknown fields are refused, naming the field.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::eventbus::TypePattern;
use crate::error::{Result, SupervisorError};

/// Largest config file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The hop limit when the config gives none.
pub const DEFAULT_MAX_HOPS: u32 = 8;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Packages a receive's envelopes are routed to, by type pattern.
    #[serde(default)]
    pub subscriptions: Vec<Subscription>,
    /// Longest chain of routed hops from one client envelope; a delivery
    /// beyond it is cut (TS1094), so a subscription loop ends.
    #[serde(default = "default_max_hops")]
    pub max_hops: u32,
    /// Who may approve a bus message (`approvals/<msg_id>.json`).
    #[serde(default)]
    pub approvers: Vec<String>,
    #[serde(default)]
    pub bus: BusPolicy,
    /// A session's warm sandbox, waiting this long for the session's next
    /// turn, is frozen (suspended; `agent.suspended`); the next turn thaws
    /// it (`agent.resumed`) or fails with E2024 when it cannot.
    #[serde(default)]
    pub suspend_idle_after_seconds: Option<u64>,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            subscriptions: Vec::new(),
            max_hops: DEFAULT_MAX_HOPS,
            approvers: Vec::new(),
            bus: BusPolicy::default(),
            suspend_idle_after_seconds: None,
        }
    }
}

fn default_max_hops() -> u32 {
    DEFAULT_MAX_HOPS
}

/// One subscription: envelopes whose type matches go to `package`'s
/// `entry.receive` in `root`, in one session per subscription.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subscription {
    #[serde(rename = "type")]
    pub kind: TypePattern,
    pub root: PathBuf,
    pub package: String,
}

/// Whether the file bus is the sandbox one or production.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusRole {
    #[default]
    Sandbox,
    Production,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusPolicy {
    #[serde(default)]
    pub role: BusRole,
    /// The sandbox bus directory a production bus checks messages against.
    #[serde(default)]
    pub sandbox_bus: Option<PathBuf>,
    /// A live production bus runs only messages first processed in dry-run
    /// on the sandbox bus (same msg_id or same content hash).
    #[serde(default = "yes")]
    pub require_sandbox_first: bool,
}

impl Default for BusPolicy {
    fn default() -> Self {
        Self {
            role: BusRole::Sandbox,
            sandbox_bus: None,
            require_sandbox_first: true,
        }
    }
}

fn yes() -> bool {
    true
}

impl DaemonConfig {
    /// Loads and validates FILE; an error names the field.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes =
            turnstile_policy::input::read_regular_file(path, MAX_CONFIG_BYTES).map_err(|e| {
                SupervisorError::invalid("--daemon-config", format!("{}: {e}", path.display()))
            })?;
        let c: Self = turnstile_policy::strict::from_json_slice(&bytes).map_err(|e| {
            let (field, reason) = e.field_and_reason();
            SupervisorError::invalid(&format!("daemon-config.{field}"), reason)
        })?;
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<()> {
        let bad =
            |f: String, r: String| Err(SupervisorError::invalid(&format!("daemon-config.{f}"), r));
        if !(1..=64).contains(&self.max_hops) {
            return bad(
                "max_hops".into(),
                format!("{} is not within 1..=64", self.max_hops),
            );
        }
        if let Some(n) = self.suspend_idle_after_seconds {
            if !(1..=86_400).contains(&n) {
                return bad(
                    "suspend_idle_after_seconds".into(),
                    format!("{n} is not within 1..=86400"),
                );
            }
        }
        for (i, s) in self.subscriptions.iter().enumerate() {
            if !s.root.is_absolute() {
                return bad(
                    format!("subscriptions[{i}].root"),
                    format!("{} must be an absolute path", s.root.display()),
                );
            }
            if let Err(e) = turnstile_policy::PackageId::parse(&s.package) {
                return bad(format!("subscriptions[{i}].package"), e.to_string());
            }
        }
        for (i, a) in self.approvers.iter().enumerate() {
            let ok = !a.is_empty()
                && a.len() <= 128
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"@._-".contains(&b));
            if !ok {
                return bad(
                    format!("approvers[{i}]"),
                    format!("`{a}` is not a name (1-128 of [A-Za-z0-9@._-])"),
                );
            }
        }
        let b = &self.bus;
        if b.role == BusRole::Production && b.require_sandbox_first && b.sandbox_bus.is_none() {
            return bad(
                "bus.sandbox_bus".into(),
                "a production bus that requires sandbox-first needs the sandbox bus directory (or `require_sandbox_first: false`)".into(),
            );
        }
        if let Some(p) = &b.sandbox_bus {
            if !p.is_absolute() {
                return bad(
                    "bus.sandbox_bus".into(),
                    format!("{} must be an absolute path", p.display()),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<DaemonConfig> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.json");
        std::fs::write(&p, text).unwrap();
        DaemonConfig::load(&p)
    }

    #[test]
    fn issue_28_daemon_config_parses_and_bad_fields_are_named() {
        let c = load(
            r#"{"subscriptions":[{"type":"a.*","root":"/ws","package":"b"}],"approvers":["alice"],
                "bus":{"role":"production","sandbox_bus":"/srv/sb"}}"#,
        )
        .unwrap();
        assert_eq!(c.max_hops, DEFAULT_MAX_HOPS);
        assert!(c.bus.require_sandbox_first);
        for (text, field) in [
            (r#"{"extra":1}"#, "daemon-config.extra"),
            (r#"{"max_hops":0}"#, "daemon-config.max_hops"),
            (
                r#"{"subscriptions":[{"type":"a..b","root":"/ws","package":"b"}]}"#,
                "daemon-config.subscriptions",
            ),
            (
                r#"{"subscriptions":[{"type":"a.b","root":"ws","package":"b"}]}"#,
                "daemon-config.subscriptions[0].root",
            ),
            (r#"{"approvers":["a b"]}"#, "daemon-config.approvers[0]"),
            (
                r#"{"suspend_idle_after_seconds":0}"#,
                "daemon-config.suspend_idle_after_seconds",
            ),
            (
                r#"{"bus":{"role":"production"}}"#,
                "daemon-config.bus.sandbox_bus",
            ),
        ] {
            let e = load(text).unwrap_err();
            assert!(
                e.field().is_some_and(|f| f.starts_with(field)),
                "{text}: {e} {:?}",
                e.field()
            );
        }
    }
}
