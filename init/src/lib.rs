//! What runs inside a turnstile sandbox: a native turn's init (S1/S2/S3,
//! [`init`]) and the Landlock step an OCI container's process runs before
//! its command ([`landlock_exec`]), with the pieces they share with the
//! supervisor — the mount plan, the init's report protocol, the order of
//! restrictions, the turn directory's names.
//!
//! The supervisor (`turnstile-supervisor`) uses this crate as a library (it
//! reads the protocol, prints the mount plan, and runs the init itself when
//! no `turnstile-init` binary is beside it); the `turnstile-init` binary is
//! [`dispatch`] alone. One crate, one protocol: the two sides cannot drift.
//! It carries no supervisor dependency (libseccomp, libbpf, clap…), so the
//! binary is small and builds for a static, libc-light target.

use std::ffi::OsString;
use std::process::ExitCode;

/// A hash of the sources the init's protocol is made of (init/build.rs):
/// `supervise` passes its own in [`BUILD_ENV`], and an init built from
/// other sources refuses the turn (a stale `turnstile-init` beside a
/// rebuilt `supervise` fails closed, and says how to fix it).
pub const BUILD_ID: &str = env!("TURNSTILE_INIT_BUILD_ID");
/// The variable that carries [`BUILD_ID`] to the init.
pub const BUILD_ENV: &str = "TURNSTILE_INIT_BUILD";

pub mod guard;
pub mod init;
pub mod landlock;
pub mod landlock_exec;
pub mod mountplan;
pub mod protocol;
pub mod restrict;
pub mod sys;
pub mod turnpaths;

/// Runs the init mode `args` names (`__sandbox-init`, `__landlock-exec
/// RULES [FLAGS] -- CMD…`, an OCI turn guard's `__turn-guard-wait EXE
/// ARGV…`), which never return; `None` when `args` name
/// neither, an exit status when they are malformed.
pub fn dispatch(args: &[OsString]) -> Option<ExitCode> {
    if args.len() == 2 && args[1] == init::SANDBOX_INIT {
        let dir = std::env::var_os(init::TURN_DIR_ENV).unwrap_or_default();
        init::main(std::path::Path::new(&dir));
    }
    if args.len() >= 4 && args[1] == guard::GUARD_WAIT {
        guard::main(&args[2..]);
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
