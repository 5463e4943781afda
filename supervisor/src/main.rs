//! `supervise`: the command-line edge of turnstile.

use std::io::Write;
use std::process::ExitCode;

use turnstile_supervisor::cli;

fn main() -> ExitCode {
    // The sandbox's own init (also its own binary, turnstile-init: see
    // sandbox::initbin) runs before anything else: no logging, no clap.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = turnstile_supervisor::sandbox::initbin::dispatch(&args) {
        return code;
    }
    // An OCI turn's guard (backend::runc::GUARD): no logging, no clap.
    if args.len() >= 2 && args[1] == turnstile_supervisor::backend::runc::GUARD {
        turnstile_supervisor::backend::runc::guard_main(&args[2..]);
    }
    // The daemon logs JSON by default (a span per turn and per phase); its
    // turn workers log as `supervise run` does, to the client's stderr;
    // `--log-format` chooses.
    let format = cli::LogFormat::from_args(&args);
    let json = format == cli::LogFormat::Json;
    let filter = tracing_subscriber::EnvFilter::try_from_env("TURNSTILE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(if json { "info" } else { "warn" }));
    // With the `otlp` feature and an OTEL_EXPORTER_OTLP_* endpoint, the
    // spans are exported too (flushed when `_otlp` drops, at exit).
    #[cfg(feature = "otlp")]
    let (otlp, _otlp) = {
        let p = turnstile_supervisor::cli::otlp::from_env();
        let layer = p.as_ref().map(turnstile_supervisor::cli::otlp::layer);
        (layer, p.map(turnstile_supervisor::cli::otlp::guard))
    };
    #[cfg(not(feature = "otlp"))]
    let otlp: Option<tracing_subscriber::layer::Identity> = None;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let registry = tracing_subscriber::registry().with(filter).with(otlp);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    if json {
        registry
            .with(
                fmt.json()
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE),
            )
            .init();
    } else {
        registry.with(fmt).init();
    }
    if args.len() == 2 && args[1] == turnstile_supervisor::serve::worker::SERVE_WORKER {
        return ExitCode::from(turnstile_supervisor::serve::worker::main());
    }

    // clap exits 2 on a usage error and 0 for --help/--version.
    let outcome = cli::run(cli::parse());
    // A closed stdout/stderr must not turn into a panic.
    let _ = std::io::stdout().write_all(outcome.stdout.as_bytes());
    let _ = std::io::stderr().write_all(outcome.stderr.as_bytes());
    ExitCode::from(outcome.status)
}
