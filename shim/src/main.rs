//! `containerd-shim-turnstile-v2`: a containerd shim v2 (runtime type
//! `io.containerd.turnstile.v2`, CRI handler `turnstile`) that runs each
//! container as one turnstile turn through `supervise run`. See
//! `service` for the lifecycle, `runner` for the seam it drives turns
//! through, `contract` for the annotations and `workspaces` for which host
//! directories a container may use.

use containerd_shim_turnstile_v2::service;

use std::os::fd::IntoRawFd;
use std::sync::Arc;

use containerd_shim::Shim as _;
use containerd_shim::protos::shim_sync::create_task;
use containerd_shim::protos::ttrpc::Server;

const RUNTIME_ID: &str = "io.containerd.turnstile.v2";

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let flags = containerd_shim::parse(args.get(1..).unwrap_or_default());
    match flags {
        // The daemon (no action): served here, see `serve`.
        Ok(f) if f.action.is_empty() && !f.info && !f.version && !f.namespace.is_empty() => {
            if let Err(e) = serve(&f) {
                eprintln!("{RUNTIME_ID}: {e}");
                std::process::exit(1);
            }
        }
        // start, delete, -info, -v: the library's bootstrap.
        _ => containerd_shim::run::<service::Shim>(RUNTIME_ID, None),
    }
}

/// The shim daemon: the Task service on the socket containerd named.
///
/// Served here rather than by the library because containerd-shim 0.12
/// registers only `containerd.task.v3.Task` (containerd 2.x), while
/// containerd 1.6 (Debian bookworm's 1.6.20) calls `containerd.task.v2.Task`
/// — the same messages under the older name. Both names are registered.
/// Like the library, the daemon is a child subreaper, logs to the `log`
/// fifo, and tells the `start` process it is up by closing its stdout.
fn serve(flags: &containerd_shim::Flags) -> Result<(), String> {
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("set subreaper: {e}"))?;
    containerd_shim::logger::init(flags.debug, "info", &flags.namespace, &flags.id)
        .map_err(|e| format!("logger: {e}"))?;
    let ttrpc_address =
        std::env::var("TTRPC_ADDRESS").map_err(|e| format!("TTRPC_ADDRESS: {e}"))?;
    let publisher = containerd_shim::publisher::RemotePublisher::new(&ttrpc_address)
        .map_err(|e| format!("publisher: {e}"))?;
    let mut config = containerd_shim::Config::default();
    let mut shim = service::Shim::new(RUNTIME_ID, flags, &mut config);
    let task: Arc<dyn containerd_shim::Task + Send + Sync> =
        Arc::new(shim.create_task_service(publisher));
    let v3 = create_task(task.clone());
    let v2 = create_task(task)
        .into_iter()
        .map(|(k, v)| {
            (
                k.replace("/containerd.task.v3.Task/", "/containerd.task.v2.Task/"),
                v,
            )
        })
        .collect();
    let path = flags
        .socket
        .strip_prefix("unix://")
        .unwrap_or(&flags.socket);
    let path = std::path::Path::new(path);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    // A socket left by a dead daemon of this very container.
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| format!("listen on {}: {e}", path.display()))?;
    let mut server = Server::new()
        .add_listener(listener.into_raw_fd())
        .map_err(|e| format!("ttrpc: {e}"))?
        .register_service(v3)
        .register_service(v2);
    server.start().map_err(|e| format!("ttrpc: {e}"))?;
    // The start process copies our stdout until it closes: we are up.
    nix::unistd::dup2_stdout(std::io::stderr()).map_err(|e| format!("close stdout: {e}"))?;
    containerd_shim::info!("shim serving on {}", path.display());
    shim.wait();
    containerd_shim::info!("shutting down");
    server.shutdown();
    let _ = std::fs::remove_file(path);
    Ok(())
}
