//! The denial observer (issue 27): a BPF program on every syscall's exit
//! (`bpf/denials.bpf.c`, built by `build.rs`), loaded and attached once
//! per boot and shared by every supervisor through a bpffs (see
//! [`shared`]; a process that cannot share it loads its own), that
//! reports the path operations of registered
//! turns that failed with EACCES, EPERM, EROFS, EXDEV or ENOENT. A turn
//! registers its cgroup v2 id before its command runs and collects its
//! refusals once every process of it is gone ([`Registration::finish`]);
//! the kernel side counts repeats of one (syscall, errno, path) in a map
//! and sends only the first, so a loop of 100,000 refused opens is one
//! event and one count.
//!
//! Unavailable (not root, no BTF, the object not built, the load refused,
//! or `TURNSTILE_DENIAL_OBSERVER=off`): [`get`] says why, and turns run
//! without it and say so in their evidence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use libbpf_rs::{MapCore, MapFlags, MapHandle};

/// The compiled program (empty when the build had no clang).
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/denials.bpf.o"));

/// Distinct refusals kept per turn; more are counted, not itemized.
pub const MAX_DISTINCT: usize = 4096;

const PATH: usize = 256;
const COMP: usize = 32;
const COMP_LEN: usize = 48;
const EVENT_SIZE: usize = 56 + 2 * PATH + COMP * COMP_LEN;

/// One distinct refusal of a turn, as the kernel reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawDenial {
    /// The syscall's number (native architecture).
    pub nr: i32,
    pub errno: i32,
    pub pid: u32,
    /// The path as passed, resolved against the directory it was relative
    /// to (the cwd or the dirfd), `.` and `..` folded.
    pub path: String,
    /// The second path of a rename or link; the target of a symlink.
    pub path2: Option<String>,
    /// open flags (`open`, `openat`, `openat2`), else 0.
    pub flags: u32,
    /// How many times this exact refusal happened.
    pub count: u64,
    /// When the first one reached the supervisor.
    pub first_at: Instant,
}

/// What a turn's registration collected.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub denials: Vec<RawDenial>,
    /// Refusals beyond [`MAX_DISTINCT`] distinct ones, or lost because the
    /// ring buffer was full (counted, not itemized).
    pub overflow: u64,
    /// Refusals whose path the kernel side could not read from the
    /// process's memory at the syscall's exit (counted, not itemized:
    /// never recorded under a path that was not the one refused).
    pub unreadable: u64,
}

#[derive(Debug, Default)]
struct Table {
    events: Vec<(u64, RawDenial)>,
    overflow: u64,
    learn: bool,
}

/// The loaded observer (see the module docs).
#[derive(Debug)]
pub struct Observer {
    turns: MapHandle,
    seen: MapHandle,
    learners: Learners,
    tables: Arc<Mutex<HashMap<u64, Table>>>,
    /// This process's ring buffer, and its slot in the program's `rings`
    /// (held, through a lock file, for the life of the process).
    ring: Arc<Ring>,
    slot: u32,
    _slot_lock: Option<Lock>,
    /// How long loading (or opening the pinned observer) took.
    pub load_time: Duration,
    /// Where the shared observer is pinned; `None`: this process loaded
    /// its own, which lives as long as the process.
    pub pinned: Option<std::path::PathBuf>,
    _own: Option<(libbpf_rs::Object, Vec<libbpf_rs::Link>)>,
}

/// This process's ring buffer, drained by a thread of its own as events
/// arrive and by a finishing turn (which then sees everything sent before
/// it). Mapped into this process (libbpf's ring buffer) only once it first
/// holds something: mapping a 1 MiB ring maps its 256 data pages twice,
/// ~0.2 ms of a cold `supervise run` whose turn, like most, is refused
/// nothing. Until then its readiness is polled on the map itself (a ring
/// buffer map is readable while it holds unread records).
struct Ring {
    map: MapHandle,
    tables: Arc<Mutex<HashMap<u64, Table>>>,
    rb: Mutex<Option<libbpf_rs::RingBuffer<'static>>>,
}

