//! The seccomp profile as typed data (compiled and loaded by the supervisor).
//!
//! Shape, in the spirit of the OCI/Docker default profile:
//! - an allowlist of the syscalls ordinary programs (python3, git, gcc,
//!   coreutils) use;
//! - `EPERM` for the known-dangerous calls a turn never needs;
//! - `ENOSYS` for everything else, including calls newer than this list (so
//!   libc falls back, and future syscalls are closed by default) and `clone3`
//!   (glibc falls back to `clone`, whose flags a filter can inspect);
//! - argument rules compared on the low 32 bits only, so high garbage bits
//!   in an `int`/`unsigned int` argument cannot slip past a compare the
//!   kernel would truncate anyway;
//! - foreign architectures and x32 numbers kill the process (set by the
//!   compiler, not listed here).

use serde::{Deserialize, Serialize};

pub const EPERM: i32 = 1;
pub const ENOSYS: i32 = 38;
pub const EAFNOSUPPORT: i32 = 97;

const AF_UNIX: u32 = 1;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const AF_NETLINK: u32 = 16;
const NETLINK_ROUTE: u32 = 0;

/// `personality(2)` values a turn may set: PER_LINUX, PER_LINUX32,
/// UNAME26, PER_LINUX32|UNAME26, and 0xffffffff (query) — Docker's set.
const SAFE_PERSONAS: &[u32] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Numbers of syscalls newer than the libseccomp on these machines knows
/// (2.5.4): since Linux 5.1 a new syscall has the same number on x86_64 and
/// aarch64, so the compiler may fall back to it for the native arch.
pub const UNIFIED_NUMBERS: &[(&str, i32)] = &[
    ("futex_waitv", 449),
    ("set_mempolicy_home_node", 450),
    ("cachestat", 451),
    ("fchmodat2", 452),
    ("map_shadow_stack", 453),
    ("futex_wake", 454),
    ("futex_wait", 455),
    ("futex_requeue", 456),
    ("statmount", 457),
    ("listmount", 458),
    ("lsm_get_self_attr", 459),
    ("lsm_set_self_attr", 460),
    ("lsm_list_modules", 461),
    ("mseal", 462),
    ("setxattrat", 463),
    ("getxattrat", 464),
    ("listxattrat", 465),
    ("removexattrat", 466),
];

/// A conditional rule: `(arg[index] & mask) == value` (low 32 bits) →
/// `errno`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgRule {
    pub syscall: String,
    pub arg: u32,
    pub mask: u32,
    pub value: u32,
    pub errno: i32,
    pub why: String,
}

/// An argument allowlist: `syscall` is allowed only when the low 32 bits of
/// `arg` are one of `values`; any other value is refused with `errno`.
/// `refine` narrows one allowed value further by a second argument
/// (`socket(AF_NETLINK, _, protocol)`: NETLINK_ROUTE only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueAllowlist {
    pub syscall: String,
    pub arg: u32,
    pub values: Vec<u32>,
    pub errno: i32,
    pub why: String,
    #[serde(default)]
    pub refine: Option<Refine>,
}

/// For `arg == value` (of the enclosing allowlist), also require the low 32
/// bits of `arg2` to be one of `values`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refine {
    pub value: u32,
    pub arg2: u32,
    pub values: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompProfile {
    /// errno for anything not listed.
    pub default_errno: i32,
    pub allow: Vec<String>,
    /// Denied with EPERM.
    pub deny: Vec<String>,
    /// Denied with ENOSYS explicitly (so libc falls back).
    pub enosys: Vec<String>,
    /// Checked before `allow`.
    pub arg_rules: Vec<ArgRule>,
    /// Syscalls allowed only for listed argument values.
    #[serde(default)]
    pub allowlists: Vec<ValueAllowlist>,
}

