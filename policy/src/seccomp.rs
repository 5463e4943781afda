//! The seccomp profile as typed data (compiled and loaded by the supervisor).
//!
//! Shape, in the spirit of the OCI/Docker default profile:
//! - an allowlist of the syscalls ordinary programs (python3, git, gcc,
//!   coreutils) use;
//! - `EPERM` for the known-dangerous calls a turn never needs, each with its
//!   reason in one table (`DENY`, the hints in the evidence);
//! - `ENOSYS` for everything else, including calls newer than this list (so
//!   libc falls back, and future syscalls are closed by default), and on
//!   purpose, with reasons (`ENOSYS_ON_PURPOSE`), for `clone3` (glibc falls
//!   back to `clone`, whose flags a filter can inspect) and `modify_ldt`;
//! - argument allowlists: `socket` families (unix, IPv4, IPv6, netlink for
//!   NETLINK_ROUTE only; EAFNOSUPPORT otherwise), `socketpair` (unix),
//!   `personality` (Docker's safe personas; EPERM otherwise);
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
    /// Syscalls whose extended-attribute name the supervisor reads before
    /// they run (user notification): a name under
    /// [`OVERLAY_XATTR_PREFIXES`] is refused with EPERM, any other
    /// continues. Without a listener (an OCI runtime installs the filter)
    /// they are plain allows.
    #[serde(default)]
    pub xattr_checked: Vec<XattrCheck>,
}

/// A syscall that sets an extended attribute, and which argument holds the
/// attribute's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XattrCheck {
    pub syscall: String,
    pub name_arg: u32,
}

/// Extended-attribute names private to overlayfs: a turn never sets them on
/// its overlay (inert at commit, which copies no xattrs — but an overlay
/// mounted with `userxattr` would honour `user.overlay.opaque`, and
/// `trusted.overlay.*` is overlay's own metadata).
pub const OVERLAY_XATTR_PREFIXES: &[&str] = &["user.overlay.", "trusted.overlay."];

/// Why [`OVERLAY_XATTR_PREFIXES`] are refused (the hint of a recorded
/// refusal).
pub const OVERLAY_XATTR_WHY: &str = "extended attributes named user.overlay.* or trusted.overlay.* are overlayfs's own metadata (opaque directories, redirects, origins): a turn never sets them on its overlay";

/// The syscalls that set an xattr: (name, index of the name argument).
const XATTR_SETTERS: &[(&str, u32)] = &[
    ("setxattr", 1),
    ("lsetxattr", 1),
    ("fsetxattr", 1),
    ("setxattrat", 3),
];

/// Allowed unconditionally: Docker's unconditional list for the native
/// architecture, minus what `DENY` and `ENOSYS_ON_PURPOSE` say why not,
/// plus what Docker grants only with a capability but is harmless without
/// one for a process of the turn (`get/set_mempolicy`, `mbind`,
/// `set_mempolicy_home_node`: NUMA placement of its own memory). Entries
/// worth a word:
/// - `seccomp`: a stacked filter can only narrow (the most restrictive
///   action of all filters wins), `prctl(PR_SET_SECCOMP)` reaches the same
///   code, and a second listener is refused (EBUSY) because ours has one;
///   browsers, Electron apps and nested sandboxes install their own;
/// - `listmount`/`statmount`: the turn's own mount namespace only (others
///   need CAP_SYS_ADMIN over them), what `/proc/self/mountinfo` shows;
///   newer util-linux (`findmnt`) uses them;
/// - `prctl`: `PR_SET_NAME` (thread names) and the rest; the options that
///   matter need capabilities the turn does not have;
/// - `io_setup`/`io_submit`…: legacy AIO only reads and writes descriptors
///   the turn already opened through the filter, unlike io_uring, which
///   opens, connects and more on its own.
/// - `unshare`: only without a namespace flag (argument rules,
///   [`unshare_ns_flags`]): `CLONE_FS`, `CLONE_FILES` and `CLONE_SYSVSEM`
///   give the caller its own copy of state it shared (cwd and umask, the
///   descriptor table, semaphore undo) and create nothing; libraries do
///   it before exec or in worker threads (real-software audit).
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
    "listmount",
    "listxattr",
    "listxattrat",
    "llistxattr",
    "lremovexattr",
    "lseek",
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
    "process_mrelease",
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
    "remap_file_pages",
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
    "seccomp",
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
    "statmount",
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
    "unshare",
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
    DENY.iter().find(|(n, _)| *n == name).map(|(_, why)| *why)
}

