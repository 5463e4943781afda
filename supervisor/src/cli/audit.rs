//! The auditor's commands (issue 30): `key generate`, and `ledger
//! checkpoint | prove | cosign | export` plus `ledger verify --checkpoint`.
//! Argument structs and one function per command; the logic lives in
//! [`crate::store::transparency`] and [`crate::store::attest`].

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use turnstile_policy::SessionId;

use super::{Common, LedgerVerifyArgs, open_workspace, to_json};
use crate::error::{Result, SupervisorError, exit};
use crate::store::attest;
use crate::store::ledger::LedgerKind;
use crate::store::record::{Event, EvidenceEntry, TurnStartedEntry, read_all};
use crate::store::session::Session;
use crate::store::status::TurnStatus;
use crate::store::transparency::{self as tp, Leaf, Tree};
use crate::turn::outcome::Outcome;

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Generate an Ed25519 signing key: PATH (mode 0600, signed-note
    /// private key), PATH.pub (the verifier key `ledger verify --pubkey`
    /// takes) and PATH.pub.pem (for DSSE/in-toto tools). Refuses to
    /// overwrite.
    ///
    /// Example: supervise key generate --out /etc/turnstile/keys/supervisor
    Generate(KeyGenerateArgs),
}

#[derive(Debug, Args)]
pub struct KeyGenerateArgs {
    /// Where to write the private key [default: <state-dir>/keys/supervisor].
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
    /// The key's name on signature lines [default: PATH's file name].
    #[arg(long)]
    pub name: Option<String>,
    /// Supervisor state directory (for the default PATH).
    #[arg(long, value_name = "DIR", default_value = crate::store::layout::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    #[arg(long)]
    pub json: bool,
}

/// `--root --session [--tier]`.
#[derive(Debug, Args)]
pub struct SessionSel {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, value_name = "SID")]
    pub session: String,
    #[arg(long)]
    pub tier: Option<String>,
    #[command(flatten)]
    pub who: super::TenantArg,
}

#[derive(Debug, Args)]
pub struct LedgerCheckpointArgs {
    #[command(flatten)]
    pub sel: SessionSel,
    /// Private key to sign with [default: <state-dir>/keys/supervisor].
    #[arg(long, value_name = "PATH")]
    pub key: Option<PathBuf>,
    /// Also copy the checkpoint into DIR (a witness's inbox).
    #[arg(long, value_name = "DIR")]
    pub witness: Vec<PathBuf>,
}

#[derive(Debug, Args)]
#[group(id = "proof", required = true, multiple = false)]
pub struct LedgerProveArgs {
    #[command(flatten)]
    pub sel: SessionSel,
    /// Prove leaf N (0-based, in the documented leaf order) is in the tree.
    #[arg(long, value_name = "N", group = "proof")]
    pub inclusion: Option<u64>,
    /// Prove the tree of OLD_SIZE leaves is a prefix of the tree.
    #[arg(long, value_name = "OLD_SIZE", group = "proof")]
    pub consistency: Option<u64>,
    /// The tree size to prove against [default: every entry now].
    #[arg(long, value_name = "N")]
    pub size: Option<u64>,
}

#[derive(Debug, Args)]
pub struct LedgerCosignArgs {
    /// The checkpoint (a signed note); the signature is added in place.
    #[arg(long, value_name = "FILE")]
    pub checkpoint: PathBuf,
    /// The witness's private key.
    #[arg(long, value_name = "PATH")]
    pub key: PathBuf,
}

/// Export format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// One DSSE envelope (in-toto Statement v1) per committed turn.
    InToto,
}

