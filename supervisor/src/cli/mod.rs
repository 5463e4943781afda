//! The `supervise` command line (DESIGN "Command-line contract").
//!
//! Every subcommand returns an [`Outcome`]: what to print and the exit
//! status. Errors go through one path that prints the code, the message and
//! its chain once, and — with `--json` — one JSON object on stdout.

pub mod audit;
pub mod doctor;
pub mod init;
pub mod learn;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod receive;
pub mod report;
pub mod revert;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde_json::Value;
use turnstile_policy::path as ppath;
use turnstile_policy::prompt::{HashedInput, PromptHeader};
use turnstile_policy::request::{self, DeclaredOutput, RequestDoc, TurnRequest};
use turnstile_policy::session::{Clock, SessionIdGenerator};
use turnstile_policy::{Manifest, PackageId, SessionId, Violations};

use crate::error::{Result, SupervisorError, exit};
use crate::ids::{OsRandom, SystemClock};
use crate::sandbox::cgroup::root as cgroup_root;
use crate::store::layout::{DEFAULT_STATE_DIR, StateDir, TURN_TIER, Workspace};
use crate::store::ledger::{LedgerKind, VerifyReport};
use crate::store::record::{Event, EvidenceEntry, Layer, Observed, Violation, read_all};
use crate::store::session::Session;
use crate::store::status::TurnStatus;
pub use crate::turn::outcome::{Outcome, error_outcome, error_value, run_turn_outcome};

/// argv[1] of the sandbox's own init (not a user command).
pub use crate::sandbox::init::SANDBOX_INIT;

const EXIT_CODES: &str = "\
Exit status:
   0  success (run: exit 0 and committed; check: allowed; ledger verify: intact)
   1  operational failure on the host (I/O)
   2  bad invocation, bad manifest or request, unknown session
   3  ledger integrity failure (the entry is named)
  10  run: the command exited non-zero (nothing committed)
  11  capability violation found by the pre-execution check (nothing ran)
  12  run: realized writes differ from the declaration (blocked, nothing committed)
  13  run: memory, pids, disk or files limit hit
  14  run: timeout
  20  run: the sandbox could not be built (E2041) or the runtime is unavailable (E2040)
 128+N run: interrupted by signal N (SIGTERM 143, SIGINT 130, SIGHUP 129); recorded as `interrupted`";

/// turnstile's sandbox supervisor for AI-agent turns.
#[derive(Debug, Parser)]
#[command(name = "supervise", version, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// [`Cli`] with only its `run` subcommand (see [`parse`]).
#[derive(Debug, Parser)]
#[command(name = "supervise", version, after_help = EXIT_CODES)]
struct RunOnly {
    #[command(subcommand)]
    command: RunOnlyCommand,
}

#[derive(Debug, Subcommand)]
enum RunOnlyCommand {
    Run(RunArgs),
}

