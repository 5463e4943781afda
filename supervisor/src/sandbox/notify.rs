//! The turn's denied syscalls, observed exactly (issue 11, FR-RT-011).
//!
//! The seccomp filter answers a syscall of the deny list with
//! `SECCOMP_RET_USER_NOTIF` rather than a plain errno; the command's stage
//! loads it with `SECCOMP_FILTER_FLAG_NEW_LISTENER`, keeps the listener
//! (close-on-exec) where the kernel put it and names that descriptor in its
//! ready message. Before letting the command run, the supervisor takes it
//! out of the parked process
//! (`pidfd_getfd`) and a thread answers every notification with `EPERM`,
//! counting it: which syscall, which process, when, how often. The
//! attribution is exact — only this turn's processes share this filter —
//! and nothing of the host's audit configuration is touched.
//!
//! If the listener is gone (the supervisor died, or taking it failed), the
//! kernel fails the same syscalls with `ENOSYS`: still denied, only no
//! longer observed (and the evidence says so).

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use std::time::Instant;

/// Most distinct (arch, syscall) pairs recorded; the rest are only counted.
pub const MAX_DISTINCT: usize = 64;

/// One denied syscall of the turn, deduplicated: its count and first
/// occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedSyscall {
    pub arch: u32,
    pub nr: i32,
    pub count: u64,
    /// PID (in the supervisor's PID namespace) of the first caller.
    pub first_pid: u32,
    pub first_args: [u64; 6],
    /// The errno it was answered with.
    pub errno: i32,
    /// When (monotonic): the turn converts it with its injected clock.
    pub first_at: Instant,
}

/// What the listener saw.
#[derive(Debug, Default, Clone)]
pub struct Denials {
    pub syscalls: Vec<DeniedSyscall>,
    /// Denials beyond [`MAX_DISTINCT`] distinct syscalls (counted only).
    pub overflow: u64,
}

/// Takes descriptor `fd` out of process `pid` (`pidfd_getfd`; needs ptrace
/// access, which root has).
pub fn take_fd(pid: i32, fd: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) with a pid and no flags; the result is owned.
    let pidfd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: pidfd_getfd(2) on our pidfd; the result is a new descriptor
    // (close-on-exec by the kernel's definition) that we own.
    let got = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(got as i32) })
}

/// A running listener; [`Listener::finish`] stops it and returns what it
/// saw.
#[derive(Debug)]
pub struct Listener {
    stop: Option<OwnedFd>,
    thread: Option<crate::syncpool::Task<Denials>>,
}

