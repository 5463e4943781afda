//! SIGTERM, SIGINT and SIGHUP to `supervise run`: the turn is killed and
//! recorded as `interrupted`, and `run` exits 128+signal.
//!
//! The handler only stores the signal number and writes one byte to a pipe
//! (both async-signal-safe). A watcher thread wakes on the byte and, while
//! a turn is registered, kills its cgroup — repeatedly, until the turn
//! unregisters, so a sandbox that was being started at that moment is
//! killed as soon as it exists. The turn checks [`received`] at its
//! checkpoints (before launch, after the command, and while its commit
//! stages, up to the commit point) and commits nothing after an interrupt
//! that came before the commit point; one that comes after it lets the
//! commit finish. Caught signals reset to their default at `execve`, so
//! the sandbox's processes are unaffected.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

use crate::sandbox::cgroup::Place;
use crate::sandbox::cgroup::TurnCgroup;

// The signal handler's state: the only statics (a handler can reach
// nothing else).
static SIGNAL: AtomicI32 = AtomicI32::new(0);
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(signal: nix::libc::c_int) {
    SIGNAL.store(signal, Ordering::SeqCst);
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let byte = [1u8];
        // SAFETY: write(2) is async-signal-safe; `byte` is a valid buffer of
        // length 1 and `fd` is the pipe's write end, open while a guard
        // lives (the guard clears WAKE_FD before closing it). A full pipe or
        // an error is harmless: the watcher is already awake.
        let _ = unsafe { nix::libc::write(fd, byte.as_ptr().cast(), 1) };
    }
}

/// The running turn's cgroup, as the run that owns it registers it: what
/// the watcher kills when a signal arrives. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Interrupts {
    /// (cgroup root, name).
    current: Arc<Mutex<Option<(Place, String)>>>,
}

impl Interrupts {
    /// Registers the running turn's cgroup (`None` unregisters).
    pub fn register(&self, turn: Option<(Place, String)>) {
        if let Ok(mut c) = self.current.lock() {
            *c = turn;
        }
        // A signal that arrived before registration still kills the turn.
        if received().is_some() {
            let fd = WAKE_FD.load(Ordering::SeqCst);
            if fd >= 0 {
                let _ = nix::unistd::write(
                    // SAFETY: the write end stays open while WAKE_FD names
                    // it (the guard clears it first).
                    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
                    &[1u8],
                );
            }
        }
    }

    fn current(&self) -> Option<(Place, String)> {
        self.current.lock().map(|c| c.clone()).unwrap_or(None)
    }
}

/// Handlers installed and a watcher running for one run: dropping it stops
/// the watcher (the handlers stay: a later signal is only recorded).
#[derive(Debug)]
pub struct Guard {
    wake: Option<OwnedFd>,
    watcher: Option<crate::syncpool::Task<()>>,
}

/// Installs the handlers and starts a watcher that kills what `interrupts`
/// registers, for as long as the returned guard lives.
pub fn install(interrupts: &Interrupts) -> std::io::Result<Guard> {
    let (read, write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    WAKE_FD.store(write.as_raw_fd(), Ordering::SeqCst);
    handle()?;
    let theirs = interrupts.clone();
    let watcher = crate::syncpool::try_spawn("interrupt", move || watch(read, &theirs))?;
    Ok(Guard {
        wake: Some(write),
        watcher: Some(watcher),
    })
}

/// Only the handlers: a signal is recorded ([`received`]) and interrupts a
/// blocking call, and nothing is killed here. For a process that runs no
/// turn itself and forwards the signal to the one that does (`run
/// --server`'s client): no watcher thread to start and, at exit, to join.
pub fn record_only() -> std::io::Result<()> {
    handle()
}

fn handle() -> std::io::Result<()> {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: the handler only performs async-signal-safe operations (an
        // atomic store and write(2)).
        unsafe { sigaction(signal, &action) }.map_err(std::io::Error::from)?;
    }
    Ok(())
}

impl Drop for Guard {
    fn drop(&mut self) {
        // The handler stops writing first, then the pipe closes: the
        // watcher reads EOF and ends.
        if let Some(w) = self.wake.take() {
            let _ = WAKE_FD.compare_exchange(w.as_raw_fd(), -1, Ordering::SeqCst, Ordering::SeqCst);
            drop(w);
        }
        if let Some(t) = self.watcher.take() {
            let _ = t.join();
        }
    }
}

fn watch(read: OwnedFd, interrupts: &Interrupts) {
    let mut byte = [0u8; 1];
    while let Ok(n) = nix::unistd::read(&read, &mut byte) {
        if n == 0 {
            return;
        }
        // Kill the registered turn until it unregisters.
        while let Some((root, name)) = interrupts.current() {
            for cg in TurnCgroup::leftovers(&root, &name) {
                cg.kill_all();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Forgets a stop signal received before this turn: a `serve` worker runs
/// one turn after another, and a signal forwarded to the last one must not
/// interrupt the next.
pub fn reset() {
    SIGNAL.store(0, Ordering::SeqCst);
}

/// The signal received, if any.
pub fn received() -> Option<Signal> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        n => Signal::try_from(n).ok(),
    }
}