impl Ring {
    /// Whether the ring holds unread records, waiting up to `wait` for
    /// one; an error if it cannot be polled (the draining thread stops
    /// rather than spin).
    fn readable(&self, wait: nix::poll::PollTimeout) -> Result<bool, String> {
        use nix::poll::{PollFd, PollFlags, poll};
        use std::os::fd::AsFd;
        let mut fds = [PollFd::new(self.map.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, wait) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => Ok(false),
            Ok(_) => {
                let r = fds[0].revents().unwrap_or(PollFlags::empty());
                if r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL) {
                    return Err(format!("polling the ring buffer: {r:?}"));
                }
                Ok(r.contains(PollFlags::POLLIN))
            }
            Err(e) => Err(format!("polling the ring buffer: {e}")),
        }
    }

    /// Reads every record the ring holds (mapping it the first time it
    /// holds one).
    fn drain(&self) -> Result<(), String> {
        let Ok(mut rb) = self.rb.lock() else {
            return Err("the ring buffer's lock is poisoned".into());
        };
        if rb.is_none() {
            if !self.readable(nix::poll::PollTimeout::ZERO)? {
                return Ok(());
            }
            let t = Arc::clone(&self.tables);
            let mut builder = libbpf_rs::RingBufferBuilder::new();
            builder
                .add(&self.map, move |data: &[u8]| {
                    on_event(&t, data);
                    0
                })
                .map_err(|e| format!("ring buffer: {e}"))?;
            *rb = Some(builder.build().map_err(|e| format!("ring buffer: {e}"))?);
        }
        if let Some(rb) = rb.as_ref() {
            let _ = rb.consume();
        }
        Ok(())
    }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").finish_non_exhaustive()
    }
}

/// The program's `learners` (its `.bss`, mapped shared): how many learning
/// turns are registered on the host. Only a hint that lets the program
/// skip successful syscalls at once; each turn's own flag decides.
#[derive(Debug)]
struct Learners(std::ptr::NonNull<std::sync::atomic::AtomicU32>);

// SAFETY: the pointer is a shared mapping of the map's value, alive for
// the rest of the process (never unmapped), only accessed atomically.
unsafe impl Send for Learners {}
// SAFETY: as above.
unsafe impl Sync for Learners {}

impl Learners {
    fn map(bss: &MapHandle) -> Result<Self, String> {
        use std::os::fd::{AsFd, AsRawFd};
        // SAFETY: a new shared mapping of the map's first page (its value
        // area; libbpf makes global data maps mmapable), never unmapped.
        let p = unsafe {
            nix::libc::mmap(
                std::ptr::null_mut(),
                4096,
                nix::libc::PROT_READ | nix::libc::PROT_WRITE,
                nix::libc::MAP_SHARED,
                bss.as_fd().as_raw_fd(),
                0,
            )
        };
        if p == nix::libc::MAP_FAILED {
            return Err(format!(
                "mapping the program's .bss: {}",
                std::io::Error::last_os_error()
            ));
        }
        let p = std::ptr::NonNull::new(p).ok_or("mapping the program's .bss: null")?;
        Ok(Self(p.cast()))
    }

    fn add(&self, d: i32) {
        // SAFETY: see the type; an aligned u32 at the start of a page.
        let n = unsafe { self.0.as_ref() };
        let _ = n.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |v| Some(v.saturating_add_signed(d)),
        );
    }
}

static OBSERVER: OnceLock<Result<Observer, String>> = OnceLock::new();

/// This process learns (`supervise learn`): its turns also report what
/// succeeded, and [`take_learned`] returns it.
static LEARNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static LEARNED: Mutex<Vec<RawDenial>> = Mutex::new(Vec::new());