#[derive(Debug, Subcommand)]
pub enum Command {
    // Its help is RunArgs's doc comment: `parse` builds this one subcommand
    // alone for a turn (see `RunOnly`).
    Run(RunArgs),
    /// Print the Plan a turn would get — mounts, Landlock rules, seccomp,
    /// limits, environment — without running it.
    ///
    /// Example: supervise plan --root /ws --package hello-agent -- /usr/bin/python3 installed/hello-agent/main.py
    Plan(PlanArgs),
    /// Write the OCI bundle a turn would run with a runtime backend
    /// (config.json, the rootfs skeleton, generated files, scope mount
    /// points) into a new directory, and nothing else: no session, no
    /// ledger entry.
    ///
    /// Example: supervise bundle --root /ws --package hello-agent --backend kata --out /tmp/b -- /usr/bin/python3 installed/hello-agent/main.py
    Bundle(BundleArgs),
    /// What this host can enforce: READY, DEGRADED or FAILED, with reasons.
    Doctor(DoctorArgs),
    /// The host (as `doctor`) and the state directory: free space, sessions
    /// whose ledgers fail verification (FAILED), what a stopped supervisor
    /// left unrecovered (DEGRADED). Read-only. Exit 0 READY/DEGRADED, 1
    /// FAILED.
    ///
    /// Example: supervise health --state-dir /var/lib/turnstile --json
    Health(HealthArgs),
    /// Start and manage sessions.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Inspect a session's ledgers.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// Signing keys for ledger checkpoints and attestations.
    #[command(subcommand)]
    Key(audit::KeyCommand),
    /// Run the pre-execution check only: would this turn be allowed?
    ///
    /// Example: supervise check --root /ws --package hello-agent
    ///   --output 'output/<session_id>/report.md:report' -- /usr/bin/python3 installed/hello-agent/main.py
    Check(CheckArgs),
    /// Print the prompt header of a turn (FR-RT-005).
    ///
    /// Example: supervise prompt-header --root /ws --session SES-... --turn 1 --input registries/users.csv
    PromptHeader(PromptHeaderArgs),
    /// Re-run a recorded session's turns from clean state in a fresh
    /// workspace (DIR/root, DIR/state; DIR must not exist) and compare the
    /// final state with the original: exit 0 identical, exit 3 naming the
    /// first difference. Deterministic sessions must replay byte for byte.
    ///
    /// Example: supervise replay --root /ws --session SES-... --into /tmp/replay
    Replay(ReplayArgs),
    /// Write an HO2 checkpoint of a session (FR-RT-009): the context folded
    /// from its evidence ledger, bound to the last entry's hash, under
    /// planes/ho2/sessions/<sid>/checkpoints/.
    ///
    /// Example: supervise checkpoint --root /ws --session SES-...
    Checkpoint(SessionArgs),
    /// Freeze the running turn of a session (its cgroup: cgroup.freeze, or
    /// the v1 freezer); its timeout does not run while it is frozen.
    /// Recorded as `turn.suspended` in the turn's evidence. What the
    /// containerd shim's Pause calls. Exit 2 TS1052 when no turn runs.
    ///
    /// With --server, the daemon does it: the session's running turn and
    /// its warm sandbox are frozen, and `agent.suspended` is emitted on
    /// its event bus.
    ///
    /// Example: supervise suspend --root /ws --session SES-...
    Suspend(SuspendArgs),
    /// Thaw a suspended turn (`turn.resumed`). A turn that cannot be
    /// thawed is ended and fails with E2024 RESUME_FAILED (recorded).
    ///
    /// Example: supervise resume --root /ws --session SES-...
    Resume(SuspendArgs),
    /// Print a session's context as of a time (FR-RT-009): the latest
    /// checkpoint not after it plus the evidence entries since, merged.
    ///
    /// Example: supervise context --root /ws --session SES-... --as-of 2026-11-23T08:00:00Z
    Context(ContextArgs),
    /// Explain a turn: what was refused, by which layer, how often, and the
    /// manifest entry that would allow it (or why none can); which layers'
    /// refusals could not be observed. Read from the evidence ledger, which
    /// is verified first.
    ///
    /// Example: supervise explain --root /ws --session SES-... --turn 3
    Explain(ExplainArgs),
    /// Write a session's report: one self-contained HTML page (no script,
    /// no network) with the ledgers' verification and newest checkpoint at
    /// the top, a timeline of turns coloured by outcome, and each turn's
    /// command, outputs, violations with hints and network flows. Ledgers
    /// that do not verify: the page says so, lists no turn, exit 3.
    ///
    /// Example: supervise report --root /ws --session SES-... --html /tmp/session.html
    Report(report::ReportArgs),
    /// Put back the workspace files turn N committed, as a new turn in
    /// both ledgers: each file must still be what turn N left (otherwise
    /// exit 12, TS1064, naming every path, nothing changed) and its
    /// pre-image still kept. Crash-safe like a commit; a revert can itself
    /// be reverted.
    ///
    /// Example: supervise revert --root /ws --session SES-... --turn 3
    Revert(revert::RevertArgs),
    /// Learn a package's capabilities: run the command in a turn with a
    /// wide read and execute view (still isolated: no network, writes
    /// captured, nothing committed), observe what it reads, executes and
    /// writes, and print the smallest manifest `capabilities` that lets it
    /// run; secret-looking paths are flagged for `forbidden`. `--merge`
    /// prints the diff against the installed manifest.
    ///
    /// Example: supervise learn --root /ws --package build -- /usr/bin/make -C src
    Learn(learn::LearnArgs),
    /// Settle what stopped supervisors left behind, for every session of the
    /// state directory (of --root only, when given): kill and remove dead
    /// turns' cgroups, unmount and remove their turn directories, settle
    /// interrupted ledger appends and commit journals, close unfinished
    /// turns as `aborted`, remove half-created sessions. For boot scripts;
    /// every `run` does the same for its own session first.
    ///
    /// Example: supervise recover --state-dir /var/lib/turnstile
    Recover(RecoverArgs),
    /// Run as a daemon: take turn requests on a unix socket (0600, this
    /// user and root only) and/or from a file bus, each run exactly as
    /// `supervise run` would, in its own worker process. Recovers every
    /// session first. SIGTERM/SIGINT/SIGHUP: in-flight turns end as
    /// `interrupted` (TS1024), then the daemon exits 0. Logs are JSON on
    /// stderr (TURNSTILE_LOG sets the filter, default info).
    ///
    /// Example: supervise serve --state-dir /var/lib/turnstile --socket /run/turnstile.sock --metrics 127.0.0.1:9464
    Serve(ServeArgs),
    /// ARA receive (issue 28): run the package's `entry.receive` as one
    /// turn with the envelope's canonical JSON on its stdin; print the
    /// EventEnvelope v1 lines it returns, validated and canonical, in
    /// order. Network isolated, no write but the declared outputs; an
    /// invalid envelope from the agent fails the turn (TS1091) and emits
    /// nothing; the same key in a session runs the agent once.
    ///
    /// Example: supervise receive --root /ws --package triage --session SES-... --envelope in.json
    Receive(receive::ReceiveArgs),
    /// Create a workspace (if missing) with a package that runs as it is:
    /// installed/<ID>/manifest.json (python3 reading data/**, writing
    /// output/<session_id>/**), installed/<ID>/main.py and a sample
    /// data/sample.csv (kept when present). Prints the first `run` to try.
    /// An existing package is never overwritten (exit 2, field --package).
    ///
    /// Example: supervise init --root /ws --package demo
    Init(InitArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish,
    /// powershell) on stdout.
    ///
    /// Example: supervise completions bash > /etc/bash_completion.d/supervise
    Completions(CompletionsArgs),
    /// Print the man page (roff) on stdout, or write it to --out.
    ///
    /// Example: supervise man --out /usr/local/share/man/man1/supervise.1
    Man(ManArgs),
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Workspace root to create or add the package to.
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    /// The new package's id (letters, digits, `.`, `_`, `-`).
    #[arg(long, value_name = "ID")]
    pub package: String,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write the page to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `supervise completions SHELL` and `supervise man`.
fn docs_cmd(command: &Command) -> Result<Outcome> {
    let bytes = match command {
        Command::Completions(a) => init::completions(a.shell),
        Command::Man(_) => init::man_page()?,
        _ => Vec::new(),
    };
    if let Command::Man(ManArgs { out: Some(path) }) = command {
        std::fs::write(path, &bytes).map_err(|source| SupervisorError::StateIo {
            op: "write man page",
            path: path.clone(),
            source,
        })?;
        return Ok(Outcome::ok(String::new()));
    }
    Ok(Outcome::ok(String::from_utf8_lossy(&bytes).into_owned()))
}

/// A log format (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// The format `args` (the process's arguments) ask for, read before
    /// clap parses them (logging is set up first): the subcommand's
    /// `--log-format`, else its default.
    pub fn from_args(args: &[std::ffi::OsString]) -> Self {
        let mut it = args.iter().map(|a| a.to_string_lossy());
        let sub = args.get(1).map(|a| a.to_string_lossy().into_owned());
        let mut format = match sub.as_deref() {
            Some("serve") => Self::Json,
            _ => Self::Text,
        };
        while let Some(a) = it.next() {
            let value = match a.strip_prefix("--log-format") {
                Some("") => it.next().map(|v| v.into_owned()),
                Some(rest) => rest.strip_prefix('=').map(str::to_owned),
                None => continue,
            };
            match value.as_deref() {
                Some("json") => format = Self::Json,
                Some("text") => format = Self::Text,
                _ => {}
            }
        }
        format
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// How the daemon logs to stderr: `json` (default; one object per event,
    /// a span per turn and per phase, closed with its duration) or `text`.
    #[arg(long, value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Supervisor state directory (the one every client names).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Unix socket to listen on (created 0600; a stale socket is replaced).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// A file bus directory (input/, processing/, output/, error/,
    /// approvals/, rules.v0.1.yaml) to serve (seed 003).
    #[arg(long, value_name = "DIR")]
    pub bus: Option<PathBuf>,
    /// Serve Prometheus metrics on ADDR:PORT (plain HTTP, GET /metrics).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Every bus action is recorded as "would execute" only, whatever a
    /// rule's `mode` says (`--dry-run` always wins).
    #[arg(long)]
    pub dry_run: bool,
    /// Socket turns allowed in flight at once; more are refused (TS1032,
    /// exit 1) rather than queued without bound.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_turns: usize,
    /// Sessions that keep a warm sandbox between turns (their worker stays
    /// with the next turn's sandbox built and parked); 0: every turn builds
    /// its own.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub pool_size: usize,
    /// A session's warm sandbox is discarded after this many idle seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub pool_idle_seconds: u64,
    /// Sign checkpoints of the sessions served with this key (see `ledger
    /// checkpoint`): every --checkpoint-every-turns turns of a session
    /// (default 100), --checkpoint-every-seconds after its last one when it
    /// has had turns since, and at a clean stop.
    #[arg(long, value_name = "PATH")]
    pub checkpoint_key: Option<PathBuf>,
    #[arg(long, value_name = "N", requires = "checkpoint_key")]
    pub checkpoint_every_turns: Option<u64>,
    #[arg(long, value_name = "SECONDS", requires = "checkpoint_key")]
    pub checkpoint_every_seconds: Option<u64>,
    /// Copy every checkpoint the daemon signs into DIR (repeatable).
    #[arg(long, value_name = "DIR", requires = "checkpoint_key")]
    pub checkpoint_witness: Vec<PathBuf>,
    /// The daemon's own configuration (JSON): `subscriptions` (route a
    /// receive's envelopes to packages by type), `max_hops`, `approvers`
    /// (who may approve a bus message), `bus` (`role` sandbox|production,
    /// `sandbox_bus`, `require_sandbox_first`).
    #[arg(long, value_name = "FILE")]
    pub daemon_config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub who: TenantArg,
    /// The session to replay; repeat it to replay several (the sessions of
    /// a chain of agents) into the same fresh workspace, in this order.
    #[arg(long, value_name = "SID", required = true)]
    pub session: Vec<String>,
    /// Where to replay (created; must not exist).
    #[arg(long, value_name = "DIR")]
    pub into: PathBuf,
}

#[derive(Debug, Args)]
pub struct SessionArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub who: TenantArg,
    #[arg(long, value_name = "SID")]
    pub session: String,
}

#[derive(Debug, Args)]
pub struct SuspendArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub who: TenantArg,
    #[arg(long, value_name = "SID")]
    pub session: String,
    /// Ask a running `supervise serve` daemon on this socket (its state
    /// directory is its own; --state-dir, when given, must name it).
    #[arg(long, value_name = "SOCKET")]
    pub server: Option<PathBuf>,
    /// Whether --state-dir was on the command line (see [`parse`]).
    #[arg(skip)]
    pub state_dir_named: bool,
}

#[derive(Debug, Args)]
pub struct ContextArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub who: TenantArg,
    #[arg(long, value_name = "SID")]
    pub session: String,
    /// RFC 3339 UTC time (default: now).
    #[arg(long, value_name = "TS")]
    pub as_of: Option<String>,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub who: TenantArg,
    #[arg(long, value_name = "SID")]
    pub session: String,
    /// Turn number (1-based).
    #[arg(long, value_name = "N")]
    pub turn: u64,
}

#[derive(Debug, Args)]
pub struct RecoverArgs {
    /// Only the sessions of this workspace root.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Only this session (needs --root): what one dead `supervise run`
    /// left, without waiting on the other sessions' running turns (the
    /// containerd shim's recovery after its turn's supervisor was killed).
    #[arg(long, value_name = "SID", requires = "root")]
    pub session: Option<String>,
    /// Pass over a session whose lock a live supervisor holds (its turn is
    /// running: nothing of it to settle) instead of waiting for its turn
    /// to end.
    #[arg(long, conflicts_with = "session")]
    pub skip_busy: bool,
    /// Supervisor state directory.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Start a session: creates both ledgers, tmp/<sid>/ and output/<sid>/,
    /// and prints the session id.
    ///
    /// Example: supervise session new --root /ws --state-dir /var/lib/turnstile
    New(SessionNewArgs),
}

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Verify every hash, link and the acknowledged head of both ledgers.
    ///
    /// With --checkpoint, also check them against a signed checkpoint
    /// (with --pubkey, and --witness-key/--witnesses-required for
    /// cosigners): exit 3 (TS1060) naming the first entry that differs,
    /// (TS1061) when the signatures do not satisfy the keys given.
    ///
    /// Example: supervise ledger verify --root /ws --session SES-...
    /// Example: supervise ledger verify --root /ws --session SES-... --checkpoint cp.note --pubkey supervisor.pub
    Verify(LedgerVerifyArgs),
    /// Sign and keep a checkpoint of both ledgers (a C2SP signed note
    /// holding a tlog checkpoint: RFC 6962 root over every entry), under
    /// planes/<tier>/sessions/<sid>/transparency/, and print it.
    ///
    /// Example: supervise ledger checkpoint --root /ws --session SES-... --key /etc/turnstile/keys/supervisor --witness /srv/witness-inbox
    Checkpoint(audit::LedgerCheckpointArgs),
    /// Print an RFC 6962 inclusion proof of one entry (leaf index) or a
    /// consistency proof from an older tree size.
    ///
    /// Example: supervise ledger prove --root /ws --session SES-... --inclusion 4
    Prove(audit::LedgerProveArgs),
    /// Add a witness's signature line to a checkpoint (in place).
    ///
    /// Example: supervise ledger cosign --checkpoint cp.note --key witness-a
    Cosign(audit::LedgerCosignArgs),
    /// Export a signed DSSE in-toto attestation per committed turn.
    ///
    /// Example: supervise ledger export --root /ws --session SES-... --format in-toto --key /etc/turnstile/keys/supervisor --out /tmp/att
    Export(audit::LedgerExportArgs),
}

