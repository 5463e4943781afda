//! turnstile-supervisor: carries out what `turnstile-policy` decides.
//!
//! Owns sessions, the hash-chained ledgers and their head anchors, the turn
//! pipeline and the `supervise` CLI. It is the only crate that touches the
//! file system on behalf of a turn; it never decides policy itself.

pub mod backend;
pub mod cli;
pub mod error;
pub mod fsx;
pub mod ids;
pub mod recover;
pub mod sandbox;
pub mod serve;
pub mod store;
pub mod syncpool;
pub mod turn;

pub use error::{Result, SupervisorError};
