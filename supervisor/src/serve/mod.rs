//! `supervise serve`: a long-lived supervisor that takes turn requests over
//! a unix socket (see [`wire`] for the protocol), and — with `--bus` — from
//! a file bus (seed 003).
//!
//! It owns the socket, the peer check, recovery at start, the in-flight
//! turn table, shutdown and the daemon's metrics. It never runs a turn in
//! its own process: every turn runs in a re-executed worker ([`worker`]
//! says why), so a turn through the daemon is a `supervise run` in
//! everything but how its request arrived.

pub mod bus;
pub mod checkpoints;
pub mod client;
pub mod config;
pub mod eventbus;
pub mod health;
pub mod lifecycle;
pub mod metrics;
pub mod router;
pub mod wire;
pub mod worker;

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, kill, sigaction};
use nix::unistd::Pid;
use serde_json::Value;

use crate::error::{Result, SupervisorError, exit};
use crate::turn::outcome::Outcome;
use wire::{Reply, Request, RunRequest};

/// What `supervise serve` was asked.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub state_dir: PathBuf,
    pub socket: Option<PathBuf>,
    pub bus: Option<PathBuf>,
    pub metrics: Option<std::net::SocketAddr>,
    pub dry_run: bool,
    pub max_turns: usize,
    /// Sessions whose worker stays between turns with a warm sandbox.
    pub pool_size: usize,
    /// Idle time after which such a worker (and its sandbox) goes.
    pub pool_idle: Duration,
    /// Signed checkpoints of the sessions served (issue 30).
    pub checkpoints: Option<checkpoints::Policy>,
    /// `--daemon-config`: subscriptions, approvers, the bus's role.
    pub config: config::DaemonConfig,
}

static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
static STOP_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_stop(signal: nix::libc::c_int) {
    STOP_SIGNAL.store(signal, Ordering::SeqCst);
    let fd = STOP_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let b = [1u8];
        // SAFETY: write(2) is async-signal-safe; `b` is a valid one-byte
        // buffer; `fd` is the self-pipe's write end, never closed.
        let _ = unsafe { nix::libc::write(fd, b.as_ptr().cast(), 1) };
    }
}

/// The daemon's shared state.
#[derive(Debug)]
pub struct Daemon {
    pub state_dir: PathBuf,
    /// Routes receives' envelopes to subscribed packages (issue 28).
    pub(crate) router: Option<Arc<router::Router>>,
    pub socket: Option<PathBuf>,
    pub started: Instant,
    /// Worker pids of the turns in flight, by connection number.
    in_flight: Mutex<HashMap<u64, Pid>>,
    pub(crate) next_conn: AtomicU64,
    pub turns_served: AtomicU64,
    pub stopping: AtomicBool,
    /// What recovery at start did.
    pub recovered: Mutex<Value>,
    pub metrics: Arc<metrics::Metrics>,
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The bus's last pass: its directory and the messages held.
    pub bus_status: Mutex<Value>,
    /// The bus's directory, when the daemon serves one.
    pub bus_dir: Option<PathBuf>,
    uid: u32,
    max_turns: usize,
    /// Workers kept between turns, one per session, each with the warm
    /// sandbox of that session's next turn (see [`crate::sandbox::pool`]).
    idle: Mutex<HashMap<String, Worker>>,
    /// Threads reaping dismissed workers.
    reapers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pool_size: usize,
    pool_idle: Duration,
    /// Starts workers from one long-lived thread: a worker dies with the
    /// thread that started it (PDEATHSIG), which must be the daemon's life.
    spawner: Mutex<std::sync::mpsc::Sender<std::sync::mpsc::SyncSender<std::io::Result<Worker>>>>,
    /// Signs checkpoints of the sessions served (`--checkpoint-key`).
    checkpoints: Option<checkpoints::Checkpointer>,
    /// `suspend_idle_after_seconds` (issue 28): a waiting worker's warm
    /// sandbox is frozen after this long.
    suspend_idle: Option<Duration>,
    /// The turns in flight, by connection number: their session and
    /// trust level (`agent_runtime_active_agents`).
    running: Mutex<HashMap<u64, lifecycle::Agent>>,
    /// Sessions whose running turn a `suspend` froze.
    suspended: Mutex<std::collections::HashSet<String>>,
    /// The hop of each session's last receive: its lifecycle envelopes are
    /// published at it, so a subscription to `agent.*` cannot loop forever.
    hops: Mutex<HashMap<String, u32>>,
    /// Numbers the lifecycle envelopes.
    lifecycle_seq: AtomicU64,
    /// The sessions served, newest first (health verifies their ledgers).
    served: Mutex<Vec<(String, PathBuf)>>,
    /// What the health check last verified of the served ledgers.
    verified: Mutex<health::VerifiedLedgers>,
}

/// A turn worker: its process and the daemon's end of its control socket.
#[derive(Debug)]
pub(crate) struct Worker {
    child: std::process::Child,
    pid: Pid,
    ctl: UnixStream,
    since: Instant,
    /// Its warm sandbox was frozen (`suspend`, or idle too long).
    suspended: bool,
    /// The package and trust level of its session's last turn.
    package: Option<String>,
    trust_level: Option<String>,
}

