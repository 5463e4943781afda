//! Signed checkpoints of a session's ledgers (issue 30): an RFC 6962 Merkle
//! tree over the entries of both ledgers, its head written as a C2SP
//! tlog-checkpoint inside a C2SP signed note, inclusion and consistency
//! proofs, witness cosignatures, and the check of a ledger against a
//! checkpoint handed out earlier.
//!
//! The hash chain and the anchors (see [`crate::store::ledger`]) catch an
//! edit made by someone without the state directory; a checkpoint signed
//! with a key the writer does not hold catches one made by someone with it:
//! rewriting an entry and recomputing every hash and anchor still changes
//! the Merkle root the checkpoint signed.
//!
//! **Leaves.** One leaf per ledger line: the line's bytes (the entry's
//! canonical JSON, without the newline), hashed as RFC 6962 leaves
//! (`SHA-256(0x00 || line)`, nodes `SHA-256(0x01 || left || right)`; the
//! hashing and proofs are `tlog_tiles`, a port of Go's `sumdb/tlog`).
//!
//! **Leaf order** (append order, reconstructed from the files): each entry
//! belongs to a *block* — its `turn_number`, or, for an entry without one,
//! the block of the entry before it in its ledger (0 at the start). Leaves
//! are ordered by (block, exec before evidence, seq). This is the order the
//! supervisor appends in (a turn's exec intent, then its exec and evidence
//! finish entries), so a later tree extends an earlier one and consistency
//! proofs between checkpoints hold. A checkpoint also records how many
//! entries of each ledger it covers, so checking a ledger against it never
//! depends on that order being append-stable: the covered prefixes are
//! re-read and re-ordered by the same rule.
//!
//! **Checkpoint body** (c2sp.org/tlog-checkpoint): origin
//! `turnstile/<session id>`, tree size, base64 root, then two extension
//! lines: `turnstile-ledgers exec <n> evidence <m>` and
//! `turnstile-leaves <base64>` — the first 8 bytes of every leaf hash, in
//! leaf order, so a verifier can name the first entry that differs (omitted
//! above [`MAX_DIGESTED_LEAVES`] leaves).
//!
//! This module never writes a ledger; it reads ledger files as bytes and
//! needs no state directory (an auditor's copy of the files suffices).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use signed_note::{Note, NoteError, Signer as _, StandardSigner, StandardVerifier, Verifier as _};
/// A tree or leaf hash (RFC 6962, SHA-256).
pub use tlog_tiles::Hash;
use tlog_tiles::{Checkpoint, HashReader};
use turnstile_policy::SessionId;

use crate::error::{Result, SupervisorError};
use crate::store::ledger::LedgerKind;
use crate::store::session::Session;

/// Above this many leaves a checkpoint carries no per-leaf digests (a
/// signed note is at most 1 MB).
pub const MAX_DIGESTED_LEAVES: usize = 60_000;
/// Bytes of each leaf hash kept in `turnstile-leaves`.
const DIGEST_BYTES: usize = 8;
const EXT_LEDGERS: &str = "turnstile-ledgers";
const EXT_LEAVES: &str = "turnstile-leaves";

/// The checkpoint origin of a session.
pub fn origin(session: &SessionId) -> String {
    format!("turnstile/{session}")
}

// ---------------------------------------------------------------- leaves

/// One ledger line as a leaf of the session's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    pub kind: LedgerKind,
    /// 1-based line number in its ledger (the entry's `seq`).
    pub seq: u64,
    pub line: Vec<u8>,
}

impl Leaf {
    pub fn hash(&self) -> Hash {
        tlog_tiles::record_hash(&self.line)
    }

    /// `exec.jsonl seq 3`.
    pub fn name(&self) -> String {
        format!("{} seq {}", self.kind.file_name(), self.seq)
    }
}

/// The only field the leaf order reads.
#[derive(serde::Deserialize)]
struct TurnOf {
    #[serde(default)]
    turn_number: Option<u64>,
}

/// The complete lines of a ledger file (a torn last line is not an entry).
pub fn read_lines(path: &Path) -> Result<Vec<Vec<u8>>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(source) => {
            return Err(SupervisorError::LedgerIo {
                op: "read",
                path: path.to_path_buf(),
                source,
            });
        }
    };
    Ok(bytes
        .split_inclusive(|b| *b == b'\n')
        .filter_map(|l| l.strip_suffix(b"\n"))
        .map(<[u8]>::to_vec)
        .collect())
}

/// Orders the two ledgers' lines into leaves (see the module docs).
pub fn leaves(exec: &[Vec<u8>], evidence: &[Vec<u8>]) -> Vec<Leaf> {
    let mut keyed = Vec::with_capacity(exec.len() + evidence.len());
    for (rank, kind, lines) in [
        (0u8, LedgerKind::Exec, exec),
        (1, LedgerKind::Evidence, evidence),
    ] {
        let mut block = 0u64;
        for (i, line) in lines.iter().enumerate() {
            if let Some(t) = serde_json::from_slice::<TurnOf>(line)
                .ok()
                .and_then(|t| t.turn_number)
            {
                block = t;
            }
            let seq = i as u64 + 1;
            keyed.push((
                (block, rank, seq),
                Leaf {
                    kind,
                    seq,
                    line: line.clone(),
                },
            ));
        }
    }
    keyed.sort_by_key(|(k, _)| *k);
    keyed.into_iter().map(|(_, l)| l).collect()
}

