//! In-toto attestations of committed turns (issue 30): one in-toto
//! Statement v1 per committed turn — its subjects the committed outputs
//! with their sha256, its predicate what the ledgers say about the turn and
//! the signed checkpoint that includes its evidence entry — wrapped in a
//! DSSE envelope signed with the supervisor's Ed25519 key.
//!
//! DSSE signs the pre-authentication encoding
//! `"DSSEv1" SP len(type) SP type SP len(payload) SP payload`, so the
//! envelope verifies with the public key alone (`PATH.pub.pem`), e.g. with
//! in-toto's or sigstore's DSSE tooling. This module builds and checks
//! envelopes; it reads nothing from disk.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{Signer as _, Verifier as _};
use serde::{Deserialize, Serialize};

use crate::store::record::{EnforcementRecord, Violation};
use crate::store::status::TurnStatus;

/// DSSE payload type of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// in-toto Statement v1.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// What a turnstile turn predicate is.
pub const PREDICATE_TYPE: &str = "https://turnstile.dev/attestation/committed-turn/v1";

/// A DSSE envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    /// base64 of the payload.
    pub payload: String,
    pub signatures: Vec<EnvelopeSignature>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeSignature {
    pub keyid: String,
    /// base64 of the Ed25519 signature of the PAE.
    pub sig: String,
}

/// An in-toto Statement v1 about one committed turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub statement_type: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: TurnPredicate,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    pub name: String,
    pub digest: Sha256Digest,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sha256Digest {
    pub sha256: String,
}

/// What the ledgers say about the turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnPredicate {
    pub session_id: String,
    pub turn_number: u64,
    pub package_id: Option<String>,
    /// The manifest is not recorded in the ledgers; the plan hash (from the
    /// exec intent) binds the compiled policy instead.
    pub plan_hash: Option<String>,
    pub query_hash: Option<String>,
    pub backend: Option<String>,
    pub command: Option<Vec<String>>,
    pub status: Option<TurnStatus>,
    pub enforcement: Option<EnforcementRecord>,
    pub violations: Vec<Violation>,
    pub evidence_entry: EntryRef,
    pub checkpoint: CheckpointRef,
}

/// The ledger entry the statement is drawn from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryRef {
    pub ledger: String,
    pub seq: u64,
    pub entry_hash: String,
    /// Its leaf index in the session's tree.
    pub leaf_index: u64,
}

/// The signed checkpoint that includes the entry, and the proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRef {
    pub origin: String,
    pub tree_size: u64,
    /// base64 RFC 6962 root.
    pub root_hash: String,
    /// The whole signed note.
    pub note: String,
    /// base64 hashes of the inclusion proof of `evidence_entry`.
    pub inclusion_proof: Vec<String>,
}

/// DSSE's pre-authentication encoding.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// Signs `statement` into an envelope.
pub fn seal(
    statement: &Statement,
    key: &ed25519_dalek::SigningKey,
    keyid: &str,
) -> Result<Envelope, serde_json::Error> {
    let payload = serde_json::to_vec(statement)?;
    let sig = key.sign(&pae(PAYLOAD_TYPE, &payload));
    Ok(Envelope {
        payload_type: PAYLOAD_TYPE.to_owned(),
        payload: B64.encode(&payload),
        signatures: vec![EnvelopeSignature {
            keyid: keyid.to_owned(),
            sig: B64.encode(sig.to_bytes()),
        }],
    })
}

/// The statement of an envelope one of whose signatures `key` made.
pub fn open(envelope: &Envelope, key: &ed25519_dalek::VerifyingKey) -> Result<Statement, String> {
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(format!("payloadType `{}`", envelope.payload_type));
    }
    let payload = B64
        .decode(&envelope.payload)
        .map_err(|e| format!("payload: {e}"))?;
    let msg = pae(&envelope.payload_type, &payload);
    let signed = envelope.signatures.iter().any(|s| {
        B64.decode(&s.sig)
            .ok()
            .and_then(|b| ed25519_dalek::Signature::from_slice(&b).ok())
            .is_some_and(|sig| key.verify(&msg, &sig).is_ok())
    });
    if !signed {
        return Err("no signature of this key verifies".into());
    }
    serde_json::from_slice(&payload).map_err(|e| format!("statement: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_matches_the_dsse_spec_example() {
        // github.com/secure-systems-lab/dsse protocol.md
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
        );
    }

    #[test]
    fn an_envelope_verifies_with_its_key_only() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
        let st = Statement {
            statement_type: STATEMENT_TYPE.into(),
            subject: vec![Subject {
                name: "output/x".into(),
                digest: Sha256Digest {
                    sha256: "ab".into(),
                },
            }],
            predicate_type: PREDICATE_TYPE.into(),
            predicate: TurnPredicate {
                session_id: "S".into(),
                turn_number: 1,
                package_id: None,
                plan_hash: None,
                query_hash: None,
                backend: None,
                command: None,
                status: Some(TurnStatus::Committed),
                enforcement: None,
                violations: vec![],
                evidence_entry: EntryRef {
                    ledger: "evidence".into(),
                    seq: 2,
                    entry_hash: "h".into(),
                    leaf_index: 4,
                },
                checkpoint: CheckpointRef {
                    origin: "o".into(),
                    tree_size: 5,
                    root_hash: "r".into(),
                    note: "n".into(),
                    inclusion_proof: vec![],
                },
            },
        };
        let env = seal(&st, &key, "k").unwrap();
        assert_eq!(open(&env, &key.verifying_key()).unwrap(), st);
        let other = ed25519_dalek::SigningKey::from_bytes(&[8u8; 32]);
        assert!(open(&env, &other.verifying_key()).is_err());
        let mut forged = env.clone();
        forged.payload = B64.encode(b"{}");
        assert!(open(&forged, &key.verifying_key()).is_err());
    }
}
