//! `supervise __landlock-exec RULES --init-build=ID [--report-stderr [--allow-unenforced]]
//! -- CMD…`: turnstile's init inside an OCI container (the runtime already
//! set namespaces, mounts, uid 65534, no capabilities, no_new_privs and
//! seccomp; Landlock is not in the OCI spec). It applies the Plan's
//! Landlock rules from RULES, then:
//!
//! - by default (runc, crun) reports the outcome as one JSON line on fd 3,
//!   waits for the supervisor's go on fd 4 (after its posture check from
//!   outside), closes both and execs CMD;
//! - with `--report-stderr` (runsc: no descriptors can be passed in, and
//!   the host cannot inspect a process behind gVisor's sentry) it checks
//!   its own posture through the kernel it runs on (no_new_privs, seccomp
//!   mode, every capability set, uid/gid), writes `{landlock, posture}` as
//!   the first line of stderr after [`REPORT_PREFIX`] — written before CMD
//!   exists, so CMD cannot forge or reorder it — and execs CMD only if the
//!   posture holds.
//!
//! A ruleset the kernel enforces none of stops the turn unless
//! `--allow-unenforced` (the manifest's `allow_degraded` lists Landlock).
//! Any failure exits 125 before CMD runs (fail closed).

use std::io::{Read, Write};
use std::os::fd::FromRawFd;

use serde_json::{Value, json};
use turnstile_oci::{ALLOW_UNENFORCED_FLAG, INIT_BUILD_FLAG, REPORT_PREFIX, REPORT_STDERR_FLAG};
use turnstile_policy::plan::LandlockRules;

/// Exit status when the init fails before the command runs.
pub const SETUP_FAILED: i32 = 125;

fn fail(what: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "turnstile-init: {what}");
    std::process::exit(SETUP_FAILED)
}

/// The init's options (argv after the rules path, up to `--`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mode {
    pub report_stderr: bool,
    pub allow_unenforced: bool,
    /// `--init-build=ID` named this init's own build (`crate::BUILD_ID`);
    /// [`main`] refuses to run without it.
    pub build_checked: bool,
}

impl Mode {
    /// Parses the flags; anything else is refused.
    pub fn parse(flags: &[std::ffi::OsString]) -> Result<Self, String> {
        let mut m = Self::default();
        for f in flags {
            match f.to_str() {
                Some(REPORT_STDERR_FLAG) => m.report_stderr = true,
                Some(ALLOW_UNENFORCED_FLAG) => m.allow_unenforced = true,
                Some(b) if b.starts_with(&format!("{INIT_BUILD_FLAG}=")) => {
                    let id = &b[INIT_BUILD_FLAG.len() + 1..];
                    if id != crate::BUILD_ID {
                        return Err(format!(
                            "init build: this turnstile-init (build {}) is not from the sources of the supervise that made the bundle (build {id}): \
                             rebuild both (`cargo xtask build`), or remove turnstile-init to run the init from supervise",
                            crate::BUILD_ID
                        ));
                    }
                    m.build_checked = true;
                }
                _ => return Err(format!("unknown init flag {}", f.to_string_lossy())),
            }
        }
        Ok(m)
    }
}

/// Entry point; never returns.
pub fn main(rules: &str, mode: Mode, argv: &[std::ffi::OsString]) -> ! {
    if !mode.build_checked {
        fail(&format!(
            "init build: no {INIT_BUILD_FLAG}: the bundle was not made by a supervise of this init's build ({})",
            crate::BUILD_ID
        ))
    }
    let Some(program) = argv.first() else {
        fail("no command")
    };
    let rules: LandlockRules = std::fs::read(rules)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| fail("cannot read the Landlock rules"));
    let outcome = match super::landlock::apply(&rules) {
        Ok(o) if o.status != "not_enforced" => o.to_value(),
        Ok(o) if mode.allow_unenforced => o.to_value(),
        Err(e) if mode.allow_unenforced => {
            json!({"status": "not_enforced", "kernel_abi": null, "error": e})
        }
        Ok(_) => fail("the kernel enforced none of the Landlock rules"),
        Err(e) => fail(&format!("landlock: {e}")),
    };
    if mode.report_stderr {
        let failures = self_posture();
        let report = json!({"landlock": outcome, "posture": {"failures": failures}});
        let line = format!("{REPORT_PREFIX}{report}\n");
        // One write, before the command exists.
        if std::io::stderr().write_all(line.as_bytes()).is_err() {
            std::process::exit(SETUP_FAILED);
        }
        if !failures.is_empty() {
            fail("the sandbox posture does not hold; the command was not run");
        }
    } else {
        handshake(&outcome);
    }
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

