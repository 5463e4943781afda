//! What can be wrong with a ledger: the integrity failures verification
//! names. Depends on nothing else in the crate, so the error type and the
//! ledger can both use it.

use std::fmt;
use std::path::PathBuf;

/// What is wrong with a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    FileMissing {
        acknowledged: u64,
    },
    NotRegularFile,
    AnchorMissing,
    AnchorInvalid(String),
    TornLine,
    EmptyLine,
    Malformed(String),
    NotCanonical,
    NotObject,
    MissingField(&'static str),
    SeqMismatch {
        found: String,
    },
    WrongSession {
        found: String,
    },
    BrokenLink {
        expected: String,
        found: String,
    },
    HashMismatch {
        recorded: String,
        computed: String,
    },
    LegacyAfterHashed,
    Truncated {
        acknowledged: u64,
        found: u64,
    },
    BeyondAnchor {
        acknowledged: u64,
        found: u64,
    },
    AnchorHashMismatch {
        acknowledged: String,
        found: String,
    },
    SizeMismatch {
        acknowledged: u64,
        found: u64,
    },
    PendingAppend,
    /// An HO2 checkpoint that does not match the ledger it claims to cover.
    Checkpoint(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FileMissing { acknowledged } => write!(
                f,
                "the ledger file is missing, but {acknowledged} entries were acknowledged (deleted?)"
            ),
            Self::NotRegularFile => write!(f, "is not a regular file (symlink or special file)"),
            Self::AnchorMissing => write!(
                f,
                "no head anchor in the state directory: truncation or deletion cannot be ruled out"
            ),
            Self::AnchorInvalid(why) => write!(f, "the head anchor is invalid: {why}"),
            Self::TornLine => write!(f, "torn line: the last line has no terminating newline"),
            Self::EmptyLine => write!(f, "empty line"),
            Self::Malformed(why) => write!(f, "malformed JSON: {why}"),
            Self::NotCanonical => write!(
                f,
                "not canonical JSON (whitespace, key order, escapes or number form were changed)"
            ),
            Self::NotObject => write!(f, "entry is not a JSON object"),
            Self::MissingField(name) => write!(f, "missing or mistyped field `{name}`"),
            Self::SeqMismatch { found } => write!(
                f,
                "seq is {found}: an entry was deleted, inserted or reordered before this line"
            ),
            Self::WrongSession { found } => write!(
                f,
                "entry belongs to session `{found}` (spliced from another session)"
            ),
            Self::BrokenLink { expected, found } => write!(
                f,
                "previous_hash {found} does not link to the previous entry ({expected}): the previous entry was altered, or this one was spliced in"
            ),
            Self::HashMismatch { recorded, computed } => write!(
                f,
                "entry_hash {recorded} does not match the content (computed {computed}): the entry was edited"
            ),
            Self::LegacyAfterHashed => write!(
                f,
                "an entry without hashes follows hashed entries (downgrade): legacy entries may only precede the chain"
            ),
            Self::Truncated {
                acknowledged,
                found,
            } => {
                if *found == 0 {
                    write!(
                        f,
                        "the ledger is empty, but {acknowledged} entries were acknowledged (truncated)"
                    )
                } else {
                    write!(
                        f,
                        "the ledger ends at seq {found}, but {acknowledged} entries were acknowledged (tail truncated)"
                    )
                }
            }
            Self::BeyondAnchor {
                acknowledged,
                found,
            } => write!(
                f,
                "the ledger has entries up to seq {found}, but only {acknowledged} were acknowledged (appended outside the supervisor, or an append never completed)"
            ),
            Self::AnchorHashMismatch {
                acknowledged,
                found,
            } => write!(
                f,
                "the head entry hash {found} differs from the acknowledged head {acknowledged} (the tail was rewritten)"
            ),
            Self::SizeMismatch {
                acknowledged,
                found,
            } => write!(
                f,
                "the file is {found} bytes, but {acknowledged} bytes were acknowledged (changed outside the supervisor)"
            ),
            Self::PendingAppend => write!(
                f,
                "an earlier append did not finish; the session must be recovered before appending"
            ),
            Self::Checkpoint(detail) => write!(f, "checkpoint refused: {detail}"),
        }
    }
}

/// A ledger failed verification. Names the ledger, the entry (line and,
/// when known, seq) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct IntegrityError {
    pub ledger: PathBuf,
    pub line: Option<u64>,
    pub seq: Option<u64>,
    pub problem: Problem,
}

impl fmt::Display for IntegrityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ledger {}", self.ledger.display())?;
        match (self.line, self.seq) {
            (Some(line), Some(seq)) => write!(f, ": entry seq {seq} (line {line})")?,
            (Some(line), None) => write!(f, ": line {line}")?,
            (None, Some(seq)) => write!(f, ": entry seq {seq}")?,
            (None, None) => {}
        }
        write!(f, ": {}", self.problem)
    }
}
