//! What the ledgers hold, typed: one definition of each entry and of each
//! record inside one (violations, writes, enforcement facts, phases,
//! termination), written with serde and read back with it.
//!
//! Writing: an entry is built as a value of these types and serialized;
//! the ledger canonicalizes it (sorted keys), so field order here is free.
//! Reading: every field of an entry type has a default, so entries written
//! by earlier releases (fewer fields, `null` where this one has a value)
//! and entries of other events read without error; a field that is present
//! but of the wrong type is an error, as it should be.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::commit::Committed;
use super::status::TurnStatus;

/// Version of the entry schema written here.
pub const SCHEMA_VERSION: u64 = 1;

/// What an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Event {
    #[serde(rename = "session.started")]
    SessionStarted,
    #[serde(rename = "session.access_refused")]
    SessionAccessRefused,
    #[serde(rename = "session.resume_failed")]
    SessionResumeFailed,
    #[serde(rename = "turn.started")]
    TurnStarted,
    #[serde(rename = "turn.finished")]
    TurnFinished,
    /// An event this release does not know (read side only).
    #[default]
    #[serde(other)]
    Other,
}

/// How the command ended (`termination`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Termination {
    Exited {
        exited: i32,
    },
    Signaled {
        signal: String,
        number: i32,
    },
    SetupFailed {
        setup_failed: String,
        detail: String,
    },
    ExecFailed {
        exec_failed: String,
        errno: Option<i32>,
    },
}

/// A status's error (`error`): its stable code and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorRecord {
    pub code: String,
    pub name: String,
    pub message: String,
}

/// Where a turn's time went: phases in the order they ran, each in
/// microseconds. Serialized as an object (`{"spawn": 812, …}`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Phases(pub Vec<(String, u64)>);

impl Phases {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends phase `name` of `us` microseconds.
    pub fn push(&mut self, name: &str, us: u64) {
        self.0.push((name.to_owned(), us));
    }

    /// Puts `first` before every phase recorded so far.
    pub fn prepend<const N: usize>(&mut self, first: [(&str, u64); N]) {
        let mut v: Vec<(String, u64)> =
            first.iter().map(|(n, us)| ((*n).to_owned(), *us)).collect();
        v.append(&mut self.0);
        self.0 = v;
    }

    /// Appends every phase of `other`.
    pub fn extend(&mut self, other: impl IntoIterator<Item = (String, u64)>) {
        self.0.extend(other);
    }

    /// The microseconds of phase `name` (the first, if repeated).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.0.iter().map(|(n, v)| (n.as_str(), *v))
    }

    /// The same phases in milliseconds (the `--json` durations).
    pub fn millis(&self) -> BTreeMap<String, f64> {
        self.iter()
            .map(|(n, v)| (n.to_owned(), v as f64 / 1000.0))
            .collect()
    }
}

impl Serialize for Phases {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Phases {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = BTreeMap::<String, u64>::deserialize(d)?;
        Ok(Self(m.into_iter().collect()))
    }
}

/// `timings` of an exec entry (absent in a deterministic session).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    pub wall_us: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases_us: Option<Phases>,
}

/// Which layer refused or reported an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layer {
    PreExecution,
    Verify,
    Seccomp,
    Landlock,
    Mount,
    Network,
}

impl Layer {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PreExecution => "pre-execution",
            Self::Verify => "verify",
            Self::Seccomp => "seccomp",
            Self::Landlock => "landlock",
            Self::Mount => "mount",
            Self::Network => "network",
        }
    }
}

/// The capability a violation violated (`violated_capability`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ViolatedCapability {
    Forbidden {
        pattern: String,
    },
    Reserved {
        path: String,
    },
    NotGranted {
        capability: String,
    },
    UndeclaredWrite {
        realized_kind: String,
    },
    MissingDeclaredOutput,
    DeniedSyscall {
        capability: String,
        pattern: Option<String>,
    },
}

/// One violation (evidence `violations[]`, `--json`, explain).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub attempted_operation: String,
    pub target: String,
    pub violated_capability: ViolatedCapability,
    pub details: String,
    pub layer: Layer,
    /// The manifest entry that would allow it, or why none may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    pub count: u64,
    pub session_id: String,
    pub turn_number: u64,
    pub timestamp: Option<String>,
}

