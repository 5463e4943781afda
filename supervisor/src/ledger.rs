//! Hash-chained, append-only ledgers (FR-RT-006/007/008/017/018).
//!
//! Every session has two JSONL ledgers, `exec.jsonl` and `evidence.jsonl`.
//! Each line is one entry in canonical JSON carrying `seq` (its 1-based line
//! number), `previous_hash` (the previous entry's `entry_hash`; for the first
//! entry a genesis value bound to the ledger kind and the session id, so
//! entries cannot be spliced between ledgers or sessions) and `entry_hash`
//! (sha256 of the canonical entry without `entry_hash`).
//!
//! The chain alone cannot show that the tail was cut off or the file deleted,
//! so every acknowledged append also moves a *head anchor* (last seq, its
//! hash, the file length) kept in the supervisor's state directory, outside
//! the workspace and out of the sandbox's sight.
//!
//! Appends happen only under the session lock ([`SessionLock`]), through
//! `O_APPEND | O_NOFOLLOW | O_CLOEXEC`, and are fsync'd before the anchor
//! moves — an append is acknowledged once both are durable.
//!
//! Verification recomputes every hash and link and compares the head with the
//! anchor. Parsing is strict: torn lines, duplicate keys and non-canonical
//! bytes are integrity errors, never skipped. Entries without hashes (legacy)
//! are accepted only as a prefix, with a warning; one after a hashed entry
//! would be a downgrade and is an error.

use std::fmt;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use nix::fcntl::OFlag;
use serde_json::{Map, Value, json};
use turnstile_policy::SessionId;
use turnstile_policy::canonical::{self, CanonicalError};

use crate::error::{Result, SupervisorError};
use crate::fsx;
use crate::session::SessionLock;

/// Largest ledger line accepted by the reader.
pub const MAX_ENTRY_BYTES: usize = 16 << 20;
/// Largest anchor file.
const MAX_ANCHOR_BYTES: u64 = 4096;

/// The fields the ledger itself owns.
pub const RESERVED_FIELDS: [&str; 3] = ["seq", "previous_hash", "entry_hash"];

/// Which of a session's two ledgers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LedgerKind {
    Exec,
    Evidence,
}

impl LedgerKind {
    pub const ALL: [LedgerKind; 2] = [LedgerKind::Exec, LedgerKind::Evidence];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exec => "exec",
            Self::Evidence => "evidence",
        }
    }

    pub fn file_name(self) -> &'static str {
        match self {
            Self::Exec => "exec.jsonl",
            Self::Evidence => "evidence.jsonl",
        }
    }
}

/// The `previous_hash` of a ledger's first entry.
pub fn genesis_hash(kind: LedgerKind, session: &SessionId) -> String {
    canonical::sha256_hex(format!("turnstile.ledger.v1\n{}\n{}", kind.as_str(), session).as_bytes())
}

/// What is wrong with a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    FileMissing { acknowledged: u64 },
    NotRegularFile,
    AnchorMissing,
    AnchorInvalid(String),
    TornLine,
    EmptyLine,
    Malformed(String),
    NotCanonical,
    NotObject,
    MissingField(&'static str),
    SeqMismatch { found: String },
    WrongSession { found: String },
    BrokenLink { expected: String, found: String },
    HashMismatch { recorded: String, computed: String },
    LegacyAfterHashed,
    Truncated { acknowledged: u64, found: u64 },
    BeyondAnchor { acknowledged: u64, found: u64 },
    AnchorHashMismatch { acknowledged: String, found: String },
    SizeMismatch { acknowledged: u64, found: u64 },
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

/// The acknowledged head of a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    pub seq: u64,
    pub entry_hash: String,
    pub len: u64,
    /// Byte offset where the head entry starts (`None` in anchors written
    /// before it was recorded).
    pub head_offset: Option<u64>,
    /// Highest `turn_number` appended so far.
    pub last_turn: Option<u64>,
}

impl Anchor {
    fn to_bytes(&self, kind: LedgerKind, session: &SessionId) -> Result<Vec<u8>> {
        canonical::to_vec(&json!({
            "ledger": kind.as_str(),
            "session_id": session.as_str(),
            "seq": self.seq,
            "entry_hash": self.entry_hash,
            "len": self.len,
            "head_offset": self.head_offset,
            "last_turn": self.last_turn,
        }))
        .map_err(|e| SupervisorError::invalid("anchor", e.to_string()))
    }

