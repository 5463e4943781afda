//! The binary a sandbox's init runs from, and its two entry points.
//!
//! A sandbox's PID 1 (`__sandbox-init`) and an OCI container's init
//! (`__landlock-exec`) are separate executions of one of turnstile's
//! binaries, started once per cold turn. Executing `supervise` itself costs
//! what a 59 MB program with seven shared libraries costs before `main`:
//! on this project's 2-core test host ~1.8 ms against ~0.6 ms for
//! `/bin/true` (`hyperfine -N 'supervise --version'`), most of it the
//! mapping and the libraries' initialisers, paid again by every cold turn.
//! So the init has a binary of its own, `turnstile-init`, built from the
//! same sources (the same crate, the same build: the protocol between the
//! two cannot drift) with nothing but these entry points in it.
//! `supervise` runs it from beside itself; where it is missing (a copy of
//! `supervise` alone) the init runs from `supervise` as before: the same
//! code, only slower to start.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;

use super::{init, landlock_exec};

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

/// Runs the init mode `args` names (`__sandbox-init`, `__landlock-exec
/// RULES [FLAGS] -- CMD…`), which never return; `None` when `args` name
/// neither, an exit status when they are malformed.
pub fn dispatch(args: &[OsString]) -> Option<ExitCode> {
    if args.len() == 2 && args[1] == init::SANDBOX_INIT {
        let dir = std::env::var_os(init::TURN_DIR_ENV).unwrap_or_default();
        init::main(std::path::Path::new(&dir));
    }
    if args.len() >= 4 && args[1] == turnstile_oci::config::LANDLOCK_EXEC {
        let rules = args[2].to_string_lossy().into_owned();
        let dashes = args.iter().skip(3).position(|a| a == "--").map(|i| i + 3);
        let Some(dashes) = dashes else {
            eprintln!("turnstile-init: usage: __landlock-exec RULES [FLAGS] -- CMD");
            return Some(ExitCode::from(landlock_exec::SETUP_FAILED as u8));
        };
        match landlock_exec::Mode::parse(&args[3..dashes]) {
            Ok(mode) => landlock_exec::main(&rules, mode, &args[dashes + 1..]),
            Err(e) => {
                eprintln!("turnstile-init: {e}");
                return Some(ExitCode::from(landlock_exec::SETUP_FAILED as u8));
            }
        }
    }
    None
}
