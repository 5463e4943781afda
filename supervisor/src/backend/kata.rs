//! Kata Containers, detected for real: its runtime binary or containerd
//! shim on PATH, and `/dev/kvm` usable (opened read-write). turnstile
//! writes Kata bundles (`supervise bundle --backend kata`, `vm.hwConfig`)
//! but runs no turn under Kata itself yet: a turn that must run there is
//! refused with E2040 naming what this host lacks — never a fallback to a
//! weaker backend.

use std::path::{Path, PathBuf};

/// The binaries that make Kata present on a host.
const BINARIES: [&str; 2] = ["kata-runtime", "containerd-shim-kata-v2"];

/// What a host has of Kata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    /// The first of [`BINARIES`] found on PATH.
    pub binary: Option<PathBuf>,
    /// `/dev/kvm` opens read-write.
    pub kvm: bool,
    /// Why `/dev/kvm` does not, when it does not.
    pub kvm_error: Option<String>,
}

impl Detected {
    /// What is missing, for messages (empty: nothing).
    pub fn missing(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.binary.is_none() {
            out.push(format!(
                "no {} on PATH (Kata Containers has no Debian package: install it from its release)",
                BINARIES.join(" or ")
            ));
        }
        if !self.kvm {
            out.push(format!(
                "/dev/kvm is not usable ({})",
                self.kvm_error.as_deref().unwrap_or("unknown")
            ));
        }
        out
    }
}

/// Looks at this host.
pub fn detect() -> Detected {
    detect_in(
        &std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        Path::new("/dev/kvm"),
    )
}

fn detect_in(path: &std::ffi::OsStr, kvm: &Path) -> Detected {
    let binary = std::env::split_paths(path)
        .flat_map(|dir| BINARIES.iter().map(move |b| dir.join(b)))
        .find(|p| p.is_file());
    let opened = std::fs::OpenOptions::new().read(true).write(true).open(kvm);
    Detected {
        binary,
        kvm: opened.is_ok(),
        kvm_error: opened.err().map(|e| e.to_string()),
    }
}

/// The E2040 reason for a turn that must run under Kata here.
pub fn unavailable() -> String {
    let d = detect();
    let missing = d.missing();
    if missing.is_empty() {
        format!(
            "Kata is present ({}, /dev/kvm usable), but turnstile does not run turns under Kata yet (`supervise bundle --backend kata` writes the bundle it would run); never a fallback",
            d.binary
                .as_deref()
                .map(Path::display)
                .map(|p| p.to_string())
                .unwrap_or_default()
        )
    } else {
        format!(
            "Kata is not usable on this host: {}; never a fallback",
            missing.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_25_kata_is_detected_by_binary_and_kvm() {
        let dir = tempfile::tempdir().unwrap();
        let none = detect_in(dir.path().as_os_str(), &dir.path().join("kvm"));
        assert_eq!(none.binary, None);
        assert!(!none.kvm);
        assert_eq!(none.missing().len(), 2, "{:?}", none.missing());
        std::fs::write(dir.path().join("containerd-shim-kata-v2"), b"").unwrap();
        std::fs::write(dir.path().join("kvm"), b"").unwrap();
        let both = detect_in(dir.path().as_os_str(), &dir.path().join("kvm"));
        assert_eq!(
            both.binary,
            Some(dir.path().join("containerd-shim-kata-v2"))
        );
        assert!(both.kvm);
        assert!(both.missing().is_empty());
    }
}
