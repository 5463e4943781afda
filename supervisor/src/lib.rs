//! turnstile-supervisor: carries out what `turnstile-policy` decides.
//!
//! Owns sessions, the hash-chained ledgers and their head anchors, the turn
//! pipeline and the `supervise` CLI. It is the only crate that touches the
//! file system on behalf of a turn; it never decides policy itself.

pub mod admit;
pub mod backend;
pub mod capture;
pub mod cli;
pub mod commit;
pub mod context;
pub mod denials;
pub mod doctor;
pub mod error;
pub mod evidence;
pub mod fsx;
pub mod idempotency;
pub mod ids;
pub mod integrity;
pub mod interrupt;
pub mod layout;
pub mod ledger;
pub mod lock;
pub mod outcome;
pub mod realfs;
pub mod recover;
pub mod replay;
pub mod sandbox;
pub mod serve;
pub mod session;
pub mod status;
pub mod turn;

pub use error::{Result, SupervisorError};