    fn parse(bytes: &[u8], kind: LedgerKind, session: &SessionId) -> Result<Self, String> {
        let v = canonical::parse_canonical(bytes).map_err(|e| e.to_string())?;
        let field = |k: &str| v.get(k).ok_or_else(|| format!("missing `{k}`"));
        if field("ledger")?.as_str() != Some(kind.as_str())
            || field("session_id")?.as_str() != Some(session.as_str())
        {
            return Err("belongs to another ledger or session".into());
        }
        Ok(Self {
            seq: field("seq")?.as_u64().ok_or("`seq` is not an integer")?,
            entry_hash: field("entry_hash")?
                .as_str()
                .ok_or("`entry_hash` is not a string")?
                .to_owned(),
            len: field("len")?.as_u64().ok_or("`len` is not an integer")?,
            head_offset: v.get("head_offset").and_then(Value::as_u64),
            last_turn: v.get("last_turn").and_then(Value::as_u64),
        })
    }
}

/// Where one ledger and its anchor live.
#[derive(Debug, Clone)]
pub struct LedgerFiles {
    pub kind: LedgerKind,
    pub session: SessionId,
    pub path: PathBuf,
    pub anchor: PathBuf,
}

/// One acknowledged append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    pub entry_hash: String,
}

/// What a successful verification saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub kind: LedgerKind,
    pub path: PathBuf,
    pub entries: u64,
    pub legacy_entries: u64,
    pub bytes: u64,
    pub head_hash: String,
    /// The highest `turn_number` of any entry (0 when there is none).
    pub last_turn: u64,
    pub warnings: Vec<String>,
}

impl LedgerFiles {
    fn integrity(&self, line: Option<u64>, seq: Option<u64>, problem: Problem) -> SupervisorError {
        SupervisorError::Integrity(IntegrityError {
            ledger: self.path.clone(),
            line,
            seq,
            problem,
        })
    }

    fn io(&self, op: &'static str) -> impl FnOnce(std::io::Error) -> SupervisorError + '_ {
        move |source| SupervisorError::LedgerIo {
            op,
            path: self.path.clone(),
            source,
        }
    }

    fn read_anchor(&self) -> Result<Option<Anchor>> {
        match fsx::read_small(&self.anchor, MAX_ANCHOR_BYTES) {
            Ok(bytes) => Anchor::parse(&bytes, self.kind, &self.session)
                .map(Some)
                .map_err(|why| self.integrity(None, None, Problem::AnchorInvalid(why))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(SupervisorError::StateIo {
                op: "read anchor",
                path: self.anchor.clone(),
                source: e,
            }),
        }
    }

    fn write_anchor(&self, anchor: &Anchor) -> Result<()> {
        fsx::write_atomic(&self.anchor, &anchor.to_bytes(self.kind, &self.session)?)
    }

    /// Creates the empty ledger file (it must not exist) and its anchor.
    pub(crate) fn create(&self, _lock: &SessionLock) -> Result<()> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(fsx::libc_flags(OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC))
            .open(&self.path)
            .and_then(|f| f.sync_all())
            .map_err(self.io("create"))?;
        self.write_anchor(&Anchor {
            seq: 0,
            entry_hash: genesis_hash(self.kind, &self.session),
            len: 0,
            head_offset: Some(0),
            last_turn: Some(0),
        })
    }

    /// Appends one entry. `body` is the entry's content; the ledger adds
    /// `seq`, `previous_hash` and `entry_hash`. Returns once the entry and
    /// the moved anchor are durable.
    pub fn append(&self, _lock: &SessionLock, mut body: Map<String, Value>) -> Result<Appended> {
        if let Some(k) = RESERVED_FIELDS.iter().find(|k| body.contains_key(**k)) {
            return Err(SupervisorError::invalid(
                "entry",
                format!("`{k}` is set by the ledger, not the caller"),
            ));
        }
        let anchor = self
            .read_anchor()?
            .ok_or_else(|| self.integrity(None, None, Problem::AnchorMissing))?;
        let mut file = match OpenOptions::new()
            .append(true)
            .custom_flags(fsx::libc_flags(OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC))
            .open(&self.path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(self.integrity(
                    None,
                    None,
                    Problem::FileMissing {
                        acknowledged: anchor.seq,
                    },
                ));
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                return Err(self.integrity(None, None, Problem::NotRegularFile));
            }
            Err(e) => return Err(self.io("open for append")(e)),
        };
        let meta = file.metadata().map_err(self.io("stat"))?;
        if !meta.is_file() {
            return Err(self.integrity(None, None, Problem::NotRegularFile));
        }
        if meta.len() != anchor.len {
            // Refuse to extend a ledger that changed since the last
            // acknowledged append: appending would bless the change.
            return Err(self.integrity(
                None,
                None,
                Problem::SizeMismatch {
                    acknowledged: anchor.len,
                    found: meta.len(),
                },
            ));
        }

        // The head entry must still be the one acknowledged: re-hash it
        // (O(1); full verification stays on every read).
        if anchor.seq > 0 {
            self.check_head(&file, &anchor)?;
        }
        let turn = body.get("turn_number").and_then(Value::as_u64);
        let seq = anchor.seq + 1;
        body.insert("seq".into(), json!(seq));
        body.insert("previous_hash".into(), json!(anchor.entry_hash));
        let value = Value::Object(body);
        let entry_hash = canonical::hash_value(&value).map_err(|e| canon_err("entry", e))?;
        let Value::Object(mut body) = value else {
            unreachable!("constructed as an object above")
        };
        body.insert("entry_hash".into(), json!(entry_hash));
        let mut line =
            canonical::to_vec(&Value::Object(body)).map_err(|e| canon_err("entry", e))?;
        line.push(b'\n');

        if let Err(e) = file.write_all(&line).and_then(|()| file.sync_data()) {
            // Leave the file as it was acknowledged; a torn line would make
            // every later append refuse.
            let _ = file.set_len(anchor.len);
            let _ = file.sync_data();
            return Err(self.io("append")(e));
        }
        self.write_anchor(&Anchor {
            seq,
            entry_hash: entry_hash.clone(),
            len: anchor.len + line.len() as u64,
            head_offset: Some(anchor.len),
            last_turn: match (anchor.last_turn, turn) {
                (Some(a), Some(t)) => Some(a.max(t)),
                (a, None) => a,
                (None, Some(_)) => None,
            },
        })?;
        Ok(Appended { seq, entry_hash })
    }

