//! What a package may read, write and execute, and what it may never touch:
//! the capability types a manifest is parsed into (and that the checks of
//! manifest entries read without depending on the manifest loader).

use crate::pattern::Pattern;

/// One execute entry: an executable (path or pattern) and a fixed argument
/// prefix, e.g. `scripts/trace.py --explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecEntry {
    pub program: Pattern,
    pub args: Vec<String>,
    raw: String,
}

impl ExecEntry {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut words = raw.split_ascii_whitespace();
        let program = words
            .next()
            .ok_or_else(|| "is empty; expected `<executable> [fixed args...]`".to_owned())?;
        let program = Pattern::parse(program).map_err(|e| format!("executable `{program}` {e}"))?;
        Ok(Self {
            program,
            args: words.map(str::to_owned).collect(),
            raw: raw.to_owned(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }
}

/// What a package may read, write and execute, and what it may never touch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub read: Vec<Pattern>,
    pub write: Vec<Pattern>,
    pub execute: Vec<ExecEntry>,
    pub forbidden: Vec<Pattern>,
}