/// The leaves of a session's ledger files, or of their first `counts`
/// entries.
pub fn session_leaves(
    exec_path: &Path,
    evidence_path: &Path,
    counts: Option<(u64, u64)>,
) -> Result<(Vec<Leaf>, (u64, u64))> {
    let mut exec = read_lines(exec_path)?;
    let mut evidence = read_lines(evidence_path)?;
    let found = (exec.len() as u64, evidence.len() as u64);
    if let Some((e, v)) = counts {
        exec.truncate(e as usize);
        evidence.truncate(v as usize);
    }
    Ok((leaves(&exec, &evidence), found))
}

// ---------------------------------------------------------------- tree

/// An RFC 6962 tree held in memory: the stored hashes of `tlog_tiles`'s
/// layout (every complete subtree's hash).
#[derive(Debug, Clone, Default)]
pub struct Tree {
    stored: Vec<Hash>,
    size: u64,
}

impl HashReader for Tree {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog_tiles::Error> {
        indexes
            .iter()
            .map(|&i| {
                usize::try_from(i)
                    .ok()
                    .and_then(|i| self.stored.get(i))
                    .copied()
                    .ok_or(tlog_tiles::Error::InvalidProof)
            })
            .collect()
    }
}

impl Tree {
    pub fn new(leaf_hashes: impl IntoIterator<Item = Hash>) -> Self {
        let mut t = Self::default();
        for h in leaf_hashes {
            t.push(h);
        }
        t
    }

    pub fn of(leaves: &[Leaf]) -> Self {
        Self::new(leaves.iter().map(Leaf::hash))
    }

    pub fn push(&mut self, leaf_hash: Hash) {
        // The reader holds every hash stored so far: cannot fail.
        if let Ok(h) = tlog_tiles::stored_hashes_for_record_hash(self.size, leaf_hash, self) {
            self.stored.extend(h);
            self.size += 1;
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The root of the first `n` leaves (`n <= size`).
    pub fn root_at(&self, n: u64) -> Result<Hash> {
        self.check_size(n)?;
        tlog_tiles::tree_hash(n, self).map_err(proof_err)
    }

    pub fn root(&self) -> Hash {
        self.root_at(self.size).unwrap_or(tlog_tiles::EMPTY_HASH)
    }

    /// Proof that leaf `index` is in the tree of the first `n` leaves.
    pub fn prove_inclusion(&self, index: u64, n: u64) -> Result<Vec<Hash>> {
        self.check_size(n)?;
        if index >= n {
            return Err(SupervisorError::invalid(
                "--inclusion",
                format!("leaf {index} is not in a tree of {n} leaves (leaves count from 0)"),
            ));
        }
        tlog_tiles::prove_record(n, index, self).map_err(proof_err)
    }

    /// Proof that the tree of the first `old` leaves is a prefix of the one
    /// of the first `n`.
    pub fn prove_consistency(&self, old: u64, n: u64) -> Result<Vec<Hash>> {
        self.check_size(n)?;
        if old > n {
            return Err(SupervisorError::invalid(
                "--consistency",
                format!("an old size of {old} is larger than the tree ({n} leaves)"),
            ));
        }
        tlog_tiles::prove_tree(n, old, self).map_err(proof_err)
    }

    fn check_size(&self, n: u64) -> Result<()> {
        if n > self.size {
            return Err(SupervisorError::invalid(
                "size",
                format!("the ledgers hold {} entries, not {n}", self.size),
            ));
        }
        Ok(())
    }
}

fn proof_err(e: tlog_tiles::Error) -> SupervisorError {
    SupervisorError::invalid("proof", e.to_string())
}

/// Checks an inclusion proof: leaf `leaf` at `index` in the tree of `size`
/// leaves with root `root`.
pub fn check_inclusion(proof: &[Hash], size: u64, root: Hash, index: u64, leaf: Hash) -> bool {
    tlog_tiles::check_record(&proof.to_vec(), size, root, index, leaf).is_ok()
}

/// Checks a consistency proof between two tree heads.
pub fn check_consistency(proof: &[Hash], size: u64, root: Hash, old: u64, old_root: Hash) -> bool {
    tlog_tiles::check_tree(&proof.to_vec(), size, root, old, old_root).is_ok()
}

pub fn hash_b64(h: &Hash) -> String {
    B64.encode(h.0)
}

pub fn parse_hash_b64(s: &str) -> Option<Hash> {
    let bytes = B64.decode(s.trim()).ok()?;
    Some(Hash(bytes.try_into().ok()?))
}

// ---------------------------------------------------------------- checkpoints

/// A checkpoint's content, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
    /// Entries of exec and evidence covered.
    pub counts: (u64, u64),
    /// The first [`DIGEST_BYTES`] of each leaf hash, in leaf order.
    pub digests: Option<Vec<[u8; DIGEST_BYTES]>>,
}

impl Head {
    /// The head of `leaves` (all of them), which hold `counts` entries.
    pub fn of(session: &SessionId, leaves: &[Leaf], counts: (u64, u64)) -> Self {
        let tree = Tree::of(leaves);
        let digests = (leaves.len() <= MAX_DIGESTED_LEAVES).then(|| {
            leaves
                .iter()
                .map(|l| {
                    let mut d = [0u8; DIGEST_BYTES];
                    d.copy_from_slice(&l.hash().0[..DIGEST_BYTES]);
                    d
                })
                .collect()
        });
        Self {
            origin: origin(session),
            size: tree.size(),
            root: tree.root(),
            counts,
            digests,
        }
    }

