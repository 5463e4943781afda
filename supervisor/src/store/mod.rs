//! The store: what a turn leaves behind and what proves it — the
//! workspace and state-directory layout, sessions and their locks, the two
//! hash-chained ledgers and their entries, capture of a turn's writes and
//! their commit, idempotency records, and the recorded status of a turn.
//! The store knows nothing of sandboxes, backends or the turn pipeline:
//! those call into it, never the reverse.

pub mod attest;
pub mod capture;
pub mod commit;
pub mod evidence;
pub mod idempotency;
pub mod layout;
pub mod ledger;
pub mod lock;
pub mod progress;
pub mod record;
pub mod session;
pub mod status;
pub mod transparency;
