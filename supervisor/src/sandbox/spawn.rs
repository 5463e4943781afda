//! Starting the sandbox's PID 1 (`supervise __sandbox-init`) in its turn's
//! cgroup without the kernel's global threadgroup lock.
//!
//! Moving a process through `cgroup.procs` takes that lock for writing,
//! which waits for an RCU grace period: measured on this project's hosts,
//! 13.4 ms median under load for the first write of a turn (the later ones
//! of the same turn ride on the same grace period). So the child joins:
//!
//! - a v2 directory (a v2 host, or the hybrid layout's unified hierarchy)
//!   at birth, through `clone3` with `CLONE_INTO_CGROUP` (the fork path
//!   takes the lock for reading only);
//! - each v1 hierarchy by writing `0` to its `tasks` (moving only the
//!   calling thread skips the lock; the child is single-threaded, so that
//!   moves the whole process).
//!
//! On x86_64 the child shares this process's memory until its `execve`
//! (`CLONE_VM | CLONE_VFORK`, as `posix_spawn` does), on a stack of its
//! own: no page table is copied and neither side takes copy-on-write
//! faults afterwards. A fork-like `clone3` of the supervisor took ~0.43 ms
//! (bpftrace, cold turns on the 2-core host), and every page either side
//! wrote after it faulted once more.
//!
//! Where `clone3` or `CLONE_INTO_CGROUP` is refused (an older kernel, a
//! seccomp filter around the supervisor, a v2 directory the kernel will not
//! place a process in at birth), the child is forked and writes `0` to the
//! v2 `cgroup.procs` itself, as before: slower, same outcome.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::libc;
use nix::sched::CloneFlags;

use turnstile_init::sys::{CLONE_INTO_CGROUP, CloneArgs, CloneStack};

/// How the child joins the turn's cgroup (see the module docs).
#[derive(Debug, Default)]
pub struct Joins {
    /// Each v1 hierarchy's `tasks`, open for writing.
    pub tasks: Vec<File>,
    /// The v2 directory (for `CLONE_INTO_CGROUP`) and its `cgroup.procs`
    /// (the fallback), when the turn has one.
    pub v2: Option<(OwnedFd, File)>,
}

/// The sandbox's PID 1 as the supervisor holds it.
#[derive(Debug)]
pub struct InitChild {
    pid: nix::unistd::Pid,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    reaped: bool,
    /// How it ended, once reaped: its exit code, or the signal that killed it.
    ended: Option<Result<i32, nix::sys::signal::Signal>>,
}

impl InitChild {
    pub fn id(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// SIGKILL, unless it was reaped already.
    pub fn kill(&mut self) -> std::io::Result<()> {
        if self.reaped {
            return Ok(());
        }
        nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL)
            .map_err(std::io::Error::from)
    }