/// Reports on fd 3, waits for the go on fd 4.
fn handshake(outcome: &Value) {
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
    let mut line = outcome.to_string();
    line.push('\n');
    if ready.write_all(line.as_bytes()).is_err() {
        fail("the supervisor is gone");
    }
    let mut answer = [0u8; 1];
    if !matches!(go.read(&mut answer), Ok(1)) || answer[0] != b'G' {
        fail("the supervisor did not approve the sandbox posture");
    }
}

/// This process's posture as the kernel it runs on reports it: what
/// `turnstile_supervisor::sandbox::posture::check` verifies from outside, minus the namespace
/// comparison (the supervisor's namespaces are not visible from here).
fn self_posture() -> Vec<String> {
    let mut failures = Vec::new();
    match nix::sys::prctl::get_no_new_privs() {
        Ok(true) => {}
        other => failures.push(format!("no_new_privs is {other:?}, expected set")),
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let seccomp = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .map(str::trim);
    if seccomp != Some("2") {
        failures.push(format!("seccomp mode is {seccomp:?}, expected 2 (filter)"));
    }
    for set in [
        caps::CapSet::Permitted,
        caps::CapSet::Effective,
        caps::CapSet::Inheritable,
        caps::CapSet::Bounding,
        caps::CapSet::Ambient,
    ] {
        match caps::read(None, set) {
            Ok(held) if held.is_empty() => {}
            Ok(held) => failures.push(format!("{set:?} holds {held:?}")),
            // A set the runtime's kernel does not report (gVisor has no
            // ambient set) holds nothing we could use.
            Err(_) if matches!(set, caps::CapSet::Ambient) => {}
            Err(e) => failures.push(format!("{set:?} unreadable: {e}")),
        }
    }
    let ids = nix::unistd::getresuid()
        .map(|r| [r.real.as_raw(), r.effective.as_raw(), r.saved.as_raw()])
        .unwrap_or([0; 3]);
    let gids = nix::unistd::getresgid()
        .map(|r| [r.real.as_raw(), r.effective.as_raw(), r.saved.as_raw()])
        .unwrap_or([0; 3]);
    for (name, v) in [("uid", ids), ("gid", gids)] {
        if v.contains(&0) || v.iter().any(|x| *x != v[0]) {
            failures.push(format!("{name}s are {v:?}, expected one non-root id"));
        }
    }
    failures.sort();
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_flags_parse_and_anything_else_is_refused() {
        let os = |v: &[&str]| -> Vec<std::ffi::OsString> { v.iter().map(Into::into).collect() };
        assert_eq!(Mode::parse(&[]).unwrap(), Mode::default());
        let own = format!("--init-build={}", crate::BUILD_ID);
        assert_eq!(
            Mode::parse(&os(&[&own, "--report-stderr", "--allow-unenforced"])).unwrap(),
            Mode {
                report_stderr: true,
                allow_unenforced: true,
                build_checked: true,
            }
        );
        assert!(Mode::parse(&os(&["--go"])).is_err());
        // Another build's bundle: refused, and the message says what to do.
        let other = Mode::parse(&os(&["--init-build=0000000000000000"])).unwrap_err();
        assert!(other.contains("cargo xtask build"), "{other}");
    }
}