/// One network flow of a turn (`external_calls[]`, issue 26): allowed or
/// denied, with the `egress` entry or the rule that decided. Repeats of
/// one flow are one record with a `count`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalCall {
    /// The name the turn asked for (absent for a literal address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The address connected to (or refused).
    pub address: String,
    pub port: u16,
    /// `tcp`, `udp` or `dns`.
    pub protocol: String,
    pub allowed: bool,
    pub decided_by: String,
    pub count: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// When first and last seen (absent for refusals the kernel counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<String>,
    /// An allowed flow that failed upstream: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One realized write (`realized_writes[]`, `scratch_writes[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRecord {
    pub path: String,
    pub kind: String,
    pub size: u64,
    pub sha256: Option<String>,
    /// A new directory committed as the parent of declared outputs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub implied_parent: bool,
}

impl WriteRecord {
    pub fn of(w: &turnstile_policy::verdict::RealizedWrite) -> Self {
        Self {
            path: w.path.clone(),
            kind: w.kind.as_str().to_owned(),
            size: w.size,
            sha256: w.sha256.clone(),
            implied_parent: false,
        }
    }
}

/// A declared output (`declared_writes[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredWrite {
    pub path: String,
    pub role: String,
}

/// The cgroup's account of the turn (`resources`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub peak_memory_bytes: Option<u64>,
    pub cpu_usage_us: Option<u64>,
    pub oom_kills: u64,
    pub pids_limit_hits: u64,
    pub disk_full: bool,
    /// The kernel's OOM killer ended a process of the turn (memory.events
    /// / memory.oom_control `oom_kill` of the turn's cgroup).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom_killed: bool,
    /// The turn's cgroup was made under a pod's (`run --cgroup-parent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_parent: Option<CgroupParentRecord>,
}

/// The cgroup parent a turn ran under, and which limits won: the parent
/// chain's (the pod's) or the manifest's — the stricter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupParentRecord {
    /// The parent, relative to each hierarchy's root.
    pub path: String,
    /// The tightest memory limit of the parent and its ancestors.
    pub parent_memory_bytes: Option<u64>,
    pub manifest_memory_bytes: u64,
    pub effective_memory_bytes: u64,
    /// `parent` or `manifest`: whose memory limit bounds the turn.
    pub memory_bound_by: String,
    pub parent_pids: Option<u64>,
    pub manifest_pids: u64,
    pub effective_pids: u64,
    pub pids_bound_by: String,
}

/// One output stream's account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOut {
    pub bytes: u64,
    pub forwarded: u64,
    pub sha256: String,
}

/// `output`: the command's stdout and stderr.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputRecord {
    pub stdout: StreamOut,
    pub stderr: StreamOut,
    pub truncated: bool,
    /// `run --forward-all-output`: forwarded whole, the manifest's
    /// `output_bytes` not applied (a container's log).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forwarded_whole: bool,
}

/// The trust level's minimum backend and who set it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendMinimum {
    pub backend: String,
    pub by: String,
}

/// The seccomp filter's shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompFacts {
    pub mode: String,
    pub default: String,
    pub allowed: u64,
    pub denied_eperm: u64,
    pub bad_arch: String,
}

/// Whether one layer's denials are observed in this turn's evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    pub observed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The enforcement in force for a turn that ran (`enforcement`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Enforcement {
    pub backend: String,
    pub backend_chosen_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_minimum: Option<BackendMinimum>,
    pub namespaces: Vec<String>,
    pub landlock_abi: Option<Value>,
    pub landlock_status: Option<Value>,
    /// The Landlock outcome the sandbox's init reported.
    pub landlock: Option<Value>,
    pub seccomp: Option<SeccompFacts>,
    pub cgroup: Option<String>,
    pub capabilities: String,
    pub no_new_privs: bool,
    pub uid: Option<u32>,
    pub network: Option<String>,
    /// The posture check's report (the sandbox's).
    pub posture: Option<Value>,
    pub denials_observed: Option<BTreeMap<String, Observed>>,
    pub degraded: Vec<String>,
    /// Who applied each layer on this backend (from the backend itself).
    pub applied_by: BTreeMap<String, String>,
    /// Layers this backend does not apply, with why (never claimed).
    pub not_applied: BTreeMap<String, String>,
}

/// `enforcement` of an evidence entry: what was in force, or, for a turn
/// refused before execution, the stage that refused it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnforcementRecord {
    NotRun(NotRun),
    Ran(Box<Enforcement>),
}

/// A turn that never ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotRun {
    pub stage: String,
    pub ran: bool,
}

impl EnforcementRecord {
    /// A turn the pre-execution check refused: nothing ran.
    pub fn not_run() -> Self {
        Self::NotRun(NotRun {
            stage: "pre-execution check".into(),
            ran: false,
        })
    }