    /// The note text (the checkpoint body).
    pub fn to_text(&self) -> Result<Vec<u8>> {
        let mut ext = format!(
            "{EXT_LEDGERS} exec {} evidence {}\n",
            self.counts.0, self.counts.1
        );
        if let Some(d) = &self.digests {
            ext += &format!("{EXT_LEAVES} {}\n", B64.encode(d.concat()));
        }
        Checkpoint::new(&self.origin, self.size, self.root, &ext)
            .map(|c| c.to_bytes())
            .map_err(|e| SupervisorError::invalid("checkpoint", e.to_string()))
    }

    /// Parses a checkpoint body; `Err` says what is wrong.
    pub fn parse(text: &[u8]) -> Result<Self, String> {
        let c = Checkpoint::from_bytes(text).map_err(|e| e.to_string())?;
        let mut counts = None;
        let mut digests = None;
        for line in c.extension().lines() {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                [EXT_LEDGERS, "exec", e, "evidence", v] => {
                    let n = |s: &str| s.parse::<u64>().map_err(|_| format!("bad count `{s}`"));
                    counts = Some((n(e)?, n(v)?));
                }
                [EXT_LEAVES, b64] => {
                    let raw = B64.decode(b64).map_err(|e| format!("{EXT_LEAVES}: {e}"))?;
                    if raw.len() % DIGEST_BYTES != 0 {
                        return Err(format!("{EXT_LEAVES}: not whole digests"));
                    }
                    digests = Some(
                        raw.chunks(DIGEST_BYTES)
                            .map(|c| {
                                let mut d = [0u8; DIGEST_BYTES];
                                d.copy_from_slice(c);
                                d
                            })
                            .collect::<Vec<_>>(),
                    );
                }
                _ => {} // other extensions are not ours to judge
            }
        }
        let counts = counts.ok_or(format!("no `{EXT_LEDGERS}` line"))?;
        if counts.0.checked_add(counts.1) != Some(c.size()) {
            return Err(format!(
                "tree size {} is not exec {} + evidence {}",
                c.size(),
                counts.0,
                counts.1
            ));
        }
        if digests
            .as_ref()
            .is_some_and(|d: &Vec<_>| d.len() as u64 != c.size())
        {
            return Err(format!("{EXT_LEAVES}: not one digest per leaf"));
        }
        Ok(Self {
            origin: c.origin().to_owned(),
            size: c.size(),
            root: *c.hash(),
            counts,
            digests,
        })
    }
}

/// Where `supervise ledger checkpoint` keeps a session's checkpoints:
/// `planes/<tier>/sessions/<sid>/transparency/`, beside the ledgers, so a
/// copy of the session directory carries them.
pub fn checkpoint_dir(ledger_dir: &Path) -> PathBuf {
    ledger_dir
        .parent()
        .unwrap_or(ledger_dir)
        .join("transparency")
}

/// The file name of the checkpoint of a tree of `size` leaves.
pub fn checkpoint_file_name(size: u64) -> String {
    format!("checkpoint-{size:08}.note")
}

/// A checkpoint just taken.
#[derive(Debug)]
pub struct Taken {
    pub head: Head,
    pub note: Vec<u8>,
    /// Where it is kept (the session's `transparency/`).
    pub path: PathBuf,
    /// Its copies in the witnesses' inboxes.
    pub witness_copies: Vec<PathBuf>,
}