#[derive(Debug, Args)]
pub struct LedgerExportArgs {
    #[command(flatten)]
    pub sel: SessionSel,
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// Private key to sign with (also signs the checkpoint referenced).
    #[arg(long, value_name = "PATH")]
    pub key: PathBuf,
    /// Output directory [default: the session's transparency/attestations/].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// `--checkpoint` and its trust, for `ledger verify`.
#[derive(Debug, Args)]
pub struct CheckpointTrustArgs {
    /// Also check the ledgers against this signed checkpoint.
    #[arg(long, value_name = "FILE", requires = "pubkey")]
    pub checkpoint: Option<PathBuf>,
    /// The supervisor's verifier key (PATH.pub of `key generate`).
    #[arg(long, value_name = "KEY", requires = "checkpoint")]
    pub pubkey: Option<PathBuf>,
    /// A witness's verifier key (repeatable).
    #[arg(long, value_name = "KEY", requires = "checkpoint")]
    pub witness_key: Vec<PathBuf>,
    /// How many of the witness keys must have cosigned.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub witnesses_required: usize,
}

pub(super) fn open_session(sel: &SessionSel) -> Result<Session> {
    let id = SessionId::parse(&sel.session)?;
    let (ws, state) = open_workspace(&sel.common)?;
    sel.who.open(&ws, &state, &id, sel.tier.as_deref())
}

fn ledger_dir(session: &Session) -> PathBuf {
    session.workspace().ledger_dir(&session.tier, &session.id)
}

fn default_key(state_dir: &Path) -> PathBuf {
    state_dir.join("keys").join("supervisor")
}

fn all_leaves(session: &Session) -> Result<(Vec<Leaf>, (u64, u64))> {
    tp::session_leaves(
        &session.ledger(LedgerKind::Exec).path,
        &session.ledger(LedgerKind::Evidence).path,
        None,
    )
}

pub fn key_generate_cmd(a: &KeyGenerateArgs) -> Result<Outcome> {
    let path = a.out.clone().unwrap_or_else(|| default_key(&a.state_dir));
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| tp::default_key_name(&path));
    let g = tp::generate(&path, &name)?;
    Ok(Outcome::ok(if a.json {
        format!("{}\n", to_json(&g))
    } else {
        format!(
            "private key {} (0600)\nverifier key {}: {}\n",
            g.private_key.display(),
            g.public_key.display(),
            g.verifier_key
        )
    }))
}

#[derive(serde::Serialize)]
struct CheckpointTaken<'a> {
    session_id: &'a str,
    tree_size: u64,
    root_hash: String,
    checkpoint: &'a Path,
    witness_copies: Vec<PathBuf>,
    note: String,
}

pub fn ledger_checkpoint_cmd(a: &LedgerCheckpointArgs) -> Result<Outcome> {
    let session = open_session(&a.sel)?;
    let key_path = a
        .key
        .clone()
        .unwrap_or_else(|| default_key(&a.sel.common.state_dir));
    let key = tp::load_signing_key(&key_path)?;
    let _lock = session.lock()?;
    let tp::Taken {
        head,
        note,
        path,
        witness_copies: copies,
    } = tp::take(&session, &key, &a.witness)?;
    let text = String::from_utf8_lossy(&note).into_owned();
    Ok(Outcome::ok(if a.sel.common.json {
        let v = CheckpointTaken {
            session_id: session.id.as_str(),
            tree_size: head.size,
            root_hash: tp::hash_b64(&head.root),
            checkpoint: &path,
            witness_copies: copies,
            note: text,
        };
        format!("{}\n", to_json(&v))
    } else {
        text
    }))
}

#[derive(serde::Serialize)]
struct Proof {
    session_id: String,
    kind: &'static str,
    tree_size: u64,
    root_hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    leaf_index: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    leaf_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entry: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    old_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    old_root_hash: Option<String>,
    proof: Vec<String>,
}