/// Why the baseline answers `name` with ENOSYS on purpose, when it does.
pub fn enosys_reason(name: &str) -> Option<&'static str> {
    ENOSYS_ON_PURPOSE
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, why)| *why)
}

/// Refused with EPERM (observed by user notification, see
/// `supervisor::sandbox::notify`), each with the reason shown as the hint in
/// the evidence. The turn runs without capabilities, so the kernel would
/// refuse most of these anyway; the filter refuses them before the kernel
/// parses a single argument, which is what matters for the ones with a
/// history of bugs reachable without privileges, and records the attempt.
/// Where Docker's default profile allows a call unconditionally and we do
/// not, the reason says so.
const DENY: &[(&str, &str)] = &[
    ("acct", "process accounting is switched for the whole host"),
    (
        "add_key",
        "kernel keyrings are not namespaced: a key is visible to other users of the host's keyrings",
    ),
    (
        "adjtimex",
        "it tunes the host's clock (Docker allows the read-only use; no turn program needs it)",
    ),
    (
        "bpf",
        "it loads programs into, or reads maps of, the host kernel",
    ),
    (
        "chroot",
        "it changes the root the sandbox view is built on (Landlock does not govern chroot)",
    ),
    ("clock_adjtime", "it tunes the host's clock"),
    (
        "clock_settime",
        "it sets the host's clock (a time namespace only offsets reads)",
    ),
    ("delete_module", "it unloads a module from the host kernel"),
    (
        "fanotify_init",
        "fanotify watches whole mounts and filesystems beyond the view",
    ),
    ("finit_module", "it loads a module into the host kernel"),
    (
        "fsconfig",
        "new mount API: it changes the mount table, the view the sandbox is built from",
    ),
    (
        "fsmount",
        "new mount API: it changes the mount table, the view the sandbox is built from",
    ),
    (
        "fsopen",
        "new mount API: it changes the mount table, the view the sandbox is built from",
    ),
    (
        "fspick",
        "new mount API: it changes the mount table, the view the sandbox is built from",
    ),
    ("init_module", "it loads a module into the host kernel"),
    (
        "io_uring_enter",
        "io_uring submits openat, connect, read… through shared memory, never through the syscall filter, so no seccomp rule (socket families included) would apply to them; it is also the largest recent source of kernel privilege escalations",
    ),
    (
        "io_uring_register",
        "io_uring submits openat, connect, read… through shared memory, never through the syscall filter, so no seccomp rule (socket families included) would apply to them; it is also the largest recent source of kernel privilege escalations",
    ),
    (
        "io_uring_setup",
        "io_uring submits openat, connect, read… through shared memory, never through the syscall filter, so no seccomp rule (socket families included) would apply to them; it is also the largest recent source of kernel privilege escalations",
    ),
    ("ioperm", "raw access to the host's I/O ports"),
    ("iopl", "raw access to the host's I/O ports"),
    (
        "kcmp",
        "it compares the kernel objects of other processes (a ptrace-class call)",
    ),
    ("kexec_file_load", "it replaces the running host kernel"),
    ("kexec_load", "it replaces the running host kernel"),
    ("keyctl", "kernel keyrings are not namespaced"),
    (
        "lookup_dcookie",
        "it resolves kernel directory cookies (a profiling interface; removed in Linux 6.10)",
    ),
    (
        "memfd_secret",
        "secret memory is taken out of the kernel's direct map, cannot be swapped and fragments the host's memory (Docker allows it; no ordinary program uses it)",
    ),
    (
        "migrate_pages",
        "it moves another process's memory between NUMA nodes",
    ),
    (
        "mount",
        "it changes the mount table, the view the sandbox is built from",
    ),
    (
        "mount_setattr",
        "it changes mount flags (read-only, idmapping) of the view",
    ),
    (
        "move_mount",
        "new mount API: it changes the mount table, the view the sandbox is built from",
    ),
    (
        "move_pages",
        "it moves (or, for another pid, inspects) memory between NUMA nodes",
    ),
    (
        "name_to_handle_at",
        "a file handle is only good for open_by_handle_at, which bypasses path-based confinement (Docker allows this half; callers such as systemd fall back on EPERM)",
    ),
    (
        "open_by_handle_at",
        "file handles bypass path-based confinement (the 'shocker' container escape)",
    ),
    (
        "open_tree",
        "it clones mounts out of the view (new mount API)",
    ),
    (
        "perf_event_open",
        "it observes the host kernel and other processes; a frequent source of kernel bugs",
    ),
    ("pidfd_getfd", "it takes descriptors out of another process"),
    (
        "pivot_root",
        "it changes the root the sandbox view is built on",
    ),
    ("process_madvise", "it acts on another process's memory"),
    ("process_vm_readv", "it reads another process's memory"),
    ("process_vm_writev", "it writes another process's memory"),
    (
        "ptrace",
        "it reads and rewrites another process, including its syscalls after the filter has checked them (Docker allows it on Linux ≥ 4.8; debuggers and strace inside a turn are not supported)",
    ),
    ("quotactl", "disk quotas are the host's"),
    ("quotactl_fd", "disk quotas are the host's"),
    ("reboot", "it restarts or halts the host"),
    (
        "request_key",
        "kernel keyrings are not namespaced, and it can run a host upcall helper",
    ),
    (
        "setdomainname",
        "the turn's identity (UTS namespace) is fixed by the plan",
    ),
    (
        "sethostname",
        "the turn's identity (UTS namespace) is fixed by the plan",
    ),
    (
        "setns",
        "it enters namespaces other than the turn's, through descriptors it was passed or finds",
    ),
    (
        "settimeofday",
        "it sets the host's clock (a time namespace only offsets reads)",
    ),
    ("swapoff", "it changes the host's swap devices"),
    ("swapon", "it changes the host's swap devices"),
    (
        "syslog",
        "the kernel log is the host's (it reveals kernel addresses and other tenants' messages)",
    ),
    (
        "umount2",
        "it changes the mount table, the view the sandbox is built from",
    ),
    (
        "uselib",
        "an a.out-era loader call; no modern program uses it",
    ),
    (
        "userfaultfd",
        "it stalls kernel accesses to user memory at will, the standard tool for widening kernel race windows",
    ),
    (
        "ustat",
        "an obsolete call that looks filesystems up by host device number; statfs(2) does the same by path",
    ),
    ("vhangup", "it hangs up the terminal of other processes"),
];

