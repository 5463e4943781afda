//! `supervise revert --session S --turn N` (issue 30 item 5); the logic is
//! [`crate::turn::revert`].

use clap::Args;

use super::{Common, to_json};
use crate::error::Result;
use crate::turn::outcome::Outcome;

#[derive(Debug, Args)]
pub struct RevertArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, value_name = "SID")]
    pub session: String,
    /// The turn whose committed files go back to what they were.
    #[arg(long, value_name = "N")]
    pub turn: u64,
    /// The tenant the session belongs to (as `run --tenant`).
    #[arg(long, value_name = "NAMESPACE")]
    pub tenant: Option<String>,
}

pub fn revert_cmd(a: &RevertArgs) -> Result<Outcome> {
    let r = crate::turn::revert::revert(
        &crate::turn::revert::RevertRequest {
            root: &a.common.root,
            state_dir: &a.common.state_dir,
            session: &a.session,
            turn: a.turn,
            tenant: a.tenant.as_deref(),
        },
        &crate::ids::SystemClock,
    )?;
    Ok(Outcome::ok(if a.common.json {
        format!("{}\n", to_json(&r))
    } else {
        use turnstile_policy::error::printable;
        let mut s = format!(
            "turn {} of {} reverted turn {}:\n",
            r.turn_number, r.session_id, r.reverted_turn
        );
        for c in &r.committed {
            s += &if c.removed {
                format!("  removed  {}\n", printable(&c.path))
            } else {
                format!("  restored {} ({} bytes)\n", printable(&c.path), c.size)
            };
        }
        s
    }))
}