pub fn ledger_prove_cmd(a: &LedgerProveArgs) -> Result<Outcome> {
    let session = open_session(&a.sel)?;
    session.verify()?;
    let (leaves, _) = all_leaves(&session)?;
    let tree = Tree::of(&leaves);
    let size = a.size.unwrap_or(tree.size());
    let root = tp::hash_b64(&tree.root_at(size)?);
    let b64 = |p: Vec<tlog_tiles::Hash>| p.iter().map(tp::hash_b64).collect::<Vec<_>>();
    let mut p = Proof {
        session_id: session.id.to_string(),
        kind: "inclusion",
        tree_size: size,
        root_hash: root,
        leaf_index: None,
        leaf_hash: None,
        entry: None,
        old_size: None,
        old_root_hash: None,
        proof: Vec::new(),
    };
    if let Some(n) = a.inclusion {
        p.proof = b64(tree.prove_inclusion(n, size)?);
        let leaf = leaves.get(n as usize);
        p.leaf_index = Some(n);
        p.leaf_hash = leaf.map(|l| tp::hash_b64(&l.hash()));
        p.entry = leaf.map(Leaf::name);
    } else if let Some(old) = a.consistency {
        p.kind = "consistency";
        p.proof = b64(tree.prove_consistency(old, size)?);
        p.old_size = Some(old);
        p.old_root_hash = Some(tp::hash_b64(&tree.root_at(old)?));
    }
    Ok(Outcome::ok(if a.sel.common.json {
        format!("{}\n", to_json(&p))
    } else {
        let mut s = format!(
            "{} proof, tree size {} root {}\n",
            p.kind, p.tree_size, p.root_hash
        );
        if let (Some(i), Some(h), Some(e)) = (p.leaf_index, &p.leaf_hash, &p.entry) {
            s += &format!("leaf {i} ({e}) hash {h}\n");
        }
        if let (Some(o), Some(r)) = (p.old_size, &p.old_root_hash) {
            s += &format!("old size {o} root {r}\n");
        }
        s + &p.proof.join("\n") + if p.proof.is_empty() { "" } else { "\n" }
    }))
}

pub fn ledger_cosign_cmd(a: &LedgerCosignArgs) -> Result<Outcome> {
    let key = tp::load_signing_key(&a.key)?;
    let bytes = std::fs::read(&a.checkpoint).map_err(|e| SupervisorError::CheckpointMalformed {
        checkpoint: a.checkpoint.clone(),
        detail: format!("cannot read: {e}"),
    })?;
    let signed = tp::cosign(&a.checkpoint, &bytes, &key)?;
    crate::fsx::write_atomic(&a.checkpoint, &signed)?;
    Ok(Outcome::ok(String::from_utf8_lossy(&signed).into_owned()))
}

/// `ledger verify --checkpoint`: the ledgers as today (a missing anchor is
/// only a warning here: an auditor's copy has no state directory), then
/// against the checkpoint.
pub fn ledger_verify_checkpoint_cmd(a: &LedgerVerifyArgs) -> Result<Outcome> {
    let t = &a.trust;
    let (Some(cp), Some(pk)) = (&t.checkpoint, &t.pubkey) else {
        return super::ledger_verify(a);
    };
    let mut out = match super::ledger_verify(a)? {
        o if o.status == exit::OK => o,
        _ if anchors_only_missing(a)? => Outcome {
            status: exit::OK,
            stdout: String::new(),
            stderr: "supervise: warning: no head anchors here (an auditor's copy?): the ledgers are checked against the checkpoint only\n".into(),
        },
        o => return Ok(o),
    };
    let (supervisor, opened, checked) = check_checkpoint(a, cp, pk)?;
    let line = format!(
        "checkpoint      matches   {} of {} entries signed by {}{}; {}\n",
        checked.covered,
        checked.size,
        supervisor.describe(),
        if opened.witnessed_by.is_empty() {
            String::new()
        } else {
            format!(" and witnesses {}", opened.witnessed_by.join(", "))
        },
        if checked.consistent {
            "the ledgers extend it (RFC 6962 consistency proof checked)"
        } else {
            "warning: today's leaf order does not extend it (no consistency proof)"
        }
    );
    if a.common.json {
        let mut v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            m.insert(
                "checkpoint".into(),
                serde_json::to_value(CheckpointCheck {
                    path: cp,
                    tree_size: checked.covered,
                    ledger_size: checked.size,
                    consistent: checked.consistent,
                    witnessed_by: &opened.witnessed_by,
                })
                .unwrap_or_default(),
            );
        }
        out.stdout = format!("{}\n", to_json(&v));
    } else {
        out.stdout += &line;
    }
    Ok(out)
}

