//! The runtime-spec 1.3 `vm` object (`config-vm.json`), including
//! `hwConfig`, which `oci-spec` 0.10 does not model.
//!
//! `kernel` is required whenever `vm` is present, so [`VmConfig::kernel`] is
//! not optional: a `vm` without a kernel cannot be represented.

use serde::{Deserialize, Serialize};
use turnstile_policy::plan::PlanLimits;

/// `vm`: configuration for virtual-machine-based containers (Kata).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor: Option<VmHypervisor>,
    pub kernel: VmKernel,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<VmImage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hw_config: Option<VmHwConfig>,
}

/// `vm.hypervisor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmHypervisor {
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<String>,
}

/// `vm.kernel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmKernel {
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<String>,
}

/// `vm.image`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmImage {
    pub path: String,
    /// `raw`, `qcow2`, `vdi`, `vmdk` or `vhd`.
    pub format: String,
}

/// `vm.hwConfig` (runtime-spec 1.3): the guest's hardware.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmHwConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_tree: Option<String>,
    /// Virtual CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// Guest memory in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dtdevs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iomems: Vec<VmIoMem>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub irqs: Vec<u32>,
}

/// One `vm.hwConfig.iomems` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmIoMem {
    pub first_gfn: u64,
    pub first_mfn: u64,
    pub nr_mfns: u64,
}

impl VmHwConfig {
    /// The guest a turn's limits ask for: `vcpus` = `limits.cpu` rounded up
    /// to whole CPUs (at least one), `memory` = `limits.memory` in bytes.
    pub fn from_limits(limits: &PlanLimits) -> Self {
        let vcpus = limits.cpu_millis.div_ceil(1000).max(1);
        Self {
            device_tree: None,
            vcpus: Some(u32::try_from(vcpus).unwrap_or(u32::MAX)),
            memory: Some(limits.memory_bytes),
            dtdevs: Vec::new(),
            iomems: Vec::new(),
            irqs: Vec::new(),
        }
    }
}

impl VmConfig {
    /// A `vm` object for a turn: the given kernel, hardware from the limits.
    pub fn for_limits(kernel: VmKernel, limits: &PlanLimits) -> Self {
        Self {
            hypervisor: None,
            kernel,
            image: None,
            hw_config: Some(VmHwConfig::from_limits(limits)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(cpu_millis: u64, memory_bytes: u64) -> PlanLimits {
        PlanLimits {
            memory_bytes,
            cpu_millis,
            pids: 64,
            timeout_seconds: 60,
            disk_bytes: 1 << 30,
            files: 1000,
            output_bytes: 1 << 20,
        }
    }

    #[test]
    fn vcpus_round_up_and_memory_is_bytes() {
        for (millis, vcpus) in [(1, 1), (500, 1), (1000, 1), (1001, 2), (2500, 3), (4000, 4)] {
            let hw = VmHwConfig::from_limits(&limits(millis, 256 << 20));
            assert_eq!(hw.vcpus, Some(vcpus), "{millis}m");
            assert_eq!(hw.memory, Some(268_435_456));
        }
    }

    #[test]
    fn serializes_as_runtime_spec_1_3() {
        let vm = VmConfig::for_limits(
            VmKernel {
                path: "/boot/vmlinuz".into(),
                parameters: vec!["console=hvc0".into()],
                initrd: None,
            },
            &limits(1500, 1 << 30),
        );
        assert_eq!(
            serde_json::to_value(&vm).unwrap(),
            serde_json::json!({
                "kernel": {"path": "/boot/vmlinuz", "parameters": ["console=hvc0"]},
                "hwConfig": {"vcpus": 2, "memory": 1073741824u64}
            })
        );
        // kernel is required: a `vm` without it does not deserialize.
        assert!(serde_json::from_str::<VmConfig>(r#"{"hwConfig":{"vcpus":1}}"#).is_err());
    }
}
