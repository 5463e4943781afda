//! Suspend and resume (issue 28 item 4; seed 002 §4.1.1, §5.1.1): a
//! session's sandboxes — its running turn's and the warm one a `serve`
//! worker keeps for its next turn — frozen and thawed through their
//! cgroups (`cgroup.freeze`, or the v1 freezer).
//!
//! Each sandbox is found by the cgroup file its builder published in its
//! directory (`turn-N/` or `warm-<id>/` in the session's state directory,
//! [`crate::store::record::running_cgroup_file`]); a sandbox without live
//! processes is not one. Every transition is appended to that directory's
//! `suspensions.jsonl`, which the turn that runs in it (the running turn,
//! or the next turn, which takes the warm sandbox) carries into its
//! evidence entry. A turn's timeout does not run while its cgroup is
//! frozen (`sandbox::Watch::start_timer`).
//!
//! A thaw that fails ends what it could not thaw (fail closed: a turn
//! that may be half-frozen is not left to run): its processes are killed,
//! the fact is recorded with E2024 RESUME_FAILED, and the caller is told.
//!
//! The daemon also keeps each session's lifecycle as EventEnvelopes
//! (`agent.suspended`, `agent.resumed`, `agent.terminated`) in
//! `sessions/<sid>/lifecycle.jsonl` and publishes them on its event bus
//! ([`crate::serve::router`]) so subscribers see them.

use std::path::{Path, PathBuf};

use turnstile_policy::envelope::{EventEnvelope, SCHEMA_VERSION, Source};
use turnstile_policy::session::Clock as _;

use crate::error::{Result, SupervisorError};
use crate::sandbox::cgroup::TurnCgroup;
use crate::store::record::{ErrorRecord, SuspensionFact, running_cgroup_file, suspensions_file};

/// What a sandbox of a session is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// The running turn N.
    Turn(u64),
    /// A warm sandbox (`warm-<id>`, the id starting with its owner's pid).
    Warm(String),
}

/// A sandbox of a session with live processes.
#[derive(Debug)]
pub struct Live {
    pub dir: PathBuf,
    pub kind: Kind,
    pub cg: TurnCgroup,
}

impl Live {
    /// Whether the warm sandbox belongs to the worker `pid`.
    pub fn warm_of(&self, pid: u32) -> bool {
        matches!(&self.kind, Kind::Warm(id) if id.split('-').next() == Some(pid.to_string().as_str()))
    }
}

/// The session's sandboxes with live processes: running turns first
/// (newest first), then warm ones.
pub fn live(session_dir: &Path) -> Vec<Live> {
    let mut out: Vec<Live> = std::fs::read_dir(session_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let kind = if let Some(n) = name.strip_prefix("turn-") {
                Kind::Turn(n.parse().ok()?)
            } else {
                Kind::Warm(
                    name.strip_prefix(crate::sandbox::pool::WARM_PREFIX)?
                        .to_owned(),
                )
            };
            let cg = TurnCgroup::from_file(&running_cgroup_file(&e.path()))?;
            (!cg.pids().is_empty()).then(|| Live {
                dir: e.path(),
                kind,
                cg,
            })
        })
        .collect();
    out.sort_by_key(|l| match &l.kind {
        Kind::Turn(n) => (0, u64::MAX - n, String::new()),
        Kind::Warm(id) => (1, 0, id.clone()),
    });
    out
}

/// Now, as the ledgers write times.
pub fn now() -> String {
    turnstile_policy::timefmt::rfc3339_micros(crate::ids::SystemClock.now())
}

