//! Parses the per-test lines `python3 -m test -v MODULE` prints
//! (unittest's verbose runner, CPython 3.11):
//!
//! ```text
//! test_x (test.test_os.Class.test_x) ... ok
//! test_y (test.test_os.Class.test_y)
//! First line of the docstring ... skipped 'needs a tty'
//! test_z (test.test_os.Class.test_z) ... output the test printed
//! ok
//!   test_w (test.test_os.Class.test_w) (param=1) ... FAIL     <- a subtest
//! ```
//!
//! A test whose result never appears (the run hung or crashed inside it)
//! is [`Outcome::NoResult`]; [`Report::pending`] names it.

use std::collections::BTreeMap;

/// How one test ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Fail,
    Error,
    Skipped(String),
    ExpectedFailure,
    UnexpectedSuccess,
    /// Started, but no result was printed before the output ended or the
    /// next test started (a hang, a crash, a killed process).
    NoResult,
}

impl Outcome {
    /// A short label for tables.
    pub fn label(&self) -> String {
        match self {
            Self::Ok => "ok".into(),
            Self::Fail => "FAIL".into(),
            Self::Error => "ERROR".into(),
            Self::Skipped(why) => format!("skipped {why}"),
            Self::ExpectedFailure => "expected failure".into(),
            Self::UnexpectedSuccess => "unexpected success".into(),
            Self::NoResult => "no result (hang or crash)".into(),
        }
    }

    /// Worse outcomes win when one test reports twice (subtests).
    fn rank(&self) -> u8 {
        match self {
            Self::Ok | Self::ExpectedFailure => 0,
            Self::Skipped(_) => 1,
            Self::UnexpectedSuccess => 2,
            Self::NoResult => 3,
            Self::Fail => 4,
            Self::Error => 5,
        }
    }
}

/// Everything one run printed, per test id (`test.test_os.Class.test_x`).
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub tests: BTreeMap<String, Outcome>,
    /// `Ran N tests` was printed: the run got to its end.
    pub ran: Option<usize>,
    /// The test that had started when the output ended, if any.
    pub pending: Option<String>,
}

impl Report {
    pub fn passed(&self) -> impl Iterator<Item = &str> {
        self.tests
            .iter()
            .filter(|(_, o)| **o == Outcome::Ok)
            .map(|(k, _)| k.as_str())
    }

    fn set(&mut self, id: &str, outcome: Outcome) {
        match self.tests.get(id) {
            Some(old) if old.rank() >= outcome.rank() && *old != Outcome::NoResult => {}
            _ => {
                self.tests.insert(id.to_owned(), outcome);
            }
        }
    }

    /// Adds the results of a later run (a re-run after a hang): its
    /// outcomes replace earlier ones, except that a test that hung stays
    /// hung.
    pub fn merge_later(&mut self, later: Report) {
        for (id, o) in later.tests {
            if self.tests.get(&id) != Some(&Outcome::NoResult) {
                self.tests.insert(id, o);
            }
        }
        self.ran = later.ran;
        self.pending = later.pending;
    }
}

/// `name (dotted.id)` at the start of a line (after optional indentation):
/// returns (indent, id, rest of the line).
fn test_header(line: &str) -> Option<(usize, &str, &str)> {
    let trimmed = line.trim_start();
    let indent = line.len() - trimmed.len();
    let (name, after) = trimmed.split_once(" (")?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let (id, rest) = after.split_once(')')?;
    if !id.contains('.')
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        || !id.ends_with(name)
    {
        return None;
    }
    Some((indent, id, rest))
}

/// A status printed after ` ... ` (or alone on a line after test output).
fn status(s: &str) -> Option<Outcome> {
    let s = s.trim();
    Some(match s {
        "ok" => Outcome::Ok,
        "FAIL" => Outcome::Fail,
        "ERROR" => Outcome::Error,
        "expected failure" => Outcome::ExpectedFailure,
        "unexpected success" => Outcome::UnexpectedSuccess,
        _ => match s.strip_prefix("skipped") {
            Some(why) if why.is_empty() || why.starts_with(' ') => {
                Outcome::Skipped(why.trim().to_owned())
            }
            _ => return None,
        },
    })
}