/// Signs a checkpoint of `session` as it is now, keeps it under the
/// session's `transparency/` directory and copies it into each witness
/// inbox. The ledgers are verified first: a checkpoint never blesses a
/// broken chain. The caller holds the session's lock.
pub fn take(session: &Session, key: &SigningKeyFile, witnesses: &[PathBuf]) -> Result<Taken> {
    session.verify()?;
    let (leaves, counts) = session_leaves(
        &session.ledger(LedgerKind::Exec).path,
        &session.ledger(LedgerKind::Evidence).path,
        None,
    )?;
    let head = Head::of(&session.id, &leaves, counts);
    let note = sign(&head, key)?;
    let dir = checkpoint_dir(&session.workspace().ledger_dir(&session.tier, &session.id));
    crate::fsx::create_dir_all(&dir)?;
    let path = dir.join(checkpoint_file_name(head.size));
    crate::fsx::write_atomic(&path, &note)?;
    let mut witness_copies = Vec::new();
    for inbox in witnesses {
        crate::fsx::create_dir_all(inbox)?;
        let copy = inbox.join(format!(
            "{}-{}",
            session.id,
            checkpoint_file_name(head.size)
        ));
        crate::fsx::write_atomic(&copy, &note)?;
        witness_copies.push(copy);
    }
    Ok(Taken {
        head,
        note,
        path,
        witness_copies,
    })
}

/// A checkpoint's head, read from its bytes without checking any
/// signature (the note syntax and the turnstile body are checked).
pub fn read_unverified(path: &Path, bytes: &[u8]) -> Result<Head> {
    let note = parse_note(path, bytes)?;
    Head::parse(note.text()).map_err(|d| malformed(path, d))
}

/// The newest checkpoint kept in `dir` (the largest tree): its path, its
/// bytes and its head, read without checking any signature (the caller
/// says so, or checks it with [`open`]). `None` when none is kept.
pub fn newest_kept(dir: &Path) -> Result<Option<(PathBuf, Vec<u8>, Head)>> {
    let names = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("checkpoint-") && n.ends_with(".note"))
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SupervisorError::StateIo {
                op: "list checkpoints",
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    // The names carry the size zero-padded: the greatest name is the newest.
    let Some(name) = names.into_iter().max() else {
        return Ok(None);
    };
    let path = dir.join(name);
    let bytes =
        crate::fsx::read_small(&path, 16 << 20).map_err(|source| SupervisorError::StateIo {
            op: "read checkpoint",
            path: path.clone(),
            source,
        })?;
    let head = read_unverified(&path, &bytes)?;
    Ok(Some((path, bytes, head)))
}

/// A new signed note holding `head`, signed by `key`.
pub fn sign(head: &Head, key: &SigningKeyFile) -> Result<Vec<u8>> {
    let text = head.to_text()?;
    let mut note =
        Note::new(&text, &[]).map_err(|e| SupervisorError::invalid("checkpoint", e.to_string()))?;
    note.add_sigs(&[&key.signer])
        .map_err(|e| SupervisorError::invalid("checkpoint", e.to_string()))?;
    Ok(note.to_bytes())
}

/// Adds `key`'s signature to a signed note (a witness cosigning it). The
/// existing signatures are kept; the body is not interpreted beyond being a
/// turnstile checkpoint.
pub fn cosign(path: &Path, note_bytes: &[u8], key: &SigningKeyFile) -> Result<Vec<u8>> {
    let mut note = parse_note(path, note_bytes)?;
    Head::parse(note.text()).map_err(|detail| malformed(path, detail))?;
    note.add_sigs(&[&key.signer])
        .map_err(|e| malformed(path, e.to_string()))?;
    Ok(note.to_bytes())
}