/// Appends `fact` to the sandbox directory's suspensions (read into the
/// evidence of the turn that runs there).
pub fn record(dir: &Path, fact: &SuspensionFact) -> Result<()> {
    use std::io::Write as _;
    let path = suspensions_file(dir);
    let mut line = serde_json::to_vec(fact).unwrap_or_default();
    line.push(b'\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(&line))
        .map_err(crate::fsx::state_io("append", &path))
}

fn fact(event: &str, reason: Option<&str>, error: Option<ErrorRecord>) -> SuspensionFact {
    SuspensionFact {
        event: event.to_owned(),
        ts: now(),
        reason: reason.map(str::to_owned),
        error,
    }
}

/// Freezes `l` and records it; a freeze that fails is undone (thawed)
/// and is TS1053.
pub fn freeze(session: &str, l: &Live, reason: Option<&str>) -> Result<()> {
    if let Err(e) = l.cg.set_frozen(true) {
        let _ = l.cg.set_frozen(false);
        return Err(SupervisorError::SuspendFailed {
            session: session.to_owned(),
            detail: e.to_string(),
        });
    }
    record(&l.dir, &fact("turn.suspended", reason, None))
}

/// Thaws `l` and records it. A thaw that fails kills what it could not
/// thaw and records why: E2024.
pub fn thaw(session: &str, l: &Live, reason: Option<&str>) -> Result<()> {
    match l.cg.set_frozen(false) {
        Ok(()) => record(&l.dir, &fact("turn.resumed", reason, None)),
        Err(e) => {
            let err = SupervisorError::ResumeFailed {
                session: session.to_owned(),
                detail: e.to_string(),
            };
            let _ = record(
                &l.dir,
                &fact("turn.resume_failed", reason, Some(error_record(&err))),
            );
            l.cg.kill_all();
            Err(err)
        }
    }
}

/// An error as the records write it.
pub fn error_record(e: &SupervisorError) -> ErrorRecord {
    let code = e.code();
    ErrorRecord {
        code: code.code.to_owned(),
        name: code.name.to_owned(),
        message: e.to_string(),
    }
}

/// What an `agent.*` lifecycle envelope says.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LifecyclePayload {
    pub session_id: String,
    /// The package whose sandbox it is, when the daemon knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust_level: Option<String>,
    /// `request` (suspend/resume asked), `idle`
    /// (`suspend_idle_after_seconds`), `turn` (a turn arrived), `error`.
    pub reason: String,
    /// The sandboxes it concerned (`turn-N`, `warm-<id>`).
    pub sandboxes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorRecord>,
}

/// The runtime's own envelope for a lifecycle transition; `seq` makes
/// the key unique within the daemon's life, the time across lives.
pub fn envelope(kind: &str, payload: &LifecyclePayload, seq: u64) -> EventEnvelope {
    use sha2::{Digest, Sha256};
    let ts = now();
    let key = format!("lifecycle:{}:{kind}:{ts}:{seq}", payload.session_id);
    let id = format!("EVT-{}", &hex::encode(Sha256::digest(key.as_bytes()))[..32]);
    EventEnvelope {
        id,
        ts,
        kind: kind.to_owned(),
        schema_version: SCHEMA_VERSION.to_owned(),
        idempotency_key: key,
        source: Source {
            agent: "supervise".to_owned(),
            adapter: "serve".to_owned(),
        },
        payload: serde_json::to_value(payload).unwrap_or_default(),
    }
}

/// Where a session's lifecycle envelopes are kept.
pub fn lifecycle_file(session_dir: &Path) -> PathBuf {
    session_dir.join("lifecycle.jsonl")
}

/// Appends `e` (canonical) to the session's lifecycle file.
pub fn keep(session_dir: &Path, e: &EventEnvelope) -> Result<()> {
    use std::io::Write as _;
    let path = lifecycle_file(session_dir);
    let mut line = e.to_canonical().unwrap_or_default();
    line.push(b'\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| {
            f.write_all(&line)?;
            f.sync_data()
        })
        .map_err(crate::fsx::state_io("append", &path))
}