impl Listener {
    /// Answers every notification on `notify` with `-errno` until the turn
    /// is over.
    /// `errnos`: the answer for particular syscall numbers (EPERM for the
    /// rest).
    /// `xattr`: syscall numbers whose xattr name (argument index) is read
    /// first — overlay-private names are refused with EPERM, the rest
    /// continue.
    pub fn spawn(
        notify: OwnedFd,
        errnos: Vec<(i32, i32)>,
        xattr: Vec<(i32, u32)>,
    ) -> std::io::Result<Self> {
        let (stop_r, stop_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let thread = crate::syncpool::try_spawn("seccomp-notify", move || {
            serve(&notify, &stop_r, &errnos, &xattr)
        })?;
        Ok(Self {
            stop: Some(stop_w),
            thread: Some(thread),
        })
    }

    /// Stops the listener (once the turn's processes are gone) and returns
    /// its record.
    pub fn finish(mut self) -> Denials {
        self.stop.take();
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The xattr name at `addr` in process `pid`'s memory (at most 256 bytes,
/// up to its NUL), or `None` when it cannot be read.
fn read_name(pid: u32, addr: u64) -> Option<Vec<u8>> {
    use nix::sys::uio::{RemoteIoVec, process_vm_readv};
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).ok()?);
    let mut name = Vec::new();
    let mut at = usize::try_from(addr).ok()?;
    // Page by page: a read across an unmapped page fails as a whole.
    while name.len() < 256 {
        let page_left = 4096 - at % 4096;
        let len = page_left.min(256 - name.len());
        let mut buf = vec![0u8; len];
        let n = process_vm_readv(
            pid,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &[RemoteIoVec { base: at, len }],
        )
        .ok()?;
        buf.truncate(n);
        if let Some(end) = buf.iter().position(|b| *b == 0) {
            name.extend_from_slice(&buf[..end]);
            return Some(name);
        }
        if n == 0 {
            return None;
        }
        name.extend_from_slice(&buf);
        at += n;
    }
    Some(name)
}

/// Whether the xattr call `req` may continue: its name is not
/// overlay-private. A name that cannot be read is refused (fail closed).
///
/// The name is read before the kernel reads it: a second thread of the
/// turn could change it in between (the documented limit of a continue
/// answer). The refusal is therefore the first line only; behind it, the
/// turn's overlays are never mounted with `userxattr`, capture reads a
/// directory carrying an overlay-private xattr as an opaque directory
/// (which blocks), and commit copies no xattrs.
fn xattr_allowed(req: &nix::libc::seccomp_notif, name_arg: u32) -> bool {
    let Some(addr) = req.data.args.get(name_arg as usize) else {
        return false;
    };
    match read_name(req.pid, *addr) {
        Some(name) => !turnstile_policy::seccomp::OVERLAY_XATTR_PREFIXES
            .iter()
            .any(|p| name.starts_with(p.as_bytes())),
        None => false,
    }
}

fn serve(notify: &OwnedFd, stop: &OwnedFd, errnos: &[(i32, i32)], xattr: &[(i32, u32)]) -> Denials {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut seen: BTreeMap<(u32, i32), DeniedSyscall> = BTreeMap::new();
    let mut overflow = 0u64;
    loop {
        let mut fds = [
            PollFd::new(notify.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        let ready = |f: &PollFd<'_>| f.revents().unwrap_or(PollFlags::empty());
        let (n, s) = (ready(&fds[0]), ready(&fds[1]));
        if n.contains(PollFlags::POLLIN) {
            // SAFETY: seccomp_notif is plain old data; RECV requires it
            // zeroed.
            let mut req: nix::libc::seccomp_notif = unsafe { std::mem::zeroed() };
            // SAFETY: the ioctl fills `req`, which we own.
            let rc = unsafe {
                nix::libc::ioctl(
                    notify.as_raw_fd(),
                    nix::libc::SECCOMP_IOCTL_NOTIF_RECV,
                    &mut req,
                )
            };
            if rc == 0 {
                if let Some((_, arg)) = xattr.iter().find(|(nr, _)| *nr == req.data.nr) {
                    if xattr_allowed(&req, *arg) {
                        let resp = nix::libc::seccomp_notif_resp {
                            id: req.id,
                            val: 0,
                            error: 0,
                            flags: nix::libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
                        };
                        // SAFETY: SEND reads `resp`, which we own; a target
                        // that died meanwhile makes it fail harmlessly.
                        unsafe {
                            nix::libc::ioctl(
                                notify.as_raw_fd(),
                                nix::libc::SECCOMP_IOCTL_NOTIF_SEND,
                                &resp,
                            )
                        };
                        continue;
                    }
                }
                let errno = errnos
                    .iter()
                    .find(|(nr, _)| *nr == req.data.nr)
                    .map_or(nix::libc::EPERM, |(_, e)| *e);
                let resp = nix::libc::seccomp_notif_resp {
                    id: req.id,
                    val: 0,
                    error: -errno,
                    flags: 0,
                };
                // SAFETY: SEND reads `resp`, which we own. A target that
                // died meanwhile makes it fail with ENOENT, harmlessly.
                unsafe {
                    nix::libc::ioctl(
                        notify.as_raw_fd(),
                        nix::libc::SECCOMP_IOCTL_NOTIF_SEND,
                        &resp,
                    )
                };
                let key = (req.data.arch, req.data.nr);
                if let Some(d) = seen.get_mut(&key) {
                    d.count += 1;
                } else if seen.len() < MAX_DISTINCT {
                    seen.insert(
                        key,
                        DeniedSyscall {
                            arch: req.data.arch,
                            nr: req.data.nr,
                            count: 1,
                            first_pid: req.pid,
                            errno,
                            first_args: req.data.args,
                            first_at: Instant::now(),
                        },
                    );
                } else {
                    overflow += 1;
                }
            }
            continue;
        }
        // Every process of the filter gone (POLLHUP), or told to stop.
        if n.intersects(PollFlags::POLLHUP | PollFlags::POLLERR) || !s.is_empty() {
            break;
        }
    }
    let mut syscalls: Vec<DeniedSyscall> = seen.into_values().collect();
    syscalls.sort_by_key(|d| d.first_at);
    Denials { syscalls, overflow }
}