    /// Waits until it ended (once; later calls return at once).
    pub fn wait(&mut self) -> std::io::Result<()> {
        while !self.reaped {
            match nix::sys::wait::waitpid(self.pid, None) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
                Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => {
                    self.reaped = true;
                    self.ended = Some(Ok(code));
                }
                Ok(nix::sys::wait::WaitStatus::Signaled(_, signal, _)) => {
                    self.reaped = true;
                    self.ended = Some(Err(signal));
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// How it ended (after [`InitChild::wait`]): its exit code, or the
    /// signal that killed it.
    pub fn ended(&self) -> Option<Result<i32, nix::sys::signal::Signal>> {
        self.ended
    }
}

/// What the child is started as.
#[derive(Debug)]
pub struct Spec<'a> {
    pub exe: &'a Path,
    /// argv: `[argv0, arg]`.
    pub argv0: &'a str,
    pub arg: &'a str,
    /// Its whole environment: one variable, and the init's build id
    /// (`turnstile_init::BUILD_ENV`).
    pub env: (&'a str, &'a Path),
    /// Descriptors to place at fixed numbers (dup2 clears close-on-exec).
    pub fds: [(RawFd, RawFd); 4],
    /// Namespaces unshared after joining the cgroup (so the cgroup
    /// namespace is rooted at the turn's cgroup).
    pub unshare: CloneFlags,
    /// A network namespace made beforehand ([`new_netns`]) that the child
    /// joins instead of unsharing one (then `unshare` has no
    /// `CLONE_NEWNET`).
    pub netns: Option<RawFd>,
    /// The child gives up if its parent is no longer this process.
    pub parent: nix::unistd::Pid,
}

fn high(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    let raw = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A close-on-exec pipe whose ends are numbered >= 10, so dup2 onto the
/// low fixed numbers in the child never clobbers another source.
pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok((high(r)?, high(w)?))
}

/// Starts the child (see the module docs); returns it and whether it was
/// placed in the v2 cgroup at birth. Its stdin is an empty pipe, its
/// stdout and stderr pipes to us.
pub fn spawn(spec: &Spec<'_>, joins: &Joins) -> std::io::Result<(InitChild, bool)> {
    let invalid = |_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in an argument");
    // Everything the child needs, built before the fork.
    let exe = CString::new(spec.exe.as_os_str().as_bytes()).map_err(invalid)?;
    let argv = [
        CString::new(spec.argv0).map_err(invalid)?,
        CString::new(spec.arg).map_err(invalid)?,
    ];
    let argv_ptrs = [argv[0].as_ptr(), argv[1].as_ptr(), std::ptr::null()];
    let mut env = spec.env.0.as_bytes().to_vec();
    env.push(b'=');
    env.extend_from_slice(spec.env.1.as_os_str().as_bytes());
    let env = CString::new(env).map_err(invalid)?;
    let build = CString::new(format!(
        "{}={}",
        turnstile_init::BUILD_ENV,
        turnstile_init::BUILD_ID
    ))
    .map_err(invalid)?;
    let envp = [env.as_ptr(), build.as_ptr(), std::ptr::null()];
    let (stdin_r, stdin_w) = pipe()?;
    drop(stdin_w);
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    // The child reports a failure before exec here (errno, 4 bytes); EOF
    // means it exec'd.
    let (fail_r, fail_w) = pipe()?;
    let tasks: Vec<RawFd> = joins.tasks.iter().map(AsRawFd::as_raw_fd).collect();
    if tasks.len() > 16 {
        return Err(std::io::Error::other("more than 16 cgroup hierarchies"));
    }
    let mut task_fds = [-1; 16];
    task_fds[..tasks.len()].copy_from_slice(&tasks);
    let ctx = ChildCtx {
        exe: exe.as_ptr(),
        argv: argv_ptrs.as_ptr(),
        envp: envp.as_ptr(),
        stdio: [stdin_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
        fds: spec.fds,
        tasks: task_fds,
        ntasks: tasks.len(),
        v2_procs: -1,
        netns: spec.netns.unwrap_or(-1),
        unshare: spec.unshare.bits(),
        parent: spec.parent.as_raw(),
        fail: fail_w.as_raw_fd(),
        shared_vm: false,
    };
    let mut into = false;
    let mut pid = -1;
    // A new PID namespace is made by the clone itself: the child is its
    // PID 1 and unshares the other namespaces. (Through fork, the child
    // unshares them all and its own child becomes PID 1.)
    let new_pid = spec.unshare.contains(CloneFlags::CLONE_NEWPID);
    let v2_dir = joins.v2.as_ref().map(|(dir, _)| dir.as_raw_fd());
    if v2_dir.is_some() || new_pid {
        let mut flags = 0;
        if v2_dir.is_some() {
            flags |= CLONE_INTO_CGROUP;
        }
        if new_pid {
            flags |= CloneFlags::CLONE_NEWPID.bits() as u64;
        }
        let args = CloneArgs {
            flags,
            exit_signal: libc::SIGCHLD as u64,
            cgroup: v2_dir.map_or(0, |fd| fd as u64),
            ..CloneArgs::default()
        };
        let ctx = ChildCtx {
            unshare: (spec.unshare - CloneFlags::CLONE_NEWPID).bits(),
            // Its parent is outside its PID namespace, where getppid()
            // reads 0.
            parent: if new_pid { 0 } else { ctx.parent },
            ..ctx
        };
        let rc = clone3(args, &ctx);
        if rc > 0 {
            pid = rc as i32;
            into = v2_dir.is_some();
        }
    }
    if pid < 0 {
        let ctx = ChildCtx {
            v2_procs: joins.v2.as_ref().map_or(-1, |(_, procs)| procs.as_raw_fd()),
            ..ctx
        };
        // SAFETY: as above, for a plain fork.
        match unsafe { nix::unistd::fork() }? {
            // SAFETY: this is the fork's child.
            nix::unistd::ForkResult::Child => unsafe { child(&ctx) },
            nix::unistd::ForkResult::Parent { child } => pid = child.as_raw(),
        }
    }
    drop(fail_w);
    drop(stdin_r);
    drop(out_w);
    drop(err_w);
    let mut init = InitChild {
        pid: nix::unistd::Pid::from_raw(pid),
        stdout: Some(File::from(out_r)),
        stderr: Some(File::from(err_r)),
        reaped: false,
        ended: None,
    };
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match nix::unistd::read(&fail_r, &mut errno[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                let _ = init.kill();
                let _ = init.wait();
                return Err(e.into());
            }
        }
    }
    if got > 0 {
        let _ = init.wait();
        return Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno)));
    }
    Ok((init, into))
}

