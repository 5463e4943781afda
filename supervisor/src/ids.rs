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

/// The kernel CSPRNG (`getrandom(2)`).
#[derive(Debug, Default, Clone, Copy)]
pub struct OsRandom;

impl RandomSource for OsRandom {
    fn next_u64(&self) -> Result<u64, PolicyError> {
        getrandom::u64().map_err(|e| PolicyError::Random(e.to_string()))
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
