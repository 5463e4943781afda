//! Session ids: `SES-<UTC timestamp>-<random>` (FR-RT-004).
//!
//! The form is fixed width — `SES-20261121T093700123456Z-0123456789abcdef` —
//! so ids sort by creation time as plain strings. The timestamp has
//! microsecond resolution; the random part is 64 bits from the injected
//! [`RandomSource`] (the OS CSPRNG in production, a seeded generator in
//! deterministic mode). Parsing accepts exactly this form and nothing else:
//! a session id becomes a directory name, so anything looser is a traversal
//! risk.

use std::fmt;
use std::sync::Mutex;

use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};

use crate::error::PolicyError;

const PREFIX: &str = "SES-";
const STAMP_LEN: usize = 22; // YYYYMMDD T HHMMSS ffffff Z
const RANDOM_LEN: usize = 16;
/// Length of every valid session id.
pub const SESSION_ID_LEN: usize = PREFIX.len() + STAMP_LEN + 1 + RANDOM_LEN;

/// Where "now" comes from.
pub trait Clock: Send + Sync {
    fn now(&self) -> OffsetDateTime;
}

/// Where unpredictable bits come from.
pub trait RandomSource: Send + Sync {
    fn next_u64(&self) -> Result<u64, PolicyError>;
}

/// A validated session id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(String);

impl SessionId {
    /// Builds the id for `at` (converted to UTC) and a random value.
    pub fn from_parts(at: OffsetDateTime, random: u64) -> Self {
        let t = at.to_offset(time::UtcOffset::UTC);
        Self(format!(
            "{PREFIX}{:04}{:02}{:02}T{:02}{:02}{:02}{:06}Z-{random:016x}",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.microsecond(),
        ))
    }

