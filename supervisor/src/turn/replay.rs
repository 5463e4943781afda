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

use serde_json::{Value, json};
use turnstile_policy::SessionId;
use turnstile_policy::request::TurnRequest;
use turnstile_policy::session::SessionIdGenerator;

use crate::error::{Result, SupervisorError};
use crate::ids::Sources;
use crate::store::layout::{StateDir, TURN_TIER, Workspace};
use crate::store::ledger::LedgerKind;
use crate::store::session::Session;

/// What `replay` found.
#[derive(Debug)]
pub struct ReplayReport {
    pub original: String,
    pub replayed: String,
    pub root: PathBuf,
    pub turns: usize,
    /// The first difference, or `None` when the replay is identical.
    pub difference: Option<String>,
}

impl ReplayReport {
    pub fn to_value(&self) -> Value {
        json!({"session_id": self.original, "replayed_session_id": self.replayed,
            "root": self.root, "turns": self.turns, "identical": self.difference.is_none(),
            "first_difference": self.difference})
    }
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
fn request_of(entry: &Value, sid: &str) -> Result<TurnRequest> {
    let unbind = |v: &Value| -> Value {
        serde_json::from_str(&v.to_string().replace(sid, "<session_id>")).unwrap_or(Value::Null)
    };
    let mut doc = json!({
        "command": unbind(&entry["command"]),
        "declared_inputs": unbind(&entry["declared_reads"]),
        "declared_outputs": unbind(&entry["declared_writes"]),
    });
    for k in ["work_order_id", "idempotency_key", "timeout_seconds"] {
        if !entry[k].is_null() {
            doc[k] = entry[k].clone();
        }
    }
    Ok(TurnRequest::from_json(doc.to_string().as_bytes())?)
}

/// The comparable outcome of one turn (session id replaced).
fn outcome(entry: &Value, sid: &str) -> Value {
    let v = json!({
        "turn_number": entry["turn_number"],
        "status": entry["status"],
        "exit_code": entry["exit_code"],
        "committed": entry["committed"].as_array().map(|c| c.iter().map(|x| json!({"path": x["path"], "sha256": x["sha256"]})).collect::<Vec<_>>()),
        "violations": entry["violations"].as_array().map(|c| c.iter().map(|x| json!({"op": x["attempted_operation"], "target": x["target"], "layer": x["layer"]})).collect::<Vec<_>>()),
    });
    serde_json::from_str(&v.to_string().replace(sid, "<session_id>")).unwrap_or(v)
}

fn finished(entries: &[Value]) -> Vec<&Value> {
    entries
        .iter()
        .filter(|e| e["event"] == "turn.finished")
        .collect()
}

/// Replays `session` of `root` into `into`.
pub fn replay(
    root: &Path,
    state_dir: &Path,
    session: &SessionId,
    into: &Path,
    cgroup_root: &Path,
) -> Result<ReplayReport> {
    let ws = Workspace::open(root)?;
    let state = StateDir::open(state_dir, &ws, false)?;
    let original = Session::open(&ws, &state, session, None)?;
    let evidence = original.ledger(LedgerKind::Evidence).verified_entries()?;
    let exec = original.ledger(LedgerKind::Exec).verified_entries()?;
    let turns = finished(&evidence);
    if let Some(e) = turns.iter().find(|e| e["command"].is_null()) {
        return Err(SupervisorError::invalid(
            "--session",
            format!(
                "turn {} was closed by recovery ({}); its request is not recorded, so the session cannot be replayed",
                e["turn_number"], e["status"]
            ),
        ));
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
    let src = original
        .deterministic
        .as_ref()
        .map_or_else(Sources::system, |d| d.sources(0));
    let replayed = Session::create(
        &new_ws,
        &new_st,
        TURN_TIER,
        &SessionIdGenerator::new(src.clone(), src),
        original.deterministic.clone(),
    )?;
    let (osid, rsid) = (session.as_str(), replayed.id.as_str().to_owned());
    for e in &turns {
        let opts = crate::turn::RunOptions {
            root: new_root.clone(),
            state_dir: new_state.clone(),
            package: e["package_id"].as_str().unwrap_or_default().to_owned(),
            session: Some(rsid.clone()),
            request: request_of(e, osid)?,
            json: true,
            cgroup_root: cgroup_root.to_path_buf(),
            sources: Sources::system(),
            // Chosen as the turn's was: its `--backend`, or the trust
            // level's table (entries from before backends were recorded ran
            // natively).
            backend: match (
                e["enforcement"]["backend_chosen_by"].as_str(),
                e["enforcement"]["backend"].as_str(),
            ) {
                (Some("--backend"), Some(b)) => Some(b.to_owned()),
                (Some(_), _) => None,
                (None, b) => Some(b.unwrap_or("native").to_owned()),
            },
            tenant: None,
            config: PathBuf::from(crate::backend::select::DEFAULT_CONFIG),
            deterministic: None,
            rootfs: None,
        };
        crate::turn::run_turn(&opts)?;
    }
    let again = Session::open(&new_ws, &new_st, &replayed.id, None)?;
    let r_evidence = again.ledger(LedgerKind::Evidence).verified_entries()?;
    let r_exec = again.ledger(LedgerKind::Exec).verified_entries()?;
    let mut difference = None;
    if original.deterministic.is_some() {
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
        let (a, b) = (finished(&evidence), finished(&r_evidence));
        for i in 0..a.len().max(b.len()) {
            let (x, y) = (
                a.get(i).map(|e| outcome(e, osid)),
                b.get(i).map(|e| outcome(e, &rsid)),
            );
            if x != y {
                difference = Some(format!(
                    "turn {}: original {} / replay {}",
                    i + 1,
                    x.unwrap_or(Value::Null),
                    y.unwrap_or(Value::Null)
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
    Ok(ReplayReport {
        original: osid.to_owned(),
        replayed: rsid,
        root: new_root,
        turns: turns.len(),
        difference,
    })
}
