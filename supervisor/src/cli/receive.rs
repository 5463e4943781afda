//! `supervise receive`: one ARA turn (issue 28) — an envelope in, the
//! agent's envelopes out (see `turn::receive`).

use std::path::PathBuf;

use clap::Args;
use turnstile_policy::envelope::EventEnvelope;

use super::{Common, DeterministicArgs, parse_output_flag};
use crate::error::{Result, SupervisorError};
use crate::turn::outcome::Outcome;
use crate::turn::receive::ReceiveInput;

/// Largest input envelope read.
pub const MAX_ENVELOPE_BYTES: u64 = 1 << 20;

#[derive(Debug, Args)]
pub struct ReceiveArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, value_name = "PKG")]
    pub package: String,
    /// Receive in this session (default: start a new one). A key received
    /// twice in one session runs the agent once.
    #[arg(long, value_name = "SID")]
    pub session: Option<String>,
    /// The input EventEnvelope v1 (JSON).
    #[arg(long, value_name = "FILE")]
    pub envelope: PathBuf,
    /// A declared output, `PATH:ROLE` (repeatable; default none: the
    /// agent writes nothing).
    #[arg(long = "output", value_name = "PATH:ROLE")]
    pub outputs: Vec<String>,
    /// A declared input path (repeatable).
    #[arg(long = "input", value_name = "PATH")]
    pub inputs: Vec<String>,
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// System configuration (see `run --config`).
    #[arg(long, value_name = "FILE", default_value = crate::backend::select::DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Only for the new session `receive` starts without --session.
    #[command(flatten)]
    pub deterministic: DeterministicArgs,
    /// Send the receive to a `supervise serve` daemon on SOCKET.
    #[arg(long, value_name = "SOCKET")]
    pub server: Option<PathBuf>,
}

/// Reads and validates the input envelope (a FIFO, device or symlink is
/// refused without blocking).
pub fn read_envelope(file: &std::path::Path) -> Result<EventEnvelope> {
    let bytes = turnstile_policy::input::read_regular_file(file, MAX_ENVELOPE_BYTES)
        .map_err(|e| SupervisorError::invalid("--envelope", format!("{}: {e}", file.display())))?;
    Ok(EventEnvelope::from_json(&bytes)?)
}

pub fn receive(a: &ReceiveArgs) -> Result<Outcome> {
    let envelope = read_envelope(&a.envelope)?;
    let deterministic = a.deterministic.parse()?;
    if deterministic.is_some() && a.session.is_some() {
        return Err(SupervisorError::invalid(
            "--deterministic",
            "deterministic mode is a property of the session: start it with `session new --deterministic` (or without --session)",
        ));
    }
    let outputs = a
        .outputs
        .iter()
        .map(|o| parse_output_flag(o))
        .collect::<Result<Vec<_>>>()?;
    let request = crate::turn::receive::request(
        &a.common.root,
        &a.package,
        &envelope,
        0,
        a.inputs.clone(),
        Some(outputs),
        a.timeout,
    )?;
    if let Some(socket) = &a.server {
        use crate::serve::client::{absolute, request_doc};
        let wire = crate::serve::wire::RunRequest {
            root: absolute(&a.common.root)?,
            package: a.package.clone(),
            session: a.session.clone(),
            state_dir: None,
            backend: None,
            tenant: None,
            config: Some(absolute(&a.config)?),
            rootfs: None,
            json: a.common.json,
            events: None,
            deterministic: deterministic
                .as_ref()
                .map(|d| crate::serve::wire::DeterministicWire {
                    seed: d.seed,
                    clock: turnstile_policy::timefmt::rfc3339_micros(d.clock),
                }),
            request: request_doc(&request),
            receive: Some(crate::serve::wire::ReceiveWire {
                envelope: serde_json::to_value(&envelope).unwrap_or_default(),
                hop: 0,
                attempt: 0,
            }),
        };
        return crate::serve::client::run(socket, &wire);
    }
    let opts = crate::turn::RunOptions {
        forward_all_output: false,
        on_durable: None,
        root: a.common.root.clone(),
        state_dir: a.common.state_dir.clone(),
        package: a.package.clone(),
        session: a.session.clone(),
        request,
        json: a.common.json,
        cgroup_place: crate::sandbox::cgroup::Place::host(),
        sources: crate::ids::Sources::system(),
        backend: Some("native".into()),
        tenant: None,
        pool: None,
        between: None,
        interrupts: crate::turn::interrupt::Interrupts::default(),
        config: a.config.clone(),
        deterministic,
        rootfs: None,
        receive: Some(ReceiveInput { envelope, hop: 0 }),
        manifest: None,
    };
    let (outcome, value) = crate::turn::outcome::run_turn_outcome(&opts, None);
    Ok(crate::turn::receive::render(a.common.json, outcome, value).0)
}
