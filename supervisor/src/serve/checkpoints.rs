//! The daemon's signed checkpoints (issue 30): with `--checkpoint-key`,
//! `serve` signs a checkpoint of a session (as `supervise ledger
//! checkpoint` does, witnesses' inboxes included) every
//! `--checkpoint-every-turns` turns of it, and `--checkpoint-every-seconds`
//! after its last one when it has had turns since; at a clean stop, every
//! session with turns not yet covered gets one.
//!
//! One thread does the signing, so a turn's reply never waits for it; it
//! takes the session's lock like a turn, so a checkpoint always covers
//! whole turns. A failure is logged and kept for `health` (DEGRADED): the
//! turns it would have covered are still in the ledgers, and the next
//! checkpoint covers them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use turnstile_policy::SessionId;

use crate::error::{Result, SupervisorError};
use crate::store::layout::{StateDir, Workspace};
use crate::store::session::Session;
use crate::store::transparency as tp;

/// When and with what `serve` signs checkpoints.
#[derive(Debug, Clone)]
pub struct Policy {
    pub key: PathBuf,
    pub every_turns: Option<u64>,
    pub every: Option<Duration>,
    pub witnesses: Vec<PathBuf>,
}

/// What the checkpoint thread has done, for `health` and the logs.
#[derive(Debug, Default, Clone)]
pub struct Status {
    pub taken: u64,
    pub failed: u64,
    /// The last failure, until a later checkpoint of that session succeeds.
    pub last_error: Option<String>,
}

#[derive(Debug)]
enum Msg {
    Turn { root: PathBuf, session: String },
}

/// The checkpoint thread's handle.
#[derive(Debug)]
pub struct Checkpointer {
    tx: Mutex<Option<Sender<Msg>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub status: Arc<Mutex<Status>>,
}

struct Pending {
    root: PathBuf,
    turns: u64,
    since: Instant,
}

impl Checkpointer {
    /// Loads the key (a bad one refuses the daemon's start) and starts the
    /// thread.
    pub fn start(
        policy: Policy,
        state_dir: PathBuf,
        metrics: Arc<super::metrics::Metrics>,
    ) -> Result<Self> {
        if policy.every_turns == Some(0) {
            return Err(SupervisorError::invalid(
                "--checkpoint-every-turns",
                "must be at least 1",
            ));
        }
        if policy.every == Some(Duration::ZERO) {
            return Err(SupervisorError::invalid(
                "--checkpoint-every-seconds",
                "must be at least 1",
            ));
        }
        let key = tp::load_signing_key(&policy.key)?;
        let (tx, rx) = std::sync::mpsc::channel();
        let status = Arc::new(Mutex::new(Status::default()));
        let st = Arc::clone(&status);
        let thread = std::thread::Builder::new()
            .name("checkpoints".into())
            .spawn(move || run(&rx, &policy, &key, &state_dir, &st, &metrics))
            .map_err(|source| SupervisorError::StateIo {
                op: "spawn the checkpoint thread",
                path: PathBuf::from("/proc/self"),
                source,
            })?;
        Ok(Self {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            status,
        })
    }

    /// A turn of `session` under `root` finished.
    pub fn turn_done(&self, root: &Path, session: &str) {
        if let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = tx.send(Msg::Turn {
                root: root.to_path_buf(),
                session: session.to_owned(),
            });
        }
    }

    /// Seals every session with uncovered turns and stops the thread.
    pub fn stop(&self) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

fn run(
    rx: &Receiver<Msg>,
    policy: &Policy,
    key: &tp::SigningKeyFile,
    state_dir: &Path,
    status: &Mutex<Status>,
    metrics: &super::metrics::Metrics,
) {
    let mut pending: HashMap<String, Pending> = HashMap::new();
    let tick = policy
        .every
        .map_or(Duration::from_secs(1), |e| e.min(Duration::from_secs(1)));
    loop {
        let closed = match rx.recv_timeout(tick) {
            Ok(Msg::Turn { root, session }) => {
                let p = pending.entry(session).or_insert_with(|| Pending {
                    root: root.clone(),
                    turns: 0,
                    since: Instant::now(),
                });
                p.root = root;
                p.turns += 1;
                false
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => true,
        };
        let due: Vec<String> = pending
            .iter()
            .filter(|(_, p)| {
                p.turns > 0
                    && (closed
                        || policy.every_turns.is_some_and(|n| p.turns >= n)
                        || policy.every.is_some_and(|t| p.since.elapsed() >= t))
            })
            .map(|(s, _)| s.clone())
            .collect();
        for sid in due {
            let Some(p) = pending.get_mut(&sid) else {
                continue;
            };
            let t0 = Instant::now();
            let result = take(&p.root, state_dir, &sid, key, &policy.witnesses);
            metrics.record_checkpoint(result.is_ok(), t0.elapsed().as_secs_f64());
            let mut st = status.lock().unwrap_or_else(|e| e.into_inner());
            match result {
                Ok(taken) => {
                    st.taken += 1;
                    st.last_error = None;
                    tracing::info!(
                        session_id = %sid,
                        tree_size = taken.head.size,
                        checkpoint = %taken.path.display(),
                        witnesses = taken.witness_copies.len(),
                        "checkpoint signed"
                    );
                    p.turns = 0;
                    p.since = Instant::now();
                }
                Err(e) => {
                    st.failed += 1;
                    st.last_error = Some(format!("session {sid}: {e}"));
                    tracing::warn!(session_id = %sid, error = %e, "checkpoint failed");
                    // Retried at the next period (not at every tick).
                    p.since = Instant::now();
                }
            }
        }
        if closed {
            return;
        }
    }
}

fn take(
    root: &Path,
    state_dir: &Path,
    sid: &str,
    key: &tp::SigningKeyFile,
    witnesses: &[PathBuf],
) -> Result<tp::Taken> {
    let id = SessionId::parse(sid)?;
    let ws = Workspace::open(root)?;
    let state = StateDir::open(state_dir, &ws, false)?;
    let session = Session::open(&ws, &state, &id, None)?;
    let _lock = session.lock()?;
    tp::take(&session, key, witnesses)
}