/// Who asks, for the commands that name a session.
#[derive(Debug, Args, Clone, Default)]
pub struct TenantArg {
    /// Act for this tenant (a pod's namespace, as `run --tenant`): a
    /// session another owner holds is refused (exit 2, TS1041, recorded in
    /// its owner's evidence). Without it, the host's operator, admitted to
    /// the sessions of its own uid (any uid for root).
    #[arg(long, value_name = "NAMESPACE")]
    pub tenant: Option<String>,
}

impl TenantArg {
    /// Opens session `id` for this requester ([`Session::open_as`]).
    pub fn open(
        &self,
        ws: &Workspace,
        state: &StateDir,
        id: &SessionId,
        tier: Option<&str>,
    ) -> Result<Session> {
        Session::open_as(ws, state, id, tier, &self.owner())
    }

    pub fn owner(&self) -> crate::store::session::Owner {
        crate::store::session::Owner::for_access(self.tenant.as_deref())
    }
}

#[derive(Debug, Args)]
pub struct Common {
    /// Workspace root (holds installed/, planes/, tmp/, output/).
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    /// Supervisor state directory (anchors, locks); never inside the root.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SessionNewArgs {
    #[command(flatten)]
    pub common: Common,
    /// Ledger tier.
    #[arg(long, default_value = TURN_TIER)]
    pub tier: String,
    #[command(flatten)]
    pub deterministic: DeterministicArgs,
}

/// Deterministic mode (a property of the session): ids and timestamps come
/// from the seed and the clock, wall-clock measurements are left out of the
/// ledgers, so the same inputs give byte-identical ledgers.
#[derive(Debug, Args)]
pub struct DeterministicArgs {
    /// Start the session in deterministic mode (needs --seed and --clock).
    #[arg(long, requires_all = ["seed", "clock"])]
    pub deterministic: bool,
    /// Seed of the session's ids.
    #[arg(long, value_name = "N", requires = "deterministic")]
    pub seed: Option<u64>,
    /// The session's start time (RFC 3339, UTC); each turn's clock starts
    /// one hour after the previous one's and advances 1 ms per reading.
    #[arg(long, value_name = "TS", requires = "deterministic")]
    pub clock: Option<String>,
}

impl DeterministicArgs {
    fn parse(&self) -> Result<Option<crate::ids::Deterministic>> {
        if !self.deterministic {
            return Ok(None);
        }
        let clock = self.clock.as_deref().unwrap_or_default();
        let parsed =
            time::OffsetDateTime::parse(clock, &time::format_description::well_known::Rfc3339)
                .map_err(|e| {
                    SupervisorError::invalid("--clock", format!("not an RFC 3339 time: {e}"))
                })?;
        if parsed.offset() != time::UtcOffset::UTC {
            return Err(SupervisorError::invalid(
                "--clock",
                "give the time in UTC (ending in Z)",
            ));
        }
        Ok(Some(crate::ids::Deterministic {
            seed: self.seed.unwrap_or_default(),
            clock: parsed,
        }))
    }
}

#[derive(Debug, Args)]
pub struct LedgerVerifyArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub who: TenantArg,
    #[arg(long, value_name = "SID")]
    pub session: String,
    /// Tier of the ledgers (default: as recorded when the session started).
    #[arg(long)]
    pub tier: Option<String>,
    #[command(flatten)]
    pub trust: audit::CheckpointTrustArgs,
}

/// The turn request as flags (or `--request FILE`).
#[derive(Debug, Args)]
pub struct RequestArgs {
    /// A declared output, `PATH:ROLE` (repeatable). PATH is relative to the
    /// root and may use <session_id>.
    #[arg(long = "output", value_name = "PATH:ROLE")]
    pub outputs: Vec<String>,
    /// Declare that the turn writes nothing.
    #[arg(long)]
    pub no_outputs: bool,
    /// A declared input path (repeatable).
    #[arg(long = "input", value_name = "PATH")]
    pub inputs: Vec<String>,
    #[arg(long, value_name = "ID")]
    pub work_order: Option<String>,
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// The whole request as JSON (instead of the flags above and CMD).
    #[arg(long, value_name = "FILE")]
    pub request: Option<PathBuf>,
    /// The request as an EventEnvelope v1 of type `turn.requested` (its
    /// payload is the request document; its idempotency_key is the turn's).
    /// Instead of the flags and CMD.
    #[arg(long, value_name = "FILE", conflicts_with = "request")]
    pub envelope: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub common: Common,
    /// The turn's system view from an image rootfs DIR (its /usr, /bin,
    /// /lib, /etc set…) instead of the host's; the workspace keeps its host
    /// path. What the containerd shim passes as the container's rootfs.
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    #[arg(long, value_name = "PKG")]
    pub package: String,
    /// Session whose id expands <session_id> (default: a fresh id; nothing
    /// is created).
    #[arg(long, value_name = "SID")]
    pub session: Option<String>,
    #[command(flatten)]
    pub request: RequestArgs,
}

/// Run one turn in a fresh sandbox: check, run, capture, commit or block,
/// and record it in both ledgers. Starts a new session without --session.
///
/// Example: supervise run --root /ws --package hello-agent
///   --input registries/users.csv --output 'output/<session_id>/report.md:report'
///   -- /usr/bin/python3 installed/hello-agent/main.py 'output/<session_id>/report.md'
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: Common,
    /// How `run` logs to stderr: `text` (default; warnings only) or
    /// `json` (one object per event: the turn's span and one per phase,
    /// each closed with its duration; filter with TURNSTILE_LOG).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// The turn's system view from an image rootfs DIR (its /usr, /bin,
    /// /lib, /etc set…) instead of the host's; the workspace keeps its host
    /// path. What the containerd shim passes as the container's rootfs.
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    #[arg(long, value_name = "PKG")]
    pub package: String,
    /// Run in this session (default: start a new one).
    #[arg(long, value_name = "SID")]
    pub session: Option<String>,
    /// Execution backend: native, runc, crun, runsc or kata (default: the
    /// manifest's trust level through the `backends` table of --config).
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,
    /// The tenant this turn runs for (the containerd shim passes the pod's
    /// namespace): a session started for a tenant belongs to it and to the
    /// package, and only they may add turns to it (TS1041 otherwise).
    #[arg(long, value_name = "NAMESPACE")]
    pub tenant: Option<String>,
    /// Make the turn's cgroup under this existing cgroup (a pod's
    /// container cgroup, as containerd's `linux.cgroupsPath` names it,
    /// e.g. `/kubepods/burstable/pod…/…`, or a directory under the cgroup
    /// mount) instead of `turnstile/`: its limits bound the turn's, the
    /// manifest's apply inside (the stricter wins; recorded). The containerd
    /// shim passes the container's. A bad value: TS1051, nothing created.
    #[arg(long, value_name = "PATH")]
    pub cgroup_parent: Option<PathBuf>,
    /// Forward the command's stdout and stderr whole instead of cutting
    /// them at the manifest's `output_bytes` (the containerd shim: a
    /// container's log is the kubelet's to keep and rotate). Recorded as
    /// `output.forwarded_whole`; the streams are still counted and hashed.
    #[arg(long)]
    pub forward_all_output: bool,
    /// System configuration (the trust level -> backend table and the
    /// minimum backends); a missing file means the built-in tables.
    #[arg(long, value_name = "FILE", default_value = crate::backend::select::DEFAULT_CONFIG)]
    pub config: PathBuf,
    #[command(flatten)]
    pub request: RequestArgs,
    /// Only for the new session `run` starts without --session.
    #[command(flatten)]
    pub deterministic: DeterministicArgs,
    /// Append the turn's events to FILE as EventEnvelope v1 JSON lines
    /// (canonical): turn.requested, turn.started, one turn.violation per
    /// violation, turn.finished.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// Send the turn to a `supervise serve` daemon listening on SOCKET
    /// instead of running it here; prints and exits exactly as a local run.
    /// The daemon uses its own state directory: --state-dir may be left
    /// out, and when given must name the daemon's.
    #[arg(long, value_name = "SOCKET")]
    pub server: Option<PathBuf>,
    /// Whether --state-dir was on the command line (see [`parse`]).
    #[arg(skip)]
    pub state_dir_named: bool,
}

#[derive(Debug, Args)]
pub struct BundleArgs {
    #[command(flatten)]
    pub plan: PlanArgs,
    /// The runtime the bundle is for: runc, crun, runsc or kata.
    #[arg(long, value_name = "NAME")]
    pub backend: String,
    /// The bundle directory to create (must not exist).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Guest kernel for VM runtimes (kata).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/usr/share/kata-containers/vmlinux.container"
    )]
    pub vm_kernel: String,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub common: Common,
    /// The turn's system view from an image rootfs DIR (its /usr, /bin,
    /// /lib, /etc set…) instead of the host's; the workspace keeps its host
    /// path. What the containerd shim passes as the container's rootfs.
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    #[arg(long, value_name = "PKG")]
    pub package: String,
    #[arg(long, value_name = "SID")]
    pub session: Option<String>,
    #[command(flatten)]
    pub request: RequestArgs,
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Ask a running `supervise serve` daemon on this socket instead (its
    /// state directory is its own; --state-dir, when given, must name it).
    #[arg(long, value_name = "SOCKET")]
    pub server: Option<PathBuf>,
    /// Supervisor state directory.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Whether --state-dir was on the command line (see [`parse`]).
    #[arg(skip)]
    pub state_dir_named: bool,
}