/// Puts this process in learn mode (see [`LEARNING`]).
pub fn set_learning() {
    LEARNING.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether this process learns.
pub fn learning() -> bool {
    LEARNING.load(std::sync::atomic::Ordering::SeqCst)
}

/// Every operation the learning turns of this process made (successful
/// ones with errno 0; execs with `nr` -1), taken.
pub fn take_learned() -> Vec<RawDenial> {
    LEARNED
        .lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default()
}

/// Distinct operations kept for a learning turn.
pub const MAX_LEARNED: usize = 65_536;

impl Observer {
    /// How this process has it, in words: the shared one (where it is
    /// pinned) or its own, and how long that took.
    pub fn how(&self) -> String {
        match &self.pinned {
            Some(dir) => format!(
                "shared, pinned in {} (slot {}, opened in {} µs)",
                dir.display(),
                self.slot,
                self.load_time.as_micros()
            ),
            None => format!(
                "this process's own (no bpffs to share it through), loaded and attached in {} µs",
                self.load_time.as_micros()
            ),
        }
    }
}

/// Why the observer cannot run here, before trying to load it.
pub fn unavailable() -> Option<String> {
    let why = env!("TURNSTILE_BPF_UNBUILT");
    if !why.is_empty() {
        return Some(format!("the BPF observer was not built: {why}"));
    }
    if std::env::var("TURNSTILE_DENIAL_OBSERVER").as_deref() == Ok("off") {
        return Some("the denial observer is disabled (TURNSTILE_DENIAL_OBSERVER=off)".into());
    }
    if !nix::unistd::geteuid().is_root() {
        return Some("the denial observer needs root (BPF tracing)".into());
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("the kernel has no BTF (/sys/kernel/btf/vmlinux): the observer's CO-RE program cannot load".into());
    }
    None
}

/// The process's observer, loaded on first use.
pub fn get() -> Result<&'static Observer, String> {
    OBSERVER
        .get_or_init(|| match unavailable() {
            Some(why) => Err(why),
            None => load().map_err(|e| format!("the denial observer could not load: {e}")),
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Starts loading the observer in the background (it takes milliseconds:
/// the verifier), so the first turn does not wait for it.
pub fn preload() {
    if OBSERVER.get().is_none() {
        std::thread::spawn(|| {
            let _ = get();
        });
    }
}

fn load() -> Result<Observer, String> {
    let started = Instant::now();
    let (handles, pinned, own) = match pin_dir() {
        Ok(dir) => match shared(&dir) {
            Ok(h) => (h, Some(dir), None),
            Err(why) => {
                tracing::warn!(%why, "the shared denial observer is not usable; loading this process's own");
                own()?
            }
        },
        Err(why) => {
            tracing::debug!(%why, "no bpffs for the shared denial observer");
            own()?
        }
    };
    let [turns, seen, rings, bss] = handles;
    let tables: Arc<Mutex<HashMap<u64, Table>>> = Arc::default();
    let (slot, slot_lock) = if pinned.is_some() {
        take_slot()?
    } else {
        (0, None)
    };
    let ring = ring_in(&rings, slot, &tables)?;
    if pinned.is_some() {
        sweep(&turns);
        trim_slots(rings);
    }
    Ok(Observer {
        learners: Learners::map(&bss)?,
        turns,
        seen,
        tables,
        ring,
        slot,
        _slot_lock: slot_lock,
        load_time: started.elapsed(),
        pinned,
        _own: own,
    })
}

/// Where the slot locks are: `slot-N.lock`, locked by the process that
/// reads slot N's ring.
const SLOT_LOCKS: &str = "/run/turnstile/observer";
const SLOTS: u32 = 1024;

/// The first slot no live process holds, locked for the rest of this
/// process (the kernel releases the lock when it dies).
fn take_slot() -> Result<(u32, Option<Lock>), String> {
    let dir = std::path::Path::new(SLOT_LOCKS);
    private_dir(dir)?;
    for slot in 0..SLOTS {
        if let Some(lock) = lock_file(&dir.join(format!("slot-{slot}.lock")), true, false)? {
            return Ok((slot, Some(lock)));
        }
    }
    Err(format!("all {SLOTS} observer slots are held"))
}

/// Slots whose rings are kept when free: the usual concurrency. A ring of
/// a higher slot (1 MiB of kernel memory) is removed once no process
/// holds the slot.
const KEPT_SLOTS: u32 = 16;

/// Removes the rings of the free slots above [`KEPT_SLOTS`], on a thread of
/// its own (each removal waits for an RCU grace period): a burst of
/// concurrent supervisors (a soak, a busy daemon's workers) leaves no
/// rings behind it. A slot is held (locked) while its ring goes, so no
/// process takes it meanwhile. The slots looked at are those with a ring
/// in `rings` (a hash of maps: its keys are the slots that have one), not
/// every slot's lock file: the files stay after a burst (see below), and
/// trying each of them at every load cost a cold turn ~70 lock attempts
/// and map deletions on a thread beside it, on a host that had seen 84
/// concurrent supervisors once. With no ring above the kept slots, no
/// thread is started.
fn trim_slots(rings: MapHandle) {
    let high: Vec<u32> = rings
        .keys()
        .filter_map(|k| <[u8; 4]>::try_from(k.as_slice()).ok())
        .map(u32::from_ne_bytes)
        .filter(|n| *n >= KEPT_SLOTS)
        .collect();
    if high.is_empty() {
        return;
    }
    let dir = std::path::Path::new(SLOT_LOCKS);
    let _ = std::thread::Builder::new()
        .name("observer-trim".into())
        .spawn(move || {
            for slot in high {
                let path = dir.join(format!("slot-{slot}.lock"));
                let Ok(Some(_held)) = lock_file(&path, true, false) else {
                    continue;
                };
                // (The lock file stays: removing it would let another
                // process lock a new file of the same slot meanwhile.)
                let _ = rings.delete(&slot.to_ne_bytes());
            }
        });
}

/// The ring buffer in `slot` of `rings`: the one a process before left
/// there (adopted: what it held is drained and dropped), else a new one
/// put there. With the thread that drains it.
fn ring_in(
    rings: &MapHandle,
    slot: u32,
    tables: &Arc<Mutex<HashMap<u64, Table>>>,
) -> Result<Arc<Ring>, String> {
    let key = slot.to_ne_bytes();
    let adopted = rings
        .lookup(&key, MapFlags::ANY)
        .ok()
        .flatten()
        .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
        .map(u32::from_ne_bytes)
        .and_then(|id| MapHandle::from_map_id(id).ok());
    let map = match adopted {
        Some(m) => m,
        None => {
            let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
                sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
                ..Default::default()
            };
            let m = MapHandle::create(
                libbpf_rs::MapType::RingBuf,
                Some("turnstile_ring"),
                0,
                0,
                RING_BYTES,
                &opts,
            )
            .map_err(|e| format!("ring buffer: {e}"))?;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(&m));
            rings
                .update(&key, &(fd as u32).to_ne_bytes(), MapFlags::ANY)
                .map_err(|e| format!("ring buffer slot {slot}: {e}"))?;
            m
        }
    };
    let ring = Arc::new(Ring {
        map,
        tables: Arc::clone(tables),
        rb: Mutex::new(None),
    });
    // What an earlier holder of the slot left: no turn of ours is
    // registered yet, so it is dropped (the ring is mapped only if there
    // is any).
    ring.drain()?;
    let r = Arc::clone(&ring);
    std::thread::Builder::new()
        .name("denials".into())
        .spawn(move || {
            // A finishing turn still drains what this thread could not.
            loop {
                let read = r
                    .readable(nix::poll::PollTimeout::from(1000u16))
                    .and_then(|ready| if ready { r.drain() } else { Ok(()) });
                if let Err(why) = read {
                    tracing::warn!(%why, "cannot read the denial observer's ring buffer");
                    return;
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(ring)
}

/// The maps a turn needs: `turns`, `seen`, `rings` and `.bss`.
type Handles = [MapHandle; 4];
type Own = (libbpf_rs::Object, Vec<libbpf_rs::Link>);

/// This process's own observer (no bpffs to share one through): loaded
/// and attached here, detached when the process ends.
#[allow(clippy::type_complexity)]
fn own() -> Result<(Handles, Option<std::path::PathBuf>, Option<Own>), String> {
    let (obj, links) = load_attached()?;
    let handles = handles_of(&obj)?;
    Ok((handles, None, Some((obj, links))))
}

/// The program loaded (CO-RE relocations against a BTF of only the types
/// it uses when there is one, see `min_btf`; the kernel's whole BTF
/// otherwise, or if that load fails) and attached.
fn load_attached() -> Result<(libbpf_rs::Object, Vec<libbpf_rs::Link>), String> {
    let min = min_btf();
    let obj = match min.as_deref().map(|p| load_object(Some(p))) {
        Some(Ok(obj)) => obj,
        Some(Err(why)) => {
            tracing::warn!(%why, "the observer's minimal BTF did not load; using the kernel's");
            if let Some(p) = &min {
                let _ = std::fs::remove_file(p);
            }
            load_object(None)?
        }
        None => load_object(None)?,
    };
    let mut links = Vec::new();
    for p in obj.progs_mut() {
        links.push(p.attach().map_err(|x| format!("attach: {x}"))?);
    }
    Ok((obj, links))
}

fn handles_of(obj: &libbpf_rs::Object) -> Result<Handles, String> {
    let map = |name: &str| -> Result<MapHandle, String> {
        let m = obj
            .maps()
            .find(|m| {
                m.name() == name
                    || (name.starts_with('.') && m.name().to_string_lossy().ends_with(name))
            })
            .ok_or_else(|| format!("map {name} missing"))?;
        MapHandle::try_from(&m).map_err(|x| format!("{name}: {x}"))
    };
    Ok([map("turns")?, map("seen")?, map("rings")?, map(".bss")?])
}

/// Where the shared observer lives: a bpffs at `/sys/fs/bpf` (mounted
/// there if nothing is, as systemd does), one directory per program.
const BPFFS: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// Taken while the shared observer is made or opened.
const PIN_LOCK: &str = "/run/turnstile/observer.lock";
/// Pinned last: a directory holding it is whole.
const PIN_LAST: &str = "link_exec";

fn pin_dir() -> Result<std::path::PathBuf, String> {
    use sha2::{Digest, Sha256};
    let is_bpffs = || {
        nix::sys::statfs::statfs(BPFFS)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::FsType(BPF_FS_MAGIC as _))
    };
    if !is_bpffs() {
        nix::mount::mount(
            Some("bpf"),
            BPFFS,
            Some("bpf"),
            nix::mount::MsFlags::MS_NOSUID
                | nix::mount::MsFlags::MS_NODEV
                | nix::mount::MsFlags::MS_NOEXEC,
            Some("mode=0700"),
        )
        .map_err(|e| format!("mount bpffs on {BPFFS}: {e}"))?;
        if !is_bpffs() {
            return Err(format!("{BPFFS} is not a bpffs after mounting one"));
        }
    }
    let key = hex::encode(&Sha256::digest(OBJECT)[..12]);
    Ok(std::path::Path::new(BPFFS).join("turnstile").join(key))
}

/// Opens the observer pinned in `dir`, or loads, attaches and pins it
/// there (the first process after boot, or after `dir` was removed). The
/// links stay pinned: the program stays attached when no supervisor runs
/// (removing `dir` detaches it). Under [`PIN_LOCK`], so one process makes
/// it and the others wait for it whole.
fn shared(dir: &std::path::Path) -> Result<Handles, String> {
    let lock_path = std::path::Path::new(PIN_LOCK);
    if let Some(parent) = lock_path.parent() {
        private_dir(parent)?;
    }
    let _held = lock_file(lock_path, true, true)?;
    let open = || -> Result<Handles, String> {
        let m = |name: &str| {
            MapHandle::from_pinned_path(dir.join(name))
                .map_err(|e| format!("{}: {e}", dir.join(name).display()))
        };
        Ok([m("turns")?, m("seen")?, m("rings")?, m("bss")?])
    };
    if dir.join(PIN_LAST).exists() {
        return open();
    }
    // Made anew (the first supervisor since boot, or since the program
    // changed): an older program's pins go too when no supervisor runs
    // (no slot is held), which detaches it.
    if let Some(top) = dir.parent() {
        if !any_slot_held() {
            for e in std::fs::read_dir(top).into_iter().flatten().flatten() {
                if e.path() != dir {
                    let _ = remove_pins(&e.path());
                }
            }
        }
    }
    // A directory a killed process left half made: its pins go.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    private_dir(dir)?;
    let (mut obj, mut links) = load_attached()?;
    for mut m in obj.maps_mut() {
        let name = m.name().to_string_lossy().into_owned();
        let pin = match name.as_str() {
            "turns" | "seen" | "rings" => name.clone(),
            n if n.ends_with(".bss") => "bss".to_owned(),
            _ => continue,
        };
        m.pin(dir.join(&pin))
            .map_err(|e| format!("pin {pin}: {e}"))?;
    }
    let names: Vec<String> = obj
        .progs()
        .map(|p| p.name().to_string_lossy().into_owned())
        .collect();
    // The exec link last: its pin says the directory is whole.
    let mut order: Vec<usize> = (0..links.len()).collect();
    order.sort_by_key(|&i| names.get(i).is_some_and(|n| n == "observe_exec"));
    for i in order {
        let pin = match names.get(i).map(String::as_str) {
            Some("observe_exec") => PIN_LAST.to_owned(),
            Some(n) => format!("link_{}", n.trim_start_matches("observe_")),
            None => return Err("a link without its program".into()),
        };
        links[i]
            .pin(dir.join(&pin))
            .map_err(|e| format!("pin {pin}: {e}"))?;
    }
    open()
}

/// Whether a live process holds an observer slot.
fn any_slot_held() -> bool {
    std::fs::read_dir(SLOT_LOCKS)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| matches!(lock_file(&e.path(), false, false), Ok(None)))
}

type Lock = nix::fcntl::Flock<std::fs::File>;

/// An exclusive lock on the file at `path` (made, mode 0600, when
/// `create`), waiting for it when `wait`: `None` when another process
/// holds it; an error when the file cannot be opened.
fn lock_file(path: &std::path::Path, create: bool, wait: bool) -> Result<Option<Lock>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .create(create)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let how = if wait {
        nix::fcntl::FlockArg::LockExclusive
    } else {
        nix::fcntl::FlockArg::LockExclusiveNonblock
    };
    match nix::fcntl::Flock::lock(f, how) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) if !wait => Ok(None),
        Err((_, e)) => Err(format!("lock {}: {e}", path.display())),
    }
}

/// `path` and its parents as directories, made mode 0700 (root's only).
fn private_dir(path: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Unpins everything in `dir` and removes it.
fn remove_pins(dir: &std::path::Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        std::fs::remove_file(e.path())?;
    }
    std::fs::remove_dir(dir)
}

/// Removes the registrations of turns whose cgroup is gone — what a
/// killed supervisor left — once there are more than a few.
fn sweep(turns: &MapHandle) {
    let keys: Vec<Vec<u8>> = turns.keys().collect();
    if keys.len() <= 32 {
        return;
    }
    let live = live_cgroup_ids();
    for k in keys {
        let Ok(id) = <[u8; 8]>::try_from(k.as_slice()).map(u64::from_ne_bytes) else {
            continue;
        };
        if !live.contains(&id) {
            let _ = turns.delete(&k);
        }
    }
}

/// The ids of every cgroup v2 directory on the host (the real cgroupfs,
/// whatever `TURNSTILE_CGROUP_ROOT` names: a fake tree would make every
/// other supervisor's turns look gone).
fn live_cgroup_ids() -> std::collections::HashSet<u64> {
    use std::os::unix::fs::MetadataExt;
    let root = std::path::PathBuf::from("/sys/fs/cgroup");
    let top = if root.join("unified/cgroup.procs").exists() {
        root.join("unified")
    } else {
        root
    };
    let mut ids = std::collections::HashSet::new();
    let mut stack = vec![top];
    while let Some(d) = stack.pop() {
        if let Ok(m) = std::fs::metadata(&d) {
            ids.insert(m.ino());
        }
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    ids
}

/// Opens and loads the observer's program, its CO-RE relocations made
/// against `btf` (the kernel's own BTF when `None`).
fn load_object(btf: Option<&std::path::Path>) -> Result<libbpf_rs::Object, String> {
    let mut b = libbpf_rs::ObjectBuilder::default();
    if let Some(path) = btf {
        b.btf_custom_path(path).map_err(|x| format!("btf: {x}"))?;
    }
    b.open_memory(OBJECT)
        .map_err(|x| format!("open: {x}"))?
        .load()
        .map_err(|x| format!("load (verifier): {x}"))
}

/// Where the minimal BTFs are kept: per boot (the kernel's BTF cannot
/// change within one), root's only.
const BTF_CACHE: &str = "/run/turnstile/btf";

/// A BTF holding only the kernel types the observer's program relocates
/// against (`bpftool gen min_core_btf`), made once per boot and program.
/// libbpf otherwise parses the kernel's whole BTF (~5 MB) in every process
/// that loads the program: ~20 ms of CPU per cold `supervise run`
/// (measured with perf on this 2-core host: a third of the process's CPU,
/// competing with the turn); this one is under 1 KB. `None` (the kernel's
/// BTF is used) when bpftool is not installed or cannot make it.
fn min_btf() -> Option<std::path::PathBuf> {
    use sha2::{Digest, Sha256};
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let mut h = Sha256::new();
    h.update(OBJECT);
    h.update(boot.trim().as_bytes());
    let key = hex::encode(&h.finalize()[..12]);
    let dir = std::path::Path::new(BTF_CACHE);
    let path = dir.join(format!("{key}.btf"));
    if path.is_file() {
        return Some(path);
    }
    // Tried once per boot and program: a bpftool that cannot make it is
    // not run again by every later process (seconds each in a TCG guest).
    let failed = dir.join(format!("{key}.failed"));
    if failed.exists() {
        return None;
    }
    let bpftool = [
        "/usr/sbin/bpftool",
        "/usr/bin/bpftool",
        "/usr/local/sbin/bpftool",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).is_file())?;
    private_dir(dir).ok()?;
    // Unique names per process: two first loads at once each make their
    // own, and the rename keeps one whole file.
    let tmp = |ext: &str| dir.join(format!("{key}.{}.{ext}", std::process::id()));
    let (obj, out) = (tmp("o"), tmp("btf.tmp"));
    let made = std::fs::write(&obj, OBJECT).is_ok()
        && std::process::Command::new(bpftool)
            .args(["gen", "min_core_btf", "/sys/kernel/btf/vmlinux"])
            .arg(&out)
            .arg(&obj)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        && std::fs::rename(&out, &path).is_ok();
    let _ = std::fs::remove_file(&obj);
    let _ = std::fs::remove_file(&out);
    if !made {
        let _ = std::fs::write(&failed, b"");
    }
    made.then_some(path)
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn u32_at(d: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]])
}

