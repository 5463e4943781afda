//! The binary a sandbox's init runs from, and its two entry points.
//!
//! A sandbox's PID 1 (`__sandbox-init`) and an OCI container's init
//! (`__landlock-exec`) are separate executions of one of turnstile's
//! binaries, started once per cold turn. Executing `supervise` itself costs
//! what a 59 MB program with seven shared libraries costs before `main`:
//! on this project's 2-core test host ~1.8 ms against ~0.6 ms for
//! `/bin/true` (`hyperfine -N 'supervise --version'`), most of it the
//! mapping and the libraries' initialisers, paid again by every cold turn.
//! So the init has a binary of its own, `turnstile-init`, built from its
//! own crate (`turnstile-init`, which this crate uses as a library: one
//! protocol, the two sides cannot drift) with nothing but these entry
//! points in it, and built static for musl (`cargo xtask` does, see
//! `init/Cargo.toml`): glibc's start-up probes the CPU with `cpuid`, which
//! traps on virtual machines (~1 ms per exec on the test host; a static
//! musl program starts in ~0.2 ms). It needs no library inside an OCI
//! container's root either. `supervise` runs it from beside itself; where
//! it is missing (a copy of `supervise` alone, a plain `cargo build`) the
//! init runs from `supervise` as before: the same code, only slower to
//! start.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The init's own binary's file name, beside `supervise`.
pub const INIT_BINARY: &str = "turnstile-init";

/// The binary to execute for a sandbox's init: `turnstile-init` beside
/// this program if it is there, else this program.
pub fn path() -> std::io::Result<PathBuf> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    let exe = std::env::current_exe()?;
    let sibling = PATH.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let p = exe.parent()?.join(INIT_BINARY);
        let m = std::fs::metadata(&p).ok()?;
        (m.is_file() && m.permissions().mode() & 0o111 != 0).then_some(p)
    });
    Ok(sibling.clone().unwrap_or(exe))
}

/// Runs the init mode `args` names, if they name one (see
/// [`turnstile_init::dispatch`]).
pub use turnstile_init::dispatch;
/// The init's build id and the variable `supervise` hands it in.
pub use turnstile_init::{BUILD_ENV, BUILD_ID};