/// Parses this process's command line (clap exits 2 on a usage error, 0
/// for --help/--version), noting where `--state-dir` was named rather than
/// defaulted: a client of a daemon (`--server`) sends only a state
/// directory it was given, so the daemon's own applies otherwise.
pub fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches, parser::ValueSource};
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "run") {
        // Every turn starts here: build its subcommand alone (the whole
        // tree's ~30 subcommands cost ~0.4 ms of every turn to build and
        // drop). The same `RunArgs`, so the same parse, errors and help.
        let matches = RunOnly::command()
            .try_get_matches_from(&args)
            .unwrap_or_else(|e| usage_error(&e, &args));
        let RunOnly {
            command: RunOnlyCommand::Run(mut a),
        } = RunOnly::from_arg_matches(&matches).unwrap_or_else(|e| usage_error(&e, &args));
        a.state_dir_named = matches
            .subcommand_matches("run")
            .and_then(|m| m.value_source("state_dir"))
            == Some(ValueSource::CommandLine);
        return Cli {
            command: Command::Run(a),
        };
    }
    let matches = Cli::command()
        .try_get_matches_from(&args)
        .unwrap_or_else(|e| usage_error(&e, &args));
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| usage_error(&e, &args));
    let named = |sub: &str| {
        matches
            .subcommand_matches(sub)
            .and_then(|m| m.value_source("state_dir"))
            == Some(ValueSource::CommandLine)
    };
    match &mut cli.command {
        Command::Run(a) => a.state_dir_named = named("run"),
        Command::Health(a) => a.state_dir_named = named("health"),
        Command::Suspend(a) => a.state_dir_named = named("suspend"),
        Command::Resume(a) => a.state_dir_named = named("resume"),
        _ => {}
    }
    cli
}

/// A command line clap refused. Under `--json`, the contract's JSON error
/// (TS1006 naming the argument, exit 2) like every other refusal, not
/// clap's text alone; help and version, and without `--json`, as clap
/// prints them.
fn usage_error(e: &clap::Error, args: &[std::ffi::OsString]) -> ! {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    // Before `--`: after it, the words are the command's.
    let json = args
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--json");
    if !json || matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit()
    }
    let name = |a: &str| a.split([' ', '=']).next().unwrap_or(a).to_owned();
    let field = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(a)) => name(a),
        // Several missing: the first names the field, the reason all.
        Some(ContextValue::Strings(v)) if !v.is_empty() => name(&v[0]),
        _ => "arguments".to_owned(),
    };
    // The first line, with the indented lines under it (the arguments a
    // "not provided" error lists), up to the usage.
    let text = e.render().to_string();
    let mut lines = text.lines();
    let mut reason = lines
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_owned();
    let listed: Vec<&str> = lines
        .take_while(|l| l.starts_with("  "))
        .map(str::trim)
        .collect();
    if !listed.is_empty() {
        reason = format!("{} {}", reason, listed.join(", "));
    }
    let out = error_outcome(&SupervisorError::invalid(&field, reason), true);
    use std::io::Write as _;
    let _ = std::io::stdout().write_all(out.stdout.as_bytes());
    let _ = std::io::stderr().write_all(out.stderr.as_bytes());
    std::process::exit(i32::from(out.status))
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PromptHeaderArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub who: TenantArg,
    #[arg(long, value_name = "SID")]
    pub session: String,
    /// Turn number (1-based).
    #[arg(long, value_name = "N")]
    pub turn: u32,
    #[arg(long = "input", value_name = "PATH")]
    pub inputs: Vec<String>,
    #[arg(long = "output", value_name = "PATH:ROLE")]
    pub outputs: Vec<String>,
    #[arg(long, value_name = "ID")]
    pub work_order: Option<String>,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Outcome {
    let json = match &cli.command {
        Command::Run(a) => a.common.json,
        Command::Receive(a) => a.common.json,
        Command::Plan(a) => a.common.json,
        Command::Doctor(a) => a.json,
        Command::Bundle(a) => a.plan.common.json,
        Command::Health(a) => a.json,
        Command::Session(SessionCommand::New(a)) => a.common.json,
        Command::Ledger(LedgerCommand::Verify(a)) => a.common.json,
        Command::Ledger(LedgerCommand::Checkpoint(a)) => a.sel.common.json,
        Command::Ledger(LedgerCommand::Prove(a)) => a.sel.common.json,
        Command::Ledger(LedgerCommand::Export(a)) => a.sel.common.json,
        Command::Ledger(LedgerCommand::Cosign(_)) => false,
        Command::Key(audit::KeyCommand::Generate(a)) => a.json,
        Command::Check(a) => a.common.json,
        Command::PromptHeader(a) => a.common.json,
        Command::Recover(a) => a.json,
        Command::Serve(_) => false,
        Command::Explain(a) => a.common.json,
        Command::Report(a) => a.sel.common.json,
        Command::Revert(a) => a.common.json,
        Command::Learn(a) => a.common.json,
        Command::Checkpoint(a) => a.common.json,
        Command::Suspend(a) | Command::Resume(a) => a.common.json,
        Command::Replay(a) => a.common.json,
        Command::Context(a) => a.common.json,
        Command::Init(a) => a.json,
        Command::Completions(_) | Command::Man(_) => false,
    };
    let result = match cli.command {
        Command::Run(a) => run_cmd(&a),
        Command::Receive(a) => receive::receive(&a),
        Command::Plan(a) => plan_cmd(&a),
        Command::Doctor(a) => Ok(doctor_cmd(&a)),
        Command::Bundle(a) => bundle_cmd(&a),
        Command::Health(a) if a.server.is_some() => health_server(&a),
        Command::Health(a) => {
            let (text, value) = crate::cli::doctor::health(&a.state_dir);
            Ok(Outcome {
                status: if value.status == "FAILED" {
                    exit::FAILURE
                } else {
                    exit::OK
                },
                stdout: if a.json {
                    format!("{}\n", to_json(&value))
                } else {
                    text
                },
                stderr: String::new(),
            })
        }
        Command::Session(SessionCommand::New(a)) => session_new(&a),
        Command::Ledger(LedgerCommand::Verify(a)) => audit::ledger_verify_checkpoint_cmd(&a),
        Command::Ledger(LedgerCommand::Checkpoint(a)) => audit::ledger_checkpoint_cmd(&a),
        Command::Ledger(LedgerCommand::Prove(a)) => audit::ledger_prove_cmd(&a),
        Command::Ledger(LedgerCommand::Cosign(a)) => audit::ledger_cosign_cmd(&a),
        Command::Ledger(LedgerCommand::Export(a)) => audit::ledger_export_cmd(&a),
        Command::Key(audit::KeyCommand::Generate(a)) => audit::key_generate_cmd(&a),
        Command::Check(a) => check(&a),
        Command::PromptHeader(a) => prompt_header(&a),
        Command::Recover(a) => recover_cmd(&a),
        Command::Serve(a) => a
            .daemon_config
            .as_deref()
            .map(crate::serve::config::DaemonConfig::load)
            .transpose()
            .and_then(|config| {
                crate::serve::serve(&crate::serve::ServeOptions {
                    state_dir: a.state_dir,
                    socket: a.socket,
                    bus: a.bus,
                    metrics: a.metrics,
                    dry_run: a.dry_run,
                    max_turns: a.max_turns,
                    pool_size: a.pool_size,
                    pool_idle: std::time::Duration::from_secs(a.pool_idle_seconds),
                    config: config.unwrap_or_default(),
                    checkpoints: a
                        .checkpoint_key
                        .map(|key| crate::serve::checkpoints::Policy {
                            key,
                            every_turns: Some(a.checkpoint_every_turns.unwrap_or(100)),
                            every: a
                                .checkpoint_every_seconds
                                .map(std::time::Duration::from_secs),
                            witnesses: a.checkpoint_witness,
                        }),
                })
            }),
        Command::Explain(a) => explain(&a),
        Command::Report(a) => report::report_cmd(&a),
        Command::Revert(a) => revert::revert_cmd(&a),
        Command::Learn(a) => learn::learn(&a),
        Command::Checkpoint(a) => checkpoint_cmd(&a),
        Command::Suspend(a) => suspend_cmd(&a, true),
        Command::Resume(a) => suspend_cmd(&a, false),
        Command::Replay(a) => replay_cmd(&a),
        Command::Context(a) => context_cmd(&a),
        Command::Init(a) => init::init(&a.root, &a.package, a.json),
        c @ (Command::Completions(_) | Command::Man(_)) => docs_cmd(&c),
    };
    result.unwrap_or_else(|e| error_outcome(&e, json))
}