fn u64_at(d: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[at..at + 8]);
    u64::from_ne_bytes(b)
}

/// `.` and `..` folded, lexically (the kernel's own walk would follow
/// symlinks; the path is a record, not a lookup).
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

fn on_event(tables: &Mutex<HashMap<u64, Table>>, d: &[u8]) {
    if d.len() < EVENT_SIZE {
        return;
    }
    let cgid = u64_at(d, 0);
    let hash = u64_at(d, 8);
    let nr = u32_at(d, 24) as i32;
    let errno = u32_at(d, 28) as i32;
    let pid = u32_at(d, 32);
    let flags = u32_at(d, 44);
    let ncomp = u32_at(d, 52);
    let path = cstr(&d[56..56 + PATH]);
    let path2 = cstr(&d[56 + PATH..56 + 2 * PATH]);
    let resolve = |p: &str| -> String {
        if p.starts_with('/') {
            return normalize(p);
        }
        let n = (ncomp & 0x7fff_ffff) as usize;
        let mut base: Vec<String> = (0..n.min(COMP))
            .map(|i| {
                let at = 56 + 2 * PATH + i * COMP_LEN;
                cstr(&d[at..at + COMP_LEN])
            })
            .collect();
        base.reverse();
        let prefix = if ncomp & 0x8000_0000 != 0 { "/…" } else { "" };
        normalize(&format!("{prefix}/{}/{p}", base.join("/")))
    };
    let denial = RawDenial {
        nr,
        errno,
        pid,
        path: resolve(&path),
        // symlink's target is content, not a path to resolve.
        path2: (!path2.is_empty()).then(|| path2.clone()),
        flags,
        count: 1,
        first_at: Instant::now(),
    };
    let Ok(mut t) = tables.lock() else { return };
    let Some(table) = t.get_mut(&cgid) else {
        return;
    };
    let cap = if table.learn {
        MAX_LEARNED
    } else {
        MAX_DISTINCT
    };
    if table.events.len() >= cap {
        table.overflow += 1;
    } else {
        table.events.push((hash, denial));
    }
}

