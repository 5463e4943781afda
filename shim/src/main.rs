//! `containerd-shim-turnstile-v2`: a containerd shim v2 (runtime type
//! `io.containerd.turnstile.v2`, CRI handler `turnstile`) that runs each
//! container as one turnstile turn through `supervise run`. See
//! `service` for the lifecycle and `contract` for the annotations.

mod contract;
mod error;
mod service;

fn main() {
    containerd_shim::run::<service::Shim>(
        "io.containerd.turnstile.v2",
        Some(containerd_shim::Config {
            // The shim waits for its one child (`supervise run`) itself, so
            // the exit status it reports is that process's; the library's
            // reaper would race it for the status.
            no_reaper: true,
            ..Default::default()
        }),
    );
}