fn malformed(path: &Path, detail: impl Into<String>) -> SupervisorError {
    SupervisorError::CheckpointMalformed {
        checkpoint: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn parse_note(path: &Path, bytes: &[u8]) -> Result<Note> {
    Note::from_bytes(bytes).map_err(|e| {
        malformed(
            path,
            format!(
                "{e} (expected a c2sp.org/signed-note: body, a blank line, `— name sig` lines)"
            ),
        )
    })
}

/// The keys a checkpoint must be signed with.
#[derive(Debug)]
pub struct Trust<'a> {
    pub supervisor: &'a VerifierKeyFile,
    pub witnesses: &'a [VerifierKeyFile],
    pub witnesses_required: usize,
}

/// A checkpoint whose signatures satisfied the trust.
#[derive(Debug, Clone)]
pub struct Opened {
    pub head: Head,
    /// The witnesses whose signatures verified, by key name.
    pub witnessed_by: Vec<String>,
}

/// Parses and authenticates a checkpoint note: the supervisor's signature
/// and `witnesses_required` distinct witnesses' must verify.
pub fn open(path: &Path, bytes: &[u8], trust: &Trust<'_>) -> Result<Opened> {
    let note = parse_note(path, bytes)?;
    let head = Head::parse(note.text()).map_err(|d| malformed(path, d))?;
    let sig_err = |detail: String| SupervisorError::CheckpointSignature {
        checkpoint: path.to_path_buf(),
        detail,
    };
    let mut list: Vec<Box<dyn signed_note::Verifier>> =
        vec![Box::new(trust.supervisor.verifier.clone())];
    list.extend(
        trust
            .witnesses
            .iter()
            .map(|w| Box::new(w.verifier.clone()) as Box<dyn signed_note::Verifier>),
    );
    let known = signed_note::VerifierList::new(list);
    let (verified, unverified) = note.verify(&known).map_err(|e| match e {
        NoteError::UnverifiedNote => sig_err(format!(
            "not signed by any key given (wanted {}); signed by: {}",
            trust.supervisor.describe(),
            signer_names(&note_signers(bytes))
        )),
        NoteError::InvalidSignature { name, id } => sig_err(format!(
            "the signature of {name}+{id:08x} does not verify: the checkpoint was changed after it was signed"
        )),
        other => sig_err(other.to_string()),
    })?;
    let sup = &trust.supervisor.verifier;
    if !verified
        .iter()
        .any(|s| s.name() == sup.name() && s.id() == sup.key_id())
    {
        return Err(sig_err(format!(
            "not signed by the supervisor key {} (verified: {}; unknown: {})",
            trust.supervisor.describe(),
            signer_names(
                &verified
                    .iter()
                    .map(|s| s.name().to_owned())
                    .collect::<Vec<_>>()
            ),
            signer_names(
                &unverified
                    .iter()
                    .map(|s| s.name().to_owned())
                    .collect::<Vec<_>>()
            ),
        )));
    }
    let witnessed_by: Vec<String> = verified
        .iter()
        .filter(|s| !(s.name() == sup.name() && s.id() == sup.key_id()))
        .map(|s| s.name().to_owned())
        .collect();
    if witnessed_by.len() < trust.witnesses_required {
        return Err(sig_err(format!(
            "{} of the {} witness key(s) given signed it ({}); {} required",
            witnessed_by.len(),
            trust.witnesses.len(),
            signer_names(&witnessed_by),
            trust.witnesses_required
        )));
    }
    Ok(Opened { head, witnessed_by })
}

fn signer_names(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// The key names on a note's signature lines (for messages).
fn note_signers(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| l.strip_prefix("— "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect()
}

/// What checking ledgers against a checkpoint found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub covered: u64,
    /// Leaves in the ledgers now.
    pub size: u64,
    /// The RFC 6962 consistency proof from the checkpoint's tree to today's
    /// checked (`false` when today's order does not extend it — see the
    /// module docs).
    pub consistent: bool,
}

/// Checks the ledger files against an authenticated checkpoint head: the
/// entries it covers must be byte for byte those it signed.
pub fn check_against(
    checkpoint: &Path,
    head: &Head,
    session: &SessionId,
    exec_path: &Path,
    evidence_path: &Path,
) -> Result<Checked> {
    let mismatch = |detail: String| SupervisorError::CheckpointMismatch {
        checkpoint: checkpoint.to_path_buf(),
        detail,
    };
    if head.origin != origin(session) {
        return Err(mismatch(format!(
            "it is the checkpoint of `{}`, not of session {session}",
            head.origin
        )));
    }
    let (covered, found) = session_leaves(exec_path, evidence_path, Some(head.counts))?;
    for (kind, want, have, path) in [
        (LedgerKind::Exec, head.counts.0, found.0, exec_path),
        (LedgerKind::Evidence, head.counts.1, found.1, evidence_path),
    ] {
        if have < want {
            return Err(mismatch(format!(
                "{} holds {have} entries but the checkpoint covers {want}: truncated, first missing entry {} seq {}",
                path.display(),
                kind.file_name(),
                have + 1
            )));
        }
    }
    let tree = Tree::of(&covered);
    if tree.root() != head.root {
        let first = head.digests.as_ref().and_then(|d| {
            covered
                .iter()
                .zip(d)
                .find(|(l, d)| l.hash().0[..DIGEST_BYTES] != d[..])
                .map(|(l, _)| l)
        });
        return Err(mismatch(match first {
            Some(l) => format!(
                "first entry that differs from the signed checkpoint: {} (line {}); the ledgers were rewritten after the checkpoint of {} entries",
                l.name(),
                l.seq,
                head.size
            ),
            None => format!(
                "the {} entries it covers hash to a different root (it carries no per-entry digests to name the first that differs)",
                head.size
            ),
        }));
    }
    let (all, _) = session_leaves(exec_path, evidence_path, None)?;
    let now = Tree::of(&all);
    let consistent = now
        .prove_consistency(head.size, now.size())
        .is_ok_and(|p| check_consistency(&p, now.size(), now.root(), head.size, head.root));
    Ok(Checked {
        covered: head.size,
        size: now.size(),
        consistent,
    })
}

// ---------------------------------------------------------------- keys

/// A private signing key file: the signed-note encoding
/// (`PRIVATE+KEY+<name>+<id>+<base64>`, as Go's `note.GenerateKey`).
pub struct SigningKeyFile {
    pub path: PathBuf,
    pub signer: StandardSigner,
    /// The same key, for DSSE envelopes.
    pub ed25519: ed25519_dalek::SigningKey,
}

impl std::fmt::Debug for SigningKeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKeyFile")
            .field("path", &self.path)
            .field("name", &self.signer.name())
            .finish_non_exhaustive()
    }
}