/// A network namespace being made ([`new_netns`]).
pub type NetnsJob = std::thread::JoinHandle<std::io::Result<OwnedFd>>;

/// Starts making a new network namespace with `lo` up, on a thread of its
/// own (a thread's namespaces are its own; the thread ends once it holds
/// the namespace by a descriptor). A sandbox's init joins it instead of
/// unsharing one: the ~0.6 ms the kernel takes to make a network namespace
/// then runs beside the rest of the sandbox's preparation instead of in
/// the child before its `execve`. Same namespace either way: fresh, owned
/// by the initial user namespace (the sandbox has none of its own), nothing
/// but `lo` in it.
pub fn new_netns() -> NetnsJob {
    std::thread::spawn(|| {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET)?;
        crate::sandbox::sys::loopback_up()?;
        high(File::open("/proc/thread-self/ns/net")?.into())
    })
}

/// Everything the child touches, as raw values (no allocation after fork).
#[derive(Clone, Copy)]
struct ChildCtx {
    exe: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    stdio: [RawFd; 3],
    fds: [(RawFd, RawFd); 4],
    tasks: [RawFd; 16],
    ntasks: usize,
    v2_procs: RawFd,
    netns: RawFd,
    unshare: libc::c_int,
    parent: libc::pid_t,
    fail: RawFd,
    /// The child shares our memory (and inherited our signal handlers):
    /// it execs with every signal still blocked (see [`child`]).
    shared_vm: bool,
}

/// The child's side: death signal, default signal handling, the cgroup
/// joins, its descriptors, the namespaces, exec. Never returns.
///
/// # Safety
///
/// Called only in the child of a fork or fork-like clone3, with `ctx`'s
/// pointers valid there.
unsafe fn child(ctx: &ChildCtx) -> ! {
    // SAFETY: raw syscalls on descriptors and buffers valid in this process
    // (the caller's contract); none allocates or takes a lock.
    unsafe {
        let fail = |fd: RawFd| -> ! {
            let e = *libc::__errno_location();
            let bytes = e.to_ne_bytes();
            libc::write(fd, bytes.as_ptr().cast(), 4);
            libc::_exit(127)
        };
        // The init dies with this thread of supervise, however it dies; if
        // supervise died before that took effect, give up now. (PID 1 of a
        // new namespace cannot tell: its parent is outside, getppid() is 0.
        // Orphaned, it ends at its handshake, whose other ends went with
        // supervise.)
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            fail(ctx.fail);
        }
        if libc::getppid() != ctx.parent {
            *libc::__errno_location() = libc::ESRCH;
            fail(ctx.fail);
        }
        // Sharing our memory, a handler of ours must never run here: every
        // signal stays blocked (see `clone3`) through the execve, which
        // puts every handled signal back to its default; the init clears
        // its mask first thing (`turnstile_init::init::main`). (glibc
        // leaves its own two, 32 and 33, unblocked: their handlers return
        // at once for a signal the process did not send itself, and
        // nothing of ours sends them.) Forked, the mask is cleared here,
        // as std's Command does. Either way SIGPIPE (ignored by the Rust
        // runtime; an ignored disposition survives exec) goes back to its
        // default.
        if !ctx.shared_vm {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        }
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        // Join the turn's cgroup(s): "0" is the writing thread (v1 tasks)
        // or process (v2 cgroup.procs, the fallback).
        if ctx.v2_procs >= 0 && libc::write(ctx.v2_procs, b"0".as_ptr().cast(), 1) != 1 {
            fail(ctx.fail);
        }
        for fd in &ctx.tasks[..ctx.ntasks] {
            if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                fail(ctx.fail);
            }
        }
        // Every source is >= 10: no dup2 clobbers a later one's source.
        for (from, to) in ctx
            .stdio
            .iter()
            .zip(0..)
            .chain(ctx.fds.iter().map(|(from, to)| (from, *to)))
        {
            if libc::dup2(*from, to) < 0 {
                fail(ctx.fail);
            }
        }
        // The namespace made beforehand; one of its own if it cannot join
        // it (the same fresh namespace, made here).
        if ctx.netns >= 0
            && libc::setns(ctx.netns, libc::CLONE_NEWNET) != 0
            && libc::unshare(libc::CLONE_NEWNET) != 0
        {
            fail(ctx.fail);
        }
        if libc::unshare(ctx.unshare) != 0 {
            fail(ctx.fail);
        }
        libc::execve(ctx.exe, ctx.argv, ctx.envp);
        fail(ctx.fail)
    }
}

