//! `turnstile-init`: a sandbox's PID 1 and an OCI container's init, the
//! two modes `supervise` runs inside a sandbox, in a binary of their own
//! so that a cold turn does not pay `supervise`'s start-up twice (see
//! `turnstile_supervisor::sandbox::initbin`, and this crate's Cargo.toml for how it is built).

use std::process::ExitCode;

/// Static for musl, the init allocates with dlmalloc, not musl's mallocng
/// (see Cargo.toml). The init is single-threaded, its forks too.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    turnstile_init::dispatch(&args).unwrap_or_else(|| {
        eprintln!(
            "turnstile-init: started by supervise only (`__sandbox-init`, `__landlock-exec RULES [FLAGS] -- CMD`, or `__turn-guard-wait EXE ARGV…`)"
        );
        ExitCode::from(2)
    })
}