/// A verifier key file (`<name>+<id>+<base64>`).
#[derive(Clone)]
pub struct VerifierKeyFile {
    pub path: PathBuf,
    pub encoded: String,
    pub verifier: StandardVerifier,
}

impl std::fmt::Debug for VerifierKeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerifierKeyFile({})", self.encoded)
    }
}

impl VerifierKeyFile {
    /// `name+id (path)`.
    pub fn describe(&self) -> String {
        format!(
            "{}+{:08x} ({})",
            self.verifier.name(),
            self.verifier.key_id(),
            self.path.display()
        )
    }
}

const ALG_ED25519: u8 = 1;

fn key_err(path: &Path, detail: impl Into<String>) -> SupervisorError {
    SupervisorError::KeyInvalid {
        path: path.to_path_buf(),
        detail: detail.into(),
        source: None,
    }
}

fn key_io(path: &Path, what: &str, source: std::io::Error) -> SupervisorError {
    SupervisorError::KeyInvalid {
        path: path.to_path_buf(),
        detail: what.to_owned(),
        source: Some(source),
    }
}

/// The public half's path: `PATH.pub`.
pub fn pub_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".pub");
    PathBuf::from(s)
}

/// A key name from a file name: what signed notes allow (no spaces, no
/// `+`).
pub fn default_key_name(path: &Path) -> String {
    let stem = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name: String = stem
        .chars()
        .map(|c| {
            if c.is_whitespace() || c == '+' {
                '-'
            } else {
                c
            }
        })
        .collect();
    if name.is_empty() {
        "turnstile".into()
    } else {
        name
    }
}

/// What `key generate` wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Generated {
    pub private_key: PathBuf,
    pub public_key: PathBuf,
    /// The public key as SPKI PEM, for DSSE/in-toto tools.
    pub public_key_pem: PathBuf,
    pub verifier_key: String,
}

/// Generates an Ed25519 key named `name`: `path` (0600, the signer key),
/// `path.pub` (the signed-note verifier key) and `path.pub.pem`. Refuses
/// to overwrite any of them.
pub fn generate(path: &Path, name: &str) -> Result<Generated> {
    if !signed_note::is_key_name_valid(name) {
        return Err(SupervisorError::invalid(
            "--name",
            format!("`{name}` is not a key name (no spaces or `+`)"),
        ));
    }
    let public = pub_path(path);
    let mut pem_path = public.as_os_str().to_owned();
    pem_path.push(".pem");
    let pem_path = PathBuf::from(pem_path);
    for p in [path, &public, &pem_path] {
        if p.symlink_metadata().is_ok() {
            return Err(key_err(p, "exists; refusing to overwrite a key"));
        }
    }
    // From the injected randomness (ids::OsRandom), as every random value
    // of the supervisor: 4 × 64 bits of the OS CSPRNG.
    let mut seed = [0u8; 32];
    let random = crate::ids::OsRandom;
    for chunk in seed.chunks_mut(8) {
        let n = turnstile_policy::session::RandomSource::next_u64(&random)
            .map_err(|e| key_err(path, format!("no randomness: {e}")))?;
        chunk.copy_from_slice(&n.to_le_bytes());
    }
    let sk = ed25519_dalek::SigningKey::from_bytes(&seed);
    let pubkey = [&[ALG_ED25519][..], sk.verifying_key().as_bytes()].concat();
    let skey = format!(
        "PRIVATE+KEY+{name}+{:08x}+{}\n",
        signed_note::key_id(name, &pubkey),
        B64.encode([&[ALG_ED25519][..], &seed[..]].concat())
    );
    let vkey = signed_note::new_ed25519_verifier_key(name, &sk.verifying_key());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::fsx::create_private_dir_all(dir)?;
    }
    write_new(path, skey.as_bytes(), 0o600)?;
    write_new(&public, format!("{vkey}\n").as_bytes(), 0o644)?;
    write_new(&pem_path, spki_pem(&sk.verifying_key()).as_bytes(), 0o644)?;
    Ok(Generated {
        private_key: path.to_path_buf(),
        public_key: public,
        public_key_pem: pem_path,
        verifier_key: vkey,
    })
}

/// The Ed25519 public key as a PEM `PUBLIC KEY` (RFC 8410 SPKI).
pub fn spki_pem(key: &ed25519_dalek::VerifyingKey) -> String {
    // SEQUENCE { SEQUENCE { OID 1.3.101.112 } BIT STRING { key } }
    const PREFIX: [u8; 12] = [
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    let der = [&PREFIX[..], key.as_bytes()].concat();
    format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        B64.encode(der)
    )
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| key_io(path, "cannot create", e))?;
    // The umask may have narrowed the mode; never widened it.
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| f.write_all(bytes))
        .and_then(|()| f.sync_all())
        .map_err(|e| key_io(path, "cannot write", e))
}

fn read_key_text(path: &Path) -> Result<String> {
    let bytes = crate::fsx::read_small(path, 4096).map_err(|e| key_io(path, "cannot read", e))?;
    String::from_utf8(bytes)
        .map(|s| s.trim().to_owned())
        .map_err(|_| key_err(path, "not UTF-8"))
}