const ALLOW: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "alarm",
    "arch_prctl",
    "bind",
    "brk",
    "cachestat",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "clock_getres",
    "clock_gettime",
    "clock_nanosleep",
    "clone",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fallocate",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchownat",
    "fcntl",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "futex_requeue",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "futimesat",
    "get_mempolicy",
    "get_robust_list",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresuid",
    "getrlimit",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",
    "getxattrat",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_setup",
    "io_submit",
    "ioctl",
    "ioprio_get",
    "ioprio_set",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "listxattrat",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lsm_get_self_attr",
    "lsm_list_modules",
    "lstat",
    "madvise",
    "map_shadow_stack",
    "mbind",
    "membarrier",
    "memfd_create",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedsend",
    "mq_unlink",
    "mremap",
    "mseal",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "pselect6",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recvfrom",
    "recvmmsg",
    "recvmsg",
    "removexattr",
    "removexattrat",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "sendfile",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "set_mempolicy",
    "set_mempolicy_home_node",
    "set_robust_list",
    "set_tid_address",
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setresgid",
    "setresuid",
    "setreuid",
    "setrlimit",
    "setsid",
    "setsockopt",
    "setuid",
    "setxattr",
    "setxattrat",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "splice",
    "stat",
    "statfs",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "times",
    "tkill",
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "write",
    "writev",
];

/// Why the baseline denies `name` (for hints in the evidence), when it does.
pub fn deny_reason(name: &str) -> Option<&'static str> {
    if !DENY.contains(&name) {
        return None;
    }
    Some(match name {
        "mount" | "umount" | "umount2" | "pivot_root" | "chroot" | "fsconfig" | "fsmount"
        | "fsopen" | "fspick" | "mount_setattr" | "move_mount" | "open_tree" => {
            "it changes the mount table, the view the sandbox is built from"
        }
        "unshare" | "setns" => {
            "it creates or enters namespaces (new privileges in a user namespace)"
        }
        "bpf" | "perf_event_open" => "it loads programs into, or observes, the host kernel",
        "init_module" | "finit_module" | "delete_module" | "kexec_load" | "kexec_file_load" => {
            "it changes the host kernel"
        }
        "keyctl" | "add_key" | "request_key" => "kernel keyrings are not namespaced",
        "io_uring_setup" | "io_uring_enter" | "io_uring_register" => {
            "io_uring performs I/O outside the syscall filter"
        }
        "ptrace" | "process_vm_readv" | "process_vm_writev" | "kcmp" | "pidfd_getfd" => {
            "it reads or changes another process"
        }
        "name_to_handle_at" | "open_by_handle_at" => "file handles bypass path-based confinement",
        "clock_settime" | "clock_adjtime" | "adjtimex" | "settimeofday" => {
            "the clock is the host's"
        }
        _ => "it reaches host state a turn must not change",
    })
}

const DENY: &[&str] = &[
    "acct",
    "add_key",
    "adjtimex",
    "bpf",
    "chroot",
    "clock_adjtime",
    "clock_settime",
    "delete_module",
    "fanotify_init",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "memfd_secret",
    "migrate_pages",
    "mount",
    "mount_setattr",
    "move_mount",
    "move_pages",
    "name_to_handle_at",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pidfd_getfd",
    "pivot_root",
    "process_madvise",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "setdomainname",
    "sethostname",
    "setns",
    "settimeofday",
    "swapoff",
    "swapon",
    "syslog",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vhangup",
];

/// Namespace-creating clone flags (all in the low 32 bits).
const CLONE_NS_FLAGS: &[(u32, &str)] = &[
    (0x0002_0000, "CLONE_NEWNS"),
    (0x0200_0000, "CLONE_NEWCGROUP"),
    (0x0400_0000, "CLONE_NEWUTS"),
    (0x0800_0000, "CLONE_NEWIPC"),
    (0x1000_0000, "CLONE_NEWUSER"),
    (0x2000_0000, "CLONE_NEWPID"),
    (0x4000_0000, "CLONE_NEWNET"),
];

/// A masked compare on the low 32 bits of one argument:
/// `(arg & mask) == value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaskedEq {
    pub arg: u32,
    pub mask: u32,
    pub value: u32,
}

impl MaskedEq {
    pub fn matches(&self, x: u32) -> bool {
        x & self.mask == self.value
    }
}

