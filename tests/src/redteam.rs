//! The red-team suite: hostile turns run through the real `supervise run`,
//! each with the errno / signal / status it must end with and host-side
//! oracles for what must NOT have happened.
//!
//! Every probe is checked against generic oracles too: the workspace outside
//! the probe's own session directories is byte-identical afterwards, a
//! canary outside the workspace is untouched, no cgroup of the turn is left
//! and both ledgers verify. A probe whose oracle fails, or whose blocked
//! operation reports success, is an ESCAPE. A probe that ends differently
//! than expected without escaping is UNEXPECTED; both fail the suite.
//!
//! Probes are non-destructive: dangerous files are opened, not written;
//! syscalls get invalid pointers so "blocked by the filter" (EPERM/ENOSYS)
//! differs from "reached the kernel" (EFAULT/EINVAL).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::{Fixture, supervise_bin};

/// The package every probe runs as.
pub const MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["installed/rt/**", "data/**"],
    "write": ["output/<session_id>/**"],
    "execute": ["/usr/bin/python3", "/bin/sh", "/bin/sleep"],
    "forbidden": ["data/secret/**"]
  },
  "limits": {"memory": "128Mi", "pids": 64, "timeout_seconds": 4, "disk": "32Mi",
             "files": 500, "output_bytes": "64Ki"}
}"#;

/// [`MANIFEST`] with the turn timeout from `TURNSTILE_REDTEAM_TIMEOUT`
/// (seconds, 1-600) when set: the VM tests raise it because a loaded
/// QEMU guest without KVM is several times slower than the host, and a
/// probe that must hit the pids limit (thread_bomb_limited) must not time
/// out first. Every expectation stays as strict.
pub fn manifest() -> String {
    let secs = std::env::var("TURNSTILE_REDTEAM_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| (1..=600).contains(s));
    let m = match secs {
        Some(s) => MANIFEST.replace(
            r#""timeout_seconds": 4,"#,
            &format!(r#""timeout_seconds": {s},"#),
        ),
        None => MANIFEST.to_owned(),
    };
    // gVisor has no Landlock, and an older kernel lacks some of its rights
    // (`TURNSTILE_TEST_ALLOW_DEGRADED=landlock`, set by the VM tests on
    // such kernels): the package accepts that there — the point of the
    // suite is what holds without it.
    if backend() == "runsc" || crate::allow_degraded_landlock() {
        m.replacen('{', "{\n  \"allow_degraded\": [\"landlock\"],", 1)
    } else {
        m
    }
}

/// Helpers every python probe gets.
const PRELUDE: &str = r#"
import os, sys, errno, ctypes, socket, signal, stat, mmap
libc = ctypes.CDLL(None, use_errno=True)
SID = os.environ.get("TURNSTILE_SESSION_ID", "")
OUT = f"output/{SID}"
def res(x):
    print("RESULT", x, file=sys.stderr, flush=True)
def err(f):
    try:
        f()
        return "OK"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def sysc(nr, *a):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x if x < (1 << 63) else x - (1 << 64)) for x in a])
    e = ctypes.get_errno()
    return "OK" if r >= 0 else errno.errorcode.get(e, str(e))
def native(code):
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(code)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    return ctypes.CFUNCTYPE(ctypes.c_long)(addr)()
"#;

/// How a probe must end.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    /// Acceptable `supervise run` exit statuses.
    pub status: &'static [i32],
    /// Acceptable `RESULT` tokens (empty: not checked).
    pub result: &'static [&'static str],
    /// The signal that must end the command (`A|B`: either).
    pub signal: Option<&'static str>,
}

const fn ok(result: &'static [&'static str]) -> Expect {
    Expect {
        status: &[0],
        result,
        signal: None,
    }
}

/// What a probe runs.
#[derive(Debug, Clone, Copy)]
pub enum Body {
    /// Python code (after the prelude), with declared outputs.
    Py {
        code: &'static str,
        outputs: &'static [&'static str],
    },
    /// A shell script.
    Sh(&'static str),
    /// `supervise run` arguments after `--package rt` (request validation).
    Cli(&'static [&'static str]),
    /// A committed setup turn, then the attack in the same session.
    Then {
        setup: &'static str,
        setup_outputs: &'static [&'static str],
        code: &'static str,
        outputs: &'static [&'static str],
    },
    /// Python code run by a supervisor that inherited an open, writable,
    /// non-close-on-exec descriptor (fd 9) on the host canary.
    LeakedFd(&'static str),
}

/// What an oracle sees.
#[derive(Debug)]
pub struct Ctx<'a> {
    pub root: &'a Path,
    pub state: &'a Path,
    pub canary: &'a Path,
    pub sid: Option<String>,
    pub json: Value,
    pub stderr: String,
}

pub type Oracle = fn(&Ctx<'_>) -> Result<(), String>;

#[derive(Debug, Clone, Copy)]
pub struct Probe {
    pub name: &'static str,
    pub family: &'static str,
    pub body: Body,
    pub expect: Expect,
    /// What the probe proves, and which layer covers it.
    pub note: &'static str,
    pub oracle: Option<Oracle>,
}

macro_rules! probe {
    ($name:literal, $family:literal, $body:expr, $expect:expr, $note:literal) => {
        Probe {
            name: $name,
            family: $family,
            body: $body,
            expect: $expect,
            note: $note,
            oracle: None,
        }
    };
    ($name:literal, $family:literal, $body:expr, $expect:expr, $note:literal, $oracle:expr) => {
        Probe {
            name: $name,
            family: $family,
            body: $body,
            expect: $expect,
            note: $note,
            oracle: Some($oracle),
        }
    };
}

const fn py(code: &'static str) -> Body {
    Body::Py { code, outputs: &[] }
}

const fn py_out(code: &'static str, outputs: &'static [&'static str]) -> Body {
    Body::Py { code, outputs }
}

const EPERM: Expect = ok(&["EPERM"]);
const EACCES: Expect = ok(&["EACCES"]);
const ENOSYS: Expect = ok(&["ENOSYS"]);
const ENOENT: Expect = ok(&["ENOENT"]);
const EROFS: Expect = ok(&["EROFS"]);
const SIGSYS: Expect = Expect {
    status: &[10],
    result: &[],
    signal: Some("SIGSYS"),
};
const BLOCKED: Expect = Expect {
    status: &[12],
    result: &[],
    signal: None,
};
const LIMIT: Expect = Expect {
    status: &[13],
    result: &[],
    signal: None,
};
const BAD_INPUT: Expect = Expect {
    status: &[2],
    result: &[],
    signal: None,
};

fn session_file(ctx: &Ctx<'_>, rel: &str) -> Option<PathBuf> {
    ctx.sid
        .as_ref()
        .map(|s| ctx.root.join(rel.replace("<sid>", s)))
}

fn absent(ctx: &Ctx<'_>, rel: &str) -> Result<(), String> {
    match session_file(ctx, rel) {
        Some(p) if p.symlink_metadata().is_ok() => {
            Err(format!("{} exists on the host", p.display()))
        }
        _ => Ok(()),
    }
}

fn evidence_last(ctx: &Ctx<'_>) -> Value {
    let Some(sid) = &ctx.sid else {
        return Value::Null;
    };
    let path = ctx
        .root
        .join("planes/ho1/sessions")
        .join(sid)
        .join("ledger/evidence.jsonl");
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.lines().last().and_then(|l| serde_json::from_str(l).ok()))
        .unwrap_or(Value::Null)
}

/// Every syscall of the deny table, by x86_64 number, with arguments that
/// are harmless should the filter let it through (invalid pointers or
/// descriptors, no-op values); prints `name=ERRNO …`.
const DENIED_SYSCALLS: &str = r#"calls = {
    'acct': (163, 0), 'add_key': (248, 0, 0, 0, 0, 0), 'adjtimex': (159, 0),
    'bpf': (321, 0, 0, 0), 'chroot': (161, 0), 'clock_adjtime': (305, 0, 0),
    'clock_settime': (227, 0, 0), 'delete_module': (176, 0, 0),
    'fanotify_init': (300, 0, 0), 'finit_module': (313, 0xffffffff, 0, 0),
    'fsconfig': (431, 0xffffffff, 0, 0, 0, 0), 'fsmount': (432, 0xffffffff, 0, 0),
    'fsopen': (430, 0, 0), 'fspick': (433, 0xffffffff, 0, 0),
    'init_module': (175, 0, 0, 0), 'io_uring_enter': (426, 0xffffffff, 0, 0, 0, 0, 0),
    'io_uring_register': (427, 0xffffffff, 0, 0, 0), 'io_uring_setup': (425, 1, 0),
    'ioperm': (173, 0, 0, 0), 'iopl': (172, 0), 'kcmp': (312, 0, 0, 99, 0, 0),
    'kexec_file_load': (320, 0xffffffff, 0xffffffff, 0, 0, 0), 'kexec_load': (246, 0, 0, 0, 0),
    'keyctl': (250, 0xffff, 0, 0, 0, 0), 'lookup_dcookie': (212, 0, 0, 0),
    'memfd_secret': (447, 0xffff), 'migrate_pages': (256, 0, 0, 0, 0),
    'mount': (165, 0, 0, 0, 0, 0), 'mount_setattr': (442, 0xffffffff, 0, 0, 0, 0),
    'move_mount': (429, 0xffffffff, 0, 0xffffffff, 0, 0), 'move_pages': (279, 0, 0, 0, 0, 0, 0),
    'name_to_handle_at': (303, 0xffffffff, 0, 0, 0, 0),
    'open_by_handle_at': (304, 0xffffffff, 0, 0), 'open_tree': (428, 0xffffffff, 0, 0),
    'perf_event_open': (298, 0, 0, 0, 0, 0), 'pidfd_getfd': (438, 0xffffffff, 0, 0),
    'pivot_root': (155, 0, 0), 'process_madvise': (440, 0xffffffff, 0, 0, 0, 0),
    'process_vm_readv': (310, 0, 0, 0, 0, 0, 0), 'process_vm_writev': (311, 0, 0, 0, 0, 0, 0),
    'ptrace': (101, 0xdead, 0, 0, 0), 'quotactl': (179, 0, 0, 0, 0),
    'quotactl_fd': (443, 0xffffffff, 0, 0, 0), 'reboot': (169, 0, 0, 0, 0),
    'request_key': (249, 0, 0, 0, 0), 'setdomainname': (171, 0, 0),
    'sethostname': (170, 0, 0), 'setns': (308, 0xffffffff, 0), 'settimeofday': (164, 0, 0),
    'swapoff': (168, 0), 'swapon': (167, 0, 0), 'syslog': (103, 10, 0, 0),
    'umount2': (166, 0, 0), 'uselib': (134, 0),
    'userfaultfd': (323, 0xffff), 'ustat': (136, 0, 0), 'vhangup': (153,),
}
res(' '.join(f'{n}={sysc(*a)}' for n, a in calls.items()))"#;

