//! The file bus (seed 003; DESIGN "File bus"): `supervise serve --bus DIR`.
//!
//! `DIR/input/F` is claimed by an atomic rename (no replace) into
//! `DIR/processing/F`; the message is validated (schema v0.1), matched
//! against `DIR/rules.v0.1.yaml`, its actions rendered, checked against
//! their allowlist, then run as sandboxed turns (live) or recorded as
//! "would execute" (dry-run); its evidence lands in `DIR/output/F`
//! (success) or `DIR/error/F` (failure), written to a temporary name,
//! synced and renamed, and only then is `processing/F` removed.
//!
//! Crash safety (kill -9 anywhere): at start every file left in
//! `processing/` is looked at again. If evidence for it exists (same
//! message bytes, by hash) the leftover is removed; otherwise it is
//! processed again — and its live turns are not run again: each action's
//! turn carries the idempotency key `bus:<msg_id>:<action>` in one session
//! per (bus, workspace, package), so a turn that already ran returns its
//! recorded result (`replayed`), and one whose supervisor died is closed as
//! `aborted` by recovery and returned as such. Hence every message ends in
//! exactly one of output/ or error/, none is lost, none runs twice.
//!
//! Change notification is inotify (input/ and approvals/); each wake-up
//! rescans the directory, so a missed or overflowed event loses nothing.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use turnstile_policy::error::{ErrorCode, codes};

use super::Daemon;
use super::wire::RunRequest;
use crate::error::{Result, SupervisorError};
use crate::store::record::TurnReport;
use crate::store::status::TurnStatus;

/// The rules file, relative to the bus directory.
pub const RULES_FILE: &str = "rules.v0.1.yaml";
const MAX_MESSAGE_BYTES: u64 = 256 * 1024;
const MAX_LOG_BYTES: u64 = 64 * 1024;
/// The turn environment's default PATH, through which a rendered
/// command's first word is resolved. (A Plan narrows it to the directories
/// its manifest may execute from, `plan::DEFAULT_PATH`; this resolution
/// does not yet: a name in `/usr/local/bin` and `/usr/bin` resolves to the
/// first even where only the second is granted.)
const TURN_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Category {
    A,
    B,
    C,
    D,
}

impl Category {
    fn as_str(self) -> &'static str {
        match self {
            Self::A => "A",
            Self::B => "B",
            Self::C => "C",
            Self::D => "D",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommandType {
    Exec,
    Task,
}

impl CommandType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Exec => "exec",
            Self::Task => "task",
        }
    }
}

/// Message schema v0.1 (seed 003 §2). Unknown fields are refused.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub msg_id: String,
    pub category: Category,
    pub msg_type: String,
    pub command_type: CommandType,
    pub title: String,
    pub run: Vec<String>,
    pub context: Context,
    pub timestamp: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    pub phase: i64,
    pub requested_by: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesFile {
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub id: String,
    pub trigger: Trigger,
    #[serde(default)]
    pub guards: Guards,
    pub actions: Vec<Action>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trigger {
    pub command_type: CommandType,
    /// Glob (`*`, `?`) on `context.requested_by`.
    #[serde(default = "any_source")]
    pub source: String,
}

fn any_source() -> String {
    "*".into()
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Guards {
    pub phase: Option<i64>,
    pub category: Option<Vec<Category>>,
    #[serde(default)]
    pub approval: Approval,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Approval {
    #[default]
    None,
    Required,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Mode {
    #[serde(rename = "live")]
    Live,
    #[serde(rename = "dry-run")]
    DryRun,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    pub run: String,
    pub allowlist: Vec<String>,
    pub workspace: PathBuf,
    pub package: String,
    #[serde(default)]
    pub outputs: Vec<OutputSpec>,
    pub mode: Option<Mode>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    pub path: String,
    pub role: String,
}

/// An error of the bus, with its code and the field it names.
#[derive(Debug, Clone)]
pub struct BusError {
    pub code: ErrorCode,
    pub field: String,
    pub message: String,
}

impl BusError {
    fn new(code: ErrorCode, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            field: field.into(),
            message: message.into(),
        }
    }

    fn record(&self) -> BusErrorRecord {
        BusErrorRecord {
            code: self.code.code.to_owned(),
            name: self.code.name.to_owned(),
            field: self.field.clone(),
            message: self.message.clone(),
        }
    }
}

fn check_token(field: &str, v: &str, max: usize) -> std::result::Result<(), BusError> {
    let mut b = v.bytes();
    let ok = !v.is_empty()
        && v.len() <= max
        && b.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(BusError::new(
            codes::BUS_MESSAGE_INVALID,
            field,
            format!(
                "`{}`: 1 to {max} characters, a letter or digit, then letters, digits, `.`, `_` or `-`",
                v.escape_debug()
            ),
        ))
    }
}

/// Parses and validates a message (schema v0.1).
pub fn parse_message(bytes: &[u8]) -> std::result::Result<Message, BusError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let m: Message = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.inner().to_string();
        let field = if path == "." {
            inner.split('`').nth(1).unwrap_or("message").to_owned()
        } else {
            path
        };
        BusError::new(codes::BUS_MESSAGE_INVALID, field, inner)
    })?;
    check_token("msg_id", &m.msg_id, 128)?;
    if m.msg_type != "COMMAND" {
        return Err(BusError::new(
            codes::BUS_MESSAGE_INVALID,
            "msg_type",
            format!("`{}`: input messages are `COMMAND`", m.msg_type),
        ));
    }
    if m.title.trim().is_empty() || m.title.len() > 1024 {
        return Err(BusError::new(
            codes::BUS_MESSAGE_INVALID,
            "title",
            "a short description of 1 to 1024 bytes",
        ));
    }
    if m.run.is_empty() || m.run.len() > 64 {
        return Err(BusError::new(
            codes::BUS_MESSAGE_INVALID,
            "run",
            "1 to 64 command strings",
        ));
    }
    if m.context.requested_by.is_empty() {
        return Err(BusError::new(
            codes::BUS_MESSAGE_INVALID,
            "context.requested_by",
            "must name the requester",
        ));
    }
    time::OffsetDateTime::parse(&m.timestamp, &time::format_description::well_known::Rfc3339)
        .map_err(|e| {
            BusError::new(
                codes::BUS_MESSAGE_INVALID,
                "timestamp",
                format!("`{}`: not an ISO-8601 (RFC 3339) time: {e}", m.timestamp),
            )
        })?;
    Ok(m)
}