/// The allow conditions for a syscall with argument rules, chosen to be
/// *disjoint* from the deny conditions. libseccomp resolves overlapping
/// allow and errno rules of one syscall by tree order, not by restrictiveness
/// (an always-true conditional allow was measured to let `TIOCSTI` through),
/// so the filter must never depend on it.
///
/// - single-bit flag rules (clone namespace flags): allow when none of the
///   bits is set;
/// - equality rules: allow the complement of the denied values, as a union
///   of masked-equal "cubes" (at most 32 per denied value).
pub fn allow_conditions(rules: &[&ArgRule]) -> Result<Vec<MaskedEq>, String> {
    let Some(first) = rules.first() else {
        return Ok(Vec::new());
    };
    let arg = first.arg;
    if rules.iter().any(|r| r.arg != arg) {
        return Err(format!("{}: rules on different arguments", first.syscall));
    }
    if rules
        .iter()
        .all(|r| r.mask == r.value && r.mask.count_ones() == 1)
    {
        let any = rules.iter().fold(0u32, |m, r| m | r.mask);
        return Ok(vec![MaskedEq {
            arg,
            mask: any,
            value: 0,
        }]);
    }
    if rules.iter().any(|r| r.mask != u32::MAX) {
        return Err(format!(
            "{}: mix of flag and partial-mask rules",
            first.syscall
        ));
    }
    let values: Vec<u32> = rules.iter().map(|r| r.value).collect();
    Ok(complement_cubes(&values)
        .into_iter()
        .map(|(mask, value)| MaskedEq { arg, mask, value })
        .collect())
}

/// Masked-equal "cubes" `(mask, value)` that together match every 32-bit
/// value except `values`, each value outside matched by exactly one cube.
pub fn complement_cubes(values: &[u32]) -> Vec<(u32, u32)> {
    // Start with the whole space and carve out each value.
    let mut cubes = vec![(0u32, 0u32)];
    for &v in values {
        let mut next = Vec::new();
        for (mask, value) in cubes {
            if v & mask != value {
                next.push((mask, value));
                continue;
            }
            // Split on every free bit, high to low: the part of the cube
            // that agrees with `v` on the higher free bits and differs on
            // this one. Together these cover the cube minus `v`.
            let mut m = mask;
            for bit in (0..32).rev() {
                let b = 1u32 << bit;
                if mask & b != 0 {
                    continue;
                }
                next.push((m | b, (v & m) | (!v & b)));
                m |= b;
            }
        }
        cubes = next;
    }
    cubes
}