/// Every name the policy denies was called, answered EPERM, and recorded
/// by the seccomp layer (so a policy entry without a probe call, or a
/// refusal the kernel made instead of the filter, fails).
fn deny_table_held(ctx: &Ctx<'_>) -> Result<(), String> {
    let result = ctx
        .stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .ok_or("no RESULT line")?;
    let seen: BTreeMap<&str, &str> = result
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let evidence = evidence_last(ctx);
    let recorded: Vec<&str> = evidence["violations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["layer"] == "seccomp")
        .filter_map(|v| v["target"].as_str())
        .collect();
    // OCI runtimes load the filter without a listener: refused, not
    // recorded (the evidence says seccomp denials are not observed there).
    let observed = evidence["enforcement"]["denials_observed"]["seccomp"]["observed"] == true;
    let mut wrong = Vec::new();
    for name in turnstile_policy::seccomp::SeccompProfile::default_profile().deny {
        match seen.get(name.as_str()) {
            Some(&"EPERM") if recorded.contains(&name.as_str()) || !observed => {}
            Some(&"EPERM") => wrong.push(format!("{name}: EPERM but not recorded by seccomp")),
            Some(e) => wrong.push(format!("{name}: {e}")),
            None => wrong.push(format!("{name}: not called by the probe")),
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// All probes.
pub fn probes() -> Vec<Probe> {
    vec![
        // ---- leaked descriptors, working directories, host binaries --------
        probe!(
            "fd_table_is_std_only",
            "fd-leak",
            py(
                "fds = sorted(int(f) for f in os.listdir('/proc/self/fd')); res('std-only' if fds == [0, 1, 2, 3] else fds)"
            ),
            ok(&["std-only"]),
            "only 0-2 reach the command (3 is listdir's own); posture check verifies it from outside"
        ),
        probe!(
            "inherited_host_fd_is_closed",
            "fd-leak",
            Body::LeakedFd("res(err(lambda: os.write(9, b'escaped')))"),
            ok(&["EBADF"]),
            "a writable host fd leaked to supervise never reaches the turn (init marks every inherited fd close-on-exec)",
            |c| match std::fs::read(c.canary.join("canary.txt")) {
                Ok(b) if b.is_empty() => Ok(()),
                Ok(b) => Err(format!("canary written: {:?}", String::from_utf8_lossy(&b))),
                Err(e) => Err(format!("canary unreadable: {e}")),
            }
        ),
        probe!(
            "no_descriptor_above_stderr",
            "fd-leak",
            py(
                "open_fds = [fd for fd in range(3, 1024) if err(lambda: os.fstat(fd)) == 'OK']; res('none' if open_fds == [] else open_fds)"
            ),
            ok(&["none"]),
            "fstat on every fd 3..1023"
        ),
        probe!(
            "proc_self_exe_is_the_command",
            "fd-leak",
            py(
                "res('python' if 'python' in os.readlink('/proc/self/exe') else os.readlink('/proc/self/exe'))"
            ),
            ok(&["python"]),
            "/proc/self/exe is the command, not the supervisor (re-exec, not a shared binary)"
        ),
        probe!(
            "proc_1_exe_unopenable",
            "fd-leak",
            py("res(err(lambda: open('/proc/1/exe', 'rb')))"),
            EACCES,
            "pid 1 of the turn is root-owned supervise: ptrace-mode access check refuses uid 65534"
        ),
        probe!(
            "proc_1_exe_unexecutable",
            "fd-leak",
            py("res(err(lambda: os.execv('/proc/1/exe', ['x'])))"),
            EACCES,
            "no re-exec of the supervisor binary from inside"
        ),
        probe!(
            "proc_1_root_unlistable",
            "fd-leak",
            py("res(err(lambda: os.listdir('/proc/1/root')))"),
            EACCES,
            "pid 1's root (and through it, nothing of the host) is unreachable"
        ),
        probe!(
            "proc_1_cwd_unlistable",
            "fd-leak",
            py("res(err(lambda: os.listdir('/proc/1/cwd')))"),
            EACCES,
            "the Leaky Vessels cwd path"
        ),
        probe!(
            "proc_1_environ_unreadable",
            "fd-leak",
            py("res(err(lambda: open('/proc/1/environ').read()))"),
            EACCES,
            "the supervisor's environment stays private"
        ),
        probe!(
            "cwd_parent_shows_only_the_workspace",
            "fd-leak",
            py(
                "names = os.listdir('..')\nres('only-the-root' if names == [os.path.basename(os.getcwd())] else repr(names))"
            ),
            ok(&["only-the-root"]),
            "above the workspace root the view holds only the path to it (an empty root-owned tmpfs dir), nothing of the host"
        ),
        probe!(
            "turn_never_runs_as_host_root",
            "fd-leak",
            py(
                "ids = [l.split()[1:] for l in open('/proc/self/status') if l.startswith(('Uid:', 'Gid:'))]\nres('ok' if all(i == ['65534'] * 4 for i in ids) and os.getgroups() == [] else repr(ids))"
            ),
            ok(&["ok"]),
            "real, effective, saved and fs uid/gid are 65534 and there are no supplementary groups"
        ),
        probe!(
            "workspace_0600_file_readable_through_a_grant",
            "fd-leak",
            py("res(open('data/private.txt').read())"),
            ok(&["mine"]),
            "a 0600 root-owned file in a 0700 root-owned workspace: the idmapped workspace gives the turn its owner's access, the grant decides"
        ),
        probe!(
            "host_binary_not_executable",
            "fd-leak",
            py("res(err(lambda: os.execv('/usr/bin/id', ['id'])))"),
            EACCES,
            "Landlock execute only on the planned executables"
        ),
        probe!(
            "loader_runs_ungranted_binary_confined",
            "fd-leak",
            Body::Sh(
                "/lib64/ld-linux-x86-64.so.2 /usr/bin/id -u 2>&1 | { read u; echo \"RESULT ${u:-denied}\" >&2; }"
            ),
            ok(&["65534", "denied"]),
            "Linux cannot stop ld.so from mapping a readable ELF (Landlock governs execve, not mmap): the program runs, but as uid 65534 under the same Landlock, seccomp and namespaces, so it gains nothing the turn did not have"
        ),
        // ---- procfs, sysfs, /dev ------------------------------------------
        probe!(
            "sys_absent",
            "procfs-sysfs-dev",
            py("res(err(lambda: os.listdir('/sys')))"),
            ENOENT,
            "no /sys in the sandbox"
        ),
        probe!(
            "sysrq_trigger_unwritable",
            "procfs-sysfs-dev",
            py("res(err(lambda: open('/proc/sysrq-trigger', 'w')))"),
            ok(&["EACCES", "EROFS", "ENOENT"]),
            "opened for writing, never written (ENOENT on kernels without magic SysRq)"
        ),
        probe!(
            "proc_sys_unwritable",
            "procfs-sysfs-dev",
            py("res(err(lambda: open('/proc/sys/kernel/hostname', 'w')))"),
            ok(&["EACCES", "EROFS"]),
            "kernel knobs"
        ),
        probe!(
            "proc_kcore_unreadable",
            "procfs-sysfs-dev",
            py("res(err(lambda: open('/proc/kcore', 'rb')))"),
            ok(&["EACCES", "ENOENT"]),
            "kernel memory image (ENOENT on kernels without /proc/kcore)"
        ),
        probe!(
            "kallsyms_addresses_masked",
            "procfs-sysfs-dev",
            py(
                "try:\n    line = open('/proc/kallsyms').readline().split()\n    res('empty' if not line else 'zeroed' if int(line[0], 16) == 0 else 'LEAK')\nexcept OSError as e:\n    res(errno.errorcode[e.errno])"
            ),
            ok(&["zeroed", "EACCES", "empty"]),
            "masked like the OCI default /proc paths (and kptr_restrict zeroes addresses for uid 65534)"
        ),
        probe!(
            "dev_mem_absent",
            "procfs-sysfs-dev",
            py("res(err(lambda: open('/dev/mem', 'rb')))"),
            ENOENT,
            "minimal /dev"
        ),
        probe!(
            "dev_kmsg_absent",
            "procfs-sysfs-dev",
            py("res(err(lambda: open('/dev/kmsg', 'rb')))"),
            ENOENT,
            "minimal /dev"
        ),
        probe!(
            "dev_disks_absent",
            "procfs-sysfs-dev",
            py(
                "res('absent' if not any(os.path.exists(d) for d in ['/dev/sda', '/dev/vda', '/dev/nvme0n1', '/dev/loop0']) else 'present')"
            ),
            ok(&["absent"]),
            "no block devices"
        ),
        probe!(
            "dev_node_creation_refused",
            "procfs-sysfs-dev",
            py("res(err(lambda: os.mknod('/dev/evil', stat.S_IFCHR | 0o666, os.makedev(1, 3))))"),
            ok(&["EROFS", "EACCES", "EPERM"]),
            "/dev is a read-only tmpfs; no CAP_MKNOD"
        ),
        probe!(
            "pid_namespace_hides_host",
            "procfs-sysfs-dev",
            py(
                "pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]; res('isolated' if max(pids) < 50 and len(pids) < 10 else pids)"
            ),
            ok(&["isolated"]),
            "own PID namespace"
        ),
        probe!(
            "hostname_is_private",
            "procfs-sysfs-dev",
            py("res(socket.gethostname())"),
            ok(&["turnstile"]),
            "own UTS namespace"
        ),
        // ---- mounts, pivot_root, chroot, namespaces ------------------------
        probe!(
            "mount_denied",
            "mounts-namespaces",
            py("res(sysc(165, 0, 0, 0, 0, 0))"),
            EPERM,
            "seccomp: EPERM before the kernel sees the NULL pointers (which would give EFAULT)"
        ),
        probe!(
            "umount_denied",
            "mounts-namespaces",
            py("res(sysc(166, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "pivot_root_denied",
            "mounts-namespaces",
            py("res(sysc(155, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "chroot_denied",
            "mounts-namespaces",
            py("res(sysc(161, 0))"),
            EPERM,
            "seccomp (Landlock does not restrict chroot)"
        ),
        probe!(
            "unshare_user_denied",
            "mounts-namespaces",
            py("res(sysc(272, 0x10000000))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "unshare_mount_denied",
            "mounts-namespaces",
            py("res(sysc(272, 0x00020000))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "unshare_newtime_denied",
            "mounts-namespaces",
            py("res(sysc(272, 0x80))"),
            EPERM,
            "seccomp argument rule on unshare flags: CLONE_NEWTIME is unshare's (in clone it is the exit signal)"
        ),
        probe!(
            "unshare_fs_and_files_allowed",
            "mounts-namespaces",
            py("res(sysc(272, 0x200) + ' ' + sysc(272, 0x400) + ' ' + sysc(272, 0x40600))"),
            ok(&["OK OK OK"]),
            "over-blocking: unshare without a namespace flag (CLONE_FS, CLONE_FILES, CLONE_SYSVSEM) creates nothing and is allowed"
        ),
        probe!(
            "setns_denied",
            "mounts-namespaces",
            py("res(sysc(308, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "clone_newuser_denied",
            "mounts-namespaces",
            py("res(sysc(56, 0x10000000 | 17, 0, 0, 0, 0))"),
            EPERM,
            "seccomp argument rule on clone flags"
        ),
        probe!(
            "clone_newpid_high_bits_denied",
            "mounts-namespaces",
            py("res(sysc(56, (1 << 40) | 0x20000000 | 17, 0, 0, 0, 0))"),
            EPERM,
            "flags compared on their low 32 bits"
        ),
        probe!(
            "fsopen_denied",
            "mounts-namespaces",
            py("res(sysc(430, 0, 0))"),
            EPERM,
            "new mount API"
        ),
        probe!(
            "open_tree_denied",
            "mounts-namespaces",
            py("res(sysc(428, 0, 0, 0))"),
            EPERM,
            "new mount API"
        ),
        // ---- seccomp bypasses ----------------------------------------------
        probe!(
            "i386_int80_getpid_killed",
            "seccomp-bypass",
            py("res(native(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])))"),
            SIGSYS,
            "foreign ABI: the bad-arch action kills the process"
        ),
        probe!(
            "i386_int80_unshare_killed",
            "seccomp-bypass",
            py(
                "res(native(bytes([0xb8, 0x36, 0x01, 0, 0, 0xbb, 0, 0, 0, 0x10, 0xcd, 0x80, 0xc3])))"
            ),
            SIGSYS,
            "i386 unshare(CLONE_NEWUSER): the real bypass on native+x86 filters"
        ),
        probe!(
            "x32_getpid_killed",
            "seccomp-bypass",
            py("res(sysc(0x40000000 | 39))"),
            SIGSYS,
            "x32 numbers hit the bad-arch action"
        ),
        probe!(
            "x32_unshare_killed",
            "seccomp-bypass",
            py("res(sysc(0x40000000 | 272, 0x10000000))"),
            SIGSYS,
            "x32"
        ),
        probe!(
            "tiocsti_denied",
            "seccomp-bypass",
            py("res(sysc(16, 0, 0x5412, 0))"),
            EPERM,
            "terminal injection"
        ),
        probe!(
            "tiocsti_high_bits_denied",
            "seccomp-bypass",
            py("res(sysc(16, 0, (1 << 32) | 0x5412, 0))"),
            EPERM,
            "the allow rules are disjoint from the deny rules; low 32 bits compared"
        ),
        probe!(
            "af_packet_high_bits_denied",
            "seccomp-bypass",
            py("res(sysc(41, (1 << 33) | 17, 3, 0))"),
            ok(&["EAFNOSUPPORT"]),
            "socket domain, low 32 bits (allowlist)"
        ),
        probe!(
            "clone3_enosys",
            "seccomp-bypass",
            py("res(sysc(435, 0, 0))"),
            ENOSYS,
            "clone3 hides its flags in memory: ENOSYS makes glibc fall back to clone"
        ),
        probe!(
            "unknown_syscall_enosys",
            "seccomp-bypass",
            py("res(sysc(1000))"),
            ENOSYS,
            "unknown numbers: ENOSYS"
        ),
        probe!(
            "newest_syscall_enosys",
            "seccomp-bypass",
            py("res(sysc(467, 0, 0, 0))"),
            ENOSYS,
            "syscalls newer than the list are closed by default"
        ),
        // ---- dangerous kernel interfaces -----------------------------------
        probe!(
            "io_uring_denied",
            "kernel-interfaces",
            py("res(sysc(425, 1, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "bpf_denied",
            "kernel-interfaces",
            py("res(sysc(321, 0, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "perf_event_open_denied",
            "kernel-interfaces",
            py("res(sysc(298, 0, 0, 0, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "keyctl_denied",
            "kernel-interfaces",
            py("res(sysc(250, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "add_key_denied",
            "kernel-interfaces",
            py("res(sysc(248, 0, 0, 0, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "userfaultfd_denied",
            "kernel-interfaces",
            py("res(sysc(323, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "init_module_denied",
            "kernel-interfaces",
            py("res(sysc(175, 0, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "finit_module_denied",
            "kernel-interfaces",
            py("res(sysc(313, 0, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "kexec_load_denied",
            "kernel-interfaces",
            py("res(sysc(246, 0, 0, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "ptrace_pid1_denied",
            "kernel-interfaces",
            py("res(sysc(101, 16, 1, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "process_vm_readv_denied",
            "kernel-interfaces",
            py("res(sysc(310, 1, 0, 0, 0, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "open_by_handle_at_denied",
            "kernel-interfaces",
            py("res(sysc(304, 0, 0, 0))"),
            EPERM,
            "seccomp"
        ),
        probe!(
            "raw_socket_denied",
            "kernel-interfaces",
            py(
                "res(err(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)))"
            ),
            EPERM,
            "no CAP_NET_RAW"
        ),
        probe!(
            "packet_socket_denied",
            "kernel-interfaces",
            py("res(err(lambda: socket.socket(17, socket.SOCK_RAW, 0)))"),
            ok(&["EAFNOSUPPORT"]),
            "seccomp socket-family allowlist"
        ),
        probe!(
            "signal_pid1_denied",
            "kernel-interfaces",
            py("res(err(lambda: os.kill(1, signal.SIGKILL)))"),
            EPERM,
            "Landlock signal scoping: the turn can only signal its own domain"
        ),
        probe!(
            "personality_read_implies_exec_denied",
            "kernel-interfaces",
            py("res(sysc(135, 0x0400000))"),
            EPERM,
            "seccomp: only Docker's safe personas (READ_IMPLIES_EXEC makes every mapping executable)"
        ),
        probe!(
            "personality_unsafe_with_high_garbage_denied",
            "seccomp-bypass",
            py("res(sysc(135, (0x5a5a << 32) | 0x0400000))"),
            EPERM,
            "the persona is compared on its low 32 bits: high garbage neither hides nor blocks it"
        ),
        probe!(
            "personality_safe_personas_work",
            "kernel-interfaces",
            py(
                "res(','.join(sysc(135, p) for p in (0xffffffff, 0, 8, 0x20000, 0x20008, (0x77 << 32) | 0, 0, 0xffffffff)))"
            ),
            ok(&["OK,OK,OK,OK,OK,OK,OK,OK"]),
            "over-blocking is a bug: setarch's personas (PER_LINUX, PER_LINUX32, UNAME26, both; high garbage on PER_LINUX) and the query work"
        ),
        probe!(
            "af_packet_socket_refused",
            "network",
            py("res(sysc(41, 17, 3, 0))"),
            ok(&["EAFNOSUPPORT"]),
            "socket families by allowlist (raw traffic)"
        ),
        probe!(
            "af_alg_socket_refused",
            "network",
            py("res(sysc(41, 38, 5, 0))"),
            ok(&["EAFNOSUPPORT"]),
            "socket families by allowlist (kernel crypto API, a frequent exploit surface)"
        ),
        probe!(
            "af_vsock_socket_refused",
            "network",
            py("res(sysc(41, 40, 1, 0))"),
            ok(&["EAFNOSUPPORT"]),
            "socket families by allowlist (host/VM channels)"
        ),
        probe!(
            "netlink_audit_and_uevent_refused",
            "network",
            py("res(sysc(41, 16, 3, 9) + ',' + sysc(41, 16, 3, 15) + ',' + sysc(41, 16, 3, 12))"),
            ok(&["EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT"]),
            "netlink for NETLINK_ROUTE only (audit, uevent, netfilter refused)"
        ),
        probe!(
            "socket_family_high_garbage_refused",
            "seccomp-bypass",
            py(
                "res(sysc(41, (1 << 32) | 17, 3, 0) + ',' + sysc(41, (1 << 40) | 16, 3, (1 << 33) | 9))"
            ),
            ok(&["EAFNOSUPPORT,EAFNOSUPPORT"]),
            "family and protocol compared on their low 32 bits"
        ),
        probe!(
            "allowed_socket_families_work",
            "network",
            py(
                "res(','.join(sysc(41, f, t, p) for f, t, p in ((1, 1, 0), (2, 2, 0), (10, 1, 0), (16, 3, 0))))"
            ),
            ok(&["OK,OK,OK,OK"]),
            "over-blocking is a bug: unix, IPv4, IPv6 and route netlink (getifaddrs) work"
        ),
        probe!(
            "allowed_socket_families_with_flags_and_high_garbage_work",
            "network",
            py(
                "res(','.join([sysc(41, 2, 1 | 0x80000 | 0x800, 0), sysc(41, 10, 2 | 0x800, 0), sysc(41, 1, 5 | 0x80000, 0), sysc(41, 16, 3 | 0x80000 | 0x800, 0), sysc(41, (1 << 32) | 2, 1, 0), sysc(41, (0xdead << 32) | 16, 3, (1 << 40) | 0), sysc(53, 1, 1 | 0x80000, 0, ctypes.addressof((ctypes.c_int * 2)())), sysc(53, (1 << 32) | 1, 2, 0, ctypes.addressof((ctypes.c_int * 2)()))]))"
            ),
            ok(&["OK,OK,OK,OK,OK,OK,OK,OK"]),
            "SOCK_CLOEXEC/SOCK_NONBLOCK keep working for allowed families, and garbage in the high 32 bits of an allowed family or protocol is not wrongly refused (the kernel reads an int)"
        ),
        probe!(
            "other_socket_families_refused",
            "network",
            py(
                "res(','.join([sysc(41, 15, 3, 2), sysc(41, 31, 1, 0), sysc(41, 44, 3, 0), sysc(41, 30, 2, 0), sysc(41, 21, 5, 0), sysc(41, 16, 3, 4), sysc(41, 16, 3, 16), sysc(41, 0, 1, 0), sysc(41, 0xffffffff, 1, 0), sysc(53, 2, 1, 0, 0), sysc(53, 16, 3, 0, 0)]))"
            ),
            ok(&[
                "EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT"
            ]),
            "AF_KEY, AF_BLUETOOTH, AF_XDP, AF_TIPC, AF_RDS, netlink sock_diag and generic, AF_UNSPEC, -1; socketpair for IPv4 and netlink (the kernel would say EOPNOTSUPP): all refused by the allowlist"
        ),
        probe!(
            "real_program_syscalls_work",
            "kernel-interfaces",
            py("res(','.join([sysc(252, 1, 0), sysc(239, 0, 0, 0, 0, 0), sysc(462, 0, 0, 0)]))"),
            ok(&["OK,OK,OK"]),
            "over-blocking is a bug: ioprio_get (ionice), get_mempolicy (numa), mseal (newer glibc) reach the kernel"
        ),
        probe!(
            "every_denied_syscall_refused_and_recorded",
            "kernel-interfaces",
            py(DENIED_SYSCALLS),
            ok(&[]),
            "each syscall of the deny table, with arguments that are harmless if it ran (invalid pointers, no-op values): EPERM, and the seccomp layer recorded it — the kernel's own EPERM (no capabilities) would leave no record",
            deny_table_held
        ),
        probe!(
            "stacked_seccomp_filter_cannot_loosen",
            "seccomp-bypass",
            py(
                "import struct\nallow = struct.pack('HBBI', 0x06, 0, 0, 0x7fff0000)\nbuf = ctypes.create_string_buffer(allow)\nprog = struct.pack('HxxxxxxQ', 1, ctypes.addressof(buf))\npb = ctypes.create_string_buffer(prog)\nr = [sysc(317, 1, 0, ctypes.addressof(pb)), sysc(272, 0x10000000), sysc(317, 1, 8, ctypes.addressof(pb))]\nres(','.join(r))"
            ),
            ok(&["OK,EPERM,EBUSY"]),
            "seccomp(2) is allowed (browsers and nested sandboxes stack filters): an allow-all filter stacked on ours leaves unshare(CLONE_NEWUSER) refused, and a second listener is refused"
        ),
        probe!(
            "newer_real_program_syscalls_reach_the_kernel",
            "kernel-interfaces",
            py(
                "a = ctypes.c_uint32(0x7fff0000)\nr = [sysc(251, 1, 0, (2 << 13) | 4), sysc(238, 0, 0, 0), sysc(237, 0, 0, 0, 0, 0, 0), sysc(449, 0, 0, 0, 0, 0), sysc(451, 0, 0, 0, 0), sysc(317, 2, 0, ctypes.addressof(a)), sysc(457, 0, 0, 0, 0), sysc(458, 0, 0, 0, 0), sysc(448, 0xffffffff, 0)]\nres(','.join(r))"
            ),
            ok(&["OK,OK,OK,EINVAL,EFAULT,OK,EFAULT,EFAULT,EBADF"]),
            "over-blocking is a bug: ioprio_set (ionice), set_mempolicy and mbind (numactl), futex_waitv (wine, newer runtimes), cachestat, seccomp, statmount/listmount (findmnt), process_mrelease reach the kernel (its own errors, never EPERM/ENOSYS)"
        ),
        probe!(
            "thread_naming_works",
            "kernel-interfaces",
            py(
                "import threading\nlibc.pthread_self.restype = ctypes.c_ulong\nlibc.pthread_setname_np.argtypes = [ctypes.c_ulong, ctypes.c_char_p]\nlibc.prctl(15, b'worker-1', 0, 0, 0)\na = open('/proc/self/comm').read().strip()\nopen('/proc/self/comm', 'w').write('renamed')\nb = open('/proc/self/comm').read().strip()\nout = []\ndef run():\n    libc.pthread_setname_np(libc.pthread_self(), b't-2')\n    out.append(open(f'/proc/self/task/{threading.get_native_id()}/comm').read().strip())\nt = threading.Thread(target=run); t.start(); t.join()\nres(','.join([a, b] + out))"
            ),
            ok(&["worker-1,renamed,t-2"]),
            "over-blocking is a bug: prctl(PR_SET_NAME), writing /proc/self/comm and pthread_setname_np (thread names) work"
        ),
        probe!(
            "controlling_tty_absent",
            "kernel-interfaces",
            py("res(err(lambda: open('/dev/tty', 'r+')))"),
            ok(&["ENXIO"]),
            "setsid: no controlling terminal to inject into"
        ),
        // ---- network -------------------------------------------------------
        probe!(
            "tcp_egress_denied",
            "network",
            py(
                "s = socket.socket(); s.settimeout(2); res(err(lambda: s.connect(('203.0.113.1', 80))))"
            ),
            ok(&["EACCES", "ENETUNREACH"]),
            "Landlock TCP connect (and an empty network namespace)"
        ),
        probe!(
            "tcp_host_loopback_listener_unreachable",
            "network",
            py(
                "s = socket.socket(); s.settimeout(2); res(err(lambda: s.connect(('127.0.0.1', @HOSTPORT@))))"
            ),
            ok(&["ECONNREFUSED"]),
            "the turn's loopback is its own (own network namespace): the host's listener on 127.0.0.1 is not there"
        ),
        probe!(
            "tcp_loopback_works_inside",
            "network",
            py(
                "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\nc = socket.create_connection(s.getsockname(), 2); a, _ = s.accept(); c.sendall(b'ok')\nt = socket.socket(socket.AF_INET6); t.bind(('::1', 0)); t.listen()\nd = socket.create_connection(t.getsockname()[:2], 2)\nres(a.recv(2).decode())"
            ),
            ok(&["ok"]),
            "isolated = own network namespace with lo up (IPv4 and IPv6): over-blocking loopback is a bug"
        ),
        probe!(
            "tcp_bind_foreign_address_unavailable",
            "network",
            py("s = socket.socket(); res(err(lambda: s.bind(('10.11.12.13', 8080))))"),
            ok(&["EADDRNOTAVAIL"]),
            "no interface but lo: nothing to listen on for the outside"
        ),
        probe!(
            "host_unix_socket_in_granted_dir_unconnectable",
            "network",
            py("s = socket.socket(socket.AF_UNIX); res(err(lambda: s.connect('data/host.sock')))"),
            ok(&["ECONNREFUSED", "ENOENT"]),
            "a host process's socket (mode 0777) in a granted dir: granted dirs are read-only overlays, and overlayfs does not pass a connect through to the host's socket"
        ),
        probe!(
            "host_unix_socket_in_ungranted_dir_absent",
            "network",
            py(
                "s = socket.socket(socket.AF_UNIX); res(err(lambda: s.connect('private/host.sock')))"
            ),
            ENOENT,
            "an ungranted dir is not in the view at all"
        ),
        probe!(
            "udp_egress_unroutable",
            "network",
            py(
                "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); res(err(lambda: s.sendto(b'x', ('198.51.100.7', 53))))"
            ),
            ok(&["ENETUNREACH"]),
            "Landlock has no UDP rules; the empty network namespace covers UDP"
        ),
        probe!(
            "abstract_unix_host_unreachable",
            "network",
            py(
                "s = socket.socket(socket.AF_UNIX); res(err(lambda: s.connect('\\0/tmp/.X11-unix/X0')))"
            ),
            ok(&["ECONNREFUSED", "EPERM"]),
            "abstract sockets are per network namespace; Landlock scoping on top"
        ),
        probe!(
            "host_unix_sockets_invisible",
            "network",
            py(
                "s = socket.socket(socket.AF_UNIX); res(err(lambda: s.connect('/run/containerd/containerd.sock')))"
            ),
            ENOENT,
            "host /run is not mounted"
        ),
        probe!(
            "only_loopback_exists",
            "network",
            py("res(','.join(n for _, n in socket.if_nameindex()))"),
            ok(&["lo"]),
            "own network namespace"
        ),
        // ---- Landlock's gaps and who covers them ----------------------------
        probe!(
            "truncate_readable_file_denied",
            "landlock-gaps",
            py("res(err(lambda: os.truncate('data/users.csv', 0)))"),
            ok(&["EACCES", "EROFS"]),
            "Landlock's truncate right (ABI 3+) refuses first; the read-only bind would too"
        ),
        probe!(
            "chmod_denied",
            "landlock-gaps",
            py("res(err(lambda: os.chmod('data/users.csv', 0o777)))"),
            EROFS,
            "Landlock does not cover chmod: the read-only bind does"
        ),
        probe!(
            "chown_denied",
            "landlock-gaps",
            py("res(err(lambda: os.chown('data/users.csv', 65534, 65534)))"),
            ok(&["EROFS", "EPERM"]),
            "Landlock does not cover chown: read-only bind, no CAP_CHOWN"
        ),
        probe!(
            "utime_denied",
            "landlock-gaps",
            py("res(err(lambda: os.utime('data/users.csv', (0, 0))))"),
            EROFS,
            "Landlock does not cover utime: the read-only bind does"
        ),
        probe!(
            "setxattr_denied",
            "landlock-gaps",
            py("res(err(lambda: os.setxattr('data/users.csv', 'user.x', b'1')))"),
            ok(&["EROFS", "EPERM", "ENOTSUP"]),
            "Landlock does not cover xattrs: the read-only bind does"
        ),
        probe!(
            "forbidden_in_allowed_tree_unreadable",
            "landlock-gaps",
            py("res(err(lambda: open('data/secret/key.pem').read()))"),
            ok(&["EACCES", "ENOENT"]),
            "masked mount (native: an empty 0000 tmpfs, EACCES; OCI maskedPaths: an empty tmpfs, ENOENT) + no Landlock rule"
        ),
        probe!(
            "setuid_bit_normalised_at_commit",
            "landlock-gaps",
            py(
                "p = os.environ['TMPDIR'] + '/tool'; open(p, 'w').write('x'); os.chmod(p, 0o4755); res('chmod-ok')"
            ),
            ok(&["chmod-ok"]),
            "chmod works inside scratch; the carry-over keeps the permission bits (0755) and drops set-id bits",
            |c| {
                let p = session_file(c, "tmp/<sid>/tool").ok_or("no session")?;
                let mode = std::os::unix::fs::PermissionsExt::mode(
                    &std::fs::metadata(&p)
                        .map_err(|e| e.to_string())?
                        .permissions(),
                );
                if mode & 0o7777 == 0o755 {
                    Ok(())
                } else {
                    Err(format!("committed mode {mode:o}"))
                }
            }
        ),
        // ---- attacks on capture and commit ---------------------------------
        probe!(
            "symlink_output_blocked",
            "capture-commit",
            py_out(
                "os.symlink('/etc/passwd', f'{OUT}/r.md')",
                &["output/<session_id>/r.md:r"]
            ),
            BLOCKED,
            "only regular files commit",
            |c| absent(c, "output/<sid>/r.md")
        ),
        probe!(
            "hardlink_to_input_refused",
            "capture-commit",
            py_out(
                "res(err(lambda: os.link('data/users.csv', f'{OUT}/r.md')))",
                &["output/<session_id>/r.md:r"]
            ),
            Expect {
                status: &[12],
                result: &["EXDEV", "EACCES", "EROFS", "EPERM"],
                signal: None
            },
            "no link across mounts",
            |c| {
                let m =
                    std::fs::metadata(c.root.join("data/users.csv")).map_err(|e| e.to_string())?;
                if std::os::unix::fs::MetadataExt::nlink(&m) == 1 {
                    Ok(())
                } else {
                    Err("host input gained a link".into())
                }
            }
        ),
        probe!(
            "symlinked_parent_blocked",
            "capture-commit",
            py_out(
                "os.symlink('/etc', f'{OUT}/sub'); res(err(lambda: open(f'{OUT}/sub/passwd', 'w')))",
                &["output/<session_id>/sub/passwd:r"]
            ),
            Expect {
                status: &[12],
                result: &["EROFS", "EACCES"],
                signal: None
            },
            "writes through a symlinked parent stay in the sandbox; the link never commits",
            |c| absent(c, "output/<sid>/sub")
        ),
        probe!(
            "fifo_output_blocked",
            "capture-commit",
            py_out("os.mkfifo(f'{OUT}/r.md')", &["output/<session_id>/r.md:r"]),
            BLOCKED,
            "special files never commit",
            |c| absent(c, "output/<sid>/r.md")
        ),
        probe!(
            "device_node_output_refused",
            "capture-commit",
            py_out(
                "res(err(lambda: os.mknod(f'{OUT}/r.md', stat.S_IFCHR | 0o666, os.makedev(1, 3))))",
                &["output/<session_id>/r.md:r"]
            ),
            Expect {
                status: &[12],
                result: &["EPERM"],
                signal: None
            },
            "no CAP_MKNOD",
            |c| absent(c, "output/<sid>/r.md")
        ),
        probe!(
            "deleting_committed_output_blocked",
            "capture-commit",
            Body::Then {
                setup: "open(f'{OUT}/keep.md', 'w').write('kept')",
                setup_outputs: &["output/<session_id>/keep.md:r"],
                code: "os.unlink(f'{OUT}/keep.md')",
                outputs: &[],
            },
            BLOCKED,
            "a whiteout outside scratch is an undeclared write",
            |c| match session_file(c, "output/<sid>/keep.md").map(std::fs::read) {
                Some(Ok(b)) if b == b"kept" => Ok(()),
                other => Err(format!("committed output changed: {other:?}")),
            }
        ),
        probe!(
            "xattrs_dropped_at_commit",
            "capture-commit",
            py_out(
                "p = f'{OUT}/r.md'; open(p, 'w').write('x'); res(err(lambda: os.setxattr(p, 'user.evil', b'1')))",
                &["output/<session_id>/r.md:r"]
            ),
            ok(&["OK", "ENOTSUP", "EPERM"]),
            "commit writes fresh files",
            |c| {
                let p = session_file(c, "output/<sid>/r.md").ok_or("no session")?;
                if !p.is_file() {
                    return Err("output not committed".into());
                }
                // List the committed file's xattrs on the host; a failure to
                // list is a failure of the oracle, never a pass.
                let out = Command::new("/usr/bin/python3")
                    .args([
                        "-c",
                        "import os, sys; print(' '.join(os.listxattr(sys.argv[1])))",
                    ])
                    .arg(&p)
                    .output()
                    .map_err(|e| format!("cannot list xattrs: {e}"))?;
                if !out.status.success() {
                    return Err(format!(
                        "cannot list xattrs: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
                let names = String::from_utf8_lossy(&out.stdout);
                if names.contains("user.evil") {
                    Err(format!("xattr committed: {}", names.trim()))
                } else {
                    Ok(())
                }
            }
        ),
        probe!(
            "hostile_file_name_blocked",
            "capture-commit",
            py_out(
                "open(f'{OUT}/a\\nb', 'w').write('x'); open(f'{OUT}/r.md', 'w').write('x')",
                &["output/<session_id>/r.md:r"]
            ),
            BLOCKED,
            "an undeclared name (with a newline) blocks the turn",
            |c| absent(c, "output/<sid>/r.md")
        ),
        probe!(
            "too_many_files_limited",
            "capture-commit",
            py(
                "d = os.environ['TMPDIR']\nfor i in range(1000):\n    open(f'{d}/f{i}', 'w').close()"
            ),
            LIMIT,
            "files limit = scratch tmpfs inodes",
            |c| absent(c, "tmp/<sid>/f0")
        ),
        probe!(
            "huge_file_limited",
            "capture-commit",
            py(
                "f = open(os.environ['TMPDIR'] + '/big', 'wb')\nfor _ in range(64):\n    f.write(b'x' * (1 << 20))"
            ),
            LIMIT,
            "disk limit = scratch tmpfs size",
            |c| absent(c, "tmp/<sid>/big")
        ),
        probe!(
            "sparse_file_limited",
            "capture-commit",
            py("f = open(os.environ['TMPDIR'] + '/sparse', 'wb'); f.truncate(10 << 30); f.close()"),
            LIMIT,
            "apparent size counts: a sparse 10 GiB file would be copied byte for byte",
            |c| absent(c, "tmp/<sid>/sparse")
        ),
        probe!(
            "deep_tree_limited",
            "capture-commit",
            py("p = os.environ['TMPDIR']\nfor i in range(300):\n    p += '/d'\n    os.mkdir(p)"),
            LIMIT,
            "capture depth is capped",
            |c| absent(c, "tmp/<sid>/d")
        ),
        probe!(
            "writer_racing_commit_is_dead",
            "capture-commit",
            Body::Sh(
                "i=0; (while true; do echo $i > output/$TURNSTILE_SESSION_ID/r.md; i=$((i+1)); done) & /bin/sleep 0.2; echo final > output/$TURNSTILE_SESSION_ID/r.md.tmp; exit 0"
            ),
            BLOCKED,
            "every process is dead before enumeration; here the stray .tmp is undeclared so nothing commits",
            |c| absent(c, "output/<sid>/r.md")
        ),
        probe!(
            "committed_bytes_match_the_evidence",
            "capture-commit",
            py_out(
                "p = f'{OUT}/r.md'\nif os.fork() == 0:\n    while True:\n        open(p, 'a').write('racing\\n')\nimport time; time.sleep(0.2); res('parent-exits')",
                &["output/<session_id>/r.md:r"]
            ),
            ok(&["parent-exits"]),
            "a writer still appending when the command exits is dead before enumeration; the bytes committed are the bytes hashed",
            |c| {
                let ev = evidence_last(c);
                let want = ev["committed"][0]["sha256"]
                    .as_str()
                    .ok_or("nothing committed")?;
                let p = session_file(c, "output/<sid>/r.md").ok_or("no session")?;
                let got = crate::sha256_file(&p);
                if got == want {
                    Ok(())
                } else {
                    Err(format!("committed {got} but evidence says {want}"))
                }
            }
        ),
        // ---- resource exhaustion -------------------------------------------
        probe!(
            "fork_bomb_limited",
            "resources",
            py("while True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
            Expect {
                status: &[13, 14],
                result: &[],
                signal: None
            },
            "pids limit; the pid namespace dies with its init"
        ),
        probe!(
            "thread_bomb_limited",
            "resources",
            py(
                "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()"
            ),
            LIMIT,
            "threads count against pids"
        ),
        probe!(
            "memory_hog_killed",
            "resources",
            py("x = bytearray(512 << 20)"),
            LIMIT,
            "memory limit, OOM kill reported as E2071"
        ),
        probe!(
            "cpu_spin_times_out",
            "resources",
            Body::Sh("while :; do :; done"),
            Expect {
                status: &[14],
                result: &[],
                signal: None
            },
            "timeout: SIGTERM, grace, SIGKILL"
        ),
        probe!(
            "output_flood_capped",
            "resources",
            py("sys.stdout.write('x' * (10 << 20))"),
            ok(&[]),
            "output_bytes cap; the rest is dropped and recorded",
            |c| {
                let ev = evidence_last(c);
                if ev["output"]["truncated"] != true {
                    return Err(format!("not marked truncated: {}", ev["output"]));
                }
                if ev["output"]["stdout"]["forwarded"]
                    .as_u64()
                    .unwrap_or(u64::MAX)
                    > 64 << 10
                {
                    return Err("forwarded past the cap".into());
                }
                if c.stderr.len() > 256 << 10 {
                    return Err(format!("{} bytes reached the caller", c.stderr.len()));
                }
                Ok(())
            }
        ),
        probe!(
            "daemon_does_not_outlive_the_turn",
            "resources",
            py(
                "import time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execv('/bin/sleep', ['sleep', '4242'])\n    os._exit(0)\nres('spawned')"
            ),
            ok(&["spawned"]),
            "the pid namespace and the cgroup are emptied before run returns",
            |_| {
                let out = Command::new("pgrep")
                    .args(["-f", "sleep 4242"])
                    .output()
                    .map_err(|e| e.to_string())?;
                if out.stdout.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "survivor: {}",
                        String::from_utf8_lossy(&out.stdout)
                    ))
                }
            }
        ),
        probe!(
            "dev_shm_bounded",
            "resources",
            py(
                "f = open('/dev/shm/fill', 'wb')\ntry:\n    for _ in range(100):\n        f.write(b'x' * (1 << 20))\n    res('OK')\nexcept OSError as e:\n    res(errno.errorcode[e.errno])"
            ),
            Expect {
                status: &[0, 13],
                result: &["ENOSPC"],
                signal: None
            },
            "/dev/shm is a private, size-limited tmpfs",
            |_| if Path::new("/dev/shm/fill").exists() {
                Err("host /dev/shm written".into())
            } else {
                Ok(())
            }
        ),
        // ---- request validation --------------------------------------------
        probe!(
            "session_id_traversal_refused",
            "request-validation",
            Body::Cli(&[
                "--session",
                "../../../etc",
                "--no-outputs",
                "--",
                "/bin/sleep",
                "0"
            ]),
            BAD_INPUT,
            "refused before anything is created"
        ),
        probe!(
            "output_traversal_refused",
            "request-validation",
            Body::Cli(&[
                "--output",
                "output/../../etc/passwd:r",
                "--",
                "/bin/sleep",
                "0"
            ]),
            BAD_INPUT,
            "no `..`"
        ),
        probe!(
            "absolute_output_refused",
            "request-validation",
            Body::Cli(&["--output", "/etc/passwd:r", "--", "/bin/sleep", "0"]),
            BAD_INPUT,
            "outputs are workspace-relative"
        ),
        probe!(
            "input_traversal_refused",
            "request-validation",
            Body::Cli(&[
                "--no-outputs",
                "--input",
                "data/../../../etc/shadow",
                "--",
                "/bin/sleep",
                "0"
            ]),
            BAD_INPUT,
            "no `..`"
        ),
        // ---- the ledger, from inside ---------------------------------------
        probe!(
            "ledger_unreadable",
            "ledger",
            py("res(err(lambda: os.listdir('planes')))"),
            ok(&["ENOENT", "EACCES"]),
            "ledgers are not in the view unless a read pattern names them (masked when the root is granted whole)"
        ),
        probe!(
            "ledger_unwritable",
            "ledger",
            py("res(err(lambda: open(f'planes/ho1/sessions/{SID}/ledger/exec.jsonl', 'a')))"),
            ok(&["EACCES", "EROFS", "ENOENT"]),
            "masked, read-only, no Landlock right"
        ),
        probe!(
            "ledger_as_output_refused",
            "ledger",
            Body::Cli(&[
                "--output",
                "planes/ho1/sessions/<session_id>/ledger/exec.jsonl:r",
                "--",
                "/bin/sleep",
                "0"
            ]),
            Expect {
                status: &[11],
                result: &[],
                signal: None
            },
            "reserved path"
        ),
        probe!(
            "manifest_unwritable",
            "ledger",
            py("res(err(lambda: open('installed/rt/manifest.json', 'a')))"),
            ok(&["EACCES", "EROFS"]),
            "a turn cannot rewrite its own grants: no Landlock write right, read-only bind"
        ),
        probe!(
            "state_dir_invisible",
            "ledger",
            py("res(err(lambda: os.listdir('@STATE@')))"),
            ENOENT,
            "anchors live outside the sandbox's view"
        ),
        probe!(
            "canary_outside_workspace_invisible",
            "ledger",
            py("res(err(lambda: open('@CANARY@/canary.txt', 'a')))"),
            ENOENT,
            "only the workspace and system dirs are mounted"
        ),
        // ---- host inodes and the sandbox's own surface (issue 22) ----------
        probe!(
            "dev_null_metadata_unchangeable",
            "procfs-sysfs-dev",
            py(
                "res(err(lambda: os.chmod('/dev/null', 0o600)) + ',' + err(lambda: os.utime('/dev/null')))"
            ),
            ok(&["EROFS,EROFS"]),
            "/dev is the turn's own read-only tmpfs with nodes of its own (never a bind of a host device): chmod and utimes fail EROFS, and the host oracle sees every /dev node unchanged"
        ),
        probe!(
            "stdio_is_no_host_inode",
            "fd-leak",
            py(
                "kinds = ['pipe' if stat.S_ISFIFO(os.fstat(fd).st_mode) else oct(os.fstat(fd).st_mode) for fd in (0, 1, 2)]; res(','.join(kinds) + ':' + repr(sys.stdin.read()))"
            ),
            ok(&["pipe,pipe,pipe:''"]),
            "stdin is an empty pipe and stdout/stderr pipes: never the host's /dev/null, which runsc and crun would fchown to the turn's user"
        ),
        probe!(
            "proc_self_attr_unwritable",
            "procfs-sysfs-dev",
            py(
                "res(','.join(err(lambda n=n: open(f'/proc/self/attr/{n}', 'w')) for n in ('current', 'exec', 'fscreate')) + ',' + err(lambda: open('/proc/self/mem', 'wb')))"
            ),
            ok(&["EACCES,EACCES,EACCES,EACCES"]),
            "Landlock grants writes under /proc only to the command's own comm and oom_score_adj: the LSM attribute files and /proc/self/mem are read-only"
        ),
        probe!(
            "af_alg_high_bits_refused",
            "seccomp-bypass",
            py(
                "res(sysc(41, (1 << 32) | 38, 5, 0) + ',' + sysc(41, (0xffffffff << 32) | 38, 5, 0) + ',' + sysc(41, 38, 5, 0))"
            ),
            ok(&["EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT"]),
            "socket families are decided on the low 32 bits, as the kernel reads an int: AF_ALG with high bits set is refused like AF_ALG"
        ),
        probe!(
            "forbidden_dir_unlistable",
            "landlock-gaps",
            py(
                "res(err(lambda: os.listdir('data/secret')) + ',' + err(lambda: os.stat('data/secret/key.pem')))"
            ),
            ok(&["EACCES,EACCES"]),
            "a forbidden directory is an empty mode-0000 mount on every backend: neither its file names nor its files are reachable"
        ),
        probe!(
            "overlay_xattr_refused",
            "capture-commit",
            py(
                "fd = os.open(OUT, os.O_RDONLY)\nres(','.join([err(lambda: os.setxattr(OUT, 'user.overlay.opaque', b'y')), err(lambda: os.setxattr(fd, 'user.overlay.redirect', b'/x')), err(lambda: os.setxattr(OUT, 'trusted.overlay.opaque', b'y', follow_symlinks=False)), err(lambda: os.setxattr(OUT, 'user.turnstile-probe', b'1'))]))"
            ),
            ok(&["EPERM,EPERM,EPERM,OK", "EPERM,EPERM,EPERM,ENOTSUP"]),
            "overlay-private xattrs (user.overlay.*, trusted.overlay.*) are refused by name (the seccomp listener reads it); another user xattr is not refused by turnstile — it sets (OK), or the kernel answers ENOTSUP where the overlay's tmpfs upper has no user xattrs (before 6.6)"
        ),
    ]
}

/// How one probe went.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub name: &'static str,
    pub family: &'static str,
    pub expected: String,
    pub observed: String,
    pub verdict: Verdict,
    pub note: &'static str,
    /// Whether the turn's evidence recorded the attempt (issue 11): the
    /// layers of its violations, a refusing status, or "no" when it was
    /// refused by a layer whose refusals are not observable (Landlock, the
    /// mount layer) or not refused at all.
    pub recorded: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Held,
    Unexpected(String),
    Escape(String),
}

impl Verdict {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Unexpected(_) => "UNEXPECTED",
            Self::Escape(_) => "ESCAPE",
        }
    }
}

/// The backend the suite attacks: `TURNSTILE_REDTEAM_BACKEND` (`cargo xtask
/// redteam --backend NAME`), native by default.
pub fn backend() -> String {
    std::env::var("TURNSTILE_REDTEAM_BACKEND").unwrap_or_else(|_| "native".into())
}

/// Where a backend legitimately differs from native: (backend — `oci` for
/// runc, crun and runsc —, probe, what it shows instead, why). Printed with the table; everything else must
/// hold exactly as natively.
pub const DIFFERENCES: &[(&str, &str, Expect, &str)] = &[
    (
        "runsc",
        "proc_self_attr_unwritable",
        ok(&["ENOENT,ENOENT,ENOENT,EACCES", "ENOENT,ENOENT,ENOENT,OK"]),
        "gVisor has no LSM attribute files (/proc/self/attr does not exist); its /proc/self/mem is the sentry's emulation, not the host kernel's",
    ),
    (
        "runsc",
        "af_alg_high_bits_refused",
        ok(&[
            "EPERM,EPERM,EPERM",
            "EAFNOSUPPORT,EAFNOSUPPORT,EAFNOSUPPORT",
        ]),
        "the filter refuses AF_ALG before gVisor sees it; gVisor's own filter answers EPERM",
    ),
    (
        "runsc",
        "overlay_xattr_refused",
        ok(&["ENOTSUP,ENOTSUP,ENOTSUP,ENOTSUP"]),
        "gVisor supports no extended attributes on its gofer mounts (ENOTSUP for every name)",
    ),
    (
        "oci",
        "dev_null_metadata_unchangeable",
        ok(&["EPERM,OK"]),
        "the runtime makes /dev a tmpfs of the container's own with its own root-owned nodes (runc and crun mknod them, gVisor emulates them): chmod fails EPERM; utimes of a node the turn may write succeeds on that private node, and the host oracle shows the host's untouched",
    ),
    (
        "oci",
        "overlay_xattr_refused",
        ok(&["OK,OK,EPERM,OK"]),
        "no seccomp listener under runc and crun (the runtime installs the filter), so names cannot be read: user.overlay.* lands in the turn's upper dir but stays inert — the overlays are never mounted with userxattr, capture reads a directory carrying it as opaque (which blocks), commit copies no xattrs; trusted.* needs CAP_SYS_ADMIN",
    ),
    // runsc first: its rows take precedence over the `oci` rows, which
    // apply to it too (PID 1 is the turn's own command there as well).
    (
        "runsc",
        "thread_bomb_limited",
        Expect {
            status: &[13, 14],
            result: &[],
            signal: Some("SIGKILL|SIGTERM"),
        },
        "gVisor's threads are the sentry's, and the host cgroup's pids limit is the plan's + 256 for gVisor itself: a thread bomb ends at that limit (13) or, when the sentry slows first, at the timer (14: its SIGTERM, which the sentry may obey before the grace's SIGKILL, seen on a loaded host); ended by the sandbox either way",
    ),
    (
        "runsc",
        "host_binary_not_executable",
        Expect {
            status: &[0],
            result: &[],
            signal: None,
        },
        "no Landlock in gVisor (allow_degraded): any binary in the read-only view executes; what it can read, write and reach is still the view's, gVisor's and the capture's",
    ),
    (
        "runsc",
        "sys_absent",
        ok(&["EACCES"]),
        "gVisor always provides a (synthetic) /sys; turnstile masks it with an empty mode-0000 tmpfs",
    ),
    (
        "runsc",
        "kallsyms_addresses_masked",
        ok(&["ENOENT"]),
        "gVisor has no /proc/kallsyms",
    ),
    (
        "runsc",
        "i386_int80_getpid_killed",
        ok(&["-9"]),
        "gVisor implements no i386 ABI: int $0x80 fails inside the sentry instead of reaching a filter (nothing runs)",
    ),
    (
        "runsc",
        "i386_int80_unshare_killed",
        ok(&["-1"]),
        "gVisor implements no i386 ABI: int $0x80 fails inside the sentry (nothing runs)",
    ),
    (
        "runsc",
        "x32_getpid_killed",
        ok(&["EPERM"]),
        "gVisor implements no x32 ABI; its OCI seccomp answers EPERM",
    ),
    (
        "runsc",
        "x32_unshare_killed",
        ok(&["EPERM"]),
        "gVisor implements no x32 ABI; its OCI seccomp answers EPERM",
    ),
    (
        "runsc",
        "af_packet_high_bits_denied",
        ok(&["EPERM"]),
        "gVisor's OCI seccomp returns EPERM for every errno action (it ignores errnoRet); still refused",
    ),
    (
        "runsc",
        "unknown_syscall_enosys",
        ok(&["EPERM"]),
        "gVisor ignores defaultErrnoRet: the default action answers EPERM, not ENOSYS",
    ),
    (
        "runsc",
        "newest_syscall_enosys",
        ok(&["EPERM"]),
        "gVisor ignores defaultErrnoRet: EPERM, not ENOSYS",
    ),
    (
        "runsc",
        "packet_socket_denied",
        ok(&["EPERM"]),
        "refused; gVisor ignores errnoRet (EPERM)",
    ),
    (
        "runsc",
        "af_packet_socket_refused",
        ok(&["EPERM"]),
        "refused; gVisor ignores errnoRet (EPERM)",
    ),
    (
        "runsc",
        "af_alg_socket_refused",
        ok(&["EPERM"]),
        "refused; gVisor ignores errnoRet (EPERM)",
    ),
    (
        "runsc",
        "af_vsock_socket_refused",
        ok(&["EPERM"]),
        "refused; gVisor ignores errnoRet (EPERM)",
    ),
    (
        "runsc",
        "netlink_audit_and_uevent_refused",
        ok(&["EPERM,EPERM,EPERM"]),
        "refused; gVisor ignores errnoRet (EPERM)",
    ),
    (
        "runsc",
        "socket_family_high_garbage_refused",
        ok(&["EPERM,EPERM"]),
        "refused; gVisor ignores errnoRet (EPERM)",
    ),
    (
        "runsc",
        "other_socket_families_refused",
        ok(&["EPERM,EPERM,EPERM,EPERM,EPERM,EPERM,EPERM,EPERM,EPERM,EPERM,EPERM"]),
        "refused; gVisor ignores errnoRet (EPERM)",
    ),
    (
        "runsc",
        "signal_pid1_denied",
        Expect {
            status: &[10],
            result: &[],
            signal: Some("SIGKILL"),
        },
        "PID 1 is the turn's own command, and gVisor delivers a namespace init's SIGKILL to itself: the command killed itself",
    ),
    (
        "runsc",
        "personality_safe_personas_work",
        ok(&["EINVAL,EINVAL,EINVAL,EINVAL,EINVAL,EINVAL,EINVAL,EINVAL"]),
        "gVisor implements personality(2) for PER_LINUX only; turnstile's filter allows the safe personas, gVisor refuses them",
    ),
    (
        "runsc",
        "real_program_syscalls_work",
        ok(&["EPERM,OK,EPERM"]),
        "syscalls outside the runtime's libseccomp (2.5.4) fall to the default action, which gVisor answers EPERM",
    ),
    (
        "runsc",
        "newer_real_program_syscalls_reach_the_kernel",
        ok(&["EPERM,OK,OK,EPERM,EPERM,EINVAL,EPERM,EPERM,EPERM"]),
        "what gVisor (2022-12) does not implement, or libseccomp 2.5.4 does not name, answers EPERM (gVisor ignores errnoRet)",
    ),
    (
        "runsc",
        "stacked_seccomp_filter_cannot_loosen",
        ok(&["OK,EPERM,EINVAL"]),
        "the stacked filter still cannot loosen ours (unshare stays EPERM); gVisor refuses the second listener with EINVAL",
    ),
    (
        "runsc",
        "thread_naming_works",
        ok(&["worker-1,worker-1,t-2"]),
        "threads start (clone3 reaches the sentry, which answers ENOSYS, and glibc falls back to clone); gVisor ignores writes to /proc/self/task/N/comm",
    ),
    (
        "runsc",
        "controlling_tty_absent",
        ok(&["EIO"]),
        "no controlling terminal; gVisor answers EIO, not ENXIO",
    ),
    (
        "runsc",
        "tcp_egress_denied",
        ok(&["EHOSTUNREACH"]),
        "--network=none: gVisor's netstack has loopback only",
    ),
    (
        "runsc",
        "udp_egress_unroutable",
        ok(&["EHOSTUNREACH"]),
        "--network=none: gVisor's netstack has loopback only",
    ),
    (
        "runsc",
        "host_unix_socket_in_granted_dir_unconnectable",
        ok(&["EPERM"]),
        "gVisor's gofer refuses host unix sockets (--host-uds=none); the view binds the directory, no overlay needed",
    ),
    (
        "oci",
        "proc_1_exe_unopenable",
        ok(&["OK"]),
        "PID 1 of a runc/crun container is the turn's own command (turnstile's init execs it), not a privileged stage: /proc/1 is the caller itself",
    ),
    (
        "oci",
        "proc_1_root_unlistable",
        ok(&["OK"]),
        "PID 1 is the turn's own command",
    ),
    (
        "oci",
        "proc_1_cwd_unlistable",
        ok(&["OK"]),
        "PID 1 is the turn's own command",
    ),
    (
        "oci",
        "proc_1_environ_unreadable",
        ok(&["OK"]),
        "PID 1 is the turn's own command (its environment is the turn's)",
    ),
    (
        "oci",
        "signal_pid1_denied",
        ok(&["OK"]),
        "PID 1 is the turn's own command; SIGKILL to a namespace's init from inside is ignored by the kernel",
    ),
    (
        "oci",
        "proc_1_exe_unexecutable",
        Expect {
            status: &[0],
            result: &[],
            signal: None,
        },
        "/proc/1/exe is the command's own binary (python), not the supervisor",
    ),
    (
        "oci",
        "real_program_syscalls_work",
        ok(&["OK,OK,ENOSYS"]),
        "runc and crun name syscalls for their libseccomp 2.5.4, which does not know mseal: it falls to the default ENOSYS (native compiles it by number)",
    ),
    (
        "oci",
        "stacked_seccomp_filter_cannot_loosen",
        ok(&["OK,EPERM,OK"]),
        "the runtime's filter has no listener, so a second listener can be installed; the stacked filter still cannot loosen ours (unshare stays EPERM)",
    ),
    (
        "oci",
        "newer_real_program_syscalls_reach_the_kernel",
        ok(&["OK,OK,OK,EINVAL,EFAULT,OK,ENOSYS,ENOSYS,EBADF"]),
        "syscalls newer than the runtime's libseccomp (2.5.4) are dropped from its filter and fall to the default ENOSYS (native compiles them by number)",
    ),
];

/// Where an older kernel legitimately differs: (the first kernel version
/// the probe's expectation holds on, probe, what older kernels show, why).
/// Only over-blocking probes belong here — a syscall the kernel does not
/// have answers ENOSYS itself, which the filter's ENOSYS cannot be told
/// apart from; a probe that an attack must fail may never be relaxed by
/// kernel version (on a kernel lacking a layer, another layer must hold).
pub const KERNEL_DIFFERENCES: &[((u32, u32), &str, Expect, &str)] = &[
    (
        (6, 10),
        "real_program_syscalls_work",
        ok(&["OK,OK,ENOSYS"]),
        "mseal (462) is new in 6.10: older kernels answer ENOSYS themselves",
    ),
    (
        (6, 8),
        "newer_real_program_syscalls_reach_the_kernel",
        ok(&[
            "OK,OK,OK,EINVAL,ENOSYS,OK,ENOSYS,ENOSYS,EBADF",
            "OK,OK,OK,EINVAL,EFAULT,OK,ENOSYS,ENOSYS,EBADF",
        ]),
        "cachestat (451) is new in 6.5, statmount/listmount (457/458) in 6.8: older kernels answer ENOSYS themselves",
    ),
];

/// The running kernel's (major, minor).
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release
        .trim()
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    (v.next().unwrap_or(0), v.next().unwrap_or(0))
}

/// The KERNEL_DIFFERENCES rows that apply to the running kernel.
pub fn kernel_differences()
-> impl Iterator<Item = &'static ((u32, u32), &'static str, Expect, &'static str)> {
    let here = kernel_version();
    KERNEL_DIFFERENCES
        .iter()
        .filter(move |(since, _, _, _)| here < *since)
}

/// Whether a DIFFERENCES row for `row` applies to `backend`.
pub fn applies(row: &str, backend: &str) -> bool {
    row == backend || (row == "oci" && ["runc", "crun", "runsc"].contains(&backend))
}

/// The expectation of `probe` on `backend`.
pub fn expectation(probe: &Probe, backend: &str) -> Expect {
    let expect = DIFFERENCES
        .iter()
        .find(|(b, p, _, _)| applies(b, backend) && *p == probe.name)
        .map_or(probe.expect, |(_, _, e, _)| *e);
    kernel_differences()
        .find(|(_, p, _, _)| *p == probe.name)
        .map_or(expect, |(_, _, e, _)| *e)
}

/// The suite's workspace.
#[derive(Debug)]
pub struct Suite {
    pub fx: Fixture,
    pub canary: PathBuf,
    _canary_dir: tempfile::TempDir,
    /// Host listeners a turn must not reach: unix sockets (mode 0777, root's)
    /// in a granted and an ungranted workspace dir, and a TCP listener on
    /// the host's loopback.
    _host_unix: Vec<std::os::unix::net::UnixListener>,
    _host_tcp: std::net::TcpListener,
    host_port: u16,
}

impl Default for Suite {
    fn default() -> Self {
        Self::new()
    }
}

impl Suite {
    pub fn new() -> Self {
        let fx = Fixture::new();
        fx.install("rt", &manifest());
        fx.write("data/users.csv", b"id,name\n1,ada\n");
        fx.write("data/private.txt", b"mine");
        // As real workspaces are: a 0700 root, a 0600 file.
        for (rel, mode) in [("", 0o700), ("data/private.txt", 0o600)] {
            std::fs::set_permissions(
                fx.root.join(rel),
                std::os::unix::fs::PermissionsExt::from_mode(mode),
            )
            .unwrap();
        }
        fx.write("data/secret/key.pem", b"TOPSECRET");
        fx.write("installed/rt/tool.py", b"print('tool')\n");
        // The workspace skeleton (output/, tmp/, planes/) exists before the
        // first probe: the host-integrity oracle watches the root's ctime.
        fx.new_session();
        let dir = tempfile::Builder::new()
            .prefix("ts-canary-")
            .tempdir()
            .unwrap();
        let canary = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(canary.join("canary.txt"), b"").unwrap();
        let host_unix = ["data/host.sock", "private/host.sock"]
            .iter()
            .map(|rel| {
                let path = fx.root.join(rel);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
                std::fs::set_permissions(
                    &path,
                    std::os::unix::fs::PermissionsExt::from_mode(0o777),
                )
                .unwrap();
                l
            })
            .collect();
        let host_tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let host_port = host_tcp.local_addr().unwrap().port();
        Self {
            fx,
            canary,
            _canary_dir: dir,
            _host_unix: host_unix,
            _host_tcp: host_tcp,
            host_port,
        }
    }

    /// Everything under the root except session-owned directories.
    fn shared_snapshot(&self) -> BTreeMap<PathBuf, String> {
        self.fx
            .snapshot()
            .into_iter()
            .filter(|(p, _)| {
                let rel = p.strip_prefix(&self.fx.root).ok();
                let session_owned = rel.is_some_and(|r| {
                    let s = r.to_string_lossy();
                    ["output/SES-", "tmp/SES-", "planes/"]
                        .iter()
                        .any(|pre| s.starts_with(pre))
                        || ["output", "tmp", "planes"].contains(&s.as_ref())
                });
                p.starts_with(&self.fx.root) && !session_owned
            })
            .collect()
    }

    fn subst(&self, code: &str) -> String {
        code.replace("@STATE@", &self.fx.state.display().to_string())
            .replace("@CANARY@", &self.canary.display().to_string())
            .replace("@ROOT@", &self.fx.root.display().to_string())
            .replace("@HOSTPORT@", &self.host_port.to_string())
    }

    /// `supervise run --root … --state-dir … --package rt --json`.
    fn base_args(&self) -> Vec<String> {
        vec![
            "run".into(),
            "--root".into(),
            self.fx.root.display().to_string(),
            "--state-dir".into(),
            self.fx.state.display().to_string(),
            "--package".into(),
            "rt".into(),
            "--json".into(),
            "--backend".into(),
            backend(),
        ]
    }

    fn run_args(&self, session: Option<&str>, outputs: &[&str], argv: &[String]) -> Vec<String> {
        let mut args = self.base_args();
        if let Some(s) = session {
            args.extend(["--session".into(), s.into()]);
        }
        if outputs.is_empty() {
            args.push("--no-outputs".into());
        }
        for o in outputs {
            args.extend(["--output".into(), (*o).into()]);
        }
        args.push("--".into());
        args.extend(argv.iter().cloned());
        args
    }

    fn python(&self, code: &str) -> Vec<String> {
        vec![
            "/usr/bin/python3".into(),
            "-c".into(),
            format!("{PRELUDE}\n{}", self.subst(code)),
        ]
    }

    fn invoke(&self, args: &[String], leak_fd: bool) -> (i32, String, String) {
        let mut cmd = Command::new(supervise_bin());
        cmd.args(args).env_remove("TURNSTILE_LOG");
        let _keep;
        if leak_fd {
            // A writable host descriptor the supervisor inherits without
            // close-on-exec, placed at fd 9 by the shell.
            let f = std::fs::OpenOptions::new()
                .append(true)
                .open(self.canary.join("canary.txt"))
                .unwrap();
            let mut sh = Command::new("/bin/sh");
            sh.arg("-c")
                .arg("exec 9>>\"$CANARY\"; exec \"$@\"")
                .arg("sh")
                .arg(supervise_bin())
                .args(args)
                .env("CANARY", self.canary.join("canary.txt"))
                .env_remove("TURNSTILE_LOG");
            _keep = f;
            cmd = sh;
        }
        let out = cmd.output().expect("spawn supervise");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs one probe and judges it.
    pub fn run(&self, probe: &Probe) -> Outcome {
        let before = self.shared_snapshot();
        let host_before = crate::host_integrity(&self.fx.root);
        let (status, stdout, stderr) = match probe.body {
            Body::Py { code, outputs } => {
                self.invoke(&self.run_args(None, outputs, &self.python(code)), false)
            }
            Body::Sh(script) => self.invoke(
                &self.run_args(
                    None,
                    &[],
                    &["/bin/sh".into(), "-c".into(), self.subst(script)],
                ),
                false,
            ),
            Body::Cli(rest) => {
                let mut args = self.base_args();
                args.extend(rest.iter().map(|s| (*s).to_owned()));
                self.invoke(&args, false)
            }
            Body::LeakedFd(code) => {
                self.invoke(&self.run_args(None, &[], &self.python(code)), true)
            }
            Body::Then {
                setup,
                setup_outputs,
                code,
                outputs,
            } => {
                let (s0, out0, err0) = self.invoke(
                    &self.run_args(None, setup_outputs, &self.python(setup)),
                    false,
                );
                let sid = serde_json::from_str::<Value>(out0.trim())
                    .ok()
                    .and_then(|v| v["session_id"].as_str().map(str::to_owned));
                match (s0, sid) {
                    (0, Some(sid)) => self.invoke(
                        &self.run_args(Some(&sid), outputs, &self.python(code)),
                        false,
                    ),
                    _ => (s0, out0, format!("setup turn failed: {err0}")),
                }
            }
        };
        let json: Value = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
        let sid = json["session_id"].as_str().map(str::to_owned);
        let result = stderr
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("RESULT "))
            .map(str::to_owned);
        let signal = json["termination"]["signal"].as_str().map(str::to_owned);
        let ctx = Ctx {
            root: &self.fx.root,
            state: &self.fx.state,
            canary: &self.canary,
            sid: sid.clone(),
            json: json.clone(),
            stderr: stderr.clone(),
        };

        let mut escapes = Vec::new();
        if self.shared_snapshot() != before {
            escapes.push("the shared workspace changed".to_owned());
        }
        if let Some(change) = crate::host_integrity_changed(&host_before, &self.fx.root) {
            escapes.push(change);
        }
        match std::fs::read(self.canary.join("canary.txt")) {
            Ok(b) if b.is_empty() => {}
            _ => escapes.push("the host canary changed".into()),
        }
        if std::fs::read_dir(&self.canary)
            .map(|d| d.count())
            .unwrap_or(0)
            != 1
        {
            escapes.push("files appeared next to the host canary".into());
        }
        if let Some(sid) = &sid {
            for c in ["memory", "pids", "cpu"] {
                if let Ok(rd) =
                    std::fs::read_dir(Path::new("/sys/fs/cgroup").join(c).join("turnstile"))
                {
                    if rd
                        .filter_map(|e| e.ok())
                        .any(|e| e.file_name().to_string_lossy().starts_with(sid.as_str()))
                    {
                        escapes.push(format!("cgroup {c}/turnstile/{sid}* left behind"));
                    }
                }
            }
            let v = self
                .fx
                .supervise(&["ledger", "verify"], &["--session", sid]);
            if v.status != 0 {
                escapes.push(format!("ledgers do not verify: {}", v.stdout.trim()));
            }
        }
        if let Some(oracle) = probe.oracle {
            if let Err(e) = oracle(&ctx) {
                escapes.push(e);
            }
        }
        let e = expectation(probe, &backend());
        if result.as_deref() == Some("OK") && !e.result.is_empty() && !e.result.contains(&"OK") {
            escapes.push("the blocked operation succeeded".into());
        }

        let mut surprises = Vec::new();
        if !e.status.contains(&status) {
            surprises.push(format!("status {status}"));
        }
        if !e.result.is_empty() && !result.as_deref().is_some_and(|r| e.result.contains(&r)) {
            surprises.push(format!("result {}", result.as_deref().unwrap_or("<none>")));
        }
        if e.signal
            .is_some_and(|want| !want.split('|').any(|w| Some(w) == signal.as_deref()))
        {
            surprises.push(format!("signal {}", signal.as_deref().unwrap_or("<none>")));
        }
        let observed = format!(
            "exit {status}{}{}",
            result
                .as_deref()
                .map(|r| format!(", {r}"))
                .unwrap_or_default(),
            signal
                .as_deref()
                .map(|s| format!(", {s}"))
                .unwrap_or_default()
        );
        let mut expected = format!(
            "exit {}",
            e.status
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("|")
        );
        if !e.result.is_empty() {
            expected += &format!(", {}", e.result.join("|"));
        }
        if let Some(s) = e.signal {
            expected += &format!(", {s}");
        }
        let verdict = if !escapes.is_empty() {
            Verdict::Escape(escapes.join("; "))
        } else if !surprises.is_empty() {
            Verdict::Unexpected(format!(
                "{}; stderr: {}",
                surprises.join(", "),
                stderr.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
            ))
        } else {
            Verdict::Held
        };
        let evidence = evidence_last(&ctx);
        let mut layers: Vec<&str> = evidence["violations"]
            .as_array()
            .map(|v| v.iter().filter_map(|x| x["layer"].as_str()).collect())
            .unwrap_or_default();
        layers.sort_unstable();
        layers.dedup();
        let recorded = if !layers.is_empty() {
            format!("yes: {}", layers.join("+"))
        } else if [11, 12, 13, 14].contains(&status) {
            format!("yes: exit {status}")
        } else if status == 2 {
            "refused: exit 2".into()
        } else {
            "no".into()
        };
        Outcome {
            name: probe.name,
            family: probe.family,
            expected,
            observed,
            verdict,
            note: probe.note,
            recorded,
        }
    }
}

/// Renders the table `cargo xtask redteam` prints.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = format!(
        "{:<40} {:<20} {:<26} {:<26} {:<8} {}\n",
        "probe", "family", "expected", "observed", "verdict", "recorded"
    );
    for o in outcomes {
        s += &format!(
            "{:<40} {:<20} {:<26} {:<26} {:<8} {}\n",
            o.name,
            o.family,
            o.expected,
            o.observed,
            o.verdict.label(),
            o.recorded
        );
        if let Verdict::Unexpected(why) | Verdict::Escape(why) = &o.verdict {
            s += &format!("    -> {why}\n");
        }
    }
    let mut families: BTreeMap<&str, usize> = BTreeMap::new();
    for o in outcomes {
        *families.entry(o.family).or_default() += 1;
    }
    let escapes = outcomes
        .iter()
        .filter(|o| matches!(o.verdict, Verdict::Escape(_)))
        .count();
    let unexpected = outcomes
        .iter()
        .filter(|o| matches!(o.verdict, Verdict::Unexpected(_)))
        .count();
    let recorded = outcomes
        .iter()
        .filter(|o| o.recorded.starts_with("yes") || o.recorded.starts_with("refused"))
        .count();
    s += &format!(
        "\n{} probes, {} escapes, {} unexpected; {} recorded in the evidence (the rest were refused by Landlock or the mount layer, whose refusals are not observable, or are positive probes)\n",
        outcomes.len(),
        escapes,
        unexpected,
        recorded
    );
    for (f, n) in families {
        s += &format!("  {f:<20} {n}\n");
    }
    s
}