/// Starts the child of `args` (a `clone3` without `CLONE_VM`, or with it on
/// x86_64: see the module docs); it runs only [`child`]. Returns the pid,
/// or -1 with errno set.
fn clone3(args: CloneArgs, ctx: &ChildCtx) -> libc::c_long {
    // Refused (a kernel or filter that will not share the memory or take
    // the stack): the fork-like clone3 below, same child.
    #[cfg(target_arch = "x86_64")]
    if let Ok(stack) = CloneStack::new(CHILD_STACK_BYTES) {
        let rc = shared_vm::clone3(&args, ctx, &stack);
        if rc > 0 {
            return rc;
        }
    }
    // SAFETY: a fork-like clone3 (no CLONE_VM, no new stack): the child
    // gets a copy of this process and runs only `child`, which makes
    // async-signal-safe raw syscalls on the values prepared by the caller
    // (which its copy of memory holds) and ends in execve or _exit.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if rc == 0 {
        // SAFETY: this is the child of the clone3 above.
        unsafe { child(ctx) }
    }
    rc
}

/// The stack of a child sharing our memory: far more than [`child`] uses
/// (a few hundred bytes of frames, no allocation), and a guard page below.
const CHILD_STACK_BYTES: usize = 64 * 1024;

#[cfg(target_arch = "x86_64")]
mod shared_vm {
    use super::{ChildCtx, CloneArgs, CloneStack, child, libc};

    /// `clone3` with `CLONE_VM | CLONE_VFORK`: the child runs [`entry`] on
    /// `stack` in our memory; this thread resumes once it exec'd or exited.
    /// Every signal is blocked around it, so no handler of ours runs in the
    /// child: it execs with them blocked (see [`child`]). Returns the pid,
    /// or -errno (the
    /// caller then tries the fork-like clone).
    pub(super) fn clone3(args: &CloneArgs, ctx: &ChildCtx, stack: &CloneStack) -> libc::c_long {
        let args = stack.for_clone(CloneArgs {
            flags: args.flags | (libc::CLONE_VM | libc::CLONE_VFORK) as u64,
            ..*args
        });
        let ctx = ChildCtx {
            shared_vm: true,
            ..*ctx
        };
        // SAFETY: sigset_t is plain data; sigfillset initialises it.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above, filled by pthread_sigmask.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid sigset pointers.
        unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        }
        let rc: libc::c_long;
        // SAFETY: the kernel starts the child on `stack` (its top, 16-byte
        // aligned: a page-aligned mapping of whole pages) with our
        // registers; it calls `entry(ctx)`, which never returns (execve or
        // _exit), so the child never runs the code after this block on a
        // stack that is not its own. CLONE_VFORK suspends this thread until
        // then, so `ctx`, `stack` and the values `ctx` points to outlive the
        // child's use of them, and nothing here changes them meanwhile.
        // The parent's side clobbers only what `syscall` does (rcx, r11).
        unsafe {
            std::arch::asm!(
                "syscall",
                "test rax, rax",
                "jnz 2f",
                "xor ebp, ebp",
                "mov rdi, r12",
                "call r13",
                "ud2",
                "2:",
                inlateout("rax") libc::SYS_clone3 => rc,
                in("rdi") &args as *const CloneArgs,
                in("rsi") std::mem::size_of::<CloneArgs>(),
                in("r12") &ctx as *const ChildCtx,
                in("r13") entry as extern "C" fn(*const ChildCtx) -> !,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        rc
    }

    /// The child's first frame, on its own stack.
    extern "C" fn entry(ctx: *const ChildCtx) -> ! {
        // SAFETY: the child of the clone3 above, sharing the parent's
        // memory: `ctx` is the parent's, valid until the child exec'd or
        // exited (CLONE_VFORK); `child` only makes raw syscalls on it.
        unsafe { child(&*ctx) }
    }
}
