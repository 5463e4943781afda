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