fn open_workspace(common: &Common) -> Result<(Workspace, StateDir)> {
    let ws = Workspace::open(&common.root)?;
    let state = StateDir::open(&common.state_dir, &ws, false)?;
    Ok((ws, state))
}

fn session_new(a: &SessionNewArgs) -> Result<Outcome> {
    // Validate everything before anything is created.
    crate::store::layout::check_tier(&a.tier)?;
    let ws = Workspace::open(&a.common.root)?;
    let state = StateDir::open(&a.common.state_dir, &ws, true)?;
    crate::store::session::sweep_unfinished(&state, Some(&ws))?;
    let det = a.deterministic.parse()?;
    let session = match &det {
        Some(d) => {
            let src = d.sources(0);
            Session::create(
                &ws,
                &state,
                &a.tier,
                &SessionIdGenerator::new(src.clone(), src),
                det.clone(),
            )?
        }
        None => Session::create(
            &ws,
            &state,
            &a.tier,
            &SessionIdGenerator::new(SystemClock, OsRandom),
            None,
        )?,
    };
    let stdout = if a.common.json {
        #[derive(serde::Serialize)]
        struct Created<'a> {
            session_id: &'a str,
            tier: &'a str,
            ledgers: crate::store::record::LedgerPaths,
            scratch_dir: std::path::PathBuf,
            output_dir: std::path::PathBuf,
        }
        to_json(&Created {
            session_id: session.id.as_str(),
            tier: &session.tier,
            ledgers: crate::store::record::LedgerPaths {
                exec: session.ledger(LedgerKind::Exec).path,
                evidence: session.ledger(LedgerKind::Evidence).path,
            },
            scratch_dir: ws.scratch_dir(&session.id),
            output_dir: ws.output_dir(&session.id),
        })
    } else {
        session.id.to_string()
    };
    Ok(Outcome::ok(stdout + "\n"))
}

/// One ledger as `ledger verify --json` reports it.
#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
enum LedgerCheck<'a> {
    Intact {
        ledger: &'static str,
        path: &'a std::path::Path,
        intact: bool,
        entries: u64,
        legacy_entries: u64,
        bytes: u64,
        head_hash: &'a str,
        warnings: &'a [String],
    },
    Tampered {
        ledger: &'static str,
        intact: bool,
        error: crate::turn::outcome::ErrorObject,
    },
}

fn report_check(r: &VerifyReport) -> LedgerCheck<'_> {
    LedgerCheck::Intact {
        ledger: r.kind.as_str(),
        path: &r.path,
        intact: true,
        entries: r.entries,
        legacy_entries: r.legacy_entries,
        bytes: r.bytes,
        head_hash: &r.head_hash,
        warnings: &r.warnings,
    }
}

fn replay_cmd(a: &ReplayArgs) -> Result<Outcome> {
    let ids = a
        .session
        .iter()
        .map(|s| SessionId::parse(s))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut all = crate::turn::replay::replay_all(
        &a.common.root,
        &a.common.state_dir,
        &ids,
        &a.into,
        &crate::sandbox::cgroup::Place::host(),
        &a.who.owner(),
    )?;
    if all.len() > 1 {
        let first = all.iter().find_map(|r| {
            r.difference
                .as_ref()
                .map(|d| format!("session {}: {d}", r.original))
        });
        let stdout = if a.common.json {
            format!(
                "{}\n",
                to_json(&crate::turn::replay::ManyJson {
                    identical: first.is_none(),
                    first_difference: first.clone(),
                    sessions: all.iter().map(|r| r.to_value()).collect(),
                })
            )
        } else {
            let mut t = String::new();
            for r in &all {
                t += &format!(
                    "replay of {} ({} turns): {}\n",
                    r.original,
                    r.turns,
                    if r.difference.is_none() {
                        "identical"
                    } else {
                        "DIFFERS"
                    }
                );
            }
            if let Some(d) = &first {
                t += &format!("  first difference: {d}\n");
            }
            t
        };
        return Ok(Outcome {
            status: if first.is_none() {
                exit::OK
            } else {
                exit::INTEGRITY
            },
            stdout,
            stderr: String::new(),
        });
    }
    let r = all.remove(0);
    let stdout = if a.common.json {
        format!("{}\n", r.to_value())
    } else {
        match &r.difference {
            None => format!(
                "replay of {} ({} turns) into {}: identical\n",
                r.original,
                r.turns,
                r.root.display()
            ),
            Some(d) => format!(
                "replay of {} ({} turns) into {}: DIFFERS\n  {d}\n",
                r.original,
                r.turns,
                r.root.display()
            ),
        }
    };
    Ok(Outcome {
        status: if r.difference.is_none() {
            exit::OK
        } else {
            exit::INTEGRITY
        },
        stdout,
        stderr: String::new(),
    })
}

/// `supervise checkpoint --json`.
#[derive(serde::Serialize)]
struct CheckpointWritten<'a> {
    path: &'a std::path::Path,
    checkpoint: &'a Value,
}

/// `supervise suspend` (`freeze`) and `resume`: the session's running
/// turn (and a warm sandbox a daemon keeps for it), found by the cgroup
/// file each published in its directory, frozen or thawed; the fact is
/// appended for the turn's evidence (`serve::lifecycle`). With --server,
/// the daemon does it.
fn suspend_cmd(a: &SuspendArgs, freeze: bool) -> Result<Outcome> {
    let id = SessionId::parse(&a.session)?;
    if let Some(socket) = &a.server {
        let request = crate::serve::wire::LifecycleRequest {
            root: crate::serve::client::absolute(&a.common.root)?,
            session: id.to_string(),
            tenant: a.who.tenant.clone(),
            json: a.common.json,
            state_dir: if a.state_dir_named {
                Some(crate::serve::client::absolute(&a.common.state_dir)?)
            } else {
                None
            },
        };
        return crate::serve::client::lifecycle(socket, &request, freeze);
    }
    let (ws, state) = open_workspace(&a.common)?;
    let _session = a.who.open(&ws, &state, &id, None)?;
    let report =
        crate::serve::lifecycle::apply(id.as_str(), &state.session_dir(&id), freeze, None, |_| {})?;
    Ok(Outcome::ok(report.text(a.common.json)))
}

fn checkpoint_cmd(a: &SessionArgs) -> Result<Outcome> {
    let id = SessionId::parse(&a.session)?;
    let (ws, state) = open_workspace(&a.common)?;
    let session = a.who.open(&ws, &state, &id, None)?;
    let (lock, _) = crate::recover::lock_for_write(
        &session,
        &crate::sandbox::cgroup::Place::host(),
        &crate::ids::SystemClock,
    )?;
    let (path, c, seq) = crate::turn::context::checkpoint(&session, &lock)?;
    let text = format!(
        "{}\n",
        if a.common.json {
            to_json(&CheckpointWritten {
                path: &path,
                checkpoint: &c,
            })
        } else {
            format!(
                "checkpoint {} covers evidence entry {}",
                path.display(),
                seq.map_or_else(|| "none".to_owned(), |s| s.to_string())
            )
        }
    );
    Ok(Outcome::ok(text))
}

fn context_cmd(a: &ContextArgs) -> Result<Outcome> {
    let id = SessionId::parse(&a.session)?;
    if let Some(t) = &a.as_of {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).map_err(
            |e| SupervisorError::invalid("--as-of", format!("not an RFC 3339 time: {e}")),
        )?;
        if !t.ends_with('Z') {
            return Err(SupervisorError::invalid(
                "--as-of",
                "give the time in UTC (ending in Z)",
            ));
        }
    }
    let (ws, state) = open_workspace(&a.common)?;
    let session = a.who.open(&ws, &state, &id, None)?;
    let r = crate::turn::context::context(&session, a.as_of.as_deref())?;
    if a.common.json {
        return Ok(Outcome::ok(format!("{}\n", to_json(&r))));
    }
    let mut text = format!(
        "context of {id} as of {} ({} entries replayed{})\n",
        a.as_of.as_deref().unwrap_or("now"),
        r.entries_replayed,
        r.checkpoint
            .as_deref()
            .map(|p| format!(" after checkpoint {p}"))
            .unwrap_or_default()
    );
    for t in &r.context.turns {
        text += &format!(
            "turn {}: {}\n",
            t.turn_number,
            t.status.map_or("?", |s| s.as_str())
        );
    }
    for (p, o) in &r.context.outputs {
        text += &format!("output {p} sha256 {}\n", o.sha256);
    }
    Ok(Outcome::ok(text))
}