    /// What was in force, if the turn ran.
    pub fn ran(&self) -> Option<&Enforcement> {
        match self {
            Self::Ran(e) => Some(e),
            Self::NotRun(_) => None,
        }
    }
}

/// The exec ledger's `turn.started` entry: the intent, durable before
/// anything of the turn runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct TurnStartedEntry {
    pub event: Event,
    pub schema_version: u64,
    pub session_id: String,
    pub turn_number: u64,
    pub query_hash: String,
    pub plan_hash: Option<String>,
    pub backend: String,
    pub ts: String,
}

/// The evidence ledger's `session.access_refused` entry: someone other
/// than the session's owner asked to add a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessRefusedEntry<O> {
    pub event: Event,
    pub schema_version: u64,
    pub ledger: String,
    pub session_id: String,
    pub owner: O,
    pub requester: O,
    pub ts: String,
}

/// The evidence ledger's `session.resume_failed` entry: the session's
/// suspended warm sandbox could not be thawed for its next turn (E2024); the
/// sandbox was ended and the turn never started (so it has no turn entries).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct ResumeFailedEntry {
    pub event: Event,
    pub schema_version: u64,
    pub ledger: String,
    pub session_id: String,
    pub package: String,
    pub error: Option<ErrorRecord>,
    pub ts: String,
}

/// The exec ledger's `turn.finished` entry: what happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct ExecEntry {
    pub event: Event,
    pub schema_version: u64,
    pub session_id: String,
    pub turn_number: u64,
    pub query_hash: String,
    pub result_hash: String,
    pub status: Option<TurnStatus>,
    pub exit_code: Option<i32>,
    pub termination: Option<Termination>,
    pub error: Option<ErrorRecord>,
    pub backend: String,
    pub timings: Option<Timings>,
    pub ts: String,
}

/// The evidence ledger's `turn.finished` entry: what was declared, what
/// was realized, what was violated and which enforcement was in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct EvidenceEntry {
    pub event: Event,
    pub schema_version: u64,
    pub session_id: String,
    pub turn_number: u64,
    pub package_id: Option<String>,
    pub status: Option<TurnStatus>,
    pub command: Option<Vec<String>>,
    pub timeout_seconds: Option<u64>,
    pub execute_entry: Option<String>,
    pub declared_reads: Vec<String>,
    pub declared_writes: Vec<DeclaredWrite>,
    pub realized_writes: Vec<WriteRecord>,
    pub scratch_writes: Vec<WriteRecord>,
    /// What the turn left in /tmp, /var/tmp, /dev/shm (recorded,
    /// discarded).
    pub ephemeral_writes: Option<serde_json::Map<String, Value>>,
    pub committed: Vec<Committed>,
    pub external_calls: Vec<ExternalCall>,
    pub violations: Vec<Violation>,
    pub enforcement: Option<EnforcementRecord>,
    pub resources: Option<Resources>,
    pub output: Option<OutputRecord>,
    pub termination: Option<Termination>,
    pub error: Option<ErrorRecord>,
    pub ts: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_order_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The turn this one reverted (`supervise revert`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reverts_turn: Option<u64>,
    /// `supervise suspend` / `resume` of the running turn, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suspensions: Vec<SuspensionFact>,
    /// An ARA `receive` turn: its input envelope and what it emitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receive: Option<ReceiveRecord>,
    /// Writes left out of `realized_writes` / `scratch_writes` because a
    /// turn that did not commit wrote more than a ledger line can list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes_omitted: Option<WritesOmitted>,
}

/// How many writes an evidence entry leaves out of each list, and the
/// sha256 of the canonical JSON of both whole lists
/// (`{"realized_writes": [...], "scratch_writes": [...]}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WritesOmitted {
    pub realized: u64,
    pub scratch: u64,
    pub sha256: String,
}

impl WriteRecord {
    /// What this record adds to an entry, about (its JSON with room).
    pub fn recorded_bytes(&self) -> usize {
        record_cost(&self.path)
    }
}

/// The bytes one list item naming `path` takes in an entry, rounded up
/// (kind, size, sha256, role and the JSON around them: 20,000 outputs
/// made a 7.4 MB entry, ~185 bytes an item for ~60-byte paths).
fn record_cost(path: &str) -> usize {
    path.len() + 160
}

