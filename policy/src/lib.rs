//! turnstile-policy: the pure half of turnstile.
//!
//! This crate turns an agent package's manifest and a turn request into typed,
//! validated values and decides — before anything runs — whether the turn is
//! allowed. It owns the capability semantics (glob patterns, forbidden and
//! reserved paths), session ids, canonical JSON (the byte form every hash is
//! computed over) and the prompt header.
//!
//! It must never make a system call beyond reading a file it is handed (the
//! manifest): no clocks, no randomness, no processes, no namespaces. Time and
//! randomness come in through the [`session::Clock`] and
//! [`session::RandomSource`] seams so the supervisor (and deterministic mode)
//! can inject them.
#![forbid(unsafe_code)]

pub mod canonical;
pub mod capabilities;
pub mod check;
pub mod envelope;
pub mod error;
pub mod fsview;
pub mod grants;
pub mod input;
pub mod manifest;
pub mod path;
pub mod pattern;
pub mod plan;
pub mod prompt;
mod recent;
pub mod request;
pub mod seccomp;
pub mod session;
pub mod strict;
pub mod timefmt;
pub mod verdict;

pub use check::{CapabilityViolation, Operation, ViolatedCapability, Violations, check_turn};
pub use error::{ErrorCode, PolicyError};
pub use manifest::{Manifest, PackageId};
pub use request::{DeclaredOutput, TurnRequest};
pub use session::SessionId;
