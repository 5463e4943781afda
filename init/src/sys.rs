//! The few kernel interfaces the sandbox init needs that `nix` does not wrap:
//! idmapped mounts (`open_tree`, `mount_setattr`, `move_mount`), source
//! resolution that never follows a symlink (`openat2`), and bringing up the
//! loopback interface of a fresh network namespace.
//!
//! Only the init (a fresh single-threaded process) calls these.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};

// <linux/mount.h>, not in the libc crate.
const OPEN_TREE_CLONE: u32 = 1;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` (MOUNT_ATTR_SIZE_VER0).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn cpath(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path with NUL"))
}

fn check(rc: nix::libc::c_long) -> std::io::Result<nix::libc::c_long> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A user namespace whose only mappings are `host_uid -> uid` and
/// `host_gid -> gid`, as a descriptor for `MOUNT_ATTR_IDMAP`: a waiter
/// process born in it ([`userns_waiter`]) holds it until its maps are
/// written and its descriptor is open.
/// `proc` is a procfs of the caller's PID namespace for children (the
/// waiter's pid is looked up there).
fn mapping_userns(proc: &Path, host: (u32, u32), turn: (u32, u32)) -> std::io::Result<OwnedFd> {
    let (done_r, done_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    // (`_stack`, the waiter's, goes after it was reaped below.)
    let (child, _stack) = userns_waiter(&done_r, &done_w)?;
    drop(done_r);
    let result = (|| {
        let dir = proc.join(child.to_string());
        std::fs::write(dir.join("uid_map"), format!("{} {} 1\n", host.0, turn.0))?;
        std::fs::write(dir.join("gid_map"), format!("{} {} 1\n", host.1, turn.1))?;
        let ns = std::fs::File::open(dir.join("ns/user"))?;
        Ok(OwnedFd::from(ns))
    })();
    // EOF on its pipe: the waiter exits.
    drop(done_w);
    let _ = nix::sys::wait::waitpid(child, None);
    result
}

/// Starts a process in a new user namespace that only waits for EOF on
/// `done_r` (closing its own copy of `done_w` first), then exits.
///
/// On x86_64 it is a `clone3` with `CLONE_NEWUSER | CLONE_VM` on a stack of
/// its own whose child runs three raw syscalls and nothing else: no page
/// table is copied (the supervisor calls this too, for an OCI turn's
/// view, where a fork copied the whole of it), and the namespace exists
/// when the call returns. Signals stay blocked in it (it inherits the mask
/// set around the clone), so no handler of ours ever runs there.
/// Elsewhere, or where that clone is refused: a fork whose child unshares
/// the namespace and says so before the caller writes its maps.
/// Returns its pid, and the stack it runs on (to drop once it was reaped).
fn userns_waiter(
    done_r: &OwnedFd,
    done_w: &OwnedFd,
) -> std::io::Result<(nix::unistd::Pid, Option<CloneStack>)> {
    #[cfg(target_arch = "x86_64")]
    if let Ok(started) = waiter_x86_64(done_r, done_w) {
        return Ok(started);
    }
    let (ready_r, ready_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    // SAFETY: the caller may be multi-threaded (the runc backend calls this
    // from the supervisor), so the child does only async-signal-safe work:
    // close(2) of the unused pipe ends, prctl(2), unshare(2), write(2) and
    // read(2) of one byte through nix's thin wrappers (no allocation, no
    // lock), then `_exit`.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            drop(ready_r);
            // SAFETY: closes this process's copy of the write end (the
            // caller keeps its own); nothing else here uses it.
            unsafe { nix::libc::close(done_w.as_raw_fd()) };
            let ok = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).is_ok()
                && nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok()
                && nix::unistd::write(&ready_w, b"u") == Ok(1);
            if ok {
                let mut b = [0u8; 1];
                let _ = nix::unistd::read(done_r, &mut b);
            }
            // SAFETY: _exit is async-signal-safe and never returns.
            unsafe { nix::libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(ready_w);
            let mut b = [0u8; 1];
            if nix::unistd::read(&ready_r, &mut b)? != 1 {
                let _ = nix::sys::wait::waitpid(child, None);
                return Err(std::io::Error::other("user namespace helper failed"));
            }
            Ok((child, None))
        }
    }
}

/// `struct clone_args` up to `cgroup` (CLONE_ARGS_SIZE_VER2), for the raw
/// `clone3` calls of this crate and of the supervisor's spawn.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CloneArgs {
    pub flags: u64,
    pub pidfd: u64,
    pub child_tid: u64,
    pub parent_tid: u64,
    pub exit_signal: u64,
    pub stack: u64,
    pub stack_size: u64,
    pub tls: u64,
    pub set_tid: u64,
    pub set_tid_size: u64,
    pub cgroup: u64,
}

/// `<linux/sched.h>`; not in the libc crate.
pub const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The stack of a child that shares our memory (`CLONE_VM`): an anonymous
/// mapping with a guard page below it, unmapped when dropped — which its
/// owner does only once the child exec'd, exited or was reaped.
#[derive(Debug)]
pub struct CloneStack {
    base: *mut nix::libc::c_void,
    len: usize,
}

impl CloneStack {
    /// `bytes` of stack (whole pages) above one guard page.
    pub fn new(bytes: usize) -> std::io::Result<Self> {
        const PAGE: usize = 4096;
        let len = bytes.next_multiple_of(PAGE) + PAGE;
        // SAFETY: a fresh anonymous mapping; nothing else refers to it.
        let base = unsafe {
            nix::libc::mmap(
                std::ptr::null_mut(),
                len,
                nix::libc::PROT_READ | nix::libc::PROT_WRITE,
                nix::libc::MAP_PRIVATE | nix::libc::MAP_ANONYMOUS | nix::libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == nix::libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = Self { base, len };
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { nix::libc::mprotect(base, PAGE, nix::libc::PROT_NONE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// `args` with this stack as the child's (the kernel starts it at the
    /// top: page-aligned, so 16-byte aligned).
    pub fn for_clone(&self, args: CloneArgs) -> CloneArgs {
        CloneArgs {
            stack: self.base as u64,
            stack_size: self.len as u64,
            ..args
        }
    }
}

impl Drop for CloneStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the owner's contract is that no
        // child runs on it any more.
        unsafe { nix::libc::munmap(self.base, self.len) };
    }
}

/// [`userns_waiter`]'s `clone3` (see there).
#[cfg(target_arch = "x86_64")]
fn waiter_x86_64(
    done_r: &OwnedFd,
    done_w: &OwnedFd,
) -> std::io::Result<(nix::unistd::Pid, Option<CloneStack>)> {
    // Its frames are none (raw syscalls), one byte of buffer.
    let stack = CloneStack::new(4096)?;
    let args = stack.for_clone(CloneArgs {
        flags: (nix::libc::CLONE_NEWUSER | nix::libc::CLONE_VM) as u64,
        exit_signal: nix::libc::SIGCHLD as u64,
        ..CloneArgs::default()
    });
    // SAFETY: sigset_t is plain data, filled by sigfillset/pthread_sigmask.
    let (mut all, mut old): (nix::libc::sigset_t, nix::libc::sigset_t) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: valid sigset pointers.
    unsafe {
        nix::libc::sigfillset(&mut all);
        nix::libc::pthread_sigmask(nix::libc::SIG_SETMASK, &all, &mut old);
    }
    let rc: i64;
    // SAFETY: the child starts on `stack` (page-aligned top) in our memory
    // with every signal blocked; it runs only the instructions after the
    // branch: close(done_w), read(done_r, its stack, 1), exit(0), never
    // returning into this function or touching anything but its own stack
    // and the two descriptor numbers in r12/r13. The stack stays mapped
    // until the caller reaped it (it owns the returned `CloneStack`).
    // The parent's side clobbers only what `syscall` does (rcx, r11).
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov edi, r13d",
            "mov eax, 3",
            "syscall",
            "mov edi, r12d",
            "mov rsi, rsp",
            "sub rsi, 64",
            "mov edx, 1",
            "xor eax, eax",
            "syscall",
            "xor edi, edi",
            "mov eax, 60",
            "syscall",
            "ud2",
            "2:",
            inlateout("rax") nix::libc::SYS_clone3 => rc,
            in("rdi") &args as *const CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") done_r.as_raw_fd(),
            in("r13") done_w.as_raw_fd(),
            lateout("rcx") _,
            lateout("rdx") _,
            lateout("r11") _,
            options(nostack),
        );
        nix::libc::pthread_sigmask(nix::libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    if rc < 0 {
        return Err(std::io::Error::from_raw_os_error((-rc) as i32));
    }
    Ok((nix::unistd::Pid::from_raw(rc as i32), Some(stack)))
}

/// Mounts a read-only, `nosuid,nodev` clone of `source` (its own mount
/// only, no submounts) at `target`, idmapped so that files of `host` appear
/// as `turn`'s and the turn's writes through it (none: it is read-only) would
/// land as `host`'s.
pub fn idmapped_clone(
    proc: &Path,
    source: &Path,
    target: &Path,
    host: (u32, u32),
    turn: (u32, u32),
) -> std::io::Result<()> {
    let userns = mapping_userns(proc, host, turn)?;
    let src = cpath(source)?;
    // SAFETY: open_tree(2) with a valid NUL-terminated path; the returned
    // descriptor is owned below.
    let tree = check(unsafe {
        nix::libc::syscall(
            nix::libc::SYS_open_tree,
            nix::libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | nix::libc::O_CLOEXEC as u32,
        )
    })?;
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: mount_setattr(2) on the detached tree with a valid attr struct
    // of the size passed.
    check(unsafe {
        nix::libc::syscall(
            nix::libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            nix::libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "idmapping {}: {e} (does its file system support idmapped mounts?)",
                source.display()
            ),
        )
    })?;
    let dst = cpath(target)?;
    // SAFETY: move_mount(2) of the detached tree onto an existing directory.
    check(unsafe {
        nix::libc::syscall(
            nix::libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            nix::libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// Opens `rel` beneath `dir` as an `O_PATH` descriptor without following
/// any symlink (and without leaving `dir`): the source of a mount is
/// exactly the inode the plan named, whatever the tree became since.
pub fn open_beneath(dir: &OwnedFd, rel: &str) -> std::io::Result<OwnedFd> {
    let rel = rel.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_BENEATH,
        );
    Ok(nix::fcntl::openat2(dir, rel, how)?)
}

/// `/proc/self/fd/N` of a descriptor: a path naming exactly its inode, for
/// mount sources and overlay layers (and no host path in mountinfo).
pub fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Sets `lo` up in the calling process's network namespace (the kernel
/// then assigns 127.0.0.1/8 and, with IPv6, ::1).
pub fn loopback_up() -> std::io::Result<()> {
    // SAFETY: socket(2) with constant arguments; the descriptor is owned
    // below.
    let raw = unsafe {
        nix::libc::socket(
            nix::libc::AF_INET,
            nix::libc::SOCK_DGRAM | nix::libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut req: nix::libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as nix::libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we own.
    unsafe {
        if nix::libc::ioctl(
            sock.as_raw_fd(),
            nix::libc::SIOCGIFFLAGS as nix::libc::Ioctl,
            &mut req,
        ) < 0
        {
            return Err(std::io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= nix::libc::IFF_UP as i16;
        if nix::libc::ioctl(
            sock.as_raw_fd(),
            nix::libc::SIOCSIFFLAGS as nix::libc::Ioctl,
            &req,
        ) < 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