/// Largest rules file read (a real one is a few KiB).
const MAX_RULES_BYTES: usize = 1 << 20;
/// Deepest `{`/`[` nesting a rules file may have (a real one has 2).
const MAX_RULES_FLOW_DEPTH: usize = 64;

/// The YAML parser's time grows with the square of the flow-collection
/// depth (measured through `cargo xtask fuzz`, debug build: 16,000 nested
/// `{` take 0.9 s, 1 MiB of them would take about an hour), so both size
/// and depth are checked before it sees the text. Quoted scalars are
/// skipped; `#` comments too.
fn rules_shape(text: &str) -> std::result::Result<(), String> {
    if text.len() > MAX_RULES_BYTES {
        return Err(format!(
            "{} bytes: a rules file is at most {MAX_RULES_BYTES}",
            text.len()
        ));
    }
    // Two counts, and both must stay under the limit: one that knows
    // quotes and comments (so `"}"` in a string closes nothing), and one
    // that counts every bracket (so a `"` the first misreads as an opening
    // quote cannot hide the nesting after it). A real rules file passes
    // both; an over-count only refuses a file no one writes.
    let mut naive = 0usize;
    let (mut depth, mut quote, mut comment) = (0usize, None::<char>, false);
    // The previous character, and the previous one that is not a blank: a
    // quote opens a scalar only where a scalar may start (YAML: a `"` inside
    // a plain scalar is text), so a stray one cannot hide the nesting after it.
    let (mut prev, mut prev_sig) = ('\n', '\n');
    for c in text.chars() {
        match c {
            '{' | '[' => naive += 1,
            '}' | ']' => naive = naive.saturating_sub(1),
            _ => {}
        }
        if naive > MAX_RULES_FLOW_DEPTH {
            return Err(format!(
                "`{{`/`[` nested deeper than {MAX_RULES_FLOW_DEPTH}"
            ));
        }
        match (quote, c) {
            (Some('"'), '"') if prev != '\\' => quote = None,
            (Some('\''), '\'') => quote = None,
            (Some(_), _) => {}
            (None, '\n') => comment = false,
            (None, _) if comment => {}
            (None, '#') if prev.is_whitespace() => comment = true,
            (None, '"' | '\'') if matches!(prev_sig, '\n' | ':' | ',' | '[' | '{' | '-' | '?') => {
                quote = Some(c)
            }
            (None, '{' | '[') => {
                depth += 1;
                if depth > MAX_RULES_FLOW_DEPTH {
                    return Err(format!(
                        "`{{`/`[` nested deeper than {MAX_RULES_FLOW_DEPTH}"
                    ));
                }
            }
            (None, '}' | ']') => depth = depth.saturating_sub(1),
            _ => {}
        }
        // An escaped backslash does not escape the quote after it.
        prev = if quote.is_some() && prev == '\\' && c == '\\' {
            ' '
        } else {
            c
        };
        if c == '\n' || !c.is_whitespace() {
            prev_sig = c;
        }
    }
    Ok(())
}

/// Loads and checks the rules file: refused (TS1036) naming the field.
pub fn load_rules(path: &Path) -> Result<RulesFile> {
    let bad = |field: String, reason: String| SupervisorError::BusRules {
        path: path.to_path_buf(),
        field,
        reason,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| {
            use std::io::Read;
            f.take(MAX_RULES_BYTES as u64 + 1).read_to_string(&mut text)
        })
        .map_err(|e| bad("rules".into(), e.to_string()))?;
    rules_shape(&text).map_err(|reason| bad("rules".into(), reason))?;
    let de = serde_norway::Deserializer::from_str(&text);
    let rules: RulesFile = serde_path_to_error::deserialize(de)
        .map_err(|e| bad(e.path().to_string(), e.inner().to_string()))?;
    for (i, r) in rules.rules.iter().enumerate() {
        if r.actions.is_empty() {
            return Err(bad(
                format!("rules[{i}].actions"),
                "a rule needs at least one action".into(),
            ));
        }
        for (j, a) in r.actions.iter().enumerate() {
            let f = |k: &str| format!("rules[{i}].actions[{j}].{k}");
            if a.allowlist.is_empty() {
                return Err(bad(
                    f("allowlist"),
                    "empty: no command could ever run".into(),
                ));
            }
            if !a.workspace.is_absolute() {
                return Err(bad(f("workspace"), "must be an absolute path".into()));
            }
            turnstile_policy::PackageId::parse(&a.package)
                .map_err(|e| bad(f("package"), e.to_string()))?;
            // Every variable a template names must exist.
            render(&a.run, &BTreeMap::new(), true).map_err(|e| bad(f("run"), e))?;
        }
    }
    Ok(rules)
}

