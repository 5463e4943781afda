//! The one timestamp form turnstile writes: RFC 3339, UTC, microseconds, `Z`.

use time::OffsetDateTime;
use time::format_description::FormatItem;
use time::macros::format_description;

const RFC3339_MICROS: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z");

/// Formats `t` (converted to UTC) as `2026-11-21T09:37:00.123456Z`.
pub fn rfc3339_micros(t: OffsetDateTime) -> String {
    let utc = t.to_offset(time::UtcOffset::UTC);
    // Formatting a valid OffsetDateTime with a static description only fails
    // for years outside 0..=9999, which no clock produces; fall back to the
    // well-known form rather than panic.
    utc.format(RFC3339_MICROS)
        .unwrap_or_else(|_| utc.unix_timestamp().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_fixed_width_utc() {
        let t = OffsetDateTime::from_unix_timestamp_nanos(1_763_717_820_000_123_000).unwrap();
        assert_eq!(rfc3339_micros(t), "2025-11-21T09:37:00.000123Z");
    }
}
