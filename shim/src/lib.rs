//! The shim's library: everything but the daemon's entry point
//! (`main.rs`). A library so that the parsers a pod author reaches — the
//! annotations and spec ([`contract::request_from_spec`]) and the shim's
//! options ([`contract::Options::parse`],
//! [`contract::config_path_from_options`]) — can be fuzzed from the tests
//! crate (`cargo xtask fuzz`, targets `annotations` and `shim_options`).

pub mod contract;
pub mod cri;
pub mod error;
pub mod exit;
pub mod podcgroup;
pub mod runner;
pub mod sandbox;
pub mod service;
pub mod workspaces;