/// Loads a private key. A key others can read is refused, as ssh does.
pub fn load_signing_key(path: &Path) -> Result<SigningKeyFile> {
    let meta = std::fs::metadata(path).map_err(|e| key_io(path, "cannot read", e))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(key_err(
            path,
            format!("private key is accessible to others (mode {mode:04o}); chmod 600 it"),
        ));
    }
    let text = read_key_text(path)?;
    let signer = StandardSigner::new(&text).map_err(|e| {
        key_err(
            path,
            format!("not a signed-note private key (PRIVATE+KEY+name+id+base64): {e}"),
        )
    })?;
    // PRIVATE+KEY+<name>+<id>+<base64>; base64 may itself hold `+`.
    let raw = text
        .splitn(5, '+')
        .nth(4)
        .and_then(|b| B64.decode(b).ok())
        .filter(|k| k.len() == 33 && k[0] == ALG_ED25519)
        .ok_or_else(|| key_err(path, "not an Ed25519 key"))?;
    let mut seed = [0u8; 32];
    seed.copy_from_slice(&raw[1..]);
    Ok(SigningKeyFile {
        path: path.to_path_buf(),
        signer,
        ed25519: ed25519_dalek::SigningKey::from_bytes(&seed),
    })
}

/// Loads a verifier key (`name+id+base64`, as written to `PATH.pub`).
pub fn load_verifier_key(path: &Path) -> Result<VerifierKeyFile> {
    let text = read_key_text(path)?;
    let verifier = StandardVerifier::new(&text).map_err(|e| {
        key_err(
            path,
            format!("not a signed-note verifier key (name+id+base64): {e}"),
        )
    })?;
    Ok(VerifierKeyFile {
        path: path.to_path_buf(),
        encoded: text,
        verifier,
    })
}