/// Authenticates the checkpoint with the keys given and checks the ledger
/// files against it.
fn check_checkpoint(
    a: &LedgerVerifyArgs,
    cp: &Path,
    pk: &Path,
) -> Result<(tp::VerifierKeyFile, tp::Opened, tp::Checked)> {
    let t = &a.trust;
    let supervisor = tp::load_verifier_key(pk)?;
    let witnesses = t
        .witness_key
        .iter()
        .map(|k| tp::load_verifier_key(k))
        .collect::<Result<Vec<_>>>()?;
    if t.witnesses_required > witnesses.len() {
        return Err(SupervisorError::invalid(
            "--witnesses-required",
            format!(
                "{} required but {} --witness-key given",
                t.witnesses_required,
                witnesses.len()
            ),
        ));
    }
    let bytes = std::fs::read(cp).map_err(|e| SupervisorError::CheckpointMalformed {
        checkpoint: cp.to_path_buf(),
        detail: format!("cannot read: {e}"),
    })?;
    let trust = tp::Trust {
        supervisor: &supervisor,
        witnesses: &witnesses,
        witnesses_required: t.witnesses_required,
    };
    let opened = tp::open(cp, &bytes, &trust)?;
    let id = SessionId::parse(&a.session)?;
    let ws = crate::store::layout::Workspace::open(&a.common.root)?;
    let tier = a.tier.clone().unwrap_or_else(|| {
        Session::open(
            &ws,
            &crate::store::layout::StateDir::at(&a.common.state_dir),
            &id,
            None,
        )
        .map(|s| s.tier)
        .unwrap_or_else(|_| crate::store::layout::TURN_TIER.to_owned())
    });
    let checked = tp::check_against(
        cp,
        &opened.head,
        &id,
        &ws.ledger_path(&tier, &id, LedgerKind::Exec),
        &ws.ledger_path(&tier, &id, LedgerKind::Evidence),
    )?;
    Ok((supervisor, opened, checked))
}

#[derive(serde::Serialize)]
struct CheckpointCheck<'a> {
    path: &'a Path,
    tree_size: u64,
    ledger_size: u64,
    consistent: bool,
    witnessed_by: &'a [String],
}

/// Whether the ordinary verification failed only for want of anchors.
fn anchors_only_missing(a: &LedgerVerifyArgs) -> Result<bool> {
    let id = SessionId::parse(&a.session)?;
    let (ws, state) = open_workspace(&a.common)?;
    let session = Session::open(&ws, &state, &id, a.tier.as_deref())?;
    Ok(LedgerKind::ALL
        .iter()
        .all(|k| match session.ledger(*k).verify() {
            Ok(_) => true,
            Err(SupervisorError::Integrity(e)) => {
                matches!(e.problem, crate::error::Problem::AnchorMissing)
            }
            Err(_) => false,
        }))
}

