//! Replay (issue 13 item 4, seed 001 "Replay Determinism"): re-run a
//! recorded session's turns from clean state in a fresh workspace and
//! compare the final state with the original.
//!
//! `--into DIR` (which must not exist) receives `root/` — a copy of the
//! original workspace without its session directories (`planes/`, `tmp/`,
//! `output/`) — and `state/`. The session is created anew (deterministic
//! with the same seed and clock when the original was) and every recorded
//! turn is run again from its evidence entry (command, declared inputs and
//! outputs, work order, idempotency key, timeout, package). Compared:
//! deterministic sessions — both ledgers byte for byte; every session — each
//! turn's status, exit code, committed outputs' hashes and violations, and
//! the final `output/<sid>/` and `tmp/<sid>/` trees (paths relative to the
//! session, contents by sha256). The first difference is named.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use turnstile_policy::SessionId;
use turnstile_policy::request::TurnRequest;
use turnstile_policy::session::SessionIdGenerator;

use crate::error::{Result, SupervisorError};
use crate::ids::Sources;
use crate::sandbox::cgroup::Place;
use crate::store::layout::{StateDir, TURN_TIER, Workspace};
use crate::store::ledger::LedgerKind;
use crate::store::record::{DeclaredWrite, Event, EvidenceEntry, Read, read_all};
use crate::store::session::{Owner, Session};
use crate::store::status::TurnStatus;

/// What `replay` found.
#[derive(Debug)]
pub struct ReplayReport {
    pub original: String,
    pub replayed: String,
    pub root: PathBuf,
    pub turns: usize,
    /// The first difference, or `None` when the replay is identical.
    pub difference: Option<String>,
    /// sha256 of the committed output tree (`output/<session_id>/`:
    /// paths, kinds, modes, content hashes), original and replay.
    pub tree_sha256: (String, String),
    /// Every envelope the session's receive turns emitted, canonical, in
    /// order: original and replay.
    pub emitted: (Vec<String>, Vec<String>),
}

/// Original and replay, side by side.
#[derive(Debug, serde::Serialize)]
struct Pair<T> {
    original: T,
    replay: T,
}

/// `replay --json`, one session.
#[derive(Debug, serde::Serialize)]
struct ReportJson<'a> {
    session_id: &'a str,
    replayed_session_id: &'a str,
    root: &'a Path,
    turns: usize,
    identical: bool,
    first_difference: &'a Option<String>,
    tree_sha256: Pair<&'a str>,
    emitted: Pair<usize>,
}

/// `replay --json` with several sessions.
#[derive(Debug, serde::Serialize)]
pub struct ManyJson {
    pub identical: bool,
    pub first_difference: Option<String>,
    pub sessions: Vec<Value>,
}

impl ReplayReport {
    pub fn to_value(&self) -> Value {
        serde_json::to_value(ReportJson {
            session_id: &self.original,
            replayed_session_id: &self.replayed,
            root: &self.root,
            turns: self.turns,
            identical: self.difference.is_none(),
            first_difference: &self.difference,
            tree_sha256: Pair {
                original: &self.tree_sha256.0,
                replay: &self.tree_sha256.1,
            },
            emitted: Pair {
                original: self.emitted.0.len(),
                replay: self.emitted.1.len(),
            },
        })
        .unwrap_or_default()
    }
}

/// sha256 of a tree listing (see [`tree`]).
fn tree_hash(dir: &Path) -> String {
    use sha2::Digest;
    let listing = serde_json::to_vec(&tree(dir)).unwrap_or_default();
    hex::encode(sha2::Sha256::digest(&listing))
}

/// The canonical envelopes a session's receive turns emitted, in order.
fn emitted(turns: &[&EvidenceEntry]) -> Vec<String> {
    turns
        .iter()
        .filter_map(|e| e.receive.as_ref())
        .flat_map(|r| r.emitted.iter())
        .map(|e| String::from_utf8_lossy(&e.to_canonical().unwrap_or_default()).into_owned())
        .collect()
}

const SESSION_DIRS: [&str; 3] = ["planes", "tmp", "output"];