/// The raw Ed25519 public key of a verifier key file.
pub fn ed25519_of(key: &VerifierKeyFile) -> Result<ed25519_dalek::VerifyingKey> {
    let raw = key
        .encoded
        .splitn(3, '+')
        .nth(2)
        .and_then(|b| B64.decode(b).ok())
        .filter(|k| k.len() == 33 && k[0] == ALG_ED25519)
        .ok_or_else(|| key_err(&key.path, "not an Ed25519 key"))?;
    let mut bytes = [0u8; 32];
    bytes.copy_from_slice(&raw[1..]);
    ed25519_dalek::VerifyingKey::from_bytes(&bytes).map_err(|e| key_err(&key.path, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(h: &Hash) -> String {
        hex::encode(h.0)
    }

    /// The leaves of the Certificate Transparency reference tests
    /// (certificate-transparency `merkle_tree_test.cc`, also used by
    /// Trillian and Go's `sumdb/tlog` tests).
    fn ct_leaves() -> Vec<Vec<u8>> {
        [
            "",
            "00",
            "10",
            "2021",
            "3031",
            "40414243",
            "5051525354555657",
            "606162636465666768696a6b6c6d6e6f",
        ]
        .iter()
        .map(|h| hex::decode(h).unwrap())
        .collect()
    }

    const CT_ROOTS: [&str; 8] = [
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ];

    fn ct_tree() -> Tree {
        Tree::new(ct_leaves().iter().map(|l| tlog_tiles::record_hash(l)))
    }

    #[test]
    fn rfc6962_roots_match_the_ct_reference_vectors() {
        assert_eq!(
            hex(&Tree::default().root()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let t = ct_tree();
        for (n, want) in CT_ROOTS.iter().enumerate() {
            assert_eq!(
                hex(&t.root_at(n as u64 + 1).unwrap()),
                *want,
                "size {}",
                n + 1
            );
        }
    }

    #[test]
    fn leaf_and_node_hashes_use_the_rfc6962_prefixes() {
        use sha2::{Digest, Sha256};
        let leaf = tlog_tiles::record_hash(b"x");
        assert_eq!(leaf.0.as_slice(), Sha256::digest(b"\x00x").as_slice());
        let node = tlog_tiles::node_hash(leaf, leaf);
        let mut cat = vec![1u8];
        cat.extend(leaf.0);
        cat.extend(leaf.0);
        assert_eq!(node.0.as_slice(), Sha256::digest(&cat).as_slice());
    }

    /// RFC 6962 / CT reference: the inclusion path of leaf 0 in the tree of
    /// 8 and the consistency proof from 1 to 8 (`merkle_tree_test.cc`).
    #[test]
    fn proofs_match_the_ct_reference_vectors() {
        let t = ct_tree();
        let path = t.prove_inclusion(0, 8).unwrap();
        let want = [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ];
        assert_eq!(path.iter().map(hex).collect::<Vec<_>>(), want);
        let cons = t.prove_consistency(1, 8).unwrap();
        assert_eq!(cons.iter().map(hex).collect::<Vec<_>>(), want);
        let cons = t.prove_consistency(6, 8).unwrap();
        assert_eq!(
            cons.iter().map(hex).collect::<Vec<_>>(),
            [
                "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            ]
        );
    }

    #[test]
    fn every_proof_of_small_trees_checks_and_a_changed_one_does_not() {
        let t = ct_tree();
        for n in 1..=8u64 {
            let root = t.root_at(n).unwrap();
            for i in 0..n {
                let leaf = tlog_tiles::record_hash(&ct_leaves()[i as usize]);
                let p = t.prove_inclusion(i, n).unwrap();
                assert!(check_inclusion(&p, n, root, i, leaf), "{i} in {n}");
                let other = tlog_tiles::record_hash(b"forged");
                assert!(!check_inclusion(&p, n, root, i, other));
            }
            for old in 1..=n {
                let p = t.prove_consistency(old, n).unwrap();
                let old_root = t.root_at(old).unwrap();
                assert!(check_consistency(&p, n, root, old, old_root), "{old}->{n}");
                if old < n {
                    let forked = tlog_tiles::record_hash(b"fork");
                    assert!(!check_consistency(&p, n, root, old, forked));
                }
            }
        }
        assert!(t.prove_inclusion(8, 8).is_err());
        assert!(t.prove_consistency(9, 8).is_err());
    }

    fn line(turn: Option<u64>, tag: &str) -> Vec<u8> {
        match turn {
            Some(t) => format!(r#"{{"tag":"{tag}","turn_number":{t}}}"#).into_bytes(),
            None => format!(r#"{{"tag":"{tag}"}}"#).into_bytes(),
        }
    }

    /// A session's append order: both session.started entries, then per
    /// turn the exec intent, the exec finish and the evidence finish. The
    /// order of any prefix pair is a prefix of the order of the whole.
    #[test]
    fn leaf_order_is_append_order_and_prefix_stable() {
        let exec = vec![
            line(None, "e-start"),
            line(Some(1), "e-t1-start"),
            line(Some(1), "e-t1-end"),
            line(Some(2), "e-t2-start"),
            line(Some(2), "e-t2-end"),
        ];
        let evidence = vec![
            line(None, "v-start"),
            line(Some(1), "v-t1"),
            line(None, "v-refused"),
            line(Some(2), "v-t2"),
        ];
        let tags = |l: &[Leaf]| {
            l.iter()
                .map(|l| String::from_utf8(l.line.clone()).unwrap())
                .map(|s| s.split('"').nth(3).unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        let all = leaves(&exec, &evidence);
        assert_eq!(
            tags(&all),
            [
                "e-start",
                "v-start",
                "e-t1-start",
                "e-t1-end",
                "v-t1",
                "v-refused",
                "e-t2-start",
                "e-t2-end",
                "v-t2"
            ]
        );
        // Append-order prefixes.
        for (e, v) in [(1, 1), (2, 1), (3, 2), (3, 3), (4, 3), (5, 3)] {
            let part = leaves(&exec[..e], &evidence[..v]);
            assert_eq!(tags(&part), tags(&all)[..part.len()], "({e},{v})");
        }
    }

    /// Keys round-trip, whatever their base64 holds (`+` included: the
    /// encoded keys are themselves `+`-separated).
    #[test]
    fn generated_keys_load_and_sign_what_they_verify() {
        let dir = tempfile::tempdir().unwrap();
        let sid = SessionId::parse("SES-20261121T093700123456Z-0123456789abcdef").unwrap();
        let head = Head::of(&sid, &leaves(&[line(None, "a")], &[]), (1, 0));
        for i in 0..24 {
            let path = dir.path().join(format!("k{i}"));
            generate(&path, "k").unwrap();
            let sk = load_signing_key(&path).unwrap();
            let vk = load_verifier_key(&pub_path(&path)).unwrap();
            assert_eq!(ed25519_of(&vk).unwrap(), sk.ed25519.verifying_key());
            let note = sign(&head, &sk).unwrap();
            let trust = Trust {
                supervisor: &vk,
                witnesses: &[],
                witnesses_required: 0,
            };
            assert_eq!(open(&path, &note, &trust).unwrap().head, head);
        }
        assert!(generate(&dir.path().join("k0"), "k").is_err());
    }

    #[test]
    fn a_head_round_trips_and_bad_bodies_are_named() {
        let sid = SessionId::parse("SES-20261121T093700123456Z-0123456789abcdef").unwrap();
        let l = leaves(&[line(None, "a")], &[line(None, "b")]);
        let head = Head::of(&sid, &l, (1, 1));
        let text = head.to_text().unwrap();
        assert_eq!(Head::parse(&text).unwrap(), head);
        let s = String::from_utf8(text).unwrap();
        assert!(s.starts_with(&format!("turnstile/{sid}\n2\n")), "{s}");
        let bad = s.replace("evidence 1", "evidence 2");
        assert!(
            Head::parse(bad.as_bytes())
                .unwrap_err()
                .contains("tree size")
        );
        assert!(Head::parse(b"only\n").is_err());
    }
}
