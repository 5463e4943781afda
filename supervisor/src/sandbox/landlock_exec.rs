//! `supervise __landlock-exec RULES -- CMD…`: turnstile's init inside an
//! OCI container (the runtime already set namespaces, mounts, uid 65534,
//! no capabilities, no_new_privs and seccomp; Landlock is not in the OCI
//! spec). It applies the Plan's Landlock rules from RULES, reports the
//! outcome as one JSON line on fd 3, waits for the supervisor's go on fd 4
//! (after its posture check from outside), closes both and execs CMD.
//! Any failure exits 125 before CMD runs (fail closed).

use std::io::{Read, Write};
use std::os::fd::FromRawFd;

use turnstile_policy::plan::LandlockRules;

/// Exit status when the init fails before the command runs.
pub const SETUP_FAILED: i32 = 125;

fn fail(what: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "turnstile-init: {what}");
    std::process::exit(SETUP_FAILED)
}

/// Entry point; never returns.
pub fn main(rules: &str, argv: &[std::ffi::OsString]) -> ! {
    // SAFETY: fds 3 and 4 were placed by the supervisor (runc
    // --preserve-fds 2) for this process alone; we own them from here.
    let (mut ready, mut go) = unsafe {
        (
            std::fs::File::from_raw_fd(super::init::READY_FD),
            std::fs::File::from_raw_fd(super::init::GO_FD),
        )
    };
    for f in [&ready, &go] {
        let _ = nix::fcntl::fcntl(
            f,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
    }
    let Some(program) = argv.first() else {
        fail("no command")
    };
    let rules: LandlockRules = std::fs::read(rules)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| fail("cannot read the Landlock rules"));
    let outcome =
        super::landlock::apply(&rules).unwrap_or_else(|e| fail(&format!("landlock: {e}")));
    if outcome.status == "not_enforced" {
        fail("the kernel enforced none of the Landlock rules");
    }
    let mut line = outcome.to_value().to_string();
    line.push('\n');
    if ready.write_all(line.as_bytes()).is_err() {
        fail("the supervisor is gone");
    }
    let mut answer = [0u8; 1];
    if !matches!(go.read(&mut answer), Ok(1)) || answer[0] != b'G' {
        fail("the supervisor did not approve the sandbox posture");
    }
    drop(ready);
    drop(go);
    let err = std::os::unix::process::CommandExt::exec(
        std::process::Command::new(program).args(&argv[1..]),
    );
    let _ = writeln!(
        std::io::stderr(),
        "turnstile-init: exec {}: {err}",
        program.to_string_lossy()
    );
    std::process::exit(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}