/// The estimated size of the write lists an evidence entry would hold for
/// `realized` (every write), `scratch` and `committed` (each at most
/// once more): compared with [`crate::store::ledger::RECORD_BUDGET`].
pub fn recorded_bytes<'a>(
    realized: impl IntoIterator<Item = &'a str>,
    scratch: impl IntoIterator<Item = &'a str>,
    committed: impl IntoIterator<Item = &'a str>,
) -> usize {
    let each = |it: &mut dyn Iterator<Item = &'a str>| it.map(record_cost).sum::<usize>();
    each(&mut realized.into_iter())
        + each(&mut scratch.into_iter())
        + each(&mut committed.into_iter())
}

/// One `turn.suspended`, `turn.resumed` or `turn.resume_failed` fact: the
/// turn's cgroup frozen or thawed (its timeout does not run while frozen).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuspensionFact {
    pub event: String,
    pub ts: String,
    /// Why it was suspended or resumed (`request`, `idle`, `turn`), when
    /// the daemon did it (issue 28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why a resume failed (with the code E2024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorRecord>,
}

/// Where the running turn's suspensions are appended (one JSON line per
/// [`SuspensionFact`]), in its turn directory; read into the turn's
/// evidence when it finishes (and gone with the directory).
pub fn suspensions_file(turn_dir: &std::path::Path) -> std::path::PathBuf {
    turn_dir.join("suspensions.jsonl")
}

/// The facts [`suspensions_file`] holds, in order.
pub fn read_suspensions(turn_dir: &std::path::Path) -> Vec<SuspensionFact> {
    std::fs::read_to_string(suspensions_file(turn_dir))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Where the running turn's cgroup is described (`TurnCgroup::publish`),
/// in its turn directory: what `supervise suspend`/`resume` read.
pub fn running_cgroup_file(turn_dir: &std::path::Path) -> std::path::PathBuf {
    turn_dir.join("cgroup.where")
}

/// Where a session's ledgers are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LedgerPaths {
    pub exec: std::path::PathBuf,
    pub evidence: std::path::PathBuf,
}

/// `durations` of a turn report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Durations {
    pub wall_ms: f64,
    /// `warm`, `cold` or `none`: whether the sandbox was built before the
    /// turn (serve's pool), for it, or not at all.
    pub sandbox: String,
    pub ledger_entries_ms: f64,
    pub phases_ms: BTreeMap<String, f64>,
}

/// One turn as `run --json` (and serve's reply) reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnReport {
    pub session_id: String,
    pub turn_number: u64,
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default)]
    pub finished_at: Option<String>,
    pub status: TurnStatus,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub termination: Option<Termination>,
    #[serde(default)]
    pub error: Option<ErrorRecord>,
    #[serde(default)]
    pub realized_writes: Vec<WriteRecord>,
    #[serde(default)]
    pub committed: Vec<Committed>,
    #[serde(default)]
    pub ephemeral_writes: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    pub violations: Vec<Violation>,
    #[serde(default)]
    pub enforcement: Option<Enforcement>,
    #[serde(default)]
    pub resources: Option<Resources>,
    #[serde(default)]
    pub ledgers: Option<LedgerPaths>,
    #[serde(default)]
    pub durations: Option<Durations>,
    /// Returned from an idempotency record, not run again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    /// The key it was returned for (with `replayed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// An ARA `receive` turn: its input envelope and what it emitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive: Option<ReceiveRecord>,
    /// What the command wrote to stdout and stderr, and whether it was cut
    /// at `limits.output_bytes` (as in the evidence entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputRecord>,
}

/// An ARA `receive` turn (issue 28): the envelope it was given, the
/// envelopes its agent returned — validated, canonical, in order; empty
/// unless the turn committed — and, when the agent's output was refused,
/// why (a TS109x code).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReceiveRecord {
    pub input: turnstile_policy::envelope::EventEnvelope,
    pub emitted: Vec<turnstile_policy::envelope::EventEnvelope>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<ErrorRecord>,
    /// How many routed hops separate the input from the chain's first
    /// envelope (0: given by a client; see `serve` subscriptions).
    #[serde(default)]
    pub hop: u32,
}

pub use turnstile_policy::error::printable;