/// A value as one line of JSON (`--json` output).
fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn explain(a: &ExplainArgs) -> Result<Outcome> {
    let id = SessionId::parse(&a.session)?;
    if a.turn == 0 {
        return Err(SupervisorError::InvalidArgument {
            field: "--turn".into(),
            reason: "turns are numbered from 1".into(),
        });
    }
    let (ws, state) = open_workspace(&a.common)?;
    let session = a.who.open(&ws, &state, &id, None)?;
    // Both ledgers verify (FR-RT-008), not only the one read.
    session.ledger(LedgerKind::Exec).verify()?;
    let raw = session.ledger(LedgerKind::Evidence).verified_entries()?;
    let entry = read_all::<EvidenceEntry>(&raw)
        .map_err(|e| {
            SupervisorError::invalid(
                "--session",
                format!("an evidence entry does not read as one: {e}"),
            )
        })?
        .into_iter()
        .rev()
        .map(|e| e.body)
        .find(|e| e.event == Event::TurnFinished && e.turn_number == a.turn)
        .ok_or_else(|| SupervisorError::InvalidArgument {
            field: "--turn".into(),
            reason: format!("session {id} has no finished turn {}", a.turn),
        })?;
    let observed = entry.ran().and_then(|e| e.denials_observed.clone());
    if a.common.json {
        #[derive(serde::Serialize)]
        struct Explained<'a> {
            session_id: &'a str,
            turn_number: u64,
            status: Option<TurnStatus>,
            violations: &'a [Violation],
            denials_observed: &'a Option<std::collections::BTreeMap<String, Observed>>,
        }
        let v = Explained {
            session_id: id.as_str(),
            turn_number: a.turn,
            status: entry.status,
            violations: &entry.violations,
            denials_observed: &observed,
        };
        return Ok(Outcome::ok(format!("{}\n", to_json(&v))));
    }
    let mut text = format!(
        "turn {} of {id}: {}\n",
        a.turn,
        entry.status.map_or("?", TurnStatus::as_str)
    );
    if entry.violations.is_empty() {
        text += "no refusal was recorded\n";
    }
    // Grouped by layer, in the order the layers act.
    for layer in [
        Layer::PreExecution,
        Layer::Seccomp,
        Layer::Landlock,
        Layer::Mount,
        Layer::Network,
        Layer::Verify,
    ] {
        let of: Vec<&Violation> = entry
            .violations
            .iter()
            .filter(|v| v.layer == layer)
            .collect();
        if of.is_empty() {
            continue;
        }
        let total: u64 = of.iter().map(|v| v.count).sum();
        text += &format!(
            "{}: {} refusal(s) of {} kind(s)\n",
            layer.as_str(),
            total,
            of.len()
        );
        for v in of {
            // What the turn named is printed escaped (a name or path may
            // hold an escape sequence or a line feed).
            use crate::store::record::printable;
            text += &format!(
                "- [{}] {} {} (x{})\n    {}\n",
                v.layer.as_str(),
                printable(&v.attempted_operation),
                printable(&v.target),
                v.count,
                printable(&v.details)
            );
            if let Some(h) = &v.hint {
                text += &format!("    hint: {}\n", printable(h));
            }
        }
    }
    for (layer, o) in observed.iter().flatten() {
        if !o.observed {
            text += &format!(
                "note: {layer} refusals are not observable here: {}\n",
                o.why.as_deref().unwrap_or("?")
            );
        }
    }
    Ok(Outcome::ok(text))
}

fn ledger_verify(a: &LedgerVerifyArgs) -> Result<Outcome> {
    let id = SessionId::parse(&a.session)?;
    let (ws, state) = open_workspace(&a.common)?;
    let session = a.who.open(&ws, &state, &id, a.tier.as_deref())?;
    let mut ledgers = Vec::new();
    let mut reports = Vec::new();
    let mut text = String::new();
    let mut stderr = String::new();
    let mut intact = true;
    // Both ledgers are always reported, even when the first fails.
    for kind in LedgerKind::ALL {
        match session.ledger(kind).verify() {
            Ok(r) => {
                text += &format!(
                    "{:<15} intact    {} entries, head {}\n",
                    kind.file_name(),
                    r.entries,
                    r.head_hash.get(..16).unwrap_or_default()
                );
                for w in &r.warnings {
                    stderr += &format!("supervise: warning: {w}\n");
                }
                reports.push(r);
            }
            Err(e @ SupervisorError::Integrity(_)) => {
                text += &format!("{:<15} TAMPERED  {e}\n", kind.file_name());
                stderr += &error_outcome(&e, false).stderr;
                ledgers.push((
                    kind,
                    LedgerCheck::Tampered {
                        ledger: kind.as_str(),
                        intact: false,
                        error: crate::turn::outcome::error_object(&e),
                    },
                ));
                intact = false;
            }
            Err(e) => return Err(e),
        }
    }
    ledgers.extend(reports.iter().map(|r| (r.kind, report_check(r))));
    // In the ledgers' own order.
    ledgers.sort_by_key(|(k, _)| LedgerKind::ALL.iter().position(|x| x == k));
    let stdout = if a.common.json {
        #[derive(serde::Serialize)]
        struct Verified<'a> {
            session_id: &'a str,
            intact: bool,
            ledgers: Vec<LedgerCheck<'a>>,
        }
        let v = Verified {
            session_id: id.as_str(),
            intact,
            ledgers: ledgers.into_iter().map(|(_, c)| c).collect(),
        };
        format!("{}\n", to_json(&v))
    } else {
        text
    };
    Ok(Outcome {
        status: if intact { exit::OK } else { exit::INTEGRITY },
        stdout,
        stderr,
    })
}

pub(crate) fn parse_output_flag(raw: &str) -> Result<DeclaredOutput> {
    let (path, role) = raw.rsplit_once(':').ok_or_else(|| {
        SupervisorError::invalid(
            "--output",
            format!("`{raw}` is not PATH:ROLE (e.g. output/<session_id>/report.md:report)"),
        )
    })?;
    Ok(DeclaredOutput {
        path: path.to_owned(),
        role: role.to_owned(),
    })
}

/// Builds the turn request from `--request FILE` or from the flags.
pub fn request_from_args(r: &RequestArgs) -> Result<TurnRequest> {
    if let Some(file) = r.request.as_ref().or(r.envelope.as_ref()) {
        let flag = if r.envelope.is_some() {
            "--envelope"
        } else {
            "--request"
        };
        let mixed = !r.outputs.is_empty()
            || r.no_outputs
            || !r.inputs.is_empty()
            || r.work_order.is_some()
            || r.idempotency_key.is_some()
            || r.timeout.is_some()
            || !r.command.is_empty();
        if mixed {
            return Err(SupervisorError::invalid(
                flag,
                "the request file carries the whole request; do not combine it with --output, --no-outputs, --input, --work-order, --idempotency-key, --timeout or a command",
            ));
        }
        // A FIFO, device, directory or symlink is refused without blocking.
        let bytes =
            turnstile_policy::input::read_regular_file(file, request::MAX_REQUEST_BYTES as u64)
                .map_err(|e| SupervisorError::invalid(flag, format!("{}: {e}", file.display())))?;
        if r.envelope.is_none() {
            return Ok(TurnRequest::from_json(&bytes)?);
        }
        let env = turnstile_policy::envelope::EventEnvelope::from_json(&bytes)?;
        if env.kind != "turn.requested" {
            return Err(SupervisorError::invalid(
                "envelope.type",
                format!(
                    "`{}`: only `turn.requested` envelopes start a turn",
                    env.kind
                ),
            ));
        }
        // The payload is a TurnRequest document; its key is the envelope's.
        let bytes = serde_json::to_vec(&env.payload).unwrap_or_default();
        let mut doc: RequestDoc =
            turnstile_policy::strict::from_json_slice(&bytes).map_err(|e| {
                let (field, reason) = e.field_and_reason();
                SupervisorError::invalid(&format!("envelope.payload.{field}"), reason)
            })?;
        match &doc.idempotency_key {
            Some(k) if *k != env.idempotency_key => {
                return Err(SupervisorError::invalid(
                    "envelope.payload.idempotency_key",
                    "differs from the envelope's idempotency_key; give it once",
                ));
            }
            _ => doc.idempotency_key = Some(env.idempotency_key.clone()),
        }
        return Ok(TurnRequest::from_doc(doc)?);
    }
    if r.no_outputs && !r.outputs.is_empty() {
        return Err(SupervisorError::invalid(
            "--no-outputs",
            "contradicts --output; give one or the other",
        ));
    }
    let declared_outputs = if r.no_outputs {
        Some(Vec::new())
    } else if r.outputs.is_empty() {
        None
    } else {
        Some(
            r.outputs
                .iter()
                .map(|o| parse_output_flag(o))
                .collect::<Result<Vec<_>>>()?,
        )
    };
    Ok(TurnRequest::from_doc(RequestDoc {
        command: (!r.command.is_empty()).then(|| r.command.clone()),
        declared_inputs: r.inputs.clone(),
        declared_outputs,
        work_order_id: r.work_order.clone(),
        idempotency_key: r.idempotency_key.clone(),
        timeout_seconds: r.timeout,
    })?)
}

/// `supervise check --json`.
#[derive(serde::Serialize)]
struct Checked<'a> {
    allowed: bool,
    package: &'a str,
    session_id: &'a str,
    execute_entry: Option<&'a str>,
    violations: Vec<Value>,
    exit_code: u8,
}