/// Parses the merged stdout+stderr of `python3 -m test -v MODULE`.
pub fn parse(output: &str) -> Report {
    let mut report = Report::default();
    let mut pending: Option<String> = None;
    for line in output.lines() {
        if line.starts_with("Ran ") && line.contains(" test") {
            if let Some(n) = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()) {
                report.ran = Some(n);
            }
        }
        if let Some((indent, id, rest)) = test_header(line) {
            let fragment = rest.split_once(" ... ").map(|(_, s)| s);
            // A subtest's status line: `  name (id) (params) ... FAIL`.
            if indent > 0 && rest.starts_with(' ') && !rest.trim().is_empty() {
                if let Some(o) = fragment.and_then(status) {
                    report.set(id, o);
                    continue;
                }
            }
            if let Some(prev) = pending.take() {
                if prev != id && !report.tests.contains_key(&prev) {
                    report.set(&prev, Outcome::NoResult);
                }
            }
            match fragment.and_then(status) {
                Some(o) => report.set(id, o),
                None => pending = Some(id.to_owned()),
            }
            continue;
        }
        let Some(id) = pending.clone() else {
            continue;
        };
        // A docstring line `First line ... ok`, or the status after the
        // test's own output.
        let fragment = line.split_once(" ... ").map_or(line, |(_, s)| s);
        if let Some(o) = status(fragment).or_else(|| status(line)) {
            report.set(&id, o);
            pending = None;
        }
    }
    if let Some(id) = pending {
        if !report.tests.contains_key(&id) {
            report.set(&id, Outcome::NoResult);
            report.pending = Some(id);
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
0:00:00 load avg: 1.29 [1/1] test_signal
test_a (test.test_m.C.test_a) ... ok
test_b (test.test_m.C.test_b)
Docstring line ... skipped 'not on tty'
test_c (test.test_m.C.test_c)
This test uses handlers. ... detected median itimer() resolution: 0.000021 s.
ok
test_d (test.test_m.C.test_d) ... with 256 KiB thread stack size...
task <thread 0> will run
ok
test_e (test.test_m.C.test_e) ... FAIL
test_f (test.test_m.C.test_f) ... 
  test_f (test.test_m.C.test_f) (i=1) ... ERROR
  test_f (test.test_m.C.test_f) (i=2) ... FAIL
test_g (test.test_m.C.test_g) ... expected failure
test_h (test.test_m.C.test_h) ... ERROR
test_i (test.test_m.C.test_i) ... ok
----------------------------------------------------------------------
Ran 9 tests in 0.1s
";

    #[test]
    fn parses_every_shape_of_result_line() {
        let r = parse(SAMPLE);
        let get = |n: &str| r.tests.get(&format!("test.test_m.C.{n}")).cloned();
        assert_eq!(get("test_a"), Some(Outcome::Ok));
        assert_eq!(get("test_b"), Some(Outcome::Skipped("'not on tty'".into())));
        assert_eq!(get("test_c"), Some(Outcome::Ok));
        assert_eq!(get("test_d"), Some(Outcome::Ok));
        assert_eq!(get("test_e"), Some(Outcome::Fail));
        assert_eq!(get("test_f"), Some(Outcome::Error));
        assert_eq!(get("test_g"), Some(Outcome::ExpectedFailure));
        assert_eq!(get("test_h"), Some(Outcome::Error));
        assert_eq!(get("test_i"), Some(Outcome::Ok));
        assert_eq!(r.ran, Some(9));
        assert_eq!(r.pending, None);
        assert_eq!(r.passed().count(), 4);
    }

    #[test]
    fn a_test_without_result_is_pending_and_no_result() {
        let r = parse(
            "test_a (test.t.C.test_a) ... ok\n\
             test_hang (test.t.C.test_hang) ... some output\n\
             more output\n",
        );
        assert_eq!(r.pending.as_deref(), Some("test.t.C.test_hang"));
        assert_eq!(r.tests["test.t.C.test_hang"], Outcome::NoResult);
        assert_eq!(r.ran, None);
        // A test cut off by the next test's header is NoResult too.
        let r = parse("test_a (test.t.C.test_a) ... \ntest_b (test.t.C.test_b) ... ok\n");
        assert_eq!(r.tests["test.t.C.test_a"], Outcome::NoResult);
        assert_eq!(r.tests["test.t.C.test_b"], Outcome::Ok);
    }

    #[test]
    fn a_later_run_replaces_results_but_a_hang_stays() {
        let mut first = parse("test_a (t.C.test_a) ... FAIL\ntest_h (t.C.test_h) ... ");
        let later =
            parse("test_a (t.C.test_a) ... ok\ntest_b (t.C.test_b) ... ok\nRan 2 tests in 1s\n");
        first.merge_later(later);
        assert_eq!(first.tests["t.C.test_a"], Outcome::Ok);
        assert_eq!(first.tests["t.C.test_h"], Outcome::NoResult);
        assert_eq!(first.tests["t.C.test_b"], Outcome::Ok);
        assert_eq!(first.ran, Some(2));
    }
}