impl Worker {
    /// Starts `supervise __serve-worker` (stdout /dev/null and stderr the
    /// daemon's log between turns); it dies with the calling thread.
    fn start() -> std::io::Result<Self> {
        let (ours, theirs) = UnixStream::pair()?;
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg(worker::SERVE_WORKER)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null());
        // SAFETY: prctl(2) is async-signal-safe and allocates nothing; the
        // closure touches no locks or heap. PDEATHSIG fires when the
        // spawning thread ends: the daemon's spawner thread, which lives as
        // long as the daemon, so only the daemon's death (kill -9) triggers
        // it — the worker dies with it, as a `supervise run` killed
        // outright, and recovery settles its turn and warm sandbox.
        unsafe {
            cmd.pre_exec(|| {
                if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        Ok(Self {
            pid: Pid::from_raw(child.id() as i32),
            child,
            ctl: ours,
            since: Instant::now(),
            suspended: false,
            package: None,
            trust_level: None,
        })
    }

    /// Lets the worker go (EOF on its socket: it discards its warm sandbox
    /// and exits) and waits for it; returns how it ended.
    fn close(self) -> std::io::Result<std::process::ExitStatus> {
        let Self { mut child, ctl, .. } = self;
        drop(ctl);
        child.wait()
    }

    /// Lets the worker go, as [`Worker::close`], but reaps it off the
    /// caller's path; the daemon waits for
    /// every such reaper before it exits, so no worker is cut short.
    fn dismiss(self, d: &Daemon) {
        let reaper = std::thread::Builder::new()
            .name("reap-worker".into())
            .spawn(move || {
                let _ = self.close();
            });
        if let (Ok(t), Ok(mut all)) = (reaper, d.reapers.lock()) {
            all.retain(|t| !t.is_finished());
            all.push(t);
        }
    }
}

impl Daemon {
    fn track(&self, conn: u64, pid: Option<Pid>) {
        if let Ok(mut m) = self.in_flight.lock() {
            match pid {
                Some(p) => {
                    m.insert(conn, p);
                }
                None => {
                    m.remove(&conn);
                }
            }
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Sessions with a worker (and its warm sandbox) waiting.
    pub fn warm_pool_size(&self) -> usize {
        self.idle.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// A worker for a turn of `session`: the one waiting for it, or a new
    /// one (from the spawner thread).
    fn worker_for(&self, session: Option<&str>) -> Result<Worker> {
        let waiting = session.and_then(|s| Some((s, self.idle.lock().ok()?.remove(s)?)));
        if let Some((s, w)) = waiting {
            self.metrics
                .warm_pool_size
                .set(self.warm_pool_size() as i64);
            // A suspended session resumes for its turn (or the turn fails,
            // E2024).
            return self.wake(s, w);
        }
        let io = |e: std::io::Error| state_io("spawn turn worker", Path::new("/proc/self/exe"))(e);
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.spawner
            .lock()
            .map_err(|_| io(std::io::Error::other("spawner lock poisoned")))?
            .send(tx)
            .map_err(|_| io(std::io::Error::other("the spawner thread is gone")))?;
        rx.recv()
            .map_err(|_| io(std::io::Error::other("the spawner thread is gone")))?
            .map_err(io)
    }

    /// Tells the session's waiting worker `pid` that its last reply was
    /// delivered ([`worker::DELIVERED`]). Under the lock of the waiting
    /// workers: no job is sent to it meanwhile. A worker taken since (its
    /// next turn began) or gone is not told.
    fn delivered(&self, session: &str, pid: Pid) {
        let Ok(idle) = self.idle.lock() else {
            return;
        };
        if let Some(w) = idle.get(session).filter(|w| w.pid == pid) {
            let mut line = worker::DELIVERED.to_vec();
            line.push(b'\n');
            let _ = (&w.ctl).write_all(&line);
        }
    }

    /// Keeps `w` for the session's next turn (within --pool-size; the
    /// longest idle one makes room), or lets it go: whether it was kept.
    fn keep(&self, session: &str, mut w: Worker) -> bool {
        if self.pool_size == 0 || self.stopping.load(Ordering::SeqCst) {
            w.dismiss(self);
            return false;
        }
        w.since = Instant::now();
        let Ok(mut idle) = self.idle.lock() else {
            w.dismiss(self);
            return false;
        };
        if let Some(old) = idle.insert(session.to_owned(), w) {
            old.dismiss(self);
        }
        while idle.len() > self.pool_size {
            let oldest = idle
                .iter()
                .min_by_key(|(_, w)| w.since)
                .map(|(k, _)| k.clone());
            match oldest.and_then(|k| idle.remove(&k)) {
                Some(o) => o.dismiss(self),
                None => break,
            }
        }
        self.metrics.warm_pool_size.set(idle.len() as i64);
        drop(idle);
        self.refresh_active();
        // The newest is never the one that made room.
        true
    }

    /// Lets go of workers idle longer than --pool-idle-seconds (all of
    /// them with `all`).
    fn expire_idle(&self, all: bool) {
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        let expired: Vec<String> = idle
            .iter()
            .filter(|(_, w)| all || w.since.elapsed() >= self.pool_idle)
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            if let Some(w) = idle.remove(&k) {
                w.dismiss(self);
            }
        }
        self.metrics.warm_pool_size.set(idle.len() as i64);
        drop(idle);
        self.refresh_active();
    }

    fn signal_all(&self, sig: Signal) {
        if let Ok(m) = self.in_flight.lock() {
            for pid in m.values() {
                let _ = kill(*pid, sig);
            }
        }
    }

    /// The daemon's health: READY while it accepts turns.
    pub fn health(&self) -> DaemonHealth {
        let stopping = self.stopping.load(Ordering::SeqCst);
        let cgroup_root = crate::sandbox::cgroup::root();
        let checks = health::checks(&health::Deps {
            state_dir: &self.state_dir,
            socket: self.socket.as_deref(),
            bus_dir: self.bus_dir.as_deref(),
            metrics: self.metrics_addr,
            cgroup_root: &cgroup_root,
        });
        let mut checks = checks;
        let (dead, waiting) = self.idle.lock().map_or((Vec::new(), 0), |mut idle| {
            let n = idle.len();
            let dead = idle
                .iter_mut()
                .filter_map(|(s, w)| {
                    (!matches!(w.child.try_wait(), Ok(None)))
                        .then(|| (s.clone(), w.pid.as_raw() as u32))
                })
                .collect();
            (dead, n)
        });
        checks.push(health::pool(&dead, waiting));
        let served = self.served.lock().map(|s| s.clone()).unwrap_or_default();
        checks.push(health::ledgers(&self.state_dir, &served, &self.verified));
        checks.push(health::observer());
        checks.push(health::network());
        if let Some(c) = &self.checkpoints {
            let st = c.status.lock().map(|s| s.clone()).unwrap_or_default();
            checks.push(match st.last_error {
                Some(e) => health::Check::degraded(
                    "checkpoints",
                    format!(
                        "the last checkpoint failed ({} failed, {} signed): {e}",
                        st.failed, st.taken
                    ),
                ),
                None => health::Check::ok("checkpoints", format!("{} signed", st.taken)),
            });
        }
        let mut reasons: Vec<String> = checks
            .iter()
            .filter(|c| c.level != health::Level::Ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect();
        if stopping {
            reasons.push("stopping: no new turns are accepted".into());
        }
        DaemonHealth {
            status: health::status(&checks, stopping).into(),
            reasons,
            checks,
            daemon: DaemonState {
                pid: std::process::id(),
                version: wire::BINARY_VERSION.into(),
                protocol: wire::PROTOCOL_VERSION,
                uptime_seconds: self.started.elapsed().as_secs_f64(),
                state_dir: self.state_dir.clone(),
                socket: self.socket.clone(),
                turns_in_flight: self.in_flight() as u64,
                turns_served: self.turns_served.load(Ordering::SeqCst),
                recovered_at_start: self
                    .recovered
                    .lock()
                    .map(|v| v.clone())
                    .unwrap_or(Value::Null),
                metrics: self.metrics_addr.map(|a| a.to_string()),
                warm_pool_size: self.warm_pool_size() as u64,
                bus: self
                    .bus_status
                    .lock()
                    .map(|v| v.clone())
                    .unwrap_or(Value::Null),
            },
        }
    }
}

/// Accepts every pending connection, each onto a thread of its own.
fn accept_all(
    daemon: &Arc<Daemon>,
    l: &UnixListener,
    threads: &mut Vec<crate::syncpool::Task<()>>,
    state_dir: &Path,
) -> Result<()> {
    loop {
        match l.accept() {
            Ok((conn, _)) => {
                let d = Arc::clone(daemon);
                let n = d.next_conn.fetch_add(1, Ordering::SeqCst);
                // On a parked thread: no thread made on the turn's path.
                let t = crate::syncpool::try_spawn(&format!("conn-{n}"), move || {
                    connection(&d, n, conn)
                })
                .map_err(state_io("spawn connection thread", state_dir))?;
                threads.push(t);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                return Ok(());
            }
        }
    }
}

fn state_io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SupervisorError {
    let path = path.to_path_buf();
    move |source| SupervisorError::StateIo { op, path, source }
}

/// Binds the socket 0600, owned by this process's uid; refuses a path that
/// is not a socket or where a daemon already listens.
fn bind(path: &Path) -> Result<UnixListener> {
    if let Ok(meta) = path.symlink_metadata() {
        if !meta.file_type().is_socket() {
            return Err(SupervisorError::invalid(
                "--socket",
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(SupervisorError::invalid(
                "--socket",
                format!("a daemon already listens on {}", path.display()),
            ));
        }
        std::fs::remove_file(path).map_err(state_io("remove stale socket", path))?;
    }
    // The socket is never reachable by others, not even between bind and
    // chmod: bind under a 0177 umask (single-threaded here).
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let listener = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = listener.map_err(state_io("bind socket", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(state_io("chmod socket", path))?;
    listener
        .set_nonblocking(true)
        .map_err(state_io("set socket non-blocking", path))?;
    Ok(listener)
}

/// `supervise serve`: runs until SIGTERM/SIGINT/SIGHUP.
pub fn serve(o: &ServeOptions) -> Result<Outcome> {
    if !o.state_dir.is_absolute() {
        return Err(SupervisorError::invalid(
            "--state-dir",
            format!("{} must be an absolute path", o.state_dir.display()),
        ));
    }
    if o.socket.is_none() && o.bus.is_none() {
        return Err(SupervisorError::invalid(
            "--socket",
            "give --socket PATH, --bus DIR, or both",
        ));
    }
    std::fs::create_dir_all(&o.state_dir).map_err(state_io("create state dir", &o.state_dir))?;
    let state_dir =
        std::fs::canonicalize(&o.state_dir).map_err(state_io("resolve state dir", &o.state_dir))?;
    // Stop signals: a self-pipe the main loop polls.
    let (stop_read, stop_write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .map_err(|e| state_io("create pipe", &state_dir)(e.into()))?;
    STOP_FD.store(stop_write.as_raw_fd(), Ordering::SeqCst);
    std::mem::forget(stop_write);
    let action = SigAction::new(
        SigHandler::Handler(on_stop),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: the handler does only an atomic store and write(2).
        unsafe { sigaction(s, &action) }
            .map_err(|e| state_io("install signal handlers", &state_dir)(e.into()))?;
    }
    // A bad rules file refuses to start (TS1036), before anything listens.
    let bus = o
        .bus
        .as_deref()
        .map(|b| bus::Bus::open(b, o.dry_run).map(|b| b.with_policy(&o.config)))
        .transpose()?;
    if let Some(b) = &bus {
        // Said at start: what the bus enforces.
        tracing::info!(policy = %b.policy_statement(), "bus policy");
    }
    // Every session is recovered before the first turn (what a stopped
    // supervisor or daemon left: unfinished turns, mounts, cgroups).
    let all = crate::recover::recover_all(
        &crate::store::layout::StateDir::at(&state_dir),
        None,
        crate::recover::Busy::Wait,
        &crate::sandbox::cgroup::Place::host(),
        &crate::ids::SystemClock,
    )?;
    let recovered = serde_json::to_value(RecoveredAtStart {
        sessions_checked: all.sessions.len(),
        unfinished_creations_removed: all.swept,
        dead_warm_cgroups_removed: all.dead_warm_cgroups,
        recovered: all
            .sessions
            .iter()
            .filter(|r| !r.is_empty())
            .map(|r| r.to_value())
            .collect(),
        failed: all.failed.iter().map(|f| f.to_value()).collect(),
    })
    .unwrap_or_default();
    // A session that cannot be recovered does not keep the daemon from
    // serving the others: it is logged here, and its own turns are refused
    // with the error (each turn recovers its session first).
    if all.failed.is_empty() {
        tracing::info!(state_dir = %state_dir.display(), recovered = %recovered, "recovered every session");
    } else {
        tracing::error!(state_dir = %state_dir.display(), recovered = %recovered, "recovered every session but those under `failed`");
    }
    // Subscriptions' sessions exist before anything is routed.
    let router = router::Router::open(&state_dir, &o.config)?.map(Arc::new);
    let metrics = Arc::new(metrics::Metrics::new());
    let metrics_addr = match o.metrics {
        Some(addr) => Some(
            metrics::serve_http(addr, Arc::clone(&metrics)).map_err(|e| {
                SupervisorError::invalid("--metrics", format!("cannot listen on {addr}: {e}"))
            })?,
        ),
        None => None,
    };
    // A bad checkpoint key refuses the start, like a bad rules file.
    let checkpointer = o
        .checkpoints
        .clone()
        .map(|p| checkpoints::Checkpointer::start(p, state_dir.clone(), Arc::clone(&metrics)))
        .transpose()?;
    // The socket last: nothing below can fail once it exists.
    let listener = o.socket.as_deref().map(bind).transpose()?;
    let (spawn_tx, spawn_rx) =
        std::sync::mpsc::channel::<std::sync::mpsc::SyncSender<std::io::Result<Worker>>>();
    let spawner = std::thread::Builder::new()
        .name("spawner".into())
        .spawn(move || {
            for reply in spawn_rx {
                let _ = reply.send(Worker::start());
            }
        })
        .map_err(state_io("spawn the worker spawner thread", &state_dir))?;
    let daemon = Arc::new(Daemon {
        router: router.clone(),
        idle: Mutex::new(HashMap::new()),
        reapers: Mutex::new(Vec::new()),
        pool_size: o.pool_size,
        pool_idle: o.pool_idle,
        spawner: Mutex::new(spawn_tx),
        bus_status: Mutex::new(Value::Null),
        bus_dir: bus.as_ref().map(|b| b.dir.clone()),
        metrics,
        metrics_addr,
        state_dir: state_dir.clone(),
        socket: o.socket.clone(),
        started: Instant::now(),
        in_flight: Mutex::new(HashMap::new()),
        next_conn: AtomicU64::new(1),
        turns_served: AtomicU64::new(0),
        stopping: AtomicBool::new(false),
        recovered: Mutex::new(recovered),
        uid: nix::unistd::geteuid().as_raw(),
        max_turns: o.max_turns.max(1),
        checkpoints: checkpointer,
        suspend_idle: o.config.suspend_idle_after_seconds.map(Duration::from_secs),
        running: Mutex::new(HashMap::new()),
        suspended: Mutex::new(std::collections::HashSet::new()),
        hops: Mutex::new(HashMap::new()),
        lifecycle_seq: AtomicU64::new(0),
        served: Mutex::new(Vec::new()),
        verified: Mutex::new(health::VerifiedLedgers::new()),
    });
    tracing::info!(socket = ?o.socket, pid = std::process::id(), "serving");
    let mut threads: Vec<crate::syncpool::Task<()>> = Vec::new();
    let bus_thread = match bus {
        Some(b) => {
            let d = Arc::clone(&daemon);
            Some(
                std::thread::Builder::new()
                    .name("bus".into())
                    .spawn(move || b.run(&d))
                    .map_err(state_io("spawn bus thread", &state_dir))?,
            )
        }
        None => None,
    };
    let router_thread = match router {
        Some(r) => {
            let d = Arc::clone(&daemon);
            Some(
                std::thread::Builder::new()
                    .name("router".into())
                    .spawn(move || r.run(&d))
                    .map_err(state_io("spawn router thread", &state_dir))?,
            )
        }
        None => None,
    };
    loop {
        let mut fds = vec![PollFd::new(stop_read.as_fd(), PollFlags::POLLIN)];
        if let Some(l) = &listener {
            fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::from(1000u16)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(state_io("poll", &state_dir)(e.into())),
        }
        if STOP_SIGNAL.load(Ordering::SeqCst) != 0 {
            break;
        }
        // A connection first: the housekeeping below is not its client's
        // wait (each connection runs on a thread of its own).
        if let Some(l) = &listener {
            accept_all(&daemon, l, &mut threads, &state_dir)?;
        }
        threads.retain_mut(|t| !t.is_finished());
        daemon.expire_idle(false);
        daemon.suspend_idle();
    }
    // Stop: no new connections; in-flight turns are interrupted (recorded
    // as `interrupted`, TS1024) and waited for; nothing survives.
    let sig = STOP_SIGNAL.load(Ordering::SeqCst);
    daemon.stopping.store(true, Ordering::SeqCst);
    drop(listener);
    if let Some(p) = &o.socket {
        let _ = std::fs::remove_file(p);
    }
    let interrupted = daemon.in_flight();
    let deadline = Instant::now() + Duration::from_secs(30);
    while daemon.in_flight() > 0 && Instant::now() < deadline {
        daemon.signal_all(Signal::SIGTERM);
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon.signal_all(Signal::SIGKILL);
    for t in threads {
        let _ = t.join();
    }
    for t in bus_thread.into_iter().chain(router_thread) {
        let _ = t.join();
    }
    // Waiting workers discard their warm sandboxes and exit.
    let waiting: Vec<Worker> = daemon
        .idle
        .lock()
        .map(|mut m| m.drain().map(|(_, w)| w).collect())
        .unwrap_or_default();
    for w in waiting {
        w.dismiss(&daemon);
    }
    let reapers: Vec<_> = daemon
        .reapers
        .lock()
        .map(|mut r| r.drain(..).collect())
        .unwrap_or_default();
    for t in reapers {
        let _ = t.join();
    }
    // Every session with turns not yet covered gets its checkpoint.
    if let Some(c) = &daemon.checkpoints {
        c.stop();
    }
    // The spawner thread ends with the process (it waits on a channel the
    // daemon's state holds).
    drop(spawner);
    tracing::info!(signal = sig, interrupted, "stopped");
    Ok(Outcome {
        status: exit::OK,
        stdout: String::new(),
        // The daemon's stderr carries JSON log lines only ("stopped" above).
        stderr: String::new(),
    })
}

/// Sends `r`, stamped with what every reply says about the daemon: its
/// protocol and binary versions and its state directory.
fn send_reply(d: &Daemon, conn: &UnixStream, r: &Reply) {
    let stamped = Reply {
        protocol: wire::PROTOCOL_VERSION,
        daemon_version: wire::BINARY_VERSION.into(),
        state_dir: Some(d.state_dir.clone()),
        ..r.clone()
    };
    let mut line = serde_json::to_vec(&stamped).unwrap_or_default();
    line.push(b'\n');
    let _ = (&*conn).write_all(&line);
}

/// `health --server`'s answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DaemonHealth {
    pub status: String,
    pub reasons: Vec<String>,
    /// Every dependency looked at, with its level and why.
    #[serde(default)]
    pub checks: Vec<health::Check>,
    pub daemon: DaemonState,
}

/// The daemon's own state, in its health.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DaemonState {
    pub pid: u32,
    /// The daemon's `supervise` version and wire protocol version.
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub protocol: u32,
    pub uptime_seconds: f64,
    pub state_dir: PathBuf,
    pub socket: Option<PathBuf>,
    pub turns_in_flight: u64,
    pub turns_served: u64,
    pub recovered_at_start: Value,
    pub metrics: Option<String>,
    pub warm_pool_size: u64,
    pub bus: Value,
}

/// What recovery at start found.
#[derive(Debug, serde::Serialize)]
struct RecoveredAtStart {
    sessions_checked: usize,
    unfinished_creations_removed: Vec<String>,
    dead_warm_cgroups_removed: Vec<String>,
    recovered: Vec<Value>,
    failed: Vec<Value>,
}

fn error_reply(e: &SupervisorError, json: bool) -> Reply {
    let o = crate::turn::outcome::error_outcome(e, json);
    Reply {
        exit_status: o.status,
        printed: false,
        stdout: o.stdout,
        stderr: o.stderr,
        value: crate::turn::outcome::ErrorReply::of(e).to_value(),
        trust_level: None,
        stays: false,
        ..Reply::default()
    }
}

/// One connection: peer check, request, worker, reply.
fn connection(d: &Daemon, n: u64, conn: UnixStream) {
    let _ = conn.set_nonblocking(false);
    let peer = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials);
    let uid = match peer {
        Ok(c) => c.uid(),
        Err(_) => u32::MAX,
    };
    if uid != d.uid && uid != 0 {
        tracing::warn!(peer_uid = uid, "peer refused");
        send_reply(
            d,
            &conn,
            &error_reply(
                &SupervisorError::PeerRefused {
                    uid,
                    daemon_uid: d.uid,
                },
                false,
            ),
        );
        return;
    }
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let (line, rest, fds) = match wire::recv_line_with_fds(&conn) {
        Ok(x) => x,
        Err(e) => {
            // Too many descriptors (wire::recv_some_with_fds) is the
            // request's `fds`; anything else, the request itself.
            let field = if e.kind() == std::io::ErrorKind::InvalidInput {
                "fds"
            } else {
                "request"
            };
            send_reply(
                d,
                &conn,
                &error_reply(&SupervisorError::invalid(field, e.to_string()), false),
            );
            return;
        }
    };
    let _ = conn.set_read_timeout(None);
    let request = match Request::parse(&line) {
        Ok(r) => r,
        Err(e) => {
            send_reply(d, &conn, &error_reply(&e, false));
            return;
        }
    };
    match request {
        Request::Health(req) => {
            if let Err(e) = same_state_dir(d, req.state_dir.as_deref()) {
                send_reply(d, &conn, &error_reply(&e, req.json));
                return;
            }
            let h = d.health();
            d.metrics.health_check(h.status == "READY");
            let stdout = if req.json {
                format!("{}\n", serde_json::to_string(&h).unwrap_or_default())
            } else {
                format!(
                    "{} (daemon pid {}, supervise {}, state dir {}, {} turn(s) in flight, {} served)\n",
                    h.status,
                    h.daemon.pid,
                    h.daemon.version,
                    h.daemon.state_dir.display(),
                    h.daemon.turns_in_flight,
                    h.daemon.turns_served
                )
            };
            send_reply(
                d,
                &conn,
                &Reply {
                    exit_status: if h.status == "FAILED" {
                        exit::FAILURE
                    } else {
                        exit::OK
                    },
                    printed: false,
                    stdout,
                    stderr: String::new(),
                    value: serde_json::to_value(&h).unwrap_or_default(),
                    trust_level: None,
                    stays: false,
                    ..Reply::default()
                },
            );
        }
        Request::Suspend(l) | Request::Resume(l) if d.stopping.load(Ordering::SeqCst) => {
            let e = SupervisorError::WorkerFailed {
                detail: "the daemon is stopping".into(),
            };
            send_reply(d, &conn, &error_reply(&e, l.json));
        }
        Request::Suspend(l) => send_reply(d, &conn, &d.lifecycle_reply(&l, true)),
        Request::Resume(l) => send_reply(d, &conn, &d.lifecycle_reply(&l, false)),
        Request::Run(r) => {
            let json_mode = r.json;
            let t = Instant::now();
            d.metrics.events_received.inc();
            if d.in_flight() >= d.max_turns {
                let e = SupervisorError::WorkerFailed {
                    detail: format!(
                        "busy: {} turns in flight (--max-turns); nothing was run, try again",
                        d.in_flight()
                    ),
                };
                send_reply(d, &conn, &error_reply(&e, json_mode));
                return;
            }
            if d.stopping.load(Ordering::SeqCst) {
                let e = SupervisorError::WorkerFailed {
                    detail: "the daemon is stopping; no new turns".into(),
                };
                send_reply(d, &conn, &error_reply(&e, json_mode));
                return;
            }
            let receive_hop = r.receive.as_ref().map(|w| w.hop);
            let (ran, mut reply) = match run_request(d, n, &conn, *r, fds, &rest) {
                Ok(mut ran) => {
                    let reply = std::mem::take(&mut ran.reply);
                    (Some(ran), reply)
                }
                Err(e) => (None, error_reply(&e, json_mode)),
            };
            // A receive's envelopes are on the event bus (durable) before
            // its client hears of them.
            let mut failed = None;
            if let (Some(hop), Some(router), Some(_)) = (receive_hop, &d.router, &ran) {
                if let Err(e) = router.publish_reply(&reply.value, hop) {
                    failed = Some(error_reply(&e, json_mode));
                }
            }
            send_reply(d, &conn, failed.as_ref().unwrap_or(&reply));
            // The client has its reply: the worker may build the session's
            // next sandbox.
            if let Some((s, pid)) = ran.as_ref().and_then(|r| r.kept.as_ref()) {
                d.delivered(s, *pid);
            }
            // The daemon's notes of the turn, once its client has the reply.
            if let Some(mut ran) = ran {
                ran.reply = reply;
                reply = ran.settle(d);
            }
            let reply = failed.unwrap_or(reply);
            d.metrics.events_emitted.inc();
            d.metrics.turn_finished(
                &reply.value,
                reply.trust_level.as_deref(),
                t.elapsed().as_secs_f64() * 1000.0,
            );
        }
    }
}

/// Validates a run request as `supervise run` would before anything exists.
fn validate(d: &Daemon, r: &mut RunRequest) -> Result<()> {
    if !r.root.is_absolute() {
        return Err(SupervisorError::invalid("root", "must be an absolute path"));
    }
    // The daemon's working directory is no client's: every path of a
    // request is absolute (`supervise run --server` sends them so).
    for (field, path) in [
        ("state_dir", r.state_dir.as_deref()),
        ("config", r.config.as_deref()),
        ("rootfs", r.rootfs.as_deref()),
        ("events", r.events.as_deref()),
    ] {
        if path.is_some_and(|p| !p.is_absolute()) {
            return Err(SupervisorError::invalid(field, "must be an absolute path"));
        }
    }
    same_state_dir(d, r.state_dir.as_deref())?;
    r.state_dir = Some(d.state_dir.clone());
    worker::to_options(r)?;
    Ok(())
}

/// A client that names a state directory must name the daemon's (one that
/// names none gets the daemon's): two state directories for one workspace
/// would split its anchors and locks.
fn same_state_dir(d: &Daemon, client: Option<&Path>) -> Result<()> {
    let Some(s) = client else {
        return Ok(());
    };
    if std::fs::canonicalize(s).is_ok_and(|c| c == d.state_dir) {
        return Ok(());
    }
    Err(SupervisorError::invalid(
        "state_dir",
        format!(
            "the client names state directory {}, but this daemon's is {}: omit --state-dir (the daemon uses its own) or pass the daemon's",
            s.display(),
            d.state_dir.display()
        ),
    ))
}

fn run_request(
    d: &Daemon,
    n: u64,
    conn: &UnixStream,
    mut r: RunRequest,
    fds: Vec<OwnedFd>,
    early: &[u8],
) -> Result<Ran> {
    validate(d, &mut r)?;
    let [out, err]: [OwnedFd; 2] = fds.try_into().map_err(|v: Vec<OwnedFd>| {
        SupervisorError::invalid(
            "fds",
            format!("a run request carries exactly 2 descriptors (stdout, stderr) with SCM_RIGHTS; got {}", v.len()),
        )
    })?;
    for (fd, name) in [(&out, "stdout"), (&err, "stderr")] {
        writable(fd).map_err(|why| {
            SupervisorError::invalid("fds", format!("the request's {name} descriptor {why}"))
        })?;
    }
    run_worker(d, n, &r, out, err, Some(conn), early)
}

/// Whether `fd` can take a turn's output: open for writing, and not a
/// directory (the worker would fail on it, after the turn began).
fn writable(fd: &OwnedFd) -> std::result::Result<(), String> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(|e| format!("cannot be read ({e})"))?;
    let mode = OFlag::from_bits_truncate(flags) & OFlag::O_ACCMODE;
    if mode != OFlag::O_WRONLY && mode != OFlag::O_RDWR {
        return Err("is not open for writing".into());
    }
    let st = nix::sys::stat::fstat(fd).map_err(|e| format!("cannot be examined ({e})"))?;
    if st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR {
        return Err("is a directory".into());
    }
    Ok(())
}

/// A turn a worker answered: its reply, and what the daemon notes of it
/// once the reply is on its way ([`Ran::settle`]).
pub(crate) struct Ran {
    pub(crate) reply: Reply,
    root: PathBuf,
    started: Instant,
    /// The session and worker kept for its next turn, if it was.
    kept: Option<(String, Pid)>,
}

impl Ran {
    /// The daemon's own notes of the turn (checkpoints, the sessions health
    /// lists, the log line): after the client has its reply, off the turn's
    /// path. Returns the reply.
    pub(crate) fn settle(self, d: &Daemon) -> Reply {
        let report =
            serde_json::from_value::<crate::store::record::TurnReport>(self.reply.value.clone())
                .ok();
        if let (Some(c), Some(t)) = (&d.checkpoints, &report) {
            c.turn_done(&self.root, &t.session_id);
        }
        if let (Some(t), Ok(mut served)) = (&report, d.served.lock()) {
            served.retain(|(s, _)| s != &t.session_id);
            served.insert(0, (t.session_id.clone(), self.root.clone()));
            served.truncate(health::MAX_LEDGER_SESSIONS);
        }
        log_turn(&self.reply, report.as_ref(), self.started.elapsed());
        self.reply
    }
}

/// Runs one turn in a worker with `out`/`err` as its stdout/stderr — the
/// session's waiting worker (with its warm sandbox) or a new one; with a
/// client connection, forwards its signals (a hang-up is SIGHUP). The
/// worker goes back to the session's pool before this returns, so the
/// session's next request finds it.
pub(crate) fn run_worker(
    d: &Daemon,
    n: u64,
    r: &RunRequest,
    out: OwnedFd,
    err: OwnedFd,
    conn: Option<&UnixStream>,
    early: &[u8],
) -> Result<Ran> {
    let session = r.session.as_deref();
    let job = worker::Job {
        keep_warm: d.pool_size > 0 && session.is_some(),
        run: r.clone(),
    };
    let mut line = serde_json::to_vec(&job).unwrap_or_default();
    line.push(b'\n');
    let started = Instant::now();
    let mut w = match d.worker_for(session) {
        Ok(w) => w,
        Err(e @ SupervisorError::ResumeFailed { .. }) => {
            if let Some(s) = session {
                d.record_resume_failed(&r.root, s, &r.package, &e);
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    if wire::send_with_fds(&w.ctl, &line, &[out.as_raw_fd(), err.as_raw_fd()]).is_err() {
        // A waiting worker that died meanwhile: a new one.
        w.dismiss(d);
        w = d.worker_for(None)?;
        wire::send_with_fds(&w.ctl, &line, &[out.as_raw_fd(), err.as_raw_fd()]).map_err(
            state_io("send the turn to its worker", Path::new("/proc/self/exe")),
        )?;
    }
    drop((out, err));
    let pid = w.pid;
    d.track(n, Some(pid));
    d.turn_began(n, session, &r.root, &r.package);
    let mut forwarded = false;
    let deliver = |bytes: &[u8], forwarded: &mut bool| {
        for b in bytes {
            let sig = Signal::try_from(i32::from(*b)).ok();
            if let Some(sig @ (Signal::SIGHUP | Signal::SIGINT | Signal::SIGTERM)) = sig {
                if !*forwarded {
                    let _ = kill(pid, sig);
                    *forwarded = true;
                }
            }
        }
    };
    deliver(early, &mut forwarded);
    let mut reply_bytes = Vec::new();
    let mut client_open = conn.is_some();
    loop {
        let mut fds = vec![PollFd::new(w.ctl.as_fd(), PollFlags::POLLIN)];
        if client_open {
            if let Some(c) = conn {
                fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
            }
        }
        match poll(&mut fds, PollTimeout::from(1000u16)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
        let worker_ready = fds[0].revents().is_some_and(|r| !r.is_empty());
        let client_ready = client_open
            && fds
                .get(1)
                .and_then(|f| f.revents())
                .is_some_and(|r| !r.is_empty());
        if let (true, Some(c)) = (client_ready, conn) {
            let mut b = [0u8; 16];
            match std::io::Read::read(&mut &*c, &mut b) {
                Ok(0) | Err(_) => {
                    // The client is gone: like a hangup of `run`'s terminal.
                    client_open = false;
                    if !forwarded {
                        let _ = kill(pid, Signal::SIGHUP);
                        forwarded = true;
                    }
                }
                Ok(k) => deliver(&b[..k], &mut forwarded),
            }
        }
        if worker_ready {
            let mut b = [0u8; 65536];
            match std::io::Read::read(&mut &w.ctl, &mut b) {
                Ok(0) | Err(_) => break,
                Ok(k) => reply_bytes.extend_from_slice(&b[..k]),
            }
            if reply_bytes.contains(&b'\n') {
                break;
            }
        }
    }
    d.track(n, None);
    d.turn_ended(n, session);
    d.turns_served.fetch_add(1, Ordering::SeqCst);
    let end = reply_bytes.iter().position(|b| *b == b'\n');
    let parsed = end.and_then(|end| serde_json::from_slice::<Reply>(&reply_bytes[..end]).ok());
    let Some(mut reply) = parsed else {
        let status = w.close();
        return Err(SupervisorError::WorkerFailed {
            detail: format!(
                "the worker ended ({status:?}) without a reply; the turn's ledgers say how far it got"
            ),
        });
    };
    w.package = Some(r.package.clone());
    w.trust_level.clone_from(&reply.trust_level);
    // A worker a signal was forwarded to does not serve another turn.
    let kept = match session {
        // Only a kept worker is told its reply was delivered.
        Some(s) if reply.stays && !forwarded => d.keep(s, w).then(|| (s.to_owned(), pid)),
        _ => {
            let _ = w.close();
            None
        }
    };
    // Without a client, the reply is delivered here: the worker may build
    // the session's next sandbox at once.
    if let (None, Some((s, pid))) = (conn, &kept) {
        d.delivered(s, *pid);
    }
    reply.stays = false;
    // A receive's hop, before anyone hears of the turn: a lifecycle
    // envelope of the session published from then on carries it.
    let sid = reply.value.get("session_id").and_then(Value::as_str);
    if let (Some(rw), Some(sid), Ok(mut hops)) = (&r.receive, sid, d.hops.lock()) {
        hops.insert(sid.to_owned(), rw.hop);
    }
    Ok(Ran {
        reply,
        root: r.root.clone(),
        started,
        kept,
    })
}

fn log_turn(reply: &Reply, r: Option<&crate::store::record::TurnReport>, took: Duration) {
    let span = tracing::info_span!(
        "turn",
        session_id = r.map_or("", |r| r.session_id.as_str()),
        turn = r.map_or(0, |r| r.turn_number),
        backend = r
            .and_then(|r| r.enforcement.as_ref())
            .map_or("", |e| e.backend.as_str()),
    );
    let _g = span.enter();
    tracing::info!(
        status = r.map_or("error", |r| r.status.as_str()),
        exit_status = reply.exit_status,
        duration_ms = took.as_secs_f64() * 1000.0,
        sandbox = r
            .and_then(|r| r.durations.as_ref())
            .map_or("none", |d| d.sandbox.as_str()),
        "turn finished"
    );
}