fn check(a: &CheckArgs) -> Result<Outcome> {
    let session = match &a.session {
        Some(s) => SessionId::parse(s)?,
        None => SessionIdGenerator::new(SystemClock, OsRandom).generate()?,
    };
    let request = request_from_args(&a.request)?;
    let admission = crate::turn::admit::admit(
        crate::turn::admit::Input {
            root: &a.common.root,
            state_dir: &a.common.state_dir,
            package: &a.package,
            request: &request,
            system_root: rootfs(a.rootfs.as_deref(), &a.common.root)?.as_deref(),
            manifest: None,
        },
        session,
    )?;
    let (package, session, bound) = (&admission.package, &admission.session, &admission.request);
    let decision = admission.check();
    let (status, entry, violations) = match &decision {
        Ok(allowed) => (exit::OK, Some(allowed.execute_entry.clone()), Vec::new()),
        Err(Violations(v)) => (exit::VIOLATION, None, v.clone()),
    };
    let stdout = if a.common.json {
        format!(
            "{}\n",
            to_json(&Checked {
                allowed: decision.is_ok(),
                package: package.as_str(),
                session_id: session.as_str(),
                execute_entry: entry.as_deref(),
                violations: violations.iter().map(|v| v.to_value()).collect(),
                exit_code: status,
            })
        )
    } else {
        match &entry {
            Some(e) => format!(
                "allowed: `{}` (execute entry `{e}`)\n",
                bound.command.join(" ")
            ),
            None => {
                let mut s = format!("refused: {} capability violation(s)\n", violations.len());
                for v in &violations {
                    s += &format!("  - {v}\n");
                }
                s
            }
        }
    };
    Ok(Outcome {
        status,
        stdout,
        stderr: String::new(),
    })
}

fn prompt_header(a: &PromptHeaderArgs) -> Result<Outcome> {
    let id = SessionId::parse(&a.session)?;
    if a.turn == 0 {
        return Err(SupervisorError::invalid(
            "--turn",
            "turn numbers start at 1",
        ));
    }
    request::validate_inputs(&a.inputs)?;
    let outputs = a
        .outputs
        .iter()
        .map(|o| parse_output_flag(o))
        .collect::<Result<Vec<_>>>()?;
    request::validate_outputs(&outputs)?;
    if let Some(w) = &a.work_order {
        request::validate_work_order(w)?;
    }
    let (ws, state) = open_workspace(&a.common)?;
    let session = a.who.open(&ws, &state, &id, None)?;
    // Reads of a session verify its ledgers first (FR-RT-008).
    session.verify()?;
    let declared_inputs = a
        .inputs
        .iter()
        .map(|raw| {
            let path = ppath::expand(raw, &id);
            crate::fsx::hash_beneath(ws.root(), &path)
                .map(|(sha256, _)| HashedInput {
                    path: path.clone(),
                    sha256,
                })
                .map_err(|source| SupervisorError::InputUnreadable { path, source })
        })
        .collect::<Result<Vec<_>>>()?;
    let header = PromptHeader {
        session_id: id.clone(),
        turn_number: a.turn,
        declared_inputs,
        declared_outputs: outputs
            .into_iter()
            .map(|o| DeclaredOutput {
                path: ppath::expand(&o.path, &id),
                role: o.role,
            })
            .collect(),
        context_as_of: SystemClock.now(),
        work_order_id: a.work_order.clone(),
    };
    let stdout = if a.common.json {
        format!("{}\n", header.to_value())
    } else {
        header.render_text()
    };
    Ok(Outcome::ok(stdout))
}

/// `health --server SOCKET`: the daemon's own health.
fn health_server(a: &HealthArgs) -> Result<Outcome> {
    let socket = a.server.as_deref().unwrap_or(std::path::Path::new(""));
    let request = crate::serve::wire::HealthRequest {
        json: a.json,
        state_dir: if a.state_dir_named {
            Some(crate::serve::client::absolute(&a.state_dir)?)
        } else {
            None
        },
    };
    crate::serve::client::health(socket, &request)
}

fn run_cmd(a: &RunArgs) -> Result<Outcome> {
    // A key is recorded in its session: without --session each retry
    // starts a new session and runs again, which is what the key is for
    // preventing (red-team, stop 54: it was accepted and ran twice).
    if a.request.idempotency_key.is_some() && a.session.is_none() {
        return Err(SupervisorError::invalid(
            "--idempotency-key",
            "needs --session: a key is recorded in its session, and a retry without one would start a new session and run again",
        ));
    }
    let request = request_from_args(&a.request)?;
    let deterministic = a.deterministic.parse()?;
    if deterministic.is_some() && a.session.is_some() {
        return Err(SupervisorError::invalid(
            "--deterministic",
            "deterministic mode is a property of the session: start it with `session new --deterministic` (or `run` without --session)",
        ));
    }
    if a.forward_all_output && a.server.is_some() {
        return Err(SupervisorError::invalid(
            "--forward-all-output",
            "not with --server (the daemon forwards within output_bytes)",
        ));
    }
    let mut cgroup_place = crate::sandbox::cgroup::Place::host();
    if let Some(raw) = &a.cgroup_parent {
        if a.server.is_some() {
            return Err(SupervisorError::CgroupParentInvalid {
                value: raw.display().to_string(),
                reason: "not with --server (the daemon makes its turns' cgroups)".into(),
            });
        }
        let rel = crate::sandbox::cgroup::parent_of(&cgroup_root(), raw).map_err(|reason| {
            SupervisorError::CgroupParentInvalid {
                value: raw.display().to_string(),
                reason,
            }
        })?;
        cgroup_place = cgroup_place.under(rel);
    }
    if let Some(socket) = &a.server {
        use crate::serve::client::{absolute, request_doc};
        let wire = crate::serve::wire::RunRequest {
            root: absolute(&a.common.root)?,
            package: a.package.clone(),
            session: a.session.clone(),
            state_dir: if a.state_dir_named {
                Some(absolute(&a.common.state_dir)?)
            } else {
                None
            },
            backend: a.backend.clone(),
            tenant: a.tenant.clone(),
            config: Some(absolute(&a.config)?),
            rootfs: a.rootfs.as_deref().map(absolute).transpose()?,
            json: a.common.json,
            events: a.events.as_deref().map(absolute).transpose()?,
            deterministic: deterministic
                .as_ref()
                .map(|d| crate::serve::wire::DeterministicWire {
                    seed: d.seed,
                    clock: turnstile_policy::timefmt::rfc3339_micros(d.clock),
                }),
            request: request_doc(&request),
            receive: None,
        };
        return crate::serve::client::run(socket, &wire);
    }
    // The workers of the turn's grouped syncs (a new session's tree, the
    // ledger appends) are made now, beside admission, not on the turn's
    // path where its first group needs them: as many as its largest group.
    crate::syncpool::warm(if a.session.is_some() {
        crate::syncpool::TURN_WORKERS
    } else {
        crate::syncpool::NEW_SESSION_WORKERS
    });
    // The denial observer loads (verifier, attach) while the turn is
    // admitted and planned — in the process that runs the turn (not a
    // `--server` client), and only where a turn can be attributed.
    if crate::sandbox::cgroup::has_v2(&cgroup_root()) {
        crate::sandbox::observe::preload();
    }
    let opts = crate::turn::RunOptions {
        forward_all_output: a.forward_all_output,
        on_durable: None,
        root: a.common.root.clone(),
        state_dir: a.common.state_dir.clone(),
        package: a.package.clone(),
        session: a.session.clone(),
        request,
        json: a.common.json,
        cgroup_place,
        sources: crate::ids::Sources::system(),
        backend: a.backend.clone(),
        tenant: a.tenant.clone(),
        pool: None,
        between: None,
        interrupts: crate::turn::interrupt::Interrupts::default(),
        config: a.config.clone(),
        deterministic,
        rootfs: a.rootfs.clone(),
        receive: None,
        manifest: None,
    };
    Ok(run_turn_outcome(&opts, a.events.as_deref()).0)
}

/// A request for `plan`: the flags, or (without a command) the first execute
/// entry as the command, so the manifest alone can be inspected.
fn plan_request(a: &PlanArgs) -> Result<TurnRequest> {
    let r = &a.request;
    if r.request.is_some() || !r.command.is_empty() {
        let mut req = request_from_args(r);
        if let Err(SupervisorError::Policy(turnstile_policy::PolicyError::InvalidRequest {
            field,
            ..
        })) = &req
        {
            if field == "declared_outputs" {
                // Outputs do not change the plan; allow leaving them out.
                req = Ok(TurnRequest::from_doc(RequestDoc {
                    command: Some(r.command.clone()),
                    declared_inputs: r.inputs.clone(),
                    declared_outputs: Some(Vec::new()),
                    work_order_id: None,
                    idempotency_key: None,
                    timeout_seconds: r.timeout,
                })?);
            }
        }
        return req;
    }
    let ws = Workspace::open(&a.common.root)?;
    let manifest = Manifest::load(ws.root(), &PackageId::parse(&a.package)?)?;
    if manifest.capabilities.execute.is_empty() {
        return Err(SupervisorError::invalid(
            "--package",
            "the manifest has no execute entries: no turn can run",
        ));
    }
    // A glob (`/usr/bin/*`) names no one program to plan for.
    let is_glob = |p: &str| p.contains(['*', '?', '[', '{']);
    let entry = manifest
        .capabilities
        .execute
        .iter()
        .find(|e| !is_glob(e.program.as_str()))
        .ok_or_else(|| {
            SupervisorError::invalid(
                "--package",
                "every execute entry of the manifest is a glob: name the command (`supervise plan … -- CMD`)",
            )
        })?;
    let mut command = vec![entry.program.to_string()];
    command.extend(entry.args.iter().cloned());
    Ok(TurnRequest::from_doc(RequestDoc {
        command: Some(command),
        declared_outputs: Some(Vec::new()),
        ..RequestDoc::default()
    })?)
}

