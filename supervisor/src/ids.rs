//! Production clock and randomness for session ids and timestamps.

use time::OffsetDateTime;
use turnstile_policy::PolicyError;
use turnstile_policy::session::{Clock, RandomSource};

/// The system's real-time clock, in UTC.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }
}

/// The kernel CSPRNG (`getrandom(2)`, called directly).
///
/// Not through the `getrandom` crate: its Linux backend finds libc's
/// `getrandom` with `dlsym`, which a statically linked `supervise` cannot
/// answer, and then falls back to polling `/dev/random` for readiness — a
/// poll that never wakes in a guest whose pool nothing fills (the 6.1 VM
/// stage hung on it: only a blocking `getrandom(2)` starts the kernel's
/// jitter entropy). The system call blocks until the pool is initialised,
/// once per boot, and never after.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsRandom;

impl RandomSource for OsRandom {
    fn next_u64(&self) -> Result<u64, PolicyError> {
        let mut buf = [0u8; 8];
        let mut filled = 0;
        while filled < buf.len() {
            let rest = &mut buf[filled..];
            // SAFETY: the kernel writes at most `rest.len()` bytes into
            // `rest`, a live exclusive borrow.
            let n = unsafe { nix::libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
            match usize::try_from(n) {
                Ok(n) => filled += n,
                Err(_) => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(PolicyError::Random(format!("getrandom(2): {e}")));
                    }
                }
            }
        }
        Ok(u64::from_ne_bytes(buf))
    }
}

/// The clock and the randomness a turn uses, injected: production passes
/// [`SystemClock`] and [`OsRandom`]; tests and deterministic runs pass
/// their own. Nothing in the turn pipeline reads the time or the CSPRNG
/// any other way (durations come from the monotonic clock and are never
/// hashed into ids).
#[derive(Clone)]
pub struct Sources {
    pub clock: std::sync::Arc<dyn Clock>,
    pub random: std::sync::Arc<dyn RandomSource>,
}

impl Sources {
    pub fn system() -> Self {
        Self {
            clock: std::sync::Arc::new(SystemClock),
            random: std::sync::Arc::new(OsRandom),
        }
    }
}

/// A session's deterministic mode (issue 13): a seed and a start time,
/// recorded in the session's state record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deterministic {
    pub seed: u64,
    pub clock: OffsetDateTime,
}

impl Deterministic {
    /// As recorded in the session's record.
    pub fn to_doc(&self) -> DeterministicDoc {
        DeterministicDoc {
            seed: self.seed,
            clock: turnstile_policy::timefmt::rfc3339_micros(self.clock),
        }
    }

    /// From the session's record (`None`: not a valid one).
    pub fn from_doc(d: &DeterministicDoc) -> Option<Self> {
        let clock =
            OffsetDateTime::parse(&d.clock, &time::format_description::well_known::Rfc3339).ok()?;
        Some(Self {
            seed: d.seed,
            clock,
        })
    }

    /// The sources of `step` (0: session creation, N: turn N): a clock that
    /// starts one hour per step after the session's start and advances one
    /// millisecond per reading, and a SplitMix64 stream of (seed, step).
    pub fn sources(&self, step: u64) -> Sources {
        let start = self.clock + time::Duration::hours(step as i64);
        Sources {
            clock: std::sync::Arc::new(SteppingClock {
                start,
                readings: std::sync::atomic::AtomicU64::new(0),
            }),
            random: std::sync::Arc::new(SeededRandom {
                state: std::sync::atomic::AtomicU64::new(
                    self.seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                ),
            }),
        }
    }
}

/// A clock that advances one millisecond per reading from `start`.
#[derive(Debug)]
pub struct SteppingClock {
    start: OffsetDateTime,
    readings: std::sync::atomic::AtomicU64,
}

impl Clock for SteppingClock {
    fn now(&self) -> OffsetDateTime {
        let n = self
            .readings
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.start + time::Duration::milliseconds(n as i64)
    }
}

/// SplitMix64: a seeded, reproducible stream (never for secrets).
#[derive(Debug)]
pub struct SeededRandom {
    state: std::sync::atomic::AtomicU64,
}

impl RandomSource for SeededRandom {
    fn next_u64(&self) -> Result<u64, PolicyError> {
        let mut z = self
            .state
            .fetch_add(0x9e37_79b9_7f4a_7c15, std::sync::atomic::Ordering::SeqCst)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Ok(z ^ (z >> 31))
    }
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sources")
    }
}

impl Clock for Sources {
    fn now(&self) -> OffsetDateTime {
        self.clock.now()
    }
}

impl RandomSource for Sources {
    fn next_u64(&self) -> Result<u64, PolicyError> {
        self.random.next_u64()
    }
}

/// A turn's identity: its session and its 1-based number. Displayed as
/// `<session>-t<number>`, the one spelling of the name of its cgroup, its
/// OCI container and its log span.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TurnId {
    pub session: String,
    pub number: u64,
}

impl TurnId {
    pub fn new(session: impl Into<String>, number: u64) -> Self {
        Self {
            session: session.into(),
            number,
        }
    }

    /// The turn a Plan was compiled for.
    pub fn of(plan: &turnstile_policy::plan::Plan) -> Self {
        Self::new(plan.session_id.clone(), plan.turn_number)
    }
}

impl std::fmt::Display for TurnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-t{}", self.session, self.number)
    }
}

/// A deterministic session's parameters as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeterministicDoc {
    pub seed: u64,
    pub clock: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;
    use turnstile_policy::session::SessionIdGenerator;

    /// FR-RT-004: 100,000 ids from 8 concurrent threads, no collision, every
    /// one parses back.
    #[test]
    fn fr_rt_004_no_collisions_across_8_threads() {
        let generator = Arc::new(SessionIdGenerator::new(SystemClock, OsRandom));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let g = Arc::clone(&generator);
                std::thread::spawn(move || {
                    (0..12_500)
                        .map(|_| g.generate().unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for h in handles {
            for id in h.join().unwrap() {
                assert!(turnstile_policy::SessionId::parse(id.as_str()).is_ok());
                assert!(seen.insert(id.clone()), "collision: {id}");
            }
        }
        assert_eq!(seen.len(), 100_000);
    }
}