    /// Parses a session id, accepting exactly the canonical form.
    pub fn parse(value: &str) -> Result<Self, PolicyError> {
        let invalid = |reason: &str| PolicyError::InvalidSessionId {
            value: value.to_owned(),
            reason: format!(
                "{reason} (expected SES-YYYYMMDDTHHMMSSffffffZ-<16 lowercase hex digits>)"
            ),
        };
        if value.len() != SESSION_ID_LEN || !value.is_ascii() {
            return Err(invalid("wrong length or non-ASCII characters"));
        }
        let Some(rest) = value.strip_prefix(PREFIX) else {
            return Err(invalid("does not start with `SES-`"));
        };
        let (stamp, random) = rest.split_at(STAMP_LEN);
        let Some(random) = random.strip_prefix('-') else {
            return Err(invalid("missing `-` before the random part"));
        };
        if !random
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(invalid("random part is not 16 lowercase hex digits"));
        }
        parse_stamp(stamp).ok_or_else(|| invalid("timestamp is not a valid UTC date and time"))?;
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The creation time encoded in the id.
    pub fn timestamp(&self) -> Option<OffsetDateTime> {
        parse_stamp(&self.0[PREFIX.len()..PREFIX.len() + STAMP_LEN])
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn parse_stamp(s: &str) -> Option<OffsetDateTime> {
    let b = s.as_bytes();
    if b.len() != STAMP_LEN || b[8] != b'T' || b[21] != b'Z' {
        return None;
    }
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = s.get(r)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let year = i32::try_from(digits(0..4)?).ok()?;
    let month = Month::try_from(u8::try_from(digits(4..6)?).ok()?).ok()?;
    let day = u8::try_from(digits(6..8)?).ok()?;
    let hour = u8::try_from(digits(9..11)?).ok()?;
    let minute = u8::try_from(digits(11..13)?).ok()?;
    let second = u8::try_from(digits(13..15)?).ok()?;
    let micro = digits(15..21)?;
    let date = Date::from_calendar_date(year, month, day).ok()?;
    let time = Time::from_hms_micro(hour, minute, second, micro).ok()?;
    Some(PrimitiveDateTime::new(date, time).assume_utc())
}

/// Generates session ids from an injected clock and random source.
#[derive(Debug)]
pub struct SessionIdGenerator<C, R> {
    clock: C,
    random: R,
}

impl<C: Clock, R: RandomSource> SessionIdGenerator<C, R> {
    pub fn new(clock: C, random: R) -> Self {
        Self { clock, random }
    }

    pub fn generate(&self) -> Result<SessionId, PolicyError> {
        Ok(SessionId::from_parts(
            self.clock.now(),
            self.random.next_u64()?,
        ))
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }
}

/// A clock that always returns the same instant, advanced by a fixed step on
/// every call: deterministic mode and tests.
#[derive(Debug)]
pub struct SteppingClock {
    next: Mutex<OffsetDateTime>,
    step: time::Duration,
}

impl SteppingClock {
    pub fn new(start: OffsetDateTime, step: time::Duration) -> Self {
        Self {
            next: Mutex::new(start),
            step,
        }
    }
}

impl Clock for SteppingClock {
    fn now(&self) -> OffsetDateTime {
        let mut guard = match self.next.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let now = *guard;
        *guard = now.saturating_add(self.step);
        now
    }
}

/// A seeded, deterministic random source (SplitMix64). Never for production
/// ids: it exists so deterministic mode gives byte-identical ledgers.
#[derive(Debug)]
pub struct SeededRandom {
    state: Mutex<u64>,
}

impl SeededRandom {
    pub fn new(seed: u64) -> Self {
        Self {
            state: Mutex::new(seed),
        }
    }
}

impl RandomSource for SeededRandom {
    fn next_u64(&self) -> Result<u64, PolicyError> {
        let mut guard = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        *guard = guard.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *guard;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Ok(z ^ (z >> 31))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(nanos: i128) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap()
    }

    #[test]
    fn fr_rt_004_format_is_ses_timestamp_random() {
        let id = SessionId::from_parts(at(1_795_253_820_123_456_000), 0xdead_beef);
        assert_eq!(id.as_str(), "SES-20261121T093700123456Z-00000000deadbeef");
        assert_eq!(SessionId::parse(id.as_str()).unwrap(), id);
        assert_eq!(id.timestamp(), Some(at(1_795_253_820_123_456_000)));
    }

    #[test]
    fn fr_rt_004_ids_sort_by_time() {
        let early = SessionId::from_parts(at(1_000_000_000_000_000_000), u64::MAX);
        let late = SessionId::from_parts(at(1_000_000_000_000_001_000), 0);
        assert!(early < late);
    }

    #[test]
    fn fr_rt_004_parse_rejects_everything_but_the_exact_form() {
        let good = "SES-20261121T093700123456Z-00000000deadbeef";
        for bad in [
            "",
            "SES-",
            "ses-20261121T093700123456Z-00000000deadbeef",
            "SES-20261121T093700123456Z-00000000DEADBEEF",
            "SES-20261321T093700123456Z-00000000deadbeef",
            "SES-20260230T093700123456Z-00000000deadbeef",
            "SES-20261121T253700123456Z-00000000deadbeef",
            "SES-20261121T093700123456Z_00000000deadbeef",
            "SES-20261121T093700123456Z-00000000deadbee",
            "SES-20261121T093700123456Z-00000000deadbeef0",
            "SES-20261121T093700123456Z-../../../etc/pa",
            "SES-20261121T09370012345/Z-00000000deadbeef",
            "SES-2026112１T093700123456Z-00000000deadbeef",
        ] {
            assert!(SessionId::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(SessionId::parse(good).is_ok());
    }

    #[test]
    fn seeded_generation_is_deterministic() {
        let make = || {
            SessionIdGenerator::new(
                SteppingClock::new(at(0), time::Duration::seconds(1)),
                SeededRandom::new(7),
            )
        };
        let (a, b) = (make(), make());
        for _ in 0..10 {
            assert_eq!(a.generate().unwrap(), b.generate().unwrap());
        }
    }
}