fn plan_cmd(a: &PlanArgs) -> Result<Outcome> {
    let request = plan_request(a)?;
    let plan = crate::turn::plan_only(
        crate::turn::admit::Input {
            root: &a.common.root,
            state_dir: &a.common.state_dir,
            package: &a.package,
            request: &request,
            system_root: rootfs(a.rootfs.as_deref(), &a.common.root)?.as_deref(),
            manifest: None,
        },
        a.session.as_deref(),
    )?;
    let stdout = if a.common.json {
        format!("{}\n", serde_json::to_value(&plan).unwrap_or(Value::Null))
    } else {
        plan.render_text()
    };
    Ok(Outcome::ok(stdout))
}

fn bundle_cmd(a: &BundleArgs) -> Result<Outcome> {
    if !["runc", "crun", "runsc", "kata"].contains(&a.backend.as_str()) {
        return Err(SupervisorError::invalid(
            "--backend",
            format!("`{}`: a bundle is for runc, crun, runsc or kata", a.backend),
        ));
    }
    if a.out.symlink_metadata().is_ok() {
        return Err(SupervisorError::invalid(
            "--out",
            format!("{} exists; give a new directory", a.out.display()),
        ));
    }
    let parent = a
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let parent = std::fs::canonicalize(parent)
        .map_err(|e| SupervisorError::invalid("--out", format!("{}: {e}", parent.display())))?;
    let out = parent.join(a.out.file_name().unwrap_or_default());
    let request = plan_request(&a.plan)?;
    let plan = crate::turn::plan_only(
        crate::turn::admit::Input {
            root: &a.plan.common.root,
            state_dir: &a.plan.common.state_dir,
            package: &a.plan.package,
            request: &request,
            system_root: rootfs(a.plan.rootfs.as_deref(), &a.plan.common.root)?.as_deref(),
            manifest: None,
        },
        a.plan.session.as_deref(),
    )?;
    let options = crate::backend::bundle::options(
        &plan,
        &a.backend,
        crate::backend::bundle::Place {
            bundle_dir: out.clone(),
            empty_dir: out.join("empty"),
            scope_sources: (0..plan.writable_scopes.len())
                .map(|i| out.join("scopes").join(i.to_string()).display().to_string())
                .collect(),
            workspace_source: None,
        },
        request
            .declared_outputs
            .iter()
            .map(|d| (d.path.clone(), d.role.clone()))
            .collect(),
        Some(turnstile_oci::VmKernel {
            path: a.vm_kernel.clone(),
            parameters: Vec::new(),
            initrd: None,
        }),
    )?;
    let bundle = turnstile_oci::build(&plan, &options)
        .map_err(|e| SupervisorError::invalid("plan", e.to_string()))?;
    crate::backend::bundle::write(&out, &bundle, plan.writable_scopes.len())?;
    let stdout = if a.plan.common.json {
        format!(
            "{}\n",
            to_json(&BundleWritten {
                bundle: &out,
                backend: &a.backend,
                config: out.join("config.json"),
            })
        )
    } else {
        format!("bundle for {} written to {}\n", a.backend, out.display())
    };
    Ok(Outcome::ok(stdout))
}

/// `supervise bundle --json`.
#[derive(serde::Serialize)]
struct BundleWritten<'a> {
    bundle: &'a std::path::Path,
    backend: &'a str,
    config: PathBuf,
}

/// `supervise recover --json`.
#[derive(serde::Serialize)]
struct Recovered {
    sessions_checked: usize,
    unfinished_creations_removed: Vec<String>,
    dead_warm_cgroups_removed: Vec<String>,
    recovered: Vec<Value>,
    /// Sessions that could not be recovered: `session_id`, `code`, `message`.
    failed: Vec<Value>,
}

fn doctor_cmd(a: &DoctorArgs) -> Outcome {
    let (text, value) = crate::cli::doctor::report();
    let status = if value.status == "FAILED" {
        exit::SANDBOX
    } else {
        exit::OK
    };
    Outcome {
        status,
        stdout: if a.json {
            format!("{}\n", to_json(&value))
        } else {
            text
        },
        stderr: String::new(),
    }
}

fn recover_cmd(a: &RecoverArgs) -> Result<Outcome> {
    if !a.state_dir.is_absolute() {
        return Err(SupervisorError::invalid(
            "--state-dir",
            format!("{} must be an absolute path", a.state_dir.display()),
        ));
    }
    let session = a.session.as_deref().map(SessionId::parse).transpose()?;
    let workspace = a.root.as_deref().map(Workspace::open).transpose()?;
    let state = match &workspace {
        Some(ws) => StateDir::open(&a.state_dir, ws, false)?,
        None => StateDir::at(&a.state_dir),
    };
    let crate::recover::AllRecovery {
        swept,
        sessions,
        dead_warm_cgroups,
        failed,
    } = match (&session, &workspace) {
        (Some(id), Some(ws)) => {
            let session = crate::store::session::Session::open(ws, &state, id, None)?;
            let (_lock, r) = crate::recover::lock_for_write(
                &session,
                &crate::sandbox::cgroup::Place::host(),
                &SystemClock,
            )?;
            crate::recover::AllRecovery {
                sessions: vec![r],
                ..Default::default()
            }
        }
        _ => crate::recover::recover_all(
            &state,
            workspace.as_ref(),
            if a.skip_busy {
                crate::recover::Busy::Skip
            } else {
                crate::recover::Busy::Wait
            },
            &crate::sandbox::cgroup::Place::host(),
            &SystemClock,
        )?,
    };
    let acted: Vec<&crate::recover::SessionRecovery> =
        sessions.iter().filter(|r| !r.is_empty()).collect();
    let stdout = if a.json {
        format!(
            "{}\n",
            to_json(&Recovered {
                sessions_checked: sessions.len(),
                unfinished_creations_removed: swept.clone(),
                dead_warm_cgroups_removed: dead_warm_cgroups.clone(),
                recovered: acted.iter().map(|r| r.to_value()).collect(),
                failed: failed.iter().map(|f| f.to_value()).collect(),
            })
        )
    } else {
        let mut t = format!(
            "{} sessions checked, {} recovered, {} unfinished session creations removed\n",
            sessions.len(),
            acted.len(),
            swept.len()
        );
        for r in &acted {
            t += &format!(
                "{}: {} turn(s) closed, {} journal(s) settled, {} ledger tail(s) settled, {} cgroup(s) and {} turn dir(s) removed\n",
                r.session_id,
                r.closed.len(),
                r.journals.len(),
                r.tails.len(),
                r.cgroups.len(),
                r.turn_dirs.len()
            );
        }
        if !dead_warm_cgroups.is_empty() {
            t += &format!(
                "{} cgroup(s) of warm sandboxes whose owner is dead removed\n",
                dead_warm_cgroups.len()
            );
        }
        for f in &failed {
            t += &format!(
                "{}: NOT recovered: error[{}]: {}\n",
                f.session_id,
                f.error.code().code,
                f.error
            );
        }
        t
    };
    // Every other session is recovered; the exit status is the first
    // failure's (the contract's status for its error).
    Ok(Outcome {
        status: failed.first().map_or(exit::OK, |f| f.error.exit_status()),
        stdout,
        stderr: String::new(),
    })
}

/// `--rootfs`, validated (see [`crate::turn::admit::system_root`]).
fn rootfs(dir: Option<&std::path::Path>, root: &std::path::Path) -> Result<Option<PathBuf>> {
    dir.map(|d| crate::turn::admit::system_root(d, root))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// `parse` builds `run` alone (`RunOnly`): its help, usage and every
    /// argument must be the full tree's `run`, or the two would disagree.
    #[test]
    fn issue_29_run_parsed_alone_is_the_full_trees_run() {
        let run = |mut c: clap::Command| {
            c.build();
            c.find_subcommand("run").cloned().expect("a run subcommand")
        };
        let (mut f, mut a) = (run(Cli::command()), run(RunOnly::command()));
        assert_eq!(
            f.render_long_help().to_string(),
            a.render_long_help().to_string()
        );
        assert_eq!(f.render_help().to_string(), a.render_help().to_string());
        assert_eq!(f.render_usage().to_string(), a.render_usage().to_string());
        let ids = |c: &clap::Command| -> Vec<String> {
            c.get_arguments().map(|x| format!("{x:?}")).collect()
        };
        assert_eq!(ids(&f), ids(&a));
        assert!(f.get_about().is_some(), "run keeps its one-line help");
    }

    /// A `run` command line parses to the same `RunArgs` either way.
    #[test]
    fn issue_29_run_parsed_alone_gives_the_same_arguments() {
        let argv = [
            "supervise",
            "run",
            "--root",
            "/ws",
            "--package",
            "p",
            "--state-dir",
            "/st",
            "--output",
            "out/a:report",
            "--json",
            "--",
            "/bin/true",
            "x",
        ];
        let full = Cli::try_parse_from(argv).expect("full tree parses");
        let alone = RunOnly::try_parse_from(argv).expect("run alone parses");
        let RunOnlyCommand::Run(a) = alone.command;
        let Command::Run(f) = full.command else {
            panic!("not run")
        };
        assert_eq!(format!("{f:?}"), format!("{a:?}"));
    }
}