impl SeccompProfile {
    /// turnstile's default profile.
    pub fn default_profile() -> Self {
        let mut arg_rules: Vec<ArgRule> = CLONE_NS_FLAGS
            .iter()
            .map(|(flag, name)| ArgRule {
                syscall: "clone".into(),
                arg: 0,
                mask: *flag,
                value: *flag,
                errno: EPERM,
                why: format!("clone with {name} creates a namespace"),
            })
            .collect();
        for (cmd, name) in [(0x5412u32, "TIOCSTI"), (0x541C, "TIOCLINUX")] {
            arg_rules.push(ArgRule {
                syscall: "ioctl".into(),
                arg: 1,
                mask: u32::MAX,
                value: cmd,
                errno: EPERM,
                why: format!("ioctl {name} injects terminal input"),
            });
        }
        let allowlists = vec![
            ValueAllowlist {
                syscall: "socket".into(),
                arg: 0,
                values: vec![AF_UNIX, AF_INET, AF_INET6, AF_NETLINK],
                errno: EAFNOSUPPORT,
                why: "socket families by allowlist: unix, IPv4, IPv6, and netlink for routing only (AF_PACKET sees raw traffic, AF_ALG/AF_VSOCK/AF_KEY/… reach kernel subsystems a turn never needs)".into(),
                refine: Some(Refine {
                    value: AF_NETLINK,
                    arg2: 2,
                    values: vec![NETLINK_ROUTE],
                }),
            },
            ValueAllowlist {
                syscall: "socketpair".into(),
                arg: 0,
                values: vec![AF_UNIX],
                errno: EAFNOSUPPORT,
                why: "socketpair exists for AF_UNIX only".into(),
                refine: None,
            },
            ValueAllowlist {
                syscall: "personality".into(),
                arg: 0,
                values: SAFE_PERSONAS.to_vec(),
                errno: EPERM,
                why: "safe personas only (PER_LINUX, PER_LINUX32, UNAME26 and the query); READ_IMPLIES_EXEC and friends weaken memory protections".into(),
                refine: None,
            },
        ];
        Self {
            default_errno: ENOSYS,
            allow: ALLOW.iter().map(|s| (*s).to_owned()).collect(),
            deny: DENY.iter().map(|s| (*s).to_owned()).collect(),
            enosys: vec!["clone3".into()],
            arg_rules,
            allowlists,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules_for(p: &SeccompProfile, name: &str) -> Vec<ArgRule> {
        p.arg_rules
            .iter()
            .filter(|r| r.syscall == name)
            .cloned()
            .collect()
    }

    /// For every probe value exactly one side matches: an allow cube or a
    /// deny rule — never both (no reliance on libseccomp precedence), never
    /// neither (no over-blocking).
    #[test]
    fn allow_conditions_partition_the_argument_space() {
        let p = SeccompProfile::default_profile();
        for name in ["clone", "ioctl"] {
            let rules = rules_for(&p, name);
            let refs: Vec<&ArgRule> = rules.iter().collect();
            let allow = allow_conditions(&refs).unwrap();
            assert!(allow.len() <= 64, "{name}: {} cubes", allow.len());
            let mut probes: Vec<u32> = vec![
                0,
                1,
                u32::MAX,
                0x5401,
                0x5412,
                0x5413,
                0x541C,
                0x5411,
                17,
                16,
                18,
                0x0001_1200,
            ];
            probes.extend(rules.iter().map(|r| r.value));
            probes.extend(rules.iter().map(|r| r.value | 0x8000_0000));
            let mut x: u32 = 0x9E37_79B9;
            for _ in 0..20_000 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                probes.push(x);
            }
            for v in probes {
                let denied = rules.iter().any(|r| v & r.mask == r.value);
                let allowed = allow.iter().filter(|c| c.matches(v)).count();
                assert!(
                    allowed <= 1 || !denied,
                    "{name}: {v:#x} both allowed and denied"
                );
                assert_eq!(
                    allowed > 0,
                    !denied,
                    "{name}: {v:#x} allowed={allowed} denied={denied}"
                );
            }
        }
    }

    /// An allowlist's allowed values and its errno cubes partition the
    /// argument space: every value is exactly one of the two.
    #[test]
    fn allowlists_partition_the_argument_space() {
        let p = SeccompProfile::default_profile();
        for a in &p.allowlists {
            let cubes = complement_cubes(&a.values);
            let mut probes: Vec<u32> = vec![
                0,
                1,
                2,
                3,
                8,
                9,
                10,
                11,
                16,
                17,
                38,
                40,
                0x20000,
                0x20008,
                0x0040_0000,
                u32::MAX,
            ];
            let mut x: u32 = 0x1234_5678;
            for _ in 0..20_000 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                probes.push(x);
            }
            for v in probes {
                let allowed = a.values.contains(&v);
                let denied = cubes.iter().filter(|(m, val)| v & m == *val).count();
                assert_eq!(denied, usize::from(!allowed), "{}: {v:#x}", a.syscall);
            }
        }
        let socket = p.allowlists.iter().find(|a| a.syscall == "socket").unwrap();
        assert_eq!(socket.values, vec![1, 2, 10, 16]);
        assert_eq!(socket.refine.as_ref().unwrap().values, vec![0]);
    }

    #[test]
    fn lists_are_disjoint_and_sorted_for_review() {
        let p = SeccompProfile::default_profile();
        for d in p.deny.iter().chain(&p.enosys) {
            assert!(!p.allow.contains(d), "{d} is both allowed and denied");
        }
        for a in &p.allowlists {
            assert!(
                !p.allow.contains(&a.syscall),
                "{} also unconditionally allowed",
                a.syscall
            );
            assert!(!p.deny.contains(&a.syscall), "{} also denied", a.syscall);
        }
        for must in [
            "ioprio_get",
            "ioprio_set",
            "get_mempolicy",
            "set_mempolicy",
            "mbind",
            "futex_waitv",
            "cachestat",
            "mseal",
            "fchmodat2",
        ] {
            assert!(p.allow.iter().any(|a| a == must), "{must} not allowed");
        }
        let mut sorted = p.allow.clone();
        sorted.sort();
        assert_eq!(sorted, p.allow);
        for must in [
            "ptrace",
            "mount",
            "unshare",
            "setns",
            "bpf",
            "keyctl",
            "io_uring_setup",
            "perf_event_open",
            "userfaultfd",
            "init_module",
            "kexec_load",
            "open_by_handle_at",
            "process_vm_readv",
        ] {
            assert!(p.deny.iter().any(|d| d == must), "{must} not denied");
        }
    }
}