impl TurnReport {
    /// The one-line summary (and a line per violation, with its hint)
    /// `run` prints without `--json`; `message` explains an error status.
    pub fn summary(&self, message: &str) -> String {
        let mut s = format!(
            "turn {} of {}: {}",
            self.turn_number, self.session_id, self.status
        );
        if let Some(code) = self.status.code() {
            s += &format!(" [{}] {message}", code.code);
        }
        // The first few; `supervise explain` has them all.
        const FIRST: usize = 5;
        for v in self.violations.iter().take(FIRST) {
            s += &format!("\n  - [{}] {}", v.layer.as_str(), printable(&v.details));
            if let Some(h) = &v.hint {
                s += &format!("\n    hint: {}", printable(h));
            }
        }
        if self.violations.len() > FIRST {
            s += &format!(
                "\n  … and {} more: supervise explain --session {} --turn {}",
                self.violations.len() - FIRST,
                self.session_id,
                self.turn_number
            );
        }
        // A cut is said where it is seen, not only in the evidence.
        if let Some(o) = self.output.as_ref().filter(|o| o.truncated) {
            s += &format!(
                "\n  output cut: the command wrote {} bytes, {} were forwarded (limits.output_bytes)",
                o.stdout.bytes.saturating_add(o.stderr.bytes),
                o.stdout.forwarded.saturating_add(o.stderr.forwarded)
            );
        }
        s
    }
}

impl EvidenceEntry {
    /// What was in force, if the turn ran.
    pub fn ran(&self) -> Option<&Enforcement> {
        self.enforcement.as_ref().and_then(EnforcementRecord::ran)
    }

    /// The command's exit code, if it exited (recorded in `termination`).
    pub fn exit_code(&self) -> Option<i32> {
        match self.termination {
            Some(Termination::Exited { exited }) => Some(exited),
            _ => None,
        }
    }
}

/// What the ledger adds to every entry it appends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Chain {
    pub seq: u64,
    pub entry_hash: String,
}

/// An entry as read back from a ledger: its body and its chain fields.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Read<T> {
    #[serde(flatten)]
    pub chain: Chain,
    #[serde(flatten)]
    pub body: T,
}

/// `entries`, read as `T` (see the module docs on tolerance).
pub fn read_all<T: serde::de::DeserializeOwned>(
    entries: &[Value],
) -> Result<Vec<Read<T>>, serde_json::Error> {
    entries
        .iter()
        .map(|e| serde_json::from_value::<Read<T>>(e.clone()))
        .collect()
}

/// An entry as the JSON object the ledger appends.
pub fn to_object<T: Serialize>(entry: &T) -> serde_json::Map<String, Value> {
    match serde_json::to_value(entry) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_turn_named_is_printed_escaped() {
        assert_eq!(printable("good.test:443"), "good.test:443");
        assert!(matches!(
            printable("ünïcode path"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            printable("\u{1b}[31mred\u{1b}[0m"),
            "\\u{1b}[31mred\\u{1b}[0m"
        );
        assert_eq!(printable("ok\nfake"), "ok\\nfake");
        assert_eq!(
            printable("a\u{202e}b\u{9b}c\u{7f}"),
            "a\\u{202e}b\\u{9b}c\\u{7f}"
        );
    }

    /// An entry of an earlier release (fewer fields, nulls) and an entry of
    /// another event read without error.
    #[test]
    fn entries_of_other_releases_and_events_read() {
        let old: Value = serde_json::from_str(
            r#"{"event":"turn.finished","schema_version":1,"session_id":"S","turn_number":2,
                "status":"committed","command":["/bin/true"],"exit_code":0,"ts":"t","seq":5,
                "entry_hash":"h","previous_hash":"p","committed":[{"path":"a","size":1,"sha256":"x"}],
                "violations":[{"attempted_operation":"write","target":"b","violated_capability":{"kind":"missing_declared_output"},
                "details":"d","layer":"verify","count":1,"session_id":"S","turn_number":2,"timestamp":"t"}],
                "enforcement":{"stage":"pre-execution check","ran":false}}"#,
        )
        .unwrap();
        let started: Value = serde_json::from_str(
            r#"{"event":"session.started","ledger":"evidence","session_id":"S","tier":"ho1","ts":"t","seq":1,"entry_hash":"h0"}"#,
        )
        .unwrap();
        let read = read_all::<EvidenceEntry>(&[started, old]).unwrap();
        assert_eq!(read[0].body.event, Event::SessionStarted);
        assert_eq!(read[1].chain.seq, 5);
        assert_eq!(read[1].body.status, Some(TurnStatus::Committed));
        assert_eq!(read[1].body.committed[0].path, "a");
        assert_eq!(read[1].body.violations[0].layer, Layer::Verify);
        assert_eq!(read[1].body.enforcement, Some(EnforcementRecord::not_run()));
    }

    #[test]
    fn phases_keep_their_order_and_serialize_as_an_object() {
        let mut p = Phases::new();
        p.push("spawn", 3);
        p.push("capture", 1);
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"spawn":3,"capture":1}"#
        );
        assert_eq!(p.get("capture"), Some(1));
    }
}
