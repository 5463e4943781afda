//! Tests that pass outside and may NOT pass inside a turn, each with the
//! reason a sandbox must deny what it needs. Only that kind of reason
//! belongs here: a test that fails because turnstile over-blocks is a bug
//! to fix, never an entry.

/// One allowlisted test: its full unittest id and why the sandbox must
/// deny what it needs.
#[derive(Debug, Clone, Copy)]
pub struct Allowed {
    pub test: &'static str,
    pub reason: &'static str,
}

/// The allowlist.
pub const ALLOWLIST: &[Allowed] = &[];

/// Why `test` may fail inside, if it is allowlisted.
pub fn reason(test: &str) -> Option<&'static str> {
    ALLOWLIST.iter().find(|a| a.test == test).map(|a| a.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_is_a_full_test_id_with_a_reason() {
        let mut seen = std::collections::BTreeSet::new();
        for a in ALLOWLIST {
            assert!(a.test.starts_with("test.test_"), "{}", a.test);
            assert!(a.test.split('.').count() >= 4, "{}", a.test);
            assert!(a.reason.len() >= 30, "{} has no real reason", a.test);
            assert!(seen.insert(a.test), "{} twice", a.test);
        }
    }
}