/// Answered with ENOSYS on purpose: the default already is ENOSYS, the list
/// says why these in particular are not allowed (and, where Docker allows
/// them, why we differ).
const ENOSYS_ON_PURPOSE: &[(&str, &str)] = &[
    (
        "clone3",
        "its flags are in memory, out of the filter's reach: ENOSYS makes glibc fall back to clone, whose namespace flags the filter refuses (Docker does the same)",
    ),
    (
        "modify_ldt",
        "16-bit segments are only for Wine and DOS emulators, and the LDT has a long record of kernel bugs (Docker allows it on x86)",
    ),
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

/// `CLONE_NEWTIME`: a namespace flag for `unshare` (and `clone3`) only.
/// In `clone(2)` the bit is part of the exit-signal byte (CSIGNAL), so it
/// is no rule there.
const CLONE_NEWTIME: (u32, &str) = (0x0000_0080, "CLONE_NEWTIME");

/// The `unshare` flags refused: every namespace flag. What stays allowed
/// creates nothing (`CLONE_FS`, `CLONE_FILES`, `CLONE_SYSVSEM`, and the
/// no-ops `CLONE_THREAD`, `CLONE_SIGHAND`, `CLONE_VM` of a single thread).
/// The kernel takes the flags as an `unsigned long` and refuses a bit it
/// does not know (EINVAL), so a compare on the low 32 bits, where every
/// namespace flag lies, misses nothing.
fn unshare_ns_flags() -> impl Iterator<Item = &'static (u32, &'static str)> {
    CLONE_NS_FLAGS.iter().chain(std::iter::once(&CLONE_NEWTIME))
}

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
        arg_rules.extend(unshare_ns_flags().map(|(flag, name)| ArgRule {
            syscall: "unshare".into(),
            arg: 0,
            mask: *flag,
            value: *flag,
            errno: EPERM,
            why: format!(
                "unshare with {name} creates a namespace, and a turn's namespaces are its plan's (a user namespace grants new capabilities over new kernel attack surface); unshare without a namespace flag (CLONE_FS, CLONE_FILES, CLONE_SYSVSEM) is allowed"
            ),
        }));
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
            deny: DENY.iter().map(|(s, _)| (*s).to_owned()).collect(),
            enosys: ENOSYS_ON_PURPOSE
                .iter()
                .map(|(s, _)| (*s).to_owned())
                .collect(),
            arg_rules,
            allowlists,
            xattr_checked: XATTR_SETTERS
                .iter()
                .map(|(s, a)| XattrCheck {
                    syscall: (*s).to_owned(),
                    name_arg: *a,
                })
                .collect(),
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
        for name in ["clone", "unshare", "ioctl"] {
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

    /// The reason table is the review surface: one entry per refused
    /// syscall, sorted, each with a reason of its own, and the hints in the
    /// evidence come from it (no catch-all).
    #[test]
    fn every_refusal_has_its_own_reason() {
        for table in [DENY, ENOSYS_ON_PURPOSE] {
            let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
            let mut sorted = names.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted, names, "table not sorted or has duplicates");
            for (name, why) in table {
                assert!(why.len() > 20, "{name}: reason too thin: {why:?}");
            }
        }
        let p = SeccompProfile::default_profile();
        assert_eq!(p.deny.len(), DENY.len());
        for name in &p.deny {
            assert!(
                deny_reason(name).is_some(),
                "{name} denied without a reason"
            );
        }
        for name in &p.enosys {
            assert!(enosys_reason(name).is_some(), "{name} without a reason");
        }
        for name in &p.allow {
            assert_eq!(deny_reason(name), None, "{name}");
            assert_eq!(enosys_reason(name), None, "{name}");
        }
        assert!(
            deny_reason("io_uring_setup")
                .unwrap()
                .contains("never through the syscall filter")
        );
    }

    /// What the issue found over-blocked, and Docker's unconditional calls
    /// a turn's program may use, are allowed (unconditionally or by an
    /// argument allowlist).
    #[test]
    fn real_program_syscalls_are_allowed() {
        let p = SeccompProfile::default_profile();
        let allowed =
            |n: &str| p.allow.iter().any(|a| a == n) || p.allowlists.iter().any(|a| a.syscall == n);
        for n in [
            "ioprio_get",
            "ioprio_set",
            "personality",
            "get_mempolicy",
            "set_mempolicy",
            "set_mempolicy_home_node",
            "mbind",
            "futex_waitv",
            "cachestat",
            "mseal",
            "rseq",
            "prctl",
            "seccomp",
            "listmount",
            "statmount",
            "process_mrelease",
            "remap_file_pages",
            "membarrier",
            "clone",
            "unshare",
            "socket",
            "socketpair",
        ] {
            assert!(allowed(n), "{n} is not allowed");
        }
        // Newer than libseccomp 2.5.4: compiled by number, so each needs one.
        for n in [
            "futex_waitv",
            "cachestat",
            "mseal",
            "listmount",
            "statmount",
        ] {
            assert!(UNIFIED_NUMBERS.iter().any(|(u, _)| *u == n), "{n}");
        }
    }

    /// Nothing can create a namespace: clone3 answers ENOSYS (its flags
    /// are out of reach), clone and unshare are refused with each CLONE_NEW*
    /// flag (unshare with CLONE_NEWTIME too), and setns is denied. unshare
    /// without one (CLONE_FS, CLONE_FILES, CLONE_SYSVSEM) is allowed.
    #[test]
    fn namespaces_stay_closed() {
        let p = SeccompProfile::default_profile();
        assert!(p.enosys.iter().any(|n| n == "clone3"));
        assert!(!p.allow.iter().any(|n| n == "clone3"));
        assert!(p.deny.iter().any(|d| d == "setns"));
        let all_new = 0x0002_0000 | 0x7e00_0000;
        let clone = rules_for(&p, "clone");
        let refused = clone.iter().fold(0u32, |m, r| m | r.value);
        assert_eq!(refused, all_new);
        assert!(clone.iter().all(|r| r.arg == 0 && r.errno == EPERM));
        let unshare = rules_for(&p, "unshare");
        let refused = unshare.iter().fold(0u32, |m, r| m | r.value);
        assert_eq!(refused, all_new | 0x80, "CLONE_NEWTIME included");
        assert!(unshare.iter().all(|r| r.arg == 0 && r.errno == EPERM));
        assert!(!p.deny.iter().any(|d| d == "unshare"));
        let refs: Vec<&ArgRule> = unshare.iter().collect();
        let allow = allow_conditions(&refs).unwrap();
        let allowed = |flags: u32| allow.iter().any(|c| c.matches(flags));
        // CLONE_FS, CLONE_FILES, CLONE_SYSVSEM, the three, and nothing.
        for flags in [0x200, 0x400, 0x4_0000, 0x4_0600, 0] {
            assert!(allowed(flags), "{flags:#x}");
        }
        for flags in [0x1000_0000, 0x2_0000, 0x80, 0x1000_0200, 0x4000_0400] {
            assert!(!allowed(flags), "{flags:#x}");
        }
    }

    /// The socket allowlist: families and the netlink protocol decided on
    /// the low 32 bits; the type argument (SOCK_CLOEXEC, SOCK_NONBLOCK) is
    /// never constrained, so those flags keep working.
    #[test]
    fn socket_families_by_allowlist() {
        let p = SeccompProfile::default_profile();
        let socket = p.allowlists.iter().find(|a| a.syscall == "socket").unwrap();
        assert_eq!(socket.arg, 0);
        assert_eq!(socket.errno, EAFNOSUPPORT);
        for refused in [17u32, 38, 40, 15, 31, 44, 0, u32::MAX] {
            assert!(!socket.values.contains(&refused), "{refused}");
        }
        let refine = socket.refine.as_ref().unwrap();
        assert_eq!((refine.value, refine.arg2), (AF_NETLINK, 2));
        assert_eq!(refine.values, vec![NETLINK_ROUTE]);
        let pair = p
            .allowlists
            .iter()
            .find(|a| a.syscall == "socketpair")
            .unwrap();
        assert_eq!(pair.values, vec![AF_UNIX]);
        assert!(
            !p.arg_rules.iter().any(|r| r.syscall.starts_with("socket")),
            "no rule on the socket type"
        );
        let persona = p
            .allowlists
            .iter()
            .find(|a| a.syscall == "personality")
            .unwrap();
        assert_eq!(persona.values, vec![0, 8, 0x20000, 0x20008, u32::MAX]);
        assert!(!persona.values.contains(&0x0040_0000), "ADDR_NO_RANDOMIZE");
        assert!(!persona.values.contains(&0x0400_0000), "READ_IMPLIES_EXEC");
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
