//! The waiting stage of an OCI turn's guard (`supervise`'s
//! `backend::hostview::Guard`): `__turn-guard-wait EXE ARGV…`.
//!
//! Started by the supervisor for each OCI turn (a `posix_spawn`: no copy
//! of the supervisor's memory is made or kept), it names itself
//! `turnstile-guard`, closes every descriptor but 0–2, and blocks reading
//! fd 0, a pipe whose write end only the supervisor holds. [`DISARM`] (the
//! supervisor tore its turn down itself) ends it. EOF without it means the
//! supervisor is gone — SIGKILL included — and it execs `EXE ARGV…`, the
//! supervisor's own binary in its guard mode, which ends the dead turn.
//! Waiting is all it does, so it is this small static binary that waits,
//! not a second start of `supervise` per turn.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;

/// argv[1] of the waiting stage.
pub const GUARD_WAIT: &str = "__turn-guard-wait";
/// What the supervisor writes before it lets its guard go.
pub const DISARM: u8 = b'D';
/// What the waiting guard writes on fd 1 once it is waiting.
pub const READY: u8 = b'R';
/// The waiting guard's name (`comm`: 15 bytes at most).
const GUARD_COMM: &std::ffi::CStr = c"turnstile-guard";

/// Runs the waiting stage with `args` = `EXE ARGV…`. Never returns.
pub fn main(args: &[OsString]) -> ! {
    let cstrings: Option<Vec<CString>> = args
        .iter()
        .map(|a| CString::new(a.as_bytes()).ok())
        .collect();
    let Some(argv) = cstrings.filter(|a| a.len() >= 2) else {
        std::process::exit(2)
    };
    let _ = nix::sys::prctl::set_name(GUARD_COMM);
    // Ready, said on fd 1 (a pipe the supervisor reads before its runtime
    // starts the container): an init of another build says nothing and
    // exits, and the supervisor refuses the turn rather than run it
    // unguarded. Then fd 1 is /dev/null like fd 2.
    if std::env::var_os(crate::BUILD_ENV).is_none_or(|b| b != crate::BUILD_ID) {
        std::process::exit(125)
    }
    // A supervisor already gone cannot read it: the write fails with
    // EPIPE (not SIGPIPE, ignored here), and that is the supervisor's
    // death, which the cleanup below answers at once.
    // SAFETY: setting SIGPIPE's disposition to SIG_IGN installs no handler.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    // This process is its own process group, whose only outside link is
    // its parent, the supervisor. When the supervisor dies while the guard
    // is stopped (SIGSTOP, SIGTSTP), the group is orphaned with a stopped
    // member and the kernel sends it SIGHUP then SIGCONT: the SIGCONT
    // resumes it (its default), the SIGHUP would end it before it ended the
    // dead turn — the container, its cgroups and mounts left to a later
    // recovery (kill-point audit). Ignored here, and still ignored in the
    // cleanup stage this execs (an ignored disposition survives execve).
    // SAFETY: setting SIGHUP's disposition to SIG_IGN installs no handler.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGHUP,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    let said = nix::unistd::write(std::io::stdout(), &[READY]);
    let gone = said == Err(nix::errno::Errno::EPIPE);
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    let moved = null.is_ok_and(|f| {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        // SAFETY: dup2(2) onto fd 1 of a descriptor this process holds.
        unsafe { nix::libc::dup2(fd, 1) == 1 }
    });
    if !moved || (said != Ok(1) && !gone) {
        std::process::exit(125)
    }
    // Nothing of the supervisor's (its session lock, pipes, sockets) is
    // held here, whatever was not close-on-exec.
    // SAFETY: close_range(2) on descriptors only; no memory is touched.
    if unsafe { nix::libc::syscall(nix::libc::SYS_close_range, 3u32, u32::MAX, 0u32) } != 0 {
        for fd in 3..65536 {
            // SAFETY: closing a descriptor this process may not hold.
            unsafe { nix::libc::close(fd) };
        }
    }
    if !gone {
        wait_for_disarm();
    }
    let env: [CString; 0] = [];
    let _ = nix::unistd::execve(&argv[0], &argv[1..], &env);
    std::process::exit(127)
}

/// Blocks on fd 0 until the supervisor disarms the guard (exits 0) or is
/// gone (returns).
fn wait_for_disarm() {
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(std::io::stdin(), &mut byte) {
            Ok(1) if byte[0] == DISARM => std::process::exit(0),
            Ok(0) => return,
            Err(nix::errno::Errno::EINTR) | Ok(_) => {}
            // Unreadable: the supervisor cannot be told from here; fail
            // closed (what the cleanup does is idempotent).
            Err(_) => return,
        }
    }
}