/// A turn being observed: its cgroup is registered until [`finish`].
///
/// [`finish`]: Registration::finish
#[derive(Debug)]
pub struct Registration {
    cgid: u64,
    learn: bool,
    observer: &'static Observer,
    done: bool,
}

#[repr(C)]
struct TurnValue {
    learn: u32,
    slot: u32,
    dropped: u64,
    unreadable: u64,
}

/// Bytes of each turn's ring buffer (the program's inner map template).
const RING_BYTES: u32 = 1 << 20;

impl Observer {
    /// Observes the turn whose processes are in cgroup `cgid` (its v2 id);
    /// `learn` also reports the operations that succeeded.
    pub fn register(&'static self, cgid: u64, learn: bool) -> Result<Registration, String> {
        if let Ok(mut t) = self.tables.lock() {
            t.insert(
                cgid,
                Table {
                    learn,
                    ..Table::default()
                },
            );
        }
        let mut reg = Registration {
            cgid,
            learn: false,
            observer: self,
            done: false,
        };
        let v = TurnValue {
            learn: learn.into(),
            slot: self.slot,
            dropped: 0,
            unreadable: 0,
        };
        let mut value = Vec::with_capacity(24);
        value.extend_from_slice(&v.learn.to_ne_bytes());
        value.extend_from_slice(&v.slot.to_ne_bytes());
        value.extend_from_slice(&v.dropped.to_ne_bytes());
        value.extend_from_slice(&v.unreadable.to_ne_bytes());
        self.turns
            .update(&cgid.to_ne_bytes(), &value, MapFlags::ANY)
            .map_err(|e| format!("registering the turn's cgroup: {e}"))?;
        if learn {
            reg.learn = true;
            self.learners.add(1);
        }
        Ok(reg)
    }
}