/// Renders `{{name}}` variables. With `check_only`, only the names are
/// checked (`msg_run_N` for any N, msg_id, title, phase, category).
fn render(
    template: &str,
    vars: &BTreeMap<String, String>,
    check_only: bool,
) -> std::result::Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("`{template}`: unclosed `{{{{`"))?;
        let name = after[..end].trim();
        let known = matches!(name, "msg_id" | "title" | "phase" | "category")
            || name
                .strip_prefix("msg_run_")
                .is_some_and(|n| n.parse::<usize>().is_ok());
        if !known {
            return Err(format!(
                "`{{{{{name}}}}}`: unknown variable (msg_run_N, msg_id, title, phase, category)"
            ));
        }
        if !check_only {
            let v = vars
                .get(name)
                .ok_or_else(|| format!("`{{{{{name}}}}}`: the message has no such value"))?;
            out.push_str(v);
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `*` and `?` glob.
fn glob(pattern: &str, s: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], s) || (!s.is_empty() && go(p, &s[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &s[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), s.as_bytes())
}

/// A command ready to run: argv with its program resolved.
#[derive(Debug, Clone)]
struct Prepared {
    rendered: String,
    argv: Vec<String>,
    mode: Mode,
}

/// Renders and validates an action (seed 003 "Template Rendering
/// Pipeline"): render, split without a shell, first word on the
/// allowlist, resolve it through the turn's PATH.
fn prepare(
    a: &Action,
    vars: &BTreeMap<String, String>,
    field: &str,
    default_mode: Mode,
) -> std::result::Result<Prepared, BusError> {
    let rendered = render(&a.run, vars, false)
        .map_err(|e| BusError::new(codes::BUS_COMMAND_DISALLOWED, format!("{field}.run"), e))?;
    let disallowed = |why: String| {
        BusError::new(
            codes::BUS_COMMAND_DISALLOWED,
            format!("{field}.run"),
            format!("rendered command `{}`: {why}", rendered.escape_debug()),
        )
    };
    if rendered.chars().any(|c| c.is_control()) {
        return Err(disallowed("contains control characters".into()));
    }
    let mut argv = shell_words::split(&rendered)
        .map_err(|e| disallowed(format!("cannot be split into words: {e}")))?;
    let Some(first) = argv.first().cloned() else {
        return Err(disallowed("is empty".into()));
    };
    if !a.allowlist.contains(&first) {
        return Err(disallowed(format!(
            "`{first}` is not on the allowlist {:?}",
            a.allowlist
        )));
    }
    if !first.contains('/') {
        let found = TURN_PATH
            .split(':')
            .map(|d| Path::new(d).join(&first))
            .find(|p| p.is_file());
        let Some(found) = found else {
            return Err(disallowed(format!(
                "`{first}` is not found on the turn's PATH {TURN_PATH}"
            )));
        };
        argv[0] = found.display().to_string();
    }
    Ok(Prepared {
        rendered,
        argv,
        mode: a.mode.unwrap_or(default_mode),
    })
}

/// What became of a message.
enum Disposition {
    Done(Outcome),
    Failed(Outcome),
    Held(String),
}

/// How one message ended: the body of its evidence file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Outcome {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    msg_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rule: Option<String>,
    status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<BusErrorRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    actions: Option<Vec<ActionResult>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    skipped: Option<Vec<Skipped>>,
    /// Approval files seen for this message and ignored (issue 28).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    approvals_ignored: Vec<IgnoredApproval>,
}

/// An approval file that approves nothing, and why (TS1095).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IgnoredApproval {
    pub file: String,
    pub code: String,
    pub reason: String,
}

/// `approvals/<msg_id>.json`: the message's sha256 and who approved it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalDoc {
    #[serde(default)]
    msg_id: Option<String>,
    sha256: String,
    approver: String,
}

impl Outcome {
    fn rejected(e: &BusError) -> Self {
        Self {
            status: "rejected".into(),
            error: Some(e.record()),
            ..Self::default()
        }
    }
}

/// A rule not chosen, and the guard that failed.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Skipped {
    rule: String,
    guard: String,
    expected: Value,
    got: Value,
}

/// One action of the chosen rule.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ActionResult {
    index: usize,
    rendered: String,
    argv: Vec<String>,
    workspace: PathBuf,
    package: String,
    mode: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    would_execute: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_status: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    turn_number: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<TurnStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replayed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<String>,
}

/// A bus error as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct BusErrorRecord {
    code: String,
    name: String,
    field: String,
    message: String,
}

/// An evidence file: the outcome, the message and when.
#[derive(Debug, Serialize, Deserialize)]
struct EvidenceFile {
    #[serde(flatten)]
    outcome: Outcome,
    file: String,
    message: Value,
    message_sha256: String,
    processed_at: String,
    schema: String,
}

/// What the daemon's health says of the bus.
#[derive(Debug, Serialize)]
struct BusStatus<'a> {
    dir: &'a std::path::Path,
    held: Vec<Held>,
    rules: usize,
}

/// A message waiting for its approval.
#[derive(Debug, Serialize)]
struct Held {
    file: String,
    msg_id: Option<String>,
    waiting_for: Option<PathBuf>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    approvals_ignored: Vec<IgnoredApproval>,
}

/// The turn request of a live action.
#[derive(Serialize)]
struct ActionRequest<'a> {
    command: &'a [String],
    declared_outputs: Vec<crate::store::record::DeclaredWrite>,
    work_order_id: &'a str,
    idempotency_key: String,
}

/// The bus served by a daemon.
#[derive(Debug)]
pub struct Bus {
    pub dir: PathBuf,
    rules: RulesFile,
    dry_run: bool,
    /// Who may approve (the daemon's config).
    approvers: Vec<String>,
    policy: super::config::BusPolicy,
    /// Approval files ignored, by msg_id, until the message's evidence
    /// records them.
    ignored: std::sync::Mutex<BTreeMap<String, Vec<IgnoredApproval>>>,
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SupervisorError {
    let path = path.to_path_buf();
    move |source| SupervisorError::StateIo { op, path, source }
}

fn fsync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

impl Bus {
    /// Opens the bus: creates its directories, loads the rules.
    pub fn open(dir: &Path, dry_run: bool) -> Result<Self> {
        for sub in ["input", "processing", "output", "error", "approvals"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).map_err(io_err("create bus directory", &p))?;
        }
        let dir = std::fs::canonicalize(dir).map_err(io_err("resolve bus directory", dir))?;
        let rules = load_rules(&dir.join(RULES_FILE))?;
        Ok(Self {
            dir,
            rules,
            dry_run,
            approvers: Vec::new(),
            policy: super::config::BusPolicy::default(),
            ignored: std::sync::Mutex::new(BTreeMap::new()),
        })
    }