/// The name of a sandbox's directory.
pub fn dir_name(l: &Live) -> String {
    l.dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A turn in flight through the daemon (`agent_runtime_active_agents`).
#[derive(Debug, Clone)]
pub struct Agent {
    pub session: Option<String>,
    pub trust_level: String,
}

/// `suspend`/`resume --json`, locally or through the daemon.
#[derive(Debug, serde::Serialize)]
pub struct SuspendReport {
    pub session_id: String,
    /// The running turn, when one was frozen or thawed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn_number: Option<u64>,
    pub frozen: bool,
    /// Every sandbox frozen or thawed (`turn-N`, `warm-<id>`).
    pub sandboxes: Vec<String>,
}

impl SuspendReport {
    /// What `suspend`/`resume` print.
    pub fn text(&self, json: bool) -> String {
        if json {
            return format!("{}\n", serde_json::to_string(self).unwrap_or_default());
        }
        let what = if self.frozen { "suspended" } else { "resumed" };
        match (self.turn_number, self.sandboxes.is_empty()) {
            (Some(n), _) if self.sandboxes.len() == 1 => {
                format!("turn {n} of {}: {what}\n", self.session_id)
            }
            (_, true) => format!("{}: nothing was suspended\n", self.session_id),
            _ => format!(
                "{}: {what} ({})\n",
                self.session_id,
                self.sandboxes.join(", ")
            ),
        }
    }
}

/// Freezes (`freeze`) or thaws every live sandbox of the session in
/// `session_dir`; `on_failure` sees each sandbox a thaw ended. TS1052 when
/// the session has none.
pub fn apply(
    session: &str,
    session_dir: &Path,
    freeze: bool,
    reason: Option<&str>,
    mut on_failure: impl FnMut(&Live),
) -> Result<SuspendReport> {
    let all = live(session_dir);
    if all.is_empty() {
        return Err(SupervisorError::NoRunningTurn {
            session: session.to_owned(),
            action: if freeze { "suspend" } else { "resume" },
        });
    }
    let mut report = SuspendReport {
        session_id: session.to_owned(),
        turn_number: None,
        frozen: freeze,
        sandboxes: Vec::new(),
    };
    let mut failed = None;
    for l in &all {
        if freeze && l.cg.frozen() {
            continue;
        }
        // A resume thaws what is frozen (a sandbox whose freezer is gone
        // is tried too: its thaw fails, E2024).
        if !freeze && !l.cg.frozen() && l.cg.can_freeze() && freezer_present(&l.cg) {
            continue;
        }
        let done = if freeze {
            freeze_one(session, l, reason)
        } else {
            thaw(session, l, reason)
        };
        match done {
            Ok(()) => {
                if let Kind::Turn(n) = l.kind {
                    report.turn_number.get_or_insert(n);
                }
                report.sandboxes.push(dir_name(l));
            }
            Err(e) => {
                if !freeze {
                    on_failure(l);
                }
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

fn freeze_one(session: &str, l: &Live, reason: Option<&str>) -> Result<()> {
    freeze(session, l, reason)
}

/// Whether the cgroup's freezer file is still there.
fn freezer_present(cg: &TurnCgroup) -> bool {
    cg.freezer_file().is_some_and(|f| f.exists())
}

impl super::Daemon {
    fn session_dir(&self, session: &str) -> Option<PathBuf> {
        let id = turnstile_policy::SessionId::parse(session).ok()?;
        Some(crate::store::layout::StateDir::at(&self.state_dir).session_dir(&id))
    }

    /// Keeps a lifecycle envelope about `p.session_id` in its session's
    /// lifecycle file and publishes it on the event bus (at the hop of the
    /// session's last receive).
    pub(crate) fn emit_lifecycle(&self, kind: &str, p: &LifecyclePayload) {
        let seq = self
            .lifecycle_seq
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let e = envelope(kind, p, seq);
        if let Some(dir) = self.session_dir(&p.session_id) {
            if let Err(err) = keep(&dir, &e) {
                tracing::warn!(error = %err, "cannot keep a lifecycle envelope");
            }
        }
        if let Some(r) = &self.router {
            let hop = self
                .hops
                .lock()
                .ok()
                .and_then(|h| h.get(&p.session_id).copied())
                .unwrap_or(0);
            if let Err(err) = r.publish(std::slice::from_ref(&e), hop) {
                tracing::warn!(error = %err, "cannot publish a lifecycle envelope");
            }
        }
        tracing::info!(
            event = kind,
            session_id = %p.session_id,
            reason = %p.reason,
            sandboxes = ?p.sandboxes,
            error = p.error.as_ref().map_or("", |e| e.code.as_str()),
            "agent lifecycle"
        );
    }

    fn payload(
        &self,
        session: &str,
        reason: &str,
        sandboxes: Vec<String>,
        error: Option<ErrorRecord>,
    ) -> LifecyclePayload {
        let (agent_id, trust_level) = self
            .idle
            .lock()
            .ok()
            .and_then(|m| {
                m.get(session)
                    .map(|w| (w.package.clone(), w.trust_level.clone()))
            })
            .or_else(|| {
                let r = self.running.lock().ok()?;
                r.values()
                    .find(|a| a.session.as_deref() == Some(session))
                    .map(|a| (None, Some(a.trust_level.clone())))
            })
            .unwrap_or((None, None));
        LifecyclePayload {
            session_id: session.to_owned(),
            agent_id,
            trust_level,
            reason: reason.to_owned(),
            sandboxes,
            error,
        }
    }

    /// A `suspend` / `resume` request, answered as the CLI would print it.
    pub(crate) fn lifecycle_reply(
        &self,
        req: &super::wire::LifecycleRequest,
        freeze: bool,
    ) -> super::wire::Reply {
        match self.lifecycle_request(req, freeze) {
            Ok(report) => super::wire::Reply {
                exit_status: crate::error::exit::OK,
                stdout: report.text(req.json),
                value: serde_json::to_value(&report).unwrap_or_default(),
                ..super::wire::Reply::default()
            },
            Err(e) => super::error_reply(&e, req.json),
        }
    }

    fn lifecycle_request(
        &self,
        req: &super::wire::LifecycleRequest,
        freeze: bool,
    ) -> Result<SuspendReport> {
        if !req.root.is_absolute() {
            return Err(SupervisorError::invalid("root", "must be an absolute path"));
        }
        super::same_state_dir(self, req.state_dir.as_deref())?;
        let id = turnstile_policy::SessionId::parse(&req.session)?;
        let ws = crate::store::layout::Workspace::open(&req.root)?;
        let state = crate::store::layout::StateDir::open(&self.state_dir, &ws, false)?;
        crate::store::session::Session::open_as(
            &ws,
            &state,
            &id,
            None,
            &crate::store::session::Owner::for_access(req.tenant.as_deref()),
        )?;
        let dir = state.session_dir(&id);
        // Holding the waiting workers: none is handed a turn meanwhile.
        let mut idle = self
            .idle
            .lock()
            .map_err(|_| SupervisorError::WorkerFailed {
                detail: "the worker table is poisoned".into(),
            })?;
        let mut ended = Vec::new();
        let done = apply(id.as_str(), &dir, freeze, Some("request"), |l| {
            ended.push(dir_name(l));
        });
        if let Some(w) = idle.get_mut(id.as_str()) {
            let pid = w.pid.as_raw() as u32;
            let mine = live(&dir).iter().any(|l| l.warm_of(pid)) || w.suspended;
            if mine {
                w.suspended = freeze;
            }
        }
        if done.is_err() && !freeze {
            // What could not be thawed was killed: its worker goes.
            if let Some(w) = idle.remove(id.as_str()) {
                w.dismiss(self);
            }
        }
        drop(idle);
        if let Ok(mut s) = self.suspended.lock() {
            let running = live(&dir).iter().any(|l| matches!(l.kind, Kind::Turn(_)))
                || self.running_session(id.as_str());
            if freeze && running {
                s.insert(id.to_string());
            } else if !freeze {
                s.remove(id.as_str());
            }
        }
        self.refresh_active();
        match &done {
            Ok(r) if !r.sandboxes.is_empty() => self.emit_lifecycle(
                if freeze {
                    "agent.suspended"
                } else {
                    "agent.resumed"
                },
                &self.payload(id.as_str(), "request", r.sandboxes.clone(), None),
            ),
            Ok(_) => {}
            Err(e) => {
                if !freeze {
                    self.emit_lifecycle(
                        "agent.terminated",
                        &self.payload(id.as_str(), "error", ended, Some(error_record(e))),
                    );
                }
            }
        }
        done
    }

    fn running_session(&self, session: &str) -> bool {
        self.running
            .lock()
            .is_ok_and(|r| r.values().any(|a| a.session.as_deref() == Some(session)))
    }

    /// Freezes the warm sandbox of every worker waiting longer than
    /// `suspend_idle_after_seconds` (once).
    pub(crate) fn suspend_idle(&self) {
        let Some(after) = self.suspend_idle else {
            return;
        };
        let mut events = Vec::new();
        if let Ok(mut idle) = self.idle.lock() {
            for (session, w) in idle.iter_mut() {
                if w.suspended || w.since.elapsed() < after {
                    continue;
                }
                let Some(dir) = self.session_dir(session) else {
                    continue;
                };
                let pid = w.pid.as_raw() as u32;
                let mine: Vec<Live> = live(&dir).into_iter().filter(|l| l.warm_of(pid)).collect();
                if mine.is_empty() {
                    // Its sandbox is still being built: next time.
                    continue;
                }
                let mut frozen = Vec::new();
                for l in &mine {
                    match freeze(session, l, Some("idle")) {
                        Ok(()) => frozen.push(dir_name(l)),
                        Err(e) => {
                            tracing::warn!(error = %e, session_id = %session, "cannot suspend an idle sandbox")
                        }
                    }
                }
                if !frozen.is_empty() {
                    w.suspended = true;
                    events.push(LifecyclePayload {
                        session_id: session.clone(),
                        agent_id: w.package.clone(),
                        trust_level: w.trust_level.clone(),
                        reason: "idle".into(),
                        sandboxes: frozen,
                        error: None,
                    });
                }
            }
        }
        if !events.is_empty() {
            self.refresh_active();
        }
        for p in events {
            self.emit_lifecycle("agent.suspended", &p);
        }
    }

    /// The session's waiting worker, about to be handed a turn: its warm
    /// sandbox thawed first when it was suspended. A thaw that fails ends
    /// the sandbox and the worker, and the turn fails with E2024 (in the
    /// session's lifecycle file, as `agent.terminated`).
    pub(crate) fn wake(&self, session: &str, mut w: super::Worker) -> Result<super::Worker> {
        // Only the daemon freezes a waiting worker's sandbox (`suspend`,
        // or idle too long), and it marks the worker when it does: an
        // unmarked one has nothing to thaw — no scan of the session's
        // sandboxes on a warm turn's path.
        if !w.suspended {
            return Ok(w);
        }
        let Some(dir) = self.session_dir(session) else {
            return Ok(w);
        };
        let pid = w.pid.as_raw() as u32;
        let frozen: Vec<Live> = live(&dir).into_iter().filter(|l| l.warm_of(pid)).collect();
        if frozen.is_empty() {
            return Ok(w);
        }
        let names: Vec<String> = frozen.iter().map(dir_name).collect();
        let mut failed = None;
        for l in &frozen {
            if let Err(e) = thaw(session, l, Some("turn")) {
                failed.get_or_insert(e);
            }
        }
        w.suspended = false;
        let payload = LifecyclePayload {
            session_id: session.to_owned(),
            agent_id: w.package.clone(),
            trust_level: w.trust_level.clone(),
            reason: if failed.is_some() { "error" } else { "turn" }.into(),
            sandboxes: names,
            error: failed.as_ref().map(error_record),
        };
        match failed {
            None => {
                self.emit_lifecycle("agent.resumed", &payload);
                Ok(w)
            }
            Some(e) => {
                w.dismiss(self);
                self.emit_lifecycle("agent.terminated", &payload);
                self.refresh_active();
                Err(e)
            }
        }
    }

    /// A turn of `package` in session `session` under `root` could not
    /// start because its warm sandbox did not thaw (`e`, E2024): recorded in
    /// the session's evidence ledger (`session.resume_failed`), so the
    /// failure is in the hash chain and not only in the lifecycle file.
    pub(crate) fn record_resume_failed(
        &self,
        root: &Path,
        session: &str,
        package: &str,
        e: &SupervisorError,
    ) {
        let recorded = (|| -> Result<()> {
            let id = turnstile_policy::SessionId::parse(session)?;
            let ws = crate::store::layout::Workspace::open(root)?;
            let state = crate::store::layout::StateDir::open(&self.state_dir, &ws, false)?;
            let s = crate::store::session::Session::open(&ws, &state, &id, None)?;
            s.record_resume_failed(package, error_record(e), crate::ids::SystemClock.now())
        })();
        if let Err(err) = recorded {
            tracing::error!(error = %err, session, "cannot record the failed resume in the evidence ledger");
        }
    }

    /// A turn began in a worker (connection `n`).
    pub(crate) fn turn_began(&self, n: u64, session: Option<&str>, root: &Path, package: &str) {
        let trust_level = turnstile_policy::PackageId::parse(package)
            .ok()
            .and_then(|p| turnstile_policy::Manifest::load(root, &p).ok())
            .map_or_else(
                || "unknown".to_owned(),
                |m| m.trust_level.as_str().to_owned(),
            );
        if let Ok(mut r) = self.running.lock() {
            r.insert(
                n,
                Agent {
                    session: session.map(str::to_owned),
                    trust_level,
                },
            );
        }
        self.refresh_active();
    }

    /// The turn of connection `n` ended: its session is no longer
    /// suspended (what a suspend froze ran to its end, or was killed).
    pub(crate) fn turn_ended(&self, n: u64, session: Option<&str>) {
        if let Ok(mut r) = self.running.lock() {
            r.remove(&n);
        }
        if let (Some(s), Ok(mut sus)) = (session, self.suspended.lock()) {
            sus.remove(s);
        }
        self.refresh_active();
    }

    /// `agent_runtime_active_agents{trust_level,state}`: turns in flight
    /// (`running`, or `suspended`), waiting workers with a warm sandbox
    /// (`idle`, or `suspended`).
    pub(crate) fn refresh_active(&self) {
        let mut counts: std::collections::BTreeMap<(String, &'static str), i64> =
            std::collections::BTreeMap::new();
        let suspended = self.suspended.lock().map(|s| s.clone()).unwrap_or_default();
        if let Ok(r) = self.running.lock() {
            for a in r.values() {
                let state = if a.session.as_ref().is_some_and(|s| suspended.contains(s)) {
                    "suspended"
                } else {
                    "running"
                };
                *counts.entry((a.trust_level.clone(), state)).or_default() += 1;
            }
        }
        if let Ok(idle) = self.idle.lock() {
            for w in idle.values() {
                let state = if w.suspended { "suspended" } else { "idle" };
                let trust = w.trust_level.clone().unwrap_or_else(|| "unknown".into());
                *counts.entry((trust, state)).or_default() += 1;
            }
        }
        self.metrics.set_active_agents(&counts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_28_lifecycle_envelopes_are_valid_runtime_events() {
        let p = LifecyclePayload {
            session_id: "SES-x".into(),
            agent_id: Some("a".into()),
            trust_level: Some("standard".into()),
            reason: "idle".into(),
            sandboxes: vec!["warm-1-1".into()],
            error: None,
        };
        for kind in ["agent.suspended", "agent.resumed", "agent.terminated"] {
            let e = envelope(kind, &p, 7);
            e.validate().unwrap();
            assert!(turnstile_policy::envelope::is_reserved(&e.kind));
            assert_eq!(e.payload["reason"], "idle");
        }
        assert_ne!(
            envelope("agent.resumed", &p, 1).idempotency_key,
            envelope("agent.resumed", &p, 2).idempotency_key
        );
    }

    #[test]
    fn issue_28_live_finds_nothing_without_processes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("turn-3")).unwrap();
        std::fs::create_dir(d.path().join("warm-12-1")).unwrap();
        assert!(live(d.path()).is_empty());
        std::fs::write(d.path().join("w"), "v1\n/a\n/b\n/c\n/d\n").unwrap();
        let l = Live {
            dir: d.path().join("warm-12-1"),
            kind: Kind::Warm("12-1".into()),
            cg: TurnCgroup::from_file(&d.path().join("w")).unwrap(),
        };
        assert!(l.warm_of(12) && !l.warm_of(1));
    }
}