/// Copies `from` into `to` (which exists): directories, regular files and
/// symlinks with their modes and owners; session directories at the top
/// level and anything else (sockets, FIFOs, devices) are left out.
fn copy_tree(from: &Path, to: &Path, top: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let name = e.file_name();
        if top && SESSION_DIRS.iter().any(|d| name == *d) {
            continue;
        }
        let (src, dst) = (e.path(), to.join(&name));
        let m = std::fs::symlink_metadata(&src)?;
        let t = m.file_type();
        if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
            let _ = std::os::unix::fs::lchown(&dst, Some(m.uid()), Some(m.gid()));
            continue;
        } else if t.is_dir() {
            std::fs::create_dir(&dst)?;
            copy_tree(&src, &dst, false)?;
        } else if t.is_file() {
            std::fs::copy(&src, &dst)?;
        } else {
            continue;
        }
        std::os::unix::fs::chown(&dst, Some(m.uid()), Some(m.gid()))?;
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
    }
    Ok(())
}

/// path (relative to `dir`) → kind and sha256, for comparing trees.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap_or(&p).display().to_string();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if m.is_dir() {
                out.insert(rel, "dir".into());
                walk(base, &p, out);
            } else if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p)
                    .map(|t| t.display().to_string())
                    .unwrap_or_default();
                out.insert(rel, format!("symlink -> {t}"));
            } else {
                use sha2::Digest;
                let h = std::fs::read(&p)
                    .map(|b| hex::encode(sha2::Sha256::digest(&b)))
                    .unwrap_or_default();
                use std::os::unix::fs::PermissionsExt;
                out.insert(
                    rel,
                    format!("file {:o} {h}", m.permissions().mode() & 0o777),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The recorded request of a turn, with the original session id turned back
/// into `<session_id>` (so the replayed session's paths follow).
fn request_of(entry: &EvidenceEntry, sid: &str) -> Result<TurnRequest> {
    #[derive(serde::Serialize)]
    struct Doc<'a> {
        command: &'a [String],
        declared_inputs: &'a [String],
        declared_outputs: &'a [DeclaredWrite],
        #[serde(skip_serializing_if = "Option::is_none")]
        work_order_id: &'a Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        idempotency_key: &'a Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_seconds: Option<u64>,
    }
    let doc = serde_json::to_string(&Doc {
        command: entry.command.as_deref().unwrap_or_default(),
        declared_inputs: &entry.declared_reads,
        declared_outputs: &entry.declared_writes,
        work_order_id: &entry.work_order_id,
        idempotency_key: &entry.idempotency_key,
        timeout_seconds: entry.timeout_seconds,
    })
    .map_err(|e| SupervisorError::invalid("--session", e.to_string()))?;
    Ok(TurnRequest::from_json(
        doc.replace(sid, "<session_id>").as_bytes(),
    )?)
}

/// The comparable outcome of one turn, with the session id turned back
/// into `<session_id>`.
#[derive(Debug, PartialEq, Eq, serde::Serialize)]
struct Compared {
    turn_number: u64,
    status: Option<TurnStatus>,
    exit_code: Option<i32>,
    committed: Vec<(String, String)>,
    violations: Vec<(String, String, &'static str)>,
}

fn outcome(entry: &EvidenceEntry, sid: &str) -> Compared {
    let unbind = |s: &str| s.replace(sid, "<session_id>");
    Compared {
        turn_number: entry.turn_number,
        status: entry.status,
        exit_code: entry.exit_code(),
        committed: entry
            .committed
            .iter()
            .map(|c| (unbind(&c.path), c.sha256.clone()))
            .collect(),
        violations: entry
            .violations
            .iter()
            .map(|v| {
                (
                    unbind(&v.attempted_operation),
                    unbind(&v.target),
                    v.layer.as_str(),
                )
            })
            .collect(),
    }
}

fn finished(entries: &[Read<EvidenceEntry>]) -> Vec<&EvidenceEntry> {
    entries
        .iter()
        .map(|e| &e.body)
        .filter(|e| e.event == Event::TurnFinished)
        .collect()
}

/// The evidence entries of `session`, verified and typed.
fn evidence_of(session: &Session) -> Result<(Vec<Value>, Vec<Read<EvidenceEntry>>)> {
    let raw = session.ledger(LedgerKind::Evidence).verified_entries()?;
    let typed = read_all::<EvidenceEntry>(&raw).map_err(|e| {
        SupervisorError::invalid(
            "--session",
            format!("an evidence entry does not read as one: {e}"),
        )
    })?;
    Ok((raw, typed))
}

/// Replays `session` of `root` into `into`.
pub fn replay(
    root: &Path,
    state_dir: &Path,
    session: &SessionId,
    into: &Path,
    cgroup_place: &Place,
    requester: &Owner,
) -> Result<ReplayReport> {
    let mut all = replay_all(
        root,
        state_dir,
        std::slice::from_ref(session),
        into,
        cgroup_place,
        requester,
    )?;
    Ok(all.remove(0))
}

/// Replays several sessions of `root` — the sessions of a chain of agents,
/// say, each fed its recorded input envelopes — into one fresh workspace
/// `into`, in the order given; one report per session. Each session must
/// admit `requester` ([`Session::open_as`]).
pub fn replay_all(
    root: &Path,
    state_dir: &Path,
    sessions: &[SessionId],
    into: &Path,
    cgroup_place: &Place,
    requester: &Owner,
) -> Result<Vec<ReplayReport>> {
    let ws = Workspace::open(root)?;
    let state = StateDir::open(state_dir, &ws, false)?;
    // Every session is readable, the requester's and replayable before
    // anything is made.
    for session in sessions {
        let original = Session::open_as(&ws, &state, session, None, requester)?;
        let (_, typed) = evidence_of(&original)?;
        if let Some(e) = finished(&typed).iter().find(|e| e.command.is_none()) {
            return Err(SupervisorError::invalid(
                "--session",
                format!(
                    "turn {} of {session} was closed by recovery ({}); its request is not recorded, so the session cannot be replayed",
                    e.turn_number,
                    e.status.map_or("unknown", TurnStatus::as_str)
                ),
            ));
        }
    }
    if into.symlink_metadata().is_ok() {
        return Err(SupervisorError::invalid(
            "--into",
            format!(
                "{} exists; replay needs a directory that does not",
                into.display()
            ),
        ));
    }
    use crate::fsx::state_io as io;
    let new_root = into.join("root");
    let new_state = into.join("state");
    std::fs::create_dir_all(&new_root).map_err(io("create replay root", &new_root))?;
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let m = std::fs::metadata(root).map_err(io("read workspace", root))?;
        std::os::unix::fs::chown(&new_root, Some(m.uid()), Some(m.gid()))
            .map_err(io("create replay root", &new_root))?;
        std::fs::set_permissions(
            &new_root,
            std::fs::Permissions::from_mode(m.mode() & 0o7777),
        )
        .map_err(io("create replay root", &new_root))?;
    }
    copy_tree(root, &new_root, true).map_err(io("copy workspace", &new_root))?;
    let new_ws = Workspace::open(&new_root)?;
    let new_st = StateDir::open(&new_state, &new_ws, true)?;
    sessions
        .iter()
        .map(|s| {
            replay_session(
                (&ws, &state, s),
                (&new_ws, &new_st, &new_root, &new_state),
                cgroup_place,
            )
        })
        .collect()
}

/// One session replayed into the prepared workspace.
fn replay_session(
    (ws, state, session): (&Workspace, &StateDir, &SessionId),
    (new_ws, new_st, new_root, new_state): (&Workspace, &StateDir, &Path, &Path),
    cgroup_place: &Place,
) -> Result<ReplayReport> {
    let original = Session::open(ws, state, session, None)?;
    let (evidence, typed) = evidence_of(&original)?;
    let exec = original.ledger(LedgerKind::Exec).verified_entries()?;
    let turns = finished(&typed);
    let src = original
        .deterministic
        .as_ref()
        .map_or_else(Sources::system, |d| d.sources(0));
    let replayed = Session::create(
        new_ws,
        new_st,
        TURN_TIER,
        &SessionIdGenerator::new(src.clone(), src),
        original.deterministic.clone(),
    )?;
    let (osid, rsid) = (session.as_str(), replayed.id.as_str().to_owned());
    for e in &turns {
        // A receive turn gets its recorded input envelope again.
        let receive = e
            .receive
            .as_ref()
            .map(|r| crate::turn::receive::ReceiveInput {
                envelope: r.input.clone(),
                hop: r.hop,
            });
        let opts = crate::turn::RunOptions {
            forward_all_output: false,
            on_durable: None,
            manifest: None,
            root: new_root.to_path_buf(),
            state_dir: new_state.to_path_buf(),
            package: e.package_id.clone().unwrap_or_default(),
            session: Some(rsid.clone()),
            request: request_of(e, osid)?,
            json: true,
            cgroup_place: cgroup_place.clone(),
            sources: Sources::system(),
            // Chosen as the turn's was: its `--backend`, or the trust
            // level's table (entries from before backends were recorded ran
            // natively).
            backend: match (
                receive.as_ref(),
                e.ran().and_then(|x| x.backend_chosen_by.as_deref()),
                e.ran().map(|x| x.backend.as_str()),
            ) {
                // Receive turns run natively.
                (Some(_), _, _) => Some("native".to_owned()),
                (None, Some("--backend"), Some(b)) => Some(b.to_owned()),
                (None, Some(_), _) => None,
                (None, None, b) => Some(b.unwrap_or("native").to_owned()),
            },
            tenant: None,
            pool: None,
            between: None,
            interrupts: crate::turn::interrupt::Interrupts::default(),
            config: PathBuf::from(crate::backend::select::DEFAULT_CONFIG),
            deterministic: None,
            rootfs: None,
            receive,
        };
        crate::turn::run_turn(&opts)?;
    }
    let again = Session::open(new_ws, new_st, &replayed.id, None)?;
    let (r_evidence, r_typed) = evidence_of(&again)?;
    let r_exec = again.ledger(LedgerKind::Exec).verified_entries()?;
    let mut difference = None;
    // Every emitted envelope, byte for byte, first: the most specific.
    let (em_a, em_b) = (emitted(&turns), emitted(&finished(&r_typed)));
    if let Some(i) = (0..em_a.len().max(em_b.len())).find(|&i| em_a.get(i) != em_b.get(i)) {
        difference = Some(format!(
            "emitted envelope {} differs: original {} / replay {}",
            i + 1,
            em_a.get(i).map_or("(none)", String::as_str),
            em_b.get(i).map_or("(none)", String::as_str)
        ));
    }
    if original.deterministic.is_some() && difference.is_none() {
        for (kind, a, b) in [
            ("exec", &exec, &r_exec),
            ("evidence", &evidence, &r_evidence),
        ] {
            if let Some(i) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) {
                difference.get_or_insert(format!(
                    "{kind} ledger entry {} differs: original {} / replay {}",
                    i + 1,
                    a.get(i).map_or("(none)".into(), |v| v.to_string()),
                    b.get(i).map_or("(none)".into(), |v| v.to_string())
                ));
            }
        }
    }
    if difference.is_none() {
        let (a, b) = (finished(&typed), finished(&r_typed));
        for i in 0..a.len().max(b.len()) {
            let (x, y) = (
                a.get(i).map(|e| outcome(e, osid)),
                b.get(i).map(|e| outcome(e, &rsid)),
            );
            if x != y {
                let show = |c: Option<Compared>| {
                    serde_json::to_string(&c).unwrap_or_else(|_| "(unreadable)".into())
                };
                difference = Some(format!(
                    "turn {}: original {} / replay {}",
                    i + 1,
                    show(x),
                    show(y)
                ));
                break;
            }
        }
    }
    if difference.is_none() {
        for (label, a, b) in [
            (
                "output",
                ws.output_dir(session),
                new_ws.output_dir(&replayed.id),
            ),
            (
                "scratch",
                ws.scratch_dir(session),
                new_ws.scratch_dir(&replayed.id),
            ),
        ] {
            let (ta, tb) = (tree(&a), tree(&b));
            if let Some(k) = ta
                .keys()
                .chain(tb.keys())
                .find(|k| ta.get(*k) != tb.get(*k))
            {
                difference = Some(format!(
                    "{label}/<session_id>/{k}: original {} / replay {}",
                    ta.get(k).map_or("(absent)", String::as_str),
                    tb.get(k).map_or("(absent)", String::as_str)
                ));
                break;
            }
        }
    }
    let tree_sha256 = (
        tree_hash(&ws.output_dir(session)),
        tree_hash(&new_ws.output_dir(&replayed.id)),
    );
    if difference.is_none() && tree_sha256.0 != tree_sha256.1 {
        difference = Some(format!(
            "output tree sha256: original {} / replay {}",
            tree_sha256.0, tree_sha256.1
        ));
    }
    Ok(ReplayReport {
        original: osid.to_owned(),
        replayed: rsid,
        root: new_root.to_path_buf(),
        turns: turns.len(),
        difference,
        tree_sha256,
        emitted: (em_a, em_b),
    })
}