impl Registration {
    /// Unregisters the turn and returns its refusals with their counts.
    /// Call once every process of the turn is gone.
    pub fn finish(mut self) -> Observed {
        self.done = true;
        let o = self.observer;
        let key = self.cgid.to_ne_bytes();
        let (dropped, unreadable) = o
            .turns
            .lookup(&key, MapFlags::ANY)
            .ok()
            .flatten()
            .filter(|v| v.len() >= 24)
            .map(|v| (u64_at(&v, 8), u64_at(&v, 16)))
            .unwrap_or((0, 0));
        let _ = o.turns.delete(&key);
        if self.learn {
            o.learners.add(-1);
        }
        // Nothing of the turn runs: everything it sent is in the ring.
        if let Err(why) = o.ring.drain() {
            tracing::warn!(%why, "cannot read the denial observer's ring buffer");
        }
        let table = o
            .tables
            .lock()
            .ok()
            .and_then(|mut t| t.remove(&self.cgid))
            .unwrap_or_default();
        let mut denials = Vec::with_capacity(table.events.len());
        for (hash, mut d) in table.events {
            let mut k = Vec::with_capacity(24);
            k.extend_from_slice(&self.cgid.to_ne_bytes());
            k.extend_from_slice(&hash.to_ne_bytes());
            k.extend_from_slice(&d.nr.to_ne_bytes());
            k.extend_from_slice(&d.errno.to_ne_bytes());
            if let Ok(Some(v)) = o.seen.lookup(&k, MapFlags::ANY) {
                if v.len() >= 8 {
                    d.count = u64_at(&v, 0).max(1);
                }
            }
            let _ = o.seen.delete(&k);
            denials.push(d);
        }
        if self.learn {
            if let Ok(mut l) = LEARNED.lock() {
                l.extend(denials.iter().cloned());
            }
            denials.retain(|d| d.errno != 0);
        }
        Observed {
            denials,
            overflow: table.overflow + dropped,
            unreadable,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.done {
            let key = self.cgid.to_ne_bytes();
            let _ = self.observer.turns.delete(&key);
            if self.learn {
                self.observer.learners.add(-1);
            }
            if let Ok(mut t) = self.observer.tables.lock() {
                t.remove(&self.cgid);
            }
        }
    }
}

/// The cgroup v2 id of directory `dir` (its inode number).
pub fn cgroup_id(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_folds_dots() {
        assert_eq!(normalize("/a/./b/../c"), "/a/c");
        assert_eq!(normalize("/../x"), "/x");
        assert_eq!(normalize("//a//b/"), "/a/b");
    }

    /// The observer's program loads against the minimal BTF made for it
    /// (made once, then reused: the same file), and a BTF that is not one
    /// is an error the loader falls back from, never a crash (issue 29:
    /// the kernel's whole BTF parsed in every process cost ~20 ms of CPU).
    #[test]
    fn issue_29_the_observer_loads_against_its_minimal_btf() {
        if unavailable().is_some() {
            return;
        }
        let Some(min) = min_btf() else {
            assert!(
                std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() != Ok("1"),
                "bpftool is required (apt-get install bpftool)"
            );
            return;
        };
        assert!(std::fs::metadata(&min).unwrap().len() < 64 * 1024);
        assert_eq!(min_btf(), Some(min.clone()));
        load_object(Some(&min)).unwrap();
        let bad = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(bad.path(), b"not a BTF").unwrap();
        assert!(load_object(Some(bad.path())).is_err());
        load_object(None).unwrap();
    }
}