    /// Re-hashes the head entry (from the anchor's offset to the end) and
    /// compares it with the anchor.
    fn check_head(&self, file: &std::fs::File, anchor: &Anchor) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let Some(offset) = anchor.head_offset else {
            return self.verify().map(|_| ());
        };
        let len = usize::try_from(anchor.len.saturating_sub(offset)).unwrap_or(usize::MAX);
        if len == 0 || len > MAX_ENTRY_BYTES + 1 {
            return Err(self.integrity(
                None,
                Some(anchor.seq),
                Problem::AnchorInvalid("head offset out of range".into()),
            ));
        }
        // The file is opened O_APPEND|O_WRONLY; read the head through a
        // second, read-only descriptor.
        let _ = file;
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(fsx::libc_flags(OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC))
            .open(&self.path)
            .map_err(self.io("open for reading"))?;
        let mut buf = vec![0u8; len];
        reader
            .read_exact_at(&mut buf, offset)
            .map_err(self.io("read head entry"))?;
        let hashed = buf
            .strip_suffix(b"\n")
            .and_then(|line| canonical::parse_canonical(line).ok())
            .and_then(|v| match v {
                Value::Object(mut m) => {
                    let recorded = m.remove("entry_hash")?;
                    let computed = canonical::hash_value(&Value::Object(m)).ok()?;
                    (recorded.as_str() == Some(computed.as_str())).then_some(computed)
                }
                _ => None,
            });
        match hashed {
            Some(h) if h == anchor.entry_hash => Ok(()),
            _ => Err(self.integrity(
                None,
                Some(anchor.seq),
                Problem::AnchorHashMismatch {
                    acknowledged: anchor.entry_hash.clone(),
                    found: "a changed head entry".into(),
                },
            )),
        }
    }

    /// The highest turn number appended, from the anchor (O(1)); `None`
    /// when the anchor predates that record.
    pub fn last_turn(&self) -> Result<Option<u64>> {
        Ok(self.read_anchor()?.and_then(|a| a.last_turn))
    }

    /// Verifies every entry and the head against the anchor.
    pub fn verify(&self) -> Result<VerifyReport> {
        let anchor = self.read_anchor()?;
        let content = match fsx::read_small(&self.path, u64::MAX / 2) {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(self.integrity(
                    None,
                    None,
                    Problem::FileMissing {
                        acknowledged: anchor.map_or(0, |a| a.seq),
                    },
                ));
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                return Err(self.integrity(None, None, Problem::NotRegularFile));
            }
            Err(e) => return Err(self.io("read")(e)),
        };
        let anchor = anchor.ok_or_else(|| self.integrity(None, None, Problem::AnchorMissing))?;

        let genesis = genesis_hash(self.kind, &self.session);
        let mut expected_prev = genesis.clone();
        let mut head_seq = 0u64;
        let mut legacy = 0u64;
        let mut last_turn = 0u64;
        let mut warnings = Vec::new();

        let complete_len = content
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let mut line_no = 0u64;
        for piece in content[..complete_len].split_inclusive(|&b| b == b'\n') {
            line_no += 1;
            let raw = &piece[..piece.len() - 1];
            let at = |problem| self.integrity(Some(line_no), None, problem);
            if raw.is_empty() {
                return Err(at(Problem::EmptyLine));
            }
            if raw.len() > MAX_ENTRY_BYTES {
                return Err(at(Problem::Malformed(format!(
                    "line longer than {MAX_ENTRY_BYTES} bytes"
                ))));
            }
            let value = match canonical::parse_strict(raw) {
                Ok(v) => v,
                Err(e) => return Err(at(Problem::Malformed(e.to_string()))),
            };
            let Value::Object(mut map) = value else {
                return Err(at(Problem::NotObject));
            };
            let seq_field = map.get("seq").and_then(Value::as_u64);
            let at_seq = |problem| self.integrity(Some(line_no), seq_field, problem);
            match canonical::to_vec(&Value::Object(map.clone())) {
                Ok(bytes) if bytes == raw => {}
                _ => return Err(at_seq(Problem::NotCanonical)),
            }
            if let Some(t) = map.get("turn_number").and_then(Value::as_u64) {
                last_turn = last_turn.max(t);
            }

            let Some(recorded) = map.remove("entry_hash") else {
                if head_seq > 0 {
                    return Err(at_seq(Problem::LegacyAfterHashed));
                }
                legacy += 1;
                let w = format!(
                    "ledger {}: line {line_no}: legacy entry without hashes; its content cannot be verified",
                    self.path.display()
                );
                tracing::warn!("{w}");
                warnings.push(w);
                continue;
            };
            let Some(recorded) = recorded.as_str().map(str::to_owned) else {
                return Err(at_seq(Problem::MissingField("entry_hash")));
            };
            match map.get("seq") {
                Some(Value::Number(n)) if n.as_u64() == Some(line_no) => {}
                Some(other) => {
                    return Err(at_seq(Problem::SeqMismatch {
                        found: other.to_string(),
                    }));
                }
                None => return Err(at_seq(Problem::MissingField("seq"))),
            }
            match map.get("session_id").and_then(Value::as_str) {
                Some(s) if s == self.session.as_str() => {}
                Some(s) => {
                    return Err(at_seq(Problem::WrongSession {
                        found: s.to_owned(),
                    }));
                }
                None => return Err(at_seq(Problem::MissingField("session_id"))),
            }
            match map.get("previous_hash").and_then(Value::as_str) {
                Some(p) if p == expected_prev => {}
                Some(p) => {
                    return Err(at_seq(Problem::BrokenLink {
                        expected: expected_prev,
                        found: p.to_owned(),
                    }));
                }
                None => return Err(at_seq(Problem::MissingField("previous_hash"))),
            }
            let computed = canonical::hash_value(&Value::Object(map))
                .map_err(|e| at_seq(Problem::Malformed(e.to_string())))?;
            if computed != recorded {
                return Err(at_seq(Problem::HashMismatch { recorded, computed }));
            }
            expected_prev = recorded;
            head_seq = line_no;
        }
        if complete_len < content.len() {
            return Err(self.integrity(Some(line_no + 1), None, Problem::TornLine));
        }

        if head_seq < anchor.seq {
            return Err(self.integrity(
                None,
                None,
                Problem::Truncated {
                    acknowledged: anchor.seq,
                    found: head_seq,
                },
            ));
        }
        if head_seq > anchor.seq {
            return Err(self.integrity(
                None,
                Some(anchor.seq + 1),
                Problem::BeyondAnchor {
                    acknowledged: anchor.seq,
                    found: head_seq,
                },
            ));
        }
        if expected_prev != anchor.entry_hash {
            return Err(self.integrity(
                None,
                Some(head_seq),
                Problem::AnchorHashMismatch {
                    acknowledged: anchor.entry_hash,
                    found: expected_prev,
                },
            ));
        }
        if content.len() as u64 != anchor.len {
            return Err(self.integrity(
                None,
                None,
                Problem::SizeMismatch {
                    acknowledged: anchor.len,
                    found: content.len() as u64,
                },
            ));
        }
        Ok(VerifyReport {
            kind: self.kind,
            path: self.path.clone(),
            entries: head_seq,
            legacy_entries: legacy,
            bytes: content.len() as u64,
            head_hash: expected_prev,
            last_turn,
            warnings,
        })
    }
}

fn canon_err(field: &str, e: CanonicalError) -> SupervisorError {
    SupervisorError::invalid(field, e.to_string())
}