    /// The daemon config's approvers and bus role.
    pub fn with_policy(mut self, c: &super::config::DaemonConfig) -> Self {
        self.approvers = c.approvers.clone();
        self.policy = c.bus.clone();
        self
    }

    /// What this bus enforces, said at start: the role, whether `--dry-run`
    /// holds every action, and whether a live production bus requires the
    /// sandbox bus first.
    pub fn policy_statement(&self) -> String {
        use super::config::BusRole;
        let role = match self.policy.role {
            BusRole::Sandbox => "sandbox",
            BusRole::Production => "production",
        };
        let mode = if self.dry_run {
            "dry-run (every action, whatever a rule's mode)"
        } else {
            "live"
        };
        let first = match (self.policy.role, self.dry_run, &self.policy.sandbox_bus) {
            (BusRole::Production, false, Some(sb)) if self.policy.require_sandbox_first => format!(
                "a message runs live only after it was processed in dry-run on the sandbox bus {} (same msg_id or content sha256)",
                sb.display()
            ),
            (BusRole::Production, false, _) => {
                "sandbox-first is NOT enforced: the daemon config sets `bus.require_sandbox_first: false`".into()
            }
            _ => "sandbox-first does not apply".into(),
        };
        format!(
            "bus {}: role {role}, mode {mode}; {first}; approvals: approvals/<msg_id>.json naming the message's sha256 and one of {} approver(s)",
            self.dir.display(),
            self.approvers.len()
        )
    }

    /// Whether `m` is approved: `approvals/<msg_id>.json` names the
    /// message's sha256 and an approver of the daemon's list. Any other
    /// approval file is ignored and recorded (TS1095).
    fn approved(&self, m: &Message, bytes: &[u8]) -> bool {
        let sha = sha256_hex(bytes);
        let mut ignored = Vec::new();
        let mut ignore = |file: String, reason: String| {
            ignored.push(IgnoredApproval {
                file,
                code: codes::BUS_APPROVAL_IGNORED.code.to_owned(),
                reason,
            });
        };
        let bare = self.sub("approvals").join(&m.msg_id);
        if std::fs::symlink_metadata(&bare).is_ok() {
            ignore(
                m.msg_id.clone(),
                "not an approval: an approval is approvals/<msg_id>.json naming the message's sha256 and an approver".into(),
            );
        }
        let name = format!("{}.json", m.msg_id);
        let path = self.sub("approvals").join(&name);
        let mut ok = false;
        match turnstile_policy::input::read_regular_file(&path, 64 * 1024) {
            Err(e) if e.is_not_found() => {}
            Err(e) => ignore(name, format!("unreadable: {e}")),
            Ok(b) => match serde_json::from_slice::<ApprovalDoc>(&b) {
                Err(e) => ignore(name, format!("not an approval document: {e}")),
                Ok(doc) if doc.sha256 != sha => ignore(
                    name,
                    format!(
                        "names sha256 {}, but the message's is {sha}: it approves other content",
                        doc.sha256
                    ),
                ),
                Ok(doc) if doc.msg_id.as_ref().is_some_and(|i| *i != m.msg_id) => {
                    ignore(name, "names another msg_id".into())
                }
                Ok(doc) if !self.approvers.contains(&doc.approver) => ignore(
                    name,
                    format!(
                        "approver `{}` is not one of the daemon's approvers",
                        doc.approver
                    ),
                ),
                Ok(_) => ok = true,
            },
        }
        if let Ok(mut map) = self.ignored.lock() {
            let seen = map.entry(m.msg_id.clone()).or_default();
            for i in ignored {
                if !seen.contains(&i) {
                    tracing::warn!(msg_id = %m.msg_id, file = %i.file, code = %i.code, reason = %i.reason, "bus: approval ignored");
                    seen.push(i);
                }
            }
        }
        ok
    }

