//! turnstile-oci: a turnstile [`Plan`] as an OCI runtime-spec bundle — pure
//! translation, no file system or kernel access (the supervisor writes the
//! bundle and runs the runtime).
//!
//! - [`config`]: Plan → `config.json` (process, root, mounts, namespaces,
//!   `linux.seccomp` from the same profile the native backend compiles,
//!   resources, maskedPaths/readonlyPaths, annotations naming package,
//!   session, turn and declared outputs), round-tripped through
//!   `oci_spec::runtime::Spec`;
//! - [`vm`]: the runtime-spec 1.3 `vm` object with `hwConfig`, which
//!   oci-spec does not model;
//! - [`seccomp`]: the seccomp profile as `linux.seccomp`;
//! - [`runtime`]: the runtimes' command lines (runc, crun, runsc), typed
//!   and pinned by tests.
//!
//! [`Plan`]: turnstile_policy::plan::Plan
#![forbid(unsafe_code)]

pub mod config;
pub mod error;
pub mod runtime;
pub mod seccomp;
pub mod vm;

pub use config::{
    ALLOW_UNENFORCED_FLAG, Bundle, BundleOptions, INIT_BUILD_FLAG, InitBinary, InitReport,
    MASK_DIR, MASK_FILE, REPORT_PREFIX, REPORT_STDERR_FLAG, build,
};
pub use error::OciError;
pub use runtime::{Runtime, RuntimeCmd};
pub use vm::{VmConfig, VmHwConfig, VmKernel};