pub fn ledger_export_cmd(a: &LedgerExportArgs) -> Result<Outcome> {
    let ExportFormat::InToto = a.format;
    let session = open_session(&a.sel)?;
    let key = tp::load_signing_key(&a.key)?;
    let _lock = session.lock()?;
    let tp::Taken { head, note, .. } = tp::take(&session, &key, &[])?;
    let (leaves, _) = all_leaves(&session)?;
    let tree = Tree::of(&leaves);
    let evidence =
        read_all::<EvidenceEntry>(&session.ledger(LedgerKind::Evidence).verified_entries()?)
            .map_err(|e| SupervisorError::invalid("evidence", e.to_string()))?;
    let intents =
        read_all::<TurnStartedEntry>(&session.ledger(LedgerKind::Exec).verified_entries()?)
            .map_err(|e| SupervisorError::invalid("exec", e.to_string()))?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| tp::checkpoint_dir(&ledger_dir(&session)).join("attestations"));
    crate::fsx::create_dir_all(&out)?;
    let keyid = format!(
        "{}+{:08x}",
        signed_note::Signer::name(&key.signer),
        signed_note::Signer::key_id(&key.signer)
    );
    let checkpoint = attest::CheckpointRef {
        origin: head.origin.clone(),
        tree_size: head.size,
        root_hash: tp::hash_b64(&head.root),
        note: String::from_utf8_lossy(&note).into_owned(),
        inclusion_proof: Vec::new(),
    };
    let mut written = Vec::new();
    for e in evidence.iter().filter(|e| {
        e.body.event == Event::TurnFinished && e.body.status == Some(TurnStatus::Committed)
    }) {
        let Some(index) = leaves
            .iter()
            .position(|l| l.kind == LedgerKind::Evidence && l.seq == e.chain.seq)
        else {
            continue;
        };
        let intent = intents.iter().find(|i| {
            i.body.event == Event::TurnStarted && i.body.turn_number == e.body.turn_number
        });
        let statement = statement_of(&session, e, intent, index as u64, &tree, &checkpoint)?;
        let env = attest::seal(&statement, &key.ed25519, &keyid)
            .map_err(|e| SupervisorError::invalid("statement", e.to_string()))?;
        let path = out.join(format!("turn-{}.intoto.json", e.body.turn_number));
        crate::fsx::write_atomic(&path, format!("{}\n", to_json(&env)).as_bytes())?;
        written.push(path);
    }
    let list: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    Ok(Outcome::ok(if a.sel.common.json {
        format!("{}\n", to_json(&list))
    } else {
        list.iter().map(|p| format!("{p}\n")).collect()
    }))
}

fn statement_of(
    session: &Session,
    e: &crate::store::record::Read<EvidenceEntry>,
    intent: Option<&crate::store::record::Read<TurnStartedEntry>>,
    index: u64,
    tree: &Tree,
    checkpoint: &attest::CheckpointRef,
) -> Result<attest::Statement> {
    let proof = tree.prove_inclusion(index, checkpoint.tree_size)?;
    Ok(attest::Statement {
        statement_type: attest::STATEMENT_TYPE.into(),
        subject: e
            .body
            .committed
            .iter()
            // A revert's removals leave no artifact to attest.
            .filter(|c| !c.removed)
            .map(|c| attest::Subject {
                name: c.path.clone(),
                digest: attest::Sha256Digest {
                    sha256: c.sha256.clone(),
                },
            })
            .collect(),
        predicate_type: attest::PREDICATE_TYPE.into(),
        predicate: attest::TurnPredicate {
            session_id: session.id.to_string(),
            turn_number: e.body.turn_number,
            package_id: e.body.package_id.clone(),
            plan_hash: intent.and_then(|i| i.body.plan_hash.clone()),
            query_hash: intent.map(|i| i.body.query_hash.clone()),
            backend: intent.map(|i| i.body.backend.clone()),
            command: e.body.command.clone(),
            status: e.body.status,
            enforcement: e.body.enforcement.clone(),
            violations: e.body.violations.clone(),
            evidence_entry: attest::EntryRef {
                ledger: LedgerKind::Evidence.as_str().into(),
                seq: e.chain.seq,
                entry_hash: e.chain.entry_hash.clone(),
                leaf_index: index,
            },
            checkpoint: attest::CheckpointRef {
                inclusion_proof: proof.iter().map(tp::hash_b64).collect(),
                ..checkpoint.clone()
            },
        },
    })
}
