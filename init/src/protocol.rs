//! The init ↔ supervisor protocol: what the sandbox's init reports in the
//! turn directory's report file, one JSON object per line, typed on both
//! sides (the init writes [`InitEvent`]s, the supervisor reads them back and
//! never matches on field names).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One report line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum InitEvent {
    /// A stage failed before the command ran (the turn fails closed).
    Error { stage: String, detail: String },
    /// What Landlock enforced.
    Landlock { outcome: Value },
    /// The command's stage is about to exec (pid in the supervisor's view
    /// of the init's namespace).
    Exec { pid: u32 },
    /// execve failed.
    ExecFailed {
        errno: Option<i32>,
        error: Option<String>,
    },
    /// The command exited.
    Exit { code: i32 },
    /// The command was killed by a signal.
    Signal {
        signal: i32,
        name: String,
        core: bool,
    },
    /// What the command left in a private ephemeral directory.
    Ephemeral {
        dir: String,
        files: Vec<Value>,
        truncated: bool,
    },
    /// The init's own laps: (name, µs since it started building the root).
    InitLaps { us: Vec<(String, u64)> },
}

impl InitEvent {
    /// The line the init writes (with its newline).
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }
}

/// Every event of a report file's text; a line that is not an event (a
/// torn last line of a killed init) is skipped.
pub fn parse(text: &str) -> Vec<InitEvent> {
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_keep_their_wire_names() {
        let events = vec![
            InitEvent::Error {
                stage: "bind mount".into(),
                detail: "x".into(),
            },
            InitEvent::Landlock {
                outcome: serde_json::json!({"status": "fully_enforced"}),
            },
            InitEvent::Exec { pid: 7 },
            InitEvent::ExecFailed {
                errno: Some(2),
                error: Some("ENOENT".into()),
            },
            InitEvent::Exit { code: 3 },
            InitEvent::Signal {
                signal: 9,
                name: "SIGKILL".into(),
                core: false,
            },
            InitEvent::Ephemeral {
                dir: "/tmp".into(),
                files: vec![],
                truncated: false,
            },
            InitEvent::InitLaps {
                us: vec![("idmap".into(), 350)],
            },
        ];
        let text: String = events.iter().map(InitEvent::to_line).collect();
        assert!(text.starts_with("{\"event\":\"error\""), "{text}");
        assert!(text.contains("{\"event\":\"exec_failed\""));
        assert!(text.contains("{\"event\":\"init_laps\""));
        assert_eq!(parse(&(text + "{\"event\":\"exi")), events);
    }
}
