//! The denial observer (issue 27): a BPF program on every syscall's exit
//! (`bpf/denials.bpf.c`, built by `build.rs`), loaded and attached once
//! per supervisor process, that reports the path operations of registered
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
    bss: MapHandle,
    tables: Arc<Mutex<HashMap<u64, Table>>>,
    /// Drained by the observer's thread as events arrive, and by a
    /// finishing turn (which then sees everything sent before it).
    ring: Arc<Mutex<libbpf_rs::RingBuffer<'static>>>,
    learners: Mutex<u32>,
    /// How long loading and attaching took.
    pub load_time: Duration,
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
    let (tx, rx) = std::sync::mpsc::channel::<Ready>();
    let tables: Arc<Mutex<HashMap<u64, Table>>> = Arc::default();
    let t2 = Arc::clone(&tables);
    // The object, its link and the ring buffer live in the consumer thread
    // for the rest of the process.
    std::thread::Builder::new()
        .name("denials".into())
        .spawn(move || consumer(tx, t2))
        .map_err(|e| e.to_string())?;
    let (turns, seen, bss, ring) = rx
        .recv()
        .map_err(|_| "the observer's thread ended".to_owned())??;
    Ok(Observer {
        turns,
        seen,
        bss,
        tables,
        ring,
        learners: Mutex::new(0),
        load_time: started.elapsed(),
    })
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
    use std::os::unix::fs::DirBuilderExt;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let mut h = Sha256::new();
    h.update(OBJECT);
    h.update(boot.trim().as_bytes());
    let key: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
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
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .ok()?;
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

type Ring = Arc<Mutex<libbpf_rs::RingBuffer<'static>>>;
type Ready = Result<(MapHandle, MapHandle, MapHandle, Ring), String>;

fn consumer(tx: std::sync::mpsc::Sender<Ready>, tables: Arc<Mutex<HashMap<u64, Table>>>) {
    let setup = || -> Result<_, String> {
        let e = |what: &str| {
            let what = what.to_owned();
            move |x: libbpf_rs::Error| format!("{what}: {x}")
        };
        // CO-RE relocations against a BTF of only the types the program
        // uses when there is one (see `min_btf`); the kernel's whole BTF
        // otherwise, or if that load fails.
        let open = load_object;
        let min = min_btf();
        let obj = match min.as_deref().map(|p| open(Some(p))) {
            Some(Ok(obj)) => obj,
            Some(Err(why)) => {
                tracing::warn!(%why, "the observer's minimal BTF did not load; using the kernel's");
                if let Some(p) = &min {
                    let _ = std::fs::remove_file(p);
                }
                open(None)?
            }
            None => open(None)?,
        };
        let mut links = Vec::new();
        for p in obj.progs_mut() {
            links.push(p.attach().map_err(e("attach"))?);
        }
        let map = |name: &str| -> Result<MapHandle, String> {
            let m = obj
                .maps()
                .find(|m| {
                    m.name() == name
                        || (name.starts_with('.') && m.name().to_string_lossy().ends_with(name))
                })
                .ok_or_else(|| format!("map {name} missing"))?;
            MapHandle::try_from(&m).map_err(e(name))
        };
        let (turns, seen, bss, events) =
            (map("turns")?, map("seen")?, map(".bss")?, map("events")?);
        Ok((obj, links, turns, seen, bss, events))
    };
    let (obj, links, turns, seen, bss, events) = match setup() {
        Ok(x) => x,
        Err(why) => {
            let _ = tx.send(Err(why));
            return;
        }
    };
    let t = Arc::clone(&tables);
    let mut builder = libbpf_rs::RingBufferBuilder::new();
    let added = builder
        .add(&events, move |data: &[u8]| {
            on_event(&t, data);
            0
        })
        .map(|_| ());
    let rb = added.and_then(|()| builder.build());
    let rb = match rb {
        Ok(rb) => rb,
        Err(e) => {
            let _ = tx.send(Err(format!("ring buffer: {e}")));
            return;
        }
    };
    // SAFETY: the epoll fd is owned by `rb`, which this thread keeps (in
    // `ring`) for the rest of the process.
    let epfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(rb.epoll_fd()) };
    let ring: Ring = Arc::new(Mutex::new(rb));
    if tx.send(Ok((turns, seen, bss, Arc::clone(&ring)))).is_err() {
        return;
    }
    let _keep = (obj, links, events);
    loop {
        let mut fds = [nix::poll::PollFd::new(epfd, nix::poll::PollFlags::POLLIN)];
        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(1000u16));
        if let Ok(rb) = ring.lock() {
            let _ = rb.consume();
        }
    }
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
    pad: u32,
    dropped: u64,
}

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
        let v = TurnValue {
            learn: learn.into(),
            pad: 0,
            dropped: 0,
        };
        let mut value = Vec::with_capacity(16);
        value.extend_from_slice(&v.learn.to_ne_bytes());
        value.extend_from_slice(&v.pad.to_ne_bytes());
        value.extend_from_slice(&v.dropped.to_ne_bytes());
        self.turns
            .update(&cgid.to_ne_bytes(), &value, MapFlags::ANY)
            .map_err(|e| format!("registering the turn's cgroup: {e}"))?;
        if learn {
            self.learners_add(1);
        }
        Ok(Registration {
            cgid,
            learn,
            observer: self,
            done: false,
        })
    }

    fn learners_add(&self, d: i32) {
        if let Ok(mut n) = self.learners.lock() {
            *n = n.saturating_add_signed(d);
            let _ = self
                .bss
                .update(&0u32.to_ne_bytes(), &n.to_ne_bytes(), MapFlags::ANY);
        }
    }

    /// Delivers everything the kernel has sent so far.
    fn flush(&self) {
        if let Ok(rb) = self.ring.lock() {
            let _ = rb.consume();
        }
    }
}

impl Registration {
    /// Unregisters the turn and returns its refusals with their counts.
    /// Call once every process of the turn is gone.
    pub fn finish(mut self) -> Observed {
        self.done = true;
        let o = self.observer;
        let key = self.cgid.to_ne_bytes();
        let dropped = o
            .turns
            .lookup(&key, MapFlags::ANY)
            .ok()
            .flatten()
            .filter(|v| v.len() >= 16)
            .map(|v| u64_at(&v, 8))
            .unwrap_or(0);
        let _ = o.turns.delete(&key);
        if self.learn {
            o.learners_add(-1);
        }
        o.flush();
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
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.observer.turns.delete(&self.cgid.to_ne_bytes());
            if self.learn {
                self.observer.learners_add(-1);
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
