//! The names inside a turn directory, shared by the supervisor side
//! (`TurnDir`, the OCI backends' host view), the init and its mount plan.

/// Files the supervisor leaves in the turn directory for init.
pub const PLAN_FILE: &str = "plan.json";
pub const BPF_FILE: &str = "seccomp.bpf";
pub const REPORT_FILE: &str = "report.jsonl";
/// Where the init builds the turn's root.
pub const ROOT_DIR: &str = "root";
/// The turn's scratch tmpfs: overlay uppers and work dirs.
pub const SCRATCH_DIR: &str = "scratch";
/// Where the idmapped clone of the workspace is attached while the view is
/// built (detached again before the command runs).
pub const LOWER_DIR: &str = "lower";
/// An empty directory, the second lower layer of read-only overlays.
pub const EMPTY_DIR: &str = "empty";
