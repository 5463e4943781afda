//! The turn pipeline. So far: the pre-execution stage — a turn the check
//! refuses is recorded in both ledgers (FR-RT-010, FR-RT-011) and never runs.

use turnstile_policy::Violations;
use turnstile_policy::request::BoundRequest;
use turnstile_policy::session::Clock;

use crate::error::Result;
use crate::evidence::RejectedTurn;
use crate::ledger::LedgerKind;
use crate::session::{Session, SessionLock};

/// Records a turn refused before execution in both ledgers and returns its
/// turn number.
pub fn record_rejected_turn(
    session: &Session,
    lock: &SessionLock,
    request: &BoundRequest,
    violations: &Violations,
    clock: &dyn Clock,
) -> Result<u64> {
    let turn_number = session.next_turn_number(lock)?;
    let turn = RejectedTurn {
        request,
        turn_number,
        violations,
        at: clock.now(),
    };
    session
        .ledger(LedgerKind::Exec)
        .append(lock, turn.exec_entry())?;
    session
        .ledger(LedgerKind::Evidence)
        .append(lock, turn.evidence_entry())?;
    Ok(turn_number)
}