    /// Whether the sandbox bus processed `m` (same msg_id or same content)
    /// in dry-run, to completion.
    fn sandbox_first_ok(&self, m: &Message, sha: &str) -> bool {
        let Some(sb) = &self.policy.sandbox_bus else {
            return false;
        };
        let out = sb.join("output");
        std::fs::read_dir(&out)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| crate::fsx::read_small(&e.path(), 4 << 20).ok())
            .filter_map(|b| serde_json::from_slice::<EvidenceFile>(&b).ok())
            .any(|v| {
                (v.message_sha256 == sha || v.outcome.msg_id.as_deref() == Some(&m.msg_id))
                    && v.outcome.status == "done"
                    && v.outcome
                        .actions
                        .as_ref()
                        .is_some_and(|a| !a.is_empty() && a.iter().all(|x| x.mode == "dry-run"))
            })
    }

    fn sub(&self, s: &str) -> PathBuf {
        self.dir.join(s)
    }

    /// Message files of a directory, sorted; dot-files (being written) and
    /// non-`.json` names are left alone.
    fn listing(&self, sub: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.sub(sub))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.') && n.ends_with(".json"))
            .collect();
        v.sort();
        v
    }

    /// The bus thread: recover, then process on every inotify wake-up
    /// until the daemon stops.
    pub fn run(&self, d: &Daemon) {
        let inotify = match Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK) {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(error = %e, "bus: inotify unavailable; the bus is not served");
                return;
            }
        };
        let flags =
            AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CREATE;
        for sub in ["input", "approvals"] {
            if let Err(e) = inotify.add_watch(&self.sub(sub), flags) {
                tracing::error!(error = %e, dir = sub, "bus: cannot watch; the bus is not served");
                return;
            }
        }
        tracing::info!(bus = %self.dir.display(), "bus: serving");
        // Leftovers of a previous daemon first, then whatever waits.
        self.pass(d, true);
        while !d.stopping.load(Ordering::SeqCst) {
            let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
            // The timeout only bounds how late a stop is noticed.
            let _ = poll(&mut fds, PollTimeout::from(500u16));
            let woke = matches!(inotify.read_events(), Ok(ev) if !ev.is_empty());
            if woke {
                self.pass(d, true);
            }
        }
    }

    /// One pass: held (or leftover) messages in processing/, then input/.
    fn pass(&self, d: &Daemon, with_processing: bool) {
        if with_processing {
            for f in self.listing("processing") {
                if d.stopping.load(Ordering::SeqCst) {
                    return;
                }
                self.finish_claimed(d, &f);
            }
        }
        for f in self.listing("input") {
            if d.stopping.load(Ordering::SeqCst) {
                return;
            }
            if let Some(name) = self.claim(&f) {
                d.metrics.events_received.inc();
                self.finish_claimed(d, &name);
            }
        }
        let held: Vec<Held> = self
            .listing("processing")
            .into_iter()
            .map(|f| {
                let id = std::fs::read(self.sub("processing").join(&f))
                    .ok()
                    .and_then(|b| parse_message(&b).ok())
                    .map(|m| m.msg_id);
                Held {
                    waiting_for: id
                        .as_ref()
                        .map(|i| self.sub("approvals").join(format!("{i}.json"))),
                    approvals_ignored: id
                        .as_ref()
                        .and_then(|i| self.ignored.lock().ok()?.get(i).cloned())
                        .unwrap_or_default(),
                    file: f,
                    msg_id: id,
                }
            })
            .collect();
        if let Ok(mut s) = d.bus_status.lock() {
            *s = serde_json::to_value(BusStatus {
                dir: &self.dir,
                held,
                rules: self.rules.rules.len(),
            })
            .unwrap_or_default();
        }
    }

    /// input/F -> processing/F (or F.N when that name is taken), atomic and
    /// never replacing.
    fn claim(&self, f: &str) -> Option<String> {
        let from = self.sub("input").join(f);
        for n in 0..1000 {
            let name = if n == 0 {
                f.to_owned()
            } else {
                format!("{}.{n}.json", f.trim_end_matches(".json"))
            };
            let to = self.sub("processing").join(&name);
            match nix::fcntl::renameat2(
                nix::fcntl::AT_FDCWD,
                &from,
                nix::fcntl::AT_FDCWD,
                &to,
                nix::fcntl::RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => {
                    fsync_dir(&self.sub("processing"));
                    fsync_dir(&self.sub("input"));
                    return Some(name);
                }
                Err(nix::errno::Errno::EEXIST) => continue,
                Err(_) => return None,
            }
        }
        None
    }

    /// Evidence already written for these message bytes, if any.
    fn evidence_of(&self, f: &str, sha: &str) -> Option<PathBuf> {
        let stem = f.trim_end_matches(".json");
        for sub in ["output", "error"] {
            for name in self.listing(sub) {
                if name != f && !name.starts_with(&format!("{stem}.")) {
                    continue;
                }
                let p = self.sub(sub).join(&name);
                let matches = std::fs::read(&p)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<EvidenceFile>(&b).ok())
                    .is_some_and(|v| v.message_sha256 == sha);
                if matches {
                    return Some(p);
                }
            }
        }
        None
    }

    /// Processes processing/F to its end (or leaves it held).
    fn finish_claimed(&self, d: &Daemon, f: &str) {
        let path = self.sub("processing").join(f);
        let t = Instant::now();
        let bytes = match turnstile_policy::input::read_regular_file(&path, MAX_MESSAGE_BYTES) {
            Ok(b) => b,
            Err(e) => {
                let err = BusError::new(
                    codes::BUS_MESSAGE_INVALID,
                    "message",
                    format!("unreadable: {e}"),
                );
                self.write_evidence(d, f, b"", Disposition::Failed(Outcome::rejected(&err)), t);
                return;
            }
        };
        let sha = sha256_hex(&bytes);
        if self.evidence_of(f, &sha).is_some() {
            // Finished before a crash; only the leftover remains.
            let _ = std::fs::remove_file(&path);
            fsync_dir(&self.sub("processing"));
            return;
        }
        let disposition = self.process(d, &bytes);
        if let Disposition::Held(why) = &disposition {
            tracing::info!(file = f, reason = %why, "bus: held");
            return;
        }
        self.write_evidence(d, f, &bytes, disposition, t);
    }

    fn write_evidence(
        &self,
        d: &Daemon,
        f: &str,
        bytes: &[u8],
        disposition: Disposition,
        t: Instant,
    ) {
        let (sub, mut outcome) = match disposition {
            Disposition::Done(v) => ("output", v),
            Disposition::Failed(v) => ("error", v),
            Disposition::Held(_) => return,
        };
        if let (Some(id), Ok(mut map)) = (outcome.msg_id.clone(), self.ignored.lock()) {
            outcome.approvals_ignored = map.remove(&id).unwrap_or_default();
        }
        let message: Value = serde_json::from_slice(bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()));
        let v = EvidenceFile {
            outcome,
            file: f.to_owned(),
            message,
            message_sha256: sha256_hex(bytes),
            processed_at: turnstile_policy::timefmt::rfc3339_micros(
                turnstile_policy::session::Clock::now(&crate::ids::SystemClock),
            ),
            schema: "turnstile.bus.evidence/v0.1".into(),
        };
        let dir = self.sub(sub);
        let stem = f.trim_end_matches(".json");
        let name = (0..1000)
            .map(|n| {
                if n == 0 {
                    f.to_owned()
                } else {
                    format!("{stem}.{n}.json")
                }
            })
            .find(|n| !dir.join(n).exists())
            .unwrap_or_else(|| format!("{stem}.{}.json", std::process::id()));
        let tmp = dir.join(format!(".{name}.tmp"));
        let text = format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default());
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut file| {
                file.write_all(text.as_bytes())?;
                file.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, dir.join(&name)));
        if let Err(e) = written {
            // Left in processing/: retried on the next pass or start.
            tracing::error!(file = f, error = %e, "bus: cannot write evidence; the message stays in processing/");
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        fsync_dir(&dir);
        let _ = std::fs::remove_file(self.sub("processing").join(f));
        fsync_dir(&self.sub("processing"));
        d.metrics.events_emitted.inc();
        tracing::info!(
            file = f,
            to = sub,
            status = v.outcome.status.as_str(),
            "bus: message finished"
        );
        let _ = t;
    }

    /// Validates, matches and runs a message.
    fn process(&self, d: &Daemon, bytes: &[u8]) -> Disposition {
        let t = Instant::now();
        let m = match parse_message(bytes) {
            Ok(m) => m,
            Err(e) => {
                d.metrics.turn_finished(
                    &serde_json::to_value(Outcome::rejected(&e)).unwrap_or_default(),
                    None,
                    t.elapsed().as_secs_f64() * 1000.0,
                );
                return Disposition::Failed(Outcome::rejected(&e));
            }
        };
        let mut skipped = Vec::new();
        let mut chosen = None;
        for (i, r) in self.rules.rules.iter().enumerate() {
            if r.trigger.command_type != m.command_type
                || !glob(&r.trigger.source, &m.context.requested_by)
            {
                continue;
            }
            if let Some(p) = r.guards.phase {
                if p != m.context.phase {
                    skipped.push(Skipped {
                        rule: r.id.clone(),
                        guard: "phase".into(),
                        expected: Value::from(p),
                        got: Value::from(m.context.phase),
                    });
                    continue;
                }
            }
            if let Some(c) = &r.guards.category {
                if !c.contains(&m.category) {
                    skipped.push(Skipped {
                        rule: r.id.clone(),
                        guard: "category".into(),
                        expected: c.iter().map(|x| Value::from(x.as_str())).collect(),
                        got: Value::from(m.category.as_str()),
                    });
                    continue;
                }
            }
            chosen = Some((i, r));
            break;
        }
        let Some((ri, rule)) = chosen else {
            let e = BusError::new(
                codes::BUS_NO_RULE,
                "command_type",
                format!(
                    "no rule applies to command_type `{}` from `{}` (phase {}, category {}){}",
                    m.command_type.as_str(),
                    m.context.requested_by,
                    m.context.phase,
                    m.category.as_str(),
                    if skipped.is_empty() {
                        String::new()
                    } else {
                        format!("; {} rule(s) skipped by a failed guard", skipped.len())
                    }
                ),
            );
            return Disposition::Failed(Outcome {
                msg_id: Some(m.msg_id.clone()),
                status: "no_rule".into(),
                error: Some(e.record()),
                skipped: Some(skipped),
                ..Outcome::default()
            });
        };
        if rule.guards.approval == Approval::Required && !self.approved(&m, bytes) {
            return Disposition::Held(format!(
                "rule `{}` requires approval: create {} naming the message's sha256 {} and an approver of the daemon's config",
                rule.id,
                self.sub("approvals")
                    .join(format!("{}.json", m.msg_id))
                    .display(),
                sha256_hex(bytes)
            ));
        }
        let mut vars = BTreeMap::new();
        vars.insert("msg_id".to_owned(), m.msg_id.clone());
        vars.insert("title".to_owned(), m.title.clone());
        vars.insert("phase".to_owned(), m.context.phase.to_string());
        vars.insert("category".to_owned(), m.category.as_str().to_owned());
        for (i, r) in m.run.iter().enumerate() {
            vars.insert(format!("msg_run_{i}"), r.clone());
        }
        let default_mode = if self.dry_run {
            Mode::DryRun
        } else {
            Mode::Live
        };
        // Every action is rendered and validated before the first runs.
        let mut prepared = Vec::new();
        for (j, a) in rule.actions.iter().enumerate() {
            match prepare(a, &vars, &format!("rules[{ri}].actions[{j}]"), default_mode) {
                // --dry-run wins over a rule's `mode: live`.
                Ok(mut p) => {
                    if self.dry_run {
                        p.mode = Mode::DryRun;
                    }
                    prepared.push(p)
                }
                Err(e) => {
                    return Disposition::Failed(Outcome {
                        msg_id: Some(m.msg_id.clone()),
                        rule: Some(rule.id.clone()),
                        status: "disallowed".into(),
                        error: Some(e.record()),
                        skipped: Some(skipped),
                        actions: None,
                        ..Outcome::default()
                    });
                }
            }
        }
        // A live production bus runs only what the sandbox bus ran first.
        let live = prepared.iter().any(|p| p.mode == Mode::Live);
        if live
            && self.policy.role == super::config::BusRole::Production
            && self.policy.require_sandbox_first
        {
            let sha = sha256_hex(bytes);
            if !self.sandbox_first_ok(&m, &sha) {
                let e = BusError::new(
                    codes::BUS_NOT_SANDBOX_FIRST,
                    "msg_id",
                    format!(
                        "message `{}` (sha256 {sha}) was not first processed in dry-run on the sandbox bus {}: refused on the production bus, nothing ran",
                        m.msg_id,
                        self.policy
                            .sandbox_bus
                            .as_deref()
                            .unwrap_or(Path::new("(none)"))
                            .display()
                    ),
                );
                return Disposition::Failed(Outcome {
                    msg_id: Some(m.msg_id.clone()),
                    rule: Some(rule.id.clone()),
                    status: "not_sandbox_first".into(),
                    error: Some(e.record()),
                    skipped: Some(skipped),
                    ..Outcome::default()
                });
            }
        }
        let mut results = Vec::new();
        let mut ok = true;
        for (j, (a, p)) in rule.actions.iter().zip(&prepared).enumerate() {
            let mut r = ActionResult {
                index: j,
                rendered: p.rendered.clone(),
                argv: p.argv.clone(),
                workspace: a.workspace.clone(),
                package: a.package.clone(),
                mode: "live".into(),
                would_execute: None,
                exit_status: None,
                session_id: None,
                turn_number: None,
                status: None,
                replayed: None,
                error: None,
                output: None,
            };
            if p.mode == Mode::DryRun {
                r.mode = "dry-run".into();
                r.would_execute = Some(p.argv.clone());
                results.push(r);
                continue;
            }
            match self.run_live(d, &m, j, a, p) {
                Ok((reply, log)) => {
                    r.exit_status = Some(reply.exit_status);
                    match serde_json::from_value::<TurnReport>(reply.value.clone()) {
                        Ok(t) => {
                            r.session_id = Some(t.session_id);
                            r.turn_number = Some(t.turn_number);
                            r.status = Some(t.status);
                            r.replayed = Some(t.replayed);
                            r.error = t.error.map(|e| serde_json::to_value(e).unwrap_or_default());
                        }
                        // Refused before a turn existed: the error object.
                        Err(_) => {
                            r.error = serde_json::from_value::<crate::turn::outcome::ErrorReply>(
                                reply.value.clone(),
                            )
                            .ok()
                            .map(|e| serde_json::to_value(e.error).unwrap_or_default());
                        }
                    }
                    r.output = Some(log);
                    if reply.exit_status != 0 {
                        ok = false;
                    }
                }
                Err(e) => {
                    r.error = Some(crate::turn::outcome::error_value(&e));
                    r.exit_status = Some(e.exit_status());
                    ok = false;
                }
            }
            results.push(r);
            if !ok {
                break;
            }
        }
        let v = Outcome {
            msg_id: Some(m.msg_id.clone()),
            rule: Some(rule.id.clone()),
            status: if ok { "done" } else { "failed" }.into(),
            error: None,
            actions: Some(results),
            skipped: Some(skipped),
            ..Outcome::default()
        };
        if ok {
            Disposition::Done(v)
        } else {
            Disposition::Failed(v)
        }
    }

    /// Runs one live action as a turn (through a worker, like the socket).
    fn run_live(
        &self,
        d: &Daemon,
        m: &Message,
        j: usize,
        a: &Action,
        p: &Prepared,
    ) -> Result<(super::wire::Reply, String)> {
        let session = self.session_for(d, a)?;
        let log_path = self
            .sub("processing")
            .join(format!(".{}.a{j}.log", m.msg_id));
        let log = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&log_path)
            .map_err(io_err("open action log", &log_path))?;
        let out: OwnedFd = log
            .try_clone()
            .map_err(io_err("dup action log", &log_path))?
            .into();
        let err: OwnedFd = log.into();
        let r = RunRequest {
            root: a.workspace.clone(),
            package: a.package.clone(),
            session: Some(session),
            state_dir: Some(d.state_dir.clone()),
            backend: None,
            tenant: None,
            config: None,
            rootfs: None,
            json: false,
            events: None,
            deterministic: None,
            request: serde_json::to_value(ActionRequest {
                command: &p.argv,
                declared_outputs: a
                    .outputs
                    .iter()
                    .map(|o| crate::store::record::DeclaredWrite {
                        path: o.path.clone(),
                        role: o.role.clone(),
                    })
                    .collect(),
                work_order_id: &m.msg_id,
                idempotency_key: format!("bus:{}:{j}", m.msg_id),
            })
            .unwrap_or_default(),
            receive: None,
        };
        let t = Instant::now();
        let n = d.next_conn.fetch_add(1, Ordering::SeqCst);
        let reply = super::run_worker(d, n, &r, out, err, None, &[])?.settle(d);
        d.metrics.turn_finished(
            &reply.value,
            reply.trust_level.as_deref(),
            t.elapsed().as_secs_f64() * 1000.0,
        );
        let text = std::fs::read(&log_path).unwrap_or_default();
        let _ = std::fs::remove_file(&log_path);
        let cut = text.len().min(MAX_LOG_BYTES as usize);
        Ok((reply, String::from_utf8_lossy(&text[..cut]).into_owned()))
    }

    /// The session of (this bus, workspace, package): created once, its id
    /// kept in the state dir (never in the bus dir, which agents write).
    fn session_for(&self, d: &Daemon, a: &Action) -> Result<String> {
        let key = sha256_hex(
            format!(
                "{}\0{}\0{}",
                self.dir.display(),
                a.workspace.display(),
                a.package
            )
            .as_bytes(),
        );
        let dir = d.state_dir.join("bus-sessions");
        let file = dir.join(&key[..32]);
        if let Ok(s) = std::fs::read_to_string(&file) {
            let s = s.trim().to_owned();
            let id = turnstile_policy::SessionId::parse(&s)?;
            let ws = crate::store::layout::Workspace::open(&a.workspace)?;
            let state = crate::store::layout::StateDir::open(&d.state_dir, &ws, false)?;
            if crate::store::session::Session::open(&ws, &state, &id, None).is_ok() {
                return Ok(s);
            }
        }
        let ws = crate::store::layout::Workspace::open(&a.workspace)?;
        let state = crate::store::layout::StateDir::open(&d.state_dir, &ws, true)?;
        let session = crate::store::session::Session::create_default(&ws, &state)?;
        std::fs::create_dir_all(&dir).map_err(io_err("create bus session dir", &dir))?;
        let tmp = dir.join(format!(".{}.tmp", &key[..32]));
        std::fs::write(&tmp, format!("{}\n", session.id.as_str()))
            .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, &file))
            .map_err(io_err("record bus session", &file))?;
        fsync_dir(&dir);
        Ok(session.id.as_str().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_shape_bounds_depth_and_size_but_not_quoted_braces() {
        assert!(rules_shape("rules:\n  - {a: [1, {b: 2}]}\n").is_ok());
        let deep = format!("rules: {}", "{".repeat(65));
        assert!(
            rules_shape(&deep)
                .unwrap_err()
                .contains("nested deeper than 64")
        );
        // Braces in quotes and comments are text, not nesting.
        let quoted = format!(
            "run: \"{0}{1}\"\nx: '{0}{1}' # {0}{1}\n",
            "{".repeat(40),
            "}".repeat(40)
        );
        assert!(rules_shape(&quoted).is_ok(), "{quoted}");
        // `"}"` inside the nesting closes nothing.
        let closers = format!("x: {}\n", "{\"}\"".repeat(65));
        assert!(rules_shape(&closers).is_err(), "{closers}");
        let escaped = format!("run: \"a\\\"{}\"\n", "[]".repeat(100));
        assert!(rules_shape(&escaped).is_ok(), "{escaped}");
        // A quote after a bracket of a plain scalar (fuzz finding).
        let seeded = format!("rule{}\":\n  - id: {}", "{".repeat(34), "{".repeat(40));
        assert!(rules_shape(&seeded).is_err());
        // A quote inside a plain scalar opens nothing (fuzz finding).
        let stray = format!("guards: {{cat\"}}\nx: {}", "{".repeat(65));
        assert!(rules_shape(&stray).is_err(), "{stray}");
        assert!(rules_shape(&" ".repeat(MAX_RULES_BYTES + 1)).is_err());
    }
    use serde_json::json;

    fn msg() -> serde_json::Value {
        json!({"msg_id": "M-1", "category": "B", "msg_type": "COMMAND", "command_type": "exec",
               "title": "t", "run": ["echo 'a b'"], "context": {"phase": 2, "requested_by": "agent"},
               "timestamp": "2026-11-23T10:00:00Z"})
    }

    #[test]
    fn a_valid_message_parses_and_each_bad_field_is_named() {
        assert!(parse_message(msg().to_string().as_bytes()).is_ok());
        for (field, value) in [
            ("msg_id", json!("../x")),
            ("msg_type", json!("EVENT")),
            ("category", json!("E")),
            ("command_type", json!("shell")),
            ("run", json!([])),
            ("timestamp", json!("yesterday")),
        ] {
            let mut m = msg();
            m[field] = value;
            let e = parse_message(m.to_string().as_bytes()).unwrap_err();
            assert_eq!(e.field, field, "{}", e.message);
            assert_eq!(e.code.code, "TS1033");
        }
        let mut m = msg();
        m["extra"] = json!(1);
        assert_eq!(
            parse_message(m.to_string().as_bytes()).unwrap_err().field,
            "extra"
        );
        let mut m = msg();
        m["context"]["phase"] = json!("two");
        assert_eq!(
            parse_message(m.to_string().as_bytes()).unwrap_err().field,
            "context.phase"
        );
    }

    #[test]
    fn templates_render_and_the_rendered_command_is_what_is_checked() {
        let mut vars = BTreeMap::new();
        vars.insert("msg_run_0".to_owned(), "echo hi; rm -rf /".to_owned());
        vars.insert("msg_id".to_owned(), "M-1".to_owned());
        assert_eq!(
            render("{{msg_run_0}}", &vars, false).unwrap(),
            "echo hi; rm -rf /"
        );
        assert!(render("{{ msg_id }}!", &vars, false).unwrap() == "M-1!");
        assert!(render("{{nope}}", &vars, true).is_err());
        assert!(render("{{msg_run_1}}", &vars, false).is_err());
        let action = Action {
            run: "{{msg_run_0}}".into(),
            allowlist: vec!["echo".into()],
            workspace: "/ws".into(),
            package: "p".into(),
            outputs: Vec::new(),
            mode: None,
        };
        // No shell: `;` is an argument of echo, not a second command.
        let p = prepare(&action, &vars, "a", Mode::Live).unwrap();
        assert_eq!(p.argv[1..], ["hi;", "rm", "-rf", "/"]);
        assert!(p.argv[0].ends_with("/echo"));
        vars.insert("msg_run_0".to_owned(), "npm run build".to_owned());
        let e = prepare(&action, &vars, "a", Mode::Live).unwrap_err();
        assert_eq!(e.code.code, "TS1034");
        vars.insert("msg_run_0".to_owned(), "echo 'unbalanced".to_owned());
        assert_eq!(
            prepare(&action, &vars, "a", Mode::Live)
                .unwrap_err()
                .code
                .code,
            "TS1034"
        );
    }

    #[test]
    fn source_globs() {
        assert!(glob("*", "anyone"));
        assert!(glob("agent-*", "agent-7"));
        assert!(!glob("agent-*", "human"));
        assert!(glob("a?c", "abc"));
    }

    #[test]
    fn a_bad_rules_file_is_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(RULES_FILE);
        for (text, field) in [
            (
                "rules:\n  - id: x\n    trigger: {command_type: exec}\n    actions: []\n",
                "rules[0].actions",
            ),
            (
                "rules:\n  - id: x\n    trigger: {command_type: shell}\n    actions: []\n",
                "rules[0].trigger.command_type",
            ),
            (
                "rules:\n  - id: x\n    trigger: {command_type: exec}\n    bogus: 1\n    actions: []\n",
                "rules[0].bogus",
            ),
            (
                "rules:\n  - id: x\n    trigger: {command_type: exec}\n    actions:\n      - {run: 'echo {{secret}}', allowlist: [echo], workspace: /ws, package: p}\n",
                "rules[0].actions[0].run",
            ),
            (
                "rules:\n  - id: x\n    trigger: {command_type: exec}\n    actions:\n      - {run: 'echo', allowlist: [echo], workspace: ws, package: p}\n",
                "rules[0].actions[0].workspace",
            ),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = load_rules(&p).unwrap_err();
            assert_eq!(e.field(), Some(field), "{e}");
            assert_eq!(e.code().code, "TS1036");
        }
    }
}
